//! A server once started: what `start` hands back (its addresses, metrics, health), the drain
//! and stop, and the one reason it may have to stop by itself (the store unanswered past Go's
//! REDIS_STARTUP_MAX_ELAPSED_TIME). It must never stop accepting before health says NOT_SERVING.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::task::JoinHandle;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::telemetry::Metrics;

/// A running server; dropping it does not stop it, `drain` or `shutdown` does.
pub struct Running {
    pub grpc_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    /// The more HTTP listeners' addresses, in the order of `Settings::http_listeners`, then the
    /// Go-named metrics listener.
    pub http_addrs: Vec<SocketAddr>,
    pub metrics: Arc<Metrics>,
    pub(super) health: HealthReporter,
    /// The names `health` reports readiness under.
    pub(super) health_names: Vec<&'static str>,
    pub(super) draining: Arc<AtomicBool>,
    pub(super) stop: tokio::sync::watch::Sender<bool>,
    pub(super) tasks: Vec<JoinHandle<()>>,
    /// Why the process must stop, once it must (the store unanswered past
    /// `Settings::store_startup_limit`).
    pub(super) fatal: tokio::sync::watch::Receiver<Option<String>>,
}

impl Running {
    /// Waits until the server cannot go on (never, unless a start-up limit is set and passes);
    /// says why. The caller stops the process (`main` exits non-zero).
    pub async fn fatal(&mut self) -> String {
        match self.fatal.wait_for(Option::is_some).await {
            Ok(reason) => reason.clone().unwrap_or_default(),
            // The sender lives as long as its task: gone means stopping already.
            Err(_) => std::future::pending().await,
        }
    }

    /// Graceful stop: report NOT_SERVING (gRPC health and `/readyz`) so that load balancers and
    /// Envoy move away, keep answering for `period`, then stop accepting, let in-flight calls
    /// finish, and return.
    pub async fn drain(self, period: Duration) {
        tracing::info!(?period, "draining: health reports NOT_SERVING");
        self.draining.store(true, Ordering::Relaxed);
        for name in &self.health_names {
            self.health
                .set_service_status(*name, ServingStatus::NotServing)
                .await;
        }
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

/// Go's REDIS_STARTUP_MAX_ELAPSED_TIME: when the store has not answered once within `limit`,
/// tell `fatal` (the process then exits, as the Go service does, and Kubernetes restarts it).
pub(super) fn spawn_startup_limit(
    limit: Duration,
    answered: Arc<AtomicBool>,
    fatal: tokio::sync::watch::Sender<Option<String>>,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        tokio::select! {
            () = tokio::time::sleep(limit) => {}
            _ = stopped.wait_for(|s| *s) => return,
        }
        if !answered.load(Ordering::Relaxed) {
            let reason = format!(
                "the store did not answer within REDIS_STARTUP_MAX_ELAPSED_TIME ({limit:?}) of the \
                 start"
            );
            tracing::error!("{reason}: stopping");
            let _ = fatal.send(Some(reason));
        }
        // Held until the stop, so that `Running::fatal` keeps waiting rather than ending.
        let _ = stopped.wait_for(|s| *s).await;
    })
}
