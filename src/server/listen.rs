//! Accepting connections, for every listener (gRPC plain and TLS, admin HTTP): one loop that
//! backs off when `accept` fails and stops accepting (closing the port) when told to. Why not
//! tonic's or axum's own loops: on EMFILE (out of file descriptors) they retry at once, burning a
//! core while the condition lasts, and the admin one reads headers with no deadline. This module
//! must never retry a failed accept without waiting, nor keep a connection whose headers never
//! come.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

use crate::telemetry::{ListenerLabels, LogThrottle, Metrics};

/// First wait after a failed accept; doubled on each failure in a row, up to `MAX_BACKOFF`.
const MIN_BACKOFF: Duration = Duration::from_millis(5);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Accepts until `stop` turns true (or `handle` answers false), handing each connection to
/// `handle`. A failed accept is counted, logged (at most once a second) and followed by a wait
/// that doubles while failures go on; a success resets it.
pub async fn accept_loop<F, Fut>(
    listener: TcpListener,
    name: &'static str,
    metrics: Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
    mut handle: F,
) where
    F: FnMut(TcpStream, SocketAddr) -> Fut,
    Fut: Future<Output = bool>,
{
    let throttle = LogThrottle::default();
    let mut backoff = MIN_BACKOFF;
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.wait_for(|s| *s) => break,
        };
        match accepted {
            Ok((tcp, peer)) => {
                backoff = MIN_BACKOFF;
                if !handle(tcp, peer).await {
                    break;
                }
            }
            Err(error) => {
                metrics
                    .accept_errors
                    .get_or_create(&ListenerLabels {
                        listener: name.into(),
                    })
                    .inc();
                if let Some(skipped) = throttle.allow() {
                    tracing::warn!(
                        listener = name,
                        %error,
                        ?backoff,
                        similar_errors_not_logged = skipped,
                        "cannot accept connections; waiting before the next try"
                    );
                }
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = stop.wait_for(|s| *s) => break,
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

/// Plain TCP connections for tonic, with TCP_NODELAY (a decision is a few hundred bytes; Nagle
/// would hold it back for the previous one's ACK).
pub fn tcp_incoming(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    stop: watch::Receiver<bool>,
) -> ReceiverStream<std::io::Result<TcpStream>> {
    let (sender, receiver) = mpsc::channel(64);
    tokio::spawn(accept_loop(
        listener,
        "grpc",
        metrics,
        stop,
        move |tcp, _peer| {
            let sender = sender.clone();
            async move {
                let _ = tcp.set_nodelay(true);
                sender.send(Ok(tcp)).await.is_ok()
            }
        },
    ));
    ReceiverStream::new(receiver)
}

/// Serves `router` over HTTP/1.1 until `stop`, closing connections whose request headers do not
/// arrive within `header_timeout` (hyper also applies it to the wait for the next request on a
/// kept-alive connection). After `stop`, requests in flight get `grace` to finish.
pub async fn serve_http(
    listener: TcpListener,
    router: axum::Router,
    header_timeout: Duration,
    grace: Duration,
    metrics: Arc<Metrics>,
    stop: watch::Receiver<bool>,
) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use hyper_util::server::graceful::GracefulShutdown;
    use hyper_util::service::TowerToHyperService;

    let graceful = GracefulShutdown::new();
    accept_loop(listener, "admin", metrics, stop, |tcp, peer| {
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(header_timeout)
            .serve_connection(TokioIo::new(tcp), TowerToHyperService::new(router.clone()));
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%peer, %error, "admin connection ended");
            }
        });
        std::future::ready(true)
    })
    .await;
    if tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::debug!("admin connections still open after the grace period: closed");
    }
}
