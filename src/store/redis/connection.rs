//! Connections to Redis. Standalone and Sentinel: a small set of multiplexed connections, each
//! (re)connected by a background task. Cluster: redis-rs's async cluster client.
//!
//! Why our own set and not a pool crate: a multiplexed connection carries many requests at once,
//! so a call never checks one out; it picks a live one and never waits for a connection to be
//! made. Connecting happens in the background, bounded by `connect_timeout` (DNS, TCP, TLS,
//! AUTH/HELLO, the Sentinel lookup), which is separate from the per-call deadline: a TLS or
//! cross-zone handshake may take longer than a decision may. Failed connects back off (100 ms
//! doubling to 5 s) instead of being retried by every call, and the real reason (WRONGPASS, a
//! certificate, a refused port) is kept for calls, logs and `/readyz`. A connection is retired when
//! it fails at the connection level, or after `TIMEOUTS_TO_RETIRE` calls in a row missed their
//! deadline; one slow reply does not throw away a healthy connection.
//!
//! Every socket gets the options of `config::tcp_settings`. This module must never log a
//! password.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    AsyncConnectionConfig, ConnectionAddr, IntoConnectionInfo, ProtocolVersion, RedisError, TlsMode,
};

use super::classify;
use super::config::{RedisConfig, Topology, address, certificates, split_host_port, tcp_settings};
use crate::store::StoreError;
use crate::telemetry::{KindLabels, LogThrottle, Metrics};

/// Calls in a row that missed their deadline on one connection before it is replaced.
pub const TIMEOUTS_TO_RETIRE: u32 = 3;
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Whether an error means the connection (or the node behind it) must be replaced: I/O errors,
/// dropped connections, and a master that became a replica (READONLY) after failover. Not a
/// missed deadline: that is counted (`Live::timed_out`).
pub fn breaks_connection(error: &RedisError) -> bool {
    error.is_io_error()
        || error.is_connection_dropped()
        || error.is_unrecoverable_error()
        || matches!(
            error.kind(),
            redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
        )
}

/// One multiplexed connection in use.
pub struct Live {
    pub conn: MultiplexedConnection,
    timeouts: AtomicU32,
    broken: AtomicBool,
}

impl Live {
    pub fn succeeded(&self) {
        self.timeouts.store(0, Ordering::Relaxed);
    }

    /// A call missed its deadline on this connection: after `TIMEOUTS_TO_RETIRE` in a row it is
    /// replaced (a half-open TCP connection never answers again).
    pub fn timed_out(&self) {
        if self.timeouts.fetch_add(1, Ordering::Relaxed) + 1 >= TIMEOUTS_TO_RETIRE {
            self.broken.store(true, Ordering::Relaxed);
        }
    }

    pub fn failed(&self, error: &RedisError) {
        if breaks_connection(error) {
            self.broken.store(true, Ordering::Relaxed);
        }
    }

    fn is_broken(&self) -> bool {
        self.broken.load(Ordering::Relaxed)
    }
}

enum Target {
    Direct(redis::Client),
    Sentinel(tokio::sync::Mutex<SentinelClient>),
}

struct Slot {
    live: ArcSwapOption<Live>,
    connecting: AtomicBool,
}

/// The standalone/Sentinel connections.
pub struct ConnectionSet {
    slots: Box<[Slot]>,
    next: AtomicUsize,
    target: Target,
    config: AsyncConnectionConfig,
    connect_timeout: Duration,
    /// Why the last connect failed; cleared by a successful one.
    last_error: Mutex<Option<StoreError>>,
    /// Woken when a slot connects.
    connected: tokio::sync::Notify,
    metrics: Arc<Metrics>,
    log: LogThrottle,
}

impl ConnectionSet {
    fn new(target: Target, config: &RedisConfig, metrics: Arc<Metrics>) -> Arc<ConnectionSet> {
        let set = Arc::new(ConnectionSet {
            slots: (0..config.pool_size.max(1))
                .map(|_| Slot {
                    live: ArcSwapOption::empty(),
                    connecting: AtomicBool::new(false),
                })
                .collect(),
            next: AtomicUsize::new(0),
            target,
            // No response timeout here: each call carries its own deadline.
            config: AsyncConnectionConfig::new()
                .set_connection_timeout(Some(config.connect_timeout))
                .set_response_timeout(None),
            connect_timeout: config.connect_timeout,
            last_error: Mutex::new(None),
            connected: tokio::sync::Notify::new(),
            metrics,
            log: LogThrottle::default(),
        });
        for index in 0..set.slots.len() {
            set.reconnect(index);
        }
        set
    }

