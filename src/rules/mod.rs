//! Rules: what the YAML says (`yaml`), loaded from a directory into an immutable `Snapshot` that
//! answers "which rule applies to this descriptor". Matching is envoyproxy/ratelimit's: per level
//! the exact value, else the first matching wildcard in file order, else the value-less default;
//! a rule applies only at the request's full depth; no backtracking.
//!
//! Nothing here counts or knows about protobuf; a snapshot is never changed once built (a reload
//! builds a new one), so in-flight calls keep the rules they started with.

pub mod glob;
mod load;
mod yaml;

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use crate::algorithm::{Algorithm, Limit, US_PER_SECOND};

pub use load::{RuleError, RuleFiles, RulesError, load_dir, parse, parse_file, read_dir};

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
    pub detailed_metric: bool,
    pub source: Option<Source>,
}

impl Rule {
    pub fn is_unlimited(&self) -> bool {
        self.limit.is_none()
    }

    /// One line for listings (`/rlconfig`, `explain`).
    pub fn describe(&self) -> String {
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
#[derive(Debug, Clone, Copy)]
pub enum Lookup<'a> {
    UnknownDomain,
    NoRule,
    Rule(&'a Arc<Rule>),
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
}

impl Level {
    fn find(&self, key: &str, value: &str) -> Option<(&Node, MatchKind)> {
        let matchers = self.by_key.get(key)?;
        if let Some(node) = matchers.exact.get(value) {
            return Some((node, MatchKind::Exact));
        }
        if let Some((pattern, node)) = matchers
            .wildcards
            .iter()
            .find(|(pattern, _)| glob::matches(pattern, value))
        {
            return Some((node, MatchKind::Wildcard(pattern.clone())));
        }
        matchers.default.as_deref().map(|n| (n, MatchKind::Default))
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
}

/// A domain's descriptor tree.
#[derive(Debug)]
pub struct Domain {
    pub name: String,
    pub source: Source,
    root: Level,
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
        let Some(domain) = self.domains.get(domain) else {
            return Lookup::UnknownDomain;
        };
        let mut level = &domain.root;
        for (depth, entry) in entries.iter().enumerate() {
            let found = level.find(entry.key(), entry.value());
            trace(Step {
                key: entry.key().to_owned(),
                value: entry.value().to_owned(),
                matched: found.as_ref().map(|(n, k)| (k.clone(), n.source.clone())),
                has_rule: found.as_ref().is_some_and(|(n, _)| n.rule.is_some()),
            });
            let Some((node, _)) = found else { break };
            if depth + 1 == entries.len() {
                return node.rule.as_ref().map_or(Lookup::NoRule, Lookup::Rule);
            }
            level = &node.children;
        }
        Lookup::NoRule
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
