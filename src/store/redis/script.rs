//! The decision script: `lua/` files concatenated into one script body (three algorithm functions
//! and the dispatcher `check.lua`), sent by EVALSHA, re-sent by EVAL when a node answers NOSCRIPT
//! (restart, failover, a promoted replica). Why Lua and not MULTI: the read, the decision and the
//! write must be one atomic step on the server, and a script is one round trip.
//!
//! This module encodes a check into the script's arguments; `reply.rs` turns its reply back into
//! a `Decision` (re-exported here, the script's one face).

use std::sync::LazyLock;

use crate::algorithm::concurrency;
use crate::algorithm::sliding_window;
use crate::algorithm::token_bucket;
use crate::algorithm::{Algorithm, ChargeMode, Check};
use crate::store::StoreError;

use super::reply::protocol;
pub use super::reply::{
    KeyReply, Replies, allowed, decision, key_error, parse_reply, parse_reply_with_clock,
};

/// The script's definitions: every function, `check` (one script call) last. Run as they stand
/// they define and return nothing.
macro_rules! definitions {
    () => {
        concat!(
            include_str!("../../../lua/common.lua"),
            include_str!("../../../lua/sliding_packed.lua"),
            include_str!("../../../lua/sliding_hash.lua"),
            include_str!("../../../lua/sliding_window.lua"),
            include_str!("../../../lua/token_bucket.lua"),
            include_str!("../../../lua/fixed_window.lua"),
            include_str!("../../../lua/concurrency.lua"),
            include_str!("../../../lua/claims.lua"),
            include_str!("../../../lua/held.lua"),
            include_str!("../../../lua/check.lua"),
        )
    };
}

/// The decision script for EVAL: the definitions, then one script call. Every call runs the
/// definitions again (a tenth of a cold decision's cost): `LIBRARY` defines them once.
pub const SOURCE: &str = concat!(definitions!(), "return check(KEYS, ARGV)\n");

/// SHA1 of `SOURCE`, the name EVALSHA knows it by.
pub static SHA: LazyLock<String> =
    LazyLock::new(|| redis::Script::new(SOURCE).get_hash().to_owned());

/// The same definitions as a Redis function library (Redis 7 and Valkey: `FUNCTION LOAD` once
/// per node, then `FCALL`), named after `SHA`: two versions of Portcullis in a rolling update
/// each load and call their own. `allow-cross-slot-keys`: a Cluster batch over several slots of
/// one node reads keys of several slots, as a script without flags may (a function without it is
/// refused them).
pub static LIBRARY: LazyLock<String> = LazyLock::new(|| {
    format!(
        "#!lua name=portcullis_{sha}\n{}redis.register_function{{function_name = '{}', \
         callback = check, flags = {{'allow-cross-slot-keys'}}}}\n",
        definitions!(),
        FUNCTION.as_str(),
        sha = SHA.as_str()
    )
});

/// The function `LIBRARY` registers: one script call, as `SOURCE` makes it.
pub static FUNCTION: LazyLock<String> =
    LazyLock::new(|| format!("portcullis_check_{}", SHA.as_str()));

/// Arguments per key after the clock and mode arguments.
pub const ARGS_PER_KEY: usize = 6;

/// Added to a charge's operation number when its hits are post-paid (recorded even when they
/// do not fit): 21, 22, 23.
pub const POST_PAID_OP: i64 = 20;

/// The operation of a check whose limit is zero (a blocked descriptor, sent only in an
/// all-or-nothing call): always refused, its key never read or written.
pub const BLOCKED_OP: i64 = 4;

/// How new counters are stored in Redis (the sliding window's, the fixed window's and the token
/// bucket's). Either is read as it is stored; this says how a new key is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Layout {
    /// One string per counter, written with its expiry by one `SET`: the sliding window's packed
    /// counts (`lua/sliding_packed.lua`: a third of the hash's memory), the fixed window's and the
    /// bucket's numbers (a cold decision's write is one command, not `HSET` and `PEXPIREAT`).
    #[default]
    Packed,
    /// Hashes: what Portcullis 0.1.0 reads and writes, for a rolling update from it (its
    /// replicas cannot read a string).
    Hash,
}

/// Turns one call's charges, refunds and post-paid charges of the sliding window (1, 11, 21),
/// the bucket (2, 12, 22) and the fixed window (3, 13, 23) into their hash-layout forms (5, 15,
/// 25; 7, 17, 27; 8, 18, 28) in `args` (one call as `push_call` wrote it): new keys of the call
/// are made as hashes.
pub fn prefer_hash_layout(args: &mut [i64]) {
    let count = args.get(3).map_or(0, |&c| usize::try_from(c).unwrap_or(0));
    for i in 0..count {
        if let Some(op) = args.get_mut(4 + i * ARGS_PER_KEY) {
            match *op % 10 {
                1 if *op <= 21 => *op += 4,
                2 | 3 if *op <= 23 => *op += 5,
                _ => {}
            }
        }
    }
}

