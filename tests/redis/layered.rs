//! Layered limits (`rate_limits:`): several limits on one descriptor, a hit admitted only when
//! every one admits it and then charged to all of them, a refusal charged to none, all in one
//! atomic step. On the memory store with a manual clock (exact scenarios), and on standalone Redis
//! and Cluster (300 concurrent calls admit exactly the tightest limit).

use crate::common;

use std::time::Duration;

use crate::common::redis::{RedisCluster, RedisServer};
use crate::common::{TestServer, header, request};
use portcullis::pb::RateLimitResponse;
use portcullis::pb::rate_limit_response::Code;
use portcullis::pb::rate_limit_response::rate_limit::Unit as PbUnit;
use portcullis::service::HeadersMode;
use portcullis::settings::{Settings, StoreKind};

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

const RULES: &str = r#"
domain: api
descriptors:
  - key: client
    rate_limits:
      - {name: burst, unit: second, requests_per_unit: 10, algorithm: token_bucket, burst: 20}
      - {name: hourly, unit: hour, requests_per_unit: 1000}
      - {name: daily, unit: day, requests_per_unit: 50000, algorithm: fixed_window}
  - key: tight
    rate_limits:
      - {name: bucket, unit: second, requests_per_unit: 5, algorithm: token_bucket}
      - {name: fixed, unit: hour, requests_per_unit: 7, algorithm: fixed_window}
  - key: trio
    rate_limits:
      - {unit: hour, requests_per_unit: 100}
      - {name: tightest, unit: hour, requests_per_unit: 60, algorithm: fixed_window}
      - {unit: minute, requests_per_unit: 1000, algorithm: token_bucket, burst: 80}
  - key: partner
    rate_limit: {unit: hour, requests_per_unit: 5000, replaces: [{name: hourly}]}
"#;

/// (code, limit name, requests per unit, unit, remaining) of the call's first status.
fn first(r: &RateLimitResponse) -> (i32, String, u32, i32, u32) {
    let s = &r.statuses[0];
    let limit = s.current_limit.as_ref().expect("a limit");
    (
        s.code,
        limit.name.clone(),
        limit.requests_per_unit,
        limit.unit,
        s.limit_remaining,
    )
}

#[tokio::test]
async fn a_burst_then_the_rate_then_the_hour_each_binds_in_turn() {
    let server = TestServer::start_with(&[("api.yaml", RULES)], |s| {
        s.response_headers = HeadersMode::Draft03
    })
    .await;
    let call = || server.ok(request("api", &[&[("client", "c1")]]));
    // The burst: 20 at once, the 21st refused by the bucket, whose name the status carries.
    for n in 0..20 {
        assert_eq!(call().await.overall_code, OK, "burst call {n}");
    }
    let r = call().await;
    assert_eq!(
        first(&r),
        (OVER, "burst".into(), 10, PbUnit::Second as i32, 0)
    );
    // Every policy in the headers, the binding one first.
    assert_eq!(
        header(&r, "x-ratelimit-limit"),
        Some(
            "10, 10;w=1;name=\"burst\", 1000;w=3600;name=\"hourly\", 50000;w=86400;name=\"daily\""
        )
    );
    assert_eq!(header(&r, "retry-after"), Some("1"));
    // Then held to 10 a second: ten per second pass for the rest of the hour's budget.
    let mut admitted = 20;
    let mut refused_by = None;
    for _ in 0..2000 {
        server.clock.advance_us(100_000);
        let r = call().await;
        if r.overall_code == OK {
            admitted += 1;
        } else {
            refused_by = Some(first(&r));
            break;
        }
    }
    // The hour binds at exactly 1,000 (the refused 21st call charged nothing anywhere).
    assert_eq!(admitted, 1000);
    let (code, name, requests, unit, remaining) = refused_by.expect("the hour ran out");
    assert_eq!(
        (code, name.as_str(), requests, unit, remaining),
        (OVER, "hourly", 1000, PbUnit::Hour as i32, 0)
    );
    // While allowed, the status names the limit with the least left.
    let r = server.ok(request("api", &[&[("client", "c2")]])).await;
    assert_eq!(
        first(&r),
        (OK, "burst".into(), 10, PbUnit::Second as i32, 19)
    );
    server.stop().await;
}

#[tokio::test]
async fn a_refusal_by_one_layer_charges_none() {
    let server = TestServer::start(&[("api.yaml", RULES)]).await;
    let call = || server.ok(request("api", &[&[("tight", "t")]]));
    for _ in 0..5 {
        assert_eq!(call().await.overall_code, OK);
    }
    // The bucket refuses the 6th and 7th; the hourly window must not have counted them.
    for _ in 0..2 {
        let r = call().await;
        assert_eq!(first(&r).0, OVER);
        assert_eq!(first(&r).1, "bucket");
    }
    server.clock.advance_us(1_000_000);
    // A second later the bucket holds 5 again, but the hour has only 2 left: 7 in all.
    assert_eq!(call().await.overall_code, OK);
    assert_eq!(call().await.overall_code, OK);
    let r = call().await;
    assert_eq!(first(&r), (OVER, "fixed".into(), 7, PbUnit::Hour as i32, 0));
    server.stop().await;
}

