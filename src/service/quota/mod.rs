//! The quota face: `envoy.service.rate_limit_quota.v3.RateLimitQuotaService` (RLQS). Envoy's
//! rate_limit_quota filter keeps one stream open, reports each bucket's usage every reporting
//! interval, and enforces locally what comes back. Each report is answered with an action per
//! bucket reported: a token bucket holding the gateway's share of its rule's rate, ALLOW_ALL
//! where no enforced rule applies, abandon for a bucket whose rule a reload removed.
//! Streams, buckets per stream, reports per second and report size are bounded; a malformed
//! report ends its own stream with INVALID_ARGUMENT and nothing else. It must never assign more
//! than a rule's rate across the gateways the quota store knows.

mod registry;
mod report;

pub use registry::{Assigned, Registry};

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::time::Instant;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use self::report::{Buckets, allow_all, bucket_key, deny_all, plan, token_bucket};
use super::Decider;
use crate::limiter::FailureMode;
use crate::pb::rlqs::{RateLimitQuotaResponse, RateLimitQuotaService, RateLimitQuotaUsageReports};
use crate::rules::Snapshot;
use crate::store::quota::QuotaStore;
use crate::telemetry::{KindLabels, LogThrottle, Metrics, RuleLabels};

/// Bounds and timing of the quota service.
#[derive(Debug, Clone)]
pub struct QuotaConfig {
    /// How often gateways report (Envoy 1.40: every 5 s, whatever the filter's
    /// `reporting_interval`); a longer gap seen on a stream counts instead.
    pub reporting_interval: Duration,
    pub max_streams: usize,
    pub max_buckets_per_stream: usize,
    pub max_reports_per_second: u32,
    /// Entries of one bucket id.
    pub max_entries: usize,
    pub max_string_bytes: usize,
    /// What a bucket is assigned when the quota store cannot answer.
    pub failure_mode: FailureMode,
    /// The longest wait for the quota store.
    pub store_timeout: Duration,
}

impl Default for QuotaConfig {
    fn default() -> Self {
        Self {
            reporting_interval: Duration::from_secs(5),
            max_streams: 1024,
            max_buckets_per_stream: 10_000,
            max_reports_per_second: 50,
            max_entries: 16,
            max_string_bytes: 1024,
            failure_mode: FailureMode::Allow,
            store_timeout: Duration::from_millis(500),
        }
    }
}

struct Inner {
    decider: Arc<Decider>,
    rules: Arc<ArcSwap<Snapshot>>,
    quota: Arc<dyn QuotaStore>,
    /// Under `--failure-mode local`: this replica's own grants while the store is away.
    fallback: Option<Arc<dyn QuotaStore>>,
    metrics: Arc<Metrics>,
    config: QuotaConfig,
    next_gateway: AtomicU64,
    log: LogThrottle,
    registry: Arc<Registry>,
}

/// The tonic service.
pub struct QuotaService {
    inner: Arc<Inner>,
    streams: Arc<Semaphore>,
    stopped: watch::Receiver<bool>,
}

impl QuotaService {
    pub fn new(
        decider: Arc<Decider>,
        rules: Arc<ArcSwap<Snapshot>>,
        quota: Arc<dyn QuotaStore>,
        fallback: Option<Arc<dyn QuotaStore>>,
        metrics: Arc<Metrics>,
        config: QuotaConfig,
        stopped: watch::Receiver<bool>,
    ) -> Self {
        Self {
            streams: Arc::new(Semaphore::new(config.max_streams)),
            inner: Arc::new(Inner {
                decider,
                rules,
                quota,
                fallback,
                metrics,
                config,
                // Unique across replicas sharing one Redis: a random half, then a counter.
                next_gateway: AtomicU64::new(u64::from(rand::random::<u32>()) << 32 | 1),
                log: LogThrottle::default(),
                registry: Arc::default(),
            }),
            stopped,
        }
    }
}

impl QuotaService {
    /// What this replica has assigned, for `/rlqs`.
    pub fn registry(&self) -> Arc<Registry> {
        self.inner.registry.clone()
    }
}

type Answers = Pin<Box<dyn Stream<Item = Result<RateLimitQuotaResponse, Status>> + Send>>;

