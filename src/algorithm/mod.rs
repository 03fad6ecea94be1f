//! The rate-limit math and the types every layer above speaks: `Limit` (what a rule says, in
//! numbers), `Check` (one descriptor ready to count), `Decision` (what a store answers), and the
//! counter identity (`key`).
//!
//! The algorithms are pure functions over (state, now, hits). This floor must never do I/O, read a
//! clock or import anything else from the crate: the memory store runs these functions directly,
//! the Redis scripts run the same state transitions in Lua and hand the state back to `summarize`
//! here, so the numbers Envoy sees come from this code whichever store counts.

pub mod claims;
pub use claims::{apply_claimed, charge_post_paid_claimed};
pub mod concurrency;
pub mod fixed_window;
pub mod key;
pub mod share;
pub mod sliding_window;
pub mod token_bucket;

use std::fmt;
use std::time::Duration;

/// Microseconds per second, the unit every window is expressed in internally.
pub const US_PER_SECOND: u64 = 1_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Algorithm {
    #[default]
    SlidingWindow,
    TokenBucket,
    FixedWindow,
    /// At most `requests` in flight, each slot leased for `window_us` (`concurrency`).
    Concurrency,
}

impl Algorithm {
    /// Short tag used in storage keys and listings; changing one orphans stored counters.
    pub fn tag(self) -> &'static str {
        match self {
            Algorithm::SlidingWindow => "sw60",
            Algorithm::TokenBucket => "tb",
            Algorithm::FixedWindow => "fw",
            Algorithm::Concurrency => "cc",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::Concurrency => "concurrency",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A limit in numbers: `requests` per `window_us`, with `burst` as the token bucket's capacity
/// (equal to `requests` for the other algorithms).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limit {
    pub algorithm: Algorithm,
    pub requests: u64,
    pub window_us: u64,
    pub burst: u64,
}

impl Limit {
    /// The most hits this limit could ever admit at once; a request costing more never passes.
    pub fn capacity(&self) -> u64 {
        match self.algorithm {
            Algorithm::TokenBucket => self.burst,
            _ => self.requests,
        }
    }

    /// Its rate in requests per second (what RLQS shares and reserves).
    pub fn per_second(&self) -> f64 {
        self.requests as f64 / (self.window_us as f64 / US_PER_SECOND as f64)
    }
}

/// One descriptor, resolved to a limit, ready to count. `key` identifies the counter and is the
/// same string in every store (the Redis store adds its prefix).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub key: String,
    pub limit: Limit,
    pub hits: u64,
    /// Return `hits` to the budget instead of spending them (Envoy's `is_negative_hits`: charge an
    /// estimate up front, give back what was not used).
    pub refund: bool,
    /// The hits were already consumed (a cost charged when Envoy's stream is done, an LLM's
    /// tokens): they are recorded even when they do not fit, taking the counter past its limit,
    /// and every later check is refused until it has drained back within it. The answer still
    /// says whether they fit.
    pub post_paid: bool,
}

impl Check {
    /// Whether it records consumption that has happened (a refund, or post-paid hits): the
    /// counter must learn of it even when its caller has already been answered.
    pub fn is_consumption(&self) -> bool {
        // Slots are not a cost consumed: a concurrency charge is never post-paid.
        self.refund
            || (self.post_paid && self.hits > 0 && self.limit.algorithm != Algorithm::Concurrency)
    }
}

/// How the checks of one call are charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ChargeMode {
    /// Each check is charged if it passes, whatever the others answer (Envoy's model).
    #[default]
    EachAlone,
    /// If any check of the call is refused, none is charged (refunds still apply).
    AllOrNothing,
    /// Nothing is charged: every check is answered as it would be, and nothing changes.
    Probe,
}

/// What a store answers for one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    /// The limit's capacity, as reported to the client.
    pub limit: u64,
    /// What could still be spent now, after this request.
    pub remaining: u64,
    /// When the counter is back to full (nothing spent).
    pub reset_after: Duration,
    /// Denied only: when this same request would pass; `None` when waiting never helps
    /// (the request costs more than the limit's capacity) or when it was allowed.
    pub retry_after: Option<Duration>,
    /// Answered by the failure mode (allow or deny) without any counter: `limit` and
    /// `remaining` say nothing of a budget, and must not be reported as if they did.
    pub by_failure_mode: bool,
    /// A concurrency take that passed: the token naming the leases it took (`concurrency::
    /// lease_token`), which its release gives back to free those and no other.
    pub lease: Option<u64>,
}