/// Whether `check`, on a store whose RLS checks count the RLQS grants' claims, is sent as a
/// charge that counts them (`count_claims`; its reply then ends with one more number): charges
/// of a window or a bucket, post-paid ones too (a window's recorded whole and answered beside
/// the claims, a bucket's recorded in the frame its claims are counted in:
/// `algorithm::charge_post_paid_claimed`). Refunds and slots are not.
pub fn counts_claims(check: &Check) -> bool {
    !check.refund
        && check.limit.requests > 0
        && check.limit.window_us >= 1_000
        && matches!(
            check.limit.algorithm,
            Algorithm::SlidingWindow | Algorithm::TokenBucket | Algorithm::FixedWindow
        )
}

/// Marks one call's charges that count the grants' claims (`counts_claims`) in `args` (the call
/// as `push_call` wrote it, after `prefer_hash_layout`): their operation plus 100, plus 1000
/// times their window in milliseconds (the one number claims need that a check does not carry;
/// below 2^47 for a day, exact in a Lua double).
pub fn count_claims(args: &mut [i64], checks: &[&Check]) {
    for (i, check) in checks.iter().enumerate() {
        if !counts_claims(check) {
            continue;
        }
        if let Some(op) = args.get_mut(4 + i * ARGS_PER_KEY)
            && matches!(*op, 1 | 2 | 3 | 5 | 7 | 8 | 21 | 22 | 23 | 25 | 27 | 28)
        {
            let window_ms = i64::try_from(check.limit.window_us / 1_000).unwrap_or(0);
            *op += CLAIMS_OP + 1_000 * window_ms;
        }
    }
}

/// Added to a charge's operation number when it counts the grants' claims (`count_claims`).
pub const CLAIMS_OP: i64 = 100;

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

/// The mode `pack` gives a call of one check, each alone (0), whose key no other check of the
/// script call names: check.lua runs it by its quick path without reading it twice.
pub const ALONE_ONCE: i64 = 4;

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
    // Where each check's key place was written, and how many checks name each key: a key named
    // by one check only is sent as its place negated (check.lua decides and writes it at once).
    let mut places: Vec<(usize, i64)> = Vec::with_capacity(keys.len());
    let mut named: Vec<u32> = Vec::with_capacity(keys.len());
    // Calls of one check each alone: where their mode was written, and their key's place.
    let mut single: Vec<(usize, i64)> = Vec::new();
    for _ in 0..*calls {
        let &[clock, deadline, mode, count, ref after @ ..] = rest else {
            return Err(mismatch());
        };
        let count = usize::try_from(count).map_err(|_| mismatch())?;
        let mode_at = numbers.len() + 16;
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
                named.push(0);
                distinct.len() as i64
            });
            for n in check {
                put(*n, &mut numbers);
            }
            places.push((numbers.len(), at));
            named[at as usize - 1] += 1;
            put(at, &mut numbers);
            if count == 1 && mode == 0 {
                single.push((mode_at, at));
            }
        }
        rest = &after[count * ARGS_PER_KEY..];
    }
    if !rest.is_empty() || keys_left.next().is_some() {
        return Err(mismatch());
    }
    for (offset, at) in places {
        if named[at as usize - 1] == 1 {
            numbers[offset..offset + 8].copy_from_slice(&(-at).to_be_bytes());
        }
    }
    for (offset, at) in single {
        if named[at as usize - 1] == 1 {
            numbers[offset..offset + 8].copy_from_slice(&ALONE_ONCE.to_be_bytes());
        }
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
    // Slots are not a cost consumed: a concurrency charge is never recorded past its limit.
    let post_paid = check.post_paid && !check.refund && limit.algorithm != Algorithm::Concurrency;
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
            Algorithm::Concurrency => args.extend([
                16,
                as_i64(limit.window_us.max(1)),
                as_i64(limit.requests),
                // A count of at most MAX_SLOTS, or a lease token (up to 10^9).
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
        Algorithm::Concurrency => args.extend([
            6,
            as_i64(limit.window_us.max(1)),
            as_i64(limit.requests.min(concurrency::MAX_SLOTS)),
            as_i64(hits),
            0,
            0,
        ]),
    }
}

#[cfg(test)]
#[path = "script_tests.rs"]
mod tests;
