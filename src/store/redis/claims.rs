//! The RLQS grants' claims on the Redis decision path: a store whose RLS checks count them
//! sends those charges under their own operation (`script::count_claims`), and reads the claim
//! the script counted back off the reply, so that the decision is the one of the limit it was
//! made on. Counting costs a read of the descriptor's holder table per check: a replica counts
//! when it serves RLQS, and a replica that does not counts from its start until it has looked
//! and found no replica serving RLQS on its Redis, and whenever one does, for as long as the
//! flag stands (`QuotaStore::in_use`: as long as the claims it covers), so that a deployment
//! without RLQS pays nothing and one with it never misses a claim: a replica that serves RLQS
//! grants nothing until its flag has stood long enough for every replica to have looked
//! (`settled`). It must never turn a reply it cannot read into a decision, nor read a reply as
//! encoded otherwise than it was.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

use super::{RedisStore, script};
use crate::algorithm::{Check, Decision, zero_limit_decision};
use crate::store::StoreError;
use crate::store::quota::RlsTally;

/// Whether a store's RLS checks count the claims, shared by its clones (the limiter's and the
/// quota store's are one store); times are milliseconds from `base` (0: never).
pub(super) struct ClaimsSwitch {
    tally: OnceLock<Arc<RlsTally>>,
    base: Instant,
    /// This replica serves RLQS: its checks always count.
    serves: AtomicBool,
    /// Until when its checks count (`u64::MAX`: until it has looked).
    until_ms: AtomicU64,
    /// It has looked at least once.
    looked: AtomicBool,
    /// When this replica's grants are seen by every replica (its flag settled); 0: not yet said.
    settled_ms: AtomicU64,
    /// Until when the claims of its grants may stand (what its flag must outlive).
    claims_until_ms: AtomicU64,
    /// Until when its flag stands, as its last setting asked.
    flag_until_ms: AtomicU64,
}

impl Default for ClaimsSwitch {
    fn default() -> Self {
        Self {
            tally: OnceLock::new(),
            base: Instant::now(),
            serves: AtomicBool::new(false),
            until_ms: AtomicU64::new(u64::MAX),
            looked: AtomicBool::new(false),
            settled_ms: AtomicU64::new(0),
            claims_until_ms: AtomicU64::new(0),
            flag_until_ms: AtomicU64::new(0),
        }
    }
}

impl ClaimsSwitch {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn after(&self, wait: Duration) -> u64 {
        self.now_ms()
            .saturating_add(u64::try_from(wait.as_millis()).unwrap_or(u64::MAX))
            .max(1)
    }
}

impl RedisStore {
    /// Whether a call sent now counts the claims (read once per call: its encoding and its
    /// reply's reading must agree).
    pub(super) fn counting_claims(&self) -> bool {
        let switch = &self.claims;
        switch.tally.get().is_some()
            && (switch.serves.load(Ordering::Relaxed)
                || match switch.until_ms.load(Ordering::Relaxed) {
                    0 => false,
                    u64::MAX => true,
                    until => until > switch.now_ms(),
                })
    }

    /// `check`'s decision from its numbers; `counted`: the call counted the claims, so a charge
    /// that counts them (`script::counts_claims`) has one more number, what they claimed (its
    /// limit less that is what it was decided on), and its hits on a claimed descriptor are
    /// tallied as RLS demand.
    pub(super) fn decide(
        &self,
        check: &Check,
        mut reply: Vec<u64>,
        charged: bool,
        counted: bool,
    ) -> Result<Decision, StoreError> {
        let tally = self.claims.tally.get();
        let (Some(tally), true) = (tally, counted && script::counts_claims(check)) else {
            return script::decision(check, &reply, charged);
        };
        let held = reply
            .pop()
            .ok_or_else(|| StoreError::Protocol("a claims reply without its claim".into()))?;
        if held == 0 {
            return script::decision(check, &reply, charged);
        }
        // Demand is what RLS asks at its checks; a report's charge (post-paid, on a replica that
        // serves RLQS) is not. On one that does not, a post-paid charge is RLS's own: the Go
        // drop-in mode's every call, a cost recorded after the fact.
        if !check.post_paid || !self.claims.serves.load(Ordering::Relaxed) {
            tally.note(&check.key, check.hits, check.limit.per_second());
        }
        // A bucket's reply is the bucket as the claims leave it (`check_claimed`): read at its
        // own limit.
        if check.limit.algorithm == crate::algorithm::Algorithm::TokenBucket {
            return script::decision(check, &reply, charged);
        }
        let limit = crate::algorithm::claims::less(&check.limit, held - 1);
        if limit.requests == 0 {
            return Ok(zero_limit_decision(check.hits));
        }
        let check = Check {
            limit,
            ..check.clone()
        };
        script::decision(&check, &reply, charged)
    }

