//! Limits and failures: smuggling attempts, slow-loris, oversized heads, timeouts, no node,
//! and which requests are replayed when a node fails mid-request.

mod common;

use std::time::Duration;

use common::{
    config, node_of, nodes, plain_client, raw_exchange, set_cookie, BlackHole, Proxy, PATIENCE,
};
use limpet::proxy::NodeConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SMUGGLING: &[(&str, &str)] = &[
    (
        "differing duplicate CL",
        "POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\nContent-Length: 40\r\n\r\nabcdGET /smuggled HTTP/1.1\r\nHost: t\r\n\r\n",
    ),
    (
        "obs-fold",
        "GET / HTTP/1.1\r\nHost: t\r\nX-Folded: a\r\n b\r\n\r\n",
    ),
    (
        "TE not ending in chunked",
        "POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n",
    ),
    (
        "space before colon",
        "POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding : chunked\r\nContent-Length: 3\r\n\r\nabc",
    ),
    (
        "bad chunk size",
        "POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
    ),
    ("garbage request line", "GET/ HTTP/1.1 x\r\nHost: t\r\n\r\n"),
];

#[tokio::test]
async fn smuggling_attempts_get_400_and_a_closed_connection_others_unaffected() {
    let ns = nodes(&["a"]).await;
    let proxy = Proxy::start(config(&ns)).await;
    // A well-behaved client with an open keep-alive connection throughout.
    let good = plain_client();
    assert_eq!(
        good.get(proxy.url("/")).send().await.expect("get").status(),
        200
    );

    for (what, bytes) in SMUGGLING {
        let answer = raw_exchange(proxy.addr, bytes.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{what}: {answer:?}");
        assert_eq!(
            answer.matches("HTTP/1.1 ").count(),
            1,
            "{what}: one answer, then close: {answer:?}"
        );
        assert!(!answer.contains("smuggled"), "{what}");
        assert_eq!(
            good.get(proxy.url("/")).send().await.expect("get").status(),
            200,
            "after {what}"
        );
    }
    proxy.stop().await;
}

/// hyper removes Content-Length when Transfer-Encoding is present and closes the connection
/// after the answer (RFC 9112 6.3, the "forward" branch), before limpet sees the request. The
/// smuggled second request must never be answered, and the node must see a chunked body with
/// no Content-Length.
#[tokio::test]
async fn cl_and_te_together_cannot_smuggle() {
    let ns = nodes(&["a"]).await;
    let proxy = Proxy::start(config(&ns)).await;
    let answer = raw_exchange(
        proxy.addr,
        b"POST /headers HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: t\r\n\r\n",
    )
    .await;
    assert_eq!(answer.matches("HTTP/1.1 ").count(), 1, "{answer}");
    assert!(!answer.contains("smuggled"), "{answer}");
    assert!(
        !answer
            .to_ascii_lowercase()
            .contains("\ncontent-length: 4\n"),
        "{answer}"
    );
    proxy.stop().await;
}

#[tokio::test]
async fn slow_loris_is_cut_off() {
    let ns = nodes(&["a"]).await;
    let mut cfg = config(&ns);
    cfg.timeouts.header_read = Duration::from_millis(300);
    let proxy = Proxy::start(cfg).await;

    // Half a head, then silence.
    let mut s = TcpStream::connect(proxy.addr).await.expect("connect");
    s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\nX-A: ")
        .await
        .expect("write");
    let mut buf = Vec::new();
    let closed = tokio::time::timeout(PATIENCE, s.read_to_end(&mut buf)).await;
    assert!(closed.is_ok(), "a stalled head is cut off");

    // Nothing at all, not even enough bytes to tell HTTP/1 from HTTP/2.
    let mut s = TcpStream::connect(proxy.addr).await.expect("connect");
    s.write_all(b"PR").await.expect("write");
    let closed = tokio::time::timeout(PATIENCE, s.read_to_end(&mut buf)).await;
    assert!(closed.is_ok(), "a silent connection is cut off");

    // The proxy still serves.
    assert_eq!(
        plain_client()
            .get(proxy.url("/"))
            .send()
            .await
            .expect("get")
            .status(),
        200
    );
    proxy.stop().await;
}

#[tokio::test]
async fn long_targets_get_414_and_huge_heads_431() {
    let ns = nodes(&["a"]).await;
    let proxy = Proxy::start(config(&ns)).await;
    let client = plain_client();
    let long = format!("/{}", "p".repeat(10 * 1024));
    let resp = client.get(proxy.url(&long)).send().await.expect("get");
    assert_eq!(resp.status(), 414);
    assert!(resp.headers().contains_key("x-request-id"));

    let huge = "h".repeat(100 * 1024);
    let answer = raw_exchange(
        proxy.addr,
        format!("GET / HTTP/1.1\r\nHost: t\r\nX-Huge: {huge}\r\n\r\n").as_bytes(),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer:.80}");

    let many: String = (0..200).map(|i| format!("X-H{i}: v\r\n")).collect();
    let answer = raw_exchange(
        proxy.addr,
        format!("GET / HTTP/1.1\r\nHost: t\r\n{many}\r\n").as_bytes(),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer:.80}");
    proxy.stop().await;
}

#[tokio::test]
async fn a_slow_node_gets_504_with_a_request_id() {
    let ns = nodes(&["a"]).await;
    let mut cfg = config(&ns);
    cfg.timeouts.upstream_answer = Duration::from_millis(200);
    let proxy = Proxy::start(cfg).await;
    let resp = plain_client()
        .get(proxy.url("/slow?ms=5000"))
        .send()
        .await
        .expect("get");
    assert_eq!(resp.status(), 504);
    let id = resp
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .expect("request id")
        .to_owned();
    let body = resp.text().await.expect("body");
    assert!(body.contains(&id) && body.len() < 200, "{body}");
    proxy.stop().await;
}

#[tokio::test]
async fn no_node_left_gets_503_with_retry_after() {
    let mut ns = nodes(&["a", "b"]).await;
    let proxy = Proxy::start(config(&ns)).await;
    for n in &mut ns {
        n.kill().await;
    }
    let resp = plain_client()
        .get(proxy.url("/"))
        .send()
        .await
        .expect("get");
    assert_eq!(resp.status(), 503);
    assert!(resp.headers().contains_key("retry-after"));
    assert!(resp.headers().contains_key("x-request-id"));
    // Consecutive failures took both nodes DOWN: still 503, now without even trying.
    for _ in 0..3 {
        let resp = plain_client()
            .get(proxy.url("/"))
            .send()
            .await
            .expect("get");
        assert_eq!(resp.status(), 503);
    }
    proxy.stop().await;
}

#[tokio::test]
async fn only_idempotent_bodiless_requests_are_replayed_after_a_node_took_them() {
    let hole = BlackHole::start().await;
    let ns = nodes(&["a"]).await;
    let cfg = limpet::proxy::ProxyConfig::new(vec![
        NodeConfig {
            name: "hole".into(),
            addr: hole.addr,
        },
        ns[0].config(),
    ]);
    let proxy = Proxy::start(cfg).await;
    let client = plain_client();

    // Rotation turn 0 is the black hole: it takes the GET and never answers.
    let resp = client.get(proxy.url("/")).send().await.expect("get");
    assert_eq!(resp.status(), 200, "GET replayed on another node");
    assert_eq!(node_of(&resp), "a");
    assert!(
        set_cookie(&resp).is_some_and(|c| c.starts_with("route=a;")),
        "re-pinned"
    );

    // Turn 2 is the black hole again (on a new connection: the first one is pinned to "a"):
    // a POST is not replayed.
    let resp = plain_client()
        .post(proxy.url("/upload"))
        .body("payload")
        .send()
        .await
        .expect("post");
    assert_eq!(resp.status(), 502);
    assert!(resp.headers().contains_key("x-request-id"));
    proxy.stop().await;
}

#[tokio::test]
async fn a_streamed_post_fails_over_when_the_node_refuses_the_connection() {
    let mut ns = nodes(&["a", "b"]).await;
    let proxy = Proxy::start(config(&ns)).await;
    ns[0].kill().await;
    // Pinned to "a", so "a" is tried first. Nothing reached it: the body is still in hand
    // and goes to "b" whole.
    let resp = plain_client()
        .post(proxy.url("/upload"))
        .header("cookie", "route=a")
        .body(vec![1u8; 100_000])
        .send()
        .await
        .expect("post");
    assert_eq!(resp.status(), 200);
    assert_eq!(node_of(&resp), "b");
    assert!(
        set_cookie(&resp).is_some_and(|c| c.starts_with("route=b")),
        "re-pinned off a: {:?}",
        set_cookie(&resp)
    );
    assert_eq!(resp.text().await.expect("body").trim(), "100000");
    proxy.stop().await;
}

#[tokio::test]
async fn max_client_connections_holds_extra_connections_back() {
    let ns = nodes(&["a"]).await;
    let mut cfg = config(&ns);
    cfg.limits.max_client_connections = 1;
    let proxy = Proxy::start(cfg).await;

    let mut first = TcpStream::connect(proxy.addr).await.expect("connect");
    first
        .write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .expect("write");
    let mut buf = [0u8; 512];
    let n = first.read(&mut buf).await.expect("read");
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));

    let mut second = TcpStream::connect(proxy.addr).await.expect("connect");
    second
        .write_all(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .await
        .expect("write");
    // Not served while the first connection holds the only slot.
    let early = tokio::time::timeout(Duration::from_millis(300), second.read(&mut buf)).await;
    assert!(early.is_err(), "second connection waits");
    drop(first);
    let mut out = Vec::new();
    tokio::time::timeout(PATIENCE, second.read_to_end(&mut out))
        .await
        .expect("served once the slot frees")
        .expect("read");
    assert!(out.starts_with(b"HTTP/1.1 200"));
    proxy.stop().await;
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed() {
    let ns = nodes(&["a"]).await;
    let mut cfg = config(&ns);
    cfg.timeouts.keep_alive_idle = Duration::from_millis(200);
    let proxy = Proxy::start(cfg).await;
    // HTTP/2: hyper has no idle timeout of its own there; limpet's idle watch must close it.
    let stream = TcpStream::connect(proxy.addr).await.expect("connect");
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .expect("h2 handshake");
    let conn = tokio::spawn(conn);
    let req = http::Request::get(proxy.url("/"))
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .expect("request");
    let resp = sender.send_request(req).await.expect("answer");
    assert_eq!(resp.status(), 200);
    drop(resp);
    let closed = tokio::time::timeout(PATIENCE, conn).await;
    assert!(closed.is_ok(), "the proxy closed the idle connection");
    proxy.stop().await;
}

#[tokio::test]
async fn shutdown_drains_in_flight_requests() {
    let ns = nodes(&["a"]).await;
    let proxy = Proxy::start(config(&ns)).await;
    let addr = proxy.addr;
    let bytes = 8 << 20;
    // The answer head has arrived: the request is in flight for certain.
    let resp = plain_client()
        .get(proxy.url(&format!("/download?bytes={bytes}")))
        .send()
        .await
        .expect("head");
    let stopping = tokio::spawn(proxy.stop());
    let body = resp.bytes().await.expect("the in-flight answer completes");
    assert_eq!(body.len(), bytes);
    stopping.await.expect("stopped");
    // And the listener is gone.
    assert!(TcpStream::connect(addr).await.is_err());
}

/// The same over HTTP/2: two streams of one connection whose answers are on their way when
/// the shutdown begins both finish whole (the connection gets a GOAWAY, not a cut), then the
/// connection ends cleanly and the listener is gone.
#[tokio::test]
async fn shutdown_drains_http2_streams_in_flight() {
    use http_body_util::BodyExt;
    let ns = nodes(&["a"]).await;
    let proxy = Proxy::start(config(&ns)).await;
    let addr = proxy.addr;
    let bytes = 8 << 20;
    let (mut send, conn) = common::h2_client(&addr.to_string()).await;
    let mut answers = Vec::new();
    for _ in 0..2 {
        let req = hyper::Request::get(proxy.url(&format!("/download?bytes={bytes}")))
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap_or_else(|e| panic!("{e}"));
        // The answer head has arrived: the stream is in flight for certain.
        let resp = send
            .send_request(req)
            .await
            .unwrap_or_else(|e| panic!("head: {e}"));
        assert_eq!(resp.status(), 200);
        answers.push(resp);
    }
    let stopping = tokio::spawn(proxy.stop());
    for resp in answers {
        let body = resp
            .into_body()
            .collect()
            .await
            .unwrap_or_else(|e| panic!("the in-flight stream completes: {e}"))
            .to_bytes();
        assert_eq!(body.len(), bytes);
    }
    stopping.await.unwrap_or_else(|e| panic!("stopped: {e}"));
    let ended = tokio::time::timeout(PATIENCE, conn)
        .await
        .unwrap_or_else(|_| panic!("the connection did not end"));
    assert!(
        matches!(ended, Ok(Ok(()))),
        "the connection ended cleanly: {ended:?}"
    );
    assert!(TcpStream::connect(addr).await.is_err());
}

/// The failure model's shutdown: in-flight requests get `timeouts.drain`, no more. A request
/// whose node never answers is cut at the drain deadline: the proxy has stopped by then, the
/// client gets no answer, and the node's connection is closed.
#[tokio::test]
async fn shutdown_cuts_a_request_still_in_flight_at_the_drain_deadline() {
    const DRAIN: Duration = Duration::from_millis(300);
    let node = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = node.local_addr().expect("addr");
    let (seen_tx, seen_rx) = tokio::sync::oneshot::channel();
    // A node that takes the request and never answers; it reports when its connection ends.
    let hung = tokio::spawn(async move {
        let (mut s, _) = node.accept().await.expect("accept");
        let mut head = Vec::new();
        let mut buf = [0u8; 4096];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = s.read(&mut buf).await.expect("read");
            assert!(n > 0, "the proxy closed before the head was whole");
            head.extend_from_slice(&buf[..n]);
        }
        let _ = seen_tx.send(());
        // Returns once the proxy closes its side.
        while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {}
    });
    let mut cfg = limpet::proxy::ProxyConfig::new(vec![NodeConfig {
        name: "hung".into(),
        addr,
    }]);
    cfg.timeouts.drain = DRAIN;
    let proxy = Proxy::start(cfg).await;
    let url = proxy.url("/");
    let client = tokio::spawn(async move { plain_client().get(url).send().await });
    tokio::time::timeout(PATIENCE, seen_rx)
        .await
        .expect("the request reaches the node")
        .expect("seen");

    let stopping = tokio::time::Instant::now();
    proxy.stop().await;
    let took = stopping.elapsed();
    assert!(
        took >= DRAIN && took < DRAIN + Duration::from_millis(1500),
        "stopped {took:?} after the shutdown began (drain {DRAIN:?})"
    );
    let answer = tokio::time::timeout(Duration::from_secs(5), client)
        .await
        .expect("the client's request ends with the shutdown")
        .expect("task");
    assert!(
        answer.is_err(),
        "no answer was given, so the request fails: {answer:?}"
    );
    tokio::time::timeout(Duration::from_secs(5), hung)
        .await
        .expect("the node's connection is closed")
        .expect("node task");
}
