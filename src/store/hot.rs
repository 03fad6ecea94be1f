//! Hot counters decided in this replica (`--hot-descriptor-rate`): a store over another store
//! (Redis) that, for a counter this replica calls at least that many hits a second, takes a
//! claim in the counter itself (hits charged ahead, `hot_claim`) and answers the calls on it
//! from memory until the claim is spent or its period ends; every other call goes to the store
//! below as it came. What a claim does not spend is given back when the counter goes quiet and
//! at shutdown; a replica that dies holds its claim until the period ends.
//! It must never answer a call from memory that the claims do not cover, nor hold a claim on a
//! counter RLQS gateways hold part of (their shares need this replica's RLS calls as demand).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::hot_claim::{Chunk, Claim, claimable};
use super::quota::RlsTally;
use super::{Answers, FactorsFuture, PingFuture, Store, StoreFuture};
use crate::algorithm::{ChargeMode, Check, Decision};
use crate::clock::Clock;
use crate::telemetry::{HotMetrics, LogThrottle};

/// The most counters whose rate is followed at once (a claim is one of them); past it a new
/// counter goes to the store until idle ones are forgotten (every `SWEEP`).
pub const MAX_TRACKED: usize = 10_000;
/// A counter not followed yet starts to be at one of this many calls on counters not followed.
const SAMPLE: usize = 8;

/// What a replica decides from claims, and how it takes them.
#[derive(Debug, Clone, Copy)]
pub struct HotConfig {
    /// Hits a second on one counter, on this replica, from which it is claimed.
    pub rate: f64,
    /// Deadline of a take or a give-back.
    pub store_timeout: Duration,
}

/// A store that decides the calls on hot counters from this replica's claims on them.
#[derive(Clone)]
pub struct HotStore {
    shared: Arc<Shared>,
}

struct Shared {
    inner: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    config: HotConfig,
    claims: Mutex<HashMap<String, Claim>>,
    /// Counters RLQS gateways hold part of are left to the store.
    tally: Option<Arc<RlsTally>>,
    metrics: Arc<HotMetrics>,
    takes_in_flight: AtomicUsize,
    /// Calls on counters not followed, for `SAMPLE`.
    unseen: AtomicUsize,
    settled: tokio::sync::Notify,
    /// Told whenever a take is answered (calls wait on it for their claim).
    taken: tokio::sync::Notify,
    take_log: LogThrottle,
    /// Stopping: no claim is taken or spent any more; every call goes to the store, and a take
    /// answered after the final give-back gives itself back at once.
    closed: AtomicBool,
}

/// What `decide_here` found: the answers when claims cover the call, the claims to take, and
/// those to give back (about to end).
struct Decided {
    decisions: Option<Vec<Decision>>,
    takes: Vec<Check>,
    back: Vec<(Check, Chunk)>,
    /// A claim the call needs is being taken: worth waiting for.
    wait: bool,
    /// Some counter of the call is followed (the store's answer is worth noting).
    tracked: bool,
}

fn refund_of(key: &str, claim: &Claim, hits: u64) -> Check {
    Check {
        key: key.to_owned(),
        limit: claim.limit,
        hits,
        refund: true,
        post_paid: false,
    }
}

/// Whether a check can be answered from a claim: a charge of hits on a window or a bucket.
fn eligible(check: &Check) -> bool {
    !check.refund
        && !check.post_paid
        && check.hits > 0
        && check.hits <= check.limit.capacity()
        && claimable(&check.limit)
}

impl HotStore {
    pub fn new(
        inner: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        config: HotConfig,
        tally: Option<Arc<RlsTally>>,
        metrics: Arc<HotMetrics>,
    ) -> HotStore {
        HotStore {
            shared: Arc::new(Shared {
                inner,
                clock,
                config,
                claims: Mutex::new(HashMap::new()),
                tally,
                metrics,
                takes_in_flight: AtomicUsize::new(0),
                unseen: AtomicUsize::new(0),
                settled: tokio::sync::Notify::new(),
                taken: tokio::sync::Notify::new(),
                take_log: LogThrottle::default(),
                closed: AtomicBool::new(false),
            }),
        }
    }

    /// Waits until no take is in flight.
    pub async fn settle(&self) {
        loop {
            let settled = self.shared.settled.notified();
            if self.shared.takes_in_flight.load(Ordering::Acquire) == 0 {
                return;
            }
            settled.await;
        }
    }

