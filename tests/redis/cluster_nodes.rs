//! One slow Cluster node or one big request cannot fail the calls on the other nodes; all or
//! nothing on Cluster takes one step when it can, and charges a call whole or not at all when
//! one descriptor comes twice.

use std::sync::Arc;
use std::time::Duration;

use crate::common::redis::{RedisCluster, cli, connected_store, script_calls};
use portcullis::algorithm::{Algorithm, ChargeMode, Check, Limit, key};
use portcullis::store::RedisStore;
use portcullis::store::StoreError;
use portcullis::store::redis::cluster_batch::slot_of;
use portcullis::store::redis::{ScriptClock, Topology};
use tokio::time::Instant;

const PREFIX: &str = "nodes:";

fn hourly(requests: u64) -> Limit {
    Limit {
        algorithm: Algorithm::FixedWindow,
        requests,
        window_us: 3_600_000_000,
        burst: requests,
    }
}

fn check_of(name: &str, requests: u64, hits: u64) -> Check {
    Check {
        key: key::counter_key("nodes", [("k", name)], &hourly(requests), None),
        limit: hourly(requests),
        hits,
        refund: false,
        post_paid: false,
    }
}

/// The master port serving each slot, from `CLUSTER NODES`.
fn owners(cluster: &RedisCluster) -> Vec<u16> {
    let mut owner = vec![0u16; 16384];
    for line in cli(cluster.nodes[0].port, &["CLUSTER", "NODES"]).lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 9 || !fields[2].contains("master") {
            continue;
        }
        let port: u16 = fields[1]
            .split(['@', ':'])
            .nth(1)
            .and_then(|p| p.parse().ok())
            .expect("a node address");
        for range in &fields[8..] {
            let (a, b) = range.split_once('-').unwrap_or((range, range));
            let (Ok(a), Ok(b)) = (a.parse::<usize>(), b.parse::<usize>()) else {
                continue;
            };
            for slot in owner.iter_mut().take(b + 1).skip(a) {
                *slot = port;
            }
        }
    }
    owner
}

/// `n` checks whose keys live on the master at `port`.
fn checks_on(owner: &[u16], port: u16, tag: &str, n: usize) -> Vec<Check> {
    (0..)
        .map(|i| check_of(&format!("{tag}{i}"), 100, 1))
        .filter(|c| owner[usize::from(slot_of(&format!("{PREFIX}{}", c.key)))] == port)
        .take(n)
        .collect()
}

async fn decide(
    store: &RedisStore,
    checks: &[Check],
    mode: ChargeMode,
    within: Duration,
) -> Vec<Result<portcullis::algorithm::Decision, StoreError>> {
    let deadline = Instant::now() + within;
    store
        .check_with_clock(checks, ScriptClock::RedisTime, deadline, mode)
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_master_full_of_big_calls_does_not_fail_the_other_masters_calls() {
    let cluster = RedisCluster::start_with_replicas(0);
    let store = Arc::new(connected_store(Topology::Cluster(cluster.seeds()), PREFIX).await);
    let owner = owners(&cluster);
    let (slow, healthy) = (cluster.nodes[0].port, cluster.nodes[1].port);
    let on_healthy = checks_on(&owner, healthy, "h", 1);
    // Decided once, so the node map is read and every node connected.
    let first = decide(
        &store,
        &on_healthy,
        ChargeMode::EachAlone,
        Duration::from_secs(2),
    )
    .await;
    assert!(first[0].as_ref().unwrap().allowed);

    assert_eq!(cli(slow, &["CLIENT", "PAUSE", "4000", "ALL"]), "OK");
    // Big calls (512 descriptors each, every key on the stalled master) pile up behind it.
    let big: Vec<Check> = checks_on(&owner, slow, "s", 512);
    let piled: Vec<_> = (0..16)
        .map(|_| {
            let (store, big) = (store.clone(), big.clone());
            tokio::spawn(async move {
                decide(&store, &big, ChargeMode::EachAlone, Duration::from_secs(6)).await
            })
        })
        .collect();
    // Until the stalled master's queue is full: a further call on it fails at once.
    let one_more = &big[..1];
    let mut full = false;
    for _ in 0..200 {
        let answer = decide(
            &store,
            one_more,
            ChargeMode::EachAlone,
            Duration::from_millis(20),
        )
        .await;
        if matches!(&answer[0], Err(StoreError::Unavailable(m)) if m.contains("already wait")) {
            full = true;
            break;
        }
        tokio::task::yield_now().await;
    }
    assert!(full, "the stalled master's calls never filled its queue");

    // The other masters decide at once.
    let answers = decide(
        &store,
        &on_healthy,
        ChargeMode::EachAlone,
        Duration::from_secs(1),
    )
    .await;
    let decision = answers[0].as_ref().expect("a healthy master decides");
    assert_eq!(decision.remaining, 98);

    assert_eq!(cli(slow, &["CLIENT", "UNPAUSE"]), "OK");
    for call in piled {
        call.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_or_nothing_on_cluster_is_one_step_in_one_slot_and_whole_with_a_descriptor_twice() {
    let cluster = RedisCluster::start_with_replicas(0);
    let store = connected_store(Topology::Cluster(cluster.seeds()), PREFIX).await;
    let owner = owners(&cluster);
    let port = cluster.nodes[2].port;
    let single = checks_on(&owner, port, "single", 1);
    cli(port, &["CONFIG", "RESETSTAT"]);
    let answer = decide(
        &store,
        &single,
        ChargeMode::AllOrNothing,
        Duration::from_secs(2),
    )
    .await;
    assert!(answer[0].as_ref().unwrap().allowed);
    assert_eq!(script_calls(port), 1, "one descriptor, one round trip");

    // One descriptor twice (6 + 6 of 10) beside another slot's: refused, nothing charged.
    let twice = check_of("twice", 10, 6);
    let other = (0..)
        .map(|i| check_of(&format!("other{i}"), 10, 1))
        .find(|c| {
            slot_of(&format!("{PREFIX}{}", c.key)) != slot_of(&format!("{PREFIX}{}", twice.key))
        })
        .unwrap();
    let call = [twice.clone(), twice.clone(), other.clone()];
    let answers = decide(
        &store,
        &call,
        ChargeMode::AllOrNothing,
        Duration::from_secs(2),
    )
    .await;
    assert!(
        answers.iter().any(|a| !a.as_ref().unwrap().allowed),
        "{answers:?}"
    );
    let looked = decide(
        &store,
        &[twice, other],
        ChargeMode::Probe,
        Duration::from_secs(2),
    )
    .await;
    for answer in looked {
        assert_eq!(
            answer.unwrap().remaining,
            10,
            "nothing of the refused call charged"
        );
    }

    // A key of another type fails that key only, on Cluster too.
    let good = check_of("good", 10, 1);
    let foreign = check_of("foreign", 10, 1);
    let foreign_key = format!("{PREFIX}{}", foreign.key);
    let node = owner[usize::from(slot_of(&foreign_key))];
    assert_eq!(cli(node, &["SET", &foreign_key, "not a counter"]), "OK");
    let answers = decide(
        &store,
        &[good, foreign],
        ChargeMode::EachAlone,
        Duration::from_secs(2),
    )
    .await;
    assert_eq!(answers[0].as_ref().unwrap().remaining, 9);
    assert!(
        answers[1].as_ref().is_err_and(StoreError::is_permanent),
        "{answers:?}"
    );
}
