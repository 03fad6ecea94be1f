//! Secrets never leave the process: a run of the real binary at the most verbose log level, with
//! Redis passwords given every way an operator can (in the URL, by flag, by variable, the Go
//! service's REDIS_AUTH), right and wrong, has none of them in its log or in anything its admin
//! and debug listeners serve.

use std::time::{Duration, Instant};

use crate::common::process::ServeProcess;
use crate::common::redis::{RedisServer, cli, free_port};
use crate::common::{http, request};
use portcullis::pb::RateLimitServiceClient;

const RULES: &str = r#"
domain: s
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 5}
"#;

/// Every admin path a scrape or an operator reaches, and `/json` with a call.
async fn everything_served(port: u16) -> String {
    let mut all = String::new();
    for path in [
        "/healthz",
        "/readyz",
        "/rlconfig",
        "/metrics",
        "/stats",
        "/healthcheck",
    ] {
        let (status, body) = http(port, "GET", path, "").await;
        all.push_str(&format!("{path} {status}\n{body}\n"));
    }
    let call = r#"{"domain":"s","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#;
    let (status, body) = http(port, "POST", "/json", call).await;
    all.push_str(&format!("/json {status}\n{body}\n"));
    all
}

/// What one run is, its arguments and its environment.
type Run<'a> = (&'a str, Vec<&'a str>, Vec<(&'a str, String)>);

async fn one_call(grpc_url: String) {
    let mut client = RateLimitServiceClient::connect(grpc_url)
        .await
        .expect("connect");
    client
        .should_rate_limit(request("s", &[&[("k", "v")]]))
        .await
        .expect("answered");
}

fn assert_secret_free(what: &str, text: &str, secrets: &[&str]) {
    for secret in secrets {
        assert!(
            !text.contains(secret),
            "{what} holds the secret {secret:?}:\n{text}"
        );
    }
}

/// Waits until `/readyz` has said something about the store (a connection made or refused).
async fn store_seen(port: u16, log: impl Fn() -> String) {
    let start = Instant::now();
    loop {
        let (_, body) = http(port, "GET", "/readyz", "").await;
        if body.contains("store") || log().contains("Redis") {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "{body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_are_in_no_log_and_no_admin_answer() {
    let redis = RedisServer::start();
    cli(
        redis.port,
        &[
            "ACL",
            "SETUSER",
            "limiter",
            "on",
            ">Url-Secret-1",
            ">Flag-Secret-2",
            "~*",
            "+@all",
        ],
    );
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("s.yaml"), RULES).expect("rules");
    let common_args = ["--store", "redis", "--log-level", "trace", "--admin-json"];

    // 1. In the URL, right; 2. by flag, right; 3. by variable, wrong (refused, said in words).
    let url_with_password = format!("redis://limiter:Url-Secret-1@127.0.0.1:{}", redis.port);
    let plain_url = redis.url();
    let runs: [Run; 3] = [
        (
            "password in the URL",
            vec!["--redis-url", &url_with_password],
            vec![],
        ),
        (
            "password by flag",
            vec![
                "--redis-url",
                &plain_url,
                "--redis-user",
                "limiter",
                "--redis-password",
                "Flag-Secret-2",
            ],
            vec![],
        ),
        (
            "wrong password by variable",
            vec!["--redis-url", &plain_url, "--redis-user", "limiter"],
            vec![("PORTCULLIS_REDIS_PASSWORD", "Wrong-Secret-3".into())],
        ),
    ];
    let secrets = ["Url-Secret-1", "Flag-Secret-2", "Wrong-Secret-3"];
    for (what, args, envs) in runs {
        let mut all_args: Vec<&str> = common_args.to_vec();
        all_args.extend(args);
        let server = ServeProcess::spawn(dir.path(), &all_args, &envs, &[]);
        store_seen(server.admin_port, || server.log()).await;
        one_call(server.grpc_url()).await;
        let served = everything_served(server.admin_port).await;
        assert!(served.contains("/rlconfig 200"), "{served}");
        assert_secret_free(&format!("{what}: admin answers"), &served, &secrets);
        let log = server.log();
        assert!(
            log.contains("TRACE") || log.contains("DEBUG"),
            "{what}: the log is verbose: {log}"
        );
        assert_secret_free(&format!("{what}: log"), &log, &secrets);
        if what.starts_with("wrong") {
            assert!(log.contains("authentication failed"), "{log}");
        } else {
            assert!(
                cli(redis.port, &["CLIENT", "LIST"]).contains("user=limiter"),
                "{what}: connected as the ACL user"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_go_services_redis_auth_is_in_no_log_and_no_debug_answer() {
    let redis = RedisServer::start();
    cli(
        redis.port,
        &[
            "ACL",
            "SETUSER",
            "limiter",
            "on",
            ">Go-Secret-4",
            "~*",
            "+@all",
        ],
    );
    let root = tempfile::tempdir().expect("temp dir");
    let config = root.path().join("current/ratelimit/config");
    std::fs::create_dir_all(&config).expect("config dir");
    std::fs::write(config.join("s.yaml"), RULES).expect("rules");
    let envs = vec![
        ("HOST", "127.0.0.1".to_owned()),
        ("PORT", free_port().to_string()),
        ("GRPC_HOST", "127.0.0.1".into()),
        ("GRPC_PORT", free_port().to_string()),
        ("DEBUG_HOST", "127.0.0.1".into()),
        ("DEBUG_PORT", free_port().to_string()),
        (
            "RUNTIME_ROOT",
            root.path().join("current").to_string_lossy().into_owned(),
        ),
        ("RUNTIME_SUBDIRECTORY", "ratelimit".into()),
        ("USE_STATSD", "false".into()),
        ("LOG_LEVEL", "trace".into()),
        ("REDIS_SOCKET_TYPE", "tcp".into()),
        ("REDIS_URL", format!("127.0.0.1:{}", redis.port)),
        ("REDIS_AUTH", "limiter:Go-Secret-4".into()),
        // Each decision's deadline (Go's REDIS_TIMEOUT), 2 s as in the other Go-mode tests: a first
        // call past the default 15 ms on a loaded machine was answered UNAVAILABLE.
        ("REDIS_TIMEOUT", "2s".into()),
    ];
    let port = |name: &str| -> u16 {
        envs.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.parse().expect("port"))
            .expect("set")
    };
    let server = ServeProcess::spawn_as_ratelimit(&envs);
    store_seen(port("DEBUG_PORT"), || server.log()).await;
    one_call(server.grpc_url()).await;
    let mut served = everything_served(port("DEBUG_PORT")).await;
    served.push_str(&everything_served(port("PORT")).await);
    assert!(served.contains("/rlconfig 200"), "{served}");
    assert_secret_free(
        "REDIS_AUTH: debug and health answers",
        &served,
        &["Go-Secret-4"],
    );
    assert_secret_free("REDIS_AUTH: log", &server.log(), &["Go-Secret-4"]);
    assert!(
        cli(redis.port, &["CLIENT", "LIST"]).contains("user=limiter"),
        "REDIS_AUTH's user is the one connected"
    );
}
