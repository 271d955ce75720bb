//! The request-driven HTTP/1.1 path to nodes (`proxy::node_h1`: bodiless replayable requests
//! to plaintext nodes), against scripted nodes that answer with exact bytes: every way
//! RFC 9112 delimits an answer body, interim answers, malformed and cut answers, and nodes
//! that close kept-alive connections. Each test also counts the node's connections, since
//! reusing a connection that must not be reused (or not reusing one that may) is the bug this
//! path can have that hyper's client does not.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::{config, plain_client, Proxy, PATIENCE};
use limpet::proxy::NodeConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// What a scripted node does with the n-th request it is sent (counted over all its
/// connections): the bytes it answers, and whether it closes the connection after them.
type Script = Arc<dyn Fn(usize, &str) -> (Vec<u8>, bool) + Send + Sync>;

struct ScriptedNode {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl ScriptedNode {
    async fn start(script: Script) -> ScriptedNode {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind node");
        let addr = listener.local_addr().expect("addr");
        let accepted = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&accepted);
        let task = tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                let script = Arc::clone(&script);
                let requests = Arc::clone(&requests);
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    loop {
                        let end = loop {
                            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                                break i + 4;
                            }
                            let mut chunk = [0u8; 4096];
                            match s.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                        };
                        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                        buf.drain(..end);
                        let n = requests.fetch_add(1, Ordering::SeqCst);
                        let (answer, close) = script(n, &head);
                        if s.write_all(&answer).await.is_err() || close {
                            return;
                        }
                    }
                });
            }
        });
        ScriptedNode {
            addr,
            accepted,
            task,
        }
    }

    fn connections(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    fn config(&self) -> NodeConfig {
        NodeConfig {
            name: "s".into(),
            addr: self.addr,
        }
    }
}

