//! Sharing one rule's rate among the gateways that enforce it locally (RLQS). Each gateway reports
//! its demand; its fair share is max-min fair (a gateway that asks for less than an equal part
//! gets what it asks, the rest is split among the others; capacity nobody asks for is split
//! equally, so an idle gateway keeps a little). A gateway's new grant never exceeds what the live
//! grants of the others leave, so at every moment the live grants add up to no more than the
//! rate: a gateway whose share shrinks gives it up at its next report, and the others grow into
//! it at theirs. Pure: the memory store and the Redis script both run this transition. It must
//! never grant what another gateway still holds.

#[path = "share_look.rs"]
pub mod look;
#[path = "share_room.rs"]
mod room;
pub use room::Room;
use room::most;

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
    /// From when its admissions are not yet in the rule's counters: its last report whose
    /// admissions were charged there (`algorithm::claims`).
    pub since_us: u64,
    /// What its uncharged admissions are claimed at: the highest rate granted since
    /// `since_us`, or while it reserves, its reservation if that is higher.
    pub claim_rate: f64,
    /// The highest rate granted since `since_us` (its claim less a reservation).
    pub granted_rate: f64,
    /// Since when it reserves its part (0: it does not): its fair part was more than the
    /// rule's windows had left when it reported (RLS had spent them), so it claims that part
    /// (every RLS check counts it, leaving it room) while granted only what the windows hold;
    /// once the reservation has stood a whole window, the window holds what it left.
    pub reserved_since_us: u64,
    /// Kept until then (its grant's end plus the rule's longest window): an ended grant still
    /// claims, in the windows it reaches, what it may have admitted and never reported.
    pub keep_until_us: u64,
}

impl Holder {
    /// Whether its grant is in force (only those count in the shares).
    pub fn live(&self, now_us: u64) -> bool {
        self.expires_us > now_us
    }

    /// Its claim on the rule's windows (`algorithm::claims`); none for RLS demand.
    pub fn claim(&self) -> Option<super::claims::Claim> {
        (!self.rls && self.claim_rate > 0.0).then_some(super::claims::Claim {
            rate: self.claim_rate,
            since_us: self.since_us,
            ends_us: self.expires_us,
        })
    }
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
/// rounded down so that rounding never over-admits. The bucket Envoy is sent holds a span of
/// the share (`burst_span`: `--rlqs-burst`, or a tenth of the rule's shortest window, at most a
/// second), at least one token (`burst`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tokens {
    pub per_fill: u32,
    pub every_s: u32,
}

impl Tokens {
    pub fn per_second(self) -> f64 {
        f64::from(self.per_fill) / f64::from(self.every_s)
    }

    /// What the bucket holds: `span` of the share (rounded down), and at least two tokens where
    /// a fill brings two or more (the floor never exceeds a fill; a `span` past the fill
    /// interval holds more than one). A bucket of one token loses what it
    /// would gain while a full token waits for the next request: eleven gateways on 10/s,
    /// granted 9 every 10 s each, admitted 8.6/s together on a quiet machine and 7.9/s under
    /// load, where a bucket of two admits the 9.9/s granted. A quiet gateway admits its bucket
    /// at once and the refill after it: on a window rule, the bucket is what a gateway may
    /// admit past the rule in a window (docs/envoy.md).
    pub fn burst(self, span: std::time::Duration) -> u32 {
        let held = u128::from(self.per_fill) * span.as_millis() / (u128::from(self.every_s) * 1000);
        u32::try_from(held)
            .unwrap_or(u32::MAX)
            .max(self.per_fill.min(2))
    }
}

