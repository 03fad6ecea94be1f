//! The Go service's variables, one function per section of its settings (listeners, logs, rules,
//! behaviour, store, stats, tracing), each reading its variables into `Settings` through the
//! `Reader` (which collects every problem). A section must never read a variable another
//! section owns.

use std::path::PathBuf;
use std::time::Duration;

use super::{Reader, split_auth};
use crate::algorithm::Algorithm;
use crate::limiter::FailureMode;
use crate::service::HeadersMode;
use crate::service::admin::Routes;
use crate::settings::{HttpListener, Secret, Settings, StoreKind};
use crate::telemetry::{LogFormat, OtlpProtocol};

/// The listeners: gRPC; HTTP (PORT) with /healthcheck and /json; debug (DEBUG_PORT) with
/// /rlconfig and Portcullis' own admin endpoints.
pub(super) fn listeners(r: &mut Reader<'_>, s: &mut Settings) {
    // Listeners: gRPC; HTTP (PORT) with /healthcheck and /json; debug (DEBUG_PORT) with
    // /rlconfig and Portcullis' own admin endpoints; Prometheus when asked for.
    s.grpc_addr = r.address("GRPC_HOST", "GRPC_PORT", 8081);
    r.refuse_if(
        r.get("GRPC_UDS").is_some(),
        "GRPC_UDS: serving gRPC on a unix socket is not supported; use GRPC_HOST and GRPC_PORT"
            .into(),
    );
    let http = r.address("HOST", "PORT", 8080);
    s.admin_addr = r.address("DEBUG_HOST", "DEBUG_PORT", 6070);
    s.http_listeners = vec![HttpListener {
        addr: http,
        routes: Routes {
            health: true,
            rules: false,
            metrics: false,
            json: true,
            go_metrics: None,
            scaling: false,
        },
    }];
    let age = r.duration("GRPC_MAX_CONNECTION_AGE", Duration::from_secs(24 * 3600));
    let grace = r.duration("GRPC_MAX_CONNECTION_AGE_GRACE", Duration::from_secs(3600));
    s.grpc_max_connection_age = Some(age);
    s.grpc_max_connection_age_grace = Some(grace);
    if r.bool("GRPC_SERVER_USE_TLS", false) {
        s.grpc_tls_cert = r.get("GRPC_SERVER_TLS_CERT").map(PathBuf::from);
        s.grpc_tls_key = r.get("GRPC_SERVER_TLS_KEY").map(PathBuf::from);
        s.grpc_tls_client_ca = r.get("GRPC_CLIENT_TLS_CACERT").map(PathBuf::from);
        s.grpc_tls_client_san = r.get("GRPC_CLIENT_TLS_SAN");
    }
}

/// Logs: LOG_LEVEL in logrus' names, LOG_FORMAT.
pub(super) fn logs(r: &mut Reader<'_>, s: &mut Settings) {
    // Logs.
    // logrus' level names, as tracing names them.
    s.log_level = match r.string("LOG_LEVEL", "WARN").to_lowercase().as_str() {
        "warning" => "warn".into(),
        "fatal" | "panic" => "error".into(),
        other => other.to_owned(),
    };
    s.log_format = match r.string("LOG_FORMAT", "text").to_lowercase().as_str() {
        "json" => LogFormat::Json,
        _ => LogFormat::Text,
    };
}

