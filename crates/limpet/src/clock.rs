//! The one clock of the I/O layer: milliseconds since the Unix epoch, as the core takes them.
//!
//! It reads tokio's clock, anchored once to the wall clock: in production that is the wall
//! clock; in a test on a paused tokio runtime it is the virtual clock, so health trials,
//! drain deadlines and session ends move exactly as far as the test advances time.
//! Nothing else in the crate reads `SystemTime` for a decision.

use std::sync::OnceLock;
use std::time::Duration;

use tokio::time::Instant;

/// (wall-clock ms at the anchor, tokio instant of the anchor)
fn anchor() -> &'static (u64, Instant) {
    static ANCHOR: OnceLock<(u64, Instant)> = OnceLock::new();
    ANCHOR.get_or_init(|| {
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        (wall, Instant::now())
    })
}

/// Milliseconds since the Unix epoch: the core's `now_ms`.
pub fn now_ms() -> u64 {
    ms_at(Instant::now())
}

/// [`now_ms`] at `at`, a reading the caller took already (one clock read serving both
/// scales).
pub fn ms_at(at: Instant) -> u64 {
    let (wall, anchor) = *anchor();
    let since = at.saturating_duration_since(anchor);
    wall.saturating_add(u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
}

/// Microseconds from the clock's anchor to `at` (0 before it): an order of events finer
/// than [`ms_at`]'s, for the core's comparisons of send times
/// ([`limpet_core::answered_since`]). Not a wall-clock time.
pub fn us_at(at: Instant) -> u64 {
    let (_, anchor) = *anchor();
    u64::try_from(at.saturating_duration_since(anchor).as_micros()).unwrap_or(u64::MAX)
}

/// The tokio instant of a core time (`now_ms` scale); a time already past is now.
pub fn instant_of(ms: u64) -> Instant {
    let now = now_ms();
    Instant::now() + Duration::from_millis(ms.saturating_sub(now))
}

/// A duration in the core's milliseconds.
pub fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
