//! Adversarial cases against the HTTP proxy (issue 13): slow and stalled peers on every I/O
//! path, HTTP/2 abuse, and the Host rules. Each case is what an attacker would try, on real
//! loopback sockets, with short configured timeouts so no case waits long; every wait is
//! bounded. The smuggling cases live in `proxy_limits.rs` and run in the same suite.

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use common::{config, nodes, raw_exchange, Proxy, PATIENCE};
use http_body_util::StreamBody;
use hyper::body::Frame;
use limpet::proxy::{NodeConfig, ProxyConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// How long a case may take to see a timeout of a few hundred ms act; far below the minutes
/// the unbounded paths used to hold.
const SOON: Duration = Duration::from_secs(5);

const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).unwrap_or(0);
    let mut f = len.to_be_bytes()[1..].to_vec();
    f.push(kind);
    f.push(flags);
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// Reads until the peer closes the connection; `Err` if it has not within `limit`.
async fn closed_within(
    s: &mut (impl tokio::io::AsyncRead + Unpin),
    limit: Duration,
) -> Result<Duration, ()> {
    let start = Instant::now();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(limit, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .map_err(|_| ())?;
    Ok(start.elapsed())
}

/// A request on a new connection, with `Connection: close`: served within `limit`?
async fn served_within(addr: SocketAddr, limit: Duration) -> bool {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .await
        .expect("write");
    let mut out = Vec::new();
    matches!(
        tokio::time::timeout(limit, s.read_to_end(&mut out)).await,
        Ok(Ok(_))
    ) && out.starts_with(b"HTTP/1.1 200")
}

/// Finding 1: HEADERS without END_HEADERS, then silence. The connection must be closed (not
/// only sent a GOAWAY) within about the request-head timeout, and its `max_connections`
/// slot freed for the next client.
#[tokio::test]
async fn h2_headers_without_end_headers_then_silence_closes_the_connection_and_frees_its_slot() {
    let ns = nodes(&["a"]).await;
    let mut cfg = config(&ns);
    cfg.timeouts.header_read = Duration::from_millis(300);
    cfg.limits.max_client_connections = 1;
    let proxy = Proxy::start(cfg).await;

    let mut s = TcpStream::connect(proxy.addr).await.expect("connect");
    // No END_HEADERS, no END_STREAM.
    s.write_all(&h2_opening(0)).await.expect("write");
    closed_at_the_head_timeout_and_the_slot_freed(&mut s, proxy.addr, Duration::ZERO).await;
    proxy.stop().await;
}

/// A connection's first bytes in HTTP/2: the preface, empty SETTINGS, and stream 1's HEADERS
/// (:method GET, :scheme http, :path /, :authority t) with `flags` (0x4 END_HEADERS, 0x1
/// END_STREAM).
fn h2_opening(flags: u8) -> Vec<u8> {
    let mut hello = H2_PREFACE.to_vec();
    hello.extend(h2_frame(4, 0, 0, &[]));
    hello.extend(h2_frame(1, flags, 1, &[0x82, 0x86, 0x84, 0x41, 0x01, b't']));
    hello
}

/// The start of stream `id`'s HEADERS frame (a GET of `/`, END_HEADERS and END_STREAM),
/// announced 1,014 bytes long: its header block's first 14 bytes, which end in a field
/// (`x-a`) whose 1,000-byte value has not begun. Each byte sent after it is one more of the
/// value: the frame, and the head, stay unfinished. (A head trickled as CONTINUATION frames
/// of a byte each is cut by h2 itself after a few, `too_many_continuations`.)
fn h2_endless_head(id: u32) -> Vec<u8> {
    let block = [
        0x82, 0x86, 0x84, 0x41, 0x01,
        b't', // :method GET, :scheme http, :path /, :authority t
        0x00, 0x03, b'x', b'-', b'a', // a literal field, new name `x-a`
        0x7f, 0xe9, 0x06, // value length 1,000 (127 + 873)
    ];
    let mut frame = h2_frame(1, 0x5, id, &block);
    let announced = u32::try_from(block.len() + 1000).unwrap_or(0);
    frame[..3].copy_from_slice(&announced.to_be_bytes()[1..]);
    frame
}

/// With a head of `s` stalled and a 300 ms head timeout: `s` is closed (not only sent a
/// GOAWAY) within the timeout and some slack, not before `not_before`, and the next client,
/// waiting in the backlog for the listener's only slot, is served.
async fn closed_at_the_head_timeout_and_the_slot_freed(
    s: &mut TcpStream,
    addr: SocketAddr,
    not_before: Duration,
) {
    let next = tokio::spawn(served_within(addr, PATIENCE));
    let took = closed_within(s, SOON)
        .await
        .expect("the stalled HTTP/2 connection is closed, not only GOAWAY'd");
    assert!(
        took >= not_before && took < Duration::from_millis(300 + 1500),
        "closed {took:?} after the head stalled"
    );
    assert!(
        next.await.expect("task"),
        "the freed slot serves the next client"
    );
}

/// Reads frames (within [`SOON`]) until one of `kind` comes; the connection must stay open
/// until then (`open_until` says what for) and the frame come in time (`came`).
async fn until_h2_frame(s: &mut TcpStream, kind: u8, open_until: &str, came: &str) {
    let read = tokio::time::timeout(SOON, async {
        while read_h2_frame(s)
            .await
            .unwrap_or_else(|| panic!("{open_until}"))
            .0
            != kind
        {}
    })
    .await;
    assert!(read.is_ok(), "{came}");
}

/// The next HTTP/2 frame from `s`, as (type, flags, stream, payload); `None` once it closed.
async fn read_h2_frame(
    s: &mut (impl tokio::io::AsyncRead + Unpin),
) -> Option<(u8, u8, u32, Vec<u8>)> {
    let mut head = [0u8; 9];
    s.read_exact(&mut head).await.ok()?;
    let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
    let mut payload = vec![0u8; len];
    s.read_exact(&mut payload).await.ok()?;
    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    Some((head[3], head[4], stream, payload))
}

/// Reads HTTP/2 frames until stream `id`'s answer has ended (a frame of it with END_STREAM).
async fn read_h2_answer(s: &mut TcpStream, id: u32) {
    tokio::time::timeout(PATIENCE, async {
        loop {
            let (kind, flags, stream, _) = read_h2_frame(s)
                .await
                .unwrap_or_else(|| panic!("closed before stream {id}'s answer ended"));
            if stream == id && (kind == 0 || kind == 1) && flags & 0x1 != 0 {
                return;
            }
        }
    })
    .await
    .expect("answer in time");
}

/// A proxy with a 300 ms head timeout and a 30 s idle one (one client connection at most,
/// with `one_slot`), its node (kept for as long as the proxy is used), and an HTTP/2
/// connection to it whose stream 1 has been answered.
async fn h2_connection_after_one_answer(one_slot: bool) -> (Proxy, Vec<common::Node>, TcpStream) {
    let ns = nodes(&["a"]).await;
    let mut cfg = config(&ns);
    cfg.timeouts.header_read = Duration::from_millis(300);
    cfg.timeouts.keep_alive_idle = Duration::from_secs(30);
    if one_slot {
        cfg.limits.max_client_connections = 1;
    }
    let proxy = Proxy::start(cfg).await;
    let mut s = TcpStream::connect(proxy.addr).await.expect("connect");
    s.write_all(&h2_opening(0x5)).await.expect("write");
    read_h2_answer(&mut s, 1).await;
    (proxy, ns, s)
}

/// The failure model's slow head, on a later HTTP/2 stream: once a request has been
/// answered, HEADERS without END_HEADERS on the next stream, then silence. h2 surfaces no
/// request for a head that is not whole, so the connection looked idle between requests and
/// stayed open for `idle` (30 s here); the head gets `header_read` as the first one does.
#[tokio::test]
async fn h2_a_later_stream_s_unfinished_head_closes_the_connection_at_the_head_timeout() {
    let (proxy, _nodes, mut s) = h2_connection_after_one_answer(true).await;
    // Stream 3: no END_HEADERS, then nothing.
    s.write_all(&h2_frame(1, 0, 3, &[0x82, 0x86, 0x84]))
        .await
        .expect("write");
    // The head's clock starts with its bytes, so never before the timeout.
    closed_at_the_head_timeout_and_the_slot_freed(&mut s, proxy.addr, Duration::from_millis(300))
        .await;
    proxy.stop().await;
}

/// An HTTP/2 connection idle between requests, with only PINGs from its client, is not a
/// slow head: it stays open past `header_read` and serves its next request.
#[tokio::test]
async fn h2_pings_between_requests_are_not_a_slow_head() {
    let (proxy, _nodes, mut s) = h2_connection_after_one_answer(false).await;
    // Three PINGs, 200 ms apart: 600 ms without a request, twice `header_read`.
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        s.write_all(&h2_frame(6, 0, 0, &[0; 8]))
            .await
            .expect("ping");
    }
    s.write_all(&h2_frame(1, 0x5, 3, &[0x82, 0x86, 0x84, 0xbe]))
        .await
        .expect("write");
    read_h2_answer(&mut s, 3).await;
    proxy.stop().await;
}

/// Finding 1, HTTP/1: half a head, then silence: closed within the head timeout, slot freed.
#[tokio::test]
async fn http1_request_head_timeout_closes_the_connection_and_frees_its_slot() {
    let ns = nodes(&["a"]).await;
    let mut cfg = config(&ns);
    cfg.timeouts.header_read = Duration::from_millis(300);
    cfg.limits.max_client_connections = 1;
    let proxy = Proxy::start(cfg).await;
    let mut s = TcpStream::connect(proxy.addr).await.expect("connect");
    s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\nX-A: ")
        .await
        .expect("write");
    let next = tokio::spawn(served_within(proxy.addr, PATIENCE));
    let took = closed_within(&mut s, SOON)
        .await
        .expect("a stalled head is closed");
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_millis(300 + 1500),
        "closed {took:?} after half a head, with header_read 300 ms"
    );
    assert!(next.await.expect("task"), "the next client is served");
    proxy.stop().await;
}

/// A slowloris that trickles: a request head whose bytes keep coming, one every 50 ms, and
/// never end (HTTP/1: a header value that grows; HTTP/2: a HEADERS frame's block, a byte at a
/// time). `header_read` bounds the whole head, not the gap between two bytes: the
/// connection is closed within it (300 ms) and slack, while the bytes still come, and its
/// slot is freed for the next client.
#[tokio::test]
async fn a_head_trickled_byte_by_byte_is_closed_at_header_read_http1_and_http2() {
    let ns = nodes(&["a"]).await;
    let mut cfg = config(&ns);
    cfg.timeouts.header_read = Duration::from_millis(300);
    cfg.limits.max_client_connections = 1;
    let proxy = Proxy::start(cfg).await;
    for h2 in [false, true] {
        let mut s = TcpStream::connect(proxy.addr).await.expect("connect");
        let (first, next): (Vec<u8>, Vec<u8>) = if h2 {
            let mut hello = H2_PREFACE.to_vec();
            hello.extend(h2_frame(4, 0, 0, &[]));
            hello.extend(h2_endless_head(1));
            (hello, b"a".to_vec())
        } else {
            (
                b"GET / HTTP/1.1\r\nHost: t\r\nX-A: ".to_vec(),
                b"a".to_vec(),
            )
        };
        s.write_all(&first).await.expect("write");
        let (mut rd, mut wr) = s.into_split();
        // Bounded: 400 bytes over 20 s at most; it ends at the first failed write.
        let trickle = tokio::spawn(async move {
            let mut sent = 0u32;
            for _ in 0..400 {
                tokio::time::sleep(Duration::from_millis(50)).await;
                if wr.write_all(&next).await.is_err() {
                    break;
                }
                sent += 1;
            }
            sent
        });
        let next_client = tokio::spawn(served_within(proxy.addr, PATIENCE));
        let took = closed_within(&mut rd, SOON).await.unwrap_or_else(|()| {
            panic!("h2 {h2}: a trickled head still open after {SOON:?} (header_read 300 ms)")
        });
        assert!(
            took < Duration::from_millis(300 + 1500),
            "h2 {h2}: closed {took:?} after the head began trickling"
        );
        let sent = trickle.await.expect("trickle task");
        assert!(
            sent >= 3,
            "h2 {h2}: bytes kept coming until the close ({sent})"
        );
        assert!(
            next_client.await.expect("task"),
            "h2 {h2}: the freed slot serves the next client"
        );
    }
    proxy.stop().await;
}

