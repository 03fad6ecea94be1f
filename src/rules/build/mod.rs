//! A parsed rules file turned into its domain's matcher tree, every field checked on the way
//! (units, counts, algorithms and bursts, layers, replaces, wildcards, nesting), each problem
//! with its file and line. It must never half-build a domain: a file with a problem yields none.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use super::error::RuleError;
use serde_saphyr::Spanned;

use super::yaml::{DescriptorYaml, FileYaml, MAX_NESTING};
use super::{Domain, KeyMatchers, Level, Node, Source};
use crate::algorithm::Algorithm;

mod limit;

/// Validates one parsed file and builds its domain; every problem found is pushed to `errors`.
pub(crate) fn build(
    file: &Arc<PathBuf>,
    parsed: FileYaml,
    default_algorithm: Algorithm,
    errors: &mut Vec<RuleError>,
) -> Option<Domain> {
    let mut ctx = Ctx {
        file,
        errors,
        default_algorithm,
    };
    let Some(domain) = parsed.domain else {
        ctx.error(1, "domain", "is required");
        return None;
    };
    if domain.value.is_empty() {
        ctx.error(domain.referenced.line(), "domain", "must not be empty");
        return None;
    }
    let mut root = Level::default();
    let descriptors = parsed.descriptors.unwrap_or_default();
    ctx.level(&domain.value, &domain.value, "", descriptors, &mut root, 1);
    Some(Domain::new(
        domain.value,
        Source {
            file: file.clone(),
            line: domain.referenced.line(),
        },
        root,
    ))
}

/// The descriptor-level settings a rule carries.
#[derive(Clone)]
struct Flags {
    shadow_mode: bool,
    quota_mode: bool,
    post_paid: bool,
    detailed_metric: bool,
    metadata: Option<Arc<serde_json::Map<String, serde_json::Value>>>,
}

struct Ctx<'a> {
    file: &'a Arc<PathBuf>,
    errors: &'a mut Vec<RuleError>,
    default_algorithm: Algorithm,
}

impl Ctx<'_> {
    fn error(&mut self, line: u64, field: impl Into<String>, message: impl Into<String>) {
        self.errors.push(RuleError {
            file: self.file.as_ref().clone(),
            line,
            field: field.into(),
            message: message.into(),
        });
    }

    fn source(&self, line: u64) -> Source {
        Source {
            file: self.file.clone(),
            line,
        }
    }

    /// Loads the descriptors of one level into `level`.
    fn level(
        &mut self,
        domain: &str,
        parent_key: &str,
        path: &str,
        descriptors: Vec<Spanned<DescriptorYaml>>,
        level: &mut Level,
        depth: usize,
    ) {
        if depth > MAX_NESTING {
            if let Some(first) = descriptors.first() {
                self.error(
                    first.referenced.line(),
                    format!("{path}descriptors"),
                    format!("descriptors nest deeper than {MAX_NESTING} levels"),
                );
            }
            return;
        }
        // (key, value) -> line of its first definition at this level.
        let mut seen: HashMap<(String, String), u64> = HashMap::new();
        for (index, spanned) in descriptors.into_iter().enumerate() {
            let line = spanned.referenced.line();
            let here = format!("{path}descriptors[{index}]");
            let d = spanned.value;
            let Some(key) = d.key.filter(|k| !k.value.is_empty()) else {
                self.error(
                    line,
                    format!("{here}.key"),
                    "is required and must not be empty",
                );
                continue;
            };
            let key_line = key.referenced.line();
            let key = key.value;
            let value = d.value.map(|v| v.value).unwrap_or_default();
            if let Some(first) = seen.insert((key.clone(), value.clone()), key_line) {
                let shown = if value.is_empty() {
                    format!("key {key:?} without a value")
                } else {
                    format!("key {key:?} with value {value:?}")
                };
                self.error(
                    key_line,
                    format!("{here}.key"),
                    format!("duplicate descriptor: {shown} is already defined at line {first}"),
                );
                continue;
            }
            let full_key = if value.is_empty() {
                format!("{parent_key}.{key}")
            } else {
                format!("{parent_key}.{key}_{value}")
            };
            let share_threshold = match d.share_threshold {
                Some(share) if share.value && !value.contains('*') => {
                    self.error(
                        share.referenced.line(),
                        format!("{here}.share_threshold"),
                        format!("only applies to a wildcard value (containing '*'), not {value:?}"),
                    );
                    false
                }
                Some(share) => share.value,
                None => false,
            };
            let flags = Flags {
                shadow_mode: d.shadow_mode.unwrap_or(false),
                quota_mode: d.quota_mode.unwrap_or(false),
                post_paid: d.post_paid.unwrap_or(false),
                detailed_metric: d.detailed_metric.unwrap_or(false),
                metadata: d.metadata.filter(|m| !m.is_empty()).map(Arc::new),
            };
            let rule = match (d.rate_limit, d.rate_limits) {
                (Some(_), Some(_)) => {
                    self.error(
                        line,
                        format!("{here}.rate_limits"),
                        "set rate_limit (one limit) or rate_limits (layers), not both",
                    );
                    None
                }
                (Some(rl), None) => {
                    self.rule(domain, &full_key, &format!("{here}.rate_limit"), rl, flags)
                }
                (None, Some(list)) => self.layered(domain, &full_key, &here, line, list, flags),
                (None, None) => None,
            };
            let mut node = Node {
                rule: rule.map(Arc::new),
                children: Level::default(),
                source: self.source(key_line),
                share_threshold,
                value_to_metric: d.value_to_metric.unwrap_or(false),
            };
            if let Some(children) = d.descriptors {
                self.level(
                    domain,
                    &full_key,
                    &format!("{here}."),
                    children,
                    &mut node.children,
                    depth + 1,
                );
            }
            let matchers: &mut KeyMatchers = level.by_key.entry(key).or_default();
            if value.is_empty() {
                matchers.default = Some(Box::new(node));
            } else if value.contains('*') {
                matchers.wildcards.push((value, node));
            } else {
                matchers.exact.insert(value, node);
            }
        }
    }
}
