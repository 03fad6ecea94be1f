//! Every flag of the command line, each also read from a `PORTCULLIS_*` environment variable
//! (Kubernetes sets those). This is the only place that reads the environment; only `main` and the
//! composition root (`server`) read a `Settings`, and they hand the floors below plain values.
//! The command line's names for the domain's choices (failure mode, headers, log format) are
//! defined here and mapped onto the domain's enums, so those enums know nothing of clap.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use clap::builder::{EnumValueParser, PossibleValuesParser, TypedValueParser};

use crate::algorithm::Algorithm;
use crate::limiter::FailureMode;
use crate::service::HeadersMode;
use crate::service::admin::Routes;
use crate::store::redis::Layout;
use crate::telemetry::LogFormat;

mod cli;
mod decisions;
mod defaults;
mod derived;
pub mod go;
mod rlqs;
mod sources;
mod tracing;
mod validate;
mod values;
mod variables;
mod xds;

pub use cli::{Cli, Command};
pub use cli::{parse_command_line, refuse_unknown_variables};
pub use decisions::Decisions;
pub use rlqs::RlqsSettings;
pub use sources::Sources;
pub use tracing::{TRACES_SAMPLERS, TracingSettings};
pub use validate::SettingsError;
use values::{AlgorithmArg, FailureModeArg, HeadersArg, LogFormatArg};
pub use values::{Secret, StoreKind, parse_duration, parse_tag};
pub use variables::unknown as unknown_variables;
pub use xds::XdsSettings;

/// One more HTTP listener and what it serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpListener {
    pub addr: SocketAddr,
    pub routes: Routes,
}

