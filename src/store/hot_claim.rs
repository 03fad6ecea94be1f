//! One replica's claim on one hot counter: hits it charged in the store ahead of the calls that
//! will spend them, so that those calls are decided here, from memory, with no store call.
//! Pure (times on the caller's clock, in microseconds): `store::hot` keeps one per hot counter,
//! takes claims through the store and gives back what was not spent.
//!
//! Why a claim never over-admits: its hits were counted by the store, atomically beside every
//! other check, every other replica and every gateway's claims, when it was taken; each call it
//! admits is one of those hits, spent after the store counted it and before the end of the
//! period the store counted it in (a fixed window's window, a sliding window's sub-window),
//! that end estimated from before the take was sent, so never later than the truth. A sliding
//! window keeps a sub-window's hits for a whole window whichever instant of the sub-window they
//! came in, so a hit counted early in its own sub-window is the hit itself. A token bucket's
//! drawn tokens may be spent at any time after they were drawn.
//! It must never admit past a claim's hits or past its period's end.

use crate::algorithm::{Algorithm, Decision, Limit, sliding_window};

/// How much of the replica's own traffic a claim is sized for, and the period its rate is
/// measured over.
pub const HORIZON_US: u64 = 50_000;
/// A claim lives at most this long, whatever its window: the store's clock (Redis `TIME`, a
/// wall clock) and this monotonic one may drift or be stepped apart over long spans.
const MAX_VALID_US: u64 = 1_000_000;
/// Taken off each period's end, for the same drift within a claim's life.
const MARGIN_US: u64 = 1_000;
/// A claim takes at most this share of what the counter has left: near the limit claims
/// shrink, and below `SPREAD * MIN_CLAIM` left every call goes to the store.
const SPREAD: u64 = 4;
/// Smaller claims are not taken.
const MIN_CLAIM: u64 = 2;
/// After a take was refused or failed, none for this long (the calls go to the store).
const BACKOFF_US: u64 = 100_000;
/// A claim is sized for this share of the horizon (or the rest of its period, if less; the rest
/// comes in further claims as it is spent): what a period's end leaves unspent is at most
/// about that.
const PIECES: u64 = 4;
/// Where the counter is past a quarter of its limit (unspent claims may then cost admissions),
/// a window's claim is given back this long (at most a quarter period) before its period ends.
const GIVE_BACK_LEAD_US: u64 = 3_000;

/// Hits claimed by one take, spendable until `until_us`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    pub hits: u64,
    pub until_us: u64,
}

/// What the store last said of the counter: what it had left (our claims spent), what it
/// reports as the limit, and when the counter is full again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Known {
    remaining: u64,
    limit: u64,
    reset_at_us: u64,
}

/// One counter as this replica sees it: its rate here, and the claims it holds on it.
#[derive(Debug, Clone)]
pub struct Claim {
    pub limit: Limit,
    /// Earliest end first; at most two (the one being spent, and the one taken before it ran
    /// out).
    chunks: Vec<Chunk>,
    /// A take is in flight.
    pub taking: bool,
    period_start_us: u64,
    period_hits: u64,
    /// Hits per second in the last measured period.
    rate: f64,
    pub last_seen_us: u64,
    known: Option<Known>,
    backoff_until_us: u64,
    /// The end of a period (window or sub-window) a take was counted in, as estimated: the
    /// next ones follow it by whole periods.
    boundary_us: Option<u64>,
}

/// The period a claim's hits must be spent in: a fixed window's window, a sliding window's
/// sub-window; none for a bucket.
fn period_us(limit: &Limit) -> Option<u64> {
    match limit.algorithm {
        Algorithm::FixedWindow => Some(limit.window_us.max(1)),
        Algorithm::SlidingWindow => Some(sliding_window::sub_window_us(limit.window_us)),
        _ => None,
    }
}

/// Whether a check's counter can be claimed at all.
pub fn claimable(limit: &Limit) -> bool {
    limit.requests > 0
        && matches!(
            limit.algorithm,
            Algorithm::FixedWindow | Algorithm::SlidingWindow | Algorithm::TokenBucket
        )
}

