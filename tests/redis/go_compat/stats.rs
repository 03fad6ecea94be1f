//! The Go service's stats: its stat names over statsd and Prometheus, Envoy Gateway's mapping,
//! EXTRA_TAGS on every counter.

use super::*;

/// Adds up `name:N|c` lines from the statsd packets on `socket` until `want` holds or 10 s pass.
fn statsd_counts(
    socket: &std::net::UdpSocket,
    want: impl Fn(&BTreeMap<String, i64>) -> bool,
) -> BTreeMap<String, i64> {
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut counts = BTreeMap::new();
    let start = Instant::now();
    let mut buf = [0u8; 65_536];
    while !want(&counts) && start.elapsed() < Duration::from_secs(10) {
        let Ok(n) = socket.recv(&mut buf) else {
            continue;
        };
        for line in String::from_utf8_lossy(&buf[..n]).lines() {
            if let Some((name, rest)) = line.split_once(':')
                && let Some(value) = rest.strip_suffix("|c")
            {
                *counts.entry(name.to_owned()).or_insert(0) += value.parse::<i64>().unwrap();
            }
        }
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_stat_names_over_statsd_and_prometheus() {
    let root = config_tree();
    let redis = RedisServer::start();
    let statsd = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let prometheus = free_port();
    let mut envs = go_env(root.path());
    envs.retain(|(k, _)| *k != "USE_STATSD");
    envs.extend([
        ("REDIS_SOCKET_TYPE", "tcp".into()),
        ("REDIS_URL", format!("127.0.0.1:{}", redis.port)),
        // USE_STATSD defaults to true.
        ("STATSD_HOST", "127.0.0.1".into()),
        (
            "STATSD_PORT",
            statsd.local_addr().unwrap().port().to_string(),
        ),
        ("STATS_FLUSH_INTERVAL", "100ms".into()),
        ("USE_PROMETHEUS", "true".into()),
        ("PROMETHEUS_ADDR", format!("127.0.0.1:{prometheus}")),
        ("PROMETHEUS_PATH", "/metrics".into()),
    ]);
    let server = ServeProcess::spawn_as_ratelimit(&envs);
    serves_like_the_go_service(&server, &envs, "dave").await;

    let hits = "ratelimit.service.rate_limit.edge.user.total_hits";
    let over = "ratelimit.service.rate_limit.edge.user.over_limit";
    // Four gRPC calls and one /json call.
    let counts = statsd_counts(&statsd, |c| {
        c.get(hits) == Some(&5) && c.get(over) == Some(&2)
    });
    assert_eq!(counts.get(hits), Some(&5), "{counts:?}");
    assert_eq!(counts.get(over), Some(&2), "{counts:?}");

    let (status, text) = http(prometheus, "GET", "/metrics", "").await;
    assert_eq!(status, 200);
    for series in [
        r#"ratelimit_service_rate_limit_total_hits{domain="edge",key1="user"} 5"#,
        r#"ratelimit_service_rate_limit_over_limit{domain="edge",key1="user"} 2"#,
        r#"ratelimit_service_rate_limit_within_limit{domain="edge",key1="user"} 3"#,
    ] {
        assert!(text.lines().any(|l| l == series), "{series} in:\n{text}");
    }
}

/// Envoy Gateway's rate limit Deployment with Prometheus on: USE_PROMETHEUS, PROMETHEUS_ADDR and
/// PROMETHEUS_MAPPER_YAML naming its statsd_exporter mapping. The binary starts (it refused the
/// variable before) and serves the series the mapping makes; what the mapping drops is absent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_gateways_prometheus_mapping_is_served() {
    let root = config_tree();
    let redis = RedisServer::start();
    let prometheus = free_port();
    let mapping = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/envoy-gateway-statsd-mapping.yaml"
    );
    let mut envs = go_env(root.path());
    envs.extend([
        ("REDIS_SOCKET_TYPE", "tcp".into()),
        ("REDIS_URL", format!("127.0.0.1:{}", redis.port)),
        ("USE_PROMETHEUS", "true".into()),
        ("PROMETHEUS_ADDR", format!("127.0.0.1:{prometheus}")),
        ("PROMETHEUS_MAPPER_YAML", mapping.into()),
    ]);
    let server = ServeProcess::spawn_as_ratelimit(&envs);
    serves_like_the_go_service(&server, &envs, "erin").await;
    let (status, text) = http(prometheus, "GET", "/metrics", "").await;
    assert_eq!(status, 200);
    for series in [
        r#"ratelimit_service_rate_limit_total_hits{domain="edge",key1="user"} 5"#,
        r#"ratelimit_service_rate_limit_over_limit{domain="edge",key1="user"} 2"#,
        r#"ratelimit_service_total_requests{grpc_method="ShouldRateLimit"} 4"#,
        r#"ratelimit_service_config_load_success 1"#,
    ] {
        assert!(text.lines().any(|l| l == series), "{series} in:\n{text}");
    }
    assert!(
        text.lines().any(|l| l.starts_with(
            r#"ratelimit_service_response_time_seconds_count{grpc_method="ShouldRateLimit"}"#
        )),
        "{text}"
    );
    // Not in the mapping: dropped by its catch-all (the default mapping would export it).
    assert!(!text.contains("near_limit"), "{text}");

    // A mapping that does not parse stops the start, naming the file.
    let broken = root.path().join("broken.yaml");
    std::fs::write(
        &broken,
        "mappings:\n  - match: \"a.(\"\n    match_type: regex\n    name: x\n",
    )
    .unwrap();
    let mut envs = go_env(root.path());
    envs.extend([
        ("REDIS_SOCKET_TYPE", "tcp".into()),
        ("REDIS_URL", format!("127.0.0.1:{}", redis.port)),
        ("USE_PROMETHEUS", "true".into()),
        ("PROMETHEUS_ADDR", format!("127.0.0.1:{}", free_port())),
        ("PROMETHEUS_MAPPER_YAML", broken.display().to_string()),
    ]);
    let (_dir, mut command) = ServeProcess::ratelimit_command(&envs);
    let out = command.output().expect("run");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("broken.yaml"), "{stderr}");
}

