//! # The one relay: bytes both ways between a client and a node, with timers and close signals
//!
//! Every tunnel limpet keeps open goes through [`relay`]: TCP listener sessions
//! (`crate::tcp`) and upgraded HTTP connections (`crate::proxy::upgrade`, WebSocket or not).
//! Each timer and close signal is written here once, so those tunnels cannot drift apart.
//!
//! ```text
//!  client ─► read ─► buffer ─► write ─► node        (pump "up")
//!  client ◄─ write ◄─ buffer ◄─ read ◄─ node        (pump "down"; WebSocket: FrameTracker
//!                                                    follows frame boundaries of what was written)
//!  watchdog: ends the relay when nothing moved either way for `idle`, or when one pump has
//!            held bytes it could not write for `idle` (its reader stopped reading)
//!  stop:     close signal (MAINT, drain deadline, shutdown) ─► both pumps dropped at once,
//!            even mid-write; a WebSocket client then gets close 1001 at a frame boundary
//! ```
//!
//! Why per direction: a client that sends pings but never reads keeps the tunnel "active"
//! by any shared clock, while the node-to-client pump sits blocked in a write and the queue
//! grows in the kernel. HAProxy's `timeout tunnel` closes such a tunnel; so does this.
//!
//! The pumps are futures polled by the relay's own `select!`, never detached tasks: a pump
//! blocked in a write is simply dropped when the watchdog or the close signal wins. Their
//! state (buffer, position, frame tracker) lives outside those futures, so after a close
//! signal the relay still knows exactly which bytes the client has, and can finish the
//! WebSocket frame in flight before writing the close frame. Reads and writes are
//! cancel-safe (`read`/`write`, never `write_all`): a dropped pump loses no byte count.
//!
//! A TCP session's relay watches its opening ([`Opening`]): while nothing has moved either
//! way, a node that ends its stream or resets within the opening's window, or a close
//! signal, ends the relay as [`RelayEnd::Unused`], leaving the client side as it was, so the
//! session can go to another node. The client's first bytes end the opening as they are
//! read, before they are sent on.
//!
//! Half-close: when one side ends its stream (FIN), the other side's write half is shut down
//! and the other direction keeps going until it ends too. The last FIN of a relay between
//! plain TCP sockets rides on `close`: once both sides have ended their streams, shutting a
//! socket's write half just before closing it sends the same FIN with one more syscall
//! (HAProxy closes without it too). A TLS side is always shut down: it owes its peer a
//! `close_notify` first. When a read shows that the stream ended right after the bytes it
//! brought (the FIN came with them, as when a node answers `Connection: close`), those bytes
//! are written as the last ([`Io::poll_write_last`]): on a plain TCP socket they wait for the
//! FIN and leave in one segment with it, two packets fewer per short session.
//!
//! [`WriteDeadline`] is the same stalled-writer rule for the HTTP answer path, where hyper
//! does the writing: a client connection whose write stays blocked for `client_idle` fails.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::time::Instant;

use crate::drain::{close_frame_going_away, FrameTracker};
use crate::tcp::Io;

/// A pump's buffer to start with (what one read can bring in before it is written on). Small:
/// most tunnels move small messages. Buffers are never zeroed: reads go into their spare
/// capacity (`read_buf`). For short sessions (`Connection: close` through a TCP listener)
/// zeroing was a large share of a session's work: callgrind put 2 x 16 KiB above the rest of
/// the session and 2 x 4 KiB at a quarter of it, though it counts every byte `rep stosb`
/// writes as an instruction; in CPU time it was worth about 3% of sessions/s.
const PUMP_START: usize = 4 * 1024;
/// The largest a pump's buffer grows: each read that fills the buffer makes the next one four
/// times larger, so bulk transfers take large reads (fewer syscalls) and others never pay.
const PUMP_MAX: usize = 64 * 1024;

/// How long a WebSocket client gets, after a close signal, to receive the end of the frame
/// in flight and to answer the close frame.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// What is relayed: plain bytes, or WebSocket frames (closed cleanly on a close signal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    Bytes,
    WebSocket,
}

/// Which sides of a relay are plain TCP sockets, whose close alone ends their stream cleanly
/// (a FIN) once nothing is left to read from them. A TLS side is not: closing it without
/// `close_notify` looks like a truncation to its peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FinOnClose {
    pub client: bool,
    pub node: bool,
}

/// The two directions of a relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Client to node.
    Up,
    /// Node to client.
    Down,
}

/// Why a relay ended.
#[derive(Debug)]
pub enum RelayEnd {
    /// Both directions finished: bytes copied client to node, node to client.
    Done(u64, u64),
    Error(io::Error),
    /// Nothing moved either way for the idle time.
    Idle,
    /// This direction held bytes it could not write for the idle time: its reader stopped
    /// reading.
    Stalled(Direction),
    /// The close signal fired, with its reason.
    Stopped(&'static str),
    /// In a relay that watched its [`Opening`], nothing moved either way before it ended:
    /// the node took nothing of the client's and gave it nothing. The client side is left as
    /// it was (not shut down, not reset), so the session can be taken to another node.
    Unused(Unused),
}

/// How a relay ended with nothing moved ([`RelayEnd::Unused`]).
#[derive(Debug)]
pub enum Unused {
    /// The node ended its stream (the error is `UnexpectedEof`) or failed (a reset) within
    /// the opening's window: what a node in a rolling restart does to the connections its
    /// kernel completed into its listen queue and its process never accepted, or a process
    /// that accepts and closes.
    Dropped(io::Error),
    /// The close signal fired, with its reason. The node's side is reset, the client's left.
    Stopped(&'static str),
}

impl std::fmt::Debug for Opening<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opening")
            .field("window", &self.window)
            .finish_non_exhaustive()
    }
}

/// A relay's opening, watched for a TCP session ([`relay_counted`]): it lasts until the
/// first read on either side completes.
pub struct Opening<'a> {
    /// How long after the relay starts a node's end (or reset) with nothing moved is still
    /// its drop of an unused connection ([`Unused::Dropped`]). Queue resets and
    /// accept-and-close come at once; a node that closes a connection its client left silent
    /// for a while (an HTTP server's header timeout) is ending a session like any other, and
    /// its end is passed on.
    pub window: Duration,
    /// Called once, when the opening ends other than with the node's drop or an error: with
    /// a byte either way, the client's FIN, or the node's FIN past the window.
    pub on_open: &'a (dyn Fn() + Sync),
}

/// When each direction last moved a byte, and whether it holds bytes not yet written; and
/// the relay's opening, if it watches one.
struct Clock<'a> {
    start: Instant,
    /// Per direction: ms since `start` of the last read or write.
    moved_ms: [AtomicU64; 2],
    /// Per direction: bytes read and not yet written (and flushed).
    holding: [AtomicBool; 2],
    /// Per direction: its reader ended its stream and the end has been passed on (the
    /// writer shut down, or left for the relay's close). Set only then, so that the other
    /// direction never leaves its own end to the close while this one is still in a
    /// shutdown that has not completed (a TLS `close_notify` waiting on a full window):
    /// bytes held for the FIN would wait with it.
    ended: [AtomicBool; 2],
    /// True until the first read on either side completes (bytes, the end of a stream, an
    /// error), in a relay that watches its opening: nothing has moved either way yet.
    opening: AtomicBool,
    watched: Option<Opening<'a>>,
    /// The opening ended with the node's drop: [`Unused::Dropped`].
    dropped: AtomicBool,
}

