//! Two stores by unit, as envoyproxy/ratelimit's REDIS_PERSECOND: every limit whose window is one
//! second is counted in one store (a Redis of its own, sized for the hottest traffic), every other
//! limit in the other. A call's checks go to both at once and come back in order.
//!
//! All or nothing across the two cannot be one atomic step: the per-second checks are charged
//! first (atomically, in their store); only if all passed are the others charged (atomically, in
//! theirs); if those are refused, what the first step admitted is given back (refunds). A call
//! racing this one may meanwhile see the per-second budget a little lower than it ends up: it can
//! be refused where it would have passed, never admitted past a limit. It must never charge the
//! second store for a call the first refused.

use tokio::time::Instant;

use super::{Answers, FactorsFuture, PingFuture, Store, StoreError, StoreFuture, in_call_order};
use crate::algorithm::{Algorithm, ChargeMode, Check};

/// The window of a per-second limit.
const SECOND_US: u64 = 1_000_000;

pub struct SplitStore {
    main: Box<dyn Store>,
    per_second: Box<dyn Store>,
}

impl SplitStore {
    pub fn new(main: Box<dyn Store>, per_second: Box<dyn Store>) -> SplitStore {
        SplitStore { main, per_second }
    }

    async fn run(&self, checks: &[Check], deadline: Instant, mode: ChargeMode) -> Answers {
        let (fast, slow): (Vec<usize>, Vec<usize>) =
            (0..checks.len()).partition(|&i| checks[i].limit.window_us == SECOND_US);
        if fast.is_empty() {
            return self.main.check(checks, deadline, mode).await;
        }
        if slow.is_empty() {
            return self.per_second.check(checks, deadline, mode).await;
        }
        let pick = |indices: &[usize]| -> Vec<Check> {
            indices.iter().map(|&i| checks[i].clone()).collect()
        };
        let (fast_checks, slow_checks) = (pick(&fast), pick(&slow));
        let (fast_answers, slow_answers) = if mode == ChargeMode::AllOrNothing {
            self.all_or_nothing(&fast_checks, &slow_checks, deadline)
                .await
        } else {
            futures_util::future::join(
                self.per_second.check(&fast_checks, deadline, mode),
                self.main.check(&slow_checks, deadline, mode),
            )
            .await
        };
        in_call_order(checks.len(), [(fast, fast_answers), (slow, slow_answers)])
    }

    /// The per-second checks all or nothing, then the others only if those all passed; a
    /// refusal of the others gives back what the first step charged.
    async fn all_or_nothing(
        &self,
        fast: &[Check],
        slow: &[Check],
        deadline: Instant,
    ) -> (Answers, Answers) {
        let refused = |checks: &[Check], answers: &Answers| {
            checks
                .iter()
                .zip(answers)
                .any(|(c, a)| !c.refund && !a.as_ref().is_ok_and(|d| d.allowed))
        };
        let sent_at = Instant::now();
        let first = self
            .per_second
            .check(fast, deadline, ChargeMode::AllOrNothing)
            .await;
        if refused(fast, &first) {
            // Refused (or undecided): the others charge nothing; refunds and post-paid charges
            // still apply, as within one store.
            let second = self.apply_only(slow, deadline).await;
            return (first, second);
        }
        let second = self
            .main
            .check(slow, deadline, ChargeMode::AllOrNothing)
            .await;
        if refused(slow, &second) {
            self.give_back(fast, &first, sent_at, deadline).await;
        }
        (first, second)
    }

