//! What a gateway admitted, charged into its rule's own counters at its next report (the one
//! budget): per hold, the admissions its reported buckets counted go into each rate layer of
//! the descriptor as post-paid hits, at most what its last grant claimed of the layer's current
//! window (the rest fell in windows that are gone). Once they are in, the store starts the
//! gateway's claim again from now (`Ask::charged`). It must never tell the store a charge
//! landed that it does not know landed: a claim kept too long only under-admits.

use std::collections::HashMap;
use std::time::{SystemTime, UNIX_EPOCH};

use super::Inner;
use super::hold::{Hold, Member};
use crate::algorithm::claims::{self, Claim};
use crate::algorithm::share::look::{left_of, look, room};
use crate::algorithm::share::{Room, Tokens};
use crate::algorithm::{Algorithm, ChargeMode, Check};

/// The most charges and looks one store call carries (the Redis batcher's own bound on the
/// keys of a script call).
const CHECKS_PER_CALL: usize = 200;

/// What this stream was granted on a descriptor since its admissions were last charged, on
/// this host's clock: its claim as the store counts it (the store's own clock may differ by
/// the hosts' skew, which moves a cap by that much of the rate).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Granted {
    /// The highest rate granted since `since_us`.
    pub rate: f64,
    pub since_us: u64,
    pub ends_us: u64,
    /// What its buckets may hold at once (each bucket's burst, all of them): admissions past
    /// the claim's rate that came from a full bucket, charged too.
    pub burst: u64,
}

/// Microseconds since the epoch on this host.
pub(super) fn wall_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// The post-paid charges of `admitted` requests into `layers` at `now_us`, each at most what
/// `last` claims of its window plus its buckets' burst (a full bucket admits that much past
/// the rate; left out, each report would forget it and RLS spend it again: the model in
/// `algorithm::claims` fails without it). Nothing into a window before the stream's first
/// grant: those admissions are the filter's own (`no_assignment_behavior`), or, on a stream
/// that moved, still claimed by the holder the old stream left (charging them would count them
/// twice, and a short window would refuse the gateway for its next interval); a token
/// bucket's are charged (`unclaimed_charges`). `life_us`: an assignment's life. A fixed window's current
/// window is the store's (`window_starts`: where it began, on this host's clock, read from the
/// store just before), when known.
pub(super) fn charges(
    layers: &[Check],
    admitted: u64,
    last: Option<&Granted>,
    now_us: u64,
    window_starts: &HashMap<String, u64>,
    life_us: u64,
) -> Vec<Check> {
    if admitted == 0 {
        return Vec::new();
    }
    let Some(g) = last else {
        return unclaimed_charges(layers, admitted, life_us);
    };
    layers
        .iter()
        .filter_map(|layer| {
            let claim = Claim {
                rate: g.rate,
                since_us: g.since_us,
                ends_us: g.ends_us.min(now_us),
            };
            let claimed = match window_starts.get(&layer.key) {
                Some(&start) if layer.limit.algorithm == Algorithm::FixedWindow => {
                    in_window_from(&claim, start, now_us)
                }
                _ => claims::claimed(&[claim], &layer.limit, now_us),
            };
            post_paid(layer, admitted.min(claimed.saturating_add(g.burst)))
        })
        .collect()
}

/// `hits` charged into `layer` after the fact (none for none).
pub(super) fn post_paid(layer: &Check, hits: u64) -> Option<Check> {
    (hits > 0).then(|| Check {
        key: layer.key.clone(),
        limit: layer.limit,
        hits,
        refund: false,
        post_paid: true,
    })
}

/// What a stream admitted before its first grant, charged into the token buckets of `layers`
/// only, each at most its burst and its rate over an assignment's life (`life_us`): a window
/// forgets those admissions by the time the old stream's claim goes (nothing is charged there:
/// see `charges`), a bucket kept drained by RLS does not, and RLS was handed them again once
/// that claim went (issue 43: 61 in 85 s on a bucket of 24 a minute). Counted twice while the
/// old claim stands: RLS under-admits for that long.
fn unclaimed_charges(layers: &[Check], admitted: u64, life_us: u64) -> Vec<Check> {
    layers
        .iter()
        .filter(|layer| layer.limit.algorithm == Algorithm::TokenBucket)
        .filter_map(|layer| {
            let over_life = (layer.limit.per_second() * life_us as f64 / 1e6).ceil();
            let most = layer.limit.burst.saturating_add(over_life as u64);
            post_paid(layer, admitted.min(most))
        })
        .collect()
}

