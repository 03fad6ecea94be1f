//! The service end to end over real gRPC on loopback: what a gateway sees for each rule feature,
//! the matching semantics of envoyproxy/ratelimit, and bad input.

mod common;

use common::{TestServer, descriptor, header, request};
use portcullis::pb::rate_limit_descriptor::RateLimitOverride;
use portcullis::pb::rate_limit_response::{Code, rate_limit::Unit};
use portcullis::pb::{RateLimitRequest, RateLimitResponse, RateLimitUnit};
use portcullis::service::HeadersMode;

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

fn codes(r: &RateLimitResponse) -> Vec<i32> {
    r.statuses.iter().map(|s| s.code).collect()
}

const BASIC: &str = r#"
domain: basic
descriptors:
  - key: key1
    rate_limit:
      unit: minute
      requests_per_unit: 3
  - key: key1
    value: special
    rate_limit:
      name: special
      unit: hour
      requests_per_unit: 1
  - key: nested
    descriptors:
      - key: leaf
        rate_limit:
          unit: second
          requests_per_unit: 1
  - key: deep
    value: v
    rate_limit:
      unit: minute
      requests_per_unit: 1
"#;

#[tokio::test]
async fn over_limit_after_n_hits_with_limit_remaining_and_reset() {
    let server = TestServer::start(&[("basic.yaml", BASIC)]).await;
    for remaining in [2, 1, 0] {
        let r = server.ok(request("basic", &[&[("key1", "a")]])).await;
        assert_eq!(r.overall_code, OK);
        let s = &r.statuses[0];
        assert_eq!(s.code, OK);
        assert_eq!(s.limit_remaining, remaining);
        let limit = s.current_limit.as_ref().expect("current_limit");
        assert_eq!(
            (limit.requests_per_unit, limit.unit),
            (3, Unit::Minute as i32)
        );
        // Sliding window: the first hit leaves the window after one minute plus one sub-window
        // (a sixtieth of the minute).
        assert_eq!(s.duration_until_reset.unwrap().seconds, 61);
    }
    let r = server.ok(request("basic", &[&[("key1", "a")]])).await;
    assert_eq!(r.overall_code, OVER);
    assert_eq!(r.statuses[0].code, OVER);
    assert_eq!(r.statuses[0].limit_remaining, 0);
    assert!(r.statuses[0].duration_until_reset.unwrap().seconds >= 1);
    // Another value of the same key has its own counter.
    let r = server.ok(request("basic", &[&[("key1", "b")]])).await;
    assert_eq!(r.overall_code, OK);
    // The budget comes back once the window has passed.
    server.clock.advance_us(66_000_000);
    let r = server.ok(request("basic", &[&[("key1", "a")]])).await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses[0].limit_remaining, 2);
    server.stop().await;
}

#[tokio::test]
async fn statuses_follow_request_order_and_exact_value_beats_default() {
    let server = TestServer::start(&[("basic.yaml", BASIC)]).await;
    let r = server
        .ok(request(
            "basic",
            &[
                &[("key1", "special")],
                &[("unknown", "x")],
                &[("key1", "other")],
            ],
        ))
        .await;
    assert_eq!(r.statuses.len(), 3);
    let special = r.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(
        (
            special.requests_per_unit,
            special.unit,
            special.name.as_str()
        ),
        (1, Unit::Hour as i32, "special")
    );
    assert_eq!(
        r.statuses[1].current_limit, None,
        "no rule: OK without a limit"
    );
    assert_eq!(r.statuses[1].code, OK);
    assert_eq!(
        r.statuses[2]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        3
    );
    let r = server.ok(request("basic", &[&[("key1", "special")]])).await;
    assert_eq!(codes(&r), [OVER]);
    assert_eq!(r.overall_code, OVER);
    server.stop().await;
}

#[tokio::test]
async fn a_limit_applies_only_at_the_full_depth_of_the_request() {
    let server = TestServer::start(&[("basic.yaml", BASIC)]).await;
    // The rule is at [nested, leaf]; [nested] alone and [nested, leaf, extra] match nothing.
    for entries in [
        &[("nested", "x")][..],
        &[("nested", "x"), ("leaf", "y"), ("extra", "z")][..],
        &[("deep", "v"), ("more", "w")][..],
    ] {
        for _ in 0..3 {
            let r = server.ok(request("basic", &[entries])).await;
            assert_eq!(r.overall_code, OK, "{entries:?}");
            assert_eq!(r.statuses[0].current_limit, None, "{entries:?}");
        }
    }
    let r = server
        .ok(request("basic", &[&[("nested", "x"), ("leaf", "y")]]))
        .await;
    assert_eq!(
        r.statuses[0].current_limit.as_ref().unwrap().unit,
        Unit::Second as i32
    );
    let r = server
        .ok(request("basic", &[&[("nested", "x"), ("leaf", "y")]]))
        .await;
    assert_eq!(r.overall_code, OVER);
    server.stop().await;
}

