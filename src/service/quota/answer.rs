//! One usage report answered, step by step: the stream's pace and domain, the report's bounds,
//! each bucket planned to its rule, the buckets on one descriptor made one hold (`hold.rs`), the
//! holds asked of the quota store in one call (the failure mode, or this replica's own memory
//! under `local`, where it cannot answer), each share split among its buckets, and an action
//! built (`assign.rs`) and recorded per bucket: those reported, and the stream's other buckets
//! whose part changed. It must never answer part of a malformed report.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::hold::{self, Member};
use super::report::{self, BucketKey, allow_all, plan};
use super::{Inner, StreamState};
use crate::algorithm::share::Tokens;
use crate::pb::rlqs::{
    BucketId, BucketQuotaUsage, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use crate::store::StoreError;
use crate::store::quota::Ask;
use crate::telemetry::RuleLabels;

use super::bounds::Refusal;

/// One reported bucket, planned.
struct Planned {
    key: BucketKey,
    id: BucketId,
    rule: Option<String>,
    ask: Option<Ask>,
    /// What it admitted since the last report.
    allowed: u64,
    /// Its descriptor's rate limits (where its admissions are charged).
    layers: Vec<crate::algorithm::Check>,
}

/// Demand below a second of reporting is read over a second: Envoy's first report of a new
/// bucket comes at once, its time_elapsed near zero.
const MIN_ELAPSED_S: f64 = 1.0;

impl Inner {
    /// Answers one report, or says why the stream ends.
    pub(super) async fn answer(
        &self,
        report: RateLimitQuotaUsageReports,
        state: &mut StreamState,
        gateway: u64,
    ) -> Result<RateLimitQuotaResponse, Refusal> {
        // A replica's first grants on a shared store wait until every replica's RLS checks
        // count their claims (a few seconds after the first replica serving RLQS on a Redis
        // starts): the answer comes that much later, while the gateway keeps what it had; the
        // report is read, paced and charged after the wait, as if it came then. Past it, the
        // store refuses the grants (the failure mode assigns).
        let seen = Instant::now() + crate::store::quota::IN_USE_SEEN + self.config.store_timeout;
        let _ = self.quota.settled(seen).await;
        let now = self.pace(state).await;
        let domain = super::bounds::stream_domain(state, &report.domain)?;
        if let Some(last) = state.last_report {
            state.interval = state.interval.max(now.duration_since(last));
        }
        state.last_report = Some(now);
        let ttl = Duration::from_secs(2 * state.interval.as_secs_f64().ceil() as u64 + 1);
        let usages = self.bounded(&report, state)?;
        let mut planned = self.plan_all(&domain, usages, gateway, ttl);
        // A bucket new to the stream has shown no demand yet (Envoy reports it at its first
        // request): it is taken to want the whole rate, so that it gets an equal part at once
        // (the others are pushed their smaller ones); its next report says what it wants.
        for p in &mut planned {
            if let Some(ask) = p.ask.as_mut()
                && !state.buckets.contains_key(&p.key)
            {
                ask.demand = ask.demand.max(ask.capacity);
            }
        }
        let asks: Vec<Option<(Ask, &BucketKey)>> = planned
            .iter()
            .map(|p| p.ask.clone().map(|a| (a, &p.key)))
            .collect();
        let mut holds = hold::holds(&asks, &state.buckets);
        let demands = asks_demand(&asks);
        // Bounded as the buckets are (a reload may move a bucket to another descriptor).
        state.ttl = ttl;
        for h in &mut holds {
            let known = state.asks.contains_key(&h.ask.key);
            if !known {
                if state.asks.len() >= 2 * self.config.max_buckets_per_stream {
                    continue;
                }
                // A connection (or address) that churned streams on it is refused it (`churn`);
                // the hold taken there is released with the stream's asks, or here when refused.
                let now = Instant::now();
                if !self.churn.hold(state.peer, &h.ask.key, now) {
                    h.refused = true;
                    h.churned = true;
                    continue;
                }
                // Kept in the push registry only with its ask: the stream's end releases both.
                if !self.pushes.hold(state.stream, &h.ask.key) {
                    self.churn.release(state.peer, &h.ask.key, None, false, now);
                    h.refused = true;
                    continue;
                }
            }
            state.asks.insert(h.ask.key.clone(), h.ask.clone());
        }
        // What the gateway admitted goes into the rule's counters first: its claim starts
        // again only for the holds whose admissions are in.
        let now_us = super::charge::wall_us();
        let allowed: Vec<u64> = planned.iter().map(|p| p.allowed).collect();
        let layers: Vec<&[crate::algorithm::Check]> =
            planned.iter().map(|p| p.layers.as_slice()).collect();
        let ttl_us = u64::try_from(ttl.as_micros()).unwrap_or(u64::MAX);
        let charged = self
            .charge(&holds, &allowed, &layers, &state.granted, now_us, ttl_us)
            .await;
        for (h, c) in holds.iter_mut().zip(charged) {
            h.ask.charged = c.charged;
            h.ask.rooms = c.rooms;
            h.ask.counters = c.counters;
        }
        let grants = self.grant_unless_refused(&holds, gateway).await;
        let ends_us = now_us.saturating_add(ttl_us);

        // Each reported bucket's part (or why there is none); quiet buckets' new parts.
        let mut parts: Vec<Option<Result<Option<Tokens>, StoreError>>> =
            (0..planned.len()).map(|_| None).collect();
        let mut quiet = Vec::new();
        for (h, grant) in holds.iter().zip(grants) {
            let span = self.burst_span(h.ask.shortest_us);
            if let Ok(tokens) = &grant {
                let last = state.granted.get(&h.ask.key).copied();
                let now = super::charge::after_grant(
                    last,
                    *tokens,
                    h.members.len(),
                    span,
                    h.ask.charged,
                    now_us,
                    ends_us,
                );
                state.granted.insert(h.ask.key.clone(), now);
                let first = h.members.iter().find_map(|(m, _)| match m {
                    Member::Reported(i) => Some(*i),
                    Member::Quiet(_) => None,
                });
                if let Some(i) = first {
                    state
                        .layers
                        .insert(h.ask.key.clone(), planned[i].layers.clone());
                }
            }
            let demands: Vec<f64> = h.members.iter().map(|m| m.1).collect();
            let split = grant.map(|g| hold::split(g, &demands));
            for (j, (member, _)) in h.members.iter().enumerate() {
                let part = split.as_ref().map(|s| s[j]).map_err(Clone::clone);
                match member {
                    Member::Reported(i) => parts[*i] = Some(part),
                    // A quiet bucket keeps what it has when the store could not answer.
                    Member::Quiet(key) => {
                        if let Ok(part) = part {
                            quiet.push((key.clone(), part, span));
                        }
                    }
                }
            }
        }

        let mut actions = Vec::with_capacity(planned.len() + quiet.len());
        let mut changes = Vec::with_capacity(actions.capacity());
        for ((p, part), demand) in planned.into_iter().zip(parts).zip(demands) {
            let before = state.buckets.get(&p.key);
            let previous = before.and_then(|b| b.rule.clone());
            let sent_before = before.and_then(|b| b.sent);
            // Its rule is gone (a reload removed it): Envoy forgets the bucket.
            if p.rule.is_none() && previous.is_some() {
                state.buckets.remove(&p.key);
                let bytes = super::bounds::key_bytes(&p.key);
                state.bucket_bytes -= bytes;
                self.bucket_bytes.fetch_sub(bytes, Ordering::Relaxed);
                self.count_kind("abandon");
                actions.push(report::abandon(p.id));
                changes.push((p.key, None));
                continue;
            }
            let counter = p.ask.as_ref().map(|a| a.key.clone());
            let (action, sent) = match part {
                None => {
                    self.count_kind("allow_all");
                    (allow_all(p.id, ttl), None)
                }
                Some(Ok(part)) => {
                    let span = self.burst_span(p.ask.as_ref().map_or(0, |a| a.shortest_us));
                    self.assign(p.id, sent_before, part, span, ttl)
                }
                Some(Err(error)) => (self.failed(p.id, &error, gateway), None),
            };
            changes.push((
                p.key.clone(),
                Some(report::describe(&p.key, p.rule.clone(), &action)),
            ));
            let bucket = report::BucketState {
                rule: p.rule,
                sent,
                counter,
                demand,
            };
            state.buckets.insert(p.key, bucket);
            actions.push(action);
        }
        // The stream's other buckets on a hold: sent their new part when it shrank (their
        // buckets together must stay within the share) or grew past what `steady` keeps.
        for (key, part, span) in quiet {
            if let Some((action, change)) = self.requote(state, key, part, span, ttl) {
                changes.push(change);
                actions.push(action);
            }
        }
        self.registry
            .record(&self.metrics, state.stream, &domain, changes);
        Ok(report::response(actions))
    }

    /// Each bucket to its rule and ask; what the gateway reported counted per rule.
    fn plan_all(
        &self,
        domain: &str,
        usages: Vec<(BucketKey, &BucketQuotaUsage)>,
        gateway: u64,
        ttl: Duration,
    ) -> Vec<Planned> {
        let snapshot = self.rules.load_full();
        let mut planned = Vec::with_capacity(usages.len());
        for (key, usage) in usages {
            let seen = usage
                .num_requests_allowed
                .saturating_add(usage.num_requests_denied);
            // The gateway's own measure of the time the counts cover (gRPC's clients and
            // Envoy after 1.40 report at their own intervals, to the nanosecond).
            let elapsed = usage.time_elapsed.map_or(0.0, |d| {
                d.seconds.max(0) as f64 + f64::from(d.nanos.max(0)) / 1e9
            });
            let demand = seen as f64 / elapsed.max(MIN_ELAPSED_S);
            let bucket = plan(&self.decider, &snapshot, domain, &key, gateway, demand, ttl);
            if let Some(rule) = &bucket.rule {
                let labels = RuleLabels {
                    domain: domain.to_owned(),
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
            planned.push(Planned {
                key,
                id,
                rule: bucket.rule,
                ask: bucket.ask,
                allowed: usage.num_requests_allowed,
                layers: bucket.layers,
            });
        }
        planned
    }

    /// The holds' grants, in their order; a refused hold (this replica's streams hold their
    /// part of its descriptor's holder slots) is granted nothing and not asked of the store.
    async fn grant_unless_refused(
        &self,
        holds: &[hold::Hold],
        gateway: u64,
    ) -> Vec<Result<Option<Tokens>, StoreError>> {
        let churned = holds.iter().filter(|h| h.churned).count();
        if churned > 0 {
            self.metrics
                .quota
                .churned_holds_refused
                .inc_by(churned as u64);
            if let Some(skipped) = self.log.allow() {
                tracing::warn!(
                    gateway,
                    refused = churned,
                    most = super::churn::MOST_ENDED_PER_CONNECTION,
                    similar_not_logged = skipped,
                    "RLQS holds refused: this connection (or its address, with streams that \
                     ended quickly) has opened and ended streams holding these descriptors until \
                     as many claims as one connection may stand there; its buckets on them are \
                     denied until those claims end"
                );
            }
        }
        let count = holds.iter().filter(|h| h.refused && !h.churned).count();
        if count > 0 {
            self.metrics.quota.holds_refused.inc_by(count as u64);
        }
        if count > 0
            && let Some(skipped) = self.log.allow()
        {
            tracing::warn!(
                gateway,
                refused = count,
                most = super::push::MAX_STREAMS_PER_DESCRIPTOR,
                similar_not_logged = skipped,
                "RLQS holds refused: this replica's streams hold as many of a descriptor's holder \
                 slots as one replica may; those buckets are denied until a stream leaves"
            );
        }
        let asks: Vec<Ask> = holds
            .iter()
            .filter(|h| !h.refused)
            .map(|h| h.ask.clone())
            .collect();
        let mut granted = self.grant(asks, gateway).await.into_iter();
        holds
            .iter()
            .map(|h| {
                if h.refused {
                    Ok(None)
                } else {
                    granted.next().unwrap_or(Ok(None))
                }
            })
            .collect()
    }

    /// The holds' grants, in their order: from the store within `--rlqs-store-timeout`, and
    /// under `local` from this replica's memory where the store could not answer.
    async fn grant(&self, asks: Vec<Ask>, gateway: u64) -> Vec<Result<Option<Tokens>, StoreError>> {
        if asks.is_empty() {
            return Vec::new();
        }
        // The wait for the store, from when it is asked: a report of 10,000 buckets spends a
        // few hundred milliseconds of a debug build being planned, which is not the store's.
        let deadline = Instant::now() + self.config.store_timeout;
        let mut grants =
            match tokio::time::timeout_at(deadline, self.quota.grant(&asks, deadline)).await {
                Ok(grants) => grants,
                Err(_) => asks
                    .iter()
                    .map(|_| Err(StoreError::Timeout(self.config.store_timeout)))
                    .collect(),
            };
        if grants.len() != asks.len() {
            let error = StoreError::Protocol("fewer grants than asks".into());
            grants = asks.iter().map(|_| Err(error.clone())).collect();
        }
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
        grants
    }
}

/// The demand each reported bucket asked with (0 where it asked nothing).
fn asks_demand(asks: &[Option<(Ask, &BucketKey)>]) -> Vec<f64> {
    asks.iter()
        .map(|a| a.as_ref().map_or(0.0, |(a, _)| a.demand))
        .collect()
}
