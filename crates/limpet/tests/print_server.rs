//! The print-server scenario of `multi-port-affinity.md`, end to end on loopback: two nodes
//! (LVIV on 127.0.0.2, KYIV on 127.0.0.3), each with an HTTP, an HTTPS and a raw TCP
//! service; limpet with an HTTP listener, an HTTPS listener (TLS both sides, `verify = "none"`
//! to the nodes, as the reference's `ssl verify none`) and a TCP listener, all naming ONE
//! source-IP table.

mod common;

use std::time::Duration;

use common::multiport::*;
use common::PATIENCE;
use limpet::runtime::run::start_with;
use limpet::runtime::{start, Running};
use limpet_core::table::AffinityStore;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Scenario {
    running: Running,
    nodes: Vec<TestNode>,
    pki: Pki,
    _dir: TempDir,
}

impl Scenario {
    async fn start() -> Scenario {
        Scenario::start_with(1).await
    }

    /// The scenario served by `workers` threads (`--threads`), each on its own sockets.
    async fn start_with(workers: usize) -> Scenario {
        Scenario::build(workers, "").await
    }

    /// The scenario with `http_extra` (lines of settings) added to the plain HTTP listener.
    async fn build(workers: usize, http_extra: &str) -> Scenario {
        let pki = Pki::new();
        let node_tls = pki.server("node", &["127.0.0.2", "127.0.0.3"]);
        let (nodes, ports) =
            start_nodes(&[("LVIV", "127.0.0.2"), ("KYIV", "127.0.0.3")], node_tls).await;
        let (cert, key) = pki.issue("limpet", &["print.example"]);
        let dir = TempDir::new("print-server");
        let text = format!(
            r#"
[[nodes]]
name = "LVIV"
address = "127.0.0.2"

[[nodes]]
name = "KYIV"
address = "127.0.0.3"

[[tables]]
name = "terminal"
key = "source-ip"
expire = "30m"
size = 100000

[[listeners]]
name = "terminal-http"
bind = "127.0.0.1:0"
mode = "http"
node_port = {http}
balance = "leastconn"
table = "terminal"
{http_extra}

[[listeners]]
name = "terminal-https"
bind = ["127.0.0.1:0"]
mode = "http"
node_port = {https}
balance = "leastconn"
table = "terminal"
tls = {{ cert = "{cert}", key = "{key}" }}
upstream_tls = {{ verify = "none" }}

[[listeners]]
name = "terminal-raw"
bind = "127.0.0.1:0"
mode = "tcp"
node_port = {tcp}
balance = "leastconn"
table = "terminal"
"#,
            http = ports.http,
            http_extra = http_extra,
            https = ports.https,
            tcp = ports.tcp,
            cert = cert.display(),
            key = key.display(),
        );
        let cfg = config(&dir, &text);
        let running = start_with(cfg, workers).await.expect("start");
        Scenario {
            running,
            nodes,
            pki,
            _dir: dir,
        }
    }

    fn addr(&self, listener: &str) -> std::net::SocketAddr {
        self.running.addr(listener).expect("listener bound")
    }

    async fn all_three(&self, src: &str) -> [String; 3] {
        let client = self.pki.client(&[b"http/1.1"]);
        let h = http_node(src, self.addr("terminal-http")).await;
        let s = https_node(src, self.addr("terminal-https"), &client).await;
        let (_sess, t) = tcp_session(src, self.addr("terminal-raw")).await;
        [h, s, t]
    }

    async fn stop(mut self) {
        self.running.stop().await;
        for n in &mut self.nodes {
            n.kill().await;
        }
    }
}

/// Reads until the session ends (EOF or error); panics if it is still open after `within`.
async fn closed_within(s: &mut tokio::net::TcpStream, within: Duration) {
    let mut buf = [0u8; 256];
    let r = tokio::time::timeout(within, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => continue,
            }
        }
    })
    .await;
    assert!(r.is_ok(), "session still open after {within:?}");
}

