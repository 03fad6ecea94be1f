//! Generated protobuf types and the gRPC service, from our own copy of Envoy's protos (`proto/`).
//! The module tree mirrors the proto packages so that the generated cross-references resolve.
#![allow(clippy::all, missing_docs)]

pub mod envoy {
    pub mod config {
        pub mod core {
            pub mod v3 {
                tonic::include_proto!("envoy.config.core.v3");
            }
        }
    }
    pub mod r#type {
        pub mod v3 {
            tonic::include_proto!("envoy.r#type.v3");
        }
    }
    pub mod extensions {
        pub mod common {
            pub mod ratelimit {
                pub mod v3 {
                    tonic::include_proto!("envoy.extensions.common.ratelimit.v3");
                }
            }
        }
    }
    pub mod service {
        pub mod ratelimit {
            pub mod v3 {
                tonic::include_proto!("envoy.service.ratelimit.v3");
            }
        }
        pub mod discovery {
            pub mod v3 {
                tonic::include_proto!("envoy.service.discovery.v3");
            }
        }
        pub mod rate_limit_quota {
            pub mod v3 {
                tonic::include_proto!("envoy.service.rate_limit_quota.v3");
            }
        }
    }
}

pub mod google {
    pub mod rpc {
        tonic::include_proto!("google.rpc");
    }
}

/// envoyproxy/ratelimit's rules resource, as pushed over xDS.
pub mod ratelimit {
    pub mod config {
        pub mod ratelimit {
            pub mod v3 {
                tonic::include_proto!("ratelimit.config.ratelimit.v3");
            }
        }
    }
}

/// The xDS stream (state of the world) and the rules resource it carries.
pub mod xds {
    pub use super::envoy::config::core::v3::Node;
    pub use super::envoy::service::discovery::v3::{
        DiscoveryRequest, DiscoveryResponse,
        aggregated_discovery_service_client::AggregatedDiscoveryServiceClient,
        aggregated_discovery_service_server::{
            AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
        },
    };
    pub use super::google::rpc::Status;
    pub use super::ratelimit::config::ratelimit::v3 as rules;

    /// The type URL of the rules resource.
    pub const RULES_TYPE_URL: &str =
        "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";
}

pub use envoy::config::core::v3::HeaderValue;
pub use envoy::extensions::common::ratelimit::v3::{RateLimitDescriptor, rate_limit_descriptor};
pub use envoy::service::ratelimit::v3::{
    RateLimitRequest, RateLimitResponse, rate_limit_response,
    rate_limit_service_client::RateLimitServiceClient,
    rate_limit_service_server::{RateLimitService, RateLimitServiceServer},
};
pub use envoy::r#type::v3::RateLimitUnit;

/// The Rate Limit Quota Service (RLQS) and the strategies its assignments carry.
pub mod rlqs {
    pub use super::envoy::service::rate_limit_quota::v3::*;
    pub use super::envoy::service::rate_limit_quota::v3::{
        rate_limit_quota_response::{BucketAction, bucket_action},
        rate_limit_quota_service_client::RateLimitQuotaServiceClient,
        rate_limit_quota_service_server::{RateLimitQuotaService, RateLimitQuotaServiceServer},
        rate_limit_quota_usage_reports::BucketQuotaUsage,
    };
    pub use super::envoy::r#type::v3::{
        RateLimitStrategy, TokenBucket, rate_limit_strategy::BlanketRule,
        rate_limit_strategy::Strategy,
    };
}
