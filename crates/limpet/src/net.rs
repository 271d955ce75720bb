//! Shared pieces of the network seam: accepting a client, connecting to a node, and what
//! running out of file descriptors does. HTTP (`crate::proxy`) and TCP (`crate::tcp`)
//! listeners both take a client through [`accept_client`] (PROXY header from trusted peers,
//! then TLS) and reach a node through [`connect_node`] and [`node_tls`], so each of those
//! rules and timeouts is written once; the relay between them is [`crate::relay`].
//!
//! ```text
//!  accept_loop (permits, shutdown; one rule for errors) ─► accept_client: PROXY header? ─► TLS accept? (header_read)
//!  connect_node (connect timeout, no Nagle) ─► [PROXY header, TCP] ─► node_tls? (connect)
//! ```
//!
//! Every listener (HTTP, TCP, admin) accepts through [`accept_loop`], so an accept error has one
//! rule: back off briefly instead of spinning, and log it at most once per
//! [`LOG_EVERY`] with the count of the errors not logged. Out of file descriptors
//! (EMFILE/ENFILE) is the common one under a connection flood; it recovers by itself as
//! connections close, and it is never held against a node: connect and health-check failures
//! it causes carry no verdict on the node (`crate::error::Cause::Local`), so nodes do not
//! flap DOWN/UP because limpet ran out of sockets.
//!
//! [`ReadAhead`] takes an HTTP client's first bytes in one read, where the HTTP/2 preface
//! check would otherwise cost a read of its own; [`BatchedWrites`] sends an HTTP client's
//! answers at the end of the event-loop turn, so that one turn's answers wake the client once.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use crate::config::ListenerDef;
use crate::error::{Stage, UpstreamError};
use crate::tcp::{Io, Peer};

/// At most one log line per this interval for each kind of local resource error.
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// The pause after a failed accept: long enough not to spin on an error that persists,
/// short enough that a freed descriptor is used at once.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// A warning logged at most once per [`LOG_EVERY`], with the count of repeats it swallowed.
#[derive(Debug)]
pub struct RateLimitedLog {
    what: &'static str,
    /// When it last logged, and how many notes were not logged since.
    state: Mutex<(Option<Instant>, u64)>,
}

impl RateLimitedLog {
    pub const fn new(what: &'static str) -> Self {
        RateLimitedLog {
            what,
            state: Mutex::new((None, 0)),
        }
    }

    /// Notes one occurrence (`context`: where); returns whether it was logged.
    pub fn note(&self, context: &str) -> bool {
        let now = Instant::now();
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let due =
            st.0.is_none_or(|last| now.duration_since(last) >= LOG_EVERY);
        if !due {
            st.1 += 1;
            return false;
        }
        let swallowed = std::mem::take(&mut st.1);
        st.0 = Some(now);
        drop(st);
        tracing::warn!(context, repeats_not_logged = swallowed, "{}", self.what);
        true
    }
}

/// Out of file descriptors, wherever limpet noticed it (accept, connect, health check).
pub static LOCAL_FDS: RateLimitedLog = RateLimitedLog::new(
    "out of file descriptors: raise the limit (ulimit -n, LimitNOFILE) or lower max_connections",
);

/// Other accept errors.
static ACCEPT_ERRORS: RateLimitedLog = RateLimitedLog::new("accept failed");

