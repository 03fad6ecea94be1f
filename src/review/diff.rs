//! What a change to the rules does: two snapshots compared domain by domain, rule by rule (a rule
//! is known by its path, `domain.key_value.key`), each change said with both file:lines and, for
//! a limit, as a factor of the old rate. It must never guess a rename: a rule whose path changed
//! is one removed and one added.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde::Serialize;

use super::values::show_rate;
use crate::algorithm::Algorithm;
use crate::rules::{Layer, Rule, Snapshot};

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RuleChange {
    pub domain: String,
    /// The rule's path (`edge.path_/api/login`).
    pub rule: String,
    /// The rule's name, when it has one (what the text output shows).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `added`, `removed` or `changed`.
    pub kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub old_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub new_at: Option<String>,
    /// For an added or removed rule, what it is; for a changed one, each field.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub describe: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<FieldChange>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FieldChange {
    /// `limit`, `unit`-less fields by their YAML names, `layer "hourly"` for one layer.
    pub field: String,
    pub old: String,
    pub new: String,
    /// New rate over old rate, for a limit: below 1 tightens, above 1 loosens.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub factor: Option<f64>,
}

/// Every rule added, removed or changed, domain by domain in name order.
pub fn rules(old: &Snapshot, new: &Snapshot) -> Vec<RuleChange> {
    let domains: BTreeSet<&str> = old
        .domain_names()
        .into_iter()
        .chain(new.domain_names())
        .collect();
    let (old_rules, new_rules) = (keyed(old), keyed(new));
    let mut out = Vec::new();
    for domain in domains {
        let olds: Vec<_> = old_rules
            .iter()
            .filter(|(_, r)| r.domain == domain)
            .collect();
        let news: Vec<_> = new_rules
            .iter()
            .filter(|(_, r)| r.domain == domain)
            .collect();
        for (key, before) in &olds {
            let after = news.iter().find(|(k, _)| k == key).map(|(_, r)| r);
            let change = RuleChange {
                domain: domain.to_owned(),
                rule: key.clone(),
                name: after.unwrap_or(before).name.clone(),
                kind: "removed",
                old_at: at(before),
                new_at: after.and_then(|r| at(r)),
                describe: None,
                changes: Vec::new(),
            };
            match after {
                None => out.push(RuleChange {
                    describe: Some(summary(before)),
                    ..change
                }),
                Some(after) => {
                    let changes = fields(before, after);
                    if !changes.is_empty() {
                        out.push(RuleChange {
                            kind: "changed",
                            changes,
                            ..change
                        });
                    }
                }
            }
        }
        for (key, after) in news {
            if !olds.iter().any(|(k, _)| k == key) {
                out.push(RuleChange {
                    domain: domain.to_owned(),
                    rule: key.clone(),
                    name: after.name.clone(),
                    kind: "added",
                    old_at: None,
                    new_at: at(after),
                    describe: Some(summary(after)),
                    changes: Vec::new(),
                });
            }
        }
    }
    out
}

/// The rules of a snapshot by path; a path seen twice gets `#2`, `#3` so that none is lost.
fn keyed(snapshot: &Snapshot) -> Vec<(String, Arc<Rule>)> {
    let mut out: Vec<(String, Arc<Rule>)> = Vec::new();
    for rule in snapshot.rules() {
        let mut key = rule.full_key.clone();
        let mut n = 1;
        while out.iter().any(|(k, _)| *k == key) {
            n += 1;
            key = format!("{}#{n}", rule.full_key);
        }
        out.push((key, rule.clone()));
    }
    out
}

fn at(rule: &Rule) -> Option<String> {
    rule.source.as_ref().map(ToString::to_string)
}

/// What a rule is, without its path: `5/minute, token_bucket, burst 10`.
pub fn summary(rule: &Rule) -> String {
    let described = rule.describe();
    match described.split_once(": ") {
        Some((_, rest)) => rest.to_owned(),
        None => described,
    }
}

/// Requests per second, for factors between units.
fn rate(count: u32, unit_seconds: u64) -> f64 {
    f64::from(count) / unit_seconds as f64
}

fn factor(old: (u32, u64), new: (u32, u64)) -> Option<f64> {
    let before = rate(old.0, old.1);
    (before > 0.0).then(|| {
        let f = rate(new.0, new.1) / before;
        // Three significant decimals: 0.6, not 0.6000000000000001.
        (f * 1000.0).round() / 1000.0
    })
}

fn limit_text(rule: &Rule) -> String {
    match rule.unit {
        _ if rule.is_unlimited() => "unlimited".into(),
        Some(unit) => show_rate(rule.requests_per_unit, unit),
        None => "none".into(),
    }
}

fn algorithm_of(rule: &Rule) -> Option<Algorithm> {
    rule.limit.map(|l| l.algorithm)
}

