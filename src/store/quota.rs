//! Where the RLQS grants live: for each rule shared by gateways that enforce locally, who holds
//! which part of its rate until when (`algorithm::share` decides each report). The memory table
//! here serves one replica and is the model a Redis script must match; every key and every
//! holder expires. It must never count a holder's grant past its end, nor grow without bound.
//!
//! One budget: a grant claims, in each window of the rule, what the gateway may admit there and
//! has not reported (`algorithm::claims`); the store's RLS checks count those claims (memory:
//! `MemoryQuota::claimed`; Redis: the check script reads the same table), and each report's
//! admissions are charged into the rule's counters, where the claim then starts again.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::time::Instant;

use super::StoreError;
use crate::algorithm::claims::{self, Claim};
use crate::algorithm::key::descriptor_tag;
use crate::algorithm::share::{self, Holder, Tokens};
use crate::algorithm::{Check, Limit};
use crate::clock::Clock;

impl Ask {
    /// An ask about `gateway`'s holder on `key` that asks nothing and reports nothing: its
    /// stream's end, or its ended claim forgotten (`kind`).
    pub fn ended(key: &str, gateway: u64, kind: AskKind) -> Ask {
        Ask {
            key: key.to_owned(),
            capacity: 0.0,
            gateway,
            demand: 0.0,
            ttl_us: 0,
            kind,
            charged: false,
            window_us: 0,
            shortest_us: 0,
            rooms: Vec::new(),
            counters: Vec::new(),
        }
    }

    /// The report `algorithm::share::report` decides.
    pub fn report(&self) -> share::Report {
        share::Report {
            capacity: self.capacity,
            gateway: self.gateway,
            demand: self.demand,
            ttl_us: self.ttl_us,
            charged: self.charged,
            window_us: self.window_us,
            rooms: self.rooms.clone(),
        }
    }
}

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
    /// A report whose admissions up to now are charged into the rule's counters: the
    /// gateway's claim starts again from now (else it keeps its start: `share::report`).
    pub charged: bool,
    /// The rule's longest window: how long an ended grant still claims.
    pub window_us: u64,
    /// The rule's shortest window: what sizes the bucket a gateway is sent by default
    /// (`algorithm::share::burst_span`); the store does not read it.
    pub shortest_us: u64,
    /// What the rule's windows have left (`share::Room`; none: no bound).
    pub rooms: Vec<share::Room>,
    /// Per room, the counter key its `left` was read from (empty, or none: the room stands as
    /// given). A store that can read the counter in the grant's own step (Redis: the quota
    /// script) reads it again there, so that what was counted or charged since the room was
    /// read is not granted again.
    pub counters: Vec<String>,
}

/// What an ask does to the gateway's holder on its descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AskKind {
    /// A report: the demand recorded, the grant set (`algorithm::share::report`).
    Grant,
    /// Demand only (RLS calls on the descriptor): recorded for the others' shares, granted
    /// nothing (`algorithm::share::record_demand`).
    Demand,
    /// Its stream ended: its share freed, its claim kept until its grant ends and a window after
    /// (`algorithm::share::stream_ended`).
    StreamEnded,
    /// Its stream ended, its last grant has ended, and its claim is in the rule's counters now:
    /// its record goes (`algorithm::share::forget`; the service's `fold`).
    Forget,
}

impl AskKind {
    /// The number `lua/quota.lua` reads.
    pub fn code(self) -> u8 {
        match self {
            Self::Grant => 0,
            Self::Demand => 1,
            Self::StreamEnded => 2,
            Self::Forget => 3,
        }
    }
}

/// Per ask, in order: the grant (`None`: nothing this time), or why the store could not say.
pub type Grants = Vec<Result<Option<Tokens>, StoreError>>;

