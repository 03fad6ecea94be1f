//! Runs test cases against a rules snapshot with the code that serves: the `Decider` over the
//! memory store (the model the Redis scripts are tested against) on a manual clock. Sequences
//! start where every fixed window begins, so a file gives the same answers on every machine and
//! at every hour. It must never read the host clock, sleep or open a socket.

use std::sync::Arc;

use arc_swap::ArcSwap;

use super::explain::{Call, Explanation, explain};
use super::spec::{Case, Expect, ExpectLayer, Step, TestFile};
use super::values::show_rate;
use crate::clock::{Clock, ManualClock};
use crate::limiter::Limiter;
use crate::pb::{RateLimitResponse, rate_limit_response};
use crate::rules::scaling::Scaling;
use crate::rules::{Rule, Snapshot};
use crate::service::{Decider, ServiceConfig};
use crate::store::MemoryStore;
use crate::telemetry::Metrics;

/// 2011-12-22T00:00:00Z: 15,330 days after the epoch, a multiple of every unit's window (a week,
/// a 30-day month and a 365-day year included), so `at: 0` opens a fixed window of each.
pub const SEQUENCE_START_US: u64 = 15_330 * 86_400 * 1_000_000;

/// A case's result: where it is written, and the first thing that did not hold.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub name: String,
    /// The line of the case, or of the step or expectation that failed.
    pub line: u64,
    pub failure: Option<String>,
    /// The rule the descriptor met, with its file:line.
    pub rule: Option<String>,
}

/// A snapshot ready to run cases on: one decider per case, so that cases never share counters.
pub struct Bench {
    rules: Arc<ArcSwap<Snapshot>>,
    metrics: Arc<Metrics>,
    runtime: tokio::runtime::Runtime,
    /// What the service is told at start, as the deployment tells it.
    service: ServiceConfig,
}

impl Bench {
    /// With the command line's defaults for how the service decides.
    pub fn new(snapshot: Arc<Snapshot>) -> std::io::Result<Self> {
        Self::with_service(snapshot, ServiceConfig::default())
    }

