//! The scripts against the memory model: random sequences of calls on every algorithm and
//! unit, a reload lowering a bucket's rate, and the edges of every parameter (proptest).

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_decide_exactly_like_the_memory_model_on_random_sequences() {
    let redis = RedisServer::start();
    let TwoLayouts {
        packed,
        hashed,
        memory,
        mut conn,
    } = two_layouts(&redis).await;
    let mut rng = Rng(0x5EED_1234_ABCD_0001);
    let mut compared = 0;
    for case in 0..90u64 {
        // One to three descriptors per call, algorithms mixed: the multi-key script path.
        let limits: Vec<Limit> = (0..1 + rng.below(3))
            .map(|i| {
                let algorithm = ALGORITHMS[((case + i) % 4) as usize];
                let span = if rng.below(4) == 0 { 5000 } else { 20 };
                let window_us = WINDOWS_US[rng.below(4) as usize];
                // Some descriptors are blocked (a zero limit): in an all-or-nothing call they
                // refuse the whole call before Redis is asked.
                if rng.below(12) == 0 {
                    return Limit {
                        algorithm,
                        requests: 0,
                        window_us,
                        burst: 0,
                    };
                }
                let requests = 1 + rng.below(span);
                random_limit(&mut rng, algorithm, requests, window_us)
            })
            .collect();
        let mut limits = limits;
        // The lease tokens each descriptor's takes were answered with (concurrency).
        let mut leases: Vec<Vec<u64>> = vec![Vec::new(); limits.len()];
        let mut now = FUTURE_US + rng.below(86_400_000_000);
        for step in 0..60 {
            // A reload that changes a token bucket's numbers keeps its key and state.
            if rng.below(15) == 0 {
                reload_buckets(&mut rng, &mut limits, 5000);
            }
            let window = limits[0].window_us;
            now += match rng.below(5) {
                0 => 0,
                1 => rng.below(1000),
                2 => rng.below(window / 5),
                3 => rng.below(window * 2),
                // The clock steps back (a failover to a Redis whose clock is behind).
                _ => {
                    now -= rng.below(window / 3);
                    0
                }
            };
            let checks: Vec<Check> = limits
                .iter()
                .enumerate()
                .map(|(i, limit)| Check {
                    key: key::counter_key(
                        "model",
                        [("case", case.to_string().as_str()), ("d", &i.to_string())],
                        limit,
                        None,
                    ),
                    limit: *limit,
                    hits: match rng.below(10) {
                        0 => 0,
                        1 => u64::MAX,
                        2 => limit.capacity() + 1,
                        // A concurrency release of a lease a take on this key was answered
                        // with: live, ended, or released already.
                        3 if !leases[i].is_empty() => {
                            leases[i][rng.below(leases[i].len() as u64) as usize]
                        }
                        _ => 1 + rng.below(limit.capacity().clamp(1, 6)),
                    },
                    // Some hits are given back (Envoy's is_negative_hits).
                    refund: rng.below(6) == 0,
                    // Some are costs already consumed, recorded even past the limit (never
                    // slots: the plan makes no post-paid concurrency check).
                    post_paid: rng.below(3) == 0 && limit.algorithm != Algorithm::Concurrency,
                })
                .collect();
            // One descriptor twice in a call (Envoy sends what the route's actions produce): the
            // second sees the first's hits, charged whole or not at all.
            let mut checks = checks;
            if rng.below(4) == 0 {
                let mut again = checks[rng.below(checks.len() as u64) as usize].clone();
                again.hits = 1 + rng.below(again.limit.capacity().clamp(1, 6));
                again.refund = rng.below(8) == 0;
                checks.push(again);
            }
            let mode = random_mode(&mut rng);
            let store = if rng.below(3) == 0 { &hashed } else { &packed };
            let from_redis = decide_in(store, &checks, ScriptClock::Fixed(now), mode).await;
            let from_memory = modelled(&memory, &checks, now, mode);
            assert_eq!(
                from_redis, from_memory,
                "case {case} step {step} at {now} {mode:?}: {checks:?}"
            );
            for (i, decision) in from_memory.iter().take(leases.len()).enumerate() {
                leases[i].extend(decision.lease);
            }
            // Every reset and retry time, from the state Redis itself stored (not from the
            // Rust that turns the script's reply into a decision, which the memory store
            // shares): oracle.rs.
            for (check, decision) in checks.iter().zip(&from_redis) {
                // (A key named twice in the call: its state at the end is the second's.)
                let twice = checks.iter().filter(|c| c.key == check.key).count() > 1;
                if check.limit.requests == 0 || twice {
                    continue;
                }
                let seen = super::oracle::Seen {
                    check,
                    decision,
                    now,
                    at: format!("case {case} step {step} at {now} {mode:?}"),
                };
                super::oracle::assert_times(&mut conn, seen).await;
            }
            // Every key's expiry, as the model keeps its counter.
            for check in &checks {
                let at = format!("case {case} step {step}: {from_memory:?}");
                assert_expires_as_the_model(&mut conn, "model:", &memory, check, now, &at).await;
            }
            compared += checks.len();
        }
    }
    assert!(compared > 5000);
}

