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
    for (layout, prefix) in [(SlidingLayout::Packed, "p:"), (SlidingLayout::Hash, "h:")] {
        let store = connected_store(Topology::Standalone(redis.url()), prefix)
            .await
            .with_sliding_layout(layout);
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
        .with_sliding_layout(SlidingLayout::Hash);
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
