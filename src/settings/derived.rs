//! What the composition root derives from `Settings`: the rules loader's options, the tracing
//! configuration, the gRPC request timeout in force. It must never read the environment.

use std::time::Duration;

use super::Settings;
use crate::rules::LoadOptions;
use crate::telemetry::TracingConfig;

impl Settings {
    /// How rule files become one set of rules.
    pub fn load_options(&self) -> LoadOptions {
        LoadOptions {
            merge_domains: self.merge_domain_config,
            default_algorithm: self.default_algorithm,
        }
    }

    /// Where traces go (Go mode adds its namespace and instance from TRACING_*).
    pub fn tracing(&self) -> TracingConfig {
        TracingConfig {
            endpoint: self.otlp_endpoint.clone().filter(|e| !e.is_empty()),
            protocol: self.otlp_protocol,
            service_name: self.otel_service_name.clone(),
            service_namespace: self.otel_service_namespace.clone(),
            service_instance_id: self.otel_service_instance_id.clone(),
            sampling_ratio: self.traces_sampling_ratio,
        }
    }

    /// The gRPC request timeout in force.
    pub fn grpc_request_timeout(&self) -> Duration {
        self.grpc_request_timeout
            .unwrap_or(self.store_timeout + Duration::from_secs(1))
    }
}
