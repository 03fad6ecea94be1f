//! The composition root: the one place that turns `Settings` into running parts. It loads the
//! rules, builds the store and the limiter over it, binds the gRPC listener (`ShouldRateLimit`,
//! `grpc.health.v1`, optionally TLS) and the admin listener, starts the file watchers (rules,
//! certificate), and returns a handle that drains and stops all of it. The binary and the
//! end-to-end tests start the server the same way. Nothing below this floor reads `Settings`.

pub mod listen;
pub mod reload;
pub mod scaling;
pub mod statsd;
pub mod tls;
pub mod watch;
pub mod xds;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use std::sync::atomic::{AtomicBool, Ordering};

use arc_swap::ArcSwap;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::algorithm::ChargeMode;
use crate::clock::Clock;
use crate::limiter::{DenyCacheBounds, FailureMode, Limiter, LimiterConfig};
use crate::pb::RateLimitServiceServer;
use crate::rules::{self, RulesError};
use crate::service::admin::Routes;
use crate::service::response::HeaderNames;
use crate::service::{Decider, RlsService, ServiceConfig, admin};
use crate::settings::{Settings, StoreKind};
use crate::store::redis::{RedisConfig, SentinelAuth, Topology};
use crate::store::split::SplitStore;
use crate::store::{MemoryStore, RedisStore, Store};
use crate::telemetry::Metrics;
use crate::telemetry::statsd_mapping::StatsdMapping;

/// The gRPC health service name envoyproxy/ratelimit registers; probes and Envoy health checks
/// written for it ask for this name.
pub const GO_HEALTH_SERVICE: &str = "ratelimit";

/// A gRPC health name that is SERVING for as long as the process answers: for liveness probes,
/// which must never depend on Redis or on a drain in progress. The other names (`""`,
/// `ratelimit`, the RLS service) follow readiness, as `/readyz` does.
pub const LIVENESS_HEALTH_SERVICE: &str = "portcullis.liveness";

/// How often readiness is worked out again for gRPC health.
const READINESS_INTERVAL: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("rules in {dir} refused:\n{source}")]
    Rules { dir: String, source: RulesError },
    #[error("{0}")]
    Settings(String),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// A running server; dropping it does not stop it, `drain` or `shutdown` does.
