//! The binary run as envoyproxy/ratelimit's image runs it: `/bin/ratelimit`, no flags, the Go
//! service's environment variables. Each test gives it a Go-style environment for one Redis
//! layout and checks what a Deployment written for the Go service relies on: the config tree
//! under RUNTIME_ROOT, the ports (GRPC_PORT, PORT with /healthcheck and /json, DEBUG_PORT with
//! /rlconfig), fixed-window counting, and the Go service's stat names over statsd and Prometheus.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::process::ServeProcess;
use common::redis::{RedisCluster, RedisSentinel, RedisServer, cli, free_port};
use common::request;
use portcullis::pb::RateLimitServiceClient;
use portcullis::pb::rate_limit_response::Code;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

/// Three calls a day per user: the Go service's file format, no `algorithm` (so fixed window).
const RULES: &str = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: day\n      requests_per_unit: 3\n";

/// The Go config tree: RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY (default `config`).
fn config_tree() -> tempfile::TempDir {
    let root = tempfile::tempdir().expect("temp dir");
    let dir = root.path().join("current/ratelimit/config");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("edge.yaml"), RULES).unwrap();
    root
}

/// The variables every test sets: loopback listeners on free ports, the runtime tree, no statsd
/// (the Go default would send to localhost:8125).
fn go_env(root: &Path) -> Vec<(&'static str, String)> {
    vec![
        ("HOST", "127.0.0.1".into()),
        ("PORT", free_port().to_string()),
        ("GRPC_HOST", "127.0.0.1".into()),
        ("GRPC_PORT", free_port().to_string()),
        ("DEBUG_HOST", "127.0.0.1".into()),
        ("DEBUG_PORT", free_port().to_string()),
        (
            "RUNTIME_ROOT",
            root.join("current").to_string_lossy().into_owned(),
        ),
        ("RUNTIME_SUBDIRECTORY", "ratelimit".into()),
        ("USE_STATSD", "false".into()),
        ("LOG_LEVEL", "info".into()),
    ]
}

fn var(envs: &[(&str, String)], name: &str) -> u16 {
    envs.iter()
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.parse().unwrap())
        .unwrap()
}

use common::http;

/// Waits past a UTC day boundary if one is under a minute away, so the day's fixed window cannot
/// turn over in the middle of a test.
fn clear_of_day_boundary() {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let left = 86_400 - now.as_secs() % 86_400;
    if left < 60 {
        std::thread::sleep(Duration::from_secs(left + 1));
    }
}