impl Drop for ScriptedNode {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn proxy_for(node: &ScriptedNode) -> Proxy {
    let mut cfg = config(&[]);
    cfg.nodes = vec![node.config()];
    Proxy::start(cfg).await
}

fn fixed(answer: &'static [u8], close: bool) -> Script {
    Arc::new(move |_, _| (answer.to_vec(), close))
}

async fn get(client: &reqwest::Client, url: &str) -> (u16, String) {
    let resp = client.get(url).send().await.expect("answer");
    let status = resp.status().as_u16();
    (status, resp.text().await.expect("body"))
}

#[tokio::test]
async fn chunked_answers_with_extensions_and_trailers_arrive_whole_and_keep_the_connection() {
    let node = ScriptedNode::start(fixed(
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nx-sum: 42\r\n\r\n",
        false,
    ))
    .await;
    let proxy = proxy_for(&node).await;
    let client = plain_client();
    for _ in 0..3 {
        assert_eq!(
            get(&client, &proxy.url("/")).await,
            (200, "hello world".into())
        );
    }
    assert_eq!(node.connections(), 1, "one node connection for all three");
    proxy.stop().await;
}

#[tokio::test]
async fn an_answer_delimited_by_close_is_relayed_and_its_connection_never_reused() {
    let node = ScriptedNode::start(fixed(b"HTTP/1.1 200 OK\r\n\r\nuntil close", true)).await;
    let proxy = proxy_for(&node).await;
    let client = plain_client();
    for _ in 0..2 {
        assert_eq!(
            get(&client, &proxy.url("/")).await,
            (200, "until close".into())
        );
    }
    assert_eq!(node.connections(), 2);
    proxy.stop().await;
}

/// The node's hop-by-hop fields never reach the client, whether its `Connection` line lists
/// only hop-by-hop names (read for keep-alive and left out of the answer's map) or names a
/// field of its own too (removed with that field); and both keep the node connection.
#[tokio::test]
async fn a_nodes_connection_line_and_the_fields_it_names_stay_hop_by_hop() {
    let script: Script = Arc::new(|n, _| {
        let answer: &[u8] = if n % 2 == 0 {
            b"HTTP/1.1 200 OK\r\nconnection: keep-alive\r\nkeep-alive: timeout=5\r\n\
              content-length: 2\r\n\r\nok"
        } else {
            b"HTTP/1.1 200 OK\r\nconnection: keep-alive, x-hop\r\nx-hop: secret\r\n\
              x-kept: 1\r\ncontent-length: 2\r\n\r\nok"
        };
        (answer.to_vec(), false)
    });
    let node = ScriptedNode::start(script).await;
    let proxy = proxy_for(&node).await;
    let client = plain_client();
    for n in 0..4 {
        let resp = client.get(proxy.url("/")).send().await.expect("answer");
        assert_eq!(resp.status().as_u16(), 200);
        let headers = resp.headers().clone();
        assert_eq!(resp.text().await.expect("body"), "ok");
        for hop in ["keep-alive", "x-hop"] {
            assert!(
                !headers.contains_key(hop),
                "answer {n}: {hop} reached the client"
            );
        }
        // limpet's own server writes no Connection on a kept-alive HTTP/1.1 answer.
        assert_eq!(
            headers.get("connection"),
            None,
            "answer {n}: the node's Connection line reached the client"
        );
        if n % 2 == 1 {
            assert_eq!(headers.get("x-kept").map(|v| v.as_bytes()), Some(&b"1"[..]));
        }
    }
    assert_eq!(node.connections(), 1, "one node connection for all four");
    proxy.stop().await;
}

#[tokio::test]
async fn bodiless_answers_keep_the_connection() {
    // HEAD (with the length a GET would have), then 204, then 304, then a GET: one
    // connection; a body read where there is none would swallow the next answer.
    let script: Script = Arc::new(|n, _| {
        let answer: &[u8] = match n {
            0 => b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n",
            1 => b"HTTP/1.1 204 No Content\r\n\r\n",
            2 => b"HTTP/1.1 304 Not Modified\r\ncontent-length: 10\r\n\r\n",
            _ => b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nlast",
        };
        (answer.to_vec(), false)
    });
    let node = ScriptedNode::start(script).await;
    let proxy = proxy_for(&node).await;
    let client = plain_client();
    let head = client.head(proxy.url("/")).send().await.expect("HEAD");
    assert_eq!(head.status().as_u16(), 200);
    assert_eq!(get(&client, &proxy.url("/")).await, (204, String::new()));
    assert_eq!(get(&client, &proxy.url("/")).await, (304, String::new()));
    assert_eq!(get(&client, &proxy.url("/")).await, (200, "last".into()));
    assert_eq!(node.connections(), 1);
    proxy.stop().await;
}

#[tokio::test]
async fn interim_answers_are_skipped() {
    let node = ScriptedNode::start(fixed(
        b"HTTP/1.1 103 Early Hints\r\nlink: </a.css>\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
        false,
    ))
    .await;
    let proxy = proxy_for(&node).await;
    assert_eq!(
        get(&plain_client(), &proxy.url("/")).await,
        (200, "ok".into())
    );
    proxy.stop().await;
}

#[tokio::test]
async fn malformed_answers_are_502_and_the_connection_is_dropped() {
    for bad in [
        &b"HTTP/1.1 200 OK\r\ncontent-length: 1x\r\n\r\nx"[..],
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\nxyz",
        b"HTTP/9.9 200 OK\r\n\r\n",
        b"not http at all\r\n\r\n",
    ] {
        let node = ScriptedNode::start(fixed(bad, false)).await;
        let proxy = proxy_for(&node).await;
        let client = plain_client();
        let (status, _) = get(&client, &proxy.url("/")).await;
        assert_eq!(status, 502, "{}", String::from_utf8_lossy(bad));
        let _ = get(&client, &proxy.url("/")).await;
        assert_eq!(
            node.connections(),
            2,
            "a connection that spoke garbage is not reused"
        );
        proxy.stop().await;
    }
}

#[tokio::test]
async fn an_answer_cut_short_ends_the_client_answer_and_the_proxy_goes_on() {
    let script: Script = Arc::new(|n, _| match n {
        0 => (
            b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc".to_vec(),
            true,
        ),
        _ => (
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".to_vec(),
            false,
        ),
    });
    let node = ScriptedNode::start(script).await;
    let proxy = proxy_for(&node).await;
    let client = plain_client();
    // Never passed off as complete: the client's connection ends before the answer does
    // (hyper may not have flushed the head yet when the cut comes).
    match client.get(proxy.url("/")).send().await {
        Ok(resp) => assert!(resp.bytes().await.is_err(), "a cut answer read as whole"),
        Err(e) => assert!(e.is_request(), "{e}"),
    }
    // That client connection is gone with its cut answer; a new one is served.
    assert_eq!(
        get(&plain_client(), &proxy.url("/")).await,
        (200, "ok".into())
    );
    proxy.stop().await;
}

#[tokio::test]
async fn a_long_answer_streams_through_in_many_reads() {
    const LEN: usize = 3 * 1024 * 1024 + 17;
    let script: Script = Arc::new(|_, _| {
        let mut a = format!("HTTP/1.1 200 OK\r\ncontent-length: {LEN}\r\n\r\n").into_bytes();
        a.extend((0..LEN).map(|i| (i % 251) as u8));
        (a, false)
    });
    let node = ScriptedNode::start(script).await;
    let proxy = proxy_for(&node).await;
    let client = plain_client();
    for _ in 0..2 {
        let body = tokio::time::timeout(PATIENCE, async {
            client
                .get(proxy.url("/"))
                .send()
                .await
                .expect("answer")
                .bytes()
                .await
                .expect("body")
        })
        .await
        .expect("in time");
        assert_eq!(body.len(), LEN);
        assert!(body.iter().enumerate().all(|(i, b)| *b == (i % 251) as u8));
    }
    assert_eq!(node.connections(), 1);
    proxy.stop().await;
}

#[tokio::test]
async fn a_node_closing_kept_alive_connections_costs_no_request_and_no_re_pin() {
    // The node answers with keep-alive and then closes anyway, as a node whose keep-alive
    // timeout ran out does: the next request meets a closed kept-alive connection, which is
    // either seen closed at checkout or fails before any answer byte; both must end in a
    // fresh connection to the same node, never in an error or a move.
    let node = ScriptedNode::start(fixed(
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
        true,
    ))
    .await;
    let other = common::Node::start("other").await;
    let mut cfg = config(&[]);
    cfg.nodes = vec![node.config(), other.config()];
    let proxy = Proxy::start(cfg).await;
    let client = plain_client();
    // Pin to the scripted node ("s").
    let cookie = "route=s";
    for i in 0..20 {
        let resp = client
            .get(proxy.url("/"))
            .header("cookie", cookie)
            .send()
            .await
            .expect("answer");
        assert_eq!(resp.status().as_u16(), 200, "request {i}");
        assert!(
            common::set_cookie(&resp).is_none(),
            "request {i} was re-pinned"
        );
        assert_eq!(resp.text().await.expect("body"), "ok");
    }
    assert_eq!(node.connections(), 20);
    proxy.stop().await;
}

/// A raw client: sends `request` on a new connection and returns the connection.
async fn send_raw(proxy: &Proxy, request: &[u8]) -> tokio::net::TcpStream {
    let mut c = tokio::net::TcpStream::connect(proxy.addr)
        .await
        .expect("connect");
    c.write_all(request).await.expect("request sent");
    c
}

/// Everything the proxy sends until it ends the stream.
async fn to_the_end(c: &mut tokio::net::TcpStream) -> String {
    let mut all = Vec::new();
    tokio::time::timeout(PATIENCE, c.read_to_end(&mut all))
        .await
        .expect("the proxy ended the stream in time")
        .expect("read");
    String::from_utf8_lossy(&all).into_owned()
}

/// What the proxy sends until it ends with `end` (the stream staying open).
async fn read_until(c: &mut tokio::net::TcpStream, end: &[u8]) -> Vec<u8> {
    let mut got = Vec::new();
    while !got.ends_with(end) {
        let mut chunk = [0u8; 1024];
        let n = tokio::time::timeout(PATIENCE, c.read(&mut chunk))
            .await
            .expect("came in time")
            .expect("read");
        assert!(n > 0, "ended early: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&chunk[..n]);
    }
    got
}

/// A connection's last answer, whole in hand, leaves with the FIN (`client_io`): it still
/// arrives whole and the stream ends, for HTTP/1.1 `Connection: close` and for HTTP/1.0.
/// An HTTP/1.0 request that asks to be kept alive is: its answer comes, and the next request
/// on the connection is answered too.
#[tokio::test]
async fn a_closing_connections_last_answer_arrives_whole_with_the_end_of_the_stream() {
    let node = ScriptedNode::start(fixed(
        b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello",
        false,
    ))
    .await;
    let proxy = proxy_for(&node).await;
    for request in [
        &b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"[..],
        b"GET / HTTP/1.0\r\nhost: x\r\n\r\n",
    ] {
        let mut c = send_raw(&proxy, request).await;
        let answer = to_the_end(&mut c).await;
        assert!(answer.starts_with("HTTP/1."), "{answer}");
        assert!(answer.ends_with("\r\n\r\nhello"), "{answer}");
    }

    let mut c = send_raw(
        &proxy,
        b"GET / HTTP/1.0\r\nhost: x\r\nconnection: keep-alive\r\n\r\n",
    )
    .await;
    let got = read_until(&mut c, b"hello").await;
    c.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .expect("second request sent");
    let second = to_the_end(&mut c).await;
    assert!(
        second.ends_with("\r\n\r\nhello"),
        "{second:?} after {:?}",
        String::from_utf8_lossy(&got)
    );
    proxy.stop().await;
}

/// An answer to a `Connection: close` request that is still coming from its node is not
/// marked the connection's last (only one whole in hand is): it reaches the client in
/// parts as its node sends them, and then ends.
#[tokio::test]
async fn a_streamed_answer_to_a_closing_request_reaches_the_client_in_parts_then_ends() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind node");
    let addr = listener.local_addr().expect("addr");
    let (go, gone) = tokio::sync::oneshot::channel::<()>();
    let node = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.expect("accept");
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut b = [0u8; 1];
            if s.read(&mut b).await.expect("read") == 0 {
                return;
            }
            head.push(b[0]);
        }
        s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nfirst")
            .await
            .expect("first part");
        let _ = gone.await;
        s.write_all(b" rest").await.expect("the rest");
        // Held open: the answer's end is its length.
        let _ = s.read(&mut [0u8; 1]).await;
    });
    let mut cfg = config(&[]);
    cfg.nodes = vec![NodeConfig {
        name: "s".into(),
        addr,
    }];
    let proxy = Proxy::start(cfg).await;
    let mut c = send_raw(
        &proxy,
        b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    read_until(&mut c, b"first").await;
    go.send(()).expect("node waiting");
    assert_eq!(to_the_end(&mut c).await, " rest");
    node.abort();
    proxy.stop().await;
}

