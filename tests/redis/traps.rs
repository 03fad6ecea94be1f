//! No silent traps: a setting that cannot take effect is refused at start naming what the user
//! set (the variable when a variable set it), durations read as people write them, an empty rules
//! directory is an error unless asked for, `ask` speaks `host:port` and says OVER_LIMIT by its
//! exit code. Each through the real binary, the way a user meets it.

use crate::common;

use std::time::Duration;

use crate::common::cli::{dir_with, portcullis, portcullis_with_env, s};
use crate::common::process::ServeProcess;
use crate::common::redis::{RedisServer, free_port};

const RULES: &str =
    "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";

#[test]
fn a_redis_url_with_the_memory_store_is_refused_naming_what_was_set() {
    let rules = dir_with(&[("r.yaml", RULES)]);
    let config = s(rules.path());
    let (code, out) = portcullis_with_env(
        &["serve", "--config", config],
        &[("PORTCULLIS_REDIS_URL", "redis://127.0.0.1:6379")],
    );
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("PORTCULLIS_REDIS_URL set"), "{out}");
    assert!(out.contains("--store redis"), "{out}");
    let (code, out) = portcullis(&[
        "serve",
        "--config",
        config,
        "--redis-cluster",
        "127.0.0.1:7000",
        "--redis-pool-size",
        "4",
    ]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("--redis-cluster, --redis-pool-size set"),
        "{out}"
    );
}

/// Flags of a part that is switched off (RLQS without --rlqs, xDS without a server, the deny
/// cache on the memory store) are refused, each family naming what was set.
#[test]
fn flags_of_a_part_switched_off_are_refused_naming_them() {
    let rules = dir_with(&[("r.yaml", RULES)]);
    let config = s(rules.path());
    let (code, out) = portcullis_with_env(
        &["serve", "--config", config, "--rlqs-max-streams", "8"],
        &[("PORTCULLIS_RLQS_REPORTING_INTERVAL", "2s")],
    );
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(
            "--rlqs-max-streams, PORTCULLIS_RLQS_REPORTING_INTERVAL set, but --rlqs is off"
        ),
        "{out}"
    );
    let (code, out) = portcullis(&[
        "serve",
        "--config",
        config,
        "--rules-xds-node-id",
        "edge-1",
        "--deny-cache-max-age",
        "2s",
        "--hot-descriptor-rate",
        "100",
    ]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("--rules-xds-node-id set, but --rules-xds-server is not set"),
        "{out}"
    );
    assert!(
        out.contains("--deny-cache-max-age set, but the store is memory"),
        "{out}"
    );
    assert!(
        out.contains("--hot-descriptor-rate set, but the store is memory"),
        "{out}"
    );
    // With their switch on, the same flags are taken.
    let server = ServeProcess::spawn(
        rules.path(),
        &["--rlqs", "--rlqs-max-streams", "8"],
        &[("PORTCULLIS_RLQS_REPORTING_INTERVAL", "2s".to_owned())],
        &[],
    );
    drop(server);
}

/// RLQS grants claim their part of a rule beside its counters in the main Redis; a per-second
/// Redis holds the per-second counters where those claims are not: RLS calls there would spend
/// a second's budget the gateways were already granted. Refused, naming what was set.
#[test]
fn rlqs_with_a_per_second_redis_is_refused_naming_both() {
    let rules = dir_with(&[("r.yaml", RULES)]);
    let config = s(rules.path());
    let (code, out) = portcullis_with_env(
        &[
            "serve",
            "--config",
            config,
            "--store",
            "redis",
            "--redis-url",
            "redis://127.0.0.1:1",
            "--redis-per-second-url",
            "redis://127.0.0.1:2",
        ],
        &[("PORTCULLIS_RLQS", "true")],
    );
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("PORTCULLIS_RLQS set with --redis-per-second-url"),
        "{out}"
    );
    // Go mode's REDIS_PERSECOND is the same trap.
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("current/ratelimit/config");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("d.yaml"), RULES).unwrap();
    let runtime = root.path().join("current").display().to_string();
    let (code, out) = portcullis_with_env(
        &["serve", "--rlqs"],
        &[
            ("PORTCULLIS_ENV_COMPAT", "go"),
            ("RUNTIME_ROOT", &runtime),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("USE_STATSD", "false"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "127.0.0.1:1"),
            ("REDIS_PERSECOND", "true"),
            ("REDIS_PERSECOND_SOCKET_TYPE", "tcp"),
            ("REDIS_PERSECOND_URL", "127.0.0.1:2"),
        ],
    );
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("--rlqs set with REDIS_PERSECOND"), "{out}");
}