/// Every statsd line (`name:value|c...`) received on `socket` until one for `name_prefix`
/// arrives or 10 s pass.
fn statsd_lines(socket: &std::net::UdpSocket, name_prefix: &str) -> Vec<String> {
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut lines = Vec::new();
    let start = Instant::now();
    let mut buf = [0u8; 65_536];
    while !lines.iter().any(|l: &String| l.starts_with(name_prefix))
        && start.elapsed() < Duration::from_secs(10)
    {
        if let Ok(n) = socket.recv(&mut buf) {
            lines.extend(
                String::from_utf8_lossy(&buf[..n])
                    .lines()
                    .map(str::to_owned),
            );
        }
    }
    lines
}

/// EXTRA_TAGS tags every statsd counter as the Go service does: in the name
/// (`.__key=value`, keys sorted, `.:|` in values as `_`), or as DogStatsD tags with
/// USE_DOG_STATSD.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extra_tags_tag_every_statsd_counter_as_go_does() {
    let root = config_tree();
    let redis = RedisServer::start();
    let hits = "ratelimit.service.rate_limit.edge.user.total_hits";
    for dog in [false, true] {
        let statsd = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut envs = go_env(root.path());
        envs.retain(|(k, _)| *k != "USE_STATSD");
        envs.extend([
            ("REDIS_SOCKET_TYPE", "tcp".into()),
            ("REDIS_URL", format!("127.0.0.1:{}", redis.port)),
            ("STATSD_HOST", "127.0.0.1".into()),
            (
                "STATSD_PORT",
                statsd.local_addr().unwrap().port().to_string(),
            ),
            ("STATS_FLUSH_INTERVAL", "100ms".into()),
            ("EXTRA_TAGS", "release:v1.2,commit:abc".into()),
            ("USE_DOG_STATSD", dog.to_string()),
        ]);
        let server = ServeProcess::spawn_as_ratelimit(&envs);
        let mut client = RateLimitServiceClient::connect(server.grpc_url())
            .await
            .expect("connect");
        client
            .should_rate_limit(request("edge", &[&[("user", "tagged")]]))
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", server.log()));
        let lines = statsd_lines(&statsd, hits);
        let want = if dog {
            format!("{hits}:1|c|#commit:abc,release:v1_2")
        } else {
            format!("{hits}.__commit=abc.__release=v1_2:1|c")
        };
        assert!(
            lines.contains(&want),
            "{want} not among {lines:?}\n{}",
            server.log()
        );
    }
}
