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
//! call already sent carries the deadline of its script call (the earliest of its callers') on
//! Redis' clock, and the script does not run it past that (`RedisClock`, one estimate per node),
//! so a script call held up on the way charges no call answered meanwhile.
//!
//! Consumption is the exception (a call of refunds and post-paid charges only, `Delivery::late`):
//! its caller may be answered, but the counter must still learn of it. Such a call goes in a
//! script call of its own, is sent whatever its caller's deadline, and runs whatever the script's
//! clock says, for up to `LATE_CHARGE_WINDOW`.

use std::sync::Arc;

use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::time::Instant;

use super::clock::RedisClock;
use super::connection::ConnectionSet;
use super::script::KeyReply;
use super::{Route, classify, eval};
use crate::store::StoreError;
use crate::telemetry::Metrics;

#[path = "batch_answer.rs"]
mod answered;
pub(super) use answered::{answer, fail_all, give_up, still_wanted};

/// Most calls in one script call.
pub const MAX_CALLS: usize = 64;
/// Most keys in one script call (one script call should stay well under a millisecond of Redis).
pub const MAX_KEYS: usize = 256;
/// Most calls waiting for a script call; beyond it a call fails at once (failure mode).
pub const MAX_WAITING: usize = 4096;
/// How long a late call (refunds and post-paid charges) is still sent and run after its caller
/// has been answered: a Redis paused or failing over for longer loses it (counted and logged).
pub const LATE_CHARGE_WINDOW: std::time::Duration = std::time::Duration::from_secs(30);

/// How a call is delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery {
    /// Refunds and post-paid charges only: consumption already happened, so the call is sent
    /// and run even after its caller was answered (within `LATE_CHARGE_WINDOW`).
    pub late: bool,
    /// The script may refuse to run the call past its script call's deadline (false for late
    /// calls, and for a test's fixed clock, which Redis' clock says nothing about).
    pub carries_deadline: bool,
    /// Its charges count the RLQS grants' claims (`claims.rs`).
    pub claims: bool,
    /// A give-back, whose deadline is the end of the window it gives back into (milliseconds
    /// away, not a caller's timeout): in a script call of its own, so that no call batched
    /// with it is given up at that deadline.
    pub alone: bool,
    /// How long a refund into a window may still be run (`HeldTo::Nothing` for every other
    /// call).
    pub held_to: HeldTo,
}

/// The time a late refund into a window stops meaning anything, on the node's clock as
/// estimated when it was made (never later than the truth): after it, it is not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HeldTo {
    #[default]
    Nothing,
    /// The end of the fixed window of this many µs it was made in: after it, it would give back
    /// into the next window.
    PeriodEnd(u64),
    /// This many µs (a sliding window's length) after it was made: every hit charged before it
    /// has left the window by then, and it would take back newer ones.
    After(u64),
}

impl HeldTo {
    /// Its deadline on a node's clock, from when the call was made there (`made_us`; 0: not
    /// known, no deadline).
    fn deadline_us(self, made_us: u64) -> u64 {
        match self {
            _ if made_us == 0 => 0,
            HeldTo::Nothing => 0,
            HeldTo::PeriodEnd(period) => made_us - made_us % period + period,
            HeldTo::After(span) => made_us.saturating_add(span),
        }
    }
}

/// One call's part of a batch: its keys, and its arguments as the script reads them per call
/// (clock, deadline, mode, key count, six numbers per key).
pub(super) struct Job {
    pub(super) keys: Vec<String>,
    pub(super) args: Vec<i64>,
    /// When its caller stops waiting.
    pub(super) deadline: Instant,
    /// After it, the call is not sent: its caller's deadline, or for a late call the end of
    /// `LATE_CHARGE_WINDOW`.
    pub(super) send_until: Instant,
    pub(super) delivery: Delivery,
    pub(super) reply: oneshot::Sender<Result<Vec<KeyReply>, StoreError>>,
    /// When it was made (a late refund's period is the one current then).
    pub(super) made: Instant,
}

impl Job {
    /// Whether it is still to be sent: its caller still waits (not past its deadline, not gone),
    /// or it is a late call within its window.
    pub(super) fn wanted(&self, now: Instant) -> bool {
        self.send_until > now && (self.delivery.late || !self.reply.is_closed())
    }
}