    /// Its RLS charges tally their hits on claimed descriptors in `tally`, and count the RLQS
    /// grants' claims: always when `serves` (this replica serves RLQS), else as `set_in_use`
    /// says (and until it first has).
    pub fn count_claims(&self, tally: Arc<RlsTally>, serves: bool) {
        let _ = self.claims.tally.set(tally);
        self.claims.serves.store(serves, Ordering::Relaxed);
    }

    /// What a look for replicas serving RLQS found: `Some(stand)`, their flag stands that much
    /// longer (its claims may: count them until then at least); `None`, no flag: stop counting,
    /// unless a flag seen before still stands (a flag lost with a failed-over master does not
    /// end the claims it covered).
    pub fn set_in_use(&self, found: Option<Duration>) {
        let switch = &self.claims;
        let first = !switch.looked.swap(true, Ordering::Relaxed);
        match found {
            Some(stand) => {
                let until = switch.after(stand);
                if first {
                    switch.until_ms.store(until, Ordering::Relaxed);
                } else {
                    switch.until_ms.fetch_max(until, Ordering::Relaxed);
                }
            }
            None if first => switch.until_ms.store(0, Ordering::Relaxed),
            None => {}
        }
    }

    /// This replica's flag is set to stand `stand`; every replica has seen it `settled_in`
    /// from now.
    pub fn announced(&self, stand: Duration, settled_in: Duration) {
        let switch = &self.claims;
        switch
            .settled_ms
            .store(switch.after(settled_in), Ordering::Relaxed);
        switch
            .flag_until_ms
            .fetch_max(switch.after(stand), Ordering::Relaxed);
    }

    /// How long this replica's flag must stand from now: `margin` past the last claim of its
    /// grants (the margin spares setting it again at every grant).
    pub fn claims_stand(&self, margin: Duration) -> Duration {
        let switch = &self.claims;
        let left = switch
            .claims_until_ms
            .load(Ordering::Relaxed)
            .saturating_sub(switch.now_ms());
        margin + Duration::from_millis(left)
    }

    /// Whether the claims of its grants outlive its flag as last set (it must be set again).
    pub(super) fn flag_outlived(&self) -> bool {
        let switch = &self.claims;
        switch.claims_until_ms.load(Ordering::Relaxed)
            > switch.flag_until_ms.load(Ordering::Relaxed)
    }

    /// A grant whose claim may stand `stand` from now was made.
    pub(super) fn granted_until(&self, stand: Duration) {
        let until = self.claims.after(stand);
        self.claims
            .claims_until_ms
            .fetch_max(until, Ordering::Relaxed);
    }

    /// Waits until this replica's grants are seen by every replica (its flag settled), at most
    /// until `deadline`: an error then.
    pub(super) async fn settled(&self, deadline: Instant) -> Result<(), StoreError> {
        let switch = &self.claims;
        // Only a replica that serves RLQS grants to gateways; a store driven directly (a
        // test's, a benchmark's) has no replica to wait for.
        if !switch.serves.load(Ordering::Relaxed) {
            return Ok(());
        }
        loop {
            let settled = switch.settled_ms.load(Ordering::Relaxed);
            let now = switch.now_ms();
            if settled != 0 && settled <= now {
                return Ok(());
            }
            // Not said yet: look again shortly; said: wait the rest.
            let wait = if settled == 0 { 50 } else { settled - now };
            let at = Instant::now() + Duration::from_millis(wait.min(50));
            if at > deadline {
                return Err(StoreError::Unavailable(
                    "this replica's RLQS grants wait until every replica on its Redis counts \
                     their claims (its RLQS flag set and seen: a few seconds after the first \
                     replica serving RLQS on a Redis starts)"
                        .into(),
                ));
            }
            tokio::time::sleep_until(at).await;
        }
    }
}
