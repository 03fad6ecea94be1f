//! Concurrency: at most `requests` hits in flight at once. A charge takes one slot per hit, or is
//! refused whole; a refund (Envoy's negative hits, sent when the stream is done) releases slots.
//! Every slot is a lease that ends by itself `window_us` after it was taken (the rule's
//! `max_duration`), so a gateway that dies holding slots, or a release that is lost, frees them
//! within that time. The state is the leases' end times, earliest first.
//!
//! Leases are owned: every take ends at a millisecond of its own on its key (a take in the same
//! millisecond as the last one ends a millisecond after it), and that end, as a number Envoy can
//! carry back (`lease_token`), names the take's leases. A release of a token frees those leases
//! and no other: one whose lease already ended frees nothing, so a request that ran past its
//! lease cannot free the slot another request took since. A release of at most `MAX_SLOTS` hits
//! is a count (0.1.0's `held`): it frees the leases that end first. A release with nothing held
//! is a no-op, never a credit.

use super::{Decision, Limit, Outcome, us};

/// The most slots one descriptor may have: each is 8 bytes of state, read and written per call.
pub const MAX_SLOTS: u64 = 1_000;

/// Envoy's ratelimit filter drops a descriptor whose `hits_addend` from a format is above 10^9,
/// so tokens stay within it, and above `MAX_SLOTS` so that they are never read as a count.
const TOKEN_SPAN_MS: u64 = 1_000_000_000 - MAX_SLOTS;

/// The number that names the leases ending at `end_us`: their end in milliseconds, modulo about
/// 11.6 days (leases last at most a day, so two live ends of one key never share a token).
pub fn lease_token(end_us: u64) -> u64 {
    MAX_SLOTS + 1 + (end_us / 1_000) % TOKEN_SPAN_MS
}

/// A release's hits: a token when above `MAX_SLOTS`, else a count of slots.
pub fn is_token(hits: u64) -> bool {
    hits > MAX_SLOTS
}

/// The ends of the leases held, in microseconds on the store's clock, earliest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseState {
    pub ends_us: Vec<u64>,
}

/// What the answer is made of, whichever store holds the leases (the Redis script replies these).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Leases {
    pub count: u64,
    /// The earliest and latest lease ends (0 when nothing is held).
    pub first_end_us: u64,
    pub last_end_us: u64,
}

impl LeaseState {
    /// Drops the leases that ended at or before `now_us`.
    fn expire(&mut self, now_us: u64) {
        let ended = self.ends_us.partition_point(|&end| end <= now_us);
        self.ends_us.drain(..ended);
    }

    pub fn leases(&self) -> Leases {
        Leases {
            count: self.ends_us.len() as u64,
            first_end_us: self.ends_us.first().copied().unwrap_or(0),
            last_end_us: self.ends_us.last().copied().unwrap_or(0),
        }
    }
}

/// Takes `hits` slots if they all fit, each leased until `now_us + window_us`.
pub fn check(state: &mut LeaseState, now_us: u64, limit: &Limit, hits: u64) -> Outcome {
    state.expire(now_us);
    let held = state.ends_us.len() as u64;
    let allowed = held.saturating_add(hits) <= limit.requests.min(MAX_SLOTS);
    if allowed && hits > 0 {
        let end = lease_end(now_us, limit.window_us, state.ends_us.last().copied());
        state
            .ends_us
            .extend(std::iter::repeat_n(end, hits as usize));
    }
    summarize(&state.leases(), now_us, limit, hits, allowed)
}

/// A new take's end: its lease from now, on a whole millisecond, and at least a millisecond after
/// the latest end held, so that it ends last (a clock stepped back keeps the order) and its token
/// is its own. lua/concurrency.lua computes the same.
pub fn lease_end(now_us: u64, window_us: u64, last_end_us: Option<u64>) -> u64 {
    let end_ms = now_us.saturating_add(window_us.max(1)).div_ceil(1_000);
    let after_last_ms = last_end_us.map_or(0, |last| last / 1_000 + 1);
    end_ms.max(after_last_ms).saturating_mul(1_000)
}

/// A release: `hits` above `MAX_SLOTS` is a lease token, freeing that take's leases if they are
/// still held; else up to `hits` slots, those whose leases end first. Nothing held, nothing
/// released.
pub fn refund(state: &mut LeaseState, now_us: u64, limit: &Limit, hits: u64) -> Outcome {
    state.expire(now_us);
    if is_token(hits) {
        state.ends_us.retain(|&end| lease_token(end) != hits);
    } else {
        let released = (hits as usize).min(state.ends_us.len());
        state.ends_us.drain(..released);
    }
    summarize(&state.leases(), now_us, limit, 0, true)
}

