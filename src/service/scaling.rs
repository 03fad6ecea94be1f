//! Runtime scaling at the service: the temporary factors read back from the store into the
//! `ArcSwap<Scaling>` the decider reads per call, the per-domain gauge and each rule's limit as
//! the factors make it (`portcullis_rule_limit`), and what the admin
//! endpoint changes. The server calls `refresh` every reload interval (so every replica on one
//! Redis applies the same factors within one interval); the admin endpoint calls it right after a
//! change (so the replica that took it applies it on its next call).
//!
//! It must never drop the factors in force because the store could not be read: they stay,
//! minus those whose expiry passed by this process' count of elapsed time.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;

use crate::limiter::Limiter;
use crate::rules::Snapshot;
use crate::rules::scaling::Scaling;
use crate::store::StoreError;
use std::collections::HashSet;

use crate::rules::scaling::scale;
use crate::telemetry::{DomainLabels, LogThrottle, Metrics, RuleLabels, RuleLimitLabels};

/// The store's clock when the factors were last read, and this process' instant then.
#[derive(Default)]
pub struct LastRead {
    at: std::sync::Mutex<Option<(u64, Instant)>>,
    failures: LogThrottle,
}

/// Reads the store's temporary factors into `scaling` (the file's stay as they are) and
/// publishes the per-domain gauge.
pub async fn refresh(
    limiter: &Limiter,
    scaling: &ArcSwap<Scaling>,
    rules: &ArcSwap<Snapshot>,
    metrics: &Metrics,
    last: &LastRead,
    within: Duration,
) -> Result<(), StoreError> {
    let read = limiter.load_factors(within).await;
    let mut at = last.at.lock().unwrap_or_else(|p| p.into_inner());
    let result = match read {
        Ok(shared) => {
            let temporary = Scaling::temporary_from(&shared.entries, shared.now_ms);
            scaling.rcu(|current| Scaling {
                file: current.file.clone(),
                temporary: temporary.clone(),
                read_at_ms: shared.now_ms,
            });
            *at = Some((shared.now_ms, Instant::now()));
            Ok(())
        }
        Err(error) => {
            // Expire what we hold by our own count of time since the store's last word.
            if let Some((store_ms, then)) = *at {
                let now_ms = store_ms + then.elapsed().as_millis() as u64;
                scaling.rcu(|current| Scaling {
                    file: current.file.clone(),
                    temporary: current
                        .temporary
                        .iter()
                        .filter(|t| t.expires_at_ms > now_ms)
                        .cloned()
                        .collect(),
                    read_at_ms: now_ms,
                });
            }
            // Only worth a warning while temporary factors are in force (they may be stale):
            // a store outage where nobody scales says nothing about scaling.
            if scaling.load().temporary.is_empty() {
                tracing::debug!(%error, "temporary scaling factors not read (none in force)");
            } else if let Some(skipped) = last.failures.allow() {
                tracing::warn!(%error, similar_failures_not_logged = skipped,
                    "cannot read the temporary scaling factors from the store; the ones in force stay until they expire");
            }
            Err(error)
        }
    };
    drop(at);
    publish(metrics, &scaling.load(), &rules.load());
    result
}

/// `portcullis_scaling_factor{domain}` for every configured domain, and for no other: a domain
/// removed by a reload loses its series (else its last factor, and its alert, would stay).
pub fn publish(metrics: &Metrics, scaling: &Scaling, rules: &Snapshot) {
    let mut published = metrics
        .scaling_domains
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let configured: std::collections::HashSet<&str> = rules.domain_names().into_iter().collect();
    published.retain(|domain| {
        let keep = configured.contains(domain.as_str());
        if !keep {
            metrics.scaling_factor.remove(&DomainLabels {
                domain: domain.clone(),
            });
        }
        keep
    });
    for domain in configured {
        metrics
            .scaling_factor
            .get_or_create(&DomainLabels {
                domain: domain.to_owned(),
            })
            .set(scaling.domain_factor(domain));
        if !published.contains(domain) {
            published.insert(domain.to_owned());
        }
    }
    drop(published);
    publish_limits(metrics, scaling, rules);
}

/// `portcullis_rule_limit{domain, rule, unit}` and `…_per_second{domain, rule}` for every limited
/// rule of the rules in force (a layered rule per layer, named as its hit counters are), scaled
/// by the factors in force; a rule removed by a reload loses its series. One series per rule of
/// the files: bounded by configuration, never by requests.
fn publish_limits(metrics: &Metrics, scaling: &Scaling, rules: &Snapshot) {
    let mut wanted: Vec<(RuleLimitLabels, f64, f64)> = Vec::new();
    for rule in rules.rules() {
        let limits: Vec<(
            String,
            Option<&str>,
            &crate::algorithm::Limit,
            crate::rules::Unit,
        )> = if rule.layers.is_empty() {
            match (&rule.limit, rule.unit) {
                (Some(limit), Some(unit)) => {
                    vec![(rule.full_key.clone(), rule.name.as_deref(), limit, unit)]
                }
                _ => continue,
            }
        } else {
            rule.layers
                .iter()
                .enumerate()
                .map(|(i, l)| {
                    (
                        l.metric_name(&rule.full_key, i),
                        l.name.as_deref(),
                        &l.limit,
                        l.unit,
                    )
                })
                .collect()
        };
        for (name, limit_name, limit, unit) in limits {
            let scaled = scale(limit, scaling.factor(&rule.domain, limit_name));
            let labels = RuleLimitLabels {
                domain: rule.domain.clone(),
                rule: name,
                unit: unit.name().to_owned(),
            };
            wanted.push((labels, scaled.requests as f64, scaled.per_second()));
        }
    }
    let mut series = metrics
        .rule_limit_series
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let keep: HashSet<&RuleLimitLabels> = wanted.iter().map(|(l, _, _)| l).collect();
    series.retain(|labels| {
        let kept = keep.contains(labels);
        if !kept {
            metrics.rule_limit.remove(labels);
            metrics.rule_limit_per_second.remove(&RuleLabels {
                domain: labels.domain.clone(),
                rule: labels.rule.clone(),
            });
        }
        kept
    });
    for (labels, per_unit, per_second) in wanted {
        metrics.rule_limit.get_or_create(&labels).set(per_unit);
        metrics
            .rule_limit_per_second
            .get_or_create(&RuleLabels {
                domain: labels.domain.clone(),
                rule: labels.rule.clone(),
            })
            .set(per_second);
        series.insert(labels);
    }
}

/// Shared by the admin endpoint and the server's poller.
pub struct ScalingHandle {
    pub scaling: Arc<ArcSwap<Scaling>>,
    pub last: LastRead,
}
