//! `http` checks of nodes reached over TLS, on real loopback sockets and real rustls:
//!
//! 1. On a listener with `upstream_tls`, `check = { kind = "http" }` runs over TLS with the
//!    listener's own upstream TLS settings (its CA, its `server_name`), so healthy TLS nodes
//!    stay UP and are served. Before, the check spoke plain HTTP to the TLS port: every check
//!    failed, every node went DOWN, every request was answered 503.
//! 2. A TLS node that completes the handshake and never answers HTTP goes DOWN by that
//!    check within `fall × interval + timeout`, and fresh GETs go to the other node (a `tls`
//!    check, the only one that worked on such nodes before, passes against it).
//! 3. Where a check runs over TLS when it does not say (`tls` unset): exactly at the node
//!    port of a listener with `upstream_tls`, as HAProxy's `server ... ssl check`; and what
//!    it runs with, the listing and the admin API's label included.
//!
//! Real time throughout: on paused time the clock jumps while TLS handshakes wait on the
//! sockets, and their timeouts fire.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::multiport::{connect_from, get_over, Pki, TempDir};
use common::ports::common_port_pair;
use common::PATIENCE;
use limpet::config::Config;
use limpet::health::{CheckKind, CheckStatus};
use limpet::runtime::{start, Running};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

/// Scheduling slack on a busy two-core machine (another build may be running).
const SLACK: Duration = Duration::from_millis(1500);

