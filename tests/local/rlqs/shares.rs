//! What a report is granted: a token bucket of the rule's rate, fair shares among gateways and
//! with RLS, buckets on one shared counter as one holder, shadow mode, a client that is not Envoy.

use super::*;

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
