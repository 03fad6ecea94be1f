//! Sharing one rule's rate among the gateways that enforce it locally (RLQS). Each gateway reports
//! its demand; its fair share is max-min fair (a gateway that asks for less than an equal part
//! gets what it asks, the rest is split among the others; capacity nobody asks for is split
//! equally, so an idle gateway keeps a little). A gateway's new grant never exceeds what the live
//! grants of the others leave, so at every moment the live grants add up to no more than the
//! rate: a gateway whose share shrinks gives it up at its next report, and the others grow into
//! it at theirs. Pure: the memory store and the Redis script both run this transition. It must
//! never grant what another gateway still holds.

/// One gateway's standing on one rule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Holder {
    pub gateway: u64,
    /// Requests per second it asked for at its last report.
    pub demand: f64,
    /// Requests per second granted to it, in force until `expires_us`.
    pub granted: f64,
    pub expires_us: u64,
    /// RLS demand (`record_demand`: one replica's RLS calls on the descriptor), not a gateway:
    /// every replica records its own, and the fair shares count them together as one holder
    /// asking for their sum (RLS is one claimant however many replicas serve it).
    pub rls: bool,
}

/// The most holders one rule keeps: a gateway past it is granted nothing until one leaves.
pub const MAX_HOLDERS: usize = 1024;

/// Max-min fair shares of `capacity` for `demands`, in their order; what nobody asks for is split
/// equally. Never more than `capacity` in all.
pub fn fair_shares(capacity: f64, demands: &[f64]) -> Vec<f64> {
    let n = demands.len();
    let mut shares = vec![0.0; n];
    if n == 0 || capacity <= 0.0 {
        return shares;
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|a, b| demands[*a].total_cmp(&demands[*b]));
    let mut left = capacity;
    for (done, &i) in order.iter().enumerate() {
        let equal = left / (n - done) as f64;
        let take = demands[i].max(0.0).min(equal);
        shares[i] = take;
        left -= take;
    }
    // Capacity no demand used: an equal part each, so an idle gateway is not starved when its
    // traffic starts.
    if left > 0.0 {
        let extra = left / n as f64;
        for s in &mut shares {
            *s += extra;
        }
    }
    shares
}

/// The grant `quantize` can express: `per_fill` tokens every `every_s` whole seconds (Envoy keeps
/// whole seconds of a fill interval, and fills at `per_fill / every_s` a second, continuously),
/// rounded down so that rounding never over-admits. The bucket Envoy is sent holds a second of
/// the share, at least one token (`burst`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tokens {
    pub per_fill: u32,
    pub every_s: u32,
}

impl Tokens {
    pub fn per_second(self) -> f64 {
        f64::from(self.per_fill) / f64::from(self.every_s)
    }

    /// What the bucket holds: a second of the share, and at least two tokens where a fill
    /// brings two or more (never more than a fill). A bucket of one token loses what it would
    /// gain while a full token waits for the next request: eleven gateways on 10/s, granted 9
    /// every 10 s each, admitted 8.6/s together on a quiet machine and 7.9/s under load, where
    /// a bucket of two admits the 9.9/s granted.
    pub fn burst(self) -> u32 {
        (self.per_fill / self.every_s).max(self.per_fill.min(2))
    }
}

/// Below this, two computations of one rate (here and in `lua/quota.lua`, summed in other
/// orders) are the same rate: rounding must not turn 5 - 1e-15 into 4.
const EPSILON: f64 = 1e-9;

/// The fill intervals tried besides one token every `k` seconds: a second, ten, a minute. A
/// share of 10/11 a second is then 9 every 10 s (0.9), not one every 2 s (0.5): eleven gateways
/// on 10/s admit 9.9/s together, not 5.5.
const INTERVALS: [u32; 3] = [1, 10, 60];

/// The longest interval of one token: a day (the longest unit a rule has).
const MAX_EVERY_S: f64 = 86_400.0;

