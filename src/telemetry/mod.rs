//! Logs, traces and metrics.
//!
//! Logs: one subscriber for the process, text or JSON, filtered by `RUST_LOG` or `--log-level`.
//! Traces: when `OTEL_EXPORTER_OTLP_ENDPOINT` is set, spans go to that OTLP (gRPC) collector
//! through a batch exporter; the SDK reads the other `OTEL_*` variables (service name, headers,
//! sampler: parent-based by default, so Envoy's sampling decision is followed). When it is not
//! set, no exporter and no OpenTelemetry layer exist at all.
//! Metrics: the Prometheus registry below, served at `/metrics`.
//!
//! This module takes plain values (a level, a format, an endpoint) and imports nothing else from
//! the crate: every floor may count and log. It must never label a series with raw request data
//! unless a rule asks for it (`detailed_metric`).

pub mod go_names;
pub mod statsd_mapping;

mod hot_metrics;
mod labels;
mod logs;
mod metrics;
mod process;
mod quota_metrics;
mod register;
mod throttle;

pub use hot_metrics::HotMetrics;
pub use labels::{
    CodeLabels, DomainLabels, KindLabels, ListenerLabels, ModeLabels, ResultLabels, RuleLabels,
    RuleLimitLabels,
};
pub use logs::{LogFormat, OtlpProtocol, Sampling, Telemetry, TracingConfig, init};
pub use metrics::Metrics;
pub use throttle::LogThrottle;