/// The accept loop of every listener (HTTP, TCP, admin): until `shutdown` resolves, takes
/// the next client and then one permit of `permits` (a listener's `max_connections`), and
/// hands both to `serve`, which spawns what serves it. At the limit, the client just accepted
/// waits for a permit and further clients wait in the kernel backlog. Returns once `shutdown`
/// resolved; the caller drains.
///
/// Accepting before taking the permit matters with worker threads: the sockets of one
/// listener (one per worker) share its permits, and a worker waiting for a client must not
/// hold a permit that a client arriving on another worker's socket needs.
pub async fn accept_loop<F>(
    listener: &TcpListener,
    name: &str,
    permits: Option<Arc<tokio::sync::Semaphore>>,
    shutdown: impl std::future::Future<Output = ()>,
    mut serve: F,
) where
    F: FnMut(TcpStream, SocketAddr, Option<tokio::sync::OwnedSemaphorePermit>),
{
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => return,
            s = accept(listener, name) => s,
        };
        let permit = match &permits {
            Some(p) => tokio::select! {
                () = &mut shutdown => return,
                p = Arc::clone(p).acquire_owned() => match p {
                    Ok(p) => Some(p),
                    Err(_) => return,
                },
            },
            None => None,
        };
        serve(stream, peer, permit);
    }
}

/// The next client of `listener` (named `name` in logs). Errors are logged per the module
/// rule and retried after a short pause; this never returns an error.
pub async fn accept(listener: &TcpListener, name: &str) -> (TcpStream, SocketAddr) {
    loop {
        match listener.accept().await {
            Ok(s) => return s,
            Err(e) => {
                if crate::error::out_of_fds(&e) {
                    LOCAL_FDS.note(name);
                } else if ACCEPT_ERRORS.note(name) {
                    tracing::debug!(listener = name, error = %e, "accept error");
                }
                tokio::time::sleep(ACCEPT_BACKOFF).await;
            }
        }
    }
}

/// A client ready to be served: who it is, and its byte stream (TLS already accepted on a
/// TLS listener).
pub struct Client {
    /// From a trusted PROXY header, else the connection's own addresses.
    pub who: Peer,
    /// The address the TCP connection came from (trust decisions use this one).
    pub tcp_peer: SocketAddr,
    /// limpet's own socket address the client reached (`node_port = "same"` uses its port).
    pub local: SocketAddr,
    pub io: Box<dyn Io>,
    pub tls: bool,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("who", &self.who)
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

/// Takes an accepted connection through a listener's client side: Nagle off, the PROXY
/// header from a trusted peer (within `proxy_header`), then the TLS handshake on a TLS
/// listener (within `header_read`, like the request head that follows it). `Err` says why
/// the connection is refused, for a debug log line.
///
/// `bound` is the listening socket's address: a connection to a listener bound to one address
/// has that local address, so only a wildcard listener (`0.0.0.0`, `[::]`) asks the kernel
/// (one `getsockname` saved per connection, which `Connection: close` traffic pays each time).
pub async fn accept_client(
    stream: TcpStream,
    peer: SocketAddr,
    bound: SocketAddr,
    def: &ListenerDef,
) -> Result<Client, String> {
    let _ = stream.set_nodelay(true);
    let local = if bound.ip().is_unspecified() {
        stream.local_addr().unwrap_or(peer)
    } else {
        bound
    };
    let (who, stream) = crate::tcp::read_proxy_header(stream, peer, local, &def.proxy_protocol)
        .await
        .map_err(|e| format!("PROXY header refused: {e}"))?;
    let (io, tls): (Box<dyn Io>, bool) = match &def.tls {
        Some(cfg) => {
            let acceptor = tokio_rustls::TlsAcceptor::from(Arc::clone(cfg));
            match tokio::time::timeout(def.timeouts.header_read, acceptor.accept(stream)).await {
                Ok(Ok(s)) => (Box::new(s), true),
                Ok(Err(e)) => return Err(format!("TLS handshake failed: {e}")),
                Err(_) => return Err("TLS handshake timed out".into()),
            }
        }
        None => (Box::new(stream), false),
    };
    Ok(Client {
        who,
        tcp_peer: peer,
        local,
        io,
        tls,
    })
}

/// A TCP connection to a node within `timeout`, Nagle off (small writes, heads and WebSocket
/// frames, must not wait). Out of file descriptors is noted once per interval and carries
/// no verdict on the node.
pub async fn connect_node(addr: SocketAddr, timeout: Duration) -> Result<TcpStream, UpstreamError> {
    let stream = match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            if crate::error::out_of_fds(&e) {
                LOCAL_FDS.note("connect to a node");
            }
            return Err(UpstreamError::io(Stage::Connect, &e));
        }
        Err(_) => return Err(UpstreamError::timeout(Stage::Connect, false)),
    };
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// TLS to a node (`tls`: the client config and the name to send and verify) within
/// `timeout`; the plain stream when the listener does not use TLS to its nodes.
pub async fn node_tls<S>(
    stream: S,
    tls: Option<(
        &Arc<rustls::ClientConfig>,
        rustls_pki_types::ServerName<'static>,
    )>,
    timeout: Duration,
) -> Result<Box<dyn Io>, UpstreamError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let Some((cfg, name)) = tls else {
        return Ok(Box::new(stream));
    };
    let connector = tokio_rustls::TlsConnector::from(Arc::clone(cfg));
    match tokio::time::timeout(timeout, connector.connect(name, stream)).await {
        Ok(Ok(s)) => Ok(Box::new(s)),
        Ok(Err(e)) => Err(UpstreamError::io(Stage::Tls, &e)),
        Err(_) => Err(UpstreamError::timeout(Stage::Tls, false)),
    }
}

