//! A replica that counts some limits where the RLQS grants' claims are not seen (a per-second
//! Redis) marks the shared Redis for as long as it runs, so that no replica serves RLQS on it
//! meanwhile (their flag is refused while the mark stands), and is refused at start where one
//! already does: both would spend one second's budget twice. One script call decides between a
//! mark and a flag, so of two replicas started at once exactly one is refused. It must never let
//! such a replica start where it has seen RLQS served, nor block the RLS path.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::StartError;
use crate::store::StoreError;
use crate::store::quota::{IN_USE_FOR, QuotaStore};
use crate::telemetry::{LogThrottle, Metrics};

/// How often the mark is set again (it stands `IN_USE_FOR`: two rounds may fail).
const EVERY: Duration = Duration::from_secs(IN_USE_FOR.as_secs() / 3);

/// At start: the mark set, or the start refused where a replica serves RLQS (the error names
/// both). A Redis that does not answer within `wait` leaves it to the rounds (logged): the
/// replicas serving RLQS cannot set their flag over the mark either way.
pub async fn mark_at_start(
    quota: &dyn QuotaStore,
    what: &str,
    wait: Duration,
) -> Result<(), StartError> {
    match mark(quota, what, wait).await {
        Ok(()) => Ok(()),
        Err(e @ StoreError::Conflict(_)) => Err(StartError::Settings(e.to_string())),
        Err(e) => {
            tracing::warn!(error = %e, "could not mark the Redis as used by a replica with {what} yet: trying every {EVERY:?}");
            Ok(())
        }
    }
}

/// One mark, answered within `wait` (else a timeout).
async fn mark(quota: &dyn QuotaStore, what: &str, wait: Duration) -> Result<(), StoreError> {
    let deadline = Instant::now() + wait;
    tokio::time::timeout_at(deadline, quota.mark_blind(what, deadline))
        .await
        .unwrap_or(Err(StoreError::Timeout(wait)))
}

/// Sets the mark again every `EVERY` until `stop`. A replica serving RLQS found then (the mark
/// had lapsed through an outage longer than `IN_USE_FOR`) is logged as an error and counted:
/// this replica's per-second limits may then pass what the gateways were granted.
pub fn spawn(
    quota: Arc<dyn QuotaStore>,
    what: &'static str,
    metrics: Arc<Metrics>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let log = LogThrottle::default();
        let mut ticker = tokio::time::interval(EVERY);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = stop.wait_for(|s| *s) => break,
            }
            let Err(error) = mark(quota.as_ref(), what, EVERY / 2).await else {
                continue;
            };
            metrics.quota.demand_errors.inc();
            if let Some(skipped) = log.allow() {
                if matches!(error, StoreError::Conflict(_)) {
                    tracing::error!(%error, skipped, "a replica serves RLQS beside this one's {what}");
                } else {
                    tracing::warn!(%error, skipped, "could not mark the Redis as used by a replica with {what}");
                }
            }
        }
    })
}
