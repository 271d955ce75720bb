//! The byte stream of an HTTP client connection as hyper sees it: the accepted stream (TLS
//! or not) under the write deadline, with three changes to when reads and writes reach the
//! socket and one watch on what an HTTP/2 client sends. None changes what is read or written. It also outlives hyper's HTTP/1
//! connection when an idle one is parked (`server`): its shutdown is then only a flush
//! ([`StreamHints`]), [`ClientIo::wait_for_bytes`] waits for the client with nothing
//! allocated, and what hyper had read but not parsed is put back in front.
//!
//! ```text
//!  ClientIo::opens_http2 (first bytes, READ_AHEAD) ─► hyper http1 (with upgrades) | http2
//!    └─► ClientIo: first bytes read again from memory · each write after this turn's ready tasks
//!          └─► relay::WriteDeadline (client_idle) ─► the accepted stream
//!  parked: ClientIo::wait_for_bytes ─► a new hyper http1 connection on the same ClientIo
//! ```
//!
//! - **The first bytes are read once, whole.** Whether a connection speaks HTTP/2 by prior
//!   knowledge or HTTP/1.1 is told by its first bytes ([`ClientIo::opens_http2`]), read
//!   [`READ_AHEAD`] at a time (into the stack, then kept at the size that came, so a client
//!   that has sent nothing holds no buffer) and then read again by hyper from memory.
//!   hyper-util's `auto` builder, which limpet used before, reads exactly the 24 bytes of
//!   the HTTP/2 preface and hands them to hyper alone, so hyper's HTTP/1 read buffer took 24
//!   bytes, then had to grow (a reallocation and an 8 KiB copy) to read the rest of the
//!   head: on every connection, which a `Connection: close` client pays on every request.
//!   Here hyper's first read takes the whole head. Measured: `recvfrom` 3.05 -> 2.01 per `close` request when the
//!   read ahead came in (strace); choosing hyper's server here instead of through `auto` took a
//!   `close` request from 52,182 to 49,048 instructions and 32.4 to 30.3 allocations
//!   (callgrind, with `headers::forwarded_for`'s own IPv4 text), the reallocation having been
//!   3.8% of them.
//! - **Answers go out at the end of the event-loop turn.** Each write first yields once, so
//!   it runs after the tasks that are ready now, and one turn's answers leave together. The
//!   load tool and the nodes sleep whenever they run out of work, and waking a sleeping
//!   process on another core costs the waker a cross-CPU wake-up (an IPI, a VM exit on a
//!   virtual machine): answers written one by one as each node answers wake the client again
//!   and again, written together once. HAProxy gets this from its structure (its I/O
//!   callbacks run first, its stream tasks and their sends after them). Measured
//!   (`bench/cost.sh --only limpet --events sched:sched_waking,ipi:ipi_send_cpu`, two
//!   alternating runs each): processes woken per request 0.14 -> 0.09 on `sticky` and 0.27
//!   -> 0.15 on `plain`, system CPU per request 5% lower, requests/s 4% (`sticky`) and 6%
//!   (`plain`) higher. Holding back writes to nodes the same way gained nothing.
//! - **HTTP/2 request heads are watched, not changed.** The frame headers of what the client
//!   sends are read as hyper reads them ([`H2Heads`]), so that a request head begun and not
//!   finished is given `header_read` (`server::idle_watch`): h2 shows no request until its
//!   head is whole.
//! - **A connection's last answer leaves with its FIN.** When the service says the answer
//!   it returns is the connection's last and whole in hand
//!   ([`StreamHints::set_last_answer`]), its bytes are written to wait for the shutdown that
//!   follows, and leave in one segment with the FIN.
//!
//! Every write yields once before it goes through (the attempt after the yield writes), so a
//! long answer costs one extra task poll per write, and a write that found the socket full
//! yields once more when it is woken. A connection's very first write does not yield:
//! `Connection: close` has nothing to batch it with, and the yield cost 3-4% of its
//! requests/s. This sits outside the write deadline, so a yield is never taken for a blocked
//! write. Writes are batched only on a current-thread runtime (limpet's workers and main
//! runtime), where it was measured; under tokio's multi-threaded runtime (the demo) a task
//! that wakes itself may also wake a parked worker, the very cost this avoids, so there
//! writes go straight out.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::tcp::{Io, Prefixed};

/// How much the read that tells the protocol takes: a whole request head of a typical client
/// (curl and load tools send about 100 bytes, browsers up to a few KiB); hyper reads the rest
/// of a larger head as usual.
const READ_AHEAD: usize = 4 * 1024;

/// What a client with HTTP/2 prior knowledge sends first (RFC 9113 section 3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Whether batching writes pays on the runtime this runs on: a current-thread one (see the
/// module doc).
pub(crate) fn batching_pays() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread)
}

