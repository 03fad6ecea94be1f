//! The cold path's quick functions against the model: a call of one check, each alone, on a key
//! no other check of the script call names is decided at once (`fixed_quick`, `bucket_quick`,
//! `sliding_quick`, `sliding_quick_hash` in lua/), in either layout. The random test in model.rs
//! sends one such call in a hundred; here every step is one, on one key per case, between the
//! calls the held path decides (refunds, post-paid charges) that leave the states the quick path
//! then meets: a refund's newest sub-window with hits behind the state's, sub-windows moved on,
//! a bucket part drawn, a window ended, the clock stepped back.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_of_one_check_decide_like_the_model_in_both_layouts() {
    let redis = RedisServer::start();
    let TwoLayouts {
        packed,
        hashed,
        memory,
        mut conn,
    } = two_layouts(&redis).await;
    let mut rng = Rng(0x0C01_D0C0_FFEE_0047);
    let mut charges = 0;
    let mut made = 0;
    for case in 0..150u64 {
        let algorithm = ALGORITHMS[(case % 3) as usize];
        // Each case's key mostly made and met by one layout's replica, the other's now and then
        // (a rolling update): each reads the other's keys as they are stored.
        let (mostly, now_and_then) = if case / 3 % 2 == 0 {
            (&packed, &hashed)
        } else {
            (&hashed, &packed)
        };
        // A second or a minute: sub-windows of a sixtieth.
        let window_us = WINDOWS_US[rng.below(2) as usize];
        let sub_us = window_us / 60;
        let requests = 1 + rng.below(12);
        let limit = random_limit(&mut rng, algorithm, requests, window_us);
        let key = key::counter_key("quick", [("case", case.to_string().as_str())], &limit, None);
        let mut now = FUTURE_US + rng.below(86_400_000_000);
        for step in 0..40 {
            now = match rng.below(8) {
                // Met again in its sub-window, mostly.
                0..=2 => now + rng.below(sub_us / 4),
                3 => now + sub_us,
                4 => now + rng.below(window_us),
                // Every sub-window gone.
                5 => now + 2 * window_us + rng.below(window_us),
                6 => now.saturating_sub(rng.below(sub_us)),
                _ => now,
            };
            let refund = rng.below(8) == 0;
            let post_paid = !refund && rng.below(8) == 0;
            let check = Check {
                key: key.clone(),
                limit,
                hits: match rng.below(10) {
                    0 => 0,
                    1 => limit.capacity() + 1,
                    _ => 1 + rng.below(limit.capacity().clamp(1, 4)),
                },
                refund,
                post_paid,
            };
            if !refund && !post_paid {
                charges += 1;
            }
            let store = if rng.below(5) == 0 {
                now_and_then
            } else {
                mostly
            };
            let clock = ScriptClock::Fixed(now);
            // Now and then a run of new keys first, through the packed replica: nine in a row
            // bring the windows' quick paths from any state to guessing keys new, so that they
            // make or read them by SET's NX with GET (lua/fixed_window.lua), this case's key
            // next. Each is decided like the model too.
            if rng.below(4) == 0 {
                for i in 0..9 {
                    let at = format!("{case}.{step}.{i}");
                    let fresh = [Check {
                        key: key::counter_key("fresh", [("at", at.as_str())], &limit, None),
                        limit,
                        hits: 1 + rng.below(limit.capacity().clamp(1, 2)),
                        refund: false,
                        post_paid: false,
                    }];
                    let from_redis = decide_in(&packed, &fresh, clock, ChargeMode::EachAlone).await;
                    let from_memory = modelled(&memory, &fresh, now, ChargeMode::EachAlone);
                    assert_eq!(from_redis, from_memory, "new key {at}: {fresh:?}");
                    made += 1;
                }
            }
            let checks = [check];
            let from_redis = decide_in(store, &checks, clock, ChargeMode::EachAlone).await;
            let from_memory = modelled(&memory, &checks, now, ChargeMode::EachAlone);
            let at = format!("case {case} step {step} at {now}: {:?}", checks[0]);
            assert_eq!(from_redis, from_memory, "{at}");
            let seen = super::oracle::Seen {
                check: &checks[0],
                decision: &from_redis[0],
                now,
                at: at.clone(),
            };
            super::oracle::assert_times(&mut conn, seen).await;
            assert_expires_as_the_model(&mut conn, "model:", &memory, &checks[0], now, &at).await;
        }
    }
    // (That the quick functions decided them was shown by defects planted in each, every one
    // failing this test: BENCHMARKS.md, "The cold path, profiled with symbols" and "… the hash
    // layout's sliding window met in a later sub-window".)
    assert!(charges > 4000, "{charges} charges of one check");
    assert!(made > 10_000, "{made} new keys");
}