/// No `Debug`: the Redis URL and password must not be printable by accident.
#[derive(Clone, Args)]
pub struct Settings {
    /// Directory of rule files (every non-dot file in it).
    #[arg(
        long,
        env = "PORTCULLIS_CONFIG",
        default_value = "/etc/portcullis/rules"
    )]
    pub config: PathBuf,
    /// gRPC listen address (envoy.service.ratelimit.v3 and grpc.health.v1).
    #[arg(long, env = "PORTCULLIS_GRPC_ADDR", default_value = "127.0.0.1:8081")]
    pub grpc_addr: SocketAddr,
    /// PEM certificate chain for TLS on the gRPC listener (re-read when it changes).
    #[arg(long, env = "PORTCULLIS_GRPC_TLS_CERT")]
    pub grpc_tls_cert: Option<PathBuf>,
    /// PEM private key for --grpc-tls-cert.
    #[arg(long, env = "PORTCULLIS_GRPC_TLS_KEY")]
    pub grpc_tls_key: Option<PathBuf>,
    /// PEM CA whose client certificates are required (mTLS).
    #[arg(long, env = "PORTCULLIS_GRPC_TLS_CLIENT_CA")]
    pub grpc_tls_client_ca: Option<PathBuf>,
    /// With --grpc-tls-client-ca: a name (DNS SAN) every client certificate must carry.
    #[arg(long, env = "PORTCULLIS_GRPC_TLS_CLIENT_SAN")]
    pub grpc_tls_client_san: Option<String>,
    /// Close gRPC connections after this age (clients reconnect, so load spreads over new
    /// replicas); unset: never.
    #[arg(long, env = "PORTCULLIS_GRPC_MAX_CONNECTION_AGE", value_parser = parse_duration)]
    pub grpc_max_connection_age: Option<Duration>,
    /// How long calls on a connection past its age may still finish.
    #[arg(long, env = "PORTCULLIS_GRPC_MAX_CONNECTION_AGE_GRACE", value_parser = parse_duration)]
    pub grpc_max_connection_age_grace: Option<Duration>,
    /// Admin HTTP listen address (/healthz, /readyz, /rlconfig, /rlqs, /metrics, /stats; /json and
    /// /scaling when enabled).
    #[arg(long, env = "PORTCULLIS_ADMIN_ADDR", default_value = "127.0.0.1:8080")]
    pub admin_addr: SocketAddr,
    /// Serve POST /json on the admin listener (a rate-limit call in JSON: it spends budget).
    #[arg(long, env = "PORTCULLIS_ADMIN_JSON")]
    pub admin_json: bool,
    /// Serve GET and POST /scaling on the admin listener: temporary factors on limits ("halve
    /// domain edge for 30 minutes"), kept in the store so every replica applies them.
    #[arg(long, env = "PORTCULLIS_ADMIN_SCALING")]
    pub admin_scaling: bool,
    /// A file holding the bearer token `POST /scaling` requires (`Authorization: Bearer ...`;
    /// a mounted Secret; read on each change, so a rotated Secret applies). Required with
    /// --admin-scaling unless the admin listener is loopback-only.
    #[arg(long, env = "PORTCULLIS_ADMIN_SCALING_TOKEN_FILE")]
    pub admin_scaling_token_file: Option<PathBuf>,
    /// A YAML file of factors on limits (`global`, `domains`, `names`), watched like the rules.
    #[arg(long, env = "PORTCULLIS_SCALING_FILE")]
    pub scaling_file: Option<PathBuf>,
    /// Admin connections whose request headers take longer than this are closed.
    #[arg(long, env = "PORTCULLIS_ADMIN_HEADER_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub admin_header_timeout: Duration,
    /// Most concurrent requests (HTTP/2 streams) on one gRPC connection.
    #[arg(
        long,
        env = "PORTCULLIS_GRPC_MAX_CONCURRENT_STREAMS",
        default_value_t = 1024
    )]
    pub grpc_max_concurrent_streams: u32,
    /// Most ShouldRateLimit calls in progress at once, all connections together; past it a call
    /// is refused at once with RESOURCE_EXHAUSTED (Envoy's failure_mode_deny then decides).
    #[arg(long, env = "PORTCULLIS_MAX_IN_FLIGHT", default_value_t = 10_000)]
    pub max_in_flight: usize,
    /// Interval of HTTP/2 PINGs on idle gRPC connections (a vanished peer is noticed).
    #[arg(long, env = "PORTCULLIS_GRPC_KEEPALIVE_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    pub grpc_keepalive_interval: Duration,
    /// A gRPC connection whose PING is not answered within this is closed.
    #[arg(long, env = "PORTCULLIS_GRPC_KEEPALIVE_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub grpc_keepalive_timeout: Duration,
    /// Longest a gRPC request may take, whatever the client's own deadline (default: the store
    /// timeout plus one second; it must leave the failure mode time to answer).
    #[arg(long, env = "PORTCULLIS_GRPC_REQUEST_TIMEOUT", value_parser = parse_duration)]
    pub grpc_request_timeout: Option<Duration>,
    /// Where counters live.
    #[arg(long, env = "PORTCULLIS_STORE", value_enum, default_value = "memory")]
    pub store: StoreKind,
    /// Redis server URL (`redis://[user:password@]host:port[/db]`, `rediss://` for TLS).
    #[arg(long, env = "PORTCULLIS_REDIS_URL", hide_env_values = true)]
    pub redis_url: Option<String>,
    /// A second Redis for per-second limits (`redis://...`, standalone; the other Redis settings
    /// are shared): every limit whose unit is a second is counted there, the rest in the first
    /// (envoyproxy/ratelimit's REDIS_PERSECOND). Refused with --rlqs: grants claim their part
    /// in the main Redis only.
    #[arg(long, env = "PORTCULLIS_REDIS_PER_SECOND_URL", hide_env_values = true)]
    pub redis_per_second_url: Option<String>,
    /// The per-second Redis in full, as Go mode reads it from REDIS_PERSECOND_*; built from
    /// --redis-per-second-url otherwise.
    #[arg(skip)]
    pub redis_per_second: Option<Box<Settings>>,
    /// Redis Cluster seed nodes, `host:port,host:port,...`.
    #[arg(long, env = "PORTCULLIS_REDIS_CLUSTER", value_delimiter = ',')]
    pub redis_cluster: Vec<String>,
    /// Redis Sentinel nodes, `host:port,host:port,...` (with --redis-master).
    #[arg(long, env = "PORTCULLIS_REDIS_SENTINEL", value_delimiter = ',')]
    pub redis_sentinel: Vec<String>,
    /// The master's name the sentinels monitor.
    #[arg(long, env = "PORTCULLIS_REDIS_MASTER")]
    pub redis_master: Option<String>,
    /// Connect to Redis over TLS (rustls, system trust roots).
    #[arg(long, env = "PORTCULLIS_REDIS_TLS")]
    pub redis_tls: bool,
    /// PEM client certificate presented to Redis (TLS client authentication), with its key.
    #[arg(long, env = "PORTCULLIS_REDIS_TLS_CERT")]
    pub redis_tls_cert: Option<PathBuf>,
    /// PEM private key of --redis-tls-cert.
    #[arg(long, env = "PORTCULLIS_REDIS_TLS_KEY")]
    pub redis_tls_key: Option<PathBuf>,
    /// Accept a Redis certificate whose name does not match the address (the chain is still
    /// verified): for endpoints reached through an address the certificate does not name.
    #[arg(long, env = "PORTCULLIS_REDIS_TLS_SKIP_HOSTNAME_VERIFICATION")]
    pub redis_tls_skip_hostname_verification: bool,
    /// PEM file of the CA that signed the Redis servers' certificates (default: system roots).
    #[arg(long, env = "PORTCULLIS_REDIS_CA_FILE")]
    pub redis_ca_file: Option<PathBuf>,
    /// Redis ACL user.
    #[arg(long, env = "PORTCULLIS_REDIS_USER")]
    pub redis_user: Option<String>,
    /// Redis password (prefer the environment variable: command lines are visible to others).
    #[arg(long, env = "PORTCULLIS_REDIS_PASSWORD", hide_env_values = true)]
    pub redis_password: Option<Secret>,
    /// Sentinels only: their own ACL user (the data nodes use --redis-user).
    #[arg(long, env = "PORTCULLIS_REDIS_SENTINEL_USER")]
    pub redis_sentinel_user: Option<String>,
    /// Sentinels only: their own password (the data nodes use --redis-password).
    #[arg(
        long,
        env = "PORTCULLIS_REDIS_SENTINEL_PASSWORD",
        hide_env_values = true
    )]
    pub redis_sentinel_password: Option<Secret>,
    /// Sentinels only: connect to them over TLS (independent of --redis-tls for the data nodes).
    #[arg(long, env = "PORTCULLIS_REDIS_SENTINEL_TLS")]
    pub redis_sentinel_tls: bool,
    /// Sentinels only: PEM CA for their certificates (implies --redis-sentinel-tls).
    #[arg(long, env = "PORTCULLIS_REDIS_SENTINEL_CA_FILE")]
    pub redis_sentinel_ca_file: Option<PathBuf>,
    /// Longest one connection set-up to Redis may take (DNS, TCP, TLS, AUTH, Sentinel lookup);
    /// separate from --store-timeout, which bounds each call on a connection already made.
    #[arg(long, env = "PORTCULLIS_REDIS_CONNECT_TIMEOUT", default_value = "2s", value_parser = parse_duration)]
    pub redis_connect_timeout: Duration,
    /// Connections in the standalone/Sentinel pool (each multiplexed; see BENCHMARKS.md).
    #[arg(long, env = "PORTCULLIS_REDIS_POOL_SIZE", default_value_t = 2)]
    pub redis_pool_size: u32,
    /// How new counters (sliding window, fixed window, token bucket) are stored in Redis: `hash`
    /// (0.1.0's layout, the default in 0.2: replicas of 0.1.0 read only hashes, so a rolling
    /// update from 0.1.0 shares every budget in one rollout) or `packed` (one string per counter,
    /// written with its expiry by one command: a third of a sliding window's memory, a fifth to
    /// two fifths less Redis CPU for a new counter; set it once no replica of 0.1.0 shares the
    /// Redis).
    /// Either layout is read as it is stored.
    #[arg(
        long,
        env = "PORTCULLIS_REDIS_LAYOUT",
        default_value = "hash",
        value_parser = PossibleValuesParser::new(["packed", "hash"]).map(|l| {
            if l == "hash" { Layout::Hash } else { Layout::Packed }
        })
    )]
    pub redis_layout: Layout,
    /// Replicas that must have a script call's writes before its answer stands (Redis `WAIT`
    /// after each call, within its --store-timeout, on every Redis used, a per-second one too):
    /// a call not acknowledged in time is answered by --failure-mode, so no admitted hit is lost
    /// at a failover. 0, the default: the master's answer stands, and a failover to a replica
    /// that was behind admits again what it had not received.
    #[arg(long, env = "PORTCULLIS_REDIS_WAIT_REPLICAS", default_value_t = 0)]
    pub redis_wait_replicas: u32,
    /// Prefix of every Redis key, so deployments can share a Redis.
    #[arg(long, env = "PORTCULLIS_KEY_PREFIX", default_value = "portcullis:")]
    pub key_prefix: String,
    /// Deadline of one store call; past it the failure mode answers (keep it below Envoy's
    /// rate-limit timeout, 20ms by default).
    #[arg(long, env = "PORTCULLIS_STORE_TIMEOUT", default_value = "15ms", value_parser = parse_duration)]
    pub store_timeout: Duration,
    /// Refuse a request the store refused, until its retry time, without asking the store again
    /// (Redis only; `--deny-cache false` turns it off).
    #[arg(long, env = "PORTCULLIS_DENY_CACHE", default_value_t = true, action = clap::ArgAction::Set)]
    pub deny_cache: bool,
    /// Most denials the deny cache holds.
    #[arg(
        long,
        env = "PORTCULLIS_DENY_CACHE_MAX_ENTRIES",
        default_value_t = 100_000
    )]
    pub deny_cache_max_entries: usize,
    /// Most memory the deny cache's entries are accounted at, in bytes (keys and bookkeeping).
    #[arg(long, env = "PORTCULLIS_DENY_CACHE_MAX_BYTES", default_value_t = 16 << 20)]
    pub deny_cache_max_bytes: usize,
    /// The longest a refusal is remembered, whatever its retry time: a refund made on another
    /// replica is seen after at most this.
    #[arg(long, env = "PORTCULLIS_DENY_CACHE_MAX_AGE", default_value = "1s", value_parser = parse_duration)]
    pub deny_cache_max_age: Duration,
    /// Hits a second on one counter, on this replica, from which the replica claims part of it
    /// (hits charged in Redis ahead of their calls) and decides its calls from memory, without a
    /// Redis call, until the claim is spent or its window (a sliding window's sub-window) ends:
    /// exact, never past the limit; what a claim leaves unspent when its window ends is not
    /// admitted (docs/algorithms.md states the bound). 0 turns it off (the default, for now).
    /// Redis only.
    #[arg(long, env = "PORTCULLIS_HOT_DESCRIPTOR_RATE", default_value_t = 0.0)]
    pub hot_descriptor_rate: f64,
    /// Most counters the memory store (and the `local` failure mode's) holds, about 400 bytes
    /// each, and as many concurrency slots held in all (8 bytes each). When full, a new
    /// descriptor is answered by the failure mode (counted, logged) until counters expire: a
    /// live counter is never evicted, which would hand its budget back.
    #[arg(long, env = "PORTCULLIS_MEMORY_MAX_COUNTERS", default_value_t = crate::store::memory::DEFAULT_MAX_COUNTERS)]
    pub memory_max_counters: usize,
    /// What to answer when the store errs or misses its deadline.
    #[arg(
        long,
        env = "PORTCULLIS_FAILURE_MODE",
        default_value = "allow",
        value_parser = EnumValueParser::<FailureModeArg>::new().map(FailureMode::from)
    )]
    pub failure_mode: FailureMode,
    /// Rate-limit headers added to responses (leave off when Envoy writes its own with
    /// `enable_x_ratelimit_headers`: both on send every header twice).
    #[arg(
        long,
        env = "PORTCULLIS_RESPONSE_HEADERS",
        default_value = "off",
        value_parser = EnumValueParser::<HeadersArg>::new().map(HeadersMode::from)
    )]
    pub response_headers: HeadersMode,
    /// Count everything but never answer OVER_LIMIT (trying rules out in production).
    #[arg(long, env = "PORTCULLIS_SHADOW_MODE")]
    pub shadow_mode: bool,
    /// Treat every limit as a quota: a call is OVER_LIMIT only when every one of its descriptors
    /// is (the Go service's QUOTA_MODE; per rule: `quota_mode: true`).
    #[arg(long, env = "PORTCULLIS_QUOTA_MODE")]
    pub quota_mode: bool,
    /// When any descriptor of a call is over its limit, charge none of them (the Go service's
    /// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT). Atomic on memory and standalone Redis; see the
    /// Redis guide (docs/redis.md) for Cluster.
    #[arg(long, env = "PORTCULLIS_STOP_CHARGING_WHEN_OVER")]
    pub stop_charging_when_over: bool,
    /// Describe each call in the response's dynamic metadata, with the matched rules' `metadata`
    /// (the Go service's RESPONSE_DYNAMIC_METADATA).
    #[arg(long, env = "PORTCULLIS_RESPONSE_DYNAMIC_METADATA")]
    pub response_dynamic_metadata: bool,
    /// Merge a domain defined in several files instead of refusing it (MERGE_DOMAIN_CONFIG).
    #[arg(long, env = "PORTCULLIS_MERGE_DOMAIN_CONFIG")]
    pub merge_domain_config: bool,
    /// The algorithm of limits a request carries itself (Envoy's `limit` override); the Go
    /// service counts them in fixed windows.
    #[arg(
        long,
        env = "PORTCULLIS_OVERRIDE_ALGORITHM",
        default_value = "fixed-window",
        value_parser = EnumValueParser::<AlgorithmArg>::new().map(Algorithm::from)
    )]
    pub override_algorithm: Algorithm,
    /// Name of the header carrying the limit (default: the --response-headers mode's).
    #[arg(long, env = "PORTCULLIS_HEADER_LIMIT_NAME")]
    pub header_limit_name: Option<String>,
    /// Name of the header carrying what remains.
    #[arg(long, env = "PORTCULLIS_HEADER_REMAINING_NAME")]
    pub header_remaining_name: Option<String>,
    /// Name of the header carrying the seconds until reset.
    #[arg(long, env = "PORTCULLIS_HEADER_RESET_NAME")]
    pub header_reset_name: Option<String>,
    /// Most descriptors accepted in one request.
    #[arg(long, env = "PORTCULLIS_MAX_DESCRIPTORS", default_value_t = 512)]
    pub max_descriptors: usize,
    /// Most entries accepted in one descriptor.
    #[arg(long, env = "PORTCULLIS_MAX_ENTRIES", default_value_t = 64)]
    pub max_entries: usize,
    /// Longest domain, descriptor key or descriptor value accepted, in bytes (each); longer is
    /// INVALID_ARGUMENT. Bounds every counter key, metric label and cache entry a request makes.
    #[arg(long, env = "PORTCULLIS_MAX_STRING_BYTES", default_value_t = 1024)]
    pub max_string_bytes: usize,
    /// Largest RLS request message accepted, in bytes (Envoy's requests are a few hundred
    /// bytes). RLQS reports are bounded by the --rlqs-max-bucket* flags instead.
    #[arg(long, env = "PORTCULLIS_MAX_MESSAGE_BYTES", default_value_t = 64 * 1024)]
    pub max_message_bytes: usize,
    /// Most per-value metric series that `detailed_metric` rules may create (all rules together);
    /// beyond it, hits count under the rule's own label and in detailed_series_folded.
    #[arg(long, env = "PORTCULLIS_MAX_DETAILED_SERIES", default_value_t = 2000)]
    pub max_detailed_series: usize,
    /// Share of a limit above which allowed hits also count in the near_limit metric.
    #[arg(long, env = "PORTCULLIS_NEAR_LIMIT_RATIO", default_value_t = 0.8)]
    pub near_limit_ratio: f64,
    /// Accept a rules reload that removes a domain in service or leaves no domain at all (by
    /// default such a reload is refused, logged and counted: usually a ConfigMap emptied by
    /// mistake, which would silently stop every limit of the domain).
    #[arg(long, env = "PORTCULLIS_ALLOW_RULES_REMOVAL")]
    pub allow_rules_removal: bool,
    /// Start with a rules directory that holds no rules (every call answered OK until some
    /// arrive); by default such a start is refused, naming where rules may be instead.
    #[arg(long, env = "PORTCULLIS_ALLOW_EMPTY_RULES")]
    pub allow_empty_rules: bool,
    /// Make /readyz fail while no domain is loaded (the Go service's
    /// HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED).
    #[arg(long, env = "PORTCULLIS_READY_REQUIRES_RULES")]
    pub ready_requires_rules: bool,
    /// Stay ready while the store refuses us for a reason waiting cannot heal (wrong password,
    /// missing ACL permission, rejected certificate); by default /readyz then fails.
    #[arg(long, env = "PORTCULLIS_READY_ON_PERMANENT_STORE_ERRORS")]
    pub ready_on_permanent_store_errors: bool,
    /// Make /readyz fail while the store does not answer (by default it only reports it).
    #[arg(long, env = "PORTCULLIS_READY_REQUIRES_STORE")]
    pub ready_requires_store: bool,
    /// Not ready until the store has answered once since start (a replica of its own Deployment
    /// should take no calls it can only answer by its failure mode; the Go drop-in mode's
    /// default). Off by default: as a sidecar, readiness gates the gateway's own pod.
    #[arg(long, env = "PORTCULLIS_READY_REQUIRES_FIRST_STORE_ANSWER")]
    pub ready_requires_first_store_answer: bool,
    /// After SIGTERM/SIGINT: how long to keep answering while health reports NOT_SERVING.
    #[arg(long, env = "PORTCULLIS_DRAIN_PERIOD", default_value = "5s", value_parser = parse_duration)]
    pub drain_period: Duration,
    /// How often the rules directory is checked for changes.
    #[arg(long, env = "PORTCULLIS_RELOAD_INTERVAL", default_value = "1s", value_parser = parse_duration)]
    pub reload_interval: Duration,
    /// Traces: where they go and which are kept (the standard `OTEL_*` variables).
    #[command(flatten)]
    pub traces: TracingSettings,
    /// Send counters to a statsd server (`host:port`, UDP) under envoyproxy/ratelimit's stat
    /// names, for dashboards built on its statsd output.
    #[arg(long, env = "PORTCULLIS_STATSD_ADDR")]
    pub statsd_addr: Option<String>,
    /// How often counters are sent to statsd.
    #[arg(long, env = "PORTCULLIS_STATSD_FLUSH_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    pub statsd_flush_interval: Duration,
    /// A tag on every statsd counter, `KEY=VALUE` (repeat the flag, or commas in the variable):
    /// written into the name as envoyproxy/ratelimit's statsd library does (`NAME.__KEY=VALUE`,
    /// keys sorted, `.:|` in values as `_`), or as DogStatsD tags with --statsd-dogstatsd.
    #[arg(long = "statsd-tag", env = "PORTCULLIS_STATSD_TAGS", value_delimiter = ',', value_parser = parse_tag)]
    pub statsd_tags: Vec<(String, String)>,
    /// Send statsd tags the DogStatsD way (`NAME:1|c|#KEY:VALUE`).
    #[arg(long, env = "PORTCULLIS_STATSD_DOGSTATSD")]
    pub statsd_dogstatsd: bool,
    /// Serve Prometheus metrics under envoyproxy/ratelimit's names and labels (its Prometheus
    /// sink's mapping) on this address, for dashboards and alerts built on them.
    #[arg(long, env = "PORTCULLIS_GO_METRICS_ADDR")]
    pub go_metrics_addr: Option<SocketAddr>,
    /// A statsd_exporter mapping file (as envoyproxy/ratelimit's PROMETHEUS_MAPPER_YAML) that
    /// shapes --go-metrics-addr's series instead of the default mapping; read at start.
    #[arg(long, env = "PORTCULLIS_GO_METRICS_MAPPING")]
    pub go_metrics_mapping: Option<PathBuf>,
    /// The path of --go-metrics-addr's metrics.
    #[arg(long, env = "PORTCULLIS_GO_METRICS_PATH", default_value = "/metrics")]
    pub go_metrics_path: String,
    /// The algorithm of rules that do not say (`algorithm:`); the Go service counts fixed windows.
    #[arg(
        long,
        env = "PORTCULLIS_DEFAULT_ALGORITHM",
        default_value = "sliding-window",
        value_parser = EnumValueParser::<AlgorithmArg>::new().map(Algorithm::from)
    )]
    pub default_algorithm: Algorithm,
    /// Read envoyproxy/ratelimit's environment variables instead (`go`): what a Deployment
    /// written for the Go service sets. Running the binary as `ratelimit` does the same.
    #[arg(long, env = "PORTCULLIS_ENV_COMPAT", value_parser = PossibleValuesParser::new(["go"]))]
    pub env_compat: Option<String>,
    /// Rules over xDS (`--rules-xds-*`).
    #[command(flatten)]
    pub xds: XdsSettings,
    /// The quota service (`--rlqs-*`).
    #[command(flatten)]
    pub rlqs: RlqsSettings,
    /// With xDS: serve before the first rules arrive (every call OK until then) instead of
    /// waiting for them.
    #[arg(long, env = "PORTCULLIS_FORCE_START_WITHOUT_INITIAL_RULES")]
    pub force_start_without_initial_rules: bool,
    /// More HTTP listeners, each with its own routes (set by Go mode: Go's PORT and DEBUG_PORT).
    #[arg(skip)]
    pub http_listeners: Vec<HttpListener>,
    /// Go mode: variables read but deliberately not acted on, logged once at start-up.
    #[arg(skip)]
    pub ignored_variables: Vec<String>,
    /// Go mode's REDIS_STARTUP_MAX_ELAPSED_TIME: the process exits when the store has not
    /// answered once within this after start.
    #[arg(skip)]
    pub store_startup_limit: Option<Duration>,
    /// Which flags the user set, and by which variable (for messages that name them).
    #[arg(skip)]
    pub sources: Sources,
    /// Log level or filter (RUST_LOG syntax); RUST_LOG wins when set.
    #[arg(long, env = "PORTCULLIS_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
    /// Log lines as `text` or `json` (one object a line), on stderr.
    #[arg(
        long,
        env = "PORTCULLIS_LOG_FORMAT",
        default_value = "text",
        value_parser = EnumValueParser::<LogFormatArg>::new().map(LogFormat::from)
    )]
    pub log_format: LogFormat,
}

#[cfg(test)]
mod tests;
