//! How a store calls the decision script: by FCALL of its function library, or by EVALSHA for a
//! while after a node refused functions, trying them again after `RETRY_FUNCTIONS`. Shared by a
//! store's connections (one per store, not per node). It must never keep a store off functions
//! for good after one refusal, nor send a call twice (send.rs decides what is sent).

use redis::RedisError;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How a store calls the decision script: by FCALL of the library (its definitions made once per
/// node, not at every call), or by EVALSHA for a while once a node has refused functions (Redis 6,
/// `FCALL` renamed away, an ACL that allows EVALSHA and not FCALL or FUNCTION LOAD), which every
/// such node runs. Functions are tried again `RETRY_FUNCTIONS` after each refusal, so that an ACL
/// put right or an upgraded Redis is served by FCALL again without a restart.
#[derive(Debug)]
pub struct ScriptCalls {
    /// When functions were last refused (ms after `since`), `NEVER` when they have not been.
    refused_at_ms: AtomicU64,
    since: Instant,
    /// Whether the refusal was logged (once: a node that will never have functions, Redis 6,
    /// refuses again at every retry).
    said: AtomicBool,
}

/// How long calls keep to EVALSHA after functions were refused, before FCALL is tried again: a
/// refused FCALL costs one round trip that often, and the call goes on by EVALSHA.
pub const RETRY_FUNCTIONS: Duration = Duration::from_secs(300);

const NEVER: u64 = u64::MAX;

impl Default for ScriptCalls {
    fn default() -> Self {
        ScriptCalls {
            refused_at_ms: AtomicU64::new(NEVER),
            since: Instant::now(),
            said: AtomicBool::new(false),
        }
    }
}

impl ScriptCalls {
    /// Calls that go by EVALSHA whatever the node could do (the readiness look's second run).
    pub(super) fn scripts_for_now() -> Self {
        let calls = ScriptCalls::default();
        calls.refused_at_ms.store(0, Ordering::Relaxed);
        calls
    }

    /// Calls go by EVALSHA for `RETRY_FUNCTIONS` from `now`; said once, with the node's reason.
    pub(super) fn keep_to_scripts_at(&self, why: &RedisError, now: Instant) {
        let ms = u64::try_from(now.saturating_duration_since(self.since).as_millis())
            .unwrap_or(NEVER - 1);
        self.refused_at_ms.store(ms, Ordering::Relaxed);
        if !self.said.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                error = %why,
                "Redis refused the decision script's function library: calling it by EVALSHA \
                 (every decision defines the script's functions again, which costs Redis about \
                 a microsecond more), and trying functions again every {} s",
                RETRY_FUNCTIONS.as_secs()
            );
        } else {
            tracing::debug!(error = %why, "functions refused again: calls keep to EVALSHA");
        }
    }

    pub(super) fn keep_to_scripts(&self, why: &RedisError) {
        self.keep_to_scripts_at(why, Instant::now());
    }

    /// Whether calls go by EVALSHA at `now`.
    pub(super) fn scripts_only_at(&self, now: Instant) -> bool {
        let at = self.refused_at_ms.load(Ordering::Relaxed);
        if at == NEVER {
            return false;
        }
        let elapsed = now.saturating_duration_since(self.since).as_millis();
        elapsed < u128::from(at) + RETRY_FUNCTIONS.as_millis()
    }

    /// Whether calls go by EVALSHA now.
    pub fn scripts_only(&self) -> bool {
        self.scripts_only_at(Instant::now())
    }
}

#[cfg(test)]
#[path = "script_calls_tests.rs"]
mod tests;
