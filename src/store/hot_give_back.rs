//! What a replica's claims leave unspent goes back to the counter: a quiet counter's, every
//! `SWEEP`, and every claim at shutdown; a window's only within the period it was counted in.
//! It must never give back into a period other than the one the claim was counted in.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::{Chunk, HotStore, Shared, refund_of};
use crate::algorithm::{Algorithm, ChargeMode, Check};

/// How often unspent claims of quiet counters are given back and idle counters forgotten.
const SWEEP: Duration = Duration::from_millis(100);
/// A counter without a call for this long gives its claim back.
pub(super) const QUIET_US: u64 = 100_000;
/// A counter without a call (and without a claim) for this long is forgotten.
const FORGET_US: u64 = 1_000_000;

impl HotStore {
    /// Gives back the claims of counters gone quiet every `SWEEP`, and closes the store once
    /// `stopped` turns true (shutdown, after a drain): every claim given back.
    pub fn spawn_sweeper(
        &self,
        mut stopped: tokio::sync::watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<()> {
        let shared = self.shared.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(SWEEP);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let stop = tokio::select! {
                    _ = tick.tick() => false,
                    _ = stopped.wait_for(|s| *s) => true,
                };
                if stop {
                    shared.close().await;
                    return;
                }
                shared.sweep(false).await;
            }
        })
    }

    /// What a stop does (`Shared::close`): every call to the store from now on, every claim
    /// given back.
    pub async fn close(&self) {
        self.shared.close().await;
    }

    /// One sweep now (`all`: every claim given back).
    pub async fn sweep(&self, all: bool) {
        self.shared.sweep(all).await;
    }
}

impl Shared {
    /// The replica stops: from now on every call goes to the store, every unspent claim is
    /// given back, and the takes still on their way give themselves back as they land (waited
    /// for, at most a store deadline and a half), so that the counters hold exactly what this
    /// replica admitted.
    async fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.sweep(true).await;
        let landed = async {
            loop {
                let settled = self.settled.notified();
                if self.takes_in_flight.load(Ordering::Acquire) == 0 {
                    return;
                }
                settled.await;
            }
        };
        let _ = tokio::time::timeout(self.config.store_timeout * 3 / 2, landed).await;
    }

    /// Gives back the unspent claims of counters gone quiet (`all`: every claim), and forgets
    /// counters idle long enough.
    async fn sweep(&self, all: bool) {
        let now = self.clock.now_us();
        let mut back: Vec<(Check, Chunk)> = Vec::new();
        let mut lapsed = 0;
        {
            let mut claims = self.lock();
            claims.retain(|key, claim| {
                lapsed += claim.expire(now);
                let idle = now.saturating_sub(claim.last_seen_us);
                if all || idle >= QUIET_US {
                    for chunk in claim.take_unspent() {
                        back.push((refund_of(key, claim, chunk.hits), chunk));
                    }
                }
                !(claim.is_empty() && idle >= FORGET_US)
            });
            self.metrics.descriptors.set(claims.len() as i64);
        }
        if lapsed > 0 {
            self.metrics.lapsed_hits.inc_by(lapsed);
        }
        for (refund, chunk) in back {
            self.give_back(refund, chunk).await;
        }
    }

    /// Gives one unspent chunk back: a window's only within the period it was counted in (not
    /// sent once it is over; `Store::give_back` does not apply one that arrives after), a
    /// bucket's at any time.
    pub(super) async fn give_back(&self, refund: Check, chunk: Chunk) {
        let hits = refund.hits;
        let now = self.clock.now_us();
        let windowed = refund.limit.algorithm != Algorithm::TokenBucket;
        if windowed && now >= chunk.until_us {
            // Its period is over (the give-back waited): a refund now would credit the next.
            self.metrics.lapsed_hits.inc_by(hits);
            return;
        }
        let refunds = std::slice::from_ref(&refund);
        let answers = if !windowed {
            let deadline = Instant::now() + self.config.store_timeout;
            self.inner
                .check(refunds, deadline, ChargeMode::EachAlone)
                .await
        } else {
            let ends = Instant::now() + Duration::from_micros(chunk.until_us.saturating_sub(now));
            self.inner.give_back(refunds, ends).await
        };
        match answers.first() {
            Some(Ok(_)) => self.metrics.given_back_hits.inc_by(hits),
            _ => self.metrics.lapsed_hits.inc_by(hits),
        };
    }
}
