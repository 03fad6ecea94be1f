//! Late refunds: a call of refunds and post-paid charges only is delivered even after its caller
//! was answered (`batch::Delivery::late`), up to 30 s later; a refund into a window then gives
//! back only into the period it was made in (a fixed window's window, a sliding window's newest
//! sub-window, from which every refund takes), never into a later one, where it would hand out
//! budget a second time. It must never drop a post-paid charge (that under-counts) nor delay one.

use tokio::time::Instant;

use super::{RedisStore, ScriptClock, batch};
use crate::algorithm::{Algorithm, ChargeMode, Check, Decision, sliding_window};
use crate::store::StoreError;

/// The period a refund belongs to, in µs: a fixed window's window, a sliding window's
/// sub-window; 0 for anything else (a bucket's refund is exact whenever it lands; a charge is
/// never held to a period).
pub(super) fn refund_period_us(check: &Check) -> u64 {
    if !check.refund || check.limit.window_us == 0 {
        return 0;
    }
    match check.limit.algorithm {
        Algorithm::FixedWindow => check.limit.window_us,
        Algorithm::SlidingWindow => sliding_window::sub_window_us(check.limit.window_us),
        _ => 0,
    }
}

/// The answer to a refund that reached Redis after its period: nothing given back (that
/// period's budget came back with its end), the counter's state not read.
pub(super) fn past_its_period(check: &Check) -> Decision {
    Decision {
        allowed: true,
        limit: check.limit.requests,
        remaining: check.limit.requests,
        reset_after: std::time::Duration::ZERO,
        retry_after: None,
        by_failure_mode: false,
        lease: None,
    }
}

impl RedisStore {
    /// `dispatch` of a late call whose refunds each belong to a period (`periods[i]`, 0: none):
    /// each such refund in a call of its own, not run past its period's end; the rest together.
    pub(super) async fn dispatch_in_periods(
        &self,
        checks: &[&Check],
        periods: &[u64],
        deadline: Instant,
        delivery: batch::Delivery,
    ) -> Vec<Result<Vec<u64>, StoreError>> {
        let clock = ScriptClock::RedisTime;
        let mode = ChargeMode::EachAlone;
        let rest: Vec<&Check> = checks
            .iter()
            .zip(periods)
            .filter(|(_, p)| **p == 0)
            .map(|(c, _)| *c)
            .collect();
        let alone = checks
            .iter()
            .zip(periods)
            .filter(|(_, p)| **p > 0)
            .map(|(c, p)| {
                let delivery = batch::Delivery {
                    period_us: *p,
                    ..delivery
                };
                self.dispatch(std::slice::from_ref(c), clock, deadline, mode, delivery)
            });
        let (rest, alone) = futures_util::future::join(
            self.dispatch(&rest, clock, deadline, mode, delivery),
            futures_util::future::join_all(alone),
        )
        .await;
        let (mut rest, mut alone) = (rest.into_iter(), alone.into_iter());
        periods
            .iter()
            .map(|p| {
                let reply = if *p == 0 {
                    rest.next()
                } else {
                    alone.next().and_then(|r| r.into_iter().next())
                };
                reply.unwrap_or_else(|| {
                    Err(StoreError::Protocol(
                        "script answered fewer results than keys".into(),
                    ))
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Limit;

    fn check(algorithm: Algorithm, refund: bool, post_paid: bool) -> Check {
        Check {
            key: "{d|u=1}:60".into(),
            limit: Limit {
                algorithm,
                requests: 10,
                window_us: 60_000_000,
                burst: 10,
            },
            hits: 1,
            refund,
            post_paid,
        }
    }

    #[test]
    fn a_window_refund_belongs_to_its_window_or_sub_window_and_nothing_else_to_a_period() {
        assert_eq!(
            refund_period_us(&check(Algorithm::FixedWindow, true, false)),
            60_000_000
        );
        assert_eq!(
            refund_period_us(&check(Algorithm::SlidingWindow, true, false)),
            sliding_window::sub_window_us(60_000_000)
        );
        assert_eq!(
            refund_period_us(&check(Algorithm::TokenBucket, true, false)),
            0
        );
        assert_eq!(
            refund_period_us(&check(Algorithm::Concurrency, true, false)),
            0
        );
        // Post-paid charges and charges are never held to a period.
        assert_eq!(
            refund_period_us(&check(Algorithm::FixedWindow, false, true)),
            0
        );
        assert_eq!(
            refund_period_us(&check(Algorithm::FixedWindow, false, false)),
            0
        );
    }
}
