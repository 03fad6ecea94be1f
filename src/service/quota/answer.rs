//! One usage report answered: the stream's bounds checked (reports per second, buckets, one
//! domain), each bucket planned, the grants asked of the quota store in one call (the failure
//! mode, or this replica's own memory under `local`, where it cannot answer), and an action per
//! bucket built and recorded. It must never answer part of a malformed report.

use std::time::Duration;

use tokio::time::Instant;
use tonic::Status;

use super::report::{self, allow_all, bucket_key, deny_all, plan, token_bucket};
use super::{Inner, StreamState};
use crate::limiter::FailureMode;
use crate::pb::rlqs::{RateLimitQuotaResponse, RateLimitQuotaUsageReports};
use crate::telemetry::{KindLabels, RuleLabels};

impl Inner {
    /// Answers one report, or says why the stream ends.
    pub(super) async fn answer(
        &self,
        report: RateLimitQuotaUsageReports,
        state: &mut StreamState,
        gateway: u64,
    ) -> Result<RateLimitQuotaResponse, (&'static str, Status)> {
        // Past the reports a stream may send in a second, the next waits for the next second:
        // Envoy sends one at once for every new bucket, so a burst of new tenants is paced, not
        // refused (unread reports wait in HTTP/2 flow control, not in memory here).
        let mut now = Instant::now();
        if now.duration_since(state.window_start) >= Duration::from_secs(1) {
            state.window_start = now;
            state.reports_in_window = 0;
        }
        if state.reports_in_window >= self.config.max_reports_per_second {
            self.metrics.quota.reports_paced.inc();
            tokio::time::sleep_until(state.window_start + Duration::from_secs(1)).await;
            now = Instant::now();
            state.window_start = now;
            state.reports_in_window = 0;
        }
        state.reports_in_window += 1;
        let domain = match (&state.domain, report.domain.as_str()) {
            (None, "") => {
                return Err((
                    "malformed",
                    Status::invalid_argument("the first report of a stream must name its domain"),
                ));
            }
            (None, d) => {
                state.domain = Some(d.to_owned());
                d.to_owned()
            }
            (Some(d), "") => d.clone(),
            (Some(d), other) if d == other => d.clone(),
            (Some(d), other) => {
                return Err((
                    "malformed",
                    Status::invalid_argument(format!(
                        "the stream's domain is {d:?}; a report names {other:?} (one stream, one domain)"
                    )),
                ));
            }
        };
        if let Some(last) = state.last_report {
            state.interval = state.interval.max(now.duration_since(last));
        }
        state.last_report = Some(now);
        let ttl = Duration::from_secs(2 * state.interval.as_secs_f64().ceil() as u64 + 1);

        let mut keyed = Vec::with_capacity(report.bucket_quota_usages.len());
        for usage in &report.bucket_quota_usages {
            let key = bucket_key(usage, &self.config).map_err(|s| ("malformed", s))?;
            keyed.push((key, usage));
        }
        let new = keyed
            .iter()
            .filter(|(k, _)| !state.buckets.contains_key(k))
            .count();
        if state.buckets.len() + new > self.config.max_buckets_per_stream {
            return Err((
                "too_many_buckets",
                Status::resource_exhausted(format!(
                    "more than {} buckets on one stream",
                    self.config.max_buckets_per_stream
                )),
            ));
        }

        let snapshot = self.rules.load_full();
        let mut planned = Vec::with_capacity(keyed.len());
        for (key, usage) in keyed {
            let seen = usage
                .num_requests_allowed
                .saturating_add(usage.num_requests_denied);
            let elapsed = usage.time_elapsed.map_or(0.0, |d| {
                d.seconds.max(0) as f64 + f64::from(d.nanos.max(0)) / 1e9
            });
            let demand = seen as f64 / elapsed.max(self.config.reporting_interval.as_secs_f64());
            let bucket = plan(
                &self.decider,
                &snapshot,
                &domain,
                &key,
                gateway,
                demand,
                ttl,
            );
            let (rule, ask) = (bucket.rule, bucket.ask);
            if let Some(rule) = &rule {
                let labels = RuleLabels {
                    domain: domain.clone(),
                    rule: rule.clone(),
                };
                let q = &self.metrics.quota;
                q.reported_allowed
                    .get_or_create(&labels)
                    .inc_by(usage.num_requests_allowed);
                q.reported_denied
                    .get_or_create(&labels)
                    .inc_by(usage.num_requests_denied);
            }
            let id = usage.bucket_id.clone().unwrap_or_default();
            planned.push((key, id, rule, ask));
        }
        let asks: Vec<_> = planned.iter().filter_map(|p| p.3.clone()).collect();
        // Bounded as the buckets are (a reload may move a bucket to another descriptor).
        for ask in &asks {
            if state.held.len() < 2 * self.config.max_buckets_per_stream {
                state.held.insert(ask.key.clone());
            }
        }
        let mut grants = if asks.is_empty() {
            Vec::new()
        } else {
            let deadline = now + self.config.store_timeout;
            match tokio::time::timeout_at(deadline, self.quota.grant(&asks, deadline)).await {
                Ok(grants) => grants,
                Err(_) => asks
                    .iter()
                    .map(|_| Err(crate::store::StoreError::Timeout(self.config.store_timeout)))
                    .collect(),
            }
        }
        .into_iter()
        .collect::<Vec<_>>();
        if let Some(fallback) = &self.fallback
            && grants.iter().any(Result::is_err)
        {
            let deadline = Instant::now() + self.config.store_timeout;
            let local = fallback.grant(&asks, deadline).await;
            for (grant, local) in grants.iter_mut().zip(local) {
                if let Err(error) = grant {
                    self.failed_log(error, gateway);
                    *grant = local;
                }
            }
        }
        let mut grants = grants.into_iter();

        let mut actions = Vec::with_capacity(planned.len());
        let mut changes = Vec::with_capacity(planned.len());
        for (key, id, rule, ask) in planned {
            let previous = state.buckets.get(&key).and_then(|b| b.rule.clone());
            let sent_before = state.buckets.get(&key).and_then(|b| b.sent);
            let mut sent = None;
            let action = match (&rule, ask) {
                // Its rule is gone (a reload removed it): Envoy forgets the bucket.
                (None, _) if previous.is_some() => {
                    state.buckets.remove(&key);
                    self.count_kind("abandon");
                    actions.push(report::abandon(id));
                    changes.push((key, None));
                    continue;
                }
                (_, None) => {
                    self.count_kind("allow_all");
                    allow_all(id, ttl)
                }
                (_, Some(_)) => match grants.next() {
                    Some(Ok(Some(grant))) => {
                        self.count_kind("token_bucket");
                        let grant = report::steady(sent_before, grant);
                        sent = Some(grant);
                        token_bucket(id, grant, ttl)
                    }
                    Some(Ok(None)) => {
                        self.count_kind("deny_all");
                        deny_all(id, ttl)
                    }
                    Some(Err(error)) => self.failed(id, &error, gateway),
                    None => self.failed(
                        id,
                        &crate::store::StoreError::Protocol("fewer grants than asks".into()),
                        gateway,
                    ),
                },
            };
            changes.push((
                key.clone(),
                Some(report::describe(&key, rule.clone(), &action)),
            ));
            state
                .buckets
                .insert(key, report::BucketState { rule, sent });
            actions.push(action);
        }
        self.registry
            .record(&self.metrics, gateway, &domain, changes);
        Ok(report::response(actions))
    }

    fn count_kind(&self, kind: &str) {
        self.metrics
            .quota
            .assignments
            .get_or_create(&KindLabels { kind: kind.into() })
            .inc();
    }

    fn failed_log(&self, error: &crate::store::StoreError, gateway: u64) {
        self.metrics.quota.store_errors.inc();
        if let Some(skipped) = self.log.allow() {
            tracing::error!(gateway, %error, mode = ?self.config.failure_mode, similar_not_logged = skipped, "RLQS grant failed; the failure mode assigns");
        }
    }

    /// The failure mode's assignment when the quota store could not grant.
    fn failed(
        &self,
        id: crate::pb::rlqs::BucketId,
        error: &crate::store::StoreError,
        gateway: u64,
    ) -> crate::pb::rlqs::BucketAction {
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
