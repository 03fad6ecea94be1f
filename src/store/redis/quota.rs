//! RLQS grants in Redis, so that every replica on one Redis (standalone, Sentinel or Cluster)
//! shares one rule's rate among all gateways: `lua/quota.lua` runs `algorithm::share::report`'s
//! transition on Redis' clock, one script call for the asks of one report (one per slot on
//! Cluster: a script's keys must share a slot). The holder table it writes (`{tag}:q`) is the
//! one the check script reads for the grants' claims (`lua/claims.lua`), in the counters' slot:
//! no index, no read back. Reports come every few seconds per gateway, so the scripts are sent
//! whole (EVAL). It must never decide on the host clock, nor keep a key without a TTL.

use std::collections::BTreeMap;

use tokio::time::Instant;

use super::RedisStore;
use super::cluster_batch::slot_of;
use super::connection::Backend;
use super::script::ScriptClock;
use crate::algorithm::share::{MAX_HOLDERS, Tokens};
use crate::store::quota::{
    AnnounceFuture, Ask, AskKind, CONTESTED_US, ContestedFuture, DoneFuture, GrantFuture, Grants,
    IN_USE_FOR, IN_USE_SEEN, InUseFuture, MAX_CONTESTED, QuotaStore,
};
use crate::store::{StoreError, in_call_order};

const QUOTA: &str = concat!(
    include_str!("../../../lua/common.lua"),
    include_str!("../../../lua/sliding_packed.lua"),
    include_str!("../../../lua/sliding_hash.lua"),
    include_str!("../../../lua/sliding_window.lua"),
    include_str!("../../../lua/fixed_window.lua"),
    include_str!("../../../lua/claims.lua"),
    include_str!("../../../lua/quota.lua")
);

/// SHA1 of `QUOTA`, the name EVALSHA knows it by.
static QUOTA_SHA: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| redis::Script::new(QUOTA).get_hash().to_owned());

/// The most asks one script call carries.
const MAX_ASKS_PER_CALL: usize = 200;
const CONTEST: &str = include_str!("../../../lua/quota_contest.lua");
const CONTESTED: &str = include_str!("../../../lua/quota_contested.lua");
const IN_USE: &str = include_str!("../../../lua/quota_in_use.lua");
const BLIND: &str = include_str!("../../../lua/quota_blind.lua");

/// One ask's reply from `lua/quota.lua`: tokens per fill, fill seconds, short (1).
type ScriptGrant = (u32, u32, u8);

struct Granted {
    tokens: Option<Tokens>,
    /// The gateway is short of its fair share: its descriptor goes into the contested feed.
    short: bool,
    now_us: i64,
}

impl RedisStore {
    /// The grants of descriptor `tag`.
    fn quota_key(&self, tag: &str) -> String {
        format!("{}{tag}:q", self.prefix)
    }

    /// Whether a replica serves RLQS on this Redis: a flag with a TTL, its own hash tag.
    fn in_use_key(&self) -> String {
        format!("{}{{rlqs-in-use}}", self.prefix)
    }

