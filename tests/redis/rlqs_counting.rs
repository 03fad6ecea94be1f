//! Replicas that serve no RLQS beside one that does, on one Redis: their RLS checks count the
//! gateways' claims from the first grant and while the claims stand, the Go drop-in mode's too,
//! and their calls on held descriptors are RLS demand. Split from rlqs.rs, whose replicas and
//! rules these share.

use crate::common;

use std::time::Duration;

use crate::common::redis::{RedisServer, redis_settings};
use crate::common::rlqs::{Gateway, assigned, tokens_per_second};
use crate::rlqs::replica;

/// A replica that does not serve RLQS, on a Redis where none does, never reads a holder table
/// (RLS pays nothing for RLQS); once a replica serving RLQS is on the same Redis, its RLS checks
/// count the grants' claims from the first grant (issue 43: they used to start up to 5 s later,
/// when the other replica next looked, and RLS admitted the whole rule beside the gateway's
/// grant meanwhile), and for as long as the claims may stand (the flag outlives a minute's
/// claim, not only its own 30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_without_rlqs_counts_claims_from_the_first_grant_and_while_they_stand() {
    use portcullis::pb::rate_limit_response::Code;
    let redis = RedisServer::start();
    let b = replica(|s| {
        redis_settings(s, &redis);
        s.rlqs.rlqs = false;
    })
    .await;
    let tenant: &[(&str, &str)] = &[("tenant", "counted")];
    let call = || common::request("edge", &[tenant]);
    for _ in 0..5 {
        assert_eq!(b.ok(call()).await.overall_code, Code::Ok as i32);
    }
    let stats = common::redis::cli(redis.port, &["INFO", "commandstats"]);
    assert!(!stats.contains("cmdstat_hvals"), "{stats}");
    // B's calls leave the sliding second (a hit is forgotten within 1 + 1/60 s): the gateway's
    // grant is then the whole rule however soon it comes.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let a = replica(|s| redis_settings(s, &redis)).await;
    let mut gateway = Gateway::open(&a).await;
    let grant = |actions: Vec<portcullis::pb::rlqs::BucketAction>| assigned(&actions[0]);
    // The whole rule (the grant waits until B has seen A's flag).
    let first = grant(gateway.report("edge", &[(tenant, 30, 0)]).await.unwrap());
    assert!(tokens_per_second(&first) >= 9.0, "{first}");
    // At once: B's calls pass its own 10 a second, and are refused for the claim alone.
    let refused = b.ok(call()).await;
    assert_eq!(
        refused.overall_code,
        Code::OverLimit as i32,
        "B admitted beside the gateway's first grant ({first}): {refused:?}"
    );
    let stats = common::redis::cli(redis.port, &["INFO", "commandstats"]);
    assert!(stats.contains("cmdstat_hvals"), "{stats}");
    // A grant on a minute's rule claims for its time to live and a minute after: A's flag
    // stands that long (every replica counts meanwhile), past its own 30 s.
    let team: &[(&str, &str)] = &[("team", "long")];
    grant(gateway.report("edge", &[(team, 30, 0)]).await.unwrap());
    let flag: i64 = common::redis::cli(redis.port, &["PTTL", "portcullis:{rlqs-in-use}"])
        .parse()
        .expect("the flag's TTL");
    assert!(flag > 60_000, "the RLQS flag stands {flag} ms");
    a.stop().await;
    b.stop().await;
}

/// A replica in the Go drop-in mode (which serves no RLQS) beside one that serves it, on one
/// Redis and key prefix: its RLS checks count the gateways' claims, and its calls are RLS
/// demand, as any replica's. They used not to (no claims were counted in the Go mode without
/// RLQS), and it admitted the whole rule beside a gateway granted the whole rule: twice the
/// limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_in_the_go_mode_counts_the_grants_claims() {
    use portcullis::pb::rate_limit_response::Code;
    let redis = RedisServer::start();
    let go = replica(|s| {
        redis_settings(s, &redis);
        s.rlqs.rlqs = false;
        s.env_compat = Some("go".into());
    })
    .await;
    let a = replica(|s| redis_settings(s, &redis)).await;
    let tenant: &[(&str, &str)] = &[("tenant", "go")];
    let mut gateway = Gateway::open(&a).await;
    let first = assigned(&gateway.report("edge", &[(tenant, 30, 0)]).await.unwrap()[0]);
    assert!(tokens_per_second(&first) >= 9.0, "{first}");
    let refused = go.ok(common::request("edge", &[tenant])).await;
    assert_eq!(
        refused.overall_code,
        Code::OverLimit as i32,
        "the Go-mode replica admitted beside the gateway's grant of the whole rule ({first})"
    );
    // Its calls are RLS demand (pushed within a second): the gateway's next shares leave it a
    // part of the rate.
    let started = std::time::Instant::now();
    loop {
        go.ok(common::request("edge", &[tenant])).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = assigned(&gateway.report("edge", &[(tenant, 1, 0)]).await.unwrap()[0]);
        if tokens_per_second(&now) < 9.0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the Go-mode replica's calls never reached the gateway's share: {now}"
        );
    }
    a.stop().await;
    go.stop().await;
}

/// A replica deciding hot counters from claims (`--hot-descriptor-rate`) beside a gateway that
/// holds part of a rule: it never claims the held descriptor (its calls go to Redis, counting
/// the gateway's claim; a claim there would be spent where the gateways' shares never see it as
/// demand), and its calls are RLS demand, so the gateway's share leaves RLS its part.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_replica_leaves_a_held_descriptor_to_redis_and_its_calls_are_demand() {
    let redis = RedisServer::start();
    let hot = replica(|s| {
        redis_settings(s, &redis);
        s.rlqs.rlqs = false;
        s.hot_descriptor_rate = 5.0;
    })
    .await;
    let a = replica(|s| redis_settings(s, &redis)).await;
    // A minute's rule (120): the gateway's grant claims a few of its window, the rest is room a
    // replica could claim.
    let team: &[(&str, &str)] = &[("team", "hot")];
    let mut gateway = Gateway::open(&a).await;
    let first = assigned(&gateway.report("edge", &[(team, 30, 0)]).await.unwrap()[0]);
    assert!(tokens_per_second(&first) >= 1.9, "{first}");
    let started = std::time::Instant::now();
    loop {
        // Hot on this replica: 20 calls in about 100 ms.
        for _ in 0..20 {
            hot.ok(common::request("edge", &[team])).await;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let now = assigned(&gateway.report("edge", &[(team, 1, 0)]).await.unwrap()[0]);
        if tokens_per_second(&now) < 1.9 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the hot replica's calls never reached the gateway's share: {now}"
        );
    }
    let hot_metrics = &hot.running.as_ref().expect("running").metrics.hot;
    assert_eq!(
        hot_metrics.claims_taken.get(),
        0,
        "a held descriptor was claimed"
    );
    assert_eq!(hot_metrics.decisions.get(), 0);
    a.stop().await;
    hot.stop().await;
}
