//! What an operator sees: exact metrics after known traffic, and traces sent to an OTLP collector
//! under Envoy's traceparent.

use crate::common;

use std::time::{Duration, Instant};

use crate::common::process::ServeProcess;
use crate::common::{TestServer, request};
use portcullis::pb::rate_limit_response::Code;

const OK: i32 = Code::Ok as i32;

use crate::common::http_at as http;

use crate::common::admin_addr as admin;

use crate::common::sample;

/// What docs/operating.md tells operators to watch stay flat exists at zero on a healthy replica
/// before anything happened (`portcullis_store_errors_total` and
/// `portcullis_rules_reloads_total{result="error"}` had no series until their first increment).
#[tokio::test]
async fn the_counters_to_watch_exist_at_zero_from_the_start() {
    let server = TestServer::start(&[("m.yaml", common::OPERATIONS_RULES)]).await;
    let (status, m) = http(admin(&server), "GET", "/metrics", "").await;
    assert_eq!(status, 200);
    for series in [
        r#"portcullis_store_errors_total{kind="timeout"} 0"#,
        r#"portcullis_store_errors_total{kind="unavailable"} 0"#,
        r#"portcullis_store_errors_total{kind="permanent"} 0"#,
        r#"portcullis_store_errors_total{kind="protocol"} 0"#,
        r#"portcullis_failure_mode_answers_total{mode="allow"} 0"#,
        r#"portcullis_rules_reloads_total{result="error"} 0"#,
        r#"portcullis_rules_reloads_total{result="refused"} 0"#,
        r#"portcullis_scaling_reloads_total{result="error"} 0"#,
        r#"portcullis_store_late_charges_total{result="lost"} 0"#,
        r#"portcullis_accept_errors_total{listener="grpc"} 0"#,
        r#"portcullis_rlqs_stream_errors_total{kind="transport"} 0"#,
        r#"portcullis_rlqs_assignments_total{kind="deny_all"} 0"#,
    ] {
        assert!(m.lines().any(|l| l == series), "{series} missing:\n{m}");
    }
    // The first load is counted, as the docs say.
    assert!(
        m.lines()
            .any(|l| l == r#"portcullis_rules_reloads_total{result="success"} 1"#),
        "{m}"
    );
    server.stop().await;
}

#[tokio::test]
async fn metrics_count_exactly_the_traffic_sent() {
    let server = TestServer::start(&[("m.yaml", common::OPERATIONS_RULES)]).await;
    // user: 4 allowed (the 4th ends above 80% of the limit), 2 refused.
    for _ in 0..6 {
        server.ok(request("m", &[&[("user", "u1")]])).await;
    }
    // trial (shadow): 1 allowed, 2 over the limit but answered OK.
    for _ in 0..3 {
        assert_eq!(
            server
                .ok(request("m", &[&[("trial", "t")]]))
                .await
                .overall_code,
            OK
        );
    }
    // detailed_metric: the value is in the label; a wildcard rule keeps its configured name.
    server.ok(request("m", &[&[("tenant", "acme")]])).await;
    server.ok(request("m", &[&[("tenant", "globex")]])).await;
    server
        .ok(request(
            "m",
            &[&[("path", "/api/a")], &[("path", "/api/b")]],
        ))
        .await;
    // Unlimited rules are not counted per rule, like the Go service (it counts limited rules only).
    server.ok(request("m", &[&[("free", "x")]])).await;
    // Unknown domains: one counter, not one per domain string.
    server.ok(request("nope-1", &[&[("user", "u")]])).await;
    server.ok(request("nope-2", &[&[("user", "u")]])).await;
    // A refused request.
    server
        .call(request("", &[&[("user", "u")]]))
        .await
        .expect_err("invalid");

    let (status, m) = http(admin(&server), "GET", "/metrics", "").await;
    assert_eq!(status, 200);
    let user = r#"{domain="m",rule="m.user"}"#;
    assert_eq!(
        sample(&m, &format!("portcullis_rule_hits_total{user}")),
        6.0,
        "{m}"
    );
    assert_eq!(
        sample(&m, &format!("portcullis_rule_within_limit_total{user}")),
        4.0
    );
    assert_eq!(
        sample(&m, &format!("portcullis_rule_near_limit_total{user}")),
        1.0
    );
    assert_eq!(
        sample(&m, &format!("portcullis_rule_over_limit_total{user}")),
        2.0
    );
    let trial = r#"{domain="m",rule="m.trial"}"#;
    assert_eq!(
        sample(&m, &format!("portcullis_rule_hits_total{trial}")),
        3.0
    );
    assert_eq!(
        sample(&m, &format!("portcullis_rule_over_limit_total{trial}")),
        2.0
    );
    assert_eq!(
        sample(&m, &format!("portcullis_rule_shadow_mode_total{trial}")),
        2.0
    );
    assert_eq!(
        sample(
            &m,
            r#"portcullis_rule_hits_total{domain="m",rule="m.tenant_acme"}"#
        ),
        1.0
    );
    assert_eq!(
        sample(
            &m,
            r#"portcullis_rule_hits_total{domain="m",rule="m.tenant_globex"}"#
        ),
        1.0
    );
    assert_eq!(
        sample(
            &m,
            r#"portcullis_rule_hits_total{domain="m",rule="m.path_/api/*"}"#
        ),
        2.0
    );
    assert!(
        !m.contains("/api/a"),
        "no raw request values without detailed_metric"
    );
    assert!(!m.contains("m.free"), "unlimited rules have no series: {m}");
    assert_eq!(sample(&m, "portcullis_unknown_domain_total"), 2.0);
    assert_eq!(
        sample(&m, r#"portcullis_grpc_calls_total{code="Ok"}"#),
        15.0
    );
    assert_eq!(
        sample(&m, r#"portcullis_grpc_calls_total{code="InvalidArgument"}"#),
        1.0
    );
    assert_eq!(
        sample(&m, "portcullis_grpc_call_duration_seconds_count"),
        16.0
    );
    assert!(sample(&m, "portcullis_rules_loaded_timestamp_seconds") > 1.7e9);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traces_go_to_the_otlp_collector_under_envoys_traceparent() {
    let (collector, collector_addr, stop_collector) = otlp::start().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("m.yaml"), common::OPERATIONS_RULES).unwrap();
    let envs = [
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://{collector_addr}"),
        ),
        ("OTEL_BSP_SCHEDULE_DELAY", "100".to_owned()),
    ];
    let mut server = ServeProcess::spawn(dir.path(), &["--drain-period", "0ms"], &envs, &[]);
    let mut client = portcullis::pb::RateLimitServiceClient::connect(server.grpc_url())
        .await
        .expect("connect");
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent_id = "00f067aa0ba902b7";
    let mut call = tonic::Request::new(request("m", &[&[("user", "traced")]]));
    call.metadata_mut().insert(
        "traceparent",
        format!("00-{trace_id}-{parent_id}-01").parse().unwrap(),
    );
    client.should_rate_limit(call).await.unwrap();

    let start = Instant::now();
    let span = loop {
        let found = collector
            .spans
            .lock()
            .unwrap()
            .iter()
            .find(|s| s.name == "should_rate_limit")
            .cloned();
        if let Some(span) = found {
            break span;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no span reached the collector"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
    assert_eq!(
        hex(&span.trace_id),
        trace_id,
        "the span joins Envoy's trace"
    );
    assert_eq!(
        hex(&span.parent_span_id),
        parent_id,
        "Envoy's span is its parent"
    );
    let attribute = |key: &str| {
        span.attributes
            .iter()
            .find(|a| a.key == key)
            .and_then(|a| a.value.clone())
            .map(|v| format!("{:?}", v.value))
    };
    assert!(
        attribute("domain").is_some_and(|v| v.contains("\"m\"")),
        "{:?}",
        span.attributes
    );
    assert!(
        attribute("overall_code").is_some_and(|v| v.contains("OK")),
        "{:?}",
        span.attributes
    );
    server.signal("TERM");
    let _ = server.child.wait();
    let _ = stop_collector.send(());
}

/// `OTEL_TRACES_SAMPLER` applies as the OpenTelemetry SDKs read it: `always_off` exports nothing,
/// even under Envoy's sampled parent; `parentbased_always_off` follows that parent. Each server is
/// stopped (which flushes its exporter) before the collector is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standard_sampler_variable_applies() {
    for (sampler, spans_expected) in [("always_off", false), ("parentbased_always_off", true)] {
        let (collector, collector_addr, stop_collector) = otlp::start().await;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("m.yaml"), common::OPERATIONS_RULES).unwrap();
        let envs = [
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                format!("http://{collector_addr}"),
            ),
            ("OTEL_TRACES_SAMPLER", sampler.to_owned()),
        ];
        let mut server = ServeProcess::spawn(dir.path(), &["--drain-period", "0ms"], &envs, &[]);
        let mut client = portcullis::pb::RateLimitServiceClient::connect(server.grpc_url())
            .await
            .expect("connect");
        let mut call = tonic::Request::new(request("m", &[&[("user", "sampled")]]));
        call.metadata_mut().insert(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
                .parse()
                .unwrap(),
        );
        client.should_rate_limit(call).await.unwrap();
        server.signal("TERM");
        assert!(server.child.wait().unwrap().success());
        let exported = collector
            .spans
            .lock()
            .unwrap()
            .iter()
            .any(|s| s.name == "should_rate_limit");
        assert_eq!(exported, spans_expected, "OTEL_TRACES_SAMPLER={sampler}");
        let _ = stop_collector.send(());
    }
}

mod otlp {
    use std::sync::{Arc, Mutex};

    use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
        TraceService, TraceServiceServer,
    };
    use opentelemetry_proto::tonic::collector::trace::v1::{
        ExportTraceServiceRequest, ExportTraceServiceResponse,
    };
    use opentelemetry_proto::tonic::trace::v1::Span;

    /// A fake OTLP collector on loopback that keeps every span it receives.
    #[derive(Clone, Default)]
    pub struct Collector {
        pub spans: Arc<Mutex<Vec<Span>>>,
    }

    #[tonic::async_trait]
    impl TraceService for Collector {
        async fn export(
            &self,
            request: tonic::Request<ExportTraceServiceRequest>,
        ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
            let mut spans = self.spans.lock().unwrap();
            for resource in request.into_inner().resource_spans {
                for scope in resource.scope_spans {
                    spans.extend(scope.spans);
                }
            }
            Ok(tonic::Response::new(ExportTraceServiceResponse {
                partial_success: None,
            }))
        }
    }

    pub async fn start() -> (
        Collector,
        std::net::SocketAddr,
        tokio::sync::oneshot::Sender<()>,
    ) {
        let collector = Collector::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let service = TraceServiceServer::new(collector.clone());
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(
                    tonic::transport::server::TcpIncoming::from(listener),
                    async {
                        let _ = stopped.await;
                    },
                )
                .await
                .unwrap();
        });
        (collector, addr, stop)
    }
}
