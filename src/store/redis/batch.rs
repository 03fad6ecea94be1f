//! Batching across calls, on standalone and Sentinel: the checks of concurrent calls go to Redis
//! together, as one script call, so that the cost of a script call (the round trip, the Lua run,
//! reading TIME) is shared by every decision in it.
//!
//! One dispatcher per store holds at most as many script calls in flight as it has connections
//! (a semaphore; a call goes on whichever live connection the set hands out). A call that finds
//! a permit free goes at once; calls that arrive while every connection is busy wait
//! in a bounded queue and ride the next script call together (at most `MAX_CALLS` calls and
//! `MAX_KEYS` keys each). The script applies the calls in arrival order, each decided on its own
//! with its own mode, under one Redis `TIME`: a batch decides exactly what the same calls sent one
//! by one would. It must never send a call whose caller has given up (its deadline passed while
//! it waited): that would charge a budget for a call already answered by the failure mode. A
//! call already sent carries its deadline on Redis' clock, and the script does not run it past
//! that (`RedisClock`), so a script call held up on the way charges no call answered meanwhile.

use std::sync::Arc;

use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::time::Instant;

use super::connection::ConnectionSet;
use super::script::{self, KeyReply, Replies};
use super::{Route, classify, eval};
use crate::store::StoreError;

/// Most calls in one script call.
pub const MAX_CALLS: usize = 64;
/// Most keys in one script call (one script call should stay well under a millisecond of Redis).
pub const MAX_KEYS: usize = 256;
/// Most calls waiting for a script call; beyond it a call fails at once (failure mode).
pub const MAX_WAITING: usize = 4096;

/// One call's part of a batch: its keys, and its arguments as the script reads them per call
/// (clock, mode, key count, six numbers per key).
pub(super) struct Job {
    pub(super) keys: Vec<String>,
    pub(super) args: Vec<i64>,
    pub(super) deadline: Instant,
    pub(super) reply: oneshot::Sender<Result<Vec<KeyReply>, StoreError>>,
}

impl Job {
    /// Whether its caller still waits (not past its deadline, not gone).
    pub(super) fn wanted(&self, now: Instant) -> bool {
        self.deadline > now && !self.reply.is_closed()
    }
}

/// Queues one call on a dispatcher (`wrap` adds what that dispatcher routes by) and waits for
/// its replies until `deadline`; a full queue fails the call at once.
pub(super) async fn submit<T>(
    queue: &mpsc::Sender<T>,
    wrap: impl FnOnce(Job) -> T,
    keys: Vec<String>,
    args: Vec<i64>,
    deadline: Instant,
) -> Result<Vec<KeyReply>, StoreError> {
    let budget = deadline.saturating_duration_since(Instant::now());
    let (reply, answer) = oneshot::channel();
    let job = Job {
        keys,
        args,
        deadline,
        reply,
    };
    queue.try_send(wrap(job)).map_err(|e| match e {
        mpsc::error::TrySendError::Full(_) => StoreError::Unavailable(
            "too many calls already wait for Redis; this one is not queued".into(),
        ),
        mpsc::error::TrySendError::Closed(_) => {
            StoreError::Unavailable("the Redis dispatcher has stopped".into())
        }
    })?;
    match tokio::time::timeout_at(deadline, answer).await {
        Ok(Ok(replies)) => replies,
        Ok(Err(_)) => Err(StoreError::Unavailable(
            "the Redis dispatcher dropped the call".into(),
        )),
        Err(_) => Err(StoreError::Timeout(budget)),
    }
}

/// The jobs of one script call, merged: every key in order, the arguments with the call count
/// and a zero (no keys carried in the arguments) first, each job with its key count (to check
/// its reply), and the earliest deadline: the script call is given up when its first caller
/// gives up, so that no caller is answered by the failure mode while its call may still be
/// sent or charged after (calls of one batch arrive within a moment of each other, under one
/// configured timeout).
pub(super) struct Merged {
    pub(super) keys: Vec<String>,
    pub(super) args: Vec<i64>,
    pub(super) jobs: Vec<(usize, Job)>,
    pub(super) deadline: Instant,
}

pub(super) fn merge(jobs: Vec<Job>) -> Merged {
    let deadline = jobs
        .iter()
        .map(|j| j.deadline)
        .min()
        .unwrap_or_else(Instant::now);
    let mut keys = Vec::with_capacity(jobs.iter().map(|j| j.keys.len()).sum());
    let mut args = Vec::with_capacity(2 + jobs.iter().map(|j| j.args.len()).sum::<usize>());
    args.push(jobs.len() as i64);
    // No keys carried in the arguments (`eval` carries them there for a batch over slots).
    args.push(0);
    // Each job's key count stays for checking the reply; the keys themselves move.
    let mut jobs: Vec<(usize, Job)> = jobs.into_iter().map(|j| (j.keys.len(), j)).collect();
    for (_, job) in &mut jobs {
        keys.append(&mut job.keys);
        args.extend_from_slice(&job.args);
    }
    Merged {
        keys,
        args,
        jobs,
        deadline,
    }
}

