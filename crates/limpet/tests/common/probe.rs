//! Running `limpet probe` as a real process for the `probe_*` tests.
//!
//! [`ProbeProc`] owns the child and kills it by its PID when dropped, so a failed assertion
//! never leaves a probe running. Its stdout is read line by line as the probe writes it: under
//! `--watch --json` a test waits on the probe's own `round` lines, never on time.

use std::process::Stdio;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStderr, ChildStdout, Command};

use super::PATIENCE;

/// A running probe.
pub struct ProbeProc {
    child: Child,
    stdout: Lines<BufReader<ChildStdout>>,
    stderr: Option<ChildStderr>,
    /// Every stdout line read so far.
    pub seen: Vec<String>,
}

/// A finished probe.
#[derive(Debug)]
pub struct Finished {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Finished {
    /// The last stdout line as JSON: the report under `--json`.
    pub fn report(&self) -> Value {
        let last = self.stdout.lines().last().unwrap_or_default();
        serde_json::from_str(last)
            .unwrap_or_else(|e| panic!("last line is not JSON ({e}): {last:?}\n{self:?}"))
    }
}

impl ProbeProc {
    /// Starts `limpet probe ARGS...` (the binary cargo built for this test).
    pub fn spawn(args: &[&str]) -> ProbeProc {
        let mut child = Command::new(env!("CARGO_BIN_EXE_limpet"))
            .arg("probe")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start limpet probe");
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take();
        ProbeProc {
            child,
            stdout: BufReader::new(stdout).lines(),
            stderr,
            seen: Vec::new(),
        }
    }

    /// The next stdout line, or `None` at the end of output.
    pub async fn next_line(&mut self) -> Option<String> {
        let line = tokio::time::timeout(PATIENCE, self.stdout.next_line())
            .await
            .expect("probe printed a line in time")
            .expect("read probe stdout");
        if let Some(l) = &line {
            self.seen.push(l.clone());
        }
        line
    }

    /// Reads JSON lines until one satisfies `pred`; panics if output ends first.
    pub async fn wait_for_json(&mut self, pred: impl Fn(&Value) -> bool) -> Value {
        while let Some(line) = self.next_line().await {
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                if pred(&v) {
                    return v;
                }
            }
        }
        panic!(
            "probe output ended before the expected line: {:?}",
            self.seen
        );
    }

    /// Reads the rest of the output and waits for the exit.
    pub async fn finish(mut self) -> Finished {
        while self.next_line().await.is_some() {}
        let mut stderr = String::new();
        if let Some(mut e) = self.stderr.take() {
            let _ = tokio::time::timeout(PATIENCE, e.read_to_string(&mut stderr)).await;
        }
        let status = tokio::time::timeout(PATIENCE, self.child.wait())
            .await
            .expect("probe exited in time")
            .expect("wait for probe");
        let mut stdout = self.seen.join("\n");
        stdout.push('\n');
        Finished {
            code: status.code(),
            stdout,
            stderr,
        }
    }
}

impl Drop for ProbeProc {
    fn drop(&mut self) {
        // Already exited: harmless. Otherwise this is a failed test; do not leave it behind.
        let _ = self.child.start_kill();
        let _ = self.child.try_wait();
    }
}

/// Runs `limpet probe ARGS...` to the end.
pub async fn probe(args: &[&str]) -> Finished {
    ProbeProc::spawn(args).finish().await
}

/// limpet's quick proxy in front of `nodes`, each behind a [`Host`] that can crash with every
/// connection it holds (sockets included): the proxy and the hosts by node name.
pub async fn proxy_over_hosts(nodes: &[super::Node]) -> (super::Proxy, Vec<(String, Host)>) {
    let mut hosts = Vec::new();
    for n in nodes {
        hosts.push((n.name.clone(), Host::start(n.addr).await));
    }
    let proxy = super::Proxy::start(limpet::proxy::ProxyConfig::new(
        hosts
            .iter()
            .map(|(name, h)| limpet::proxy::NodeConfig {
                name: name.clone(),
                addr: h.addr,
            })
            .collect(),
    ))
    .await;
    (proxy, hosts)
}

