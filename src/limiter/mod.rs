//! The rate-limit math and the types every layer speaks: `Limit` (what a rule says, in numbers),
//! `Check` (one descriptor ready to count) and `Decision` (what a store answers).
//!
//! The algorithms are pure functions over (state, now, hits): no I/O, no clock of their own. The
//! memory store runs them directly; the Redis scripts run the same state transition in Lua and hand
//! the state back, so the numbers reported to Envoy are computed by the same Rust code for both.

pub mod deny_cache;
pub mod fixed_window;
pub mod key;
pub mod sliding_window;
pub mod token_bucket;

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::store::{Store, StoreError};
use crate::telemetry::{KindLabels, Metrics, ModeLabels};
use deny_cache::DenyCache;

/// Microseconds per second, the unit every window is expressed in internally.
pub const US_PER_SECOND: u64 = 1_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Algorithm {
    #[default]
    SlidingWindow,
    TokenBucket,
    FixedWindow,
}

impl Algorithm {
    /// Short tag used in storage keys and listings; changing one orphans stored counters.
    pub fn tag(self) -> &'static str {
        match self {
            Algorithm::SlidingWindow => "sw",
            Algorithm::TokenBucket => "tb",
            Algorithm::FixedWindow => "fw",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::FixedWindow => "fixed_window",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A limit in numbers: `requests` per `window_us`, with `burst` as the token bucket's capacity
/// (equal to `requests` for the other algorithms).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limit {
    pub algorithm: Algorithm,
    pub requests: u64,
    pub window_us: u64,
    pub burst: u64,
}

impl Limit {
    /// The most hits this limit could ever admit at once; a request costing more never passes.
    pub fn capacity(&self) -> u64 {
        match self.algorithm {
            Algorithm::TokenBucket => self.burst,
            _ => self.requests,
        }
    }
}

/// One descriptor, resolved to a limit, ready to count. `key` identifies the counter and is the
/// same string in every store (the Redis store adds its prefix).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub key: String,
    pub limit: Limit,
    pub hits: u64,
}

/// What a store answers for one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    /// The limit's capacity, as reported to the client.
    pub limit: u64,
    /// What could still be spent now, after this request.
    pub remaining: u64,
    /// When the counter is back to full (nothing spent).
    pub reset_after: Duration,
    /// Denied only: when this same request would pass; `None` when waiting never helps
    /// (the request costs more than the limit's capacity) or when it was allowed.
    pub retry_after: Option<Duration>,
}

/// Decision for a limit of zero requests: nothing but a check-only call passes, and no state is
/// kept (there is nothing to count).
pub fn zero_limit_decision(hits: u64) -> Decision {
    Decision {
        allowed: hits == 0,
        limit: 0,
        remaining: 0,
        reset_after: Duration::ZERO,
        retry_after: None,
    }
}

/// The state one counter keeps, whichever store holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    Sliding(sliding_window::SlidingState),
    Bucket(token_bucket::BucketState),
    Fixed(fixed_window::FixedState),
}

impl State {
    pub fn empty(algorithm: Algorithm) -> State {
        match algorithm {
            Algorithm::SlidingWindow => State::Sliding(Default::default()),
            Algorithm::TokenBucket => State::Bucket(Default::default()),
            Algorithm::FixedWindow => State::Fixed(Default::default()),
        }
    }
}

/// The result of running one check against a state: the decision, and how long the state must
/// be kept (0 = the state is back to empty and can be dropped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub decision: Decision,
    pub keep_for_us: u64,
}

/// Runs one check against `state` (replacing it with an empty state when its algorithm differs),
/// updating it when the hits are admitted.
pub fn apply(state: &mut State, now_us: u64, limit: &Limit, hits: u64) -> Outcome {
    if limit.requests == 0 {
        *state = State::empty(limit.algorithm);
        return Outcome {
            decision: zero_limit_decision(hits),
            keep_for_us: 0,
        };
    }
    match (limit.algorithm, &mut *state) {
        (Algorithm::SlidingWindow, State::Sliding(s)) => {
            sliding_window::check(s, now_us, limit, hits)
        }
        (Algorithm::TokenBucket, State::Bucket(s)) => token_bucket::check(s, now_us, limit, hits),
        (Algorithm::FixedWindow, State::Fixed(s)) => fixed_window::check(s, now_us, limit, hits),
        (algorithm, _) => {
            *state = State::empty(algorithm);
            apply(state, now_us, limit, hits)
        }
    }
}

pub(crate) fn us(duration_us: u64) -> Duration {
    Duration::from_micros(duration_us)
}

/// What to answer when the store errs or misses its deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum FailureMode {
    /// Allow the request (fail open, like Envoy's default and Stripe's limiter).
    #[default]
    Allow,
    /// Refuse the request (fail closed).
    Deny,
    /// Count in this process's memory until the store answers again.
    Local,
}

/// Turns resolved checks into decisions through a store, within a deadline, answering by the
/// failure mode when the store cannot. Policy that is not storage lives here.
pub struct Limiter {
    store: Box<dyn Store>,
    deadline: Duration,
    failure_mode: FailureMode,
    fallback: Option<Box<dyn Store>>,
    metrics: Arc<Metrics>,
    /// Failures since the last log line, and when it was written: an outage at thousands of
    /// calls per second logs once a second, not once a call (the metrics count every one).
    unlogged_failures: AtomicU64,
    last_failure_log: Mutex<Option<Instant>>,
    deny_cache: Option<DenyCache>,
}

impl Limiter {
    /// A limiter whose store is trusted to answer (the memory store).
    pub fn new(store: Box<dyn Store>, metrics: Arc<Metrics>) -> Self {
        Self::with_deadline(
            store,
            Duration::from_secs(3600),
            FailureMode::Allow,
            None,
            metrics,
        )
    }

