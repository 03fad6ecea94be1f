//! The Redis store: every replica of Portcullis, and every gateway behind them, shares one budget
//! per descriptor. One Lua script call decides checks atomically on the server, reading Redis
//! `TIME` (never the host clock: replicas drift).
//!
//! Standalone and Sentinel: all checks of a call go in one script call (one round trip).
//! Cluster: each check's key carries its own hash tag, so checks go out as concurrent script calls,
//! each routed to its key's node and bounded by the deadline on its own: a slow node fails only
//! its own checks. A script is sent again only where it cannot have run (MOVED, ASK, TRYAGAIN and
//! the like, a connection refused); after an I/O error it may have run, and re-sending it would
//! charge twice. Errors are classified (`classify`) so that the operator reads what is wrong.

pub mod batch;
pub mod cluster_batch;
pub mod connection;
pub mod script;

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{ErrorKind, RedisError, ServerErrorKind, Value};
use tokio::time::Instant;

pub use connection::{RedisConfig, SentinelAuth, Topology, redact_url};
use script::KeyReply;
pub use script::ScriptClock;

use self::connection::Backend;
use super::{Answers, FactorsFuture, PingFuture, SharedFactors, Store, StoreError, StoreFuture};
use crate::algorithm::{ChargeMode, Check, zero_limit_decision};
use crate::telemetry::Metrics;

/// Attempts of one check on Cluster (the first and the re-sends where the script did not run).
const CLUSTER_ATTEMPTS: u32 = 4;

/// Cheap to clone: the connections are shared.
#[derive(Clone)]
pub struct RedisStore {
    backend: Backend,
    /// Standalone and Sentinel: concurrent calls share script calls.
    batcher: Option<batch::Batcher>,
    /// Cluster: per-slot batching (`cluster_batch`).
    slot_batcher: Option<cluster_batch::SlotBatcher>,
    prefix: String,
    clock: Arc<RedisClock>,
}

/// This process's estimate of Redis' clock (`TIME`, which every reply carries), so that a call
/// can carry its deadline on Redis' clock: the script does not run a call that reaches it after
/// its caller was answered by the failure mode (a batch that waited, a connection that stalled),
/// which would charge a budget twice under `local`.
///
/// The estimate is Redis' reading minus this process's monotonic clock when the reply arrives:
/// never later than the truth (the reply took time to arrive), so a deadline carried is never
/// later than the caller's. Used only while fresh; a Redis clock that steps (a failover) is
/// caught up by the next reply.
#[derive(Default)]
pub struct RedisClock {
    offset_us: std::sync::atomic::AtomicI64,
    /// When it was last read, on the monotonic clock (µs since `EPOCH`); 0: never.
    read_at_us: std::sync::atomic::AtomicU64,
}

/// The origin of the monotonic microseconds the estimate is kept in.
static EPOCH: std::sync::LazyLock<std::time::Instant> =
    std::sync::LazyLock::new(std::time::Instant::now);

/// How long a reading of Redis' clock is used for.
const CLOCK_FRESH_US: u64 = 10_000_000;

fn monotonic_us(at: std::time::Instant) -> u64 {
    u64::try_from(at.saturating_duration_since(*EPOCH).as_micros()).unwrap_or(u64::MAX)
}

impl RedisClock {
    /// Notes Redis' clock as a reply just read it (`redis_now_us`).
    fn observe(&self, redis_now_us: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        let now = monotonic_us(std::time::Instant::now()).max(1);
        let offset = i64::try_from(redis_now_us).unwrap_or(i64::MAX) - now as i64;
        self.offset_us.store(offset, Relaxed);
        self.read_at_us.store(now, Relaxed);
    }

    /// `deadline` on Redis' clock (µs), or 0 when no fresh reading is at hand.
    fn on_redis(&self, deadline: Instant) -> u64 {
        use std::sync::atomic::Ordering::Relaxed;
        let read_at = self.read_at_us.load(Relaxed);
        let now = monotonic_us(std::time::Instant::now());
        if read_at == 0 || now.saturating_sub(read_at) > CLOCK_FRESH_US {
            return 0;
        }
        let at = monotonic_us(deadline.into_std()) as i64 + self.offset_us.load(Relaxed);
        u64::try_from(at).unwrap_or(0)
    }
}

