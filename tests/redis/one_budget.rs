//! One budget (RLS and RLQS on one rule's counters): an RLS check counts what the gateways'
//! grants claim of its window in the same step as its counter, on Redis exactly as on the
//! memory model (random holder tables, every algorithm, windows of a second and a minute, the
//! clock moving on); and a gateway's admissions, charged at its report, with what RLS spends,
//! never pass the rule.

use std::sync::Arc;

use crate::common::redis::{RedisServer, cli, connected_store, decide};
use portcullis::algorithm::share::Holder;
use portcullis::algorithm::{Algorithm, ChargeMode, Check, Limit, key};
use portcullis::clock::ManualClock;
use portcullis::store::quota::{MemoryClaims, MemoryQuota, RlsTally};
use portcullis::store::redis::{ScriptClock, Topology};
use portcullis::store::{MemoryStore, Store};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// 2100-01-01: keys never expire by wall time mid-test.
const FUTURE_US: u64 = 4_102_444_800_000_000;
const S: u64 = 1_000_000;

/// A holder record as `lua/quota.lua` writes it.
fn record(h: &Holder) -> String {
    format!(
        "{:?}:{:?}:{}:{}:{:?}:{}",
        h.demand, h.granted, h.expires_us, h.since_us, h.claim_rate, h.keep_until_us
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rls_checks_count_the_grants_claims_in_redis_as_in_the_model() {
    let redis = RedisServer::start();
    let store = connected_store(Topology::Standalone(redis.url()), "ob:").await;
    store.count_claims(Arc::new(RlsTally::default()), true);
    let clock = ManualClock::new(FUTURE_US);
    let quota = Arc::new(MemoryQuota::new(Arc::new(clock.clone())));
    let memory = MemoryStore::new(Arc::new(clock.clone()));
    let tally = Arc::new(RlsTally::default());
    memory.count_claims(MemoryClaims {
        quota: quota.clone(),
        tally: tally.clone(),
    });
    let mut rng = StdRng::seed_from_u64(29);
    let mut held_seen = 0;
    for case in 0..120u64 {
        let algorithm = [
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
            Algorithm::TokenBucket,
        ][case as usize % 3];
        let window_us = [S, 60 * S][rng.random_range(0..2)];
        let requests = rng.random_range(1..60);
        let limit = Limit {
            algorithm,
            requests,
            window_us,
            burst: if algorithm == Algorithm::TokenBucket {
                rng.random_range(1..2 * requests + 1)
            } else {
                requests
            },
        };
        let entries = [("case", case.to_string())];
        let counter = key::counter_key(
            "ob",
            entries.iter().map(|(k, v)| (*k, v.as_str())),
            &limit,
            None,
        );
        let tag = key::descriptor_tag(&counter).to_owned();
        let mut now = FUTURE_US + rng.random_range(0..86_400) * S + rng.random_range(0..S);
        // Zero to three gateways' standings, one of them RLS demand at times; some ended.
        let holders: Vec<Holder> = (0..rng.random_range(0..4))
            .map(|g| {
                let since_us = now - rng.random_range(0..8 * S);
                let expires_us = since_us + rng.random_range(0..12 * S);
                let rls = rng.random_bool(0.15);
                let rate = [0.0, 0.5, 2.0, 7.25, 30.0][rng.random_range(0..5)];
                Holder {
                    gateway: g,
                    demand: 3.0,
                    granted: if rls { 0.0 } else { rate },
                    expires_us,
                    rls,
                    since_us,
                    claim_rate: if rls { 0.0 } else { rate },
                    granted_rate: if rls { 0.0 } else { rate },
                    reserved_since_us: 0,
                    keep_until_us: expires_us + window_us,
                }
            })
            .collect();
        quota.put(&tag, holders.clone());
        let table = format!("ob:{tag}:q");
        for h in &holders {
            let field = if h.rls {
                format!("r{}", h.gateway)
            } else {
                h.gateway.to_string()
            };
            cli(redis.port, &["HSET", &table, &field, &record(h)]);
        }
        for step in 0..12 {
            now += [0, 1_000, S / 7, 2 * S][rng.random_range(0..4)];
            clock.set_us(now);
            // Post-paid charges too (a bucket's are recorded in its claims' frame: a report's
            // charge takes the place of its claim).
            let post_paid = rng.random_bool(0.25);
            let check = Check {
                key: counter.clone(),
                limit,
                hits: rng.random_range(0..if post_paid { 40 } else { 4 }),
                refund: false,
                post_paid,
            };
            let want = memory
                .check(
                    std::slice::from_ref(&check),
                    tokio::time::Instant::now(),
                    ChargeMode::EachAlone,
                )
                .await;
            let want = want[0].clone().expect("memory decides");
            let got = decide(
                &store,
                std::slice::from_ref(&check),
                ScriptClock::Fixed(now),
            )
            .await;
            assert_eq!(
                got[0], want,
                "case {case} step {step}: {limit:?} at {now} with {holders:?}"
            );
            // A window's limit is lowered by the claims; a bucket is read as if they were drawn.
            let claims: Vec<_> = holders
                .iter()
                .filter(|h| h.keep_until_us > now)
                .filter_map(Holder::claim)
                .collect();
            if want.limit < limit.capacity()
                || (algorithm == Algorithm::TokenBucket
                    && portcullis::algorithm::claims::claimed(&claims, &limit, now) > 0)
            {
                held_seen += 1;
            }
        }
    }
    // The claims did lower limits (the comparison is not of two stores ignoring them).
    assert!(held_seen > 100, "{held_seen} checks saw a claim");
    // The RLS hits on held descriptors were tallied as RLS demand.
    assert!(!tally.take().is_empty());
}

/// A bucket RLS spends from beside a grant is kept while the grant's claim is (its state is
/// read past full: `token_bucket::check_claimed`), on Redis (the key's time to live) as in the
/// memory model (the entry outlives a sweep); without a claim it goes when full again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_beside_a_grant_is_kept_while_the_grant_claims_it() {
    let redis = RedisServer::start();
    let store = connected_store(Topology::Standalone(redis.url()), "kb:").await;
    store.count_claims(Arc::new(RlsTally::default()), true);
    let limit = Limit {
        algorithm: Algorithm::TokenBucket,
        requests: 10,
        window_us: S,
        burst: 10,
    };
    let entries = [("user", "kept")];
    let counter = key::counter_key("kb", entries.iter().copied(), &limit, None);
    let tag = key::descriptor_tag(&counter).to_owned();
    let time = cli(redis.port, &["TIME"]);
    let mut parts = time.lines().map(|l| l.trim().parse::<u64>().unwrap());
    let now = parts.next().unwrap() * S + parts.next().unwrap();
    // One gateway at 1/s since 4 s ago: 4 tokens claimed; kept 30 s.
    let holder = Holder {
        gateway: 1,
        demand: 1.0,
        granted: 1.0,
        expires_us: now + 10 * S,
        rls: false,
        since_us: now - 4 * S,
        claim_rate: 1.0,
        granted_rate: 1.0,
        reserved_since_us: 0,
        keep_until_us: now + 30 * S,
    };
    cli(
        redis.port,
        &["HSET", &format!("kb:{tag}:q"), "1", &record(&holder)],
    );
    let check = Check {
        key: counter.clone(),
        limit,
        hits: 1,
        refund: false,
        post_paid: false,
    };
    let got = decide(&store, std::slice::from_ref(&check), ScriptClock::RedisTime).await;
    assert!(got[0].allowed);
    let ttl: u64 = cli(redis.port, &["PTTL", &format!("kb:{counter}")])
        .parse()
        .unwrap();
    assert!(ttl > 20_000, "the bucket lives {ttl} ms, its claim 30 s");

    let clock = ManualClock::new(now);
    let quota = Arc::new(MemoryQuota::new(Arc::new(clock.clone())));
    let memory = MemoryStore::new(Arc::new(clock.clone()));
    memory.count_claims(MemoryClaims {
        quota: quota.clone(),
        tally: Arc::new(RlsTally::default()),
    });
    quota.put(&tag, vec![holder]);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(1);
    let want = memory
        .check(
            std::slice::from_ref(&check),
            deadline,
            ChargeMode::EachAlone,
        )
        .await;
    assert_eq!(want[0].as_ref().unwrap().allowed, got[0].allowed);
    clock.set_us(now + 5 * S);
    memory.sweep();
    assert_eq!(memory.len(), 1, "the bucket outlives a sweep while claimed");
    clock.set_us(now + 31 * S);
    memory.sweep();
    assert_eq!(memory.len(), 0, "and goes once the claim is not kept");
}
