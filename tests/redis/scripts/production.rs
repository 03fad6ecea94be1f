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
    // The string layout (the store's default): the window index, then the count, each 8 bytes.
    let mut conn = plain_connection(redis.port).await;
    let raw: Vec<u8> = redis::cmd("GET")
        .arg("t:{clock}")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(raw.len(), 16, "{raw:?}");
    let stored_window = u64::from_be_bytes(raw[..8].try_into().unwrap());
    assert_eq!(stored_window, redis_secs / 86_400);
}

#[tokio::test]
async fn every_key_lives_as_long_as_its_rule_needs_and_hostile_descriptors_never_share_one() {
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
    let redis_ms = || -> u64 {
        let time = cli(redis.port, &["TIME"]);
        let mut parts = time.lines().map(|l| l.trim().parse::<u64>().unwrap());
        parts.next().unwrap() * 1000 + parts.next().unwrap() / 1000
    };
    let before = redis_ms();
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
    let after = redis_ms();
    const HOUR: u64 = 3_600_000;
    for key in keys {
        let shown = String::from_utf8_lossy(&key[..key.len().min(60)]).into_owned();
        assert!(key.starts_with(b"portcullis:{hostile|"), "{shown}");
        let at: i64 = redis::cmd("PEXPIRETIME")
            .arg(&key)
            .query(&mut conn)
            .unwrap();
        assert!(at > 0, "{shown} has no TTL ({at})");
        let at = at as u64;
        // Each holds one hit of an hour's rule, written between `before` and `after` (Redis'
        // clock, ms): it must outlive what the hit counts in (an earlier end hands the hour
        // out again) and no longer than the rule needs.
        let (least, most) = match () {
            // Forgotten 1 to 1 + 1/60 hours after the hit (a minute's sub-window).
            _ if key.windows(6).any(|w| w == b":sw60:") => (before + HOUR, after + HOUR + 60_000),
            // Full again an hour after the hit (GCRA's TAT), to the millisecond up.
            _ if key.windows(4).any(|w| w == b":tb:") => (before + HOUR, after + HOUR + 1),
            // Its hour's end (the test stays within one hour, or the two bounds are its ends).
            _ => (
                before.div_ceil(HOUR) * HOUR,
                after.div_ceil(HOUR) * HOUR + 1,
            ),
        };
        assert!(
            (least..=most).contains(&at),
            "{shown}: expires at {at} ms, not within {least}..={most}"
        );
    }
    server.stop().await;
}
