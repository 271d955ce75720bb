//! TLS through rustls: certificates chosen by SNI, ALPN h2/http1.1 on HTTPS listeners,
//! `Secure` cookies over TLS, and TLS to nodes verified against a CA (or refused).

mod common;

use std::sync::Arc;

use common::multiport::*;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use limpet::runtime::start;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::AsyncWriteExt;

fn der_of(pem: &std::path::Path) -> CertificateDer<'static> {
    use rustls::pki_types::pem::PemObject;
    CertificateDer::from_pem_file(pem).expect("pem")
}

/// A config of node a (127.0.0.2) behind a TCP listener `raw-tls` that terminates TLS with
/// `certs`, each a certificate, its key and the SNI names it answers (none: the default).
fn raw_tls_config(tcp: u16, certs: &[(&std::path::Path, &std::path::Path, &[&str])]) -> String {
    let mut text = format!(
        "[[nodes]]\nname = \"a\"\naddress = \"127.0.0.2\"\n\n[[listeners]]\nname = \"raw-tls\"\n\
         bind = \"127.0.0.1:0\"\nmode = \"tcp\"\nnode_port = {tcp}\n"
    );
    for (cert, key, names) in certs {
        text.push_str(&format!(
            "\n[[listeners.tls.certs]]\ncert = \"{}\"\nkey = \"{}\"\n",
            cert.display(),
            key.display()
        ));
        if !names.is_empty() {
            let quoted: Vec<String> = names.iter().map(|n| format!("{n:?}")).collect();
            text.push_str(&format!("names = [{}]\n", quoted.join(", ")));
        }
    }
    text
}

/// The certificate a client's handshake was given.
fn served_cert<S>(tls: &tokio_rustls::client::TlsStream<S>) -> Option<CertificateDer<'static>> {
    tls.get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .cloned()
}

#[tokio::test]
async fn certificates_are_chosen_by_sni_with_a_default() {
    let pki = Pki::new();
    let (mut nodes, ports) =
        start_nodes(&[("a", "127.0.0.2")], pki.server("n", &["127.0.0.2"])).await;
    let (dc, dk) = pki.issue("default", &["default.example"]);
    let (ac, ak) = pki.issue("a", &["a.example"]);
    let (bc, bk) = pki.issue("b", &["b.example", "*.b.example"]);
    let dir = TempDir::new("sni");
    let text = raw_tls_config(
        ports.tcp,
        &[
            (&dc, &dk, &[]),
            (&ac, &ak, &["a.example"]),
            (&bc, &bk, &["b.example", "x.b.example"]),
        ],
    );
    let running = start(config(&dir, &text)).await.expect("start");
    let addr = running.addr("raw-tls").expect("addr");
    // A client that accepts any certificate, so we can look at which one we got.
    let any = Arc::new(
        limpet::tls::client_config(limpet::tls::UpstreamVerify::None, &[]).expect("client"),
    );
    for (sni, want) in [
        ("a.example", &ac),
        ("b.example", &bc),
        ("x.b.example", &bc),
        ("other.example", &dc),
    ] {
        let s = connect_from("127.0.0.1".parse().expect("ip"), addr).await;
        let mut tls = tokio_rustls::TlsConnector::from(Arc::clone(&any))
            .connect(ServerName::try_from(sni).expect("name"), s)
            .await
            .expect("handshake");
        let got = served_cert(&tls);
        assert_eq!(got, Some(der_of(want)), "SNI {sni}");
        // And the relay works through it.
        let line = read_line(&mut tls).await;
        assert_eq!(line, "node=a");
        let _ = tls.shutdown().await;
    }
    // A client verifying against the CA accepts the SNI-chosen certificate.
    let s = connect_from("127.0.0.1".parse().expect("ip"), addr).await;
    let mut tls = tokio_rustls::TlsConnector::from(pki.client(&[]))
        .connect(ServerName::try_from("a.example").expect("name"), s)
        .await
        .expect("verified handshake");
    assert_eq!(read_line(&mut tls).await, "node=a");
    running.stop().await;
    for n in &mut nodes {
        n.kill().await;
    }
}