/// The span of its share a gateway's bucket holds on a rule whose shortest window is
/// `shortest_us`: `configured` (`--rlqs-burst`) when set, else a tenth of that window, at most a
/// second. A quiet gateway admits its bucket past the rule in a window: by default at most a
/// tenth of its part of the rule's shortest window (and the two-token floor), never twice its
/// share within a second as a second's bucket on a second's rule would; on a minute or longer,
/// a second of the share, a sixtieth of the window or less.
pub fn burst_span(
    configured: Option<std::time::Duration>,
    shortest_us: u64,
) -> std::time::Duration {
    const SECOND: std::time::Duration = std::time::Duration::from_secs(1);
    configured.unwrap_or_else(|| match shortest_us {
        0 => SECOND,
        w => std::time::Duration::from_micros(w / 10).min(SECOND),
    })
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

/// One report of `gateway` on a rule of `capacity` per second, at `now_us`: holders past their
/// keep are dropped, the gateway's demand recorded, and its grant set to its fair share within
/// what the others' live grants leave. `charged`: what it admitted up to now is in the rule's
/// counters (its claim starts again from now); otherwise its claim keeps its start, at the
/// highest rate granted since. `window_us`: the rule's longest window (how long an ended grant
/// still claims). Returns the grant (`None`: nothing) and keeps `holders` for the next report.
pub fn report(holders: &mut Vec<Holder>, ask: &Report, now_us: u64) -> Option<Tokens> {
    let gateway = ask.gateway;
    let mine = |h: &Holder| h.gateway == gateway && !h.rls;
    holders.retain(|h| h.keep_until_us > now_us || mine(h));
    let me = match holders.iter().position(mine) {
        Some(i) => i,
        None if holders.len() >= MAX_HOLDERS => return None,
        None => {
            holders.push(Holder {
                gateway,
                demand: ask.demand,
                granted: 0.0,
                expires_us: 0,
                rls: false,
                since_us: now_us,
                claim_rate: 0.0,
                granted_rate: 0.0,
                reserved_since_us: 0,
                keep_until_us: 0,
            });
            holders.len() - 1
        }
    };
    holders[me].demand = ask.demand.max(0.0);
    let (fair, room) = fair_and_room(holders, ask.capacity, me, now_us);
    let part = fair.min(room);
    let grant = quantize(part.min(most(holders, me, &ask.rooms, now_us)));
    let rate = grant.map_or(0.0, Tokens::per_second);
    // Its part, as Envoy could enforce it: reserved when the windows cannot hold it yet.
    let reserve = quantize(part).map_or(0.0, Tokens::per_second);
    let reserving = reserve > rate + EPSILON;
    let h = &mut holders[me];
    if ask.charged || h.claim_rate <= 0.0 {
        h.since_us = now_us;
        h.granted_rate = rate;
        h.claim_rate = rate;
    } else {
        h.granted_rate = h.granted_rate.max(rate);
        h.claim_rate = h.claim_rate.max(rate);
    }
    if reserving {
        h.claim_rate = h.claim_rate.max(reserve);
        if h.reserved_since_us == 0 {
            h.reserved_since_us = now_us;
        }
    } else {
        h.reserved_since_us = 0;
    }
    h.granted = rate;
    h.expires_us = now_us.saturating_add(ask.ttl_us);
    h.keep_until_us = h.expires_us.saturating_add(ask.window_us);
    grant
}

/// What one report asks of `report`.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub capacity: f64,
    pub gateway: u64,
    pub demand: f64,
    pub ttl_us: u64,
    /// Its admissions up to now are charged into the rule's counters.
    pub charged: bool,
    /// The rule's longest window.
    pub window_us: u64,
    /// What the rule's windows have left, each read just before (none: no bound).
    pub rooms: Vec<Room>,
}

/// Whether `gateway` reserves on `holders` (its part is more than the windows hold yet): like a
/// gateway short of its share, its descriptor is contested, so that it is re-asked soon.
pub fn is_reserving(holders: &[Holder], gateway: u64) -> bool {
    holders
        .iter()
        .any(|h| h.gateway == gateway && !h.rls && h.reserved_since_us > 0)
}

