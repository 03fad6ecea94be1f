//! What the decision script costs Redis, alone: one script call of C calls on one hot key (as a
//! batch under load holds), for C = 1, 8 and 64, per algorithm, sent back to back on one
//! connection to a redis-server this benchmark starts on a loopback port. Redis' own
//! `INFO commandstats` gives µs per script call; the slope between C = 8 and C = 64 is the
//! cost of one more check, the rest the cost of a script call. No generator, service or second
//! process shares the figure (the load benchmark measures the whole path).
//!
//! Then the cold path: script calls of 10 calls, each on a key never named before.
//!
//! With `--against DIR` (the `lua/` directory of another commit, e.g. from `git archive`), each
//! row is measured for that commit's script too, on the same Redis in alternating blocks, and
//! the ratio printed: a change to the scripts is judged side by side in one run (this 2-core
//! machine's noise moves both alike). The other script must take the same arguments.
//!
//!   cargo bench --bench script_cost                      full run: 20,000 script calls per row
//!   cargo bench --bench script_cost -- --against DIR     the same, beside DIR's script
//!   ... -- --lua DIR2 --against DIR                      DIR2's script (not the build's) beside
//!   ... -- --cold-only                                   the cold rows only
//!   ... -- --blocks N                                    N alternating blocks a row (4)
//!   ... -- --eval                                        this side by EVALSHA, not FCALL
//!
//! A script whose `check.lua` defines `check` (as this build's does) is loaded as a function
//! library and called by FCALL, as Portcullis calls it; an older one by EVALSHA.
//!   cargo test --benches                                 a short smoke run (200)

#[path = "../tests/common/redis.rs"]
mod harness;

use portcullis::algorithm::{Algorithm, ChargeMode, Check, Limit, key};
use portcullis::store::redis::{ScriptClock, script};

/// (calls, usec) of EVALSHA and FCALL together.
fn evalsha_stats(port: u16) -> (f64, f64) {
    let text = harness::cli(port, &["INFO", "commandstats"]);
    let mut sums = (0.0, 0.0);
    for line in text
        .lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_fcall:"))
    {
        let field = |name: &str| {
            line.split([':', ','])
                .find_map(|f| f.strip_prefix(name))
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        sums.0 += field("calls=");
        sums.1 += field("usec=");
    }
    sums
}

/// One call of the decision script deciding `checks`, each a call of its own (as a batch sends
/// them): `sha` is the script's SHA for EVALSHA, or `fn:` and a function's name for FCALL;
/// `plain:` before a SHA: an older script, which reads its keys' places as they are, not negated
/// where a key is named once, and no mode 4 (`script::pack`).
fn script_call(sha: &str, checks: &[Check]) -> redis::Cmd {
    let (sha, plain) = match sha.strip_prefix("plain:") {
        Some(sha) => (sha, true),
        None => (sha, false),
    };
    let mut keys = Vec::new();
    let mut args = vec![checks.len() as i64, 0];
    for check in checks {
        keys.push(check.key.clone());
        let mode = script::mode_arg(ChargeMode::EachAlone);
        script::push_call(&[check], ScriptClock::RedisTime, 0, mode, &mut args);
    }
    let mut packed = script::pack(&keys, &args, false).expect("arguments match the keys");
    if plain {
        // Each call: four numbers (its mode third: 4 is 0 to an older script), then seven per
        // check, its key's place last.
        let mut at = 2;
        for _ in 0..checks.len() {
            if number(&packed.numbers, at + 2) == script::ALONE_ONCE {
                let mode = (at + 2) * 8;
                packed.numbers[mode..mode + 8].copy_from_slice(&0i64.to_be_bytes());
            }
            let count = number(&packed.numbers, at + 3);
            at += 4;
            for k in 0..count as usize {
                let place = at + 7 * k + 6;
                let value = number(&packed.numbers, place).abs();
                packed.numbers[place * 8..place * 8 + 8].copy_from_slice(&value.to_be_bytes());
            }
            at += 7 * count as usize;
        }
    }
    let mut cmd = match sha.strip_prefix("fn:") {
        Some(function) => {
            let mut cmd = redis::cmd("FCALL");
            cmd.arg(function);
            cmd
        }
        None => {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(sha);
            cmd
        }
    };
    cmd.arg(packed.keys.len())
        .arg(&packed.keys)
        .arg(&packed.numbers);
    cmd
}

/// The `i`th big-endian number of a script call's numbers.
fn number(numbers: &[u8], i: usize) -> i64 {
    i64::from_be_bytes(numbers[i * 8..i * 8 + 8].try_into().expect("eight bytes"))
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
    sha: &str,
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
        key: key::counter_key(
            "cost",
            [("k", format!("{calls}-{sha}").as_str())],
            &limit,
            None,
        ),
        limit,
        hits: 1,
        refund: false,
        post_paid: false,
    };
    let cmd = script_call(sha, &vec![check; calls]);
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
    sha: &str,
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
                        [("user", format!("{algorithm:?}-{sha}-{next}").as_str())],
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
        script_call(sha, &checks)
    };
    redis_us_per_script_call(conn, port, rounds, command).await / calls as f64
}

