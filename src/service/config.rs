//! What the service is told at start-up: request limits and response options (headers and their
//! names, shadow and quota modes, how a call is charged). Plain values: it must never read
//! settings or the environment (the server hands them over).

use crate::algorithm::{Algorithm, ChargeMode};

/// Which rate-limit headers to add to the response Envoy sends downstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HeadersMode {
    /// None (Envoy's default).
    #[default]
    Off,
    /// `x-ratelimit-limit`, `-remaining`, `-reset` as in draft-polli-ratelimit-headers-03, the
    /// format Envoy itself writes; plus `retry-after` when over the limit.
    Draft03,
    /// `ratelimit-limit`, `-remaining`, `-reset` and `ratelimit-policy`; plus `retry-after`.
    Ietf,
    /// envoyproxy/ratelimit's three headers (`RateLimit-Limit`, `-Remaining`, `-Reset`): the
    /// limit as a bare number, nothing else.
    Go,
}

/// The three headers' names, when the operator renames them (`None`: the mode's own).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeaderNames {
    pub limit: Option<String>,
    pub remaining: Option<String>,
    pub reset: Option<String>,
}

/// Request limits and response options, fixed at start-up.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    pub response_headers: HeadersMode,
    /// Names for the three rate-limit headers, replacing the mode's (the Go service's
    /// `LIMIT_LIMIT_HEADER`, `LIMIT_REMAINING_HEADER`, `LIMIT_RESET_HEADER`).
    pub header_names: HeaderNames,
    /// Never answer OVER_LIMIT overall (counts still happen).
    pub global_shadow_mode: bool,
    /// Every limit is a quota (see `quota_mode`).
    pub global_quota_mode: bool,
    /// How a call's descriptors are charged (all or nothing: the Go service's
    /// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`).
    pub charge: ChargeMode,
    /// Describe the call in the response's dynamic metadata (`RESPONSE_DYNAMIC_METADATA`).
    pub dynamic_metadata: bool,
    /// The algorithm of limits a request carries (the Go service counts them in fixed windows).
    pub override_algorithm: Algorithm,
    /// Every hit is recorded, admitted or not, on every rule (the Go service's counting, for
    /// the drop-in mode): as if each rule said `post_paid: true`.
    pub post_paid_everywhere: bool,
    pub max_descriptors: usize,
    pub max_entries: usize,
    /// Longest domain, key or value, in bytes.
    pub max_string_bytes: usize,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        Self {
            response_headers: HeadersMode::Off,
            header_names: HeaderNames::default(),
            global_shadow_mode: false,
            global_quota_mode: false,
            charge: ChargeMode::EachAlone,
            dynamic_metadata: false,
            override_algorithm: Algorithm::FixedWindow,
            post_paid_everywhere: false,
            max_descriptors: 512,
            max_entries: 64,
            max_string_bytes: 1024,
        }
    }
}
