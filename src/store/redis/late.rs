//! Late refunds: a call of refunds and post-paid charges only is delivered even after its caller
//! was answered (`batch::Delivery::late`), up to 30 s later; a refund into a window is then run
//! only while it can still give back its own hits (a fixed window's until the window it was made
//! in ends; a sliding window's for a window after it was made), never into a later window, where
//! it would hand out budget a second time. It must never drop a post-paid charge (that
//! under-counts) nor delay one. A give-back (`Store::give_back`: hits charged a moment ago for
//! a call another store refused) is held the same way, to the window its answer named.

use tokio::time::Instant;

use super::batch::{self, HeldTo};
use super::script;
use super::{RedisStore, ScriptClock};
use crate::algorithm::{Algorithm, ChargeMode, Check, Decision, zero_limit_decision};
use crate::store::Answers;
use crate::store::StoreError;

/// How long a refund may still be run: a fixed window's to the end of the window it was made
/// in; a sliding window's for one window after it was made (it takes from the newest
/// sub-windows, as every refund does; a window later every hit it could give back has left);
/// anything else whenever it lands (a bucket's refund is exact at any time; a charge is never
/// held to a period).
pub(super) fn held_to(check: &Check) -> HeldTo {
    let w = check.limit.window_us;
    if !check.refund || w == 0 {
        return HeldTo::Nothing;
    }
    match check.limit.algorithm {
        Algorithm::FixedWindow => HeldTo::PeriodEnd(w),
        Algorithm::SlidingWindow => HeldTo::After(w),
        _ => HeldTo::Nothing,
    }
}

/// The answer to a refund that reached Redis too late (`held_to`): nothing given back (its
/// window's budget came back with its end), the counter's state not read.
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
    /// `Store::give_back`: the refunds go as an ordinary call whose deadline is the window's end,
    /// which the script holds on Redis' clock (this replica's estimate of it is never later than
    /// the truth): one that reaches Redis after it is not run, so it can only miss its window,
    /// never land in the next.
    pub(super) async fn give_back_until(&self, refunds: &[Check], window_ends: Instant) -> Answers {
        debug_assert!(refunds.iter().all(|c| c.refund));
        let sent = |c: &Check| c.limit.requests > 0;
        let counted: Vec<&Check> = refunds.iter().filter(|c| sent(c)).collect();
        let delivery = batch::Delivery {
            late: false,
            carries_deadline: true,
            // Refunds count no claims.
            claims: false,
            // Its deadline is its window's end, not a caller's timeout.
            alone: true,
            held_to: batch::HeldTo::Nothing,
        };
        let mut replies = self
            .dispatch(
                &counted,
                ScriptClock::RedisTime,
                window_ends,
                ChargeMode::EachAlone,
                delivery,
            )
            .await;
        replies.reverse();
        refunds
            .iter()
            .map(|check| {
                if !sent(check) {
                    return Ok(zero_limit_decision(0));
                }
                let reply = replies.pop().ok_or_else(|| {
                    StoreError::Protocol("script answered fewer results than keys".into())
                })??;
                script::decision(check, &reply, true)
            })
            .collect()
    }

    /// `dispatch` of a late call whose refunds are each held to a time (`held[i]`): each such
    /// refund in a call of its own, not run past it; the rest together.
    pub(super) async fn dispatch_held(
        &self,
        checks: &[&Check],
        held: &[HeldTo],
        deadline: Instant,
        delivery: batch::Delivery,
    ) -> Vec<Result<Vec<u64>, StoreError>> {
        let clock = ScriptClock::RedisTime;
        let mode = ChargeMode::EachAlone;
        let rest: Vec<&Check> = checks
            .iter()
            .zip(held)
            .filter(|(_, h)| **h == HeldTo::Nothing)
            .map(|(c, _)| *c)
            .collect();
        let alone = checks
            .iter()
            .zip(held)
            .filter(|(_, h)| **h != HeldTo::Nothing)
            .map(|(c, h)| {
                let delivery = batch::Delivery {
                    held_to: *h,
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
        held.iter()
            .map(|h| {
                let reply = if *h == HeldTo::Nothing {
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
    fn a_window_refund_is_held_to_its_window_and_nothing_else_is() {
        assert_eq!(
            held_to(&check(Algorithm::FixedWindow, true, false)),
            HeldTo::PeriodEnd(60_000_000)
        );
        assert_eq!(
            held_to(&check(Algorithm::SlidingWindow, true, false)),
            HeldTo::After(60_000_000)
        );
        assert_eq!(
            held_to(&check(Algorithm::TokenBucket, true, false)),
            HeldTo::Nothing
        );
        assert_eq!(
            held_to(&check(Algorithm::Concurrency, true, false)),
            HeldTo::Nothing
        );
        // Post-paid charges and charges are never held.
        assert_eq!(
            held_to(&check(Algorithm::FixedWindow, false, true)),
            HeldTo::Nothing
        );
        assert_eq!(
            held_to(&check(Algorithm::FixedWindow, false, false)),
            HeldTo::Nothing
        );
    }
}