/// Thread per core: two worker threads, each with its own socket of every listener. Both
/// serve (each worker's listener instance numbers its requests with its own id prefix, which
/// the node echoes), and still one client lands on one node on every port, whichever thread
/// each of its connections reached: the table is shared. Stopping drains both threads.
#[tokio::test]
async fn on_two_worker_threads_both_serve_and_one_client_keeps_one_node_everywhere() {
    let sc = Scenario::start_with(2).await;
    let http = sc.addr("terminal-http");
    // Distinct source ports spread over the two sockets (the kernel hashes the 4-tuple);
    // 40 connections all landing on one socket would take odds of 2^-39.
    let mut prefixes = std::collections::BTreeSet::new();
    let mut nodes = std::collections::BTreeSet::new();
    for _ in 0..40 {
        let s = connect_from("127.0.0.21".parse().expect("ip"), http).await;
        let (head, node) = get_over(s).await;
        let id = head
            .to_ascii_lowercase()
            .lines()
            .find_map(|l| l.strip_prefix("x-seen-request-id: ").map(str::to_owned))
            .expect("the node saw a request id");
        assert_eq!(id.len(), 16, "request id {id:?}");
        prefixes.insert(id[..8].to_owned());
        nodes.insert(node);
    }
    assert_eq!(
        prefixes.len(),
        2,
        "both worker threads served: {prefixes:?}"
    );
    assert_eq!(nodes.len(), 1, "one client, one node: {nodes:?}");
    let node = nodes.into_iter().next().expect("a node");
    for _ in 0..5 {
        assert_eq!(
            sc.all_three("127.0.0.21").await,
            [node.clone(), node.clone(), node.clone()]
        );
    }
    // Another client may land elsewhere, but again on one node everywhere.
    let other = sc.all_three("127.0.0.22").await;
    assert!(other.iter().all(|n| *n == other[0]), "{other:?}");
    tokio::time::timeout(PATIENCE, sc.stop())
        .await
        .expect("both worker threads drain and stop");
}

#[tokio::test]
async fn one_client_lands_on_one_node_on_every_port_and_clients_spread() {
    let sc = Scenario::start().await;
    // First contact through the TCP port, then HTTP and HTTPS: all the same node.
    let (_s, first) = tcp_session("127.0.0.10", sc.addr("terminal-raw")).await;
    let got = sc.all_three("127.0.0.10").await;
    assert_eq!(
        got,
        [first.clone(), first.clone(), first.clone()],
        "one client, one node on every port"
    );
    // And the other way round: first contact through HTTPS.
    let client = sc.pki.client(&[b"http/1.1"]);
    let first = https_node("127.0.0.20", sc.addr("terminal-https"), &client).await;
    assert_eq!(
        sc.all_three("127.0.0.20").await,
        [first.clone(), first.clone(), first]
    );

    // Other clients spread over both nodes, each one consistent across ports.
    let mut seen = std::collections::BTreeSet::new();
    for i in 30..38 {
        let src = format!("127.0.0.{i}");
        let got = sc.all_three(&src).await;
        assert!(got.iter().all(|n| n == &got[0]), "{src}: {got:?}");
        seen.insert(got[0].clone());
    }
    assert_eq!(seen.len(), 2, "clients spread over both nodes: {seen:?}");
    let views = sc.running.runtime().state().node_views();
    let pins: u64 = views.iter().filter_map(|v| v.pins.get("terminal")).sum();
    assert_eq!(
        pins, 10,
        "one pin per client address in the shared table: {views:?}"
    );
    sc.stop().await;
}

#[tokio::test]
async fn killing_the_node_moves_the_client_on_every_port_together() {
    let mut sc = Scenario::start().await;
    let src = "127.0.0.40";
    let (mut session, home) = tcp_session(src, sc.addr("terminal-raw")).await;
    assert_eq!(
        sc.all_three(src).await,
        [home.clone(), home.clone(), home.clone()]
    );
    let (idx, other) = if home == "LVIV" {
        (0, "KYIV")
    } else {
        (1, "LVIV")
    };
    sc.nodes[idx].kill().await;
    // Its open TCP session is closed, not left hanging.
    closed_within(&mut session, Duration::from_secs(5)).await;
    // The first connection after the crash fails over and re-pins; every port follows.
    let h = http_node(src, sc.addr("terminal-http")).await;
    assert_eq!(h, other, "HTTP fails over to the live node");
    assert_eq!(
        sc.all_three(src).await,
        [other.to_owned(), other.to_owned(), other.to_owned()]
    );
    sc.stop().await;
}

