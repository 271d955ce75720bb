//! WebSocket (and any Upgrade) through the proxy: the upgrade takes the affinity path, the 101
//! and refusals carry the cookie, frames pass both ways.

mod common;

use common::{config, jar_client, node_of, nodes, set_cookie_in, Proxy, PATIENCE};
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Opens a WebSocket with an optional Cookie header; returns the socket and the 101's head.
async fn open(
    proxy: &Proxy,
    path: &str,
    cookie: Option<&str>,
) -> Result<(Ws, http::HeaderMap), WsError> {
    let mut req = format!("ws://{}{}", proxy.addr, path)
        .into_client_request()
        .expect("ws request");
    if let Some(c) = cookie {
        req.headers_mut()
            .insert("cookie", c.parse().expect("cookie header"));
    }
    let (ws, resp) = tokio::time::timeout(PATIENCE, tokio_tungstenite::connect_async(req))
        .await
        .expect("upgrade in time")?;
    Ok((ws, resp.headers().clone()))
}

/// The first frame a demo node sends: its name.
async fn greeting(ws: &mut Ws) -> String {
    match tokio::time::timeout(PATIENCE, ws.next()).await {
        Ok(Some(Ok(Message::Text(t)))) => t,
        other => panic!("expected the node's name, got {other:?}"),
    }
}

fn pair(set_cookie: &str) -> &str {
    set_cookie.split(';').next().unwrap_or("")
}

#[tokio::test]
async fn socket_first_then_http_with_the_101_cookie_lands_on_the_socket_node() {
    let ns = nodes(&["a", "b", "c"]).await;
    let proxy = Proxy::start(config(&ns)).await;
    // Move the rotation so the socket's node is not simply the first one.
    let _ = reqwest::get(proxy.url("/")).await.expect("warm");

    let (mut ws, head) = open(&proxy, "/ws", None).await.expect("upgrade");
    let cookie = set_cookie_in(&head).expect("the 101 carries the pin");
    let socket_node = greeting(&mut ws).await;
    assert!(
        cookie.starts_with(&format!("route={socket_node};")),
        "{cookie}"
    );

    let client = reqwest::Client::new();
    for _ in 0..3 {
        let resp = client
            .get(proxy.url("/"))
            .header("cookie", pair(&cookie))
            .send()
            .await
            .expect("get");
        assert_eq!(node_of(&resp), socket_node);
    }
    ws.close(None).await.expect("close");
    proxy.stop().await;
}

#[tokio::test]
async fn http_first_then_the_upgrade_lands_where_the_requests_went() {
    let ns = nodes(&["a", "b", "c"]).await;
    let proxy = Proxy::start(config(&ns)).await;
    let client = jar_client();
    let resp = client.get(proxy.url("/")).send().await.expect("get");
    let http_node = node_of(&resp);
    let cookie = common::set_cookie(&resp).expect("pinned");

    let (mut ws, head) = open(&proxy, "/ws", Some(pair(&cookie)))
        .await
        .expect("upgrade");
    assert!(
        set_cookie_in(&head).is_none(),
        "a sticky upgrade sends no new cookie"
    );
    assert_eq!(greeting(&mut ws).await, http_node);
    ws.close(None).await.expect("close");
    proxy.stop().await;
}

#[tokio::test]
async fn frames_pass_both_ways() {
    let ns = nodes(&["a"]).await;
    let proxy = Proxy::start(config(&ns)).await;
    let (mut ws, _) = open(&proxy, "/ws", None).await.expect("upgrade");
    assert_eq!(greeting(&mut ws).await, "a");
    for i in 0..20 {
        let text = format!("hello {i}");
        ws.send(Message::Text(text.clone())).await.expect("send");
        match tokio::time::timeout(PATIENCE, ws.next()).await {
            Ok(Some(Ok(Message::Text(t)))) => assert_eq!(t, text),
            other => panic!("echo: {other:?}"),
        }
    }
    let big = vec![7u8; 1 << 20];
    ws.send(Message::Binary(big.clone())).await.expect("send");
    match tokio::time::timeout(PATIENCE, ws.next()).await {
        Ok(Some(Ok(Message::Binary(b)))) => assert_eq!(b, big),
        other => panic!("echo: {other:?}"),
    }
    ws.close(None).await.expect("close");
    proxy.stop().await;
}

#[tokio::test]
async fn a_refused_upgrade_carries_the_cookie_too() {
    let ns = nodes(&["a", "b"]).await;
    let proxy = Proxy::start(config(&ns)).await;
    match open(&proxy, "/ws-refuse?status=503", None).await {
        Err(WsError::Http(resp)) => {
            assert_eq!(resp.status(), 503);
            let node = common::node_in(resp.headers());
            let cookie = set_cookie_in(resp.headers()).expect("refusal carries the pin");
            assert!(cookie.starts_with(&format!("route={node};")), "{cookie}");
        }
        other => panic!("expected a refusal, got {:?}", other.map(|(_, h)| h)),
    }
    proxy.stop().await;
}

#[tokio::test]
async fn an_idle_tunnel_is_closed() {
    let ns = nodes(&["a"]).await;
    let mut cfg = config(&ns);
    cfg.timeouts.tunnel_idle = std::time::Duration::from_millis(200);
    let proxy = Proxy::start(cfg).await;
    let (mut ws, _) = open(&proxy, "/ws", None).await.expect("upgrade");
    assert_eq!(greeting(&mut ws).await, "a");
    // Say nothing: the proxy must end the tunnel, which the client sees as the stream ending.
    let end = tokio::time::timeout(PATIENCE, async {
        loop {
            match ws.next().await {
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => break,
                Some(Ok(_)) => {}
            }
        }
    })
    .await;
    assert!(end.is_ok(), "idle tunnel closed");
    proxy.stop().await;
}