#[tonic::async_trait]
impl RateLimitQuotaService for QuotaService {
    type StreamRateLimitQuotasStream = Answers;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Answers>, Status> {
        let permit = self.streams.clone().try_acquire_owned().map_err(|_| {
            self.inner.count_error("streams_full");
            Status::resource_exhausted(format!(
                "{} RLQS streams are open already",
                self.inner.config.max_streams
            ))
        })?;
        let inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(4);
        let inner = self.inner.clone();
        let gateway = inner.next_gateway.fetch_add(1, Ordering::Relaxed);
        let stopped = self.stopped.clone();
        tokio::spawn(async move {
            inner.metrics.quota.streams.inc();
            inner.serve(inbound, &tx, gateway, stopped).await;
            inner.registry.forget(&inner.metrics, gateway);
            inner.metrics.quota.streams.dec();
            drop(permit);
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// One stream's state.
struct StreamState {
    domain: Option<String>,
    buckets: Buckets,
    last_report: Option<Instant>,
    /// The longest gap between reports seen (the filter's interval, or longer).
    interval: Duration,
    window_start: Instant,
    reports_in_window: u32,
}

impl Inner {
    fn count_error(&self, kind: &str) {
        self.metrics
            .quota
            .stream_errors
            .get_or_create(&KindLabels { kind: kind.into() })
            .inc();
    }

    async fn serve(
        &self,
        mut inbound: Streaming<RateLimitQuotaUsageReports>,
        tx: &mpsc::Sender<Result<RateLimitQuotaResponse, Status>>,
        gateway: u64,
        mut stopped: watch::Receiver<bool>,
    ) {
        let mut state = StreamState {
            domain: None,
            buckets: Buckets::new(),
            last_report: None,
            interval: self.config.reporting_interval,
            window_start: Instant::now(),
            reports_in_window: 0,
        };
        loop {
            let message = tokio::select! {
                _ = async { let _ = stopped.wait_for(|s| *s).await; } => {
                    // Envoy reopens its stream, to another replica once this one has gone.
                    let _ = tx.send(Err(Status::unavailable("Portcullis is stopping: reconnect"))).await;
                    return;
                }
                message = inbound.message() => message,
            };
            let report = match message {
                Ok(Some(report)) => report,
                Ok(None) => return,
                Err(status) => {
                    self.count_error("transport");
                    if let Some(skipped) = self.log.allow() {
                        tracing::warn!(gateway, %status, similar_not_logged = skipped, "RLQS stream failed");
                    }
                    return;
                }
            };
            let span = tracing::debug_span!(
                "rlqs_report",
                gateway,
                buckets = report.bucket_quota_usages.len()
            );
            let answer =
                tracing::Instrument::instrument(self.answer(report, &mut state, gateway), span)
                    .await;
            match answer {
                Ok(response) => {
                    if !response.bucket_action.is_empty() && tx.send(Ok(response)).await.is_err() {
                        return;
                    }
                }
                Err((kind, status)) => {
                    self.count_error(kind);
                    if let Some(skipped) = self.log.allow() {
                        tracing::warn!(
                            gateway,
                            kind,
                            reason = status.message(),
                            similar_not_logged = skipped,
                            "RLQS stream closed"
                        );
                    }
                    let _ = tx.send(Err(status)).await;
                    return;
                }
            }
        }
    }

    /// Answers one report, or says why the stream ends.
    async fn answer(
        &self,
        report: RateLimitQuotaUsageReports,
        state: &mut StreamState,
        gateway: u64,
    ) -> Result<RateLimitQuotaResponse, (&'static str, Status)> {
        let now = Instant::now();
        if now.duration_since(state.window_start) >= Duration::from_secs(1) {
            state.window_start = now;
            state.reports_in_window = 0;
        }
        state.reports_in_window += 1;
        if state.reports_in_window > self.config.max_reports_per_second {
            return Err((
                "too_many_reports",
                Status::resource_exhausted(format!(
                    "more than {} reports a second on one stream",
                    self.config.max_reports_per_second
                )),
            ));
        }
        let domain = match (&state.domain, report.domain.as_str()) {
            (None, "") => {
                return Err((
                    "malformed",
                    Status::invalid_argument("the first report of a stream must name its domain"),
                ));
            }
            (None, d) => {
                state.domain = Some(d.to_owned());
                d.to_owned()
            }
            (Some(d), "") => d.clone(),
            (Some(d), other) if d == other => d.clone(),
            (Some(d), other) => {
                return Err((
                    "malformed",
                    Status::invalid_argument(format!(
                        "the stream's domain is {d:?}; a report names {other:?} (one stream, one domain)"
                    )),
                ));
            }
        };
        if let Some(last) = state.last_report {
            state.interval = state.interval.max(now.duration_since(last));
        }
        state.last_report = Some(now);
        let ttl = Duration::from_secs(2 * state.interval.as_secs_f64().ceil() as u64 + 1);

        let mut keyed = Vec::with_capacity(report.bucket_quota_usages.len());
        for usage in &report.bucket_quota_usages {
            let key = bucket_key(usage, &self.config).map_err(|s| ("malformed", s))?;
            keyed.push((key, usage));
        }
        let new = keyed
            .iter()
            .filter(|(k, _)| !state.buckets.contains_key(k))
            .count();
        if state.buckets.len() + new > self.config.max_buckets_per_stream {
            return Err((
                "too_many_buckets",
                Status::resource_exhausted(format!(
                    "more than {} buckets on one stream",
                    self.config.max_buckets_per_stream
                )),
            ));
        }

        let snapshot = self.rules.load_full();
        let mut planned = Vec::with_capacity(keyed.len());
        for (key, usage) in keyed {
            let seen = usage
                .num_requests_allowed
                .saturating_add(usage.num_requests_denied);
            let elapsed = usage.time_elapsed.map_or(0.0, |d| {
                d.seconds.max(0) as f64 + f64::from(d.nanos.max(0)) / 1e9
            });
            let demand = seen as f64 / elapsed.max(self.config.reporting_interval.as_secs_f64());
            let (rule, ask) = plan(
                &self.decider,
                &snapshot,
                &domain,
                &key,
                gateway,
                demand,
                ttl,
            );
            if let Some(rule) = &rule {
                let labels = RuleLabels {
                    domain: domain.clone(),
                    rule: rule.clone(),
                };
                let q = &self.metrics.quota;
                q.reported_allowed
                    .get_or_create(&labels)
                    .inc_by(usage.num_requests_allowed);
                q.reported_denied
                    .get_or_create(&labels)
                    .inc_by(usage.num_requests_denied);
            }
            let id = usage.bucket_id.clone().unwrap_or_default();
            planned.push((key, id, rule, ask));
        }
        let asks: Vec<_> = planned.iter().filter_map(|p| p.3.clone()).collect();
        let mut grants = if asks.is_empty() {
            Vec::new()
        } else {
            let deadline = now + self.config.store_timeout;
            match tokio::time::timeout_at(deadline, self.quota.grant(&asks, deadline)).await {
                Ok(grants) => grants,
                Err(_) => asks
                    .iter()
                    .map(|_| Err(crate::store::StoreError::Timeout(self.config.store_timeout)))
                    .collect(),
            }
        }
        .into_iter()
        .collect::<Vec<_>>();
        if let Some(fallback) = &self.fallback
            && grants.iter().any(Result::is_err)
        {
            let deadline = Instant::now() + self.config.store_timeout;
            let local = fallback.grant(&asks, deadline).await;
            for (grant, local) in grants.iter_mut().zip(local) {
                if let Err(error) = grant {
                    self.failed_log(error, gateway);
                    *grant = local;
                }
            }
        }
        let mut grants = grants.into_iter();

        let mut actions = Vec::with_capacity(planned.len());
        let mut changes = Vec::with_capacity(planned.len());
        for (key, id, rule, ask) in planned {
            let previous = state.buckets.get(&key).and_then(|b| b.rule.clone());
            let action = match (&rule, ask) {
                // Its rule is gone (a reload removed it): Envoy forgets the bucket.
                (None, _) if previous.is_some() => {
                    state.buckets.remove(&key);
                    self.count_kind("abandon");
                    actions.push(report::abandon(id));
                    changes.push((key, None));
                    continue;
                }
                (_, None) => {
                    self.count_kind("allow_all");
                    allow_all(id, ttl)
                }
                (_, Some(_)) => match grants.next() {
                    Some(Ok(Some(grant))) => {
                        self.count_kind("token_bucket");
                        token_bucket(id, grant, ttl)
                    }
                    Some(Ok(None)) => {
                        self.count_kind("deny_all");
                        deny_all(id, ttl)
                    }
                    Some(Err(error)) => self.failed(id, &error, gateway),
                    None => self.failed(
                        id,
                        &crate::store::StoreError::Protocol("fewer grants than asks".into()),
                        gateway,
                    ),
                },
            };
            changes.push((
                key.clone(),
                Some(report::describe(&key, rule.clone(), &action)),
            ));
            state.buckets.insert(key, report::BucketState { rule });
            actions.push(action);
        }
        self.registry
            .record(&self.metrics, gateway, &domain, changes);
        Ok(report::response(actions))
    }

    fn count_kind(&self, kind: &str) {
        self.metrics
            .quota
            .assignments
            .get_or_create(&KindLabels { kind: kind.into() })
            .inc();
    }

    fn failed_log(&self, error: &crate::store::StoreError, gateway: u64) {
        self.metrics.quota.store_errors.inc();
        if let Some(skipped) = self.log.allow() {
            tracing::error!(gateway, %error, mode = ?self.config.failure_mode, similar_not_logged = skipped, "RLQS grant failed; the failure mode assigns");
        }
    }

    /// The failure mode's assignment when the quota store could not grant.
    fn failed(
        &self,
        id: crate::pb::rlqs::BucketId,
        error: &crate::store::StoreError,
        gateway: u64,
    ) -> crate::pb::rlqs::BucketAction {
        self.failed_log(error, gateway);
        // Short, so that the store's answer comes back at the next report.
        let ttl = Duration::from_secs(self.config.reporting_interval.as_secs().max(1) + 1);
        match self.config.failure_mode {
            FailureMode::Allow => {
                self.count_kind("allow_all");
                allow_all(id, ttl)
            }
            _ => {
                self.count_kind("deny_all");
                deny_all(id, ttl)
            }
        }
    }
}
