//! A claim's own rules: spendable only until the end of the period its hits were counted in
//! (as the store's answer tells it, from before the take was sent), sized to the replica's
//! rate and a quarter of what is left, spent earliest first.

use super::*;
use crate::algorithm::{State, apply};

fn limit(algorithm: Algorithm, requests: u64, window_us: u64) -> Limit {
    Limit {
        algorithm,
        requests,
        window_us,
        burst: requests,
    }
}

/// A claim of `hits` taken at `at_us` on the model (sent at `sent_us`): where it may be spent
/// until.
fn taken(l: Limit, hits: u64, sent_us: u64, at_us: u64) -> Claim {
    let mut state = State::empty(l.algorithm);
    let outcome = apply(&mut state, at_us, &l, hits);
    let mut claim = Claim::new(l, sent_us);
    assert!(claim.took(sent_us, hits, &outcome.decision, at_us));
    claim
}

#[test]
fn a_fixed_windows_claim_ends_with_its_window_counted_from_the_send() {
    let l = limit(Algorithm::FixedWindow, 100, 60_000_000);
    // Counted at 59.5 s of a window, sent 2 ms before: spendable until 2 ms + 1 ms before
    // the window's end on our clock.
    let window = 1_000 * l.window_us;
    let claim = taken(l, 10, window + 59_498_000, window + 59_500_000);
    assert_eq!(
        claim.chunks[0].until_us,
        window + l.window_us - 2_000 - MARGIN_US
    );
}

#[test]
fn a_sliding_windows_claim_ends_with_its_sub_window() {
    let l = limit(Algorithm::SlidingWindow, 600, 1_000_000);
    let sub = sliding_window::sub_window_us(l.window_us);
    let start = 1_000_000 * sub;
    let claim = taken(l, 10, start + 3_000, start + 4_000);
    assert_eq!(claim.chunks[0].until_us, start + sub - 1_000 - MARGIN_US);
    assert_eq!(claim.boundary_us, Some(start + sub - 1_000));
}

#[test]
fn a_buckets_claim_is_tokens_drawn_spendable_later() {
    let l = limit(Algorithm::TokenBucket, 100, 1_000_000);
    let mut claim = taken(l, 10, 5_000_000, 5_000_000);
    assert_eq!(claim.expire(5_900_000), 0);
    assert!(claim.spend(10));
    assert!(!claim.spend(1));
}

#[test]
fn claims_are_sized_to_the_rate_and_a_quarter_of_what_is_left() {
    let l = limit(Algorithm::FixedWindow, 1_000, 60_000_000);
    let mut claim = Claim::new(l, 0);
    // 100 hits in the first 50 ms: 2,000 a second.
    for t in 0..100 {
        claim.note_hits(t * 500, 1);
    }
    assert_eq!(claim.wanted(50_000, 10.0), None, "no rate measured yet");
    claim.note_hits(50_000, 1);
    // A quarter of 50 ms of 2,000 a second (the rest in further claims), within a quarter of
    // the counter's limit (what it has left is not known yet).
    assert_eq!(claim.wanted(50_000, 10.0), Some(25));
    assert_eq!(claim.wanted(50_000, 5_000.0), None, "below the hot rate");
    // The store said 40 are left: a quarter of them.
    let mut state = State::empty(l.algorithm);
    let outcome = apply(&mut state, 50_000, &l, 960);
    claim.learn(50_000, &outcome.decision);
    assert_eq!(claim.wanted(50_000, 10.0), Some(10));
    // 7 left: less than two a quarter, every call goes to the store.
    let outcome = apply(&mut state, 50_000, &l, 33);
    claim.learn(50_000, &outcome.decision);
    assert_eq!(claim.wanted(50_000, 10.0), None);
}

#[test]
fn the_earliest_claim_is_spent_first_and_an_ended_one_lapses() {
    let l = limit(Algorithm::FixedWindow, 1_000, 1_000_000);
    let mut claim = taken(l, 4, 1_000_100_000, 1_000_100_000);
    // A second claim in the next window.
    let mut state = State::empty(l.algorithm);
    let next = apply(&mut state, 1_001_100_000, &l, 6).decision;
    assert!(claim.took(1_001_100_000, 6, &next, 1_001_100_000));
    assert!(claim.spend(3));
    assert_eq!(
        claim.chunks[0].hits, 1,
        "the first window's claim spent first"
    );
    assert_eq!(
        claim.expire(1_001_000_000),
        1,
        "its window ended: one hit lapses"
    );
    assert_eq!(claim.available(), 6);
}
