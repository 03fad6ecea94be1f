//! The local deny cache: when the store refuses a check, it also says when that same request could
//! pass (`retry_after`). Until then a call for the same counter and limit costing at least as much
//! is refused here, without a store round trip: a client hammering a spent limit costs Redis
//! nothing. Another replica may give budget back (a refund this replica never sees), so a denial
//! is kept at most `max_age` (1 s by default), whatever its retry time: that bounds how long a
//! refusal outlives a refund made elsewhere; the answer still carries the full retry time. A
//! refund made here forgets the denial at once. Durations are measured on this process's
//! monotonic clock: only relative times matter here.
//!
//! Bounded in entries and in bytes (keys are request-fed): each shard is an LRU list, and an
//! insert evicts the least recently used denials until it fits, O(1) each. Eviction only costs a
//! store call later; it never changes a decision. It must never cache a failure-mode answer.

use std::hash::{BuildHasher, RandomState};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use lru::LruCache;

use crate::algorithm::{Check, Decision, Limit};

const SHARDS: usize = 16;

/// What one entry costs besides its key: the denial, the map slot and the list links.
const ENTRY_OVERHEAD_BYTES: usize = std::mem::size_of::<Denial>() + 64;

/// How large the cache may grow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DenyCacheBounds {
    pub max_entries: usize,
    pub max_bytes: usize,
    /// The longest a denial is kept (a refund on another replica shows after at most this).
    pub max_age: Duration,
}

impl Default for DenyCacheBounds {
    fn default() -> Self {
        Self {
            max_entries: 100_000,
            max_bytes: 16 << 20,
            max_age: Duration::from_secs(1),
        }
    }
}

struct Denial {
    /// The limit the refusal was under: a reload that changes it must not be shadowed.
    limit: Limit,
    /// When the entry goes: its retry time, or `max_age` after the refusal if sooner.
    until: Instant,
    /// When the request could pass, as the store said (the answer's retry time).
    retry_at: Instant,
    hits: u64,
    decision: Decision,
    decided_at: Instant,
}

struct Shard {
    entries: LruCache<String, Denial>,
    bytes: usize,
}

pub struct DenyCache {
    shards: Vec<Mutex<Shard>>,
    hasher: RandomState,
    max_entries_per_shard: usize,
    max_bytes_per_shard: usize,
    max_age: Duration,
}

fn cost(key: &str) -> usize {
    key.len() + ENTRY_OVERHEAD_BYTES
}

