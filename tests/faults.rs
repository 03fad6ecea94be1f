//! Faults injected into real Redis while load runs through the real binary: what callers see.
//!
//! Each scenario starts its own `redis-server` processes and `portcullis serve` (failure mode
//! `deny`, so an admission can only come from Redis), drives paced gRPC load over rotating hot keys
//! and a pool of fresh keys, injects one fault, heals it, and holds the service to the contract:
//! every call answered within the deadline (by Redis or by the failure mode), no more admitted than
//! the budget (or, where the fault loses Redis data, than what the lost data held), correct
//! decisions soon after the fault heals, and no task, descriptor or Redis connection left behind.
//! Each prints one `FAULT` line with its figures (RELIABILITY.md's table comes from them). The
//! scenarios run one at a time (a lock): their latency figures would otherwise measure each other.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::process::ServeProcess;
use common::proxy::Proxy;
use common::redis::{RedisCluster, RedisSentinel, RedisServer, cli, wait_until};
use common::{http, request, sample};
use portcullis::pb::RateLimitServiceClient;
use portcullis::pb::rate_limit_response::Code;
use portcullis::store::redis::cluster_batch::slot_of;
use tonic::transport::Channel;

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

/// Admissions each hot key allows in its hour.
const BUDGET: u64 = 50;
/// The store deadline (`--store-timeout`).
const DEADLINE: Duration = Duration::from_millis(100);
/// What a call may take past the deadline on a busy 2-core machine (scheduling, gRPC both ways).
const SLACK: Duration = Duration::from_millis(400);
/// Each hot key is the target for this long, then the next one takes over: the budget of some
/// key is being spent whenever the fault strikes.
const PHASE: Duration = Duration::from_millis(250);
const WORKERS: usize = 8;
/// Pause between two calls of one worker (8 workers: about 1,600 calls a second offered).
const PACE: Duration = Duration::from_millis(5);

const RULES: &str = r#"
domain: faults
descriptors:
  - key: hot
    rate_limit: {unit: hour, requests_per_unit: 50}
  - key: fresh
    rate_limit: {unit: hour, requests_per_unit: 100000}
  - key: probe
    rate_limit: {unit: hour, requests_per_unit: 2}
"#;

/// One scenario at a time (see the module comment).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The counter key of `key=value` in the `faults` domain (the Redis key the store writes).
fn tag(key: &str, value: &str) -> String {
    format!("faults|{key}={value}")
}

/// `n` values of `key` whose counters live in `slot` (all of them, when `slot` is None).
fn values_in_slot(key: &str, prefix: &str, slot: Option<u16>, n: usize) -> Vec<String> {
    (0..5_000_000u32)
        .map(|i| format!("{prefix}{i}"))
        .filter(|v| slot.is_none_or(|s| slot_of(&tag(key, v)) == s))
        .take(n)
        .collect()
}

#[derive(Clone, Copy)]
enum Answer {
    /// Decided by Redis: admitted or refused by the rule.
    Redis { admitted: bool },
    /// The failure mode (`deny`: refused, retry in a second).
    FailureMode,
}

struct Sample {
    started: Instant,
    took: Duration,
    /// Index into the hot keys, or None for a fresh key.
    hot: Option<usize>,
    answer: Answer,
}

/// Paced load from `WORKERS` tasks on one HTTP/2 connection, until stopped.
struct Load {
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<Sample>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    started: Instant,
}

