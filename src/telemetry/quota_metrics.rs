//! The RLQS series: streams open, why streams ended badly, what gateways reported per rule, and
//! the assignments sent by kind, pushes, holds refused, and the store errors around them. Labels
//! are rules and fixed words, never a bucket's values.

use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::labels::{KindLabels, RuleLabels};
use super::register::register;

#[derive(Default)]
pub struct QuotaMetrics {
    pub streams: Gauge,
    /// Buckets the open streams hold.
    pub buckets: Gauge,
    /// Requests per second this replica's live assignments let through, per rule.
    pub granted_rate: Family<RuleLabels, Gauge<f64, AtomicU64>>,
    /// Buckets that met each rule, and the streams that hold them, on this replica.
    pub rule_buckets: Family<RuleLabels, Gauge>,
    pub rule_streams: Family<RuleLabels, Gauge>,
    /// Streams closed by us (malformed report, a bound) or failed, by reason.
    pub stream_errors: Family<KindLabels, Counter>,
    /// Requests gateways said they admitted, per rule.
    pub reported_allowed: Family<RuleLabels, Counter>,
    /// Requests gateways said they refused, per rule.
    pub reported_denied: Family<RuleLabels, Counter>,
    /// Bucket actions sent, by kind (token_bucket, allow_all, deny_all, abandon).
    pub assignments: Family<KindLabels, Counter>,
    /// Grants the store could not make (the failure mode answered instead).
    pub store_errors: Counter,
    /// Reports held to the next second (a stream past its reports a second).
    pub reports_paced: Counter,
    /// Answers pushed between reports (a descriptor held was contested: parts changed).
    pub pushes: Counter,
    /// Holds refused: this replica's streams already held `MAX_STREAMS_PER_DESCRIPTOR` of the
    /// descriptor's holder slots.
    pub holds_refused: Counter,
    /// Holds refused to a connection that left `MOST_ENDED_PER_CONNECTION` ended streams'
    /// claims standing on the descriptor (streams churned).
    pub churned_holds_refused: Counter,
    /// Ended streams' claims folded into the rule's counters, by result (`folded`; `failed`: the
    /// store could not charge or forget, the record stands to its keep; `skipped`: too many
    /// pending on this replica, likewise).
    pub folds: Family<KindLabels, Counter>,
    /// Writes or reads of the contested descriptors that failed (pushes wait for the reports).
    pub push_errors: Counter,
    /// Failed pushes of RLS demand to the quota store (the gateways' shares leave RLS its
    /// part a push later), announcements that this replica serves RLQS, or marks that it
    /// counts per-second limits apart (`server::blind`).
    pub demand_errors: Counter,
}

impl QuotaMetrics {
    pub(super) fn register(&self, registry: &mut Registry, names: &mut Vec<String>) {
        register(
            registry,
            names,
            "rlqs_streams",
            "RLQS streams open from gateways (Envoy's rate_limit_quota filter)",
            self.streams.clone(),
        );
        register(
            registry,
            names,
            "rlqs_buckets",
            "Buckets the open RLQS streams hold",
            self.buckets.clone(),
        );
        register(
            registry,
            names,
            "rlqs_granted_rate",
            "Requests per second this replica's RLQS assignments let through, per rule",
            self.granted_rate.clone(),
        );
        register(
            registry,
            names,
            "rlqs_rule_buckets",
            "RLQS buckets that met each rule, on this replica",
            self.rule_buckets.clone(),
        );
        register(
            registry,
            names,
            "rlqs_rule_streams",
            "RLQS streams holding a bucket of each rule, on this replica",
            self.rule_streams.clone(),
        );
        register(
            registry,
            names,
            "rlqs_stream_errors",
            "RLQS streams ended by a malformed report, a bound, or a failure, by kind",
            self.stream_errors.clone(),
        );
        register(
            registry,
            names,
            "rlqs_reported_allowed",
            "Requests RLQS gateways reported admitted, per rule",
            self.reported_allowed.clone(),
        );
        register(
            registry,
            names,
            "rlqs_reported_denied",
            "Requests RLQS gateways reported refused, per rule",
            self.reported_denied.clone(),
        );
        register(
            registry,
            names,
            "rlqs_assignments",
            "RLQS bucket actions sent, by kind (token_bucket, allow_all, deny_all, abandon)",
            self.assignments.clone(),
        );
        register(
            registry,
            names,
            "rlqs_pushes",
            "RLQS answers pushed between reports: a descriptor the stream holds was contested by a gateway short of its fair share, and its parts changed",
            self.pushes.clone(),
        );
        register(
            registry,
            names,
            "rlqs_push_errors",
            "Writes or reads of the RLQS contested descriptors that failed: a gateway short of its share waits for the others' next reports instead of a push",
            self.push_errors.clone(),
        );
        register(
            registry,
            names,
            "rlqs_holds_refused",
            "RLQS holds refused (DENY_ALL until the next report): this replica's streams already held its share of the descriptor's holder slots",
            self.holds_refused.clone(),
        );
        register(
            registry,
            names,
            "rlqs_churned_holds_refused",
            "RLQS holds refused (DENY_ALL until those claims end) to a connection whose ended streams left as many claims standing on the descriptor as one connection may: streams opened and closed in a loop",
            self.churned_holds_refused.clone(),
        );
        register(
            registry,
            names,
            "rlqs_folds",
            "RLQS ended streams whose claims were charged into the rule's counters once their last assignment ended, their records gone (kind: folded; failed or skipped: the record stands until its window ends)",
            self.folds.clone(),
        );
        register(
            registry,
            names,
            "rlqs_reports_paced",
            "RLQS reports held to the next second: their stream sent more than --rlqs-max-reports-per-second",
            self.reports_paced.clone(),
        );
        register(
            registry,
            names,
            "rlqs_store_errors",
            "RLQS grants the store could not make (the failure mode answered)",
            self.store_errors.clone(),
        );
        register(
            registry,
            names,
            "rlqs_demand_errors",
            "Failed pushes of RLS demand to the quota store, announcements that this replica serves RLQS, or marks of a per-second Redis",
            self.demand_errors.clone(),
        );
    }
}