pub type GrantFuture<'a> = Pin<Box<dyn Future<Output = Grants> + Send + 'a>>;

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

    /// Says that this replica serves RLQS on this store (a store shared by replicas), for at
    /// least `IN_USE_FOR` and as long as the claims of its grants stand: every replica's RLS
    /// checks count the grants' claims meanwhile (`in_use`). Answers how long until every
    /// replica has seen it; this replica's grants wait until then (`settled`).
    fn announce(&self, _deadline: Instant) -> AnnounceFuture<'_> {
        Box::pin(std::future::ready(Ok(std::time::Duration::ZERO)))
    }

    /// How much longer a flag that a replica serves RLQS on this store stands (`None`: none
    /// does).
    fn in_use(&self, _deadline: Instant) -> InUseFuture<'_> {
        Box::pin(std::future::ready(Ok(None)))
    }

    /// What a look (`in_use`) found, for this replica's RLS checks on this store (a store whose
    /// checks always count the claims, as this replica's memory, ignores it).
    fn set_in_use(&self, _found: Option<std::time::Duration>) {}

    /// Says that this replica counts some limits where the grants' claims are not seen (`what`:
    /// the setting, as a per-second Redis), for `IN_USE_FOR`: no replica serves RLQS on this
    /// store meanwhile (`announce` is refused, naming `what`). A `Conflict`, and nothing said,
    /// when one already does. A store of one replica has nobody to tell.
    fn mark_blind<'a>(&'a self, _what: &'a str, _deadline: Instant) -> DoneFuture<'a> {
        Box::pin(std::future::ready(Ok(())))
    }

    /// Waits until this replica's grants are seen by every replica's RLS checks (its flag
    /// settled), at most until `deadline`, else says why not. A store of one replica is.
    fn settled(&self, _deadline: Instant) -> DoneFuture<'_> {
        Box::pin(std::future::ready(Ok(())))
    }
}

pub type DoneFuture<'a> = Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send + 'a>>;

pub type AnnounceFuture<'a> =
    Pin<Box<dyn Future<Output = Result<std::time::Duration, StoreError>> + Send + 'a>>;

pub type InUseFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Option<std::time::Duration>, StoreError>> + Send + 'a>>;

/// How long one announcement that a replica serves RLQS stands at least (each such replica
/// renews it every `IN_USE_FOR / 3`, and for as long as its grants' claims stand).
pub const IN_USE_FOR: std::time::Duration = std::time::Duration::from_secs(30);

/// How long after a replica first says it serves RLQS on a store every replica has seen it: each
/// looks every second (a look answered within half a second, a check sent before it was
/// answered on its way for a few milliseconds more).
pub const IN_USE_SEEN: std::time::Duration = std::time::Duration::from_millis(1_500);

/// Where a store on this replica's memory finds the gateways' claims (`MemoryQuota::claimed`)
/// for its RLS checks, and tallies their hits on the descriptors gateways hold.
#[derive(Clone)]
pub struct MemoryClaims {
    pub quota: Arc<MemoryQuota>,
    pub tally: Arc<RlsTally>,
}

impl MemoryClaims {
    /// What gateways hold of each check's counter at `now_us` (`algorithm::run_claimed` counts
    /// it); `None` when no check's is held. Refunds and slots (not a rate) count no claim; a
    /// window's post-paid charge is recorded whole and answered beside the claims, a bucket's is
    /// recorded in the frame its claims are counted in.
    pub fn claimed_by_checks(&self, checks: &[Check], now_us: u64) -> Option<Vec<Claimed>> {
        let mut held: Option<Vec<Claimed>> = None;
        for (i, check) in checks.iter().enumerate() {
            if check.refund || check.limit.algorithm == crate::algorithm::Algorithm::Concurrency {
                continue;
            }
            let Some(found) = self.quota.claims_on(&check.key, &check.limit, now_us) else {
                continue;
            };
            // Demand is what RLS asks at its checks; a cost recorded after the fact (a
            // report's charge among them) is not.
            if !check.post_paid {
                self.tally
                    .note(&check.key, check.hits, check.limit.per_second());
            }
            held.get_or_insert_with(|| vec![Claimed::default(); checks.len()])[i] = found;
        }
        held
    }
}

