//! Rules: what the YAML says (`yaml`), loaded from a directory into an immutable `Snapshot` that
//! answers "which rule applies to this descriptor". Matching is envoyproxy/ratelimit's: per level
//! the exact value, else the first matching wildcard in file order, else the value-less default;
//! a rule applies only at the request's full depth; no backtracking.
//!
//! Nothing here counts or knows about protobuf; a snapshot is never changed once built (a reload
//! builds a new one), so in-flight calls keep the rules they started with.

mod error;
pub mod glob;
mod load;
pub mod scaling;
mod yaml;

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use crate::algorithm::{Algorithm, Limit, US_PER_SECOND};

pub use error::{RuleError, RulesError};
pub use load::{LoadOptions, RuleFiles, load_dir, parse, parse_file, read_dir};

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
        if self.limit.algorithm == Algorithm::TokenBucket {
            text.push_str(&format!(", burst {}", self.limit.burst));
        }
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
                if limit.algorithm == Algorithm::TokenBucket {
                    text.push_str(&format!(", burst {}", limit.burst));
                }
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

/// One request descriptor entry, whatever type carries it.
pub trait Entry {
    fn key(&self) -> &str;
    fn value(&self) -> &str;
}

impl Entry for (&str, &str) {
    fn key(&self) -> &str {
        self.0
    }
    fn value(&self) -> &str {
        self.1
    }
}

impl Entry for (String, String) {
    fn key(&self) -> &str {
        &self.0
    }
    fn value(&self) -> &str {
        &self.1
    }
}

/// How one level of a request descriptor was matched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MatchKind {
    Exact,
    Wildcard(String),
    Default,
}

/// How one level matched, borrowing the pattern (the lookup path allocates nothing for it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Matched<'a> {
    Exact,
    Wildcard(&'a str),
    Default,
}

impl Matched<'_> {
    fn owned(self) -> MatchKind {
        match self {
            Matched::Exact => MatchKind::Exact,
            Matched::Wildcard(p) => MatchKind::Wildcard(p.to_owned()),
            Matched::Default => MatchKind::Default,
        }
    }
}

/// One step of a lookup, for `explain`.
#[derive(Debug, Clone)]
pub struct Step {
    pub key: String,
    pub value: String,
    /// `None`: nothing at this level matched and the lookup stopped.
    pub matched: Option<(MatchKind, Source)>,
    pub has_rule: bool,
}

/// What a lookup found.
#[derive(Debug, Clone)]
pub enum Lookup<'a> {
    UnknownDomain,
    NoRule,
    Rule(Resolved<'a>),
}

/// The rule a descriptor resolved to, with what the path to it says about counting and naming.
#[derive(Debug, Clone)]
pub struct Resolved<'a> {
    pub rule: &'a Arc<Rule>,
    /// Entries matched by a `share_threshold` wildcard, as (entry index, pattern): every value
    /// the pattern matches counts in one counter, keyed by the pattern.
    pub shared: Vec<(usize, &'a str)>,
    /// The per-rule metric name when it is not the rule's own `full_key`: the request's values
    /// for `detailed_metric` rules and `value_to_metric` levels, as the Go service names them.
    pub metric_name: Option<String>,
}

impl Resolved<'_> {
    /// The pattern that entry `index` counts under, if it is shared.
    pub fn shared_pattern(&self, index: usize) -> Option<&str> {
        self.shared
            .iter()
            .find(|(i, _)| *i == index)
            .map(|(_, pattern)| *pattern)
    }
}

#[derive(Debug, Default)]
pub(crate) struct Level {
    by_key: HashMap<String, KeyMatchers>,
}

#[derive(Debug, Default)]
pub(crate) struct KeyMatchers {
    exact: HashMap<String, Node>,
    /// In file order: the first match wins.
    wildcards: Vec<(String, Node)>,
    default: Option<Box<Node>>,
}