/// Queues one call on a dispatcher (`wrap` adds what that dispatcher routes by) and waits for
/// its replies until `deadline`; a full queue fails the call at once. A late call stays queued
/// (and is sent) after its caller stops waiting.
pub(super) async fn submit<T>(
    queue: &mpsc::Sender<T>,
    wrap: impl FnOnce(Job) -> T,
    keys: Vec<String>,
    args: Vec<i64>,
    deadline: Instant,
    delivery: Delivery,
) -> Result<Vec<KeyReply>, StoreError> {
    let budget = deadline.saturating_duration_since(Instant::now());
    let (reply, answer) = oneshot::channel();
    let send_until = if delivery.late {
        deadline.max(Instant::now() + LATE_CHARGE_WINDOW)
    } else {
        deadline
    };
    let job = Job {
        keys,
        args,
        deadline,
        send_until,
        delivery,
        reply,
        made: Instant::now(),
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
/// configured timeout). Every call that carries a deadline carries that one, on Redis' clock as
/// `clock` estimates it: a script call given up at it charges none of its calls later.
pub(super) struct Merged {
    pub(super) keys: Vec<String>,
    pub(super) args: Vec<i64>,
    pub(super) jobs: Vec<(usize, Job)>,
    pub(super) deadline: Instant,
}

/// Where a call's deadline sits in its arguments (after its clock).
const DEADLINE_ARG: usize = 1;

/// Splits jobs into the calls that wait for their callers, the late ones and the give-backs:
/// each group goes in script calls of its own, so that a late call is never given up at another
/// caller's deadline, nor a caller's call at a give-back's (its window's end).
pub(super) fn by_delivery<T>(jobs: Vec<T>, job: impl Fn(&T) -> &Job) -> [Vec<T>; 3] {
    let (alone, rest): (Vec<T>, Vec<T>) = jobs.into_iter().partition(|j| job(j).delivery.alone);
    let (late, waited): (Vec<T>, Vec<T>) = rest.into_iter().partition(|j| job(j).delivery.late);
    [waited, late, alone]
}

pub(super) fn merge(jobs: Vec<Job>, clock: &RedisClock) -> Merged {
    let deadline = jobs
        .iter()
        .map(|j| j.send_until)
        .min()
        .unwrap_or_else(Instant::now);
    let expires_us = jobs
        .iter()
        .filter(|j| j.delivery.carries_deadline)
        .map(|j| j.deadline)
        .min()
        .map_or(0, |at| clock.on_redis(at));
    let mut jobs = jobs;
    for job in &mut jobs {
        if let Some(arg) = job.args.get_mut(DEADLINE_ARG) {
            *arg = if job.delivery.held_to != HeldTo::Nothing {
                i64::try_from(job.delivery.held_to.deadline_us(clock.on_redis(job.made)))
                    .unwrap_or(0)
            } else if job.delivery.carries_deadline {
                i64::try_from(expires_us).unwrap_or(0)
            } else {
                0
            };
        }
    }
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

/// The sending side; cheap to clone. The dispatcher stops when the last clone is dropped.
#[derive(Clone)]
pub struct Batcher {
    jobs: mpsc::Sender<Job>,
}

/// What every script call of a dispatcher shares: the connections, the node's clock as
/// estimated from the replies, the metrics.
struct Node {
    set: Arc<ConnectionSet>,
    clock: RedisClock,
    metrics: Arc<Metrics>,
    /// Replicas that must acknowledge each script call's writes (`send::replicas_acknowledged`);
    /// 0: none.
    wait_replicas: u32,
    /// FCALL, or EVALSHA where Redis refused functions.
    calls: Arc<super::send::ScriptCalls>,
}

impl Batcher {
    /// Starts the dispatcher over `set`, with at most as many script calls in flight as connections.
    /// Each script call's writes acknowledged by `wait_replicas` replicas before its answers
    /// stand (0: not asked).
    pub fn spawn(
        set: Arc<ConnectionSet>,
        connections: usize,
        metrics: Arc<Metrics>,
        wait_replicas: u32,
        calls: Arc<super::send::ScriptCalls>,
    ) -> Batcher {
        let (jobs, queue) = mpsc::channel(MAX_WAITING);
        let node = Arc::new(Node {
            set,
            clock: RedisClock::default(),
            metrics,
            wait_replicas,
            calls,
        });
        tokio::spawn(dispatch(
            node,
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
        delivery: Delivery,
    ) -> Result<Vec<KeyReply>, StoreError> {
        submit(&self.jobs, |job| job, keys, args, deadline, delivery).await
    }
}

async fn dispatch(node: Arc<Node>, mut queue: mpsc::Receiver<Job>, free: Arc<Semaphore>) {
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
        let live = still_wanted(jobs, |j| j, |j| j, now, &node.metrics);
        if live.is_empty() {
            continue;
        }
        let node = node.clone();
        tokio::spawn(async move {
            let [waited, late, alone] = by_delivery(live, |j| j);
            futures_util::future::join3(send(&node, waited), send(&node, late), send(&node, alone))
                .await;
            drop(permit);
        });
    }
}

/// One script call for `jobs` (none: nothing sent); every job gets its replies, or the call's
/// error.
async fn send(node: &Node, jobs: Vec<Job>) {
    let Some(deadline) = jobs.iter().map(|j| j.send_until).min() else {
        return;
    };
    let live = match node.set.get_or_wait(deadline).await {
        Ok(live) => live,
        Err(e) => {
            let jobs = jobs.into_iter().map(|j| (0, j)).collect();
            return fail_all(jobs, e, &node.metrics);
        }
    };
    // Waiting for a connection took time: a call whose caller has gone is not sent.
    let now = Instant::now();
    let jobs = still_wanted(jobs, |j| j, |j| j, now, &node.metrics);
    if jobs.is_empty() {
        return;
    }
    let Merged {
        keys,
        args,
        jobs,
        deadline,
    } = merge(jobs, &node.clock);
    let mut conn = live.conn.clone();
    let budget = deadline.saturating_duration_since(Instant::now());
    let called = tokio::time::timeout_at(
        deadline,
        eval(&mut conn, &node.calls, &keys, &args, &Route::BySlot, false),
    )
    .await;
    match called {
        Ok(Ok(reply)) => {
            live.succeeded();
            let replicas = node.wait_replicas;
            let acknowledged = match replicas {
                0 => Ok(()),
                _ => {
                    let conn = &mut conn;
                    super::send::replicas_acknowledged(replicas, deadline, |wait| async move {
                        wait.query_async(conn).await
                    })
                    .await
                }
            };
            match acknowledged {
                Ok(()) => answer(jobs, &reply, &node.clock, &node.metrics),
                Err(e) => fail_all(jobs, e, &node.metrics),
            }
        }
        Ok(Err(e)) => {
            live.failed(&e);
            fail_all(jobs, classify(&e), &node.metrics);
        }
        Err(_) => {
            live.timed_out();
            fail_all(jobs, StoreError::Timeout(budget), &node.metrics);
        }
    }
}
