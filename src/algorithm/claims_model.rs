//! The models the one budget's tests run (claims_tests.rs, claims_sliding_tests.rs,
//! claims_bucket_tests.rs): gateways as Envoy runs them, the quota store's holders, and whole runs
//! of RLS checks, gateway traffic, reports and stream ends. Test code only: it must decide by the
//! stores' own transitions (`share`, `decide_claimed`), never by a formula of its own.

use super::*;
use crate::algorithm::share;

pub(super) fn limit(algorithm: Algorithm, requests: u64, window_s: u64) -> Limit {
    Limit {
        algorithm,
        requests,
        window_us: window_s * 1_000_000,
        burst: requests,
    }
}

pub(super) const S: u64 = 1_000_000;

/// A gateway as Envoy runs one: a token bucket of `fill` tokens refilled at `rate`, new and full
/// whenever its assignment changes.
#[derive(Debug, Clone)]
pub(super) struct Gateway {
    pub(super) claim: Claim,
    pub(super) tokens: f64,
    pub(super) fill: f64,
    pub(super) at_us: u64,
    /// Admitted since its last report.
    pub(super) unreported: u64,
    /// Its stream ended: it still admits on its last assignment until that ends (Envoy keeps
    /// the bucket; only the stream is gone), and its next report is a new stream's first.
    pub(super) moved: bool,
}

impl Gateway {
    /// A gateway with no grant yet.
    pub(super) fn idle() -> Gateway {
        Gateway {
            claim: Claim {
                rate: 0.0,
                since_us: 0,
                ends_us: 0,
            },
            tokens: 0.0,
            fill: 0.0,
            at_us: 0,
            unreported: 0,
            moved: false,
        }
    }

    pub(super) fn refill(&mut self, now: u64) {
        let dt = now
            .saturating_sub(self.at_us)
            .min(self.claim.ends_us.saturating_sub(self.at_us));
        self.tokens = (self.tokens + self.claim.rate * dt as f64 / 1e6).min(self.fill);
        self.at_us = now;
    }

    /// Its traffic at `now`: it admits all its bucket holds while its assignment lasts. Returns
    /// how many it admitted.
    pub(super) fn admit_all(&mut self, now: u64) -> usize {
        self.refill(now);
        let mut admitted = 0;
        while now < self.claim.ends_us && self.tokens >= 1.0 {
            self.tokens -= 1.0;
            self.unreported += 1;
            admitted += 1;
        }
        admitted
    }

    /// What its report at `now` charges into `l`: what it admitted since its last report, at
    /// most its claim there and its fill (`service::quota::charge::charges`).
    pub(super) fn report_charge(&mut self, l: &Limit, now: u64) -> u64 {
        if self.moved {
            // A new stream's first report: what it admitted is the old stream's claim's
            // (`service::quota::charge`: nothing before the stream's first grant on a window);
            // a bucket's is charged, at most the bucket's burst and the rate over an
            // assignment's life.
            let unreported = std::mem::take(&mut self.unreported);
            if l.algorithm != Algorithm::TokenBucket {
                return 0;
            }
            let most = l.burst + (l.per_second() * 11.0).ceil() as u64;
            return unreported.min(most);
        }
        let past = Claim {
            ends_us: now.min(self.claim.ends_us),
            ..self.claim
        };
        let cap = claim(&past, l, now);
        let charge = self
            .unreported
            .min((cap - EPSILON).ceil().max(0.0) as u64 + self.fill.ceil() as u64);
        self.unreported = 0;
        charge
    }

    /// Granted `granted` a second at `now` until `ends_us`, in a bucket of `fill` tokens; its
    /// claim starts again from now. Envoy starts a new, full bucket when the assignment changed
    /// or the last one had ended: then the new bucket's fill.
    pub(super) fn assign(
        &mut self,
        granted: f64,
        fill: f64,
        now: u64,
        ends_us: u64,
    ) -> Option<u64> {
        self.refill(now);
        self.moved = false;
        let changed = granted != self.claim.rate || now >= self.claim.ends_us;
        self.claim = Claim {
            rate: granted,
            since_us: now,
            ends_us,
        };
        if !changed {
            return None;
        }
        self.fill = if granted > 0.0 { fill } else { 0.0 };
        self.tokens = self.fill;
        self.at_us = now;
        Some(self.fill.ceil() as u64)
    }

