//! Operating Portcullis: exact metrics after known traffic, health and readiness, the admin
//! endpoints, a Kubernetes ConfigMap swap reloading the rules, and SIGTERM draining.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::process::ServeProcess;
use common::{TestServer, request};
use portcullis::pb::rate_limit_response::Code;

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

/// A minimal HTTP/1.1 client: (status, body).
async fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    common::http(addr.port(), method, path, body).await
}

fn admin(server: &TestServer) -> SocketAddr {
    server.running.as_ref().unwrap().admin_addr
}

use common::sample;

const RULES: &str = r#"
domain: m
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 4}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: tenant
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: path
    value: /api/*
    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: token_bucket}
  - key: free
    rate_limit: {unlimited: true}
"#;

#[tokio::test]
async fn metrics_count_exactly_the_traffic_sent() {
    let server = TestServer::start(&[("m.yaml", RULES)]).await;
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

#[tokio::test]
async fn health_readiness_rlconfig_and_json() {
    let server = TestServer::start_with(&[("m.yaml", RULES)], |s| s.admin_json = true).await;
    let addr = admin(&server);
    assert_eq!(
        http(addr, "GET", "/healthz", "").await,
        (200, "ok\n".into())
    );
    let (status, body) = http(addr, "GET", "/readyz", "").await;
    assert_eq!(status, 200);
    assert!(
        body.contains("5 rule(s) from 1 file(s)") && body.contains("store: memory ok"),
        "{body}"
    );

    let (_, config) = http(addr, "GET", "/rlconfig", "").await;
    assert!(
        config.contains("m.path_/api/*: 10 per hour, token_bucket, burst 10"),
        "{config}"
    );
    assert!(
        config.contains("m.trial: 1 per hour, sliding_window, shadow_mode"),
        "{config}"
    );

    let call =
        r#"{"domain":"m","descriptors":[{"entries":[{"key":"user","value":"j"}]}],"hitsAddend":3}"#;
    let (status, body) = http(addr, "POST", "/json", call).await;
    assert_eq!(status, 200, "{body}");
    let parsed: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(parsed["overallCode"], "OK");
    assert_eq!(parsed["statuses"][0]["limitRemaining"], 1);
    assert_eq!(parsed["statuses"][0]["currentLimit"]["unit"], "HOUR");
    // snake_case names and a string uint64 (proto3 JSON) are accepted too.
    let call = r#"{"domain":"m","descriptors":[{"entries":[{"key":"user","value":"j"}],"hits_addend":"2"}]}"#;
    let (status, body) = http(addr, "POST", "/json", call).await;
    assert_eq!(status, 429, "{body}");
    assert!(body.contains(r#""overallCode":"OVER_LIMIT""#), "{body}");
    for bad in [
        "not json",
        r#"{"domain":"","descriptors":[{"entries":[{"key":"k"}]}]}"#,
        r#"{"domain":"m","bogus":1}"#,
    ] {
        let (status, body) = http(addr, "POST", "/json", bad).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert!(body.contains("error"), "{body}");
    }
    server.stop().await;
}

#[tokio::test]
async fn readiness_reports_an_unreachable_store_and_fails_only_when_asked_to() {
    let port = common::redis::free_port();
    for requires in [false, true] {
        let server = TestServer::start_with(&[("m.yaml", RULES)], |s| {
            s.store = portcullis::settings::StoreKind::Redis;
            s.redis_url = Some(format!("redis://127.0.0.1:{port}"));
            s.store_timeout = Duration::from_millis(200);
            s.ready_requires_store = requires;
        })
        .await;
        let (status, body) = http(admin(&server), "GET", "/readyz", "").await;
        assert!(
            body.contains("store: redis failing: store unavailable"),
            "{body}"
        );
        assert!(
            body.to_lowercase().contains("refused"),
            "the reason is given: {body}"
        );
        assert_eq!(status, if requires { 503 } else { 200 }, "{body}");
        // Liveness never depends on the store.
        assert_eq!(http(admin(&server), "GET", "/healthz", "").await.0, 200);
        server.stop().await;
    }
}

/// Writes `text` as a new ConfigMap generation: `..<generation>/rules.yaml`, then swaps the
/// `..data` link atomically, the way the kubelet updates a mounted ConfigMap.
fn configmap_update(dir: &std::path::Path, generation: u32, text: &str) {
    let data = dir.join(format!("..gen_{generation}"));
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("rules.yaml"), text).unwrap();
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(format!("..gen_{generation}"), &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
    if !dir.join("rules.yaml").exists() {
        std::os::unix::fs::symlink("..data/rules.yaml", dir.join("rules.yaml")).unwrap();
    }
    if generation > 1 {
        std::fs::remove_dir_all(dir.join(format!("..gen_{}", generation - 1))).unwrap();
    }
}

fn limit_rules(requests: u32) -> String {
    format!(
        "domain: live\ndescriptors:\n  - key: k\n    rate_limit: {{unit: hour, requests_per_unit: {requests}}}\n"
    )
}

async fn current_limit(server: &TestServer) -> u32 {
    let r = server.ok(request("live", &[&[("k", "probe")]])).await;
    r.statuses[0]
        .current_limit
        .as_ref()
        .map_or(0, |l| l.requests_per_unit)
}

async fn wait_for_limit(server: &TestServer, requests: u32) {
    let start = Instant::now();
    while current_limit(server).await != requests {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "limit {requests} not picked up"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn configmap_swap_reloads_rules_and_a_broken_file_keeps_the_last_good_ones() {
    let server = TestServer::start(&[]).await;
    let dir = server.dir.path().to_path_buf();
    configmap_update(&dir, 1, &limit_rules(1));
    wait_for_limit(&server, 1).await;
    configmap_update(&dir, 2, &limit_rules(5));
    wait_for_limit(&server, 5).await;

    let reload_errors = |m: &str| sample(m, r#"portcullis_rules_reloads_total{result="error"}"#);
    configmap_update(
        &dir,
        3,
        "domain: live\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight}\n",
    );
    let start = Instant::now();
    loop {
        let (_, m) = http(admin(&server), "GET", "/metrics", "").await;
        if reload_errors(&m) == 1.0 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the broken file was not noticed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        current_limit(&server).await,
        5,
        "the last good rules stay in force"
    );

    configmap_update(&dir, 4, &limit_rules(7));
    wait_for_limit(&server, 7).await;
    let (_, m) = http(admin(&server), "GET", "/metrics", "").await;
    // The load at start and three reloads (as Go's config_load_success counts).
    assert_eq!(
        sample(&m, r#"portcullis_rules_reloads_total{result="success"}"#),
        4.0
    );
    assert_eq!(reload_errors(&m), 1.0);
    server.stop().await;
}

async fn wait_for_metric(server: &TestServer, series: &str, value: f64) {
    let start = Instant::now();
    loop {
        let (_, m) = http(admin(server), "GET", "/metrics", "").await;
        if sample(&m, series) == value {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{series} never reached {value}: {m}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_reload_that_would_remove_a_serving_domain_is_refused_unless_allowed() {
    let refused = r#"portcullis_rules_reloads_total{result="refused"}"#;
    let server = TestServer::start(&[]).await;
    let dir = server.dir.path().to_path_buf();
    configmap_update(&dir, 1, &limit_rules(3));
    wait_for_limit(&server, 3).await;
    // A file that no longer defines the serving domain: refused, the domain keeps its limit.
    configmap_update(&dir, 2, "domain: other\n");
    wait_for_metric(&server, refused, 1.0).await;
    assert_eq!(current_limit(&server).await, 3);
    // A ConfigMap emptied by mistake: refused too.
    std::fs::remove_file(dir.join("rules.yaml")).unwrap();
    wait_for_metric(&server, refused, 2.0).await;
    assert_eq!(current_limit(&server).await, 3);
    server.stop().await;

    // With --allow-rules-removal the operator says removing domains is intended.
    let server = TestServer::start_with(&[], |s| s.allow_rules_removal = true).await;
    let dir = server.dir.path().to_path_buf();
    configmap_update(&dir, 1, &limit_rules(3));
    wait_for_limit(&server, 3).await;
    configmap_update(&dir, 2, "domain: other\n");
    wait_for_limit(&server, 0).await;
    server.stop().await;
}

#[tokio::test]
async fn readiness_can_require_at_least_one_domain() {
    let server = TestServer::start_with(&[], |s| s.ready_requires_rules = true).await;
    let (status, body) = http(admin(&server), "GET", "/readyz", "").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("no domain loaded"), "{body}");
    configmap_update(server.dir.path(), 1, &limit_rules(3));
    wait_for_limit(&server, 3).await;
    let (status, body) = http(admin(&server), "GET", "/readyz", "").await;
    assert_eq!(status, 200, "{body}");
    server.stop().await;
}

const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_store_keeps_ageing_after_the_host_clock_steps_forward_and_back() {
    assert!(
        std::path::Path::new(LIBFAKETIME).exists(),
        "libfaketime is missing: apt-get install faketime (scripts/test installs it)"
    );
    let rules = tempfile::tempdir().unwrap();
    std::fs::write(
        rules.path().join("c.yaml"),
        "domain: c\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    )
    .unwrap();
    // The wall clock of the process is read from this file on every reading; the monotonic
    // clock is left alone, as on a host whose NTP steps the wall clock.
    let offset = rules.path().join("..offset");
    std::fs::write(&offset, "+0\n").unwrap();
    let envs = [
        ("LD_PRELOAD", LIBFAKETIME.to_owned()),
        ("FAKETIME_TIMESTAMP_FILE", offset.display().to_string()),
        ("FAKETIME_NO_CACHE", "1".to_owned()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_owned()),
    ];
    let server = ServeProcess::spawn(rules.path(), &[], &envs, &[]);
    let mut client = portcullis::pb::RateLimitServiceClient::connect(server.grpc_url())
        .await
        .unwrap();
    let mut call = async |key: &str| {
        client
            .should_rate_limit(request("c", &[&[("k", key)]]))
            .await
            .unwrap()
            .into_inner()
            .overall_code
    };
    call("probe").await;
    // The host clock jumps an hour ahead and is corrected back.
    std::fs::write(&offset, "+3600s\n").unwrap();
    call("probe").await;
    std::fs::write(&offset, "+0\n").unwrap();
    call("probe").await;
    assert_eq!(call("user").await, OK);
    assert_eq!(call("user").await, OVER);
    // One second later by any honest clock the budget is back; a clock pinned to the highest
    // wall reading seen would keep refusing for the hour.
    let start = Instant::now();
    while call("user").await != OK {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the memory store stopped ageing after the clock stepped back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn sigterm_reports_not_serving_keeps_answering_through_the_drain_and_exits_0() {
    use tonic_health::pb::{
        HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("m.yaml"), RULES).unwrap();
    let mut server = ServeProcess::spawn(dir.path(), &["--drain-period", "1500ms"], &[], &[]);
    let channel = tonic::transport::Channel::from_shared(server.grpc_url())
        .unwrap()
        .connect()
        .await
        .expect("connect");
    let mut health = HealthClient::new(channel.clone());
    let mut rls = portcullis::pb::RateLimitServiceClient::new(channel);
    let status_of = |h: &mut HealthClient<_>, service: &str| {
        let mut h = h.clone();
        let service = service.to_owned();
        async move {
            h.check(HealthCheckRequest { service })
                .await
                .unwrap()
                .into_inner()
                .status
        }
    };
    let status = |h: &mut HealthClient<_>| status_of(h, "");
    assert_eq!(status(&mut health).await, ServingStatus::Serving as i32);
    assert_eq!(
        status_of(&mut health, "ratelimit").await,
        ServingStatus::Serving as i32
    );

    let signalled = Instant::now();
    server.signal("TERM");
    while status(&mut health).await != ServingStatus::NotServing as i32 {
        assert!(
            signalled.elapsed() < Duration::from_secs(1),
            "health did not turn NOT_SERVING"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (ready, _) = http(server.admin_addr(), "GET", "/readyz", "").await;
    assert_eq!(ready, 503);
    assert_eq!(
        status_of(&mut health, "ratelimit").await,
        ServingStatus::NotServing as i32
    );
    // Liveness does not follow the drain: a probe must not restart a replica that is leaving.
    assert_eq!(
        status_of(&mut health, "portcullis.liveness").await,
        ServingStatus::Serving as i32
    );
    // Still answering during the drain period.
    let r = rls
        .should_rate_limit(request("m", &[&[("user", "drain")]]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, OK);
    let r = rls
        .should_rate_limit(request("m", &[&[("trial", "drain")]]))
        .await
        .unwrap()
        .into_inner();
    assert_ne!(r.overall_code, OVER);
    // Then it exits 0, within the drain period plus a margin.
    let exit = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            signalled.elapsed() < Duration::from_millis(1500 + 3000),
            "did not exit after draining"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        signalled.elapsed() >= Duration::from_millis(1400),
        "exited before the drain period"
    );
    assert_eq!(exit.code(), Some(0));
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traces_go_to_the_otlp_collector_under_envoys_traceparent() {
    let (collector, collector_addr, stop_collector) = otlp::start().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("m.yaml"), RULES).unwrap();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_over_mtls_with_certificates_rotated_without_a_restart() {
    use common::tls::{make_ca, make_leaf};
    use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

    let certs = tempfile::tempdir().unwrap();
    let d = certs.path();
    for ca in ["ca1", "ca2", "clients"] {
        make_ca(d, ca);
    }
    make_leaf(d, "ca1", "server1");
    make_leaf(d, "ca2", "server2");
    make_leaf(d, "clients", "client");
    make_leaf(d, "ca1", "stranger");
    std::fs::copy(d.join("server1.crt"), d.join("tls.crt")).unwrap();
    std::fs::copy(d.join("server1.key"), d.join("tls.key")).unwrap();

    let rules = tempfile::tempdir().unwrap();
    std::fs::write(rules.path().join("m.yaml"), RULES).unwrap();
    let mut settings = portcullis::settings::Settings::for_tests(rules.path().to_path_buf());
    settings.grpc_tls_cert = Some(d.join("tls.crt"));
    settings.grpc_tls_key = Some(d.join("tls.key"));
    settings.grpc_tls_client_ca = Some(d.join("clients.crt"));
    let running = portcullis::server::start(
        &settings,
        std::sync::Arc::new(portcullis::clock::ManualClock::new(common::START_US)),
    )
    .await
    .expect("starts with TLS");
    let url = format!("https://127.0.0.1:{}", running.grpc_addr.port());
    let pem = |name: &str| std::fs::read(d.join(name)).unwrap();
    let call = |trust: &'static str, identity: Option<&'static str>| {
        let mut tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(pem(trust)))
            .domain_name("localhost");
        if let Some(id) = identity {
            tls = tls.identity(Identity::from_pem(
                pem(&format!("{id}.crt")),
                pem(&format!("{id}.key")),
            ));
        }
        let url = url.clone();
        async move {
            let channel = Channel::from_shared(url)
                .unwrap()
                .tls_config(tls)
                .unwrap()
                .connect()
                .await
                .map_err(|e| e.to_string())?;
            let mut client = portcullis::pb::RateLimitServiceClient::new(channel);
            client
                .should_rate_limit(request("m", &[&[("user", "tls")]]))
                .await
                .map(|r| r.into_inner().overall_code)
                .map_err(|e| e.to_string())
        }
    };
    assert_eq!(
        call("ca1.crt", Some("client")).await,
        Ok(OK),
        "mTLS with a client certificate"
    );
    assert!(
        call("ca1.crt", None).await.is_err(),
        "no client certificate: refused"
    );
    assert!(
        call("ca1.crt", Some("stranger")).await.is_err(),
        "a client certificate from another CA: refused"
    );
    assert!(
        call("ca2.crt", Some("client")).await.is_err(),
        "the server does not have the ca2 certificate yet"
    );

    // Rotation: new files on disk (a Kubernetes secret update); the new certificate is served.
    std::fs::copy(d.join("server2.key"), d.join("tls.key")).unwrap();
    std::fs::copy(d.join("server2.crt"), d.join("tls.crt")).unwrap();
    let start = Instant::now();
    while call("ca2.crt", Some("client")).await != Ok(OK) {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the rotated certificate was not picked up"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        call("ca1.crt", Some("client")).await.is_err(),
        "the old certificate is gone"
    );
    running.shutdown().await;
}
