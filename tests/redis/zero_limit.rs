//! A limit at zero (a reload that blocks a descriptor, gateways' claims that take the whole window)
//! keeps its counter as it was for when the limit comes back, on the memory store and on Redis:
//! charges and refunds there change nothing, and post-paid hits (consumption that happened, an
//! LLM's tokens) are recorded in a window's counter. Forgetting either hands spent budget out
//! again when the limit returns.

use std::sync::Arc;
use std::time::Duration;

use crate::common::redis::{RedisServer, connected_store};
use portcullis::algorithm::{Algorithm, ChargeMode, Check, Limit, key};
use portcullis::clock::SystemClock;
use portcullis::store::redis::Topology;
use portcullis::store::{MemoryStore, Store};
use tokio::time::Instant;

fn limit(algorithm: Algorithm, requests: u64) -> Limit {
    Limit {
        algorithm,
        requests,
        window_us: 3_600_000_000,
        burst: requests,
    }
}

/// One check on user `who`'s counter (the key does not name the number of requests, so a reload
/// that changes it keeps the counter, as in production).
fn check(algorithm: Algorithm, requests: u64, hits: u64, kind: &str) -> Check {
    let limit = limit(algorithm, requests);
    Check {
        key: key::counter_key("zero", [("user", "who")], &limit, None),
        limit,
        hits,
        refund: kind == "refund",
        post_paid: kind == "post_paid",
    }
}

async fn allowed(store: &dyn Store, check: Check) -> bool {
    let answers = store
        .check(
            std::slice::from_ref(&check),
            Instant::now() + Duration::from_secs(2),
            ChargeMode::EachAlone,
        )
        .await;
    answers[0].as_ref().expect("the store answers").allowed
}

/// 5 of 10 spent; the limit goes to 0 while 3 post-paid hits arrive and 4 are refunded; back at
/// 10, what was spent still counts.
async fn zero_keeps_the_counter(store: &dyn Store, algorithm: Algorithm) {
    let name = format!("{algorithm:?} on {}", store.name());
    assert!(
        allowed(store, check(algorithm, 10, 5, "post_paid")).await,
        "{name}"
    );
    // At zero: refused, whatever the kind.
    assert!(
        !allowed(store, check(algorithm, 0, 3, "post_paid")).await,
        "{name}"
    );
    assert!(
        !allowed(store, check(algorithm, 0, 1, "charge")).await,
        "{name}"
    );
    assert!(
        allowed(store, check(algorithm, 0, 4, "refund")).await,
        "{name}"
    );
    // Back at 10: a window holds 5 + 3 (the refund at zero gave nothing back); a token bucket,
    // which has no rate to record the post-paid hits at, still holds its 5.
    let spent = if algorithm == Algorithm::TokenBucket {
        5
    } else {
        8
    };
    let left = 10 - spent;
    assert!(
        !allowed(store, check(algorithm, 10, left + 1, "charge")).await,
        "{name}: {} passed with {spent} spent",
        left + 1
    );
    assert!(
        allowed(store, check(algorithm, 10, left, "charge")).await,
        "{name}"
    );
}

const ALGORITHMS: [Algorithm; 3] = [
    Algorithm::SlidingWindow,
    Algorithm::FixedWindow,
    Algorithm::TokenBucket,
];

#[tokio::test]
async fn the_memory_store_keeps_a_zero_limits_counter() {
    for algorithm in ALGORITHMS {
        let store = MemoryStore::new(Arc::new(SystemClock::default()));
        zero_keeps_the_counter(&store, algorithm).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_keeps_a_zero_limits_counter() {
    let redis = RedisServer::start();
    for (i, algorithm) in ALGORITHMS.into_iter().enumerate() {
        let prefix = format!("zero{i}:");
        let store = connected_store(Topology::Standalone(redis.url()), &prefix).await;
        zero_keeps_the_counter(&store, algorithm).await;
    }
}
