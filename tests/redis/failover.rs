//! What a failover to a replica costs, and `--redis-wait-replicas`: a replica held behind while
//! hits are admitted, the master killed and the replica promoted, what is admitted again
//! counted; with WAIT, none admitted twice, on standalone and on Cluster (each call waits for
//! its own master's replica). Split from replicas.rs.

use crate::common;

use std::time::Duration;

use crate::common::redis::{RedisCluster, RedisServer, cli};
use portcullis::algorithm::{Algorithm, ChargeMode, Check, Limit, key};
use portcullis::store::redis::{ScriptClock, Topology};
use portcullis::store::{RedisStore, StoreError};

/// The limit the failover measures spend: 60 an hour, so no window ends during a test.
pub(crate) const LIMIT: u64 = 60;

/// One hit of `LIMIT` an hour on the descriptor `name` (user u).
pub(crate) fn spent_check(name: &str) -> Check {
    let limit = Limit {
        algorithm: Algorithm::FixedWindow,
        requests: LIMIT,
        window_us: 3_600_000_000,
        burst: LIMIT,
    };
    Check {
        key: key::counter_key(name, [("user", "u")], &limit, None),
        limit,
        hits: 1,
        refund: false,
        post_paid: false,
    }
}

/// One call of `check` through `store` on Redis' clock, answered within `within`.
pub(crate) async fn decide_within(
    store: &RedisStore,
    check: &Check,
    within: Duration,
) -> Result<bool, StoreError> {
    let deadline = tokio::time::Instant::now() + within;
    let answer = store
        .check_with_clock(
            std::slice::from_ref(check),
            ScriptClock::RedisTime,
            deadline,
            ChargeMode::EachAlone,
        )
        .await;
    answer[0].clone().map(|d| d.allowed)
}

/// The port of the replica of the Cluster master at `master`, once the master knows it (a
/// replica attached a moment ago may not be in the master's view yet on a loaded machine: read
/// at once, it was missing in one CI run).
pub(crate) fn replica_of(master: u16) -> u16 {
    let id = cli(master, &["CLUSTER", "MYID"]);
    let find = || -> Option<u16> {
        cli(master, &["CLUSTER", "NODES"])
            .lines()
            .find(|l| l.contains("slave") && l.contains(&id))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|a| a.split(['@', ':']).nth(1))
            .and_then(|p| p.parse().ok())
    };
    crate::common::redis::wait_until(
        "the master knows its replica",
        Duration::from_secs(20),
        || find().is_some(),
    );
    find().expect("the master's replica")
}

