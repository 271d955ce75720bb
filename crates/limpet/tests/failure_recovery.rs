//! Failure recovery end to end, on real loopback sockets:
//!
//! 1. A node taken DOWN by passive failures (no active checks) is tried again after
//!    `fail_timeout` and serves again; a rolling restart of two nodes under cookie and
//!    fresh-session GET load fails no request and leaves both nodes in rotation.
//! 2. A hung node (its kernel completes handshakes, nothing ever answers) goes DOWN under
//!    steady traffic within `fall × (interval + timeout)`, and new sessions are then served.
//! 3. State set after a reload reaches connections opened before it: MAINT, a DOWN by active
//!    checks and a drain deadline each re-pin the next request of pre-reload HTTP/1.1 and
//!    HTTP/2 connections and close a pre-reload TCP session (DOWN: `close_on_node_down`;
//!    drain: by deadline + spread); a reload that renumbers the nodes keeps pre-reload
//!    connections reading and writing pins by node name.
//! 4. A reload's topology and settings reach what was opened before it: a pre-reload
//!    connection's next request goes to a moved node's new address and honours a cookie to an
//!    added node; a reload that turns `close_on_node_down` on closes a session on a node
//!    already DOWN.
//! 5. A session moved off its node is re-pinned for how the node failed it (no answer in
//!    time, connection lost, connection refused).
//! 6. A node that closes idle kept-alive connections loses no request to that close when
//!    `timeouts.upstream_idle` is below its keep-alive timeout (the default, 4 s, is below
//!    Node.js's and Apache's 5 s).
//! 7. A node that stalls or fails in the middle of an answer body: the answer is cut, and
//!    the cut is counted for the node, by cause, though its status went out as the node gave it.

mod admin_common;

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use admin_common::lifecycle::{
    admin_json, backend_nodes, bare_client, metrics_text, node_view, nodes_toml, reload, set_state,
    ConfigFile, Limpet,
};
use admin_common::ports::common_port_pair;
use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use limpet::proxy::quick::ProxyArgs;
use limpet::runtime::{Runtime, State};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::oneshot;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

/// Upper bound for anything that should take milliseconds: a hang fails, never blocks.
const PATIENCE: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

/// A built-in demo node (`limpet::backend`) on an address of our choosing, killed like a crash
/// (listener closed, connections cut) by `kill` or on drop.
struct Backend {
    addr: SocketAddr,
    kill: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Backend {
    fn serve(name: &str, listener: TcpListener) -> Backend {
        Backend::serve_with(name, listener, limpet::backend::NodeOptions::default())
    }

    fn serve_with(
        name: &str,
        listener: TcpListener,
        options: limpet::backend::NodeOptions,
    ) -> Backend {
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("backend addr: {e}"));
        let (tx, rx) = oneshot::channel();
        let owned = name.to_owned();
        let task = tokio::spawn(async move {
            let stop = async {
                let _ = rx.await;
            };
            limpet::backend::serve_with(&owned, listener, stop, options).await;
        });
        Backend {
            addr,
            kill: Some(tx),
            task: Some(task),
        }
    }

    /// A node on a fresh port of 127.0.0.1 that answers `/demo/...` with `hooks`.
    async fn start_with_hooks(name: &str, hooks: Arc<dyn limpet::backend::DemoHooks>) -> Backend {
        let l = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("bind backend: {e}"));
        Backend::serve_hooked(name, l, hooks)
    }

    /// A node on `listener` that answers `/demo/...` with `hooks`.
    fn serve_hooked(
        name: &str,
        listener: TcpListener,
        hooks: Arc<dyn limpet::backend::DemoHooks>,
    ) -> Backend {
        let options = limpet::backend::NodeOptions {
            hooks: Some(hooks),
            ..limpet::backend::NodeOptions::default()
        };
        Backend::serve_with(name, listener, options)
    }

    /// A node on a fresh port of 127.0.0.1.
    async fn start(name: &str) -> Backend {
        let l = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("bind backend: {e}"));
        Backend::serve(name, l)
    }

    /// A node (again) on exactly `addr`: the port a killed node had.
    async fn start_at(name: &str, addr: SocketAddr) -> Backend {
        // The old listener is closed by the time `kill` returns; allow the kernel a moment
        // (bounded) in case it is slow to release the port.
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            match TcpListener::bind(addr).await {
                Ok(l) => return Backend::serve(name, l),
                Err(e) => {
                    assert!(Instant::now() < deadline, "rebind {addr}: {e}");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    }

    async fn kill(&mut self) {
        if let Some(tx) = self.kill.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        if let Some(t) = &self.task {
            t.abort();
        }
    }
}

/// `limpet proxy` in this process, on the code path of `limpet::proxy::serve` (ProxyConfig →
/// one-listener Config → State → Runtime → `serve_listener`), keeping the runtime so the test
/// can read node states.
struct Quick {
    addr: SocketAddr,
    runtime: Arc<Runtime>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Quick {
    async fn start(mut cfg: limpet::proxy::ProxyConfig) -> Quick {
        cfg.timeouts.drain = Duration::from_secs(1);
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("bind proxy: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("proxy addr: {e}"));
        let config = cfg
            .to_config(addr)
            .unwrap_or_else(|e| panic!("proxy config: {e}"));
        let state = State::new(config).unwrap_or_else(|e| panic!("state: {e}"));
        let runtime = Runtime::new(state);
        let (tx, rx) = oneshot::channel();
        let rt = Arc::clone(&runtime);
        let task = tokio::spawn(async move {
            limpet::proxy::serve_listener(rt, "proxy", listener, async {
                let _ = rx.await;
            })
            .await
            .unwrap_or_else(|e| panic!("proxy serve: {e}"));
        });
        Quick {
            addr,
            runtime,
            stop: Some(tx),
            task: Some(task),
        }
    }

    fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    /// The state routing uses for `node` now (`UP`, `DOWN`, ...).
    fn state_of(&self, node: &str) -> &'static str {
        self.runtime
            .state()
            .node_views()
            .into_iter()
            .find(|v| v.name == node)
            .map_or("?", |v| v.state.as_str())
    }

    /// Whether `node`'s routing state is `want` by `deadline`: woken by the node's status
    /// changes, not a poll.
    async fn until_state(&self, node: &str, want: &str, deadline: Instant) -> bool {
        let Some(rt) = self.runtime.state().lifecycle.nodes.get(node) else {
            return false;
        };
        // Subscribed before the first look: a change between the two is not missed.
        let mut changes = rt.status_changes();
        loop {
            if self.state_of(node) == want {
                return true;
            }
            if !matches!(
                tokio::time::timeout_at(deadline, changes.changed()).await,
                Ok(Ok(()))
            ) {
                return self.state_of(node) == want;
            }
        }
    }

    /// What took `node` DOWN, as the admin API names it (`None` while UP).
    fn down_cause(&self, node: &str) -> Option<&'static str> {
        self.runtime
            .state()
            .node_views()
            .into_iter()
            .find(|v| v.name == node)
            .and_then(|v| v.status.health.down_cause())
            .map(limpet_core::DownCause::as_str)
    }

    /// When traffic may next try `node`, DOWN without checks (`now_ms` scale); `None` if UP.
    fn trial_at(&self, node: &str) -> Option<u64> {
        self.runtime
            .state()
            .node_views()
            .into_iter()
            .find(|v| v.name == node)
            .and_then(|v| v.status.health.retry_at_ms(v.status.policy))
    }

    async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            let _ = tokio::time::timeout(PATIENCE, t).await;
        }
    }
}

impl Drop for Quick {
    fn drop(&mut self) {
        if let Some(t) = &self.task {
            t.abort();
        }
    }
}

/// `limpet proxy ARGS`, parsed the way the binary parses them.
#[derive(Debug, Parser)]
struct QuickCli {
    #[command(flatten)]
    proxy: ProxyArgs,
}

/// A client that opens a new connection for every request and keeps no cookie: every
/// request is a new session.
fn fresh_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .timeout(PATIENCE)
        .build()
        .unwrap_or_else(|e| panic!("client: {e}"))
}

/// A browser-like client: keeps cookies and its connection.
fn jar_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .cookie_store(true)
        .timeout(PATIENCE)
        .build()
        .unwrap_or_else(|e| panic!("client: {e}"))
}

/// GET `url`: status and answering node, or the transport error.
async fn get(client: &reqwest::Client, url: &str) -> Result<(u16, String), String> {
    let r = client.get(url).send().await.map_err(|e| e.to_string())?;
    let status = r.status().as_u16();
    let node = node_of(r.headers());
    r.bytes().await.map_err(|e| e.to_string())?;
    Ok((status, node))
}

