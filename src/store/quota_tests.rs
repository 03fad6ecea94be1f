use super::*;
use crate::clock::ManualClock;

fn ask(key: &str, gateway: u64, demand: f64) -> Ask {
    Ask {
        key: key.into(),
        capacity: 10.0,
        gateway,
        demand,
        ttl_us: 3_000_000,
        kind: AskKind::Grant,
        charged: true,
        window_us: 60_000_000,
        shortest_us: 60_000_000,
        rooms: Vec::new(),
        counters: Vec::new(),
    }
}

#[tokio::test]
async fn a_full_table_refuses_new_rules_until_grants_expire() {
    let clock = ManualClock::new(1_000_000);
    let quota = MemoryQuota::with_max_keys(Arc::new(clock.clone()), 2);
    let far = Instant::now() + std::time::Duration::from_secs(1);
    let asks = [ask("a", 1, 5.0), ask("b", 1, 5.0), ask("c", 1, 5.0)];
    let grants = quota.grant(&asks, far).await;
    assert!(grants[0].as_ref().unwrap().is_some());
    assert!(grants[1].as_ref().unwrap().is_some());
    assert!(
        matches!(grants[2], Err(StoreError::Unavailable(_))),
        "{grants:?}"
    );
    // Once a and b have expired, and their claims a window later, c gets its place.
    clock.advance_us(3_000_001);
    assert!(matches!(
        quota.grant(&asks[2..], far).await[0],
        Err(StoreError::Unavailable(_))
    ));
    clock.advance_us(60_000_000);
    let grants = quota.grant(&asks[2..], far).await;
    assert_eq!(grants[0].as_ref().unwrap().unwrap().per_second(), 10.0);
    assert!(quota.holders("a").is_empty());
}

#[tokio::test]
async fn a_grant_claims_its_span_in_each_window_until_charged_and_after_its_end() {
    let clock = ManualClock::new(100_000_000);
    let quota = MemoryQuota::new(Arc::new(clock.clone()));
    let far = Instant::now() + std::time::Duration::from_secs(1);
    let second = "{edge|tenant=a}:fw:1000000us";
    let minute_limit = Limit {
        algorithm: crate::algorithm::Algorithm::FixedWindow,
        requests: 600,
        window_us: 60_000_000,
        burst: 600,
    };
    let second_limit = Limit {
        requests: 10,
        window_us: 1_000_000,
        burst: 10,
        ..minute_limit
    };
    assert_eq!(quota.claimed(second, &second_limit, 100_000_000), None);
    // 10/s for 3 s from 100 s: the second [100, 101) holds 10 of it, the minute [60, 120)
    // all 30.
    let grants = quota.grant(&[ask("{edge|tenant=a}", 1, 30.0)], far).await;
    assert_eq!(grants[0].as_ref().unwrap().unwrap().per_second(), 10.0);
    assert_eq!(quota.claimed(second, &second_limit, 100_000_000), Some(10));
    assert_eq!(quota.claimed(second, &minute_limit, 100_000_000), Some(30));
    let other = "{edge|tenant=b}:fw:1000000us";
    assert_eq!(quota.claimed(other, &second_limit, 100_000_000), None);
    // RLS demand claims nothing.
    let rls = Ask {
        kind: AskKind::Demand,
        ..ask("{edge|tenant=a}", 7, 5.0)
    };
    assert_eq!(quota.grant(&[rls], far).await[0], Ok(None));
    assert_eq!(quota.claimed(second, &minute_limit, 100_000_000), Some(30));
    // A charged report 2 s on: the claim starts again, at the part RLS' demand leaves it
    // (5/s for 3 s from 102 s: 15).
    clock.advance_us(2_000_000);
    quota.grant(&[ask("{edge|tenant=a}", 1, 30.0)], far).await;
    assert_eq!(quota.claimed(second, &minute_limit, 102_000_000), Some(15));
    // Its stream ends at 103 s: Envoy admits on its assignment until that ends (105 s), so
    // the claim stays whole: [102, 105) at 5/s in the minute, and the second [104, 105) holds
    // 5 of it; [105, 106) none. (Ending the claim at the release gave the second [104, 105)
    // back to RLS while the gateway still admitted there.)
    clock.advance_us(1_000_000);
    let release = Ask {
        kind: AskKind::StreamEnded,
        ..ask("{edge|tenant=a}", 1, 0.0)
    };
    quota.grant(&[release], far).await;
    assert_eq!(quota.claimed(second, &minute_limit, 103_000_000), Some(15));
    assert_eq!(quota.claimed(second, &second_limit, 104_000_000), Some(5));
    assert_eq!(quota.claimed(second, &second_limit, 105_000_000), Some(0));
    // Its share is free: another gateway's fair share no longer counts its grant (the room
    // its windows leave still does: `share::most`).
    let holders = quota.holders("{edge|tenant=a}");
    let gone = holders.iter().find(|h| h.gateway == 1).unwrap();
    assert_eq!(
        (gone.demand, gone.granted, gone.expires_us),
        (0.0, 0.0, 105_000_000)
    );
    // An uncharged report keeps the claim's start, at the highest rate since (RLS' demand
    // has expired: 10/s from 102 s to 106 s).
    quota
        .grant(
            &[Ask {
                charged: false,
                ..ask("{edge|tenant=a}", 1, 30.0)
            }],
            far,
        )
        .await;
    assert_eq!(quota.claimed(second, &minute_limit, 103_000_000), Some(40));
    // Kept a window past its end, then forgotten.
    clock.advance_us(61_000_000);
    quota.grant(&[ask("{edge|tenant=c}", 1, 1.0)], far).await;
    assert_eq!(quota.claimed(second, &minute_limit, 164_000_000), Some(0));
}

/// One step (issue 43 item 4): a report's look found 10 of a minute's 10 left, RLS then counted
/// 9 there; the grant reads the window again with its counter held and fits in the 1 left
/// (before: granted as if 10 were, 0.9/s, the window handed out twice). As Redis' quota script
/// does (tests/redis/rlqs_one_step.rs).
#[tokio::test]
async fn a_grant_reads_its_windows_again_in_its_own_step() {
    use crate::algorithm::{Algorithm, Check, Limit, share::Room};
    // 5 s into a minute: a fixed minute holds the grant's whole 11 s.
    let now = 1_000 * 60_000_000 + 5_000_000;
    let clock = Arc::new(ManualClock::new(now));
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
        let quota = Arc::new(MemoryQuota::new(clock.clone()));
        let store = super::super::MemoryStore::new(clock.clone());
        store.count_claims(MemoryClaims {
            quota: quota.clone(),
            tally: Arc::new(RlsTally::default()),
        });
        quota.read_windows_from(&store);
        let limit = Limit {
            algorithm,
            requests: 10,
            window_us: 60_000_000,
            burst: 10,
        };
        let counter = "{step}:c".to_owned();
        let rls = Check {
            key: counter.clone(),
            limit,
            hits: 9,
            refund: false,
            post_paid: false,
        };
        assert!(store.check_at(&rls, now).unwrap().allowed);
        let mut report = ask("{step}", 7, 100.0);
        report.ttl_us = 11_000_000;
        report.rooms = vec![Room {
            limit,
            left: 10,
            charged: 0,
            span_us: 11_000_000,
        }];
        report.counters = vec![counter];
        let far = Instant::now() + std::time::Duration::from_secs(1);
        let granted = quota.grant(&[report], far).await.remove(0).unwrap();
        assert_eq!(
            granted.map(|t| t.per_second()),
            share::quantize(1.0 / 11.0).map(|t| t.per_second()),
            "{algorithm:?}"
        );
    }
}
