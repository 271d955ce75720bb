//! Running out of file descriptors (issue 13, finding 2; failure-model.md: "logged once per
//! interval; never flips node health; recovers by itself"), at each place limpet opens a
//! socket:
//! - connecting to a node: requests fail while limpet cannot open a socket to the node, but
//!   the node is not held responsible and the next request after is served at once;
//! - accepting a client: the client waits in the listen backlog, limpet retries on a backoff
//!   (it does not spin), clients already connected keep being served, and the waiting client
//!   is served once descriptors are free;
//! - active health checks: a check that cannot open its socket is skipped, so the node stays
//!   UP however many intervals it lasts.
//!
//! Each place is counted in `limpet_out_of_fds_total{at}`, which these tests read in-process
//! ([`LOCAL_FDS`]) while the admin API cannot accept, and through `/metrics` after.
//!
//! A test binary of its own: a test lowers this process's descriptor limit (with `prlimit`,
//! on its own PID) and fills it, which would disturb any other test sharing the process. The
//! tests here take turns ([`alone`]) for the same reason.

mod common;
/// The real runtime with its admin listener (the helpers of the admin tests).
#[path = "admin_common/lifecycle.rs"]
#[allow(dead_code, unreachable_pub)]
mod lifecycle;

use std::time::Duration;

use bytes::Bytes;
use common::{config, nodes, Proxy, PATIENCE};
use http_body_util::{BodyExt, Empty};
use limpet::net::{FdsAt, LOCAL_FDS};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// Only one test at a time runs with the descriptors exhausted.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs `test` alone, on a runtime of its own built once it has its turn: building a runtime
/// opens descriptors (epoll, eventfd), which fails while another test has them exhausted.
fn alone(test: impl std::future::Future<Output = ()>) {
    let _turn = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("runtime: {e}"))
        .block_on(test);
}

/// This process out of file descriptors until dropped: its soft limit lowered to 512 and
/// filled with `/dev/null` handles; on drop they are closed and the soft limit put back.
struct Exhausted {
    hogs: Vec<std::fs::File>,
    /// The soft and hard limits before (`prlimit` text, e.g. `1048576`).
    soft: String,
    hard: String,
}

fn prlimit(nofile: &str) {
    let pid = std::process::id().to_string();
    let set = std::process::Command::new("prlimit")
        .args(["--pid", &pid, &format!("--nofile={nofile}")])
        .status()
        .unwrap_or_else(|e| panic!("prlimit: {e}"));
    assert!(set.success(), "prlimit --nofile={nofile}");
}

fn exhaust() -> Exhausted {
    let pid = std::process::id().to_string();
    let now = std::process::Command::new("prlimit")
        .args(["--pid", &pid, "--nofile", "--raw", "--noheadings"])
        .args(["--output", "SOFT,HARD"])
        .output()
        .unwrap_or_else(|e| panic!("prlimit: {e}"));
    let now = String::from_utf8_lossy(&now.stdout).into_owned();
    let mut limits = now.split_whitespace().map(str::to_owned);
    let (Some(soft), Some(hard)) = (limits.next(), limits.next()) else {
        panic!("prlimit printed {now:?}");
    };
    // Only the soft limit: an unprivileged process cannot raise its hard limit again.
    prlimit(&format!("512:{hard}"));
    let mut hogs = Vec::new();
    for _ in 0..1024 {
        match std::fs::File::open("/dev/null") {
            Ok(f) => hogs.push(f),
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(24), "{e}");
                break;
            }
        }
    }
    assert!(std::fs::File::open("/dev/null").is_err(), "limit reached");
    Exhausted { hogs, soft, hard }
}

impl Drop for Exhausted {
    fn drop(&mut self) {
        // Descriptors first: running prlimit needs some.
        self.hogs.clear();
        prlimit(&format!("{}:{}", self.soft, self.hard));
    }
}

