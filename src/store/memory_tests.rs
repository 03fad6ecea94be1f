//! The memory store's own tests: the cap, the sweep, all or nothing with one descriptor twice.

use super::*;
use crate::algorithm::{Algorithm, Limit};
use crate::clock::ManualClock;

fn check(key: String, algorithm: Algorithm) -> Check {
    Check {
        key,
        limit: Limit {
            algorithm,
            requests: 10,
            window_us: 60_000_000,
            burst: 10,
        },
        hits: 1,
        refund: false,
        post_paid: false,
    }
}

#[test]
fn one_descriptor_twice_in_an_all_or_nothing_call_is_charged_whole_or_not_at_all() {
    let store = MemoryStore::new(Arc::new(ManualClock::new(1_763_000_000_000_000)));
    for algorithm in [
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
    ] {
        let mut once = check(format!("{{d|twice={algorithm:?}}}"), algorithm);
        once.hits = 6;
        // 6 + 6 of 10: each fits alone, not together.
        let call = [once.clone(), once.clone()];
        let answers = store.check_all_at(&call, 1_763_000_000_000_000, ChargeMode::AllOrNothing);
        assert!(!answers[1].as_ref().unwrap().allowed, "{algorithm:?}");
        let looked = store.check_all_at(&call[..1], 1_763_000_000_000_000, ChargeMode::Probe);
        assert_eq!(
            looked[0].as_ref().unwrap().remaining,
            10,
            "{algorithm:?} uncharged"
        );
    }
}

#[test]
fn idle_descriptors_are_swept_so_memory_follows_live_traffic() {
    let clock = ManualClock::new(1_763_000_000_000_000);
    let store = MemoryStore::with_max_counters(Arc::new(clock.clone()), 1_000_000);
    let algorithms = [
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
    ];
    for i in 0..300_000u32 {
        let c = check(format!("{{d|ip={i}}}"), algorithms[i as usize % 3]);
        store.check_at(&c, clock.now_us()).unwrap();
    }
    assert_eq!(store.len(), 300_000);
    // Nothing has expired yet: a sweep keeps every live counter.
    assert_eq!(store.sweep(), 0);
    // One window and a sub-window later every counter is back to empty and goes.
    clock.advance_us(61_000_001);
    let live = check("{d|ip=live}".into(), Algorithm::SlidingWindow);
    store.check_at(&live, clock.now_us()).unwrap();
    assert_eq!(store.sweep(), 300_000);
    assert_eq!(store.len(), 1, "only the descriptor still in use remains");
}

