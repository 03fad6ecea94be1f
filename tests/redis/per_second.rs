//! Per-second limits in a Redis of their own (envoyproxy/ratelimit's REDIS_PERSECOND): a Go
//! deployment that sets it switches images, every per-second counter lands in the second Redis
//! and every other in the first; all or nothing across the two charges a refused call nothing.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use crate::common::process::ServeProcess;
use crate::common::redis::{RedisServer, cli, connected_store, free_port};
use portcullis::algorithm::{Algorithm, ChargeMode, Check, Limit, key};
use portcullis::clock::ManualClock;
use portcullis::pb::RateLimitServiceClient;
use portcullis::pb::rate_limit_response::Code;
use portcullis::store::redis::Topology;
use portcullis::store::split::SplitStore;
use portcullis::store::{MemoryStore, Store};

const RULES: &str = r#"
domain: edge
descriptors:
  - key: burst
    rate_limit: {unit: second, requests_per_unit: 50}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 50}
"#;

fn keys(port: u16) -> Vec<String> {
    let mut keys: Vec<String> = cli(port, &["KEYS", "*"])
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect();
    keys.sort();
    keys
}

/// Keys Redis has expired since it started (`INFO stats`).
fn expired(port: u16) -> u64 {
    cli(port, &["INFO", "stats"])
        .lines()
        .find_map(|l| l.strip_prefix("expired_keys:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("INFO stats has expired_keys")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_mode_counts_per_second_limits_in_the_per_second_redis() {
    let (main, fast) = (RedisServer::start(), RedisServer::start());
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("current/ratelimit/config");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("edge.yaml"), RULES).unwrap();
    let envs: Vec<(&str, String)> = vec![
        ("HOST", "127.0.0.1".into()),
        ("PORT", free_port().to_string()),
        ("GRPC_HOST", "127.0.0.1".into()),
        ("GRPC_PORT", free_port().to_string()),
        ("DEBUG_HOST", "127.0.0.1".into()),
        ("DEBUG_PORT", free_port().to_string()),
        (
            "RUNTIME_ROOT",
            root.path().join("current").display().to_string(),
        ),
        ("RUNTIME_SUBDIRECTORY", "ratelimit".into()),
        ("USE_STATSD", "false".into()),
        ("REDIS_SOCKET_TYPE", "tcp".into()),
        ("REDIS_URL", format!("127.0.0.1:{}", main.port)),
        ("REDIS_PERSECOND", "true".into()),
        ("REDIS_PERSECOND_SOCKET_TYPE", "tcp".into()),
        ("REDIS_PERSECOND_URL", format!("127.0.0.1:{}", fast.port)),
        ("REDIS_PERSECOND_POOL_SIZE", "2".into()),
        // Each decision's deadline (Go's REDIS_TIMEOUT), 2 s as in the other Go-mode tests: a first
        // call past the default 15 ms on a loaded machine was answered UNAVAILABLE.
        ("REDIS_TIMEOUT", "2s".into()),
    ];
    let server = ServeProcess::spawn_as_ratelimit(&envs);
    let mut client = RateLimitServiceClient::connect(server.grpc_url())
        .await
        .expect("connect");
    let call = common::request("edge", &[&[("burst", "b")], &[("user", "u")]]);
    let answer = client
        .should_rate_limit(call)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", server.log()))
        .into_inner();
    assert_eq!(answer.overall_code, Code::Ok as i32);
    // A per-second counter lives one second: on a loaded machine it may be gone before it is
    // looked for, so a key that expired counts as held (the hour counter never expires, and
    // the per-second Redis holds nothing else).
    // Expiries read before and after the keys: one that expires in between is in the keys and
    // in the second count, never in the first.
    let gone_fast_before = expired(fast.port);
    let (mut in_main, in_fast) = (keys(main.port), keys(fast.port));
    let (gone_main, gone_fast) = (expired(main.port), expired(fast.port));
    // Beside the counters, the mark that keeps replicas serving RLQS off this main Redis.
    let marks = in_main.len();
    in_main.retain(|k| !k.ends_with("{rlqs-in-use}:blind"));
    assert_eq!(marks - in_main.len(), 1, "the per-second mark: {in_main:?}");
    assert!(
        in_fast.iter().all(|k| k.contains("burst"))
            && in_fast.len() as u64 + gone_fast_before <= 1
            && in_fast.len() as u64 + gone_fast >= 1,
        "per-second Redis holds {in_fast:?} and {gone_fast_before}, then {gone_fast} expired"
    );
    assert!(
        !in_main.is_empty() && in_main.iter().all(|k| k.contains("user")) && gone_main == 0,
        "main Redis holds {in_main:?} and {gone_main} expired"
    );
    let (status, body) = common::http(server.admin_port, "GET", "/readyz", "").await;
    assert_eq!(status, 200, "{body}");
}

fn check(name: &str, window_us: u64, requests: u64) -> Check {
    let limit = Limit {
        algorithm: Algorithm::SlidingWindow,
        requests,
        window_us,
        burst: requests,
    };
    Check {
        key: key::counter_key("edge", [("k", name)], &limit, None),
        limit,
        hits: 1,
        refund: false,
        post_paid: false,
    }
}

#[tokio::test]
async fn all_or_nothing_across_the_two_stores_charges_a_refused_call_nothing() {
    let clock = Arc::new(ManualClock::new(1_763_000_000_000_000));
    let (main, fast) = (
        MemoryStore::new(clock.clone()),
        MemoryStore::new(clock.clone()),
    );
    let store = SplitStore::new(Box::new(main.clone()), Box::new(fast.clone()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
    let burst = check("burst", 1_000_000, 10);
    let hourly = check("user", 3_600_000_000, 1);
    let call = [burst.clone(), hourly.clone()];
    let remaining = |store: &Arc<MemoryStore>, check: &Check| {
        let looked = store.check_all_at(
            std::slice::from_ref(check),
            1_763_000_000_000_000,
            ChargeMode::Probe,
        );
        looked[0].as_ref().unwrap().remaining
    };

    let first = store.check(&call, deadline, ChargeMode::AllOrNothing).await;
    assert!(first.iter().all(|a| a.as_ref().unwrap().allowed));
    assert_eq!(
        (remaining(&fast, &burst), remaining(&main, &hourly)),
        (9, 0)
    );
    // The hourly limit refuses: the per-second charge is given back.
    let second = store.check(&call, deadline, ChargeMode::AllOrNothing).await;
    assert!(!second[1].as_ref().unwrap().allowed);
    assert_eq!(
        remaining(&fast, &burst),
        9,
        "the refused call charged nothing"
    );
    // Each alone: the per-second check is charged whatever the hourly one says.
    store.check(&call, deadline, ChargeMode::EachAlone).await;
    assert_eq!(remaining(&fast, &burst), 8);
    // Answers come back in the call's order whichever store decided them.
    let answers = store
        .check(
            &[hourly.clone(), burst.clone()],
            deadline,
            ChargeMode::Probe,
        )
        .await;
    assert_eq!(answers[0].as_ref().unwrap().limit, 1);
    assert_eq!(answers[1].as_ref().unwrap().limit, 10);
}

/// Redis' clock at `port`: (seconds, microseconds).
fn redis_time(port: u16) -> (u64, u64) {
    let out = cli(port, &["TIME"]);
    let mut parts = out.lines().filter_map(|l| l.trim().parse::<u64>().ok());
    (parts.next().unwrap(), parts.next().unwrap())
}

/// REDIS_PERSECOND's give-back lands in the second its charge was made in. A call charges the
/// per-second Redis in second S, then the main Redis (paused) refuses it after S has ended; the
/// next second meanwhile spends its whole limit. The give-back must not credit that second: the
/// eleventh hit of ten a second is refused. (It was credited, and admitted.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_give_back_after_its_second_ended_does_not_credit_the_next_second() {
    let (main, fast) = (RedisServer::start(), RedisServer::start());
    let fast_store = connected_store(Topology::Standalone(fast.url()), "ps:").await;
    let split = Arc::new(SplitStore::new(
        Box::new(connected_store(Topology::Standalone(main.url()), "ps:").await),
        Box::new(fast_store.clone()),
    ));
    let mut burst = check("burst", 1_000_000, 10);
    burst.limit.algorithm = Algorithm::FixedWindow;
    let hourly = check("user", 3_600_000_000, 1);
    let wait = || tokio::time::Instant::now() + Duration::from_secs(5);
    let spent = split
        .check(std::slice::from_ref(&hourly), wait(), ChargeMode::EachAlone)
        .await;
    assert!(spent[0].as_ref().unwrap().allowed);

    // Start early in a second of the per-second Redis' clock.
    let started = std::time::Instant::now();
    while redis_time(fast.port).1 > 100_000 {
        assert!(started.elapsed() < Duration::from_secs(3), "Redis' clock");
        std::thread::sleep(Duration::from_millis(5));
    }
    let second = redis_time(fast.port).0;
    pause(main.port, 1_300);
    let call = {
        let (split, call) = (split.clone(), [burst.clone(), hourly.clone()]);
        tokio::spawn(async move { split.check(&call, wait(), ChargeMode::AllOrNothing).await })
    };
    while redis_time(fast.port).0 == second {
        assert!(started.elapsed() < Duration::from_secs(3), "Redis' clock");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for n in 0..10 {
        let answer = fast_store
            .check(std::slice::from_ref(&burst), wait(), ChargeMode::EachAlone)
            .await;
        assert!(
            answer[0].as_ref().unwrap().allowed,
            "hit {n} of the next second"
        );
    }
    let answers = call.await.unwrap();
    assert!(
        !answers[1].as_ref().unwrap().allowed,
        "the hourly limit refuses"
    );
    let eleventh = fast_store
        .check(std::slice::from_ref(&burst), wait(), ChargeMode::Probe)
        .await;
    assert_eq!(
        redis_time(fast.port).0,
        second + 1,
        "the test ran past the second it measures"
    );
    assert!(
        !eleventh[0].as_ref().unwrap().allowed,
        "the next second was credited with a hit charged in the one before"
    );
}

fn pause(port: u16, ms: u64) {
    assert_eq!(
        cli(port, &["CLIENT", "PAUSE", &ms.to_string(), "ALL"]),
        "OK"
    );
}

/// `portcullis serve` on `main` (and `per_second`, when given) with `extra`, run to its end
/// (within 10 s) on free ports: its exit code and output.
fn serve_to_the_end(
    rules: &std::path::Path,
    main: &RedisServer,
    per_second: Option<&RedisServer>,
    extra: &[&str],
) -> (i32, String) {
    let (grpc, admin, main_url) = (
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
        main.url(),
    );
    let fast_url = per_second.map(RedisServer::url);
    let mut args = vec![
        "serve",
        "--config",
        rules.to_str().expect("a UTF-8 path"),
        "--grpc-addr",
        &grpc,
        "--admin-addr",
        &admin,
        "--store",
        "redis",
        "--redis-url",
        &main_url,
    ];
    if let Some(url) = &fast_url {
        args.extend(["--redis-per-second-url", url.as_str()]);
    }
    args.extend_from_slice(extra);
    common::cli::portcullis_with_env(&args, &[])
}

/// Issue 43 item 5: per-second limits counted in a Redis of their own never see the RLQS
/// grants' claims, so a replica with a per-second Redis beside replicas serving RLQS on the same
/// main Redis would spend a second's budget twice. Whichever starts second is refused, naming
/// both; one that is not refused keeps serving. Before, both started (only `--rlqs` and a
/// per-second Redis on one replica were refused).
#[test]
fn a_per_second_redis_and_rlqs_on_one_redis_refuse_whichever_starts_second() {
    let rules = common::cli::dir_with(&[("edge.yaml", RULES)]);
    let url = |r: &RedisServer| r.url();
    // RLQS first: the replica with a per-second Redis is refused.
    let (main, fast) = (RedisServer::start(), RedisServer::start());
    let rlqs = ServeProcess::spawn(
        rules.path(),
        &["--store", "redis", "--redis-url", &url(&main), "--rlqs"],
        &[],
        &[],
    );
    let (code, out) = serve_to_the_end(rules.path(), &main, Some(&fast), &[]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("--redis-per-second-url set, and replicas serving RLQS share this Redis"),
        "{out}"
    );
    assert!(still_serving(&rlqs), "the RLQS replica serves on");
    drop(rlqs);

    // The replica with a per-second Redis first: the one serving RLQS is refused.
    let (main, fast) = (RedisServer::start(), RedisServer::start());
    let per_second = ServeProcess::spawn(
        rules.path(),
        &[
            "--store",
            "redis",
            "--redis-url",
            &url(&main),
            "--redis-per-second-url",
            &url(&fast),
        ],
        &[],
        &[],
    );
    let (code, out) = serve_to_the_end(rules.path(), &main, None, &["--rlqs"]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("a replica with --redis-per-second-url counts its per-second limits"),
        "{out}"
    );
    assert!(
        still_serving(&per_second),
        "the per-second replica serves on"
    );
    // On a main Redis of its own, the same RLQS replica starts.
    let other = RedisServer::start();
    let rlqs = ServeProcess::spawn(
        rules.path(),
        &["--store", "redis", "--redis-url", &url(&other), "--rlqs"],
        &[],
        &[],
    );
    drop((rlqs, per_second));
}

/// Whether `server` is still running (not exited).
fn still_serving(server: &ServeProcess) -> bool {
    std::net::TcpStream::connect(("127.0.0.1", server.grpc_port)).is_ok()
}
