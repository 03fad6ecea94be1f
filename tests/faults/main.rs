//! Faults injected into real Redis while load runs through the real binary: what callers see.
//!
//! Each scenario starts its own `redis-server` processes and `portcullis serve` (failure mode
//! `deny`, so an admission can only come from Redis), drives paced gRPC load over rotating hot keys
//! and a pool of fresh keys, injects one fault, heals it, and holds the service to the contract:
//! every call answered within the deadline (by Redis or by the failure mode), no more admitted than
//! the budget (or, where the fault loses Redis data, than what the lost data held), correct
//! decisions soon after the fault heals, and no task, descriptor or Redis connection left behind.
//! Each prints one `FAULT` line with its figures (RELIABILITY.md's table comes from them). The
//! scenarios run one at a time (a lock): their latency figures would otherwise measure each other.

mod cluster;
#[path = "../common/mod.rs"]
mod common;
mod harness;
mod load;
mod network;
mod soak;
mod standalone;

use harness::*;
use load::*;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::process::ServeProcess;
use common::proxy::Proxy;
use common::redis::{RedisCluster, RedisSentinel, RedisServer, cli, wait_until};
use common::{http, request, sample};
use portcullis::pb::RateLimitServiceClient;
use portcullis::pb::rate_limit_response::Code;
use portcullis::store::redis::cluster_batch::slot_of;
use tonic::transport::Channel;

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

/// Admissions each hot key allows in its hour.
const BUDGET: u64 = 50;
/// The store deadline (`--store-timeout`).
const DEADLINE: Duration = Duration::from_millis(100);
/// What a call may take past the deadline on a busy 2-core machine (scheduling, gRPC both ways).
const SLACK: Duration = Duration::from_millis(400);
/// Each hot key is the target for this long, then the next one takes over: the budget of some
/// key is being spent whenever the fault strikes.
const PHASE: Duration = Duration::from_millis(250);
const WORKERS: usize = 8;
/// Pause between two calls of one worker (8 workers: about 1,600 calls a second offered).
const PACE: Duration = Duration::from_millis(5);

const RULES: &str = r#"
domain: faults
descriptors:
  - key: hot
    rate_limit: {unit: hour, requests_per_unit: 50}
  - key: fresh
    rate_limit: {unit: hour, requests_per_unit: 100000}
  - key: probe
    rate_limit: {unit: hour, requests_per_unit: 2}
"#;

/// One scenario at a time (see the module comment).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The counter key of `key=value` in the `faults` domain (the Redis key the store writes).
fn tag(key: &str, value: &str) -> String {
    format!("faults|{key}={value}")
}

/// `n` values of `key` whose counters live in `slot` (all of them, when `slot` is None).
fn values_in_slot(key: &str, prefix: &str, slot: Option<u16>, n: usize) -> Vec<String> {
    (0..5_000_000u32)
        .map(|i| format!("{prefix}{i}"))
        .filter(|v| slot.is_none_or(|s| slot_of(&tag(key, v)) == s))
        .take(n)
        .collect()
}

#[derive(Clone, Copy)]
enum Answer {
    /// Decided by Redis: admitted or refused by the rule.
    Redis { admitted: bool },
    /// The failure mode (`deny`: refused, retry in a second).
    FailureMode,
}

fn hot_keys(slot: Option<u16>) -> Vec<String> {
    values_in_slot("hot", "h", slot, 120)
}

fn fresh_keys(slot: Option<u16>) -> Vec<String> {
    values_in_slot("fresh", "f", slot, 200)
}

/// The standalone scenarios: one Redis, the service on it, load running for a second.
async fn standalone(name: &'static str, redis: &RedisServer) -> (Harness, Load, Vec<String>) {
    let url = redis.url();
    let harness = Harness::start(name, &["--redis-url", &url], vec![redis.port]).await;
    let hot = hot_keys(None);
    let load = Load::start(&harness.client, &hot, &fresh_keys(None));
    tokio::time::sleep(Duration::from_secs(1)).await;
    (harness, load, hot)
}

/// Runs the blocking `redis-cli` off the runtime's workers (the load runs on them).
async fn cli_async(port: u16, args: &[&str]) -> String {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        cli(port, &args)
    })
    .await
    .expect("redis-cli")
}
