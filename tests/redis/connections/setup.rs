//! Connecting to Redis: a wrong password said in words, every socket with nodelay and keepalive,
//! Sentinels with their own password and TLS.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_said_in_words_in_the_log_and_in_readyz() {
    let redis = RedisServer::start_with(&["--requirepass", "right-horse-battery"]);
    let rules = tempfile::tempdir().unwrap();
    std::fs::write(rules.path().join("c.yaml"), RULES).unwrap();
    let url = redis.url();
    let args = ["--store", "redis", "--redis-url", &url];
    let envs = [("PORTCULLIS_REDIS_PASSWORD", "wrong-staple-4711".to_owned())];
    let server = ServeProcess::spawn(rules.path(), &args, &envs, &[]);
    let start = Instant::now();
    let body = loop {
        let (status, body) = http_get(server.admin_port, "/readyz").await;
        if status == 503 {
            break body;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "still ready with a wrong password: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(body.contains("authentication failed"), "{body}");
    assert!(body.contains("waiting will not help"), "{body}");
    // Calls are answered by the failure mode (allow), and counted as permanent errors.
    let mut client = portcullis::pb::RateLimitServiceClient::connect(server.grpc_url())
        .await
        .unwrap();
    let r = client
        .should_rate_limit(request("c", &[&[("k", "x")]]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, OK);
    let (_, metrics) = http_get(server.admin_port, "/metrics").await;
    assert!(
        metrics.contains(r#"portcullis_store_errors_total{kind="permanent"} 1"#),
        "{metrics}"
    );
    // gRPC readiness follows /readyz; liveness does not depend on the store.
    let channel = tonic::transport::Channel::from_shared(server.grpc_url())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let status_of = |service: &str| {
        let mut health = health.clone();
        let service = service.to_owned();
        async move {
            health
                .check(tonic_health::pb::HealthCheckRequest { service })
                .await
                .unwrap()
                .into_inner()
                .status
        }
    };
    use tonic_health::pb::health_check_response::ServingStatus;
    let start = Instant::now();
    while status_of("ratelimit").await != ServingStatus::NotServing as i32 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "gRPC readiness still SERVING"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        status_of("portcullis.liveness").await,
        ServingStatus::Serving as i32
    );
    let _ = &mut health;
    let log = server.log();
    assert!(log.contains("authentication failed"), "{log}");
    assert!(log.contains("ERROR"), "said at error level: {log}");
    assert!(
        !log.contains("wrong-staple-4711"),
        "the password is in the log: {log}"
    );
    assert!(
        !body.contains("wrong-staple-4711"),
        "the password is in /readyz"
    );
    drop(server);

    // The operator may choose to stay ready (the failure mode answers meanwhile).
    let args = [
        "--store",
        "redis",
        "--redis-url",
        &url,
        "--ready-on-permanent-store-errors",
    ];
    let server = ServeProcess::spawn(rules.path(), &args, &envs, &[]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, body) = http_get(server.admin_port, "/readyz").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("authentication failed"), "{body}");
}

/// (TCP_NODELAY, SO_KEEPALIVE) of each socket of this process connected to 127.0.0.1:`port`.
fn socket_options_to(port: u16) -> Vec<(bool, bool)> {
    let tcp = std::fs::read_to_string("/proc/self/net/tcp").expect("/proc/self/net/tcp");
    let wanted = format!("0100007F:{port:04X}");
    let inodes: Vec<String> = tcp
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // rem_address, st (01 = established), inode
            (fields[2] == wanted && fields[3] == "01").then(|| fields[9].to_owned())
        })
        .collect();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let Ok(target) = std::fs::read_link(entry.path()) else {
            continue;
        };
        let target = target.display().to_string();
        let Some(inode) = target
            .strip_prefix("socket:[")
            .and_then(|t| t.strip_suffix(']'))
        else {
            continue;
        };
        if !inodes.iter().any(|i| i == inode) {
            continue;
        }
        let fd: i32 = entry.file_name().to_string_lossy().parse().unwrap();
        let option = |level: i32, name: i32| {
            let mut value: libc::c_int = 0;
            let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            // SAFETY: `fd` is an open socket of this process (listed in /proc/self/fd) and the
            // pointers are to locals of the sizes given.
            let rc =
                unsafe { libc::getsockopt(fd, level, name, (&raw mut value).cast(), &mut len) };
            rc == 0 && value != 0
        };
        found.push((
            option(libc::IPPROTO_TCP, libc::TCP_NODELAY),
            option(libc::SOL_SOCKET, libc::SO_KEEPALIVE),
        ));
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_redis_socket_has_nodelay_and_keepalive() {
    let redis = RedisServer::start();
    let url = redis.url();
    let server = TestServer::start_with(&[("c.yaml", RULES)], move |s| {
        s.store = StoreKind::Redis;
        s.redis_url = Some(url);
    })
    .await;
    server.ok(request("c", &[&[("k", "a")]])).await;
    assert!(counted(redis.port, "a"));
    let sockets = socket_options_to(redis.port);
    assert!(!sockets.is_empty(), "no socket to Redis found");
    assert!(
        sockets
            .iter()
            .all(|&(nodelay, keepalive)| nodelay && keepalive),
        "standalone: {sockets:?}"
    );
    server.stop().await;

    let cluster = RedisCluster::start();
    let seeds = cluster.seeds();
    let server = TestServer::start_with(&[("c.yaml", RULES)], move |s| {
        s.store = StoreKind::Redis;
        s.redis_cluster = seeds;
    })
    .await;
    server.ok(request("c", &[&[("k", "b")]])).await;
    let master = cluster.master_of(&key("b"));
    assert!(counted(master, "b"));
    let sockets = socket_options_to(master);
    assert!(!sockets.is_empty(), "no socket to the cluster master found");
    assert!(
        sockets
            .iter()
            .all(|&(nodelay, keepalive)| nodelay && keepalive),
        "cluster: {sockets:?}"
    );
    server.stop().await;
}

