//! `limpet demo`: limpet's main job on an embedded setup, with no arguments and no files.
//!
//! Three built-in nodes ([`crate::backend`]) listen on loopback ports chosen by the system; the
//! proxy listens in front of them on 127.0.0.1:8080, and the admin listener (stats page, JSON
//! API, metrics) on 127.0.0.1:9900; either moves to a free port when its default is taken. The
//! nodes have active health checks (every second, `fall 2`, `rise 2`), so the stats page shows
//! a stopped node go DOWN and come back.
//!
//! The demo page (`/index.html`, served by the nodes through the proxy) shows which node
//! served it, asks `/` once a second and keeps a WebSocket open, each showing its node, and
//! has buttons that call the demo's control endpoint, served by every node:
//!
//! | method | path | what |
//! |---|---|---|
//! | GET | `/demo/nodes` | every node: running or stopped, and what limpet's admin API says of it; the stats page's address |
//! | POST | `/demo/nodes/{node}/stop` | the node stops listening and cuts its WebSockets, like a process that exits (answers in flight complete) |
//! | POST | `/demo/nodes/{node}/start` | the node listens again on the same port |
//! | POST | `/demo/nodes/{node}/drain?deadline_secs=N` | `{"state":"drain","deadline_secs":N,"spread_secs":0}` to the admin API (default N = 5) |
//! | POST | `/demo/nodes/{node}/maint`, `/ready` | the same state to the admin API |
//!
//! Writes need the `X-Limpet-Demo` header (the page sends it; a cross-site form cannot) and a
//! `Host` that is an IP address or `localhost` (a foreign name resolved to loopback, DNS
//! rebinding, is refused as the admin listener refuses it), and
//! are refused when they would leave no node running and ready: the page itself needs one to
//! reach this endpoint, or nothing could start the others again.
//!
//! ```text
//!  browser ─► proxy (127.0.0.1:8080) ─► node alpha | bravo | charlie ─► page, /ws, /demo/...
//!                                                           /demo/... ─┘
//!        stop / start: the node's listener (in this process)    │
//!        drain / maint / ready: POST admin API (127.0.0.1:9900) ◄┘
//! ```
//!
//! Everything runs in this one process. Ctrl-C stops the proxy (it stops accepting and lets
//! in-flight requests finish), the admin listener and the checks first, then the nodes.
//! SIGTERM does the same. [`Demo::start`] is the in-process entry (tests use it with port 0).

use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::{Arc, Weak};
use std::time::Duration;

use http::{Method, StatusCode};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::{JoinHandle, JoinSet};

use crate::admin::AdminSettings;
use crate::backend::{DemoHooks, HookFuture, NodeOptions};
use crate::health::{CheckKind, CheckSpec, HttpCheck};
use crate::proxy::config::{NodeConfig, ProxyConfig};
use crate::runtime::{Runtime, RuntimeControl, State};

/// The demo nodes' names: what the cookie carries and the pages show.
pub const NODES: [&str; 3] = ["alpha", "bravo", "charlie"];

/// The drain deadline the page's "drain" button asks for: long enough to see the session stay
/// on a draining node, short enough to watch it move.
pub const PAGE_DRAIN_DEADLINE_SECS: u32 = 5;

/// How often the demo checks its nodes: often, so a visitor sees a stopped node go DOWN and a
/// started one come back within seconds.
const CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// Consecutive failures (checks and refused connects) that take a node DOWN.
const CHECK_FALL: u32 = 2;
/// Consecutive passing checks that bring it back UP.
const CHECK_RISE: u32 = 2;

/// Arguments of `limpet demo` (all optional).
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Address for the proxy [default: 127.0.0.1:8080; when that is taken, a free port is
    /// used instead, while an address given here that is taken is refused]. Loopback only:
    /// the demo page stops and starts nodes with no token.
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Address for limpet's admin listener (stats page, JSON API, /metrics) [default:
    /// 127.0.0.1:9900; when that is taken, a free port is used instead]. Loopback only: the
    /// demo sets no admin token.
    #[arg(long)]
    admin: Option<SocketAddr>,
}

