//! Counting under load and over time: concurrent calls admit exactly the limit, each algorithm
//! gives budget back; rate-limit headers; gRPC health; concurrency slots held.

use super::*;

const ALGORITHMS: &str = r#"
domain: algo
descriptors:
  - key: sliding
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: bucket
    rate_limit: {unit: minute, requests_per_unit: 100, algorithm: token_bucket}
  - key: fixed
    rate_limit: {unit: minute, requests_per_unit: 100, algorithm: fixed_window}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hundred_concurrent_calls_admit_exactly_the_limit() {
    let server = TestServer::start(&[("algo.yaml", ALGORITHMS)]).await;
    for key in ["sliding", "bucket", "fixed"] {
        let request = request("algo", &[&[(key, "shared")]]);
        let admitted =
            common::count_admitted(std::slice::from_ref(&server.client), request, 300).await;
        assert_eq!(admitted, 100, "{key}");
    }
    server.stop().await;
}

#[tokio::test]
async fn each_algorithm_gives_budget_back_as_time_passes() {
    let server = TestServer::start(&[("algo.yaml", ALGORITHMS)]).await;
    let spend = |key: &'static str, hits: u32| {
        let mut r = request("algo", &[&[(key, "t")]]);
        r.hits_addend = hits;
        server.ok(r)
    };
    // Token bucket: 100 per minute is one every 600 ms, continuously.
    assert_eq!(spend("bucket", 100).await.overall_code, OK);
    assert_eq!(spend("bucket", 1).await.overall_code, OVER);
    server.clock.advance_us(600_000);
    let r = spend("bucket", 1).await;
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 0));
    server.clock.advance_us(30_000_000);
    assert_eq!(spend("bucket", 1).await.statuses[0].limit_remaining, 49);
    // Fixed window: all back at the minute boundary (the clock starts on one).
    assert_eq!(spend("fixed", 100).await.overall_code, OK);
    let r = spend("fixed", 1).await;
    assert_eq!(r.overall_code, OVER);
    assert_eq!(
        r.statuses[0].duration_until_reset.unwrap().seconds,
        30,
        "half a minute is left"
    );
    server.clock.advance_us(30_000_000);
    assert_eq!(spend("fixed", 100).await.overall_code, OK);
    // Sliding window: no budget at the minute boundary; back one minute (and a sub-window) later.
    assert_eq!(spend("sliding", 100).await.overall_code, OK);
    server.clock.advance_us(30_000_000);
    assert_eq!(
        spend("sliding", 1).await.overall_code,
        OVER,
        "no edge burst"
    );
    server.clock.advance_us(36_000_000);
    assert_eq!(spend("sliding", 100).await.overall_code, OK);
    server.stop().await;
}

const HEADERS: &str = r#"
domain: hdr
descriptors:
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 2, name: per-ip}
  - key: route
    rate_limit: {unit: hour, requests_per_unit: 100}
"#;

#[tokio::test]
async fn draft03_headers_describe_the_most_restrictive_limit() {
    let server = TestServer::start_with(&[("h.yaml", HEADERS)], |s| {
        s.response_headers = HeadersMode::Draft03
    })
    .await;
    let call = || server.ok(request("hdr", &[&[("route", "r")], &[("ip", "1.2.3.4")]]));
    let r = call().await;
    assert_eq!(
        header(&r, "x-ratelimit-limit"),
        Some("2, 100;w=3600, 2;w=60;name=\"per-ip\"")
    );
    assert_eq!(header(&r, "x-ratelimit-remaining"), Some("1"));
    assert_eq!(header(&r, "x-ratelimit-reset"), Some("61"));
    assert_eq!(header(&r, "retry-after"), None);
    call().await;
    let r = call().await;
    assert_eq!(r.overall_code, OVER);
    assert_eq!(header(&r, "x-ratelimit-remaining"), Some("0"));
    assert_eq!(header(&r, "retry-after"), Some("61"));
    server.stop().await;
}

