//! The RLQS grants' claims on the Redis decision path: a store whose RLS checks count them
//! sends those charges under their own operation (`script::count_claims`), and reads the claim
//! the script counted back off the reply, so that the decision is the one of the limit it was
//! made on. Counting costs a read of the descriptor's holder table per check: a replica counts
//! when it serves RLQS, or once another replica on the same Redis says it does
//! (`QuotaStore::in_use`); a deployment without RLQS pays nothing. It must never turn a reply it
//! cannot read into a decision, nor read a reply as encoded otherwise than it was.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use super::{RedisStore, script};
use crate::algorithm::{Check, Decision, zero_limit_decision};
use crate::store::StoreError;
use crate::store::quota::RlsTally;

/// Whether a store's RLS checks count the claims, shared by its clones (the limiter's and the
/// quota store's are one store).
#[derive(Default)]
pub(super) struct ClaimsSwitch {
    tally: OnceLock<Arc<RlsTally>>,
    on: AtomicBool,
}

impl RedisStore {
    /// Whether a call sent now counts the claims (read once per call: its encoding and its
    /// reply's reading must agree).
    pub(super) fn counting_claims(&self) -> bool {
        self.claims.on.load(Ordering::Relaxed) && self.claims.tally.get().is_some()
    }

    /// `check`'s decision from its numbers; `counted`: the call counted the claims, so a charge
    /// that counts them (`script::counts_claims`) has one more number, what they claimed (its
    /// limit less that is what it was decided on), and its hits on a held descriptor are
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
        // Demand is what RLS asks at its checks; a cost recorded after the fact (a report's
        // charge among them) is not.
        if !check.post_paid {
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

    /// Its RLS charges tally their hits on held descriptors in `tally`, and count the RLQS
    /// grants' claims from now on when `now` (this replica serves RLQS), else once
    /// `set_claims_counted` says so.
    pub fn count_claims(&self, tally: Arc<RlsTally>, now: bool) {
        let _ = self.claims.tally.set(tally);
        self.claims.on.store(now, Ordering::Relaxed);
    }

    /// Counts the claims, or stops (another replica on this Redis serves RLQS, or no longer).
    pub fn set_claims_counted(&self, on: bool) {
        self.claims.on.store(on, Ordering::Relaxed);
    }
}