/// What a connection's service tells its stream about the writes to come. It lives in the
/// connection's `ConnCtx` and reaches the stream through [`HintsRef`], so no connection
/// allocates it.
#[derive(Debug, Default)]
pub(crate) struct StreamHints {
    /// Set while an idle HTTP/1 connection is being parked: hyper's connection is asked to
    /// close so that it gives its buffers back, and the close it then makes must not reach
    /// the socket ([`ClientIo`]'s shutdown only flushes while it is set).
    parking: AtomicBool,
    /// Set when the answer hyper writes next is the connection's last and whole in hand (see
    /// [`StreamHints::set_last_answer`]).
    last_answer: AtomicBool,
    /// Set once hyper will close the connection after an answer, whatever its body (see
    /// [`StreamHints::set_closing`]).
    closing: AtomicBool,
    /// Set once hyper holds an upgrade prepared for one of the connection's requests (see
    /// [`StreamHints::set_upgrade_held`]).
    upgrade_held: AtomicBool,
    /// HTTP/2: when the request head the client has begun and not finished began (`now_ms`
    /// scale), 0 while none is: see [`H2Heads`].
    head_since_ms: AtomicU64,
    /// HTTP/2: bytes written to the client so far (a shutdown tells a client still taking
    /// an answer's last bytes from one that stopped answering: `server::run_connection`).
    written: AtomicU64,
}

impl StreamHints {
    pub(crate) fn set_parking(&self, on: bool) {
        self.parking.store(on, Ordering::Relaxed);
    }

    fn parking(&self) -> bool {
        self.parking.load(Ordering::Relaxed)
    }

    /// The answer hyper writes next is the connection's last (hyper closes after it) and all
    /// of it is in hand, so hyper writes it and shuts the stream down in one go. Its bytes then
    /// go out with [`crate::tcp::Io::poll_write_last`]: on a plain TCP socket the kernel
    /// holds them (`MSG_MORE`) until the shutdown, and they leave in one segment with the
    /// FIN. A `Connection: close` request then costs two segments fewer, the separate FIN
    /// and the client's ACK of the answer (`nstat` `TcpOutSegs`: 11.0 -> 9.0 per request).
    ///
    /// Only for an answer whole in hand: the bytes of an answer still streaming would wait
    /// in the kernel for the shutdown, however long the rest takes to come (until a probe
    /// timer, some 200 ms, pushes them). An answer of more than [`crate::tcp::COALESCE_MAX`]
    /// that hyper writes in slices goes out as it is, its FIN apart. Never cleared: the
    /// connection is closing, and is never parked once this is set (`server::park_watch`).
    pub(crate) fn set_last_answer(&self) {
        self.last_answer.store(true, Ordering::Relaxed);
    }

    pub(crate) fn last_answer(&self) -> bool {
        self.last_answer.load(Ordering::Relaxed)
    }

    /// The connection ends after the answer in flight: the client asked for it
    /// (`Connection: close`, HTTP/1.0 without keep-alive), the answer says so (limpet's own
    /// answers to a request whose framing it does not trust), or limpet answered without
    /// reading the request's body (hyper may close rather than read it through; should it
    /// read the body through and keep the connection, the next request clears the hint). Such a connection is never parked (`server::park_watch`),
    /// whether or not its answer was whole in hand ([`StreamHints::set_last_answer`]):
    /// parked while its last write waited on a slow client, its close only flushed and the
    /// socket was kept, so an HTTP/1.0 client waited for the end of an answer delimited by
    /// the close, a `Connection: close` was not honoured, and the bytes after a request
    /// answered 400 for its framing were read as a new request. Cleared when a request
    /// comes ([`StreamHints::request_came`]).
    pub(crate) fn set_closing(&self) {
        self.closing.store(true, Ordering::Relaxed);
    }

    /// A request came on the connection: hyper did not close it after the one before.
    pub(crate) fn request_came(&self) {
        self.closing.store(false, Ordering::Relaxed);
    }

    pub(crate) fn closing(&self) -> bool {
        self.closing.load(Ordering::Relaxed)
    }

    /// hyper prepared an upgrade for one of the connection's requests (an HTTP/1.1 request
    /// with `Upgrade`, or CONNECT), and keeps it after an answer other than 101 (a refused
    /// WebSocket, an `h2c` offer limpet dropped) until the connection ends: parked, the
    /// connection would be handed to that upgrade, whose receiver is gone, rather than
    /// back, and dropped under a client that keeps it alive. Such a connection is never
    /// parked (`server::park_watch`); it keeps hyper's buffers while idle. Never cleared.
    pub(crate) fn set_upgrade_held(&self) {
        self.upgrade_held.store(true, Ordering::Relaxed);
    }

    pub(crate) fn upgrade_held(&self) -> bool {
        self.upgrade_held.load(Ordering::Relaxed)
    }

