//! The quota service (RLQS) as a gateway's stream sees it, over gRPC against the real server on
//! a manual clock: a bucket matched to its rule gets a token bucket of the rule's rate; two
//! gateways share one rule without ever holding more than its rate together; buckets no enforced
//! rule limits are allowed; a malformed report ends its own stream and nothing else.
//!
//! What a gateway admits is charged into the rule's window at its next report (the one budget,
//! `tests/one_budget.rs`): tests about shares have a stream's later reports say its requests
//! were refused (the same demand, nothing to charge), on a clock that does not move.

mod common;

use std::time::Duration;

use common::TestServer;
use common::rlqs::{Gateway, Usage, assigned, await_streams, bucket, tokens_per_second};
use portcullis::pb::rlqs::{
    BucketAction, RateLimitQuotaServiceClient, RateLimitQuotaUsageReports, Strategy, bucket_action,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

const RULES: &str = "\
domain: edge
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: path
    value: /login
    rate_limit: {unit: minute, requests_per_unit: 6}
  - key: path
    value: /healthz
    rate_limit: {unlimited: true}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: api
    value: /api/*
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: 20}
";

/// Gateways that report every second: assignments last 3 s. No pushes between reports: each
/// answer a test reads is the one to its report (`pushing_server` for pushes).
async fn server() -> TestServer {
    TestServer::start_with(&[("edge.yaml", RULES)], |s| {
        s.rlqs.rlqs = true;
        s.rlqs.rlqs_reporting_interval = Duration::from_secs(1);
        s.rlqs.rlqs_push_interval = Duration::ZERO;
    })
    .await
}

/// As `server`, with pushes every 100 ms.
async fn pushing_server() -> TestServer {
    TestServer::start_with(&[("edge.yaml", RULES)], |s| {
        s.rlqs.rlqs = true;
        s.rlqs.rlqs_reporting_interval = Duration::from_secs(1);
        s.rlqs.rlqs_push_interval = Duration::from_millis(100);
    })
    .await
}

#[tokio::test]
async fn a_bucket_gets_a_token_bucket_of_its_rules_rate() {
    let server = server().await;
    let mut gateway = Gateway::open(&server).await;
    let actions = gateway
        .report(
            "edge",
            &[
                (&[("tenant", "a")], 30, 0),
                (&[("path", "/login")], 1, 0),
                (&[("path", "/healthz")], 100, 0),
                (&[("trial", "t")], 100, 0),
                (&[("colour", "blue")], 5, 0),
            ],
        )
        .await
        .unwrap();
    let words: Vec<String> = actions.iter().map(assigned).collect();
    assert_eq!(
        words,
        [
            // 10 a second: ten tokens a second, a bucket of one second.
            "tokens 10/1s max 2 ttl 3s",
            // 6 a minute: one every 10 s.
            "tokens 1/10s max 1 ttl 3s",
            // Unlimited, shadow mode, no rule: never denied.
            "allow_all ttl 3s",
            "allow_all ttl 3s",
            "allow_all ttl 3s",
        ]
    );
    assert_eq!(actions[0].bucket_id, Some(bucket(&[("tenant", "a")])));
    // Envoy 1.40 tells token buckets apart by their interval's nanoseconds only: the interval
    // carries its seconds there too (dropped by Envoy), so a new interval is a new bucket.
    let Some(bucket_action::BucketAction::QuotaAssignmentAction(login)) = &actions[1].bucket_action
    else {
        panic!("an assignment")
    };
    let Some(Strategy::TokenBucket(b)) = login
        .rate_limit_strategy
        .as_ref()
        .and_then(|s| s.strategy.as_ref())
    else {
        panic!("a token bucket")
    };
    assert_eq!(
        b.fill_interval,
        Some(prost_types::Duration {
            seconds: 10,
            nanos: 10
        })
    );
    server.stop().await;
}

#[tokio::test]
async fn two_gateways_share_a_rule_and_never_hold_more_than_its_rate() {
    let server = server().await;
    let mut one = Gateway::open(&server).await;
    let mut two = Gateway::open(&server).await;
    let tenant: &[(&str, &str)] = &[("tenant", "shared")];
    let grant = |actions: Vec<BucketAction>| assigned(&actions[0]);
    // One alone, busy: the whole rate.
    assert_eq!(
        grant(one.report("edge", &[(tenant, 30, 0)]).await.unwrap()),
        "tokens 10/1s max 2 ttl 3s"
    );
    // Two arrives while one holds it all: nothing yet.
    assert_eq!(
        grant(two.report("edge", &[(tenant, 0, 30)]).await.unwrap()),
        "deny_all ttl 3s"
    );
    // One reports again: its fair half; then two grows into the other half.
    assert_eq!(
        grant(one.report("edge", &[(tenant, 0, 30)]).await.unwrap()),
        "tokens 5/1s max 2 ttl 3s"
    );
    assert_eq!(
        grant(two.report("edge", &[(tenant, 0, 30)]).await.unwrap()),
        "tokens 5/1s max 2 ttl 3s"
    );
    // One goes idle: its share goes to the busy one (max-min fair: nobody leaves any over).
    assert_eq!(
        grant(one.report("edge", &[(tenant, 0, 0)]).await.unwrap()),
        "deny_all ttl 3s"
    );
    assert_eq!(
        grant(two.report("edge", &[(tenant, 0, 30)]).await.unwrap()),
        "tokens 10/1s max 2 ttl 3s"
    );
    // Two stops reporting: once its grant has expired (3 s on the store's clock) and what it
    // may have admitted has left the second's window, one gets it all.
    server.clock.advance_us(3_000_001);
    assert_eq!(
        grant(one.report("edge", &[(tenant, 0, 30)]).await.unwrap()),
        "deny_all ttl 3s"
    );
    server.clock.advance_us(1_000_000);
    assert_eq!(
        grant(one.report("edge", &[(tenant, 0, 30)]).await.unwrap()),
        "tokens 10/1s max 2 ttl 3s"
    );
    server.stop().await;
}

/// Eleven gateways on 10/s, each busy: their fair parts of 0.91/s are granted as 9 tokens every
/// 10 s (0.9/s), 9.9/s together. Before, a part below one a second was one token every k s: one
/// every 2 s each, 5.5/s together.
#[tokio::test]
async fn eleven_gateways_on_ten_a_second_admit_nine_and_more_together() {
    let server = server().await;
    let tenant: &[(&str, &str)] = &[("tenant", "eleven")];
    let mut gateways = Vec::new();
    for _ in 0..11 {
        gateways.push(Gateway::open(&server).await);
    }
    let mut last = vec![String::new(); 11];
    // The first holds it all at first; each round every gateway settles into its part.
    for _ in 0..3 {
        for (g, words) in gateways.iter_mut().zip(&mut last) {
            *words = assigned(&g.report("edge", &[(tenant, 0, 30)]).await.unwrap()[0]);
        }
    }
    let total: f64 = last.iter().map(|w| tokens_per_second(w)).sum();
    assert!(total <= 10.0 + 1e-9, "{last:?}");
    assert!(total >= 9.0, "{total}/s together: {last:?}");
    server.stop().await;
}

/// The deployment's shadow mode (`--shadow-mode`, Go's SHADOW_MODE) answers every RLS call OK:
/// RLQS allows every bucket likewise (it enforced the rule's share before).
#[tokio::test]
async fn global_shadow_mode_allows_every_bucket() {
    let server = TestServer::start_with(&[("edge.yaml", RULES)], |s| {
        s.rlqs.rlqs = true;
        s.rlqs.rlqs_reporting_interval = Duration::from_secs(1);
        s.shadow_mode = true;
    })
    .await;
    let mut gateway = Gateway::open(&server).await;
    let actions = gateway
        .report("edge", &[(&[("tenant", "a")], 30, 0)])
        .await
        .unwrap();
    assert_eq!(assigned(&actions[0]), "allow_all ttl 3s");
    server.stop().await;
}

/// A second gateway arriving on a rule the first holds whole is short of its fair part: the
/// server pushes the first its smaller grant at once (within a push round), and
/// the second its grown one, instead of both waiting for their next reports (Envoy 1.40: 5 s
/// each, so 10 s before the newcomer had its part).
#[tokio::test]
async fn a_gateway_short_of_its_part_gets_it_by_pushes_within_a_second() {
    let server = pushing_server().await;
    let tenant: &[(&str, &str)] = &[("tenant", "pushed")];
    let mut first = Gateway::open(&server).await;
    let mut second = Gateway::open(&server).await;
    let grant = |actions: Vec<BucketAction>| assigned(&actions[0]);
    assert_eq!(
        grant(first.report("edge", &[(tenant, 30, 0)]).await.unwrap()),
        "tokens 10/1s max 2 ttl 3s"
    );
    assert_eq!(
        grant(second.report("edge", &[(tenant, 30, 0)]).await.unwrap()),
        "deny_all ttl 3s"
    );
    // Neither reports again: the first is pushed its half, then the second grows into it.
    let shrunk = first.pushed(Duration::from_millis(1500)).await;
    assert_eq!(
        shrunk.map(grant).as_deref(),
        Some("tokens 5/1s max 2 ttl 3s"),
        "the first is pushed its smaller grant"
    );
    let mut grown = None;
    for _ in 0..4 {
        if let Some(actions) = second.pushed(Duration::from_millis(600)).await {
            grown = Some(grant(actions));
            break;
        }
    }
    assert_eq!(grown.as_deref(), Some("tokens 5/1s max 2 ttl 3s"));
    let admin = server.running.as_ref().unwrap().admin_addr.port();
    let (_, metrics) = common::http(admin, "GET", "/metrics", "").await;
    assert!(
        metrics.contains("portcullis_rlqs_pushes_total 2"),
        "{metrics}"
    );
    server.stop().await;
}

/// A stream that ends frees what it held at once: the other gateway gets the whole rate at its
/// next report, not after the ended stream's grant has run out (a rolling update moved a stream
/// and the new one was refused everything until then).
#[tokio::test]
async fn a_stream_that_ends_frees_its_share_at_once() {
    let server = server().await;
    let admin = server.running.as_ref().unwrap().admin_addr.port();
    let tenant: &[(&str, &str)] = &[("tenant", "moved")];
    let grant = |actions: Vec<BucketAction>| assigned(&actions[0]);
    let mut old = Gateway::open(&server).await;
    assert_eq!(
        grant(old.report("edge", &[(tenant, 30, 0)]).await.unwrap()),
        "tokens 10/1s max 2 ttl 3s"
    );
    drop(old);
    await_streams(admin, 0).await;
    // No time has passed on the store's clock: only the release frees it.
    let mut new = Gateway::open(&server).await;
    assert_eq!(
        grant(new.report("edge", &[(tenant, 30, 0)]).await.unwrap()),
        "tokens 10/1s max 2 ttl 3s"
    );
    server.stop().await;
}

/// A gateway that names itself keeps its holds across a broken stream: while it reconnects,
/// another gateway cannot take them, and its next stream is the same holder (its own grant is
/// not counted against it).
#[tokio::test]
async fn a_named_gateway_keeps_its_holds_across_streams() {
    let server = server().await;
    let admin = server.running.as_ref().unwrap().admin_addr.port();
    let tenant: &[(&str, &str)] = &[("tenant", "named")];
    let grant = |actions: Vec<BucketAction>| assigned(&actions[0]);
    let mut first = Gateway::open_named(&server, "gateway-7").await;
    assert_eq!(
        grant(first.report("edge", &[(tenant, 30, 0)]).await.unwrap()),
        "tokens 10/1s max 2 ttl 3s"
    );
    drop(first);
    await_streams(admin, 0).await;
    let mut other = Gateway::open(&server).await;
    assert_eq!(
        grant(other.report("edge", &[(tenant, 30, 0)]).await.unwrap()),
        "deny_all ttl 3s"
    );
    let mut again = Gateway::open_named(&server, "gateway-7").await;
    // Its fair half now that the other asks too: from its own holder, nothing held twice.
    assert_eq!(
        grant(again.report("edge", &[(tenant, 30, 0)]).await.unwrap()),
        "tokens 5/1s max 2 ttl 3s"
    );
    server.stop().await;
}

/// Each action of an answer in words, by the bucket's `api` value.
fn by_api(actions: &[BucketAction]) -> std::collections::BTreeMap<String, String> {
    actions
        .iter()
        .map(|a| {
            let id = a.bucket_id.as_ref().expect("a bucket id");
            (id.bucket["api"].clone(), assigned(a))
        })
        .collect()
}

/// Buckets of one gateway on one shared counter (a `share_threshold` rule: every path under
/// /api/ one counter) are one holder: its one share is split among them by demand, and a new
/// bucket's arrival shrinks the others at once, in the same answer. Before, each bucket got a
/// full share: N paths, N times the rate.
#[tokio::test]
async fn buckets_on_one_shared_counter_split_one_share() {
    let server = server().await;
    let mut gateway = Gateway::open(&server).await;
    type Id<'a> = &'a [(&'a str, &'a str)];
    let (a, b, c): (Id, Id, Id) = (
        &[("api", "/api/a")],
        &[("api", "/api/b")],
        &[("api", "/api/c")],
    );
    let got = by_api(
        &gateway
            .report("edge", &[(a, 20, 40), (b, 20, 40)])
            .await
            .unwrap(),
    );
    assert_eq!(got["/api/a"], "tokens 10/1s max 2 ttl 3s");
    assert_eq!(got["/api/b"], "tokens 10/1s max 2 ttl 3s");
    // A report of one of them: its part of the one share, the other keeps its own.
    let got = by_api(&gateway.report("edge", &[(a, 10, 50)]).await.unwrap());
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got["/api/a"], "tokens 10/1s max 2 ttl 3s");
    // A third path, reported alone as Envoy reports a new bucket (at its first request): new,
    // it is taken to want the whole rate, so it gets an equal third, and the busy buckets are
    // sent their smaller thirds in the same answer.
    let got = by_api(&gateway.report("edge", &[(c, 1, 0)]).await.unwrap());
    assert_eq!(got.len(), 3, "{got:?}");
    assert_eq!(got["/api/c"], "tokens 400/60s max 2 ttl 3s");
    let total: f64 = got.values().map(|w| tokens_per_second(w)).sum();
    assert!(total <= 20.0 + 1e-9, "{got:?}");
    assert!(total >= 19.0, "the share is handed out: {got:?}");
    // Its next report says it wants one a second: it gets that, and the others grow.
    let got = by_api(&gateway.report("edge", &[(c, 1, 0)]).await.unwrap());
    assert_eq!(got["/api/c"], "tokens 1/1s max 1 ttl 3s");
    server.stop().await;
}

/// A client that is not Envoy (gRPC's RLQS clients): the domain in the first report only, a
/// report every second with `time_elapsed` to the nanosecond. Its demand is what it saw over
/// that time: 9 requests in 1 s is 9/s (read over the 5 s interval before, 1.8/s, its fair
/// share was cut to 2/s beside a busy gateway instead of 5).
#[tokio::test]
async fn a_client_reporting_every_second_to_the_nanosecond_is_read_as_it_reports() {
    use portcullis::pb::rlqs::BucketQuotaUsage;
    let server = TestServer::start_with(&[("edge.yaml", RULES)], |s| {
        s.rlqs.rlqs = true;
        // Each answer read is the one to its report.
        s.rlqs.rlqs_push_interval = Duration::ZERO;
    })
    .await;
    let tenant: &[(&str, &str)] = &[("tenant", "grpc")];
    let usage = |allowed: u64, nanos: i32| RateLimitQuotaUsageReports {
        domain: String::new(),
        bucket_quota_usages: vec![BucketQuotaUsage {
            bucket_id: Some(bucket(tenant)),
            time_elapsed: Some(prost_types::Duration { seconds: 0, nanos }),
            num_requests_allowed: allowed,
            num_requests_denied: 0,
        }],
    };
    let mut client = Gateway::open(&server).await;
    let first = RateLimitQuotaUsageReports {
        domain: "edge".into(),
        ..usage(9, 999_999_999)
    };
    let grant = |actions: Vec<BucketAction>| assigned(&actions[0]);
    assert_eq!(
        grant(client.send(first).await.unwrap()),
        "tokens 10/1s max 2 ttl 11s"
    );
    let mut busy = Gateway::open(&server).await;
    assert_eq!(
        grant(busy.report("edge", &[(tenant, 30, 0)]).await.unwrap()),
        "deny_all ttl 11s"
    );
    // 9 a second against the busy one's 30: half each (max-min fair), no domain named.
    assert_eq!(
        grant(client.send(usage(9, 999_999_999)).await.unwrap()),
        "tokens 5/1s max 2 ttl 11s"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_malformed_report_ends_its_own_stream_only() {
    let server = server().await;
    let mut good = Gateway::open(&server).await;
    good.report("edge", &[(&[("tenant", "a")], 1, 0)])
        .await
        .unwrap();
    for (domain, id, says) in [
        ("", &[("tenant", "a")][..], "must name its domain"),
        ("edge", &[("tenant", "")][..], "empty key or value"),
        ("edge", &[][..], "has 0 entries"),
    ] {
        let mut bad = Gateway::open(&server).await;
        let status = bad.report(domain, &[(id, 1, 0)]).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains(says), "{status:?}");
    }
    // A stream that changes its domain is malformed too.
    let mut switching = Gateway::open(&server).await;
    switching
        .report("edge", &[(&[("tenant", "a")], 1, 0)])
        .await
        .unwrap();
    let status = switching
        .report("other", &[(&[("tenant", "a")], 1, 0)])
        .await
        .unwrap_err();
    assert!(
        status.message().contains("one stream, one domain"),
        "{status:?}"
    );
    // The good stream goes on.
    let actions = good
        .report("", &[(&[("tenant", "a")], 1, 0)])
        .await
        .unwrap();
    assert!(assigned(&actions[0]).starts_with("tokens"), "{actions:?}");
    let metrics = server.running.as_ref().unwrap().metrics.encode();
    assert!(
        metrics.contains("portcullis_rlqs_stream_errors_total{kind=\"malformed\"} 4"),
        "{metrics}"
    );
    server.stop().await;
}

#[tokio::test]
async fn streams_buckets_and_reports_are_bounded() {
    let server = TestServer::start_with(&[("edge.yaml", RULES)], |s| {
        s.rlqs.rlqs = true;
        s.rlqs.rlqs_reporting_interval = Duration::from_secs(1);
        s.rlqs.rlqs_max_streams = 2;
        s.rlqs.rlqs_max_buckets_per_stream = 3;
        s.rlqs.rlqs_max_reports_per_second = 1_000;
    })
    .await;
    let mut one = Gateway::open(&server).await;
    one.report("edge", &[(&[("tenant", "a")], 1, 0)])
        .await
        .unwrap();
    let mut two = Gateway::open(&server).await;
    let ids: Vec<Vec<(&str, &str)>> = ["b", "c", "d"]
        .iter()
        .map(|t| vec![("tenant", *t)])
        .collect();
    let borrowed: Vec<Usage<'_>> = ids.iter().map(|id| (id.as_slice(), 1, 0)).collect();
    two.report("edge", &borrowed).await.unwrap();
    let status = two
        .report("edge", &[(&[("tenant", "e")], 1, 0)])
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("more than 3 buckets"),
        "{status:?}"
    );
    // A third stream while two are open is refused at once.
    let mut three = Gateway::open(&server).await;
    let _ = three.report("edge", &[(&[("tenant", "z")], 1, 0)]).await;
    // (two's stream ended above, so three fits; a fourth does not.)
    let addr = server.running.as_ref().unwrap().grpc_addr;
    let mut client = RateLimitQuotaServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let (_tx, outbound) = mpsc::channel::<RateLimitQuotaUsageReports>(1);
    let refused = client
        .stream_rate_limit_quotas(ReceiverStream::new(outbound))
        .await
        .unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    one.report("edge", &[(&[("tenant", "a")], 1, 0)])
        .await
        .unwrap();
    server.stop().await;
}

#[tokio::test]
async fn the_admin_listener_shows_each_stream_its_buckets_and_what_they_were_assigned() {
    let server = server().await;
    let admin = server.running.as_ref().unwrap().admin_addr.port();
    let mut gateway = Gateway::open(&server).await;
    gateway
        .report(
            "edge",
            &[(&[("tenant", "a")], 30, 0), (&[("colour", "blue")], 1, 0)],
        )
        .await
        .unwrap();
    let (status, body) = common::http(admin, "GET", "/rlqs", "").await;
    assert_eq!(status, 200, "{body}");
    let doc: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(doc["buckets"], 2, "{doc:#}");
    let buckets = doc["streams"][0]["buckets"].as_array().unwrap();
    let tenant = buckets
        .iter()
        .find(|b| b["bucket"]["tenant"] == "a")
        .expect("the tenant bucket");
    assert_eq!(tenant["rule"], "edge.tenant");
    assert_eq!(tenant["assignment"], "token_bucket 10/1s");
    let colour = buckets
        .iter()
        .find(|b| b["bucket"]["colour"] == "blue")
        .expect("the other");
    assert_eq!(colour["assignment"], "allow_all");
    assert!(colour["rule"].is_null());
    let metrics = server.running.as_ref().unwrap().metrics.encode();
    assert!(metrics.contains("portcullis_rlqs_buckets 2"), "{metrics}");
    for series in ["rlqs_rule_buckets", "rlqs_rule_streams"] {
        let line = format!("portcullis_{series}{{domain=\"edge\",rule=\"edge.tenant\"}} 1");
        assert!(metrics.contains(&line), "{line}\n{metrics}");
    }
    assert!(
        metrics.contains("portcullis_rlqs_granted_rate{domain=\"edge\",rule=\"edge.tenant\"} 10.0"),
        "{metrics}"
    );
    // The gateway goes away: its buckets leave the listing and the gauges.
    drop(gateway);
    let started = std::time::Instant::now();
    loop {
        let (_, body) = common::http(admin, "GET", "/rlqs", "").await;
        if body.contains("\"buckets\":0") {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "never forgotten: {body}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let metrics = server.running.as_ref().unwrap().metrics.encode();
    assert!(metrics.contains("portcullis_rlqs_buckets 0"), "{metrics}");
    assert!(
        metrics.contains("portcullis_rlqs_granted_rate{domain=\"edge\",rule=\"edge.tenant\"} 0.0"),
        "{metrics}"
    );
    server.stop().await;
}

/// RLS and RLQS on one descriptor share one budget: RLS calls count what the gateway's grant
/// claims of the window, so together they never pass it; RLS calls' demand shrinks the
/// gateway's next share (max-min fair), and once RLS stops asking the gateway grows back.
#[tokio::test]
async fn rls_counts_against_what_gateways_hold_and_gets_a_fair_part() {
    use portcullis::pb::rate_limit_response::Code;
    let server = server().await;
    let tenant: &[(&str, &str)] = &[("tenant", "a")];
    let call = || common::request("edge", &[tenant]);
    let mut gateway = Gateway::open(&server).await;
    let grant = |actions: Vec<BucketAction>| assigned(&actions[0]);
    // The busy gateway alone holds the whole 10 a second: nothing is left for RLS.
    assert_eq!(
        grant(gateway.report("edge", &[(tenant, 30, 0)]).await.unwrap()),
        "tokens 10/1s max 2 ttl 3s"
    );
    for _ in 0..8 {
        let answer = server.ok(call()).await;
        assert_eq!(answer.overall_code, Code::OverLimit as i32, "{answer:?}");
    }
    // Another tenant's descriptor is not held.
    let other = server
        .ok(common::request("edge", &[&[("tenant", "b")]]))
        .await;
    assert_eq!(other.statuses[0].limit_remaining, 9);
    // RLS' demand reaches the shares within a second: the gateway's next report leaves RLS a
    // part (waiting for that push, report after report, at most 5 s).
    let held = {
        let mut held = 10;
        for _ in 0..50 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let now = grant(gateway.report("edge", &[(tenant, 0, 30)]).await.unwrap());
            held = now
                .strip_prefix("tokens ")
                .and_then(|t| t.split('/').next())
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("{now}"));
            if held < 10 {
                break;
            }
        }
        held
    };
    assert!((1..10).contains(&held), "the gateway still holds {held}");
    // RLS gets exactly the rest, in the same second: together, the rate.
    let mut admitted = 0;
    for _ in 0..12 {
        if server.ok(call()).await.overall_code == Code::Ok as i32 {
            admitted += 1;
        }
    }
    assert_eq!(
        admitted + held,
        10,
        "RLS {admitted} beside a grant of {held}"
    );
    // RLS stops asking: its demand expires (3 s of the store's clock), the gateway's grant too,
    // and the gateway's next report takes the whole rate again.
    server.clock.advance_us(3_100_000);
    assert_eq!(
        grant(gateway.report("edge", &[(tenant, 0, 30)]).await.unwrap()),
        "tokens 10/1s max 2 ttl 3s"
    );
    server.stop().await;
}

/// A reload that removes a rule: its buckets are abandoned at their next report (Envoy forgets
/// them); a bucket that never met a rule stays allowed.
#[tokio::test]
async fn a_rule_removed_by_a_reload_abandons_its_buckets() {
    let server = server().await;
    let mut gateway = Gateway::open(&server).await;
    let usages: &[Usage<'_>] = &[(&[("tenant", "a")], 1, 0), (&[("colour", "red")], 1, 0)];
    let actions = gateway.report("edge", usages).await.unwrap();
    assert!(assigned(&actions[0]).starts_with("tokens"), "{actions:?}");
    let without_tenant = RULES.replace(
        "  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 10}\n",
        "",
    );
    assert_ne!(without_tenant, RULES);
    let staged = server.dir.path().join(".edge.yaml.new");
    std::fs::write(&staged, without_tenant).unwrap();
    std::fs::rename(&staged, server.dir.path().join("edge.yaml")).unwrap();
    // The reload lands within a poll (100 ms here): report until it shows (bounded).
    let started = std::time::Instant::now();
    let words = loop {
        let actions = gateway.report("edge", usages).await.unwrap();
        let words: Vec<String> = actions.iter().map(assigned).collect();
        if !words[0].starts_with("tokens") {
            break words;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "never reloaded: {words:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(words, ["abandon", "allow_all ttl 3s"]);
    // Abandoned, the bucket is forgotten: reported again, it is new and meets no rule.
    let actions = gateway.report("edge", usages).await.unwrap();
    assert_eq!(assigned(&actions[0]), "allow_all ttl 3s");
    server.stop().await;
}

/// RLQS is served on the TLS listener too (the same gRPC server as RLS).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rlqs_is_served_over_tls() {
    use common::tls::{make_ca, make_leaf};
    use tonic::transport::{Certificate, Channel, ClientTlsConfig};
    let certs = tempfile::tempdir().unwrap();
    let d = certs.path();
    make_ca(d, "ca");
    make_leaf(d, "ca", "server");
    let server = TestServer::start_with(&[("edge.yaml", RULES)], |s| {
        s.rlqs.rlqs = true;
        s.rlqs.rlqs_reporting_interval = Duration::from_secs(1);
        s.grpc_tls_cert = Some(d.join("server.crt"));
        s.grpc_tls_key = Some(d.join("server.key"));
    })
    .await;
    let port = server.running.as_ref().unwrap().grpc_addr.port();
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(
            std::fs::read(d.join("ca.crt")).unwrap(),
        ))
        .domain_name("localhost");
    let channel = Channel::from_shared(format!("https://127.0.0.1:{port}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .expect("TLS connects");
    let mut gateway = Gateway::over(channel).await;
    let actions = gateway
        .report("edge", &[(&[("tenant", "a")], 1, 0)])
        .await
        .unwrap();
    assert_eq!(assigned(&actions[0]), "tokens 10/1s max 2 ttl 3s");
    server.stop().await;
}

/// A gateway whose share grows a little keeps the token bucket Envoy has (no full bucket let
/// through for one token more); a larger change is sent.
#[tokio::test]
async fn a_share_that_grows_a_little_keeps_the_gateways_bucket() {
    let server = server().await;
    let mut one = Gateway::open(&server).await;
    let mut two = Gateway::open(&server).await;
    let tenant: &[(&str, &str)] = &[("tenant", "t")];
    let grant = |actions: Vec<BucketAction>| assigned(&actions[0]);
    assert_eq!(
        grant(one.report("edge", &[(tenant, 30, 0)]).await.unwrap()),
        "tokens 10/1s max 2 ttl 3s"
    );
    // The second asks for one a second (its first report, new, is taken to want it all): the
    // first shrinks to nine, the second gets one.
    for _ in 0..2 {
        assert_eq!(
            grant(two.report("edge", &[(tenant, 1, 0)]).await.unwrap()),
            "deny_all ttl 3s"
        );
    }
    assert_eq!(
        grant(one.report("edge", &[(tenant, 0, 30)]).await.unwrap()),
        "tokens 9/1s max 2 ttl 3s"
    );
    assert_eq!(
        grant(two.report("edge", &[(tenant, 0, 1)]).await.unwrap()),
        "tokens 1/1s max 1 ttl 3s"
    );
    // The second goes away: the first's share grows back to ten, within a tenth: it keeps nine.
    server.clock.advance_us(3_000_001);
    assert_eq!(
        grant(one.report("edge", &[(tenant, 0, 30)]).await.unwrap()),
        "tokens 9/1s max 2 ttl 3s"
    );
    server.stop().await;
}

/// A report past `--max-message-bytes` ends its stream with OUT_OF_RANGE, and is counted.
/// Bucket ids cost memory by their bytes, not their count: one stream past its bytes is closed,
/// and the replica's streams together hold at most their bound (a closed stream's bytes are
/// free again).
#[tokio::test]
async fn bucket_bytes_are_bounded_per_stream_and_in_all() {
    let server = TestServer::start_with(&[("edge.yaml", RULES)], |s| {
        s.rlqs.rlqs = true;
        s.rlqs.rlqs_push_interval = Duration::ZERO;
        s.rlqs.rlqs_max_bucket_bytes_per_stream = 100;
        s.rlqs.rlqs_max_bucket_bytes = 150;
    })
    .await;
    let admin = server.running.as_ref().unwrap().admin_addr.port();
    // Each id: "tenant" and 40 bytes, 46 in all.
    let names: Vec<String> = (0..4).map(|i| format!("{i}").repeat(40)).collect();
    let id = |i: usize| vec![("tenant", names[i].as_str())];
    let ids: Vec<Vec<(&str, &str)>> = (0..4).map(id).collect();
    let mut one = Gateway::open(&server).await;
    one.report("edge", &[(&ids[0], 1, 0), (&ids[1], 1, 0)])
        .await
        .unwrap();
    // A third id on the same stream: 138 bytes, past its 100.
    let status = one.report("edge", &[(&ids[2], 1, 0)]).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("100 bytes"), "{status:?}");
    await_streams(admin, 0).await;
    // Its bytes are free again: two streams of 92 and 46 fit in 150, a third id does not.
    let mut two = Gateway::open(&server).await;
    two.report("edge", &[(&ids[0], 1, 0), (&ids[1], 1, 0)])
        .await
        .unwrap();
    let mut three = Gateway::open(&server).await;
    three.report("edge", &[(&ids[2], 1, 0)]).await.unwrap();
    let status = three.report("edge", &[(&ids[3], 1, 0)]).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("150 bytes"), "{status:?}");
    server.stop().await;
}

/// A report is bounded by what the stream's bucket bounds let it hold (Envoy sends every bucket
/// in each report), not by RLS' --max-message-bytes: 20 buckets of 1 KB pass a 16 KiB RLS
/// bound, and a report past the bucket bounds' size is refused.
#[tokio::test]
async fn a_report_past_the_message_bound_is_refused() {
    let server = TestServer::start_with(&[("edge.yaml", RULES)], |s| {
        s.rlqs.rlqs = true;
        s.max_message_bytes = 16 * 1024;
        // 24 KiB of ids + 128 B for each of 20 buckets + 64 KiB: about 90 KiB a report.
        s.rlqs.rlqs_max_bucket_bytes_per_stream = 24 * 1024;
        s.rlqs.rlqs_max_buckets_per_stream = 20;
    })
    .await;
    let mut gateway = Gateway::open(&server).await;
    let value = "v".repeat(1000);
    let names: Vec<String> = (0..20).map(|i| format!("{i:02}{value}")).collect();
    let ids: Vec<Vec<(&str, &str)>> = names.iter().map(|v| vec![("tenant", v.as_str())]).collect();
    let usages: Vec<Usage<'_>> = ids.iter().map(|id| (id.as_slice(), 1, 0)).collect();
    assert_eq!(gateway.report("edge", &usages).await.unwrap().len(), 20);
    let mut gateway = Gateway::open(&server).await;
    let value = "v".repeat(100_000);
    let big: &[(&str, &str)] = &[("tenant", value.as_str())];
    let status = gateway.report("edge", &[(big, 1, 0)]).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::OutOfRange, "{status:?}");
    let metrics = server.running.as_ref().unwrap().metrics.encode();
    assert!(
        metrics.contains("portcullis_rlqs_stream_errors_total{kind=\"too_large\"} 1"),
        "{metrics}"
    );
    server.stop().await;
}

/// Past `--rlqs-max-reports-per-second`, a stream's next report waits for the next second (Envoy
/// reports each new bucket at once: a burst of new buckets is paced, not refused), and the stream
/// goes on.
#[tokio::test]
async fn reports_past_the_rate_are_paced_not_refused() {
    let server = TestServer::start_with(&[("edge.yaml", RULES)], |s| {
        s.rlqs.rlqs = true;
        s.rlqs.rlqs_max_reports_per_second = 2;
    })
    .await;
    let mut gateway = Gateway::open(&server).await;
    let started = std::time::Instant::now();
    for tenant in ["a", "b", "c", "d"] {
        let actions = gateway
            .report("edge", &[(&[("tenant", tenant)], 1, 0)])
            .await
            .unwrap();
        assert!(assigned(&actions[0]).starts_with("tokens"), "{actions:?}");
    }
    // Two in the first second, two in the next: the third waited for it.
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
    let metrics = server.running.as_ref().unwrap().metrics.encode();
    assert!(
        metrics.contains("portcullis_rlqs_reports_paced_total 1"),
        "{metrics}"
    );
    assert!(metrics.contains("portcullis_rlqs_streams 1"), "{metrics}");
    server.stop().await;
}

/// A concurrency limit has no rate to share: a bucket meeting one alone is not denied for it, and
/// a layered rule's rate layer binds as if the concurrency layer were not there (before, the
/// slots over the lease were read as a rate: 2 slots a minute granted one token every 30 s).
#[tokio::test]
async fn a_concurrency_limit_is_left_out_of_rlqs_shares() {
    const SLOTS: &str = "domain: cc
descriptors:
  - key: user
    rate_limit: {algorithm: concurrency, requests_per_unit: 2, unit: minute}
  - key: team
    rate_limits:
      - {algorithm: concurrency, requests_per_unit: 2, unit: minute}
      - {unit: second, requests_per_unit: 10}
";
    let server = TestServer::start_with(&[("cc.yaml", SLOTS)], |s| {
        s.rlqs.rlqs = true;
        s.rlqs.rlqs_reporting_interval = Duration::from_secs(1);
    })
    .await;
    let mut gateway = Gateway::open(&server).await;
    let actions = gateway
        .report(
            "cc",
            &[(&[("user", "u")], 30, 0), (&[("team", "t")], 30, 0)],
        )
        .await
        .unwrap();
    let words: Vec<String> = actions.iter().map(assigned).collect();
    assert_eq!(words, ["allow_all ttl 3s", "tokens 10/1s max 2 ttl 3s"]);
    server.stop().await;
}

/// One replica's streams hold at most a quarter of a descriptor's holder slots (256 of 1,024), so
/// that they never take them all from the gateways of other replicas: the 257th stream on one
/// descriptor is denied (and counted) until one of the others leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replicas_streams_hold_at_most_a_quarter_of_a_descriptors_slots() {
    let server = server().await;
    let admin = server.running.as_ref().unwrap().admin_addr.port();
    let refused = || {
        let metrics = server.running.as_ref().unwrap().metrics.encode();
        let line = metrics
            .lines()
            .find(|l| l.starts_with("portcullis_rlqs_holds_refused_total "))
            .map(str::to_owned);
        line.and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no refusal counter: {metrics}"))
    };
    let tenant: &[(&str, &str)] = &[("tenant", "crowded")];
    let mut gateways = Vec::new();
    for _ in 0..256 {
        let mut gateway = Gateway::open(&server).await;
        gateway.report("edge", &[(tenant, 1, 0)]).await.unwrap();
        gateways.push(gateway);
    }
    assert_eq!(refused(), 0);
    let mut late = Gateway::open(&server).await;
    let actions = late.report("edge", &[(tenant, 1, 0)]).await.unwrap();
    assert_eq!(assigned(&actions[0]), "deny_all ttl 3s");
    assert_eq!(refused(), 1);
    // Another descriptor is not crowded: its hold is asked of the store.
    let other: &[(&str, &str)] = &[("tenant", "quiet")];
    let actions = late.report("edge", &[(other, 1, 0)]).await.unwrap();
    assert!(
        actions.iter().any(|a| assigned(a).starts_with("tokens")),
        "{actions:?}"
    );
    assert_eq!(refused(), 1);
    // One stream leaves: the late one holds its slot at its next report.
    drop(gateways.pop());
    await_streams(admin, 256).await;
    late.report("edge", &[(tenant, 1, 0)]).await.unwrap();
    assert_eq!(refused(), 1);
    drop(gateways);
    drop(late);
    server.stop().await;
}
