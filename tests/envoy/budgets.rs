//! LLM token budgets behind a real Envoy 1.40, with README's config, set up as Envoy Gateway and
//! Envoy AI Gateway set them up: the ratelimit filter's own `rate_limits` hold a check on the request path
//! (`hits_addend: {number: 0}`) and the real cost, charged when the stream is done
//! (`apply_on_stream_done: true`, `hits_addend` from dynamic metadata that the upstream's usage
//! sets). 100 tokens an hour, 40 tokens a response: three requests pass, the fourth is refused.
//! Natively with `post_paid: true` (memory store, standalone Redis, Cluster), and in the Go drop-in mode
//! with the Go service's rules unchanged (Redis).

use crate::common;

use std::path::Path;
use std::time::Duration;

use crate::common::envoy::{self, Gateway};
use crate::common::process::ServeProcess;
use crate::common::redis::{RedisCluster, RedisServer, free_port};
use portcullis::pb::RateLimitServiceClient;

const NATIVE_RULES: &str = "domain: llm\ndescriptors:\n  - key: budget\n    post_paid: true\n    rate_limit: {unit: hour, requests_per_unit: 100}\n";

const GO_RULES: &str = "domain: llm\ndescriptors:\n  - key: budget\n    rate_limit:\n      unit: hour\n      requests_per_unit: 100\n";

/// The gateway with README's filters, as a user copies them ("LLM token budgets behind Envoy"):
/// a Lua filter that puts the upstream's usage into dynamic metadata, and the ratelimit filter's
/// own rate limits, a check on the request and the tokens when the stream is done.
fn gateway(grpc_port: u16) -> Gateway {
    let mut g = Gateway::new("llm", &[grpc_port]);
    g.http_filters = envoy::readme_envoy_blocks()
        .into_iter()
        .find(|b| b.contains("apply_on_stream_done"))
        .expect("README's token-budget filters");
    g.app_headers = vec![("x-usage-tokens".into(), "40".into())];
    g
}

/// What remains of the budget, asked with a check-only call (which spends nothing).
async fn remaining(grpc_port: u16) -> u32 {
    let mut client = RateLimitServiceClient::connect(format!("http://127.0.0.1:{grpc_port}"))
        .await
        .expect("connect");
    let mut probe = common::request("llm", &[&[("budget", "tenant-a")]]);
    probe.descriptors[0].hits_addend = Some(0);
    let answer = client.should_rate_limit(probe).await.expect("answered");
    answer.into_inner().statuses[0].limit_remaining
}

/// Requests through Envoy, each after the previous one's tokens were charged (Envoy charges when
/// the stream is done, after the client has its answer): the statuses.
async fn run_budget(g: &Gateway, grpc_port: u16) -> Vec<u16> {
    let mut statuses = Vec::new();
    for request in 0..5u32 {
        let r = envoy::get(g.ingress_addr(), None, "/v1/chat/completions", &[]).await;
        statuses.push(r.status);
        if r.status != 200 {
            continue;
        }
        let expected = 100u32.saturating_sub(40 * (request + 1));
        let started = std::time::Instant::now();
        while remaining(grpc_port).await != expected {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "the tokens of response {request} were never charged (remaining {}, expected {expected})",
                remaining(grpc_port).await
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    statuses
}

fn rules_dir(rules: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("llm.yaml"), rules).expect("write rules");
    dir
}

/// README's gateway in front of `portcullis serve` with `store_args` and the native rules:
/// 40, 80, then 120 of 100 tokens recorded, so the fourth request is refused, and every later one.
async fn native_budget_is_enforced(store_args: &[&str]) {
    let rules = rules_dir(NATIVE_RULES);
    let portcullis = ServeProcess::spawn(rules.path(), store_args, &[], &[]);
    let g = gateway(portcullis.grpc_port);
    let _envoy = g.start();
    assert_eq!(
        run_budget(&g, portcullis.grpc_port).await,
        vec![200, 200, 200, 429, 429],
        "{store_args:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_budget_charged_at_stream_end_is_enforced_on_memory() {
    native_budget_is_enforced(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_budget_charged_at_stream_end_is_enforced_on_redis() {
    let redis = RedisServer::start();
    native_budget_is_enforced(&["--store", "redis", "--redis-url", &redis.url()]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_budget_charged_at_stream_end_is_enforced_on_cluster() {
    let cluster = RedisCluster::start();
    let seeds = cluster.seeds().join(",");
    native_budget_is_enforced(&["--store", "redis", "--redis-cluster", &seeds]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_go_drop_in_mode_counts_every_hit_as_the_go_service_does() {
    common::clear_of_hour_boundary();
    let redis = RedisServer::start();
    let root = tempfile::tempdir().expect("temp dir");
    let dir = root.path().join("current/ratelimit/config");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("llm.yaml"), GO_RULES).unwrap();
    let grpc_port = free_port();
    let envs = vec![
        ("HOST", "127.0.0.1".to_owned()),
        ("PORT", free_port().to_string()),
        ("GRPC_HOST", "127.0.0.1".into()),
        ("GRPC_PORT", grpc_port.to_string()),
        ("DEBUG_HOST", "127.0.0.1".into()),
        ("DEBUG_PORT", free_port().to_string()),
        (
            "RUNTIME_ROOT",
            path_str(&root.path().join("current")).to_owned(),
        ),
        ("RUNTIME_SUBDIRECTORY", "ratelimit".into()),
        ("USE_STATSD", "false".into()),
        ("REDIS_SOCKET_TYPE", "tcp".into()),
        ("REDIS_URL", format!("127.0.0.1:{}", redis.port)),
        // Each decision's deadline (Go's REDIS_TIMEOUT), 2 s as in the other Go-mode tests: a first
        // call past the default 15 ms on a loaded machine was answered UNAVAILABLE.
        ("REDIS_TIMEOUT", "2s".into()),
    ];
    let _portcullis = ServeProcess::spawn_as_ratelimit(&envs);
    let g = gateway(grpc_port);
    let _envoy = g.start();
    assert_eq!(
        run_budget(&g, grpc_port).await,
        vec![200, 200, 200, 429, 429]
    );
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}
