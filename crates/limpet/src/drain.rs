//! # Closing long-lived connections cleanly at a drain deadline
//!
//! After `101 Switching Protocols` a WebSocket tunnel is raw bytes both ways. To close it
//! *cleanly* at a drain deadline, limpet sends the client a close frame with status 1001
//! ("going away"). A frame written into the middle of another frame would corrupt the
//! stream, so the node-to-client direction runs through a [`FrameTracker`] that follows frame
//! boundaries by parsing frame *headers* only (payloads are counted, never buffered or
//! unmasked). At the deadline the relay finishes the frame in flight, writes the close frame
//! (a control frame may sit between the fragments of a message, RFC 6455 §5.4), waits a
//! short while for the client's close reply, and closes both connections.
//!
//! ```text
//!  node ──► read ──► FrameTracker::boundary_within(buf) ──► write up to the boundary ──► client
//!                                    ▲                                  │
//!        drain deadline (watch) ─────┘                    close frame 1001 ─┘ then shutdown
//!  client ──► read ──► write ──► node      (stops at the deadline; the node sees its socket close)
//! ```

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;

/// Follows WebSocket frame boundaries in one direction of a tunnel. Sans-io: bytes in,
/// positions out.
#[derive(Debug, Clone, Default)]
pub struct FrameTracker {
    /// Header bytes of the frame being read (at most 14).
    head: [u8; 14],
    have: usize,
    /// Payload bytes still to pass before the next header.
    remaining: u64,
    /// The opcode of the frame being passed.
    opcode: u8,
    /// A whole close frame has passed.
    close_seen: bool,
}

/// The length of a frame header whose first two bytes are `b0 b1`.
fn header_len(b1: u8) -> usize {
    let ext = match b1 & 0x7f {
        126 => 2,
        127 => 8,
        _ => 0,
    };
    let mask = if b1 & 0x80 != 0 { 4 } else { 0 };
    2 + ext + mask
}

impl FrameTracker {
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether a whole close frame (opcode 8) has passed.
    pub fn close_seen(&self) -> bool {
        self.close_seen
    }

    /// Whether the bytes consumed so far end exactly at a frame boundary.
    pub fn at_boundary(&self) -> bool {
        self.have == 0 && self.remaining == 0
    }

    /// Consumes `data` and returns the offset (relative to `data`) just after the first frame
    /// that ends inside it, if one does.
    pub fn consume(&mut self, data: &[u8]) -> Option<usize> {
        let mut first = None;
        let mut i = 0;
        while i < data.len() {
            if self.remaining > 0 {
                let take = usize::try_from(self.remaining)
                    .unwrap_or(usize::MAX)
                    .min(data.len() - i);
                self.remaining -= take as u64;
                i += take;
                if self.remaining == 0 {
                    self.close_seen |= self.opcode == 8;
                    if first.is_none() {
                        first = Some(i);
                    }
                }
                continue;
            }
            // Reading a header.
            self.head[self.have] = data[i];
            self.have += 1;
            i += 1;
            if self.have < 2 || self.have < header_len(self.head[1]) {
                continue;
            }
            let b1 = self.head[1];
            let len = match b1 & 0x7f {
                126 => u64::from(u16::from_be_bytes([self.head[2], self.head[3]])),
                127 => {
                    let mut b = [0u8; 8];
                    b.copy_from_slice(&self.head[2..10]);
                    u64::from_be_bytes(b)
                }
                n => u64::from(n),
            };
            self.have = 0;
            self.remaining = len;
            self.opcode = self.head[0] & 0x0f;
            if len == 0 {
                self.close_seen |= self.opcode == 8;
                if first.is_none() {
                    first = Some(i);
                }
            }
        }
        first
    }

    /// How many bytes of `data` to pass so that the stream stops exactly at a frame boundary:
    /// `Some(0)` when already at one, `None` when the frame in flight ends beyond `data`.
    /// Does not consume.
    pub fn boundary_within(&self, data: &[u8]) -> Option<usize> {
        if self.at_boundary() {
            return Some(0);
        }
        self.clone().consume(data)
    }
}

/// A close frame from a server (unmasked): status 1001 "going away" with a short reason.
pub fn close_frame_going_away(reason: &str) -> Vec<u8> {
    let reason = &reason.as_bytes()[..reason.len().min(123)];
    let mut f = Vec::with_capacity(4 + reason.len());
    f.push(0x88); // FIN + opcode 8 (close)
    f.push((2 + reason.len()) as u8);
    f.extend_from_slice(&1001u16.to_be_bytes());
    f.extend_from_slice(reason);
    f
}

/// Resolves once `rx` turns true; never when its sender is gone without doing so.
pub async fn turned_true(mut rx: watch::Receiver<bool>) {
    if rx.wait_for(|v| *v).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// The close frame's reason for a session ended by its node's state.
pub fn close_reason(r: crate::nodes::EndReason) -> &'static str {
    use crate::nodes::EndReason;
    use limpet_core::RepinReason;
    match r {
        EndReason::Repin(RepinReason::DrainEnded) => "node drain deadline",
        EndReason::Repin(RepinReason::NodeMaint) => "node in maintenance",
        EndReason::Repin(RepinReason::NodeDown) => "node down",
        // The session's requests already go to another node: it moves there whole.
        EndReason::Repin(r) if r.is_failure() => "session moved to another node",
        EndReason::FleetRepin | EndReason::TableMoved => "session moved to another node",
        EndReason::Failback => "session moved home",
        EndReason::Repin(_) => "node gone",
    }
}

