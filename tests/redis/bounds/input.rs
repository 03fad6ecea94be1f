//! Bounds on what requests bring: distinct values keep metrics within a fixed size, over-long
//! keys and values refused naming the field, /json off unless enabled, requests larger than
//! Envoy's refused.

use super::*;

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

#[tokio::test]
async fn json_calls_spend_budget_so_they_are_off_unless_enabled() {
    let server = TestServer::start(&[("b.yaml", RULES)]).await;
    let addr = server.running.as_ref().unwrap().admin_addr;
    let body = r#"{"domain":"b","descriptors":[{"entries":[{"key":"user","value":"j"}]}]}"#;
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "POST /json HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    assert!(raw.starts_with("HTTP/1.1 404"), "{raw}");
    server.stop().await;
}

#[tokio::test]
async fn requests_larger_than_a_real_envoy_request_needs_are_refused() {
    let server = TestServer::start(&[("b.yaml", RULES)]).await;
    // 400 descriptors with 200-byte values: about 90 KiB, above the 64 KiB default.
    let value = "v".repeat(200);
    let big = RateLimitRequest {
        domain: "b".into(),
        descriptors: (0..400).map(|_| descriptor(&[("user", &value)])).collect(),
        hits_addend: 0,
    };
    let status = server.call(big).await.expect_err("refused");
    assert!(
        matches!(
            status.code(),
            tonic::Code::OutOfRange | tonic::Code::ResourceExhausted
        ),
        "{status:?}"
    );
    // The refused request counted nothing.
    let r = server
        .ok(RateLimitRequest {
            domain: "b".into(),
            descriptors: vec![descriptor(&[("user", &value)])],
            hits_addend: 0,
        })
        .await;
    assert_eq!(r.statuses[0].limit_remaining, 9);
    server.stop().await;
}
