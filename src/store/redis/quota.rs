//! RLQS grants in Redis, so that every replica on one Redis (standalone, Sentinel or Cluster)
//! shares one rule's rate among all gateways: `lua/quota.lua` runs `algorithm::share::report`'s
//! transition on Redis' clock, one script call for the asks of one report (one per slot on
//! Cluster: a script's keys must share a slot). What the live grants hold on each descriptor then
//! goes into one index (`lua/quota_index.lua`) that every replica reads back each second for its
//! RLS path. Reports come every few seconds per gateway, so the scripts are sent whole (EVAL). It
//! must never decide on the host clock, nor keep a key without a TTL.

use std::collections::BTreeMap;

use tokio::time::Instant;

use super::RedisStore;
use super::cluster_batch::slot_of;
use super::connection::Backend;
use crate::algorithm::share::{MAX_HOLDERS, Tokens};
use crate::store::quota::{
    Ask, AskKind, CONTESTED_US, ContestedFuture, GrantFuture, Grants, MAX_CONTESTED,
    MAX_QUOTA_KEYS, QuotaStore, Reservations, ReservationsFuture,
};
use crate::store::{StoreError, in_call_order};

const QUOTA: &str = include_str!("../../../lua/quota.lua");

/// The most asks one script call carries.
const MAX_ASKS_PER_CALL: usize = 200;
const INDEX: &str = include_str!("../../../lua/quota_index.lua");
const RESERVED: &str = include_str!("../../../lua/quota_reserved.lua");
const CONTEST: &str = include_str!("../../../lua/quota_contest.lua");
const CONTESTED: &str = include_str!("../../../lua/quota_contested.lua");

/// Entries one page of the reservation index reads (HSCAN's COUNT): a few milliseconds of Redis.
const RESERVED_PAGE: usize = 1_000;

/// The most pages one read takes: the index's bound four times over (HSCAN's COUNT is a hint).
const MAX_RESERVED_PAGES: usize = 4 * MAX_QUOTA_KEYS / RESERVED_PAGE;

/// One descriptor's grants after a report: the reporting gateway's grant, what all live grants
/// hold (per second), when the longest ends and the clock they were computed on (µs).
/// One ask's reply from `lua/quota.lua`: tokens per fill, fill seconds, what the live grants
/// hold, when the longest ends, short (1).
type ScriptGrant = (u32, u32, String, i64, u8);

struct Granted {
    tokens: Option<Tokens>,
    /// The gateway is short of its fair share: its descriptor goes into the contested feed.
    short: bool,
    held: String,
    ends_us: i64,
    now_us: i64,
}

impl RedisStore {
    /// The grants of descriptor `tag`.
    fn quota_key(&self, tag: &str) -> String {
        format!("{}{tag}:q", self.prefix)
    }

    /// The contested feed: descriptors scored by until when (ms, Redis' clock) they are
    /// contested. Its own hash tag; short-lived and small (bounded by `MAX_CONTESTED`).
    fn contested_key(&self) -> String {
        format!("{}{{rlqs-contested}}", self.prefix)
    }

    /// Marks `tags` contested until `until_us` (one call; the feed trimmed to its bound).
    async fn contest(
        &self,
        tags: &[&str],
        until_us: i64,
        deadline: Instant,
    ) -> Result<(), StoreError> {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(CONTEST)
            .arg(1)
            .arg(self.contested_key())
            .arg(MAX_CONTESTED)
            .arg(until_us / 1000);
        for tag in tags {
            cmd.arg(*tag);
        }
        self.query(cmd, deadline).await.map(|_| ())
    }

    /// The reservation index: its own hash tag, apart from every counter (theirs hold a `|`).
    fn reserved_key(&self) -> String {
        format!("{}{{rlqs-reserved}}", self.prefix)
    }

    /// One script call for `asks` (all in one slot on Cluster).
    async fn grant_group(
        &self,
        asks: &[&Ask],
        deadline: Instant,
    ) -> Result<Vec<Granted>, StoreError> {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(QUOTA).arg(asks.len());
        for ask in asks {
            cmd.arg(self.quota_key(&ask.key));
        }
        for ask in asks {
            // RLS demand is a field of its own kind (`r…`): the script counts every replica's
            // together as one holder.
            let holder = if ask.kind == AskKind::Demand {
                format!("r{}", ask.gateway)
            } else {
                ask.gateway.to_string()
            };
            cmd.arg(ask.capacity.to_string())
                .arg(holder)
                .arg(ask.demand.to_string())
                .arg(ask.ttl_us)
                .arg(ask.kind.code());
        }
        cmd.arg(MAX_HOLDERS);
        let reply = self.query(cmd, deadline).await?;
        let (now_us, grants): (i64, Vec<ScriptGrant>) = redis::from_redis_value(reply)
            .map_err(|e| StoreError::Protocol(format!("quota script: {e}")))?;
        if grants.len() != asks.len() {
            return Err(StoreError::Protocol(format!(
                "quota script answered {} grants for {} asks",
                grants.len(),
                asks.len()
            )));
        }
        Ok(grants
            .into_iter()
            .map(|(per_fill, every_s, held, ends_us, short)| Granted {
                tokens: (per_fill > 0 && every_s > 0).then_some(Tokens { per_fill, every_s }),
                short: short == 1,
                held,
                ends_us,
                now_us,
            })
            .collect())
    }

