//! Batching across calls on Cluster, per node: the checks of concurrent calls whose keys live on
//! one master go to Redis together, as one script call, so that a hot key costs one script call
//! per batch instead of one per call, and distinct keys share script calls too.
//!
//! One lane per master (per slot while the node map is unknown) with at most one script call in
//! flight: a check for an idle lane goes at once; checks arriving while their lane's call is in
//! flight wait in it and ride the next call together (at most `MAX_CALLS` calls and `MAX_KEYS`
//! keys; at most `MAX_WAITING_PER_NODE` waiting in a lane and `MAX_WAITING` over all lanes, beyond
//! which a call fails at once to its failure mode: a slow master fails its own calls only). A batch of one slot declares its keys and follows MOVED and ASK as one check
//! would. A batch over several slots declares only its first key (Redis refuses declared keys of
//! several slots) and carries the rest in its arguments; the script checks each is its node's
//! (and not half migrated away) before it reads or writes anything, and answers TRYAGAIN when one
//! is not: the batch then goes again as its calls, one by one, and the map is read again. The
//! script applies the calls in arrival order, each on its own, under one Redis `TIME`. Each lane
//! keeps its own estimate of its node's clock (nodes' clocks differ), which the deadlines it
//! carries are put on. Late calls (refunds and post-paid charges: `batch::Delivery`) go in script
//! calls of their own, sent whatever their callers' deadlines. It must never send a check whose
//! caller gave up (a late call excepted), nor send again a batch that may have run.

use redis::cluster_async::ClusterConnection;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use tokio::sync::{Notify, mpsc, watch};
use tokio::time::Instant;

use super::batch::{
    Delivery, Job, MAX_CALLS, MAX_KEYS, Merged, answer, by_delivery, fail_all, give_up, merge,
    still_wanted, submit,
};
use super::clock::RedisClock;
pub use super::cluster_map::slot_of;
use super::cluster_map::{NodeMap, keep_node_map};
use super::errors::{classify, did_not_run, is_tryagain};
use super::script::KeyReply;
use super::send::{Route, Spread, eval_on_cluster};
use crate::store::StoreError;
use crate::telemetry::Metrics;

/// Most calls waiting for one node (one lane): a slow master fills its own lane, beyond which
/// its calls fail at once to their failure mode, while the other nodes' calls go on.
pub const MAX_WAITING_PER_NODE: usize = 2048;
/// Most calls waiting over all lanes (a bound on memory while the node map is unknown and
/// lanes are per slot).
pub const MAX_WAITING: usize = 16384;

/// The sending side; cheap to clone. The dispatcher stops when the last clone is dropped.
#[derive(Clone)]
pub struct NodeBatcher {
    jobs: mpsc::Sender<(u16, Job)>,
    map: watch::Receiver<Option<Arc<NodeMap>>>,
}

#[derive(Default)]
struct Lane {
    waiting: VecDeque<(u16, Job)>,
    busy: bool,
}

impl NodeBatcher {
    /// `wait_replicas`: replicas that must acknowledge each script call's writes (0: none).
    pub fn spawn(
        cluster: ClusterConnection,
        metrics: Arc<Metrics>,
        wait_replicas: u32,
        calls: Arc<super::send::ScriptCalls>,
    ) -> NodeBatcher {
        let (jobs, queue) = mpsc::channel(MAX_WAITING);
        let (maps, map) = watch::channel(None);
        let stale = Arc::new(Notify::new());
        tokio::spawn(keep_node_map(cluster.clone(), maps, stale.clone()));
        let shared = Shared {
            cluster,
            stale,
            metrics,
            wait_replicas,
            calls,
        };
        tokio::spawn(dispatch(shared, queue, map.clone()));
        NodeBatcher { jobs, map }
    }

    /// Decides one call (`keys` all in `slot`, `args` as the script reads one call) in the next
    /// script call of that slot's node (or of the slot, while the node map is unknown); its
    /// per-key replies, or why not, by `deadline`.
    pub async fn call(
        &self,
        slot: u16,
        keys: Vec<String>,
        args: Vec<i64>,
        deadline: Instant,
        delivery: Delivery,
    ) -> Result<Vec<KeyReply>, StoreError> {
        submit(
            &self.jobs,
            |job| (slot, job),
            keys,
            args,
            deadline,
            delivery,
        )
        .await
    }

