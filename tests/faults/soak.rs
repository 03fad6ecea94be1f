//! A bounded soak of the real binary on real Redis: mixed traffic over many keys (every algorithm,
//! calls of one and of three descriptors), the rules rewritten every two seconds, and Redis
//! killed and restarted halfway. Held to: resident memory and open descriptors flat, error
//! counters flat once Redis is back, every reload applied, no key admitted past its budget (one
//! restart may hand it back once), and exact decisions at the end.
//!
//! `cargo test --test faults soak::` runs the short CI variant (20 s); `scripts/soak [SECONDS]` the long
//! one (SOAK_SECONDS). One `SOAK` line per run carries the figures.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::process::ServeProcess;
use crate::common::redis::RedisServer;
use crate::common::{http, request, sample};
use portcullis::pb::RateLimitServiceClient;
use portcullis::pb::rate_limit_response::Code;

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

/// Distinct users the traffic spreads over.
const USERS: u64 = 50_000;
/// Budget of each hot key, and how many hot keys the run walks through.
const HOT_BUDGET: u64 = 20;
const WORKERS: usize = 6;

/// The rules; `generation` changes a limit that no assertion depends on, so every rewrite is a
/// real reload.
fn rules(generation: u64) -> String {
    format!(
        r#"
domain: soak
descriptors:
  - key: user
    rate_limit: {{unit: minute, requests_per_unit: {}}}
  - key: bucket
    rate_limit: {{unit: second, requests_per_unit: 5, algorithm: token_bucket}}
  - key: fixed
    rate_limit: {{unit: hour, requests_per_unit: 30, algorithm: fixed_window}}
  - key: hot
    rate_limit: {{unit: hour, requests_per_unit: {HOT_BUDGET}}}
  - key: probe
    rate_limit: {{unit: hour, requests_per_unit: 2}}
"#,
        100 + generation % 7
    )
}

/// xorshift64*: reproducible traffic without a dependency.
fn next(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_F491_4F6C_DD1D)
}

#[derive(Default, Clone, Copy, Debug)]
struct Gauges {
    rss: f64,
    fds: f64,
    tasks: f64,
    store_errors: f64,
    reloads_ok: f64,
    reloads_failed: f64,
}