pub struct Running {
    pub grpc_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    /// The more HTTP listeners' addresses, in the order of `Settings::http_listeners`, then the
    /// Go-named metrics listener.
    pub http_addrs: Vec<SocketAddr>,
    pub metrics: Arc<Metrics>,
    health: HealthReporter,
    draining: Arc<AtomicBool>,
    stop: tokio::sync::watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Running {
    /// Graceful stop: report NOT_SERVING (gRPC health and `/readyz`) so that load balancers and
    /// Envoy move away, keep answering for `period`, then stop accepting, let in-flight calls
    /// finish, and return.
    pub async fn drain(self, period: Duration) {
        tracing::info!(?period, "draining: health reports NOT_SERVING");
        self.draining.store(true, Ordering::Relaxed);
        self.health
            .set_service_status("", ServingStatus::NotServing)
            .await;
        self.health
            .set_not_serving::<RateLimitServiceServer<RlsService>>()
            .await;
        self.health
            .set_service_status(GO_HEALTH_SERVICE, ServingStatus::NotServing)
            .await;
        tokio::time::sleep(period).await;
        self.shutdown().await;
    }

    /// Stops accepting, lets in-flight calls finish, and waits for every task to end.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

/// Loads the rules, binds the listeners and serves until `drain` or `shutdown`.
pub async fn start(settings: &Settings, clock: Arc<dyn Clock>) -> Result<Running, StartError> {
    // TLS (Redis now, gRPC later) uses rustls with ring; a second install is a harmless no-op.
    let _ = rustls::crypto::ring::default_provider().install_default();
    settings
        .validate()
        .map_err(|e| StartError::Settings(e.to_string()))?;
    for ignored in &settings.ignored_variables {
        tracing::warn!("envoyproxy/ratelimit variable read, not used: {ignored}");
    }
    let metrics = Arc::new(Metrics::new(
        settings.near_limit_ratio,
        settings.max_detailed_series,
    ));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut tasks = Vec::new();
    let (snapshot, xds) = match &settings.rules_xds_server {
        None => {
            let snapshot =
                rules::load_dir(&settings.config, settings.load_options()).map_err(|source| {
                    StartError::Rules {
                        dir: settings.config.display().to_string(),
                        source,
                    }
                })?;
            tracing::info!(
                files = snapshot.files.len(),
                domains = ?snapshot.domain_names(),
                "rules loaded"
            );
            metrics.rules_loaded(snapshot.loaded_at);
            // The first load is a load, as the Go service's config_load_success counts it.
            metrics
                .rules_reloads
                .get_or_create(&crate::telemetry::ResultLabels {
                    result: "success".into(),
                })
                .inc();
            (snapshot, None)
        }
        Some(server) => (
            rules::Snapshot::empty(),
            Some(xds_config(settings, server)?),
        ),
    };
    let loaded_fingerprint = snapshot.fingerprint;
    let rules = Arc::new(ArcSwap::from_pointee(snapshot));
    let from_xds = xds.is_some();
    if let Some(config) = xds {
        let (task, applied) = xds::spawn(
            xds::XdsRules {
                config,
                rules: rules.clone(),
                metrics: metrics.clone(),
                options: settings.load_options(),
            },
            stopped.clone(),
        );
        tasks.push(task);
        if !settings.force_start_without_initial_rules {
            wait_for_first_rules(applied, &settings.rules_xds_server).await?;
        }
    }

    let memory = || {
        let store = MemoryStore::with_max_counters(clock.clone(), settings.memory_max_counters);
        store.spawn_sweeper(Duration::from_secs(10));
        let held = Arc::downgrade(&store);
        metrics.watch_memory_fill(Box::new(move || {
            held.upgrade().map_or(0.0, |store| store.fill_ratio())
        }));
        Box::new(store)
    };
    let limiter = match settings.store {
        // The memory store fails only when full: a new descriptor is then answered by the
        // failure mode chosen (never a silent allow under `deny`). `local` has nothing more local
        // to count in, so it refuses, like `deny`.
        StoreKind::Memory => {
            let failure_mode = match settings.failure_mode {
                FailureMode::Local => FailureMode::Deny,
                mode => mode,
            };
            let config = LimiterConfig {
                deadline: Duration::from_secs(3600),
                failure_mode,
                deny_cache: None,
            };
            Limiter::with_policy(memory(), config, None, metrics.clone())
        }
        StoreKind::Redis => {
            let config = redis_config(settings)?;
            tracing::info!(redis = ?config, prefix = %settings.key_prefix, "using Redis");
            let store = RedisStore::new(&config, &settings.key_prefix, metrics.clone())
                .map_err(|e| StartError::Settings(e.to_string()))?;
            spawn_probe(store.clone(), settings.redis_connect_timeout * 2);
            let store: Box<dyn Store> = match per_second_settings(settings) {
                None => Box::new(store),
                Some(per_second) => {
                    let config = redis_config(&per_second)?;
                    tracing::info!(redis = ?config, "per-second limits in their own Redis");
                    let fast = RedisStore::new(&config, &settings.key_prefix, metrics.clone())
                        .map_err(|e| StartError::Settings(e.to_string()))?;
                    spawn_probe(fast.clone(), settings.redis_connect_timeout * 2);
                    Box::new(SplitStore::new(Box::new(store), Box::new(fast)))
                }
            };
            let fallback =
                (settings.failure_mode == FailureMode::Local).then(|| memory() as Box<dyn Store>);
            let config = LimiterConfig {
                deadline: settings.store_timeout,
                failure_mode: settings.failure_mode,
                deny_cache: settings.deny_cache.then_some(DenyCacheBounds {
                    max_entries: settings.deny_cache_max_entries,
                    max_bytes: settings.deny_cache_max_bytes,
                    max_age: settings.deny_cache_max_age,
                }),
            };
            Limiter::with_policy(store, config, fallback, metrics.clone())
        }
    };
    let limiter = Arc::new(limiter);
    let config = ServiceConfig {
        response_headers: settings.response_headers,
        header_names: HeaderNames {
            limit: settings.header_limit_name.clone(),
            remaining: settings.header_remaining_name.clone(),
            reset: settings.header_reset_name.clone(),
        },
        global_shadow_mode: settings.shadow_mode,
        global_quota_mode: settings.quota_mode,
        charge: if settings.stop_charging_when_over {
            ChargeMode::AllOrNothing
        } else {
            ChargeMode::EachAlone
        },
        dynamic_metadata: settings.response_dynamic_metadata,
        override_algorithm: settings.override_algorithm,
        // The Go service counts every hit, refused or not (INCRBY, then compare), unless told to
        // stop charging over the limit: drop-in mode counts the same, so Go rules keep meaning.
        post_paid_everywhere: settings.env_compat.as_deref() == Some("go")
            && !settings.stop_charging_when_over,
        max_descriptors: settings.max_descriptors,
        max_entries: settings.max_entries,
        max_string_bytes: settings.max_string_bytes,
    };
    // Runtime scaling: the file (a broken one stops the start-up, like broken rules), then the
    // store's temporary factors, read once now and every reload interval after.
    let (scaling_fingerprint, scaling_file) = match &settings.scaling_file {
        Some(path) => scaling::read_file(path)
            .map_err(|e| StartError::Settings(format!("--scaling-file: {e}")))?,
        None => (0, Default::default()),
    };
    let scaling_handle = Arc::new(crate::service::scaling::ScalingHandle {
        scaling: Arc::new(arc_swap::ArcSwap::from_pointee(
            crate::rules::scaling::Scaling {
                file: scaling_file,
                ..Default::default()
            },
        )),
        last: Default::default(),
    });
    let _ = crate::service::scaling::refresh(
        &limiter,
        &scaling_handle.scaling,
        &rules,
        &metrics,
        &scaling_handle.last,
        settings.store_timeout.max(Duration::from_millis(250)),
    )
    .await;
    tasks.push(scaling::spawn_poller(
        limiter.clone(),
        scaling_handle.clone(),
        rules.clone(),
        metrics.clone(),
        settings.reload_interval,
        stopped.clone(),
    ));
    if let Some(path) = &settings.scaling_file {
        tasks.push(watch::spawn(
            Arc::new(scaling::ScalingFileWatch {
                path: path.clone(),
                handle: scaling_handle.clone(),
                rules: rules.clone(),
                metrics: metrics.clone(),
            }),
            scaling_fingerprint,
            settings.reload_interval,
            stopped.clone(),
        ));
    }
    let decider = Arc::new(
        Decider::new(rules.clone(), limiter.clone(), config, metrics.clone())
            .with_scaling(scaling_handle.scaling.clone()),
    );

    let grpc_listener = bind(settings.grpc_addr).await?;
    let admin_listener = bind(settings.admin_addr).await?;
    let grpc_addr = local_addr(&grpc_listener, settings.grpc_addr)?;
    let admin_addr = local_addr(&admin_listener, settings.admin_addr)?;
    // More HTTP listeners (Go mode: Go's PORT; Go-named metrics), bound now so that a busy port
    // stops the start-up.
    let mut wanted: Vec<(SocketAddr, Routes)> = settings
        .http_listeners
        .iter()
        .map(|l| (l.addr, l.routes.clone()))
        .collect();
    if let Some(addr) = settings.go_metrics_addr {
        wanted.push((
            addr,
            Routes {
                health: false,
                rules: false,
                metrics: false,
                json: false,
                go_metrics: Some(settings.go_metrics_path.clone()),
                scaling: false,
            },
        ));
    }
    let mut extra_listeners = Vec::new();
    let mut http_addrs = Vec::new();
    for (addr, routes) in wanted {
        let listener = bind(addr).await?;
        http_addrs.push(local_addr(&listener, addr)?);
        extra_listeners.push((listener, routes));
    }

    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<RateLimitServiceServer<RlsService>>()
        .await;
    health
        .set_service_status(GO_HEALTH_SERVICE, ServingStatus::Serving)
        .await;
    health
        .set_service_status(LIVENESS_HEALTH_SERVICE, ServingStatus::Serving)
        .await;
    let rls = RateLimitServiceServer::new(RlsService::new(decider.clone(), settings.max_in_flight))
        .max_decoding_message_size(settings.max_message_bytes);
    let mut builder = tonic::transport::Server::builder();
    if let Some(age) = settings.grpc_max_connection_age {
        builder = builder.max_connection_age(age);
    }
    if let Some(grace) = settings.grpc_max_connection_age_grace {
        builder = builder.max_connection_age_grace(grace);
    }
    let router = builder
        .max_concurrent_streams(settings.grpc_max_concurrent_streams)
        .http2_keepalive_interval(Some(settings.grpc_keepalive_interval))
        .http2_keepalive_timeout(Some(settings.grpc_keepalive_timeout))
        .timeout(settings.grpc_request_timeout())
        .add_service(health_service)
        .add_service(rls);
    let grpc_stopped = wait_for_stop(stopped.clone());
    let grpc_task = match tls_files(settings)? {
        None => {
            let incoming = listen::tcp_incoming(grpc_listener, metrics.clone(), stopped.clone());
            tokio::spawn(async move {
                if let Err(e) = router
                    .serve_with_incoming_shutdown(incoming, grpc_stopped)
                    .await
                {
                    tracing::error!(error = %e, "gRPC server failed");
                }
            })
        }
        Some(files) => {
            let (certificate, loaded) =
                tls::TlsWatch::load(files).map_err(|e| StartError::Settings(e.to_string()))?;
            let certificate = Arc::new(certificate);
            let incoming = tls::incoming(
                grpc_listener,
                certificate.current.clone(),
                certificate.client_san(),
                metrics.clone(),
                stopped.clone(),
            );
            tasks.push(watch::spawn(
                certificate,
                loaded,
                settings.reload_interval,
                stopped.clone(),
            ));
            tokio::spawn(async move {
                if let Err(e) = router
                    .serve_with_incoming_shutdown(incoming, grpc_stopped)
                    .await
                {
                    tracing::error!(error = %e, "gRPC server failed");
                }
            })
        }
    };

    let draining = Arc::new(AtomicBool::new(false));
    // A custom statsd_exporter mapping for the Go-named series: read now, refused whole.
    let go_mapping = match &settings.go_metrics_mapping {
        None => None,
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| {
                StartError::Settings(format!(
                    "the statsd_exporter mapping {} cannot be read: {e}",
                    path.display()
                ))
            })?;
            let mapping = StatsdMapping::parse(&text).map_err(|e| {
                StartError::Settings(format!(
                    "the statsd_exporter mapping {} is refused: {e}",
                    path.display()
                ))
            })?;
            Some(Arc::new(mapping))
        }
    };
    let admin_state = admin::AdminState {
        rules: rules.clone(),
        limiter,
        decider,
        metrics: metrics.clone(),
        draining: draining.clone(),
        ready_requires_store: settings.ready_requires_store,
        ready_requires_rules: settings.ready_requires_rules,
        ready_on_permanent_store_errors: settings.ready_on_permanent_store_errors,
        store_ping_timeout: settings.store_timeout.max(Duration::from_millis(250)),
        scaling: scaling_handle,
        scaling_token_file: settings.admin_scaling_token_file.clone(),
        go_mapping,
    };
    tasks.push(spawn_readiness(
        admin_state.clone(),
        health.clone(),
        stopped.clone(),
    ));
    let app = admin::router(
        admin_state.clone(),
        &Routes::admin(settings.admin_json, settings.admin_scaling),
    );
    let admin_task = tokio::spawn(listen::serve_http(
        admin_listener,
        app,
        settings.admin_header_timeout,
        Duration::from_secs(5),
        metrics.clone(),
        stopped.clone(),
    ));
    for (listener, routes) in extra_listeners {
        tasks.push(tokio::spawn(listen::serve_http(
            listener,
            admin::router(admin_state.clone(), &routes),
            settings.admin_header_timeout,
            Duration::from_secs(5),
            metrics.clone(),
            stopped.clone(),
        )));
    }
    if let Some(addr) = &settings.statsd_addr {
        let config = statsd::StatsdConfig {
            addr: addr.clone(),
            interval: settings.statsd_flush_interval,
            tags: settings.statsd_tags.clone(),
            dogstatsd: settings.statsd_dogstatsd,
        };
        tasks.push(statsd::spawn(config, metrics.clone(), stopped.clone()));
    }
    if !from_xds {
        let rules_watch = reload::RulesWatch {
            dir: settings.config.clone(),
            rules,
            metrics: metrics.clone(),
            allow_removal: settings.allow_rules_removal,
            options: settings.load_options(),
        };
        tasks.push(watch::spawn(
            Arc::new(rules_watch),
            loaded_fingerprint,
            settings.reload_interval,
            stopped,
        ));
    }
    tasks.extend([grpc_task, admin_task]);
    tracing::info!(%grpc_addr, %admin_addr, store = ?settings.store, "serving");
    Ok(Running {
        grpc_addr,
        admin_addr,
        http_addrs,
        metrics,
        health,
        draining,
        stop,
        tasks,
    })
}