    /// Whether calls are batched per node (the node map is read), rather than per slot.
    pub fn by_node(&self) -> bool {
        self.map.borrow().is_some()
    }
}

/// What every script call of the dispatcher uses.
#[derive(Clone)]
struct Shared {
    cluster: ClusterConnection,
    /// Told when a batch found the node map stale.
    stale: Arc<Notify>,
    metrics: Arc<Metrics>,
    /// Replicas that must acknowledge each script call's writes (`send::replicas_acknowledged`);
    /// 0: none.
    wait_replicas: u32,
    /// FCALL, or EVALSHA where Redis refused functions.
    calls: Arc<super::send::ScriptCalls>,
}

async fn dispatch(
    shared: Shared,
    mut queue: mpsc::Receiver<(u16, Job)>,
    map: watch::Receiver<Option<Arc<NodeMap>>>,
) {
    let mut lanes: HashMap<u32, Lane> = HashMap::new();
    // Each lane's estimate of its node's clock; kept while the lane comes and goes (bounded by
    // the lanes there can be: a node's or a slot's).
    let mut clocks: HashMap<u32, Arc<RedisClock>> = HashMap::new();
    let mut waiting = 0usize;
    // Lanes whose script call ended; at most one message per lane in flight.
    let (done_tx, mut done) = mpsc::unbounded_channel::<u32>();
    loop {
        tokio::select! {
            next = queue.recv() => {
                let Some((slot, job)) = next else { return };
                let id = map.borrow().as_ref().map_or(u32::from(slot), |m| m.lane(slot));
                let lane = lanes.entry(id).or_default();
                if !lane.busy {
                    lane.busy = true;
                    let clock = clocks.entry(id).or_default().clone();
                    spawn_call(&shared, id, vec![(slot, job)], &done_tx, clock);
                } else if lane.waiting.len() < MAX_WAITING_PER_NODE && waiting < MAX_WAITING {
                    lane.waiting.push_back((slot, job));
                    waiting += 1;
                } else {
                    let _ = job.reply.send(Err(StoreError::Unavailable(format!(
                        "{} calls already wait for this Redis node ({waiting} for all); this one \
                         is not queued",
                        lane.waiting.len()
                    ))));
                }
            }
            Some(id) = done.recv() => {
                let Some(lane) = lanes.get_mut(&id) else { continue };
                let now = Instant::now();
                let mut batch = Vec::new();
                let mut keys = 0;
                while batch.len() < MAX_CALLS && keys < MAX_KEYS {
                    let Some((slot, job)) = lane.waiting.pop_front() else { break };
                    waiting -= 1;
                    if !job.wanted(now) {
                        give_up(vec![job], &shared.metrics);
                        continue;
                    }
                    keys += job.keys.len();
                    batch.push((slot, job));
                }
                if batch.is_empty() {
                    lane.busy = false;
                    if lane.waiting.is_empty() {
                        lanes.remove(&id);
                    }
                } else {
                    let clock = clocks.entry(id).or_default().clone();
                    spawn_call(&shared, id, batch, &done_tx, clock);
                }
            }
        }
    }
}

fn spawn_call(
    shared: &Shared,
    lane: u32,
    jobs: Vec<(u16, Job)>,
    done: &mpsc::UnboundedSender<u32>,
    clock: Arc<RedisClock>,
) {
    let shared = shared.clone();
    // The lane is freed when the call ends, even by a panic (the guard is dropped while the
    // task unwinds; the jobs' callers then see their reply dropped): a lane never stays busy.
    let freed = LaneFreed {
        lane,
        done: done.clone(),
    };
    tokio::spawn(async move {
        let _freed = freed;
        let [waited, late, alone] = by_delivery(jobs, |(_, j)| j);
        futures_util::future::join3(
            send(&shared, waited, &clock),
            send(&shared, late, &clock),
            send(&shared, alone, &clock),
        )
        .await;
    });
}

/// Tells the dispatcher a lane's script call has ended, when dropped.
struct LaneFreed {
    lane: u32,
    done: mpsc::UnboundedSender<u32>,
}

impl Drop for LaneFreed {
    fn drop(&mut self) {
        let _ = self.done.send(self.lane);
    }
}

