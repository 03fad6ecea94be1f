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
}

#[derive(Default)]
pub struct Registry {
    streams: Mutex<HashMap<u64, Stream>>,
}

#[derive(Serialize)]
struct Listed<'a> {
    gateway: u64,
    domain: &'a str,
    buckets: Vec<&'a Assigned>,
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Stream>> {
        self.streams.lock().unwrap_or_else(|p| p.into_inner())
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
        let mut streams = self.lock();
        let stream = streams.entry(gateway).or_default();
        stream.domain = domain.to_owned();
        let mut touched: Vec<String> = Vec::new();
        for (key, assigned) in changes {
            let old = match assigned {
                Some(a) => {
                    touched.extend(a.rule.clone());
                    stream.buckets.insert(key, a)
                }
                None => stream.buckets.remove(&key),
            };
            touched.extend(old.and_then(|o| o.rule));
        }
        Self::publish(&streams, metrics, domain, touched);
    }

    /// A stream ended: its buckets leave the listing and the gauges.
    pub fn forget(&self, metrics: &Metrics, gateway: u64) {
        let mut streams = self.lock();
        let Some(stream) = streams.remove(&gateway) else {
            return;
        };
        let touched = stream
            .buckets
            .into_values()
            .filter_map(|a| a.rule)
            .collect();
        Self::publish(&streams, metrics, &stream.domain, touched);
    }

    /// Sets the bucket count and, for each rule touched, the rate granted on this replica.
    fn publish(
        streams: &HashMap<u64, Stream>,
        metrics: &Metrics,
        domain: &str,
        mut rules: Vec<String>,
    ) {
        let buckets: usize = streams.values().map(|s| s.buckets.len()).sum();
        metrics
            .quota
            .buckets
            .set(i64::try_from(buckets).unwrap_or(i64::MAX));
        rules.sort();
        rules.dedup();
        for rule in rules {
            let mine = |a: &&Assigned| a.rule.as_deref() == Some(rule.as_str());
            let holding = streams
                .values()
                .filter(|s| s.domain == domain)
                .map(|s| s.buckets.values().filter(mine).count());
            let (buckets, holders) =
                holding.fold((0, 0), |(b, h), n| (b + n, h + usize::from(n > 0)));
            let rate: f64 = streams
                .values()
                .filter(|s| s.domain == domain)
                .flat_map(|s| s.buckets.values())
                .filter(|a| a.rule.as_deref() == Some(rule.as_str()))
                .filter_map(|a| a.rate)
                // From +0: an empty `sum` of floats is -0, which reads oddly on a dashboard.
                .fold(0.0, |total, r| total + r);
            let labels = RuleLabels {
                domain: domain.to_owned(),
                rule,
            };
            let q = &metrics.quota;
            q.granted_rate.get_or_create(&labels).set(rate);
            let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
            q.rule_buckets.get_or_create(&labels).set(count(buckets));
            q.rule_streams.get_or_create(&labels).set(count(holders));
        }
    }

    /// Every stream and its buckets as JSON, cut at `MAX_LISTED` buckets (`truncated`).
    pub fn json(&self) -> String {
        let streams = self.lock();
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