/// The answering node an answer names (empty for limpet's own answers).
fn node_of(headers: &http::HeaderMap) -> String {
    headers
        .get(limpet::backend::NODE_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

/// The affinity cookie pair (`route=...`) an answer sets, if any.
fn route_cookie_of(headers: &http::HeaderMap) -> Option<String> {
    headers
        .get_all(http::header::SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with("route="))
        .map(|v| v.split(';').next().unwrap_or("").to_owned())
}

/// What one answer said.
#[derive(Debug)]
struct Answer {
    status: u16,
    node: String,
    /// The affinity cookie pair (`route=...`) the answer sets, if any.
    set_cookie: Option<String>,
}

async fn answer_of(resp: http::Response<hyper::body::Incoming>) -> Result<Answer, String> {
    let status = resp.status().as_u16();
    let node = node_of(resp.headers());
    let set_cookie = route_cookie_of(resp.headers());
    resp.into_body()
        .collect()
        .await
        .map_err(|e| format!("answer body: {e}"))?;
    Ok(Answer {
        status,
        node,
        set_cookie,
    })
}

fn request(uri: &str, cookie: Option<&str>) -> http::Request<Empty<Bytes>> {
    let mut b = http::Request::get(uri).header(http::header::HOST, "recovery.test");
    if let Some(c) = cookie {
        b = b.header(http::header::COOKIE, c);
    }
    b.body(Empty::new())
        .unwrap_or_else(|e| panic!("request: {e}"))
}

/// ONE HTTP/1.1 keep-alive connection: every request goes over the same TCP connection, and a
/// closed connection is an error (never a silent reconnect).
struct H1 {
    sender: http1::SendRequest<Empty<Bytes>>,
    conn: JoinHandle<()>,
}

impl H1 {
    async fn open(addr: SocketAddr) -> H1 {
        let s = TcpStream::connect(addr)
            .await
            .unwrap_or_else(|e| panic!("connect {addr}: {e}"));
        H1::over(s).await
    }

    /// One connection from source address `src` (a source-IP table keys on it).
    async fn open_from(src: IpAddr, addr: SocketAddr) -> H1 {
        H1::over(connect_from(src, addr).await).await
    }

    async fn over(s: TcpStream) -> H1 {
        let (sender, conn) = http1::handshake(TokioIo::new(s))
            .await
            .unwrap_or_else(|e| panic!("h1 handshake: {e}"));
        let conn = tokio::spawn(async move {
            let _ = conn.await;
        });
        H1 { sender, conn }
    }

    async fn get(&mut self, cookie: Option<&str>) -> Result<Answer, String> {
        let sender = &mut self.sender;
        tokio::time::timeout(PATIENCE, async move {
            sender
                .ready()
                .await
                .map_err(|e| format!("h1 connection not usable: {e}"))?;
            let resp = sender
                .send_request(request("/", cookie))
                .await
                .map_err(|e| format!("h1 request on the same connection: {e}"))?;
            answer_of(resp).await
        })
        .await
        .map_err(|_| "h1: no answer in time".to_owned())?
    }
}

impl Drop for H1 {
    fn drop(&mut self) {
        self.conn.abort();
    }
}

/// ONE HTTP/2 connection, prior knowledge (h2c), every request a stream on it.
struct H2 {
    sender: http2::SendRequest<Empty<Bytes>>,
    uri: String,
    conn: JoinHandle<()>,
}

impl H2 {
    async fn open(addr: SocketAddr) -> H2 {
        let s = TcpStream::connect(addr)
            .await
            .unwrap_or_else(|e| panic!("connect {addr}: {e}"));
        let (sender, conn) = http2::handshake(TokioExecutor::new(), TokioIo::new(s))
            .await
            .unwrap_or_else(|e| panic!("h2 handshake: {e}"));
        let conn = tokio::spawn(async move {
            let _ = conn.await;
        });
        H2 {
            sender,
            uri: format!("http://{addr}/"),
            conn,
        }
    }

    async fn get(&mut self, cookie: Option<&str>) -> Result<Answer, String> {
        let (sender, uri) = (&mut self.sender, self.uri.as_str());
        tokio::time::timeout(PATIENCE, async move {
            sender
                .ready()
                .await
                .map_err(|e| format!("h2 connection not usable: {e}"))?;
            let resp = sender
                .send_request(request(uri, cookie))
                .await
                .map_err(|e| format!("h2 request on the same connection: {e}"))?;
            answer_of(resp).await
        })
        .await
        .map_err(|_| "h2: no answer in time".to_owned())?
    }
}

impl Drop for H2 {
    fn drop(&mut self) {
        self.conn.abort();
    }
}

/// A TCP connection to `dst` from source address `src`.
async fn connect_from(src: IpAddr, dst: SocketAddr) -> TcpStream {
    let sock = TcpSocket::new_v4().unwrap_or_else(|e| panic!("socket: {e}"));
    sock.bind(SocketAddr::new(src, 0))
        .unwrap_or_else(|e| panic!("bind {src}: {e}"));
    tokio::time::timeout(PATIENCE, sock.connect(dst))
        .await
        .unwrap_or_else(|_| panic!("connect {dst} in time"))
        .unwrap_or_else(|e| panic!("connect {dst}: {e}"))
}

/// One keep-alive GET through a TCP session to a demo node (which speaks HTTP): the node
/// that answered. Reads exactly the answer (head and body), so the session can be used again.
async fn tcp_get(s: &mut TcpStream) -> Result<String, String> {
    tcp_get_with(s, "").await
}

/// [`tcp_get`] with more header lines (`fields`, each ending in CRLF).
async fn tcp_get_with(s: &mut TcpStream, fields: &str) -> Result<String, String> {
    let head = tcp_request(s, "GET / HTTP/1.1", fields).await?;
    head.lines()
        .find_map(|l| l.strip_prefix(&format!("{}:", limpet::backend::NODE_HEADER)))
        .map(|v| v.trim().to_owned())
        .ok_or_else(|| format!("no node header: {head}"))
}

/// One request (`line`, `Host`, then `fields`) over `s`, its answer read exactly (head and
/// `Content-Length` body) so the connection can be used again: the answer head, lowercased.
async fn tcp_request(s: &mut TcpStream, line: &str, fields: &str) -> Result<String, String> {
    let exchange = async {
        let head = format!("{line}\r\nHost: recovery.test\r\n{fields}\r\n");
        s.write_all(head.as_bytes())
            .await
            .map_err(|e| format!("write: {e}"))?;
        let mut buf = Vec::new();
        let mut chunk = [0u8; 2048];
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let n = s.read(&mut chunk).await.map_err(|e| format!("read: {e}"))?;
            if n == 0 {
                return Err("session closed before an answer".to_owned());
            }
            buf.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
        let field = |name: &str| {
            head.lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().to_owned())
        };
        let len: usize = field("content-length:")
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("no content-length: {head}"))?;
        while buf.len() < head_end + len {
            let n = s
                .read(&mut chunk)
                .await
                .map_err(|e| format!("read body: {e}"))?;
            if n == 0 {
                return Err("session closed in the body".to_owned());
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        Ok(head)
    };
    tokio::time::timeout(PATIENCE, exchange)
        .await
        .map_err(|_| "no answer in time".to_owned())?
}

/// Waits (at most `limit`) for the peer to close `s`: how long it took, or `None`.
async fn closed_within(s: &mut TcpStream, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout_at(start + limit, s.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(start.elapsed()),
            Ok(Ok(_)) => {}
        }
    }
}

/// A TCP session through `raw` that landed on `want`, from the first source address of
/// 127.0.0.`base`.. that a fresh assignment sends there. Returns the source address too.
async fn tcp_session_on(raw: SocketAddr, want: &str, base: u8) -> (TcpStream, IpAddr) {
    let mut seen = Vec::new();
    for i in 0..8u8 {
        let src = IpAddr::from([127, 0, 0, base + i]);
        let mut s = connect_from(src, raw).await;
        let node = tcp_get(&mut s)
            .await
            .unwrap_or_else(|e| panic!("TCP session from {src}: {e}"));
        if node == want {
            return (s, src);
        }
        seen.push(node);
    }
    panic!("no TCP session landed on {want}: {seen:?}");
}

/// Polls the admin API (every 25 ms, until `deadline`) until `node` is in `state`: the time
/// it took from `since`, or the last view seen.
async fn await_state(
    l: &Limpet,
    node: &str,
    state: &str,
    since: Instant,
    deadline: Instant,
) -> Result<Duration, serde_json::Value> {
    loop {
        let v = node_view(l, node).await;
        if v["state"] == state {
            return Ok(since.elapsed());
        }
        if Instant::now() >= deadline {
            return Err(v);
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

// ---------------------------------------------------------------------------------------
// Finding 1: a node DOWN by passive failures comes back (quick mode, no checks)
// ---------------------------------------------------------------------------------------

const FAIL_TIMEOUT: Duration = Duration::from_secs(1);

/// The config `limpet proxy --listen 127.0.0.1:0 ARGS...` runs with.
fn quick_config(args: &[&str]) -> limpet::proxy::ProxyConfig {
    let argv = ["limpet-proxy", "--listen", "127.0.0.1:0"]
        .into_iter()
        .chain(args.iter().copied());
    QuickCli::try_parse_from(argv)
        .unwrap_or_else(|e| panic!("args: {e}"))
        .proxy
        .to_config()
        .unwrap_or_else(|e| panic!("to_config: {e}"))
}
/// Scheduling slack on a busy two-core machine.
const SLACK: Duration = Duration::from_millis(1500);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_node_down_by_passive_failures_serves_again_once_restarted() {
    let mut node = Backend::start("n").await;
    let node_addr = node.addr;
    let cfg = quick_config(&["--to", &format!("n={node_addr}"), "--fail-timeout", "1s"]);
    assert_eq!(
        cfg.health.fail_timeout_ms, 1000,
        "--fail-timeout reaches the config"
    );
    let fall = cfg.health.fall;
    let proxy = Quick::start(cfg).await;
    let c = fresh_client();
    assert_eq!(
        get(&c, &proxy.url()).await,
        Ok((200, "n".to_owned())),
        "served before the crash"
    );

    // The node crashes: its connects are refused; `fall` of them take it DOWN. With one node
    // every request answers 503 meanwhile (nowhere to fail over to).
    node.kill().await;
    let mut statuses = Vec::new();
    for _ in 0..(fall + 5) {
        statuses.push(get(&c, &proxy.url()).await.map(|(s, _)| s));
        if proxy.state_of("n") == "DOWN" {
            break;
        }
    }
    assert_eq!(
        proxy.state_of("n"),
        "DOWN",
        "refused connects take the node DOWN: {statuses:?}"
    );
    assert!(
        statuses.iter().all(|s| *s == Ok(503)),
        "503 while the only node is dead: {statuses:?}"
    );
    assert_eq!(
        statuses.len(),
        fall as usize,
        "DOWN at the `fall`-th refused connect, not before or after: {statuses:?}"
    );

    // The node restarts on the same port. Within fail_timeout one connection tries it, the
    // connect succeeds, and it serves again.
    let mut node = Backend::start_at("n", node_addr).await;
    let restarted = Instant::now();
    let deadline = restarted + FAIL_TIMEOUT + SLACK;
    let mut polls = Vec::new();
    let back_after = loop {
        let r = get(&c, &proxy.url()).await;
        if r == Ok((200, "n".to_owned())) {
            break restarted.elapsed();
        }
        polls.push(r);
        assert!(
            Instant::now() < deadline,
            "no 200 within fail_timeout ({FAIL_TIMEOUT:?}) + {SLACK:?} of the restart; \
             node state {}; answers: {polls:?}",
            proxy.state_of("n")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        polls.iter().all(|r| matches!(r, Ok((503, _)))),
        "until the trial, the DOWN node is not used: {polls:?}"
    );
    assert_eq!(
        proxy.state_of("n"),
        "UP",
        "the successful trial brings it UP"
    );
    // And it stays in service.
    for _ in 0..3 {
        assert_eq!(get(&c, &proxy.url()).await, Ok((200, "n".to_owned())));
    }
    eprintln!("node back {back_after:?} after its restart (fail_timeout {FAIL_TIMEOUT:?})");
    proxy.stop().await;
    node.kill().await;
}

/// With another node UP, a node DOWN by its refused connects (no checks) and restarted at
/// once waits out `fail_timeout` before it is tried, and the one trial then brings it back,
/// as a client sees it: a GET of a fresh session every 50 ms is answered by
/// b, every one, from a's DOWN until `fail_timeout` after it, and by a within `fail_timeout`
/// and slack of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_another_node_up_a_restarted_node_is_tried_only_after_fail_timeout() {
    let mut a = Backend::start("a").await;
    let b = Backend::start("b").await;
    let a_addr = a.addr;
    let cfg = quick_config(&[
        "--to",
        &format!("a={a_addr}"),
        "--to",
        &format!("b={}", b.addr),
        "--fail-timeout",
        "1s",
    ]);
    let fall = cfg.health.fall;
    let proxy = Quick::start(cfg).await;
    let url = proxy.url();
    a.kill().await;
    // Fresh sessions: failed over to b (a's refused connects), until `fall` of them take a
    // DOWN.
    let mut down_at = None;
    for _ in 0..(2 * fall + 4) {
        // The start of the GET that takes a DOWN: no later than the DOWN itself.
        let sent = Instant::now();
        assert_eq!(get(&fresh_client(), &url).await, Ok((200, "b".to_owned())));
        if proxy.state_of("a") == "DOWN" {
            down_at = Some(sent);
            break;
        }
    }
    let down_at = down_at.unwrap_or_else(|| panic!("a never went DOWN"));
    // Back at once, as a crashed process a supervisor restarts.
    let mut a = Backend::start_at("a", a_addr).await;
    let mut answers = Vec::new();
    let back_after = loop {
        let (status, node) = get(&fresh_client(), &url)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(status, 200, "{answers:?}");
        let at = down_at.elapsed();
        if node == "a" {
            break at;
        }
        answers.push((at, node));
        assert!(
            at < FAIL_TIMEOUT + SLACK,
            "a not tried within fail_timeout ({FAIL_TIMEOUT:?}) + {SLACK:?} of its DOWN: \
             {answers:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        back_after >= FAIL_TIMEOUT,
        "a tried {back_after:?} after its DOWN, before fail_timeout ({FAIL_TIMEOUT:?})"
    );
    assert!(answers.len() >= 5, "b answered meanwhile: {answers:?}");
    assert_eq!(proxy.state_of("a"), "UP", "its trial brought it UP");
    eprintln!("a back {back_after:?} after its DOWN (fail_timeout {FAIL_TIMEOUT:?})");
    proxy.stop().await;
    a.kill().await;
}

/// Nodes `a` and `b` behind quick mode (no checks) with a `fail_timeout` of a minute: no
/// trial comes due by itself within a test.
async fn a_and_b_slow_to_retry() -> (Backend, Backend, Quick) {
    let a = Backend::start("a").await;
    let b = Backend::start("b").await;
    let cfg = quick_config(&[
        "--to",
        &format!("a={}", a.addr),
        "--to",
        &format!("b={}", b.addr),
        "--fail-timeout",
        "60s",
    ]);
    (a, b, Quick::start(cfg).await)
}

/// Kills both nodes, then sends a request from each client in turn until both are DOWN
/// (bounded: `fall` refused connects each, and some more).
async fn kill_both_until_down(
    proxy: &Quick,
    a: &mut Backend,
    b: &mut Backend,
    clients: &[&reqwest::Client],
) {
    a.kill().await;
    b.kill().await;
    let mut statuses = Vec::new();
    for _ in 0..10 {
        for c in clients {
            statuses.push(get(c, &proxy.url()).await.map(|(s, _)| s));
        }
        if proxy.state_of("a") == "DOWN" && proxy.state_of("b") == "DOWN" {
            break;
        }
    }
    assert_eq!(
        (proxy.state_of("a"), proxy.state_of("b")),
        ("DOWN", "DOWN"),
        "{statuses:?}"
    );
}

/// Every node DOWN by its traffic (no checks), and one comes back: the very next request is
/// served, not answered 503 until a `fail_timeout` (here a minute) has passed. With no node
/// able to take a request, limpet tries the DOWN ones at once, one trial at a time, as nginx
/// marks all its peers live again "for quick recovery" (chaos run 25: a node that blinked
/// for 0.5 s, alone or with all the others, answered 503 for its whole `fail_timeout`). While
/// they are all still dead, each request is 503 (every one refused) and they stay DOWN.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_every_node_down_the_first_to_return_serves_the_next_request() {
    let (mut a, mut b, proxy) = a_and_b_slow_to_retry().await;
    let b_addr = b.addr;
    let c = fresh_client();
    kill_both_until_down(&proxy, &mut a, &mut b, &[&c]).await;
    for _ in 0..3 {
        assert_eq!(
            get(&c, &proxy.url()).await.map(|(s, _)| s),
            Ok(503),
            "both still dead: every try refused"
        );
    }
    assert_eq!(proxy.state_of("b"), "DOWN", "a refused try keeps it DOWN");

    let mut b = Backend::start_at("b", b_addr).await;
    assert_eq!(
        get(&c, &proxy.url()).await,
        Ok((200, "b".to_owned())),
        "the first request after b's restart is served, 60 s before its fail_timeout"
    );
    assert_eq!(proxy.state_of("b"), "UP");
    assert_eq!(proxy.state_of("a"), "DOWN");
    for _ in 0..3 {
        assert_eq!(get(&c, &proxy.url()).await, Ok((200, "b".to_owned())));
    }
    proxy.stop().await;
    b.kill().await;
}

/// A fleet that blinks together (every node killed, then restarted) keeps its sessions home:
/// the first node back comes back on a session's early trial, and that makes the others'
/// trials due at once, so the next request of a session pinned to another node tries its own
/// node instead of moving to the first one back (verification run 27: it moved, and the
/// other nodes, never tried again while every client was pinned, stayed DOWN though healthy).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_that_blinked_together_keeps_its_sessions_home() {
    let (mut a, mut b, proxy) = a_and_b_slow_to_retry().await;
    let (a_addr, b_addr) = (a.addr, b.addr);
    let (one, two) = (jar_client(), jar_client());
    let first = get(&one, &proxy.url()).await.map(|(_, n)| n);
    let second = get(&two, &proxy.url()).await.map(|(_, n)| n);
    let (on_a, on_b) = match (first.as_deref(), second.as_deref()) {
        (Ok("a"), Ok("b")) => (&one, &two),
        (Ok("b"), Ok("a")) => (&two, &one),
        other => panic!("two fresh sessions on two nodes: {other:?}"),
    };
    kill_both_until_down(&proxy, &mut a, &mut b, &[on_a, on_b]).await;
    let mut a = Backend::start_at("a", a_addr).await;
    let mut b = Backend::start_at("b", b_addr).await;
    assert_eq!(
        get(on_a, &proxy.url()).await,
        Ok((200, "a".to_owned())),
        "a's session brings a back"
    );
    assert_eq!(
        get(on_b, &proxy.url()).await,
        Ok((200, "b".to_owned())),
        "b's session stays on b, 60 s before b's fail_timeout"
    );
    assert_eq!(proxy.state_of("b"), "UP");
    proxy.stop().await;
    a.kill().await;
    b.kill().await;
}

/// The failure model's "node comes back, no active checks", when it has not come back: the
/// trial after `fail_timeout` finds it still refusing, the trial's request fails over to the
/// other node (the client sees a 200), and the node stays DOWN with its next trial a
/// `fail_timeout` later. No request fails at any point.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trial_of_a_node_still_dead_fails_over_and_the_node_stays_down() {
    let mut dead = Backend::start("n").await;
    let alive = Backend::start("m").await;
    let cfg = quick_config(&[
        "--to",
        &format!("n={}", dead.addr),
        "--to",
        &format!("m={}", alive.addr),
        "--fail-timeout",
        "1s",
    ]);
    let fall = cfg.health.fall;
    let proxy = Quick::start(cfg).await;
    let c = fresh_client();
    dead.kill().await;
    // Fresh clients go round both nodes; n's refused connects fail over to m until it is DOWN.
    for _ in 0..(2 * fall + 10) {
        assert_eq!(get(&c, &proxy.url()).await, Ok((200, "m".to_owned())));
        if proxy.state_of("n") == "DOWN" {
            break;
        }
    }
    assert_eq!(proxy.state_of("n"), "DOWN", "refused connects take n DOWN");
    assert_eq!(proxy.down_cause("n"), Some("traffic"));
    let first = proxy.trial_at("n").expect("a trial is planned");

    // Requests go on; once the trial is due one of them tries n, is refused, and fails over.
    let deadline = Instant::now() + FAIL_TIMEOUT + SLACK;
    let next = loop {
        assert_eq!(
            get(&c, &proxy.url()).await,
            Ok((200, "m".to_owned())),
            "every request is served, the trial's too"
        );
        match proxy.trial_at("n") {
            Some(at) if at > first => break at,
            _ => {}
        }
        assert!(
            Instant::now() < deadline,
            "no trial within fail_timeout ({FAIL_TIMEOUT:?}) + {SLACK:?}; n is {}",
            proxy.state_of("n")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(proxy.state_of("n"), "DOWN", "a refused trial keeps n DOWN");
    let waited = next - first;
    assert!(
        waited >= 1000 && waited < 1000 + SLACK.as_millis() as u64,
        "the trial came a fail_timeout after n went DOWN, and the next one is planned a \
         fail_timeout after it: the two {waited} ms apart"
    );
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_under_get_load_fails_no_request_and_both_nodes_return() {
    rolling_restart_under_get_load(false).await;
}

/// The same with HTTP/2 clients: each cookie client one h2c connection, its GETs streams on
/// it; the new sessions each a connection of their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_under_http2_get_load_fails_no_request_and_both_nodes_return() {
    rolling_restart_under_get_load(true).await;
}

/// One GET of a load client over HTTP/2: on `conn` (opened at the first), with the cookie the
/// session was given; `None` for a new session, a connection of its own and no cookie.
async fn h2_load_get(
    addr: SocketAddr,
    conn: Option<&mut (Option<H2>, Option<String>)>,
) -> Result<(u16, String), String> {
    match conn {
        None => {
            let a = H2::open(addr).await.get(None).await?;
            Ok((a.status, a.node))
        }
        Some((h2, cookie)) => {
            let h2 = match h2 {
                Some(h2) => h2,
                None => h2.insert(H2::open(addr).await),
            };
            let a = h2.get(cookie.as_deref()).await?;
            if let Some(c) = a.set_cookie {
                *cookie = Some(c);
            }
            Ok((a.status, a.node))
        }
    }
}

async fn rolling_restart_under_get_load(h2: bool) {
    let mut nodes = vec![Backend::start("a").await, Backend::start("b").await];
    let mut cfg = limpet::proxy::ProxyConfig::new(
        ["a", "b"]
            .iter()
            .zip(&nodes)
            .map(|(n, b)| limpet::proxy::NodeConfig {
                name: (*n).to_owned(),
                addr: b.addr,
            })
            .collect(),
    );
    cfg.health.fail_timeout_ms = 1000;
    let proxy = Quick::start(cfg).await;
    let (url, addr) = (proxy.url(), proxy.addr);

    // Load: four cookie clients (sessions pinned to a node, each on its keep-alive
    // connection) and one stream of new sessions (a new connection, no cookie, per request),
    // all GET, all the time, until told to stop (and at most 5000 requests each).
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicU64::new(0));
    let failures: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(Vec::new()));
    let mut load = JoinSet::new();
    for i in 0..5 {
        let (url, stop, served, failures) = (
            url.clone(),
            Arc::clone(&stop),
            Arc::clone(&served),
            Arc::clone(&failures),
        );
        load.spawn(async move {
            let (c, who) = if i < 4 {
                (jar_client(), format!("cookie client {i}"))
            } else {
                (fresh_client(), "new sessions".to_owned())
            };
            let mut h2_session = (i < 4).then_some((None, None));
            for _ in 0..5000 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let answer = if h2 {
                    h2_load_get(addr, h2_session.as_mut()).await
                } else {
                    get(&c, &url).await
                };
                match answer {
                    Ok((200, _)) => {}
                    other => failures
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(format!("{who}: {other:?}")),
                }
                served.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
    }
    let wait_served = |n: u64| {
        let served = Arc::clone(&served);
        async move {
            let deadline = Instant::now() + PATIENCE;
            while served.load(Ordering::Relaxed) < n {
                assert!(Instant::now() < deadline, "the load stalled");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    wait_served(40).await;

    // Restart a, then b: each is killed, taken DOWN by the load, restarted on its port, and
    // back UP (its trial succeeded) before the next one goes.
    for (i, name) in ["a", "b"].into_iter().enumerate() {
        let addr = nodes[i].addr;
        nodes[i].kill().await;
        let killed = Instant::now();
        assert!(
            proxy.until_state(name, "DOWN", killed + PATIENCE).await,
            "{name} never went DOWN under load"
        );
        let down_after = killed.elapsed();
        // Some load while it is down.
        let now = served.load(Ordering::Relaxed);
        wait_served(now + 20).await;
        nodes[i] = Backend::start_at(name, addr).await;
        let restarted = Instant::now();
        assert!(
            proxy
                .until_state(name, "UP", restarted + FAIL_TIMEOUT + SLACK)
                .await,
            "{name} not back UP within fail_timeout + slack of its restart"
        );
        eprintln!(
            "{name}: DOWN {down_after:?} after its kill, restarted {:?} after it, back UP \
             {:?} after its restart",
            restarted - killed,
            restarted.elapsed()
        );
    }
    let now = served.load(Ordering::Relaxed);
    wait_served(now + 20).await;
    stop.store(true, Ordering::Relaxed);
    while let Some(r) = load.join_next().await {
        r.unwrap_or_else(|e| panic!("load task: {e}"));
    }
    let failures = failures.lock().unwrap_or_else(|e| e.into_inner()).clone();
    assert!(
        failures.is_empty(),
        "{} of {} GETs failed during the rolling restart: {:?}",
        failures.len(),
        served.load(Ordering::Relaxed),
        &failures[..failures.len().min(10)]
    );

    // Both nodes are in rotation again: new sessions reach both.
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..10 {
        let (s, node) = get(&fresh_client(), &url)
            .await
            .unwrap_or_else(|e| panic!("fresh GET: {e}"));
        assert_eq!(s, 200);
        seen.insert(node);
        if seen.len() == 2 {
            break;
        }
    }
    assert_eq!(
        seen.into_iter().collect::<Vec<_>>(),
        ["a", "b"],
        "fresh clients reach both nodes after the rolling restart"
    );
    proxy.stop().await;
    for n in &mut nodes {
        n.kill().await;
    }
}

// ---------------------------------------------------------------------------------------
// Finding 2: a hung node goes DOWN under steady traffic
// ---------------------------------------------------------------------------------------

/// One new session: a new connection, `GET /` without cookie, `Connection: close`. The status
/// (0 when none came) and how long the answer took.
async fn new_session(addr: SocketAddr, limit: Duration) -> (u16, Duration) {
    let start = Instant::now();
    let exchange = async {
        let mut s = TcpStream::connect(addr).await.ok()?;
        s.write_all(b"GET / HTTP/1.1\r\nHost: recovery.test\r\nConnection: close\r\n\r\n")
            .await
            .ok()?;
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.ok()?;
        let text = String::from_utf8_lossy(&out);
        text.strip_prefix("HTTP/1.1 ")
            .and_then(|r| r.get(..3))
            .and_then(|c| c.parse::<u16>().ok())
    };
    let status = tokio::time::timeout(limit, exchange)
        .await
        .ok()
        .flatten()
        .unwrap_or(0);
    (status, start.elapsed())
}

/// Node a: a socket bound and listening on 127.0.0.2 that never accepts. The kernel completes
/// every handshake into the backlog (as for a SIGSTOPped process); nothing ever answers.
/// Node b: a demo node on the same port of 127.0.0.3. The socket, the port and b.
async fn hung_a_and_live_b() -> (TcpListener, u16, Backend) {
    let (hung, l, port) = common_port_pair().await;
    (hung, port, Backend::serve("b", l))
}

const HUNG_FALL: u64 = 3;
const HUNG_INTERVAL_MS: u64 = 200;
const HUNG_TIMEOUT_MS: u64 = 200;

/// A limpet with nodes a and b, checked over HTTP every 200 ms (timeout 200 ms, fall 3,
/// rise 2), and one listener `l` described by `listener` (its name, mode, timeouts).
fn hung_config(port: u16, listener: &str) -> String {
    format!(
        "{}[health]\nfall = {HUNG_FALL}\nrise = 2\ninterval = \"{HUNG_INTERVAL_MS}ms\"\n\
         timeout = \"{HUNG_TIMEOUT_MS}ms\"\n\n\
         [[listeners]]\nname = \"l\"\nbind = \"127.0.0.1:0\"\nnode_port = {port}\n{listener}\
         check = {{ kind = \"http\", path = \"/\" }}\n\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n",
        nodes_toml(&[("a", "127.0.0.2"), ("b", "127.0.0.3")])
    )
}

/// limpet (the real binary) over nodes a and b on `port`, HTTP-checked as in `hung_config`,
/// its HTTP listener `l` with `upstream_answer`; the config file lives as long as it is kept.
async fn checked_limpet(tag: &str, port: u16, upstream_answer: &str) -> (Limpet, ConfigFile) {
    let listener =
        format!("timeouts = {{ upstream_answer = \"{upstream_answer}\", drain = \"1s\" }}\n");
    let cfg = ConfigFile::new(tag, &hung_config(port, &listener));
    (Limpet::start(&cfg).await, cfg)
}

/// Drives steady traffic (a new session every 30 ms, at most 150) at `addr` until the admin
/// API reports node a DOWN, and asserts that happens within fall × (interval + timeout) +
/// slack of `started`. Returns when it did, and how many sessions ran before.
async fn steady_sessions_until_a_is_down(
    l: &Limpet,
    addr: SocketAddr,
    started: Instant,
) -> Duration {
    let bound = Duration::from_millis(HUNG_FALL * (HUNG_INTERVAL_MS + HUNG_TIMEOUT_MS)) + SLACK;
    let mut before = JoinSet::new();
    let mut down_after = None;
    let mut last_view = serde_json::Value::Null;
    for _ in 0..150 {
        before.spawn(new_session(addr, Duration::from_secs(3)));
        last_view = node_view(l, "a").await;
        if last_view["state"] == "DOWN" {
            down_after = Some(started.elapsed());
            break;
        }
        if started.elapsed() > bound + Duration::from_secs(2) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let sessions = before.len();
    // Sessions that landed on the hung node may still hang: they are not what is measured.
    before.abort_all();
    let down_after = down_after.unwrap_or_else(|| {
        panic!(
            "the hung node was never reported DOWN under steady traffic ({sessions} new \
             sessions in {:?}): {last_view}",
            started.elapsed()
        )
    });
    assert!(
        down_after <= bound,
        "DOWN after {down_after:?}, over fall × (interval + timeout) + slack = {bound:?}: \
         {last_view}"
    );
    assert!(
        sessions >= 5,
        "traffic ran while the node hung ({sessions} sessions)"
    );
    eprintln!(
        "hung node DOWN after {down_after:?} (bound {bound:?}), {sessions} sessions before; \
         last check error: {}",
        last_view["checks"][0]["last_error"]
    );
    down_after
}

/// N = 60 new sessions, one every 30 ms: every one answered 200 within 2 s.
async fn new_sessions_are_served(addr: SocketAddr) {
    const N: usize = 60;
    let mut after = JoinSet::new();
    for _ in 0..N {
        after.spawn(new_session(addr, Duration::from_secs(2)));
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let mut results = Vec::new();
    while let Some(r) = after.join_next().await {
        results.push(r.unwrap_or_else(|e| panic!("session task: {e}")));
    }
    let ok = results
        .iter()
        .filter(|(s, t)| *s == 200 && *t <= Duration::from_secs(2))
        .count();
    assert!(
        ok == N,
        "only {ok} of {N} new sessions answered 200 within 2 s after a went DOWN: {results:?}"
    );
}

/// A checked listener (`listener` lines under it) over a hung a and a live b: under steady
/// new sessions a goes DOWN within the bound, new sessions are then served, and a stays DOWN.
async fn hung_node_goes_down_through(tag: &str, listener: &str) {
    let (hung, port, mut b) = hung_a_and_live_b().await;
    let cfg = ConfigFile::new(tag, &hung_config(port, listener));
    let l = Limpet::start(&cfg).await;
    let started = Instant::now();
    steady_sessions_until_a_is_down(&l, l.addr("l"), started).await;
    new_sessions_are_served(l.addr("l")).await;
    let view = node_view(&l, "a").await;
    assert_eq!(
        view["state"], "DOWN",
        "completed connects never bring a checked node back: {view}"
    );
    l.stop().await;
    drop(hung);
    b.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_node_goes_down_under_steady_traffic_and_new_sessions_are_served() {
    // HTTP: a short answer timeout, so a request that meets the hung node fails over (GET)
    // and counts as a failure.
    hung_node_goes_down_through(
        "hung-http",
        "timeouts = { upstream_answer = \"300ms\", drain = \"1s\" }\n",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_node_goes_down_by_its_checks_although_every_tcp_connect_to_it_completes() {
    // TCP: a relay has no answer timeout, so the only traffic signal is a connect that
    // completes (into the hung node's backlog), one every ~60 ms, more often than checks fail.
    // If a completed connect counted as a success it would reset the check failures and keep
    // the hung node UP.
    hung_node_goes_down_through(
        "hung-tcp",
        "mode = \"tcp\"\ntimeouts = { connect = \"1s\", drain = \"1s\" }\n",
    )
    .await;
}

/// Sessions whose GET went to a node just before it hung are served by the other node as
/// soon as the hung node's checks take it DOWN (fall × (interval + timeout)), not when
/// their answer timeout ends (here a minute: before, they waited it out, though the node
/// was known hung within a second and a half).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gets_in_flight_on_a_hung_node_are_replayed_once_its_checks_take_it_down() {
    let (hung, port, mut b) = hung_a_and_live_b().await;
    let (l, _cfg) = checked_limpet("hung-in-flight", port, "60s").await;
    let bound = Duration::from_millis(HUNG_FALL * (HUNG_INTERVAL_MS + HUNG_TIMEOUT_MS)) + SLACK;
    // Round robin over a (UP until its checks fail) and b: half of them go to a and wait.
    let mut sessions = JoinSet::new();
    for _ in 0..6 {
        sessions.spawn(new_session(l.addr("l"), PATIENCE));
    }
    let mut results = Vec::new();
    while let Some(r) = sessions.join_next().await {
        results.push(r.unwrap_or_else(|e| panic!("session task: {e}")));
    }
    assert!(
        results.iter().all(|&(s, t)| s == 200 && t <= bound),
        "every GET answered 200 within fall × (interval + timeout) + slack = {bound:?}: \
         {results:?}"
    );
    assert!(
        results
            .iter()
            .any(|&(_, t)| t >= Duration::from_millis(HUNG_INTERVAL_MS)),
        "some GETs waited on the hung node until it went DOWN: {results:?}"
    );
    assert_eq!(node_view(&l, "a").await["state"], "DOWN");
    l.stop().await;
    drop(hung);
    b.kill().await;
}

/// Quick mode (no checks) in front of the hung node a and the live node b.
fn hung_and_live_config(hung: &TcpListener, b: &Backend) -> limpet::proxy::ProxyConfig {
    let hung_addr = hung
        .local_addr()
        .unwrap_or_else(|e| panic!("hung addr: {e}"));
    limpet::proxy::ProxyConfig::new(vec![
        limpet::proxy::NodeConfig {
            name: "a".into(),
            addr: hung_addr,
        },
        limpet::proxy::NodeConfig {
            name: "b".into(),
            addr: b.addr,
        },
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_checks_a_hung_node_goes_down_on_answer_timeouts_and_no_get_fails() {
    // Quick mode (no checks): a completed connect proves nothing, an answer that does not come
    // within the answer timeout is a failure, so `fall` of them take the hung node DOWN; every
    // GET that met it fails over to b.
    let (hung, _port, mut b) = hung_a_and_live_b().await;
    let mut cfg = hung_and_live_config(&hung, &b);
    const ANSWER: Duration = Duration::from_millis(300);
    cfg.timeouts.upstream_answer = ANSWER;
    // No trial within the test: a stays DOWN once it is.
    cfg.health.fail_timeout_ms = 30_000;
    let fall = cfg.health.fall;
    let proxy = Quick::start(cfg).await;
    let started = Instant::now();
    let bound = ANSWER * fall + SLACK;

    // Steady new sessions (a new connection, no cookie), one every 30 ms, at most 150.
    let mut before = JoinSet::new();
    let mut down_after = None;
    for _ in 0..150 {
        let url = proxy.url();
        before.spawn(async move {
            let t = Instant::now();
            (get(&fresh_client(), &url).await, t.elapsed())
        });
        if proxy.state_of("a") == "DOWN" {
            down_after = Some(started.elapsed());
            break;
        }
        if started.elapsed() > bound + Duration::from_secs(2) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let mut results = Vec::new();
    while let Some(r) = before.join_next().await {
        results.push(r.unwrap_or_else(|e| panic!("session task: {e}")));
    }
    let down_after = down_after.unwrap_or_else(|| {
        panic!(
            "the hung node (no checks) never went DOWN on answer timeouts ({} requests in \
             {:?}): {results:?}",
            results.len(),
            started.elapsed()
        )
    });
    assert!(
        down_after <= bound,
        "DOWN after {down_after:?}, over fall × answer timeout + slack = {bound:?}"
    );
    assert!(
        results
            .iter()
            .all(|(r, _)| matches!(r, Ok((200, n)) if n == "b")),
        "every GET that met the hung node failed over to b: {results:?}"
    );
    let waited = results.iter().filter(|(_, t)| *t >= ANSWER).count();
    assert!(
        waited >= 1,
        "some requests met the hung node (waited the answer timeout): {results:?}"
    );
    new_sessions_are_served_at(&proxy.url()).await;
    assert_eq!(proxy.state_of("a"), "DOWN", "no trial before fail_timeout");
    eprintln!(
        "hung node (no checks) DOWN after {down_after:?} (bound {bound:?}); {waited} of {} \
         requests waited for its answer timeout",
        results.len()
    );
    proxy.stop().await;
    drop(hung);
    b.kill().await;
}

/// An HTTP/1.1 GET that offers `Upgrade: h2c` (curl's `--http2` on an `http://` URL) is an
/// ordinary GET: the offer is dropped, as HAProxy and nginx drop it (limpet speaks HTTP/2 to
/// clients by prior knowledge or ALPN). Its session's node hung, it is replayed on the
/// other node at the answer timeout; and its kept-alive connection, idle past the second
/// after which an idle connection is parked, serves the next request. Before, it was taken
/// for an upgrade: never replayed (504), and once idle the connection was dropped (hyper
/// handed its socket to the upgrade it had prepared, whose receiver was gone); a refused
/// WebSocket upgrade did the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_offering_h2c_is_replayed_off_a_hung_node_and_its_connection_kept_alive() {
    let (hung, _port, mut b) = hung_a_and_live_b().await;
    let mut cfg = hung_and_live_config(&hung, &b);
    cfg.timeouts.upstream_answer = Duration::from_millis(500);
    cfg.health.fail_timeout_ms = 30_000;
    let proxy = Quick::start(cfg).await;
    let mut s = TcpStream::connect(proxy.addr)
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"));
    let node = tcp_get_with(
        &mut s,
        "Cookie: route=a\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n\
         HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n",
    )
    .await;
    assert_eq!(node.as_deref(), Ok("b"), "replayed off the hung node");
    // Idle past the moment an idle connection is parked (1 s), then the next request.
    async fn kept_alive(s: &mut TcpStream, what: &str) {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let node = tcp_get_with(s, "Cookie: route=b\r\n").await;
        assert_eq!(
            node.as_deref(),
            Ok("b"),
            "{what}: the connection kept alive"
        );
    }
    kept_alive(&mut s, "h2c offered").await;
    // A refused WebSocket upgrade keeps its connection alive too.
    let mut s = TcpStream::connect(proxy.addr)
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"));
    let refused = tcp_get_with(
        &mut s,
        "Cookie: route=b\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n",
    )
    .await;
    assert_eq!(refused.as_deref(), Ok("b"), "the node's own refusal");
    kept_alive(&mut s, "a WebSocket refused").await;
    // And so does a CONNECT limpet refuses itself (405).
    let mut s = TcpStream::connect(proxy.addr)
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"));
    let refused = tcp_request(&mut s, "CONNECT recovery.test:443 HTTP/1.1", "").await;
    assert!(
        refused
            .as_deref()
            .is_ok_and(|h| h.starts_with("http/1.1 405")
                && h.contains(
                    "\r\nallow: get, head, post, put, delete, options, patch, trace\r\n"
                )),
        "a 405 that lists what is allowed: {refused:?}"
    );
    kept_alive(&mut s, "a CONNECT refused").await;
    proxy.stop().await;
    drop(hung);
    b.kill().await;
}

/// A session moved off its node says why in its re-pin (`limpet_pins_total{reason}`, and the
/// `re-pinned(...)` log field): its node took the request and never answered
/// (`answer-timeout`), took it and closed the connection without an answer byte
/// (`answer-failed`), or refused the connection (`connect-failed`). Each GET is answered by b
/// and the answer re-pins the session there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_moved_off_its_node_is_re_pinned_for_how_the_node_failed() {
    let (hung, _port, mut b) = hung_a_and_live_b().await;
    // Node c: reads the request, then closes the connection without answering.
    let dropper = TcpListener::bind("127.0.0.4:0")
        .await
        .unwrap_or_else(|e| panic!("bind dropping node: {e}"));
    let c_addr = dropper
        .local_addr()
        .unwrap_or_else(|e| panic!("dropping node addr: {e}"));
    let drops = tokio::spawn(async move {
        while let Ok((mut s, _)) = dropper.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
            });
        }
    });
    let mut cfg = hung_and_live_config(&hung, &b);
    cfg.nodes.push(limpet::proxy::NodeConfig {
        name: "c".into(),
        addr: c_addr,
    });
    cfg.timeouts.upstream_answer = Duration::from_millis(300);
    // One failure per node in this test: none goes DOWN (which would re-pin as node-down).
    cfg.health.fall = 5;
    let proxy = Quick::start(cfg).await;
    let repins = |reason: &str| -> u64 {
        let text = proxy.runtime.state().lifecycle.metrics.encode();
        let series = format!(r#"outcome="repinned",reason="{reason}"}} "#);
        text.lines()
            .filter(|l| l.starts_with("limpet_pins_total{") && l.contains(&series))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    };
    for reason in ["answer-timeout", "answer-failed", "connect-failed"] {
        assert_eq!(repins(reason), 0, "{reason} before any request");
    }

    let mut h1 = H1::open(proxy.addr).await;
    for (cookie, reason) in [("route=a", "answer-timeout"), ("route=c", "answer-failed")] {
        let got = h1
            .get(Some(cookie))
            .await
            .unwrap_or_else(|e| panic!("GET with {cookie}: {e}"));
        assert_eq!(
            (got.status, got.node.as_str(), got.set_cookie.as_deref()),
            (200, "b", Some("route=b")),
            "GET with {cookie}"
        );
        assert_eq!(
            repins(reason),
            1,
            "GET with {cookie} re-pinned for {reason}"
        );
    }
    // a's socket closed: its connects are refused now.
    drop(hung);
    let got = h1
        .get(Some("route=a"))
        .await
        .unwrap_or_else(|e| panic!("GET with route=a, refused: {e}"));
    assert_eq!(
        (got.status, got.node.as_str(), got.set_cookie.as_deref()),
        (200, "b", Some("route=b"))
    );
    assert_eq!(repins("connect-failed"), 1);
    assert_eq!(
        (repins("answer-timeout"), repins("answer-failed")),
        (1, 1),
        "each re-pin counted once, under its own reason"
    );
    proxy.stop().await;
    drops.abort();
    b.kill().await;
}

/// Quick mode in front of three built-in nodes a, b and c (`upstream_answer` when given).
async fn three_nodes(upstream_answer: Option<Duration>) -> (Vec<Backend>, Quick) {
    let mut nodes = Vec::new();
    for name in ["a", "b", "c"] {
        nodes.push(Backend::start(name).await);
    }
    let proxy = quick_over_abc(&nodes, upstream_answer).await;
    (nodes, proxy)
}

/// Quick mode in front of `nodes`, named a, b and c (`upstream_answer` when given).
async fn quick_over_abc(nodes: &[Backend], upstream_answer: Option<Duration>) -> Quick {
    quick_over_abc_with(nodes, |cfg| {
        if let Some(t) = upstream_answer {
            cfg.timeouts.upstream_answer = t;
        }
    })
    .await
}

/// The library proxy over nodes a, b and c, its config changed by `edit`.
async fn quick_over_abc_with(
    nodes: &[Backend],
    edit: impl FnOnce(&mut limpet::proxy::ProxyConfig),
) -> Quick {
    let mut cfg = limpet::proxy::ProxyConfig::new(
        ["a", "b", "c"]
            .iter()
            .zip(nodes)
            .map(|(name, n)| limpet::proxy::NodeConfig {
                name: (*name).into(),
                addr: n.addr,
            })
            .collect(),
    );
    edit(&mut cfg);
    Quick::start(cfg).await
}

/// Failed attempts counted on a, b and c, in increasing order.
fn errors_per_node(proxy: &Quick) -> Vec<u64> {
    let now = limpet::clock::now_ms();
    let metrics = &proxy.runtime.state().lifecycle.metrics;
    let mut errors: Vec<u64> = ["a", "b", "c"]
        .iter()
        .map(|n| metrics.traffic(n, now).errors)
        .collect();
    errors.sort_unstable();
    errors
}

/// A GET that outlasts `upstream_answer` on every node is slow by itself: it is replayed on
/// one other node, not on each in turn, then answered 504. Two nodes are charged a failure
/// and the third never sees it: replayed on all, a few such requests took every node DOWN
/// (and kept the client waiting the answer timeout once per node).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_slow_on_every_node_is_replayed_once_then_answered_504() {
    let (nodes, proxy) = three_nodes(Some(Duration::from_millis(300))).await;
    let url = format!("{}slow?ms=3000", proxy.url());
    let (status, _) = tokio::time::timeout(PATIENCE, get(&fresh_client(), &url))
        .await
        .unwrap_or_else(|_| panic!("no answer"))
        .unwrap_or_else(|e| panic!("GET: {e}"));
    assert_eq!(status, 504);
    assert_eq!(
        errors_per_node(&proxy),
        [0, 1, 1],
        "two nodes tried, one left alone"
    );
    for n in ["a", "b", "c"] {
        assert_eq!(proxy.state_of(n), "UP", "{n}");
    }
    proxy.stop().await;
    for mut n in nodes {
        n.kill().await;
    }
}

/// A node that resets each connection once the first bytes of a request came, while the
/// rest of a large head is still on its way: its kernel takes little at a time (a small MSS
/// and receive buffer), so limpet's write of a head of tens of KiB fails after a first part
/// went out (a node, or a device before it, that refuses a head it will not take with a
/// reset). `accepted` counts the connections that reached it.
struct Resetting {
    addr: SocketAddr,
    accepted: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl Resetting {
    fn start() -> Resetting {
        use socket2::{Domain, Socket, Type};
        let socket = Socket::new(Domain::IPV4, Type::STREAM, None)
            .unwrap_or_else(|e| panic!("resetting node socket: {e}"));
        // Both set before `listen`: accepted connections take them (the MSS is announced in
        // the handshake; with it and the receive window this small, limpet's send buffer
        // does not grow toward the head's size).
        socket
            .set_tcp_mss(536)
            .unwrap_or_else(|e| panic!("resetting node mss: {e}"));
        socket
            .set_recv_buffer_size(2048)
            .unwrap_or_else(|e| panic!("resetting node rcvbuf: {e}"));
        socket
            .bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
            .unwrap_or_else(|e| panic!("bind resetting node: {e}"));
        socket
            .listen(16)
            .unwrap_or_else(|e| panic!("listen resetting node: {e}"));
        socket
            .set_nonblocking(true)
            .unwrap_or_else(|e| panic!("resetting node nonblocking: {e}"));
        let listener = TcpListener::from_std(socket.into())
            .unwrap_or_else(|e| panic!("resetting node listener: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("resetting node addr: {e}"));
        let accepted = Arc::new(AtomicU64::new(0));
        let count = Arc::clone(&accepted);
        let task = tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut first = [0u8; 1];
                    if matches!(s.read(&mut first).await, Ok(1)) {
                        // Closed with data unread and no linger: a reset.
                        let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
                    }
                });
            }
        });
        Resetting {
            addr,
            accepted,
            task,
        }
    }
}

impl Drop for Resetting {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A node with a body timeout shorter than limpet's `client_idle` (nginx's
/// `client_body_timeout`, Apache's `mod_reqtimeout`) ends the connection of a client that
/// stopped sending its upload: the client gets 408, and the node is not charged. `fall`
/// such clients at once leave it UP and serving. (Before, each was the node's failure, a
/// 502: a few clients stalling uploads took a healthy node DOWN, and every session on it
/// moved.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_gives_up_on_a_stalled_upload_is_not_charged_and_the_client_gets_408() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    // The node: reads what comes, and closes once nothing came for its body timeout.
    const NODE_BODY_TIMEOUT: Duration = Duration::from_millis(1500);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let node = tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                while let Ok(Ok(n)) =
                    tokio::time::timeout(NODE_BODY_TIMEOUT, s.read(&mut buf)).await
                {
                    if n == 0 {
                        break;
                    }
                }
            });
        }
    });
    let mut cfg = limpet::proxy::ProxyConfig::new(vec![limpet::proxy::NodeConfig {
        name: "n".into(),
        addr,
    }]);
    cfg.timeouts.client_idle = Duration::from_secs(10);
    let fall = cfg.health.fall;
    let proxy = Quick::start(cfg).await;
    let uploads = (0..fall).map(|_| {
        let to = proxy.addr;
        tokio::spawn(async move {
            let mut s = TcpStream::connect(to).await.expect("connect");
            s.write_all(
                b"POST /upload HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n0123456789",
            )
            .await
            .expect("write");
            let mut answer = Vec::new();
            let _ = tokio::time::timeout(PATIENCE, s.read_to_end(&mut answer)).await;
            String::from_utf8_lossy(&answer).into_owned()
        })
    });
    for upload in futures_util::future::join_all(uploads).await {
        let answer = upload.expect("client");
        assert!(
            answer.starts_with("HTTP/1.1 408"),
            "the client's doing: {answer:?}"
        );
    }
    assert_eq!(proxy.state_of("n"), "UP", "the node is not charged");
    node.abort();
}

/// A node that answers an upload at once (a 401 before the body, as an auth check does) and
/// reads the body on keeps the request's slot until the upload ends: its node connection is
/// in use meanwhile. At `max_connections = 1`, the slot is held after the client has read
/// the whole answer, while the body still goes to the node, and let go once it is through.
/// (Before, it went with the answer's end: a second request reached the node beside the
/// upload, and a drain read the node as having no connection.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_answered_before_its_end_holds_its_node_slot_until_it_is_through() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    const BODY: usize = 20_000;
    const CHUNK: usize = 1_000;
    // The node: answers each request at once (a POST with 401, its body read after), and
    // reads the next on the same connection.
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let node = tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
                    buf.drain(..end + 4);
                    let length: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    let answer: &[u8] = if head.starts_with("post") {
                        b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 0\r\n\r\n"
                    } else {
                        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
                    };
                    if s.write_all(answer).await.is_err() {
                        return;
                    }
                    while buf.len() < length {
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    buf.drain(..length);
                }
            });
        }
    });
    let cfg = limpet::proxy::ProxyConfig::new(vec![limpet::proxy::NodeConfig {
        name: "n".into(),
        addr,
    }]);
    let proxy = Quick::start(cfg).await;
    let state = proxy.runtime.state();
    let rt = node_rt(&state, "n");
    rt.set_limits(Some(1), 10);

    let mut up = TcpStream::connect(proxy.addr).await.expect("connect");
    let head = format!("POST /up HTTP/1.1\r\nHost: t\r\nContent-Length: {BODY}\r\n\r\n");
    up.write_all(head.as_bytes()).await.expect("head");
    up.write_all(&[b'x'; CHUNK]).await.expect("first chunk");
    // The whole answer (no body), read by the client.
    let mut answer = Vec::new();
    let mut byte = [0u8; 1];
    while !answer.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(PATIENCE, up.read(&mut byte))
            .await
            .expect("the answer in time")
            .expect("read");
        assert_eq!(n, 1, "the answer ended early: {answer:?}");
        answer.push(byte[0]);
    }
    assert!(answer.starts_with(b"HTTP/1.1 401"), "{answer:?}");
    // The upload goes on, on the node's one connection: its slot still held.
    for _ in 1..BODY / CHUNK {
        assert_eq!(rt.admitted(), 1, "the upload's slot let go with its answer");
        up.write_all(&[b'x'; CHUNK]).await.expect("chunk");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Through: the slot goes, and the next request is served.
    let deadline = Instant::now() + PATIENCE;
    while rt.admitted() > 0 {
        assert!(Instant::now() < deadline, "the slot was never let go");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let next = get(&fresh_client(), &proxy.url()).await;
    assert_eq!(next.map(|(status, _)| status), Ok(200));
    node.abort();
}

/// A GET whose head every node resets while limpet writes it (a head a node will not take)
/// failed each node after a part of it went out: it is replayed on one other node, not on
/// each in turn, then answered 502, as a request unanswered on two nodes is. Replayed on
/// all, a few such requests charged every node and could take them all DOWN.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_head_each_node_resets_is_tried_on_two_nodes_only() {
    let nodes: Vec<Resetting> = (0..3).map(|_| Resetting::start()).collect();
    let mut cfg = limpet::proxy::ProxyConfig::new(
        ["a", "b", "c"]
            .iter()
            .zip(&nodes)
            .map(|(name, n)| limpet::proxy::NodeConfig {
                name: (*name).into(),
                addr: n.addr,
            })
            .collect(),
    );
    cfg.limits.max_header_bytes = 1024 * 1024;
    let proxy = Quick::start(cfg).await;
    // Under the listener's `max_header_bytes` (raised to 1 MiB here), far over what limpet's
    // kernel holds at once for a node that takes this little, whatever its `tcp_wmem`'s
    // default: the write cannot complete before the reset.
    let cookie = format!("big={}", "x".repeat(768 * 1024));
    let answer = tokio::time::timeout(
        PATIENCE,
        fresh_client()
            .get(proxy.url())
            .header("cookie", cookie)
            .send(),
    )
    .await
    .unwrap_or_else(|_| panic!("no answer"))
    .unwrap_or_else(|e| panic!("GET: {e}"));
    assert_eq!(answer.status(), 502);
    let reached: u64 = nodes
        .iter()
        .map(|n| n.accepted.load(Ordering::SeqCst))
        .sum();
    assert_eq!(reached, 2, "two nodes tried, one left alone");
    assert_eq!(errors_per_node(&proxy), [0, 1, 1]);
    proxy.stop().await;
}