/// What a failover costs (issue 45 item 3). Replication is asynchronous: the hits a master has
/// acknowledged and not yet sent to its replica are gone when the replica is promoted, and the
/// descriptor admits them again. The replica is held behind by a partition of its link (a
/// proxy) while `lag` hits are admitted at the limit, then the master is killed, the replica
/// promoted, and what the promoted node admits on the spent descriptor is counted. Over-admission
/// is exactly the hits in the lag window, no more (RELIABILITY.md states it, with this test's
/// figures; Sentinel and Cluster promote the same way, the loss is the same).
///
/// With `wait_replicas` (--redis-wait-replicas), each call's answer stands only once that many
/// replicas have its writes: the calls made while the link is cut are answered as failures (the
/// failure mode's), each within `deadline`. Returns (calls admitted while the replica was
/// behind, calls the promoted node admits again).
async fn admitted_around_a_failover(lag: u64, wait_replicas: u32) -> (u64, u64) {
    let mut master = RedisServer::start();
    let link = common::proxy::Proxy::start(master.port).await;
    let replica = RedisServer::start();
    cli(
        replica.port,
        &["REPLICAOF", "127.0.0.1", &link.port.to_string()],
    );
    let check = spent_check("failover");
    // A call cut off from its replica waits out its deadline: a short one then (`cut`).
    let decide = |store: RedisStore, check: Check, cut: bool| async move {
        let wait = if cut && wait_replicas > 0 {
            1_000
        } else {
            2_000
        };
        let answer = decide_within(&store, &check, Duration::from_millis(wait)).await;
        (store, answer)
    };
    let config = portcullis::store::redis::RedisConfig {
        wait_replicas,
        ..common::redis::plain_config(Topology::Standalone(master.url()), 2)
    };
    let mut store = RedisStore::new(&config, "f:", Default::default()).unwrap();
    // The replica in sync, then the hits before the lag, replicated.
    let started = std::time::Instant::now();
    while !cli(replica.port, &["INFO", "replication"]).contains("master_link_status:up") {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "replica never in sync"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for _ in 0..LIMIT - lag {
        let answer;
        (store, answer) = decide(store, check.clone(), false).await;
        assert!(answer.expect("decided, the replica in sync"));
    }
    let replicated = (LIMIT - lag).to_string();
    let stored = format!("f:{}", check.key);
    while common::redis::fixed_count(replica.port, &stored) != replicated {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never replicated"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The replica falls behind: the last `lag` hits reach the master only.
    link.partition(true);
    let mut admitted = 0;
    let mut errors = Vec::new();
    for _ in 0..lag {
        let answer;
        (store, answer) = decide(store, check.clone(), true).await;
        match answer {
            Ok(true) => admitted += 1,
            Ok(false) => panic!("refused below the limit"),
            Err(e) => errors.push(e.to_string()),
        }
    }
    if wait_replicas > 0 {
        // Why, said at least once: calls queued behind a WAIT on its connection wait until
        // Redis ends it, and may meet their own deadline first.
        assert!(errors.iter().any(|e| e.contains("WAIT: ")), "{errors:?}");
    } else {
        assert!(errors.is_empty(), "{errors:?}");
    }
    master.kill();
    cli(replica.port, &["REPLICAOF", "NO", "ONE"]);
    let mut promoted =
        common::redis::connected_store(Topology::Standalone(replica.url()), "f:").await;
    let mut again = 0;
    for _ in 0..LIMIT {
        let answer;
        (promoted, answer) = decide(promoted, check.clone(), false).await;
        if !answer.expect("the promoted node decides") {
            break;
        }
        again += 1;
    }
    (admitted, again)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_admits_again_exactly_the_hits_the_replica_had_not_received() {
    for lag in [0, 1, 25] {
        let (admitted, again) = admitted_around_a_failover(lag, 0).await;
        eprintln!("failover with {lag} hits not yet replicated: {again} admitted again");
        assert_eq!(admitted, lag);
        assert_eq!(again, lag, "over-admission at a lag of {lag} hits");
    }
}

/// With --redis-wait-replicas 1 (issue 45 item 4) no admitted hit is lost in that failover: the
/// calls made while the replica is cut off are answered as failures (the failure mode decides
/// them: under `deny`, refused), never admitted, so what the promoted node admits again was
/// never admitted before: over the window, at most the limit in all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_wait_replicas_no_admitted_hit_is_lost_in_a_failover() {
    for lag in [1, 5] {
        let (admitted, again) = admitted_around_a_failover(lag, 1).await;
        eprintln!("waiting for a replica, {lag} calls cut off: {admitted} admitted, {again} after");
        assert_eq!(
            admitted, 0,
            "a call admitted without its replica's acknowledgement"
        );
        assert!(60 - lag + admitted + again <= 60, "over the limit in all");
    }
}

/// On Cluster each script call's WAIT goes to the node that ran it: with the replica of one
/// master gone, a call on that master's slots is answered as a failure naming WAIT, and one on
/// another master's slots is admitted (its replica acknowledged). A WAIT sent to the wrong node
/// would pass the first (nothing written there) or fail the second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_cluster_each_call_waits_for_its_own_masters_replica() {
    let mut cluster = RedisCluster::start();
    let limit = Limit {
        algorithm: Algorithm::FixedWindow,
        requests: 100,
        window_us: 60_000_000,
        burst: 100,
    };
    let check = |user: &str| Check {
        key: key::counter_key("w", [("user", user)], &limit, None),
        limit,
        hits: 1,
        refund: false,
        post_paid: false,
    };
    // Two users whose keys live on different masters.
    let stripped = |user: &str| format!("w:{}", check(user).key);
    let first = "u0";
    let master = cluster.master_of(&stripped(first));
    let other = (1..100)
        .map(|i| format!("u{i}"))
        .find(|u| cluster.master_of(&stripped(u)) != master)
        .expect("a user on another master");
    // Every replica in sync first (a cluster just formed may still be copying).
    for node in &cluster.nodes {
        common::redis::wait_until("replica in sync", Duration::from_secs(20), || {
            let info = cli(node.port, &["INFO", "replication"]);
            info.contains("role:master") || info.contains("master_link_status:up")
        });
    }
    let config = portcullis::store::redis::RedisConfig {
        wait_replicas: 1,
        ..common::redis::plain_config(Topology::Cluster(cluster.seeds()), 2)
    };
    let store = RedisStore::new(&config, "w:", Default::default()).unwrap();
    store
        .probe(Duration::from_secs(10))
        .await
        .expect("Redis usable");
    let decide = |user: String| {
        let (store, check) = (store.clone(), check(&user));
        async move { decide_within(&store, &check, Duration::from_secs(2)).await }
    };
    // Both acknowledged while every replica is up.
    assert!(decide(first.to_owned()).await.expect("decided"));
    assert!(decide(other.clone()).await.expect("decided"));
    // The first user's master loses its replica.
    cluster.node_mut(replica_of(master)).kill();
    let cut = decide(first.to_owned()).await;
    let e = cut.expect_err("a call whose writes no replica has");
    assert!(e.to_string().contains("WAIT: "), "{e}");
    assert!(decide(other).await.expect("its replica answers"));
}
