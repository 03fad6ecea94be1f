//! Rules over xDS, against an in-process xDS server (tonic) that the test drives: it pushes a
//! set, an update, an invalid set, and breaks the stream; Portcullis must ACK what it applies,
//! NACK what it refuses (with the reason, keeping the last good rules), and come back after a
//! disconnect asking for the version it holds.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use crate::common::xds::Harness;
use crate::common::{START_US, request};
use portcullis::clock::ManualClock;
use portcullis::pb::RateLimitServiceClient;
use portcullis::pb::rate_limit_response::Code;
use portcullis::pb::xds::{RULES_TYPE_URL, rules as pb};
use portcullis::server::{self, Running};
use portcullis::settings::Settings;

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

/// One domain `eg`, a limit per user of `requests` a minute (or an invalid rule: no unit).
fn config(requests: u32, valid: bool) -> pb::RateLimitConfig {
    let unit = if valid {
        pb::RateLimitUnit::Minute
    } else {
        pb::RateLimitUnit::Unknown
    };
    pb::RateLimitConfig {
        name: "envoy-gateway-system/eg/http".into(),
        domain: "eg".into(),
        descriptors: vec![pb::RateLimitDescriptor {
            key: "user".into(),
            rate_limit: Some(pb::RateLimitPolicy {
                unit: unit as i32,
                requests_per_unit: requests,
                ..Default::default()
            }),
            ..Default::default()
        }],
    }
}

fn settings(plane: &Harness, force_start: bool) -> Settings {
    let mut s = Settings::for_tests(std::env::temp_dir().join("portcullis-no-rules-dir"));
    s.xds.rules_xds_server = Some(plane.addr.to_string());
    s.xds.rules_xds_node_id = "envoy-ratelimit".into();
    s.xds.rules_xds_node_metadata = Some("cluster=eg".into());
    s.xds.rules_xds_headers = Some("x-team:edge".into());
    s.xds.rules_xds_backoff_initial = Duration::from_millis(20);
    s.xds.rules_xds_backoff_max = Duration::from_millis(100);
    s.force_start_without_initial_rules = force_start;
    s
}

async fn start(settings: Settings) -> tokio::task::JoinHandle<Running> {
    let clock = ManualClock::new(START_US);
    tokio::spawn(async move {
        server::start(&settings, Arc::new(clock))
            .await
            .expect("server starts")
    })
}