impl Claim {
    pub fn new(limit: Limit, now_us: u64) -> Claim {
        Claim {
            limit,
            chunks: Vec::new(),
            taking: false,
            period_start_us: now_us,
            period_hits: 0,
            rate: 0.0,
            last_seen_us: now_us,
            known: None,
            backoff_until_us: 0,
            boundary_us: None,
        }
    }

    /// Counts a call's hits towards this replica's rate on the counter.
    pub fn note_hits(&mut self, now_us: u64, hits: u64) {
        let elapsed = now_us.saturating_sub(self.period_start_us);
        if elapsed >= HORIZON_US {
            self.rate = self.period_hits as f64 * 1e6 / elapsed as f64;
            self.period_start_us = now_us;
            self.period_hits = 0;
        }
        self.period_hits = self.period_hits.saturating_add(hits);
        self.last_seen_us = now_us;
    }

    /// Drops the chunks whose period ended; answers their unspent hits (they lapse).
    pub fn expire(&mut self, now_us: u64) -> u64 {
        let mut lapsed = 0;
        self.chunks.retain(|c| {
            let live = c.until_us > now_us;
            if !live {
                lapsed += c.hits;
            }
            live
        });
        lapsed
    }

    /// Hits this replica may still spend from its claims at `now_us` (after `expire`).
    pub fn available(&self) -> u64 {
        self.chunks.iter().map(|c| c.hits).sum()
    }

    /// Spends `hits` from the claims, the earliest to end first; false (nothing spent) when
    /// they do not hold that many.
    pub fn spend(&mut self, hits: u64) -> bool {
        if self.available() < hits {
            return false;
        }
        let mut left = hits;
        for c in &mut self.chunks {
            let taken = left.min(c.hits);
            c.hits -= taken;
            left -= taken;
        }
        self.chunks.retain(|c| c.hits > 0);
        true
    }

    /// The answer to a call admitted from the claim. `remaining` is what the store had left at
    /// its last answer plus what this replica has not spent of its claims: it does not see what
    /// others spent since.
    pub fn answer(&self, now_us: u64) -> Decision {
        let known = self.known.unwrap_or(Known {
            remaining: 0,
            limit: self.limit.capacity(),
            reset_at_us: now_us,
        });
        Decision {
            allowed: true,
            limit: known.limit,
            remaining: known
                .remaining
                .saturating_add(self.available())
                .min(self.limit.capacity()),
            reset_after: crate::algorithm::us(known.reset_at_us.saturating_sub(now_us)),
            retry_after: None,
            by_failure_mode: false,
            lease: None,
        }
    }

    /// Notes what the store answered on the counter (a take's answer, or a call sent to it),
    /// for a call sent at `sent_us`.
    pub fn learn(&mut self, sent_us: u64, decision: &Decision) {
        if decision.by_failure_mode {
            return;
        }
        self.known = Some(Known {
            remaining: decision.remaining,
            limit: decision.limit,
            reset_at_us: sent_us.saturating_add(duration_us(decision.reset_after)),
        });
    }

    /// How many hits to claim now (`None`: none), for a replica that calls a counter hot from
    /// `hot_rate` hits a second: its own rate over a `PIECES`th of the horizon (or what is left
    /// of the period, if less), at most a `SPREAD`th of what the counter has left; taken once
    /// what it holds is less than that.
    pub fn wanted(&self, now_us: u64, hot_rate: f64) -> Option<u64> {
        if self.taking || now_us < self.backoff_until_us || self.rate < hot_rate {
            return None;
        }
        let span = match (period_us(&self.limit), self.boundary_us) {
            (None, _) => HORIZON_US,
            (Some(period), None) => HORIZON_US.min(period),
            (Some(period), Some(boundary)) => {
                // The next end after now, of periods that follow the one seen by whole periods.
                let ahead = if boundary > now_us {
                    boundary - now_us
                } else {
                    period - (now_us - boundary) % period
                };
                // A claim taken this close to an end is spent in the next period; one taken
                // before it is spendable until a margin before it.
                let left = if ahead < MARGIN_US * 3 {
                    period
                } else {
                    ahead - MARGIN_US
                };
                HORIZON_US.min(left)
            }
        };
        let span = span.saturating_sub(self.lead_us());
        // What it would spend over a piece of the horizon (or the rest of the span, if less);
        // the next is taken once it holds less than that, so that it is there before this one
        // runs out (a take waits in the same queues as the calls: under load, milliseconds).
        let piece = span.min(HORIZON_US / PIECES);
        let wanted = (self.rate * piece as f64 / 1e6).ceil() as u64;
        if self.available() >= wanted {
            return None;
        }
        let left = match self.known {
            Some(k) if now_us < k.reset_at_us || period_us(&self.limit).is_none() => k.remaining,
            // Its window is over (or nothing is known yet): the take itself will tell.
            _ => self.limit.capacity(),
        };
        let n = wanted.min(left / SPREAD);
        (n >= MIN_CLAIM).then_some(n)
    }

