//! Failures as Envoy 1.40 sees them, through a real Envoy in front of the real binary: Portcullis
//! not running (Envoy's `failure_mode_deny` false and true), Redis down under each
//! `--failure-mode` (what the HTTP client gets, and that an answer nobody counted carries no
//! x-ratelimit-* headers), and Envoy's filter timeout shorter than the store deadline.

use crate::common;

use std::time::Duration;

use crate::common::envoy::{self, Gateway};
use crate::common::process::ServeProcess;
use crate::common::redis::{RedisServer, cli, free_port};

const RULES: &str = "domain: gw\ndescriptors:\n  - key: client\n    rate_limit: {unit: hour, requests_per_unit: 2}\n";

const ACTIONS: &str =
    "- actions:\n    - generic_key: {descriptor_key: client, descriptor_value: c}\n";

fn rules_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("gw.yaml"), RULES).expect("write rules");
    dir
}

fn gateway(portcullis: u16, failure_mode_deny: bool) -> Gateway {
    let mut g = Gateway::new("gw", &[portcullis]);
    g.route_rate_limits = ACTIONS.into();
    g.failure_mode_deny = failure_mode_deny;
    // What the client sees must be Portcullis' answer (its failure mode within its 10 ms store
    // deadline), not Envoy's timeout: at Envoy's 20 ms a loaded machine's gRPC round trip was
    // answered 500 by failure_mode_deny (seen under two busy loops). Envoy's own timeout has a
    // test of its own below.
    g.timeout = "2s".into();
    g
}

/// Three requests through the gateway: their statuses, and the last answer.
async fn three(g: &Gateway) -> (Vec<u16>, envoy::Response) {
    let mut codes = Vec::new();
    let mut last = envoy::Response::default();
    for _ in 0..3 {
        last = envoy::get(g.ingress_addr(), None, "/", &[]).await;
        codes.push(last.status);
    }
    (codes, last)
}

fn no_budget_headers(r: &envoy::Response, what: &str) {
    for name in [
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
    ] {
        assert_eq!(
            r.header(name),
            None,
            "{what}: nothing was counted, yet Envoy was given {name}: {r:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn portcullis_not_running_is_judged_by_envoys_failure_mode_deny() {
    let nobody = free_port();
    for (deny, expected) in [(false, 200), (true, 500)] {
        let g = gateway(nobody, deny);
        let _envoy = g.start();
        let (codes, _) = three(&g).await;
        assert_eq!(
            codes,
            vec![expected; 3],
            "failure_mode_deny: {deny}, nothing listening"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_under_each_failure_mode_as_the_http_client_sees_it() {
    let rules = rules_dir();
    // Nothing listens there: Redis is down from the start.
    let redis_url = format!("redis://127.0.0.1:{}", free_port());
    let serve = |mode: &str| {
        ServeProcess::spawn(
            rules.path(),
            &[
                "--store",
                "redis",
                "--redis-url",
                &redis_url,
                "--store-timeout",
                "10ms",
                "--failure-mode",
                mode,
            ],
            &[],
            &[],
        )
    };

    // allow: every request passes, and no header claims a budget of 2 with 2 remaining.
    let portcullis = serve("allow");
    let g = gateway(portcullis.grpc_port, true);
    let _envoy = g.start();
    let (codes, last) = three(&g).await;
    assert_eq!(codes, vec![200, 200, 200], "allow");
    no_budget_headers(&last, "allow");
    let (_, metrics) = common::http(portcullis.admin_port, "GET", "/metrics", "").await;
    assert!(
        common::sample(
            &metrics,
            "portcullis_failure_mode_answers_total{mode=\"allow\"}"
        ) >= 3.0,
        "failure-mode answers are counted"
    );
    drop(_envoy);

    // deny: every request refused with 429, again with no invented budget.
    let portcullis = serve("deny");
    let g = gateway(portcullis.grpc_port, false);
    let _envoy = g.start();
    let (codes, last) = three(&g).await;
    assert_eq!(codes, vec![429, 429, 429], "deny");
    no_budget_headers(&last, "deny");
    drop(_envoy);

    // local: this replica counts on its own: 2 an hour, then 429 with the local count's headers.
    let portcullis = serve("local");
    let g = gateway(portcullis.grpc_port, false);
    let _envoy = g.start();
    let (codes, last) = three(&g).await;
    assert_eq!(codes, vec![200, 200, 429], "local");
    assert_eq!(last.header("x-ratelimit-remaining"), Some("0"), "{last:?}");
    drop(_envoy);

    // error: the store's error goes to Envoy, whose failure_mode_deny decides.
    let portcullis = serve("error");
    for (deny, expected) in [(false, 200), (true, 500)] {
        let g = gateway(portcullis.grpc_port, deny);
        let _envoy = g.start();
        let (codes, last) = three(&g).await;
        assert_eq!(codes, vec![expected; 3], "error, failure_mode_deny {deny}");
        no_budget_headers(&last, "error");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoys_timeout_shorter_than_the_store_deadline_is_judged_by_envoy() {
    let rules = rules_dir();
    let redis = RedisServer::start();
    let portcullis = ServeProcess::spawn(
        rules.path(),
        &[
            "--store",
            "redis",
            "--redis-url",
            &redis.url(),
            "--store-timeout",
            "2s",
            "--failure-mode",
            "allow",
        ],
        &[],
        &[],
    );
    for (deny, expected) in [(false, 200), (true, 500)] {
        let mut g = gateway(portcullis.grpc_port, deny);
        g.timeout = "0.05s".into();
        let envoy = g.start();
        // Redis answers nothing for 1.5 s: Portcullis would wait up to 2 s, Envoy gives up at 50 ms.
        cli(redis.port, &["CLIENT", "PAUSE", "1500", "ALL"]);
        let started = std::time::Instant::now();
        let r = envoy::get(g.ingress_addr(), None, "/", &[]).await;
        let took = started.elapsed();
        assert_eq!(r.status, expected, "failure_mode_deny {deny}: {r:?}");
        assert!(
            took < Duration::from_millis(1000),
            "Envoy's own timeout answered, not Redis' return ({took:?})"
        );
        envoy.wait_stat("cluster.app.ratelimit.error", 1, Duration::from_secs(5));
        cli(redis.port, &["CLIENT", "UNPAUSE"]);
    }
}