/// Waits (within [`PATIENCE`]) until limpet ran out at `at` `n` more times than `from`. The
/// count is a plain counter with nothing to await, so it is polled.
async fn noted(at: FdsAt, from: u64, n: u64) -> u64 {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let c = LOCAL_FDS.count(at);
        if c >= from + n {
            return c;
        }
        assert!(
            Instant::now() < deadline,
            "{} noted {} times, not {n}",
            at.as_str(),
            c - from
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Connects `socket` (made while descriptors were plenty; connecting needs none, the kernel
/// completes the handshake into limpet's backlog) to `addr` and sends a closing GET /.
async fn arrive(socket: tokio::net::TcpSocket, addr: std::net::SocketAddr) -> TcpStream {
    let mut s = socket
        .connect(addr)
        .await
        .unwrap_or_else(|e| panic!("connect into the backlog: {e}"));
    s.write_all(b"GET / HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n")
        .await
        .unwrap_or_else(|e| panic!("write: {e}"));
    s
}

/// A kept-alive HTTP/1.1 connection to `addr`, opened while descriptors are plenty.
async fn keep_alive(
    addr: std::net::SocketAddr,
) -> hyper::client::conn::http1::SendRequest<Empty<Bytes>> {
    let stream = TcpStream::connect(addr)
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"));
    let (sender, conn) = hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap_or_else(|e| panic!("handshake: {e}"));
    tokio::spawn(conn);
    sender
}

/// More failed connects than the fall count, all for want of a descriptor: the session's
/// node stays UP, so once descriptors are free the same cookie is served by it with no
/// `Set-Cookie`. Had the failures taken it DOWN, the request would be re-pinned to the other
/// node (its trial comes only after `fail_timeout`); with one node only, the "no node left"
/// trial would serve it either way, so the test has two.
#[test]
fn out_of_file_descriptors_never_takes_a_node_down() {
    alone(async {
        let ns = nodes(&["a", "b"]).await;
        let mut cfg = config(&ns);
        // Every request opens a fresh node connection (nothing pooled to hide the failure).
        cfg.limits.max_idle_per_node = 0;
        let proxy = Proxy::start(cfg).await;
        let mut sender = keep_alive(proxy.addr).await;
        let (status, pin) = exchange(&mut sender, None).await;
        assert_eq!(status, 200);
        let pin = pin.unwrap_or_else(|| panic!("a fresh session is pinned"));
        let cookie = pin.split(';').next().unwrap_or_default().to_owned();

        let connects = LOCAL_FDS.count(FdsAt::Connect);
        let hogs = exhaust();
        // More failures than the fall count (3): none is the node's.
        for _ in 0..5 {
            assert_eq!(
                get_pinned(&mut sender, &cookie).await,
                (503, None),
                "no socket to the node, and the session is not moved"
            );
        }
        assert!(
            LOCAL_FDS.count(FdsAt::Connect) >= connects + 5,
            "each failed connect counted"
        );
        drop(hogs);
        assert_eq!(
            get_pinned(&mut sender, &cookie).await,
            (200, None),
            "recovers by itself; the session's node ({cookie}) is still UP and serves it"
        );
        proxy.stop().await;
    });
}

#[test]
fn a_client_arriving_while_out_of_file_descriptors_waits_in_the_backlog_and_is_served() {
    alone(async {
        let ns = nodes(&["a"]).await;
        let proxy = Proxy::start(config(&ns)).await;
        // A client already in, whose node connection is now pooled.
        let mut sender = keep_alive(proxy.addr).await;
        assert_eq!(get(&mut sender).await, 200);
        // The arriving client's socket is made while descriptors are plenty; connecting it needs
        // none (the kernel completes the handshake into limpet's backlog).
        let arriving = tokio::net::TcpSocket::new_v4().unwrap_or_else(|e| panic!("socket: {e}"));

        let accepts = LOCAL_FDS.count(FdsAt::Accept);
        let hogs = exhaust();
        let started = Instant::now();
        let mut arriving = arrive(arriving, proxy.addr).await;
        noted(FdsAt::Accept, accepts, 3).await;
        assert_eq!(
            get(&mut sender).await,
            200,
            "a client already connected is served while accepts fail"
        );
        // A backoff between tries, not a spin: one try, then at most one per 50 ms.
        let tries = LOCAL_FDS.count(FdsAt::Accept) - accepts;
        let bound = u64::try_from(started.elapsed().as_millis() / 50).unwrap_or(u64::MAX) + 2;
        assert!(tries <= bound, "{tries} accept tries, at most {bound}");

        drop(hogs);
        let mut answer = Vec::new();
        tokio::time::timeout(PATIENCE, arriving.read_to_end(&mut answer))
            .await
            .unwrap_or_else(|_| panic!("the waiting client is served once descriptors are free"))
            .unwrap_or_else(|e| panic!("read: {e}"));
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        proxy.stop().await;
    });
}

#[test]
fn active_checks_while_out_of_file_descriptors_never_take_a_node_down() {
    use lifecycle::{backend_nodes, metrics_text, node_view, nodes_toml, ConfigFile, Limpet};
    const FALL: u64 = 2;
    alone(async {
        let nodes = [("a", "127.0.0.2")];
        let (_nodes, port) = backend_nodes(&nodes).await;
        let cfg = ConfigFile::new(
            "fds-checks",
            &format!(
                "{}[health]\nfall = {FALL}\nrise = 2\ninterval = \"100ms\"\ntimeout = \"1s\"\n\n\
             [[listeners]]\nname = \"l\"\nbind = \"127.0.0.1:0\"\nnode_port = {port}\n\
             check = {{ kind = \"tcp\" }}\n\n\
             [admin]\nlisten = \"127.0.0.1:0\"\n",
                nodes_toml(&nodes)
            ),
        );
        let l = Limpet::start(&cfg).await;
        let state_of_a = || {
            l.running
                .as_ref()
                .map(|r| r.runtime().state())
                .and_then(|s| s.node_views().into_iter().find(|v| v.name == "a"))
                .map_or("?", |v| v.state.as_str())
        };

        let checks = LOCAL_FDS.count(FdsAt::Check);
        let hogs = exhaust();
        // Twice `fall` checks that could not open their socket.
        noted(FdsAt::Check, checks, 2 * FALL).await;
        assert_eq!(state_of_a(), "UP", "while out of descriptors");
        drop(hogs);

        let view = node_view(&l, "a").await;
        assert_eq!(view["state"], "UP", "{view}");
        assert_eq!(
            view["checks"][0]["failures"], 0,
            "a skipped check is no failed check: {view}"
        );
        let text = metrics_text(&l).await;
        assert!(
            text.contains(r#"limpet_health_transitions_total{node="a",to="down"} 0"#),
            "{text}"
        );
        let counted = text
            .lines()
            .find_map(|line| line.strip_prefix(r#"limpet_out_of_fds_total{at="check"} "#))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no check count in /metrics:\n{text}"));
        assert!(counted >= checks + 2 * FALL, "{counted} in /metrics");
        l.stop().await;
    });
}

async fn get(sender: &mut hyper::client::conn::http1::SendRequest<Empty<Bytes>>) -> u16 {
    exchange(sender, None).await.0
}

/// Out of descriptors, a session pinned to b stays pinned to b and b is charged nothing:
/// limpet's own shortage says nothing about b. The request gets 503 with no node tried in
/// b's place and no `Set-Cookie` moving the session, and b's error count stays 0. Once
/// descriptors are free, the same cookie is served by b.
#[test]
fn out_of_file_descriptors_moves_no_session_and_charges_no_node() {
    use lifecycle::{backend_nodes, nodes_toml, ConfigFile, Limpet};
    alone(async {
        let nodes = [("a", "127.0.0.2"), ("b", "127.0.0.3")];
        let (_nodes, port) = backend_nodes(&nodes).await;
        let cfg = ConfigFile::new(
            "fds-pins",
            &format!(
                "{}[[listeners]]\nname = \"l\"\nbind = \"127.0.0.1:0\"\nnode_port = {port}\n\n\
                 [admin]\nlisten = \"127.0.0.1:0\"\n",
                nodes_toml(&nodes)
            ),
        );
        let l = Limpet::start(&cfg).await;
        // Opened (and accepted: one request to a) while descriptors are plenty; nothing has
        // gone to b yet, so b has no kept connection and the request below must open one.
        let mut sender = keep_alive(l.addr("l")).await;
        assert_eq!(get_pinned(&mut sender, "route=a").await, (200, None));
        let hogs = exhaust();
        let (status, set_cookie) = get_pinned(&mut sender, "route=b").await;
        drop(hogs);
        assert_eq!(status, 503, "no socket to b");
        assert_eq!(set_cookie, None, "the session is not moved off b");
        let errors_of = |node: &str| {
            l.running
                .as_ref()
                .map(|r| r.runtime().state())
                .map_or(u64::MAX, |s| {
                    s.lifecycle
                        .metrics
                        .traffic(node, limpet::clock::now_ms())
                        .errors
                })
        };
        assert_eq!((errors_of("a"), errors_of("b")), (0, 0), "no node charged");
        assert_eq!(
            get_pinned(&mut sender, "route=b").await,
            (200, None),
            "b serves the session once descriptors are free"
        );
        l.stop().await;
    });
}

/// GET / with `cookie` on `sender`: the status and the affinity cookie the answer sets.
async fn get_pinned(
    sender: &mut hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
    cookie: &str,
) -> (u16, Option<String>) {
    exchange(sender, Some(cookie)).await
}

/// GET / on `sender`, with `cookie` if given: the status and the affinity cookie the answer
/// sets.
async fn exchange(
    sender: &mut hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
    cookie: Option<&str>,
) -> (u16, Option<String>) {
    let mut req = http::Request::get("/").header("host", "t");
    if let Some(c) = cookie {
        req = req.header("cookie", c);
    }
    let req = req
        .body(Empty::new())
        .unwrap_or_else(|e| panic!("request: {e}"));
    let resp = tokio::time::timeout(PATIENCE, sender.send_request(req))
        .await
        .unwrap_or_else(|_| panic!("answered in time"))
        .unwrap_or_else(|e| panic!("answer: {e}"));
    let status = resp.status().as_u16();
    let set = resp
        .headers()
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .filter(|v| v.starts_with("route="))
        .map(str::to_owned);
    let _ = resp.into_body().collect().await;
    (status, set)
}

/// Out of descriptors, the kept-alive node connections idle for over a second (what a
/// burst left behind) are dropped at once, not at their expiry (`upstream_idle`, set to 60 s
/// here so that the pool's own sweep cannot be what drops them): a
/// client arriving then is accepted and served on the descriptors they held, while the
/// shortage lasts. Kept, they would starve every new client until they expired.
#[test]
fn out_of_file_descriptors_the_idle_node_connections_go_and_a_new_client_is_served() {
    alone(async {
        let ns = nodes(&["a"]).await;
        let mut cfg = config(&ns);
        cfg.timeouts.upstream_idle = Duration::from_secs(60);
        let proxy = Proxy::start(cfg).await;
        // Six node connections at once (six slow requests on six client connections), idle
        // in the pool once answered; the client connections close.
        let mut slow = Vec::new();
        for _ in 0..6 {
            let addr = proxy.addr;
            slow.push(tokio::spawn(async move {
                let mut s = TcpStream::connect(addr)
                    .await
                    .unwrap_or_else(|e| panic!("connect: {e}"));
                s.write_all(b"GET /slow?ms=300 HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n")
                    .await
                    .unwrap_or_else(|e| panic!("write: {e}"));
                let mut answer = Vec::new();
                let _ = tokio::time::timeout(PATIENCE, s.read_to_end(&mut answer)).await;
                String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 200")
            }));
        }
        for r in slow {
            assert!(r.await.unwrap_or(false), "a slow request answered");
        }
        // The condition itself, not a synchronisation: idle for over the second after which
        // a shortage drops them.
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        let arriving = tokio::net::TcpSocket::new_v4().unwrap_or_else(|e| panic!("socket: {e}"));

        let accepts = LOCAL_FDS.count(FdsAt::Accept);
        let hogs = exhaust();
        let mut arriving = arrive(arriving, proxy.addr).await;
        let mut answer = Vec::new();
        let served = tokio::time::timeout(PATIENCE, arriving.read_to_end(&mut answer)).await;
        // Still held: whatever served the client came from what limpet let go of.
        drop(hogs);
        assert!(
            LOCAL_FDS.count(FdsAt::Accept) > accepts,
            "the accept ran out of descriptors first"
        );
        assert!(
            served.is_ok() && String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 200"),
            "the arriving client is served on the idle connections' descriptors: {:?}",
            String::from_utf8_lossy(&answer)
        );
        proxy.stop().await;
    });
}
