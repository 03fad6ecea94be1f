//! Counters sent to a statsd server under envoyproxy/ratelimit's stat names, for dashboards built
//! on its statsd output: every flush interval, what each counter grew by since the last flush.
//! UDP, fire and forget: a missing statsd server never slows a call, and a failed send is logged
//! (at most once a second), never retried.

use std::collections::BTreeMap;
use std::net::UdpSocket;
use std::sync::Arc;
use std::time::Duration;

use cadence::{Counted, StatsdClient, UdpMetricSink};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::telemetry::{LogThrottle, Metrics, go_names};

fn client(addr: &str) -> std::io::Result<StatsdClient> {
    let socket = UdpSocket::bind("0.0.0.0:0")?;
    socket.set_nonblocking(true)?;
    let sink = UdpMetricSink::from(addr, socket).map_err(std::io::Error::other)?;
    Ok(StatsdClient::from_sink("", sink))
}

pub fn spawn(
    addr: String,
    interval: Duration,
    metrics: Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let log = LogThrottle::default();
        let mut sent: BTreeMap<String, u64> = BTreeMap::new();
        let mut statsd = None;
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = stop.wait_for(|s| *s) => break,
            }
            if statsd.is_none() {
                // The address is resolved here and again after a failure (DNS may come later).
                match client(&addr) {
                    Ok(c) => statsd = Some(c),
                    Err(error) => {
                        if log.allow().is_some() {
                            tracing::warn!(%addr, %error, "statsd: cannot reach the server");
                        }
                        continue;
                    }
                }
            }
            let Some(client) = &statsd else { continue };
            for (name, value) in go_names::statsd_counters(&metrics) {
                let before = sent.get(&name).copied().unwrap_or(0);
                let delta = value.saturating_sub(before);
                if delta == 0 {
                    continue;
                }
                match client.count(&name, delta as i64) {
                    Ok(_) => {
                        sent.insert(name, value);
                    }
                    Err(error) => {
                        if log.allow().is_some() {
                            tracing::warn!(%addr, %error, "statsd: send failed");
                        }
                    }
                }
            }
        }
    })
}
