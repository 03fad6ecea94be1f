//! A call's plan: each descriptor resolved to its rule (or a limit the request carries), scaled
//! by the factors in force, turned into the checks the limiter runs, and `replaces` applied. It
//! must never count: it only says what to count.

use std::sync::Arc;

use super::config::ServiceConfig;
use crate::algorithm::{Algorithm, Check, Decision, Limit, key};
use crate::pb::{RateLimitDescriptor, RateLimitUnit, rate_limit_descriptor};
use crate::rules::scaling::{self, Scaling};
use crate::rules::{Layer, Lookup, Rule, Snapshot, Unit};

/// One descriptor of a call, from resolution to decision.
#[derive(Debug)]
pub struct Planned {
    pub rule: Option<Arc<Rule>>,
    pub check: Option<Check>,
    pub hits: u64,
    /// The hits are given back (`is_negative_hits`).
    pub refund: bool,
    /// The per-rule metric name when it is made of request values.
    pub metric_name: Option<String>,
    pub decision: Option<Decision>,
    pub unknown_domain: bool,
    /// A layered rule's limits, each with its check and decision (`check` is then `None`, and
    /// `decision` is the binding layer's once decided).
    pub layers: Vec<LayerPlan>,
    /// The layer that binds: the refusing one with the longest wait, else the one with the
    /// least remaining.
    pub binding: usize,
}

/// One limit of a layered descriptor, from check to decision.
#[derive(Debug)]
pub struct LayerPlan {
    pub layer: Layer,
    pub check: Check,
    pub decision: Option<Decision>,
}

impl Planned {
    /// Records the layers' decisions and picks the binding one: a refusal binds (the longest
    /// wait among refusals, so a client that waits is never early), else the least remaining
    /// (the first of equals).
    pub fn bind_layers(&mut self) {
        let decided = self
            .layers
            .iter()
            .enumerate()
            .filter_map(|(i, l)| l.decision.map(|d| (i, d)));
        let wait = |d: &Decision| d.retry_after.unwrap_or(d.reset_after);
        let refusing = decided
            .clone()
            .filter(|(_, d)| !d.allowed)
            .max_by(|(i, a), (j, b)| wait(a).cmp(&wait(b)).then(j.cmp(i)));
        let binding = refusing.or_else(|| {
            decided.min_by(|(i, a), (j, b)| a.remaining.cmp(&b.remaining).then(i.cmp(j)))
        });
        if let Some((i, decision)) = binding {
            self.binding = i;
            self.decision = Some(decision);
        }
    }

    /// The limit the status reports: (name, requests per unit, unit) of the binding layer, or
    /// of the rule.
    pub(super) fn shown_limit(&self) -> Option<(Option<&str>, u32, Option<Unit>)> {
        if let Some(layer) = self.layers.get(self.binding) {
            let l = &layer.layer;
            return Some((l.name.as_deref(), l.requests_per_unit, Some(l.unit)));
        }
        self.rule
            .as_ref()
            .map(|r| (r.name.as_deref(), r.requests_per_unit, r.unit))
    }
}

pub(super) fn override_unit(unit: i32) -> Option<Unit> {
    match RateLimitUnit::try_from(unit).ok()? {
        RateLimitUnit::Unknown => None,
        RateLimitUnit::Second => Some(Unit::Second),
        RateLimitUnit::Minute => Some(Unit::Minute),
        RateLimitUnit::Hour => Some(Unit::Hour),
        RateLimitUnit::Day => Some(Unit::Day),
        RateLimitUnit::Week => Some(Unit::Week),
        RateLimitUnit::Month => Some(Unit::Month),
        RateLimitUnit::Year => Some(Unit::Year),
    }
}