impl<'a> Clock<'a> {
    fn new(watched: Option<Opening<'a>>) -> Self {
        Clock {
            start: Instant::now(),
            moved_ms: [AtomicU64::new(0), AtomicU64::new(0)],
            holding: [AtomicBool::new(false), AtomicBool::new(false)],
            ended: [AtomicBool::new(false), AtomicBool::new(false)],
            opening: AtomicBool::new(watched.is_some()),
            watched,
            dropped: AtomicBool::new(false),
        }
    }

    /// A read of direction `dir` completed with `read` during the opening, which it ends:
    /// whether that is the node's drop ([`Unused::Dropped`]: its stream ended or failed
    /// within the window). Otherwise `on_open` learns of it, unless it is an error.
    fn first_read(&self, dir: usize, read: &io::Result<usize>) -> bool {
        self.opening.store(false, Ordering::Relaxed);
        let Some(o) = &self.watched else {
            return false;
        };
        if dir == DOWN && !matches!(read, Ok(n) if *n > 0) && self.start.elapsed() <= o.window {
            self.dropped.store(true, Ordering::Relaxed);
            return true;
        }
        // A reset past the window is no success of the connect, whichever side it came from.
        if read.is_ok() {
            (o.on_open)();
        }
        false
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn moved(&self, d: usize, holding: bool) {
        self.moved_ms[d].store(self.now_ms(), Ordering::Relaxed);
        self.holding[d].store(holding, Ordering::Relaxed);
    }

    /// Resolves when the relay must end for lack of progress.
    async fn expired(&self, idle: Duration) -> RelayEnd {
        let idle_ms = u64::try_from(idle.as_millis()).unwrap_or(u64::MAX);
        loop {
            let now = self.now_ms();
            let moved = [0, 1].map(|d| self.moved_ms[d].load(Ordering::Relaxed));
            // Quiet both ways.
            let mut due = moved[0].max(moved[1]).saturating_add(idle_ms);
            let mut end = RelayEnd::Idle;
            // A direction stuck on bytes it cannot write, whatever the other one does.
            for (d, dir) in [(0, Direction::Up), (1, Direction::Down)] {
                if self.holding[d].load(Ordering::Relaxed) {
                    let stall = moved[d].saturating_add(idle_ms);
                    if stall < due {
                        due = stall;
                        end = RelayEnd::Stalled(dir);
                    }
                }
            }
            if now >= due {
                return end;
            }
            tokio::time::sleep(Duration::from_millis(due - now)).await;
        }
    }
}

/// One side of a relay, shared by its two pumps: one reads from it, the other writes to it.
/// What `tokio::io::split` does, keeping [`Io::poll_write_last`] for the writing pump. Both
/// pumps are polled by the relay's one task, one after the other, so the lock is never
/// contended.
struct Half<T>(Arc<Mutex<T>>);

impl<T> Half<T> {
    fn pair(io: T) -> (Half<T>, Half<T>) {
        let shared = Arc::new(Mutex::new(io));
        (Half(Arc::clone(&shared)), Half(shared))
    }

    fn lock(&self) -> MutexGuard<'_, T> {
        // A poisoned lock only means a poll panicked on the other half; the stream is as
        // usable as the panic left it, and the relay is ending anyway.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T: Io> AsyncRead for Half<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.lock()).poll_read(cx, buf)
    }
}

impl<T: Io> AsyncWrite for Half<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.lock()).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.lock()).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.lock().is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.lock()).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.lock()).poll_shutdown(cx)
    }
}

impl<T: Io> Io for Half<T> {
    fn poll_write_last(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.lock()).poll_write_last(cx, buf)
    }

    fn abort_on_close(&self) {
        self.lock().abort_on_close();
    }
}

/// [`Pump::dir`] of the node-to-client pump.
const DOWN: usize = 1;

/// One direction's state, kept outside its future so a dropped pump loses nothing.
struct Pump {
    dir: usize,
    /// What the last read brought (its capacity is the buffer's size); `buf[pos..]` is read
    /// and not yet written.
    buf: Vec<u8>,
    pos: usize,
    bytes: u64,
    done: bool,
    /// The reader's stream ended right after the bytes held: they are its last.
    last: bool,
    /// An error the reader returned after bytes still held: returned once they are written.
    read_error: Option<io::Error>,
    /// WebSocket node-to-client: frame boundaries of the bytes written to the client.
    frames: Option<FrameTracker>,
}

impl Pump {
    fn new(dir: Direction, frames: bool) -> Self {
        Pump {
            dir: match dir {
                Direction::Up => 0,
                Direction::Down => 1,
            },
            buf: Vec::with_capacity(PUMP_START),
            pos: 0,
            bytes: 0,
            done: false,
            last: false,
            read_error: None,
            frames: frames.then(FrameTracker::new),
        }
    }

    /// Writes what the buffer holds, noting it on the clock and in the tracker. The reader's
    /// last bytes go out with [`Io::poll_write_last`], to leave with the FIN.
    ///
    /// The clock is read only when this pump is about to wait with bytes held (a write or
    /// flush that cannot proceed), and once all is written. Both rules of [`Clock::expired`]
    /// need no more: a read followed by writes that go through at once is one moment, and
    /// a pump that must wait notes that moment (the read, or its last progress, of the same
    /// poll) before it does. Noting every read, write and flush cost three clock reads per
    /// message and direction where one serves.
    async fn write_held<W: Io>(&mut self, w: &mut W, clock: &Clock<'_>) -> io::Result<()> {
        let dir = self.dir;
        // Whether the clock shows this pump waiting with bytes held since its last progress.
        let mut noted = false;
        let note_wait = |pending: bool, noted: &mut bool| {
            if pending && !*noted {
                clock.moved(dir, true);
                *noted = true;
            }
        };
        while self.pos < self.buf.len() {
            let held = &self.buf[self.pos..];
            let last = self.last;
            let n = std::future::poll_fn(|cx| {
                let w = Pin::new(&mut *w);
                let p = if last {
                    w.poll_write_last(cx, held)
                } else {
                    w.poll_write(cx, held)
                };
                note_wait(p.is_pending(), &mut noted);
                p
            })
            .await?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            if let Some(t) = &mut self.frames {
                t.consume(&self.buf[self.pos..self.pos + n]);
            }
            self.pos += n;
            self.bytes += n as u64;
            // Progress: a wait from here on starts now.
            noted = false;
        }
        std::future::poll_fn(|cx| {
            let p = Pin::new(&mut *w).poll_flush(cx);
            note_wait(p.is_pending(), &mut noted);
            p
        })
        .await?;
        clock.moved(dir, false);
        Ok(())
    }

    /// Reads into the buffer, once all it held is written: what the read brought, 0 at the
    /// end of the stream. Cancel-safe, like the read itself.
    async fn fill<R: AsyncRead + Unpin>(&mut self, r: &mut R) -> io::Result<usize> {
        self.buf.clear();
        self.pos = 0;
        if let Some(e) = self.read_error.take() {
            return Err(e);
        }
        if self.last {
            return Ok(0);
        }
        r.read_buf(&mut self.buf).await
    }

