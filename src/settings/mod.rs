//! Every flag of the command line, each also read from a `PORTCULLIS_*` environment variable
//! (Kubernetes sets those). This is the only place that reads the environment; only `main` and the
//! composition root (`server`) read a `Settings`, and they hand the floors below plain values.
//! The command line's names for the domain's choices (failure mode, headers, log format) are
//! defined here and mapped onto the domain's enums, so those enums know nothing of clap.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::builder::{EnumValueParser, PossibleValuesParser, TypedValueParser};
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::algorithm::Algorithm;
use crate::limiter::FailureMode;
use crate::rules::LoadOptions;
use crate::service::HeadersMode;
use crate::service::admin::Routes;
use crate::telemetry::{LogFormat, OtlpProtocol, TracingConfig};

pub mod go;

/// One more HTTP listener and what it serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpListener {
    pub addr: SocketAddr,
    pub routes: Routes,
}

#[derive(Parser)]
#[command(
    name = "portcullis",
    version,
    about = "Rate-limit service for Envoy and Istio"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Serve envoy.service.ratelimit.v3 over gRPC, and the admin HTTP listener.
    Serve(Box<Settings>),
    /// Validate a rules directory; exit 1 listing every problem.
    Check {
        /// The rules directory.
        dir: PathBuf,
        /// Merge a domain defined in several files (as `serve --merge-domain-config`).
        #[arg(long, env = "PORTCULLIS_MERGE_DOMAIN_CONFIG")]
        merge_domain_config: bool,
    },
    /// Show which rule a descriptor matches, level by level, and why.
    Explain {
        #[arg(long, env = "PORTCULLIS_CONFIG")]
        config: PathBuf,
        #[arg(long)]
        domain: String,
        /// The descriptor's entries in order, as key=value (key= for an empty value).
        #[arg(required = true, value_parser = parse_entry)]
        entries: Vec<(String, String)>,
        /// Merge a domain defined in several files (as `serve --merge-domain-config`).
        #[arg(long, env = "PORTCULLIS_MERGE_DOMAIN_CONFIG")]
        merge_domain_config: bool,
        /// Show the limit as this scaling file scales it (as `serve --scaling-file`; temporary
        /// factors live in the store: `GET /scaling` or `/rlconfig` of a running replica).
        #[arg(long, env = "PORTCULLIS_SCALING_FILE")]
        scaling_file: Option<PathBuf>,
    },
    /// Send one ShouldRateLimit request to a running server and print the answer.
    Ask {
        /// The server's gRPC address.
        #[arg(
            long,
            env = "PORTCULLIS_ASK_ADDR",
            default_value = "http://127.0.0.1:8081"
        )]
        addr: String,
        #[arg(long)]
        domain: String,
        /// Request-level hits_addend (0 counts as 1).
        #[arg(long, default_value_t = 0)]
        hits: u32,
        /// A descriptor as key=value[,key=value...]; repeat for several descriptors.
        #[arg(short = 'd', long = "descriptor", required = true, value_parser = parse_descriptor)]
        descriptors: Vec<Vec<(String, String)>>,
    },
}

/// One descriptor on the command line: `k=v[,k2=v2...]`.
fn parse_descriptor(text: &str) -> Result<Vec<(String, String)>, String> {
    text.split(',').map(parse_entry).collect()
}

fn parse_entry(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("{text:?} is not key=value"))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StoreKind {
    /// Counters in this process (one replica, or each replica its own budget).
    Memory,
    /// Counters in Redis, shared by every replica: standalone, Cluster or Sentinel.
    Redis,
}

/// A secret from the command line or environment: never printed by `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl std::str::FromStr for Secret {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Secret(s.to_owned()))
    }
}

/// `15ms`, `2s`, or a bare number of milliseconds.
/// `KEY=VALUE`, both non-empty.
pub fn parse_tag(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() && !value.is_empty() => {
            Ok((key.to_owned(), value.to_owned()))
        }
        _ => Err(format!("{text:?} is not KEY=VALUE")),
    }
}

pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, scale_us) = if let Some(n) = text.strip_suffix("ms") {
        (n, 1_000)
    } else if let Some(n) = text.strip_suffix("us") {
        (n, 1)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1_000_000)
    } else {
        (text, 1_000)
    };
    let value: u64 = number
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 15ms or 2s"))?;
    Ok(Duration::from_micros(value.saturating_mul(scale_us)))
}

/// `--failure-mode` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum FailureModeArg {
    /// Allow the request (fail open, like Envoy's default and Stripe's limiter).
    Allow,
    /// Refuse the request (fail closed).
    Deny,
    /// Count in this process's memory until the store answers again.
    Local,
    /// Answer with a gRPC error (UNAVAILABLE): Envoy's failure_mode_deny decides, as with the Go
    /// service.
    Error,
}

impl From<FailureModeArg> for FailureMode {
    fn from(arg: FailureModeArg) -> Self {
        match arg {
            FailureModeArg::Allow => FailureMode::Allow,
            FailureModeArg::Deny => FailureMode::Deny,
            FailureModeArg::Local => FailureMode::Local,
            FailureModeArg::Error => FailureMode::Error,
        }
    }
}

/// `--override-algorithm` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum AlgorithmArg {
    SlidingWindow,
    TokenBucket,
    FixedWindow,
}

impl From<AlgorithmArg> for Algorithm {
    fn from(arg: AlgorithmArg) -> Self {
        match arg {
            AlgorithmArg::SlidingWindow => Algorithm::SlidingWindow,
            AlgorithmArg::TokenBucket => Algorithm::TokenBucket,
            AlgorithmArg::FixedWindow => Algorithm::FixedWindow,
        }
    }
}

/// `--response-headers` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum HeadersArg {
    /// None (Envoy's default).
    Off,
    /// `x-ratelimit-limit`, `-remaining`, `-reset` as in draft-polli-ratelimit-headers-03, the
    /// format Envoy itself writes; plus `retry-after` when over the limit.
    Draft03,
    /// `ratelimit-limit`, `-remaining`, `-reset` and `ratelimit-policy`; plus `retry-after`.
    Ietf,
    /// The Go service's three headers only (`RateLimit-Limit`, `-Remaining`, `-Reset`).
    Go,
}

impl From<HeadersArg> for HeadersMode {
    fn from(arg: HeadersArg) -> Self {
        match arg {
            HeadersArg::Off => HeadersMode::Off,
            HeadersArg::Draft03 => HeadersMode::Draft03,
            HeadersArg::Ietf => HeadersMode::Ietf,
            HeadersArg::Go => HeadersMode::Go,
        }
    }
}

/// `--log-format` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LogFormatArg {
    Text,
    Json,
}

