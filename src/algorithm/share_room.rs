//! The rooms a grant fits in (`share::report`): what each of a rule's windows has left for a
//! holder's new grant, its count read just after the report's charge, the other holders'
//! claims taken off. It must never give a holder back more than the window held.

use super::Holder;

/// What one window of the rule has left for a new grant, read by a check of no hits just
/// after the report's charge: `left`, its limit less its count, no claim counted (signed:
/// negative when the count is past the limit); `charged`, what this report's charge put in the
/// count; and how much of the new grant's life the window holds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Room {
    pub limit: crate::algorithm::Limit,
    pub left: i64,
    pub charged: u64,
    pub span_us: u64,
}

/// The most holder `me` may be granted per second within `rooms`, over the part of the grant
/// each window holds. A fixed window: its `left` less every other holder's claim there (its
/// own is what the new grant replaces), read signed: a room stopped at zero with the holder's
/// own claim given back on top granted more than the window held once the count and the claims
/// were past the limit (issues 43 and 48: 45 > 44 on a fixed minute of 40). A sliding window:
/// `sliding_room`.
pub(super) fn most(holders: &[Holder], me: usize, rooms: &[Room], now_us: u64) -> f64 {
    let others: Vec<crate::algorithm::claims::Claim> = holders
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != me)
        .filter_map(|(_, h)| h.claim())
        .collect();
    rooms
        .iter()
        .map(|r| {
            if r.limit.algorithm == crate::algorithm::Algorithm::SlidingWindow {
                return sliding_room(&holders[me], &others, r, now_us);
            }
            let span = r.span_us.max(1) as f64 / 1e6;
            let claimed = crate::algorithm::claims::claimed(&others, &r.limit, now_us);
            (r.left as f64 - claimed as f64).max(0.0) / span
        })
        .fold(f64::INFINITY, f64::min)
}

/// A sliding window's room for `holder`'s new grant, per second. Its charged hits are counted
/// from now on though the gateway admitted them before, at most at the rate it was granted: `x`
/// after now, at most `granted_rate × (W − x)` of them are still in the true window. So the
/// charge is given back only in so far as its hits have left the window by the grant's span's
/// end (all of them on a sliding second, none on a minute whose grant spans 11 s), and while
/// every one of them may still be in it, the grant must fit in what is left without them.
/// The rest is the window's `left` less the other holders' claims, but never less than what
/// remains of the holder's own claim (which everyone counted already): the others' charges
/// are counted from their reports on as well, and a room read signed from them alone made a
/// sliding second's steady state oscillate (grants of nothing, then a new bucket at each
/// change). A reservation counts as its own only once it has stood the whole window: before,
/// the window may still hold what others spent before it was made. Giving the whole charge
/// and the whole own claim back granted a gateway on a minute its admissions again (issue 43:
/// 29 admitted in a minute of 26, and 14 in one of 12 where a one-token bucket was spent at
/// once and its claim's time left counted as its own).
fn sliding_room(
    holder: &Holder,
    others: &[crate::algorithm::claims::Claim],
    r: &Room,
    now_us: u64,
) -> f64 {
    let w = r.limit.window_us;
    let span = r.span_us.clamp(1, w.max(1));
    let claimed = crate::algorithm::claims::claimed(others, &r.limit, now_us);
    let mut rate = holder.claim_rate;
    if holder.reserved_since_us > 0 && now_us.saturating_sub(holder.reserved_since_us) < w {
        rate = holder.granted_rate;
    }
    let own = crate::algorithm::claims::Claim {
        rate,
        since_us: holder.since_us,
        ends_us: holder.expires_us,
    };
    // What remains of it: what it claims less what the gateway admitted on it (the charge: a
    // claim's bucket may be spent at once, not at its rate).
    let own = (crate::algorithm::claims::claim(&own, &r.limit, now_us) - r.charged as f64).max(0.0);
    let base = (r
        .left
        .saturating_sub(i64::try_from(claimed).unwrap_or(i64::MAX)) as f64)
        .max(own);
    let charged = r.charged as f64;
    let staying = charged.min(holder.granted_rate * w.saturating_sub(span) as f64 / 1e6);
    let mut most = (base + charged - staying) / (span as f64 / 1e6);
    if holder.granted_rate > 0.0 {
        // Until then every charged hit may still be in the window (within the span only when
        // the charge is more than the old rate fills in the window less the span: a large
        // bucket).
        let all_in_us = w as f64 - charged / holder.granted_rate * 1e6;
        if all_in_us > 0.0 && all_in_us < span as f64 {
            most = most.min(base / (all_in_us / 1e6));
        }
    }
    most.max(0.0)
}