/// The decision script's definitions as `dir` (a `lua/` directory) holds them, joined as
/// `script::SOURCE` joins them (an older `check.lua` runs one script call itself).
fn source_of(dir: &str) -> String {
    const PARTS: [&str; 10] = [
        "common",
        "sliding_packed",
        "sliding_hash",
        "sliding_window",
        "token_bucket",
        "fixed_window",
        "concurrency",
        "claims",
        "held",
        "check",
    ];
    PARTS
        .iter()
        .filter_map(|p| {
            let path = format!("{dir}/{p}.lua");
            // held.lua came out of check.lua, sliding_hash.lua out of sliding_window.lua: an
            // older directory has none.
            match std::fs::read_to_string(&path) {
                Err(e)
                    if (*p == "held" || *p == "sliding_hash")
                        && e.kind() == std::io::ErrorKind::NotFound =>
                {
                    None
                }
                read => Some(read.unwrap_or_else(|e| panic!("read {path}: {e}"))),
            }
        })
        .collect()
}

/// Loads a decision script into Redis at `port`: as a function library when it defines `check`
/// (unless `eval`), else as a script. What `script_call` takes: `fn:NAME` or the SHA, after
/// `plain:` for a script that reads its keys' places as they are (before the quick path).
fn load(port: u16, source: &str, eval: bool) -> String {
    let plain = if source.contains("if at < 0 then") {
        ""
    } else {
        "plain:"
    };
    let sha = redis::Script::new(source).get_hash().to_owned();
    if !source.contains("local function check(KEYS, ARGV)") {
        let loaded = harness::cli(port, &["SCRIPT", "LOAD", source]);
        assert!(loaded == sha, "the script loads: {loaded}");
        return format!("{plain}{sha}");
    }
    if eval {
        let with_call = format!("{source}return check(KEYS, ARGV)\n");
        let loaded = harness::cli(port, &["SCRIPT", "LOAD", &with_call]);
        assert!(loaded.len() == 40, "the script loads: {loaded}");
        return format!("{plain}{loaded}");
    }
    let name = format!("cost_{sha}");
    let library = format!("#!lua name={name}\n{source}redis.register_function('{name}', check)\n");
    let loaded = harness::cli(port, &["FUNCTION", "LOAD", "REPLACE", &library]);
    assert!(loaded == name, "the library loads: {loaded}");
    format!("{plain}fn:{name}")
}

/// A row's figure for this build's script and, when there is one, the other's: `blocks`
/// alternating blocks each, summed (so drift in the machine's speed falls on both).
async fn side_by_side<F, Fut>(scripts: &[String], blocks: usize, mut measure: F) -> Vec<f64>
where
    F: FnMut(String) -> Fut,
    Fut: std::future::Future<Output = f64>,
{
    let mut sums = vec![0.0; scripts.len()];
    for _ in 0..blocks {
        for (sum, sha) in sums.iter_mut().zip(scripts) {
            *sum += measure(sha.clone()).await;
        }
    }
    sums.iter().map(|s| s / blocks as f64).collect()
}

