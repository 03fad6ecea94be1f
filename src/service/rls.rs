//! The gRPC face: `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` over tonic. It
//! opens one span per call (its parent from Envoy's W3C `traceparent`), counts calls and latency,
//! and hands the request to the `Decider`. It must never decide anything itself.

use std::sync::Arc;

use tonic::{Request, Response, Status};
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::decider::Decider;
use crate::pb::{RateLimitRequest, RateLimitResponse};
use crate::telemetry::CodeLabels;

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
pub struct RlsService(pub Arc<Decider>);

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
        let result = self.0.decide(&request).instrument(span.clone()).await;
        let metrics = self.0.metrics();
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
