//! Every resource fed by requests has a bound: metric series, string lengths, message sizes, calls
//! in flight. Each test sends what a hostile or buggy client would and checks the bound holds and
//! says so.

mod common;

use common::{TestServer, descriptor};
use portcullis::pb::RateLimitRequest;
use portcullis::pb::RateLimitUnit;
use portcullis::pb::rate_limit_descriptor::RateLimitOverride;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn metrics_text(server: &TestServer) -> String {
    let addr = server.running.as_ref().unwrap().admin_addr;
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let request = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    raw.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default()
}

fn sample(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix(series)
                .and_then(|rest| rest.strip_prefix(' '))
        })
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

const RULES: &str = r#"
domain: b
descriptors:
  - key: tenant
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 10}
"#;

/// `count` descriptors in calls of 500, the `i`-th built by `make(i)`.
async fn send_many(
    server: &TestServer,
    count: usize,
    make: impl Fn(usize) -> portcullis::pb::RateLimitDescriptor,
) {
    let mut i = 0;
    while i < count {
        let end = (i + 500).min(count);
        let request = RateLimitRequest {
            domain: "b".into(),
            descriptors: (i..end).map(&make).collect(),
            hits_addend: 0,
        };
        server.ok(request).await;
        i = end;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_thousand_distinct_values_leave_metrics_within_a_fixed_size() {
    let server = TestServer::start_with(&[("b.yaml", RULES)], |s| {
        s.max_detailed_series = 100;
    })
    .await;
    // Request-carried limits: the label is built from the keys only.
    send_many(&server, 100_000, |i| {
        let value = format!("client-{i}");
        let mut d = descriptor(&[("user", &value)]);
        d.limit = Some(RateLimitOverride {
            requests_per_unit: 5,
            unit: RateLimitUnit::Minute as i32,
        });
        d
    })
    .await;
    // detailed_metric: one series per value up to the cap, then folded into the rule's own.
    send_many(&server, 100_000, |i| {
        descriptor(&[("tenant", &format!("t{i}"))])
    })
    .await;
    let m = metrics_text(&server).await;
    assert!(
        m.len() < 64 * 1024,
        "/metrics grew to {} bytes with request values",
        m.len()
    );
    assert!(!m.contains("client-"), "no override value in any label");
    assert_eq!(
        sample(
            &m,
            r#"portcullis_rule_hits_total{domain="b",rule="b.user"}"#
        ),
        100_000.0,
        "overrides count under the keys-only label"
    );
    let detailed = m
        .lines()
        .filter(|l| l.starts_with("portcullis_rule_hits_total{domain=\"b\",rule=\"b.tenant_"))
        .count();
    assert_eq!(detailed, 100, "exactly the cap of per-value series");
    assert_eq!(
        sample(
            &m,
            r#"portcullis_rule_hits_total{domain="b",rule="b.tenant"}"#
        ),
        99_900.0,
        "hits beyond the cap count under the rule's own label"
    );
    assert_eq!(
        sample(&m, "portcullis_detailed_series_folded_total"),
        99_900.0
    );
    server.stop().await;
}

#[tokio::test]
async fn domain_keys_and_values_longer_than_the_cap_are_refused_naming_the_field() {
    let server = TestServer::start_with(&[("b.yaml", RULES)], |s| {
        s.max_string_bytes = 1024;
    })
    .await;
    let long = "x".repeat(1025);
    let fits = "y".repeat(1024);
    let cases = [
        (
            RateLimitRequest {
                domain: long.clone(),
                descriptors: vec![descriptor(&[("user", "u")])],
                hits_addend: 0,
            },
            "domain",
        ),
        (
            RateLimitRequest {
                domain: "b".into(),
                descriptors: vec![descriptor(&[("user", "u")]), descriptor(&[(&long, "u")])],
                hits_addend: 0,
            },
            "descriptors[1].entries[0].key",
        ),
        (
            RateLimitRequest {
                domain: "b".into(),
                descriptors: vec![descriptor(&[("user", "u"), ("user", &long)])],
                hits_addend: 0,
            },
            "descriptors[0].entries[1].value",
        ),
    ];
    for (request, field) in cases {
        let status = server.call(request).await.expect_err("refused");
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(
            status.message().starts_with(field) && status.message().contains("1024"),
            "{field}: {}",
            status.message()
        );
    }
    // Exactly the cap is accepted, and the refused calls spent nothing.
    let r = server
        .ok(RateLimitRequest {
            domain: "b".into(),
            descriptors: vec![descriptor(&[("user", &fits)])],
            hits_addend: 0,
        })
        .await;
    assert_eq!(r.statuses[0].limit_remaining, 9);
    let r = server
        .ok(RateLimitRequest {
            domain: "b".into(),
            descriptors: vec![descriptor(&[("user", "u")])],
            hits_addend: 0,
        })
        .await;
    assert_eq!(
        r.statuses[0].limit_remaining, 9,
        "refused calls counted nothing"
    );
    server.stop().await;
}

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
async fn json_calls_spend_budget_so_they_are_off_unless_enabled() {
    let server = TestServer::start(&[("b.yaml", RULES)]).await;
    let addr = server.running.as_ref().unwrap().admin_addr;
    let body = r#"{"domain":"b","descriptors":[{"entries":[{"key":"user","value":"j"}]}]}"#;
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "POST /json HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    assert!(raw.starts_with("HTTP/1.1 404"), "{raw}");
    server.stop().await;
}

#[tokio::test]
async fn requests_larger_than_a_real_envoy_request_needs_are_refused() {
    let server = TestServer::start(&[("b.yaml", RULES)]).await;
    // 400 descriptors with 200-byte values: about 90 KiB, above the 64 KiB default.
    let value = "v".repeat(200);
    let big = RateLimitRequest {
        domain: "b".into(),
        descriptors: (0..400).map(|_| descriptor(&[("user", &value)])).collect(),
        hits_addend: 0,
    };
    let status = server.call(big).await.expect_err("refused");
    assert!(
        matches!(
            status.code(),
            tonic::Code::OutOfRange | tonic::Code::ResourceExhausted
        ),
        "{status:?}"
    );
    // The refused request counted nothing.
    let r = server
        .ok(RateLimitRequest {
            domain: "b".into(),
            descriptors: vec![descriptor(&[("user", &value)])],
            hits_addend: 0,
        })
        .await;
    assert_eq!(r.statuses[0].limit_remaining, 9);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_new_descriptors_fills_the_memory_store_to_its_cap_and_no_further() {
    // At most 256 counters in the whole store.
    let server = TestServer::start_with(&[("b.yaml", RULES)], |s| {
        s.memory_max_counters = 256;
    })
    .await;
    for i in 0..2_000 {
        let call = RateLimitRequest {
            domain: "b".into(),
            descriptors: vec![descriptor(&[("tenant", &format!("t{i}"))])],
            hits_addend: 0,
        };
        // The default failure mode allows; the store's refusal shows in the metrics.
        server.ok(call).await;
    }
    let metrics = metrics_text(&server).await;
    let refused = sample(
        &metrics,
        "portcullis_store_errors_total{kind=\"unavailable\"}",
    ) as u64;
    assert!(
        refused >= 2_000 - 256,
        "every descriptor past the cap is answered by the failure mode: {refused}"
    );
    assert!(
        sample(
            &metrics,
            "portcullis_failure_mode_answers_total{mode=\"allow\"}"
        ) >= refused as f64
    );
    server.stop().await;
}

/// A full memory store never admits a descriptor twice past its limit (found black box: with a
/// cap of 50 and `--failure-mode deny`, 80 users once then the first 50 again admitted users 8,
/// 13, 26, ... twice in the hour). The cap is the store's, not split over shards, and a new
/// descriptor that finds it full is answered by `--failure-mode`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_memory_store_never_admits_a_descriptor_twice_past_its_limit() {
    use common::process::ServeProcess;
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        dir.path().join("u.yaml"),
        "domain: u\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
    )
    .expect("rules");
    let server = ServeProcess::spawn(
        dir.path(),
        &["--memory-max-counters", "50", "--failure-mode", "deny"],
        &[],
        &[],
    );
    let mut client = portcullis::pb::RateLimitServiceClient::connect(server.grpc_url())
        .await
        .expect("connect");
    let mut admitted = vec![0u32; 80];
    for pass in [0..80, 0..50] {
        for user in pass {
            let call = common::request("u", &[&[("user", &format!("u{user}"))]]);
            let r = client.should_rate_limit(call).await.expect("answered");
            if r.into_inner().overall_code == 1 {
                admitted[user] += 1;
            }
        }
    }
    let twice: Vec<usize> = (0..80).filter(|&u| admitted[u] > 1).collect();
    assert!(twice.is_empty(), "admitted twice in the hour: {twice:?}");
    // The store holds 50 counters, not fewer: the first 50 users were counted.
    assert_eq!(admitted[..50].iter().sum::<u32>(), 50, "{admitted:?}");
    // And the 30 that found it full were refused, as --failure-mode deny says.
    assert_eq!(admitted[50..].iter().sum::<u32>(), 0, "{admitted:?}");
    // The operator sees it coming: the fill ratio gauge (deploy/prometheus alerts past 0.8).
    let (_, metrics) = common::http(server.admin_port, "GET", "/metrics", "").await;
    assert_eq!(
        common::sample(&metrics, "portcullis_memory_store_fill_ratio"),
        1.0,
        "{metrics}"
    );
}

/// All or nothing holds with a blocked descriptor on Redis (found black box: with
/// `--stop-charging-when-over`, a call refused by a `requests_per_unit: 0` descriptor still
/// charged its 5-a-minute one, so five calls on that one alone gave OK, OK, OK, OK, OVER_LIMIT).
/// The memory store charged nothing; the two now agree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_or_nothing_with_a_blocked_descriptor_charges_nothing_on_redis() {
    use common::process::ServeProcess;
    let redis = common::redis::RedisServer::start();
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        dir.path().join("a.yaml"),
        "domain: a\ndescriptors:\n  - key: blocked\n    rate_limit: {unit: minute, requests_per_unit: 0}\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n",
    )
    .expect("rules");
    for store in [
        vec![],
        vec!["--store", "redis", "--redis-url", &redis.url()],
    ] {
        let mut args = vec!["--stop-charging-when-over"];
        args.extend(store.iter().copied());
        let server = ServeProcess::spawn(dir.path(), &args, &[], &[]);
        let mut client = portcullis::pb::RateLimitServiceClient::connect(server.grpc_url())
            .await
            .expect("connect");
        let both = common::request("a", &[&[("blocked", "x")], &[("user", "u")]]);
        let r = client.should_rate_limit(both).await.expect("answered");
        assert_eq!(
            r.into_inner().overall_code,
            2,
            "refused by the blocked descriptor"
        );
        let mut codes = Vec::new();
        for _ in 0..6 {
            let alone = common::request("a", &[&[("user", "u")]]);
            let r = client.should_rate_limit(alone).await.expect("answered");
            codes.push(r.into_inner().overall_code);
        }
        assert_eq!(
            codes,
            vec![1, 1, 1, 1, 1, 2],
            "{store:?}: the refused call charged nothing"
        );
    }
}