/// A node that takes every connection and reads each request head, then never answers:
/// each head's request line is told on `heads` as it arrives (the request reached the node).
struct Holding {
    addr: SocketAddr,
    heads: tokio::sync::mpsc::UnboundedReceiver<String>,
    task: JoinHandle<()>,
}

impl Holding {
    async fn start() -> Holding {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("bind holding node: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("holding addr: {e}"));
        let (tx, heads) = tokio::sync::mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            let mut held = JoinSet::new();
            while let Ok((mut s, _)) = listener.accept().await {
                let tx = tx.clone();
                held.spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 1024];
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let line = String::from_utf8_lossy(&buf)
                        .lines()
                        .next()
                        .unwrap_or("")
                        .to_owned();
                    let _ = tx.send(line);
                    // Held open, never answered, until the test ends.
                    let _ = s.read(&mut chunk).await;
                    std::future::pending::<()>().await;
                });
            }
        });
        Holding { addr, heads, task }
    }

    /// The request line of the next request head to arrive (bounded).
    async fn next_head(&mut self) -> String {
        tokio::time::timeout(PATIENCE, self.heads.recv())
            .await
            .unwrap_or_else(|_| panic!("no request reached the holding node"))
            .unwrap_or_else(|| panic!("holding node gone"))
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A holding node `a` and a live node `b` behind a quick proxy, answer timeout `answer`.
async fn holding_a_and_live_b(answer: Duration) -> (Holding, Backend, Quick) {
    let a = Holding::start().await;
    let b = Backend::start("b").await;
    let mut cfg = limpet::proxy::ProxyConfig::new(vec![
        limpet::proxy::NodeConfig {
            name: "a".into(),
            addr: a.addr,
        },
        limpet::proxy::NodeConfig {
            name: "b".into(),
            addr: b.addr,
        },
    ]);
    cfg.timeouts.upstream_answer = answer;
    let proxy = Quick::start(cfg).await;
    (a, b, proxy)
}

/// What a request through the proxy got: status, answering node, the affinity cookie set.
type Got = (u16, String, Option<String>);

/// Sends `method /page` with `Cookie: route=a` through `proxy` (a body for a POST), in a task.
fn send_pinned_to_a(proxy: &Quick, method: http::Method) -> JoinHandle<Result<Got, String>> {
    let url = format!("{}page", proxy.url());
    tokio::spawn(async move {
        let mut req = fresh_client()
            .request(method.clone(), &url)
            .header(http::header::COOKIE, "route=a");
        if method == http::Method::POST {
            req = req.body("job");
        }
        let r = req.send().await.map_err(|e| e.to_string())?;
        Ok((
            r.status().as_u16(),
            node_of(r.headers()),
            route_cookie_of(r.headers()),
        ))
    })
}

/// A GET waiting for the answer of a node that goes DOWN meanwhile (its checks or its
/// traffic took it DOWN; forced here) stops waiting: it is replayed on another node at once
/// and its session re-pinned there, not held for the rest of `upstream_answer` (a minute by
/// default: every request in flight when a node hung waited it out, though its checks had
/// found it hung long before). `after`: how long the GET has waited when the DOWN comes
/// (before its first 100 ms, the DOWN count tells; after, the node wakes it).
async fn get_on_a_node_going_down_moves(after: Duration) {
    // Far beyond the client's patience: only the DOWN can end the wait in time.
    let (mut a, mut b, proxy) = holding_a_and_live_b(Duration::from_secs(60)).await;
    let get = send_pinned_to_a(&proxy, http::Method::GET);
    assert_eq!(a.next_head().await, "GET /page HTTP/1.1");
    // Time itself is the condition here (which of the two ways the DOWN reaches the wait).
    tokio::time::sleep(after).await;
    assert_eq!(
        proxy.runtime.state().force_health("a", false),
        Some(limpet_core::Transition::WentDown)
    );
    let got = get
        .await
        .unwrap_or_else(|e| panic!("task: {e}"))
        .unwrap_or_else(|e| panic!("GET: {e}"));
    assert_eq!(got, (200, "b".to_owned(), Some("route=b".to_owned())));
    proxy.stop().await;
    b.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_waiting_on_a_node_that_goes_down_is_replayed_at_once() {
    get_on_a_node_going_down_moves(Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_waiting_a_while_on_a_node_that_goes_down_is_replayed_at_once() {
    get_on_a_node_going_down_moves(Duration::from_millis(300)).await;
}

/// A POST waiting on a node that goes DOWN is not replayed (the node may have acted on it):
/// it waits out its answer timeout, then 504, and no other node sees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_waiting_on_a_node_that_goes_down_is_not_replayed() {
    let (mut a, mut b, proxy) = holding_a_and_live_b(Duration::from_secs(2)).await;
    let post = send_pinned_to_a(&proxy, http::Method::POST);
    assert_eq!(a.next_head().await, "POST /page HTTP/1.1");
    assert!(
        !post.is_finished(),
        "the POST was answered before its node went DOWN"
    );
    assert_eq!(
        proxy.runtime.state().force_health("a", false),
        Some(limpet_core::Transition::WentDown)
    );
    let got = post
        .await
        .unwrap_or_else(|e| panic!("task: {e}"))
        .unwrap_or_else(|e| panic!("POST: {e}"));
    assert_eq!(got, (504, String::new(), None), "the POST went to b");
    proxy.stop().await;
    b.kill().await;
}

/// A GET waiting on a node that goes DOWN while no other node could take it keeps waiting
/// (cut, it would only get an error, where the node may still answer): here the node never
/// does, and the GET gets the answer timeout's 504, not the 503 of a cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_waiting_on_a_node_that_goes_down_with_nowhere_else_to_go_keeps_waiting() {
    let (mut a, mut b, proxy) = holding_a_and_live_b(Duration::from_secs(2)).await;
    let state = proxy.runtime.state();
    assert_eq!(
        state.force_health("b", false),
        Some(limpet_core::Transition::WentDown)
    );
    let get = send_pinned_to_a(&proxy, http::Method::GET);
    assert_eq!(a.next_head().await, "GET /page HTTP/1.1");
    assert_eq!(
        state.force_health("a", false),
        Some(limpet_core::Transition::WentDown)
    );
    let got = get
        .await
        .unwrap_or_else(|e| panic!("task: {e}"))
        .unwrap_or_else(|e| panic!("GET: {e}"));
    assert_eq!(got, (504, String::new(), None));
    proxy.stop().await;
    b.kill().await;
}

/// Node hooks whose `/demo/stall` never answers: each arrival is counted and told.
#[derive(Default)]
struct Stall {
    arrived: AtomicU64,
    told: tokio::sync::Notify,
}

impl limpet::backend::DemoHooks for Stall {
    fn page(&self, node: &str) -> String {
        node.to_owned()
    }

    fn control<'a>(
        &'a self,
        _method: &'a http::Method,
        _path: &'a str,
        _query: &'a str,
        _refusal: Option<&'static str>,
    ) -> limpet::backend::HookFuture<'a, (http::StatusCode, String)> {
        self.arrived.fetch_add(1, Ordering::SeqCst);
        self.told.notify_waiters();
        Box::pin(std::future::pending())
    }
}

impl Stall {
    /// Waits (bounded) until `n` requests have arrived at the stall on any node.
    async fn arrivals(&self, n: u64) {
        tokio::time::timeout(PATIENCE, async {
            loop {
                let told = self.told.notified();
                if self.arrived.load(Ordering::SeqCst) >= n {
                    return;
                }
                told.await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{n} requests never reached the stall"));
    }
}

/// `fall` GETs that outlast `upstream_answer` at once, on a node that answers the requests
/// sent after them meanwhile: the node is alive and the requests are slow by themselves. It
/// is charged nothing and stays UP, the requests are answered 504 without a replay on
/// another node, and their session keeps its pin. Charged, three such clicks at once (a
/// report that takes a minute) took a healthy node DOWN, and, replayed, the next node too
/// (chaos run 27).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_requests_on_a_node_that_answers_younger_ones_charge_it_nothing() {
    let stall = Arc::new(Stall::default());
    let (nodes, proxy) = stalling_abc(&stall, 0).await;
    let (client, home) = pinned_client(&proxy).await;
    three_slow_requests(&proxy, &client, &stall, &home).await;
    assert_eq!(proxy.state_of(&home), "UP");
    let streak = proxy
        .runtime
        .state()
        .node_views()
        .into_iter()
        .find(|v| v.name == home)
        .map(|v| v.status.health.streak());
    assert_eq!(streak, Some(0), "the node was charged a failure");
    // The three 504s are the home node's answers; no other node saw the requests.
    assert_eq!(errors_per_node(&proxy), [0, 0, 3]);
    let metrics = &proxy.runtime.state().lifecycle.metrics;
    let slow = metrics.traffic(&home, limpet::clock::now_ms()).answers_slow;
    assert_eq!(slow, 3, "counted as slow requests of the node");
    let (status, node) = get(&client, &proxy.url())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((status, node), (200, home));
    proxy.stop().await;
    for mut n in nodes {
        n.kill().await;
    }
}

/// A gray failure: a node that answers most requests and lets some outlast
/// `upstream_answer`. By default those are slow requests (the test above); with
/// `max_slow_answers = 3`, the third within `fail_timeout` takes the node DOWN. The three
/// are still answered 504 and not replayed (each is slow by itself), and the session pinned
/// there is re-pinned to another node by its next request, which is answered 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_lets_max_slow_answers_time_out_while_answering_others_goes_down() {
    let stall = Arc::new(Stall::default());
    let (nodes, proxy) = stalling_abc(&stall, 3).await;
    let (client, home) = pinned_client(&proxy).await;
    three_slow_requests(&proxy, &client, &stall, &home).await;
    assert_eq!(proxy.state_of(&home), "DOWN", "the third slow answer");
    assert_eq!(proxy.down_cause(&home), Some("slow-answers"));
    let metrics = &proxy.runtime.state().lifecycle.metrics;
    let counted = metrics.traffic(&home, limpet::clock::now_ms()).answers_slow;
    assert_eq!(counted, 3);
    // The session moves: answered by another node, which its cookie now names.
    let (status, moved) = get(&client, &proxy.url())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(status, 200);
    assert_ne!(moved, home, "still sent to the DOWN node");
    for _ in 0..3 {
        let (status, node) = get(&client, &proxy.url())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((status, node.as_str()), (200, moved.as_str()), "re-pinned");
    }
    proxy.stop().await;
    for mut n in nodes {
        n.kill().await;
    }
}

/// `limpet proxy --max-slow-answers N` sets the rule (0, off, without it).
#[test]
fn the_max_slow_answers_flag_reaches_the_config() {
    let to = ["--to", "a=127.0.0.1:1", "--to", "b=127.0.0.1:2"];
    assert_eq!(quick_config(&to).health.max_slow_answers, 0);
    let with = [&to[..], &["--max-slow-answers", "3"]].concat();
    assert_eq!(quick_config(&with).health.max_slow_answers, 3);
}

/// Slow answers of the last node that takes sessions are not counted: with b and c in
/// MAINT, three slow answers at `max_slow_answers = 3` leave a UP, and its sessions served,
/// where taking it DOWN would leave none. Once b takes sessions again, three more take a
/// DOWN (so the first three were reported, and not counted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_answers_never_take_down_the_last_node_taking_sessions() {
    let stall = Arc::new(Stall::default());
    let (nodes, proxy) = stalling_abc(&stall, 3).await;
    for n in ["b", "c"] {
        proxy
            .runtime
            .state()
            .set_admin(n, limpet_core::AdminState::Maint);
    }
    let (client, home) = pinned_client(&proxy).await;
    assert_eq!(home, "a");
    three_slow_requests(&proxy, &client, &stall, &home).await;
    assert_eq!(proxy.state_of("a"), "UP", "the last node taking sessions");
    let metrics = &proxy.runtime.state().lifecycle.metrics;
    assert_eq!(
        metrics.traffic("a", limpet::clock::now_ms()).answers_slow,
        3
    );
    let (status, node) = get(&client, &proxy.url())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((status, node.as_str()), (200, "a"));

    proxy
        .runtime
        .state()
        .set_admin("b", limpet_core::AdminState::Ready);
    three_slow_requests(&proxy, &client, &stall, &home).await;
    assert_eq!(proxy.state_of("a"), "DOWN", "b takes sessions again");
    let (status, node) = get(&client, &proxy.url())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((status, node.as_str()), (200, "b"));
    proxy.stop().await;
    for mut n in nodes {
        n.kill().await;
    }
}

/// Nodes a, b and c, their `/demo/...` answered by `stall`, behind the library proxy with
/// `upstream_answer` 2 s (long enough for younger requests to be answered meanwhile on a
/// loaded machine) and `max_slow_answers`.
async fn stalling_abc(stall: &Arc<Stall>, max_slow_answers: u32) -> (Vec<Backend>, Quick) {
    let mut nodes = Vec::new();
    for name in ["a", "b", "c"] {
        let hooks: Arc<dyn limpet::backend::DemoHooks> = stall.clone();
        nodes.push(Backend::start_with_hooks(name, hooks).await);
    }
    let proxy = quick_over_abc_with(&nodes, |cfg| {
        cfg.timeouts.upstream_answer = Duration::from_secs(2);
        cfg.health.max_slow_answers = max_slow_answers;
    })
    .await;
    (nodes, proxy)
}

/// A browser-like client with a session: its first GET answered 200, and the node it was
/// pinned to.
async fn pinned_client(proxy: &Quick) -> (reqwest::Client, String) {
    let client = jar_client();
    let (status, home) = get(&client, &proxy.url())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(status, 200);
    (client, home)
}

/// Three GETs that `stall` holds, sent with `client` (whose session lives on `home`), then
/// three younger ones that `home` answers: the three held ones are answered 504 and none is
/// replayed on another node (each is slow by itself, its node alive).
async fn three_slow_requests(proxy: &Quick, client: &reqwest::Client, stall: &Stall, home: &str) {
    let before = stall.arrived.load(Ordering::SeqCst);
    let mut slow = JoinSet::new();
    for _ in 0..3 {
        let client = client.clone();
        let url = format!("{}demo/stall", proxy.url());
        slow.spawn(async move {
            let r = client.get(&url).send().await.map_err(|e| e.to_string())?;
            Ok::<_, String>(r.status().as_u16())
        });
    }
    stall.arrivals(before + 3).await;
    // Sent after the stalled ones, and answered by the same node.
    for _ in 0..3 {
        let (status, node) = get(client, &proxy.url())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((status, node.as_str()), (200, home));
    }
    while let Some(r) = slow.join_next().await {
        let status = r
            .unwrap_or_else(|e| panic!("task: {e}"))
            .unwrap_or_else(|e| panic!("GET: {e}"));
        assert_eq!(status, 504);
    }
    assert_eq!(
        stall.arrived.load(Ordering::SeqCst),
        before + 3,
        "a slow request was replayed on another node"
    );
}

/// With HTTP checks, a check the node answers after a request was sent is a sign of life,
/// as an answer to traffic is: GETs that outlast `upstream_answer` at once on an otherwise
/// idle fleet are answered 504, none replayed, and every node stays UP. Before, with no
/// traffic answered meanwhile, each was replayed on the other node (and charged both).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_requests_on_an_idle_checked_fleet_are_not_replayed() {
    let stall = Arc::new(Stall::default());
    let (mut a, mut b, port) = stalling_pair(&stall).await;
    let (l, _cfg) = checked_limpet("slow-checked", port, "2s").await;
    // New sessions, round robin: the three land on both nodes.
    let mut slow = JoinSet::new();
    for _ in 0..3 {
        let url = format!("http://{}/demo/stall", l.addr("l"));
        slow.spawn(async move { get(&fresh_client(), &url).await });
    }
    stall.arrivals(3).await;
    while let Some(r) = slow.join_next().await {
        let (status, _) = r
            .unwrap_or_else(|e| panic!("task: {e}"))
            .unwrap_or_else(|e| panic!("GET: {e}"));
        assert_eq!(status, 504);
    }
    assert_eq!(
        stall.arrived.load(Ordering::SeqCst),
        3,
        "a slow request was replayed on the other node"
    );
    let mut counted = 0;
    for n in ["a", "b"] {
        let view = node_view(&l, n).await;
        assert_eq!(view["state"], "UP", "{view}");
        counted += view["traffic"]["answers_slow"].as_u64().unwrap_or(0);
    }
    assert_eq!(counted, 3, "counted as slow requests of their nodes");
    l.stop().await;
    a.kill().await;
    b.kill().await;
}

