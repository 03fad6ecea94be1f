//! The per-rule metrics of a call, counted as envoyproxy/ratelimit counts them: in hits, not
//! calls, limited rules only, refunds apart, layered rules per layer. It must never count a
//! failure-mode answer as a decision of the rule.

use super::decider::Decider;
use super::plan::Planned;
use crate::algorithm::Decision;
use crate::telemetry::RuleLabels;

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

impl Decider {
    /// Per-rule metrics, as envoyproxy/ratelimit counts them: in hits, not calls, limited rules
    /// only. Refunds are counted apart: they are not hits. A layered rule is counted per layer
    /// (`rule/layer name`): hits on every layer; an admitted hit within (and near) every layer's
    /// limit; a refused one over the limit of each layer that refused it.
    pub(super) fn count(&self, domain: &str, planned: &[Planned]) {
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
}
