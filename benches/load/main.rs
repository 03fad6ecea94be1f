//! The load benchmark: real gRPC load against the `portcullis` binary on each store, and in the
//! same run, with the same generator and concurrency, the ceilings it is compared with:
//!
//! - a null gRPC server (this file, re-executed with `--null-server`) that answers OK at once:
//!   the most a tonic service can answer on this machine;
//! - `redis-benchmark` running EVALSHA of a minimal GCRA script: the least Redis CPU a decision
//!   that reads TIME and writes one key can cost.
//!
//! Per scenario it prints decisions/s, latency percentiles, the service's CPU per decision (from
//! `/proc/PID/stat`), Redis' µs per decision (`INFO commandstats`: wall time inside the script,
//! which a saturated shared machine stretches) and the redis-server processes' CPU per decision
//! (`/proc/PID/stat`: only time on a core, the requests' reading and the replies' writing too),
//! and each as a ratio to its ceiling. Every answer is checked (a gRPC error or a wrong code
//! fails the run), and so are the service's own counters against the generator's count.
//!
//!   cargo bench --bench load                       every store and scenario, 8 s each
//!   cargo bench --bench load -- --seconds 3 --only memory,standalone --scenario "fixed window"
//!   cargo bench --bench load -- --compare 641ff13=/path/to/old/portcullis
//!   cargo bench --bench load -- --generator h2load    h2load drives the unpaced rows
//!   cargo test --bench load                        a short smoke run (checks it works)
//!   cargo bench --bench load -- --only standalone,replicated,replicated-wait
//!   cargo bench --bench load -- --only memory,standalone,standalone-hot
//!   cargo bench --bench load -- --only cluster,cluster-hot
//!   cargo bench --bench load -- --only standalone-packed,cluster-packed --scenario "distinct keys"
//!                                                  + new counters as strings (--redis-layout
//!                                                  packed; an older build as far as it can)
//!                                                  + a master with a replica, without and with
//!                                                  --redis-wait-replicas 1 (named only)
//!
//! `--compare LABEL=PATH` (repeatable) runs another build of `portcullis` beside this one, each on
//! its own store processes, scenario by scenario in turn (this build, then each other, so that a
//! drift of the shared machine falls on both), and prints each one's ratios to this build;
//! `--rounds N` measures every scenario N times in turn and gives the median of the N ratios
//! (a shared 2-core machine moves any one figure by ±10%).

#[path = "../support/cpu.rs"]
mod cpu;
#[path = "../support/h2load.rs"]
#[allow(dead_code)]
mod h2load;
#[path = "../../tests/common/redis.rs"]
mod harness;

use cpu::cpu_seconds;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use harness::{RedisCluster, RedisServer, cli, free_port};
use portcullis::pb::rate_limit_response::Code;
use portcullis::pb::{
    RateLimitDescriptor, RateLimitRequest, RateLimitResponse, RateLimitService,
    RateLimitServiceClient, RateLimitServiceServer, rate_limit_descriptor,
};
use tonic::transport::Channel;

mod drive;
mod measure;
mod options;
mod print;
mod scenario;
mod server;
use drive::*;
use measure::*;
use options::*;
use print::*;
use scenario::*;
use server::*;

/// Starts a store's processes and the given build of the service on it: the service, the Redis ports to read
/// statistics from, and what must live as long as the run (the Redis processes).
type StartStore = dyn Fn(&Path) -> (Server, Vec<u16>, Box<dyn std::any::Any>);