/// A gray failure on a checked fleet (the real binary): the node passes every check (it
/// answers `/`) and hangs `/demo/...`. With `max_slow_answers = 2`, its second slow answer
/// takes it DOWN though its checks pass, the session pinned there is answered by the other
/// node, and the checks bring it back after `rise` passes, as from any DOWN. The slow
/// requests themselves are answered 504, not replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checked_node_hanging_some_requests_goes_down_at_max_slow_answers_and_checks_restore_it()
{
    const RISE: u64 = 8;
    let stall = Arc::new(Stall::default());
    let (mut a, mut b, port) = stalling_pair(&stall).await;
    let listener = "timeouts = { upstream_answer = \"2s\", drain = \"1s\" }\n";
    let text = hung_config(port, listener).replace(
        "rise = 2\n",
        &format!("rise = {RISE}\nmax_slow_answers = 2\n"),
    );
    let cfg = ConfigFile::new("slow-gray", &text);
    let l = Limpet::start(&cfg).await;
    let url = format!("http://{}/", l.addr("l"));
    let client = jar_client();
    let (status, home) = get(&client, &url).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(status, 200);
    let other = if home == "a" { "b" } else { "a" };

    let mut slow = JoinSet::new();
    for _ in 0..2 {
        let client = client.clone();
        let url = format!("{url}demo/stall");
        slow.spawn(async move { get(&client, &url).await });
    }
    stall.arrivals(2).await;
    // The node answers younger requests (and its checks) meanwhile.
    let (status, node) = get(&client, &url).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((status, node.as_str()), (200, home.as_str()));
    while let Some(r) = slow.join_next().await {
        let (status, _) = r
            .unwrap_or_else(|e| panic!("task: {e}"))
            .unwrap_or_else(|e| panic!("GET: {e}"));
        assert_eq!(status, 504);
    }
    let went_down = Instant::now();
    assert_eq!(
        stall.arrived.load(Ordering::SeqCst),
        2,
        "a slow request was replayed on the other node"
    );
    let view = node_view(&l, &home).await;
    assert_eq!(view["state"], "DOWN", "{view}");
    assert_eq!(view["health"]["down_cause"], "slow-answers", "{view}");
    assert_eq!(view["checks"][0]["consecutive_failures"], 0, "{view}");
    assert_eq!(view["traffic"]["answers_slow"], 2, "{view}");
    assert!(
        metrics_text(&l).await.contains(&format!(
            "limpet_health_transitions_total{{node=\"{home}\",to=\"down\"}} 1"
        )),
        "counted as a transition"
    );
    // The session goes on at the other node, re-pinned there.
    for _ in 0..2 {
        let (status, node) = get(&client, &url).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((status, node.as_str()), (200, other));
    }
    // Its checks pass all along: UP again after `rise` of them.
    let bound = Duration::from_millis(RISE * HUNG_INTERVAL_MS) + SLACK;
    let back = await_state(&l, &home, "UP", went_down, went_down + bound + SLACK)
        .await
        .unwrap_or_else(|v| panic!("not back within {bound:?}: {v}"));
    // Not sooner than half of `rise` intervals (the checks' jitter aside): the passes the
    // node made while its slow requests waited do not count toward it.
    assert!(
        back >= Duration::from_millis(RISE * HUNG_INTERVAL_MS / 2),
        "back after {back:?}: before `rise` passes"
    );
    l.stop().await;
    a.kill().await;
    b.kill().await;
}

/// Nodes a (127.0.0.2) and b (127.0.0.3) on one port, their `/demo/...` answered by `stall`.
async fn stalling_pair(stall: &Arc<Stall>) -> (Backend, Backend, u16) {
    let (la, lb, port) = common_port_pair().await;
    (
        Backend::serve_hooked("a", la, stall.clone()),
        Backend::serve_hooked("b", lb, stall.clone()),
        port,
    )
}

/// A request that breaks whichever node takes it (the node closes the connection once it
/// has read it, as a worker that crashes on it does): replayed on one other node, not on
/// each in turn, then answered 502. Replayed on every node, three such GETs took every
/// node DOWN, and the clients of every session got 503 for `fail_timeout` (chaos run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_breaks_every_node_is_replayed_once_then_answered_502() {
    let (nodes, proxy) = three_nodes(None).await;
    let url = format!("{}drop", proxy.url());
    let (status, _) = tokio::time::timeout(PATIENCE, get(&fresh_client(), &url))
        .await
        .unwrap_or_else(|_| panic!("no answer"))
        .unwrap_or_else(|e| panic!("GET: {e}"));
    assert_eq!(status, 502);
    assert_eq!(
        errors_per_node(&proxy),
        [0, 1, 1],
        "two nodes tried, one left alone"
    );
    // Two more: with fall 3 and every node tried each time, all three would be DOWN now.
    for _ in 0..2 {
        let (status, _) = tokio::time::timeout(PATIENCE, get(&fresh_client(), &url))
            .await
            .unwrap_or_else(|_| panic!("no answer"))
            .unwrap_or_else(|e| panic!("GET: {e}"));
        assert_eq!(status, 502);
    }
    let up = ["a", "b", "c"]
        .iter()
        .filter(|n| proxy.state_of(n) == "UP")
        .count();
    assert!(up >= 1, "three bad requests took every node DOWN");
    let (status, _) = tokio::time::timeout(PATIENCE, get(&fresh_client(), &proxy.url()))
        .await
        .unwrap_or_else(|_| panic!("no answer"))
        .unwrap_or_else(|e| panic!("GET: {e}"));
    assert_eq!(status, 200, "a good request is still served");
    proxy.stop().await;
    for mut n in nodes {
        n.kill().await;
    }
}

/// A node that keeps connections alive and answers each GET with its name in
/// `limpet::backend::NODE_HEADER`, but answers `GET /boom` with the first line of a head and
/// then closes the connection (a worker that crashes writing it), counting each on `booms`.
async fn half_head_node(name: &'static str, booms: Arc<AtomicU64>) -> (SocketAddr, JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("bind: {e}"));
    let addr = l.local_addr().unwrap_or_else(|e| panic!("addr: {e}"));
    (addr, half_head_node_on(l, name, booms, None))
}

/// [`half_head_node`] on listener `l`, over TLS with `tls`.
fn half_head_node_on(
    l: TcpListener,
    name: &'static str,
    booms: Arc<AtomicU64>,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let (booms, tls) = (Arc::clone(&booms), tls.clone());
            tokio::spawn(async move {
                match tls {
                    Some(cfg) => {
                        if let Ok(s) = tokio_rustls::TlsAcceptor::from(cfg).accept(s).await {
                            serve_half_head(s, name, &booms).await;
                        }
                    }
                    None => serve_half_head(s, name, &booms).await,
                }
            });
        }
    })
}

/// One connection of a [`half_head_node`].
async fn serve_half_head<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    mut s: S,
    name: &str,
    booms: &AtomicU64,
) {
    let mut buf = Vec::new();
    let mut b = [0u8; 4096];
    loop {
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            match s.read(&mut b).await {
                Ok(n @ 1..) => buf.extend_from_slice(&b[..n]),
                _ => return,
            }
            continue;
        };
        let head: Vec<u8> = buf.drain(..end + 4).collect();
        if head.starts_with(b"GET /boom ") {
            booms.fetch_add(1, Ordering::SeqCst);
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\n").await;
            let _ = s.flush().await;
            return;
        }
        let answer = format!(
            "HTTP/1.1 200 OK\r\n{}: {name}\r\ncontent-length: 2\r\n\r\nok",
            limpet::backend::NODE_HEADER
        );
        if s.write_all(answer.as_bytes()).await.is_err() || s.flush().await.is_err() {
            return;
        }
    }
}

/// The same request that breaks nodes, reaching them on kept-alive connections after part of
/// an answer: a node that wrote a head's first line and then closed did not race an idle
/// close (that ends before any answer byte, and is retried on a fresh connection to the same
/// node). It failed the request, so it is charged, and the request goes to one other node at
/// most: 502, the third node never sees it. Before, such a failure on a kept-alive connection
/// was taken for the keep-alive race: no node charged, and the request replayed on every
/// node in turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_breaks_nodes_on_kept_alive_connections_is_replayed_once_and_charged() {
    let booms: Vec<Arc<AtomicU64>> = (0..3).map(|_| Arc::new(AtomicU64::new(0))).collect();
    let mut nodes = Vec::new();
    for (name, n) in ["a", "b", "c"].into_iter().zip(&booms) {
        nodes.push(half_head_node(name, Arc::clone(n)).await);
    }
    let cfg = limpet::proxy::ProxyConfig::new(
        ["a", "b", "c"]
            .iter()
            .zip(&nodes)
            .map(|(name, (addr, _))| limpet::proxy::NodeConfig {
                name: (*name).into(),
                addr: *addr,
            })
            .collect(),
    );
    let proxy = Quick::start(cfg).await;
    // A kept-alive connection to each node in limpet's pool.
    let client = fresh_client();
    for name in ["a", "b", "c"] {
        let r = client
            .get(proxy.url())
            .header("cookie", format!("route={name}"))
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET: {e}"));
        assert_eq!(node_of(r.headers()), name);
        r.bytes().await.unwrap_or_else(|e| panic!("body: {e}"));
    }
    let (status, _) = tokio::time::timeout(
        PATIENCE,
        get(&fresh_client(), &format!("{}boom", proxy.url())),
    )
    .await
    .unwrap_or_else(|_| panic!("no answer"))
    .unwrap_or_else(|e| panic!("GET: {e}"));
    assert_eq!(status, 502);
    let seen: Vec<u64> = booms.iter().map(|n| n.load(Ordering::SeqCst)).collect();
    assert_eq!(
        seen.iter().sum::<u64>(),
        2,
        "sent to two nodes, the third left alone: {seen:?}"
    );
    let state = proxy.runtime.state();
    for (name, n) in ["a", "b", "c"].into_iter().zip(&seen) {
        let id = state.node_id(name).unwrap_or_else(|| panic!("node {name}"));
        let health = state
            .node_rt(id)
            .unwrap_or_else(|| panic!("runtime of {name}"))
            .status()
            .health;
        assert_eq!(
            u64::from(health.streak()),
            *n,
            "{name}: charged for each request it broke: {health:?}"
        );
    }
    drop(state);
    proxy.stop().await;
    for (_, t) in nodes {
        t.abort();
    }
}

/// The same over TLS to the nodes, whose requests take hyper's client (not `node_h1`): a node
/// that wrote a head's first line on a kept-alive connection and closed failed the request,
/// so the GET is replayed on one other node, once, then 502: of three nodes, two are tried,
/// each once. Before, hyper's report of a head cut short (the same as for no answer at all)
/// was taken for the keep-alive race: the GET went to each node twice, once on its
/// kept-alive connection and once on a fresh one; then, that mended, the failure was still
/// the race's for the replay's count and the node's charge, and the GET went to all three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_breaks_tls_nodes_on_kept_alive_connections_reaches_each_node_once() {
    let booms: Vec<Arc<AtomicU64>> = (0..3).map(|_| Arc::new(AtomicU64::new(0))).collect();
    let ips = ["127.0.0.2", "127.0.0.3", "127.0.0.4"];
    let (listeners, port) = admin_common::ports::common_port_on(&ips).await;
    let (_, tls) = tls_identity("127.0.0.2");
    let nodes: Vec<_> = listeners
        .into_iter()
        .zip(["a", "b", "c"])
        .zip(&booms)
        .map(|((l, name), boom)| {
            half_head_node_on(l, name, Arc::clone(boom), Some(Arc::clone(&tls)))
        })
        .collect();
    let cfg = ConfigFile::new(
        "tls-half-head",
        &format!(
            "{}[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = {port}\n\
             upstream_tls = {{ verify = \"none\" }}\n\n[admin]\nlisten = \"127.0.0.1:0\"\n",
            nodes_toml(&[("a", ips[0]), ("b", ips[1]), ("c", ips[2])]),
        ),
    );
    let l = Limpet::start(&cfg).await;
    let url = format!("http://{}/", l.addr("web"));
    // A kept-alive connection to each node in limpet's pool: fresh sessions go round.
    let mut warmed = std::collections::BTreeSet::new();
    for _ in 0..6 {
        let (status, node) = get(&fresh_client(), &url)
            .await
            .unwrap_or_else(|e| panic!("GET: {e}"));
        assert_eq!(status, 200);
        warmed.insert(node);
    }
    assert_eq!(warmed.len(), 3, "{warmed:?}");
    let (status, _) = tokio::time::timeout(PATIENCE, get(&fresh_client(), &format!("{url}boom")))
        .await
        .unwrap_or_else(|_| panic!("no answer"))
        .unwrap_or_else(|e| panic!("GET: {e}"));
    assert_eq!(status, 502);
    let seen: Vec<u64> = booms.iter().map(|n| n.load(Ordering::SeqCst)).collect();
    assert_eq!(
        (seen.iter().sum::<u64>(), seen.iter().max().copied()),
        (2, Some(1)),
        "sent to two nodes, each once: {seen:?}"
    );
    // Each node the GET broke is charged one failure (its streak toward `fall`), the third
    // none.
    for (name, sent) in ["a", "b", "c"].into_iter().zip(&seen) {
        let view = admin_json(&l, &format!("/api/v1/nodes/{name}")).await;
        assert_eq!(
            view["health"]["streak"].as_u64(),
            Some(*sent),
            "{name}: {view}"
        );
    }
    l.stop().await;
    for t in nodes {
        t.abort();
    }
}

/// A node answer with both a Content-Length and a Transfer-Encoding (read by the latter)
/// leaves its connection out of the pool on hyper's client too (requests with a body take
/// it): five POSTs from five clients reach the node on five connections. Before, a later
/// one went out on an earlier one's connection, where whatever the node framed by the length would
/// have been read as its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_connection_whose_answer_had_both_lengths_is_not_reused() {
    let l = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("bind: {e}"));
    let addr = l.local_addr().unwrap_or_else(|e| panic!("addr: {e}"));
    let accepted = Arc::new(AtomicU64::new(0));
    let node = tokio::spawn({
        let accepted = Arc::clone(&accepted);
        async move {
            while let Ok((mut s, _)) = l.accept().await {
                accepted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut b = [0u8; 4096];
                    loop {
                        // A head and its 2-byte body (`hi`), then the answer; again.
                        while !buf.windows(4).any(|w| w == b"\r\n\r\n")
                            || buf.len()
                                < buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or(0) + 6
                        {
                            match s.read(&mut b).await {
                                Ok(n @ 1..) => buf.extend_from_slice(&b[..n]),
                                _ => return,
                            }
                        }
                        let end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or(0);
                        buf.drain(..end + 6);
                        let answer = "HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\
                                      transfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
                        if s.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        }
    });
    let proxy = Quick::start(limpet::proxy::ProxyConfig::new(vec![
        limpet::proxy::NodeConfig {
            name: "n".into(),
            addr,
        },
    ]))
    .await;
    for _ in 0..5 {
        let r = fresh_client()
            .post(proxy.url())
            .body("hi")
            .send()
            .await
            .unwrap_or_else(|e| panic!("POST: {e}"));
        assert_eq!(r.status(), 200);
        assert_eq!(
            &r.bytes().await.unwrap_or_else(|e| panic!("{e}"))[..],
            b"abc"
        );
    }
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        5,
        "each POST on a connection of its own"
    );
    proxy.stop().await;
    node.abort();
}

/// One HTTP/2 stream whose request body limpet cannot take (its node stopped reading: a
/// small receive buffer, never read) does not hold up the other streams' uploads on the
/// same connection: a POST to the other node on a second stream is answered at once, while
/// the first still waits. Before, the stuck stream's unread body filled the whole
/// connection's flow-control window (hyper's default: as large as one stream's), and the
/// second stream's body could not be sent until the first failed at `upstream_answer`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2_stream_stuck_on_its_upload_does_not_hold_up_the_others() {
    // a: takes connections and never reads them, with a small receive buffer.
    let sock = TcpSocket::new_v4().unwrap_or_else(|e| panic!("socket: {e}"));
    sock.set_recv_buffer_size(4096)
        .unwrap_or_else(|e| panic!("SO_RCVBUF: {e}"));
    sock.bind("127.0.0.1:0".parse().unwrap_or_else(|e| panic!("{e}")))
        .unwrap_or_else(|e| panic!("bind: {e}"));
    let a_addr = sock.local_addr().unwrap_or_else(|e| panic!("{e}"));
    let a_listener = sock.listen(16).unwrap_or_else(|e| panic!("listen: {e}"));
    let (a_took_tx, mut a_took) = tokio::sync::mpsc::unbounded_channel();
    let a = tokio::spawn(async move {
        while let Ok((s, _)) = a_listener.accept().await {
            let _ = a_took_tx.send(s);
        }
    });
    let b = Backend::start("b").await;
    let mut cfg = limpet::proxy::ProxyConfig::new(vec![
        limpet::proxy::NodeConfig {
            name: "a".into(),
            addr: a_addr,
        },
        limpet::proxy::NodeConfig {
            name: "b".into(),
            addr: b.addr,
        },
    ]);
    cfg.timeouts.upstream_answer = Duration::from_secs(20);
    let proxy = Quick::start(cfg).await;
    let s = TcpStream::connect(proxy.addr)
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"));
    let (mut sender, conn) = http2::Builder::new(TokioExecutor::new())
        .handshake::<_, http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>>(
            TokioIo::new(s),
        )
        .await
        .unwrap_or_else(|e| panic!("h2 handshake: {e}"));
    let conn = tokio::spawn(async move {
        let _ = conn.await;
    });
    let post =
        |route: &str,
         body: http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>| {
            http::Request::post(format!("http://{}/upload", proxy.addr))
                .header("cookie", format!("route={route}"))
                .body(body)
                .unwrap_or_else(|e| panic!("request: {e}"))
        };
    // Stream 1: 16 MiB to a, fed as hyper takes it; the count of what it took.
    let taken = Arc::new(AtomicU64::new(0));
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(1);
    let feed = {
        let taken = Arc::clone(&taken);
        tokio::spawn(async move {
            let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
            for _ in 0..256 {
                if tx.send(chunk.clone()).await.is_err() {
                    return;
                }
                taken.fetch_add(chunk.len() as u64, Ordering::SeqCst);
            }
        })
    };
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| {
            (
                Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(b)),
                rx,
            )
        })
    });
    sender
        .ready()
        .await
        .unwrap_or_else(|e| panic!("ready: {e}"));
    let first = sender.send_request(post(
        "a",
        http_body_util::BodyExt::boxed(http_body_util::StreamBody::new(stream)),
    ));
    let first = tokio::spawn(first);
    let _held = tokio::time::timeout(PATIENCE, a_took.recv())
        .await
        .unwrap_or_else(|_| panic!("a never got the upload"));
    // Until the first upload stops moving: a's buffers and the stream's window full (no
    // event says so; what it took stays the same for half a second, at most 10 s in all).
    let started = Instant::now();
    let mut last = (taken.load(Ordering::SeqCst), Instant::now());
    while last.1.elapsed() < Duration::from_millis(500) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the upload to a never stopped"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = taken.load(Ordering::SeqCst);
        if now != last.0 {
            last = (now, Instant::now());
        }
    }
    assert!(!first.is_finished(), "the first upload still waits");
    // Stream 3: 300 KiB to b, answered at once.
    sender
        .ready()
        .await
        .unwrap_or_else(|e| panic!("ready: {e}"));
    let body = http_body_util::Full::new(Bytes::from(vec![b'y'; 300 * 1024]));
    let sent = Instant::now();
    let resp = tokio::time::timeout(
        Duration::from_secs(5),
        sender.send_request(post("b", http_body_util::BodyExt::boxed(body))),
    )
    .await
    .unwrap_or_else(|_| panic!("the second upload waited for the first"))
    .unwrap_or_else(|e| panic!("second upload: {e}"));
    assert_eq!(resp.status(), 200);
    let text = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap_or_else(|e| panic!("body: {e}"))
        .to_bytes();
    assert_eq!(
        String::from_utf8_lossy(&text).trim(),
        (300 * 1024).to_string(),
        "b read it all"
    );
    assert!(sent.elapsed() < Duration::from_secs(5));
    feed.abort();
    first.abort();
    conn.abort();
    proxy.stop().await;
    a.abort();
    drop(b);
}

