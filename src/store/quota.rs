//! Where the RLQS grants live: for each rule shared by gateways that enforce locally, who holds
//! which part of its rate until when (`algorithm::share` decides each report). The memory table
//! here serves one replica and is the model a Redis script must match; every key and every
//! holder expires. It must never keep a holder past its grant's end, nor grow without bound.
//!
//! Grants are reservations: RLS checks on a descriptor that gateways hold part of count against
//! what is left (`Reserved`, read on the RLS path; `algorithm::reserve`).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use tokio::time::Instant;

use super::StoreError;
use crate::algorithm::key::descriptor_tag;
use crate::algorithm::share::{self, Holder, Tokens};
use crate::clock::Clock;

/// One gateway's report on one rule.
#[derive(Debug, Clone, PartialEq)]
pub struct Ask {
    /// The shared budget: the descriptor's hash tag (`algorithm::key::descriptor_tag`), which
    /// every layer's counter key of the descriptor starts with.
    pub key: String,
    /// The rule's rate, requests per second.
    pub capacity: f64,
    pub gateway: u64,
    /// Requests per second the gateway saw (admitted and refused).
    pub demand: f64,
    /// How long the grant stands.
    pub ttl_us: u64,
    /// What the ask is for.
    pub kind: AskKind,
}

/// What an ask does to the gateway's holder on its descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AskKind {
    /// A report: the demand recorded, the grant set (`algorithm::share::report`).
    Grant,
    /// Demand only (RLS calls on the descriptor): recorded for the others' shares, granted
    /// nothing (`algorithm::share::record_demand`).
    Demand,
    /// The holder taken off (its stream ended): granted nothing (`algorithm::share::release`).
    Release,
}

impl AskKind {
    /// The number `lua/quota.lua` reads.
    pub fn code(self) -> u8 {
        match self {
            Self::Grant => 0,
            Self::Demand => 1,
            Self::Release => 2,
        }
    }
}

/// Per ask, in order: the grant (`None`: nothing this time), or why the store could not say.
pub type Grants = Vec<Result<Option<Tokens>, StoreError>>;

pub type GrantFuture<'a> = Pin<Box<dyn Future<Output = Grants> + Send + 'a>>;

/// Per descriptor tag, the requests per second its live grants hold.
pub type Reservations = HashMap<String, f64>;

pub type ReservationsFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Reservations, StoreError>> + Send + 'a>>;

pub type ContestedFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Vec<String>, StoreError>> + Send + 'a>>;

/// How long a descriptor stays contested after a gateway found itself short on it: the
/// replicas re-ask their streams' holds on it meanwhile (every `service::quota` push round).
pub const CONTESTED_US: u64 = 2_000_000;

/// The most contested descriptors kept (and read back) at once.
pub const MAX_CONTESTED: usize = 1_000;

/// A store of grants, shared by every replica that serves RLQS from it.
pub trait QuotaStore: Send + Sync + 'static {
    fn grant<'a>(&'a self, asks: &'a [Ask], deadline: Instant) -> GrantFuture<'a>;
    fn name(&self) -> &'static str;

    /// The descriptors on which a gateway was short of its fair share within the last
    /// `CONTESTED_US` (others held it): every replica re-asks its streams' holds on them, so
    /// that those which must shrink are pushed their smaller grants at once, instead of at
    /// their next report.
    fn contested(&self, _deadline: Instant) -> ContestedFuture<'_> {
        Box::pin(std::future::ready(Ok(Vec::new())))
    }

    /// Every descriptor some gateway holds part of, with what its live grants hold: what the
    /// replicas' RLS paths read back (a store shared by replicas keeps them in one index).
    fn reservations(&self, _deadline: Instant) -> ReservationsFuture<'_> {
        Box::pin(std::future::ready(Ok(Reservations::new())))
    }
}

/// What the RLS path reads: the requests per second gateways hold on a counter's descriptor.
pub trait Reserved: Send + Sync + 'static {
    /// 0 when no gateway holds any part of it.
    fn reserved(&self, counter_key: &str) -> f64;

    /// Every descriptor held, as RLS sees it now (for `GET /rlqs`).
    fn listed(&self) -> Reservations;
}

/// What several sources of grants hold together (a shared store's index and, under
/// `--failure-mode local`, the replica's own grants made while the store was away).
pub struct ReservedSum(pub Vec<Arc<dyn Reserved>>);

impl Reserved for ReservedSum {
    fn reserved(&self, counter_key: &str) -> f64 {
        self.0.iter().map(|r| r.reserved(counter_key)).sum()
    }

    fn listed(&self) -> Reservations {
        let mut all = Reservations::new();
        for part in &self.0 {
            for (tag, held) in part.listed() {
                *all.entry(tag).or_default() += held;
            }
        }
        all
    }
}