/// With every certificate given `names` (none the default), the first is the default, as
/// HAProxy's first `crt` and nginx's default server's certificate are: a client that sends
/// no SNI (it connects by IP address, as printers and terminals do) or a name no entry lists
/// gets it, and the session is relayed. Before, its handshake was refused, with nothing said
/// above debug.
#[tokio::test]
async fn with_every_certificate_named_the_first_serves_clients_without_a_listed_name() {
    let pki = Pki::new();
    let (mut nodes, ports) =
        start_nodes(&[("a", "127.0.0.2")], pki.server("n", &["127.0.0.2"])).await;
    let (ac, ak) = pki.issue("a", &["a.example", "127.0.0.1"]);
    let (bc, bk) = pki.issue("b", &["b.example"]);
    let dir = TempDir::new("sni-first");
    let text = raw_tls_config(
        ports.tcp,
        &[(&ac, &ak, &["a.example"]), (&bc, &bk, &["b.example"])],
    );
    let running = start(config(&dir, &text)).await.expect("start");
    let addr = running.addr("raw-tls").expect("addr");
    // An IP address as the server name: rustls sends no SNI for it, and checks the
    // certificate against the address.
    for (server, want) in [
        ("127.0.0.1", &ac),
        ("other.example", &ac),
        ("b.example", &bc),
    ] {
        let s = connect_from("127.0.0.1".parse().expect("ip"), addr).await;
        let verify = server == "127.0.0.1";
        let client = if verify {
            pki.client(&[])
        } else {
            Arc::new(
                limpet::tls::client_config(limpet::tls::UpstreamVerify::None, &[]).expect("client"),
            )
        };
        let mut tls = tokio_rustls::TlsConnector::from(client)
            .connect(ServerName::try_from(server).expect("name"), s)
            .await
            .unwrap_or_else(|e| panic!("handshake as {server}: {e}"));
        let got = served_cert(&tls);
        assert_eq!(got, Some(der_of(want)), "as {server}");
        assert_eq!(read_line(&mut tls).await, "node=a", "as {server}");
        let _ = tls.shutdown().await;
    }
    running.stop().await;
    for n in &mut nodes {
        n.kill().await;
    }
}

