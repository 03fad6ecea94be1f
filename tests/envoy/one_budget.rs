//! RLQS and RLS on one budget through real Envoys (1.40): a gateway on the rate_limit_quota
//! filter and one on the ratelimit filter, each on its own replica of one Redis, share a rule's
//! budget on every algorithm (a sliding, a fixed second, a token bucket) and over every 60 s of
//! a minute's rule.

use std::time::{Duration, Instant};

use crate::common::envoy_quota::{Beside, admitted_in, offer};

/// RLS and RLQS on one descriptor: a gateway enforcing locally (RLQS, replica one) and a gateway
/// calling per request (the ratelimit filter, replica two), both on one Redis, both offered three
/// times the rate. The second's calls count what the first's grant claims, the first's reports
/// charge what it admitted, and the second's demand shrinks the first's share: together within
/// the rate and one bucket, each a fair part.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_on_rlqs_and_one_on_rls_share_one_budget() {
    rlqs_and_rls_share("shared", "a sliding second").await;
}

/// The same on a fixed window and on a token bucket (each 10 a second).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_on_rlqs_and_one_on_rls_share_a_fixed_window_and_a_token_bucket() {
    rlqs_and_rls_share("fixed", "a fixed second").await;
    rlqs_and_rls_share("bucket", "a token bucket").await;
}

async fn rlqs_and_rls_share(tenant: &str, rule: &str) {
    let side = Beside::start();
    side.settled().await;
    let (a, b, local, per_call) = (&side.a, &side.b, &side.local, &side.per_call);

    let run = Duration::from_secs(20);
    let (answers_a, answers_b) = tokio::join!(offer(a, tenant, 30, run), offer(b, tenant, 30, run));
    // Settled after two report rounds: from 12 s to 20 s.
    let (from, to) = (Duration::from_secs(12), run);
    let (got_a, sent_a) = admitted_in(&answers_a, from, to);
    let (got_b, sent_b) = admitted_in(&answers_b, from, to);
    let seconds = (to - from).as_secs_f64();
    eprintln!(
        "RLQS gateway + RLS gateway on one Redis, both offered 30/s against 10/s ({rule}) for {seconds} s: {got_a} + {got_b} admitted of {sent_a} + {sent_b}"
    );
    // docs/envoy.md's bound: the rate over the span, plus the bucket the gateway carries into
    // it and one per change of its assignment. Its bucket holds a tenth of its part of the
    // second (at most 1 token of its 5 or 10 a second), two tokens at least: 2; its assignment
    // changes at its reports, every 5 s, at most twice in these 8 s. So 80 + 2 * 3 = 86 (the
    // bound a second's bucket would need, 80 + 10 * 3, fails here).
    let bucket = 2;
    let most = (10.0 * seconds) as usize + bucket * 3;
    assert!(
        got_a + got_b <= most,
        "{rule}: {got_a} + {got_b} > {most}\n{}\n{}",
        local.log(),
        per_call.log()
    );
    // Neither starved: each side at least four fifths of its fair half (a side starved to 25
    // of 40, as RLS was with a second's bucket on a sliding second, fails), and together
    // within a sixth of the rate (both sides offered three times it).
    let fair = (10.0 * seconds / 2.0 * 0.8) as usize;
    assert!(
        got_a >= fair && got_b >= fair,
        "{rule}: {got_a} (RLQS) and {got_b} (RLS): each at least {fair}"
    );
    let least = (10.0 * seconds * 5.0 / 6.0) as usize;
    assert!(
        got_a + got_b >= least,
        "{rule}: {got_a} + {got_b} < {least}: the rule under-admitted"
    );
}

