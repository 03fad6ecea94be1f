//! One command or script to Redis outside the decision path (RLQS grants, scaling factors, the
//! contested feed, RLQS in use), within a deadline, on whichever backend. It must never resend
//! a script but on NOSCRIPT (where it did not run).

use redis::Value;
use tokio::time::Instant;

use super::connection::Backend;
use super::{RedisStore, errors};
use crate::store::StoreError;

impl RedisStore {
    /// One command within `deadline`, on whichever backend: the small scripts (scaling factors,
    /// the contested feed, RLQS in use) and RLQS grants (`query_script`), calls outside the
    /// decision path.
    pub(super) async fn query(
        &self,
        cmd: redis::Cmd,
        deadline: Instant,
    ) -> Result<Value, StoreError> {
        self.query_raw(cmd, deadline)
            .await?
            .map_err(|e| errors::classify(&e))
    }

    /// A script by EVALSHA (`sha`), sent again by EVAL with its `body` where a node answers
    /// NOSCRIPT (a restarted or promoted node's cache is empty): the large scripts not resent
    /// whole at every call. `args` adds the number of keys, the keys and the arguments.
    pub(super) async fn query_script(
        &self,
        sha: &str,
        body: &str,
        args: impl Fn(&mut redis::Cmd),
        deadline: Instant,
    ) -> Result<Value, StoreError> {
        let build = |verb: &str, script: &str| {
            let mut cmd = redis::cmd(verb);
            cmd.arg(script);
            args(&mut cmd);
            cmd
        };
        match self.query_raw(build("EVALSHA", sha), deadline).await? {
            Err(e) if errors::is_noscript(&e) => self.query(build("EVAL", body), deadline).await,
            called => called.map_err(|e| errors::classify(&e)),
        }
    }

    /// One command within `deadline`: Redis' own answer, or a timeout.
    async fn query_raw(
        &self,
        cmd: redis::Cmd,
        deadline: Instant,
    ) -> Result<Result<Value, redis::RedisError>, StoreError> {
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
        called.map_err(|_| StoreError::Timeout(budget))
    }
}
