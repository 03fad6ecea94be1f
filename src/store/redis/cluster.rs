//! The Cluster side of the Redis store: a call's checks grouped by slot (one batch job per slot),
//! and all or nothing across slots in two steps (look, then charge each slot whole). The sending
//! itself, with its re-sends where a script cannot have run, is `send::eval_on_cluster`. It must
//! never charge a slot for a call another slot's look refused.

use futures_util::future::join_all;
use tokio::time::Instant;

use super::batch::Delivery;
use super::script::{self, KeyReply, ScriptClock};
use super::{RedisStore, cluster_batch};
use crate::algorithm::{ChargeMode, Check};
use crate::store::{StoreError, in_call_order};

/// The checks of each slot (by their Redis keys' hash tags), as indices in `checks`: slots in
/// order of first appearance, checks in order within each.
fn by_slot(prefix: &str, checks: &[&Check]) -> Vec<(u16, Vec<usize>)> {
    let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
    let mut index: std::collections::HashMap<u16, usize> = std::collections::HashMap::new();
    let mut key = String::new();
    for (i, check) in checks.iter().enumerate() {
        key.clear();
        key.push_str(prefix);
        key.push_str(&check.key);
        let slot = cluster_batch::slot_of(&key);
        let at = *index.entry(slot).or_insert_with(|| {
            groups.push((slot, Vec::new()));
            groups.len() - 1
        });
        groups[at].1.push(i);
    }
    groups
}

impl RedisStore {
    /// Cluster: the checks of each slot as one call in that slot's next script call (one job per
    /// slot, not per check: a call of many descriptors waits as few jobs), the slots
    /// concurrently, each within the deadline; `mode` is the script's (`script::mode_arg`, or
    /// `script::LOOK_ALL`).
    pub(super) async fn each_slot_on_cluster(
        &self,
        checks: &[&Check],
        clock: ScriptClock,
        deadline: Instant,
        mode: i64,
        delivery: Delivery,
    ) -> Vec<KeyReply> {
        let groups = by_slot(&self.prefix, checks);
        let calls = groups.iter().map(|(slot, members)| {
            let group: Vec<&Check> = members.iter().map(|&i| checks[i]).collect();
            async move {
                match self
                    .eval_slot(*slot, &group, clock, mode, deadline, delivery)
                    .await
                {
                    Ok(values) if values.len() == group.len() => values,
                    Ok(values) => vec![
                        Err(StoreError::Protocol(format!(
                            "script answered {} results for {} keys",
                            values.len(),
                            group.len()
                        )));
                        group.len()
                    ],
                    Err(e) => vec![Err(e); group.len()],
                }
            }
        });
        let answered = join_all(calls).await;
        let parts = groups.into_iter().map(|(_, members)| members).zip(answered);
        in_call_order(checks.len(), parts)
    }

    /// Checks whose keys share `slot`, as one call in the next script call of that slot's node
    /// (`cluster_batch`): concurrent calls on a hot key share script calls.
    pub(super) async fn eval_slot(
        &self,
        slot: u16,
        checks: &[&Check],
        clock: ScriptClock,
        mode: i64,
        deadline: Instant,
        delivery: Delivery,
    ) -> Result<Vec<KeyReply>, StoreError> {
        let Some(batcher) = &self.node_batcher else {
            return Err(StoreError::Protocol("no Cluster dispatcher".into()));
        };
        let (keys, args) = self.encode(checks, clock, mode, delivery.claims);
        batcher.call(slot, keys, args, deadline, delivery).await
    }

    /// Cluster, all or nothing: one script call, atomic, when every key is in one slot (one
    /// descriptor, or the limits of one layered descriptor); else two steps: the call is looked
    /// at (each slot's checks as the script's all-or-nothing look, nothing written), then, only
    /// if every charge would pass, charged (each slot's checks all or nothing). What that
    /// guarantees: a call refused at the first step charges nothing; a call that races another
    /// between the steps may have one slot's checks charged although another slot's are then
    /// refused (never more admitted than a limit; at worst a little less).
    pub(super) async fn all_or_nothing_cluster(
        &self,
        checks: &[&Check],
        clock: ScriptClock,
        deadline: Instant,
        delivery: Delivery,
    ) -> Vec<KeyReply> {
        let all_or_nothing = script::mode_arg(ChargeMode::AllOrNothing);
        if by_slot(&self.prefix, checks).len() <= 1 {
            return self
                .each_slot_on_cluster(checks, clock, deadline, all_or_nothing, delivery)
                .await;
        }
        let looked = self
            .each_slot_on_cluster(checks, clock, deadline, script::LOOK_ALL, delivery)
            .await;
        let all_pass = checks.iter().zip(&looked).all(|(check, answer)| {
            check.refund || answer.as_ref().is_ok_and(|reply| script::allowed(reply))
        });
        if all_pass {
            return self
                .each_slot_on_cluster(checks, clock, deadline, all_or_nothing, delivery)
                .await;
        }
        // Refunds and post-paid charges always apply; the other charges answer what the look
        // found.
        let applies = |c: &&Check| c.refund || c.post_paid;
        let to_run: Vec<&Check> = checks.iter().copied().filter(applies).collect();
        let each_alone = script::mode_arg(ChargeMode::EachAlone);
        let mut ran = self
            .each_slot_on_cluster(&to_run, clock, deadline, each_alone, delivery)
            .await
            .into_iter();
        checks
            .iter()
            .zip(looked)
            .map(|(check, looked)| {
                if applies(check) {
                    ran.next().unwrap_or_else(|| {
                        Err(StoreError::Protocol(
                            "a second step answered too little".into(),
                        ))
                    })
                } else {
                    looked
                }
            })
            .collect()
    }
}