    /// Whether its stream has had an assignment (its report's admissions are then charged:
    /// `service::quota::charge`).
    pub(super) fn charged(&self) -> bool {
        !self.moved && self.claim.ends_us > self.claim.since_us
    }

    /// `assign` of what `share::report` granted (`None`: nothing), in the bucket Envoy is sent
    /// by default (`share::burst_span`: a tenth of `window_us` of the share, two tokens at
    /// least).
    pub(super) fn assign_tokens(
        &mut self,
        granted: Option<share::Tokens>,
        window_us: u64,
        now: u64,
        ends_us: u64,
    ) -> Option<u64> {
        let rate = granted.map_or(0.0, share::Tokens::per_second);
        let fill = granted.map_or(0, |t| t.burst(share::burst_span(None, window_us)));
        self.assign(rate, f64::from(fill), now, ends_us)
    }
}

/// The quota store's side of a model: the descriptor's holders as `share::report` keeps them
/// (gateway `g` is holder `g + 1`, the replicas' RLS demand holder 0), whose claims every RLS
/// check counts. The models grant by the same transition as the stores, not by a formula of
/// their own.
#[derive(Default)]
pub(super) struct Shares {
    pub(super) holders: Vec<share::Holder>,
    /// Per gateway, how many of its streams ended: a gateway that does not name itself is a
    /// new holder on each stream.
    streams: std::collections::HashMap<usize, u64>,
}

impl Shares {
    /// Every claim an RLS check at `now` counts (holders kept, `MemoryQuota::held`).
    pub(super) fn claims(&self, now: u64) -> Vec<Claim> {
        self.holders
            .iter()
            .filter(|h| h.keep_until_us > now)
            .filter_map(share::Holder::claim)
            .collect()
    }

    /// RLS calls on the descriptor: their demand (busy: three times the rate) for 3 s.
    pub(super) fn rls_asks(&mut self, rate: f64, now: u64) {
        share::record_demand(&mut self.holders, 0, 3.0 * rate, now, 3 * S);
    }

    /// Gateway `g`'s report at `now` (offered three times the rate), with what `room` the
    /// window has left: its grant. `charged`: its stream had a grant, so what it admitted is
    /// in the counter (a named gateway's new stream is the same holder: its first report
    /// charges nothing, and its claim keeps its start).
    pub(super) fn report(
        &mut self,
        g: usize,
        l: &Limit,
        rooms: Vec<share::Room>,
        charged: bool,
        ttl_us: u64,
        now: u64,
    ) -> Option<share::Tokens> {
        let rate = l.per_second();
        let report = share::Report {
            capacity: rate,
            gateway: self.holder(g),
            demand: 3.0 * rate,
            ttl_us,
            charged,
            window_us: l.window_us,
            rooms,
        };
        share::report(&mut self.holders, &report, now)
    }

    /// Gateway `g`'s holder id on its current stream (a new one per stream: gateways that do
    /// not name themselves, the default).
    fn holder(&self, g: usize) -> u64 {
        g as u64 + 1 + 1000 * self.streams.get(&g).copied().unwrap_or(0)
    }

    /// Gateway `g`'s stream ended at `now` (`share::stream_ended`); its next is a new holder.
    pub(super) fn stream_ended(&mut self, g: usize, now: u64) {
        let holder = self.holder(g);
        share::stream_ended(&mut self.holders, holder, now);
        *self.streams.entry(g).or_default() += 1;
    }
}

/// Gateway `gate`'s stream ends at `now` (a drain, a closed connection, a maximum connection
/// age): Envoy keeps its bucket and admits on its last assignment until that ends, so its claim
/// stays until then and a window after, for what it admitted and never reported
/// (`share::stream_ended`); its next report is a new stream's first (nothing charged).
pub(super) fn end_stream(gate: &mut Gateway, ended: &mut Vec<Claim>) {
    ended.push(gate.claim);
    gate.moved = true;
}

/// What the gateways' buckets may hold at `at_us`: each one's fill in force then (`history`:
/// per gateway, each assignment's time and fill).
pub(super) fn carried_at(history: &[Vec<(u64, u64)>], at_us: u64) -> u64 {
    history
        .iter()
        .map(|h| {
            h.iter()
                .rev()
                .find(|(t, _)| *t <= at_us)
                .map_or(0, |(_, f)| *f)
        })
        .sum()
}

