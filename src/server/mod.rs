//! The composition root: the one place that turns `Settings` into running parts. It loads the
//! rules, builds the store and the limiter over it, binds the gRPC listener (`ShouldRateLimit`,
//! `grpc.health.v1`, optionally TLS) and the admin listener, starts the file watchers (rules,
//! certificate), and returns a handle that drains and stops all of it. The binary and the
//! end-to-end tests start the server the same way. Nothing below this floor reads `Settings`.

mod aged;
mod blind;
mod config;
mod demand;
mod grpc;
pub mod listen;
mod readiness;
pub mod reload;
mod rules_source;
mod running;
pub mod scaling;
pub mod statsd;
mod store;
pub mod tls;
mod waiting;
pub mod watch;
pub mod xds;

pub use running::Running;
use running::spawn_startup_limit;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use std::sync::atomic::AtomicBool;

use tokio::net::TcpListener;

use crate::clock::Clock;
use crate::pb::RateLimitServiceServer;
use crate::rules::RulesError;
use crate::service::admin::Routes;
use crate::service::quota::QuotaService;
use crate::service::{Decider, RlsService, admin};
use crate::settings::Settings;
use crate::store::quota::QuotaStore;
use crate::telemetry::Metrics;

/// The gRPC health service name envoyproxy/ratelimit registers; probes and Envoy health checks
/// written for it ask for this name.
pub const GO_HEALTH_SERVICE: &str = "ratelimit";

/// A gRPC health name that is SERVING for as long as the process answers: for liveness probes,
/// which must never depend on Redis or on a drain in progress. The other names (`""`,
/// `ratelimit`, the RLS service) follow readiness, as `/readyz` does.
pub const LIVENESS_HEALTH_SERVICE: &str = "portcullis.liveness";

/// The gRPC health names that follow readiness: `""`, `ratelimit`, the RLS service, and with
/// `--rlqs` the RLQS service (a probe or Envoy health check may ask for any of them).
pub fn readiness_health_names(rlqs: bool) -> Vec<&'static str> {
    use tonic::server::NamedService;
    let mut names = vec![
        "",
        GO_HEALTH_SERVICE,
        <RateLimitServiceServer<RlsService> as NamedService>::NAME,
    ];
    if rlqs {
        names.push(
            <crate::pb::rlqs::RateLimitQuotaServiceServer<QuotaService> as NamedService>::NAME,
        );
    }
    names
}

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
    // The HTTP listeners first (a busy port stops the start-up): while the first rules over xDS
    // are awaited they already answer liveness (`waiting`).
    let admin_listener = bind(settings.admin_addr).await?;
    let admin_addr = local_addr(&admin_listener, settings.admin_addr)?;
    // More HTTP listeners (Go mode: Go's PORT; Go-named metrics).
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
    let http_listeners: Vec<&TcpListener> = std::iter::once(&admin_listener)
        .chain(extra_listeners.iter().map(|(l, _)| l))
        .collect();
    let (rules, loaded_fingerprint, from_xds) =
        rules_source::start(settings, &metrics, &stopped, &mut tasks, &http_listeners).await?;

    let (limiter, quota) = store::limiter(settings, &clock, &metrics)?;
    if let Some(hot) = &quota.hot {
        tasks.push(hot.spawn_sweeper(stopped.clone()));
    }
    // Per-second limits counted apart from the claims: marked on the main Redis, so that no
    // replica serves RLQS there meanwhile (refused here where one already does).
    if let Some(what) = settings.per_second_setting() {
        blind::mark_at_start(quota.store.as_ref(), what, settings.redis_connect_timeout).await?;
        tasks.push(blind::spawn(
            quota.store.clone(),
            what,
            metrics.clone(),
            stopped.clone(),
        ));
    }
    // RLS checks count the gateways' claims in the store itself (every replica's, `store::
    // limiter`), and what they spend on held descriptors goes to the gateways' shares as RLS
    // demand, every second. Looked at once before serving, so that the first RLS checks already
    // count the claims as they should (or, where no replica serves RLQS, pay nothing for them),
    // and a replica that serves RLQS starts its flag's clock (`demand`).
    demand::first_look(quota.store.as_ref(), settings.rlqs.rlqs)
        .await
        .map_err(|e| StartError::Settings(e.to_string()))?;
    tasks.push(demand::spawn(
        demand::Keeper {
            quota: quota.store.clone(),
            tally: quota.tally.clone(),
            metrics: metrics.clone(),
            holder: rand::random::<u64>().max(1),
            serves_rlqs: settings.rlqs.rlqs,
        },
        stopped.clone(),
    ));
    let limiter = Arc::new(limiter);
    let config = settings.service_config();
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
    let grpc_addr = local_addr(&grpc_listener, settings.grpc_addr)?;

    let quota = settings.rlqs.rlqs.then(|| {
        QuotaService::new(
            decider.clone(),
            rules.clone(),
            quota.store,
            // `local`: each replica grants from its own memory while Redis is away.
            quota.fallback.map(|own| own as Arc<dyn QuotaStore>),
            metrics.clone(),
            config::quota_config(settings),
            stopped.clone(),
        )
    });
    let quota_registry = quota.as_ref().map(QuotaService::registry);
    let (health, grpc_task) = grpc::serve(
        settings,
        grpc_listener,
        decider.clone(),
        quota,
        &metrics,
        &stopped,
        &mut tasks,
    )
    .await?;

    let draining = Arc::new(AtomicBool::new(false));
    let go_mapping = config::go_mapping(settings)?;
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
        store_answered: Default::default(),
        ready_requires_first_store_answer: settings.ready_requires_first_store_answer,
        scaling: scaling_handle,
        scaling_token_file: settings.admin_scaling_token_file.clone(),
        go_mapping,
        quota: quota_registry,
    };
    let (fatal_tx, fatal) = tokio::sync::watch::channel(None);
    if let Some(limit) = settings.store_startup_limit {
        tasks.push(spawn_startup_limit(
            limit,
            admin_state.store_answered.clone(),
            fatal_tx,
            stopped.clone(),
        ));
    }
    let health_names = readiness_health_names(settings.rlqs.rlqs);
    // Readiness known before the first call: a replica whose store has not answered yet (Redis
    // away at start) is not ready from the first moment.
    readiness::apply_once(&admin_state, &health, &health_names).await;
    tasks.push(readiness::spawn_readiness(
        admin_state.clone(),
        health.clone(),
        health_names.clone(),
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
        health_names,
        draining,
        stop,
        tasks,
        fatal,
    })
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
