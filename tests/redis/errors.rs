//! An error Redis gives on one key fails that key only: a write refused for memory (`maxmemory`
//! with `noeviction`) or a key of another type must not turn the other calls of the same script
//! call, refusals included, into failure-mode answers.

use crate::common;

use std::time::Duration;

use crate::common::redis::{RedisServer, cli, plain_config, script_calls};
use portcullis::algorithm::{Algorithm, ChargeMode, Check, Limit, key};
use portcullis::store::redis::{ScriptClock, Topology};
use portcullis::store::{Answers, RedisStore, StoreError};

fn hourly(requests: u64) -> Limit {
    Limit {
        algorithm: Algorithm::SlidingWindow,
        requests,
        window_us: 3_600_000_000,
        burst: requests,
    }
}

fn check_of(name: &str, limit: Limit) -> Check {
    Check {
        key: key::counter_key("errors", [("k", name)], &limit, None),
        limit,
        hits: 1,
        refund: false,
        post_paid: false,
    }
}

/// One connection: calls made while it is busy ride one script call.
async fn store_on(redis: &RedisServer, prefix: &str) -> RedisStore {
    let config = plain_config(Topology::Standalone(redis.url()), 1);
    let store = RedisStore::new(&config, prefix, Default::default()).unwrap();
    store
        .probe(Duration::from_secs(10))
        .await
        .expect("Redis usable");
    store
}

/// Every call at once, on a single-threaded runtime: they are queued before the dispatcher
/// runs, so they go out together.
async fn at_once(store: &RedisStore, calls: &[Vec<Check>], mode: ChargeMode) -> Vec<Answers> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    let futures = calls
        .iter()
        .map(|checks| store.check_with_clock(checks, ScriptClock::RedisTime, deadline, mode));
    futures_util::future::join_all(futures).await
}

#[tokio::test]
async fn a_key_of_another_type_fails_only_its_own_call_of_the_batch() {
    let redis = RedisServer::start();
    let store = store_on(&redis, "e1:").await;
    let calls: Vec<Vec<Check>> = (0..20)
        .map(|i| vec![check_of(&format!("user{i}"), hourly(5))])
        .collect();
    // Another program wrote a string where call 7's counter lives.
    let foreign = format!("e1:{}", calls[7][0].key);
    assert_eq!(cli(redis.port, &["SET", &foreign, "not a counter"]), "OK");
    cli(redis.port, &["CONFIG", "RESETSTAT"]);

    let answers = at_once(&store, &calls, ChargeMode::EachAlone).await;
    assert_eq!(
        script_calls(redis.port),
        1,
        "the calls rode one script call"
    );
    for (i, answer) in answers.iter().enumerate() {
        if i == 7 {
            let error = answer[0].as_ref().expect_err("the foreign key fails");
            assert!(error.is_permanent(), "{error}");
            assert!(error.to_string().contains("WRONGTYPE"), "{error}");
        } else {
            let decision = answer[0].as_ref().expect("decided by Redis");
            assert!(
                decision.allowed && decision.remaining == 4,
                "call {i}: {decision:?}"
            );
        }
    }
    // What the others admitted was written; the foreign key is untouched.
    let again = at_once(&store, &calls[..1], ChargeMode::Probe).await;
    assert_eq!(again[0][0].as_ref().unwrap().remaining, 4);
    assert_eq!(cli(redis.port, &["GET", &foreign]), "not a counter");

    // In one call of two descriptors charged each alone, the other descriptor is decided.
    let pair = vec![check_of("user3", hourly(5)), calls[7][0].clone()];
    let answers = at_once(&store, std::slice::from_ref(&pair), ChargeMode::EachAlone).await;
    assert_eq!(answers[0][0].as_ref().unwrap().remaining, 3);
    assert!(answers[0][1].is_err());
    // All or nothing: the call cannot be decided whole, so nothing of it is charged.
    let answers = at_once(&store, &[pair], ChargeMode::AllOrNothing).await;
    assert!(answers[0].iter().all(Result::is_err), "{:?}", answers[0]);
    let looked = at_once(&store, &calls[3..4], ChargeMode::Probe).await;
    assert_eq!(looked[0][0].as_ref().unwrap().remaining, 3);
}