/// How a tunnel ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TunnelEnd {
    /// One side closed, or an I/O error.
    Closed,
    /// Nothing moved for the idle timeout, or one direction could not write for it.
    Idle,
    /// The close signal fired: the client got a close frame 1001 (WebSocket) or its
    /// connection was closed.
    Deadline,
}

/// Relays a WebSocket tunnel (`client` <-> `node`, after the 101) until one side closes, the
/// tunnel stops making progress for `idle` (see [`crate::relay`]), or `close` resolves (drain
/// deadline, MAINT, shutdown), in which case the client gets a close frame 1001 at a frame
/// boundary, with the reason `close` resolved to (e.g. "node drain deadline", "limpet
/// shutting down").
pub async fn relay_websocket<C, N>(
    client: C,
    node: N,
    idle: Duration,
    close: impl Future<Output = &'static str>,
) -> TunnelEnd
where
    C: crate::tcp::Io,
    N: crate::tcp::Io,
{
    use crate::relay::{relay, Framing, RelayEnd};
    match relay(client, node, idle, Framing::WebSocket, close).await {
        // (`Unused` only ends a relay that watches its opening, which this one does not.)
        RelayEnd::Done(..) | RelayEnd::Error(_) | RelayEnd::Unused(_) => TunnelEnd::Closed,
        RelayEnd::Idle | RelayEnd::Stalled(_) => TunnelEnd::Idle,
        RelayEnd::Stopped(_) => TunnelEnd::Deadline,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(opcode: u8, fin: bool, masked: bool, len: usize) -> Vec<u8> {
        let mut f = vec![(u8::from(fin) << 7) | opcode];
        let m = if masked { 0x80 } else { 0 };
        match len {
            0..=125 => f.push(m | len as u8),
            126..=65535 => {
                f.push(m | 126);
                f.extend_from_slice(&(len as u16).to_be_bytes());
            }
            _ => {
                f.push(m | 127);
                f.extend_from_slice(&(len as u64).to_be_bytes());
            }
        }
        if masked {
            f.extend_from_slice(&[1, 2, 3, 4]);
        }
        f.extend(std::iter::repeat_n(0xAB, len));
        f
    }

    #[test]
    fn boundaries_of_frames_of_every_length_form() {
        let frames = [
            frame(1, true, false, 0),
            frame(2, true, false, 5),
            frame(1, false, true, 125),
            frame(0, true, false, 126),
            frame(2, true, true, 70_000),
            frame(9, true, false, 3),
        ];
        let stream: Vec<u8> = frames.concat();
        let mut ends = Vec::new();
        let mut acc = 0;
        for f in &frames {
            acc += f.len();
            ends.push(acc);
        }
        // Fed in chunks of every size up to 17, boundaries land exactly at frame ends.
        for chunk in 1..=17 {
            let mut t = FrameTracker::new();
            let mut found = Vec::new();
            let mut off = 0;
            for c in stream.chunks(chunk) {
                let mut rest = c;
                let mut base = off;
                while let Some(b) = t.clone().consume(rest) {
                    if b == 0 {
                        break;
                    }
                    found.push(base + b);
                    t.consume(&rest[..b]);
                    rest = &rest[b..];
                    base += b;
                }
                t.consume(rest);
                off += c.len();
            }
            assert_eq!(found, ends, "chunk {chunk}");
            assert!(t.at_boundary());
        }
    }

    #[test]
    fn boundary_within_reports_the_end_of_the_frame_in_flight() {
        let f = frame(2, true, false, 10);
        let mut t = FrameTracker::new();
        assert_eq!(t.boundary_within(&f), Some(0), "at a boundary already");
        t.consume(&f[..4]);
        assert_eq!(t.boundary_within(&f[4..]), Some(8));
        assert_eq!(t.boundary_within(&f[4..7]), None);
        // Splitting a header across reads.
        let g = frame(2, true, false, 300);
        let mut t = FrameTracker::new();
        t.consume(&g[..1]);
        assert!(!t.at_boundary());
        t.consume(&g[1..3]);
        assert_eq!(t.boundary_within(&g[3..]), Some(g.len() - 3));
    }

    #[test]
    fn a_whole_close_frame_is_noticed() {
        let mut t = FrameTracker::new();
        t.consume(&frame(1, true, true, 3));
        assert!(!t.close_seen());
        let c = frame(8, true, true, 2);
        t.consume(&c[..c.len() - 1]);
        assert!(!t.close_seen(), "not before its last byte");
        t.consume(&c[c.len() - 1..]);
        assert!(t.close_seen());
    }

    #[test]
    fn the_close_frame_is_well_formed() {
        let f = close_frame_going_away("node draining");
        assert_eq!(f[0], 0x88);
        assert_eq!(usize::from(f[1]), f.len() - 2);
        assert_eq!(u16::from_be_bytes([f[2], f[3]]), 1001);
        assert_eq!(&f[4..], b"node draining");
        let long = close_frame_going_away(&"x".repeat(500));
        assert_eq!(
            long.len(),
            2 + 125,
            "control frames carry at most 125 bytes"
        );
    }
}
