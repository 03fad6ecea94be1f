//! The gRPC listener: `ShouldRateLimit`, RLQS when asked for, and `grpc.health.v1` behind the connection limits and
//! keepalives the flags set, in plain TCP or TLS (the certificate watched and reloaded). It must
//! never decide anything itself: requests go to the decider it is handed.

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch::Receiver;
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::pb::RateLimitServiceServer;
use crate::pb::rlqs::RateLimitQuotaServiceServer;
use crate::service::quota::QuotaService;
use crate::service::{Decider, RlsService};
use crate::settings::Settings;
use crate::telemetry::Metrics;

use super::aged;
use super::config::tls_files;
use super::{LIVENESS_HEALTH_SERVICE, StartError, listen, tls, watch};

/// Starts serving gRPC on `grpc_listener` until `stopped`; returns the health reporter (readiness
/// and drains flip it) and the server's task. The certificate watcher, if any, joins `tasks`.
pub(super) async fn serve(
    settings: &Settings,
    grpc_listener: TcpListener,
    decider: Arc<Decider>,
    quota: Option<QuotaService>,
    metrics: &Arc<Metrics>,
    stopped: &Receiver<bool>,
    tasks: &mut Vec<JoinHandle<()>>,
) -> Result<(HealthReporter, JoinHandle<()>), StartError> {
    let (health, health_service) = tonic_health::server::health_reporter();
    for name in super::readiness_health_names(quota.is_some()) {
        health
            .set_service_status(name, ServingStatus::Serving)
            .await;
    }
    health
        .set_service_status(LIVENESS_HEALTH_SERVICE, ServingStatus::Serving)
        .await;
    let rls = RateLimitServiceServer::new(RlsService::new(decider, settings.max_in_flight))
        .max_decoding_message_size(settings.max_message_bytes);
    let mut builder = tonic::transport::Server::builder();
    if let Some(age) = settings.grpc_max_connection_age {
        builder = builder.max_connection_age(age);
    }
    // Not tonic's grace (given one, it skips the GOAWAY at the age): each connection ends at
    // age + grace by `Aged`.
    let lifetime = settings
        .grpc_max_connection_age
        .zip(settings.grpc_max_connection_age_grace)
        .map(|(age, grace)| age + grace);

    let router = builder
        .max_concurrent_streams(settings.grpc_max_concurrent_streams)
        .http2_keepalive_interval(Some(settings.grpc_keepalive_interval))
        .http2_keepalive_timeout(Some(settings.grpc_keepalive_timeout))
        .timeout(settings.grpc_request_timeout())
        .add_service(health_service)
        .add_service(rls)
        .add_optional_service(quota.map(|q| {
            RateLimitQuotaServiceServer::new(q).max_decoding_message_size(
                settings.rlqs.max_report_bytes(settings.max_message_bytes),
            )
        }));
    let grpc_stopped = super::wait_for_stop(stopped.clone());
    let grpc_task = match tls_files(settings)? {
        None => {
            let incoming = listen::tcp_incoming(grpc_listener, metrics.clone(), stopped.clone())
                .map(aged::ending(lifetime));
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
            )
            .map(aged::ending(lifetime));
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
    Ok((health, grpc_task))
}