impl DenyCache {
    pub fn new(bounds: DenyCacheBounds) -> Self {
        Self {
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Shard {
                        entries: LruCache::unbounded(),
                        bytes: 0,
                    })
                })
                .collect(),
            hasher: RandomState::new(),
            max_entries_per_shard: bounds.max_entries.div_ceil(SHARDS).max(1),
            max_bytes_per_shard: bounds.max_bytes.div_ceil(SHARDS),
            max_age: bounds.max_age,
        }
    }

    fn shard(&self, key: &str) -> &Mutex<Shard> {
        &self.shards[(self.hasher.hash_one(key) as usize) % SHARDS]
    }

    /// The cached denial for this check, with its durations brought up to now.
    pub fn lookup(&self, check: &Check, now: Instant) -> Option<Decision> {
        let mut shard = self
            .shard(&check.key)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let denial = shard.entries.get(check.key.as_str())?;
        if denial.until <= now {
            // Expired: free its room now rather than when the LRU order reaches it.
            if let Some((key, _)) = shard.entries.pop_entry(check.key.as_str()) {
                shard.bytes -= cost(&key);
            }
            return None;
        }
        if denial.limit != check.limit || check.hits < denial.hits {
            return None;
        }
        let elapsed = now.duration_since(denial.decided_at);
        Some(Decision {
            reset_after: denial.decision.reset_after.saturating_sub(elapsed),
            retry_after: Some(
                denial
                    .retry_at
                    .duration_since(now)
                    .max(Duration::from_micros(1)),
            ),
            ..denial.decision
        })
    }

    /// Drops what is remembered for `key` (its budget was given back).
    pub fn forget(&self, key: &str) {
        let mut shard = self.shard(key).lock().unwrap_or_else(|p| p.into_inner());
        if let Some((key, _)) = shard.entries.pop_entry(key) {
            shard.bytes -= cost(&key);
        }
    }

    /// Remembers a denial that waiting can cure (one with `retry_after`); returns how many
    /// entries were evicted to make room.
    pub fn remember(&self, check: &Check, decision: &Decision, now: Instant) -> usize {
        let Some(retry_after) = decision.retry_after.filter(|_| !decision.allowed) else {
            return 0;
        };
        let size = cost(&check.key);
        if size > self.max_bytes_per_shard {
            return 0;
        }
        let mut shard = self
            .shard(&check.key)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some((key, _)) = shard.entries.pop_entry(check.key.as_str()) {
            shard.bytes -= cost(&key);
        }
        let mut evicted = 0;
        while shard.entries.len() >= self.max_entries_per_shard
            || shard.bytes + size > self.max_bytes_per_shard
        {
            let Some((key, _)) = shard.entries.pop_lru() else {
                break;
            };
            shard.bytes -= cost(&key);
            evicted += 1;
        }
        shard.bytes += size;
        shard.entries.push(
            check.key.clone(),
            Denial {
                limit: check.limit,
                until: now + retry_after.min(self.max_age),
                retry_at: now + retry_after,
                hits: check.hits,
                decision: *decision,
                decided_at: now,
            },
        );
        evicted
    }

    /// Entries held, and the bytes they are accounted at.
    pub fn size(&self) -> (usize, usize) {
        self.shards.iter().fold((0, 0), |(n, b), shard| {
            let shard = shard.lock().unwrap_or_else(|p| p.into_inner());
            (n + shard.entries.len(), b + shard.bytes)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;

    const LIMIT: Limit = Limit {
        algorithm: Algorithm::SlidingWindow,
        requests: 1,
        window_us: 3_600_000_000,
        burst: 1,
    };

    fn denied() -> Decision {
        Decision {
            allowed: false,
            limit: 1,
            remaining: 0,
            reset_after: Duration::from_secs(3600),
            retry_after: Some(Duration::from_secs(3600)),
            by_failure_mode: false,
            lease: None,
        }
    }

    fn check(key: String) -> Check {
        Check {
            key,
            limit: LIMIT,
            hits: 1,
            refund: false,
            post_paid: false,
        }
    }

    #[test]
    fn live_denials_never_outgrow_the_entry_bound() {
        let cache = DenyCache::new(DenyCacheBounds {
            max_age: Duration::from_secs(3600),
            max_entries: 1_000,
            max_bytes: usize::MAX,
        });
        let now = Instant::now();
        let mut evicted = 0;
        for i in 0..300_000 {
            evicted += cache.remember(&check(format!("{{d|ip={i}}}")), &denied(), now);
        }
        let (entries, _) = cache.size();
        assert!(entries <= 1_008, "{entries} entries"); // 16 shards of ceil(1000 / 16)
        assert_eq!(evicted + entries, 300_000);
        // The most recent denials are the ones kept.
        assert!(cache.lookup(&check("{d|ip=299999}".into()), now).is_some());
        assert!(cache.lookup(&check("{d|ip=0}".into()), now).is_none());
    }

    #[test]
    fn long_keys_never_outgrow_the_byte_bound() {
        let max_bytes = 256 * 1024;
        let cache = DenyCache::new(DenyCacheBounds {
            max_age: Duration::from_secs(3600),
            max_entries: usize::MAX,
            max_bytes,
        });
        let now = Instant::now();
        let long = "k".repeat(1024);
        for i in 0..10_000 {
            cache.remember(&check(format!("{{d|v={long}{i}}}")), &denied(), now);
        }
        let (entries, bytes) = cache.size();
        assert!(bytes <= max_bytes, "{bytes} bytes");
        assert!(entries > 100, "room is used: {entries}");
    }

    #[test]
    fn expired_denials_are_dropped_when_looked_up() {
        let cache = DenyCache::new(DenyCacheBounds::default());
        let now = Instant::now();
        let short = Decision {
            retry_after: Some(Duration::from_millis(10)),
            ..denied()
        };
        cache.remember(&check("{d|k=v}".into()), &short, now);
        assert!(cache.lookup(&check("{d|k=v}".into()), now).is_some());
        let later = now + Duration::from_millis(11);
        assert!(cache.lookup(&check("{d|k=v}".into()), later).is_none());
        assert_eq!(cache.size(), (0, 0));
    }
}