    /// HTTP/2: how long the request head the client has begun and not finished has been
    /// coming, at `now_ms`; `None` while there is none.
    pub(crate) fn head_open_for(&self, now_ms: u64) -> Option<std::time::Duration> {
        let since = self.head_since_ms.load(Ordering::Relaxed);
        (since != 0).then(|| std::time::Duration::from_millis(now_ms.saturating_sub(since)))
    }

    /// HTTP/2: the bytes written to the client so far.
    pub(crate) fn written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }

    fn set_head_since(&self, ms: u64) {
        self.head_since_ms.store(ms, Ordering::Relaxed);
    }
}

/// HTTP/2: where the client's frames stand, read as hyper reads them, to tell whether a
/// request head has begun and not ended: a HEADERS or CONTINUATION frame not whole yet, or a
/// header block whose END_HEADERS has not come. h2 keeps such a head to itself until it is
/// whole, so no request is in flight and the connection would count as idle between
/// requests (`idle`, 60 s) while the head trickles or stalls; the failure model gives a
/// request head `header_read`, on every stream (`server::idle_watch` reads it here). A frame
/// of a head counts from its type byte: the three length bytes before it could begin any
/// frame, and a DATA frame's stall is the request body's timeout (`client_idle`), not this.
///
/// Only frame headers are read (9 bytes a frame, the payloads skipped), and the clock only
/// when a read ends inside a head, which a client sending whole frames never does.
#[derive(Debug)]
pub(crate) struct H2Heads {
    /// Bytes of the connection preface still to pass (it is no frame).
    preface_left: usize,
    /// The header of the frame being read, `have` bytes of it so far.
    head: [u8; 9],
    have: usize,
    /// Payload bytes of the current frame still to pass.
    left: usize,
    /// The current frame is part of a request head (HEADERS or CONTINUATION).
    in_head_frame: bool,
    /// A header block has begun without its END_HEADERS.
    block_open: bool,
    /// What the hints say now: a head was open at the end of the last read.
    marked: bool,
    /// No head was open at some point of the last read: a head open at its end began in it
    /// (one head ended and the next began in one read), so its clock starts again.
    gap: bool,
}

impl Default for H2Heads {
    fn default() -> Self {
        H2Heads {
            preface_left: H2_PREFACE.len(),
            head: [0; 9],
            have: 0,
            left: 0,
            in_head_frame: false,
            block_open: false,
            marked: false,
            gap: false,
        }
    }
}

impl H2Heads {
    const HEADERS: u8 = 0x1;
    const CONTINUATION: u8 = 0x9;
    const END_HEADERS: u8 = 0x4;

    /// Takes the next bytes the client sent, in order.
    fn feed(&mut self, mut bytes: &[u8]) {
        let skip = self.preface_left.min(bytes.len());
        self.preface_left -= skip;
        bytes = bytes.get(skip..).unwrap_or_default();
        self.gap = !self.open();
        while !bytes.is_empty() {
            if self.left > 0 {
                let n = self.left.min(bytes.len());
                self.left -= n;
                bytes = bytes.get(n..).unwrap_or_default();
                if self.left == 0 {
                    self.in_head_frame = false;
                    self.gap |= !self.open();
                }
                continue;
            }
            let n = (self.head.len() - self.have).min(bytes.len());
            if let (Some(to), Some(from)) =
                (self.head.get_mut(self.have..self.have + n), bytes.get(..n))
            {
                to.copy_from_slice(from);
            }
            self.have += n;
            bytes = bytes.get(n..).unwrap_or_default();
            if self.have < self.head.len() {
                break;
            }
            self.have = 0;
            let [l0, l1, l2, kind, flags, ..] = self.head;
            let len = usize::from(l0) << 16 | usize::from(l1) << 8 | usize::from(l2);
            if Self::is_head(kind) {
                self.block_open = flags & Self::END_HEADERS == 0;
                self.in_head_frame = len > 0;
            }
            self.left = len;
            self.gap |= !self.open();
        }
    }

    /// A request head has begun and not ended (a frame of it, or its block, unfinished). A
    /// frame counts from its type byte, the fourth of its header.
    fn open(&self) -> bool {
        self.block_open || self.in_head_frame || (self.have >= 4 && Self::is_head(self.head[3]))
    }

    fn is_head(kind: u8) -> bool {
        kind == Self::HEADERS || kind == Self::CONTINUATION
    }
}

/// What holds a connection's [`StreamHints`] (its `ConnCtx`): shared with the stream, so no
/// connection allocates them.
pub(crate) type HintsRef = Arc<dyn AsRef<StreamHints> + Send + Sync>;