fn fields(old: &Rule, new: &Rule) -> Vec<FieldChange> {
    let mut out = Vec::new();
    let mut push = |field: &str, old: String, new: String, factor: Option<f64>| {
        if old != new {
            out.push(FieldChange {
                field: field.to_owned(),
                old,
                new,
                factor,
            });
        }
    };
    if old.layers.is_empty() && new.layers.is_empty() {
        let f = match (old.unit, new.unit, old.is_unlimited() || new.is_unlimited()) {
            (Some(a), Some(b), false) => factor(
                (old.requests_per_unit, a.seconds()),
                (new.requests_per_unit, b.seconds()),
            ),
            _ => None,
        };
        push("limit", limit_text(old), limit_text(new), f);
        let show = |a: Option<Algorithm>| a.map_or("none".into(), |a| a.to_string());
        push(
            "algorithm",
            show(algorithm_of(old)),
            show(algorithm_of(new)),
            None,
        );
        let burst = |r: &Rule| {
            r.limit
                .filter(|l| l.algorithm == Algorithm::TokenBucket)
                .map_or("none".into(), |l| l.burst.to_string())
        };
        push("burst", burst(old), burst(new), None);
    } else {
        let mut changed = Vec::new();
        layers(&old.layers, &new.layers, &mut changed);
        for c in changed {
            push(&c.field, c.old, c.new, c.factor);
        }
    }
    let flag = |b: bool| b.to_string();
    push(
        "shadow_mode",
        flag(old.shadow_mode),
        flag(new.shadow_mode),
        None,
    );
    push(
        "quota_mode",
        flag(old.quota_mode),
        flag(new.quota_mode),
        None,
    );
    push("post_paid", flag(old.post_paid), flag(new.post_paid), None);
    let name = |r: &Rule| r.name.clone().unwrap_or_else(|| "none".into());
    push("name", name(old), name(new), None);
    let replaces = |r: &Rule| format!("{:?}", r.replaces);
    push("replaces", replaces(old), replaces(new), None);
    out
}

/// Layers matched by name (by position for unnamed ones); each one's limit with its factor.
fn layers(old: &[Layer], new: &[Layer], out: &mut Vec<FieldChange>) {
    let label = |l: &Layer, i: usize| match &l.name {
        Some(name) => format!("layer {name:?}"),
        None => format!("layer {}", i + 1),
    };
    let same = |a: &Layer, i: usize, b: &Layer, j: usize| match (&a.name, &b.name) {
        (Some(x), Some(y)) => x == y,
        (None, None) => i == j,
        _ => false,
    };
    for (i, before) in old.iter().enumerate() {
        let after = new.iter().enumerate().find(|(j, l)| same(before, i, l, *j));
        let field = label(before, i);
        match after {
            None => out.push(FieldChange {
                field,
                old: before.describe(),
                new: "none".into(),
                factor: None,
            }),
            Some((_, after)) if after.describe() != before.describe() => out.push(FieldChange {
                field,
                old: before.describe(),
                new: after.describe(),
                factor: factor(
                    (before.requests_per_unit, before.unit.seconds()),
                    (after.requests_per_unit, after.unit.seconds()),
                ),
            }),
            Some(_) => {}
        }
    }
    for (j, after) in new.iter().enumerate() {
        if !old.iter().enumerate().any(|(i, l)| same(l, i, after, j)) {
            out.push(FieldChange {
                field: label(after, j),
                old: "none".into(),
                new: after.describe(),
                factor: None,
            });
        }
    }
}

/// `login: 5/minute -> 3/minute, 0.6x (tighter)` and the like, one change per line.
pub fn text(changes: &[RuleChange]) -> String {
    let mut out = String::new();
    let mut domain = "";
    for c in changes {
        if c.domain != domain {
            domain = &c.domain;
            out.push_str(&format!("domain {domain}:\n"));
        }
        let label = c.name.as_deref().unwrap_or(&c.rule);
        let both = match (&c.old_at, &c.new_at) {
            (Some(a), Some(b)) => format!("{a} -> {b}"),
            (Some(a), None) | (None, Some(a)) => a.clone(),
            (None, None) => String::new(),
        };
        match c.kind {
            "changed" => {
                for f in &c.changes {
                    let factor = f.factor.map_or(String::new(), |x| {
                        let way = if x < 1.0 {
                            "tighter"
                        } else if x > 1.0 {
                            "looser"
                        } else {
                            "the same rate"
                        };
                        format!(", {x}x ({way})")
                    });
                    let field = if f.field == "limit" {
                        String::new()
                    } else {
                        format!(" {}", f.field)
                    };
                    out.push_str(&format!(
                        "  changed {label}{field}: {} -> {}{factor} [{} at {both}]\n",
                        f.old, f.new, c.rule
                    ));
                }
            }
            kind => out.push_str(&format!(
                "  {kind} {label}: {} [{} at {both}]\n",
                c.describe.as_deref().unwrap_or_default(),
                c.rule
            )),
        }
    }
    out
}
