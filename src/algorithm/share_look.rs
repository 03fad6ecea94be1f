//! What a report's windows have left for its grant, read just after its charge: a check of no
//! hits on a limit raised past what the window can reach (`look`), its count read back signed
//! (`left_of`), and the part of the grant's life each window holds (`room`); the quota step
//! takes the other holders' claims off (`share::Room`). The service reads them so before a
//! grant, and the memory store again in the grant's own step (Redis' quota script reads the
//! same count itself). It must never write (a look is a check of no hits) nor read a fixed
//! window's end from a host's clock.

use super::Room;
use crate::algorithm::{Algorithm, Check};

/// A check of no hits on `layer` (nothing written) whose limit is raised far past what its
/// count and the claims on it can reach: the look stops at zero, and `left_of` needs the count
/// itself (its limit, the raised one less the claims, less its remaining).
pub fn look(layer: &Check) -> Check {
    Check {
        hits: 0,
        refund: false,
        post_paid: false,
        limit: raised(&layer.limit),
        ..layer.clone()
    }
}

/// `limit` raised for a look: 16 times itself and one, at most to Envoy's largest limit (a
/// sliding window counts up to `u32::MAX`).
fn raised(limit: &crate::algorithm::Limit) -> crate::algorithm::Limit {
    let most = limit.requests.max(u64::from(u32::MAX));
    let requests = limit
        .requests
        .saturating_mul(16)
        .saturating_add(1)
        .min(most);
    crate::algorithm::Limit {
        requests,
        burst: requests,
        ..*limit
    }
}

/// `layer`'s limit less its window's count, signed, from its `look` (`share::Room::left`); when
/// even the raised limit was spent, as far below zero as to grant nothing.
pub fn left_of(layer: &Check, look: &crate::algorithm::Decision) -> i64 {
    if look.remaining == 0 {
        return i64::MIN / 4;
    }
    let count = look.limit.saturating_sub(look.remaining);
    let signed = |v: u64| i64::try_from(v).unwrap_or(i64::MAX / 4);
    signed(layer.limit.requests) - signed(count)
}

/// What `layer`'s window has left for a new grant lasting `ttl_us`, from a check of no hits
/// (`look`; `left` as `left_of` read it there; `charged`: what the report charged into it): the
/// part of the grant's life the window holds. A fixed window's end is the one the store's own clock gives
/// (the look's `reset_after`): this host's clock may be off the store's, and a window taken to
/// end sooner than it does grants its room over too short a span, more than it holds. A bucket
/// has none (its refill is shared by rate).
pub fn room(
    layer: &Check,
    left: i64,
    charged: u64,
    look: &crate::algorithm::Decision,
    ttl_us: u64,
) -> Option<Room> {
    let w = layer.limit.window_us;
    let span_us = match layer.limit.algorithm {
        Algorithm::FixedWindow if w > 0 => {
            let ends_in = u64::try_from(look.reset_after.as_micros()).unwrap_or(u64::MAX);
            ttl_us.min(ends_in.min(w))
        }
        Algorithm::SlidingWindow => ttl_us.min(w),
        _ => return None,
    };
    Some(Room {
        limit: layer.limit,
        left,
        charged,
        span_us,
    })
}

/// `rooms` read again where `counters[i]` names room `i`'s counter (empty: it stands as given),
/// by `read` (a check's answer, nothing written), for a grant lasting `ttl_us`: the memory
/// store's grant does so with the counters held, as Redis' quota script reads them itself.
pub fn reread(
    rooms: &[Room],
    counters: &[String],
    ttl_us: u64,
    read: &dyn Fn(&Check) -> crate::algorithm::Decision,
) -> Vec<Room> {
    rooms
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let Some(key) = counters.get(i).filter(|k| !k.is_empty()) else {
                return *r;
            };
            let layer = Check {
                key: key.clone(),
                limit: r.limit,
                hits: 0,
                refund: false,
                post_paid: false,
            };
            let decision = read(&look(&layer));
            room(
                &layer,
                left_of(&layer, &decision),
                r.charged,
                &decision,
                ttl_us,
            )
            .unwrap_or(*r)
        })
        .collect()
}