/// A node's trailers reach an HTTP/1.1 client that takes them (`TE: trailers`): its
/// `Trailer` field, which names them, is the answer's own, not hop-by-hop (RFC 9110 6.6.2;
/// HAProxy keeps it), and hyper writes trailers only for the fields it names. Before, the
/// field was dropped as hop-by-hop, and with it every trailer.
#[tokio::test]
async fn a_node_s_trailers_reach_an_http1_client_that_takes_them() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let node = ScriptedNode::start(fixed(
        b"HTTP/1.1 200 OK\r\ntrailer: x-sum\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nx-sum: 42\r\n\r\n",
        false,
    ))
    .await;
    let proxy = proxy_for(&node).await;
    let mut s = tokio::net::TcpStream::connect(proxy.addr)
        .await
        .expect("connect");
    s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\nTE: trailers\r\nConnection: close\r\n\r\n")
        .await
        .expect("write");
    let mut got = Vec::new();
    tokio::time::timeout(common::PATIENCE, s.read_to_end(&mut got))
        .await
        .expect("answered in time")
        .expect("read");
    let text = String::from_utf8_lossy(&got).to_ascii_lowercase();
    let (head, body) = text.split_once("\r\n\r\n").expect("a head");
    assert!(head.contains("\r\ntrailer: x-sum"), "{text}");
    assert!(
        body.starts_with("5\r\nhello\r\n0\r\nx-sum: 42\r\n"),
        "the trailer after the last chunk: {text}"
    );
    proxy.stop().await;
}

