//! limpet-client's adapters against limpet itself on loopback: the reqwest cookie store keeps
//! the pin and follows a re-pin; the WebSocket helper adopts the cookie from a 101 and from a
//! refused upgrade.

mod common;

use std::sync::Arc;

use common::{config, nodes, Proxy, PATIENCE};
use futures_util::StreamExt;
use limpet_client::reqwest::AffinityCookieStore;
use limpet_client::{AffinityJar, Origin, SharedJar};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

fn jar_for(proxy: &Proxy) -> SharedJar {
    let origin = Origin::parse(&proxy.url("/")).expect("proxy origin");
    SharedJar::new(AffinityJar::new(origin))
}

fn client_with(jar: &SharedJar) -> reqwest::Client {
    reqwest::Client::builder()
        .cookie_provider(Arc::new(AffinityCookieStore::new(jar.clone())))
        .timeout(PATIENCE)
        .build()
        .expect("client")
}

async fn node_of_get(client: &reqwest::Client, url: &str) -> String {
    let resp = client.get(url).send().await.expect("request");
    assert_eq!(resp.status(), 200);
    common::node_of(&resp)
}

#[tokio::test]
async fn reqwest_store_keeps_the_pin_and_follows_a_repin() {
    let mut ns = nodes(&["a", "b", "c"]).await;
    let proxy = Proxy::start(config(&ns)).await;
    let jar = jar_for(&proxy);
    let client = client_with(&jar);
    let url = proxy.url("/");

    let pinned = node_of_get(&client, &url).await;
    assert_eq!(
        jar.get("route").as_deref(),
        Some(pinned.as_str()),
        "pin adopted"
    );
    for _ in 0..5 {
        assert_eq!(node_of_get(&client, &url).await, pinned, "stays pinned");
    }

    // The pinned node dies: the next answer comes from another node and rewrites the pin.
    let victim = ns
        .iter_mut()
        .find(|n| n.name == pinned)
        .expect("pinned node");
    victim.kill().await;
    let moved = node_of_get(&client, &url).await;
    assert_ne!(moved, pinned);
    assert_eq!(
        jar.get("route").as_deref(),
        Some(moved.as_str()),
        "pin rewritten"
    );
    for _ in 0..3 {
        assert_eq!(
            node_of_get(&client, &url).await,
            moved,
            "stays on the new node"
        );
    }
    proxy.stop().await;
}

#[tokio::test]
async fn websocket_adopts_the_101_cookie_and_http_follows_the_socket() {
    let ns = nodes(&["a", "b", "c"]).await;
    let proxy = Proxy::start(config(&ns)).await;
    // Take a turn of the rotation so the socket's node is not simply the first one.
    let _ = node_of_get(&common::plain_client(), &proxy.url("/")).await;

    let jar = jar_for(&proxy);
    let ws_url = format!("ws://{}/ws", proxy.addr);
    let (mut ws, resp) = limpet_client::tungstenite::connect_async(&jar, ws_url.as_str())
        .await
        .expect("upgrade");
    assert_eq!(resp.status(), 101);
    let first = tokio::time::timeout(PATIENCE, ws.next())
        .await
        .expect("a frame in time")
        .expect("a frame")
        .expect("no error");
    let Message::Text(socket_node) = first else {
        panic!("expected the node's name first, got {first:?}");
    };
    assert_eq!(
        jar.get("route").as_deref(),
        Some(socket_node.as_str()),
        "101 cookie adopted"
    );

    // HTTP with the same jar lands on the socket's node.
    let client = client_with(&jar);
    for _ in 0..3 {
        assert_eq!(node_of_get(&client, &proxy.url("/")).await, socket_node);
    }
    proxy.stop().await;
}

#[tokio::test]
async fn websocket_adopts_the_cookie_of_a_refused_upgrade() {
    let ns = nodes(&["a", "b"]).await;
    let proxy = Proxy::start(config(&ns)).await;
    let jar = jar_for(&proxy);
    let refused = format!("ws://{}/ws-refuse?status=503", proxy.addr);
    let err = limpet_client::tungstenite::connect_async(&jar, refused.as_str())
        .await
        .expect_err("the node refuses the upgrade");
    let WsError::Http(resp) = &err else {
        panic!("expected an HTTP refusal, got {err:?}");
    };
    assert_eq!(resp.status(), 503);
    let pinned = jar.get("route").expect("the refusal's cookie is adopted");

    // The retried upgrade carries that cookie and lands on the same node.
    let (mut ws, _) =
        limpet_client::tungstenite::connect_async(&jar, format!("ws://{}/ws", proxy.addr).as_str())
            .await
            .expect("upgrade");
    let first = tokio::time::timeout(PATIENCE, ws.next())
        .await
        .expect("a frame in time")
        .expect("a frame")
        .expect("no error");
    assert_eq!(first, Message::Text(pinned.clone()));
    proxy.stop().await;
}
