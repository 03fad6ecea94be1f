//! Sliding window over sub-window counters.
//!
//! The window of `window_us` is cut into `SUB_WINDOWS` (60) epoch-aligned sub-windows of
//! `sub_window_us = ceil(window_us / SUB_WINDOWS)`. A counter keeps the hits admitted in each of the
//! last `SLOTS = SUB_WINDOWS + 1` sub-windows (the current one and the `SUB_WINDOWS` before it),
//! and their running total. A request is admitted when the total plus its hits stays within the
//! limit.
//!
//! Why this never over-admits: take any interval of length `window_us` and the last hit admitted
//! in it, at time t in sub-window b. Every earlier hit of the interval lies in (t - window_us, t],
//! which is covered by sub-windows b - SUB_WINDOWS ..= b, all of which were counted when t was
//! admitted; so the interval holds at most the limit.
//!
//! The price (bounded under-admission): hits of the oldest counted sub-window stay counted for up
//! to one sub-window longer than `window_us`. Equivalently a hit is forgotten between `window_us`
//! and `SLOTS * sub_window_us` (a minute's window: 61 s; a second's: 1.017 s) after it was
//! admitted, never sooner. Memory per key: `SLOTS` counters and a total, whatever the limit.

use super::{Decision, Limit, Outcome, us};

pub const SUB_WINDOWS: u64 = 60;
pub const SLOTS: usize = SUB_WINDOWS as usize + 1;

/// Counters of the last `SLOTS` sub-windows; `counts[SLOTS - 1]` belongs to sub-window `newest`.
/// A sub-window's count never exceeds the limit (at most `u32::MAX` requests: Envoy's field is a
/// uint32, and rules are validated against it), so 32 bits hold it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlidingState {
    newest: u64,
    total: u64,
    counts: [u32; SLOTS],
}

impl Default for SlidingState {
    fn default() -> Self {
        SlidingState {
            newest: 0,
            total: 0,
            counts: [0; SLOTS],
        }
    }
}

pub fn sub_window_us(window_us: u64) -> u64 {
    window_us.div_ceil(SUB_WINDOWS).max(1)
}

/// The most a sub-window may hold; admissions are bounded by it so no count ever saturates.
fn capacity(limit: &Limit) -> u64 {
    limit.requests.min(u64::from(u32::MAX))
}

impl SlidingState {
    /// Builds the state from (sub-window index, count) pairs, as the Redis script returns them.
    /// Pairs older than the `SLOTS` sub-windows ending at the newest one are ignored.
    pub fn from_counts(pairs: impl IntoIterator<Item = (u64, u64)>) -> Self {
        let pairs: Vec<(u64, u64)> = pairs.into_iter().filter(|&(_, c)| c > 0).collect();
        let mut state = SlidingState::default();
        if let Some(newest) = pairs.iter().map(|&(b, _)| b).max() {
            state.newest = newest;
            for (bucket, count) in pairs {
                let age = newest - bucket;
                if age < SLOTS as u64 {
                    let slot = SLOTS - 1 - age as usize;
                    let count = u32::try_from(count).unwrap_or(u32::MAX);
                    state.counts[slot] = state.counts[slot].saturating_add(count);
                }
            }
            state.total = state.counts.iter().map(|&c| u64::from(c)).sum();
        }
        state
    }