/// A node's trailers that carry connection-specific fields (`connection` and the field it
/// names, `keep-alive`, `transfer-encoding`) reach an HTTP/2 client without them: its stream
/// ends cleanly with the other trailers. (Before, they were passed on, h2 refused to send
/// them, and the stream was reset after the whole answer: curl's "stream was not closed
/// cleanly".)
#[tokio::test]
async fn a_node_s_hop_by_hop_trailers_do_not_reset_an_http2_client_s_stream() {
    use http_body_util::BodyExt as _;
    let node = ScriptedNode::start(fixed(
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\
          x-sum: 42\r\nconnection: x-hop\r\nx-hop: 1\r\nkeep-alive: 5\r\n\
          transfer-encoding: chunked\r\n\r\n",
        false,
    ))
    .await;
    let proxy = proxy_for(&node).await;
    let (mut send, conn) = common::h2_client(&proxy.addr.to_string()).await;
    let req = http::Request::builder()
        .uri(format!("http://{}/", proxy.addr))
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .expect("request");
    let resp = tokio::time::timeout(common::PATIENCE, send.send_request(req))
        .await
        .expect("answered in time")
        .expect("answer");
    assert_eq!(resp.status(), 200);
    let body = tokio::time::timeout(common::PATIENCE, resp.into_body().collect())
        .await
        .expect("the body in time")
        .expect("the stream ends cleanly, not reset");
    let trailers = body.trailers().cloned().expect("the trailers");
    assert_eq!(body.to_bytes(), "hello");
    assert_eq!(
        trailers.get("x-sum").map(|v| v.as_bytes()),
        Some(&b"42"[..])
    );
    for hop in ["connection", "x-hop", "keep-alive", "transfer-encoding"] {
        assert!(!trailers.contains_key(hop), "{hop} in {trailers:?}");
    }
    conn.abort();
    proxy.stop().await;
}

