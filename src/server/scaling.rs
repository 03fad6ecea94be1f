//! Runtime scaling kept current: the scaling file watched like the rules (same polling, the bytes
//! fingerprinted are the bytes parsed, a broken file refused as a whole), and the store's
//! temporary factors read back every reload interval. Both land in the one `ArcSwap<Scaling>`
//! the decider reads. It must never leave a half-read file in force.

use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::task::JoinHandle;

use super::watch::{Refusal, Watched};
use crate::limiter::Limiter;
use crate::rules::Snapshot;
use crate::rules::scaling::{self, Scaling, Scope};
use crate::service::scaling::{ScalingHandle, publish, refresh};
use crate::telemetry::{Metrics, ResultLabels};

pub struct ScalingFileWatch {
    pub path: PathBuf,
    pub handle: Arc<ScalingHandle>,
    pub rules: Arc<ArcSwap<Snapshot>>,
    pub metrics: Arc<Metrics>,
}

/// What the scaling file parses to: its factors, or why it cannot apply.
type Parsed = Result<BTreeMap<Scope, f64>, String>;

/// Reads the scaling file once: a fingerprint of the bytes read, and what those bytes parse to.
fn read_and_parse(path: &PathBuf) -> Result<(u64, Parsed), String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut hasher = DefaultHasher::new();
    bytes.hash(&mut hasher);
    let parsed = String::from_utf8(bytes)
        .map_err(|e| format!("{}: {e}", path.display()))
        .and_then(|text| scaling::parse_file(path, &text));
    Ok((hasher.finish(), parsed))
}

/// Reads and parses the scaling file at start-up: its fingerprint and factors.
pub fn read_file(path: &PathBuf) -> Result<(u64, BTreeMap<Scope, f64>), String> {
    let (fingerprint, parsed) = read_and_parse(path)?;
    Ok((fingerprint, parsed?))
}

impl Watched for ScalingFileWatch {
    type Content = Parsed;

    fn what(&self) -> String {
        format!("scaling file {}", self.path.display())
    }

    fn read(&self) -> Result<(u64, Self::Content), String> {
        read_and_parse(&self.path)
    }

    fn apply(&self, content: Self::Content) -> Result<String, Refusal> {
        let count = |result: &str| {
            self.metrics
                .scaling_reloads
                .get_or_create(&ResultLabels {
                    result: result.into(),
                })
                .inc();
        };
        let file = content.map_err(|e| {
            count("error");
            Refusal::Invalid(e)
        })?;
        count("success");
        let count = file.len();
        self.handle.scaling.rcu(|current| Scaling {
            file: file.clone(),
            ..Scaling::clone(current)
        });
        publish(
            &self.metrics,
            &self.handle.scaling.load(),
            &self.rules.load(),
        );
        Ok(format!("{count} factor(s)"))
    }
}

/// Reads the store's temporary factors every `interval` until `stop`.
pub fn spawn_poller(
    limiter: Arc<Limiter>,
    handle: Arc<ScalingHandle>,
    rules: Arc<ArcSwap<Snapshot>>,
    metrics: Arc<Metrics>,
    interval: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = stop.wait_for(|s| *s) => break,
            }
            // Failures are logged (throttled) inside; the factors in force stay.
            let _ = refresh(
                &limiter,
                &handle.scaling,
                &rules,
                &metrics,
                &handle.last,
                interval.max(Duration::from_millis(250)),
            )
            .await;
        }
    })
}
