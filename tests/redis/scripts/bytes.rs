//! What keys cost in Redis: a busy sliding-window key within 320 bytes (both layouts sharing
//! one budget), a concurrency key's bytes per slot.

use super::*;

/// A busy sliding-window key (a minute rule with every sub-window live) costs at most 320 bytes
/// in Redis (`MEMORY USAGE`), a third of the hash layout's; a rolling update from 0.1.0 (hash
/// keys) decides exactly on either layout, each key read as it is stored.
#[tokio::test]
async fn a_busy_sliding_window_key_fits_in_320_bytes_and_both_layouts_share_a_budget() {
    let redis = RedisServer::start();
    let minute = Limit {
        algorithm: Algorithm::SlidingWindow,
        requests: 1000,
        window_us: 60_000_000,
        burst: 1000,
    };
    let check = |user: &str| Check {
        key: key::counter_key("mem", [("user", user)], &minute, None),
        limit: minute,
        hits: 1,
        refund: false,
        post_paid: false,
    };
    let mut usage = Vec::new();
    for (layout, prefix) in [(Layout::Packed, "p:"), (Layout::Hash, "h:")] {
        let store = connected_store(Topology::Standalone(redis.url()), prefix)
            .await
            .with_layout(layout);
        let busy = [check("busy")];
        // One hit in each of the 61 sub-windows (a second each): every one live.
        for second in 0..61 {
            let at = FUTURE_US + second * 1_000_000;
            assert!(decide(&store, &busy, ScriptClock::Fixed(at)).await[0].allowed);
        }
        let redis_key = store.redis_key(&busy[0]);
        let bytes: u64 = cli(redis.port, &["MEMORY", "USAGE", &redis_key])
            .parse()
            .unwrap();
        let kind = cli(redis.port, &["TYPE", &redis_key]);
        usage.push((layout, kind, bytes));
    }
    eprintln!("MEMORY USAGE of a busy minute key: {usage:?}");
    let (_, kind, packed) = &usage[0];
    assert_eq!(kind, "string");
    assert!(*packed <= 320, "a busy packed key: {packed} B");
    let (_, kind, hashed) = &usage[1];
    assert_eq!(kind, "hash");
    assert!(*hashed > 2 * *packed, "{usage:?}");

    // The rolling update: a 0.1.0-layout key (a hash) spent by a hash-preferring replica, then
    // by a packed one: one budget, and the key stays a hash until it expires.
    let five = Limit {
        requests: 5,
        burst: 5,
        ..minute
    };
    let shared = [Check {
        key: key::counter_key("mem", [("user", "shared")], &five, None),
        limit: five,
        hits: 3,
        refund: false,
        post_paid: false,
    }];
    let old = connected_store(Topology::Standalone(redis.url()), "r:")
        .await
        .with_layout(Layout::Hash);
    let new = connected_store(Topology::Standalone(redis.url()), "r:").await;
    assert!(decide(&old, &shared, ScriptClock::Fixed(FUTURE_US)).await[0].allowed);
    let on_new = decide(&new, &shared, ScriptClock::Fixed(FUTURE_US + 1)).await;
    assert!(!on_new[0].allowed, "3 + 3 of 5: {on_new:?}");
    assert_eq!(on_new[0].remaining, 2);
    let two = [Check {
        hits: 2,
        ..shared[0].clone()
    }];
    assert!(decide(&new, &two, ScriptClock::Fixed(FUTURE_US + 2)).await[0].allowed);
    assert!(!decide(&old, &two, ScriptClock::Fixed(FUTURE_US + 3)).await[0].allowed);
    assert_eq!(
        cli(redis.port, &["TYPE", &new.redis_key(&shared[0])]),
        "hash"
    );
}

/// A concurrency key costs 8 bytes a slot held past a fixed overhead, and expires with its last
/// lease: 100 slots of a 1000-slot rule, then every one released (the key is gone).
#[tokio::test]
async fn a_concurrency_key_costs_8_bytes_a_slot_and_goes_when_its_slots_do() {
    let redis = RedisServer::start();
    let slots = Limit {
        algorithm: Algorithm::Concurrency,
        requests: 1000,
        window_us: 300_000_000,
        burst: 1000,
    };
    let store = connected_store(Topology::Standalone(redis.url()), "cc:").await;
    let check = |hits: u64, refund: bool| Check {
        key: key::counter_key("mem", [("user", "busy")], &slots, None),
        limit: slots,
        hits,
        refund,
        post_paid: false,
    };
    let redis_key = store.redis_key(&check(1, false));
    let usage = || -> u64 {
        cli(redis.port, &["MEMORY", "USAGE", &redis_key])
            .parse()
            .unwrap()
    };
    assert!(decide(&store, &[check(10, false)], ScriptClock::Fixed(FUTURE_US)).await[0].allowed);
    let ten = usage();
    assert!(
        decide(
            &store,
            &[check(90, false)],
            ScriptClock::Fixed(FUTURE_US + 1)
        )
        .await[0]
            .allowed
    );
    let hundred = usage();
    eprintln!("MEMORY USAGE of a concurrency key: 10 slots {ten} B, 100 slots {hundred} B");
    // Redis rounds allocations up: within 10 bytes a slot, and no more than 200 B besides (the
    // key's name included).
    assert!(hundred - ten <= 90 * 10, "{ten} B, {hundred} B");
    assert!(hundred <= 100 * 8 + 200, "{hundred} B for 100 slots");
    let pttl: u64 = cli(redis.port, &["PTTL", &store.redis_key(&check(1, false))])
        .parse()
        .unwrap();
    assert!(pttl > 0, "every key has a TTL: {pttl}");
    let released = decide(
        &store,
        &[check(100, true)],
        ScriptClock::Fixed(FUTURE_US + 2),
    )
    .await;
    assert_eq!(released[0].remaining, 1000);
    assert_eq!(
        cli(redis.port, &["EXISTS", &store.redis_key(&check(1, false))]),
        "0"
    );
}