/// Whether the replicas asked for acknowledged what the node that ran a script call (`ran`, with
/// its first key) wrote last on this connection (`send::replicas_acknowledged`; 0 asked:
/// nothing sent).
async fn replicated(
    shared: &Shared,
    ran: &Route,
    key: &str,
    deadline: Instant,
) -> Result<(), StoreError> {
    if shared.wait_replicas == 0 {
        return Ok(());
    }
    let to = ran.node_of(key);
    let mut conn = shared.cluster.clone();
    super::send::replicas_acknowledged(shared.wait_replicas, deadline, |wait| async move {
        conn.route_command(wait, to).await
    })
    .await
}

/// One script call for `jobs`; every job gets its replies, or the call's error. A batch that
/// comes back unrun (a slot half migrated, or moved since the node map was read) goes again as
/// its calls, one script call each.
async fn send(shared: &Shared, jobs: Vec<(u16, Job)>, clock: &RedisClock) {
    // A call whose caller has answered already (its deadline passed while a split batch went
    // call by call) is not sent.
    let now = Instant::now();
    let jobs = still_wanted(jobs, |(_, j)| j, |(_, j)| j, now, &shared.metrics);
    if jobs.is_empty() {
        return;
    }
    let spread = match jobs.as_slice() {
        [_] => Spread::OneCall,
        [(first, _), rest @ ..] if rest.iter().any(|(slot, _)| slot != first) => {
            Spread::SeveralSlots
        }
        _ => Spread::CallsOfOneSlot,
    };
    let Merged {
        mut keys,
        args,
        jobs,
        deadline,
    } = merge(jobs.into_iter().map(|(_, job)| job).collect(), clock);
    let budget = deadline.saturating_duration_since(Instant::now());
    let mut conn = shared.cluster.clone();
    let called = tokio::time::timeout_at(
        deadline,
        eval_on_cluster(&mut conn, &shared.calls, &keys, &args, spread),
    )
    .await;
    match called {
        Ok(Err(e))
            if (spread == Spread::CallsOfOneSlot && is_tryagain(&e))
                || (spread == Spread::SeveralSlots && did_not_run(&e)) =>
        {
            if spread == Spread::SeveralSlots {
                tracing::debug!(error = %e, "a batch over several slots did not run: its calls go one by one");
                shared.stale.notify_one();
            }
            // The script did not run: each call goes on its own (its keys were moved back in).
            let singles = jobs.into_iter().map(|(count, mut job)| {
                job.keys = keys.drain(..count).collect();
                let slot = slot_of(&job.keys[0]);
                async move { Box::pin(send(shared, vec![(slot, job)], clock)).await }
            });
            futures_util::future::join_all(singles).await;
        }
        Ok(Ok((reply, ran))) => match replicated(shared, &ran, &keys[0], deadline).await {
            Ok(()) => answer(jobs, &reply, clock, &shared.metrics),
            Err(e) => fail_all(jobs, e, &shared.metrics),
        },
        Ok(Err(e)) => fail_all(jobs, classify(&e), &shared.metrics),
        Err(_) => fail_all(jobs, StoreError::Timeout(budget), &shared.metrics),
    }
}

#[cfg(test)]
mod tests {
    use super::LaneFreed;
    use crate::store::redis::cluster_map::slot_of;

    #[tokio::test]
    async fn a_lane_whose_call_panics_is_freed() {
        let (done, mut freed) = tokio::sync::mpsc::unbounded_channel();
        let guard = LaneFreed { lane: 7, done };
        let task = tokio::spawn(async move {
            let _freed = guard;
            panic!("a bug in a script call");
        });
        assert!(task.await.is_err());
        assert_eq!(freed.recv().await, Some(7));
    }

    #[test]
    fn slots_follow_redis_hash_tags() {
        // Values from CLUSTER KEYSLOT.
        assert_eq!(slot_of("foo"), 12182);
        assert_eq!(slot_of("{user1000}.following"), slot_of("user1000"));
        assert_eq!(slot_of("portcullis:{api|k=v}:sw60:1us"), slot_of("api|k=v"));
        assert_eq!(slot_of("a{}b"), slot_of("a{}b"));
        assert_eq!(slot_of("123456789"), 0x31C3);
    }
}