/// A node that stays UP but fails one of a session's requests (a GET that outlasts
/// `upstream_answer`, replayed on the other node) loses the whole session: the re-pin ends
/// the session's TCP session on the old node, as DOWN would, and every port then reaches the
/// new node. Left open, the session would live on two nodes.
#[tokio::test]
async fn a_request_failed_over_from_an_up_node_moves_the_session_on_every_port() {
    let sc = Scenario::build(1, "timeouts = { upstream_answer = \"300ms\" }").await;
    let src = "127.0.0.45";
    let (mut session, home) = tcp_session(src, sc.addr("terminal-raw")).await;
    let other = if home == "LVIV" { "KYIV" } else { "LVIV" };
    assert_eq!(http_node(src, sc.addr("terminal-http")).await, home);
    // A slow page: the node is UP, its checks would pass, this one answer is late.
    let s = connect_from(src.parse().expect("ip"), sc.addr("terminal-http")).await;
    let req = format!(
        "GET /slow?ms=2000&on={home} HTTP/1.1\r\nHost: print.example\r\nConnection: close\r\n\r\n"
    );
    let (_, answered_by) = get_raw(s, &req).await;
    assert_eq!(
        answered_by, other,
        "the late GET is answered by the other node"
    );
    closed_within(&mut session, Duration::from_secs(2)).await;
    let state = sc.running.runtime().state();
    let up = state
        .node_views()
        .into_iter()
        .find(|v| v.name == home)
        .map(|v| v.state.as_str());
    assert_eq!(
        up,
        Some("UP"),
        "one late answer does not take the node DOWN"
    );
    drop(state);
    assert_eq!(
        sc.all_three(src).await,
        [other.to_owned(), other.to_owned(), other.to_owned()]
    );
    sc.stop().await;
}

/// An upgrade whose node takes its time to answer 101 while another request of the session
/// fails on that node and moves the session (the print-server's status WebSocket opening as
/// a page fails): the upgrade watched for moves from before it was sent, so its tunnel ends
/// as it starts instead of living on the old node, and the session is whole on the other
/// node.
#[tokio::test]
async fn a_session_moved_while_its_upgrade_waits_for_the_101_gets_no_tunnel_on_the_old_node() {
    let sc = Scenario::start().await;
    let src = "127.0.0.46";
    let http = sc.addr("terminal-http");
    let home = http_node(src, http).await;
    let other = if home == "LVIV" { "KYIV" } else { "LVIV" };
    let mut ws = connect_from(src.parse().expect("ip"), http).await;
    ws.write_all(HELD_UPGRADE_REQUEST)
        .await
        .expect("send upgrade");
    // The upgrade reached its node (the session's), which holds the 101.
    tokio::time::timeout(PATIENCE, HELD_UPGRADES_ARRIVED.acquire())
        .await
        .expect("upgrade reached the node in time")
        .expect("semaphore open")
        .forget();
    let s = connect_from(src.parse().expect("ip"), http).await;
    let req =
        format!("GET /drop?on={home} HTTP/1.1\r\nHost: print.example\r\nConnection: close\r\n\r\n");
    let (_, answered_by) = get_raw(s, &req).await;
    assert_eq!(answered_by, other, "the lost GET moved the session");
    HELD_UPGRADES_RELEASED.add_permits(1);
    let mut got = Vec::new();
    let ended = tokio::time::timeout(Duration::from_secs(5), ws.read_to_end(&mut got)).await;
    let text = String::from_utf8_lossy(&got);
    assert!(
        ended.is_ok(),
        "the tunnel to the old node stayed open; got so far: {text:?}"
    );
    assert!(
        text.is_empty() || text.starts_with("HTTP/1.1 101"),
        "the 101 at most, then the end: {text:?}"
    );
    assert_eq!(
        sc.all_three(src).await,
        [other.to_owned(), other.to_owned(), other.to_owned()]
    );
    sc.stop().await;
}

