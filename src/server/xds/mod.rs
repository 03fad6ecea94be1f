//! Rules over xDS: a state-of-the-world client of the aggregated discovery stream for the
//! `ratelimit.config.ratelimit.v3.RateLimitConfig` resource, as envoyproxy/ratelimit runs it
//! under Envoy Gateway (`CONFIG_TYPE=GRPC_XDS_SOTW`).
//!
//! Every pushed set is the whole rules: it is turned into rule files (`convert`), validated by
//! the file loader, and either swapped in atomically and ACKed, or NACKed with the errors in
//! `error_detail` while the last good rules keep serving. A broken stream is reopened with
//! exponential back-off (reset once a stream has delivered). It must never leave a half-applied
//! set in force, and never stop retrying while the server runs.

pub mod convert;

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::{AsciiMetadataValue, MetadataKey};
use tonic::transport::{ClientTlsConfig, Endpoint};

use crate::pb::xds::{
    AggregatedDiscoveryServiceClient, DiscoveryRequest, DiscoveryResponse, Node, RULES_TYPE_URL,
    Status,
};
use crate::rules::{self, LoadOptions, Snapshot};
use crate::telemetry::{Metrics, ResultLabels};

/// google.rpc.Code INVALID_ARGUMENT: a NACK's code.
const INVALID_ARGUMENT: i32 = 3;

/// Waits before reconnecting: `initial`, doubling up to `max`; with `jitter`, each wait is
/// spread uniformly by up to `random_factor` of itself either way (never above `max`).
#[derive(Debug, Clone)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
    pub random_factor: f64,
    pub jitter: bool,
}

impl Backoff {
    /// The wait before reconnect number `attempt` (0 is the first).
    pub fn delay(&self, attempt: u32) -> Duration {
        let base = self
            .initial
            .saturating_mul(2u32.saturating_pow(attempt.min(20)))
            .min(self.max);
        if !self.jitter || self.random_factor <= 0.0 {
            return base;
        }
        let spread = self.random_factor * (2.0 * rand::random::<f64>() - 1.0);
        base.mul_f64((1.0 + spread).max(0.0)).min(self.max)
    }
}

/// Where and how to reach the xDS server; built (and checked) at start-up.
#[derive(Debug, Clone)]
pub struct XdsClientConfig {
    /// `http(s)://host:port`.
    pub uri: String,
    pub node: Node,
    /// Sent with the stream (authentication tokens, say).
    pub headers: Vec<(MetadataKey<tonic::metadata::Ascii>, AsciiMetadataValue)>,
    pub tls: Option<ClientTlsConfig>,
    pub backoff: Backoff,
    pub max_message_bytes: usize,
    pub connect_timeout: Duration,
}

/// The problems of an xDS setting, found at start-up.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct XdsSettingError(pub String);

/// `host:port`, `dns:///host:port` or `http(s)://host:port` as the URI to dial.
pub fn server_uri(server: &str, tls: bool) -> Result<String, XdsSettingError> {
    let server = server.strip_prefix("dns:///").unwrap_or(server);
    let uri = if server.contains("://") {
        server.to_owned()
    } else if tls {
        format!("https://{server}")
    } else {
        format!("http://{server}")
    };
    if tls && uri.starts_with("http://") {
        return Err(XdsSettingError(format!(
            "xDS server {server:?}: TLS is on but the address says http://"
        )));
    }
    Endpoint::from_shared(uri.clone())
        .map_err(|e| XdsSettingError(format!("xDS server {server:?}: {e}")))?;
    Ok(uri)
}

/// `key=value,key=value` (the Go service's CONFIG_GRPC_XDS_NODE_METADATA) as node metadata;
/// an entry without `=` is refused rather than dropped.
pub fn node(id: &str, metadata: Option<&str>) -> Result<Node, XdsSettingError> {
    let mut fields = std::collections::BTreeMap::new();
    for entry in metadata.unwrap_or("").split(',').filter(|e| !e.is_empty()) {
        let (key, value) = entry.split_once('=').ok_or_else(|| {
            XdsSettingError(format!(
                "xDS node metadata entry {entry:?} is not key=value"
            ))
        })?;
        fields.insert(
            key.trim().to_owned(),
            prost_types::Value {
                kind: Some(prost_types::value::Kind::StringValue(
                    value.trim().to_owned(),
                )),
            },
        );
    }
    Ok(Node {
        id: id.to_owned(),
        metadata: (!fields.is_empty()).then_some(prost_types::Struct { fields }),
        user_agent_name: "portcullis".into(),
        user_agent_version_type: Some(
            crate::pb::envoy::config::core::v3::node::UserAgentVersionType::UserAgentVersion(
                env!("CARGO_PKG_VERSION").into(),
            ),
        ),
        ..Default::default()
    })
}

