//! Limits the route carries (issue 44 item 6): Envoy 1.40 puts a route's `rate_limits[].limit`,
//! and the ratelimit filter's own `rate_limits[].limit`, in the descriptor it sends (its
//! `limit`, read here from dynamic metadata a set_metadata filter writes). Portcullis enforces it
//! instead of the rule the entries meet, on a counter of its own (the rule's stays whole), keeps
//! its refusals in the deny cache, and counts it in the metrics under the descriptor's keys, as
//! `portcullis explain --limit` says (tests/local/cli/explain.rs).

use crate::common;

use crate::common::envoy::{self, Gateway};
use crate::common::process::ServeProcess;
use crate::common::redis::RedisServer;

const RULES: &str = "domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: team
    rate_limit: {unit: minute, requests_per_unit: 100}
";

/// The set_metadata filter that gives the route its limits: user 3 a minute, team 2.
const LIMITS: &str = r#"- name: envoy.filters.http.set_metadata
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.filters.http.set_metadata.v3.Config
    metadata:
      - metadata_namespace: portcullis.limits
        value:
          user: {requests_per_unit: 3, unit: MINUTE}
          team: {requests_per_unit: 2, unit: MINUTE}
"#;

/// The ratelimit filter, with the filter's own `rate_limits` when given.
fn ratelimit_filter(own_rate_limits: &str) -> String {
    format!(
        r#"- name: envoy.filters.http.ratelimit
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
    domain: api
    timeout: 1s
    failure_mode_deny: true
    enable_x_ratelimit_headers: DRAFT_VERSION_03
{own_rate_limits}    rate_limit_service:
      transport_api_version: V3
      grpc_service: {{envoy_grpc: {{cluster_name: portcullis}}}}
"#
    )
}

/// Sends `n` requests with `header: value` and returns their statuses and the last response.
async fn send(g: &Gateway, header: &str, value: &str, n: usize) -> (Vec<u16>, envoy::Response) {
    let mut statuses = Vec::new();
    let mut last = None;
    for _ in 0..n {
        let r = envoy::get(g.ingress_addr(), None, "/", &[(header, value)]).await;
        statuses.push(r.status);
        last = Some(r);
    }
    (statuses, last.expect("n > 0"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_the_route_carries_are_enforced_keyed_apart_deny_cached_and_labelled() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("api.yaml"), RULES).expect("rules");
    let url = redis.url();
    let portcullis = ServeProcess::spawn(
        dir.path(),
        &[
            "--store",
            "redis",
            "--redis-url",
            &url,
            "--store-timeout",
            "500ms",
        ],
        &[],
        &[],
    );
    // A route's `rate_limits[].limit`.
    let mut by_route = Gateway::new("api", &[portcullis.grpc_port]);
    by_route.http_filters = format!("{LIMITS}{}", ratelimit_filter(""));
    by_route.route_rate_limits =
        "- actions: [{request_headers: {header_name: x-user, descriptor_key: user}}]
  limit: {dynamic_metadata: {metadata_key: {key: portcullis.limits, path: [{key: user}]}}}
"
        .into();
    // The ratelimit filter's own `rate_limits[].limit`.
    let mut by_filter = Gateway::new("api", &[portcullis.grpc_port]);
    by_filter.http_filters = format!(
        "{LIMITS}{}",
        ratelimit_filter(
            "    rate_limits:
      - actions: [{request_headers: {header_name: x-team, descriptor_key: team}}]
        limit: {dynamic_metadata: {metadata_key: {key: portcullis.limits, path: [{key: team}]}}}
"
        )
    );
    let _envoys = (by_route.start(), by_filter.start());

    let (statuses, last) = send(&by_route, "x-user", "alice", 5).await;
    assert_eq!(
        statuses,
        [200, 200, 200, 429, 429],
        "the route's 3 a minute"
    );
    assert_eq!(last.header("x-ratelimit-limit"), Some("3, 3;w=60"));
    let (statuses, last) = send(&by_filter, "x-team", "red", 4).await;
    assert_eq!(statuses, [200, 200, 429, 429], "the filter's 2 a minute");
    assert_eq!(last.header("x-ratelimit-limit"), Some("2, 2;w=60"));

    // The rules' own counters are untouched: a call without the limit has 100 less one.
    let mut client = portcullis::pb::RateLimitServiceClient::connect(format!(
        "http://127.0.0.1:{}",
        portcullis.grpc_port
    ))
    .await
    .expect("connect");
    for (key, value) in [("user", "alice"), ("team", "red")] {
        let answer = client
            .should_rate_limit(common::request("api", &[&[(key, value)]]))
            .await
            .expect("answered")
            .into_inner();
        assert_eq!(answer.statuses[0].limit_remaining, 99, "{key}");
    }
    // Each limit has its own key (its count in it), beside the rule's.
    let keys = common::redis::cli(redis.port, &["--scan", "--pattern", "*api*"]);
    for key in [
        "{api|user=alice}:fw:60000000us:o3",
        "{api|team=red}:fw:60000000us:o2",
        "{api|user=alice}:sw60:60000000us",
    ] {
        assert!(keys.lines().any(|k| k.ends_with(key)), "{key} in\n{keys}");
    }
    // The refusals after the first were answered from the deny cache, and the per-rule metrics
    // name the limits by their keys.
    let (_, metrics) = common::http_at(portcullis.admin_addr(), "GET", "/metrics", "").await;
    assert!(
        common::sample(&metrics, "portcullis_deny_cache_hits_total") >= 2.0,
        "{metrics}"
    );
    for (rule, over) in [("api.user", 2.0), ("api.team", 2.0)] {
        let series = format!("portcullis_rule_over_limit_total{{domain=\"api\",rule=\"{rule}\"}}");
        assert_eq!(
            common::sample(&metrics, &series),
            over,
            "{series}\n{metrics}"
        );
    }
}
