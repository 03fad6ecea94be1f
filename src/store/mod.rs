//! Where counters live. A store runs each `Check` atomically and answers a `Decision` per check,
//! in order. It knows nothing of protobuf or rules; it only counts.

pub mod memory;
pub mod redis;

use std::future::Future;
use std::pin::Pin;

use crate::algorithm::{Check, Decision};

pub use self::redis::RedisStore;
pub use memory::MemoryStore;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store could not be reached or answered too late; the same call may pass later.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The store answered something that breaks the contract; retrying will not help.
    #[error("store answered unexpectedly: {0}")]
    Protocol(String),
}

impl StoreError {
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Unavailable(_))
    }
}

pub type StoreFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Vec<Decision>, StoreError>> + Send + 'a>>;

pub type PingFuture<'a> = Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send + 'a>>;

/// A counter store. Boxed futures keep it object-safe, so the service picks the store at start-up;
/// one allocation per call is noise beside a gRPC round trip.
pub trait Store: Send + Sync + 'static {
    /// Runs every check (each atomically) and answers one decision per check, in order.
    fn check<'a>(&'a self, checks: &'a [Check]) -> StoreFuture<'a>;

    /// A short name for logs and metrics.
    fn name(&self) -> &'static str;

    /// Whether the store answers (for readiness reporting); the embedded store always does.
    fn ping(&self) -> PingFuture<'_> {
        Box::pin(std::future::ready(Ok(())))
    }
}
