//! The load benchmark: real gRPC load against the `portcullis` binary on each store, and in the
//! same run, with the same generator and concurrency, the ceilings it is compared with:
//!
//! - a null gRPC server (this file, re-executed with `--null-server`) that answers OK at once:
//!   the most a tonic service can answer on this machine;
//! - `redis-benchmark` running EVALSHA of a minimal GCRA script: the least Redis CPU a decision
//!   that reads TIME and writes one key can cost.
//!
//! Per scenario it prints decisions/s, latency percentiles, the service's CPU per decision (from
//! `/proc/PID/stat`), Redis' CPU per decision (`INFO commandstats`), and each as a ratio to its
//! ceiling. Every answer is checked (a gRPC error or a wrong code fails the run), and so are the
//! service's own counters against the generator's count.
//!
//!   cargo bench --bench load                       every store and scenario, 8 s each
//!   cargo bench --bench load -- --seconds 3 --only memory,standalone --scenario "fixed window"
//!   cargo bench --bench load -- --compare 641ff13=/path/to/old/portcullis
//!   cargo bench --bench load -- --generator h2load    h2load drives the unpaced rows
//!   cargo test --bench load                        a short smoke run (checks it works)
//!
//! `--compare LABEL=PATH` (repeatable) runs another build of `portcullis` beside this one, each on
//! its own store processes, scenario by scenario in turn (this build, then each other, so that a
//! drift of the shared machine falls on both), and prints each one's ratios to this build;
//! `--rounds N` measures every scenario N times in turn and gives the median of the N ratios
//! (a shared 2-core machine moves any one figure by ±10%).

#[path = "support/cpu.rs"]
mod cpu;
#[path = "support/h2load.rs"]
#[allow(dead_code)]
mod h2load;
#[path = "../tests/common/redis.rs"]
mod harness;

use cpu::cpu_seconds;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use harness::{RedisCluster, RedisServer, cli, free_port};
use portcullis::pb::rate_limit_response::Code;
use portcullis::pb::{
    RateLimitDescriptor, RateLimitRequest, RateLimitResponse, RateLimitService,
    RateLimitServiceClient, RateLimitServiceServer, rate_limit_descriptor,
};
use tonic::transport::Channel;

const RULES: &str = r#"
domain: bench
descriptors:
  - key: sw
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: tb
    rate_limit: {unit: second, requests_per_unit: 1000000000, algorithm: token_bucket, burst: 1000000000}
  - key: fw
    rate_limit: {unit: second, requests_per_unit: 1000000000, algorithm: fixed_window}
  - key: deny
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: a
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: b
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: c
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000000000}
"#;

/// A 10-line GCRA decision: TIME, GET, SET PX. The Redis ceiling: what one decision per script
/// call costs at the least.
const MINIMAL_SCRIPT: &str = "local t = redis.call('TIME') \
local now = tonumber(t[1]) * 1000000 + tonumber(t[2]) \
local emission = tonumber(ARGV[2]) \
local tat = tonumber(redis.call('GET', KEYS[1]) or now) \
if tat < now then tat = now end \
local new = tat + emission \
if new - now > tonumber(ARGV[1]) * emission then return 0 end \
redis.call('SET', KEYS[1], string.format('%.0f', new), 'PX', math.ceil((new - now) / 1000) + 1) \
return 1";

#[derive(Clone, Copy, Debug, PartialEq)]
enum Scenario {
    /// One descriptor per call on one key, every call allowed: (label, key).
    One(&'static str, &'static str),
    /// One hot key, every call refused.
    Denied,
    /// Three descriptors per call, every call allowed.
    Three,
    /// One descriptor per call over this many distinct values, every call allowed.
    ManyKeys(u64),
    /// A concurrency rule: calls alternate a hold and its release (a request through Envoy is
    /// both), over 1000 values, every call allowed.
    Concurrency,
}

impl Scenario {
    fn label(self) -> String {
        match self {
            Scenario::One(label, _) => format!("one descriptor, {label}"),
            Scenario::Denied => "one hot key, denied".into(),
            Scenario::Three => "three descriptors".into(),
            Scenario::ManyKeys(n) => format!("{}k distinct keys", n / 1000),
            Scenario::Concurrency => "concurrency, a hold and a release".into(),
        }
    }

