//! The tests that need neither Redis nor Envoy: the service in process on the memory store (a
//! manual clock), the binary run as users run it, the command line, the rules commands, the
//! shipped deployment files and the source tree's own rules. One binary, a module per journey
//! (docs/testing.md says how the suite is grouped and how to run one group).

#[path = "../common/mod.rs"]
mod common;

mod cli;
mod config_reference;
mod deploy;
mod floors;
mod fuzz;
mod host_clock;
mod mtls;
mod observability;
mod readiness;
mod reload;
mod rlqs;
mod rules_diff;
mod rules_mode;
mod rules_review;
mod service;
mod shutdown;
mod xds;
