//! What this replica has assigned, for operators: each open RLQS stream with its buckets, the
//! rule each met and the assignment last sent (`GET /rlqs` on the admin listener), and per rule
//! the rate granted, the buckets and the streams holding them. Bounded by the streams and buckets the
//! service admits; the listing is cut at `MAX_LISTED` buckets. It must never decide anything.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use serde::Serialize;

use super::report::BucketKey;
use crate::telemetry::{Metrics, RuleLabels};

/// The most buckets one `/rlqs` answer lists.
pub const MAX_LISTED: usize = 2_000;

/// One bucket's standing on one stream.
#[derive(Debug, Clone, Serialize)]
pub struct Assigned {
    pub bucket: BTreeMap<String, String>,
    /// The rule met (`domain.key_value.key`), or none.
    pub rule: Option<String>,
    /// `token_bucket 10/1s`, `allow_all`, `deny_all`.
    pub assignment: String,
    /// Requests per second the assignment lets through (0 for deny_all; none for allow_all).
    pub rate: Option<f64>,
}

#[derive(Debug, Default)]
struct Stream {
    domain: String,
    buckets: HashMap<BucketKey, Assigned>,
    /// Buckets of this stream per rule, to count the streams holding each rule.
    per_rule: HashMap<String, usize>,
}

/// One rule's totals on this replica, kept as buckets come and go (never recounted).
#[derive(Debug, Default)]
struct Totals {
    buckets: usize,
    streams: usize,
    rate: f64,
}

#[derive(Default)]
struct State {
    streams: HashMap<u64, Stream>,
    rules: HashMap<(String, String), Totals>,
    buckets: usize,
}

#[derive(Default)]
pub struct Registry {
    state: Mutex<State>,
}

#[derive(Serialize)]
struct Listed<'a> {
    gateway: u64,
    domain: &'a str,
    buckets: Vec<&'a Assigned>,
}

impl State {
    /// Counts `a` in (`sign` 1) or out (-1) of its stream's and its rule's totals.
    fn count(&mut self, gateway: u64, a: &Assigned, sign: i8) -> Option<(String, String)> {
        let stream = self.streams.get_mut(&gateway)?;
        self.buckets = if sign > 0 {
            self.buckets + 1
        } else {
            self.buckets.saturating_sub(1)
        };
        let rule = a.rule.clone()?;
        let held = stream.per_rule.entry(rule.clone()).or_default();
        let key = (stream.domain.clone(), rule);
        let totals = self.rules.entry(key.clone()).or_default();
        if sign > 0 {
            totals.streams += usize::from(*held == 0);
            *held += 1;
            totals.buckets += 1;
            totals.rate += a.rate.unwrap_or(0.0);
        } else {
            *held = held.saturating_sub(1);
            totals.streams -= usize::from(*held == 0 && totals.streams > 0);
            totals.buckets = totals.buckets.saturating_sub(1);
            // With no bucket left the rate is 0, not what subtracting floats leaves.
            totals.rate = if totals.buckets == 0 {
                0.0
            } else {
                totals.rate - a.rate.unwrap_or(0.0)
            };
        }
        Some(key)
    }

    /// Sets the bucket count and each touched rule's gauges; a rule left with no bucket is
    /// dropped from the totals (its gauges read 0).
    fn publish(&mut self, metrics: &Metrics, mut touched: Vec<(String, String)>) {
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        metrics.quota.buckets.set(count(self.buckets));
        touched.sort();
        touched.dedup();
        for key in touched {
            let totals = self
                .rules
                .get(&key)
                .map_or((0, 0, 0.0), |t| (t.buckets, t.streams, t.rate));
            let labels = RuleLabels {
                domain: key.0.clone(),
                rule: key.1.clone(),
            };
            let q = &metrics.quota;
            q.rule_buckets.get_or_create(&labels).set(count(totals.0));
            q.rule_streams.get_or_create(&labels).set(count(totals.1));
            q.granted_rate.get_or_create(&labels).set(totals.2);
            if totals.0 == 0 {
                self.rules.remove(&key);
            }
        }
    }
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records what a report's answer assigned (or, `None`, that a bucket was abandoned), then
    /// updates the gauges of the rules touched.
    pub fn record(
        &self,
        metrics: &Metrics,
        gateway: u64,
        domain: &str,
        changes: Vec<(BucketKey, Option<Assigned>)>,
    ) {
        let mut state = self.lock();
        state.streams.entry(gateway).or_default().domain = domain.to_owned();
        let mut touched = Vec::new();
        for (key, assigned) in changes {
            let stream = state.streams.get_mut(&gateway).expect("inserted above");
            let old = match &assigned {
                Some(a) => stream.buckets.insert(key, a.clone()),
                None => stream.buckets.remove(&key),
            };
            if let Some(old) = old {
                touched.extend(state.count(gateway, &old, -1));
            }
            if let Some(new) = &assigned {
                touched.extend(state.count(gateway, new, 1));
            }
        }
        state.publish(metrics, touched);
    }

