//! What the decision script costs Redis, alone: one script call of C calls on one hot key (as a
//! batch under load holds), for C = 1, 8 and 64, per algorithm, sent back to back on one
//! connection to a redis-server this benchmark starts on a loopback port. Redis' own
//! `INFO commandstats` gives µs per script call; the slope between C = 8 and C = 64 is the
//! cost of one more check, the rest the cost of a script call. No generator, service or second
//! process shares the figure (the load benchmark measures the whole path).
//!
//! Then the cold path: script calls of 10 calls, each on a key never named before.
//!
//!   cargo bench --bench script_cost        full run: 20,000 script calls per row
//!   cargo test --benches                   a short smoke run (200)

#[path = "../tests/common/redis.rs"]
mod harness;

use portcullis::algorithm::{Algorithm, ChargeMode, Check, Limit, key};
use portcullis::store::redis::{ScriptClock, script};

fn evalsha_stats(port: u16) -> (f64, f64) {
    let line = harness::cli(port, &["INFO", "commandstats"])
        .lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .map(str::to_owned)
        .unwrap_or_default();
    let field = |name: &str| {
        line.split([':', ','])
            .find_map(|f| f.strip_prefix(name))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (field("calls="), field("usec="))
}

/// One EVALSHA of the decision script deciding `checks`, each a call of its own (as a batch sends
/// them).
fn script_call(checks: &[Check]) -> redis::Cmd {
    let mut keys = Vec::new();
    let mut args = vec![checks.len() as i64, 0];
    for check in checks {
        keys.push(check.key.clone());
        let mode = script::mode_arg(ChargeMode::EachAlone);
        script::push_call(&[check], ScriptClock::RedisTime, 0, mode, &mut args);
    }
    let packed = script::pack(&keys, &args, false).expect("arguments match the keys");
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script::SHA.as_str())
        .arg(packed.keys.len())
        .arg(&packed.keys)
        .arg(&packed.numbers);
    cmd
}

/// µs of Redis per script call (its `INFO commandstats`) over about `rounds` calls that
/// `command` makes, pipelined by 50 so that Redis runs them back to back.
async fn redis_us_per_script_call(
    conn: &mut redis::aio::MultiplexedConnection,
    port: u16,
    rounds: usize,
    mut command: impl FnMut() -> redis::Cmd,
) -> f64 {
    let before = evalsha_stats(port);
    for _ in 0..rounds.div_ceil(50) {
        let mut pipe = redis::pipe();
        for _ in 0..50 {
            pipe.add_command(command()).ignore();
        }
        let () = pipe.query_async(conn).await.expect("the script runs");
    }
    let after = evalsha_stats(port);
    (after.1 - before.1) / (after.0 - before.0).max(1.0)
}

/// µs of Redis per script call of `calls` calls, each one check of `algorithm` on one key.
async fn row(
    conn: &mut redis::aio::MultiplexedConnection,
    port: u16,
    algorithm: Algorithm,
    calls: usize,
    rounds: usize,
) -> f64 {
    let limit = Limit {
        algorithm,
        requests: 1_000_000_000,
        window_us: 1_000_000,
        burst: 1_000_000_000,
    };
    let check = Check {
        key: key::counter_key("cost", [("k", format!("{calls}").as_str())], &limit, None),
        limit,
        hits: 1,
        refund: false,
        post_paid: false,
    };
    let cmd = script_call(&vec![check; calls]);
    let reply: redis::Value = cmd.query_async(conn).await.expect("the script runs");
    let decided = script::parse_reply(&reply).expect("a reply");
    assert_eq!(decided.len(), calls);
    assert!(
        decided
            .iter()
            .all(|c| c[0].as_ref().is_ok_and(|n| n[0] == 1))
    );
    redis_us_per_script_call(conn, port, rounds, || cmd.clone()).await
}

/// µs of Redis per decision on the cold path: script calls of `calls` calls, each one check of
/// `algorithm` on a key no call has named before (a rule keyed by user: almost every call meets a
/// new counter), `rounds` script calls in all.
async fn cold_row(
    conn: &mut redis::aio::MultiplexedConnection,
    port: u16,
    algorithm: Algorithm,
    calls: usize,
    rounds: usize,
) -> f64 {
    let limit = Limit {
        algorithm,
        requests: 100,
        window_us: 60_000_000,
        burst: 100,
    };
    let mut next = 0u64;
    let command = || {
        let checks: Vec<Check> = (0..calls)
            .map(|_| {
                next += 1;
                Check {
                    key: key::counter_key(
                        "cold",
                        [("user", format!("{algorithm:?}-{next}").as_str())],
                        &limit,
                        None,
                    ),
                    limit,
                    hits: 1,
                    refund: false,
                    post_paid: false,
                }
            })
            .collect();
        script_call(&checks)
    };
    redis_us_per_script_call(conn, port, rounds, command).await / calls as f64
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let rounds = if full { 20_000 } else { 200 };
    let redis = harness::RedisServer::start();
    harness::cli(redis.port, &["SCRIPT", "LOAD", script::SOURCE]);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let client = redis::Client::open(redis.url()).expect("client");
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        println!();
        println!(
            "| algorithm | µs per script call, 1 call | 8 calls | 64 calls | µs per more call |"
        );
        println!("|---|---|---|---|---|");
        for algorithm in [
            Algorithm::SlidingWindow,
            Algorithm::TokenBucket,
            Algorithm::FixedWindow,
        ] {
            let mut us = Vec::new();
            for calls in [1, 8, 64] {
                us.push(row(&mut conn, redis.port, algorithm, calls, rounds).await);
            }
            println!(
                "| {algorithm:?} | {:.1} | {:.1} | {:.1} | {:.2} |",
                us[0],
                us[1],
                us[2],
                (us[2] - us[1]) / 56.0
            );
        }
        println!();
        println!("| algorithm | cold path: µs per decision, script calls of 10 new keys |");
        println!("|---|---|");
        for algorithm in [
            Algorithm::SlidingWindow,
            Algorithm::TokenBucket,
            Algorithm::FixedWindow,
        ] {
            let us = cold_row(&mut conn, redis.port, algorithm, 10, rounds / 4).await;
            println!("| {algorithm:?} | {us:.2} |");
        }
    });
}
