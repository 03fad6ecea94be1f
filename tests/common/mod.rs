//! Shared by the end-to-end tests: an in-process Portcullis on loopback ports, driven by a
//! manual clock (no test sleeps to let time pass), and request builders.
#![allow(dead_code)]

use std::sync::Arc;

use portcullis::clock::ManualClock;
use portcullis::pb::{
    RateLimitDescriptor, RateLimitRequest, RateLimitResponse, RateLimitServiceClient,
    rate_limit_descriptor,
};
use portcullis::server::{self, Running};
use portcullis::settings::Settings;
use tonic::transport::Channel;

/// A day boundary (2025-11-13T00:00:00Z), so fixed windows of every unit start here.
pub const START_US: u64 = 1_762_992_000_000_000;

pub struct TestServer {
    pub clock: ManualClock,
    pub client: RateLimitServiceClient<Channel>,
    pub running: Option<Running>,
    pub dir: tempfile::TempDir,
}

impl TestServer {
    pub async fn start(rules: &[(&str, &str)]) -> TestServer {
        Self::start_with(rules, |_| {}).await
    }

    pub async fn start_with(
        rules: &[(&str, &str)],
        adjust: impl FnOnce(&mut Settings),
    ) -> TestServer {
        let dir = tempfile::tempdir().expect("temp dir");
        for (name, text) in rules {
            std::fs::write(dir.path().join(name), text).expect("write rules");
        }
        let mut settings = Settings::for_tests(dir.path().to_path_buf());
        adjust(&mut settings);
        let clock = ManualClock::new(START_US);
        let running = server::start(&settings, Arc::new(clock.clone()))
            .await
            .expect("server starts");
        let client = RateLimitServiceClient::connect(format!("http://{}", running.grpc_addr))
            .await
            .expect("client connects");
        TestServer {
            clock,
            client,
            running: Some(running),
            dir,
        }
    }

    pub async fn call(
        &self,
        request: RateLimitRequest,
    ) -> Result<RateLimitResponse, tonic::Status> {
        self.client
            .clone()
            .should_rate_limit(request)
            .await
            .map(|r| r.into_inner())
    }

    pub async fn ok(&self, request: RateLimitRequest) -> RateLimitResponse {
        self.call(request).await.expect("call answered")
    }

    pub async fn stop(mut self) {
        if let Some(running) = self.running.take() {
            running.shutdown().await;
        }
    }
}

pub fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| rate_limit_descriptor::Entry {
                key: (*k).into(),
                value: (*v).into(),
            })
            .collect(),
        limit: None,
        hits_addend: None,
        is_negative_hits: false,
    }
}

pub fn request(domain: &str, descriptors: &[&[(&str, &str)]]) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors: descriptors.iter().map(|d| descriptor(d)).collect(),
        hits_addend: 0,
    }
}

/// One HTTP/1.1 exchange with a loopback listener (admin, debug ports): status and body.
pub async fn http(port: u16, method: &str, path: &str, body: &str) -> (u16, String) {
    http_with(port, method, path, &[], body).await
}

/// `http` with extra request headers.
pub async fn http_with(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let extra: String = headers
        .iter()
        .map(|(name, value)| format!("{name}: {value}\r\n"))
        .collect();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\n{extra}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.expect("read");
    let status = raw[9..12].parse().expect("status code");
    let body = raw
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// Rules of the operating tests (observability, readiness, shutdown, mTLS): a limited key, a
/// shadow one, a detailed one, a wildcard token bucket and an unlimited one.
pub const OPERATIONS_RULES: &str = r#"
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

/// `http` to a listener's address.
pub async fn http_at(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> (u16, String) {
    http(addr.port(), method, path, body).await
}

/// The admin listener's address of an in-process server.
pub fn admin_addr(server: &TestServer) -> std::net::SocketAddr {
    server.running.as_ref().unwrap().admin_addr
}

/// README.md and every page of docs/, as one text: the examples a user copies from any of them.
pub fn docs() -> String {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut pages: Vec<std::path::PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    pages.sort();
    let mut text = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    for page in pages {
        text.push('\n');
        text.push_str(&std::fs::read_to_string(&page).expect("a docs page"));
    }
    text
}

/// The value of one sample line of a Prometheus exposition, 0 when absent.
pub fn sample(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix(series)
                .and_then(|rest| rest.strip_prefix(' '))
        })
        .map_or(0.0, |v| v.trim().parse().expect("a number"))
}

/// Waits past the top of the hour if it is under 20 s away, so that the Go service's fixed hour
/// window cannot turn over in the middle of a test.
pub fn clear_of_hour_boundary() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let left = 3600 - now % 3600;
    if left < 20 {
        std::thread::sleep(std::time::Duration::from_secs(left + 1));
    }
}

pub mod balancer;
pub mod cli;
pub mod envoy;
pub mod envoy_quota;
pub mod process;
pub mod proxy;
pub mod redis;
pub mod rlqs;
pub mod tls;
pub mod xds;

/// Sends `calls` copies of `request` at once, spread over `clients` in turn, and counts the
/// answers with overall code OK.
pub async fn count_admitted(
    clients: &[RateLimitServiceClient<Channel>],
    request: RateLimitRequest,
    calls: usize,
) -> usize {
    let tasks: Vec<_> = (0..calls)
        .map(|i| {
            let mut client = clients[i % clients.len()].clone();
            let request = request.clone();
            tokio::spawn(async move {
                client
                    .should_rate_limit(request)
                    .await
                    .map(|r| r.into_inner().overall_code)
            })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        let code = task.await.expect("task").expect("answered");
        if code == portcullis::pb::rate_limit_response::Code::Ok as i32 {
            admitted += 1;
        }
    }
    admitted
}

/// The value of the response header `name` Portcullis asked Envoy to add, if any.
pub fn header<'a>(r: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    r.response_headers_to_add
        .iter()
        .find(|h| h.key == name)
        .map(|h| h.value.as_str())
}
