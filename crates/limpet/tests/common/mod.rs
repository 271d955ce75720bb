//! Test helpers shared by the `proxy_*` tests: demo nodes and a proxy on 127.0.0.1 port 0,
//! in-process, each with a handle that stops it; clients; raw sockets.
//!
//! Every listener is bound before the task that serves it starts, so a test can connect the
//! moment a helper returns: no sleeps, no polling for readiness.

#![allow(dead_code, unreachable_pub)]

pub mod flood;
pub mod haproxy;
pub mod multiport;
pub mod ports;
pub mod probe;
pub mod store_server;

use std::net::SocketAddr;
use std::time::Duration;

use limpet::proxy::{NodeConfig, ProxyConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Upper bound for anything a test waits for; a hang fails instead of blocking the suite.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// A demo node running in this process.
pub struct Node {
    pub name: String,
    pub addr: SocketAddr,
    kill: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Node {
    pub async fn start(name: &str) -> Node {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind node");
        let addr = listener.local_addr().expect("node addr");
        let (tx, rx) = oneshot::channel();
        let owned = name.to_owned();
        let task = tokio::spawn(async move {
            limpet::backend::serve(&owned, listener, async {
                let _ = rx.await;
            })
            .await;
        });
        Node {
            name: name.to_owned(),
            addr,
            kill: Some(tx),
            task: Some(task),
        }
    }

    /// Kills the node like a crash: listener closed and every connection cut. Returns once
    /// that is done, so the next connect to its address is refused.
    pub async fn kill(&mut self) {
        if let Some(tx) = self.kill.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }

    pub fn config(&self) -> NodeConfig {
        NodeConfig {
            name: self.name.clone(),
            addr: self.addr,
        }
    }
}

pub async fn nodes(names: &[&str]) -> Vec<Node> {
    let mut out = Vec::new();
    for n in names {
        out.push(Node::start(n).await);
    }
    out
}

pub fn config(nodes: &[Node]) -> ProxyConfig {
    ProxyConfig::new(nodes.iter().map(Node::config).collect())
}

/// The proxy running in this process.
pub struct Proxy {
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Proxy {
    pub async fn start(cfg: ProxyConfig) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy addr");
        let (tx, rx) = oneshot::channel();
        let task = tokio::spawn(async move {
            limpet::proxy::serve(cfg, listener, async {
                let _ = rx.await;
            })
            .await
            .expect("proxy serve");
        });
        Proxy {
            addr,
            stop: Some(tx),
            task: Some(task),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(PATIENCE, task).await;
        }
    }
}

/// A client that keeps cookies, like a browser.
pub fn jar_client() -> reqwest::Client {
    reqwest::Client::builder()
        .cookie_store(true)
        .timeout(PATIENCE)
        .build()
        .expect("client")
}

/// A client that keeps nothing: every request is a stranger's first visit (but it reuses
/// connections, so use `fresh_client` per request to be a new client).
pub fn plain_client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(PATIENCE)
        .build()
        .expect("client")
}

/// Sends `req` and reads its answer's body as text (the node's echo of what it was sent).
pub async fn body_of(req: reqwest::RequestBuilder) -> String {
    req.send()
        .await
        .expect("answer")
        .text()
        .await
        .expect("body")
}

pub fn node_of(resp: &reqwest::Response) -> String {
    node_in(resp.headers())
}

/// The node an answer's head names (`X-Limpet-Node`), empty without one.
pub fn node_in(headers: &http::HeaderMap) -> String {
    headers
        .get("x-limpet-node")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

/// The affinity cookie pair (`route=...`) a response sets, if any.
pub fn set_cookie(resp: &reqwest::Response) -> Option<String> {
    set_cookie_in(resp.headers())
}

pub fn set_cookie_in(headers: &http::HeaderMap) -> Option<String> {
    headers
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with("route="))
        .map(str::to_owned)
}

/// Writes `bytes` on a new connection and reads until the proxy closes it.
pub async fn raw_exchange(addr: SocketAddr, bytes: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(bytes).await.expect("write");
    let mut out = Vec::new();
    tokio::time::timeout(PATIENCE, s.read_to_end(&mut out))
        .await
        .expect("proxy closed the connection in time")
        .ok();
    String::from_utf8_lossy(&out).into_owned()
}

/// Reads one request head from `s` (through its blank line); `None` once the peer closes or
/// fails first. What follows the head in the same read is dropped.
pub async fn read_request_head(s: &mut TcpStream) -> Option<String> {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    Some(String::from_utf8_lossy(&head).into_owned())
}

/// The access log lines (target `limpet::access`) a limpet process writes to its stderr,
/// read as they come by a thread of their own (a pipe nobody reads would block limpet's
/// writes to it once full).
pub struct AccessLines(std::sync::Arc<std::sync::Mutex<std::sync::mpsc::Receiver<String>>>);

impl AccessLines {
    pub fn of(stderr: std::process::ChildStderr) -> AccessLines {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for l in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                if l.contains("limpet::access") && tx.send(l).is_err() {
                    return;
                }
            }
        });
        AccessLines(std::sync::Arc::new(std::sync::Mutex::new(rx)))
    }

    /// The next line, within [`PATIENCE`] (the process ending ends the wait too).
    pub async fn next(&self) -> String {
        let rx = std::sync::Arc::clone(&self.0);
        tokio::task::spawn_blocking(move || {
            rx.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .recv_timeout(PATIENCE)
                .expect("an access log line in time")
        })
        .await
        .expect("join")
    }
}

/// Asserts that the log line `line` has each `key=value` of `parts` as a word of its own.
pub fn has_fields(line: &str, parts: &[&str]) {
    for part in parts {
        assert!(
            line.split_whitespace().any(|w| w == *part),
            "{part} missing from {line:?}"
        );
    }
}

/// A node that accepts connections, reads a request head, and closes without answering.
pub struct BlackHole {
    pub addr: SocketAddr,
    task: JoinHandle<()>,
}

impl BlackHole {
    pub async fn start() -> BlackHole {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let task = tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 16 * 1024];
                    let mut seen = Vec::new();
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        seen.extend_from_slice(&buf[..n]);
                        if seen.windows(4).any(|w| w == b"\r\n\r\n") {
                            break;
                        }
                    }
                });
            }
        });
        BlackHole { addr, task }
    }
}

impl Drop for BlackHole {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An HTTP/2 client connection with prior knowledge to `addr` (hyper's client), its
/// connection driven by a task of its own: the request sender and that task.
pub async fn h2_client(
    addr: &str,
) -> (
    hyper::client::conn::http2::SendRequest<http_body_util::Empty<bytes::Bytes>>,
    tokio::task::JoinHandle<hyper::Result<()>>,
) {
    let io = hyper_util::rt::TokioIo::new(TcpStream::connect(addr).await.expect("connect"));
    let (send, conn) =
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
            .await
            .expect("h2 handshake");
    (send, tokio::spawn(conn))
}
