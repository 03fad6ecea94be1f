//! Hot counters decided from claims, against the memory store (the model) on a manual clock:
//! three replicas offered ten times the limit never pass it over any window, and admit nearly
//! all of it; quiet counters give their claims back; counters RLQS gateways hold are left to
//! the store.

use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::give_back::QUIET_US;
use super::*;
use crate::algorithm::{Algorithm, Limit};
use crate::clock::ManualClock;
use crate::store::MemoryStore;
use crate::store::hot_claim::HORIZON_US;

const START_US: u64 = 1_763_000_000_000_000;

struct Replicas {
    clock: ManualClock,
    memory: Arc<MemoryStore>,
    hot: Vec<HotStore>,
    metrics: Arc<HotMetrics>,
    /// Takes and give-backs are answered once the clock reaches this (counted at once).
    answer_at: Arc<std::sync::atomic::AtomicU64>,
}

/// The memory store, whose answers to the replicas' own calls (takes, give-backs: spawned
/// tasks) reach them late, as Redis' do: counted at once, read once the clock has reached
/// `answer_at`. Calls of the test itself are answered at once.
struct LateAnswers {
    memory: Arc<MemoryStore>,
    clock: ManualClock,
    answer_at: Arc<std::sync::atomic::AtomicU64>,
}

impl Store for LateAnswers {
    fn check<'a>(&'a self, checks: &'a [Check], d: Instant, mode: ChargeMode) -> StoreFuture<'a> {
        Box::pin(async move {
            let answers = self.memory.check(checks, d, mode).await;
            while tokio::task::try_id().is_some()
                && self.clock.now_us() < self.answer_at.load(std::sync::atomic::Ordering::Relaxed)
            {
                tokio::task::yield_now().await;
            }
            answers
        })
    }

    fn name(&self) -> &'static str {
        "late memory"
    }
}

fn replicas(n: usize, rate: f64, tally: Option<Arc<RlsTally>>) -> Replicas {
    let clock = ManualClock::new(START_US);
    let memory = MemoryStore::new(Arc::new(clock.clone()));
    let metrics = Arc::new(HotMetrics::default());
    let answer_at = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let hot = (0..n)
        .map(|_| {
            HotStore::new(
                Arc::new(LateAnswers {
                    memory: memory.clone(),
                    clock: clock.clone(),
                    answer_at: answer_at.clone(),
                }),
                Arc::new(clock.clone()),
                HotConfig {
                    rate,
                    store_timeout: Duration::from_secs(1),
                },
                tally.clone(),
                metrics.clone(),
            )
        })
        .collect();
    Replicas {
        clock,
        memory,
        hot,
        metrics,
        answer_at,
    }
}

fn charge(key: &str, limit: Limit, hits: u64) -> Check {
    Check {
        key: key.to_owned(),
        limit,
        hits,
        refund: false,
        post_paid: false,
    }
}

async fn call(hot: &HotStore, check: &Check) -> Decision {
    call_within(hot, check, Duration::from_millis(2)).await
}

/// A call with `within` to its deadline: one waiting for a claim being taken waits half of it,
/// in real time (the memory store answers at once; the manual clock stands still meanwhile).
async fn call_within(hot: &HotStore, check: &Check, within: Duration) -> Decision {
    let deadline = Instant::now() + within;
    hot.check(std::slice::from_ref(check), deadline, ChargeMode::EachAlone)
        .await
        .remove(0)
        .expect("the memory store answers")
}

