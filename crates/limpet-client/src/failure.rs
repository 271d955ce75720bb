//! What a failure means for the session: a pure classification and the reconnect backoff.
//!
//! Cookie adoption is independent of all this: every answer of the origin, whatever its status
//! and whatever the verdict, goes through [`AffinityJar::adopt`](crate::AffinityJar::adopt)
//! first. A refused upgrade's cookie is how the balancer moves the client to a healthy node.

use std::time::Duration;

/// Something that happened to a request, an upgrade or an open socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// A plain HTTP request was answered with this status.
    RequestAnswered(u16),
    /// The connection dropped before the request got any answer (refused, reset, timed out,
    /// TLS failure).
    RequestTransportFailed,
    /// The WebSocket upgrade was answered with this status; 101 means it was accepted.
    UpgradeAnswered(u16),
    /// The upgrade got no answer (connection refused, reset, TLS or handshake failure).
    UpgradeTransportFailed,
    /// An open socket closed, from either side, whatever the close code.
    SocketClosed,
    /// An open socket missed its heartbeats.
    HeartbeatsMissed,
}

/// What the client does about an [`Outcome`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// Keep the session; try again after [`Backoff`]'s next delay (1 s to 30 s). Used for the
    /// socket, whose reconnect the client owns.
    RetryLater,
    /// Keep the session; hand the answer (or the transport error) back to the caller, which
    /// decides. The client does not retry on its own: the request may have had effects.
    HandBack,
    /// Authorisation withdrawn: clear the session (and the jar), block reconnects until the
    /// person signs in again.
    AuthorisationWithdrawn,
}

impl Verdict {
    /// Whether the session survives.
    pub const fn keeps_session(self) -> bool {
        !matches!(self, Verdict::AuthorisationWithdrawn)
    }

    /// Whether a person must act (sign in) before the client can go on.
    pub const fn needs_person(self) -> bool {
        matches!(self, Verdict::AuthorisationWithdrawn)
    }
}

/// Classifies an outcome. Pure; the table of the affinity-client reference, completed:
///
/// | outcome | verdict | source |
/// |---|---|---|
/// | socket closed, or heartbeats missed | `RetryLater` (reconnect with backoff) | reference |
/// | request answered 5xx or 409 | `HandBack`, session kept | reference |
/// | request: connection dropped, no answer | `HandBack` (the transport error), session kept | reference: "transport failure, session kept" |
/// | upgrade answered 5xx | `RetryLater` (refusal's cookie adopted before) | reference |
/// | request answered 401 | `AuthorisationWithdrawn` | reference |
/// | upgrade answered 401 or 403 | `AuthorisationWithdrawn` | reference |
/// | request answered anything else (1xx-4xx, 403 included, and out-of-range codes) | `HandBack` | choice |
/// | upgrade answered 101 | `HandBack`: the open socket goes to the caller | choice |
/// | upgrade answered 408 or 429 | `RetryLater`: statuses that say "try again later" | choice |
/// | upgrade answered anything else (2xx, 3xx, other 4xx, other 1xx) | `HandBack`: a refusal that retrying unchanged will not fix | choice |
/// | upgrade: no answer | `RetryLater`, like a socket that closed | choice |
///
/// Why a transport failure on a request is handed back rather than retried: the request may
/// have reached the server before the connection dropped (a job claim, say), so only the
/// caller knows whether repeating it is safe. A 403 on a plain request is an ordinary refusal
/// of that one resource, not the end of the session; on the upgrade the reference reads it as
/// the session's end, because the socket is the session.
pub const fn classify(outcome: Outcome) -> Verdict {
    match outcome {
        Outcome::SocketClosed | Outcome::HeartbeatsMissed => Verdict::RetryLater,
        Outcome::RequestAnswered(401) => Verdict::AuthorisationWithdrawn,
        Outcome::RequestAnswered(_) => Verdict::HandBack,
        Outcome::RequestTransportFailed => Verdict::HandBack,
        Outcome::UpgradeAnswered(401 | 403) => Verdict::AuthorisationWithdrawn,
        Outcome::UpgradeAnswered(500..=599 | 408 | 429) => Verdict::RetryLater,
        Outcome::UpgradeAnswered(_) => Verdict::HandBack,
        Outcome::UpgradeTransportFailed => Verdict::RetryLater,
    }
}

/// Reconnect delays: 1 s, 2 s, 4 s, 8 s, 16 s, then 30 s for as long as failures go on.
///
/// Reset it once a socket is open again. Jitter is optional and its randomness is passed in,
/// so the sequence is reproducible in tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Backoff {
    failures: u32,
}

impl Backoff {
    /// The first delay.
    pub const MIN: Duration = Duration::from_secs(1);
    /// The longest delay.
    pub const MAX: Duration = Duration::from_secs(30);

    /// No failures yet.
    pub const fn new() -> Self {
        Backoff { failures: 0 }
    }

    /// The delay after `failures` consecutive failures have already been waited for:
    /// `MIN * 2^failures`, capped at `MAX`.
    pub const fn delay_for(failures: u32) -> Duration {
        let min = Self::MIN.as_millis() as u64;
        let max = Self::MAX.as_millis() as u64;
        // 2^5 s already exceeds the cap, so larger shifts need not be computed.
        if failures >= 5 {
            return Self::MAX;
        }
        let ms = min << failures;
        Duration::from_millis(if ms > max { max } else { ms })
    }

