//! Many calls in one script call: decided as one by one, and one key's state read and written
//! once per call.

use super::*;

/// Sends `calls` to Redis as one script call, as the batchers do, and decodes each call's
/// decisions; keys are `prefix` + the check's key.
async fn one_script_call(
    conn: &mut redis::aio::MultiplexedConnection,
    prefix: &str,
    calls: &[(Vec<Check>, u64, ChargeMode)],
) -> Vec<Vec<portcullis::algorithm::Decision>> {
    use portcullis::store::redis::script;
    let mut keys = Vec::new();
    // The number of calls, then no keys carried in the arguments.
    let mut args = vec![calls.len() as i64, 0];
    for (checks, now, mode) in calls {
        keys.extend(checks.iter().map(|c| format!("{prefix}{}", c.key)));
        let refs: Vec<&Check> = checks.iter().collect();
        script::push_call(
            &refs,
            ScriptClock::Fixed(*now),
            0,
            script::mode_arg(*mode),
            &mut args,
        );
    }
    let packed = script::pack(&keys, &args, false).expect("arguments match the keys");
    let reply: redis::Value = redis::cmd("EVAL")
        .arg(script::SOURCE)
        .arg(packed.keys.len())
        .arg(&packed.keys)
        .arg(&packed.numbers)
        .query_async(conn)
        .await
        .expect("the script runs");
    let replies = script::parse_reply(&reply).expect("the script's reply parses");
    assert_eq!(replies.len(), calls.len());
    calls
        .iter()
        .zip(replies)
        .map(|((checks, _, mode), per_key)| {
            assert_eq!(per_key.len(), checks.len());
            let charged = *mode != ChargeMode::Probe;
            checks
                .iter()
                .zip(&per_key)
                .map(|(check, numbers)| {
                    script::decision(check, numbers.as_ref().expect("decided"), charged)
                        .expect("a decision")
                })
                .collect()
        })
        .collect()
}

/// Counts of the commands Redis ran (scripts' own `redis.call`s included) since the last
/// CONFIG RESETSTAT, by lower-case name.
fn command_calls(port: u16) -> std::collections::HashMap<String, u64> {
    cli(port, &["INFO", "commandstats"])
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .split(',')
                .find_map(|f| f.strip_prefix("calls="))?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}

/// Many calls in one script call on a few hot keys (what batching sends at saturation) decide
/// exactly what the same calls decide one by one in the memory model: every algorithm
/// (concurrency slots and their releases included), modes, refunds, post-paid charges, a rate
/// changed by a reload and a clock that moves within the script call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_call_of_many_calls_on_hot_keys_decides_like_the_calls_one_by_one() {
    let redis = RedisServer::start();
    let mut conn = plain_connection(redis.port).await;
    let memory = MemoryStore::new(Arc::new(ManualClock::new(0)));
    let mut rng = Rng(0x5EED_BA7C_0000_0010);
    let mut compared = 0;
    let mut refused = 0;
    for round in 0..80u64 {
        let mut limits: Vec<Limit> = (0..4u64)
            .map(|i| {
                let algorithm = ALGORITHMS[((round + i) % 4) as usize];
                let requests = 1 + rng.below(30);
                let window_us = WINDOWS_US[rng.below(3) as usize];
                random_limit(&mut rng, algorithm, requests, window_us)
            })
            .collect();
        let mut now = FUTURE_US + rng.below(86_400_000_000);
        // A few script calls per round, so that state also carries from one to the next.
        for _ in 0..3 {
            let mut calls = Vec::new();
            for _ in 0..1 + rng.below(64) {
                match rng.below(20) {
                    0 => now += rng.below(limits[0].window_us),
                    1 => now -= rng.below(1000),
                    2 => reload_buckets(&mut rng, &mut limits, 30),
                    _ => {}
                }
                // One to three of the round's keys, each at most once in a call.
                let first = rng.below(4) as usize;
                let count = 1 + rng.below(3) as usize;
                let checks: Vec<Check> = (0..count)
                    .map(|j| {
                        let i = (first + j) % 4;
                        let limit = limits[i];
                        Check {
                            key: key::counter_key(
                                "hot",
                                [("round", round.to_string().as_str()), ("d", &i.to_string())],
                                &limit,
                                None,
                            ),
                            limit,
                            hits: match rng.below(12) {
                                0 => 0,
                                1 => limit.capacity() + 1,
                                _ => 1 + rng.below(3),
                            },
                            refund: rng.below(10) == 0,
                            // Costs already consumed, recorded past the limit (never slots:
                            // the plan makes no post-paid concurrency check).
                            post_paid: rng.below(4) == 0
                                && limit.algorithm != Algorithm::Concurrency,
                        }
                    })
                    .collect();
                let mode = random_mode(&mut rng);
                calls.push((checks, now, mode));
            }
            let from_redis = one_script_call(&mut conn, "hot:", &calls).await;
            for (n, ((checks, at, mode), from_redis)) in calls.iter().zip(from_redis).enumerate() {
                let from_memory = modelled(&memory, checks, *at, *mode);
                assert_eq!(
                    from_redis, from_memory,
                    "round {round} call {n} at {at} {mode:?}: {checks:?}"
                );
                compared += checks.len();
                refused += from_memory.iter().filter(|d| !d.allowed).count();
            }
        }
    }
    assert!(compared > 5000, "{compared} decisions compared");
    assert!(
        refused > 500,
        "only {refused} refusals: the limits are never reached"
    );
}

/// The Redis work of a script call grows with its keys, not with its calls: 24 calls on one hot
/// key read the key's state once and write it once (a new key, then one that holds state), whatever the algorithm, and still admit
/// exactly the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_on_one_key_in_a_script_call_read_and_write_its_state_once() {
    let redis = RedisServer::start();
    let mut conn = plain_connection(redis.port).await;
    for algorithm in ALGORITHMS {
        let limit = Limit {
            algorithm,
            requests: 20,
            window_us: 60_000_000,
            burst: 20,
        };
        let check = Check {
            key: key::counter_key(
                "once",
                [("a", format!("{algorithm:?}").as_str())],
                &limit,
                None,
            ),
            limit,
            hits: 1,
            refund: false,
            post_paid: false,
        };
        // Twice: a new key, then a key that already holds state.
        for (round, now) in [FUTURE_US, FUTURE_US + 1_000].into_iter().enumerate() {
            let calls: Vec<_> = (0..24)
                .map(|_| (vec![check.clone()], now, ChargeMode::EachAlone))
                .collect();
            cli(redis.port, &["CONFIG", "RESETSTAT"]);
            let decisions = one_script_call(&mut conn, "once:", &calls).await;
            let admitted = decisions.iter().filter(|d| d[0].allowed).count();
            assert_eq!(admitted, [20, 0][round], "{algorithm:?} round {round}");
            let ran = command_calls(redis.port);
            let reads: u64 = ["hmget", "hget", "hgetall", "get"]
                .iter()
                .map(|c| ran.get(*c).copied().unwrap_or(0))
                .sum();
            let writes: u64 = ["hset", "hdel", "del", "set", "pexpireat", "pexpire"]
                .iter()
                .map(|c| ran.get(*c).copied().unwrap_or(0))
                .sum();
            // A refusal reads the live sub-windows once more (its retry time).
            assert!(
                reads <= 2,
                "{algorithm:?} round {round}: {reads} reads for 24 calls: {ran:?}"
            );
            assert!(
                writes <= 2,
                "{algorithm:?} round {round}: {writes} writes for 24 calls: {ran:?}"
            );
        }
    }
}