/// The fixed window's and the bucket's string layout tells another program's string from a
/// counter (by its length: 16 bytes for a fixed window, 8 or 24 for a bucket) on the cold path
/// (`fixed_quick`, `bucket_quick`) and the held one alike: the key fails alone, untouched, the
/// others of the script call are decided.
#[tokio::test]
async fn a_foreign_string_where_a_fixed_window_or_a_bucket_lives_fails_only_its_key() {
    let redis = RedisServer::start();
    let store = store_on(&redis, "e5:").await;
    for algorithm in [Algorithm::FixedWindow, Algorithm::TokenBucket] {
        let limit = Limit {
            algorithm,
            ..hourly(5)
        };
        let name = format!("{algorithm:?}");
        let calls: Vec<Vec<Check>> = (0..6)
            .map(|i| vec![check_of(&format!("{name}{i}"), limit)])
            .collect();
        let foreign = format!("e5:{}", calls[2][0].key);
        assert_eq!(cli(redis.port, &["SET", &foreign, "not a counter"]), "OK");
        // Alone on its key (the quick path), then beside a second check of the same key (held).
        for (round, calls) in [
            calls.clone(),
            calls
                .iter()
                .map(|c| [c.clone(), c.clone()].concat())
                .collect(),
        ]
        .iter()
        .enumerate()
        {
            let answers = at_once(&store, calls, ChargeMode::EachAlone).await;
            for (i, answer) in answers.iter().enumerate() {
                if i == 2 {
                    let error = answer[0].as_ref().expect_err("the foreign key fails");
                    assert!(
                        error.to_string().contains("WRONGTYPE"),
                        "{name} {round}: {error}"
                    );
                } else {
                    assert!(
                        answer[0].as_ref().expect("decided").allowed,
                        "{name} {round} {i}"
                    );
                }
            }
        }
        assert_eq!(cli(redis.port, &["GET", &foreign]), "not a counter");
    }
}

/// Every algorithm: a new key's admission is made and read by one `SET … NX GET` (a bucket's
/// always, a window's once most keys met were new), which a full Redis refuses as it refuses any
/// write; the key is then read as before, and its refusal kept.
#[tokio::test]
async fn out_of_memory_fails_the_admissions_that_need_a_write_and_keeps_every_refusal() {
    const LEAD: usize = 9;
    let redis = RedisServer::start_with(&["--maxmemory-policy", "noeviction"]);
    let store = store_on(&redis, "e2:").await;
    for algorithm in [
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
    ] {
        let of = |requests| Limit {
            algorithm,
            ..hourly(requests)
        };
        let name = |what: &str, i: usize| format!("{what}{i}-{algorithm:?}");
        let spent: Vec<Check> = (0..10)
            .map(|i| check_of(&name("spent", i), of(1)))
            .collect();
        // Each spent key has used its budget.
        for answer in at_once(&store, std::slice::from_ref(&spent), ChargeMode::EachAlone).await {
            assert!(answer.iter().all(|a| a.as_ref().unwrap().allowed));
        }
        assert_eq!(cli(redis.port, &["CONFIG", "SET", "maxmemory", "1"]), "OK");
        cli(redis.port, &["CONFIG", "RESETSTAT"]);

        // Nine new admissions, then refusals and new admissions interleaved, in one script
        // call: after the nine, the windows' quick paths guess keys new and try SET's NX with
        // GET first, which a full Redis refuses too (lua/fixed_window.lua; a full Redis runs no
        // function, so the script call goes by EVALSHA and guesses from its own keys only).
        let calls: Vec<Vec<Check>> = (0..LEAD + 20)
            .map(|i| {
                if i >= LEAD && (i - LEAD).is_multiple_of(2) {
                    vec![spent[(i - LEAD) / 2].clone()]
                } else {
                    vec![check_of(&name("fresh", i), of(5))]
                }
            })
            .collect();
        let answers = at_once(&store, &calls, ChargeMode::EachAlone).await;
        assert_eq!(
            script_calls(redis.port),
            1,
            "the calls rode one script call"
        );
        for (i, answer) in answers.iter().enumerate() {
            let refusal = i >= LEAD && (i - LEAD).is_multiple_of(2);
            match &answer[0] {
                Ok(decision) => {
                    assert!(
                        refusal,
                        "{algorithm:?} call {i} admitted without its write: {decision:?}"
                    );
                    assert!(!decision.allowed, "{algorithm:?} call {i}: {decision:?}");
                    // A spent key's reset: an hour on, but for the fixed window's (at the
                    // hour's end, aligned).
                    let floor = match algorithm {
                        Algorithm::FixedWindow => Duration::ZERO,
                        _ => Duration::from_secs(3000),
                    };
                    assert!(decision.reset_after > floor, "{algorithm:?}: {decision:?}");
                }
                Err(StoreError::Unavailable(message)) => {
                    assert!(!refusal, "{algorithm:?} refusal {i} lost: {message}");
                    assert!(message.contains("out of memory"), "{message}");
                }
                Err(other) => panic!("{algorithm:?} call {i}: {other}"),
            }
        }
        // Memory back: the fresh keys are counted from zero (nothing half written).
        assert_eq!(cli(redis.port, &["CONFIG", "SET", "maxmemory", "0"]), "OK");
        let answers = at_once(&store, &calls[1..2], ChargeMode::EachAlone).await;
        assert_eq!(
            answers[0][0].as_ref().unwrap().remaining,
            4,
            "{algorithm:?}"
        );
    }
}

