//! The checks a `Settings` must pass before anything starts: values that would panic, silently
//! stop a background task, or quietly defeat a guarantee are refused, all at once, each naming
//! its flag. It must never change a value: it only says what is wrong.

use std::time::Duration;

use super::{Settings, StoreKind};

/// Settings that cannot work, every one listed.
#[derive(Debug, thiserror::Error)]
#[error("invalid settings:\n  {}", .0.join("\n  "))]
pub struct SettingsError(pub Vec<String>);

impl Settings {
    /// Settings the user gave that the configuration would silently ignore.
    fn settings_that_cannot_take_effect(&self) -> Vec<String> {
        let mut problems = Vec::new();
        // Go mode chooses its store from its own variables (and says so itself).
        if self.store == StoreKind::Memory && self.env_compat.is_none() {
            let mut redis: Vec<String> = Vec::new();
            let mut given = |flag: &str, set: bool| {
                if set && !redis.iter().any(|f| f == flag) {
                    redis.push(flag.to_owned());
                }
            };
            given("--redis-url", self.redis_url.is_some());
            given("--redis-cluster", !self.redis_cluster.is_empty());
            given("--redis-sentinel", !self.redis_sentinel.is_empty());
            given(
                "--redis-per-second-url",
                self.redis_per_second_url.is_some(),
            );
            for flag in self.sources.set_with_prefix("--redis-") {
                given(&flag, true);
            }
            if !redis.is_empty() {
                let store = if self.sources.is_set("--store") {
                    "--store is memory"
                } else {
                    "the store is memory (the default of --store)"
                };
                problems.push(format!(
                    "{} set, but {store}: Redis would not be used and every replica would count \
                     on its own; set --store redis (PORTCULLIS_STORE=redis) to share one budget, \
                     or unset {}",
                    redis.join(", "),
                    if redis.len() == 1 { "it" } else { "them" }
                ));
            }
        }
        // A family of flags whose switch is off: nothing of them is used.
        let mut family = |prefix: &str, on: bool, off: &str, fix: &str| {
            let mut set = self.sources.set_with_prefix(prefix);
            if on || set.is_empty() {
                return;
            }
            set.sort();
            problems.push(format!(
                "{} set, but {off}: {} would do nothing; {fix}, or unset {}",
                set.join(", "),
                if set.len() == 1 { "it" } else { "they" },
                if set.len() == 1 { "it" } else { "them" }
            ));
        };
        family(
            "--rlqs-",
            self.rlqs.rlqs,
            "--rlqs is off (the quota service is not served)",
            "set --rlqs (PORTCULLIS_RLQS=true) to serve it",
        );
        family(
            "--rules-xds-",
            self.xds.rules_xds_server.is_some(),
            "--rules-xds-server is not set (rules come from --config)",
            "set --rules-xds-server to take rules over xDS",
        );
        if self.store == StoreKind::Memory && self.env_compat.is_none() {
            family(
                "--deny-cache",
                false,
                "the store is memory (the deny cache serves Redis only)",
                "set --store redis",
            );
            family(
                "--hot-descriptor-rate",
                false,
                "the store is memory (hot counters are claimed in Redis only: the memory store \
                 decides every call in this replica already)",
                "set --store redis",
            );
        }
        // Grants claim their part of a rule beside its counters in the main Redis; a per-second
        // Redis holds per-second counters where no claim is, so RLS there would spend a second's
        // budget the gateways were already granted.
        if let (true, Some(set)) = (self.rlqs.rlqs, self.per_second_setting()) {
            problems.push(format!(
                "--rlqs set with {set}: per-second limits would be counted in the per-second \
                 Redis, where the grants of RLQS are not, so a second's budget could be spent \
                 twice; serve RLQS from a deployment without a per-second Redis, or unset {set}"
            ));
        }
        problems.extend(self.traces.problems());
        problems
    }

