//! The charge of a report's admissions: capped per window by the claim, in the store's window.
use super::*;
use crate::algorithm::{Algorithm, Limit};

fn layer(algorithm: Algorithm, requests: u64, window_s: u64) -> Check {
    Check {
        key: format!("{{d|t=a}}:{window_s}"),
        limit: Limit {
            algorithm,
            requests,
            window_us: window_s * 1_000_000,
            burst: requests,
        },
        hits: 0,
        refund: false,
        post_paid: false,
    }
}

#[test]
fn admissions_are_charged_up_to_the_claim_in_each_window() {
    const S: u64 = 1_000_000;
    let second = layer(Algorithm::FixedWindow, 10, 1);
    let minute = layer(Algorithm::FixedWindow, 600, 60);
    // 5/s granted from 100 s; reported at 105.5 s having admitted 27.
    let last = Granted {
        rate: 5.0,
        since_us: 100 * S,
        ends_us: 111 * S,
        burst: 0,
    };
    let now = 105 * S + S / 2;
    let none = HashMap::new();
    let charged = charges(&[second, minute], 27, Some(&last), now, &none, 11_000_000);
    // The second [105, 106) holds half a second of it (3, rounded up); the minute all 27.
    assert_eq!(charged.iter().map(|c| c.hits).collect::<Vec<_>>(), [3, 27]);
    assert!(charged.iter().all(|c| c.post_paid && !c.refund));
    // A bucket of 5 may have admitted 5 more in the second: charged too.
    let full = Granted { burst: 5, ..last };
    let charged = charges(
        &[layer(Algorithm::FixedWindow, 10, 1)],
        27,
        Some(&full),
        now,
        &none,
        11_000_000,
    );
    assert_eq!(charged[0].hits, 8);
    // Nothing granted before on this stream: nothing.
    assert!(
        charges(
            &[layer(Algorithm::SlidingWindow, 10, 1)],
            4,
            None,
            now,
            &none,
            11_000_000
        )
        .is_empty()
    );
    assert!(
        charges(
            &[layer(Algorithm::FixedWindow, 10, 1)],
            0,
            None,
            now,
            &none,
            11_000_000
        )
        .is_empty()
    );
}

const SECOND: std::time::Duration = std::time::Duration::from_secs(1);

#[test]
fn a_claim_starts_again_only_once_charged() {
    let t = |n| {
        Some(Tokens {
            per_fill: n,
            every_s: 1,
        })
    };
    let g = after_grant(None, t(4), 2, SECOND, false, 10, 20);
    assert_eq!((g.rate, g.since_us, g.ends_us, g.burst), (4.0, 10, 20, 8));
    let kept = after_grant(Some(g), t(2), 2, SECOND, false, 15, 25);
    assert_eq!((kept.rate, kept.since_us, kept.ends_us), (4.0, 10, 25));
    assert_eq!(kept.burst, 8);
    let again = after_grant(Some(kept), t(2), 1, SECOND, true, 18, 28);
    assert_eq!((again.rate, again.since_us, again.burst), (2.0, 18, 2));
    // The burst charged past the claim is the bucket Envoy was sent (its span of the share).
    let short = std::time::Duration::from_millis(200);
    assert_eq!(after_grant(None, t(10), 2, short, false, 10, 20).burst, 4);
}

