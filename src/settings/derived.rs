//! What the composition root derives from `Settings`: the rules loader's options, what the
//! service is told, the tracing configuration, the gRPC request timeout in force. It must never read the environment.

use std::time::Duration;

use super::Settings;
use crate::algorithm::ChargeMode;
use crate::rules::LoadOptions;
use crate::service::{HeaderNames, ServiceConfig};
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
        self.traces.config()
    }

    /// What the service is told at start (headers, shadow and quota modes, how calls are
    /// charged, request bounds): `serve`'s, and what the rules commands decide with.
    pub fn service_config(&self) -> ServiceConfig {
        ServiceConfig {
            response_headers: self.response_headers,
            header_names: HeaderNames {
                limit: self.header_limit_name.clone(),
                remaining: self.header_remaining_name.clone(),
                reset: self.header_reset_name.clone(),
            },
            global_shadow_mode: self.shadow_mode,
            global_quota_mode: self.quota_mode,
            charge: if self.stop_charging_when_over {
                ChargeMode::AllOrNothing
            } else {
                ChargeMode::EachAlone
            },
            dynamic_metadata: self.response_dynamic_metadata,
            override_algorithm: self.override_algorithm,
            // The Go service counts every hit, refused or not (INCRBY, then compare), unless told to
            // stop charging over the limit: drop-in mode counts the same, so Go rules keep meaning.
            post_paid_everywhere: self.env_compat.as_deref() == Some("go")
                && !self.stop_charging_when_over,
            max_descriptors: self.max_descriptors,
            max_entries: self.max_entries,
            max_string_bytes: self.max_string_bytes,
        }
    }

    /// The gRPC request timeout in force.
    pub fn grpc_request_timeout(&self) -> Duration {
        self.grpc_request_timeout
            .unwrap_or(self.store_timeout + Duration::from_secs(1))
    }
}
