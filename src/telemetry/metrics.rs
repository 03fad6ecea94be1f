//! The Prometheus registry: every metric Portcullis exports, registered once, cheap to update from
//! the request path, plus the gauges read when scraped (tasks, descriptors, memory, the memory
//! store's fill). It must never label a series with raw request data unless a rule asks for it.

use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::hot_metrics::HotMetrics;
use super::labels::{
    CodeLabels, DomainLabels, KindLabels, ListenerLabels, ModeLabels, ResultLabels, RuleLabels,
    RuleLimitLabels,
};
use super::process::ProcessGauges;
use super::quota_metrics::QuotaMetrics;
use super::register::register;

/// Every metric Portcullis exports, registered once; cheap to update from the request path.
/// docs/operating.md lists each with its envoyproxy/ratelimit counterpart.
pub struct Metrics {
    registry: Registry,
    /// The names the metrics are exported under, e.g. `portcullis_rule_hits_total`.
    names: Vec<String>,
    pub rule_hits: Family<RuleLabels, Counter>,
    pub rule_over_limit: Family<RuleLabels, Counter>,
    pub rule_near_limit: Family<RuleLabels, Counter>,
    pub rule_within_limit: Family<RuleLabels, Counter>,
    pub rule_shadow_mode: Family<RuleLabels, Counter>,
    pub rule_refunded: Family<RuleLabels, Counter>,
    pub calls: Family<CodeLabels, Counter>,
    pub call_seconds: Histogram,
    pub store_seconds: Histogram,
    pub store_errors: Family<KindLabels, Counter>,
    pub store_connect_errors: Family<KindLabels, Counter>,
    pub failure_mode_answers: Family<ModeLabels, Counter>,
    /// Refunds and post-paid charges still sent after their callers were answered.
    pub late_charges: Family<ResultLabels, Counter>,
    pub rules_reloads: Family<ResultLabels, Counter>,
    pub rules_loaded_timestamp: Gauge<f64, AtomicU64>,
    pub unknown_domain: Counter,
    pub deny_cache_hits: Counter,
    pub deny_cache_evictions: Counter,
    pub detailed_series_folded: Counter,
    pub accept_errors: Family<ListenerLabels, Counter>,
    pub ready: Gauge,
    pub rules_xds_connected: Gauge,
    pub rules_xds_stream_errors: Counter,
    /// The factor each configured domain's limits run at (runtime scaling; 1 when none).
    pub scaling_factor: Family<DomainLabels, Gauge<f64, AtomicU64>>,
    /// The domains `scaling_factor` has a series for (so a removed domain's goes).
    pub scaling_domains: Mutex<HashSet<String>>,
    /// Each configured rule's (and layer's) limit per its unit, scaled by the factors in force.
    pub rule_limit: Family<RuleLimitLabels, Gauge<f64, AtomicU64>>,
    /// The same limit per second, for comparing with rates of the hit counters.
    pub rule_limit_per_second: Family<RuleLabels, Gauge<f64, AtomicU64>>,
    /// The series `rule_limit` has (so a removed rule's go).
    pub rule_limit_series: Mutex<HashSet<RuleLimitLabels>>,
    pub scaling_reloads: Family<ResultLabels, Counter>,
    /// Read when scraped: tasks, descriptors, memory, the memory store's fill.
    process: ProcessGauges,
    /// The quota service's (RLQS) streams, reports and assignments.
    pub quota: QuotaMetrics,
    /// Hot counters decided from this replica's claims (`store::hot`).
    pub hot: std::sync::Arc<HotMetrics>,
    /// Share of the limit above which allowed hits also count as near the limit.
    pub near_limit_ratio: f64,
    /// The per-value labels `detailed_metric` rules have created, at most `max_detailed`.
    detailed: Mutex<HashSet<RuleLabels>>,
    max_detailed: usize,
}