    /// Non-empty (sub-window index, count) pairs, oldest first.
    pub fn counts(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.counts
            .iter()
            .enumerate()
            .filter_map(move |(slot, &count)| {
                let age = (SLOTS - 1 - slot) as u64;
                (count > 0 && self.newest >= age).then(|| (self.newest - age, u64::from(count)))
            })
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    /// Moves the newest sub-window forward to `bucket`, dropping counters that leave the window.
    /// A bucket older than the newest (the clock stepped back) keeps the newest: counting into
    /// it is safe, forgetting counters early would not be.
    fn advance(&mut self, bucket: u64) {
        if bucket <= self.newest {
            return;
        }
        let shift = bucket - self.newest;
        if shift >= SLOTS as u64 {
            self.counts = [0; SLOTS];
            self.total = 0;
        } else {
            let shift = shift as usize;
            let left: u64 = self.counts[..shift].iter().map(|&c| u64::from(c)).sum();
            self.total -= left;
            self.counts.rotate_left(shift);
            self.counts[SLOTS - shift..].fill(0);
        }
        self.newest = bucket;
    }

    /// Adds to the newest sub-window; admitted hits always fit (total + hits <= capacity <=
    /// u32::MAX), post-paid ones stop at the sub-window's 32-bit ceiling (the script does too).
    fn add(&mut self, hits: u64) {
        let hits32 = u32::try_from(hits).unwrap_or(u32::MAX);
        let before = self.counts[SLOTS - 1];
        self.counts[SLOTS - 1] = before.saturating_add(hits32);
        self.total += u64::from(self.counts[SLOTS - 1] - before);
    }
}

/// Admits `hits` if the window has room for them, and reports the state after.
pub fn check(state: &mut SlidingState, now_us: u64, limit: &Limit, hits: u64) -> Outcome {
    let sub_us = sub_window_us(limit.window_us);
    state.advance(now_us / sub_us);
    let used = state.total();
    // A counter past its limit (post-paid charges, a reload that lowered it) refuses even a
    // check-only call.
    let allowed = used.saturating_add(hits) <= capacity(limit);
    if allowed {
        state.add(hits);
    }
    let outcome = summarize(state, now_us, limit, hits, allowed);
    debug_assert!(allowed || outcome.decision.remaining == limit.requests.saturating_sub(used));
    outcome
}

/// Records `hits` that did not fit (a post-paid charge; `check` refused them): the newest
/// sub-window takes them, up to its 32-bit ceiling. Answered refused, with the wait until the
/// total is back within the limit.
pub fn record(state: &mut SlidingState, now_us: u64, limit: &Limit, hits: u64) -> Outcome {
    state.add(hits);
    summarize(state, now_us, limit, 0, false)
}

/// Takes `hits` back from the newest sub-windows first (the spending that would be remembered
/// longest), never below zero.
pub fn refund(state: &mut SlidingState, now_us: u64, limit: &Limit, hits: u64) -> Outcome {
    let sub_us = sub_window_us(limit.window_us);
    state.advance(now_us / sub_us);
    let mut left = hits;
    for count in state.counts.iter_mut().rev() {
        let taken = left.min(u64::from(*count));
        *count -= taken as u32;
        state.total -= taken;
        left -= taken;
        if left == 0 {
            break;
        }
    }
    summarize(state, now_us, limit, 0, true)
}

/// Derives what Envoy is told from a state (after the check ran on it).
pub fn summarize(
    state: &SlidingState,
    now_us: u64,
    limit: &Limit,
    hits: u64,
    allowed: bool,
) -> Outcome {
    let sub_us = sub_window_us(limit.window_us);
    let used = state.total();
    // A sub-window b stops counting once the current one is b + SLOTS, i.e. at (b + SLOTS) * sub_us.
    let leaves_at = |bucket: u64| {
        bucket
            .saturating_add(SLOTS as u64)
            .saturating_mul(sub_us)
            .saturating_sub(now_us)
    };
    let reset_after_us = state.counts().last().map_or(0, |(b, _)| leaves_at(b));
    let retry_after = if allowed || hits > limit.requests {
        None
    } else {
        let need = used.saturating_add(hits).saturating_sub(limit.requests);
        let mut freed = 0u64;
        state.counts().find_map(|(bucket, count)| {
            freed = freed.saturating_add(count);
            (freed >= need).then(|| us(leaves_at(bucket).max(1)))
        })
    };
    Outcome {
        decision: Decision {
            allowed,
            limit: limit.requests,
            remaining: limit.requests.saturating_sub(used),
            reset_after: us(reset_after_us),
            retry_after,
            by_failure_mode: false,
            lease: None,
        },
        keep_for_us: reset_after_us,
    }
}
