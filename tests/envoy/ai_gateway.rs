//! Envoy AI Gateway's `QuotaPolicy`, with Portcullis in place of its rate limit image: the binary
//! started as `/bin/ratelimit` with exactly the environment and `args` of the Deployment the AI
//! Gateway's docs and e2e tests give (hosts and ports moved to loopback), its rules served over
//! xDS the way its controller serves them (a snapshot for node `envoy-ai-gateway-ratelimit`,
//! domain `ai-gateway-quota`, `backend_name` -> `model_name_override`, the leaf in quota mode),
//! behind a real Envoy 1.40 with the ratelimit filter and per-route `rate_limits` its extension
//! server injects: 1 hit on the request from static values, and at stream end the token count
//! from dynamic metadata `io.envoy.ai_gateway:quota_cost` (a Lua filter stands in for its
//! ext_proc, which sets that metadata from the response's usage).

use crate::common;

use std::time::Duration;

use crate::common::envoy::{self, Gateway};
use crate::common::process::ServeProcess;
use crate::common::redis::{RedisServer, free_port};
use crate::common::xds::Harness;
use portcullis::pb::RateLimitServiceClient;
use portcullis::pb::xds::rules as pb;

const NODE_ID: &str = "envoy-ai-gateway-ratelimit";
const DOMAIN: &str = "ai-gateway-quota";
const BACKEND: &str = "default/backend-a";
const MODEL: &str = "model-x";
/// Tokens a response costs (the upstream's usage).
const TOKENS: u32 = 40;
/// The QuotaPolicy's default bucket: `limit: 100, duration: "1h"`.
const LIMIT: u32 = 100;

/// The bucket rule of the second test: a client selector on header `x-tenant`, exact `acme`
/// (rule 0, match 0), as the controller names its descriptor key.
const TENANT_RULE: &str = "rule-0-x-tenant|acme-match-0";

fn quota_limit() -> Option<pb::RateLimitPolicy> {
    Some(pb::RateLimitPolicy {
        unit: pb::RateLimitUnit::Hour as i32,
        requests_per_unit: LIMIT,
        ..Default::default()
    })
}

/// What the controller's translator builds from a QuotaPolicy with one per-model quota: with no
/// bucket rules, the model's descriptor under its backend's holds the limit in quota mode; with
/// a bucket rule on an exact header, the rule's descriptor under the model's does.
fn quota_policy_config(bucket_rule: bool) -> pb::RateLimitConfig {
    let model = if bucket_rule {
        pb::RateLimitDescriptor {
            key: "model_name_override".into(),
            value: MODEL.into(),
            descriptors: vec![pb::RateLimitDescriptor {
                key: TENANT_RULE.into(),
                value: TENANT_RULE.into(),
                rate_limit: quota_limit(),
                quota_mode: true,
                ..Default::default()
            }],
            ..Default::default()
        }
    } else {
        pb::RateLimitDescriptor {
            key: "model_name_override".into(),
            value: MODEL.into(),
            rate_limit: quota_limit(),
            quota_mode: true,
            ..Default::default()
        }
    };
    pb::RateLimitConfig {
        name: DOMAIN.into(),
        domain: DOMAIN.into(),
        descriptors: vec![pb::RateLimitDescriptor {
            key: "backend_name".into(),
            value: BACKEND.into(),
            descriptors: vec![model],
            ..Default::default()
        }],
    }
}

