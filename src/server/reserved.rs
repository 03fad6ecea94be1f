//! RLS beside RLQS, kept current every second: the RLS hits tallied on descriptors gateways hold
//! part of go to the quota store as this replica's demand (the gateways' next shares leave RLS
//! its part), and, on a store shared by replicas, the index of what grants hold is read back
//! into this replica's cache. A failure is logged (throttled) and counted, and the last read
//! stays in force: a grant never vanishes from RLS' view because Redis hiccuped. It must never
//! block the RLS path.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::store::StoreError;
use crate::store::quota::{Ask, AskKind, QuotaStore, ReservedCache, RlsTally};
use crate::telemetry::{LogThrottle, Metrics};

/// How often: a grant made on another replica is counted by this one's RLS calls within this,
/// and RLS demand reaches the gateways' next shares within this.
pub const EVERY: Duration = Duration::from_secs(1);

/// What the task works with.
pub struct Keeper {
    pub quota: Arc<dyn QuotaStore>,
    /// `None` on one replica's memory, which the RLS path reads directly.
    pub cache: Option<Arc<ReservedCache>>,
    pub tally: Arc<RlsTally>,
    pub metrics: Arc<Metrics>,
    /// This replica's RLS demand, as a holder: 64 random bits, as a stream's id.
    pub holder: u64,
    /// Whether this replica serves RLQS: then a failed read is always worth a log line.
    pub serves_rlqs: bool,
}

impl Keeper {
    /// One round; `in_use` says whether RLQS is in use as far as this replica knows (it serves
    /// it, or the last read found grants): only then is a failed read logged at warning level, so
    /// that a store outage where nobody uses RLQS says nothing about RLQS.
    async fn once(&self, since: Instant, log: &LogThrottle, in_use: &mut bool) {
        let elapsed = since.elapsed().as_secs_f64().max(0.001);
        let asks: Vec<Ask> = self
            .tally
            .take()
            .into_iter()
            .map(|(key, hits, capacity)| Ask {
                key,
                capacity,
                gateway: self.holder,
                demand: hits as f64 / elapsed,
                // Live until two pushes are missed.
                ttl_us: 3 * EVERY.as_micros() as u64,
                kind: AskKind::Demand,
            })
            .collect();
        let deadline = Instant::now() + EVERY;
        if !asks.is_empty() {
            let pushed = self.quota.grant(&asks, deadline).await;
            if let Some(Err(error)) = pushed.into_iter().find(Result::is_err) {
                self.failed(&error, "could not push RLS demand to the quota store", log);
            }
        }
        // Read on every store for the gauge; kept only where RLS reads a copy (a shared store).
        match self.quota.reservations(deadline).await {
            Ok(held) => {
                *in_use = self.serves_rlqs || !held.is_empty();
                let count = i64::try_from(held.len()).unwrap_or(i64::MAX);
                self.metrics.quota.reserved_descriptors.set(count);
                if let Some(cache) = &self.cache {
                    cache.replace(held);
                }
            }
            Err(error) if *in_use => self.failed(
                &error,
                "could not read the RLQS reservations; RLS counts against the last read",
                log,
            ),
            Err(error) => {
                self.metrics.quota.reserved_errors.inc();
                tracing::debug!(%error, "RLQS reservations not read (no grant seen)");
            }
        }
    }

    fn failed(&self, error: &StoreError, what: &str, log: &LogThrottle) {
        self.metrics.quota.reserved_errors.inc();
        if let Some(skipped) = log.allow() {
            tracing::warn!(%error, skipped, "{what}");
        }
    }
}

/// Runs `keeper` every `EVERY` until `stop`.
pub fn spawn(keeper: Keeper, mut stop: tokio::sync::watch::Receiver<bool>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let log = LogThrottle::default();
        let mut ticker = tokio::time::interval(EVERY);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut since = Instant::now();
        let mut in_use = keeper.serves_rlqs;
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = stop.wait_for(|s| *s) => break,
            }
            let started = Instant::now();
            keeper.once(since, &log, &mut in_use).await;
            since = started;
        }
    })
}