    fn request(self, i: u64) -> RateLimitRequest {
        let descriptor = |key: &str, value: String| RateLimitDescriptor {
            entries: vec![rate_limit_descriptor::Entry {
                key: key.into(),
                value,
            }],
            limit: None,
            hits_addend: None,
            is_negative_hits: false,
        };
        let descriptors = match self {
            Scenario::One(_, key) => vec![descriptor(key, "x".into())],
            Scenario::Denied => vec![descriptor("deny", "x".into())],
            Scenario::Three => ["a", "b", "c"]
                .iter()
                .map(|k| descriptor(k, "x".into()))
                .collect(),
            Scenario::ManyKeys(n) => vec![descriptor("user", (i % n).to_string())],
            Scenario::Concurrency => {
                let mut slot = descriptor("cc", (i / 2 % 1000).to_string());
                slot.is_negative_hits = i % 2 == 1;
                vec![slot]
            }
        };
        RateLimitRequest {
            domain: self.domain().into(),
            descriptors,
            hits_addend: 0,
        }
    }

    /// Checks one answer; the reason when it is wrong.
    fn verify(self, answer: &RateLimitResponse) -> Result<(), String> {
        let want = match self {
            Scenario::Denied => Code::OverLimit,
            _ => Code::Ok,
        };
        if answer.overall_code == want as i32 {
            Ok(())
        } else {
            Err(format!(
                "overall code {} (want {want:?})",
                answer.overall_code
            ))
        }
    }

    /// The rules domain it calls: the concurrency rule has its own file, written only when no
    /// build is compared (an older build refuses the algorithm).
    fn domain(self) -> &'static str {
        if self == Scenario::Concurrency {
            "bench_cc"
        } else {
            "bench"
        }
    }

    /// Rule hits (and refunds) one call adds to the service's counters.
    fn descriptors(self) -> u64 {
        if self == Scenario::Three { 3 } else { 1 }
    }
}

const ALL: [Scenario; 7] = [
    Scenario::One("sliding window", "sw"),
    Scenario::One("token bucket", "tb"),
    Scenario::One("fixed window", "fw"),
    Scenario::Denied,
    Scenario::Three,
    Scenario::ManyKeys(100_000),
    Scenario::Concurrency,
];

/// The concurrency scenario's rule: slots to spare (a release that overtakes its hold frees
/// nothing, and its hold's lease ends by itself).
const CONCURRENCY_RULES: &str = "domain: bench_cc
descriptors:
  - key: cc
    rate_limit: {algorithm: concurrency, requests_per_unit: 1000, unit: minute, max_duration: 10s}
";

struct Options {
    full: bool,
    seconds: f64,
    connections: usize,
    streams: usize,
    only: Option<Vec<String>>,
    /// Only the scenarios whose label contains this.
    scenario: Option<String>,
    /// The builds measured: this one first, then each `--compare LABEL=PATH`.
    binaries: Vec<(String, PathBuf)>,
    /// How many times each scenario is measured, the builds in turn each time.
    rounds: usize,
    /// `--generator h2load`: h2load drives the unpaced rows of one request shape.
    h2load: bool,
}

/// This build, then every `--compare LABEL=PATH`.
fn binaries(args: &[String]) -> Vec<(String, PathBuf)> {
    let mut out = vec![(
        "this build".to_owned(),
        PathBuf::from(env!("CARGO_BIN_EXE_portcullis")),
    )];
    for (i, arg) in args.iter().enumerate() {
        if arg != "--compare" {
            continue;
        }
        let given = args.get(i + 1).expect("--compare LABEL=PATH");
        let (label, path) = given
            .split_once('=')
            .unwrap_or_else(|| panic!("--compare {given:?}: want LABEL=PATH"));
        let path = PathBuf::from(path);
        assert!(path.is_file(), "--compare {label}: no file at {path:?}");
        out.push((label.to_owned(), path));
    }
    out
}

impl Options {
    fn parse() -> Options {
        let args: Vec<String> = std::env::args().collect();
        let full = args.iter().any(|a| a == "--bench");
        let value = |name: &str| {
            args.iter()
                .position(|a| a == name)
                .and_then(|i| args.get(i + 1).cloned())
        };
        Options {
            full,
            seconds: value("--seconds")
                .and_then(|v| v.parse().ok())
                .unwrap_or(if full { 8.0 } else { 0.3 }),
            connections: value("--connections")
                .and_then(|v| v.parse().ok())
                .unwrap_or(4),
            streams: value("--streams")
                .and_then(|v| v.parse().ok())
                .unwrap_or(32),
            only: value("--only").map(|v| v.split(',').map(str::to_owned).collect()),
            scenario: value("--scenario"),
            binaries: binaries(&args),
            rounds: value("--rounds")
                .and_then(|v| v.parse().ok())
                .unwrap_or(1)
                .max(1),
            h2load: match value("--generator").as_deref() {
                None | Some("tonic") => false,
                Some("h2load") => true,
                Some(other) => panic!("--generator {other:?}: tonic or h2load"),
            },
        }
    }

