//! Rules reloaded while serving: a Kubernetes ConfigMap swap applied, a broken file refused with
//! the last good rules kept, a reload that would remove a serving domain refused unless allowed.

use crate::common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::common::{TestServer, request};

/// A minimal HTTP/1.1 client: (status, body).
async fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    common::http(addr.port(), method, path, body).await
}

fn admin(server: &TestServer) -> SocketAddr {
    server.running.as_ref().unwrap().admin_addr
}

use crate::common::sample;

/// Writes `text` as a new ConfigMap generation: `..<generation>/rules.yaml`, then swaps the
/// `..data` link atomically, the way the kubelet updates a mounted ConfigMap.
fn configmap_update(dir: &std::path::Path, generation: u32, text: &str) {
    let data = dir.join(format!("..gen_{generation}"));
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("rules.yaml"), text).unwrap();
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(format!("..gen_{generation}"), &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
    if !dir.join("rules.yaml").exists() {
        std::os::unix::fs::symlink("..data/rules.yaml", dir.join("rules.yaml")).unwrap();
    }
    if generation > 1 {
        std::fs::remove_dir_all(dir.join(format!("..gen_{}", generation - 1))).unwrap();
    }
}

fn limit_rules(requests: u32) -> String {
    format!(
        "domain: live\ndescriptors:\n  - key: k\n    rate_limit: {{unit: hour, requests_per_unit: {requests}}}\n"
    )
}

async fn current_limit(server: &TestServer) -> u32 {
    let r = server.ok(request("live", &[&[("k", "probe")]])).await;
    r.statuses[0]
        .current_limit
        .as_ref()
        .map_or(0, |l| l.requests_per_unit)
}

async fn wait_for_limit(server: &TestServer, requests: u32) {
    let start = Instant::now();
    while current_limit(server).await != requests {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "limit {requests} not picked up"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn configmap_swap_reloads_rules_and_a_broken_file_keeps_the_last_good_ones() {
    let server = TestServer::start_with(&[], |s| s.allow_empty_rules = true).await;
    let dir = server.dir.path().to_path_buf();
    configmap_update(&dir, 1, &limit_rules(1));
    wait_for_limit(&server, 1).await;
    configmap_update(&dir, 2, &limit_rules(5));
    wait_for_limit(&server, 5).await;

    let reload_errors = |m: &str| sample(m, r#"portcullis_rules_reloads_total{result="error"}"#);
    configmap_update(
        &dir,
        3,
        "domain: live\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight}\n",
    );
    let start = Instant::now();
    loop {
        let (_, m) = http(admin(&server), "GET", "/metrics", "").await;
        if reload_errors(&m) == 1.0 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the broken file was not noticed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        current_limit(&server).await,
        5,
        "the last good rules stay in force"
    );

    configmap_update(&dir, 4, &limit_rules(7));
    wait_for_limit(&server, 7).await;
    let (_, m) = http(admin(&server), "GET", "/metrics", "").await;
    // The load at start and three reloads (as Go's config_load_success counts).
    assert_eq!(
        sample(&m, r#"portcullis_rules_reloads_total{result="success"}"#),
        4.0
    );
    assert_eq!(reload_errors(&m), 1.0);
    server.stop().await;
}

async fn wait_for_metric(server: &TestServer, series: &str, value: f64) {
    let start = Instant::now();
    loop {
        let (_, m) = http(admin(server), "GET", "/metrics", "").await;
        if sample(&m, series) == value {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{series} never reached {value}: {m}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_reload_that_would_remove_a_serving_domain_is_refused_unless_allowed() {
    let refused = r#"portcullis_rules_reloads_total{result="refused"}"#;
    let server = TestServer::start_with(&[], |s| s.allow_empty_rules = true).await;
    let dir = server.dir.path().to_path_buf();
    configmap_update(&dir, 1, &limit_rules(3));
    wait_for_limit(&server, 3).await;
    // A file that no longer defines the serving domain: refused, the domain keeps its limit.
    configmap_update(&dir, 2, "domain: other\n");
    wait_for_metric(&server, refused, 1.0).await;
    assert_eq!(current_limit(&server).await, 3);
    // A ConfigMap emptied by mistake: refused too.
    std::fs::remove_file(dir.join("rules.yaml")).unwrap();
    wait_for_metric(&server, refused, 2.0).await;
    assert_eq!(current_limit(&server).await, 3);
    server.stop().await;

    // With --allow-rules-removal the operator says removing domains is intended.
    let server = TestServer::start_with(&[], |s| {
        s.allow_rules_removal = true;
        s.allow_empty_rules = true;
    })
    .await;
    let dir = server.dir.path().to_path_buf();
    configmap_update(&dir, 1, &limit_rules(3));
    wait_for_limit(&server, 3).await;
    configmap_update(&dir, 2, "domain: other\n");
    wait_for_limit(&server, 0).await;
    server.stop().await;
}

#[tokio::test]
async fn readiness_can_require_at_least_one_domain() {
    let server = TestServer::start_with(&[], |s| {
        s.ready_requires_rules = true;
        s.allow_empty_rules = true;
    })
    .await;
    let (status, body) = http(admin(&server), "GET", "/readyz", "").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("no domain loaded"), "{body}");
    configmap_update(server.dir.path(), 1, &limit_rules(3));
    wait_for_limit(&server, 3).await;
    let (status, body) = http(admin(&server), "GET", "/readyz", "").await;
    assert_eq!(status, 200, "{body}");
    server.stop().await;
}