/// Keeps the gRPC health of the service (`""`, `ratelimit`, the RLS service) equal to readiness:
/// gRPC readiness probes and Envoy health checks see what `/readyz` says. After a drain starts it
/// only ever says NOT_SERVING.
fn spawn_readiness(
    state: admin::AdminState,
    health: HealthReporter,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut last = None;
        let mut ticker = tokio::time::interval(READINESS_INTERVAL);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = stop.wait_for(|s| *s) => break,
            }
            let (ready, why) = admin::readiness(&state).await;
            // A drain that began meanwhile has the last word.
            let ready = ready && !state.draining.load(Ordering::Relaxed);
            if last == Some(ready) {
                continue;
            }
            if last.is_some() {
                tracing::info!(ready, "readiness changed:\n{why}");
            }
            last = Some(ready);
            state.metrics.ready.set(i64::from(ready));
            let status = if ready {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            };
            for name in ["", GO_HEALTH_SERVICE] {
                health.set_service_status(name, status).await;
            }
            if ready {
                health
                    .set_serving::<RateLimitServiceServer<RlsService>>()
                    .await;
            } else {
                health
                    .set_not_serving::<RateLimitServiceServer<RlsService>>()
                    .await;
            }
        }
    })
}

/// Holds the start-up until the xDS server has delivered a valid set (as the Go service does
/// without FORCE_START_WITHOUT_INITIAL_CONFIG), saying so every 30 s.
async fn wait_for_first_rules(
    mut applied: tokio::sync::watch::Receiver<bool>,
    server: &Option<String>,
) -> Result<(), StartError> {
    let server = server.as_deref().unwrap_or_default();
    tracing::info!(
        %server,
        "waiting for the first rules from the xDS server before serving \
         (--force-start-without-initial-rules serves at once)"
    );
    let mut waited = Duration::ZERO;
    loop {
        match tokio::time::timeout(Duration::from_secs(30), applied.wait_for(|a| *a)).await {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(_)) => {
                return Err(StartError::Settings(
                    "the xDS rules client stopped before delivering rules".into(),
                ));
            }
            Err(_) => {
                waited += Duration::from_secs(30);
                tracing::warn!(%server, ?waited, "still waiting for the first xDS rules");
            }
        }
    }
}

