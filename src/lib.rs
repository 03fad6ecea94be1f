//! Portcullis: a rate-limit service for Envoy and Istio (`envoy.service.ratelimit.v3`).
//!
//! The request path reads top-down: `service` (gRPC, validation, responses) → `rules` (which
//! limit applies) → `limiter` (the math, the `Check`/`Decision` types) → `store` (where the
//! counters live). `main.rs` only parses arguments and calls into this library.

pub mod admin;
pub mod clock;
pub mod limiter;
pub mod pb;
pub mod rules;
pub mod service;
pub mod settings;
pub mod store;
pub mod telemetry;
