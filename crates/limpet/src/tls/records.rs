//! Where a TLS client's records stand on the wire, read under rustls as it reads them:
//! whether one has begun and not ended, and since when.
//!
//! ```text
//!  socket ─► RecordWatch (record headers followed, RecordClock set) ─► rustls ─► hyper
//!                              └─► server::idle_watch: a record begun and unfinished
//! ```
//!
//! rustls gives no plaintext until a record is whole, so a client that trickles a record
//! (an HTTP/2 request head inside it, byte by byte, or a record left unfinished) shows
//! nothing above TLS: an HTTP/2 connection with no stream in flight then counts as idle
//! between requests (`idle`, 60 s) rather than as a head coming (`header_read`, 15 s), which
//! a cleartext one gets from its frame headers (`proxy::client_io::H2Heads`). The record
//! framing is five bytes (type, version, length) before each record's body, in the clear,
//! so following it costs a few comparisons per read and a clock reading only when a read
//! ends inside a record.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The bytes of a TLS record header: content type, protocol version, body length.
const RECORD_HEADER: usize = 5;

/// When the client's record that has begun and not ended began (`crate::clock::now_ms`
/// scale), shared by a connection's [`RecordWatch`] and its idle watch.
#[derive(Debug, Default)]
pub struct RecordClock {
    /// 0 while every record read so far is whole.
    since_ms: AtomicU64,
}

impl RecordClock {
    /// How long the record the client has begun and not finished has been coming, at
    /// `now_ms`; `None` while there is none.
    pub fn open_for(&self, now_ms: u64) -> Option<Duration> {
        let since = self.since_ms.load(Ordering::Relaxed);
        (since != 0).then(|| Duration::from_millis(now_ms.saturating_sub(since)))
    }
}

/// Where the record stream stands between two reads.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Framing {
    /// Bytes of the current record's header read so far (0 between records).
    head_len: usize,
    /// The two length bytes of a header read in part.
    len: [u8; 2],
    /// Body bytes of the current record still to come.
    body_left: usize,
}

impl Framing {
    /// Follows `bytes`, the next ones read. Returns whether a record began in them.
    fn follow(&mut self, bytes: &[u8]) -> bool {
        let mut began = false;
        let mut at = 0;
        while at < bytes.len() {
            if self.body_left > 0 {
                let take = self.body_left.min(bytes.len() - at);
                self.body_left -= take;
                at += take;
                continue;
            }
            if self.head_len == 0 {
                began = true;
                // A whole header in hand (the usual case): read at once.
                if let Some(&[_, _, _, hi, lo]) = bytes.get(at..at + RECORD_HEADER) {
                    self.body_left = usize::from(u16::from_be_bytes([hi, lo]));
                    at += RECORD_HEADER;
                    continue;
                }
            }
            // Content type and version are rustls's to judge; only the length matters here.
            if let Some(len_byte) = self.head_len.checked_sub(3) {
                self.len[len_byte] = bytes[at];
            }
            self.head_len += 1;
            at += 1;
            if self.head_len == RECORD_HEADER {
                self.head_len = 0;
                self.body_left = usize::from(u16::from_be_bytes(self.len));
            }
        }
        began
    }

    /// A record has begun and not ended.
    fn in_record(&self) -> bool {
        self.head_len > 0 || self.body_left > 0
    }
}

/// A client stream under rustls whose record framing is followed into a [`RecordClock`].
/// It changes nothing that is read or written.
#[derive(Debug)]
pub struct RecordWatch<S> {
    inner: S,
    framing: Framing,
    clock: Arc<RecordClock>,
    /// Whether the framing is followed: from the start, and past the handshake only for a
    /// connection that speaks HTTP/2 ([`RecordWatch::unwatched`]).
    watched: bool,
}

impl<S> RecordWatch<S> {
    pub fn new(inner: S, clock: Arc<RecordClock>) -> Self {
        RecordWatch {
            inner,
            framing: Framing::default(),
            clock,
            watched: true,
        }
    }

