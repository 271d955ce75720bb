//! "How many distinct sessions did this node see in the last N minutes?", approximately, in a
//! bounded and small amount of memory per node.
//!
//! A cookie in the default `name` mode carries the node's name, so every session pinned to a
//! node carries the *same* cookie value: the cookie cannot tell sessions apart. What tells them
//! apart is what the data plane knows about the client: its address, and the issue time of a
//! signed token when the cookie carries one. The data plane hashes that identity with
//! [`session_key`] and calls [`SeenWindow::record`] on every request the node serves through a
//! pin (or a fresh assignment). This module only counts the distinct keys.
//!
//! ## How it is estimated
//!
//! Time is cut into slots of `slot_ms` (one minute by default). Each slot holds a HyperLogLog
//! sketch of `2^precision` one-byte registers: a key's top `precision` bits pick a register,
//! and the register keeps the largest "position of the first 1 bit" seen among the remaining
//! bits. A ring of slots covers the window; a slot is reset when the ring comes back to it.
//! Reading merges (register-wise maximum) the slots inside the window and applies the standard
//! HyperLogLog estimator (Flajolet et al., 2007) with the linear-counting correction for small
//! counts. A 64-bit key needs no large-range correction.
//!
//! - **Window.** The slots merged are the current (partial) slot and the `ceil(window/slot)`
//!   full slots before it, so the estimate covers *at least* the last `window_ms` and at most
//!   one slot more.
//! - **Error.** The relative standard error is about `1.04 / sqrt(2^precision)`
//!   ([`SeenWindow::relative_error`]): 9.2 % at the default precision 7, 6.5 % at 8. Small
//!   counts (up to about `2.5 * 2^precision`) use linear counting and are close to exact (a
//!   few percent at most). A session counted twice is still counted once: duplicates never
//!   inflate the count.
//! - **Memory.** `(ceil(window/slot) + 1) * 2^precision` bytes: 1408 bytes per node for the
//!   default ten-minute window of one-minute slots at precision 7.
//! - **Keys must be well mixed.** [`session_key`] mixes its input; a caller that brings its own
//!   hash must bring a good one (not an identity hash of an address).
//!
//! Time is an argument (`now_ms`); nothing here reads a clock.

/// The default sketch precision: 128 registers per slot, about 9.2 % relative standard error.
pub const DEFAULT_PRECISION: u8 = 7;
/// The default slot width: one minute.
pub const DEFAULT_SLOT_MS: u64 = 60_000;
/// The default window: ten minutes.
pub const DEFAULT_WINDOW_MS: u64 = 10 * 60_000;
/// The most slots a window holds: with [`DEFAULT_SLOT_MS`], a day ([`MAX_WINDOW_MS`]).
pub const MAX_SLOTS: u64 = 1440;
/// The longest window of [`DEFAULT_SLOT_MS`] slots.
pub const MAX_WINDOW_MS: u64 = MAX_SLOTS * DEFAULT_SLOT_MS;

#[derive(Debug, Clone)]
struct Slot {
    /// `now_ms / slot_ms` when the slot was last written; `u64::MAX` when never.
    epoch: u64,
    regs: Box<[u8]>,
}

/// Distinct keys seen over a sliding window. See the module docs.
#[derive(Debug, Clone)]
pub struct SeenWindow {
    precision: u8,
    slot_ms: u64,
    window_ms: u64,
    slots: Box<[Slot]>,
    last_seen_ms: Option<u64>,
}

impl Default for SeenWindow {
    fn default() -> Self {
        SeenWindow::new(DEFAULT_WINDOW_MS, DEFAULT_SLOT_MS, DEFAULT_PRECISION)
    }
}

impl SeenWindow {
    /// A window of `window_ms` made of slots of `slot_ms`, each a sketch of `2^precision`
    /// registers. Out-of-range arguments are clamped: `precision` to 4..=12, `slot_ms` to at
    /// least 1, `window_ms` to at least one slot and at most [`MAX_SLOTS`] of them (what
    /// [`Self::window_ms`] reports then: the window covered, not the one asked for).
    pub fn new(window_ms: u64, slot_ms: u64, precision: u8) -> Self {
        let precision = precision.clamp(4, 12);
        let slot_ms = slot_ms.max(1);
        let window_ms = window_ms.clamp(slot_ms, slot_ms.saturating_mul(MAX_SLOTS));
        let full = window_ms.div_ceil(slot_ms).min(MAX_SLOTS);
        let n = usize::try_from(full + 1).unwrap_or(1441);
        let slots = (0..n)
            .map(|_| Slot {
                epoch: u64::MAX,
                regs: vec![0u8; 1 << precision].into_boxed_slice(),
            })
            .collect();
        SeenWindow {
            precision,
            slot_ms,
            window_ms,
            slots,
            last_seen_ms: None,
        }
    }

