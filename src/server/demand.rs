//! RLS beside RLQS, every second: the RLS hits the store tallied on descriptors gateways hold
//! part of go to the quota store as this replica's demand, so that the gateways' next shares
//! leave RLS its part. (What the gateways hold, RLS checks count in the store itself, from the
//! holder table: nothing is read back here.) And on a store shared by replicas, a replica that
//! serves RLQS says so, and one that does not looks every second whether another does, its RLS
//! checks counting the grants' claims from its start until a look finds none and while one
//! does (`QuotaStore::in_use`: a deployment without RLQS never pays for them, one with it never
//! misses a claim). A failure is logged (throttled) and counted. It must never block the RLS
//! path.

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

impl Keeper {
    /// Every round: a replica that serves RLQS sets its flag at once, again every round until
    /// it is set and every `IN_USE_FOR / 3` after (for as long as its grants' claims stand); a
    /// replica that does not looks every round whether one does (its RLS checks count the
    /// claims from its start until a look finds none, and while a flag stands).
    async fn in_use(&self, round: u32, said: &mut bool, log: &LogThrottle) {
        let deadline = Instant::now() + EVERY;
        let every = u32::try_from(IN_USE_FOR.as_secs() / 3).unwrap_or(10).max(1);
        if self.serves_rlqs {
            if !*said || round.is_multiple_of(every) {
                match self.quota.announce(deadline).await {
                    Ok(_) => *said = true,
                    Err(error) => self.failed(&error, "could not say this replica serves RLQS: its grants wait until it has, and the others' RLS checks count their claims", log),
                }
            }
        } else {
            match self.quota.in_use(deadline).await {
                Ok(found) => self.quota.set_in_use(found),
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
                counters: Vec::new(),
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

/// The first look (or, serving RLQS, the first flag), within `EVERY`; a failure leaves it to
/// the task's first rounds, but a flag refused for a replica that counts apart (its mark on the
/// store, `blind`) refuses the start, naming both.
pub async fn first_look(quota: &dyn QuotaStore, serves_rlqs: bool) -> Result<(), StoreError> {
    let deadline = Instant::now() + EVERY;
    if serves_rlqs {
        if let Ok(Err(e @ StoreError::Conflict(_))) =
            tokio::time::timeout_at(deadline, quota.announce(deadline)).await
        {
            return Err(e);
        }
    } else if let Ok(Ok(found)) = tokio::time::timeout_at(deadline, quota.in_use(deadline)).await {
        quota.set_in_use(found);
    }
    Ok(())
}

/// Runs `keeper` every `EVERY` until `stop`.
pub fn spawn(keeper: Keeper, mut stop: tokio::sync::watch::Receiver<bool>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let log = LogThrottle::default();
        let mut ticker = tokio::time::interval(EVERY);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut since = Instant::now();
        let mut round: u32 = 0;
        let mut said = false;
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = stop.wait_for(|s| *s) => break,
            }
            keeper.in_use(round, &mut said, &log).await;
            round = round.wrapping_add(1);
            let started = Instant::now();
            keeper.once(since, &log).await;
            since = started;
        }
    })
}
