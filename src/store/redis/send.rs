//! Sending the decision script: FCALL of its function library, loaded where a node does not have
//! it (or EVALSHA, and EVAL where a node does not have the script cached, on a node without
//! functions), by slot or to the node a Cluster redirection named; and, where replicas must have a
//! call's writes, the `WAIT` after it. It must never send a script twice itself: a call is sent
//! again only where the node answered that it did not run it (no such function or script, no
//! functions at all, out of memory before it started), and whether a failed send may be sent again
//! otherwise is decided by `errors::did_not_run`: `eval_on_cluster` follows MOVED and ASK and
//! waits out TRYAGAIN and failovers, and nothing else.

use redis::Value;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{ErrorKind, RedisError, ServerErrorKind};

use std::time::Duration;

use super::errors::{did_not_run, is_noscript, is_tryagain};
use super::script;
pub use super::script_calls::ScriptCalls;

/// What a node answers to FCALL or FUNCTION LOAD where it has no functions for us: an unknown
/// command, or an ACL refusing it. The call did not run.
pub(super) fn refuses_functions(error: &RedisError) -> bool {
    matches!(error.kind(), ErrorKind::Server(ServerErrorKind::NoPerm))
        || error.to_string().contains("unknown command")
}

/// FCALL of a function the node has not loaded (a new node, a flush, an older version's node):
/// nothing ran.
fn function_missing(error: &RedisError) -> bool {
    error.code() == Some("ERR") && error.to_string().contains("Function not found")
}

/// A function refused whole at its start for memory (`maxmemory` reached; Redis runs no function
/// then, where a script runs and fails only its writes): nothing ran, and the script by EVALSHA
/// answers its refusals.
fn refused_for_memory(error: &RedisError) -> bool {
    error.code() == Some("OOM")
}

/// Where to send a script on Cluster: by its key's slot, or to the node a redirection named.
#[derive(Debug, Clone)]
pub(super) enum Route {
    BySlot,
    Moved(String, u16),
    Ask(String, u16),
}

pub(super) fn redirect(error: &RedisError) -> Option<Route> {
    let (node, _slot) = error.redirect_node()?;
    let (host, port) = node.rsplit_once(':')?;
    let port = port.parse().ok()?;
    match error.kind() {
        ErrorKind::Server(ServerErrorKind::Moved) => Some(Route::Moved(host.to_owned(), port)),
        ErrorKind::Server(ServerErrorKind::Ask) => Some(Route::Ask(host.to_owned(), port)),
        _ => None,
    }
}

