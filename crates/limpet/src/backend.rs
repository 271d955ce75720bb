//! A small built-in HTTP node: what `limpet demo` puts behind the proxy, and what the tests
//! proxy to.
//!
//! Every answer names the node in an `X-Limpet-Node` header. Endpoints:
//!
//! | path | answer |
//! |---|---|
//! | `/` (any other path too) | `node NAME` as text; with `Accept: text/html`, the demo page |
//! | `/index.html` | the demo page: the node that served it, and a WebSocket to `/ws` showing the socket's node |
//! | `/ws` | WebSocket: first a text frame with the node name, then echoes every frame |
//! | `/ws-refuse?status=N` | refuses any upgrade with status N (default 503) |
//! | `/status/N` | answers status N |
//! | `/upload` | reads the body as it streams and answers its length in bytes |
//! | `/download?bytes=N` | streams N bytes (64 KiB chunks) |
//! | `/headers` | the request headers as received, one `name: value` line each |
//! | `/slow?ms=N` | waits N ms (at most 60 s), then answers |
//! | `/events?ms=N` | server-sent events: `data: NAME`, every N ms (default 200, at least 10), for at most 10 minutes |
//! | `/drop` | closes the connection without answering |
//! | `/demo/...` | with [`DemoHooks`] only (`limpet demo`): the demo's control endpoint |
//!
//! [`serve`] takes an already-bound listener and a shutdown future. Shutdown acts like a
//! crash, on purpose: the listener closes and every open connection is cut, which is what
//! failover tests need. [`serve_with`] takes [`NodeOptions`]: `limpet demo` stops its nodes
//! like a process that exits cleanly instead (in-flight answers complete; WebSockets are cut
//! all the same), so the page's own "stop" request is answered even by the node it stops, and
//! it gives them [`DemoHooks`]: the demo page with its buttons, and what the buttons call.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type NodeBody = BoxBody<Bytes, BoxError>;

/// The header every answer of a demo node carries.
pub const NODE_HEADER: &str = "x-limpet-node";

/// Serves node `name` on `listener` until `shutdown` resolves; then closes the listener and
/// cuts every connection.
pub async fn serve(name: &str, listener: TcpListener, shutdown: impl Future<Output = ()>) {
    serve_with(name, listener, shutdown, NodeOptions::default()).await;
}

/// A boxed future, so [`DemoHooks`] stays object-safe.
pub type HookFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What `limpet demo` adds to its nodes: its page, and the control endpoint the page's
/// buttons call. Every node of the demo shares one, so whichever node the proxy sends a
/// request to can act on any node.
pub trait DemoHooks: Send + Sync + 'static {
    /// The page node `node` serves for `/index.html` (and `/` asked as HTML).
    fn page(&self, node: &str) -> String;
    /// Answers `method path?query` under `/demo/`: a status and a JSON body. `refusal` says
    /// why a write must be refused, if it must (without the demo page's header, or sent to
    /// a name that is neither an IP address nor `localhost`).
    fn control<'a>(
        &'a self,
        method: &'a http::Method,
        path: &'a str,
        query: &'a str,
        refusal: Option<&'static str>,
    ) -> HookFuture<'a, (StatusCode, String)>;
}

/// How [`serve_with`] runs a node.
#[derive(Default)]
pub struct NodeOptions {
    /// Stop like a process that exits cleanly rather than like a crash: the listener closes,
    /// WebSockets are cut, but a request being answered gets its answer (for at most
    /// [`GRACEFUL_STOP`]) before its connection closes.
    pub graceful_stop: bool,
    /// The demo's page and control endpoint.
    pub hooks: Option<Arc<dyn DemoHooks>>,
    /// Told the moment the listener is closed on shutdown (from then on connects are
    /// refused), before the connections are done.
    pub listener_closed: Option<tokio::sync::oneshot::Sender<()>>,
}

impl std::fmt::Debug for NodeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeOptions")
            .field("graceful_stop", &self.graceful_stop)
            .field("hooks", &self.hooks.is_some())
            .field("listener_closed", &self.listener_closed.is_some())
            .finish()
    }
}

