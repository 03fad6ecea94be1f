//! Hot counters decided in the replica (`--hot-descriptor-rate`, `store::hot`) on real Redis:
//! three replicas calling one counter as fast as they can never pass a minute's limit between
//! them (fixed window, sliding window, bucket; standalone and Cluster), nor a second's over
//! three seconds, and admit nearly all of it; on a counter far from its limit nearly every call is answered without a script call; a
//! replica that stops gives back what it claimed, one that dies holds it (counted, never
//! admitted) until its window ends.

use std::sync::Arc;
use std::time::Duration;

use portcullis::algorithm::{Algorithm, ChargeMode, Check, Limit};
use portcullis::clock::SystemClock;
use portcullis::store::Store;
use portcullis::store::hot::{HotConfig, HotStore};
use portcullis::store::redis::Topology;
use portcullis::telemetry::HotMetrics;
use tokio::time::Instant;

use crate::common::redis::{RedisCluster, RedisServer, cli, connected_store, script_calls};

const MINUTE_US: u64 = 60_000_000;

async fn replica(topology: Topology, metrics: &Arc<HotMetrics>) -> HotStore {
    let store = connected_store(topology, "hot:").await;
    HotStore::new(
        Arc::new(store),
        Arc::new(SystemClock::default()),
        HotConfig {
            rate: 50.0,
            store_timeout: Duration::from_secs(2),
        },
        None,
        metrics.clone(),
    )
}

fn charge(key: &str, limit: Limit) -> Check {
    Check {
        key: key.to_owned(),
        limit,
        hits: 1,
        refund: false,
        post_paid: false,
    }
}

/// Redis' clock, in microseconds.
fn redis_now_us(port: u16) -> u64 {
    let out = cli(port, &["TIME"]);
    let mut parts = out.split_whitespace().map(|p| p.parse::<u64>().unwrap());
    parts.next().unwrap() * 1_000_000 + parts.next().unwrap()
}

/// Waits, if need be, until Redis' minute has at least 15 s left: the run stays inside one
/// fixed window.
pub(crate) async fn inside_one_minute(port: u16) {
    let left = MINUTE_US - redis_now_us(port) % MINUTE_US;
    if left < 15_000_000 {
        tokio::time::sleep(Duration::from_micros(left + 50_000)).await;
    }
}

