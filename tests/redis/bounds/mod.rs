//! Every resource fed by requests has a bound: metric series, string lengths, message sizes, calls
//! in flight. Each test sends what a hostile or buggy client would and checks the bound holds and
//! says so.

use crate::common;
mod connections;
mod input;
mod store;

use crate::common::{TestServer, descriptor};
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