impl Metrics {
    /// `max_detailed`: the most per-value series `detailed_metric` rules may create.
    pub fn new(near_limit_ratio: f64, max_detailed: usize) -> Metrics {
        let mut registry = Registry::with_prefix("portcullis");
        let mut names = Vec::new();
        let latency = || Histogram::new(exponential_buckets(0.000_05, 2.0, 16));
        let m = Metrics {
            rule_hits: Family::default(),
            rule_over_limit: Family::default(),
            rule_near_limit: Family::default(),
            rule_within_limit: Family::default(),
            rule_shadow_mode: Family::default(),
            rule_refunded: Family::default(),
            calls: Family::default(),
            call_seconds: latency(),
            store_seconds: latency(),
            store_errors: Family::default(),
            store_connect_errors: Family::default(),
            failure_mode_answers: Family::default(),
            late_charges: Family::default(),
            rules_reloads: Family::default(),
            rules_loaded_timestamp: Gauge::default(),
            unknown_domain: Counter::default(),
            deny_cache_hits: Counter::default(),
            deny_cache_evictions: Counter::default(),
            detailed_series_folded: Counter::default(),
            accept_errors: Family::default(),
            ready: Gauge::default(),
            rules_xds_connected: Gauge::default(),
            rules_xds_stream_errors: Counter::default(),
            scaling_factor: Family::default(),
            scaling_domains: Mutex::new(HashSet::new()),
            rule_limit: Family::default(),
            rule_limit_per_second: Family::default(),
            rule_limit_series: Mutex::new(HashSet::new()),
            scaling_reloads: Family::default(),
            process: ProcessGauges::default(),
            quota: QuotaMetrics::default(),
            hot: Default::default(),
            near_limit_ratio,
            detailed: Mutex::new(HashSet::new()),
            max_detailed,
            registry: Registry::default(),
            names: Vec::new(),
        };
        register(
            &mut registry,
            &mut names,
            "rule_hits",
            "Hits counted against a rule (hits_addend summed)",
            m.rule_hits.clone(),
        );
        register(
            &mut registry,
            &mut names,
            "rule_over_limit",
            "Hits refused by a rule",
            m.rule_over_limit.clone(),
        );
        register(
            &mut registry,
            &mut names,
            "rule_near_limit",
            "Hits allowed that left the rule's counter above the near-limit ratio",
            m.rule_near_limit.clone(),
        );
        register(
            &mut registry,
            &mut names,
            "rule_within_limit",
            "Hits allowed by a rule",
            m.rule_within_limit.clone(),
        );
        register(
            &mut registry,
            &mut names,
            "rule_shadow_mode",
            "Hits over a shadow-mode rule's limit (allowed because of shadow mode)",
            m.rule_shadow_mode.clone(),
        );
        register(
            &mut registry,
            &mut names,
            "rule_refunded",
            "Hits given back to a rule's budget (is_negative_hits)",
            m.rule_refunded.clone(),
        );
        register(
            &mut registry,
            &mut names,
            "grpc_calls",
            "ShouldRateLimit calls by gRPC status code",
            m.calls.clone(),
        );
        register(
            &mut registry,
            &mut names,
            "grpc_call_duration_seconds",
            "ShouldRateLimit latency",
            m.call_seconds.clone(),
        );
        register(
            &mut registry,
            &mut names,
            "store_duration_seconds",
            "Latency of one store call",
            m.store_seconds.clone(),
        );
        register(
            &mut registry,
            &mut names,
            "store_errors",
            "Checks the store failed to decide, by kind (timeout, unavailable, permanent, protocol)",
            m.store_errors.clone(),
        );
        register(
            &mut registry,
            &mut names,
            "store_connect_errors",
            "Failed attempts to connect to the store, by kind (permanent: fix the configuration)",
            m.store_connect_errors.clone(),
        );
        register(
            &mut registry,
            &mut names,
            "failure_mode_answers",
            "Calls answered by the failure mode because the store failed",
            m.failure_mode_answers.clone(),
        );
        register(
            &mut registry,
            &mut names,
            "store_late_charges",
            "Refunds and post-paid charges sent to the store after their callers were answered, by \
             result (recorded, lost)",
            m.late_charges.clone(),
        );
        register(
            &mut registry,
            &mut names,
            "rules_reloads",
            "Rule reloads by result (success, error)",
            m.rules_reloads.clone(),
        );
        register(
            &mut registry,
            &mut names,
            "rules_loaded_timestamp_seconds",
            "When the rules in force were loaded (Unix time)",
            m.rules_loaded_timestamp.clone(),
        );
        register(
            &mut registry,
            &mut names,
            "unknown_domain",
            "Calls for a domain no rules file defines",
            m.unknown_domain.clone(),
        );
        register(
            &mut registry,
            &mut names,
            "deny_cache_hits",
            "Checks refused by the local deny cache without asking the store",
            m.deny_cache_hits.clone(),
        );
        register(
            &mut registry,
            &mut names,
            "deny_cache_evictions",
            "Denials dropped from the full deny cache to make room (they cost a store call later)",
            m.deny_cache_evictions.clone(),
        );
        register(
            &mut registry,
            &mut names,
            "detailed_series_folded",
            "Descriptors of detailed_metric rules counted under the rule's own label because \
             --max-detailed-series per-value series exist already",
            m.detailed_series_folded.clone(),
        );
        register(
            &mut registry,
            &mut names,
            "accept_errors",
            "Connections a listener failed to accept (out of file descriptors, say), by listener",
            m.accept_errors.clone(),
        );
        register(
            &mut registry,
            &mut names,
            "ready",
            "1 while this replica is ready (what /readyz and gRPC health say), else 0",
            m.ready.clone(),
        );
        register(
            &mut registry,
            &mut names,
            "rules_xds_connected",
            "1 while the xDS rules stream is open, else 0 (rules from xDS only)",
            m.rules_xds_connected.clone(),
        );
        register(
            &mut registry,
            &mut names,
            "rules_xds_stream_errors",
            "xDS rules streams that ended or could not be opened (each is retried with back-off)",
            m.rules_xds_stream_errors.clone(),
        );
        register(
            &mut registry,
            &mut names,
            "scaling_factor",
            "The factor a domain's limits run at (runtime scaling: global times domain), 1 when none",
            m.scaling_factor.clone(),
        );
        register(
            &mut registry,
            &mut names,
            "rule_limit",
            "A rule's limit per its unit (a layered rule's per layer), as the scaling factors in \
             force make it",
            m.rule_limit.clone(),
        );
        register(
            &mut registry,
            &mut names,
            "rule_limit_per_second",
            "A rule's limit in requests per second (to compare with rate(portcullis_rule_hits_total))",
            m.rule_limit_per_second.clone(),
        );
        register(
            &mut registry,
            &mut names,
            "scaling_reloads",
            "Scaling file reloads by result (success, error)",
            m.scaling_reloads.clone(),
        );
        m.process.register(&mut registry, &mut names);
        m.quota.register(&mut registry, &mut names);
        m.hot.register(&mut registry, &mut names);
        m.zero_series();
        Metrics {
            registry,
            names,
            ..m
        }
    }

