//! The faces of Portcullis: the gRPC service Envoy calls (`rls`), the admin HTTP listener
//! (`admin`), and what both share: the `Decider` that answers one call and the `response` it
//! builds. This floor is the only one that knows protobuf besides the composition root; it must
//! never choose a store or read settings (the server hands it plain values).

pub mod admin;
pub mod config;
pub mod decider;
pub mod json;
mod metadata;
mod plan;
pub mod quota;
pub mod response;
pub mod rls;
mod rule_metrics;
pub mod scaling;
mod validate;

pub use config::{HeaderNames, HeadersMode, ServiceConfig};
pub use decider::Decider;
pub use metadata::descriptor_names;
pub use plan::{LayerPlan, Planned};
pub use rls::RlsService;