    /// Records a failure and returns how long to wait before the next attempt.
    pub fn next_delay(&mut self) -> Duration {
        let d = Self::delay_for(self.failures);
        self.failures = self.failures.saturating_add(1);
        d
    }

    /// Like [`next_delay`](Self::next_delay), with "equal jitter": a delay drawn from
    /// `[max(MIN, d/2), d]` by `random` (any `u64`, e.g. from `rand::random()`), so many clients
    /// cut off together do not all come back in the same second. Never below `MIN`.
    pub fn next_delay_jittered(&mut self, random: u64) -> Duration {
        let d = self.next_delay().as_millis() as u64;
        let lo = (d / 2).max(Self::MIN.as_millis() as u64);
        let span = d - lo;
        // Scale the 64-bit random into 0..=span without modulo bias worth speaking of.
        let offset = ((u128::from(random) * u128::from(span + 1)) >> 64) as u64;
        Duration::from_millis(lo + offset)
    }

    /// Consecutive failures recorded since the last reset.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// Back to the start, after a success.
    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Outcome::*;
    use Verdict::*;

    // One test per row of the reference's table.

    #[test]
    fn row_socket_closes_or_misses_heartbeats_reconnects_with_backoff() {
        assert_eq!(classify(SocketClosed), RetryLater);
        assert_eq!(classify(HeartbeatsMissed), RetryLater);
        assert!(classify(SocketClosed).keeps_session());
        let mut b = Backoff::new();
        let delays: Vec<u64> = (0..8).map(|_| b.next_delay().as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 30, 30, 30]);
    }

    #[test]
    fn row_5xx_or_409_on_a_request_is_handed_back_session_kept() {
        for status in [409, 500, 502, 503, 504, 599] {
            let v = classify(RequestAnswered(status));
            assert_eq!(v, HandBack, "{status}");
            assert!(v.keeps_session() && !v.needs_person());
        }
    }

    #[test]
    fn row_connection_dropped_without_answer_is_a_transport_failure_session_kept() {
        let v = classify(RequestTransportFailed);
        assert_eq!(v, HandBack);
        assert!(v.keeps_session() && !v.needs_person());
    }

    #[test]
    fn row_5xx_on_the_upgrade_is_retried_after_backoff() {
        for status in [500, 502, 503, 504, 599] {
            let v = classify(UpgradeAnswered(status));
            assert_eq!(v, RetryLater, "{status}");
            assert!(v.keeps_session() && !v.needs_person());
        }
        // That the refusal's cookie is adopted is the jar's rule, tested with the jar and
        // end to end in tests/websocket.rs.
    }

    #[test]
    fn row_401_on_a_request_or_401_403_on_the_upgrade_withdraws_authorisation() {
        for o in [
            RequestAnswered(401),
            UpgradeAnswered(401),
            UpgradeAnswered(403),
        ] {
            let v = classify(o);
            assert_eq!(v, AuthorisationWithdrawn, "{o:?}");
            assert!(!v.keeps_session() && v.needs_person());
        }
    }

    // The choices where the reference is silent.

    #[test]
    fn other_request_statuses_are_handed_back() {
        for status in [0, 100, 200, 204, 302, 400, 403, 404, 408, 429, 999] {
            assert_eq!(classify(RequestAnswered(status)), HandBack, "{status}");
        }
    }

    #[test]
    fn other_upgrade_answers() {
        assert_eq!(classify(UpgradeAnswered(101)), HandBack);
        assert_eq!(classify(UpgradeAnswered(408)), RetryLater);
        assert_eq!(classify(UpgradeAnswered(429)), RetryLater);
        for status in [100, 200, 301, 400, 404, 409, 426, 499, 600] {
            assert_eq!(classify(UpgradeAnswered(status)), HandBack, "{status}");
        }
        assert_eq!(classify(UpgradeTransportFailed), RetryLater);
    }

    #[test]
    fn backoff_bounds_reset_and_saturation() {
        assert_eq!(Backoff::delay_for(0), Backoff::MIN);
        assert_eq!(Backoff::delay_for(4), Duration::from_secs(16));
        assert_eq!(Backoff::delay_for(5), Backoff::MAX);
        assert_eq!(Backoff::delay_for(u32::MAX), Backoff::MAX);
        let mut b = Backoff { failures: u32::MAX };
        assert_eq!(b.next_delay(), Backoff::MAX);
        assert_eq!(b.failures(), u32::MAX);
        b.reset();
        assert_eq!(b.next_delay(), Backoff::MIN);
    }

    #[test]
    fn jitter_stays_between_half_and_full_delay_and_never_below_min() {
        for random in [0, 1, u64::MAX / 3, u64::MAX / 2, u64::MAX] {
            let mut b = Backoff::new();
            let mut plain = Backoff::new();
            for _ in 0..10 {
                let full = plain.next_delay();
                let j = b.next_delay_jittered(random);
                assert!(j <= full, "{j:?} > {full:?}");
                assert!(
                    j >= (full / 2).max(Backoff::MIN),
                    "{j:?} too short for {full:?}"
                );
            }
        }
        let mut b = Backoff::new();
        b.next_delay();
        b.next_delay();
        // 4 s nominal: the extremes of `random` reach both ends of [2 s, 4 s].
        let mut copy = b;
        assert_eq!(copy.next_delay_jittered(0), Duration::from_secs(2));
        assert_eq!(b.next_delay_jittered(u64::MAX), Duration::from_secs(4));
    }
}