    /// `fallback` serves `FailureMode::Local`.
    pub fn with_deadline(
        store: Box<dyn Store>,
        deadline: Duration,
        failure_mode: FailureMode,
        fallback: Option<Box<dyn Store>>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            store,
            deadline,
            failure_mode,
            fallback,
            metrics,
            unlogged_failures: AtomicU64::new(0),
            last_failure_log: Mutex::new(None),
            deny_cache: None,
        }
    }

    /// Refuses checks the store has refused until their retry time, without asking it again.
    pub fn with_deny_cache(mut self) -> Self {
        self.deny_cache = Some(DenyCache::default());
        self
    }

    fn log_failure(&self, error: &StoreError) {
        let skipped = self.unlogged_failures.fetch_add(1, Ordering::Relaxed);
        let Ok(mut last) = self.last_failure_log.try_lock() else {
            return;
        };
        if last.is_some_and(|at| at.elapsed() < Duration::from_secs(1)) {
            return;
        }
        *last = Some(Instant::now());
        self.unlogged_failures.store(0, Ordering::Relaxed);
        tracing::warn!(
            error = %error,
            mode = ?self.failure_mode,
            store = self.store.name(),
            similar_failures_not_logged = skipped,
            "store failed: answering by the failure mode"
        );
    }

    pub async fn check(&self, checks: &[Check]) -> Result<Vec<Decision>, StoreError> {
        let Some(cache) = &self.deny_cache else {
            return self
                .check_store(checks)
                .await
                .map(|(decisions, _)| decisions);
        };
        let now = Instant::now();
        let cached: Vec<Option<Decision>> = checks.iter().map(|c| cache.lookup(c, now)).collect();
        let hits = cached.iter().filter(|c| c.is_some()).count();
        // The usual case, nothing cached: the checks go to the store as they are, uncopied.
        let (stored, from_store) = if hits == 0 {
            self.check_store(checks).await?
        } else {
            self.metrics.deny_cache_hits.inc_by(hits as u64);
            let to_store: Vec<Check> = checks
                .iter()
                .zip(&cached)
                .filter(|(_, c)| c.is_none())
                .map(|(check, _)| check.clone())
                .collect();
            self.check_store(&to_store).await?
        };
        let mut stored = stored.into_iter();
        let now = Instant::now();
        let mut decisions = Vec::with_capacity(checks.len());
        for (check, cached) in checks.iter().zip(cached) {
            let decision = match cached {
                Some(decision) => decision,
                None => {
                    let decision = stored.next().ok_or_else(|| {
                        StoreError::Protocol("store answered too few decisions".into())
                    })?;
                    // Only the store's own refusals: a failure-mode answer says nothing of the budget.
                    if from_store {
                        cache.remember(check, &decision, now);
                    }
                    decision
                }
            };
            decisions.push(decision);
        }
        Ok(decisions)
    }

    /// The store's decisions (`true`), or the failure mode's (`false`).
    async fn check_store(&self, checks: &[Check]) -> Result<(Vec<Decision>, bool), StoreError> {
        if checks.is_empty() {
            return Ok((Vec::new(), true));
        }
        let started = Instant::now();
        let answer = tokio::time::timeout(self.deadline, self.store.check(checks)).await;
        self.metrics
            .store_seconds
            .observe(started.elapsed().as_secs_f64());
        let (error, kind) = match answer {
            Ok(Ok(decisions)) => return Ok((decisions, true)),
            Ok(Err(e)) => {
                let kind = if e.is_transient() {
                    "unavailable"
                } else {
                    "protocol"
                };
                (e, kind)
            }
            Err(_) => (
                StoreError::Unavailable(format!("no answer within {:?}", self.deadline)),
                "timeout",
            ),
        };
        self.metrics
            .store_errors
            .get_or_create(&KindLabels { kind: kind.into() })
            .inc();
        self.log_failure(&error);
        self.metrics
            .failure_mode_answers
            .get_or_create(&ModeLabels {
                mode: format!("{:?}", self.failure_mode).to_lowercase(),
            })
            .inc();
        let decisions = match (self.failure_mode, &self.fallback) {
            (FailureMode::Allow, _) => checks.iter().map(|c| failed_open(&c.limit)).collect(),
            (FailureMode::Deny, _) => checks.iter().map(|c| failed_closed(&c.limit)).collect(),
            (FailureMode::Local, Some(fallback)) => fallback.check(checks).await?,
            (FailureMode::Local, None) => return Err(error),
        };
        Ok((decisions, false))
    }

    pub fn store_name(&self) -> &'static str {
        self.store.name()
    }

    /// Whether the store answers a ping within the deadline (for `/readyz`).
    pub async fn store_ready(&self) -> Result<(), StoreError> {
        match tokio::time::timeout(self.deadline, self.store.ping()).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Unavailable(format!(
                "no answer within {:?}",
                self.deadline
            ))),
        }
    }
}

/// Allowed without counting: nothing is known about the real counter.
fn failed_open(limit: &Limit) -> Decision {
    Decision {
        allowed: true,
        limit: limit.capacity(),
        remaining: limit.capacity(),
        reset_after: Duration::ZERO,
        retry_after: None,
    }
}

/// Refused without counting; the client is told to come back after one window.
fn failed_closed(limit: &Limit) -> Decision {
    Decision {
        allowed: false,
        limit: limit.capacity(),
        remaining: 0,
        reset_after: us(limit.window_us),
        retry_after: Some(us(limit.window_us)),
    }
}

#[cfg(test)]
mod model_tests;
