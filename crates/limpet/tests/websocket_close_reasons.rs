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

/// Nodes a and b, a's `tcp` check aimed at a port of the test's (`check_task` accepts there:
/// aborting it takes a DOWN), and limpet with two HTTP listeners: `web`, and `keep` with
/// `close_on_node_down = false`.
struct Checked {
    _backends: Vec<BackendNode>,
    check_task: tokio::task::JoinHandle<()>,
    l: Limpet,
    web: SocketAddr,
    keep: SocketAddr,
    cfg: ConfigFile,
    text: String,
}

async fn checked(tag: &str) -> Checked {
    let nodes = [("a", "127.0.0.2"), ("b", "127.0.0.3")];
    let (_backends, port) = backend_nodes(&nodes).await;
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
    let cfg = ConfigFile::new(tag, &text);
    let l = Limpet::start(&cfg).await;
    let (web, keep) = (l.addr("web"), l.addr("keep"));
    Checked {
        _backends,
        check_task,
        l,
        web,
        keep,
        cfg,
        text,
    }
}

/// Sets a to MAINT through the admin API: `ws`, on a, gets 1001 `node in maintenance`; then
/// a is READY (UP) again.
async fn maint_closes_it_then_ready(l: &Limpet, ws: &mut Ws, what: &str) {
    let v = set_state(l, "a", r#"{"state":"maint"}"#).await;
    assert_eq!(v["state"], "MAINT", "{v}");
    assert_eq!(
        close_of(ws, what).await,
        (CloseCode::Away, "node in maintenance".to_owned())
    );
    let v = set_state(l, "a", r#"{"state":"ready"}"#).await;
    assert_eq!(v["state"], "UP", "{v}");
}

/// Takes a DOWN by its check (the check's target stops): `closing` (on `web`) gets 1001
/// `node down`, and `kept` (on `keep`, `close_on_node_down = false`) keeps relaying.
async fn down_closes_one_and_keeps_the_other(
    l: &Limpet,
    check_task: tokio::task::JoinHandle<()>,
    closing: &mut Ws,
    kept: &mut Ws,
    what: &str,
) {
    check_task.abort();
    let _ = check_task.await;
    assert_eq!(
        close_of(closing, what).await,
        (CloseCode::Away, "node down".to_owned())
    );
    assert_eq!(node_view(l, "a").await["state"], "DOWN");
    kept.send(Message::text("still here"))
        .await
        .unwrap_or_else(|e| panic!("send on the kept WebSocket: {e}"));
    match tokio::time::timeout(PATIENCE, kept.next()).await {
        Ok(Some(Ok(Message::Text(t)))) => assert_eq!(t.as_str(), "still here"),
        other => panic!("close_on_node_down = false: the WebSocket should stay open: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websockets_close_with_the_cause_on_maint_and_on_down() {
    let Checked {
        _backends,
        check_task,
        l,
        web,
        keep,
        ..
    } = checked("ws-close-reasons").await;

    // MAINT through the admin API.
    let mut ws = ws_to(web, "a").await;
    maint_closes_it_then_ready(&l, &mut ws, "MAINT").await;

    // DOWN by checks: the default listener closes, the one that opted out keeps relaying.
    let mut closing = ws_to(web, "a").await;
    let mut kept = ws_to(keep, "a").await;
    down_closes_one_and_keeps_the_other(&l, check_task, &mut closing, &mut kept, "DOWN").await;
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

/// What a close signal does to a tunnel follows the protocol the node switched to (its 101's
/// `Upgrade`), not the first the client offered: a client offering `websocket, x-test` that
/// the node switches to WebSocket gets close 1001 `node in maintenance` at MAINT. (Before,
/// the offer's first value alone decided: this tunnel was taken for a byte stream and
/// reset.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_offered_beside_another_protocol_closes_with_1001() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    // The node: switches to WebSocket, then holds the tunnel open.
    let node = TcpListener::bind("127.0.0.2:0")
        .await
        .unwrap_or_else(|e| panic!("bind node: {e}"));
    let port = node.local_addr().map(|a| a.port()).unwrap_or(0);
    let node_task = tokio::spawn(async move {
        while let Ok((mut s, _)) = node.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    match s.read(&mut byte).await {
                        Ok(1) => head.push(byte[0]),
                        _ => return,
                    }
                }
                let _ = s
                    .write_all(
                        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\
                          Connection: Upgrade\r\n\
                          Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n",
                    )
                    .await;
                let mut sink = [0u8; 1024];
                while s.read(&mut sink).await.is_ok_and(|n| n > 0) {}
            });
        }
    });
    let text = format!(
        "[[nodes]]\nname = \"a\"\naddress = \"127.0.0.2\"\n\n\
         [[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = {port}\n\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n"
    );
    let cfg = ConfigFile::new("ws-offered-beside", &text);
    let l = Limpet::start(&cfg).await;
    let mut c = tokio::net::TcpStream::connect(l.addr("web"))
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"));
    c.write_all(
        b"GET /ws HTTP/1.1\r\nHost: t\r\nConnection: Upgrade\r\n\
          Upgrade: websocket, x-test\r\nSec-WebSocket-Version: 13\r\n\
          Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
    )
    .await
    .unwrap_or_else(|e| panic!("upgrade request: {e}"));
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match tokio::time::timeout(PATIENCE, c.read(&mut byte)).await {
            Ok(Ok(1)) => head.push(byte[0]),
            other => panic!(
                "the 101: {other:?} after {:?}",
                String::from_utf8_lossy(&head)
            ),
        }
    }
    assert!(
        head.starts_with(b"HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    let v = set_state(&l, "a", r#"{"state":"maint"}"#).await;
    assert_eq!(v["state"], "MAINT", "{v}");
    let mut close = [0u8; 4];
    tokio::time::timeout(PATIENCE, c.read_exact(&mut close))
        .await
        .unwrap_or_else(|_| panic!("nothing after MAINT"))
        .unwrap_or_else(|e| panic!("a close frame, not a reset: {e}"));
    assert_eq!(close[0], 0x88, "a close frame: {close:x?}");
    assert_eq!(
        &close[2..4],
        &1001u16.to_be_bytes(),
        "going away: {close:x?}"
    );
    node_task.abort();
    l.stop().await;
}

/// Reloads with the config rewritten (a comment added): the reload is taken.
async fn reload_with_a_comment(l: &Limpet, cfg: &ConfigFile, text: &str, n: u32) {
    cfg.write(&format!("{text}\n# reload {n}\n"));
    let (s, report) = reload(l).await;
    assert_eq!(s, 200, "reload refused: {report}");
}

/// WebSockets opened before a reload obey the states set after it, as every connection
/// opened before a reload must (the failure model's reload row): MAINT closes them with 1001
/// `node in maintenance`, and the node going DOWN by its checks closes the one on a listener
/// with `close_on_node_down` (the default) with 1001 `node down`, while the one on a listener
/// that opted out keeps relaying.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websockets_opened_before_a_reload_close_on_a_later_maint_and_down() {
    let Checked {
        _backends,
        check_task,
        l,
        web,
        keep,
        cfg,
        text,
    } = checked("ws-before-reload").await;

    let mut ws = ws_to(web, "a").await;
    reload_with_a_comment(&l, &cfg, &text, 1).await;
    maint_closes_it_then_ready(&l, &mut ws, "MAINT after a reload").await;

    let mut closing = ws_to(web, "a").await;
    let mut kept = ws_to(keep, "a").await;
    reload_with_a_comment(&l, &cfg, &text, 2).await;
    down_closes_one_and_keeps_the_other(
        &l,
        check_task,
        &mut closing,
        &mut kept,
        "DOWN after a reload",
    )
    .await;
    drop((ws, closing, kept));
    l.stop().await;
}
