//! The one budget on a sliding window, modelled as `claims_model` models the fixed one: the
//! counter an exact log of admissions, checked over every sliding window of the run.

use proptest::prelude::*;

use super::model::{Gateway, S, Shares, carried_at, end_stream, limit};
use super::*;
use crate::algorithm::share;

/// The same design on a sliding window, its counter an exact log of admissions: RLS admits when
/// the last W's hits and every claim of the holders `share::report` keeps leave room; a report
/// charges what the gateway admitted, at most its claim since its last report, and is granted
/// by `share::report` within the last W's room as the store reads it (the charge given back:
/// `service::quota::charge`). Returns, for each
/// admission, (admitted in the W ending there, the limit plus the fills of assignments made in
/// it and one carried in per gateway).
fn run_sliding(
    window_s: u64,
    requests: u64,
    gateways: usize,
    steps: &[(u8, u8, u32)],
) -> Vec<(u64, u64)> {
    let l = limit(Algorithm::SlidingWindow, requests, window_s);
    let w = l.window_us;
    let rate = l.per_second();
    let ttl = 11 * S;
    let mut gw: Vec<Gateway> = vec![Gateway::idle(); gateways];
    let mut shares = Shares::default();
    // The counter: (time, hits) charged; every admission's time; every assignment's (time, fill).
    let mut counter: Vec<(u64, u64)> = Vec::new();
    let mut admissions: Vec<u64> = Vec::new();
    let mut fills: Vec<(u64, u64)> = Vec::new();
    let mut history: Vec<Vec<(u64, u64)>> = vec![Vec::new(); gateways];
    let mut ended: Vec<Claim> = Vec::new();
    let in_window = |log: &[(u64, u64)], now: u64| -> u64 {
        log.iter()
            .filter(|(t, _)| *t + w > now)
            .map(|(_, n)| n)
            .sum()
    };
    let mut now = w;
    for &(what, who, advance_ms) in steps {
        now += u64::from(advance_ms) * (w / 40_000).min(1000);
        let g = usize::from(who) % gateways;
        if what % 5 == 4 {
            end_stream(&mut gw[g], &mut ended);
            shares.stream_ended(g, now);
            continue;
        }
        match what % 5 {
            0 | 1 => {
                shares.rls_asks(rate, now);
                for _ in 0..=who {
                    let left = less(&l, claimed(&shares.claims(now), &l, now));
                    if in_window(&counter, now) < left.requests {
                        counter.push((now, 1));
                        admissions.push(now);
                    }
                }
            }
            2 => {
                let admitted = gw[g].admit_all(now);
                admissions.extend(std::iter::repeat_n(now, admitted));
            }
            _ => {
                let charge = gw[g].report_charge(&l, now);
                if charge > 0 {
                    counter.push((now, charge));
                }
                let ends = now + ttl;
                // The look: the limit less the last W's count, signed (`share::report` takes
                // the claims off and the charge in so far as it leaves: `share::sliding_room`).
                let room = share::Room {
                    limit: l,
                    left: l.requests as i64 - in_window(&counter, now) as i64,
                    charged: charge,
                    span_us: (ends - now).min(w),
                };
                let charged = gw[g].charged();
                let granted = shares.report(g, &l, vec![room], charged, ttl, now);
                if let Some(fill) = gw[g].assign_tokens(granted, w, now, ends) {
                    fills.push((now, fill));
                    history[g].push((now, fill));
                }
            }
        }
    }
    admissions
        .iter()
        .map(|&t| {
            let admitted = admissions.iter().filter(|&&a| a + w > t && a <= t).count() as u64;
            let allowance: u64 = fills
                .iter()
                .filter(|(f, _)| *f + w > t && *f <= t)
                .map(|(_, n)| n)
                .sum();
            (
                admitted,
                requests + allowance + carried_at(&history, t.saturating_sub(w)),
            )
        })
        .collect()
}

proptest! {
    /// The same bound over every sliding window: second, minute, hour and day.
    #[test]
    fn rls_and_gateways_together_stay_within_every_sliding_window(
        unit in 0usize..4,
        requests in 1u64..200,
        gateways in 1usize..4,
        steps in proptest::collection::vec((0u8..8, 0u8..4, 0u32..2_000), 1..300),
    ) {
        let window_s = [1, 60, 3600, 86_400][unit];
        for (admitted, allowance) in run_sliding(window_s, requests, gateways, &steps) {
            prop_assert!(admitted <= allowance, "{admitted} > {allowance}");
        }
    }
}
