//! The rule model: units, where a rule was written, a rule and its layers (each limit of a
//! layered descriptor), and how each describes itself. Plain data: it must never match, load or
//! count.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use crate::algorithm::{Algorithm, Limit, US_PER_SECOND};

/// The time units of the YAML (`week` is ours and the Go service's; Envoy's override enum has no
/// week). Month and year are 30 and 365 days, as in envoyproxy/ratelimit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Year,
}

impl Unit {
    pub const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];

    pub fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        }
    }

    pub fn window_us(self) -> u64 {
        self.seconds() * US_PER_SECOND
    }

    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }

    /// Case-insensitive, like the Go service.
    pub fn parse(text: &str) -> Option<Unit> {
        Unit::ALL
            .into_iter()
            .find(|u| u.name().eq_ignore_ascii_case(text))
    }
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where a rule was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    pub file: Arc<PathBuf>,
    pub line: u64,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file.display(), self.line)
    }
}

/// A limit as configured (or carried by a request), with everything the response needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// `domain.key_value.key`, as envoyproxy/ratelimit names a rule in its stats.
    pub full_key: String,
    pub domain: String,
    /// `None` for `unlimited: true`.
    pub limit: Option<Limit>,
    pub requests_per_unit: u32,
    pub unit: Option<Unit>,
    pub name: Option<String>,
    pub replaces: Vec<String>,
    pub shadow_mode: bool,
    /// Over its limit alone it does not make the call OVER_LIMIT (see the service).
    pub quota_mode: bool,
    /// Every hit is recorded, admitted or not: costs known only after the fact (an LLM's
    /// tokens, charged when Envoy's stream is done) take the counter past its limit, and later
    /// checks are refused until it drains (`algorithm::Check::post_paid`).
    pub post_paid: bool,
    pub detailed_metric: bool,
    /// The descriptor's `metadata`, handed back in the response's dynamic metadata.
    pub metadata: Option<Arc<serde_json::Map<String, serde_json::Value>>>,
    pub source: Option<Source>,
    /// The limits of a layered rule (`rate_limits:`), every one of which must admit a hit; empty
    /// for a rule of one limit (`rate_limit:`). When set, `limit`, `requests_per_unit` and `unit`
    /// are the first layer's and `name` is `None` (the layers carry the names).
    pub layers: Vec<Layer>,
}

/// One limit of a layered rule.
#[derive(Debug, Clone, PartialEq)]
pub struct Layer {
    pub name: Option<String>,
    pub limit: Limit,
    pub requests_per_unit: u32,
    pub unit: Unit,
}

impl Layer {
    /// `10 per second, token_bucket, burst 20, name "burst"`.
    pub fn describe(&self) -> String {
        let mut text = format!(
            "{} per {}, {}",
            self.requests_per_unit, self.unit, self.limit.algorithm
        );
        text.push_str(&detail(&self.limit));
        if let Some(name) = &self.name {
            text.push_str(&format!(", name {name:?}"));
        }
        text
    }

    /// What the per-limit metrics call this layer of `full_key`: `full_key/name`, or
    /// `full_key/<index>` for a layer without a name.
    pub fn metric_name(&self, full_key: &str, index: usize) -> String {
        match &self.name {
            Some(name) => format!("{full_key}/{name}"),
            None => format!("{full_key}/{index}"),
        }
    }
}

impl Rule {
    pub fn is_unlimited(&self) -> bool {
        self.limit.is_none()
    }

    /// The names `replaces` can refer to: the rule's own, or each of its layers'.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.name
            .as_deref()
            .into_iter()
            .chain(self.layers.iter().filter_map(|l| l.name.as_deref()))
    }

    /// One line for listings (`/rlconfig`, `explain`).
    pub fn describe(&self) -> String {
        if !self.layers.is_empty() {
            let layers: Vec<String> = self.layers.iter().map(Layer::describe).collect();
            let mut text = format!("{}: {}", self.full_key, layers.join(" AND "));
            if self.shadow_mode {
                text.push_str(", shadow_mode");
            }
            if self.quota_mode {
                text.push_str(", quota_mode");
            }
            if self.post_paid {
                text.push_str(", post_paid");
            }
            return text;
        }
        match (&self.limit, self.unit) {
            (Some(limit), Some(unit)) => {
                let mut text = format!(
                    "{}: {} per {}, {}",
                    self.full_key, self.requests_per_unit, unit, limit.algorithm
                );
                text.push_str(&detail(limit));
                if self.shadow_mode {
                    text.push_str(", shadow_mode");
                }
                if self.quota_mode {
                    text.push_str(", quota_mode");
                }
                if self.post_paid {
                    text.push_str(", post_paid");
                }
                if let Some(name) = &self.name {
                    text.push_str(&format!(", name {name:?}"));
                }
                text
            }
            _ => format!("{}: unlimited", self.full_key),
        }
    }
}

/// What an algorithm adds to a limit's description: a token bucket's burst, a concurrency
/// rule's lease (`, lease 300s`).
fn detail(limit: &crate::algorithm::Limit) -> String {
    match limit.algorithm {
        Algorithm::TokenBucket => format!(", burst {}", limit.burst),
        Algorithm::Concurrency if limit.window_us.is_multiple_of(1_000_000) => {
            format!(", lease {}s", limit.window_us / 1_000_000)
        }
        Algorithm::Concurrency => format!(", lease {}ms", limit.window_us / 1_000),
        _ => String::new(),
    }
}
