//! RLQS grants in Redis, so that every replica on one Redis (standalone, Sentinel or Cluster)
//! shares one rule's rate among all gateways: `lua/quota.lua` runs `algorithm::share::report`'s
//! transition on Redis' clock, one script call for the asks of one report (one per slot on
//! Cluster: a script's keys must share a slot). Reports come every few seconds per gateway, so
//! the script is sent whole (EVAL). It must never decide on the host clock, nor keep a key
//! without a TTL.

use std::collections::BTreeMap;

use redis::Value;
use tokio::time::Instant;

use super::RedisStore;
use super::cluster_batch::slot_of;
use super::connection::Backend;
use super::errors::classify;
use crate::algorithm::share::{MAX_HOLDERS, Tokens};
use crate::store::StoreError;
use crate::store::quota::{Ask, GrantFuture, Grants, QuotaStore};

const QUOTA: &str = include_str!("../../../lua/quota.lua");

impl RedisStore {
    /// One script call for `asks` (all in one slot on Cluster).
    async fn grant_group(
        &self,
        asks: &[&Ask],
        deadline: Instant,
    ) -> Result<Vec<Option<Tokens>>, StoreError> {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(QUOTA).arg(asks.len());
        for ask in asks {
            cmd.arg(format!("{}{}", self.prefix, ask.key));
        }
        for ask in asks {
            cmd.arg(ask.capacity.to_string())
                .arg(ask.gateway.to_string())
                .arg(ask.demand.to_string())
                .arg(ask.ttl_us);
        }
        cmd.arg(MAX_HOLDERS);
        let budget = deadline.saturating_duration_since(Instant::now());
        let called = match &self.backend {
            Backend::Pool(set) => {
                let mut conn = set.get_or_wait(deadline).await?.conn.clone();
                tokio::time::timeout_at(deadline, cmd.query_async::<Value>(&mut conn)).await
            }
            Backend::Cluster(cluster) => {
                let mut conn = cluster.clone();
                tokio::time::timeout_at(deadline, cmd.query_async::<Value>(&mut conn)).await
            }
        };
        let reply = match called {
            Ok(result) => result.map_err(|e| classify(&e))?,
            Err(_) => return Err(StoreError::Timeout(budget)),
        };
        let pairs: Vec<(u32, u32)> = redis::from_redis_value(reply)
            .map_err(|e| StoreError::Protocol(format!("quota script: {e}")))?;
        if pairs.len() != asks.len() {
            return Err(StoreError::Protocol(format!(
                "quota script answered {} grants for {} asks",
                pairs.len(),
                asks.len()
            )));
        }
        Ok(pairs
            .into_iter()
            .map(|(per_fill, every_s)| {
                (per_fill > 0 && every_s > 0).then_some(Tokens { per_fill, every_s })
            })
            .collect())
    }
}

impl QuotaStore for RedisStore {
    fn grant<'a>(&'a self, asks: &'a [Ask], deadline: Instant) -> GrantFuture<'a> {
        Box::pin(async move {
            // Cluster: one call per slot. Standalone and Sentinel: one call.
            let cluster = matches!(self.backend, Backend::Cluster(_));
            let mut groups: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
            for (i, ask) in asks.iter().enumerate() {
                let slot = if cluster {
                    slot_of(&format!("{}{}", self.prefix, ask.key))
                } else {
                    0
                };
                groups.entry(slot).or_default().push(i);
            }
            let mut out: Grants = (0..asks.len())
                .map(|_| Err(StoreError::Protocol("not asked".into())))
                .collect();
            let calls = groups.values().map(|members| async move {
                let group: Vec<&Ask> = members.iter().map(|i| &asks[*i]).collect();
                (members, self.grant_group(&group, deadline).await)
            });
            for (members, result) in futures_util::future::join_all(calls).await {
                match result {
                    Ok(grants) => {
                        for (i, grant) in members.iter().zip(grants) {
                            out[*i] = Ok(grant);
                        }
                    }
                    Err(error) => {
                        for i in members {
                            out[*i] = Err(error.clone());
                        }
                    }
                }
            }
            out
        })
    }

    fn name(&self) -> &'static str {
        "redis"
    }
}
