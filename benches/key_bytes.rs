//! What a counter costs in Redis: N keys per algorithm met once (one hit) and N busy ones (a
//! minute rule; every sliding-window sub-window live, one hit in each of 61 seconds), then bytes
//! per key two ways: Redis' `used_memory` grown over N, and `MEMORY USAGE` of the keys
//! themselves (a sample). Every algorithm is measured in both layouts (`--redis-layout`: packed,
//! one string; hash, 0.1.0's), in the same run, against a redis-server this benchmark starts on
//! a loopback port. docs/redis.md sizes Redis
//! from this table (BENCHMARKS.md keeps the run).
//!
//!   cargo bench --bench key_bytes          full run: 20,000 keys per row
//!   cargo test --benches                   a short smoke run (200 keys)

#[path = "../tests/common/redis.rs"]
mod harness;

use std::time::Duration;

use portcullis::algorithm::{Algorithm, ChargeMode, Check, Limit, key};
use portcullis::store::RedisStore;
use portcullis::store::redis::{Layout, ScriptClock, Topology};

/// 2100-01-01: a clock far from the host's, so no key expires by wall time while measured.
const START_US: u64 = 4_102_444_800_000_000;
/// Keys per script call.
const BATCH: usize = 200;

fn used_memory(port: u16) -> u64 {
    harness::cli(port, &["INFO", "memory"])
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("used_memory")
}

/// N busy keys of `algorithm` under `prefix`: (used_memory delta / N, mean MEMORY USAGE).
async fn row(
    port: u16,
    prefix: &str,
    algorithm: Algorithm,
    layout: Layout,
    keys: usize,
    seconds: u64,
) -> (f64, f64) {
    let config =
        harness::plain_config(Topology::Standalone(format!("redis://127.0.0.1:{port}")), 1);
    let store = RedisStore::new(&config, prefix, Default::default())
        .expect("store")
        .with_layout(layout);
    store.probe(Duration::from_secs(10)).await.expect("Redis");
    let limit = Limit {
        algorithm,
        requests: 1000,
        window_us: 60_000_000,
        burst: 1000,
    };
    let checks: Vec<Check> = (0..keys)
        .map(|i| Check {
            key: key::counter_key(
                "bench",
                [("user", format!("user-{i}").as_str())],
                &limit,
                None,
            ),
            limit,
            hits: 1,
            refund: false,
            post_paid: false,
        })
        .collect();
    let before = used_memory(port);
    // One hit a second for `seconds` seconds: 61 leave every sliding-window sub-window live, 1
    // is a key met once (a rule keyed by user).
    for second in 0..seconds {
        let now = ScriptClock::Fixed(START_US + second * 1_000_000);
        for batch in checks.chunks(BATCH) {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            for answer in store
                .check_with_clock(batch, now, deadline, ChargeMode::EachAlone)
                .await
            {
                assert!(answer.expect("Redis answers").allowed);
            }
        }
    }
    let grown = used_memory(port).saturating_sub(before) as f64 / keys as f64;
    let sample: Vec<u64> = checks
        .iter()
        .step_by((keys / 100).max(1))
        .map(|c| {
            harness::cli(port, &["MEMORY", "USAGE", &store.redis_key(c)])
                .parse()
                .expect("MEMORY USAGE")
        })
        .collect();
    let usage = sample.iter().sum::<u64>() as f64 / sample.len() as f64;
    (grown, usage)
}

fn main() {
    let smoke = std::env::args().all(|a| a != "--bench");
    let keys = if smoke { 200 } else { 20_000 };
    let redis = harness::RedisServer::start();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    println!(
        "{keys} keys per row (a minute rule): met once (one hit), and busy (a hit in each of 61 \
         seconds), Redis {}",
        harness::cli(redis.port, &["INFO", "server"])
            .lines()
            .find_map(|l| l.strip_prefix("redis_version:"))
            .unwrap_or("?")
            .trim()
    );
    println!(
        "| algorithm | layout | one hit: used_memory / key | MEMORY USAGE / key | busy: \
         used_memory / key | MEMORY USAGE / key |"
    );
    println!("|---|---|---|---|---|---|");
    let mut rows = Vec::new();
    for (name, algorithm) in [
        ("sliding window", Algorithm::SlidingWindow),
        ("token bucket", Algorithm::TokenBucket),
        ("fixed window", Algorithm::FixedWindow),
    ] {
        rows.push((name, "packed (a string)", algorithm, Layout::Packed));
        rows.push((name, "hash (0.1.0's)", algorithm, Layout::Hash));
    }
    for (i, (name, layout_name, algorithm, layout)) in rows.into_iter().enumerate() {
        let mut cells = Vec::new();
        for seconds in [1, 61] {
            let prefix = format!("kb{i}s{seconds}:");
            let (grown, usage) =
                runtime.block_on(row(redis.port, &prefix, algorithm, layout, keys, seconds));
            cells.push(format!("{grown:.0} B | {usage:.0} B"));
            harness::cli(redis.port, &["FLUSHALL"]);
        }
        println!("| {name} | {layout_name} | {} | {} |", cells[0], cells[1]);
    }
}