#[tokio::test]
async fn a_window_and_a_bucket_never_admit_more_than_either_allows() {
    let server = TestServer::start(&[("api.yaml", RULES)]).await;
    // xorshift: a reproducible, bursty arrival pattern over four hours.
    let mut state: u64 = 0x1234_5678_9ABC_DEF1;
    let mut admitted_at: Vec<u64> = Vec::new();
    let mut now = 0u64;
    for _ in 0..3000 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let step = match state % 4 {
            0 => 0,
            1 => state % 200_000,
            2 => state % 5_000_000,
            _ => state % 60_000_000,
        };
        server.clock.advance_us(step);
        now += step;
        let r = server.ok(request("api", &[&[("tight", "w")]])).await;
        if r.overall_code == OK {
            admitted_at.push(now);
        }
    }
    assert!(admitted_at.len() > 20, "the test admitted something");
    for (i, &at) in admitted_at.iter().enumerate() {
        // The fixed window: never more than 7 in one clock hour.
        let hour = at / 3_600_000_000;
        let same_hour = admitted_at
            .iter()
            .filter(|t| **t / 3_600_000_000 == hour)
            .count();
        assert!(same_hour <= 7, "{same_hour} in hour {hour}");
        // The bucket (5 a second, burst 5): at most 5 + 5 per second over any span.
        for &later in &admitted_at[i..] {
            let span_s = (later - at) as f64 / 1e6;
            let within = admitted_at
                .iter()
                .filter(|t| **t >= at && **t <= later)
                .count() as f64;
            assert!(
                within <= 5.0 + 5.0 * span_s + 1e-9,
                "{within} admitted in {span_s} s"
            );
        }
    }
    server.stop().await;
}

#[tokio::test]
async fn replaces_drops_a_layer_by_its_name_and_metrics_count_per_layer() {
    let server = TestServer::start(&[("api.yaml", RULES)]).await;
    // The partner's rule replaces the hourly layer: burst and daily still apply.
    let r = server
        .ok(request(
            "api",
            &[&[("client", "p")], &[("partner", "acme")]],
        ))
        .await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(first(&r).1, "burst");
    let admin = server.running.as_ref().unwrap().admin_addr.port();
    let (_, metrics) = common::http(admin, "GET", "/metrics", "").await;
    let hits = |rule: &str| {
        common::sample(
            &metrics,
            &format!("portcullis_rule_hits_total{{domain=\"api\",rule=\"{rule}\"}}"),
        )
    };
    assert_eq!(hits("api.client/burst"), 1.0, "{metrics}");
    assert_eq!(hits("api.client/daily"), 1.0);
    assert_eq!(hits("api.client/hourly"), 0.0, "replaced: not counted");
    // /rlconfig lists every layer.
    let (_, config) = common::http(admin, "GET", "/rlconfig", "").await;
    assert!(
        config.contains(
            "api.client: 10 per second, token_bucket, burst 20, name \"burst\" AND 1000 per hour, \
             sliding_window, name \"hourly\" AND 50000 per day, fixed_window, name \"daily\""
        ),
        "{config}"
    );
    server.stop().await;
}

