//! Envoy in the loop: a real Envoy 1.40 in front of the real binary. The shipped bootstrap
//! (`deploy/envoy/envoy.yaml`) produces each of its 429s with the headers Envoy builds; every
//! Envoy config the project ships is accepted by `envoy --mode validate`.

use crate::common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::envoy::{self, Envoy, ShippedPorts};
use crate::common::process::ServeProcess;
use portcullis::pb::RateLimitServiceClient;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn source(last: u8) -> Option<IpAddr> {
    Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, last)))
}

/// Spends what remains of a descriptor of domain `edge` directly over gRPC, so that the next
/// request through Envoy finds the budget gone without sending thousands of requests.
async fn exhaust(grpc_port: u16, entries: &[(&str, &str)]) {
    let mut client = RateLimitServiceClient::connect(format!("http://127.0.0.1:{grpc_port}"))
        .await
        .expect("connect");
    let mut probe = common::request("edge", &[entries]);
    probe.descriptors[0].hits_addend = Some(0);
    let looked = client.should_rate_limit(probe).await.expect("answered");
    let remaining = looked.into_inner().statuses[0].limit_remaining;
    let mut request = common::request("edge", &[entries]);
    request.hits_addend = remaining;
    let answer = client.should_rate_limit(request).await.expect("answered");
    let answer = answer.into_inner();
    assert_eq!(answer.overall_code, 1, "the spend was admitted: {answer:?}");
}

/// Requests until the first 429 (at most `max`); returns how many passed and the 429.
async fn until_limited(
    addr: SocketAddr,
    from: Option<IpAddr>,
    path: &str,
    headers: &[(&str, &str)],
    max: usize,
) -> (usize, envoy::Response) {
    for passed in 0..max {
        let r = envoy::get(addr, from, path, headers).await;
        if r.status == 429 {
            return (passed, r);
        }
        assert_eq!(r.status, 200, "{path}: {r:?}");
        assert_eq!(r.body, "hello from the app\n");
    }
    panic!("{path}: no 429 in {max} requests");
}

