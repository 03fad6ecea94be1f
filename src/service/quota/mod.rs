//! The quota face: `envoy.service.rate_limit_quota.v3.RateLimitQuotaService` (RLQS). Envoy's
//! rate_limit_quota filter keeps one stream open, reports each bucket's usage every reporting
//! interval, and enforces locally what comes back. Each report is answered with an action per
//! bucket reported: a token bucket holding the gateway's share of its rule's rate, ALLOW_ALL
//! where no enforced rule applies, abandon for a bucket whose rule a reload removed.
//! Streams, buckets per stream and report size are bounded, reports per second paced; a malformed
//! report ends its own stream with INVALID_ARGUMENT and nothing else. It must never assign more
//! than a rule's rate across the gateways the quota store knows.

mod answer;
mod assign;
mod bounds;
mod charge;
mod churn;
mod fold;
mod hold;
mod identity;
mod push;
mod registry;
mod report;

pub use identity::IDENTITY_HEADER;
pub use registry::{Assigned, Registry};

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::time::Instant;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use self::identity::{gateway_id, identity, named_gateway_id};
use self::report::Buckets;
use super::Decider;
use crate::limiter::FailureMode;
use crate::pb::rlqs::{RateLimitQuotaResponse, RateLimitQuotaService, RateLimitQuotaUsageReports};
use crate::rules::Snapshot;
use crate::store::quota::{Ask, AskKind, QuotaStore};
use crate::telemetry::{KindLabels, LogThrottle, Metrics};

/// Bounds and timing of the quota service.
#[derive(Debug, Clone)]
pub struct QuotaConfig {
    /// How often gateways report (Envoy 1.40: every 5 s, whatever the filter's
    /// `reporting_interval`); a longer gap seen on a stream counts instead.
    pub reporting_interval: Duration,
    pub max_streams: usize,
    pub max_buckets_per_stream: usize,
    /// Bytes of bucket ids one stream, and all streams, may hold.
    pub max_bucket_bytes_per_stream: usize,
    pub max_bucket_bytes: usize,
    pub max_reports_per_second: u32,
    /// Entries of one bucket id.
    pub max_entries: usize,
    pub max_string_bytes: usize,
    /// What a bucket is assigned when the quota store cannot answer.
    pub failure_mode: FailureMode,
    /// The longest wait for the quota store.
    pub store_timeout: Duration,
    /// How often contested descriptors are read for pushes (`None`: no pushes).
    pub push_every: Option<Duration>,
    /// How much of its share a gateway's token bucket holds (`--rlqs-burst`; `None`: sized by
    /// the rule, `algorithm::share::burst_span`).
    pub burst: Option<Duration>,
}

