//! Bounds on connections and calls: out of descriptors the accept loop backs off, headers that
//! never finish are closed, a silent peer is disconnected, calls past the in-flight bound shed,
//! one connection's streams bounded.

use super::*;

/// CPU time (user + system) a process has used, from /proc/PID/stat, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read stat");
    // Fields after the command name (which may hold spaces) start at the last ')'.
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..]
        .split_whitespace()
        .collect();
    let utime: u64 = fields[11].parse().unwrap();
    let stime: u64 = fields[12].parse().unwrap();
    utime + stime
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_file_descriptors_the_accept_loop_backs_off_instead_of_spinning() {
    let rules = tempfile::tempdir().unwrap();
    std::fs::write(rules.path().join("b.yaml"), RULES).unwrap();
    // Few descriptors: the connections below exhaust them, and accept() fails with EMFILE while
    // the kernel keeps the rest of them queued.
    let server = common::process::ServeProcess::spawn(
        rules.path(),
        &[],
        &[],
        &["prlimit", "--nofile=48:48", "--"],
    );
    let pid = server.child.id();
    let mut held = Vec::new();
    for _ in 0..120 {
        held.push(std::net::TcpStream::connect(("127.0.0.1", server.grpc_port)).unwrap());
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    let before = cpu_ticks(pid);
    std::thread::sleep(std::time::Duration::from_secs(2));
    let used = cpu_ticks(pid) - before;
    // A loop that retries accept() at once burns a core: ~200 ticks in 2 s.
    assert!(
        used < 40,
        "{used} ticks of CPU in 2 s while out of descriptors: the accept loop spins"
    );
    drop(held);
    // Once descriptors are free again it serves.
    let start = std::time::Instant::now();
    loop {
        let answered =
            match portcullis::pb::RateLimitServiceClient::connect(server.grpc_url()).await {
                Ok(mut client) => client
                    .should_rate_limit(RateLimitRequest {
                        domain: "b".into(),
                        descriptors: vec![descriptor(&[("user", "u")])],
                        hits_addend: 0,
                    })
                    .await
                    .is_ok(),
                Err(_) => false,
            };
        if answered {
            break;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(10),
            "never served again"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Reads and discards until the peer closes; false if it is still open after `limit`.
async fn closed_within(stream: &mut tokio::net::TcpStream, limit: std::time::Duration) -> bool {
    let mut buffer = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buffer)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
        }
    }
}

#[tokio::test]
async fn the_admin_listener_closes_connections_whose_headers_never_finish() {
    let server = TestServer::start_with(&[("b.yaml", RULES)], |s| {
        s.admin_header_timeout = std::time::Duration::from_millis(200);
    })
    .await;
    let addr = server.running.as_ref().unwrap().admin_addr;
    let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
    // A request line and one header, then nothing: a slowloris client.
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    assert!(
        closed_within(&mut slow, std::time::Duration::from_secs(3)).await,
        "a connection with unfinished headers is still open"
    );
    // Complete requests are served as before.
    let m = metrics_text(&server).await;
    assert!(
        m.contains("portcullis_grpc_call_duration_seconds_count 0"),
        "{m}"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_grpc_peer_that_stops_answering_pings_is_disconnected() {
    let server = TestServer::start_with(&[("b.yaml", RULES)], |s| {
        s.grpc_keepalive_interval = std::time::Duration::from_millis(200);
        s.grpc_keepalive_timeout = std::time::Duration::from_millis(200);
    })
    .await;
    let addr = server.running.as_ref().unwrap().grpc_addr;
    let mut peer = tokio::net::TcpStream::connect(addr).await.unwrap();
    // The HTTP/2 preface and an empty SETTINGS frame, then silence: a gateway that vanished
    // without closing its connection (a node gone, a dropped route).
    peer.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .unwrap();
    assert!(
        closed_within(&mut peer, std::time::Duration::from_secs(5)).await,
        "the silent connection is still open"
    );
    server.stop().await;
}

/// A server on `redis` whose store calls wait `deadline` while Redis is paused.
async fn paused_store_server(
    redis: &common::redis::RedisServer,
    deadline: std::time::Duration,
    adjust: impl FnOnce(&mut portcullis::settings::Settings),
) -> TestServer {
    let url = redis.url();
    let server = TestServer::start_with(&[("b.yaml", RULES)], move |s| {
        s.store = portcullis::settings::StoreKind::Redis;
        s.redis_url = Some(url);
        s.store_timeout = deadline;
        adjust(s);
    })
    .await;
    // Connected, script loaded: the pause below is the only thing that slows a call.
    server
        .ok(RateLimitRequest {
            domain: "b".into(),
            descriptors: vec![descriptor(&[("user", "warm")])],
            hits_addend: 0,
        })
        .await;
    server
}

fn user_call(i: usize) -> RateLimitRequest {
    RateLimitRequest {
        domain: "b".into(),
        descriptors: vec![descriptor(&[("user", &format!("u{i}"))])],
        hits_addend: 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_max_in_flight_calls_are_shed_at_once_with_resource_exhausted() {
    let redis = common::redis::RedisServer::start();
    let deadline = std::time::Duration::from_millis(500);
    let server = paused_store_server(&redis, deadline, |s| s.max_in_flight = 2).await;
    // Long enough to outlast the calls; redis-cli itself would wait out an UNPAUSE.
    common::redis::cli(redis.port, &["CLIENT", "PAUSE", "1500"]);
    let calls: Vec<_> = (0..10)
        .map(|i| {
            let mut client = server.client.clone();
            tokio::spawn(async move {
                let started = std::time::Instant::now();
                let result = client.should_rate_limit(user_call(i)).await;
                (result.map(|_| ()).map_err(|s| s.code()), started.elapsed())
            })
        })
        .collect();
    let mut shed = 0;
    let mut answered = 0;
    for call in calls {
        let (result, took) = call.await.unwrap();
        match result {
            Err(tonic::Code::ResourceExhausted) => {
                shed += 1;
                assert!(
                    took < deadline,
                    "shed calls are answered at once, not queued"
                );
            }
            Ok(()) => answered += 1,
            Err(other) => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!((answered, shed), (2, 8));
    let m = metrics_text(&server).await;
    assert_eq!(
        sample(
            &m,
            r#"portcullis_grpc_calls_total{code="ResourceExhausted"}"#
        ),
        8.0
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_carries_at_most_max_concurrent_streams_calls_at_once() {
    let redis = common::redis::RedisServer::start();
    let deadline = std::time::Duration::from_millis(300);
    let server = paused_store_server(&redis, deadline, |s| {
        s.grpc_max_concurrent_streams = 2;
    })
    .await;
    common::redis::cli(redis.port, &["CLIENT", "PAUSE", "1500"]);
    // Six calls on the one connection of `server.client`: each waits out the store deadline, two
    // at a time, so the last cannot end before three deadlines have passed.
    let started = std::time::Instant::now();
    let calls: Vec<_> = (0..6)
        .map(|i| {
            let mut client = server.client.clone();
            tokio::spawn(async move { client.should_rate_limit(user_call(i)).await.is_ok() })
        })
        .collect();
    for call in calls {
        assert!(call.await.unwrap(), "answered by the failure mode");
    }
    assert!(
        started.elapsed() >= deadline * 3 - std::time::Duration::from_millis(50),
        "more than 2 calls ran at once on one connection: {:?}",
        started.elapsed()
    );
    server.stop().await;
}