#[tokio::test]
async fn ietf_headers_and_none_by_default() {
    let server = TestServer::start_with(&[("h.yaml", HEADERS)], |s| {
        s.response_headers = HeadersMode::Ietf
    })
    .await;
    let r = server.ok(request("hdr", &[&[("ip", "1.2.3.4")]])).await;
    assert_eq!(header(&r, "ratelimit-limit"), Some("2"));
    assert_eq!(
        header(&r, "ratelimit-policy"),
        Some("2;w=60;name=\"per-ip\"")
    );
    assert_eq!(header(&r, "ratelimit-remaining"), Some("1"));
    assert_eq!(header(&r, "ratelimit-reset"), Some("61"));
    server.stop().await;

    let server = TestServer::start(&[("h.yaml", HEADERS)]).await;
    let r = server.ok(request("hdr", &[&[("ip", "1.2.3.4")]])).await;
    assert!(r.response_headers_to_add.is_empty());
    server.stop().await;
}

#[tokio::test]
async fn grpc_health_reports_serving() {
    use tonic_health::pb::{
        HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
    };
    let server = TestServer::start(&[("basic.yaml", BASIC)]).await;
    let addr = server.running.as_ref().unwrap().grpc_addr;
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    for service in ["", "envoy.service.ratelimit.v3.RateLimitService"] {
        let status = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner()
            .status;
        assert_eq!(status, ServingStatus::Serving as i32, "{service:?}");
    }
    server.stop().await;
}

/// The `held` metadata Envoy's release reads: the slots a concurrency descriptor took, 0 for a
/// refusal, a probe or a shadow-mode refusal (answered OK, no slot taken), none for a release.
#[tokio::test]
async fn held_says_the_slots_each_concurrency_descriptor_took() {
    const RULES: &str = "domain: cc
descriptors:
  - key: user
    rate_limit: {algorithm: concurrency, requests_per_unit: 1, unit: minute}
  - key: team
    shadow_mode: true
    rate_limit: {algorithm: concurrency, requests_per_unit: 1, unit: minute}
  - key: path
    rate_limit: {unit: minute, requests_per_unit: 100}
";
    let server = TestServer::start(&[("cc.yaml", RULES)]).await;
    let held = |r: &RateLimitResponse| meta(r, "held");
    let call = || {
        request(
            "cc",
            &[&[("user", "u")], &[("team", "t")], &[("path", "/")]],
        )
    };
    let first = server.ok(call()).await;
    assert_eq!(first.overall_code, OK);
    assert_eq!(
        held(&first),
        [("team".into(), "1".into()), ("user".into(), "1".into())]
    );
    // Both full: user refuses, team (shadow mode) answers OK without a slot.
    let second = server.ok(call()).await;
    assert_eq!(second.overall_code, OVER);
    assert_eq!(
        held(&second),
        [("team".into(), "0".into()), ("user".into(), "0".into())]
    );
    // A check-only call takes nothing; a release is not a charge.
    let mut probe = request("cc", &[&[("user", "u")]]);
    probe.descriptors[0].hits_addend = Some(0);
    assert_eq!(held(&server.ok(probe).await), [("user".into(), "0".into())]);
    let mut release = request("cc", &[&[("user", "u")]]);
    release.descriptors[0].is_negative_hits = true;
    assert!(held(&server.ok(release).await).is_empty());
    // No concurrency descriptor: no metadata at all (the flag is off).
    let plain = server.ok(request("cc", &[&[("path", "/")]])).await;
    assert!(plain.dynamic_metadata.is_none());
    // Per-rule metrics as for any rule: holds are hits, refusals over limit (shadow mode's
    // counted apart), releases refunds.
    let m = server.running.as_ref().unwrap().metrics.encode();
    let user = r#"{domain="cc",rule="cc.user"}"#;
    let team = r#"{domain="cc",rule="cc.team"}"#;
    let sample = |series: String| common::sample(&m, &series);
    assert_eq!(
        sample(format!("portcullis_rule_hits_total{user}")),
        2.0,
        "{m}"
    );
    assert_eq!(
        sample(format!("portcullis_rule_over_limit_total{user}")),
        1.0
    );
    assert_eq!(sample(format!("portcullis_rule_refunded_total{user}")), 1.0);
    assert_eq!(
        sample(format!("portcullis_rule_shadow_mode_total{team}")),
        1.0
    );
    server.stop().await;
}
