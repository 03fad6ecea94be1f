//! One `ShouldRateLimit` call, whatever carried it (gRPC or the admin `/json` endpoint): validate
//! the request, resolve each descriptor to a rule, count what needs counting in one call to the
//! limiter, and answer in request order, counting the per-rule metrics.
//! Input never panics this code: every bad request gets INVALID_ARGUMENT saying what is wrong.

use std::sync::Arc;

use arc_swap::ArcSwap;
use tonic::Status;

use super::config::ServiceConfig;
use super::response::{self, LayerPlan, Planned};
use crate::algorithm::{ChargeMode, Check, Decision, Limit, key};
use crate::limiter::Limiter;
use crate::pb::{
    RateLimitDescriptor, RateLimitRequest, RateLimitResponse, RateLimitUnit, rate_limit_descriptor,
};
use crate::rules::scaling::{self, Scaling};
use crate::rules::{Entry, Lookup, Rule, Snapshot, Unit};
use crate::telemetry::{Metrics, RuleLabels};

impl Entry for rate_limit_descriptor::Entry {
    fn key(&self) -> &str {
        &self.key
    }
    fn value(&self) -> &str {
        &self.value
    }
}

/// Decides one call: rules, then the limiter, then the response. Shared by the gRPC face
/// (`RlsService`) and the admin `/json` endpoint.
pub struct Decider {
    rules: Arc<ArcSwap<Snapshot>>,
    limiter: Arc<Limiter>,
    config: ServiceConfig,
    metrics: Arc<Metrics>,
    /// Runtime scaling in force (the file's and the store's temporary factors).
    scaling: Arc<ArcSwap<Scaling>>,
}

