//! Redis away and back: a stopped Redis answered by the failure mode within the deadline and
//! recovered without a restart, a start without Redis, a killed Cluster master and a Sentinel
//! failover followed, TLS with a private CA and an ACL user, refusals remembered while Redis is
//! away.

use crate::common;

use std::time::{Duration, Instant};

use crate::common::redis::{RedisCluster, RedisSentinel, RedisServer, cli};
use crate::common::{TestServer, request};
use portcullis::limiter::FailureMode;
use portcullis::pb::rate_limit_response::Code;
use portcullis::settings::StoreKind;

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

const FAIL_RULES: &str = r#"
domain: fail
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 2}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stopped_answers_by_failure_mode_within_the_deadline_and_recovers_without_restart() {
    let deadline = Duration::from_millis(200);
    let mut redis = RedisServer::start();
    let url = redis.url();
    let mut servers = Vec::new();
    for mode in [FailureMode::Allow, FailureMode::Deny, FailureMode::Local] {
        let url = url.clone();
        let server = TestServer::start_with(&[("f.yaml", FAIL_RULES)], move |s| {
            s.store = StoreKind::Redis;
            s.redis_url = Some(url);
            s.store_timeout = deadline;
            s.failure_mode = mode;
        })
        .await;
        servers.push((mode, server));
    }
    // Healthy: Redis counts.
    for (mode, server) in &servers {
        let r = server
            .ok(request("fail", &[&[("k", &format!("{mode:?}"))]]))
            .await;
        assert_eq!(r.statuses[0].limit_remaining, 1, "{mode:?}");
    }
    redis.kill();
    for (mode, server) in &servers {
        let mut codes = Vec::new();
        for _ in 0..3 {
            let started = Instant::now();
            let r = server.ok(request("fail", &[&[("k", "down")]])).await;
            assert!(
                started.elapsed() < deadline + Duration::from_millis(400),
                "{mode:?} took {:?}",
                started.elapsed()
            );
            codes.push(r.overall_code);
            if *mode != FailureMode::Local {
                // Nothing was counted: no limit or remaining to show (Envoy would make headers).
                assert_eq!(r.statuses[0].current_limit, None, "{mode:?}");
                assert_eq!(r.statuses[0].limit_remaining, 0, "{mode:?}");
            }
            if *mode == FailureMode::Deny {
                // Honest: "try again in a second", not "in an hour" (the rule's window).
                let wait = r.statuses[0].duration_until_reset.unwrap().seconds;
                assert_eq!(wait, 1, "deny while Redis is away");
            }
        }
        let expected = match mode {
            FailureMode::Allow => [OK, OK, OK],
            FailureMode::Deny => [OVER, OVER, OVER],
            // The local limiter counts on its own: 2 per hour.
            FailureMode::Local => [OK, OK, OVER],
            FailureMode::Error => unreachable!("not among the modes started above"),
        };
        assert_eq!(codes, expected, "{mode:?}");
    }
    // Back on the same port (empty): decisions come from Redis again, with no restart.
    redis.restart();
    for (mode, server) in &servers {
        let start = Instant::now();
        let mut attempt = 0;
        let descriptor = loop {
            // A fresh descriptor each time: whether Redis or the failure mode answered shows in Redis.
            let descriptor = format!("back-{mode:?}-{attempt}");
            let r = server.ok(request("fail", &[&[("k", &descriptor)]])).await;
            let key = format!("portcullis:{{fail|k={descriptor}}}:sw60:3600000000us");
            if cli(redis.port, &["EXISTS", &key]) == "1" && r.statuses[0].limit_remaining == 1 {
                break descriptor;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "{mode:?} did not recover"
            );
            attempt += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let r = server.ok(request("fail", &[&[("k", &descriptor)]])).await;
        assert_eq!(
            (r.overall_code, r.statuses[0].limit_remaining),
            (OK, 0),
            "{mode:?}"
        );
        let r = server.ok(request("fail", &[&[("k", &descriptor)]])).await;
        assert_eq!(r.overall_code, OVER, "{mode:?}: Redis counts again");
    }
    for (_, server) in servers {
        server.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starts_without_redis_and_connects_when_it_appears() {
    let port = common::redis::free_port();
    let server = TestServer::start_with(&[("f.yaml", FAIL_RULES)], move |s| {
        s.store = StoreKind::Redis;
        s.redis_url = Some(format!("redis://127.0.0.1:{port}"));
        s.store_timeout = Duration::from_millis(200);
        s.failure_mode = FailureMode::Deny;
    })
    .await;
    let r = server.ok(request("fail", &[&[("k", "x")]])).await;
    assert_eq!(r.overall_code, OVER, "fail closed while Redis is away");
    let redis = RedisServer::start_on(port);
    let start = Instant::now();
    loop {
        let r = server.ok(request("fail", &[&[("k", "x")]])).await;
        if r.overall_code == OK {
            assert_eq!(r.statuses[0].limit_remaining, 1);
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "never connected");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(cli(redis.port, &["DBSIZE"]), "1");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_cluster_master_is_answered_within_the_deadline_and_its_replica_takes_over() {
    let deadline = Duration::from_millis(250);
    let mut cluster = RedisCluster::start();
    let seeds = cluster.seeds();
    let server = TestServer::start_with(&[("f.yaml", FAIL_RULES)], move |s| {
        s.store = StoreKind::Redis;
        s.redis_cluster = seeds;
        s.store_timeout = deadline;
        s.failure_mode = FailureMode::Allow;
    })
    .await;
    // Warm up: the cluster answers and counts.
    let r = server.ok(request("fail", &[&[("k", "probe-0")]])).await;
    assert_eq!(r.statuses[0].limit_remaining, 1);
    let victim = cluster.master_of("{fail|k=probe-0}");
    // Descriptors whose slots the victim serves: the load keeps hitting the failing shard.
    let probes: Vec<String> = (1..2000)
        .map(|n| format!("probe-{n}"))
        .filter(|p| cluster.master_of(&format!("{{fail|k={p}}}")) == victim)
        .take(400)
        .collect();
    assert!(probes.len() > 50);
    let probe = |n: usize| probes[n % probes.len()].clone();
    let replica = cluster
        .nodes
        .iter()
        .find(|n| {
            cli(n.port, &["ROLE"]).lines().next() == Some("slave")
                && cli(n.port, &["ROLE"]).contains(&victim.to_string())
        })
        .map(|n| n.port)
        .expect("the victim's replica");
    cluster.node_mut(victim).kill();

    // Steady load until the replica is promoted and a fresh descriptor is decided by the cluster.
    let start = Instant::now();
    let mut n = 1;
    let mut promoted_at = None;
    loop {
        let call_start = Instant::now();
        let r = server.ok(request("fail", &[&[("k", &probe(n))]])).await;
        assert!(
            call_start.elapsed() < deadline + Duration::from_millis(500),
            "call took {:?}",
            call_start.elapsed()
        );
        if promoted_at.is_none() && cli(replica, &["ROLE"]).lines().next() == Some("master") {
            promoted_at = Some(Instant::now());
        }
        if let Some(at) = promoted_at {
            // Correct again: the first hit of a new descriptor leaves 1 of 2, the counter is in Redis.
            if r.statuses[0].limit_remaining == 1 {
                let again = server.ok(request("fail", &[&[("k", &probe(n))]])).await;
                let third = server.ok(request("fail", &[&[("k", &probe(n))]])).await;
                if again.statuses[0].limit_remaining == 0 && third.overall_code == OVER {
                    assert!(
                        at.elapsed() < Duration::from_secs(10),
                        "took {:?} after promotion",
                        at.elapsed()
                    );
                    break;
                }
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(40),
            "no recovery after the master was killed"
        );
        n += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The promoted node runs the decision function: it has the library (replicated from its
    // master, or loaded on "Function not found").
    let library = format!(
        "portcullis_{}",
        portcullis::store::redis::script::SHA.as_str()
    );
    assert!(cli(replica, &["FUNCTION", "LIST", "LIBRARYNAME", &library]).contains(&library));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_finds_the_master_and_follows_a_failover() {
    let mut setup = RedisSentinel::start();
    let sentinels = setup.sentinel_addrs();
    let server = TestServer::start_with(&[("f.yaml", FAIL_RULES)], move |s| {
        s.store = StoreKind::Redis;
        s.redis_sentinel = sentinels;
        s.redis_master = Some("mymaster".into());
        s.store_timeout = Duration::from_millis(500);
        s.failure_mode = FailureMode::Deny;
    })
    .await;
    let r = server.ok(request("fail", &[&[("k", "s")]])).await;
    assert_eq!(r.statuses[0].limit_remaining, 1);
    assert_eq!(cli(setup.master.port, &["DBSIZE"]), "1");

    setup.master.kill();
    let replica = setup.replica.port;
    let start = Instant::now();
    let mut n = 0;
    loop {
        let r = server
            .ok(request("fail", &[&[("k", &format!("after-{n}"))]]))
            .await;
        if r.overall_code == OK
            && r.statuses[0].limit_remaining == 1
            && cli(replica, &["ROLE"]).starts_with("master")
        {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "no failover");
        n += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        cli(
            replica,
            &[
                "EXISTS",
                &format!("portcullis:{{fail|k=after-{n}}}:sw60:3600000000us")
            ]
        ) == "1"
    );
    server.stop().await;
}

/// A CA (`ca.crt`) and a server certificate for 127.0.0.1 (`server.crt`, `server.key`).
fn make_certs(dir: &std::path::Path) {
    common::tls::make_ca(dir, "ca");
    common::tls::make_leaf(dir, "ca", "server");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_private_ca_and_an_acl_user() {
    let certs = tempfile::tempdir().unwrap();
    make_certs(certs.path());
    let tls_port = common::redis::free_port();
    let path = |name: &str| certs.path().join(name).display().to_string();
    let redis = RedisServer::start_with(&[
        "--tls-port",
        &tls_port.to_string(),
        "--tls-cert-file",
        &path("server.crt"),
        "--tls-key-file",
        &path("server.key"),
        "--tls-ca-cert-file",
        &path("ca.crt"),
        "--tls-auth-clients",
        "no",
        "--user",
        "limiter",
        "on",
        ">s3cret",
        "~*",
        "+@all",
    ]);
    let ca = certs.path().join("ca.crt");
    let start = |password: &'static str| {
        let ca = ca.clone();
        TestServer::start_with(&[("f.yaml", FAIL_RULES)], move |s| {
            s.store = StoreKind::Redis;
            s.redis_url = Some(format!("rediss://127.0.0.1:{tls_port}"));
            s.redis_ca_file = Some(ca);
            s.redis_user = Some("limiter".into());
            s.redis_password = Some(portcullis::settings::Secret(password.into()));
            s.store_timeout = Duration::from_secs(2);
            s.failure_mode = FailureMode::Deny;
        })
    };
    let server = start("s3cret").await;
    let r = server.ok(request("fail", &[&[("k", "tls")]])).await;
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 1));
    assert_eq!(
        cli(
            redis.port,
            &["EXISTS", "portcullis:{fail|k=tls}:sw60:3600000000us"]
        ),
        "1"
    );
    server.stop().await;

    // A wrong password is refused by Redis: the failure mode answers, nothing is counted.
    let server = start("wrong").await;
    let r = server.ok(request("fail", &[&[("k", "tls-wrong")]])).await;
    assert_eq!(r.overall_code, OVER);
    assert_eq!(
        cli(
            redis.port,
            &["EXISTS", "portcullis:{fail|k=tls-wrong}:sw60:3600000000us"]
        ),
        "0"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_requests_are_refused_locally_until_their_retry_time() {
    let mut redis = RedisServer::start();
    let url = redis.url();
    let start = |deny_cache: bool, mode: FailureMode| {
        let url = url.clone();
        TestServer::start_with(&[("f.yaml", FAIL_RULES)], move |s| {
            s.store = StoreKind::Redis;
            s.redis_url = Some(url);
            s.store_timeout = Duration::from_millis(300);
            s.failure_mode = mode;
            s.deny_cache = deny_cache;
        })
    };
    let cached = start(true, FailureMode::Allow).await;
    let uncached = start(false, FailureMode::Allow).await;
    let with_hits = |value: &str, hits: u32| {
        let mut r = request("fail", &[&[("k", value)]]);
        r.hits_addend = hits;
        r
    };
    for server in [&cached, &uncached] {
        let value = if std::ptr::eq(server, &cached) {
            "c"
        } else {
            "u"
        };
        assert_eq!(server.ok(with_hits(value, 1)).await.overall_code, OK);
        assert_eq!(
            server.ok(with_hits(value, 2)).await.overall_code,
            OVER,
            "2 more do not fit"
        );
        // A cheaper request is not refused by the cached denial of a dearer one: it asks Redis.
        let r = server.ok(with_hits(value, 1)).await;
        assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 0));
        assert_eq!(server.ok(with_hits(value, 1)).await.overall_code, OVER);
    }
    // Redis goes away; the failure mode would allow. The cached denial still refuses, the other
    // descriptor (nothing cached) gets the failure mode's answer.
    redis.kill();
    let r = cached.ok(with_hits("c", 1)).await;
    assert_eq!(r.overall_code, OVER, "refused from the deny cache");
    assert!(r.statuses[0].duration_until_reset.unwrap().seconds > 0);
    assert_eq!(cached.ok(with_hits("other", 1)).await.overall_code, OK);
    assert_eq!(
        uncached.ok(with_hits("u", 1)).await.overall_code,
        OK,
        "without the cache: the failure mode"
    );
    let metrics = cached.running.as_ref().unwrap().metrics.encode();
    assert!(
        metrics.contains("portcullis_deny_cache_hits_total 1\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("portcullis_failure_mode_answers_total{mode=\"allow\"} 1\n"),
        "{metrics}"
    );
    cached.stop().await;
    uncached.stop().await;

    // A refusal by the failure mode is not cached: once Redis is back the same request passes.
    let closed = start(true, FailureMode::Deny).await;
    assert_eq!(closed.ok(with_hits("d", 1)).await.overall_code, OVER);
    redis.restart();
    let began = Instant::now();
    while closed.ok(with_hits("d", 1)).await.overall_code != OK {
        assert!(
            began.elapsed() < Duration::from_secs(10),
            "stuck on a cached failure-mode denial"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    closed.stop().await;
}
