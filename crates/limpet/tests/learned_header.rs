//! Learned header affinity (`learn_header`), end to end, with MCP-like nodes: the Model
//! Context Protocol over streamable HTTP answers a session's first request with an
//! `Mcp-Session-Id` header and expects every later request carrying it on the same node; a
//! node that does not know the id answers 404 (the client must start a new session).

mod common;

use std::collections::HashSet;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use common::multiport::{config, TempDir};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use limpet::runtime::{start, Running};
use limpet_core::table::AffinityStore;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

const SESSION: &str = "mcp-session-id";

/// One MCP-like node: issues session ids, serves the sessions it issued, 404 for others.
struct McpNode {
    task: JoinHandle<()>,
}

impl Drop for McpNode {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve_mcp(name: &'static str, listener: TcpListener) -> McpNode {
    let sessions: Arc<Mutex<HashSet<String>>> = Arc::default();
    let next = Arc::new(AtomicU64::new(1));
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let (sessions, next) = (Arc::clone(&sessions), Arc::clone(&next));
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let sessions = Arc::clone(&sessions);
                    let next = Arc::clone(&next);
                    async move {
                        let mut known = sessions.lock().unwrap_or_else(|e| e.into_inner());
                        let resp = match req.headers().get(SESSION).and_then(|v| v.to_str().ok()) {
                            None => {
                                // `initialize`: a new session on this node.
                                let id = format!("{name}-{}", next.fetch_add(1, Ordering::Relaxed));
                                known.insert(id.clone());
                                Response::builder()
                                    .header(SESSION, id)
                                    .body(Full::new(Bytes::from(name)))
                            }
                            Some(id) if known.contains(id) => {
                                Response::builder().body(Full::new(Bytes::from(name)))
                            }
                            Some(_) => Response::builder()
                                .status(StatusCode::NOT_FOUND)
                                .body(Full::new(Bytes::from(name))),
                        };
                        Ok::<_, Infallible>(resp.unwrap_or_else(|e| panic!("{e}")))
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    McpNode { task }
}

/// Three MCP nodes on 127.0.0.2, .3 and .4, one port for all (a listener's `node_port`).
async fn three_nodes() -> (Vec<McpNode>, u16) {
    'port: for _ in 0..20 {
        let a = TcpListener::bind("127.0.0.2:0").await.expect("bind .2");
        let port = a.local_addr().expect("addr").port();
        let mut more = Vec::new();
        for ip in ["127.0.0.3", "127.0.0.4"] {
            match TcpListener::bind((ip, port)).await {
                Ok(l) => more.push(l),
                Err(_) => continue 'port,
            }
        }
        let mut nodes = vec![serve_mcp("alpha", a).await];
        for (name, l) in ["beta", "gamma"].into_iter().zip(more) {
            nodes.push(serve_mcp(name, l).await);
        }
        return (nodes, port);
    }
    panic!("no port free on 127.0.0.2 to .4");
}

async fn limpet(port: u16) -> (Running, SocketAddr, TempDir) {
    let dir = TempDir::new("learned-header");
    let text = format!(
        r#"
[[nodes]]
name = "alpha"
address = "127.0.0.2"
[[nodes]]
name = "beta"
address = "127.0.0.3"
[[nodes]]
name = "gamma"
address = "127.0.0.4"
[[tables]]
name = "mcp"
learn_header = "Mcp-Session-Id"
[[listeners]]
name = "mcp"
bind = "127.0.0.1:0"
node_port = {port}
table = "mcp"
"#
    );
    let running = start(config(&dir, &text)).await.expect("start");
    let addr = running.addr("mcp").expect("listener");
    (running, addr, dir)
}

/// A client without cookies, as MCP clients are: only the session header carries affinity.
fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(IpAddr::from([127, 0, 0, 1]))
        .build()
        .expect("client")
}

/// `initialize`: the node that answers and the session id it issued.
async fn initialize(c: &reqwest::Client, addr: SocketAddr) -> (String, String) {
    let resp = c
        .post(format!("http://{addr}/mcp"))
        .send()
        .await
        .expect("initialize");
    assert_eq!(resp.status(), 200);
    let id = resp
        .headers()
        .get(SESSION)
        .and_then(|v| v.to_str().ok())
        .expect("the node issued a session id")
        .to_owned();
    (resp.text().await.expect("body"), id)
}

async fn call(c: &reqwest::Client, addr: SocketAddr, id: &str) -> (u16, String) {
    let resp = c
        .post(format!("http://{addr}/mcp"))
        .header(SESSION, id)
        .send()
        .await
        .expect("call");
    let status = resp.status().as_u16();
    (status, resp.text().await.expect("body"))
}

#[tokio::test]
async fn later_requests_carrying_the_learned_header_go_to_the_node_that_issued_it() {
    let (_nodes, port) = three_nodes().await;
    let (running, addr, _dir) = limpet(port).await;
    let c = client();
    // Six sessions: fresh assignments rotate, so every node issues sessions.
    let mut sessions = Vec::new();
    for _ in 0..6 {
        sessions.push(initialize(&c, addr).await);
    }
    let issuers: HashSet<&str> = sessions.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(issuers.len(), 3, "every node issued sessions: {sessions:?}");
    // Every later request of every session reaches its issuer (a wrong node would 404).
    for round in 0..5 {
        for (node, id) in &sessions {
            assert_eq!(
                call(&c, addr, id).await,
                (200, node.clone()),
                "session {id}, round {round}"
            );
        }
    }
    running.stop().await;
}

#[tokio::test]
async fn a_session_whose_node_is_gone_re_pins_once_and_stays() {
    let (_nodes, port) = three_nodes().await;
    let (running, addr, _dir) = limpet(port).await;
    let c = client();
    let (node, id) = initialize(&c, addr).await;
    assert_eq!(call(&c, addr, &id).await, (200, node.clone()));
    // The node goes to maintenance: the session's entry is re-pinned to one live node, and
    // stays there: its requests do not wander between the two live nodes (a fresh assignment
    // per request would alternate between them).
    let state = running.runtime().state();
    state.set_admin(&node, limpet_core::AdminState::Maint);
    let (status, moved_to) = call(&c, addr, &id).await;
    assert_eq!(status, 404, "the new node does not know the session");
    assert_ne!(moved_to, node);
    for _ in 0..4 {
        assert_eq!(call(&c, addr, &id).await, (404, moved_to.clone()));
    }
    // The client starts a new session; it is learned where it was issued and served there.
    let (again, new_id) = initialize(&c, addr).await;
    assert_ne!(again, node);
    for _ in 0..3 {
        assert_eq!(call(&c, addr, &new_id).await, (200, again.clone()));
    }
    drop(state);
    running.stop().await;
}

#[tokio::test]
async fn a_request_with_an_id_no_node_issued_is_assigned_but_not_learned() {
    let (_nodes, port) = three_nodes().await;
    let (running, addr, _dir) = limpet(port).await;
    let c = client();
    // A forged or long-expired id: the request is routed fresh and the node refuses it; the
    // table does not keep it (a client cannot fill the table with ids nobody issued).
    let (status, _) = call(&c, addr, "forged-1").await;
    assert_eq!(status, 404);
    let state = running.runtime().state();
    let table = state.table("mcp").expect("table");
    assert_eq!(
        table.lock().store().len(),
        0,
        "nothing learned from a refused id"
    );
    drop(state);
    running.stop().await;
}