/// RLS hits on descriptors gateways hold part of, tallied between two pushes to the quota store
/// as demand-only asks, so that the gateways' fair shares leave RLS its part. Bounded: a
/// descriptor past `MAX_QUOTA_KEYS` is not tallied until the next push.
#[derive(Default)]
pub struct RlsTally {
    /// Per descriptor tag: hits seen, the descriptor's rate (requests per second).
    map: Mutex<HashMap<String, (u64, f64)>>,
}

impl RlsTally {
    pub fn note(&self, counter_key: &str, hits: u64, capacity: f64) {
        let tag = descriptor_tag(counter_key);
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = map.get_mut(tag) {
            entry.0 = entry.0.saturating_add(hits);
            entry.1 = capacity;
        } else if map.len() < MAX_QUOTA_KEYS {
            map.insert(tag.to_owned(), (hits, capacity));
        }
    }

    /// Everything tallied since the last take: (tag, hits, rate).
    pub fn take(&self) -> Vec<(String, u64, f64)> {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        map.drain()
            .map(|(tag, (hits, rate))| (tag, hits, rate))
            .collect()
    }
}

/// The reservations of a store shared by replicas, as last read back (`QuotaStore::reservations`,
/// every second): a grant made on another replica is seen here within that read's period.
#[derive(Default)]
pub struct ReservedCache {
    map: ArcSwap<Reservations>,
}

impl ReservedCache {
    pub fn replace(&self, reservations: Reservations) {
        self.map.store(Arc::new(reservations));
    }
}

impl Reserved for ReservedCache {
    fn reserved(&self, counter_key: &str) -> f64 {
        let map = self.map.load();
        if map.is_empty() {
            return 0.0;
        }
        map.get(descriptor_tag(counter_key)).copied().unwrap_or(0.0)
    }

    fn listed(&self) -> Reservations {
        Reservations::clone(&self.map.load())
    }
}

/// The rules one replica's table holds at most; past it, a new rule is refused (until grants
/// expire) rather than the memory growing.
pub const MAX_QUOTA_KEYS: usize = 100_000;

/// Grants in this process's memory, on `clock`.
pub struct MemoryQuota {
    clock: Arc<dyn Clock>,
    table: Mutex<HashMap<String, Vec<Holder>>>,
    /// Descriptor → until when it is contested (µs, the store's clock).
    contested: Mutex<HashMap<String, u64>>,
    /// The table's size, read without the lock: the RLS path skips the lock while it is 0.
    keys: AtomicUsize,
    max_keys: usize,
}

impl MemoryQuota {
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self::with_max_keys(clock, MAX_QUOTA_KEYS)
    }

    pub fn with_max_keys(clock: Arc<dyn Clock>, max_keys: usize) -> Self {
        Self {
            clock,
            table: Mutex::new(HashMap::new()),
            contested: Mutex::new(HashMap::new()),
            keys: AtomicUsize::new(0),
            max_keys,
        }
    }

    /// The holders of `key` whose grants are live now (for the tests: `/rlqs` lists what a
    /// replica assigned, which works on every store).
    #[cfg(test)]
    fn holders(&self, key: &str) -> Vec<Holder> {
        let now = self.clock.now_us();
        let table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        table.get(key).map_or_else(Vec::new, |h| {
            h.iter().filter(|h| h.expires_us > now).copied().collect()
        })
    }

    fn grant_one(
        &self,
        table: &mut HashMap<String, Vec<Holder>>,
        ask: &Ask,
        now: u64,
    ) -> Result<Option<Tokens>, StoreError> {
        if ask.kind == AskKind::Release {
            if let Some(holders) = table.get_mut(&ask.key) {
                share::release(holders, ask.gateway);
                if holders.is_empty() {
                    table.remove(&ask.key);
                }
            }
            return Ok(None);
        }
        if !table.contains_key(&ask.key) && table.len() >= self.max_keys {
            table.retain(|_, holders| holders.iter().any(|h| h.expires_us > now));
            if table.len() >= self.max_keys {
                return Err(StoreError::Unavailable(format!(
                    "the quota table holds {} rules already",
                    self.max_keys
                )));
            }
        }
        let holders = table.entry(ask.key.clone()).or_default();
        if ask.kind == AskKind::Demand {
            share::record_demand(holders, ask.gateway, ask.demand, now, ask.ttl_us);
            return Ok(None);
        }
        let grant = share::report(
            holders,
            ask.capacity,
            ask.gateway,
            ask.demand,
            now,
            ask.ttl_us,
        );
        if share::is_short(holders, ask.capacity, ask.gateway) {
            let mut contested = self.contested.lock().unwrap_or_else(|p| p.into_inner());
            contested.retain(|_, until| *until > now);
            if contested.len() < MAX_CONTESTED || contested.contains_key(&ask.key) {
                contested.insert(ask.key.clone(), now + CONTESTED_US);
            }
        }
        Ok(grant)
    }
}