    fn wants(&self, store: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|only| only.iter().any(|o| o == store))
    }
}

/// The service or the null server, as a child process on loopback ports.
struct Server {
    child: Child,
    grpc: SocketAddr,
    admin: Option<SocketAddr>,
    log: PathBuf,
}

impl Server {
    fn wait_listening(&mut self) {
        let start = Instant::now();
        while TcpStream::connect(self.grpc).is_err() {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "server exited ({status}): {}",
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                );
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "server not listening"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn portcullis(binary: &Path, dir: &Path, store_args: &[String]) -> Server {
        let (grpc, admin) = (free_port(), free_port());
        let log = dir.join(format!("portcullis-{grpc}.log"));
        let child = Command::new(binary)
            .arg("serve")
            .arg("--config")
            .arg(dir.join("rules"))
            .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
            .args(["--admin-addr", &format!("127.0.0.1:{admin}")])
            // A decision late under saturation is still a decision: the failure mode must not
            // answer in the benchmark (it is checked to have answered nothing).
            .args(["--store-timeout", "2s", "--log-level", "warn"])
            .args(store_args)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("start portcullis");
        let mut server = Server {
            child,
            grpc: ([127, 0, 0, 1], grpc).into(),
            admin: Some(([127, 0, 0, 1], admin).into()),
            log,
        };
        server.wait_listening();
        server
    }

    fn null(dir: &Path) -> Server {
        let grpc = free_port();
        let log = dir.join("null.log");
        let child = Command::new(std::env::current_exe().expect("own path"))
            .args(["--null-server", &grpc.to_string()])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("start the null server");
        let mut server = Server {
            child,
            grpc: ([127, 0, 0, 1], grpc).into(),
            admin: None,
            log,
        };
        server.wait_listening();
        server
    }

    fn cpu_seconds(&self) -> f64 {
        cpu_seconds(self.child.id())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn http_get(addr: SocketAddr, path: &str) -> String {
    let mut stream = TcpStream::connect(addr).expect("admin listener");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).unwrap();
    raw.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default()
}

/// Sums the samples of `name` (any labels) whose label text contains `with`.
fn metric(text: &str, name: &str, with: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter(|l| l.contains(with))
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
        .sum()
}

/// (calls, usec) of script commands (EVALSHA and EVAL) on the nodes at `ports`.
fn script_stats(ports: &[u16]) -> (f64, f64) {
    let mut calls = 0.0;
    let mut usec = 0.0;
    for port in ports {
        for line in cli(*port, &["INFO", "commandstats"]).lines() {
            if !(line.starts_with("cmdstat_evalsha:") || line.starts_with("cmdstat_eval:")) {
                continue;
            }
            for field in line.split_once(':').map_or("", |(_, f)| f).split(',') {
                match field.split_once('=') {
                    Some(("calls", v)) => calls += v.parse::<f64>().unwrap_or(0.0),
                    Some(("usec", v)) => usec += v.parse::<f64>().unwrap_or(0.0),
                    _ => {}
                }
            }
        }
    }
    (calls, usec)
}

fn redis_pid(port: u16) -> u32 {
    cli(port, &["INFO", "server"])
        .lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("redis process_id")
}

#[derive(Default)]
struct Tally {
    calls: u64,
    wrong: u64,
    errors: u64,
    first_problem: Option<String>,
    latencies_us: Vec<u32>,
}

impl Tally {
    fn merge(&mut self, other: Tally) {
        self.calls += other.calls;
        self.wrong += other.wrong;
        self.errors += other.errors;
        if self.first_problem.is_none() {
            self.first_problem = other.first_problem;
        }
        self.latencies_us.extend(other.latencies_us);
    }

    fn percentile(&self, p: f64) -> f64 {
        if self.latencies_us.is_empty() {
            return 0.0;
        }
        let at = ((self.latencies_us.len() as f64 - 1.0) * p).round() as usize;
        self.latencies_us[at] as f64 / 1000.0
    }
}

/// Drives `scenario` for `duration` over `channels`, `streams` calls in flight on each; with
/// `rate`, paced to that many calls per second in total (each loop sends on its own schedule).
async fn drive(
    channels: &[Channel],
    streams: usize,
    scenario: Scenario,
    duration: Duration,
    rate: Option<f64>,
) -> (Tally, Duration) {
    let counter = Arc::new(AtomicU64::new(0));
    let loops = channels.len() * streams;
    let start = tokio::time::Instant::now();
    let end = start + duration;
    let tasks: Vec<_> = (0..loops)
        .map(|n| {
            let mut client = RateLimitServiceClient::new(channels[n % channels.len()].clone());
            let counter = counter.clone();
            tokio::spawn(async move {
                let mut tally = Tally::default();
                let mut own = 0u64;
                let period = rate.map(|r| Duration::from_secs_f64(loops as f64 / r));
                // Spread the paced loops over one period so they do not fire together.
                let mut next =
                    start + period.map_or(Duration::ZERO, |p| p * n as u32 / loops as u32);
                loop {
                    if period.is_some() {
                        tokio::time::sleep_until(next).await;
                    }
                    // Latency counts from the actual send: tokio's timer fires up to a
                    // millisecond late, which is the generator's delay, not the service's. A
                    // generator that falls behind shows as a rate below the one asked for.
                    let sent = tokio::time::Instant::now();
                    if sent >= end || (period.is_some() && next >= end) {
                        break;
                    }
                    let i = if scenario == Scenario::Concurrency {
                        // A hold, then its release on the same loop (as a request's stream end
                        // follows its start); the pairs of the loops spread over the values.
                        let pair = own / 2 * loops as u64 + n as u64;
                        own += 1;
                        pair * 2 + (own - 1) % 2
                    } else {
                        counter.fetch_add(1, Ordering::Relaxed)
                    };
                    let answer = client.should_rate_limit(scenario.request(i)).await;
                    tally
                        .latencies_us
                        .push(sent.elapsed().as_micros().min(u32::MAX as u128) as u32);
                    tally.calls += 1;
                    match answer {
                        Ok(answer) => {
                            if let Err(problem) = scenario.verify(&answer.into_inner()) {
                                tally.wrong += 1;
                                tally.first_problem.get_or_insert(problem);
                            }
                        }
                        Err(status) => {
                            tally.errors += 1;
                            tally.first_problem.get_or_insert(status.to_string());
                        }
                    }
                    if let Some(period) = period {
                        next += period;
                    }
                }
                tally
            })
        })
        .collect();
    let mut tally = Tally::default();
    for task in tasks {
        tally.merge(task.await.expect("generator task"));
    }
    tally.latencies_us.sort_unstable();
    (tally, start.elapsed())
}

async fn connect(addr: SocketAddr, connections: usize) -> Vec<Channel> {
    let mut channels = Vec::new();
    for _ in 0..connections {
        // One endpoint each: separate HTTP/2 connections, as several Envoy workers make.
        channels.push(
            Channel::from_shared(format!("http://{addr}"))
                .unwrap()
                .tcp_nodelay(true)
                .connect()
                .await
                .expect("connect"),
        );
    }
    channels
}

/// One measured run.
struct Row {
    binary: String,
    round: usize,
    store: String,
    scenario: String,
    decisions_per_s: f64,
    p50: f64,
    p99: f64,
    p999: f64,
    server_us: f64,
    redis_us: Option<f64>,
    redis_us_per_script: Option<f64>,
    check: String,
}

struct Target<'a> {
    binary: &'a str,
    name: &'a str,
    server: &'a Server,
    redis_ports: Vec<u16>,
}

async fn measure(
    target: &Target<'_>,
    scenario: Scenario,
    options: &Options,
    rate: Option<f64>,
) -> Row {
    // h2load sends one request body: only the scenarios of one request shape.
    let one_shape = !matches!(scenario, Scenario::ManyKeys(_) | Scenario::Concurrency);
    if options.h2load && rate.is_none() && one_shape {
        return measure_h2load(target, scenario, options);
    }
    let channels = connect(target.server.grpc, options.connections).await;
    // Warm up: connections made, scripts loaded, allocator settled.
    let warm = Duration::from_secs_f64((options.seconds / 8.0).clamp(0.1, 1.0));
    let _ = drive(&channels, options.streams, scenario, warm, None).await;

    let metrics_before = target.server.admin.map(|a| http_get(a, "/metrics"));
    let cpu_before = target.server.cpu_seconds();
    let redis_before = script_stats(&target.redis_ports);
    let (tally, elapsed) = drive(
        &channels,
        options.streams,
        scenario,
        Duration::from_secs_f64(options.seconds),
        rate,
    )
    .await;
    let cpu = target.server.cpu_seconds() - cpu_before;
    let redis_after = script_stats(&target.redis_ports);
    let decisions = tally.calls.max(1) as f64;

    let mut problems = Vec::new();
    if tally.errors + tally.wrong > 0 {
        problems.push(format!(
            "{} errors, {} wrong answers (first: {})",
            tally.errors,
            tally.wrong,
            tally.first_problem.clone().unwrap_or_default()
        ));
    }
    if let (Some(before), Some(admin)) = (metrics_before, target.server.admin) {
        let after = http_get(admin, "/metrics");
        let delta =
            |name: &str, with: &str| metric(&after, name, with) - metric(&before, name, with);
        let calls = delta("portcullis_grpc_calls_total", "");
        if calls as u64 != tally.calls {
            problems.push(format!(
                "the service counted {calls} calls, the generator {}",
                tally.calls
            ));
        }
        let domain = format!("domain=\"{}\"", scenario.domain());
        let hits = delta("portcullis_rule_hits_total", &domain)
            + delta("portcullis_rule_refunded_total", &domain);
        let want = tally.calls * scenario.descriptors();
        if hits as u64 != want {
            problems.push(format!("the service counted {hits} rule hits, want {want}"));
        }
        let failure_mode = delta("portcullis_failure_mode_answers_total", "");
        if failure_mode > 0.0 {
            problems.push(format!("{failure_mode} answers by the failure mode"));
        }
    }
    let (redis_us, redis_us_per_script) = redis_cost(target, redis_before, redis_after, decisions);
    Row {
        binary: target.binary.into(),
        round: 0,
        store: target.name.into(),
        scenario: match rate {
            Some(r) => format!("{} at {:.0}/s", scenario.label(), r),
            None => scenario.label(),
        },
        decisions_per_s: tally.calls as f64 / elapsed.as_secs_f64(),
        p50: tally.percentile(0.50),
        p99: tally.percentile(0.99),
        p999: tally.percentile(0.999),
        server_us: cpu * 1e6 / decisions,
        redis_us,
        redis_us_per_script,
        check: verdict(&problems),
    }
}

/// Redis' µs per decision and per script call between two `script_stats` readings (none
/// without Redis).
fn redis_cost(
    target: &Target<'_>,
    before: (f64, f64),
    after: (f64, f64),
    decisions: f64,
) -> (Option<f64>, Option<f64>) {
    if target.redis_ports.is_empty() {
        return (None, None);
    }
    let usec = after.1 - before.1;
    let scripts = (after.0 - before.0).max(1.0);
    (Some(usec / decisions), Some(usec / scripts))
}

/// A row's check: "ok", or what was wrong.
fn verdict(problems: &[String]) -> String {
    if problems.is_empty() {
        "ok".into()
    } else {
        problems.join("; ")
    }
}

/// One unpaced run driven by h2load: its answers are checked by the service's counters (h2load
/// sees only HTTP statuses), and the decisions are the calls the service counted.
fn measure_h2load(target: &Target<'_>, scenario: Scenario, options: &Options) -> Row {
    use prost::Message;
    let dir = tempfile::tempdir().expect("temp dir");
    let body = h2load::frame(&scenario.request(0).encode_to_vec());
    let path = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
    let go = |seconds: f64| {
        let grpc = target.server.grpc;
        let (c, m) = (options.connections, options.streams);
        h2load::run(dir.path(), grpc, path, &body, seconds, c, m)
    };
    let _ = go((options.seconds / 8.0).clamp(1.0, 2.0));
    let metrics_before = target.server.admin.map(|a| http_get(a, "/metrics"));
    let cpu_before = target.server.cpu_seconds();
    let redis_before = script_stats(&target.redis_ports);
    let run = go(options.seconds);
    let cpu = target.server.cpu_seconds() - cpu_before;
    let redis_after = script_stats(&target.redis_ports);
    let mut problems = Vec::new();
    if run.failed > 0 {
        problems.push(format!("{} requests failed or errored", run.failed));
    }
    // The service also answers calls h2load stops waiting for at its deadline: at most what
    // was in flight.
    let in_flight = (options.connections * options.streams) as f64;
    let mut calls = run.succeeded as f64;
    if let (Some(before), Some(admin)) = (metrics_before, target.server.admin) {
        let after = http_get(admin, "/metrics");
        let delta =
            |name: &str, with: &str| metric(&after, name, with) - metric(&before, name, with);
        calls = delta("portcullis_grpc_calls_total", "");
        if calls < run.succeeded as f64 || calls > run.succeeded as f64 + in_flight {
            problems.push(format!(
                "the service counted {calls} calls, h2load {} answered",
                run.succeeded
            ));
        }
        let hits = delta("portcullis_rule_hits_total", "domain=\"bench\"");
        let want = calls * scenario.descriptors() as f64;
        let (right, name) = match scenario {
            Scenario::Denied => ("portcullis_rule_over_limit_total", "refused"),
            _ => ("portcullis_rule_within_limit_total", "admitted"),
        };
        let answered = delta(right, "domain=\"bench\"");
        if hits != want || answered != want {
            problems.push(format!(
                "the service counted {hits} rule hits and {answered} {name}, want {want}"
            ));
        }
        let failure_mode = delta("portcullis_failure_mode_answers_total", "");
        if failure_mode > 0.0 {
            problems.push(format!("{failure_mode} answers by the failure mode"));
        }
    }
    let decisions = calls.max(1.0);
    let (redis_us, redis_us_per_script) = redis_cost(target, redis_before, redis_after, decisions);
    Row {
        binary: target.binary.into(),
        round: 0,
        store: target.name.into(),
        scenario: scenario.label(),
        decisions_per_s: calls / run.seconds,
        // h2load gives a mean, no percentiles.
        p50: run.mean_ms,
        p99: f64::NAN,
        p999: f64::NAN,
        server_us: cpu * 1e6 / decisions,
        redis_us,
        redis_us_per_script,
        check: verdict(&problems),
    }
}

/// `redis-benchmark` EVALSHA of the minimal script on its own Redis: (calls/s, µs per call).
fn redis_ceiling(options: &Options) -> (f64, f64) {
    let redis = RedisServer::start();
    let sha = cli(redis.port, &["SCRIPT", "LOAD", MINIMAL_SCRIPT]);
    assert_eq!(sha.len(), 40, "SCRIPT LOAD answered {sha:?}");
    let requests = if options.full { 400_000 } else { 5_000 };
    cli(redis.port, &["CONFIG", "RESETSTAT"]);
    let out = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &redis.port.to_string()])
        .args(["-c", &(options.connections * options.streams).to_string()])
        .args(["-n", &requests.to_string(), "-r", "100000", "--csv"])
        .args(["EVALSHA", &sha, "1", "k:__rand_int__", "1000000000", "1"])
        .output()
        .expect("run redis-benchmark (Debian: redis-tools)");
    let text = String::from_utf8_lossy(&out.stdout);
    // --csv: a header line, then "name","rps",...
    let rps = text
        .lines()
        .filter(|l| l.contains("EVALSHA"))
        .find_map(|l| l.split(',').nth(1))
        .and_then(|v| v.trim_matches('"').parse::<f64>().ok())
        .unwrap_or_else(|| panic!("redis-benchmark output: {text}"));
    let (calls, usec) = script_stats(&[redis.port]);
    assert!(
        calls >= requests as f64,
        "the minimal script ran {calls} times"
    );
    (rps, usec / calls)
}

