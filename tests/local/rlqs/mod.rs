//! The quota service (RLQS) as a gateway's stream sees it, over gRPC against the real server on
//! a manual clock: a bucket matched to its rule gets a token bucket of the rule's rate; two
//! gateways share one rule without ever holding more than its rate together; buckets no enforced
//! rule limits are allowed; a malformed report ends its own stream and nothing else.
//!
//! What a gateway admits is charged into the rule's window at its next report (the one budget,
//! `tests/redis/one_budget.rs`): tests about shares have a stream's later reports say its requests
//! were refused (the same demand, nothing to charge), on a clock that does not move.

use crate::common;
mod limits;
mod rooms;
mod serving;
mod shares;
mod streams;

use std::time::Duration;

use crate::common::TestServer;
use crate::common::rlqs::{Gateway, Usage, assigned, await_streams, bucket, tokens_per_second};
use portcullis::pb::rlqs::{
    BucketAction, RateLimitQuotaServiceClient, RateLimitQuotaUsageReports, Strategy, bucket_action,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

const RULES: &str = "\
domain: edge
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: path
    value: /login
    rate_limit: {unit: minute, requests_per_unit: 6}
  - key: path
    value: /healthz
    rate_limit: {unlimited: true}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: api
    value: /api/*
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: 20}
  - key: plan
    value: fixed
    rate_limit: {unit: second, requests_per_unit: 10, algorithm: fixed_window}
  - key: plan
    value: bucket
    rate_limit: {unit: minute, requests_per_unit: 24, algorithm: token_bucket}
";

/// Gateways that report every second: assignments last 3 s. No pushes between reports: each
/// answer a test reads is the one to its report (`pushing_server` for pushes).
async fn server() -> TestServer {
    TestServer::start_with(&[("edge.yaml", RULES)], |s| {
        s.rlqs.rlqs = true;
        s.rlqs.rlqs_reporting_interval = Duration::from_secs(1);
        s.rlqs.rlqs_push_interval = Duration::ZERO;
    })
    .await
}

/// As `server`, with pushes every 100 ms.
async fn pushing_server() -> TestServer {
    TestServer::start_with(&[("edge.yaml", RULES)], |s| {
        s.rlqs.rlqs = true;
        s.rlqs.rlqs_reporting_interval = Duration::from_secs(1);
        s.rlqs.rlqs_push_interval = Duration::from_millis(100);
    })
    .await
}

/// Each action of an answer in words, by the bucket's `api` value.
fn by_api(actions: &[BucketAction]) -> std::collections::BTreeMap<String, String> {
    actions
        .iter()
        .map(|a| {
            let id = a.bucket_id.as_ref().expect("a bucket id");
            (id.bucket["api"].clone(), assigned(a))
        })
        .collect()
}
