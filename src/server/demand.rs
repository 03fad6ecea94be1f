//! RLS beside RLQS, every second: the RLS hits the store tallied on descriptors gateways hold
//! part of go to the quota store as this replica's demand, so that the gateways' next shares
//! leave RLS its part. (What the gateways hold, RLS checks count in the store itself, from the
//! holder table: nothing is read back here.) And on a store shared by replicas, a replica that
//! serves RLQS says so, and one that does not starts counting the grants' claims when another
//! does (`QuotaStore::in_use`: a deployment without RLQS never pays for them). A failure is
//! logged (throttled) and counted. It must never block the RLS path.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::store::StoreError;
use crate::store::quota::{Ask, AskKind, IN_USE_FOR, QuotaStore, RlsTally};
use crate::telemetry::{LogThrottle, Metrics};

/// How often: RLS demand reaches the gateways' next shares within this.
pub const EVERY: Duration = Duration::from_secs(1);

/// What the task works with.
pub struct Keeper {
    pub quota: Arc<dyn QuotaStore>,
    pub tally: Arc<RlsTally>,
    pub metrics: Arc<Metrics>,
    /// This replica's RLS demand, as a holder: 64 random bits, as a stream's id.
    pub holder: u64,
    /// Whether this replica serves RLQS (it announces it; else it looks for others that do).
    pub serves_rlqs: bool,
}

/// How often a replica that does not serve RLQS looks whether another on its store does: its
/// RLS checks count the claims within this of the first such replica's start.
pub const IN_USE_POLL: u32 = 5;

impl Keeper {
    /// Every `round`: announce RLQS or look for it (the first round at once).
    async fn in_use(&self, round: u32, log: &LogThrottle) {
        let deadline = Instant::now() + EVERY;
        let every = u32::try_from(IN_USE_FOR.as_secs() / 3).unwrap_or(10).max(1);
        if self.serves_rlqs {
            if round.is_multiple_of(every)
                && let Err(error) = self.quota.announce(deadline).await
            {
                self.failed(&error, "could not say this replica serves RLQS: replicas that do not start counting the grants' claims later", log);
            }
        } else if round.is_multiple_of(IN_USE_POLL) {
            match self.quota.in_use(deadline).await {
                Ok(on) => self.quota.set_claims_counted(on),
                Err(error) => tracing::debug!(%error, "RLQS use not read; as it was"),
            }
        }
    }

    /// One round: what was tallied since `since`, pushed as demand.
    async fn once(&self, since: Instant, log: &LogThrottle) {
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
                charged: false,
                window_us: 0,
                shortest_us: 0,
                rooms: Vec::new(),
            })
            .collect();
        if asks.is_empty() {
            return;
        }
        let deadline = Instant::now() + EVERY;
        let pushed = self.quota.grant(&asks, deadline).await;
        if let Some(Err(error)) = pushed.into_iter().find(Result::is_err) {
            self.failed(&error, "could not push RLS demand to the quota store: the gateways' shares leave RLS its part a push later", log);
        }
    }

    fn failed(&self, error: &StoreError, what: &str, log: &LogThrottle) {
        self.metrics.quota.demand_errors.inc();
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
        let mut round: u32 = 0;
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = stop.wait_for(|s| *s) => break,
            }
            keeper.in_use(round, &log).await;
            round = round.wrapping_add(1);
            let started = Instant::now();
            keeper.once(since, &log).await;
            since = started;
        }
    })
}
