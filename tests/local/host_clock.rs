//! The memory store keeps ageing right when the host clock steps forward and back (faketime).

use std::time::{Duration, Instant};

use crate::common::process::{LIBFAKETIME, ServeProcess};
use crate::common::request;
use portcullis::pb::rate_limit_response::Code;

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_store_keeps_ageing_after_the_host_clock_steps_forward_and_back() {
    assert!(
        std::path::Path::new(LIBFAKETIME).exists(),
        "libfaketime is missing: apt-get install faketime (scripts/test installs it)"
    );
    let rules = tempfile::tempdir().unwrap();
    std::fs::write(
        rules.path().join("c.yaml"),
        "domain: c\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    )
    .unwrap();
    // The wall clock of the process is read from this file on every reading; the monotonic
    // clock is left alone, as on a host whose NTP steps the wall clock.
    let offset = rules.path().join("..offset");
    std::fs::write(&offset, "+0\n").unwrap();
    let envs = [
        ("LD_PRELOAD", LIBFAKETIME.to_owned()),
        ("FAKETIME_TIMESTAMP_FILE", offset.display().to_string()),
        ("FAKETIME_NO_CACHE", "1".to_owned()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_owned()),
    ];
    let server = ServeProcess::spawn(rules.path(), &[], &envs, &[]);
    let mut client = portcullis::pb::RateLimitServiceClient::connect(server.grpc_url())
        .await
        .unwrap();
    let mut call = async |key: &str| {
        client
            .should_rate_limit(request("c", &[&[("k", key)]]))
            .await
            .unwrap()
            .into_inner()
            .overall_code
    };
    call("probe").await;
    // The host clock jumps an hour ahead and is corrected back.
    std::fs::write(&offset, "+3600s\n").unwrap();
    call("probe").await;
    std::fs::write(&offset, "+0\n").unwrap();
    call("probe").await;
    assert_eq!(call("user").await, OK);
    assert_eq!(call("user").await, OVER);
    // One second later by any honest clock the budget is back; a clock pinned to the highest
    // wall reading seen would keep refusing for the hour.
    let start = Instant::now();
    while call("user").await != OK {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the memory store stopped ageing after the clock stepped back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