async fn exactly_the_tightest(adjust: impl Fn(&mut Settings) + Copy) {
    let a = TestServer::start_with(&[("api.yaml", RULES)], adjust).await;
    let b = TestServer::start_with(&[("api.yaml", RULES)], adjust).await;
    let clients = [a.client.clone(), b.client.clone()];
    let admitted =
        common::count_admitted(&clients, request("api", &[&[("trio", "hot")]]), 300).await;
    assert_eq!(admitted, 60, "the tightest layer (60 an hour) decides");
    // Nothing refused was charged: the other layers hold exactly 60 too.
    let r = a.ok(request("api", &[&[("trio", "hot")]])).await;
    assert_eq!(first(&r).1, "tightest");
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hundred_concurrent_calls_on_memory_admit_exactly_the_tightest() {
    let a = TestServer::start(&[("api.yaml", RULES)]).await;
    let admitted = common::count_admitted(
        std::slice::from_ref(&a.client),
        request("api", &[&[("trio", "hot")]]),
        300,
    )
    .await;
    assert_eq!(admitted, 60);
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hundred_concurrent_calls_on_standalone_redis_admit_exactly_the_tightest() {
    let redis = RedisServer::start();
    let url = redis.url();
    exactly_the_tightest(|s| {
        s.store = StoreKind::Redis;
        s.redis_url = Some(url.clone());
        s.store_timeout = Duration::from_secs(2);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hundred_concurrent_calls_on_cluster_admit_exactly_the_tightest() {
    let cluster = RedisCluster::start_with_replicas(0);
    let seeds = cluster.seeds();
    exactly_the_tightest(|s| {
        s.store = StoreKind::Redis;
        s.redis_cluster = seeds.clone();
        s.store_timeout = Duration::from_secs(2);
    })
    .await;
    // One slot for the descriptor's layers: every key of it on one node, one key per layer.
    // The minute's token bucket may be full again and expired on a loaded machine, then made
    // again by the last check above (a count of keys plus expired keys once found 3 + 1): the
    // two hour layers must be there, the bucket may be, nothing else.
    let port = cluster.master_of("{api|trio=hot}");
    let keys = common::redis::cli(port, &["KEYS", "*trio=hot*"]);
    let layer = |k: &str| {
        ["tb", "fw", "sw60"]
            .iter()
            .find(|l| k.contains(&format!(":{l}:")))
    };
    let layers: Vec<&str> = keys.lines().filter_map(|k| layer(k).copied()).collect();
    assert_eq!(
        layers.len(),
        keys.lines().count(),
        "only layer keys: {keys}"
    );
    assert!(
        layers.contains(&"fw") && layers.contains(&"sw60") && layers.len() <= 3,
        "the hour layers, and the minute's bucket at most once: {keys}"
    );
    for seed in &seeds {
        let other: u16 = seed.rsplit(':').next().unwrap().parse().unwrap();
        if other != port {
            let keys = common::redis::cli(other, &["KEYS", "*trio=hot*"]);
            assert!(keys.is_empty(), "another node holds {keys}");
        }
    }
}

/// One layered descriptor's checks (one hash tag), as the decider sends them: all or nothing.
fn layered_checks(value: &str, hits: u64) -> Vec<portcullis::algorithm::Check> {
    use portcullis::algorithm::{Algorithm, Check, Limit, key};
    let limits = [
        Limit {
            algorithm: Algorithm::TokenBucket,
            requests: 10,
            window_us: 1_000_000,
            burst: 20,
        },
        Limit {
            algorithm: Algorithm::SlidingWindow,
            requests: 100,
            window_us: 3_600_000_000,
            burst: 100,
        },
        Limit {
            algorithm: Algorithm::FixedWindow,
            requests: 500,
            window_us: 86_400_000_000,
            burst: 500,
        },
    ];
    limits
        .iter()
        .map(|limit| Check {
            key: key::counter_key("layers", [("client", value)], limit, None),
            limit: *limit,
            hits,
            refund: false,
            post_paid: false,
        })
        .collect()
}

/// Burst then sustained, on Redis with the scripts' clock fixed by the test: the decisions are
/// the memory store's, step by step, and a refused hit moves no layer.
async fn layered_like_the_model(store: portcullis::store::RedisStore) {
    use portcullis::algorithm::ChargeMode;
    use portcullis::store::MemoryStore;
    use portcullis::store::redis::ScriptClock;
    let memory = MemoryStore::new(std::sync::Arc::new(portcullis::clock::ManualClock::new(0)));
    // 2100-01-01, so keys written on the fixed clock never expire by wall time mid-test.
    let mut now: u64 = 4_102_444_800_000_000;
    let mut admitted = 0;
    for step in 0..400u64 {
        // 25 at once, then one every 50 ms (faster than the bucket's 10 a second), then gaps.
        now += match step {
            0..25 => 0,
            25..300 => 50_000,
            _ => 2_000_000,
        };
        let hits = if step % 37 == 0 { 3 } else { 1 };
        let checks = layered_checks("model", hits);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        let from_redis: Vec<_> = store
            .check_with_clock(
                &checks,
                ScriptClock::Fixed(now),
                deadline,
                ChargeMode::AllOrNothing,
            )
            .await
            .into_iter()
            .map(|a| a.expect("redis answers"))
            .collect();
        let from_memory: Vec<_> = memory
            .check_all_at(&checks, now, ChargeMode::AllOrNothing)
            .into_iter()
            .map(|a| a.expect("memory answers"))
            .collect();
        assert_eq!(from_redis, from_memory, "step {step}");
        if from_redis.iter().all(|d| d.allowed) {
            admitted += hits;
        }
    }
    // The burst's 20, the bucket's pace, then the hour's 100 binds.
    assert_eq!(admitted, 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layers_on_standalone_redis_decide_like_the_model() {
    let redis = RedisServer::start();
    let store = common::redis::connected_store(
        portcullis::store::redis::Topology::Standalone(redis.url()),
        "layered:",
    )
    .await;
    layered_like_the_model(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layers_on_cluster_decide_like_the_model_in_one_script_call() {
    let cluster = RedisCluster::start_with_replicas(0);
    let store = common::redis::connected_store(
        portcullis::store::redis::Topology::Cluster(cluster.seeds()),
        "layered:",
    )
    .await;
    let calls_before: u64 = cluster.nodes.iter().map(|n| eval_calls(n.port)).sum();
    layered_like_the_model(store).await;
    let calls: u64 = cluster
        .nodes
        .iter()
        .map(|n| eval_calls(n.port))
        .sum::<u64>()
        - calls_before;
    // One script call per decision (400), not a look and a charge per layer.
    assert!(
        calls <= 410,
        "{calls} script calls for 400 layered decisions"
    );
}

/// Script calls a node has run (FCALL, EVALSHA and EVAL).
fn eval_calls(port: u16) -> u64 {
    common::redis::script_calls(port)
}

/// A layered `post_paid` rule (tokens per minute and per day): a charge that does not fit is
/// recorded on every layer all the same, and every later check is refused by the layer it took
/// past its limit, on the memory store and on standalone Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_paid_layered_rule_records_every_charge_on_every_layer() {
    const TOKENS: &str = r#"
domain: llm
descriptors:
  - key: tenant
    post_paid: true
    rate_limits:
      - {name: per-minute, unit: minute, requests_per_unit: 100, algorithm: token_bucket}
      - {name: per-day, unit: day, requests_per_unit: 150, algorithm: fixed_window}
"#;
    let redis = RedisServer::start();
    for on_redis in [false, true] {
        let url = redis.url();
        let server = TestServer::start_with(&[("llm.yaml", TOKENS)], move |s| {
            if on_redis {
                s.store = StoreKind::Redis;
                s.redis_url = Some(url);
            }
        })
        .await;
        let tenant = format!("t-{on_redis}");
        let check = || {
            let mut r = request("llm", &[&[("tenant", tenant.as_str())]]);
            r.descriptors[0].hits_addend = Some(0);
            r
        };
        let charge = |tokens: u64| {
            let mut r = request("llm", &[&[("tenant", tenant.as_str())]]);
            r.descriptors[0].hits_addend = Some(tokens);
            r
        };
        for n in 0..3 {
            assert_eq!(server.ok(check()).await.overall_code, OK, "request {n}");
            server.ok(charge(40)).await;
        }
        // 120 of 100 a minute recorded, 120 of 150 a day: the minute refuses.
        let r = server.ok(check()).await;
        assert_eq!(first(&r).0, OVER, "on Redis: {on_redis}");
        assert_eq!(first(&r).1, "per-minute");
        // Both layers were charged all three times: the day holds 120.
        if on_redis {
            let key = format!("portcullis:{{llm|tenant={tenant}}}:fw:86400000000us");
            assert_eq!(common::redis::fixed_count(redis.port, &key), "120");
        } else {
            server.clock.advance_us(120_000_000);
            let r = server.ok(check()).await;
            assert_eq!(r.overall_code, OK, "the minute drained");
            assert_eq!(first(&r).4, 30, "the day's layer binds now, 120 spent");
        }
        server.stop().await;
    }
}

/// A concurrency layer beside a rate layer: a request must pass both (a refused one takes no
/// slot), and a release gives the slot back while the rate layer keeps the request it counted.
#[tokio::test]
async fn a_concurrency_layer_releases_its_slot_and_the_rate_layer_keeps_its_count() {
    const BOTH: &str = "domain: cl
descriptors:
  - key: user
    rate_limits:
      - {name: slots, algorithm: concurrency, requests_per_unit: 1, unit: minute}
      - {name: rate, unit: hour, requests_per_unit: 2, algorithm: fixed_window}
";
    let server = TestServer::start(&[("cl.yaml", BOTH)]).await;
    let take = || request("cl", &[&[("user", "u")]]);
    let release = || {
        let mut r = request("cl", &[&[("user", "u")]]);
        r.descriptors[0].is_negative_hits = true;
        r
    };
    assert_eq!(server.ok(take()).await.overall_code, OK);
    // The slot is held: refused, and the rate layer is not charged for it.
    assert_eq!(server.ok(take()).await.overall_code, OVER);
    assert_eq!(server.ok(release()).await.overall_code, OK);
    // Released: the second request of the hour passes; the rate layer kept the first.
    assert_eq!(server.ok(take()).await.overall_code, OK);
    assert_eq!(server.ok(release()).await.overall_code, OK);
    let third = server.ok(take()).await;
    assert_eq!(third.overall_code, OVER, "two an hour, the slot free");
    assert_eq!(
        third.statuses[0].current_limit.as_ref().unwrap().name,
        "rate"
    );
    server.stop().await;
}
