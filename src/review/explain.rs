//! What one descriptor meets, as the serving code plans it: the lookup level by level, the rule
//! matched, and the decider's own plan of the call (scaled, the request's override applied,
//! `replaces` applied). `portcullis explain` prints it and `portcullis test` checks it, so the two
//! always agree. It must never count: nothing here touches a store.

use std::fmt::Write as _;
use std::sync::Arc;

use crate::pb::rate_limit_descriptor::{Entry, RateLimitOverride};
use crate::pb::{RateLimitDescriptor, RateLimitRequest, RateLimitUnit};
use crate::rules::scaling::Scaling;
use crate::rules::{Lookup, MatchKind, Rule, Snapshot, Step, Unit};
use crate::service::{Decider, Planned};

/// A call as a test or `explain` describes it: the descriptor under study first.
#[derive(Debug, Clone, Default)]
pub struct Call {
    pub domain: String,
    pub descriptor: Vec<(String, String)>,
    /// The limit the descriptor carries (Envoy's override).
    pub limit: Option<(u32, Unit)>,
    /// The descriptor's own `hits_addend`, and whether its hits are given back.
    pub hits: Option<u32>,
    pub refund: bool,
    /// Other descriptors of the same call.
    pub also: Vec<Vec<(String, String)>>,
}

impl Call {
    /// The `ShouldRateLimit` request Envoy would send for this call.
    pub fn request(&self) -> RateLimitRequest {
        let descriptor = |entries: &[(String, String)]| RateLimitDescriptor {
            entries: entries
                .iter()
                .map(|(key, value)| Entry {
                    key: key.clone(),
                    value: value.clone(),
                })
                .collect(),
            ..Default::default()
        };
        let mut first = descriptor(&self.descriptor);
        first.limit = self
            .limit
            .map(|(requests_per_unit, unit)| RateLimitOverride {
                requests_per_unit,
                unit: pb_unit(unit) as i32,
            });
        first.hits_addend = self.hits.map(u64::from);
        first.is_negative_hits = self.refund;
        let mut descriptors = vec![first];
        descriptors.extend(self.also.iter().map(|d| descriptor(d)));
        RateLimitRequest {
            domain: self.domain.clone(),
            descriptors,
            hits_addend: 0,
        }
    }
}

pub(super) fn pb_unit(unit: Unit) -> RateLimitUnit {
    match unit {
        Unit::Second => RateLimitUnit::Second,
        Unit::Minute => RateLimitUnit::Minute,
        Unit::Hour => RateLimitUnit::Hour,
        Unit::Day => RateLimitUnit::Day,
        Unit::Week => RateLimitUnit::Week,
        Unit::Month => RateLimitUnit::Month,
        Unit::Year => RateLimitUnit::Year,
    }
}

/// What the descriptor meets.
#[derive(Debug)]
pub struct Explanation {
    pub domain_known: bool,
    /// How each level matched, up to where the lookup stopped.
    pub steps: Vec<Step>,
    /// The configured rule it matches, as written (before scaling and `replaces`).
    pub matched: Option<Arc<Rule>>,
    /// Levels whose wildcard makes every matching value share one counter.
    pub shared: Vec<(usize, String)>,
    pub metric_name: Option<String>,
    /// The decider's plan for the descriptor: the rule in force (scaled, or the request's own
    /// limit), `None` when nothing limits it.
    pub planned: Planned,
}

impl Explanation {
    /// The matched rule, or part of it, was dropped by a `replaces` of the same call.
    pub fn replaced(&self) -> bool {
        let Some(matched) = &self.matched else {
            return false;
        };
        if matched.is_unlimited() || self.has_override() {
            return false;
        }
        match &self.planned.rule {
            None => true,
            Some(_) => self.planned.layers.len() < matched.layers.len(),
        }
    }

    /// The rule in force for the descriptor, when one limits or exempts it.
    pub fn rule(&self) -> Option<&Arc<Rule>> {
        self.planned.rule.as_ref()
    }

    fn has_override(&self) -> bool {
        self.planned
            .rule
            .as_ref()
            .is_some_and(|r| r.source.is_none())
    }
}

/// Explains `call` through `decider` (which must serve `snapshot`).
pub fn explain(decider: &Decider, snapshot: &Snapshot, call: &Call) -> Result<Explanation, String> {
    let (lookup, steps) = snapshot.explain(&call.domain, &call.descriptor);
    let domain_known = !matches!(lookup, Lookup::UnknownDomain);
    let (matched, shared, metric_name) = match lookup {
        Lookup::Rule(resolved) => (
            Some(resolved.rule.clone()),
            resolved
                .shared
                .iter()
                .map(|(i, p)| (*i, (*p).to_owned()))
                .collect(),
            resolved.metric_name,
        ),
        _ => (None, Vec::new(), None),
    };
    let mut planned = decider
        .plan_call(&call.request())
        .map_err(|s| format!("the call is refused: {}", s.message()))?;
    let planned = planned.swap_remove(0);
    Ok(Explanation {
        domain_known,
        steps,
        matched,
        shared,
        metric_name,
        planned,
    })
}