impl QuotaStore for MemoryQuota {
    fn grant<'a>(&'a self, asks: &'a [Ask], _deadline: Instant) -> GrantFuture<'a> {
        let now = self.clock.now_us();
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        let grants = asks
            .iter()
            .map(|ask| self.grant_one(&mut table, ask, now))
            .collect();
        self.keys.store(table.len(), Ordering::Relaxed);
        Box::pin(std::future::ready(grants))
    }

    fn name(&self) -> &'static str {
        "memory"
    }

    fn reservations(&self, _deadline: Instant) -> ReservationsFuture<'_> {
        Box::pin(std::future::ready(Ok(self.listed())))
    }

    fn contested(&self, _deadline: Instant) -> ContestedFuture<'_> {
        let now = self.clock.now_us();
        let mut contested = self.contested.lock().unwrap_or_else(|p| p.into_inner());
        contested.retain(|_, until| *until > now);
        Box::pin(std::future::ready(Ok(contested.keys().cloned().collect())))
    }
}

/// What the live grants among `holders` hold, per second.
fn live_total(holders: &[Holder], now: u64) -> f64 {
    holders
        .iter()
        .filter(|h| h.expires_us > now)
        .map(|h| h.granted)
        .sum()
}

/// One replica's own table, read at once: exact.
impl Reserved for MemoryQuota {
    fn reserved(&self, counter_key: &str) -> f64 {
        if self.keys.load(Ordering::Relaxed) == 0 {
            return 0.0;
        }
        let now = self.clock.now_us();
        let table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        table
            .get(descriptor_tag(counter_key))
            .map_or(0.0, |holders| live_total(holders, now))
    }

    fn listed(&self) -> Reservations {
        let now = self.clock.now_us();
        let table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        table
            .iter()
            .map(|(tag, holders)| (tag.clone(), live_total(holders, now)))
            .filter(|(_, rate)| *rate > 0.0)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    fn ask(key: &str, gateway: u64, demand: f64) -> Ask {
        Ask {
            key: key.into(),
            capacity: 10.0,
            gateway,
            demand,
            ttl_us: 3_000_000,
            kind: AskKind::Grant,
        }
    }

    #[tokio::test]
    async fn a_full_table_refuses_new_rules_until_grants_expire() {
        let clock = ManualClock::new(1_000_000);
        let quota = MemoryQuota::with_max_keys(Arc::new(clock.clone()), 2);
        let far = Instant::now() + std::time::Duration::from_secs(1);
        let asks = [ask("a", 1, 5.0), ask("b", 1, 5.0), ask("c", 1, 5.0)];
        let grants = quota.grant(&asks, far).await;
        assert!(grants[0].as_ref().unwrap().is_some());
        assert!(grants[1].as_ref().unwrap().is_some());
        assert!(
            matches!(grants[2], Err(StoreError::Unavailable(_))),
            "{grants:?}"
        );
        // Once a and b have expired, c gets its place.
        clock.advance_us(3_000_001);
        let grants = quota.grant(&asks[2..], far).await;
        assert_eq!(grants[0].as_ref().unwrap().unwrap().per_second(), 10.0);
        assert!(quota.holders("a").is_empty());
    }

    #[tokio::test]
    async fn what_live_grants_hold_is_reserved_for_every_layer_until_they_expire() {
        let clock = ManualClock::new(1_000_000);
        let quota = MemoryQuota::new(Arc::new(clock.clone()));
        let far = Instant::now() + std::time::Duration::from_secs(1);
        let second = "{edge|tenant=a}:fw:1000000us";
        let minute = "{edge|tenant=a}:sw60:60000000us";
        assert_eq!(quota.reserved(second), 0.0);
        let grants = quota.grant(&[ask("{edge|tenant=a}", 1, 30.0)], far).await;
        assert_eq!(grants[0].as_ref().unwrap().unwrap().per_second(), 10.0);
        assert_eq!(
            (quota.reserved(second), quota.reserved(minute)),
            (10.0, 10.0)
        );
        assert_eq!(quota.reserved("{edge|tenant=b}:fw:1000000us"), 0.0);
        // RLS demand asks, and holds nothing.
        let rls = Ask {
            kind: AskKind::Demand,
            ..ask("{edge|tenant=a}", 7, 5.0)
        };
        assert_eq!(quota.grant(&[rls], far).await[0], Ok(None));
        assert_eq!(quota.reserved(second), 10.0);
        let read = quota.reservations(far).await.unwrap();
        assert_eq!(read.get("{edge|tenant=a}"), Some(&10.0));
        // The gateway gone: its grant reserves until it expires, then nothing.
        clock.advance_us(3_000_001);
        assert_eq!(quota.reserved(second), 0.0);
        assert!(quota.reservations(far).await.unwrap().is_empty());
    }
}
