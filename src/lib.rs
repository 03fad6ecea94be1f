//! Portcullis: a rate-limit service for Envoy and Istio (`envoy.service.ratelimit.v3`).
//!
//! The crate is built in floors; each module imports only from floors below it (checked by
//! `tests/local/floors.rs`, drawn in `ARCHITECTURE.md`). Top-down, the way a request flows:
//!
//! - `server`: the composition root, from `Settings` to running listeners and watchers;
//! - `settings`: the command line and environment;
//! - `service`: the faces (gRPC `rls`, the `admin` HTTP listener) and the `Decider` of one call;
//! - `limiter`: the policy over a store (deadline, failure modes, deny cache);
//! - `rules` (which limit applies) and `store` (where counters live: memory or Redis);
//! - `algorithm` (the pure rate-limit math), `clock`, `duration` (the one duration syntax), `pb`
//!   (generated protos), `telemetry`.
//!
//! `main.rs` only parses arguments and calls into this library.

pub mod algorithm;
pub mod clock;
pub mod duration;
pub mod limiter;
pub mod pb;
pub mod review;
pub mod rules;
pub mod server;
pub mod service;
pub mod settings;
pub mod store;
pub mod telemetry;
