//! The failure mode: what the limiter answers when the store errs or misses its deadline, and the
//! decisions it answers with. Such a decision must never look like the store's: it is marked
//! `by_failure_mode`, counts nothing, and a refusal announces a short, honest wait.

use std::time::Duration;

use crate::algorithm::{Decision, Limit};

/// What to answer when the store errs or misses its deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailureMode {
    /// Allow the request (fail open, like Envoy's default and Stripe's limiter).
    #[default]
    Allow,
    /// Refuse the request (fail closed).
    Deny,
    /// Count in this process's memory until the store answers again.
    Local,
    /// Hand the store's error back to the caller (gRPC UNAVAILABLE): Envoy's own
    /// `failure_mode_deny` then decides, as with the Go service.
    Error,
}

/// Allowed without counting: nothing is known about the real counter.
pub(super) fn failed_open(limit: &Limit) -> Decision {
    Decision {
        allowed: true,
        limit: limit.capacity(),
        remaining: limit.capacity(),
        reset_after: Duration::ZERO,
        retry_after: None,
        by_failure_mode: true,
        lease: None,
    }
}

/// The longest wait a failure-mode refusal announces. Nothing is known about the counter, only
/// that the store failed; a client told "come back in a month" (the rule's window) would stay
/// away long after the store is back.
pub const FAILED_CLOSED_RETRY: Duration = Duration::from_secs(1);

/// Refused without counting; the client is told to come back after a short, honest wait.
pub(super) fn failed_closed(limit: &Limit) -> Decision {
    let wait = Duration::from_micros(limit.window_us).min(FAILED_CLOSED_RETRY);
    Decision {
        allowed: false,
        limit: limit.capacity(),
        remaining: 0,
        reset_after: wait,
        retry_after: Some(wait),
        by_failure_mode: true,
        lease: None,
    }
}