/// Resolves one descriptor: which rule, what it costs, which counter, which metric name.
pub(super) fn plan(
    rules: &Snapshot,
    scaling: &Scaling,
    domain: &str,
    d: &RateLimitDescriptor,
    request_hits: u64,
    config: &ServiceConfig,
) -> Planned {
    let override_algorithm = config.override_algorithm;
    // A per-descriptor hits_addend wins when present, even 0 ("check only").
    let hits = d.hits_addend.unwrap_or(request_hits);
    let lookup = rules.resolve(domain, &d.entries);
    let unknown_domain = matches!(lookup, Lookup::UnknownDomain);
    let (rule, shared, metric_name) = match (lookup, &d.limit) {
        // Like the Go service, an override needs a known domain.
        (Lookup::UnknownDomain, _) => (None, Vec::new(), None),
        (_, Some(o)) => {
            let rule = override_unit(o.unit).map(|unit| {
                Arc::new(Rule {
                    full_key: override_full_key(domain, &d.entries),
                    domain: domain.to_owned(),
                    limit: Some(Limit {
                        algorithm: override_algorithm,
                        requests: u64::from(o.requests_per_unit),
                        window_us: unit.window_us(),
                        burst: u64::from(o.requests_per_unit),
                    }),
                    requests_per_unit: o.requests_per_unit,
                    unit: Some(unit),
                    name: None,
                    replaces: Vec::new(),
                    shadow_mode: false,
                    quota_mode: false,
                    post_paid: false,
                    detailed_metric: false,
                    metadata: None,
                    source: None,
                    layers: Vec::new(),
                })
            });
            (rule, Vec::new(), None)
        }
        (Lookup::Rule(resolved), None) => (
            Some(resolved.rule.clone()),
            resolved.shared,
            resolved.metric_name,
        ),
        (Lookup::NoRule, None) => (None, Vec::new(), None),
    };
    let rule = rule.map(|rule| scaled(rule, scaling, domain));
    let key_of = |limit: &Limit| {
        key::counter_key_parts(
            domain,
            d.entries.iter().enumerate().map(|(i, e)| {
                match shared.iter().find(|(at, _)| *at == i) {
                    Some((_, pattern)) => (e.key.as_str(), *pattern, true),
                    None => (e.key.as_str(), e.value.as_str(), false),
                }
            }),
            limit,
            d.limit.as_ref().map(|o| u64::from(o.requests_per_unit)),
        )
    };
    let post_paid = config.post_paid_everywhere || rule.as_ref().is_some_and(|r| r.post_paid);
    // A rule with a concurrency layer: a negative hit releases slots, and its rate layers keep
    // the request they counted.
    let releases_slots = d.is_negative_hits
        && rule.as_ref().is_some_and(|r| {
            r.layers
                .iter()
                .any(|l| l.limit.algorithm == Algorithm::Concurrency)
        });
    let check_of = |key: String, limit: Limit| {
        let concurrency = limit.algorithm == Algorithm::Concurrency;
        Check {
            key,
            limit,
            hits: if releases_slots && !concurrency {
                0
            } else {
                hits
            },
            refund: d.is_negative_hits,
            // Slots are not a cost consumed: never recorded past the limit.
            post_paid: post_paid && !concurrency,
        }
    };
    let mut layers = Vec::new();
    let check = match rule.as_ref() {
        Some(rule) if !rule.layers.is_empty() => {
            for (i, layer) in rule.layers.iter().enumerate() {
                let mut key = key_of(&layer.limit);
                // Layers keep the key a rule of that one limit would have (a rule turned into
                // layers keeps its counter), unless an earlier layer has the same algorithm and
                // window: then the index tells them apart.
                let same_kind = |l: &crate::rules::Layer| {
                    l.limit.algorithm == layer.limit.algorithm
                        && l.limit.window_us == layer.limit.window_us
                };
                if rule.layers[..i].iter().any(same_kind) {
                    key.push_str(&format!(":l{i}"));
                }
                layers.push(LayerPlan {
                    layer: layer.clone(),
                    check: check_of(key, layer.limit),
                    decision: None,
                });
            }
            None
        }
        Some(rule) => rule.limit.map(|limit| check_of(key_of(&limit), limit)),
        None => None,
    };
    Planned {
        rule,
        check,
        hits,
        refund: d.is_negative_hits,
        metric_name,
        decision: None,
        unknown_domain,
        layers,
        binding: 0,
    }
}

/// The rule as runtime scaling has it: the same `Arc` when no factor touches it (the usual case:
/// no copy), else a copy with its counts (and bursts) scaled. Keys do not change with counts.
fn scaled(rule: Arc<Rule>, scaling: &Scaling, domain: &str) -> Arc<Rule> {
    if scaling.is_neutral() || rule.is_unlimited() {
        return rule;
    }
    let factor = scaling.factor(domain, rule.name.as_deref());
    let layer_factors: Vec<f64> = rule
        .layers
        .iter()
        .map(|l| scaling.factor(domain, l.name.as_deref()))
        .collect();
    if factor == 1.0 && layer_factors.iter().all(|f| *f == 1.0) {
        return rule;
    }
    let count = |limit: &Limit| u32::try_from(limit.requests).unwrap_or(u32::MAX);
    let mut copy = (*rule).clone();
    if copy.layers.is_empty() {
        if let Some(limit) = copy.limit.as_mut() {
            *limit = scaling::scale(limit, factor);
            copy.requests_per_unit = count(limit);
        }
    } else {
        for (layer, f) in copy.layers.iter_mut().zip(layer_factors) {
            layer.limit = scaling::scale(&layer.limit, f);
            layer.requests_per_unit = count(&layer.limit);
        }
        copy.limit = Some(copy.layers[0].limit);
        copy.requests_per_unit = copy.layers[0].requests_per_unit;
    }
    Arc::new(copy)
}

/// `domain.key.key`: a request-carried limit is named by its keys only. (The Go service puts the
/// values in too, one series per value a client sends; that has no bound.)
fn override_full_key(domain: &str, entries: &[rate_limit_descriptor::Entry]) -> String {
    let mut full = String::from(domain);
    for e in entries {
        full.push('.');
        full.push_str(&e.key);
    }
    full
}

/// A rule with `replaces` (limited or not) drops the named limits of the same call: those
/// descriptors answer OK and are not counted (envoyproxy/ratelimit's semantics).
pub(super) fn apply_replaces(planned: &mut [Planned]) {
    // Unlimited rules replace too (the Go service collects `replaces` before setting them aside).
    let replaced: Vec<String> = planned
        .iter()
        .filter_map(|p| p.rule.as_ref())
        .flat_map(|r| r.replaces.iter().cloned())
        .collect();
    if replaced.is_empty() {
        return;
    }
    for p in planned.iter_mut() {
        let is_replaced = p.rule.as_ref().is_some_and(|r| {
            !r.is_unlimited() && r.name.as_ref().is_some_and(|n| replaced.contains(n))
        });
        if is_replaced {
            p.rule = None;
            p.check = None;
        }
        // A layer is replaced by its own name; the others still apply.
        if !p.layers.is_empty() {
            p.layers
                .retain(|l| !l.layer.name.as_ref().is_some_and(|n| replaced.contains(n)));
            if p.layers.is_empty() {
                p.rule = None;
            }
        }
    }
}
