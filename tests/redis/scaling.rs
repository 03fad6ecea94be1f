//! Runtime scaling: factors on limits changed without editing rules, from the scaling file
//! (watched like the rules) and from the admin endpoint (temporary, with an expiry, kept in the
//! store so every replica on one Redis applies them). Memory with a manual clock; standalone Redis
//! and Cluster with two replicas.

use crate::common;

use std::time::{Duration, Instant};

use crate::common::redis::{RedisCluster, RedisServer};
use crate::common::{TestServer, http, request, sample};
use portcullis::pb::rate_limit_response::Code;
use portcullis::settings::{Settings, StoreKind};

const OK: i32 = Code::Ok as i32;

const RULES: &str = r#"
domain: api
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: login
    rate_limit: {name: login, unit: hour, requests_per_unit: 10}
  - key: client
    rate_limits:
      - {name: burst, unit: second, requests_per_unit: 20, algorithm: token_bucket, burst: 40}
      - {name: hourly, unit: hour, requests_per_unit: 60}
"#;

/// Calls `user=<value>` until refused (at most `cap` calls): how many were admitted.
async fn admitted(server: &TestServer, key: &str, value: &str, cap: usize) -> usize {
    for n in 0..cap {
        let r = server.ok(request("api", &[&[(key, value)]])).await;
        if r.overall_code != OK {
            return n;
        }
    }
    cap
}

fn admin(server: &TestServer) -> u16 {
    server.running.as_ref().unwrap().admin_addr.port()
}

async fn factor_of(server: &TestServer, domain: &str) -> f64 {
    let (_, m) = http(admin(server), "GET", "/metrics", "").await;
    sample(
        &m,
        &format!("portcullis_scaling_factor{{domain=\"{domain}\"}}"),
    )
}

