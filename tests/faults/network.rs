//! Faults between the service and Redis (a loopback proxy): connections cut, answers slower
//! than the deadline, a partition that heals; and Redis killed and restarted.

use super::*;

/// The service reaches Redis through a loopback proxy that injects the wire faults.
async fn behind_proxy(name: &'static str) -> (RedisServer, Proxy, Harness, Load, Vec<String>) {
    let redis = RedisServer::start();
    let proxy = Proxy::start(redis.port).await;
    let url = format!("redis://127.0.0.1:{}", proxy.port);
    let harness = Harness::start(name, &["--redis-url", &url], vec![redis.port]).await;
    let hot = hot_keys(None);
    let load = Load::start(&harness.client, &hot, &fresh_keys(None));
    tokio::time::sleep(Duration::from_secs(1)).await;
    (redis, proxy, harness, load, hot)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connections_cut_mid_call() {
    let (_redis, proxy, mut harness, load, hot) =
        behind_proxy("a connection reset mid-call every 100 ms for 2 s").await;
    let fault = Instant::now();
    for _ in 0..20 {
        proxy.cut_next_answer();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let healed = Instant::now();
    // The script had run when its answer was cut: those hits are charged, never admitted twice.
    let report = harness.finish(load, fault, healed, 0, &hot).await;
    assert!(proxy.cuts() >= 10, "cuts happened: {}", proxy.cuts());
    assert!(report.failure_answers > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn answers_slower_than_the_deadline() {
    let (_redis, proxy, mut harness, load, hot) =
        behind_proxy("300 ms added to every Redis answer for 1.5 s").await;
    let fault = Instant::now();
    proxy.delay_answers(Duration::from_millis(300));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    proxy.delay_answers(Duration::ZERO);
    let healed = Instant::now();
    let report = harness.finish(load, fault, healed, 0, &hot).await;
    assert!(report.failure_answers > 0, "the latency was felt");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partition_that_heals() {
    let (_redis, proxy, mut harness, load, hot) =
        behind_proxy("a partition (nothing crosses) for 2 s").await;
    let fault = Instant::now();
    proxy.partition(true);
    tokio::time::sleep(Duration::from_secs(2)).await;
    proxy.partition(false);
    let healed = Instant::now();
    let report = harness.finish(load, fault, healed, 0, &hot).await;
    assert!(report.failure_answers > 0, "the partition was felt");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_killed_and_restarted() {
    let mut redis = RedisServer::start();
    let (mut harness, load, hot) =
        standalone("Redis SIGKILLed, restarted 1 s later (empty)", &redis).await;
    let fault = Instant::now();
    redis.kill();
    tokio::time::sleep(Duration::from_secs(1)).await;
    tokio::task::block_in_place(|| redis.restart());
    let healed = Instant::now();
    // The restart lost every counter: a key being spent may be handed its budget once more.
    let report = harness.finish(load, fault, healed, 1, &hot).await;
    assert!(report.failure_answers > 0);
}
