//! The one clock of the I/O layer: milliseconds since the Unix epoch, as the core takes them.
//!
//! It reads tokio's clock, anchored once to the wall clock: in production that is the wall
//! clock; in a test on a paused tokio runtime it is the virtual clock, so health trials,
//! drain deadlines and session ends move exactly as far as the test advances time.
//! Nothing else in the crate reads `SystemTime` for a decision. Times written for a later
//! process (the snapshot and node-state files) are moved onto the wall clock as it reads at
//! the write ([`wall_step_ms`]), which is what that process anchors to.

use std::sync::OnceLock;
use std::time::Duration;

use tokio::time::Instant;

/// (wall-clock ms at the anchor, tokio instant of the anchor)
fn anchor() -> &'static (u64, Instant) {
    static ANCHOR: OnceLock<(u64, Instant)> = OnceLock::new();
    ANCHOR.get_or_init(|| (wall_ms(), Instant::now()))
}

/// The wall clock as it reads now (ms since the Unix epoch), steps and all.
fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The least difference between two clocks that each read the wall clock once taken for a
/// step of the wall clock between the readings; less is the time between them.
pub const CLOCK_STEP_MIN: Duration = Duration::from_secs(1);

/// How far the wall clock reads now ahead of [`now_ms`] (ms; negative: behind): the steps it
/// took since the anchor (an NTP step, a machine's clock set by hand), 0 below
/// [`CLOCK_STEP_MIN`]. Times written for another process (the snapshot and node-state
/// files, which a limpet started later reads on its own anchor, the wall clock then) are
/// moved by it, so that a step while limpet ran neither ages nor keeps them by the step.
/// On a paused tokio runtime, time advanced by a test reads as a step back.
pub fn wall_step_ms() -> i64 {
    let step = i128::from(wall_ms()) - i128::from(now_ms());
    if step.unsigned_abs() < CLOCK_STEP_MIN.as_millis() {
        0
    } else {
        i64::try_from(step).unwrap_or(if step < 0 { i64::MIN } else { i64::MAX })
    }
}

/// `ms` moved by `by` milliseconds, within `u64`.
pub fn shifted(ms: u64, by: i64) -> u64 {
    u64::try_from((i128::from(ms) + i128::from(by)).max(0)).unwrap_or(u64::MAX)
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