/// The xDS client's settings, checked (a bad header, CA file or address stops the start-up).
fn xds_config(settings: &Settings, server: &str) -> Result<xds::XdsClientConfig, StartError> {
    let bad = |e: xds::XdsSettingError| StartError::Settings(e.to_string());
    let tls = if settings.rules_xds_tls {
        let ca = settings.rules_xds_ca_file.as_ref().ok_or_else(|| {
            StartError::Settings(
                "--rules-xds-tls needs --rules-xds-ca-file (CONFIG_GRPC_XDS_SERVER_TLS_CACERT): \
                 the xDS server's certificate is checked against that CA only"
                    .into(),
            )
        })?;
        let mut tls = tonic::transport::ClientTlsConfig::new().ca_certificate(
            tonic::transport::Certificate::from_pem(read_file("--rules-xds-ca-file", ca)?),
        );
        match (&settings.rules_xds_cert, &settings.rules_xds_key) {
            (Some(cert), Some(key)) => {
                tls = tls.identity(tonic::transport::Identity::from_pem(
                    read_file("--rules-xds-cert", cert)?,
                    read_file("--rules-xds-key", key)?,
                ));
            }
            (None, None) => {}
            _ => {
                return Err(StartError::Settings(
                    "--rules-xds-cert and --rules-xds-key go together".into(),
                ));
            }
        }
        if let Some(san) = &settings.rules_xds_san {
            tls = tls.domain_name(san.clone());
        }
        Some(tls)
    } else {
        None
    };
    Ok(xds::XdsClientConfig {
        uri: xds::server_uri(server, settings.rules_xds_tls).map_err(bad)?,
        node: xds::node(
            &settings.rules_xds_node_id,
            settings.rules_xds_node_metadata.as_deref(),
        )
        .map_err(bad)?,
        headers: xds::headers(settings.rules_xds_headers.as_deref()).map_err(bad)?,
        tls,
        backoff: xds::Backoff {
            initial: settings.rules_xds_backoff_initial,
            max: settings.rules_xds_backoff_max,
            random_factor: settings.rules_xds_backoff_random_factor,
            jitter: settings.rules_xds_backoff_jitter,
        },
        max_message_bytes: settings.rules_xds_max_message_bytes,
        connect_timeout: Duration::from_secs(10),
    })
}