/// One answer on a kept-alive connection, read to the end of its `Content-Length` body.
async fn read_one_answer(s: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = tokio::time::timeout(PATIENCE, s.read(&mut buf))
            .await
            .expect("answer in time")
            .expect("read");
        assert!(n > 0, "closed before the answer was whole");
        got.extend_from_slice(&buf[..n]);
        let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("a Content-Length answer");
        if got.len() >= end + 4 + len {
            return String::from_utf8_lossy(&got).into_owned();
        }
    }
}

/// HTTP/1 after a first request: the request-head clock starts when the connection turns
/// idle, so half of the next head, or none of it, is closed within the head timeout, well
/// before the (longer) keep-alive idle timeout, and the slot is freed.
#[tokio::test]
async fn http1_the_next_head_on_a_kept_alive_connection_has_the_head_timeout() {
    let ns = nodes(&["a"]).await;
    let mut cfg = config(&ns);
    cfg.timeouts.header_read = Duration::from_millis(300);
    cfg.timeouts.keep_alive_idle = Duration::from_secs(60);
    cfg.limits.max_client_connections = 1;
    let proxy = Proxy::start(cfg).await;
    for half_a_head in [&b"GET / HTTP/1.1\r\nHost: t\r\nX-A: "[..], b""] {
        let mut s = TcpStream::connect(proxy.addr).await.expect("connect");
        s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            .await
            .expect("write");
        let answer = read_one_answer(&mut s).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        let idle_from = Instant::now();
        s.write_all(half_a_head).await.expect("write");
        closed_within(&mut s, SOON)
            .await
            .expect("closed within the head timeout, not the keep-alive one");
        let took = idle_from.elapsed();
        assert!(
            took >= Duration::from_millis(250) && took < Duration::from_millis(300 + 1500),
            "closed {took:?} after the answer ({} bytes of a head sent)",
            half_a_head.len()
        );
        assert!(
            served_within(proxy.addr, PATIENCE).await,
            "the freed slot serves the next client"
        );
    }
    proxy.stop().await;
}

/// A connection that never sends a byte costs little while it waits (its HTTP state is built
/// only at the first byte) but is still closed at the request-head timeout, freeing its slot.
#[tokio::test]
async fn a_silent_connection_is_closed_within_the_head_timeout_and_frees_its_slot() {
    let ns = nodes(&["a"]).await;
    let mut cfg = config(&ns);
    cfg.timeouts.header_read = Duration::from_millis(300);
    cfg.limits.max_client_connections = 1;
    let proxy = Proxy::start(cfg).await;
    let mut s = TcpStream::connect(proxy.addr).await.expect("connect");
    let next = tokio::spawn(served_within(proxy.addr, PATIENCE));
    let took = closed_within(&mut s, SOON)
        .await
        .expect("a silent connection is closed");
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_millis(300 + 1500),
        "closed {took:?} after the connect, with header_read 300 ms"
    );
    assert!(next.await.expect("task"), "the next client is served");
    proxy.stop().await;
}

/// A node that never answers and reports, for each connection, when limpet closed it.
struct SilentNode {
    addr: SocketAddr,
    closed: mpsc::Receiver<()>,
    task: tokio::task::JoinHandle<()>,
}

impl SilentNode {
    /// `answer`: bytes written once the request head arrived (then silence).
    async fn start(answer: &'static [u8]) -> SilentNode {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (tx, closed) = mpsc::channel(16);
        let task = tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let tx = tx.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 16 * 1024];
                    let mut seen = Vec::new();
                    let mut answered = false;
                    loop {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => seen.extend_from_slice(&buf[..n]),
                        }
                        if !answered && seen.windows(4).any(|w| w == b"\r\n\r\n") {
                            answered = true;
                            if s.write_all(answer).await.is_err() {
                                break;
                            }
                        }
                    }
                    let _ = tx.send(()).await;
                });
            }
        });
        SilentNode { addr, closed, task }
    }

    fn config(&self) -> ProxyConfig {
        ProxyConfig::new(vec![NodeConfig {
            name: "silent".into(),
            addr: self.addr,
        }])
    }

    async fn connection_closed_within(&mut self, limit: Duration) -> bool {
        matches!(
            tokio::time::timeout(limit, self.closed.recv()).await,
            Ok(Some(()))
        )
    }
}

impl Drop for SilentNode {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Finding 2, HTTP/1: a request body that stops arriving gets 408, and the node connection
/// holding the half-sent request is closed.
#[tokio::test]
async fn http1_request_body_that_stops_gets_408_and_the_node_connection_is_released() {
    let (mut node, proxy, mut s) = upload_to_a_silent_node().await;
    s.write_all(b"POST /upload HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n0123456789")
        .await
        .expect("write");
    let took = answered_408_and_released(&mut s, &mut node).await;
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_millis(300 + 1500),
        "408 {took:?} after the body stopped, with client_idle 300 ms"
    );
    proxy.stop().await;
}

/// A silent node behind a proxy whose `client_idle` is 300 ms, and a client connection to it.
async fn upload_to_a_silent_node() -> (SilentNode, Proxy, TcpStream) {
    let node = SilentNode::start(b"").await;
    let mut cfg = node.config();
    cfg.timeouts.client_idle = Duration::from_millis(300);
    let proxy = Proxy::start(cfg).await;
    let s = TcpStream::connect(proxy.addr).await.expect("connect");
    (node, proxy, s)
}

/// The client's stopped body is answered 408 and its connection closed within [`SOON`], and
/// the node connection holding the half-sent request is released; how long the 408 took.
async fn answered_408_and_released(s: &mut TcpStream, node: &mut SilentNode) -> Duration {
    let stopped = Instant::now();
    let mut out = Vec::new();
    let answered = tokio::time::timeout(SOON, s.read_to_end(&mut out)).await;
    assert!(answered.is_ok(), "answered and closed in time");
    let took = stopped.elapsed();
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(
        node.connection_closed_within(SOON).await,
        "the node connection is released"
    );
    took
}

/// The same with `Expect: 100-continue`: the client waits for the `100 Continue`, sends part
/// of its body and stops. The body's idle clock runs from then as for any body: 408, and the
/// node connection released.
#[tokio::test]
async fn http1_expect_continue_body_that_stops_gets_408_and_the_node_connection_is_released() {
    let (mut node, proxy, mut s) = upload_to_a_silent_node().await;
    s.write_all(
        b"POST /upload HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\nExpect: 100-continue\r\n\r\n",
    )
    .await
    .expect("write");
    let mut cont = [0u8; 25];
    tokio::time::timeout(SOON, s.read_exact(&mut cont))
        .await
        .expect("100 Continue in time")
        .expect("read");
    assert!(
        cont.starts_with(b"HTTP/1.1 100 Continue\r\n"),
        "{:?}",
        String::from_utf8_lossy(&cont)
    );
    s.write_all(b"0123456789").await.expect("write");
    let took = answered_408_and_released(&mut s, &mut node).await;
    assert!(
        took >= Duration::from_millis(250),
        "408 before client_idle: {took:?}"
    );
    proxy.stop().await;
}

/// An HTTP/2 connection to the proxy, driven by hyper's client.
async fn h2_client(
    addr: SocketAddr,
) -> hyper::client::conn::http2::SendRequest<StreamBody<tokio_stream_like::Rx>> {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .expect("h2 handshake");
    tokio::spawn(conn);
    sender
}

/// One bodiless HTTP/2 GET / on a new connection: its answer, within [`SOON`].
async fn h2_get(addr: SocketAddr) -> http::Response<hyper::body::Incoming> {
    let mut sender = h2_client(addr).await;
    let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, Infallible>>(1);
    drop(tx);
    let req = http::Request::get(format!("http://{addr}/"))
        .body(StreamBody::new(tokio_stream_like::Rx(rx)))
        .expect("request");
    tokio::time::timeout(SOON, sender.send_request(req))
        .await
        .expect("answered in time")
        .expect("answer")
}

/// A request body fed from a channel: frames arrive when the test sends them.
mod tokio_stream_like {
    use std::convert::Infallible;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use bytes::Bytes;
    use hyper::body::Frame;
    use tokio::sync::mpsc;

    pub(crate) struct Rx(pub(crate) mpsc::Receiver<Result<Frame<Bytes>, Infallible>>);

    impl futures_util::Stream for Rx {
        type Item = Result<Frame<Bytes>, Infallible>;
        fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
            self.0.poll_recv(cx)
        }
    }
}

/// The header field count limit (`max_headers`, 100) holds for HTTP/2 as for HTTP/1:
/// 431 on the stream, nothing sent to a node, and the connection serves the next stream.
#[tokio::test]
async fn h2_requests_over_the_header_field_limit_get_431_and_reach_no_node() {
    // The node: a socket that notes each connection made to it.
    let node = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let mut cfg = ProxyConfig::new(vec![NodeConfig {
        name: "a".into(),
        addr: node.local_addr().expect("addr"),
    }]);
    // Were it forwarded, the request would wait this long for an answer that never comes.
    cfg.timeouts.upstream_answer = Duration::from_secs(1);
    let proxy = Proxy::start(cfg).await;
    let mut sender = h2_client(proxy.addr).await;
    let request = |fields: usize, cookies: usize| {
        let mut req = hyper::Request::get(format!("http://{}/", proxy.addr));
        for i in 0..fields {
            req = req.header(format!("x-field-{i}"), "1");
        }
        // One field per cookie, as browsers send them over HTTP/2: they count as one.
        for i in 0..cookies {
            req = req.header("cookie", format!("c{i}=1"));
        }
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        drop(tx);
        req.body(StreamBody::new(tokio_stream_like::Rx(rx)))
            .expect("request")
    };
    let resp = sender.send_request(request(150, 0)).await.expect("answer");
    assert_eq!(resp.status(), 431);
    assert!(
        tokio::time::timeout(Duration::from_millis(300), node.accept())
            .await
            .is_err(),
        "a node connection was made for the refused request"
    );
    // The connection goes on: a request within the limit (its 120 cookie crumbs one
    // field) reaches the node.
    let next = tokio::spawn(sender.send_request(request(90, 120)));
    let accepted = tokio::time::timeout(Duration::from_secs(5), node.accept()).await;
    assert!(
        matches!(accepted, Ok(Ok(_))),
        "the next stream, within the limit, reaches the node"
    );
    next.abort();
    proxy.stop().await;
}

