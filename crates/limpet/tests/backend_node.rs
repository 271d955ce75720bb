//! The built-in demo node: a kill cuts every connection, upgraded WebSockets included, as a
//! crashed machine would. Failover tests rely on it.

use std::time::Duration;

use futures_util::StreamExt;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio_tungstenite::tungstenite::Message;

#[tokio::test]
async fn killing_a_node_cuts_its_open_websockets() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (kill, killed) = oneshot::channel::<()>();
    let node = tokio::spawn(limpet::backend::serve("n1", listener, async {
        let _ = killed.await;
    }));

    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/ws"))
        .await
        .expect("upgrade");
    let first = ws.next().await.expect("a frame").expect("no error");
    assert_eq!(
        first,
        Message::Text("n1".into()),
        "the node names itself first"
    );

    let _ = kill.send(());
    // The socket must end (close, error or EOF); a deadline turns a hang into a failure.
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match ws.next().await {
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return,
                Some(Ok(_)) => continue,
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the WebSocket outlived its node");
    tokio::time::timeout(Duration::from_secs(10), node)
        .await
        .expect("serve returns after the kill")
        .expect("serve task");
}