impl Default for QuotaConfig {
    fn default() -> Self {
        Self {
            reporting_interval: Duration::from_secs(5),
            max_streams: 1024,
            max_buckets_per_stream: 10_000,
            max_bucket_bytes_per_stream: 4 << 20,
            max_bucket_bytes: 256 << 20,
            max_reports_per_second: 200,
            max_entries: 16,
            max_string_bytes: 1024,
            failure_mode: FailureMode::Allow,
            store_timeout: Duration::from_millis(500),
            push_every: Some(push::EVERY),
            burst: None,
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
    log: LogThrottle,
    registry: Arc<Registry>,
    /// This replica's streams by what they hold, for pushes between reports.
    pushes: Arc<push::Pushes>,
    /// Bytes of bucket ids all streams hold.
    bucket_bytes: std::sync::atomic::AtomicUsize,
    /// Ended streams' standing claims per connection (`churn`).
    churn: churn::ChurnGuard,
    /// Folds of ended streams' claims pending (`fold`), bounded.
    folds: Arc<Semaphore>,
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
        let pushes = Arc::new(push::Pushes::default());
        if let Some(every) = config.push_every {
            push::spawn(
                pushes.clone(),
                quota.clone(),
                every,
                metrics.clone(),
                stopped.clone(),
            );
        }
        Self {
            streams: Arc::new(Semaphore::new(config.max_streams)),
            inner: Arc::new(Inner {
                decider,
                rules,
                quota,
                fallback,
                metrics,
                config,
                log: LogThrottle::default(),
                registry: Arc::default(),
                pushes,
                bucket_bytes: std::sync::atomic::AtomicUsize::new(0),
                churn: churn::ChurnGuard::default(),
                folds: Arc::new(Semaphore::new(fold::MAX_PENDING)),
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
        let identity = match identity(&request) {
            Ok(identity) => identity,
            Err(status) => {
                self.inner.count_error("malformed");
                return Err(status);
            }
        };
        let peer = request.remote_addr();
        let inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(4);
        let inner = self.inner.clone();
        let gateway = identity
            .as_deref()
            .map_or_else(gateway_id, named_gateway_id);
        let stopped = self.stopped.clone();
        tokio::spawn(async move {
            inner.metrics.quota.streams.inc();
            let mut state = StreamState::new(inner.config.reporting_interval);
            state.peer = peer;
            let mut mailbox = inner.pushes.open(state.stream);
            let ending = inner
                .serve(inbound, &tx, gateway, stopped, &mut state, &mut mailbox)
                .await;
            inner.pushes.close(state.stream, state.asks.keys());
            inner
                .bucket_bytes
                .fetch_sub(state.bucket_bytes, std::sync::atomic::Ordering::Relaxed);
            // Before the stream ends (a draining server waits for it): what it held is free
            // for the gateway's next stream, on any replica, at its first report. A gateway
            // that names itself keeps its holds: its next stream is the same holder.
            if identity.is_none() {
                inner.stream_ended(gateway, &state).await;
                // Once its assignments have ended, their claims go into the counters and
                // their records go (`fold`).
                inner.fold_later(gateway, fold::held(&state));
            }
            // Its holds on its connection (`churn`): an unnamed stream's claims stand on for
            // its assignment's life and a window; a named gateway's next stream takes them over.
            let now = Instant::now();
            let quick = now.duration_since(state.opened)
                < churn::QUICK_INTERVALS * inner.config.reporting_interval;
            for (key, ask) in &state.asks {
                let granted = state.granted.get(key).is_some_and(|g| g.rate > 0.0);
                let stands = (identity.is_none() && granted)
                    .then(|| state.ttl + Duration::from_micros(ask.window_us));
                inner.churn.release(state.peer, key, stands, quick, now);
            }
            if let Some(status) = ending {
                let _ = tx.send(Err(status)).await;
            }
            inner.registry.forget(&inner.metrics, state.stream);
            inner.metrics.quota.streams.dec();
            drop(permit);
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// One stream's state.
struct StreamState {
    /// The stream itself, for the registry (a named gateway's streams share their holder id).
    stream: u64,
    /// Its connection's remote address, when known (`churn`).
    peer: Option<std::net::SocketAddr>,
    domain: Option<String>,
    buckets: Buckets,
    /// The descriptors the stream holds part of (its store keys, bounded), each with its last
    /// ask (what a push re-asks with).
    asks: std::collections::HashMap<String, Ask>,
    /// Per descriptor held, what it was granted since its admissions were last charged (the
    /// same keys as `asks`).
    granted: std::collections::HashMap<String, charge::Granted>,
    /// Per descriptor granted, its rule's layers (what an ended stream's claim is folded into).
    layers: std::collections::HashMap<String, Vec<crate::algorithm::Check>>,
    /// How long its assignments last.
    ttl: Duration,
    /// Bytes of its buckets' ids.
    bucket_bytes: usize,
    last_report: Option<Instant>,
    /// The longest gap between reports seen (the filter's interval, or longer).
    interval: Duration,
    window_start: Instant,
    reports_in_window: u32,
    /// When it opened (a stream that ends quickly counts against its address: `churn`).
    opened: Instant,
}

impl StreamState {
    fn new(interval: Duration) -> Self {
        Self {
            stream: gateway_id(),
            peer: None,
            domain: None,
            buckets: Buckets::new(),
            asks: std::collections::HashMap::new(),
            granted: std::collections::HashMap::new(),
            layers: std::collections::HashMap::new(),
            ttl: 2 * interval + Duration::from_secs(1),
            bucket_bytes: 0,
            last_report: None,
            interval,
            window_start: Instant::now(),
            reports_in_window: 0,
            opened: Instant::now(),
        }
    }
}

impl Inner {
    /// Takes the stream's holders off every descriptor it held (bounded by the store timeout;
    /// a failure leaves them to end with their grants, logged and counted).
    async fn stream_ended(&self, gateway: u64, state: &StreamState) {
        if state.asks.is_empty() {
            return;
        }
        let asks: Vec<Ask> = state
            .asks
            .keys()
            .map(|key| Ask::ended(key, gateway, AskKind::StreamEnded))
            .collect();
        let deadline = Instant::now() + self.config.store_timeout;
        if let Some(fallback) = &self.fallback {
            // What it was granted from this replica's memory while the store was away.
            let _ = fallback.grant(&asks, deadline).await;
        }
        let ended = tokio::time::timeout_at(deadline, self.quota.grant(&asks, deadline)).await;
        let error = match ended {
            Ok(answers) => answers.into_iter().find_map(Result::err),
            Err(_) => Some(crate::store::StoreError::Timeout(self.config.store_timeout)),
        };
        if let Some(error) = error {
            self.metrics.quota.store_errors.inc();
            if let Some(skipped) = self.log.allow() {
                tracing::warn!(gateway, %error, similar_not_logged = skipped, "RLQS stream ended; the store could not be told (its holds' shares are freed when their grants end)");
            }
        }
    }

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
        state: &mut StreamState,
        mailbox: &mut mpsc::Receiver<String>,
    ) -> Option<Status> {
        loop {
            let message = tokio::select! {
                _ = async { let _ = stopped.wait_for(|s| *s).await; } => {
                    // Envoy reopens its stream, to another replica once this one has gone.
                    return Some(Status::unavailable("Portcullis is stopping: reconnect"));
                }
                Some(key) = mailbox.recv() => {
                    // A descriptor it holds is contested: re-ask now, push what changed.
                    if let Some(pushed) = self.reassess(&key, state, gateway).await
                        && tx.send(Ok(pushed)).await.is_err()
                    {
                        return None;
                    }
                    continue;
                }
                message = inbound.message() => message,
            };
            let report = match message {
                Ok(Some(report)) => report,
                Ok(None) => return None,
                Err(status) => {
                    // A report past --max-message-bytes arrives as OUT_OF_RANGE: said back to
                    // the gateway like any other refusal.
                    let kind = if status.code() == tonic::Code::OutOfRange {
                        "too_large"
                    } else {
                        "transport"
                    };
                    self.count_error(kind);
                    if let Some(skipped) = self.log.allow() {
                        tracing::warn!(gateway, kind, %status, similar_not_logged = skipped, "RLQS stream failed");
                    }
                    return Some(status);
                }
            };
            // One span per report (every few seconds per gateway), exported like RLS calls'.
            let span = tracing::info_span!(
                "rlqs_report",
                gateway,
                buckets = report.bucket_quota_usages.len()
            );
            let answer =
                tracing::Instrument::instrument(self.answer(report, state, gateway), span).await;
            match answer {
                Ok(response) => {
                    if !response.bucket_action.is_empty() && tx.send(Ok(response)).await.is_err() {
                        return None;
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
                    return Some(status);
                }
            }
        }
    }
}
