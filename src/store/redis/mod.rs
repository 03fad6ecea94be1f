//! The Redis store: every replica of Portcullis, and every gateway behind them, shares one budget
//! per descriptor. One Lua script call decides each check atomically on the server, reading Redis
//! `TIME` (never the host clock: replicas drift).
//!
//! Standalone and Sentinel: all checks of a call go in one script call (one round trip).
//! Cluster: each check's key carries its own hash tag, so checks go out as concurrent script calls,
//! each routed to its key's node.

pub mod connection;
pub mod script;

use futures_util::future::try_join_all;
use redis::{RedisError, Value};

pub use connection::{RedisConfig, Topology, redact_url};
pub use script::ScriptClock;

use self::connection::{Backend, breaks_connection};
use super::{PingFuture, Store, StoreError, StoreFuture};
use crate::algorithm::{Check, Decision, zero_limit_decision};

pub struct RedisStore {
    backend: Backend,
    prefix: String,
}

fn unavailable(context: &str, error: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(format!("{context}: {error}"))
}

fn store_error(error: RedisError) -> StoreError {
    if breaks_connection(&error) || error.is_cluster_error() || error.is_timeout() {
        unavailable("redis", error)
    } else {
        StoreError::Protocol(format!("redis: {error}"))
    }
}

impl RedisStore {
    /// Builds the store without connecting (see `Backend::new`).
    pub fn new(config: &RedisConfig, key_prefix: &str) -> Result<RedisStore, StoreError> {
        let backend = Backend::new(config)
            .map_err(|e| StoreError::Protocol(format!("redis configuration: {e}")))?;
        Ok(RedisStore {
            backend,
            prefix: key_prefix.to_owned(),
        })
    }

    /// The full Redis key of a check.
    pub fn redis_key(&self, check: &Check) -> String {
        format!("{}{}", self.prefix, check.key)
    }

    /// Runs the checks with the script reading `clock`. Production calls this with
    /// `ScriptClock::RedisTime` only (through `Store::check`); a fixed clock is for tests.
    pub async fn check_with_clock(
        &self,
        checks: &[Check],
        clock: ScriptClock,
    ) -> Result<Vec<Decision>, StoreError> {
        // A zero limit refuses all but check-only calls and keeps no state: no need to ask Redis.
        let counted: Vec<&Check> = checks.iter().filter(|c| c.limit.requests > 0).collect();
        let mut replies = match &self.backend {
            Backend::Pool(pool) => self.eval_pooled(pool, &counted, clock).await?,
            Backend::Cluster(cluster) => {
                let calls = counted.iter().map(|check| {
                    let mut conn = cluster.clone();
                    async move {
                        self.eval(&mut conn, &[check], clock)
                            .await
                            .map_err(store_error)
                    }
                });
                try_join_all(calls).await?.into_iter().flatten().collect()
            }
        }
        .into_iter();
        checks
            .iter()
            .map(|check| {
                if check.limit.requests == 0 {
                    return Ok(zero_limit_decision(check.hits));
                }
                let reply = replies.next().ok_or_else(|| {
                    StoreError::Protocol("script answered fewer results than keys".into())
                })?;
                script::decision(check, &reply)
            })
            .collect()
    }

    async fn eval_pooled(
        &self,
        pool: &bb8::Pool<connection::Manager>,
        checks: &[&Check],
        clock: ScriptClock,
    ) -> Result<Vec<Value>, StoreError> {
        if checks.is_empty() {
            return Ok(Vec::new());
        }
        let (mut conn, broken) = connection::checkout(pool)
            .await
            .map_err(|e| unavailable("redis connection", e))?;
        let result = self.eval(&mut conn, checks, clock).await;
        if let Err(e) = &result
            && breaks_connection(e)
        {
            // Let bb8 replace the connection rather than hand it out again.
            broken.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        result.map_err(store_error)
    }

    /// EVALSHA, and EVAL on NOSCRIPT (a restarted or promoted node has an empty script cache;
    /// EVAL loads it there). Not redis-rs' `Script::invoke_async`, which on NOSCRIPT in Cluster
    /// mode loads the script on every node and fails when any node is down.
    async fn eval<C: redis::aio::ConnectionLike>(
        &self,
        conn: &mut C,
        checks: &[&Check],
        clock: ScriptClock,
    ) -> Result<Vec<Value>, RedisError> {
        let keys: Vec<String> = checks.iter().map(|c| self.redis_key(c)).collect();
        let mut args: Vec<i64> = Vec::with_capacity(1 + checks.len() * script::ARGS_PER_KEY);
        args.push(i64::try_from(clock.arg()).unwrap_or(i64::MAX));
        for check in checks {
            script::push_args(check, &mut args);
        }
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha
            .arg(script::SHA.as_str())
            .arg(keys.len())
            .arg(&keys)
            .arg(&args);
        match evalsha.query_async::<Vec<Value>>(conn).await {
            Err(e)
                if matches!(
                    e.kind(),
                    redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
                ) =>
            {
                tracing::debug!("script not cached on the node: sending it with EVAL");
                let mut eval = redis::cmd("EVAL");
                eval.arg(script::SOURCE)
                    .arg(keys.len())
                    .arg(&keys)
                    .arg(&args);
                eval.query_async(conn).await
            }
            other => other,
        }
    }
}

impl Store for RedisStore {
    fn check<'a>(&'a self, checks: &'a [Check]) -> StoreFuture<'a> {
        Box::pin(self.check_with_clock(checks, ScriptClock::RedisTime))
    }

    fn name(&self) -> &'static str {
        "redis"
    }

    fn ping(&self) -> PingFuture<'_> {
        Box::pin(async move {
            match &self.backend {
                Backend::Pool(pool) => {
                    let (mut conn, _) = connection::checkout(pool)
                        .await
                        .map_err(|e| unavailable("redis connection", e))?;
                    redis::cmd("PING")
                        .query_async::<()>(&mut conn)
                        .await
                        .map_err(store_error)
                }
                Backend::Cluster(cluster) => {
                    let mut conn = cluster.clone();
                    redis::cmd("PING")
                        .query_async::<()>(&mut conn)
                        .await
                        .map_err(store_error)
                }
            }
        })
    }
}