impl From<LogFormatArg> for LogFormat {
    fn from(arg: LogFormatArg) -> Self {
        match arg {
            LogFormatArg::Text => LogFormat::Text,
            LogFormatArg::Json => LogFormat::Json,
        }
    }
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
    /// Admin HTTP listen address (/healthz, /readyz, /rlconfig, /metrics).
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
    /// (envoyproxy/ratelimit's REDIS_PERSECOND).
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
    /// Most counters the memory store (and the `local` failure mode's) holds, about 400 bytes
    /// each. When full, a new descriptor is answered by the failure mode (counted, logged) until
    /// counters expire: a live counter is never evicted, which would hand its budget back.
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
    /// Rate-limit headers added to responses.
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
    /// README for Cluster.
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
    /// Largest request message accepted, in bytes (Envoy's requests are a few hundred bytes).
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
    /// After SIGTERM/SIGINT: how long to keep answering while health reports NOT_SERVING.
    #[arg(long, env = "PORTCULLIS_DRAIN_PERIOD", default_value = "5s", value_parser = parse_duration)]
    pub drain_period: Duration,
    /// How often the rules directory is checked for changes.
    #[arg(long, env = "PORTCULLIS_RELOAD_INTERVAL", default_value = "1s", value_parser = parse_duration)]
    pub reload_interval: Duration,
    /// OTLP collector for traces, e.g. http://otel-collector:4317; the standard variable.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// OTLP transport: `grpc` (port 4317) or `http/protobuf` (port 4318); the standard variable.
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_PROTOCOL",
        default_value = "grpc",
        value_parser = PossibleValuesParser::new(["grpc", "http/protobuf"]).map(|p| {
            if p == "grpc" { OtlpProtocol::Grpc } else { OtlpProtocol::HttpProtobuf }
        })
    )]
    pub otlp_protocol: OtlpProtocol,
    /// The service name traces carry; the standard variable.
    #[arg(long, env = "OTEL_SERVICE_NAME", default_value = "portcullis")]
    pub otel_service_name: String,
    /// Share of the traces started here that are kept (1 = all); Envoy's sampling decision is
    /// followed when it sends one.
    #[arg(long, env = "PORTCULLIS_TRACES_SAMPLING_RATIO")]
    pub traces_sampling_ratio: Option<f64>,
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
    /// Take the rules from an xDS server (state of the world, the `RateLimitConfig` resources
    /// Envoy Gateway pushes) instead of --config: `host:port` or `http(s)://host:port`.
    #[arg(long, env = "PORTCULLIS_RULES_XDS_SERVER")]
    pub rules_xds_server: Option<String>,
    /// The node id this client announces to the xDS server.
    #[arg(long, env = "PORTCULLIS_RULES_XDS_NODE_ID", default_value = "default")]
    pub rules_xds_node_id: String,
    /// Node metadata for the xDS server, as `key=value,key=value`.
    #[arg(long, env = "PORTCULLIS_RULES_XDS_NODE_METADATA")]
    pub rules_xds_node_metadata: Option<String>,
    /// Headers sent with the xDS stream, as `key:value,key:value`.
    #[arg(long, env = "PORTCULLIS_RULES_XDS_HEADERS", hide_env_values = true)]
    pub rules_xds_headers: Option<String>,
    /// TLS to the xDS server.
    #[arg(long, env = "PORTCULLIS_RULES_XDS_TLS")]
    pub rules_xds_tls: bool,
    /// PEM CA for the xDS server's certificate.
    #[arg(long, env = "PORTCULLIS_RULES_XDS_CA_FILE")]
    pub rules_xds_ca_file: Option<PathBuf>,
    /// PEM client certificate for the xDS server (mTLS), with --rules-xds-key.
    #[arg(long, env = "PORTCULLIS_RULES_XDS_CERT")]
    pub rules_xds_cert: Option<PathBuf>,
    #[arg(long, env = "PORTCULLIS_RULES_XDS_KEY")]
    pub rules_xds_key: Option<PathBuf>,
    /// The name the xDS server's certificate must carry (default: the server's host).
    #[arg(long, env = "PORTCULLIS_RULES_XDS_SAN")]
    pub rules_xds_san: Option<String>,
    /// First wait before reconnecting to the xDS server.
    #[arg(long, env = "PORTCULLIS_RULES_XDS_BACKOFF_INITIAL", default_value = "1s", value_parser = parse_duration)]
    pub rules_xds_backoff_initial: Duration,
    /// Longest wait before reconnecting.
    #[arg(long, env = "PORTCULLIS_RULES_XDS_BACKOFF_MAX", default_value = "60s", value_parser = parse_duration)]
    pub rules_xds_backoff_max: Duration,
    /// Each wait is spread by up to this share either way.
    #[arg(
        long,
        env = "PORTCULLIS_RULES_XDS_BACKOFF_RANDOM_FACTOR",
        default_value_t = 0.5
    )]
    pub rules_xds_backoff_random_factor: f64,
    /// Spread the waits at all.
    #[arg(long, env = "PORTCULLIS_RULES_XDS_BACKOFF_JITTER", default_value_t = true, action = clap::ArgAction::Set)]
    pub rules_xds_backoff_jitter: bool,
    /// Largest xDS message accepted, in bytes.
    #[arg(long, env = "PORTCULLIS_RULES_XDS_MAX_MESSAGE_BYTES", default_value_t = 4 << 20)]
    pub rules_xds_max_message_bytes: usize,
    /// With xDS: serve before the first rules arrive (every call OK until then) instead of
    /// waiting for them.
    #[arg(long, env = "PORTCULLIS_FORCE_START_WITHOUT_INITIAL_RULES")]
    pub force_start_without_initial_rules: bool,
    /// Go mode: TRACING_SERVICE_NAMESPACE.
    #[arg(skip)]
    pub otel_service_namespace: Option<String>,
    /// Go mode: TRACING_SERVICE_INSTANCE_ID.
    #[arg(skip)]
    pub otel_service_instance_id: Option<String>,
    /// More HTTP listeners, each with its own routes (set by Go mode: Go's PORT and DEBUG_PORT).
    #[arg(skip)]
    pub http_listeners: Vec<HttpListener>,
    /// Go mode: variables read but deliberately not acted on, logged once at start-up.
    #[arg(skip)]
    pub ignored_variables: Vec<String>,
    /// Log level or filter (RUST_LOG syntax); RUST_LOG wins when set.
    #[arg(long, env = "PORTCULLIS_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
    #[arg(
        long,
        env = "PORTCULLIS_LOG_FORMAT",
        default_value = "text",
        value_parser = EnumValueParser::<LogFormatArg>::new().map(LogFormat::from)
    )]
    pub log_format: LogFormat,
}

