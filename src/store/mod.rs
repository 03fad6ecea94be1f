//! Where counters live. A store runs each `Check` atomically and answers per check, in order: a
//! `Decision`, or why that check could not be decided (one slow Cluster node must not turn the
//! checks on healthy nodes into failure-mode answers). It knows nothing of protobuf or rules; it
//! only counts, and must never answer after the deadline it is given.

pub mod hot;
mod hot_claim;
pub mod memory;
pub mod quota;
pub mod redis;
pub mod split;
pub mod tally;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::time::Instant;

use crate::algorithm::{ChargeMode, Check, Decision};

pub use self::redis::RedisStore;
pub use memory::MemoryStore;

/// Why a store could not decide. The kind tells the operator what to do: wait (`Timeout`,
/// `Unavailable`), fix the configuration (`Permanent`: waiting will not help), or report a bug
/// (`Protocol`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// Unreachable, restarting, failing over, out of memory: the same call may pass later.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// Refused for a reason waiting cannot heal: authentication, permissions, certificate
    /// verification, keys across slots, an unsupported server.
    #[error("store refuses us, and waiting will not help: {0}")]
    Permanent(String),
    /// The store answered something that breaks the contract.
    #[error("store answered unexpectedly: {0}")]
    Protocol(String),
    /// Another replica sharing the store was started with settings ours cannot share it with
    /// (RLQS served beside a per-second Redis): what both set.
    #[error("{0}")]
    Conflict(String),
}

impl StoreError {
    /// The metric label of this kind of failure.
    pub fn kind(&self) -> &'static str {
        match self {
            StoreError::Timeout(_) => "timeout",
            StoreError::Unavailable(_) => "unavailable",
            StoreError::Permanent(_) => "permanent",
            StoreError::Protocol(_) => "protocol",
            StoreError::Conflict(_) => "conflict",
        }
    }

    pub fn is_permanent(&self) -> bool {
        matches!(self, StoreError::Permanent(_))
    }
}

/// One answer per check, in the order of the checks.
pub type Answers = Vec<Result<Decision, StoreError>>;

pub type StoreFuture<'a> = Pin<Box<dyn Future<Output = Answers> + Send + 'a>>;

pub type PingFuture<'a> = Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send + 'a>>;

/// A counter store. Boxed futures keep it object-safe, so the service picks the store at start-up;
/// one allocation per call is noise beside a gRPC round trip.
pub trait Store: Send + Sync + 'static {
    /// Runs every check (each atomically) and answers for each, in order, by `deadline`.
    /// (All of them as one step under `ChargeMode::AllOrNothing`, where the store can.)
    fn check<'a>(
        &'a self,
        checks: &'a [Check],
        deadline: Instant,
        mode: ChargeMode,
    ) -> StoreFuture<'a>;

    /// Gives back `refunds` (hits this store charged a moment ago for a call another store then
    /// refused) only into the window they were charged in, which ends at `window_ends`: a
    /// give-back reaching the store after that is not applied (that window's budget is back
    /// anyway; a later window must not be credited). Answers as `check` does; one not applied
    /// is an error. A store that decides in this process applies it at once, with no delay in
    /// which a window could turn.
    fn give_back<'a>(&'a self, refunds: &'a [Check], window_ends: Instant) -> StoreFuture<'a> {
        self.check(refunds, window_ends, ChargeMode::EachAlone)
    }

    /// A short name for logs and metrics.
    fn name(&self) -> &'static str;

    /// Whether the store answers (for readiness); the embedded store always does.
    fn ping(&self, _deadline: Instant) -> PingFuture<'_> {
        Box::pin(std::future::ready(Ok(())))
    }

    /// The temporary scaling factors every replica on this store shares, with the store's clock.
    fn load_factors(&self, _deadline: Instant) -> FactorsFuture<'_> {
        Box::pin(std::future::ready(Ok(SharedFactors::default())))
    }

    /// Keeps `factor` under `field` for `ttl_ms` of the store's clock; a `ttl_ms` of 0 removes it.
    fn save_factor<'a>(
        &'a self,
        _field: &'a str,
        _factor: f64,
        _ttl_ms: u64,
        _deadline: Instant,
    ) -> PingFuture<'a> {
        Box::pin(std::future::ready(Err(StoreError::Permanent(
            "this store keeps no scaling factors".into(),
        ))))
    }
}

/// Temporary scaling factors as a store keeps them: (field, factor, expiry in Unix ms) entries
/// and the store's own clock when it read them, so that every replica judges expiry alike.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SharedFactors {
    pub now_ms: u64,
    pub entries: Vec<(String, f64, u64)>,
}

pub type FactorsFuture<'a> =
    Pin<Box<dyn Future<Output = Result<SharedFactors, StoreError>> + Send + 'a>>;

/// Answers given by parts (each the indices it answered, and its answers in that order) put back
/// in the call's order; a check no part answered is a protocol error.
pub fn in_call_order<T>(
    len: usize,
    parts: impl IntoIterator<Item = (Vec<usize>, Vec<Result<T, StoreError>>)>,
) -> Vec<Result<T, StoreError>> {
    let mut out: Vec<Option<Result<T, StoreError>>> = (0..len).map(|_| None).collect();
    for (indices, answers) in parts {
        for (i, answer) in indices.into_iter().zip(answers) {
            out[i] = Some(answer);
        }
    }
    out.into_iter()
        .map(|a| a.unwrap_or_else(|| Err(StoreError::Protocol("an answer is missing".into()))))
        .collect()
}

/// The same error for every check: a failure of the whole call.
pub fn all_failed(checks: usize, error: StoreError) -> Answers {
    vec![Err(error); checks]
}
