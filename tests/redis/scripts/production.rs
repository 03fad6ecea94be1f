//! The production path: Redis' TIME decides, not the caller's clock; every key has a TTL no
//! longer than its rule, and hostile descriptors never share a key.

use super::*;

#[tokio::test]
async fn the_production_path_reads_redis_time_not_the_callers_clock() {
    let redis = RedisServer::start();
    let store = connected_store(Topology::Standalone(redis.url()), "t:").await;
    let limit = Limit {
        algorithm: Algorithm::FixedWindow,
        requests: 5,
        window_us: 86_400_000_000,
        burst: 5,
    };
    let check = Check {
        key: "{clock}".into(),
        limit,
        hits: 1,
        refund: false,
        post_paid: false,
    };
    use portcullis::store::Store;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    let answers = store
        .check(
            std::slice::from_ref(&check),
            deadline,
            ChargeMode::EachAlone,
        )
        .await;
    answers[0].as_ref().expect("redis answers");
    // The fixed window the script wrote is today's window by Redis' own TIME.
    let time = cli(redis.port, &["TIME"]);
    let redis_secs: u64 = time.lines().next().unwrap().parse().unwrap();
    let stored_window: u64 = cli(redis.port, &["HGET", "t:{clock}", "w"])
        .parse()
        .unwrap();
    assert_eq!(stored_window, redis_secs / 86_400);
}

#[tokio::test]
async fn every_key_has_a_ttl_no_longer_than_its_rule_and_hostile_descriptors_never_share_one() {
    let redis = RedisServer::start();
    let server = TestServer::start_with(&[("h.yaml", common::redis::HOSTILE_RULES)], |s| {
        common::redis::redis_settings(s, &redis);
        // Above the default cap, to show that even a long value keeps its own key.
        s.max_string_bytes = 64 * 1024;
        s.max_message_bytes = 1 << 20;
    })
    .await;
    let long = "x".repeat(64 * 1024);
    let values = [
        "a|b",
        "a",
        "b",
        "}",
        "{x}",
        "x",
        "=",
        "a=b",
        "line\nbreak",
        "%7C",
        "|",
        "",
        &long,
    ];
    for algo in ["sliding", "bucket", "fixed"] {
        for value in values {
            let r = server.ok(request("hostile", &[&[(algo, value)]])).await;
            assert_eq!(
                r.statuses[0].limit_remaining, 0,
                "{algo} {value:?}: a fresh counter of 1"
            );
        }
    }
    // Through a client, not redis-cli: one of the keys holds a newline.
    let mut conn = redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let keys: Vec<Vec<u8>> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
    assert_eq!(
        keys.len(),
        3 * values.len(),
        "one distinct key per descriptor"
    );
    for key in keys {
        let shown = String::from_utf8_lossy(&key[..key.len().min(60)]).into_owned();
        assert!(key.starts_with(b"portcullis:{hostile|"), "{shown}");
        let ttl_ms: i64 = redis::cmd("PTTL").arg(&key).query(&mut conn).unwrap();
        assert!(ttl_ms > 0, "{shown} has no TTL ({ttl_ms})");
        // One hour, plus a tenth for the sliding window's last sub-window.
        assert!(
            ttl_ms <= 3_960_000,
            "{shown}: {ttl_ms} ms is longer than its rule needs"
        );
    }
    server.stop().await;
}