    /// A stream ended: its buckets leave the listing and the gauges.
    pub fn forget(&self, metrics: &Metrics, gateway: u64) {
        let mut state = self.lock();
        let Some(buckets) = state
            .streams
            .get_mut(&gateway)
            .map(|s| std::mem::take(&mut s.buckets))
        else {
            return;
        };
        let touched = buckets
            .values()
            .filter_map(|a| state.count(gateway, a, -1))
            .collect();
        state.streams.remove(&gateway);
        state.publish(metrics, touched);
    }

    /// Every stream and its buckets as JSON, cut at `MAX_LISTED` buckets (`truncated`).
    pub fn json(&self) -> String {
        let state = self.lock();
        let streams = &state.streams;
        let mut gateways: Vec<&u64> = streams.keys().collect();
        gateways.sort();
        let mut left = MAX_LISTED;
        let mut listed = Vec::new();
        for gateway in gateways {
            let stream = &streams[gateway];
            let mut buckets: Vec<&Assigned> = stream.buckets.values().collect();
            buckets.sort_by(|a, b| a.bucket.cmp(&b.bucket));
            buckets.truncate(left);
            left -= buckets.len();
            listed.push(Listed {
                gateway: *gateway,
                domain: &stream.domain,
                buckets,
            });
        }
        let total: usize = streams.values().map(|s| s.buckets.len()).sum();
        serde_json::json!({
            "streams": listed,
            "buckets": total,
            "truncated": total > MAX_LISTED,
        })
        .to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assigned(tenant: &str, rate: f64) -> (BucketKey, Option<Assigned>) {
        let key = vec![("tenant".to_owned(), tenant.to_owned())];
        let a = Assigned {
            bucket: key.iter().cloned().collect(),
            rule: Some("d.tenant".into()),
            assignment: format!("token_bucket {rate}/1s"),
            rate: Some(rate),
        };
        (key, Some(a))
    }

    fn gauges(metrics: &Metrics) -> (i64, i64, f64) {
        let labels = RuleLabels {
            domain: "d".into(),
            rule: "d.tenant".into(),
        };
        let q = &metrics.quota;
        (
            q.rule_buckets.get_or_create(&labels).get(),
            q.rule_streams.get_or_create(&labels).get(),
            q.granted_rate.get_or_create(&labels).get(),
        )
    }

    #[test]
    fn totals_follow_buckets_replaced_abandoned_and_streams_gone() {
        let metrics = Metrics::default();
        let registry = Registry::default();
        registry.record(
            &metrics,
            1,
            "d",
            vec![assigned("a", 4.0), assigned("b", 2.0)],
        );
        registry.record(&metrics, 2, "d", vec![assigned("a", 3.0)]);
        assert_eq!(gauges(&metrics), (3, 2, 9.0));
        // A new assignment replaces the old one; an abandoned bucket leaves.
        registry.record(
            &metrics,
            1,
            "d",
            vec![assigned("a", 1.0), (assigned("b", 0.0).0, None)],
        );
        assert_eq!(gauges(&metrics), (2, 2, 4.0));
        registry.forget(&metrics, 2);
        assert_eq!(gauges(&metrics), (1, 1, 1.0));
        registry.forget(&metrics, 1);
        assert_eq!(gauges(&metrics), (0, 0, 0.0));
        assert_eq!(metrics.quota.buckets.get(), 0);
    }
}