#[tokio::test]
async fn a_node_marked_down_closes_its_tcp_sessions_at_once() {
    let sc = Scenario::start().await;
    let src = "127.0.0.50";
    let (mut session, home) = tcp_session(src, sc.addr("terminal-raw")).await;
    let other = if home == "LVIV" { "KYIV" } else { "LVIV" };
    let state = sc.running.runtime().state();
    // Passive failures (or a health checker) cross `fall` (3): the node goes DOWN while its
    // service is still up, so only limpet can close the session.
    assert_eq!(
        state.observe_named(
            &home,
            limpet_core::Observation::CheckFailed(limpet_core::CheckSlot::FIRST)
        ),
        None
    );
    assert_eq!(
        state.observe_named(
            &home,
            limpet_core::Observation::CheckFailed(limpet_core::CheckSlot::FIRST)
        ),
        None
    );
    assert_eq!(
        state.observe_named(
            &home,
            limpet_core::Observation::CheckFailed(limpet_core::CheckSlot::FIRST)
        ),
        Some(limpet_core::Transition::WentDown)
    );
    closed_within(&mut session, Duration::from_secs(2)).await;
    assert_eq!(
        sc.all_three(src).await,
        [other.to_owned(), other.to_owned(), other.to_owned()]
    );
    // MAINT does the same for the new home.
    let (mut session, now_home) = tcp_session(src, sc.addr("terminal-raw")).await;
    assert_eq!(now_home, other);
    state.set_admin(other, limpet_core::AdminState::Maint);
    closed_within(&mut session, Duration::from_secs(2)).await;
    drop(state);
    sc.stop().await;
    let _ = PATIENCE;
}

/// LVIV (127.0.0.2) and KYIV (127.0.0.3), for a test with a config of its own.
async fn lviv_and_kyiv() -> (Vec<TestNode>, Ports) {
    let pki = Pki::new();
    start_nodes(
        &[("LVIV", "127.0.0.2"), ("KYIV", "127.0.0.3")],
        pki.server("n", &["127.0.0.2"]),
    )
    .await
}

/// Stops limpet, then the nodes.
async fn stop_all(running: Running, nodes: &mut [TestNode]) {
    running.stop().await;
    for n in nodes {
        n.kill().await;
    }
}

/// LVIV and KYIV, a source-address table `terminal` shared by an HTTP listener `web` with the
/// limpet cookie (and `web_extra`) and a TCP listener `raw`.
fn cookie_and_table_config(ports: &Ports, web_extra: &str) -> String {
    format!(
        r#"
[[nodes]]
name = "LVIV"
address = "127.0.0.2"
[[nodes]]
name = "KYIV"
address = "127.0.0.3"
[[tables]]
name = "terminal"
key = "source-ip"
[[listeners]]
name = "web"
bind = "127.0.0.1:0"
node_port = {http}
table = "terminal"
cookie = {{ name = "route" }}
{web_extra}
[[listeners]]
name = "raw"
bind = "127.0.0.1:0"
mode = "tcp"
node_port = {tcp}
table = "terminal"
"#,
        http = ports.http,
        tcp = ports.tcp
    )
}

/// A request that fails on the table's node and goes to the node its (stale) cookie names
/// moves the whole session there, TCP port included: the request is the cookie's own
/// (`Sticky`), but the entry leaves a node that is UP, and the session's TCP session there
/// ends at once. Before, only a re-pin said so: the TCP session stayed on the old node while
/// the requests went to the other, until the next table hold (up to a minute), which then
/// reset it mid-stream.
#[tokio::test]
async fn a_failover_to_a_stale_cookie_s_node_moves_the_tcp_session_too() {
    let (mut nodes, ports) = lviv_and_kyiv().await;
    let dir = TempDir::new("cookie-table-failover");
    let text = cookie_and_table_config(&ports, "timeouts = { upstream_answer = \"300ms\" }");
    let running = start(config(&dir, &text)).await.expect("start");
    let web = running.addr("web").expect("web");
    let raw = running.addr("raw").expect("raw");
    let src = "127.0.0.61";
    let (mut session, home) = tcp_session(src, raw).await;
    let other = if home == "LVIV" { "KYIV" } else { "LVIV" };
    // The table sends it to `home`, which is late with this answer; it fails over to the
    // cookie's node.
    let s = connect_from(src.parse().expect("ip"), web).await;
    let req = format!(
        "GET /slow?ms=2000&on={home} HTTP/1.1\r\nHost: print.example\r\nCookie: route={other}\r\n\
         Connection: close\r\n\r\n"
    );
    let (_, answered_by) = get_raw(s, &req).await;
    assert_eq!(
        answered_by, other,
        "the late GET is answered by the cookie's node"
    );
    closed_within(&mut session, Duration::from_secs(2)).await;
    assert_eq!(tcp_session(src, raw).await.1, other, "the TCP port follows");
    stop_all(running, &mut nodes).await;
}