/// A node answer with both `Content-Length` and `Transfer-Encoding: chunked` is read by the
/// chunks (RFC 9112 6.3), and forwarded without the `Content-Length`, whole: on the
/// request-driven path (GET) and on hyper's (POST) alike.
#[tokio::test]
async fn a_node_answer_with_both_lengths_reaches_the_client_whole_without_its_content_length() {
    let node = SilentNode::start(
        b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\nTransfer-Encoding: chunked\r\n\r\n\
          3\r\nabc\r\n0\r\n\r\n",
    )
    .await;
    let proxy = Proxy::start(node.config()).await;
    for head in [
        &b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"[..],
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi",
    ] {
        let answer = raw_exchange(proxy.addr, head).await;
        let what = String::from_utf8_lossy(head)
            .lines()
            .next()
            .unwrap_or("")
            .to_owned();
        assert!(answer.starts_with("HTTP/1.1 200"), "{what}: {answer:?}");
        let lower = answer.to_ascii_lowercase();
        assert!(!lower.contains("content-length: 50"), "{what}: {answer:?}");
        // The body as the client reads it: chunked (or up to the close), with all of abc.
        let body = &answer[answer.find("\r\n\r\n").map_or(0, |i| i + 4)..];
        assert!(
            body.contains("abc")
                && (lower.contains("transfer-encoding: chunked") && body.ends_with("0\r\n\r\n")),
            "{what}: the whole body, properly framed: {answer:?}"
        );
    }
    proxy.stop().await;
}