#[tokio::test]
async fn a_token_bucket_whose_rate_a_reload_lowers_keeps_an_honest_retry_time() {
    let redis = RedisServer::start();
    let store = connected_store(Topology::Standalone(redis.url()), "tb:").await;
    let memory = MemoryStore::new(Arc::new(ManualClock::new(0)));
    let hour = 3_600_000_000;
    let fast = Limit {
        algorithm: Algorithm::TokenBucket,
        requests: 4_000_000_000,
        window_us: hour,
        burst: 4_000_000_000,
    };
    // The same rule after a reload: one per hour. Same key (the number is not its identity).
    let slow = Limit {
        requests: 1,
        burst: 1,
        ..fast
    };
    let check = |limit: Limit| Check {
        key: key::counter_key("tb", [("k", "v")], &limit, None),
        limit,
        hits: 1,
        refund: false,
        post_paid: false,
    };
    let now = FUTURE_US;
    let first = [check(fast)];
    let redis_first = decide(&store, &first, ScriptClock::Fixed(now)).await;
    assert_eq!(redis_first, vec![memory.check_at(&first[0], now).unwrap()]);
    // A hit of 0.9 us at the old rate is owed; under the new rate that is still under a
    // microsecond, never the 3.6e9 units of the old rate read as microseconds (an hour).
    let second = [check(slow)];
    let redis_second = decide(&store, &second, ScriptClock::Fixed(now)).await;
    let memory_second = memory.check_at(&second[0], now).unwrap();
    assert_eq!(redis_second, vec![memory_second]);
    assert!(!memory_second.allowed);
    assert!(
        memory_second.retry_after.unwrap() <= std::time::Duration::from_micros(1),
        "{memory_second:?}"
    );
    // A microsecond later the new bucket's one token is there.
    let third = decide(&store, &second, ScriptClock::Fixed(now + 1)).await;
    assert!(third[0].allowed, "{third:?}");
    assert_eq!(third, vec![memory.check_at(&second[0], now + 1).unwrap()]);
}

/// The scripts against the model on the edges of every parameter, proptest-driven: limits and
/// bursts up to Envoy's `u32::MAX`, every unit up to a year, hits of zero, one, the whole
/// capacity, one past it and `u64::MAX`, refunds, clocks jumping by years or stepping back.
#[test]
fn scripts_match_the_model_on_extreme_parameters() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};

    const UNITS_US: [u64; 7] = [
        1_000_000,
        60_000_000,
        3_600_000_000,
        86_400_000_000,
        7 * 86_400_000_000,
        30 * 86_400_000_000,
        365 * 86_400_000_000,
    ];
    let edge = || {
        prop_oneof![
            Just(1u64),
            Just(2),
            Just(u64::from(u32::MAX)),
            Just(u64::from(u32::MAX) - 1),
            1..=u64::from(u32::MAX),
            1u64..100,
        ]
    };
    let limit = (0usize..4, edge(), edge(), 0usize..7).prop_map(|(a, requests, burst, unit)| {
        let algorithm = ALGORITHMS[a];
        Limit {
            algorithm,
            requests,
            window_us: UNITS_US[unit],
            burst: if algorithm == Algorithm::TokenBucket {
                burst
            } else {
                requests
            },
        }
    });
    // (hits choice, raw hits, refund, clock step choice, raw step)
    let step = (0u8..6, any::<u64>(), any::<bool>(), 0u8..6, any::<u64>());
    let case = (
        proptest::collection::vec(limit, 1..4),
        proptest::collection::vec(step, 1..25),
        0u8..3,
    );

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let redis = RedisServer::start();
    let store = runtime.block_on(connected_store(Topology::Standalone(redis.url()), "edge:"));
    let memory = MemoryStore::new(Arc::new(ManualClock::new(0)));
    let counter = std::sync::atomic::AtomicU64::new(0);
    // A fixed seed: the same 400 cases every run, so CI never turns red by the draw (the fuzz
    // runs explore; a new seed here is a deliberate change).
    let mut runner = TestRunner::new(Config {
        cases: 400,
        failure_persistence: None,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x5EED_0009),
        ..Config::default()
    });
    runner
        .run(&case, |(limits, steps, mode)| {
            let id = counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let mode = [
                ChargeMode::EachAlone,
                ChargeMode::AllOrNothing,
                ChargeMode::Probe,
            ][usize::from(mode)];
            let mut now = FUTURE_US;
            const { assert!(FUTURE_US + 24 * 182 * 86_400_000_000 < 1 << 52) };
            for (n, (hits_kind, raw_hits, refund, step_kind, raw_step)) in steps.iter().enumerate()
            {
                let window = limits[0].window_us;
                match step_kind {
                    0 => {}
                    1 => now += raw_step % 1000,
                    2 => now += raw_step % window,
                    3 => now += raw_step % (4 * window),
                    // Half a year at most: 24 steps keep the clock below 2^52 us (the year
                    // 2112), where TAT plus the longest clamped span (2^52) is still exact in
                    // Lua's doubles; past it they are not, which no Redis TIME reaches for decades.
                    4 => now += raw_step % (182 * 86_400_000_000),
                    _ => now -= raw_step % (window / 2 + 1),
                }
                let checks: Vec<Check> = limits
                    .iter()
                    .enumerate()
                    .map(|(i, limit)| Check {
                        key: key::counter_key(
                            "edge",
                            [("case", id.to_string().as_str()), ("d", &i.to_string())],
                            limit,
                            None,
                        ),
                        limit: *limit,
                        hits: match hits_kind {
                            0 => 0,
                            1 => 1,
                            2 => limit.capacity(),
                            3 => limit.capacity() + 1,
                            4 => u64::MAX,
                            _ => raw_hits % (limit.capacity() + 2),
                        },
                        refund: *refund,
                        post_paid: false,
                    })
                    .collect();
                let from_redis =
                    runtime.block_on(decide_in(&store, &checks, ScriptClock::Fixed(now), mode));
                let from_memory = modelled(&memory, &checks, now, mode);
                prop_assert_eq!(
                    from_redis,
                    from_memory,
                    "step {} at {} {:?}: {:?}",
                    n,
                    now,
                    mode,
                    checks
                );
            }
            Ok(())
        })
        .unwrap();
}