/// A sliding-window key met once (a rule keyed by user) costs Redis no more than a fixed
/// window's key met once (issue 47: `MEMORY USAGE`): its short form.
/// It grows into the full form when a second sub-window holds hits beside the first, goes back
/// once only the newest holds any, and decides the same in either form.
#[tokio::test]
async fn a_sliding_window_key_met_once_is_no_larger_than_a_fixed_windows() {
    let redis = RedisServer::start();
    let store = connected_store(Topology::Standalone(redis.url()), "s:").await;
    let limit = |algorithm| Limit {
        algorithm,
        requests: 10,
        window_us: 60_000_000,
        burst: 10,
    };
    let check = |algorithm, hits: u64| Check {
        key: key::counter_key("mem", [("user", "once")], &limit(algorithm), None),
        limit: limit(algorithm),
        hits,
        refund: false,
        post_paid: false,
    };
    let usage = |c: &Check| -> u64 {
        cli(redis.port, &["MEMORY", "USAGE", &store.redis_key(c)])
            .parse()
            .unwrap()
    };
    let sliding = check(Algorithm::SlidingWindow, 1);
    let fixed = check(Algorithm::FixedWindow, 1);
    // Keys as the product names them (the sliding window's name is 2 bytes longer).
    let s_key = store.redis_key(&sliding);
    for c in [&sliding, &fixed] {
        assert!(
            decide(
                &store,
                std::slice::from_ref(c),
                ScriptClock::Fixed(FUTURE_US)
            )
            .await[0]
                .allowed
        );
    }
    let (once, fixed_once) = (usage(&sliding), usage(&fixed));
    eprintln!("MEMORY USAGE met once: sliding {once} B, fixed {fixed_once} B");
    assert!(
        once <= fixed_once,
        "sliding {once} B > fixed {fixed_once} B"
    );
    let strlen = |k: &str| cli(redis.port, &["STRLEN", k]);
    assert_eq!(strlen(&s_key), "11", "the short form");

    // More hits in the same second stay short; a hit a second later, beside them, makes the
    // full form (the first second's hits still live); the sum is one budget throughout.
    let three = Check {
        hits: 3,
        ..sliding.clone()
    };
    let r = decide(
        &store,
        std::slice::from_ref(&three),
        ScriptClock::Fixed(FUTURE_US + 10),
    )
    .await;
    assert_eq!((r[0].allowed, r[0].remaining), (true, 6));
    assert_eq!(strlen(&s_key), "11");
    let r = decide(
        &store,
        std::slice::from_ref(&three),
        ScriptClock::Fixed(FUTURE_US + 1_000_000),
    )
    .await;
    assert_eq!((r[0].allowed, r[0].remaining), (true, 3));
    assert_eq!(strlen(&s_key), (14 + 61 * 2).to_string(), "the full form");
    let four = Check {
        hits: 4,
        ..sliding.clone()
    };
    let r = decide(&store, &[four], ScriptClock::Fixed(FUTURE_US + 2_000_000)).await;
    assert!(!r[0].allowed, "7 + 4 of 10: {r:?}");
    // 61 sub-windows of a second are live: at 61 s the first second's 4 hits have left, the 3
    // of the next second stay (the full form, two sub-windows live).
    let at = FUTURE_US + 61_000_000;
    let r = decide(&store, std::slice::from_ref(&three), ScriptClock::Fixed(at)).await;
    assert_eq!((r[0].allowed, r[0].remaining), (true, 4));
    assert_eq!(strlen(&s_key), (14 + 61 * 2).to_string());
    // Once those have left too, only the newest sub-window holds hits: the short form again.
    let at = FUTURE_US + 122_000_000;
    let r = decide(&store, &[three], ScriptClock::Fixed(at)).await;
    assert_eq!((r[0].allowed, r[0].remaining), (true, 7));
    assert_eq!(strlen(&s_key), "11", "short again");
    let pttl: i64 = cli(redis.port, &["PTTL", &s_key]).parse().unwrap();
    assert!(pttl > 0, "every key has a TTL: {pttl}");
}
