//! Temporary scaling factors kept in Redis, so that every replica on one Redis applies the same
//! ones: one hash of their own (its own hash tag, apart from every counter), each entry expiring on
//! Redis' clock. Small scripts (`lua/scaling_*.lua`), sent by EVAL: rare calls. It must never
//! keep more than `MAX_FACTORS` entries, nor a key without a TTL.

use redis::Value;
use tokio::time::Instant;

use super::RedisStore;
use crate::store::{SharedFactors, StoreError};

/// Reads every temporary scaling factor with Redis' clock: `{now_ms, {field, "factor|expiry", …}}`.
const LOAD_FACTORS: &str = include_str!("../../../lua/scaling_load.lua");

/// Sets (or, with a TTL of 0, removes) one factor, expiring on Redis' clock; drops the expired
/// ones and keeps the hash as long as its longest entry (every key has a TTL).
const SAVE_FACTOR: &str = include_str!("../../../lua/scaling_save.lua");

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
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(script).arg(1).arg(self.factors_key()).arg(args);
        self.query(cmd, deadline).await
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

impl RedisStore {
    /// Every temporary factor, with Redis' clock.
    pub(super) async fn load_shared_factors(
        &self,
        deadline: Instant,
    ) -> Result<SharedFactors, StoreError> {
        let reply = self.eval_small(LOAD_FACTORS, &[], deadline).await?;
        shared_factors(reply)
    }

    /// Keeps `factor` under `field` for `ttl_ms` of Redis' clock (0 removes it).
    pub(super) async fn save_shared_factor(
        &self,
        field: &str,
        factor: f64,
        ttl_ms: u64,
        deadline: Instant,
    ) -> Result<(), StoreError> {
        let args = [
            field.to_owned(),
            factor.to_string(),
            ttl_ms.to_string(),
            MAX_FACTORS.to_string(),
        ];
        self.eval_small(SAVE_FACTOR, &args, deadline).await?;
        Ok(())
    }
}