/// `key:value,key:value` (the Go service's CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS) as gRPC
/// metadata.
pub fn headers(
    text: Option<&str>,
) -> Result<Vec<(MetadataKey<tonic::metadata::Ascii>, AsciiMetadataValue)>, XdsSettingError> {
    let mut out = Vec::new();
    for entry in text.unwrap_or("").split(',').filter(|e| !e.is_empty()) {
        let (key, value) = entry.split_once(':').ok_or_else(|| {
            XdsSettingError(format!("xDS header entry {entry:?} is not key:value"))
        })?;
        let key = MetadataKey::from_bytes(key.trim().to_ascii_lowercase().as_bytes())
            .map_err(|e| XdsSettingError(format!("xDS header name {key:?}: {e}")))?;
        let value = AsciiMetadataValue::try_from(value.trim())
            .map_err(|e| XdsSettingError(format!("xDS header {key:?} value: {e}")))?;
        out.push((key, value));
    }
    Ok(out)
}

/// The client and what it updates.
pub struct XdsRules {
    pub config: XdsClientConfig,
    pub rules: Arc<ArcSwap<Snapshot>>,
    pub metrics: Arc<Metrics>,
    pub options: LoadOptions,
}

/// Why a stream ended.
#[derive(Debug, thiserror::Error)]
enum StreamEnd {
    #[error("cannot connect: {0}")]
    Connect(#[from] tonic::transport::Error),
    #[error("the server refused the stream or broke it: {0}")]
    Status(#[from] tonic::Status),
    #[error("the server closed the stream")]
    Closed,
}

/// What carries over from one stream to the next.
#[derive(Default)]
struct Progress {
    /// The version of the set in force, sent back on every request (and after a reconnect, so
    /// that the server need not resend what we have).
    accepted_version: String,
    /// A response arrived on the current stream.
    delivered: bool,
}

/// Starts the client. The receiver turns true once a first set is in force.
pub fn spawn(
    xds: XdsRules,
    stop: watch::Receiver<bool>,
) -> (JoinHandle<()>, watch::Receiver<bool>) {
    let (applied_tx, applied_rx) = watch::channel(false);
    let task = tokio::spawn(async move {
        let xds = Arc::new(xds);
        let mut progress = Progress::default();
        let mut attempt = 0u32;
        loop {
            progress.delivered = false;
            let mut stop_session = stop.clone();
            let ended = tokio::select! {
                ended = xds.stream(&mut progress, &applied_tx) => ended,
                _ = stop_session.wait_for(|s| *s) => return,
            };
            xds.metrics.rules_xds_connected.set(0);
            xds.metrics.rules_xds_stream_errors.inc();
            if progress.delivered {
                attempt = 0;
            }
            let wait = xds.config.backoff.delay(attempt);
            attempt = attempt.saturating_add(1);
            let what = match (&ended, *applied_tx.borrow()) {
                (StreamEnd::Connect(_), false) => {
                    "xDS server not reached; still waiting for the first rules (not ready, nothing served)"
                }
                (_, false) => {
                    "xDS rules stream ended before the first rules came; still waiting for them (not ready, nothing served)"
                }
                (StreamEnd::Connect(_), true) => {
                    "xDS server not reached; the rules in force keep serving"
                }
                (_, true) => "xDS rules stream ended; the rules in force keep serving",
            };
            tracing::warn!(
                server = %xds.config.uri,
                error = %ended,
                retry_in = ?wait,
                "{what}"
            );
            let mut stop_wait = stop.clone();
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop_wait.wait_for(|s| *s) => return,
            }
        }
    });
    (task, applied_rx)
}

impl XdsRules {
    /// One stream, from connecting to its end (which is always an error: the stream is meant to
    /// last).
    async fn stream(&self, progress: &mut Progress, applied: &watch::Sender<bool>) -> StreamEnd {
        match self.stream_inner(progress, applied).await {
            Ok(never) => match never {},
            Err(end) => end,
        }
    }

    async fn stream_inner(
        &self,
        progress: &mut Progress,
        applied: &watch::Sender<bool>,
    ) -> Result<std::convert::Infallible, StreamEnd> {
        let mut endpoint = Endpoint::from_shared(self.config.uri.clone())?
            .connect_timeout(self.config.connect_timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(30))
            .keep_alive_timeout(Duration::from_secs(10));
        if let Some(tls) = &self.config.tls {
            endpoint = endpoint.tls_config(tls.clone())?;
        }
        let channel = endpoint.connect().await?;
        let mut client = AggregatedDiscoveryServiceClient::new(channel)
            .max_decoding_message_size(self.config.max_message_bytes);
        // Requests go out as the responses are dealt with: one at a time, so a small buffer.
        let (requests, outbound) = mpsc::channel(4);
        let first = self.request(&progress.accepted_version, "", None);
        // The receiver is alive: it is in this scope.
        let _ = requests.send(first).await;
        let mut request = tonic::Request::new(ReceiverStream::new(outbound));
        for (key, value) in &self.config.headers {
            request.metadata_mut().insert(key.clone(), value.clone());
        }
        let mut inbound = client
            .stream_aggregated_resources(request)
            .await?
            .into_inner();
        tracing::info!(server = %self.config.uri, "xDS rules stream open");
        self.metrics.rules_xds_connected.set(1);
        loop {
            let Some(response) = inbound.message().await? else {
                return Err(StreamEnd::Closed);
            };
            progress.delivered = true;
            let reply = self.apply(response, progress, applied);
            if requests.send(reply).await.is_err() {
                return Err(StreamEnd::Closed);
            }
        }
    }