    /// Deciding as a service told `service` at start.
    pub fn with_service(snapshot: Arc<Snapshot>, service: ServiceConfig) -> std::io::Result<Self> {
        Ok(Self {
            rules: Arc::new(ArcSwap::new(snapshot)),
            metrics: Arc::new(Metrics::default()),
            runtime: tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()?,
            service,
        })
    }

    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.rules.load_full()
    }

    /// A decider as `serve` builds it on the embedded store, with `scaling` in force.
    pub fn decider(&self, scaling: &Scaling, clock: &ManualClock) -> Decider {
        let store = MemoryStore::new(Arc::new(clock.clone()));
        let limiter = Arc::new(Limiter::new(Box::new(store), self.metrics.clone()));
        Decider::new(
            self.rules.clone(),
            limiter,
            self.service.clone(),
            self.metrics.clone(),
        )
        .with_scaling(Arc::new(ArcSwap::from_pointee(scaling.clone())))
    }

    /// Every case of `file`, in order.
    pub fn run_file(&self, file: &TestFile, scaling: &Scaling) -> Vec<Outcome> {
        file.cases
            .iter()
            .map(|c| self.run_case(c, scaling))
            .collect()
    }

    pub fn run_case(&self, case: &Case, scaling: &Scaling) -> Outcome {
        let clock = ManualClock::new(SEQUENCE_START_US);
        let decider = self.decider(scaling, &clock);
        let snapshot = self.snapshot();
        let call = Call {
            domain: case.domain.clone(),
            descriptor: case.descriptor.clone(),
            limit: case.limit,
            also: case.also.clone(),
            ..Call::default()
        };
        let mut outcome = Outcome {
            name: case.name.clone(),
            line: case.line,
            failure: None,
            rule: None,
        };
        let explained = match explain(&decider, &snapshot, &call) {
            Ok(e) => e,
            Err(message) => {
                outcome.failure = Some(message);
                return outcome;
            }
        };
        outcome.rule = explained.matched.as_ref().map(|r| rule_at(r));
        if let Some(expect) = &case.expect
            && let Some((line, failure)) = check_expect(expect, &explained)
        {
            outcome.line = line;
            outcome.failure = Some(failure);
            return outcome;
        }
        for step in &case.steps {
            let now = clock.now_us() - SEQUENCE_START_US;
            clock.advance_us(step.at_us - now);
            let call = Call {
                hits: step.hits,
                refund: step.refund,
                ..call.clone()
            };
            if let Some(failure) = self.run_step(&decider, &call, step) {
                outcome.line = step.line;
                outcome.failure = Some(format!("at {}: {failure}", show_time(step.at_us)));
                return outcome;
            }
        }
        outcome
    }

    fn run_step(&self, decider: &Decider, call: &Call, step: &Step) -> Option<String> {
        let request = call.request();
        let mut admitted = 0;
        let mut last: Option<RateLimitResponse> = None;
        for i in 0..step.repeat {
            let response = match self.runtime.block_on(decider.decide(&request)) {
                Ok(r) => r,
                Err(status) => return Some(format!("the call is refused: {}", status.message())),
            };
            let ok = response
                .statuses
                .first()
                .is_some_and(|s| s.code == rate_limit_response::Code::Ok as i32);
            admitted += u32::from(ok);
            if let Some(expected) = step.expect_ok
                && expected != ok
            {
                let which = if step.repeat > 1 {
                    format!("call {} of {}: ", i + 1, step.repeat)
                } else {
                    String::new()
                };
                return Some(format!(
                    "{which}expected {}, got {}",
                    answer(expected),
                    describe(&response)
                ));
            }
            last = Some(response);
        }
        if let Some(allowed) = step.allowed
            && allowed != admitted
        {
            return Some(format!(
                "expected {allowed} of {} calls admitted, got {admitted}",
                step.repeat
            ));
        }
        let response = last?;
        let status = response.statuses.first()?;
        let fail = |what: &str, expected: String| {
            Some(format!(
                "expected {what} {expected}, got {}",
                describe(&response)
            ))
        };
        if let Some(remaining) = step.remaining
            && remaining != status.limit_remaining
        {
            return fail("remaining", remaining.to_string());
        }
        let reset = status.duration_until_reset.map_or(0, |d| d.seconds);
        if let Some(expected) = step.reset_s
            && i64::try_from(expected).ok() != Some(reset)
        {
            return fail("reset", format!("{expected}s"));
        }
        let reported = status.current_limit.as_ref();
        if let Some((count, unit)) = step.limit
            && reported.map(|l| (l.requests_per_unit, l.unit))
                != Some((count, crate::service::response::pb_unit(unit) as i32))
        {
            return fail("limit", show_rate(count, unit));
        }
        if let Some(name) = &step.binding
            && reported.map(|l| l.name.as_str()) != Some(name.as_str())
        {
            return fail("the binding limit", format!("{name:?}"));
        }
        None
    }
}

fn answer(ok: bool) -> &'static str {
    if ok { "ok" } else { "over_limit" }
}

/// `over_limit (remaining 0, reset 12s, limit 5/minute "login")`.
fn describe(response: &RateLimitResponse) -> String {
    let Some(status) = response.statuses.first() else {
        return "no status".into();
    };
    let mut text = format!(
        "{} (remaining {}",
        answer(status.code == rate_limit_response::Code::Ok as i32),
        status.limit_remaining
    );
    if let Some(d) = status.duration_until_reset {
        text.push_str(&format!(", reset {}s", d.seconds));
    }
    if let Some(l) = &status.current_limit {
        let unit = rate_limit_response::rate_limit::Unit::try_from(l.unit)
            .map_or("?".to_owned(), |u| u.as_str_name().to_lowercase());
        text.push_str(&format!(", limit {}/{unit}", l.requests_per_unit));
        if !l.name.is_empty() {
            text.push_str(&format!(" {:?}", l.name));
        }
    } else {
        text.push_str(", no limit");
    }
    text.push(')');
    text
}

pub fn show_time(us: u64) -> String {
    if us.is_multiple_of(1_000_000) {
        format!("{}s", us / 1_000_000)
    } else {
        format!("{:.3}s", us as f64 / 1e6)
    }
}

/// `edge.path_/api/login at rules/edge.yaml:14`.
pub fn rule_at(rule: &Rule) -> String {
    match &rule.source {
        Some(source) => format!("{} at {source}", rule.full_key),
        None => rule.full_key.clone(),
    }
}