    /// Every series of a fixed label the docs tell operators to watch, at zero from the start:
    /// "check it stays flat" finds a flat line on a healthy replica, not no series at all (and
    /// `rate()` sees the first increment).
    fn zero_series(&self) {
        let kinds = |family: &Family<KindLabels, Counter>, values: &[&str]| {
            for kind in values {
                drop(family.get_or_create(&KindLabels {
                    kind: (*kind).into(),
                }));
            }
        };
        let results = |family: &Family<ResultLabels, Counter>, values: &[&str]| {
            for result in values {
                drop(family.get_or_create(&ResultLabels {
                    result: (*result).into(),
                }));
            }
        };
        kinds(
            &self.store_errors,
            &["timeout", "unavailable", "permanent", "protocol"],
        );
        for mode in ["allow", "deny", "local"] {
            drop(
                self.failure_mode_answers
                    .get_or_create(&ModeLabels { mode: mode.into() }),
            );
        }
        results(&self.late_charges, &["recorded", "lost"]);
        results(&self.rules_reloads, &["success", "error", "refused"]);
        results(&self.scaling_reloads, &["success", "error"]);
        for listener in ["grpc", "admin"] {
            drop(self.accept_errors.get_or_create(&ListenerLabels {
                listener: listener.into(),
            }));
        }
        kinds(
            &self.quota.stream_errors,
            &[
                "malformed",
                "too_large",
                "too_many_buckets",
                "streams_full",
                "transport",
            ],
        );
        kinds(
            &self.quota.assignments,
            &["token_bucket", "allow_all", "deny_all", "abandon"],
        );
    }

    /// The labels to count a `detailed_metric` rule's hit under: the per-value `detailed` ones
    /// while the cap allows (or they exist already), else the rule's own `folded` ones.
    pub fn detailed_labels(&self, detailed: RuleLabels, folded: RuleLabels) -> RuleLabels {
        let mut known = self.detailed.lock().unwrap_or_else(|p| p.into_inner());
        if known.contains(&detailed) {
            return detailed;
        }
        if known.len() < self.max_detailed {
            known.insert(detailed.clone());
            return detailed;
        }
        drop(known);
        self.detailed_series_folded.inc();
        folded
    }

    /// Every name the exposition can carry (`portcullis_rule_hits_total`, the histograms'
    /// `_bucket`, `_sum`, `_count`, ...), whether or not it has a sample yet.
    pub fn exported_names(&self) -> &[String] {
        &self.names
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        self.process.sample();
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// Reads the memory store's fill ratio when scraped (set once, by the server that built it).
    pub fn watch_memory_fill(&self, fill: Box<dyn Fn() -> f64 + Send + Sync>) {
        self.process.watch_memory_fill(fill);
    }

    pub fn rules_loaded(&self, at: std::time::SystemTime) {
        let secs = at
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        self.rules_loaded_timestamp.set(secs);
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new(0.8, 2000)
    }
}
