//! Replicas on one Redis share one budget and one clock: two instances admit exactly the limit
//! (standalone and Cluster), a replica whose host clock is 45 s off still counts right, and a node
//! that forgets the function library is sent it again.

use crate::common;

use std::time::Duration;

use crate::common::process::{LIBFAKETIME, ServeProcess};
use crate::common::redis::{RedisCluster, RedisServer, cli};
use crate::common::{TestServer, request};
use portcullis::pb::rate_limit_response::Code;
use portcullis::settings::{Settings, StoreKind};
use portcullis::store::redis::script;

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

/// Decisions go by FCALL of the function library, loaded once on the node (the decision script
/// is never sent as a script); a node that forgets it (FUNCTION FLUSH: a new node, a restore) is
/// sent it again, and one that forgets its scripts too still answers every call.
#[tokio::test]
async fn scripts_are_sent_again_after_the_node_forgets_them() {
    let redis = RedisServer::start();
    let server = TestServer::start_with(&[("h.yaml", common::redis::HOSTILE_RULES)], |s| {
        common::redis::redis_settings(s, &redis)
    })
    .await;
    assert_eq!(
        server
            .ok(request("hostile", &[&[("sliding", "n")]]))
            .await
            .overall_code,
        OK
    );
    let library = format!("portcullis_{}", script::SHA.as_str());
    let listed = || cli(redis.port, &["FUNCTION", "LIST", "LIBRARYNAME", &library]);
    assert!(listed().contains(&library), "loaded: {}", listed());
    // One decision is one FCALL of the decision function, no EVALSHA or EVAL of the decision
    // script beside it (a readiness look meanwhile sends one FCALL and one EVALSHA of it). Read
    // from SLOWLOG, which logs every command at a threshold of 0 with its arguments: the scaling
    // factors' reader sends EVAL of its own script at any moment (commandstats counted it).
    let mut conn = common::redis::plain_connection(redis.port).await;
    cli(
        redis.port,
        &["CONFIG", "SET", "slowlog-log-slower-than", "0"],
    );
    cli(redis.port, &["CONFIG", "SET", "slowlog-max-len", "10000"]);
    cli(redis.port, &["SLOWLOG", "RESET"]);
    server.ok(request("hostile", &[&[("sliding", "m")]])).await;
    let log: Vec<redis::Value> = redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(10_000)
        .query_async(&mut conn)
        .await
        .expect("SLOWLOG GET");
    let sent = decision_script_calls(&log);
    assert_eq!((sent.fcall - sent.evalsha, sent.eval), (1, 0), "{sent:?}");
    assert_eq!(cli(redis.port, &["FUNCTION", "FLUSH"]), "OK");
    assert_eq!(cli(redis.port, &["SCRIPT", "FLUSH"]), "OK");
    assert!(!listed().contains(&library));
    let r = server.ok(request("hostile", &[&[("sliding", "n")]])).await;
    assert_eq!(
        r.overall_code, OVER,
        "the counter survived; the library was loaded again"
    );
    assert!(listed().contains(&library), "loaded again: {}", listed());
    server.stop().await;
}

/// Commands of the decision script in a SLOWLOG reply: FCALL of its function, EVALSHA of its SHA,
/// EVAL of its source (SLOWLOG keeps an argument's first 128 bytes).
#[derive(Debug, Default)]
struct DecisionScriptCalls {
    fcall: u64,
    evalsha: u64,
    eval: u64,
}

fn decision_script_calls(log: &[redis::Value]) -> DecisionScriptCalls {
    let text = |v: &redis::Value| match v {
        redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        redis::Value::SimpleString(s) => s.clone(),
        other => format!("{other:?}"),
    };
    let source_start: String = script::SOURCE.chars().take(100).collect();
    let mut calls = DecisionScriptCalls::default();
    for entry in log {
        // id, time, duration, arguments, client address, client name.
        let redis::Value::Array(fields) = entry else {
            panic!("a SLOWLOG entry: {entry:?}")
        };
        let Some(redis::Value::Array(args)) = fields.get(3) else {
            panic!("a SLOWLOG entry's arguments: {entry:?}")
        };
        let (Some(command), Some(first)) = (args.first(), args.get(1)) else {
            continue;
        };
        let (command, first) = (text(command).to_ascii_uppercase(), text(first));
        match command.as_str() {
            "FCALL" if first == *script::FUNCTION => calls.fcall += 1,
            "EVALSHA" if first == *script::SHA => calls.evalsha += 1,
            "EVAL" if first.starts_with(&source_start) => calls.eval += 1,
            _ => {}
        }
    }
    calls
}

const SHARED_RULES: &str = r#"
domain: shared
descriptors:
  - key: sliding
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: bucket
    rate_limit: {unit: minute, requests_per_unit: 100, algorithm: token_bucket}
  - key: fixed
    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: fixed_window}
"#;

