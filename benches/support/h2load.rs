//! h2load (Debian's nghttp2-client) as the load benchmark's other generator: one gRPC request,
//! framed once, sent over and over at fixed concurrency. It spends far less CPU per call than a
//! tonic client, so on a shared 2-core machine it leaves more of the cores to the service and
//! Redis (the tonic generator is itself the ceiling near 13k calls/s through Envoy, h2load
//! about twice that). It cannot vary a request or read a gRPC answer (every answer is HTTP 200,
//! the code is in the body and trailers): the benchmark checks answers by the service's own
//! counters instead. Never used for more than one request shape per run.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;

/// What one h2load run reports.
pub struct Run {
    /// Requests answered (HTTP 2xx), and those that failed or errored.
    pub succeeded: u64,
    pub failed: u64,
    pub seconds: f64,
    /// The mean request time in milliseconds (h2load gives no percentiles).
    pub mean_ms: f64,
    /// Answers whose status was not 2xx.
    pub not_2xx: u64,
}

/// The gRPC message framing: no compression, a 4-byte big-endian length, the message.
pub fn frame(message: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(message.len() + 5);
    out.push(0);
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    out
}

/// Runs h2load for `seconds` against `path` on `addr` with `body` (a framed message written to
/// `dir`), `connections` connections of `streams` calls in flight each, one thread.
pub fn run(
    dir: &Path,
    addr: SocketAddr,
    path: &str,
    body: &[u8],
    seconds: f64,
    connections: usize,
    streams: usize,
) -> Run {
    let file = dir.join("h2load-body.bin");
    std::fs::write(&file, body).expect("write the request body");
    let out = Command::new("h2load")
        .args(["-D", &format!("{:.0}", seconds.ceil().max(1.0))])
        .args(["-c", &connections.to_string(), "-m", &streams.to_string()])
        .args(["-t", "1", "-d"])
        .arg(&file)
        .args(["-H", "content-type: application/grpc", "-H", "te: trailers"])
        .arg(format!("http://{addr}{path}"))
        .output()
        .expect("run h2load (Debian: nghttp2-client)");
    summary(&out)
}

/// Runs h2load for `seconds` sending GETs to `path` on `addr` over keep-alive HTTP/1.1
/// connections, one request in flight each, one thread (a gateway's HTTP listener).
pub fn get(addr: SocketAddr, path: &str, seconds: f64, connections: usize) -> Run {
    let out = Command::new("h2load")
        .arg("--h1")
        .args(["-D", &format!("{:.0}", seconds.ceil().max(1.0))])
        .args(["-c", &connections.to_string(), "-m", "1", "-t", "1"])
        .arg(format!("http://{addr}{path}"))
        .output()
        .expect("run h2load (Debian: nghttp2-client)");
    summary(&out)
}

/// A finished h2load run's summary; a failed or unreadable run stops the benchmark.
fn summary(out: &std::process::Output) -> Run {
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "h2load failed: {text}");
    parse(&text).unwrap_or_else(|| panic!("h2load output not understood: {text}"))
}

/// Reads h2load's summary: "finished in 4.00s, ...", "requests: N total, N started, N done, N
/// succeeded, N failed, N errored, N timeout", "time for request: min max mean sd ...".
fn parse(text: &str) -> Option<Run> {
    let seconds = text
        .lines()
        .find_map(|l| l.strip_prefix("finished in "))?
        .split(',')
        .next()?;
    let seconds = duration_ms(seconds.trim())? / 1000.0;
    let requests = text.lines().find_map(|l| l.strip_prefix("requests: "))?;
    let count = |what: &str| -> Option<u64> {
        requests
            .split(',')
            .map(str::trim)
            .find_map(|f| f.strip_suffix(what))
            .and_then(|n| n.trim().parse().ok())
    };
    let mean_ms = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("time for request:"))
        .and_then(|l| l.split_whitespace().nth(2))
        .and_then(duration_ms)?;
    // "status codes: N 2xx, N 3xx, N 4xx, N 5xx"
    let not_2xx = text
        .lines()
        .find_map(|l| l.strip_prefix("status codes: "))
        .map_or(0, |codes| {
            codes
                .split(',')
                .map(str::trim)
                .filter(|c| !c.ends_with("2xx"))
                .filter_map(|c| c.split(' ').next()?.parse::<u64>().ok())
                .sum()
        });
    Some(Run {
        not_2xx,
        succeeded: count("succeeded")?,
        failed: count("failed")? + count("errored")? + count("timeout")?,
        seconds,
        mean_ms,
    })
}

/// h2load's durations: "812us", "1.25ms", "4.00s".
fn duration_ms(text: &str) -> Option<f64> {
    let (number, scale) = if let Some(n) = text.strip_suffix("us") {
        (n, 0.001)
    } else if let Some(n) = text.strip_suffix("ms") {
        (n, 1.0)
    } else {
        (text.strip_suffix('s')?, 1000.0)
    };
    number.parse::<f64>().ok().map(|n| n * scale)
}
