//! Each algorithm against a brute-force model written differently (an event log, exact token
//! arithmetic), over random hit sequences and clock steps; plus the sliding window's guarantee
//! checked directly on the admitted hits.

use proptest::prelude::*;

use super::sliding_window::{SLOTS, SUB_WINDOWS, sub_window_us};
use super::{Algorithm, Decision, Limit, State, apply, us};

/// Realistic epoch start (Redis TIME and the host clock are far from zero).
pub(super) const EPOCH_US: u64 = 1_763_000_000_000_000;

fn limit_strategy(algorithm: Algorithm) -> impl Strategy<Value = Limit> {
    (1u64..40, 10u64..3_000_000, 1u64..60).prop_map(move |(requests, window_us, burst)| Limit {
        algorithm,
        requests,
        window_us,
        burst: if algorithm == Algorithm::TokenBucket {
            burst
        } else {
            requests
        },
    })
}

/// (clock step in us, hits) pairs; steps are scaled to the window so that windows both fill and
/// drain within one sequence.
fn calls() -> impl Strategy<Value = Vec<(u64, u64)>> {
    prop::collection::vec((0u64..1_000, 0u64..8), 1..120)
}

fn step_us(limit: &Limit, step: u64) -> u64 {
    // Many calls land in the same instant; others jump up to two windows.
    if step < 400 {
        0
    } else {
        limit.window_us * (step - 400) / 300
    }
}

// ---- sliding window ----

struct SlidingModel {
    admitted: Vec<(u64, u64)>,
}

impl SlidingModel {
    fn counted(&self, limit: &Limit, bucket: u64) -> u64 {
        let g = sub_window_us(limit.window_us);
        self.admitted
            .iter()
            .filter(|(t, _)| t / g + SUB_WINDOWS >= bucket)
            .map(|(_, h)| h)
            .sum()
    }