/// How long a graceful stop lets answers in flight finish before cutting them.
pub const GRACEFUL_STOP: Duration = Duration::from_secs(5);

/// [`serve`] with options: see [`NodeOptions`].
pub async fn serve_with(
    name: &str,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
    options: NodeOptions,
) {
    let name: Arc<str> = Arc::from(name);
    let hooks = options.hooks;
    let graceful = options.graceful_stop;
    let mut conns = JoinSet::new();
    // Upgraded sockets leave hyper's connection task, so they watch this to be cut as well;
    // with a graceful stop, connection tasks watch it to close once their answer is out.
    let (killed_tx, killed) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            // A stop wins over a connection waiting to be accepted.
            biased;
            () = &mut shutdown => break,
            // Reap finished connections so the set does not grow without bound.
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            r = listener.accept() => {
                let Ok((stream, _)) = r else {
                    // Out of descriptors, most likely: pause as limpet's listeners do
                    // rather than spin on an error that persists.
                    tokio::time::sleep(crate::net::ACCEPT_BACKOFF).await;
                    continue;
                };
                let name = Arc::clone(&name);
                let hooks = hooks.clone();
                let killed = killed.clone();
                let mut stopping = killed.clone();
                conns.spawn(async move {
                    let svc = service_fn(move |req| {
                        handle(Arc::clone(&name), hooks.clone(), killed.clone(), req)
                    });
                    let builder = auto::Builder::new(TokioExecutor::new());
                    let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), svc);
                    tokio::pin!(conn);
                    tokio::select! {
                        _ = conn.as_mut() => {}
                        () = async { let _ = stopping.wait_for(|k| *k).await; }, if graceful => {
                            conn.as_mut().graceful_shutdown();
                            let _ = conn.await;
                        }
                    }
                });
            }
        }
    }
    drop(listener);
    if let Some(tx) = options.listener_closed {
        let _ = tx.send(());
    }
    let _ = killed_tx.send(true);
    if graceful {
        let _ = tokio::time::timeout(GRACEFUL_STOP, async {
            while conns.join_next().await.is_some() {}
        })
        .await;
    }
    conns.shutdown().await;
}

fn full(text: impl Into<Bytes>) -> NodeBody {
    Full::new(text.into())
        .map_err(|never: Infallible| match never {})
        .boxed()
}

fn answer(
    name: &str,
    status: StatusCode,
    content_type: &'static str,
    body: NodeBody,
) -> Response<NodeBody> {
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    if let Ok(v) = HeaderValue::from_str(name) {
        h.insert(NODE_HEADER, v);
    }
    resp
}

fn text(name: &str, status: StatusCode, body: impl Into<Bytes>) -> Response<NodeBody> {
    answer(name, status, "text/plain; charset=utf-8", full(body))
}

fn query_param<'a>(req: &'a Request<Incoming>, key: &str) -> Option<&'a str> {
    req.uri()
        .query()?
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

/// An error that makes hyper close the connection without answering (`/drop`).
#[derive(Debug)]
struct Dropped;

impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("dropped on purpose")
    }
}

impl std::error::Error for Dropped {}

/// Why a write to the demo's control endpoint is refused, if it is. It changes nodes with no
/// token, so it is taken only from the demo's own page:
/// - with `X-Limpet-Demo`, which the page sends and a cross-site form cannot;
/// - sent to an IP address or `localhost` (its `Host`), as the admin listener's writes without
///   a token are: a page of another site whose name was made to resolve to loopback (DNS
///   rebinding) is same-origin with the demo, and could send the header.
pub(crate) fn demo_write_refusal(headers: &http::HeaderMap) -> Option<&'static str> {
    if !headers.contains_key("x-limpet-demo") {
        return Some("demo actions need the X-Limpet-Demo header (the demo page sends it)");
    }
    crate::admin::rebinding_refusal(headers, &[]).map(|_| {
        "demo actions are taken only from the demo page loaded by IP address or localhost \
         (e.g. http://127.0.0.1:8080/): another name may be a foreign site resolved to \
         loopback"
    })
}