/// Nothing is lost: a GET's chunked body reaches the node (hyper's client would frame a GET
/// with no stated length as bodiless), as a POST's does.
#[tokio::test]
async fn a_chunked_get_body_reaches_the_node() {
    let ns = nodes(&["a"]).await;
    let proxy = Proxy::start(config(&ns)).await;
    for method in ["GET", "POST"] {
        let head = format!(
            "{method} /upload HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\
             Connection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
        );
        let answer = raw_exchange(proxy.addr, head.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{method}: {answer}");
        // The node counts the body bytes it received.
        assert_eq!(
            answer.split_once("\r\n\r\n").map(|(_, body)| body),
            Some("5\n"),
            "{method}: {answer}"
        );
    }
    proxy.stop().await;
}

/// A request body in a transfer coding other than chunked (`gzip, chunked`) gets 501, as
/// nginx answers (RFC 9112 6.1): hyper decodes only the chunks, and a node handed the rest
/// would take the still-compressed bytes for the body.
#[tokio::test]
async fn a_request_in_a_transfer_coding_other_than_chunked_gets_501() {
    let ns = nodes(&["a"]).await;
    let proxy = Proxy::start(config(&ns)).await;
    for te in [
        "gzip, chunked",
        "gzip,chunked",
        "chunked\r\nTransfer-Encoding: deflate, chunked",
    ] {
        let head = format!(
            "POST /upload HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: {te}\r\n\
             Connection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
        );
        let answer = raw_exchange(proxy.addr, head.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 501"), "{te:?}: {answer}");
    }
    // Plain chunked still goes through (the node counts the body bytes).
    let answer = raw_exchange(
        proxy.addr,
        b"POST /upload HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: Chunked\r\n\
          Connection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("\r\n\r\n5\n"), "{answer}");
    proxy.stop().await;
}

/// A node answer in a transfer coding other than chunked keeps it for an HTTP/1.1 client
/// (`Transfer-Encoding: gzip, chunked`, the bytes as the node sent them), on both paths to
/// the node (GET and POST); an HTTP/2 client, whose protocol cannot say it, gets 502 rather
/// than the encoded bytes passed off as the body.
#[tokio::test]
async fn a_node_answer_in_another_transfer_coding_keeps_it_for_http1_1_and_is_502_for_http2() {
    // The node answers once per connection, then keeps it open in silence: each case gets
    // a node and a proxy of its own, so that none reuses another's node connection.
    const ANSWER: &[u8] =
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
    for head in [
        &b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"[..],
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi",
    ] {
        let node = SilentNode::start(ANSWER).await;
        let proxy = Proxy::start(node.config()).await;
        let answer = raw_exchange(proxy.addr, head).await;
        let what = String::from_utf8_lossy(&head[..4]).into_owned();
        let lower = answer.to_ascii_lowercase();
        assert!(answer.starts_with("HTTP/1.1 200"), "{what}: {answer:?}");
        assert!(
            lower.contains("transfer-encoding: gzip, chunked\r\n"),
            "{what}: the coding is kept: {answer:?}"
        );
        assert!(
            answer.ends_with("\r\n\r\n3\r\nabc\r\n0\r\n\r\n"),
            "{what}: the bytes as the node sent them: {answer:?}"
        );
        proxy.stop().await;
    }
    let node = SilentNode::start(ANSWER).await;
    let proxy = Proxy::start(node.config()).await;
    let resp = h2_get(proxy.addr).await;
    assert_eq!(resp.status(), 502);
    proxy.stop().await;
}

/// A node whose answer head to `GET /head?kib=N` carries N KiB of fields (in 4 KiB fields),
/// keep-alive: each connection answers request after request.
async fn head_node() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let task = tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 16 * 1024];
                let mut seen = Vec::new();
                loop {
                    let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") else {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => seen.extend_from_slice(&buf[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&seen[..end]).into_owned();
                    seen.drain(..end + 4);
                    let kib = head
                        .split_once("kib=")
                        .and_then(|(_, r)| r.split(' ').next())
                        .and_then(|n| n.parse::<usize>().ok())
                        .unwrap_or(0);
                    let pad = head
                        .split_once("pad=")
                        .and_then(|(_, r)| r.split([' ', '&']).next())
                        .and_then(|n| n.parse::<usize>().ok());
                    let mut answer = String::from("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n");
                    if let Some(pad) = pad {
                        answer.push_str(&format!("x-pad: {}\r\n", "p".repeat(pad)));
                    }
                    for i in 0..kib / 4 {
                        // 4 KiB a field as HTTP/2 counts it: name, value and 32.
                        answer.push_str(&format!("x-f{i:04}: {}\r\n", "v".repeat(4096 - 32 - 7)));
                    }
                    answer.push_str("\r\nok");
                    if s.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, task)
}

/// A proxy to one [`head_node`] (node `n`), and the node's task.
async fn proxy_to_head_node() -> (Proxy, tokio::task::JoinHandle<()>) {
    let (node, task) = head_node().await;
    let proxy = Proxy::start(ProxyConfig::new(vec![NodeConfig {
        name: "n".into(),
        addr: node,
    }]))
    .await;
    (proxy, task)
}

/// An HTTP/2 client connection to `addr` that takes any answer head, to see what limpet
/// sends; its connection driven by a task of its own.
async fn h2_taking_any_head(
    addr: SocketAddr,
) -> hyper::client::conn::http2::SendRequest<http_body_util::Empty<Bytes>> {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (sender, conn) =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .max_header_list_size(4 << 20)
            .handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("h2 handshake");
    tokio::spawn(conn);
    sender
}

/// The status of a GET of `target` (as written after the authority) on `sender`'s
/// connection to `addr`, answered within [`SOON`].
async fn h2_status(
    sender: &mut hyper::client::conn::http2::SendRequest<http_body_util::Empty<Bytes>>,
    addr: SocketAddr,
    target: &str,
) -> http::StatusCode {
    let req = http::Request::get(format!("http://{addr}{target}"))
        .body(http_body_util::Empty::<Bytes>::new())
        .expect("request");
    tokio::time::timeout(SOON, sender.send_request(req))
        .await
        .expect("answered in time")
        .expect("answer on the same connection")
        .status()
}

/// A node answer head too large for HTTP/2 clients (they bound the CONTINUATION frames they
/// read, and nghttp2's drop the whole connection past 8: every other stream is lost, chaos
/// run) is that stream's 502, and the connection serves its next streams; a head under the
/// limit passes, and an HTTP/1.1 client still takes the large one.
#[tokio::test]
async fn an_answer_head_too_large_for_http2_is_that_stream_s_502_and_the_connection_goes_on() {
    let (proxy, task) = proxy_to_head_node().await;
    let mut sender = h2_taking_any_head(proxy.addr).await;
    let mut status_of =
        async |kib: usize| h2_status(&mut sender, proxy.addr, &format!("/head?kib={kib}")).await;
    assert_eq!(status_of(48).await, 200, "48 KiB: under the limit");
    assert_eq!(status_of(240).await, 502, "240 KiB: too large for HTTP/2");
    assert_eq!(
        status_of(0).await,
        200,
        "the connection serves the next stream"
    );
    let answer = raw_exchange(
        proxy.addr,
        b"GET /head?kib=240 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "HTTP/1.1 takes it");
    proxy.stop().await;
    task.abort();
}

/// A node answer head that fits an HTTP/2 head, but not with limpet's `Set-Cookie` and
/// `Cache-Control` added (60 bytes to spare, as HTTP/2 counts them), goes to a client that
/// is assigned a node without them, 200: never a 502 for a cookie. (Before, the fresh
/// client got 502 where a client with the cookie got 200.)
#[tokio::test]
async fn an_answer_that_fits_http2_only_without_the_cookie_goes_without_it() {
    let (proxy, task) = proxy_to_head_node().await;
    let mut sender = h2_taking_any_head(proxy.addr).await;
    // `content-length: 2` (47 as HTTP/2 counts it) and `x-pad` (37 and the padding).
    let pad = 64 * 1024 - 60 - 47 - 37;
    for cookie in [None, Some("route=n")] {
        let mut req = http::Request::get(format!("http://{}/head?pad={pad}", proxy.addr));
        if let Some(c) = cookie {
            req = req.header("cookie", c);
        }
        let req = req
            .body(http_body_util::Empty::<Bytes>::new())
            .expect("request");
        let resp = tokio::time::timeout(SOON, sender.send_request(req))
            .await
            .expect("answered in time")
            .expect("answer");
        assert_eq!(resp.status(), 200, "cookie {cookie:?}");
        assert!(
            !resp.headers().contains_key("set-cookie"),
            "cookie {cookie:?}: {:?}",
            resp.headers().get("set-cookie")
        );
    }
    proxy.stop().await;
    task.abort();
}

/// Finding 2, HTTP/2: a stream whose body stops gets 408; the node connection is released.
#[tokio::test]
async fn h2_request_body_that_stops_gets_408_and_the_node_connection_is_released() {
    let mut node = SilentNode::start(b"").await;
    let mut cfg = node.config();
    cfg.timeouts.client_idle = Duration::from_millis(300);
    let proxy = Proxy::start(cfg).await;
    let mut sender = h2_client(proxy.addr).await;
    let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, Infallible>>(4);
    tx.send(Ok(Frame::data(Bytes::from_static(b"0123456789"))))
        .await
        .expect("first bytes");
    let req = http::Request::post(format!("http://{}/upload", proxy.addr))
        .header("content-length", "100")
        .body(StreamBody::new(tokio_stream_like::Rx(rx)))
        .expect("request");
    let sent = Instant::now();
    let resp = tokio::time::timeout(SOON, sender.send_request(req))
        .await
        .expect("answered in time")
        .expect("answer");
    assert_eq!(resp.status(), 408);
    let took = sent.elapsed();
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_millis(300 + 1500),
        "408 {took:?} after the body's first bytes, with client_idle 300 ms"
    );
    assert!(
        node.connection_closed_within(SOON).await,
        "the node connection is released"
    );
    drop(tx);
    proxy.stop().await;
}

/// The server's SETTINGS_MAX_CONCURRENT_STREAMS, read from its first SETTINGS frame.
async fn h2_max_streams(addr: SocketAddr) -> Option<u32> {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let mut hello = H2_PREFACE.to_vec();
    hello.extend(h2_frame(4, 0, 0, &[]));
    s.write_all(&hello).await.expect("write");
    tokio::time::timeout(SOON, async {
        loop {
            let (kind, flags, _, payload) = read_h2_frame(&mut s).await?;
            if kind == 4 && flags & 1 == 0 {
                return payload.chunks_exact(6).find_map(|e| {
                    (u16::from_be_bytes([e[0], e[1]]) == 3)
                        .then(|| u32::from_be_bytes([e[2], e[3], e[4], e[5]]))
                });
            }
        }
    })
    .await
    .ok()
    .flatten()
}

/// Finding 2: one client connection may hold at most 100 streams (so at most 100 node
/// connections) by default, as HAProxy allows; the listener can set another number.
#[tokio::test]
async fn h2_concurrent_streams_default_to_100_and_are_configurable() {
    let ns = nodes(&["a"]).await;
    let proxy = Proxy::start(config(&ns)).await;
    assert_eq!(h2_max_streams(proxy.addr).await, Some(100));
    proxy.stop().await;
    let mut cfg = config(&ns);
    cfg.limits.h2_max_concurrent_streams = 7;
    let proxy = Proxy::start(cfg).await;
    assert_eq!(h2_max_streams(proxy.addr).await, Some(7));
    proxy.stop().await;
}

/// Finding 2, enforced: a client that opens more streams than the listener allows (it
/// ignores the SETTINGS it acknowledged, as an attacker would) has the extra ones refused
/// (RST_STREAM), and they open no node connection: at most the limit reach the node.
#[tokio::test]
async fn h2_streams_beyond_the_limit_are_refused_and_reach_no_node() {
    const LIMIT: usize = 4;
    // A node that takes each request and never answers; it reports every head it gets.
    let node = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = node.local_addr().expect("addr");
    let (heads_tx, mut heads) = mpsc::channel(64);
    let _node = tokio::spawn(async move {
        while let Ok((mut s, _)) = node.accept().await {
            let heads_tx = heads_tx.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let mut seen = Vec::new();
                let mut told = false;
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    seen.extend_from_slice(&buf[..n]);
                    if !told && seen.windows(4).any(|w| w == b"\r\n\r\n") {
                        told = true;
                        let _ = heads_tx.send(()).await;
                    }
                }
            });
        }
    });
    let mut cfg = ProxyConfig::new(vec![NodeConfig {
        name: "hold".into(),
        addr,
    }]);
    cfg.limits.h2_max_concurrent_streams = u32::try_from(LIMIT).expect("small");
    // The held requests are cut at shutdown, not waited for.
    cfg.timeouts.drain = Duration::from_millis(200);
    let proxy = Proxy::start(cfg).await;

    let mut s = TcpStream::connect(proxy.addr).await.expect("connect");
    let mut hello = H2_PREFACE.to_vec();
    hello.extend(h2_frame(4, 0, 0, &[]));
    s.write_all(&hello).await.expect("write");
    // The proxy's SETTINGS, acknowledged: its limit is in force.
    let settings = tokio::time::timeout(SOON, async {
        loop {
            let (kind, flags, _, _) = read_h2_frame(&mut s).await.expect("frame");
            if kind == 4 && flags & 1 == 0 {
                return;
            }
        }
    });
    settings.await.expect("the proxy's SETTINGS");
    let mut streams = h2_frame(4, 1, 0, &[]);
    let ids: Vec<u32> = (0..LIMIT as u32 + 2).map(|i| 2 * i + 1).collect();
    for id in &ids {
        // :method GET, :scheme http, :path /, :authority t; END_HEADERS and END_STREAM.
        streams.extend(h2_frame(1, 0x5, *id, &[0x82, 0x86, 0x84, 0x41, 0x01, b't']));
    }
    s.write_all(&streams).await.expect("write");

    let extra = &ids[LIMIT..];
    let mut refused = Vec::new();
    tokio::time::timeout(SOON, async {
        while refused.len() < extra.len() {
            let (kind, _, stream, payload) = read_h2_frame(&mut s).await.expect("frame");
            if kind == 3 {
                assert!(
                    extra.contains(&stream),
                    "stream {stream} reset, within the limit"
                );
                assert_eq!(payload, 7u32.to_be_bytes(), "REFUSED_STREAM");
                refused.push(stream);
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("extra streams {extra:?} not refused; refused {refused:?}"));
    for i in 0..LIMIT {
        tokio::time::timeout(SOON, heads.recv())
            .await
            .unwrap_or_else(|_| panic!("only {i} of {LIMIT} requests reached the node"));
    }
    assert!(
        tokio::time::timeout(Duration::from_millis(300), heads.recv())
            .await
            .is_err(),
        "a request beyond the limit reached the node"
    );
    proxy.stop().await;
}

/// Finding 2: no answer head in time is a 504, over HTTP/2 as over HTTP/1.
#[tokio::test]
async fn answer_head_timeout_is_504_over_http2() {
    let mut node = SilentNode::start(b"").await;
    let mut cfg = node.config();
    cfg.timeouts.upstream_answer = Duration::from_millis(300);
    let proxy = Proxy::start(cfg).await;
    let resp = h2_get(proxy.addr).await;
    assert_eq!(resp.status(), 504);
    assert!(node.connection_closed_within(SOON).await);
    proxy.stop().await;
}

/// An answer body that stops mid-way is cut after `answer_body_idle` (HAProxy's `timeout
/// server`), and the node connection is released.
#[tokio::test]
async fn an_answer_body_that_stops_is_cut_and_the_node_connection_released() {
    let mut node =
        SilentNode::start(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789").await;
    let mut cfg = node.config();
    cfg.timeouts.answer_body_idle = Duration::from_millis(300);
    let proxy = Proxy::start(cfg).await;
    let resp = common::plain_client()
        .get(proxy.url("/"))
        .send()
        .await
        .expect("answer head");
    assert_eq!(resp.status(), 200);
    let body = tokio::time::timeout(SOON, resp.bytes())
        .await
        .expect("the stalled answer ends in time");
    assert!(body.is_err(), "cut short, not completed: {body:?}");
    assert!(node.connection_closed_within(SOON).await);
    proxy.stop().await;
}

/// A node that answers a request head with `head` (a 101, or a 200 with a huge length) and
/// then floods the client with binary WebSocket frames until its socket fails; it reads (and
/// drops) what the client sends. Reports once one write has blocked for a while (the queue
/// towards the client is full) and when a write fails (limpet closed the connection).
struct FloodNode {
    addr: SocketAddr,
    blocked: Option<oneshot::Receiver<()>>,
    failed: Option<oneshot::Receiver<()>>,
    task: tokio::task::JoinHandle<()>,
}

const WS_101: &[u8] = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n";

impl FloodNode {
    async fn start(answer: &'static [u8]) -> FloodNode {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (blocked_tx, blocked) = oneshot::channel();
        let (failed_tx, failed) = oneshot::channel();
        let task = tokio::spawn(async move {
            let Ok((s, _)) = listener.accept().await else {
                return;
            };
            let (mut r, mut w) = s.into_split();
            let mut head = Vec::new();
            let mut b = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                match r.read(&mut b).await {
                    Ok(1) => head.push(b[0]),
                    _ => return,
                }
            }
            let reader = tokio::spawn(async move {
                let mut sink = [0u8; 4096];
                while matches!(r.read(&mut sink).await, Ok(n) if n > 0) {}
            });
            let ok = w.write_all(answer).await;
            if ok.is_err() {
                return;
            }
            let mut frame = vec![0x82, 126, 0x40, 0x00];
            frame.extend(std::iter::repeat_n(0x5a, 0x4000));
            // Told only when a write failed: a flood that ran to its bound was all
            // taken in (buffered without bound), and the receiver sees its sender dropped.
            if common::flood::flood(&mut w, &frame, blocked_tx).await {
                let _ = failed_tx.send(());
            }
            reader.abort();
        });
        FloodNode {
            addr,
            blocked: Some(blocked),
            failed: Some(failed),
            task,
        }
    }
}

impl Drop for FloodNode {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Opens a WebSocket through the proxy on a raw socket and reads the 101 head only.
async fn ws_upgrade(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(b"GET /ws HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
        .await
        .expect("write");
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    tokio::time::timeout(SOON, async {
        while !head.ends_with(b"\r\n\r\n") {
            match s.read(&mut b).await {
                Ok(1) => head.push(b[0]),
                _ => break,
            }
        }
    })
    .await
    .expect("101 in time");
    assert!(head.starts_with(b"HTTP/1.1 101"), "{head:?}");
    s
}

/// Finding 3: a WebSocket client that keeps sending pings but never reads. Its direction
/// stalls (the node's frames cannot be written to it), which `tunnel_idle` detects even
/// though the other direction is busy: the tunnel is closed.
#[tokio::test]
async fn a_websocket_client_that_stops_reading_is_closed_after_tunnel_idle() {
    let mut node = FloodNode::start(WS_101).await;
    let mut cfg = ProxyConfig::new(vec![NodeConfig {
        name: "flood".into(),
        addr: node.addr,
    }]);
    cfg.timeouts.tunnel_idle = Duration::from_millis(500);
    let proxy = Proxy::start(cfg).await;
    let mut client = ws_upgrade(proxy.addr).await;
    let upgraded = Instant::now();
    let failed = node.failed.take().expect("receiver");
    tokio::pin!(failed);
    // Masked, empty pings every 100 ms: the client side is never quiet. Whether the client
    // saw its tunnel end (its writes fail once limpet closed it).
    let pinging = async {
        for _ in 0..200 {
            if client.write_all(&[0x89, 0x80, 0, 0, 0, 0]).await.is_err() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    };
    tokio::select! {
        r = &mut failed => assert!(r.is_ok(), "the node saw its tunnel closed"),
        ended = pinging => {
            assert!(ended, "the tunnel to a client that stopped reading stayed open");
            let r = tokio::time::timeout(SOON, &mut failed).await;
            assert!(matches!(r, Ok(Ok(()))), "the node saw its tunnel closed: {r:?}");
        }
    }
    // Its stall is counted from when its buffers filled, after the upgrade: not sooner than
    // `tunnel_idle` after it (with 150 ms for this task to have seen the 101 late).
    assert!(
        upgraded.elapsed() >= Duration::from_millis(350),
        "closed {:?} after the upgrade, before tunnel_idle (500 ms)",
        upgraded.elapsed()
    );
    // And by `tunnel_idle` with room for a loaded machine, not at the end of the pings.
    assert!(
        upgraded.elapsed() < Duration::from_secs(4),
        "closed {:?} after the upgrade, long past tunnel_idle (500 ms)",
        upgraded.elapsed()
    );
    proxy.stop().await;
}

/// Deliverable 1: a close signal (here: shutdown) interrupts a relay blocked writing to a
/// client that stopped reading.
#[tokio::test]
async fn shutdown_interrupts_a_tunnel_blocked_writing_to_a_client() {
    let mut node = FloodNode::start(WS_101).await;
    let mut cfg = ProxyConfig::new(vec![NodeConfig {
        name: "flood".into(),
        addr: node.addr,
    }]);
    cfg.timeouts.tunnel_idle = Duration::from_secs(600);
    cfg.timeouts.drain = Duration::from_millis(500);
    let proxy = Proxy::start(cfg).await;
    let _client = ws_upgrade(proxy.addr).await;
    let blocked = node.blocked.take().expect("receiver");
    tokio::time::timeout(PATIENCE, blocked)
        .await
        .expect("the queue to the client fills")
        .expect("blocked");
    let failed = node.failed.take().expect("receiver");
    proxy.stop().await;
    assert!(
        matches!(tokio::time::timeout(SOON, failed).await, Ok(Ok(()))),
        "the blocked tunnel was closed by shutdown"
    );
}

/// Finding 5: several Host headers are refused.
#[tokio::test]
async fn several_host_headers_get_400() {
    let ns = nodes(&["a"]).await;
    let proxy = Proxy::start(config(&ns)).await;
    let answer = raw_exchange(
        proxy.addr,
        b"GET /headers HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    proxy.stop().await;
}

/// Finding 5: an absolute-form target naming another host than `Host` is refused; one that
/// agrees is served.
#[tokio::test]
async fn absolute_form_authority_differing_from_host_gets_400() {
    let ns = nodes(&["a"]).await;
    let proxy = Proxy::start(config(&ns)).await;
    let answer = raw_exchange(
        proxy.addr,
        b"GET http://other.example/headers HTTP/1.1\r\nHost: site.example\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    let answer = raw_exchange(
        proxy.addr,
        b"GET http://Site.example/headers HTTP/1.1\r\nHost: site.example\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    proxy.stop().await;
}

/// RFC 9112 3.2: an HTTP/1.1 request without `Host`, or with one that is not a host and
/// port, gets 400 and reaches no node; an HTTP/1.0 request may come without one, and reaches
/// the node (spoken to in HTTP/1.1) with the empty `Host` the RFC prescribes for a target
/// without authority, never with none.
#[tokio::test]
async fn http1_1_without_a_valid_host_gets_400_and_http1_0_without_one_reaches_the_node_with_an_empty_host(
) {
    let ns = nodes(&["a"]).await;
    let proxy = Proxy::start(config(&ns)).await;
    for head in [
        &b"GET /headers HTTP/1.1\r\nConnection: close\r\n\r\n"[..],
        b"GET http://site.example/headers HTTP/1.1\r\nConnection: close\r\n\r\n",
        b"GET /headers HTTP/1.1\r\nHost: user:pw@site.example\r\nConnection: close\r\n\r\n",
        b"GET /headers HTTP/1.1\r\nHost: a b\r\nConnection: close\r\n\r\n",
    ] {
        let answer = raw_exchange(proxy.addr, head).await;
        assert!(
            answer.starts_with("HTTP/1.1 400"),
            "{:?}: {answer}",
            String::from_utf8_lossy(head)
        );
    }
    let answer = raw_exchange(proxy.addr, b"GET /headers HTTP/1.0\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.0 200"), "{answer}");
    let lower = answer.to_ascii_lowercase();
    assert!(
        lower.contains("\nhost: \n"),
        "the node got an empty Host: {answer}"
    );
    assert!(
        !lower.contains("x-forwarded-host"),
        "no X-Forwarded-Host for an empty Host: {answer}"
    );
    // A Host with a port, and an empty one, are valid.
    for head in [
        &b"GET /headers HTTP/1.1\r\nHost: site.example:8080\r\nConnection: close\r\n\r\n"[..],
        b"GET /headers HTTP/1.1\r\nHost:\r\nConnection: close\r\n\r\n",
    ] {
        let answer = raw_exchange(proxy.addr, head).await;
        assert!(
            answer.starts_with("HTTP/1.1 200"),
            "{:?}: {answer}",
            String::from_utf8_lossy(head)
        );
    }
    proxy.stop().await;
}

/// The asterisk form is for OPTIONS only (RFC 9112 3.2.4): `GET *` gets 400 and reaches no
/// node; `OPTIONS *` is forwarded.
#[tokio::test]
async fn the_asterisk_form_is_refused_for_any_method_but_options() {
    let ns = nodes(&["a"]).await;
    let proxy = Proxy::start(config(&ns)).await;
    let answer = raw_exchange(
        proxy.addr,
        b"GET * HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    let answer = raw_exchange(
        proxy.addr,
        b"OPTIONS * HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(
        !answer.starts_with("HTTP/1.1 400"),
        "OPTIONS * is forwarded: {answer}"
    );
    proxy.stop().await;
}

/// RFC 9113 8.3.1: an HTTP/2 `:authority` with user information is malformed: 400, and the
/// connection's other streams go on.
#[tokio::test]
async fn h2_authority_with_user_information_gets_400() {
    let ns = nodes(&["a"]).await;
    let proxy = Proxy::start(config(&ns)).await;
    let mut sender = h2_client(proxy.addr).await;
    let request = |uri: String| {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        drop(tx);
        hyper::Request::get(uri)
            .body(StreamBody::new(tokio_stream_like::Rx(rx)))
            .expect("request")
    };
    let resp = sender
        .send_request(request(format!("http://user:pw@{}/", proxy.addr)))
        .await
        .expect("answer");
    assert_eq!(resp.status(), 400);
    let resp = sender
        .send_request(request(format!("http://{}/", proxy.addr)))
        .await
        .expect("answer");
    assert_eq!(resp.status(), 200);
    proxy.stop().await;
}

/// Finding 5: `Connection: close, Host` does not strip the Host the node needs.
#[tokio::test]
async fn connection_listing_host_never_removes_host() {
    let ns = nodes(&["a"]).await;
    let proxy = Proxy::start(config(&ns)).await;
    let answer = raw_exchange(
        proxy.addr,
        b"GET /headers HTTP/1.1\r\nHost: site.example\r\nConnection: close, Host, X-Secret\r\nX-Secret: 1\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let lower = answer.to_ascii_lowercase();
    assert!(lower.contains("\nhost: site.example"), "{answer}");
    assert!(
        !lower.contains("x-secret"),
        "listed names still go: {answer}"
    );
    proxy.stop().await;
}

/// A proxy with `client_idle` 300 ms to a node whose answer never ends (64 GiB, written as
/// fast as it is taken).
async fn proxy_to_an_endless_answer() -> (FloodNode, Proxy) {
    let node = FloodNode::start(b"HTTP/1.1 200 OK\r\nContent-Length: 68719476736\r\n\r\n").await;
    let mut cfg = ProxyConfig::new(vec![NodeConfig {
        name: "flood".into(),
        addr: node.addr,
    }]);
    cfg.timeouts.client_idle = Duration::from_millis(300);
    (node, Proxy::start(cfg).await)
}

/// The node's connection, whose answer its client stopped reading, is closed by limpet
/// within [`SOON`].
async fn node_connection_released(node: &mut FloodNode) {
    let failed = node.failed.take().expect("receiver");
    assert!(
        matches!(tokio::time::timeout(SOON, failed).await, Ok(Ok(()))),
        "the node connection of an answer its client stopped reading was not released"
    );
}

/// Deliverable 1: a client that stops reading an HTTP answer. hyper's write to it blocks;
/// after `client_idle` the write fails, the connection closes and the node connection behind
/// it is released.
#[tokio::test]
async fn an_http_client_that_stops_reading_an_answer_is_closed_after_client_idle() {
    let (mut node, proxy) = proxy_to_an_endless_answer().await;
    let mut client = TcpStream::connect(proxy.addr).await.expect("connect");
    client
        .write_all(b"GET /big HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .expect("write");
    let mut first = [0u8; 12];
    tokio::time::timeout(SOON, client.read_exact(&mut first))
        .await
        .expect("answer in time")
        .expect("read");
    assert_eq!(&first, b"HTTP/1.1 200");
    // No more reading from here.
    let stopped = Instant::now();
    node_connection_released(&mut node).await;
    // Not sooner than `client_idle` (300 ms) after the write blocked, with 100 ms for this
    // task to have read the head late.
    assert!(
        stopped.elapsed() >= Duration::from_millis(200),
        "released before client_idle (300 ms): {:?}",
        stopped.elapsed()
    );
    // The client connection is closed too: what the buffers held, then its end.
    assert!(
        closed_within(&mut client, SOON).await.is_ok(),
        "the client connection was not closed"
    );
    proxy.stop().await;
}

/// Reads frames until a GOAWAY arrives or the connection closes; `true` if either happened
/// within `limit`.
async fn goaway_or_close_within(s: &mut TcpStream, limit: Duration) -> bool {
    tokio::time::timeout(limit, async {
        loop {
            let mut head = [0u8; 9];
            if s.read_exact(&mut head).await.is_err() {
                return;
            }
            let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
            let mut payload = vec![0u8; len];
            if s.read_exact(&mut payload).await.is_err() || head[3] == 7 {
                return;
            }
        }
    })
    .await
    .is_ok()
}

/// Regression (held before issue 13 too): a CONTINUATION flood, a header block that never
/// ends and grows without bound, is cut off; other clients are served.
#[tokio::test]
async fn h2_continuation_flood_is_cut_off() {
    let ns = nodes(&["a"]).await;
    let proxy = Proxy::start(config(&ns)).await;
    let mut s = TcpStream::connect(proxy.addr).await.expect("connect");
    let mut hello = H2_PREFACE.to_vec();
    hello.extend(h2_frame(4, 0, 0, &[]));
    hello.extend(h2_frame(1, 0, 1, &[0x82, 0x86, 0x84, 0x41, 0x01, b't']));
    s.write_all(&hello).await.expect("write");
    // Literal header fields without indexing, 1 KiB each, never END_HEADERS: 16 MiB at most.
    let mut field = vec![0x00, 0x01, b'x', 0x7f, 0x81, 0x07];
    field.extend(std::iter::repeat_n(b'v', 1024));
    let cont = h2_frame(9, 0, 1, &field);
    let (mut r, mut w) = s.into_split();
    let flood = tokio::spawn(async move {
        for _ in 0..16 * 1024 {
            if w.write_all(&cont).await.is_err() {
                return;
            }
        }
    });
    let mut sink = Vec::new();
    let ended = tokio::time::timeout(SOON, r.read_to_end(&mut sink)).await;
    assert!(ended.is_ok(), "the flooding connection is closed");
    flood.abort();
    assert!(
        served_within(proxy.addr, PATIENCE).await,
        "others are served"
    );
    proxy.stop().await;
}

/// Regression (held before issue 13 too): HTTP/2 rapid reset (streams opened and reset at
/// once, CVE-2023-44487) ends in a GOAWAY or a closed connection; others are served.
#[tokio::test]
async fn h2_rapid_reset_ends_the_connection() {
    let ns = nodes(&["a"]).await;
    let proxy = Proxy::start(config(&ns)).await;
    let mut s = TcpStream::connect(proxy.addr).await.expect("connect");
    let mut out = H2_PREFACE.to_vec();
    out.extend(h2_frame(4, 0, 0, &[]));
    // 1000 streams: HEADERS (END_STREAM | END_HEADERS), then RST_STREAM CANCEL.
    for i in 0..1000u32 {
        let id = 2 * i + 1;
        out.extend(h2_frame(1, 0x5, id, &[0x82, 0x86, 0x84, 0x41, 0x01, b't']));
        out.extend(h2_frame(3, 0, id, &8u32.to_be_bytes()));
    }
    let _ = s.write_all(&out).await;
    assert!(
        goaway_or_close_within(&mut s, SOON).await,
        "a rapid reset gets GOAWAY or a close"
    );
    assert!(
        served_within(proxy.addr, PATIENCE).await,
        "others are served"
    );
    proxy.stop().await;
}

/// HTTP/2 rapid reset spread over many reads: rounds of 100 streams opened, each request at
/// the node, then all 100 reset. Each reset costs a node connection (cut mid-exchange), so a
/// connection that does this is closed once it has reset 200 streams in flight: the node
/// sees about 200 connections, not the 2,000 of 20 rounds. (Before, h2's own limit, on
/// resets of streams not yet accepted, never saw these: the 20 rounds went through, and a
/// few clients could run the machine out of ports.)
#[tokio::test]
async fn h2_rapid_reset_spread_over_many_reads_ends_the_connection() {
    rapid_reset_rounds(false, false).await;
}

/// The same rapid reset padded with as many requests limpet answers itself (a 414 for a
/// target over 8 KiB, which keeps the connection open) before each round's resets: they
/// cost no node connection, and the share of resets is counted against the requests that
/// reached a node. Before, they halved the share, and the 20 rounds went through: 2,000
/// node connections.
#[tokio::test]
async fn h2_rapid_reset_padded_with_local_answers_ends_the_connection() {
    rapid_reset_rounds(false, true).await;
}

/// The same rapid reset from a client that first sat idle until limpet closed its
/// connection gracefully (GOAWAY, and a PING the client never acks: h2 takes new streams
/// until it does), then ignores the GOAWAY: the limit on resets holds after the GOAWAY too,
/// and the connection is closed. Before, the graceful close watched only for a quiet second,
/// which the rounds never left: they went on for as long as the client liked, each reset a
/// node connection.
#[tokio::test]
async fn h2_rapid_reset_after_an_idle_goaway_ends_the_connection() {
    rapid_reset_rounds(true, false).await;
}

/// An HTTP/2 connection (prior knowledge, its SETTINGS sent) left idle until limpet sends
/// its GOAWAY (`header_read` idle), which the client then ignores, as it does the PING that
/// comes with it.
async fn h2_idle_until_goaway(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let mut out = H2_PREFACE.to_vec();
    out.extend(h2_frame(4, 0, 0, &[]));
    s.write_all(&out).await.expect("preface");
    assert!(
        tokio::time::timeout(PATIENCE, async {
            while let Some((kind, ..)) = read_h2_frame(&mut s).await {
                if kind == 7 {
                    return true;
                }
            }
            false
        })
        .await
        .expect("a GOAWAY in time"),
        "closed before its GOAWAY"
    );
    s
}

/// A client that ignores the GOAWAY of an idle connection, its PING unacked, keeps a request
/// in flight on it (at a node that never answers, its answer timeout a minute) and trickles
/// another stream's head that never ends: the head timeout holds after the GOAWAY too, and
/// the connection is closed within `header_read` (1 s) and slack, not at the answer timeout.
#[tokio::test]
async fn h2_a_head_trickled_after_an_idle_goaway_is_closed_at_header_read() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let node = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = listener.accept().await {
            held.push(s);
        }
    });
    let mut cfg = ProxyConfig::new(vec![NodeConfig {
        name: "n".into(),
        addr,
    }]);
    cfg.timeouts.header_read = Duration::from_secs(1);
    cfg.timeouts.upstream_answer = Duration::from_secs(60);
    let proxy = Proxy::start(cfg).await;
    let mut s = h2_idle_until_goaway(proxy.addr).await;
    // Stream 1 in flight at the node; stream 3's head begun, then a byte every 50 ms.
    let mut opening = h2_frame(1, 0x5, 1, &[0x82, 0x86, 0x84, 0x41, 0x01, b't']);
    opening.extend(h2_endless_head(3));
    s.write_all(&opening).await.expect("write");
    let (mut rd, mut wr) = s.into_split();
    let trickle = tokio::spawn(async move {
        for _ in 0..400 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            if wr.write_all(b"a").await.is_err() {
                break;
            }
        }
    });
    let took = closed_within(&mut rd, SOON)
        .await
        .unwrap_or_else(|()| panic!("still open {SOON:?} after the head began trickling"));
    assert!(
        took < Duration::from_millis(1000 + 1500),
        "closed {took:?} after the head began trickling (header_read 1 s)"
    );
    trickle.abort();
    node.abort();
    proxy.stop().await;
}

/// The failure model's shutdown bound holds for a connection that was already closing: a
/// client that ignores an idle connection's GOAWAY (and its PING) and sends a request on it
/// at a node that never answers (answer timeout a minute) is closed within `drain` (300 ms)
/// and slack of the stop, as any connection is. Before, the idle close waited for that
/// answer, past the drain's end (the listener's drain gives up waiting, it does not cut),
/// and a process with one worker thread served it until its runtime ended.
#[tokio::test]
async fn h2_a_connection_closing_for_idleness_is_cut_at_the_drain_like_any_other() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (took_tx, took) = oneshot::channel();
    let node = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.expect("accept");
        let head = common::read_request_head(&mut s).await;
        let _ = took_tx.send(head.is_some());
        let mut sink = [0u8; 64];
        while matches!(s.read(&mut sink).await, Ok(n) if n > 0) {}
    });
    let mut cfg = ProxyConfig::new(vec![NodeConfig {
        name: "n".into(),
        addr,
    }]);
    cfg.timeouts.header_read = Duration::from_secs(1);
    cfg.timeouts.upstream_answer = Duration::from_secs(60);
    cfg.timeouts.drain = Duration::from_millis(300);
    let proxy = Proxy::start(cfg).await;
    let mut s = h2_idle_until_goaway(proxy.addr).await;
    // A GET after the GOAWAY, which h2 takes until its PING is acked; at the node for sure.
    s.write_all(&h2_frame(1, 0x5, 1, &[0x82, 0x86, 0x84, 0x41, 0x01, b't']))
        .await
        .expect("write");
    assert!(
        tokio::time::timeout(PATIENCE, took)
            .await
            .expect("the node took the request in time")
            .expect("the node"),
        "the node got the request"
    );
    let (mut rd, _wr) = s.into_split();
    let stopped = Instant::now();
    proxy.stop().await;
    closed_within(&mut rd, SOON)
        .await
        .unwrap_or_else(|()| panic!("still open {SOON:?} after the stop (drain 300 ms)"));
    let took = stopped.elapsed();
    assert!(
        took < Duration::from_millis(300 + 1500),
        "closed {took:?} after the stop (drain 300 ms)"
    );
    node.abort();
}

/// [`h2_rapid_reset_spread_over_many_reads_ends_the_connection`]; with `after_idle_goaway`,
/// the rounds begin once the connection, idle for `header_read` (1 s), was sent its GOAWAY,
/// which the client ignores (and the PING that comes with it), and the end awaited is the
/// connection's close. With `padded`, each round first sends as many streams limpet answers
/// itself (414).
async fn rapid_reset_rounds(after_idle_goaway: bool, padded: bool) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    const ROUNDS: u32 = 20;
    const STREAMS: u32 = 100;
    // The node: takes each connection and its request, and never answers.
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let accepted = Arc::new(AtomicUsize::new(0));
    let node = tokio::spawn({
        let accepted = Arc::clone(&accepted);
        async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = listener.accept().await {
                accepted.fetch_add(1, Ordering::Relaxed);
                held.push(s);
            }
        }
    });
    let mut cfg = ProxyConfig::new(vec![NodeConfig {
        name: "n".into(),
        addr,
    }]);
    cfg.timeouts.header_read = Duration::from_secs(1);
    let proxy = Proxy::start(cfg).await;
    let s = TcpStream::connect(proxy.addr).await.expect("connect");
    let (mut r, mut w) = s.into_split();
    // Its reader: told when a GOAWAY (the first one passed on `goaway`, with
    // `after_idle_goaway`) or the end of the connection comes.
    let (ended_tx, mut ended) = tokio::sync::watch::channel(false);
    let (goaway_tx, goaway) = tokio::sync::oneshot::channel();
    // Answer heads read (the padding's 414s).
    let answers = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&answers);
    let reader = tokio::spawn(async move {
        let mut goaway_tx = after_idle_goaway.then_some(goaway_tx);
        loop {
            let mut head = [0u8; 9];
            if r.read_exact(&mut head).await.is_err() {
                break;
            }
            let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
            let mut payload = vec![0u8; len];
            if r.read_exact(&mut payload).await.is_err() {
                break;
            }
            if head[3] == 1 {
                counted.fetch_add(1, Ordering::Relaxed);
            }
            if head[3] == 7 {
                match goaway_tx.take() {
                    Some(tx) => {
                        let _ = tx.send(());
                    }
                    None if after_idle_goaway => {}
                    None => break,
                }
            }
        }
        let _ = ended_tx.send(true);
    });
    let mut out = H2_PREFACE.to_vec();
    out.extend(h2_frame(4, 0, 0, &[]));
    w.write_all(&out).await.expect("preface");
    if after_idle_goaway {
        tokio::time::timeout(PATIENCE, goaway)
            .await
            .expect("a GOAWAY once idle for header_read")
            .expect("reader");
    }
    let mut rounds = 0;
    for round in 0..ROUNDS {
        if *ended.borrow() {
            break;
        }
        let first = 4 * round * STREAMS + 1;
        // Stream ids only grow: the padding's first.
        let ids = (0..STREAMS).map(|i| first + 2 * STREAMS + 2 * i);
        // A 9,000-byte `:path`, answered 414 by limpet, on the round's other ids, first:
        // `:path` as a literal (name index 4), its length in HPACK's 7-bit prefix integer.
        let pads = (0..STREAMS).map(|i| first + 2 * i);
        let mut long_path = vec![0x82, 0x86, 0x04, 0x7f];
        let mut rest = 9_000 - 127;
        while rest >= 128 {
            long_path.push(u8::try_from(rest % 128).unwrap_or(0) | 0x80);
            rest /= 128;
        }
        long_path.push(u8::try_from(rest).unwrap_or(0));
        long_path.push(b'/');
        long_path.extend(std::iter::repeat_n(b'a', 8_999));
        long_path.extend([0x41, 0x01, b't']);
        let mut heads: Vec<u8> = Vec::new();
        if padded {
            let pads: Vec<u8> = pads
                .flat_map(|id| h2_frame(1, 0x5, id, &long_path))
                .collect();
            if w.write_all(&pads).await.is_err() {
                break;
            }
            // Answered, so that the round's requests find room among the 100 streams.
            let want = (round as usize + 1) * STREAMS as usize;
            let answered = tokio::time::timeout(PATIENCE, async {
                while answers.load(Ordering::Relaxed) < want && !*ended.borrow() {
                    tokio::select! {
                        _ = ended.changed() => {}
                        () = tokio::time::sleep(Duration::from_millis(5)) => {}
                    }
                }
            })
            .await;
            assert!(answered.is_ok(), "round {round}: the padding unanswered");
        }
        heads.extend(
            ids.clone()
                .flat_map(|id| h2_frame(1, 0x5, id, &[0x82, 0x86, 0x84, 0x41, 0x01, b't'])),
        );
        if w.write_all(&heads).await.is_err() {
            break;
        }
        // Each request at the node (or the connection closed meanwhile).
        let at_node = (round as usize + 1) * STREAMS as usize;
        let waited = tokio::time::timeout(PATIENCE, async {
            while accepted.load(Ordering::Relaxed) < at_node && !*ended.borrow() {
                tokio::select! {
                    _ = ended.changed() => {}
                    () = tokio::time::sleep(Duration::from_millis(5)) => {}
                }
            }
        })
        .await;
        assert!(
            waited.is_ok(),
            "round {round}: the requests never reached the node"
        );
        let resets: Vec<u8> = ids
            .flat_map(|id| h2_frame(3, 0, id, &8u32.to_be_bytes()))
            .collect();
        if w.write_all(&resets).await.is_err() {
            break;
        }
        rounds += 1;
    }
    assert!(
        tokio::time::timeout(SOON, ended.wait_for(|e| *e))
            .await
            .is_ok(),
        "the connection is closed after {rounds} rounds"
    );
    let seen = accepted.load(Ordering::Relaxed);
    assert!(
        seen <= 300,
        "{seen} node connections for one client connection ({rounds} rounds)"
    );
    // Closed by the limit on resets (200), not before it by another rule (an idle close).
    assert!(
        rounds >= 2,
        "closed after {rounds} rounds, before the limit on resets"
    );
    reader.abort();
    node.abort();
    proxy.stop().await;
}