    /// The same estimator over a window of `window_ms` from `now_ms` on (a reload changed
    /// it), keeping what it counted inside the new window: each slot the new ring covers at
    /// `now_ms` goes to its place there, so a shorter window stops counting the older
    /// sessions at once (and forgets them: lengthened again later, it does not count them
    /// back), and a longer one keeps every slot it held. `window_ms` is clamped as in
    /// [`Self::new`].
    pub fn resize(&mut self, window_ms: u64, now_ms: u64) {
        let mut next = SeenWindow::new(window_ms, self.slot_ms, self.precision);
        let epoch = now_ms / self.slot_ms;
        let n = next.slots.len() as u64;
        let old: Vec<Slot> = std::mem::take(&mut self.slots).into_vec();
        // Each epoch the new ring covers has its own place in it: no two collide.
        for slot in old
            .into_iter()
            .filter(|s| s.epoch != u64::MAX && s.epoch <= epoch && epoch - s.epoch < n)
        {
            let place = (slot.epoch % n) as usize;
            next.slots[place] = slot;
        }
        next.last_seen_ms = self.last_seen_ms;
        *self = next;
    }

    /// The window this estimator covers at least, in milliseconds.
    pub fn window_ms(&self) -> u64 {
        self.window_ms
    }

    /// Bytes of registers held.
    pub fn memory_bytes(&self) -> usize {
        self.slots.len() << self.precision
    }

    /// The relative standard error of [`estimate`](Self::estimate) for large counts.
    pub fn relative_error(&self) -> f64 {
        1.04 / f64::from(1u32 << self.precision).sqrt()
    }

    /// When a key was last recorded (for "no pin seen within the idle window").
    pub fn last_seen_ms(&self) -> Option<u64> {
        self.last_seen_ms
    }

    /// Notes that some session was seen at `at_ms` without counting one: what another
    /// process saw (the limpet an upgrade took over from), for "no session seen within the
    /// idle window". Never moves the last sighting back.
    pub fn saw_at(&mut self, at_ms: u64) {
        self.last_seen_ms = Some(self.last_seen_ms.map_or(at_ms, |l| l.max(at_ms)));
    }

    /// Records that the session with this (well-mixed) key was seen at `now_ms`.
    pub fn record(&mut self, key: u64, now_ms: u64) {
        let epoch = now_ms / self.slot_ms;
        let n = self.slots.len() as u64;
        let slot = &mut self.slots[(epoch % n) as usize];
        if slot.epoch != epoch {
            // A write older than what the slot holds (time went backwards) is dropped rather
            // than wiping newer data.
            if slot.epoch != u64::MAX && slot.epoch > epoch {
                return;
            }
            slot.regs.fill(0);
            slot.epoch = epoch;
        }
        let p = u32::from(self.precision);
        let index = (key >> (64 - p)) as usize;
        // The remaining bits, with a guard bit so a zero remainder still gives a finite rank.
        let rest = (key << p) | (1u64 << (p - 1));
        let rank = (rest.leading_zeros() + 1) as u8;
        if slot.regs[index] < rank {
            slot.regs[index] = rank;
        }
        self.last_seen_ms = Some(self.last_seen_ms.map_or(now_ms, |l| l.max(now_ms)));
    }

    /// The approximate number of distinct keys recorded in the window ending at `now_ms`.
    pub fn estimate(&self, now_ms: u64) -> u64 {
        let epoch = now_ms / self.slot_ms;
        let span = self.slots.len() as u64; // current slot plus the full ones before it
        let m = 1usize << self.precision;
        let mut merged = vec![0u8; m];
        let mut any = false;
        for slot in self.slots.iter() {
            if slot.epoch == u64::MAX || slot.epoch > epoch || epoch - slot.epoch >= span {
                continue;
            }
            any = true;
            for (r, &s) in merged.iter_mut().zip(slot.regs.iter()) {
                *r = (*r).max(s);
            }
        }
        if !any {
            return 0;
        }
        hll_estimate(&merged)
    }
}

