//! RLQS streams churned, on Redis (issue 43): 1,100 streams opened, granted and closed on one
//! descriptor of an hour's rule, on one connection or each on a new one, leave at most the
//! connection's (or the address's) bound of standing claims in its holder table, so a gateway at
//! another address gets its part at its first report, and an RLS check on the descriptor costs
//! Redis about what it did before (before the bound: every holder slot taken, the next gateway
//! denied for the hour, each check reading 1,024 records).

use std::time::Duration;

use crate::common::redis::{RedisServer, cli, redis_settings};
use crate::common::rlqs::{
    Gateway, assigned, churn, next_gateway_and_rls_after_folds, reconnects, reports_every_second,
    tokens_per_second,
};
use crate::common::{TestServer, request};

const RULES: &str = "\
domain: edge
descriptors:
  - key: churned
    rate_limit: {unit: hour, requests_per_unit: 3600}
";

/// Redis' µs per script call over `calls` RLS checks on descriptor `churned=value`.
async fn check_cost(server: &TestServer, port: u16, value: &str, calls: usize) -> f64 {
    cli(port, &["CONFIG", "RESETSTAT"]);
    for _ in 0..calls {
        server
            .call(request("edge", &[&[("churned", value)]]))
            .await
            .expect("RLS answers");
    }
    cli(port, &["INFO", "commandstats"])
        .lines()
        .find(|l| l.starts_with("cmdstat_fcall:"))
        .and_then(|l| {
            l.split([':', ','])
                .find_map(|f| f.strip_prefix("usec_per_call="))
                .and_then(|v| v.parse().ok())
        })
        .expect("FCALL's statistics")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_churned_on_one_connection_leave_the_descriptor_to_the_next_gateway() {
    churned(false).await;
}

/// A client that opens a new connection for each stream is bounded by its address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_churned_on_a_connection_each_leave_the_descriptor_to_the_next_gateway() {
    churned(true).await;
}

async fn churned(each: bool) {
    let redis = RedisServer::start();
    let server = TestServer::start_with(&[("edge.yaml", RULES)], |s| {
        redis_settings(s, &redis);
        reports_every_second(s);
    })
    .await;
    // A descriptor as the churned one was before the churn: one gateway holding it.
    let mut control = Gateway::open(&server).await;
    let held: &[(&str, &str)] = &[("churned", "c")];
    control.report("edge", &[(held, 30, 0)]).await.unwrap();
    let id: &[(&str, &str)] = &[("churned", "d")];
    let granted = churn(&server, id, 1_100, 1, each).await;
    assert!(
        granted <= 8,
        "{granted} churned streams were granted a part"
    );
    let records: usize = cli(redis.port, &["KEYS", "*churned=d*:q"])
        .lines()
        .map(|table| {
            cli(redis.port, &["HLEN", table])
                .trim()
                .parse::<usize>()
                .unwrap()
        })
        .sum();
    assert!(records <= 8, "{records} holder records after the churn");
    // Checks on the churned descriptor and on the control, in turns (this machine's pace moves
    // between runs more than between turns).
    let (mut churned, mut as_before) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        churned.push(check_cost(&server, redis.port, "d", 100).await);
        as_before.push(check_cost(&server, redis.port, "c", 100).await);
    }
    let (after, before) = (median(churned), median(as_before));
    eprintln!(
        "an RLS check: {after:.1} us of Redis per script call on the descriptor 1,100 streams \
         churned ({records} holder records), {before:.1} on one held by one gateway"
    );
    assert!(
        after <= 2.0 * before,
        "{after:.1} us per check after the churn, {before:.1} as before it"
    );
    // Its part: half the rate, RLS (the checks above) asking for the other half.
    let mut next = Gateway::open_from(&server, [127, 0, 0, 2].into()).await;
    let actions = next.report("edge", &[(id, 30, 0)]).await.unwrap();
    assert!(
        tokens_per_second(&assigned(&actions[0])) >= 0.5,
        "{}",
        assigned(&actions[0])
    );
    server.stop().await;
}

/// Gateways that reconnect (a connection age, a drain) leave their ended streams' records in
/// the descriptor's holder table only until their last assignments end: their claims are then
/// charged into the rule's counters and the records go (`service::quota::fold`). Before, each
/// stood for the rule's window (an hour here): a long rule's 1,024 holder slots filled with
/// ended streams, and every RLS check read them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnecting_gateways_leave_only_live_streams_in_the_holder_table() {
    let redis = RedisServer::start();
    let server = TestServer::start_with(&[("edge.yaml", RULES)], |s| {
        redis_settings(s, &redis);
        reports_every_second(s);
    })
    .await;
    let admin = server.running.as_ref().unwrap().admin_addr.port();
    let id: &[(&str, &str)] = &[("churned", "r")];
    let granted = reconnects(&server, id, 24).await;
    assert!(granted >= 20, "{granted} of 24 granted a part");
    let records = || {
        cli(redis.port, &["KEYS", "*churned=r*:q"])
            .lines()
            .map(|t| {
                cli(redis.port, &["HLEN", t])
                    .trim()
                    .parse::<usize>()
                    .unwrap()
            })
            .sum::<usize>()
    };
    assert!(
        records() >= granted,
        "the ended streams' records stand at first"
    );
    // Their assignments last 3 s (twice the interval and one), the fold a second more.
    let started = std::time::Instant::now();
    while records() > 0 {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "{} holder records 15 s after the streams ended",
            records()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (_, metrics) = crate::common::http(admin, "GET", "/metrics", "").await;
    assert_eq!(
        crate::common::sample(&metrics, "portcullis_rlqs_folds_total{kind=\"folded\"}"),
        granted as f64,
        "{metrics}"
    );
    // A gateway at another address: its part at its first report; their claims are in the
    // hour's counter now, so what RLS may still take is less by them.
    next_gateway_and_rls_after_folds(&server, id, granted).await;
    server.stop().await;
}