/// The draft-03 headers Envoy writes from the binding status: limit with its policies,
/// remaining, reset.
fn assert_draft03(r: &envoy::Response, limit: &str, policy: &str, remaining: u32) {
    assert_eq!(r.header("x-envoy-ratelimited"), Some("true"), "{r:?}");
    // Once each: the shipped bootstrap has Envoy write them, and Portcullis' own
    // --response-headers is off by default (both on would send every header twice).
    for name in [
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
    ] {
        let count = r.headers.iter().filter(|(k, _)| k == name).count();
        assert_eq!(count, 1, "{name} appears {count} times: {r:?}");
    }
    let limit_header = r.header("x-ratelimit-limit").expect("x-ratelimit-limit");
    assert!(
        limit_header.starts_with(&format!("{limit}, ")) && limit_header.contains(policy),
        "x-ratelimit-limit {limit_header:?} should start {limit:?} and hold {policy:?}"
    );
    assert_eq!(
        r.header("x-ratelimit-remaining"),
        Some(remaining.to_string().as_str())
    );
    let reset: u64 = r
        .header("x-ratelimit-reset")
        .expect("x-ratelimit-reset")
        .parse()
        .expect("a number");
    assert!(reset >= 1, "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_bootstrap_limits_each_descriptor_with_envoys_headers() {
    let rules = root().join("deploy/kubernetes/base/rules");
    let portcullis = ServeProcess::spawn(&rules, &[], &[], &[]);
    let ports = ShippedPorts::around(portcullis.grpc_port);
    let proxy = Envoy::start(&envoy::shipped_config(ports), ports.admin);
    let ingress: SocketAddr = ([127, 0, 0, 1], ports.ingress).into();

    // login: a token bucket of burst 10 (5 a minute): the 11th attempt is refused. A call past
    // the shipped 20 ms filter timeout (a loaded CI machine) is let through by Envoy
    // (failure_mode_deny is off), read from Envoy's own counter, not guessed; Portcullis may
    // still have counted it (it arrived, late), or not (it never did): 10 to 10 + those.
    let failed_open = "cluster.app.ratelimit.failure_mode_allowed";
    let before = proxy.stat(failed_open);
    let (passed, r) = until_limited(ingress, source(2), "/api/login", &[], 30).await;
    let open = proxy.stat(failed_open) - before;
    // The counters' prefix is right: the calls answered OK are counted under it.
    assert!(proxy.stat("cluster.app.ratelimit.ok") >= 10 - open);
    assert!(
        (10..=10 + open as usize).contains(&passed),
        "login admits its burst of 10: {passed} ({open} calls failed open)"
    );
    assert_draft03(&r, "5", "5;w=60;name=\"login\"", 0);

    // api_key + /api/orders/*: 20 a second (the key's hourly 10,000 is far away). 21 requests
    // within one second: the 21st is refused (sliding window: never 21 in any second).
    let key = [("x-api-key", "k1")];
    let started = std::time::Instant::now();
    let (passed, r) = until_limited(ingress, source(3), "/api/orders/42", &key, 40).await;
    if started.elapsed() < std::time::Duration::from_secs(1) {
        assert_eq!(passed, 20, "orders of one key: 20 a second");
    } else {
        assert!(passed >= 20, "never fewer than the limit: {passed}");
    }
    assert_draft03(&r, "20", "20;w=1", 0);

    // remote_address: 600 a minute per client address, spent directly: refused through Envoy.
    exhaust(portcullis.grpc_port, &[("remote_address", "127.0.0.4")]).await;
    let (passed, r) = until_limited(ingress, source(4), "/any", &[], 5).await;
    assert_eq!(passed, 0);
    assert_draft03(&r, "600", "600;w=60", 0);
    // Another address is not affected.
    assert_eq!(
        envoy::get(ingress, source(5), "/any", &[]).await.status,
        200
    );

    // gateway=edge: 5,000 a second for everything; spent directly, every address refused.
    // (A second's window: a hit admitted a second ago may leave between the spend and the
    // request, so spend again then.)
    let mut tries = 0;
    let r = loop {
        exhaust(portcullis.grpc_port, &[("gateway", "edge")]).await;
        let r = envoy::get(ingress, source(6), "/other", &[]).await;
        tries += 1;
        if r.status != 200 || tries == 5 {
            break r;
        }
    };
    assert_eq!(r.status, 429, "{r:?}");
    assert_draft03(&r, "5000", "5000;w=1", 0);

    // plan=partner with the request's own limit (x-partner-limit through dynamic metadata):
    // a fresh Portcullis so the gateway ceiling is not spent.
    drop(proxy);
    drop(portcullis);
    let portcullis = ServeProcess::spawn(&rules, &[], &[], &[]);
    let ports = ShippedPorts::around(portcullis.grpc_port);
    let _proxy = Envoy::start(&envoy::shipped_config(ports), ports.admin);
    let ingress: SocketAddr = ([127, 0, 0, 1], ports.ingress).into();
    let partner = [("x-partner-limit", "3")];
    let (passed, r) = until_limited(ingress, source(7), "/p", &partner, 10).await;
    assert_eq!(passed, 3, "the partner's own limit of 3 a minute");
    assert_draft03(&r, "3", "3;w=60", 0);
}

/// Every Envoy config the project ships, whole (bootstraps), as the filter an Istio EnvoyFilter
/// inserts, or as README's filter snippets (wrapped in a minimal bootstrap), is accepted by
/// Envoy 1.40.
#[test]
fn every_shipped_envoy_config_validates() {
    let shipped = envoy::shipped_config(ShippedPorts {
        admin: 9901,
        ingress: 10000,
        app: 10001,
        portcullis: 8081,
    });
    envoy::validate(&shipped).unwrap_or_else(|e| panic!("deploy/envoy/envoy.yaml: {e}"));
    let mut filters = 0;
    for file in [
        "deploy/istio/shared/filter.yaml",
        "deploy/istio/sidecar/filter.yaml",
    ] {
        let text = std::fs::read_to_string(root().join(file)).expect(file);
        for filter in http_filters_of(&text) {
            let item: String = filter
                .lines()
                .enumerate()
                .map(|(i, l)| format!("{}{l}\n", if i == 0 { "- " } else { "  " }))
                .collect();
            envoy::validate(&bootstrap_with_filters(&item))
                .unwrap_or_else(|e| panic!("{file}: the inserted filter:\n{filter}\n{e}"));
            filters += 1;
        }
    }
    assert!(filters >= 2, "found {filters} inserted filters");
    let readme = envoy::readme_envoy_blocks();
    assert!(!readme.is_empty(), "README's token-budget filters");
    for block in readme {
        envoy::validate(&bootstrap_with_filters(&block))
            .unwrap_or_else(|e| panic!("README.md:\n{block}\n{e}"));
    }
}

/// The `value:` of each HTTP_FILTER patch of an EnvoyFilter file, as YAML text.
fn http_filters_of(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let indent = |l: &str| l.len() - l.trim_start().len();
    let mut out = Vec::new();
    for (start, _) in lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l.trim() == "- applyTo: HTTP_FILTER")
    {
        // This patch's `value:`, before the next patch begins.
        let Some(at) = lines[start + 1..]
            .iter()
            .take_while(|l| !l.trim_start().starts_with("- applyTo:"))
            .position(|l| l.trim() == "value:")
            .map(|p| start + 1 + p)
        else {
            continue;
        };
        let body: Vec<&str> = lines[at + 1..]
            .iter()
            .take_while(|l| l.trim().is_empty() || indent(l) > indent(lines[at]))
            .copied()
            .collect();
        let strip = body
            .iter()
            .filter(|l| !l.trim().is_empty())
            .map(|l| indent(l))
            .min()
            .unwrap_or(0);
        out.push(
            body.iter()
                .map(|l| l.get(strip..).unwrap_or(""))
                .collect::<Vec<_>>()
                .join("\n"),
        );
    }
    out
}

