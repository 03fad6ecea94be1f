//! The start-up probe of one Redis node: its version, whether scripts may run (the decision
//! script and its function library are loaded on the way), and a warning when its eviction policy could hand budgets back.
//! For the start-up log only; it must never decide anything.

use std::time::Duration;

use redis::{RedisError, Value};
use tokio::time::Instant;

use super::errors::classify;
use super::script;
use crate::store::StoreError;

/// `INFO server`, `SCRIPT LOAD` and `FUNCTION LOAD` on one node: its version, and whether
/// scripts may run.
pub(super) async fn probe_node<C: redis::aio::ConnectionLike>(
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
        // Every counter has a TTL, so every `volatile-*` policy may evict live counters too.
        let memory = match redis::cmd("INFO").arg("memory").query_async(conn).await? {
            Value::Map(nodes) => nodes.into_iter().next().map_or(Value::Nil, |(_, v)| v),
            one => one,
        };
        let memory: String = redis::from_redis_value(memory)?;
        if let Some(policy) = memory
            .lines()
            .find_map(|l| l.strip_prefix("maxmemory_policy:"))
            .map(str::trim)
            .filter(|p| *p != "noeviction")
        {
            tracing::warn!(
                maxmemory_policy = policy,
                "this Redis may evict keys when full: an evicted counter hands its budget back \
                 (over-admission); set maxmemory-policy noeviction (docs/redis.md)"
            );
        }
        redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(script::SOURCE)
            .query_async::<String>(conn)
            .await?;
        // The decision function too, where the server has functions (Redis 7, Valkey): loaded
        // before the first call rather than by it. Already there (another replica of Portcullis
        // loaded it) is as good; a refusal (an ACL without FUNCTION LOAD) leaves the calls to
        // EVALSHA, which they find out themselves (send.rs).
        if !version.starts_with('6') {
            let loaded = redis::cmd("FUNCTION")
                .arg("LOAD")
                .arg(script::LIBRARY.as_str())
                .query_async::<Value>(conn)
                .await;
            if let Err(e) = loaded
                && !e.to_string().contains("already exists")
            {
                tracing::debug!(error = %e, "the decision function library was not loaded at start");
            }
        }
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