/// Issue 29's one budget, on a minute, over every 60 s: a gateway on RLQS offered 10/s for 30 s
/// on a 120/minute rule (sliding), then RLS calls through a second replica at 10/s for 30 s,
/// then the gateway again for 30 s (its grant must wait for the minute's room as the first
/// part's admissions leave it). Over every 60 s of the run the two together admit at most the
/// rule's 120 and a bucketful of the gateway's (2 a second, a bucket of 2) per assignment
/// change. Before: 182 within the first minute (what the gateway admitted never reached the
/// counters, so RLS found the minute unspent when the grant ended).
///
/// Why 90 s of real time: Envoy refills its RLQS token buckets and sends its reports (every 5 s)
/// on its own clock, which no test clock can move, and the bound is over every 60 s, so the run
/// must span a minute and what leaves it: the third part is the one that shows the gateway's
/// grant waiting for the first part's admissions to leave the minute. A minute is the shortest
/// window a rule has above a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rls_and_rlqs_on_one_minute_rule_stay_within_it() {
    let side = Beside::start();
    side.settled().await;
    let (a, b, local, per_call) = (&side.a, &side.b, &side.local, &side.per_call);
    let half = Duration::from_secs(30);
    let origin = Instant::now();
    // Each part's admissions, timed from the run's start.
    let mut parts = Vec::new();
    for g in [a, b, a] {
        let started = origin.elapsed();
        let answers = offer(g, "per-minute", 10, half).await;
        let admitted: Vec<Duration> = answers
            .iter()
            .filter(|(_, s)| *s == 200)
            .map(|(t, _)| started + *t)
            .collect();
        parts.push(admitted);
    }
    let counts: Vec<usize> = parts.iter().map(Vec::len).collect();
    eprintln!(
        "a 120/minute rule: {} through RLQS, then {} through RLS, then {} through RLQS",
        counts[0], counts[1], counts[2]
    );
    let all: Vec<Duration> = parts.concat();
    let minute = Duration::from_secs(60);
    let busiest = all
        .iter()
        .map(|&end| {
            all.iter()
                .filter(|&&t| t <= end && t + minute > end)
                .count()
        })
        .max()
        .unwrap_or(0);
    eprintln!("the busiest 60 s admitted {busiest}");
    assert!(
        busiest <= 126,
        "{busiest} admitted within 60 s > 120 and three buckets ({counts:?})\n{}\n{}",
        local.log(),
        per_call.log()
    );
    assert!(
        counts[0] >= 40,
        "the RLQS gateway admitted {} in 30 s of 2/s",
        counts[0]
    );
    // Once the first part's admissions leave the minute, the gateway has its rate back.
    assert!(
        counts[2] >= 16,
        "the RLQS gateway admitted {} in its second 30 s",
        counts[2]
    );
}

/// Issue 43 item 1 through Envoy: the RLQS replica closes the gateway's connection every 4 s
/// (`--grpc-max-connection-age`), so its stream ends and Envoy opens another, admitting on its
/// last assignment meanwhile, while a gateway on RLS beside it asks three times the rate of a
/// sliding second. docs/envoy.md's bound holds through each stream's end as in steady state:
/// within any second the rate (10), the bucket the gateway carries in (2) and one per change of
/// its assignment (at most two in a second here: a report and a new stream's first); over the
/// settled span 12-20 s the rate, the bucket and one per change (its reports every 5 s, its
/// streams every 4 s: at most four). Before (a stream's end freed its claim at once), RLS was
/// given the gateway's part while the gateway still admitted it: 15 a second. Unnamed and
/// named (docs/envoy.md's `initial_metadata`). What RLS gets beside it is printed, not
/// asserted: a connection age shorter than Envoy's report interval is a stress where the
/// gateway's ended streams' claims (an unnamed one's stand for their assignment's 11 s) leave
/// RLS less than its fair part, by how the ages fall between the reports (0 to 35 of 40
/// measured; docs/envoy.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_whose_connection_ages_out_beside_rls_stays_within_every_second() {
    for name in [None, Some("gateway-a")] {
        connection_ages_out_beside_rls(name).await;
    }
}

/// One run of the above (gateway `a` named `name`).
async fn connection_ages_out_beside_rls(name: Option<&str>) {
    let side = Beside::start_with(
        &[
            "--grpc-max-connection-age",
            "4s",
            "--grpc-max-connection-age-grace",
            "1s",
        ],
        name,
    );
    side.settled().await;
    let (a, b, local, per_call) = (&side.a, &side.b, &side.local, &side.per_call);
    let run = Duration::from_secs(20);
    let (answers_a, answers_b) =
        tokio::join!(offer(a, "shared", 30, run), offer(b, "shared", 30, run));
    let admitted: Vec<Duration> = answers_a
        .iter()
        .chain(&answers_b)
        .filter(|(_, s)| *s == 200)
        .map(|(t, _)| *t)
        .collect();
    // Every second from the first grant on (reports every 5 s), in steps of 100 ms.
    let busiest = (60..190)
        .map(|tenth| {
            let from = Duration::from_millis(tenth * 100);
            let to = from + Duration::from_secs(1);
            admitted.iter().filter(|t| **t >= from && **t < to).count()
        })
        .max()
        .unwrap();
    let (from, to) = (Duration::from_secs(12), run);
    let (got_a, _) = admitted_in(&answers_a, from, to);
    let (got_b, _) = admitted_in(&answers_b, from, to);
    eprintln!(
        "RLQS gateway (named: {name:?}; its connection closed every 4 s) + RLS gateway, both \
         offered 30/s on a sliding 10/s: the busiest second {busiest}; 12-20 s: {got_a} + {got_b}"
    );
    assert!(
        busiest <= 10 + 2 + 2 * 2,
        "{busiest} in one second\n{}\n{}",
        local.log(),
        per_call.log()
    );
    assert!(
        got_a + got_b <= 80 + 2 + 2 * 4,
        "{got_a} + {got_b} in 8 s\n{}\n{}",
        local.log(),
        per_call.log()
    );
}
