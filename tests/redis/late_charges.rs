//! Consumption is never dropped for being late: a refund or a post-paid charge (Envoy's
//! stream-done call, an LLM's tokens) whose caller was answered before Redis answered is still
//! sent and recorded, on standalone and Cluster; but a late refund into a fixed window gives back
//! only into the window it was made in, never into the next. And the other side of the same contract: a
//! script call given up at its first caller's deadline charges none of its calls afterwards, and
//! a Cluster node whose clock runs ahead of the others still decides its calls.

use std::time::Duration;

use crate::common::redis::{RedisCluster, RedisServer, cli, plain_config, script_calls};
use portcullis::algorithm::{Algorithm, ChargeMode, Check, Limit, key};
use portcullis::store::redis::{ScriptClock, Topology};
use portcullis::store::{Answers, RedisStore};
use portcullis::telemetry::Metrics;
use tokio::time::Instant;

fn hourly(requests: u64) -> Limit {
    Limit {
        algorithm: Algorithm::SlidingWindow,
        requests,
        window_us: 3_600_000_000,
        burst: requests,
    }
}

fn check(name: &str, hits: u64) -> Check {
    let limit = hourly(5);
    Check {
        key: key::counter_key("late", [("user", name)], &limit, None),
        limit,
        hits,
        refund: false,
        post_paid: false,
    }
}

fn refund(name: &str, hits: u64) -> Check {
    Check {
        refund: true,
        ..check(name, hits)
    }
}

fn post_paid(name: &str, hits: u64) -> Check {
    Check {
        post_paid: true,
        ..check(name, hits)
    }
}

async fn within(store: &RedisStore, checks: &[Check], wait: Duration) -> Answers {
    store
        .check_with_clock(
            checks,
            ScriptClock::RedisTime,
            Instant::now() + wait,
            ChargeMode::EachAlone,
        )
        .await
}

/// What `name` has left, asked without spending (a check of no hits).
async fn remaining(store: &RedisStore, name: &str) -> u64 {
    let answer = within(store, &[check(name, 0)], Duration::from_secs(2)).await;
    answer[0].as_ref().expect("Redis answers").remaining
}

