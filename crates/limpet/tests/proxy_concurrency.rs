//! Concurrent first requests on one client connection agree on one node and one cookie:
//! HTTP/2 streams (h2c prior knowledge) and pipelined HTTP/1.1.

mod common;

use std::collections::BTreeSet;

use bytes::Bytes;
use common::{config, nodes, raw_exchange, set_cookie_in, Proxy, PATIENCE};
use http_body_util::Empty;
use hyper_util::rt::{TokioExecutor, TokioIo};

#[tokio::test]
async fn concurrent_first_requests_on_one_h2_connection_land_on_one_node() {
    let ns = nodes(&["a", "b", "c"]).await;
    let proxy = Proxy::start(config(&ns)).await;

    let stream = tokio::net::TcpStream::connect(proxy.addr)
        .await
        .expect("connect");
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("h2 handshake");
    let conn_task = tokio::spawn(conn);

    let requests = (0..16).map(|i| {
        let mut sender = sender.clone();
        let uri = format!("http://{}/req/{i}", proxy.addr);
        async move {
            let req = http::Request::get(uri)
                .body(Empty::<Bytes>::new())
                .expect("request");
            sender.send_request(req).await.expect("answer")
        }
    });
    let answers = tokio::time::timeout(PATIENCE, futures_util::future::join_all(requests))
        .await
        .expect("answers in time");

    let mut nodes_seen = BTreeSet::new();
    let mut cookies = BTreeSet::new();
    for resp in &answers {
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.version(), http::Version::HTTP_2);
        nodes_seen.insert(
            resp.headers()
                .get("x-limpet-node")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned(),
        );
        cookies.insert(
            set_cookie_in(resp.headers())
                .expect("each answer pins until the client sends the cookie"),
        );
    }
    assert_eq!(nodes_seen.len(), 1, "{nodes_seen:?}");
    assert_eq!(cookies.len(), 1, "{cookies:?}");

    drop(sender);
    conn_task.abort();
    proxy.stop().await;
}

#[tokio::test]
async fn pipelined_first_requests_land_on_one_node() {
    let ns = nodes(&["a", "b", "c"]).await;
    let proxy = Proxy::start(config(&ns)).await;
    let req = "GET / HTTP/1.1\r\nHost: t\r\n\r\n".repeat(4)
        + "GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";
    let answer = raw_exchange(proxy.addr, req.as_bytes()).await;
    let lower = answer.to_ascii_lowercase();
    let nodes_seen: BTreeSet<&str> = lower
        .lines()
        .filter_map(|l| l.strip_prefix("x-limpet-node: "))
        .collect();
    let cookies: Vec<&str> = lower
        .lines()
        .filter_map(|l| l.strip_prefix("set-cookie: "))
        .collect();
    assert_eq!(lower.matches("http/1.1 200").count(), 5, "{answer}");
    assert_eq!(nodes_seen.len(), 1, "{answer}");
    assert_eq!(cookies.len(), 5, "{answer}");
    assert!(cookies.iter().all(|c| *c == cookies[0]));
    proxy.stop().await;
}
