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
use crate::algorithm::{ChargeMode, Check};

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
            let back: Vec<Check> = fast
                .iter()
                .filter(|c| !c.refund && !c.post_paid && c.hits > 0)
                .map(|c| Check {
                    refund: true,
                    ..c.clone()
                })
                .collect();
            for answer in self
                .per_second
                .check(&back, deadline, ChargeMode::EachAlone)
                .await
            {
                if let Err(error) = answer {
                    tracing::warn!(%error, "a per-second charge of a refused call could not be given back");
                }
            }
        }
        (first, second)
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
