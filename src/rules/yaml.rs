//! The rules file as written: envoyproxy/ratelimit's format (every field it accepts, including
//! `quota_mode`, `value_to_metric`, `share_threshold` and `metadata`) plus `algorithm` and `burst`
//! inside `rate_limit`. Every field keeps its line (`Spanned`) so that a validation error can point at it;
//! unknown keys and duplicate keys are refused by the parser, the rest is checked in `build.rs`.
//! Plain data: it must never hold a decision about what a field means.

use serde::Deserialize;
use serde_saphyr::Spanned;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileYaml {
    pub(super) domain: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) descriptors: Option<Vec<Spanned<DescriptorYaml>>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DescriptorYaml {
    pub(super) key: Option<Spanned<String>>,
    pub(super) value: Option<Spanned<String>>,
    pub(super) rate_limit: Option<Spanned<RateLimitYaml>>,
    /// Layered limits: every one must admit a hit (Portcullis' own field).
    pub(super) rate_limits: Option<Vec<Spanned<RateLimitYaml>>>,
    pub(super) descriptors: Option<Vec<Spanned<DescriptorYaml>>>,
    pub(super) shadow_mode: Option<bool>,
    pub(super) quota_mode: Option<bool>,
    /// Hits are costs already consumed, recorded even past the limit (Portcullis' own field).
    pub(super) post_paid: Option<bool>,
    pub(super) detailed_metric: Option<bool>,
    pub(super) value_to_metric: Option<bool>,
    pub(super) share_threshold: Option<Spanned<bool>>,
    /// Arbitrary, handed back to Envoy in the response's dynamic metadata.
    pub(super) metadata: Option<serde_json::Map<String, serde_json::Value>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RateLimitYaml {
    pub(super) unit: Option<Spanned<String>>,
    pub(super) requests_per_unit: Option<Spanned<u64>>,
    pub(super) unlimited: Option<Spanned<bool>>,
    pub(super) name: Option<Spanned<String>>,
    pub(super) replaces: Option<Vec<Spanned<ReplacesYaml>>>,
    pub(super) algorithm: Option<Spanned<String>>,
    pub(super) burst: Option<Spanned<u64>>,
    /// A concurrency rule's lease: a slot not released within it is freed by itself (default:
    /// one `unit`). Portcullis' own field, in the duration syntax (`30s`, `5m`).
    pub(super) max_duration: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ReplacesYaml {
    pub(super) name: Option<Spanned<String>>,
}

/// The most limits one layered rule may list: each is a counter read and written per hit.
pub const MAX_LAYERS: usize = 8;

/// The deepest descriptor nesting a rules file may have. Loading, matching and dropping a rule
/// tree recurse once per level, so the depth must be bounded for the stack's sake; no request
/// can match deeper than its entries, and real rule sets stay under ten levels.
pub const MAX_NESTING: usize = 16;

/// YAML nesting the parser accepts: two per descriptor level (a list, a map), the file's own
/// levels and a rule's inline maps, with room to spare so that our own message, naming the
/// level, is the one a slightly too deep file gets.
pub(crate) const MAX_YAML_DEPTH: usize = 2 * MAX_NESTING + 12;