/// A gateway whose HTTP filters are `items` (YAML list items) then the router, with the cluster
/// the filters point at.
fn bootstrap_with_filters(items: &str) -> String {
    let mut g = envoy::Gateway::new("validate", &[8081]);
    if let Some(name) = items.lines().find_map(|l| {
        let at = l.find("cluster_name: ")?;
        Some(l[at + "cluster_name: ".len()..].trim_end_matches(['}', ' ']))
    }) {
        g.cluster = name.trim().to_owned();
    }
    g.http_filters = items.to_owned();
    g.config()
}

/// The shipped bootstrap's health check sees a replica that got SIGTERM as unhealthy while the
/// replica still answers (its default drain period, 5 s), so Envoy moves away before the listener
/// closes. (With Envoy's default no_traffic_interval, a minute, it did not: rate-limit calls are
/// not traffic to Envoy's health checker.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_health_check_sees_a_drain_before_the_listener_closes() {
    let rules = root().join("deploy/kubernetes/base/rules");
    let portcullis = ServeProcess::spawn(&rules, &[], &[], &[]);
    let ports = ShippedPorts::around(portcullis.grpc_port);
    let proxy = Envoy::start(&envoy::shipped_config(ports), ports.admin);
    let flags = || {
        let (_, body) = proxy.admin("/clusters").unwrap_or_default();
        let prefix = format!("portcullis::127.0.0.1:{}::health_flags::", ports.portcullis);
        body.lines()
            .find_map(|l| l.strip_prefix(&prefix).map(str::to_owned))
            .unwrap_or_default()
    };
    common::redis::wait_until(
        "Envoy to see Portcullis healthy",
        Duration::from_secs(10),
        || flags() == "healthy",
    );
    portcullis.signal("TERM");
    let sent = Instant::now();
    common::redis::wait_until(
        "Envoy to see the draining replica unhealthy",
        Duration::from_secs(5),
        || flags().contains("failed_active_hc"),
    );
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", portcullis.grpc_port)).is_ok(),
        "seen unhealthy only after the listener closed ({:?} after SIGTERM)",
        sent.elapsed()
    );
}