/// Runs the demo until Ctrl-C. A bad argument exits with code 2, as every command does.
pub fn run(args: DemoArgs) -> ExitCode {
    if let Err(e) = on_loopback(
        args.listen.unwrap_or(DEFAULT_LISTEN),
        args.admin.unwrap_or(DEFAULT_ADMIN),
    ) {
        eprintln!("limpet demo: {e}");
        return ExitCode::from(2);
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("limpet demo: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    rt.block_on(async move {
        let demo = match Demo::start_or_defaults(args.listen, args.admin).await {
            Ok(d) => d,
            Err(e) => {
                eprintln!("limpet demo: {e}");
                return ExitCode::FAILURE;
            }
        };
        print_welcome(&demo);
        crate::proxy::quick::stop_signal().await;
        tracing::info!("stopping the demo");
        demo.stop().await;
        println!("limpet demo stopped.");
        ExitCode::SUCCESS
    })
}

/// A running demo: three nodes, the proxy in front of them, the admin listener.
#[derive(Debug)]
pub struct Demo {
    addr: SocketAddr,
    admin: SocketAddr,
    nodes: Arc<DemoNodes>,
    runtime: Arc<Runtime>,
    shutdown: watch::Sender<bool>,
    tasks: JoinSet<()>,
}

/// The demo's admin listener has no token, and its page's control endpoint (served through
/// the proxy) stops, starts, drains and sets nodes with none either: both may only listen
/// where no one else reaches.
fn on_loopback(listen: SocketAddr, admin: SocketAddr) -> Result<(), String> {
    if !listen.ip().is_loopback() {
        return Err(format!(
            "--listen {listen}: the demo page stops and starts nodes with no token, so the demo listens on loopback only (e.g. 127.0.0.1:8080)"
        ));
    }
    if !admin.ip().is_loopback() {
        return Err(format!(
            "--admin {admin}: the demo's admin listener has no token, so it listens on loopback only (e.g. 127.0.0.1:9900)"
        ));
    }
    Ok(())
}

/// The default `--listen`.
const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 8080);
/// The default `--admin`.
const DEFAULT_ADMIN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 9900);

/// Binds `addr`; when it is a default (`may_move`) and taken, a free port of the same
/// address. An address given on purpose is bound or refused: a script pointed at it would
/// otherwise talk to whatever holds it.
async fn bind_or_free(addr: SocketAddr, may_move: bool, what: &str) -> Result<TcpListener, String> {
    match TcpListener::bind(addr).await {
        Ok(l) => Ok(l),
        Err(first) if may_move && first.kind() == std::io::ErrorKind::AddrInUse => {
            let l = TcpListener::bind(SocketAddr::new(addr.ip(), 0))
                .await
                .map_err(|e| format!("cannot listen on {} for {what}: {e}", addr.ip()))?;
            eprintln!("limpet demo: {addr} is not free for {what} ({first}); using another port");
            Ok(l)
        }
        Err(e) => Err(format!("cannot listen on {addr} for {what}: {e}")),
    }
}

fn local(l: &TcpListener) -> Result<SocketAddr, String> {
    l.local_addr().map_err(|e| e.to_string())
}

impl Demo {
    /// Starts the nodes, the proxy on `listen` and the admin listener on `admin` (both must
    /// be loopback addresses: the demo sets no token). Port 0 picks a free one; an address
    /// that is taken is refused.
    pub async fn start(listen: SocketAddr, admin: SocketAddr) -> Result<Demo, String> {
        Demo::start_on(listen, false, admin, false).await
    }

    /// [`Demo::start`] on the addresses given, or the defaults (127.0.0.1:8080 and :9900),
    /// a default that is taken replaced by a free port of its address.
    pub async fn start_or_defaults(
        listen: Option<SocketAddr>,
        admin: Option<SocketAddr>,
    ) -> Result<Demo, String> {
        Demo::start_on(
            listen.unwrap_or(DEFAULT_LISTEN),
            listen.is_none(),
            admin.unwrap_or(DEFAULT_ADMIN),
            admin.is_none(),
        )
        .await
    }

