//! The tokio-tungstenite adapter against a real WebSocket server on loopback.

use futures_util::StreamExt;
use limpet_client::tungstenite::{connect_async, outcome_of_error};
use limpet_client::{classify, AffinityJar, Origin, Outcome, SharedJar, Verdict};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::{header, HeaderValue, StatusCode};
use tokio_tungstenite::tungstenite::Error;

/// How the server answers one upgrade.
#[derive(Clone, Debug)]
enum Answer {
    /// 101 with these `Set-Cookie` lines.
    Accept(Vec<&'static str>),
    /// This status with these `Set-Cookie` lines.
    Refuse(u16, Vec<&'static str>),
}

/// A WebSocket server answering the k-th upgrade with `answers[k]`; reports the `Cookie`
/// header of each upgrade request. Stopped when dropped.
struct WsServer {
    url: String,
    cookies: mpsc::UnboundedReceiver<Option<String>>,
    task: JoinHandle<()>,
}

impl Drop for WsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl WsServer {
    async fn start(answers: Vec<Answer>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("ws://{}/socket", listener.local_addr().expect("addr"));
        let (tx, cookies) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            for answer in answers {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let tx = tx.clone();
                // The callback's shape, a large `Err`, is tungstenite's, not ours to change.
                #[allow(clippy::result_large_err)]
                let callback = move |request: &Request, mut response: Response| {
                    let cookie = request
                        .headers()
                        .get(header::COOKIE)
                        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
                    let _ = tx.send(cookie);
                    match answer {
                        Answer::Accept(set) => {
                            for c in set {
                                response
                                    .headers_mut()
                                    .append(header::SET_COOKIE, HeaderValue::from_static(c));
                            }
                            Ok(response)
                        }
                        Answer::Refuse(status, set) => {
                            let mut refusal = ErrorResponse::new(Some("refused".to_owned()));
                            *refusal.status_mut() =
                                StatusCode::from_u16(status).expect("valid status");
                            for c in set {
                                refusal
                                    .headers_mut()
                                    .append(header::SET_COOKIE, HeaderValue::from_static(c));
                            }
                            Err(refusal)
                        }
                    }
                };
                // Serve each socket until the client closes it, so the close handshake is
                // completed by a live peer.
                tokio::spawn(async move {
                    if let Ok(mut socket) =
                        tokio_tungstenite::accept_hdr_async(stream, callback).await
                    {
                        while let Some(Ok(_)) = socket.next().await {}
                    }
                });
            }
        });
        WsServer { url, cookies, task }
    }

    async fn next_cookie(&mut self) -> Option<String> {
        self.cookies
            .recv()
            .await
            .expect("server stopped before an upgrade")
    }
}

fn jar_for(url: &str) -> SharedJar {
    SharedJar::new(AffinityJar::new(Origin::parse(url).expect("origin")))
}

#[tokio::test]
async fn the_101_answers_cookie_is_adopted_and_sent_on_the_next_upgrade() {
    let mut server = WsServer::start(vec![
        Answer::Accept(vec!["route=n1; Path=/; HttpOnly", "theme=dark; Path=/"]),
        Answer::Accept(vec![]),
    ])
    .await;
    let jar = jar_for(&server.url);

    let (mut socket, answer) = connect_async(&jar, server.url.as_str())
        .await
        .expect("upgrade");
    assert_eq!(answer.status(), StatusCode::SWITCHING_PROTOCOLS);
    assert_eq!(server.next_cookie().await, None);
    assert_eq!(jar.get("route").as_deref(), Some("n1"));
    assert_eq!(jar.get("theme"), None);
    socket.close(None).await.expect("close");

    // The application's own cookie on the upgrade travels beside the pin, in one header.
    let mut request = server.url.as_str().into_client_request().expect("request");
    request
        .headers_mut()
        .insert(header::COOKIE, HeaderValue::from_static("sid=s3cr3t"));
    let (mut socket, _) = connect_async(&jar, request).await.expect("second upgrade");
    assert_eq!(
        server.next_cookie().await.as_deref(),
        Some("sid=s3cr3t; route=n1")
    );
    socket.close(None).await.expect("close");
}

