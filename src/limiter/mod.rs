//! The policy over a store: every call to the store has a deadline; when the store errs or misses
//! it, the failure mode answers (allow, deny, or count locally), the failure is counted and logged
//! (at most once a second); refusals the store made are remembered until their retry time (the deny
//! cache). It sits above `store` and below the service.
//!
//! It must never cache a failure-mode answer (that says nothing about the budget) nor hide a
//! failure: every one is counted in the metrics.

pub mod deny_cache;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::algorithm::{Check, Decision, Limit};
use crate::store::{Store, StoreError};
use crate::telemetry::{KindLabels, LogThrottle, Metrics, ModeLabels};
use deny_cache::DenyCache;
pub use deny_cache::DenyCacheBounds;

/// What to answer when the store errs or misses its deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailureMode {
    /// Allow the request (fail open, like Envoy's default and Stripe's limiter).
    #[default]
    Allow,
    /// Refuse the request (fail closed).
    Deny,
    /// Count in this process's memory until the store answers again.
    Local,
}

/// How the limiter treats its store.
#[derive(Debug, Clone, Copy)]
pub struct LimiterConfig {
    /// Longest wait for one store call; past it the failure mode answers.
    pub deadline: Duration,
    pub failure_mode: FailureMode,
    /// Refuse checks the store refused until their retry time, without asking it again, keeping
    /// at most this much (`None`: no deny cache).
    pub deny_cache: Option<DenyCacheBounds>,
}

/// Turns resolved checks into decisions through a store, within a deadline, answering by the
/// failure mode when the store cannot. Policy that is not storage lives here.
pub struct Limiter {
    store: Box<dyn Store>,
    deadline: Duration,
    failure_mode: FailureMode,
    fallback: Option<Box<dyn Store>>,
    metrics: Arc<Metrics>,
    /// An outage at thousands of calls per second logs once a second, not once a call.
    failure_log: LogThrottle,
    deny_cache: Option<DenyCache>,
}

impl Limiter {
    /// A limiter whose store is trusted to answer (the memory store): no practical deadline, no
    /// deny cache (the store itself answers as fast).
    pub fn new(store: Box<dyn Store>, metrics: Arc<Metrics>) -> Self {
        let config = LimiterConfig {
            deadline: Duration::from_secs(3600),
            failure_mode: FailureMode::Allow,
            deny_cache: None,
        };
        Self::with_policy(store, config, None, metrics)
    }

    /// A limiter over a store that can fail; `fallback` serves `FailureMode::Local`.
    pub fn with_policy(
        store: Box<dyn Store>,
        config: LimiterConfig,
        fallback: Option<Box<dyn Store>>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            store,
            deadline: config.deadline,
            failure_mode: config.failure_mode,
            fallback,
            metrics,
            failure_log: LogThrottle::default(),
            deny_cache: config.deny_cache.map(DenyCache::new),
        }
    }

    fn log_failure(&self, error: &StoreError) {
        let Some(skipped) = self.failure_log.allow() else {
            return;
        };
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
                        let evicted = cache.remember(check, &decision, now);
                        if evicted > 0 {
                            self.metrics.deny_cache_evictions.inc_by(evicted as u64);
                        }
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

/// The longest wait a failure-mode refusal announces. Nothing is known about the counter, only
/// that the store failed; a client told "come back in a month" (the rule's window) would stay
/// away long after the store is back.
pub const FAILED_CLOSED_RETRY: Duration = Duration::from_secs(1);

/// Refused without counting; the client is told to come back after a short, honest wait.
fn failed_closed(limit: &Limit) -> Decision {
    let wait = Duration::from_micros(limit.window_us).min(FAILED_CLOSED_RETRY);
    Decision {
        allowed: false,
        limit: limit.capacity(),
        remaining: 0,
        reset_after: wait,
        retry_after: Some(wait),
    }
}