/// The gRPC TLS files, when TLS is configured (a certificate needs its key).
fn tls_files(settings: &Settings) -> Result<Option<tls::TlsFiles>, StartError> {
    match (&settings.grpc_tls_cert, &settings.grpc_tls_key) {
        (None, None) if settings.grpc_tls_client_ca.is_some() => Err(StartError::Settings(
            "--grpc-tls-client-ca needs --grpc-tls-cert and --grpc-tls-key".into(),
        )),
        (None, None) => Ok(None),
        (Some(cert), Some(key)) => Ok(Some(tls::TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: settings.grpc_tls_client_ca.clone(),
            client_san: settings.grpc_tls_client_san.clone(),
        })),
        _ => Err(StartError::Settings(
            "--grpc-tls-cert and --grpc-tls-key go together".into(),
        )),
    }
}

/// The Redis connection settings, exactly one topology.
/// The settings of the per-second Redis, when there is one: Go mode's REDIS_PERSECOND_*, or
/// --redis-per-second-url with the other Redis settings shared.
fn per_second_settings(settings: &Settings) -> Option<Settings> {
    if let Some(per_second) = &settings.redis_per_second {
        return Some(Settings::clone(per_second));
    }
    let url = settings.redis_per_second_url.clone()?;
    let mut per_second = settings.clone();
    per_second.redis_url = Some(url);
    per_second.redis_cluster = Vec::new();
    per_second.redis_sentinel = Vec::new();
    per_second.redis_per_second = None;
    Some(per_second)
}

