//! What the composition root derives from `Settings`: the rules loader's options, the tracing
//! configuration, the gRPC request timeout in force. It must never read the environment.

use std::time::Duration;

use super::Settings;
use crate::rules::LoadOptions;
use crate::telemetry::{Sampling, TracingConfig};

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
            sampling: self.sampling(),
        }
    }

    /// Which traces are kept: `OTEL_TRACES_SAMPLER` (and its argument) as the OpenTelemetry SDKs
    /// read it, else parent-based with `--traces-sampling-ratio` of the rest (all by default).
    /// Combinations that cannot take effect are refused by `validate`.
    pub fn sampling(&self) -> Sampling {
        let ratio = self.traces_sampler_arg.unwrap_or(1.0);
        match self.traces_sampler.as_deref() {
            Some("always_on") => Sampling {
                parent_based: false,
                ratio: 1.0,
            },
            Some("always_off") => Sampling {
                parent_based: false,
                ratio: 0.0,
            },
            Some("traceidratio") => Sampling {
                parent_based: false,
                ratio,
            },
            Some("parentbased_always_on") => Sampling {
                parent_based: true,
                ratio: 1.0,
            },
            Some("parentbased_always_off") => Sampling {
                parent_based: true,
                ratio: 0.0,
            },
            Some("parentbased_traceidratio") => Sampling {
                parent_based: true,
                ratio,
            },
            _ => Sampling {
                parent_based: true,
                ratio: self.traces_sampling_ratio.unwrap_or(1.0),
            },
        }
    }

    /// The gRPC request timeout in force.
    pub fn grpc_request_timeout(&self) -> Duration {
        self.grpc_request_timeout
            .unwrap_or(self.store_timeout + Duration::from_secs(1))
    }
}