/// A listener bound on `[::]` takes IPv4 clients too, as IPv4-mapped IPv6 addresses
/// (`::ffff:127.0.0.71`). The source-address table keys them as the IPv4 address, so a
/// client that reaches one port through a dual-stack listener and another through an
/// IPv4-only one is one session, on one node, whichever port pins it first.
#[tokio::test]
async fn a_client_through_a_dual_stack_listener_is_the_same_session_on_an_ipv4_one() {
    let (mut nodes, ports) = lviv_and_kyiv().await;
    let dir = TempDir::new("dual-stack");
    let text = format!(
        "[[nodes]]\nname = \"LVIV\"\naddress = \"127.0.0.2\"\n\
         [[nodes]]\nname = \"KYIV\"\naddress = \"127.0.0.3\"\n\
         [[tables]]\nname = \"terminal\"\nkey = \"source-ip\"\n\
         [[listeners]]\nname = \"web\"\nbind = \"[::]:0\"\nnode_port = {http}\ntable = \"terminal\"\n\
         [[listeners]]\nname = \"raw\"\nbind = \"127.0.0.1:0\"\nmode = \"tcp\"\n\
         node_port = {tcp}\ntable = \"terminal\"\n",
        http = ports.http,
        tcp = ports.tcp
    );
    let running = start(config(&dir, &text)).await.expect("start");
    // The dual-stack listener, reached over IPv4.
    let web =
        std::net::SocketAddr::from(([127, 0, 0, 1], running.addr("web").expect("web").port()));
    let raw = running.addr("raw").expect("raw");
    let mut seen = std::collections::BTreeSet::new();
    for i in 0..4u8 {
        // Pinned by the TCP port first, then the HTTP port; and the other way round.
        let src = format!("127.0.0.{}", 71 + i);
        let (_s, by_tcp) = tcp_session(&src, raw).await;
        assert_eq!(http_node(&src, web).await, by_tcp, "{src}: HTTP after TCP");
        let src = format!("127.0.0.{}", 81 + i);
        let by_http = http_node(&src, web).await;
        assert_eq!(
            tcp_session(&src, raw).await.1,
            by_http,
            "{src}: TCP after HTTP"
        );
        seen.extend([by_tcp, by_http]);
    }
    assert_eq!(seen.len(), 2, "fresh sessions went to both nodes: {seen:?}");
    stop_all(running, &mut nodes).await;
}

/// An HTTP listener with the limpet cookie AND the shared table: the table decides while its
/// node can take the session, the cookie when it cannot, and the two never split a client.
#[tokio::test]
async fn a_cookie_and_a_shared_table_never_split_the_session() {
    let (mut nodes, ports) = lviv_and_kyiv().await;
    let dir = TempDir::new("cookie-table");
    let text = cookie_and_table_config(&ports, "");
    let running = start(config(&dir, &text)).await.expect("start");
    let web = running.addr("web").expect("web");
    let raw = running.addr("raw").expect("raw");
    let src = "127.0.0.60";
    // Pinned through the TCP port first.
    let (_s, home) = tcp_session(src, raw).await;
    let other = if home == "LVIV" { "KYIV" } else { "LVIV" };
    // No cookie: the table decides, and the answer sets the cookie to catch up.
    let (head, node) = get_with(connect_from(src.parse().expect("ip"), web).await, "").await;
    assert_eq!(node, home);
    assert!(head.contains(&format!("route={home}")), "{head}");
    // A cookie naming another node (stale, or from before a TCP re-pin) does not split the
    // session: the shared table wins while the TCP session is on `home`, and the cookie is
    // rewritten.
    let cookie = format!("Cookie: route={other}\r\n");
    let (head, node) = get_with(connect_from(src.parse().expect("ip"), web).await, &cookie).await;
    assert_eq!(
        node, home,
        "the shared table wins over a disagreeing cookie"
    );
    assert!(head.contains(&format!("route={home}")), "{head}");
    assert_eq!(tcp_session(src, raw).await.1, home);
    // When the table's node cannot take the session (MAINT), the cookie's node does, and the
    // shared pin moves with it, so the TCP port follows the client.
    let state = running.runtime().state();
    state.set_admin(&home, limpet_core::AdminState::Maint);
    let (_, node) = get_with(connect_from(src.parse().expect("ip"), web).await, &cookie).await;
    assert_eq!(node, other, "a valid cookie when the table's node is out");
    assert_eq!(tcp_session(src, raw).await.1, other);
    drop(state);
    stop_all(running, &mut nodes).await;
}

