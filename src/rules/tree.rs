//! The matcher tree of one domain: per level, exact values, wildcards in file order and the
//! value-less default; the steps of a lookup (for `explain`) and what it resolved to; merging
//! domains written in several files. It must never backtrack: a level picks one node.

use std::collections::HashMap;
use std::sync::Arc;

use super::RuleError;
use super::model::{Rule, Source};

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
pub(super) enum Matched<'a> {
    Exact,
    Wildcard(&'a str),
    Default,
}

impl Matched<'_> {
    pub(super) fn owned(self) -> MatchKind {
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
    pub(super) by_key: HashMap<String, KeyMatchers>,
}

#[derive(Debug, Default)]
pub(crate) struct KeyMatchers {
    pub(super) exact: HashMap<String, Node>,
    /// In file order: the first match wins.
    pub(super) wildcards: Vec<(String, Node)>,
    pub(super) default: Option<Box<Node>>,
}

#[derive(Debug)]
pub(crate) struct Node {
    pub(super) rule: Option<Arc<Rule>>,
    pub(super) children: Level,
    pub(super) source: Source,
    /// `share_threshold`: values matched by this wildcard share one counter.
    pub(super) share_threshold: bool,
    /// `value_to_metric`: the request's value at this level goes into the metric name.
    pub(super) value_to_metric: bool,
}

impl Level {
    pub(super) fn find(&self, key: &str, value: &str) -> Option<(&Node, Matched<'_>)> {
        let matchers = self.by_key.get(key)?;
        if let Some(node) = matchers.exact.get(value) {
            return Some((node, Matched::Exact));
        }
        if let Some((pattern, node)) = matchers
            .wildcards
            .iter()
            .find(|(pattern, _)| super::glob::matches(pattern, value))
        {
            return Some((node, Matched::Wildcard(pattern)));
        }
        matchers.default.as_deref().map(|n| (n, Matched::Default))
    }

    pub(super) fn rules<'a>(&'a self, out: &mut Vec<&'a Arc<Rule>>) {
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

    pub(super) fn key_paths(&self, path: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
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

    pub(super) fn shadowed_wildcards(&self, out: &mut Vec<String>) {
        let mut keys: Vec<_> = self.by_key.iter().collect();
        keys.sort_by(|a, b| a.0.cmp(b.0));
        for (key, m) in keys {
            for (i, (pattern, node)) in m.wildcards.iter().enumerate() {
                if let Some((earlier, first)) = m.wildcards[..i]
                    .iter()
                    .find(|(earlier, _)| super::glob::covers(earlier, pattern))
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
    pub(super) fn has_path_features(&self) -> bool {
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
    pub(super) root: Level,
    /// Some node names metrics from values or shares counters: lookups record their path.
    pub(super) path_features: bool,
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