    async fn start_on(
        listen: SocketAddr,
        listen_may_move: bool,
        admin: SocketAddr,
        admin_may_move: bool,
    ) -> Result<Demo, String> {
        on_loopback(listen, admin)?;
        // Each node gets a port chosen by the system: nothing to collide with.
        let mut node_listeners = Vec::new();
        for name in NODES {
            let l = TcpListener::bind("127.0.0.1:0")
                .await
                .map_err(|e| format!("cannot bind node {name} on loopback: {e}"))?;
            node_listeners.push((name, local(&l)?, l));
        }
        let proxy_listener = bind_or_free(listen, listen_may_move, "the proxy").await?;
        let admin_listener = bind_or_free(admin, admin_may_move, "the admin listener").await?;
        let addr = local(&proxy_listener)?;
        let admin = local(&admin_listener)?;

        let nodes = DemoNodes::new(
            node_listeners.iter().map(|(n, a, _)| (*n, *a)).collect(),
            admin,
        )?;
        for (i, (_, _, l)) in node_listeners.into_iter().enumerate() {
            if let Some(node) = nodes.nodes.get(i) {
                let run = nodes.spawn_node(node.name, l);
                *node.running.lock().await = Some(run);
            }
        }

        let proxy = ProxyConfig::new(
            nodes
                .nodes
                .iter()
                .map(|n| NodeConfig {
                    name: n.name.to_owned(),
                    addr: n.addr,
                })
                .collect(),
        );
        let mut cfg = proxy.to_config(addr).map_err(|e| e.to_string())?;
        cfg.path = "(limpet demo)".into();
        // Drains re-pin at the deadline at once and count as complete after 5 s without a
        // session, so a visitor sees them end.
        cfg.lifecycle.drain_spread = Duration::ZERO;
        cfg.lifecycle.drain_idle = Duration::from_secs(5);
        cfg.lifecycle.checks = nodes
            .nodes
            .iter()
            .map(|n| {
                let mut spec = CheckSpec::new(CheckKind::Http(HttpCheck::default()), n.addr);
                spec.interval = CHECK_INTERVAL;
                spec.timeout = CHECK_INTERVAL / 2;
                spec.jitter = CHECK_INTERVAL / 10;
                spec.fall = CHECK_FALL;
                spec.rise = CHECK_RISE;
                (n.name.to_owned(), spec)
            })
            .collect();
        let runtime = Runtime::new(State::new(cfg)?);
        let _ = runtime.state().lifecycle.admin_addr.set(admin);

        let (shutdown, stop_rx) = watch::channel(false);
        let mut tasks = JoinSet::new();
        {
            let rt = Arc::clone(&runtime);
            let mut stop = stop_rx.clone();
            tasks.spawn(async move {
                let shutdown = async move {
                    let _ = stop.wait_for(|s| *s).await;
                };
                if let Err(e) =
                    crate::proxy::serve_listener(rt, "proxy", proxy_listener, shutdown).await
                {
                    tracing::error!(error = %e, "the demo proxy stopped");
                }
            });
        }
        // Health checks and the drain log; the config names no admin listener, so this binds
        // nothing: the admin listener is the one bound above (a taken default moved it).
        let (_go, go) = watch::channel(true);
        crate::runtime::start_lifecycle(&runtime, &mut tasks, &stop_rx, None, &go, &stop_rx)
            .await?;
        {
            let control = Arc::new(RuntimeControl {
                runtime: Arc::clone(&runtime),
            });
            let settings = AdminSettings {
                listen: admin,
                token: None,
                hosts: Vec::new(),
                state_file: None,
            };
            let mut stop = stop_rx.clone();
            tasks.spawn(async move {
                crate::admin::serve(admin_listener, control, settings, async move {
                    let _ = stop.wait_for(|s| *s).await;
                })
                .await;
            });
        }
        tracing::info!(%addr, %admin, "limpet demo running");
        Ok(Demo {
            addr,
            admin,
            nodes,
            runtime,
            shutdown,
            tasks,
        })
    }

    /// Where the proxy listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where the admin listener listens.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin
    }

    /// The stats page.
    pub fn stats_url(&self) -> String {
        crate::admin::describe(self.admin)
    }

    /// Where node `name` listens (also while it is stopped: it starts there again).
    pub fn node_addr(&self, name: &str) -> Option<SocketAddr> {
        self.nodes.node(name).map(|n| n.addr)
    }

    /// The running limpet (tests read node states from it).
    pub fn runtime(&self) -> &Arc<Runtime> {
        &self.runtime
    }

    /// Stops the proxy (in-flight requests finish), the admin listener and the checks, then
    /// every node.
    pub async fn stop(mut self) {
        let _ = self.shutdown.send(true);
        while self.tasks.join_next().await.is_some() {}
        self.nodes.stop_all().await;
    }
}

