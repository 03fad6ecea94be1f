//! Token bucket as GCRA (generic cell rate algorithm): one number of state, the theoretical
//! arrival time (TAT) at which the bucket would be full again.
//!
//! A bucket holds `burst` tokens and regains `requests` tokens per `window_us`, continuously.
//! One token takes `emission_us = window_us / requests` to come back; the bucket is full when
//! TAT <= now. Spending n tokens moves TAT to max(TAT, now) + n * emission_us, which is allowed
//! while TAT - now stays within `tolerance_us = burst * emission_us`.
//!
//! `emission_us` is rarely a whole number (100 per second is 10,000 us; 3 per second is not), and
//! rounding it would either over- or under-admit. So TAT is kept exactly, as whole microseconds
//! plus a fraction in units of 1/requests of a microsecond: `tat_us + frac / requests`. Every
//! cost is split the same way (`quotient + remainder / requests`) in Rust with 128-bit integers,
//! so the Redis script only adds and compares integers below 2^53, where Lua's doubles are exact.

use super::{Decision, Limit, Outcome, us};

/// Durations above this are clamped: keeps every value the Lua script sees exact in a double.
pub const MAX_SPAN_US: u64 = 1 << 52;

/// `tat_us + frac / rate` microseconds since the epoch; 0 is a full bucket. `rate` is the
/// `requests` the fraction is counted in: a reload may change a rule's number while its counter
/// (and so this state) is kept.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct BucketState {
    pub tat_us: u64,
    pub frac: u64,
    pub rate: u64,
}

/// The state with its fraction counted in `requests`. A fraction written under another rate is
/// rounded up to the next whole microsecond: TAT moves at most 1 us later (never earlier, which
/// would return budget), and the old units are never misread in the new ones (4e9 units of
/// 1/4e9 us read as 1/1 us would owe more than an hour).
pub fn at_rate(state: &BucketState, requests: u64) -> BucketState {
    if state.rate == requests || state.frac == 0 {
        BucketState {
            rate: requests,
            ..*state
        }
    } else {
        BucketState {
            tat_us: state.tat_us.saturating_add(1),
            frac: 0,
            rate: requests,
        }
    }
}

/// A span of `quotient + remainder / requests` microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub quotient_us: u64,
    pub remainder: u64,
}

/// `tokens` tokens' worth of time, as an exact span.
pub fn span_of(tokens: u64, limit: &Limit) -> Span {
    let rate = u128::from(limit.requests.max(1));
    let scaled = u128::from(tokens) * u128::from(limit.window_us);
    Span {
        quotient_us: u64::try_from(scaled / rate)
            .unwrap_or(MAX_SPAN_US)
            .min(MAX_SPAN_US),
        remainder: (scaled % rate) as u64,
    }
}

/// Where the bucket stands now: TAT, or now when the bucket is already full.
fn base(state: &BucketState, now_us: u64) -> BucketState {
    if state.tat_us > now_us || (state.tat_us == now_us && state.frac > 0) {
        *state
    } else {
        BucketState {
            tat_us: now_us,
            frac: 0,
            rate: state.rate,
        }
    }
}

/// Spends `hits` tokens if the bucket holds them.
pub fn check(state: &mut BucketState, now_us: u64, limit: &Limit, hits: u64) -> Outcome {
    let allowed = hits <= limit.burst && {
        let cost = span_of(hits, limit);
        let tolerance = span_of(limit.burst, limit);
        let start = base(&at_rate(state, limit.requests), now_us);
        let frac = start.frac + cost.remainder;
        let carry = u64::from(frac >= limit.requests);
        let next = BucketState {
            tat_us: start.tat_us + cost.quotient_us + carry,
            frac: frac - carry * limit.requests,
            rate: limit.requests,
        };
        let ahead = (next.tat_us - now_us, next.frac);
        let fits = ahead <= (tolerance.quotient_us, tolerance.remainder);
        if fits {
            *state = next;
        }
        fits
    };
    summarize(state, now_us, limit, hits, allowed)
}

/// `state` moved on by `span` (exact: the fraction carries into the whole microseconds).
fn later(state: &BucketState, span: Span, requests: u64) -> BucketState {
    let frac = state.frac + span.remainder;
    let carry = u64::from(frac >= requests);
    BucketState {
        tat_us: state.tat_us.saturating_add(span.quotient_us + carry),
        frac: frac - carry * requests,
        rate: requests,
    }
}

/// `state` moved back by `span`, never before 0.
fn earlier(state: &BucketState, span: Span, requests: u64) -> BucketState {
    let borrow = u64::from(state.frac < span.remainder);
    BucketState {
        tat_us: state.tat_us.saturating_sub(span.quotient_us + borrow),
        frac: state.frac + borrow * requests - span.remainder,
        rate: requests,
    }
}

/// The bucket as if the claims' `span` had been drawn from it: a bucket with no state (never
/// charged, expired, refunded full) is taken as just full at `now_us`.
fn as_drawn(state: &BucketState, now_us: u64, limit: &Limit, span: Span) -> BucketState {
    let known = if state.tat_us == 0 && state.frac == 0 {
        BucketState {
            tat_us: now_us,
            frac: 0,
            rate: limit.requests,
        }
    } else {
        at_rate(state, limit.requests)
    };
    later(&known, span, limit.requests)
}