    /// Whether a replica whose RLS checks cannot count claims uses this Redis (`mark_blind`):
    /// beside the flag, in its hash tag.
    fn blind_key(&self) -> String {
        format!("{}{{rlqs-in-use}}:blind", self.prefix)
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

    /// One script call for `asks` (all in one slot on Cluster).
    async fn grant_group(
        &self,
        asks: &[&Ask],
        clock: ScriptClock,
        deadline: Instant,
    ) -> Result<Vec<Granted>, StoreError> {
        // The number of keys, the keys, and the arguments, as Redis reads them (bytes).
        let mut args: Vec<String> = vec![asks.len().to_string()];
        args.extend(asks.iter().map(|ask| self.quota_key(&ask.key)));
        let mut counters: Vec<String> = Vec::new();
        for ask in asks {
            // RLS demand is a field of its own kind (`r…`): the script counts every replica's
            // together as one holder.
            let holder = if ask.kind == AskKind::Demand {
                format!("r{}", ask.gateway)
            } else {
                ask.gateway.to_string()
            };
            args.extend([
                ask.capacity.to_string(),
                holder,
                ask.demand.to_string(),
                ask.ttl_us.to_string(),
                ask.kind.code().to_string(),
                u8::from(ask.charged).to_string(),
                ask.window_us.to_string(),
                rooms_arg(&ask.rooms, &ask.counters, &self.prefix, &mut counters),
            ]);
        }
        // The rooms' counters (in the asks' slots: each shares its descriptor's hash tag), then
        // the clock and the bound.
        args.extend(counters);
        args.extend([clock.arg().to_string(), MAX_HOLDERS.to_string()]);
        // By its SHA: 43 KB of script (it carries the windows' files) is not resent each call.
        let reply = self
            .query_script(
                &QUOTA_SHA,
                QUOTA,
                |cmd| {
                    cmd.arg(&args);
                },
                deadline,
            )
            .await?;
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
            .map(|(per_fill, every_s, short)| Granted {
                tokens: (per_fill > 0 && every_s > 0).then_some(Tokens { per_fill, every_s }),
                short: short == 1,
                now_us,
            })
            .collect())
    }
}

/// An ask's rooms as `lua/quota.lua` reads them: per window "operation:window us:left:
/// charged:span us:limit:sub-window us:counter" (1 sliding, 3 fixed; `left` signed; the
/// sliding window's sub-window, the fixed window's own length; `counter`, where the room's
/// counter key is among `counters`, from 1, or 0 for none: the room stands as given), joined
/// by ';'. The counter keys (`counters[i]`, with the store's prefix) are pushed to `counters`.
fn rooms_arg(
    rooms: &[crate::algorithm::share::Room],
    keys: &[String],
    prefix: &str,
    counters: &mut Vec<String>,
) -> String {
    let mut out = String::new();
    for (i, r) in rooms.iter().enumerate() {
        let w = r.limit.window_us;
        let (op, sub_us) = match r.limit.algorithm {
            crate::algorithm::Algorithm::SlidingWindow => {
                (1, crate::algorithm::sliding_window::sub_window_us(w))
            }
            crate::algorithm::Algorithm::FixedWindow => (3, w),
            _ => continue,
        };
        let counter = match keys.get(i).filter(|k| !k.is_empty() && w > 0) {
            Some(key) => {
                counters.push(format!("{prefix}{key}"));
                counters.len()
            }
            None => 0,
        };
        if !out.is_empty() {
            out.push(';');
        }
        out.push_str(&format!(
            "{op}:{w}:{}:{}:{}:{}:{sub_us}:{counter}",
            r.left, r.charged, r.span_us, r.limit.requests
        ));
    }
    out
}

impl RedisStore {
    /// `QuotaStore::grant` with the script's clock at `clock`: `ScriptClock::Fixed` for tests
    /// that replay sequences against the memory model (every time compared exactly).
    pub async fn grant_with_clock(
        &self,
        asks: &[Ask],
        clock: ScriptClock,
        deadline: Instant,
    ) -> Grants {
        self.grant_at(asks, clock, deadline).await
    }

    async fn grant_at(&self, asks: &[Ask], clock: ScriptClock, deadline: Instant) -> Grants {
        {
            // A grant's claim is counted by every replica's RLS checks only once each has seen
            // this replica's flag; and the flag must stand as long as the claim may.
            let grants = asks.iter().filter(|a| a.kind == AskKind::Grant);
            for ask in grants.clone() {
                let stand = ask.ttl_us.saturating_add(ask.window_us);
                self.granted_until(std::time::Duration::from_micros(stand));
            }
            if grants.count() > 0
                && let Err(error) = self.settled(deadline).await
            {
                return asks.iter().map(|_| Err(error.clone())).collect();
            }
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
                    (members, self.grant_group(&group, clock, deadline).await)
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
            // A claim longer than the flag stands: the flag set again at once, so that no
            // replica stops counting while the claim stands.
            if self.flag_outlived()
                && let Err(error) = self.announce(deadline).await
            {
                self.metrics.quota.demand_errors.inc();
                if let Some(skipped) = self.quota_log.allow() {
                    tracing::warn!(%error, similar_not_logged = skipped, "RLQS flag not lengthened to its grants' claims: replicas that do not serve RLQS may stop counting them when it ends");
                }
            }
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
                .map(|g| g.map(|g| g.tokens))
                .collect::<Grants>()
        }
    }
}

