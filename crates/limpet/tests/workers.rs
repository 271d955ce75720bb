//! Thread per core (`--threads N`): the sockets of one listener, one per worker thread, share
//! the listener's `max_connections`. A worker waiting for its next client must not hold a
//! permit that a client arriving on another worker's socket needs.

mod common;

use common::multiport::{config, get_over, TempDir};
use common::{Node, PATIENCE};
use limpet::runtime::run::start_with;

/// `max_connections = 1` on a listener served by two workers: one client at a time, whichever
/// socket the kernel hands each connection to, is served at once. (With a permit taken before
/// accepting, the idle worker kept the only permit and every client that landed on the other
/// worker's socket waited for ever.)
#[tokio::test]
async fn one_permit_serves_clients_on_every_workers_socket() {
    let node = Node::start("a").await;
    let dir = TempDir::new("workers-permits");
    let text = format!(
        r#"
[[nodes]]
name = "a"
address = "127.0.0.1"

[[listeners]]
name = "web"
bind = "127.0.0.1:0"
mode = "http"
node_port = {port}
max_connections = 1
"#,
        port = node.addr.port()
    );
    let running = start_with(config(&dir, &text), 2).await.expect("start");
    let addr = running.addr("web").expect("bound");
    // 30 connections, one after the other, from distinct source ports: they spread over
    // both sockets (all on one would take odds of 2^-29).
    for i in 0..30 {
        let s = tokio::time::timeout(PATIENCE, tokio::net::TcpStream::connect(addr))
            .await
            .expect("connect in time")
            .expect("connect");
        let (head, _) = tokio::time::timeout(PATIENCE, get_over(s))
            .await
            .unwrap_or_else(|_| panic!("client {i} was never served"));
        assert!(head.starts_with("HTTP/1.1 200"), "client {i}: {head}");
    }
    tokio::time::timeout(PATIENCE, running.stop())
        .await
        .expect("stops");
}
