//! What a failover costs when the replica is promoted by Sentinel and by Cluster themselves
//! (issue 45 item 3): the replica held behind by a partition of its link while hits are admitted
//! at the limit, the master killed, its replica promoted, and a store following the topology
//! counting what the promoted node admits on the spent descriptor: exactly the hits it had not
//! received. Split from failover.rs (the manual promotion and --redis-wait-replicas).

use crate::common;

use std::time::Duration;

use crate::common::redis::{RedisCluster, RedisServer, cli};
use crate::failover::{LIMIT, decide_within, replica_of, spent_check};
use portcullis::algorithm::Check;
use portcullis::store::redis::Topology;
use portcullis::store::{RedisStore, StoreError};

/// One hit of `check` through `store`, within two seconds (a loaded machine).
async fn decide(store: RedisStore, check: Check) -> Result<bool, StoreError> {
    decide_within(&store, &check, Duration::from_secs(2)).await
}

/// The replica held behind (`link` partitioned), the last `lag` hits of the limit admitted by
/// the master alone through `direct`, and the limit then spent there.
async fn spend_the_lag_on_the_master_alone(
    link: &common::proxy::Proxy,
    direct: RedisStore,
    check: &Check,
    lag: u64,
) {
    link.partition(true);
    for _ in 0..lag {
        assert!(
            decide(direct.clone(), check.clone())
                .await
                .expect("decided")
        );
    }
    assert!(
        !decide(direct, check.clone()).await.expect("decided"),
        "spent on the master"
    );
}

/// How many hits of `check` the promoted master admits before it refuses one (at most the limit).
async fn admitted_until_refused(store: RedisStore, check: Check) -> u64 {
    let mut again = 0;
    while decide(store.clone(), check.clone())
        .await
        .expect("the promoted master decides")
    {
        again += 1;
        assert!(again <= LIMIT, "the promoted master admits without end");
    }
    again
}

/// The same measure with Sentinel's own promotion (issue 45 item 3): the replica held behind by
/// a partition of its link while `lag` hits are admitted at the limit, the master killed, the
/// sentinels promoting the replica, and a store that follows Sentinel counting what the new
/// master admits on the spent descriptor: exactly the hits the replica had not received. The
/// sentinels know the master through the same proxy as the replica (Sentinel moves a replica
/// that replicates from another address than the one it monitors), so the partition hides the
/// master from them too: they are told to fail over (`SENTINEL FAILOVER`, their own promotion
/// without waiting out `down-after`, set long so that the partition alone starts none). The hits
/// go to the master directly meanwhile. The suite runs one lag; `FAILOVER_LAGS=0,1,25` runs
/// others (RELIABILITY.md has their figures).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_failover_admits_again_exactly_the_hits_the_replica_had_not_received() {
    for lag in lags() {
        let again = admitted_again_after_a_sentinel_failover(lag).await;
        eprintln!("Sentinel failover with {lag} hits not yet replicated: {again} admitted again");
        assert_eq!(again, lag, "over-admission at a lag of {lag} hits");
    }
}

