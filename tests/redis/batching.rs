//! Batching: concurrent calls share script calls and still admit exactly the limit, on standalone
//! and per Cluster slot and node; a batch over slots with a key its node does not serve changes
//! nothing; each call of a batch is charged by its own mode.

use crate::common::redis::{decide, decide_in, plain_connection};

use std::sync::Arc;
use std::time::Duration;

use crate::common::redis::connected_store;
use crate::common::redis::{RedisCluster, RedisServer, cli, script_calls};
use portcullis::algorithm::{Algorithm, ChargeMode, Check, Limit, key};
use portcullis::store::redis::{ScriptClock, Topology};

fn hourly(requests: u64) -> Limit {
    Limit {
        algorithm: Algorithm::SlidingWindow,
        requests,
        window_us: 3_600_000_000,
        burst: requests,
    }
}

fn check_of(name: &str, limit: Limit) -> Check {
    Check {
        key: key::counter_key("batch", [("k", name)], &limit, None),
        limit,
        hits: 1,
        refund: false,
        post_paid: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_share_script_calls_and_admit_exactly_the_limit() {
    let redis = RedisServer::start();
    let store = Arc::new(connected_store(Topology::Standalone(redis.url()), "b1:").await);
    cli(redis.port, &["CONFIG", "RESETSTAT"]);
    let check = check_of("hot", hourly(100));
    let calls: Vec<_> = (0..300)
        .map(|_| {
            let store = store.clone();
            let check = check.clone();
            tokio::spawn(async move {
                decide(&store, &[check], ScriptClock::RedisTime).await[0].allowed
            })
        })
        .collect();
    let mut admitted = 0;
    for call in calls {
        admitted += usize::from(call.await.unwrap());
    }
    assert_eq!(admitted, 100, "exactly the limit, batched or not");
    let scripts = script_calls(redis.port);
    assert!(
        scripts < 300,
        "300 concurrent calls went out as {scripts} script calls: not batched"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_on_one_cluster_slot_share_script_calls_and_admit_exactly_the_limit() {
    let cluster = RedisCluster::start_with_replicas(0);
    let store = Arc::new(connected_store(Topology::Cluster(cluster.seeds()), "b2:").await);
    for node in &cluster.nodes {
        cli(node.port, &["CONFIG", "RESETSTAT"]);
    }
    // A hot key, and a cold one per call on other slots: each slot batches on its own.
    let check = check_of("hot", hourly(100));
    let calls: Vec<_> = (0..300)
        .map(|n| {
            let store = store.clone();
            let check = check.clone();
            let cold = check_of(&format!("cold-{n}"), hourly(100));
            tokio::spawn(async move {
                let d = decide(&store, &[check, cold], ScriptClock::RedisTime).await;
                assert!(d[1].allowed, "a cold key has room");
                d[0].allowed
            })
        })
        .collect();
    let mut admitted = 0;
    for call in calls {
        admitted += usize::from(call.await.unwrap());
    }
    assert_eq!(admitted, 100, "exactly the limit, batched or not");
    let hot = cluster.master_of(&format!(
        "{{{}}}",
        check.key.split(['{', '}']).nth(1).unwrap()
    ));
    let scripts = script_calls(hot);
    // The hot slot's node also ran some of the cold keys' calls (about a third).
    assert!(
        scripts < 300,
        "300 concurrent calls on one slot went out as {scripts} script calls on its node: not batched"
    );
}

/// Distinct keys on different slots of one Cluster node ride one script call (Redis 7's
/// cross-slot script flag): 600 calls on 300 keys spread over the slots go out as far fewer
/// script calls, and each key admits exactly its limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_on_distinct_keys_of_one_cluster_node_share_script_calls() {
    use portcullis::store::redis::cluster_batch::slot_of;
    let cluster = RedisCluster::start_with_replicas(0);
    let store = Arc::new(connected_store(Topology::Cluster(cluster.seeds()), "nodes:").await);
    // The node map is read in the background once connected (every node here runs Redis 7).
    let mut polls = 0;
    while !store.batches_by_node() {
        assert!(polls < 200, "Cluster batching never went per node");
        tokio::time::sleep(Duration::from_millis(50)).await;
        polls += 1;
    }
    for node in &cluster.nodes {
        cli(node.port, &["CONFIG", "RESETSTAT"]);
    }
    let slots: std::collections::HashSet<u16> = (0..300)
        .map(|n| slot_of(&store.redis_key(&check_of(&format!("k{n}"), hourly(1)))))
        .collect();
    assert!(slots.len() > 250, "the keys share slots: {}", slots.len());
    for (round, expected) in [300, 0].into_iter().enumerate() {
        let calls: Vec<_> = (0..300)
            .map(|n| {
                let store = store.clone();
                tokio::spawn(async move {
                    let check = check_of(&format!("k{n}"), hourly(1));
                    decide(&store, &[check], ScriptClock::RedisTime).await[0].allowed
                })
            })
            .collect();
        let mut admitted = 0;
        for call in calls {
            admitted += usize::from(call.await.unwrap());
        }
        assert_eq!(
            admitted, expected,
            "round {round}: each key admits exactly its one"
        );
    }
    let scripts: u64 = cluster.nodes.iter().map(|n| script_calls(n.port)).sum();
    assert!(
        scripts < 300,
        "600 calls on {} slots went out as {scripts} script calls: not batched per node",
        slots.len()
    );
}

/// A batch over several slots may carry a key its node does not serve (the node map is stale, or
/// the key's slot is half migrated and the key already gone): the script checks every key before
/// it starts and answers TRYAGAIN having written nothing, so the batch may go again call by call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_over_slots_with_a_key_its_node_does_not_serve_changes_nothing() {
    use portcullis::store::redis::script;
    let cluster = RedisCluster::start_with_replicas(0);
    let node = cluster.nodes[0].port;
    let other = cluster.nodes[1].port;
    let other_id = cli(other, &["CLUSTER", "MYID"]).trim().to_owned();
    let key_of = |check: &Check| format!("x:{}", check.key);
    // Keys of `node` on three different slots, and one of another node.
    let mut here: Vec<Check> = Vec::new();
    let mut elsewhere = None;
    for n in 0..500 {
        let check = check_of(&format!("s{n}"), hourly(5));
        if cluster.master_of(&key_of(&check)) == node {
            let slot = portcullis::store::redis::cluster_batch::slot_of(&key_of(&check));
            let fresh = here
                .iter()
                .all(|c| portcullis::store::redis::cluster_batch::slot_of(&key_of(c)) != slot);
            if fresh && here.len() < 3 {
                here.push(check);
            }
        } else if elsewhere.is_none() {
            elsewhere = Some(check);
        }
    }
    let elsewhere = elsewhere.expect("a key of another node");
    assert_eq!(here.len(), 3);
    let migrating = portcullis::store::redis::cluster_batch::slot_of(&key_of(&here[2]));
    cli(
        node,
        &[
            "CLUSTER",
            "SETSLOT",
            &migrating.to_string(),
            "MIGRATING",
            &other_id,
        ],
    );
    let conn = plain_connection(node).await;
    // One call per key, the keys carried in the arguments as a batch over slots is sent.
    let send = |checks: Vec<Check>| {
        let mut conn = conn.clone();
        async move {
            let keys: Vec<String> = checks.iter().map(key_of).collect();
            // The number of calls, a place for the count of keys carried, then each call.
            let mut numbers = vec![checks.len() as i64, 0];
            for check in &checks {
                script::push_call(
                    &[check],
                    ScriptClock::RedisTime,
                    0,
                    script::mode_arg(ChargeMode::EachAlone),
                    &mut numbers,
                );
            }
            let packed = script::pack(&keys, &numbers, true).expect("arguments match the keys");
            let mut cmd = redis::cmd("EVAL");
            cmd.arg(script::SOURCE)
                .arg(1)
                .arg(packed.keys[0])
                .arg(&packed.numbers)
                .arg(&packed.keys);
            cmd.query_async::<redis::Value>(&mut conn).await
        }
    };
    // A charge, then a refund of nothing on the same key (a refund writes the key's state at
    // once), then the key the node does not serve: without the check first, the charge would be
    // written before the script failed.
    let refund = Check {
        hits: 0,
        refund: true,
        ..here[0].clone()
    };
    for (case, last) in [
        ("another node's key", elsewhere.clone()),
        ("a half-migrated slot's missing key", here[2].clone()),
    ] {
        let batch = vec![here[0].clone(), refund.clone(), last];
        let answer = send(batch).await;
        let error = answer.expect_err(case);
        assert_eq!(error.code(), Some("TRYAGAIN"), "{case}: {error}");
        assert_eq!(
            cli(node, &["EXISTS", &key_of(&here[0])]).trim(),
            "0",
            "{case}: the batch's first key was written"
        );
    }
    // Keys all served here, on different slots: one script call decides them all.
    let reply = send(vec![here[0].clone(), here[1].clone()])
        .await
        .expect("a batch of this node's keys runs");
    let calls = script::parse_reply(&reply).expect("a reply");
    assert_eq!(calls.len(), 2);
    for (call, check) in calls.iter().zip([&here[0], &here[1]]) {
        let decision =
            script::decision(check, call[0].as_ref().expect("decided"), true).expect("a decision");
        assert!(decision.allowed);
        assert_eq!(decision.remaining, 4);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_call_of_a_batch_is_charged_by_its_own_mode() {
    let redis = RedisServer::start();
    let store = Arc::new(connected_store(Topology::Standalone(redis.url()), "b2:").await);
    cli(redis.port, &["CONFIG", "RESETSTAT"]);
    // 120 calls at once share a budget of 40 on `shared`; half are all-or-nothing (their own key
    // may be charged only when `shared` admits them), half charge each descriptor alone (their
    // own key is charged whatever `shared` says).
    let shared = check_of("shared", hourly(40));
    let calls: Vec<_> = (0..120)
        .map(|i| {
            let store = store.clone();
            let shared = shared.clone();
            tokio::spawn(async move {
                let all_or_nothing = i % 2 == 0;
                let own = check_of(&format!("own{i}"), hourly(1));
                let mode = if all_or_nothing {
                    ChargeMode::AllOrNothing
                } else {
                    ChargeMode::EachAlone
                };
                let decisions =
                    decide_in(&store, &[shared, own], ScriptClock::RedisTime, mode).await;
                (i, all_or_nothing, decisions[0].allowed)
            })
        })
        .collect();
    let mut admitted = 0;
    let mut outcomes = Vec::new();
    for call in calls {
        let (i, all_or_nothing, passed) = call.await.unwrap();
        admitted += usize::from(passed);
        outcomes.push((i, all_or_nothing, passed));
    }
    assert_eq!(admitted, 40);
    let scripts = script_calls(redis.port);
    assert!(
        scripts < 120,
        "120 calls went out as {scripts} script calls"
    );
    for (i, all_or_nothing, passed) in outcomes {
        // Look without charging: remaining 0 means the call charged its own key.
        let own = check_of(&format!("own{i}"), hourly(1));
        let looked = decide_in(&store, &[own], ScriptClock::RedisTime, ChargeMode::Probe).await;
        let charged = looked[0].remaining == 0;
        if all_or_nothing {
            assert_eq!(charged, passed, "all-or-nothing call {i}");
        } else {
            assert!(charged, "each-alone call {i} charges its own key");
        }
    }
}

/// A give-back's deadline is its window's end, milliseconds away: batched with callers' calls
/// it gave them all up at it (the hot counters' give-backs near a sub-window's end failed
/// calls with seconds left). It goes in a script call of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_give_back_never_gives_up_the_calls_batched_beside_it() {
    use portcullis::store::Store;
    use tokio::time::Instant;
    let redis = RedisServer::start();
    let config = crate::common::redis::plain_config(Topology::Standalone(redis.url()), 1);
    let store = portcullis::store::RedisStore::new(&config, "b5:", Default::default()).unwrap();
    store
        .probe(Duration::from_secs(10))
        .await
        .expect("Redis usable");
    let store = Arc::new(store);
    let mut failed = Vec::new();
    for _ in 0..5 {
        let calls: Vec<_> = (0..400u32)
            .map(|i| {
                let store = store.clone();
                tokio::spawn(async move {
                    let mut check = check_of(&format!("k{}", i % 40), hourly(1_000_000));
                    if i % 5 == 0 {
                        // A give-back into a window ending a millisecond from now.
                        check.refund = true;
                        let ends = Instant::now() + Duration::from_millis(1);
                        let _ = store.give_back(&[check], ends).await;
                        return None;
                    }
                    let deadline = Instant::now() + Duration::from_secs(5);
                    Some(store.check(&[check], deadline, ChargeMode::EachAlone).await)
                })
            })
            .collect();
        for call in calls {
            if let Some(answers) = call.await.unwrap()
                && let Err(e) = &answers[0]
            {
                failed.push(e.to_string());
            }
        }
    }
    assert!(
        failed.is_empty(),
        "{} calls failed: {:?}",
        failed.len(),
        failed.first()
    );
}
