//! Fixed window, as the Go reference service counts: windows aligned on the epoch, one counter per
//! window, reset when the next window starts. Allows up to twice the limit across a window edge;
//! it exists for exact parity with envoyproxy/ratelimit. Unlike the Go service, denied hits are not
//! counted, except where they are post-paid (a rule's `post_paid`, and every rule in the Go
//! drop-in mode, which counts as the Go service does: `record`).

use super::{Decision, Limit, Outcome, us};

/// The counter of window `window` (index since the epoch, in windows).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FixedState {
    pub window: u64,
    pub count: u64,
}

pub fn check(state: &mut FixedState, now_us: u64, limit: &Limit, hits: u64) -> Outcome {
    let window = now_us / limit.window_us.max(1);
    // A window older than the stored one means the clock stepped back: keep counting in the
    // stored window rather than hand out its budget again.
    if window > state.window {
        *state = FixedState { window, count: 0 };
    }
    // A counter past its limit (post-paid charges, a reload that lowered it) refuses even a
    // check-only call.
    let allowed = state.count.saturating_add(hits) <= limit.requests;
    if allowed {
        state.count = state.count.saturating_add(hits);
    }
    summarize(state, now_us, limit, hits, allowed)
}

/// The most a window's counter holds: post-paid charges stop here, where the script's doubles
/// are still exact.
pub const MAX_COUNT: u64 = 1 << 52;

/// Records `hits` that did not fit (a post-paid charge; `check` refused them and opened the
/// window). Answered refused, with the window's end as the wait.
pub fn record(state: &mut FixedState, now_us: u64, limit: &Limit, hits: u64) -> Outcome {
    state.count = state.count.saturating_add(hits).min(MAX_COUNT);
    summarize(state, now_us, limit, 0, false)
}

/// Gives `hits` back to the current window's counter, never below zero. A window already over
/// had its budget back anyway.
pub fn refund(state: &mut FixedState, now_us: u64, limit: &Limit, hits: u64) -> Outcome {
    let window = now_us / limit.window_us.max(1);
    if state.window >= window {
        state.count = state.count.saturating_sub(hits);
    }
    summarize(state, now_us, limit, 0, true)
}

/// Derives what Envoy is told from a state (after the check ran on it). Like the Go service,
/// the reset is the end of the current window, even when nothing was counted in it.
pub fn summarize(
    state: &FixedState,
    now_us: u64,
    limit: &Limit,
    hits: u64,
    allowed: bool,
) -> Outcome {
    let window_us = limit.window_us.max(1);
    let current = state.window.max(now_us / window_us);
    let count = if current == state.window {
        state.count
    } else {
        0
    };
    let ends_in_us = current
        .saturating_add(1)
        .saturating_mul(window_us)
        .saturating_sub(now_us);
    let retry_after = (!allowed && hits <= limit.requests).then(|| us(ends_in_us.max(1)));
    Outcome {
        decision: Decision {
            allowed,
            limit: limit.requests,
            remaining: limit.requests.saturating_sub(count),
            reset_after: us(ends_in_us),
            retry_after,
            by_failure_mode: false,
            lease: None,
        },
        keep_for_us: if count > 0 { ends_in_us } else { 0 },
    }
}
