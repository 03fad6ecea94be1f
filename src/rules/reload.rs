//! Hot reload: poll the rules directory, and when its files have changed and then stayed the
//! same for one more poll (a debounce: Kubernetes writes a ConfigMap as a new `..data` directory
//! and swaps a symlink; an editor writes in steps), load and validate the whole set and swap it
//! in atomically. Calls in flight keep the snapshot they started with. A set that fails
//! validation is refused as a whole: the last good rules stay, the error is logged with file and
//! line and counted, and it is not retried until the files change again.
//!
//! Why polling and not inotify: a ConfigMap update is a rename of a symlink inside the directory,
//! which inotify on the files themselves misses; hashing a few small files once a second is cheap
//! and sees every kind of change.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::watch;

use super::{Snapshot, load};
use crate::telemetry::{Metrics, ResultLabels};

/// A hash of every rule file's name and contents.
pub fn fingerprint(dir: &Path) -> std::io::Result<u64> {
    let mut hasher = DefaultHasher::new();
    for path in load::rule_files(dir).map_err(std::io::Error::other)? {
        path.file_name().hash(&mut hasher);
        std::fs::read(&path)?.hash(&mut hasher);
    }
    Ok(hasher.finish())
}

pub struct Reloader {
    pub dir: PathBuf,
    pub rules: Arc<ArcSwap<Snapshot>>,
    pub metrics: Arc<Metrics>,
    pub interval: Duration,
}

impl Reloader {
    /// Polls until `stop` turns true. `loaded` is the fingerprint of the rules in force.
    pub fn spawn(
        self,
        loaded: u64,
        mut stop: watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut applied = loaded;
            let mut refused: Option<u64> = None;
            let mut last_seen = loaded;
            let mut ticker = tokio::time::interval(self.interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = ticker.tick() => {}
                    _ = stop.wait_for(|s| *s) => break,
                }
                let dir = self.dir.clone();
                let seen = match tokio::task::spawn_blocking(move || fingerprint(&dir)).await {
                    Ok(Ok(seen)) => seen,
                    Ok(Err(e)) => {
                        tracing::warn!(dir = %self.dir.display(), error = %e, "cannot read the rules directory");
                        continue;
                    }
                    Err(_) => continue,
                };
                let stable = seen == last_seen;
                last_seen = seen;
                if seen == applied || Some(seen) == refused || !stable {
                    continue;
                }
                self.reload(seen, &mut applied, &mut refused).await;
            }
        })
    }

    async fn reload(&self, seen: u64, applied: &mut u64, refused: &mut Option<u64>) {
        let dir = self.dir.clone();
        let loaded = tokio::task::spawn_blocking(move || super::load_dir(&dir)).await;
        let result = match loaded {
            Ok(result) => result,
            Err(e) => {
                tracing::error!(error = %e, "rules reload task failed");
                return;
            }
        };
        match result {
            Ok(snapshot) => {
                tracing::info!(
                    files = snapshot.files.len(),
                    rules = snapshot.rules().len(),
                    "rules reloaded"
                );
                self.metrics.rules_loaded(snapshot.loaded_at);
                self.rules.store(Arc::new(snapshot));
                self.metrics
                    .rules_reloads
                    .get_or_create(&ResultLabels {
                        result: "success".into(),
                    })
                    .inc();
                *applied = seen;
                *refused = None;
            }
            Err(e) => {
                tracing::error!(dir = %self.dir.display(), "rules refused, the last good rules stay in force:\n{e}");
                self.metrics
                    .rules_reloads
                    .get_or_create(&ResultLabels {
                        result: "error".into(),
                    })
                    .inc();
                *refused = Some(seen);
            }
        }
    }
}
