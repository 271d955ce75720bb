//! The listening socket and the accepted client socket every listener (HTTP, TCP, admin)
//! uses: a client socket joins tokio's reactor (`epoll_ctl(ADD)`) only when it first has to
//! wait, and one that never had to leaves it without an `epoll_ctl(DEL)`.
//!
//! ```text
//!  Listener::accept (accept4, non-blocking) ─► ClientSocket: unregistered
//!    read/write went through ──► stays unregistered ──► dropped: close()
//!    read/write would block ──► registered (tokio TcpStream, epoll_ctl ADD) ─► dropped: DEL + close()
//! ```
//!
//! **Why.** A `Connection: close` client sends its request with the connection, so by the time
//! the listener is readable and the connection accepted, the request is in the socket: it is
//! read at once, the answer written at once, and the socket closed, without the socket ever
//! needing to wait. tokio's `TcpListener::accept` registers every accepted socket and its drop
//! deregisters it, two `epoll_ctl` calls per connection that such a client never needed.
//! HAProxy makes none for it: it polls a socket only once a read or write would block.
//! This pays only because hyper no longer reads a client socket while its request is at
//! the node (`proxy::server`'s builder, `half_close`); a TCP listener's relay always waits on
//! the client, so its sessions register at once ([`ClientSocket::join_reactor`]).
//!
//! Measured (`bench/cost.sh --modes close`, with Nagle turned off on the listening socket,
//! see [`Listener`]): syscalls per `Connection: close` request 10.47 -> 7.26 (HAProxy 8.82),
//! allocations 28.5 -> 26.3.
//!
//! Reads made before the socket is registered need initialised memory: reading into the
//! uninitialised memory the caller hands over (hyper's fresh read buffer) needs `unsafe`,
//! which this crate forbids, and initialising it (`ReadBuf::initialize_unfilled_to`) zeroed
//! [`UNREGISTERED_READ`] bytes per connection for a request of about a hundred: about 4,100
//! of a `Connection: close` request's 43,400 to 45,700 instructions (callgrind counts each
//! byte of a `rep stosb` as one; in CPU time far less). They go instead into a buffer of the
//! thread's, zeroed once when the thread first reads, and only the bytes read are copied
//! out; a caller's buffer already initialised (a zeroed array) is read into as is.

use std::cell::RefCell;
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

/// The most an unregistered socket reads at once: a whole request head of a typical client
/// (load tools and curl send about 100 bytes, browsers up to a few KiB), and as much as the
/// HTTP listener's first read asks for (`proxy::client_io`'s read ahead). The size of each
/// thread's `READ_SCRATCH`.
pub const UNREGISTERED_READ: usize = 4 * 1024;

thread_local! {
    /// Where an unregistered socket's read lands before it is copied into the caller's
    /// buffer (see the module doc). Only borrowed for one `read` and its copy, never
    /// across an await.
    static READ_SCRATCH: RefCell<Box<[u8]>> =
        RefCell::new(vec![0; UNREGISTERED_READ].into_boxed_slice());
}

/// One read of an unregistered socket into `buf`, at most [`UNREGISTERED_READ`] bytes,
/// without zeroing any of `buf`: into `buf` itself where that much of it is initialised
/// already, else through the thread's scratch buffer.
fn read_unregistered(s: &std::net::TcpStream, buf: &mut ReadBuf<'_>) -> io::Result<()> {
    let room = buf.remaining().min(UNREGISTERED_READ);
    let initialised = buf.initialized().len().saturating_sub(buf.filled().len());
    if initialised < room {
        // `None` is not reachable (nothing reads a socket while holding the scratch buffer);
        // if it were, zeroing below is the slower way, not a wrong one.
        let through_scratch = READ_SCRATCH.with(|scratch| {
            let mut scratch = scratch.try_borrow_mut().ok()?;
            Some(
                (&*s)
                    .read(&mut scratch[..room])
                    .map(|n| buf.put_slice(&scratch[..n])),
            )
        });
        if let Some(read) = through_scratch {
            return read;
        }
    }
    let n = (&*s).read(buf.initialize_unfilled_to(room))?;
    buf.advance(n);
    Ok(())
}

/// A listening socket, registered with tokio's reactor. Accepting through it does not
/// register the accepted socket (see the module doc).
///
/// It is held as a tokio `TcpStream` on the listening descriptor: tokio's listener has no
/// readiness wait of its own to run a custom `accept4` under, its stream has
/// (`readable`, `try_io`), and a descriptor is a descriptor to the reactor. `AsyncFd`
/// would say it better, but its safe constructors are deprecated in this tokio (an I/O
/// safety hole) and the others are `unsafe`. Nothing reads or writes through the stream.
///
/// Nagle is off on every accepted socket (small writes, heads and WebSocket frames, must not
/// wait for an ACK). It is turned off once, on the listening socket, whose connections
/// inherit it on Linux: one `setsockopt` per listener instead of one per connection, which
/// a `Connection: close` client pays on every request. Where the listening socket refuses
/// it, each accepted socket gets it.
#[derive(Debug)]
pub struct Listener {
    fd: TcpStream,
    /// Whether accepted sockets inherit Nagle off from the listening socket.
    nodelay_inherited: bool,
}