#[tokio::test]
async fn unknown_domain_is_ok_without_a_limit() {
    let server = TestServer::start(&[("basic.yaml", BASIC)]).await;
    for _ in 0..5 {
        let r = server.ok(request("nobody", &[&[("key1", "a")]])).await;
        assert_eq!(r.overall_code, OK);
        assert_eq!(r.statuses[0].current_limit, None);
    }
    server.stop().await;
}

const WILDCARD: &str = r#"
domain: wild
descriptors:
  - key: path
    value: /api/v1/*
    rate_limit: {unit: minute, requests_per_unit: 1, name: v1}
  - key: path
    value: /api/*
    rate_limit: {unit: minute, requests_per_unit: 2, name: api}
  - key: path
    value: /api/v1/exact
    rate_limit: {unit: minute, requests_per_unit: 5, name: exact}
  - key: path
    value: "*/users/*/avatar"
    rate_limit: {unit: minute, requests_per_unit: 4, name: avatar}
  - key: path
    rate_limit: {unit: minute, requests_per_unit: 10, name: default}
"#;

#[tokio::test]
async fn wildcards_match_in_file_order_after_exact_values_and_before_the_default() {
    let server = TestServer::start(&[("wild.yaml", WILDCARD)]).await;
    let name_of =
        |r: &RateLimitResponse| r.statuses[0].current_limit.as_ref().map(|l| l.name.clone());
    for (path, name) in [
        ("/api/v1/exact", "exact"),
        ("/api/v1/things", "v1"),
        ("/api/v2/things", "api"),
        ("/api/", "api"),
        ("/x/users/42/avatar", "avatar"),
        ("/other", "default"),
    ] {
        let r = server.ok(request("wild", &[&[("path", path)]])).await;
        assert_eq!(name_of(&r).as_deref(), Some(name), "{path}");
    }
    // Each value matched by a wildcard has its own counter, like the Go service.
    let r = server
        .ok(request("wild", &[&[("path", "/api/v1/things")]]))
        .await;
    assert_eq!(r.overall_code, OVER);
    let r = server
        .ok(request("wild", &[&[("path", "/api/v1/others")]]))
        .await;
    assert_eq!(r.overall_code, OK);
    server.stop().await;
}

const REPLACES: &str = r#"
domain: rep
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1, name: per-user}
  - key: vip
    rate_limit:
      unit: minute
      requests_per_unit: 3
      replaces:
        - name: per-user
  - key: free
    rate_limit: {unlimited: true}
  - key: internal
    rate_limit:
      unlimited: true
      replaces:
        - name: per-user
"#;

#[tokio::test]
async fn an_unlimited_rule_with_replaces_drops_the_replaced_limit_like_the_go_service() {
    let server = TestServer::start(&[("rep.yaml", REPLACES)]).await;
    for _ in 0..3 {
        let r = server
            .ok(request("rep", &[&[("user", "u1")], &[("internal", "svc")]]))
            .await;
        assert_eq!(r.overall_code, OK);
        assert_eq!(r.statuses[0].current_limit, None, "replaced: OK, no limit");
        assert_eq!(r.statuses[1].limit_remaining, u32::MAX, "unlimited");
    }
    // The replaced limit was never counted.
    let r = server.ok(request("rep", &[&[("user", "u1")]])).await;
    assert_eq!(r.overall_code, OK);
    server.stop().await;
}

#[tokio::test]
async fn replaces_drops_the_named_limit_of_the_same_call_without_counting_it() {
    let server = TestServer::start(&[("rep.yaml", REPLACES)]).await;
    for _ in 0..3 {
        let r = server
            .ok(request("rep", &[&[("user", "u1")], &[("vip", "u1")]]))
            .await;
        assert_eq!(r.overall_code, OK);
        assert_eq!(r.statuses[0].current_limit, None, "replaced: OK, no limit");
        assert_eq!(
            r.statuses[1]
                .current_limit
                .as_ref()
                .unwrap()
                .requests_per_unit,
            3
        );
    }
    // The replaced limit was never counted: alone, its first call passes.
    let r = server.ok(request("rep", &[&[("user", "u1")]])).await;
    assert_eq!(r.overall_code, OK);
    let r = server.ok(request("rep", &[&[("user", "u1")]])).await;
    assert_eq!(r.overall_code, OVER);
    server.stop().await;
}

#[tokio::test]
async fn unlimited_answers_ok_with_the_most_remaining() {
    let server = TestServer::start(&[("rep.yaml", REPLACES)]).await;
    for _ in 0..10 {
        let r = server.ok(request("rep", &[&[("free", "x")]])).await;
        assert_eq!(r.overall_code, OK);
        assert_eq!(r.statuses[0].limit_remaining, u32::MAX);
        assert_eq!(r.statuses[0].current_limit, None);
    }
    server.stop().await;
}

const SHADOW: &str = r#"
domain: shadow
descriptors:
  - key: trial
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: real
    rate_limit: {unit: minute, requests_per_unit: 1}
"#;

#[tokio::test]
async fn shadow_mode_counts_but_never_answers_over_limit() {
    let server = TestServer::start(&[("s.yaml", SHADOW)]).await;
    let first = server.ok(request("shadow", &[&[("trial", "x")]])).await;
    assert_eq!(first.statuses[0].limit_remaining, 0, "the hit was counted");
    let second = server.ok(request("shadow", &[&[("trial", "x")]])).await;
    assert_eq!(second.overall_code, OK);
    assert_eq!(second.statuses[0].code, OK);
    assert_eq!(second.statuses[0].limit_remaining, 0);
    // A real rule in the same call still limits.
    server.ok(request("shadow", &[&[("real", "x")]])).await;
    let r = server
        .ok(request("shadow", &[&[("trial", "x")], &[("real", "x")]]))
        .await;
    assert_eq!(r.overall_code, OVER);
    assert_eq!(codes(&r), [OK, OVER]);
    server.stop().await;
}

#[tokio::test]
async fn global_shadow_mode_never_answers_over_limit_overall() {
    let server = TestServer::start_with(&[("s.yaml", SHADOW)], |s| s.shadow_mode = true).await;
    server.ok(request("shadow", &[&[("real", "x")]])).await;
    let r = server.ok(request("shadow", &[&[("real", "x")]])).await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(codes(&r), [OVER], "the descriptor still tells the truth");
    server.stop().await;
}

fn with_override(entries: &[(&str, &str)], requests: u32, unit: RateLimitUnit) -> RateLimitRequest {
    let mut d = descriptor(entries);
    d.limit = Some(RateLimitOverride {
        requests_per_unit: requests,
        unit: unit as i32,
    });
    RateLimitRequest {
        domain: "basic".into(),
        descriptors: vec![d],
        hits_addend: 0,
    }
}

#[tokio::test]
async fn a_limit_override_wins_and_counts_apart_from_other_overrides() {
    let server = TestServer::start(&[("basic.yaml", BASIC)]).await;
    // key1 is configured at 3/minute; the request says 2/second.
    for expected in [OK, OK, OVER] {
        let r = server
            .ok(with_override(&[("key1", "o")], 2, RateLimitUnit::Second))
            .await;
        assert_eq!(r.overall_code, expected);
        let limit = r.statuses[0].current_limit.as_ref().unwrap();
        assert_eq!(
            (limit.requests_per_unit, limit.unit),
            (2, Unit::Second as i32)
        );
    }
    // A different override of the same descriptor has its own counter.
    let r = server
        .ok(with_override(&[("key1", "o")], 5, RateLimitUnit::Second))
        .await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses[0].limit_remaining, 4);
    // Overrides apply to descriptors without a configured rule too (known domain).
    let r = server
        .ok(with_override(&[("free", "form")], 1, RateLimitUnit::Hour))
        .await;
    assert_eq!(
        r.statuses[0].current_limit.as_ref().unwrap().unit,
        Unit::Hour as i32
    );
    server.stop().await;
}

#[tokio::test]
async fn hits_addend_request_level_and_per_descriptor() {
    let server = TestServer::start(&[("basic.yaml", BASIC)]).await;
    // Request-level 0 means 1.
    let r = server.ok(request("basic", &[&[("key1", "h")]])).await;
    assert_eq!(r.statuses[0].limit_remaining, 2);
    // Per-descriptor 0 is a check only: nothing spent.
    let mut check_only = request("basic", &[&[("key1", "h")]]);
    check_only.descriptors[0].hits_addend = Some(0);
    check_only.hits_addend = 2;
    let r = server.ok(check_only).await;
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 2));
    // Request-level 2 spends 2.
    let mut two = request("basic", &[&[("key1", "h")]]);
    two.hits_addend = 2;
    let r = server.ok(two.clone()).await;
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 0));
    // Denied hits are not counted: a cost of 5 against 3 is refused and spends nothing.
    let mut five = request("basic", &[&[("key1", "i")]]);
    five.hits_addend = 5;
    let r = server.ok(five).await;
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OVER, 3));
    server.stop().await;
}

#[tokio::test]
async fn bad_requests_get_invalid_argument_saying_what_is_wrong() {
    let server = TestServer::start(&[("basic.yaml", BASIC)]).await;
    let mut cases: Vec<(RateLimitRequest, &str)> = vec![
        (request("", &[&[("key1", "a")]]), "domain must not be empty"),
        (request("basic", &[]), "descriptors must not be empty"),
        (
            request("basic", &[&[("key1", "a")], &[]]),
            "descriptors[1] has no entries",
        ),
        (
            request("basic", &[&[("", "a")]]),
            "descriptors[0].entries[0].key must not be empty",
        ),
        (
            with_override(&[("key1", "a")], 5, RateLimitUnit::Unknown),
            "descriptors[0].limit.unit",
        ),
    ];
    let mut bogus_unit = with_override(&[("key1", "a")], 5, RateLimitUnit::Second);
    bogus_unit.descriptors[0].limit.as_mut().unwrap().unit = 42;
    cases.push((bogus_unit, "descriptors[0].limit.unit"));
    let many: Vec<&[(&str, &str)]> = vec![&[("key1", "a")]; 600];
    cases.push((
        request("basic", &many),
        "600 descriptors is more than the 512 allowed",
    ));
    for (req, message) in cases {
        let status = server.call(req).await.expect_err("refused");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{message}");
        assert!(
            status.message().contains(message),
            "{:?} should contain {message:?}",
            status.message()
        );
    }
    // Nothing was counted by the refused calls, and the server still answers.
    let r = server.ok(request("basic", &[&[("key1", "a")]])).await;
    assert_eq!(r.statuses[0].limit_remaining, 2);
    server.stop().await;
}

#[tokio::test]
async fn extreme_but_valid_input_gets_an_answer() {
    let server = TestServer::start(&[("basic.yaml", BASIC)]).await;
    // u64::MAX hits: refused, nothing spent.
    let mut huge = request("basic", &[&[("key1", "a")]]);
    huge.descriptors[0].hits_addend = Some(u64::MAX);
    let r = server.ok(huge).await;
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OVER, 3));
    // u32::MAX request-level hits.
    let mut big = request("basic", &[&[("key1", "b")]]);
    big.hits_addend = u32::MAX;
    assert_eq!(server.ok(big).await.overall_code, OVER);
    // A value as long as allowed (1 KiB by default), a huge override.
    let long = "v".repeat(1024);
    let r = server.ok(request("basic", &[&[("key1", &long)]])).await;
    assert_eq!(r.overall_code, OK);
    let r = server
        .ok(with_override(
            &[("key1", "x")],
            u32::MAX,
            RateLimitUnit::Year,
        ))
        .await;
    assert_eq!(r.statuses[0].limit_remaining, u32::MAX - 1);
    let r = server
        .ok(with_override(&[("key1", "x")], 0, RateLimitUnit::Second))
        .await;
    assert_eq!(r.overall_code, OVER, "an override of 0 denies");
    // A message over the size limit is refused by gRPC itself, and the server stays up.
    let too_big = "v".repeat(2 << 20);
    let status = server
        .call(request("basic", &[&[("key1", &too_big)]]))
        .await
        .expect_err("too big");
    assert_eq!(status.code(), tonic::Code::OutOfRange);
    assert_eq!(
        server
            .ok(request("basic", &[&[("key1", "c")]]))
            .await
            .overall_code,
        OK
    );
    server.stop().await;
}

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
    let held = |r: &RateLimitResponse| -> Vec<(String, String)> {
        let Some(meta) = &r.dynamic_metadata else {
            return Vec::new();
        };
        let Some(prost_types::value::Kind::StructValue(held)) =
            meta.fields.get("held").and_then(|v| v.kind.clone())
        else {
            return Vec::new();
        };
        held.fields
            .into_iter()
            .map(|(k, v)| match v.kind {
                Some(prost_types::value::Kind::StringValue(s)) => (k, s),
                other => panic!("{k}: {other:?}"),
            })
            .collect()
    };
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