#[test]
fn a_bad_value_from_a_variable_names_the_variable() {
    for (var, value, words) in [
        ("PORTCULLIS_ADMIN_JSON", "1", "invalid value '1'"),
        ("PORTCULLIS_DRAIN_PERIOD", "30", "no unit"),
        ("OTEL_TRACES_SAMPLER", "jaeger_remote", "invalid value"),
    ] {
        let (code, out) = portcullis_with_env(&["serve"], &[(var, value)]);
        assert_eq!(code, 2, "{var}: {out}");
        assert!(
            out.contains(&format!("{var} (the variable of")),
            "{var}: {out}"
        );
        assert!(out.contains(words), "{var}: {out}");
    }
    // The same value on the command line names the flag.
    let (code, out) = portcullis(&["serve", "--drain-period", "30"]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("'--drain-period <DRAIN_PERIOD>'"), "{out}");
    assert!(!out.contains("PORTCULLIS_DRAIN_PERIOD"), "{out}");
}

#[test]
fn durations_take_the_units_people_write() {
    let rules = dir_with(&[("r.yaml", RULES)]);
    // Go's 24h and 1h30m, and a minute, start a server.
    let server = ServeProcess::spawn(
        rules.path(),
        &[
            "--grpc-max-connection-age",
            "24h",
            "--grpc-max-connection-age-grace",
            "1m",
            "--reload-interval",
            "45m30s",
            "--drain-period",
            "0.5s",
        ],
        &[],
        &[],
    );
    drop(server);
    // A setting checked against its range names the variable that set it.
    let (code, out) = portcullis_with_env(
        &["serve", "--config", s(rules.path())],
        &[("PORTCULLIS_STORE_TIMEOUT", "2m")],
    );
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("PORTCULLIS_STORE_TIMEOUT 120s must be between"),
        "{out}"
    );
}

#[test]
fn an_empty_rules_directory_is_an_error_unless_asked_for() {
    let empty = dir_with(&[("sub/r.yaml", RULES)]);
    let dir = s(empty.path());
    let (code, out) = portcullis(&["check", dir]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("holds no rules"), "{out}");
    assert!(out.contains("one level down"), "{out}");
    assert!(out.contains(&format!("{dir}/sub")), "{out}");
    let (code, out) = portcullis(&["check", "--config", dir, "--allow-empty-rules"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("warning:"), "{out}");

    let (code, out) = portcullis(&["serve", "--config", dir]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("holds no rules"), "{out}");
    assert!(out.contains("--allow-empty-rules"), "{out}");
    let (code, out) = portcullis_with_env(
        &["serve", "--config", dir],
        &[("PORTCULLIS_CONFIG", "ignored")],
    );
    assert_eq!(code, 1, "{out}");
    // Started on purpose, it serves (and says so).
    let server = ServeProcess::spawn(empty.path(), &["--allow-empty-rules"], &[], &[]);
    assert!(server.log().contains("holds no rules"), "{}", server.log());
}

#[test]
fn check_and_test_take_the_rules_directory_as_serve_does() {
    let rules = dir_with(&[("r.yaml", RULES)]);
    let tests = dir_with(&[(
        "t.yaml",
        "cases:\n  - name: one an hour\n    domain: d\n    descriptor: [user=a]\n    steps:\n      - {repeat: 2, allowed: 1}\n",
    )]);
    let (code, out) = portcullis(&["check", "--config", s(rules.path())]);
    assert_eq!(code, 0, "{out}");
    let (code, out) = portcullis_with_env(&["check"], &[("PORTCULLIS_CONFIG", s(rules.path()))]);
    assert_eq!(code, 0, "{out}");
    let (code, out) = portcullis(&["test", "--config", s(rules.path()), s(tests.path())]);
    assert_eq!(code, 0, "{out}");
    let (code, out) = portcullis(&["test", s(rules.path()), s(tests.path())]);
    assert_eq!(code, 0, "{out}");
    let (code, out) = portcullis(&["test", s(rules.path())]);
    assert_eq!(code, 2, "{out}");
}

#[test]
fn ask_takes_host_and_port_and_says_over_limit_by_its_exit_code() {
    let rules = dir_with(&[("r.yaml", RULES)]);
    let server = ServeProcess::spawn(rules.path(), &[], &[], &[]);
    let addr = format!("127.0.0.1:{}", server.grpc_port);
    let ask = |addr: &str| portcullis(&["ask", "--addr", addr, "--domain", "d", "-d", "user=a"]);
    let (code, out) = ask(&addr);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("overall: OK"), "{out}");
    let (code, out) = ask(&format!("http://{addr}"));
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("overall: OVER_LIMIT"), "{out}");
    drop(server);
    let (code, out) = ask(&format!("127.0.0.1:{}", free_port()));
    assert_eq!(code, 2, "{out}");
}