/// HTTPS offers HTTP/2 and HTTP/1.1 by ALPN (and takes a client offering HTTP/1.0 alone, or
/// nothing), and its cookies are `Secure`, but with `secure = "never"`, over TLS too: a site
/// served over both HTTP and HTTPS keeps one pin on both (a browser neither sends a `Secure`
/// cookie over HTTP nor lets an HTTP answer replace it; before, a cookie set over TLS was
/// `Secure` whatever the setting). The plain listener's cookies are not.
#[tokio::test]
async fn https_offers_h2_and_http11_and_cookies_over_tls_are_secure() {
    let pki = Pki::new();
    let (mut nodes, ports) =
        start_nodes(&[("a", "127.0.0.2")], pki.server("n", &["127.0.0.2"])).await;
    let (c, k) = pki.issue("limpet", &["print.example"]);
    let dir = TempDir::new("alpn");
    let text = format!(
        r#"
[[nodes]]
name = "a"
address = "127.0.0.2"

[[listeners]]
name = "https"
bind = "127.0.0.1:0"
node_port = {http}
tls = {{ cert = "{c}", key = "{k}" }}

[[listeners]]
name = "http"
bind = "127.0.0.1:0"
node_port = {http}

[[listeners]]
name = "https-not-secure"
bind = "127.0.0.1:0"
node_port = {http}
tls = {{ cert = "{c}", key = "{k}" }}

[listeners.cookie]
secure = "never"
"#,
        http = ports.http,
        c = c.display(),
        k = k.display(),
    );
    let running = start(config(&dir, &text)).await.expect("start");
    let addr = running.addr("https").expect("addr");

    // HTTP/2 by ALPN.
    let s = connect_from("127.0.0.1".parse().expect("ip"), addr).await;
    let tls = tokio_rustls::TlsConnector::from(pki.client(&[b"h2", b"http/1.1"]))
        .connect(ServerName::try_from("print.example").expect("name"), s)
        .await
        .expect("handshake");
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .expect("h2 handshake");
    let conn_task = tokio::spawn(conn);
    let req = http::Request::builder()
        .uri("https://print.example/")
        .body(Empty::<bytes::Bytes>::new())
        .expect("request");
    let resp = send.send_request(req).await.expect("h2 answer");
    assert_eq!(resp.version(), http::Version::HTTP_2);
    let set_cookie = resp
        .headers()
        .get_all(http::header::SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with("route="))
        .unwrap_or("")
        .to_owned();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    assert_eq!(&body[..], b"node a");
    assert!(
        set_cookie.contains("Secure"),
        "cookie set over TLS is Secure: {set_cookie}"
    );
    drop(send);
    conn_task.abort();

    // HTTP/1.1 by ALPN on the same listener.
    let s = connect_from("127.0.0.1".parse().expect("ip"), addr).await;
    let tls = tokio_rustls::TlsConnector::from(pki.client(&[b"http/1.1"]))
        .connect(ServerName::try_from("print.example").expect("name"), s)
        .await
        .expect("handshake");
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    let (head, node) = get_over(tls).await;
    assert_eq!(node, "a");
    assert!(head.to_ascii_lowercase().contains("; secure"), "{head}");

    // A client that offers HTTP/1.0 alone (`curl --http1.0` does) is served HTTP/1 (the
    // protocol is told by its first bytes); and so, without ALPN, is one that offers none.
    // Before, the first was refused at its handshake (`no_application_protocol`: rustls
    // refuses a client whose list holds none of the server's protocols).
    for offer in [&[&b"http/1.0"[..]][..], &[]] {
        let s = connect_from("127.0.0.1".parse().expect("ip"), addr).await;
        let tls = tokio_rustls::TlsConnector::from(pki.client(offer))
            .connect(ServerName::try_from("print.example").expect("name"), s)
            .await
            .unwrap_or_else(|e| panic!("handshake offering {offer:?}: {e}"));
        assert_eq!(tls.get_ref().1.alpn_protocol(), offer.first().copied());
        let (head, node) = get_raw(tls, "GET / HTTP/1.0\r\nHost: print.example\r\n\r\n").await;
        assert!(
            head.starts_with("HTTP/1.") && head.contains(" 200 "),
            "{head}"
        );
        assert_eq!(node, "a");
    }

    // `secure = "never"`: not over TLS either.
    let s = connect_from(
        "127.0.0.1".parse().expect("ip"),
        running.addr("https-not-secure").expect("addr"),
    )
    .await;
    let tls = tokio_rustls::TlsConnector::from(pki.client(&[b"http/1.1"]))
        .connect(ServerName::try_from("print.example").expect("name"), s)
        .await
        .expect("handshake");
    let (head, _) = get_over(tls).await;
    let head = head.to_ascii_lowercase();
    assert!(
        head.contains("set-cookie: route=a") && !head.contains("secure"),
        "{head}"
    );

    // The plain listener's cookie is not Secure.
    let s = connect_from(
        "127.0.0.1".parse().expect("ip"),
        running.addr("http").expect("http"),
    )
    .await;
    let (head, _) = get_over(s).await;
    let head = head.to_ascii_lowercase();
    assert!(
        head.contains("set-cookie: route=a") && !head.contains("secure"),
        "{head}"
    );
    running.stop().await;
    for n in &mut nodes {
        n.kill().await;
    }
}