/// Rules: the runtime directory (or xDS), counted as Go counts them.
pub(super) fn rules(r: &mut Reader<'_>, s: &mut Settings) {
    // Rules: RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY, counted as Go counts them
    // (fixed windows, unless a rule names its algorithm).
    let root = r.string("RUNTIME_ROOT", "/srv/runtime_data/current");
    let subdirectory = r.string("RUNTIME_SUBDIRECTORY", "");
    let app = r.string("RUNTIME_APPDIRECTORY", "config");
    s.config = PathBuf::from(root).join(subdirectory).join(app);
    // Portcullis' own variable wins where it is set: rules pushed by Envoy Gateway cannot name an
    // algorithm, so this is how such a deployment chooses sliding windows.
    if r.get("PORTCULLIS_DEFAULT_ALGORITHM").is_none() {
        s.default_algorithm = Algorithm::FixedWindow;
    }
    if r.get("PORTCULLIS_OVERRIDE_ALGORITHM").is_none() {
        s.override_algorithm = Algorithm::FixedWindow;
    }
    match r.string("CONFIG_TYPE", "FILE").to_uppercase().as_str() {
        "FILE" => {}
        "GRPC_XDS_SOTW" => {
            s.xds.rules_xds_server =
                Some(r.string("CONFIG_GRPC_XDS_SERVER_URL", "localhost:18000"));
            s.xds.rules_xds_node_id = r.string("CONFIG_GRPC_XDS_NODE_ID", "default");
            s.xds.rules_xds_node_metadata = r.get("CONFIG_GRPC_XDS_NODE_METADATA");
            s.xds.rules_xds_headers = r.get("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS");
            s.xds.rules_xds_tls = r.bool("CONFIG_GRPC_XDS_SERVER_USE_TLS", false);
            s.xds.rules_xds_ca_file = r
                .get("CONFIG_GRPC_XDS_SERVER_TLS_CACERT")
                .map(PathBuf::from);
            s.xds.rules_xds_cert = r.get("CONFIG_GRPC_XDS_CLIENT_TLS_CERT").map(PathBuf::from);
            s.xds.rules_xds_key = r.get("CONFIG_GRPC_XDS_CLIENT_TLS_KEY").map(PathBuf::from);
            s.xds.rules_xds_san = r.get("CONFIG_GRPC_XDS_SERVER_TLS_SAN");
            s.xds.rules_xds_backoff_initial = r.duration(
                "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
                Duration::from_secs(10),
            );
            s.xds.rules_xds_backoff_max =
                r.duration("XDS_CLIENT_BACKOFF_MAX_INTERVAL", Duration::from_secs(60));
            s.xds.rules_xds_backoff_random_factor =
                r.number("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", 0.5);
            s.xds.rules_xds_backoff_jitter = r.bool("XDS_CLIENT_BACKOFF_JITTER", true);
            s.xds.rules_xds_max_message_bytes =
                r.number("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", 4 * 1024 * 1024);
            s.force_start_without_initial_rules =
                r.bool("FORCE_START_WITHOUT_INITIAL_CONFIG", false);
        }
        other => r.problems.push(format!(
            "CONFIG_TYPE={other:?} is not one of FILE, GRPC_XDS_SOTW"
        )),
    }
}

/// Behaviour: shadow and quota modes, charging, failure mode, headers.
pub(super) fn behaviour(r: &mut Reader<'_>, s: &mut Settings) {
    // Behaviour.
    s.shadow_mode = r.bool("SHADOW_MODE", false);
    s.quota_mode = r.bool("QUOTA_MODE", false);
    s.stop_charging_when_over = r.bool("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", false);
    s.merge_domain_config = r.bool("MERGE_DOMAIN_CONFIG", false);
    s.response_dynamic_metadata = r.bool("RESPONSE_DYNAMIC_METADATA", false);
    s.near_limit_ratio = r.number("NEAR_LIMIT_RATIO", 0.8);
    s.ready_requires_rules = r.bool("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", false);
    if r.bool("LIMIT_RESPONSE_HEADERS_ENABLED", false) {
        s.response_headers = HeadersMode::Go;
        s.header_limit_name = Some(r.string("LIMIT_LIMIT_HEADER", "RateLimit-Limit"));
        s.header_remaining_name = Some(r.string("LIMIT_REMAINING_HEADER", "RateLimit-Remaining"));
        s.header_reset_name = Some(r.string("LIMIT_RESET_HEADER", "RateLimit-Reset"));
    }
    // The Go service hands a Redis failure back to Envoy as an error; Envoy's
    // failure_mode_deny decides.
    if r.get("PORTCULLIS_FAILURE_MODE").is_none() {
        s.failure_mode = FailureMode::Error;
    }
}

/// The store: one Redis, or two with REDIS_PERSECOND; its deadline; the local cache.
pub(super) fn store(r: &mut Reader<'_>, s: &mut Settings) {
    // The store.
    let backend = r.string("BACKEND_TYPE", "redis").to_lowercase();
    r.refuse_if(
        backend != "redis",
        format!(
            "BACKEND_TYPE={backend:?}: Portcullis keeps counters in Redis (or in memory); \
             memcache is not supported"
        ),
    );
    s.store = StoreKind::Redis;
    redis_section(r, &MAIN_REDIS, s);
    // Per-second limits in a Redis of their own, read from the REDIS_PERSECOND_* variables (the
    // TLS files are shared, as in the Go service).
    s.redis_connect_timeout = r.duration("REDIS_TIMEOUT", Duration::from_secs(10));
    // Go bounds every Redis command by REDIS_TIMEOUT: set, it is each decision's deadline too
    // (unset, the decision keeps Portcullis' short deadline, under Envoy's 20 ms timeout).
    if r.get("REDIS_TIMEOUT").is_some() {
        s.store_timeout = s.redis_connect_timeout;
    }
    // The per-second Redis is a copy of the main one's settings (timeouts included, as Go
    // applies REDIS_TIMEOUT to both clients), its address and credentials its own.
    if r.bool("REDIS_PERSECOND", false) {
        let mut per_second = s.clone();
        per_second.redis_per_second = None;
        redis_section(r, &PER_SECOND_REDIS, &mut per_second);
        s.redis_per_second = Some(Box::new(per_second));
    }
    // Not ready until Redis has answered once, in every mode; as Go, a process that has not
    // reached Redis within REDIS_STARTUP_MAX_ELAPSED_TIME (0: wait for ever) exits.
    s.ready_requires_first_store_answer = true;
    let startup = r.duration("REDIS_STARTUP_MAX_ELAPSED_TIME", Duration::ZERO);
    s.store_startup_limit = (startup > Duration::ZERO).then_some(startup);
    // Go's health check fails while no Redis connection is active, when asked to.
    if r.bool("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", false) {
        s.ready_requires_store = true;
    }
    s.key_prefix = r.string("CACHE_KEY_PREFIX", "");
    let local_cache = r.number::<usize>("LOCAL_CACHE_SIZE_IN_BYTES", 0);
    s.deny_cache = local_cache > 0;
    if local_cache > 0 {
        s.deny_cache_max_bytes = local_cache;
    }
}