/// A node's host that can crash: a TCP relay in front of a node, which [`Host::crash`] stops
/// together with every connection through it, WebSockets included, as a dead machine would.
/// (Stopping an in-process node alone leaves its upgraded sockets running.)
pub struct Host {
    pub addr: std::net::SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Host {
    /// Relays 127.0.0.1:PORT (bound before this returns) to `node`.
    pub async fn start(node: std::net::SocketAddr) -> Host {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind host");
        let addr = listener.local_addr().expect("host addr");
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    _ = &mut stopped => break,
                    Some(_) = conns.join_next(), if !conns.is_empty() => {}
                    accepted = listener.accept() => {
                        let Ok((mut client, _)) = accepted else { continue };
                        conns.spawn(async move {
                            if let Ok(mut upstream) = tokio::net::TcpStream::connect(node).await {
                                let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream)
                                    .await;
                            }
                        });
                    }
                }
            }
            // Dropping the listener and aborting every relay closes all their sockets.
            drop(listener);
            conns.shutdown().await;
        });
        Host {
            addr,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Crashes the host; returns once every connection through it is closed.
    pub async fn crash(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(PATIENCE, task).await;
        }
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// The bearer token a [`LoginNode`] wants in `Authorization`.
pub const LOGIN_TOKEN: &str = "Bearer t0ken";
/// The session cookie a [`LoginNode`] wants, as `name=value`.
pub const LOGIN_COOKIE: &str = "sid=s3cr3t";

/// What a [`LoginNode`] has seen.
#[derive(Debug, Default)]
pub struct LoginCounts {
    /// HTTP requests answered (logged in).
    pub answered: std::sync::atomic::AtomicU32,
    /// WebSocket upgrades accepted (logged in).
    pub upgraded: std::sync::atomic::AtomicU32,
    /// Requests and upgrades refused with 401 (not logged in).
    pub refused: std::sync::atomic::AtomicU32,
}

impl LoginCounts {
    /// (answered, upgraded, refused).
    pub fn get(&self) -> (u32, u32, u32) {
        use std::sync::atomic::Ordering::SeqCst;
        (
            self.answered.load(SeqCst),
            self.upgraded.load(SeqCst),
            self.refused.load(SeqCst),
        )
    }
}

/// A node of an application behind a login: it serves only requests and upgrades carrying
/// `Authorization: Bearer t0ken` and the cookie `sid=s3cr3t`; any other gets a 401 without
/// the node header, as a login gate in front of the app would answer. Logged in, it is a demo
/// node: `X-Limpet-Node: NAME` on every answer, and at `/ws` a WebSocket whose first text
/// frame is its name; at `/ws-app`, one whose first text frame is an application's welcome
/// (`{"type":"welcome"}`), its node named by the 101's header alone. Stopped (listener and every connection) when dropped.
pub struct LoginNode {
    pub name: String,
    pub addr: std::net::SocketAddr,
    pub counts: std::sync::Arc<LoginCounts>,
    task: tokio::task::JoinHandle<()>,
    /// Cuts the upgraded sockets, which leave hyper's connection tasks.
    stop: tokio::sync::watch::Sender<bool>,
}

impl LoginNode {
    pub async fn start(name: &str) -> LoginNode {
        use std::sync::Arc;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind login node");
        let addr = listener.local_addr().expect("login node addr");
        let counts = Arc::new(LoginCounts::default());
        let node: Arc<str> = Arc::from(name);
        let (c, n) = (Arc::clone(&counts), Arc::clone(&node));
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            // Aborting this task drops the set, which aborts every connection and socket.
            let mut conns = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    Some(_) = conns.join_next(), if !conns.is_empty() => {}
                    accepted = listener.accept() => {
                        let Ok((stream, _)) = accepted else { continue };
                        let (c, n, s) = (Arc::clone(&c), Arc::clone(&n), stopped.clone());
                        conns.spawn(async move {
                            let svc = hyper::service::service_fn(move |req| {
                                login_answer(Arc::clone(&n), Arc::clone(&c), s.clone(), req)
                            });
                            let _ = hyper::server::conn::http1::Builder::new()
                                .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                                .with_upgrades()
                                .await;
                        });
                    }
                }
            }
        });
        LoginNode {
            name: name.to_owned(),
            addr,
            counts,
            task,
            stop,
        }
    }
}