/// A node of the demo, running or stopped.
#[derive(Debug)]
struct DemoNode {
    name: &'static str,
    /// Its port stays the same across stop and start: limpet's configuration names it.
    addr: SocketAddr,
    running: tokio::sync::Mutex<Option<NodeRun>>,
}

/// A running node's task and how to stop it.
#[derive(Debug)]
struct NodeRun {
    stop: oneshot::Sender<()>,
    listener_closed: oneshot::Receiver<()>,
    task: JoinHandle<()>,
}

/// The demo's nodes and the control endpoint behind the page's buttons.
#[derive(Debug)]
struct DemoNodes {
    nodes: Vec<DemoNode>,
    admin: SocketAddr,
    client: reqwest::Client,
    /// Stopped nodes still finishing their answers in flight; awaited when the demo stops.
    finishing: std::sync::Mutex<Vec<JoinHandle<()>>>,
    /// Held by an action that takes a node out (stop, drain, MAINT) from its check that
    /// another node serves to its end: two at once each saw the other's node serving, and
    /// left none.
    taking_out: tokio::sync::Mutex<()>,
    /// Itself, for the nodes it starts (they serve its hooks).
    me: Weak<DemoNodes>,
}

fn body(v: Value) -> String {
    v.to_string()
}

fn refused(status: StatusCode, message: impl Into<String>) -> (StatusCode, String) {
    (status, body(json!({ "error": message.into() })))
}

/// What a successful action answers: what happened, and the admin API call when there was one.
fn done(message: String, admin_api: Option<String>) -> (StatusCode, String) {
    (
        StatusCode::OK,
        body(json!({ "ok": true, "message": message, "admin_api": admin_api })),
    )
}

fn query_secs(query: &str, key: &str) -> Option<Result<f64, String>> {
    let v = query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)?;
    Some(
        v.parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && (0.0..=3600.0).contains(s))
            .ok_or_else(|| format!("{key}={v:?}: expected seconds, 0 to 3600")),
    )
}

impl DemoNodes {
    fn new(nodes: Vec<(&'static str, SocketAddr)>, admin: SocketAddr) -> Result<Arc<Self>, String> {
        // The admin listener is on loopback: never through a proxy from the environment.
        let client = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| format!("cannot build the admin API client: {e}"))?;
        Ok(Arc::new_cyclic(|me| DemoNodes {
            nodes: nodes
                .into_iter()
                .map(|(name, addr)| DemoNode {
                    name,
                    addr,
                    running: tokio::sync::Mutex::new(None),
                })
                .collect(),
            admin,
            client,
            finishing: std::sync::Mutex::new(Vec::new()),
            taking_out: tokio::sync::Mutex::new(()),
            me: me.clone(),
        }))
    }

    fn node(&self, name: &str) -> Option<&DemoNode> {
        self.nodes.iter().find(|n| n.name == name)
    }

    /// Serves node `name` on `listener`, stopping like a process that exits cleanly.
    fn spawn_node(&self, name: &'static str, listener: TcpListener) -> NodeRun {
        let (stop, stopped) = oneshot::channel::<()>();
        let (closed_tx, listener_closed) = oneshot::channel();
        let hooks = self.me.upgrade().map(|me| -> Arc<dyn DemoHooks> { me });
        let options = NodeOptions {
            graceful_stop: true,
            hooks,
            listener_closed: Some(closed_tx),
        };
        let task = tokio::spawn(async move {
            crate::backend::serve_with(
                name,
                listener,
                async move {
                    let _ = stopped.await;
                },
                options,
            )
            .await;
        });
        NodeRun {
            stop,
            listener_closed,
            task,
        }
    }

    /// Stops a node; returns once its listener is closed (connects are refused from then on).
    async fn stop_node(&self, node: &DemoNode) -> bool {
        let Some(run) = node.running.lock().await.take() else {
            return false;
        };
        let _ = run.stop.send(());
        let _ = tokio::time::timeout(Duration::from_secs(5), run.listener_closed).await;
        let mut finishing = crate::lifecycle::lock(&self.finishing);
        // Those done already go: a page's stop and start, over and over, kept them all.
        finishing.retain(|t| !t.is_finished());
        finishing.push(run.task);
        true
    }