/// Polls `server`'s gauge until it reads `want`, within `limit`; how long it took.
async fn until_factor(server: &TestServer, want: f64, limit: Duration) -> Duration {
    let start = Instant::now();
    loop {
        if (factor_of(server, "api").await - want).abs() < 1e-9 {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < limit,
            "the factor did not become {want} within {limit:?} (it is {})",
            factor_of(server, "api").await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn set(server: &TestServer, body: &str) -> (u16, String) {
    http(admin(server), "POST", "/scaling", body).await
}

#[tokio::test]
async fn the_scaling_file_scales_limits_and_is_reloaded_when_it_changes() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("scaling.yaml");
    std::fs::write(&file, "domains: {api: 0.5}\nnames: {login: 0.2}\n").unwrap();
    let path = file.clone();
    let server = TestServer::start_with(&[("api.yaml", RULES)], move |s| {
        s.scaling_file = Some(path);
    })
    .await;
    assert_eq!(admitted(&server, "user", "a", 500).await, 50);
    // A rule's name multiplies with its domain: 10 × 0.5 × 0.2.
    assert_eq!(admitted(&server, "login", "a", 500).await, 1);
    // Each layer by its own name: the hour at 30, the burst at 20.
    assert_eq!(admitted(&server, "client", "a", 500).await, 20);
    let (_, config) = http(admin(&server), "GET", "/rlconfig", "").await;
    assert!(
        config.contains("scaling: domain \"api\" ×0.5 (scaling file)"),
        "{config}"
    );
    assert_eq!(factor_of(&server, "api").await, 0.5);

    // Written beside and renamed in, as a ConfigMap update lands.
    std::fs::write(dir.path().join(".tmp"), "domains: {api: 2}\n").unwrap();
    std::fs::rename(dir.path().join(".tmp"), &file).unwrap();
    until_factor(&server, 2.0, Duration::from_secs(5)).await;
    // The counter is the same one (scaling never changes identity): 50 spent, 150 more now.
    assert_eq!(admitted(&server, "user", "a", 500).await, 150);
    assert_eq!(admitted(&server, "user", "b", 500).await, 200);

    // A broken file is refused; the factors in force stay.
    std::fs::write(dir.path().join(".tmp"), "domains: {api: -1}\n").unwrap();
    std::fs::rename(dir.path().join(".tmp"), &file).unwrap();
    let start = Instant::now();
    loop {
        let (_, m) = http(admin(&server), "GET", "/metrics", "").await;
        if sample(&m, r#"portcullis_scaling_reloads_total{result="error"}"#) >= 1.0 {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(5), "never refused");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(factor_of(&server, "api").await, 2.0);
    assert_eq!(admitted(&server, "user", "c", 500).await, 200);
    server.stop().await;
}

#[tokio::test]
async fn a_temporary_factor_applies_at_once_and_expires() {
    let server = TestServer::start_with(&[("api.yaml", RULES)], |s| s.admin_scaling = true).await;
    let (status, body) = set(
        &server,
        r#"{"scope":"domain","name":"api","factor":0.5,"for_seconds":1800}"#,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("scaling: domain \"api\" ×0.5 (temporary"),
        "{body}"
    );
    // The replica that took the change applies it on its next call.
    assert_eq!(admitted(&server, "user", "x", 500).await, 50);
    assert_eq!(factor_of(&server, "api").await, 0.5);
    let (_, config) = http(admin(&server), "GET", "/rlconfig", "").await;
    assert!(
        config.contains("(temporary, 1800 s left when last read"),
        "{config}"
    );
    // Half an hour later (the store's clock) it is gone.
    server.clock.advance_us(1801 * 1_000_000);
    until_factor(&server, 1.0, Duration::from_secs(5)).await;
    assert_eq!(admitted(&server, "user", "y", 500).await, 100);

    // Removed early with for_seconds 0.
    set(
        &server,
        r#"{"scope":"global","factor":0.1,"for_seconds":60}"#,
    )
    .await;
    assert_eq!(admitted(&server, "user", "z", 500).await, 10);
    let (status, _) = set(&server, r#"{"scope":"global","for_seconds":0}"#).await;
    assert_eq!(status, 200);
    assert_eq!(admitted(&server, "user", "w", 500).await, 100);

    // Refused, saying why: nothing changes.
    for (body, why) in [
        (
            r#"{"scope":"domain","factor":0.5,"for_seconds":60}"#,
            "needs a name",
        ),
        (
            r#"{"scope":"all","factor":0.5,"for_seconds":60}"#,
            "not one of global",
        ),
        (
            r#"{"scope":"global","factor":0,"for_seconds":60}"#,
            "factor 0 is not",
        ),
        (
            r#"{"scope":"global","factor":1e9,"for_seconds":60}"#,
            "at most 1000",
        ),
        (
            r#"{"scope":"global","for_seconds":60}"#,
            "factor is required",
        ),
        (
            r#"{"scope":"global","factor":2,"for_seconds":999999999}"#,
            "at most 604800",
        ),
        (r#"{"scope":"global","factor":2}"#, "not a scaling change"),
    ] {
        let (status, answer) = set(&server, body).await;
        assert_eq!(status, 400, "{body}: {answer}");
        assert!(answer.contains(why), "{body}: {answer}");
    }
    assert_eq!(admitted(&server, "user", "v", 500).await, 100);
    server.stop().await;
}

#[tokio::test]
async fn the_endpoint_is_off_unless_enabled() {
    let server = TestServer::start(&[("api.yaml", RULES)]).await;
    let (status, _) = set(
        &server,
        r#"{"scope":"global","factor":0.5,"for_seconds":60}"#,
    )
    .await;
    assert_eq!(status, 404);
    assert_eq!(admitted(&server, "user", "x", 500).await, 100);
    server.stop().await;
}

/// An incident: one replica halves the domain; the other, sharing the store, applies it within
/// one reload interval; 300 concurrent calls over both admit exactly the halved limit.
async fn an_incident_across_two_replicas(adjust: impl Fn(&mut Settings) + Copy) {
    let a = TestServer::start_with(&[("api.yaml", RULES)], |s| {
        adjust(s);
        s.admin_scaling = true;
    })
    .await;
    let b = TestServer::start_with(&[("api.yaml", RULES)], adjust).await;
    let interval = Settings::for_tests(a.dir.path().to_path_buf()).reload_interval;
    let (status, body) = set(
        &a,
        r#"{"scope":"domain","name":"api","factor":0.5,"for_seconds":1800}"#,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let took = until_factor(&b, 0.5, Duration::from_secs(10)).await;
    assert!(
        took <= interval * 2 + Duration::from_millis(500),
        "the other replica took {took:?} (reload interval {interval:?})"
    );
    let clients = [a.client.clone(), b.client.clone()];
    let admitted =
        common::count_admitted(&clients, request("api", &[&[("user", "incident")]]), 300).await;
    assert_eq!(admitted, 50, "half of 100, across both replicas");
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_incident_on_standalone_redis_halves_every_replica() {
    let redis = RedisServer::start();
    let url = redis.url();
    an_incident_across_two_replicas(|s| {
        s.store = StoreKind::Redis;
        s.redis_url = Some(url.clone());
        s.store_timeout = Duration::from_secs(2);
    })
    .await;
    // The factor's hash has a TTL, like every key.
    let ttl: i64 = common::redis::cli(redis.port, &["PTTL", "portcullis:{scaling}"])
        .parse()
        .unwrap();
    assert!(ttl > 1_700_000 && ttl <= 1_800_000, "{ttl}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_incident_on_cluster_halves_every_replica() {
    let cluster = RedisCluster::start_with_replicas(0);
    let seeds = cluster.seeds();
    an_incident_across_two_replicas(|s| {
        s.store = StoreKind::Redis;
        s.redis_cluster = seeds.clone();
        s.store_timeout = Duration::from_secs(2);
    })
    .await;
}

/// A domain removed by a reload loses its `portcullis_scaling_factor` series: its last factor
/// would otherwise stay exported, and `PortcullisScaledForLong` fire for ever.
#[tokio::test]
async fn a_removed_domain_loses_its_scaling_gauge() {
    let scaling = tempfile::tempdir().expect("temp dir");
    let file = scaling.path().join("scaling.yaml");
    std::fs::write(&file, "domains: {gone: 0.5}\n").unwrap();
    let server = TestServer::start_with(
        &[
            ("api.yaml", RULES),
            (
                "gone.yaml",
                "domain: gone\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
            ),
        ],
        |s| {
            s.scaling_file = Some(file.clone());
            s.allow_rules_removal = true;
        },
    )
    .await;
    assert_eq!(factor_of(&server, "gone").await, 0.5);
    std::fs::remove_file(server.dir.path().join("gone.yaml")).unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, m) = http(admin(&server), "GET", "/metrics", "").await;
        if !m.contains(r#"portcullis_scaling_factor{domain="gone"}"#) {
            assert!(m.contains(r#"portcullis_scaling_factor{domain="api"}"#));
            break;
        }
        assert!(
            Instant::now() < until,
            "the gauge of a removed domain stays:\n{m}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server.stop().await;
}

/// `POST /scaling` lifts or cuts every limit: with a token file it needs that bearer token
/// (read on each change: a rotated Secret applies), and off loopback the service will not start
/// without one. Names are bounded.
#[tokio::test]
async fn a_scaling_change_needs_the_bearer_token() {
    let secret = tempfile::tempdir().expect("temp dir");
    let token_file = secret.path().join("token");
    std::fs::write(&token_file, "s3cret-token-1\n").unwrap();
    let server = TestServer::start_with(&[("api.yaml", RULES)], |s| {
        s.admin_scaling = true;
        s.admin_scaling_token_file = Some(token_file.clone());
    })
    .await;
    let body = r#"{"scope":"domain","name":"api","factor":0.5,"for_seconds":60}"#;
    let post = |headers: &'static [(&'static str, &'static str)], body: String| {
        let port = admin(&server);
        async move { common::http_with(port, "POST", "/scaling", headers, &body).await }
    };
    assert_eq!(post(&[], body.into()).await.0, 401);
    let wrong = &[("Authorization", "Bearer s3cret-token-2")];
    assert_eq!(post(wrong, body.into()).await.0, 401);
    assert_eq!(factor_of(&server, "api").await, 1.0, "nothing changed");
    let right = &[("Authorization", "Bearer s3cret-token-1")];
    assert_eq!(post(right, body.into()).await.0, 200);
    assert_eq!(factor_of(&server, "api").await, 0.5);
    // The Secret rotates: the old token no longer works.
    std::fs::write(&token_file, "s3cret-token-2").unwrap();
    assert_eq!(post(right, body.into()).await.0, 401);
    assert_eq!(post(wrong, body.into()).await.0, 200);
    // A name longer than any domain or rule name is refused.
    let long = format!(
        r#"{{"scope":"name","name":"{}","factor":0.5,"for_seconds":60}}"#,
        "n".repeat(300)
    );
    let (status, text) = post(wrong, long).await;
    assert_eq!(status, 400, "{text}");
    server.stop().await;

    // Reachable by others and no token: the start is refused, naming the flag.
    let mut settings = Settings::for_tests(secret.path().to_path_buf());
    settings.admin_scaling = true;
    settings.admin_addr = "0.0.0.0:0".parse().unwrap();
    let refused = settings.validate().expect_err("refused");
    assert!(
        refused.to_string().contains("--admin-scaling-token-file"),
        "{refused}"
    );
    settings.admin_scaling_token_file = Some(token_file);
    settings.validate().expect("with a token file");
}

/// `portcullis_rule_limit` gives each rule's limit as a series (per its unit, and per second), a
/// layered rule per layer, with the factors in force applied: what "80% of the limit used"
/// alerts divide by. A removed rule loses its series.
#[tokio::test]
async fn every_rule_limit_is_a_gauge_that_follows_the_scaling_in_force() {
    let server = TestServer::start_with(&[("api.yaml", RULES)], |s| {
        s.admin_scaling = true;
        s.allow_rules_removal = true;
    })
    .await;
    let limit = |m: &str, rule: &str, unit: &str| {
        sample(
            m,
            &format!("portcullis_rule_limit{{domain=\"api\",rule=\"{rule}\",unit=\"{unit}\"}}"),
        )
    };
    let per_second = |m: &str, rule: &str| {
        sample(
            m,
            &format!("portcullis_rule_limit_per_second{{domain=\"api\",rule=\"{rule}\"}}"),
        )
    };
    let (_, m) = http(admin(&server), "GET", "/metrics", "").await;
    assert_eq!(limit(&m, "api.user", "hour"), 100.0);
    assert!((per_second(&m, "api.user") - 100.0 / 3600.0).abs() < 1e-9);
    assert_eq!(limit(&m, "api.login", "hour"), 10.0);
    assert_eq!(limit(&m, "api.client/burst", "second"), 20.0);
    assert_eq!(per_second(&m, "api.client/burst"), 20.0);
    assert_eq!(limit(&m, "api.client/hourly", "hour"), 60.0);

    // Halve the domain and double `login`: the gauges follow at once on this replica.
    for body in [
        r#"{"scope":"domain","name":"api","factor":0.5,"for_seconds":600}"#,
        r#"{"scope":"name","name":"login","factor":2,"for_seconds":600}"#,
    ] {
        let (status, answer) = set(&server, body).await;
        assert_eq!(status, 200, "{answer}");
    }
    let (_, m) = http(admin(&server), "GET", "/metrics", "").await;
    assert_eq!(limit(&m, "api.user", "hour"), 50.0);
    assert_eq!(limit(&m, "api.login", "hour"), 10.0);
    assert_eq!(limit(&m, "api.client/burst", "second"), 10.0);

    // A rule removed by a reload loses its series.
    let fewer = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 100}\n";
    std::fs::write(server.dir.path().join("api.yaml"), fewer).unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, m) = http(admin(&server), "GET", "/metrics", "").await;
        if !m.contains("rule=\"api.login\"") && !m.contains("api.client/burst") {
            assert_eq!(limit(&m, "api.user", "hour"), 50.0);
            break;
        }
        assert!(Instant::now() < until, "a removed rule's limit stays:\n{m}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server.stop().await;
}
