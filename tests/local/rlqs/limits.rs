//! What a stream may send: a malformed report, streams, buckets and bytes bounded, the message
//! bound, the report rate paced.

use super::*;

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
    // Two's stream ended with its error: its place is free at once, and a third stream fits
    // beside one (a limit that never freed an errored stream would refuse it here).
    let mut three = Gateway::open(&server).await;
    let actions = three
        .report("edge", &[(&[("tenant", "z")], 1, 0)])
        .await
        .expect("a stream in the place the errored one freed");
    assert_eq!(actions.len(), 1, "{actions:?}");
    // With one and three open, a fourth is refused at once.
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
