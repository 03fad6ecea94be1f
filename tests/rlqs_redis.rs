//! RLQS grants in Redis, shared by every replica: the script grants as the memory model does on
//! random report sequences (standalone and Cluster); two replicas on one Redis (standalone,
//! Cluster, through Sentinel) share one rule
//! among the gateways streaming to each, never granting more than its rate together; a gateway
//! that stops reporting loses its share when its grant expires on Redis' clock; RLS calls through
//! one replica count against what a gateway on another holds, and get their fair part.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::TestServer;
use common::redis::{RedisCluster, RedisServer, connected_store, redis_settings};
use common::rlqs::{Gateway, assigned, tokens_per_second};
use portcullis::clock::ManualClock;
use portcullis::store::quota::{Ask, AskKind, MemoryQuota, QuotaStore};
use portcullis::store::redis::Topology;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

/// Random reports of five gateways on three rules, with RLS demand of three replicas and streams'
/// ends among them, against Redis and
/// against the memory model: the same grants, report after report, and at the end the same
/// reservations read back (what RLS on every replica counts against).
async fn grants_match_the_model(store: &dyn QuotaStore, seed: u64) {
    let model = MemoryQuota::new(Arc::new(ManualClock::new(1)));
    let mut rng = StdRng::seed_from_u64(seed);
    let capacities = [10.0, 0.1, 2500.0 / 3600.0];
    for step in 0..300 {
        let asks: Vec<Ask> = (0..rng.random_range(1..=3))
            .map(|_| {
                let rule = rng.random_range(0..3);
                // RLS demand, a stream's end, or a report.
                let kind = match rng.random_range(0..20) {
                    0..3 => AskKind::Demand,
                    3..5 => AskKind::Release,
                    _ => AskKind::Grant,
                };
                let demand_only = kind == AskKind::Demand;
                Ask {
                    key: format!("{{m{seed}|rule={rule}}}"),
                    capacity: capacities[rule],
                    // RLS demand of three replicas, two of whose ids are also gateways': one
                    // holder together, and apart from those gateways.
                    gateway: if demand_only {
                        rng.random_range(4..=6)
                    } else {
                        rng.random_range(1..=5)
                    },
                    demand: if rng.random_bool(0.2) {
                        0.0
                    } else {
                        rng.random_range(0.0..30.0)
                    },
                    // Longer than the test: no grant expires in the middle of the comparison.
                    ttl_us: 3_600_000_000,
                    kind,
                }
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(5);
        let want: Vec<_> = model
            .grant(&asks, deadline)
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
        let got: Vec<_> = store
            .grant(&asks, deadline)
            .await
            .into_iter()
            .map(|g| g.expect("Redis grants"))
            .collect();
        assert_eq!(got, want, "step {step}: {asks:?}");
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    let want = model.reservations(deadline).await.unwrap();
    let got = store.reservations(deadline).await.unwrap();
    assert_eq!(want.len(), 3, "{want:?}");
    assert_eq!(got.len(), want.len(), "{got:?} against {want:?}");
    for (tag, held) in want {
        assert!((got[&tag] - held).abs() < 1e-9, "{tag}: {got:?}");
    }
}

#[tokio::test]
async fn the_script_grants_as_the_model_on_standalone_and_cluster() {
    let redis = RedisServer::start();
    let store = connected_store(Topology::Standalone(redis.url()), "q:").await;
    grants_match_the_model(&store, 1).await;
    let cluster = RedisCluster::start();
    let store = connected_store(Topology::Cluster(cluster.seeds()), "q:").await;
    grants_match_the_model(&store, 2).await;
    // Every key the script wrote has a TTL.
    let keys = common::redis::cli(redis.port, &["--scan"]);
    assert!(!keys.trim().is_empty());
    for key in keys.lines() {
        let ttl: i64 = common::redis::cli(redis.port, &["PTTL", key])
            .trim()
            .parse()
            .unwrap();
        assert!(ttl > 0, "{key} has no TTL ({ttl})");
    }
}

const RULES: &str = "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 10}\n  - key: team\n    rate_limit: {unit: minute, requests_per_unit: 120}\n";

async fn replica(adjust: impl FnOnce(&mut portcullis::settings::Settings)) -> TestServer {
    TestServer::start_with(&[("edge.yaml", RULES)], |s| {
        s.rlqs.rlqs = true;
        s.rlqs.rlqs_reporting_interval = Duration::from_secs(1);
        // Each answer a test reads is the one to its report (pushes: tests/envoy_rlqs.rs).
        s.rlqs.rlqs_push_interval = Duration::ZERO;
        adjust(s);
    })
    .await
}

async fn two_replicas_share_one_rule(a: &TestServer, b: &TestServer) {
    let mut one = Gateway::open(a).await;
    let mut two = Gateway::open(b).await;
    let tenant: &[(&str, &str)] = &[("tenant", "shared")];
    let grant = |actions: Vec<portcullis::pb::rlqs::BucketAction>| assigned(&actions[0]);
    assert_eq!(
        grant(one.report("edge", &[(tenant, 30, 0)]).await.unwrap()),
        "tokens 10/1s max 10 ttl 3s"
    );
    // Through the other replica: the first gateway's grant is seen, nothing is left yet.
    assert_eq!(
        grant(two.report("edge", &[(tenant, 30, 0)]).await.unwrap()),
        "deny_all ttl 3s"
    );
    assert_eq!(
        grant(one.report("edge", &[(tenant, 30, 0)]).await.unwrap()),
        "tokens 5/1s max 5 ttl 3s"
    );
    assert_eq!(
        grant(two.report("edge", &[(tenant, 30, 0)]).await.unwrap()),
        "tokens 5/1s max 5 ttl 3s"
    );
    // The first gateway stops reporting: once its grant has expired on Redis' clock, the second
    // gets the whole rate (bounded wait: the grant lasts 3 s).
    let started = std::time::Instant::now();
    loop {
        let now = grant(two.report("edge", &[(tenant, 30, 0)]).await.unwrap());
        if now == "tokens 10/1s max 10 ttl 3s" {
            break;
        }
        assert_eq!(now, "tokens 5/1s max 5 ttl 3s");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the grant never expired"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(started.elapsed() >= Duration::from_secs(2), "expired early");
}

/// RLS calls through one replica count against what a gateway streaming to the other holds of
/// the same descriptor, and their demand shrinks that gateway's next share: together, never
/// more than the rate (120 a minute here).
async fn rls_on_one_replica_beside_a_gateway_on_the_other(a: &TestServer, b: &TestServer) {
    use portcullis::pb::rate_limit_response::Code;
    let team: &[(&str, &str)] = &[("team", "shared")];
    let call = || common::request("edge", &[team]);
    let grant = |actions: Vec<portcullis::pb::rlqs::BucketAction>| assigned(&actions[0]);
    let mut gateway = Gateway::open(a).await;
    assert_eq!(
        grant(gateway.report("edge", &[(team, 30, 0)]).await.unwrap()),
        "tokens 2/1s max 2 ttl 3s"
    );
    // B reads the reservation back within a second (bounded wait on its gauge).
    let reserved = |server: &TestServer| {
        let metrics = server.running.as_ref().unwrap().metrics.encode();
        common::sample(&metrics, "portcullis_rlqs_reserved_descriptors")
    };
    let started = std::time::Instant::now();
    while reserved(b) < 1.0 {
        assert!(started.elapsed() < Duration::from_secs(3), "never read");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The gateway holds it all: RLS through B is refused, and asks.
    for _ in 0..5 {
        assert_eq!(b.ok(call()).await.overall_code, Code::OverLimit as i32);
    }
    // B pushes that demand within a second: the gateway's next report leaves RLS a part.
    let started = std::time::Instant::now();
    let held = loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let held = tokens_per_second(&grant(
            gateway.report("edge", &[(team, 30, 0)]).await.unwrap(),
        ));
        if held < 2.0 {
            break held;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "RLS never asked"
        );
    };
    assert!(held > 0.0);
    // Once B has read the smaller grant, RLS through B gets exactly the rest of the minute.
    let started = std::time::Instant::now();
    while b.ok(call()).await.overall_code != Code::Ok as i32 {
        assert!(started.elapsed() < Duration::from_secs(3), "never read");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut admitted = 1;
    while b.ok(call()).await.overall_code == Code::Ok as i32 {
        admitted += 1;
        assert!(admitted <= 120);
    }
    let rest = (120.0 * (1.0 - held / 2.0) + 1e-9).floor() as u64;
    assert_eq!(admitted, rest, "RLS beside a grant of {held}/s");
}

/// Two replicas with `settings`, each with a gateway's stream, sharing one rule; and RLS through
/// one beside RLQS through the other; then pushes between them.
async fn two_replicas_on(settings: impl Fn(&mut portcullis::settings::Settings) + Copy) {
    let a = replica(settings).await;
    let b = replica(settings).await;
    // First: B's gauge of reserved descriptors then counts this one only.
    rls_on_one_replica_beside_a_gateway_on_the_other(&a, &b).await;
    two_replicas_share_one_rule(&a, &b).await;
    a.stop().await;
    b.stop().await;
    let pushing = |s: &mut portcullis::settings::Settings| {
        settings(s);
        s.rlqs.rlqs_push_interval = Duration::from_millis(100);
    };
    let a = replica(pushing).await;
    let b = replica(pushing).await;
    a_newcomer_on_one_replica_shrinks_a_holder_on_the_other(&a, &b).await;
    a.stop().await;
    b.stop().await;
}

/// A gateway on B short of its part (A's gateway holds the rule whole): A reads the contested
/// descriptor from the store and pushes its gateway the smaller grant, then B its own the
/// grown one, with neither reporting again.
async fn a_newcomer_on_one_replica_shrinks_a_holder_on_the_other(a: &TestServer, b: &TestServer) {
    let tenant: &[(&str, &str)] = &[("tenant", "contested")];
    let mut one = Gateway::open(a).await;
    let mut two = Gateway::open(b).await;
    assert_eq!(
        assigned(&one.report("edge", &[(tenant, 30, 0)]).await.unwrap()[0]),
        "tokens 10/1s max 10 ttl 3s"
    );
    assert_eq!(
        assigned(&two.report("edge", &[(tenant, 30, 0)]).await.unwrap()[0]),
        "deny_all ttl 3s"
    );
    let shrunk = one.pushed(Duration::from_secs(2)).await.expect("a push");
    assert_eq!(assigned(&shrunk[0]), "tokens 5/1s max 5 ttl 3s");
    let mut grown = None;
    for _ in 0..10 {
        if let Some(actions) = two.pushed(Duration::from_millis(300)).await {
            grown = Some(assigned(&actions[0]));
            break;
        }
    }
    assert_eq!(grown.as_deref(), Some("tokens 5/1s max 5 ttl 3s"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_on_one_redis_share_one_rule() {
    let redis = RedisServer::start();
    two_replicas_on(|s| redis_settings(s, &redis)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_on_one_cluster_share_one_rule() {
    let cluster = RedisCluster::start();
    let settings = |s: &mut portcullis::settings::Settings| {
        s.store = portcullis::settings::StoreKind::Redis;
        s.redis_cluster = cluster.seeds();
        s.store_timeout = Duration::from_secs(2);
    };
    two_replicas_on(settings).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_through_sentinel_share_one_rule() {
    let setup = common::redis::RedisSentinel::start();
    let settings = |s: &mut portcullis::settings::Settings| {
        s.store = portcullis::settings::StoreKind::Redis;
        s.redis_sentinel = setup.sentinel_addrs();
        s.redis_master = Some("mymaster".into());
        s.store_timeout = Duration::from_secs(2);
    };
    two_replicas_on(settings).await;
}

/// Redis away: the failure mode decides what a bucket is assigned (allow: ALLOW_ALL for a short
/// while; deny: DENY_ALL; local: a share from this replica's memory, which RLS through the same
/// replica, counting locally too, counts against), and it is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_down_the_failure_mode_assigns() {
    use portcullis::limiter::FailureMode;
    let mut redis = RedisServer::start();
    let modes = [
        (FailureMode::Allow, "allow_all ttl 2s"),
        (FailureMode::Deny, "deny_all ttl 2s"),
        (FailureMode::Local, "tokens 10/1s max 10 ttl 3s"),
    ];
    let mut servers = Vec::new();
    for (mode, _) in &modes {
        let mode = *mode;
        servers.push(
            replica(|s| {
                redis_settings(s, &redis);
                s.store_timeout = Duration::from_millis(300);
                s.failure_mode = mode;
            })
            .await,
        );
    }
    // Each replica granted from Redis while it is up (a tenant each: one rule's rate apiece).
    for (server, tenant) in servers.iter().zip(["t0", "t1", "t2"]) {
        let mut g = Gateway::open(server).await;
        let actions = g
            .report("edge", &[(&[("tenant", tenant)], 1, 0)])
            .await
            .unwrap();
        assert!(assigned(&actions[0]).starts_with("tokens"), "{actions:?}");
    }
    redis.kill();
    for (server, (mode, expected)) in servers.iter().zip(modes) {
        let mut g = Gateway::open(server).await;
        let actions = g
            .report("edge", &[(&[("tenant", "u")], 1, 0)])
            .await
            .unwrap();
        assert_eq!(assigned(&actions[0]), expected, "{mode:?}");
        if mode == FailureMode::Local {
            // RLS through this replica counts locally too, against its own grants: the gateway
            // holds the whole of tenant u; another tenant is free.
            use portcullis::pb::rate_limit_response::Code;
            let u = server
                .ok(common::request("edge", &[&[("tenant", "u")]]))
                .await;
            assert_eq!(u.overall_code, Code::OverLimit as i32, "{u:?}");
            let v = server
                .ok(common::request("edge", &[&[("tenant", "v")]]))
                .await;
            assert_eq!(v.overall_code, Code::Ok as i32, "{v:?}");
        }
        let metrics = server.running.as_ref().unwrap().metrics.encode();
        assert!(
            !metrics.contains("portcullis_rlqs_store_errors_total 0"),
            "{mode:?}: counted\n{metrics}"
        );
    }
    for server in servers {
        server.stop().await;
    }
}

/// A report waits for the quota store by --rlqs-store-timeout (1 s), not by RLS' --store-timeout
/// (15 ms): under a Redis answering in 20 ms, a report of the largest size a stream may carry
/// (--rlqs-max-buckets-per-stream, 10,000 buckets) is answered from the store (token buckets),
/// never by the failure mode (ALLOW_ALL for every bucket).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_report_under_a_slow_redis_is_answered_from_the_store() {
    let redis = RedisServer::start();
    let proxy = common::proxy::Proxy::start(redis.port).await;
    let url = format!("redis://127.0.0.1:{}", proxy.port);
    let server = replica(|s| {
        s.store = portcullis::settings::StoreKind::Redis;
        s.redis_url = Some(url);
        s.store_timeout = Duration::from_millis(15);
    })
    .await;
    let mut gateway = Gateway::open(&server).await;
    // Warm: the connection is made and the script loaded before Redis slows down.
    let warm: &[(&str, &str)] = &[("tenant", "warm")];
    gateway.report("edge", &[(warm, 1, 0)]).await.unwrap();
    // Every command logged, with its number of arguments (the scripts' own commands too: Redis
    // 7 logs them, about six per bucket).
    common::redis::cli(
        redis.port,
        &["CONFIG", "SET", "slowlog-log-slower-than", "0"],
    );
    common::redis::cli(redis.port, &["CONFIG", "SET", "slowlog-max-len", "200000"]);
    common::redis::cli(redis.port, &["SLOWLOG", "RESET"]);
    proxy.delay_answers(Duration::from_millis(20));
    let largest = portcullis::service::quota::QuotaConfig::default().max_buckets_per_stream - 1;
    let names: Vec<String> = (0..largest).map(|i| format!("t{i}")).collect();
    let ids: Vec<Vec<(&str, &str)>> = names.iter().map(|n| vec![("tenant", n.as_str())]).collect();
    let usages: Vec<common::rlqs::Usage<'_>> = ids.iter().map(|id| (&id[..], 5, 0)).collect();
    let started = std::time::Instant::now();
    let actions = gateway.report("edge", &usages).await.unwrap();
    eprintln!("{largest} buckets answered in {:?}", started.elapsed());
    assert_eq!(actions.len(), largest);
    for action in &actions {
        assert_eq!(assigned(action), "tokens 10/1s max 10 ttl 3s");
    }
    // In script calls of at most 200 asks (about 1,200 arguments each; one call of 500 buckets
    // was about 3,000): none holds Redis for long.
    let log = common::redis::cli(redis.port, &["SLOWLOG", "GET", "200000"]);
    let widest = log
        .lines()
        .filter_map(|l| l.trim().strip_prefix("... ("))
        .filter_map(|l| l.split(' ').next()?.parse::<u64>().ok())
        .max()
        .unwrap_or(0);
    eprintln!("the widest script call: {widest} arguments past the first 31");
    assert!(widest > 1000, "the report went to Redis: {log:.2000}");
    assert!(widest < 1300, "{widest} arguments in one call");
}

/// The reservation index at its bound (100,000 descriptors) is read in pages of about 1,000
/// entries (HSCAN), so that no script call holds Redis for the whole index: read whole, one
/// script call took 150-310 ms, and every RLS call queued behind it went to the failure mode.
/// Every entry is read, in at least 50 script calls (each reads a page, not the index).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reservation_index_is_read_in_pages_that_hold_redis_briefly() {
    let redis = RedisServer::start();
    let store = connected_store(Topology::Standalone(redis.url()), "p:").await;
    // 100,000 live entries, written as quota_index.lua writes them.
    common::redis::cli(
        redis.port,
        &[
            "EVAL",
            "for i = 1, 100000 do redis.call('HSET', KEYS[1], '{e|t=' .. i .. '}', \
             '0.5|9999999999999999|1') end",
            "1",
            "p:{rlqs-reserved}",
        ],
    );
    common::redis::cli(redis.port, &["CONFIG", "RESETSTAT"]);
    let held = store
        .reservations(Instant::now() + Duration::from_secs(30))
        .await
        .expect("read");
    assert_eq!(held.len(), 100_000);
    assert_eq!(held["{e|t=77}"], 0.5);
    // Script calls and the pages they read, from Redis' own counts (not timed: a loaded
    // machine stretches any one call).
    let stats = common::redis::cli(redis.port, &["INFO", "commandstats"]);
    let calls = |command: &str| -> u64 {
        stats
            .lines()
            .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
            .and_then(|rest| rest.split(',').next()?.parse().ok())
            .unwrap_or(0)
    };
    let (scripts, pages) = (calls("eval"), calls("hscan"));
    eprintln!("{scripts} script calls, {pages} pages, for 100,000 entries");
    assert!(pages >= 50 && scripts >= 50, "{stats}");
    assert!(calls("hgetall") == 0, "read whole: {stats}");
}
