//! Shutdown: SIGTERM reports NOT_SERVING, keeps answering through the drain and exits 0.

use crate::common;

use std::time::{Duration, Instant};

use crate::common::process::ServeProcess;
use crate::common::request;
use portcullis::pb::rate_limit_response::Code;

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

use crate::common::http_at as http;

#[tokio::test]
async fn sigterm_reports_not_serving_keeps_answering_through_the_drain_and_exits_0() {
    use tonic_health::pb::{
        HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("m.yaml"), common::OPERATIONS_RULES).unwrap();
    let mut server = ServeProcess::spawn(dir.path(), &["--drain-period", "1500ms"], &[], &[]);
    let channel = tonic::transport::Channel::from_shared(server.grpc_url())
        .unwrap()
        .connect()
        .await
        .expect("connect");
    let mut health = HealthClient::new(channel.clone());
    let mut rls = portcullis::pb::RateLimitServiceClient::new(channel);
    let status_of = |h: &mut HealthClient<_>, service: &str| {
        let mut h = h.clone();
        let service = service.to_owned();
        async move {
            h.check(HealthCheckRequest { service })
                .await
                .unwrap()
                .into_inner()
                .status
        }
    };
    let status = |h: &mut HealthClient<_>| status_of(h, "");
    assert_eq!(status(&mut health).await, ServingStatus::Serving as i32);
    assert_eq!(
        status_of(&mut health, "ratelimit").await,
        ServingStatus::Serving as i32
    );

    let signalled = Instant::now();
    server.signal("TERM");
    while status(&mut health).await != ServingStatus::NotServing as i32 {
        assert!(
            signalled.elapsed() < Duration::from_secs(1),
            "health did not turn NOT_SERVING"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (ready, _) = http(server.admin_addr(), "GET", "/readyz", "").await;
    assert_eq!(ready, 503);
    assert_eq!(
        status_of(&mut health, "ratelimit").await,
        ServingStatus::NotServing as i32
    );
    // Liveness does not follow the drain: a probe must not restart a replica that is leaving.
    assert_eq!(
        status_of(&mut health, "portcullis.liveness").await,
        ServingStatus::Serving as i32
    );
    // Still answering during the drain period.
    let r = rls
        .should_rate_limit(request("m", &[&[("user", "drain")]]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, OK);
    let r = rls
        .should_rate_limit(request("m", &[&[("trial", "drain")]]))
        .await
        .unwrap()
        .into_inner();
    assert_ne!(r.overall_code, OVER);
    // Then it exits 0, within the drain period plus a margin.
    let exit = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            signalled.elapsed() < Duration::from_millis(1500 + 3000),
            "did not exit after draining"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        signalled.elapsed() >= Duration::from_millis(1400),
        "exited before the drain period"
    );
    assert_eq!(exit.code(), Some(0));
}

/// A second SIGTERM (or Ctrl-C) during the drain stops the process at once, exit 130, instead of
/// waiting out the drain period (it waited the whole period).
#[tokio::test]
async fn a_second_signal_during_the_drain_stops_at_once() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("m.yaml"), common::OPERATIONS_RULES).unwrap();
    for signal in ["TERM", "INT"] {
        let mut server = ServeProcess::spawn(dir.path(), &["--drain-period", "30s"], &[], &[]);
        server.signal(signal);
        // The first signal is being drained once /readyz says so.
        let started = Instant::now();
        while http(server.admin_addr(), "GET", "/readyz", "").await.0 != 503 {
            assert!(started.elapsed() < Duration::from_secs(5), "not draining");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let again = Instant::now();
        server.signal(signal);
        let exit = loop {
            if let Some(status) = server.child.try_wait().unwrap() {
                break status;
            }
            assert!(
                again.elapsed() < Duration::from_secs(5),
                "{signal} twice: still draining {:?} after the second",
                again.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert_eq!(exit.code(), Some(130), "{}", server.log());
        assert!(server.log().contains("a second signal"), "{}", server.log());
    }
}

/// A SIGTERM while the start still waits for its first rules over xDS (the server unreachable):
/// the process exits at once, 0, saying so. Before, a signal that came before the handlers were
/// installed (they were, only once the start was done) met its default action: the process died
/// of the signal, and a second signal test was flaky on a busy machine for the same reason.
#[tokio::test]
async fn a_signal_before_the_first_rules_stops_at_once() {
    let admin = common::redis::free_port();
    let xds = common::redis::free_port();
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_portcullis"));
    command
        .args(["serve", "--rules-xds-server", &format!("127.0.0.1:{xds}")])
        .args(["--grpc-addr", "127.0.0.1:0"])
        .args(["--admin-addr", &format!("127.0.0.1:{admin}")])
        .stderr(log.reopen().unwrap());
    let mut child = common::process::Killed(command.spawn().expect("start portcullis"));
    let read_log = || std::fs::read_to_string(log.path()).unwrap_or_default();
    // The waiting listener answers once the start is under way.
    let started = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", admin)).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{}",
            read_log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let sent = std::process::Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .expect("kill");
    assert!(sent.success());
    let signalled = Instant::now();
    let exit = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            signalled.elapsed() < Duration::from_secs(5),
            "still waiting for rules {:?} after SIGTERM",
            signalled.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(exit.code(), Some(0), "{exit}: {}", read_log());
    assert!(read_log().contains("before it served"), "{}", read_log());
}
