//! Envoy Gateway up to 1.9 points Envoy at the rate limit Service's one ClusterIP, with no health
//! check: Envoy's HTTP/2 connection stays on the pod it was opened to, so a replica added later
//! gets calls only once Envoy opens a new connection. `--grpc-max-connection-age` (the Go
//! service's `GRPC_MAX_CONNECTION_AGE`) sends GOAWAY at that age and Envoy's next connection
//! through the ClusterIP may land on the new replica; the grace (`GRPC_MAX_CONNECTION_AGE_GRACE`)
//! only bounds how long calls already on the old connection may take. Measured here through a
//! real Envoy 1.40 and a round-robin balancer standing in for the ClusterIP: with an age of 2 s
//! and a grace of 10 s the added replica answers within about two ages (the balancer's turn gives
//! it the second new connection); without an age, never in the 10 s watched. (tonic, given a
//! grace, skipped the GOAWAY and kept the connection for the age and the grace: nothing moved
//! within 10 s.)

use crate::common;

use std::time::{Duration, Instant};

use crate::common::balancer::Balancer;
use crate::common::envoy::{self, Gateway};
use crate::common::process::ServeProcess;

const RULES: &str = "domain: eg\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 100000}\n";

/// How long the added replica is watched for its first call.
const WATCH: Duration = Duration::from_secs(10);

/// The gRPC calls a replica has answered, from its `/metrics`.
async fn calls(admin: u16) -> f64 {
    let (_, text) = common::http(admin, "GET", "/metrics", "").await;
    text.lines()
        .filter(|l| l.starts_with("portcullis_grpc_calls_total{"))
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
        .sum()
}

/// Replica A behind the balancer, Envoy connected through it, then replica B added: how long
/// until B answered a call while Envoy is driven at about 50 requests a second (None: not within
/// `WATCH`).
async fn scale_out(age: Option<&str>) -> Option<Duration> {
    let rules = tempfile::tempdir().unwrap();
    std::fs::write(rules.path().join("eg.yaml"), RULES).unwrap();
    let mut args = vec!["--log-level", "warn"];
    if let Some(age) = age {
        args.extend(["--grpc-max-connection-age", age]);
        args.extend(["--grpc-max-connection-age-grace", "10s"]);
    }
    let a = ServeProcess::spawn(rules.path(), &args, &[], &[]);
    let b = ServeProcess::spawn(rules.path(), &args, &[], &[]);
    let balancer = Balancer::start(&[a.grpc_port]).await;
    let mut g = Gateway::new("eg", &[balancer.port]);
    g.route_rate_limits =
        "- actions: [{request_headers: {header_name: x-user, descriptor_key: user}}]".into();
    g.timeout = "1s".into();
    g.health_checks = false;
    let envoy = g.start();
    let get = || envoy::get(g.ingress_addr(), None, "/", &[("x-user", "u")]);
    assert_eq!(get().await.status, 200);
    assert!(calls(a.admin_port).await > 0.0, "Envoy reached replica A");

    balancer.add(b.grpc_port);
    let added = Instant::now();
    while added.elapsed() < WATCH {
        let r = get().await;
        assert_eq!(r.status, 200, "Envoy log:\n{}", envoy.log());
        if calls(b.admin_port).await > 0.0 {
            return Some(added.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_added_behind_one_address_gets_calls_within_the_connection_age() {
    let took = scale_out(Some("2s"))
        .await
        .expect("the added replica got no call within 10 s with a connection age of 2 s");
    eprintln!("with --grpc-max-connection-age 2s the added replica answered after {took:?}");
    // Two ages (round robin gives B the second new connection) and Envoy's reconnection; the
    // 10 s grace must not count.
    assert!(took <= Duration::from_secs(6), "{took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_connection_age_an_added_replica_gets_no_calls() {
    assert_eq!(scale_out(None).await, None);
}

/// The hard end, end to end through the real binary: a connection still busy at its age (a
/// gateway's RLQS stream, which the GOAWAY at the age lets finish) is closed at age + grace, not
/// before and not much after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_still_busy_at_its_age_is_closed_at_age_plus_grace() {
    use portcullis::pb::rlqs::{RateLimitQuotaServiceClient, RateLimitQuotaUsageReports};
    let rules = tempfile::tempdir().unwrap();
    std::fs::write(rules.path().join("eg.yaml"), RULES).unwrap();
    let (age, grace) = (Duration::from_secs(1), Duration::from_secs(2));
    let replica = ServeProcess::spawn(
        rules.path(),
        &[
            "--rlqs",
            "--grpc-max-connection-age",
            "1s",
            "--grpc-max-connection-age-grace",
            "2s",
        ],
        &[],
        &[],
    );
    let opened = Instant::now();
    let mut client = RateLimitQuotaServiceClient::connect(replica.grpc_url())
        .await
        .expect("connects");
    let (tx, outbound) = tokio::sync::mpsc::channel::<RateLimitQuotaUsageReports>(4);
    let mut answers = client
        .stream_rate_limit_quotas(tokio_stream::wrappers::ReceiverStream::new(outbound))
        .await
        .expect("a stream")
        .into_inner();
    tx.send(RateLimitQuotaUsageReports {
        domain: "eg".into(),
        bucket_quota_usages: Vec::new(),
    })
    .await
    .expect("report sent");
    // The stream stays open (nothing else is sent) until the connection ends under it.
    let ended = tokio::time::timeout(age + grace + Duration::from_secs(5), async {
        loop {
            match answers.message().await {
                Ok(Some(_)) => continue,
                _ => return opened.elapsed(),
            }
        }
    })
    .await
    .expect("the connection outlived its age and grace by 5 s");
    eprintln!("a busy connection of age 1 s and grace 2 s ended after {ended:?}");
    assert!(
        ended >= age + grace,
        "ended after {ended:?}: before age + grace"
    );
    assert!(
        ended <= age + grace + Duration::from_secs(1),
        "ended after {ended:?}: long after age + grace"
    );
    drop(tx);
}