/// `portcullis explain`'s text: each level, the rule, shared counters, metric name, scaling.
pub fn render(e: &Explanation, call: &Call, snapshot: &Snapshot, scaling: &Scaling) -> String {
    let mut out = String::new();
    if !e.domain_known {
        let _ = writeln!(
            out,
            "domain {:?} is not configured (known: {:?}): every descriptor is OK, not counted",
            call.domain,
            snapshot.domain_names()
        );
        return out;
    }
    for (depth, step) in e.steps.iter().enumerate() {
        let how = match &step.matched {
            None => "no match at this level: the lookup stops here".to_owned(),
            Some((MatchKind::Exact, src)) => format!("exact value, at {src}"),
            Some((MatchKind::Wildcard(p), src)) => format!("wildcard {p:?}, at {src}"),
            Some((MatchKind::Default, src)) => format!("default (no value), at {src}"),
        };
        let _ = writeln!(
            out,
            "level {}: {}={:?}: {how}",
            depth + 1,
            step.key,
            step.value
        );
    }
    if e.has_override() {
        render_override(&mut out, e);
        return out;
    }
    match &e.matched {
        Some(rule) => {
            let _ = writeln!(out, "rule: {}", rule.describe());
            for (index, pattern) in &e.shared {
                let _ = writeln!(
                    out,
                    "level {}: share_threshold: every value matching {pattern:?} counts in one counter",
                    index + 1
                );
            }
            if let Some(name) = &e.metric_name {
                let _ = writeln!(out, "metrics: counted as {name:?}");
            }
            render_scaling(&mut out, e, scaling, &call.domain, rule);
        }
        None if e.steps.len() < call.descriptor.len() => {
            let _ = writeln!(
                out,
                "no rule: the descriptor is deeper than any rule that matched"
            );
        }
        None => match e.steps.iter().position(|s| s.matched.is_none()) {
            // The lookup stopped on an entry the rules do not name at its level.
            Some(level) => {
                let _ = writeln!(
                    out,
                    "no rule: level {} matches nothing the rules define there; the descriptor is OK, not counted",
                    level + 1
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "no rule: the entries match, but no limit is set at this depth; the descriptor is OK, not counted"
                );
            }
        },
    }
    out
}

/// A limit the request carries (Envoy's override): it replaces any rule the entries meet, counts
/// on a key of its own (its count in the key: overrides count apart), in the algorithm
/// `--override-algorithm` says, and is named in the metrics by the descriptor's keys only.
fn render_override(out: &mut String, e: &Explanation) {
    let Some(rule) = e.rule() else { return };
    match &e.matched {
        Some(matched) => {
            let _ = writeln!(
                out,
                "rule: {} (replaced by the request's limit)",
                matched.describe()
            );
        }
        None => {
            let _ = writeln!(out, "rule: none at this depth");
        }
    }
    let _ = writeln!(out, "limit carried by the request: {}", rule.describe());
    if let Some(check) = &e.planned.check {
        let _ = writeln!(
            out,
            "counted apart from the rule and from other limits: key {}",
            check.key
        );
    }
    let _ = writeln!(out, "metrics: counted as {:?}", rule.full_key);
}

/// What the scaling in force makes of the rule's limits, read from the plan that serves.
fn render_scaling(out: &mut String, e: &Explanation, scaling: &Scaling, domain: &str, rule: &Rule) {
    let Some(planned) = e.rule() else { return };
    if rule.layers.is_empty() {
        let factor = scaling.factor(domain, rule.name.as_deref());
        if factor != 1.0 {
            let unit = planned.unit.map_or(String::new(), |u| format!(" per {u}"));
            let _ = writeln!(
                out,
                "scaling: ×{factor}: {}{unit}",
                planned.requests_per_unit
            );
        }
        return;
    }
    for layer in &planned.layers {
        let factor = scaling.factor(domain, layer.name.as_deref());
        if factor != 1.0 {
            let _ = writeln!(
                out,
                "scaling: layer {} ×{factor}: {} per {}",
                layer.name.as_deref().unwrap_or("(unnamed)"),
                layer.requests_per_unit,
                layer.unit
            );
        }
    }
}
