//! The quota face: `envoy.service.rate_limit_quota.v3.RateLimitQuotaService` (RLQS). Envoy's
//! rate_limit_quota filter keeps one stream open, reports each bucket's usage every reporting
//! interval, and enforces locally what comes back. Each report is answered with an action per
//! bucket reported: a token bucket holding the gateway's share of its rule's rate, ALLOW_ALL
//! where no enforced rule applies, abandon for a bucket whose rule a reload removed.
//! Streams, buckets per stream and report size are bounded, reports per second paced; a malformed
//! report ends its own stream with INVALID_ARGUMENT and nothing else. It must never assign more
//! than a rule's rate across the gateways the quota store knows.

mod answer;
mod registry;
mod report;

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

use self::report::Buckets;
use super::Decider;
use crate::limiter::FailureMode;
use crate::pb::rlqs::{RateLimitQuotaResponse, RateLimitQuotaService, RateLimitQuotaUsageReports};
use crate::rules::Snapshot;
use crate::store::quota::QuotaStore;
use crate::telemetry::{KindLabels, LogThrottle, Metrics};

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
            max_reports_per_second: 200,
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
                log: LogThrottle::default(),
                registry: Arc::default(),
            }),
            stopped,
        }
    }
}

/// A stream's holder id: 64 random bits, unique across every replica sharing one Redis and
/// every restart (a prefix per replica and a counter gave 32 random bits, and a replica's
/// streams told apart by their counter only). Never 0.
fn gateway_id() -> u64 {
    rand::random::<u64>().max(1)
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
        let gateway = gateway_id();
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
                    let _ = tx.send(Err(status)).await;
                    return;
                }
            };
            // One span per report (every few seconds per gateway), exported like RLS calls'.
            let span = tracing::info_span!(
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
}

#[cfg(test)]
mod id_tests {
    #[test]
    fn every_stream_draws_all_64_bits_of_its_id() {
        let ids: Vec<u64> = (0..64).map(|_| super::gateway_id()).collect();
        let high: std::collections::HashSet<u64> = ids.iter().map(|id| id >> 32).collect();
        // 64 draws of 32 random high bits: all alike only by a chance of 2^-2016.
        assert!(high.len() > 1, "{ids:x?}");
        assert!(ids.iter().all(|&id| id != 0));
    }
}