/// What a Redis error means for the operator.
pub fn classify(error: &RedisError) -> StoreError {
    let text = error.to_string();
    let code = error.code().unwrap_or("");
    match error.kind() {
        ErrorKind::AuthenticationFailed => {
            StoreError::Permanent(format!("authentication failed: {text}"))
        }
        ErrorKind::Server(ServerErrorKind::NoPerm) => StoreError::Permanent(format!(
            "the Redis user lacks a permission Portcullis needs (EVALSHA, EVAL, TIME, the keys \
             under the prefix): {text}"
        )),
        ErrorKind::Server(ServerErrorKind::CrossSlot) => StoreError::Permanent(format!(
            "keys of one script call are in different slots: {text}"
        )),
        ErrorKind::InvalidClientConfig | ErrorKind::RESP3NotSupported => {
            StoreError::Permanent(format!("the Redis settings cannot work: {text}"))
        }
        ErrorKind::Server(
            ServerErrorKind::ReadOnly
            | ServerErrorKind::TryAgain
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::BusyLoading
            | ServerErrorKind::Moved
            | ServerErrorKind::Ask,
        ) => StoreError::Unavailable(text),
        ErrorKind::Parse | ErrorKind::UnexpectedReturnType => StoreError::Protocol(text),
        _ if matches!(code, "WRONGPASS" | "NOAUTH") => {
            StoreError::Permanent(format!("authentication failed: {text}"))
        }
        _ if code == "NOPERM" => StoreError::Permanent(format!("permission denied: {text}")),
        _ if code == "OOM" => StoreError::Unavailable(format!(
            "Redis is out of memory (maxmemory reached, no key can be evicted): {text}"
        )),
        _ if text.contains("unknown command") => StoreError::Permanent(format!(
            "this Redis does not know a command Portcullis needs (too old, or the command is \
             renamed): {text}"
        )),
        _ if is_certificate_error(&text) => StoreError::Permanent(format!(
            "TLS certificate not accepted (check --redis-ca-file and the server's name): {text}"
        )),
        ErrorKind::Server(_) => StoreError::Protocol(text),
        _ => StoreError::Unavailable(text),
    }
}

fn is_certificate_error(text: &str) -> bool {
    let lower = text.to_ascii_lowercase();
    lower.contains("certificate") || lower.contains("unknownissuer")
}

/// Whether a failed attempt certainly did not run the script (so sending it again is safe).
fn did_not_run(error: &RedisError) -> bool {
    matches!(
        error.kind(),
        ErrorKind::Server(
            ServerErrorKind::Moved
                | ServerErrorKind::Ask
                | ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::MasterDown
                | ServerErrorKind::BusyLoading
                // On a demoted master the script stops at its first write: nothing written.
                | ServerErrorKind::ReadOnly
        ) | ErrorKind::ClusterConnectionNotFound
    ) || error.is_connection_refusal()
}

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

/// Where to send a script on Cluster: by its key's slot, or to the node a redirection named.
#[derive(Debug, Clone)]
enum Route {
    BySlot,
    Moved(String, u16),
    Ask(String, u16),
}

fn redirect(error: &RedisError) -> Option<Route> {
    let (node, _slot) = error.redirect_node()?;
    let (host, port) = node.rsplit_once(':')?;
    let port = port.parse().ok()?;
    match error.kind() {
        ErrorKind::Server(ServerErrorKind::Moved) => Some(Route::Moved(host.to_owned(), port)),
        ErrorKind::Server(ServerErrorKind::Ask) => Some(Route::Ask(host.to_owned(), port)),
        _ => None,
    }
}

/// What one Cluster script call carries, for how its errors are handled (`eval_on_cluster`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Spread {
    /// One call: redirections are followed.
    Call,
    /// Several calls, one slot: TRYAGAIN splits the batch.
    Calls,
    /// Several slots of one node: any error that says the script did not run splits the batch.
    Slots,
}

fn is_tryagain(error: &RedisError) -> bool {
    matches!(error.kind(), ErrorKind::Server(ServerErrorKind::TryAgain))
}