fn print(rows: &[Row], null: &Row, ceiling: (f64, f64), generator_is_h2load: bool) {
    println!();
    println!(
        "Redis ceiling: redis-benchmark EVALSHA of a minimal GCRA script, {:.0} calls/s, {:.2} µs of Redis CPU per call",
        ceiling.0, ceiling.1
    );
    println!(
        "gRPC ceiling: a null tonic server, {:.0} calls/s, {:.1} µs of server CPU per call",
        null.decisions_per_s, null.server_us
    );
    if generator_is_h2load {
        println!(
            "Generator: h2load for the unpaced rows of one request shape (p50 holds h2load's mean; no percentiles), tonic for the rest"
        );
    }
    println!();
    // × memory: against the same build's memory store on one descriptor.
    let memory_one = |binary: &str| {
        rows.iter()
            .find(|r| r.binary == binary && r.store == "memory" && r.scenario == ALL[0].label())
            .map(|r| r.decisions_per_s)
    };
    println!(
        "| build | store | scenario | decisions/s | × null | × memory | p50 ms | p99 ms | p99.9 ms | server µs/decision | × null | Redis µs/decision | Redis µs/script call | × minimal script | check |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        let opt =
            |v: Option<f64>, digits: usize| v.map_or("—".to_owned(), |v| format!("{v:.digits$}"));
        println!(
            "| {} | {} | {} | {:.0} | {:.2} | {} | {:.2} | {:.2} | {:.2} | {:.1} | {:.2} | {} | {} | {} | {} |",
            r.binary,
            r.store,
            r.scenario,
            r.decisions_per_s,
            r.decisions_per_s / null.decisions_per_s,
            opt(memory_one(&r.binary).map(|m| r.decisions_per_s / m), 2),
            r.p50,
            r.p99,
            r.p999,
            r.server_us,
            r.server_us / null.server_us,
            opt(r.redis_us, 2),
            opt(r.redis_us_per_script, 2),
            opt(r.redis_us.map(|u| u / ceiling.1), 2),
            r.check
        );
    }
    print_comparison(rows);
}