#[test]
fn concurrent_checks_on_one_key_admit_exactly_the_limit() {
    let store = MemoryStore::new(Arc::new(ManualClock::new(1_763_000_000_000_000)));
    let admitted = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|scope| {
        for _ in 0..8 {
            scope.spawn(|| {
                for _ in 0..100 {
                    let c = check("{d|k=shared}".into(), Algorithm::SlidingWindow);
                    if store.check_at(&c, 1_763_000_000_000_000).unwrap().allowed {
                        admitted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            });
        }
    });
    assert_eq!(admitted.into_inner(), 10);
}

#[test]
fn a_full_store_refuses_new_counters_and_keeps_the_live_ones() {
    let clock = ManualClock::new(1_763_000_000_000_000);
    let store = MemoryStore::with_max_counters(Arc::new(clock.clone()), SHARDS * 2);
    // Fill it: keys until one is refused.
    let mut counted = Vec::new();
    let refused = (0..10_000u32).find_map(|i| {
        let c = check(format!("{{d|ip={i}}}"), Algorithm::FixedWindow);
        match store.check_at(&c, clock.now_us()) {
            Ok(_) => {
                counted.push(c);
                None
            }
            Err(e) => Some(e),
        }
    });
    let Some(StoreError::Unavailable(why)) = refused else {
        panic!("a full store refuses a new counter: {refused:?}");
    };
    assert!(why.contains("--memory-max-counters"), "{why}");
    assert!(store.len() <= SHARDS * 2);
    // The counters held keep counting: none was evicted to make room.
    for c in &counted {
        let d = store.check_at(c, clock.now_us()).unwrap();
        assert_eq!(d.remaining, 8, "{} kept its count", c.key);
    }
    // Once they expire, new descriptors are counted again.
    clock.advance_us(60_000_001);
    let fresh = check("{d|ip=after}".into(), Algorithm::FixedWindow);
    assert!(store.check_at(&fresh, clock.now_us()).unwrap().allowed);
}

/// Near its cap, an all-or-nothing call whose new counters do not all fit is refused whole (no
/// counter made, nothing charged); refunds and checks of no hits need no room, so a full store
/// still answers them.
#[test]
fn near_its_cap_an_all_or_nothing_call_is_charged_whole_or_not_at_all() {
    let clock = ManualClock::new(1_763_000_000_000_000);
    let store = MemoryStore::with_max_counters(Arc::new(clock.clone()), 2);
    let now = clock.now_us();
    let a = check("{d|k=a}".into(), Algorithm::FixedWindow);
    assert!(store.check_at(&a, now).unwrap().allowed);
    // One place left, two new counters wanted.
    let b = check("{d|k=b}".into(), Algorithm::FixedWindow);
    let c = check("{d|k=c}".into(), Algorithm::FixedWindow);
    let answers = store.check_all_at(&[b.clone(), c.clone()], now, ChargeMode::AllOrNothing);
    assert!(answers.iter().all(|a| a.is_err()), "{answers:?}");
    assert_eq!(store.len(), 1, "no counter made for a refused call");
    // One new counter fits.
    let answers = store.check_all_at(std::slice::from_ref(&b), now, ChargeMode::AllOrNothing);
    assert!(answers[0].as_ref().unwrap().allowed);
    assert_eq!(store.len(), 2);
    // Full: a refund of `a` and a check of no hits on a new key are still answered.
    let refund = Check {
        refund: true,
        ..a.clone()
    };
    let look = Check {
        hits: 0,
        ..c.clone()
    };
    let answers = store.check_all_at(&[refund, look], now, ChargeMode::AllOrNothing);
    assert!(answers.iter().all(|a| a.is_ok()), "{answers:?}");
    // `a` was given back whole (its counter is empty and goes); the look made none.
    assert_eq!(store.len(), 1);
}

/// Concurrency slots count against the cap too (a counter may hold 1000): past as many slots
/// held in all as counters, a new slot is refused as a full store is, and slots released or
/// expired make room again.
#[test]
fn concurrency_slots_held_in_all_are_bounded_by_the_counter_cap() {
    let clock = ManualClock::new(1_763_000_000_000_000);
    let store = MemoryStore::with_max_counters(Arc::new(clock.clone()), 10);
    let slots = |user: &str, hits: u64, refund: bool| Check {
        hits,
        refund,
        ..check(format!("{{d|cc={user}}}"), Algorithm::Concurrency)
    };
    let now = clock.now_us();
    assert!(store.check_at(&slots("a", 8, false), now).unwrap().allowed);
    assert!(store.check_at(&slots("b", 2, false), now).unwrap().allowed);
    // 10 slots held in all: one more is refused by the store, whoever asks.
    assert!(matches!(
        store.check_at(&slots("b", 1, false), now),
        Err(StoreError::Unavailable(_))
    ));
    // Released: room again.
    assert!(store.check_at(&slots("a", 3, true), now).unwrap().allowed);
    assert!(store.check_at(&slots("b", 3, false), now).unwrap().allowed);
    assert!(store.check_at(&slots("c", 1, false), now).is_err());
    // The leases end (60 s, and a millisecond more for each take in the same millisecond as the
    // last): swept, the slots are free.
    clock.advance_us(60_010_000);
    store.sweep();
    assert!(
        store
            .check_at(&slots("c", 10, false), clock.now_us())
            .unwrap()
            .allowed
    );
}
