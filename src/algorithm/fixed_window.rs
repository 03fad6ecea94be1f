//! Fixed window, as the Go reference service counts: windows aligned on the epoch, one counter per
//! window, reset when the next window starts. Allows up to twice the limit across a window edge;
//! it exists for exact parity with envoyproxy/ratelimit. Unlike the Go service, denied hits are not
//! counted.

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
    let allowed = hits <= limit.requests.saturating_sub(state.count);
    if allowed {
        state.count = state.count.saturating_add(hits);
    }
    summarize(state, now_us, limit, hits, allowed)
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
        },
        keep_for_us: if count > 0 { ends_in_us } else { 0 },
    }
}