async fn admitted(
    client: &mut RateLimitServiceClient<tonic::transport::Channel>,
    user: &str,
    calls: usize,
) -> Vec<i32> {
    let mut codes = Vec::new();
    for _ in 0..calls {
        codes.push(
            client
                .should_rate_limit(request("eg", &[&[("user", user)]]))
                .await
                .expect("answered")
                .into_inner()
                .overall_code,
        );
    }
    codes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_update_nack_and_reconnect() {
    let mut plane = Harness::start(None).await;
    let admin_port = common::redis::free_port();
    let mut waiting_settings = settings(&plane, false);
    waiting_settings.admin_addr = ([127, 0, 0, 1], admin_port).into();
    let starting = start(waiting_settings).await;

    // The first request: wildcard subscription for the rules type, our node, our headers.
    let first = plane.next().await;
    assert_eq!(first.type_url, RULES_TYPE_URL);
    assert!(first.resource_names.is_empty());
    assert_eq!(first.version_info, "");
    assert_eq!(first.response_nonce, "");
    let node = first.node.expect("node");
    assert_eq!(node.id, "envoy-ratelimit");
    assert!(node.metadata.unwrap().fields.contains_key("cluster"));
    assert_eq!(
        plane
            .stream_metadata(0)
            .get("x-team")
            .map(|v| v.to_str().unwrap().to_owned()),
        Some("edge".into())
    );
    // Without force start, nothing serves before the first rules; the admin listener already
    // says the process is alive (a liveness probe must not kill it) and why it is not ready.
    assert!(!starting.is_finished());
    let (status, body) = common::http(admin_port, "GET", "/healthz", "").await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = common::http(admin_port, "GET", "/readyz", "").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("waiting for the first rules"), "{body}");
    // Go's health path, which the Go Deployments probe for readiness: 500 as Go, saying why.
    let (status, body) = common::http(admin_port, "GET", "/healthcheck", "").await;
    assert_eq!(status, 500, "{body}");
    assert!(body.contains("waiting for the first rules"), "{body}");

    // Push: applied, ACKed, and the server starts.
    plane.push("1", "n1", &[config(2, true)]).await;
    let ack = plane.next().await;
    assert_eq!(
        (ack.version_info.as_str(), ack.response_nonce.as_str()),
        ("1", "n1")
    );
    assert!(ack.error_detail.is_none());
    let running = tokio::time::timeout(Duration::from_secs(10), starting)
        .await
        .expect("start completes once rules arrive")
        .unwrap();
    let mut client = RateLimitServiceClient::connect(format!("http://{}", running.grpc_addr))
        .await
        .unwrap();
    assert_eq!(admitted(&mut client, "a", 3).await, [OK, OK, OVER]);
    // The same port, now the real admin listener.
    assert_eq!(running.admin_addr.port(), admin_port);
    let (status, body) = common::http(admin_port, "GET", "/rlconfig", "").await;
    assert_eq!(status, 200, "{body}");

    // Update: the new limit is in force once ACKed.
    plane.push("2", "n2", &[config(4, true)]).await;
    let ack = plane.next().await;
    assert_eq!(
        (ack.version_info.as_str(), ack.response_nonce.as_str()),
        ("2", "n2")
    );
    assert_eq!(admitted(&mut client, "b", 5).await, [OK, OK, OK, OK, OVER]);

    // An invalid set: NACKed with the reason, version 2 stays in force.
    plane.push("3", "n3", &[config(9, false)]).await;
    let nack = plane.next().await;
    assert_eq!(
        nack.version_info, "2",
        "a NACK names the version still in force"
    );
    assert_eq!(nack.response_nonce, "n3");
    let detail = nack.error_detail.expect("error_detail");
    assert!(
        detail.message.contains("xds:envoy-gateway-system/eg/http")
            && detail.message.contains("unit"),
        "{}",
        detail.message
    );
    assert_eq!(admitted(&mut client, "c", 5).await, [OK, OK, OK, OK, OVER]);

    // Disconnect: the client comes back on a new stream, asking with the version it holds.
    plane.break_stream().await;
    let again = plane.next().await;
    assert_eq!(plane.streams(), 2);
    assert_eq!(again.version_info, "2");
    assert_eq!(again.response_nonce, "");
    // Rules kept serving meanwhile; a push on the new stream applies.
    assert_eq!(admitted(&mut client, "d", 5).await, [OK, OK, OK, OK, OVER]);
    plane.push("4", "n4", &[config(1, true)]).await;
    let ack = plane.next().await;
    assert_eq!(ack.version_info, "4");
    assert_eq!(admitted(&mut client, "e", 2).await, [OK, OVER]);

    let metrics = running.metrics.encode();
    assert!(
        metrics.contains("portcullis_rules_reloads_total{result=\"error\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("portcullis_rules_reloads_total{result=\"success\"} 3"));
    assert!(
        metrics.contains("portcullis_rules_xds_connected 1"),
        "{metrics}"
    );
    running.shutdown().await;
    plane.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_start_serves_before_the_first_rules_and_the_server_may_come_later() {
    // No control plane yet: the client keeps retrying, the service answers meanwhile.
    let port = common::redis::free_port();
    let mut s = Settings::for_tests(std::env::temp_dir().join("portcullis-no-rules-dir"));
    s.xds.rules_xds_server = Some(format!("127.0.0.1:{port}"));
    s.xds.rules_xds_backoff_initial = Duration::from_millis(20);
    s.xds.rules_xds_backoff_max = Duration::from_millis(100);
    s.force_start_without_initial_rules = true;
    let running = tokio::time::timeout(Duration::from_secs(10), start(s).await)
        .await
        .expect("force start does not wait")
        .unwrap();
    let mut client = RateLimitServiceClient::connect(format!("http://{}", running.grpc_addr))
        .await
        .unwrap();
    // No rules: nothing is limited.
    assert_eq!(admitted(&mut client, "a", 3).await, [OK, OK, OK]);

    // The control plane appears on that port; the retrying client finds it.
    let mut plane = Harness::start_at(port, None).await;
    let first = plane.next().await;
    assert_eq!(first.version_info, "");
    plane.push("1", "n1", &[config(1, true)]).await;
    assert_eq!(plane.next().await.version_info, "1");
    assert_eq!(admitted(&mut client, "b", 2).await, [OK, OVER]);
    running.shutdown().await;
    plane.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_to_the_control_plane() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    common::tls::make_ca(dir.path(), "ca");
    common::tls::make_leaf(dir.path(), "ca", "server");
    common::tls::make_leaf(dir.path(), "ca", "client");
    let read = |name: &str| std::fs::read(dir.path().join(name)).unwrap();
    let tls = tonic::transport::ServerTlsConfig::new()
        .identity(tonic::transport::Identity::from_pem(
            read("server.crt"),
            read("server.key"),
        ))
        .client_ca_root(tonic::transport::Certificate::from_pem(read("ca.crt")));
    let mut plane = Harness::start(Some(tls)).await;
    let mut s = settings(&plane, false);
    // The certificate names localhost, not the address dialled: --rules-xds-san says which.
    s.xds.rules_xds_san = Some("localhost".into());
    s.xds.rules_xds_tls = true;
    s.xds.rules_xds_ca_file = Some(dir.path().join("ca.crt"));
    s.xds.rules_xds_cert = Some(dir.path().join("client.crt"));
    s.xds.rules_xds_key = Some(dir.path().join("client.key"));
    let starting = start(s).await;
    let first = plane.next().await;
    assert_eq!(first.type_url, RULES_TYPE_URL);
    plane.push("1", "n1", &[config(1, true)]).await;
    assert_eq!(plane.next().await.version_info, "1");
    let running = tokio::time::timeout(Duration::from_secs(10), starting)
        .await
        .unwrap()
        .unwrap();
    running.shutdown().await;
    plane.stop().await;
}
