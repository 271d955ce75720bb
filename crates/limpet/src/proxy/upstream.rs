//! Connections to nodes: one small keep-alive pool per node.
//!
//! Why not hyper-util's pooled `Client`: failover needs to know, for every failed attempt,
//! whether any byte of the request left, and needs the request back when none did, so the same
//! streamed body can go to another node. hyper's low-level `SendRequest::try_send_request`
//! gives exactly that, and connecting *before* handing over the request keeps the body in hand
//! when a node refuses the connection.
//!
//! ```text
//!  checkout ─► idle stack (LIFO, newest first; closed/expired handles dropped)
//!      └─ empty ─► connect(addr of the node, connect timeout) ─► TLS (if the listener says)
//!                   ─► http1 handshake ─► spawn conn
//!  answer received ─► spawn "wait until ready" ─► back on the idle stack
//!  idle stacks not empty ─► a sweep every min(upstream_idle, 5 s): expired ones and ones
//!                           the node closed are dropped (their sockets closed)
//! ```
//!
//! Bodiless replayable requests to plaintext nodes take the request-driven path instead
//! ([`super::node_h1`]): its connections have their own idle stack here
//! ([`NodeConns::checkout_h1`], [`NodeConns::recycle_h1`]), each up to `max_idle`.
//!
//! The address connected to is always the node's configured one: nothing in a request can
//! name where limpet connects.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use tokio::time::Instant;

use super::body::UpBody;
use super::node_h1::H1Conn;
use crate::error::{Cause, Stage, UpstreamError};

/// A connection to a node on hyper's client ([`NodeConns::connect`]): hyper's handle, and
/// the count of the bytes read from the node on it, which tells a request that failed on a
/// kept-alive connection before any answer byte (the keep-alive race: the node closed it as
/// the request went out) from one whose answer began and broke (the node's failure), which
/// hyper reports alike.
pub(crate) struct Sender {
    send: http1::SendRequest<UpBody>,
    read: Arc<AtomicU64>,
}

impl Sender {
    /// The bytes read from the node on this connection so far.
    pub(crate) fn read(&self) -> u64 {
        self.read.load(Ordering::Relaxed)
    }
}

impl std::ops::Deref for Sender {
    type Target = http1::SendRequest<UpBody>;

    fn deref(&self) -> &Self::Target {
        &self.send
    }
}

impl std::ops::DerefMut for Sender {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.send
    }
}

/// A node stream that counts what is read from it into its [`Sender`]'s count. Boxed as the
/// stream it wraps is, so that the node stream's type stays one (an upgrade's, which is not
/// counted, is found by it: `proxy::upgrade`).
struct CountReads {
    io: Box<dyn crate::tcp::Io>,
    read: Arc<AtomicU64>,
}

impl tokio::io::AsyncRead for CountReads {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = std::pin::Pin::new(&mut self.io).poll_read(cx, buf);
        let n = buf.filled().len().saturating_sub(before);
        if n > 0 {
            self.read.fetch_add(n as u64, Ordering::Relaxed);
        }
        r
    }
}

impl tokio::io::AsyncWrite for CountReads {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl crate::tcp::Io for CountReads {
    fn poll_write_last(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write_last(cx, buf)
    }