    /// A live connection, without waiting: none live is an error saying why.
    pub fn get(self: &Arc<Self>) -> Result<Arc<Live>, StoreError> {
        let count = self.slots.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        for i in 0..count {
            let index = (start + i) % count;
            match self.slots[index].live.load_full() {
                Some(live) if !live.is_broken() => return Ok(live),
                _ => self.reconnect(index),
            }
        }
        Err(self.last_error().unwrap_or_else(|| {
            StoreError::Unavailable("connecting to Redis (no connection yet)".into())
        }))
    }

    /// A live connection; when none is live but a connect is under way and has not failed yet
    /// (start-up, or a connection just replaced), waits for it until `deadline`. After a failed
    /// connect it answers at once: during an outage the failure mode answers without delay.
    pub async fn get_or_wait(
        self: &Arc<Self>,
        deadline: tokio::time::Instant,
    ) -> Result<Arc<Live>, StoreError> {
        match self.get() {
            Ok(live) => Ok(live),
            Err(e) if self.last_error().is_some() => Err(e),
            Err(_) => {
                let notified = self.connected.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                if !self.any_live() {
                    let _ = tokio::time::timeout_at(deadline, notified).await;
                }
                self.get()
            }
        }
    }

    /// The reason the last connect failed, if the last attempt failed.
    pub fn last_error(&self) -> Option<StoreError> {
        self.last_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Whether any connection is live (for the start-up probe).
    pub fn any_live(&self) -> bool {
        self.slots
            .iter()
            .any(|s| s.live.load().as_ref().is_some_and(|l| !l.is_broken()))
    }

    /// Starts connecting slot `index` in the background, unless that is under way.
    fn reconnect(self: &Arc<Self>, index: usize) {
        if self.slots[index].connecting.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak = Arc::downgrade(self);
        tokio::spawn(connect_slot(weak, index));
    }

    async fn connect(&self) -> Result<MultiplexedConnection, RedisError> {
        let client = match &self.target {
            Target::Direct(client) => client.clone(),
            Target::Sentinel(sentinel) => sentinel.lock().await.async_get_client().await?,
        };
        client
            .get_multiplexed_async_connection_with_config(&self.config)
            .await
    }

    fn connect_failed(&self, error: StoreError) {
        self.metrics
            .store_connect_errors
            .get_or_create(&KindLabels {
                kind: error.kind().into(),
            })
            .inc();
        if let Some(skipped) = self.log.allow() {
            if error.is_permanent() {
                tracing::error!(%error, similar_failures_not_logged = skipped, "cannot connect to Redis");
            } else {
                tracing::warn!(%error, similar_failures_not_logged = skipped, "cannot connect to Redis; retrying");
            }
        }
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(error);
    }
}

/// Connects one slot, backing off between failures, until it succeeds or the set is gone.
async fn connect_slot(set: Weak<ConnectionSet>, index: usize) {
    let mut backoff = FIRST_BACKOFF;
    loop {
        let Some(set) = set.upgrade() else { return };
        let attempt = tokio::time::timeout(set.connect_timeout, set.connect()).await;
        let error = match attempt {
            Ok(Ok(conn)) => {
                let slot = &set.slots[index];
                slot.live.store(Some(Arc::new(Live {
                    conn,
                    timeouts: AtomicU32::new(0),
                    broken: AtomicBool::new(false),
                })));
                *set.last_error.lock().unwrap_or_else(|p| p.into_inner()) = None;
                slot.connecting.store(false, Ordering::Release);
                set.connected.notify_waiters();
                tracing::debug!(slot = index, "connected to Redis");
                return;
            }
            Ok(Err(e)) => classify(&e),
            Err(_) => StoreError::Unavailable(format!(
                "connecting took longer than the connect timeout ({:?}): raise \
                 --redis-connect-timeout if the network or TLS handshake is slow",
                set.connect_timeout
            )),
        };
        set.connect_failed(error);
        drop(set);
        // A little jitter so that replicas do not reconnect in lockstep after an outage.
        let jitter = Duration::from_millis(u64::from(std::process::id() % 50));
        tokio::time::sleep(backoff + jitter).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

#[derive(Clone)]
pub enum Backend {
    Pool(Arc<ConnectionSet>),
    Cluster(ClusterConnection),
}

impl Backend {
    /// Builds the connection machinery; connections are made in the background, so Portcullis
    /// starts (and answers by its failure mode) while Redis is still away.
    pub fn new(config: &RedisConfig, metrics: Arc<Metrics>) -> Result<Backend, RedisError> {
        let tls_mode = config.tls.then_some(TlsMode::Secure);
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
                let info = info
                    .set_redis_settings(redis_info)
                    .set_tcp_settings(tcp_settings());
                let client = match certificates(&config.ca_pem, &config.client_cert_pem) {
                    Some(certs) => redis::Client::build_with_tls(info, certs)?,
                    None => redis::Client::open(info)?,
                };
                let client = if config.skip_hostname_verification {
                    // Set on the address after the certificates: building with them replaces
                    // the address' TLS parameters.
                    let info = client.get_connection_info().clone();
                    let mut addr = info.addr().clone();
                    addr.set_danger_accept_invalid_hostnames(true);
                    redis::Client::open(info.set_addr(addr))?
                } else {
                    client
                };
                Ok(Backend::Pool(ConnectionSet::new(
                    Target::Direct(client),
                    config,
                    metrics,
                )))
            }
            Topology::Sentinel { sentinels, master } => {
                let sentinel = &config.sentinel;
                let addrs = sentinels
                    .iter()
                    .map(|s| split_host_port(s).map(|(h, p)| address(h, p, sentinel.tls)))
                    .collect::<Result<Vec<_>, _>>()?;
                let mut builder =
                    SentinelClientBuilder::new(addrs, master, SentinelServerType::Master)?
                        .set_client_to_redis_tcp_settings(tcp_settings())
                        .set_client_to_sentinel_tcp_settings(tcp_settings());
                if let Some(mode) = tls_mode {
                    builder = builder.set_client_to_redis_tls_mode(mode);
                }
                if let Some(certs) = certificates(&config.ca_pem, &config.client_cert_pem) {
                    builder = builder.set_client_to_redis_certificates(certs);
                }
                if let Some(user) = &config.username {
                    builder = builder.set_client_to_redis_username(user);
                }
                if let Some(password) = &config.password {
                    builder = builder.set_client_to_redis_password(password);
                }
                if sentinel.tls {
                    builder = builder.set_client_to_sentinel_tls_mode(TlsMode::Secure);
                }
                if let Some(certs) = certificates(&sentinel.ca_pem, &config.client_cert_pem) {
                    builder = builder.set_client_to_sentinel_certificates(certs);
                }
                if let Some(user) = &sentinel.username {
                    builder = builder.set_client_to_sentinel_username(user);
                }
                if let Some(password) = &sentinel.password {
                    builder = builder.set_client_to_sentinel_password(password);
                }
                let client = builder.build()?;
                Ok(Backend::Pool(ConnectionSet::new(
                    Target::Sentinel(tokio::sync::Mutex::new(client)),
                    config,
                    metrics,
                )))
            }
            Topology::Cluster(nodes) => {
                let infos = nodes
                    .iter()
                    .map(|n| split_host_port(n).map(|(h, p)| address(h, p, config.tls)))
                    .collect::<Result<Vec<_>, _>>()?;
                let mut builder = redis::cluster::ClusterClientBuilder::new(infos)
                    .use_protocol(ProtocolVersion::RESP3)
                    .tcp_settings(tcp_settings())
                    .connection_timeout(config.connect_timeout)
                    // Each call carries its own deadline (the store applies it per check); these
                    // only bound what no deadline covers, such as slot refreshes.
                    .response_timeout(config.connect_timeout)
                    .overall_response_timeout(Some(config.connect_timeout * 2))
                    // No retries by the client: it would re-send a script after an I/O error,
                    // when the script may have run (a double charge). The store retries only
                    // where the script cannot have run: MOVED, ASK, TRYAGAIN, refused connects.
                    .retries(0);
                if let Some(mode) = tls_mode {
                    builder = builder.tls(mode);
                }
                if let Some(certs) = certificates(&config.ca_pem, &config.client_cert_pem) {
                    builder = builder.certs(certs);
                }
                if config.skip_hostname_verification {
                    builder = builder.danger_accept_invalid_hostnames(true);
                }
                if let Some(user) = &config.username {
                    builder = builder.username(user);
                }
                if let Some(password) = &config.password {
                    builder = builder.password(password);
                }
                let client = builder.build()?;
                let cluster_config = redis::cluster::ClusterConfig::new()
                    .set_connection_timeout(config.connect_timeout)
                    .set_response_timeout(config.connect_timeout);
                Ok(Backend::Cluster(
                    client.get_pending_async_connection_with_config(cluster_config),
                ))
            }
        }
    }
}
