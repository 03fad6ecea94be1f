//! Faults of a Cluster and of Sentinel: a master killed, a slot migrated under load, a
//! failover.

use super::*;

/// The Cluster scenarios: the service on `cluster`, load running for a second with every hot and
/// fresh key in one slot; that slot and the master serving it.
async fn on_cluster(
    name: &'static str,
    cluster: &RedisCluster,
) -> (Harness, Load, Vec<String>, u16, u16) {
    let seeds = cluster.seeds().join(",");
    let ports: Vec<u16> = cluster.nodes.iter().map(|n| n.port).collect();
    let probe_tag = tag("hot", "h0");
    let master = cluster.master_of(&probe_tag);
    let slot = slot_of(&probe_tag);
    let harness = Harness::start(name, &["--redis-cluster", &seeds], ports).await;
    let hot = hot_keys(Some(slot));
    let load = Load::start(&harness.client, &hot, &fresh_keys(Some(slot)));
    tokio::time::sleep(Duration::from_secs(1)).await;
    (harness, load, hot, slot, master)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_master_killed() {
    let mut cluster = RedisCluster::start();
    // Every hot and fresh key on the victim's slots: the whole load feels the failover.
    let (mut harness, load, hot, _, victim) = on_cluster(
        "a Cluster master SIGKILLed (its replica promoted)",
        &cluster,
    )
    .await;
    let fault = Instant::now();
    cluster.node_mut(victim).kill();
    // Self-healing: the replica takes over on its own; recovery is measured from the kill.
    let report = harness.finish(load, fault, fault, 1, &hot).await;
    assert!(report.failure_answers > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slot_migrated_under_load() {
    let cluster = RedisCluster::start_with_replicas(0);
    let ports: Vec<u16> = cluster.nodes.iter().map(|n| n.port).collect();
    let (mut harness, load, hot, slot, source) =
        on_cluster("a slot migrated under load (ASK, then MOVED)", &cluster).await;
    let target = *ports
        .iter()
        .find(|p| **p != source)
        .expect("another master");
    let id = |port: u16| cli(port, &["CLUSTER", "MYID"]);
    let (source_id, target_id) = (id(source), id(target));
    let s = slot.to_string();
    let fault = Instant::now();
    assert_eq!(
        cli_async(target, &["CLUSTER", "SETSLOT", &s, "IMPORTING", &source_id]).await,
        "OK"
    );
    assert_eq!(
        cli_async(source, &["CLUSTER", "SETSLOT", &s, "MIGRATING", &target_id]).await,
        "OK"
    );
    // Keys move a few at a time while the load goes on: new keys are sent on with ASK.
    for _ in 0..100 {
        let keys = cli_async(source, &["CLUSTER", "GETKEYSINSLOT", &s, "20"]).await;
        let keys: Vec<&str> = keys.lines().filter(|l| !l.is_empty()).collect();
        if !keys.is_empty() {
            let mut args = vec!["MIGRATE", "127.0.0.1"];
            let target_port = target.to_string();
            args.push(&target_port);
            args.extend(["", "0", "5000", "KEYS"]);
            args.extend(keys.iter());
            let out = cli_async(source, &args).await;
            assert!(out == "OK" || out == "NOKEY", "MIGRATE: {out}");
        } else {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        cli_async(source, &["CLUSTER", "COUNTKEYSINSLOT", &s]).await,
        "0"
    );
    for port in &ports {
        assert_eq!(
            cli_async(*port, &["CLUSTER", "SETSLOT", &s, "NODE", &target_id]).await,
            "OK"
        );
    }
    let healed = Instant::now();
    let report = harness.finish(load, fault, healed, 0, &hot).await;
    assert_eq!(
        report.failure_answers,
        0,
        "ASK and MOVED are followed: the script did not run, so it is sent on:\n{}",
        harness.server.log()
    );
    assert_ne!(cli(target, &["CLUSTER", "COUNTKEYSINSLOT", &s]), "0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sentinel_failover() {
    let mut setup = RedisSentinel::start();
    let sentinels = setup.sentinel_addrs().join(",");
    let ports = vec![setup.master.port, setup.replica.port];
    let mut harness = Harness::start(
        "Sentinel failover (master SIGKILLed)",
        &["--redis-sentinel", &sentinels, "--redis-master", "mymaster"],
        ports,
    )
    .await;
    let hot = hot_keys(None);
    let load = Load::start(&harness.client, &hot, &fresh_keys(None));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let fault = Instant::now();
    setup.master.kill();
    let replica = setup.replica.port;
    tokio::task::block_in_place(|| {
        wait_until("the replica promoted", Duration::from_secs(30), || {
            cli(replica, &["ROLE"]).starts_with("master")
        })
    });
    let report = harness.finish(load, fault, fault, 1, &hot).await;
    assert!(report.failure_answers > 0);
}