/// A client's request trailers go no further: a `Trailer` field naming `X-Forwarded-For`
/// and a trailer of that name after the body would reach a node that merges trailers into
/// the head as a client address limpet never set. The node gets the body, chunked, and no
/// trailer.
#[tokio::test]
async fn a_client_s_request_trailers_do_not_reach_the_node() {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr");
    let (got_tx, mut got_rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    let node = tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let mut got = Vec::new();
            let mut b = [0u8; 4096];
            // Until the chunked body's end: the last chunk and the empty line after it.
            while !got.ends_with(b"\r\n\r\n") || !got.windows(5).any(|w| w == b"\r\n0\r\n") {
                match s.read(&mut b).await {
                    Ok(n @ 1..) => got.extend_from_slice(&b[..n]),
                    _ => break,
                }
            }
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                .await;
            let _ = got_tx.send(got);
        }
    });
    let mut cfg = config(&[]);
    cfg.nodes = vec![NodeConfig {
        name: "s".into(),
        addr,
    }];
    let proxy = Proxy::start(cfg).await;
    let mut s = tokio::net::TcpStream::connect(proxy.addr)
        .await
        .expect("connect");
    s.write_all(
        b"POST /up HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nTrailer: x-forwarded-for\r\n\
          Connection: close\r\n\r\n5\r\nhello\r\n0\r\nx-forwarded-for: 10.6.6.6\r\n\r\n",
    )
    .await
    .expect("write");
    let mut answer = Vec::new();
    tokio::time::timeout(PATIENCE, s.read_to_end(&mut answer))
        .await
        .expect("answered in time")
        .expect("read");
    assert!(answer.starts_with(b"HTTP/1.1 200"), "{answer:?}");
    let got = tokio::time::timeout(PATIENCE, got_rx.recv())
        .await
        .expect("the node got it")
        .expect("node runs");
    let text = String::from_utf8_lossy(&got).to_ascii_lowercase();
    assert!(text.contains("\r\n5\r\nhello\r\n0\r\n\r\n"), "{text}");
    assert!(!text.contains("10.6.6.6"), "{text}");
    assert!(!text.contains("\r\ntrailer:"), "{text}");
    proxy.stop().await;
    node.abort();
}