/// A long-lived HTTP/2 connection that cancels some of its requests (a page that aborts
/// fetches as the user types) is not taken for a rapid reset: 1,000 requests answered, then
/// 250 cancelled in flight (more than the 200 a rapid reset is closed at, but a fifth of
/// what it asked), and the connection still answers.
#[tokio::test]
async fn an_h2_connection_that_cancels_a_few_of_many_requests_stays_open() {
    let ns = nodes(&["a"]).await;
    let proxy = Proxy::start(config(&ns)).await;
    let (mut send, conn) = common::h2_client(&proxy.addr.to_string()).await;
    let get = |path: &str| {
        http::Request::builder()
            .uri(format!("http://{}{path}", proxy.addr))
            .body(http_body_util::Empty::<Bytes>::new())
            .expect("request")
    };
    for _ in 0..1_000 {
        let resp = tokio::time::timeout(PATIENCE, send.send_request(get("/")))
            .await
            .expect("answered in time")
            .expect("answer");
        assert_eq!(resp.status(), 200);
    }
    for _ in 0..250 {
        // Sent, and dropped before its answer: the stream is reset.
        let pending = send.send_request(get("/slow?ms=10000"));
        let _ = tokio::time::timeout(Duration::from_millis(2), pending).await;
    }
    let resp = tokio::time::timeout(PATIENCE, send.send_request(get("/")))
        .await
        .expect("answered in time")
        .expect("the connection still answers");
    assert_eq!(resp.status(), 200);
    conn.abort();
    proxy.stop().await;
}

