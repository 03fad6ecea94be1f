//! One `ShouldRateLimit` call, whatever carried it (gRPC or the admin `/json` endpoint): validate
//! the request, resolve each descriptor to a rule, count what needs counting in one call to the
//! limiter, and answer in request order, counting the per-rule metrics.
//! Input never panics this code: every bad request gets INVALID_ARGUMENT saying what is wrong.

use std::sync::Arc;

use arc_swap::ArcSwap;
use tonic::Status;

use super::response::{self, HeadersMode, Planned};
use crate::algorithm::{Algorithm, Check, Limit, key};
use crate::limiter::Limiter;
use crate::pb::{
    RateLimitDescriptor, RateLimitRequest, RateLimitResponse, RateLimitUnit, rate_limit_descriptor,
};
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

/// Request limits and response options, fixed at start-up.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    pub response_headers: HeadersMode,
    /// Never answer OVER_LIMIT overall (counts still happen).
    pub global_shadow_mode: bool,
    pub max_descriptors: usize,
    pub max_entries: usize,
    /// Longest domain, key or value, in bytes.
    pub max_string_bytes: usize,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        Self {
            response_headers: HeadersMode::Off,
            global_shadow_mode: false,
            max_descriptors: 512,
            max_entries: 64,
            max_string_bytes: 1024,
        }
    }
}

/// Decides one call: rules, then the limiter, then the response. Shared by the gRPC face
/// (`RlsService`) and the admin `/json` endpoint.
pub struct Decider {
    rules: Arc<ArcSwap<Snapshot>>,
    limiter: Arc<Limiter>,
    config: ServiceConfig,
    metrics: Arc<Metrics>,
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
        }
    }

    /// Answers one request.
    pub async fn decide(&self, request: &RateLimitRequest) -> Result<RateLimitResponse, Status> {
        self.validate(request)?;
        // One snapshot for the whole call: a reload in the middle never mixes two rule sets.
        let rules = self.rules.load_full();
        let request_hits = u64::from(request.hits_addend.max(1));
        let mut planned: Vec<Planned> = request
            .descriptors
            .iter()
            .map(|d| plan(&rules, &request.domain, d, request_hits))
            .collect();
        apply_replaces(&mut planned);

        let checks: Vec<Check> = planned.iter().filter_map(|p| p.check.clone()).collect();
        let decisions = self
            .limiter
            .check(&checks)
            .await
            .map_err(|e| Status::unavailable(format!("rate-limit store: {e}")))?;
        if decisions.len() != checks.len() {
            return Err(Status::internal(format!(
                "store answered {} decisions for {} checks",
                decisions.len(),
                checks.len()
            )));
        }
        let mut decisions = decisions.into_iter();
        for p in planned.iter_mut().filter(|p| p.check.is_some()) {
            p.decision = decisions.next();
        }
        self.count(&request.domain, &request.descriptors, &planned);
        Ok(response::build(&planned, &self.config))
    }

    /// Per-rule metrics, as envoyproxy/ratelimit counts them: in hits, not calls.
    fn count(&self, domain: &str, descriptors: &[RateLimitDescriptor], planned: &[Planned]) {
        if planned.iter().any(|p| p.unknown_domain) {
            self.metrics.unknown_domain.inc();
        }
        for (p, d) in planned.iter().zip(descriptors) {
            // Like the Go service, only limited rules are counted per rule.
            let Some(rule) = p.rule.as_ref().filter(|r| !r.is_unlimited()) else {
                continue;
            };
            let configured = RuleLabels {
                domain: domain.to_owned(),
                rule: rule.full_key.clone(),
            };
            let labels = if rule.detailed_metric {
                let detailed = RuleLabels {
                    domain: domain.to_owned(),
                    rule: detailed_full_key(domain, &d.entries),
                };
                self.metrics.detailed_labels(detailed, configured)
            } else {
                configured
            };
            // Counters are u64; a pathological hits_addend must not wrap them.
            let hits = p.hits.min(u64::from(u32::MAX));
            self.metrics.rule_hits.get_or_create(&labels).inc_by(hits);
            let Some(decision) = p.decision else { continue };
            match decision {
                decision if decision.allowed => {
                    self.metrics
                        .rule_within_limit
                        .get_or_create(&labels)
                        .inc_by(hits);
                    let used = decision.limit.saturating_sub(decision.remaining) as f64;
                    if used > decision.limit as f64 * self.metrics.near_limit_ratio {
                        self.metrics
                            .rule_near_limit
                            .get_or_create(&labels)
                            .inc_by(hits);
                    }
                }
                _ => {
                    self.metrics
                        .rule_over_limit
                        .get_or_create(&labels)
                        .inc_by(hits);
                    if rule.shadow_mode {
                        self.metrics
                            .rule_shadow_mode
                            .get_or_create(&labels)
                            .inc_by(hits);
                    }
                }
            }
        }
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
                    "descriptors[{i}].limit.unit must be one of SECOND, MINUTE, HOUR, DAY, MONTH, YEAR (got {})",
                    limit.unit
                )));
            }
        }
        Ok(())
    }
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
        RateLimitUnit::Month => Some(Unit::Month),
        RateLimitUnit::Year => Some(Unit::Year),
    }
}

/// Resolves one descriptor: which rule, what it costs, which counter.
fn plan(rules: &Snapshot, domain: &str, d: &RateLimitDescriptor, request_hits: u64) -> Planned {
    // A per-descriptor hits_addend wins when present, even 0 ("check only").
    let hits = d.hits_addend.unwrap_or(request_hits);
    let lookup = rules.resolve(domain, &d.entries);
    let rule: Option<Arc<Rule>> = match (lookup, &d.limit) {
        // Like the Go service, an override needs a known domain.
        (Lookup::UnknownDomain, _) => None,
        (_, Some(o)) => override_unit(o.unit).map(|unit| {
            Arc::new(Rule {
                full_key: override_full_key(domain, &d.entries),
                domain: domain.to_owned(),
                limit: Some(Limit {
                    algorithm: Algorithm::default(),
                    requests: u64::from(o.requests_per_unit),
                    window_us: unit.window_us(),
                    burst: u64::from(o.requests_per_unit),
                }),
                requests_per_unit: o.requests_per_unit,
                unit: Some(unit),
                name: None,
                replaces: Vec::new(),
                shadow_mode: false,
                detailed_metric: false,
                source: None,
            })
        }),
        (Lookup::Rule(rule), None) => Some(rule.clone()),
        (Lookup::NoRule, None) => None,
    };
    let check = rule.as_ref().and_then(|rule| {
        rule.limit.map(|limit| Check {
            key: key::counter_key(
                domain,
                d.entries.iter().map(|e| (e.key.as_str(), e.value.as_str())),
                &limit,
                d.limit.as_ref().map(|o| u64::from(o.requests_per_unit)),
            ),
            limit,
            hits,
        })
    });
    Planned {
        rule,
        check,
        hits,
        decision: None,
        unknown_domain: matches!(lookup, Lookup::UnknownDomain),
    }
}

/// `domain.key_value.key`: the Go service's per-value name of a `detailed_metric` rule.
fn detailed_full_key(domain: &str, entries: &[rate_limit_descriptor::Entry]) -> String {
    let mut full = String::from(domain);
    for e in entries {
        full.push('.');
        full.push_str(&e.key);
        if !e.value.is_empty() {
            full.push('_');
            full.push_str(&e.value);
        }
    }
    full
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
    }
}