/// 300 concurrent calls split across two service instances admit exactly 100 per algorithm.
async fn two_instances_admit_exactly_the_limit(adjust: impl Fn(&mut Settings) + Copy) {
    let a = TestServer::start_with(&[("s.yaml", SHARED_RULES)], adjust).await;
    let b = TestServer::start_with(&[("s.yaml", SHARED_RULES)], adjust).await;
    let clients = [a.client.clone(), b.client.clone()];
    for key in ["sliding", "bucket", "fixed"] {
        let started = std::time::Instant::now();
        let admitted =
            common::count_admitted(&clients, request("shared", &[&[(key, "one")]]), 300).await;
        // The bucket refills a token every 0.6 s: the calls of a loaded machine (a Valkey pass
        // beside the benchmarks' smoke runs took longer once) may meet that many more.
        let refilled = match key {
            "bucket" => (started.elapsed().as_secs_f64() / 0.6) as usize,
            _ => 0,
        };
        assert!(
            (100..=100 + refilled).contains(&admitted),
            "{key}: {admitted} admitted, of 100 and {refilled} refilled"
        );
    }
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_one_standalone_redis_share_one_budget() {
    let redis = RedisServer::start();
    let url = redis.url();
    two_instances_admit_exactly_the_limit(|s| {
        s.store = StoreKind::Redis;
        s.redis_url = Some(url.clone());
        s.store_timeout = Duration::from_secs(5);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_one_cluster_share_one_budget_and_each_key_has_one_slot() {
    let cluster = RedisCluster::start();
    let seeds = cluster.seeds();
    two_instances_admit_exactly_the_limit(|s| {
        s.store = StoreKind::Redis;
        s.redis_cluster = seeds.clone();
        s.store_timeout = Duration::from_secs(5);
    })
    .await;
    // Each key's slot is its hash tag's, and the key lives on the master serving that slot.
    for algo in ["sliding", "bucket", "fixed"] {
        let tag = format!("shared|{algo}=one");
        let port = cluster.master_of(&format!("{{{tag}}}"));
        let keys = cli(port, &["--raw", "KEYS", &format!("portcullis:{{{tag}}}*")]);
        assert_eq!(keys.lines().count(), 1, "{algo}: {keys}");
        let key = keys.lines().next().unwrap();
        assert_eq!(
            cli(port, &["CLUSTER", "KEYSLOT", key]),
            cli(port, &["CLUSTER", "KEYSLOT", &tag])
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_host_clock_is_45s_off_still_shares_the_budget() {
    assert!(
        std::path::Path::new(LIBFAKETIME).exists(),
        "libfaketime is missing: apt-get install faketime (scripts/test installs it)"
    );
    // The fake clock really is off for processes started under it.
    let date = std::process::Command::new("date")
        .arg("+%s")
        .env("LD_PRELOAD", LIBFAKETIME)
        .env("FAKETIME", "+45s")
        .output()
        .unwrap();
    let shifted: u64 = String::from_utf8_lossy(&date.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("date under libfaketime: {date:?}"));
    let real = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(shifted >= real + 40, "faketime did not shift the clock");

    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.yaml"), CLOCK_RULES).unwrap();
    let honest = replica(dir.path(), &redis, None);
    let skewed = replica(dir.path(), &redis, Some("+45s"));
    let redis_now_us = || {
        let time = cli(redis.port, &["TIME"]);
        let mut parts = time.lines().map(|l| l.parse::<u64>().unwrap());
        parts.next().unwrap() * 1_000_000 + parts.next().unwrap()
    };
    let before_us = redis_now_us();
    for key in ["sliding", "bucket"] {
        let mut admitted = 0;
        for i in 0..40 {
            let server = if i % 2 == 0 { &honest } else { &skewed };
            if ask(server, key) == "OK" {
                admitted += 1;
            }
        }
        assert_eq!(
            admitted, 10,
            "{key}: exactly the limit, whichever replica answered"
        );
    }
    // The sub-window the replicas last wrote is one of Redis' clock during the test: a replica
    // counting by its host clock would have written one 45 sub-windows (45 s) ahead.
    let after_us = redis_now_us();
    let sub_us = 1_000_000;
    // The newest sub-window index in the packed counter's header (bytes 2-7, big-endian).
    let newest = cli(
        redis.port,
        &[
            "EVAL",
            "local r = redis.call('GET', KEYS[1]) local n = 0 \
             for i = 2, 7 do n = n * 256 + string.byte(r, i) end return tostring(n)",
            "1",
            "portcullis:{clock|sliding=x}:sw60:60000000us",
        ],
    );
    let indexes: Vec<u64> = newest.parse().ok().into_iter().collect();
    assert!(!indexes.is_empty(), "{newest}");
    for index in indexes {
        assert!(
            (before_us / sub_us..=after_us / sub_us).contains(&index),
            "sub-window {index} is not Redis' time"
        );
    }
}

const CLOCK_RULES: &str = r#"
domain: clock
descriptors:
  - key: sliding
    rate_limit: {unit: minute, requests_per_unit: 10}
  # One token per 30 s: a replica whose clock ran 45 s ahead would see one more token.
  - key: bucket
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: token_bucket, burst: 10}
"#;

/// A replica of Portcullis on `redis`, its host clock shifted by `fake_offset` (faketime).
fn replica(
    rules: &std::path::Path,
    redis: &RedisServer,
    fake_offset: Option<&str>,
) -> ServeProcess {
    let url = redis.url();
    let args = [
        "--store",
        "redis",
        "--store-timeout",
        "2s",
        "--redis-url",
        url.as_str(),
        // The sub-window a replica wrote is read from the packed counter's header.
        "--redis-layout",
        "packed",
    ];
    let envs: Vec<(&str, String)> = fake_offset.map_or(Vec::new(), |offset| {
        vec![
            ("LD_PRELOAD", LIBFAKETIME.to_owned()),
            ("FAKETIME", offset.to_owned()),
        ]
    });
    ServeProcess::spawn(rules, &args, &envs, &[])
}

/// The overall code for one hit on `key` of domain `clock`, through the `ask` subcommand (a
/// separate client process).
fn ask(server: &ServeProcess, key: &str) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_portcullis"))
        .args([
            "ask",
            "--addr",
            &server.grpc_url(),
            "--domain",
            "clock",
            "-d",
            &format!("{key}=x"),
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .next()
        .unwrap_or("")
        .trim_start_matches("overall: ")
        .to_owned()
}