/// The rule's one-line description for a failure, or what stands in for none.
fn what_matched(e: &Explanation) -> String {
    match (&e.matched, e.rule()) {
        (_, Some(rule)) => super::diff::summary(rule),
        (Some(_), None) => "a rule that `replaces` dropped".into(),
        (None, None) if !e.domain_known => "no rule (the domain is not configured)".into(),
        (None, None) => "no rule".into(),
    }
}

/// The first expectation that does not hold, with its line, said as expected against found.
pub fn check_expect(x: &Expect, e: &Explanation) -> Option<(u64, String)> {
    let found = what_matched(e);
    let fail = |what: String| Some((x.line, format!("expected {what}, got {found}")));
    let rule = e.rule().or(e.matched.as_ref());
    if let Some(no_rule) = x.no_rule
        && no_rule != rule.is_none()
    {
        return fail(if no_rule {
            "no rule".into()
        } else {
            "a rule".into()
        });
    }
    if let Some(replaced) = x.replaced
        && replaced != e.replaced()
    {
        return fail(if replaced {
            "the rule replaced".into()
        } else {
            "the rule in force".into()
        });
    }
    if let Some(name) = &x.rule {
        let named = rule.is_some_and(|r| {
            r.name.as_deref() == Some(name.as_str())
                || r.full_key == *name
                || r.full_key == format!("{}.{name}", r.domain)
        });
        if !named {
            return fail(format!("rule {name:?}"));
        }
    }
    // The rest is about the limit in force (scaled, or the request's own).
    let Some(rule) = e.rule().or(rule) else {
        let asks_more = x.limit.is_some()
            || x.algorithm.is_some()
            || x.layers.is_some()
            || x.unlimited.is_some();
        return if asks_more {
            fail("a rule".into())
        } else {
            None
        };
    };
    if let Some(unlimited) = x.unlimited
        && unlimited != rule.is_unlimited()
    {
        return fail(if unlimited {
            "unlimited".into()
        } else {
            "a limit".into()
        });
    }
    if let Some((count, unit)) = x.limit
        && (rule.requests_per_unit != count || rule.unit != Some(unit) || rule.is_unlimited())
    {
        return fail(format!("limit {}", show_rate(count, unit)));
    }
    if let Some(algorithm) = x.algorithm
        && rule.limit.map(|l| l.algorithm) != Some(algorithm)
    {
        return fail(format!("algorithm {algorithm}"));
    }
    if let Some(burst) = x.burst
        && rule.limit.map(|l| l.burst) != Some(burst)
    {
        return fail(format!("burst {burst}"));
    }
    for (what, expected, actual) in [
        ("shadow", x.shadow, rule.shadow_mode),
        ("quota", x.quota, rule.quota_mode),
        ("post_paid", x.post_paid, rule.post_paid),
    ] {
        if let Some(expected) = expected
            && expected != actual
        {
            return fail(format!("{what}: {expected}"));
        }
    }
    if let Some(layers) = &x.layers {
        let actual = &e.planned.layers;
        if layers.len() != actual.len() {
            return fail(format!("{} layer(s)", layers.len()));
        }
        for (i, (want, have)) in layers.iter().zip(actual).enumerate() {
            let have = &have.layer;
            let differs = want
                .name
                .as_ref()
                .is_some_and(|n| have.name.as_ref() != Some(n))
                || want
                    .limit
                    .is_some_and(|(c, u)| have.requests_per_unit != c || have.unit != u)
                || want.algorithm.is_some_and(|a| have.limit.algorithm != a)
                || want.burst.is_some_and(|b| have.limit.burst != b);
            if differs {
                let (_, message) = fail(format!("layer {} as {}", i + 1, show_layer(want)))?;
                return Some((want.line, message));
            }
        }
    }
    None
}

/// `hourly, 1000/hour, sliding_window`: the fields a test gave for a layer.
fn show_layer(layer: &ExpectLayer) -> String {
    let mut parts = Vec::new();
    if let Some(name) = &layer.name {
        parts.push(format!("{name:?}"));
    }
    if let Some((count, unit)) = layer.limit {
        parts.push(show_rate(count, unit));
    }
    if let Some(algorithm) = layer.algorithm {
        parts.push(algorithm.to_string());
    }
    if let Some(burst) = layer.burst {
        parts.push(format!("burst {burst}"));
    }
    parts.join(", ")
}
