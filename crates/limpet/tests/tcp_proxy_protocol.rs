//! PROXY protocol: a trusted balancer in front of limpet names the real client, and source-IP
//! affinity follows that client across HTTP and TCP listeners; an untrusted peer's header is
//! plain payload; limpet sends v1/v2 headers to nodes.

mod common;

use std::net::SocketAddr;

use common::multiport::*;
use limpet::runtime::start;
use limpet_core::proxy_protocol;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

fn v1(src: &str, dst: SocketAddr) -> Vec<u8> {
    let mut h = Vec::new();
    proxy_protocol::write_v1(format!("{src}:40000").parse().expect("src"), dst, &mut h);
    h
}

fn v2(src: &str, dst: SocketAddr) -> Vec<u8> {
    let mut h = Vec::new();
    proxy_protocol::write_v2(format!("{src}:40000").parse().expect("src"), dst, &mut h);
    h
}

#[tokio::test]
async fn source_ip_affinity_follows_the_client_the_header_names() {
    let pki = Pki::new();
    let (mut nodes, ports) = start_nodes(
        &[("a", "127.0.0.2"), ("b", "127.0.0.3")],
        pki.server("n", &["127.0.0.2"]),
    )
    .await;
    let dir = TempDir::new("pp");
    let text = format!(
        r#"
[[nodes]]
name = "a"
address = "127.0.0.2"
[[nodes]]
name = "b"
address = "127.0.0.3"
[[tables]]
name = "t"
key = "source-ip"
[[listeners]]
name = "web"
bind = "127.0.0.1:0"
node_port = {http}
table = "t"
proxy_protocol = {{ accept_from = ["127.0.0.1/32"] }}
[[listeners]]
name = "raw"
bind = "127.0.0.1:0"
mode = "tcp"
node_port = {tcp}
table = "t"
proxy_protocol = {{ accept_from = ["127.0.0.1"] }}
"#,
        http = ports.http,
        tcp = ports.tcp
    );
    let running = start(config(&dir, &text)).await.expect("start");
    let raw = running.addr("raw").expect("raw");
    let web = running.addr("web").expect("web");

    // Two real clients behind one balancer (127.0.0.1): each header names its client.
    let mut homes = Vec::new();
    for client in ["198.51.100.7", "198.51.100.8"] {
        let mut s = connect_from("127.0.0.1".parse().expect("ip"), raw).await;
        s.write_all(&v1(client, raw)).await.expect("header");
        let node = read_line(&mut s)
            .await
            .trim_start_matches("node=")
            .to_owned();
        homes.push(node);
    }
    assert_ne!(
        homes[0], homes[1],
        "round-robin gives the two clients different nodes"
    );
    // Each client keeps its node on the TCP port (v2 header this time) and the HTTP port.
    for (client, home) in ["198.51.100.7", "198.51.100.8"].iter().zip(&homes) {
        let mut s = connect_from("127.0.0.1".parse().expect("ip"), raw).await;
        s.write_all(&v2(client, raw)).await.expect("header");
        assert_eq!(
            &read_line(&mut s)
                .await
                .trim_start_matches("node=")
                .to_owned(),
            home
        );
        let mut s = connect_from("127.0.0.1".parse().expect("ip"), web).await;
        s.write_all(&v1(client, web)).await.expect("header");
        assert_eq!(
            &get_over(s).await.1,
            home,
            "HTTP listener, same table, same node"
        );
    }

    // From an untrusted address the header is not read: it is payload, echoed back as sent.
    let mut s = connect_from("127.0.0.9".parse().expect("ip"), raw).await;
    let _greeting = read_line(&mut s).await;
    let h = v1("198.51.100.7", raw);
    s.write_all(&h).await.expect("send");
    let mut back = vec![0u8; h.len()];
    s.read_exact(&mut back).await.expect("echo");
    assert_eq!(back, h);

    // A malformed header from a trusted peer is refused.
    let mut s = connect_from("127.0.0.1".parse().expect("ip"), raw).await;
    s.write_all(b"PROXY TCP4 nonsense\r\n").await.expect("send");
    let mut b = [0u8; 16];
    let n = tokio::time::timeout(common::PATIENCE, s.read(&mut b))
        .await
        .expect("closed");
    assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");

    running.stop().await;
    for n in &mut nodes {
        n.kill().await;
    }
}

#[tokio::test]
async fn headers_are_sent_to_nodes() {
    for (version, want_v2) in [("v1", false), ("v2", true)] {
        // A node that reports the PROXY header it got.
        let node = TcpListener::bind("127.0.0.2:0").await.expect("bind");
        let port = node.local_addr().expect("addr").port();
        let task = tokio::spawn(async move {
            let (mut s, _) = node.accept().await.expect("accept");
            let mut buf = Vec::new();
            loop {
                let mut chunk = [0u8; 256];
                let n = s.read(&mut chunk).await.expect("read");
                assert!(n > 0, "closed before a header");
                buf.extend_from_slice(&chunk[..n]);
                match proxy_protocol::parse(&buf) {
                    Ok(p) => {
                        let reply = format!("{:?} {:?}\n", p.version, p.header);
                        s.write_all(reply.as_bytes()).await.expect("reply");
                        return;
                    }
                    Err(proxy_protocol::ParseError::Incomplete) => continue,
                    Err(e) => panic!("{e}"),
                }
            }
        });
        let dir = TempDir::new("pp-send");
        let text = format!(
            "[[nodes]]\nname = \"n\"\naddress = \"127.0.0.2\"\n[[listeners]]\nname = \"raw\"\nbind = \"127.0.0.1:0\"\nmode = \"tcp\"\nnode_port = {port}\nproxy_protocol = {{ send = \"{version}\" }}\n"
        );
        let running = start(config(&dir, &text)).await.expect("start");
        let raw = running.addr("raw").expect("raw");
        let mut s = connect_from("127.0.0.77".parse().expect("ip"), raw).await;
        let client = s.local_addr().expect("local");
        let line = read_line(&mut s).await;
        let want = format!(
            "{} Proxied {{ src: {client}, dst: {raw} }}",
            if want_v2 { "V2" } else { "V1" }
        );
        assert_eq!(line, want);
        task.await.expect("node task");
        running.stop().await;
    }
}