/// `check` for an RLS call beside RLQS grants that claim `claimed` tokens (what the gateways
/// may have drawn since their last reports, not yet charged): decided on the bucket as if they
/// had drawn them, `max(TAT + their span, now)`. What RLS spends is kept in the same frame (the
/// state is the bucket so drawn, less their span): the refill a bucket gains past full while
/// they draw is theirs, and RLS keeps its burst and the rate they leave. A bucket with no state
/// (never charged, expired, refunded full) is taken as just full: what it held is not known.
/// Answers with the claims counted (what RLS may still spend).
pub fn check_claimed(
    state: &mut BucketState,
    now_us: u64,
    limit: &Limit,
    hits: u64,
    claimed: u64,
) -> Outcome {
    let span = span_of(claimed, limit);
    let mut seen = as_drawn(state, now_us, limit, span);
    let decided = check(&mut seen, now_us, limit, hits);
    if decided.decision.allowed && hits > 0 {
        *state = earlier(&seen, span, limit.requests);
    }
    Outcome {
        keep_for_us: summarize(state, now_us, limit, 0, true).keep_for_us,
        ..decided
    }
}

/// `record` beside RLQS grants that claim `claimed` tokens, in `check_claimed`'s frame: the
/// hits are recorded on the bucket as the claims leave it, then the claims' span taken off
/// again. A report's charge (what a gateway admitted, its claim until then) so takes the place
/// of its claim: RLS sees the bucket move by what was admitted less what was claimed.
pub fn record_claimed(
    state: &mut BucketState,
    now_us: u64,
    limit: &Limit,
    hits: u64,
    claimed: u64,
) -> Outcome {
    let span = span_of(claimed, limit);
    let mut seen = as_drawn(state, now_us, limit, span);
    let recorded = record(&mut seen, now_us, limit, hits);
    *state = earlier(&seen, span, limit.requests);
    Outcome {
        keep_for_us: summarize(state, now_us, limit, 0, true).keep_for_us,
        ..recorded
    }
}

/// Records `hits` tokens that did not fit (a post-paid charge; `check` refused them): TAT moves
/// on by their span all the same, at most `MAX_SPAN_US` ahead of now (the script's ceiling too).
/// Answered refused, with the wait until the bucket is back within its burst.
pub fn record(state: &mut BucketState, now_us: u64, limit: &Limit, hits: u64) -> Outcome {
    let cost = span_of(hits, limit);
    let start = base(&at_rate(state, limit.requests), now_us);
    let frac = start.frac + cost.remainder;
    let carry = u64::from(frac >= limit.requests);
    let tat_us = start.tat_us.saturating_add(cost.quotient_us + carry);
    *state = if tat_us - now_us > MAX_SPAN_US {
        BucketState {
            tat_us: now_us + MAX_SPAN_US,
            frac: 0,
            rate: limit.requests,
        }
    } else {
        BucketState {
            tat_us,
            frac: frac - carry * limit.requests,
            rate: limit.requests,
        }
    };
    summarize(state, now_us, limit, 0, false)
}

/// Gives `hits` tokens back: TAT moves earlier by their span, never before now (a full bucket).
/// Exact like `check`: the fraction borrows from the whole microseconds.
pub fn refund(state: &mut BucketState, now_us: u64, limit: &Limit, hits: u64) -> Outcome {
    let start = at_rate(state, limit.requests);
    let back = span_of(hits, limit);
    let borrow = u64::from(start.frac < back.remainder);
    let frac = start.frac + borrow * limit.requests - back.remainder;
    let tat_us = start.tat_us.saturating_sub(back.quotient_us + borrow);
    *state = if tat_us < now_us || (tat_us == now_us && frac == 0) {
        BucketState::default()
    } else {
        BucketState {
            tat_us,
            frac,
            rate: limit.requests,
        }
    };
    summarize(state, now_us, limit, 0, true)
}

/// Derives what Envoy is told from a state (after the check ran on it).
pub fn summarize(
    state: &BucketState,
    now_us: u64,
    limit: &Limit,
    hits: u64,
    allowed: bool,
) -> Outcome {
    let rate = u128::from(limit.requests.max(1));
    let window = u128::from(limit.window_us);
    let start = base(&at_rate(state, limit.requests), now_us);
    // Time still to refill, in units of 1/requests us.
    let owed = u128::from(start.tat_us - now_us) * rate + u128::from(start.frac);
    let capacity = u128::from(limit.burst) * window;
    let remaining = capacity.saturating_sub(owed) / window;
    let reset_after_us = owed.div_ceil(rate);
    let retry_after = if allowed || hits > limit.burst {
        None
    } else {
        let excess = (owed + u128::from(hits) * window).saturating_sub(capacity);
        Some(us(clamp_us(excess.div_ceil(rate)).max(1)))
    };
    let reset_after_us = clamp_us(reset_after_us);
    Outcome {
        decision: Decision {
            allowed,
            limit: limit.burst,
            remaining: u64::try_from(remaining).unwrap_or(u64::MAX),
            reset_after: us(reset_after_us),
            retry_after,
            by_failure_mode: false,
            lease: None,
        },
        keep_for_us: reset_after_us,
    }
}

fn clamp_us(value: u128) -> u64 {
    u64::try_from(value).unwrap_or(MAX_SPAN_US).min(MAX_SPAN_US)
}