/// Without checks, a hung node's trial is decided by its answer, and while the trial waits
/// for it nobody else is sent there: sessions pinned to the node keep being served by b, and
/// only the trial requests (one per `fail_timeout` + answer timeout) wait on the hung node.
/// Decided by the trial's connect instead, the node would be UP for the whole answer timeout
/// after each trial, and every pinned session would wait on it meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_checks_a_hung_node_s_trials_make_one_request_wait_not_every_session() {
    let (hung, _port, mut b) = hung_a_and_live_b().await;
    let mut cfg = hung_and_live_config(&hung, &b);
    const ANSWER: Duration = Duration::from_millis(300);
    const FAIL_TIMEOUT: Duration = Duration::from_millis(400);
    const RUN: Duration = Duration::from_millis(2_500);
    const SESSIONS: usize = 6;
    cfg.timeouts.upstream_answer = ANSWER;
    cfg.health.fall = 1;
    cfg.health.fail_timeout_ms = FAIL_TIMEOUT.as_millis() as u64;
    let proxy = Quick::start(cfg).await;

    // a goes DOWN on its first answer timeout.
    let mut first = H1::open(proxy.addr).await;
    let a = first
        .get(Some("route=a"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (a.status, a.node.as_str()),
        (200, "b"),
        "replayed on b: {a:?}"
    );
    assert_eq!(proxy.state_of("a"), "DOWN");

    // Sessions pinned to a keep asking for it (their cookie says a), each on its own
    // connection, one request at a time, for RUN.
    let started = Instant::now();
    let mut sessions = JoinSet::new();
    for _ in 0..SESSIONS {
        let addr = proxy.addr;
        sessions.spawn(async move {
            let mut c = H1::open(addr).await;
            let mut seen = Vec::new();
            while started.elapsed() < RUN {
                let t = Instant::now();
                let a = c.get(Some("route=a")).await;
                seen.push((a.map(|a| (a.status, a.node)), t.elapsed()));
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            seen
        });
    }
    let mut results = Vec::new();
    while let Some(r) = sessions.join_next().await {
        results.extend(r.unwrap_or_else(|e| panic!("session task: {e}")));
    }
    assert!(
        results
            .iter()
            .all(|(r, _)| matches!(r, Ok((200, n)) if n == "b")),
        "every request was served by b: {results:?}"
    );
    let waited = results.iter().filter(|(_, t)| *t >= ANSWER).count();
    // A trial at most every fail_timeout + answer timeout (its answer timeout restarts
    // the wait), each one request's wait.
    let trials = (RUN.as_millis() / (FAIL_TIMEOUT + ANSWER).as_millis()) as usize + 1;
    assert!(
        (1..=trials).contains(&waited),
        "{waited} of {} requests waited on the hung node; its trials allow 1 to {trials}",
        results.len()
    );
    // Each request that waited on a and was answered by b counts as an error of a's (the
    // first one that took a DOWN too): a hung node shows its timeouts.
    let a = proxy
        .runtime
        .state()
        .lifecycle
        .metrics
        .traffic("a", limpet::clock::now_ms());
    assert_eq!(
        (a.requests, a.errors),
        (waited as u64 + 1, waited as u64 + 1),
        "a's failed attempts are its errors"
    );
    eprintln!(
        "{waited} of {} requests of {SESSIONS} pinned sessions waited on the hung node's trials",
        results.len()
    );
    drop(first);
    proxy.stop().await;
    drop(hung);
    b.kill().await;
}

/// [`new_sessions_are_served`] through an HTTP client: N = 60 new sessions (a new
/// connection, no cookie), one every 30 ms, every one answered 200 within 2 s.
async fn new_sessions_are_served_at(url: &str) {
    const N: usize = 60;
    let mut after = JoinSet::new();
    for _ in 0..N {
        let url = url.to_owned();
        after.spawn(async move {
            let t = Instant::now();
            let r = tokio::time::timeout(Duration::from_secs(2), async {
                get(&fresh_client(), &url).await
            })
            .await;
            (matches!(r, Ok(Ok((200, _)))), t.elapsed())
        });
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let mut results = Vec::new();
    while let Some(r) = after.join_next().await {
        results.push(r.unwrap_or_else(|e| panic!("session task: {e}")));
    }
    let ok = results.iter().filter(|(ok, _)| *ok).count();
    assert!(
        ok == N,
        "only {ok} of {N} new sessions answered 200 within 2 s after a went DOWN: {results:?}"
    );
}

// ---------------------------------------------------------------------------------------
// Finding 3: state set after a reload reaches connections opened before it
// ---------------------------------------------------------------------------------------

const AB: [(&str, &str); 2] = [("a", "127.0.0.2"), ("b", "127.0.0.3")];

/// Nodes a and b, an HTTP listener (the limpet cookie) and a TCP listener on a source-IP
/// table, both to `port`, plus `extra` lines under the TCP listener and `tail` at the end.
fn two_listener_config(port: u16, raw_extra: &str, tail: &str) -> String {
    format!(
        "{}[[tables]]\nname = \"t\"\nkey = \"source-ip\"\n\n\
         [[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = {port}\n\
         timeouts = {{ drain = \"1s\" }}\n\n\
         [[listeners]]\nname = \"raw\"\nbind = \"127.0.0.1:0\"\nmode = \"tcp\"\nnode_port = {port}\n\
         table = \"t\"\nclose_on_node_down = true\ntimeouts = {{ drain = \"1s\" }}\n{raw_extra}\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n{tail}",
        nodes_toml(&AB)
    )
}

/// Pre-reload HTTP/1.1 and HTTP/2 connections whose requests carry the cookie `route=a`: each
/// answered by a.
async fn h1_and_h2_on_a(web: SocketAddr) -> (H1, H2) {
    let mut h1 = H1::open(web).await;
    let mut h2 = H2::open(web).await;
    for (what, a) in [
        ("HTTP/1.1", h1.get(Some("route=a")).await),
        ("HTTP/2", h2.get(Some("route=a")).await),
    ] {
        let a = a.unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!((a.status, a.node.as_str()), (200, "a"), "{what}: {a:?}");
    }
    (h1, h2)
}

/// The next request (cookie `route=a`) on each of the pre-reload connections is re-pinned to
/// b: answered by b with `Set-Cookie: route=b`, on the same connection.
async fn h1_and_h2_move_to_b(h1: &mut H1, h2: &mut H2, after: &str) {
    for (what, a) in [
        ("HTTP/1.1", h1.get(Some("route=a")).await),
        ("HTTP/2", h2.get(Some("route=a")).await),
    ] {
        let a = a.unwrap_or_else(|e| panic!("pre-reload {what} connection after {after}: {e}"));
        assert_eq!(
            (a.status, a.node.as_str(), a.set_cookie.as_deref()),
            (200, "b", Some("route=b")),
            "pre-reload {what} connection after {after}"
        );
    }
}

/// Reloads (the config file rewritten with a trivial change) and checks it was taken.
async fn reload_trivially(l: &Limpet, cfg: &ConfigFile, text: &str) {
    cfg.write(&format!("{text}\n# reloaded by failure_recovery\n"));
    let (s, report) = reload(l).await;
    assert_eq!(s, 200, "reload refused: {report}");
    assert_eq!(report["generation"], 1, "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maint_after_a_reload_repins_pre_reload_h1_and_h2_connections_and_closes_tcp() {
    let (_nodes, port) = backend_nodes(&AB).await;
    let text = two_listener_config(port, "", "");
    let cfg = ConfigFile::new("reload-maint", &text);
    let l = Limpet::start(&cfg).await;
    let (web, raw) = (l.addr("web"), l.addr("raw"));

    // (a) An HTTP/1.1 keep-alive connection whose session is pinned to a (a connection's
    // first answer pins it; new connections until one lands on a).
    let mut h1_pin = None;
    for _ in 0..6 {
        let mut c = H1::open(web).await;
        let a = c.get(None).await.unwrap_or_else(|e| panic!("{e}"));
        if a.node == "a" {
            assert_eq!(a.set_cookie.as_deref(), Some("route=a"), "{a:?}");
            h1_pin = Some(c);
            break;
        }
    }
    let mut h1 = h1_pin.unwrap_or_else(|| panic!("no HTTP/1.1 connection landed on a"));
    // (b) The same over HTTP/2 (h2c, prior knowledge).
    let mut h2_pin = None;
    for _ in 0..6 {
        let mut c = H2::open(web).await;
        let a = c.get(None).await.unwrap_or_else(|e| panic!("{e}"));
        if a.node == "a" {
            assert_eq!(a.set_cookie.as_deref(), Some("route=a"), "{a:?}");
            h2_pin = Some(c);
            break;
        }
    }
    let mut h2 = h2_pin.unwrap_or_else(|| panic!("no HTTP/2 connection landed on a"));
    // (c) A TCP session on a.
    let (mut tcp, src) = tcp_session_on(raw, "a", 40).await;

    reload_trivially(&l, &cfg, &text).await;

    // All three outlived the reload and are still on a.
    let a1 = h1
        .get(Some("route=a"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (a1.status, a1.node.as_str(), a1.set_cookie),
        (200, "a", None)
    );
    let a2 = h2
        .get(Some("route=a"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (a2.status, a2.node.as_str(), a2.set_cookie),
        (200, "a", None)
    );
    assert_eq!(tcp_get(&mut tcp).await.as_deref(), Ok("a"));

    // MAINT, set through the new generation.
    let v = set_state(&l, "a", r#"{"state":"maint"}"#).await;
    assert_eq!(v["state"], "MAINT", "{v}");
    let maint_at = Instant::now();

    // (c) closed promptly.
    let closed = closed_within(&mut tcp, Duration::from_secs(2)).await;
    assert!(
        closed.is_some(),
        "the pre-reload TCP session from {src} on a was not closed within 2 s of MAINT"
    );
    // (a), (b): the next request on the SAME connection goes to b and re-pins.
    h1_and_h2_move_to_b(&mut h1, &mut h2, "MAINT").await;
    // And they stay on b with the new cookie.
    let a1 = h1
        .get(Some("route=b"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((a1.node.as_str(), a1.set_cookie), ("b", None));
    eprintln!(
        "TCP session closed {:?} after MAINT ({:?} since)",
        closed,
        maint_at.elapsed()
    );
    drop((h1, h2, tcp));
    l.stop().await;
}

/// A reload that removes a node ends what is open to it as MAINT would, whichever
/// generation opened it: its TCP session is closed promptly, and the next request of
/// kept-alive HTTP/1.1 and HTTP/2 connections pinned to it goes to the other node and re-pins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_removes_a_node_closes_its_tcp_session_and_moves_h1_and_h2() {
    let (_nodes, port) = backend_nodes(&AB).await;
    let text = two_listener_config(port, "", "");
    let cfg = ConfigFile::new("reload-remove-open", &text);
    let l = Limpet::start(&cfg).await;
    let (web, raw) = (l.addr("web"), l.addr("raw"));
    let (mut h1, mut h2) = h1_and_h2_on_a(web).await;
    let (mut tcp, src) = tcp_session_on(raw, "a", 60).await;

    let without_a = text.replacen(
        "[[nodes]]\nname = \"a\"\naddress = \"127.0.0.2\"\n\n",
        "",
        1,
    );
    assert_ne!(without_a, text, "node a taken out of the config");
    cfg.write(&without_a);
    let (s, report) = reload(&l).await;
    assert_eq!(s, 200, "reload refused: {report}");

    let closed = closed_within(&mut tcp, Duration::from_secs(2)).await;
    assert!(
        closed.is_some(),
        "the TCP session from {src} on a was not closed within 2 s of the reload that removed a"
    );
    h1_and_h2_move_to_b(&mut h1, &mut h2, "a's removal").await;
    drop((h1, h2, tcp));
    l.stop().await;
}

/// Nodes a and b in this order, or b and a: a reload that renumbers the nodes.
fn table_web_config(port: u16, order: &[(&str, &str)]) -> String {
    format!(
        "{}[[tables]]\nname = \"t\"\nkey = \"source-ip\"\n\n\
         [[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = {port}\n\
         table = \"t\"\n\n[admin]\nlisten = \"127.0.0.1:0\"\n",
        nodes_toml(order)
    )
}

/// A reload that reorders the nodes renumbers them, while the shared table keeps its pins by
/// name: a keep-alive connection opened before the reload, whose next request routes over the
/// new generation's numbering, reads the client's pin as the same node, and a pin it writes is
/// read by new connections as the same node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pre_reload_connection_reads_and_writes_pins_by_node_name_after_nodes_are_renumbered() {
    let (_nodes, port) = backend_nodes(&AB).await;
    let cfg = ConfigFile::new("reload-renumber", &table_web_config(port, &AB));
    let l = Limpet::start(&cfg).await;
    let web = l.addr("web");

    // A client (source address) pinned to b, on a keep-alive connection.
    let mut on_b = None;
    for i in 0..6u8 {
        let src = IpAddr::from([127, 0, 0, 60 + i]);
        let mut c = H1::open_from(src, web).await;
        let a = c.get(None).await.unwrap_or_else(|e| panic!("{e}"));
        if a.node == "b" {
            on_b = Some((c, src));
            break;
        }
    }
    let (mut h1, src) = on_b.unwrap_or_else(|| panic!("no client landed on b"));
    // A second client, whose pin the old connection will write after the reload.
    let other = IpAddr::from([127, 0, 0, 70]);
    let mut h1_other = H1::open_from(other, web).await;
    h1_other.get(None).await.unwrap_or_else(|e| panic!("{e}"));

    // Reload with the nodes in the other order: a is now node 1, b node 0.
    let reordered = [AB[1], AB[0]];
    cfg.write(&table_web_config(port, &reordered));
    let (s, report) = reload(&l).await;
    assert_eq!(
        (s, &report["generation"]),
        (200, &serde_json::json!(1)),
        "{report}"
    );

    // Read: the pre-reload connection's client stays on b.
    let a = h1.get(None).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (a.status, a.node.as_str()),
        (200, "b"),
        "pre-reload connection after the reload"
    );
    let mut fresh = H1::open_from(src, web).await;
    let a = fresh.get(None).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (a.status, a.node.as_str()),
        (200, "b"),
        "new connection of the same client"
    );

    // Write: the second client's pin is deleted, its pre-reload connection pins it afresh,
    // and a new connection of that client (new generation) finds the same node.
    let r = bare_client()
        .delete(l.admin_url(&format!("/api/v1/tables/t/entry?key={other}")))
        .send()
        .await
        .unwrap_or_else(|e| panic!("delete: {e}"));
    assert_eq!(r.status().as_u16(), 200, "delete the entry of {other}");
    let repinned = h1_other.get(None).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(repinned.status, 200, "{repinned:?}");
    let entry = admin_json(&l, &format!("/api/v1/tables/t/entry?key={other}")).await;
    assert_eq!(
        entry["node"],
        repinned.node.as_str(),
        "the table names the node that answered: {entry}"
    );
    let mut fresh = H1::open_from(other, web).await;
    let a = fresh.get(None).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        a.node, repinned.node,
        "new connection of the client the old one pinned"
    );
    drop((h1, h1_other, fresh));
    l.stop().await;
}

/// A port on a's address that node a's checks can probe apart from its service (its
/// `check_port`): it accepts until the returned task is aborted, then refuses, so a goes DOWN
/// by its checks while its service, and the sessions relayed to it, stay up.
async fn check_target_of_a() -> (u16, JoinHandle<()>) {
    let check_target = TcpListener::bind("127.0.0.2:0")
        .await
        .unwrap_or_else(|e| panic!("bind check target: {e}"));
    let check_port = check_target.local_addr().map(|a| a.port()).unwrap_or(0);
    let task = tokio::spawn(async move {
        while let Ok((s, _)) = check_target.accept().await {
            drop(s);
        }
    });
    (check_port, task)
}

/// Node a's lines with its checks sent to `check_port`.
fn a_checked_at(check_port: u16) -> String {
    format!("name = \"a\"\naddress = \"127.0.0.2\"\ncheck_port = {check_port}\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_down_after_a_reload_closes_a_pre_reload_tcp_session_and_moves_h1_and_h2() {
    let (_nodes, port) = backend_nodes(&AB).await;
    // a's checks probe a port of their own (`check_port`), so the check can fail while a's
    // service, and the session relayed to it, stay up: only the DOWN can close the session.
    let (check_port, check_task) = check_target_of_a().await;
    const FALL: u64 = 2;
    const INTERVAL_MS: u64 = 100;
    const TIMEOUT_MS: u64 = 200;
    let text = two_listener_config(
        port,
        "check = { kind = \"tcp\" }\n",
        &format!(
            "\n[health]\nfall = {FALL}\nrise = 1\ninterval = \"{INTERVAL_MS}ms\"\ntimeout = \"{TIMEOUT_MS}ms\"\n"
        ),
    )
    .replace(
        "name = \"a\"\naddress = \"127.0.0.2\"\n",
        &a_checked_at(check_port),
    );
    let cfg = ConfigFile::new("reload-down", &text);
    let l = Limpet::start(&cfg).await;
    // a is checked, and passes.
    let deadline = Instant::now() + PATIENCE;
    loop {
        let v = node_view(&l, "a").await;
        if v["checks"][0]["checks"].as_u64().unwrap_or(0) >= 1 {
            assert_eq!(v["checks"][0]["last"]["ok"], true, "{v}");
            assert_eq!(v["state"], "UP", "{v}");
            break;
        }
        assert!(Instant::now() < deadline, "a was never checked: {v}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let (mut tcp, src) = tcp_session_on(l.addr("raw"), "a", 60).await;
    let (mut h1, mut h2) = h1_and_h2_on_a(l.addr("web")).await;

    reload_trivially(&l, &cfg, &text).await;
    assert_eq!(
        tcp_get(&mut tcp).await.as_deref(),
        Ok("a"),
        "the session outlived the reload"
    );

    // a's check target dies: its checks fail, a goes DOWN, its pre-reload session closes.
    check_task.abort();
    let _ = check_task.await;
    let killed = Instant::now();
    let limit = Duration::from_millis(FALL * (INTERVAL_MS + TIMEOUT_MS)) + SLACK;
    let closed = closed_within(&mut tcp, limit).await;
    let v = node_view(&l, "a").await;
    assert!(
        closed.is_some(),
        "the pre-reload TCP session from {src} was not closed within {limit:?} of a's check \
         target dying (close_on_node_down = true); a now: {v}"
    );
    let v = match await_state(&l, "a", "DOWN", killed, killed + PATIENCE).await {
        Ok(_) => node_view(&l, "a").await,
        Err(v) => panic!("a not DOWN: {v}"),
    };
    assert_eq!(v["healthy"], false, "{v}");
    // The pre-reload HTTP connections follow the DOWN too.
    h1_and_h2_move_to_b(&mut h1, &mut h2, "a went DOWN").await;
    eprintln!("session closed {closed:?} after the check target died");
    l.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_deadline_after_a_reload_ends_pre_reload_tcp_h1_and_h2_sessions_by_deadline_plus_spread(
) {
    let (_nodes, port) = backend_nodes(&AB).await;
    let text = two_listener_config(port, "", "");
    let cfg = ConfigFile::new("reload-drain", &text);
    let l = Limpet::start(&cfg).await;
    let (mut tcp, src) = tcp_session_on(l.addr("raw"), "a", 80).await;
    let (mut h1, mut h2) = h1_and_h2_on_a(l.addr("web")).await;

    reload_trivially(&l, &cfg, &text).await;
    assert_eq!(
        tcp_get(&mut tcp).await.as_deref(),
        Ok("a"),
        "the session outlived the reload"
    );

    const DEADLINE: Duration = Duration::from_secs(1);
    const SPREAD: Duration = Duration::from_secs(1);
    let asked = Instant::now();
    let v = set_state(
        &l,
        "a",
        &format!(
            r#"{{"state":"drain","deadline_secs":{},"spread_secs":{}}}"#,
            DEADLINE.as_secs_f64(),
            SPREAD.as_secs_f64()
        ),
    )
    .await;
    assert_eq!(v["state"], "DRAIN", "{v}");
    // Before the deadline the session goes on.
    assert_eq!(
        tcp_get(&mut tcp).await.as_deref(),
        Ok("a"),
        "a draining node keeps its sessions until the deadline"
    );
    let limit = DEADLINE + SPREAD + SLACK;
    let closed = closed_within(&mut tcp, limit).await;
    let ended = asked.elapsed();
    assert!(
        closed.is_some(),
        "the pre-reload TCP session from {src} was not ended within deadline {DEADLINE:?} + \
         spread {SPREAD:?} + {SLACK:?}: {}",
        admin_json(&l, "/api/v1/nodes/a").await
    );
    assert!(
        ended + Duration::from_millis(50) >= DEADLINE,
        "ended {ended:?} after the drain was asked, before its deadline {DEADLINE:?}"
    );
    // Past the deadline and the whole spread window, the pre-reload HTTP connections'
    // sessions re-pin too. (Their moment in the window is their own, not the TCP session's,
    // so the wait is for the window's end: a rule on the clock, tested on a virtual clock in
    // the core and here end to end.)
    let past = asked + DEADLINE + SPREAD + Duration::from_millis(50);
    tokio::time::sleep_until(past).await;
    h1_and_h2_move_to_b(&mut h1, &mut h2, "the drain deadline and spread").await;
    eprintln!("session ended {ended:?} after the drain (deadline {DEADLINE:?}, spread {SPREAD:?})");
    l.stop().await;
}

// ---------------------------------------------------------------------------------------
// A reload's topology and settings reach connections and sessions opened before it
// ---------------------------------------------------------------------------------------

/// Three backends, each answering with the address it listens on, so an answer tells which
/// address a node's request reached.
const AT: [(&str, &str); 3] = [
    ("at-2", "127.0.0.2"),
    ("at-3", "127.0.0.3"),
    ("at-4", "127.0.0.4"),
];

/// limpet's nodes (`nodes`: name and address) in front of the [`AT`] backends, one listener.
fn moved_config(port: u16, nodes: &[(&str, &str)]) -> String {
    format!(
        "{}[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = {port}\n\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n",
        nodes_toml(nodes)
    )
}

/// A connection opened before a reload routes its next requests over the reloaded topology:
/// a node the reload moved is reached at its new address (its old one may be a machine being
/// retired, whose refusals would otherwise count against the node), and a cookie naming a
/// node the reload added is honoured instead of being re-pinned away. On HTTP/1.1 and on
/// HTTP/2, each on one connection throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pre_reload_connection_follows_a_moved_node_and_honours_an_added_one() {
    let (_backends, port) = backend_nodes(&AT).await;
    let before = [("a", "127.0.0.2"), ("b", "127.0.0.3")];
    let cfg = ConfigFile::new("reload-moved", &moved_config(port, &before));
    let l = Limpet::start(&cfg).await;
    let web = l.addr("web");
    let mut h1 = H1::open(web).await;
    let mut h2 = H2::open(web).await;
    for (what, a) in [
        ("HTTP/1.1", h1.get(Some("route=b")).await),
        ("HTTP/2", h2.get(Some("route=b")).await),
    ] {
        let a = a.unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(
            (a.status, a.node.as_str(), a.set_cookie),
            (200, "at-3", None),
            "{what}: b at its first address"
        );
    }

    // b moves to 127.0.0.4; c is added at b's old address.
    let after = [("a", "127.0.0.2"), ("b", "127.0.0.4"), ("c", "127.0.0.3")];
    cfg.write(&moved_config(port, &after));
    let (s, report) = reload(&l).await;
    assert_eq!(s, 200, "{report}");

    for round in 0..2 {
        for (what, b, c) in [
            (
                "HTTP/1.1",
                h1.get(Some("route=b")).await,
                h1.get(Some("route=c")).await,
            ),
            (
                "HTTP/2",
                h2.get(Some("route=b")).await,
                h2.get(Some("route=c")).await,
            ),
        ] {
            let b = b.unwrap_or_else(|e| panic!("pre-reload {what} connection: {e}"));
            assert_eq!(
                (b.status, b.node.as_str(), b.set_cookie),
                (200, "at-4", None),
                "pre-reload {what} connection, round {round}: b at its new address, still pinned"
            );
            let c = c.unwrap_or_else(|e| panic!("pre-reload {what} connection: {e}"));
            assert_eq!(
                (c.status, c.node.as_str(), c.set_cookie),
                (200, "at-3", None),
                "pre-reload {what} connection, round {round}: the pin to the added node c held"
            );
        }
    }
    drop((h1, h2));
    l.stop().await;
}

/// `close_on_node_down` is read from the running config when it matters: a TCP session
/// opened with it off stays open when its node goes DOWN, and the reload that turns it on
/// closes the session, with no further change of the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_turns_close_on_node_down_on_closes_a_session_on_a_node_already_down() {
    let (_nodes, port) = backend_nodes(&AB).await;
    // a's checks probe a port of their own, so a can go DOWN while its service, and the
    // session relayed to it, stay up.
    let (check_port, check_task) = check_target_of_a().await;
    let text = |close: bool| {
        two_listener_config(
            port,
            "check = { kind = \"tcp\" }\n",
            "\n[health]\nfall = 1\nrise = 1\ninterval = \"100ms\"\ntimeout = \"200ms\"\n",
        )
        .replace(
            "close_on_node_down = true",
            &format!("close_on_node_down = {close}"),
        )
        .replace(
            "name = \"a\"\naddress = \"127.0.0.2\"\n",
            &a_checked_at(check_port),
        )
    };
    let cfg = ConfigFile::new("reload-close-on-down", &text(false));
    let l = Limpet::start(&cfg).await;
    let (mut tcp, src) = tcp_session_on(l.addr("raw"), "a", 80).await;

    check_task.abort();
    let _ = check_task.await;
    let killed = Instant::now();
    if let Err(v) = await_state(&l, "a", "DOWN", killed, killed + PATIENCE).await {
        panic!("a not DOWN: {v}");
    }
    assert_eq!(
        tcp_get(&mut tcp).await.as_deref(),
        Ok("a"),
        "with close_on_node_down off, the session from {src} outlives a's DOWN"
    );

    cfg.write(&text(true));
    let (s, report) = reload(&l).await;
    assert_eq!(s, 200, "{report}");
    let closed = closed_within(&mut tcp, SLACK).await;
    assert!(
        closed.is_some(),
        "the session from {src} on DOWN a was not closed within {SLACK:?} of the reload that \
         turned close_on_node_down on"
    );
    l.stop().await;
}

/// A reload that shortens a listener's `idle` reaches the client connections open before it:
/// an HTTP/2 connection that has served a request is closed about `idle` after the reload,
/// as an HTTP/1.1 one is. Before, an HTTP/2 connection kept the limits it opened with (its
/// idle watch read them once), so it stayed open for the old 60 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_shortens_idle_closes_the_connections_open_before_it() {
    let (_nodes, port) = backend_nodes(&AB).await;
    let text = two_listener_config(port, "", "");
    let cfg = ConfigFile::new("reload-idle", &text);
    let l = Limpet::start(&cfg).await;
    let (mut h1, mut h2) = h1_and_h2_on_a(l.addr("web")).await;

    // The web listener's timeouts come first in the file.
    let shorter = text.replacen(
        "timeouts = { drain = \"1s\" }",
        "timeouts = { drain = \"1s\", idle = \"1s\" }",
        1,
    );
    assert_ne!(shorter, text);
    cfg.write(&shorter);
    let (s, report) = reload(&l).await;
    assert_eq!(s, 200, "{report}");
    let reloaded = Instant::now();
    // Within a few times the new idle (the HTTP/2 watch looks every header_read / 4, 3.75
    // s at the default), far from the old 60 s.
    let bound = Duration::from_secs(10);
    for (what, conn) in [("HTTP/2", &mut h2.conn), ("HTTP/1.1", &mut h1.conn)] {
        let closed = tokio::time::timeout(bound, conn).await;
        assert!(
            closed.is_ok(),
            "the pre-reload {what} connection still open {bound:?} after a reload set idle = 1s"
        );
        eprintln!(
            "{what} connection closed {:?} after the reload",
            reloaded.elapsed()
        );
    }
    // The listener serves on with the new limit.
    let mut again = H2::open(l.addr("web")).await;
    let a = again.get(None).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(a.status, 200);
    drop((h1, h2, again));
    l.stop().await;
}

/// A node that answers `GET /` with `ok` and `GET /big` with a body it never stops
/// writing; `released` resolves once limpet closed the connection the body goes to.
async fn flood_node(ip: &str) -> (u16, oneshot::Receiver<()>, JoinHandle<()>) {
    let l = TcpListener::bind((ip, 0))
        .await
        .unwrap_or_else(|e| panic!("bind: {e}"));
    let port = l.local_addr().map(|a| a.port()).unwrap_or(0);
    let (tx, released) = oneshot::channel();
    // Taken by the connection that carries `/big` (a reload may give limpet new ones).
    let tx = Arc::new(Mutex::new(Some(tx)));
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else {
                return;
            };
            let tx = Arc::clone(&tx);
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                loop {
                    let Ok(n) = s.read(&mut buf).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    head.extend_from_slice(&buf[..n]);
                    let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") else {
                        continue;
                    };
                    let big = head.starts_with(b"GET /big ");
                    head.drain(..end + 4);
                    if !big {
                        let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
                        if s.write_all(ok).await.is_err() {
                            return;
                        }
                        continue;
                    }
                    let _ = s
                        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 68719476736\r\n\r\n")
                        .await;
                    let chunk = vec![b'x'; 64 * 1024];
                    while s.write_all(&chunk).await.is_ok() {}
                    let tx = tx.lock().unwrap_or_else(|e| e.into_inner()).take();
                    if let Some(tx) = tx {
                        let _ = tx.send(());
                    }
                    return;
                }
            });
        }
    });
    (port, released, task)
}

