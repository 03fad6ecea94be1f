//! Ended streams' claims folded into the rule's counters (issue 43 item 3). An unnamed stream's
//! holder stays in its descriptor's holder table after the stream ends, claiming what its last
//! assignment may still admit, and was kept a whole window after its end (an hour's rule: an
//! hour): gateways that reconnect (a connection age, a drain) filled a long rule's 1,024 holder
//! slots, and every RLS check read each record. Once the last assignment has ended, what the
//! holder claims is charged into the rule's counters as post-paid hits (what every check counted
//! of it, no more) and its record goes: the counters are the summary of ended claims. It must
//! never drop a record before its claim is in the counters (a failed charge leaves the record to
//! its keep), nor fold a named gateway's (its next stream takes it over); folds pending on a
//! replica are bounded.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::Inner;
use super::charge::{Granted, in_window_from, post_paid, wall_us, window_start};
use crate::algorithm::claims::{self, Claim};
use crate::algorithm::{Algorithm, Check};
use crate::store::quota::{Ask, AskKind};
use crate::telemetry::KindLabels;

/// Folds pending on one replica at most; past it an ended stream's records stand to their keep.
pub(super) const MAX_PENDING: usize = 4096;

/// How long after an assignment's end (this host's clock) its claim is folded: the store's
/// clock may be a little behind, and a record whose grant has not ended there is kept.
const MARGIN: Duration = Duration::from_secs(1);

/// One descriptor an ended stream held: its claim and the rule's layers.
pub(super) struct Held {
    pub key: String,
    pub granted: Granted,
    pub layers: Vec<Check>,
}

/// What an ended stream held: each descriptor it was granted a part of, with its claim and
/// its rule's layers.
pub(super) fn held(state: &super::StreamState) -> Vec<Held> {
    state
        .granted
        .iter()
        .filter(|(_, g)| g.rate > 0.0)
        .filter_map(|(key, g)| {
            Some(Held {
                key: key.clone(),
                granted: *g,
                layers: state.layers.get(key)?.clone(),
            })
        })
        .collect()
}

impl Inner {
    /// Folds `held` (an unnamed stream's holds, `gateway` its holder) once their assignments
    /// have ended; nothing when too many folds are pending.
    pub(super) fn fold_later(self: &Arc<Self>, gateway: u64, held: Vec<Held>) {
        if held.is_empty() {
            return;
        }
        let Ok(permit) = self.folds.clone().try_acquire_owned() else {
            self.count_fold("skipped", held.len());
            return;
        };
        let ends_us = held.iter().map(|h| h.granted.ends_us).max().unwrap_or(0);
        let inner = self.clone();
        tokio::spawn(async move {
            let wait = Duration::from_micros(ends_us.saturating_sub(wall_us())) + MARGIN;
            tokio::time::sleep(wait).await;
            inner.fold(gateway, &held).await;
            drop(permit);
        });
    }

    /// Charges what `held`'s claims claim of each layer now, then forgets their records.
    async fn fold(&self, gateway: u64, held: &[Held]) {
        // Where the store's fixed windows began: a claim is charged into the one the store
        // counts it in.
        let looks: Vec<Check> = held
            .iter()
            .flat_map(|h| &h.layers)
            .filter(|l| l.limit.algorithm == Algorithm::FixedWindow)
            .map(|l| Check {
                hits: 0,
                refund: false,
                post_paid: false,
                ..l.clone()
            })
            .collect();
        let sent_us = wall_us();
        let Some(found) = self.in_calls(&looks).await else {
            return self.fold_failed(gateway, held, "its fixed windows could not be read");
        };
        let starts: HashMap<&str, u64> = looks
            .iter()
            .zip(&found)
            .filter_map(|(l, d)| Some((l.key.as_str(), window_start(l, d, sent_us)?)))
            .collect();
        let now_us = wall_us();
        let charges: Vec<Check> = held
            .iter()
            .flat_map(|h| {
                let claim = Claim {
                    rate: h.granted.rate,
                    since_us: h.granted.since_us,
                    ends_us: h.granted.ends_us,
                };
                let starts = &starts;
                h.layers.iter().filter_map(move |layer| {
                    let claimed = match starts.get(layer.key.as_str()) {
                        Some(&start) => in_window_from(&claim, start, now_us),
                        None => claims::claimed(&[claim], &layer.limit, now_us),
                    };
                    post_paid(layer, claimed)
                })
            })
            .collect();
        match self.in_calls(&charges).await {
            Some(d) if d.iter().all(|d| !d.by_failure_mode) => {}
            _ => return self.fold_failed(gateway, held, "its claims could not be charged"),
        }
        let asks: Vec<Ask> = held
            .iter()
            .map(|h| Ask::ended(&h.key, gateway, AskKind::Forget))
            .collect();
        let deadline = Instant::now() + self.config.store_timeout;
        match tokio::time::timeout_at(deadline, self.quota.grant(&asks, deadline)).await {
            Ok(answers) if answers.iter().all(Result::is_ok) => {
                self.count_fold("folded", held.len());
            }
            _ => self.fold_failed(gateway, held, "its records could not be dropped"),
        }
    }

    fn fold_failed(&self, gateway: u64, held: &[Held], why: &str) {
        self.count_fold("failed", held.len());
        if let Some(skipped) = self.log.allow() {
            tracing::warn!(
                gateway,
                descriptors = held.len(),
                similar_not_logged = skipped,
                "RLQS: an ended stream's claims were not folded into the counters ({why}); its \
                 records stand until the rule's window after their grants"
            );
        }
    }

    fn count_fold(&self, kind: &str, n: usize) {
        self.metrics
            .quota
            .folds
            .get_or_create(&KindLabels { kind: kind.into() })
            .inc_by(n as u64);
    }
}
