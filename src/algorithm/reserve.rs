//! What RLS calls may still count on a descriptor whose rate gateways partly hold: RLQS grants
//! are reservations, so an RLS check runs against its limit less the reserved rate, in the
//! limit's own window (and the burst in proportion). Pure. It must never give RLS more than the
//! limit, nor turn a reservation into a negative budget.

use super::Limit;

/// Below this, two computations of one fraction are the same: 10 - 6 must leave 4, not 3.999….
const EPSILON: f64 = 1e-9;

/// `limit` less `reserved_per_second` held by gateways: the requests a window still holds for
/// RLS, rounded down (rounding must never over-admit); zero requests when the gateways hold it
/// all (every RLS charge is then refused).
pub fn reserve(limit: &Limit, reserved_per_second: f64) -> Limit {
    // NaN and nothing held alike: the limit as it is.
    if reserved_per_second.is_nan()
        || reserved_per_second <= 0.0
        || limit.requests == 0
        || limit.window_us == 0
    {
        return *limit;
    }
    let rate = limit.per_second();
    let left = (1.0 - reserved_per_second / rate).clamp(0.0, 1.0);
    let part = |n: u64| ((n as f64 * left + EPSILON).floor() as u64).min(n);
    let requests = part(limit.requests);
    if requests == 0 {
        return Limit {
            requests: 0,
            burst: 0,
            ..*limit
        };
    }
    Limit {
        requests,
        burst: part(limit.burst).max(1),
        ..*limit
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::algorithm::Algorithm;

    fn limit(algorithm: Algorithm, requests: u64, window_s: u64, burst: u64) -> Limit {
        Limit {
            algorithm,
            requests,
            window_us: window_s * 1_000_000,
            burst,
        }
    }

    #[test]
    fn the_reserved_rate_comes_off_each_window() {
        // 10 a second, gateways hold 6 a second: 4 a second left.
        let second = limit(Algorithm::FixedWindow, 10, 1, 10);
        assert_eq!(reserve(&second, 6.0).requests, 4);
        // 600 a minute (10/s), 6/s held: 240 a minute left.
        let minute = limit(Algorithm::SlidingWindow, 600, 60, 600);
        assert_eq!(reserve(&minute, 6.0).requests, 240);
        // A token bucket keeps its burst in proportion.
        let bucket = limit(Algorithm::TokenBucket, 10, 1, 50);
        let left = reserve(&bucket, 5.0);
        assert_eq!((left.requests, left.burst), (5, 25));
        // All of it held: nothing left, and the limit says so.
        let all = reserve(&second, 10.0);
        assert_eq!((all.requests, all.burst), (0, 0));
        assert_eq!(reserve(&second, 25.0).requests, 0);
        // Nothing held: the limit as it is.
        assert_eq!(reserve(&second, 0.0), second);
        assert_eq!(reserve(&second, f64::NAN), second);
    }

    proptest! {
        /// What RLS may count plus what the gateways hold never passes the limit's rate.
        #[test]
        fn rls_and_the_reservation_never_pass_the_limit(
            requests in 1u64..100_000,
            window_s in 1u64..86_400,
            burst_extra in 0u64..1000,
            held in 0.0f64..2.0,
        ) {
            let l = limit(Algorithm::TokenBucket, requests, window_s, requests + burst_extra);
            let rate = requests as f64 / window_s as f64;
            let left = reserve(&l, held * rate);
            prop_assert!(left.requests <= l.requests && left.burst <= l.burst);
            let left_rate = left.requests as f64 / window_s as f64;
            prop_assert!(left_rate + (held * rate).min(rate) <= rate * (1.0 + 1e-9));
        }
    }
}