/// Admissions (time, hits) of one run: three replicas offered `offered` times the limit's rate
/// (in spells, some slow), in calls of 1 to 3 hits, for `windows` windows; takes answered at
/// once or left in flight for a while, sweeps now and then, and quiet spells.
async fn run(
    limit: Limit,
    offered: f64,
    windows: u64,
    seed: u64,
    spells: bool,
) -> (Vec<(u64, u64)>, Replicas) {
    let mut rng = StdRng::seed_from_u64(seed);
    let rate = limit.per_second();
    // Hot at a tenth of each replica's share of what is offered.
    let r = replicas(3, rate * offered / 3.0 / 10.0, None);
    let key = "{d|hot=1}";
    let end = START_US + windows * limit.window_us;
    // Mean gap between calls: 2 hits a call on average.
    let gap_us = (2.0 * 1e6 / (rate * offered)) as u64;
    let mut admitted = Vec::new();
    // With `spells`, traffic comes in spells of 50 ms to 1 s: mostly `offered` times the rate,
    // sometimes a 500th of that, where claims taken in a burst linger and are spent late (or given back).
    let mut spell = (START_US, 1);
    let mut held_until = START_US;
    while r.clock.now_us() < end {
        if r.clock.now_us() >= spell.0 {
            let len = rng.random_range(HORIZON_US..=20 * HORIZON_US);
            spell = (
                r.clock.now_us() + len,
                if spells && rng.random_bool(0.3) {
                    500
                } else {
                    1
                },
            );
        }
        r.clock
            .advance_us(rng.random_range(0..=2 * gap_us * spell.1));
        if rng.random_bool(0.002) {
            // A quiet spell: the claims are given back at the next sweep.
            r.clock.advance_us(rng.random_range(0..=3 * HORIZON_US));
        }
        let hot = &r.hot[rng.random_range(0..r.hot.len())];
        let hits = rng.random_range(1..=3);
        // While answers are held back, a call waiting for a claim would wait for nothing.
        let within = if r.clock.now_us() < held_until {
            Duration::ZERO
        } else {
            Duration::from_millis(2)
        };
        let decision = call_within(hot, &charge(key, limit, hits), within).await;
        if decision.allowed {
            admitted.push((r.clock.now_us(), hits));
        }
        // The takes it started are sent and counted now (their answers may come late).
        tokio::task::yield_now().await;
        // Takes answered at once, or a while later (the clock moves on meanwhile): now and
        // then up to 30 ms later, across a sub-window's end or a window's.
        if r.clock.now_us() >= held_until && rng.random_bool(0.05) {
            held_until = r.clock.now_us() + rng.random_range(0..30_000);
            // Counted now, answered then.
            r.answer_at
                .store(held_until, std::sync::atomic::Ordering::Relaxed);
        }
        if r.clock.now_us() >= held_until && rng.random_bool(0.7) {
            for h in &r.hot {
                h.settle().await;
            }
        }
        if rng.random_bool(0.02) {
            hot.sweep(false).await;
        }
    }
    (admitted, r)
}

fn limit(algorithm: Algorithm, requests: u64, window_s: u64) -> Limit {
    Limit {
        algorithm,
        requests,
        window_us: window_s * 1_000_000,
        burst: requests,
    }
}

/// The most admitted within any span the algorithm bounds: a fixed window's window, any
/// sliding `W`, a bucket's burst plus its refill over the span.
fn assert_within(limit: &Limit, admitted: &[(u64, u64)], what: &str) {
    let w = limit.window_us;
    match limit.algorithm {
        Algorithm::FixedWindow => {
            let mut per: std::collections::BTreeMap<u64, u64> = Default::default();
            for (t, h) in admitted {
                *per.entry(t / w).or_default() += h;
            }
            for (win, n) in per {
                assert!(n <= limit.requests, "{what}: window {win}: {n} admitted");
            }
        }
        Algorithm::SlidingWindow => {
            let (mut from, mut sum) = (0, 0);
            for (t, h) in admitted {
                sum += h;
                while admitted[from].0 + w <= *t {
                    sum -= admitted[from].1;
                    from += 1;
                }
                assert!(
                    sum <= limit.requests,
                    "{what}: {sum} admitted in the W to {t}"
                );
            }
        }
        _ => {
            // sum(i..=j) <= burst + rate * (t_j - t_i), for every i <= j.
            let rate = limit.requests as f64 / w as f64;
            let (mut before, mut least) = (0.0f64, f64::INFINITY);
            for (t, h) in admitted {
                least = least.min(before - rate * *t as f64);
                before += *h as f64;
                let over = before - rate * *t as f64 - least;
                assert!(
                    over <= limit.burst as f64 + 1e-6,
                    "{what}: {over} admitted past the refill up to {t}"
                );
            }
        }
    }
}

/// What the stated bound leaves at least: per whole window (a fixed window's, an aligned `W`
/// of a sliding one, which forgets a hit up to a sub-window late), the limit less `bound`; a
/// bucket over the run, its burst and refill less `bound`.
fn assert_floor(limit: &Limit, admitted: &[(u64, u64)], windows: u64, bound: u64, what: &str) {
    let w = limit.window_us;
    if limit.algorithm == Algorithm::TokenBucket {
        let total: u64 = admitted.iter().map(|a| a.1).sum();
        let refill = limit.requests as f64 * (windows * w) as f64 / w as f64;
        let least = (limit.burst as f64 + refill) as u64 - bound;
        assert!(
            total >= least,
            "{what}: {total} admitted, less than {least}"
        );
        return;
    }
    let at_least = match limit.algorithm {
        Algorithm::SlidingWindow => limit.requests * 60 / 61,
        _ => limit.requests,
    }
    .saturating_sub(bound);
    let first = START_US / w + 1;
    let mut per: std::collections::BTreeMap<u64, u64> = Default::default();
    for (t, h) in admitted {
        *per.entry(t / w).or_default() += h;
    }
    for win in first..first + windows - 1 {
        let n = per.get(&win).copied().unwrap_or(0);
        assert!(
            n >= at_least,
            "{what}: window {win}: only {n} admitted of {}",
            limit.requests
        );
    }
}

