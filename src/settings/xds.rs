//! The flags of rules over xDS (`--rules-xds-*`): the server, the node this client announces,
//! TLS to the server, reconnect back-off and the largest message. Grouped apart from the rest of
//! `Settings` (flattened into it: the flags and variables are unchanged).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::parse_duration;

#[derive(Clone, Args)]
pub struct XdsSettings {
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
    /// PEM private key of --rules-xds-cert.
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
}
