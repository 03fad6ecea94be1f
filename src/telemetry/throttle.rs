//! The throttle every repeated failure's log line goes through: at most one line a second, saying
//! how many were skipped (the metrics count every one). It must never block a caller.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// At most one log line a second for a failure that may repeat thousands of times a second (the
/// metrics count every one). `allow` answers how many were skipped since the last line, or
/// `None` when this one is to be skipped.
#[derive(Debug, Default)]
pub struct LogThrottle {
    skipped: AtomicU64,
    last: Mutex<Option<Instant>>,
}

impl LogThrottle {
    pub fn allow(&self) -> Option<u64> {
        let skipped = self.skipped.fetch_add(1, Ordering::Relaxed);
        // Contended: somebody else is deciding right now; skip rather than wait.
        let mut last = self.last.try_lock().ok()?;
        if last.is_some_and(|at| at.elapsed() < Duration::from_secs(1)) {
            return None;
        }
        *last = Some(Instant::now());
        self.skipped.store(0, Ordering::Relaxed);
        Some(skipped)
    }
}
