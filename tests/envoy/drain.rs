//! Health and drain as Envoy 1.40 sees them: a rolling update of two replicas on one Redis under
//! steady load through Envoy with `failure_mode_deny: true`. Envoy's gRPC health check (service
//! `ratelimit`) sees the draining replica unhealthy while its listener is still open; no request
//! fails (a failed rate-limit call would be a 500), and never more is admitted than the limit.

use crate::common;

use std::time::{Duration, Instant};

use crate::common::envoy::{self, Envoy, Gateway};
use crate::common::process::ServeProcess;
use crate::common::redis::RedisServer;

const LIMIT: usize = 400;

fn rules_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    let rules = format!(
        "domain: gw\ndescriptors:\n  - key: client\n    rate_limit: {{unit: hour, requests_per_unit: {LIMIT}}}\n"
    );
    std::fs::write(dir.path().join("gw.yaml"), rules).expect("write rules");
    dir
}

/// The health flags Envoy shows for one Portcullis endpoint (`/clusters`).
fn health_flags(proxy: &Envoy, port: u16) -> String {
    let (_, body) = proxy.admin("/clusters").unwrap_or_default();
    let prefix = format!("portcullis::127.0.0.1:{port}::health_flags::");
    body.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or("")
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_update_under_load_fails_nothing_and_admits_exactly_the_limit() {
    let redis = RedisServer::start();
    let rules = rules_dir();
    // A store deadline of 400 ms (under Envoy's 0.5 s): a call past the default 15 ms is answered
    // by the failure mode (allow), an admission beyond the limit that has nothing to do with the
    // rolling update (401 of 400 once, on a 2-core machine busy with other tests).
    let args = [
        "--store",
        "redis",
        "--redis-url",
        &redis.url(),
        "--drain-period",
        "3s",
        "--store-timeout",
        "400ms",
    ];
    let mut leaving = ServeProcess::spawn(rules.path(), &args, &[], &[]);
    let staying = ServeProcess::spawn(rules.path(), &args, &[], &[]);
    let mut g = Gateway::new("gw", &[leaving.grpc_port, staying.grpc_port]);
    g.route_rate_limits =
        "- actions:\n    - generic_key: {descriptor_key: client, descriptor_value: c}\n".into();
    g.failure_mode_deny = true;
    g.timeout = "0.5s".into();
    g.health_interval = "0.2s".into();
    let proxy = g.start();
    common::redis::wait_until(
        "Envoy to see both replicas healthy",
        Duration::from_secs(10),
        || {
            health_flags(&proxy, leaving.grpc_port) == "healthy"
                && health_flags(&proxy, staying.grpc_port) == "healthy"
        },
    );

    let mut statuses: Vec<u16> = Vec::new();
    let send = |n: usize| {
        let addr = g.ingress_addr();
        async move {
            let mut out = Vec::with_capacity(n);
            for _ in 0..n {
                out.push(envoy::get(addr, None, "/", &[]).await.status);
            }
            out
        }
    };
    statuses.extend(send(100).await);

    // SIGTERM the first replica: until Envoy marks it unhealthy, its listener must stay open.
    leaving.signal("TERM");
    let started = Instant::now();
    loop {
        statuses.extend(send(5).await);
        if health_flags(&proxy, leaving.grpc_port).contains("failed_active_hc") {
            assert!(
                std::net::TcpStream::connect(("127.0.0.1", leaving.grpc_port)).is_ok(),
                "Envoy saw the replica unhealthy only after its listener had closed"
            );
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "Envoy did not see the draining replica unhealthy within its drain period: {:?}\n{}",
            health_flags(&proxy, leaving.grpc_port),
            proxy.admin("/clusters").unwrap_or_default().1
        );
    }
    // Load goes on through the rest of the drain and the replica's exit.
    loop {
        statuses.extend(send(20).await);
        if let Ok(Some(status)) = leaving.child.try_wait() {
            assert!(status.success(), "the drained replica exited with {status}");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "the replica did not exit after its drain"
        );
    }
    statuses.extend(send(100).await);

    let failed: Vec<&u16> = statuses
        .iter()
        .filter(|s| **s != 200 && **s != 429)
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} requests failed during the rolling update: {:?}",
        failed.len(),
        statuses.len(),
        &failed[..failed.len().min(10)]
    );
    let admitted = statuses.iter().filter(|s| **s == 200).count();
    assert!(
        statuses.len() > LIMIT,
        "the load must pass the limit: {}",
        statuses.len()
    );
    assert_eq!(
        admitted, LIMIT,
        "exactly the limit admitted across both replicas"
    );
    drop(staying);
}
