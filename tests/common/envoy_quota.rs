//! The rate_limit_quota filter through a real Envoy, as the Envoy RLQS tests drive it: the rules,
//! the filter as docs/envoy.md gives it, paced load with each answer's time and status, and an
//! RLQS gateway beside an RLS one on one Redis.

use std::time::{Duration, Instant};

use super::envoy::{self, Gateway};
use super::process::ServeProcess;

pub const RULES: &str = "\
domain: edge
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: tenant
    value: slow
    rate_limit: {unit: minute, requests_per_unit: 90}
  - key: tenant
    value: per-minute
    rate_limit: {unit: minute, requests_per_unit: 120}
  - key: tenant
    value: fixed
    rate_limit: {unit: second, requests_per_unit: 10, algorithm: fixed_window}
  - key: tenant
    value: bucket
    rate_limit: {unit: second, requests_per_unit: 10, algorithm: token_bucket}
  - key: tenant
    value: shared-*
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: 10}
";

/// The filter as docs/envoy.md gives it: one bucket per `x-tenant` value, allowed until the
/// first assignment arrives. (Envoy 1.40 reports every 5 s whatever `reporting_interval` says.)
pub fn rlqs_filter() -> String {
    envoy::readme_envoy_blocks()
        .into_iter()
        .find(|b| b.contains("envoy.filters.http.rate_limit_quota"))
        .expect("docs/envoy.md's RLQS filter")
}

pub fn rules_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("edge.yaml"), RULES).expect("write rules");
    dir
}

/// Sends `per_second` requests a second for `tenant` during `run`, paced; the time (since the
/// start) and status of each.
pub async fn offer(
    g: &Gateway,
    tenant: &str,
    per_second: u32,
    run: Duration,
) -> Vec<(Duration, u16)> {
    let start = Instant::now();
    let gap = Duration::from_secs(1) / per_second;
    let mut out = Vec::new();
    let total = (run.as_secs_f64() * f64::from(per_second)) as u32;
    for i in 0..total {
        let due = start + gap * i;
        tokio::time::sleep_until(due.into()).await;
        out.push((start.elapsed(), status(g, tenant).await));
    }
    out
}

/// One GET through the gateway for `tenant`: its status, read as soon as the response is whole
/// (Envoy keeps the connection after a local reply; waiting for it to close would pace the load).
pub async fn status(g: &Gateway, tenant: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(g.ingress_addr())
        .await
        .expect("connect");
    let request = format!("GET / HTTP/1.1\r\nHost: gateway\r\nx-tenant: {tenant}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut raw = Vec::new();
    let mut chunk = [0u8; 4096];
    let read = async {
        loop {
            let n = stream.read(&mut chunk).await.expect("read");
            assert!(n > 0, "closed before a whole response: {raw:?}");
            raw.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&raw);
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let length = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                    })
                    .unwrap_or(0);
                if body.len() >= length {
                    return head
                        .split(' ')
                        .nth(1)
                        .and_then(|s| s.parse().ok())
                        .expect("a status");
                }
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .expect("an answer within 5 s")
}

/// Admitted answers among `answers` whose time falls in `from..to`.
pub fn admitted_in(answers: &[(Duration, u16)], from: Duration, to: Duration) -> (usize, usize) {
    let window: Vec<u16> = answers
        .iter()
        .filter(|(at, _)| *at >= from && *at < to)
        .map(|(_, s)| *s)
        .collect();
    (window.iter().filter(|s| **s == 200).count(), window.len())
}

/// One Redis, a replica serving RLQS to gateway `a` (the rate_limit_quota filter) and a replica
/// serving RLS to gateway `b` (the ratelimit filter on `x-tenant`); everything started is stopped
/// when it drops.
pub struct Beside {
    // Dropped in this order: the gateways first, Redis last.
    _envoys: (envoy::Envoy, envoy::Envoy),
    pub a: Gateway,
    pub b: Gateway,
    pub local: ServeProcess,
    pub per_call: ServeProcess,
    _rules: tempfile::TempDir,
    _redis: super::redis::RedisServer,
}

impl Beside {
    /// Returns once the RLQS replica answers reports at once: a replica that is the first to
    /// serve RLQS on a Redis answers its first reports up to 1.5 s late, until every replica has
    /// seen it (docs/envoy.md), and the gateway admits meanwhile by its filter's own
    /// `no_assignment_behavior` (allow), outside the budget's bound: at 10 a second, about 7
    /// more in the first minute of one CI run (69 + 59 = 128 within 60 s). A report of a
    /// descriptor no rule limits waits the same and spends nothing.
    pub async fn settled(&self) {
        let mut probe =
            super::rlqs::Gateway::open_at(([127, 0, 0, 1], self.local.grpc_port).into()).await;
        let unlimited: &[(&str, &str)] = &[("settle", "probe")];
        let answered = tokio::time::timeout(
            Duration::from_secs(10),
            probe.report("edge", &[(unlimited, 1, 0)]),
        )
        .await;
        assert!(
            matches!(answered, Ok(Ok(_))),
            "the RLQS replica did not answer a report within 10 s: {answered:?}"
        );
    }

    pub fn start() -> Beside {
        Self::start_with(&[], None)
    }

    /// `start`, the RLQS replica with `flags` too, and gateway `a` named `name` (docs/envoy.md's
    /// `initial_metadata`) when given.
    pub fn start_with(flags: &[&str], name: Option<&str>) -> Beside {
        let redis = super::redis::RedisServer::start();
        let rules = rules_dir();
        let url = redis.url();
        let store = ["--store", "redis", "--redis-url", url.as_str()];
        let local = ServeProcess::spawn(
            rules.path(),
            &[&["--rlqs"], &store[..], flags].concat(),
            &[],
            &[],
        );
        let per_call = ServeProcess::spawn(rules.path(), &store, &[], &[]);
        let mut a = Gateway::new("edge", &[local.grpc_port]);
        a.http_filters = rlqs_filter();
        if let Some(name) = name {
            let server = "rlqs_server: {envoy_grpc: {cluster_name: portcullis}}";
            assert!(a.http_filters.contains(server), "{}", a.http_filters);
            a.http_filters = a.http_filters.replace(
                server,
                &format!(
                    "rlqs_server: {{envoy_grpc: {{cluster_name: portcullis}}, initial_metadata: \
                     [{{key: x-portcullis-gateway-id, value: {name}}}]}}"
                ),
            );
        }
        let mut b = Gateway::new("edge", &[per_call.grpc_port]);
        b.route_rate_limits =
            "- actions: [{request_headers: {header_name: x-tenant, descriptor_key: tenant}}]"
                .into();
        // An answer that comes late must not pass as an allow.
        b.timeout = "1s".into();
        let envoys = (a.start(), b.start());
        Beside {
            a,
            b,
            local,
            per_call,
            _envoys: envoys,
            _rules: rules,
            _redis: redis,
        }
    }
}