impl Load {
    fn start(client: &RateLimitServiceClient<Channel>, hot: &[String], fresh: &[String]) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let started = Instant::now();
        let hot: Arc<Vec<String>> = Arc::new(hot.to_vec());
        let fresh: Arc<Vec<String>> = Arc::new(fresh.to_vec());
        let tasks = (0..WORKERS)
            .map(|worker| {
                let (stop, samples) = (stop.clone(), samples.clone());
                let (hot, fresh) = (hot.clone(), fresh.clone());
                let mut client = client.clone();
                tokio::spawn(async move {
                    // Bounded: a scenario never runs for two minutes.
                    for n in 0..(120_000 / PACE.as_millis() as usize) {
                        if stop.load(Ordering::SeqCst) {
                            break;
                        }
                        let phase = (started.elapsed().as_millis() / PHASE.as_millis()) as usize;
                        let hot_index = (n % 2 == 0).then(|| phase.min(hot.len() - 1));
                        let req = match hot_index {
                            Some(i) => request("faults", &[&[("hot", &hot[i])]]),
                            None => {
                                let value = &fresh[(n * WORKERS + worker) % fresh.len()];
                                request("faults", &[&[("fresh", value)]])
                            }
                        };
                        let call_started = Instant::now();
                        let mut call = tonic::Request::new(req);
                        call.set_timeout(Duration::from_secs(5));
                        let status = client.should_rate_limit(call).await;
                        let took = call_started.elapsed();
                        let r = status.expect("every call is answered").into_inner();
                        let reset = r.statuses[0]
                            .duration_until_reset
                            .as_ref()
                            .map_or(0, |d| d.seconds);
                        // The failure mode's refusal says "retry in 1 s"; an hourly rule's says far more.
                        let answer = if r.overall_code == OVER && reset <= 1 {
                            Answer::FailureMode
                        } else {
                            Answer::Redis {
                                admitted: r.overall_code == OK,
                            }
                        };
                        samples.lock().unwrap().push(Sample {
                            started: call_started,
                            took,
                            hot: hot_index,
                            answer,
                        });
                        tokio::time::sleep(PACE).await;
                    }
                })
            })
            .collect();
        Load {
            stop,
            samples,
            tasks,
            started,
        }
    }

    /// Whether a fresh key was decided by Redis in a call that started after `since`.
    fn redis_decided_since(&self, since: Instant) -> bool {
        self.samples.lock().unwrap().iter().any(|s| {
            s.hot.is_none()
                && s.started > since
                && matches!(s.answer, Answer::Redis { admitted: true })
        })
    }

    async fn stop(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::SeqCst);
        for task in self.tasks {
            task.await.expect("load task");
        }
        let _ = self.started;
        Arc::try_unwrap(self.samples)
            .ok()
            .expect("no other owner")
            .into_inner()
            .unwrap()
    }
}

/// Where the service's Redis lives, for counting connections.
struct Harness {
    name: &'static str,
    server: ServeProcess,
    client: RateLimitServiceClient<Channel>,
    /// Redis ports whose client connections are counted before and after.
    redis_ports: Vec<u16>,
    /// The most connections the service may hold to them once settled.
    redis_client_bound: u64,
    baseline: Resources,
    _serial: tokio::sync::MutexGuard<'static, ()>,
}

#[derive(Debug, Clone, Copy)]
struct Resources {
    tasks: f64,
    fds: f64,
    redis_clients: u64,
}

