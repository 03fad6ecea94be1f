//! The Redis scripts count exactly like the memory model: random sequences of every algorithm,
//! mode and charge, the extreme parameters, a batch of many calls decided as the calls one by one,
//! the production path on Redis TIME, and every key with a TTL and its own hash tag.

mod batching;
mod bytes;
use crate::common;
mod model;
mod oracle;
mod production;
mod quick;
mod upgrade;

use crate::common::redis::{decide, decide_in, plain_connection};

use std::sync::Arc;
use std::time::Duration;

use crate::common::redis::connected_store;
use crate::common::redis::{RedisServer, cli};
use crate::common::{TestServer, request};
use portcullis::algorithm::{Algorithm, ChargeMode, Check, Limit, key};
use portcullis::clock::ManualClock;
use portcullis::store::MemoryStore;
use portcullis::store::redis::{Layout, ScriptClock, Topology};

/// 2100-01-01: a fixed script clock in the future, so keys never expire by wall time mid-test.
const FUTURE_US: u64 = 4_102_444_800_000_000;

/// xorshift64*: reproducible random sequences without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// A limit of `requests` per `window_us`; a token bucket gets a random burst up to twice that.
fn random_limit(rng: &mut Rng, algorithm: Algorithm, requests: u64, window_us: u64) -> Limit {
    Limit {
        algorithm,
        requests,
        window_us,
        burst: if algorithm == Algorithm::TokenBucket {
            1 + rng.below(requests * 2)
        } else {
            requests
        },
    }
}

/// A reload that changes every token bucket's numbers (up to `most` a unit); keys and state stay.
fn reload_buckets(rng: &mut Rng, limits: &mut [Limit], most: u64) {
    for limit in limits.iter_mut() {
        if limit.algorithm == Algorithm::TokenBucket {
            limit.requests = 1 + rng.below(most);
            limit.burst = 1 + rng.below(limit.requests * 2);
        }
    }
}

/// Mostly each-alone calls, some all-or-nothing, some probes.
fn random_mode(rng: &mut Rng) -> ChargeMode {
    match rng.below(6) {
        0 => ChargeMode::AllOrNothing,
        1 => ChargeMode::Probe,
        _ => ChargeMode::EachAlone,
    }
}

const WINDOWS_US: [u64; 4] = [1_000_000, 60_000_000, 3_600_000_000, 86_400_000_000];
const ALGORITHMS: [Algorithm; 4] = [
    Algorithm::SlidingWindow,
    Algorithm::TokenBucket,
    Algorithm::FixedWindow,
    Algorithm::Concurrency,
];

/// What the memory model decides for `checks` at `now`: the answers the scripts must equal.
fn modelled(
    memory: &MemoryStore,
    checks: &[Check],
    now: u64,
    mode: ChargeMode,
) -> Vec<portcullis::algorithm::Decision> {
    memory
        .check_all_at(checks, now, mode)
        .into_iter()
        .map(|answer| answer.expect("the memory store answers"))
        .collect()
}

/// `check`'s key expires in Redis when the model's counter does, absolute on the shared clock: a
/// key that outlives its state is harmless, one that expires before it hands the budget out
/// again (issue 48: a fixed window's TTL halved passed every test). `prefix`: the store's.
async fn assert_expires_as_the_model(
    conn: &mut redis::aio::MultiplexedConnection,
    prefix: &str,
    memory: &MemoryStore,
    check: &Check,
    now: u64,
    at: &str,
) {
    let redis_ms: i64 = redis::cmd("PEXPIRETIME")
        .arg(format!("{prefix}{}", check.key))
        .query_async(conn)
        .await
        .expect("PEXPIRETIME");
    match memory.expires_at_us(&check.key) {
        // Never written, or emptied: no key (the script deletes an empty state).
        None => assert_eq!(redis_ms, -2, "{at}: {check:?}"),
        // Redis' TTLs are whole milliseconds, at least one, rounded up; a bucket whose TAT a
        // clock stepping back left more than 2^52 us ahead keeps its key that much longer in
        // Redis (the model's reset is capped there).
        Some(expires) => {
            let written = i64::try_from(expires.div_ceil(1000)).unwrap();
            let capped = expires >= now.saturating_add(1 << 52);
            assert!(
                redis_ms >= written && (redis_ms <= written + 1 || capped),
                "{at}: expires at {redis_ms} ms in Redis, {expires} us in the model, now {now}: \
                 {check:?}"
            );
        }
    }
}

/// Two replicas on one Redis under the prefix `model:` (the oracle's): one making new keys
/// packed, one as hashes (0.1.0's layout, for a rolling update), each reading the other's keys
/// as they are stored; the memory model beside them, and a plain connection to read what Redis
/// stored.
struct TwoLayouts {
    packed: portcullis::store::RedisStore,
    hashed: portcullis::store::RedisStore,
    memory: Arc<MemoryStore>,
    conn: redis::aio::MultiplexedConnection,
}

async fn two_layouts(redis: &RedisServer) -> TwoLayouts {
    let topology = || Topology::Standalone(redis.url());
    TwoLayouts {
        packed: connected_store(topology(), "model:").await,
        hashed: connected_store(topology(), "model:")
            .await
            .with_layout(Layout::Hash),
        memory: MemoryStore::new(Arc::new(ManualClock::new(0))),
        conn: plain_connection(redis.port).await,
    }
}
