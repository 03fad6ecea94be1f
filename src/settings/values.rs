//! The value types and parsers of the flags: durations, tags, secrets, and the command line's
//! names for the domain's choices (failure mode, algorithm, headers, log format) mapped onto the
//! domain's enums, so those enums know nothing of clap. A secret is never printable.

use std::time::Duration;

use clap::ValueEnum;

use crate::algorithm::Algorithm;
use crate::limiter::FailureMode;
use crate::service::HeadersMode;
use crate::telemetry::LogFormat;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StoreKind {
    /// Counters in this process (one replica, or each replica its own budget).
    Memory,
    /// Counters in Redis, shared by every replica: standalone, Cluster or Sentinel.
    Redis,
}

/// A secret from the command line or environment: never printed by `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl std::str::FromStr for Secret {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Secret(s.to_owned()))
    }
}

/// `KEY=VALUE`, both non-empty.
pub fn parse_tag(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() && !value.is_empty() => {
            Ok((key.to_owned(), value.to_owned()))
        }
        _ => Err(format!("{text:?} is not KEY=VALUE")),
    }
}

/// A duration flag or variable: `crate::duration`'s one syntax (`15ms`, `2s`, `1m`, `24h`,
/// `1h30m`); a bare number is refused.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    crate::duration::parse(text).map_err(|e| e.to_string())
}

/// `--failure-mode` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(super) enum FailureModeArg {
    /// Allow the request (fail open, like Envoy's default and Stripe's limiter).
    Allow,
    /// Refuse the request (fail closed).
    Deny,
    /// Count in this process's memory until the store answers again.
    Local,
    /// Answer with a gRPC error (UNAVAILABLE): Envoy's failure_mode_deny decides, as with the Go
    /// service.
    Error,
}

impl From<FailureModeArg> for FailureMode {
    fn from(arg: FailureModeArg) -> Self {
        match arg {
            FailureModeArg::Allow => FailureMode::Allow,
            FailureModeArg::Deny => FailureMode::Deny,
            FailureModeArg::Local => FailureMode::Local,
            FailureModeArg::Error => FailureMode::Error,
        }
    }
}

/// `--override-algorithm` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum AlgorithmArg {
    SlidingWindow,
    TokenBucket,
    FixedWindow,
}

impl From<AlgorithmArg> for Algorithm {
    fn from(arg: AlgorithmArg) -> Self {
        match arg {
            AlgorithmArg::SlidingWindow => Algorithm::SlidingWindow,
            AlgorithmArg::TokenBucket => Algorithm::TokenBucket,
            AlgorithmArg::FixedWindow => Algorithm::FixedWindow,
        }
    }
}

/// `--response-headers` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(super) enum HeadersArg {
    /// None (Envoy's default).
    Off,
    /// `x-ratelimit-limit`, `-remaining`, `-reset` as in draft-polli-ratelimit-headers-03, the
    /// format Envoy itself writes; plus `retry-after` when over the limit.
    Draft03,
    /// `ratelimit-limit`, `-remaining`, `-reset` and `ratelimit-policy`; plus `retry-after`.
    Ietf,
    /// The Go service's three headers only (`RateLimit-Limit`, `-Remaining`, `-Reset`).
    Go,
}

impl From<HeadersArg> for HeadersMode {
    fn from(arg: HeadersArg) -> Self {
        match arg {
            HeadersArg::Off => HeadersMode::Off,
            HeadersArg::Draft03 => HeadersMode::Draft03,
            HeadersArg::Ietf => HeadersMode::Ietf,
            HeadersArg::Go => HeadersMode::Go,
        }
    }
}

/// `--log-format` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(super) enum LogFormatArg {
    Text,
    Json,
}

impl From<LogFormatArg> for LogFormat {
    fn from(arg: LogFormatArg) -> Self {
        match arg {
            LogFormatArg::Text => LogFormat::Text,
            LogFormatArg::Json => LogFormat::Json,
        }
    }
}
