//! One measured row: a scenario run against one build and store by either generator, with the
//! service's and Redis' CPU per decision; and Redis' ceiling (redis-benchmark on the minimal
//! script). A row with a problem says so in its verdict, never passes it silently.

use super::*;

/// One measured run.
pub struct Row {
    pub binary: String,
    pub round: usize,
    pub store: String,
    pub scenario: String,
    pub decisions_per_s: f64,
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    pub server_us: f64,
    pub redis_us: Option<f64>,
    pub redis_us_per_script: Option<f64>,
    /// CPU of the redis-server processes (`/proc/PID/stat`, user + system) per decision: the
    /// script and the rest (reading requests, writing replies), never time the process waited
    /// for a core (commandstats' `usec` is wall time inside the command).
    pub redis_cpu_us: Option<f64>,
    pub check: String,
}

pub struct Target<'a> {
    pub binary: &'a str,
    pub name: &'a str,
    pub server: &'a Server,
    pub redis_ports: Vec<u16>,
    pub redis_pids: Vec<u32>,
}

/// The redis-server processes' CPU seconds so far.
pub fn redis_cpu(target: &Target<'_>) -> f64 {
    target.redis_pids.iter().map(|p| cpu_seconds(*p)).sum()
}

/// µs of the redis-server processes' CPU per decision between two `redis_cpu` readings (none
/// without Redis).
pub fn redis_cpu_per(target: &Target<'_>, before: f64, decisions: f64) -> Option<f64> {
    (!target.redis_pids.is_empty()).then(|| (redis_cpu(target) - before) * 1e6 / decisions)
}

pub async fn measure(
    target: &Target<'_>,
    scenario: Scenario,
    options: &Options,
    rate: Option<f64>,
) -> Row {
    // h2load sends one request body: only the scenarios of one request shape.
    let one_shape = !matches!(
        scenario,
        Scenario::ManyKeys(..)
            | Scenario::NewKeys(..)
            | Scenario::Concurrency
            | Scenario::AtLimit(..)
    );
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
    let redis_cpu_before = redis_cpu(target);
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
    // A row at its limit: what its whole seconds admitted, by when each answer arrived (an
    // answer a few milliseconds late counts in the next second: a second may show a little
    // more than the limit and its neighbour as much less; the tests hold the exact bound).
    let mut admitted = String::new();
    if matches!(scenario, Scenario::AtLimit(..)) {
        let per = tally.admitted_per_second();
        if let (Some(least), Some(most)) = (per.first(), per.last()) {
            admitted = format!(
                " (admitted per second: least {least}, median {}, most {most} of {AT_LIMIT})",
                per[per.len() / 2]
            );
        }
    }
    let (redis_us, redis_us_per_script) = redis_cost(target, redis_before, redis_after, decisions);
    let redis_cpu_us = redis_cpu_per(target, redis_cpu_before, decisions);
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
        redis_cpu_us,
        check: verdict(&problems) + &admitted,
    }
}

/// Redis' µs per decision and per script call between two `script_stats` readings (none
/// without Redis).
pub fn redis_cost(
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
pub fn verdict(problems: &[String]) -> String {
    if problems.is_empty() {
        "ok".into()
    } else {
        problems.join("; ")
    }
}

/// One unpaced run driven by h2load: its answers are checked by the service's counters (h2load
/// sees only HTTP statuses), and the decisions are the calls the service counted.
pub fn measure_h2load(target: &Target<'_>, scenario: Scenario, options: &Options) -> Row {
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
    let redis_cpu_before = redis_cpu(target);
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
    let redis_cpu_us = redis_cpu_per(target, redis_cpu_before, decisions);
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
        redis_cpu_us,
        check: verdict(&problems),
    }
}

/// `redis-benchmark` EVALSHA of the minimal script on its own Redis: (calls/s, µs per call).
pub fn redis_ceiling(options: &Options) -> (f64, f64) {
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