/// The route's `rate_limits` as the extension server writes them: on the request, the backend
/// and model as fixed values (1 hit); at stream end, the same from dynamic metadata with the
/// tokens as `hits_addend`; a bucket rule's header match appended to both.
fn route_rate_limits(bucket_rule: bool) -> String {
    let tenant = if bucket_rule {
        format!(
            "\n    - header_value_match: {{descriptor_key: \"{TENANT_RULE}\", descriptor_value: \"{TENANT_RULE}\", expect_match: true, headers: [{{name: x-tenant, string_match: {{exact: acme}}}}]}}"
        )
    } else {
        String::new()
    };
    format!(
        r#"- actions:
    - generic_key: {{descriptor_key: backend_name, descriptor_value: "{BACKEND}"}}
    - generic_key: {{descriptor_key: model_name_override, descriptor_value: "{MODEL}"}}{tenant}
- actions:
    - metadata: {{descriptor_key: backend_name, source: DYNAMIC, metadata_key: {{key: io.envoy.ai_gateway, path: [{{key: ai_service_backend_name}}]}}}}
    - metadata: {{descriptor_key: model_name_override, source: DYNAMIC, metadata_key: {{key: io.envoy.ai_gateway, path: [{{key: model_name_override}}]}}}}{tenant}
  hits_addend: {{format: "%DYNAMIC_METADATA(io.envoy.ai_gateway:quota_cost)%"}}
  apply_on_stream_done: true"#
    )
}

/// Envoy as the AI Gateway's extension server leaves it: the filter named
/// `envoy.filters.http.ratelimit/ai-gateway-quota` (timeout 5 s, fail open, no
/// `x-envoy-ratelimited`, draft-03 headers) before the router, the route's `rate_limits` in its
/// typed_per_filter_config, the rate limit cluster over HTTP/2 with no health check; a Lua
/// filter in place of its ext_proc puts the backend, the model and the response's tokens into
/// dynamic metadata; the app answers with 40 tokens of usage.
fn gateway(ratelimit: u16, rate_limits: &str) -> Gateway {
    let mut g = Gateway::new(DOMAIN, &[ratelimit]);
    g.cluster = "ai_gateway_ratelimit_cluster".into();
    g.health_checks = false;
    g.app_headers = vec![("x-usage-tokens".into(), TOKENS.to_string())];
    let rate_limits: String = rate_limits
        .lines()
        .map(|l| format!("{}{l}\n", " ".repeat(6)))
        .collect();
    g.route_config = format!(
        r#"typed_per_filter_config:
  envoy.filters.http.ratelimit/ai-gateway-quota:
    "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute
    domain: {DOMAIN}
    rate_limits:
{rate_limits}"#
    );
    g.http_filters = format!(
        r#"- name: envoy.filters.http.lua
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua
    default_source_code:
      inline_string: |
        function envoy_on_request(handle)
          local metadata = handle:streamInfo():dynamicMetadata()
          metadata:set("io.envoy.ai_gateway", "ai_service_backend_name", "{BACKEND}")
          metadata:set("io.envoy.ai_gateway", "model_name_override", "{MODEL}")
        end
        function envoy_on_response(handle)
          local tokens = tonumber(handle:headers():get("x-usage-tokens"))
          if tokens ~= nil then
            handle:streamInfo():dynamicMetadata():set("io.envoy.ai_gateway", "quota_cost", tokens)
          end
        end
- name: envoy.filters.http.ratelimit/ai-gateway-quota
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
    domain: {DOMAIN}
    timeout: 5s
    failure_mode_deny: false
    disable_x_envoy_ratelimited_header: true
    enable_x_ratelimit_headers: DRAFT_VERSION_03
    rate_limited_as_resource_exhausted: false
    rate_limit_service:
      transport_api_version: V3
      grpc_service: {{envoy_grpc: {{cluster_name: ai_gateway_ratelimit_cluster}}}}"#
    );
    g
}