fn redis_config(settings: &Settings) -> Result<RedisConfig, StartError> {
    let topology = match (
        &settings.redis_url,
        settings.redis_cluster.is_empty(),
        settings.redis_sentinel.is_empty(),
    ) {
        (Some(url), true, true) => Topology::Standalone(url.clone()),
        (None, false, true) => Topology::Cluster(settings.redis_cluster.clone()),
        (None, true, false) => Topology::Sentinel {
            sentinels: settings.redis_sentinel.clone(),
            master: settings.redis_master.clone().ok_or_else(|| {
                StartError::Settings(
                    "--redis-sentinel needs --redis-master (the monitored master's name)".into(),
                )
            })?,
        },
        (None, true, true) => {
            return Err(StartError::Settings(
                "--store redis needs one of --redis-url, --redis-cluster, --redis-sentinel".into(),
            ));
        }
        _ => {
            return Err(StartError::Settings(
                "give only one of --redis-url, --redis-cluster, --redis-sentinel".into(),
            ));
        }
    };
    let ca_pem = match &settings.redis_ca_file {
        Some(path) => Some(read_file("--redis-ca-file", path)?),
        None => None,
    };
    if settings.redis_tls_skip_hostname_verification && !settings.redis_sentinel.is_empty() {
        return Err(StartError::Settings(
            "--redis-tls-skip-hostname-verification is not supported with Sentinel".into(),
        ));
    }
    let client_cert_pem = match (&settings.redis_tls_cert, &settings.redis_tls_key) {
        (Some(cert), Some(key)) => Some((
            read_file("--redis-tls-cert", cert)?,
            read_file("--redis-tls-key", key)?,
        )),
        (None, None) => None,
        _ => {
            return Err(StartError::Settings(
                "--redis-tls-cert and --redis-tls-key go together".into(),
            ));
        }
    };
    let sentinel_ca_pem = match &settings.redis_sentinel_ca_file {
        Some(path) => Some(read_file("--redis-sentinel-ca-file", path)?),
        None => None,
    };
    Ok(RedisConfig {
        topology,
        tls: settings.redis_tls || ca_pem.is_some() || client_cert_pem.is_some(),
        ca_pem,
        client_cert_pem,
        skip_hostname_verification: settings.redis_tls_skip_hostname_verification,
        username: settings.redis_user.clone(),
        password: settings.redis_password.as_ref().map(|s| s.0.clone()),
        sentinel: SentinelAuth {
            tls: settings.redis_sentinel_tls || sentinel_ca_pem.is_some(),
            ca_pem: sentinel_ca_pem,
            username: settings.redis_sentinel_user.clone(),
            password: settings
                .redis_sentinel_password
                .as_ref()
                .map(|s| s.0.clone()),
        },
        pool_size: settings.redis_pool_size,
        connect_timeout: settings.redis_connect_timeout,
    })
}