/// One rule shared by RLS and gateways under the one-budget design, on a fixed window, by the
/// quota store's own transition (what the sliding model runs): RLS checks count the claims of the holders `share::report` keeps (reservations included); a
/// report charges what the gateway admitted in the current window (at most its claim there) and
/// is granted by `share::report` within the window's room, read as the store reads it (a check
/// of no hits: the limit less every claim, less the count). Returns per window (admitted,
/// allowance): the limit plus one bucket per gateway per assignment it held in that window, and
/// the buckets carried in.
///
/// The proptest's model (claims_tests.rs). A report's room is read signed: before, it was read
/// stopped at zero with the reporter's own claim given back on top, and random sequences found
/// windows past the bound by one (45 > 44 on a minute's rule of 40, one gateway, RLS bursts and
/// stream ends: the claim given back was more than there was once the count and the claims were
/// past the limit; issues 43 and 48).
pub(super) fn run_shared(
    window_s: u64,
    requests: u64,
    gateways: usize,
    steps: &[(u8, u8, u32)],
) -> Vec<(u64, u64)> {
    let l = limit(Algorithm::FixedWindow, requests, window_s);
    let w = l.window_us;
    let rate = l.per_second();
    let ttl = 11 * S;
    let mut gw: Vec<Gateway> = vec![Gateway::idle(); gateways];
    let mut shares = Shares::default();
    let mut count: std::collections::HashMap<u64, u64> = Default::default();
    let mut admitted: std::collections::HashMap<u64, u64> = Default::default();
    let mut allowance: std::collections::HashMap<u64, u64> = Default::default();
    // Per gateway, each assignment's (time, fill): what its bucket may carry into a window.
    let mut history: Vec<Vec<(u64, u64)>> = vec![Vec::new(); gateways];
    let mut ended: Vec<Claim> = Vec::new();
    let mut now = w; // start on a boundary past zero
    for &(what, who, advance_ms) in steps {
        // Steps of up to 50 ms on a second's window, up to 2 s on longer ones.
        now += u64::from(advance_ms) * (w / 40_000).min(1000);
        let win = now / w;
        let g = usize::from(who) % gateways;
        if what % 5 == 4 {
            // Its claim stays in the holders (`share::stream_ended`); the model's own list is not
            // read.
            end_stream(&mut gw[g], &mut ended);
            shares.stream_ended(g, now);
            continue;
        }
        match what % 5 {
            // A burst of RLS calls: each counts against the counter and every claim; RLS asks.
            0 | 1 => {
                shares.rls_asks(rate, now);
                for _ in 0..=who {
                    let left = less(&l, claimed(&shares.claims(now), &l, now));
                    let c = count.entry(win).or_default();
                    if *c < left.requests {
                        *c += 1;
                        *admitted.entry(win).or_default() += 1;
                    }
                }
            }
            // Gateway g's traffic: it admits all its bucket holds, while its assignment lasts.
            2 => *admitted.entry(win).or_default() += gw[g].admit_all(now) as u64,
            // A report of gateway g: charge, then grant within the room.
            _ => {
                let charge = gw[g].report_charge(&l, now);
                *count.entry(win).or_default() += charge;
                let ends = now + ttl;
                let window_end = (win + 1) * w;
                // The look: the limit less the count, signed (`share::report` takes the other
                // holders' claims off).
                let room = share::Room {
                    limit: l,
                    left: l.requests as i64 - count[&win] as i64,
                    charged: charge,
                    span_us: ends.min(window_end) - now,
                };
                let charged = gw[g].charged();
                let granted = shares.report(g, &l, vec![room], charged, ttl, now);
                if let Some(fill) = gw[g].assign_tokens(granted, w, now, ends) {
                    *allowance.entry(win).or_default() += fill;
                    history[g].push((now, fill));
                }
            }
        }
    }
    let mut out: Vec<(u64, u64)> = admitted
        .iter()
        .map(|(win, n)| {
            // Buckets carried in from the window before count once more each.
            let carried = carried_at(&history, win * w);
            (
                *n,
                requests + allowance.get(win).copied().unwrap_or(0) + carried,
            )
        })
        .collect();
    out.sort();
    out
}