#[tokio::test]
async fn tls_to_nodes_is_verified_against_the_ca() {
    let pki = Pki::new();
    let (mut nodes, ports) = start_nodes(
        &[("a", "127.0.0.2")],
        pki.server("n", &["node.example", "127.0.0.2"]),
    )
    .await;
    let dir = TempDir::new("upstream");
    let ca = pki.ca_pem.display();
    let text = format!(
        r#"
[[nodes]]
name = "a"
address = "127.0.0.2"

[[listeners]]
name = "by-name"
bind = "127.0.0.1:0"
node_port = {https}
upstream_tls = {{ ca = "{ca}", server_name = "node.example" }}

[[listeners]]
name = "by-ip"
bind = "127.0.0.1:0"
node_port = {https}
upstream_tls = {{ ca = "{ca}" }}

[[listeners]]
name = "wrong-name"
bind = "127.0.0.1:0"
node_port = {https}
upstream_tls = {{ ca = "{ca}", server_name = "wrong.example" }}

[[listeners]]
name = "raw-tls-up"
bind = "127.0.0.1:0"
mode = "tcp"
node_port = {https}
upstream_tls = {{ ca = "{ca}", server_name = "node.example" }}
"#,
        https = ports.https,
    );
    let running = start(config(&dir, &text)).await.expect("start");
    assert_eq!(
        http_node("127.0.0.1", running.addr("by-name").expect("a")).await,
        "a"
    );
    assert_eq!(
        http_node("127.0.0.1", running.addr("by-ip").expect("a")).await,
        "a"
    );
    let s = connect_from(
        "127.0.0.1".parse().expect("ip"),
        running.addr("wrong-name").expect("a"),
    )
    .await;
    let (head, _) = get_over(s).await;
    assert!(
        head.starts_with("HTTP/1.1 50"),
        "a node failing verification is not used: {head}"
    );
    // TCP mode with TLS to the node: the relay speaks plain to the client, TLS to the node.
    let s = connect_from(
        "127.0.0.1".parse().expect("ip"),
        running.addr("raw-tls-up").expect("a"),
    )
    .await;
    let (_, node) = get_over(s).await;
    assert_eq!(node, "a");
    running.stop().await;
    for n in &mut nodes {
        n.kill().await;
    }
}

/// TLS to the node is part of the attempt at a node on a TCP listener: a node whose
/// certificate fails verification is a passive failure, and the session goes to another node
/// (nothing of the client's was sent), so no session is lost and the failing node ends DOWN.
#[tokio::test]
async fn a_tcp_session_whose_node_tls_fails_moves_to_another_node() {
    let pki = Pki::new();
    // Both nodes serve a certificate for 127.0.0.3 only: a (127.0.0.2) fails verification.
    let (mut nodes, ports) = start_nodes(
        &[("a", "127.0.0.2"), ("b", "127.0.0.3")],
        pki.server("n", &["127.0.0.3"]),
    )
    .await;
    let dir = TempDir::new("upstream-tls-failover");
    let text = format!(
        r#"
[[nodes]]
name = "a"
address = "127.0.0.2"

[[nodes]]
name = "b"
address = "127.0.0.3"

[[listeners]]
name = "raw-tls-up"
bind = "127.0.0.1:0"
mode = "tcp"
node_port = {https}
upstream_tls = {{ ca = "{ca}" }}
"#,
        https = ports.https,
        ca = pki.ca_pem.display(),
    );
    let running = start(config(&dir, &text)).await.expect("start");
    let addr = running.addr("raw-tls-up").expect("addr");
    for i in 0..6u8 {
        let src = format!("127.0.0.{}", 50 + i);
        let s = connect_from(src.parse().expect("ip"), addr).await;
        let (head, node) = get_over(s).await;
        assert_eq!(node, "b", "session {i} from {src}: {head}");
    }
    let a = running
        .runtime()
        .state()
        .node_views()
        .into_iter()
        .find(|v| v.name == "a")
        .map(|v| v.state);
    assert_eq!(
        a,
        Some(limpet_core::NodeState::Down),
        "a failed TLS every time"
    );
    running.stop().await;
    for n in &mut nodes {
        n.kill().await;
    }
}