/// The largest token rate of at most `rate` per second among one token every `k` s and `n`
/// tokens every 1, 10 or 60 s (of equal rates, the first in that order); `None` below one a day
/// (nothing is granted).
pub fn quantize(rate: f64) -> Option<Tokens> {
    if !(rate.is_finite()) || rate <= 1e-12 {
        return None;
    }
    let mut best: Option<Tokens> = None;
    let mut consider = |t: Tokens| {
        if t.per_fill > 0 && best.is_none_or(|b| t.per_second() > b.per_second()) {
            best = Some(t);
        }
    };
    if rate < 1.0 {
        let every_s = (1.0 / rate - EPSILON).ceil();
        if every_s <= MAX_EVERY_S {
            consider(Tokens {
                per_fill: 1,
                every_s: every_s as u32,
            });
        }
    }
    for every_s in INTERVALS {
        let per_fill = (rate * f64::from(every_s) + EPSILON)
            .floor()
            .min(f64::from(u32::MAX)) as u32;
        consider(Tokens { per_fill, every_s });
    }
    best
}

/// One report of `gateway` on a rule of `capacity` per second, at `now_us`: expired holders are
/// dropped, the gateway's demand recorded, and its grant set to its fair share within what the
/// others' live grants leave. Returns the grant (`None`: nothing) and keeps `holders` for the next
/// report.
pub fn report(
    holders: &mut Vec<Holder>,
    capacity: f64,
    gateway: u64,
    demand: f64,
    now_us: u64,
    ttl_us: u64,
) -> Option<Tokens> {
    let mine = |h: &Holder| h.gateway == gateway && !h.rls;
    holders.retain(|h| h.expires_us > now_us || mine(h));
    let me = match holders.iter().position(mine) {
        Some(i) => i,
        None if holders.len() >= MAX_HOLDERS => return None,
        None => {
            holders.push(Holder {
                gateway,
                demand,
                granted: 0.0,
                expires_us: 0,
                rls: false,
            });
            holders.len() - 1
        }
    };
    holders[me].demand = demand.max(0.0);
    let (fair, room) = fair_and_room(holders, capacity, me);
    let grant = quantize(fair.min(room));
    holders[me].granted = grant.map_or(0.0, Tokens::per_second);
    holders[me].expires_us = now_us.saturating_add(ttl_us);
    grant
}

/// Whether `gateway`'s fair share on `holders` is more than the others' live grants leave it:
/// they must shrink before it gets its part (quantization alone does not count).
pub fn is_short(holders: &[Holder], capacity: f64, gateway: u64) -> bool {
    let Some(me) = holders.iter().position(|h| h.gateway == gateway && !h.rls) else {
        return false;
    };
    let (fair, room) = fair_and_room(holders, capacity, me);
    fair > room + EPSILON
}

/// Holder `me`'s (a gateway's) max-min fair share of `capacity`, the replicas' RLS demands
/// counted as one holder, and what the others' grants leave it.
fn fair_and_room(holders: &[Holder], capacity: f64, me: usize) -> (f64, f64) {
    let mut demands: Vec<f64> = Vec::with_capacity(holders.len());
    let mut mine = 0;
    let mut rls: Option<f64> = None;
    for (i, h) in holders.iter().enumerate() {
        if h.rls && i != me {
            *rls.get_or_insert(0.0) += h.demand.max(0.0);
        } else {
            if i == me {
                mine = demands.len();
            }
            demands.push(h.demand);
        }
    }
    demands.extend(rls);
    let fair = fair_shares(capacity.max(0.0), &demands)[mine];
    let others: f64 = holders
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != me)
        .map(|(_, h)| h.granted)
        .sum();
    (fair, capacity - others)
}

/// Records demand that holds no grant (RLS calls on a descriptor gateways hold part of): it
/// counts in the others' fair shares, so their next grants leave it its part, which RLS then
/// finds unreserved. Expired holders are dropped; a new one past `MAX_HOLDERS` is not kept.
pub fn record_demand(
    holders: &mut Vec<Holder>,
    gateway: u64,
    demand: f64,
    now_us: u64,
    ttl_us: u64,
) {
    let mine = |h: &Holder| h.gateway == gateway && h.rls;
    holders.retain(|h| h.expires_us > now_us || mine(h));
    let holder = Holder {
        gateway,
        demand: demand.max(0.0),
        granted: 0.0,
        expires_us: now_us.saturating_add(ttl_us),
        rls: true,
    };
    match holders.iter().position(mine) {
        Some(i) => holders[i] = holder,
        None if holders.len() < MAX_HOLDERS => holders.push(holder),
        None => {}
    }
}

