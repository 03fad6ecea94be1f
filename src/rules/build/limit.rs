//! One `rate_limit` (or each layer of `rate_limits`) checked and turned into a rule: name,
//! replaces, algorithm, limit and unit, burst. Problems go to the build's error list with their
//! line; it must never return a rule when one of its own fields was wrong.

use serde_saphyr::Spanned;

use super::super::yaml::{MAX_LAYERS, RateLimitYaml};
use super::super::{Layer, Rule, Unit};
use super::{Ctx, Flags};
use std::time::Duration;

use crate::algorithm::{Algorithm, Limit, concurrency};

impl Ctx<'_> {
    /// A layered rule (`rate_limits:`): each layer validated like a `rate_limit`, none unlimited,
    /// names distinct.
    pub(super) fn layered(
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
            if limit.algorithm == Algorithm::Concurrency
                && layers
                    .iter()
                    .any(|l| l.limit.algorithm == Algorithm::Concurrency)
            {
                // Envoy's release carries one number per descriptor: the lease of one take.
                self.error(
                    layer_line,
                    format!("{at}.algorithm"),
                    "a second concurrency limit on one descriptor: a release names the lease \
                     of one (put the other on a descriptor of its own)",
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
    pub(super) fn rule(
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
                "concurrency" => Algorithm::Concurrency,
                other => {
                    self.error(
                        a.referenced.line(),
                        field("algorithm"),
                        format!(
                            "{other:?} is not one of sliding_window, token_bucket, fixed_window, concurrency"
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

        let lease_us = self.lease(&rl.max_duration, algorithm, unit, requests, at, line);
        if self.errors.len() > errors_before {
            return None;
        }
        let limit = unit.map(|unit| Limit {
            algorithm,
            requests: u64::from(requests),
            // A concurrency rule's window is its lease.
            window_us: lease_us.unwrap_or_else(|| unit.window_us()),
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

impl Ctx<'_> {
    /// A concurrency rule's lease in microseconds (`max_duration`, else one unit), its slots
    /// checked against `MAX_SLOTS`; `None` for the other algorithms, where `max_duration` is
    /// refused.
    fn lease(
        &mut self,
        max_duration: &Option<Spanned<String>>,
        algorithm: Algorithm,
        unit: Option<Unit>,
        requests: u32,
        at: &str,
        line: u64,
    ) -> Option<u64> {
        let field = |name: &str| format!("{at}.{name}");
        if algorithm != Algorithm::Concurrency {
            if let Some(d) = max_duration {
                self.error(
                    d.referenced.line(),
                    field("max_duration"),
                    format!("only applies to algorithm concurrency, not {algorithm}"),
                );
            }
            return None;
        }
        if u64::from(requests) > concurrency::MAX_SLOTS {
            self.error(
                line,
                field("requests_per_unit"),
                format!(
                    "{requests} in flight is more than the {} slots a concurrency rule may hold",
                    concurrency::MAX_SLOTS
                ),
            );
        }
        let Some(d) = max_duration else {
            if unit.is_some_and(|u| u.seconds() > Unit::Day.seconds()) {
                self.error(
                    line,
                    field("unit"),
                    "is a concurrency rule's lease (a slot not released within it is freed by \
                     itself): at most a day; set max_duration for a shorter one",
                );
            }
            return unit.map(Unit::window_us);
        };
        match crate::duration::parse(&d.value) {
            Ok(lease)
                if lease >= Duration::from_secs(1) && lease <= Duration::from_secs(86_400) =>
            {
                Some(lease.as_micros() as u64)
            }
            Ok(_) => {
                self.error(
                    d.referenced.line(),
                    field("max_duration"),
                    format!("{:?} is not between 1s and 1d", d.value),
                );
                None
            }
            Err(e) => {
                self.error(d.referenced.line(), field("max_duration"), e.to_string());
                None
            }
        }
    }
}