/// Each replica calls `key` from its own task as fast as it answers for `run`; the calls each
/// admitted.
async fn hammer(replicas: &[HotStore], key: &str, limit: Limit, run: Duration) -> Vec<u64> {
    let until = Instant::now() + run;
    let tasks: Vec<_> = replicas
        .iter()
        .map(|r| {
            let (r, check) = (r.clone(), charge(key, limit));
            tokio::spawn(async move {
                let mut admitted = 0u64;
                while Instant::now() < until {
                    let far = Instant::now() + Duration::from_secs(2);
                    let answer = r
                        .check(std::slice::from_ref(&check), far, ChargeMode::EachAlone)
                        .await
                        .remove(0)
                        .expect("Redis answers");
                    admitted += u64::from(answer.allowed);
                    tokio::task::yield_now().await;
                }
                admitted
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

fn minute(algorithm: Algorithm, requests: u64) -> Limit {
    Limit {
        algorithm,
        requests,
        window_us: MINUTE_US,
        burst: requests,
    }
}

/// Three replicas, ten times the limit or more: within it, nearly all of it, and the claims
/// did the work.
async fn within_the_limit(topology: impl Fn() -> Topology, port: u16, what: &str) {
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
    ] {
        let metrics = Arc::new(HotMetrics::default());
        let mut replicas = Vec::new();
        for _ in 0..3 {
            replicas.push(replica(topology(), &metrics).await);
        }
        let l = minute(algorithm, 600);
        let key = format!("{{d|hot={what}{algorithm:?}}}");
        inside_one_minute(port).await;
        let admitted = hammer(&replicas, &key, l, Duration::from_secs(3)).await;
        let total: u64 = admitted.iter().sum();
        // A bucket refills 10 a second meanwhile.
        let most = match algorithm {
            Algorithm::TokenBucket => 600 + 40,
            _ => 600,
        };
        println!(
            "{what} {algorithm:?}: admitted {admitted:?} = {total}, from claims {}, claims {} \
             ({} refused), lapsed {}",
            metrics.decisions.get(),
            metrics.claims_taken.get(),
            metrics.claims_refused.get(),
            metrics.lapsed_hits.get()
        );
        assert!(
            total <= most,
            "{what} {algorithm:?}: {total} admitted of {most}"
        );
        // The stated bound: what lapses while the counter is under a quarter of its limit,
        // and each replica's last two claims (a quarter of 50 ms of its calls each).
        assert!(
            total >= 600 - 150 - 3 * 2 * 25,
            "{what} {algorithm:?}: only {total} admitted of 600"
        );
        assert!(
            metrics.decisions.get() * 4 > total,
            "{what} {algorithm:?}: {} of {total} from claims",
            metrics.decisions.get()
        );
    }
}

/// Three replicas on a second's rule for three seconds: within the limit of every window the
/// run touched (on Redis' clock), and at least the whole windows' limits less the stated bound.
async fn within_a_seconds_limit(topology: impl Fn() -> Topology, port: u16, what: &str) {
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
        let metrics = Arc::new(HotMetrics::default());
        let mut replicas = Vec::new();
        for _ in 0..3 {
            replicas.push(replica(topology(), &metrics).await);
        }
        let l = Limit {
            algorithm,
            requests: 400,
            window_us: 1_000_000,
            burst: 400,
        };
        let key = format!("{{d|second={what}{algorithm:?}}}");
        let start = redis_now_us(port);
        let admitted: u64 = hammer(&replicas, &key, l, Duration::from_secs(3))
            .await
            .iter()
            .sum();
        let end = redis_now_us(port);
        // Fixed: the windows the run touched. Sliding: every interval of a second holds at
        // most the limit, and the run is covered by that many.
        let touched = match algorithm {
            Algorithm::FixedWindow => end / 1_000_000 - start / 1_000_000 + 1,
            _ => (end - start).div_ceil(1_000_000),
        };
        println!(
            "{what} {algorithm:?} 400/s: {admitted} in {} ms, from claims {}, lapsed {}",
            (end - start) / 1000,
            metrics.decisions.get(),
            metrics.lapsed_hits.get()
        );
        assert!(
            admitted <= touched * 400,
            "{what} {algorithm:?}: {admitted} admitted in {touched} windows of 400"
        );
        // Two whole windows at least, less what lapses under a quarter of the limit and two
        // claims per replica per window (a sliding window forgets a sub-window late).
        assert!(
            admitted >= 2 * (400 * 60 / 61 - 100 - 3 * 2 * 25),
            "{what} {algorithm:?}: only {admitted} admitted"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_never_pass_a_minute_or_a_seconds_limit_on_standalone_redis() {
    let redis = RedisServer::start();
    let url = redis.url();
    let standalone = || Topology::Standalone(url.clone());
    within_the_limit(standalone, redis.port, "standalone").await;
    within_a_seconds_limit(standalone, redis.port, "standalone").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_never_pass_a_minute_or_a_seconds_limit_on_a_cluster() {
    let cluster = RedisCluster::start();
    let seeds = cluster.seeds();
    let port = cluster.master_of("{d|hot=clusterFixedWindow}");
    within_the_limit(|| Topology::Cluster(seeds.clone()), port, "cluster").await;
    let port = cluster.master_of("{d|second=clusterFixedWindow}");
    within_a_seconds_limit(|| Topology::Cluster(seeds.clone()), port, "cluster").await;
}

/// A counter far from its limit: after its rate is seen, calls are answered from claims, one
/// script call for many decisions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_counter_far_from_its_limit_costs_few_script_calls() {
    let redis = RedisServer::start();
    let metrics = Arc::new(HotMetrics::default());
    let r = replica(Topology::Standalone(redis.url()), &metrics).await;
    let l = Limit {
        algorithm: Algorithm::SlidingWindow,
        requests: 1_000_000_000,
        window_us: 1_000_000,
        burst: 1_000_000_000,
    };
    let before = script_calls(redis.port);
    let admitted = hammer(
        std::slice::from_ref(&r),
        "{d|far=1}",
        l,
        Duration::from_secs(2),
    )
    .await;
    let calls = script_calls(redis.port) - before;
    println!(
        "{} admitted, {calls} script calls, {} from claims",
        admitted[0],
        metrics.decisions.get()
    );
    assert!(admitted[0] > 1_000, "{} calls in 2 s", admitted[0]);
    // The first 50 ms (the rate is measured) and the readiness look aside: a script call per
    // twenty decisions at the most.
    assert!(
        calls * 20 < admitted[0],
        "{calls} script calls for {} decisions",
        admitted[0]
    );
}

/// A replica that stops gives back what it claimed (the counter then holds exactly what was
/// admitted); one that dies holds it, counted and never admitted, until the window ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_replica_gives_its_claim_back_and_a_dead_one_holds_it() {
    let redis = RedisServer::start();
    let metrics = Arc::new(HotMetrics::default());
    let l = minute(Algorithm::FixedWindow, 100_000);
    let probe = |store: portcullis::store::RedisStore, key: &'static str| async move {
        let far = Instant::now() + Duration::from_secs(2);
        store
            .check(&[charge(key, l)], far, ChargeMode::Probe)
            .await
            .remove(0)
            .unwrap()
            .remaining
    };
    let looker = connected_store(Topology::Standalone(redis.url()), "hot:").await;
    for (key, stops) in [("{d|stops=1}", true), ("{d|dies=1}", false)] {
        inside_one_minute(redis.port).await;
        let r = replica(Topology::Standalone(redis.url()), &metrics).await;
        let admitted = hammer(std::slice::from_ref(&r), key, l, Duration::from_millis(500)).await;
        r.settle().await;
        let held = r.claimed(key);
        assert!(held > 0, "{key}: a claim is held after 500 ms of calls");
        let counted = 100_000 - probe(looker.clone(), key).await;
        assert_eq!(counted, admitted[0] + held, "{key}: the claim is counted");
        if stops {
            r.close().await;
            assert_eq!(r.claimed(key), 0);
            assert_eq!(100_000 - probe(looker.clone(), key).await, admitted[0]);
        } else {
            drop(r);
            assert_eq!(
                100_000 - probe(looker.clone(), key).await,
                admitted[0] + held
            );
        }
    }
}

/// Redis gone while a claim is held: the claim decides until it is spent, then the calls fail
/// (the limiter's failure mode answers those).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_decides_through_a_redis_outage_until_it_is_spent() {
    let mut redis = RedisServer::start();
    let metrics = Arc::new(HotMetrics::default());
    let key = "{d|outage=1}";
    let l = minute(Algorithm::FixedWindow, 100_000);
    inside_one_minute(redis.port).await;
    let r = replica(Topology::Standalone(redis.url()), &metrics).await;
    hammer(std::slice::from_ref(&r), key, l, Duration::from_millis(300)).await;
    r.settle().await;
    let held = r.claimed(key);
    assert!(held > 0, "a claim is held after 300 ms of calls");
    redis.kill();
    let (mut admitted, mut failed) = (0, false);
    for _ in 0..held + 10 {
        let deadline = Instant::now() + Duration::from_millis(300);
        match r
            .check(&[charge(key, l)], deadline, ChargeMode::EachAlone)
            .await
            .remove(0)
        {
            Ok(d) => {
                assert!(d.allowed, "no refusal can come from a claim");
                admitted += 1;
            }
            Err(_) => {
                failed = true;
                break;
            }
        }
    }
    assert_eq!(admitted, held, "the claim decides, exactly its hits");
    assert!(failed, "then the calls fail");
}