    /// After a read that left room in the buffer, for a plain TCP writer: reads on without
    /// waiting, to learn whether the stream ended right after what came ([`Pump::last`]). A
    /// node answering `Connection: close` writes and closes at once, so its FIN is usually
    /// there already; known before the bytes are written, the two leave in one segment. When
    /// nothing more has come, the read answers from tokio's readiness, without a syscall;
    /// when the FIN has, its read is the one the next [`Pump::fill`] would have made.
    async fn read_on<R: AsyncRead + Unpin>(&mut self, r: &mut R) {
        while self.buf.len() < self.buf.capacity() {
            let more = std::future::poll_fn(|cx| {
                match tokio_util::io::poll_read_buf(Pin::new(&mut *r), cx, &mut self.buf) {
                    Poll::Pending => Poll::Ready(None),
                    Poll::Ready(r) => Poll::Ready(Some(r)),
                }
            })
            .await;
            match more {
                None => return,
                Some(Ok(0)) => {
                    self.last = true;
                    return;
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    self.read_error = Some(e);
                    return;
                }
            }
        }
    }

    /// Once the buffer is written out: a larger one if the last read filled it (see
    /// [`PUMP_MAX`]).
    fn grow_if_filled(&mut self) {
        let size = self.buf.capacity();
        if self.pos == self.buf.len() && self.buf.len() == size && size < PUMP_MAX {
            self.buf = Vec::with_capacity((size * 4).min(PUMP_MAX));
            self.pos = 0;
        }
    }

    /// Copies until the reader ends (then shuts the writer down) or an error. `fin_on_close`:
    /// the writer is a plain TCP socket, left for the relay's close to end when the other
    /// direction has already ended (its peer's stream is read to the end, so the close sends
    /// a FIN, not a reset).
    async fn run<R, W>(
        &mut self,
        r: &mut R,
        w: &mut W,
        clock: &Clock<'_>,
        fin_on_close: bool,
    ) -> io::Result<()>
    where
        R: AsyncRead + Unpin,
        W: Io,
    {
        loop {
            self.write_held(w, clock).await?;
            self.grow_if_filled();
            let read = match self.fill(r).await {
                // A TLS side that ended its stream without `close_notify` ended it all the
                // same (many TLS servers and clients skip it; HAProxy takes it so too): the
                // end is passed on as any other, a half-close, so a TLS peer on the other
                // side gets its `close_notify` rather than a truncation, and the other
                // direction goes on. Before, it ended both directions at once. (Read so
                // before the opening looks at it: a client's such end opens the session as
                // a FIN does; a node's within the window is its drop either way.)
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(0),
                read => read,
            };
            if clock.opening.load(Ordering::Relaxed) && clock.first_read(self.dir, &read) {
                return Err(read.err().unwrap_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the node closed the connection before any byte moved",
                    )
                }));
            }
            let n = read?;
            if n == 0 {
                self.done = true;
                if fin_on_close && clock.ended[1 - self.dir].load(Ordering::Relaxed) {
                    // Both streams have ended: the relay returns and closing `w` sends its FIN.
                    clock.ended[self.dir].store(true, Ordering::Relaxed);
                    return Ok(());
                }
                // Half-close: the other side learns this side is done writing. A shutdown
                // that cannot complete (a TLS close_notify behind records the peer does not
                // take) is a write held like any other, bounded by the stall rule while the
                // other direction keeps the relay busy; it held the tunnel, its node slot and
                // its listener slot until a close signal.
                let mut noted = false;
                std::future::poll_fn(|cx| {
                    let p = Pin::new(&mut *w).poll_shutdown(cx);
                    if p.is_pending() && !noted {
                        clock.moved(self.dir, true);
                        noted = true;
                    }
                    p
                })
                .await?;
                if noted {
                    clock.moved(self.dir, false);
                }
                clock.ended[self.dir].store(true, Ordering::Relaxed);
                return Ok(());
            }
            // No clock read for the read itself: `write_held` notes it (see there).
            // Only a plain TCP writer sends its last bytes with the FIN: for the others
            // (TLS, upgraded streams) looking ahead would buy nothing.
            if fin_on_close {
                self.read_on(r).await;
            }
        }
    }
}

/// Relays `client` <-> `node` until both directions are done, the relay stops making
/// progress for `idle` (quiet both ways, or one direction unable to write), an I/O error,
/// or `stop` resolves with a reason. Dropping the streams on return closes both connections.
///
/// With [`Framing::WebSocket`], a `stop` is clean: the frame the client is in the middle of
/// receiving is finished, then a close frame 1001 carrying the reason is written, and the
/// client gets a moment to answer it.
pub async fn relay<C, N, S>(
    client: C,
    node: N,
    idle: Duration,
    framing: Framing,
    stop: S,
) -> RelayEnd
where
    C: Io,
    N: Io,
    S: Future<Output = &'static str>,
{
    relay_counted(
        client,
        node,
        idle,
        framing,
        FinOnClose::default(),
        stop,
        None,
    )
    .await
    .0
}

