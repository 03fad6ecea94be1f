//! The embedded store: counters in process memory. It is the default for a single replica and the
//! reference model the Redis scripts are tested against, so it runs the algorithms exactly as they
//! are written in `algorithm`, nothing more.
//!
//! Sharded so that concurrent calls for different descriptors rarely meet on one lock; no lock is
//! held across an await. Keys expire when their state is back to empty, and a sweeper removes
//! expired keys a shard at a time, so memory follows the live descriptors, not every one ever seen.
//! The number of counters is capped: when full, a check that needs a new counter fails (the
//! failure mode answers it, counted and logged) rather than evicting a live one, which would hand
//! its budget back.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::time::Instant;

use super::{Answers, FactorsFuture, PingFuture, SharedFactors, Store, StoreError, StoreFuture};
use crate::algorithm::{self, ChargeMode, Check, Decision, State};
use crate::clock::Clock;
use crate::store::quota::{Claimed, MemoryClaims};

const SHARDS: usize = 64;

struct Entry {
    state: State,
    /// Clock reading after which the state is empty again and the entry may go.
    expires_at_us: u64,
}

type Shard = Mutex<HashMap<String, Entry>>;

/// The default cap on counters: about 100 MB at most.
pub const DEFAULT_MAX_COUNTERS: usize = 250_000;

pub struct MemoryStore {
    shards: Box<[Shard]>,
    hasher: RandomState,
    clock: Arc<dyn Clock>,
    /// Counters held in all shards (kept with every insert and removal, under the shard's lock):
    /// the cap is the store's, not a shard's, so one busy shard is never "full" long before the
    /// store is.
    live: AtomicUsize,
    max_counters: usize,
    /// Concurrency slots held in all counters (the same bookkeeping as `live`), at most
    /// `max_counters`: a concurrency counter may hold 1000, 8 bytes each.
    leases: AtomicUsize,
    /// Temporary scaling factors: field -> (factor, expiry in ms of this store's clock).
    factors: Mutex<HashMap<String, (f64, u64)>>,
    /// The RLQS grants its RLS checks count (this replica's own): read with the counters'
    /// shards held, as a grant reads its rooms (`memory_look.rs`).
    claims: std::sync::OnceLock<MemoryClaims>,
}

impl MemoryStore {
    pub fn new(clock: Arc<dyn Clock>) -> Arc<Self> {
        Self::with_max_counters(clock, DEFAULT_MAX_COUNTERS)
    }

