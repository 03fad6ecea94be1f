//! The HTTP listeners while the start-up waits for the first rules over xDS: bound already, so
//! that a liveness probe finds the process alive (`/healthz` answers 200) while every readiness
//! probe says why it is not ready (`/readyz` and everything else 503; Go's `/healthcheck`, which
//! the Go Deployments probe for readiness, 500 as Go answers it). It serves a clone of each
//! listener's socket and stops when the real listeners take over, so the port is never closed in
//! between. It must never answer a rate-limit call, nor say ready.

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::routing::get;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::listen;
use crate::telemetry::Metrics;

/// The waiting servers; `stop` ends them (the listeners they serve clones of stay open).
pub(super) struct Waiting {
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Waiting {
    /// Serves the waiting answers on a clone of each of `listeners`.
    pub(super) fn serve(
        listeners: &[&TcpListener],
        why: String,
        metrics: &Arc<Metrics>,
    ) -> std::io::Result<Waiting> {
        let (stop, stopped) = watch::channel(false);
        let why = Arc::new(format!("not ready: {why}\n"));
        let go_why = why.clone();
        let router = axum::Router::new()
            .route("/healthz", get(|| async { "alive\n" }))
            .route(
                "/healthcheck",
                get(move || {
                    let why = go_why.clone();
                    async move { (StatusCode::INTERNAL_SERVER_ERROR, why.to_string()) }
                }),
            )
            .fallback(move || {
                let why = why.clone();
                async move { (StatusCode::SERVICE_UNAVAILABLE, why.to_string()) }
            });
        let mut tasks = Vec::new();
        for listener in listeners {
            tasks.push(tokio::spawn(listen::serve_http(
                clone(listener)?,
                router.clone(),
                Duration::from_secs(5),
                Duration::from_secs(1),
                metrics.clone(),
                stopped.clone(),
            )));
        }
        Ok(Waiting { stop, tasks })
    }

    /// Stops serving and waits for the waiting servers to finish their connections.
    pub(super) async fn end(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

/// A second handle on the same listening socket.
fn clone(listener: &TcpListener) -> std::io::Result<TcpListener> {
    use std::os::fd::AsFd;
    let fd = listener.as_fd().try_clone_to_owned()?;
    let std_listener = std::net::TcpListener::from(fd);
    std_listener.set_nonblocking(true)?;
    TcpListener::from_std(std_listener)
}