    /// Starts a stopped node on its port again.
    async fn start_node(&self, node: &DemoNode) -> Result<bool, String> {
        let mut running = node.running.lock().await;
        if running.is_some() {
            return Ok(false);
        }
        let listener = TcpListener::bind(node.addr)
            .await
            .map_err(|e| format!("cannot listen on {} again: {e}", node.addr))?;
        *running = Some(self.spawn_node(node.name, listener));
        Ok(true)
    }

    async fn stop_all(&self) {
        for n in &self.nodes {
            self.stop_node(n).await;
        }
        let tasks: Vec<_> = crate::lifecycle::lock(&self.finishing).drain(..).collect();
        for t in tasks {
            let _ = t.await;
        }
    }

    /// `GET /api/v1/nodes` of the admin API, by node name.
    async fn admin_nodes(&self) -> Result<Vec<Value>, String> {
        let url = format!("http://{}/api/v1/nodes", self.admin);
        let resp = self
            .client
            .get(&url)
            .send()
            .await
            .map_err(|e| format!("GET {url}: {e}"))?;
        let text = resp.text().await.map_err(|e| format!("GET {url}: {e}"))?;
        serde_json::from_str::<Vec<Value>>(&text).map_err(|e| format!("GET {url}: {e}"))
    }

    /// Sends `{"state": ...}` for `node` to the admin API; returns the call as an operator
    /// would write it.
    async fn admin_state(&self, node: &str, command: Value) -> Result<String, String> {
        let url = format!("http://{}/api/v1/nodes/{node}/state", self.admin);
        let text = command.to_string();
        let call = format!("curl -X POST -H 'Content-Type: application/json' -d '{text}' {url}");
        let resp = self
            .client
            .post(&url)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(text)
            .send()
            .await
            .map_err(|e| format!("{call}: {e}"))?;
        let status = resp.status();
        if status.is_success() {
            Ok(call)
        } else {
            let why = resp.text().await.unwrap_or_default();
            Err(format!("{call}: {status} {why}"))
        }
    }

    /// Whether a node other than `except` is running and ready, so the page can still reach
    /// this endpoint once `except` is stopped, drained or in maintenance.
    async fn another_node_serves(&self, except: &str) -> bool {
        let admin = self.admin_nodes().await.unwrap_or_default();
        for n in self.nodes.iter().filter(|n| n.name != except) {
            if n.running.lock().await.is_none() {
                continue;
            }
            let ready = admin
                .iter()
                .find(|v| v["name"] == n.name)
                .is_none_or(|v| v["admin"] == "ready");
            if ready {
                return true;
            }
        }
        false
    }

    async fn list(&self) -> (StatusCode, String) {
        let (admin, error) = match self.admin_nodes().await {
            Ok(v) => (v, None),
            Err(e) => (Vec::new(), Some(e)),
        };
        let mut nodes = Vec::new();
        for n in &self.nodes {
            let running = n.running.lock().await.is_some();
            let v = admin.iter().find(|v| v["name"] == n.name);
            let field = |k: &str| v.map_or(Value::Null, |v| v[k].clone());
            nodes.push(json!({
                "name": n.name,
                "address": n.addr.to_string(),
                "running": running,
                "state": field("state"),
                "admin": field("admin"),
                "healthy": field("healthy"),
                "active_connections": field("active_connections"),
                "tunnels": field("tunnels"),
                "drain": field("drain"),
            }));
        }
        (
            StatusCode::OK,
            body(json!({
                "stats_url": crate::admin::describe(self.admin),
                "drain_deadline_secs": PAGE_DRAIN_DEADLINE_SECS,
                "nodes": nodes,
                "error": error,
            })),
        )
    }