/// The rate limit Deployment's environment (LOG_LEVEL to USE_STATSD, CONFIG_*, GRPC_PORT), with
/// Redis and the controller on loopback; the listeners Kubernetes would give the pod its own
/// address for are bound to loopback on free ports.
fn deployment_env(redis: u16, xds: u16, grpc: u16) -> Vec<(&'static str, String)> {
    vec![
        ("LOG_LEVEL", "debug".into()),
        ("REDIS_SOCKET_TYPE", "tcp".into()),
        ("REDIS_URL", format!("127.0.0.1:{redis}")),
        ("RUNTIME_ROOT", "/data".into()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit".into()),
        ("USE_STATSD", "false".into()),
        ("CONFIG_TYPE", "GRPC_XDS_SOTW".into()),
        ("CONFIG_GRPC_XDS_NODE_ID", NODE_ID.into()),
        ("CONFIG_GRPC_XDS_SERVER_URL", format!("127.0.0.1:{xds}")),
        ("GRPC_PORT", grpc.to_string()),
        // Loopback only in tests (the pod listens on its own address).
        ("GRPC_HOST", "127.0.0.1".into()),
        ("HOST", "127.0.0.1".into()),
        ("PORT", free_port().to_string()),
        ("DEBUG_HOST", "127.0.0.1".into()),
        ("DEBUG_PORT", free_port().to_string()),
    ]
}

/// The tokens left, asked with a check-only call on the model's descriptor (spends nothing). A
/// probe past the 15 ms store deadline on a loaded machine is answered UNAVAILABLE by the
/// failure mode: asked again (bounded), since it is the reading, not the service, under test.
async fn remaining(grpc: u16, entries: &[(&str, &str)]) -> u32 {
    let mut client = RateLimitServiceClient::connect(format!("http://127.0.0.1:{grpc}"))
        .await
        .expect("connect");
    let mut probe = common::request(DOMAIN, &[entries]);
    probe.descriptors[0].hits_addend = Some(0);
    for _ in 0..50 {
        match client.should_rate_limit(probe.clone()).await {
            Ok(answer) => return answer.into_inner().statuses[0].limit_remaining,
            Err(status) if status.code() == tonic::Code::Unavailable => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(status) => panic!("answered: {status:?}"),
        }
    }
    panic!("the probe was answered by the failure mode 50 times in a row")
}

/// Portcullis as the Deployment starts it, rules from the controller's snapshot, Envoy as the
/// extension server configures it: five requests with `headers`, each after the previous
/// response's tokens were charged (Envoy charges them after the client has its answer); the
/// statuses, and the first refusal.
async fn five_requests(
    bucket_rule: bool,
    headers: &[(&str, &str)],
    entries: &[(&str, &str)],
) -> (Vec<u16>, Option<envoy::Response>) {
    common::clear_of_hour_boundary();
    let redis = RedisServer::start();
    let plane = Harness::start(None).await;
    let xds = plane.addr.port();
    plane.serve_snapshot(NODE_ID, "1", vec![quota_policy_config(bucket_rule)]);

    let grpc = free_port();
    let env = deployment_env(redis.port, xds, grpc);
    // The Deployment's `command: [/bin/ratelimit]` with its `args`.
    let portcullis = tokio::task::spawn_blocking(move || {
        let env: Vec<(&str, String)> = env.iter().map(|(k, v)| (*k, v.clone())).collect();
        ServeProcess::spawn_as_ratelimit_with_args(
            &env,
            &["--quotaRateLimitServiceAddr=envoy-ai-gateway-ratelimit.envoy-gateway-system"],
        )
    })
    .await
    .expect("ratelimit started");
    let g = gateway(grpc, &route_rate_limits(bucket_rule));
    let envoy = g.start();
    let ingress = g.ingress_addr();

    // 1 on the request and 40 at its end: 41, 82, 123 of 100 tokens recorded, so the fourth
    // request is refused, and every later one within the hour.
    let mut statuses = Vec::new();
    let mut refused = None;
    for n in 1..=5u32 {
        let r = envoy::get(ingress, None, "/v1/chat/completions", headers).await;
        statuses.push(r.status);
        if r.status != 200 {
            refused.get_or_insert(r);
            continue;
        }
        let expected = LIMIT.saturating_sub((TOKENS + 1) * n);
        let started = std::time::Instant::now();
        while remaining(grpc, entries).await != expected {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "the tokens of response {n} were never charged (remaining {}, expected \
                 {expected})\n{}\nEnvoy log:\n{}",
                remaining(grpc, entries).await,
                portcullis.log(),
                envoy.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    if bucket_rule {
        // Another tenant matches no bucket rule: Envoy sends no descriptor, nothing binds.
        let other = envoy::get(
            ingress,
            None,
            "/v1/chat/completions",
            &[("x-tenant", "other")],
        );
        assert_eq!(other.await.status, 200);
    }
    (statuses, refused)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_policy_token_budget_binds_within_one_response() {
    let entries = [("backend_name", BACKEND), ("model_name_override", MODEL)];
    let (statuses, refused) = five_requests(false, &[], &entries).await;
    assert_eq!(statuses, vec![200, 200, 200, 429, 429]);
    let refused = refused.expect("a refusal");
    assert_eq!(refused.header("x-envoy-ratelimited"), None);
    assert_eq!(refused.header("x-ratelimit-remaining"), Some("0"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_rule_on_a_client_header_binds_that_clients_tokens() {
    let entries = [
        ("backend_name", BACKEND),
        ("model_name_override", MODEL),
        (TENANT_RULE, TENANT_RULE),
    ];
    let (statuses, _) = five_requests(true, &[("x-tenant", "acme")], &entries).await;
    assert_eq!(statuses, vec![200, 200, 200, 429, 429]);
}

/// With the AI Gateway's Deployment environment (rules over xDS, no
/// FORCE_START_WITHOUT_INITIAL_CONFIG), Redis down, and the controller either serving nothing
/// for this node yet or not running: until the first rules come, every readiness probe says not
/// ready and why (`/healthcheck`, the Deployment's readiness probe, 500; `/readyz` 503), the
/// liveness probe 200, no gRPC port, and the log says what is awaited (it said "xDS rules stream
/// ended; the rules in force keep serving", and `/healthcheck` answered 200 OK).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn until_the_first_rules_come_every_readiness_probe_says_not_ready() {
    let plane = Harness::start(None).await;
    let silent = plane.addr.port();
    let absent = free_port();
    for (xds, awaited) in [
        (silent, None),
        (
            absent,
            Some("xDS server not reached; still waiting for the first rules"),
        ),
    ] {
        let (grpc, no_redis) = (free_port(), free_port());
        let env = deployment_env(no_redis, xds, grpc);
        let port = |name: &str| -> u16 {
            env.iter()
                .find(|(k, _)| *k == name)
                .unwrap()
                .1
                .parse()
                .unwrap()
        };
        let (http_port, debug_port) = (port("PORT"), port("DEBUG_PORT"));
        let (_link, mut cmd) = ServeProcess::ratelimit_command(&env);
        let log = tempfile::NamedTempFile::new().expect("log file");
        cmd.stderr(log.reopen().expect("log file"));
        let child = common::process::Killed(cmd.spawn().expect("start ratelimit"));
        let read_log = || std::fs::read_to_string(log.path()).unwrap_or_default();
        // Bounded: the listeners are bound before the rules are awaited, the warning comes at
        // the first stream's end (the silent server's stream is ended by nobody: no warning).
        let started = std::time::Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", http_port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "{}",
                read_log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let (status, body) = common::http(http_port, "GET", "/healthcheck", "").await;
        assert_eq!(status, 500, "/healthcheck: {body}");
        assert!(body.contains("waiting for the first rules"), "{body}");
        let (status, body) = common::http(debug_port, "GET", "/readyz", "").await;
        assert_eq!(status, 503, "/readyz: {body}");
        let (status, _) = common::http(debug_port, "GET", "/healthz", "").await;
        assert_eq!(status, 200, "liveness");
        assert!(
            std::net::TcpStream::connect(("127.0.0.1", grpc)).is_err(),
            "no rate-limit calls are taken before the rules"
        );
        if let Some(awaited) = awaited {
            while !read_log().contains(awaited) {
                assert!(
                    started.elapsed() < Duration::from_secs(20),
                    "{}",
                    read_log()
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        let text = read_log();
        assert!(!text.contains("rules in force keep serving"), "{text}");
        drop(child);
    }
}
