//! A WebSocket that limpet ends is closed with 1001 and a reason naming the cause, as a client
//! sees it through a real listener: MAINT set through the admin API (`node in maintenance`),
//! the node going DOWN by its active checks (`node down`, `close_on_node_down` being on by
//! default for every listener), while a listener with `close_on_node_down = false` keeps its
//! WebSocket to the DOWN node open. (The drain deadline and shutdown reasons are tested in
//! `admin_drain_websocket.rs` and `reload_signals.rs`.)

mod admin_common;

use std::net::SocketAddr;

use admin_common::lifecycle::*;
use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

type Ws = WebSocketStream<MaybeTlsStream<tokio::net::TcpStream>>;

/// A WebSocket through `listener` pinned to `node` by its cookie; checks the node's greeting.
async fn ws_to(listener: SocketAddr, node: &str) -> Ws {
    let mut req = format!("ws://{listener}/ws")
        .into_client_request()
        .unwrap_or_else(|e| panic!("{e}"));
    req.headers_mut().insert(
        "cookie",
        format!("route={node}")
            .parse()
            .unwrap_or_else(|e| panic!("{e}")),
    );
    let mut ws = match tokio::time::timeout(PATIENCE, tokio_tungstenite::connect_async(req)).await {
        Ok(Ok((ws, _))) => ws,
        Ok(Err(e)) => panic!("websocket to {node}: {e}"),
        Err(_) => panic!("websocket to {node}: no answer"),
    };
    match tokio::time::timeout(PATIENCE, ws.next()).await {
        Ok(Some(Ok(Message::Text(t)))) => assert_eq!(t.as_str(), node, "greeting"),
        other => panic!("no greeting from {node}: {other:?}"),
    }
    ws
}

/// The close frame the client gets next: its code and reason.
async fn close_of(ws: &mut Ws, what: &str) -> (CloseCode, String) {
    loop {
        match tokio::time::timeout(PATIENCE, ws.next()).await {
            Ok(Some(Ok(Message::Close(Some(f))))) => return (f.code, f.reason.to_string()),
            Ok(Some(Ok(Message::Ping(_) | Message::Pong(_)))) => {}
            other => panic!("{what}: expected a close frame, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websockets_close_with_the_cause_on_maint_and_on_down() {
    let nodes = [("a", "127.0.0.2"), ("b", "127.0.0.3")];
    let (_backends, port) = backend_nodes(&nodes).await;
    // a's active check probes a port of this test's: closing it takes a DOWN.
    let check_target = TcpListener::bind("127.0.0.2:0")
        .await
        .unwrap_or_else(|e| panic!("bind check target: {e}"));
    let check_port = check_target.local_addr().map(|a| a.port()).unwrap_or(0);
    let check_task = tokio::spawn(async move {
        while let Ok((s, _)) = check_target.accept().await {
            drop(s);
        }
    });
    let text = format!(
        "[[nodes]]\nname = \"a\"\naddress = \"127.0.0.2\"\ncheck_port = {check_port}\n\n\
         [[nodes]]\nname = \"b\"\naddress = \"127.0.0.3\"\n\n\
         [health]\nfall = 2\nrise = 1\ninterval = \"100ms\"\ntimeout = \"200ms\"\n\n\
         [[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = {port}\n\
         check = {{ kind = \"tcp\" }}\n\n\
         [[listeners]]\nname = \"keep\"\nbind = \"127.0.0.1:0\"\nnode_port = {port}\n\
         close_on_node_down = false\n\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n"
    );
    let cfg = ConfigFile::new("ws-close-reasons", &text);
    let l = Limpet::start(&cfg).await;
    let (web, keep) = (l.addr("web"), l.addr("keep"));

    // MAINT through the admin API.
    let mut ws = ws_to(web, "a").await;
    let v = set_state(&l, "a", r#"{"state":"maint"}"#).await;
    assert_eq!(v["state"], "MAINT", "{v}");
    assert_eq!(
        close_of(&mut ws, "MAINT").await,
        (CloseCode::Away, "node in maintenance".to_owned())
    );
    let v = set_state(&l, "a", r#"{"state":"ready"}"#).await;
    assert_eq!(v["state"], "UP", "{v}");

    // DOWN by checks: the default listener closes, the one that opted out keeps relaying.
    let mut closing = ws_to(web, "a").await;
    let mut kept = ws_to(keep, "a").await;
    check_task.abort();
    let _ = check_task.await;
    assert_eq!(
        close_of(&mut closing, "DOWN").await,
        (CloseCode::Away, "node down".to_owned())
    );
    assert_eq!(node_view(&l, "a").await["state"], "DOWN");
    kept.send(Message::text("still here"))
        .await
        .unwrap_or_else(|e| panic!("send on the kept WebSocket: {e}"));
    match tokio::time::timeout(PATIENCE, kept.next()).await {
        Ok(Some(Ok(Message::Text(t)))) => assert_eq!(t.as_str(), "still here"),
        other => panic!("close_on_node_down = false: the WebSocket should stay open: {other:?}"),
    }
    drop((ws, closing, kept));
    l.stop().await;
}

/// A reload that removes a node ends the WebSockets open to it as MAINT would, whatever
/// generation opened them: close 1001 with the MAINT reason, promptly. The socket on the node
/// that stays goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_removes_a_node_closes_its_websockets() {
    let nodes = [("a", "127.0.0.2"), ("b", "127.0.0.3")];
    let (_backends, port) = backend_nodes(&nodes).await;
    let listener = format!(
        "[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = {port}\n\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n"
    );
    let cfg = ConfigFile::new("ws-removed", &format!("{}{listener}", nodes_toml(&nodes)));
    let l = Limpet::start(&cfg).await;
    let web = l.addr("web");
    let mut on_a = ws_to(web, "a").await;
    let mut on_b = ws_to(web, "b").await;

    cfg.write(&format!("{}{listener}", nodes_toml(&nodes[1..])));
    let (s, v) = reload(&l).await;
    assert_eq!(s, 200, "{v}");
    let removed_at = tokio::time::Instant::now();
    assert_eq!(
        close_of(&mut on_a, "a removed").await,
        (CloseCode::Away, "node in maintenance".to_owned())
    );
    assert!(
        removed_at.elapsed() < std::time::Duration::from_secs(2),
        "closed {:?} after the reload",
        removed_at.elapsed()
    );
    on_b.send(Message::text("still here"))
        .await
        .unwrap_or_else(|e| panic!("send on b's WebSocket: {e}"));
    match tokio::time::timeout(PATIENCE, on_b.next()).await {
        Ok(Some(Ok(Message::Text(t)))) => assert_eq!(t.as_str(), "still here"),
        other => panic!("b's WebSocket should stay open: {other:?}"),
    }
    drop((on_a, on_b));
    l.stop().await;
}
