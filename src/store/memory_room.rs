//! The memory store's room: its cap on counters (and on concurrency slots held in all), how
//! expired counters are dropped to make room, and the error a full store answers. It must never
//! evict a live counter (that would hand its budget back).

use std::collections::HashMap;
use std::sync::MutexGuard;
use std::sync::atomic::Ordering;

use super::{Entry, MemoryStore};
use crate::algorithm::State;
use crate::store::StoreError;

impl MemoryStore {
    /// Whether `count` new counters fit, the call's `held` shards locked: expired counters are
    /// dropped to make room (the held shards', then those of every shard free at this moment);
    /// a store full of live ones refuses.
    pub(super) fn make_room_for(
        &self,
        held: &mut [MutexGuard<'_, HashMap<String, Entry>>],
        count: usize,
        now_us: u64,
    ) -> Result<(), StoreError> {
        let fits = || self.live.load(Ordering::Relaxed) + count <= self.max_counters;
        if count == 0 || fits() {
            return Ok(());
        }
        for shard in held.iter_mut() {
            self.retain_live(shard, now_us);
        }
        // A shard the call holds answers WouldBlock and is skipped: it was swept above.
        self.sweep_free_shards(now_us, fits);
        if fits() {
            return Ok(());
        }
        Err(self.full())
    }

    /// Drops the expired counters of every shard free at this moment until `enough` holds
    /// (try_lock never waits, so no lock order is at stake; a busy shard waits for the sweep).
    fn sweep_free_shards(&self, now_us: u64, enough: impl Fn() -> bool) {
        for other in self.shards.iter() {
            if enough() {
                return;
            }
            let mut guard = match other.try_lock() {
                Ok(guard) => guard,
                Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => continue,
            };
            self.retain_live(&mut guard, now_us);
        }
    }

    pub(super) fn full(&self) -> StoreError {
        StoreError::Unavailable(format!(
            "the memory store is full ({} live counters, or as many concurrency slots held, \
             --memory-max-counters); a new descriptor or slot cannot be counted until some \
             expire",
            self.max_counters
        ))
    }

    /// Whether `key` has, or can get, a counter in `shard`: expired counters are dropped to make
    /// room; a full shard of live ones refuses.
    pub(super) fn make_room(
        &self,
        shard: &mut HashMap<String, Entry>,
        key: &str,
        now_us: u64,
    ) -> Result<(), StoreError> {
        let has_room = || self.live.load(Ordering::Relaxed) < self.max_counters;
        if has_room() || shard.contains_key(key) {
            return Ok(());
        }
        // Expired counters go: this shard's, then those of every shard free at this moment
        // (try_lock never waits, so no lock order is at stake; a busy shard waits for the sweep).
        self.retain_live(shard, now_us);
        self.sweep_free_shards(now_us, has_room);
        if has_room() {
            return Ok(());
        }
        Err(self.full())
    }

    /// Drops the expired counters of one locked shard; how many went.
    pub(super) fn retain_live(&self, shard: &mut HashMap<String, Entry>, now_us: u64) -> usize {
        let before = shard.len();
        let mut leases = 0;
        shard.retain(|_, entry| {
            let keep = entry.expires_at_us > now_us;
            if !keep {
                leases += leases_of(&entry.state);
            }
            keep
        });
        let removed = before - shard.len();
        self.live.fetch_sub(removed, Ordering::Relaxed);
        self.leases.fetch_sub(leases, Ordering::Relaxed);
        removed
    }
}

/// The concurrency slots a state holds.
pub(super) fn leases_of(state: &State) -> usize {
    match state {
        State::Leases(l) => l.ends_us.len(),
        _ => 0,
    }
}
