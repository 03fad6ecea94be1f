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
    include_str!("../../../lua/sliding_packed.lua"),
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

/// Added to a charge's operation number when its hits are post-paid (recorded even when they
/// do not fit): 21, 22, 23.
pub const POST_PAID_OP: i64 = 20;

/// The operation of a check whose limit is zero (a blocked descriptor, sent only in an
/// all-or-nothing call): always refused, its key never read or written.
pub const BLOCKED_OP: i64 = 4;

/// How the sliding window's counters are stored in Redis. Either is read as it is stored; this
/// says how a new key is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SlidingLayout {
    /// One string of packed counts (`lua/sliding_packed.lua`): a third of the hash's memory.
    #[default]
    Packed,
    /// A hash of one field per sub-window: what Portcullis 0.1.0 reads and writes, for a rolling
    /// update from it (its replicas cannot read a packed key).
    Hash,
}

/// Turns one call's sliding-window operations (1, 11, 21) into their hash-layout forms (5, 15,
/// 25) in `args` (one call as `push_call` wrote it): new keys of the call are made as hashes.
pub fn prefer_hash_layout(args: &mut [i64]) {
    let count = args.get(3).map_or(0, |&c| usize::try_from(c).unwrap_or(0));
    for i in 0..count {
        if let Some(op) = args.get_mut(4 + i * ARGS_PER_KEY)
            && matches!(*op, 1 | 11 | 21)
        {
            *op += 4;
        }
    }
}

/// The script's number for a call's charge mode (the third of a call's numbers).
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

/// The script's mode that looks at an all-or-nothing call without charging it: what mode 1 would
/// answer (the call's charges tried in order on copies), nothing written.
pub const LOOK_ALL: i64 = 3;

/// What the script is sent for a script call: its keys, each once, and its numbers as one
/// binary argument (ARGV[1]).
#[derive(Debug)]
pub struct Packed<'a> {
    pub keys: Vec<&'a str>,
    pub numbers: Vec<u8>,
}

/// Packs a script call's `args` (the call count, a zero, then each call as `push_call` writes it)
/// with `keys` (one per check, in order): every key once, in the order first named, and each
/// check's numbers followed by where its key is among them (from 1); the second number the count
/// of keys when `carried` (they go in ARGV, not KEYS). Each number is a big-endian signed 64-bit
/// integer: one binary argument instead of a decimal string per number, and a hot key once
/// instead of once per call, were most of the script's cost per check (BENCHMARKS.md, "The
/// script's cost"). Arguments that do not match the keys are a protocol error.
pub fn pack<'a>(keys: &'a [String], args: &[i64], carried: bool) -> Result<Packed<'a>, StoreError> {
    let mismatch = || protocol("the script's arguments do not match its keys");
    let [calls, _, all @ ..] = args else {
        return Err(mismatch());
    };
    let mut rest: &[i64] = all;
    let mut distinct: Vec<&str> = Vec::new();
    let mut seen: std::collections::HashMap<&str, i64> = std::collections::HashMap::new();
    let mut numbers = Vec::with_capacity(8 * (args.len() + keys.len()));
    fn put(n: i64, numbers: &mut Vec<u8>) {
        numbers.extend_from_slice(&n.to_be_bytes());
    }
    put(*calls, &mut numbers);
    // The carried count is known once the keys are.
    put(0, &mut numbers);
    let mut keys_left = keys.iter();
    for _ in 0..*calls {
        let &[clock, deadline, mode, count, ref after @ ..] = rest else {
            return Err(mismatch());
        };
        let count = usize::try_from(count).map_err(|_| mismatch())?;
        for n in [clock, deadline, mode, count as i64] {
            put(n, &mut numbers);
        }
        if after.len() < count * ARGS_PER_KEY {
            return Err(mismatch());
        }
        for check in after[..count * ARGS_PER_KEY].chunks(ARGS_PER_KEY) {
            let key = keys_left.next().ok_or_else(mismatch)?;
            let at = *seen.entry(key.as_str()).or_insert_with(|| {
                distinct.push(key.as_str());
                distinct.len() as i64
            });
            for n in check {
                put(*n, &mut numbers);
            }
            put(at, &mut numbers);
        }
        rest = &after[count * ARGS_PER_KEY..];
    }
    if !rest.is_empty() || keys_left.next().is_some() {
        return Err(mismatch());
    }
    if carried {
        numbers[8..16].copy_from_slice(&(distinct.len() as i64).to_be_bytes());
    }
    Ok(Packed {
        keys: distinct,
        numbers,
    })
}

