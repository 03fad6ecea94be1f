//! This process's estimate of one Redis node's clock, so that a call can carry its deadline on the
//! clock the script reads (`TIME`). One per node (each dispatcher lane keeps its own): nodes'
//! clocks differ, and a deadline put on another node's clock would expire calls that are on time.
//! It must never serve a decision: Redis' clock alone decides; this only tells the script when a
//! caller has stopped waiting.

use tokio::time::Instant;

/// This process's estimate of Redis' clock (`TIME`, which every reply carries), so that a call
/// can carry its deadline on Redis' clock: the script does not run a call that reaches it after
/// its caller was answered by the failure mode (a batch that waited, a connection that stalled),
/// which would charge a budget twice under `local`.
///
/// The estimate is Redis' reading minus this process's monotonic clock when the reply arrives:
/// never later than the truth (the reply took time to arrive), so a deadline carried is never
/// later than the caller's. Used only while fresh; a Redis clock that steps (a failover) is
/// caught up by the next reply: every reply of the script tells its clock, even one whose calls
/// all expired.
#[derive(Default)]
pub struct RedisClock {
    offset_us: std::sync::atomic::AtomicI64,
    /// When it was last read, on the monotonic clock (µs since `EPOCH`); 0: never.
    read_at_us: std::sync::atomic::AtomicU64,
}

/// The origin of the monotonic microseconds the estimate is kept in.
static EPOCH: std::sync::LazyLock<std::time::Instant> =
    std::sync::LazyLock::new(std::time::Instant::now);

/// How long a reading of Redis' clock is used for.
const CLOCK_FRESH_US: u64 = 10_000_000;

fn monotonic_us(at: std::time::Instant) -> u64 {
    u64::try_from(at.saturating_duration_since(*EPOCH).as_micros()).unwrap_or(u64::MAX)
}

impl RedisClock {
    /// Notes Redis' clock as a reply just read it (`redis_now_us`).
    pub(super) fn observe(&self, redis_now_us: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        let now = monotonic_us(std::time::Instant::now()).max(1);
        let offset = i64::try_from(redis_now_us).unwrap_or(i64::MAX) - now as i64;
        self.offset_us.store(offset, Relaxed);
        self.read_at_us.store(now, Relaxed);
    }

    /// `deadline` on Redis' clock (µs), or 0 when no fresh reading is at hand.
    pub(super) fn on_redis(&self, deadline: Instant) -> u64 {
        use std::sync::atomic::Ordering::Relaxed;
        let read_at = self.read_at_us.load(Relaxed);
        let now = monotonic_us(std::time::Instant::now());
        if read_at == 0 || now.saturating_sub(read_at) > CLOCK_FRESH_US {
            return 0;
        }
        let at = monotonic_us(deadline.into_std()) as i64 + self.offset_us.load(Relaxed);
        u64::try_from(at).unwrap_or(0)
    }
}
