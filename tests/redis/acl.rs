//! The Redis ACL README gives is enough: a user made with exactly that line decides every
//! algorithm, refunds and post-paid charges, keeps temporary scaling factors, grants RLQS
//! shares, pushes them between reports, counts their claims on the RLS path, and answers
//! readiness, with no NOPERM anywhere
//! (Redis checks the commands a script calls against the user's permissions).

use crate::common;

use std::time::Duration;

use crate::common::redis::{RedisServer, cli};
use crate::common::rlqs::{Gateway, assigned};
use crate::common::{TestServer, descriptor, http, request, sample};
use portcullis::limiter::FailureMode;
use portcullis::pb::rate_limit_response::Code;
use portcullis::settings::{Secret, StoreKind};

const OK: i32 = Code::Ok as i32;

const RULES: &str = r#"
domain: acl
descriptors:
  - key: sliding
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: bucket
    rate_limit: {unit: hour, requests_per_unit: 5, algorithm: token_bucket}
  - key: fixed
    rate_limit: {unit: hour, requests_per_unit: 5, algorithm: fixed_window}
  - key: tokens
    post_paid: true
    rate_limit: {unit: hour, requests_per_unit: 5}
"#;

/// The `ACL SETUSER` line of the Redis guide (docs/redis.md), as arguments after the user name.
fn readme_acl() -> Vec<String> {
    let readme = common::docs();
    let start = readme
        .find("ACL SETUSER portcullis")
        .expect("README gives the ACL");
    let end = start + readme[start..].find("```").expect("the block ends");
    readme[start..end]
        .replace("\\\n", " ")
        .split_whitespace()
        .skip(3)
        .map(|arg| arg.replace("PASSWORD", "s3cret"))
        .collect()
}

