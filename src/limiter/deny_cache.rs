//! The local deny cache: when the store refuses a check, it also says when that same request could
//! pass (`retry_after`). Until then a call for the same counter and limit costing at least as much
//! is refused here, without a store round trip: a client hammering a spent limit costs Redis
//! nothing. Other replicas can only spend more of the budget, never return it, so the cached
//! denial is never wrong for its duration. Durations are measured on this process's monotonic
//! clock: only relative times matter here.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::algorithm::{Check, Decision, Limit};

const SHARDS: usize = 16;
/// Above this many entries in a shard, expired ones are dropped on insert.
const SHARD_SOFT_CAP: usize = 16_384;

struct Denial {
    /// The limit the refusal was under: a reload that changes it must not be shadowed.
    limit: Limit,
    until: Instant,
    hits: u64,
    decision: Decision,
    decided_at: Instant,
}

pub struct DenyCache {
    shards: Vec<Mutex<HashMap<String, Denial>>>,
    hasher: RandomState,
}

impl Default for DenyCache {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: RandomState::new(),
        }
    }
}

impl DenyCache {
    fn shard(&self, key: &str) -> &Mutex<HashMap<String, Denial>> {
        &self.shards[(self.hasher.hash_one(key) as usize) % SHARDS]
    }

    /// The cached denial for this check, with its durations brought up to now.
    pub fn lookup(&self, check: &Check, now: Instant) -> Option<Decision> {
        let shard = self
            .shard(&check.key)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let denial = shard.get(check.key.as_str())?;
        if denial.limit != check.limit || denial.until <= now || check.hits < denial.hits {
            return None;
        }
        let elapsed = now.duration_since(denial.decided_at);
        Some(Decision {
            reset_after: denial.decision.reset_after.saturating_sub(elapsed),
            retry_after: Some(
                denial
                    .until
                    .duration_since(now)
                    .max(Duration::from_micros(1)),
            ),
            ..denial.decision
        })
    }

    /// Remembers a denial that waiting can cure (one with `retry_after`).
    pub fn remember(&self, check: &Check, decision: &Decision, now: Instant) {
        let Some(retry_after) = decision.retry_after.filter(|_| !decision.allowed) else {
            return;
        };
        let mut shard = self
            .shard(&check.key)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if shard.len() >= SHARD_SOFT_CAP {
            shard.retain(|_, d| d.until > now);
        }
        shard.insert(
            check.key.clone(),
            Denial {
                limit: check.limit,
                until: now + retry_after,
                hits: check.hits,
                decision: *decision,
                decided_at: now,
            },
        );
    }
}
