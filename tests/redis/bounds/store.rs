//! Bounds of the store: the memory store full at its cap and never admitting twice past a limit,
//! all or nothing with a blocked descriptor on Redis.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_new_descriptors_fills_the_memory_store_to_its_cap_and_no_further() {
    // At most 256 counters in the whole store.
    let server = TestServer::start_with(&[("b.yaml", RULES)], |s| {
        s.memory_max_counters = 256;
    })
    .await;
    for i in 0..2_000 {
        let call = RateLimitRequest {
            domain: "b".into(),
            descriptors: vec![descriptor(&[("tenant", &format!("t{i}"))])],
            hits_addend: 0,
        };
        // The default failure mode allows; the store's refusal shows in the metrics.
        server.ok(call).await;
    }
    let metrics = metrics_text(&server).await;
    let refused = sample(
        &metrics,
        "portcullis_store_errors_total{kind=\"unavailable\"}",
    ) as u64;
    assert!(
        refused >= 2_000 - 256,
        "every descriptor past the cap is answered by the failure mode: {refused}"
    );
    assert!(
        sample(
            &metrics,
            "portcullis_failure_mode_answers_total{mode=\"allow\"}"
        ) >= refused as f64
    );
    server.stop().await;
}

/// A full memory store never admits a descriptor twice past its limit (found black box: with a
/// cap of 50 and `--failure-mode deny`, 80 users once then the first 50 again admitted users 8,
/// 13, 26, ... twice in the hour). The cap is the store's, not split over shards, and a new
/// descriptor that finds it full is answered by `--failure-mode`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_memory_store_never_admits_a_descriptor_twice_past_its_limit() {
    use common::process::ServeProcess;
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        dir.path().join("u.yaml"),
        "domain: u\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
    )
    .expect("rules");
    let server = ServeProcess::spawn(
        dir.path(),
        &["--memory-max-counters", "50", "--failure-mode", "deny"],
        &[],
        &[],
    );
    let mut client = portcullis::pb::RateLimitServiceClient::connect(server.grpc_url())
        .await
        .expect("connect");
    let mut admitted = vec![0u32; 80];
    for pass in [0..80, 0..50] {
        for user in pass {
            let call = common::request("u", &[&[("user", &format!("u{user}"))]]);
            let r = client.should_rate_limit(call).await.expect("answered");
            if r.into_inner().overall_code == 1 {
                admitted[user] += 1;
            }
        }
    }
    let twice: Vec<usize> = (0..80).filter(|&u| admitted[u] > 1).collect();
    assert!(twice.is_empty(), "admitted twice in the hour: {twice:?}");
    // The store holds 50 counters, not fewer: the first 50 users were counted.
    assert_eq!(admitted[..50].iter().sum::<u32>(), 50, "{admitted:?}");
    // And the 30 that found it full were refused, as --failure-mode deny says.
    assert_eq!(admitted[50..].iter().sum::<u32>(), 0, "{admitted:?}");
    // The operator sees it coming: the fill ratio gauge (deploy/prometheus alerts past 0.8).
    let (_, metrics) = common::http(server.admin_port, "GET", "/metrics", "").await;
    assert_eq!(
        common::sample(&metrics, "portcullis_memory_store_fill_ratio"),
        1.0,
        "{metrics}"
    );
}

/// All or nothing holds with a blocked descriptor on Redis (found black box: with
/// `--stop-charging-when-over`, a call refused by a `requests_per_unit: 0` descriptor still
/// charged its 5-a-minute one, so five calls on that one alone gave OK, OK, OK, OK, OVER_LIMIT).
/// The memory store charged nothing; the two now agree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_or_nothing_with_a_blocked_descriptor_charges_nothing_on_redis() {
    use common::process::ServeProcess;
    let redis = common::redis::RedisServer::start();
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        dir.path().join("a.yaml"),
        "domain: a\ndescriptors:\n  - key: blocked\n    rate_limit: {unit: minute, requests_per_unit: 0}\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n",
    )
    .expect("rules");
    for store in [
        vec![],
        vec!["--store", "redis", "--redis-url", &redis.url()],
    ] {
        // A deadline a loaded machine meets: past the default, the failure mode (allow)
        // answered OK where the count said OVER_LIMIT (seen under two busy loops).
        let mut args = vec!["--stop-charging-when-over", "--store-timeout", "2s"];
        args.extend(store.iter().copied());
        let server = ServeProcess::spawn(dir.path(), &args, &[], &[]);
        let mut client = portcullis::pb::RateLimitServiceClient::connect(server.grpc_url())
            .await
            .expect("connect");
        let both = common::request("a", &[&[("blocked", "x")], &[("user", "u")]]);
        let r = client.should_rate_limit(both).await.expect("answered");
        assert_eq!(
            r.into_inner().overall_code,
            2,
            "refused by the blocked descriptor"
        );
        let mut codes = Vec::new();
        for _ in 0..6 {
            let alone = common::request("a", &[&[("user", "u")]]);
            let r = client.should_rate_limit(alone).await.expect("answered");
            codes.push(r.into_inner().overall_code);
        }
        assert_eq!(
            codes,
            vec![1, 1, 1, 1, 1, 2],
            "{store:?}: the refused call charged nothing"
        );
    }
}
