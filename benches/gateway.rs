//! The gateway's view: HTTP load through a real Envoy 1.40 (one worker) to a stand-in upstream
//! (a direct response of the same Envoy), with no rate limit filter, then with the ratelimit
//! filter asking Portcullis on the memory store, standalone Redis (with and without hot counters
//! decided from the replica's claims, `--hot-descriptor-rate`) and a 3-master Cluster, and
//! with the rate_limit_quota filter (RLQS: the gateway enforces Portcullis' assignment), all in
//! one run with the same generator and concurrency.
//!
//! Besides those, two rows say what Envoy itself costs: its `local_ratelimit` filter (local
//! enforcement, no service), and the rate_limit_quota filter with no RLQS server at all (its
//! fallback ALLOW_ALL: the ceiling of any RLQS server).
//!
//! Per scenario it prints gateway requests/s and latency, each as a ratio to the run without the
//! filter, and Envoy's and Portcullis' CPU per request (from `/proc/PID/stat`). Every answer is
//! checked to be the upstream's 200 (the limit is far away): a failed or refused request fails
//! the run. The generator: this process's own keep-alive connections (p50/p99), or h2load
//! (`--generator h2load`, Debian's nghttp2-client: about twice the requests a second through
//! one Envoy on this 2-core machine, so Envoy, not the generator, is the ceiling; it gives a
//! mean, no percentiles).
//!
//!   cargo bench --bench gateway -- --generator h2load   every scenario, 8 s each, by h2load
//!   cargo bench --bench gateway -- --seconds 3 --connections 16
//!   cargo test --bench gateway                          a short smoke run (checks it works)

// The tests' harness: Envoy (which finds its helpers at `super::redis`) and Redis processes.
#[path = "support/cpu.rs"]
mod cpu;
#[path = "../tests/common/envoy.rs"]
mod envoy;
#[path = "support/h2load.rs"]
#[allow(dead_code)]
mod h2load;
#[path = "../tests/common/redis.rs"]
mod redis;

use cpu::cpu_seconds;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::envoy::{Envoy, Gateway};
use crate::redis::{RedisCluster, RedisServer, free_port, wait_until};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

const RULES: &str = "domain: gw\ndescriptors:\n  - key: client\n    rate_limit: {unit: second, requests_per_unit: 1000000000}\n";

/// The rate_limit_quota filter (RLQS): every request in one bucket, `{client: c}`, enforced in
/// Envoy from Portcullis' assignment; no call per request.
const RLQS_FILTER: &str = r#"- name: envoy.filters.http.rate_limit_quota
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaFilterConfig
    rlqs_server: {envoy_grpc: {cluster_name: portcullis}}
    domain: gw
    bucket_matchers:
      on_no_match:
        action:
          name: rate_limit_quota
          typed_config:
            "@type": type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaBucketSettings
            bucket_id_builder:
              bucket_id_builder:
                client: {string_value: c}
            reporting_interval: 1s
            no_assignment_behavior:
              fallback_rate_limit: {blanket_rule: ALLOW_ALL}
"#;

/// Envoy's own local rate limit (a token bucket per Envoy, no service), far from its limit.
const LOCAL_FILTER: &str = r#"- name: envoy.filters.http.local_ratelimit
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit
    stat_prefix: local
    token_bucket: {max_tokens: 1000000000, tokens_per_fill: 1000000000, fill_interval: 1s}
    filter_enabled: {default_value: {numerator: 100, denominator: HUNDRED}}
    filter_enforced: {default_value: {numerator: 100, denominator: HUNDRED}}
"#;

const ACTIONS: &str =
    "- actions:\n    - generic_key: {descriptor_key: client, descriptor_value: c}\n";

struct Options {
    seconds: f64,
    connections: usize,
    /// h2load drives the load instead of this process.
    h2load: bool,
}

impl Options {
    fn parse() -> Options {
        let args: Vec<String> = std::env::args().collect();
        let full = args.iter().any(|a| a == "--bench");
        let value = |name: &str| {
            args.iter()
                .position(|a| a == name)
                .and_then(|i| args.get(i + 1))
                .and_then(|v| v.parse::<f64>().ok())
        };
        Options {
            seconds: value("--seconds").unwrap_or(if full { 8.0 } else { 0.3 }),
            connections: value("--connections").map_or(32, |v| v as usize),
            h2load: match args.iter().position(|a| a == "--generator") {
                None => false,
                Some(i) => match args.get(i + 1).map(String::as_str) {
                    Some("h2load") => true,
                    Some("tokio") => false,
                    other => panic!("--generator {other:?}: tokio or h2load"),
                },
            },
        }
    }
}