async fn admitted_again_after_a_sentinel_failover(lag: u64) -> u64 {
    let master = RedisServer::start();
    let link = common::proxy::Proxy::start(master.port).await;
    let master_url = master.url();
    let mut setup = common::redis::RedisSentinel::start_with_link(master, link.port, 60_000);
    let check = spent_check("sentinel-failover");
    let decide = |store: RedisStore| decide(store, check.clone());
    let direct = common::redis::connected_store(Topology::Standalone(master_url), "s:").await;
    let replica = setup.replica.port;
    common::redis::wait_until("the replica in sync", Duration::from_secs(10), || {
        cli(replica, &["INFO", "replication"]).contains("master_link_status:up")
    });
    for _ in 0..LIMIT - lag {
        assert!(decide(direct.clone()).await.expect("decided"));
    }
    let stored = format!("s:{}", check.key);
    let replicated = (LIMIT - lag).to_string();
    common::redis::wait_until("the hits replicated", Duration::from_secs(10), || {
        common::redis::fixed_count(replica, &stored) == replicated
    });
    spend_the_lag_on_the_master_alone(&link, direct, &check, lag).await;
    setup.master.kill();
    let first = setup.sentinels[0].port;
    assert_eq!(cli(first, &["SENTINEL", "FAILOVER", "mymaster"]), "OK");
    let promoted = replica.to_string();
    common::redis::wait_until("the sentinels' promotion", Duration::from_secs(30), || {
        cli(first, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster"]).contains(&promoted)
            && cli(replica, &["INFO", "replication"]).contains("role:master")
    });
    let store = common::redis::connected_store(
        Topology::Sentinel {
            sentinels: setup.sentinel_addrs(),
            master: "mymaster".into(),
        },
        "s:",
    )
    .await;
    admitted_until_refused(store, check).await
}

/// The same measure with Cluster's own promotion: the master of the descriptor's slot announces
/// itself at a proxy (`cluster-announce-port`; its bus stays direct, so failure detection and the
/// election run as ever), its replica follows it there and is held behind by a partition while
/// `lag` hits reach the master directly; the master is killed, its replica elected in its place,
/// and a Cluster store counts what the promoted node admits again: exactly the lag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_failover_admits_again_exactly_the_hits_the_replica_had_not_received() {
    for lag in lags() {
        let again = admitted_again_after_a_cluster_failover(lag).await;
        eprintln!("Cluster failover with {lag} hits not yet replicated: {again} admitted again");
        assert_eq!(again, lag, "over-admission at a lag of {lag} hits");
    }
}

/// The lags a run measures: `FAILOVER_LAGS` (e.g. `0,1,25`), else 5.
fn lags() -> Vec<u64> {
    std::env::var("FAILOVER_LAGS")
        .unwrap_or_else(|_| "5".into())
        .split(',')
        .map(|l| l.trim().parse().expect("FAILOVER_LAGS: numbers"))
        .collect()
}

async fn admitted_again_after_a_cluster_failover(lag: u64) -> u64 {
    let mut cluster = RedisCluster::start();
    let check = spent_check("cluster-failover");
    let stored = format!("c:{}", check.key);
    let master = cluster.master_of(&stored);
    let replica = replica_of(master);
    let link = common::proxy::Proxy::start(master).await;
    let bus = (master + 10_000).to_string();
    cli(
        master,
        &["CONFIG", "SET", "cluster-announce-bus-port", &bus],
    );
    cli(
        master,
        &[
            "CONFIG",
            "SET",
            "cluster-announce-port",
            &link.port.to_string(),
        ],
    );
    let via = format!("master_port:{}", link.port);
    common::redis::wait_until(
        "the replica through the proxy",
        Duration::from_secs(20),
        || {
            let info = cli(replica, &["INFO", "replication"]);
            info.contains(&via) && info.contains("master_link_status:up")
        },
    );
    let decide = |store: RedisStore| decide(store, check.clone());
    // The hits go to the master directly (it serves its own slots to any client).
    let direct = common::redis::connected_store(
        Topology::Standalone(format!("redis://127.0.0.1:{master}")),
        "c:",
    )
    .await;
    for _ in 0..LIMIT - lag {
        assert!(decide(direct.clone()).await.expect("decided"));
    }
    // Replicated: the replica's offset, as the master sees it, is the master's.
    common::redis::wait_until("the hits replicated", Duration::from_secs(10), || {
        let info = cli(master, &["INFO", "replication"]);
        let offset = info
            .lines()
            .find_map(|l| l.strip_prefix("master_repl_offset:"))
            .unwrap_or("?")
            .trim()
            .to_owned();
        info.lines()
            .any(|l| l.starts_with("slave0:") && l.contains(&format!("offset={offset},")))
    });
    spend_the_lag_on_the_master_alone(&link, direct, &check, lag).await;
    cluster.node_mut(master).kill();
    common::redis::wait_until("the replica elected", Duration::from_secs(30), || {
        cli(replica, &["INFO", "replication"]).contains("role:master")
            && cli(replica, &["CLUSTER", "INFO"]).contains("cluster_state:ok")
    });
    let seeds = vec![format!("127.0.0.1:{replica}")];
    let store = common::redis::connected_store(Topology::Cluster(seeds), "c:").await;
    admitted_until_refused(store, check).await
}
