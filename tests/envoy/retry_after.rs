//! What a client is told to wait, through Envoy 1.40's own `Retry-After`
//! (`enable_retry_after_header`: the largest `duration_until_reset` of the over-limit statuses),
//! per algorithm, on a rule of 10 a minute: a token bucket says when the next token comes, a
//! sliding window when enough of its hits have left, a fixed window when it ends
//! (docs/algorithms.md). It said when the whole quota was back: 60 s for the bucket, ~60 s for
//! the sliding window.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::common::envoy::{self, Gateway};
use crate::common::process::ServeProcess;

const RULES: &str = "domain: retry
descriptors:
  - key: key
    value: bucket
    rate_limit: {algorithm: token_bucket, unit: minute, requests_per_unit: 10, burst: 10}
  - key: key
    value: fixed
    rate_limit: {algorithm: fixed_window, unit: minute, requests_per_unit: 10}
  - key: key
    value: sliding
    rate_limit: {algorithm: sliding_window, unit: minute, requests_per_unit: 10}
";

const FILTER: &str = r#"- name: envoy.filters.http.ratelimit
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
    domain: retry
    timeout: 1s
    failure_mode_deny: false
    enable_x_ratelimit_headers: DRAFT_VERSION_03
    enable_retry_after_header: true
    rate_limit_service:
      transport_api_version: V3
      grpc_service: {envoy_grpc: {cluster_name: portcullis}}
"#;

/// `n` requests for `key`, their statuses.
async fn send(g: &Gateway, key: &str, n: usize) -> Vec<envoy::Response> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(envoy::get(g.ingress_addr(), None, "/", &[("x-key", key)]).await);
    }
    out
}

fn retry_after(r: &envoy::Response) -> u64 {
    r.header("retry-after")
        .unwrap_or_else(|| panic!("no Retry-After on {} {:?}", r.status, r.headers))
        .parse()
        .expect("delay-seconds")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_says_when_the_refused_request_would_pass_per_algorithm() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("retry.yaml"), RULES).expect("rules");
    let portcullis = ServeProcess::spawn(dir.path(), &["--store-timeout", "500ms"], &[], &[]);
    let mut g = Gateway::new("retry", &[portcullis.grpc_port]);
    g.http_filters = FILTER.into();
    g.route_rate_limits =
        "- actions: [{request_headers: {header_name: x-key, descriptor_key: key}}]".into();
    let _envoy = g.start();

    // Token bucket: spent by 10, the 11th waits for one token (6 s), not a full bucket (60 s).
    let answers = send(&g, "bucket", 11).await;
    assert!(answers[..10].iter().all(|r| r.status == 200));
    assert_eq!(answers[10].status, 429);
    let wait = retry_after(&answers[10]);
    assert!((5..=6).contains(&wait), "token bucket: Retry-After {wait}");

    // Sliding window: 3 hits, 5 s later 7 more; the 11th passes once the first 3 have left the
    // window (about 55 s on), not when all 10 have (60 s on).
    let first = Instant::now();
    assert!(send(&g, "sliding", 3).await.iter().all(|r| r.status == 200));
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(send(&g, "sliding", 7).await.iter().all(|r| r.status == 200));
    let refused = send(&g, "sliding", 1).await.remove(0);
    let since_first = first.elapsed().as_secs();
    assert_eq!(refused.status, 429);
    let wait = retry_after(&refused);
    // Sub-windows of a second and rounding up: at most a second and a sub-window past the
    // first hits' minute.
    assert!(
        wait <= 62 - since_first && wait >= 50 - since_first.min(50),
        "sliding window: Retry-After {wait}, {since_first} s after the first hits"
    );

    // Fixed window: until the window's end (clear of the minute's edge, so that the 10 and the
    // 11th fall in one window).
    let in_minute = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
        % 60;
    if in_minute > 50 {
        tokio::time::sleep(Duration::from_secs(61 - in_minute)).await;
    }
    let answers = send(&g, "fixed", 11).await;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(answers[..10].iter().all(|r| r.status == 200));
    assert_eq!(answers[10].status, 429);
    let wait = retry_after(&answers[10]);
    let to_end = 60.0 - now % 60.0;
    assert!(
        (wait as f64 - to_end).abs() <= 1.5,
        "fixed window: Retry-After {wait}, the window ends in {to_end:.1} s"
    );
}
