//! Which rule a request meets and what it answers: limits, remaining and reset; request order;
//! full depth; unknown domains; wildcards; `replaces`; unlimited rules.

use super::*;

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
