//! The policy over a store: every call to the store has a deadline; when the store errs or misses
//! it, the failure mode answers (allow, deny, or count locally), the failure is counted and logged
//! (at most once a second); refusals the store made are remembered until their retry time (the deny
//! cache). It sits above `store` and below the service.
//!
//! It must never cache a failure-mode answer (that says nothing about the budget) nor hide a
//! failure: every one is counted in the metrics.

pub mod deny_cache;
mod failure;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::algorithm::{Algorithm, ChargeMode, Check, Decision};
use crate::store::quota::RlsTally;
use crate::store::{SharedFactors, Store, StoreError, all_failed};
use crate::telemetry::{KindLabels, LogThrottle, Metrics, ModeLabels};
use deny_cache::DenyCache;
pub use deny_cache::DenyCacheBounds;
pub use failure::{FAILED_CLOSED_RETRY, FailureMode};
use failure::{failed_closed, failed_open};

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
    /// Where refusals the deny cache answers on claimed descriptors count as RLS demand.
    tally: Option<Arc<RlsTally>>,
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
            tally: None,
        }
    }

    /// Tallies the refusals its deny cache answers on claimed descriptors as RLS demand (the
    /// store tallies the rest: `RlsTally`).
    pub fn with_tally(mut self, tally: Option<Arc<RlsTally>>) -> Self {
        self.tally = tally;
        self
    }

    fn log_failure(&self, error: &StoreError, failed: usize, checks: usize) {
        let Some(skipped) = self.failure_log.allow() else {
            return;
        };
        if error.is_permanent() {
            tracing::error!(
                %error,
                mode = ?self.failure_mode,
                store = self.store.name(),
                failed_checks = failed,
                checks,
                similar_failures_not_logged = skipped,
                "store refuses us: answering by the failure mode until the configuration is fixed"
            );
        } else {
            tracing::warn!(
                %error,
                mode = ?self.failure_mode,
                store = self.store.name(),
                failed_checks = failed,
                checks,
                similar_failures_not_logged = skipped,
                "store failed: answering by the failure mode"
            );
        }
    }

    /// One decision per check, in order: the store's, a cached refusal of the store's, or the
    /// failure mode's for each check the store could not decide in time (with
    /// `FailureMode::Error`, the store's error instead).
    pub async fn check(
        &self,
        checks: &[Check],
        mode: ChargeMode,
    ) -> Result<Vec<Decision>, StoreError> {
        let Some(cache) = &self.deny_cache else {
            return Ok(self
                .check_store(checks, mode)
                .await?
                .into_iter()
                .map(|(decision, _)| decision)
                .collect());
        };
        // A refund gives budget back: a refusal remembered for that counter is no longer true.
        for check in checks.iter().filter(|c| c.refund) {
            cache.forget(&check.key);
        }
        let now = Instant::now();
        // Refunds and post-paid charges must reach the counter whatever it answers.
        let cached: Vec<Option<Decision>> = checks
            .iter()
            .map(|c| {
                if c.is_consumption() {
                    None
                } else {
                    cache.lookup(c, now)
                }
            })
            .collect();
        let hits = cached.iter().filter(|c| c.is_some()).count();
        // A remembered refusal on a descriptor gateways hold part of is still RLS demand.
        if hits > 0
            && let Some(tally) = &self.tally
        {
            for (check, _) in checks.iter().zip(&cached).filter(|(_, c)| c.is_some()) {
                tally.note_remembered(&check.key, check.hits);
            }
        }
        // The usual case, nothing cached: the checks go to the store as they are, uncopied.
        let stored = if hits == 0 {
            self.check_store(checks, mode).await?
        } else {
            self.metrics.deny_cache_hits.inc_by(hits as u64);
            let to_store: Vec<Check> = checks
                .iter()
                .zip(&cached)
                .filter(|(_, c)| c.is_none())
                .map(|(check, _)| check.clone())
                .collect();
            if mode == ChargeMode::AllOrNothing {
                // A remembered refusal already makes the call refused: nothing is charged, but
                // refunds still apply.
                self.refunds_applied_charges_probed(&to_store).await?
            } else {
                self.check_store(&to_store, mode).await?
            }
        };
        let mut stored = stored.into_iter();
        let now = Instant::now();
        let mut decisions = Vec::with_capacity(checks.len());
        for (check, cached) in checks.iter().zip(cached) {
            let decision = match cached {
                Some(decision) => decision,
                None => {
                    let (decision, from_store) = stored.next().ok_or_else(|| {
                        StoreError::Protocol("store answered too few decisions".into())
                    })?;
                    // Only the store's own refusals of real charges: a failure-mode answer says
                    // nothing of the budget. Never a concurrency refusal: a release on any
                    // replica frees a slot at once, and its retry time is only a lease's end.
                    if from_store
                        && !check.refund
                        && mode != ChargeMode::Probe
                        && check.limit.algorithm != Algorithm::Concurrency
                    {
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

    /// Refunds and post-paid charges run, other charges only looked at: for an all-or-nothing
    /// call already refused.
    async fn refunds_applied_charges_probed(
        &self,
        checks: &[Check],
    ) -> Result<Vec<(Decision, bool)>, StoreError> {
        let applied = |c: &Check| c.refund || c.post_paid;
        let (refunds, charges): (Vec<Check>, Vec<Check>) =
            checks.iter().cloned().partition(applied);
        let mut refunded = self
            .check_store(&refunds, ChargeMode::EachAlone)
            .await?
            .into_iter();
        let mut probed = self
            .check_store(&charges, ChargeMode::Probe)
            .await?
            .into_iter();
        checks
            .iter()
            .map(|c| {
                let next = if applied(c) {
                    refunded.next()
                } else {
                    probed.next()
                };
                next.ok_or_else(|| StoreError::Protocol("store answered too few decisions".into()))
            })
            .collect()
    }

    /// Per check: the store's decision (`true`), or the failure mode's (`false`) where the store
    /// failed or missed the deadline for that check.
    async fn check_store(
        &self,
        checks: &[Check],
        mode: ChargeMode,
    ) -> Result<Vec<(Decision, bool)>, StoreError> {
        self.check_store_within(checks, mode, self.deadline).await
    }

    /// `check` with its own deadline instead of RLS' (an RLQS report's charges and looks, under
    /// `--rlqs-store-timeout`), and past the deny cache (its refusals are remembered for RLS
    /// calls; a report's charges are post-paid and its looks spend nothing).
    pub async fn check_within(
        &self,
        checks: &[Check],
        mode: ChargeMode,
        within: Duration,
    ) -> Result<Vec<Decision>, StoreError> {
        Ok(self
            .check_store_within(checks, mode, within)
            .await?
            .into_iter()
            .map(|(decision, _)| decision)
            .collect())
    }

    async fn check_store_within(
        &self,
        checks: &[Check],
        mode: ChargeMode,
        within: Duration,
    ) -> Result<Vec<(Decision, bool)>, StoreError> {
        if checks.is_empty() {
            return Ok(Vec::new());
        }
        let started = tokio::time::Instant::now();
        let deadline = started + within;
        // The store keeps the deadline itself (per check on Cluster); this is the backstop.
        let answers = match tokio::time::timeout_at(
            deadline + DEADLINE_BACKSTOP,
            self.store.check(checks, deadline, mode),
        )
        .await
        {
            Ok(answers) if answers.len() == checks.len() => answers,
            Ok(answers) => all_failed(
                checks.len(),
                StoreError::Protocol(format!(
                    "store answered {} decisions for {} checks",
                    answers.len(),
                    checks.len()
                )),
            ),
            Err(_) => all_failed(checks.len(), StoreError::Timeout(within)),
        };
        self.metrics
            .store_seconds
            .observe(started.elapsed().as_secs_f64());
        let mut out: Vec<Option<(Decision, bool)>> = Vec::with_capacity(checks.len());
        let mut failed: Vec<usize> = Vec::new();
        let mut first_error = None;
        for (i, answer) in answers.into_iter().enumerate() {
            match answer {
                Ok(decision) => out.push(Some((decision, true))),
                Err(error) => {
                    self.metrics
                        .store_errors
                        .get_or_create(&KindLabels {
                            kind: error.kind().into(),
                        })
                        .inc();
                    first_error.get_or_insert(error);
                    failed.push(i);
                    out.push(None);
                }
            }
        }
        if let Some(error) = first_error {
            self.log_failure(&error, failed.len(), checks.len());
            if self.failure_mode == FailureMode::Error {
                return Err(error);
            }
            self.metrics
                .failure_mode_answers
                .get_or_create(&ModeLabels {
                    mode: format!("{:?}", self.failure_mode).to_lowercase(),
                })
                .inc();
            let answered: Vec<Decision> = match (self.failure_mode, &self.fallback) {
                (FailureMode::Deny, _) => failed
                    .iter()
                    .map(|&i| failed_closed(&checks[i].limit))
                    .collect(),
                (FailureMode::Local, Some(fallback)) => {
                    let local: Vec<Check> = failed.iter().map(|&i| checks[i].clone()).collect();
                    let answers = fallback.check(&local, deadline, mode).await;
                    local
                        .iter()
                        .zip(answers)
                        .map(|(c, a)| a.unwrap_or_else(|_| failed_open(&c.limit)))
                        .collect()
                }
                _ => failed
                    .iter()
                    .map(|&i| failed_open(&checks[i].limit))
                    .collect(),
            };
            for (&i, decision) in failed.iter().zip(answered) {
                out[i] = Some((decision, false));
            }
        }
        Ok(out
            .into_iter()
            .zip(checks)
            .map(|(o, c)| o.unwrap_or_else(|| (failed_open(&c.limit), false)))
            .collect())
    }

    /// The temporary scaling factors the store shares between replicas, within `within`.
    pub async fn load_factors(&self, within: Duration) -> Result<SharedFactors, StoreError> {
        let deadline = tokio::time::Instant::now() + within;
        match tokio::time::timeout_at(
            deadline + DEADLINE_BACKSTOP,
            self.store.load_factors(deadline),
        )
        .await
        {
            Ok(result) => result,
            Err(_) => Err(StoreError::Timeout(within)),
        }
    }

    /// Keeps a temporary scaling factor in the store (`ttl_ms` 0 removes it), within `within`.
    pub async fn save_factor(
        &self,
        field: &str,
        factor: f64,
        ttl_ms: u64,
        within: Duration,
    ) -> Result<(), StoreError> {
        let deadline = tokio::time::Instant::now() + within;
        match tokio::time::timeout_at(
            deadline + DEADLINE_BACKSTOP,
            self.store.save_factor(field, factor, ttl_ms, deadline),
        )
        .await
        {
            Ok(result) => result,
            Err(_) => Err(StoreError::Timeout(within)),
        }
    }

    pub fn store_name(&self) -> &'static str {
        self.store.name()
    }

    /// Whether the store answers a ping within `within` (for `/readyz`).
    pub async fn store_ready(&self, within: Duration) -> Result<(), StoreError> {
        let deadline = tokio::time::Instant::now() + within;
        match tokio::time::timeout_at(deadline + DEADLINE_BACKSTOP, self.store.ping(deadline)).await
        {
            Ok(result) => result,
            Err(_) => Err(StoreError::Timeout(within)),
        }
    }
}

/// How long past its deadline a store call is awaited before the limiter stops waiting for it
/// (stores keep the deadline themselves; this only guards against one that does not).
const DEADLINE_BACKSTOP: Duration = Duration::from_millis(5);