/// How much an HTTP client connection's first read takes ([`ReadAhead`]): a whole request
/// head of a typical client (curl and load tools send about 100 bytes, browsers up to a few
/// KiB); a larger head is read on by hyper as usual.
const READ_AHEAD: usize = 4 * 1024;

/// A client stream whose first read, if the reader asks for less than [`READ_AHEAD`], takes
/// [`READ_AHEAD`] from the socket and hands the rest out on the next reads, without syscalls.
///
/// Why: hyper-util tells HTTP/2 by prior knowledge from HTTP/1 by reading exactly the 24
/// bytes of the HTTP/2 preface first, then hyper reads the rest of the head: two `recvfrom`
/// for one request head, on every connection. A `Connection: close` client pays it on every
/// request (one syscall in eleven). After the first read the stream is passed through as is,
/// and the buffer is freed once handed out.
pub struct ReadAhead<S> {
    inner: S,
    /// Read ahead and not handed out yet: `ahead[pos..len]`.
    ahead: Option<Box<[u8]>>,
    pos: usize,
    len: usize,
    first: bool,
}

impl<S> std::fmt::Debug for ReadAhead<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadAhead")
            .field("ahead", &(self.len - self.pos))
            .field("first", &self.first)
            .finish_non_exhaustive()
    }
}

impl<S> ReadAhead<S> {
    pub fn new(inner: S) -> Self {
        ReadAhead {
            inner,
            ahead: None,
            pos: 0,
            len: 0,
            first: true,
        }
    }