async fn gauges(server: &ServeProcess) -> Gauges {
    let (status, m) = http(server.admin_port, "GET", "/metrics", "").await;
    assert_eq!(status, 200);
    let store_errors = m
        .lines()
        .filter(|l| l.starts_with("portcullis_store_errors_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    Gauges {
        rss: sample(&m, "portcullis_process_resident_memory_bytes"),
        fds: sample(&m, "portcullis_process_open_fds"),
        tasks: sample(&m, "portcullis_runtime_alive_tasks"),
        store_errors,
        reloads_ok: sample(&m, r#"portcullis_rules_reloads_total{result="success"}"#),
        reloads_failed: sample(&m, r#"portcullis_rules_reloads_total{result="error"}"#),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn soak_with_reloads_and_a_redis_restart() {
    let seconds: u64 = std::env::var("SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20)
        .clamp(10, 3600);
    let run = Duration::from_secs(seconds);
    let mut redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let rules_file = dir.path().join("soak.yaml");
    std::fs::write(&rules_file, rules(0)).expect("write rules");
    let url = redis.url();
    let server = ServeProcess::spawn(
        dir.path(),
        &[
            "--store",
            "redis",
            "--redis-url",
            &url,
            "--store-timeout",
            "100ms",
            "--failure-mode",
            "deny",
            "--reload-interval",
            "200ms",
            // Small enough to fill within the run: its bound, not its growth, is what shows.
            "--deny-cache-max-entries",
            "2000",
            "--log-level",
            "warn",
        ],
        &[],
        &[],
    );
    let client = RateLimitServiceClient::connect(server.grpc_url())
        .await
        .expect("connect");

    let stop = Arc::new(AtomicBool::new(false));
    // Admissions per hot key, and answers by the failure mode.
    let admitted: Arc<Mutex<HashMap<u64, u64>>> = Arc::default();
    let calls = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..WORKERS)
        .map(|worker| {
            let mut client = client.clone();
            let (stop, admitted, calls) = (stop.clone(), admitted.clone(), calls.clone());
            tokio::spawn(async move {
                let mut rng = 0x9E37_79B9_7F4A_7C15 ^ (worker as u64 + 1);
                // Bounded: at most an hour's worth of calls at this pace.
                for _ in 0..3_600_000u64 {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let user = (next(&mut rng) % USERS).to_string();
                    let hot = started.elapsed().as_millis() as u64 / 500;
                    let hot_value = format!("h{hot}");
                    let req = match next(&mut rng) % 4 {
                        0 => request("soak", &[&[("user", &user)]]),
                        1 => request(
                            "soak",
                            &[
                                &[("user", &user)],
                                &[("bucket", &user)],
                                &[("fixed", &user)],
                            ],
                        ),
                        2 => request("soak", &[&[("hot", &hot_value)]]),
                        _ => request("soak", &[&[("bucket", &(next(&mut rng) % 50).to_string())]]),
                    };
                    let is_hot = req.descriptors[0].entries[0].key == "hot";
                    let mut call = tonic::Request::new(req);
                    call.set_timeout(Duration::from_secs(5));
                    let r = client
                        .should_rate_limit(call)
                        .await
                        .expect("every call is answered")
                        .into_inner();
                    calls.fetch_add(1, Ordering::Relaxed);
                    if is_hot && r.overall_code == OK {
                        *admitted.lock().unwrap().entry(hot).or_default() += 1;
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            })
        })
        .collect();

    // Warm-up: a fifth of the run (the deny cache fills, allocator pools settle).
    let mut samples: Vec<(Duration, Gauges)> = Vec::new();
    let mut generation = 0;
    let mut restarted_at = None;
    let mut recovered_at: Option<(Duration, Gauges)> = None;
    while started.elapsed() < run {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let at = started.elapsed();
        if (at.as_millis() / 2000) as u64 > generation {
            generation = (at.as_millis() / 2000) as u64;
            // Written beside and renamed into place, as a ConfigMap swap is atomic.
            let tmp = dir.path().join(".soak.yaml.tmp");
            std::fs::write(&tmp, rules(generation)).expect("write rules");
            std::fs::rename(&tmp, &rules_file).expect("swap rules");
        }
        if restarted_at.is_none() && at >= run / 2 {
            tokio::task::block_in_place(|| {
                redis.kill();
                std::thread::sleep(Duration::from_millis(500));
                redis.restart();
            });
            restarted_at = Some(started.elapsed());
        }
        let now = gauges(&server).await;
        // Recovered: two samples in a row with no new store error, after the restart.
        if let (Some(_), None) = (restarted_at, recovered_at)
            && let Some((_, last)) = samples.last()
            && last.store_errors == now.store_errors
            && samples.len() >= 2
            && samples[samples.len() - 2].1.store_errors == now.store_errors
            && restarted_at.is_some_and(|r| samples[samples.len() - 2].0 > r)
        {
            recovered_at = Some((at, now));
        }
        samples.push((at, now));
    }
    stop.store(true, Ordering::SeqCst);
    for worker in workers {
        worker.await.expect("worker");
    }
    let end = gauges(&server).await;

    // Memory and descriptors flat after warm-up: the most either grew from the fifth of the run
    // to its end.
    let warm = samples
        .iter()
        .find(|(at, _)| *at >= run / 5)
        .map(|(_, g)| *g)
        .expect("a sample after warm-up");
    let peak_rss = samples.iter().map(|(_, g)| g.rss).fold(0.0, f64::max);
    let rss_growth_mib = (end.rss - warm.rss) / (1024.0 * 1024.0);
    assert!(
        rss_growth_mib < 16.0,
        "resident memory grew {rss_growth_mib:.1} MiB after warm-up ({} → {})",
        warm.rss,
        end.rss
    );
    assert!(
        end.fds <= warm.fds + 4.0,
        "descriptors {} → {}",
        warm.fds,
        end.fds
    );
    // Error counters flat once Redis was back.
    let (recovered, at_recovery) = recovered_at.expect("the store recovered after the restart");
    assert_eq!(
        end.store_errors, at_recovery.store_errors,
        "store errors after recovery"
    );
    // Every rewrite applied, none refused.
    assert_eq!(
        end.reloads_failed,
        0.0,
        "a reload failed:\n{}",
        server.log()
    );
    assert!(
        end.reloads_ok >= (generation as f64) * 0.5,
        "{} reloads applied of {generation} rewrites",
        end.reloads_ok
    );
    // No hot key past its budget; the restart may have handed one key its budget back once.
    let admitted = admitted.lock().unwrap().clone();
    let most = admitted.values().copied().max().unwrap_or(0);
    assert!(most <= 2 * HOT_BUDGET, "a hot key admitted {most}");
    let over_once = admitted.values().filter(|a| **a > HOT_BUDGET).count();
    assert!(over_once <= 1, "{over_once} keys past their budget");
    // Exact decisions at the end.
    let mut c = client.clone();
    let mut answers = Vec::new();
    for _ in 0..3 {
        let r = c
            .should_rate_limit(request("soak", &[&[("probe", "end")]]))
            .await
            .expect("answered")
            .into_inner();
        answers.push((r.overall_code, r.statuses[0].limit_remaining));
    }
    assert_eq!(answers, vec![(OK, 1), (OK, 0), (OVER, 0)]);
    assert!(!server.log().contains("panicked"), "{}", server.log());
    println!(
        "SOAK {seconds} s | calls {} | rules rewrites {generation}, reloads applied {} | Redis restarted at {:.1} s, \
         errors flat from {:.1} s | RSS {:.1} MiB after warm-up, {:.1} MiB at the end, peak {:.1} MiB | \
         fds {}→{} | tasks {}→{} | store errors {} | hot keys {} (most admitted {most} of {HOT_BUDGET})",
        calls.load(Ordering::Relaxed),
        end.reloads_ok,
        restarted_at.unwrap_or_default().as_secs_f64(),
        recovered.as_secs_f64(),
        warm.rss / 1048576.0,
        end.rss / 1048576.0,
        peak_rss / 1048576.0,
        warm.fds,
        end.fds,
        warm.tasks,
        end.tasks,
        end.store_errors,
        admitted.len(),
    );
}
