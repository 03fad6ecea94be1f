//! A gateway's hold on one counter: the buckets of one stream that meet one descriptor (a
//! `share_threshold` rule, or several bucket ids resolving to one descriptor) are one holder in
//! the quota store, asking for their demand together; the share granted is split among them by
//! demand (max-min fair), each part rounded down. It must never let a stream's buckets on one
//! counter hold more, together, than the one share granted to the stream.

use super::report::{BucketKey, Buckets};
use crate::algorithm::share::{Tokens, fair_shares, quantize};
use crate::store::quota::Ask;

/// Who shares a hold: a bucket of this report (its place in the report), or a bucket of the
/// stream that this report does not name (it keeps its last demand and may be sent a new part).
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Member {
    Reported(usize),
    Quiet(BucketKey),
}

/// One holder's ask and the buckets sharing it, each with its demand (requests per second).
#[derive(Debug)]
pub(super) struct Hold {
    pub ask: Ask,
    pub members: Vec<(Member, f64)>,
    /// Not granted: this replica's streams hold as many of its descriptor's holder slots as
    /// one replica may, or (`churned`) its connection, or its address with streams that ended
    /// quickly, has left as many ended streams' claims standing there as one connection may
    /// (its admissions are charged all the same).
    pub refused: bool,
    pub churned: bool,
}

/// The holds of one report: one per descriptor its buckets meet (`asks[i]` is the ask of
/// reported bucket `i`, if limited), each joined by the stream's other buckets on it.
pub(super) fn holds(asks: &[Option<(Ask, &BucketKey)>], buckets: &Buckets) -> Vec<Hold> {
    // Found by descriptor through a map: a report of 10,000 descriptors searched the list for
    // each, 0.65 s of a debug build's report (a tenth of that in release) before Redis was asked.
    let mut holds: Vec<Hold> = Vec::new();
    let mut by_key: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for (i, planned) in asks.iter().enumerate() {
        let Some((ask, _)) = planned else { continue };
        match by_key.get(&ask.key) {
            Some(&at) => {
                let hold = &mut holds[at];
                hold.ask.demand += ask.demand;
                hold.members.push((Member::Reported(i), ask.demand));
            }
            None => {
                by_key.insert(ask.key.clone(), holds.len());
                holds.push(Hold {
                    ask: ask.clone(),
                    members: vec![(Member::Reported(i), ask.demand)],
                    refused: false,
                    churned: false,
                });
            }
        }
    }
    if holds.is_empty() {
        return holds;
    }
    let reported: std::collections::HashSet<&BucketKey> =
        asks.iter().flatten().map(|(_, key)| *key).collect();
    for (key, bucket) in buckets {
        let Some(counter) = &bucket.counter else {
            continue;
        };
        if reported.contains(key) {
            continue;
        }
        if let Some(&at) = by_key.get(counter) {
            let hold = &mut holds[at];
            hold.ask.demand += bucket.demand;
            hold.members
                .push((Member::Quiet(key.clone()), bucket.demand));
        }
    }
    holds
}