/// An upload to a node that stopped reading (a frozen process: its kernel accepted the
/// connection, then its socket buffers filled) is bounded: the write to the node that cannot
/// proceed for `upstream_answer` fails, the client gets 504 (or its upload is cut), and the
/// node connection is closed. Before, the answer clock only started once the body was sent,
/// so nothing bounded this wait.
#[tokio::test]
async fn an_upload_to_a_node_that_stopped_reading_is_bounded() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    // The frozen node: accepts, holds the socket, never reads.
    let (held_tx, mut held) = mpsc::channel::<TcpStream>(4);
    let frozen = tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            if held_tx.send(s).await.is_err() {
                return;
            }
        }
    });
    let mut cfg = ProxyConfig::new(vec![NodeConfig {
        name: "frozen".into(),
        addr,
    }]);
    cfg.timeouts.upstream_answer = Duration::from_millis(500);
    let proxy = Proxy::start(cfg).await;
    // More than the sockets on the way can buffer.
    let body = vec![b'x'; 64 << 20];
    let r = tokio::time::timeout(
        SOON,
        common::plain_client()
            .post(format!("http://{}/upload", proxy.addr))
            .body(body)
            .send(),
    )
    .await
    .expect("the upload is answered or cut in time, not held");
    if let Ok(resp) = r {
        assert_eq!(resp.status(), 504, "a node that does not read is a timeout");
    }
    // limpet closed its side of the node connection: reading it to the end finishes.
    let mut s = tokio::time::timeout(SOON, held.recv())
        .await
        .expect("the node got a connection")
        .expect("a connection");
    assert!(
        closed_within(&mut s, SOON).await.is_ok(),
        "the node connection was not closed"
    );
    proxy.stop().await;
    frozen.abort();
}