    /// Hands out what was read ahead; frees the buffer once it is all out.
    fn hand_out(&mut self, out: &mut tokio::io::ReadBuf<'_>) {
        if let Some(ahead) = &self.ahead {
            let n = (self.len - self.pos).min(out.remaining());
            out.put_slice(&ahead[self.pos..self.pos + n]);
            self.pos += n;
        }
        if self.pos == self.len {
            self.ahead = None;
        }
    }
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for ReadAhead<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        out: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        use std::task::Poll;
        let this = &mut *self;
        if this.ahead.is_some() && !this.first {
            this.hand_out(out);
            return Poll::Ready(Ok(()));
        }
        if !this.first || out.remaining() >= READ_AHEAD {
            this.first = false;
            return std::pin::Pin::new(&mut this.inner).poll_read(cx, out);
        }
        // The first read, asked small: take READ_AHEAD (the buffer stays while the read is
        // pending, so it is made once).
        let ahead = this
            .ahead
            .get_or_insert_with(|| vec![0u8; READ_AHEAD].into_boxed_slice());
        let mut rb = tokio::io::ReadBuf::new(ahead);
        match std::pin::Pin::new(&mut this.inner).poll_read(cx, &mut rb) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Err(e)) => {
                this.first = false;
                this.ahead = None;
                Poll::Ready(Err(e))
            }
            Poll::Ready(Ok(())) => {
                this.first = false;
                this.len = rb.filled().len();
                this.pos = 0;
                this.hand_out(out);
                Poll::Ready(Ok(()))
            }
        }
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for ReadAhead<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A client connection whose writes go out at the end of the event-loop turn: each write
/// first yields once, so it runs after the tasks that are ready now, and the answers of one
/// turn leave together.
///
/// Why: the load tool and the nodes sleep whenever they run out of work, and waking a
/// sleeping process on another core costs the waker a cross-CPU wake-up (an IPI, a VM exit on
/// a virtual machine). Answers written one by one as each node answers, spread across the
/// turn, wake the client again and again; written together, once. HAProxy gets this from its
/// structure (its I/O callbacks run first, its stream tasks and their sends after them).
/// Measured (`bench/cost.sh --only limpet --events sched:sched_waking,ipi:ipi_send_cpu`, two
/// alternating runs each): processes woken per request 0.14 -> 0.09 on `sticky` and 0.27 ->
/// 0.15 on `plain`, system CPU per request 5% lower, requests/s 4% (`sticky`) and 6% (`plain`)
/// higher. Holding back the writes to nodes the same way gained nothing, so they go at once.
///
/// Only the first write of a flush yields (a write that follows a yield goes through), so a
/// long answer costs one extra task poll per write, nothing more; the connection's very first
/// write does not yield. Outside the write deadline
/// ([`crate::relay::WriteDeadline`]): a yield is not a blocked write. Under tokio's
/// multi-threaded runtime (the demo) a task that wakes itself is polled again next, so there
/// it only costs the extra poll.
#[derive(Debug)]
pub struct BatchedWrites<S> {
    inner: S,
    /// This write has yielded once already (or is the connection's first): the next attempt
    /// goes through.
    yielded: bool,
}

impl<S> BatchedWrites<S> {
    pub fn new(inner: S) -> Self {
        // The first write goes straight out: a connection that carries one answer
        // (`Connection: close`) has nothing to batch it with, and the yield would only add a
        // poll of the whole connection (measured: 3-4% fewer requests/s in `close` mode).
        BatchedWrites {
            inner,
            yielded: true,
        }
    }

    /// `Pending` (the task woken at once, so it runs again after the other ready tasks) the
    /// first time; `Ready` the time after.
    fn poll_turn_end(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        if self.yielded {
            self.yielded = false;
            std::task::Poll::Ready(())
        } else {
            self.yielded = true;
            cx.waker().wake_by_ref();
            std::task::Poll::Pending
        }
    }
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for BatchedWrites<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        out: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_read(cx, out)
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for BatchedWrites<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::task::ready!(self.poll_turn_end(cx));
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::task::ready!(self.poll_turn_end(cx));
        std::pin::Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader over scripted chunks (one per read; `None` is a pending read) that counts
    /// the reads that reached it.
    struct Chunks {
        chunks: std::collections::VecDeque<Option<Vec<u8>>>,
        reads: usize,
    }