impl QuotaStore for RedisStore {
    fn grant<'a>(&'a self, asks: &'a [Ask], deadline: Instant) -> GrantFuture<'a> {
        Box::pin(self.grant_at(asks, ScriptClock::RedisTime, deadline))
    }

    fn name(&self) -> &'static str {
        "redis"
    }

    fn announce(&self, deadline: Instant) -> AnnounceFuture<'_> {
        Box::pin(async move {
            let stand = self.claims_stand(IN_USE_FOR);
            let mut cmd = redis::cmd("EVAL");
            cmd.arg(IN_USE)
                .arg(2)
                .arg(self.in_use_key())
                .arg(self.blind_key())
                .arg(u64::try_from(stand.as_millis()).unwrap_or(u64::MAX))
                .arg(IN_USE_SEEN.as_millis() as u64);
            let left = match self.query(cmd, deadline).await? {
                redis::Value::Int(left) => u64::try_from(left).unwrap_or(0),
                redis::Value::BulkString(what) => {
                    return Err(StoreError::Conflict(format!(
                        "a replica with {} counts its per-second limits beside this Redis, where \
                         RLQS claims are not seen (its mark {} stands): RLQS is not served on a \
                         Redis such replicas share; unset that setting on them, or give RLQS a \
                         Redis or key prefix of its own",
                        String::from_utf8_lossy(&what),
                        self.blind_key()
                    )));
                }
                other => {
                    return Err(StoreError::Protocol(format!("RLQS in use: {other:?}")));
                }
            };
            let settled_in = std::time::Duration::from_millis(left);
            self.announced(stand, settled_in);
            Ok(settled_in)
        })
    }

    fn in_use(&self, deadline: Instant) -> InUseFuture<'_> {
        Box::pin(async move {
            let mut cmd = redis::cmd("PTTL");
            cmd.arg(self.in_use_key());
            let left: i64 = redis::from_redis_value(self.query(cmd, deadline).await?)
                .map_err(|e| StoreError::Protocol(format!("RLQS in use: {e}")))?;
            Ok(match left {
                // No flag.
                -2 => None,
                // A flag without a TTL (set by hand): as one that stands its least.
                -1 => Some(IN_USE_FOR),
                ms => Some(std::time::Duration::from_millis(ms.max(0) as u64)),
            })
        })
    }

    fn set_in_use(&self, found: Option<std::time::Duration>) {
        RedisStore::set_in_use(self, found);
    }

    fn mark_blind<'a>(&'a self, what: &'a str, deadline: Instant) -> DoneFuture<'a> {
        Box::pin(async move {
            let mut cmd = redis::cmd("EVAL");
            cmd.arg(BLIND)
                .arg(2)
                .arg(self.in_use_key())
                .arg(self.blind_key())
                .arg(u64::try_from(IN_USE_FOR.as_millis()).unwrap_or(u64::MAX))
                .arg(what);
            let left: i64 = redis::from_redis_value(self.query(cmd, deadline).await?)
                .map_err(|e| StoreError::Protocol(format!("RLQS blind mark: {e}")))?;
            if left == -2 {
                return Ok(());
            }
            Err(StoreError::Conflict(format!(
                "{what} set, and replicas serving RLQS share this Redis (their flag {} stands): \
                 per-second limits counted apart would spend a second's budget their gateways \
                 were granted; unset {what}, or give RLQS a Redis or key prefix of its own",
                self.in_use_key()
            )))
        })
    }

    fn settled(&self, deadline: Instant) -> DoneFuture<'_> {
        Box::pin(RedisStore::settled(self, deadline))
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
}