    /// The framing is followed no more (a connection that did not negotiate HTTP/2 by ALPN:
    /// an HTTP/1 connection's idle limit runs from its last answer whatever its client
    /// sends, and only HTTP/2 reads the clock; an HTTP/2 client over TLS without ALPN, which
    /// RFC 9113 does not allow, is left to `idle`), and the clock reads none begun. Following it cost an HTTP/1.1 request over TLS about 1 % of
    /// its instructions (callgrind, `https`), for nothing.
    pub fn unwatched(&mut self) {
        self.watched = false;
        self.clock.since_ms.store(0, Ordering::Relaxed);
    }

    fn follow(&mut self, bytes: &[u8]) {
        let was_in = self.framing.in_record();
        let began = self.framing.follow(bytes);
        if self.framing.in_record() {
            // A record that began in these bytes is the one still coming (any that began
            // before it ended in them): its clock starts now.
            if began || !was_in {
                self.clock
                    .since_ms
                    .store(crate::clock::now_ms().max(1), Ordering::Relaxed);
            }
        } else if was_in || began {
            self.clock.since_ms.store(0, Ordering::Relaxed);
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for RecordWatch<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if this.watched {
            if let Poll::Ready(Ok(())) = polled {
                let new = &buf.filled()[before..];
                if !new.is_empty() {
                    this.follow(new);
                }
            }
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for RecordWatch<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<S: crate::tcp::Io> crate::tcp::Io for RecordWatch<S> {
    fn poll_write_last(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_last(cx, buf)
    }

    fn abort_on_close(&self) {
        self.inner.abort_on_close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(body: usize) -> Vec<u8> {
        let len = u16::try_from(body).expect("a record's body fits u16");
        let mut r = vec![23, 3, 3];
        r.extend_from_slice(&len.to_be_bytes());
        r.extend(std::iter::repeat_n(0xab, body));
        r
    }

    #[test]
    fn whole_records_leave_nothing_open_however_they_are_cut() {
        let mut wire = record(100);
        wire.extend(record(0));
        wire.extend(record(16_401));
        for cut in [1, 2, 3, 4, 5, 6, 7, 104, 105, 110, 7000] {
            let mut f = Framing::default();
            for piece in wire.chunks(cut) {
                f.follow(piece);
            }
            assert!(!f.in_record(), "cut every {cut} bytes");
        }
    }

    #[test]
    fn a_record_is_open_from_its_first_header_byte_to_its_last_body_byte() {
        let wire = record(10);
        let mut f = Framing::default();
        assert!(f.follow(&wire[..1]), "a record begins at its first byte");
        assert!(f.in_record());
        assert!(!f.follow(&wire[1..5]), "the same record goes on");
        assert!(f.in_record(), "its header is whole, its body to come");
        f.follow(&wire[5..14]);
        assert!(f.in_record(), "one body byte still to come");
        f.follow(&wire[14..]);
        assert!(!f.in_record());
    }

    #[tokio::test]
    async fn the_clock_runs_while_a_record_is_unfinished_and_stops_when_it_ends() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let clock = Arc::new(RecordClock::default());
        let mut watch = RecordWatch::new(server, Arc::clone(&clock));
        let mut buf = vec![0u8; 64 * 1024];
        let first = record(20);
        let second = record(30);
        // One whole record and the start of the next in one read.
        let mut wire = first.clone();
        wire.extend_from_slice(&second[..3]);
        client.write_all(&wire).await.expect("write");
        let n = watch.read(&mut buf).await.expect("read");
        assert_eq!(&buf[..n], &wire[..], "what is read is what came");
        let now = crate::clock::now_ms();
        assert!(clock.open_for(now).is_some(), "the second record is open");
        client.write_all(&second[3..]).await.expect("write");
        let n = watch.read(&mut buf).await.expect("read");
        assert_eq!(&buf[..n], &second[3..]);
        assert_eq!(clock.open_for(now), None, "every record read is whole");

        // Unwatched (an HTTP/1 connection): a record left unfinished sets no clock.
        watch.unwatched();
        client.write_all(&second[..3]).await.expect("write");
        let n = watch.read(&mut buf).await.expect("read");
        assert_eq!(&buf[..n], &second[..3]);
        assert_eq!(clock.open_for(crate::clock::now_ms()), None);
    }
}