async fn handle(
    name: Arc<str>,
    hooks: Option<Arc<dyn DemoHooks>>,
    killed: watch::Receiver<bool>,
    mut req: Request<Incoming>,
) -> Result<Response<NodeBody>, Dropped> {
    let path = req.uri().path().to_owned();
    if let Some(hooks) = &hooks {
        if path.starts_with("/demo/") {
            let query = req.uri().query().unwrap_or("").to_owned();
            let refusal = demo_write_refusal(req.headers());
            let (status, body) = hooks.control(req.method(), &path, &query, refusal).await;
            let mut resp = answer(&name, status, "application/json", full(body));
            // Node states change from one second to the next.
            resp.headers_mut()
                .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            return Ok(resp);
        }
    }
    let resp = match path.as_str() {
        "/ws" => websocket(&name, killed, &mut req),
        "/ws-refuse" => {
            let status = query_param(&req, "status")
                .and_then(|s| s.parse::<u16>().ok())
                .and_then(|s| StatusCode::from_u16(s).ok())
                .unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
            text(&name, status, format!("node {name} refuses the upgrade\n"))
        }
        "/upload" => {
            let mut body = req.into_body();
            let mut n: u64 = 0;
            while let Some(frame) = body.frame().await {
                match frame {
                    Ok(f) => n += f.data_ref().map_or(0, |d| d.len() as u64),
                    Err(_) => return Err(Dropped),
                }
            }
            text(&name, StatusCode::OK, format!("{n}\n"))
        }
        "/download" => {
            let n = query_param(&req, "bytes")
                .and_then(|s| s.parse::<u64>().ok())
                .unwrap_or(0);
            answer(
                &name,
                StatusCode::OK,
                "application/octet-stream",
                Repeat { left: n }.boxed(),
            )
        }
        "/headers" => {
            let mut out = String::new();
            for (k, v) in req.headers() {
                out.push_str(k.as_str());
                out.push_str(": ");
                out.push_str(&String::from_utf8_lossy(v.as_bytes()));
                out.push('\n');
            }
            text(&name, StatusCode::OK, out)
        }
        "/slow" => {
            let ms = query_param(&req, "ms")
                .and_then(|s| s.parse::<u64>().ok())
                .unwrap_or(1000)
                .min(60_000);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            text(&name, StatusCode::OK, format!("node {name}\n"))
        }
        "/events" => {
            let every = query_param(&req, "ms")
                .and_then(|s| s.parse::<u64>().ok())
                .unwrap_or(200)
                .max(10);
            let event = Bytes::from(format!("data: {name}\n\n"));
            let mut ticks = tokio::time::interval(Duration::from_millis(every));
            // Bounded, as every load loop of the tests is.
            let ends = tokio::time::Instant::now() + Duration::from_secs(600);
            let events = futures_util::stream::poll_fn(move |cx| {
                if tokio::time::Instant::now() >= ends {
                    return Poll::Ready(None);
                }
                ticks
                    .poll_tick(cx)
                    .map(|_| Some(Ok::<_, BoxError>(Frame::data(event.clone()))))
            });
            answer(
                &name,
                StatusCode::OK,
                "text/event-stream",
                BodyExt::boxed(http_body_util::StreamBody::new(events)),
            )
        }
        "/drop" => return Err(Dropped),
        _ if path.starts_with("/status/") => {
            let status = path["/status/".len()..]
                .parse::<u16>()
                .ok()
                .and_then(|s| StatusCode::from_u16(s).ok())
                .unwrap_or(StatusCode::BAD_REQUEST);
            text(
                &name,
                status,
                format!("node {name}: status {}\n", status.as_u16()),
            )
        }
        _ => {
            let wants_html = path == "/index.html"
                || (path == "/"
                    && req
                        .headers()
                        .get(header::ACCEPT)
                        .and_then(|v| v.to_str().ok())
                        .is_some_and(|v| v.contains("text/html")));
            if wants_html {
                let html = match &hooks {
                    Some(h) => h.page(&name),
                    None => page(&name),
                };
                answer(
                    &name,
                    StatusCode::OK,
                    "text/html; charset=utf-8",
                    full(html),
                )
            } else {
                text(&name, StatusCode::OK, format!("node {name}\n"))
            }
        }
    };
    Ok(resp)
}