    fn request(&self, version: &str, nonce: &str, error: Option<String>) -> DiscoveryRequest {
        DiscoveryRequest {
            version_info: version.to_owned(),
            node: Some(self.config.node.clone()),
            // Empty: every resource of the type (wildcard), as the Go service asks.
            resource_names: Vec::new(),
            type_url: RULES_TYPE_URL.into(),
            response_nonce: nonce.to_owned(),
            error_detail: error.map(|message| Status {
                code: INVALID_ARGUMENT,
                message,
                details: Vec::new(),
            }),
        }
    }

    /// Validates and applies one pushed set; the ACK or NACK to send back.
    fn apply(
        &self,
        response: DiscoveryResponse,
        progress: &mut Progress,
        applied: &watch::Sender<bool>,
    ) -> DiscoveryRequest {
        let checked = if response.type_url != RULES_TYPE_URL {
            Err(format!(
                "unexpected resource type {:?}: only {RULES_TYPE_URL} is asked for",
                response.type_url
            ))
        } else {
            convert::rule_files(&response.resources)
                .and_then(|files| rules::parse(&files, self.options).map_err(|e| e.to_string()))
        };
        let snapshot = match checked {
            Ok(snapshot) => snapshot,
            Err(error) => {
                self.count("error");
                tracing::error!(
                    version = %response.version_info,
                    %error,
                    "xDS rules refused (NACK); the rules in force keep serving"
                );
                return self.request(&progress.accepted_version, &response.nonce, Some(error));
            }
        };
        let current = self.rules.load();
        let removed: Vec<&str> = current
            .domain_names()
            .into_iter()
            .filter(|d| !snapshot.has_domain(d))
            .collect();
        if !removed.is_empty() {
            // The control plane's set is the whole truth (a deleted policy must stop limiting);
            // said loudly all the same.
            tracing::warn!(?removed, "xDS rules no longer define these domains");
        }
        tracing::info!(
            version = %response.version_info,
            resources = response.resources.len(),
            domains = ?snapshot.domain_names(),
            rules = snapshot.rules().len(),
            "xDS rules in force (ACK)"
        );
        self.metrics.rules_loaded(snapshot.loaded_at);
        self.rules.store(Arc::new(snapshot));
        self.count("success");
        progress.accepted_version = response.version_info.clone();
        applied.send_replace(true);
        self.request(&progress.accepted_version, &response.nonce, None)
    }

    fn count(&self, result: &str) {
        self.metrics
            .rules_reloads
            .get_or_create(&ResultLabels {
                result: result.into(),
            })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_the_cap_and_jitter_stays_within_its_share() {
        let plain = Backoff {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(10),
            random_factor: 0.5,
            jitter: false,
        };
        let waits: Vec<u64> = (0..6).map(|a| plain.delay(a).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 10, 10]);
        assert_eq!(plain.delay(u32::MAX), Duration::from_secs(10));
        let spread = Backoff {
            jitter: true,
            ..plain
        };
        for _ in 0..200 {
            let d = spread.delay(1);
            assert!(
                d >= Duration::from_secs(1) && d <= Duration::from_secs(3),
                "{d:?}"
            );
        }
    }

    #[test]
    fn settings_in_the_go_formats() {
        assert_eq!(
            server_uri("envoy-gateway:18001", false).unwrap(),
            "http://envoy-gateway:18001"
        );
        assert_eq!(
            server_uri("dns:///envoy-gateway:18001", true).unwrap(),
            "https://envoy-gateway:18001"
        );
        assert!(server_uri("http://x:1", true).is_err());
        let n = node("envoy-ratelimit", Some("cluster=eg,zone=a")).unwrap();
        assert_eq!(n.id, "envoy-ratelimit");
        assert_eq!(n.metadata.unwrap().fields.len(), 2);
        assert!(node("x", Some("novalue")).is_err());
        let h = headers(Some("Authorization:Bearer t,x-team:edge")).unwrap();
        assert_eq!(h[0].0.as_str(), "authorization");
        assert_eq!(h[1].1.to_str().unwrap(), "edge");
        assert!(headers(Some("broken")).is_err());
    }
}
