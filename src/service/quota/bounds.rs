//! A stream's bounds, checked before a report is planned: reports per second (paced), one
//! domain per stream, buckets per stream, and the bytes of bucket ids per stream and for all
//! streams of the replica. It must never accept part of a report past a bound: the stream is
//! closed naming the bound, and nothing of that report is recorded.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;
use tonic::Status;

use super::report::{BucketKey, bucket_key};
use super::{Inner, StreamState};
use crate::pb::rlqs::{BucketQuotaUsage, RateLimitQuotaUsageReports};

pub(super) type Refusal = (&'static str, Status);

impl Inner {
    /// Past the reports a stream may send in a second, the next waits for the next second:
    /// Envoy sends one at once for every new bucket, so a burst of new tenants is paced, not
    /// refused (unread reports wait in HTTP/2 flow control, not in memory here).
    pub(super) async fn pace(&self, state: &mut StreamState) -> Instant {
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
        now
    }

    /// The report's buckets, each checked, within the stream's bound.
    pub(super) fn bounded<'r>(
        &self,
        report: &'r RateLimitQuotaUsageReports,
        state: &mut StreamState,
    ) -> Result<Vec<(BucketKey, &'r BucketQuotaUsage)>, Refusal> {
        let mut keyed = Vec::with_capacity(report.bucket_quota_usages.len());
        for usage in &report.bucket_quota_usages {
            let key = bucket_key(usage, &self.config).map_err(|s| ("malformed", s))?;
            keyed.push((key, usage));
        }
        let mut seen = std::collections::HashSet::new();
        let new: Vec<&BucketKey> = keyed
            .iter()
            .map(|(k, _)| k)
            .filter(|k| !state.buckets.contains_key(*k) && seen.insert(*k))
            .collect();
        if state.buckets.len() + new.len() > self.config.max_buckets_per_stream {
            return Err((
                "too_many_buckets",
                Status::resource_exhausted(format!(
                    "more than {} buckets on one stream",
                    self.config.max_buckets_per_stream
                )),
            ));
        }
        let bytes: usize = new.iter().map(|k| key_bytes(k)).sum();
        if state.bucket_bytes + bytes > self.config.max_bucket_bytes_per_stream {
            return Err((
                "too_many_bucket_bytes",
                Status::resource_exhausted(format!(
                    "more than {} bytes of bucket ids on one stream",
                    self.config.max_bucket_bytes_per_stream
                )),
            ));
        }
        if bytes > 0 {
            let all = &self.bucket_bytes;
            let taken = all.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
                (held + bytes <= self.config.max_bucket_bytes).then_some(held + bytes)
            });
            if taken.is_err() {
                return Err((
                    "too_many_bucket_bytes",
                    Status::resource_exhausted(format!(
                        "this replica's streams hold {} bytes of bucket ids already",
                        self.config.max_bucket_bytes
                    )),
                ));
            }
            state.bucket_bytes += bytes;
        }
        Ok(keyed)
    }
}

/// The bytes a bucket id holds (its keys and values).
pub(super) fn key_bytes(key: &BucketKey) -> usize {
    key.iter().map(|(k, v)| k.len() + v.len()).sum()
}

/// The stream's domain: named by its first report, the same (or none) in every later one.
pub(super) fn stream_domain(state: &mut StreamState, named: &str) -> Result<String, Refusal> {
    match (&state.domain, named) {
        (None, "") => Err((
            "malformed",
            Status::invalid_argument("the first report of a stream must name its domain"),
        )),
        (None, d) => {
            state.domain = Some(d.to_owned());
            Ok(d.to_owned())
        }
        (Some(d), "") => Ok(d.clone()),
        (Some(d), other) if d == other => Ok(d.clone()),
        (Some(d), other) => Err((
            "malformed",
            Status::invalid_argument(format!(
                "the stream's domain is {d:?}; a report names {other:?} (one stream, one domain)"
            )),
        )),
    }
}
