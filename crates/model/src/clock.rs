//! Time, in one place: the wall clock the pipeline runs on, and a manual clock tests control.
//!
//! Everything that stamps or compares times (dead letters' `failed_at`, pending batches' age,
//! snapshot expiry, orphan grace periods, lock leases, and the watermarks and idle timeouts of
//! the processing stage) asks the [`Clock`] of its backend (the pipeline crate's `Backend`).

use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

/// A source of the current time.
pub trait Clock: Send + Sync + Debug {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> i64;
}

/// The system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        now_ms()
    }
}

/// A clock that moves only when told to (for tests of time-dependent behaviour).
#[derive(Debug, Default)]
pub struct ManualClock(AtomicI64);

impl ManualClock {
    /// A clock showing `now_ms`.
    pub fn new(now_ms: i64) -> Arc<ManualClock> {
        Arc::new(ManualClock(AtomicI64::new(now_ms)))
    }

    /// Sets the time.
    pub fn set(&self, now_ms: i64) {
        self.0.store(now_ms, Ordering::SeqCst);
    }

    /// Moves the time forward by `ms`.
    pub fn advance(&self, ms: i64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// The system clock, shared.
pub fn system() -> Arc<dyn Clock> {
    Arc::new(SystemClock)
}

/// RFC 3339 UTC text of epoch milliseconds, to the millisecond (`2026-12-02T00:20:35.019Z`); the
/// epoch for a time chrono cannot represent.
pub fn rfc3339_ms(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap_or_default()
        .format("%Y-%m-%dT%H:%M:%S%.3fZ")
        .to_string()
}

/// RFC 3339 UTC text of epoch microseconds (event times and watermarks), to the millisecond; the
/// number itself for a time chrono cannot represent, so a message never hides it.
pub fn rfc3339_us(us: i64) -> String {
    chrono::DateTime::from_timestamp_micros(us)
        .map(|t| t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
        .unwrap_or_else(|| format!("{us} µs"))
}

/// Milliseconds since the Unix epoch on the system clock (0 if the clock is before it).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// A random duration between half and all of `ceiling_ms`, so that two invocations that
/// collided do not collide again in lockstep.
pub fn jitter(ceiling_ms: u64) -> std::time::Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() as u64);
    let spread = xxhash_rust::xxh3::xxh3_64(&nanos.to_le_bytes()) % (ceiling_ms / 2 + 1);
    std::time::Duration::from_millis(ceiling_ms / 2 + spread)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_read_as_rfc3339_in_milliseconds_and_microseconds_alike() {
        assert_eq!(rfc3339_ms(1_796_170_835_019), "2026-12-02T00:20:35.019Z");
        assert_eq!(
            rfc3339_us(1_796_170_835_019_999),
            "2026-12-02T00:20:35.019Z"
        );
        // Beyond chrono's range: the epoch for an event's own time, the number in a message.
        assert_eq!(rfc3339_ms(i64::MAX), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_us(i64::MIN), format!("{} µs", i64::MIN));
    }

    #[test]
    fn a_manual_clock_moves_only_when_told() {
        let c = ManualClock::new(1_000);
        assert_eq!(c.now_ms(), 1_000);
        c.advance(500);
        assert_eq!(c.now_ms(), 1_500);
        c.set(10);
        assert_eq!(c.now_ms(), 10);
        for _ in 0..100 {
            let j = jitter(40).as_millis();
            assert!((20..=40).contains(&j), "{j}");
        }
    }
}