/// The Redis store at `url` as the user `portcullis` the tests make, every failure answered
/// by denying (so that a refused command shows).
fn as_acl_user(s: &mut portcullis::settings::Settings, url: String) {
    s.store = StoreKind::Redis;
    s.redis_url = Some(url);
    s.redis_user = Some("portcullis".into());
    s.redis_password = Some(Secret("s3cret".into()));
    s.store_timeout = Duration::from_secs(2);
    s.failure_mode = FailureMode::Deny;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_acl_is_all_the_service_needs() {
    let redis = RedisServer::start();
    let mut args = vec!["ACL", "SETUSER", "portcullis"];
    let acl = readme_acl();
    args.extend(acl.iter().map(String::as_str));
    assert_eq!(cli(redis.port, &args), "OK");
    let url = redis.url();
    let server = TestServer::start_with(&[("acl.yaml", RULES)], move |s| {
        as_acl_user(s, url);
        s.admin_scaling = true;
        s.rlqs.rlqs = true;
    })
    .await;
    for key in ["sliding", "bucket", "fixed", "tokens"] {
        let r = server.ok(request("acl", &[&[(key, "u")]])).await;
        assert_eq!(
            (r.overall_code, r.statuses[0].limit_remaining),
            (OK, 4),
            "{key}"
        );
        // A refund writes too.
        let mut refund = request("acl", &[]);
        let mut back = descriptor(&[(key, "u")]);
        back.hits_addend = Some(1);
        back.is_negative_hits = true;
        refund.descriptors.push(back);
        assert_eq!(server.ok(refund).await.overall_code, OK, "{key} refund");
    }
    let admin = server.running.as_ref().unwrap().admin_addr.port();
    let (status, body) = http(
        admin,
        "POST",
        "/scaling",
        r#"{"scope":"domain","name":"acl","factor":0.5,"for_seconds":60}"#,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // RLQS: a share granted (not the failure mode's DENY_ALL), RLS counting its claims and its
    // demand on the held descriptor pushed, without an error.
    let mut gateway = Gateway::open(&server).await;
    let actions = gateway
        .report("acl", &[(&[("fixed", "g")], 3, 0)])
        .await
        .unwrap();
    assert!(assigned(&actions[0]).starts_with("tokens"), "{actions:?}");
    // A second gateway on the descriptor is short of its fair share: the descriptor is marked
    // contested (a sorted set) and the push round reads it, so the first is pushed its smaller
    // part between reports.
    let mut second = Gateway::open(&server).await;
    second
        .report("acl", &[(&[("fixed", "g")], 3, 0)])
        .await
        .unwrap();
    assert!(
        gateway.pushed(Duration::from_secs(3)).await.is_some(),
        "no push under the guide's ACL"
    );
    // An RLS call on the held descriptor counts the gateways' claims (the check script reads
    // the holder table) and its hit reaches the table as RLS demand within a second.
    server.ok(request("acl", &[&[("fixed", "g")]])).await;
    let started = std::time::Instant::now();
    loop {
        let table = cli(redis.port, &["HKEYS", "portcullis:{acl|fixed=g}:q"]);
        if table.lines().any(|field| field.starts_with('r')) {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(5), "{table}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, body) = http(admin, "GET", "/readyz", "").await;
    assert_eq!(status, 200, "{body}");
    // Decisions went by FCALL of the function library (not the slower EVALSHA fallback).
    let stats = cli(redis.port, &["INFO", "commandstats"]);
    assert!(stats.contains("cmdstat_fcall:calls="), "{stats}");
    let (_, metrics) = http(admin, "GET", "/metrics", "").await;
    assert_eq!(
        sample(
            &metrics,
            r#"portcullis_store_errors_total{kind="permanent"}"#
        ),
        0.0,
        "{metrics}"
    );
    assert_eq!(
        sample(
            &metrics,
            r#"portcullis_failure_mode_answers_total{mode="deny"}"#
        ),
        0.0
    );
    for series in [
        "portcullis_rlqs_store_errors_total",
        "portcullis_rlqs_demand_errors_total",
        "portcullis_rlqs_push_errors_total",
    ] {
        assert_eq!(sample(&metrics, series), 0.0, "{series}\n{metrics}");
    }
    server.stop().await;
}

/// A Redis that cannot run the decision script is said plainly (issue 45 item 2): not ready,
/// the body naming the cause and what to do, whether scripting is missing (a Valkey without its
/// Lua module answers as one whose EVAL and EVALSHA are unknown: renamed away here) or the ACL
/// refuses the script commands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_cannot_run_the_scripts_is_not_ready_and_says_why() {
    async fn readiness_of(redis: &RedisServer, user: Option<&str>) -> String {
        let url = redis.url();
        let user = user.map(str::to_owned);
        let server = TestServer::start_with(&[("acl.yaml", RULES)], move |s| {
            s.store = StoreKind::Redis;
            s.redis_url = Some(url);
            if let Some(user) = user {
                s.redis_user = Some(user);
                s.redis_password = Some(Secret("s3cret".into()));
            }
            s.store_timeout = Duration::from_secs(2);
        })
        .await;
        let admin = server.running.as_ref().unwrap().admin_addr.port();
        let started = std::time::Instant::now();
        let body = loop {
            let (status, body) = http(admin, "GET", "/readyz", "").await;
            if status == 503 && body.contains("permanent") {
                break body;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "still {status}: {body}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        server.stop().await;
        body
    }
    let no_scripting = RedisServer::start_with(&[
        "--rename-command",
        "EVALSHA",
        "",
        "--rename-command",
        "EVAL",
        "",
        "--rename-command",
        "SCRIPT",
        "",
    ]);
    let body = readiness_of(&no_scripting, None).await;
    assert!(
        body.contains("cannot run Lua scripts") && body.contains("scripting"),
        "{body}"
    );
    let redis = RedisServer::start();
    // The guide's ACL without the script commands.
    let mut args = vec!["ACL", "SETUSER", "portcullis"];
    let acl: Vec<String> = readme_acl()
        .into_iter()
        .filter(|a| !matches!(a.as_str(), "+evalsha" | "+eval" | "+script|load"))
        // With FCALL allowed, decisions would work: the other scripts (RLQS, scaling) would not.
        .collect();
    args.extend(acl.iter().map(String::as_str));
    assert_eq!(cli(redis.port, &args), "OK");
    let body = readiness_of(&redis, Some("portcullis")).await;
    assert!(
        body.contains("lacks a permission") && body.contains("EVALSHA"),
        "{body}"
    );
}

/// `--redis-wait-replicas` needs `+wait` beside the guide's line (docs/redis.md says so): with
/// it, a call on a master with its replica is acknowledged and admitted; without it, the call
/// is answered by the failure mode, and readiness says why, naming the setting (it used to say
/// `store: redis ok` while every call failed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_for_replicas_needs_the_wait_permission_the_guide_names() {
    let redis = RedisServer::start();
    let replica = RedisServer::start();
    cli(
        replica.port,
        &["REPLICAOF", "127.0.0.1", &redis.port.to_string()],
    );
    common::redis::wait_until("the replica in sync", Duration::from_secs(10), || {
        cli(replica.port, &["INFO", "replication"]).contains("master_link_status:up")
    });
    for (user, wait) in [("waits", true), ("cannot", false)] {
        let mut args = vec!["ACL", "SETUSER", user];
        let acl = readme_acl();
        args.extend(acl.iter().map(String::as_str));
        if wait {
            args.push("+wait");
        }
        assert_eq!(cli(redis.port, &args), "OK");
        let url = redis.url();
        let server = TestServer::start_with(&[("acl.yaml", RULES)], move |s| {
            s.store = StoreKind::Redis;
            s.redis_url = Some(url);
            s.redis_user = Some(user.into());
            s.redis_password = Some(Secret("s3cret".into()));
            s.redis_wait_replicas = 1;
            s.store_timeout = Duration::from_secs(2);
            s.failure_mode = FailureMode::Deny;
        })
        .await;
        let r = server.ok(request("acl", &[&[("fixed", user)]])).await;
        let admin = server.running.as_ref().unwrap().admin_addr.port();
        let (_, metrics) = http(admin, "GET", "/metrics", "").await;
        let permanent = sample(
            &metrics,
            r#"portcullis_store_errors_total{kind="permanent"}"#,
        );
        if wait {
            assert_eq!(r.overall_code, OK, "acknowledged and admitted");
            assert_eq!(permanent, 0.0, "{metrics}");
        } else {
            assert_ne!(r.overall_code, OK, "answered by the failure mode (deny)");
            assert_eq!(permanent, 1.0, "{metrics}");
            let (status, body) = http(admin, "GET", "/readyz", "").await;
            assert_eq!(status, 503, "{body}");
            assert!(body.contains("--redis-wait-replicas"), "{body}");
        }
        server.stop().await;
    }
}

/// A user the ACL allows scripts and not functions (an ACL written before Portcullis called
/// functions): every decision is still made, by EVALSHA, and readiness says ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_without_functions_is_served_by_scripts() {
    let redis = RedisServer::start();
    let mut args = vec!["ACL", "SETUSER", "portcullis"];
    let acl: Vec<String> = readme_acl()
        .into_iter()
        .filter(|a| !matches!(a.as_str(), "+fcall" | "+function|load"))
        .collect();
    assert!(
        acl.len() + 2 == readme_acl().len(),
        "the guide names both: {acl:?}"
    );
    args.extend(acl.iter().map(String::as_str));
    assert_eq!(cli(redis.port, &args), "OK");
    let url = redis.url();
    let server = TestServer::start_with(&[("acl.yaml", RULES)], move |s| as_acl_user(s, url)).await;
    for key in ["sliding", "bucket", "fixed"] {
        for remaining in [4, 3] {
            let r = server.ok(request("acl", &[&[(key, "u")]])).await;
            assert_eq!(
                (r.overall_code, r.statuses[0].limit_remaining),
                (OK, remaining),
                "{key}"
            );
        }
    }
    let stats = cli(redis.port, &["INFO", "commandstats"]);
    assert!(stats.contains("cmdstat_evalsha:calls="), "{stats}");
    assert_eq!(
        cli(redis.port, &["FUNCTION", "LIST"]),
        "",
        "no library was loaded"
    );
    let admin = server.running.as_ref().unwrap().admin_addr.port();
    let (status, body) = http(admin, "GET", "/readyz", "").await;
    assert_eq!(status, 200, "{body}");
    server.stop().await;
}