/// Each other build's figures as ratios of this build's (below 1: this build spends less, or
/// answers fewer decisions a second): the median over the rounds, and their range.
fn print_comparison(rows: &[Row]) {
    let mut groups: Vec<(&str, &str, &str)> = Vec::new();
    for r in rows.iter().filter(|r| r.binary != "this build") {
        let group = (r.store.as_str(), r.scenario.as_str(), r.binary.as_str());
        if !groups.contains(&group) {
            groups.push(group);
        }
    }
    if groups.is_empty() {
        return;
    }
    println!();
    println!(
        "| store | scenario | this build ÷ | rounds | decisions/s | server µs/decision | Redis µs/decision |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (store, scenario, other) in groups {
        let pairs: Vec<(&Row, &Row)> = rows
            .iter()
            .filter(|r| r.binary == other && r.store == store && r.scenario == scenario)
            .filter_map(|o| {
                rows.iter()
                    .find(|t| {
                        t.binary == "this build"
                            && t.store == store
                            && t.scenario == scenario
                            && t.round == o.round
                    })
                    .map(|t| (t, o))
            })
            .collect();
        // A paced row's label names its own rate: it has no pair.
        if pairs.is_empty() {
            continue;
        }
        let summary = |ratio: &dyn Fn(&Row, &Row) -> Option<f64>| {
            let mut values: Vec<f64> = pairs.iter().filter_map(|(t, o)| ratio(t, o)).collect();
            if values.is_empty() {
                return "—".to_owned();
            }
            values.sort_by(f64::total_cmp);
            let median = values[values.len() / 2];
            if values.len() == 1 {
                format!("{median:.2}")
            } else {
                format!(
                    "{median:.2} ({:.2}–{:.2})",
                    values[0],
                    values[values.len() - 1]
                )
            }
        };
        println!(
            "| {store} | {scenario} | {other} | {} | {} | {} | {} |",
            pairs.len(),
            summary(&|t, o| Some(t.decisions_per_s / o.decisions_per_s)),
            summary(&|t, o| Some(t.server_us / o.server_us)),
            summary(&|t, o| Some(t.redis_us? / o.redis_us?)),
        );
    }
}