/// A call that reaches Redis after its deadline (held in a partition, delivered once it heals)
/// is not run: its caller was answered by the failure mode, and charging it too would count it
/// twice (under `local`, once here and once in memory). Calls carry their deadline on Redis'
/// clock, as this process estimates it from the replies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_reaches_redis_after_its_deadline_is_not_charged() {
    let redis = RedisServer::start();
    let proxy = common::proxy::Proxy::start(redis.port).await;
    let config = plain_config(
        Topology::Standalone(format!("redis://127.0.0.1:{}", proxy.port)),
        1,
    );
    let store = RedisStore::new(&config, "e3:", Default::default()).unwrap();
    store
        .probe(Duration::from_secs(10))
        .await
        .expect("Redis usable");
    // One call answered: the store now knows Redis' clock.
    let warm = check_of("warm", hourly(5));
    assert!(at_once(&store, &[vec![warm]], ChargeMode::EachAlone).await[0][0].is_ok());

    proxy.partition(true);
    let late = check_of("late", hourly(5));
    let deadline = tokio::time::Instant::now() + Duration::from_millis(100);
    let answer = store
        .check_with_clock(
            std::slice::from_ref(&late),
            ScriptClock::RedisTime,
            deadline,
            ChargeMode::EachAlone,
        )
        .await;
    assert!(
        answer[0].is_err(),
        "the partition held the call past its deadline"
    );
    cli(redis.port, &["CONFIG", "RESETSTAT"]);
    proxy.partition(false);
    // The held script call reaches Redis and runs (it is counted), without charging.
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while script_calls(redis.port) == 0 {
        assert!(
            std::time::Instant::now() < until,
            "the held call never arrived"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let key = format!("e3:{}", late.key);
    assert_eq!(
        cli(redis.port, &["EXISTS", &key]),
        "0",
        "charged after its deadline"
    );
}

/// A master that refuses writes for want of replicas (`min-replicas-to-write`: NOREPLICAS, every
/// script call refused, reads included) is unavailable, not a protocol fault: the failure mode
/// answers, as for a Redis that is down, and the error says what it means (issue 45 item 3).
#[tokio::test]
async fn noreplicas_is_an_outage_that_says_what_it_means() {
    let redis = RedisServer::start_with(&["--min-replicas-to-write", "1"]);
    let config = plain_config(Topology::Standalone(redis.url()), 1);
    let store = RedisStore::new(&config, "nr:", Default::default()).unwrap();
    let one = || async {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        let checks = [check_of("u", hourly(5))];
        store
            .check_with_clock(
                &checks,
                ScriptClock::RedisTime,
                deadline,
                ChargeMode::EachAlone,
            )
            .await
            .remove(0)
    };
    match one().await {
        Err(StoreError::Unavailable(text)) => assert!(
            text.contains("NOREPLICAS") && text.contains("min-replicas-to-write"),
            "{text}"
        ),
        other => panic!("{other:?}"),
    }
    // Once the setting is lifted, decided again.
    cli(redis.port, &["CONFIG", "SET", "min-replicas-to-write", "0"]);
    let answer = one().await;
    assert!(answer.as_ref().is_ok_and(|d| d.allowed), "{answer:?}");
}