fn null_server(port: u16) {
    #[derive(Default)]
    struct Null;
    #[tonic::async_trait]
    impl RateLimitService for Null {
        async fn should_rate_limit(
            &self,
            _request: tonic::Request<RateLimitRequest>,
        ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
            Ok(tonic::Response::new(RateLimitResponse {
                overall_code: Code::Ok as i32,
                ..Default::default()
            }))
        }
    }
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        tonic::transport::Server::builder()
            .add_service(RateLimitServiceServer::new(Null))
            .serve(([127, 0, 0, 1], port).into())
            .await
            .expect("null server");
    });
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--null-server") {
        null_server(args[i + 1].parse().expect("port"));
        return;
    }
    let options = Options::parse();
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::create_dir(dir.path().join("rules")).unwrap();
    std::fs::write(dir.path().join("rules/bench.yaml"), RULES).unwrap();
    let comparing = options.binaries.len() > 1;
    if !comparing {
        std::fs::write(dir.path().join("rules/cc.yaml"), CONCURRENCY_RULES).unwrap();
    }
    let scenarios: Vec<Scenario> = if options.full {
        ALL.to_vec()
    } else {
        vec![ALL[0], Scenario::Three]
    }
    .into_iter()
    .filter(|s| !(comparing && *s == Scenario::Concurrency))
    .filter(|s| {
        options
            .scenario
            .as_ref()
            .is_none_or(|want| s.label().contains(want.as_str()))
    })
    .collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut rows = Vec::new();

    let null = Server::null(dir.path());
    let null_target = Target {
        binary: "null server",
        name: "null server",
        server: &null,
        redis_ports: Vec::new(),
        redis_pids: Vec::new(),
    };
    let null_row = runtime.block_on(measure(&null_target, ALL[0], &options, None));
    if options.full {
        // The generator's own latency floor at half the ceiling's rate.
        let half = null_row.decisions_per_s / 2.0;
        let row = runtime.block_on(measure(&null_target, ALL[0], &options, Some(half)));
        eprintln!("null server: {}: p99 {:.2} ms", row.scenario, row.p99);
        rows.push(row);
    }
    drop(null);
    assert_eq!(null_row.check, "ok", "the null server: {}", null_row.check);
    let ceiling = redis_ceiling(&options);

    let mut stores: Vec<(&str, Box<StartStore>)> = Vec::new();
    let path = dir.path().to_path_buf();
    if options.wants("memory") {
        let path = path.clone();
        stores.push((
            "memory",
            Box::new(move |binary| {
                let server = Server::portcullis(binary, &path, &[]);
                (server, Vec::new(), Box::new(()))
            }),
        ));
    }
    if options.wants("standalone") {
        let path = path.clone();
        stores.push((
            "standalone Redis",
            Box::new(move |binary| {
                let redis = RedisServer::start();
                let args = ["--store", "redis", "--redis-url", &redis.url()].map(String::from);
                let server = Server::portcullis(binary, &path, &args);
                (server, vec![redis.port], Box::new(redis))
            }),
        ));
    }
    // New counters as strings (`--redis-layout packed`: the layout once no 0.1.0 replica shares
    // the Redis; the default, `hash`, is 0.1.0's): only when `--only` names it.
    if options.names("standalone-packed") {
        let path = path.clone();
        stores.push((
            "standalone Redis, packed layout",
            Box::new(move |binary| {
                let redis = RedisServer::start();
                let mut args: Vec<String> = ["--store", "redis", "--redis-url", &redis.url()]
                    .map(String::from)
                    .into();
                args.extend(Server::packed_layout_args(binary));
                let server = Server::portcullis(binary, &path, &args);
                (server, vec![redis.port], Box::new(redis))
            }),
        ));
    }
    // Hot counters decided in the replica from its claims (--hot-descriptor-rate): only when
    // `--only` names it.
    if options.names("standalone-hot") {
        let path = path.clone();
        stores.push((
            "standalone Redis, hot counters claimed",
            Box::new(move |binary| {
                let redis = RedisServer::start();
                let args = [
                    "--store",
                    "redis",
                    "--redis-url",
                    &redis.url(),
                    "--hot-descriptor-rate",
                    "100",
                ]
                .map(String::from);
                let server = Server::portcullis(binary, &path, &args);
                (server, vec![redis.port], Box::new(redis))
            }),
        ));
    }
    // A master with a replica, without and with --redis-wait-replicas 1 (what waiting for a
    // replica's acknowledgement costs): only when `--only` names them.
    for (store, label, wait) in [
        ("replicated", "standalone Redis + replica", false),
        (
            "replicated-wait",
            "standalone Redis + replica, WAIT 1",
            true,
        ),
    ] {
        if !options.names(store) {
            continue;
        }
        let path = path.clone();
        stores.push((
            label,
            Box::new(move |binary| {
                let redis = RedisServer::start();
                let replica = RedisServer::start();
                cli(
                    replica.port,
                    &["REPLICAOF", "127.0.0.1", &redis.port.to_string()],
                );
                harness::wait_until("the replica in sync", Duration::from_secs(20), || {
                    cli(replica.port, &["INFO", "replication"]).contains("master_link_status:up")
                });
                let mut args = vec!["--store", "redis", "--redis-url", &redis.url()]
                    .into_iter()
                    .map(String::from)
                    .collect::<Vec<_>>();
                if wait {
                    args.extend(["--redis-wait-replicas".into(), "1".into()]);
                }
                let server = Server::portcullis(binary, &path, &args);
                let ports = vec![redis.port, replica.port];
                (server, ports, Box::new((redis, replica)))
            }),
        ));
    }
    if options.wants("cluster") {
        let path = path.clone();
        stores.push((
            "Redis Cluster (3 masters)",
            Box::new(move |binary| {
                let cluster = RedisCluster::start_with_replicas(0);
                let seeds = cluster.seeds().join(",");
                let args = ["--store", "redis", "--redis-cluster", &seeds].map(String::from);
                let server = Server::portcullis(binary, &path, &args);
                let ports = cluster.nodes.iter().map(|n| n.port).collect();
                (server, ports, Box::new(cluster))
            }),
        ));
    }
    // The same in the packed layout: only when `--only` names it.
    if options.names("cluster-packed") {
        let path = path.clone();
        stores.push((
            "Redis Cluster (3 masters), packed layout",
            Box::new(move |binary| {
                let cluster = RedisCluster::start_with_replicas(0);
                let seeds = cluster.seeds().join(",");
                let mut args: Vec<String> = ["--store", "redis", "--redis-cluster", &seeds]
                    .map(String::from)
                    .into();
                args.extend(Server::packed_layout_args(binary));
                let server = Server::portcullis(binary, &path, &args);
                let ports = cluster.nodes.iter().map(|n| n.port).collect();
                (server, ports, Box::new(cluster))
            }),
        ));
    }
    // The same with hot counters claimed: only when `--only` names it.
    if options.names("cluster-hot") {
        let path = path.clone();
        stores.push((
            "Redis Cluster (3 masters), hot counters claimed",
            Box::new(move |binary| {
                let cluster = RedisCluster::start_with_replicas(0);
                let seeds = cluster.seeds().join(",");
                let args = ["--store", "redis", "--redis-cluster", &seeds]
                    .into_iter()
                    .chain(["--hot-descriptor-rate", "100"])
                    .map(String::from)
                    .collect::<Vec<_>>();
                let server = Server::portcullis(binary, &path, &args);
                let ports = cluster.nodes.iter().map(|n| n.port).collect();
                (server, ports, Box::new(cluster))
            }),
        ));
    }

    for (name, start) in stores {
        // Every build on its own processes, started together and driven in turn.
        let started: Vec<_> = options
            .binaries
            .iter()
            .map(|(label, binary)| {
                let (server, redis_ports, keep) = start(binary);
                // Redis processes' CPU, for the record (commandstats is the script's own).
                let redis_pids: Vec<u32> = redis_ports.iter().map(|p| redis_pid(*p)).collect();
                let redis_cpu_before: f64 = redis_pids.iter().map(|p| cpu_seconds(*p)).sum();
                (
                    label,
                    server,
                    redis_ports,
                    keep,
                    redis_pids,
                    redis_cpu_before,
                )
            })
            .collect();
        let targets: Vec<Target> = started
            .iter()
            .map(|(label, server, ports, _, pids, _)| Target {
                binary: label,
                name,
                server,
                redis_ports: ports.clone(),
                redis_pids: pids.clone(),
            })
            .collect();
        let mut peaks = vec![None; targets.len()];
        for scenario in &scenarios {
            for round in 0..options.rounds {
                for (target, peak) in targets.iter().zip(&mut peaks) {
                    let mut row = runtime.block_on(measure(target, *scenario, &options, None));
                    row.round = round;
                    if *scenario == ALL[0] && round == 0 {
                        *peak = Some(row.decisions_per_s);
                    }
                    eprintln!(
                        "{} / {name}: {} (round {}): {:.0}/s {}",
                        target.binary,
                        row.scenario,
                        round + 1,
                        row.decisions_per_s,
                        row.check
                    );
                    rows.push(row);
                }
            }
        }
        // Latency where it matters: at half the peak rate.
        for (target, peak) in targets.iter().zip(&peaks) {
            if let (Some(peak), true) = (peak, options.full) {
                let row = runtime.block_on(measure(target, ALL[0], &options, Some(peak / 2.0)));
                eprintln!(
                    "{} / {name}: {}: p99 {:.2} ms {}",
                    target.binary, row.scenario, row.p99, row.check
                );
                rows.push(row);
            }
        }
        for (label, _, _, _, redis_pids, before) in &started {
            if !redis_pids.is_empty() {
                let used = redis_pids.iter().map(|p| cpu_seconds(*p)).sum::<f64>() - before;
                eprintln!("{label} / {name}: redis-server processes used {used:.1} s of CPU");
            }
        }
    }
    print(&rows, &null_row, ceiling, options.h2load);
    let failed: Vec<&Row> = rows.iter().filter(|r| !r.check.starts_with("ok")).collect();
    assert!(
        failed.is_empty(),
        "wrong answers or counts: {:?}",
        failed
            .iter()
            .map(|r| format!("{} / {} / {}: {}", r.binary, r.store, r.scenario, r.check))
            .collect::<Vec<_>>()
    );
}