/// Stats: statsd (the Go default) with its tags, Prometheus under Go's names.
pub(super) fn stats(r: &mut Reader<'_>, s: &mut Settings) {
    // Stats: statsd (the Go default), Prometheus under Go's names.
    let stats = !r.bool("DISABLE_STATS", false);
    let dog = r.bool("USE_DOG_STATSD", false);
    if stats && (r.bool("USE_STATSD", true) || dog) {
        let host = r.string("STATSD_HOST", "localhost");
        let port = r.number("STATSD_PORT", 8125u16);
        s.statsd_addr = Some(format!("{host}:{port}"));
        s.statsd_flush_interval = r.duration("STATS_FLUSH_INTERVAL", Duration::from_secs(10));
        s.statsd_dogstatsd = dog;
        // Go reads a map: `k1:v1,k2:v2`.
        if let Some(tags) = r.get("EXTRA_TAGS") {
            for pair in tags.split(',') {
                match pair.split(':').collect::<Vec<_>>().as_slice() {
                    [key, value] if !key.is_empty() && !value.is_empty() => {
                        s.statsd_tags.push(((*key).to_owned(), (*value).to_owned()));
                    }
                    _ => r.problems.push(format!(
                        "EXTRA_TAGS={tags:?}: {pair:?} is not key:value (as the Go service \
                         reads it)"
                    )),
                }
            }
        }
    } else {
        s.statsd_addr = None;
    }
    if stats && r.bool("USE_PROMETHEUS", false) {
        let addr = r.string("PROMETHEUS_ADDR", ":9090");
        s.go_metrics_addr = Some(r.resolve(&addr, "PROMETHEUS_ADDR"));
        s.go_metrics_path = r.string("PROMETHEUS_PATH", "/metrics");
        // Envoy Gateway mounts its statsd_exporter mapping and names it here.
        s.go_metrics_mapping = r.get("PROMETHEUS_MAPPER_YAML").map(PathBuf::from);
    }
}

/// Tracing: OTLP with the standard OTEL_EXPORTER_OTLP_* variables, as the Go service's SDK.
pub(super) fn tracing(r: &mut Reader<'_>, s: &mut Settings) {
    // Tracing: OTLP with the standard OTEL_EXPORTER_OTLP_* variables, as the Go service's SDK.
    if r.bool("TRACING_ENABLED", false) {
        let protocol = match r
            .string("TRACING_EXPORTER_PROTOCOL", "http")
            .to_lowercase()
            .as_str()
        {
            "grpc" => OtlpProtocol::Grpc,
            _ => OtlpProtocol::HttpProtobuf,
        };
        let default_endpoint = match protocol {
            OtlpProtocol::Grpc => "http://localhost:4317",
            OtlpProtocol::HttpProtobuf => "http://localhost:4318",
        };
        s.traces.otlp_endpoint = Some(
            r.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                .or_else(|| r.get("OTEL_EXPORTER_OTLP_ENDPOINT"))
                .unwrap_or_else(|| default_endpoint.to_owned()),
        );
        s.traces.otlp_protocol = protocol;
        s.traces.otel_service_name = r.string("TRACING_SERVICE_NAME", "RateLimit");
        s.traces.otel_service_namespace = r.get("TRACING_SERVICE_NAMESPACE");
        s.traces.otel_service_instance_id = r.get("TRACING_SERVICE_INSTANCE_ID");
        s.traces.traces_sampling_ratio = Some(r.number("TRACING_SAMPLING_RATE", 1.0));
    } else {
        s.traces.otlp_endpoint = None;
    }
}

