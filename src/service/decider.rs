//! One `ShouldRateLimit` call, whatever carried it (gRPC or the admin `/json` endpoint): validate
//! the request, resolve each descriptor to a rule, count what needs counting in one call to the
//! limiter, and answer in request order, counting the per-rule metrics.
//! Input never panics this code: every bad request gets INVALID_ARGUMENT saying what is wrong.

use std::sync::Arc;

use arc_swap::ArcSwap;
use tonic::Status;

use super::config::ServiceConfig;
use super::plan::Planned;
use super::plan::{apply_replaces, plan};
use super::response;
use crate::algorithm::{ChargeMode, Check};
use crate::limiter::Limiter;
use crate::pb::{RateLimitRequest, RateLimitResponse, rate_limit_descriptor};
use crate::rules::scaling::Scaling;
use crate::rules::{Entry, Snapshot};
use crate::telemetry::Metrics;

impl Entry for rate_limit_descriptor::Entry {
    fn key(&self) -> &str {
        &self.key
    }
    fn value(&self) -> &str {
        &self.value
    }
}

/// Decides one call: rules, then the limiter, then the response. Shared by the gRPC face
/// (`RlsService`) and the admin `/json` endpoint.
pub struct Decider {
    rules: Arc<ArcSwap<Snapshot>>,
    limiter: Arc<Limiter>,
    pub(super) config: ServiceConfig,
    pub(super) metrics: Arc<Metrics>,
    /// Runtime scaling in force (the file's and the store's temporary factors).
    scaling: Arc<ArcSwap<Scaling>>,
}

impl Decider {
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub fn new(
        rules: Arc<ArcSwap<Snapshot>>,
        limiter: Arc<Limiter>,
        config: ServiceConfig,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            rules,
            limiter,
            config,
            metrics,
            scaling: Arc::new(ArcSwap::from_pointee(Scaling::default())),
        }
    }

    /// The limiter its checks go to (RLQS charges what gateways admitted through it).
    pub fn limiter(&self) -> &Limiter {
        &self.limiter
    }

    /// Limits scaled by what `scaling` holds (kept up to date by the server).
    pub fn with_scaling(mut self, scaling: Arc<ArcSwap<Scaling>>) -> Self {
        self.scaling = scaling;
        self
    }

    /// Answers one request.
    pub async fn decide(&self, request: &RateLimitRequest) -> Result<RateLimitResponse, Status> {
        let mut planned = self.plan_call(request)?;
        self.limit(&mut planned).await?;
        self.count(&request.domain, &planned);
        Ok(response::build(request, &planned, &self.config))
    }

    /// What `decide` would count for this request, without counting: each descriptor resolved,
    /// scaled and with `replaces` applied, exactly as a call is planned. For `portcullis
    /// explain` and `portcullis test`, so that they answer by the code that serves.
    pub fn plan_call(&self, request: &RateLimitRequest) -> Result<Vec<Planned>, Status> {
        self.validate(request)?;
        // One snapshot for the whole call: a reload in the middle never mixes two rule sets.
        let rules = self.rules.load_full();
        let scaling = self.scaling.load();
        let request_hits = u64::from(request.hits_addend.max(1));
        let mut planned: Vec<Planned> = request
            .descriptors
            .iter()
            .map(|d| {
                plan(
                    &rules,
                    &scaling,
                    &request.domain,
                    d,
                    request_hits,
                    &self.config,
                )
            })
            .collect();
        apply_replaces(&mut planned);
        Ok(planned)
    }

    /// Asks the limiter for every check of the call and records the decisions in `planned`.
    ///
    /// The limits of one layered descriptor are charged all or nothing (a hit refused by one
    /// layer is charged to none), each layered descriptor on its own, beside the call's other
    /// checks; with `--stop-charging-when-over` everything is one all-or-nothing group anyway.
    /// The groups go to the limiter together (on Redis they share a script call).
    async fn limit(&self, planned: &mut [Planned]) -> Result<(), Status> {
        let whole_call = self.config.charge == ChargeMode::AllOrNothing;
        let mut groups: Vec<(Vec<Check>, ChargeMode)> = vec![(Vec::new(), self.config.charge)];
        for p in planned.iter() {
            if let Some(check) = &p.check {
                groups[0].0.push(check.clone());
            }
            if p.layers.is_empty() {
                continue;
            }
            let layers = p.layers.iter().map(|l| l.check.clone());
            if whole_call {
                groups[0].0.extend(layers);
            } else {
                groups.push((layers.collect(), ChargeMode::AllOrNothing));
            }
        }
        // The usual call has one group: no join, no extra allocation.
        let answers = if groups.len() == 1 {
            vec![self.limiter.check(&groups[0].0, groups[0].1).await]
        } else {
            futures_util::future::join_all(
                groups
                    .iter()
                    .map(|(checks, mode)| self.limiter.check(checks, *mode)),
            )
            .await
        };
        let mut decided = Vec::with_capacity(groups.len());
        for ((checks, _), answer) in groups.iter().zip(answers) {
            let decisions =
                answer.map_err(|e| Status::unavailable(format!("rate-limit store: {e}")))?;
            if decisions.len() != checks.len() {
                return Err(Status::internal(format!(
                    "store answered {} decisions for {} checks",
                    decisions.len(),
                    checks.len()
                )));
            }
            decided.push(decisions.into_iter());
        }
        // Handed back in the order the groups were filled.
        let mut next_group = 1;
        for p in planned.iter_mut() {
            if p.check.is_some() {
                p.decision = decided[0].next();
            }
            if p.layers.is_empty() {
                continue;
            }
            let group = if whole_call {
                0
            } else {
                next_group += 1;
                next_group - 1
            };
            for layer in p.layers.iter_mut() {
                layer.decision = decided[group].next();
            }
            p.bind_layers();
        }
        Ok(())
    }
}
