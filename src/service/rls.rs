//! The gRPC face: `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` over tonic. It
//! opens one span per call (its parent from Envoy's W3C `traceparent`), counts calls and latency,
//! and hands the request to the `Decider`. It must never decide anything itself.

use std::sync::Arc;

use tonic::{Request, Response, Status};
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use tokio::sync::Semaphore;

use super::decider::Decider;
use crate::pb::{RateLimitRequest, RateLimitResponse};
use crate::telemetry::{CodeLabels, LogThrottle};

/// Reads W3C trace context from gRPC metadata.
struct MetadataExtractor<'a>(&'a tonic::metadata::MetadataMap);

impl opentelemetry::propagation::Extractor for MetadataExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|k| match k {
                tonic::metadata::KeyRef::Ascii(k) => Some(k.as_str()),
                tonic::metadata::KeyRef::Binary(_) => None,
            })
            .collect()
    }
}

/// The tonic service: what Envoy calls.
pub struct RlsService {
    decider: Arc<Decider>,
    /// One permit per call in progress: past `max_in_flight` calls are shed at once rather than
    /// queued behind a slow store (Envoy would time them out anyway, holding memory meanwhile).
    in_flight: Arc<Semaphore>,
    max_in_flight: usize,
    shed_log: LogThrottle,
}

impl RlsService {
    pub fn new(decider: Arc<Decider>, max_in_flight: usize) -> Self {
        Self {
            decider,
            in_flight: Arc::new(Semaphore::new(max_in_flight)),
            max_in_flight,
            shed_log: LogThrottle::default(),
        }
    }
}

#[tonic::async_trait]
impl crate::pb::RateLimitService for RlsService {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        // Envoy's W3C `traceparent` (gRPC metadata) makes this call's span part of its trace.
        let parent = opentelemetry::global::get_text_map_propagator(|propagator| {
            propagator.extract(&MetadataExtractor(request.metadata()))
        });
        let request = request.into_inner();
        let span = tracing::info_span!(
            "should_rate_limit",
            domain = %request.domain,
            descriptors = request.descriptors.len(),
            overall_code = tracing::field::Empty,
        );
        let _ = span.set_parent(parent);
        let started = std::time::Instant::now();
        let result = match self.in_flight.clone().try_acquire_owned() {
            Ok(_permit) => self.decider.decide(&request).instrument(span.clone()).await,
            Err(_) => {
                if let Some(skipped) = self.shed_log.allow() {
                    tracing::warn!(
                        max_in_flight = self.max_in_flight,
                        similar_calls_not_logged = skipped,
                        "overloaded: call refused with RESOURCE_EXHAUSTED"
                    );
                }
                Err(Status::resource_exhausted(format!(
                    "overloaded: {} calls already in progress",
                    self.max_in_flight
                )))
            }
        };
        let metrics = self.decider.metrics();
        metrics
            .call_seconds
            .observe(started.elapsed().as_secs_f64());
        let code = match &result {
            Ok(_) => tonic::Code::Ok,
            Err(status) => status.code(),
        };
        metrics
            .calls
            .get_or_create(&CodeLabels {
                code: format!("{code:?}"),
            })
            .inc();
        let _entered = span.enter();
        if let Ok(r) = &result {
            let code = crate::pb::rate_limit_response::Code::try_from(r.overall_code)
                .map_or("UNKNOWN", |c| c.as_str_name());
            span.record("overall_code", code);
        }
        match &result {
            Ok(r) => tracing::debug!(overall_code = r.overall_code, "answered"),
            Err(status) => {
                tracing::debug!(code = ?status.code(), message = status.message(), "refused")
            }
        }
        result.map(Response::new)
    }
}