/// A reload that shortens `client_idle` reaches the write stall limit of a client connection
/// open before it: the connection's next answer, to a client that stopped reading it, is cut
/// about the new `client_idle` later and its node connection released. Before, the
/// connection's write limit was the `client_idle` it was accepted with (60 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_shortens_client_idle_reaches_the_connections_open_before_it() {
    let (port, released, node) = flood_node("127.0.0.5").await;
    let text = |client_idle: &str| {
        format!(
            "{}[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = {port}\n\
             timeouts = {{ drain = \"1s\", client_idle = \"{client_idle}\" }}\n\n\
             [admin]\nlisten = \"127.0.0.1:0\"\n",
            nodes_toml(&[("f", "127.0.0.5")])
        )
    };
    let cfg = ConfigFile::new("reload-client-idle", &text("60s"));
    let l = Limpet::start(&cfg).await;
    let mut client = TcpStream::connect(l.addr("web"))
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"));
    client
        .write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .unwrap_or_else(|e| panic!("write: {e}"));
    let mut answer = Vec::new();
    tokio::time::timeout(PATIENCE, async {
        let mut buf = [0u8; 1024];
        while !answer.ends_with(b"ok") {
            let n = client.read(&mut buf).await.unwrap_or(0);
            assert!(n > 0, "closed before the first answer");
            answer.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no first answer"));

    cfg.write(&text("300ms"));
    let (s, report) = reload(&l).await;
    assert_eq!(s, 200, "{report}");
    client
        .write_all(b"GET /big HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .unwrap_or_else(|e| panic!("write: {e}"));
    let mut first = [0u8; 12];
    tokio::time::timeout(PATIENCE, client.read_exact(&mut first))
        .await
        .unwrap_or_else(|_| panic!("no answer to /big"))
        .unwrap_or_else(|e| panic!("read: {e}"));
    assert_eq!(&first, b"HTTP/1.1 200");
    // No more reading from here: the kernel's buffers fill, then limpet's write blocks.
    let stalled = Instant::now();
    let bound = Duration::from_secs(10);
    assert!(
        matches!(tokio::time::timeout(bound, released).await, Ok(Ok(()))),
        "the stalled answer's node connection still open {bound:?} after the reload set \
         client_idle = 300ms"
    );
    eprintln!(
        "node connection released {:?} after the client stopped reading",
        stalled.elapsed()
    );
    drop(client);
    node.abort();
    l.stop().await;
}

// ---------------------------------------------------------------------------------------
// 6. A node that closes idle kept-alive connections sooner than limpet would keep them
// ---------------------------------------------------------------------------------------

/// What a keep-alive node like Node.js (5 s), Apache (5 s) or gunicorn (2 s) does with a
/// request that reaches a connection it has kept idle past its keep-alive timeout, in the
/// instant it closes it: the request is read and lost, the connection reset unanswered. Here
/// the timeout is `keep_alive` and the loss deterministic, so the race limpet must not enter
/// is entered every time. Each answer names the node connection that carried it.
struct ClosingNode {
    addr: SocketAddr,
    /// Requests read, by method, in order.
    seen: Arc<Mutex<Vec<String>>>,
    /// Requests lost to a reset.
    resets: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl ClosingNode {
    async fn start(ip: &str, keep_alive: Duration) -> ClosingNode {
        ClosingNode::serve(ip, 0, keep_alive, None)
            .await
            .expect("bind")
    }

    /// The same node speaking TLS (`server_cfg`'s certificate) on each connection.
    async fn start_tls(
        ip: &str,
        keep_alive: Duration,
        server_cfg: Arc<rustls::ServerConfig>,
    ) -> ClosingNode {
        ClosingNode::start_tls_at(ip, 0, keep_alive, server_cfg)
            .await
            .expect("bind")
    }

    /// [`Self::start_tls`] on `port` (0: any), which may be taken.
    async fn start_tls_at(
        ip: &str,
        port: u16,
        keep_alive: Duration,
        server_cfg: Arc<rustls::ServerConfig>,
    ) -> std::io::Result<ClosingNode> {
        let acceptor = tokio_rustls::TlsAcceptor::from(server_cfg);
        ClosingNode::serve(ip, port, keep_alive, Some(acceptor)).await
    }

    /// Each answer names the node by its address (`x-limpet-node`).
    async fn serve(
        ip: &str,
        port: u16,
        keep_alive: Duration,
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) -> std::io::Result<ClosingNode> {
        let listener = TcpListener::bind((ip, port)).await?;
        let addr = listener.local_addr()?;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let resets = Arc::new(AtomicU64::new(0));
        let (s, r) = (Arc::clone(&seen), Arc::clone(&resets));
        let task = tokio::spawn(async move {
            let mut conns = JoinSet::new();
            for id in 1u64.. {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let node = ClosingConn {
                    id,
                    name: addr.ip(),
                    keep_alive,
                    seen: Arc::clone(&s),
                    resets: Arc::clone(&r),
                };
                match tls.clone() {
                    None => {
                        conns.spawn(node.serve(stream, |s: &TcpStream| s));
                    }
                    Some(acceptor) => {
                        conns.spawn(async move {
                            if let Ok(tls) = acceptor.accept(stream).await {
                                node.serve(
                                    tls,
                                    |t: &tokio_rustls::server::TlsStream<TcpStream>| t.get_ref().0,
                                )
                                .await;
                            }
                        });
                    }
                }
            }
        });
        Ok(ClosingNode {
            addr,
            seen,
            resets,
            task,
        })
    }
}

/// One connection of a [`ClosingNode`].
struct ClosingConn {
    id: u64,
    name: IpAddr,
    keep_alive: Duration,
    seen: Arc<Mutex<Vec<String>>>,
    resets: Arc<AtomicU64>,
}

impl ClosingConn {
    /// Serves requests on `stream` (whose TCP socket `tcp` gives, to reset it) until the
    /// client closes, or resets it on a request that comes after `keep_alive` idle.
    async fn serve<S>(self, mut stream: S, tcp: impl Fn(&S) -> &TcpStream)
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        let ClosingConn {
            id,
            name,
            keep_alive,
            seen,
            resets,
        } = self;
        let mut buf = Vec::new();
        let mut idle_since = Instant::now();
        loop {
            // One request: its head, then its Content-Length body.
            let head_end = loop {
                if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    break i + 4;
                }
                let mut chunk = [0u8; 4096];
                match stream.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            };
            let head = String::from_utf8_lossy(&buf[..head_end]).to_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            while buf.len() < head_end + len {
                let mut chunk = [0u8; 4096];
                match stream.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            let method = head.split(' ').next().unwrap_or("").to_uppercase();
            buf.drain(..head_end + len);
            seen.lock().expect("seen").push(method);
            if idle_since.elapsed() >= keep_alive {
                resets.fetch_add(1, Ordering::SeqCst);
                let _ = socket2::SockRef::from(tcp(&stream)).set_linger(Some(Duration::ZERO));
                return;
            }
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-conn: {id}\r\n{}: {name}\r\n\r\nok",
                limpet::backend::NODE_HEADER
            );
            if stream.write_all(answer.as_bytes()).await.is_err() || stream.flush().await.is_err() {
                return;
            }
            idle_since = Instant::now();
        }
    }
}

/// A TLS node that completes every handshake and never answers (a TLS terminator in front
/// of a hung process), checked by a `tls` check that passes at each interval: two GETs that
/// time out on it take it DOWN (`fall = 2`), the checks' passes between them notwithstanding,
/// and each GET is answered by the other node. Before, every pass cleared the count of
/// unanswered requests: under traffic slower than `fall` timeouts per check interval it
/// stayed UP, each request to it waiting out its answer timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_check_passes_do_not_keep_a_node_that_never_answers_up() {
    let (_, cfg_a) = tls_identity("127.0.0.2");
    let (_, cfg_b) = tls_identity("127.0.0.3");
    let (hung, b) = loop {
        let hung = TcpListener::bind("127.0.0.2:0")
            .await
            .unwrap_or_else(|e| panic!("bind a: {e}"));
        let port = hung.local_addr().map(|a| a.port()).unwrap_or(0);
        if let Ok(b) = ClosingNode::start_tls_at(
            "127.0.0.3",
            port,
            Duration::from_secs(60),
            Arc::clone(&cfg_b),
        )
        .await
        {
            break (hung, b);
        }
    };
    let port = b.addr.port();
    // a: the handshake, then the request read and never answered.
    let acceptor = tokio_rustls::TlsAcceptor::from(cfg_a);
    let a = tokio::spawn(async move {
        let mut conns = JoinSet::new();
        while let Ok((s, _)) = hung.accept().await {
            let acceptor = acceptor.clone();
            conns.spawn(async move {
                if let Ok(mut t) = acceptor.accept(s).await {
                    let mut buf = [0u8; 4096];
                    while let Ok(1..) = t.read(&mut buf).await {}
                }
            });
        }
    });
    let cfg = ConfigFile::new(
        "tls-check-hung",
        &format!(
            "{}[health]\nfall = 2\nrise = 2\ninterval = \"100ms\"\ntimeout = \"500ms\"\n\n\
             [[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = {port}\n\
             upstream_tls = {{ verify = \"none\" }}\n\
             timeouts = {{ upstream_answer = \"1s\" }}\n\
             check = {{ kind = \"tls\" }}\n\n\
             [admin]\nlisten = \"127.0.0.1:0\"\n",
            nodes_toml(&AB)
        ),
    );
    let l = Limpet::start(&cfg).await;
    two_unanswered_gets_take_a_down(&l, "its TLS checks").await;
    l.stop().await;
    a.abort();
    b.task.abort();
}

/// Two GETs pinned to a, each answered by b (127.0.0.3) once a's answer timeout (1 s) has
/// passed; then a is DOWN within 2 s, by its traffic, its one check (`checked`) having
/// passed all along (at least 10 times).
async fn two_unanswered_gets_take_a_down(l: &Limpet, checked: &str) {
    let since = Instant::now();
    for i in 0..2 {
        let mut h1 = H1::open(l.addr("web")).await;
        let sent = Instant::now();
        let answer = h1
            .get(Some("route=a"))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (answer.status, answer.node.as_str()),
            (200, "127.0.0.3"),
            "GET {i}: replayed on b at the answer timeout"
        );
        assert!(
            sent.elapsed() >= Duration::from_secs(1),
            "GET {i} went to a and waited out its answer timeout: {:?}",
            sent.elapsed()
        );
    }
    let down = await_state(
        l,
        "a",
        "DOWN",
        since,
        Instant::now() + Duration::from_secs(2),
    )
    .await;
    assert!(
        down.is_ok(),
        "two unanswered GETs take a DOWN whatever {checked} said: {down:?}"
    );
    // Taken DOWN by its traffic, its check passing all along.
    let v = node_view(l, "a").await;
    assert_eq!(v["health"]["down_cause"], "traffic", "{v}");
    let check = &v["checks"][0];
    assert_eq!(check["failures"], 0, "{v}");
    assert!(check["checks"].as_u64().is_some_and(|n| n >= 10), "{v}");
}

/// A node whose traffic port hangs (the kernel accepts, the process reads and never
/// answers) while its check, on another port (a management endpoint with its own threads),
/// answers 200 at every interval: its answers speak for that port only. Two GETs that time
/// out on it take it DOWN (`fall = 2`), each replayed on b. Before, every check answer was a
/// sign of life for the node: each timed-out GET counted as slow by itself, answered 504
/// and never failed over, and the node stayed UP for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_answering_on_another_port_does_not_keep_a_hung_node_up() {
    let (hung, b) = loop {
        let hung = TcpListener::bind("127.0.0.2:0")
            .await
            .unwrap_or_else(|e| panic!("bind a: {e}"));
        let port = hung.local_addr().map(|a| a.port()).unwrap_or(0);
        if let Ok(b) = ClosingNode::serve("127.0.0.3", port, Duration::from_secs(60), None).await {
            break (hung, b);
        }
    };
    let port = b.addr.port();
    // a's traffic port: the request read and never answered.
    let a = tokio::spawn(async move {
        let mut conns = JoinSet::new();
        while let Ok((mut s, _)) = hung.accept().await {
            conns.spawn(async move {
                let mut buf = [0u8; 4096];
                while let Ok(1..) = s.read(&mut buf).await {}
            });
        }
    });
    // a's management port, which answers.
    let manage = ClosingNode::start("127.0.0.2", Duration::from_secs(60)).await;
    let cfg = ConfigFile::new(
        "check-other-port-hung",
        &format!(
            "[[nodes]]\nname = \"a\"\naddress = \"127.0.0.2\"\ncheck_port = {check}\n\n\
             [[nodes]]\nname = \"b\"\naddress = \"127.0.0.3\"\n\n\
             [health]\nfall = 2\nrise = 2\ninterval = \"100ms\"\ntimeout = \"500ms\"\n\n\
             [[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = {port}\n\
             timeouts = {{ upstream_answer = \"1s\" }}\n\
             check = {{ kind = \"http\", path = \"/health\" }}\n\n\
             [admin]\nlisten = \"127.0.0.1:0\"\n",
            check = manage.addr.port()
        ),
    );
    let l = Limpet::start(&cfg).await;
    two_unanswered_gets_take_a_down(&l, "its check on another port").await;
    l.stop().await;
    a.abort();
    b.task.abort();
    manage.task.abort();
}

/// Writes `req` on `s` and reads what comes back until the peer closes or resets the
/// connection, at most [`PATIENCE`]: what came, as text (an answer cut by a reset keeps the
/// bytes before it).
async fn exchange(mut s: TcpStream, req: &str) -> String {
    s.write_all(req.as_bytes()).await.expect("write");
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let _ = tokio::time::timeout(PATIENCE, async {
        while let Ok(n) = s.read(&mut buf).await {
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
        }
    })
    .await;
    String::from_utf8_lossy(&out).into_owned()
}

/// One request through `addr` on a connection of its own (the client closes it), with a
/// 4-byte body unless a GET: the status, and the node connection that answered (`x-conn`).
async fn one_request(addr: SocketAddr, method: &str) -> (u16, Option<u64>) {
    let s = TcpStream::connect(addr).await.expect("connect");
    let body = if method == "GET" { "" } else { "body" };
    let req = format!(
        "{method} /p HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let out = exchange(s, &req).await.to_lowercase();
    let status = out
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let conn = out
        .lines()
        .find_map(|l| l.strip_prefix("x-conn:"))
        .and_then(|v| v.trim().parse().ok());
    (status, conn)
}

/// The keep-alive race with TLS to the node: a GET sent on a kept-alive connection that the
/// node resets unanswered (it closed it for idling as the request came) is replayed once on a
/// fresh connection to the same node and answered, as it is for a plaintext node. Before, TLS
/// nodes (served through hyper's client, not `node_h1`) failed the GET over: 502 with no
/// other node, the session moved off a healthy node with one. Real time: on paused time the
/// clock jumps while the TLS handshakes wait on the sockets, and their timeouts fire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_lost_to_a_tls_node_s_keep_alive_close_is_replayed_on_a_fresh_connection() {
    let (_, server_cfg) = tls_identity("127.0.0.2");
    let keep_alive = Duration::from_millis(300);
    let node = ClosingNode::start_tls("127.0.0.2", keep_alive, server_cfg).await;
    let cfg = ConfigFile::new(
        "tls-keep-alive-race",
        &format!(
            "{}[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = {port}\n\
             upstream_tls = {{ verify = \"none\" }}\n\
             timeouts = {{ upstream_idle = \"10s\" }}\n\n\
             [admin]\nlisten = \"127.0.0.1:0\"\n",
            nodes_toml(&[("a", "127.0.0.2")]),
            port = node.addr.port()
        ),
    );
    let l = Limpet::start(&cfg).await;
    let web = l.addr("web");
    let (status, first) = one_request(web, "GET").await;
    assert_eq!(status, 200);
    // The node's connection idles past its keep-alive (limpet's `upstream_idle` is 10 s).
    tokio::time::sleep(keep_alive * 2).await;
    let before = node.seen.lock().expect("seen").len();
    let (status, conn) = one_request(web, "GET").await;
    assert_eq!(status, 200, "a GET lost to the race is replayed");
    assert_ne!(conn, first, "on a fresh connection");
    assert_eq!(
        node.seen.lock().expect("seen")[before..],
        ["GET".to_owned(), "GET".to_owned()],
        "once lost, once answered"
    );
    assert_eq!(node.resets.load(Ordering::SeqCst), 1);
    assert_eq!(node_view(&l, "a").await["state"], "UP");
    l.stop().await;
    node.task.abort();
}

/// TLS to the nodes and an HTTP/2 client: the session's node dying (its connections closed,
/// its port refused) or hanging its TLS handshake is failed over before any byte of the
/// request reached a node, and the session is re-pinned to the other node, with no 5xx; the
/// hung handshake costs `timeouts.connect` (1 s here), not the answer timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_tls_to_the_nodes_an_h2_session_moves_off_a_node_that_dies_or_hangs_its_handshake() {
    let keep_alive = Duration::from_secs(60);
    let (_, cfg_a) = tls_identity("127.0.0.2");
    let (_, cfg_b) = tls_identity("127.0.0.3");
    // Both on one port, as one listener's `node_port` reaches them.
    let mut pair = None;
    for _ in 0..50 {
        let a = ClosingNode::start_tls("127.0.0.2", keep_alive, Arc::clone(&cfg_a)).await;
        match ClosingNode::start_tls_at("127.0.0.3", a.addr.port(), keep_alive, Arc::clone(&cfg_b))
            .await
        {
            Ok(b) => {
                pair = Some((a, b));
                break;
            }
            Err(_) => a.task.abort(),
        }
    }
    let (a, b) = pair.unwrap_or_else(|| panic!("no common free port for a and b"));
    let port = a.addr.port();
    let cfg = ConfigFile::new(
        "tls-nodes-failover",
        &format!(
            "{}[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = {port}\n\
             upstream_tls = {{ verify = \"none\" }}\n\
             timeouts = {{ connect = \"1s\" }}\n\n\
             [admin]\nlisten = \"127.0.0.1:0\"\n",
            nodes_toml(&AB)
        ),
    );
    let l = Limpet::start(&cfg).await;
    let mut h2 = H2::open(l.addr("web")).await;
    // The next stream with a's cookie, answered by b (127.0.0.3) and re-pinned there.
    async fn moved_to_b(h2: &mut H2, what: &str) {
        let moved = h2
            .get(Some("route=a"))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (
                moved.status,
                moved.node.as_str(),
                moved.set_cookie.as_deref()
            ),
            (200, "127.0.0.3", Some("route=b")),
            "{what}"
        );
    }
    let home = h2
        .get(Some("route=a"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((home.status, home.node.as_str()), (200, "127.0.0.2"));

    // a dies: its kept-alive connection closes, its port refuses.
    a.task.abort();
    let _ = a.task.await;
    moved_to_b(
        &mut h2,
        "a dead TLS node's request fails over and the session moves",
    )
    .await;

    // a's address answers TCP but never the TLS handshake (a stopped process's kernel).
    let hung = TcpListener::bind(("127.0.0.2", port))
        .await
        .unwrap_or_else(|e| panic!("bind a again: {e}"));
    let asked = Instant::now();
    moved_to_b(&mut h2, "a TLS handshake that never ends fails over too").await;
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "within the connect timeout, not the answer timeout: {:?}",
        asked.elapsed()
    );
    drop((h2, hung));
    l.stop().await;
    b.task.abort();
}

/// A WebSocket upgrade request for `/ws` through `addr`, with `cookie`.
fn ws_request(
    addr: std::net::SocketAddr,
    cookie: &'static str,
) -> tokio_tungstenite::tungstenite::handshake::client::Request {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut req = format!("ws://{addr}/ws")
        .into_client_request()
        .unwrap_or_else(|e| panic!("request: {e}"));
    req.headers_mut()
        .insert(http::header::COOKIE, http::HeaderValue::from_static(cookie));
    req
}

/// A WebSocket upgrade whose session's node is dead (its port refuses) is sent to the other
/// node before any byte went out, and the 101 re-pins the session there (`Set-Cookie:
/// route=b`), so the session's HTTP requests follow the tunnel. An upgrade once sent is never
/// replayed; a refused connect sent nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_upgrade_to_a_dead_node_opens_on_the_other_and_re_pins() {
    use futures_util::StreamExt;
    let (mut nodes, port) = backend_nodes(&AB).await;
    let text = format!(
        "{}[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = {port}\n\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n",
        nodes_toml(&AB)
    );
    let cfg = ConfigFile::new("ws-dead-node", &text);
    let l = Limpet::start(&cfg).await;
    nodes[0].kill().await;
    let Ok(upgraded) = tokio::time::timeout(
        PATIENCE,
        tokio_tungstenite::connect_async(ws_request(l.addr("web"), "route=a")),
    )
    .await
    else {
        panic!("not upgraded in time")
    };
    let (mut ws, answer) = upgraded.unwrap_or_else(|e| panic!("websocket: {e}"));
    assert_eq!(
        route_cookie_of(answer.headers()).as_deref(),
        Some("route=b"),
        "the 101 re-pins the session to the node the tunnel went to"
    );
    let greeting = match tokio::time::timeout(PATIENCE, ws.next()).await {
        Ok(Some(Ok(m))) => m.into_text().map(|t| t.to_string()).unwrap_or_default(),
        other => panic!("no greeting: {other:?}"),
    };
    assert_eq!(greeting, "b", "the tunnel runs to b");
    drop(ws);
    l.stop().await;
}

/// A WebSocket upgrade whose session's node is hung (its kernel takes the connection, its
/// process never answers) waits out the answer timeout and is answered 504: an upgrade
/// once sent is never replayed (the node may have taken it), whatever the rule for GETs.
/// (Replayed on b, it would have been answered 101.) The node is charged (`fall = 1`: DOWN
/// by its traffic), and the session's next upgrade opens on b, its 101 re-pinning it there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_upgrade_to_a_hung_node_is_answered_504_and_not_replayed() {
    use futures_util::StreamExt;
    let (mut nodes, port) = backend_nodes(&AB).await;
    let text = format!(
        "{}[health]\nfall = 1\nfail_timeout = \"60s\"\n\n\
         [[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = {port}\n\
         timeouts = {{ upstream_answer = \"1s\" }}\n\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n",
        nodes_toml(&AB)
    );
    let cfg = ConfigFile::new("ws-hung-node", &text);
    let l = Limpet::start(&cfg).await;
    // a's process gone, its address taking connections nobody answers.
    nodes[0].kill().await;
    let hung = tokio::net::TcpListener::bind(("127.0.0.2", port))
        .await
        .unwrap_or_else(|e| panic!("bind a's address: {e}"));
    let upgrade = || {
        tokio::time::timeout(
            PATIENCE,
            tokio_tungstenite::connect_async(ws_request(l.addr("web"), "route=a")),
        )
    };
    let asked = Instant::now();
    let Ok(refused) = upgrade().await else {
        panic!("no answer in time")
    };
    let waited = asked.elapsed();
    match refused {
        Err(tokio_tungstenite::tungstenite::Error::Http(answer)) => {
            assert_eq!(answer.status(), 504, "the answer timeout's 504")
        }
        other => panic!("an upgrade to a hung node is not replayed: {other:?}"),
    }
    assert!(
        waited >= Duration::from_secs(1) && waited < Duration::from_secs(5),
        "answered at the answer timeout: {waited:?}"
    );
    let v = node_view(&l, "a").await;
    assert_eq!(v["health"]["down_cause"], "traffic", "a charged: {v}");
    // The session's next upgrade: a is DOWN, the tunnel opens on b and re-pins the session.
    let Ok(upgraded) = upgrade().await else {
        panic!("not upgraded in time")
    };
    let (mut ws, answer) = upgraded.unwrap_or_else(|e| panic!("websocket: {e}"));
    assert_eq!(
        route_cookie_of(answer.headers()).as_deref(),
        Some("route=b")
    );
    let greeting = match tokio::time::timeout(PATIENCE, ws.next()).await {
        Ok(Some(Ok(m))) => m.into_text().map(|t| t.to_string()).unwrap_or_default(),
        other => panic!("no greeting: {other:?}"),
    };
    assert_eq!(greeting, "b");
    drop((ws, hung));
    l.stop().await;
}

/// `timeouts.upstream_idle` below the node's keep-alive timeout: limpet never sends a request
/// on a connection the node has kept idle that long, so a POST after a pause goes out on a
/// fresh connection and is answered. The same node behind a listener that keeps idle
/// connections longer than the node does loses the POST to the race (502, never replayed:
/// the node read it) and replays a GET on a fresh connection. Paused time, real sockets.
#[tokio::test(start_paused = true)]
async fn upstream_idle_below_the_node_s_keep_alive_loses_no_post_to_its_close() {
    let node = ClosingNode::start("127.0.0.2", Duration::from_secs(1)).await;
    let cfg = ConfigFile::new(
        "upstream-idle",
        &format!(
            "{}[[listeners]]\nname = \"below\"\nbind = \"127.0.0.1:0\"\nnode_port = {port}\n\
             timeouts = {{ upstream_idle = \"500ms\" }}\n\n\
             [[listeners]]\nname = \"above\"\nbind = \"127.0.0.1:0\"\nnode_port = {port}\n\
             timeouts = {{ upstream_idle = \"10s\" }}\n\n\
             [admin]\nlisten = \"127.0.0.1:0\"\n",
            nodes_toml(&[("a", "127.0.0.2")]),
            port = node.addr.port()
        ),
    );
    let l = Limpet::start(&cfg).await;
    let pause = Duration::from_secs(2);

    let below = l.addr("below");
    let (status, first) = one_request(below, "POST").await;
    assert_eq!(status, 200);
    let (status, reused) = one_request(below, "POST").await;
    assert_eq!(
        (status, reused),
        (200, first),
        "a POST soon after goes on the kept-alive connection"
    );
    for round in 0..3 {
        tokio::time::sleep(pause).await;
        let (status, conn) = one_request(below, "POST").await;
        assert_eq!(status, 200, "POST after a {pause:?} pause, round {round}");
        assert_ne!(
            conn, first,
            "a connection idle past upstream_idle is not used"
        );
    }
    assert_eq!(node.resets.load(Ordering::SeqCst), 0, "no request lost");

    let above = l.addr("above");
    assert_eq!(one_request(above, "POST").await.0, 200);
    tokio::time::sleep(pause).await;
    let before = node.seen.lock().expect("seen").len();
    assert_eq!(
        one_request(above, "POST").await.0,
        502,
        "kept past the node's keep-alive, the POST is lost to the race"
    );
    assert_eq!(
        node.seen.lock().expect("seen")[before..],
        ["POST".to_owned()],
        "and sent once: the node read it"
    );
    // The POST's connection went with it: a GET puts a fresh one in the pool.
    assert_eq!(one_request(above, "GET").await.0, 200);
    tokio::time::sleep(pause).await;
    let before = node.seen.lock().expect("seen").len();
    let (status, _) = one_request(above, "GET").await;
    assert_eq!(status, 200, "a GET lost the same way is replayed");
    assert_eq!(
        node.seen.lock().expect("seen")[before..],
        ["GET".to_owned(), "GET".to_owned()],
        "once lost, once answered"
    );
    assert_eq!(node.resets.load(Ordering::SeqCst), 2);
    l.stop().await;
    node.task.abort();
}

/// The default `upstream_idle` (4 s) is below the keep-alive timeout of Node.js and Apache
/// (5 s): a connection idle 3 s is reused, one idle 4.5 s is not, and no POST is lost.
#[tokio::test(start_paused = true)]
async fn the_default_upstream_idle_is_below_a_5_s_keep_alive() {
    let node = ClosingNode::start("127.0.0.2", Duration::from_secs(5)).await;
    let cfg = ConfigFile::new(
        "upstream-idle-default",
        &format!(
            "{}[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = {}\n\n\
             [admin]\nlisten = \"127.0.0.1:0\"\n",
            nodes_toml(&[("a", "127.0.0.2")]),
            node.addr.port()
        ),
    );
    let l = Limpet::start(&cfg).await;
    let web = l.addr("web");
    let (status, first) = one_request(web, "POST").await;
    assert_eq!(status, 200);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        one_request(web, "POST").await,
        (200, first),
        "reused after 3 s"
    );
    tokio::time::sleep(Duration::from_millis(4500)).await;
    let (status, conn) = one_request(web, "POST").await;
    assert_eq!(status, 200, "not lost after 4.5 s");
    assert_ne!(conn, first, "a fresh connection after 4.5 s");
    assert_eq!(node.resets.load(Ordering::SeqCst), 0);
    l.stop().await;
    node.task.abort();

    // `limpet proxy` has the same default, and `--upstream-idle` for nodes that keep less.
    let to = format!("n={}", node.addr);
    assert_eq!(
        quick_config(&["--to", &to]).timeouts.upstream_idle,
        Duration::from_secs(4)
    );
    assert_eq!(
        quick_config(&["--to", &to, "--upstream-idle", "1s"])
            .timeouts
            .upstream_idle,
        Duration::from_secs(1)
    );
}

// ---------------------------------------------------------------------------------------
// 7. A node that stalls or fails in the middle of an answer body
// ---------------------------------------------------------------------------------------

/// A node that answers `/stall` (any method) with a head announcing 100 bytes and sends 10,
/// then holds the connection silent, and `GET /reset` the same way, then resets the
/// connection at once. One connection at a time.
async fn mid_body_node(ip: &str) -> (SocketAddr, JoinHandle<()>) {
    let listener = TcpListener::bind((ip, 0)).await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut s, _)) = listener.accept().await {
            let mut head = Vec::new();
            while !head.ends_with(b"\r\n\r\n") {
                let mut b = [0u8; 1];
                match s.read(&mut b).await {
                    Ok(1) => head.push(b[0]),
                    _ => break,
                }
            }
            let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n0123456789";
            if s.write_all(answer).await.is_err() {
                continue;
            }
            if head.starts_with(b"GET /reset") {
                let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
            } else {
                held.push(s);
            }
        }
    });
    (addr, task)
}

/// A GET of `path` through `addr` (the client closes), or with `post` a POST with a 4-byte
/// body (limpet's hyper client to the node, where a GET takes its own HTTP/1 path): the
/// status line and the bytes of body it got, whatever ended the connection.
async fn body_bytes_of(addr: SocketAddr, path: &str, post: bool) -> (String, usize) {
    let s = TcpStream::connect(addr).await.expect("connect");
    let req = if post {
        format!(
            "POST {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: 4\r\n\r\nbody"
        )
    } else {
        format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    };
    let text = exchange(s, &req).await;
    let body = text.split_once("\r\n\r\n").map_or(0, |(_, b)| b.len());
    (text.lines().next().unwrap_or("").to_owned(), body)
}