    impl tokio::io::AsyncRead for Chunks {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            out: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            self.reads += 1;
            match self.chunks.pop_front() {
                Some(Some(c)) => {
                    let n = c.len().min(out.remaining());
                    out.put_slice(&c[..n]);
                    if n < c.len() {
                        self.chunks.push_front(Some(c[n..].to_vec()));
                    }
                    std::task::Poll::Ready(Ok(()))
                }
                Some(None) => {
                    cx.waker().wake_by_ref();
                    std::task::Poll::Pending
                }
                None => std::task::Poll::Ready(Ok(())),
            }
        }
    }

    fn chunks(c: &[Option<&[u8]>]) -> Chunks {
        Chunks {
            chunks: c.iter().map(|c| c.map(<[u8]>::to_vec)).collect(),
            reads: 0,
        }
    }

    /// Reads with `sizes` (cycled) until EOF; returns the bytes and the reads that reached
    /// the inner stream.
    async fn read_all(mut r: ReadAhead<Chunks>, sizes: &[usize]) -> (Vec<u8>, usize) {
        use tokio::io::AsyncReadExt;
        let mut got = Vec::new();
        for k in 0.. {
            let mut buf = vec![0u8; sizes[k % sizes.len()]];
            let n = r.read(&mut buf).await.expect("read");
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        (got, r.inner.reads)
    }

    /// A writer that notes each write in a shared log.
    struct Logged(std::rc::Rc<std::cell::RefCell<Vec<String>>>);

    impl tokio::io::AsyncWrite for Logged {
        fn poll_write(
            self: std::pin::Pin<&mut Self>,
            _cx: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            self.0
                .borrow_mut()
                .push(format!("write {}", String::from_utf8_lossy(buf)));
            std::task::Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(
            self: std::pin::Pin<&mut Self>,
            _cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
        fn poll_shutdown(
            self: std::pin::Pin<&mut Self>,
            _cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn an_answer_is_written_after_the_tasks_ready_in_the_same_turn() {
        use tokio::io::AsyncWriteExt;
        let log = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        let local = tokio::task::LocalSet::new();
        local
            .run_until(async {
                let mut w = BatchedWrites::new(Logged(log.clone()));
                let writer = tokio::task::spawn_local(async move {
                    w.write_all(b"answer 1").await.expect("write");
                    w.write_all(b"answer 2").await.expect("write");
                    w.write_all(b"answer 3").await.expect("write");
                });
                let others = log.clone();
                let other = tokio::task::spawn_local(async move {
                    others.borrow_mut().push("other task".to_owned());
                });
                writer.await.expect("writer");
                other.await.expect("other");
            })
            .await;
        assert_eq!(
            *log.borrow(),
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

    #[tokio::test]
    async fn the_preface_check_and_the_head_come_from_one_read() {
        let head = b"GET / HTTP/1.1\r\nHost: a\r\nUser-Agent: wrk\r\n\r\n";
        // 24 bytes (the HTTP/2 preface check), then hyper's large reads.
        let r = ReadAhead::new(chunks(&[Some(head)]));
        let (got, reads) = read_all(r, &[24, 8192]).await;
        assert_eq!(got, head);
        assert_eq!(reads, 2, "one read for the whole head, one for the EOF");
    }

    #[tokio::test]
    async fn a_pending_first_read_then_more_than_the_read_ahead_loses_nothing() {
        let big: Vec<u8> = (0..READ_AHEAD * 2 + 7).map(|i| (i % 251) as u8).collect();
        let r = ReadAhead::new(chunks(&[None, Some(&big), Some(b"tail")]));
        let (got, _) = read_all(r, &[24, 100, 8192]).await;
        let mut want = big.clone();
        want.extend_from_slice(b"tail");
        assert_eq!(got, want);
    }

    #[tokio::test]
    async fn a_large_first_read_goes_straight_through() {
        let r = ReadAhead::new(chunks(&[Some(b"abc"), Some(b"def")]));
        let (got, reads) = read_all(r, &[READ_AHEAD]).await;
        assert_eq!(got, b"abcdef");
        assert_eq!(reads, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_flood_of_errors_is_logged_once_per_interval() {
        let log = RateLimitedLog::new("test");
        assert!(log.note("a"), "the first is logged");
        for _ in 0..1000 {
            assert!(!log.note("a"));
        }
        tokio::time::advance(LOG_EVERY).await;
        assert!(log.note("a"), "then once per interval");
        assert!(!log.note("a"));
    }
}