/// The HTTP/2 preface and SETTINGS with INITIAL_WINDOW_SIZE (0x4) 0: answers get no DATA.
fn h2_hello_with_its_window_shut() -> Vec<u8> {
    let mut hello = H2_PREFACE.to_vec();
    hello.extend(h2_frame(0x4, 0, 0, &[0, 4, 0, 0, 0, 0]));
    hello
}

/// With an answer stalled since `started` by a shut window and `client_idle` 500 ms: the
/// client connection `s` is closed, not before `client_idle`, and the node connection
/// released.
async fn stalled_answer_closed_after_client_idle(
    s: &mut TcpStream,
    started: Instant,
    node: &mut SilentNode,
) {
    let closed = closed_within(s, SOON).await;
    assert!(
        closed.is_ok(),
        "the connection holding a stalled answer was not closed within {SOON:?}"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "closed before client_idle: {:?}",
        started.elapsed()
    );
    assert!(
        node.connection_closed_within(SOON).await,
        "the node connection was not released"
    );
}

/// The same stall on a stream opened after limpet closed the connection for idling: h2 takes
/// new streams until the client acks the GOAWAY's PING, so a client that never does can open
/// one in the close's grace, with its window shut. Its answer is bounded as on an open
/// connection: closed after `client_idle` and the node connection released (it used to be
/// held for good: the close waited for the connection to be quiet, which it never was).
#[tokio::test]
async fn an_h2_stream_opened_after_the_idle_goaway_with_its_window_shut_is_closed_after_client_idle(
) {
    static ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\nsome of the body";
    let mut node = SilentNode::start(ANSWER).await;
    let mut cfg = node.config();
    // Idle before a first request: closed after header_read, with as long a grace (at most
    // 1 s) for the stream below to come in.
    cfg.timeouts.header_read = Duration::from_secs(1);
    cfg.timeouts.client_idle = Duration::from_millis(500);
    let proxy = Proxy::start(cfg).await;
    let mut s = TcpStream::connect(proxy.addr).await.expect("connect");
    s.write_all(&h2_hello_with_its_window_shut())
        .await
        .expect("write");
    until_h2_frame(
        &mut s,
        0x7,
        "open until the GOAWAY",
        "a GOAWAY after header_read",
    )
    .await;
    // In the grace, without acking the PING: GET http://t/ (static-table HPACK).
    s.write_all(&h2_frame(
        0x1,
        0x5,
        1,
        &[0x82, 0x86, 0x84, 0x41, 0x01, b't'],
    ))
    .await
    .expect("write");
    let started = Instant::now();
    until_h2_frame(
        &mut s,
        0x1,
        "open until stream 1's head",
        "stream 1 is answered (its head: DATA waits for the window)",
    )
    .await;
    stalled_answer_closed_after_client_idle(&mut s, started, &mut node).await;
    proxy.stop().await;
}

/// An HTTP/2 client that opens its flow-control windows wide and then stops reading the
/// socket: the answer's DATA may go, but the socket's buffers fill and limpet's write
/// blocks. After `client_idle` (not before) the answer is cut and its node connection
/// released (the window-shut case above is the other way an HTTP/2 client stops reading).
#[tokio::test]
async fn an_h2_client_that_stops_reading_its_socket_has_its_answer_cut_after_client_idle() {
    let (mut node, proxy) = proxy_to_an_endless_answer().await;
    let mut s = TcpStream::connect(proxy.addr).await.expect("connect");
    let mut hello = H2_PREFACE.to_vec();
    // SETTINGS_INITIAL_WINDOW_SIZE (0x4) at its largest, and the connection's window too.
    hello.extend(h2_frame(0x4, 0, 0, &[0, 4, 0x7f, 0xff, 0xff, 0xff]));
    hello.extend(h2_frame(0x8, 0, 0, &0x7fff_0000u32.to_be_bytes()));
    // HEADERS, END_STREAM | END_HEADERS: GET http://t/ (static-table HPACK).
    hello.extend(h2_frame(0x1, 0x5, 1, &[0x82, 0x86, 0x84, 0x41, 0x01, b't']));
    s.write_all(&hello).await.expect("write");
    until_h2_frame(
        &mut s,
        0x1,
        "open until stream 1's head",
        "stream 1 is answered",
    )
    .await;
    // No more reading from here.
    let stopped = Instant::now();
    node_connection_released(&mut node).await;
    assert!(
        stopped.elapsed() >= Duration::from_millis(250),
        "released before client_idle: {:?}",
        stopped.elapsed()
    );
    proxy.stop().await;
}

/// An HTTP/2 client that never opens a stream's flow-control window
/// (SETTINGS_INITIAL_WINDOW_SIZE 0) asks for an answer with a body: hyper never polls the
/// answer body, so none of its idle clocks run, while the answer holds its node connection.
/// After `client_idle` (not before) that stream is reset (`RST_STREAM`, `CANCEL`) and the
/// node connection released; the client connection stays open (a PING is answered). Before,
/// the whole connection was closed.
#[tokio::test]
async fn an_h2_stream_whose_window_never_opens_is_reset_after_client_idle() {
    static ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\nsome of the body";
    let mut node = SilentNode::start(ANSWER).await;
    let mut cfg = node.config();
    cfg.timeouts.client_idle = Duration::from_millis(500);
    let proxy = Proxy::start(cfg).await;
    let mut s = TcpStream::connect(proxy.addr).await.expect("connect");
    let mut hello = h2_hello_with_its_window_shut();
    // HEADERS, END_STREAM | END_HEADERS: GET http://t/ (static-table HPACK).
    hello.extend(h2_frame(0x1, 0x5, 1, &[0x82, 0x86, 0x84, 0x41, 0x01, b't']));
    s.write_all(&hello).await.expect("write");
    let started = Instant::now();
    let code = until_reset(&mut s, 1).await;
    assert_eq!(code, 0x8, "reset with CANCEL");
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "reset before client_idle: {:?}",
        started.elapsed()
    );
    assert!(
        node.connection_closed_within(SOON).await,
        "the node connection was not released"
    );
    // PING; its ACK says the connection goes on.
    s.write_all(&h2_frame(0x6, 0, 0, b"stillup!"))
        .await
        .expect("write");
    let acked = tokio::time::timeout(SOON, async {
        while let Some((kind, flags, _, payload)) = read_h2_frame(&mut s).await {
            if kind == 0x6 && flags & 0x1 != 0 {
                return payload;
            }
        }
        panic!("the connection closed after its stream was reset");
    })
    .await
    .expect("the PING is answered");
    assert_eq!(acked, b"stillup!");
    drop(s);
    proxy.stop().await;
}

