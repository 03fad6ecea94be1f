//! envoyproxy/ratelimit's environment, read as it reads it: the variables a Deployment written for
//! the Go service sets, with the Go service's defaults and meanings, mapped onto `Settings`. The
//! binary does this when it runs as `ratelimit` (the image's `/bin/ratelimit`) or with
//! `serve --env-compat go`.
//!
//! A variable that asks for something Portcullis cannot do stops the start-up naming it; one read
//! but deliberately not acted on is listed in `Settings::ignored_variables` (logged once). This
//! module must never guess: an unparsable value is an error naming its variable.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use super::{HttpListener, Secret, Settings, SettingsError, StoreKind};
use crate::algorithm::Algorithm;
use crate::limiter::FailureMode;
use crate::service::HeadersMode;
use crate::service::admin::Routes;
use crate::telemetry::{LogFormat, OtlpProtocol};

/// Variables the Go service reads that change nothing here, and why (logged once at start-up).
const IGNORED: &[(&str, &str)] = &[
    (
        "RUNTIME_WATCH_ROOT",
        "the rules directory is polled, which sees every kind of change",
    ),
    (
        "RUNTIME_IGNOREDOTFILES",
        "dot files are always skipped (a mounted ConfigMap's machinery)",
    ),
    (
        "EXPIRATION_JITTER_MAX_SECONDS",
        "every key expires when its state is empty again, exactly",
    ),
    (
        "REDIS_PIPELINE_WINDOW",
        "calls are pipelined on multiplexed connections",
    ),
    (
        "REDIS_PIPELINE_LIMIT",
        "calls are pipelined on multiplexed connections",
    ),
    (
        "REDIS_CLUSTER_PIPELINE_PARALLELISM",
        "each check goes to its node at once",
    ),
    (
        "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
        "readiness reports Redis' state (see /readyz)",
    ),
    (
        "REDIS_POOL_ON_EMPTY_BEHAVIOR",
        "calls never wait for a pooled connection",
    ),
    (
        "REDIS_PERSECOND_PIPELINE_WINDOW",
        "calls are pipelined on multiplexed connections",
    ),
    (
        "REDIS_PERSECOND_PIPELINE_LIMIT",
        "calls are pipelined on multiplexed connections",
    ),
    (
        "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM",
        "each check goes to its node at once",
    ),
    (
        "REDIS_PERSECOND_TIMEOUT",
        "one decision deadline covers both Redis (REDIS_TIMEOUT)",
    ),
    (
        "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR",
        "calls never wait for a pooled connection",
    ),
    (
        "REDIS_STARTUP_INITIAL_INTERVAL",
        "Portcullis starts without Redis and connects in the background",
    ),
    (
        "REDIS_STARTUP_MAX_INTERVAL",
        "Portcullis starts without Redis and connects in the background",
    ),
    (
        "REDIS_STARTUP_MAX_ELAPSED_TIME",
        "Portcullis starts without Redis and connects in the background",
    ),
    (
        "USE_DOG_STATSD_MOGRIFIERS",
        "statsd counters keep the Go service's plain names",
    ),
    (
        "GRPC_SERVER_TLS_CA_CERT",
        "not a variable of the Go service (Envoy Gateway sets it); client certificates are \
         required by GRPC_CLIENT_TLS_CACERT",
    ),
    (
        "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
        "the xDS stream reconnects with XDS_CLIENT_BACKOFF_*",
    ),
    (
        "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
        "the response time histogram is in seconds",
    ),
];

/// Reads one variable of the process (the only place Go mode reads the environment).
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

struct Reader<'a> {
    var: &'a dyn Fn(&str) -> Option<String>,
    problems: Vec<String>,
}