    /// Hits this replica holds claimed and unspent on `key`.
    pub fn claimed(&self, key: &str) -> u64 {
        let now = self.shared.clock.now_us();
        let mut claims = self.shared.lock();
        claims.get_mut(key).map_or(0, |c| {
            c.expire(now);
            c.available()
        })
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Claim>> {
        self.claims.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn held_by_gateways(&self, key: &str) -> bool {
        self.tally.as_ref().is_some_and(|t| t.is_held(key))
    }

    /// Answers the call from claims when they cover every check; notes its hits either way and
    /// says which counters want a claim taken now.
    fn decide_here(&self, checks: &[Check], now: u64, count: bool) -> Decided {
        let mut claims = self.lock();
        let mut found = Decided {
            decisions: None,
            takes: Vec::new(),
            back: Vec::new(),
            wait: false,
            tracked: false,
        };
        if self.closed.load(Ordering::Acquire) {
            return found;
        }
        let mut lapsed = 0;
        let mut awaited = false;
        let mut covered = true;
        for check in checks {
            if !claims.contains_key(&check.key) {
                // A counter is followed from one of its calls in `SAMPLE` (a hot one is within
                // a few calls): most calls on cold counters insert nothing.
                let sampled = self
                    .unseen
                    .fetch_add(1, Ordering::Relaxed)
                    .is_multiple_of(SAMPLE);
                if !count || !sampled || claims.len() >= MAX_TRACKED {
                    covered = false;
                    continue;
                }
                claims.insert(check.key.clone(), Claim::new(check.limit, now));
            }
            found.tracked = true;
            let claim = claims.get_mut(&check.key).expect("inserted above");
            if claim.limit != check.limit {
                // The rule changed: what was claimed under the old limit is not spent.
                lapsed += claim.take_unspent().iter().map(|c| c.hits).sum::<u64>();
                *claim = Claim::new(check.limit, now);
            }
            lapsed += claim.expire(now);
            for chunk in claim.ending(now) {
                found
                    .back
                    .push((refund_of(&check.key, claim, chunk.hits), chunk));
            }
            if count {
                claim.note_hits(now, check.hits);
            }
            // The same counter twice in one call counts twice.
            let wanted: u64 = if checks.len() == 1 {
                check.hits
            } else {
                checks
                    .iter()
                    .filter(|c| c.key == check.key)
                    .map(|c| c.hits)
                    .sum()
            };
            covered &= claim.available() >= wanted;
            awaited |= claim.taking;
            if let Some(hits) = claim.wanted(now, self.config.rate)
                && !self.held_by_gateways(&check.key)
            {
                claim.taking = true;
                found.takes.push(Check {
                    hits,
                    ..check.clone()
                });
            }
        }
        if lapsed > 0 {
            self.metrics.lapsed_hits.inc_by(lapsed);
        }
        if covered {
            let decisions = checks
                .iter()
                .map(|check| {
                    let claim = claims.get_mut(&check.key).expect("covered above");
                    claim.spend(check.hits);
                    claim.answer(now)
                })
                .collect();
            found.decisions = Some(decisions);
        } else {
            // A claim on its way: the call waits for it rather than costing a store call of
            // its own (the first calls of every sliding sub-window would).
            found.wait = awaited || !found.takes.is_empty();
        }
        found
    }

    /// Notes what the store answered on the counters this replica follows.
    fn learn(&self, checks: &[Check], answers: &Answers, sent: u64) {
        let mut claims = self.lock();
        for (check, answer) in checks.iter().zip(answers) {
            if let (Some(claim), Ok(decision)) = (claims.get_mut(&check.key), answer)
                && claim.limit == check.limit
            {
                claim.learn(sent, decision);
            }
        }
    }

    /// Charges `take` in the store below, as a claim of this replica.
    async fn take(self: Arc<Self>, take: Check) {
        // Read before the call is sent: the period's end counted from here is never late.
        let sent = self.clock.now_us();
        let deadline = Instant::now() + self.config.store_timeout;
        let answer = self
            .inner
            .check(std::slice::from_ref(&take), deadline, ChargeMode::EachAlone)
            .await
            .into_iter()
            .next();
        let now = self.clock.now_us();
        let mut back = Vec::new();
        {
            let mut claims = self.lock();
            let claim = claims.get_mut(&take.key).filter(|c| c.limit == take.limit);
            match (claim, answer) {
                (Some(claim), Some(Ok(decision))) => {
                    if claim.took(sent, take.hits, &decision, now) {
                        self.metrics.claims_taken.inc();
                        self.metrics.claimed_hits.inc_by(take.hits);
                        // Answered after the final give-back (the replica is stopping): nobody
                        // will spend it.
                        if self.closed.load(Ordering::Acquire) {
                            back = claim
                                .take_unspent()
                                .into_iter()
                                .map(|chunk| (refund_of(&take.key, claim, chunk.hits), chunk))
                                .collect();
                        }
                    } else {
                        self.metrics.claims_refused.inc();
                    }
                }
                // Taken for a counter no longer followed (its rule changed meanwhile): the hits
                // stay counted, unspent.
                (None, Some(Ok(decision))) if decision.allowed => {
                    self.metrics.lapsed_hits.inc_by(take.hits);
                }
                (None, _) => {}
                (Some(claim), failed) => {
                    claim.take_failed(now);
                    self.metrics.claims_failed.inc();
                    let error = match failed {
                        Some(Err(e)) => e.to_string(),
                        _ => "the store answered nothing".to_owned(),
                    };
                    if let Some(skipped) = self.take_log.allow() {
                        tracing::warn!(
                            %error,
                            similar_failures_not_logged = skipped,
                            "a claim on a hot counter could not be taken: its calls go to the store"
                        );
                    }
                }
            }
        }
        for (refund, chunk) in back {
            self.give_back(refund, chunk).await;
        }
        self.taken.notify_waiters();
        self.done();
    }

    fn spawn_takes(self: &Arc<Self>, takes: Vec<Check>, back: Vec<(Check, Chunk)>) {
        for take in takes {
            self.takes_in_flight.fetch_add(1, Ordering::AcqRel);
            tokio::spawn(self.clone().take(take));
        }
        for (refund, chunk) in back {
            self.takes_in_flight.fetch_add(1, Ordering::AcqRel);
            let shared = self.clone();
            tokio::spawn(async move {
                shared.give_back(refund, chunk).await;
                shared.done();
            });
        }
    }

    /// Waits for the claims being taken (at most half the time left to `deadline`), then
    /// answers from them if they cover the call.
    async fn after_the_take(
        self: &Arc<Self>,
        checks: &[Check],
        deadline: Instant,
    ) -> Option<Vec<Decision>> {
        let taken = self.taken.notified();
        tokio::pin!(taken);
        // Registered before looking again: a take answered in between still wakes it.
        taken.as_mut().enable();
        let now = self.clock.now_us();
        let again = self.decide_here(checks, now, false);
        self.spawn_takes(again.takes, again.back);
        if again.decisions.is_some() || !again.wait {
            return again.decisions;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        tokio::time::timeout(left / 2, taken).await.ok()?;
        let last = self.decide_here(checks, self.clock.now_us(), false);
        self.spawn_takes(last.takes, last.back);
        last.decisions
    }

    fn done(&self) {
        if self.takes_in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.settled.notify_waiters();
        }
    }
}

impl Store for HotStore {
    fn check<'a>(
        &'a self,
        checks: &'a [Check],
        deadline: Instant,
        mode: ChargeMode,
    ) -> StoreFuture<'a> {
        let shared = &self.shared;
        if mode == ChargeMode::Probe
            || checks.is_empty()
            || !checks.iter().all(eligible)
            || shared.closed.load(Ordering::Acquire)
        {
            return shared.inner.check(checks, deadline, mode);
        }
        let now = shared.clock.now_us();
        let Decided {
            decisions,
            takes,
            back,
            wait,
            tracked,
        } = shared.decide_here(checks, now, true);
        shared.spawn_takes(takes, back);
        if let Some(decisions) = decisions {
            shared.metrics.decisions.inc_by(decisions.len() as u64);
            return Box::pin(std::future::ready(decisions.into_iter().map(Ok).collect()));
        }
        Box::pin(async move {
            if wait && let Some(decisions) = shared.after_the_take(checks, deadline).await {
                shared.metrics.decisions.inc_by(decisions.len() as u64);
                return decisions.into_iter().map(Ok).collect();
            }
            let sent = shared.clock.now_us();
            let answers = shared.inner.check(checks, deadline, mode).await;
            if tracked {
                shared.learn(checks, &answers, sent);
            }
            answers
        })
    }

    fn give_back<'a>(&'a self, refunds: &'a [Check], window_ends: Instant) -> StoreFuture<'a> {
        self.shared.inner.give_back(refunds, window_ends)
    }

    fn name(&self) -> &'static str {
        self.shared.inner.name()
    }

    fn ping(&self, deadline: Instant) -> PingFuture<'_> {
        self.shared.inner.ping(deadline)
    }

    fn load_factors(&self, deadline: Instant) -> FactorsFuture<'_> {
        self.shared.inner.load_factors(deadline)
    }

    fn save_factor<'a>(
        &'a self,
        field: &'a str,
        factor: f64,
        ttl_ms: u64,
        deadline: Instant,
    ) -> PingFuture<'a> {
        self.shared
            .inner
            .save_factor(field, factor, ttl_ms, deadline)
    }
}

#[path = "hot_give_back.rs"]
mod give_back;

#[cfg(test)]
#[path = "hot_tests.rs"]
mod tests;