#[derive(Debug)]
pub(crate) struct Node {
    rule: Option<Arc<Rule>>,
    children: Level,
    source: Source,
    /// `share_threshold`: values matched by this wildcard share one counter.
    share_threshold: bool,
    /// `value_to_metric`: the request's value at this level goes into the metric name.
    value_to_metric: bool,
}

impl Level {
    fn find(&self, key: &str, value: &str) -> Option<(&Node, Matched<'_>)> {
        let matchers = self.by_key.get(key)?;
        if let Some(node) = matchers.exact.get(value) {
            return Some((node, Matched::Exact));
        }
        if let Some((pattern, node)) = matchers
            .wildcards
            .iter()
            .find(|(pattern, _)| glob::matches(pattern, value))
        {
            return Some((node, Matched::Wildcard(pattern)));
        }
        matchers.default.as_deref().map(|n| (n, Matched::Default))
    }

    fn rules<'a>(&'a self, out: &mut Vec<&'a Arc<Rule>>) {
        let mut keys: Vec<_> = self.by_key.iter().collect();
        keys.sort_by(|a, b| a.0.cmp(b.0));
        for (_, m) in keys {
            let mut exact: Vec<_> = m.exact.iter().collect();
            exact.sort_by(|a, b| a.0.cmp(b.0));
            let nodes = exact
                .into_iter()
                .map(|(_, n)| n)
                .chain(m.wildcards.iter().map(|(_, n)| n))
                .chain(m.default.as_deref());
            for node in nodes {
                out.extend(node.rule.as_ref());
                node.children.rules(out);
            }
        }
    }

    fn key_paths(&self, path: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
        for (key, m) in &self.by_key {
            path.push(key.clone());
            let nodes = m
                .exact
                .values()
                .chain(m.wildcards.iter().map(|(_, n)| n))
                .chain(m.default.as_deref());
            for node in nodes {
                if node.rule.is_some() {
                    out.push(path.clone());
                }
                node.children.key_paths(path, out);
            }
            path.pop();
        }
    }

    fn shadowed_wildcards(&self, out: &mut Vec<String>) {
        let mut keys: Vec<_> = self.by_key.iter().collect();
        keys.sort_by(|a, b| a.0.cmp(b.0));
        for (key, m) in keys {
            for (i, (pattern, node)) in m.wildcards.iter().enumerate() {
                if let Some((earlier, first)) = m.wildcards[..i]
                    .iter()
                    .find(|(earlier, _)| glob::covers(earlier, pattern))
                {
                    out.push(format!(
                        "{}: key {key:?} value {pattern:?} is never matched: the wildcard \
                         {earlier:?} at {} comes first and matches every value it would",
                        node.source, first.source
                    ));
                }
            }
            let nodes = m
                .exact
                .values()
                .chain(m.wildcards.iter().map(|(_, n)| n))
                .chain(m.default.as_deref());
            for node in nodes {
                node.children.shadowed_wildcards(out);
            }
        }
    }

    /// Whether any node below names metrics from request values or shares counters (the lookup
    /// then records its path).
    fn has_path_features(&self) -> bool {
        self.by_key.values().any(|m| {
            m.exact
                .values()
                .chain(m.wildcards.iter().map(|(_, n)| n))
                .chain(m.default.as_deref())
                .any(|n| {
                    n.share_threshold
                        || n.value_to_metric
                        || n.rule.as_ref().is_some_and(|r| r.detailed_metric)
                        || n.children.has_path_features()
                })
        })
    }

    /// Adds `other`'s descriptors (a second file of the same domain); a key and value defined in
    /// both is an error at the second definition.
    pub(crate) fn merge(&mut self, other: Level, errors: &mut Vec<RuleError>) {
        let duplicate = |node: &Node, what: String, errors: &mut Vec<RuleError>| {
            errors.push(RuleError {
                file: node.source.file.as_ref().clone(),
                line: node.source.line,
                field: "descriptors".into(),
                message: format!("duplicate descriptor when merging the domain: {what}"),
            });
        };
        for (key, theirs) in other.by_key {
            let ours = self.by_key.entry(key.clone()).or_default();
            for (value, node) in theirs.exact {
                if let Some(first) = ours.exact.get(&value) {
                    let what = format!(
                        "key {key:?} with value {value:?} is already defined at {}",
                        first.source
                    );
                    duplicate(&node, what, errors);
                } else {
                    ours.exact.insert(value, node);
                }
            }
            for (pattern, node) in theirs.wildcards {
                if let Some((_, first)) = ours.wildcards.iter().find(|(p, _)| *p == pattern) {
                    let what = format!(
                        "key {key:?} with value {pattern:?} is already defined at {}",
                        first.source
                    );
                    duplicate(&node, what, errors);
                } else {
                    ours.wildcards.push((pattern, node));
                }
            }
            if let Some(node) = theirs.default {
                match &ours.default {
                    Some(first) => {
                        let what = format!(
                            "key {key:?} without a value is already defined at {}",
                            first.source
                        );
                        duplicate(&node, what, errors);
                    }
                    None => ours.default = Some(node),
                }
            }
        }
    }
}