impl Drop for LoginNode {
    fn drop(&mut self) {
        self.task.abort();
        let _ = self.stop.send(true);
    }
}

type LoginBody = http_body_util::Full<bytes::Bytes>;

fn logged_in(headers: &http::HeaderMap) -> bool {
    let token = headers
        .get(http::header::AUTHORIZATION)
        .is_some_and(|v| v.as_bytes() == LOGIN_TOKEN.as_bytes());
    // Cookies may come as one line or several; the pair must be there whole.
    let cookie = headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|line| line.split(';'))
        .any(|pair| pair.trim() == LOGIN_COOKIE);
    token && cookie
}

async fn login_answer(
    node: std::sync::Arc<str>,
    counts: std::sync::Arc<LoginCounts>,
    mut stopped: tokio::sync::watch::Receiver<bool>,
    mut req: http::Request<hyper::body::Incoming>,
) -> Result<http::Response<LoginBody>, std::convert::Infallible> {
    use std::sync::atomic::Ordering::SeqCst;
    use tokio_tungstenite::tungstenite::{handshake::derive_accept_key, protocol::Role};

    let mut resp = http::Response::new(LoginBody::default());
    if !logged_in(req.headers()) {
        counts.refused.fetch_add(1, SeqCst);
        *resp.status_mut() = http::StatusCode::UNAUTHORIZED;
        *resp.body_mut() = LoginBody::from("log in first\n");
        return Ok(resp);
    }
    let key = req
        .headers()
        .get(http::header::SEC_WEBSOCKET_KEY)
        .map(|k| derive_accept_key(k.as_bytes()));
    if let (Some(accept), "/ws" | "/ws-app") = (key, req.uri().path()) {
        counts.upgraded.fetch_add(1, SeqCst);
        let on_upgrade = hyper::upgrade::on(&mut req);
        let name = match req.uri().path() {
            "/ws" => node.to_string(),
            _ => r#"{"type":"welcome"}"#.to_owned(),
        };
        tokio::spawn(async move {
            use futures_util::{SinkExt, StreamExt};
            let Ok(upgraded) = on_upgrade.await else {
                return;
            };
            let mut ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
                hyper_util::rt::TokioIo::new(upgraded),
                Role::Server,
                None,
            )
            .await;
            let greet_and_hold = async {
                if ws.send(name.into()).await.is_ok() {
                    // Held open until the client closes it.
                    while let Some(Ok(_)) = ws.next().await {}
                }
            };
            tokio::select! {
                () = greet_and_hold => {}
                _ = stopped.wait_for(|s| *s) => {}
            }
        });
        *resp.status_mut() = http::StatusCode::SWITCHING_PROTOCOLS;
        let h = resp.headers_mut();
        h.insert(
            http::header::UPGRADE,
            http::HeaderValue::from_static("websocket"),
        );
        h.insert(
            http::header::CONNECTION,
            http::HeaderValue::from_static("upgrade"),
        );
        if let Ok(v) = http::HeaderValue::from_str(&accept) {
            h.insert(http::header::SEC_WEBSOCKET_ACCEPT, v);
        }
    } else {
        counts.answered.fetch_add(1, SeqCst);
        *resp.body_mut() = LoginBody::from(format!("node {node}\n"));
    }
    if let Ok(v) = http::HeaderValue::from_str(&node) {
        resp.headers_mut().insert("x-limpet-node", v);
    }
    Ok(resp)
}
