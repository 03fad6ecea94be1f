//! The Go service's variables: one that cannot be honoured stops the start naming it, `serve
//! --env-compat go` reads the same, README says what becomes of each, and the image's entrypoint
//! runs the drop-in mode whatever its arguments.

use super::*;

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
    let asked = variables_the_go_mode_asks_for();
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
            only_with_refused || asked.contains(*name),
            "{name} is never asked for by the Go mode's settings (src/settings/go/)"
        );
    }
}

/// Every variable `settings::go::from_go_env` asks the environment for, over environments
/// that turn on each part that reads more (Redis, per-second Redis, statsd, tracing, xDS):
/// what Go mode reads, seen by asking it, not by reading its source.
fn variables_the_go_mode_asks_for() -> std::collections::HashSet<String> {
    let asked = std::cell::RefCell::new(std::collections::HashSet::new());
    let environments: [&[(&str, &str)]; 3] = [
        &[],
        &[
            ("BACKEND_TYPE", "redis"),
            ("REDIS_PERSECOND", "true"),
            ("REDIS_TLS", "true"),
            ("USE_STATSD", "true"),
            ("TRACING_ENABLED", "true"),
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("REDIS_TYPE", "sentinel"),
            ("REDIS_PERSECOND_TYPE", "sentinel"),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
            ("GRPC_SERVER_USE_TLS", "true"),
        ],
        &[
            ("BACKEND_TYPE", "redis"),
            ("REDIS_TYPE", "cluster"),
            ("REDIS_PERSECOND", "true"),
            ("REDIS_PERSECOND_TYPE", "cluster"),
            ("USE_PROMETHEUS", "true"),
            ("TRACING_ENABLED", "true"),
            ("TRACING_EXPORTER_PROTOCOL", "grpc"),
        ],
    ];
    let dir = tempfile::tempdir().unwrap();
    // Each environment, and each with every other variable "true" (every switch on).
    for (env, rest) in environments
        .iter()
        .flat_map(|e| [(*e, None), (*e, Some("true"))])
    {
        let var = |name: &str| {
            asked.borrow_mut().insert(name.to_owned());
            env.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
                .or(rest.map(str::to_owned))
        };
        let base = portcullis::settings::Settings::for_tests(dir.path().to_path_buf());
        // Refusals are fine here (a sentinel without addresses): only what was asked counts.
        let _ = portcullis::settings::go::from_go_env(base, &var);
    }
    asked.into_inner()
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
    // The Go ports and the Go health path (once Redis answered: ready): the drop-in mode.
    await_healthy(&server, var(&envs, "PORT")).await;
    let (status, body) = http(var(&envs, "PORT"), "GET", "/healthcheck", "").await;
    assert_eq!((status, body.as_str()), (200, "OK"));
    assert!(
        server.log().contains("arguments ignored"),
        "{}",
        server.log()
    );
}