    async fn act(&self, node: &DemoNode, action: &str, query: &str) -> (StatusCode, String) {
        let name = node.name;
        let takes_out = matches!(action, "stop" | "drain" | "maint");
        let _one = match takes_out {
            true => Some(self.taking_out.lock().await),
            false => None,
        };
        if takes_out && !self.another_node_serves(name).await {
            return refused(
                StatusCode::CONFLICT,
                format!(
                    "{action} {name}: refused, it is the last node running and ready; this page needs one to reach the demo"
                ),
            );
        }
        match action {
            "stop" => {
                if self.stop_node(node).await {
                    done(
                        format!(
                            "node {name} stopped: its port refuses connections and its WebSockets were cut; limpet moves its sessions on their next request"
                        ),
                        None,
                    )
                } else {
                    done(format!("node {name} was already stopped"), None)
                }
            }
            "start" => match self.start_node(node).await {
                Ok(true) => done(
                    format!(
                        "node {name} started: limpet sends it new sessions once {CHECK_RISE} checks pass; sessions moved away stay where they are"
                    ),
                    None,
                ),
                Ok(false) => done(format!("node {name} was already running"), None),
                Err(e) => refused(StatusCode::INTERNAL_SERVER_ERROR, e),
            },
            "drain" => {
                let deadline = match query_secs(query, "deadline_secs") {
                    None => f64::from(PAGE_DRAIN_DEADLINE_SECS),
                    Some(Ok(s)) => s,
                    Some(Err(e)) => return refused(StatusCode::BAD_REQUEST, e),
                };
                let command =
                    json!({ "state": "drain", "deadline_secs": deadline, "spread_secs": 0 });
                match self.admin_state(name, command).await {
                    Ok(call) => done(
                        format!(
                            "node {name} draining: no new sessions; its sessions stay for {deadline} s, then move on their next request and its WebSockets close (1001)"
                        ),
                        Some(call),
                    ),
                    Err(e) => refused(StatusCode::BAD_GATEWAY, e),
                }
            }
            "maint" | "ready" => {
                let command = json!({ "state": action });
                let message = if action == "maint" {
                    format!(
                        "node {name} in maintenance: its sessions move on their next request and its WebSockets close (1001)"
                    )
                } else {
                    format!(
                        "node {name} ready: it takes new sessions again; sessions moved away stay where they are"
                    )
                };
                match self.admin_state(name, command).await {
                    Ok(call) => done(message, Some(call)),
                    Err(e) => refused(StatusCode::BAD_GATEWAY, e),
                }
            }
            other => refused(
                StatusCode::NOT_FOUND,
                format!("unknown action {other:?}: stop, start, drain, maint or ready"),
            ),
        }
    }

    async fn control_impl(
        &self,
        method: &Method,
        path: &str,
        query: &str,
        refusal: Option<&'static str>,
    ) -> (StatusCode, String) {
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        match parts.as_slice() {
            ["demo", "nodes"] if method == Method::GET => self.list().await,
            ["demo", "nodes", name, action] if method == Method::POST => {
                if let Some(why) = refusal {
                    return refused(StatusCode::FORBIDDEN, why);
                }
                match self.node(name) {
                    Some(node) => self.act(node, action, query).await,
                    None => refused(StatusCode::NOT_FOUND, format!("no demo node {name:?}")),
                }
            }
            ["demo", "nodes"] | ["demo", "nodes", _, _] => {
                refused(StatusCode::METHOD_NOT_ALLOWED, "method not allowed")
            }
            _ => refused(StatusCode::NOT_FOUND, format!("no demo endpoint {path}")),
        }
    }
}

impl DemoHooks for DemoNodes {
    fn page(&self, node: &str) -> String {
        page(node)
    }

    fn control<'a>(
        &'a self,
        method: &'a Method,
        path: &'a str,
        query: &'a str,
        refusal: Option<&'static str>,
    ) -> HookFuture<'a, (StatusCode, String)> {
        Box::pin(self.control_impl(method, path, query, refusal))
    }
}

fn print_welcome(demo: &Demo) {
    let addr = demo.addr();
    let admin = demo.admin_addr();
    let mut out = std::io::stdout().lock();
    let _ = write!(
        out,
        "listening on {addr}\n\
         \n\
         limpet is balancing three demo nodes ({names}) with cookie affinity.\n\
         \n\
         Try it with a cookie jar: the first answer pins you (Set-Cookie: route=...),\n\
         every later one comes from the same node:\n\
         \n\
         \x20 curl -si -c /tmp/limpet-demo.jar -b /tmp/limpet-demo.jar http://{addr}/\n\
         \n\
         Without the jar, each request is a fresh assignment and the nodes take turns:\n\
         \n\
         \x20 for i in 1 2 3; do curl -s http://{addr}/; echo; done\n\
         \n\
         In a browser, http://{addr}/index.html shows the node that served you, asks again\n\
         every second and keeps a WebSocket open; its buttons stop, start, drain and put\n\
         nodes in maintenance. Stop or drain your node and watch the session move, HTTP and\n\
         WebSocket alike.\n\
         \n\
         stats page: {stats} (limpet's admin listener, loopback only)\n\
         The same drain from a shell, through the admin API:\n\
         \n\
         \x20 curl -X POST -H 'Content-Type: application/json' -d '{{\"state\":\"drain\",\"deadline_secs\":5}}' http://{admin}/api/v1/nodes/alpha/state\n\
         \n\
         Ctrl-C stops everything.\n",
        names = NODES.join(", "),
        stats = demo.stats_url(),
    );
    let _ = out.flush();
}