#[tokio::test]
async fn three_replicas_offered_ten_times_the_limit_never_pass_it_and_admit_nearly_all() {
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
    ] {
        for (requests, window_s, windows) in [(300, 1, 4), (6000, 60, 2)] {
            for seed in 0..3 {
                let l = limit(algorithm, requests, window_s);
                let (admitted, r) = run(l, 10.0, windows, seed, false).await;
                let what = format!("{algorithm:?} {requests}/{window_s}s seed {seed}");
                assert_within(&l, &admitted, &what);
                let from_claims = r.metrics.decisions.get();
                // The claims do part of the work even at ten times a binding limit.
                assert!(
                    from_claims * 20 > admitted.len() as u64,
                    "{what}: {from_claims} of {} admitted from claims",
                    admitted.len()
                );
                // The stated bound: per replica, what its last two claims of a period leave
                // unspent (each a quarter of 50 ms of its traffic, here a third of ten times the
                // rate, calls of up to 3 hits); on a window, what lapses while the counter is
                // under a quarter of its limit.
                let piece = (l.per_second() * 10.0 / 3.0 * 0.05 / 4.0).ceil() as u64 + 3;
                let lapses_below_a_quarter = match algorithm {
                    Algorithm::TokenBucket => 0,
                    _ => l.requests / 4,
                };
                let bound = 3 * 2 * piece + lapses_below_a_quarter;
                assert_floor(&l, &admitted, windows, bound, &what);
            }
        }
    }
}

/// Bursts and slow spells: claims taken in a burst linger into the slow spell and are spent
/// late, near the end of their period, or given back.
#[tokio::test]
async fn claims_spent_late_in_slow_spells_never_pass_the_limit() {
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
    ] {
        for (requests, window_s, windows) in [(300, 1, 6), (6000, 60, 2)] {
            for seed in 10..13 {
                let l = limit(algorithm, requests, window_s);
                let (admitted, r) = run(l, 10.0, windows, seed, true).await;
                let what = format!("{algorithm:?} {requests}/{window_s}s seed {seed}, spells");
                assert_within(&l, &admitted, &what);
                assert!(r.metrics.decisions.get() > 0, "{what}: no claim spent");
            }
        }
    }
}

#[tokio::test]
async fn a_quiet_counter_gives_its_claim_back() {
    let r = replicas(1, 10.0, None);
    let l = limit(Algorithm::FixedWindow, 1000, 60);
    let key = "{d|quiet=1}";
    // 100 calls in 100 ms: hot; a claim is taken and partly spent.
    for _ in 0..100 {
        r.clock.advance_us(1_000);
        call(&r.hot[0], &charge(key, l, 1)).await;
        r.hot[0].settle().await;
    }
    assert!(r.hot[0].claimed(key) > 0, "a claim is held");
    let probe = |m: &Arc<MemoryStore>| {
        m.check_all_at(&[charge(key, l, 1)], r.clock.now_us(), ChargeMode::Probe)[0]
            .clone()
            .unwrap()
            .remaining
    };
    assert!(probe(&r.memory) < 900, "the claim is counted in the store");
    r.clock.advance_us(QUIET_US);
    r.hot[0].sweep(false).await;
    assert_eq!(r.hot[0].claimed(key), 0);
    // Every call admitted is counted, nothing more.
    assert_eq!(probe(&r.memory), 900);
    assert!(r.metrics.given_back_hits.get() > 0);
}

#[tokio::test]
async fn a_counter_gateways_hold_part_of_is_left_to_the_store() {
    let tally = Arc::new(RlsTally::default());
    let key = "{d|held=1}";
    tally.note(key, 1, 10.0);
    let r = replicas(1, 10.0, Some(tally));
    let l = limit(Algorithm::FixedWindow, 1000, 60);
    for _ in 0..200 {
        r.clock.advance_us(1_000);
        call(&r.hot[0], &charge(key, l, 1)).await;
        r.hot[0].settle().await;
    }
    assert_eq!(r.metrics.claims_taken.get(), 0);
    assert_eq!(r.metrics.decisions.get(), 0);
}
