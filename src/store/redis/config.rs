//! How to reach one Redis: its topology (standalone, Sentinel, Cluster), credentials, TLS
//! material and socket options, checked and turned into redis-rs' connection settings. It must
//! never print a password: `RedisConfig`'s Debug and `redact_url` hide them.

use std::time::Duration;

use redis::io::tcp::{TcpSettings, socket2};
use redis::{ConnectionAddr, RedisError, TlsCertificates};

/// How to reach Redis.
#[derive(Clone)]
pub enum Topology {
    /// `redis://` or `rediss://` URL of one server.
    Standalone(String),
    /// Seed nodes `host:port`; the rest of the cluster is discovered.
    Cluster(Vec<String>),
    /// Sentinels `host:port` and the master's name.
    Sentinel {
        sentinels: Vec<String>,
        master: String,
    },
}

/// How to talk to the sentinels themselves (their own ACL user, password and TLS, which are
/// often not the data nodes').
#[derive(Clone, Default)]
pub struct SentinelAuth {
    pub tls: bool,
    /// PEM root certificate(s) for the sentinels' certificates.
    pub ca_pem: Option<Vec<u8>>,
    pub username: Option<String>,
    pub password: Option<String>,
}

/// Everything needed to connect; the passwords are never printed.
#[derive(Clone)]
pub struct RedisConfig {
    pub topology: Topology,
    pub tls: bool,
    /// PEM root certificate(s) to trust instead of the system's (a private CA).
    pub ca_pem: Option<Vec<u8>>,
    /// PEM client certificate and key presented to Redis (TLS client authentication).
    pub client_cert_pem: Option<(Vec<u8>, Vec<u8>)>,
    /// Accept a server certificate whose name does not match the address (the chain is still
    /// verified): endpoints reached through a name their certificate does not carry.
    pub skip_hostname_verification: bool,
    pub username: Option<String>,
    pub password: Option<String>,
    pub sentinel: SentinelAuth,
    /// Connections in the standalone/Sentinel set.
    pub pool_size: u32,
    /// Bound on setting up one connection (DNS, TCP, TLS, AUTH/HELLO, Sentinel lookup).
    pub connect_timeout: Duration,
    /// Replicas that must acknowledge a script call's writes (`WAIT`) before its answers stand;
    /// 0: none asked.
    pub wait_replicas: u32,
}

impl std::fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let topology = match &self.topology {
            Topology::Standalone(url) => format!("standalone {}", redact_url(url)),
            Topology::Cluster(nodes) => format!("cluster {}", nodes.join(",")),
            Topology::Sentinel { sentinels, master } => {
                format!("sentinel {} master {master}", sentinels.join(","))
            }
        };
        let redacted = |p: &Option<String>| p.as_ref().map(|_| "<redacted>");
        f.debug_struct("RedisConfig")
            .field("topology", &topology)
            .field("tls", &self.tls)
            .field("ca", &self.ca_pem.as_ref().map(|_| "from file"))
            .field(
                "client_certificate",
                &self.client_cert_pem.as_ref().map(|_| "from file"),
            )
            .field(
                "skip_hostname_verification",
                &self.skip_hostname_verification,
            )
            .field("username", &self.username)
            .field("password", &redacted(&self.password))
            .field("sentinel_tls", &self.sentinel.tls)
            .field("sentinel_username", &self.sentinel.username)
            .field("sentinel_password", &redacted(&self.sentinel.password))
            .field("pool_size", &self.pool_size)
            .field("connect_timeout", &self.connect_timeout)
            .field("wait_replicas", &self.wait_replicas)
            .finish()
    }
}

/// A URL with any password replaced, for logs.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{}{}:<redacted>{}", &url[..scheme + 3], user, &url[at..])
        }
        _ => url.to_owned(),
    }
}

pub(super) fn split_host_port(node: &str) -> Result<(String, u16), RedisError> {
    let invalid = || {
        RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "expected host:port",
            node.to_owned(),
        ))
    };
    let (host, port) = node.rsplit_once(':').ok_or_else(invalid)?;
    let port = port.parse().map_err(|_| invalid())?;
    Ok((host.trim_matches(|c| c == '[' || c == ']').to_owned(), port))
}

pub(super) fn address(host: String, port: u16, tls: bool) -> ConnectionAddr {
    if tls {
        ConnectionAddr::TcpTls {
            host,
            port,
            insecure: false,
            tls_params: None,
        }
    } else {
        ConnectionAddr::Tcp(host, port)
    }
}

/// How long data sent to Redis may stay unacknowledged before the kernel drops the connection
/// (TCP_USER_TIMEOUT): without it, a peer gone without a FIN (a node powered off, a partition)
/// holds a connection through about 15 minutes of retransmissions.
pub const TCP_USER_TIMEOUT: Duration = Duration::from_secs(10);

/// TCP_NODELAY, keepalive (probes after 30 s idle, every 10 s) and TCP_USER_TIMEOUT.
pub fn tcp_settings() -> TcpSettings {
    TcpSettings::default()
        .set_nodelay(true)
        .set_keepalive(
            socket2::TcpKeepalive::new()
                .with_time(Duration::from_secs(30))
                .with_interval(Duration::from_secs(10)),
        )
        .set_user_timeout(TCP_USER_TIMEOUT)
}

pub(super) fn certificates(
    ca_pem: &Option<Vec<u8>>,
    client: &Option<(Vec<u8>, Vec<u8>)>,
) -> Option<TlsCertificates> {
    if ca_pem.is_none() && client.is_none() {
        return None;
    }
    Some(TlsCertificates {
        client_tls: client
            .clone()
            .map(|(client_cert, client_key)| redis::ClientTlsConfig {
                client_cert,
                client_key,
            }),
        root_cert: ca_pem.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_redis_socket_gives_up_on_a_silent_peer() {
        let settings = tcp_settings();
        assert!(settings.nodelay());
        assert!(settings.keepalive().is_some());
        assert_eq!(settings.user_timeout(), Some(TCP_USER_TIMEOUT));
    }

    #[test]
    fn passwords_never_reach_debug_output() {
        let config = RedisConfig {
            topology: Topology::Standalone("redis://user:hunter2@127.0.0.1:6379".into()),
            tls: false,
            ca_pem: None,
            client_cert_pem: None,
            skip_hostname_verification: false,
            username: Some("user".into()),
            password: Some("hunter2".into()),
            sentinel: SentinelAuth {
                password: Some("sentinel-secret".into()),
                ..Default::default()
            },
            pool_size: 1,
            connect_timeout: Duration::from_secs(2),
            wait_replicas: 0,
        };
        let shown = format!("{config:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(!shown.contains("sentinel-secret"), "{shown}");
        assert!(
            shown.contains("redis://user:<redacted>@127.0.0.1:6379"),
            "{shown}"
        );
    }
}