/// An HTTPS listener (certificate for `print.example`) with `timeouts` in front of node a
/// (TLS-capable, on 127.0.0.2): the PKI, the nodes, the config's directory (kept as long as
/// limpet runs), limpet and the listener's address.
async fn https_on_one_node(
    tag: &str,
    timeouts: &str,
) -> (
    Pki,
    Vec<TestNode>,
    TempDir,
    limpet::runtime::Running,
    std::net::SocketAddr,
) {
    let pki = Pki::new();
    let (nodes, ports) = start_nodes(&[("a", "127.0.0.2")], pki.server("n", &["127.0.0.2"])).await;
    let (c, k) = pki.issue("limpet", &["print.example"]);
    let dir = TempDir::new(tag);
    let text = format!(
        "[[nodes]]\nname = \"a\"\naddress = \"127.0.0.2\"\n\n[[listeners]]\nname = \"https\"\n\
         bind = \"127.0.0.1:0\"\nnode_port = {http}\ntls = {{ cert = \"{c}\", key = \"{k}\" }}\n\
         timeouts = {{ {timeouts} }}\n",
        http = ports.http,
        c = c.display(),
        k = k.display(),
    );
    let running = start(config(&dir, &text)).await.expect("start");
    let addr = running.addr("https").expect("addr");
    (pki, nodes, dir, running, addr)
}

/// `header_read` runs from the connection's accept, the TLS handshake and the first request
/// head sharing it: a client that takes most of it to start its handshake, then sends no
/// request, is closed at `header_read` after it connected, not that long after the handshake
/// (chaos run: a slow handshake then silence held the slot for nearly twice the limit).
#[tokio::test]
async fn a_slow_handshake_and_the_first_request_head_share_header_read() {
    use tokio::io::AsyncReadExt;
    const HEADER_READ: std::time::Duration = std::time::Duration::from_secs(2);
    let (pki, mut nodes, _dir, running, addr) =
        https_on_one_node("tls-head-time", "header_read = \"2s\"").await;
    let s = connect_from("127.0.0.1".parse().expect("ip"), addr).await;
    let connected = std::time::Instant::now();
    // The client's own pace: most of `header_read` before its ClientHello.
    tokio::time::sleep(HEADER_READ * 3 / 5).await;
    let mut tls = tokio_rustls::TlsConnector::from(pki.client(&[b"http/1.1"]))
        .connect(ServerName::try_from("print.example").expect("name"), s)
        .await
        .expect("handshake within header_read");
    let mut buf = [0u8; 64];
    let closed = tokio::time::timeout(HEADER_READ * 3, tls.read(&mut buf)).await;
    let took = connected.elapsed();
    assert!(
        matches!(closed, Ok(Ok(0) | Err(_))),
        "closed without an answer: {closed:?}"
    );
    assert!(
        took >= HEADER_READ && took < HEADER_READ + HEADER_READ / 4,
        "closed {took:?} after connecting, header_read being {HEADER_READ:?}"
    );
    running.stop().await;
    for n in &mut nodes {
        n.kill().await;
    }
}

/// A node whose answer never ends: after each request head, a head with a 64 GiB
/// `Content-Length`, then bytes for as long as they are taken. When limpet stops taking them
/// (its connection closed), it says so on `released` with how long after the head it was.
async fn endless_answer_node(
    listener: tokio::net::TcpListener,
    released: tokio::sync::mpsc::UnboundedSender<std::time::Duration>,
) {
    use tokio::io::AsyncReadExt;
    while let Ok((mut s, _)) = listener.accept().await {
        let released = released.clone();
        tokio::spawn(async move {
            let mut head = Vec::new();
            let mut b = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut b).await {
                    Ok(n @ 1..) => head.extend_from_slice(&b[..n]),
                    _ => return,
                }
            }
            let started = std::time::Instant::now();
            let chunk = vec![b'x'; 64 * 1024];
            if s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 68719476736\r\n\r\n")
                .await
                .is_err()
            {
                return;
            }
            while s.write_all(&chunk).await.is_ok() {}
            let _ = released.send(started.elapsed());
        });
    }
}

