//! The quota script against the memory model: random report sequences on standalone and
//! Cluster, the same grants and the same holder tables, every field, every step. Split from
//! rlqs.rs.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use crate::common::redis::{RedisCluster, RedisServer, connected_store};
use portcullis::algorithm::share::Room;
use portcullis::algorithm::{Algorithm, Limit};
use portcullis::store::quota::{Ask, AskKind, MemoryQuota, QuotaStore};
use portcullis::store::redis::Topology;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

/// Random reports of five gateways on three rules, with RLS demand of three replicas, streams'
/// ends, reports charged or not and windows' room among them, against Redis and against the
/// memory model on one clock (the script's fixed to the model's, a few seconds a step, grants
/// living half a second to 20 s, so that grants expire, claims end and ended holders go): the
/// same grants, report after report, and after every step the same holder tables (what RLS
/// checks count the claims of), every field, every time.
async fn grants_match_the_model(
    store: &portcullis::store::RedisStore,
    port_of: &dyn Fn(&str) -> u16,
    prefix: &str,
    seed: u64,
) {
    // From Redis' own now: the tables' TTLs (set on the script's clock) stay in its future.
    let time = common::redis::cli(port_of(&format!("{prefix}{{m{seed}|rule=0}}:q")), &["TIME"]);
    let mut parts = time.lines().map(|l| l.trim().parse::<u64>().unwrap());
    let mut now = parts.next().unwrap() * 1_000_000 + parts.next().unwrap();
    let clock = portcullis::clock::ManualClock::new(now);
    let model = MemoryQuota::new(Arc::new(clock.clone()));
    let mut rng = StdRng::seed_from_u64(seed);
    let mut connections = std::collections::HashMap::new();
    let mut ports = std::collections::HashMap::new();
    let capacities = [10.0, 0.1, 2500.0 / 3600.0];
    for step in 0..300 {
        now += [
            0,
            rng.random_range(0..200_000),
            rng.random_range(0..3_000_000),
        ][rng.random_range(0..3)];
        clock.set_us(now);
        let asks: Vec<Ask> = (0..rng.random_range(1..=3))
            .map(|_| {
                let rule = rng.random_range(0..3);
                // RLS demand, a stream's end, an ended claim folded, or a report.
                let kind = match rng.random_range(0..20) {
                    0..3 => AskKind::Demand,
                    3..5 => AskKind::StreamEnded,
                    5..7 => AskKind::Forget,
                    _ => AskKind::Grant,
                };
                let demand_only = kind == AskKind::Demand;
                Ask {
                    key: format!("{{m{seed}|rule={rule}}}"),
                    capacity: capacities[rule],
                    // RLS demand of three replicas, two of whose ids are also gateways': one
                    // holder together, and apart from those gateways.
                    gateway: if demand_only {
                        rng.random_range(4..=6)
                    } else {
                        rng.random_range(1..=5)
                    },
                    demand: if rng.random_bool(0.2) {
                        0.0
                    } else {
                        rng.random_range(0.0..30.0)
                    },
                    // Grants that end within the run, and ended ones that still claim.
                    ttl_us: rng.random_range(500_000..20_000_000),
                    kind,
                    charged: rng.random_bool(0.7),
                    window_us: [1_000_000, 10_000_000, 60_000_000][rng.random_range(0..3)],
                    shortest_us: 1_000_000,
                    rooms: (0..rng.random_range(0..3))
                        .map(|_| draw_room(&mut rng, capacities[rule]))
                        .collect(),
                    // Rooms as given (no counter read in the script): the model's.
                    counters: Vec::new(),
                }
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(5);
        let want: Vec<_> = model
            .grant(&asks, deadline)
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
        let got: Vec<_> = store
            .grant_with_clock(
                &asks,
                portcullis::store::redis::ScriptClock::Fixed(now),
                deadline,
            )
            .await
            .into_iter()
            .map(|g| g.expect("Redis grants"))
            .collect();
        assert_eq!(got, want, "step {step}: {asks:?}");
        // The tables after every step, not only at the end: a holder's claim and reservation
        // change the next checks' answers even where this step's grants agree.
        for rule in 0..3 {
            let tag = format!("{{m{seed}|rule={rule}}}");
            let key = format!("{prefix}{tag}:q");
            // (A Cluster's master of a key is asked of redis-cli: once per key.)
            let port = *ports.entry(key.clone()).or_insert_with(|| port_of(&key));
            if let std::collections::hash_map::Entry::Vacant(e) = connections.entry(port) {
                e.insert(common::redis::plain_connection(port).await);
            }
            let conn = connections.get_mut(&port).expect("a connection");
            let table: Vec<(String, String)> = redis::cmd("HGETALL")
                .arg(&key)
                .query_async(conn)
                .await
                .expect("the holder table");
            assert_eq!(
                table_lines(&table, now),
                model_lines(&model.holders(&tag)),
                "step {step}, rule {rule}: {asks:?}"
            );
        }
    }
}

/// A window's room for a rule of `capacity` per second: fixed or sliding (the script's clock is
/// the model's), signed (count and claims past the limit; now and then as far below zero as a
/// spent raised look reads), a charge in it (a sliding window's counts from now on), and over
/// a span of the window: sized to what the rule grants over that span, so that the room, not
/// the fair part, decides many grants.
fn draw_room(rng: &mut StdRng, capacity: f64) -> Room {
    let window_us: u64 = [1_000_000, 60_000_000][rng.random_range(0..2)];
    let span_us = rng.random_range(1..=window_us.min(12_000_000));
    let near = ((capacity * span_us as f64 / 1e6 * 2.0).ceil() as i64).max(3);
    Room {
        limit: Limit {
            algorithm: [Algorithm::SlidingWindow, Algorithm::FixedWindow][rng.random_range(0..2)],
            requests: 100,
            window_us,
            burst: 100,
        },
        left: if rng.random_bool(0.05) {
            i64::MIN / 4
        } else {
            rng.random_range(-near..near)
        },
        charged: rng.random_range(0..2 * near as u64),
        span_us,
    }
}

/// The model's holders as lines to compare with a Redis table: every field of each holder, and
/// a reservation (or a claim holding one past what was granted) as its side field's line.
fn model_lines(holders: &[portcullis::algorithm::share::Holder]) -> Vec<String> {
    let mut lines: Vec<String> = holders
        .iter()
        .map(|h| {
            let id = if h.rls {
                format!("r{}", h.gateway)
            } else {
                h.gateway.to_string()
            };
            format!(
                "{id} demand {} granted {} expires {} since {} claim {} keep {}",
                h.demand, h.granted, h.expires_us, h.since_us, h.claim_rate, h.keep_until_us
            )
        })
        .collect();
    lines.extend(
        holders
            .iter()
            .filter(|h| h.reserved_since_us > 0 || h.granted_rate < h.claim_rate)
            .map(|h| {
                format!(
                    "v{} reserved since {} granted {}",
                    h.gateway, h.reserved_since_us, h.granted_rate
                )
            }),
    );
    lines.sort();
    lines
}

/// A Redis holder table (field, value) as `model_lines` writes the model's holders kept at
/// `now` (a table keeps ended holders until the script next touches it).
fn table_lines(table: &[(String, String)], now: u64) -> Vec<String> {
    let kept: Vec<&(String, String)> = table
        .iter()
        .filter(|(field, value)| {
            field.starts_with('v')
                || value
                    .rsplit(':')
                    .next()
                    .and_then(|k| k.parse::<u64>().ok())
                    .is_some_and(|keep| keep > now)
        })
        .collect();
    let holds = |id: &str| kept.iter().any(|(f, _)| f == id);
    let mut lines: Vec<String> = kept
        .iter()
        .filter(|(field, _)| !field.starts_with('v') || holds(&field[1..]))
        .map(|(field, value)| {
            let f: Vec<&str> = value.split(':').collect();
            if let Some(id) = field.strip_prefix('v') {
                let since: u64 = f[0].parse().unwrap();
                let rate: f64 = f[1].parse().unwrap();
                return format!("v{id} reserved since {since} granted {rate}");
            }
            let n = |i: usize| f[i].parse::<f64>().unwrap();
            let t = |i: usize| f[i].parse::<u64>().unwrap();
            format!(
                "{field} demand {} granted {} expires {} since {} claim {} keep {}",
                n(0),
                n(1),
                t(2),
                t(3),
                n(4),
                t(5)
            )
        })
        .collect();
    lines.sort();
    lines
}

#[tokio::test]
async fn the_script_grants_as_the_model_on_standalone_and_cluster() {
    let redis = RedisServer::start();
    let store = connected_store(Topology::Standalone(redis.url()), "q:").await;
    grants_match_the_model(&store, &|_| redis.port, "q:", 1).await;
    let cluster = RedisCluster::start();
    let store = connected_store(Topology::Cluster(cluster.seeds()), "q:").await;
    grants_match_the_model(&store, &|key| cluster.master_of(key), "q:", 2).await;
    // Every key the script wrote has a TTL.
    let keys = common::redis::cli(redis.port, &["--scan"]);
    assert!(!keys.trim().is_empty());
    for key in keys.lines() {
        let ttl: i64 = common::redis::cli(redis.port, &["PTTL", key])
            .trim()
            .parse()
            .unwrap();
        assert!(ttl > 0, "{key} has no TTL ({ttl})");
    }
}