    /// Writes what the descriptors' grants hold into the reservation index. A descriptor the
    /// full index cannot take is an error for its ask: RLS elsewhere would not see its grant.
    async fn index(
        &self,
        entries: &[(&str, &Granted)],
        deadline: Instant,
    ) -> Result<(), StoreError> {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(INDEX)
            .arg(1)
            .arg(self.reserved_key())
            .arg(MAX_QUOTA_KEYS);
        for (tag, g) in entries {
            cmd.arg(*tag).arg(&g.held).arg(g.ends_us).arg(g.now_us);
        }
        let full: i64 = redis::from_redis_value(self.query(cmd, deadline).await?)
            .map_err(|e| StoreError::Protocol(format!("quota index: {e}")))?;
        if full > 0 {
            return Err(StoreError::Unavailable(format!(
                "the reservation index holds {MAX_QUOTA_KEYS} descriptors already"
            )));
        }
        Ok(())
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
                    slot_of(&self.quota_key(&ask.key))
                } else {
                    0
                };
                groups.entry(slot).or_default().push(i);
            }
            // A report of thousands of buckets is several script calls of bounded size: none
            // holds Redis for long (RLS calls queue behind a script).
            let calls = groups
                .values()
                .flat_map(|members| members.chunks(MAX_ASKS_PER_CALL))
                .map(|members| async move {
                    let group: Vec<&Ask> = members.iter().map(|i| &asks[*i]).collect();
                    (members, self.grant_group(&group, deadline).await)
                });
            let parts =
                futures_util::future::join_all(calls)
                    .await
                    .into_iter()
                    .map(|(members, result)| {
                        let answers = match result {
                            Ok(grants) => grants.into_iter().map(Ok).collect(),
                            Err(error) => members.iter().map(|_| Err(error.clone())).collect(),
                        };
                        (members.to_vec(), answers)
                    });
            let granted = in_call_order(asks.len(), parts);
            // A grant stands only once RLS on every replica can see it (within a read).
            let entries: Vec<(&str, &Granted)> = asks
                .iter()
                .zip(&granted)
                .filter_map(|(ask, g)| Some((ask.key.as_str(), g.as_ref().ok()?)))
                .collect();
            // Sent together, as the grants were: one after another, a report of 10,000 buckets
            // waited 50 round trips.
            let indexed = futures_util::future::join_all(
                entries
                    .chunks(MAX_ASKS_PER_CALL)
                    .map(|part| self.index(part, deadline)),
            )
            .await
            .into_iter()
            .find(Result::is_err)
            .unwrap_or(Ok(()));
            // Contested descriptors, for every replica's push round; a failure here costs only
            // the push (the shrinking gateways shrink at their next report instead).
            let short: Vec<(&str, i64)> = asks
                .iter()
                .zip(&granted)
                .filter_map(|(ask, g)| {
                    let g = g.as_ref().ok()?;
                    g.short.then_some((ask.key.as_str(), g.now_us))
                })
                .collect();
            if let Some(&(_, now_us)) = short.first() {
                let tags: Vec<&str> = short.iter().map(|(t, _)| *t).collect();
                let until = now_us + i64::try_from(CONTESTED_US).unwrap_or(i64::MAX);
                if let Err(error) = self.contest(&tags, until, deadline).await {
                    self.metrics.quota.push_errors.inc();
                    if let Some(skipped) = self.quota_log.allow() {
                        tracing::warn!(%error, similar_not_logged = skipped, "RLQS contested descriptors not written: gateways short of their share wait for the others' next reports");
                    }
                }
            }
            granted
                .into_iter()
                .map(|g| match (g, &indexed) {
                    (Ok(g), Ok(())) => Ok(g.tokens),
                    (Ok(_), Err(error)) => Err(error.clone()),
                    (Err(error), _) => Err(error),
                })
                .collect::<Grants>()
        })
    }

    fn name(&self) -> &'static str {
        "redis"
    }

    fn contested(&self, deadline: Instant) -> ContestedFuture<'_> {
        Box::pin(async move {
            let mut cmd = redis::cmd("EVAL");
            cmd.arg(CONTESTED)
                .arg(1)
                .arg(self.contested_key())
                .arg(MAX_CONTESTED);
            redis::from_redis_value(self.query(cmd, deadline).await?)
                .map_err(|e| StoreError::Protocol(format!("contested feed: {e}")))
        })
    }

    fn reservations(&self, deadline: Instant) -> ReservationsFuture<'_> {
        Box::pin(async move {
            // Page by page (HSCAN): no script call holds Redis for the whole index. A page may
            // return an entry twice (a rehash in between); the map keeps one.
            let mut held = Reservations::new();
            let mut cursor = "0".to_owned();
            for _ in 0..MAX_RESERVED_PAGES {
                let mut cmd = redis::cmd("EVAL");
                cmd.arg(RESERVED)
                    .arg(1)
                    .arg(self.reserved_key())
                    .arg(&cursor)
                    .arg(RESERVED_PAGE);
                let page: Vec<String> =
                    redis::from_redis_value(self.query(cmd, deadline).await?)
                        .map_err(|e| StoreError::Protocol(format!("reservation index: {e}")))?;
                let Some((next, flat)) = page.split_first() else {
                    return Err(StoreError::Protocol(
                        "reservation index: an empty page".into(),
                    ));
                };
                for pair in flat.chunks_exact(2) {
                    if held.len() >= MAX_QUOTA_KEYS {
                        break;
                    }
                    if let Ok(rate) = pair[1].parse::<f64>()
                        && rate.is_finite()
                        && rate > 0.0
                    {
                        held.insert(pair[0].clone(), rate);
                    }
                }
                if next == "0" {
                    return Ok(held);
                }
                cursor = next.clone();
            }
            Err(StoreError::Protocol(format!(
                "reservation index: not read through in {MAX_RESERVED_PAGES} pages"
            )))
        })
    }
}
