//! Files re-read when they change, by polling: the rules directory and the gRPC TLS certificate
//! both go through this one mechanism. Each poll reads the files and fingerprints the bytes read;
//! when the fingerprint differs from what is in force and has stayed the same for one more poll (a
//! debounce: Kubernetes writes a ConfigMap or Secret as a new `..data` directory and swaps a
//! symlink, an editor writes in steps), those same bytes are applied. What fails to apply is
//! refused as a whole, the current content stays, and it is not retried until the files change.
//!
//! Why polling and not inotify: an update of a mounted ConfigMap is a rename of a symlink inside
//! the directory, which watches on the files themselves miss; hashing a few small files once a
//! second is cheap and sees every kind of change. It must never apply bytes other than the ones it
//! fingerprinted, nor block an async worker (reads and applies run on the blocking pool).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Something on disk that is put in force when it changes.
pub trait Watched: Send + Sync + 'static {
    /// What one poll reads.
    type Content: Send + 'static;

    /// What is watched, for log lines ("rules in /etc/portcullis/rules").
    fn what(&self) -> String;

    /// Reads the files: a fingerprint of exactly the bytes read, and those bytes.
    fn read(&self) -> Result<(u64, Self::Content), String>;

    /// Puts content in force. `Ok` says what was applied, for the log; `Err` says why it was
    /// refused (the content in force stays).
    fn apply(&self, content: Self::Content) -> Result<String, Refusal>;
}

/// Why new content was not put in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// It is broken (logged at error level).
    Invalid(String),
    /// It is valid but would do harm unless the operator said so (logged at warn level).
    Unsafe(String),
}

/// Polls `watched` every `interval` until `stop` turns true; `applied` is the fingerprint of the
/// content in force at start.
pub fn spawn<W: Watched>(
    watched: Arc<W>,
    applied: u64,
    interval: Duration,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut poller = Poller::new(applied);
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = stop.wait_for(|s| *s) => break,
            }
            let reader = watched.clone();
            let Ok(read) = tokio::task::spawn_blocking(move || reader.read()).await else {
                continue;
            };
            let content = match read {
                Ok((fingerprint, content)) => {
                    poller.read_error = None;
                    match poller.seen(fingerprint) {
                        Some(fingerprint) => (fingerprint, content),
                        None => continue,
                    }
                }
                Err(e) => {
                    // Once per distinct error: a directory that stays unreadable is not a log
                    // line a second.
                    if poller.read_error.as_ref() != Some(&e) {
                        tracing::warn!(watched = %watched.what(), error = %e, "cannot read; will retry");
                        poller.read_error = Some(e);
                    }
                    continue;
                }
            };
            let (fingerprint, content) = content;
            let applier = watched.clone();
            let Ok(result) = tokio::task::spawn_blocking(move || applier.apply(content)).await
            else {
                continue;
            };
            match result {
                Ok(summary) => {
                    tracing::info!(watched = %watched.what(), "reloaded: {summary}");
                    poller.applied(fingerprint);
                }
                Err(Refusal::Invalid(e)) => {
                    tracing::error!(watched = %watched.what(), "refused, what was in force stays:\n{e}");
                    poller.refused(fingerprint);
                }
                Err(Refusal::Unsafe(e)) => {
                    tracing::warn!(watched = %watched.what(), "refused, what was in force stays: {e}");
                    poller.refused(fingerprint);
                }
            }
        }
    })
}

/// The decision part of the loop, separate so that it is tested without time or files.
#[derive(Debug)]
struct Poller {
    applied: u64,
    refused: Option<u64>,
    last_seen: u64,
    read_error: Option<String>,
}

impl Poller {
    fn new(applied: u64) -> Self {
        Self {
            applied,
            refused: None,
            last_seen: applied,
            read_error: None,
        }
    }

    /// A poll read content with this fingerprint: `Some` when it should be applied now.
    fn seen(&mut self, fingerprint: u64) -> Option<u64> {
        let stable = fingerprint == self.last_seen;
        self.last_seen = fingerprint;
        let known = fingerprint == self.applied || Some(fingerprint) == self.refused;
        (stable && !known).then_some(fingerprint)
    }

    fn applied(&mut self, fingerprint: u64) {
        self.applied = fingerprint;
        self.refused = None;
    }

    fn refused(&mut self, fingerprint: u64) {
        self.refused = Some(fingerprint);
    }
}

#[cfg(test)]
mod tests {
    use super::Poller;

    #[test]
    fn applies_a_change_once_it_held_still_for_one_poll() {
        let mut p = Poller::new(1);
        assert_eq!(p.seen(1), None, "nothing changed");
        assert_eq!(p.seen(2), None, "changed: wait one poll");
        assert_eq!(p.seen(3), None, "still moving");
        assert_eq!(p.seen(3), Some(3), "held still");
        p.applied(3);
        assert_eq!(p.seen(3), None, "in force");
    }

    #[test]
    fn a_refused_set_is_not_retried_until_the_files_change() {
        let mut p = Poller::new(1);
        p.seen(2);
        assert_eq!(p.seen(2), Some(2));
        p.refused(2);
        assert_eq!(p.seen(2), None);
        assert_eq!(p.seen(2), None);
        p.seen(4);
        assert_eq!(p.seen(4), Some(4));
        p.applied(4);
        // Going back to a set refused before is a change like any other.
        p.seen(2);
        assert_eq!(p.seen(2), Some(2));
    }
}