    fn abort_on_close(&self) {
        self.io.abort_on_close();
    }
}

struct Idle {
    sender: Sender,
    since: Instant,
}

/// Out of file descriptors, an idle connection unused for this long is dropped at once
/// ([`crate::net::OutOfFds::pressure`]), not at its expiry.
const PRESSED_IDLE: Duration = Duration::from_secs(1);

/// The keep-alive connections of one node.
pub(crate) struct NodeConns {
    addr: SocketAddr,
    /// TLS to the node: the client config and the name to send and verify.
    tls: Option<(Arc<rustls::ClientConfig>, ServerName<'static>)>,
    idle: Mutex<Vec<Idle>>,
    /// Idle connections of the request-driven path ([`super::node_h1`]), newest last.
    idle_h1: Mutex<std::collections::VecDeque<(H1Conn, Instant)>>,
    max_idle: usize,
    idle_timeout: Duration,
    connect_timeout: Duration,
    /// A sweep task runs ([`NodeConns::sweep_soon`]).
    sweeping: AtomicBool,
}

/// The longest between two sweeps of a node's idle connections: what a connection the node
/// closed may stay half-closed here (CLOSE-WAIT) without traffic, as HAProxy purges its idle
/// connections every `pool-purge-delay` (5 s).
const SWEEP_EVERY_MAX: Duration = Duration::from_secs(5);

impl std::fmt::Debug for NodeConns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeConns")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

/// The HTTP/1.1 handshake on a connected stream; the connection task runs on its own.
async fn handshake<I: crate::tcp::Io + 'static>(
    io: I,
) -> Result<http1::SendRequest<UpBody>, UpstreamError> {
    let (sender, conn) = http1::Builder::new()
        .handshake(TokioIo::new(io))
        .await
        .map_err(|e| UpstreamError::new(Stage::Connect, Cause::Protocol, false, e))?;
    tokio::spawn(async move {
        // Errors here surface on the request that used the connection.
        let _ = conn.with_upgrades().await;
    });
    Ok(sender)
}

impl NodeConns {
    pub(crate) fn new(
        addr: SocketAddr,
        max_idle: usize,
        idle_timeout: Duration,
        connect_timeout: Duration,
        tls: Option<(Arc<rustls::ClientConfig>, ServerName<'static>)>,
    ) -> Self {
        NodeConns {
            addr,
            tls,
            idle: Mutex::new(Vec::new()),
            idle_h1: Mutex::new(std::collections::VecDeque::new()),
            max_idle,
            idle_timeout,
            connect_timeout,
            sweeping: AtomicBool::new(false),
        }
    }

    /// Starts the sweep of the idle connections unless one runs. Checkouts and recycles
    /// prune too, but without traffic to the node nothing else would: a connection past
    /// `upstream_idle` would stay open, and one the node closed would stay half-open, each
    /// holding a descriptor, until the next request to that node. The task holds the pool
    /// weakly (a reload's dropped listener generation ends it) and ends once nothing is idle.
    fn sweep_soon(self: &Arc<Self>) {
        if self.sweeping.swap(true, Ordering::AcqRel) {
            return;
        }
        let pool = Arc::downgrade(self);
        let every = self
            .idle_timeout
            .min(SWEEP_EVERY_MAX)
            .max(Duration::from_millis(10));
        tokio::spawn(async move {
            loop {
                // Out of file descriptors: everything idle goes now (see `OutOfFds::pressure`).
                let pressed = tokio::select! {
                    () = tokio::time::sleep(every) => false,
                    () = crate::net::LOCAL_FDS.pressure() => true,
                };
                let Some(me) = pool.upgrade() else {
                    return;
                };
                if pressed {
                    me.drop_idle();
                } else if me.sweep() > 0 {
                    continue;
                }
                me.sweeping.store(false, Ordering::Release);
                // A recycle between the sweep and the store saw a sweep running and did not
                // start one: this one goes on if it finds anything now.
                if me.idle_count() == 0 || me.sweeping.swap(true, Ordering::AcqRel) {
                    return;
                }
            }
        });
    }

    /// Drops the idle connections that expired or that the node closed (or sent stray
    /// bytes on); how many are left.
    fn sweep(&self) -> usize {
        let now = Instant::now();
        let h1 = {
            let mut idle = self.idle_h1.lock().unwrap_or_else(|e| e.into_inner());
            self.prune_h1(&mut idle, now);
            idle.retain(|(conn, _)| conn.idle_ok());
            idle.len()
        };
        let mut idle = self.lock();
        self.prune(&mut idle);
        idle.retain(|e| !e.sender.is_closed());
        h1 + idle.len()
    }

    /// Limpet is out of file descriptors: drops the idle connections unused for
    /// [`PRESSED_IDLE`] (what a burst left behind), which hold descriptors new clients need
    /// more than the connects they would save; a connection that steady traffic reuses stays.
    fn drop_idle(&self) {
        let now = Instant::now();
        let stale = |since: Instant| now.saturating_duration_since(since) >= PRESSED_IDLE;
        self.idle_h1
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(_, since)| !stale(*since));
        self.lock().retain(|e| !stale(e.since));
    }