/// The demo page served by node `node`.
fn page(node: &str) -> String {
    let json = serde_json::to_string(node).unwrap_or_else(|_| "\"\"".to_owned());
    PAGE.replace("__NODE_HTML__", &crate::backend::escape(node))
        .replace("__NODE_JSON__", &json)
}

/// The demo page. Self-contained (no external assets). The node's name is filled in twice:
/// escaped for HTML (`__NODE_HTML__`) and as a JSON string for the script (`__NODE_JSON__`).
const PAGE: &str = r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>limpet demo: __NODE_HTML__</title>
<style>
body{font:15px/1.45 system-ui,sans-serif;max-width:54em;margin:2em auto;padding:0 1em;color:#222}
h1{margin-bottom:.2em}h2{font-size:1.1em;margin-top:1.6em}
.node{font-weight:600;font-size:1.15em}
table{border-collapse:collapse;width:100%}th,td{text-align:left;padding:.35em .5em;border-bottom:1px solid #ddd}
tr.you td:first-child{font-weight:600}tr.you{background:#eef6ff}
.st{display:inline-block;min-width:4.5em;padding:0 .4em;border-radius:3px;font-size:.85em;font-weight:600;text-align:center}
.UP{background:#cdeccd}.DOWN{background:#f6c9c9}.DRAIN{background:#fbe3b6}.MAINT{background:#d8d8d8}
.stopped{color:#a00}button{margin:0 .25em .15em 0}
#log{font:13px ui-monospace,monospace;max-height:20em;overflow:auto}
#log .moved{color:#9a4a00;font-weight:600}#log .error{color:#a00}
</style></head><body>
<h1>limpet demo</h1>
<p>This page was served by node <span class="node" id="page-node">__NODE_HTML__</span>.
The <code>route</code> cookie pins your session to it: your requests and your WebSocket go to
that node until it stops, drains or goes into maintenance. Then limpet moves the session to
another node and re-pins the cookie, and both follow.</p>
<table id="session">
<tr><th>HTTP (a request every second)</th><td><span class="node" id="http-node">&hellip;</span></td><td id="http-note"></td></tr>
<tr><th>WebSocket (kept open)</th><td><span class="node" id="ws-node">connecting&hellip;</span></td><td id="ws-note"></td></tr>
</table>
<h2>Nodes</h2>
<table id="nodes"><thead><tr><th>node</th><th>process</th><th>limpet says</th><th>open</th><th>actions</th></tr></thead><tbody></tbody></table>
<p><small><b>Stop</b> / <b>Start</b>: the node's process stops listening (its WebSockets are
cut, as when a machine fails) and starts again. <b>Drain</b> (deadline <span id="deadline">5</span> s),
<b>Maint</b>, <b>Ready</b>: sent to limpet's admin API, as an operator would.</small></p>
<p id="stats"></p>
<h2>What happened</h2>
<ol id="log" reversed></ol>
<script>
"use strict";
const PAGE_NODE = __NODE_JSON__;
const $ = (id) => document.getElementById(id);
let httpNode = null, wsNode = null, ws = null, lastNodes = "", deadline = 5;
// One request at a time, as one user's clicks: when the session moves, the first request
// is re-pinned and every later one carries the new cookie (concurrent requests carrying the
// old pin could each be moved on their own).
let queue = Promise.resolve();
function serial(f) { queue = queue.then(f, f); return queue; }

function log(text, cls) {
  const li = document.createElement("li");
  li.textContent = new Date().toLocaleTimeString() + "  " + text;
  if (cls) li.className = cls;
  const l = $("log");
  l.insertBefore(li, l.firstChild);
  while (l.children.length > 100) l.removeChild(l.lastChild);
}

async function httpPoll() {
  try {
    const r = await fetch("/", {cache: "no-store"});
    const n = r.headers.get("X-Limpet-Node");
    if (!n) { $("http-note").textContent = "answer " + r.status + " names no node"; return; }
    if (httpNode !== null && n !== httpNode) log("HTTP: node " + n + " answers now (was " + httpNode + ")", "moved");
    httpNode = n;
    $("http-node").textContent = n;
    $("http-note").textContent = n === PAGE_NODE ? "the page's node" : "moved from " + PAGE_NODE;
  } catch (e) {
    $("http-note").textContent = "no answer: " + e;
  }
}

async function wsConnect() {
  // As an application would: one HTTP request first, so a moved session has its new pin
  // before the upgrade.
  await serial(httpPoll);
  const s = new WebSocket((location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/ws");
  ws = s;
  let first = true;
  s.onmessage = (e) => {
    if (!first) return;
    first = false;
    const n = String(e.data);
    if (wsNode !== null && n !== wsNode) log("WebSocket: reconnected to node " + n + " (was " + wsNode + ")", "moved");
    else log("WebSocket: open on node " + n);
    wsNode = n;
    $("ws-node").textContent = n;
    $("ws-note").textContent = n === httpNode ? "same node as HTTP" : "HTTP is on " + httpNode;
  };
  s.onclose = (e) => {
    if (ws !== s) return;
    log("WebSocket closed (" + e.code + (e.reason ? " " + e.reason : "") + "); reconnecting");
    $("ws-node").textContent = "reconnecting\u2026";
    $("ws-note").textContent = "";
    setTimeout(wsConnect, 1000);
  };
}

function button(node, action, label) {
  const b = document.createElement("button");
  b.textContent = label;
  b.dataset.node = node;
  b.dataset.action = action;
  b.onclick = () => serial(() => act(node, action));
  return b;
}

function cell(tr, content) {
  const td = document.createElement("td");
  if (typeof content === "string") td.textContent = content; else td.appendChild(content);
  tr.appendChild(td);
  return td;
}

function render(data) {
  const body = $("nodes").tBodies[0];
  body.replaceChildren();
  for (const n of data.nodes) {
    const tr = document.createElement("tr");
    tr.dataset.node = n.name;
    if (n.name === httpNode) tr.className = "you";
    cell(tr, n.name + (n.name === httpNode ? " (your session)" : ""));
    const p = cell(tr, n.running ? "running" : "stopped");
    if (!n.running) p.className = "stopped";
    const st = document.createElement("span");
    st.className = "st " + (n.state || "");
    st.textContent = n.state || "?";
    cell(tr, st);
    cell(tr, n.active_connections == null ? "" : n.active_connections + " (" + n.tunnels + " WebSocket)");
    const a = cell(tr, "");
    a.appendChild(n.running ? button(n.name, "stop", "Stop") : button(n.name, "start", "Start"));
    a.appendChild(button(n.name, "drain", "Drain"));
    a.appendChild(button(n.name, "maint", "Maint"));
    a.appendChild(button(n.name, "ready", "Ready"));
    body.appendChild(tr);
  }
  if (data.stats_url && !$("stats").firstChild) {
    const link = document.createElement("a");
    link.href = data.stats_url;
    link.textContent = data.stats_url;
    $("stats").append("limpet's stats page (admin listener, loopback only): ", link);
  }
}

async function refresh() {
  try {
    const r = await fetch("/demo/nodes", {cache: "no-store"});
    const data = await r.json();
    if (data.drain_deadline_secs != null) { deadline = data.drain_deadline_secs; $("deadline").textContent = deadline; }
    const key = JSON.stringify(data.nodes) + httpNode;
    if (key !== lastNodes) { lastNodes = key; render(data); }
  } catch (e) { /* the next refresh tries again */ }
}

async function act(node, action) {
  const q = action === "drain" ? "?deadline_secs=" + deadline : "";
  try {
    const r = await fetch("/demo/nodes/" + encodeURIComponent(node) + "/" + action + q,
      {method: "POST", headers: {"X-Limpet-Demo": "1"}});
    const j = await r.json();
    log(j.message || j.error || ("answer " + r.status), r.ok ? "" : "error");
    if (j.admin_api) log("  admin API: " + j.admin_api);
  } catch (e) {
    log(action + " " + node + ": " + e, "error");
  }
  await httpPoll();
  await refresh();
}

setInterval(() => serial(async () => { await httpPoll(); await refresh(); }), 1000);
setInterval(() => { if (ws && ws.readyState === 1) ws.send("keep-alive"); }, 20000);
serial(refresh);
wsConnect();
</script>
</body></html>
"#;