    fn check(&mut self, now: u64, limit: &Limit, hits: u64) -> Decision {
        let g = sub_window_us(limit.window_us);
        let bucket = now / g;
        let used = self.counted(limit, bucket);
        let allowed = used + hits <= limit.requests;
        if allowed && hits > 0 {
            self.admitted.push((now, hits));
        }
        let used = self.counted(limit, bucket);
        let reset_after = self
            .admitted
            .iter()
            .filter(|(t, _)| t / g + SUB_WINDOWS >= bucket)
            .map(|(t, _)| (t / g + SLOTS as u64) * g - now)
            .max()
            .unwrap_or(0);
        let retry_after = (!allowed && hits <= limit.requests).then(|| {
            let k = (1..=SLOTS as u64)
                .find(|k| self.counted(limit, bucket + k) + hits <= limit.requests)
                .expect("everything has left the window after SLOTS sub-windows");
            us((bucket + k) * g - now)
        });
        Decision {
            allowed,
            limit: limit.requests,
            remaining: limit.requests - used,
            reset_after: us(reset_after),
            retry_after,
            by_failure_mode: false,
            lease: None,
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn sliding_window_agrees_with_the_event_log_model(limit in limit_strategy(Algorithm::SlidingWindow), calls in calls()) {
        let mut state = State::empty(limit.algorithm);
        let mut model = SlidingModel { admitted: Vec::new() };
        let mut now = EPOCH_US;
        for (step, hits) in calls {
            now += step_us(&limit, step);
            let got = apply(&mut state, now, &limit, hits).decision;
            let want = model.check(now, &limit, hits);
            prop_assert_eq!(got, want, "at {} with {} hits", now, hits);
        }
    }

    /// The guarantee users rely on: over ANY interval of one window, at most the limit is
    /// admitted; and a denial is only ever justified by hits within one window plus one
    /// sub-window (the documented, bounded under-admission).
    #[test]
    fn sliding_window_never_over_admits_and_under_admits_boundedly(limit in limit_strategy(Algorithm::SlidingWindow), calls in calls()) {
        let mut state = State::empty(limit.algorithm);
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        let mut now = EPOCH_US;
        let g = sub_window_us(limit.window_us);
        for (step, hits) in calls {
            now += step_us(&limit, step);
            let decision = apply(&mut state, now, &limit, hits).decision;
            let within = |admitted: &[(u64, u64)], span: u64| -> u64 {
                admitted.iter().filter(|(t, _)| *t + span > now).map(|(_, h)| h).sum()
            };
            if decision.allowed {
                admitted.push((now, hits));
                // Any interval of one window ending now (the last admission in it).
                prop_assert!(within(&admitted, limit.window_us) <= limit.requests);
            } else if hits <= limit.requests {
                // Hits are counted for at most SLOTS sub-windows.
                let recent = within(&admitted, SLOTS as u64 * g);
                prop_assert!(recent + hits > limit.requests,
                    "denied although the last SLOTS sub-windows held only {}", recent);
            }
        }
    }
}

/// The sliding window forgets a hit within 1/60 of its unit past the unit, for the units rules
/// use: a minute's hits are gone after 61 s, a second's after 1.02 s.
#[test]
fn the_sliding_window_forgets_within_a_sixtieth_of_its_unit() {
    for (window_us, most_us) in [
        (1_000_000, 1_020_000),
        (60_000_000, 61_000_000),
        (3_600_000_000, 3_660_000_000),
        (86_400_000_000, 87_840_000_000),
    ] {
        let g = sub_window_us(window_us);
        assert!(SUB_WINDOWS * g >= window_us, "every window is covered");
        assert!(
            SLOTS as u64 * g <= most_us,
            "{window_us}: forgotten after {}",
            SLOTS as u64 * g
        );
    }
}

// ---- token bucket ----

/// Tokens as an exact rational: `scaled = tokens * window_us`, refilled by `requests` per us.
struct BucketModel {
    scaled: u128,
    at: u64,
}

impl BucketModel {
    fn check(&mut self, now: u64, limit: &Limit, hits: u64) -> Decision {
        let w = u128::from(limit.window_us);
        let rate = u128::from(limit.requests);
        let full = u128::from(limit.burst) * w;
        self.scaled = (self.scaled + u128::from(now - self.at) * rate).min(full);
        self.at = now;
        let cost = u128::from(hits) * w;
        let allowed = cost <= self.scaled;
        if allowed {
            self.scaled -= cost;
        }
        let retry_after = (!allowed && hits <= limit.burst)
            .then(|| us(((cost - self.scaled).div_ceil(rate) as u64).max(1)));
        Decision {
            allowed,
            limit: limit.burst,
            remaining: (self.scaled / w) as u64,
            reset_after: us((full - self.scaled).div_ceil(rate) as u64),
            retry_after,
            by_failure_mode: false,
            lease: None,
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn token_bucket_agrees_with_exact_token_arithmetic(limit in limit_strategy(Algorithm::TokenBucket), calls in calls()) {
        let mut state = State::empty(limit.algorithm);
        let mut model = BucketModel { scaled: u128::from(limit.burst) * u128::from(limit.window_us), at: EPOCH_US };
        let mut now = EPOCH_US;
        for (step, hits) in calls {
            now += step_us(&limit, step);
            let got = apply(&mut state, now, &limit, hits).decision;
            let want = model.check(now, &limit, hits);
            prop_assert_eq!(got, want, "at +{} us with {} hits", now - EPOCH_US, hits);
        }
    }
}

// ---- fixed window ----

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn fixed_window_agrees_with_a_counter_per_window(limit in limit_strategy(Algorithm::FixedWindow), calls in calls()) {
        let mut state = State::empty(limit.algorithm);
        let mut counts = std::collections::HashMap::<u64, u64>::new();
        let mut now = EPOCH_US;
        for (step, hits) in calls {
            now += step_us(&limit, step);
            let got = apply(&mut state, now, &limit, hits).decision;
            let window = now / limit.window_us;
            let count = counts.entry(window).or_default();
            let allowed = *count + hits <= limit.requests;
            if allowed {
                *count += hits;
            }
            let ends_in = (window + 1) * limit.window_us - now;
            let want = Decision {
                allowed,
                limit: limit.requests,
                remaining: limit.requests - *count,
                reset_after: us(ends_in),
                retry_after: (!allowed && hits <= limit.requests).then(|| us(ends_in.max(1))),
                by_failure_mode: false,
                lease: None,
            };
            prop_assert_eq!(got, want);
        }
    }
}