/// A node behind TLS on `listener`: every connection's handshake completes with `cfg`. A
/// node that `answers` answers each request `200 node NAME` (naming itself in
/// `x-limpet-node`) and closes; one that does not reads the request and never answers,
/// holding the connection until the other side closes it (a process hung past its TLS
/// layer). Stopped, its connections cut, when dropped.
struct TlsNode {
    /// Requests that arrived through TLS from limpet's checks (`User-Agent: limpet-check`).
    check_requests: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl TlsNode {
    fn serve(
        name: &'static str,
        listener: TcpListener,
        cfg: Arc<rustls::ServerConfig>,
        answers: bool,
    ) -> TlsNode {
        let check_requests = Arc::new(AtomicU64::new(0));
        let seen = Arc::clone(&check_requests);
        let acceptor = tokio_rustls::TlsAcceptor::from(cfg);
        let task = tokio::spawn(async move {
            let mut conns = JoinSet::new();
            while let Ok((s, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                let seen = Arc::clone(&seen);
                conns.spawn(async move {
                    let Ok(mut tls) = acceptor.accept(s).await else {
                        return;
                    };
                    let mut head = Vec::new();
                    let mut chunk = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match tls.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
                    if head.contains("\r\nuser-agent: limpet-check\r\n") {
                        seen.fetch_add(1, Ordering::SeqCst);
                    }
                    if answers {
                        let body = format!("node {name}");
                        let resp = format!(
                            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nx-limpet-node: {name}\r\n\
                             connection: close\r\n\r\n{body}",
                            body.len()
                        );
                        let _ = tls.write_all(resp.as_bytes()).await;
                        let _ = tls.shutdown().await;
                    } else {
                        // Held, unanswered, until the check gives up and closes.
                        while let Ok(n) = tls.read(&mut chunk).await {
                            if n == 0 {
                                break;
                            }
                        }
                    }
                });
            }
        });
        TlsNode {
            check_requests,
            task,
        }
    }
}

impl Drop for TlsNode {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `[[nodes]]` a (127.0.0.2) and b (127.0.0.3).
const NODES_AB: &str = "[[nodes]]\nname = \"a\"\naddress = \"127.0.0.2\"\n\n\
                        [[nodes]]\nname = \"b\"\naddress = \"127.0.0.3\"\n\n";

/// Validates `text` as `limpet.toml` in `dir`.
fn load(dir: &TempDir, text: &str) -> Config {
    let path = dir.write("limpet.toml", text);
    Config::from_text(&path, text).unwrap_or_else(|e| panic!("config: {e}\n{text}"))
}

/// The one check of `node` the admin API shows.
fn check_of(running: &Running, node: &str) -> CheckStatus {
    let checks = running.runtime().state().lifecycle.board().node(node);
    match <[CheckStatus; 1]>::try_from(checks) {
        Ok([c]) => c,
        Err(all) => panic!("node {node} has not one check: {all:?}"),
    }
}

/// Whether `node`'s health is UP now.
fn is_up(running: &Running, node: &str) -> bool {
    let state = running.runtime().state();
    let id = state
        .node_id(node)
        .unwrap_or_else(|| panic!("no node {node}"));
    state
        .node_rt(id)
        .unwrap_or_else(|| panic!("no runtime for {node}"))
        .status()
        .health
        .is_up()
}

/// Waits (at most [`PATIENCE`]) until each of `nodes` has had `n` checks, whatever their
/// results. The admin API's counts are the only sign of a check that changed nothing, so
/// they are read every 20 ms.
async fn checked_times(running: &Running, nodes: &[&str], n: u64) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let counts: Vec<u64> = nodes.iter().map(|m| check_of(running, m).checks).collect();
        if counts.iter().all(|&c| c >= n) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "not {n} checks of each of {nodes:?} in {PATIENCE:?}: {counts:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// GET / through `addr` on a fresh connection (no cookie): the status line and the node.
async fn fresh_get(addr: SocketAddr) -> (String, String) {
    let s = connect_from("127.0.0.1".parse().expect("ip"), addr).await;
    let (head, node) = get_over(s).await;
    (head.lines().next().unwrap_or("").to_owned(), node)
}

/// Two healthy TLS nodes behind a listener whose `upstream_tls` verifies them against a CA
/// for the name `nodes.test` (their certificate holds only that name, not their address),
/// checked with a bare `check = { kind = "http" }`: the check runs over TLS with that CA and
/// name, so both nodes pass every check and stay UP, and a GET is answered 200. The admin
/// API's label says the check runs over TLS, and to which name. Before, the check sent plain
/// HTTP to the TLS port: both nodes DOWN after `fall` checks, every GET 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_check_of_tls_nodes_runs_over_tls_and_keeps_healthy_nodes_up() {
    let pki = Pki::new();
    let node_tls = pki.server("nodes", &["nodes.test"]);
    let (la, lb, port) = common_port_pair().await;
    let a = TlsNode::serve("a", la, Arc::clone(&node_tls), true);
    let b = TlsNode::serve("b", lb, node_tls, true);
    let dir = TempDir::new("http-check-tls-up");
    const FALL: u64 = 2;
    let text = format!(
        "{NODES_AB}[health]\nfall = {FALL}\nrise = 1\ninterval = \"100ms\"\ntimeout = \"2s\"\n\n\
         [[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = {port}\n\
         check = {{ kind = \"http\" }}\n\n\
         [listeners.upstream_tls]\nca = \"{ca}\"\nserver_name = \"nodes.test\"\n",
        ca = pki.ca_pem.display()
    );
    let running = start(load(&dir, &text))
        .await
        .unwrap_or_else(|e| panic!("start: {e}"));
    // Twice as many checks as take a node DOWN when they fail.
    checked_times(&running, &["a", "b"], 2 * FALL).await;
    for node in ["a", "b"] {
        let c = check_of(&running, node);
        assert_eq!(
            (c.failures, c.transitions, c.last_error.as_deref()),
            (0, 0, None),
            "node {node}'s http check over TLS never failed: {c:?}"
        );
        assert_eq!(c.last.as_ref().and_then(|d| d.status), Some(200), "{c:?}");
        assert_eq!(c.kind, "http");
        assert!(
            c.check.ends_with("GET / over tls name nodes.test"),
            "the label says the check runs over TLS, and to which name: {c:?}"
        );
        assert!(is_up(&running, node), "node {node} is UP");
    }
    assert!(
        a.check_requests.load(Ordering::SeqCst) >= FALL
            && b.check_requests.load(Ordering::SeqCst) >= FALL,
        "the checks' requests reached both nodes through TLS"
    );
    let web = running.addr("web").unwrap_or_else(|| panic!("no web"));
    let (status, node) = fresh_get(web).await;
    assert_eq!(status, "HTTP/1.1 200 OK", "served by {node:?}");
    assert!(node == "a" || node == "b", "{node:?}");
    let _ = tokio::time::timeout(PATIENCE, running.stop()).await;
}

/// A TLS node that completes the handshake and never answers HTTP (node a) beside a healthy
/// one (b), checked with `check = { kind = "http" }` on a listener with `upstream_tls`: a's
/// check request goes through TLS and is never answered, so a goes DOWN by its check
/// timeouts within `fall × interval + timeout` (and jitter) of the start, b stays UP, and
/// fresh GETs are all answered by b. A `tls` check passes against a (the handshake
/// completes), which is why it could not catch it; before, the `http` check could not run
/// on TLS nodes at all: both DOWN, every GET 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_node_that_never_answers_http_goes_down_by_its_http_check() {
    const FALL: u32 = 3;
    const INTERVAL: Duration = Duration::from_millis(300);
    const TIMEOUT: Duration = Duration::from_millis(200);
    // The default jitter, a tenth of the interval, on each wait.
    const JITTER: Duration = Duration::from_millis(30);
    let (la, lb, port) = common_port_pair().await;
    let pki = Pki::new();
    let node_tls = pki.server("nodes", &["127.0.0.2", "127.0.0.3"]);
    let a = TlsNode::serve("a", la, Arc::clone(&node_tls), false);
    let _b = TlsNode::serve("b", lb, node_tls, true);

    // What a `tls` check sees of a: a handshake that completes.
    let handshake = limpet::health::probe(
        &CheckKind::Tls(limpet::health::TlsCheck {
            server_name: rustls_pki_types::ServerName::try_from("127.0.0.2")
                .unwrap_or_else(|e| panic!("{e}"))
                .to_owned(),
            config: pki.client(&[]),
            trust: String::new(),
        }),
        SocketAddr::from(([127, 0, 0, 2], port)),
        PATIENCE,
        None,
    )
    .await;
    assert!(handshake.ok, "a completes TLS handshakes: {handshake:?}");

    let dir = TempDir::new("http-check-tls-hung");
    let text = format!(
        "{NODES_AB}[health]\nfall = {FALL}\nrise = 2\ninterval = \"{}ms\"\ntimeout = \"{}ms\"\n\n\
         [[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = {port}\n\
         check = {{ kind = \"http\", path = \"/health\" }}\n\n\
         [listeners.upstream_tls]\nca = \"{ca}\"\n",
        INTERVAL.as_millis(),
        TIMEOUT.as_millis(),
        ca = pki.ca_pem.display()
    );
    let running = start(load(&dir, &text))
        .await
        .unwrap_or_else(|e| panic!("start: {e}"));
    let started = Instant::now();
    let state = running.runtime().state();
    let a_rt = state
        .node_id("a")
        .and_then(|id| state.node_rt(id))
        .map(Arc::clone)
        .unwrap_or_else(|| panic!("no node a"));
    let mut changes = a_rt.status_changes();
    tokio::time::timeout(PATIENCE, async {
        while a_rt.status().health.is_up() {
            if changes.changed().await.is_err() {
                panic!("node a's status watch ended");
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("a never went DOWN: {:?}", check_of(&running, "a")));
    let down_after = started.elapsed();
    let bound = INTERVAL * FALL + JITTER * FALL + TIMEOUT + SLACK;
    assert!(
        down_after <= bound,
        "DOWN after {down_after:?}, over fall × interval + timeout (+ jitter and slack) = \
         {bound:?}"
    );
    let c = check_of(&running, "a");
    assert!(
        c.last_error
            .as_deref()
            .is_some_and(|e| e.starts_with("timeout after 200 ms")),
        "a's check waited for an answer over TLS and timed out: {c:?}"
    );
    assert!(
        a.check_requests.load(Ordering::SeqCst) >= u64::from(FALL),
        "the check requests reached a through TLS"
    );

    let web = running.addr("web").unwrap_or_else(|| panic!("no web"));
    for i in 0..10 {
        let (status, node) = fresh_get(web).await;
        assert_eq!(
            (status.as_str(), node.as_str()),
            ("HTTP/1.1 200 OK", "b"),
            "fresh GET {i} after a went DOWN"
        );
    }
    let b = check_of(&running, "b");
    assert_eq!(
        (b.failures, b.transitions),
        (0, 0),
        "b's check over TLS passes: {b:?}"
    );
    assert!(is_up(&running, "b"));
    let _ = tokio::time::timeout(PATIENCE, running.stop()).await;
}

/// What each node's check of a listener runs over: `(node, label, over TLS, the listener's
/// own upstream client config)`.
fn http_checks(cfg: &Config, listener: usize) -> Vec<(String, String, bool, bool)> {
    let upstream = cfg.listeners[listener]
        .upstream_tls
        .as_ref()
        .map(|u| Arc::clone(&u.config));
    cfg.lifecycle
        .checks
        .iter()
        .map(|(node, spec)| {
            let CheckKind::Http(h) = &spec.kind else {
                panic!("not an http check: {spec:?}");
            };
            let same_config = match (&h.tls, &upstream) {
                (Some(t), Some(u)) => Arc::ptr_eq(&t.config, u),
                _ => false,
            };
            (node.clone(), spec.label(), h.tls.is_some(), same_config)
        })
        .collect()
}

/// Where an `http` check runs over TLS, and with what. Unset, `tls` is true exactly when
/// the listener reaches its nodes over TLS and the check goes to the node port (a node's
/// `check_port`, or the check's `port`, elsewhere makes it plain, as HAProxy's check `port`
/// does unless `check-ssl`); over TLS, the check runs with the listener's own upstream
/// client config (the same CA, verification and ALPN as the proxy's node connections) and
/// name (`server_name`, else the node's address). `tls = true` or `false` says otherwise;
/// `tls = true` without `upstream_tls` takes `verify = "none"`. `limpet check`'s listing
/// writes the setting out where it is a choice (set, or `upstream_tls` on the listener).
#[test]
fn an_http_check_runs_over_tls_at_the_node_port_of_a_listener_with_upstream_tls() {
    let pki = Pki::new();
    let ca = pki.ca_pem.display();
    let dir = TempDir::new("http-check-tls-config");
    // b is checked at a port of its own.
    let nodes = "[[nodes]]\nname = \"a\"\naddress = \"127.0.0.2\"\n\n\
                 [[nodes]]\nname = \"b\"\naddress = \"127.0.0.3\"\ncheck_port = 9000\n\n";
    let listener = |check: &str, upstream: &str| {
        format!(
            "{nodes}[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = 8443\n\
             check = {check}\n{upstream}"
        )
    };
    let named = format!("upstream_tls = {{ ca = \"{ca}\", server_name = \"nodes.test\" }}\n");
    let by_address = format!("upstream_tls = {{ ca = \"{ca}\" }}\n");
    let row = |node: &str, label: &str, tls: bool, same: bool| {
        (node.to_owned(), label.to_owned(), tls, same)
    };

    // The default: over TLS at the node port, plain at b's check_port.
    let cfg = load(&dir, &listener("{ kind = \"http\" }", &named));
    assert_eq!(
        http_checks(&cfg, 0),
        [
            row(
                "a",
                "http 127.0.0.2:8443 GET / over tls name nodes.test",
                true,
                true
            ),
            row("b", "http 127.0.0.3:9000 GET /", false, false),
        ]
    );
    assert!(
        cfg.listing.contains(
            "check = { kind = \"http\", path = \"/\", method = \"GET\", expect = \"200-399\" }  \
             # port: a node's check_port, else 8443; tls: over TLS at the node port, plain at another\n"
        ),
        "{}",
        cfg.listing
    );
    // Without `server_name`, each node's address is the name, as for its connections.
    let cfg = load(&dir, &listener("{ kind = \"http\" }", &by_address));
    assert_eq!(
        http_checks(&cfg, 0)[0],
        row(
            "a",
            "http 127.0.0.2:8443 GET / over tls name 127.0.0.2",
            true,
            true
        )
    );
    // The check's own port, equal to the node port: still TLS; another port: plain.
    let cfg = load(&dir, &listener("{ kind = \"http\", port = 8443 }", &named));
    assert!(http_checks(&cfg, 0)[0].2);
    let cfg = load(&dir, &listener("{ kind = \"http\", port = 8080 }", &named));
    assert_eq!(
        http_checks(&cfg, 0)[0],
        row("a", "http 127.0.0.2:8080 GET /", false, false)
    );
    assert!(
        cfg.listing.contains(
            "port = 8080, path = \"/\", method = \"GET\", expect = \"200-399\", tls = false }\n"
        ),
        "{}",
        cfg.listing
    );
    // Said: over TLS at any port (b's check_port too), or plain at the node port.
    let cfg = load(
        &dir,
        &listener("{ kind = \"http\", port = 8080, tls = true }", &named),
    );
    assert_eq!(
        http_checks(&cfg, 0),
        [
            row(
                "a",
                "http 127.0.0.2:8080 GET / over tls name nodes.test",
                true,
                true
            ),
            row(
                "b",
                "http 127.0.0.3:9000 GET / over tls name nodes.test",
                true,
                true
            ),
        ]
    );
    assert!(cfg.listing.contains("tls = true }\n"), "{}", cfg.listing);
    let cfg = load(&dir, &listener("{ kind = \"http\", tls = false }", &named));
    assert!(http_checks(&cfg, 0).iter().all(|(_, _, tls, _)| !tls));
    // No upstream_tls: plain, and the listing says nothing of TLS; over TLS only if asked,
    // and then only unverified.
    let cfg = load(&dir, &listener("{ kind = \"http\" }", ""));
    assert!(http_checks(&cfg, 0).iter().all(|(_, _, tls, _)| !tls));
    assert!(
        cfg.listing.contains(
            "check = { kind = \"http\", path = \"/\", method = \"GET\", expect = \"200-399\" }  \
             # port: a node's check_port, else 8443\n"
        ),
        "{}",
        cfg.listing
    );
    let cfg = load(
        &dir,
        &listener("{ kind = \"http\", tls = true, verify = \"none\" }", ""),
    );
    assert_eq!(
        http_checks(&cfg, 0)[0],
        row(
            "a",
            "http 127.0.0.2:8443 GET / over tls name 127.0.0.2",
            true,
            false
        )
    );
    assert!(
        cfg.listing.contains("tls = true, verify = \"none\" }"),
        "{}",
        cfg.listing
    );
    // Every listing is a config that reads back the same.
    let again = load(&dir, &cfg.listing);
    assert_eq!(again.listing, cfg.listing);
}