/// A domain's descriptor tree.
#[derive(Debug)]
pub struct Domain {
    pub name: String,
    pub source: Source,
    root: Level,
    /// Some node names metrics from values or shares counters: lookups record their path.
    path_features: bool,
}

impl Domain {
    pub(crate) fn new(name: String, source: Source, root: Level) -> Domain {
        let path_features = root.has_path_features();
        Domain {
            name,
            source,
            root,
            path_features,
        }
    }

    /// Adds a second file's descriptors to this domain (`merge_domains`).
    pub(crate) fn merge(&mut self, other: Domain, errors: &mut Vec<RuleError>) {
        self.root.merge(other.root, errors);
        self.path_features = self.root.has_path_features();
    }
}

/// All rules loaded at one moment; immutable.
#[derive(Debug)]
pub struct Snapshot {
    domains: HashMap<String, Domain>,
    pub loaded_at: SystemTime,
    pub files: Vec<PathBuf>,
    /// `RuleFiles::fingerprint` of the bytes these rules were parsed from.
    pub fingerprint: u64,
}

impl Snapshot {
    pub fn empty() -> Self {
        Self {
            domains: HashMap::new(),
            loaded_at: SystemTime::now(),
            files: Vec::new(),
            fingerprint: 0,
        }
    }

    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    pub fn domain_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.domains.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    /// Which rule applies to this descriptor (its entries in request order).
    pub fn resolve<E: Entry>(&self, domain: &str, entries: &[E]) -> Lookup<'_> {
        self.walk(domain, entries, |_| {})
    }

    /// Like `resolve`, also telling how each level matched.
    pub fn explain<E: Entry>(&self, domain: &str, entries: &[E]) -> (Lookup<'_>, Vec<Step>) {
        let mut steps = Vec::new();
        let lookup = self.walk(domain, entries, |step| steps.push(step));
        (lookup, steps)
    }

    fn walk<E: Entry>(
        &self,
        domain: &str,
        entries: &[E],
        mut trace: impl FnMut(Step),
    ) -> Lookup<'_> {
        let Some(found_domain) = self.domains.get(domain) else {
            return Lookup::UnknownDomain;
        };
        let mut level = &found_domain.root;
        let mut shared = Vec::new();
        // Recorded only where some node needs it: the usual lookup allocates nothing.
        let mut path: Vec<(Matched<'_>, &Node)> = Vec::new();
        for (depth, entry) in entries.iter().enumerate() {
            let found = level.find(entry.key(), entry.value());
            trace(Step {
                key: entry.key().to_owned(),
                value: entry.value().to_owned(),
                matched: found.as_ref().map(|(n, k)| (k.owned(), n.source.clone())),
                has_rule: found.as_ref().is_some_and(|(n, _)| n.rule.is_some()),
            });
            let Some((node, matched)) = found else { break };
            if let Matched::Wildcard(pattern) = matched
                && node.share_threshold
            {
                shared.push((depth, pattern));
            }
            if found_domain.path_features {
                path.push((matched, node));
            }
            if depth + 1 == entries.len() {
                return match &node.rule {
                    None => Lookup::NoRule,
                    Some(rule) => {
                        let metric_name = found_domain
                            .path_features
                            .then(|| metric_name(domain, entries, &path, rule, &shared))
                            .flatten();
                        Lookup::Rule(Resolved {
                            rule,
                            shared,
                            metric_name,
                        })
                    }
                };
            }
            level = &node.children;
        }
        Lookup::NoRule
    }

    /// The key sequences at which a domain has a rule (`[["remote_address"], ["api_key",
    /// "path"]]`): what a gateway's descriptors must look like to meet one. For tooling that
    /// checks gateway configurations against rules.
    pub fn rule_key_paths(&self, domain: &str) -> Vec<Vec<String>> {
        let mut out = Vec::new();
        if let Some(domain) = self.domains.get(domain) {
            domain.root.key_paths(&mut Vec::new(), &mut out);
        }
        out.sort();
        out.dedup();
        out
    }

    /// Rule patterns that load but are probably not what was meant: a wildcard never reached
    /// because an earlier one at its level matches everything it does, and a shadow-mode rule
    /// whose `replaces` switches off an enforced limit. `portcullis check` prints them.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut names: Vec<&String> = self.domains.keys().collect();
        names.sort();
        for name in names {
            self.domains[name].root.shadowed_wildcards(&mut out);
        }
        let rules = self.rules();
        for rule in rules.iter().filter(|r| r.shadow_mode) {
            for replaced in &rule.replaces {
                let enforced = rules.iter().find(|r| {
                    r.domain == rule.domain
                        && r.names().any(|n| n == replaced)
                        && !r.shadow_mode
                        && !r.is_unlimited()
                });
                if let Some(enforced) = enforced {
                    let at = rule
                        .source
                        .as_ref()
                        .map_or(String::new(), |s| format!("{s}: "));
                    out.push(format!(
                        "{at}{} is in shadow mode but replaces {replaced:?} ({}): where both \
                         apply, neither limit is enforced",
                        rule.full_key, enforced.full_key
                    ));
                }
            }
        }
        out
    }

    /// Every configured rule, domain by domain, in a stable order.
    pub fn rules(&self) -> Vec<&Arc<Rule>> {
        let mut names: Vec<&String> = self.domains.keys().collect();
        names.sort();
        let mut out = Vec::new();
        for name in names {
            self.domains[name].root.rules(&mut out);
        }
        out
    }
}

