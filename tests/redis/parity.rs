//! Drop-in for envoyproxy/ratelimit: every rule field it accepts, its answers, and Envoy's newest
//! request fields, end to end over gRPC. Scenarios that touch counting run on the memory store,
//! standalone Redis and a Redis Cluster alike.

use crate::common;

use std::time::Duration;

use crate::common::redis::{RedisCluster, RedisServer};
use crate::common::{TestServer, descriptor};
use portcullis::limiter::FailureMode;
use portcullis::pb::rate_limit_descriptor::RateLimitOverride;
use portcullis::pb::rate_limit_response::{Code, rate_limit::Unit};
use portcullis::pb::{RateLimitDescriptor, RateLimitRequest, RateLimitResponse, RateLimitUnit};
use portcullis::service::HeadersMode;
use portcullis::settings::{Settings, StoreKind};
use prost_types::value::Kind;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

const RULES: &str = r#"
domain: parity
descriptors:
  - key: path
    value: /files/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: path
    value: /api/*
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: tenant
    value_to_metric: true
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 100}
  - key: quota
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: plan
    value: gold
    metadata:
      tier: gold
      limits: {burst: 10}
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: plan
    value: silver
    metadata:
      tier: silver
      limits: {burst: 2, sustained: 1}
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: strict
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: five
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: loose
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: tokens
    rate_limit: {unit: minute, requests_per_unit: 100, algorithm: token_bucket}
  - key: near
    rate_limit: {unit: hour, requests_per_unit: 8}
"#;

fn call(descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: "parity".into(),
        descriptors,
        hits_addend: 0,
    }
}

fn d(key: &str, value: &str) -> RateLimitDescriptor {
    descriptor(&[(key, value)])
}

fn with_hits(mut descriptor: RateLimitDescriptor, hits: u64) -> RateLimitDescriptor {
    descriptor.hits_addend = Some(hits);
    descriptor
}

fn refund(descriptor: RateLimitDescriptor, hits: u64) -> RateLimitDescriptor {
    let mut descriptor = with_hits(descriptor, hits);
    descriptor.is_negative_hits = true;
    descriptor
}

fn remaining(r: &RateLimitResponse) -> Vec<u32> {
    r.statuses.iter().map(|s| s.limit_remaining).collect()
}

async fn http_get(server: &TestServer, path: &str) -> (u16, String) {
    let addr = server.running.as_ref().unwrap().admin_addr;
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    let status = raw[9..12].parse().unwrap();
    let body = raw
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

fn sample(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix(series)
                .and_then(|rest| rest.strip_prefix(' '))
        })
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

// --- Scenarios that count: run on every store. ---

/// share_threshold: every value the wildcard matches counts in one counter; a wildcard without
/// it counts each value apart.
async fn shared_wildcard_counts_once(server: &TestServer) {
    let codes = |r: RateLimitResponse| r.overall_code;
    assert_eq!(
        codes(server.ok(call(vec![d("path", "/files/a")])).await),
        OK
    );
    assert_eq!(
        codes(server.ok(call(vec![d("path", "/files/b")])).await),
        OK
    );
    assert_eq!(
        codes(server.ok(call(vec![d("path", "/files/c")])).await),
        OVER,
        "three values, one shared budget of 2"
    );
    for value in ["/api/a", "/api/b", "/api/c"] {
        assert_eq!(codes(server.ok(call(vec![d("path", value)])).await), OK);
    }
}

/// Stop charging when over: a call refused by one descriptor charges none of them.
async fn a_refused_call_charges_nothing(server: &TestServer) {
    let both = call(vec![d("strict", "s"), d("loose", "l")]);
    let r = server.ok(both.clone()).await;
    assert_eq!((r.overall_code, remaining(&r)), (OK, vec![0, 99]));
    let r = server.ok(both).await;
    assert_eq!(r.overall_code, OVER);
    assert_eq!(r.statuses[0].code, OVER);
    assert_eq!(
        (r.statuses[1].code, r.statuses[1].limit_remaining),
        (OK, 99),
        "would pass, not charged"
    );
    let r = server.ok(call(vec![d("loose", "l")])).await;
    assert_eq!(remaining(&r), vec![98], "only the first call charged it");
}

/// is_negative_hits: hits given back, answered OK with what remains; never above the limit.
async fn refunds_give_budget_back(server: &TestServer) {
    for key in ["tokens", "loose"] {
        let r = server.ok(call(vec![with_hits(d(key, "r"), 30)])).await;
        assert_eq!(remaining(&r), vec![70], "{key}");
        let r = server.ok(call(vec![refund(d(key, "r"), 20)])).await;
        assert_eq!((r.overall_code, remaining(&r)), (OK, vec![90]), "{key}");
        let r = server.ok(call(vec![refund(d(key, "r"), 1000)])).await;
        assert_eq!(remaining(&r), vec![100], "{key}: never above the limit");
        let r = server.ok(call(vec![with_hits(d(key, "r"), 100)])).await;
        assert_eq!((r.overall_code, remaining(&r)), (OK, vec![0]), "{key}");
    }
    // A refund of a spent limit lifts the refusal at once (the deny cache forgets it too).
    server.ok(call(vec![d("strict", "refund")])).await;
    let r = server.ok(call(vec![d("strict", "refund")])).await;
    assert_eq!(r.overall_code, OVER);
    let r = server
        .ok(call(vec![refund(d("strict", "refund"), 1)]))
        .await;
    assert_eq!((r.overall_code, remaining(&r)), (OK, vec![1]));
    let r = server.ok(call(vec![d("strict", "refund")])).await;
    assert_eq!(r.overall_code, OK);
}

#[tokio::test]
async fn memory_store() {
    let server = TestServer::start(&[("p.yaml", RULES)]).await;
    shared_wildcard_counts_once(&server).await;
    refunds_give_budget_back(&server).await;
    server.stop().await;
    let server =
        TestServer::start_with(&[("p.yaml", RULES)], |s| s.stop_charging_when_over = true).await;
    a_refused_call_charges_nothing(&server).await;
    server.stop().await;
}

fn on_redis(url: String) -> impl Fn(&mut Settings) + Clone {
    move |s: &mut Settings| {
        s.store = StoreKind::Redis;
        s.redis_url = Some(url.clone());
    }
}

fn on_cluster(seeds: Vec<String>) -> impl Fn(&mut Settings) + Clone {
    move |s: &mut Settings| {
        s.store = StoreKind::Redis;
        s.redis_cluster = seeds.clone();
    }
}

async fn redis_scenarios(backend: impl Fn(&mut Settings) + Clone, prefix: &str) {
    let (b, p) = (backend.clone(), prefix.to_owned());
    let server = TestServer::start_with(&[("p.yaml", RULES)], move |s| {
        b(s);
        s.key_prefix = format!("{p}a:");
    })
    .await;
    shared_wildcard_counts_once(&server).await;
    refunds_give_budget_back(&server).await;
    server.stop().await;
    let p = prefix.to_owned();
    let server = TestServer::start_with(&[("p.yaml", RULES)], move |s| {
        backend(s);
        s.key_prefix = format!("{p}b:");
        s.stop_charging_when_over = true;
    })
    .await;
    a_refused_call_charges_nothing(&server).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_redis() {
    let redis = RedisServer::start();
    redis_scenarios(on_redis(redis.url()), "s").await;
    // The shared counter is one key, named by the pattern (not by a value).
    let keys = common::redis::cli(redis.port, &["KEYS", "sa:*path*"]);
    let keys: Vec<&str> = keys.lines().collect();
    assert!(
        keys.contains(&"sa:{parity|path==/files/*}:sw60:60000000us"),
        "{keys:?}"
    );
    assert_eq!(keys.iter().filter(|k| k.contains("/files/")).count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster() {
    let cluster = RedisCluster::start();
    redis_scenarios(on_cluster(cluster.seeds()), "c").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_mode_error_hands_the_store_error_to_envoy() {
    let port = common::redis::free_port();
    let server = TestServer::start_with(&[("p.yaml", RULES)], move |s| {
        s.store = StoreKind::Redis;
        s.redis_url = Some(format!("redis://127.0.0.1:{port}"));
        s.store_timeout = Duration::from_millis(100);
        s.failure_mode = FailureMode::Error;
    })
    .await;
    let status = server
        .call(call(vec![d("loose", "x")]))
        .await
        .expect_err("a gRPC error for Envoy's failure_mode_deny to judge");
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert!(status.message().contains("store"), "{}", status.message());
    server.stop().await;
}

// --- Answers: the memory store is enough. ---

#[tokio::test]
async fn quota_descriptors_refuse_a_call_only_when_all_of_them_are_over() {
    let server = TestServer::start(&[("p.yaml", RULES)]).await;
    server.ok(call(vec![d("quota", "x")])).await;
    // x is spent, z is not: the call passes, and x's status says it is over.
    let r = server
        .ok(call(vec![d("quota", "x"), d("quota", "z")]))
        .await;
    assert_eq!(r.overall_code, OK);
    assert_eq!((r.statuses[0].code, r.statuses[1].code), (OVER, OK));
    // Both spent: refused.
    let r = server
        .ok(call(vec![d("quota", "x"), d("quota", "z")]))
        .await;
    assert_eq!(r.overall_code, OVER);
    // An ordinary descriptor over its limit refuses the call whatever the quotas say.
    server.ok(call(vec![d("strict", "s")])).await;
    let r = server
        .ok(call(vec![d("strict", "s"), d("quota", "y")]))
        .await;
    assert_eq!(r.overall_code, OVER);
    server.stop().await;

    // --quota-mode makes every limit a quota.
    let server = TestServer::start_with(&[("p.yaml", RULES)], |s| s.quota_mode = true).await;
    server.ok(call(vec![d("strict", "s")])).await;
    let r = server
        .ok(call(vec![d("strict", "s"), d("loose", "l")]))
        .await;
    assert_eq!(r.overall_code, OK, "one quota of two still has budget");
    server.stop().await;
}

#[tokio::test]
async fn dynamic_metadata_describes_the_call_and_merges_the_passed_rules_metadata() {
    let server = TestServer::start_with(&[("p.yaml", RULES)], |s| {
        s.response_dynamic_metadata = true;
    })
    .await;
    let mut request = call(vec![d("plan", "gold"), with_hits(d("plan", "silver"), 2)]);
    request.hits_addend = 1;
    let r = server.ok(request).await;
    let meta = r.dynamic_metadata.expect("dynamic metadata").fields;
    let text = |v: &prost_types::Value| match &v.kind {
        Some(Kind::StringValue(s)) => s.clone(),
        other => panic!("not a string: {other:?}"),
    };
    let fields = |v: &prost_types::Value| match &v.kind {
        Some(Kind::StructValue(s)) => s.fields.clone(),
        other => panic!("not a struct: {other:?}"),
    };
    assert_eq!(text(&meta["domain"]), "parity");
    let Some(Kind::ListValue(descriptors)) = &meta["descriptors"].kind else {
        panic!("descriptors is a list");
    };
    let first = fields(&descriptors.values[0]);
    let Some(Kind::ListValue(entries)) = &first["entries"].kind else {
        panic!("entries is a list");
    };
    assert_eq!(text(&entries.values[0]), "plan=gold");
    let second = fields(&descriptors.values[1]);
    assert_eq!(second["hitsAddend"].kind, Some(Kind::NumberValue(2.0)));
    assert_eq!(meta["hitsAddend"].kind, Some(Kind::NumberValue(1.0)));
    // Both passed: the first rule's value wins a conflict, maps merge.
    let merged = fields(&meta["metadata"]);
    assert_eq!(text(&merged["tier"]), "gold");
    let limits = fields(&merged["limits"]);
    assert_eq!(limits["burst"].kind, Some(Kind::NumberValue(10.0)));
    assert_eq!(limits["sustained"].kind, Some(Kind::NumberValue(1.0)));
    // Off by default.
    server.stop().await;
    let server = TestServer::start(&[("p.yaml", RULES)]).await;
    let r = server.ok(call(vec![d("plan", "gold")])).await;
    assert_eq!(r.dynamic_metadata, None);
    server.stop().await;
}

#[tokio::test]
async fn near_limit_counts_each_hit_as_the_go_service_does() {
    let server = TestServer::start(&[("p.yaml", RULES)]).await;
    // Limit 8, threshold floor(8 * 0.8) = 6: 5 hits, then 2 more: one lands above 6.
    server.ok(call(vec![with_hits(d("near", "n"), 5)])).await;
    server.ok(call(vec![with_hits(d("near", "n"), 2)])).await;
    let (_, m) = http_get(&server, "/metrics").await;
    assert_eq!(
        sample(
            &m,
            r#"portcullis_rule_near_limit_total{domain="parity",rule="parity.near"}"#
        ),
        1.0,
        "{m}"
    );
    server.stop().await;
}

#[tokio::test]
async fn value_to_metric_puts_the_request_value_in_the_rule_name() {
    let server = TestServer::start(&[("p.yaml", RULES)]).await;
    server
        .ok(RateLimitRequest {
            domain: "parity".into(),
            descriptors: vec![descriptor(&[("tenant", "acme"), ("user", "bob")])],
            hits_addend: 0,
        })
        .await;
    let (_, m) = http_get(&server, "/metrics").await;
    assert_eq!(
        sample(
            &m,
            r#"portcullis_rule_hits_total{domain="parity",rule="parity.tenant_acme.user"}"#
        ),
        1.0,
        "{m}"
    );
    server.stop().await;
}

#[tokio::test]
async fn headers_come_from_the_refusing_descriptor_under_the_configured_names() {
    let server = TestServer::start_with(&[("p.yaml", RULES)], |s| {
        s.response_headers = HeadersMode::Draft03;
        s.header_limit_name = Some("X-Limit".into());
        s.header_remaining_name = Some("X-Remaining".into());
        s.header_reset_name = Some("X-Reset".into());
    })
    .await;
    server.ok(call(vec![d("strict", "h")])).await;
    // `five` refuses (6 hits > 5, nothing spent: 5 remain); `strict` passes a check-only call
    // with 0 remaining. The headers describe the refusal, not the least remaining.
    let r = server
        .ok(call(vec![
            with_hits(d("five", "h"), 6),
            with_hits(d("strict", "h"), 0),
        ]))
        .await;
    assert_eq!(r.overall_code, OVER);
    let header = |name: &str| {
        r.response_headers_to_add
            .iter()
            .find(|h| h.key == name)
            .map(|h| h.value.clone())
    };
    assert_eq!(header("X-Remaining").as_deref(), Some("5"));
    assert!(header("X-Limit").is_some_and(|v| v.starts_with("5, ")));
    assert!(header("X-Reset").is_some());
    assert_eq!(header("x-ratelimit-remaining"), None);
    server.stop().await;
}

fn with_override(entries: &[(&str, &str)], requests: u32, unit: RateLimitUnit) -> RateLimitRequest {
    let mut descriptor = descriptor(entries);
    descriptor.limit = Some(RateLimitOverride {
        requests_per_unit: requests,
        unit: unit as i32,
    });
    call(vec![descriptor])
}

#[tokio::test]
async fn request_carried_limits_count_in_fixed_windows_like_the_go_service() {
    let server = TestServer::start(&[("p.yaml", RULES)]).await;
    // The test clock starts on a day boundary; 10 s later a fixed minute resets in 50 s.
    server.clock.advance_us(10_000_000);
    let r = server
        .ok(with_override(&[("loose", "o")], 2, RateLimitUnit::Minute))
        .await;
    assert_eq!(r.statuses[0].duration_until_reset.unwrap().seconds, 50);
    // WEEK, Envoy's newest unit, is accepted and reported.
    let r = server
        .ok(with_override(&[("loose", "w")], 3, RateLimitUnit::Week))
        .await;
    let limit = r.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (3, Unit::Week as i32)
    );
    assert_eq!(r.statuses[0].limit_remaining, 2);
    server.stop().await;

    // --override-algorithm chooses another algorithm: a sliding window resets a minute after.
    let server = TestServer::start_with(&[("p.yaml", RULES)], |s| {
        s.override_algorithm = portcullis::algorithm::Algorithm::SlidingWindow;
    })
    .await;
    server.clock.advance_us(10_000_000);
    let r = server
        .ok(with_override(&[("loose", "o")], 2, RateLimitUnit::Minute))
        .await;
    assert!(r.statuses[0].duration_until_reset.unwrap().seconds >= 60);
    server.stop().await;
}

#[tokio::test]
async fn grpc_health_answers_for_the_go_service_name_and_healthcheck_over_http() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let server = TestServer::start(&[("p.yaml", RULES)]).await;
    let addr = server.running.as_ref().unwrap().grpc_addr;
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    let answer = health
        .check(HealthCheckRequest {
            service: "ratelimit".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.status, ServingStatus::Serving as i32);
    assert_eq!(http_get(&server, "/healthcheck").await, (200, "OK".into()));
    server.stop().await;
}

#[tokio::test]
async fn a_domain_merged_from_two_files_serves_both_files_rules() {
    let first = "domain: merged\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1}\n";
    let second = "domain: merged\ndescriptors:\n  - key: path\n    rate_limit: {unit: minute, requests_per_unit: 2}\n";
    let server = TestServer::start_with(&[("a.yaml", first), ("b.yaml", second)], |s| {
        s.merge_domain_config = true;
    })
    .await;
    let r = server
        .ok(RateLimitRequest {
            domain: "merged".into(),
            descriptors: vec![d("user", "u"), d("path", "/p")],
            hits_addend: 0,
        })
        .await;
    assert_eq!(remaining(&r), vec![0, 1]);
    server.stop().await;
}