    /// A store holding at most `max_counters` counters.
    pub fn with_max_counters(clock: Arc<dyn Clock>, max_counters: usize) -> Arc<Self> {
        Arc::new(Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: RandomState::new(),
            clock,
            live: AtomicUsize::new(0),
            max_counters: max_counters.max(1),
            leases: AtomicUsize::new(0),
            factors: Mutex::new(HashMap::new()),
            claims: std::sync::OnceLock::new(),
        })
    }

    /// Its RLS checks count what gateways claim in `claims` from now on (set once).
    pub fn count_claims(&self, claims: MemoryClaims) {
        let _ = self.claims.set(claims);
    }

    fn shard_index(&self, key: &str) -> usize {
        (self.hasher.hash_one(key) as usize) % self.shards.len()
    }

    fn lock(&self, index: usize) -> MutexGuard<'_, HashMap<String, Entry>> {
        // A poisoned shard only means another call panicked mid-update; the map is still sound.
        self.shards[index]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// When `key`'s counter expires (µs on the store's clock), if it is held: what a model test
    /// compares a Redis key's expiry with (every key's TTL is its counter's).
    pub fn expires_at_us(&self, key: &str) -> Option<u64> {
        let shard = self.lock(self.shard_index(key));
        shard.get(key).map(|e| e.expires_at_us)
    }

    /// Runs one check at `now_us`, charged (or refunded). Public so that model tests can drive
    /// exact clock readings.
    pub fn check_at(&self, check: &Check, now_us: u64) -> Result<Decision, StoreError> {
        let mut shard = self.lock(self.shard_index(&check.key));
        self.run_in(&mut shard, check, now_us, true, Claimed::default())
    }

    /// Runs a call's checks at `now_us` as `mode` says. All or nothing holds every shard the call
    /// touches, locked in index order (so two calls never wait on each other in a circle), while
    /// it looks and then charges: no other call sees a half-charged call.
    pub fn check_all_at(&self, checks: &[Check], now_us: u64, mode: ChargeMode) -> Answers {
        self.check_all_claimed(checks, None, now_us, mode)
    }

    /// `check_all_at` counting what RLQS grants claim of each check's counter (`claims`; none
    /// past its end), read while the counter's shard is held: a grant reads its rooms with the
    /// same shards held (`memory_look.rs`), so none lands between a check's claims and its count.
    fn check_all_claimed(
        &self,
        checks: &[Check],
        claims: Option<&MemoryClaims>,
        now_us: u64,
        mode: ChargeMode,
    ) -> Answers {
        let claimed_in = |checks: &[Check]| {
            claims
                .and_then(|c| c.claimed_by_checks(checks, now_us))
                .unwrap_or_default()
        };
        match mode {
            // Each check alone: charged (`EachAlone`) or only looked at (`Probe`).
            ChargeMode::EachAlone | ChargeMode::Probe => checks
                .iter()
                .map(|c| {
                    let mut shard = self.lock(self.shard_index(&c.key));
                    let commit = mode == ChargeMode::EachAlone;
                    let claimed = claimed_in(std::slice::from_ref(c)).first().copied();
                    self.run_in(&mut shard, c, now_us, commit, claimed.unwrap_or_default())
                })
                .collect(),
            ChargeMode::AllOrNothing => {
                let mut indices: Vec<usize> =
                    checks.iter().map(|c| self.shard_index(&c.key)).collect();
                indices.sort_unstable();
                indices.dedup();
                let mut guards: Vec<_> = indices.iter().map(|&i| self.lock(i)).collect();
                let claimed = claimed_in(checks);
                let claimed_of = |i: usize| claimed.get(i).copied().unwrap_or_default();
                let position = |check: &Check| {
                    indices
                        .binary_search(&self.shard_index(&check.key))
                        .unwrap_or(0)
                };
                // Look first, charging copies in order: two checks of the call on one key see
                // each other's hits, as they will when charged.
                let mut copies: HashMap<&str, State> = HashMap::new();
                let mut looked = Vec::with_capacity(checks.len());
                for (i, check) in checks.iter().enumerate() {
                    if check.refund {
                        looked.push(None);
                        continue;
                    }
                    let key = check.key.as_str();
                    let mut state = match copies.get(key) {
                        Some(state) => state.clone(),
                        None => self.state_at(&guards[position(check)], check, now_us),
                    };
                    let outcome = algorithm::run_claimed(
                        &mut state,
                        now_us,
                        check,
                        true,
                        claimed_of(i).claimed,
                    );
                    if (outcome.decision.allowed || check.post_paid) && check.hits > 0 {
                        copies.insert(key, state);
                    }
                    looked.push(Some(outcome.decision));
                }
                let all = looked.iter().flatten().all(|d| d.allowed);
                // Room for every new counter of the call at once, first: a call is charged whole
                // or not at all. Only a charge makes a counter (a refund or a check of no hits
                // needs no room).
                if all {
                    let mut new_keys: Vec<&str> = checks
                        .iter()
                        .filter(|c| !c.refund && c.hits > 0)
                        // An expired counter counts as new: making room may sweep it.
                        .filter(|c| {
                            guards[position(c)]
                                .get(c.key.as_str())
                                .is_none_or(|e| e.expires_at_us <= now_us)
                        })
                        .map(|c| c.key.as_str())
                        .collect();
                    new_keys.sort_unstable();
                    new_keys.dedup();
                    if let Err(e) = self.make_room_for(&mut guards, new_keys.len(), now_us) {
                        return vec![Err(e); checks.len()];
                    }
                }
                checks
                    .iter()
                    .zip(looked)
                    .enumerate()
                    .map(|(i, (check, looked))| {
                        // Post-paid hits were consumed whatever the call's answer.
                        let commit = all || check.refund || check.post_paid;
                        match looked {
                            // Refused as a whole: a charge the look refused answers so (the
                            // second of two checks on one key is refused there, not alone); the
                            // others answer as a probe would.
                            Some(decision) if !commit && !decision.allowed => Ok(decision),
                            _ => self.run_in(
                                &mut guards[position(check)],
                                check,
                                now_us,
                                commit,
                                claimed_of(i),
                            ),
                        }
                    })
                    .collect()
            }
        }
    }

    /// Runs one check on a locked shard: charges or refunds when `commit`, else only looks.
    fn run_in(
        &self,
        shard: &mut HashMap<String, Entry>,
        check: &Check,
        now_us: u64,
        commit: bool,
        claimed: Claimed,
    ) -> Result<Decision, StoreError> {
        let mut state = self.state_at(shard, check, now_us);
        let mut outcome =
            algorithm::run_claimed(&mut state, now_us, check, commit, claimed.claimed);
        if check.limit.algorithm == algorithm::Algorithm::TokenBucket {
            // Kept while grants claim part of it: a bucket read as full before its time would
            // hand the gateways' refill to RLS (`token_bucket::check_claimed`).
            let claimed_for = claimed.keep_until_us.saturating_sub(now_us);
            outcome.keep_for_us = outcome.keep_for_us.max(claimed_for);
        }
        // Only what spends or gives back changes the entry. A refusal or a call of no hits leaves
        // it exactly as it was (state and expiry), as the Redis scripts leave the key: dropping
        // or advancing it would forget spending that a clock stepping back makes count again.
        // Post-paid hits are recorded refused or not.
        let recorded = outcome.decision.allowed || check.post_paid;
        // A zero limit keeps its counter as it is, but for post-paid hits on a window.
        let kept = check.limit.requests == 0 && !algorithm::records_at_zero(check);
        let changes = commit && recorded && (check.refund || check.hits > 0) && !kept;
        if !changes {
            return Ok(outcome.decision);
        }
        let held_before = shard
            .get(check.key.as_str())
            .map_or(0, |e| leases_of(&e.state));
        let held_after = leases_of(&state);
        if held_after > held_before
            && self.leases.load(Ordering::Relaxed) + held_after - held_before > self.max_counters
        {
            return Err(self.full());
        }
        if outcome.keep_for_us == 0 {
            if shard.remove(check.key.as_str()).is_some() {
                self.live.fetch_sub(1, Ordering::Relaxed);
                self.leases.fetch_sub(held_before, Ordering::Relaxed);
            }
            return Ok(outcome.decision);
        }
        let expires_at_us = now_us.saturating_add(outcome.keep_for_us);
        if let Some(entry) = shard.get_mut(check.key.as_str()) {
            entry.state = state;
            entry.expires_at_us = expires_at_us;
            // Added before taken away: never below zero.
            self.leases.fetch_add(held_after, Ordering::Relaxed);
            self.leases.fetch_sub(held_before, Ordering::Relaxed);
        } else {
            self.make_room(shard, &check.key, now_us)?;
            self.live.fetch_add(1, Ordering::Relaxed);
            self.leases.fetch_add(held_after, Ordering::Relaxed);
            shard.insert(
                check.key.clone(),
                Entry {
                    state,
                    expires_at_us,
                },
            );
        }
        Ok(outcome.decision)
    }

    /// The state of a check's counter at `now_us` (empty when none, or expired).
    fn state_at(&self, shard: &HashMap<String, Entry>, check: &Check, now_us: u64) -> State {
        match shard.get(check.key.as_str()) {
            Some(entry) if entry.expires_at_us > now_us => entry.state.clone(),
            _ => State::empty(check.limit.algorithm),
        }
    }

    /// Removes every expired entry; returns how many were removed.
    pub fn sweep(&self) -> usize {
        let now_us = self.clock.now_us();
        let mut removed = 0;
        for shard in self.shards.iter() {
            let mut shard = shard
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            removed += self.retain_live(&mut shard, now_us);
        }
        removed
    }

    /// How full the store is: counters held over `--memory-max-counters` (for the gauge).
    pub fn fill_ratio(&self) -> f64 {
        self.live.load(Ordering::Relaxed) as f64 / self.max_counters as f64
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
    fn check<'a>(
        &'a self,
        checks: &'a [Check],
        _deadline: Instant,
        mode: ChargeMode,
    ) -> StoreFuture<'a> {
        let now_us = self.clock.now_us();
        Box::pin(std::future::ready(self.check_all_claimed(
            checks,
            self.claims.get(),
            now_us,
            mode,
        )))
    }

    fn name(&self) -> &'static str {
        "memory"
    }

    fn load_factors(&self, _deadline: Instant) -> FactorsFuture<'_> {
        let now_ms = self.clock.now_us() / 1000;
        let mut factors = self.factors.lock().unwrap_or_else(|p| p.into_inner());
        factors.retain(|_, (_, expires)| *expires > now_ms);
        let entries = factors
            .iter()
            .map(|(field, (factor, expires))| (field.clone(), *factor, *expires))
            .collect();
        Box::pin(std::future::ready(Ok(SharedFactors { now_ms, entries })))
    }

    fn save_factor<'a>(
        &'a self,
        field: &'a str,
        factor: f64,
        ttl_ms: u64,
        _deadline: Instant,
    ) -> PingFuture<'a> {
        let now_ms = self.clock.now_us() / 1000;
        let mut factors = self.factors.lock().unwrap_or_else(|p| p.into_inner());
        factors.retain(|_, (_, expires)| *expires > now_ms);
        if ttl_ms == 0 {
            factors.remove(field);
        } else if factors.len() < MAX_FACTORS || factors.contains_key(field) {
            factors.insert(field.to_owned(), (factor, now_ms.saturating_add(ttl_ms)));
        } else {
            return Box::pin(std::future::ready(Err(StoreError::Unavailable(format!(
                "{MAX_FACTORS} scaling factors are set already"
            )))));
        }
        Box::pin(std::future::ready(Ok(())))
    }
}

/// The most temporary scaling factors kept at once (set by an operator, but still bounded).
pub const MAX_FACTORS: usize = 1000;

#[path = "memory_look.rs"]
mod look;
#[path = "memory_room.rs"]
mod room;
use room::leases_of;

#[cfg(test)]
#[path = "memory_tests.rs"]
mod tests;
