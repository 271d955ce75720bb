//! TCP mode: raw byte relays between clients and nodes, with table affinity, failover,
//! PROXY protocol, TLS on either side, and sessions that close when their node goes down.
//!
//! ```text
//!  accept ─► PROXY header? (trusted peers only) ─► TLS accept? ─► key = source IP
//!     ─► State::route (the core's one decision: table pin, else fresh + pin) ─► connect node
//!              ▲                                            │ refused: passive failure
//!              └──────── route again, excluding it ◄────────┘
//!                                                         ▼
//!     send PROXY header? ─► TLS to node? ─► relay: copy both ways (half-close passed on)
//!                                           until both sides are done, or idle timeout,
//!                                           or the node's state ends the session
//!                                           (NodeRuntime::session_end), or shutdown.
//!              ▲                                            │ the node dropped it before any
//!              └──────── route again, excluding it ◄────────┘ byte moved: passive failure
//! ```
//!
//! The relay's opening ([`Opening`]): until a first byte moves either way, the node has taken
//! nothing of the client's and given nothing, so a node that closes or resets the connection
//! within the connect timeout (a listen queue reset as a restart closes it) loses the session
//! no byte: it routes again, with the client's connection untouched, and the node is charged
//! as for a refused connect. So does a session whose node leaves rotation then, nothing
//! charged. The connect's success is observed when the opening ends with a move, so that a
//! node that drops every session goes DOWN.
//!
//! Accepting the client and connecting to the node go through [`crate::net`], and the relay
//! is [`crate::relay`]: the same code HTTP listeners and WebSocket tunnels use. Half-close: when one
//! side ends its stream (FIN), the relay shuts down the write side of the other and keeps
//! copying the other direction until it ends too. Idle: a session with no byte either way for
//! `timeouts.idle`, or with bytes one side has not read for that long, is closed.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use limpet_core::proxy_protocol::{self, Header, ParseError};
use limpet_core::{Excluded, NodeId, Observation, RouteInput};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::clock;
use crate::config::{ListenerDef, ProxyProtocolDef};
use crate::error::{Stage, UpstreamError};
use crate::logging::access::{Ms, Or, PinText};
use crate::relay::{relay_counted, Direction, FinOnClose, Framing, Opening, RelayEnd, Unused};
use crate::runtime::{Runtime, SeenIn, State};

/// A byte stream limpet relays: TCP, or TLS over TCP, on either side.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send {
    /// `poll_write` for bytes the stream's end follows at once (its shutdown, or its close
    /// once nothing is left to read). A plain TCP socket holds them back (`MSG_MORE`) so that
    /// they leave in one segment with the FIN: a short session (a `Connection: close`
    /// answer through a TCP listener) then costs two packets fewer, the separate FIN and the
    /// peer's ACK of the data. HAProxy does the same. Other streams just write.
    fn poll_write_last(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write(cx, buf)
    }

    /// The stream is being cut, not ended: its close resets the connection (an RST, with
    /// `SO_LINGER` 0) instead of sending a FIN. A peer in the middle of an upload then sees
    /// the transfer aborted; a FIN would tell it the stream ended whole, and a print server
    /// would print a truncated job. Streams with no socket of their own do nothing.
    fn abort_on_close(&self) {}
}

/// [`Io::abort_on_close`] of any TCP socket. Best effort: a socket that refuses the option
/// ends with a FIN.
pub(crate) fn zero_linger(s: impl std::os::fd::AsFd) {
    let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
}

impl Io for TcpStream {
    fn abort_on_close(&self) {
        zero_linger(self);
    }

    #[cfg(target_os = "linux")]
    fn poll_write_last(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let s: &TcpStream = self.get_mut();
        loop {
            std::task::ready!(s.poll_write_ready(cx))?;
            // What tokio's own write does (a send that would block clears the readiness),
            // with MSG_MORE: the kernel queues the bytes until the FIN, or a later write
            // without the flag, pushes them out.
            match s.try_io(tokio::io::Interest::WRITABLE, || send_more(s, buf)) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                r => return Poll::Ready(r),
            }
        }
    }
}

/// A send with `MSG_MORE` (see [`Io::poll_write_last`]), on any TCP socket.
#[cfg(target_os = "linux")]
pub(crate) fn send_more(s: impl std::os::fd::AsFd, buf: &[u8]) -> io::Result<usize> {
    socket2::SockRef::from(&s).send_with_flags(buf, libc::MSG_MORE | libc::MSG_NOSIGNAL)
}

impl<S: Io> Io for Prefixed<S> {
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

impl<S: Io + ?Sized> Io for Box<S> {
    fn poll_write_last(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut **self).poll_write_last(cx, buf)
    }

    fn abort_on_close(&self) {
        (**self).abort_on_close();
    }
}

// A relay that lends its client stream back when the session moves on
// ([`RelayEnd::Unused`]).
impl<S: Io + ?Sized> Io for &mut S {
    fn poll_write_last(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut **self).poll_write_last(cx, buf)
    }

    fn abort_on_close(&self) {
        (**self).abort_on_close();
    }
}

// TLS sides write their records as they are: the stream's end is a `close_notify` record
// first, which the shutdown writes. Cut, the socket under them resets.
impl<S: Io> Io for tokio_rustls::server::TlsStream<S> {
    fn abort_on_close(&self) {
        self.get_ref().0.abort_on_close();
    }
}
impl<S: Io> Io for tokio_rustls::client::TlsStream<S> {
    fn abort_on_close(&self) {
        self.get_ref().0.abort_on_close();
    }
}
// An upgraded HTTP connection whose stream hyper does not give back (not one of the
// proxy's own, `proxy::upgrade`) is relayed as it comes out of hyper: it has no socket to
// reset.
impl<T> Io for hyper_util::rt::TokioIo<T> where T: hyper::rt::Read + hyper::rt::Write + Unpin + Send {}

/// A stream with bytes already read from it put back in front (what followed a PROXY header,
/// or what turned out not to be one). Every accepted client stream is one, so it is also
/// where small vectored writes become one plain write (`COALESCE_MAX`).
#[derive(Debug)]
pub struct Prefixed<S> {
    prefix: Vec<u8>,
    pos: usize,
    inner: S,
}