impl Decider {
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub fn new(
        rules: Arc<ArcSwap<Snapshot>>,
        limiter: Arc<Limiter>,
        config: ServiceConfig,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            rules,
            limiter,
            config,
            metrics,
            scaling: Arc::new(ArcSwap::from_pointee(Scaling::default())),
        }
    }

    /// Limits scaled by what `scaling` holds (kept up to date by the server).
    pub fn with_scaling(mut self, scaling: Arc<ArcSwap<Scaling>>) -> Self {
        self.scaling = scaling;
        self
    }

    /// Answers one request.
    pub async fn decide(&self, request: &RateLimitRequest) -> Result<RateLimitResponse, Status> {
        self.validate(request)?;
        // One snapshot for the whole call: a reload in the middle never mixes two rule sets.
        let rules = self.rules.load_full();
        let scaling = self.scaling.load();
        let request_hits = u64::from(request.hits_addend.max(1));
        let mut planned: Vec<Planned> = request
            .descriptors
            .iter()
            .map(|d| {
                plan(
                    &rules,
                    &scaling,
                    &request.domain,
                    d,
                    request_hits,
                    &self.config,
                )
            })
            .collect();
        apply_replaces(&mut planned);

        self.limit(&mut planned).await?;
        self.count(&request.domain, &planned);
        Ok(response::build(request, &planned, &self.config))
    }

    /// Asks the limiter for every check of the call and records the decisions in `planned`.
    ///
    /// The limits of one layered descriptor are charged all or nothing (a hit refused by one
    /// layer is charged to none), each layered descriptor on its own, beside the call's other
    /// checks; with `--stop-charging-when-over` everything is one all-or-nothing group anyway.
    /// The groups go to the limiter together (on Redis they share a script call).
    async fn limit(&self, planned: &mut [Planned]) -> Result<(), Status> {
        let whole_call = self.config.charge == ChargeMode::AllOrNothing;
        let mut groups: Vec<(Vec<Check>, ChargeMode)> = vec![(Vec::new(), self.config.charge)];
        for p in planned.iter() {
            if let Some(check) = &p.check {
                groups[0].0.push(check.clone());
            }
            if p.layers.is_empty() {
                continue;
            }
            let layers = p.layers.iter().map(|l| l.check.clone());
            if whole_call {
                groups[0].0.extend(layers);
            } else {
                groups.push((layers.collect(), ChargeMode::AllOrNothing));
            }
        }
        // The usual call has one group: no join, no extra allocation.
        let answers = if groups.len() == 1 {
            vec![self.limiter.check(&groups[0].0, groups[0].1).await]
        } else {
            futures_util::future::join_all(
                groups
                    .iter()
                    .map(|(checks, mode)| self.limiter.check(checks, *mode)),
            )
            .await
        };
        let mut decided = Vec::with_capacity(groups.len());
        for ((checks, _), answer) in groups.iter().zip(answers) {
            let decisions =
                answer.map_err(|e| Status::unavailable(format!("rate-limit store: {e}")))?;
            if decisions.len() != checks.len() {
                return Err(Status::internal(format!(
                    "store answered {} decisions for {} checks",
                    decisions.len(),
                    checks.len()
                )));
            }
            decided.push(decisions.into_iter());
        }
        // Handed back in the order the groups were filled.
        let mut next_group = 1;
        for p in planned.iter_mut() {
            if p.check.is_some() {
                p.decision = decided[0].next();
            }
            if p.layers.is_empty() {
                continue;
            }
            let group = if whole_call {
                0
            } else {
                next_group += 1;
                next_group - 1
            };
            for layer in p.layers.iter_mut() {
                layer.decision = decided[group].next();
            }
            p.bind_layers();
        }
        Ok(())
    }

    /// Per-rule metrics, as envoyproxy/ratelimit counts them: in hits, not calls, limited rules
    /// only. Refunds are counted apart: they are not hits. A layered rule is counted per layer
    /// (`rule/layer name`): hits on every layer; an admitted hit within (and near) every layer's
    /// limit; a refused one over the limit of each layer that refused it.
    fn count(&self, domain: &str, planned: &[Planned]) {
        if planned.iter().any(|p| p.unknown_domain) {
            self.metrics.unknown_domain.inc();
        }
        for p in planned {
            let Some(rule) = p.rule.as_ref().filter(|r| !r.is_unlimited()) else {
                continue;
            };
            let configured = RuleLabels {
                domain: domain.to_owned(),
                rule: rule.full_key.clone(),
            };
            // A name made of request values (detailed_metric, value_to_metric) is capped.
            let labels = match &p.metric_name {
                Some(name) => {
                    let per_value = RuleLabels {
                        domain: domain.to_owned(),
                        rule: name.clone(),
                    };
                    self.metrics.detailed_labels(per_value, configured)
                }
                None => configured,
            };
            // Counters are u64; a pathological hits_addend must not wrap them.
            let hits = p.hits.min(u64::from(u32::MAX));
            if p.layers.is_empty() {
                let verdict = match p.decision {
                    None => Verdict::Undecided,
                    Some(d) if d.allowed => Verdict::Within(d),
                    Some(_) => Verdict::Over,
                };
                self.count_one(&labels, hits, p.refund, verdict, rule.shadow_mode);
                continue;
            }
            // Per layer: within every layer when admitted; over on each layer that refused.
            let admitted = p.decision.is_some_and(|d| d.allowed);
            for (i, layer) in p.layers.iter().enumerate() {
                let labels = RuleLabels {
                    domain: labels.domain.clone(),
                    rule: layer.layer.metric_name(&labels.rule, i),
                };
                let verdict = match layer.decision {
                    None => Verdict::Undecided,
                    Some(d) if admitted => Verdict::Within(d),
                    Some(d) if !d.allowed => Verdict::Over,
                    Some(_) => Verdict::HitsOnly,
                };
                self.count_one(&labels, hits, p.refund, verdict, rule.shadow_mode);
            }
        }
    }

    /// One rule's (or layer's) counters for one descriptor.
    fn count_one(
        &self,
        labels: &RuleLabels,
        hits: u64,
        refund: bool,
        verdict: Verdict,
        shadow: bool,
    ) {
        if refund {
            self.metrics
                .rule_refunded
                .get_or_create(labels)
                .inc_by(hits);
            return;
        }
        self.metrics.rule_hits.get_or_create(labels).inc_by(hits);
        match verdict {
            Verdict::Undecided | Verdict::HitsOnly => {}
            Verdict::Within(decision) => {
                self.metrics
                    .rule_within_limit
                    .get_or_create(labels)
                    .inc_by(hits);
                let near = self.near_limit_hits(&decision, hits);
                if near > 0 {
                    self.metrics
                        .rule_near_limit
                        .get_or_create(labels)
                        .inc_by(near);
                }
            }
            Verdict::Over => {
                self.metrics
                    .rule_over_limit
                    .get_or_create(labels)
                    .inc_by(hits);
                if shadow {
                    self.metrics
                        .rule_shadow_mode
                        .get_or_create(labels)
                        .inc_by(hits);
                }
            }
        }
    }

    /// The hits of an admitted request that landed above the near-limit threshold, as the Go
    /// service counts them: with a limit of 8 (threshold 6), a counter at 5 and 2 more hits, one.
    fn near_limit_hits(&self, decision: &Decision, hits: u64) -> u64 {
        let threshold = (decision.limit as f64 * self.metrics.near_limit_ratio).floor() as u64;
        let after = decision.limit.saturating_sub(decision.remaining);
        let before = after.saturating_sub(hits);
        after.saturating_sub(threshold.max(before))
    }

    /// Refuses a string longer than the cap, naming the field (built only when it is refused).
    fn check_length<F: FieldName>(&self, field: F, text: &str) -> Result<(), Status> {
        if text.len() <= self.config.max_string_bytes {
            return Ok(());
        }
        Err(Status::invalid_argument(format!(
            "{} is {} bytes, more than the {} allowed",
            field.name(),
            text.len(),
            self.config.max_string_bytes
        )))
    }

    fn validate(&self, request: &RateLimitRequest) -> Result<(), Status> {
        if request.domain.is_empty() {
            return Err(Status::invalid_argument("domain must not be empty"));
        }
        self.check_length("domain", &request.domain)?;
        if request.descriptors.is_empty() {
            return Err(Status::invalid_argument("descriptors must not be empty"));
        }
        if request.descriptors.len() > self.config.max_descriptors {
            return Err(Status::invalid_argument(format!(
                "{} descriptors is more than the {} allowed in one request",
                request.descriptors.len(),
                self.config.max_descriptors
            )));
        }
        for (i, d) in request.descriptors.iter().enumerate() {
            if d.entries.is_empty() {
                return Err(Status::invalid_argument(format!(
                    "descriptors[{i}] has no entries"
                )));
            }
            if d.entries.len() > self.config.max_entries {
                return Err(Status::invalid_argument(format!(
                    "descriptors[{i}] has {} entries, more than the {} allowed",
                    d.entries.len(),
                    self.config.max_entries
                )));
            }
            for (j, e) in d.entries.iter().enumerate() {
                if e.key.is_empty() {
                    return Err(Status::invalid_argument(format!(
                        "descriptors[{i}].entries[{j}].key must not be empty"
                    )));
                }
                self.check_length(|| format!("descriptors[{i}].entries[{j}].key"), &e.key)?;
                self.check_length(|| format!("descriptors[{i}].entries[{j}].value"), &e.value)?;
            }
            if let Some(limit) = &d.limit
                && override_unit(limit.unit).is_none()
            {
                return Err(Status::invalid_argument(format!(
                    "descriptors[{i}].limit.unit must be one of SECOND, MINUTE, HOUR, DAY, WEEK, MONTH, YEAR (got {})",
                    limit.unit
                )));
            }
        }
        Ok(())
    }
}

/// What one descriptor did to one rule's (or layer's) counters beyond its hits.
#[derive(Clone, Copy)]
enum Verdict {
    /// Not decided (a check-only call of an unlimited rule, say): hits only.
    Undecided,
    Within(Decision),
    Over,
    /// A layer that admitted a hit another layer refused: charged nothing, over nothing.
    HitsOnly,
}

/// A field's name, given as text or built on demand (no `format!` per entry on the happy path).
trait FieldName {
    fn name(self) -> String;
}

impl FieldName for &str {
    fn name(self) -> String {
        self.to_owned()
    }
}

impl<F: FnOnce() -> String> FieldName for F {
    fn name(self) -> String {
        self()
    }
}

fn override_unit(unit: i32) -> Option<Unit> {
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
fn plan(
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
    let check_of = |key: String, limit: Limit| Check {
        key,
        limit,
        hits,
        refund: d.is_negative_hits,
        post_paid,
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
fn apply_replaces(planned: &mut [Planned]) {
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