    /// Gives back what the first step charged for a call the second refused. A fixed window's
    /// hits go back only into the second they were charged in (`Store::give_back`, until that
    /// window's end as the charge's answer told it, counted from before the charge was sent, so
    /// never later than the truth): after it, the next second must not be credited. The other
    /// algorithms' refunds apply whenever they arrive (a token bucket's is exact at any time; a
    /// sliding window takes from its newest sub-windows, as every refund does).
    async fn give_back(
        &self,
        fast: &[Check],
        charged: &Answers,
        sent_at: Instant,
        deadline: Instant,
    ) {
        let mut fixed = Vec::new();
        let mut other = Vec::new();
        let mut window_ends: Option<Instant> = None;
        for (check, answer) in fast.iter().zip(charged) {
            if check.refund || check.post_paid || check.hits == 0 {
                continue;
            }
            let back = Check {
                refund: true,
                ..check.clone()
            };
            match (check.limit.algorithm, answer) {
                (Algorithm::FixedWindow, Ok(decision)) => {
                    let ends = sent_at + decision.reset_after;
                    window_ends = Some(window_ends.map_or(ends, |w| w.min(ends)));
                    fixed.push(back);
                }
                _ => other.push(back),
            }
        }
        let window_ends = window_ends.unwrap_or(sent_at);
        let (fixed_answers, other_answers) = futures_util::future::join(
            self.per_second.give_back(&fixed, window_ends),
            self.per_second
                .check(&other, deadline, ChargeMode::EachAlone),
        )
        .await;
        for answer in fixed_answers {
            match answer {
                Err(error) if Instant::now() < window_ends => tracing::warn!(
                    %error,
                    "a per-second charge of a refused call could not be given back"
                ),
                // Its second is over: that budget came back with the next second.
                Err(error) => tracing::debug!(%error, "a give-back missed its second"),
                Ok(_) => {}
            }
        }
        for error in other_answers.into_iter().filter_map(Result::err) {
            tracing::warn!(%error, "a per-second charge of a refused call could not be given back");
        }
    }

    /// Refunds and post-paid charges applied, the other checks only looked at.
    async fn apply_only(&self, checks: &[Check], deadline: Instant) -> Answers {
        let applies = |c: &Check| c.refund || c.post_paid;
        let (applied, looked): (Vec<usize>, Vec<usize>) =
            (0..checks.len()).partition(|&i| applies(&checks[i]));
        let pick = |indices: &[usize]| -> Vec<Check> {
            indices.iter().map(|&i| checks[i].clone()).collect()
        };
        let (a, l) = futures_util::future::join(
            self.main
                .check(&pick(&applied), deadline, ChargeMode::EachAlone),
            self.main.check(&pick(&looked), deadline, ChargeMode::Probe),
        )
        .await;
        in_call_order(checks.len(), [(applied, a), (looked, l)])
    }
}

impl Store for SplitStore {
    fn check<'a>(
        &'a self,
        checks: &'a [Check],
        deadline: Instant,
        mode: ChargeMode,
    ) -> StoreFuture<'a> {
        Box::pin(self.run(checks, deadline, mode))
    }

    fn name(&self) -> &'static str {
        self.main.name()
    }

    /// Ready only when both answer: a per-second limit is as much a limit as any.
    fn ping(&self, deadline: Instant) -> PingFuture<'_> {
        Box::pin(async move {
            let (main, per_second) = futures_util::future::join(
                self.main.ping(deadline),
                self.per_second.ping(deadline),
            )
            .await;
            main?;
            per_second.map_err(|e| match e {
                StoreError::Unavailable(m) => {
                    StoreError::Unavailable(format!("the per-second Redis: {m}"))
                }
                StoreError::Permanent(m) => {
                    StoreError::Permanent(format!("the per-second Redis: {m}"))
                }
                other => other,
            })
        })
    }

    /// Scaling factors live in the main store only.
    fn load_factors(&self, deadline: Instant) -> FactorsFuture<'_> {
        self.main.load_factors(deadline)
    }

    fn save_factor<'a>(
        &'a self,
        field: &'a str,
        factor: f64,
        ttl_ms: u64,
        deadline: Instant,
    ) -> PingFuture<'a> {
        self.main.save_factor(field, factor, ttl_ms, deadline)
    }
}
