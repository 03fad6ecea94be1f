//! The Redis store: every replica of Portcullis, and every gateway behind them, shares one budget
//! per descriptor. One Lua script call decides checks atomically on the server, reading Redis
//! `TIME` (never the host clock: replicas drift).
//!
//! Standalone and Sentinel: the checks of a call go in one script call, shared with concurrent
//! calls (`batch`). Cluster: a call's checks go as one job per slot, batched per master
//! (`cluster`, `cluster_batch`): a slow node fails only its own checks. A script is sent again
//! only where it cannot have run (`errors::did_not_run`); after an I/O error it may have run, and
//! re-sending it would charge twice. This file holds the store and its path for one call; the
//! seams: `script` (the script's arguments and reply), `send` (EVALSHA/EVAL, routing), `errors`,
//! `clock` (deadlines on a node's clock, kept by each dispatcher), `factors` (scaling factors in
//! Redis), `query` (commands and scripts outside the decision path), `connection`. A call of
//! refunds and post-paid charges only is consumption that has
//! happened: it is delivered late rather than dropped (`batch::Delivery`), a refund into a window
//! only while it can give back its own hits (`late`).

pub mod batch;
mod claims;
mod clock;
mod cluster;
pub mod cluster_batch;
mod cluster_map;
pub mod config;
pub mod connection;
mod errors;
mod factors;
mod late;
mod probe;
mod query;
mod quota;
mod reply;
pub mod script;
mod script_calls;
mod send;

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

pub use clock::RedisClock;
pub use config::{RedisConfig, SentinelAuth, TCP_USER_TIMEOUT, Topology, redact_url};
pub use errors::classify;
pub use script::{Layout, ScriptClock};

use self::connection::Backend;
use self::probe::probe_node;
use self::send::{Route, eval};
use super::{Answers, FactorsFuture, PingFuture, Store, StoreError, StoreFuture};
use crate::algorithm::{ChargeMode, Check, zero_limit_decision};
use crate::telemetry::Metrics;

/// Cheap to clone: the connections are shared.
#[derive(Clone)]
pub struct RedisStore {
    backend: Backend,
    /// Standalone and Sentinel: concurrent calls share script calls.
    batcher: Option<batch::Batcher>,
    /// Cluster: per-slot batching (`cluster_batch`).
    node_batcher: Option<cluster_batch::NodeBatcher>,
    prefix: String,
    /// How new sliding-window keys are stored.
    layout: script::Layout,
    /// Replicas each script call waits for (`--redis-wait-replicas`; 0: none): readiness also
    /// asks whether the user may send WAIT.
    wait_replicas: u32,
    /// For the failures the quota path logs and counts itself (the contested feed).
    metrics: Arc<Metrics>,
    quota_log: Arc<crate::telemetry::LogThrottle>,
    /// Its RLS charges count the grants' claims (read by the script from the holder table in the
    /// counters' slot), and their hits on claimed descriptors are tallied here as RLS demand.
    claims: Arc<claims::ClaimsSwitch>,
    /// FCALL of the library, or EVALSHA where Redis refused functions (shared with the batchers).
    calls: Arc<send::ScriptCalls>,
}

impl RedisStore {
    /// Builds the store; it connects in the background (see `connection`).
    pub fn new(
        config: &RedisConfig,
        key_prefix: &str,
        metrics: Arc<Metrics>,
    ) -> Result<RedisStore, StoreError> {
        let backend = Backend::new(config, metrics.clone())
            .map_err(|e| StoreError::Permanent(format!("the Redis settings cannot work: {e}")))?;
        let calls = Arc::new(send::ScriptCalls::default());
        let batcher = match &backend {
            Backend::Pool(set) => Some(batch::Batcher::spawn(
                set.clone(),
                config.pool_size.max(1) as usize,
                metrics.clone(),
                config.wait_replicas,
                calls.clone(),
            )),
            Backend::Cluster(_) => None,
        };
        let node_batcher = match &backend {
            Backend::Cluster(cluster) => Some(cluster_batch::NodeBatcher::spawn(
                cluster.clone(),
                metrics.clone(),
                config.wait_replicas,
                calls.clone(),
            )),
            Backend::Pool(_) => None,
        };
        Ok(RedisStore {
            backend,
            batcher,
            node_batcher,
            prefix: key_prefix.to_owned(),
            layout: script::Layout::default(),
            wait_replicas: config.wait_replicas,
            metrics,
            quota_log: Arc::default(),
            claims: Arc::default(),
            calls,
        })
    }

    /// New sliding-window keys made in `layout` (every key is read as it is stored).
    pub fn with_layout(mut self, layout: script::Layout) -> Self {
        self.layout = layout;
        self
    }

    /// Whether Cluster calls are batched per node (the node map is read and every node runs
    /// Redis 7 or later) rather than per slot; false on standalone and Sentinel.
    pub fn batches_by_node(&self) -> bool {
        self.node_batcher.as_ref().is_some_and(|b| b.by_node())
    }