/// Hands each job its part of the script's reply (one entry per call), or an error to all when
/// the reply does not parse or fit.
pub(super) fn answer(jobs: Vec<(usize, Job)>, reply: &redis::Value) {
    let calls: Replies = match script::parse_reply(reply) {
        Ok(calls) => calls,
        Err(e) => return fail_all(jobs, e),
    };
    if calls.len() != jobs.len() {
        let error = StoreError::Protocol(format!(
            "script answered {} calls of {}",
            calls.len(),
            jobs.len()
        ));
        return fail_all(jobs, error);
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
        let _ = job.reply.send(replies);
    }
}

pub(super) fn fail_all(jobs: Vec<(usize, Job)>, error: StoreError) {
    for (_, job) in jobs {
        let _ = job.reply.send(Err(error.clone()));
    }
}

/// The sending side; cheap to clone. The dispatcher stops when the last clone is dropped.
#[derive(Clone)]
pub struct Batcher {
    jobs: mpsc::Sender<Job>,
}

impl Batcher {
    /// Starts the dispatcher over `set`, with at most as many script calls in flight as connections.
    pub fn spawn(set: Arc<ConnectionSet>, connections: usize) -> Batcher {
        let (jobs, queue) = mpsc::channel(MAX_WAITING);
        tokio::spawn(dispatch(
            set,
            queue,
            Arc::new(Semaphore::new(connections.max(1))),
        ));
        Batcher { jobs }
    }

    /// Decides one call (`args` as the script reads one call) in the next script call; its
    /// per-key replies, or why not, by `deadline`.
    pub async fn call(
        &self,
        keys: Vec<String>,
        args: Vec<i64>,
        deadline: Instant,
    ) -> Result<Vec<KeyReply>, StoreError> {
        submit(&self.jobs, |job| job, keys, args, deadline).await
    }
}

async fn dispatch(set: Arc<ConnectionSet>, mut queue: mpsc::Receiver<Job>, free: Arc<Semaphore>) {
    loop {
        // A connection first, then the calls: whatever queued while none was free goes together.
        let Ok(permit) = free.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = queue.recv().await else {
            return;
        };
        let mut keys = first.keys.len();
        let mut jobs = vec![first];
        while jobs.len() < MAX_CALLS && keys < MAX_KEYS {
            match queue.try_recv() {
                Ok(job) => {
                    keys += job.keys.len();
                    jobs.push(job);
                }
                Err(_) => break,
            }
        }
        let now = Instant::now();
        let (live, expired): (Vec<Job>, Vec<Job>) = jobs.into_iter().partition(|j| j.wanted(now));
        // Their callers have answered already (the timeout is theirs to report).
        drop(expired);
        if live.is_empty() {
            continue;
        }
        let set = set.clone();
        tokio::spawn(async move {
            send(&set, live).await;
            drop(permit);
        });
    }
}

/// One script call for `jobs`; every job gets its replies, or the call's error.
async fn send(set: &Arc<ConnectionSet>, jobs: Vec<Job>) {
    let deadline = jobs
        .iter()
        .map(|j| j.deadline)
        .min()
        .unwrap_or_else(Instant::now);
    let live = match set.get_or_wait(deadline).await {
        Ok(live) => live,
        Err(e) => {
            for job in jobs {
                let _ = job.reply.send(Err(e.clone()));
            }
            return;
        }
    };
    // Waiting for a connection took time: a call whose caller has gone is not sent.
    let now = Instant::now();
    let jobs: Vec<Job> = jobs.into_iter().filter(|j| j.wanted(now)).collect();
    if jobs.is_empty() {
        return;
    }
    let Merged {
        keys,
        args,
        jobs,
        deadline,
    } = merge(jobs);
    let mut conn = live.conn.clone();
    let budget = deadline.saturating_duration_since(Instant::now());
    let called = tokio::time::timeout_at(
        deadline,
        eval(&mut conn, &keys, &args, &Route::BySlot, false),
    )
    .await;
    match called {
        Ok(Ok(reply)) => {
            live.succeeded();
            answer(jobs, &reply);
        }
        Ok(Err(e)) => {
            live.failed(&e);
            fail_all(jobs, classify(&e));
        }
        Err(_) => {
            live.timed_out();
            fail_all(jobs, StoreError::Timeout(budget));
        }
    }
}
