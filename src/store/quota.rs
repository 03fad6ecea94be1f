//! Where the RLQS grants live: for each rule shared by gateways that enforce locally, who holds
//! which part of its rate until when (`algorithm::share` decides each report). The memory table
//! here serves one replica and is the model a Redis script must match; every key and every
//! holder expires. It must never keep a holder past its grant's end, nor grow without bound.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use tokio::time::Instant;

use super::StoreError;
use crate::algorithm::share::{self, Holder, Tokens};
use crate::clock::Clock;

/// One gateway's report on one rule.
#[derive(Debug, Clone, PartialEq)]
pub struct Ask {
    /// The rule's shared budget: its counter key.
    pub key: String,
    /// The rule's rate, requests per second.
    pub capacity: f64,
    pub gateway: u64,
    /// Requests per second the gateway saw (admitted and refused).
    pub demand: f64,
    /// How long the grant stands.
    pub ttl_us: u64,
}

/// Per ask, in order: the grant (`None`: nothing this time), or why the store could not say.
pub type Grants = Vec<Result<Option<Tokens>, StoreError>>;

pub type GrantFuture<'a> = Pin<Box<dyn Future<Output = Grants> + Send + 'a>>;

/// A store of grants, shared by every replica that serves RLQS from it.
pub trait QuotaStore: Send + Sync + 'static {
    fn grant<'a>(&'a self, asks: &'a [Ask], deadline: Instant) -> GrantFuture<'a>;
    fn name(&self) -> &'static str;
}

/// The rules one replica's table holds at most; past it, a new rule is refused (until grants
/// expire) rather than the memory growing.
pub const MAX_QUOTA_KEYS: usize = 100_000;

/// Grants in this process's memory, on `clock`.
pub struct MemoryQuota {
    clock: Arc<dyn Clock>,
    table: Mutex<HashMap<String, Vec<Holder>>>,
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
        Ok(share::report(
            holders,
            ask.capacity,
            ask.gateway,
            ask.demand,
            now,
            ask.ttl_us,
        ))
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
        Box::pin(std::future::ready(grants))
    }

    fn name(&self) -> &'static str {
        "memory"
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
}