/// The variables one Redis is read from: the main one's, and the per-second one's.
struct RedisVars {
    tls: &'static str,
    socket: &'static str,
    kind: &'static str,
    url: &'static str,
    auth: &'static str,
    sentinel_auth: &'static str,
    pool_size: &'static str,
}

const MAIN_REDIS: RedisVars = RedisVars {
    tls: "REDIS_TLS",
    socket: "REDIS_SOCKET_TYPE",
    kind: "REDIS_TYPE",
    url: "REDIS_URL",
    auth: "REDIS_AUTH",
    sentinel_auth: "REDIS_SENTINEL_AUTH",
    pool_size: "REDIS_POOL_SIZE",
};

const PER_SECOND_REDIS: RedisVars = RedisVars {
    tls: "REDIS_PERSECOND_TLS",
    socket: "REDIS_PERSECOND_SOCKET_TYPE",
    kind: "REDIS_PERSECOND_TYPE",
    url: "REDIS_PERSECOND_URL",
    auth: "REDIS_PERSECOND_AUTH",
    sentinel_auth: "REDIS_PERSECOND_SENTINEL_AUTH",
    pool_size: "REDIS_PERSECOND_POOL_SIZE",
};

/// One Redis as the Go service reads it (`vars` name the main one's variables or the per-second
/// one's), into `s`'s Redis settings; the TLS files are shared, as in the Go service.
/// `host:port` rather than a socket's path.
fn looks_like_tcp(url: &str) -> bool {
    !url.starts_with('/')
        && url
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
}

fn redis_section(r: &mut Reader<'_>, vars: &RedisVars, s: &mut Settings) {
    let tls = r.bool(vars.tls, false);
    let socket = r.string(vars.socket, "unix").to_lowercase();
    let kind = r.string(vars.kind, "SINGLE").to_uppercase();
    let url = r.string(vars.url, "/var/run/nutcracker/ratelimit.sock");
    s.redis_url = None;
    s.redis_cluster = Vec::new();
    s.redis_sentinel = Vec::new();
    match kind.as_str() {
        "SINGLE" if url.contains("://") => s.redis_url = Some(url),
        "SINGLE" if socket == "unix" && looks_like_tcp(&url) => {
            let set = if r.get(vars.socket).is_some() {
                "is unix"
            } else {
                "is unset, and the Go service's default is unix"
            };
            r.refuse_if(
                true,
                format!(
                    "{}={url:?} is a TCP address, but {} {set}: set {}=tcp",
                    vars.url, vars.socket, vars.socket
                ),
            );
        }
        "SINGLE" if socket == "unix" => s.redis_url = Some(format!("redis+unix://{url}")),
        "SINGLE" => {
            let scheme = if tls { "rediss" } else { "redis" };
            s.redis_url = Some(format!("{scheme}://{url}"));
        }
        "CLUSTER" => {
            s.redis_cluster = url.split(',').map(|n| n.trim().to_owned()).collect();
        }
        "SENTINEL" => {
            let mut parts = url.split(',').map(str::trim);
            s.redis_master = parts.next().map(str::to_owned);
            s.redis_sentinel = parts.map(str::to_owned).collect();
            r.refuse_if(
                s.redis_sentinel.is_empty(),
                format!(
                    "{}: SENTINEL needs <master name>,<sentinel1>,...,<sentinelN>",
                    vars.url
                ),
            );
        }
        other => r.problems.push(format!(
            "{}={other:?} is not one of SINGLE, SENTINEL, CLUSTER",
            vars.kind
        )),
    }
    if let Some(auth) = r.get(vars.auth) {
        let (user, password) = split_auth(&auth);
        s.redis_user = user;
        s.redis_password = Some(Secret(password));
    }
    if let Some(auth) = r.get(vars.sentinel_auth) {
        let (user, password) = split_auth(&auth);
        s.redis_sentinel_user = user;
        s.redis_sentinel_password = Some(Secret(password));
    }
    s.redis_tls = tls;
    if tls {
        s.redis_ca_file = r.get("REDIS_TLS_CACERT").map(PathBuf::from);
        s.redis_tls_cert = r.get("REDIS_TLS_CLIENT_CERT").map(PathBuf::from);
        s.redis_tls_key = r.get("REDIS_TLS_CLIENT_KEY").map(PathBuf::from);
        s.redis_tls_skip_hostname_verification =
            r.bool("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", false);
        // The Go service talks TLS to the sentinels too, with the same CA.
        s.redis_sentinel_tls = !s.redis_sentinel.is_empty();
        s.redis_sentinel_ca_file = s.redis_ca_file.clone().filter(|_| s.redis_sentinel_tls);
    }
    s.redis_pool_size = r.number(vars.pool_size, 10);
}