/// `grant` split among buckets of `demands`: max-min fair by demand (capacity nobody asks for
/// split equally), each part rounded down to what Envoy enforces, then the whole tokens a second
/// that rounding left over handed out one each, busiest first; never more than `grant` in all.
pub(super) fn split(grant: Option<Tokens>, demands: &[f64]) -> Vec<Option<Tokens>> {
    let Some(grant) = grant else {
        return vec![None; demands.len()];
    };
    if demands.len() == 1 {
        return vec![Some(grant)];
    }
    let mut parts: Vec<Option<Tokens>> = fair_shares(grant.per_second(), demands)
        .into_iter()
        .map(quantize)
        .collect();
    let given: f64 = parts.iter().flatten().map(|t| t.per_second()).sum();
    let mut left = (grant.per_second() - given + 1e-9).floor() as u64;
    let mut order: Vec<usize> = (0..parts.len()).collect();
    order.sort_by(|a, b| demands[*b].total_cmp(&demands[*a]));
    for i in order {
        if left == 0 {
            break;
        }
        // Only a part of whole tokens a second (or none) grows by one exactly.
        let grown = match parts[i] {
            None => Tokens {
                per_fill: 1,
                every_s: 1,
            },
            Some(t) if t.every_s == 1 => Tokens {
                per_fill: t.per_fill + 1,
                every_s: 1,
            },
            Some(_) => continue,
        };
        let before = parts[i].map_or(0.0, Tokens::per_second);
        if grown.per_second() - before <= 1.0 + 1e-9 {
            parts[i] = Some(grown);
            left -= 1;
        }
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::quota::report::BucketState;
    use crate::store::quota::AskKind;

    fn ask(key: &str, demand: f64) -> Ask {
        Ask {
            key: key.into(),
            capacity: 20.0,
            gateway: 1,
            demand,
            ttl_us: 1,
            kind: AskKind::Grant,
            charged: true,
            window_us: 1_000_000,
            shortest_us: 1_000_000,
            rooms: Vec::new(),
            counters: Vec::new(),
        }
    }

    fn bucket(path: &str) -> BucketKey {
        vec![("path".into(), path.into())]
    }

    #[test]
    fn buckets_on_one_counter_are_one_holder_with_their_demand_summed() {
        let (a, b, c, quiet) = (bucket("/a"), bucket("/b"), bucket("/c"), bucket("/d"));
        let mut buckets = Buckets::new();
        buckets.insert(
            quiet.clone(),
            BucketState {
                counter: Some("{edge|path=*}".into()),
                demand: 5.0,
                ..BucketState::default()
            },
        );
        let asks = [
            Some((ask("{edge|path=*}", 30.0), &a)),
            None,
            Some((ask("{edge|path=*}", 10.0), &b)),
            Some((ask("{edge|tenant=x}", 1.0), &c)),
        ];
        let holds = holds(&asks, &buckets);
        assert_eq!(holds.len(), 2);
        assert_eq!(holds[0].ask.demand, 45.0);
        assert_eq!(
            holds[0].members,
            [
                (Member::Reported(0), 30.0),
                (Member::Reported(2), 10.0),
                (Member::Quiet(quiet), 5.0)
            ]
        );
        assert_eq!(holds[1].members, [(Member::Reported(3), 1.0)]);
    }

    #[test]
    fn a_share_is_split_by_demand_and_never_exceeded() {
        let t = |per_fill, every_s| Some(Tokens { per_fill, every_s });
        // 20/s among 30 and 30 asked: 10 each.
        assert_eq!(split(t(20, 1), &[30.0, 30.0]), [t(10, 1), t(10, 1)]);
        // A small demand gets what it asks; the rest goes to the busy one.
        assert_eq!(split(t(20, 1), &[2.0, 50.0]), [t(2, 1), t(18, 1)]);
        // 7/s in three: 140 a minute each, 7/s in all.
        let parts = split(t(7, 1), &[9.0, 9.0, 9.0]);
        assert_eq!(parts, [t(140, 60), t(140, 60), t(140, 60)]);
        // Rounded down, the whole token a second left over handed out: 7/s in 9 parts of
        // 0.77/s is 46 a minute each (6.9/s), then one more a second to the busiest.
        let parts = split(t(7, 1), &[9.0, 9.0, 9.0, 9.0, 9.0, 9.0, 9.0, 9.0, 10.0]);
        let total: f64 = parts.iter().flatten().map(|t| t.per_second()).sum();
        assert!(total <= 7.0 + 1e-9, "{parts:?}");
        // Below one a second each: 2/s in three busy buckets is one a second for two of them
        // (2/3 rounds down to one every 2 s; the 1/s left over goes to the first).
        let parts = split(t(2, 1), &[9.0, 9.0, 9.0]);
        let total: f64 = parts.iter().flatten().map(|t| t.per_second()).sum();
        assert!(total <= 2.0, "{parts:?}");
        assert_eq!(split(None, &[1.0, 2.0]), [None, None]);
        assert_eq!(split(t(1, 12), &[4.0]), [t(1, 12)]);
    }
}