/// An HTTP client connection's stream: first read whole, writes at the end of the turn (see
/// the module doc).
pub(crate) struct ClientIo<S> {
    /// The stream, with the first bytes ([`ClientIo::opens_http2`]) put back in front of it.
    io: Prefixed<S>,
    /// Writes wait for the end of the turn (see the module doc).
    batch_writes: bool,
    /// This write has yielded once already (or is the connection's first): the next attempt
    /// goes through.
    yielded: bool,
    /// What the connection's service tells the stream: while parking, a shutdown only
    /// flushes; the last answer's bytes are written to leave with the FIN; HTTP/2, when a
    /// request head began that has not ended.
    hints: Option<HintsRef>,
    /// HTTP/2: the request heads in the client's frames ([`ClientIo::watch_h2_heads`]).
    heads: Option<H2Heads>,
}

impl<S> std::fmt::Debug for ClientIo<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientIo")
            .field("batch_writes", &self.batch_writes)
            .field("yielded", &self.yielded)
            .finish_non_exhaustive()
    }
}

impl<S> ClientIo<S> {
    /// `batch_writes`: hold writes to the end of the turn (only on a current-thread runtime,
    /// see [`batching_pays`]).
    pub(crate) fn new(inner: S, batch_writes: bool) -> Self {
        ClientIo {
            io: Prefixed::new(Vec::new(), inner),
            batch_writes,
            yielded: true,
            hints: None,
            heads: None,
        }
    }

    /// HTTP/2: from its first bytes on (the preface included), tells the hints when a
    /// request head has begun and not ended ([`H2Heads`]).
    pub(crate) fn watch_h2_heads(mut self) -> Self {
        self.heads = Some(H2Heads::default());
        self
    }

    /// Reads `bytes` (just read by hyper) for request heads, and tells the hints when one
    /// opens or ends.
    fn saw(&mut self, bytes: &[u8]) {
        let Some(heads) = self.heads.as_mut() else {
            return;
        };
        heads.feed(bytes);
        let open = heads.open();
        // A head open before and after this read is the same head only if none ended in it.
        if open == heads.marked && !(open && heads.gap) {
            return;
        }
        heads.marked = open;
        if let Some(h) = &self.hints {
            (**h)
                .as_ref()
                .set_head_since(if open { crate::clock::now_ms() } else { 0 });
        }
    }

    /// The hints of the connection's service (see [`StreamHints`]).
    pub(crate) fn with_hints(mut self, hints: HintsRef) -> Self {
        self.hints = Some(hints);
        self
    }

    fn hinted(&self, hint: fn(&StreamHints) -> bool) -> bool {
        self.hints.as_ref().is_some_and(|h| hint((**h).as_ref()))
    }

    /// Puts back what hyper had read but not parsed when it let the connection go (a head
    /// that had only begun to come): it is read again first.
    pub(crate) fn put_back(&mut self, bytes: Vec<u8>) {
        self.io.put_back(bytes);
    }

    /// HTTP/2: counts what a write took into the hints' `written`.
    fn count_written(&self, r: &Poll<io::Result<usize>>) {
        if let (Some(_), Some(h), Poll::Ready(Ok(n))) = (&self.heads, &self.hints, r) {
            (**h)
                .as_ref()
                .written
                .fetch_add(*n as u64, Ordering::Relaxed);
        }
    }

    /// `Pending` (the task woken at once, so it runs again after the other ready tasks) the
    /// first time; `Ready` the time after.
    fn poll_turn_end(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if !self.batch_writes || self.yielded {
            self.yielded = false;
            Poll::Ready(())
        } else {
            self.yielded = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }
}

impl<S: AsyncRead + Unpin> ClientIo<S> {
    /// Reads the connection's first bytes and tells whether they open HTTP/2 by prior
    /// knowledge (the preface) or not (HTTP/1.1). Reads until the bytes have told: mostly
    /// once, [`READ_AHEAD`] at a time; a stream that ends first is HTTP/1.1 (hyper then sees
    /// its bytes and its end). Every byte read is read again through `poll_read`, first.
    /// Cancel-safe in effect: the connection is dropped if this is.
    pub(crate) async fn opens_http2(&mut self) -> io::Result<bool> {
        loop {
            let more = self.wait_for_bytes().await?;
            let first = self.io.unread();
            let seen = first.len().min(H2_PREFACE.len());
            if first.get(..seen) != H2_PREFACE.get(..seen) {
                return Ok(false);
            }
            if seen == H2_PREFACE.len() {
                return Ok(true);
            }
            if !more {
                return Ok(false);
            }
        }
    }