/// [`relay`], also returning the bytes moved client to node and node to client however it
/// ended (a session cut by MAINT or an idle timeout moved bytes too), with the sides whose
/// last FIN may ride on their close said (`fin_on_close`).
///
/// With an [`Opening`], the relay watches it: until a first read on either side completes,
/// a node whose stream ends or fails within the window, or the close signal, ends the relay
/// as [`RelayEnd::Unused`], the client side untouched. Any other first read (the client's
/// bytes or its FIN, the node's bytes) ends the opening, and `on_open` is called then,
/// once. A client's bytes end it as soon as they are read, before they are written on: once
/// sent, whether the node took them cannot be known, and taking them to another node would
/// not be safe.
pub async fn relay_counted<C, N, S>(
    client: C,
    node: N,
    idle: Duration,
    framing: Framing,
    fin_on_close: FinOnClose,
    stop: S,
    opening: Option<Opening<'_>>,
) -> (RelayEnd, u64, u64)
where
    C: Io,
    N: Io,
    S: Future<Output = &'static str>,
{
    let (mut cr, mut cw) = Half::pair(client);
    let (mut nr, mut nw) = Half::pair(node);
    let clock = Clock::new(opening);
    // WebSocket: both directions' frames followed, the client's so that a clean close knows
    // where its close answer starts.
    let mut up = Pump::new(Direction::Up, framing == Framing::WebSocket);
    let mut down = Pump::new(Direction::Down, framing == Framing::WebSocket);
    tokio::pin!(stop);
    let end = {
        // Each pump polled only when its own sockets woke it, not on every wake of the
        // other one (`crate::wake`): a pump moves only on its read or write readiness. Each
        // has a wake flag of its own (`OnWake::new`), never one inside a side: a waker
        // left registered in a socket's readiness would then own that socket, a cycle that
        // keeps the session's sockets open after the relay ends.
        let up_run = crate::wake::OnWake::new(up.run(&mut cr, &mut nw, &clock, fin_on_close.node));
        let down_run =
            crate::wake::OnWake::new(down.run(&mut nr, &mut cw, &clock, fin_on_close.client));
        // The close signal and the idle clock, polled only when one of them was woken, not
        // on every wake of a pump.
        let control = crate::wake::OnWake::new(async {
            tokio::select! {
                biased;
                reason = &mut stop => RelayEnd::Stopped(reason),
                end = clock.expired(idle) => end,
            }
        });
        tokio::pin!(up_run, down_run, control);
        let (mut up_done, mut down_done) = (false, false);
        loop {
            // In order: a pump's future only ends with its direction, so polling the pumps
            // first starves nothing, and saves drawing a random start on every wake.
            tokio::select! {
                biased;
                r = &mut up_run, if !up_done => match r {
                    Ok(()) => up_done = true,
                    Err(e) => break RelayEnd::Error(e),
                },
                r = &mut down_run, if !down_done => match r {
                    Ok(()) => down_done = true,
                    Err(e) if clock.dropped.load(Ordering::Relaxed) => {
                        break RelayEnd::Unused(Unused::Dropped(e))
                    }
                    Err(e) => break RelayEnd::Error(e),
                },
                end = &mut control => break end,
            }
            if up_done && down_done {
                break RelayEnd::Done(0, 0);
            }
        }
    };
    let end = match end {
        RelayEnd::Done(..) => RelayEnd::Done(up.bytes, down.bytes),
        // Stopped with nothing moved: the node's side is reset, as below, and the client's
        // left for the session to go on elsewhere (or be cut by its caller).
        RelayEnd::Stopped(reason) if clock.opening.load(Ordering::Relaxed) => {
            nw.abort_on_close();
            RelayEnd::Unused(Unused::Stopped(reason))
        }
        RelayEnd::Stopped(reason) if framing == Framing::WebSocket && !down.done => {
            close_websocket(&mut down, &up, &mut nr, &mut cw, &mut cr, &clock, reason).await;
            // Courtesy to the node, bounded like the rest of the close (a node that stopped
            // reading would otherwise hold it up to its write limit, `tunnel_idle`).
            let _ = tokio::time::timeout(CLOSE_GRACE, nw.shutdown()).await;
            RelayEnd::Stopped(reason)
        }
        // A byte stream cut by a close signal (MAINT, DOWN, a moved session, a drain's or a
        // shutdown's end) has no message boundary to stop at: both sides are reset, so that
        // neither takes what it got so far for the whole stream (an upgraded HTTP
        // connection's too: its socket is reached under hyper's, `proxy::upgrade`).
        RelayEnd::Stopped(reason) if framing == Framing::Bytes => {
            cw.abort_on_close();
            nw.abort_on_close();
            RelayEnd::Stopped(reason)
        }
        // Nor did a byte stream end either side's way when one side failed (its reset, a
        // write it refused) or limpet ended it on a timer (idle, a writer stalled): both
        // sides are reset, the abort passed on as one (HAProxy does so too), so that a node
        // does not take a client's half upload, cut by its crash or by a stall, for a whole
        // one, nor a client a node's half answer. Only a side that ended its own stream (a
        // FIN, `Done`) ends the other's with a FIN (or `close_notify`); so does a TLS side
        // that ended it without `close_notify`, in the pump ([`Pump::run`]).
        // A direction that finished (its reader's FIN passed on, every byte written) is
        // left to end as it did: its last bytes may still wait in the kernel for a slow
        // reader, and a reset would throw them away.
        end @ (RelayEnd::Error(_) | RelayEnd::Idle | RelayEnd::Stalled(_))
            if framing == Framing::Bytes =>
        {
            if !down.done {
                cw.abort_on_close();
            }
            if !up.done {
                nw.abort_on_close();
            }
            end
        }
        other => other,
    };
    (end, up.bytes, down.bytes)
}

/// After a close signal: finish the WebSocket frame the client is in the middle of, write
/// close 1001, and give the client [`CLOSE_GRACE`] to answer. A client that does not read
/// is not waited for beyond the grace. A client the node's own close frame already reached
/// gets no second one (nothing may follow a close, RFC 6455 5.5.1): it is only given the
/// grace to answer. The client's answer is looked for from where its stream is (`up`: the
/// frames it passed, and the bytes read and not passed), not from the middle of a frame.
async fn close_websocket<NR, CW, CR>(
    down: &mut Pump,
    up: &Pump,
    nr: &mut NR,
    cw: &mut CW,
    cr: &mut CR,
    clock: &Clock<'_>,
    reason: &'static str,
) where
    NR: AsyncRead + Unpin,
    CW: Io,
    CR: AsyncRead + Unpin,
{
    let finished = tokio::time::timeout(CLOSE_GRACE, async {
        loop {
            let Some(t) = &down.frames else { return false };
            if t.at_boundary() {
                return true;
            }
            if down.pos < down.buf.len() {
                // Pass only up to the end of the frame in flight: bytes after it belong to
                // frames the client will not get.
                if let Some(upto) = t.boundary_within(&down.buf[down.pos..]) {
                    down.buf.truncate(down.pos + upto);
                }
                if down.write_held(cw, clock).await.is_err() {
                    return false;
                }
                continue;
            }
            match down.fill(nr).await {
                Ok(0) | Err(_) => return false,
                Ok(_) => {}
            }
        }
    })
    .await
    .unwrap_or(false);
    if finished {
        let node_closed = down.frames.as_ref().is_some_and(FrameTracker::close_seen);
        if !node_closed {
            let _ = tokio::time::timeout(CLOSE_GRACE, async {
                cw.write_all(&close_frame_going_away(reason)).await?;
                cw.flush().await
            })
            .await;
        }
        // The handshake is complete once the client has sent its own close frame (not
        // forwarded), or closed.
        let mut from_client = up.frames.clone().unwrap_or_default();
        from_client.consume(&up.buf[up.pos..]);
        let mut buf = [0u8; 1024];
        let _ = tokio::time::timeout(CLOSE_GRACE, async {
            while !from_client.close_seen() {
                match cr.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        from_client.consume(&buf[..n]);
                    }
                }
            }
        })
        .await;
    }
    let _ = tokio::time::timeout(CLOSE_GRACE, cw.shutdown()).await;
}

/// A client connection whose writes may not stay blocked for longer than its limit: the
/// HTTP answer path's counterpart of the relay's stalled-writer rule (HAProxy's `timeout
/// client` while sending). hyper writes an answer only as fast as the client reads it, and
/// while a write is blocked nothing else of the connection runs: no body timer is polled.
/// Here the blocked write itself fails with `TimedOut` once the client has taken nothing
/// for the limit, which ends the connection and releases the node connection behind it.
///
/// The limit is shared ([`WriteLimit`]) so that an upgraded connection hands the rule over
/// to the relay's own per-direction timer (`tunnel_idle`) instead of keeping this one.
#[derive(Debug)]
pub struct WriteDeadline<I> {
    io: I,
    limit: WriteLimit,
    /// Armed at the first write that could not proceed, dropped at the next that did.
    timer: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

/// The write limit of one client connection, in milliseconds (`u64::MAX`: none).
#[derive(Debug, Clone)]
pub struct WriteLimit(std::sync::Arc<AtomicU64>);

impl WriteLimit {
    pub fn new(limit: Duration) -> Self {
        WriteLimit(std::sync::Arc::new(AtomicU64::new(
            u64::try_from(limit.as_millis()).unwrap_or(u64::MAX),
        )))
    }

    /// The limit from the next blocked write on (a reload changed it); one lifted stays
    /// lifted.
    pub fn set(&self, limit: Duration) {
        let ms = u64::try_from(limit.as_millis())
            .unwrap_or(u64::MAX)
            .min(u64::MAX - 1);
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| {
                (now != u64::MAX).then_some(ms)
            });
    }