/// What a Go deployment relies on, against whichever Redis `envs` names: three calls admitted,
/// the fourth refused (fixed window), the Go endpoints on the Go ports.
async fn serves_like_the_go_service(server: &ServeProcess, envs: &[(&str, String)], user: &str) {
    clear_of_day_boundary();
    // Kubernetes sends traffic once the readiness probe (the Go Deployment's /healthcheck) says
    // Redis answered; a call before that is answered by the failure mode, as it should be.
    let port = var(envs, "PORT");
    let mut ready = false;
    for _ in 0..200 {
        if http(port, "GET", "/healthcheck", "").await.0 == 200 {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ready, "ready within 10 s: {}", server.log());
    let mut client = RateLimitServiceClient::connect(server.grpc_url())
        .await
        .expect("connect to GRPC_PORT");
    let mut codes = Vec::new();
    for _ in 0..4 {
        let answer = client
            .should_rate_limit(request("edge", &[&[("user", user)]]))
            .await
            .unwrap_or_else(|e| panic!("call failed: {e}\n{}", server.log()))
            .into_inner();
        codes.push(answer.overall_code);
    }
    assert_eq!(codes, [OK, OK, OK, OVER], "{}", server.log());

    assert_eq!(
        http(port, "GET", "/healthcheck", "").await,
        (200, "OK".into())
    );
    let body = format!(
        r#"{{"domain":"edge","descriptors":[{{"entries":[{{"key":"user","value":"{user}"}}]}}]}}"#
    );
    let (status, answer) = http(port, "POST", "/json", &body).await;
    assert_eq!(status, 429, "{answer}");
    assert!(answer.contains("OVER_LIMIT"), "{answer}");

    let (status, listing) = http(var(envs, "DEBUG_PORT"), "GET", "/rlconfig", "").await;
    assert_eq!(status, 200);
    assert!(listing.contains("edge.user"), "{listing}");
    let (status, stats) = http(var(envs, "DEBUG_PORT"), "GET", "/stats", "").await;
    assert_eq!(status, 200);
    assert!(
        stats
            .lines()
            .any(|l| l == "ratelimit.service.rate_limit.edge.user.over_limit: 2"),
        "{stats}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_redis_on_a_unix_socket_with_a_user_and_key_prefix() {
    let root = config_tree();
    let socket = root.path().join("redis.sock");
    let socket_text = socket.to_string_lossy().into_owned();
    let redis = RedisServer::start_with(&["--unixsocket", &socket_text, "--unixsocketperm", "700"]);
    cli(
        redis.port,
        &["ACL", "SETUSER", "limiter", "on", ">s3cret", "~*", "+@all"],
    );
    let mut envs = go_env(root.path());
    // REDIS_SOCKET_TYPE defaults to unix, REDIS_TYPE to SINGLE: a path is enough.
    envs.extend([
        ("REDIS_URL", socket_text.clone()),
        ("REDIS_AUTH", "limiter:s3cret".into()),
        ("CACHE_KEY_PREFIX", "gw_".into()),
        ("RUNTIME_WATCH_ROOT", "false".into()),
    ]);
    let server = ServeProcess::spawn_as_ratelimit(&envs);
    serves_like_the_go_service(&server, &envs, "alice").await;

    let keys = cli(redis.port, &["KEYS", "*"]);
    assert!(
        keys.starts_with("gw_{edge|user=alice}:fw:"),
        "one fixed-window counter under the prefix, got {keys:?}"
    );
    assert!(
        cli(redis.port, &["CLIENT", "LIST"]).contains("user=limiter"),
        "REDIS_AUTH's user is the one connected"
    );
    assert!(
        server.log().contains("RUNTIME_WATCH_ROOT"),
        "an ignored variable is logged: {}",
        server.log()
    );
}

/// The Go service has no RLQS: in Go mode without it, a Redis outage is logged as the store's
/// failure only, never as anything about RLQS (a replica used to log that it could not read
/// the RLQS reservations every second; there is no such read any more).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_outage_in_go_mode_says_nothing_about_rlqs() {
    let root = config_tree();
    let mut redis = RedisServer::start();
    let mut envs = go_env(root.path());
    envs.extend([
        ("REDIS_SOCKET_TYPE", "tcp".into()),
        ("REDIS_URL", format!("127.0.0.1:{}", redis.port)),
    ]);
    let server = ServeProcess::spawn_as_ratelimit(&envs);
    serves_like_the_go_service(&server, &envs, "dave").await;
    redis.kill();
    let mut client = RateLimitServiceClient::connect(server.grpc_url())
        .await
        .expect("connect to GRPC_PORT");
    // Calls meet the outage until it is logged (bounded), then three seconds more: three rounds
    // of anything that runs each second.
    let mut logged = false;
    for _ in 0..50 {
        let _ = client
            .should_rate_limit(request("edge", &[&[("user", "erin")]]))
            .await;
        if server.log().contains("ERROR") || server.log().contains("WARN") {
            logged = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(logged, "the outage is logged: {}", server.log());
    tokio::time::sleep(Duration::from_secs(3)).await;
    let log = server.log();
    assert!(!log.contains("RLQS"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_redis_named_by_master_and_sentinels() {
    let root = config_tree();
    let setup = RedisSentinel::start();
    let mut envs = go_env(root.path());
    envs.extend([
        ("REDIS_SOCKET_TYPE", "tcp".into()),
        ("REDIS_TYPE", "SENTINEL".into()),
        (
            "REDIS_URL",
            format!("mymaster,{}", setup.sentinel_addrs().join(",")),
        ),
    ]);
    let server = ServeProcess::spawn_as_ratelimit(&envs);
    serves_like_the_go_service(&server, &envs, "bob").await;
    assert!(
        cli(setup.master.port, &["KEYS", "*"]).contains("{edge|user=bob}:fw:"),
        "the counter is on the master the sentinels name"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_redis_from_seed_nodes() {
    let root = config_tree();
    let cluster = RedisCluster::start();
    let mut envs = go_env(root.path());
    envs.extend([
        ("REDIS_SOCKET_TYPE", "tcp".into()),
        ("REDIS_TYPE", "CLUSTER".into()),
        ("REDIS_URL", cluster.seeds().join(",")),
    ]);
    let server = ServeProcess::spawn_as_ratelimit(&envs);
    serves_like_the_go_service(&server, &envs, "carol").await;
    let owner = cluster.master_of("edge|user=carol");
    assert!(
        cli(owner, &["KEYS", "*"]).contains("{edge|user=carol}:fw:"),
        "the counter is on the node owning its hash tag"
    );
}

/// Adds up `name:N|c` lines from the statsd packets on `socket` until `want` holds or 10 s pass.
fn statsd_counts(
    socket: &std::net::UdpSocket,
    want: impl Fn(&BTreeMap<String, i64>) -> bool,
) -> BTreeMap<String, i64> {
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut counts = BTreeMap::new();
    let start = Instant::now();
    let mut buf = [0u8; 65_536];
    while !want(&counts) && start.elapsed() < Duration::from_secs(10) {
        let Ok(n) = socket.recv(&mut buf) else {
            continue;
        };
        for line in String::from_utf8_lossy(&buf[..n]).lines() {
            if let Some((name, rest)) = line.split_once(':')
                && let Some(value) = rest.strip_suffix("|c")
            {
                *counts.entry(name.to_owned()).or_insert(0) += value.parse::<i64>().unwrap();
            }
        }
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_stat_names_over_statsd_and_prometheus() {
    let root = config_tree();
    let redis = RedisServer::start();
    let statsd = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let prometheus = free_port();
    let mut envs = go_env(root.path());
    envs.retain(|(k, _)| *k != "USE_STATSD");
    envs.extend([
        ("REDIS_SOCKET_TYPE", "tcp".into()),
        ("REDIS_URL", format!("127.0.0.1:{}", redis.port)),
        // USE_STATSD defaults to true.
        ("STATSD_HOST", "127.0.0.1".into()),
        (
            "STATSD_PORT",
            statsd.local_addr().unwrap().port().to_string(),
        ),
        ("STATS_FLUSH_INTERVAL", "100ms".into()),
        ("USE_PROMETHEUS", "true".into()),
        ("PROMETHEUS_ADDR", format!("127.0.0.1:{prometheus}")),
        ("PROMETHEUS_PATH", "/metrics".into()),
    ]);
    let server = ServeProcess::spawn_as_ratelimit(&envs);
    serves_like_the_go_service(&server, &envs, "dave").await;

    let hits = "ratelimit.service.rate_limit.edge.user.total_hits";
    let over = "ratelimit.service.rate_limit.edge.user.over_limit";
    // Four gRPC calls and one /json call.
    let counts = statsd_counts(&statsd, |c| {
        c.get(hits) == Some(&5) && c.get(over) == Some(&2)
    });
    assert_eq!(counts.get(hits), Some(&5), "{counts:?}");
    assert_eq!(counts.get(over), Some(&2), "{counts:?}");

    let (status, text) = http(prometheus, "GET", "/metrics", "").await;
    assert_eq!(status, 200);
    for series in [
        r#"ratelimit_service_rate_limit_total_hits{domain="edge",key1="user"} 5"#,
        r#"ratelimit_service_rate_limit_over_limit{domain="edge",key1="user"} 2"#,
        r#"ratelimit_service_rate_limit_within_limit{domain="edge",key1="user"} 3"#,
    ] {
        assert!(text.lines().any(|l| l == series), "{series} in:\n{text}");
    }
}

/// Envoy Gateway's rate limit Deployment with Prometheus on: USE_PROMETHEUS, PROMETHEUS_ADDR and
/// PROMETHEUS_MAPPER_YAML naming its statsd_exporter mapping. The binary starts (it refused the
/// variable before) and serves the series the mapping makes; what the mapping drops is absent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_gateways_prometheus_mapping_is_served() {
    let root = config_tree();
    let redis = RedisServer::start();
    let prometheus = free_port();
    let mapping = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/envoy-gateway-statsd-mapping.yaml"
    );
    let mut envs = go_env(root.path());
    envs.extend([
        ("REDIS_SOCKET_TYPE", "tcp".into()),
        ("REDIS_URL", format!("127.0.0.1:{}", redis.port)),
        ("USE_PROMETHEUS", "true".into()),
        ("PROMETHEUS_ADDR", format!("127.0.0.1:{prometheus}")),
        ("PROMETHEUS_MAPPER_YAML", mapping.into()),
    ]);
    let server = ServeProcess::spawn_as_ratelimit(&envs);
    serves_like_the_go_service(&server, &envs, "erin").await;
    let (status, text) = http(prometheus, "GET", "/metrics", "").await;
    assert_eq!(status, 200);
    for series in [
        r#"ratelimit_service_rate_limit_total_hits{domain="edge",key1="user"} 5"#,
        r#"ratelimit_service_rate_limit_over_limit{domain="edge",key1="user"} 2"#,
        r#"ratelimit_service_total_requests{grpc_method="ShouldRateLimit"} 4"#,
        r#"ratelimit_service_config_load_success 1"#,
    ] {
        assert!(text.lines().any(|l| l == series), "{series} in:\n{text}");
    }
    assert!(
        text.lines().any(|l| l.starts_with(
            r#"ratelimit_service_response_time_seconds_count{grpc_method="ShouldRateLimit"}"#
        )),
        "{text}"
    );
    // Not in the mapping: dropped by its catch-all (the default mapping would export it).
    assert!(!text.contains("near_limit"), "{text}");

    // A mapping that does not parse stops the start, naming the file.
    let broken = root.path().join("broken.yaml");
    std::fs::write(
        &broken,
        "mappings:\n  - match: \"a.(\"\n    match_type: regex\n    name: x\n",
    )
    .unwrap();
    let mut envs = go_env(root.path());
    envs.extend([
        ("REDIS_SOCKET_TYPE", "tcp".into()),
        ("REDIS_URL", format!("127.0.0.1:{}", redis.port)),
        ("USE_PROMETHEUS", "true".into()),
        ("PROMETHEUS_ADDR", format!("127.0.0.1:{}", free_port())),
        ("PROMETHEUS_MAPPER_YAML", broken.display().to_string()),
    ]);
    let (_dir, mut command) = ServeProcess::ratelimit_command(&envs);
    let out = command.output().expect("run");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("broken.yaml"), "{stderr}");
}

/// Every statsd line (`name:value|c...`) received on `socket` until one for `name_prefix`
/// arrives or 10 s pass.
fn statsd_lines(socket: &std::net::UdpSocket, name_prefix: &str) -> Vec<String> {
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut lines = Vec::new();
    let start = Instant::now();
    let mut buf = [0u8; 65_536];
    while !lines.iter().any(|l: &String| l.starts_with(name_prefix))
        && start.elapsed() < Duration::from_secs(10)
    {
        if let Ok(n) = socket.recv(&mut buf) {
            lines.extend(
                String::from_utf8_lossy(&buf[..n])
                    .lines()
                    .map(str::to_owned),
            );
        }
    }
    lines
}

/// EXTRA_TAGS tags every statsd counter as the Go service does: in the name
/// (`.__key=value`, keys sorted, `.:|` in values as `_`), or as DogStatsD tags with
/// USE_DOG_STATSD.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extra_tags_tag_every_statsd_counter_as_go_does() {
    let root = config_tree();
    let redis = RedisServer::start();
    let hits = "ratelimit.service.rate_limit.edge.user.total_hits";
    for dog in [false, true] {
        let statsd = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut envs = go_env(root.path());
        envs.retain(|(k, _)| *k != "USE_STATSD");
        envs.extend([
            ("REDIS_SOCKET_TYPE", "tcp".into()),
            ("REDIS_URL", format!("127.0.0.1:{}", redis.port)),
            ("STATSD_HOST", "127.0.0.1".into()),
            (
                "STATSD_PORT",
                statsd.local_addr().unwrap().port().to_string(),
            ),
            ("STATS_FLUSH_INTERVAL", "100ms".into()),
            ("EXTRA_TAGS", "release:v1.2,commit:abc".into()),
            ("USE_DOG_STATSD", dog.to_string()),
        ]);
        let server = ServeProcess::spawn_as_ratelimit(&envs);
        let mut client = RateLimitServiceClient::connect(server.grpc_url())
            .await
            .expect("connect");
        client
            .should_rate_limit(request("edge", &[&[("user", "tagged")]]))
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", server.log()));
        let lines = statsd_lines(&statsd, hits);
        let want = if dog {
            format!("{hits}:1|c|#commit:abc,release:v1_2")
        } else {
            format!("{hits}.__commit=abc.__release=v1_2:1|c")
        };
        assert!(
            lines.contains(&want),
            "{want} not among {lines:?}\n{}",
            server.log()
        );
    }
}

#[test]
fn a_go_variable_that_cannot_be_honoured_stops_the_start_naming_it() {
    let root = config_tree();
    let mut envs = go_env(root.path());
    envs.push(("BACKEND_TYPE", "memcache".into()));
    envs.push(("SHADOW_MODE", "maybe".into()));
    let (_link, mut cmd) = ServeProcess::ratelimit_command(&envs);
    let out = cmd.output().expect("run ratelimit");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("BACKEND_TYPE") && err.contains("memcache") && err.contains("SHADOW_MODE"),
        "{err}"
    );
    // Nothing listens: it stopped before serving.
    assert!(std::net::TcpStream::connect(("127.0.0.1", var(&envs, "GRPC_PORT"))).is_err());
}

#[test]
fn serve_env_compat_go_reads_the_same_environment() {
    let root = config_tree();
    let mut envs = go_env(root.path());
    envs.push(("REDIS_TYPE", "MEMCACHED".into()));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_portcullis"))
        .args(["serve", "--env-compat", "go"])
        .env_clear()
        .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .expect("run portcullis");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("REDIS_TYPE"), "{err}");
}

/// Every variable envoyproxy/ratelimit's settings read (its `src/settings/settings.go`), plus
/// `RUNTIME_SUBDIRECTORY`, which its runtime loader reads.
const GO_VARIABLES: &[&str] = &[
    "HOST",
    "PORT",
    "DEBUG_HOST",
    "DEBUG_PORT",
    "GRPC_UDS",
    "GRPC_HOST",
    "GRPC_PORT",
    "GRPC_MAX_CONNECTION_AGE",
    "GRPC_MAX_CONNECTION_AGE_GRACE",
    "GRPC_SERVER_USE_TLS",
    "GRPC_SERVER_TLS_CERT",
    "GRPC_SERVER_TLS_KEY",
    "GRPC_CLIENT_TLS_CACERT",
    "GRPC_CLIENT_TLS_SAN",
    "LOG_LEVEL",
    "LOG_FORMAT",
    "CONFIG_TYPE",
    "FORCE_START_WITHOUT_INITIAL_CONFIG",
    "CONFIG_GRPC_XDS_NODE_ID",
    "CONFIG_GRPC_XDS_NODE_METADATA",
    "CONFIG_GRPC_XDS_SERVER_URL",
    "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
    "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
    "CONFIG_GRPC_XDS_SERVER_USE_TLS",
    "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
    "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
    "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
    "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
    "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
    "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
    "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
    "XDS_CLIENT_BACKOFF_JITTER",
    "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
    "USE_DOG_STATSD",
    "USE_DOG_STATSD_MOGRIFIERS",
    "USE_STATSD",
    "STATSD_HOST",
    "STATSD_PORT",
    "EXTRA_TAGS",
    "STATS_FLUSH_INTERVAL",
    "DISABLE_STATS",
    "USE_PROMETHEUS",
    "PROMETHEUS_ADDR",
    "PROMETHEUS_PATH",
    "PROMETHEUS_MAPPER_YAML",
    "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
    "RUNTIME_ROOT",
    "RUNTIME_SUBDIRECTORY",
    "RUNTIME_APPDIRECTORY",
    "RUNTIME_IGNOREDOTFILES",
    "RUNTIME_WATCH_ROOT",
    "EXPIRATION_JITTER_MAX_SECONDS",
    "LOCAL_CACHE_SIZE_IN_BYTES",
    "NEAR_LIMIT_RATIO",
    "CACHE_KEY_PREFIX",
    "BACKEND_TYPE",
    "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
    "LIMIT_RESPONSE_HEADERS_ENABLED",
    "LIMIT_LIMIT_HEADER",
    "LIMIT_REMAINING_HEADER",
    "LIMIT_RESET_HEADER",
    "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
    "REDIS_SOCKET_TYPE",
    "REDIS_TYPE",
    "REDIS_URL",
    "REDIS_POOL_SIZE",
    "REDIS_AUTH",
    "REDIS_TLS",
    "REDIS_TLS_CLIENT_CERT",
    "REDIS_TLS_CLIENT_KEY",
    "REDIS_TLS_CACERT",
    "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
    "REDIS_PIPELINE_WINDOW",
    "REDIS_PIPELINE_LIMIT",
    "REDIS_CLUSTER_PIPELINE_PARALLELISM",
    "REDIS_PERSECOND",
    "REDIS_PERSECOND_SOCKET_TYPE",
    "REDIS_PERSECOND_TYPE",
    "REDIS_PERSECOND_URL",
    "REDIS_PERSECOND_POOL_SIZE",
    "REDIS_PERSECOND_AUTH",
    "REDIS_PERSECOND_TLS",
    "REDIS_SENTINEL_AUTH",
    "REDIS_PERSECOND_SENTINEL_AUTH",
    "REDIS_PERSECOND_PIPELINE_WINDOW",
    "REDIS_PERSECOND_PIPELINE_LIMIT",
    "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM",
    "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
    "REDIS_TIMEOUT",
    "REDIS_PERSECOND_TIMEOUT",
    "REDIS_POOL_ON_EMPTY_BEHAVIOR",
    "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR",
    "REDIS_STARTUP_INITIAL_INTERVAL",
    "REDIS_STARTUP_MAX_INTERVAL",
    "REDIS_STARTUP_MAX_ELAPSED_TIME",
    "MEMCACHE_HOST_PORT",
    "MEMCACHE_MAX_IDLE_CONNS",
    "MEMCACHE_SRV",
    "MEMCACHE_SRV_REFRESH",
    "MEMCACHE_TLS",
    "MEMCACHE_TLS_CLIENT_CERT",
    "MEMCACHE_TLS_CLIENT_KEY",
    "MEMCACHE_TLS_CACERT",
    "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION",
    "SHADOW_MODE",
    "QUOTA_MODE",
    "RESPONSE_DYNAMIC_METADATA",
    "MERGE_DOMAIN_CONFIG",
    "TRACING_ENABLED",
    "TRACING_SERVICE_NAME",
    "TRACING_SERVICE_NAMESPACE",
    "TRACING_SERVICE_INSTANCE_ID",
    "TRACING_EXPORTER_PROTOCOL",
    "TRACING_SAMPLING_RATE",
];

#[test]
fn the_readme_says_what_becomes_of_every_go_variable_and_go_mode_reads_them() {
    let readme = common::docs();
    let section = readme
        .split("## Running as the Go service")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("docs/coming-from-go.md's Go variable section");
    let rows: Vec<&str> = section.lines().filter(|l| l.starts_with("| `")).collect();
    let mapping = concat!(
        include_str!("../src/settings/go/mod.rs"),
        include_str!("../src/settings/go/sections.rs")
    );
    for name in GO_VARIABLES {
        let quoted = format!("`{name}`");
        let row = rows
            .iter()
            .find(|r| r.split('|').nth(1).is_some_and(|c| c.contains(&quoted)))
            .unwrap_or_else(|| panic!("{name} has no row in docs/coming-from-go.md's table"));
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        // "| a | b | c |" splits into ["", a, b, c, ""].
        assert_eq!(cells.len(), 5, "{row}");
        assert!(
            cells[1..4].iter().all(|c| !c.is_empty()),
            "blank cell: {row}"
        );
        // Go mode reads it, unless it only means something alongside a refused setting.
        let only_with_refused = name.starts_with("MEMCACHE_");
        assert!(
            only_with_refused || mapping.contains(&format!("\"{name}\"")),
            "{name} is not read by src/settings/go/"
        );
    }
}

/// Reads one HTTP/1.1 request (headers, then a Content-Length body) and answers 200.
async fn receive_post(stream: &mut tokio::net::TcpStream) -> Option<(String, Vec<u8>)> {
    let mut raw = Vec::new();
    let mut buf = [0u8; 8192];
    let header_end = loop {
        let n = stream.read(&mut buf).await.ok()?;
        if n == 0 {
            return None;
        }
        raw.extend_from_slice(&buf[..n]);
        if let Some(at) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
    };
    let head = String::from_utf8_lossy(&raw[..header_end]).to_string();
    let length: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse().unwrap_or(0))
        })
        .unwrap_or(0);
    while raw.len() < header_end + length {
        let n = stream.read(&mut buf).await.ok()?;
        if n == 0 {
            return None;
        }
        raw.extend_from_slice(&buf[..n]);
    }
    stream
        .write_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n",
        )
        .await
        .ok()?;
    Some((head, raw[header_end..header_end + length].to_vec()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_tracing_variables_send_otlp_over_http() {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use prost::Message;

    let collector = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let collector_addr = collector.local_addr().unwrap();
    let (bodies_tx, mut bodies) = tokio::sync::mpsc::unbounded_channel();
    let receiver = tokio::spawn(async move {
        while let Ok((mut stream, _)) = collector.accept().await {
            let tx = bodies_tx.clone();
            tokio::spawn(async move {
                while let Some(request) = receive_post(&mut stream).await {
                    let _ = tx.send(request);
                }
            });
        }
    });

    let root = config_tree();
    let mut envs = go_env(root.path());
    envs.extend([
        // No Redis here: the call is answered by the failure mode, which is traced too.
        ("REDIS_SOCKET_TYPE", "tcp".into()),
        ("REDIS_URL", format!("127.0.0.1:{}", free_port())),
        ("TRACING_ENABLED", "true".into()),
        ("TRACING_SERVICE_NAMESPACE", "edge".into()),
        ("TRACING_SERVICE_INSTANCE_ID", "pod-1".into()),
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://{collector_addr}"),
        ),
        ("OTEL_BSP_SCHEDULE_DELAY", "100".into()),
    ]);
    let server = ServeProcess::spawn_as_ratelimit(&envs);
    let mut client = RateLimitServiceClient::connect(server.grpc_url())
        .await
        .unwrap();
    let _ = client
        .should_rate_limit(request("edge", &[&[("user", "traced")]]))
        .await;

    let (head, body) = tokio::time::timeout(Duration::from_secs(10), bodies.recv())
        .await
        .unwrap_or_else(|_| panic!("no OTLP request within 10 s:\n{}", server.log()))
        .expect("collector alive");
    assert!(head.starts_with("POST /v1/traces "), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("application/x-protobuf"),
        "{head}"
    );
    let export = ExportTraceServiceRequest::decode(body.as_slice()).expect("OTLP protobuf");
    let resource = export.resource_spans[0].resource.clone().expect("resource");
    let attribute = |key: &str| {
        resource
            .attributes
            .iter()
            .find(|a| a.key == key)
            .and_then(|a| a.value.clone())
            .map(|v| format!("{:?}", v.value))
            .unwrap_or_default()
    };
    // The Go service's defaults and variables name the service.
    assert!(
        attribute("service.name").contains("\"RateLimit\""),
        "{resource:?}"
    );
    assert!(
        attribute("service.namespace").contains("\"edge\""),
        "{resource:?}"
    );
    assert!(
        attribute("service.instance.id").contains("\"pod-1\""),
        "{resource:?}"
    );
    let spans: Vec<&str> = export
        .resource_spans
        .iter()
        .flat_map(|r| &r.scope_spans)
        .flat_map(|s| &s.spans)
        .map(|s| s.name.as_str())
        .collect();
    assert!(spans.contains(&"should_rate_limit"), "{spans:?}");
    receiver.abort();
}

/// Ready means able to decide: started with Redis away, the drop-in mode answers `/healthcheck`
/// 500 and gRPC health NOT_SERVING (Envoy Gateway routes by readiness), liveness stays up, and
/// it turns ready once Redis answers, as the Go service does since it waits for its first Redis
/// connection. With REDIS_STARTUP_MAX_ELAPSED_TIME it gives up and exits, as Go does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_away_at_start_it_is_not_ready_until_redis_answers() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let root = config_tree();
    let redis_port = free_port();
    let mut envs = go_env(root.path());
    envs.extend([
        ("REDIS_SOCKET_TYPE", "tcp".to_owned()),
        ("REDIS_URL", format!("127.0.0.1:{redis_port}")),
    ]);
    let server = ServeProcess::spawn_as_ratelimit(&envs);
    let http_port = var(&envs, "PORT");
    let (status, body) = http(http_port, "GET", "/healthcheck", "").await;
    assert_eq!(status, 500, "{body}");
    assert!(body.contains("has not answered"), "{body}");
    let (status, _) = http(server.admin_port, "GET", "/healthz", "").await;
    assert_eq!(status, 200, "liveness never depends on Redis");
    let channel = tonic::transport::Channel::from_shared(server.grpc_url())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let health = HealthClient::new(channel);
    let status_of = |service: &'static str| {
        let mut health = health.clone();
        async move {
            health
                .check(HealthCheckRequest {
                    service: service.into(),
                })
                .await
                .unwrap()
                .into_inner()
                .status
        }
    };
    assert_eq!(
        status_of("ratelimit").await,
        ServingStatus::NotServing as i32
    );

    let _redis = RedisServer::start_on(redis_port);
    let until = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = http(http_port, "GET", "/healthcheck", "").await;
        if status == 200 && status_of("ratelimit").await == ServingStatus::Serving as i32 {
            break;
        }
        assert!(std::time::Instant::now() < until, "never ready: {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(server);

    // REDIS_STARTUP_MAX_ELAPSED_TIME: never reached, it exits non-zero.
    let mut envs = go_env(root.path());
    envs.extend([
        ("REDIS_SOCKET_TYPE", "tcp".to_owned()),
        ("REDIS_URL", format!("127.0.0.1:{}", free_port())),
        ("REDIS_STARTUP_MAX_ELAPSED_TIME", "1s".to_owned()),
    ]);
    let mut server = ServeProcess::spawn_as_ratelimit(&envs);
    let until = std::time::Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            std::time::Instant::now() < until,
            "still running past the limit"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(!status.success(), "{status}");
    assert!(
        server.log().contains("REDIS_STARTUP_MAX_ELAPSED_TIME"),
        "{}",
        server.log()
    );
}

/// The image's entrypoint as Kubernetes calls it. The `ratelimit` target of deploy/Dockerfile has
/// the Go image's entrypoint, `/bin/ratelimit`: a Deployment written for the Go image that sets no
/// command runs Portcullis in the drop-in mode, and one that sets only `args` too (Kubernetes
/// appends them to the entrypoint; the binary, like Go's, takes none and says so). The default
/// target keeps Portcullis' own command line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_go_images_entrypoint_runs_the_drop_in_mode_whatever_its_args() {
    let dockerfile = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/Dockerfile"),
    )
    .unwrap();
    let stage = |name: &str| {
        let at = dockerfile
            .find(&format!(" AS {name}\n"))
            .unwrap_or_else(|| panic!("no {name} stage"));
        let rest = &dockerfile[at..];
        rest[..rest[1..].find("\nFROM ").map_or(rest.len(), |e| e + 1)].to_owned()
    };
    assert!(stage("ratelimit").contains("ENTRYPOINT [\"/bin/ratelimit\"]"));
    assert!(stage("portcullis").contains("ENTRYPOINT [\"/bin/portcullis\"]"));
    let last_from = dockerfile.rfind("\nFROM ").unwrap();
    assert!(
        dockerfile[last_from..].contains(" AS portcullis"),
        "the default target is Portcullis' own"
    );

    let root = config_tree();
    let redis = RedisServer::start();
    let mut envs = go_env(root.path());
    envs.extend([
        ("REDIS_SOCKET_TYPE", "tcp".to_owned()),
        ("REDIS_URL", format!("127.0.0.1:{}", redis.port)),
    ]);
    let server = ServeProcess::spawn_as_ratelimit_with_args(&envs, &["-config", "ignored"]);
    // The Go ports and the Go health path: the drop-in mode.
    let (status, body) = http(var(&envs, "PORT"), "GET", "/healthcheck", "").await;
    assert_eq!(status, 200, "{body}");
    assert!(
        server.log().contains("arguments ignored"),
        "{}",
        server.log()
    );
}