/// A client's `Connection` line that names `Cookie` takes the cookie out on either path to
/// the node: a bodiless GET (this module's path) and a POST with a body (hyper's client).
/// Before, the POST's cookie, less limpet's own pair, was put back after the hop-by-hop
/// fields were removed: the node saw `cookie: theme=dark` on one path and nothing on the
/// other.
#[tokio::test]
async fn a_cookie_the_client_s_connection_line_names_is_dropped_on_either_path() {
    let heads = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = Arc::clone(&heads);
    let script: Script = Arc::new(move |_, head| {
        seen.lock().expect("lock").push(head.to_owned());
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok".to_vec(),
            true,
        )
    });
    let node = ScriptedNode::start(script).await;
    let proxy = proxy_for(&node).await;
    for request in [
        &b"GET / HTTP/1.1\r\nHost: x\r\nCookie: route=s; theme=dark\r\nConnection: close, cookie\r\n\r\n"[..],
        b"POST / HTTP/1.1\r\nHost: x\r\nCookie: route=s; theme=dark\r\nConnection: close, cookie\r\nContent-Length: 2\r\n\r\nhi",
    ] {
        let answer = common::raw_exchange(proxy.addr, request).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
    let heads = heads.lock().expect("lock").clone();
    assert_eq!(heads.len(), 2, "{heads:?}");
    for head in &heads {
        assert!(
            !head.to_ascii_lowercase().contains("\r\ncookie:"),
            "the node saw a cookie the client's Connection line named: {head}"
        );
    }
    proxy.stop().await;
}

/// A node's `Content-Length` given more than once with one value (`5, 5`, or two lines of
/// `5`) frames the body by that value (RFC 9110 8.6 lets a recipient take it), and the
/// client is sent that one value on one line, on either path to the node (a bodiless GET
/// and a POST with a body), and to a HEAD, whose answer has no body but its length:
/// passed on as it came, a strict client refuses the answer, and hyper's server ends the
/// connection at the second line, the HEAD's answer unsent.
#[tokio::test]
async fn a_content_length_repeated_with_one_value_reaches_the_client_as_one() {
    for answer in [
        &b"HTTP/1.1 200 OK\r\ncontent-length: 5, 5\r\nconnection: close\r\n\r\nhello"[..],
        b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nContent-Length: 5\r\nconnection: close\r\n\r\nhello",
    ] {
        let node = ScriptedNode::start(fixed(answer, true)).await;
        let proxy = proxy_for(&node).await;
        for request in [
            &b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"[..],
            b"POST / HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 2\r\n\r\nhi",
            b"HEAD / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        ] {
            let head_request = request.starts_with(b"HEAD");
            let got = common::raw_exchange(proxy.addr, request).await;
            let (head, body) = got.split_once("\r\n\r\n").unwrap_or((&got, ""));
            let lengths: Vec<&str> = head
                .lines()
                .filter_map(|l| l.split_once(':'))
                .filter(|(name, _)| name.eq_ignore_ascii_case("content-length"))
                .map(|(_, v)| v.trim())
                .collect();
            assert!(head.starts_with("HTTP/1.1 200"), "{got}");
            assert_eq!(lengths, ["5"], "{got}");
            assert_eq!(body, if head_request { "" } else { "hello" }, "{got}");
        }
        proxy.stop().await;
    }
}

/// A HEAD's answer with `Content-Length` values that differ, or one that is not a number,
/// is the node's fault, as with a body: 502. Before, two lines reached hyper's server,
/// which ended the client's connection with no answer at all, and one line went to the
/// client as it came. A GET's 304, whatever its `Content-Length` holds, is left to hyper,
/// which drops it: the answer is served (a HEAD's is a HEAD's answer as any other).
#[tokio::test]
async fn a_head_answer_with_a_bad_content_length_is_a_502() {
    for answer in [
        &b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 7\r\nconnection: close\r\n\r\n"
            [..],
        b"HTTP/1.1 200 OK\r\ncontent-length: 5, 7\r\nconnection: close\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: five\r\nconnection: close\r\n\r\n",
    ] {
        let node = ScriptedNode::start(fixed(answer, true)).await;
        let proxy = proxy_for(&node).await;
        let got = common::raw_exchange(
            proxy.addr,
            b"HEAD / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(
            got.starts_with("HTTP/1.1 502"),
            "{:?}: {got:?}",
            String::from_utf8_lossy(answer)
        );
        proxy.stop().await;
    }
    let node = ScriptedNode::start(fixed(
        b"HTTP/1.1 304 Not Modified\r\ncontent-length: 5, 7\r\ncontent-length: x\r\nconnection: close\r\n\r\n",
        true,
    ))
    .await;
    let proxy = proxy_for(&node).await;
    for (method, status) in [("GET", "304"), ("HEAD", "502")] {
        let got = common::raw_exchange(
            proxy.addr,
            format!("{method} / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await;
        assert!(
            got.starts_with(&format!("HTTP/1.1 {status}")),
            "{method}: {got:?}"
        );
    }
    proxy.stop().await;
}
