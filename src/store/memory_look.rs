//! The memory store's part in a grant's one step (issue 43 item 4): while a grant is made, the
//! counters its rooms were read from are read again with their shards held, so that what an RLS
//! check counts, or another report charges, cannot land between the read and the grant (an RLS
//! check reads the claims with its counters' shards held too). It must never write a counter,
//! and takes the shards (in index order) before the quota table, as every check does.

use super::MemoryStore;
use crate::algorithm::{self, Check, Decision};

impl MemoryStore {
    /// Runs `step` with the counters of `keys` held at `now_us`: `step` is given a reader that
    /// answers a check of one of them as a probe would (nothing written, no claim counted).
    /// A check of another key is answered as on an empty counter.
    pub fn holding<R>(
        &self,
        keys: &[&str],
        now_us: u64,
        step: impl FnOnce(&dyn Fn(&Check) -> Decision) -> R,
    ) -> R {
        let mut indices: Vec<usize> = keys.iter().map(|k| self.shard_index(k)).collect();
        indices.sort_unstable();
        indices.dedup();
        let guards: Vec<_> = indices.iter().map(|&i| self.lock(i)).collect();
        let read = |check: &Check| {
            let mut state = match indices.binary_search(&self.shard_index(&check.key)) {
                Ok(at) => self.state_at(&guards[at], check, now_us),
                Err(_) => algorithm::State::empty(check.limit.algorithm),
            };
            algorithm::run_claimed(&mut state, now_us, check, false, 0).decision
        };
        step(&read)
    }
}
