//! Where "now" comes from. The memory store reads the process clock: the wall time read once at
//! start, carried forward by the monotonic clock, so that a host clock stepped back (NTP) never
//! re-opens a window and one stepped forward and back never freezes the counters. Tests drive a
//! manual clock instead of sleeping. The Redis path never uses this: its scripts read Redis `TIME`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// A source of wall-clock time in microseconds since the Unix epoch.
pub trait Clock: Send + Sync + 'static {
    fn now_us(&self) -> u64;
}

/// Wall time anchored once, then advanced by the monotonic clock. Windows are epoch-aligned, so
/// wall time is needed; but a later step of the host clock is not followed: stepping back would
/// hand out a budget a second time, stepping forward would release it early (and the earlier
/// `max(last, wall)` guard froze every counter after a forward-and-back step). Both clocks are
/// slewed alike by NTP, so they do not drift apart.
#[derive(Debug)]
pub struct SystemClock {
    anchor_wall_us: u64,
    anchor: Instant,
}

impl Default for SystemClock {
    fn default() -> Self {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        Self {
            anchor_wall_us: wall,
            anchor: Instant::now(),
        }
    }
}

impl Clock for SystemClock {
    fn now_us(&self) -> u64 {
        let elapsed = u64::try_from(self.anchor.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.anchor_wall_us.saturating_add(elapsed)
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

    /// Sets the reading (a model test replays exact times).
    pub fn set_us(&self, now_us: u64) {
        self.now_us.store(now_us, Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now_us(&self) -> u64 {
        self.now_us.load(Ordering::Relaxed)
    }
}