/// `portcullis serve` on loopback, killed when dropped.
struct Portcullis {
    child: Child,
    grpc_port: u16,
}

impl Portcullis {
    fn start(rules: &Path, store_args: &[&str]) -> Portcullis {
        let (grpc_port, admin_port) = (free_port(), free_port());
        let child = Command::new(env!("CARGO_BIN_EXE_portcullis"))
            .arg("serve")
            .arg("--config")
            .arg(rules)
            .args(["--grpc-addr", &format!("127.0.0.1:{grpc_port}")])
            .args(["--admin-addr", &format!("127.0.0.1:{admin_port}")])
            .args(["--log-level", "warn"])
            .args(store_args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start portcullis");
        wait_until("portcullis to listen", Duration::from_secs(20), || {
            std::net::TcpStream::connect(("127.0.0.1", grpc_port)).is_ok()
        });
        Portcullis { child, grpc_port }
    }
}

impl Drop for Portcullis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One keep-alive HTTP/1.1 connection sending GETs back to back until `until`: the latency of
/// each, in microseconds. Any answer but 200 stops the run.
async fn connection(addr: SocketAddr, until: Instant) -> Vec<u32> {
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    let mut latencies = Vec::new();
    let mut line = String::new();
    while Instant::now() < until {
        let started = Instant::now();
        write
            .write_all(b"GET /v1 HTTP/1.1\r\nHost: gateway\r\n\r\n")
            .await
            .expect("send");
        let mut length = 0usize;
        let mut status = 0u16;
        loop {
            line.clear();
            read.read_line(&mut line).await.expect("read");
            if status == 0 {
                status = line
                    .split(' ')
                    .nth(1)
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(1);
            } else if line == "\r\n" {
                break;
            } else if let Some((k, v)) = line.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                length = v.trim().parse().expect("content-length");
            }
        }
        let mut body = vec![0; length];
        read.read_exact(&mut body).await.expect("body");
        assert_eq!(status, 200, "the gateway answered {status}: {body:?}");
        latencies.push(started.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
    }
    latencies
}

struct Row {
    label: &'static str,
    rps: f64,
    p50_ms: f64,
    p99_ms: f64,
    envoy_us: f64,
    portcullis_us: Option<f64>,
}

/// Load through `envoy` for the run's duration; Envoy's and Portcullis' CPU over it.
async fn measure(
    label: &'static str,
    g: &Gateway,
    envoy: &Envoy,
    portcullis: Option<&Portcullis>,
    options: &Options,
) -> Row {
    // Warm the connections and Envoy's pool to Portcullis, then measure.
    let warm = Instant::now() + Duration::from_millis(200);
    connection(g.ingress_addr(), warm).await;
    let (envoy_cpu, service_cpu) = (
        cpu_seconds(envoy.pid()),
        portcullis.map(|p| cpu_seconds(p.child.id())),
    );
    let (requests, elapsed, p50_ms, p99_ms) = if options.h2load {
        let (addr, seconds, connections) = (g.ingress_addr(), options.seconds, options.connections);
        let run =
            tokio::task::spawn_blocking(move || h2load::get(addr, "/v1", seconds, connections))
                .await
                .expect("h2load");
        assert_eq!(
            run.failed + run.not_2xx,
            0,
            "{label}: every answer the upstream's 200"
        );
        (run.succeeded as f64, run.seconds, run.mean_ms, f64::NAN)
    } else {
        let started = Instant::now();
        let until = started + Duration::from_secs_f64(options.seconds);
        let tasks: Vec<_> = (0..options.connections)
            .map(|_| tokio::spawn(connection(g.ingress_addr(), until)))
            .collect();
        let mut latencies = Vec::new();
        for task in tasks {
            latencies.extend(task.await.expect("load task"));
        }
        let elapsed = started.elapsed().as_secs_f64();
        latencies.sort_unstable();
        let at =
            |p: f64| latencies[((latencies.len() - 1) as f64 * p).round() as usize] as f64 / 1e3;
        (latencies.len() as f64, elapsed, at(0.5), at(0.99))
    };
    Row {
        label,
        rps: requests / elapsed,
        p50_ms,
        p99_ms,
        envoy_us: (cpu_seconds(envoy.pid()) - envoy_cpu) * 1e6 / requests,
        portcullis_us: portcullis
            .zip(service_cpu)
            .map(|(p, before)| (cpu_seconds(p.child.id()) - before) * 1e6 / requests),
    }
}

fn print(rows: &[Row], options: &Options) {
    let base = &rows[0];
    let generator = if options.h2load {
        "h2load (latency: its mean)"
    } else {
        "this process (latency: p50, p99)"
    };
    println!(
        "\ngateway: Envoy 1.40, one worker, {} keep-alive HTTP/1.1 connections, {} s a scenario, generator {generator}",
        options.connections, options.seconds
    );
    println!(
        "{:<34} {:>10} {:>7} {:>8} {:>8} {:>8} {:>12} {:>14}",
        "scenario", "req/s", "x none", "p50 ms", "p99 ms", "p99 x", "Envoy us/req", "Portcullis us"
    );
    let number = |v: f64| {
        if v.is_nan() {
            "-".to_owned()
        } else {
            format!("{v:.2}")
        }
    };
    for r in rows {
        println!(
            "{:<34} {:>10.0} {:>7.2} {:>8} {:>8} {:>8} {:>12.1} {:>14}",
            r.label,
            r.rps,
            r.rps / base.rps,
            number(r.p50_ms),
            number(r.p99_ms),
            number(r.p99_ms / base.p99_ms),
            r.envoy_us,
            r.portcullis_us.map_or("-".into(), |v| format!("{v:.1}")),
        );
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let options = Options::parse();
    let rules = tempfile::tempdir().expect("temp dir");
    std::fs::write(rules.path().join("gw.yaml"), RULES).expect("rules");
    let mut rows = Vec::new();

    // No rate limit filter: the gateway's own ceiling (a comment in place of the filter).
    let mut g = Gateway::new("gw", &[free_port()]);
    g.http_filters = "# no rate limit filter".into();
    let envoy = g.start();
    rows.push(measure("no rate limit filter", &g, &envoy, None, &options).await);
    drop(envoy);
    // Envoy's local rate limit: local enforcement's own cost.
    let mut g = Gateway::new("gw", &[free_port()]);
    g.http_filters = LOCAL_FILTER.into();
    let envoy = g.start();
    rows.push(measure("local_ratelimit (Envoy alone)", &g, &envoy, None, &options).await);
    drop(envoy);
    // The RLQS filter with no server listening: its fallback ALLOW_ALL, the ceiling.
    let mut g = Gateway::new("gw", &[free_port()]);
    g.http_filters = RLQS_FILTER.into();
    let envoy = g.start();
    rows.push(measure("rate_limit_quota, no server", &g, &envoy, None, &options).await);
    drop(envoy);

    let redis = RedisServer::start();
    let cluster = RedisCluster::start();
    let seeds = cluster.seeds().join(",");
    let redis_url = redis.url();
    let stores: [(&'static str, Vec<&str>); 4] = [
        ("ratelimit, memory", vec![]),
        (
            "ratelimit, standalone Redis",
            vec!["--store", "redis", "--redis-url", &redis_url],
        ),
        (
            "ratelimit, standalone Redis, hot counters claimed",
            vec![
                "--store",
                "redis",
                "--redis-url",
                &redis_url,
                "--hot-descriptor-rate",
                "100",
            ],
        ),
        (
            "ratelimit, Redis Cluster",
            vec!["--store", "redis", "--redis-cluster", &seeds],
        ),
    ];
    for (label, args) in stores {
        let portcullis = Portcullis::start(rules.path(), &args);
        let mut g = Gateway::new("gw", &[portcullis.grpc_port]);
        g.route_rate_limits = ACTIONS.into();
        // A decision late under saturation is still a decision: no failure mode in the figures.
        g.timeout = "2s".into();
        // And a failed call is a 500 that stops the run, not a quiet pass.
        g.failure_mode_deny = true;
        let envoy = g.start();
        rows.push(measure(label, &g, &envoy, Some(&portcullis), &options).await);
    }
    // RLQS: the gateway enforces its assignment; Portcullis sees a report every 5 s.
    let quota_stores: [(&'static str, Vec<&str>); 2] = [
        ("rate_limit_quota, memory", vec!["--rlqs"]),
        (
            "rate_limit_quota, Redis",
            vec!["--rlqs", "--store", "redis", "--redis-url", &redis_url],
        ),
    ];
    for (label, args) in quota_stores {
        let portcullis = Portcullis::start(rules.path(), &args);
        let mut g = Gateway::new("gw", &[portcullis.grpc_port]);
        g.http_filters = RLQS_FILTER.into();
        let envoy = g.start();
        rows.push(measure(label, &g, &envoy, Some(&portcullis), &options).await);
    }
    print(&rows, &options);
}
