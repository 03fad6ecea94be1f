//! Redis connections as production sees them: a slow TLS or cross-zone handshake, one slow reply,
//! a wrong password, sockets' options, sentinels with credentials and TLS of their own, and a slow
//! Cluster node. Every test starts its own `redis-server` processes on loopback.

use crate::common;
mod setup;
mod slow;

use std::time::{Duration, Instant};

use crate::common::process::ServeProcess;
use crate::common::proxy::Proxy;
use crate::common::redis::{RedisCluster, RedisServer, cli, free_port, require_redis, wait_until};
use crate::common::{TestServer, request};
use portcullis::limiter::FailureMode;
use portcullis::pb::rate_limit_response::Code;
use portcullis::settings::{Secret, StoreKind};

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

const RULES: &str = r#"
domain: c
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 5}
"#;

fn key(value: &str) -> String {
    format!("portcullis:{{c|k={value}}}:sw60:3600000000us")
}

/// Whether Redis (not the failure mode) decided a call: its counter exists on `port`.
fn counted(port: u16, value: &str) -> bool {
    cli(port, &["EXISTS", &key(value)]) == "1"
}

async fn http_get(port: u16, path: &str) -> (u16, String) {
    common::http(port, "GET", path, "").await
}

/// Calls until one is decided by Redis: connections are made in the background, and under load
/// that can take longer than a short call deadline.
async fn until_decided_by_redis(server: &TestServer, port: u16) {
    let start = Instant::now();
    for n in 0.. {
        let value = format!("connected-{n}");
        server.ok(request("c", &[&[("k", &value)]])).await;
        if counted(port, &value) {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "never connected");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn connections_received(port: u16) -> u64 {
    cli(port, &["INFO", "stats"])
        .lines()
        .find_map(|l| l.strip_prefix("total_connections_received:"))
        .expect("INFO stats")
        .trim()
        .parse()
        .unwrap()
}