/// Decision for a limit of zero requests: nothing but a check-only call passes, and no state is
/// kept (there is nothing to count).
pub fn zero_limit_decision(hits: u64) -> Decision {
    Decision {
        allowed: hits == 0,
        limit: 0,
        remaining: 0,
        reset_after: Duration::ZERO,
        retry_after: None,
        by_failure_mode: false,
        lease: None,
    }
}

/// The state one counter keeps, whichever store holds it.
// The sliding window (the default algorithm) is the large one; boxing it would cost the memory
// store an allocation per call, for a few hundred bytes per counter saved on the other two.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    Sliding(sliding_window::SlidingState),
    Bucket(token_bucket::BucketState),
    Fixed(fixed_window::FixedState),
    Leases(concurrency::LeaseState),
}

impl State {
    pub fn empty(algorithm: Algorithm) -> State {
        match algorithm {
            Algorithm::SlidingWindow => State::Sliding(Default::default()),
            Algorithm::TokenBucket => State::Bucket(Default::default()),
            Algorithm::FixedWindow => State::Fixed(Default::default()),
            Algorithm::Concurrency => State::Leases(Default::default()),
        }
    }

    pub fn algorithm(&self) -> Algorithm {
        match self {
            State::Sliding(_) => Algorithm::SlidingWindow,
            State::Bucket(_) => Algorithm::TokenBucket,
            State::Fixed(_) => Algorithm::FixedWindow,
            State::Leases(_) => Algorithm::Concurrency,
        }
    }
}

/// The result of running one check against a state: the decision, and how long the state must
/// be kept (0 = the state is back to empty and can be dropped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub decision: Decision,
    pub keep_for_us: u64,
}

/// Runs one check against `state` (replacing it with an empty state when its algorithm differs),
/// updating it when the hits are admitted.
pub fn apply(state: &mut State, now_us: u64, limit: &Limit, hits: u64) -> Outcome {
    if limit.requests == 0 {
        // The counter stays as it is for when the limit comes back (a reload, gateways' claims
        // that end): forgetting it would hand its spent budget out again.
        return Outcome {
            decision: zero_limit_decision(hits),
            keep_for_us: 0,
        };
    }
    match (limit.algorithm, &mut *state) {
        (Algorithm::SlidingWindow, State::Sliding(s)) => {
            sliding_window::check(s, now_us, limit, hits)
        }
        (Algorithm::TokenBucket, State::Bucket(s)) => token_bucket::check(s, now_us, limit, hits),
        (Algorithm::FixedWindow, State::Fixed(s)) => fixed_window::check(s, now_us, limit, hits),
        (Algorithm::Concurrency, State::Leases(s)) => concurrency::check(s, now_us, limit, hits),
        (algorithm, _) => {
            *state = State::empty(algorithm);
            apply(state, now_us, limit, hits)
        }
    }
}

/// Gives `hits` back to `state`: never below empty, never more than was spent. The decision is
/// always allowed, with what can be spent now.
pub fn refund(state: &mut State, now_us: u64, limit: &Limit, hits: u64) -> Outcome {
    if limit.requests == 0 {
        // Nothing is given back to a counter kept for when the limit comes back.
        return Outcome {
            decision: zero_limit_decision(0),
            keep_for_us: 0,
        };
    }
    match (limit.algorithm, &mut *state) {
        (Algorithm::SlidingWindow, State::Sliding(s)) => {
            sliding_window::refund(s, now_us, limit, hits)
        }
        (Algorithm::TokenBucket, State::Bucket(s)) => token_bucket::refund(s, now_us, limit, hits),
        (Algorithm::FixedWindow, State::Fixed(s)) => fixed_window::refund(s, now_us, limit, hits),
        (Algorithm::Concurrency, State::Leases(s)) => concurrency::refund(s, now_us, limit, hits),
        // A state of another algorithm (a rule changed): nothing of this one was spent.
        (algorithm, _) => {
            *state = State::empty(algorithm);
            apply(state, now_us, limit, 0)
        }
    }
}