impl Reader<'_> {
    fn get(&self, name: &str) -> Option<String> {
        (self.var)(name).filter(|v| !v.is_empty())
    }

    fn string(&self, name: &str, default: &str) -> String {
        self.get(name).unwrap_or_else(|| default.to_owned())
    }

    /// Go's `strconv.ParseBool`.
    fn bool(&mut self, name: &str, default: bool) -> bool {
        match self.get(name).as_deref() {
            None => default,
            Some("1" | "t" | "T" | "true" | "TRUE" | "True") => true,
            Some("0" | "f" | "F" | "false" | "FALSE" | "False") => false,
            Some(other) => {
                self.problems
                    .push(format!("{name}={other:?} is not a boolean"));
                default
            }
        }
    }

    fn number<T: std::str::FromStr>(&mut self, name: &str, default: T) -> T {
        match self.get(name) {
            None => default,
            Some(text) => text.trim().parse().unwrap_or_else(|_| {
                self.problems
                    .push(format!("{name}={text:?} is not a number"));
                default
            }),
        }
    }

    fn duration(&mut self, name: &str, default: Duration) -> Duration {
        match self.get(name) {
            None => default,
            Some(text) => parse_go_duration(&text).unwrap_or_else(|| {
                self.problems.push(format!(
                    "{name}={text:?} is not a duration like 10s, 1m30s or 250ms"
                ));
                default
            }),
        }
    }

    fn address(&mut self, host_var: &str, port_var: &str, port: u16) -> SocketAddr {
        let host = self.string(host_var, "0.0.0.0");
        let port = self.number(port_var, port);
        self.resolve(&format!("{host}:{port}"), host_var)
    }

    fn resolve(&mut self, text: &str, name: &str) -> SocketAddr {
        // Go's ":9090" means every address.
        let text = if text.starts_with(':') {
            format!("0.0.0.0{text}")
        } else {
            text.to_owned()
        };
        match text.to_socket_addrs().ok().and_then(|mut a| a.next()) {
            Some(addr) => addr,
            None => {
                self.problems
                    .push(format!("{name}: {text:?} is not an address to listen on"));
                SocketAddr::from(([0, 0, 0, 0], 0))
            }
        }
    }

    fn refuse_if(&mut self, condition: bool, message: String) {
        if condition {
            self.problems.push(message);
        }
    }
}

/// Go's `time.ParseDuration` for the units its settings use: `300ms`, `10s`, `1m30s`, `24h`.
pub fn parse_go_duration(text: &str) -> Option<Duration> {
    let mut rest = text.trim();
    if rest == "0" {
        return Some(Duration::ZERO);
    }
    let mut total = Duration::ZERO;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let value: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += Duration::from_secs_f64(value * seconds);
    }
    Some(total)
}

/// `user:password` or `password`, as the Go service splits REDIS_AUTH.
fn split_auth(auth: &str) -> (Option<String>, String) {
    match auth.split_once(':') {
        Some((user, password)) => (Some(user.to_owned()), password.to_owned()),
        None => (None, auth.to_owned()),
    }
}

