//! The gRPC health of the service kept equal to readiness, so that gRPC probes and Envoy's health
//! checks see what `/readyz` says; after a drain starts it only ever says NOT_SERVING. It must
//! never touch the liveness name, which stays SERVING while the process answers.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::task::JoinHandle;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::service::admin;

/// How often readiness is worked out again for gRPC health.
const READINESS_INTERVAL: Duration = Duration::from_secs(1);

/// Keeps the gRPC health of `names` (`""`, `ratelimit`, the RLS service, the RLQS service when
/// served: `super::readiness_health_names`) equal to readiness:
/// gRPC readiness probes and Envoy health checks see what `/readyz` says. After a drain starts it
/// only ever says NOT_SERVING.
pub(super) fn spawn_readiness(
    state: admin::AdminState,
    health: HealthReporter,
    names: Vec<&'static str>,
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
            for name in &names {
                health.set_service_status(*name, status).await;
            }
        }
    })
}

/// Works out readiness once and sets the gRPC health of `names` to it (at start, before the loop
/// of `spawn_readiness` takes over).
pub(super) async fn apply_once(
    state: &admin::AdminState,
    health: &HealthReporter,
    names: &[&'static str],
) {
    let (ready, _) = admin::readiness(state).await;
    state.metrics.ready.set(i64::from(ready));
    let status = if ready {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    };
    for name in names {
        health.set_service_status(*name, status).await;
    }
}
