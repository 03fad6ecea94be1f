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
use crate::store::quota::Ask;
use crate::telemetry::KindLabels;

impl Inner {
    /// A bucket not in the report, given its new `part` of its hold: the action to send and
    /// the registry's change, when what it has must change.
    pub(super) fn requote(
        &self,
        state: &mut StreamState,
        key: BucketKey,
        part: Option<Tokens>,
        ttl: Duration,
    ) -> Option<(BucketAction, (BucketKey, Option<super::Assigned>))> {
        let span = (state.buckets.get(&key)?.counter.as_ref())
            .and_then(|c| state.asks.get(c))
            .map(|a| self.burst_span(a));
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

    /// How much of its share a gateway's bucket on `ask`'s rule holds (`--rlqs-burst`, else
    /// sized by the rule's shortest window).
    pub(super) fn burst_span(&self, ask: &Ask) -> Duration {
        crate::algorithm::share::burst_span(self.config.burst, ask.shortest_us)
    }

    /// A bucket's part as an action: a token bucket (kept as sent when a little smaller) holding
    /// `span` of it (none known: a second), or DENY_ALL for none. Returns the action and the
    /// tokens sent.
    pub(super) fn assign(
        &self,
        id: BucketId,
        sent_before: Option<Tokens>,
        part: Option<Tokens>,
        span: Option<Duration>,
        ttl: Duration,
    ) -> (BucketAction, Option<Tokens>) {
        match part {
            Some(part) => {
                self.count_kind("token_bucket");
                let part = report::steady(sent_before, part);
                let span = span.unwrap_or(Duration::from_secs(1));
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
