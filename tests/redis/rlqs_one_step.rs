//! The room a report reads and the grant it makes, in one step on Redis (issue 43 item 4): the
//! quota script reads each window's count itself, so what RLS counted (or another report
//! charged) after the report's look and before its grant is not granted again. Before, the
//! grant used the look's count: a window RLS spent in between was handed out twice.

use std::time::Duration;

use crate::common::redis::{RedisCluster, RedisServer, cli, connected_store};
use portcullis::algorithm::share::{Room, quantize};
use portcullis::algorithm::{Algorithm, ChargeMode, Check, Limit};
use portcullis::store::Store;
use portcullis::store::quota::{Ask, AskKind};
use portcullis::store::redis::{ScriptClock, Topology};
use tokio::time::Instant;

const MINUTE: u64 = 60_000_000;
const TTL: u64 = 11_000_000;

/// Redis' clock on `port`, in µs.
fn redis_now(port: u16) -> u64 {
    let time = cli(port, &["TIME"]);
    let mut parts = time.lines().map(|l| l.trim().parse::<u64>().unwrap());
    parts.next().unwrap() * 1_000_000 + parts.next().unwrap()
}

/// A report's look found 10 of a minute's 10 left; RLS then counts 9 there; the grant (a
/// gateway alone, asking for far more) fits in the 1 left over the part of the grant the
/// window holds, as the script's own read finds it.
async fn granted_beside_rls(
    store: &portcullis::store::RedisStore,
    port_of: &dyn Fn(&str) -> u16,
    algorithm: Algorithm,
) {
    let tag = format!("{{step|{algorithm:?}}}");
    let counter = format!("{tag}:c");
    let limit = Limit {
        algorithm,
        requests: 10,
        window_us: MINUTE,
        burst: 10,
    };
    let port = port_of(&format!("q:{counter}"));
    // Not within 2 s of a minute's end: the check and the grant count in one fixed window (a
    // bounded wait for the next one).
    let started = std::time::Instant::now();
    while MINUTE - redis_now(port) % MINUTE < 2_000_000 {
        assert!(started.elapsed() < Duration::from_secs(3));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    let rls = Check {
        key: counter.clone(),
        limit,
        hits: 9,
        refund: false,
        post_paid: false,
    };
    let answer = store
        .check(&[rls], deadline, ChargeMode::EachAlone)
        .await
        .remove(0)
        .expect("RLS decided");
    assert!(answer.allowed);
    let now = redis_now(port);
    let ask = Ask {
        key: tag,
        capacity: 10.0,
        gateway: 7,
        demand: 100.0,
        ttl_us: TTL,
        kind: AskKind::Grant,
        charged: true,
        window_us: MINUTE,
        shortest_us: MINUTE,
        // As the look read it, before RLS counted its 9.
        rooms: vec![Room {
            limit,
            left: 10,
            charged: 0,
            span_us: TTL,
        }],
        counters: vec![counter],
    };
    let granted = store
        .grant_with_clock(&[ask], ScriptClock::Fixed(now), deadline)
        .await
        .remove(0)
        .expect("granted")
        .map_or(0.0, |t| t.per_second());
    let span_us = match algorithm {
        Algorithm::FixedWindow => TTL.min(MINUTE - now % MINUTE),
        _ => TTL,
    };
    let one_left = quantize(1e6 / span_us as f64).map_or(0.0, |t| t.per_second());
    assert_eq!(
        granted, one_left,
        "{algorithm:?}: {granted}/s where 1 is left over {span_us} us"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_reads_its_windows_in_its_own_step_on_standalone_and_cluster() {
    let redis = RedisServer::start();
    let store = connected_store(Topology::Standalone(redis.url()), "q:").await;
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
        granted_beside_rls(&store, &|_| redis.port, algorithm).await;
    }
    let cluster = RedisCluster::start();
    let store = connected_store(Topology::Cluster(cluster.seeds()), "q:").await;
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
        granted_beside_rls(&store, &|key| cluster.master_of(key), algorithm).await;
    }
}

/// Redis' calls of `verb` since the last `CONFIG RESETSTAT`.
fn calls(port: u16, verb: &str) -> u64 {
    cli(port, &["INFO", "commandstats"])
        .lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{verb}:calls=")))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

/// The quota script (43 KB: it carries the windows' files) goes by its SHA, not whole at every
/// report; a node whose script cache was emptied (a restart, a promotion, SCRIPT FLUSH) is sent
/// it again by EVAL, and the grant stands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quota_script_is_sent_by_its_sha() {
    let redis = RedisServer::start();
    let store = connected_store(Topology::Standalone(redis.url()), "q:").await;
    let ask = Ask {
        key: "{sha|t=a}".into(),
        capacity: 10.0,
        gateway: 7,
        demand: 5.0,
        ttl_us: TTL,
        kind: AskKind::Grant,
        charged: true,
        window_us: MINUTE,
        shortest_us: MINUTE,
        rooms: Vec::new(),
        counters: Vec::new(),
    };
    let deadline = || Instant::now() + Duration::from_secs(5);
    let grant = || async {
        use portcullis::store::quota::QuotaStore;
        store
            .grant(std::slice::from_ref(&ask), deadline())
            .await
            .remove(0)
    };
    assert!(grant().await.unwrap().is_some());
    cli(redis.port, &["CONFIG", "RESETSTAT"]);
    for _ in 0..5 {
        assert!(grant().await.unwrap().is_some());
    }
    assert_eq!(calls(redis.port, "eval"), 0, "the script sent whole");
    assert_eq!(calls(redis.port, "evalsha"), 5);
    cli(redis.port, &["SCRIPT", "FLUSH"]);
    assert!(grant().await.unwrap().is_some(), "granted after NOSCRIPT");
    assert_eq!(calls(redis.port, "eval"), 1);
}
