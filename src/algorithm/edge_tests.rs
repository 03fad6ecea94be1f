//! Edges every algorithm must survive, whatever the model says: huge costs and zero limits, a
//! clock stepping back, refunds, post-paid charges past the limit, counters a reload left over.

use proptest::prelude::*;

use super::model_tests::EPOCH_US;
use super::{Algorithm, Limit, State, apply, refund, us};

#[test]
fn huge_costs_and_zero_limits_answer_without_panicking() {
    for algorithm in [
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
    ] {
        for (requests, window_us, burst) in [
            (1, 1_000_000, 1),
            (
                u64::from(u32::MAX),
                365 * 86_400 * 1_000_000,
                u64::from(u32::MAX),
            ),
            (1, 365 * 86_400 * 1_000_000, u64::from(u32::MAX)),
            (0, 1_000_000, 1),
        ] {
            let limit = Limit {
                algorithm,
                requests,
                window_us,
                burst,
            };
            let mut state = State::empty(algorithm);
            for hits in [u64::MAX, u64::MAX / 2, 1 << 40, 0, 1] {
                let d = apply(&mut state, EPOCH_US, &limit, hits).decision;
                if hits > limit.capacity() {
                    assert!(
                        !d.allowed,
                        "{algorithm} admitted {hits} over capacity {}",
                        limit.capacity()
                    );
                    assert_eq!(
                        d.retry_after, None,
                        "waiting never helps a request over capacity"
                    );
                }
            }
        }
    }
}

#[test]
fn a_clock_stepping_back_never_returns_budget() {
    for algorithm in [
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
    ] {
        let limit = Limit {
            algorithm,
            requests: 3,
            window_us: 60_000_000,
            burst: 3,
        };
        let mut state = State::empty(algorithm);
        let t = EPOCH_US + 59_999_999;
        for _ in 0..3 {
            assert!(apply(&mut state, t, &limit, 1).decision.allowed);
        }
        // 50 s back in time: still the same budget, all spent.
        assert!(
            !apply(&mut state, t - 50_000_000, &limit, 1)
                .decision
                .allowed,
            "{algorithm}"
        );
    }
}

proptest! {
    /// A refund gives back what was spent, and never more: refunding all that was admitted at
    /// one instant leaves a full counter; refunding more still leaves it full, never above; and
    /// the budget refunded can be spent again at once (nothing is admitted retroactively).
    #[test]
    fn refunds_give_back_what_was_spent_and_never_more(
        algorithm in prop::sample::select(vec![
            Algorithm::SlidingWindow,
            Algorithm::TokenBucket,
            Algorithm::FixedWindow,
        ]),
        requests in 1u64..50,
        charges in prop::collection::vec(1u64..6, 1..20),
        extra in 0u64..100,
    ) {
        let limit = Limit {
            algorithm,
            requests,
            window_us: 60_000_000,
            burst: requests,
        };
        let now = EPOCH_US + 1_234_567;
        let mut state = State::empty(algorithm);
        let mut spent = 0;
        for hits in charges {
            if apply(&mut state, now, &limit, hits).decision.allowed {
                spent += hits;
            }
        }
        let after = refund(&mut state, now, &limit, spent + extra).decision;
        prop_assert!(after.allowed);
        prop_assert_eq!(after.remaining, limit.capacity(), "a full counter again");
        // Spending the whole capacity again passes; one more hit does not.
        prop_assert!(apply(&mut state, now, &limit, limit.capacity()).decision.allowed);
        prop_assert!(!apply(&mut state, now, &limit, 1).decision.allowed);
    }
}

/// Post-paid costs (an LLM's tokens charged when Envoy's stream is done): 100 a minute, 40 a
/// response. The third charge does not fit and is recorded all the same; every check after it,
/// check-only included, is refused until the counter drains within the limit; a refund brings
/// it back within at once. Without `post_paid` that third charge would leave nothing recorded
/// and every request would pass for ever.
#[test]
fn post_paid_charges_are_recorded_past_the_limit_and_refuse_until_drained() {
    use super::{Check, run};
    for algorithm in [
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
    ] {
        let limit = Limit {
            algorithm,
            requests: 100,
            window_us: 60_000_000,
            burst: 100,
        };
        // The start of a fixed window, so all of this happens in one.
        let start = EPOCH_US - EPOCH_US % 60_000_000;
        let check = |hits: u64, refund: bool| Check {
            key: "k".into(),
            limit,
            hits,
            refund,
            post_paid: true,
        };
        let mut state = State::empty(algorithm);
        let mut admitted_requests = 0;
        for request in 0..10 {
            let now = start + request * 1_000;
            if !run(&mut state, now, &check(0, false), true)
                .decision
                .allowed
            {
                break;
            }
            admitted_requests += 1;
            let charged = run(&mut state, now + 500, &check(40, false), true).decision;
            // The answer still says whether the charge fitted.
            assert_eq!(
                charged.allowed,
                request < 2,
                "{algorithm}: charge {request}"
            );
        }
        assert_eq!(
            admitted_requests, 3,
            "{algorithm}: the fourth request is refused"
        );
        let now = start + 5_000;
        let refused = run(&mut state, now, &check(0, false), true).decision;
        assert!(!refused.allowed, "{algorithm}");
        assert_eq!(refused.remaining, 0, "{algorithm}");
        let wait = refused.retry_after.expect("a wait that helps");
        assert!(
            wait > us(0) && wait <= us(61_000_000),
            "{algorithm}: {wait:?}"
        );
        // Once the wait is over a check passes again.
        let later = now + wait.as_micros() as u64;
        assert!(
            run(&mut state.clone(), later, &check(0, false), true)
                .decision
                .allowed,
            "{algorithm}: after {wait:?}"
        );
        // A refund of what was not used brings the counter within the limit at once.
        let back = run(&mut state, now, &check(40, true), true).decision;
        assert!(back.allowed, "{algorithm}");
        assert!(
            run(&mut state, now, &check(0, false), true)
                .decision
                .allowed,
            "{algorithm}: 80 of 100 after the refund"
        );
    }
}

/// Without `post_paid`, a counter a reload left past its limit refuses a check-only call too.
#[test]
fn a_counter_past_its_limit_refuses_a_check_only_call() {
    for algorithm in [Algorithm::SlidingWindow, Algorithm::FixedWindow] {
        let big = Limit {
            algorithm,
            requests: 10,
            window_us: 60_000_000,
            burst: 10,
        };
        let small = Limit {
            requests: 5,
            burst: 5,
            ..big
        };
        let now = EPOCH_US - EPOCH_US % 60_000_000;
        let mut state = State::empty(algorithm);
        assert!(apply(&mut state, now, &big, 8).decision.allowed);
        assert!(
            !apply(&mut state, now, &small, 0).decision.allowed,
            "{algorithm}"
        );
    }
}