fn is_noscript(error: &RedisError) -> bool {
    matches!(error.kind(), ErrorKind::Server(ServerErrorKind::NoScript))
}

impl RedisStore {
    /// Builds the store; it connects in the background (see `connection`).
    pub fn new(
        config: &RedisConfig,
        key_prefix: &str,
        metrics: Arc<Metrics>,
    ) -> Result<RedisStore, StoreError> {
        let backend = Backend::new(config, metrics)
            .map_err(|e| StoreError::Permanent(format!("the Redis settings cannot work: {e}")))?;
        let batcher = match &backend {
            Backend::Pool(set) => Some(batch::Batcher::spawn(
                set.clone(),
                config.pool_size.max(1) as usize,
            )),
            Backend::Cluster(_) => None,
        };
        let slot_batcher = match &backend {
            Backend::Cluster(cluster) => Some(cluster_batch::SlotBatcher::spawn(cluster.clone())),
            Backend::Pool(_) => None,
        };
        Ok(RedisStore {
            backend,
            batcher,
            slot_batcher,
            prefix: key_prefix.to_owned(),
            clock: Arc::new(RedisClock::default()),
        })
    }

    /// Whether Cluster calls are batched per node (the node map is read and every node runs
    /// Redis 7 or later) rather than per slot; false on standalone and Sentinel.
    pub fn batches_by_node(&self) -> bool {
        self.slot_batcher.as_ref().is_some_and(|b| b.by_node())
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
        // A zero limit refuses all but check-only calls and keeps no state: no need to ask Redis,
        // except in an all-or-nothing call, where a blocked descriptor (refusing hits) goes to
        // the script as a charge that always fails (nothing read or written): the call is then
        // decided in one step, in order, refunds and post-paid charges still applying.
        let sent = |c: &Check| {
            c.limit.requests > 0 || (mode == ChargeMode::AllOrNothing && !c.refund && c.hits > 0)
        };
        let counted: Vec<&Check> = checks.iter().filter(|c| sent(c)).collect();
        let mut replies = self.dispatch(&counted, clock, deadline, mode).await;
        if clock == ScriptClock::RedisTime
            && let Some(redis_now) = replies
                .iter()
                .find_map(|r| r.as_ref().ok().and_then(|n| n.get(1).copied()))
        {
            self.clock.observe(redis_now);
        }
        replies.reverse();
        checks
            .iter()
            .map(|check| {
                let reply = if sent(check) {
                    Some(replies.pop().ok_or_else(|| {
                        StoreError::Protocol("script answered fewer results than keys".into())
                    })??)
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
                script::decision(check, &reply, mode != ChargeMode::Probe)
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
    ) -> Vec<Result<Vec<u64>, StoreError>> {
        if checks.is_empty() {
            return Vec::new();
        }
        match &self.backend {
            Backend::Pool(_) => self.eval_pooled(checks, clock, deadline, mode).await,
            Backend::Cluster(_) => match mode {
                ChargeMode::AllOrNothing => {
                    self.all_or_nothing_cluster(checks, clock, deadline).await
                }
                mode => {
                    let mode = script::mode_arg(mode);
                    self.each_slot_on_cluster(checks, clock, deadline, mode)
                        .await
                }
            },
        }
    }

    /// Cluster: the checks of each slot as one call in that slot's next script call (one job per
    /// slot, not per check: a call of many descriptors waits as few jobs), the slots
    /// concurrently, each within the deadline; `mode` is the script's (`script::mode_arg`, or
    /// `script::LOOK_ALL`).
    async fn each_slot_on_cluster(
        &self,
        checks: &[&Check],
        clock: ScriptClock,
        deadline: Instant,
        mode: i64,
    ) -> Vec<KeyReply> {
        let groups = by_slot(&self.prefix, checks);
        let calls = groups.iter().map(|(slot, members)| {
            let group: Vec<&Check> = members.iter().map(|&i| checks[i]).collect();
            async move {
                match self.eval_slot(*slot, &group, clock, mode, deadline).await {
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
        let mut replies: Vec<Option<KeyReply>> = (0..checks.len()).map(|_| None).collect();
        for ((_, members), values) in groups.iter().zip(answered) {
            for (&i, value) in members.iter().zip(values) {
                replies[i] = Some(value);
            }
        }
        replies
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(StoreError::Protocol("a reply is missing".into()))))
            .collect()
    }

    /// Checks whose keys share `slot`, as one call in the next script call of that slot's node
    /// (`cluster_batch`): concurrent calls on a hot key share script calls.
    async fn eval_slot(
        &self,
        slot: u16,
        checks: &[&Check],
        clock: ScriptClock,
        mode: i64,
        deadline: Instant,
    ) -> Result<Vec<KeyReply>, StoreError> {
        let Some(batcher) = &self.slot_batcher else {
            return Err(StoreError::Protocol("no Cluster dispatcher".into()));
        };
        let (keys, args) = self.encode(checks, clock, mode, deadline);
        batcher.call(slot, keys, args, deadline).await
    }

    /// Cluster, all or nothing: one script call, atomic, when every key is in one slot (one
    /// descriptor, or the limits of one layered descriptor); else two steps: the call is looked
    /// at (each slot's checks as the script's all-or-nothing look, nothing written), then, only
    /// if every charge would pass, charged (each slot's checks all or nothing). What that
    /// guarantees: a call refused at the first step charges nothing; a call that races another
    /// between the steps may have one slot's checks charged although another slot's are then
    /// refused (never more admitted than a limit; at worst a little less).
    async fn all_or_nothing_cluster(
        &self,
        checks: &[&Check],
        clock: ScriptClock,
        deadline: Instant,
    ) -> Vec<KeyReply> {
        let all_or_nothing = script::mode_arg(ChargeMode::AllOrNothing);
        if by_slot(&self.prefix, checks).len() <= 1 {
            return self
                .each_slot_on_cluster(checks, clock, deadline, all_or_nothing)
                .await;
        }
        let looked = self
            .each_slot_on_cluster(checks, clock, deadline, script::LOOK_ALL)
            .await;
        let all_pass = checks.iter().zip(&looked).all(|(check, answer)| {
            check.refund || answer.as_ref().is_ok_and(|reply| script::allowed(reply))
        });
        if all_pass {
            return self
                .each_slot_on_cluster(checks, clock, deadline, all_or_nothing)
                .await;
        }
        // Refunds and post-paid charges always apply; the other charges answer what the look
        // found.
        let applies = |c: &&Check| c.refund || c.post_paid;
        let to_run: Vec<&Check> = checks.iter().copied().filter(applies).collect();
        let each_alone = script::mode_arg(ChargeMode::EachAlone);
        let mut ran = self
            .each_slot_on_cluster(&to_run, clock, deadline, each_alone)
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

    /// Standalone and Sentinel: every check of the call in one script call, shared with the
    /// calls that wait at the same time (`batch`).
    async fn eval_pooled(
        &self,
        checks: &[&Check],
        clock: ScriptClock,
        deadline: Instant,
        mode: ChargeMode,
    ) -> Vec<Result<Vec<u64>, StoreError>> {
        if checks.is_empty() {
            return Vec::new();
        }
        let Some(batcher) = &self.batcher else {
            return vec![Err(StoreError::Protocol("no dispatcher".into())); checks.len()];
        };
        let (keys, args) = self.encode(checks, clock, script::mode_arg(mode), deadline);
        match batcher.call(keys, args, deadline).await {
            Ok(values) => values,
            Err(e) => vec![Err(e); checks.len()],
        }
    }

    /// One call's keys and arguments as the script reads a call: clock, mode, key count, then
    /// six numbers per key.
    fn encode(
        &self,
        checks: &[&Check],
        clock: ScriptClock,
        mode: i64,
        deadline: Instant,
    ) -> (Vec<String>, Vec<i64>) {
        let expires = match clock {
            ScriptClock::RedisTime => self.clock.on_redis(deadline),
            ScriptClock::Fixed(_) => 0,
        };
        let keys: Vec<String> = checks.iter().map(|c| self.redis_key(c)).collect();
        let mut args: Vec<i64> = Vec::with_capacity(3 + checks.len() * script::ARGS_PER_KEY);
        script::push_call(checks, clock, expires, mode, &mut args);
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

/// `INFO server` and `SCRIPT LOAD` on one node: its version, and whether scripts may run.
async fn probe_node<C: redis::aio::ConnectionLike>(
    conn: &mut C,
    deadline: Instant,
    timeout: Duration,
) -> Result<String, StoreError> {
    let work = async {
        // Cluster clients ask every node and answer a map of node to text: any one will do.
        let info = match redis::cmd("INFO").arg("server").query_async(conn).await? {
            Value::Map(nodes) => nodes.into_iter().next().map_or(Value::Nil, |(_, v)| v),
            one => one,
        };
        let info: String = redis::from_redis_value(info)?;
        let version = info
            .lines()
            .find_map(|l| l.strip_prefix("redis_version:"))
            .unwrap_or("unknown")
            .trim()
            .to_owned();
        redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(script::SOURCE)
            .query_async::<String>(conn)
            .await?;
        Ok::<_, RedisError>(version)
    };
    let version = match tokio::time::timeout_at(deadline, work).await {
        Ok(Ok(version)) => version,
        Ok(Err(e)) => return Err(classify(&e)),
        Err(_) => return Err(StoreError::Timeout(timeout)),
    };
    let major: u32 = version
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    if major < 6 {
        return Err(StoreError::Permanent(format!(
            "Redis {version} is too old: Portcullis needs 6.0 or later"
        )));
    }
    Ok(format!("Redis {version}, decision script loaded"))
}

/// One script call on Cluster (`args` starting with the number of calls, as the script reads
/// them), sent by the first key's slot and sent again only where the script cannot have run
/// (MOVED and ASK to the node named, TRYAGAIN and a failover after a short wait); one reply per
/// call.
///
/// `spread`: a batch of several calls of one slot answered TRYAGAIN (its keys are half migrated)
/// comes back at once, for its calls to go one by one (each of one descriptor's keys, which
/// migrate together more often than a whole batch's); a batch over several slots of one node
/// comes back at the first error that says the script did not run (a slot moved since the node
/// map was read): a redirection names one slot's node, not the batch's.
async fn eval_on_cluster(
    conn: &mut redis::cluster_async::ClusterConnection,
    keys: &[String],
    args: &[i64],
    spread: Spread,
) -> Result<Value, RedisError> {
    let mut route = Route::BySlot;
    let mut attempt = 1;
    let cross_slot = spread == Spread::Slots;
    loop {
        match eval(conn, keys, args, &route, cross_slot).await {
            Err(e) if cross_slot && did_not_run(&e) => return Err(e),
            Err(e) if spread == Spread::Calls && is_tryagain(&e) => return Err(e),
            Err(e) if attempt < CLUSTER_ATTEMPTS && did_not_run(&e) => {
                tracing::debug!(error = %e, attempt, "script did not run: sending it again");
                route = match redirect(&e) {
                    Some(to) => to,
                    None => {
                        // TRYAGAIN, a failover in progress, a node not yet connected.
                        tokio::time::sleep(Duration::from_millis(2 << attempt)).await;
                        Route::BySlot
                    }
                };
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// EVALSHA, and EVAL on NOSCRIPT (a restarted or promoted node has an empty script cache; EVAL
/// loads it there), sent by slot or to the node a redirection named (with ASKING for ASK). Not
/// redis-rs' `Script::invoke_async`, which on NOSCRIPT in Cluster mode loads the script on every
/// node and fails when any node is down.
///
/// `cross_slot`: the keys live in several slots of one Cluster node. Redis refuses declared keys
/// of several slots, so only the first is declared (it routes the call) and all of them are
/// carried in the arguments, where the script checks each is this node's before it starts.
async fn eval<C: redis::aio::ConnectionLike + RoutedConn>(
    conn: &mut C,
    keys: &[String],
    args: &[i64],
    route: &Route,
    cross_slot: bool,
) -> Result<Value, RedisError> {
    let build = |verb: &str, body: &str| {
        let mut cmd = redis::cmd(verb);
        cmd.arg(body);
        match (cross_slot, keys.first(), args) {
            (true, Some(first), [calls, _, rest @ ..]) => {
                cmd.arg(1)
                    .arg(first)
                    .arg(calls)
                    .arg(keys.len())
                    .arg(keys)
                    .arg(rest);
            }
            _ => {
                cmd.arg(keys.len()).arg(keys).arg(args);
            }
        }
        cmd
    };
    match conn
        .send_routed(build("EVALSHA", script::SHA.as_str()), route)
        .await
    {
        Err(e) if is_noscript(&e) => {
            tracing::debug!("script not cached on the node: sending it with EVAL");
            conn.send_routed(build("EVAL", script::SOURCE), route).await
        }
        other => other,
    }
}

/// Sending a command by slot, or to a named node on Cluster.
trait RoutedConn {
    async fn send_routed(&mut self, cmd: redis::Cmd, route: &Route) -> Result<Value, RedisError>;
}

impl RoutedConn for redis::aio::MultiplexedConnection {
    async fn send_routed(&mut self, cmd: redis::Cmd, _route: &Route) -> Result<Value, RedisError> {
        cmd.query_async(self).await
    }
}

impl RoutedConn for redis::cluster_async::ClusterConnection {
    async fn send_routed(&mut self, cmd: redis::Cmd, route: &Route) -> Result<Value, RedisError> {
        let value = match route {
            Route::BySlot => return cmd.query_async(self).await,
            Route::Moved(host, port) => {
                let to = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port: *port,
                });
                self.route_command(cmd, to).await?
            }
            Route::Ask(host, port) => {
                let mut pipe = redis::pipe();
                pipe.cmd("ASKING").add_command(cmd);
                let to = SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port: *port,
                };
                let mut replies = self.route_pipeline(pipe, 1, 1, to).await?;
                // A pipeline hands a command's error back as a value: NOSCRIPT on the importing
                // node must come back as an error, to be answered by EVAL like anywhere else.
                replies.pop().unwrap_or(Value::Nil).extract_error()?
            }
        };
        Ok(value)
    }
}

/// Reads every temporary scaling factor with Redis' clock: `{now_ms, {field, "factor|expiry", …}}`.
const LOAD_FACTORS: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return {now, redis.call('HGETALL', KEYS[1])}
"#;

/// Sets (or, with a TTL of 0, removes) one factor, expiring on Redis' clock; drops the expired
/// ones and keeps the hash as long as its longest entry (every key has a TTL).
const SAVE_FACTOR: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function expiry(value)
  return tonumber(string.match(value, '|(%d+)$'))
end
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local expires = expiry(all[i + 1])
  if expires == nil or expires <= now then
    redis.call('HDEL', KEYS[1], all[i])
  end
end
local ttl = tonumber(ARGV[3])
if ttl > 0 then
  if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0
      and redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[4]) then
    return redis.error_reply('TOOMANY scaling factors are set already')
  end
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. '|' .. (now + ttl))
else
  redis.call('HDEL', KEYS[1], ARGV[1])
end
local longest = 0
all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local expires = expiry(all[i + 1])
  if expires ~= nil and expires > longest then
    longest = expires
  end
end
if longest > 0 then
  redis.call('PEXPIREAT', KEYS[1], longest)
end
return now
"#;

/// The most temporary factors one hash may hold (set by operators, still bounded).
const MAX_FACTORS: usize = 1000;

impl RedisStore {
    /// The hash of temporary scaling factors: its own hash tag, apart from every counter key
    /// (those start with `{<domain>|`).
    fn factors_key(&self) -> String {
        format!("{}{{scaling}}", self.prefix)
    }

    /// One small script (EVAL: rare calls, no cache to keep) within the deadline.
    async fn eval_small(
        &self,
        script: &str,
        args: &[String],
        deadline: Instant,
    ) -> Result<Value, StoreError> {
        let budget = deadline.saturating_duration_since(Instant::now());
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(script).arg(1).arg(self.factors_key()).arg(args);
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
        match called {
            Ok(result) => result.map_err(|e| classify(&e)),
            Err(_) => Err(StoreError::Timeout(budget)),
        }
    }
}

/// `{now_ms, {field, "factor|expiry", …}}` as the entries; malformed ones are skipped.
fn shared_factors(reply: Value) -> Result<SharedFactors, StoreError> {
    let protocol = |what: &str| StoreError::Protocol(format!("scaling factors: {what}"));
    let Value::Array(mut parts) = reply else {
        return Err(protocol("not an array"));
    };
    let fields = parts.pop().ok_or_else(|| protocol("no fields"))?;
    let now: i64 = redis::from_redis_value(parts.pop().ok_or_else(|| protocol("no clock"))?)
        .map_err(|e| protocol(&e.to_string()))?;
    let pairs: Vec<String> =
        redis::from_redis_value(fields).map_err(|e| protocol(&e.to_string()))?;
    let entries = pairs
        .chunks_exact(2)
        .take(MAX_FACTORS)
        .filter_map(|pair| {
            let (factor, expires) = pair[1].split_once('|')?;
            Some((pair[0].clone(), factor.parse().ok()?, expires.parse().ok()?))
        })
        .collect();
    Ok(SharedFactors {
        now_ms: u64::try_from(now).unwrap_or(0),
        entries,
    })
}

impl Store for RedisStore {
    fn load_factors(&self, deadline: Instant) -> FactorsFuture<'_> {
        Box::pin(async move {
            let reply = self.eval_small(LOAD_FACTORS, &[], deadline).await?;
            shared_factors(reply)
        })
    }

    fn save_factor<'a>(
        &'a self,
        field: &'a str,
        factor: f64,
        ttl_ms: u64,
        deadline: Instant,
    ) -> PingFuture<'a> {
        Box::pin(async move {
            let args = [
                field.to_owned(),
                factor.to_string(),
                ttl_ms.to_string(),
                MAX_FACTORS.to_string(),
            ];
            self.eval_small(SAVE_FACTOR, &args, deadline).await?;
            Ok(())
        })
    }

    fn check<'a>(
        &'a self,
        checks: &'a [Check],
        deadline: Instant,
        mode: ChargeMode,
    ) -> StoreFuture<'a> {
        Box::pin(self.check_with_clock(checks, ScriptClock::RedisTime, deadline, mode))
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
                    tokio::time::timeout_at(
                        deadline,
                        redis::cmd("PING").query_async::<()>(&mut conn),
                    )
                    .await
                }
                Backend::Cluster(cluster) => {
                    let mut conn = cluster.clone();
                    tokio::time::timeout_at(
                        deadline,
                        redis::cmd("PING").query_async::<()>(&mut conn),
                    )
                    .await
                }
            };
            match pinged {
                Ok(result) => result.map_err(|e| classify(&e)),
                Err(_) => Err(StoreError::Timeout(budget)),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server_error(code: &str, detail: &str) -> RedisError {
        let kind = match code {
            "MOVED" => ServerErrorKind::Moved,
            "ASK" => ServerErrorKind::Ask,
            "TRYAGAIN" => ServerErrorKind::TryAgain,
            "NOPERM" => ServerErrorKind::NoPerm,
            "CROSSSLOT" => ServerErrorKind::CrossSlot,
            _ => ServerErrorKind::ResponseError,
        };
        RedisError::from((ErrorKind::Server(kind), "server", detail.to_owned()))
    }

    #[test]
    fn a_script_is_sent_again_only_where_it_cannot_have_run() {
        assert!(did_not_run(&server_error("MOVED", "3999 127.0.0.1:7001")));
        assert!(did_not_run(&server_error("ASK", "3999 127.0.0.1:7001")));
        assert!(did_not_run(&server_error(
            "TRYAGAIN",
            "multi-key during resharding"
        )));
        let refused = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(did_not_run(&refused));
        // Sent, then the connection failed: the script may have run; never sent twice.
        let reset = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert!(!did_not_run(&reset));
        let timed_out = RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        assert!(!did_not_run(&timed_out));
    }

    #[test]
    fn errors_that_waiting_cannot_heal_are_permanent() {
        assert!(classify(&server_error("NOPERM", "no permission")).is_permanent());
        assert!(classify(&server_error("CROSSSLOT", "keys in different slots")).is_permanent());
        let auth = RedisError::from((ErrorKind::AuthenticationFailed, "auth", "WRONGPASS".into()));
        assert!(classify(&auth).is_permanent());
        let reset = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert_eq!(classify(&reset).kind(), "unavailable");
    }
}