fn read_file(flag: &str, path: &std::path::Path) -> Result<Vec<u8>, StartError> {
    std::fs::read(path)
        .map_err(|e| StartError::Settings(format!("cannot read {flag} {}: {e}", path.display())))
}

/// Tells at start-up, in the log, whether Redis is usable and if not why (the connections keep
/// trying in the background either way).
fn spawn_probe(store: RedisStore, timeout: Duration) {
    tokio::spawn(async move {
        match store.probe(timeout).await {
            Ok(what) => tracing::info!("Redis ready: {what}"),
            Err(e) if e.is_permanent() => tracing::error!(
                error = %e,
                "Redis refuses Portcullis: every call is answered by the failure mode until this is fixed"
            ),
            Err(e) => tracing::warn!(
                error = %e,
                "Redis not usable yet: calls are answered by the failure mode meanwhile; still trying"
            ),
        }
    });
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, StartError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Bind { addr, source })
}

fn local_addr(listener: &TcpListener, addr: SocketAddr) -> Result<SocketAddr, StartError> {
    listener
        .local_addr()
        .map_err(|source| StartError::Bind { addr, source })
}

async fn wait_for_stop(mut stopped: tokio::sync::watch::Receiver<bool>) {
    let _ = stopped.wait_for(|stop| *stop).await;
}