/// A table keyed on the application's session cookie, learned from the node's Set-Cookie.
#[tokio::test]
async fn an_application_cookie_table_learns_from_set_cookie() {
    let (mut nodes, ports) = lviv_and_kyiv().await;
    let dir = TempDir::new("app-cookie");
    let text = format!(
        "[[nodes]]\nname = \"LVIV\"\naddress = \"127.0.0.2\"\n[[nodes]]\nname = \"KYIV\"\naddress = \"127.0.0.3\"\n[[tables]]\nname = \"sessions\"\napp_cookie = \"JSESSIONID\"\n[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = {}\ntable = \"sessions\"\n",
        ports.http
    );
    let running = start(config(&dir, &text)).await.expect("start");
    let web = running.addr("web").expect("web");
    // Two fresh clients: round-robin, and each node hands out its session cookie.
    let (h1, first) = get_with(
        connect_from("127.0.0.1".parse().expect("ip"), web).await,
        "",
    )
    .await;
    let (_, second) = get_with(
        connect_from("127.0.0.1".parse().expect("ip"), web).await,
        "",
    )
    .await;
    assert_ne!(first, second);
    assert!(h1.contains(&format!("JSESSIONID=sess-{first}")), "{h1}");
    // Requests carrying a session go to the node that issued it, whatever the rotation says.
    for _ in 0..3 {
        for n in [&first, &second] {
            let cookie = format!("Cookie: theme=dark; JSESSIONID=sess-{n}\r\n");
            let (_, got) = get_with(
                connect_from("127.0.0.1".parse().expect("ip"), web).await,
                &cookie,
            )
            .await;
            assert_eq!(&got, n);
        }
    }
    stop_all(running, &mut nodes).await;
}

/// One GET on a kept-alive connection (no cookie sent, none kept): the node named by the
/// answer body.
async fn keep_alive_get(conn: &mut tokio::net::TcpStream) -> String {
    conn.write_all(b"GET / HTTP/1.1\r\nHost: print.example\r\n\r\n")
        .await
        .expect("send");
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    let answer = tokio::time::timeout(PATIENCE, async {
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .expect("a Content-Length");
                if buf.len() >= end + 4 + len {
                    return String::from_utf8_lossy(&buf[end + 4..end + 4 + len]).into_owned();
                }
            }
            let n = conn.read(&mut chunk).await.expect("read");
            assert!(n > 0, "closed before the whole answer");
            buf.extend_from_slice(&chunk[..n]);
        }
    })
    .await
    .expect("answer in time");
    answer.trim().trim_start_matches("node ").to_owned()
}

/// A printer that keeps no cookie sends its requests on one kept-alive HTTP connection (the
/// HTTP listener sets the affinity cookie too), and its table entry goes (evicted or
/// expired; here the table is cleared). Its next request follows the connection's node and
/// writes it back into the table, so its TCP and HTTPS connections land there as well
/// (chaos run 24: nothing was written, and its other ports were balanced to the other node:
/// one session on two nodes). leastconn with a session held open on the connection's node
/// makes the other node the one a fresh assignment would pick.
#[tokio::test]
async fn a_cookieless_kept_alive_client_whose_entry_went_keeps_one_node_on_every_port() {
    let sc = Scenario::build(1, "cookie = { enabled = true }").await;
    let src = "127.0.0.61";
    let mut conn = connect_from(src.parse().expect("ip"), sc.addr("terminal-http")).await;
    let home = keep_alive_get(&mut conn).await;
    let mut held = None;
    for i in 0..8 {
        let (s, node) = tcp_session(&format!("127.0.0.{}", 70 + i), sc.addr("terminal-raw")).await;
        if node == home {
            held = Some(s);
            break;
        }
    }
    let _held = held.expect("a session on the connection's node");
    sc.running
        .runtime()
        .state()
        .table("terminal")
        .expect("table")
        .lock()
        .store_mut()
        .clear();

    assert_eq!(
        keep_alive_get(&mut conn).await,
        home,
        "the connection's node"
    );
    let (_tcp, tcp_node) = tcp_session(src, sc.addr("terminal-raw")).await;
    let https = https_node(
        src,
        sc.addr("terminal-https"),
        &sc.pki.client(&[b"http/1.1"]),
    )
    .await;
    assert_eq!(
        (tcp_node.as_str(), https.as_str()),
        (home.as_str(), home.as_str()),
        "every port on the node the kept-alive connection uses"
    );
    drop((_held, _tcp, conn));
    sc.stop().await;
}
