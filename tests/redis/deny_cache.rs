//! The deny cache across replicas: a refusal remembered on one replica outlives a refund made on
//! another (budget given back with `is_negative_hits`) by at most `--deny-cache-max-age`, while
//! the answer still says the full retry time.

use std::time::{Duration, Instant};

use crate::common::redis::RedisServer;
use crate::common::{TestServer, descriptor, request};
use portcullis::pb::rate_limit_response::Code;
use portcullis::settings::StoreKind;

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

const RULES: &str = r#"
domain: dc
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 2, algorithm: fixed_window}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_on_another_replica_is_seen_within_the_max_age() {
    let redis = RedisServer::start();
    let start = || {
        let url = redis.url();
        TestServer::start_with(&[("dc.yaml", RULES)], move |s| {
            s.store = StoreKind::Redis;
            s.redis_url = Some(url);
            s.store_timeout = Duration::from_millis(500);
            s.deny_cache_max_age = Duration::from_millis(300);
        })
    };
    let (a, b) = (start().await, start().await);
    let call = || request("dc", &[&[("user", "u")]]);
    assert_eq!(a.ok(call()).await.overall_code, OK);
    assert_eq!(a.ok(call()).await.overall_code, OK);
    let refused = a.ok(call()).await;
    assert_eq!(refused.overall_code, OVER);
    // Remembered: the next refusal comes from the cache, with the window's real retry time.
    let cached = a.ok(call()).await;
    assert_eq!(cached.overall_code, OVER);
    let metrics = a.running.as_ref().unwrap().metrics.encode();
    assert!(
        metrics.contains("portcullis_deny_cache_hits_total 1\n"),
        "{metrics}"
    );

    // Replica b gives both hits back.
    let mut refund = request("dc", &[]);
    let mut given_back = descriptor(&[("user", "u")]);
    given_back.hits_addend = Some(2);
    given_back.is_negative_hits = true;
    refund.descriptors.push(given_back);
    assert_eq!(b.ok(refund).await.overall_code, OK);
    let refunded = Instant::now();

    // Replica a admits again once its remembered refusal is older than the max age.
    loop {
        if a.ok(call()).await.overall_code == OK {
            break;
        }
        assert!(
            refunded.elapsed() < Duration::from_millis(300 + 700),
            "a refusal cached on replica a outlived a refund on replica b"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    a.stop().await;
    b.stop().await;
}

/// A concurrency refusal is never remembered: a release on another replica frees the slot for
/// this one's next call at once, even with a long max age.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrency_refusal_is_not_remembered_past_a_release_elsewhere() {
    const SLOTS: &str = "domain: cc
descriptors:
  - key: user
    rate_limit: {algorithm: concurrency, requests_per_unit: 1, unit: minute}
";
    let redis = RedisServer::start();
    let start = || {
        let url = redis.url();
        TestServer::start_with(&[("cc.yaml", SLOTS)], move |s| {
            s.store = StoreKind::Redis;
            s.redis_url = Some(url);
            s.store_timeout = Duration::from_millis(500);
            s.deny_cache_max_age = Duration::from_secs(60);
        })
    };
    let (a, b) = (start().await, start().await);
    let call = || request("cc", &[&[("user", "u")]]);
    assert_eq!(a.ok(call()).await.overall_code, OK);
    assert_eq!(a.ok(call()).await.overall_code, OVER);
    assert_eq!(a.ok(call()).await.overall_code, OVER);
    let mut release = request("cc", &[]);
    let mut slot = descriptor(&[("user", "u")]);
    slot.is_negative_hits = true;
    release.descriptors.push(slot);
    assert_eq!(b.ok(release).await.overall_code, OK);
    assert_eq!(
        a.ok(call()).await.overall_code,
        OK,
        "the slot released on b is free on a"
    );
    assert_eq!(a.ok(call()).await.overall_code, OVER);
    a.stop().await;
    b.stop().await;
}
