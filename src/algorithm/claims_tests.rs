use proptest::prelude::*;

use super::model::{S, limit, run, run_shared};
use super::*;

#[test]
fn a_claim_is_its_rate_over_its_span_in_the_windows_a_hit_counts_in() {
    let c = Claim {
        rate: 2.0,
        since_us: 10 * S,
        ends_us: 40 * S,
    };
    // Fixed minute [0, 60 s): the whole span, 30 s at 2/s.
    assert_eq!(
        claim(&c, &limit(Algorithm::FixedWindow, 120, 60), 20 * S),
        60.0
    );
    // Fixed second [20, 21): one second of it.
    assert_eq!(
        claim(&c, &limit(Algorithm::FixedWindow, 10, 1), 20 * S),
        2.0
    );
    // In a window the span does not reach: nothing.
    assert_eq!(
        claim(&c, &limit(Algorithm::FixedWindow, 10, 1), 50 * S),
        0.0
    );
    // Sliding minute at 20 s: [-40, 80) holds the whole span.
    assert_eq!(
        claim(&c, &limit(Algorithm::SlidingWindow, 120, 60), 20 * S),
        60.0
    );
    // Sliding 10 s at 20 s: [10, 30) holds 20 s, at most a window (10 s).
    assert_eq!(
        claim(&c, &limit(Algorithm::SlidingWindow, 20, 10), 20 * S),
        20.0
    );
    // Token bucket at 20 s: the uncharged past, 10 s.
    assert_eq!(
        claim(&c, &limit(Algorithm::TokenBucket, 10, 1), 20 * S),
        20.0
    );
    // A span that ended still claims its part; an empty one nothing.
    let ended = Claim {
        ends_us: 15 * S,
        ..c
    };
    assert_eq!(
        claim(&ended, &limit(Algorithm::FixedWindow, 120, 60), 50 * S),
        10.0
    );
    let empty = Claim {
        ends_us: 10 * S,
        ..c
    };
    assert_eq!(
        claim(&empty, &limit(Algorithm::FixedWindow, 120, 60), 20 * S),
        0.0
    );
}

#[test]
fn claims_round_up_and_come_off_the_limit() {
    let half = Claim {
        rate: 0.5,
        since_us: 0,
        ends_us: 3 * S,
    };
    let minute = limit(Algorithm::FixedWindow, 120, 60);
    assert_eq!(claimed(&[half], &minute, S), 2);
    assert_eq!(claimed(&[half, half], &minute, S), 3);
    assert_eq!(less(&minute, 3).requests, 117);
    assert_eq!(less(&minute, 500).requests, 0);
    let bucket = Limit {
        burst: 20,
        ..limit(Algorithm::TokenBucket, 10, 1)
    };
    // A bucket is not lowered: its check counts the claims as drawn (`apply_claimed`).
    assert_eq!(less(&bucket, 5), bucket);
}

/// A window's post-paid charge (the Go drop-in mode's every RLS call) beside a claim: recorded
/// whole, and answered on the limit less the claim. It used to be answered on the whole limit:
/// a Go-mode replica admitted the rule whole beside a gateway granted all of it.
#[test]
fn a_post_paid_charge_is_answered_beside_the_claims() {
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
        let second = limit(algorithm, 10, 1);
        let mut state = State::empty(algorithm);
        let now = 5 * S;
        // 6 of 10 claimed: 4 fit, the fifth does not, and is recorded all the same.
        for n in 1..=4 {
            let o = charge_post_paid_claimed(&mut state, now, &second, 1, 6);
            assert!(o.decision.allowed, "{algorithm:?}: call {n}");
            assert_eq!(o.decision.limit, 4, "{algorithm:?}");
        }
        let o = charge_post_paid_claimed(&mut state, now, &second, 1, 6);
        assert!(
            !o.decision.allowed,
            "{algorithm:?}: past the limit less the claim"
        );
        // Recorded: without the claim, 5 of 10 are spent.
        let o = charge_post_paid_claimed(&mut state, now, &second, 5, 0);
        assert!(o.decision.allowed, "{algorithm:?}");
        let o = charge_post_paid_claimed(&mut state, now, &second, 1, 0);
        assert!(!o.decision.allowed, "{algorithm:?}: 11 of 10");
        // All of it claimed: answered as a zero limit, recorded all the same.
        let mut state = State::empty(algorithm);
        let o = charge_post_paid_claimed(&mut state, now, &second, 3, 10);
        assert!(!o.decision.allowed, "{algorithm:?}");
        let o = charge_post_paid_claimed(&mut state, now, &second, 8, 0);
        assert!(!o.decision.allowed, "{algorithm:?}: 3 recorded + 8 > 10");
    }
}

/// A gateway that reports into a second RLS spent reserves its part (`share::report`): granted
/// nothing until the reservation has stood a window, it admits nothing more in that second,
/// and the next second is shared. (Granting the reservation at once let it admit its part on
/// top of the spent second: 15 in one second of 10 and its bucket of 2.)
#[test]
fn a_reservation_is_not_granted_into_the_window_rls_spent() {
    // A step of 4000 units is 100 ms on a second's window.
    let rls = |calls: u8| (0u8, calls - 1, 0u32);
    let mut steps = vec![(0, 0, 4_000), rls(4), rls(4), rls(2)];
    // Reports at 0.2 s and 0.3 s, then traffic through the rest of the second and the next.
    steps.extend([(3, 0, 4_000), (3, 0, 4_000)]);
    steps.extend(std::iter::repeat_n((2, 0, 2_000), 30));
    steps.extend([(3, 0, 4_000), (0, 3, 0)]);
    steps.extend(std::iter::repeat_n((2, 0, 2_000), 30));
    for (admitted, allowance) in run_shared(1, 10, 1, &steps) {
        assert!(admitted <= allowance, "{admitted} > {allowance}");
    }
}

proptest! {
    /// Over every window of the rule, on second, minute, hour and day windows, with RLS bursts,
    /// gateway traffic, reports and streams that end interleaved at random: RLS admissions and
    /// gateway admissions together never pass the limit by more than one fill per gateway per
    /// assignment it held there.
    #[test]
    fn rls_and_gateways_together_stay_within_the_window(
        unit in 0usize..4,
        requests in 1u64..400,
        gateways in 1usize..4,
        steps in proptest::collection::vec((0u8..8, 0u8..4, 0u32..2_000), 1..600),
    ) {
        let window_s = [1, 60, 3600, 86_400][unit];
        for (admitted, allowance) in run(window_s, requests, gateways, &steps) {
            prop_assert!(admitted <= allowance, "{admitted} > {allowance}");
        }
    }
}