/// The Go service's per-rule metric name where it is not the configured `full_key`:
/// `detailed_metric` names every level by the request's value (a shared level by its pattern);
/// otherwise a `value_to_metric` level puts the request's value where the configuration has a
/// wildcard or nothing.
fn metric_name<E: Entry>(
    domain: &str,
    entries: &[E],
    path: &[(Matched<'_>, &Node)],
    rule: &Rule,
    shared: &[(usize, &str)],
) -> Option<String> {
    let pattern_at = |i: usize| shared.iter().find(|(s, _)| *s == i).map(|(_, p)| *p);
    let mut name = String::from(domain);
    if rule.detailed_metric {
        for (i, e) in entries.iter().enumerate() {
            name.push('.');
            name.push_str(e.key());
            match pattern_at(i) {
                Some(pattern) => {
                    name.push('_');
                    name.push_str(pattern);
                }
                // Go writes `key_` even for an empty value here (and not on the shared path).
                None if shared.is_empty() => {
                    name.push('_');
                    name.push_str(e.value());
                }
                None if !e.value().is_empty() => {
                    name.push('_');
                    name.push_str(e.value());
                }
                None => {}
            }
        }
        return Some(name);
    }
    if !path.iter().any(|(_, node)| node.value_to_metric) {
        return None;
    }
    for ((matched, node), e) in path.iter().zip(entries) {
        let value = match matched {
            Matched::Wildcard(pattern) if node.share_threshold => pattern,
            Matched::Wildcard(_) if node.value_to_metric => e.value(),
            Matched::Wildcard(pattern) => pattern,
            Matched::Exact => e.value(),
            Matched::Default if node.value_to_metric => e.value(),
            Matched::Default => "",
        };
        name.push('.');
        name.push_str(e.key());
        if !value.is_empty() {
            name.push('_');
            name.push_str(value);
        }
    }
    (name != rule.full_key).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(yaml: &str) -> Snapshot {
        let files = RuleFiles {
            files: vec![(PathBuf::from("t.yaml"), yaml.as_bytes().to_vec())],
        };
        parse(&files, LoadOptions::default()).expect("rules load")
    }

    fn resolve<'a>(s: &'a Snapshot, entries: &[(&str, &str)]) -> Resolved<'a> {
        match s.resolve("d", entries) {
            Lookup::Rule(resolved) => resolved,
            other => panic!("no rule: {other:?}"),
        }
    }

    #[test]
    fn metric_names_follow_the_go_service() {
        let s = snapshot(
            r#"
domain: d
descriptors:
  - key: path
    value: /api/*
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 1}
  - key: file
    value: /f/*
    share_threshold: true
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: shop
    value: /s/*
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: tenant
    value_to_metric: true
    descriptors:
      - key: user
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 1}
"#,
        );
        // No flags: the configured name, wildcard pattern and all.
        let r = resolve(&s, &[("path", "/api/x"), ("user", "u")]);
        assert_eq!(r.rule.full_key, "d.path_/api/*.user");
        assert_eq!(r.metric_name, None);
        assert!(r.shared.is_empty());
        // share_threshold with detailed_metric: the pattern, never the value.
        let r = resolve(&s, &[("file", "/f/secret")]);
        assert_eq!(r.metric_name.as_deref(), Some("d.file_/f/*"));
        assert_eq!(r.shared, vec![(0, "/f/*")]);
        // value_to_metric on a wildcard: the request's value.
        let r = resolve(&s, &[("shop", "/s/42")]);
        assert_eq!(r.metric_name.as_deref(), Some("d.shop_/s/42"));
        // detailed_metric names every level by its value, `key_` even when it is empty.
        let r = resolve(&s, &[("tenant", "acme"), ("user", "")]);
        assert_eq!(r.metric_name.as_deref(), Some("d.tenant_acme.user_"));
    }

    /// A file whose descriptors nest `depth` levels, a rule at the bottom.
    fn nested(depth: usize) -> String {
        let mut yaml = String::from("domain: d\ndescriptors:\n");
        for level in 0..depth {
            let pad = "    ".repeat(level);
            yaml.push_str(&format!("{pad}  - key: k{level}\n"));
            if level + 1 < depth {
                yaml.push_str(&format!("{pad}    descriptors:\n"));
            } else {
                yaml.push_str(&format!(
                    "{pad}    rate_limit: {{unit: second, requests_per_unit: 1}}\n"
                ));
            }
        }
        yaml
    }

    fn load_text(yaml: &str) -> Result<Snapshot, RulesError> {
        let files = RuleFiles {
            files: vec![(PathBuf::from("t.yaml"), yaml.as_bytes().to_vec())],
        };
        parse(&files, LoadOptions::default())
    }

    #[test]
    fn nesting_is_bounded_with_an_error_never_a_stack_overflow() {
        // On a thread with a small stack (the loader runs on 2 MiB threads): a crafted file
        // used to overflow it (found by the fuzz corpus).
        let outcome = std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(|| {
                let deepest =
                    load_text(&nested(yaml::MAX_NESTING)).expect("the deepest allowed loads");
                let entries: Vec<(String, String)> = (0..yaml::MAX_NESTING)
                    .map(|l| (format!("k{l}"), "v".to_owned()))
                    .collect();
                let entries: Vec<(&str, &str)> = entries
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str()))
                    .collect();
                assert!(matches!(deepest.resolve("d", &entries), Lookup::Rule(_)));
                let one_more = load_text(&nested(yaml::MAX_NESTING + 1))
                    .unwrap_err()
                    .to_string();
                assert!(
                    one_more.contains("descriptors nest deeper than 16 levels"),
                    "{one_more}"
                );
                for depth in [40, 200, 5_000] {
                    let error = load_text(&nested(depth)).unwrap_err().to_string();
                    assert!(error.contains("t.yaml"), "{error}");
                }
                let flow = format!(
                    "domain: d\ndescriptors: {}{}",
                    "[".repeat(100_000),
                    "]".repeat(100_000)
                );
                assert!(load_text(&flow).is_err());
            })
            .expect("thread")
            .join();
        assert!(outcome.is_ok(), "loading deep files panicked");
    }

    #[test]
    fn layered_rules_are_validated_layer_by_layer() {
        let error = |yaml: &str| load_text(yaml).unwrap_err().to_string();
        let both = error(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n    rate_limits:\n      - {unit: hour, requests_per_unit: 5}\n",
        );
        assert!(both.contains("descriptors[0].rate_limits: set rate_limit (one limit) or rate_limits (layers), not both"), "{both}");
        let empty = error("domain: d\ndescriptors:\n  - key: k\n    rate_limits: []\n");
        assert!(empty.contains("must list at least one limit"), "{empty}");
        let unlimited = error(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n      - {unlimited: true}\n",
        );
        assert!(
            unlimited.contains("rate_limits[0].unlimited: a layer cannot be unlimited"),
            "{unlimited}"
        );
        let bad_unit = error(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n      - {unit: hour, requests_per_unit: 5}\n      - {unit: fortnight, requests_per_unit: 5}\n",
        );
        assert!(
            bad_unit.contains("descriptors[0].rate_limits[1].unit"),
            "{bad_unit}"
        );
        let twice = error(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n      - {name: a, unit: hour, requests_per_unit: 5}\n      - {name: a, unit: day, requests_per_unit: 50}\n",
        );
        assert!(
            twice.contains("\"a\" names another layer of this rule already"),
            "{twice}"
        );
        let itself = error(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n      - {name: a, unit: hour, requests_per_unit: 5}\n      - {name: b, unit: day, requests_per_unit: 50, replaces: [{name: a}]}\n",
        );
        assert!(itself.contains("a rule cannot replace itself"), "{itself}");
        let mut many = String::from("domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n");
        for n in 0..=yaml::MAX_LAYERS {
            many.push_str(&format!(
                "      - {{unit: hour, requests_per_unit: {}}}\n",
                n + 1
            ));
        }
        assert!(error(&many).contains("more than the 8 allowed"));

        let s = snapshot(
            "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: true\n    rate_limits:\n      - {name: burst, unit: second, requests_per_unit: 10, algorithm: token_bucket, burst: 20}\n      - {unit: hour, requests_per_unit: 1000}\n",
        );
        let r = resolve(&s, &[("k", "v")]);
        assert_eq!(r.rule.layers.len(), 2);
        assert_eq!(
            r.rule.describe(),
            "d.k: 10 per second, token_bucket, burst 20, name \"burst\" AND 1000 per hour, sliding_window, shadow_mode"
        );
        assert_eq!(r.rule.names().collect::<Vec<_>>(), vec!["burst"]);
    }
}