#[tokio::test]
async fn a_refused_upgrades_cookie_is_adopted_and_the_retry_carries_it() {
    let mut server = WsServer::start(vec![
        Answer::Refuse(503, vec!["route=n2; Path=/", "AWSALB=z; Path=/x"]),
        Answer::Accept(vec![]),
    ])
    .await;
    let jar = jar_for(&server.url);
    let origin = jar.origin();
    jar.adopt_all(&origin, [&b"route=n1; Path=/"[..]]);

    let error = connect_async(&jar, server.url.as_str())
        .await
        .expect_err("refused");
    assert!(
        matches!(&error, Error::Http(r) if r.status() == 503),
        "{error}"
    );
    assert_eq!(server.next_cookie().await.as_deref(), Some("route=n1"));
    // The refusal re-pinned the client (its out-of-bounds cookie was not taken).
    assert_eq!(jar.get("route").as_deref(), Some("n2"));
    assert_eq!(jar.get("AWSALB"), None);
    assert_eq!(outcome_of_error(&error), Outcome::UpgradeAnswered(503));
    assert_eq!(classify(outcome_of_error(&error)), Verdict::RetryLater);

    let (mut socket, _) = connect_async(&jar, server.url.as_str())
        .await
        .expect("retry");
    assert_eq!(server.next_cookie().await.as_deref(), Some("route=n2"));
    socket.close(None).await.expect("close");
}

#[tokio::test]
async fn a_401_or_403_upgrade_withdraws_authorisation_and_still_adopts() {
    for status in [401, 403] {
        let mut server =
            WsServer::start(vec![Answer::Refuse(status, vec!["SERVERID=s2; Path=/"])]).await;
        let jar = jar_for(&server.url);
        let error = connect_async(&jar, server.url.as_str())
            .await
            .expect_err("refused");
        server.next_cookie().await;
        assert_eq!(
            classify(outcome_of_error(&error)),
            Verdict::AuthorisationWithdrawn
        );
        assert_eq!(jar.get("SERVERID").as_deref(), Some("s2"));
    }
}

#[tokio::test]
async fn an_upgrade_without_answer_is_a_transport_failure_to_retry() {
    // Bind then release a port so that nothing listens on it.
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    let url = format!("ws://{addr}/socket");
    let jar = jar_for(&url);
    let error = connect_async(&jar, url.as_str())
        .await
        .expect_err("nothing listens");
    assert_eq!(
        outcome_of_error(&error),
        Outcome::UpgradeTransportFailed,
        "{error}"
    );
    assert_eq!(classify(outcome_of_error(&error)), Verdict::RetryLater);
    assert!(jar.lock().is_empty());
}

/// A config's message cap reaches the socket `connect_async_with_config` opens: a server's
/// message larger than it fails the read (tungstenite's capacity error) rather than being
/// gathered whole, and one within it is read. (`limpet probe` caps its sockets so: with
/// tungstenite's 64 MiB, a server under test could make each session hold one whole.)
#[cfg(feature = "tungstenite-rustls")]
#[tokio::test]
async fn a_config_s_message_cap_reaches_the_socket() {
    use futures_util::SinkExt;
    use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
    use tokio_tungstenite::tungstenite::{error::CapacityError, Message};
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("ws://{}/socket", listener.local_addr().expect("addr"));
    let server = tokio::spawn(async move {
        let Ok((stream, _)) = listener.accept().await else {
            return;
        };
        let Ok(mut socket) = tokio_tungstenite::accept_async(stream).await else {
            return;
        };
        let _ = socket.send(Message::text("x".repeat(1000))).await;
        let _ = socket.send(Message::text("x".repeat(64 * 1024))).await;
        while let Some(Ok(_)) = socket.next().await {}
    });
    let config = WebSocketConfig {
        max_message_size: Some(32 * 1024),
        max_frame_size: Some(32 * 1024),
        ..Default::default()
    };
    let (mut socket, _) = limpet_client::tungstenite::connect_async_with_config(
        &jar_for(&url),
        url.as_str(),
        Some(config),
        None,
    )
    .await
    .expect("upgrade");
    let small = socket.next().await;
    assert!(
        matches!(&small, Some(Ok(Message::Text(t))) if t.len() == 1000),
        "{small:?}"
    );
    let large = socket.next().await;
    assert!(
        matches!(
            large,
            Some(Err(Error::Capacity(CapacityError::MessageTooLong { .. })))
        ),
        "{large:?}"
    );
    server.abort();
}