/// Clients connected to `port`, less the `redis-cli` asking.
fn redis_clients(port: u16) -> u64 {
    cli(port, &["INFO", "clients"])
        .lines()
        .find_map(|l| l.strip_prefix("connected_clients:"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(0, |n| n.saturating_sub(1))
}

struct Report {
    calls: usize,
    failure_answers: usize,
    worst: Duration,
    /// From the fault's start to the last failure-mode answer (zero: none).
    outage: Duration,
    /// From the heal to the last failure-mode answer (zero: none after it).
    recovery: Duration,
    /// Largest admissions of one hot key, and the sum over the hot keys that were used.
    most_admitted: u64,
    admitted: u64,
    keys_used: usize,
}

impl Harness {
    async fn start(name: &'static str, store_args: &[&str], redis_ports: Vec<u16>) -> Harness {
        let serial = SERIAL.lock().await;
        let dir = tempfile::tempdir().expect("temp dir").keep();
        std::fs::write(dir.join("faults.yaml"), RULES).expect("write rules");
        let mut args = vec![
            "--store",
            "redis",
            "--store-timeout",
            "100ms",
            "--failure-mode",
            "deny",
            "--log-level",
            "warn",
        ];
        args.extend_from_slice(store_args);
        let server = ServeProcess::spawn(&dir, &args, &[], &[]);
        let client = RateLimitServiceClient::connect(server.grpc_url())
            .await
            .expect("connect");
        let mut harness = Harness {
            name,
            server,
            client,
            redis_client_bound: 0,
            redis_ports,
            baseline: Resources {
                tasks: 0.0,
                fds: 0.0,
                redis_clients: 0,
            },
            _serial: serial,
        };
        harness
            .until_correct(Duration::from_secs(20), "at start")
            .await;
        harness.baseline = harness.resources().await;
        // Standalone and Sentinel: the connection set as it was. Cluster: the client may open one
        // connection to each node it learns of (replicas too, after a topology change).
        harness.redis_client_bound = if store_args.contains(&"--redis-cluster") {
            2 * harness.redis_ports.len() as u64
        } else {
            harness.baseline.redis_clients + 2
        };
        harness
    }

    async fn resources(&self) -> Resources {
        let (status, metrics) = http(self.server.admin_port, "GET", "/metrics", "").await;
        assert_eq!(status, 200);
        Resources {
            tasks: sample(&metrics, "portcullis_runtime_alive_tasks"),
            fds: sample(&metrics, "portcullis_process_open_fds"),
            redis_clients: self.redis_ports.iter().map(|p| redis_clients(*p)).sum(),
        }
    }

    /// A fresh probe key, decided by Redis, is answered 1 left, 0 left, then refused by the rule.
    async fn correct_now(&self, value: &str) -> bool {
        let mut client = self.client.clone();
        let mut answers = Vec::new();
        for _ in 0..3 {
            let r = client
                .should_rate_limit(request("faults", &[&[("probe", value)]]))
                .await
                .expect("answered")
                .into_inner();
            let reset = r.statuses[0]
                .duration_until_reset
                .as_ref()
                .map_or(0, |d| d.seconds);
            answers.push((r.overall_code, r.statuses[0].limit_remaining, reset > 1));
        }
        answers[0] == (OK, 1, true)
            && answers[1] == (OK, 0, true)
            && answers[2].0 == OVER
            && answers[2].2
    }

    /// Probes with fresh keys until the decisions are Redis' and correct, within `limit`.
    async fn until_correct(&mut self, limit: Duration, when: &str) -> Duration {
        let start = Instant::now();
        for attempt in 0.. {
            if self.correct_now(&format!("{when}-{attempt}")).await {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < limit,
                "{}: decisions not correct {when} after {limit:?}:\n{}",
                self.name,
                self.server.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        unreachable!()
    }

    /// Stops `load` once Redis decides again after `healed`, then holds the service to the
    /// contract and prints the scenario's figures. `data_losses`: how many times the fault can
    /// have thrown away what Redis held (each may hand one budget back).
    async fn finish(
        &mut self,
        load: Load,
        fault: Instant,
        healed: Instant,
        data_losses: u64,
        hot: &[String],
    ) -> Report {
        let until = Instant::now() + Duration::from_secs(30);
        while !load.redis_decided_since(healed + Duration::from_millis(200)) {
            assert!(
                Instant::now() < until,
                "{}: Redis never decided again after the fault healed:\n{}",
                self.name,
                self.server.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // A second of steady load after recovery.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let samples = load.stop().await;

        let worst = samples.iter().map(|s| s.took).max().unwrap_or_default();
        let failures: Vec<&Sample> = samples
            .iter()
            .filter(|s| matches!(s.answer, Answer::FailureMode))
            .collect();
        let last_failure = failures.iter().map(|s| s.started + s.took).max();
        let mut per_key: HashMap<usize, (u64, u64)> = HashMap::new();
        for s in &samples {
            if let Some(i) = s.hot {
                let entry = per_key.entry(i).or_default();
                if matches!(s.answer, Answer::Redis { admitted: true }) {
                    entry.0 += 1;
                }
                if matches!(s.answer, Answer::FailureMode) {
                    entry.1 += 1;
                }
            }
        }
        let report = Report {
            calls: samples.len(),
            failure_answers: failures.len(),
            worst,
            outage: last_failure.map_or(Duration::ZERO, |t| t.saturating_duration_since(fault)),
            recovery: last_failure.map_or(Duration::ZERO, |t| t.saturating_duration_since(healed)),
            most_admitted: per_key.values().map(|(a, _)| *a).max().unwrap_or(0),
            admitted: per_key.values().map(|(a, _)| *a).sum(),
            keys_used: per_key.len(),
        };

        assert!(
            worst <= DEADLINE + SLACK,
            "{}: a call took {worst:?}, past the deadline {DEADLINE:?}",
            self.name
        );
        let allowed = BUDGET * (1 + data_losses);
        for (i, (admitted, failed)) in &per_key {
            assert!(
                *admitted <= allowed,
                "{}: {} admitted {admitted} with a budget of {BUDGET} (allowed {allowed})",
                self.name,
                hot[*i]
            );
            // Untouched by the fault and offered its whole phase: Redis admits exactly the budget.
            let offered = samples.iter().filter(|s| s.hot == Some(*i)).count() as u64;
            if data_losses == 0 && *failed == 0 && offered > 2 * BUDGET && *i + 1 < per_key.len() {
                assert_eq!(*admitted, BUDGET, "{}: {} exact", self.name, hot[*i]);
            }
        }
        let correct_after = self.until_correct(Duration::from_secs(10), "after").await;

        // Nothing left behind: tasks, descriptors and Redis connections back where they were.
        let base = self.baseline;
        let until = Instant::now() + Duration::from_secs(10);
        let settled = loop {
            let now = self.resources().await;
            if now.tasks <= base.tasks + 4.0
                && now.fds <= base.fds + 4.0
                && now.redis_clients <= self.redis_client_bound
            {
                break now;
            }
            assert!(
                Instant::now() < until,
                "{}: resources did not settle: before {base:?}, after {now:?}; clients: {:?}",
                self.name,
                self.redis_ports
                    .iter()
                    .map(|p| (p, cli(*p, &["CLIENT", "LIST"])))
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert!(
            !self.server.log().contains("panicked"),
            "{}: a panic:\n{}",
            self.name,
            self.server.log()
        );
        println!(
            "FAULT {} | calls {} | failure-mode answers {} | worst call {} ms | outage {:.2} s | \
             recovery after heal {:.2} s | correct again {:.2} s later | admitted {} of {} (most for one key {} of {}) | \
             tasks {}→{} fds {}→{} redis connections {}→{}",
            self.name,
            report.calls,
            report.failure_answers,
            report.worst.as_millis(),
            report.outage.as_secs_f64(),
            report.recovery.as_secs_f64(),
            correct_after.as_secs_f64(),
            report.admitted,
            BUDGET * report.keys_used as u64,
            report.most_admitted,
            BUDGET,
            base.tasks,
            settled.tasks,
            base.fds,
            settled.fds,
            base.redis_clients,
            settled.redis_clients,
        );
        report
    }
}

fn hot_keys(slot: Option<u16>) -> Vec<String> {
    values_in_slot("hot", "h", slot, 120)
}

fn fresh_keys(slot: Option<u16>) -> Vec<String> {
    values_in_slot("fresh", "f", slot, 200)
}

/// The standalone scenarios: one Redis, the service on it, load running for a second.
async fn standalone(name: &'static str, redis: &RedisServer) -> (Harness, Load, Vec<String>) {
    let url = redis.url();
    let harness = Harness::start(name, &["--redis-url", &url], vec![redis.port]).await;
    let hot = hot_keys(None);
    let load = Load::start(&harness.client, &hot, &fresh_keys(None));
    tokio::time::sleep(Duration::from_secs(1)).await;
    (harness, load, hot)
}

/// Runs the blocking `redis-cli` off the runtime's workers (the load runs on them).
async fn cli_async(port: u16, args: &[&str]) -> String {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        cli(port, &args)
    })
    .await
    .expect("redis-cli")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn client_pause_longer_than_the_deadline() {
    let redis = RedisServer::start();
    let (mut harness, load, hot) = standalone("CLIENT PAUSE 1.5 s", &redis).await;
    let fault = Instant::now();
    assert_eq!(
        cli_async(redis.port, &["CLIENT", "PAUSE", "1500", "ALL"]).await,
        "OK"
    );
    let healed = fault + Duration::from_millis(1500);
    tokio::time::sleep_until(healed.into()).await;
    let report = harness.finish(load, fault, healed, 0, &hot).await;
    assert!(report.failure_answers > 0, "the pause was felt");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn debug_sleep_blocks_redis() {
    let redis = RedisServer::start_with(&["--enable-debug-command", "yes"]);
    let (mut harness, load, hot) = standalone("DEBUG SLEEP 1.5 s", &redis).await;
    let fault = Instant::now();
    assert_eq!(
        cli_async(redis.port, &["DEBUG", "SLEEP", "1.5"]).await,
        "OK"
    );
    let healed = Instant::now();
    let report = harness.finish(load, fault, healed, 0, &hot).await;
    assert!(report.failure_answers > 0, "the sleep was felt");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn script_cache_flushed_under_load() {
    let redis = RedisServer::start();
    let (mut harness, load, hot) = standalone("SCRIPT FLUSH every 50 ms for 2 s", &redis).await;
    let fault = Instant::now();
    for _ in 0..40 {
        assert_eq!(cli_async(redis.port, &["SCRIPT", "FLUSH"]).await, "OK");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let healed = Instant::now();
    let report = harness.finish(load, fault, healed, 0, &hot).await;
    assert_eq!(
        report.failure_answers, 0,
        "NOSCRIPT is answered by EVAL: no call goes to the failure mode"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn maxmemory_reached_with_noeviction() {
    let redis = RedisServer::start_with(&["--maxmemory-policy", "noeviction"]);
    let (mut harness, load, hot) =
        standalone("maxmemory reached (noeviction) for 1.5 s", &redis).await;
    let fault = Instant::now();
    assert_eq!(
        cli_async(redis.port, &["CONFIG", "SET", "maxmemory", "1"]).await,
        "OK"
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        cli_async(redis.port, &["CONFIG", "SET", "maxmemory", "0"]).await,
        "OK"
    );
    let healed = Instant::now();
    let report = harness.finish(load, fault, healed, 0, &hot).await;
    assert!(report.failure_answers > 0, "writes were refused");
    // Said in words, counted, and the replica stays ready (every replica shares this Redis).
    assert!(
        harness.server.log().contains("OOM"),
        "{}",
        harness.server.log()
    );
    let (_, metrics) = http(harness.server.admin_port, "GET", "/metrics", "").await;
    assert!(
        sample(
            &metrics,
            r#"portcullis_store_errors_total{kind="unavailable"}"#
        ) > 0.0
    );
    assert_eq!(
        http(harness.server.admin_port, "GET", "/readyz", "")
            .await
            .0,
        200
    );
}

/// The service reaches Redis through a loopback proxy that injects the wire faults.
async fn behind_proxy(name: &'static str) -> (RedisServer, Proxy, Harness, Load, Vec<String>) {
    let redis = RedisServer::start();
    let proxy = Proxy::start(redis.port).await;
    let url = format!("redis://127.0.0.1:{}", proxy.port);
    let harness = Harness::start(name, &["--redis-url", &url], vec![redis.port]).await;
    let hot = hot_keys(None);
    let load = Load::start(&harness.client, &hot, &fresh_keys(None));
    tokio::time::sleep(Duration::from_secs(1)).await;
    (redis, proxy, harness, load, hot)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connections_cut_mid_call() {
    let (_redis, proxy, mut harness, load, hot) =
        behind_proxy("a connection reset mid-call every 100 ms for 2 s").await;
    let fault = Instant::now();
    for _ in 0..20 {
        proxy.cut_next_answer();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let healed = Instant::now();
    // The script had run when its answer was cut: those hits are charged, never admitted twice.
    let report = harness.finish(load, fault, healed, 0, &hot).await;
    assert!(proxy.cuts() >= 10, "cuts happened: {}", proxy.cuts());
    assert!(report.failure_answers > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn answers_slower_than_the_deadline() {
    let (_redis, proxy, mut harness, load, hot) =
        behind_proxy("300 ms added to every Redis answer for 1.5 s").await;
    let fault = Instant::now();
    proxy.delay_answers(Duration::from_millis(300));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    proxy.delay_answers(Duration::ZERO);
    let healed = Instant::now();
    let report = harness.finish(load, fault, healed, 0, &hot).await;
    assert!(report.failure_answers > 0, "the latency was felt");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partition_that_heals() {
    let (_redis, proxy, mut harness, load, hot) =
        behind_proxy("a partition (nothing crosses) for 2 s").await;
    let fault = Instant::now();
    proxy.partition(true);
    tokio::time::sleep(Duration::from_secs(2)).await;
    proxy.partition(false);
    let healed = Instant::now();
    let report = harness.finish(load, fault, healed, 0, &hot).await;
    assert!(report.failure_answers > 0, "the partition was felt");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_killed_and_restarted() {
    let mut redis = RedisServer::start();
    let (mut harness, load, hot) =
        standalone("Redis SIGKILLed, restarted 1 s later (empty)", &redis).await;
    let fault = Instant::now();
    redis.kill();
    tokio::time::sleep(Duration::from_secs(1)).await;
    tokio::task::block_in_place(|| redis.restart());
    let healed = Instant::now();
    // The restart lost every counter: a key being spent may be handed its budget once more.
    let report = harness.finish(load, fault, healed, 1, &hot).await;
    assert!(report.failure_answers > 0);
}

/// The Cluster scenarios: the service on `cluster`, load running for a second with every hot and
/// fresh key in one slot; that slot and the master serving it.
async fn on_cluster(
    name: &'static str,
    cluster: &RedisCluster,
) -> (Harness, Load, Vec<String>, u16, u16) {
    let seeds = cluster.seeds().join(",");
    let ports: Vec<u16> = cluster.nodes.iter().map(|n| n.port).collect();
    let probe_tag = tag("hot", "h0");
    let master = cluster.master_of(&probe_tag);
    let slot = slot_of(&probe_tag);
    let harness = Harness::start(name, &["--redis-cluster", &seeds], ports).await;
    let hot = hot_keys(Some(slot));
    let load = Load::start(&harness.client, &hot, &fresh_keys(Some(slot)));
    tokio::time::sleep(Duration::from_secs(1)).await;
    (harness, load, hot, slot, master)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_master_killed() {
    let mut cluster = RedisCluster::start();
    // Every hot and fresh key on the victim's slots: the whole load feels the failover.
    let (mut harness, load, hot, _, victim) = on_cluster(
        "a Cluster master SIGKILLed (its replica promoted)",
        &cluster,
    )
    .await;
    let fault = Instant::now();
    cluster.node_mut(victim).kill();
    // Self-healing: the replica takes over on its own; recovery is measured from the kill.
    let report = harness.finish(load, fault, fault, 1, &hot).await;
    assert!(report.failure_answers > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slot_migrated_under_load() {
    let cluster = RedisCluster::start_with_replicas(0);
    let ports: Vec<u16> = cluster.nodes.iter().map(|n| n.port).collect();
    let (mut harness, load, hot, slot, source) =
        on_cluster("a slot migrated under load (ASK, then MOVED)", &cluster).await;
    let target = *ports
        .iter()
        .find(|p| **p != source)
        .expect("another master");
    let id = |port: u16| cli(port, &["CLUSTER", "MYID"]);
    let (source_id, target_id) = (id(source), id(target));
    let s = slot.to_string();
    let fault = Instant::now();
    assert_eq!(
        cli_async(target, &["CLUSTER", "SETSLOT", &s, "IMPORTING", &source_id]).await,
        "OK"
    );
    assert_eq!(
        cli_async(source, &["CLUSTER", "SETSLOT", &s, "MIGRATING", &target_id]).await,
        "OK"
    );
    // Keys move a few at a time while the load goes on: new keys are sent on with ASK.
    for _ in 0..100 {
        let keys = cli_async(source, &["CLUSTER", "GETKEYSINSLOT", &s, "20"]).await;
        let keys: Vec<&str> = keys.lines().filter(|l| !l.is_empty()).collect();
        if !keys.is_empty() {
            let mut args = vec!["MIGRATE", "127.0.0.1"];
            let target_port = target.to_string();
            args.push(&target_port);
            args.extend(["", "0", "5000", "KEYS"]);
            args.extend(keys.iter());
            let out = cli_async(source, &args).await;
            assert!(out == "OK" || out == "NOKEY", "MIGRATE: {out}");
        } else {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        cli_async(source, &["CLUSTER", "COUNTKEYSINSLOT", &s]).await,
        "0"
    );
    for port in &ports {
        assert_eq!(
            cli_async(*port, &["CLUSTER", "SETSLOT", &s, "NODE", &target_id]).await,
            "OK"
        );
    }
    let healed = Instant::now();
    let report = harness.finish(load, fault, healed, 0, &hot).await;
    assert_eq!(
        report.failure_answers,
        0,
        "ASK and MOVED are followed: the script did not run, so it is sent on:\n{}",
        harness.server.log()
    );
    assert_ne!(cli(target, &["CLUSTER", "COUNTKEYSINSLOT", &s]), "0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sentinel_failover() {
    let mut setup = RedisSentinel::start();
    let sentinels = setup.sentinel_addrs().join(",");
    let ports = vec![setup.master.port, setup.replica.port];
    let mut harness = Harness::start(
        "Sentinel failover (master SIGKILLed)",
        &["--redis-sentinel", &sentinels, "--redis-master", "mymaster"],
        ports,
    )
    .await;
    let hot = hot_keys(None);
    let load = Load::start(&harness.client, &hot, &fresh_keys(None));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let fault = Instant::now();
    setup.master.kill();
    let replica = setup.replica.port;
    tokio::task::block_in_place(|| {
        wait_until("the replica promoted", Duration::from_secs(30), || {
            cli(replica, &["ROLE"]).starts_with("master")
        })
    });
    let report = harness.finish(load, fault, fault, 1, &hot).await;
    assert!(report.failure_answers > 0);
}
