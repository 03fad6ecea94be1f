//! What a bucket is sent: its part of a hold as a token bucket (holding `--rlqs-burst`, or a
//! tenth of the rule's shortest window, of the part), DENY_ALL for no part, the failure mode's
//! assignment when the store could not grant, and a quiet bucket re-quoted when its part
//! changed. Each assignment is counted by kind. It must never send a bucket more than its part.

use std::time::Duration;

use super::report::{self, BucketKey, allow_all, deny_all, token_bucket};
use super::{Inner, StreamState};
use crate::algorithm::share::Tokens;
use crate::limiter::FailureMode;
use crate::pb::rlqs::{BucketAction, BucketId};
use crate::store::StoreError;
use crate::telemetry::KindLabels;

impl Inner {
    /// A bucket not in the report, given its new `part` of its hold (a bucket holding `span` of
    /// it): the action to send and the registry's change, when what it has must change.
    pub(super) fn requote(
        &self,
        state: &mut StreamState,
        key: BucketKey,
        part: Option<Tokens>,
        span: Duration,
        ttl: Duration,
    ) -> Option<(BucketAction, (BucketKey, Option<super::Assigned>))> {
        let bucket = state.buckets.get_mut(&key)?;
        let kept = part.map(|p| report::steady(bucket.sent, p));
        if kept == bucket.sent {
            return None;
        }
        let id = BucketId {
            bucket: key.iter().cloned().collect(),
        };
        let (action, sent) = self.assign(id, bucket.sent, part, span, ttl);
        bucket.sent = sent;
        let assigned = report::describe(&key, bucket.rule.clone(), &action);
        Some((action, (key, Some(assigned))))
    }

    /// How much of its share a gateway's bucket holds on a rule whose shortest window is
    /// `shortest_us` (`--rlqs-burst`, else sized by that window; 0, none known: a second).
    pub(super) fn burst_span(&self, shortest_us: u64) -> Duration {
        crate::algorithm::share::burst_span(self.config.burst, shortest_us)
    }

    /// A bucket's part as an action: a token bucket (kept as sent when a little smaller) holding
    /// `span` of it, or DENY_ALL for none. Returns the action and the tokens sent.
    pub(super) fn assign(
        &self,
        id: BucketId,
        sent_before: Option<Tokens>,
        part: Option<Tokens>,
        span: Duration,
        ttl: Duration,
    ) -> (BucketAction, Option<Tokens>) {
        match part {
            Some(part) => {
                self.count_kind("token_bucket");
                let part = report::steady(sent_before, part);
                (token_bucket(id, part, span, ttl), Some(part))
            }
            None => {
                self.count_kind("deny_all");
                (deny_all(id, ttl), None)
            }
        }
    }

    pub(super) fn count_kind(&self, kind: &str) {
        self.metrics
            .quota
            .assignments
            .get_or_create(&KindLabels { kind: kind.into() })
            .inc();
    }

    pub(super) fn failed_log(&self, error: &StoreError, gateway: u64) {
        self.metrics.quota.store_errors.inc();
        if let Some(skipped) = self.log.allow() {
            tracing::error!(gateway, %error, mode = ?self.config.failure_mode, similar_not_logged = skipped, "RLQS grant failed; the failure mode assigns");
        }
    }

    /// The failure mode's assignment when the quota store could not grant.
    pub(super) fn failed(&self, id: BucketId, error: &StoreError, gateway: u64) -> BucketAction {
        self.failed_log(error, gateway);
        // Short, so that the store's answer comes back at the next report.
        let ttl = Duration::from_secs(self.config.reporting_interval.as_secs().max(1) + 1);
        match self.config.failure_mode {
            FailureMode::Allow => {
                self.count_kind("allow_all");
                allow_all(id, ttl)
            }
            _ => {
                self.count_kind("deny_all");
                deny_all(id, ttl)
            }
        }
    }
}