/// A node that stalls mid-answer has its answer cut at `answer_body_idle`, and one whose
/// connection resets mid-answer has it cut at once: the client gets the 200 head and 10 of
/// the 100 bytes either way. Each cut is counted for the node by its cause (API and
/// metrics), where before nothing told an operator: the access line and `class="2xx"` are
/// written at the head; over both of limpet's HTTP/1 clients to nodes (its own for a GET,
/// hyper's for a request with a body). The node stays UP with `fall = 1`: neither HAProxy
/// nor nginx counts a cut answer against a server's health. An answer ended because the
/// client's own upload stalled is not counted. Paused time, real sockets.
#[tokio::test(start_paused = true)]
async fn an_answer_cut_mid_body_is_counted_for_its_node_by_cause() {
    let (node, task) = mid_body_node("127.0.0.2").await;
    let cfg = ConfigFile::new(
        "answer-cut",
        &format!(
            "{}[health]\nfall = 1\n\n[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\n\
             node_port = {}\n\
             timeouts = {{ answer_body_idle = \"2s\", client_idle = \"1s\" }}\n\n\
             [admin]\nlisten = \"127.0.0.1:0\"\n",
            nodes_toml(&[("a", "127.0.0.2")]),
            node.port()
        ),
    );
    let l = Limpet::start(&cfg).await;
    let web = l.addr("web");
    let cut = |m: &str, cause: &str| {
        let series = format!("limpet_node_answers_cut_total{{node=\"a\",cause=\"{cause}\"}} ");
        m.lines()
            .find_map(|line| line.strip_prefix(&series))
            .map(|v| v.trim().to_owned())
    };
    let m = metrics_text(&l).await;
    assert_eq!(
        (cut(&m, "idle").as_deref(), cut(&m, "error").as_deref()),
        (Some("0"), Some("0")),
        "every cause from 0"
    );

    for post in [false, true] {
        let started = Instant::now();
        let (status, got) = body_bytes_of(web, "/stall", post).await;
        let took = started.elapsed();
        assert_eq!(
            (status.as_str(), got),
            ("HTTP/1.1 200 OK", 10),
            "the answer is cut (POST: {post})"
        );
        assert!(
            took >= Duration::from_secs(2) && took < Duration::from_secs(3),
            "cut at answer_body_idle: {took:?} (POST: {post})"
        );
    }
    let (status, got) = body_bytes_of(web, "/reset", false).await;
    assert_eq!(
        (status.as_str(), got),
        ("HTTP/1.1 200 OK", 10),
        "the answer is cut"
    );

    let m = metrics_text(&l).await;
    assert_eq!(
        (cut(&m, "idle").as_deref(), cut(&m, "error").as_deref()),
        (Some("2"), Some("1"))
    );
    // A client whose upload stops after the node's head came: limpet ends the upload at
    // `client_idle` and closes the node connection, which ends the answer too. Not the
    // node's cut.
    let s = TcpStream::connect(web).await.expect("connect");
    let started = Instant::now();
    exchange(
        s,
        "POST /stall HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n0123456789",
    )
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "ended at client_idle, before answer_body_idle: {:?}",
        started.elapsed()
    );
    let m = metrics_text(&l).await;
    assert_eq!(
        (cut(&m, "idle").as_deref(), cut(&m, "error").as_deref()),
        (Some("2"), Some("1")),
        "the client's stalled upload is not counted against the node"
    );
    let view = node_view(&l, "a").await;
    assert_eq!(view["traffic"]["answers_cut"], 3, "{view}");
    assert_eq!(
        (&view["state"], &view["health"]["streak"]),
        (&serde_json::json!("UP"), &serde_json::json!(0)),
        "a cut answer is not a failure of the node, with fall = 1: {view}"
    );
    l.stop().await;
    task.abort();
}

// ---------------------------------------------------------------------------------------
// 8. A session that fails back home takes its TCP session with it
// ---------------------------------------------------------------------------------------

/// One GET through the HTTP listener `web` from source address `src`, with `cookie`: the
/// node that answered and the Set-Cookie values (name=value only).
async fn get_from(src: IpAddr, web: SocketAddr, cookie: &str) -> (String, Vec<String>) {
    let s = connect_from(src, web).await;
    let req = format!(
        "GET / HTTP/1.1\r\nhost: failback.test\r\ncookie: {cookie}\r\nconnection: close\r\n\r\n"
    );
    let out = exchange(s, &req).await;
    let head = out
        .split("\r\n\r\n")
        .next()
        .unwrap_or("")
        .to_ascii_lowercase();
    let node = head
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{}:", limpet::backend::NODE_HEADER)))
        .map(|v| v.trim().to_owned())
        .unwrap_or_default();
    let set = head
        .lines()
        .filter_map(|l| l.strip_prefix("set-cookie:"))
        .filter_map(|v| v.trim().split(';').next().map(str::to_owned))
        .collect();
    (node, set)
}

