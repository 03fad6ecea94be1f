//! What a report is granted within its windows' room: a fixed window's spread over the rest of
//! the window on the store's clock, and read signed once the count and the others' claims pass
//! the limit. Split from shares.rs.

use super::*;

/// A fixed window's room is spread over what is left of the window on the store's clock, never
/// this host's: a gateway reporting into a second RLS half spent is granted what the rest of that
/// second holds (5 a second over the whole second the store has left), whatever this host's
/// clock says of the second. Before, the window's end was taken from the host clock: with the
/// host half-way through its second (the store at its start), the 5 left were granted over half
/// a second, 10 a second, and the gateway could admit 10 more in a second RLS had spent half of.
#[tokio::test]
async fn a_fixed_windows_room_is_spread_over_the_rest_of_the_window_on_the_stores_clock() {
    const RULE: &str = "\
domain: edge
descriptors:
  - key: fixed
    rate_limit: {unit: second, requests_per_unit: 10, algorithm: fixed_window}
";
    let server = TestServer::start_with(&[("edge.yaml", RULE)], |s| {
        s.rlqs.rlqs = true;
        s.rlqs.rlqs_reporting_interval = Duration::from_secs(1);
        s.rlqs.rlqs_push_interval = Duration::ZERO;
    })
    .await;
    // The store's clock is at the start of a second (the test server's clock does not move).
    assert_eq!(
        portcullis::clock::Clock::now_us(&server.clock) % 1_000_000,
        0
    );
    for _ in 0..5 {
        let r = server
            .call(common::request("edge", &[&[("fixed", "a")]]))
            .await
            .unwrap();
        assert_eq!(r.overall_code, 1, "RLS spends 5 of the second's 10");
    }
    // This host's clock half-way through its own second.
    let phase = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_micros()
    };
    let wait = (1_500_000 - phase()) % 1_000_000;
    tokio::time::sleep(Duration::from_micros(u64::from(wait))).await;
    let mut gateway = Gateway::open(&server).await;
    let actions = gateway
        .report("edge", &[(&[("fixed", "a")], 30, 0)])
        .await
        .unwrap();
    assert_eq!(
        tokens_per_second(&assigned(&actions[0])),
        5.0,
        "{}",
        assigned(&actions[0])
    );
    server.stop().await;
}

/// On a fixed window, a report is granted what the window holds once its count and the other
/// gateways' claims are off, read signed (issue 43): two gateways hold 5/s each of a second's
/// 10; by mid-second one has admitted 3, so it gets the 2 left beside the other's 5 over the
/// half second left: 4/s. (The room read stopped at zero with its own claim given back on top
/// granted it its fair 5/s: 3 + 2.5 + 5, past the 10.)
#[tokio::test]
async fn a_fixed_window_past_its_limit_with_the_claims_grants_only_what_it_holds() {
    let server = server().await;
    let mut one = Gateway::open(&server).await;
    let mut two = Gateway::open(&server).await;
    let plan: &[(&str, &str)] = &[("plan", "fixed")];
    let rate = |actions: Vec<BucketAction>| tokens_per_second(&assigned(&actions[0]));
    // At the second's start: one alone gets the whole rate; two gets nothing while one holds
    // it all; one's next report leaves two half, which two gets at its next.
    assert_eq!(
        rate(one.report("edge", &[(plan, 30, 0)]).await.unwrap()),
        10.0
    );
    for _ in 0..2 {
        assert_eq!(
            assigned(&two.report("edge", &[(plan, 30, 0)]).await.unwrap()[0]),
            "deny_all ttl 3s"
        );
    }
    assert_eq!(
        rate(one.report("edge", &[(plan, 0, 30)]).await.unwrap()),
        5.0
    );
    assert_eq!(
        rate(two.report("edge", &[(plan, 0, 30)]).await.unwrap()),
        5.0
    );
    // Half a second on, one has admitted 3: charged, 7 left in the window, 5 of them two's.
    server.clock.advance_us(500_000);
    assert_eq!(
        rate(one.report("edge", &[(plan, 3, 27)]).await.unwrap()),
        4.0
    );
    server.stop().await;
}
