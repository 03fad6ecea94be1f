//! Hot counters (`--hot-descriptor-rate`) through a real process's stop: a replica drained by
//! SIGTERM while calls keep arriving gives back every claimed hit it did not admit, so that the
//! counter in Redis holds exactly what it admitted once the process has exited. A claim taken
//! after the final give-back (an in-flight call finishing during the stop) would stay counted
//! and never be admitted.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use portcullis::pb::rate_limit_response::Code;

use crate::common::process::ServeProcess;
use crate::common::redis::{RedisServer, cli};
use crate::common::{http, request, sample};

const RULES: &str = "\
domain: hot
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 1000000, algorithm: fixed_window}
";

/// Calls `k=v` as fast as it can until the process stops answering (or 20 s pass); counts the
/// calls admitted.
async fn caller(url: String, admitted: Arc<AtomicU64>, go: Arc<AtomicBool>) {
    let Ok(mut client) = portcullis::pb::RateLimitServiceClient::connect(url).await else {
        return;
    };
    let start = Instant::now();
    while go.load(Ordering::Relaxed) && start.elapsed() < Duration::from_secs(20) {
        match client
            .should_rate_limit(request("hot", &[&[("k", "v")]]))
            .await
        {
            Ok(r) => {
                assert_eq!(r.into_inner().overall_code, Code::Ok as i32);
                admitted.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => return,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_replica_gives_back_every_hit_it_did_not_admit() {
    let redis = RedisServer::start();
    crate::hot::inside_one_minute(redis.port).await;
    let rules = tempfile::tempdir().unwrap();
    std::fs::write(rules.path().join("hot.yaml"), RULES).unwrap();
    let url = redis.url();
    let mut server = ServeProcess::spawn(
        rules.path(),
        &[
            "--store",
            "redis",
            "--redis-url",
            url.as_str(),
            "--store-timeout",
            "2s",
            "--hot-descriptor-rate",
            "20",
            "--drain-period",
            "300ms",
        ],
        &[],
        &[],
    );
    let admitted = Arc::new(AtomicU64::new(0));
    let go = Arc::new(AtomicBool::new(true));
    let callers: Vec<_> = (0..8)
        .map(|_| tokio::spawn(caller(server.grpc_url(), admitted.clone(), go.clone())))
        .collect();
    // Calls on a claim: the replica holds one on the counter.
    let started = Instant::now();
    loop {
        let (_, metrics) = http(server.admin_port, "GET", "/metrics", "").await;
        if sample(&metrics, "portcullis_hot_decisions_total") > 500.0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no calls answered from a claim: {metrics}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Stopped while the calls keep coming: they go on through the drain period and end when
    // the process stops answering.
    server.signal("TERM");
    let exit = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "did not exit");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    go.store(false, Ordering::Relaxed);
    for c in callers {
        c.await.unwrap();
    }
    assert_eq!(exit.code(), Some(0), "{}", server.log());
    let keys = cli(redis.port, &["KEYS", "*"]);
    let key = keys
        .lines()
        .find(|k| k.contains("k=v") || k.contains("k_v"))
        .unwrap_or_else(|| panic!("the counter's key among {keys:?}"));
    let counted: u64 = crate::common::redis::fixed_count(redis.port, key)
        .trim()
        .parse()
        .unwrap();
    let admitted = admitted.load(Ordering::Relaxed);
    assert!(admitted > 500, "{admitted} admitted");
    assert_eq!(
        counted,
        admitted,
        "the counter holds what was admitted once the replica stopped (claimed hits not given \
         back: {})",
        counted as i64 - admitted as i64
    );
}