/// Settings that cannot work, every one listed.
#[derive(Debug, thiserror::Error)]
#[error("invalid settings:\n  {}", .0.join("\n  "))]
pub struct SettingsError(pub Vec<String>);

impl Settings {
    /// Refuses values that would panic, silently stop a background task, or quietly defeat a
    /// guarantee; all problems at once, each naming its flag.
    pub fn validate(&self) -> Result<(), SettingsError> {
        let mut problems = Vec::new();
        let mut duration = |flag: &str, value: Duration, min: Duration, max: Duration| {
            if value < min || value > max {
                problems.push(format!(
                    "{flag} {value:?} must be between {min:?} and {max:?}"
                ));
            }
        };
        duration(
            "--store-timeout",
            self.store_timeout,
            Duration::from_millis(1),
            Duration::from_secs(60),
        );
        duration(
            "--deny-cache-max-age",
            self.deny_cache_max_age,
            Duration::from_millis(1),
            Duration::from_secs(3600),
        );
        duration(
            "--redis-connect-timeout",
            self.redis_connect_timeout,
            Duration::from_millis(1),
            Duration::from_secs(60),
        );
        duration(
            "--reload-interval",
            self.reload_interval,
            Duration::from_millis(10),
            Duration::from_secs(3600),
        );
        duration(
            "--admin-header-timeout",
            self.admin_header_timeout,
            Duration::from_millis(10),
            Duration::from_secs(300),
        );
        duration(
            "--grpc-keepalive-interval",
            self.grpc_keepalive_interval,
            Duration::from_millis(10),
            Duration::from_secs(3600),
        );
        duration(
            "--grpc-keepalive-timeout",
            self.grpc_keepalive_timeout,
            Duration::from_millis(10),
            Duration::from_secs(600),
        );
        duration(
            "--drain-period",
            self.drain_period,
            Duration::ZERO,
            Duration::from_secs(600),
        );
        duration(
            "--statsd-flush-interval",
            self.statsd_flush_interval,
            Duration::from_millis(10),
            Duration::from_secs(3600),
        );
        duration(
            "--rules-xds-backoff-initial",
            self.rules_xds_backoff_initial,
            Duration::from_millis(1),
            Duration::from_secs(3600),
        );
        duration(
            "--rules-xds-backoff-max",
            self.rules_xds_backoff_max,
            self.rules_xds_backoff_initial,
            Duration::from_secs(3600),
        );
        if let Some(age) = self.grpc_max_connection_age {
            duration(
                "--grpc-max-connection-age",
                age,
                Duration::from_secs(1),
                Duration::from_secs(365 * 86_400),
            );
        }
        if !(0.0..=1.0).contains(&self.rules_xds_backoff_random_factor) {
            problems.push(format!(
                "--rules-xds-backoff-random-factor {} must be a number from 0 to 1",
                self.rules_xds_backoff_random_factor
            ));
        }
        if let Some(ratio) = self.traces_sampling_ratio
            && !(0.0..=1.0).contains(&ratio)
        {
            problems.push(format!(
                "--traces-sampling-ratio {ratio} must be a number from 0 to 1"
            ));
        }
        if self.rules_xds_max_message_bytes < 1024 {
            problems.push(format!(
                "--rules-xds-max-message-bytes {} must be at least 1024",
                self.rules_xds_max_message_bytes
            ));
        }
        if let Some(timeout) = self.grpc_request_timeout
            && (timeout <= self.store_timeout || timeout > Duration::from_secs(600))
        {
            problems.push(format!(
                "--grpc-request-timeout {timeout:?} must be longer than --store-timeout ({:?}, \
                 so that the failure mode can answer) and at most 600s",
                self.store_timeout
            ));
        }
        if self.admin_scaling
            && self.admin_scaling_token_file.is_none()
            && !self.admin_addr.ip().is_loopback()
        {
            problems.push(format!(
                "--admin-scaling on a listener others can reach ({}) needs \
                 --admin-scaling-token-file: anyone reaching it could otherwise lift every limit",
                self.admin_addr
            ));
        }
        if !(0.0..=1.0).contains(&self.near_limit_ratio) {
            problems.push(format!(
                "--near-limit-ratio {} must be a number from 0 to 1",
                self.near_limit_ratio
            ));
        }
        if self.key_prefix.contains(['{', '}']) {
            problems.push(format!(
                "--key-prefix {:?} must not contain {{ or }}: Redis Cluster would hash every key \
                 by the prefix and put all counters in one slot",
                self.key_prefix
            ));
        }
        for (flag, value) in [
            ("--max-descriptors", self.max_descriptors),
            ("--max-entries", self.max_entries),
            ("--max-string-bytes", self.max_string_bytes),
            ("--max-message-bytes", self.max_message_bytes),
            ("--redis-pool-size", self.redis_pool_size as usize),
            ("--max-in-flight", self.max_in_flight),
            ("--deny-cache-max-entries", self.deny_cache_max_entries),
            ("--deny-cache-max-bytes", self.deny_cache_max_bytes),
            ("--memory-max-counters", self.memory_max_counters),
            (
                "--grpc-max-concurrent-streams",
                self.grpc_max_concurrent_streams as usize,
            ),
        ] {
            if value == 0 {
                problems.push(format!("{flag} must be at least 1"));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(SettingsError(problems))
        }
    }

    /// How rule files become one set of rules.
    pub fn load_options(&self) -> LoadOptions {
        LoadOptions {
            merge_domains: self.merge_domain_config,
            default_algorithm: self.default_algorithm,
        }
    }

    /// Where traces go (Go mode adds its namespace and instance from TRACING_*).
    pub fn tracing(&self) -> TracingConfig {
        TracingConfig {
            endpoint: self.otlp_endpoint.clone().filter(|e| !e.is_empty()),
            protocol: self.otlp_protocol,
            service_name: self.otel_service_name.clone(),
            service_namespace: self.otel_service_namespace.clone(),
            service_instance_id: self.otel_service_instance_id.clone(),
            sampling_ratio: self.traces_sampling_ratio,
        }
    }

    /// The gRPC request timeout in force.
    pub fn grpc_request_timeout(&self) -> Duration {
        self.grpc_request_timeout
            .unwrap_or(self.store_timeout + Duration::from_secs(1))
    }

    /// Settings for an in-process server on ephemeral loopback ports (tests, benchmarks).
    pub fn for_tests(config: PathBuf) -> Self {
        Self {
            config,
            grpc_addr: ([127, 0, 0, 1], 0).into(),
            admin_addr: ([127, 0, 0, 1], 0).into(),
            admin_json: false,
            admin_scaling: false,
            admin_scaling_token_file: None,
            scaling_file: None,
            admin_header_timeout: Duration::from_secs(5),
            grpc_max_concurrent_streams: 1024,
            max_in_flight: 10_000,
            grpc_keepalive_interval: Duration::from_secs(30),
            grpc_keepalive_timeout: Duration::from_secs(10),
            grpc_request_timeout: None,
            grpc_tls_cert: None,
            grpc_tls_key: None,
            grpc_tls_client_ca: None,
            grpc_tls_client_san: None,
            grpc_max_connection_age: None,
            grpc_max_connection_age_grace: None,
            store: StoreKind::Memory,
            redis_url: None,
            redis_cluster: Vec::new(),
            redis_sentinel: Vec::new(),
            redis_master: None,
            redis_tls: false,
            redis_tls_cert: None,
            redis_tls_key: None,
            redis_tls_skip_hostname_verification: false,
            redis_ca_file: None,
            redis_user: None,
            redis_password: None,
            redis_sentinel_user: None,
            redis_sentinel_password: None,
            redis_sentinel_tls: false,
            redis_sentinel_ca_file: None,
            redis_connect_timeout: Duration::from_secs(2),
            redis_pool_size: 2,
            key_prefix: "portcullis:".into(),
            store_timeout: Duration::from_secs(2),
            failure_mode: FailureMode::Allow,
            deny_cache: true,
            deny_cache_max_entries: 100_000,
            memory_max_counters: crate::store::memory::DEFAULT_MAX_COUNTERS,
            deny_cache_max_bytes: 16 << 20,
            deny_cache_max_age: Duration::from_secs(1),
            response_headers: HeadersMode::Off,
            shadow_mode: false,
            quota_mode: false,
            stop_charging_when_over: false,
            response_dynamic_metadata: false,
            merge_domain_config: false,
            override_algorithm: Algorithm::FixedWindow,
            header_limit_name: None,
            header_remaining_name: None,
            header_reset_name: None,
            max_descriptors: 512,
            max_entries: 64,
            max_string_bytes: 1024,
            max_message_bytes: 64 * 1024,
            max_detailed_series: 2000,
            near_limit_ratio: 0.8,
            ready_requires_store: false,
            ready_on_permanent_store_errors: false,
            ready_requires_rules: false,
            allow_rules_removal: false,
            drain_period: Duration::from_millis(100),
            reload_interval: Duration::from_millis(100),
            otlp_endpoint: None,
            log_level: "warn".into(),
            otlp_protocol: OtlpProtocol::Grpc,
            otel_service_name: "portcullis".into(),
            traces_sampling_ratio: None,
            statsd_addr: None,
            statsd_flush_interval: Duration::from_secs(10),
            redis_per_second_url: None,
            redis_per_second: None,
            go_metrics_mapping: None,
            statsd_tags: Vec::new(),
            statsd_dogstatsd: false,
            go_metrics_addr: None,
            go_metrics_path: "/metrics".into(),
            default_algorithm: Algorithm::SlidingWindow,
            env_compat: None,
            rules_xds_server: None,
            rules_xds_node_id: "default".into(),
            rules_xds_node_metadata: None,
            rules_xds_headers: None,
            rules_xds_tls: false,
            rules_xds_ca_file: None,
            rules_xds_cert: None,
            rules_xds_key: None,
            rules_xds_san: None,
            rules_xds_backoff_initial: Duration::from_secs(1),
            rules_xds_backoff_max: Duration::from_secs(60),
            rules_xds_backoff_random_factor: 0.5,
            rules_xds_backoff_jitter: true,
            rules_xds_max_message_bytes: 4 << 20,
            force_start_without_initial_rules: false,
            otel_service_namespace: None,
            otel_service_instance_id: None,
            http_listeners: Vec::new(),
            ignored_variables: Vec::new(),
            log_format: LogFormat::Text,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_never_reach_debug_output() {
        assert_eq!(format!("{:?}", Secret("hunter2".into())), "<redacted>");
    }

    #[test]
    fn command_line_names_map_onto_the_domain() {
        let cli = Cli::try_parse_from([
            "portcullis",
            "serve",
            "--failure-mode",
            "local",
            "--response-headers",
            "draft03",
            "--log-format",
            "json",
        ])
        .expect("parses");
        let Command::Serve(settings) = cli.command else {
            panic!("serve expected");
        };
        assert_eq!(settings.failure_mode, FailureMode::Local);
        assert_eq!(settings.response_headers, HeadersMode::Draft03);
        assert_eq!(settings.log_format, LogFormat::Json);
        assert!(Cli::try_parse_from(["portcullis", "serve", "--failure-mode", "maybe"]).is_err());
    }
}