/// A client of a TLS listener that stops reading an answer (HTTP/1.1, its socket no longer
/// read; HTTP/2, its stream's window left shut) holds it for `client_idle`, as a plain
/// client does: then its connection closes and the node connection behind it is released.
/// Under TLS the answer's bytes go through rustls's own buffer before the socket's, and that
/// buffer is bounded: a write blocked behind it is a stall like any other.
#[tokio::test]
async fn a_tls_client_that_stops_reading_an_answer_is_closed_after_client_idle() {
    use tokio::io::AsyncReadExt;
    const CLIENT_IDLE: std::time::Duration = std::time::Duration::from_millis(500);
    let pki = Pki::new();
    let node = tokio::net::TcpListener::bind("127.0.0.2:0")
        .await
        .expect("bind node");
    let node_port = node.local_addr().expect("node addr").port();
    let (released_tx, mut released) = tokio::sync::mpsc::unbounded_channel();
    let node = tokio::spawn(endless_answer_node(node, released_tx));
    let (c, k) = pki.issue("limpet", &["print.example"]);
    let dir = TempDir::new("tls-stall");
    let text = format!(
        "[[nodes]]\nname = \"a\"\naddress = \"127.0.0.2\"\n\n[[listeners]]\nname = \"https\"\n\
         bind = \"127.0.0.1:0\"\nnode_port = {node_port}\n\
         tls = {{ cert = \"{c}\", key = \"{k}\" }}\ntimeouts = {{ client_idle = \"500ms\" }}\n",
        c = c.display(),
        k = k.display(),
    );
    let running = start(config(&dir, &text)).await.expect("start");
    let addr = running.addr("https").expect("addr");
    let name = || ServerName::try_from("print.example").expect("name");

    // HTTP/1.1: the head read, then nothing more.
    let s = connect_from("127.0.0.1".parse().expect("ip"), addr).await;
    let mut tls = tokio_rustls::TlsConnector::from(pki.client(&[b"http/1.1"]))
        .connect(name(), s)
        .await
        .expect("handshake");
    tls.write_all(b"GET /big HTTP/1.1\r\nHost: print.example\r\n\r\n")
        .await
        .expect("write");
    let mut first = [0u8; 12];
    tls.read_exact(&mut first).await.expect("answer");
    assert_eq!(&first, b"HTTP/1.1 200");
    let took = tokio::time::timeout(common::PATIENCE, released.recv())
        .await
        .expect("HTTP/1.1: the node connection of a stalled answer is released in time")
        .expect("node runs");
    assert!(
        took >= CLIENT_IDLE * 4 / 5,
        "HTTP/1.1: released before client_idle: {took:?}"
    );
    // What is left in the buffers on the way, then the end: the connection is not held
    // open (closed or reset, the read ends).
    let mut sink = Vec::new();
    let end = tokio::time::timeout(common::PATIENCE, tls.read_to_end(&mut sink)).await;
    assert!(
        end.is_ok(),
        "HTTP/1.1: the client connection ended, {} bytes after the head",
        sink.len()
    );

    // HTTP/2: the answer's head taken, its body never read (hyper's client takes DATA up to
    // the stream's window, then the window stays shut).
    let s = connect_from("127.0.0.1".parse().expect("ip"), addr).await;
    let tls = tokio_rustls::TlsConnector::from(pki.client(&[b"h2"]))
        .connect(name(), s)
        .await
        .expect("handshake");
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .expect("h2 handshake");
    let conn_task = tokio::spawn(conn);
    let req = http::Request::builder()
        .uri("https://print.example/big")
        .body(Empty::<bytes::Bytes>::new())
        .expect("request");
    let resp = send.send_request(req).await.expect("h2 answer head");
    assert_eq!(resp.status(), 200);
    let took = tokio::time::timeout(common::PATIENCE, released.recv())
        .await
        .expect("HTTP/2: the node connection of a stalled answer is released in time")
        .expect("node runs");
    assert!(
        took >= CLIENT_IDLE * 4 / 5,
        "HTTP/2: released before client_idle: {took:?}"
    );
    let mut body = resp.into_body();
    let cut = tokio::time::timeout(common::PATIENCE, async {
        loop {
            match body.frame().await {
                Some(Ok(_)) => continue,
                Some(Err(e)) => return Err(e),
                None => return Ok(()),
            }
        }
    })
    .await
    .expect("HTTP/2: the stalled answer ends in time");
    assert!(
        cut.is_err(),
        "HTTP/2: the stalled answer was cut, not ended"
    );
    drop(send);
    conn_task.abort();
    running.stop().await;
    node.abort();
}