impl Listener {
    /// Takes over a bound tokio listener (moved from its registration to this one).
    pub fn new(listener: TcpListener) -> io::Result<Self> {
        let fd = std::os::fd::OwnedFd::from(listener.into_std()?);
        let fd = TcpStream::from_std(std::net::TcpStream::from(fd))?;
        let nodelay_inherited =
            cfg!(target_os = "linux") && socket2::SockRef::from(&fd).set_tcp_nodelay(true).is_ok();
        Ok(Listener {
            fd,
            nodelay_inherited,
        })
    }

    /// The next connection. Several connections waiting are taken in one wake-up: the
    /// readiness is cleared only by an accept that would block.
    pub async fn accept(&self) -> io::Result<(ClientSocket, SocketAddr)> {
        loop {
            self.fd.readable().await?;
            match self
                .fd
                .try_io(Interest::READABLE, || accept_nonblocking(&self.fd))
            {
                Ok((stream, peer)) => {
                    if !self.nodelay_inherited {
                        // Best effort, as before: a socket that refuses it still works.
                        let _ = stream.set_nodelay(true);
                    }
                    return Ok((ClientSocket::new(stream), peer));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// `accept4` with the new socket non-blocking and close-on-exec: one syscall, as tokio's own.
#[cfg(target_os = "linux")]
fn accept_nonblocking(l: &TcpStream) -> io::Result<(std::net::TcpStream, SocketAddr)> {
    let (socket, addr) =
        socket2::SockRef::from(l).accept4(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC)?;
    Ok((socket.into(), ip_peer(&addr)?))
}

#[cfg(not(target_os = "linux"))]
fn accept_nonblocking(l: &TcpStream) -> io::Result<(std::net::TcpStream, SocketAddr)> {
    let (socket, addr) = socket2::SockRef::from(l).accept()?;
    socket.set_nonblocking(true)?;
    Ok((socket.into(), ip_peer(&addr)?))
}

/// The address of an accepted peer (a TCP listener's peers are IP).
fn ip_peer(addr: &socket2::SockAddr) -> io::Result<SocketAddr> {
    addr.as_socket().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "accepted a connection that is not IP",
        )
    })
}

/// An accepted client connection's socket: unregistered until a read or write would block,
/// then a tokio `TcpStream` (see the module doc).
#[derive(Debug)]
pub struct ClientSocket(Stage);

#[derive(Debug)]
enum Stage {
    /// Non-blocking, not known to tokio's reactor: reads and writes are tried directly.
    Unregistered(std::net::TcpStream),
    Registered(TcpStream),
    /// Registration failed (the reactor refused the socket, which closed it): every
    /// later call fails.
    Failed,
}

impl ClientSocket {
    /// `stream` must be non-blocking.
    pub fn new(stream: std::net::TcpStream) -> Self {
        ClientSocket(Stage::Unregistered(stream))
    }

    /// Whether the socket has joined tokio's reactor (a read or write had to wait).
    pub fn is_registered(&self) -> bool {
        matches!(self.0, Stage::Registered(_))
    }

    /// Registers the socket now, for a connection that is sure to wait (a TCP listener's
    /// relay reads the client for as long as the session lasts): its first read then finds
    /// the readiness the reactor reports instead of trying the socket once more.
    pub fn join_reactor(&mut self) -> io::Result<()> {
        self.register().map(|_| ())
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        match &self.0 {
            Stage::Unregistered(s) => s.local_addr(),
            Stage::Registered(s) => s.local_addr(),
            Stage::Failed => Err(failed()),
        }
    }

    /// The registered stream, registering the socket first if it is not yet. Once
    /// registered it stays so.
    fn register(&mut self) -> io::Result<&mut TcpStream> {
        if let Stage::Unregistered(_) = self.0 {
            let Stage::Unregistered(std) = std::mem::replace(&mut self.0, Stage::Failed) else {
                return Err(failed());
            };
            self.0 = Stage::Registered(TcpStream::from_std(std)?);
        }
        match &mut self.0 {
            Stage::Registered(s) => Ok(s),
            _ => Err(failed()),
        }
    }

    /// Tries `op` on the unregistered socket. `None`: it would block (or the socket is
    /// registered already), so the caller goes through the registered stream.
    fn try_unregistered<T>(
        &self,
        op: impl FnOnce(&std::net::TcpStream) -> io::Result<T>,
    ) -> Option<io::Result<T>> {
        let Stage::Unregistered(s) = &self.0 else {
            return None;
        };
        match op(s) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => None,
            r => Some(r),
        }
    }

    /// `poll` on the registered stream, registering the socket first.
    fn poll_registered<T>(
        &mut self,
        poll: impl FnOnce(Pin<&mut TcpStream>) -> Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match self.register() {
            Ok(s) => poll(Pin::new(s)),
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

fn failed() -> io::Error {
    io::Error::new(
        io::ErrorKind::NotConnected,
        "the client socket could not be registered",
    )
}

impl AsyncRead for ClientSocket {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Stage::Unregistered(s) = &this.0 {
            match read_unregistered(s, buf) {
                Ok(()) => return Poll::Ready(Ok(())),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        this.poll_registered(|s| s.poll_read(cx, buf))
    }
}

impl AsyncWrite for ClientSocket {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Some(r) = this.try_unregistered(|mut s| s.write(buf)) {
            return Poll::Ready(r);
        }
        this.poll_registered(|s| s.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Some(r) = this.try_unregistered(|mut s| s.write_vectored(bufs)) {
            return Poll::Ready(r);
        }
        this.poll_registered(|s| s.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Neither stage buffers.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(r) = this.try_unregistered(|s| s.shutdown(std::net::Shutdown::Write)) {
            return Poll::Ready(r);
        }
        this.poll_registered(|s| s.poll_shutdown(cx))
    }
}

impl crate::tcp::Io for ClientSocket {
    /// [`crate::tcp::Io::poll_write_last`] of a TCP socket (`MSG_MORE`), either stage.
    #[cfg(target_os = "linux")]
    fn poll_write_last(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Some(r) = this.try_unregistered(|s| crate::tcp::send_more(s, buf)) {
            return Poll::Ready(r);
        }
        this.poll_registered(|s| s.poll_write_last(cx, buf))
    }

    fn abort_on_close(&self) {
        match &self.0 {
            Stage::Unregistered(s) => crate::tcp::zero_linger(s),
            Stage::Registered(s) => crate::tcp::zero_linger(s),
            Stage::Failed => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn to_the_end(client: &mut tokio::net::TcpStream) -> Vec<u8> {
        let mut all = Vec::new();
        client.read_to_end(&mut all).await.expect("read to the end");
        all
    }

    async fn listener() -> (Listener, SocketAddr) {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr");
        (Listener::new(l).expect("listener"), addr)
    }

    /// What a `Connection: close` client does: its bytes are in the socket before it is
    /// accepted (a loopback write has reached the peer's socket when it returns). They are
    /// read, answered (plainly, vectored and with `MSG_MORE` before the end) and the socket
    /// closed, and the socket never joined the reactor.
    #[tokio::test]
    async fn a_client_whose_request_came_with_the_connection_is_served_without_joining_the_reactor()
    {
        let (l, addr) = listener().await;
        let mut client = tokio::net::TcpStream::connect(addr).await.expect("connect");
        client.write_all(b"request").await.expect("sent");
        let (mut s, peer) = l.accept().await.expect("accepted");
        assert_eq!(peer, client.local_addr().expect("local"));
        assert_eq!(s.local_addr().expect("local"), addr);

        let mut got = [0u8; 64];
        let n = s.read(&mut got).await.expect("read");
        assert_eq!(&got[..n], b"request");
        s.write_all(b"one ").await.expect("written");
        let parts = [io::IoSlice::new(b"two "), io::IoSlice::new(b"three ")];
        let n = s.write_vectored(&parts).await.expect("written");
        assert_eq!(n, 10, "both slices in one write");
        let n = std::future::poll_fn(|cx| {
            crate::tcp::Io::poll_write_last(Pin::new(&mut s), cx, b"last")
        })
        .await
        .expect("written");
        assert_eq!(n, 4);
        s.shutdown().await.expect("shut down");
        assert!(!s.is_registered(), "nothing had to wait");
        drop(s);

        assert_eq!(to_the_end(&mut client).await, b"one two three last");
    }

    /// Nagle is off on an accepted socket without a `setsockopt` of its own: the listening
    /// socket's setting is inherited (what `Listener` relies on).
    #[tokio::test]
    async fn an_accepted_socket_has_nagle_off_from_its_listener() {
        let (l, addr) = listener().await;
        assert!(l.nodelay_inherited);
        let (client, accepted) = tokio::join!(tokio::net::TcpStream::connect(addr), l.accept());
        let _client = client.expect("connect");
        let (s, _) = accepted.expect("accepted");
        let Stage::Unregistered(std) = &s.0 else {
            panic!("a fresh socket is unregistered");
        };
        assert!(
            std.nodelay().expect("nodelay"),
            "inherited from the listener"
        );
    }

    /// A read with nothing there yet registers the socket and is woken when the bytes come;
    /// from then on the socket is a registered stream like any other.
    #[tokio::test]
    async fn a_socket_that_has_to_wait_joins_the_reactor_and_gets_what_comes() {
        let (l, addr) = listener().await;
        let (client, accepted) = tokio::join!(tokio::net::TcpStream::connect(addr), l.accept());
        let mut client = client.expect("connect");
        let (mut s, _) = accepted.expect("accepted");
        assert!(!s.is_registered());

        let mut got = [0u8; 64];
        let mut read = std::pin::pin!(s.read(&mut got));
        assert!(read.as_mut().now_or_never().is_none(), "nothing sent yet");
        client.write_all(b"late").await.expect("sent");
        let n = read.await.expect("read");
        assert_eq!(&got[..n], b"late");
        assert!(s.is_registered(), "the read had to wait");

        s.write_all(b"answer").await.expect("written");
        drop(s);
        assert_eq!(to_the_end(&mut client).await, b"answer");
    }

    /// A write the socket has no room for registers it and completes once the peer reads.
    #[tokio::test]
    async fn a_write_that_has_to_wait_joins_the_reactor_and_completes() {
        let (l, addr) = listener().await;
        let (client, accepted) = tokio::join!(tokio::net::TcpStream::connect(addr), l.accept());
        let mut client = client.expect("connect");
        let (mut s, _) = accepted.expect("accepted");
        // More than loopback's send and receive buffers hold together.
        let big = vec![7u8; 16 * 1024 * 1024];
        let (written, read) = tokio::join!(
            async {
                s.write_all(&big).await.expect("written");
                s.shutdown().await.expect("shut down");
                s.is_registered()
            },
            async { to_the_end(&mut client).await.len() }
        );
        assert!(written, "the write had to wait");
        assert_eq!(read, big.len());
    }

    /// hyper hands an unregistered socket uninitialised memory: the read lands in it without
    /// any of it being zeroed (only the bytes read become initialised), one read takes at
    /// most [`UNREGISTERED_READ`], and what is larger comes whole over several reads.
    #[tokio::test]
    async fn an_unregistered_read_into_uninitialised_memory_zeroes_none_of_it() {
        async fn read_into_uninit(s: &mut ClientSocket, room: usize) -> (Vec<u8>, usize) {
            let mut memory = vec![std::mem::MaybeUninit::<u8>::uninit(); room];
            let mut buf = ReadBuf::uninit(&mut memory);
            std::future::poll_fn(|cx| Pin::new(&mut *s).poll_read(cx, &mut buf))
                .await
                .expect("read");
            (buf.filled().to_vec(), buf.initialized().len())
        }
        let (l, addr) = listener().await;
        let mut client = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let head = b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
        client.write_all(head).await.expect("sent");
        let (mut s, _) = l.accept().await.expect("accepted");

        let (got, initialised) = read_into_uninit(&mut s, 2 * UNREGISTERED_READ).await;
        assert_eq!(got, head);
        assert_eq!(initialised, head.len(), "nothing beyond the bytes read");
        assert!(!s.is_registered(), "the bytes were there");

        let big: Vec<u8> = (0..3 * UNREGISTERED_READ + 17)
            .map(|i| u8::try_from(i % 251).expect("below 251"))
            .collect();
        client.write_all(&big).await.expect("sent");
        let (got, initialised) = read_into_uninit(&mut s, 2 * UNREGISTERED_READ).await;
        assert_eq!(got, big[..UNREGISTERED_READ], "one read's worth");
        assert_eq!(initialised, UNREGISTERED_READ);
        let mut rest = Vec::new();
        while rest.len() < big.len() - UNREGISTERED_READ {
            let (got, initialised) = read_into_uninit(&mut s, 1000).await;
            assert_eq!(initialised, got.len());
            rest.extend_from_slice(&got);
        }
        assert_eq!(rest, big[UNREGISTERED_READ..], "in order, nothing lost");
    }

    /// Several clients waiting are all accepted; a socket's stages do not mix them up.
    #[tokio::test]
    async fn clients_waiting_together_are_each_accepted() {
        let (l, addr) = listener().await;
        let mut clients = Vec::new();
        for i in 0u8..5 {
            let mut c = tokio::net::TcpStream::connect(addr).await.expect("connect");
            c.write_all(&[i]).await.expect("sent");
            clients.push(c);
        }
        let mut seen = Vec::new();
        for _ in 0..5 {
            let (mut s, _) = l.accept().await.expect("accepted");
            let mut b = [0u8; 1];
            s.read_exact(&mut b).await.expect("read");
            seen.push(b[0]);
        }
        seen.sort_unstable();
        assert_eq!(seen, vec![0, 1, 2, 3, 4]);
    }
}
