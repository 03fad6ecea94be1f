//! Faults of one Redis the service talks to directly: paused, blocked by DEBUG SLEEP, its script
//! cache flushed, its memory full.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn client_pause_longer_than_the_deadline() {
    let redis = RedisServer::start();
    let (mut harness, load, hot) = standalone("CLIENT PAUSE 1.5 s", &redis).await;
    let fault = Instant::now();
    assert_eq!(
        cli_async(redis.port, &["CLIENT", "PAUSE", "1500", "ALL"]).await,
        "OK"
    );
    let healed = fault + Duration::from_millis(1500);
    tokio::time::sleep_until(healed.into()).await;
    let report = harness.finish(load, fault, healed, 0, &hot).await;
    assert!(report.failure_answers > 0, "the pause was felt");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn debug_sleep_blocks_redis() {
    let redis = RedisServer::start_with(&["--enable-debug-command", "yes"]);
    let (mut harness, load, hot) = standalone("DEBUG SLEEP 1.5 s", &redis).await;
    let fault = Instant::now();
    assert_eq!(
        cli_async(redis.port, &["DEBUG", "SLEEP", "1.5"]).await,
        "OK"
    );
    let healed = Instant::now();
    let report = harness.finish(load, fault, healed, 0, &hot).await;
    assert!(report.failure_answers > 0, "the sleep was felt");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn script_cache_flushed_under_load() {
    let redis = RedisServer::start();
    let (mut harness, load, hot) = standalone(
        "FUNCTION FLUSH and SCRIPT FLUSH every 50 ms for 2 s",
        &redis,
    )
    .await;
    let fault = Instant::now();
    for _ in 0..40 {
        assert_eq!(cli_async(redis.port, &["FUNCTION", "FLUSH"]).await, "OK");
        assert_eq!(cli_async(redis.port, &["SCRIPT", "FLUSH"]).await, "OK");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let healed = Instant::now();
    let report = harness.finish(load, fault, healed, 0, &hot).await;
    assert_eq!(
        report.failure_answers, 0,
        "a missing function is loaded again, NOSCRIPT answered by EVAL: no call goes to the \
         failure mode"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn maxmemory_reached_with_noeviction() {
    let redis = RedisServer::start_with(&["--maxmemory-policy", "noeviction"]);
    let (mut harness, load, hot) =
        standalone("maxmemory reached (noeviction) for 1.5 s", &redis).await;
    let fault = Instant::now();
    assert_eq!(
        cli_async(redis.port, &["CONFIG", "SET", "maxmemory", "1"]).await,
        "OK"
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        cli_async(redis.port, &["CONFIG", "SET", "maxmemory", "0"]).await,
        "OK"
    );
    let healed = Instant::now();
    let report = harness.finish(load, fault, healed, 0, &hot).await;
    assert!(report.failure_answers > 0, "writes were refused");
    // Said in words, counted, and the replica stays ready (every replica shares this Redis).
    assert!(
        harness.server.log().contains("OOM"),
        "{}",
        harness.server.log()
    );
    let (_, metrics) = http(harness.server.admin_port, "GET", "/metrics", "").await;
    assert!(
        sample(
            &metrics,
            r#"portcullis_store_errors_total{kind="unavailable"}"#
        ) > 0.0
    );
    assert_eq!(
        http(harness.server.admin_port, "GET", "/readyz", "")
            .await
            .0,
        200
    );
}
