//! Grants pushed between reports. When a gateway finds itself short of its fair share (others
//! hold it), the quota store marks the descriptor contested; every replica reads the contested
//! descriptors twice a second and tells its streams holding one to re-ask at once, so that
//! those which must shrink are sent their smaller grant (the stream is bidirectional), and the
//! short one grows into it, within about a second instead of at their next reports (Envoy 1.40
//! reports every 5 s). It must never block a stream, and never grow without bound: a stream's
//! mailbox is small and a full one skips the round (the next round asks again).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::hold;
use super::report::{self, BucketKey};
use crate::pb::rlqs::RateLimitQuotaResponse;
use crate::store::quota::{Ask, QuotaStore};

/// How often the contested descriptors are read, by default (`--rlqs-push-interval`).
pub const EVERY: Duration = Duration::from_millis(500);

/// Re-asks a stream may have waiting.
pub const MAILBOX: usize = 16;

/// The most of this replica's streams that hold one descriptor: a quarter of the slots the store
/// keeps per descriptor (`algorithm::share::MAX_HOLDERS`), so that one replica's streams never
/// take them all from the gateways of the others.
pub const MAX_STREAMS_PER_DESCRIPTOR: usize = crate::algorithm::share::MAX_HOLDERS / 4;

#[derive(Default)]
struct Inner {
    /// Descriptor → the streams holding part of it.
    holders: HashMap<String, HashSet<u64>>,
    /// Stream → its mailbox.
    mailboxes: HashMap<u64, mpsc::Sender<String>>,
}

/// This replica's streams by the descriptors they hold.
#[derive(Default)]
pub struct Pushes {
    inner: Mutex<Inner>,
}

impl Pushes {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new stream's mailbox.
    pub fn open(&self, stream: u64) -> mpsc::Receiver<String> {
        let (tx, rx) = mpsc::channel(MAILBOX);
        self.lock().mailboxes.insert(stream, tx);
        rx
    }

    /// `stream` holds part of `key`; false (and nothing kept) when `MAX_STREAMS_PER_DESCRIPTOR`
    /// other streams of this replica hold it already.
    pub fn hold(&self, stream: u64, key: &str) -> bool {
        let mut inner = self.lock();
        match inner.holders.get_mut(key) {
            Some(streams) => {
                if !streams.contains(&stream) && streams.len() >= MAX_STREAMS_PER_DESCRIPTOR {
                    return false;
                }
                streams.insert(stream);
            }
            None => {
                inner
                    .holders
                    .insert(key.to_owned(), HashSet::from([stream]));
            }
        }
        true
    }

    /// The stream ended: it holds nothing any more.
    pub fn close<'k>(&self, stream: u64, keys: impl Iterator<Item = &'k String>) {
        let mut inner = self.lock();
        inner.mailboxes.remove(&stream);
        for key in keys {
            if let Some(streams) = inner.holders.get_mut(key) {
                streams.remove(&stream);
                if streams.is_empty() {
                    inner.holders.remove(key);
                }
            }
        }
    }

    /// Tells each stream holding one of `contested` to re-ask it. Returns how many were told.
    pub fn notify(&self, contested: &[String]) -> usize {
        let inner = self.lock();
        let mut told = 0;
        for key in contested {
            let Some(streams) = inner.holders.get(key) else {
                continue;
            };
            for stream in streams {
                if let Some(mailbox) = inner.mailboxes.get(stream)
                    && mailbox.try_send(key.clone()).is_ok()
                {
                    told += 1;
                }
            }
        }
        told
    }
}

/// Reads the contested descriptors every `every` until `stopped`, telling the streams. A failed
/// read is logged (throttled) and counted: the streams shrink at their next report instead.
pub fn spawn(
    pushes: Arc<Pushes>,
    quota: Arc<dyn QuotaStore>,
    every: Duration,
    metrics: Arc<crate::telemetry::Metrics>,
    mut stopped: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let log = crate::telemetry::LogThrottle::default();
        let mut ticker = tokio::time::interval(every);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = stopped.wait_for(|s| *s) => return,
            }
            if pushes.lock().holders.is_empty() {
                continue;
            }
            match quota.contested(Instant::now() + every).await {
                Ok(contested) if !contested.is_empty() => {
                    pushes.notify(&contested);
                }
                Ok(_) => {}
                Err(error) => {
                    metrics.quota.push_errors.inc();
                    if let Some(skipped) = log.allow() {
                        tracing::warn!(%error, similar_not_logged = skipped, "RLQS contested descriptors not read: no pushes this round");
                    }
                }
            }
        }
    })
}