    fn idle_count(&self) -> usize {
        let h1 = self.idle_h1.lock().unwrap_or_else(|e| e.into_inner()).len();
        h1 + self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Idle>> {
        // A panic elsewhere while holding this lock leaves a plain Vec: still usable.
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A ready idle connection, if one is left. Expired ones are pruned first (what is left
    /// is younger, the stack being oldest first); closed ones are dropped on the way.
    /// The node's address, as this listener socket reaches it.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub(crate) fn checkout(&self) -> Option<Sender> {
        let mut idle = self.lock();
        self.prune(&mut idle);
        while let Some(entry) = idle.pop() {
            if entry.sender.is_ready() && !entry.sender.is_closed() {
                return Some(entry.sender);
            }
        }
        None
    }

    /// Drops the idle connections past `upstream_idle`, oldest first (the stack's bottom).
    /// Taking the newest first keeps the stack's bottom idle under steady traffic, so expiry
    /// is not left to a checkout reaching it: each checkout and recycle prunes, as the
    /// request-driven path does ([`NodeConns::prune_h1`]). A dropped handle ends its
    /// connection's task, which closes the socket.
    fn prune(&self, idle: &mut Vec<Idle>) {
        let now = Instant::now();
        let expired = idle
            .iter()
            .take_while(|e| now.saturating_duration_since(e.since) >= self.idle_timeout)
            .count();
        idle.drain(..expired);
    }

    /// A new connection to the node, able to hand its socket over after a 101. Connect and
    /// TLS are the network seam's ([`crate::net`]), shared with TCP listeners.
    ///
    /// A write to the node blocked for `write_limit` fails the connection: a node that
    /// stopped reading (a frozen process whose socket buffers filled during an upload) must
    /// not hold the request, its client and its node slot for ever. The answer clock only
    /// starts once the body is sent, so without this nothing would bound that wait.
    ///
    /// `upgrade`: the connection is for an upgrade, whose stream becomes a tunnel: its reads
    /// are not counted (no keep-alive race to tell apart; a tunnel reads for its whole life).
    pub(crate) async fn connect(
        &self,
        write_limit: Duration,
        upgrade: bool,
    ) -> Result<Sender, UpstreamError> {
        let stream = crate::net::connect_node(self.addr, self.connect_timeout).await?;
        let tls = self.tls.as_ref().map(|(cfg, name)| (cfg, name.clone()));
        let io = crate::net::node_tls(self.addr, stream, tls, self.connect_timeout).await?;
        let read = Arc::new(AtomicU64::new(0));
        let io: Box<dyn crate::tcp::Io> = if upgrade {
            io
        } else {
            Box::new(CountReads {
                io,
                read: Arc::clone(&read),
            })
        };
        let send = handshake(crate::relay::WriteDeadline::new(
            io,
            crate::relay::WriteLimit::new(write_limit),
        ))
        .await?;
        Ok(Sender { send, read })
    }

    /// limpet's own trial of the node as an HTTP listener reaches it
    /// ([`crate::runtime::State::try_due_trial`]): `OPTIONS * HTTP/1.1` on a connection of its
    /// own (the server-wide `OPTIONS`, RFC 9110 9.3.7, which asks nothing of any resource;
    /// HAProxy's `httpchk` sends `OPTIONS /`), answered when a status line comes within
    /// `answer`, whatever the status: the node's process answers. A trial of a node that left
    /// requests unanswered must be an answer, which a completed connect is not.
    pub(crate) async fn answers(&self, answer: Duration) -> Result<(), UpstreamError> {
        let tls = self.tls.as_ref().map(|(cfg, name)| (cfg, name.clone()));
        answers_at(self.addr, tls, self.connect_timeout, answer).await
    }

    /// Whether the request-driven path ([`super::node_h1`]) can reach this node: plaintext
    /// only (TLS to nodes stays on hyper's client).
    pub(crate) fn plain(&self) -> bool {
        self.tls.is_none()
    }

    /// A kept-alive connection of the request-driven path, if one is left and still good
    /// (closed, expired or unexpectedly readable ones are dropped on the way). `now`: the
    /// caller's reading.
    pub(crate) fn checkout_h1(&self, now: Instant) -> Option<H1Conn> {
        let mut idle = self.idle_h1.lock().unwrap_or_else(|e| e.into_inner());
        self.prune_h1(&mut idle, now);
        while let Some((conn, _)) = idle.pop_back() {
            if conn.idle_ok() {
                return Some(conn);
            }
        }
        None
    }

    /// Drops the idle connections past `upstream_idle`, oldest first. Nothing watches an idle
    /// connection of this path (no task per connection), so one the node closed is only
    /// found when taken, or dropped here once expired: each checkout and recycle prunes.
    /// `now` is the caller's: a recycle stamps the connection with the same reading.
    fn prune_h1(&self, idle: &mut std::collections::VecDeque<(H1Conn, Instant)>, now: Instant) {
        while idle
            .front()
            .is_some_and(|(_, since)| now.saturating_duration_since(*since) >= self.idle_timeout)
        {
            idle.pop_front();
        }
    }

    /// A new plaintext connection for the request-driven path, its writes bounded like
    /// [`NodeConns::connect`]'s.
    pub(crate) async fn connect_h1(&self, write_limit: Duration) -> Result<H1Conn, UpstreamError> {
        let stream = crate::net::connect_node(self.addr, self.connect_timeout).await?;
        Ok(H1Conn::new(crate::relay::WriteDeadline::new(
            stream,
            crate::relay::WriteLimit::new(write_limit),
        )))
    }

    /// Puts a connection of the request-driven path back, its answer fully read: at once,
    /// no task (up to `max_idle`, the oldest dropped first).
    pub(crate) fn recycle_h1(self: &Arc<Self>, mut conn: H1Conn) {
        if self.max_idle == 0 {
            return;
        }
        conn.shrink_for_idle();
        let now = Instant::now();
        let mut idle = self.idle_h1.lock().unwrap_or_else(|e| e.into_inner());
        self.prune_h1(&mut idle, now);
        if idle.len() >= self.max_idle {
            idle.pop_front();
        }
        idle.push_back((conn, now));
        drop(idle);
        // After the push: a sweep ending meanwhile counts it and goes on.
        self.sweep_soon();
    }

    /// Puts a connection back once its answer is fully read (hyper makes it ready again
    /// then). A connection that closes or is upgraded instead is simply dropped.
    pub(crate) fn recycle(self: &Arc<Self>, mut sender: Sender) {
        if self.max_idle == 0 {
            return;
        }
        let me = Arc::clone(self);
        tokio::spawn(async move {
            if sender.ready().await.is_err() {
                return;
            }
            let mut idle = me.lock();
            me.prune(&mut idle);
            if idle.len() >= me.max_idle {
                // Drop the oldest: the newest are the most likely to still be open.
                idle.remove(0);
            }
            idle.push(Idle {
                sender,
                since: Instant::now(),
            });
            drop(idle);
            me.sweep_soon();
        });
    }
}

/// How long limpet's own `OPTIONS *` trial of a node may take, its claim's hold: the
/// connect and a TLS handshake, the answer, and a margin.
pub(crate) fn answer_trial_hold(connect: Duration, answer: Duration) -> Duration {
    connect * 3 + answer
}

/// `trial`, limpet's own `OPTIONS *` of a node at a port, its answer counted as any answer
/// of the node's there (`rt` and the port): a request sent there before it that times out
/// is slow by itself, not the node's silence.
pub(crate) async fn counted_as_answer(
    rt: Option<(Arc<crate::nodes::NodeRuntime>, u16)>,
    trial: impl std::future::Future<Output = Result<(), UpstreamError>>,
) -> Result<(), UpstreamError> {
    let sent = tokio::time::Instant::now();
    let r = trial.await;
    if let (Ok(()), Some((rt, port))) = (&r, rt) {
        rt.answered(port, crate::clock::us_at(sent));
    }
    r
}

/// limpet's own trial of a node at `addr` as an HTTP listener reaches it (TLS to it when
/// `tls` is set): see [`NodeConns::answers`]. Also how a TCP listener tries a node that left
/// HTTP requests unanswered (`crate::tcp`), which only an answer can bring back.
pub(crate) async fn answers_at(
    addr: SocketAddr,
    tls: Option<(&Arc<rustls::ClientConfig>, ServerName<'static>)>,
    connect_timeout: Duration,
    answer: Duration,
) -> Result<(), UpstreamError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let stream = crate::net::connect_node(addr, connect_timeout).await?;
    let mut io = crate::net::node_tls(addr, stream, tls, connect_timeout).await?;
    let ask = format!(
        "OPTIONS * HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nUser-Agent: limpet-trial\r\n\r\n"
    );
    let exchange = async {
        io.write_all(ask.as_bytes())
            .await
            .map_err(|e| UpstreamError::new(Stage::Send, Cause::Io(e.kind()), true, e))?;
        // The status line's first bytes are enough: `HTTP/1.` and a digit.
        let mut got = [0u8; 9];
        let mut n = 0;
        while n < got.len() {
            match io.read(&mut got[n..]).await {
                Ok(0) => {
                    return Err(UpstreamError::new(
                        Stage::AnswerHead,
                        Cause::Io(std::io::ErrorKind::UnexpectedEof),
                        true,
                        "the node closed the connection before answering",
                    ))
                }
                Ok(k) => n += k,
                Err(e) => {
                    return Err(UpstreamError::new(
                        Stage::AnswerHead,
                        Cause::Io(e.kind()),
                        true,
                        e,
                    ))
                }
            }
        }
        if got.starts_with(b"HTTP/1.") && got[8] == b' ' {
            Ok(())
        } else {
            Err(UpstreamError::new(
                Stage::AnswerHead,
                Cause::Protocol,
                true,
                "not an HTTP/1 answer",
            ))
        }
    };
    match tokio::time::timeout(answer, exchange).await {
        Ok(r) => r,
        Err(_) => Err(UpstreamError::timeout(Stage::AnswerHead, true)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plaintext pool to `addr` keeping up to 4 idle connections for `idle_timeout`.
    fn pool(addr: SocketAddr, idle_timeout: Duration) -> Arc<NodeConns> {
        Arc::new(NodeConns::new(
            addr,
            4,
            idle_timeout,
            Duration::from_secs(1),
            None,
        ))
    }

    /// Steady traffic takes the newest idle connection each time; an older one left at the
    /// stack's bottom is dropped once past `upstream_idle`, not kept until the node closes
    /// it. Real connections to a demo node on loopback, on paused time.
    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_steady_traffic_never_takes_expires() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let node = tokio::spawn(async move {
            crate::backend::serve("a", listener, async {
                let _ = stopped.await;
            })
            .await;
        });
        let idle_timeout = Duration::from_millis(300);
        let conns = pool(addr, idle_timeout);
        let limit = Duration::from_secs(1);
        let (older, newer) = (
            conns.connect(limit, false).await,
            conns.connect(limit, false).await,
        );
        conns.recycle(older.expect("connect"));
        conns.recycle(newer.expect("connect"));
        // The recycle tasks put them back once ready (a look every paused millisecond: the
        // count has nothing to await).
        tokio::time::timeout(limit, async {
            while conns.lock().len() != 2 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await
        .expect("both idle");
        // Every 100 ms the newest is taken and put back; the older one stays at the bottom.
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let sender = conns.checkout().expect("the newest");
            conns.recycle(sender);
        }
        // The last recycle has landed by then (it only waits for readiness).
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            conns.lock().len(),
            1,
            "the older connection dropped past upstream_idle"
        );
        let _ = stop.send(());
        let _ = node.await;
    }

    /// Without any traffic, an idle connection of the request-driven path is closed once
    /// past `upstream_idle`, and one the node closed is dropped at the next sweep, well
    /// before: neither waits for a request to that node. Real sockets, paused time.
    #[tokio::test(start_paused = true)]
    async fn idle_connections_are_swept_without_traffic() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let idle_timeout = Duration::from_secs(30);
        let conns = pool(addr, idle_timeout);
        let limit = Duration::from_secs(1);
        let (kept, closed) = (
            conns.connect_h1(limit).await.expect("connect"),
            conns.connect_h1(limit).await.expect("connect"),
        );
        let (mut kept_node, _) = listener.accept().await.expect("accept");
        let (closed_node, _) = listener.accept().await.expect("accept");
        conns.recycle_h1(kept);
        conns.recycle_h1(closed);
        assert_eq!(conns.idle_count(), 2);
        let t0 = Instant::now();
        // The node closes one of them; the next sweep (at most 5 s on) drops it.
        drop(closed_node);
        tokio::time::timeout(2 * SWEEP_EVERY_MAX, async {
            while conns.idle_count() != 1 {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await
        .expect("the connection the node closed is dropped without a request");
        assert!(
            t0.elapsed() <= SWEEP_EVERY_MAX + Duration::from_millis(100),
            "dropped {:?} after the node closed it",
            t0.elapsed()
        );
        // The other is closed by limpet once past upstream_idle (plus at most one sweep):
        // the node reads the end of the stream.
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(
            idle_timeout + 2 * SWEEP_EVERY_MAX,
            tokio::io::AsyncReadExt::read(&mut kept_node, &mut byte),
        )
        .await
        .expect("the expired connection is closed without a request")
        .expect("read");
        assert_eq!(read, 0, "limpet closed it");
        let waited = t0.elapsed();
        assert!(
            (idle_timeout..=idle_timeout + SWEEP_EVERY_MAX).contains(&waited),
            "closed {waited:?} after it went idle"
        );
        assert_eq!(conns.idle_count(), 0);
    }
}
