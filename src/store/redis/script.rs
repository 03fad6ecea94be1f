//! The decision script: `lua/` files concatenated into one script body (three algorithm functions
//! and the dispatcher `check.lua`), sent by EVALSHA, re-sent by EVAL when a node answers NOSCRIPT
//! (restart, failover, a promoted replica). Why Lua and not MULTI: the read, the decision and the
//! write must be one atomic step on the server, and a script is one round trip.
//!
//! This module encodes a check into the script's arguments and turns its reply back into a
//! `Decision` through the same `summarize` functions the memory store uses.

use std::sync::LazyLock;

use redis::Value;

use crate::algorithm::fixed_window::{self, FixedState};
use crate::algorithm::sliding_window::{self, SlidingState};
use crate::algorithm::token_bucket::{self, BucketState};
use crate::algorithm::{Algorithm, ChargeMode, Check, Decision, Outcome};
use crate::store::StoreError;

pub const SOURCE: &str = concat!(
    include_str!("../../../lua/common.lua"),
    include_str!("../../../lua/sliding_window.lua"),
    include_str!("../../../lua/token_bucket.lua"),
    include_str!("../../../lua/fixed_window.lua"),
    include_str!("../../../lua/check.lua"),
);

/// SHA1 of `SOURCE`, the name EVALSHA knows it by.
pub static SHA: LazyLock<String> =
    LazyLock::new(|| redis::Script::new(SOURCE).get_hash().to_owned());

/// Arguments per key after the clock and mode arguments.
pub const ARGS_PER_KEY: usize = 6;

/// The script's number for a call's charge mode (ARGV[2]).
pub fn mode_arg(mode: ChargeMode) -> i64 {
    match mode {
        ChargeMode::EachAlone => 0,
        ChargeMode::AllOrNothing => 1,
        ChargeMode::Probe => 2,
    }
}

/// Where the script takes "now" from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScriptClock {
    /// Redis `TIME`: the only clock used in production.
    RedisTime,
    /// A fixed reading, for tests that replay sequences against the memory model.
    Fixed(u64),
}

impl ScriptClock {
    pub fn arg(self) -> u64 {
        match self {
            ScriptClock::RedisTime => 0,
            ScriptClock::Fixed(now_us) => now_us.max(1),
        }
    }
}

/// Pushes one call as the script reads it: its clock, its mode, its key count, then six numbers
/// per check. A script call carries the number of calls first, then its calls one after another.
pub fn push_call(checks: &[&Check], clock: ScriptClock, mode: ChargeMode, args: &mut Vec<i64>) {
    args.push(i64::try_from(clock.arg()).unwrap_or(i64::MAX));
    args.push(mode_arg(mode));
    args.push(checks.len() as i64);
    for check in checks {
        push_args(check, args);
    }
}

