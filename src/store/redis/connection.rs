//! Connections to Redis. Standalone and Sentinel: a bb8 pool of multiplexed connections.
//! Cluster: redis-rs's async cluster client (follows MOVED/ASK, refreshes slots after failover).
//!
//! Why our own bb8 manager and not bb8-redis': its `has_broken` is always false, so after a Redis
//! restart the pool would keep handing out dead connections unless every checkout PINGs (a second
//! round trip per call). Ours marks a connection broken when a command on it fails at the
//! connection level, and bb8 drops it and opens a new one in the background. For Sentinel each new
//! connection asks the sentinels for the current master, so a failover heals the same way.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    AsyncConnectionConfig, ConnectionAddr, IntoConnectionInfo, ProtocolVersion, RedisError,
    TlsCertificates, TlsMode,
};

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

/// Everything needed to connect; the password is never printed.
#[derive(Clone)]
pub struct RedisConfig {
    pub topology: Topology,
    pub tls: bool,
    /// PEM root certificate(s) to trust instead of the system's (a private CA).
    pub ca_pem: Option<Vec<u8>>,
    pub username: Option<String>,
    pub password: Option<String>,
    /// Connections in the standalone/Sentinel pool.
    pub pool_size: u32,
    /// Bound on one Redis command (and on opening a connection).
    pub timeout: Duration,
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
        f.debug_struct("RedisConfig")
            .field("topology", &topology)
            .field("tls", &self.tls)
            .field("ca", &self.ca_pem.as_ref().map(|_| "from file"))
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("pool_size", &self.pool_size)
            .field("timeout", &self.timeout)
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

fn split_host_port(node: &str) -> Result<(String, u16), RedisError> {
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

fn address(host: String, port: u16, tls: bool) -> ConnectionAddr {
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

fn connection_config(timeout: Duration) -> AsyncConnectionConfig {
    AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout))
}

enum Target {
    Direct(redis::Client),
    Sentinel(tokio::sync::Mutex<SentinelClient>),
}

pub struct Manager {
    target: Target,
    config: AsyncConnectionConfig,
}

/// A pooled connection and whether it failed at the connection level. The flag is shared with
/// the clones callers use, so a failure seen on a clone retires the pooled connection.
pub struct PooledConn {
    pub conn: MultiplexedConnection,
    pub broken: Arc<AtomicBool>,
}

impl bb8::ManageConnection for Manager {
    type Connection = PooledConn;
    type Error = RedisError;

    async fn connect(&self) -> Result<PooledConn, RedisError> {
        let client = match &self.target {
            Target::Direct(client) => client.clone(),
            Target::Sentinel(sentinel) => sentinel.lock().await.async_get_client().await?,
        };
        let conn = client
            .get_multiplexed_async_connection_with_config(&self.config)
            .await?;
        Ok(PooledConn {
            conn,
            broken: Arc::new(AtomicBool::new(false)),
        })
    }

    async fn is_valid(&self, conn: &mut PooledConn) -> Result<(), RedisError> {
        redis::cmd("PING").query_async::<()>(&mut conn.conn).await
    }