fn cells(us: &[f64], precision: usize) -> String {
    match us {
        [this, base] => format!(
            "{this:.precision$} | {base:.precision$} | {:.2}",
            this / base.max(1e-9)
        ),
        [this] => format!("{this:.precision$}"),
        _ => unreachable!("one or two scripts"),
    }
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let rounds = if full { 20_000 } else { 200 };
    let args: Vec<String> = std::env::args().collect();
    let against = args
        .iter()
        .position(|a| a == "--against")
        .map(|i| args.get(i + 1).expect("--against DIR").clone());
    // `--lua DIR`: this side's script from DIR instead of the build (trying a change to the
    // scripts without building).
    let this = args
        .iter()
        .position(|a| a == "--lua")
        .map(|i| source_of(args.get(i + 1).expect("--lua DIR")));
    let redis = harness::RedisServer::start();
    let built = script::SOURCE
        .strip_suffix("return check(KEYS, ARGV)\n")
        .expect("the script ends with its call");
    let this = this.unwrap_or_else(|| built.to_owned());
    let eval = args.iter().any(|a| a == "--eval");
    let mut scripts = vec![load(redis.port, &this, eval)];
    if let Some(dir) = &against {
        scripts.push(load(redis.port, &source_of(dir), false));
    }
    // Alternating blocks: four per row beside another script (`--blocks N`), one alone.
    let blocks = match args.iter().position(|a| a == "--blocks") {
        Some(i) => args
            .get(i + 1)
            .and_then(|n| n.parse().ok())
            .expect("--blocks N"),
        None if scripts.len() > 1 => 4,
        None => 1,
    };
    let heads = if scripts.len() > 1 {
        ("this | before | ratio", "|---|---|---|")
    } else {
        ("this", "|---|")
    };
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let client = redis::Client::open(redis.url()).expect("client");
        let conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        if let Some(dir) = &against {
            println!("\nbefore: the script of {dir}");
        }
        let cold_only = args.iter().any(|a| a == "--cold-only");
        println!();
        println!(
            "| algorithm | calls per script call | µs per script call: {} |",
            heads.0
        );
        println!("|---|---{}", heads.1);
        for algorithm in [
            Algorithm::SlidingWindow,
            Algorithm::TokenBucket,
            Algorithm::FixedWindow,
        ]
        .into_iter()
        .filter(|_| !cold_only)
        {
            let mut per = Vec::new();
            for calls in [1, 8, 64] {
                let us = side_by_side(&scripts, blocks, |sha| {
                    let conn = conn.clone();
                    async move {
                        let mut conn = conn;
                        row(
                            &mut conn,
                            redis.port,
                            &sha,
                            algorithm,
                            calls,
                            rounds / blocks,
                        )
                        .await
                    }
                })
                .await;
                println!("| {algorithm:?} | {calls} | {} |", cells(&us, 1));
                per.push(us);
            }
            let more: Vec<f64> = (0..scripts.len())
                .map(|s| (per[2][s] - per[1][s]) / 56.0)
                .collect();
            println!("| {algorithm:?} | one more | {} |", cells(&more, 2));
        }
        println!();
        println!(
            "| algorithm | cold path: µs per decision, script calls of 10 new keys: {} |",
            heads.0
        );
        println!("|---{}", heads.1);
        for algorithm in [
            Algorithm::SlidingWindow,
            Algorithm::TokenBucket,
            Algorithm::FixedWindow,
        ] {
            let us = side_by_side(&scripts, blocks, |sha| {
                let conn = conn.clone();
                async move {
                    let mut conn = conn;
                    cold_row(
                        &mut conn,
                        redis.port,
                        &sha,
                        algorithm,
                        10,
                        rounds / 4 / blocks,
                    )
                    .await
                }
            })
            .await;
            println!("| {algorithm:?} | {} |", cells(&us, 2));
        }
    });
}