/// What Envoy is told: `limit` the slots, `remaining` the slots free now, `reset_after` when
/// every slot held is free at the latest (their leases all ended), `retry_after` (refused) when
/// one is free at the latest; a release may free one sooner. `lease` (a take that passed) names
/// the leases it took: they end last.
pub fn summarize(leases: &Leases, now_us: u64, limit: &Limit, hits: u64, allowed: bool) -> Outcome {
    let slots = limit.requests.min(MAX_SLOTS);
    let until = |end: u64| end.saturating_sub(now_us);
    let retry_after = (!allowed && hits <= slots).then(|| {
        // The leases that must end before `hits` fit.
        let must_end = (leases.count + hits).saturating_sub(slots);
        let wait = if must_end >= leases.count {
            until(leases.last_end_us)
        } else {
            until(leases.first_end_us)
        };
        us(wait.max(1))
    });
    Outcome {
        decision: Decision {
            allowed,
            limit: slots,
            remaining: slots.saturating_sub(leases.count),
            reset_after: us(until(leases.last_end_us)),
            retry_after,
            by_failure_mode: false,
            lease: (allowed && hits > 0 && leases.count > 0)
                .then(|| lease_token(leases.last_end_us)),
        },
        keep_for_us: if leases.count > 0 {
            until(leases.last_end_us)
        } else {
            0
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;

    fn limit(slots: u64, lease_s: u64) -> Limit {
        Limit {
            algorithm: Algorithm::Concurrency,
            requests: slots,
            window_us: lease_s * 1_000_000,
            burst: slots,
        }
    }

    #[test]
    fn slots_are_taken_refused_and_released() {
        let l = limit(2, 60);
        let mut s = LeaseState::default();
        assert!(check(&mut s, 1_000, &l, 1).decision.allowed);
        let second = check(&mut s, 2_000, &l, 1).decision;
        assert!(second.allowed);
        assert_eq!(second.remaining, 0);
        let third = check(&mut s, 3_000, &l, 1).decision;
        assert!(!third.allowed);
        // A slot frees by itself when the first lease ends, 60 s after it was taken.
        assert_eq!(third.retry_after, Some(us(60_000_000 - 2_000)));
        // A refused charge took nothing: one release frees one slot.
        let released = refund(&mut s, 4_000, &l, 1).decision;
        assert_eq!(released.remaining, 1);
        assert!(check(&mut s, 5_000, &l, 1).decision.allowed);
        assert!(!check(&mut s, 6_000, &l, 1).decision.allowed);
    }

    #[test]
    fn a_release_with_nothing_held_is_not_a_credit() {
        let l = limit(1, 60);
        let mut s = LeaseState::default();
        let r = refund(&mut s, 0, &l, 5).decision;
        assert_eq!(r.remaining, 1);
        assert!(check(&mut s, 1, &l, 1).decision.allowed);
        assert!(!check(&mut s, 2, &l, 1).decision.allowed);
    }

    #[test]
    fn leases_end_by_themselves() {
        let l = limit(1, 10);
        let mut s = LeaseState::default();
        assert!(check(&mut s, 0, &l, 1).decision.allowed);
        assert!(!check(&mut s, 9_999_999, &l, 1).decision.allowed);
        let later = check(&mut s, 10_000_000, &l, 1);
        assert!(later.decision.allowed);
        assert_eq!(later.keep_for_us, 10_000_000);
        // A late release of the lease that ended releases the new one: the count stays right.
        refund(&mut s, 10_000_001, &l, 1);
        assert_eq!(s.ends_us.len(), 0);
    }

    /// Issue 43's case: one slot, a lease of a second. A runs past its lease, B takes the slot,
    /// then A's release comes: it names A's lease, which ended, and frees nothing; C is refused
    /// while B is in flight, and B's own release frees the slot.
    #[test]
    fn a_late_release_frees_only_its_own_lease() {
        let l = limit(1, 1);
        let mut s = LeaseState::default();
        let a = check(&mut s, 0, &l, 1).decision.lease.expect("A's lease");
        let b = check(&mut s, 1_200_000, &l, 1)
            .decision
            .lease
            .expect("B's lease");
        assert_ne!(a, b);
        refund(&mut s, 1_500_000, &l, a);
        assert!(
            !check(&mut s, 1_600_000, &l, 1).decision.allowed,
            "C admitted while B is in flight: A's late release freed B's slot"
        );
        refund(&mut s, 1_700_000, &l, b);
        assert!(check(&mut s, 1_800_000, &l, 1).decision.allowed);
    }

    #[test]
    fn takes_in_one_millisecond_get_leases_of_their_own() {
        let l = limit(3, 60);
        let mut s = LeaseState::default();
        let one = check(&mut s, 5_000_100, &l, 2).decision.lease.expect("one");
        let two = check(&mut s, 5_000_200, &l, 1).decision.lease.expect("two");
        assert_ne!(one, two);
        // The second ends a millisecond after the first, on a whole millisecond.
        assert_eq!(s.ends_us, vec![65_001_000, 65_001_000, 65_002_000]);
        // Releasing the first take frees its two slots, not the second's.
        refund(&mut s, 5_000_300, &l, one);
        assert_eq!(s.ends_us, vec![65_002_000]);
        // A count (0.1.0's `held`) still frees the earliest.
        refund(&mut s, 5_000_400, &l, 1);
        assert!(s.ends_us.is_empty());
        // Tokens are above the slots a rule may have and within Envoy's bound on hits_addend.
        for end in [
            0,
            999,
            1_000,
            u64::MAX / 2,
            999_999_000_000 - 1,
            999_999_000_000,
        ] {
            let t = lease_token(end);
            assert!(is_token(t) && t <= 1_000_000_000, "{end}: {t}");
        }
        // A refused take and a check of no hits name no lease.
        let full = limit(1, 60);
        let mut s = LeaseState::default();
        assert!(check(&mut s, 0, &full, 0).decision.lease.is_none());
        check(&mut s, 0, &full, 1);
        assert!(check(&mut s, 1, &full, 1).decision.lease.is_none());
    }

    #[test]
    fn a_charge_of_several_hits_is_all_or_nothing_and_never_past_the_slots() {
        let l = limit(3, 60);
        let mut s = LeaseState::default();
        assert!(check(&mut s, 0, &l, 2).decision.allowed);
        let refused = check(&mut s, 1, &l, 2).decision;
        assert!(!refused.allowed);
        assert_eq!(s.ends_us.len(), 2);
        // More than the slots: waiting never helps.
        assert_eq!(check(&mut s, 2, &l, 4).decision.retry_after, None);
        // A check-only call (0 hits) takes nothing and passes while a slot is free.
        assert!(check(&mut s, 3, &l, 0).decision.allowed);
        assert_eq!(s.ends_us.len(), 2);
    }
}