/// Pushes one call as the script reads it: its clock, its deadline on Redis' clock (µs, 0 for
/// none), its mode (`mode_arg`, or `LOOK_ALL`), its key count, then six numbers per check. A
/// script call carries the number of calls first, then its calls one after another.
pub fn push_call(
    checks: &[&Check],
    clock: ScriptClock,
    expires_us: u64,
    mode: i64,
    args: &mut Vec<i64>,
) {
    args.push(i64::try_from(clock.arg()).unwrap_or(i64::MAX));
    args.push(i64::try_from(expires_us).unwrap_or(0));
    args.push(mode);
    args.push(checks.len() as i64);
    for check in checks {
        push_args(check, args);
    }
}

/// Pushes the six numbers of one check. Hits above the limit's capacity are clamped to one more
/// than the capacity: they are refused either way, and every number stays exact in a Lua double.
/// Post-paid hits are recorded even when refused, so they are sent as they are (up to 2^32, the
/// most Envoy's `hits_addend` carries), under the operation's number + 20.
pub fn push_args(check: &Check, args: &mut Vec<i64>) {
    let limit = &check.limit;
    let post_paid = check.post_paid && !check.refund;
    let hits = if post_paid {
        check.hits.min(u64::from(u32::MAX))
    } else {
        check.hits.min(limit.capacity().saturating_add(1))
    };
    let op = |base: i64| if post_paid { base + POST_PAID_OP } else { base };
    let as_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    if limit.requests == 0 && !crate::algorithm::records_at_zero(check) {
        // A blocked descriptor in an all-or-nothing call: refused, nothing read or written.
        args.extend([BLOCKED_OP, 0, 0, 0, 0, 0]);
        return;
    }
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
            op(1),
            as_i64(sliding_window::sub_window_us(limit.window_us)),
            as_i64(limit.requests),
            as_i64(hits),
            0,
            0,
        ]),
        Algorithm::TokenBucket => {
            let tolerance = token_bucket::span_of(limit.burst, limit);
            let (cost_q, cost_r) = if hits > limit.burst && !post_paid {
                (-1, 0)
            } else {
                let cost = token_bucket::span_of(hits, limit);
                (as_i64(cost.quotient_us), as_i64(cost.remainder))
            };
            args.extend([
                op(2),
                as_i64(limit.requests),
                cost_q,
                cost_r,
                as_i64(tolerance.quotient_us),
                as_i64(tolerance.remainder),
            ]);
        }
        Algorithm::FixedWindow => args.extend([
            op(3),
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

/// One key's part of the script's reply: its numbers, or why Redis could not decide or write it.
pub type KeyReply = Result<Vec<u64>, StoreError>;

/// The script's reply, split: one entry per call, holding one entry per key.
pub type Replies = Vec<Vec<KeyReply>>;

/// Splits the script's reply into numbers: the node's clock or 0, then per call its key count
/// and per key its numbers' count and numbers. As one binary string of big-endian 64-bit
/// integers (every key decided: no decimal text to parse, here or in redis-rs), or as an array
/// where a key Redis failed is the error it met, as a string (see `lua/check.lua`). Anything
/// else is a protocol error, never a panic.
pub fn parse_reply(value: &Value) -> Result<Replies, StoreError> {
    parse_reply_with_clock(value).map(|(_, calls)| calls)
}

/// One entry of the script's reply.
enum Item<'a> {
    Int(i64),
    Text(std::borrow::Cow<'a, str>),
    Other(&'a Value),
}

fn items(value: &Value) -> Result<Box<dyn Iterator<Item = Item<'_>> + '_>, StoreError> {
    match value {
        Value::BulkString(bytes) if bytes.len() % 8 == 0 => {
            Ok(Box::new(bytes.chunks_exact(8).map(|b| {
                Item::Int(i64::from_be_bytes(b.try_into().unwrap_or_default()))
            })))
        }
        Value::Array(values) => Ok(Box::new(values.iter().map(|v| match v {
            Value::Int(n) => Item::Int(*n),
            Value::BulkString(text) => Item::Text(String::from_utf8_lossy(text)),
            Value::SimpleString(text) => Item::Text(text.as_str().into()),
            other => Item::Other(other),
        }))),
        other => Err(protocol(format!(
            "expected the script's numbers, got {other:?}"
        ))),
    }
}

/// `parse_reply`, and the node's clock in µs when the script read `TIME`: every reply tells the
/// node's clock, even one whose calls all expired.
pub fn parse_reply_with_clock(value: &Value) -> Result<(Option<u64>, Replies), StoreError> {
    let mut items = items(value)?;
    let clock = match items.next() {
        Some(first) => Some(number(first)?).filter(|&c| c > 0),
        None => return Err(protocol("the script's reply is empty")),
    };
    let mut calls = Vec::new();
    while let Some(count) = items.next() {
        let count = number(count)?;
        let mut keys = Vec::with_capacity(usize::try_from(count).unwrap_or(0).min(1024));
        for _ in 0..count {
            let entry = match items.next() {
                Some(Item::Int(size)) => {
                    let size = usize::try_from(size)
                        .map_err(|_| protocol(format!("a negative length {size}")))?;
                    let mut numbers = Vec::with_capacity(size.min(256));
                    for _ in 0..size {
                        let value = items
                            .next()
                            .ok_or_else(|| protocol("the script's reply ends inside a key"))?;
                        numbers.push(number(value)?);
                    }
                    Ok(numbers)
                }
                Some(Item::Text(text)) => Err(key_error(&text)),
                Some(Item::Other(other)) => {
                    return Err(protocol(format!(
                        "unexpected {other:?} in the script's reply"
                    )));
                }
                None => return Err(protocol("the script's reply ends inside a call")),
            };
            keys.push(entry);
        }
        calls.push(keys);
    }
    Ok((clock, calls))
}

/// What an error the script met on one key means for the operator (the text starts with Redis'
/// error code, as `classify` reads it from a whole reply).
pub fn key_error(text: &str) -> StoreError {
    let code = text.split(' ').next().unwrap_or("");
    match code {
        "OOM" => StoreError::Unavailable(format!(
            "Redis is out of memory (maxmemory reached, no key can be evicted): {text}"
        )),
        "NOPERM" => StoreError::Permanent(format!("permission denied: {text}")),
        "WRONGTYPE" => StoreError::Permanent(format!(
            "a key under the prefix holds something Portcullis did not write (another program \
             shares the prefix?): {text}"
        )),
        "EXPIRED" => StoreError::Unavailable(format!(
            "the call reached Redis after its deadline (answered by the failure mode), so it \
             was not run: {text}"
        )),
        "MASTERDOWN" | "LOADING" | "BUSY" | "TRYAGAIN" | "CLUSTERDOWN" => {
            StoreError::Unavailable(text.to_owned())
        }
        _ => StoreError::Protocol(format!("the script failed on a key: {text}")),
    }
}

fn number(item: Item<'_>) -> Result<u64, StoreError> {
    match item {
        Item::Int(n) => u64::try_from(n)
            .map_err(|_| protocol(format!("a negative number {n} in the script's reply"))),
        Item::Text(text) => Err(protocol(format!(
            "not a number in the script's reply: {text:?}"
        ))),
        Item::Other(other) => Err(protocol(format!(
            "not a number in the script's reply: {other:?}"
        ))),
    }
}

/// Whether a key's reply says the check passed (the first number).
pub fn allowed(numbers: &[u64]) -> bool {
    numbers.first() == Some(&1)
}

/// Turns one key's reply into the decision, with the same Rust code as the memory store.
/// `charged`: the call could charge (not a probe), so refused post-paid hits were recorded and
/// the wait is the one until a check-only call passes (as `algorithm::charge_post_paid` says).
pub fn decision(check: &Check, numbers: &[u64], charged: bool) -> Result<Decision, StoreError> {
    let [allowed, now_us, rest @ ..] = numbers else {
        return Err(protocol(format!("reply too short: {numbers:?}")));
    };
    let (allowed, now_us) = (*allowed == 1, *now_us);
    let limit = &check.limit;
    let recorded = check.post_paid && !check.refund && charged && !allowed && check.hits > 0;
    let hits = if recorded { 0 } else { check.hits };
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

#[cfg(test)]
#[path = "script_tests.rs"]
mod tests;