/// Takes `gateway`'s holder off (its stream ended): what it held is free at once for the
/// others' next reports, instead of at its grant's end.
pub fn release(holders: &mut Vec<Holder>, gateway: u64) {
    holders.retain(|h| h.gateway != gateway || h.rls);
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn shares_are_max_min_fair_and_idle_capacity_is_split() {
        assert_eq!(
            fair_shares(90.0, &[100.0, 100.0, 100.0]),
            [30.0, 30.0, 30.0]
        );
        assert_eq!(fair_shares(90.0, &[10.0, 100.0, 100.0]), [10.0, 40.0, 40.0]);
        // Nobody asks for it all: each gets its demand and an equal part of the rest.
        assert_eq!(fair_shares(90.0, &[0.0, 30.0]), [30.0, 60.0]);
        assert_eq!(fair_shares(0.0, &[5.0]), [0.0]);
    }

    #[test]
    fn quantized_grants_round_down_to_what_envoy_can_enforce() {
        // 10.9 a second: 109 every 10 s (10 a second would leave 0.9 unused).
        assert_eq!(
            quantize(10.9),
            Some(Tokens {
                per_fill: 109,
                every_s: 10
            })
        );
        assert_eq!(quantize(10.0).map(Tokens::burst), Some(10));
        // 5 a minute: one every 12 s.
        assert_eq!(
            quantize(5.0 / 60.0),
            Some(Tokens {
                per_fill: 1,
                every_s: 12
            })
        );
        // 7 a minute: 7 every 60 s, exactly (one every 9 s would be 6.67 a minute).
        assert_eq!(
            quantize(7.0 / 60.0),
            Some(Tokens {
                per_fill: 7,
                every_s: 60
            })
        );
        // 13 an hour: one every 277 s (12.99 an hour), never one every 276 s.
        assert_eq!(
            quantize(13.0 / 3600.0),
            Some(Tokens {
                per_fill: 1,
                every_s: 277
            })
        );
        // 10/11 a second: 9 every 10 s; 1.5 a second: 15 every 10 s.
        let t = |per_fill, every_s| Some(Tokens { per_fill, every_s });
        assert_eq!(quantize(10.0 / 11.0), t(9, 10));
        assert_eq!(quantize(1.5), t(15, 10));
        // A rule of one a day still grants (it was DENY_ALL for ever below one an hour).
        assert_eq!(quantize(1.0 / 86_400.0), t(1, 86_400));
        assert_eq!(quantize(0.0), None);
        assert_eq!(quantize(1.0 / 100_000.0), None);
        assert_eq!(t(9, 10).unwrap().burst(), 2);
        assert_eq!(t(25, 10).unwrap().burst(), 2);
        assert_eq!(t(35, 10).unwrap().burst(), 3);
        // One token a fill: one (a one-a-day share never lets two through).
        assert_eq!(t(1, 86_400).unwrap().burst(), 1);
        assert_eq!(t(1, 1).unwrap().burst(), 1);
    }

    #[test]
    fn a_gateway_grows_only_into_what_the_others_give_up() {
        let mut holders = Vec::new();
        let ttl = 3_000_000;
        // Gateway 1 alone, busy: the whole rate.
        let g1 = report(&mut holders, 100.0, 1, 300.0, 0, ttl).unwrap();
        assert_eq!(g1.per_second(), 100.0);
        // Gateway 2 arrives: gateway 1 still holds everything, so 2 gets nothing yet, and
        // is short (1 must shrink: the server pushes it a smaller grant).
        assert!(!is_short(&holders, 100.0, 1));
        assert_eq!(report(&mut holders, 100.0, 2, 300.0, 100_000, ttl), None);
        assert!(is_short(&holders, 100.0, 2));
        // Gateway 1 reports: its fair half; then 2 grows into the other half.
        assert_eq!(
            report(&mut holders, 100.0, 1, 300.0, 1_000_000, ttl)
                .unwrap()
                .per_second(),
            50.0
        );
        assert_eq!(
            report(&mut holders, 100.0, 2, 300.0, 1_100_000, ttl)
                .unwrap()
                .per_second(),
            50.0
        );
        // Gateway 2 stops reporting: once its grant expires, 1 gets the whole rate back.
        // (Below: demand that holds nothing still shapes the shares.)
        assert_eq!(
            report(&mut holders, 100.0, 1, 300.0, 2_000_000, ttl)
                .unwrap()
                .per_second(),
            50.0
        );
        assert_eq!(
            report(&mut holders, 100.0, 1, 300.0, 4_200_000, ttl)
                .unwrap()
                .per_second(),
            100.0
        );
        assert_eq!(holders.len(), 1);
    }

    #[test]
    fn demand_without_a_grant_shrinks_the_others_shares() {
        let mut holders = Vec::new();
        let ttl = 3_000_000;
        assert_eq!(
            report(&mut holders, 10.0, 1, 30.0, 0, ttl)
                .unwrap()
                .per_second(),
            10.0
        );
        // RLS asks for 4 a second: the gateway's next grant leaves them.
        record_demand(&mut holders, 99, 4.0, 100_000, ttl);
        let g = report(&mut holders, 10.0, 1, 30.0, 1_000_000, ttl).unwrap();
        assert_eq!(g.per_second(), 6.0);
        let held: f64 = holders.iter().map(|h| h.granted).sum();
        assert_eq!(held, 6.0);
        // Once RLS stops asking (its demand expires), the gateway grows back.
        let g = report(&mut holders, 10.0, 1, 30.0, 3_200_000, ttl).unwrap();
        assert_eq!(g.per_second(), 10.0);
    }

    #[test]
    fn the_replicas_rls_demands_weigh_as_one_holder() {
        let ttl = 3_000_000;
        // Three replicas see RLS calls at 3 a second each: RLS asks for 9 as one holder, so a
        // gateway asking for 10 of 10 gets an equal half (as against two; three holders of 3
        // would leave it 1).
        let mut holders = Vec::new();
        for replica in 1..=3 {
            record_demand(&mut holders, replica, 3.0, 0, ttl);
        }
        let g = report(&mut holders, 10.0, 1, 10.0, 1, ttl).unwrap();
        assert_eq!(g.per_second(), 5.0);
        // One replica's RLS alone asking for little: the gateway gets the rest.
        let mut holders = Vec::new();
        record_demand(&mut holders, 1, 2.0, 0, ttl);
        let g = report(&mut holders, 10.0, 1, 10.0, 1, ttl).unwrap();
        assert_eq!(g.per_second(), 8.0);
    }

    proptest! {
        /// Whatever the order of reports, demands and times, the live grants never add up to
        /// more than the rate.
        #[test]
        fn live_grants_never_exceed_the_rate(
            capacity in 0.0f64..1000.0,
            steps in proptest::collection::vec((0u64..6, 0.0f64..2000.0, 0u64..2_000_000), 1..200),
        ) {
            let mut holders = Vec::new();
            let mut now = 0u64;
            for (gateway, demand, advance) in steps {
                now += advance;
                report(&mut holders, capacity, gateway, demand, now, 3_000_000);
                let live: f64 = holders.iter().filter(|h| h.expires_us > now).map(|h| h.granted).sum();
                prop_assert!(live <= capacity + 1e-9, "{live} > {capacity}: {holders:?}");
            }
        }

        #[test]
        fn a_quantized_rate_never_exceeds_the_rate_and_keeps_nine_tenths_of_it(
            rate in 0.0001f64..100_000.0,
        ) {
            let t = quantize(rate).expect("above one a day");
            prop_assert!(t.per_second() <= rate * (1.0 + 1e-9), "{t:?} for {rate}");
            prop_assert!(t.per_second() >= 0.9 * rate || rate < 0.1, "{t:?} for {rate}");
        }

        #[test]
        fn fair_shares_never_exceed_capacity_and_meet_small_demands(
            capacity in 0.0f64..1000.0,
            demands in proptest::collection::vec(0.0f64..500.0, 1..20),
        ) {
            let shares = fair_shares(capacity, &demands);
            let total: f64 = shares.iter().sum();
            prop_assert!(total <= capacity + 1e-6);
            let equal = capacity / demands.len() as f64;
            for (d, s) in demands.iter().zip(&shares) {
                prop_assert!(*s + 1e-9 >= d.min(equal), "{d} got {s}");
            }
        }
    }
}
