//! A parsed rules file turned into its domain's matcher tree, every field checked on the way
//! (units, counts, algorithms and bursts, layers, replaces, wildcards, nesting), each problem
//! with its file and line. It must never half-build a domain: a file with a problem yields none.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use super::error::RuleError;
use serde_saphyr::Spanned;

use super::yaml::{DescriptorYaml, FileYaml, MAX_LAYERS, MAX_NESTING, RateLimitYaml};
use super::{Domain, KeyMatchers, Layer, Level, Node, Rule, Source, Unit};
use crate::algorithm::{Algorithm, Limit};

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

    /// A layered rule (`rate_limits:`): each layer validated like a `rate_limit`, none unlimited,
    /// names distinct.
    fn layered(
        &mut self,
        domain: &str,
        full_key: &str,
        here: &str,
        line: u64,
        list: Vec<Spanned<RateLimitYaml>>,
        flags: Flags,
    ) -> Option<Rule> {
        let field = format!("{here}.rate_limits");
        if list.is_empty() {
            self.error(line, field, "must list at least one limit");
            return None;
        }
        if list.len() > MAX_LAYERS {
            self.error(
                line,
                field,
                format!(
                    "lists {} limits, more than the {MAX_LAYERS} allowed",
                    list.len()
                ),
            );
            return None;
        }
        let errors_before = self.errors.len();
        let mut layers: Vec<Layer> = Vec::new();
        let mut replaces: Vec<String> = Vec::new();
        // The first layer's rule carries what all layers share (the descriptor's flags).
        let mut first: Option<Rule> = None;
        for (i, spanned) in list.into_iter().enumerate() {
            let at = format!("{field}[{i}]");
            let layer_line = spanned.referenced.line();
            if let Some(u) = spanned.value.unlimited.as_ref().filter(|u| u.value) {
                self.error(
                    u.referenced.line(),
                    format!("{at}.unlimited"),
                    "a layer cannot be unlimited (leave the descriptor without limits instead)",
                );
                continue;
            }
            let Some(rule) = self.rule(domain, full_key, &at, spanned, flags.clone()) else {
                continue;
            };
            let (Some(limit), Some(unit)) = (rule.limit, rule.unit) else {
                continue;
            };
            if let Some(name) = &rule.name
                && layers.iter().any(|l| l.name.as_ref() == Some(name))
            {
                self.error(
                    layer_line,
                    format!("{at}.name"),
                    format!("{name:?} names another layer of this rule already"),
                );
                continue;
            }
            replaces.extend(rule.replaces.iter().cloned());
            layers.push(Layer {
                name: rule.name.clone(),
                limit,
                requests_per_unit: rule.requests_per_unit,
                unit,
            });
            first.get_or_insert(rule);
        }
        for target in &replaces {
            if layers.iter().any(|l| l.name.as_ref() == Some(target)) {
                self.error(
                    line,
                    format!("{field}.replaces"),
                    format!("{target:?} is a layer of this rule: a rule cannot replace itself"),
                );
            }
        }
        if self.errors.len() > errors_before {
            return None;
        }
        // The first layer's limit stands for the rule where one limit is asked for.
        Some(Rule {
            name: None,
            replaces,
            source: Some(self.source(line)),
            layers,
            ..first?
        })
    }

    /// One limit: `at` is where it is written (`descriptors[0].rate_limit`, or a layer's
    /// `descriptors[0].rate_limits[1]`), for the errors.
    fn rule(
        &mut self,
        domain: &str,
        full_key: &str,
        at: &str,
        spanned: Spanned<RateLimitYaml>,
        flags: Flags,
    ) -> Option<Rule> {
        let line = spanned.referenced.line();
        let field = |name: &str| format!("{at}.{name}");
        let rl = spanned.value;
        let errors_before = self.errors.len();
        let unlimited = rl.unlimited.as_ref().is_some_and(|u| u.value);

        let name = rl.name.map(|n| n.value).filter(|n| !n.is_empty());
        let mut replaces = Vec::new();
        for (i, r) in rl.replaces.unwrap_or_default().into_iter().enumerate() {
            let r_line = r.referenced.line();
            match r.value.name.map(|n| n.value).filter(|n| !n.is_empty()) {
                None => self.error(
                    r_line,
                    field(&format!("replaces[{i}].name")),
                    "is required and must not be empty",
                ),
                Some(target) if Some(&target) == name.as_ref() => self.error(
                    r_line,
                    field(&format!("replaces[{i}].name")),
                    format!("{target:?} is this rule's own name: a rule cannot replace itself"),
                ),
                Some(target) => replaces.push(target),
            }
        }

        let algorithm = match &rl.algorithm {
            None => self.default_algorithm,
            Some(a) => match a.value.as_str() {
                "sliding_window" => Algorithm::SlidingWindow,
                "token_bucket" => Algorithm::TokenBucket,
                "fixed_window" => Algorithm::FixedWindow,
                other => {
                    self.error(
                        a.referenced.line(),
                        field("algorithm"),
                        format!(
                            "{other:?} is not one of sliding_window, token_bucket, fixed_window"
                        ),
                    );
                    self.default_algorithm
                }
            },
        };

        let requests = match &rl.requests_per_unit {
            Some(r) if r.value > u64::from(u32::MAX) => {
                self.error(
                    r.referenced.line(),
                    field("requests_per_unit"),
                    format!(
                        "{} is above the most Envoy can carry ({})",
                        r.value,
                        u32::MAX
                    ),
                );
                0
            }
            Some(r) => r.value as u32,
            // The Go service reads a missing count as 0 (deny everything); so do we.
            None => 0,
        };

        let unit = if unlimited {
            if let Some(u) = &rl.unit {
                self.error(
                    u.referenced.line(),
                    field("unit"),
                    "must not be set when unlimited is true",
                );
            }
            if let Some(a) = &rl.algorithm {
                self.error(
                    a.referenced.line(),
                    field("algorithm"),
                    "must not be set when unlimited is true",
                );
            }
            None
        } else {
            match &rl.unit {
                None => {
                    self.error(line, field("unit"), "is required (second, minute, hour, day, week, month or year) unless unlimited is true");
                    None
                }
                Some(u) => {
                    match Unit::parse(&u.value) {
                        Some(unit) => Some(unit),
                        None => {
                            self.error(
                            u.referenced.line(),
                            field("unit"),
                            format!("{:?} is not one of second, minute, hour, day, week, month, year", u.value),
                        );
                            None
                        }
                    }
                }
            }
        };

        let burst = match &rl.burst {
            None => u64::from(requests),
            Some(b) => {
                if algorithm != Algorithm::TokenBucket {
                    self.error(
                        b.referenced.line(),
                        field("burst"),
                        format!("only applies to algorithm token_bucket, not {algorithm}"),
                    );
                } else if b.value < 1 {
                    self.error(b.referenced.line(), field("burst"), "must be at least 1");
                } else if b.value > u64::from(u32::MAX) {
                    self.error(
                        b.referenced.line(),
                        field("burst"),
                        format!("must be at most {}", u32::MAX),
                    );
                }
                b.value
            }
        };

        if self.errors.len() > errors_before {
            return None;
        }
        let limit = unit.map(|unit| Limit {
            algorithm,
            requests: u64::from(requests),
            window_us: unit.window_us(),
            burst,
        });
        Some(Rule {
            full_key: full_key.to_owned(),
            domain: domain.to_owned(),
            limit,
            requests_per_unit: requests,
            unit,
            name,
            replaces,
            shadow_mode: flags.shadow_mode,
            quota_mode: flags.quota_mode,
            post_paid: flags.post_paid,
            detailed_metric: flags.detailed_metric,
            metadata: flags.metadata,
            source: Some(self.source(line)),
            layers: Vec::new(),
        })
    }
}
