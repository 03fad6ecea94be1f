//! Batching across calls on Cluster, per slot: the checks of concurrent calls whose keys live in
//! one slot (a hot descriptor, the layers of one descriptor) go to Redis together, as one script
//! call, so that a hot key costs one script call per batch instead of one per call.
//!
//! One lane per slot with at most one script call in flight: a check for an idle slot goes at
//! once; checks arriving while their slot's call is in flight wait in its lane and ride the next
//! call together (at most `MAX_CALLS` calls and `MAX_KEYS` keys; at most `MAX_WAITING` waiting
//! over all lanes, beyond which a check fails at once to its failure mode). Keys of one slot are
//! one node's by definition, so no cross-slot script is needed, and MOVED, ASK and TRYAGAIN are
//! handled for the whole call as for one check. The script applies the calls in arrival order,
//! each on its own, under one Redis `TIME`. It must never send a check whose caller gave up.

use std::collections::{HashMap, VecDeque};

use redis::cluster_async::ClusterConnection;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::batch::{
    Job, MAX_CALLS, MAX_KEYS, MAX_WAITING, Merged, answer, fail_all, merge, submit,
};
use super::{classify, eval_on_cluster, is_tryagain};
use crate::store::StoreError;

/// The sending side; cheap to clone. The dispatcher stops when the last clone is dropped.
#[derive(Clone)]
pub struct SlotBatcher {
    jobs: mpsc::Sender<(u16, Job)>,
}

#[derive(Default)]
struct Lane {
    waiting: VecDeque<Job>,
    busy: bool,
}

impl SlotBatcher {
    pub fn spawn(cluster: ClusterConnection) -> SlotBatcher {
        let (jobs, queue) = mpsc::channel(MAX_WAITING);
        tokio::spawn(dispatch(cluster, queue));
        SlotBatcher { jobs }
    }

    /// Decides one call (`keys` all in `slot`, `args` as the script reads one call) in the next
    /// script call of that slot; its per-key replies, or why not, by `deadline`.
    pub async fn call(
        &self,
        slot: u16,
        keys: Vec<String>,
        args: Vec<i64>,
        deadline: Instant,
    ) -> Result<Vec<Vec<u64>>, StoreError> {
        submit(&self.jobs, |job| (slot, job), keys, args, deadline).await
    }
}

async fn dispatch(cluster: ClusterConnection, mut queue: mpsc::Receiver<(u16, Job)>) {
    let mut lanes: HashMap<u16, Lane> = HashMap::new();
    let mut waiting = 0usize;
    // Lanes whose script call ended; at most one message per lane in flight.
    let (done_tx, mut done) = mpsc::unbounded_channel::<u16>();
    loop {
        tokio::select! {
            next = queue.recv() => {
                let Some((slot, job)) = next else { return };
                let lane = lanes.entry(slot).or_default();
                if !lane.busy {
                    lane.busy = true;
                    spawn_call(&cluster, slot, vec![job], &done_tx);
                } else if waiting < MAX_WAITING {
                    lane.waiting.push_back(job);
                    waiting += 1;
                } else {
                    let _ = job.reply.send(Err(StoreError::Unavailable(format!(
                        "{MAX_WAITING} calls already wait for Redis; this one is not queued"
                    ))));
                }
            }
            Some(slot) = done.recv() => {
                let Some(lane) = lanes.get_mut(&slot) else { continue };
                let now = Instant::now();
                let mut batch = Vec::new();
                let mut keys = 0;
                while batch.len() < MAX_CALLS && keys < MAX_KEYS {
                    let Some(job) = lane.waiting.pop_front() else { break };
                    waiting -= 1;
                    // Its caller has answered already (the timeout is theirs to report).
                    if !job.wanted(now) {
                        continue;
                    }
                    keys += job.keys.len();
                    batch.push(job);
                }
                if batch.is_empty() {
                    lane.busy = false;
                    if lane.waiting.is_empty() {
                        lanes.remove(&slot);
                    }
                } else {
                    spawn_call(&cluster, slot, batch, &done_tx);
                }
            }
        }
    }
}

fn spawn_call(
    cluster: &ClusterConnection,
    slot: u16,
    jobs: Vec<Job>,
    done: &mpsc::UnboundedSender<u16>,
) {
    let mut conn = cluster.clone();
    let done = done.clone();
    tokio::spawn(async move {
        send(&mut conn, jobs).await;
        let _ = done.send(slot);
    });
}

/// One script call for `jobs`; every job gets its replies, or the call's error.
async fn send(conn: &mut ClusterConnection, jobs: Vec<Job>) {
    let Merged {
        mut keys,
        args,
        jobs,
        deadline,
    } = merge(jobs);
    let budget = deadline.saturating_duration_since(Instant::now());
    let several = jobs.len() > 1;
    let called =
        tokio::time::timeout_at(deadline, eval_on_cluster(conn, &keys, &args, several)).await;
    match called {
        Ok(Err(e)) if several && is_tryagain(&e) => {
            // The script did not run: each call goes on its own (its keys were moved back in).
            let singles = jobs.into_iter().map(|(count, mut job)| {
                let mut conn = conn.clone();
                job.keys = keys.drain(..count).collect();
                async move { Box::pin(send(&mut conn, vec![job])).await }
            });
            futures_util::future::join_all(singles).await;
        }
        Ok(Ok(reply)) => answer(jobs, &reply),
        Ok(Err(e)) => fail_all(jobs, classify(&e)),
        Err(_) => fail_all(jobs, StoreError::Timeout(budget)),
    }
}

/// Redis Cluster's slot of a key: CRC16 (XMODEM) of its hash tag (or of the whole key when it
/// has none), modulo 16384.
pub fn slot_of(key: &str) -> u16 {
    let hashed = match key.find('{') {
        Some(open) => match key[open + 1..].find('}') {
            Some(len) if len > 0 => &key[open + 1..open + 1 + len],
            _ => key,
        },
        None => key,
    };
    crc16::State::<crc16::XMODEM>::calculate(hashed.as_bytes()) % 16384
}

#[cfg(test)]
mod tests {
    use super::slot_of;

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