/// Polls until `name` has `expected` left; fails with what it last saw.
async fn until_remaining(store: &RedisStore, name: &str, expected: u64) {
    let until = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let left = remaining(store, name).await;
        if left == expected {
            return;
        }
        assert!(
            std::time::Instant::now() < until,
            "{name}: {left} left, expected {expected}: the late charge was not recorded"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn store_on(topology: Topology, prefix: &str, pool: u32) -> RedisStore {
    store_counted(topology, prefix, pool, Default::default()).await
}

async fn store_counted(
    topology: Topology,
    prefix: &str,
    pool: u32,
    metrics: std::sync::Arc<Metrics>,
) -> RedisStore {
    let store = RedisStore::new(&plain_config(topology, pool), prefix, metrics).unwrap();
    store
        .probe(Duration::from_secs(10))
        .await
        .expect("Redis usable");
    store
}

/// Pauses every client of the Redis at `port` for `ms`, from another thread (the pause also
/// holds redis-cli's later commands, so nothing here waits on it).
fn pause(port: u16, ms: u64) {
    assert_eq!(
        cli(port, &["CLIENT", "PAUSE", &ms.to_string(), "ALL"]),
        "OK"
    );
}

/// Redis' clock, in microseconds.
fn redis_now_us(port: u16) -> u64 {
    let out = cli(port, &["TIME"]);
    let mut parts = out.split_whitespace().map(|p| p.parse::<u64>().unwrap());
    parts.next().unwrap() * 1_000_000 + parts.next().unwrap()
}

/// Waits, if need be, until Redis' clock is at least `from` and at most `to` µs into a period
/// of `period` µs.
async fn into_period(port: u16, period: u64, from: u64, to: u64) {
    let at = redis_now_us(port) % period;
    if at < from || at > to {
        let wait = (period + from - at) % period;
        tokio::time::sleep(Duration::from_micros(wait)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_and_a_post_paid_charge_held_past_their_deadline_are_recorded() {
    let redis = RedisServer::start();
    let metrics = std::sync::Arc::new(Metrics::default());
    let store = store_counted(Topology::Standalone(redis.url()), "l1:", 2, metrics.clone()).await;
    // Spent 3 of 5, and the store knows Redis' clock.
    assert!(within(&store, &[check("r", 3)], Duration::from_secs(2)).await[0].is_ok());
    assert_eq!(remaining(&store, "r").await, 2);

    pause(redis.port, 500);
    let refunded = within(&store, &[refund("r", 3)], Duration::from_millis(50)).await;
    assert!(
        refunded[0].is_err(),
        "the pause held the refund past its deadline"
    );
    let charged = within(&store, &[post_paid("p", 4)], Duration::from_millis(50)).await;
    assert!(
        charged[0].is_err(),
        "the pause held the charge past its deadline"
    );
    until_remaining(&store, "r", 5).await;
    until_remaining(&store, "p", 1).await;
    // Counted as recorded late (each in its own call, or both in one script call).
    let exposition = metrics.encode();
    let recorded: u64 = exposition
        .lines()
        .find_map(|l| l.strip_prefix("portcullis_store_late_charges_total{result=\"recorded\"} "))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!(recorded >= 1, "no late charge counted:\n{exposition}");
}

/// A refund queued behind a stalled script call (its deadline passes while it waits for the
/// connection) is still sent once the connection is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_whose_deadline_passes_in_the_queue_is_still_sent() {
    let redis = RedisServer::start();
    let store = store_on(Topology::Standalone(redis.url()), "l2:", 1).await;
    assert!(within(&store, &[check("q", 4)], Duration::from_secs(2)).await[0].is_ok());
    pause(redis.port, 400);
    // The one connection is busy with this call, which waits out the pause.
    let busy = {
        let store = store.clone();
        tokio::spawn(
            async move { within(&store, &[check("other", 1)], Duration::from_secs(3)).await },
        )
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let refunded = within(&store, &[refund("q", 4)], Duration::from_millis(50)).await;
    assert!(refunded[0].is_err(), "the refund waited past its deadline");
    assert!(busy.await.unwrap()[0].is_ok());
    until_remaining(&store, "q", 5).await;
}

/// Two calls ride one script call, which is given up at the first one's deadline: neither is
/// charged when Redis runs it later (the second one's caller was answered by the failure mode
/// with the first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_call_given_up_at_its_first_deadline_charges_none_of_its_calls_later() {
    let redis = RedisServer::start();
    let store = store_on(Topology::Standalone(redis.url()), "l3:", 1).await;
    assert!(within(&store, &[check("warm", 1)], Duration::from_secs(2)).await[0].is_ok());
    cli(redis.port, &["CONFIG", "RESETSTAT"]);
    pause(redis.port, 600);
    // The connection's one script call stalls until its deadline (100 ms); meanwhile the next
    // two calls queue and then go together, given up at the first one's deadline (150 ms).
    let first = {
        let store = store.clone();
        tokio::spawn(
            async move { within(&store, &[check("x", 1)], Duration::from_millis(100)).await },
        )
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    let (a, b) = ([check("a", 1)], [check("b", 1)]);
    let (early, late) = tokio::join!(
        within(&store, &a, Duration::from_millis(150)),
        within(&store, &b, Duration::from_secs(2)),
    );
    assert!(first.await.unwrap()[0].is_err());
    assert!(early[0].is_err(), "held past its deadline");
    assert!(
        late[0].is_err(),
        "answered with the script call it rode, given up at the first deadline"
    );
    // Both stalled script calls reach Redis once the pause ends.
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while script_calls(redis.port) < 2 {
        assert!(
            std::time::Instant::now() < until,
            "the held calls never ran"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for name in ["x", "a", "b"] {
        let key = format!("l3:{}", check(name, 1).key);
        assert_eq!(
            cli(redis.port, &["EXISTS", &key]),
            "0",
            "{name} was charged after its caller was answered"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_cluster_a_refund_held_past_its_deadline_is_recorded() {
    let cluster = RedisCluster::start_with_replicas(0);
    let store = store_on(Topology::Cluster(cluster.seeds()), "l4:", 2).await;
    assert!(within(&store, &[check("c", 3)], Duration::from_secs(2)).await[0].is_ok());
    let master = cluster.master_of(&format!("l4:{}", check("c", 1).key));
    pause(master, 500);
    let refunded = within(&store, &[refund("c", 3)], Duration::from_millis(50)).await;
    assert!(
        refunded[0].is_err(),
        "the pause held the refund past its deadline"
    );
    let charged = within(&store, &[post_paid("c", 1)], Duration::from_millis(50)).await;
    assert!(
        charged[0].is_err(),
        "the pause held the charge past its deadline"
    );
    until_remaining(&store, "c", 4).await;
}

/// A refund held on its way (this replica's link to Redis partitioned) past the end of the fixed
/// window it was made in, while another replica spends the next window: when it lands, it gives
/// nothing back into that next window (which would hand out its hits a second time), and is
/// counted as past its period. Before, it landed in the next window: 20 admitted of 10.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_refund_never_gives_back_into_the_next_window() {
    late_refund_past_its_window(Algorithm::FixedWindow, 2_000_000, "l6:").await;
}

/// The same on a sliding window: a refund that lands a window after it was made finds none of
/// its own hits there (every one has left) and would take back the newer ones another replica
/// spent. Before, it did: 20 admitted within one second of a 10/s rule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_refund_never_takes_back_hits_newer_than_its_window() {
    late_refund_past_its_window(Algorithm::SlidingWindow, 1_000_000, "l7:").await;
}

async fn late_refund_past_its_window(algorithm: Algorithm, window: u64, prefix: &str) {
    let redis = RedisServer::start();
    let proxy = crate::common::proxy::Proxy::start(redis.port).await;
    let metrics = std::sync::Arc::new(Metrics::default());
    let url = format!("redis://127.0.0.1:{}", proxy.port);
    let held = store_counted(Topology::Standalone(url), prefix, 1, metrics.clone()).await;
    let other = store_on(Topology::Standalone(redis.url()), prefix, 1).await;
    let limit = Limit {
        algorithm,
        requests: 10,
        window_us: window,
        burst: 10,
    };
    let spend = |hits: u64, refund: bool| Check {
        key: key::counter_key("late", [("user", "f")], &limit, None),
        limit,
        hits,
        refund,
        post_paid: false,
    };
    // Early in a window: the held replica spends the window.
    into_period(redis.port, window, 100_000, 600_000).await;
    let spent = within(&held, &[spend(10, false)], Duration::from_secs(2)).await;
    assert!(spent[0].as_ref().unwrap().allowed);
    // Its refund of them is held on the way past its caller's deadline...
    proxy.partition(true);
    let refunded = within(&held, &[spend(10, true)], Duration::from_millis(50)).await;
    assert!(refunded[0].is_err(), "the partition held the refund");
    // ...and past the window's end (a sliding window's hits all gone: it forgets a hit up to
    // a sub-window late), while the other replica spends the next window whole.
    let wait = match algorithm {
        Algorithm::FixedWindow => window - redis_now_us(redis.port) % window + 100_000,
        _ => window + window / 30 + 100_000,
    };
    tokio::time::sleep(Duration::from_micros(wait)).await;
    let next = within(&other, &[spend(10, false)], Duration::from_secs(2)).await;
    assert!(next[0].as_ref().unwrap().allowed);
    proxy.partition(false);
    // The refund lands (or is turned away) once the link heals.
    let landed = |result: &str| {
        let series = format!("portcullis_store_late_charges_total{{result=\"{result}\"}} ");
        metrics
            .encode()
            .lines()
            .find_map(|l| l.strip_prefix(series.as_str()).map(str::to_owned))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while landed("past_its_period") + landed("recorded") + landed("lost") == 0 {
        assert!(
            std::time::Instant::now() < until,
            "the late refund never landed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let more = within(&other, &[spend(1, false)], Duration::from_secs(2)).await;
    assert!(
        !more[0].as_ref().unwrap().allowed,
        "admits past its 10: the late refund gave back into a later window"
    );
    assert_eq!(landed("past_its_period"), 1, "{}", metrics.encode());
}

/// One master's clock runs a second ahead of the others'. Calls alternate between a key on it
/// and keys on the others, each with a deadline well under that second: every call is decided
/// (a deadline put on the wrong node's clock would reach the fast node already past).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_cluster_a_node_whose_clock_runs_ahead_still_decides() {
    let cluster = RedisCluster::start_with_clocks(0, &[None, Some(1_000_000), None]);
    let fast = cluster.nodes[1].port;
    let store = store_on(Topology::Cluster(cluster.seeds()), "l5:", 2).await;
    // A user on the fast node and one on another node.
    let names: Vec<String> = (0..200).map(|i| format!("u{i}")).collect();
    let on_fast = names
        .iter()
        .find(|n| cluster.master_of(&format!("l5:{}", check(n, 1).key)) == fast)
        .expect("a key on the fast node");
    let elsewhere = names
        .iter()
        .find(|n| cluster.master_of(&format!("l5:{}", check(n, 1).key)) != fast)
        .expect("a key on another node");
    for round in 0..10 {
        for name in [elsewhere, on_fast] {
            let answer = within(&store, &[check(name, 0)], Duration::from_millis(300)).await;
            assert!(
                answer[0].is_ok(),
                "round {round}, {name}: {:?}",
                answer[0].as_ref().err()
            );
        }
    }
}