/// What `claim` may have admitted from `start_us` (its window's start) to `now_us`, in whole
/// requests (rounded up, as `claims::claimed`).
pub(super) fn in_window_from(claim: &Claim, start_us: u64, now_us: u64) -> u64 {
    if claim.rate.is_nan() || claim.rate <= 0.0 {
        return 0;
    }
    let us = claim
        .ends_us
        .min(now_us)
        .saturating_sub(claim.since_us.max(start_us));
    (claim.rate * us as f64 / 1e6 - 1e-9).ceil().max(0.0) as u64
}

/// What `hold`'s reported buckets admitted (`allowed[i]`: bucket `i`'s), and its first reported
/// bucket (none: no bucket of it was reported).
fn reported(hold: &Hold, allowed: &[u64]) -> (u64, Option<usize>) {
    let mut admitted = 0u64;
    let mut first = None;
    for (member, _) in &hold.members {
        if let Member::Reported(i) = member {
            admitted = admitted.saturating_add(allowed[*i]);
            first = first.or(Some(*i));
        }
    }
    (admitted, first)
}

/// Where the store's current fixed window began, on this host's clock, from a check of no hits
/// sent at `sent_us` (this host's clock) that answered `look`: its window ends `reset_after`
/// after the store read its clock, which was no earlier than the send, so the start found is
/// never later than the true one (a cap from it is never short). `None` when the store did not
/// answer.
pub(super) fn window_start(
    layer: &Check,
    look: &crate::algorithm::Decision,
    sent_us: u64,
) -> Option<u64> {
    let w = layer.limit.window_us;
    if look.by_failure_mode || w == 0 || layer.limit.algorithm != Algorithm::FixedWindow {
        return None;
    }
    let ends_in = u64::try_from(look.reset_after.as_micros())
        .unwrap_or(u64::MAX)
        .min(w);
    Some(sent_us.saturating_add(ends_in).saturating_sub(w))
}

/// `last` after a grant of `tokens` until `ends_us` to `buckets` buckets each holding `burst` of
/// its part (`Inner::burst_span`), made at `now_us`: started again when the admissions before were charged,
/// else kept from its start at the highest rate and burst.
pub(super) fn after_grant(
    last: Option<Granted>,
    tokens: Option<Tokens>,
    buckets: usize,
    burst: std::time::Duration,
    charged: bool,
    now_us: u64,
    ends_us: u64,
) -> Granted {
    let rate = tokens.map_or(0.0, Tokens::per_second);
    // Each bucket's part holds at most the hold's burst (`hold::split` never grows a part
    // past the share).
    let burst = tokens.map_or(0, |t| u64::from(t.burst(burst))) * buckets as u64;
    match last {
        Some(g) if !charged && g.rate > 0.0 => Granted {
            rate: g.rate.max(rate),
            since_us: g.since_us,
            ends_us,
            burst: g.burst.max(burst),
        },
        _ => Granted {
            rate,
            since_us: now_us,
            ends_us,
            burst,
        },
    }
}

/// Per hold, after its charge: whether its admissions are all in the counters (nothing to
/// charge, once the stream has a grant, counts as in), and what its windows have left.
pub(super) struct Charged {
    pub charged: bool,
    pub rooms: Vec<Room>,
    /// Per room, its counter's key (`store::quota::Ask::counters`).
    pub counters: Vec<String>,
}