    /// The setting that puts per-second limits in a Redis of their own, by the name it was given
    /// (`REDIS_PERSECOND` in the Go drop-in mode): there, no RLQS grant's claim is seen.
    pub fn per_second_setting(&self) -> Option<&'static str> {
        if self.redis_per_second.is_some() {
            Some("REDIS_PERSECOND")
        } else if self.redis_per_second_url.is_some() && self.store == StoreKind::Redis {
            Some("--redis-per-second-url")
        } else {
            None
        }
    }

    /// A Redis URL that cannot be used, said with the form it needs (never the URL itself: it
    /// may hold a password). Redis' own parser decides; a missing scheme is named as such.
    fn redis_url_problems(&self) -> Vec<String> {
        let form = "write redis://HOST:PORT[/DB] (rediss:// for TLS, redis://USER:PASSWORD@HOST:PORT \
                    with credentials, unix:///PATH for a socket; valkey:// and valkeys:// as well)";
        [
            ("--redis-url", &self.redis_url),
            ("--redis-per-second-url", &self.redis_per_second_url),
        ]
        .into_iter()
        .filter_map(|(flag, url)| {
            let url = url.as_deref()?;
            if !url.contains("://") {
                return Some(format!("{flag} has no scheme: {form}"));
            }
            redis::IntoConnectionInfo::into_connection_info(url)
                .is_err()
                .then(|| format!("{flag} does not parse as a Redis URL: {form}"))
        })
        .collect()
    }

    /// Refuses values that would panic, silently stop a background task, or quietly defeat a
    /// guarantee; all problems at once, each naming its flag.
    pub fn validate(&self) -> Result<(), SettingsError> {
        let mut problems = Vec::new();
        let mut duration = |flag: &str, value: Duration, min: Duration, max: Duration| {
            if value < min || value > max {
                problems.push(format!(
                    "{flag} {value:?} must be between {min:?} and {max:?}"
                ));
            }
        };
        duration(
            "--store-timeout",
            self.store_timeout,
            Duration::from_millis(1),
            Duration::from_secs(60),
        );
        duration(
            "--deny-cache-max-age",
            self.deny_cache_max_age,
            Duration::from_millis(1),
            Duration::from_secs(3600),
        );
        duration(
            "--redis-connect-timeout",
            self.redis_connect_timeout,
            Duration::from_millis(1),
            Duration::from_secs(60),
        );
        duration(
            "--reload-interval",
            self.reload_interval,
            Duration::from_millis(10),
            Duration::from_secs(3600),
        );
        duration(
            "--admin-header-timeout",
            self.admin_header_timeout,
            Duration::from_millis(10),
            Duration::from_secs(300),
        );
        duration(
            "--grpc-keepalive-interval",
            self.grpc_keepalive_interval,
            Duration::from_millis(10),
            Duration::from_secs(3600),
        );
        duration(
            "--grpc-keepalive-timeout",
            self.grpc_keepalive_timeout,
            Duration::from_millis(10),
            Duration::from_secs(600),
        );
        duration(
            "--drain-period",
            self.drain_period,
            Duration::ZERO,
            Duration::from_secs(600),
        );
        duration(
            "--statsd-flush-interval",
            self.statsd_flush_interval,
            Duration::from_millis(10),
            Duration::from_secs(3600),
        );
        duration(
            "--rules-xds-backoff-initial",
            self.xds.rules_xds_backoff_initial,
            Duration::from_millis(1),
            Duration::from_secs(3600),
        );
        duration(
            "--rules-xds-backoff-max",
            self.xds.rules_xds_backoff_max,
            self.xds.rules_xds_backoff_initial,
            Duration::from_secs(3600),
        );
        duration(
            "--rlqs-store-timeout",
            self.rlqs.rlqs_store_timeout,
            Duration::from_millis(1),
            Duration::from_secs(60),
        );
        if let Some(burst) = self.rlqs.rlqs_burst {
            duration(
                "--rlqs-burst",
                burst,
                Duration::from_millis(1),
                Duration::from_secs(3600),
            );
        }
        if !self.rlqs.rlqs_push_interval.is_zero() {
            duration(
                "--rlqs-push-interval",
                self.rlqs.rlqs_push_interval,
                Duration::from_millis(50),
                Duration::from_secs(60),
            );
        }
        duration(
            "--rlqs-reporting-interval",
            self.rlqs.rlqs_reporting_interval,
            Duration::from_secs(1),
            Duration::from_secs(3600),
        );
        if let Some(age) = self.grpc_max_connection_age {
            duration(
                "--grpc-max-connection-age",
                age,
                Duration::from_secs(1),
                Duration::from_secs(365 * 86_400),
            );
        }
        for (flag, value) in [
            ("--rlqs-max-streams", self.rlqs.rlqs_max_streams),
            (
                "--rlqs-max-buckets-per-stream",
                self.rlqs.rlqs_max_buckets_per_stream,
            ),
            (
                "--rlqs-max-reports-per-second",
                self.rlqs.rlqs_max_reports_per_second as usize,
            ),
            (
                "--rlqs-max-bucket-bytes-per-stream",
                self.rlqs.rlqs_max_bucket_bytes_per_stream,
            ),
            ("--rlqs-max-bucket-bytes", self.rlqs.rlqs_max_bucket_bytes),
        ] {
            if value == 0 {
                problems.push(format!("{flag} must be at least 1"));
            }
        }
        if !(0.0..=1.0).contains(&self.xds.rules_xds_backoff_random_factor) {
            problems.push(format!(
                "--rules-xds-backoff-random-factor {} must be a number from 0 to 1",
                self.xds.rules_xds_backoff_random_factor
            ));
        }
        if self.xds.rules_xds_max_message_bytes < 1024 {
            problems.push(format!(
                "--rules-xds-max-message-bytes {} must be at least 1024",
                self.xds.rules_xds_max_message_bytes
            ));
        }
        if let Some(timeout) = self.grpc_request_timeout
            && (timeout <= self.store_timeout || timeout > Duration::from_secs(600))
        {
            problems.push(format!(
                "--grpc-request-timeout {timeout:?} must be longer than --store-timeout ({:?}, \
                 so that the failure mode can answer) and at most 600s",
                self.store_timeout
            ));
        }
        if self.admin_scaling
            && self.admin_scaling_token_file.is_none()
            && !self.admin_addr.ip().is_loopback()
        {
            problems.push(format!(
                "--admin-scaling on a listener others can reach ({}) needs \
                 --admin-scaling-token-file: anyone reaching it could otherwise lift every limit",
                self.admin_addr
            ));
        }
        if !(0.0..=1.0).contains(&self.near_limit_ratio) {
            problems.push(format!(
                "--near-limit-ratio {} must be a number from 0 to 1",
                self.near_limit_ratio
            ));
        }
        if !(self.hot_descriptor_rate.is_finite() && self.hot_descriptor_rate >= 0.0) {
            problems.push(format!(
                "--hot-descriptor-rate {} must be a number of hits a second, 0 or more (0: off)",
                self.hot_descriptor_rate
            ));
        }
        if self.key_prefix.contains(['{', '}']) {
            problems.push(format!(
                "--key-prefix {:?} must not contain {{ or }}: Redis Cluster would hash every key \
                 by the prefix and put all counters in one slot",
                self.key_prefix
            ));
        }
        for (flag, value) in [
            ("--max-descriptors", self.max_descriptors),
            ("--max-entries", self.max_entries),
            ("--max-string-bytes", self.max_string_bytes),
            ("--max-message-bytes", self.max_message_bytes),
            ("--redis-pool-size", self.redis_pool_size as usize),
            ("--max-in-flight", self.max_in_flight),
            ("--deny-cache-max-entries", self.deny_cache_max_entries),
            ("--deny-cache-max-bytes", self.deny_cache_max_bytes),
            ("--memory-max-counters", self.memory_max_counters),
            (
                "--grpc-max-concurrent-streams",
                self.grpc_max_concurrent_streams as usize,
            ),
        ] {
            if value == 0 {
                problems.push(format!("{flag} must be at least 1"));
            }
        }
        problems.extend(self.redis_url_problems());
        problems.extend(self.settings_that_cannot_take_effect());
        if problems.is_empty() {
            Ok(())
        } else {
            Err(SettingsError(
                problems.iter().map(|p| self.sources.spell(p)).collect(),
            ))
        }
    }
}
