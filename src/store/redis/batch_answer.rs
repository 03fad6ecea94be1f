//! How a batched call ends: handed its part of the script's reply, failed with its script call,
//! or given up unsent; a late call (refunds and post-paid charges) whose caller has gone is
//! counted as recorded, lost, or past its period. It must never hand a call another call's
//! replies.

use tokio::time::Instant;

use super::super::clock::RedisClock;
use super::super::script::{self, KeyReply, Replies};
use super::{HeldTo, Job, LATE_CHARGE_WINDOW};
use crate::store::StoreError;
use crate::telemetry::{LogThrottle, Metrics, ResultLabels};

/// Hands each job its part of the script's reply (one entry per call), or an error to all when
/// the reply does not parse or fit; notes the node's clock, which the reply carries.
pub(in crate::store::redis) fn answer(
    jobs: Vec<(usize, Job)>,
    reply: &redis::Value,
    clock: &RedisClock,
    metrics: &Metrics,
) {
    let (redis_now, calls): (Option<u64>, Replies) = match script::parse_reply_with_clock(reply) {
        Ok(parsed) => parsed,
        Err(e) => return fail_all(jobs, e, metrics),
    };
    if let Some(now_us) = redis_now {
        clock.observe(now_us);
    }
    if calls.len() != jobs.len() {
        let error = StoreError::Protocol(format!(
            "script answered {} calls of {}",
            calls.len(),
            jobs.len()
        ));
        return fail_all(jobs, error, metrics);
    }
    for ((count, job), per_key) in jobs.into_iter().zip(calls) {
        let replies = if per_key.len() == count {
            Ok(per_key)
        } else {
            Err(StoreError::Protocol(format!(
                "expected {count} results for a call, got {}",
                per_key.len()
            )))
        };
        deliver(job, replies, metrics);
    }
}

pub(in crate::store::redis) fn fail_all(
    jobs: Vec<(usize, Job)>,
    error: StoreError,
    metrics: &Metrics,
) {
    for (_, job) in jobs {
        deliver(job, Err(error.clone()), metrics);
    }
}

/// Drops the jobs that are no longer to be sent (`Job::wanted` false): a waited call's caller has
/// answered already (the timeout is theirs to report); a late call past its window is counted
/// and logged as lost.
pub(in crate::store::redis) fn give_up(jobs: Vec<Job>, metrics: &Metrics) {
    for job in jobs {
        let error = StoreError::Timeout(LATE_CHARGE_WINDOW);
        deliver(job, Err(error), metrics);
    }
}

/// Keeps the jobs still to be sent at `now`, giving up the others.
pub(in crate::store::redis) fn still_wanted<T>(
    jobs: Vec<T>,
    job: impl Fn(&T) -> &Job,
    into_job: impl Fn(T) -> Job,
    now: Instant,
    metrics: &Metrics,
) -> Vec<T> {
    let (live, gone): (Vec<T>, Vec<T>) = jobs.into_iter().partition(|j| job(j).wanted(now));
    give_up(gone.into_iter().map(into_job).collect(), metrics);
    live
}

/// One failure log a second for late charges that could not be recorded.
static LATE_LOST_LOG: std::sync::LazyLock<LogThrottle> =
    std::sync::LazyLock::new(LogThrottle::default);

/// Hands a job its replies; a late call whose caller has gone is counted (recorded, or lost
/// with the reason logged).
fn deliver(job: Job, replies: Result<Vec<KeyReply>, StoreError>, metrics: &Metrics) {
    if job.delivery.late && job.reply.is_closed() {
        let lost = match &replies {
            Ok(keys) => keys.iter().find_map(|k| k.as_ref().err()).cloned(),
            Err(e) => Some(e.clone()),
        };
        // A late refund that reached Redis after its period: that period's budget is back
        // anyway, and the next must not be credited.
        let past_its_period = job.delivery.held_to != HeldTo::Nothing
            && lost
                .as_ref()
                .is_some_and(super::super::reply::reached_after_its_deadline);
        if past_its_period {
            metrics
                .late_charges
                .get_or_create(&ResultLabels {
                    result: "past_its_period".into(),
                })
                .inc();
            tracing::debug!("a late refund reached Redis after its period: not given back");
            let _ = job.reply.send(replies);
            return;
        }
        let result = if lost.is_some() { "lost" } else { "recorded" };
        metrics
            .late_charges
            .get_or_create(&ResultLabels {
                result: result.into(),
            })
            .inc();
        if let Some(error) = lost
            && let Some(skipped) = LATE_LOST_LOG.allow()
        {
            tracing::warn!(
                %error,
                similar_failures_not_logged = skipped,
                "a refund or post-paid charge answered late could not be recorded in Redis"
            );
        }
    }
    let _ = job.reply.send(replies);
}