/// With `failback = "home"` and one source-address table under an HTTP and a TCP listener, a
/// session moved off `a` (MAINT) and back when `a` is ready again goes home whole: its TCP
/// session on `b` ends at the failback, where it stayed open beside the requests gone home
/// until the table's next hold, up to a minute (chaos run 27).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_failing_back_home_ends_its_tcp_session_on_the_other_node() {
    let (_nodes, port) = backend_nodes(&AB).await;
    let cfg = ConfigFile::new(
        "failback-tcp",
        &format!(
            "{}[[tables]]\nname = \"t\"\nkey = \"source-ip\"\n\n\
             [[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = {port}\n\
             table = \"t\"\ncookie = {{ failback = \"home\" }}\n\n\
             [[listeners]]\nname = \"raw\"\nbind = \"127.0.0.1:0\"\nmode = \"tcp\"\n\
             node_port = {port}\ntable = \"t\"\n\n[admin]\nlisten = \"127.0.0.1:0\"\n",
            nodes_toml(&AB)
        ),
    );
    let l = Limpet::start(&cfg).await;
    let (web, raw) = (l.addr("web"), l.addr("raw"));
    let (mut on_a, src) = tcp_session_on(raw, "a", 90).await;
    let (node, _) = get_from(src, web, "").await;
    assert_eq!(node, "a", "the table pins the session's requests too");

    set_state(&l, "a", r#"{"state":"maint"}"#).await;
    assert!(
        closed_within(&mut on_a, SLACK).await.is_some(),
        "MAINT ends the session's TCP session on a"
    );
    let (node, set) = get_from(src, web, "route=a").await;
    assert_eq!(node, "b");
    assert!(set.contains(&"route-home=a".to_owned()), "{set:?}");
    let mut on_b = connect_from(src, raw).await;
    assert_eq!(tcp_get(&mut on_b).await.as_deref(), Ok("b"));

    set_state(&l, "a", r#"{"state":"ready"}"#).await;
    let (node, _) = get_from(src, web, "route=b; route-home=a").await;
    assert_eq!(node, "a", "failback: home again");
    assert!(
        closed_within(&mut on_b, SLACK).await.is_some(),
        "the TCP session on b ends with the failback, not at the table's next hold"
    );
    let mut again = connect_from(src, raw).await;
    assert_eq!(
        tcp_get(&mut again).await.as_deref(),
        Ok("a"),
        "and reconnects home"
    );
    drop((on_a, on_b, again));
    l.stop().await;
}

// ---------------------------------------------------------------------------------------
// A DOWN node's trial: what ends it
// ---------------------------------------------------------------------------------------

/// The only node DOWN by its traffic comes back, and the request that tries it is one whose
/// client leaves before the answer (an HTTP/2 stream reset while a 30 s `/slow` runs): the
/// next request tries the node at once and is served. Before, the trial's claim held for
/// (then `connect + upstream_answer`, 63 s by default) whatever became of its request, and every
/// request meanwhile was answered 503 though the node was back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trial_whose_client_left_lets_the_next_request_try_the_node_at_once() {
    let mut n = Backend::start("n").await;
    let addr = n.addr;
    let cfg = quick_config(&["--to", &format!("n={addr}"), "--fail-timeout", "60s"]);
    let fall = cfg.health.fall;
    let proxy = Quick::start(cfg).await;
    let c = fresh_client();
    n.kill().await;
    for _ in 0..fall {
        assert_eq!(get(&c, &proxy.url()).await.map(|(s, _)| s), Ok(503));
    }
    assert_eq!(proxy.state_of("n"), "DOWN");
    let mut n = Backend::start_at("n", addr).await;

    // The trial: a request the node holds 30 s, its stream reset once the claim is taken (the
    // claim moves the node's next trial past the answer timeout).
    let before = proxy.trial_at("n");
    let mut h2 = H2::open(proxy.addr).await;
    h2.sender
        .ready()
        .await
        .unwrap_or_else(|e| panic!("h2 connection: {e}"));
    let slow = h2.sender.send_request(request(
        &format!("http://{}/slow?ms=30000", proxy.addr),
        None,
    ));
    let trial = tokio::spawn(slow);
    let deadline = Instant::now() + PATIENCE;
    while proxy.trial_at("n") == before {
        assert!(Instant::now() < deadline, "the /slow request took no trial");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    trial.abort();
    assert!(
        trial.await.is_err_and(|e| e.is_cancelled()),
        "the trial was still in flight when its client left"
    );

    // The reset reaches limpet within milliseconds; its trial's claim ends with it.
    let left = Instant::now();
    let mut answers = Vec::new();
    loop {
        let r = get(&c, &proxy.url()).await;
        if r == Ok((200, "n".to_owned())) {
            break;
        }
        answers.push(r);
        assert!(
            left.elapsed() < Duration::from_secs(3),
            "no request served within 3 s of the trial's client leaving (the node is back, \
             the 30 s answer would have been the trial's): {} answers, the last {:?}; n is {}",
            answers.len(),
            answers.last(),
            proxy.state_of("n")
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(proxy.state_of("n"), "UP");
    drop(h2);
    proxy.stop().await;
    n.kill().await;
}

/// A TLS node on `listener`, with `server_cfg`'s certificate, that answers each session's
/// first bytes with `NAME:` and them, or, while `stall` holds, takes connections and never
/// answers the handshake.
fn tls_echo_node(
    name: &'static str,
    listener: TcpListener,
    server_cfg: Arc<rustls::ServerConfig>,
    stall: Arc<AtomicBool>,
) -> JoinHandle<()> {
    let acceptor = tokio_rustls::TlsAcceptor::from(server_cfg);
    tokio::spawn(async move {
        let mut held = Vec::new();
        let mut sessions = JoinSet::new();
        while let Ok((s, _)) = listener.accept().await {
            if stall.load(Ordering::SeqCst) {
                held.push(s);
                continue;
            }
            let acceptor = acceptor.clone();
            sessions.spawn(async move {
                let Ok(mut tls) = acceptor.accept(s).await else {
                    return;
                };
                let mut buf = [0u8; 64];
                if let Ok(n) = tls.read(&mut buf).await {
                    let mut out = format!("{name}:").into_bytes();
                    out.extend_from_slice(&buf[..n]);
                    let _ = tls.write_all(&out).await;
                    let _ = tls.flush().await;
                }
            });
        }
    })
}

/// Through a TCP listener with TLS to the nodes: the node that answered `ping`.
async fn tls_session_node(raw: SocketAddr, src: IpAddr) -> Result<String, String> {
    let mut s = connect_from(src, raw).await;
    s.write_all(b"ping")
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut got = Vec::new();
    tokio::time::timeout(PATIENCE, s.read_to_end(&mut got))
        .await
        .map_err(|_| "no answer in time".to_owned())?
        .map_err(|e| format!("read: {e}"))?;
    let got = String::from_utf8_lossy(&got).into_owned();
    got.strip_suffix(":ping")
        .map(str::to_owned)
        .ok_or_else(|| format!("answer {got:?}"))
}

/// TLS echo nodes a (its handshakes stalled while `stall` holds, as at the start) and b on
/// one port behind the TCP listener `raw` of a source-address table, with TLS to the nodes,
/// no checks, `fall = 1`, `fail_timeout` 300 ms and a 300 ms `connect`; the limpet, and its
/// config file, kept while it runs.
struct TlsStallPair {
    l: Limpet,
    raw: SocketAddr,
    stall: Arc<AtomicBool>,
    nodes: [JoinHandle<()>; 2],
    _cfg: ConfigFile,
}

async fn tls_stall_pair(tag: &str) -> TlsStallPair {
    let (a_listener, b_listener, port) = common_port_pair().await;
    let stall = Arc::new(AtomicBool::new(true));
    let a = tls_echo_node(
        "a",
        a_listener,
        tls_identity("127.0.0.2").1,
        Arc::clone(&stall),
    );
    let b = tls_echo_node(
        "b",
        b_listener,
        tls_identity("127.0.0.3").1,
        Arc::new(AtomicBool::new(false)),
    );
    let text = format!(
        "{}[health]\nfall = 1\nfail_timeout = \"300ms\"\n\n\
         [[tables]]\nname = \"t\"\nkey = \"source-ip\"\n\n\
         [[listeners]]\nname = \"raw\"\nbind = \"127.0.0.1:0\"\nmode = \"tcp\"\nnode_port = {port}\n\
         table = \"t\"\nupstream_tls = {{ verify = \"none\" }}\n\
         timeouts = {{ connect = \"300ms\", drain = \"1s\" }}\n\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n",
        nodes_toml(&AB)
    );
    let cfg = ConfigFile::new(tag, &text);
    let l = Limpet::start(&cfg).await;
    let raw = l.addr("raw");
    TlsStallPair {
        l,
        raw,
        stall,
        nodes: [a, b],
        _cfg: cfg,
    }
}

/// Demo nodes a and b on one port of 127.0.0.2 and 127.0.0.3 (`nodes_toml(&AB)`).
async fn ab_on_a_common_port() -> (Backend, Backend, u16) {
    let (a_listener, b_listener, port) = common_port_pair().await;
    (
        Backend::serve("a", a_listener),
        Backend::serve("b", b_listener),
        port,
    )
}

/// Passive health that takes a node DOWN at its first failure and tries it 300 ms later.
const FALL_ONE: &str = "[health]\nfall = 1\nfail_timeout = \"300ms\"\n\n";

/// Node `name`'s runtime in `state`.
fn node_rt(state: &State, name: &str) -> Arc<limpet::nodes::NodeRuntime> {
    state
        .lifecycle
        .nodes
        .get(name)
        .unwrap_or_else(|| panic!("node {name}"))
}

/// Waits (bounded) until a request or session holds one of the slots of node `rt`.
async fn until_admitted(rt: &limpet::nodes::NodeRuntime) {
    let deadline = Instant::now() + PATIENCE;
    while rt.admitted() < 1 {
        assert!(Instant::now() < deadline, "nothing reached the node");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Takes node `name` DOWN by its traffic (a refused connect, as passive health sees one, at
/// `fall = 1`), then waits (bounded) until its trial is due.
async fn refused_then_trial_due(state: &State, name: &str) {
    let id = state.node_id(name).unwrap_or_else(|| panic!("{name}'s id"));
    state.observe(id, limpet_core::Observation::TrafficFailed);
    let rt = node_rt(state, name);
    let due = rt
        .status()
        .health
        .retry_at_ms(rt.status().policy)
        .unwrap_or_else(|| panic!("{name} has a trial"));
    let deadline = Instant::now() + PATIENCE;
    while limpet::clock::now_ms() < due {
        assert!(Instant::now() < deadline, "{name}'s trial never came due");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The state of the running limpet `l`.
fn running_state(l: &Limpet) -> Arc<State> {
    l.running
        .as_ref()
        .unwrap_or_else(|| panic!("running"))
        .runtime()
        .state()
}

/// Takes node a of `l` DOWN for a request it left unanswered (as a request's timeout would),
/// which only an answer decides, then runs fresh TCP sessions through listener `raw` until a
/// is UP again (bounded: its 300 ms `fail_timeout`, the second after which limpet tries a
/// node itself, and slack).
async fn down_unanswered_until_tcp_sessions_bring_it_back(l: &Limpet) {
    let state = running_state(l);
    let a_id = state.node_id("a").unwrap_or_else(|| panic!("a's id"));
    state.observe(a_id, limpet_core::Observation::NoAnswer);
    assert_eq!(node_view(l, "a").await["state"], "DOWN");
    let raw = l.addr("raw");
    let bound = Duration::from_millis(300) + Duration::from_secs(1) + SLACK;
    until_a_is_up(l, bound, async || {
        let mut s = TcpStream::connect(raw)
            .await
            .unwrap_or_else(|e| panic!("connect raw: {e}"));
        assert!(matches!(tcp_get(&mut s).await.as_deref(), Ok("a" | "b")));
    })
    .await;
}

/// Runs `session` every 50 ms until node a reads UP in the admin API, within `bound` of
/// now (a serving, or handshaking, again from now on).
async fn until_a_is_up(l: &Limpet, bound: Duration, mut session: impl AsyncFnMut()) {
    let back = Instant::now();
    loop {
        session().await;
        let v = node_view(l, "a").await;
        if v["state"] == "UP" {
            return;
        }
        assert!(
            back.elapsed() < bound,
            "a still DOWN {:?} after it came back: {v}",
            back.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Without checks, a TCP-only node with TLS to it, DOWN on handshakes it let time out (a
/// process paused: they count as requests left unanswered), comes back on the next fresh
/// session's trial once it handshakes again: a completed TLS handshake is its process
/// answering. Before, only an HTTP request could try a node that left requests unanswered,
/// and a TCP-only node never gets one: it stayed DOWN for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tcp_node_down_on_tls_handshake_timeouts_comes_back_on_a_handshake() {
    let TlsStallPair {
        l,
        raw,
        stall,
        nodes: [a, b],
        _cfg,
    } = tls_stall_pair("tcp-tls-stall").await;

    // Fresh clients until one meets a's stalled handshake: a DOWN, that client served by b.
    let mut next = 1u8;
    while node_view(&l, "a").await["state"] != "DOWN" {
        assert!(next < 20, "a never went DOWN");
        let src = IpAddr::from([127, 0, 71, next]);
        next += 1;
        assert_eq!(tls_session_node(raw, src).await.as_deref(), Ok("b"));
    }
    let view = node_view(&l, "a").await;
    assert_eq!(view["health"]["down_cause"], "traffic", "{view}");

    // a handshakes again; fresh clients keep coming.
    stall.store(false, Ordering::SeqCst);
    until_a_is_up(&l, Duration::from_millis(300) + SLACK, async || {
        let src = IpAddr::from([127, 0, 72, next]);
        next = next.wrapping_add(1);
        let got = tls_session_node(raw, src).await;
        assert!(
            matches!(got.as_deref(), Ok("a" | "b")),
            "every session served: {got:?}"
        );
    })
    .await;
    l.stop().await;
    a.abort();
    b.abort();
}

/// The same node with no new client to try it: one client of a source-address table, moved
/// to b when a stalled its handshakes, keeps coming back (to b). Once a handshakes again it
/// is UP within its `fail_timeout` and the second limpet waits for a request to try it,
/// through limpet's own trial: a connect and a TLS handshake, whose completion is the
/// node's process answering. Before, limpet's own trial was a bare connect, which does not
/// decide the trial of a node DOWN for what it left unanswered: a stayed DOWN for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tcp_node_down_on_tls_handshake_timeouts_comes_back_with_no_new_client() {
    let TlsStallPair {
        l,
        raw,
        stall,
        nodes: [a, b],
        _cfg,
    } = tls_stall_pair("tcp-tls-stall-fixed").await;

    // Fresh clients until one meets a's stalled handshake: a DOWN, that client moved to b.
    let mut next = 1u8;
    let client = loop {
        assert!(next < 20, "a never went DOWN");
        let src = IpAddr::from([127, 0, 73, next]);
        next += 1;
        assert_eq!(tls_session_node(raw, src).await.as_deref(), Ok("b"));
        if node_view(&l, "a").await["state"] == "DOWN" {
            break src;
        }
    };
    let view = node_view(&l, "a").await;
    assert_eq!(view["health"]["down_cause"], "traffic", "{view}");

    // a handshakes again; only that one client comes, and it stays on b.
    stall.store(false, Ordering::SeqCst);
    let bound = Duration::from_millis(300) + Duration::from_secs(1) + SLACK;
    until_a_is_up(&l, bound, async || {
        assert_eq!(
            tls_session_node(raw, client).await.as_deref(),
            Ok("b"),
            "the client keeps its node"
        );
    })
    .await;
    l.stop().await;
    a.abort();
    b.abort();
}

/// A node that answers each request with its name, or, while `hung` holds, reads requests
/// and never answers; every request line it reads is kept in `lines`.
async fn hanging_node(
    name: &'static str,
    hung: Arc<AtomicBool>,
    lines: Arc<Mutex<Vec<String>>>,
) -> (SocketAddr, JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("bind: {e}"));
    let addr = l.local_addr().unwrap_or_else(|e| panic!("addr: {e}"));
    (addr, hanging_node_on(l, name, hung, lines))
}

/// [`hanging_node`] on a listener of the caller's.
fn hanging_node_on(
    l: TcpListener,
    name: &'static str,
    hung: Arc<AtomicBool>,
    lines: Arc<Mutex<Vec<String>>>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut s, _)) = l.accept().await {
            let mut head = Vec::new();
            let mut b = [0u8; 2048];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut b).await {
                    Ok(n @ 1..) => head.extend_from_slice(&b[..n]),
                    _ => break,
                }
            }
            let line = String::from_utf8_lossy(&head)
                .lines()
                .next()
                .unwrap_or("")
                .to_owned();
            lines
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(line);
            if hung.load(Ordering::SeqCst) {
                held.push(s);
                continue;
            }
            let answer = format!(
                "HTTP/1.1 200 OK\r\n{}: {name}\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
                limpet::backend::NODE_HEADER
            );
            let _ = s.write_all(answer.as_bytes()).await;
        }
    })
}

/// A node DOWN for a request it left unanswered, back to health, with no new session to try
/// it: its one client's session moved to b and stays there. Once its trial is due (and a
/// second more), limpet tries it itself, as a request would, and is answered: `OPTIONS *`,
/// whose status line (any) is the node's process answering, and the node is UP again.
/// Before, limpet's own trial was a connect, which does not decide the trial of a node DOWN
/// for what it left unanswered (its kernel completes connects while the process hangs): a
/// stayed DOWN for good, its share of the load on the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_down_for_an_unanswered_request_comes_back_with_no_new_session() {
    let hung = Arc::new(AtomicBool::new(true));
    let lines = Arc::new(Mutex::new(Vec::new()));
    let (a_addr, a) = hanging_node("a", Arc::clone(&hung), Arc::clone(&lines)).await;
    let b = Backend::start("b").await;
    let mut cfg = quick_config(&[
        "--to",
        &format!("a={a_addr}"),
        "--to",
        &format!("b={}", b.addr),
        "--fail-timeout",
        "300ms",
    ]);
    cfg.health.fall = 1;
    cfg.timeouts.upstream_answer = Duration::from_millis(300);
    let proxy = Quick::start(cfg).await;
    // The one client, pinned to a: its GET goes unanswered, a DOWN, the GET replayed on b.
    let mut c = H1::open(proxy.addr).await;
    let moved = c
        .get(Some("route=a"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((moved.status, moved.node.as_str()), (200, "b"), "{moved:?}");
    assert_eq!(proxy.state_of("a"), "DOWN");
    // a answers again; the client keeps coming, on b.
    hung.store(false, Ordering::SeqCst);
    let back = Instant::now();
    let bound = Duration::from_millis(300) + Duration::from_secs(1) + SLACK;
    while proxy.state_of("a") != "UP" {
        assert!(
            back.elapsed() < bound,
            "a still DOWN {:?} after it answers again",
            back.elapsed()
        );
        let r = c
            .get(Some("route=b"))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((r.status, r.node.as_str()), (200, "b"), "{r:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let seen = lines
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    assert_eq!(
        seen.last().map(String::as_str),
        Some("OPTIONS * HTTP/1.1"),
        "limpet's own trial: {seen:?}"
    );
    drop(c);
    proxy.stop().await;
    a.abort();
    drop(b);
}

/// The trial of a DOWN node whose every slot is held (here by a POST's slow answer from
/// before it went DOWN, at `max_connections = 1`) goes elsewhere at once: answered by b, well
/// within the queue timeout, the node still DOWN, its next trial a `fail_timeout` on. Before,
/// the trial waited in the node's queue and was answered 503 at the queue timeout, though b
/// could take it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trial_of_a_down_node_whose_slots_are_all_held_is_answered_elsewhere() {
    let a = Backend::start("a").await;
    let b = Backend::start("b").await;
    let mut cfg = quick_config(&[
        "--to",
        &format!("a={}", a.addr),
        "--to",
        &format!("b={}", b.addr),
        "--fail-timeout",
        "300ms",
    ]);
    cfg.health.fall = 1;
    cfg.timeouts.queue = Duration::from_secs(5);
    let proxy = Quick::start(cfg).await;
    let state = proxy.runtime.state();
    let a_rt = node_rt(&state, "a");
    a_rt.set_limits(Some(1), 10);
    // a's one slot held by a slow answer of its own: a POST, which a DOWN does not move
    // (a GET waiting on the node would be replayed elsewhere at once, freeing the slot).
    let url = format!("{}slow?ms=4000", proxy.url());
    let holder = tokio::spawn(async move {
        fresh_client()
            .post(url)
            .header("cookie", "route=a")
            .body("held")
            .send()
            .await
            .map(|r| r.status().as_u16())
    });
    until_admitted(&a_rt).await;
    // a DOWN by its traffic, its trial due.
    refused_then_trial_due(&state, "a").await;
    assert_eq!(proxy.state_of("a"), "DOWN");

    // A request of a's session: a's trial, with every slot of a's held.
    let mut c = H1::open(proxy.addr).await;
    let sent = Instant::now();
    let r = c
        .get(Some("route=a"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((r.status, r.node.as_str()), (200, "b"), "{r:?}");
    let took = sent.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "answered by b at once, not at the 5 s queue timeout: {took:?}"
    );
    assert_eq!(proxy.state_of("a"), "DOWN");
    // The claim ended with the request's move: the next trial is due a `fail_timeout` on,
    // as after a trial that learnt nothing, not at the end of the claim's hold.
    let now = limpet::clock::now_ms();
    assert!(
        proxy.trial_at("a").is_some_and(|t| t <= now + 300),
        "a's next trial due within its fail_timeout: {:?} at {now}",
        proxy.trial_at("a")
    );
    let held = tokio::time::timeout(PATIENCE, holder)
        .await
        .unwrap_or_else(|_| panic!("the slow answer in time"))
        .unwrap_or_else(|e| panic!("holder task: {e}"))
        .unwrap_or_else(|e| panic!("slow GET: {e}"));
    assert_eq!(held, 200);
    drop(c);
    proxy.stop().await;
    let (mut a, mut b) = (a, b);
    a.kill().await;
    b.kill().await;
}

/// The same through a TCP listener: a DOWN node's one slot held by a session from before it
/// went DOWN (`close_on_node_down = false` keeps it), the next session of a client pinned
/// to it is its trial and goes to b at once. Before, it waited out the queue timeout in the
/// node's queue and was closed unserved ("queue-timeout").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tcp_trial_of_a_down_node_whose_slots_are_all_held_goes_elsewhere() {
    let (mut a, mut b, port) = ab_on_a_common_port().await;
    let text = format!(
        "{}{FALL_ONE}\
         [[tables]]\nname = \"t\"\nkey = \"source-ip\"\n\n\
         [[listeners]]\nname = \"raw\"\nbind = \"127.0.0.1:0\"\nmode = \"tcp\"\nnode_port = {port}\n\
         table = \"t\"\nclose_on_node_down = false\n\
         timeouts = {{ queue = \"5s\", drain = \"1s\" }}\n\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n",
        nodes_toml(&AB)
    );
    let cfg = ConfigFile::new("tcp-trial-held", &text);
    let l = Limpet::start(&cfg).await;
    let raw = l.addr("raw");
    let state = running_state(&l);
    let a_rt = node_rt(&state, "a");
    a_rt.set_limits(Some(1), 10);
    // The one client, pinned to a, its session holding a's one slot.
    let (held, client) = tcp_session_on(raw, "a", 80).await;
    assert_eq!(a_rt.admitted(), 1);
    // a DOWN by its traffic, its trial due.
    refused_then_trial_due(&state, "a").await;
    assert_eq!(node_view(&l, "a").await["state"], "DOWN");

    // The client's next session: a's trial, every slot of a's held.
    let sent = Instant::now();
    let mut s = connect_from(client, raw).await;
    assert_eq!(tcp_get(&mut s).await.as_deref(), Ok("b"));
    let took = sent.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "served by b at once, not at the 5 s queue timeout: {took:?}"
    );
    assert_eq!(node_view(&l, "a").await["state"], "DOWN");
    drop((s, held));
    l.stop().await;
    a.kill().await;
    b.kill().await;
}

/// Requests of sessions pinned to a node whose trial another request holds wait for that
/// trial's outcome (at most `TRIAL_AWAIT`, 1 s) rather than move: the node is back, so they
/// are answered there and keep their pin. Before, each was excluded as from a DOWN node and
/// re-pinned to b for good (a browser's parallel requests, or every session that came while
/// the trial's request was out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_pinned_to_a_node_on_trial_wait_for_its_outcome_and_stay_home() {
    let mut a = Backend::start("a").await;
    let b = Backend::start("b").await;
    let a_addr = a.addr;
    let mut cfg = quick_config(&[
        "--to",
        &format!("a={a_addr}"),
        "--to",
        &format!("b={}", b.addr),
        "--fail-timeout",
        "300ms",
    ]);
    cfg.health.fall = 1;
    let proxy = Quick::start(cfg).await;
    a.kill().await;
    let mut c = H1::open(proxy.addr).await;
    let moved = c
        .get(Some("route=a"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((moved.status, moved.node.as_str()), (200, "b"), "{moved:?}");
    assert_eq!(proxy.state_of("a"), "DOWN");
    let mut a = Backend::start_at("a", a_addr).await;
    let due = proxy
        .trial_at("a")
        .unwrap_or_else(|| panic!("a has a trial"));
    let deadline = Instant::now() + PATIENCE;
    while limpet::clock::now_ms() < due {
        assert!(Instant::now() < deadline, "a's trial never came due");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // The trial: a request of a session of a's that a answers in 500 ms.
    let mut t = H1::open(proxy.addr).await;
    t.sender
        .ready()
        .await
        .unwrap_or_else(|e| panic!("h1 connection: {e}"));
    let trial = tokio::spawn(
        t.sender
            .send_request(request("/slow?ms=500", Some("route=a"))),
    );
    while proxy.trial_at("a") == Some(due) {
        assert!(Instant::now() < deadline, "the /slow request took no trial");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Meanwhile three more requests of a's sessions, each on its own connection.
    let mut others = JoinSet::new();
    for _ in 0..3 {
        let addr = proxy.addr;
        others.spawn(async move {
            let mut c = H1::open(addr).await;
            let sent = Instant::now();
            c.get(Some("route=a")).await.map(|a| (a, sent.elapsed()))
        });
    }
    let trial = tokio::time::timeout(PATIENCE, trial)
        .await
        .unwrap_or_else(|_| panic!("the trial's answer in time"))
        .unwrap_or_else(|e| panic!("trial task: {e}"))
        .unwrap_or_else(|e| panic!("trial: {e}"));
    let trial = answer_of(trial).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((trial.status, trial.node.as_str()), (200, "a"), "{trial:?}");
    while let Some(r) = others.join_next().await {
        let (r, took) = r
            .unwrap_or_else(|e| panic!("request task: {e}"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (r.status, r.node.as_str(), r.set_cookie.as_deref()),
            (200, "a", None),
            "answered by a, the session kept home: {r:?}"
        );
        // Sent while the trial's 500 ms answer was out: each waited for it.
        assert!(
            took >= Duration::from_millis(150),
            "routed during the trial, it waited for its outcome: {took:?}"
        );
    }
    assert_eq!(proxy.state_of("a"), "UP");
    drop((c, t));
    proxy.stop().await;
    a.kill().await;
    let mut b = b;
    b.kill().await;
}

/// Without checks, a node that went DOWN leaving an HTTP request unanswered (hung: its kernel
/// completes connects, nothing answers) is not tried by TCP sessions: a completed connect
/// proves nothing about answers. With only TCP sessions coming, limpet tries it itself as the
/// config's HTTP listener reaches it, with `OPTIONS *`: unanswered while a hangs, so a stays
/// DOWN and every session goes to b; answered once a answers again, so a is UP within its
/// `fail_timeout` and the second after which limpet tries a node itself, though no HTTP
/// request came. Before, a TCP session's connect brought a UP while it hung (and the session
/// hung on it); then, once that was fixed, a stayed DOWN for good while only TCP sessions
/// came (a print server's raw port used all day, its web page now and then), every session
/// refused when all the nodes were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_sessions_alone_bring_back_a_node_down_for_unanswered_requests_once_it_answers() {
    let (a_listener, b_listener, port) = common_port_pair().await;
    let hung = Arc::new(AtomicBool::new(true));
    let lines = Arc::new(Mutex::new(Vec::new()));
    let a = hanging_node_on(a_listener, "a", Arc::clone(&hung), Arc::clone(&lines));
    let mut b = Backend::serve("b", b_listener);
    let text = format!(
        "{}[health]\nfall = 1\nfail_timeout = \"300ms\"\n\n\
         [[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = {port}\n\
         timeouts = {{ upstream_answer = \"300ms\", drain = \"1s\" }}\n\n\
         [[listeners]]\nname = \"raw\"\nbind = \"127.0.0.1:0\"\nmode = \"tcp\"\nnode_port = {port}\n\
         timeouts = {{ connect = \"1s\", drain = \"1s\" }}\n\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n",
        nodes_toml(&AB)
    );
    let cfg = ConfigFile::new("tcp-trial-hung", &text);
    let l = Limpet::start(&cfg).await;

    // a goes DOWN on its first unanswered request, which is replayed on b.
    let mut h1 = H1::open(l.addr("web")).await;
    let first = h1
        .get(Some("route=a"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((first.status, first.node.as_str()), (200, "b"), "{first:?}");
    assert_eq!(node_view(&l, "a").await["state"], "DOWN");
    drop(h1);
    let heads_seen = || {
        lines
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    };
    assert_eq!(
        heads_seen(),
        ["GET / HTTP/1.1"],
        "the request a left unanswered"
    );

    // Fresh TCP sessions, no HTTP request, until limpet's own trial of a has asked it twice
    // (past a's fail_timeout, 0.3 s, and the second after which limpet tries a node itself;
    // a's trial unanswered each time): every session on b, a DOWN.
    let since = Instant::now();
    let mut sessions = 0;
    while heads_seen().len() < 3 {
        assert!(
            since.elapsed() < PATIENCE && sessions < 200,
            "limpet did not try a: {:?}",
            heads_seen()
        );
        let mut s = TcpStream::connect(l.addr("raw"))
            .await
            .unwrap_or_else(|e| panic!("connect raw: {e}"));
        assert_eq!(
            tcp_get(&mut s).await.as_deref(),
            Ok("b"),
            "session {sessions}"
        );
        sessions += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let hung_heads = heads_seen();
    assert!(
        hung_heads[1..].iter().all(|h| h == "OPTIONS * HTTP/1.1"),
        "no TCP session reached a, only limpet's own trials: {hung_heads:?}"
    );
    let view = node_view(&l, "a").await;
    assert_eq!(view["state"], "DOWN", "{view}");

    // a answers again; still only TCP sessions come. (A trial may be out to a as it does,
    // unanswered at its 300 ms; then the next is due within 300 ms and a second.)
    hung.store(false, Ordering::SeqCst);
    let bound = Duration::from_millis(600) + Duration::from_secs(1) + SLACK;
    until_a_is_up(&l, bound, async || {
        let mut s = TcpStream::connect(l.addr("raw"))
            .await
            .unwrap_or_else(|e| panic!("connect raw: {e}"));
        assert!(
            matches!(tcp_get(&mut s).await.as_deref(), Ok("a" | "b")),
            "every session served"
        );
    })
    .await;
    // The first head a read after it answered again: a is DOWN until then, so nothing but
    // a trial reaches it (sessions may follow once it is UP).
    assert_eq!(
        heads_seen().get(hung_heads.len()).map(String::as_str),
        Some("OPTIONS * HTTP/1.1"),
        "limpet's own trial brought a back: {:?}",
        heads_seen()
    );
    l.stop().await;
    a.abort();
    b.kill().await;
}

/// limpet's own `OPTIONS *` of a node, made for TCP sessions, is an answer like any other:
/// a request sent to the node before it, still unanswered at its answer timeout, is slow by
/// itself, and the node that answered the trial stays UP (`fall = 1`). Without it counted,
/// that request's timeout took the node DOWN again as it came back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tcp_driven_trial_s_answer_is_a_sign_of_life_for_requests_sent_before_it() {
    let (mut a, mut b, port) = ab_on_a_common_port().await;
    let text = format!(
        "{}{FALL_ONE}\
         [[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = {port}\n\
         timeouts = {{ upstream_answer = \"5s\", drain = \"1s\" }}\n\n\
         [[listeners]]\nname = \"raw\"\nbind = \"127.0.0.1:0\"\nmode = \"tcp\"\nnode_port = {port}\n\
         timeouts = {{ connect = \"1s\", drain = \"1s\" }}\n\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n",
        nodes_toml(&AB)
    );
    let cfg = ConfigFile::new("tcp-trial-sign-of-life", &text);
    let l = Limpet::start(&cfg).await;
    let state = running_state(&l);
    let a_rt = node_rt(&state, "a");
    // A POST to a that a answers in 8 s, past the 5 s answer timeout.
    let url = format!("http://{}/slow?ms=8000", l.addr("web"));
    let slow = tokio::spawn(async move {
        bare_client()
            .post(url)
            .header("cookie", "route=a")
            .body("slow")
            .send()
            .await
            .map(|r| r.status().as_u16())
    });
    until_admitted(&a_rt).await;
    // a DOWN for a request it left unanswered (as another request's timeout would take it):
    // only an answer brings it back.
    // Only TCP sessions come: limpet's own `OPTIONS *` brings a back.
    down_unanswered_until_tcp_sessions_bring_it_back(&l).await;
    // The POST times out: slow by itself, a answered a younger request (the trial).
    let status = tokio::time::timeout(PATIENCE, slow)
        .await
        .unwrap_or_else(|_| panic!("the POST's answer in time"))
        .unwrap_or_else(|e| panic!("POST task: {e}"))
        .unwrap_or_else(|e| panic!("POST: {e}"));
    assert_eq!(status, 504);
    let view = node_view(&l, "a").await;
    assert_eq!(view["state"], "UP", "{view}");
    l.stop().await;
    a.kill().await;
    b.kill().await;
}

/// A node DOWN for requests it left unanswered in a config with no HTTP listener (its
/// health carried over by an upgrade from a limpet that had one): nothing of this config can
/// ask it, so limpet's own attempt through the TCP listener, a connect, decides its trial, and
/// it comes back with only TCP sessions coming. Without that, it stayed DOWN for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_http_listener_a_node_down_for_unanswered_requests_comes_back_on_a_connect() {
    let (mut a, mut b, port) = ab_on_a_common_port().await;
    let text = format!(
        "{}{FALL_ONE}\
         [[listeners]]\nname = \"raw\"\nbind = \"127.0.0.1:0\"\nmode = \"tcp\"\nnode_port = {port}\n\
         timeouts = {{ connect = \"1s\", drain = \"1s\" }}\n\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n",
        nodes_toml(&AB)
    );
    let cfg = ConfigFile::new("tcp-only-unanswered", &text);
    let l = Limpet::start(&cfg).await;
    down_unanswered_until_tcp_sessions_bring_it_back(&l).await;
    l.stop().await;
    a.kill().await;
    b.kill().await;
}

/// Without checks, a node that blinked comes back though every session was moved off it and
/// no new client comes (the print server's fixed clients, on a source-address table): once
/// its trial has been due a second with no request to make it, limpet tries it with a connect
/// of its own. Before, only a fresh assignment or a session pinned to the node tried it, so it
/// stayed DOWN for good, its share of the load on b.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_blinked_comes_back_though_every_session_moved_off_it() {
    let (a_listener, b_listener, port) = common_port_pair().await;
    let a_addr = a_listener
        .local_addr()
        .unwrap_or_else(|e| panic!("addr: {e}"));
    let mut a = Backend::serve("a", a_listener);
    let mut b = Backend::serve("b", b_listener);
    let text = format!(
        "{}[health]\nfall = 1\nfail_timeout = \"500ms\"\n\n\
         [[tables]]\nname = \"t\"\nkey = \"source-ip\"\n\n\
         [[listeners]]\nname = \"raw\"\nbind = \"127.0.0.1:0\"\nmode = \"tcp\"\nnode_port = {port}\n\
         table = \"t\"\ntimeouts = {{ connect = \"1s\", drain = \"1s\" }}\n\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n",
        nodes_toml(&AB)
    );
    let cfg = ConfigFile::new("blink-pinned", &text);
    let l = Limpet::start(&cfg).await;
    let raw = l.addr("raw");
    // The one client, pinned to a.
    let (first, client) = tcp_session_on(raw, "a", 60).await;
    drop(first);

    // a blinks: its next connect is refused, a goes DOWN, the client moves to b.
    a.kill().await;
    let mut s = connect_from(client, raw).await;
    assert_eq!(
        tcp_get(&mut s).await.as_deref(),
        Ok("b"),
        "failed over to b"
    );
    drop(s);
    assert_eq!(node_view(&l, "a").await["state"], "DOWN");
    let mut a = Backend::start_at("a", a_addr).await;
    let back = Instant::now();

    // The client goes on, now pinned to b; no new client comes. Within fail_timeout (0.5 s),
    // the second's grace and slack, a is UP.
    let bound = Duration::from_millis(500) + Duration::from_secs(1) + SLACK;
    until_a_is_up(&l, bound, async || {
        let mut s = connect_from(client, raw).await;
        assert_eq!(
            tcp_get(&mut s).await.as_deref(),
            Ok("b"),
            "the session stays on b"
        );
    })
    .await;
    eprintln!("a UP {:?} after it came back", back.elapsed());
    l.stop().await;
    a.kill().await;
    b.kill().await;
}

// ---------------------------------------------------------------------------------------
// A reload reaches the checks already running
// ---------------------------------------------------------------------------------------

/// A self-signed certificate for `ip` (its own CA) as PEM, and a TLS server config holding it.
fn tls_identity(ip: &str) -> (String, Arc<rustls::ServerConfig>) {
    let ck = rcgen::generate_simple_self_signed(vec![ip.to_owned()])
        .unwrap_or_else(|e| panic!("cert: {e}"));
    let key = rustls_pki_types::PrivatePkcs8KeyDer::from(ck.key_pair.serialize_der());
    let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap_or_else(|e| panic!("{e}"))
    .with_no_client_auth()
    .with_single_cert(vec![ck.cert.der().clone()], key.into())
    .unwrap_or_else(|e| panic!("server config: {e}"));
    (ck.cert.pem(), Arc::new(cfg))
}

/// The nodes' CA file rewritten in place (their certificates were reissued by a new CA) and a
/// reload: the TLS checks already running verify with it from then on, and the node they held
/// DOWN is UP again. Before, a check whose node, address and settings were unchanged kept
/// running with the client config it started with, whatever the file held now; its node stayed
/// DOWN until limpet restarted, while new connections to it verified with the new file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_file_rewritten_in_place_reaches_the_running_tls_checks_at_a_reload() {
    let node = TcpListener::bind("127.0.0.2:0")
        .await
        .unwrap_or_else(|e| panic!("bind node: {e}"));
    let port = node.local_addr().map(|a| a.port()).unwrap_or(0);
    let (node_pem, server_cfg) = tls_identity("127.0.0.2");
    let server = tls_echo_node("a", node, server_cfg, Arc::new(AtomicBool::new(false)));
    let text = format!(
        "{}[health]\nfall = 1\nrise = 1\ninterval = \"100ms\"\ntimeout = \"1s\"\n\n\
         [[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = {port}\n\
         check = {{ kind = \"tls\" }}\ntimeouts = {{ drain = \"1s\" }}\n\n\
         [listeners.upstream_tls]\nca = \"ca.pem\"\n\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n",
        nodes_toml(&AB[..1])
    );
    let cfg = ConfigFile::new("tls-check-ca-reload", &text);
    // At first the file holds another CA's certificate: the node's is not trusted.
    let (stranger, _) = tls_identity("127.0.0.2");
    std::fs::write(cfg.dir.join("ca.pem"), stranger).unwrap_or_else(|e| panic!("ca: {e}"));
    let l = Limpet::start(&cfg).await;
    let deadline = Instant::now() + PATIENCE;
    loop {
        let v = node_view(&l, "a").await;
        if v["state"] == "DOWN" {
            break;
        }
        assert!(Instant::now() < deadline, "the check never failed: {v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    std::fs::write(cfg.dir.join("ca.pem"), node_pem).unwrap_or_else(|e| panic!("ca: {e}"));
    reload_trivially(&l, &cfg, &text).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let v = node_view(&l, "a").await;
        if v["state"] == "UP" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the node is still DOWN 5 s after the reload (checks every 100 ms): {v}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    l.stop().await;
    server.abort();
}

/// How a [`TunnelNode`] ends its side of the tunnel when told.
#[derive(Debug, Clone, Copy)]
enum NodeEnd {
    /// A FIN: the stream ended whole.
    Fin,
    /// A reset (`SO_LINGER` 0): its process crashed, or it aborted the stream.
    Reset,
}

/// A node that answers one upgrade to a byte stream (`Upgrade: tcp`) with a 101 and `abc`,
/// then ends its side as the test tells it, or, told nothing, reads until its client side
/// ends and says how: `Ok(())` for a FIN, the error otherwise.
struct TunnelNode {
    addr: SocketAddr,
    end: Option<oneshot::Sender<NodeEnd>>,
    saw: Option<oneshot::Receiver<std::io::Result<()>>>,
    task: JoinHandle<()>,
}

impl TunnelNode {
    async fn start() -> TunnelNode {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind node");
        let addr = listener.local_addr().expect("addr");
        let (end_tx, end_rx) = oneshot::channel();
        let (saw_tx, saw) = oneshot::channel();
        let task = tokio::spawn(async move {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let mut head = Vec::new();
            let mut b = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                match s.read(&mut b).await {
                    Ok(1) => head.push(b[0]),
                    _ => return,
                }
            }
            let answer = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: tcp\r\nConnection: Upgrade\r\n\r\nabc";
            if s.write_all(answer).await.is_err() {
                return;
            }
            let mut sink = [0u8; 1024];
            tokio::select! {
                end = end_rx => match end {
                    Ok(NodeEnd::Fin) => {
                        let _ = s.shutdown().await;
                        // Hold the socket until the client side is done with it.
                        while matches!(s.read(&mut sink).await, Ok(n) if n > 0) {}
                    }
                    Ok(NodeEnd::Reset) => {
                        let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
                    }
                    Err(_) => {}
                },
                r = async {
                    loop {
                        match s.read(&mut sink).await {
                            Ok(0) => return Ok(()),
                            Ok(_) => continue,
                            Err(e) => return Err(e),
                        }
                    }
                } => {
                    let _ = saw_tx.send(r);
                }
            }
        });
        TunnelNode {
            addr,
            end: Some(end_tx),
            saw: Some(saw),
            task,
        }
    }

    /// limpet in front of this node alone (`a`).
    async fn limpet(&self) -> Quick {
        let mut cfg = limpet::proxy::ProxyConfig::new(vec![limpet::proxy::NodeConfig {
            name: "a".into(),
            addr: self.addr,
        }]);
        cfg.timeouts.drain = Duration::from_secs(1);
        Quick::start(cfg).await
    }
}

/// Opens a byte-stream tunnel through `proxy` and reads the node's `abc` through it.
async fn open_tunnel(proxy: SocketAddr) -> TcpStream {
    let mut c = TcpStream::connect(proxy).await.expect("connect");
    c.write_all(b"GET /attach HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n")
        .await
        .expect("write");
    let mut got = Vec::new();
    let mut b = [0u8; 1];
    while !got.ends_with(b"\r\n\r\nabc") {
        let n = tokio::time::timeout(PATIENCE, c.read(&mut b))
            .await
            .expect("the 101 and abc in time")
            .expect("read");
        assert_eq!(
            n,
            1,
            "ended before the 101 and abc: {:?}",
            String::from_utf8_lossy(&got)
        );
        got.push(b[0]);
    }
    assert!(
        got.starts_with(b"HTTP/1.1 101"),
        "{:?}",
        String::from_utf8_lossy(&got)
    );
    c
}

/// How the client's side of a tunnel ends: `Ok(())` for a FIN, the error otherwise.
async fn client_end(c: &mut TcpStream) -> std::io::Result<()> {
    let mut b = [0u8; 64];
    match tokio::time::timeout(PATIENCE, c.read(&mut b))
        .await
        .expect("the tunnel ended in time")
    {
        Ok(0) => Ok(()),
        Ok(n) => panic!("unexpected bytes: {:?}", &b[..n]),
        Err(e) => Err(e),
    }
}

/// A byte-stream tunnel after a 101 (`Upgrade: tcp`, as `docker attach` uses) passes a
/// node's abort on as an abort, and its clean end as an end: the client reads a reset where
/// the node reset, a FIN where it sent one. Before, hyper's upgraded connection hid the
/// socket, and every end reached the client as a FIN: a download cut by the node's crash
/// read as complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_byte_stream_tunnel_passes_a_node_s_reset_on_as_a_reset_and_its_end_as_an_end() {
    for (end, reset) in [(NodeEnd::Reset, true), (NodeEnd::Fin, false)] {
        let mut node = TunnelNode::start().await;
        let proxy = node.limpet().await;
        let mut c = open_tunnel(proxy.addr).await;
        let _ = node.end.take().expect("end").send(end);
        let got = client_end(&mut c).await;
        match reset {
            true => assert!(
                matches!(&got, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
                "the node's reset reaches the client as a reset: {got:?}"
            ),
            false => assert!(
                got.is_ok(),
                "the node's FIN reaches the client as a FIN: {got:?}"
            ),
        }
        drop(c);
        proxy.stop().await;
        node.task.abort();
    }
}

/// A byte-stream tunnel cut by a close signal (its node put in MAINT) is reset on both
/// sides, so that neither takes the stream it got so far for a whole one. Before, both
/// sides read a FIN.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_byte_stream_tunnel_cut_by_maint_is_reset_on_both_sides() {
    let mut node = TunnelNode::start().await;
    let proxy = node.limpet().await;
    let mut c = open_tunnel(proxy.addr).await;
    proxy
        .runtime
        .state()
        .set_admin("a", limpet_core::AdminState::Maint);
    let got = client_end(&mut c).await;
    assert!(
        matches!(&got, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
        "the client reads a reset: {got:?}"
    );
    let saw = tokio::time::timeout(PATIENCE, node.saw.take().expect("saw"))
        .await
        .expect("the node's side ended in time")
        .expect("node");
    assert!(
        matches!(&saw, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
        "the node reads a reset: {saw:?}"
    );
    drop(c);
    proxy.stop().await;
    node.task.abort();
}

/// A node reached on two ports, one of which hangs while the other answers (a print
/// server's web port up, its IPP port hung): a request left unanswered on the hung port is
/// its node's failure, charged and replayed on another node when it is a GET, its session
/// re-pinned there, however busily the other port answers. Before, any answer of the
/// node's, on whatever port, made each such request "slow by itself": answered 504, never
/// replayed, never charged, the session pinned to the hung port for good. (The other port's
/// answers keep the node UP, as documented: health is the node's; a check of each port,
/// as the print-server example has, takes it DOWN.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_port_of_a_node_whose_other_port_answers_is_the_node_s_failure() {
    let (wa, wb, web_port) = common_port_pair().await;
    let (ia, ib, ipp_port) = common_port_pair().await;
    let _web = (Backend::serve("a", wa), Backend::serve("b", wb));
    let _ipp_b = Backend::serve("b", ib);
    // a's IPP port takes connections and requests and answers none.
    let hung = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = ia.accept().await {
            held.push(s);
        }
    });
    let listener = |name: &str, port: u16| {
        format!(
            "[[listeners]]\nname = \"{name}\"\nbind = \"127.0.0.1:0\"\nnode_port = {port}\n\
             timeouts = {{ upstream_answer = \"1s\", drain = \"1s\" }}\n\n"
        )
    };
    let cfg = ConfigFile::new(
        "hung-port",
        &format!(
            "{}[health]\nfall = 2\nfail_timeout = \"1h\"\n\n{}{}[admin]\nlisten = \"127.0.0.1:0\"\n",
            nodes_toml(&[("a", "127.0.0.2"), ("b", "127.0.0.3")]),
            listener("web", web_port),
            listener("ipp", ipp_port),
        ),
    );
    let l = Limpet::start(&cfg).await;
    // a's web port answers all along: a GET of the session every 50 ms (bounded).
    let web = format!("http://{}/", l.addr("web"));
    let busy = Arc::new(AtomicBool::new(true));
    let answered_by_a = Arc::new(AtomicU64::new(0));
    let web_traffic = tokio::spawn({
        let (busy, answered_by_a) = (Arc::clone(&busy), Arc::clone(&answered_by_a));
        async move {
            for _ in 0..400 {
                if !busy.load(Ordering::Relaxed) {
                    break;
                }
                let r = bare_client()
                    .get(&web)
                    .header("cookie", "route=a")
                    .send()
                    .await;
                if r.is_ok_and(|r| node_of(r.headers()) == "a") {
                    answered_by_a.fetch_add(1, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    });
    let ipp = format!("http://{}/", l.addr("ipp"));
    for i in 0..2 {
        let before = answered_by_a.load(Ordering::Relaxed);
        let r = bare_client()
            .get(&ipp)
            .header("cookie", "route=a")
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {i}: {e}"));
        let (status, node) = (r.status().as_u16(), node_of(r.headers()));
        let repin = route_cookie_of(r.headers());
        assert_eq!((status, node.as_str()), (200, "b"), "GET {i}: replayed");
        assert_eq!(repin.as_deref(), Some("route=b"), "GET {i}: re-pinned");
        // The web port answered meanwhile: before, that made the request slow by itself.
        assert!(
            answered_by_a.load(Ordering::Relaxed) > before,
            "GET {i}: a's web port answered nothing meanwhile"
        );
    }
    let view = node_view(&l, "a").await;
    assert_eq!(view["traffic"]["errors"], 2, "charged: {view}");
    assert_eq!(view["traffic"]["answers_slow"], 0, "{view}");
    busy.store(false, Ordering::Relaxed);
    let _ = web_traffic.await;
    hung.abort();
    l.stop().await;
}