/// Whether `gateway`'s fair share on `holders` is more than the others' live grants leave it:
/// they must shrink before it gets its part (quantization alone does not count).
pub fn is_short(holders: &[Holder], capacity: f64, gateway: u64, now_us: u64) -> bool {
    let Some(me) = holders.iter().position(|h| h.gateway == gateway && !h.rls) else {
        return false;
    };
    let (fair, room) = fair_and_room(holders, capacity, me, now_us);
    fair > room + EPSILON
}

/// Holder `me`'s (a gateway's) max-min fair share of `capacity`, the replicas' RLS demands
/// counted as one holder, and what the others' live grants leave it (holders whose grant ended
/// by `now_us` are kept for their claims only).
fn fair_and_room(holders: &[Holder], capacity: f64, me: usize, now_us: u64) -> (f64, f64) {
    let mut demands: Vec<f64> = Vec::with_capacity(holders.len());
    let mut mine = 0;
    let mut rls: Option<f64> = None;
    for (i, h) in holders.iter().enumerate() {
        if i != me && !h.live(now_us) {
            continue;
        }
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
        .filter(|(i, h)| *i != me && h.live(now_us))
        .map(|(_, h)| h.granted)
        .sum();
    (fair, capacity - others)
}

/// Records demand that holds no grant (RLS calls on a descriptor gateways hold part of): it
/// counts in the others' fair shares, so their next grants leave it its part, which RLS then
/// finds unclaimed. Expired holders are dropped; a new one past `MAX_HOLDERS` is not kept.
pub fn record_demand(
    holders: &mut Vec<Holder>,
    gateway: u64,
    demand: f64,
    now_us: u64,
    ttl_us: u64,
) {
    let mine = |h: &Holder| h.gateway == gateway && h.rls;
    holders.retain(|h| h.keep_until_us > now_us || mine(h));
    let expires_us = now_us.saturating_add(ttl_us);
    let holder = Holder {
        gateway,
        demand: demand.max(0.0),
        granted: 0.0,
        expires_us,
        rls: true,
        since_us: now_us,
        claim_rate: 0.0,
        granted_rate: 0.0,
        reserved_since_us: 0,
        keep_until_us: expires_us,
    };
    match holders.iter().position(mine) {
        Some(i) => holders[i] = holder,
        None if holders.len() < MAX_HOLDERS => holders.push(holder),
        None => {}
    }
}

/// `gateway`'s stream ended at `now_us`: its share is free at once for the others' next reports
/// (it asks for nothing and holds no grant), but its claim stays until its last assignment ends
/// and a window after. Envoy keeps a bucket's assignment when the stream that sent it ends, and
/// admits on it until its time to live (a stream's end releasing the claim at once let RLS
/// spend the gateway's part while the gateway still admitted it). The gateway's next report on
/// the same holder (a gateway that names itself) takes the claim over.
pub fn stream_ended(holders: &mut Vec<Holder>, gateway: u64, now_us: u64) {
    holders.retain_mut(|h| {
        if h.gateway != gateway || h.rls {
            return true;
        }
        // A reservation was never granted: nothing was admitted on it.
        h.claim_rate = h.granted_rate;
        h.reserved_since_us = 0;
        h.granted = 0.0;
        h.demand = 0.0;
        h.claim_rate > 0.0 && h.keep_until_us > now_us && h.expires_us > h.since_us
    });
}

/// `gateway`'s record goes when its stream has ended (nothing granted, nothing asked) and its
/// last grant has ended by `now_us`: its claim was charged into the rule's counters (the
/// service's fold), which count it from now on. A holder that reported again since (a named
/// gateway's next stream) or whose grant still runs is kept.
pub fn forget(holders: &mut Vec<Holder>, gateway: u64, now_us: u64) {
    holders.retain(|h| {
        h.gateway != gateway || h.rls || h.granted > 0.0 || h.demand > 0.0 || h.expires_us > now_us
    });
}

#[cfg(test)]
#[path = "share_tests.rs"]
mod tests;