/// Reads frames until stream `id` is reset; its error code.
async fn until_reset(s: &mut TcpStream, id: u32) -> u32 {
    tokio::time::timeout(SOON, async {
        loop {
            let (kind, _, stream, payload) = read_h2_frame(s)
                .await
                .unwrap_or_else(|| panic!("closed before stream {id} was reset"));
            if kind == 0x3 && stream == id {
                let code: [u8; 4] = payload
                    .get(..4)
                    .and_then(|c| c.try_into().ok())
                    .unwrap_or_else(|| panic!("a short RST_STREAM"));
                return u32::from_be_bytes(code);
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("stream {id} was not reset within {SOON:?}"))
}

/// One HTTP/2 stream the client leaves stalled (its window never opened) costs that stream
/// alone: streams opened before its reset, while it stalls, and after it are answered whole
/// on the same connection, and the stalled one is reset after `client_idle`. HAProxy's
/// `timeout client` and nginx's `send_timeout` apply per stream the same way. Before, the
/// stall closed the connection, and every stream in flight on it with it.
#[tokio::test]
async fn a_stalled_h2_stream_is_reset_alone_and_its_connection_s_other_streams_go_on() {
    let ns = nodes(&["a"]).await;
    let mut cfg = config(&ns);
    cfg.timeouts.client_idle = Duration::from_millis(400);
    let proxy = Proxy::start(cfg).await;
    let mut s = TcpStream::connect(proxy.addr).await.expect("connect");
    let get = |id: u32| h2_frame(0x1, 0x5, id, &[0x82, 0x86, 0x84, 0x41, 0x01, b't']);
    // Stream 1 stalls: its window is never opened.
    let mut hello = h2_hello_with_its_window_shut();
    hello.extend(get(1));
    s.write_all(&hello).await.expect("write");
    let started = Instant::now();
    // When stream 1 was reset, and the stream in flight then.
    let mut reset: Option<(Duration, u32)> = None;
    // Streams 3, 5, ...: each opened with its window, one after the other, for three
    // `client_idle`s; each must end whole.
    let mut id = 3;
    // Until three `client_idle`s have passed, the reset came, and two streams after it.
    while started.elapsed() < Duration::from_millis(1200)
        || reset.is_none_or(|(_, during)| id <= during + 4)
    {
        assert!(
            started.elapsed() < SOON,
            "stream 1 was not reset within {SOON:?}"
        );
        let mut ask = get(id);
        ask.extend(h2_frame(0x8, 0, id, &65_535u32.to_be_bytes()));
        ask.extend(h2_frame(0x8, 0, 0, &65_535u32.to_be_bytes()));
        s.write_all(&ask).await.expect("write");
        tokio::time::timeout(SOON, async {
            loop {
                let (kind, flags, stream, payload) = read_h2_frame(&mut s)
                    .await
                    .unwrap_or_else(|| panic!("the connection closed before stream {id} ended (stream 1 reset: {reset:?})"));
                if kind == 0x3 && stream == id {
                    panic!("stream {id} was reset");
                }
                if kind == 0x3 && stream == 1 {
                    assert_eq!(payload.get(..4), Some(&[0, 0, 0, 0x8][..]), "CANCEL");
                    reset.get_or_insert((started.elapsed(), id));
                }
                if stream == id && (kind == 0 || kind == 1) && flags & 0x1 != 0 {
                    return;
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("stream {id} not answered in time"));
        id += 2;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (at, during) = reset.unwrap_or_default();
    // `client_idle` is 400 ms, looked at every 100 ms: reset by about 500 ms (2 s of slack).
    assert!(
        at >= Duration::from_millis(350) && at < Duration::from_secs(2),
        "stream 1 reset at {at:?}, not at client_idle"
    );
    assert!(
        during > 3,
        "streams were answered before the reset (it came during {during})"
    );
    assert!(
        id > during + 4,
        "streams opened after the reset were answered (the reset during {during}, the last {})",
        id - 2
    );
    drop(s);
    proxy.stop().await;
}

/// An HTTP/2 connection with no request in flight whose client never answers the shutdown's
/// GOAWAY and PING (a frozen process, a vanished phone) is dropped once quiet for the close
/// grace, as at an idle close: the stop takes about a second, not the whole `drain` (30 s
/// here). Before, it held every shutdown and every upgrade's old limpet for `drain`, and
/// the snapshot save waited behind it. A stream in flight still gets `drain`
/// (`proxy_limits.rs` `shutdown_drains_http2_streams_in_flight`).
#[tokio::test]
async fn an_idle_http2_client_that_never_answers_the_goaway_does_not_hold_the_drain() {
    let ns = nodes(&["a"]).await;
    let mut cfg = config(&ns);
    cfg.timeouts.drain = Duration::from_secs(30);
    let proxy = Proxy::start(cfg).await;
    let mut s = TcpStream::connect(proxy.addr).await.expect("connect");
    let mut hello = H2_PREFACE.to_vec();
    hello.extend(h2_frame(4, 0, 0, &[]));
    hello.extend(h2_frame(1, 0x5, 1, &[0x82, 0x86, 0x84, 0x41, 0x01, b't']));
    s.write_all(&hello).await.expect("write");
    read_h2_answer(&mut s, 1).await;
    // From here on the client reads nothing and answers nothing.
    let stopping = Instant::now();
    tokio::time::timeout(SOON, proxy.stop())
        .await
        .expect("the stop waited out the drain for an idle connection");
    let took = stopping.elapsed();
    assert!(
        took >= Duration::from_millis(900),
        "stopped {took:?} after asking: the close grace (1 s) lets a request that crossed the GOAWAY come"
    );
    drop(s);
}

/// An HTTP/2 `:path` that is not in origin form (`?a=1`, a path without its `/`) is that
/// stream's 400 from limpet and reaches no node, whose request line it could not be; the
/// connection serves its next streams, and `/?a=1` reaches the node as written. Before,
/// `?a=1` reached the node as the request line `GET ?a=1 HTTP/1.1`.
#[tokio::test]
async fn an_h2_path_not_in_origin_form_is_a_400() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let node = listener.local_addr().expect("addr");
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let lines_tx = lines_tx.clone();
            tokio::spawn(async move {
                while let Some(head) = common::read_request_head(&mut s).await {
                    let line = head.lines().next().unwrap_or_default().to_owned();
                    let _ = lines_tx.send(line);
                    let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                    if s.write_all(answer).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    let proxy = Proxy::start(ProxyConfig::new(vec![NodeConfig {
        name: "n".into(),
        addr: node,
    }]))
    .await;
    let mut sender = h2_taking_any_head(proxy.addr).await;
    let mut status_of = async |target: &str| h2_status(&mut sender, proxy.addr, target).await;
    assert_eq!(status_of("?a=1").await, 400, "a query without its path");
    assert_eq!(
        status_of("/?a=1").await,
        200,
        "the next stream, in origin form"
    );
    assert_eq!(
        lines.try_recv().ok().as_deref(),
        Some("GET /?a=1 HTTP/1.1"),
        "the node's first request line is the second stream's"
    );
    proxy.stop().await;
    task.abort();
}

/// h2c smuggling: an upgrade that offers `h2c` beside `websocket`, on two `Upgrade` lines,
/// is sent to the node as an offer of `websocket` alone, without the `h2c` offer's
/// `HTTP2-Settings` (before: `upgrade: h2c` alone reached it); and a node that switches to
/// `h2c` all the same is refused with a 502, no tunnel opened (before: a 101 and a raw
/// HTTP/2 tunnel to the node, its requests past every rule limpet applies).
#[tokio::test]
async fn an_h2c_offer_beside_a_websocket_reaches_no_node_and_no_tunnel_to_it_opens() {
    let node = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = node.local_addr().expect("addr");
    let (head_tx, head_rx) = oneshot::channel();
    let task = tokio::spawn(async move {
        let (mut s, _) = node.accept().await.expect("accept");
        let head = common::read_request_head(&mut s).await.unwrap_or_default();
        let _ = head_tx.send(head);
        let _ = s
            .write_all(
                b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n",
            )
            .await;
        // Held open: a tunnel would reach it.
        let mut sink = [0u8; 64];
        while matches!(s.read(&mut sink).await, Ok(n) if n > 0) {}
    });
    let proxy = Proxy::start(ProxyConfig::new(vec![NodeConfig {
        name: "n".into(),
        addr,
    }]))
    .await;
    let answer = raw_exchange(
        proxy.addr,
        b"GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n\
          Upgrade: websocket\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
          Sec-WebSocket-Version: 13\r\n\r\nPRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    )
    .await;
    let head = tokio::time::timeout(SOON, head_rx)
        .await
        .expect("the node got the request")
        .expect("its head")
        .to_ascii_lowercase();
    assert!(head.contains("\r\nupgrade: websocket\r\n"), "{head}");
    assert!(!head.contains("h2c"), "{head}");
    assert!(!head.contains("http2-settings"), "{head}");
    assert!(answer.starts_with("HTTP/1.1 502"), "{answer}");
    task.abort();
    proxy.stop().await;
}

/// Request targets that RFC 9112 3.2 and HAProxy and nginx refuse: the authority form on a
/// method other than CONNECT (before: sent on as `GET /`), and an absolute form with user
/// information (before: on HTTP/1.0 without `Host`, its authority became the node's `Host`
/// and `X-Forwarded-Host`, credentials included). Both are a 400 that reaches no node. And
/// `chunked` applied twice (RFC 9112 7: a sender must not), a 400 as HAProxy answers.
#[tokio::test]
async fn request_targets_and_codings_no_peer_may_send_are_a_400() {
    let ns = nodes(&["a"]).await;
    let proxy = Proxy::start(config(&ns)).await;
    for req in [
        &b"GET a.example:80 HTTP/1.1\r\nHost: a.example:80\r\nConnection: close\r\n\r\n"[..],
        b"GET http://user:pw@a.example/ HTTP/1.0\r\n\r\n",
        b"GET http://user:pw@a.example/ HTTP/1.1\r\nHost: a.example\r\nConnection: close\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, chunked\r\n\
          Connection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\
          Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    ] {
        let answer = raw_exchange(proxy.addr, req).await;
        // hyper answers in the request's version.
        assert!(
            answer.starts_with("HTTP/1.") && answer.get(8..13) == Some(" 400 "),
            "{}: {answer}",
            String::from_utf8_lossy(req)
        );
    }
    // What stays served: an absolute form without user information, on HTTP/1.0 too.
    for req in [
        &b"GET http://a.example/ HTTP/1.0\r\n\r\n"[..],
        b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n\
          5\r\nhello\r\n0\r\n\r\n",
    ] {
        let answer = raw_exchange(proxy.addr, req).await;
        assert!(
            answer.starts_with("HTTP/1.1 200") || answer.starts_with("HTTP/1.0 200"),
            "{}: {answer}",
            String::from_utf8_lossy(req)
        );
    }
    proxy.stop().await;
}

/// A client that floods its HTTP/2 connection with one-byte DATA frames (each held by h2 in
/// a slot of a few hundred bytes until the body is read: a connection's 8 MiB window would
/// hold about 2 GiB) has its connection ended with GOAWAY `ENHANCE_YOUR_CALM`, by h2's own
/// budget of small DATA frames (h2 0.4.20; an audit took the flood for limpet's to stop,
/// and this holds the dependency to it); other clients are served.
#[tokio::test]
async fn h2_a_flood_of_one_byte_data_frames_ends_the_connection() {
    let ns = nodes(&["a"]).await;
    let proxy = Proxy::start(config(&ns)).await;
    let mut s = TcpStream::connect(proxy.addr).await.expect("connect");
    let mut out = H2_PREFACE.to_vec();
    out.extend(h2_frame(4, 0, 0, &[]));
    // POST /upload, its body to come.
    out.extend(h2_frame(
        1,
        0x4,
        1,
        &[
            0x83, 0x86, 0x44, 0x07, b'/', b'u', b'p', b'l', b'o', b'a', b'd', 0x41, 0x01, b't',
        ],
    ));
    s.write_all(&out).await.expect("write");
    // limpet's SETTINGS acked: its stream window (256 KiB) holds the flood's bytes.
    tokio::time::timeout(PATIENCE, async {
        while let Some((kind, flags, ..)) = read_h2_frame(&mut s).await {
            if kind == 4 && flags & 1 == 0 {
                return;
            }
        }
        panic!("closed before its SETTINGS");
    })
    .await
    .expect("SETTINGS in time");
    s.write_all(&h2_frame(4, 1, 0, &[])).await.expect("ack");
    let (mut rd, mut wr) = s.into_split();
    let one = h2_frame(0, 0, 1, b"x");
    let chunk = one.repeat(10_000);
    // Bounded: 25 chunks of 10,000 frames, 250,000 in all (within the stream's window).
    let flood = tokio::spawn(async move {
        for _ in 0..25 {
            if wr.write_all(&chunk).await.is_err() {
                return;
            }
        }
    });
    let code = tokio::time::timeout(SOON, async {
        while let Some((kind, _, _, payload)) = read_h2_frame(&mut rd).await {
            if kind == 7 {
                return payload
                    .get(4..8)
                    .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]));
            }
        }
        None
    })
    .await
    .unwrap_or_else(|_| panic!("no GOAWAY {SOON:?} into the flood"));
    assert_eq!(code, Some(11), "GOAWAY ENHANCE_YOUR_CALM");
    let _ = flood.await;
    assert!(served_within(proxy.addr, SOON).await, "others are served");
    proxy.stop().await;
}