    /// How long before its period's end a window's claim is given back: `GIVE_BACK_LEAD_US`
    /// (at most a quarter period) where the counter is past a quarter of its limit, else 0
    /// (what lapses below that costs an admission only if the window fills later).
    fn lead_us(&self) -> u64 {
        let capacity = self.limit.capacity();
        let near = self
            .known
            .is_some_and(|k| k.remaining < capacity - capacity / 4);
        match period_us(&self.limit) {
            Some(period) if near => GIVE_BACK_LEAD_US.min(period / 4),
            _ => 0,
        }
    }

    /// Takes out the claims about to end (within `lead_us` of their period's end), to be given
    /// back while their period lasts.
    pub fn ending(&mut self, now_us: u64) -> Vec<Chunk> {
        let lead = self.lead_us();
        if lead == 0 {
            return Vec::new();
        }
        let (ending, kept) = std::mem::take(&mut self.chunks)
            .into_iter()
            .partition(|c| c.until_us <= now_us.saturating_add(lead));
        self.chunks = kept;
        ending
    }

    /// The answer to a take of `hits` sent at `sent_us`, read at `now_us`: admitted, the claim
    /// is spendable until its period's end (answered `true`); refused, none is taken for a
    /// while and the counter's state is noted.
    pub fn took(&mut self, sent_us: u64, hits: u64, decision: &Decision, now_us: u64) -> bool {
        self.taking = false;
        self.learn(sent_us, decision);
        if !decision.allowed || decision.by_failure_mode {
            self.backoff_until_us = now_us.saturating_add(BACKOFF_US);
            return false;
        }
        let reset = duration_us(decision.reset_after);
        // How long after the take's counting its period lasts, on the store's clock: a fixed
        // window's end; the end of the sliding window's newest sub-window (a sub-window counts
        // until SUB_WINDOWS more have begun: `reset_after` is that, from the newest one's).
        let to_end = match self.limit.algorithm {
            Algorithm::FixedWindow => Some(reset),
            Algorithm::SlidingWindow => {
                let sub = sliding_window::sub_window_us(self.limit.window_us);
                Some(reset.saturating_sub(sliding_window::SUB_WINDOWS * sub))
            }
            _ => None,
        };
        let until_us = match to_end {
            Some(to_end) => {
                if to_end <= MAX_VALID_US {
                    self.boundary_us = Some(sent_us.saturating_add(to_end));
                }
                sent_us.saturating_add(to_end.min(MAX_VALID_US).saturating_sub(MARGIN_US))
            }
            None => sent_us.saturating_add(MAX_VALID_US),
        };
        self.chunks.push(Chunk { hits, until_us });
        self.chunks.sort_by_key(|c| c.until_us);
        true
    }

    /// A take that failed (the store unreachable, late): none for a while.
    pub fn take_failed(&mut self, now_us: u64) {
        self.taking = false;
        self.backoff_until_us = now_us.saturating_add(BACKOFF_US);
    }

    /// Takes every unspent chunk out, to be given back to the store.
    pub fn take_unspent(&mut self) -> Vec<Chunk> {
        std::mem::take(&mut self.chunks)
    }

    /// Whether it holds nothing and waits for nothing (it can be forgotten once idle).
    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty() && !self.taking
    }
}

fn duration_us(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
#[path = "hot_claim_tests.rs"]
mod tests;
