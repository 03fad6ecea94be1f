//! What the hot-counter mode (`--hot-descriptor-rate`, `store::hot`) costs the calls it does
//! not claim for: the cold path, a new counter on every call (a rule keyed by user). The same
//! calls go to the memory store directly and through the hot store over it, in alternating
//! rounds in one process on one thread; the difference per call is the mode's own work
//! (following counters, its lock and map), to set beside what one decision on Redis costs the
//! service (the load benchmark's "server µs/decision", ~50 µs on this machine).
//!
//!   cargo bench --bench hot_cost         9 rounds of 100,000 calls each way
//!   cargo test --bench hot_cost          a short smoke run

use std::sync::Arc;
use std::time::{Duration, Instant};

use portcullis::algorithm::{Algorithm, ChargeMode, Check, Limit};
use portcullis::clock::SystemClock;
use portcullis::store::hot::{HotConfig, HotStore};
use portcullis::store::{MemoryStore, Store};
use portcullis::telemetry::HotMetrics;

/// Nanoseconds per call of `calls` calls on distinct counters (numbered from `first`).
async fn per_call(store: &dyn Store, first: u64, calls: u64, limit: Limit) -> f64 {
    let far = tokio::time::Instant::now() + Duration::from_secs(60);
    let start = Instant::now();
    for i in first..first + calls {
        let check = Check {
            key: format!("{{bench|user={i}}}:60"),
            limit,
            hits: 1,
            refund: false,
            post_paid: false,
        };
        let answer = store
            .check(std::slice::from_ref(&check), far, ChargeMode::EachAlone)
            .await;
        assert!(answer[0].as_ref().is_ok_and(|d| d.allowed));
    }
    start.elapsed().as_nanos() as f64 / calls as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let smoke = std::env::args().all(|a| a != "--bench");
    let (rounds, calls) = if smoke { (1, 2_000) } else { (9, 100_000) };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        println!(
            "| algorithm | memory ns/call | through the hot store ns/call | difference ns | ratio |"
        );
        println!("|---|---|---|---|---|");
        for algorithm in [
            Algorithm::SlidingWindow,
            Algorithm::FixedWindow,
            Algorithm::TokenBucket,
        ] {
            let limit = Limit {
                algorithm,
                requests: 100,
                window_us: 60_000_000,
                burst: 100,
            };
            let clock = Arc::new(SystemClock::default());
            let memory = MemoryStore::with_max_counters(clock.clone(), 10_000_000);
            let hot = HotStore::new(
                Arc::new(memory.clone()),
                clock,
                HotConfig {
                    rate: 50.0,
                    store_timeout: Duration::from_secs(2),
                },
                None,
                Arc::new(HotMetrics::default()),
            );
            let (mut direct, mut through) = (Vec::new(), Vec::new());
            let mut first = 0;
            for _ in 0..rounds {
                direct.push(per_call(&memory, first, calls, limit).await);
                first += calls;
                through.push(per_call(&hot, first, calls, limit).await);
                first += calls;
            }
            let (d, t) = (median(direct), median(through));
            println!(
                "| {algorithm:?} | {d:.0} | {t:.0} | {:.0} | {:.2} |",
                t - d,
                t / d
            );
        }
    });
}
