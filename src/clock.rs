//! Where "now" comes from. The memory store reads the process clock (made monotonic so that a
//! stepped-back host clock never re-opens a window); tests drive a manual clock instead of
//! sleeping. The Redis path never uses this: its scripts read Redis `TIME`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of wall-clock time in microseconds since the Unix epoch.
pub trait Clock: Send + Sync + 'static {
    fn now_us(&self) -> u64;
}

/// The host clock, never moving backwards: windows are epoch-aligned, so wall time is needed,
/// but a step back (NTP) must not hand out a budget a second time.
#[derive(Debug, Default)]
pub struct SystemClock {
    last_us: AtomicU64,
}

impl Clock for SystemClock {
    fn now_us(&self) -> u64 {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        let previous = self.last_us.fetch_max(wall, Ordering::Relaxed);
        previous.max(wall)
    }
}

/// A clock that moves only when told to; shared by a test and the server it drives.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now_us: Arc<AtomicU64>,
}

impl ManualClock {
    pub fn new(start_us: u64) -> Self {
        Self {
            now_us: Arc::new(AtomicU64::new(start_us)),
        }
    }

    pub fn advance_us(&self, delta_us: u64) {
        self.now_us.fetch_add(delta_us, Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now_us(&self) -> u64 {
        self.now_us.load(Ordering::Relaxed)
    }
}