/// Accepts a WebSocket upgrade: 101 now, then a task that greets with the node name and
/// echoes.
fn websocket(
    name: &Arc<str>,
    mut killed: watch::Receiver<bool>,
    req: &mut Request<Incoming>,
) -> Response<NodeBody> {
    let key = req.headers().get(header::SEC_WEBSOCKET_KEY).cloned();
    let is_ws = req
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    let (Some(key), true) = (key, is_ws) else {
        return text(
            name,
            StatusCode::BAD_REQUEST,
            "expected a WebSocket upgrade\n",
        );
    };
    let on_upgrade = hyper::upgrade::on(req);
    let node = Arc::clone(name);
    tokio::spawn(async move {
        let Ok(upgraded) = on_upgrade.await else {
            return;
        };
        let mut ws =
            WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
        let echo = async {
            if ws.send(Message::Text(node.to_string())).await.is_err() {
                return;
            }
            while let Some(Ok(msg)) = ws.next().await {
                let reply = match msg {
                    Message::Text(_) | Message::Binary(_) => msg,
                    Message::Close(_) => break,
                    // Pings are answered by tungstenite itself.
                    _ => continue,
                };
                if ws.send(reply).await.is_err() {
                    break;
                }
            }
        };
        // A killed node drops the socket mid-conversation, like a crashed machine.
        tokio::select! {
            () = echo => {}
            _ = killed.wait_for(|k| *k) => {}
        }
    });
    let mut resp = text(name, StatusCode::SWITCHING_PROTOCOLS, "");
    let h = resp.headers_mut();
    h.remove(header::CONTENT_TYPE);
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    if let Ok(v) = HeaderValue::from_str(&derive_accept_key(key.as_bytes())) {
        h.insert(header::SEC_WEBSOCKET_ACCEPT, v);
    }
    resp
}

/// A body of `left` bytes, generated as it is read.
struct Repeat {
    left: u64,
}

impl Body for Repeat {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        static CHUNK: [u8; 64 * 1024] = [b'x'; 64 * 1024];
        if self.left == 0 {
            return Poll::Ready(None);
        }
        let n = self.left.min(CHUNK.len() as u64) as usize;
        self.left -= n as u64;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(&CHUNK[..n])))))
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.left)
    }
}

/// HTML-escapes text (the demo page's node names).
pub(crate) fn escape(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            '<' => "&lt;".to_owned(),
            '>' => "&gt;".to_owned(),
            '&' => "&amp;".to_owned(),
            '"' => "&quot;".to_owned(),
            '\'' => "&#39;".to_owned(),
            c => c.to_string(),
        })
        .collect()
}

/// The demo page: which node served it, and which node its WebSocket lands on.
fn page(name: &str) -> String {
    let name = escape(name);
    format!(
        r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>limpet demo: {name}</title>
<style>body{{font:16px system-ui,sans-serif;max-width:40em;margin:3em auto}}b{{font-size:1.4em}}</style>
</head><body>
<h1>limpet demo</h1>
<p>This page was served by node <b>{name}</b>.</p>
<p>WebSocket: <b id="ws">connecting&hellip;</b></p>
<p>Reload: you stay on the same node (the <code>route</code> cookie pins you). Clear cookies to be
assigned afresh.</p>
<script>
const out = document.getElementById("ws");
const ws = new WebSocket((location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/ws");
ws.onmessage = (e) => {{ out.textContent = "node " + e.data + (e.data === "{name}" ? " (same node)" : " (another node!)"); ws.close(); }};
ws.onerror = () => {{ out.textContent = "failed"; }};
</script>
</body></html>
"#
    )
}