/// FCALL of the library's function, by slot or to the node a redirection named (with ASKING for
/// ASK); where the node has not loaded it, FUNCTION LOAD there and FCALL again. Where functions
/// cannot serve (`ScriptCalls`, or a call refused for memory), EVALSHA, and EVAL on NOSCRIPT (a
/// restarted or promoted node has an empty script cache; EVAL loads it there). Not redis-rs'
/// `Script::invoke_async`, which on NOSCRIPT in Cluster mode loads the script on every node and
/// fails when any node is down; for the same reason FUNCTION LOAD goes to one node.
///
/// `cross_slot`: the keys live in several slots of one Cluster node. Redis refuses declared keys
/// of several slots, so only the first is declared (it routes the call) and all of them are
/// carried in the arguments, where the script checks each is this node's before it starts.
pub(super) async fn eval<C: redis::aio::ConnectionLike + RoutedConn>(
    conn: &mut C,
    calls: &ScriptCalls,
    keys: &[String],
    args: &[i64],
    route: &Route,
    cross_slot: bool,
) -> Result<Value, RedisError> {
    let packed = match script::pack(keys, args, cross_slot) {
        Ok(packed) => packed,
        Err(e) => {
            return Err(RedisError::from((
                ErrorKind::Client,
                "portcullis",
                e.to_string(),
            )));
        }
    };
    let build = |verb: &str, body: &str| {
        let mut cmd = redis::cmd(verb);
        cmd.arg(body);
        match (cross_slot, packed.keys.first()) {
            (true, Some(first)) => {
                cmd.arg(1).arg(first).arg(&packed.numbers).arg(&packed.keys);
            }
            _ => {
                cmd.arg(packed.keys.len())
                    .arg(&packed.keys)
                    .arg(&packed.numbers);
            }
        }
        cmd
    };
    if !calls.scripts_only() {
        let fcall = || build("FCALL", script::FUNCTION.as_str());
        match conn.send_routed(fcall(), route).await {
            Err(e) if function_missing(&e) => {
                let mut load = redis::cmd("FUNCTION");
                load.arg("LOAD").arg(script::LIBRARY.as_str());
                match conn
                    .send_to_node(load, route, packed.keys.first().copied())
                    .await
                {
                    // Loaded, or loaded meanwhile by another replica of Portcullis.
                    Ok(_) => return conn.send_routed(fcall(), route).await,
                    Err(e) if e.to_string().contains("already exists") => {
                        return conn.send_routed(fcall(), route).await;
                    }
                    Err(e) if refuses_functions(&e) => calls.keep_to_scripts(&e),
                    // A demoted master, a moved slot: the call did not run, and says so.
                    Err(e) if did_not_run(&e) => return Err(e),
                    Err(e) => {
                        tracing::debug!(error = %e, "the function library could not be loaded: this call goes by EVALSHA");
                    }
                }
            }
            Err(e) if refuses_functions(&e) => calls.keep_to_scripts(&e),
            Err(e) if refused_for_memory(&e) => {
                tracing::debug!("FCALL refused for memory: this call goes by EVALSHA");
            }
            other => return other,
        }
    }
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

/// The decision script run with no call (it decides and reads nothing): whether this node can
/// run it at all, as a function (loading the library where the node lacks it, so that a new
/// node's first calls do not) and as a script by EVALSHA, which the other scripts (RLQS grants,
/// scaling factors) always use: NOSCRIPT sends it with EVAL, which loads it again where a flush
/// or a failover emptied the cache. A node without scripting (EVAL unknown: renamed, or a Valkey
/// without its Lua module) or a user the ACL refuses it answers the error a call would meet.
pub(super) async fn run_empty<C: redis::aio::ConnectionLike + RoutedConn>(
    conn: &mut C,
    calls: &ScriptCalls,
) -> Result<(), RedisError> {
    // No keys; the call count and the count of carried keys both 0 (lua/check.lua's numbers).
    eval(conn, calls, &[], &[0, 0], &Route::BySlot, false).await?;
    if calls.scripts_only() {
        return Ok(());
    }
    let scripts = ScriptCalls::scripts_for_now();
    eval(conn, &scripts, &[], &[0, 0], &Route::BySlot, false)
        .await
        .map(drop)
}

/// Whether `replicas` acknowledged a script call's writes by `deadline`: `send` sends the `WAIT`
/// it is given on the connection the call was sent on, right after it (Redis counts a client's
/// last write, so it covers the call's). Fewer than asked, or no answer in time (Redis ends a
/// WAIT on its own timer's tick, up to a tenth of a second late, so the wait is bounded here
/// too, a little before the deadline, for the callers to get this error rather than their own
/// timeout): the call's answers must not stand (its hits are on the master, and a failover
/// to a replica that has not got them would admit them again): unavailable, for the failure
/// mode to answer.
pub(super) async fn replicas_acknowledged<F>(
    replicas: u32,
    deadline: tokio::time::Instant,
    send: impl FnOnce(redis::Cmd) -> F,
) -> Result<(), crate::store::StoreError>
where
    F: std::future::Future<Output = Result<Value, RedisError>>,
{
    use crate::store::StoreError;
    const MS: Duration = Duration::from_millis(1);
    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
    // Past the timer's resolution (a millisecond), for this error to reach the callers first.
    let within = left.saturating_sub((left / 10).max(2 * MS)).max(MS);
    let ms = u64::try_from(within.as_millis()).unwrap_or(u64::MAX).max(1);
    let mut wait = redis::cmd("WAIT");
    wait.arg(replicas).arg(ms);
    let got = match tokio::time::timeout(within, send(wait)).await {
        Ok(Ok(Value::Int(n))) if n >= i64::from(replicas) => return Ok(()),
        Ok(Ok(Value::Int(n))) => n.to_string(),
        Ok(Ok(other)) => {
            return Err(StoreError::Protocol(format!(
                "WAIT answered {other:?}, not a count of replicas"
            )));
        }
        Ok(Err(e)) => return Err(super::errors::classify(&e)),
        Err(_) => "no answer in time: fewer".to_owned(),
    };
    Err(StoreError::Unavailable(format!(
        "WAIT: {got} of the {replicas} replicas asked for acknowledged the call's writes within \
         {ms} ms (--redis-wait-replicas): its answers do not stand, as its hits could be lost at \
         a failover"
    )))
}

impl Route {
    /// Where a keyless command goes to reach the node this route reached with `key`'s call.
    pub(super) fn node_of(&self, key: &str) -> RoutingInfo {
        use redis::cluster_routing::SlotAddr;
        RoutingInfo::SingleNode(match self {
            Route::BySlot => {
                SingleNodeRoutingInfo::SpecificNode(redis::cluster_routing::Route::new(
                    super::cluster_map::slot_of(key),
                    SlotAddr::Master,
                ))
            }
            Route::Moved(host, port) | Route::Ask(host, port) => SingleNodeRoutingInfo::ByAddress {
                host: host.clone(),
                port: *port,
            },
        })
    }
}

/// Sending a command by slot, or to a named node on Cluster.
pub(super) trait RoutedConn {
    async fn send_routed(&mut self, cmd: redis::Cmd, route: &Route) -> Result<Value, RedisError>;

    /// A keyless command to the node `route` reached with `key`'s call (without a key: where
    /// the client routes it).
    async fn send_to_node(
        &mut self,
        cmd: redis::Cmd,
        route: &Route,
        key: Option<&str>,
    ) -> Result<Value, RedisError>;
}

impl RoutedConn for redis::aio::MultiplexedConnection {
    async fn send_routed(&mut self, cmd: redis::Cmd, _route: &Route) -> Result<Value, RedisError> {
        cmd.query_async(self).await
    }

    async fn send_to_node(
        &mut self,
        cmd: redis::Cmd,
        _route: &Route,
        _key: Option<&str>,
    ) -> Result<Value, RedisError> {
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

    async fn send_to_node(
        &mut self,
        cmd: redis::Cmd,
        route: &Route,
        key: Option<&str>,
    ) -> Result<Value, RedisError> {
        match key {
            Some(key) => self.route_command(cmd, route.node_of(key)).await,
            None => cmd.query_async(self).await,
        }
    }
}

/// Attempts of one check on Cluster (the first and the re-sends where the script did not run).
const CLUSTER_ATTEMPTS: u32 = 4;

/// What one Cluster script call carries, for how its errors are handled (`eval_on_cluster`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Spread {
    /// One call: redirections are followed.
    OneCall,
    /// Several calls, one slot: TRYAGAIN splits the batch.
    CallsOfOneSlot,
    /// Several slots of one node: any error that says the script did not run splits the batch.
    SeveralSlots,
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
///
/// With the reply, where the script ran (for the `WAIT` after it: the node a redirection named,
/// else the first key's slot).
pub(super) async fn eval_on_cluster(
    conn: &mut redis::cluster_async::ClusterConnection,
    calls: &ScriptCalls,
    keys: &[String],
    args: &[i64],
    spread: Spread,
) -> Result<(Value, Route), RedisError> {
    let mut route = Route::BySlot;
    let mut attempt = 1;
    let cross_slot = spread == Spread::SeveralSlots;
    loop {
        match eval(conn, calls, keys, args, &route, cross_slot).await {
            Err(e) if cross_slot && did_not_run(&e) => return Err(e),
            Err(e) if spread == Spread::CallsOfOneSlot && is_tryagain(&e) => return Err(e),
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
            other => return other.map(|value| (value, route)),
        }
    }
}
