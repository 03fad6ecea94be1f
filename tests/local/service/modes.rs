//! Shadow mode (per rule and global), limit overrides, hits_addend, and input: bad requests get
//! INVALID_ARGUMENT saying what is wrong, extreme but valid input an answer.

use super::*;

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