/// An evicting Redis policy is valid but hands budgets back when Redis is full: warned at start.
#[test]
fn an_evicting_redis_is_warned_about_at_start() {
    let redis = RedisServer::start_with(&["--maxmemory-policy", "volatile-lru"]);
    let rules = dir_with(&[("r.yaml", RULES)]);
    let server = ServeProcess::spawn(
        rules.path(),
        &["--store", "redis", "--redis-url", &redis.url()],
        &[],
        &[],
    );
    common::redis::wait_until(
        "the start-up probe of Redis",
        Duration::from_secs(10),
        || server.log().contains("maxmemory_policy"),
    );
    let log = server.log();
    assert!(log.contains("volatile-lru"), "{log}");
    assert!(log.contains("noeviction"), "{log}");
}

/// With `--rlqs`, the quota service is in gRPC health like the RLS service: SERVING while ready,
/// NOT_SERVING once a drain starts (a health check written for it would otherwise see NOT_FOUND).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_rlqs_the_quota_service_is_in_grpc_health() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    const RLQS: &str = "envoy.service.rate_limit_quota.v3.RateLimitQuotaService";
    let rules = dir_with(&[("r.yaml", RULES)]);
    let server = ServeProcess::spawn(rules.path(), &["--rlqs", "--drain-period", "3s"], &[], &[]);
    let channel = tonic::transport::Channel::from_shared(server.grpc_url())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let health = HealthClient::new(channel);
    let status = || {
        let mut health = health.clone();
        async move {
            health
                .check(HealthCheckRequest {
                    service: RLQS.into(),
                })
                .await
                .map(|r| r.into_inner().status)
        }
    };
    assert_eq!(status().await.unwrap(), ServingStatus::Serving as i32);
    server.signal("TERM");
    let start = std::time::Instant::now();
    while status().await.unwrap() != ServingStatus::NotServing as i32 {
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "still SERVING in the drain"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// With Redis down and neither RLQS nor runtime scaling in use, the log says what the docs
/// promise and no more: at most a line a second for failed calls and one for failed connections,
/// nothing from the RLQS or scaling readers; in the Go drop-in mode too.
#[test]
fn a_redis_outage_logs_only_what_is_promised() {
    let rules = dir_with(&[("r.yaml", RULES)]);
    for go_mode in [false, true] {
        let mut redis = RedisServer::start();
        let url = redis.url();
        let server = if go_mode {
            ServeProcess::spawn_as_ratelimit(&[
                ("GRPC_PORT", free_port().to_string()),
                ("DEBUG_PORT", free_port().to_string()),
                ("PORT", free_port().to_string()),
                ("USE_STATSD", "false".into()),
                ("REDIS_SOCKET_TYPE", "tcp".into()),
                ("REDIS_URL", url.trim_start_matches("redis://").to_owned()),
                (
                    "RUNTIME_ROOT",
                    rules.path().parent().unwrap().display().to_string(),
                ),
                (
                    "RUNTIME_SUBDIRECTORY",
                    s(rules.path()).rsplit('/').next().unwrap().to_owned(),
                ),
                ("RUNTIME_APPDIRECTORY", ".".into()),
                ("LOG_LEVEL", "warn".into()),
            ])
        } else {
            let args = [
                "--store",
                "redis",
                "--redis-url",
                &url,
                "--log-level",
                "warn",
            ];
            ServeProcess::spawn(rules.path(), &args, &[], &[])
        };
        let addr = format!("127.0.0.1:{}", server.grpc_port);
        let ask = || portcullis(&["ask", "--addr", &addr, "--domain", "d", "-d", "user=u"]);
        assert_ne!(ask().0, 2, "answered while Redis is up");
        let before = server.log().lines().count();
        redis.kill();
        let started = std::time::Instant::now();
        for _ in 0..30 {
            ask();
            std::thread::sleep(Duration::from_millis(100));
        }
        let seconds = started.elapsed().as_secs_f64().ceil() as usize;
        let log = server.log();
        let lines: Vec<&str> = log
            .lines()
            .skip(before)
            .filter(|l| l.contains("WARN") || l.contains("ERROR"))
            .collect();
        let said = lines.join("\n");
        assert!(!lines.is_empty(), "the outage was not logged at all");
        assert!(
            lines.len() <= 2 * (seconds + 1),
            "{} lines in {seconds} s:\n{said}",
            lines.len()
        );
        assert!(!said.contains("RLQS"), "go mode {go_mode}:\n{said}");
        assert!(!said.contains("scaling"), "go mode {go_mode}:\n{said}");
    }
}

/// `--rlqs-burst` (the share a gateway's bucket holds) is checked at start: out of range, or
/// set without `--rlqs`, it is refused naming it.
#[test]
fn an_rlqs_burst_that_cannot_take_effect_is_refused_naming_it() {
    let rules = dir_with(&[("r.yaml", RULES)]);
    let config = s(rules.path());
    let (code, out) = portcullis(&["serve", "--config", config, "--rlqs", "--rlqs-burst", "0s"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("--rlqs-burst 0ns must be between"), "{out}");
    let (code, out) = portcullis(&["serve", "--config", config, "--rlqs-burst", "200ms"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("--rlqs-burst set, but --rlqs is off"), "{out}");
}