    /// The full Redis key of a check.
    pub fn redis_key(&self, check: &Check) -> String {
        // Sized once, no formatting machinery: this runs for every check.
        let mut key = String::with_capacity(self.prefix.len() + check.key.len());
        key.push_str(&self.prefix);
        key.push_str(&check.key);
        key
    }

    /// Runs the checks with the script reading `clock`. Production calls this with
    /// `ScriptClock::RedisTime` only (through `Store::check`); a fixed clock is for tests.
    ///
    /// All or nothing is one script on standalone and Sentinel, and on Cluster when every key
    /// is in one slot (a layered descriptor's limits). Otherwise, on Cluster, the keys of one
    /// call live in different slots, so it is two steps: every charge is first looked at (nothing
    /// written); only if all would pass are they charged, each in its own script. What that
    /// guarantees: a call refused by a descriptor at the first step charges nothing; a call that
    /// races another between the two steps may have some of its descriptors charged although
    /// one of them is then refused (never more admitted than a limit; at worst a little less).
    pub async fn check_with_clock(
        &self,
        checks: &[Check],
        clock: ScriptClock,
        deadline: Instant,
        mode: ChargeMode,
    ) -> Answers {
        // A zero limit refuses all but check-only calls and leaves its counter as it is: no need
        // to ask Redis, except for post-paid hits on a window (recorded for when the limit comes
        // back, `algorithm::records_at_zero`) and in an all-or-nothing call, where a blocked descriptor (refusing hits) goes to
        // the script as a charge that always fails (nothing read or written): the call is then
        // decided in one step, in order, refunds and post-paid charges still applying.
        let sent = |c: &Check| {
            c.limit.requests > 0
                || (mode == ChargeMode::AllOrNothing && !c.refund && c.hits > 0)
                || (mode != ChargeMode::Probe && crate::algorithm::records_at_zero(c))
        };
        let counted: Vec<&Check> = checks.iter().filter(|c| sent(c)).collect();
        // Refunds and post-paid charges only: consumption that happened, delivered even after the
        // caller is answered. All or nothing means nothing for them (each always applies), so
        // such a call is one step on Cluster too.
        let late = mode != ChargeMode::Probe
            && !counted.is_empty()
            && counted.iter().all(|c| c.is_consumption());
        let delivery = batch::Delivery {
            late,
            carries_deadline: !late && clock == ScriptClock::RedisTime,
            claims: self.counting_claims(),
            alone: false,
            held_to: batch::HeldTo::Nothing,
        };
        let mode = if late { ChargeMode::EachAlone } else { mode };
        // A late refund into a window gives back only while its own hits are there.
        let held_to = |c: &Check| match (late, clock) {
            (true, ScriptClock::RedisTime) => late::held_to(c),
            _ => batch::HeldTo::Nothing,
        };
        let held: Vec<batch::HeldTo> = counted.iter().map(|c| held_to(c)).collect();
        let mut replies = if held.iter().all(|h| *h == batch::HeldTo::Nothing) {
            self.dispatch(&counted, clock, deadline, mode, delivery)
                .await
        } else {
            self.dispatch_held(&counted, &held, deadline, delivery)
                .await
        };
        replies.reverse();
        checks
            .iter()
            .map(|check| {
                let reply = if sent(check) {
                    let reply = replies.pop().ok_or_else(|| {
                        StoreError::Protocol("script answered fewer results than keys".into())
                    })?;
                    match reply {
                        Err(e)
                            if held_to(check) != batch::HeldTo::Nothing
                                && reply::reached_after_its_deadline(&e) =>
                        {
                            // Too late on the way: nothing to give back (its window's budget
                            // came back with its end), none given to the next.
                            return Ok(late::past_its_period(check));
                        }
                        reply => Some(reply?),
                    }
                } else {
                    None
                };
                if check.limit.requests == 0 {
                    return Ok(zero_limit_decision(if check.refund {
                        0
                    } else {
                        check.hits
                    }));
                }
                let reply = reply.ok_or_else(|| StoreError::Protocol("no reply".into()))?;
                self.decide(check, reply, mode != ChargeMode::Probe, delivery.claims)
            })
            .collect()
    }

    /// The script replies for `checks` (none of a zero limit), one per check, in order.
    async fn dispatch(
        &self,
        checks: &[&Check],
        clock: ScriptClock,
        deadline: Instant,
        mode: ChargeMode,
        delivery: batch::Delivery,
    ) -> Vec<Result<Vec<u64>, StoreError>> {
        if checks.is_empty() {
            return Vec::new();
        }
        match &self.backend {
            Backend::Pool(_) => {
                self.eval_pooled(checks, clock, deadline, mode, delivery)
                    .await
            }
            Backend::Cluster(_) => match mode {
                ChargeMode::AllOrNothing => {
                    self.all_or_nothing_cluster(checks, clock, deadline, delivery)
                        .await
                }
                mode => {
                    let mode = script::mode_arg(mode);
                    self.each_slot_on_cluster(checks, clock, deadline, mode, delivery)
                        .await
                }
            },
        }
    }

