//! The decision script's reply, read back: its numbers split per call and key (a binary string,
//! or an array when a key failed), a key's error typed, and a key's numbers turned into a
//! `Decision` through the same `summarize` functions the memory store uses. It must never panic
//! on what Redis sends: anything unexpected is a protocol error.

use redis::Value;

use crate::algorithm::concurrency::{self, Leases};
use crate::algorithm::fixed_window::{self, FixedState};
use crate::algorithm::sliding_window::{self, SlidingState};
use crate::algorithm::token_bucket::{self, BucketState};
use crate::algorithm::{Algorithm, Check, Decision, Outcome};
use crate::store::StoreError;

pub(super) fn protocol(message: impl Into<String>) -> StoreError {
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

/// Whether `error` is the script's refusal to run a call that reached Redis after its deadline
/// (`EXPIRED`, `key_error`).
pub fn reached_after_its_deadline(error: &StoreError) -> bool {
    matches!(error, StoreError::Unavailable(text) if text.starts_with(EXPIRED_TEXT))
}

const EXPIRED_TEXT: &str = "the call reached Redis after its deadline";

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
            "{EXPIRED_TEXT} (answered by the failure mode), so it was not run: {text}"
        )),
        "NOREPLICAS" => StoreError::Unavailable(format!(
            "fewer replicas answer this master than its min-replicas-to-write asks, so it \
             refuses every script call (answered by the failure mode until they are back): {text}"
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
    let recorded = check.post_paid
        && !check.refund
        && charged
        && !allowed
        && check.hits > 0
        && limit.algorithm != Algorithm::Concurrency;
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
        Algorithm::Concurrency => {
            let [count, first_end_us, last_end_us, took] = rest else {
                return Err(protocol(
                    "concurrency reply needs held, first and last end, took",
                ));
            };
            let leases = Leases {
                count: *count,
                first_end_us: *first_end_us,
                last_end_us: *last_end_us,
            };
            let mut outcome = concurrency::summarize(&leases, now_us, limit, hits, allowed);
            // A take the script did not commit (an all-or-nothing call refused) names no lease.
            if *took != 1 {
                outcome.decision.lease = None;
            }
            outcome
        }
    };
    Ok(outcome.decision)
}