impl Inner {
    /// Charges each hold's admissions (`allowed[i]`: what reported bucket `i` admitted;
    /// `layers[i]`: its descriptor's rate limits) and, in the same store call after them, reads
    /// what each window has left (a check of no hits: nothing written).
    pub(super) async fn charge(
        &self,
        holds: &[Hold],
        allowed: &[u64],
        layers: &[&[Check]],
        granted: &std::collections::HashMap<String, Granted>,
        now_us: u64,
        ttl_us: u64,
    ) -> Vec<Charged> {
        let window_starts = self.window_starts(holds, allowed, layers, granted).await;
        let mut checks = Vec::new();
        let mut owner = Vec::new();
        let mut probes = Vec::new();
        for (h, hold) in holds.iter().enumerate() {
            let (admitted, of) = reported(hold, allowed);
            let Some(first) = of else { continue };
            let last = granted.get(&hold.ask.key);
            let added = charges(
                layers[first],
                admitted,
                last,
                now_us,
                &window_starts,
                ttl_us,
            );
            // A refused hold is granted nothing: its windows' room is not read.
            for layer in layers[first].iter().filter(|_| !hold.refused) {
                let hits = added
                    .iter()
                    .find(|c| c.key == layer.key)
                    .map_or(0, |c| c.hits);
                probes.push((h, layer, hits));
            }
            owner.extend(std::iter::repeat_n(h, added.len()));
            checks.extend(added);
        }
        let looks: Vec<Check> = probes.iter().map(|(_, layer, _)| look(layer)).collect();
        // Before its first grant a stream knows nothing of what its holder (a named gateway's,
        // from its last stream) claims: the claim keeps its start.
        let mut out: Vec<Charged> = holds
            .iter()
            .map(|h| Charged {
                charged: granted.contains_key(&h.ask.key),
                rooms: Vec::new(),
                counters: Vec::new(),
            })
            .collect();
        // The charges first, then the looks (which must see them).
        match self.in_calls(&checks).await {
            Some(decisions) => {
                for (h, decision) in owner.iter().zip(&decisions) {
                    // Answered by the failure mode: the charge may or may not have landed.
                    if decision.by_failure_mode {
                        out[*h].charged = false;
                    }
                }
            }
            // Not known to have landed: the claims keep their start (under-admitting only).
            None => out.iter_mut().for_each(|o| o.charged = false),
        }
        let Some(decisions) = self.in_calls(&looks).await else {
            return out;
        };
        for ((h, layer, charged), decision) in probes.iter().zip(&decisions) {
            if decision.by_failure_mode {
                continue;
            }
            let left = left_of(layer, decision);
            if let Some(r) = room(layer, left, *charged, decision, ttl_us) {
                out[*h].rooms.push(r);
                out[*h].counters.push(layer.key.clone());
            }
        }
        out
    }

    /// Where the store's current fixed windows began (`window_start`), for the layers a charge
    /// is capped on: the cap counts what the gateway admitted in the store's window, not in the
    /// one this host's clock would name (a host whose clock is off the store's would cap a
    /// charge short of what the window holds, and the claim, started again, forget the rest).
    async fn window_starts(
        &self,
        holds: &[Hold],
        allowed: &[u64],
        layers: &[&[Check]],
        granted: &std::collections::HashMap<String, Granted>,
    ) -> HashMap<String, u64> {
        let mut looks: Vec<Check> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for hold in holds {
            let (admitted, of) = reported(hold, allowed);
            let Some(first) = of.filter(|_| admitted > 0 && granted.contains_key(&hold.ask.key))
            else {
                continue;
            };
            for layer in layers[first] {
                if layer.limit.algorithm == Algorithm::FixedWindow
                    && seen.insert(layer.key.as_str())
                {
                    looks.push(Check {
                        hits: 0,
                        refund: false,
                        post_paid: false,
                        ..layer.clone()
                    });
                }
            }
        }
        let sent_us = wall_us();
        let Some(decisions) = self.in_calls(&looks).await else {
            return HashMap::new();
        };
        looks
            .iter()
            .zip(&decisions)
            .filter_map(|(layer, look)| {
                Some((layer.key.clone(), window_start(layer, look, sent_us)?))
            })
            .collect()
    }

    /// `checks` charged each alone, in store calls of bounded size sent together (a report of
    /// 10,000 buckets is not one script call holding Redis for all of them), under
    /// `--rlqs-store-timeout`; `None` when the store could not answer.
    pub(super) async fn in_calls(
        &self,
        checks: &[Check],
    ) -> Option<Vec<crate::algorithm::Decision>> {
        if checks.is_empty() {
            return Some(Vec::new());
        }
        let limiter = self.decider.limiter();
        let within = self.config.store_timeout;
        let parts = futures_util::future::join_all(
            checks
                .chunks(CHECKS_PER_CALL)
                .map(|part| limiter.check_within(part, ChargeMode::EachAlone, within)),
        )
        .await;
        let mut decisions = Vec::with_capacity(checks.len());
        for part in parts {
            decisions.extend(part.ok()?);
        }
        Some(decisions)
    }
}

#[cfg(test)]
#[path = "charge_tests.rs"]
mod tests;
