//! The drain deadline closes a WebSocket tunnel with a close frame 1001, between frames: a
//! frame the node is in the middle of sending is finished first, nothing after it reaches the
//! client, and the client's WebSocket library sees a well-formed stream.

use std::time::Duration;

use futures_util::StreamExt;
use limpet::drain::{relay_websocket, turned_true, TunnelEnd};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

async fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = l.local_addr().unwrap_or_else(|e| panic!("{e}"));
    let (a, b) = tokio::join!(TcpStream::connect(addr), l.accept());
    (
        a.unwrap_or_else(|e| panic!("{e}")),
        b.unwrap_or_else(|e| panic!("{e}")).0,
    )
}

fn binary_header(len: u64) -> Vec<u8> {
    let mut h = vec![0x82, 127];
    h.extend_from_slice(&len.to_be_bytes());
    h
}

#[tokio::test]
async fn deadline_in_the_middle_of_a_frame_finishes_it_then_sends_close_1001() {
    // raw client <-> (client_side | relay | node_side) <-> raw node: every byte is checked.
    let (mut client, client_side) = pair().await;
    let (node_side, mut node) = pair().await;
    let (close_tx, close_rx) = watch::channel(false);
    let relay = tokio::spawn(relay_websocket(
        client_side,
        node_side,
        Duration::from_secs(30),
        async {
            turned_true(close_rx).await;
            "node drain deadline"
        },
    ));
    // Half of a 100 000-byte frame; once the client has it, the relay is mid-frame.
    let len = 100_000usize;
    let mut first = binary_header(len as u64);
    first.extend(std::iter::repeat_n(7u8, len / 2));
    node.write_all(&first)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut got = vec![0u8; first.len()];
    client
        .read_exact(&mut got)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(got, first);
    // The deadline, then the rest of the frame and one more frame.
    close_tx.send_replace(true);
    let mut rest = vec![7u8; len - len / 2];
    let after = [0x81, 5, b'a', b'f', b't', b'e', b'r'];
    node.write_all(&rest)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    node.write_all(&after)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // The client gets the end of the frame, the close frame 1001, and nothing else.
    let mut tail = Vec::new();
    let mut buf = [0u8; 4096];
    let want = rest.len() + 4 + "node drain deadline".len();
    while tail.len() < want {
        match client.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => tail.extend_from_slice(&buf[..n]),
        }
    }
    rest.extend_from_slice(&[0x88, (2 + "node drain deadline".len()) as u8, 0x03, 0xe9]);
    rest.extend_from_slice(b"node drain deadline");
    assert_eq!(tail.len(), rest.len());
    assert!(tail == rest, "the frame is finished, then close 1001");
    // The client answers (here: by closing); the relay ends and closes the client too.
    client.shutdown().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(client.read(&mut buf).await.ok(), Some(0));
    let how = tokio::time::timeout(Duration::from_secs(5), relay)
        .await
        .unwrap_or_else(|_| panic!("relay did not end"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(how, TunnelEnd::Deadline);
}

#[tokio::test]
async fn deadline_between_frames_closes_a_real_websocket_client_with_1001() {
    let (client_end, client_side) = pair().await;
    let (node_side, mut node_raw) = pair().await;
    let (close_tx, close_rx) = watch::channel(false);
    let relay = tokio::spawn(relay_websocket(
        client_side,
        node_side,
        Duration::from_secs(30),
        async {
            turned_true(close_rx).await;
            "node drain deadline"
        },
    ));
    let mut client = WebSocketStream::from_raw_socket(client_end, Role::Client, None).await;
    node_raw
        .write_all(&[0x81, 5, b'h', b'e', b'l', b'l', b'o'])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let m = client.next().await;
    assert!(
        matches!(m, Some(Ok(Message::Text(ref t))) if t.as_str() == "hello"),
        "{m:?}"
    );
    close_tx.send_replace(true);
    match client.next().await {
        Some(Ok(Message::Close(Some(f)))) => {
            assert_eq!(f.code, CloseCode::Away);
            assert_eq!(f.reason.as_ref(), "node drain deadline");
        }
        other => panic!("expected close 1001, got {other:?}"),
    }
    // Reading on lets the library send its close reply; the relay then ends, and the stream
    // with it.
    let (end, how) = tokio::join!(client.next(), relay);
    assert!(end.is_none() || matches!(end, Some(Err(_))), "{end:?}");
    assert_eq!(how.unwrap_or_else(|e| panic!("{e}")), TunnelEnd::Deadline);
}

#[tokio::test]
async fn a_tunnel_without_a_deadline_relays_both_ways_until_closed() {
    let (client_end, client_side) = pair().await;
    let (node_side, node_end) = pair().await;
    let (close_tx, close_rx) = watch::channel(false);
    let relay = tokio::spawn(relay_websocket(
        client_side,
        node_side,
        Duration::from_secs(30),
        async {
            turned_true(close_rx).await;
            "node drain deadline"
        },
    ));
    let mut client = WebSocketStream::from_raw_socket(client_end, Role::Client, None).await;
    let mut node = WebSocketStream::from_raw_socket(node_end, Role::Server, None).await;
    use futures_util::SinkExt;
    for i in 0..20 {
        client
            .send(Message::text(format!("ping {i}")))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let m = node.next().await;
        assert!(
            matches!(m, Some(Ok(Message::Text(ref t))) if t.as_str() == format!("ping {i}")),
            "{m:?}"
        );
        node.send(Message::binary(vec![i as u8; 70_000]))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let m = client.next().await;
        assert!(
            matches!(m, Some(Ok(Message::Binary(ref b))) if b.len() == 70_000),
            "{m:?}"
        );
    }
    // The close signal's sender going away is not a deadline.
    drop(close_tx);
    client.close(None).await.unwrap_or_else(|e| panic!("{e}"));
    let _ = node.next().await; // the close, answered
    while node.next().await.is_some() {}
    drop(node);
    drop(client);
    let how = tokio::time::timeout(Duration::from_secs(5), relay)
        .await
        .unwrap_or_else(|_| panic!("relay did not end"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(how, TunnelEnd::Closed);
}
