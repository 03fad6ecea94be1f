//! Every resource fed by requests has a bound: metric series, string lengths, message sizes, calls
//! in flight. Each test sends what a hostile or buggy client would and checks the bound holds and
//! says so.

mod common;

use common::{TestServer, descriptor};
use portcullis::pb::RateLimitRequest;
use portcullis::pb::RateLimitUnit;
use portcullis::pb::rate_limit_descriptor::RateLimitOverride;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn metrics_text(server: &TestServer) -> String {
    let addr = server.running.as_ref().unwrap().admin_addr;
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let request = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    raw.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default()
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

const RULES: &str = r#"
domain: b
descriptors:
  - key: tenant
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 10}
"#;

/// `count` descriptors in calls of 500, the `i`-th built by `make(i)`.
async fn send_many(
    server: &TestServer,
    count: usize,
    make: impl Fn(usize) -> portcullis::pb::RateLimitDescriptor,
) {
    let mut i = 0;
    while i < count {
        let end = (i + 500).min(count);
        let request = RateLimitRequest {
            domain: "b".into(),
            descriptors: (i..end).map(&make).collect(),
            hits_addend: 0,
        };
        server.ok(request).await;
        i = end;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_thousand_distinct_values_leave_metrics_within_a_fixed_size() {
    let server = TestServer::start_with(&[("b.yaml", RULES)], |s| {
        s.max_detailed_series = 100;
    })
    .await;
    // Request-carried limits: the label is built from the keys only.
    send_many(&server, 100_000, |i| {
        let value = format!("client-{i}");
        let mut d = descriptor(&[("user", &value)]);
        d.limit = Some(RateLimitOverride {
            requests_per_unit: 5,
            unit: RateLimitUnit::Minute as i32,
        });
        d
    })
    .await;
    // detailed_metric: one series per value up to the cap, then folded into the rule's own.
    send_many(&server, 100_000, |i| {
        descriptor(&[("tenant", &format!("t{i}"))])
    })
    .await;
    let m = metrics_text(&server).await;
    assert!(
        m.len() < 64 * 1024,
        "/metrics grew to {} bytes with request values",
        m.len()
    );
    assert!(!m.contains("client-"), "no override value in any label");
    assert_eq!(
        sample(
            &m,
            r#"portcullis_rule_hits_total{domain="b",rule="b.user"}"#
        ),
        100_000.0,
        "overrides count under the keys-only label"
    );
    let detailed = m
        .lines()
        .filter(|l| l.starts_with("portcullis_rule_hits_total{domain=\"b\",rule=\"b.tenant_"))
        .count();
    assert_eq!(detailed, 100, "exactly the cap of per-value series");
    assert_eq!(
        sample(
            &m,
            r#"portcullis_rule_hits_total{domain="b",rule="b.tenant"}"#
        ),
        99_900.0,
        "hits beyond the cap count under the rule's own label"
    );
    assert_eq!(
        sample(&m, "portcullis_detailed_series_folded_total"),
        99_900.0
    );
    server.stop().await;
}

#[tokio::test]
async fn domain_keys_and_values_longer_than_the_cap_are_refused_naming_the_field() {
    let server = TestServer::start_with(&[("b.yaml", RULES)], |s| {
        s.max_string_bytes = 1024;
    })
    .await;
    let long = "x".repeat(1025);
    let fits = "y".repeat(1024);
    let cases = [
        (
            RateLimitRequest {
                domain: long.clone(),
                descriptors: vec![descriptor(&[("user", "u")])],
                hits_addend: 0,
            },
            "domain",
        ),
        (
            RateLimitRequest {
                domain: "b".into(),
                descriptors: vec![descriptor(&[("user", "u")]), descriptor(&[(&long, "u")])],
                hits_addend: 0,
            },
            "descriptors[1].entries[0].key",
        ),
        (
            RateLimitRequest {
                domain: "b".into(),
                descriptors: vec![descriptor(&[("user", "u"), ("user", &long)])],
                hits_addend: 0,
            },
            "descriptors[0].entries[1].value",
        ),
    ];
    for (request, field) in cases {
        let status = server.call(request).await.expect_err("refused");
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(
            status.message().starts_with(field) && status.message().contains("1024"),
            "{field}: {}",
            status.message()
        );
    }
    // Exactly the cap is accepted, and the refused calls spent nothing.
    let r = server
        .ok(RateLimitRequest {
            domain: "b".into(),
            descriptors: vec![descriptor(&[("user", &fits)])],
            hits_addend: 0,
        })
        .await;
    assert_eq!(r.statuses[0].limit_remaining, 9);
    let r = server
        .ok(RateLimitRequest {
            domain: "b".into(),
            descriptors: vec![descriptor(&[("user", "u")])],
            hits_addend: 0,
        })
        .await;
    assert_eq!(
        r.statuses[0].limit_remaining, 9,
        "refused calls counted nothing"
    );
    server.stop().await;
}
