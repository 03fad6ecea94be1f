//! How many pooled connections the standalone Redis store should hold: throughput of the store
//! with pools of 1, 2, 4 and 8 multiplexed connections under 64 concurrent callers, each reported
//! as a ratio to the 1-connection pool measured in the same run, against a redis-server this
//! benchmark starts on a loopback port.
//!
//!   cargo bench --bench redis_pool          full run (prints the table)
//!   cargo test --benches                    a short smoke run (checks it works, measures nothing)

#[path = "../tests/common/redis.rs"]
mod harness;

use std::sync::Arc;
use std::time::{Duration, Instant};

use portcullis::algorithm::{Algorithm, ChargeMode, Check, Limit, key};
use portcullis::store::redis::Topology;
use portcullis::store::{RedisStore, Store};

const CALLERS: usize = 64;

async fn calls_per_second(url: &str, pool_size: u32, calls_per_caller: usize) -> f64 {
    let config = harness::plain_config(Topology::Standalone(url.to_owned()), pool_size);
    let store = Arc::new(
        RedisStore::new(&config, &format!("bench{pool_size}:"), Default::default()).expect("store"),
    );
    let deadline = || tokio::time::Instant::now() + Duration::from_secs(5);
    let limit = Limit {
        algorithm: Algorithm::SlidingWindow,
        requests: 1_000_000_000,
        window_us: 60_000_000,
        burst: 1_000_000_000,
    };
    // Wait until every connection is made (in the background) so set-up is not measured.
    let warm = Check {
        key: key::counter_key("bench", [("warm", "up")], &limit, None),
        limit,
        hits: 1,
        refund: false,
        post_paid: false,
    };
    let mut answered = 0;
    for _ in 0..500 {
        let answers = store
            .check(
                std::slice::from_ref(&warm),
                deadline(),
                ChargeMode::EachAlone,
            )
            .await;
        if answers[0].is_ok() {
            answered += 1;
            if answered >= pool_size * 4 {
                break;
            }
        } else {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    assert!(
        answered >= pool_size * 4,
        "Redis never answered the warm-up"
    );
    let started = Instant::now();
    let tasks: Vec<_> = (0..CALLERS)
        .map(|caller| {
            let store = store.clone();
            tokio::spawn(async move {
                let value = caller.to_string();
                let check = Check {
                    key: key::counter_key("bench", [("caller", value.as_str())], &limit, None),
                    limit,
                    hits: 1,
                    refund: false,
                    post_paid: false,
                };
                for _ in 0..calls_per_caller {
                    let answers = store
                        .check(
                            std::slice::from_ref(&check),
                            deadline(),
                            ChargeMode::EachAlone,
                        )
                        .await;
                    answers[0].as_ref().expect("redis answers");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("caller");
    }
    (CALLERS * calls_per_caller) as f64 / started.elapsed().as_secs_f64()
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let redis = harness::RedisServer::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let calls_per_caller = if full { 1_500 } else { 10 };
    runtime.block_on(async {
        let baseline = calls_per_second(&redis.url(), 1, calls_per_caller).await;
        if !full {
            println!("redis_pool smoke run: {baseline:.0} calls/s with one connection");
            return;
        }
        println!(
            "store calls/s, {CALLERS} concurrent callers, {} calls each",
            calls_per_caller
        );
        println!("pool 1: {baseline:>9.0} calls/s  (baseline)");
        for pool in [2, 4, 8] {
            let rate = calls_per_second(&redis.url(), pool, calls_per_caller).await;
            println!("pool {pool}: {rate:>9.0} calls/s  {:.2}x", rate / baseline);
        }
    });
}