impl super::Inner {
    /// Re-asks the stream's hold on `key` with its buckets' last demands (a push round found it
    /// contested), and returns the actions for the buckets whose part changed, if any. The
    /// store failing changes nothing: the buckets keep what they have until the next report.
    pub(super) async fn reassess(
        &self,
        key: &str,
        state: &mut super::StreamState,
        gateway: u64,
    ) -> Option<RateLimitQuotaResponse> {
        let ask = state.asks.get(key)?;
        let members: Vec<(BucketKey, f64)> = state
            .buckets
            .iter()
            .filter(|(_, b)| b.counter.as_deref() == Some(key))
            .map(|(k, b)| (k.clone(), b.demand))
            .collect();
        if members.is_empty() {
            return None;
        }
        // Nothing charged: the stream's claim keeps its start (`charge::after_grant`).
        let ask = Ask {
            demand: members.iter().map(|m| m.1).sum(),
            charged: false,
            ..ask.clone()
        };
        let deadline = Instant::now() + self.config.store_timeout;
        let span = self.burst_span(ask.shortest_us);
        let asks = [ask];
        let answer = tokio::time::timeout_at(deadline, self.quota.grant(&asks, deadline)).await;
        let grant = match answer.ok()?.into_iter().next()? {
            Ok(grant) => grant,
            Err(error) => {
                tracing::debug!(gateway, %error, "RLQS push not granted; the next report asks");
                return None;
            }
        };
        let ttl = state.ttl;
        let now_us = super::charge::wall_us();
        let ends_us = now_us.saturating_add(u64::try_from(ttl.as_micros()).unwrap_or(0));
        let last = state.granted.get(key).copied();
        state.granted.insert(
            key.to_owned(),
            super::charge::after_grant(last, grant, members.len(), span, false, now_us, ends_us),
        );
        let demands: Vec<f64> = members.iter().map(|m| m.1).collect();
        let parts = hold::split(grant, &demands);
        let mut actions = Vec::new();
        let mut changes = Vec::new();
        for ((bucket, _), part) in members.into_iter().zip(parts) {
            if let Some((action, change)) = self.requote(state, bucket, part, span, ttl) {
                actions.push(action);
                changes.push(change);
            }
        }
        if actions.is_empty() {
            return None;
        }
        self.metrics.quota.pushes.inc();
        if let Some(domain) = state.domain.clone() {
            self.registry
                .record(&self.metrics, state.stream, &domain, changes);
        }
        Some(report::response(actions))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_holding_a_contested_descriptor_are_told_and_closed_ones_forgotten() {
        let pushes = Pushes::default();
        let mut one = pushes.open(1);
        let mut two = pushes.open(2);
        pushes.hold(1, "{edge|tenant=a}");
        pushes.hold(2, "{edge|tenant=a}");
        pushes.hold(2, "{edge|tenant=b}");
        assert_eq!(pushes.notify(&["{edge|tenant=b}".into()]), 1);
        assert_eq!(two.try_recv().unwrap(), "{edge|tenant=b}");
        assert!(one.try_recv().is_err());
        pushes.close(
            2,
            ["{edge|tenant=a}".to_owned(), "{edge|tenant=b}".to_owned()].iter(),
        );
        assert_eq!(pushes.notify(&["{edge|tenant=a}".into()]), 1);
        assert_eq!(one.try_recv().unwrap(), "{edge|tenant=a}");
        assert!(!pushes.lock().holders.contains_key("{edge|tenant=b}"));
        // A full mailbox skips the round instead of growing.
        for _ in 0..MAILBOX + 5 {
            pushes.notify(&["{edge|tenant=a}".into()]);
        }
        let mut waiting = 0;
        while one.try_recv().is_ok() {
            waiting += 1;
        }
        assert_eq!(waiting, MAILBOX);
    }
}