/// A WebSocket upgrade whose node holds its 101 as limpet starts shutting down: hyper
/// writes the 101 all the same (with `Connection: close`), and the tunnel then starts
/// already closing, so the client gets close 1001 ("going away") after it, as every other
/// tunnel at a shutdown. Before, the 101 was followed by the bare end of the connection: an
/// abnormal close (1006) for a browser.
#[tokio::test]
async fn an_upgrade_answered_as_limpet_shuts_down_gets_close_1001_after_its_101() {
    use tokio::io::AsyncReadExt;
    let pki = Pki::new();
    let (mut nodes, ports) =
        start_nodes(&[("a", "127.0.0.2")], pki.server("n", &["127.0.0.2"])).await;
    let dir = TempDir::new("upgrade-at-shutdown");
    let text = format!(
        "[[nodes]]\nname = \"a\"\naddress = \"127.0.0.2\"\n\n[[listeners]]\nname = \"web\"\n\
         bind = \"127.0.0.1:0\"\nnode_port = {http}\ntimeouts = {{ drain = \"10s\" }}\n",
        http = ports.http,
    );
    let running = start(config(&dir, &text)).await.expect("start");
    let addr = running.addr("web").expect("addr");
    let mut ws = connect_from("127.0.0.1".parse().expect("ip"), addr).await;
    ws.write_all(HELD_UPGRADE_REQUEST)
        .await
        .expect("send upgrade");
    tokio::time::timeout(common::PATIENCE, HELD_UPGRADES_ARRIVED.acquire())
        .await
        .expect("upgrade reached the node in time")
        .expect("semaphore open")
        .forget();
    let stopping = tokio::spawn(running.stop());
    // The shutdown has begun once limpet stops accepting.
    tokio::time::timeout(common::PATIENCE, async {
        while tokio::net::TcpStream::connect(addr).await.is_ok() {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("limpet stops accepting");
    HELD_UPGRADES_RELEASED.add_permits(1);
    let mut got = Vec::new();
    tokio::time::timeout(common::PATIENCE, ws.read_to_end(&mut got))
        .await
        .expect("the tunnel ends in time")
        .expect("read");
    let head_end = got
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| i + 4)
        .unwrap_or_else(|| panic!("no 101 head: {:?}", String::from_utf8_lossy(&got)));
    assert!(got.starts_with(b"HTTP/1.1 101"), "{got:?}");
    let frame = &got[head_end..];
    assert!(
        frame.len() >= 4 && frame[0] == 0x88 && frame[2..4] == [0x03, 0xe9],
        "a close frame 1001 after the 101, got {frame:?}"
    );
    tokio::time::timeout(common::PATIENCE, stopping)
        .await
        .expect("limpet stops in time")
        .expect("stop task");
    for n in &mut nodes {
        n.kill().await;
    }
}

/// The failure model's slow head on a later HTTP/2 stream, over TLS: rustls shows nothing
/// of a record until it is whole, so a head inside a record that never ends left an HTTP/2
/// connection looking idle between requests, open for `idle` (30 s here) instead of
/// `header_read`. A connection kept idle with whole records (the client's PINGs) is not
/// such a head: it stays open past `header_read` and serves its next request.
#[tokio::test]
async fn an_h2_tls_connection_left_inside_a_record_closes_at_header_read() {
    use tokio::io::AsyncReadExt;
    const HEADER_READ: std::time::Duration = std::time::Duration::from_secs(1);
    let (pki, mut nodes, _dir, running, addr) =
        https_on_one_node("tls-record-time", "header_read = \"1s\", idle = \"30s\"").await;
    let s = connect_from("127.0.0.1".parse().expect("ip"), addr).await;
    // A second handle on the socket, to write bytes under TLS and to see the close.
    let s = s.into_std().expect("std socket");
    let raw = s.try_clone().expect("clone");
    let s = tokio::net::TcpStream::from_std(s).expect("tokio socket");
    let silent = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let tls = tokio_rustls::TlsConnector::from(pki.client(&[b"h2"]))
        .connect(
            ServerName::try_from("print.example").expect("name"),
            Silenced {
                socket: s,
                silent: Arc::clone(&silent),
            },
        )
        .await
        .expect("handshake");
    let (mut send, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .timer(hyper_util::rt::TokioTimer::new())
        .keep_alive_interval(std::time::Duration::from_millis(200))
        .keep_alive_while_idle(true)
        .handshake(TokioIo::new(tls))
        .await
        .expect("h2 handshake");
    let conn_task = tokio::spawn(conn);
    let get = |send: &mut hyper::client::conn::http2::SendRequest<Empty<bytes::Bytes>>| {
        let req = http::Request::builder()
            .uri("https://print.example/")
            .body(Empty::<bytes::Bytes>::new())
            .expect("request");
        send.send_request(req)
    };
    let first = get(&mut send).await.expect("first answer");
    assert_eq!(first.status(), 200);
    first.into_body().collect().await.expect("first body");
    // Idle for over twice `header_read`, PINGs coming in whole records: still open.
    tokio::time::sleep(HEADER_READ * 5 / 2).await;
    let second = get(&mut send).await.expect("answered after PINGs alone");
    assert_eq!(second.status(), 200);
    second.into_body().collect().await.expect("second body");
    // The client's TLS side goes quiet (nothing it writes reaches the socket, which stays
    // open through `raw`), and an application-data record of 100 bytes begins under it:
    // its header and three bytes.
    silent.store(true, std::sync::atomic::Ordering::Relaxed);
    drop(send);
    conn_task.abort();
    let _ = conn_task.await;
    let mut raw = tokio::net::TcpStream::from_std(raw).expect("tokio socket");
    raw.write_all(&[23, 3, 3, 0, 100, 1, 2, 3])
        .await
        .expect("a record begun");
    let begun = std::time::Instant::now();
    let mut buf = [0u8; 1024];
    let closed = tokio::time::timeout(HEADER_READ * 4, async {
        loop {
            match raw.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {} // GOAWAY, close_notify
            }
        }
    })
    .await;
    let took = begun.elapsed();
    assert!(
        closed.is_ok(),
        "still open {took:?} after the record began, header_read being {HEADER_READ:?}"
    );
    assert!(
        took >= HEADER_READ && took < HEADER_READ * 3,
        "closed {took:?} after the record began, header_read being {HEADER_READ:?}"
    );
    running.stop().await;
    for n in &mut nodes {
        n.kill().await;
    }
}

/// A client's socket that can be silenced: from then on what is written to it is dropped, its
/// shutdown does nothing and nothing is read from it, so another handle on the socket has it
/// to itself.
struct Silenced {
    socket: tokio::net::TcpStream,
    silent: Arc<std::sync::atomic::AtomicBool>,
}

impl Silenced {
    fn is_silent(&self) -> bool {
        self.silent.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl tokio::io::AsyncRead for Silenced {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if self.is_silent() {
            return std::task::Poll::Pending;
        }
        std::pin::Pin::new(&mut self.socket).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Silenced {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        if self.is_silent() {
            return std::task::Poll::Ready(Ok(buf.len()));
        }
        std::pin::Pin::new(&mut self.socket).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if self.is_silent() {
            return std::task::Poll::Ready(Ok(()));
        }
        std::pin::Pin::new(&mut self.socket).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if self.is_silent() {
            return std::task::Poll::Ready(Ok(()));
        }
        std::pin::Pin::new(&mut self.socket).poll_shutdown(cx)
    }
}
