//! The binary run as envoyproxy/ratelimit's image runs it: `/bin/ratelimit`, no flags, the Go
//! service's environment variables. Each test gives it a Go-style environment for one Redis
//! layout and checks what a Deployment written for the Go service relies on: the config tree
//! under RUNTIME_ROOT, the ports (GRPC_PORT, PORT with /healthcheck and /json, DEBUG_PORT with
//! /rlconfig), fixed-window counting, and the Go service's stat names over statsd and Prometheus.

use crate::common;
mod otlp;
mod stats;
mod stores;
mod variables;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::common::process::ServeProcess;
use crate::common::redis::{RedisCluster, RedisSentinel, RedisServer, cli, free_port};
use crate::common::request;
use portcullis::pb::RateLimitServiceClient;
use portcullis::pb::rate_limit_response::Code;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

/// Three calls a day per user: the Go service's file format, no `algorithm` (so fixed window).
const RULES: &str = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: day\n      requests_per_unit: 3\n";

/// The Go config tree: RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY (default `config`).
fn config_tree() -> tempfile::TempDir {
    let root = tempfile::tempdir().expect("temp dir");
    let dir = root.path().join("current/ratelimit/config");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("edge.yaml"), RULES).unwrap();
    root
}

/// The variables every test sets: loopback listeners on free ports, the runtime tree, no statsd
/// (the Go default would send to localhost:8125).
fn go_env(root: &Path) -> Vec<(&'static str, String)> {
    vec![
        ("HOST", "127.0.0.1".into()),
        ("PORT", free_port().to_string()),
        ("GRPC_HOST", "127.0.0.1".into()),
        ("GRPC_PORT", free_port().to_string()),
        ("DEBUG_HOST", "127.0.0.1".into()),
        ("DEBUG_PORT", free_port().to_string()),
        (
            "RUNTIME_ROOT",
            root.join("current").to_string_lossy().into_owned(),
        ),
        ("RUNTIME_SUBDIRECTORY", "ratelimit".into()),
        ("USE_STATSD", "false".into()),
        ("LOG_LEVEL", "info".into()),
        // Go's bound on each Redis command, and so each decision's deadline: 2 s, as the tests of
        // the in-process server have, not Portcullis' 15 ms. These tests are about what Go users
        // rely on, not deadlines; a debug build on a 2-core machine busy with three other tests
        // took more than 15 ms for a call now and then ("no answer within 15ms").
        ("REDIS_TIMEOUT", "2s".into()),
    ]
}

fn var(envs: &[(&str, String)], name: &str) -> u16 {
    envs.iter()
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.parse().unwrap())
        .unwrap()
}

use crate::common::http;

/// Waits past a UTC day boundary if one is under a minute away, so the day's fixed window cannot
/// turn over in the middle of a test.
fn clear_of_day_boundary() {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let left = 86_400 - now.as_secs() % 86_400;
    if left < 60 {
        std::thread::sleep(Duration::from_secs(left + 1));
    }
}

/// Waits (bounded: 10 s) until the Go health path on `port` answers 200: the replica is ready
/// (Redis answered).
async fn await_healthy(server: &ServeProcess, port: u16) {
    for _ in 0..200 {
        if http(port, "GET", "/healthcheck", "").await.0 == 200 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("not ready within 10 s: {}", server.log());
}

/// What a Go deployment relies on, against whichever Redis `envs` names: three calls admitted,
/// the fourth refused (fixed window), the Go endpoints on the Go ports.
async fn serves_like_the_go_service(server: &ServeProcess, envs: &[(&str, String)], user: &str) {
    clear_of_day_boundary();
    // Kubernetes sends traffic once the readiness probe (the Go Deployment's /healthcheck) says
    // Redis answered; a call before that is answered by the failure mode, as it should be.
    let port = var(envs, "PORT");
    await_healthy(server, port).await;
    let mut client = RateLimitServiceClient::connect(server.grpc_url())
        .await
        .expect("connect to GRPC_PORT");
    let mut codes = Vec::new();
    for _ in 0..4 {
        let answer = client
            .should_rate_limit(request("edge", &[&[("user", user)]]))
            .await
            .unwrap_or_else(|e| panic!("call failed: {e}\n{}", server.log()))
            .into_inner();
        codes.push(answer.overall_code);
    }
    assert_eq!(codes, [OK, OK, OK, OVER], "{}", server.log());

    assert_eq!(
        http(port, "GET", "/healthcheck", "").await,
        (200, "OK".into())
    );
    let body = format!(
        r#"{{"domain":"edge","descriptors":[{{"entries":[{{"key":"user","value":"{user}"}}]}}]}}"#
    );
    let (status, answer) = http(port, "POST", "/json", &body).await;
    assert_eq!(status, 429, "{answer}");
    assert!(answer.contains("OVER_LIMIT"), "{answer}");

    let (status, listing) = http(var(envs, "DEBUG_PORT"), "GET", "/rlconfig", "").await;
    assert_eq!(status, 200);
    assert!(listing.contains("edge.user"), "{listing}");
    let (status, stats) = http(var(envs, "DEBUG_PORT"), "GET", "/stats", "").await;
    assert_eq!(status, 200);
    assert!(
        stats
            .lines()
            .any(|l| l == "ratelimit.service.rate_limit.edge.user.over_limit: 2"),
        "{stats}"
    );
}
