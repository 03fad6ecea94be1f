//! Counters sent to a statsd server under envoyproxy/ratelimit's stat names, for dashboards built
//! on its statsd output: every flush interval, what each counter grew by since the last flush.
//! UDP, fire and forget: a missing statsd server never slows a call, and a failed send is logged
//! (at most once a second), never retried. Tags (`--statsd-tag`, Go's EXTRA_TAGS) go into the
//! name as Go's statsd library writes them, or as DogStatsD tags.

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

/// Where the statsd counters go and how they are tagged.
pub struct StatsdConfig {
    pub addr: String,
    pub interval: Duration,
    /// Tags on every counter, as `--statsd-tag` gives them.
    pub tags: Vec<(String, String)>,
    /// Tags the DogStatsD way (`|#k:v`) rather than in the name.
    pub dogstatsd: bool,
}

/// The tags as envoyproxy/ratelimit's statsd library (gostats) keeps them: sorted by key, `.`,
/// `:` and `|` in a value replaced by `_` (its DogStatsD sink sends the same pairs).
pub fn go_tags(tags: &[(String, String)]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = tags
        .iter()
        .map(|(key, value)| {
            let value = value
                .chars()
                .map(|c| if matches!(c, '.' | ':' | '|') { '_' } else { c })
                .collect();
            (key.clone(), value)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// The tags in the name, as gostats writes them: `NAME.__KEY=VALUE...` (`tags` from `go_tags`).
pub fn tagged_name(name: &str, tags: &[(String, String)]) -> String {
    let mut out = name.to_owned();
    for (key, value) in tags {
        out.push_str(".__");
        out.push_str(key);
        out.push('=');
        out.push_str(value);
    }
    out
}

pub fn spawn(
    config: StatsdConfig,
    metrics: Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let StatsdConfig {
        addr,
        interval,
        tags,
        dogstatsd,
    } = config;
    let tags = go_tags(&tags);
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
                let counted = if dogstatsd {
                    let mut metric = client.count_with_tags(&name, delta as i64);
                    for (key, value) in &tags {
                        metric = metric.with_tag(key, value);
                    }
                    metric.try_send().map(|_| ())
                } else if tags.is_empty() {
                    client.count(&name, delta as i64).map(|_| ())
                } else {
                    client
                        .count(&tagged_name(&name, &tags), delta as i64)
                        .map(|_| ())
                };
                match counted {
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
