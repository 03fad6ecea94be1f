//! What an RLQS grant claims of a rule's window (the one budget): a gateway granted `rate` a
//! second from `since_us` (its last report: what it admitted before is charged into the
//! counter) until `ends_us` may admit that rate over that span, so an RLS check counts the part
//! of the span that can fall in the windows its own hit will count in. Pure, and mirrored by
//! `lua/claims.lua` (same operations, same order, so the doubles agree); `apply_claimed` and
//! `charge_post_paid_claimed` run a check with the claims counted (a window's limit lowered, a
//! bucket read as drawn), as `lua/check.lua` does.
//! It must never claim less than a gateway at its rate can admit inside the window.

use super::{Algorithm, Limit, Outcome, State, apply, charge_post_paid, token_bucket};

/// One holder's standing, as a check sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Claim {
    /// Requests per second granted.
    pub rate: f64,
    /// From when its admissions are not yet in the counter (its last report).
    pub since_us: u64,
    /// When its grant ends (or ended: a stream that ended still claims what it may have
    /// admitted and never reported).
    pub ends_us: u64,
}

/// Below this, a claim computed twice is the same number of requests: 3 - 1e-12 must stay 3.
const EPSILON: f64 = 1e-9;

fn overlap(a: (u64, u64), b: (u64, u64)) -> u64 {
    a.1.min(b.1).saturating_sub(a.0.max(b.0))
}

/// Requests `claim` may admit that a check of `limit` at `now_us` must count:
/// - fixed window: its span inside the current window;
/// - sliding window: its span inside `[now - W, now + W)`, at most a window's worth (every window
///   that holds this check's hit lies there);
/// - token bucket: its span up to now (the uncharged past: the refill pays for the rest).
pub fn claim(c: &Claim, limit: &Limit, now_us: u64) -> f64 {
    // NaN and zero alike: nothing.
    if c.rate.is_nan() || c.rate <= 0.0 || c.ends_us <= c.since_us || limit.window_us == 0 {
        return 0.0;
    }
    let span = (c.since_us, c.ends_us);
    let w = limit.window_us;
    let us = match limit.algorithm {
        Algorithm::FixedWindow => {
            let start = now_us - now_us % w;
            overlap(span, (start, start.saturating_add(w)))
        }
        Algorithm::SlidingWindow => {
            overlap(span, (now_us.saturating_sub(w), now_us.saturating_add(w))).min(w)
        }
        Algorithm::TokenBucket => overlap(span, (0, now_us)),
        Algorithm::Concurrency => 0,
    };
    c.rate * us as f64 / 1e6
}

/// Every claim of `claims` at `now_us`, as whole requests (rounded up: a part of a request the
/// gateway may admit is one the check must not).
pub fn claimed(claims: &[Claim], limit: &Limit, now_us: u64) -> u64 {
    let total: f64 = claims.iter().map(|c| claim(c, limit, now_us)).sum();
    (total - EPSILON).ceil().max(0.0) as u64
}

/// `limit` less `claimed` requests: what an RLS check on a window may still count on; nothing
/// left is a limit of zero requests (every charge refused). A token bucket is not lowered: its
/// check counts the claims as drawn (`token_bucket::check_claimed`, through `apply_claimed`).
pub fn less(limit: &Limit, claimed: u64) -> Limit {
    if claimed == 0
        || matches!(
            limit.algorithm,
            Algorithm::Concurrency | Algorithm::TokenBucket
        )
    {
        return *limit;
    }
    let requests = limit.requests.saturating_sub(claimed);
    Limit {
        requests,
        burst: limit.burst.min(requests),
        ..*limit
    }
}

/// `apply` for an RLS check beside RLQS grants that claim `claimed` requests of its window or
/// bucket (`claims`): a window's limit loses them; a bucket is decided as if the gateways had
/// drawn them (`token_bucket::check_claimed`).
pub fn apply_claimed(
    state: &mut State,
    now_us: u64,
    limit: &Limit,
    hits: u64,
    claimed: u64,
) -> Outcome {
    match (limit.algorithm, &mut *state) {
        (_, _) if claimed == 0 => apply(state, now_us, limit, hits),
        (Algorithm::TokenBucket, State::Bucket(s)) if limit.requests > 0 => {
            token_bucket::check_claimed(s, now_us, limit, hits, claimed)
        }
        (Algorithm::TokenBucket, State::Bucket(_)) => apply(state, now_us, limit, hits),
        (Algorithm::TokenBucket, _) => {
            *state = State::empty(Algorithm::TokenBucket);
            apply_claimed(state, now_us, limit, hits, claimed)
        }
        _ => apply(state, now_us, &less(limit, claimed), hits),
    }
}

/// `charge_post_paid` beside RLQS grants that claim `claimed` requests: a bucket's charge is
/// recorded in the frame its claims are counted in (`token_bucket::record_claimed`); a window's
/// is recorded whole, and answered on its limit less the claims (whether the hits fit beside
/// them: in the Go drop-in mode every RLS call is such a charge, and its answer admits).
pub fn charge_post_paid_claimed(
    state: &mut State,
    now_us: u64,
    limit: &Limit,
    hits: u64,
    claimed: u64,
) -> Outcome {
    if claimed == 0 || limit.requests == 0 {
        return charge_post_paid(state, now_us, limit, hits);
    }
    if limit.algorithm != Algorithm::TokenBucket {
        return charge_post_paid(state, now_us, &less(limit, claimed), hits);
    }
    let hits = hits.min(u64::from(u32::MAX));
    let outcome = apply_claimed(state, now_us, limit, hits, claimed);
    if outcome.decision.allowed || hits == 0 {
        return outcome;
    }
    match state {
        State::Bucket(s) => token_bucket::record_claimed(s, now_us, limit, hits, claimed),
        _ => outcome,
    }
}

#[cfg(test)]
#[path = "claims_model.rs"]
mod model;

#[cfg(test)]
#[path = "claims_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "claims_sliding_tests.rs"]
mod sliding_tests;

#[cfg(test)]
#[path = "claims_bucket_tests.rs"]
mod bucket_tests;