impl<S> Prefixed<S> {
    pub fn new(prefix: Vec<u8>, inner: S) -> Self {
        Prefixed {
            prefix,
            pos: 0,
            inner,
        }
    }

    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The stream behind the prefix, to read from it directly (bytes read that way are the
    /// caller's to put back).
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Puts `bytes` in front of what is left to read: what the HTTP client side's first read
    /// took ahead, or what an HTTP/1 connection had read but not yet parsed when it was
    /// parked (`proxy::client_io`).
    pub fn put_back(&mut self, mut bytes: Vec<u8>) {
        if self.pos < self.prefix.len() {
            bytes.extend_from_slice(&self.prefix[self.pos..]);
        }
        self.prefix = bytes;
        self.pos = 0;
    }

    /// What is left to read of the prefix.
    pub fn unread(&self) -> &[u8] {
        self.prefix.get(self.pos..).unwrap_or_default()
    }

    /// Puts `bytes` behind what is left to read of the prefix (bytes just read from the
    /// stream itself, behind bytes read earlier).
    pub fn append(&mut self, bytes: &[u8]) {
        if self.pos > 0 {
            self.prefix.drain(..self.pos);
            self.pos = 0;
        }
        self.prefix.extend_from_slice(bytes);
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.pos < self.prefix.len() {
            let n = (self.prefix.len() - self.pos).min(buf.remaining());
            let start = self.pos;
            buf.put_slice(&self.prefix[start..start + n]);
            self.pos += n;
            if self.pos == self.prefix.len() {
                self.prefix = Vec::new();
                self.pos = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    /// Small writes in several slices go out as one plain write (see `COALESCE_MAX`).
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let mut inner = Pin::new(&mut self.inner);
        match as_one_write(bufs, |one| inner.as_mut().poll_write(cx, one)) {
            Some(written) => written,
            None => inner.poll_write_vectored(cx, bufs),
        }
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

/// Vectored writes of at most this many bytes in all are copied into one buffer and written
/// with one plain write. An answer's head and a small body come to a client stream as two
/// slices (hyper writes vectored), and `writev` goes through the VFS layer (`vfs_writev`,
/// the iovec copied in, `fdget_pos`) where `send` goes straight to the socket; copying a few
/// KiB costs less than that difference. TLS streams gain twice: the plaintext reaches rustls
/// in one piece, and rustls's records, written vectored, leave with `send` too. Measured
/// (`bench/cost.sh --only limpet`, alternating runs): system CPU per request -3 to -5% and
/// requests/s +2.5% on `sticky` and `plain`, +2.7% on `https`, +1.4% on `h2-tls`. Larger
/// writes stay vectored: there the copy would cost more than it saves.
pub(crate) const COALESCE_MAX: usize = 4 * 1024;

/// `write` of `bufs` as one slice: the one there is, or all of them copied into one buffer
/// when they come to at most [`COALESCE_MAX`]; `None` (nothing written) when they are more.
pub(crate) fn as_one_write<R>(
    bufs: &[io::IoSlice<'_>],
    write: impl FnOnce(&[u8]) -> R,
) -> Option<R> {
    if let [one] = bufs {
        return Some(write(one));
    }
    if bufs.iter().map(|b| b.len()).sum::<usize>() > COALESCE_MAX {
        return None;
    }
    // Taken out of the thread's slot for the write, so a write below that coalesces too
    // (TLS records under a coalesced answer) finds the slot empty and uses a buffer of its
    // own rather than this one.
    let mut one = COALESCED.take();
    one.clear();
    for b in bufs {
        one.extend_from_slice(b);
    }
    let written = write(&one);
    COALESCED.set(one);
    Some(written)
}

thread_local! {
    /// The buffer small vectored writes are coalesced in: one per thread, kept between
    /// writes, never held across an await (a write that returns `Pending` is retried with
    /// its slices by its caller).
    static COALESCED: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// What the first bytes of a connection said about its client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    /// The real client: from the PROXY header when a trusted peer sent one, else the peer.
    pub client: SocketAddr,
    /// The address the client connected to (the PROXY header's destination, or ours).
    pub local: SocketAddr,
}

/// Reads a PROXY header from a trusted peer. From any other peer nothing is read and the
/// peer's own address stands: a client cannot claim another address by sending a header,
/// its bytes are simply payload. A trusted peer that sends no header (its first bytes cannot
/// start one) is served with its own address; a malformed header, or none complete within
/// `header_timeout`, refuses the connection.
pub async fn read_proxy_header<S: AsyncRead + Unpin>(
    mut stream: S,
    peer: SocketAddr,
    local: SocketAddr,
    pp: &ProxyProtocolDef,
) -> io::Result<(Peer, Prefixed<S>)> {
    let direct = Peer {
        client: peer,
        local,
    };
    if !pp.accept_from.iter().any(|n| n.contains(peer.ip())) {
        return Ok((direct, Prefixed::new(Vec::new(), stream)));
    }
    let mut buf = Vec::with_capacity(256);
    let read = async {
        loop {
            match proxy_protocol::parse(&buf) {
                Ok(p) => {
                    let rest = buf[p.consumed..].to_vec();
                    let who = match p.header {
                        Header::Proxied { src, dst } => Peer {
                            client: src,
                            local: dst,
                        },
                        Header::Unknown => direct,
                    };
                    return Ok((who, rest));
                }
                Err(ParseError::NotProxy) => return Ok((direct, std::mem::take(&mut buf))),
                Err(ParseError::Invalid(why)) => {
                    return Err(io::Error::new(io::ErrorKind::InvalidData, why))
                }
                Err(ParseError::Incomplete) => {}
            }
            // Read only what we need past the buffer (never past V2_MAX_LEN).
            let mut chunk = [0u8; 512];
            let room = (proxy_protocol::V2_MAX_LEN - buf.len()).min(chunk.len());
            let n = stream.read(&mut chunk[..room.max(1)]).await?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "closed before the PROXY header ended",
                ));
            }
            buf.extend_from_slice(&chunk[..n]);
        }
    };
    let (who, rest) = tokio::time::timeout(pp.header_timeout, read)
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no PROXY header in time"))??;
    Ok((who, Prefixed::new(rest, stream)))
}

/// The PROXY header to send a node for this client, if the listener sends one.
pub fn proxy_header_for(pp: &ProxyProtocolDef, who: &Peer) -> Option<Vec<u8>> {
    let v = pp.send?;
    let mut out = Vec::with_capacity(64);
    match v {
        proxy_protocol::Version::V1 => proxy_protocol::write_v1(who.client, who.local, &mut out),
        proxy_protocol::Version::V2 => proxy_protocol::write_v2(who.client, who.local, &mut out),
    }
    Some(out)
}

/// Resolves once `rx` says true (or its sender is gone). The `watch::Ref` that `wait_for`
/// returns is not `Send`, so it must not live in a `select!` output.
pub(crate) async fn stopped(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

/// The reason a session is cut with at a shutdown's end.
const SHUTDOWN: &str = "shutdown";

/// TCP sessions refused at a node's queue (`max_connections`), logged at most once per
/// interval with the count.
static SESSION_REFUSED: crate::net::RateLimitedLog =
    crate::net::RateLimitedLog::new("TCP session refused: the node's queue is full or timed out");
/// TCP sessions with no node to go to, logged likewise.
static NO_NODE: crate::net::RateLimitedLog =
    crate::net::RateLimitedLog::new("TCP session refused: no node available");

/// A connection to a node that succeeded, with its handshake done (PROXY header sent, TLS
/// to the node established), and the session's spread key.
struct Connected {
    node: NodeId,
    /// How the route chose the node, for the access log.
    outcome: limpet_core::Outcome,
    stream: Box<dyn Io>,
    /// The session's watch for moves off the node, made at its route.
    moves: Option<crate::nodes::MoveWatch>,
    /// The listener's settings the node was reached with (the running config's when the
    /// session waited across a reload): how the session ends follows them.
    def: Arc<ListenerDef>,
    /// The table entry the session keeps while it is open ([`crate::runtime::keep_pin`]).
    hold: Option<crate::runtime::PinHold>,
    /// The session's slot among the node's `max_connections`.
    _admitted: Option<crate::nodes::Admitted>,
    /// What the completed connect tells of the node, observed once the relay's opening ends
    /// with a move ([`relay_counted`]'s `on_open`), not at the connect: a node that takes
    /// connections and drops them at once (in a rolling restart, those its kernel completed
    /// into its listen queue) would otherwise have each connect reset the failure streak its
    /// drop adds to, and never go DOWN. `None`: observed at the connect, which decided the
    /// node's trial.
    on_open: Option<Observation>,
    /// Where what the session sees of the node is observed, when not in its own generation
    /// (it connected where a reload since put the node).
    seen_in: Option<SeenIn>,
}

/// Why no session opened, as the access log says it: `end` (`no-node`: no node could take
/// it; `queue-full`, `queue-timeout`: its node's queue refused it; `out-of-fds`: limpet ran
/// out of descriptors connecting; `cut`: a shutdown's drain ended while it waited in its
/// node's queue, with `cut` the reason), and the node when there was one.
struct NoSession {
    end: &'static str,
    cut: Option<&'static str>,
    node: Option<NodeId>,
}

impl NoSession {
    /// No session, for the reason `end`.
    fn refused(end: &'static str, node: Option<NodeId>) -> Self {
        NoSession {
            end,
            cut: None,
            node,
        }
    }

    /// Still in `node`'s queue when a shutdown's drain ended: cut then (`end=cut
    /// cut=shutdown`), as the open sessions are.
    fn cut_at_shutdown(node: NodeId) -> Self {
        NoSession {
            end: "cut",
            cut: Some("shutdown"),
            node: Some(node),
        }
    }
}

/// Why [`connect`] gave no node stream.
enum NotConnected {
    /// No session opens.
    No(NoSession),
    /// The session routes again, and a reload came since its generation: it routes on in
    /// the running one ([`follow_reload`]).
    Reloaded,
}

impl From<NoSession> for NotConnected {
    fn from(no: NoSession) -> Self {
        NotConnected::No(no)
    }
}

/// Moves a session of listener `li` of `state` to the running generation when a reload
/// came since `state`: for a session that routes after it (its PROXY header or TLS
/// handshake straddled the reload, or it routes again after leaving a queue or a failed
/// node). Nodes the reload added are candidates then, ones it removed are not: routed over
/// its own generation, a session that waited across a blue/green reload found every node
/// gone and was closed while the next one was served. The listener's settings are the
/// running ones; the nodes that failed the session are carried by name, those the running
/// generation lacks kept aside in `gone` and excluded again should a later reload add them
/// back (so that the session's attempts stay bounded by the node names it meets). False
/// when there is nothing to follow: no newer generation (generations only rise: one
/// installed but not yet numbered as the runtime's is not followed back), or no listener of
/// the name in it (a reload never removes one).
fn follow_reload(
    runtime: &Runtime,
    (state, li, def): (&mut Arc<State>, &mut usize, &mut Arc<ListenerDef>),
    failed: &mut Vec<Excluded>,
    gone: &mut Vec<(Box<str>, limpet_core::RepinReason)>,
) -> bool {
    if runtime.generation() <= state.generation() {
        return false;
    }
    let now = runtime.state();
    let Some((li_now, def_now)) = now
        .listeners
        .iter()
        .map(|l| l.def.load_full())
        .enumerate()
        .find(|(_, d)| d.name == def.name)
    else {
        return false;
    };
    *failed = state.carry_excluded(failed, &now, gone);
    *state = now;
    *li = li_now;
    *def = def_now;
    true
}

/// Routes the connection through the one core decision ([`State::route`]) and connects,
/// routing again without every node that failed (each a passive failure; the table's entry
/// moves with the route), and without those in `failed` already (a node that dropped the
/// session unused). An attempt is the whole way to a usable node stream (connect, the
/// PROXY header, TLS to the node), and nothing of the client's has been sent before it
/// succeeds, so every failure is safe to take to another node. The route claims a DOWN node's
/// trial; one someone else holds is skipped. `(who, local_port)`: the client, and the port of
/// limpet's own socket it reached.
async fn connect(
    runtime: &Arc<Runtime>,
    state: &Arc<State>,
    li: usize,
    def: &Arc<ListenerDef>,
    (who, local_port): (&Peer, u16),
    cut: &mut watch::Receiver<bool>,
    failed: &mut Vec<Excluded>,
) -> Result<Connected, NotConnected> {
    let slot = state
        .listeners
        .get(li)
        .ok_or(NoSession::refused("no-node", None))?;
    let table = slot.table.as_deref();
    let ip = who.client.ip();
    let key = table.and_then(|t| t.key_spec().request_key(ip, std::iter::empty::<&[u8]>()));
    let spread = crate::runtime::spread_of(key, ip, None);
    // Fleet mode: a key this instance holds no pin for asks the store first (bounded).
    if let (Some(t), Some(k)) = (table, key) {
        t.prefetch(k).await;
    }
    // A DOWN node's trial is decided by the connect: its wait in the node's queue, then the
    // connect, the PROXY header and the TLS handshake, each within `connect`. The claim ends
    // with the attempt, whatever ends it.
    let trial_hold = def.timeouts.queue + def.timeouts.connect * 3;
    // A completed TLS handshake with the node is its process answering: with TLS to the
    // nodes, a session decides a trial as an HTTP answer does (a node DOWN on handshake
    // timeouts, which count as unanswered, would otherwise wait for an HTTP request that a
    // TCP-only node never gets). Only where no HTTP listener could try the node: a handshake
    // proves its TLS end speaks, not that its HTTP handlers answer (a sidecar, a live thread
    // beside hung ones), and counted as an answer it would reset the count of an HTTP request
    // left unanswered.
    let tls_answers = def.upstream_tls.is_some()
        && !state
            .listeners
            .iter()
            .any(|l| l.def.load().mode == crate::config::Mode::Http);
    let by = if tls_answers {
        crate::nodes::TrialBy::Answer
    } else {
        crate::nodes::TrialBy::Connect
    };
    // Each turn adds a node to `failed`, so this ends within the node count (or returns
    // to follow a reload, which keeps the failed nodes by name: `follow_reload`).
    loop {
        if !failed.is_empty() && runtime.generation() > state.generation() {
            return Err(NotConnected::Reloaded);
        }
        let input = RouteInput {
            cookie: None,
            failback: false,
            conn_pin: None,
            table: None,
            spread_key: spread,
            balance: def.balance,
            exclude: failed,
            now_ms: clock::now_ms(),
        };
        let (route, trial) = if failed.is_empty() {
            // The first route may wait for another session's trial of its own node.
            state
                .route_first(table.zip(key), input, None, trial_hold, by)
                .await
        } else {
            state.route(table.zip(key), input, None, trial_hold, by)
        };
        if trial.is_none() && failed.is_empty() {
            // As a session would try the node: the connect, a PROXY header, the TLS
            // handshake. (The listener's definition is shared only when a trial is made.)
            let now = clock::now_ms();
            let tried = own_connect_trial(state, now, (def, local_port), by);
            if !tried && by == crate::nodes::TrialBy::Connect {
                try_due_answer_trial(state, now, def, local_port);
            }
        }
        let Some(node) = route.node else {
            // A reload since the session's generation was taken (its first route may have
            // waited for a trial): routed once more, in the running one.
            if runtime.generation() > state.generation() {
                return Err(NotConnected::Reloaded);
            }
            NO_NODE.note(&def.name);
            return Err(NoSession::refused("no-node", None).into());
        };
        // Watched from the route on: a move of the session off this node while it connects
        // (another of its connections failed there) ends it as soon as it runs.
        let rt = state.node_rt(node);
        let moves = rt.map(|rt| rt.watch(spread));
        // And its health going DOWN while the session waits in its queue or connects: the
        // attempt stops there ([`crate::nodes::unless_down`]).
        let down = rt.map(|rt| rt.watch_down());
        // A node at its max_connections: the session waits in its queue, as HTTP requests
        // do; refused (queue full or timed out), the client's connection is closed.
        // The wait in the queue ends when a shutdown's drain does: the session would be cut
        // then anyway. (The attempt is not watched: watching the drain there too cost 4 % of
        // a `tcp-close` session's instructions. One still connecting at the drain's end has
        // the listener's last second, `CUT_GRACE`, to connect and be cut with a line; after
        // that its task is dropped without one.)
        let admitted = match rt {
            Some(rt) => match until_cut(
                cut,
                node,
                rt.admit_watching(def.timeouts.queue, spread, trial.is_some(), moves.as_ref()),
            )
            .await?
            {
                Ok(a) => Some(a),
                // The node left rotation (DOWN, MAINT, past a drain) while the session
                // waited: it routes again without the node, nothing charged.
                Err(crate::nodes::Refused::Left(why)) => {
                    failed.push(Excluded { node, why });
                    continue;
                }
                Err(r) => {
                    // Clients drive how often this happens: rate-limited, as a log line per
                    // refused connection would let them fill the log.
                    SESSION_REFUSED.note(&format!(
                        "listener {}, node {}: {}",
                        def.name,
                        state.node_name(node),
                        r.as_str()
                    ));
                    let why = match r {
                        crate::nodes::Refused::QueueTimeout => "queue-timeout",
                        _ => "queue-full",
                    };
                    return Err(NoSession::refused(why, Some(node)).into());
                }
            },
            None => None,
        };
        // Moved off the node while it waited in the queue: no attempt there.
        if moved_off(moves.as_ref(), node, failed) {
            continue;
        }
        // Where and how the running config reaches the node: a reload while the session
        // waited in the queue may have moved it or changed the listener's TLS or PROXY
        // header to nodes. A node the reload removed is left as one set to MAINT (what the
        // reload does to it).
        let Some((def_now, addr, seen_in)) = runtime.upstream_now(state, def, node, local_port)
        else {
            failed.push(Excluded {
                node,
                why: limpet_core::RepinReason::NodeMaint,
            });
            continue;
        };
        // A node whose listen queue is full (a hung process) takes no connect: the session
        // would wait out the connect timeout after its checks took it DOWN. Nothing of the
        // client's has gone out: it routes again without the node, nothing charged.
        // Pinned where it is: moved into the race by value, the attempt's large future was
        // copied (+300 instructions a `tcp-close` session).
        let attempted = {
            let attempting = std::pin::pin!(attempt(&def_now, who, addr));
            crate::nodes::unless_down(attempting, down).await
        };
        let Some(attempted) = attempted else {
            failed.push(Excluded {
                node,
                why: limpet_core::RepinReason::NodeDown,
            });
            continue;
        };
        match attempted {
            Ok(stream) => {
                // For a TCP listener a completed handshake is all traffic can prove, and with
                // TLS to the node (no HTTP listener beside), that its process answers. A
                // trial's is observed now: it decides the trial, whose claim ends with this
                // attempt. Any other's once the session's opening ends with a move.
                let seen = if tls_answers && def_now.upstream_tls.is_some() {
                    Observation::TrafficOk
                } else {
                    Observation::TrafficConnected
                };
                let on_open = if trial.is_some() {
                    SeenIn::observe(seen_in.as_ref(), state, node, seen);
                    None
                } else {
                    Some(seen)
                };
                // The node left rotation while the session connected (DOWN by its checks or
                // by other connections' failures, MAINT, its drain ended), or, for a trial,
                // a request went unanswered since it was claimed (a connect does not decide
                // the trial of a node that left requests unanswered: its kernel completes
                // them while the process hangs; such a trial is not given to a TCP session,
                // but one may become so meanwhile). Nothing of the client's was sent: the
                // session routes again without the node, as from its queue, nothing charged.
                // Carried into the relay, the node's close signal would have cut it at once.
                // Whatever the listener's `close_on_node_down`: that keeps sessions that
                // were relaying, and this one was not.
                let left = rt.map(|rt| rt.status().session_end(clock::now_ms(), spread, true));
                if let Some(limpet_core::SessionEnd::Now(why)) = left {
                    drop(stream);
                    failed.push(Excluded { node, why });
                    continue;
                }
                // So does a session moved off the node meanwhile (another of its connections
                // failed there, the fleet re-pinned it, it failed back, its entry went
                // elsewhere): it routes again, to where the session is now. Before, the
                // relay began on the node it had left, whose move stopped it at once, but
                // only after the client's first bytes had gone to the node: both sides reset.
                if moved_off(moves.as_ref(), node, failed) {
                    drop(stream);
                    continue;
                }
                return Ok(Connected {
                    node,
                    outcome: route.outcome,
                    stream,
                    moves,
                    def: def_now,
                    hold: slot.table.as_deref().zip(key).map(|(t, k)| {
                        crate::runtime::PinHold::new(
                            Arc::clone(runtime),
                            t,
                            k.to_key(),
                            state.node_name(node),
                        )
                    }),
                    _admitted: admitted,
                    on_open,
                    seen_in,
                });
            }
            // limpet out of file descriptors: says nothing about the node, and another node
            // would fail the same way; the client's connection is closed, its pin kept.
            Err(err) if err.cause == crate::error::Cause::Local => {
                return Err(NoSession::refused("out-of-fds", Some(node)).into())
            }
            Err(err) => {
                tracing::debug!(listener = %def.name, node = state.node_name(node), error = %err, "node attempt failed");
                if let Some(obs) = err.observation() {
                    SeenIn::observe(seen_in.as_ref(), state, node, obs);
                }
                failed.push(Excluded {
                    node,
                    why: err.repin_reason(),
                });
            }
        }
    }
}

/// Whether the session was moved off `node` since its route (another of its connections
/// failed there, the fleet re-pinned it, it failed back, its entry went elsewhere): if so,
/// `node` joins `failed`, so that it routes again, to where the session is now, before any
/// byte of the client's went out. Left out as for a node gone DOWN, whatever moved it: this
/// session sent nothing (the reason another connection's failure carries, an answer timeout,
/// would make the route take it for one that went out, and refuse it a DOWN node's trial).
fn moved_off(
    moves: Option<&crate::nodes::MoveWatch>,
    node: NodeId,
    failed: &mut Vec<Excluded>,
) -> bool {
    if moves.and_then(crate::nodes::MoveWatch::moved).is_none() {
        return false;
    }
    failed.push(Excluded {
        node,
        why: limpet_core::RepinReason::NodeDown,
    });
    true
}

/// `wait`'s result, or [`NoSession::cut_at_shutdown`] if a shutdown's drain ends first. The
/// wait is polled first (a slot given at once costs no watch of the drain), and a slot it
/// gives once the drain has ended is let go at once: a session cut at the drain's end frees
/// its slot for the next one in the queue, which must not open a node connection then.
async fn until_cut<T>(
    cut: &mut watch::Receiver<bool>,
    node: NodeId,
    wait: impl std::future::Future<Output = T>,
) -> Result<T, NoSession> {
    tokio::select! {
        biased;
        r = wait => {
            if *cut.borrow() {
                Err(NoSession::cut_at_shutdown(node))
            } else {
                Ok(r)
            }
        }
        () = stopped(cut) => Err(NoSession::cut_at_shutdown(node)),
    }
}

/// limpet's own trial, as an HTTP listener of the config reaches it, of a DOWN node that left
/// HTTP requests unanswered, which a TCP listener's connect may not try
/// ([`crate::nodes::NodeRuntime::claim_trial`]): only an answer brings it back. Without it,
/// once HTTP requests stopped coming (a print server's raw port used all day, its web page
/// now and then), such a node stayed DOWN for good, its sessions on the others, every TCP
/// session refused when all the nodes were. Asked the way an HTTP listener's own trial asks
/// (`OPTIONS *`, [`crate::proxy::upstream::answers_at`], its answer counted as the node's),
/// at the address the first HTTP listener that has one reaches the node at (a `node_port =
/// "same"` listener needs a bind with a port). With no HTTP listener in the config (the
/// node's health carried over by an upgrade from a config that had one), nothing of it can
/// ask the node: the listener's own attempt (`def`, `local_port`) decides the trial, as the
/// only one there is. Nothing is looked up before a trial is due.
fn try_due_answer_trial(state: &Arc<State>, now: u64, def: &Arc<ListenerDef>, local_port: u16) {
    use crate::nodes::TrialBy;
    if !state.answer_trial_due(now) {
        return;
    }
    let http = state.listeners.iter().find_map(|l| {
        let d = l.def.load_full();
        let port = if d.upstreams.is_same_port() {
            d.bind.iter().map(SocketAddr::port).find(|p| *p != 0)?
        } else {
            0
        };
        (d.mode == crate::config::Mode::Http).then_some((d, port))
    });
    let Some((http, port)) = http else {
        own_connect_trial(state, now, (def, local_port), TrialBy::Answer);
        return;
    };
    let (connect, answer) = (http.timeouts.connect, http.timeouts.upstream_answer);
    state.try_due_trial(
        now,
        |n| http.upstreams.get(n.index(), port),
        (
            crate::proxy::upstream::answer_trial_hold(connect, answer),
            TrialBy::Answer,
        ),
        |n, addr| {
            let tls = http.upstream_tls.as_ref().map(|u| {
                (
                    Arc::clone(&u.config),
                    crate::tls::upstream_name(u.server_name.as_deref(), addr.ip()),
                )
            });
            let rt = state.node_rt(n).cloned().map(|rt| (rt, addr.port()));
            crate::proxy::upstream::counted_as_answer(rt, async move {
                let tls = tls.as_ref().map(|(c, name)| (c, name.clone()));
                crate::proxy::upstream::answers_at(addr, tls, connect, answer).await
            })
        },
    );
}

/// limpet's own trial of a DOWN node due one through the listener `def` (as its socket on
/// `local_port` reaches the nodes), decided `by` the attempt's completion: as a session would
/// try the node, the connect, a PROXY header, the TLS handshake. Whether one was started.
fn own_connect_trial(
    state: &Arc<State>,
    now: u64,
    (def, local_port): (&Arc<ListenerDef>, u16),
    by: crate::nodes::TrialBy,
) -> bool {
    state.try_due_trial(
        now,
        |n| state.upstream(def, n, local_port),
        // Up to three steps of `connect` each (the connect, a PROXY header, a TLS handshake),
        // and a margin.
        (def.timeouts.connect * 4, by),
        |_, addr| own_trial(Arc::clone(def), addr),
    )
}

/// limpet's own trial of a DOWN node ([`crate::runtime::State::try_due_trial`]): a
/// session's attempt, with a PROXY header that names no client (limpet's own connection:
/// v1 `UNKNOWN`, v2 `LOCAL`, as HAProxy's `check-send-proxy` sends).
async fn own_trial(def: Arc<ListenerDef>, addr: SocketAddr) -> Result<(), UpstreamError> {
    let header = def.proxy_protocol.send.map(|v| {
        let mut h = Vec::with_capacity(16);
        proxy_protocol::write_local(v, &mut h);
        h
    });
    attempt_with(&def, header, addr).await.map(drop)
}

/// One attempt at a node for the client `who`.
async fn attempt(
    def: &ListenerDef,
    who: &Peer,
    addr: SocketAddr,
) -> Result<Box<dyn Io>, UpstreamError> {
    attempt_with(def, proxy_header_for(&def.proxy_protocol, who), addr).await
}

/// One attempt at a node through the network seam every listener shares
/// ([`crate::net::connect_node`], [`crate::net::node_tls`]): connect, send the PROXY header
/// (`header`), then TLS to the node when the listener asks for it. Each step is bounded by
/// the connect timeout.
async fn attempt_with(
    def: &ListenerDef,
    header: Option<Vec<u8>>,
    addr: SocketAddr,
) -> Result<Box<dyn Io>, UpstreamError> {
    let limit = def.timeouts.connect;
    let mut stream = crate::net::connect_node(addr, limit).await?;
    if let Some(h) = header {
        match tokio::time::timeout(limit, stream.write_all(&h)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(UpstreamError::io(Stage::Connect, &e)),
            Err(_) => return Err(UpstreamError::timeout(Stage::Connect, false)),
        }
    }
    let tls = def.upstream_tls.as_ref().map(|u| {
        (
            &u.config,
            crate::tls::upstream_name(u.server_name.as_deref(), addr.ip()),
        )
    });
    crate::net::node_tls(addr, stream, tls, limit).await
}

/// Serves one client connection of TCP listener `li`. `cut` turns true when a shutdown's
/// drain is over: the session, if still open, is cut then (reset on both sides).
async fn session(
    runtime: Arc<Runtime>,
    mut state: Arc<State>,
    mut li: usize,
    (stream, peer, bound): (crate::socket::ClientSocket, SocketAddr, SocketAddr),
    mut cut: watch::Receiver<bool>,
) {
    let Some(slot) = state.listeners.get(li) else {
        return;
    };
    let mut def = slot.def.load_full();
    // The session's access log line counts from here, as HAProxy's `tcplog` counts from the
    // accept (the PROXY header and TLS handshake included).
    let started = crate::logging::access::on().then(tokio::time::Instant::now);
    let mut stream = stream;
    if let Err(e) = stream.join_reactor() {
        tracing::debug!(listener = %def.name, %peer, error = %e, "client connection refused");
        return;
    }
    let accepted = match crate::net::accept_client(stream, peer, bound, &def).await {
        Ok(c) => c,
        Err(why) => {
            tracing::debug!(listener = %def.name, %peer, why, "client connection refused");
            return;
        }
    };
    let (who, local, mut client, client_tls) =
        (accepted.who, accepted.local, accepted.io, accepted.tls);
    let mut failed: Vec<Excluded> = Vec::new();
    let mut gone = Vec::new();
    // A reload while its PROXY header or TLS handshake came: the session routes in the
    // running generation.
    follow_reload(
        &runtime,
        (&mut state, &mut li, &mut def),
        &mut failed,
        &mut gone,
    );
    // The node's runtime outlives reloads: a session opened before one still ends on every
    // later MAINT, DOWN (`close_on_node_down` as the running config has it) and drain
    // deadline, whichever node it ends up on.
    let close_on_down = crate::runtime::CloseOnDown::new(
        Arc::clone(&runtime),
        &def.name,
        def.tcp.close_on_node_down,
    );
    // Each turn ends the session, excludes one more node (one that dropped it unused), or
    // follows a reload that keeps the failed nodes by name, so this ends within the node
    // names the session meets.
    let (outcome, node_name, (end, up, down), _held) = loop {
        // `node_port = "same"` follows the port of limpet's own socket, not a PROXY header's.
        let conn = match connect(
            &runtime,
            &state,
            li,
            &def,
            (&who, local.port()),
            &mut cut,
            &mut failed,
        )
        .await
        {
            Ok(conn) => conn,
            Err(NotConnected::Reloaded)
                if follow_reload(
                    &runtime,
                    (&mut state, &mut li, &mut def),
                    &mut failed,
                    &mut gone,
                ) =>
            {
                continue
            }
            Err(e) => {
                let no = match e {
                    NotConnected::No(no) => no,
                    NotConnected::Reloaded => NoSession::refused("no-node", None),
                };
                // Refusals and running out of descriptors are logged where they happen.
                tracing::debug!(listener = %def.name, client = %who.client, end = no.end, "no TCP session opened");
                if let Some(started) = started {
                    let node = no.node.map(|n| (state.node_name(n), PinText(None, false)));
                    session_line(&def.name, who.client, node, started, (0, 0), no.end, no.cut);
                }
                return;
            }
        };
        let Connected {
            node,
            outcome,
            stream,
            moves,
            def: conn_def,
            hold,
            _admitted: admitted,
            on_open,
            seen_in,
        } = conn;
        let (Some(rt), Some(moves)) = (state.node_rt(node).cloned(), moves) else {
            return;
        };
        let open = rt.open();
        let node_name = rt.name().to_owned();
        // Node lifecycle: counted as a tunnel, ended by the node's state.
        let tunnel = rt.tunnel();
        let key = moves.key();
        // What the session learns of the node from here is left unsaid once the node has
        // gone DOWN meanwhile: late, a success would land on another session's trial of it
        // (bringing it UP, or ending that trial unlearnt), and a failure would end that
        // trial's claim.
        let since = rt.watch_down();
        // What ended the session's time on the node, but for a shutdown: logged once the
        // relay says whether the session was cut or, nothing moved yet, moves on.
        let ended_by = std::sync::OnceLock::new();
        let stop = async {
            let r = tokio::select! {
                r = rt.session_end(moves, || close_on_down.now(), close_on_down.reloads()) => r,
                () = stopped(&mut cut) => return SHUTDOWN,
                // The session's table entry kept while it is open; ends the session when its
                // requests were pinned elsewhere meanwhile.
                r = crate::runtime::keep_pin(hold, || close_on_down.now()) => r,
            };
            let _ = ended_by.set(r);
            r.as_str()
        };
        let fin_on_close = FinOnClose {
            client: !client_tls,
            node: conn_def.upstream_tls.is_none(),
        };
        // The session is the node's once its opening ends (or the relay does, for one that
        // never moved): its route's pin outcome is counted and the node has seen it, once,
        // so that a session a node dropped unused counts once, where it went. `observe`:
        // the connect's success (a trial's was observed at its connect).
        let taken = std::sync::atomic::AtomicBool::new(false);
        let take = |observe: bool| {
            if taken.swap(true, std::sync::atomic::Ordering::Relaxed) {
                return;
            }
            if let (true, Some(obs), false) = (observe, on_open, since.went_down()) {
                SeenIn::observe(seen_in.as_ref(), &state, node, obs);
            }
            if let Some(o) = crate::metrics::PinOutcome::of_route(outcome) {
                state.lifecycle.metrics.pin(&def.name, o);
            }
            rt.seen(key);
        };
        let opened = || take(true);
        let relayed = relay_counted(
            &mut client,
            stream,
            def.tcp.idle,
            Framing::Bytes,
            fin_on_close,
            stop,
            // Every session watches its opening, a trial's too: its connect was observed,
            // but a drop still fails it. A drop comes at once or not at all (a listen queue
            // reset, accept and close): within the connect timeout, the connect's own bound.
            Some(Opening {
                window: conn_def.timeouts.connect,
                on_open: &opened,
            }),
        )
        .await;
        match (&relayed.0, ended_by.get().copied()) {
            (RelayEnd::Unused(Unused::Dropped(e)), _) => {
                // The node took the connection and dropped it before any byte moved either
                // way: nothing of the client's was sent, nothing answered, so the session
                // routes again without the node, as when its connect is refused, and the
                // node is charged as for one.
                tracing::debug!(listener = %def.name, node = %node_name, client = %who.client, error = %e, "node dropped the session unused: routing it again");
                if !since.went_down() {
                    SeenIn::observe(seen_in.as_ref(), &state, node, Observation::TrafficFailed);
                }
                failed.push(Excluded {
                    node,
                    why: limpet_core::RepinReason::ConnectFailed,
                });
                continue;
            }
            (RelayEnd::Unused(Unused::Stopped(_)), Some(r)) => {
                // The node's state (DOWN, MAINT, a drain's end) or the session's table entry
                // moved it off the node before anything moved: it routes again, nothing
                // charged, as from the node's queue. (Moved by the table, a fleet or a
                // failback, the table pins another node now: the route follows it, and the
                // reason given for leaving this one goes unused.)
                tracing::info!(listener = %def.name, node = %node_name, client = %who.client, reason = r.as_str(), "session moved off its node before any byte moved: routing it again");
                let why = match r {
                    crate::nodes::EndReason::Repin(why) => why,
                    _ => limpet_core::RepinReason::NodeDown,
                };
                failed.push(Excluded { node, why });
                continue;
            }
            (RelayEnd::Stopped(_), Some(r)) => {
                tracing::info!(listener = %def.name, node = %node_name, client = %who.client, reason = r.as_str(), "session closed by its node's state or its table entry");
            }
            _ => {}
        }
        take(false);
        // The session's hold on the node (its slot, its count) ends with its log line.
        break (outcome, node_name, relayed, (open, tunnel, admitted));
    };
    // A shutdown's end cuts a session that never moved as it cuts the others.
    if let RelayEnd::Unused(Unused::Stopped(_)) = end {
        client.abort_on_close();
    }
    // The relay's end closes the client's connection.
    drop(client);
    // Counted when the session ends, however it ends: the stats page's bytes of a node
    // include its TCP sessions once they close.
    let traffic = state.lifecycle.metrics.node_traffic(&node_name);
    traffic.add_in(up);
    traffic.add_out(down);
    let (how, cut) = match &end {
        RelayEnd::Done(up, down) => {
            tracing::debug!(listener = %def.name, node = %node_name, up, down, "session ended");
            ("done", None)
        }
        // (A node's drop routed the session again above.)
        RelayEnd::Error(e) | RelayEnd::Unused(Unused::Dropped(e)) => {
            tracing::debug!(listener = %def.name, node = %node_name, error = %e, "session ended with an error");
            ("error", None)
        }
        RelayEnd::Idle => {
            tracing::debug!(listener = %def.name, node = %node_name, "session idle: closed");
            ("idle", None)
        }
        RelayEnd::Stalled(dir) => {
            tracing::debug!(listener = %def.name, node = %node_name, ?dir, "session stalled (a side stopped reading): closed");
            match dir {
                Direction::Down => ("client-stalled", None),
                Direction::Up => ("node-stalled", None),
            }
        }
        RelayEnd::Stopped(why) | RelayEnd::Unused(Unused::Stopped(why)) => ("cut", Some(*why)),
    };
    if let Some(started) = started {
        let pinned = state.listeners.get(li).is_some_and(|l| l.table.is_some());
        let pin = PinText(Some(outcome), pinned);
        session_line(
            &def.name,
            who.client,
            Some((&node_name, pin)),
            started,
            (up, down),
            how,
            cut,
        );
    }
}

/// A TCP session's access log line, written when it ends (HAProxy's `option tcplog`):
/// the client, the node and how the route chose it, the session's length, the bytes each
/// way (`bytes_in` from the client, `bytes_out` to it), and how it ended: `done` (both
/// sides closed), `error`, `idle` (nothing moved for `idle`), `client-stalled` or
/// `node-stalled` (that side stopped reading for `idle`), `cut` (limpet ended it: `cut=`
/// says why, see docs/proxy.md), or no session at all ([`NoSession`]). A connection that
/// never became a session (a PROXY header or TLS handshake refused) has a `debug` line
/// only, as HAProxy's `dontlognull` leaves such connections out.
fn session_line(
    listener: &str,
    client: SocketAddr,
    node: Option<(&str, PinText)>,
    started: tokio::time::Instant,
    (bytes_in, bytes_out): (u64, u64),
    end: &str,
    cut: Option<&str>,
) {
    tracing::info!(
        target: "limpet::access",
        listener = %listener,
        client = %client,
        node = %node.map_or("-", |(n, _)| n),
        pin = %node.map_or(PinText(None, false), |(_, p)| p),
        total_ms = %Ms(started.elapsed()),
        bytes_in,
        bytes_out,
        end = %end,
        cut = %Or(cut),
    );
}

/// Serves TCP listener `name` on an already-bound socket until `shutdown` turns true, then
/// stops accepting, gives open sessions `timeouts.drain` to end by themselves (as HAProxy's
/// soft stop and nginx's graceful shutdown let established streams finish), and cuts the
/// rest: a transfer in progress is not cut short at the signal.
pub async fn serve(
    runtime: Arc<Runtime>,
    name: String,
    listener: TcpListener,
    shutdown: watch::Receiver<bool>,
) {
    let permits = crate::runtime::listener_permits(&runtime, &name);
    serve_on(runtime, name, listener, shutdown, permits, None).await;
}

/// [`serve`] with the listener's connection permits given: several sockets of one listener
/// (one per worker thread, `crate::runtime::workers`) share its `max_connections`.
/// `accepting`, if any, is dropped once the accept loop has returned.
pub async fn serve_on(
    runtime: Arc<Runtime>,
    name: String,
    listener: TcpListener,
    shutdown: watch::Receiver<bool>,
    permits: Arc<crate::net::ConnLimit>,
    accepting: Option<crate::net::Accepting>,
) {
    let mut sessions = JoinSet::new();
    let mut stop = shutdown.clone();
    // Turned true once the drain is over: the sessions still open are cut.
    let (cut_tx, cut) = watch::channel(false);
    // The listening address, for [`crate::net::accept_client`].
    let bound = listener
        .local_addr()
        .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
    crate::net::accept_loop(
        listener,
        &name,
        permits,
        async move { stopped(&mut stop).await },
        |stream, peer, slot| {
            // Reap finished sessions so the set does not grow with every connection ever made.
            while sessions.try_join_next().is_some() {}
            let state = runtime.state();
            let Some(li) = state
                .listeners
                .iter()
                .position(|l| l.def.load().name == name)
            else {
                return;
            };
            let cut = cut.clone();
            let runtime = Arc::clone(&runtime);
            // Boxed before it is spawned, as HTTP connections are (`proxy::server`).
            sessions.spawn(Box::pin(async move {
                // One handed over by the stop waits through the drain, which bounds it.
                let Some(_permit) = slot.taken().await else {
                    return;
                };
                session(runtime, state, li, (stream, peer, bound), cut).await;
            }));
        },
    )
    .await;
    // Counted as accepting until here (`crate::net::AcceptLoops`).
    drop(accepting);
    // Not while an upgrade's handover is pending: it may fail, and this limpet serve again.
    runtime.drain_allowed().await;
    let drain = {
        let state = runtime.state();
        state
            .listeners
            .iter()
            .find(|l| l.def.load().name == name)
            .map_or(Duration::from_secs(10), |l| l.def.load().timeouts.drain)
    };
    // The drain, unless a second signal ends it sooner.
    let all_ended = tokio::select! {
        r = tokio::time::timeout(drain, async {
            while sessions.join_next().await.is_some() {}
        }) => r.is_ok(),
        () = runtime.cut_requested() => sessions.is_empty(),
    };
    if !all_ended {
        tracing::info!(listener = %name, open = sessions.len(), "drain over: cutting the sessions still open");
        let _ = cut_tx.send(true);
        // A cut session resets its sockets and returns at once; this bounds a stuck one.
        let _ = tokio::time::timeout(CUT_GRACE, async {
            while sessions.join_next().await.is_some() {}
        })
        .await;
    }
    sessions.abort_all();
}

/// How long sessions cut at the end of a drain get to close before their tasks are dropped.
const CUT_GRACE: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;

    /// A connected pair on loopback: (ours, the peer's).
    async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr");
        let (ours, theirs) = tokio::join!(TcpStream::connect(addr), l.accept());
        (ours.expect("connect"), theirs.expect("accept").0)
    }

    async fn write_last(s: &mut TcpStream, buf: &[u8]) -> usize {
        std::future::poll_fn(|cx| Pin::new(&mut *s).poll_write_last(cx, buf))
            .await
            .expect("written")
    }

    /// What reached a stream: plain writes and vectored writes, with their bytes.
    #[derive(Debug, PartialEq)]
    enum Call {
        Write(Vec<u8>),
        Writev(Vec<Vec<u8>>),
    }

    /// A stream that notes each write and takes at most `take` bytes of each.
    struct Calls {
        calls: Vec<Call>,
        take: usize,
    }

    impl AsyncWrite for Calls {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.calls.push(Call::Write(buf.to_vec()));
            Poll::Ready(Ok(buf.len().min(self.take)))
        }
        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            bufs: &[io::IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            self.calls
                .push(Call::Writev(bufs.iter().map(|b| b.to_vec()).collect()));
            let n: usize = bufs.iter().map(|b| b.len()).sum();
            Poll::Ready(Ok(n.min(self.take)))
        }
        fn is_write_vectored(&self) -> bool {
            true
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// A layer that writes what it is given as two slices, vectored, to the stream under it:
    /// a TLS stream writing its records under a coalesced answer.
    struct Halves<S>(S);

    impl<S: AsyncWrite + Unpin> AsyncWrite for Halves<S> {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            let (a, b) = buf.split_at(buf.len() / 2);
            Pin::new(&mut self.0)
                .poll_write_vectored(cx, &[io::IoSlice::new(a), io::IoSlice::new(b)])
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    fn calls(take: usize) -> Prefixed<Calls> {
        Prefixed::new(
            Vec::new(),
            Calls {
                calls: Vec::new(),
                take,
            },
        )
    }

    async fn writev<S: AsyncWrite + Unpin>(s: &mut S, bufs: &[&[u8]]) -> usize {
        let slices: Vec<io::IoSlice<'_>> = bufs.iter().map(|b| io::IoSlice::new(b)).collect();
        std::future::poll_fn(|cx| Pin::new(&mut *s).poll_write_vectored(cx, &slices))
            .await
            .expect("written")
    }

    /// An answer's head and small body, written vectored, reach the socket as one plain
    /// write; so does a single slice. A vectored write above `COALESCE_MAX` stays vectored.
    #[tokio::test]
    async fn small_vectored_writes_go_out_as_one_plain_write_and_large_ones_stay_vectored() {
        let mut s = calls(usize::MAX);
        assert_eq!(
            writev(&mut s, &[b"HTTP/1.1 200 OK\r\n\r\n", b"a\n"]).await,
            21
        );
        assert_eq!(writev(&mut s, &[b"only"]).await, 4);
        let big = vec![7u8; COALESCE_MAX];
        assert_eq!(writev(&mut s, &[b"head", &big]).await, 4 + COALESCE_MAX);
        assert_eq!(
            s.get_ref().calls,
            [
                Call::Write(b"HTTP/1.1 200 OK\r\n\r\na\n".to_vec()),
                Call::Write(b"only".to_vec()),
                Call::Writev(vec![b"head".to_vec(), big]),
            ]
        );
    }

    /// A coalesced write that the stream takes in part says so: the caller writes the rest
    /// from its slices.
    #[tokio::test]
    async fn a_coalesced_write_taken_in_part_says_how_much() {
        let mut s = calls(5);
        assert_eq!(writev(&mut s, &[b"abc", b"defg"]).await, 5);
        assert_eq!(s.get_ref().calls, [Call::Write(b"abcdefg".to_vec())]);
    }

    /// A coalescing stream under a coalesced write (TLS records under a coalesced answer)
    /// uses a buffer of its own: the bytes arrive whole and in order.
    #[tokio::test]
    async fn a_coalesced_write_under_a_coalesced_write_keeps_its_bytes() {
        let mut s = Prefixed::new(Vec::new(), Halves(calls(usize::MAX)));
        assert_eq!(writev(&mut s, &[b"one ", b"two ", b"three"]).await, 13);
        assert_eq!(writev(&mut s, &[b"four ", b"five"]).await, 9);
        assert_eq!(
            s.get_ref().0.get_ref().calls,
            [
                Call::Write(b"one two three".to_vec()),
                Call::Write(b"four five".to_vec()),
            ]
        );
    }

    /// Through a real socket: the peer reads the slices' bytes in order.
    #[tokio::test]
    async fn coalesced_bytes_reach_the_peer_in_order() {
        let (ours, mut theirs) = pair().await;
        let mut ours = Prefixed::new(Vec::new(), ours);
        assert_eq!(writev(&mut ours, &[b"head\r\n\r\n", b"body"]).await, 12);
        drop(ours);
        let mut got = Vec::new();
        theirs.read_to_end(&mut got).await.expect("read");
        assert_eq!(got, b"head\r\n\r\nbody");
    }

    /// The last bytes of a plain TCP stream wait in the kernel for its end, then leave with
    /// it: the peer has nothing to read after the write, and the bytes then the end of the
    /// stream after the shutdown, or after the close alone. (On loopback a segment sent is
    /// in the peer's queue when `send` returns, so "nothing yet" is the bytes held back.)
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn last_bytes_are_held_for_the_fin_and_leave_with_the_shutdown_or_the_close() {
        for close_only in [false, true] {
            let (mut ours, mut theirs) = pair().await;
            ours.set_nodelay(true).expect("nodelay");
            assert_eq!(write_last(&mut ours, b"last words").await, 10);
            let mut buf = [0u8; 16];
            assert_eq!(
                theirs.try_read(&mut buf).map_err(|e| e.kind()),
                Err(io::ErrorKind::WouldBlock),
                "held back until the end (close_only: {close_only})"
            );
            if close_only {
                drop(ours);
            } else {
                ours.shutdown().await.expect("shutdown");
            }
            let mut got = Vec::new();
            theirs.read_to_end(&mut got).await.expect("read");
            assert_eq!(got, b"last words", "close_only: {close_only}");
        }
    }
}