    /// Waits for the client's next bytes: `true` once it has sent some (they are read again
    /// through `poll_read`, after any put back), `false` once it has ended its stream.
    /// Nothing is allocated while it waits: the read goes into the stack, [`READ_AHEAD`] at
    /// most, and only the bytes that came are kept. The first bytes of a connection
    /// ([`ClientIo::opens_http2`]) and a parked connection's next ones are read this way, so
    /// a client that sends nothing holds no buffer.
    pub(crate) async fn wait_for_bytes(&mut self) -> io::Result<bool> {
        std::future::poll_fn(|cx| {
            // Not zeroed first: a read fills only what it reports (4 KiB of zeroes per
            // connection were 4,000 instructions of a `Connection: close` request).
            let mut stack = [std::mem::MaybeUninit::<u8>::uninit(); READ_AHEAD];
            let mut buf = ReadBuf::uninit(&mut stack);
            std::task::ready!(Pin::new(self.io.get_mut()).poll_read(cx, &mut buf))?;
            if buf.filled().is_empty() {
                return Poll::Ready(Ok(false));
            }
            self.io.append(buf.filled());
            Poll::Ready(Ok(true))
        })
        .await
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for ClientIo<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = out.filled().len();
        std::task::ready!(Pin::new(&mut self.io).poll_read(cx, out))?;
        if self.heads.is_some() {
            self.saw(out.filled().get(before..).unwrap_or_default());
        }
        Poll::Ready(Ok(()))
    }
}

// An upgraded connection's stream is relayed as a TCP session's is
// ([`super::upgrade`]): cut, its socket is reset.
impl<S: Io> Io for ClientIo<S> {
    fn abort_on_close(&self) {
        self.io.abort_on_close();
    }
}

impl<S: Io> AsyncWrite for ClientIo<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        std::task::ready!(self.poll_turn_end(cx));
        let last = self.hinted(StreamHints::last_answer);
        let io = Pin::new(&mut self.io);
        let r = if last {
            io.poll_write_last(cx, buf)
        } else {
            io.poll_write(cx, buf)
        };
        self.count_written(&r);
        r
    }

    /// The last answer's slices are written as one, when they are small enough to be copied
    /// together ([`crate::tcp::as_one_write`]), so that all of them wait for the FIN.
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        std::task::ready!(self.poll_turn_end(cx));
        let last = self.hinted(StreamHints::last_answer);
        let mut io = Pin::new(&mut self.io);
        let r = match last
            .then(|| crate::tcp::as_one_write(bufs, |one| io.as_mut().poll_write_last(cx, one)))
            .flatten()
        {
            Some(r) => r,
            None => io.poll_write_vectored(cx, bufs),
        };
        self.count_written(&r);
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.hinted(StreamHints::parking) {
            return Pin::new(&mut self.io).poll_flush(cx);
        }
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::Mutex;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// A stream over scripted read chunks (one per read; `None` is a pending read) that
    /// counts the reads that reached it, and notes each write in a shared log.
    struct Scripted {
        chunks: VecDeque<Option<Vec<u8>>>,
        reads: usize,
        log: Log,
    }

    /// What happened to a [`Scripted`] stream, in order.
    #[derive(Clone, Default)]
    struct Log(Arc<Mutex<Vec<String>>>);

    impl Log {
        fn note(&self, what: String) {
            self.0.lock().expect("log").push(what);
        }

        /// Notes a write as `what` with its bytes, and takes them all.
        fn wrote(&self, what: &str, buf: &[u8]) -> Poll<io::Result<usize>> {
            self.note(format!("{what} {}", String::from_utf8_lossy(buf)));
            Poll::Ready(Ok(buf.len()))
        }

        fn seen(&self) -> Vec<String> {
            self.0.lock().expect("log").clone()
        }
    }

    fn scripted(c: &[Option<&[u8]>]) -> Scripted {
        Scripted {
            chunks: c.iter().map(|c| c.map(<[u8]>::to_vec)).collect(),
            reads: 0,
            log: Log::default(),
        }
    }

    impl AsyncRead for Scripted {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            out: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            self.reads += 1;
            match self.chunks.pop_front() {
                Some(Some(c)) => {
                    let n = c.len().min(out.remaining());
                    out.put_slice(&c[..n]);
                    if n < c.len() {
                        self.chunks.push_front(Some(c[n..].to_vec()));
                    }
                    Poll::Ready(Ok(()))
                }
                Some(None) => {
                    cx.waker().wake_by_ref();
                    Poll::Pending
                }
                None => Poll::Ready(Ok(())),
            }
        }
    }

    impl AsyncWrite for Scripted {
        fn poll_write(
            self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.log.wrote("write", buf)
        }
        fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.log.note("flush".to_owned());
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.log.note("shutdown".to_owned());
            Poll::Ready(Ok(()))
        }
    }

    impl Io for Scripted {
        fn poll_write_last(
            self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.log.wrote("write last", buf)
        }
    }

    /// Tells the protocol, then reads with `sizes` (cycled) until EOF, as hyper would;
    /// returns whether it was HTTP/2, the bytes, and the reads that reached the inner stream.
    async fn tell_then_read_all(
        mut r: ClientIo<Scripted>,
        sizes: &[usize],
    ) -> (bool, Vec<u8>, usize) {
        let h2 = r.opens_http2().await.expect("first bytes");
        let mut got = Vec::new();
        for k in 0.. {
            let mut buf = vec![0u8; sizes[k % sizes.len()]];
            let n = r.read(&mut buf).await.expect("read");
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        (h2, got, r.io.get_ref().reads)
    }

    #[tokio::test]
    async fn an_http1_head_is_told_and_read_again_from_one_read() {
        let head = b"GET / HTTP/1.1\r\nHost: a\r\nUser-Agent: wrk\r\n\r\n";
        let r = ClientIo::new(scripted(&[Some(head)]), true);
        let (h2, got, reads) = tell_then_read_all(r, &[8192]).await;
        assert!(!h2);
        assert_eq!(got, head, "hyper's first read gets the whole head");
        assert_eq!(reads, 2, "one read for the whole head, one for the EOF");
    }

    #[tokio::test]
    async fn a_preface_split_over_reads_is_http2_and_nothing_is_lost() {
        let mut sent = H2_PREFACE.to_vec();
        sent.extend_from_slice(b"\0\0\0\x04\0\0\0\0\0");
        let r = ClientIo::new(
            scripted(&[
                Some(&sent[..3]),
                None,
                Some(&sent[3..20]),
                Some(&sent[20..]),
            ]),
            true,
        );
        let (h2, got, _) = tell_then_read_all(r, &[100]).await;
        assert!(h2);
        assert_eq!(got, sent);
    }

    #[tokio::test]
    async fn a_head_that_starts_like_the_preface_is_http1() {
        let head = b"PRI * HTTP/1.1\r\n\r\n";
        let r = ClientIo::new(scripted(&[Some(&head[..5]), Some(&head[5..])]), true);
        let (h2, got, _) = tell_then_read_all(r, &[8192]).await;
        assert!(!h2);
        assert_eq!(got, head);
    }

    #[tokio::test]
    async fn an_end_before_anything_or_mid_preface_is_http1_with_the_bytes_kept() {
        let r = ClientIo::new(scripted(&[]), true);
        let (h2, got, _) = tell_then_read_all(r, &[8192]).await;
        assert!(!h2);
        assert!(got.is_empty());
        let r = ClientIo::new(scripted(&[Some(b"PRI * HT")]), true);
        let (h2, got, _) = tell_then_read_all(r, &[8192]).await;
        assert!(!h2);
        assert_eq!(got, b"PRI * HT");
    }

    #[tokio::test]
    async fn more_than_the_read_ahead_loses_nothing() {
        let big: Vec<u8> = (0..READ_AHEAD * 2 + 7).map(|i| (i % 251) as u8).collect();
        let r = ClientIo::new(scripted(&[None, Some(&big), Some(b"tail")]), true);
        let (h2, got, _) = tell_then_read_all(r, &[100, 8192]).await;
        assert!(!h2);
        let mut want = big.clone();
        want.extend_from_slice(b"tail");
        assert_eq!(got, want);
    }

    /// A parked connection's wait: bytes put back (what hyper had not parsed) come first,
    /// the client's next bytes behind them; an end of stream reads as `false`.
    #[tokio::test]
    async fn a_parked_wait_keeps_what_was_put_back_in_front_of_what_comes() {
        let mut r = ClientIo::new(scripted(&[None, Some(b"ond HTTP/1.1\r\n\r\n")]), true);
        r.put_back(b"GET /sec".to_vec());
        assert!(
            r.wait_for_bytes().await.expect("wait"),
            "the client sent more"
        );
        let mut got = vec![0u8; 64];
        let n = r.read(&mut got).await.expect("read");
        assert_eq!(&got[..n], b"GET /second HTTP/1.1\r\n\r\n");
        assert!(
            !r.wait_for_bytes().await.expect("wait"),
            "then ended its stream"
        );
    }

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = u32::try_from(payload.len()).expect("small");
        let mut f = len.to_be_bytes()[1..].to_vec();
        f.push(kind);
        f.push(flags);
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    /// `bytes` fed to a tracker in pieces of `size`: whether a head was open after each.
    fn open_after_each(bytes: &[u8], size: usize) -> Vec<bool> {
        let mut heads = H2Heads::default();
        bytes
            .chunks(size)
            .map(|c| {
                heads.feed(c);
                heads.open()
            })
            .collect()
    }

    /// A head is open from its HEADERS frame's type byte to the end of the frame that
    /// carries END_HEADERS, however the bytes are cut; the preface, SETTINGS, PING, DATA
    /// and WINDOW_UPDATE never open one.
    #[test]
    fn a_request_head_is_open_from_its_type_byte_to_its_end_headers() {
        let mut conn = H2_PREFACE.to_vec();
        conn.extend(frame(4, 0, 0, &[]));
        conn.extend(frame(6, 0, 0, &[0; 8]));
        assert!(
            !open_after_each(&conn, 1).into_iter().any(|o| o),
            "no head in the preface, SETTINGS or PING"
        );
        // HEADERS without END_HEADERS, then a CONTINUATION with it, then a DATA frame.
        let headers_at = conn.len();
        conn.extend(frame(1, 0, 1, &[0x82, 0x86]));
        let continuation_at = conn.len();
        conn.extend(frame(9, 0x4, 1, &[0x84]));
        let done_at = conn.len();
        conn.extend(frame(0, 0x1, 1, b"body"));
        conn.extend(frame(8, 0, 0, &[0, 0, 1, 0]));
        let open = open_after_each(&conn, 1);
        for (i, o) in open.iter().enumerate() {
            let want = (headers_at + 3..done_at - 1).contains(&i);
            assert_eq!(*o, want, "after byte {i} (HEADERS at {headers_at}, CONTINUATION at {continuation_at}, END_HEADERS whole at {done_at})");
        }
        // Whole frames in one read each: open only between the two frames of the block.
        let mut heads = H2Heads::default();
        heads.feed(&conn[..continuation_at]);
        assert!(heads.open(), "block open after HEADERS without END_HEADERS");
        heads.feed(&conn[continuation_at..]);
        assert!(!heads.open(), "closed by the CONTINUATION's END_HEADERS");
        // A HEADERS frame with END_HEADERS, cut in its payload, is open until it is whole.
        let mut heads = H2Heads::default();
        let mut one = H2_PREFACE.to_vec();
        one.extend(frame(1, 0x5, 1, &[0x82, 0x86, 0x84]));
        heads.feed(&one[..one.len() - 1]);
        assert!(heads.open(), "a HEADERS frame not whole is an open head");
        heads.feed(&one[one.len() - 1..]);
        assert!(!heads.open(), "whole with END_HEADERS: closed");
    }

    /// Any bytes at all, a frame claiming 16 MiB included, are taken without a panic, and a
    /// frame's payload is skipped by its length, never read as frames.
    #[test]
    fn any_bytes_are_taken_and_payloads_skipped() {
        let mut heads = H2Heads::default();
        heads.feed(H2_PREFACE);
        // A DATA frame whose payload looks like an open HEADERS frame.
        heads.feed(&frame(0, 0, 1, &frame(1, 0, 3, &[1, 2, 3])));
        assert!(!heads.open(), "a payload is not read as frames");
        heads.feed(&[0xff, 0xff, 0xff, 1, 0, 0, 0, 0, 5]);
        heads.feed(&[0xab; 4096]);
        assert!(heads.open(), "inside a 16 MiB HEADERS frame");
        let mut junk = H2Heads::default();
        for b in 0..=255u8 {
            junk.feed(&[b; 37]);
        }
        let _ = junk.open();
    }

    /// The hints learn when a head opens (the clock of the moment) and when it ends, from
    /// the bytes hyper reads through the stream.
    #[tokio::test(start_paused = true)]
    async fn the_hints_know_how_long_a_head_has_been_open() {
        let mut bytes = H2_PREFACE.to_vec();
        bytes.extend(frame(4, 0, 0, &[]));
        let head = frame(1, 0x5, 1, &[0x82, 0x86, 0x84]);
        bytes.extend(&head[..5]);
        let stream = scripted(&[Some(&bytes), None, Some(&head[5..])]);
        let (io, hints) = hinted(stream);
        let mut io = io.watch_h2_heads();
        let mut buf = vec![0u8; 256];
        let n = io.read(&mut buf).await.expect("read");
        assert_eq!(n, bytes.len());
        let t0 = crate::clock::now_ms();
        assert_eq!(
            hints.0.head_open_for(t0),
            Some(std::time::Duration::ZERO),
            "open as the read ended inside the HEADERS frame"
        );
        assert_eq!(
            hints.0.head_open_for(t0 + 700),
            Some(std::time::Duration::from_millis(700))
        );
        let n = io.read(&mut buf).await.expect("read");
        assert_eq!(n, head.len() - 5);
        assert_eq!(hints.0.head_open_for(t0 + 700), None, "whole: no head open");
    }

    /// Heads sent back to back, each read ending inside the next: each head's clock starts
    /// in the read that began it. Before, the clock ran from the first head of the run (the
    /// state read "open" after every read), so a slow link sending large heads one after
    /// the other was closed as a slowloris `header_read` after the first, though no head
    /// took long.
    #[tokio::test(start_paused = true)]
    async fn a_head_that_begins_in_the_read_that_ends_another_has_its_own_clock() {
        let mut bytes = H2_PREFACE.to_vec();
        bytes.extend(frame(4, 0, 0, &[]));
        let first = frame(1, 0x5, 1, &[0x82, 0x86, 0x84]);
        let second = frame(1, 0x5, 3, &[0x82, 0x86, 0x84]);
        bytes.extend(&first[..5]);
        let mut next = first[5..].to_vec();
        next.extend(&second[..5]);
        let stream = scripted(&[Some(&bytes), Some(&next), Some(&second[5..7])]);
        let (io, hints) = hinted(stream);
        let mut io = io.watch_h2_heads();
        let mut buf = vec![0u8; 256];
        let n = io.read(&mut buf).await.expect("read");
        assert_eq!(n, bytes.len());
        tokio::time::advance(std::time::Duration::from_millis(700)).await;
        let n = io.read(&mut buf).await.expect("read");
        assert_eq!(n, next.len());
        let now = crate::clock::now_ms();
        assert_eq!(
            hints.0.head_open_for(now),
            Some(std::time::Duration::ZERO),
            "the second head began in this read: its clock starts now, not 700 ms ago"
        );
        tokio::time::advance(std::time::Duration::from_millis(300)).await;
        let n = io.read(&mut buf).await.expect("read");
        assert_eq!(n, 2);
        assert_eq!(
            hints.0.head_open_for(crate::clock::now_ms()),
            Some(std::time::Duration::from_millis(300)),
            "a read inside the same head keeps its clock"
        );
    }

    /// A connection's [`StreamHints`], as its `ConnCtx` holds them.
    struct Hinted(StreamHints);

    impl AsRef<StreamHints> for Hinted {
        fn as_ref(&self) -> &StreamHints {
            &self.0
        }
    }

    fn hinted(stream: Scripted) -> (ClientIo<Scripted>, Arc<Hinted>) {
        let hints = Arc::new(Hinted(StreamHints::default()));
        let io = ClientIo::new(stream, false).with_hints(Arc::clone(&hints) as HintsRef);
        (io, hints)
    }

    /// While its parking flag is set a shutdown only flushes; otherwise it shuts the stream.
    #[tokio::test]
    async fn a_shutdown_while_parking_leaves_the_stream_open() {
        let stream = scripted(&[]);
        let log = stream.log.clone();
        let (mut w, hints) = hinted(stream);
        hints.0.set_parking(true);
        w.shutdown().await.expect("parked shutdown");
        assert_eq!(log.seen(), ["flush"]);
        hints.0.set_parking(false);
        w.shutdown().await.expect("shutdown");
        assert_eq!(log.seen(), ["flush", "shutdown"]);
    }

    /// Once the service says the answer is the connection's last, its bytes are written to
    /// leave with the FIN: plain and vectored writes alike, the slices of a vectored one as
    /// one write. Before that, writes are plain.
    #[tokio::test]
    async fn the_last_answer_is_written_to_leave_with_the_fin() {
        let stream = scripted(&[]);
        let log = stream.log.clone();
        let (mut w, hints) = hinted(stream);
        w.write_all(b"first answer").await.expect("write");
        hints.0.set_last_answer();
        let slices = [io::IoSlice::new(b"head "), io::IoSlice::new(b"body")];
        let n = w.write_vectored(&slices).await.expect("write");
        assert_eq!(n, 9, "both slices in one write");
        w.write_all(b" more").await.expect("write");
        w.shutdown().await.expect("shutdown");
        assert_eq!(
            log.seen(),
            [
                "write first answer",
                "write last head body",
                "write last  more",
                "shutdown"
            ]
        );
    }

    /// Two tasks made ready together on one thread: a writer of three answers through a
    /// `ClientIo` (spawned first), and another task that notes itself. The log of both.
    async fn order_of_writes_and_other_task(batch_writes: bool) -> Vec<String> {
        let stream = scripted(&[]);
        let log = stream.log.clone();
        let local = tokio::task::LocalSet::new();
        local
            .run_until(async {
                let mut w = ClientIo::new(stream, batch_writes);
                let writer = tokio::task::spawn_local(async move {
                    for answer in [&b"answer 1"[..], b"answer 2", b"answer 3"] {
                        w.write_all(answer).await.expect("write");
                    }
                });
                let others = log.clone();
                let other = tokio::task::spawn_local(async move {
                    others.note("other task".to_owned());
                });
                writer.await.expect("writer");
                other.await.expect("other");
            })
            .await;
        log.seen()
    }

    #[tokio::test]
    async fn writes_go_straight_out_when_not_batching() {
        assert_eq!(
            order_of_writes_and_other_task(false).await,
            [
                "write answer 1",
                "write answer 2",
                "write answer 3",
                "other task"
            ]
        );
    }

    #[tokio::test]
    async fn an_answer_is_written_after_the_tasks_ready_in_the_same_turn() {
        assert_eq!(
            order_of_writes_and_other_task(true).await,
            [
                "write answer 1",
                "other task",
                "write answer 2",
                "write answer 3"
            ],
            "the connection's first answer goes out at once; the next waits for the task made \
             ready with it; every byte goes out"
        );
    }
}