/// `Settings` from the Go service's environment, on top of `base` (which holds Portcullis' own
/// settings that Go has no variable for, such as the store deadline).
pub fn from_go_env(
    base: Settings,
    var: &dyn Fn(&str) -> Option<String>,
) -> Result<Settings, SettingsError> {
    let mut s = base;
    let mut r = Reader {
        var,
        problems: Vec::new(),
    };
    s.env_compat = Some("go".into());

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
            s.rules_xds_server = Some(r.string("CONFIG_GRPC_XDS_SERVER_URL", "localhost:18000"));
            s.rules_xds_node_id = r.string("CONFIG_GRPC_XDS_NODE_ID", "default");
            s.rules_xds_node_metadata = r.get("CONFIG_GRPC_XDS_NODE_METADATA");
            s.rules_xds_headers = r.get("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS");
            s.rules_xds_tls = r.bool("CONFIG_GRPC_XDS_SERVER_USE_TLS", false);
            s.rules_xds_ca_file = r
                .get("CONFIG_GRPC_XDS_SERVER_TLS_CACERT")
                .map(PathBuf::from);
            s.rules_xds_cert = r.get("CONFIG_GRPC_XDS_CLIENT_TLS_CERT").map(PathBuf::from);
            s.rules_xds_key = r.get("CONFIG_GRPC_XDS_CLIENT_TLS_KEY").map(PathBuf::from);
            s.rules_xds_san = r.get("CONFIG_GRPC_XDS_SERVER_TLS_SAN");
            s.rules_xds_backoff_initial = r.duration(
                "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
                Duration::from_secs(10),
            );
            s.rules_xds_backoff_max =
                r.duration("XDS_CLIENT_BACKOFF_MAX_INTERVAL", Duration::from_secs(60));
            s.rules_xds_backoff_random_factor = r.number("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", 0.5);
            s.rules_xds_backoff_jitter = r.bool("XDS_CLIENT_BACKOFF_JITTER", true);
            s.rules_xds_max_message_bytes =
                r.number("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", 4 * 1024 * 1024);
            s.force_start_without_initial_rules =
                r.bool("FORCE_START_WITHOUT_INITIAL_CONFIG", false);
        }
        other => r.problems.push(format!(
            "CONFIG_TYPE={other:?} is not one of FILE, GRPC_XDS_SOTW"
        )),
    }

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
    redis_section(&mut r, &MAIN_REDIS, &mut s);
    // Per-second limits in a Redis of their own, read from the REDIS_PERSECOND_* variables (the
    // TLS files are shared, as in the Go service).
    if r.bool("REDIS_PERSECOND", false) {
        let mut per_second = s.clone();
        per_second.redis_per_second = None;
        redis_section(&mut r, &PER_SECOND_REDIS, &mut per_second);
        s.redis_per_second = Some(Box::new(per_second));
    }
    s.redis_connect_timeout = r.duration("REDIS_TIMEOUT", Duration::from_secs(10));
    // Go bounds every Redis command by REDIS_TIMEOUT: set, it is each decision's deadline too
    // (unset, the decision keeps Portcullis' short deadline, under Envoy's 20 ms timeout).
    if r.get("REDIS_TIMEOUT").is_some() {
        s.store_timeout = s.redis_connect_timeout;
    }
    s.key_prefix = r.string("CACHE_KEY_PREFIX", "");
    let local_cache = r.number::<usize>("LOCAL_CACHE_SIZE_IN_BYTES", 0);
    s.deny_cache = local_cache > 0;
    if local_cache > 0 {
        s.deny_cache_max_bytes = local_cache;
    }

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
        s.otlp_endpoint = Some(
            r.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                .or_else(|| r.get("OTEL_EXPORTER_OTLP_ENDPOINT"))
                .unwrap_or_else(|| default_endpoint.to_owned()),
        );
        s.otlp_protocol = protocol;
        s.otel_service_name = r.string("TRACING_SERVICE_NAME", "RateLimit");
        s.otel_service_namespace = r.get("TRACING_SERVICE_NAMESPACE");
        s.otel_service_instance_id = r.get("TRACING_SERVICE_INSTANCE_ID");
        s.traces_sampling_ratio = Some(r.number("TRACING_SAMPLING_RATE", 1.0));
    } else {
        s.otlp_endpoint = None;
    }

    s.ignored_variables = IGNORED
        .iter()
        .filter(|(name, _)| r.get(name).is_some())
        .map(|(name, why)| format!("{name}: {why}"))
        .collect();
    if r.problems.is_empty() {
        Ok(s)
    } else {
        Err(SettingsError(r.problems))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: std::collections::HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| map.get(name).cloned()
    }

    fn base() -> Settings {
        Settings::for_tests(PathBuf::from("/unused"))
    }

    #[test]
    fn go_durations_parse_as_go_parses_them() {
        assert_eq!(parse_go_duration("10s"), Some(Duration::from_secs(10)));
        assert_eq!(parse_go_duration("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_go_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_go_duration("24h"), Some(Duration::from_secs(86_400)));
        assert_eq!(parse_go_duration("1.5h"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_go_duration("0"), Some(Duration::ZERO));
        assert_eq!(parse_go_duration("10"), None);
        assert_eq!(parse_go_duration("ten s"), None);
    }

    #[test]
    fn the_go_defaults_and_redis_url_forms() {
        let s = from_go_env(base(), &env(&[])).unwrap();
        assert_eq!(s.grpc_addr, "0.0.0.0:8081".parse().unwrap());
        assert_eq!(s.admin_addr, "0.0.0.0:6070".parse().unwrap());
        assert_eq!(
            s.http_listeners[0].addr,
            "0.0.0.0:8080".parse::<SocketAddr>().unwrap()
        );
        assert_eq!(s.config, PathBuf::from("/srv/runtime_data/current/config"));
        assert_eq!(
            s.redis_url.as_deref(),
            Some("redis+unix:///var/run/nutcracker/ratelimit.sock")
        );
        assert_eq!(s.statsd_addr.as_deref(), Some("localhost:8125"));
        assert_eq!(s.default_algorithm, Algorithm::FixedWindow);
        assert_eq!(s.failure_mode, FailureMode::Error);
        assert_eq!(s.redis_pool_size, 10);
        assert_eq!(s.store_timeout, base().store_timeout);

        let s = from_go_env(base(), &env(&[("EXTRA_TAGS", "release:v1,zone:eu")])).unwrap();
        assert_eq!(
            s.statsd_tags,
            [
                ("release".into(), "v1".into()),
                ("zone".into(), "eu".into())
            ]
        );
        let Err(e) = from_go_env(base(), &env(&[("EXTRA_TAGS", "release:v1:x")])) else {
            panic!("a tag Go cannot read is refused");
        };
        assert!(e.to_string().contains("EXTRA_TAGS"), "{e}");

        // Go bounds each Redis command by REDIS_TIMEOUT: so does every decision.
        let s = from_go_env(base(), &env(&[("REDIS_TIMEOUT", "250ms")])).unwrap();
        assert_eq!(s.store_timeout, Duration::from_millis(250));
        assert_eq!(s.redis_connect_timeout, Duration::from_millis(250));

        let s = from_go_env(
            base(),
            &env(&[
                ("REDIS_SOCKET_TYPE", "tcp"),
                ("REDIS_URL", "redis.internal:6379"),
                ("REDIS_TLS", "true"),
                ("REDIS_AUTH", "limiter:s3cret"),
                ("CACHE_KEY_PREFIX", "rl_"),
            ]),
        )
        .unwrap();
        assert_eq!(s.redis_url.as_deref(), Some("rediss://redis.internal:6379"));
        assert_eq!(s.redis_user.as_deref(), Some("limiter"));
        assert_eq!(s.redis_password.map(|p| p.0).as_deref(), Some("s3cret"));
        assert_eq!(s.key_prefix, "rl_");

        let s = from_go_env(
            base(),
            &env(&[
                ("REDIS_TYPE", "sentinel"),
                ("REDIS_URL", "mymaster,10.0.0.1:26379,10.0.0.2:26379"),
                ("REDIS_SENTINEL_AUTH", "sentinel-pass"),
            ]),
        )
        .unwrap();
        assert_eq!(s.redis_master.as_deref(), Some("mymaster"));
        assert_eq!(s.redis_sentinel, vec!["10.0.0.1:26379", "10.0.0.2:26379"]);
        assert_eq!(
            s.redis_sentinel_password.map(|p| p.0).as_deref(),
            Some("sentinel-pass")
        );

        let s = from_go_env(
            base(),
            &env(&[("REDIS_TYPE", "CLUSTER"), ("REDIS_URL", "a:7000,b:7001")]),
        )
        .unwrap();
        assert_eq!(s.redis_cluster, vec!["a:7000", "b:7001"]);
    }

    #[test]
    fn envoy_gateways_environment_takes_rules_over_xds() {
        // What Envoy Gateway sets on the rate-limit Deployment it manages.
        let s = from_go_env(
            base(),
            &env(&[
                ("RUNTIME_ROOT", "/data"),
                ("RUNTIME_SUBDIRECTORY", "ratelimit"),
                ("RUNTIME_IGNOREDOTFILES", "true"),
                ("RUNTIME_WATCH_ROOT", "false"),
                ("LOG_LEVEL", "info"),
                ("USE_STATSD", "true"),
                ("STATSD_PORT", "9125"),
                ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
                ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
                ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
                ("GRPC_SERVER_USE_TLS", "true"),
                ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
                ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
                ("GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt"),
                ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
                ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt"),
                ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/certs/tls.key"),
                ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"),
                ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
                ("REDIS_SOCKET_TYPE", "tcp"),
                ("REDIS_URL", "redis.redis.svc:6379"),
            ]),
        )
        .unwrap();
        assert_eq!(s.rules_xds_server.as_deref(), Some("envoy-gateway:18001"));
        assert_eq!(s.rules_xds_node_id, "envoy-ratelimit");
        assert!(s.rules_xds_tls && s.force_start_without_initial_rules);
        assert_eq!(s.rules_xds_ca_file, Some(PathBuf::from("/certs/ca.crt")));
        assert_eq!(s.rules_xds_cert, Some(PathBuf::from("/certs/tls.crt")));
        assert_eq!(s.rules_xds_backoff_initial, Duration::from_secs(10));
        assert_eq!(s.grpc_tls_cert, Some(PathBuf::from("/certs/tls.crt")));
        // The Go service reads no GRPC_SERVER_TLS_CA_CERT: clients are not asked for certificates.
        assert_eq!(s.grpc_tls_client_ca, None);
        assert_eq!(s.redis_url.as_deref(), Some("redis://redis.redis.svc:6379"));
        assert_eq!(s.statsd_addr.as_deref(), Some("localhost:9125"));
        let ignored = s.ignored_variables.join("\n");
        for name in [
            "RUNTIME_IGNOREDOTFILES",
            "RUNTIME_WATCH_ROOT",
            "GRPC_SERVER_TLS_CA_CERT",
        ] {
            assert!(ignored.contains(name), "{name} in {ignored}");
        }
        assert!(s.validate().is_ok());
    }

    #[test]
    fn portcullis_own_choice_of_algorithm_and_failure_mode_wins_where_set() {
        let mut own = base();
        own.default_algorithm = Algorithm::SlidingWindow;
        own.failure_mode = FailureMode::Local;
        let s = from_go_env(
            own,
            &env(&[
                ("PORTCULLIS_DEFAULT_ALGORITHM", "sliding-window"),
                ("PORTCULLIS_FAILURE_MODE", "local"),
            ]),
        )
        .unwrap();
        assert_eq!(s.default_algorithm, Algorithm::SlidingWindow);
        assert_eq!(s.failure_mode, FailureMode::Local);
        assert_eq!(s.override_algorithm, Algorithm::FixedWindow);
    }

    #[test]
    fn what_cannot_be_honoured_stops_the_start_naming_the_variable() {
        let Err(e) = from_go_env(
            base(),
            &env(&[
                ("BACKEND_TYPE", "memcache"),
                ("REDIS_PERSECOND", "true"),
                ("REDIS_PERSECOND_TYPE", "RING"),
            ]),
        ) else {
            panic!("refused");
        };
        let text = e.to_string();
        assert!(
            text.contains("BACKEND_TYPE") && text.contains("REDIS_PERSECOND_TYPE"),
            "{text}"
        );
        // The per-second Redis is read from its own variables.
        let s = from_go_env(
            base(),
            &env(&[
                ("REDIS_SOCKET_TYPE", "tcp"),
                ("REDIS_URL", "main:6379"),
                ("REDIS_PERSECOND", "true"),
                ("REDIS_PERSECOND_TYPE", "cluster"),
                ("REDIS_PERSECOND_URL", "a:7000,b:7001"),
                ("REDIS_PERSECOND_AUTH", "fast:pw"),
            ]),
        )
        .unwrap();
        let fast = s.redis_per_second.expect("a per-second Redis");
        assert_eq!(s.redis_url.as_deref(), Some("redis://main:6379"));
        assert_eq!(fast.redis_cluster, vec!["a:7000", "b:7001"]);
        assert_eq!(fast.redis_user.as_deref(), Some("fast"));
        assert!(fast.redis_url.is_none());
        let Err(e) = from_go_env(base(), &env(&[("SHADOW_MODE", "maybe")])) else {
            panic!("refused");
        };
        assert!(e.to_string().contains("SHADOW_MODE"), "{e}");
    }
}