/// Starts a store's processes and the given build of the service on it: the service, the Redis ports to read
/// statistics from, and what must live as long as the run (the Redis processes).
type StartStore = dyn Fn(&Path) -> (Server, Vec<u16>, Box<dyn std::any::Any>);

fn null_server(port: u16) {
    #[derive(Default)]
    struct Null;
    #[tonic::async_trait]
    impl RateLimitService for Null {
        async fn should_rate_limit(
            &self,
            _request: tonic::Request<RateLimitRequest>,
        ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
            Ok(tonic::Response::new(RateLimitResponse {
                overall_code: Code::Ok as i32,
                ..Default::default()
            }))
        }
    }
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        tonic::transport::Server::builder()
            .add_service(RateLimitServiceServer::new(Null))
            .serve(([127, 0, 0, 1], port).into())
            .await
            .expect("null server");
    });
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--null-server") {
        null_server(args[i + 1].parse().expect("port"));
        return;
    }
    let options = Options::parse();
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::create_dir(dir.path().join("rules")).unwrap();
    std::fs::write(dir.path().join("rules/bench.yaml"), RULES).unwrap();
    let comparing = options.binaries.len() > 1;
    if !comparing {
        std::fs::write(dir.path().join("rules/cc.yaml"), CONCURRENCY_RULES).unwrap();
    }
    let scenarios: Vec<Scenario> = if options.full {
        ALL.to_vec()
    } else {
        vec![ALL[0], Scenario::Three]
    }
    .into_iter()
    .filter(|s| !(comparing && *s == Scenario::Concurrency))
    .filter(|s| {
        options
            .scenario
            .as_ref()
            .is_none_or(|want| s.label().contains(want.as_str()))
    })
    .collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut rows = Vec::new();

    let null = Server::null(dir.path());
    let null_target = Target {
        binary: "null server",
        name: "null server",
        server: &null,
        redis_ports: Vec::new(),
    };
    let null_row = runtime.block_on(measure(&null_target, ALL[0], &options, None));
    if options.full {
        // The generator's own latency floor at half the ceiling's rate.
        let half = null_row.decisions_per_s / 2.0;
        let row = runtime.block_on(measure(&null_target, ALL[0], &options, Some(half)));
        eprintln!("null server: {}: p99 {:.2} ms", row.scenario, row.p99);
        rows.push(row);
    }
    drop(null);
    assert_eq!(null_row.check, "ok", "the null server: {}", null_row.check);
    let ceiling = redis_ceiling(&options);

    let mut stores: Vec<(&str, Box<StartStore>)> = Vec::new();
    let path = dir.path().to_path_buf();
    if options.wants("memory") {
        let path = path.clone();
        stores.push((
            "memory",
            Box::new(move |binary| {
                let server = Server::portcullis(binary, &path, &[]);
                (server, Vec::new(), Box::new(()))
            }),
        ));
    }
    if options.wants("standalone") {
        let path = path.clone();
        stores.push((
            "standalone Redis",
            Box::new(move |binary| {
                let redis = RedisServer::start();
                let args = ["--store", "redis", "--redis-url", &redis.url()].map(String::from);
                let server = Server::portcullis(binary, &path, &args);
                (server, vec![redis.port], Box::new(redis))
            }),
        ));
    }
    if options.wants("cluster") {
        let path = path.clone();
        stores.push((
            "Redis Cluster (3 masters)",
            Box::new(move |binary| {
                let cluster = RedisCluster::start_with_replicas(0);
                let seeds = cluster.seeds().join(",");
                let args = ["--store", "redis", "--redis-cluster", &seeds].map(String::from);
                let server = Server::portcullis(binary, &path, &args);
                let ports = cluster.nodes.iter().map(|n| n.port).collect();
                (server, ports, Box::new(cluster))
            }),
        ));
    }

    for (name, start) in stores {
        // Every build on its own processes, started together and driven in turn.
        let started: Vec<_> = options
            .binaries
            .iter()
            .map(|(label, binary)| {
                let (server, redis_ports, keep) = start(binary);
                // Redis processes' CPU, for the record (commandstats is the script's own).
                let redis_pids: Vec<u32> = redis_ports.iter().map(|p| redis_pid(*p)).collect();
                let redis_cpu_before: f64 = redis_pids.iter().map(|p| cpu_seconds(*p)).sum();
                (
                    label,
                    server,
                    redis_ports,
                    keep,
                    redis_pids,
                    redis_cpu_before,
                )
            })
            .collect();
        let targets: Vec<Target> = started
            .iter()
            .map(|(label, server, ports, ..)| Target {
                binary: label,
                name,
                server,
                redis_ports: ports.clone(),
            })
            .collect();
        let mut peaks = vec![None; targets.len()];
        for scenario in &scenarios {
            for round in 0..options.rounds {
                for (target, peak) in targets.iter().zip(&mut peaks) {
                    let mut row = runtime.block_on(measure(target, *scenario, &options, None));
                    row.round = round;
                    if *scenario == ALL[0] && round == 0 {
                        *peak = Some(row.decisions_per_s);
                    }
                    eprintln!(
                        "{} / {name}: {} (round {}): {:.0}/s {}",
                        target.binary,
                        row.scenario,
                        round + 1,
                        row.decisions_per_s,
                        row.check
                    );
                    rows.push(row);
                }
            }
        }
        // Latency where it matters: at half the peak rate.
        for (target, peak) in targets.iter().zip(&peaks) {
            if let (Some(peak), true) = (peak, options.full) {
                let row = runtime.block_on(measure(target, ALL[0], &options, Some(peak / 2.0)));
                eprintln!(
                    "{} / {name}: {}: p99 {:.2} ms {}",
                    target.binary, row.scenario, row.p99, row.check
                );
                rows.push(row);
            }
        }
        for (label, _, _, _, redis_pids, before) in &started {
            if !redis_pids.is_empty() {
                let used = redis_pids.iter().map(|p| cpu_seconds(*p)).sum::<f64>() - before;
                eprintln!("{label} / {name}: redis-server processes used {used:.1} s of CPU");
            }
        }
    }
    print(&rows, &null_row, ceiling, options.h2load);
    let failed: Vec<&Row> = rows.iter().filter(|r| r.check != "ok").collect();
    assert!(
        failed.is_empty(),
        "wrong answers or counts: {:?}",
        failed
            .iter()
            .map(|r| format!("{} / {} / {}: {}", r.binary, r.store, r.scenario, r.check))
            .collect::<Vec<_>>()
    );
}