/// Charges `hits` that were already consumed: admitted as `apply` admits when they fit, else
/// recorded all the same (the counter goes past its limit, within each algorithm's ceiling) and
/// answered refused, with the wait until a check-only call would pass again.
pub fn charge_post_paid(state: &mut State, now_us: u64, limit: &Limit, hits: u64) -> Outcome {
    // Envoy's hits_addend is 32 bits; the script takes no more.
    let hits = hits.min(u64::from(u32::MAX));
    if limit.requests == 0 {
        return record_at_zero(state, now_us, limit, hits);
    }
    let outcome = apply(state, now_us, limit, hits);
    if outcome.decision.allowed || hits == 0 || limit.requests == 0 {
        return outcome;
    }
    match state {
        State::Sliding(s) => sliding_window::record(s, now_us, limit, hits),
        State::Bucket(s) => token_bucket::record(s, now_us, limit, hits),
        State::Fixed(s) => fixed_window::record(s, now_us, limit, hits),
        // Slots are not a cost consumed: a charge that does not fit takes none.
        State::Leases(_) => outcome,
    }
}

/// Whether a check on a zero limit changes its counter: only post-paid hits on a window
/// (consumption that happened is recorded for when the limit comes back); a token bucket has no
/// rate to record them at, and a charge or a refund leaves the counter as it is.
pub fn records_at_zero(check: &Check) -> bool {
    check.limit.requests == 0
        && check.post_paid
        && !check.refund
        && check.hits > 0
        && check.limit.algorithm != Algorithm::TokenBucket
        && check.limit.algorithm != Algorithm::Concurrency
}

/// Post-paid hits on a zero limit: recorded in a window's counter (moved to now first), answered
/// as a zero limit is; nothing on a token bucket.
fn record_at_zero(state: &mut State, now_us: u64, limit: &Limit, hits: u64) -> Outcome {
    let zero = Outcome {
        decision: zero_limit_decision(hits),
        keep_for_us: 0,
    };
    if hits == 0
        || matches!(
            limit.algorithm,
            Algorithm::TokenBucket | Algorithm::Concurrency
        )
    {
        return zero;
    }
    if state.algorithm() != limit.algorithm {
        *state = State::empty(limit.algorithm);
    }
    let recorded = match state {
        State::Sliding(s) => {
            sliding_window::check(s, now_us, limit, 0);
            sliding_window::record(s, now_us, limit, hits)
        }
        State::Fixed(s) => {
            fixed_window::check(s, now_us, limit, 0);
            fixed_window::record(s, now_us, limit, hits)
        }
        State::Bucket(_) | State::Leases(_) => return zero,
    };
    Outcome {
        keep_for_us: recorded.keep_for_us,
        ..zero
    }
}

/// Runs one check as its flags and the call's mode say: charge, refund, or only look (`commit`
/// false: the state is left as it was and the decision says whether the hits would pass).
pub fn run(state: &mut State, now_us: u64, check: &Check, commit: bool) -> Outcome {
    run_claimed(state, now_us, check, commit, 0)
}

/// `run` for a check whose charge counts `claimed` requests of RLQS grants (`apply_claimed`);
/// refunds and post-paid charges are recorded as they are.
pub fn run_claimed(
    state: &mut State,
    now_us: u64,
    check: &Check,
    commit: bool,
    claimed: u64,
) -> Outcome {
    match (check.refund, commit) {
        (true, true) => refund(state, now_us, &check.limit, check.hits),
        (false, true) if check.post_paid => {
            charge_post_paid_claimed(state, now_us, &check.limit, check.hits, claimed)
        }
        (false, true) => apply_claimed(state, now_us, &check.limit, check.hits, claimed),
        (_, false) => {
            let mut copy = state.clone();
            let tried = apply_claimed(&mut copy, now_us, &check.limit, check.hits, claimed);
            let mut unchanged = state.clone();
            // The state as it is, with the answer the hits would get.
            let mut outcome = apply_claimed(&mut unchanged, now_us, &check.limit, 0, claimed);
            if check.refund || tried.decision.allowed {
                outcome.decision.allowed = true;
                outcome.decision.retry_after = None;
            } else {
                outcome.decision = tried.decision;
            }
            outcome
        }
    }
}

pub(crate) fn us(duration_us: u64) -> Duration {
    Duration::from_micros(duration_us)
}

#[cfg(test)]
mod edge_tests;
#[cfg(test)]
mod model_tests;