#[test]
fn a_fixed_windows_charge_is_capped_in_the_stores_window_not_the_hosts() {
    const S: u64 = 1_000_000;
    let second = layer(Algorithm::FixedWindow, 10, 1);
    // 5/s granted from 100.9 s (this host's clock); reported at 101.2 s.
    let last = Granted {
        rate: 5.0,
        since_us: 100 * S + 9 * S / 10,
        ends_us: 111 * S,
        burst: 0,
    };
    let now = 101 * S + S / 5;
    // By this host's clock the second began at 101 s: 0.2 s of the claim, 1 request.
    let by_host = charges(
        std::slice::from_ref(&second),
        27,
        Some(&last),
        now,
        &HashMap::new(),
        11_000_000,
    );
    assert_eq!(by_host[0].hits, 1);
    // The store's second ends 0.3 s after a look sent at 101.2 s: it began at 100.5 s (this
    // host's clock runs 0.5 s ahead of the store's), and holds 0.3 s of the claim, 2 requests.
    let look = crate::algorithm::Decision {
        allowed: true,
        limit: 10,
        remaining: 10,
        reset_after: std::time::Duration::from_millis(300),
        retry_after: None,
        by_failure_mode: false,
        lease: None,
    };
    let start = window_start(&second, &look, now).unwrap();
    assert_eq!(start, 100 * S + S / 2);
    let starts = HashMap::from([(second.key.clone(), start)]);
    let by_store = charges(
        std::slice::from_ref(&second),
        27,
        Some(&last),
        now,
        &starts,
        11_000_000,
    );
    assert_eq!(by_store[0].hits, 2);
    // A look the store did not answer says nothing.
    let failed = crate::algorithm::Decision {
        by_failure_mode: true,
        ..look
    };
    assert_eq!(window_start(&second, &failed, now), None);
}

/// The look after a charge reads a window's count signed, past its limit too, whatever the
/// claims the store counts on it (decided as the stores decide: `apply_claimed`); a count past
/// even the raised limit reads as far below zero (nothing is granted).
#[test]
fn a_look_reads_the_windows_count_signed_whatever_the_claims() {
    use crate::algorithm::{State, apply, apply_claimed};
    const NOW: u64 = 100_000_000;
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
        let second = layer(algorithm, 10, 1);
        let looked = look(&second);
        assert_eq!(looked.limit.requests, 161);
        assert_eq!((looked.hits, looked.refund), (0, false));
        for (count, claimed) in [
            (0, 0),
            (4, 3),
            (12, 0),
            (9, 8),
            (30, 20),
            (150, 10),
            (160, 5),
        ] {
            let mut state = State::empty(algorithm);
            let wide = Limit {
                requests: 1_000,
                burst: 1_000,
                ..second.limit
            };
            assert!(apply(&mut state, NOW, &wide, count).decision.allowed);
            let decision = apply_claimed(&mut state, NOW, &looked.limit, 0, claimed).decision;
            let want = if count + claimed >= 161 {
                i64::MIN / 4
            } else {
                10 - count as i64
            };
            assert_eq!(
                left_of(&second, &decision),
                want,
                "{algorithm:?}: {count} counted, {claimed} claimed: {decision:?}"
            );
        }
    }
}

/// A stream's first report (no grant on it yet): nothing into a window (what it admitted is the
/// filter's own, or the old stream's claim's, which a window forgets before that claim goes);
/// into a token bucket what it admitted, at most its burst and its rate over an assignment's
/// life (a bucket kept drained by RLS would owe it after the claim goes, issue 43).
#[test]
fn a_streams_first_report_charges_only_its_token_buckets() {
    let none = HashMap::new();
    let now = 100_000_000;
    let windows = [
        layer(Algorithm::FixedWindow, 10, 1),
        layer(Algorithm::SlidingWindow, 600, 60),
    ];
    assert!(charges(&windows, 27, None, now, &none, 11_000_000).is_empty());
    // 24 a minute, burst 24: at most 24 + 0.4/s over 11 s (5).
    let bucket = layer(Algorithm::TokenBucket, 24, 60);
    let charged = charges(
        &[windows[0].clone(), bucket.clone()],
        27,
        None,
        now,
        &none,
        11_000_000,
    );
    assert_eq!(charged.len(), 1, "{charged:?}");
    assert_eq!(
        (charged[0].key.as_str(), charged[0].hits),
        (bucket.key.as_str(), 27)
    );
    assert!(charged[0].post_paid);
    let most = charges(
        std::slice::from_ref(&bucket),
        1_000,
        None,
        now,
        &none,
        11_000_000,
    );
    assert_eq!(most[0].hits, 24 + 5);
}
