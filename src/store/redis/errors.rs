//! What a Redis error means: for the operator (`classify`: wait, fix the configuration, or
//! report a bug) and for sending a script again (`did_not_run`: only where it cannot have run,
//! else a charge would count twice). It must never call an error "did not run" on a guess.

use redis::{ErrorKind, RedisError, ServerErrorKind};

use crate::store::StoreError;

/// What a Redis error means for the operator.
pub fn classify(error: &RedisError) -> StoreError {
    let text = error.to_string();
    let code = error.code().unwrap_or("");
    if let ErrorKind::Server(kind) = error.kind()
        && let Some((name, meaning)) = passing(kind)
    {
        return StoreError::Unavailable(format!("{name} ({meaning}): {text}"));
    }
    match error.kind() {
        ErrorKind::AuthenticationFailed => {
            StoreError::Permanent(format!("authentication failed: {text}"))
        }
        ErrorKind::Server(ServerErrorKind::NoPerm) => StoreError::Permanent(format!(
            "the Redis user lacks a permission Portcullis needs (EVALSHA, EVAL, TIME, the keys \
             under the prefix; WAIT with --redis-wait-replicas): {text}"
        )),
        ErrorKind::Server(ServerErrorKind::CrossSlot) => StoreError::Permanent(format!(
            "keys of one script call are in different slots: {text}"
        )),
        ErrorKind::InvalidClientConfig | ErrorKind::RESP3NotSupported => {
            StoreError::Permanent(format!("the Redis settings cannot work: {text}"))
        }
        ErrorKind::Parse | ErrorKind::UnexpectedReturnType => StoreError::Protocol(text),
        _ if matches!(code, "WRONGPASS" | "NOAUTH") => {
            StoreError::Permanent(format!("authentication failed: {text}"))
        }
        _ if code == "NOPERM" => StoreError::Permanent(format!("permission denied: {text}")),
        _ if code == "NOREPLICAS" => StoreError::Unavailable(format!(
            "fewer replicas answer this master than its min-replicas-to-write asks, so it \
             refuses every script call (answered by the failure mode until they are back): {text}"
        )),
        _ if code == "OOM" => StoreError::Unavailable(format!(
            "Redis is out of memory (maxmemory reached, no key can be evicted): {text}"
        )),
        _ if text.contains("unknown command")
            && ["'evalsha'", "'eval'", "'script'"]
                .iter()
                .any(|c| text.to_ascii_lowercase().contains(c)) =>
        {
            StoreError::Permanent(format!(
                "this Redis cannot run Lua scripts, and Portcullis decides in them: scripting \
                 is off (a Valkey built or configured without its Lua module, or EVAL and \
                 EVALSHA renamed); use a server with scripting: {text}"
            ))
        }
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

/// The server errors of a topology in motion (a failover, a resharding, a restart), by the code
/// Redis sends, as an operator greps for it, and what it means; each answered by the failure
/// mode once it is not followed or waited out (`did_not_run`, `send::eval_on_cluster`).
fn passing(kind: ServerErrorKind) -> Option<(&'static str, &'static str)> {
    Some(match kind {
        ServerErrorKind::ReadOnly => (
            "READONLY",
            "the node became a replica, a failover moved its master: the connection is replaced",
        ),
        ServerErrorKind::TryAgain => (
            "TRYAGAIN",
            "the call's keys are moving between Cluster nodes: sent again, then given up",
        ),
        ServerErrorKind::MasterDown => (
            "MASTERDOWN",
            "the replica lost its master and serves no stale data",
        ),
        ServerErrorKind::ClusterDown => (
            "CLUSTERDOWN",
            "the Cluster has slots no node serves: a master down and not yet replaced",
        ),
        ServerErrorKind::BusyLoading => ("LOADING", "Redis is loading its data after a restart"),
        ServerErrorKind::Moved => (
            "MOVED",
            "the slot is another node's: followed, then given up past the attempts",
        ),
        ServerErrorKind::Ask => (
            "ASK",
            "the slot is migrating: followed, then given up past the attempts",
        ),
        _ => return None,
    })
}

fn is_certificate_error(text: &str) -> bool {
    let lower = text.to_ascii_lowercase();
    lower.contains("certificate") || lower.contains("unknownissuer")
}

/// Whether a failed attempt certainly did not run the script (so sending it again is safe).
pub(super) fn did_not_run(error: &RedisError) -> bool {
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

pub(super) fn is_tryagain(error: &RedisError) -> bool {
    matches!(error.kind(), ErrorKind::Server(ServerErrorKind::TryAgain))
}

pub(super) fn is_noscript(error: &RedisError) -> bool {
    matches!(error.kind(), ErrorKind::Server(ServerErrorKind::NoScript))
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

    /// A topology in motion is said by the code Redis sent (what an operator greps for) and in
    /// words: the log used to say `ClusterDown: The cluster is down`, never `CLUSTERDOWN`.
    #[test]
    fn a_topology_in_motion_is_named_by_its_redis_code_and_meaning() {
        for (reply, code, words) in [
            (
                "READONLY You can't write against a read only replica.",
                "READONLY",
                "failover",
            ),
            (
                "TRYAGAIN Multiple keys request during rehashing of slot",
                "TRYAGAIN",
                "moving",
            ),
            (
                "MASTERDOWN Link with MASTER is down",
                "MASTERDOWN",
                "lost its master",
            ),
            (
                "CLUSTERDOWN The cluster is down",
                "CLUSTERDOWN",
                "no node serves",
            ),
            (
                "LOADING Redis is loading the dataset in memory",
                "LOADING",
                "restart",
            ),
            ("MOVED 3999 127.0.0.1:6381", "MOVED", "another node's"),
            ("ASK 3999 127.0.0.1:6381", "ASK", "migrating"),
        ] {
            // As the parser makes it from the wire.
            let wire = format!("-{reply}\r\n");
            let error = match redis::parse_redis_value(wire.as_bytes()) {
                Ok(redis::Value::ServerError(e)) => RedisError::from(e),
                other => panic!("{reply}: {other:?}"),
            };
            let said = classify(&error);
            assert_eq!(said.kind(), "unavailable", "{reply}");
            let text = said.to_string();
            assert!(
                text.contains(code) && text.contains(words),
                "{reply}: {text}"
            );
        }
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