    /// Standalone and Sentinel: every check of the call in one script call, shared with the
    /// calls that wait at the same time (`batch`).
    async fn eval_pooled(
        &self,
        checks: &[&Check],
        clock: ScriptClock,
        deadline: Instant,
        mode: ChargeMode,
        delivery: batch::Delivery,
    ) -> Vec<Result<Vec<u64>, StoreError>> {
        if checks.is_empty() {
            return Vec::new();
        }
        let Some(batcher) = &self.batcher else {
            return vec![Err(StoreError::Protocol("no dispatcher".into())); checks.len()];
        };
        let (keys, args) = self.encode(checks, clock, script::mode_arg(mode), delivery.claims);
        match batcher.call(keys, args, deadline, delivery).await {
            Ok(values) => values,
            Err(e) => vec![Err(e); checks.len()],
        }
    }

    /// One call's keys and arguments as the script reads a call: clock, deadline (filled in by
    /// the dispatcher, on the clock of the node it goes to), mode, key count, then six numbers
    /// per key.
    fn encode(
        &self,
        checks: &[&Check],
        clock: ScriptClock,
        mode: i64,
        claims: bool,
    ) -> (Vec<String>, Vec<i64>) {
        let keys: Vec<String> = checks.iter().map(|c| self.redis_key(c)).collect();
        let mut args: Vec<i64> = Vec::with_capacity(4 + checks.len() * script::ARGS_PER_KEY);
        script::push_call(checks, clock, 0, mode, &mut args);
        if self.layout == script::Layout::Hash {
            script::prefer_hash_layout(&mut args);
        }
        if claims {
            script::count_claims(&mut args, checks);
        }
        (keys, args)
    }

    /// Waits up to `timeout` for Redis to be usable and says what it is (version), or why not;
    /// loads the script on the way (NOPERM for scripting shows here). For the start-up log.
    pub async fn probe(&self, timeout: Duration) -> Result<String, StoreError> {
        let deadline = Instant::now() + timeout;
        let info: Result<String, StoreError> = match &self.backend {
            Backend::Pool(set) => {
                // The first connect happens in the background: wait for it, or its failure.
                loop {
                    if set.any_live() {
                        break;
                    }
                    if let Some(e) = set.last_error().filter(|e| e.is_permanent()) {
                        return Err(e);
                    }
                    if Instant::now() >= deadline {
                        return Err(set.last_error().unwrap_or(StoreError::Timeout(timeout)));
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                let mut conn = set.get()?.conn.clone();
                probe_node(&mut conn, deadline, timeout).await
            }
            Backend::Cluster(cluster) => {
                let mut conn = cluster.clone();
                probe_node(&mut conn, deadline, timeout).await
            }
        };
        info
    }
}

impl RedisStore {
    /// Whether this node can serve our calls: the decision script run with no call (not PING:
    /// a Redis that answers but cannot run it, no scripting or an ACL without EVALSHA, is not
    /// ready) and, when calls wait for replicas, `WAIT 0 0` (answered at once: none asked), so
    /// that an ACL without WAIT is not ready either.
    async fn serves_calls<C>(&self, conn: &mut C) -> Result<(), redis::RedisError>
    where
        C: redis::aio::ConnectionLike + send::RoutedConn,
    {
        send::run_empty(conn, &self.calls).await?;
        if self.wait_replicas == 0 {
            return Ok(());
        }
        redis::cmd("WAIT")
            .arg(0)
            .arg(0)
            .query_async::<redis::Value>(conn)
            .await
            .map(drop)
    }
}

impl Store for RedisStore {
    fn load_factors(&self, deadline: Instant) -> FactorsFuture<'_> {
        Box::pin(self.load_shared_factors(deadline))
    }

    fn save_factor<'a>(
        &'a self,
        field: &'a str,
        factor: f64,
        ttl_ms: u64,
        deadline: Instant,
    ) -> PingFuture<'a> {
        Box::pin(self.save_shared_factor(field, factor, ttl_ms, deadline))
    }

    fn check<'a>(
        &'a self,
        checks: &'a [Check],
        deadline: Instant,
        mode: ChargeMode,
    ) -> StoreFuture<'a> {
        Box::pin(self.check_with_clock(checks, ScriptClock::RedisTime, deadline, mode))
    }

    fn give_back<'a>(&'a self, refunds: &'a [Check], window_ends: Instant) -> StoreFuture<'a> {
        Box::pin(self.give_back_until(refunds, window_ends))
    }

    fn name(&self) -> &'static str {
        "redis"
    }

    fn ping(&self, deadline: Instant) -> PingFuture<'_> {
        Box::pin(async move {
            let budget = deadline.saturating_duration_since(Instant::now());
            let pinged = match &self.backend {
                Backend::Pool(set) => {
                    let mut conn = set.get_or_wait(deadline).await?.conn.clone();
                    tokio::time::timeout_at(deadline, self.serves_calls(&mut conn)).await
                }
                Backend::Cluster(cluster) => {
                    let mut conn = cluster.clone();
                    tokio::time::timeout_at(deadline, self.serves_calls(&mut conn)).await
                }
            };
            match pinged {
                Ok(result) => result.map_err(|e| classify(&e)),
                Err(_) => Err(StoreError::Timeout(budget)),
            }
        })
    }
}