    /// No limit from now on (the connection became a tunnel).
    pub fn lift(&self) {
        self.0.store(u64::MAX, Ordering::Relaxed);
    }

    fn get(&self) -> Option<Duration> {
        match self.0.load(Ordering::Relaxed) {
            u64::MAX => None,
            ms => Some(Duration::from_millis(ms)),
        }
    }
}

impl<I> WriteDeadline<I> {
    pub fn new(io: I, limit: WriteLimit) -> Self {
        WriteDeadline {
            io,
            limit,
            timer: None,
        }
    }

    /// The wrapped stream (to look at it, not to write around the deadline).
    pub fn get_ref(&self) -> &I {
        &self.io
    }

    /// The write could not proceed: pending until the limit, then an error.
    fn blocked<T>(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<io::Result<T>> {
        use std::task::Poll;
        let Some(limit) = self.limit.get() else {
            self.timer = None;
            return Poll::Pending;
        };
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client stopped reading",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn progressed<T>(
        &mut self,
        r: std::task::Poll<io::Result<T>>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<T>> {
        match r {
            std::task::Poll::Pending => self.blocked(cx),
            ready => {
                self.timer = None;
                ready
            }
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for WriteDeadline<I> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<I> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        let r = std::pin::Pin::new(&mut self.io).poll_write(cx, buf);
        self.progressed(r, cx)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> std::task::Poll<io::Result<usize>> {
        let r = std::pin::Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.progressed(r, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        let r = std::pin::Pin::new(&mut self.io).poll_flush(cx);
        self.progressed(r, cx)
    }

    /// A close is a write too: TLS sends its close_notify after the records still buffered,
    /// which a peer that stopped reading never takes. Under the same deadline, so a relay
    /// or connection that closes its side (a tunnel stopped by a node going DOWN, a parked
    /// connection idling out) is not held by the peer.
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        let r = std::pin::Pin::new(&mut self.io).poll_shutdown(cx);
        self.progressed(r, cx)
    }
}

/// An HTTP client connection's last answer is written with `poll_write_last`
/// (`proxy::client_io`), under the same deadline as any write; an upgraded connection's
/// stream cut mid-way is reset (`proxy::upgrade`).
impl<I: Io> Io for WriteDeadline<I> {
    fn poll_write_last(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        let r = std::pin::Pin::new(&mut self.io).poll_write_last(cx, buf);
        self.progressed(r, cx)
    }

    fn abort_on_close(&self) {
        self.io.abort_on_close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pump starts small and grows only after reads that filled it: 4 KiB, 16 KiB, then
    /// 64 KiB at most; a read that did not fill it changes nothing.
    #[test]
    fn pump_buffers_grow_only_with_bulk_reads() {
        let mut p = Pump::new(Direction::Up, false);
        assert_eq!(p.buf.capacity(), PUMP_START);
        // A read of 100 bytes, written out.
        p.buf.resize(100, 7);
        p.pos = 100;
        p.grow_if_filled();
        assert_eq!(
            p.buf.capacity(),
            PUMP_START,
            "a short read keeps the buffer"
        );
        for want in [16 * 1024, PUMP_MAX, PUMP_MAX] {
            // A read that filled the buffer, written out.
            p.buf.resize(p.buf.capacity(), 7);
            p.pos = p.buf.len();
            p.grow_if_filled();
            assert_eq!(p.buf.capacity(), want);
        }
        // Never while bytes are held.
        p.buf.resize(p.buf.capacity(), 7);
        p.pos = 0;
        let before = p.buf.capacity();
        p.grow_if_filled();
        assert_eq!((p.buf.capacity(), p.buf.len()), (before, before));
    }

    /// A writer that records each write, whether it came as the stream's last bytes
    /// ([`Io::poll_write_last`]), and its shutdown; each event also goes to `events`.
    struct Recorder {
        writes: Vec<(Vec<u8>, bool)>,
        shut: bool,
        /// A shutdown that never completes (a TLS `close_notify` the peer does not take).
        shutdown_stuck: bool,
        events: tokio::sync::mpsc::UnboundedSender<()>,
    }

    impl Recorder {
        fn new() -> (Self, tokio::sync::mpsc::UnboundedReceiver<()>) {
            let (events, rx) = tokio::sync::mpsc::unbounded_channel();
            let r = Recorder {
                writes: Vec::new(),
                shut: false,
                shutdown_stuck: false,
                events,
            };
            (r, rx)
        }

        fn record(&mut self, buf: &[u8], last: bool) -> Poll<io::Result<usize>> {
            self.writes.push((buf.to_vec(), last));
            let _ = self.events.send(());
            Poll::Ready(Ok(buf.len()))
        }
    }

    impl AsyncRead for Recorder {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            _: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Poll::Pending
        }
    }

    impl AsyncWrite for Recorder {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.get_mut().record(buf, false)
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            if self.shutdown_stuck {
                return Poll::Pending;
            }
            self.get_mut().shut = true;
            Poll::Ready(Ok(()))
        }
    }

    impl Io for Recorder {
        fn poll_write_last(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.get_mut().record(buf, true)
        }
    }

    impl Io for tokio::io::DuplexStream {}

    /// A stream whose reads and writes go through, and whose shutdown never completes (a
    /// TLS client's close_notify behind records it does not take).
    struct StuckShut(tokio::io::DuplexStream);

    impl AsyncRead for StuckShut {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Pin::new(&mut self.0).poll_read(cx, buf)
        }
    }

    impl AsyncWrite for StuckShut {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            Pin::new(&mut self.0).poll_write(cx, buf)
        }
        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.0).poll_flush(cx)
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Pending
        }
    }

    impl Io for StuckShut {}

    /// A half-close the client cannot take is bounded like any held write: the node ends its
    /// stream, the shutdown towards the client never completes, and the client keeps sending
    /// every second (the relay never quiet both ways). The relay ends as stalled towards the
    /// client `idle` after the node's end. (Before, the shutdown was on no clock: the
    /// tunnel, its node slot and its listener slot were held until a close signal.)
    #[tokio::test(start_paused = true)]
    async fn a_half_close_the_client_cannot_take_is_a_stall() {
        let idle = Duration::from_secs(10);
        let (client, mut client_peer) = tokio::io::duplex(64 * 1024);
        let (node, mut node_peer) = tokio::io::duplex(64 * 1024);
        let relay = relay(
            StuckShut(client),
            node,
            idle,
            Framing::Bytes,
            std::future::pending(),
        );
        let peers = async {
            node_peer.write_all(b"bye").await.expect("node writes");
            node_peer.shutdown().await.expect("node ends");
            let mut sink = vec![0u8; 1024];
            let client = async {
                loop {
                    client_peer.write_all(b".").await.expect("client writes");
                    let _ =
                        tokio::time::timeout(Duration::from_secs(1), client_peer.read(&mut sink))
                            .await;
                }
            };
            let mut up = vec![0u8; 1024];
            let node = async {
                while node_peer.read(&mut up).await.is_ok_and(|n| n > 0) {}
                std::future::pending::<()>().await;
            };
            tokio::join!(client, node);
        };
        let started = Instant::now();
        let end = tokio::time::timeout(Duration::from_secs(60), async {
            tokio::select! {
                end = relay => end,
                _ = peers => unreachable!("the peers go on for good"),
            }
        })
        .await
        .expect("the relay ends, not never");
        assert!(matches!(end, RelayEnd::Stalled(Direction::Down)), "{end:?}");
        let took = started.elapsed();
        assert!(
            took >= idle && took < idle + Duration::from_secs(1),
            "{took:?}"
        );
    }

    /// A WebSocket relay, and the sender of its close signal ("node in maintenance").
    fn websocket_relay(
        client: tokio::io::DuplexStream,
        node: tokio::io::DuplexStream,
    ) -> (
        impl Future<Output = RelayEnd>,
        tokio::sync::oneshot::Sender<()>,
    ) {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let relay = relay(
            client,
            node,
            Duration::from_secs(600),
            Framing::WebSocket,
            async {
                let _ = stopped.await;
                "node in maintenance"
            },
        );
        (relay, stop)
    }

    /// A close signal after the node's own close frame reached the client sends no second
    /// one (nothing may follow a close, RFC 6455 5.5.1): the client, which answers the
    /// node's close, reads nothing more but the end of the stream. (Before, it got a close
    /// 1001 "node in maintenance" after the node's close 1000.)
    #[tokio::test(start_paused = true)]
    async fn a_client_the_node_s_close_reached_gets_no_second_close() {
        let (client, mut client_peer) = tokio::io::duplex(64 * 1024);
        let (node, mut node_peer) = tokio::io::duplex(64 * 1024);
        let (relay, stop) = websocket_relay(client, node);
        let peers = async {
            node_peer
                .write_all(&[0x88, 0x02, 0x03, 0xE8])
                .await
                .expect("node's close");
            let mut close = [0u8; 4];
            client_peer
                .read_exact(&mut close)
                .await
                .expect("client reads");
            assert_eq!(close, [0x88, 0x02, 0x03, 0xE8]);
            let _ = stop.send(());
            // The client's answer to the node's close (masked, key 0).
            client_peer
                .write_all(&[0x88, 0x82, 0, 0, 0, 0, 0x03, 0xE8])
                .await
                .expect("client's close");
            let mut rest = Vec::new();
            client_peer
                .read_to_end(&mut rest)
                .await
                .expect("to the end");
            rest
        };
        let (end, rest) = tokio::join!(relay, peers);
        assert!(matches!(end, RelayEnd::Stopped(_)), "{end:?}");
        assert!(rest.is_empty(), "after the node's close: {rest:x?}");
    }

    /// The client's answer to limpet's close is found where the client's stream is: the
    /// signal comes in the middle of a client frame whose payload looks like a frame head
    /// (`82 7F` and a length that takes the next bytes), then the client sends the rest and
    /// its close. limpet ends the stream as soon as the close comes. (Before, the answer was
    /// looked for from the middle of the frame: the payload read as a head whose length
    /// swallowed the close, and the relay waited out its 2 s grace.)
    #[tokio::test(start_paused = true)]
    async fn a_close_answer_after_the_rest_of_a_client_frame_ends_the_relay_at_once() {
        let (client, mut client_peer) = tokio::io::duplex(64 * 1024);
        let (node, mut node_peer) = tokio::io::duplex(64 * 1024);
        let (relay, stop) = websocket_relay(client, node);
        let peers = async {
            // A binary frame of 16 bytes, unmasked for short: its head and 8 bytes.
            let mut first = vec![0x82, 0x10];
            first.extend([0u8; 8]);
            client_peer.write_all(&first).await.expect("client writes");
            let mut got = vec![0u8; first.len()];
            node_peer.read_exact(&mut got).await.expect("node reads");
            let _ = stop.send(());
            let mut close = [0u8; 2];
            client_peer
                .read_exact(&mut close)
                .await
                .expect("limpet's close");
            assert_eq!(close[0], 0x88);
            client_peer
                .write_all(&[0x82, 0x7F, 0x7F, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x88, 0x00])
                .await
                .expect("the rest, then the client's close");
            let answered = Instant::now();
            let mut rest = Vec::new();
            client_peer
                .read_to_end(&mut rest)
                .await
                .expect("to the end");
            answered.elapsed()
        };
        let (end, took) = tokio::join!(relay, peers);
        assert!(matches!(end, RelayEnd::Stopped(_)), "{end:?}");
        assert!(
            took < Duration::from_millis(100),
            "ended {took:?} after the close"
        );
    }

    /// An HTTP connection's last answer (written with `poll_write_last`, to leave with the
    /// FIN) goes to the stream as its last bytes, under the same deadline as any write: to a
    /// client that has stopped reading, it fails with `TimedOut` once nothing went for the
    /// limit, and the connection ends.
    #[tokio::test(start_paused = true)]
    async fn a_last_answer_goes_as_the_last_bytes_and_fails_at_the_limit_if_the_client_stalls() {
        let (recorder, _events) = Recorder::new();
        let mut w = WriteDeadline::new(recorder, WriteLimit::new(Duration::from_secs(5)));
        let n = std::future::poll_fn(|cx| Pin::new(&mut w).poll_write_last(cx, b"answer"))
            .await
            .expect("written");
        assert_eq!(n, 6);
        assert_eq!(w.get_ref().writes, [(b"answer".to_vec(), true)]);

        let limit = Duration::from_secs(5);
        let (stream, _client) = tokio::io::duplex(16);
        let mut w = WriteDeadline::new(stream, WriteLimit::new(limit));
        let start = Instant::now();
        let mut taken = 0;
        let e = loop {
            match std::future::poll_fn(|cx| Pin::new(&mut w).poll_write_last(cx, &[7u8; 64])).await
            {
                Ok(n) => taken += n,
                Err(e) => break e,
            }
        };
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert_eq!(taken, 16, "what the client's pipe held");
        let took = start.elapsed();
        assert!(
            took >= limit && took < limit + Duration::from_secs(1),
            "{took:?}"
        );
    }

    /// Closing a TLS stream whose peer stopped reading: the close_notify waits behind the
    /// records the peer never took, and the close fails with `TimedOut` at the write limit
    /// instead of waiting for good (real rustls on both ends of an in-memory pipe).
    #[tokio::test(start_paused = true)]
    async fn closing_a_tls_stream_the_peer_stopped_reading_fails_at_the_limit() {
        let dir = std::env::temp_dir().join(format!("limpet-relay-tls-{}", std::process::id()));
        let names = ["node".to_owned()];
        let (cert, key) =
            crate::tls::write_self_signed(&dir, "node", &names, true).expect("certificate");
        let spec = crate::tls::CertSpec {
            cert: &cert,
            key: &key,
            names: &[],
        };
        let server = crate::tls::server_config(&[spec], &[]).expect("server config");
        let _ = std::fs::remove_dir_all(&dir);
        let client = crate::health::insecure_tls_config().expect("client config");
        let (ours, theirs) = tokio::io::duplex(4096);
        let name = rustls_pki_types::ServerName::try_from("node").expect("name");
        let (ours, theirs) = tokio::join!(
            tokio_rustls::TlsConnector::from(client).connect(name, ours),
            tokio_rustls::TlsAcceptor::from(Arc::new(server)).accept(theirs),
        );
        let (ours, _theirs) = (ours.expect("client handshake"), theirs.expect("handshake"));

        let limit = Duration::from_secs(5);
        let mut w = WriteDeadline::new(ours, WriteLimit::new(limit));
        // Fill the pipe: the peer reads nothing more. The limit counts from the write that
        // could not proceed; the close after it waits on the same clock.
        let blocked_since = loop {
            let start = Instant::now();
            match tokio::time::timeout(Duration::from_millis(10), w.write(&[7u8; 1024])).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => panic!("write: {e}"),
                Err(_) => break start,
            }
        };
        let e = tokio::time::timeout(limit * 3, w.shutdown())
            .await
            .expect("the close ends at the write limit, not never")
            .expect_err("the peer took nothing");
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        let took = blocked_since.elapsed();
        assert!(
            took >= limit && took < limit + Duration::from_secs(1),
            "{took:?}"
        );
    }

    /// The stall rule counts from the moment a pump began waiting to write, not from its
    /// last earlier progress, while the other direction keeps the relay busy: bytes the
    /// client took at once at 0 s, then at 5 s bytes it never takes, with the client sending
    /// every second throughout. The relay ends as stalled towards the client `idle` after
    /// 5 s. (A pump that noted nothing before waiting would never be seen stalled; one that
    /// counted from its last progress would end at `idle` after 0 s.)
    #[tokio::test(start_paused = true)]
    async fn a_stall_counts_from_when_the_write_began_to_wait() {
        let idle = Duration::from_secs(10);
        let (client, mut client_peer) = tokio::io::duplex(64);
        let (node, mut node_peer) = tokio::io::duplex(64 * 1024);
        let start = Instant::now();
        let relay = relay(client, node, idle, Framing::Bytes, std::future::pending());
        let peers = async {
            node_peer.write_all(b"hello").await.expect("node writes");
            let mut got = [0u8; 5];
            client_peer
                .read_exact(&mut got)
                .await
                .expect("client reads");
            assert_eq!(&got, b"hello");
            let pings = async {
                loop {
                    client_peer.write_all(b".").await.expect("client writes");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            };
            let node_side = async {
                tokio::time::sleep(Duration::from_secs(5)).await;
                // More than the client's pipe holds: the write to it waits from here.
                node_peer
                    .write_all(&[7u8; 4096])
                    .await
                    .expect("node writes");
                let mut sink = [0u8; 64];
                loop {
                    if node_peer.read(&mut sink).await.expect("pings") == 0 {
                        std::future::pending::<()>().await;
                    }
                }
            };
            tokio::join!(pings, node_side);
        };
        let end = tokio::time::timeout(Duration::from_secs(60), async {
            tokio::select! {
                end = relay => end,
                () = peers => unreachable!("the peers never finish"),
            }
        })
        .await
        .expect("the relay ended");
        let took = start.elapsed();
        assert!(
            matches!(end, RelayEnd::Stalled(Direction::Down)),
            "stalled towards the client: {end:?}"
        );
        let wait_began = Duration::from_secs(5);
        assert!(
            took >= wait_began + idle && took < wait_began + idle + Duration::from_secs(1),
            "ended {took:?} after the start"
        );
    }

    /// A stream whose end has already come when its last bytes are read: those bytes are
    /// written as its last (to leave with the FIN), then the writer is shut down.
    #[tokio::test]
    async fn bytes_the_end_of_stream_follows_at_once_are_written_as_the_last() {
        let mut p = Pump::new(Direction::Down, false);
        let (mut w, _events) = Recorder::new();
        let answer = b"HTTP/1.1 200 OK\r\n\r\nok";
        let mut node: &[u8] = answer;
        p.run(&mut node, &mut w, &Clock::new(None), true)
            .await
            .expect("relayed");
        assert_eq!(w.writes, vec![(answer.to_vec(), true)]);
        assert!(w.shut, "then the half-close");
        assert_eq!(p.bytes, answer.len() as u64);

        // A writer that is not a plain TCP socket gets them as any other bytes.
        let mut p = Pump::new(Direction::Down, false);
        let (mut w, _events) = Recorder::new();
        let mut node: &[u8] = answer;
        p.run(&mut node, &mut w, &Clock::new(None), false)
            .await
            .expect("relayed");
        assert_eq!(w.writes, vec![(answer.to_vec(), false)]);
        assert!(w.shut);
    }

    /// Bytes with more to come are written as they are; only the bytes the end follows are
    /// the last. The end of a stream that comes later, after an empty read, is a plain
    /// shutdown.
    #[tokio::test]
    async fn only_the_bytes_right_before_the_end_are_the_last() {
        let (mut node, mut node_side) = tokio::io::duplex(1024);
        let (mut w, mut events) = Recorder::new();
        let mut p = Pump::new(Direction::Down, false);
        let clock = Clock::new(None);
        let feed = async {
            node_side.write_all(b"first").await.expect("write");
            events.recv().await.expect("the first write");
            node_side.write_all(b"second").await.expect("write");
            drop(node_side);
        };
        let (ran, ()) = tokio::join!(p.run(&mut node, &mut w, &clock, true), feed);
        ran.expect("relayed");
        assert_eq!(
            w.writes,
            vec![(b"first".to_vec(), false), (b"second".to_vec(), true)]
        );
        assert!(w.shut);

        // The end alone, after the bytes were written: nothing is written as the last.
        let (mut node, mut node_side) = tokio::io::duplex(1024);
        let (mut w, mut events) = Recorder::new();
        let mut p = Pump::new(Direction::Down, false);
        let feed = async {
            node_side.write_all(b"only").await.expect("write");
            events.recv().await.expect("the write");
            drop(node_side);
        };
        let (ran, ()) = tokio::join!(p.run(&mut node, &mut w, &clock, true), feed);
        ran.expect("relayed");
        assert_eq!(w.writes, vec![(b"only".to_vec(), false)]);
        assert!(w.shut);
    }

    /// A direction may leave its end to the relay's close only once the other has passed its
    /// own end on. While the other is still in a shutdown that has not completed, it shuts
    /// down itself: its last bytes, held for the FIN, must not wait for the relay to end.
    #[tokio::test]
    async fn an_end_is_left_to_the_close_only_once_the_other_end_was_passed_on() {
        let clock = Clock::new(None);
        // Down: the node ended; its shutdown towards the client does not complete.
        let (mut to_client, _e1) = Recorder::new();
        to_client.shutdown_stuck = true;
        let mut down = Pump::new(Direction::Down, false);
        let mut node: &[u8] = b"";
        let down_run = down.run(&mut node, &mut to_client, &clock, true);
        tokio::pin!(down_run);
        let pending =
            std::future::poll_fn(|cx| Poll::Ready(down_run.as_mut().poll(cx).is_pending()));
        assert!(pending.await, "stuck in its shutdown");
        // Up: the client's last bytes and its end, to a plain TCP node.
        let (mut to_node, _e2) = Recorder::new();
        let mut up = Pump::new(Direction::Up, false);
        let mut client: &[u8] = b"bye";
        up.run(&mut client, &mut to_node, &clock, true)
            .await
            .expect("relayed");
        assert_eq!(to_node.writes, vec![(b"bye".to_vec(), true)]);
        assert!(to_node.shut, "shut down now, not left to the close");

        // Once the other end was passed on, the close sends the FIN.
        let (mut to_node, _e3) = Recorder::new();
        let mut up = Pump::new(Direction::Up, false);
        let mut client: &[u8] = b"bye";
        clock.ended[1].store(true, Ordering::Relaxed);
        up.run(&mut client, &mut to_node, &clock, true)
            .await
            .expect("relayed");
        assert!(!to_node.shut, "left to the close");
    }

    /// A read error right after bytes: the bytes are still written, then the error ends the
    /// pump (as when the error came at the next read), without a shutdown.
    #[tokio::test]
    async fn bytes_read_before_an_error_are_written_before_the_error_ends_the_pump() {
        struct ThenReset(Option<&'static [u8]>);
        impl AsyncRead for ThenReset {
            fn poll_read(
                mut self: Pin<&mut Self>,
                _: &mut Context<'_>,
                buf: &mut ReadBuf<'_>,
            ) -> Poll<io::Result<()>> {
                match self.0.take() {
                    Some(b) => {
                        buf.put_slice(b);
                        Poll::Ready(Ok(()))
                    }
                    None => Poll::Ready(Err(io::ErrorKind::ConnectionReset.into())),
                }
            }
        }
        let (mut w, _events) = Recorder::new();
        let mut p = Pump::new(Direction::Up, false);
        let err = p
            .run(
                &mut ThenReset(Some(b"abc")),
                &mut w,
                &Clock::new(None),
                true,
            )
            .await
            .expect_err("the reset");
        assert_eq!(err.kind(), io::ErrorKind::ConnectionReset);
        assert_eq!(w.writes, vec![(b"abc".to_vec(), false)]);
        assert!(!w.shut);
    }

    /// Reads land in the buffer's spare capacity: what a read brought is exactly the bytes
    /// held, and a read never takes more than the buffer's size.
    #[tokio::test]
    async fn a_read_fills_the_buffer_up_to_its_size_and_holds_exactly_what_came() {
        let mut p = Pump::new(Direction::Down, false);
        let big = vec![9u8; PUMP_START + 10];
        let mut src: &[u8] = &big;
        assert_eq!(p.fill(&mut src).await.expect("read"), PUMP_START);
        assert_eq!((p.pos, p.buf.len()), (0, PUMP_START));
        p.pos = p.buf.len();
        assert_eq!(p.fill(&mut src).await.expect("read"), 10);
        assert_eq!(&p.buf[..], &[9u8; 10][..]);
        assert_eq!(p.fill(&mut src).await.expect("read"), 0, "then the end");
    }

    /// A byte relay with a 60 s idle time and no FIN on close, watching `opening`.
    async fn watched<C: Io, N: Io>(
        client: C,
        node: N,
        stop: impl Future<Output = &'static str>,
        opening: Option<Opening<'_>>,
    ) -> (RelayEnd, u64, u64) {
        relay_counted(
            client,
            node,
            Duration::from_secs(60),
            Framing::Bytes,
            FinOnClose::default(),
            stop,
            opening,
        )
        .await
    }

    /// A relay that watches its opening: a node that ends its stream before any byte moved
    /// ends the relay as `Unused`, with the client side untouched (the client gets no FIN
    /// and can still be written to and read from) and `on_open` never called. Once the
    /// client's bytes are read, the opening is over (`on_open` called once, when they
    /// are): the node's end is then an ordinary one, passed on to the client.
    #[tokio::test]
    async fn a_node_that_ends_before_any_byte_moved_leaves_the_client_untouched() {
        let opened = AtomicU64::new(0);
        let on_open = || {
            opened.fetch_add(1, Ordering::Relaxed);
        };
        let opening = |window| {
            Some(Opening {
                window,
                on_open: &on_open,
            })
        };
        let window = Duration::from_secs(5);
        let (mut client, mut client_peer) = tokio::io::duplex(1024);
        let (node, node_peer) = tokio::io::duplex(1024);
        drop(node_peer);
        let (end, up, down) =
            watched(&mut client, node, std::future::pending(), opening(window)).await;
        assert!(
            matches!(end, RelayEnd::Unused(Unused::Dropped(_))),
            "{end:?}"
        );
        assert_eq!((up, down, opened.load(Ordering::Relaxed)), (0, 0, 0));
        // Untouched: both ways still open.
        client.write_all(b"to client").await.expect("write");
        let mut got = [0u8; 9];
        client_peer.read_exact(&mut got).await.expect("read");
        client_peer.write_all(b"hi").await.expect("write");
        let mut got = [0u8; 2];
        client
            .read_exact(&mut got)
            .await
            .expect("the client's bytes are still there");

        // A close signal with nothing moved: unused too, the client untouched.
        let (node, _node_peer) = tokio::io::duplex(1024);
        let (end, ..) = watched(
            &mut client,
            node,
            std::future::ready("node down"),
            opening(window),
        )
        .await;
        assert!(
            matches!(end, RelayEnd::Unused(Unused::Stopped("node down"))),
            "{end:?}"
        );
        client.write_all(b"hi").await.expect("write");
        client_peer.read_exact(&mut got).await.expect("read");

        // The client speaks first: its bytes end the opening, and the node's end is passed on.
        let (node, mut node_peer) = tokio::io::duplex(1024);
        let nodeside = async {
            let mut got = [0u8; 5];
            node_peer.read_exact(&mut got).await.expect("node reads");
            assert_eq!(&got, b"hello");
            drop(node_peer);
        };
        let clientside = async {
            client_peer
                .write_all(b"hello")
                .await
                .expect("client writes");
            let mut rest = Vec::new();
            client_peer
                .read_to_end(&mut rest)
                .await
                .expect("the node's end");
            client_peer.shutdown().await.expect("the client's end");
            rest
        };
        let (relayed, (), rest) = tokio::join!(
            watched(&mut client, node, std::future::pending(), opening(window)),
            nodeside,
            clientside
        );
        assert!(matches!(relayed.0, RelayEnd::Done(5, 0)), "{:?}", relayed.0);
        assert!(rest.is_empty());
        assert_eq!(opened.load(Ordering::Relaxed), 1, "on_open called once");
    }

    /// Past the opening's window, a node that ends a connection nothing moved on is ending
    /// a session like any other (a server's timeout for a silent client): its end is passed
    /// on to the client, and `on_open` is called (the connect held).
    #[tokio::test(start_paused = true)]
    async fn a_node_that_ends_a_silent_session_past_the_window_is_passed_on() {
        let opened = AtomicU64::new(0);
        let on_open = || {
            opened.fetch_add(1, Ordering::Relaxed);
        };
        let (client, mut client_peer) = tokio::io::duplex(1024);
        let (node, node_peer) = tokio::io::duplex(1024);
        let nodeside = async {
            tokio::time::sleep(Duration::from_secs(2)).await;
            drop(node_peer);
        };
        let clientside = async {
            let mut rest = Vec::new();
            client_peer
                .read_to_end(&mut rest)
                .await
                .expect("the node's end");
            drop(client_peer);
            rest
        };
        let (relayed, (), rest) = tokio::join!(
            watched(
                client,
                node,
                std::future::pending(),
                Some(Opening {
                    window: Duration::from_secs(1),
                    on_open: &on_open,
                })
            ),
            nodeside,
            clientside
        );
        assert!(matches!(relayed.0, RelayEnd::Done(0, 0)), "{:?}", relayed.0);
        assert!(rest.is_empty());
        assert_eq!(opened.load(Ordering::Relaxed), 1);
    }
}