    fn has_broken(&self, conn: &mut PooledConn) -> bool {
        conn.broken.load(Ordering::Relaxed)
    }
}

/// Whether an error means the connection (or the node behind it) must be replaced: I/O errors,
/// dropped connections, timeouts, and a master that became a replica (READONLY) after failover.
pub fn breaks_connection(error: &RedisError) -> bool {
    error.is_io_error()
        || error.is_connection_dropped()
        || error.is_timeout()
        || error.is_unrecoverable_error()
        || matches!(
            error.kind(),
            redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
        )
}

pub enum Backend {
    Pool(bb8::Pool<Manager>),
    Cluster(ClusterConnection),
}

impl Backend {
    /// Builds the connection machinery without connecting: Portcullis starts (and answers by its
    /// failure mode) while Redis is still away, and connects in the background.
    pub fn new(config: &RedisConfig) -> Result<Backend, RedisError> {
        let tls_mode = config.tls.then_some(TlsMode::Secure);
        let certs = || {
            config.ca_pem.clone().map(|pem| TlsCertificates {
                client_tls: None,
                root_cert: Some(pem),
            })
        };
        match &config.topology {
            Topology::Standalone(url) => {
                let mut info = url.as_str().into_connection_info()?;
                // --redis-tls upgrades a plain redis:// URL; rediss:// is TLS already.
                if config.tls
                    && let ConnectionAddr::Tcp(host, port) = info.addr().clone()
                {
                    info = info.set_addr(address(host, port, true));
                }
                let mut redis_info = info.redis_settings().clone();
                if let Some(user) = &config.username {
                    redis_info = redis_info.set_username(user);
                }
                if let Some(password) = &config.password {
                    redis_info = redis_info.set_password(password);
                }
                let info = info.set_redis_settings(redis_info);
                let client = match certs() {
                    Some(certs) => redis::Client::build_with_tls(info, certs)?,
                    None => redis::Client::open(info)?,
                };
                Ok(Backend::Pool(Self::pool(Target::Direct(client), config)))
            }
            Topology::Sentinel { sentinels, master } => {
                let addrs = sentinels
                    .iter()
                    .map(|s| split_host_port(s).map(|(h, p)| address(h, p, config.tls)))
                    .collect::<Result<Vec<_>, _>>()?;
                let mut builder =
                    SentinelClientBuilder::new(addrs, master, SentinelServerType::Master)?;
                if let Some(mode) = tls_mode {
                    builder = builder.set_client_to_redis_tls_mode(mode);
                }
                if let Some(certs) = certs() {
                    builder = builder.set_client_to_redis_certificates(certs);
                }
                if let Some(user) = &config.username {
                    builder = builder.set_client_to_redis_username(user);
                }
                if let Some(password) = &config.password {
                    builder = builder.set_client_to_redis_password(password);
                }
                let sentinel = builder.build()?;
                Ok(Backend::Pool(Self::pool(
                    Target::Sentinel(tokio::sync::Mutex::new(sentinel)),
                    config,
                )))
            }
            Topology::Cluster(nodes) => {
                let infos = nodes
                    .iter()
                    .map(|n| split_host_port(n).map(|(h, p)| address(h, p, config.tls)))
                    .collect::<Result<Vec<_>, _>>()?;
                let mut builder = redis::cluster::ClusterClientBuilder::new(infos)
                    .use_protocol(ProtocolVersion::RESP3)
                    .connection_timeout(config.timeout)
                    .response_timeout(config.timeout)
                    // Each attempt is bounded by `timeout`; the whole call (retries, MOVED, ASK) too:
                    // the store deadline above us answers by the failure mode after that.
                    .overall_response_timeout(Some(config.timeout * 4))
                    // redis-rs' default backoff sleeps seconds; a rate-limit call has milliseconds.
                    .retries(3)
                    .min_retry_wait(2)
                    .max_retry_wait(25)
                    .retry_wait_formula(2, 2);
                if let Some(mode) = tls_mode {
                    builder = builder.tls(mode);
                }
                if let Some(certs) = certs() {
                    builder = builder.certs(certs);
                }
                if let Some(user) = &config.username {
                    builder = builder.username(user);
                }
                if let Some(password) = &config.password {
                    builder = builder.password(password);
                }
                let client = builder.build()?;
                let cluster_config = redis::cluster::ClusterConfig::new()
                    .set_connection_timeout(config.timeout)
                    .set_response_timeout(config.timeout);
                Ok(Backend::Cluster(
                    client.get_pending_async_connection_with_config(cluster_config),
                ))
            }
        }
    }

    fn pool(target: Target, config: &RedisConfig) -> bb8::Pool<Manager> {
        let manager = Manager {
            target,
            config: connection_config(config.timeout),
        };
        bb8::Pool::builder()
            .max_size(config.pool_size.max(1))
            .min_idle(Some(config.pool_size.max(1)))
            // One round trip per call: no PING on checkout; broken connections are flagged instead.
            .test_on_check_out(false)
            .connection_timeout(config.timeout)
            .retry_connection(false)
            .reaper_rate(Duration::from_secs(5))
            // Connections are handed back at once (see `checkout`): rotate through all of them.
            .queue_strategy(bb8::QueueStrategy::Fifo)
            .build_unchecked(manager)
    }
}

/// A multiplexed connection to use, and the flag that retires it from the pool when it fails.
///
/// Why the pooled connection goes straight back: a multiplexed connection carries many requests
/// at once, but a bb8 checkout is exclusive, so holding it for the call would allow only
/// `pool_size` requests in flight and queue the rest (missing the deadline under load).
pub async fn checkout(
    pool: &bb8::Pool<Manager>,
) -> Result<(MultiplexedConnection, Arc<AtomicBool>), bb8::RunError<RedisError>> {
    let attempts = pool.state().connections as usize + 1;
    for _ in 0..attempts {
        let pooled = pool.get().await?;
        if pooled.broken.load(Ordering::Relaxed) {
            // Dropping it returns it, and bb8 discards it as broken; try the next one.
            continue;
        }
        return Ok((pooled.conn.clone(), pooled.broken.clone()));
    }
    let pooled = pool.get().await?;
    Ok((pooled.conn.clone(), pooled.broken.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_reach_debug_output() {
        let config = RedisConfig {
            topology: Topology::Standalone("redis://user:hunter2@127.0.0.1:6379".into()),
            tls: false,
            ca_pem: None,
            username: Some("user".into()),
            password: Some("hunter2".into()),
            pool_size: 1,
            timeout: Duration::from_millis(5),
        };
        let shown = format!("{config:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(
            shown.contains("redis://user:<redacted>@127.0.0.1:6379"),
            "{shown}"
        );
    }
}
