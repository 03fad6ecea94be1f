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
            let span = r.span_us.max(1) as f64 / 1e6;
            if r.limit.algorithm == crate::algorithm::Algorithm::SlidingWindow {
                return sliding_room(&holders[me], &others, r, now_us) as f64 / span;
            }
            let claimed = crate::algorithm::claims::claimed(&others, &r.limit, now_us);
            (r.left as f64 - claimed as f64).max(0.0) / span
        })
        .fold(f64::INFINITY, f64::min)
}

/// A sliding window's room for `holder`'s new grant: what the window may count with every
/// claim counted, stopped at zero, plus the report's own charge (counted from now on, though
/// the gateway admitted it over the time before: it leaves the true window as the new grant
/// fills it) and the holder's own claim there (which the new grant replaces). A reservation
/// counts as its own only once it has stood the whole window: before, the window may still
/// hold what others spent before it was made, and only what it was granted is its own.
/// Not yet signed as a fixed window's room is: that made a sliding second's steady state
/// oscillate (the others' charges, counted from their reports on, and their claims leave no
/// room once several gateways share it: grants of nothing, then a new bucket at each change),
/// and random sequences still find a window past the bound by one (10 > 9 on a sliding minute
/// of 8: claims_sliding_tests.rs; issue 43).
fn sliding_room(
    holder: &Holder,
    others: &[crate::algorithm::claims::Claim],
    r: &Room,
    now_us: u64,
) -> u64 {
    let mut all: Vec<crate::algorithm::claims::Claim> = others.to_vec();
    all.extend(holder.claim());
    let claimed = crate::algorithm::claims::claimed(&all, &r.limit, now_us);
    let mut own = *holder;
    if holder.reserved_since_us > 0
        && now_us.saturating_sub(holder.reserved_since_us) < r.limit.window_us
    {
        own.claim_rate = holder.granted_rate;
    }
    let own = own.claim().map_or(0, |c| {
        crate::algorithm::claims::claimed(&[c], &r.limit, now_us)
    });
    let left = r
        .left
        .saturating_sub(i64::try_from(claimed).unwrap_or(i64::MAX))
        .max(0);
    u64::try_from(left)
        .unwrap_or(0)
        .saturating_add(r.charged)
        .saturating_add(own)
}