/// A TLS master (plain port for the test's own redis-cli) with a password, and one sentinel that
/// only speaks TLS and has a password of its own.
struct TlsSentinel {
    master: RedisServer,
    master_tls_port: u16,
    sentinel: RedisServer,
    sentinel_port: u16,
    _certs: tempfile::TempDir,
}

fn tls_sentinel() -> TlsSentinel {
    require_redis();
    let certs = tempfile::tempdir().unwrap();
    common::tls::make_ca(certs.path(), "ca");
    common::tls::make_leaf(certs.path(), "ca", "server");
    let path = |name: &str| certs.path().join(name).display().to_string();
    let master_tls_port = free_port();
    let master = RedisServer::start_with(&[
        "--tls-port",
        &master_tls_port.to_string(),
        "--tls-cert-file",
        &path("server.crt"),
        "--tls-key-file",
        &path("server.key"),
        "--tls-ca-cert-file",
        &path("ca.crt"),
        "--tls-auth-clients",
        "no",
        "--requirepass",
        "data-pass",
    ]);
    let sentinel_port = free_port();
    let dir = tempfile::tempdir().unwrap().keep();
    let conf = dir.join("sentinel.conf");
    std::fs::write(
        &conf,
        format!(
            "port 0\nbind 127.0.0.1\ndir {dir}\ntls-port {sentinel_port}\ntls-cert-file {cert}\n\
             tls-key-file {key}\ntls-ca-cert-file {ca}\ntls-auth-clients no\ntls-replication yes\n\
             requirepass sentinel-pass\n\
             sentinel monitor mymaster 127.0.0.1 {master_tls_port} 1\n\
             sentinel auth-pass mymaster data-pass\n",
            dir = dir.display(),
            cert = path("server.crt"),
            key = path("server.key"),
            ca = path("ca.crt"),
        ),
    )
    .unwrap();
    let sentinel = RedisServer::spawn_config(&conf, &["--sentinel"], sentinel_port, dir);
    // The sentinel speaks TLS only: ask it through redis-cli's TLS options.
    wait_until(
        "the TLS sentinel to know the master",
        Duration::from_secs(15),
        || {
            let out = std::process::Command::new("redis-cli")
                .args(["-h", "127.0.0.1", "-p", &sentinel_port.to_string()])
                .args(["--tls", "--cacert", &path("ca.crt"), "-a", "sentinel-pass"])
                .args(["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster"])
                .stderr(std::process::Stdio::null())
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).contains(&master_tls_port.to_string())
        },
    );
    TlsSentinel {
        master,
        master_tls_port,
        sentinel,
        sentinel_port,
        _certs: certs,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinels_with_their_own_password_and_tls() {
    let setup = tls_sentinel();
    let certs = setup._certs.path().to_path_buf();
    let sentinel = format!("127.0.0.1:{}", setup.sentinel_port);
    let start = |sentinel_password: &'static str| {
        let (certs, sentinel) = (certs.clone(), sentinel.clone());
        TestServer::start_with(&[("c.yaml", RULES)], move |s| {
            s.store = StoreKind::Redis;
            s.redis_sentinel = vec![sentinel];
            s.redis_master = Some("mymaster".into());
            s.redis_tls = true;
            s.redis_ca_file = Some(certs.join("ca.crt"));
            s.redis_password = Some(Secret("data-pass".into()));
            s.redis_sentinel_tls = true;
            s.redis_sentinel_ca_file = Some(certs.join("ca.crt"));
            s.redis_sentinel_password = Some(Secret(sentinel_password.into()));
            s.failure_mode = FailureMode::Deny;
        })
    };
    let server = start("sentinel-pass").await;
    let r = server.ok(request("c", &[&[("k", "via-sentinel")]])).await;
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 4));
    let master = setup.master.port;
    assert_eq!(
        cli(master, &["-a", "data-pass", "EXISTS", &key("via-sentinel")]),
        "1"
    );
    server.stop().await;

    // The sentinel's password is its own: a wrong one is refused, nothing is counted.
    let server = start("data-pass").await;
    let r = server.ok(request("c", &[&[("k", "wrong-sentinel")]])).await;
    assert_eq!(r.overall_code, OVER, "answered by the failure mode (deny)");
    assert_eq!(
        cli(
            master,
            &["-a", "data-pass", "EXISTS", &key("wrong-sentinel")]
        ),
        "0"
    );
    server.stop().await;
    let _ = (setup.master_tls_port, &setup.sentinel);
}
