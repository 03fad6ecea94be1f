//! The embedded store: counters in process memory. It is the default for a single replica and the
//! reference model the Redis scripts are tested against, so it runs the algorithms exactly as they
//! are written in `limiter`, nothing more.
//!
//! Sharded so that concurrent calls for different descriptors rarely meet on one lock; no lock is
//! held across an await. Keys expire when their state is back to empty, and a sweeper removes
//! expired keys a shard at a time, so memory follows the live descriptors, not every one ever seen.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use super::{Store, StoreFuture};
use crate::clock::Clock;
use crate::limiter::{self, Check, Decision, State};

const SHARDS: usize = 64;

struct Entry {
    state: State,
    /// Clock reading after which the state is empty again and the entry may go.
    expires_at_us: u64,
}

type Shard = Mutex<HashMap<String, Entry>>;

pub struct MemoryStore {
    shards: Box<[Shard]>,
    hasher: RandomState,
    clock: Arc<dyn Clock>,
}

impl MemoryStore {
    pub fn new(clock: Arc<dyn Clock>) -> Arc<Self> {
        Arc::new(Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: RandomState::new(),
            clock,
        })
    }

    fn shard(&self, key: &str) -> &Shard {
        let index = (self.hasher.hash_one(key) as usize) % self.shards.len();
        &self.shards[index]
    }

    /// Runs one check at `now_us`. Public so that model tests can drive exact clock readings.
    pub fn check_at(&self, check: &Check, now_us: u64) -> Decision {
        // A poisoned shard only means another call panicked mid-update; the map is still sound.
        let mut shard = self
            .shard(&check.key)
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let fresh = || State::empty(check.limit.algorithm);
        let entry = shard.get_mut(check.key.as_str());
        let mut state = match entry {
            Some(entry) if entry.expires_at_us > now_us => {
                std::mem::replace(&mut entry.state, fresh())
            }
            _ => fresh(),
        };
        let outcome = limiter::apply(&mut state, now_us, &check.limit, check.hits);
        if outcome.keep_for_us == 0 {
            shard.remove(check.key.as_str());
        } else {
            let expires_at_us = now_us.saturating_add(outcome.keep_for_us);
            match shard.get_mut(check.key.as_str()) {
                Some(entry) => {
                    entry.state = state;
                    entry.expires_at_us = expires_at_us;
                }
                None => {
                    shard.insert(
                        check.key.clone(),
                        Entry {
                            state,
                            expires_at_us,
                        },
                    );
                }
            }
        }
        outcome.decision
    }

    /// Removes every expired entry; returns how many were removed.
    pub fn sweep(&self) -> usize {
        let now_us = self.clock.now_us();
        let mut removed = 0;
        for shard in self.shards.iter() {
            let mut shard = shard
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let before = shard.len();
            shard.retain(|_, entry| entry.expires_at_us > now_us);
            removed += before - shard.len();
        }
        removed
    }

    /// How many counters are held (expired ones included until the next sweep).
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).len())
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sweeps every `interval` for as long as the store is alive (the task holds only a weak
    /// reference, so dropping the store ends it).
    pub fn spawn_sweeper(self: &Arc<Self>, interval: Duration) {
        let weak: Weak<Self> = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticker.tick().await;
            loop {
                ticker.tick().await;
                let Some(store) = weak.upgrade() else { break };
                let removed = store.sweep();
                tracing::trace!(removed, "memory store swept");
            }
        });
    }
}

impl Store for Arc<MemoryStore> {
    fn check<'a>(&'a self, checks: &'a [Check]) -> StoreFuture<'a> {
        let now_us = self.clock.now_us();
        let decisions = checks.iter().map(|c| self.check_at(c, now_us)).collect();
        Box::pin(std::future::ready(Ok(decisions)))
    }

    fn name(&self) -> &'static str {
        "memory"
    }
}