/// Pushes the six numbers of one check. Hits above the limit's capacity are clamped to one more
/// than the capacity: they are refused either way, and every number stays exact in a Lua double.
pub fn push_args(check: &Check, args: &mut Vec<i64>) {
    let limit = &check.limit;
    let hits = check.hits.min(limit.capacity().saturating_add(1));
    let as_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    if check.refund {
        // A refund is not bounded by the capacity (a counter written under a larger limit may
        // hold more); 2^52 keeps it exact in a double and above any real count.
        let hits = check.hits.min(token_bucket::MAX_SPAN_US);
        match limit.algorithm {
            Algorithm::SlidingWindow => args.extend([
                11,
                as_i64(sliding_window::sub_window_us(limit.window_us)),
                as_i64(limit.requests),
                as_i64(hits),
                0,
                0,
            ]),
            Algorithm::TokenBucket => {
                let back = token_bucket::span_of(check.hits, limit);
                args.extend([
                    12,
                    as_i64(limit.requests),
                    as_i64(back.quotient_us),
                    as_i64(back.remainder),
                    0,
                    0,
                ]);
            }
            Algorithm::FixedWindow => args.extend([
                13,
                as_i64(limit.window_us.max(1)),
                as_i64(limit.requests),
                as_i64(hits),
                0,
                0,
            ]),
        }
        return;
    }
    match limit.algorithm {
        Algorithm::SlidingWindow => args.extend([
            1,
            as_i64(sliding_window::sub_window_us(limit.window_us)),
            as_i64(limit.requests),
            as_i64(hits),
            0,
            0,
        ]),
        Algorithm::TokenBucket => {
            let tolerance = token_bucket::span_of(limit.burst, limit);
            let (cost_q, cost_r) = if hits > limit.burst {
                (-1, 0)
            } else {
                let cost = token_bucket::span_of(hits, limit);
                (as_i64(cost.quotient_us), as_i64(cost.remainder))
            };
            args.extend([
                2,
                as_i64(limit.requests),
                cost_q,
                cost_r,
                as_i64(tolerance.quotient_us),
                as_i64(tolerance.remainder),
            ]);
        }
        Algorithm::FixedWindow => args.extend([
            3,
            as_i64(limit.window_us.max(1)),
            as_i64(limit.requests),
            as_i64(hits),
            0,
            0,
        ]),
    }
}

fn protocol(message: impl Into<String>) -> StoreError {
    StoreError::Protocol(message.into())
}

fn integers(value: &Value) -> Result<Vec<u64>, StoreError> {
    let Value::Array(items) = value else {
        return Err(protocol(format!(
            "expected an array per key, got {value:?}"
        )));
    };
    items
        .iter()
        .map(|item| match item {
            Value::Int(i) => {
                u64::try_from(*i).map_err(|_| protocol(format!("negative number {i}")))
            }
            other => Err(protocol(format!("expected an integer, got {other:?}"))),
        })
        .collect()
}

/// Whether a reply says the check passed (the first number).
pub fn allowed(reply: &Value) -> Result<bool, StoreError> {
    Ok(integers(reply)?.first().copied() == Some(1))
}

/// Turns one key's reply into the decision, with the same Rust code as the memory store.
pub fn decision(check: &Check, reply: &Value) -> Result<Decision, StoreError> {
    let numbers = integers(reply)?;
    let [allowed, now_us, rest @ ..] = numbers.as_slice() else {
        return Err(protocol(format!("reply too short: {numbers:?}")));
    };
    let (allowed, now_us) = (*allowed == 1, *now_us);
    let limit = &check.limit;
    let hits = check.hits;
    let outcome: Outcome = match limit.algorithm {
        Algorithm::SlidingWindow => {
            let [total, last, pairs @ ..] = rest else {
                return Err(protocol("sliding window reply needs total and newest"));
            };
            if pairs.len() % 2 != 0 {
                return Err(protocol("sliding window reply has an odd number of values"));
            }
            // Passed: the total and where it ends are all the answer needs. Refused: the live
            // sub-windows, oldest first once rebuilt, give the retry time.
            let state = if allowed {
                SlidingState::from_counts([(*last, *total)])
            } else {
                SlidingState::from_counts(pairs.chunks(2).map(|p| (p[0], p[1])))
            };
            sliding_window::summarize(&state, now_us, limit, hits, allowed)
        }
        Algorithm::TokenBucket => {
            let [tat_us, frac] = rest else {
                return Err(protocol("token bucket reply needs tat and frac"));
            };
            // The script answers the fraction in the current rate.
            let state = BucketState {
                tat_us: *tat_us,
                frac: *frac,
                rate: limit.requests,
            };
            token_bucket::summarize(&state, now_us, limit, hits, allowed)
        }
        Algorithm::FixedWindow => {
            let [window, count] = rest else {
                return Err(protocol("fixed window reply needs window and count"));
            };
            let state = FixedState {
                window: *window,
                count: *count,
            };
            fixed_window::summarize(&state, now_us, limit, hits, allowed)
        }
    };
    Ok(outcome.decision)
}