/// What RLQS grants hold of one counter at a check: the requests they claim of its window or
/// bucket, and until when the last of them is kept (a bucket's state is kept as long).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Claimed {
    pub claimed: u64,
    pub keep_until_us: u64,
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
    /// The table's size, read without the lock: RLS checks skip the lock while it is 0.
    keys: AtomicUsize,
    max_keys: usize,
    /// The counters its grants' rooms are read again from, in the grant's own step (the
    /// replica's memory store, when RLS counts there).
    windows: std::sync::OnceLock<std::sync::Weak<super::MemoryStore>>,
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
            windows: std::sync::OnceLock::new(),
        }
    }

    /// Its grants read their rooms' counters in `store` again, with them held, as they are made
    /// (set once; a store that has gone leaves the rooms as given).
    pub fn read_windows_from(&self, store: &Arc<super::MemoryStore>) {
        let _ = self.windows.set(Arc::downgrade(store));
    }

    /// Every ask granted at `now` on the table, each room read again by `read` when given.
    fn grant_all(
        &self,
        asks: &[Ask],
        now: u64,
        read: Option<&dyn Fn(&Check) -> crate::algorithm::Decision>,
    ) -> Grants {
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        let grants = asks
            .iter()
            .map(|ask| match read {
                Some(read) if !ask.counters.is_empty() => {
                    let ask = Ask {
                        rooms: share::look::reread(&ask.rooms, &ask.counters, ask.ttl_us, read),
                        ..ask.clone()
                    };
                    self.grant_one(&mut table, &ask, now)
                }
                _ => self.grant_one(&mut table, ask, now),
            })
            .collect();
        self.keys.store(table.len(), Ordering::Relaxed);
        grants
    }

    /// The holders `key`'s table keeps now (live grants, ended ones still claiming, RLS
    /// demand): what a model test compares a store's table with.
    pub fn holders(&self, key: &str) -> Vec<Holder> {
        let now = self.clock.now_us();
        let table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        table.get(key).map_or_else(Vec::new, |h| {
            h.iter()
                .filter(|h| h.keep_until_us > now)
                .copied()
                .collect()
        })
    }

    /// Sets `key`'s table to `holders` as given: a model test drives exact holders and clock
    /// readings through it (the Redis script reads the same records written by hand).
    pub fn put(&self, key: &str, holders: Vec<Holder>) {
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        table.insert(key.to_owned(), holders);
        self.keys.store(table.len(), Ordering::Relaxed);
    }

    fn grant_one(
        &self,
        table: &mut HashMap<String, Vec<Holder>>,
        ask: &Ask,
        now: u64,
    ) -> Result<Option<Tokens>, StoreError> {
        if matches!(ask.kind, AskKind::StreamEnded | AskKind::Forget) {
            if let Some(holders) = table.get_mut(&ask.key) {
                // Holders past their keep go, as every script call on the table drops them
                // (its own record is the script's `mine`, kept for what follows).
                holders.retain(|h| h.keep_until_us > now || (h.gateway == ask.gateway && !h.rls));
                if ask.kind == AskKind::Forget {
                    share::forget(holders, ask.gateway, now);
                } else {
                    share::stream_ended(holders, ask.gateway, now);
                }
                if holders.is_empty() {
                    table.remove(&ask.key);
                }
            }
            return Ok(None);
        }
        if !table.contains_key(&ask.key) && table.len() >= self.max_keys {
            table.retain(|_, holders| holders.iter().any(|h| h.keep_until_us > now));
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
        let grant = share::report(holders, &ask.report(), now);
        if share::is_short(holders, ask.capacity, ask.gateway, now)
            || share::is_reserving(holders, ask.gateway)
        {
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
        let keys: Vec<&str> = asks
            .iter()
            .flat_map(|a| a.counters.iter())
            .filter(|k| !k.is_empty())
            .map(String::as_str)
            .collect();
        let windows = self.windows.get().and_then(std::sync::Weak::upgrade);
        // One step: the counters' shards held, then the table (the order every check takes).
        let grants = match windows {
            Some(store) if !keys.is_empty() => {
                store.holding(&keys, now, |read| self.grant_all(asks, now, Some(read)))
            }
            _ => self.grant_all(asks, now, None),
        };
        Box::pin(std::future::ready(grants))
    }

    fn name(&self) -> &'static str {
        "memory"
    }

    fn contested(&self, _deadline: Instant) -> ContestedFuture<'_> {
        let now = self.clock.now_us();
        let mut contested = self.contested.lock().unwrap_or_else(|p| p.into_inner());
        contested.retain(|_, until| *until > now);
        Box::pin(std::future::ready(Ok(contested.keys().cloned().collect())))
    }
}

impl MemoryQuota {
    /// What gateways claim of `limit`'s window on `counter_key`'s descriptor at `now_us`, in
    /// whole requests (`algorithm::claims`); `None` when no gateway holds any of it.
    pub fn claimed(&self, counter_key: &str, limit: &Limit, now_us: u64) -> Option<u64> {
        self.claims_on(counter_key, limit, now_us)
            .map(|h| h.claimed)
    }

    /// `claimed`, with until when the last claiming holder is kept.
    pub fn claims_on(&self, counter_key: &str, limit: &Limit, now_us: u64) -> Option<Claimed> {
        if self.keys.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        let holders = table.get(descriptor_tag(counter_key))?;
        let mut keep_until_us = 0;
        let held: Vec<Claim> = holders
            .iter()
            .filter(|h| h.keep_until_us > now_us)
            .filter_map(|h| {
                let claim = h.claim()?;
                keep_until_us = keep_until_us.max(h.keep_until_us);
                Some(claim)
            })
            .collect();
        (!held.is_empty()).then(|| Claimed {
            claimed: claims::claimed(&held, limit, now_us),
            keep_until_us,
        })
    }
}

pub use super::tally::RlsTally;

#[cfg(test)]
#[path = "quota_tests.rs"]
mod tests;
