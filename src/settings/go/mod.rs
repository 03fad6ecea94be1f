//! envoyproxy/ratelimit's environment, read as it reads it: the variables a Deployment written for
//! the Go service sets, with the Go service's defaults and meanings, mapped onto `Settings`. The
//! binary does this when it runs as `ratelimit` (the image's `/bin/ratelimit`) or with
//! `serve --env-compat go`.
//!
//! A variable that asks for something Portcullis cannot do stops the start-up naming it; one read
//! but deliberately not acted on is listed in `Settings::ignored_variables` (logged once). This
//! module must never guess: an unparsable value is an error naming its variable.

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

mod sections;

use self::sections::{behaviour, listeners, logs, rules, stats, store, tracing};
use super::{Settings, SettingsError};

/// Variables the Go service reads that change nothing here, and why (logged once at start-up).
const IGNORED: &[(&str, &str)] = &[
    (
        "RUNTIME_WATCH_ROOT",
        "the rules directory is polled, which sees every kind of change",
    ),
    (
        "RUNTIME_IGNOREDOTFILES",
        "dot files are always skipped (a mounted ConfigMap's machinery)",
    ),
    (
        "EXPIRATION_JITTER_MAX_SECONDS",
        "every key expires when its state is empty again, exactly",
    ),
    (
        "REDIS_PIPELINE_WINDOW",
        "calls are pipelined on multiplexed connections",
    ),
    (
        "REDIS_PIPELINE_LIMIT",
        "calls are pipelined on multiplexed connections",
    ),
    (
        "REDIS_CLUSTER_PIPELINE_PARALLELISM",
        "each check goes to its node at once",
    ),
    (
        "REDIS_POOL_ON_EMPTY_BEHAVIOR",
        "calls never wait for a pooled connection",
    ),
    (
        "REDIS_PERSECOND_PIPELINE_WINDOW",
        "calls are pipelined on multiplexed connections",
    ),
    (
        "REDIS_PERSECOND_PIPELINE_LIMIT",
        "calls are pipelined on multiplexed connections",
    ),
    (
        "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM",
        "each check goes to its node at once",
    ),
    (
        "REDIS_PERSECOND_TIMEOUT",
        "one decision deadline covers both Redis (REDIS_TIMEOUT)",
    ),
    (
        "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR",
        "calls never wait for a pooled connection",
    ),
    (
        "REDIS_STARTUP_INITIAL_INTERVAL",
        "Portcullis serves (not ready) while it connects, with its own back-off (0.1 s doubling \
         to 5 s)",
    ),
    (
        "REDIS_STARTUP_MAX_INTERVAL",
        "Portcullis serves (not ready) while it connects, with its own back-off (0.1 s doubling \
         to 5 s)",
    ),
    (
        "USE_DOG_STATSD_MOGRIFIERS",
        "statsd counters keep the Go service's plain names",
    ),
    (
        "GRPC_SERVER_TLS_CA_CERT",
        "not a variable of the Go service (Envoy Gateway sets it); client certificates are \
         required by GRPC_CLIENT_TLS_CACERT",
    ),
    (
        "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
        "the xDS stream reconnects with XDS_CLIENT_BACKOFF_*",
    ),
    (
        "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
        "the response time histogram is in seconds",
    ),
];

/// Reads one variable of the process (the only place Go mode reads the environment).
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

struct Reader<'a> {
    var: &'a dyn Fn(&str) -> Option<String>,
    problems: Vec<String>,
}

impl Reader<'_> {
    fn get(&self, name: &str) -> Option<String> {
        (self.var)(name).filter(|v| !v.is_empty())
    }

    fn string(&self, name: &str, default: &str) -> String {
        self.get(name).unwrap_or_else(|| default.to_owned())
    }

    /// Go's `strconv.ParseBool`.
    fn bool(&mut self, name: &str, default: bool) -> bool {
        match self.get(name).as_deref() {
            None => default,
            Some("1" | "t" | "T" | "true" | "TRUE" | "True") => true,
            Some("0" | "f" | "F" | "false" | "FALSE" | "False") => false,
            Some(other) => {
                self.problems
                    .push(format!("{name}={other:?} is not a boolean"));
                default
            }
        }
    }

    fn number<T: std::str::FromStr>(&mut self, name: &str, default: T) -> T {
        match self.get(name) {
            None => default,
            Some(text) => text.trim().parse().unwrap_or_else(|_| {
                self.problems
                    .push(format!("{name}={text:?} is not a number"));
                default
            }),
        }
    }

    fn duration(&mut self, name: &str, default: Duration) -> Duration {
        match self.get(name) {
            None => default,
            Some(text) => parse_go_duration(&text).unwrap_or_else(|| {
                self.problems.push(format!(
                    "{name}={text:?} is not a duration like 10s, 1m30s or 250ms"
                ));
                default
            }),
        }
    }

    fn address(&mut self, host_var: &str, port_var: &str, port: u16) -> SocketAddr {
        let host = self.string(host_var, "0.0.0.0");
        let port = self.number(port_var, port);
        self.resolve(&format!("{host}:{port}"), host_var)
    }

    fn resolve(&mut self, text: &str, name: &str) -> SocketAddr {
        // Go's ":9090" means every address.
        let text = if text.starts_with(':') {
            format!("0.0.0.0{text}")
        } else {
            text.to_owned()
        };
        match text.to_socket_addrs().ok().and_then(|mut a| a.next()) {
            Some(addr) => addr,
            None => {
                self.problems
                    .push(format!("{name}: {text:?} is not an address to listen on"));
                SocketAddr::from(([0, 0, 0, 0], 0))
            }
        }
    }

    fn refuse_if(&mut self, condition: bool, message: String) {
        if condition {
            self.problems.push(message);
        }
    }
}

/// Go's `time.ParseDuration` (`300ms`, `10s`, `1m30s`, `24h`): the one duration syntax, which
/// reads everything Go's does.
pub fn parse_go_duration(text: &str) -> Option<Duration> {
    crate::duration::parse(text).ok()
}

/// `user:password` or `password`, as the Go service splits REDIS_AUTH.
fn split_auth(auth: &str) -> (Option<String>, String) {
    match auth.split_once(':') {
        Some((user, password)) => (Some(user.to_owned()), password.to_owned()),
        None => (None, auth.to_owned()),
    }
}

/// `Settings` from the Go service's environment, on top of `base` (which holds Portcullis' own
/// settings that Go has no variable for, such as the store deadline).
pub fn from_go_env(
    base: Settings,
    var: &dyn Fn(&str) -> Option<String>,
) -> Result<Settings, SettingsError> {
    let mut s = base;
    let mut r = Reader {
        var,
        problems: Vec::new(),
    };
    s.env_compat = Some("go".into());
    // The Go service starts on an empty runtime directory (its rules may arrive later); a
    // warning says so at start.
    s.allow_empty_rules = true;

    listeners(&mut r, &mut s);
    logs(&mut r, &mut s);
    rules(&mut r, &mut s);
    behaviour(&mut r, &mut s);
    store(&mut r, &mut s);
    stats(&mut r, &mut s);
    tracing(&mut r, &mut s);

    s.ignored_variables = IGNORED
        .iter()
        .filter(|(name, _)| r.get(name).is_some())
        .map(|(name, why)| format!("{name}: {why}"))
        .collect();
    if r.problems.is_empty() {
        Ok(s)
    } else {
        Err(SettingsError(r.problems))
    }
}

#[cfg(test)]
mod tests;
