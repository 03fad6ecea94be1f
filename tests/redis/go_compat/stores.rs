//! Go mode against each Redis the Go service can use (a unix socket with a user and a key prefix,
//! Sentinel, Cluster seeds), an outage that says nothing of RLQS, and readiness with Redis away
//! at start.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_redis_on_a_unix_socket_with_a_user_and_key_prefix() {
    let root = config_tree();
    let socket = root.path().join("redis.sock");
    let socket_text = socket.to_string_lossy().into_owned();
    let redis = RedisServer::start_with(&["--unixsocket", &socket_text, "--unixsocketperm", "700"]);
    cli(
        redis.port,
        &["ACL", "SETUSER", "limiter", "on", ">s3cret", "~*", "+@all"],
    );
    let mut envs = go_env(root.path());
    // REDIS_SOCKET_TYPE defaults to unix, REDIS_TYPE to SINGLE: a path is enough.
    envs.extend([
        ("REDIS_URL", socket_text.clone()),
        ("REDIS_AUTH", "limiter:s3cret".into()),
        ("CACHE_KEY_PREFIX", "gw_".into()),
        ("RUNTIME_WATCH_ROOT", "false".into()),
    ]);
    let server = ServeProcess::spawn_as_ratelimit(&envs);
    serves_like_the_go_service(&server, &envs, "alice").await;

    let keys = cli(redis.port, &["KEYS", "*"]);
    assert!(
        keys.starts_with("gw_{edge|user=alice}:fw:"),
        "one fixed-window counter under the prefix, got {keys:?}"
    );
    assert!(
        cli(redis.port, &["CLIENT", "LIST"]).contains("user=limiter"),
        "REDIS_AUTH's user is the one connected"
    );
    assert!(
        server.log().contains("RUNTIME_WATCH_ROOT"),
        "an ignored variable is logged: {}",
        server.log()
    );
}

/// The Go service has no RLQS: in Go mode without it, a Redis outage is logged as the store's
/// failure only, never as anything about RLQS (a replica used to log that it could not read
/// the RLQS reservations every second; there is no such read any more).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_outage_in_go_mode_says_nothing_about_rlqs() {
    let root = config_tree();
    let mut redis = RedisServer::start();
    let mut envs = go_env(root.path());
    envs.extend([
        ("REDIS_SOCKET_TYPE", "tcp".into()),
        ("REDIS_URL", format!("127.0.0.1:{}", redis.port)),
    ]);
    let server = ServeProcess::spawn_as_ratelimit(&envs);
    serves_like_the_go_service(&server, &envs, "dave").await;
    redis.kill();
    let mut client = RateLimitServiceClient::connect(server.grpc_url())
        .await
        .expect("connect to GRPC_PORT");
    // Calls meet the outage until it is logged (bounded), then three seconds more: three rounds
    // of anything that runs each second.
    let mut logged = false;
    for _ in 0..50 {
        let _ = client
            .should_rate_limit(request("edge", &[&[("user", "erin")]]))
            .await;
        if server.log().contains("ERROR") || server.log().contains("WARN") {
            logged = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(logged, "the outage is logged: {}", server.log());
    tokio::time::sleep(Duration::from_secs(3)).await;
    let log = server.log();
    assert!(!log.contains("RLQS"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_redis_named_by_master_and_sentinels() {
    let root = config_tree();
    let setup = RedisSentinel::start();
    let mut envs = go_env(root.path());
    envs.extend([
        ("REDIS_SOCKET_TYPE", "tcp".into()),
        ("REDIS_TYPE", "SENTINEL".into()),
        (
            "REDIS_URL",
            format!("mymaster,{}", setup.sentinel_addrs().join(",")),
        ),
    ]);
    let server = ServeProcess::spawn_as_ratelimit(&envs);
    serves_like_the_go_service(&server, &envs, "bob").await;
    assert!(
        cli(setup.master.port, &["KEYS", "*"]).contains("{edge|user=bob}:fw:"),
        "the counter is on the master the sentinels name"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_redis_from_seed_nodes() {
    let root = config_tree();
    let cluster = RedisCluster::start();
    let mut envs = go_env(root.path());
    envs.extend([
        ("REDIS_SOCKET_TYPE", "tcp".into()),
        ("REDIS_TYPE", "CLUSTER".into()),
        ("REDIS_URL", cluster.seeds().join(",")),
    ]);
    let server = ServeProcess::spawn_as_ratelimit(&envs);
    serves_like_the_go_service(&server, &envs, "carol").await;
    let owner = cluster.master_of("edge|user=carol");
    assert!(
        cli(owner, &["KEYS", "*"]).contains("{edge|user=carol}:fw:"),
        "the counter is on the node owning its hash tag"
    );
}

/// Ready means able to decide: started with Redis away, the drop-in mode answers `/healthcheck`
/// 500 and gRPC health NOT_SERVING (Envoy Gateway routes by readiness), liveness stays up, and
/// it turns ready once Redis answers, as the Go service does since it waits for its first Redis
/// connection. With REDIS_STARTUP_MAX_ELAPSED_TIME it gives up and exits, as Go does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_away_at_start_it_is_not_ready_until_redis_answers() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let root = config_tree();
    let redis_port = free_port();
    let mut envs = go_env(root.path());
    envs.extend([
        ("REDIS_SOCKET_TYPE", "tcp".to_owned()),
        ("REDIS_URL", format!("127.0.0.1:{redis_port}")),
    ]);
    let server = ServeProcess::spawn_as_ratelimit(&envs);
    let http_port = var(&envs, "PORT");
    let (status, body) = http(http_port, "GET", "/healthcheck", "").await;
    assert_eq!(status, 500, "{body}");
    assert!(body.contains("has not answered"), "{body}");
    let (status, _) = http(server.admin_port, "GET", "/healthz", "").await;
    assert_eq!(status, 200, "liveness never depends on Redis");
    let channel = tonic::transport::Channel::from_shared(server.grpc_url())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let health = HealthClient::new(channel);
    let status_of = |service: &'static str| {
        let mut health = health.clone();
        async move {
            health
                .check(HealthCheckRequest {
                    service: service.into(),
                })
                .await
                .unwrap()
                .into_inner()
                .status
        }
    };
    assert_eq!(
        status_of("ratelimit").await,
        ServingStatus::NotServing as i32
    );

    let _redis = RedisServer::start_on(redis_port);
    let until = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = http(http_port, "GET", "/healthcheck", "").await;
        if status == 200 && status_of("ratelimit").await == ServingStatus::Serving as i32 {
            break;
        }
        assert!(std::time::Instant::now() < until, "never ready: {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(server);

    // REDIS_STARTUP_MAX_ELAPSED_TIME: never reached, it exits non-zero.
    let mut envs = go_env(root.path());
    envs.extend([
        ("REDIS_SOCKET_TYPE", "tcp".to_owned()),
        ("REDIS_URL", format!("127.0.0.1:{}", free_port())),
        ("REDIS_STARTUP_MAX_ELAPSED_TIME", "1s".to_owned()),
    ]);
    let started = std::time::Instant::now();
    let mut server = ServeProcess::spawn_as_ratelimit(&envs);
    let status = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        // Never ready, so nothing to drain: it exits at the limit, not 5 s of drain later.
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "still running {:?} after the start, past the 1 s limit",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(!status.success(), "{status}");
    assert!(
        server.log().contains("REDIS_STARTUP_MAX_ELAPSED_TIME"),
        "{}",
        server.log()
    );
}