fn hll_estimate(regs: &[u8]) -> u64 {
    let m = regs.len() as f64;
    let alpha = match regs.len() {
        16 => 0.673,
        32 => 0.697,
        64 => 0.709,
        _ => 0.7213 / (1.0 + 1.079 / m),
    };
    let mut sum = 0.0;
    let mut zeros = 0u32;
    for &r in regs {
        sum += 2f64.powi(-i32::from(r));
        if r == 0 {
            zeros += 1;
        }
    }
    let raw = alpha * m * m / sum;
    let est = if raw <= 2.5 * m && zeros > 0 {
        m * (m / f64::from(zeros)).ln()
    } else {
        raw
    };
    est.round() as u64
}

/// A well-mixed 64-bit key for a session identity made of several parts (e.g. the client
/// address bytes and a signed token's issue time). Fixed seed: the same identity gives the
/// same key in every process. Not a MAC: it only has to spread keys evenly for counting.
pub fn session_key(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0x6c69_6d70_6574_2d73; // "limpet-s"
    for part in parts {
        // Length first, so ("ab", "c") and ("a", "bc") differ.
        h = mix(h ^ part.len() as u64);
        for chunk in part.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            h = mix(h ^ u64::from_le_bytes(word));
        }
    }
    mix(h)
}

/// The splitmix64 finaliser: a bijection with full avalanche.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(seed: u64, n: u64) -> impl Iterator<Item = u64> {
        (0..n).map(move |i| mix(seed.wrapping_mul(1_000_003) ^ i))
    }

    fn within(est: u64, truth: u64, rel: f64) -> bool {
        let (e, t) = (est as f64, truth as f64);
        (e - t).abs() <= rel * t
    }

    /// A window longer than [`MAX_SLOTS`] slots says what it covers: a day of minutes. (It
    /// reported the two days asked while it counted the last day alone.)
    #[test]
    fn a_window_past_its_slots_reports_what_it_covers() {
        let s = SeenWindow::new(2 * MAX_WINDOW_MS, DEFAULT_SLOT_MS, DEFAULT_PRECISION);
        assert_eq!(s.window_ms(), MAX_WINDOW_MS);
        let mut s = SeenWindow::new(MAX_WINDOW_MS, DEFAULT_SLOT_MS, DEFAULT_PRECISION);
        s.record(mix(1), 0);
        assert_eq!(s.estimate(MAX_WINDOW_MS - DEFAULT_SLOT_MS), 1);
    }

    #[test]
    fn empty_is_zero_and_one_is_one() {
        let mut s = SeenWindow::default();
        assert_eq!(s.estimate(0), 0);
        assert_eq!(s.last_seen_ms(), None);
        s.record(mix(1), 5);
        s.record(mix(1), 6);
        assert_eq!(s.estimate(10), 1, "duplicates count once");
        assert_eq!(s.last_seen_ms(), Some(6));
        s.saw_at(4);
        assert_eq!(s.last_seen_ms(), Some(6), "never back");
        s.saw_at(8);
        assert_eq!(s.last_seen_ms(), Some(8));
        assert_eq!(s.estimate(8), 1, "a sighting counts no session");
    }

    #[test]
    fn small_counts_are_close_to_exact() {
        for n in [2u64, 10, 50, 100, 200] {
            let mut s = SeenWindow::default();
            for k in keys(n, n) {
                s.record(k, 1_000);
                s.record(k, 2_000); // seen twice
            }
            let est = s.estimate(3_000);
            assert!(within(est, n, 0.08), "{n} sessions estimated as {est}");
        }
    }

    #[test]
    fn large_counts_stay_within_three_standard_errors() {
        for precision in [7u8, 8, 10] {
            for (seed, n) in [(1u64, 1_000u64), (2, 10_000), (3, 100_000)] {
                let mut s = SeenWindow::new(DEFAULT_WINDOW_MS, DEFAULT_SLOT_MS, precision);
                // Spread over the window, several slots.
                for (i, k) in keys(seed, n).enumerate() {
                    s.record(k, (i as u64 % 9) * DEFAULT_SLOT_MS);
                }
                let est = s.estimate(9 * DEFAULT_SLOT_MS);
                let bound = 3.0 * s.relative_error();
                assert!(
                    within(est, n, bound),
                    "p={precision}: {n} sessions estimated as {est} (bound {bound:.3})"
                );
            }
        }
    }

    #[test]
    fn the_window_forgets_old_slots() {
        let slot = 60_000;
        let mut s = SeenWindow::new(10 * slot, slot, 7);
        for k in keys(7, 100) {
            s.record(k, 0);
        }
        for k in keys(8, 20) {
            s.record(k, 9 * slot + 1);
        }
        // At 10 min the first minute is still inside (at least 10 minutes are covered).
        assert!(within(s.estimate(10 * slot), 120, 0.1));
        // Once 11 full slots have passed, only the recent sessions remain.
        assert!(
            within(s.estimate(11 * slot), 20, 0.1),
            "{}",
            s.estimate(11 * slot)
        );
        assert_eq!(s.estimate(20 * slot), 0);
        // A slot reused by the ring starts empty.
        s.record(mix(99), 11 * slot);
        assert!(within(s.estimate(11 * slot), 21, 0.1));
        assert_eq!(s.estimate(25 * slot), 0);
    }

    /// A reload's new window applies to what was counted: shortened, the sessions seen
    /// before it are no longer counted; lengthened, those still inside it stay counted, and
    /// the ring grows to cover it.
    #[test]
    fn a_resized_window_keeps_what_it_counted_inside_the_new_window() {
        let slot = 60_000;
        let mut s = SeenWindow::new(10 * slot, slot, 7);
        for k in keys(7, 100) {
            s.record(k, 2 * slot);
        }
        for k in keys(8, 20) {
            s.record(k, 9 * slot + 1);
        }
        let now = 9 * slot + 2;
        assert!(within(s.estimate(now), 120, 0.1));
        s.resize(3 * slot, now);
        assert_eq!(s.window_ms(), 3 * slot);
        assert_eq!(s.memory_bytes(), 4 * 128);
        assert!(
            within(s.estimate(now), 20, 0.1),
            "only the sessions of the last 3 min: {}",
            s.estimate(now)
        );
        assert_eq!(s.last_seen_ms(), Some(9 * slot + 1));
        // Lengthened again: the slot kept is counted over the longer window (the one
        // forgotten is not), and new ones land in the grown ring.
        s.resize(30 * slot, now);
        assert_eq!(s.memory_bytes(), 31 * 128);
        for k in keys(9, 30) {
            s.record(k, 20 * slot);
        }
        assert!(
            within(s.estimate(20 * slot), 50, 0.1),
            "{}",
            s.estimate(20 * slot)
        );
        // The same length: nothing is lost.
        let before = s.estimate(20 * slot);
        s.resize(30 * slot, 20 * slot);
        assert_eq!(s.estimate(20 * slot), before);
    }

    #[test]
    fn memory_is_bounded_and_documented() {
        let s = SeenWindow::default();
        assert_eq!(s.memory_bytes(), 11 * 128);
        assert!((s.relative_error() - 0.0919).abs() < 0.001);
        let tiny = SeenWindow::new(0, 0, 0);
        assert_eq!(tiny.memory_bytes(), 2 * 16);
    }

    #[test]
    fn session_key_separates_parts() {
        assert_ne!(session_key(&[b"ab", b"c"]), session_key(&[b"a", b"bc"]));
        assert_eq!(session_key(&[b"10.0.0.1"]), session_key(&[b"10.0.0.1"]));
        assert_ne!(session_key(&[b"10.0.0.1"]), session_key(&[b"10.0.0.2"]));
    }

    #[test]
    fn client_addresses_as_keys_count_well() {
        // 5000 clients of one /16, as the data plane would key them.
        let mut s = SeenWindow::default();
        for i in 0..5000u32 {
            let ip = (0x0a00_0000u32 | i).to_be_bytes();
            s.record(session_key(&[&ip]), 0);
        }
        let est = s.estimate(0);
        assert!(within(est, 5000, 3.0 * s.relative_error()), "{est}");
    }
}
