//! Rules: what the YAML says (`yaml`), loaded from a directory into an immutable `Snapshot` that
//! answers "which rule applies to this descriptor". Matching is envoyproxy/ratelimit's: per level
//! the exact value, else the first matching wildcard in file order, else the value-less default;
//! a rule applies only at the request's full depth; no backtracking.
//!
//! Nothing here counts or knows about protobuf; a snapshot is never changed once built (a reload
//! builds a new one), so in-flight calls keep the rules they started with.

mod bucket;
mod build;
mod error;
pub mod glob;
mod load;
mod metric_name;
mod model;
pub mod scaling;
mod tree;
mod yaml;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

pub use error::{RuleError, RulesError};
pub use load::{LoadOptions, RuleFiles, load_dir, parse, parse_file, read_dir, why_empty};
pub use model::{Layer, Rule, Source, Unit};
pub use tree::{Domain, Entry, Lookup, MatchKind, Resolved, Step};
pub(crate) use tree::{KeyMatchers, Level, Node};

use metric_name::metric_name;
use tree::Matched;

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
        let two_slots = error(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n      - {algorithm: concurrency, unit: hour, requests_per_unit: 5}\n      - {unit: day, requests_per_unit: 50}\n      - {algorithm: concurrency, unit: hour, requests_per_unit: 2, max_duration: 1m}\n",
        );
        assert!(
            two_slots.contains("rate_limits[2].algorithm")
                && two_slots.contains("a second concurrency limit on one descriptor"),
            "{two_slots}"
        );
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
