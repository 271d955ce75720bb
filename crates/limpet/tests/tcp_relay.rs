//! TCP mode: half-close, idle timeout, connect failure fallback with re-pin, a node that
//! drops sessions before any byte moved (and a rolling restart), and the per-listener
//! `close_on_node_down` switch.

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use common::multiport::*;
use limpet::runtime::start;
use limpet_core::table::KeyRef;
use limpet_core::Pin;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn two_nodes() -> (Vec<TestNode>, Ports, Pki) {
    let pki = Pki::new();
    let tls = pki.server("node", &["127.0.0.2"]);
    let (nodes, ports) = start_nodes(&[("a", "127.0.0.2"), ("b", "127.0.0.3")], tls).await;
    (nodes, ports, pki)
}

fn tcp_config(
    dir: &TempDir,
    nodes: &[(&str, &str)],
    port: u16,
    extra: &str,
) -> limpet::config::Config {
    let mut text = String::new();
    for (n, ip) in nodes {
        text.push_str(&format!(
            "[[nodes]]\nname = \"{n}\"\naddress = \"{ip}\"\n\n"
        ));
    }
    text.push_str(&format!(
        "[[tables]]\nname = \"t\"\nkey = \"source-ip\"\n\n[[listeners]]\nname = \"raw\"\nbind = \"127.0.0.1:0\"\nmode = \"tcp\"\nnode_port = {port}\ntable = \"t\"\n{extra}\n"
    ));
    config(dir, &text)
}

#[tokio::test]
async fn half_close_is_passed_on_and_both_directions_finish() {
    let (mut nodes, ports, _pki) = two_nodes().await;
    let dir = TempDir::new("tcp");
    let running = start(tcp_config(
        &dir,
        &[("a", "127.0.0.2"), ("b", "127.0.0.3")],
        ports.tcp,
        "",
    ))
    .await
    .expect("start");
    let (mut s, _node) = tcp_session("127.0.0.1", running.addr("raw").expect("addr")).await;
    s.write_all(b"hello, ").await.expect("write");
    s.write_all(b"world").await.expect("write");
    // We are done sending; the node still has an answer to give.
    s.shutdown().await.expect("half-close");
    let mut back = Vec::new();
    tokio::time::timeout(common::PATIENCE, s.read_to_end(&mut back))
        .await
        .expect("node side ends too")
        .expect("read");
    assert_eq!(
        back, b"hello, world",
        "bytes after our FIN still arrive, then EOF"
    );
    running.stop().await;
    for n in &mut nodes {
        n.kill().await;
    }
}

/// The other order: the node ends its stream first and keeps reading. The client gets the
/// node's bytes and then EOF, can still send, and when it ends too the node reads every byte
/// and a clean end of stream (the relay's last FIN rides on its close: a reset here would
/// fail the node's read).
#[tokio::test]
async fn the_node_ends_first_and_still_reads_the_clients_last_bytes_then_a_clean_end() {
    let node = tokio::net::TcpListener::bind("127.0.0.2:0")
        .await
        .expect("bind node");
    let port = node.local_addr().expect("node addr").port();
    let node_side = tokio::spawn(async move {
        let (mut s, _) = node.accept().await.expect("accept");
        s.write_all(b"greeting").await.expect("node write");
        s.shutdown().await.expect("node half-close");
        let mut got = Vec::new();
        s.read_to_end(&mut got).await.map(|_| got)
    });
    let dir = TempDir::new("tcp");
    let running = start(tcp_config(&dir, &[("a", "127.0.0.2")], port, ""))
        .await
        .expect("start");
    let mut s = tokio::net::TcpStream::connect(running.addr("raw").expect("addr"))
        .await
        .expect("connect");
    let mut first = Vec::new();
    tokio::time::timeout(common::PATIENCE, s.read_to_end(&mut first))
        .await
        .expect("the node's FIN is passed on")
        .expect("read");
    assert_eq!(first, b"greeting");
    s.write_all(b"last bytes after the node's FIN")
        .await
        .expect("still writable");
    s.shutdown().await.expect("client half-close");
    let got = tokio::time::timeout(common::PATIENCE, node_side)
        .await
        .expect("the node's read ends")
        .expect("node task")
        .expect("the node's stream ends cleanly, not with a reset");
    assert_eq!(got, b"last bytes after the node's FIN");
    running.stop().await;
}

#[tokio::test]
async fn an_idle_session_is_closed() {
    let (mut nodes, ports, _pki) = two_nodes().await;
    let dir = TempDir::new("tcp");
    let cfg = tcp_config(
        &dir,
        &[("a", "127.0.0.2"), ("b", "127.0.0.3")],
        ports.tcp,
        "timeouts = { idle = \"1s\" }",
    );
    let running = start(cfg).await.expect("start");
    let (mut s, _) = tcp_session("127.0.0.1", running.addr("raw").expect("addr")).await;
    // Traffic keeps it open: three exchanges 400 ms apart outlast the 1 s idle timeout
    // together, each well within it (slack for a loaded machine).
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(400)).await;
        s.write_all(b"x").await.expect("write");
        let mut b = [0u8; 1];
        s.read_exact(&mut b).await.expect("echo");
    }
    // ...silence closes it.
    let mut b = [0u8; 1];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut b))
        .await
        .expect("closed within the idle timeout and some slack");
    assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
    running.stop().await;
    for n in &mut nodes {
        n.kill().await;
    }
}

#[tokio::test]
async fn a_connect_failure_falls_back_to_a_live_node_and_re_pins() {
    let (mut nodes, ports, _pki) = two_nodes().await;
    let dir = TempDir::new("tcp");
    // "dead" comes first in pool order, so the first fresh assignment picks it; nothing
    // listens on 127.0.0.4.
    let cfg = tcp_config(
        &dir,
        &[
            ("dead", "127.0.0.4"),
            ("a", "127.0.0.2"),
            ("b", "127.0.0.3"),
        ],
        ports.tcp,
        "",
    );
    let running = start(cfg).await.expect("start");
    let addr = running.addr("raw").expect("addr");
    let (_s, node) = tcp_session("127.0.0.60", addr).await;
    assert_ne!(node, "dead");
    let state = running.runtime().state();
    let id = {
        let table = state.table("t").expect("table");
        let mut t = table.lock();
        match t.lookup(
            KeyRef::ip(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 60)), Default::default()),
            limpet::clock::now_ms(),
        ) {
            Pin::Node(id) => id,
            other => panic!("no pin: {other:?}"),
        }
    };
    assert_eq!(
        state.node_name(id),
        node,
        "the table was re-pinned to the node that answered"
    );
    // The same client sticks to it from now on.
    for _ in 0..3 {
        assert_eq!(tcp_session("127.0.0.60", addr).await.1, node);
    }
    drop(state);
    running.stop().await;
    for n in &mut nodes {
        n.kill().await;
    }
}

#[tokio::test]
async fn close_on_node_down_can_be_turned_off() {
    let (mut nodes, ports, _pki) = two_nodes().await;
    let dir = TempDir::new("tcp");
    let cfg = tcp_config(
        &dir,
        &[("a", "127.0.0.2"), ("b", "127.0.0.3")],
        ports.tcp,
        "close_on_node_down = false",
    );
    let running = start(cfg).await.expect("start");
    let (mut s, home) = tcp_session("127.0.0.70", running.addr("raw").expect("addr")).await;
    let state = running.runtime().state();
    assert!(state.force_health(&home, false).is_some());
    // The session carries on: the node itself is fine, and the operator asked to keep it.
    echo(&mut s, b"still here").await;
    // MAINT is the operator taking the node out: it closes the session whatever
    // `close_on_node_down` says.
    assert!(state
        .set_admin(&home, limpet_core::AdminState::Maint)
        .is_some());
    let mut rest = Vec::new();
    let end = tokio::time::timeout(common::PATIENCE, s.read_to_end(&mut rest))
        .await
        .expect("the session closes on MAINT");
    assert!(
        matches!(end, Ok(0)) || end.is_err(),
        "closed, not relaying: {end:?} {rest:?}"
    );
    drop(state);
    running.stop().await;
    for n in &mut nodes {
        n.kill().await;
    }
}

/// TCP sessions show on the stats page and in metrics like HTTP requests do: each session's
/// routing outcome is counted (new, then sticky through the table), and its bytes count toward
/// its node once it ends.
#[tokio::test]
async fn tcp_sessions_count_their_pin_outcome_and_their_bytes() {
    let (mut nodes, ports, _pki) = two_nodes().await;
    let dir = TempDir::new("tcp");
    let cfg = tcp_config(
        &dir,
        &[("a", "127.0.0.2"), ("b", "127.0.0.3")],
        ports.tcp,
        "",
    );
    let running = start(cfg).await.expect("start");
    let addr = running.addr("raw").expect("addr");
    let state = running.runtime().state();
    let metrics = std::sync::Arc::clone(&state.lifecycle.metrics);
    let (mut s, node) = tcp_session("127.0.0.61", addr).await;
    echo(&mut s, b"twelve bytes").await;
    drop(s);
    let (s2, again) = tcp_session("127.0.0.61", addr).await;
    assert_eq!(again, node);
    drop(s2);
    let t = metrics.totals();
    assert_eq!((t.new, t.sticky), (1, 1), "{t:?}");
    // In: the 12 bytes sent. Out: the node's greeting line and the echo.
    bytes_counted(&metrics, &node, 12).await;
    drop(state);
    running.stop().await;
    for n in &mut nodes {
        n.kill().await;
    }
}

/// A session that limpet ends (here by MAINT) counts its bytes too, not only one the client
/// closed.
#[tokio::test]
async fn a_session_ended_by_maint_counts_its_bytes() {
    let (mut nodes, ports, _pki) = two_nodes().await;
    let dir = TempDir::new("tcp");
    let cfg = tcp_config(
        &dir,
        &[("a", "127.0.0.2"), ("b", "127.0.0.3")],
        ports.tcp,
        "",
    );
    let running = start(cfg).await.expect("start");
    let state = running.runtime().state();
    let metrics = std::sync::Arc::clone(&state.lifecycle.metrics);
    let (mut s, node) = tcp_session("127.0.0.62", running.addr("raw").expect("addr")).await;
    echo(&mut s, b"twelve bytes").await;
    assert!(state
        .set_admin(&node, limpet_core::AdminState::Maint)
        .is_some());
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(common::PATIENCE, s.read_to_end(&mut rest))
        .await
        .expect("the session closes on MAINT");
    bytes_counted(&metrics, &node, 12).await;
    drop(state);
    running.stop().await;
    for n in &mut nodes {
        n.kill().await;
    }
}

/// A TCP session waiting in its node's queue (`max_connections`) when the node goes to
/// MAINT routes again and is relayed to the other node: it is not admitted to the MAINT node
/// on the slot MAINT freed (chaos run: it was, connected there and was reset).
#[tokio::test]
async fn a_session_queued_for_a_node_that_goes_to_maint_goes_to_the_other_node() {
    let (mut nodes, ports, _pki) = two_nodes().await;
    let dir = TempDir::new("tcp-queue");
    let text = format!(
        "[[nodes]]\nname = \"a\"\naddress = \"127.0.0.2\"\nmax_connections = 1\n\n\
         [[nodes]]\nname = \"b\"\naddress = \"127.0.0.3\"\nmax_connections = 1\n\n\
         [[tables]]\nname = \"t\"\nkey = \"source-ip\"\n\n\
         [[listeners]]\nname = \"raw\"\nbind = \"127.0.0.1:0\"\nmode = \"tcp\"\n\
         node_port = {port}\ntable = \"t\"\ntimeouts = {{ queue = \"60s\" }}\n",
        port = ports.tcp
    );
    let running = start(config(&dir, &text)).await.expect("start");
    let raw = running.addr("raw").expect("addr");
    let src = "127.0.0.72";
    // The first session takes its node's only slot.
    let (mut first, home) = tcp_session(src, raw).await;
    let other = if home == "a" { "b" } else { "a" };
    // The second, from the same address, is pinned there too and waits in its queue.
    let mut second = connect_from(src.parse().expect("ip"), raw).await;
    let state = running.runtime().state();
    let rt = state.lifecycle.nodes.get(&home).expect("node runtime");
    tokio::time::timeout(common::PATIENCE, async {
        while rt.queued() == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the second session queued");
    assert!(state
        .set_admin(&home, limpet_core::AdminState::Maint)
        .is_some());
    assert_eq!(
        read_line(&mut second).await,
        format!("node={other}"),
        "relayed to the other node"
    );
    echo(&mut second, b"still relayed").await;
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(common::PATIENCE, first.read_to_end(&mut rest))
        .await
        .expect("the first session closes on MAINT");
    assert_eq!(rt.queued(), 0);
    drop((rt, state, second));
    running.stop().await;
    for n in &mut nodes {
        n.kill().await;
    }
}

/// Sends `bytes` on the session and reads the echo back (bounded).
async fn echo(s: &mut tokio::net::TcpStream, bytes: &[u8]) {
    s.write_all(bytes).await.expect("write");
    let mut b = vec![0u8; bytes.len()];
    tokio::time::timeout(common::PATIENCE, s.read_exact(&mut b))
        .await
        .expect("echo in time")
        .expect("echo");
    assert_eq!(b, bytes);
}

/// Waits (bounded) until `node`'s traffic counts at least `n` bytes each way: the relay
/// counts as it returns, just after the session closed.
async fn bytes_counted(metrics: &limpet::metrics::Metrics, node: &str, n: u64) {
    let deadline = tokio::time::Instant::now() + common::PATIENCE;
    loop {
        let v = metrics.traffic(node, limpet::clock::now_ms());
        if v.bytes_in >= n && v.bytes_out >= n {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "bytes never counted: {v:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A node on 127.0.0.2 that greets each connection with `node=a`, then reads until its
/// client ends: it reports the bytes it got, and `true` for a clean end (a FIN), `false`
/// for a reset. Its port, its task and the reports.
async fn upload_node() -> (
    u16,
    tokio::task::JoinHandle<()>,
    tokio::sync::mpsc::UnboundedReceiver<(usize, bool)>,
) {
    upload_node_with(None, None).await
}

/// How the node saw its connection end (bounded).
async fn node_end(
    reports: &mut tokio::sync::mpsc::UnboundedReceiver<(usize, bool)>,
) -> (usize, bool) {
    tokio::time::timeout(common::PATIENCE, reports.recv())
        .await
        .expect("the node's connection ended in time")
        .expect("a report")
}

/// Reads the client side until it ends: `Ok(bytes)` for a clean end, `Err` for a reset.
async fn client_end(s: &mut tokio::net::TcpStream) -> std::io::Result<usize> {
    let mut rest = Vec::new();
    tokio::time::timeout(common::PATIENCE, s.read_to_end(&mut rest))
        .await
        .expect("the session ended in time")
}

/// SIGTERM with a TCP session in the middle of an upload: limpet stops accepting, and the
/// session goes on for the drain (the node still gets what the client sends), as HAProxy's
/// soft stop and nginx's graceful shutdown let it; at the drain's end a session still open
/// is cut with a reset on both sides, so the node does not take half an upload for a whole
/// one.
#[tokio::test]
async fn a_shutdown_lets_an_open_session_go_on_for_the_drain_then_resets_it() {
    let (port, node, mut reports) = upload_node().await;
    let dir = TempDir::new("tcp");
    let cfg = tcp_config(
        &dir,
        &[("a", "127.0.0.2")],
        port,
        "timeouts = { drain = \"1s\" }",
    );
    let running = start(cfg).await.expect("start");
    let addr = running.addr("raw").expect("addr");
    let (mut s, greeted) = tcp_session("127.0.0.1", addr).await;
    assert_eq!(greeted, "a");
    s.write_all(b"first part").await.expect("write");
    let stopping = tokio::spawn(running.stop());
    // Stopped accepting: the signal was taken.
    tokio::time::timeout(common::PATIENCE, async {
        while tokio::net::TcpStream::connect(addr).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the listener closed");
    s.write_all(b"second part")
        .await
        .expect("the session still takes bytes");
    let (got, clean) = node_end(&mut reports).await;
    assert_eq!(
        (got, clean),
        (21, false),
        "the node got both parts, then a reset at the drain's end"
    );
    assert!(client_end(&mut s).await.is_err(), "the client is reset too");
    tokio::time::timeout(common::PATIENCE, stopping)
        .await
        .expect("stopped in time")
        .expect("stop task");
    node.abort();
}

/// A session ended by limpet (MAINT here) is cut, not ended: the node sees a reset, so a
/// partial upload is not taken for a whole one; a session the client ends itself still ends
/// with a FIN.
#[tokio::test]
async fn a_session_cut_by_maint_resets_the_node_side_and_one_the_client_ends_does_not() {
    let (port, node, mut reports) = upload_node().await;
    let dir = TempDir::new("tcp");
    let cfg = tcp_config(&dir, &[("a", "127.0.0.2")], port, "");
    let running = start(cfg).await.expect("start");
    let addr = running.addr("raw").expect("addr");
    let (mut s, _) = tcp_session("127.0.0.1", addr).await;
    s.write_all(b"whole job").await.expect("write");
    s.shutdown().await.expect("client ends");
    assert_eq!(node_end(&mut reports).await, (9, true), "a clean end");
    drop(s);

    let (mut s, _) = tcp_session("127.0.0.1", addr).await;
    s.write_all(b"half a job").await.expect("write");
    let state = running.runtime().state();
    assert!(state
        .set_admin("a", limpet_core::AdminState::Maint)
        .is_some());
    let (_, clean) = node_end(&mut reports).await;
    assert!(!clean, "the node sees the cut as a reset");
    assert!(client_end(&mut s).await.is_err(), "the client is reset too");
    drop(state);
    running.stop().await;
    node.abort();
}

/// A node like [`upload_node`] that reads one byte, then nothing more until `go` is true
/// (a printer out of paper), saying `.` every 200 ms meanwhile, then reads to the end: it
/// reports how many bytes it got in all and whether its stream ended cleanly.
async fn stalling_upload_node(
    go: tokio::sync::watch::Receiver<bool>,
    rcvbuf: Option<u32>,
) -> (
    u16,
    tokio::task::JoinHandle<()>,
    tokio::sync::mpsc::UnboundedReceiver<(usize, bool)>,
) {
    upload_node_with(Some(go), rcvbuf).await
}

/// [`upload_node`]; with `go`, [`stalling_upload_node`]'s pause after the first byte; with
/// `rcvbuf`, its receive buffer that small.
async fn upload_node_with(
    go: Option<tokio::sync::watch::Receiver<bool>>,
    rcvbuf: Option<u32>,
) -> (
    u16,
    tokio::task::JoinHandle<()>,
    tokio::sync::mpsc::UnboundedReceiver<(usize, bool)>,
) {
    let sock = tokio::net::TcpSocket::new_v4().expect("socket");
    if let Some(n) = rcvbuf {
        // Inherited by the connections it accepts: what they do not take waits on
        // limpet's side.
        sock.set_recv_buffer_size(n).expect("SO_RCVBUF");
    }
    sock.bind("127.0.0.2:0".parse().expect("addr"))
        .expect("bind node");
    let l = sock.listen(64).expect("listen");
    let port = l.local_addr().expect("node addr").port();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let (tx, go) = (tx.clone(), go.clone());
            tokio::spawn(async move {
                if s.write_all(b"node=a\n").await.is_err() {
                    return;
                }
                let (mut got, mut buf) = (0, vec![0u8; 64 * 1024]);
                // A reset that comes while the node waits is reported to its next status
                // write, not to the read after it (which then finds a plain end): a failed
                // write says which. Linux tells a reset in a stream still open both ways
                // (ECONNRESET) from one after the peer's end (EPIPE: limpet ended the
                // upload cleanly, then closed).
                let mut reset = false;
                if let Some(mut go) = go {
                    match s.read(&mut buf[..1]).await {
                        Ok(1) => got = 1,
                        end => {
                            let _ = tx.send((0, matches!(end, Ok(0))));
                            return;
                        }
                    }
                    // Its status meanwhile, every 200 ms: the session moves the other way.
                    loop {
                        tokio::select! {
                            r = async { go.wait_for(|g| *g).await.map(|_| ()) } => match r {
                                Ok(()) => break,
                                Err(_) => return,
                            },
                            () = tokio::time::sleep(Duration::from_millis(200)) => {
                                if let Err(e) = s.write_all(b".").await {
                                    reset = e.kind() == std::io::ErrorKind::ConnectionReset;
                                    break;
                                }
                            }
                        }
                    }
                }
                let clean = loop {
                    match s.read(&mut buf).await {
                        Ok(0) => break !reset,
                        Ok(n) => got += n,
                        Err(_) => break false,
                    }
                };
                let _ = tx.send((got, clean));
            });
        }
    });
    (port, task, rx)
}

/// A byte stream that neither side ended its own way is reset on both sides, as one cut by
/// MAINT is: a client that aborts mid-upload (its reset), one that goes silent mid-upload
/// for `idle`, and a node that stops reading an upload for `idle` (a printer out of paper)
/// each leave the node with a reset, not an end of stream that a raw protocol takes for
/// "job complete"; and the client of a node that resets mid-answer gets a reset. Before,
/// each was passed on as a FIN: the node printed half a job as a whole one.
#[tokio::test]
async fn an_abort_an_idle_or_a_stalled_session_reaches_the_other_side_as_a_reset() {
    let (port, node, mut reports) = upload_node().await;
    let dir = TempDir::new("tcp-abort");
    let cfg = tcp_config(
        &dir,
        &[("a", "127.0.0.2")],
        port,
        "timeouts = { idle = \"1s\" }",
    );
    let running = start(cfg).await.expect("start");
    let addr = running.addr("raw").expect("addr");
    // The client aborts: its reset reaches the node as one.
    let (mut s, _) = tcp_session("127.0.0.1", addr).await;
    s.write_all(b"half a job").await.expect("write");
    socket2::SockRef::from(&s)
        .set_linger(Some(Duration::ZERO))
        .expect("linger");
    drop(s);
    let (got, clean) = node_end(&mut reports).await;
    assert_eq!(got, 10);
    assert!(!clean, "a client's abort reaches the node as a reset");
    // The client goes silent mid-upload: at `idle`, both sides are reset.
    let (mut s, _) = tcp_session("127.0.0.1", addr).await;
    s.write_all(b"half a job").await.expect("write");
    let (got, clean) = node_end(&mut reports).await;
    assert_eq!(got, 10);
    assert!(!clean, "an idle session reaches the node as a reset");
    assert!(client_end(&mut s).await.is_err(), "and the client as one");
    drop(s);
    running.stop().await;
    node.abort();

    // The node stops reading an upload, though it still writes: at `idle`, the stalled
    // session is reset on both sides; the node, reading again, finds what its buffers held
    // and then the reset.
    let (go, go_rx) = tokio::sync::watch::channel(false);
    let (port, node, mut reports) = stalling_upload_node(go_rx, None).await;
    let cfg = tcp_config(
        &dir,
        &[("a", "127.0.0.2")],
        port,
        "timeouts = { idle = \"1s\" }",
    );
    let running = start(cfg).await.expect("start");
    let addr = running.addr("raw").expect("addr");
    let (s, _) = tcp_session("127.0.0.1", addr).await;
    let (mut r, mut w) = s.into_split();
    // More than the sockets on the way can hold; the write ends with the reset.
    let upload = tokio::spawn(async move {
        let chunk = vec![b'x'; 1 << 20];
        for _ in 0..64 {
            if w.write_all(&chunk).await.is_err() {
                return;
            }
        }
    });
    let mut rest = Vec::new();
    let client = tokio::time::timeout(common::PATIENCE, r.read_to_end(&mut rest))
        .await
        .expect("the stalled session ends in time");
    assert!(client.is_err(), "the client of a stalled upload is reset");
    go.send_replace(true);
    let (got, clean) = node_end(&mut reports).await;
    assert!(
        !clean,
        "the node of a stalled upload finds a reset after {got} bytes, not an end"
    );
    upload.abort();
    running.stop().await;
    node.abort();

    // The node resets mid-answer: its client gets a reset, not an end of stream.
    let l = tokio::net::TcpListener::bind("127.0.0.2:0")
        .await
        .expect("bind node");
    let port = l.local_addr().expect("node addr").port();
    let node = tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let _ = s.write_all(b"node=a\nhalf an answer").await;
            socket2::SockRef::from(&s)
                .set_linger(Some(Duration::ZERO))
                .expect("linger");
            drop(s);
        }
    });
    let cfg = tcp_config(&dir, &[("a", "127.0.0.2")], port, "");
    let running = start(cfg).await.expect("start");
    let addr = running.addr("raw").expect("addr");
    let (mut s, _) = tcp_session("127.0.0.1", addr).await;
    assert!(
        client_end(&mut s).await.is_err(),
        "a node's reset reaches the client as one"
    );
    drop(s);
    running.stop().await;
    node.abort();
}

/// A client that sent its whole job and its FIN, then left before the node answered (its
/// kernel resets what the node says after): the relay ends on the failed write to the
/// client, but the job's direction had finished, so the node is not reset. It reads the
/// whole job, then the end of the stream, however late it reads. A reset threw away what
/// still waited in limpet's socket for the node to take (its window is small here), and the
/// node found a reset after part of a whole job.
#[tokio::test]
async fn a_whole_upload_whose_client_left_reaches_its_node_whole_and_ended() {
    let (go, go_rx) = tokio::sync::watch::channel(false);
    // The node's window small: most of the job waits in limpet's socket for it to read.
    let (port, node, mut reports) = stalling_upload_node(go_rx, Some(2048)).await;
    let dir = TempDir::new("tcp-whole-job");
    let cfg = tcp_config(&dir, &[("a", "127.0.0.2")], port, "");
    let running = start(cfg).await.expect("start");
    let addr = running.addr("raw").expect("addr");
    let (mut s, _) = tcp_session("127.0.0.1", addr).await;
    let job = vec![b'j'; 12 * 1024];
    s.write_all(&job).await.expect("write");
    s.shutdown().await.expect("FIN");
    drop(s);
    // The session ends (counted then) once a status byte meets the client's reset.
    let metrics = std::sync::Arc::clone(&running.runtime().state().lifecycle.metrics);
    let deadline = tokio::time::Instant::now() + common::PATIENCE;
    while metrics.traffic("a", limpet::clock::now_ms()).bytes_in < job.len() as u64 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the session never ended"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    go.send_replace(true);
    assert_eq!(
        node_end(&mut reports).await,
        (job.len(), true),
        "the whole job, then its end"
    );
    running.stop().await;
    node.abort();
}

/// A node that holds each connection before its TLS handshake until `go` is true, saying
/// which node it is on `arrived` as each comes; then it greets with `node=NAME` and echoes.
async fn held_tls_node(
    listener: tokio::net::TcpListener,
    name: &'static str,
    tls: std::sync::Arc<rustls::ServerConfig>,
    arrived: tokio::sync::mpsc::UnboundedSender<&'static str>,
    go: tokio::sync::watch::Receiver<bool>,
) {
    while let Ok((s, _)) = listener.accept().await {
        let (tls, arrived, mut go) = (std::sync::Arc::clone(&tls), arrived.clone(), go.clone());
        tokio::spawn(async move {
            let _ = arrived.send(name);
            if go.wait_for(|g| *g).await.is_err() {
                return;
            }
            let Ok(mut t) = tokio_rustls::TlsAcceptor::from(tls).accept(s).await else {
                return;
            };
            if t.write_all(format!("node={name}\n").as_bytes())
                .await
                .is_err()
            {
                return;
            }
            let mut buf = [0u8; 1024];
            while let Ok(n @ 1..) = t.read(&mut buf).await {
                if t.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        });
    }
}

/// Nodes a (127.0.0.2) and b (127.0.0.3) on one port, each a [`held_tls_node`] that holds
/// the TLS handshakes of its connections until its own `go` (a's first, b's second): their
/// tasks, where each tells a connection arriving, and the port.
async fn held_tls_pair(
    go: [tokio::sync::watch::Receiver<bool>; 2],
) -> (
    [tokio::task::JoinHandle<()>; 2],
    tokio::sync::mpsc::UnboundedReceiver<&'static str>,
    u16,
) {
    let pki = Pki::new();
    let tls = pki.server("node", &["127.0.0.2", "127.0.0.3"]);
    let (arrived_tx, arrived) = tokio::sync::mpsc::unbounded_channel();
    let (a, b, port) = common::ports::common_port_pair().await;
    let [go_a, go_b] = go;
    let nodes = [
        tokio::spawn(held_tls_node(
            a,
            "a",
            std::sync::Arc::clone(&tls),
            arrived_tx.clone(),
            go_a,
        )),
        tokio::spawn(held_tls_node(b, "b", tls, arrived_tx, go_b)),
    ];
    (nodes, arrived, port)
}

/// A node that leaves rotation while a session's attempt at it is in flight (here its TLS
/// handshake, held by the node; a connect's SYN retransmitted is the same window): nothing of
/// the client's has gone out, so the session goes to the other node, whether the node went
/// DOWN (with `close_on_node_down` on or off: the attempt is dropped at the DOWN, see
/// `a_session_connecting_to_a_node_that_goes_down_goes_to_the_other_node_at_once`) or into
/// MAINT (the attempt completes, and the session is not given to the node it left).
/// Before, the session was handed to the relay on the node it had just left: cut at once by
/// the node's close signal (the client saw its connection end), or, with
/// `close_on_node_down = false`, relayed to a DOWN node.
#[tokio::test]
async fn a_node_that_leaves_rotation_while_a_session_connects_to_it_is_not_given_the_session() {
    let (go, go_rx) = tokio::sync::watch::channel(false);
    let (nodes, mut arrived, port) = held_tls_pair([go_rx.clone(), go_rx]).await;
    for (i, (how, extra)) in [
        ("down", ""),
        ("maint", ""),
        ("down", "close_on_node_down = false"),
    ]
    .into_iter()
    .enumerate()
    {
        go.send_replace(false);
        let dir = TempDir::new("tcp-left");
        let cfg = tcp_config(
            &dir,
            &[("a", "127.0.0.2"), ("b", "127.0.0.3")],
            port,
            &format!("upstream_tls = {{ verify = \"none\" }}\n{extra}"),
        );
        let running = start(cfg).await.expect("start");
        let addr = running.addr("raw").expect("addr");
        let src = format!("127.0.0.{}", 80 + i);
        let client = tokio::spawn(async move { tcp_session(&src, addr).await });
        let first = tokio::time::timeout(common::PATIENCE, arrived.recv())
            .await
            .expect("the session's attempt reaches a node")
            .expect("nodes run");
        let state = running.runtime().state();
        if how == "down" {
            assert!(state.force_health(first, false).is_some());
        } else {
            assert!(state
                .set_admin(first, limpet_core::AdminState::Maint)
                .is_some());
        }
        go.send_replace(true);
        let (mut s, node) = tokio::time::timeout(common::PATIENCE, client)
            .await
            .expect("the session opens")
            .expect("client task");
        let other = if first == "a" { "b" } else { "a" };
        assert_eq!(
            node, other,
            "{how} {extra}: the session went to the node that left"
        );
        echo(&mut s, b"relayed").await;
        drop(s);
        drop(state);
        running.stop().await;
        while arrived.try_recv().is_ok() {}
    }
    for n in nodes {
        n.abort();
    }
}

/// A node that goes DOWN while a session's attempt at it hangs (here its TLS handshake, which
/// the node never answers: as a hung process whose listen queue is full never answers a
/// connect) lets the session go at once: it opens on the other node, long before the
/// attempt's connect timeout (60 s). Before, it waited out that timeout after the DOWN.
#[tokio::test]
async fn a_session_connecting_to_a_node_that_goes_down_goes_to_the_other_node_at_once() {
    // Each node's own release: the first one reached never answers.
    let (go_a, go_a_rx) = tokio::sync::watch::channel(false);
    let (go_b, go_b_rx) = tokio::sync::watch::channel(false);
    let (nodes, mut arrived, port) = held_tls_pair([go_a_rx, go_b_rx]).await;
    let dir = TempDir::new("tcp-down-connecting");
    let cfg = tcp_config(
        &dir,
        &[("a", "127.0.0.2"), ("b", "127.0.0.3")],
        port,
        "upstream_tls = { verify = \"none\" }\ntimeouts = { connect = \"60s\" }",
    );
    let running = start(cfg).await.expect("start");
    let addr = running.addr("raw").expect("addr");
    let client = tokio::spawn(async move { tcp_session("127.0.0.90", addr).await });
    let first = tokio::time::timeout(common::PATIENCE, arrived.recv())
        .await
        .expect("the session's attempt reaches a node")
        .expect("nodes run");
    let other = if first == "a" { "b" } else { "a" };
    // Only the other node answers.
    if other == "a" { &go_a } else { &go_b }.send_replace(true);
    let state = running.runtime().state();
    assert!(state.force_health(first, false).is_some());
    let (mut s, node) = tokio::time::timeout(common::PATIENCE, client)
        .await
        .expect("the session opens on the other node before the connect timeout")
        .expect("client task");
    assert_eq!(node, other, "the session went to the node that went DOWN");
    echo(&mut s, b"relayed").await;
    drop(s);
    drop(state);
    running.stop().await;
    for n in nodes {
        n.abort();
    }
}

/// A session moved off a node while its TCP session's attempt there hangs (another of its
/// connections failed there, and its table entry names the other node now), its client
/// having spoken first: once the attempt completes, the session goes where it is now, its
/// first bytes there. Before, the relay began on the node it had left, sent the client's
/// bytes there, and the move then stopped it: both sides reset.
#[tokio::test]
async fn a_session_moved_while_it_connects_speaks_first_to_where_it_is_now() {
    let (go_a, go_a_rx) = tokio::sync::watch::channel(false);
    let (go_b, go_b_rx) = tokio::sync::watch::channel(false);
    let (nodes, mut arrived, port) = held_tls_pair([go_a_rx, go_b_rx]).await;
    let dir = TempDir::new("tcp-moved-connecting");
    let cfg = tcp_config(
        &dir,
        &[("a", "127.0.0.2"), ("b", "127.0.0.3")],
        port,
        "upstream_tls = { verify = \"none\" }",
    );
    let running = start(cfg).await.expect("start");
    let src = IpAddr::from([127, 0, 0, 150]);
    let mut s = connect_from(src, running.addr("raw").expect("addr")).await;
    s.write_all(b"hello\n").await.expect("write");
    let first = tokio::time::timeout(common::PATIENCE, arrived.recv())
        .await
        .expect("the session's attempt reaches a node")
        .expect("nodes run");
    let other = if first == "a" { "b" } else { "a" };
    {
        let state = running.runtime().state();
        let key = KeyRef::ip(src, limpet_core::table::IpPrefix::HOST);
        let (from, to) = (
            state.node_id(first).expect("node"),
            state.node_id(other).expect("node"),
        );
        state
            .table("t")
            .expect("table")
            .lock()
            .learn(key, to, limpet::clock::now_ms());
        state.node_rt(from).expect("runtime").session_moved(
            limpet::runtime::spread_of(Some(key), src, None),
            limpet_core::Leave::Failed(limpet_core::RepinReason::AnswerTimeout),
        );
    }
    go_a.send_replace(true);
    go_b.send_replace(true);
    assert_eq!(
        read_line(&mut s).await,
        format!("node={other}"),
        "the session's first bytes went to the node it had left"
    );
    assert_eq!(read_line(&mut s).await, "hello");
    drop(s);
    running.stop().await;
    for n in nodes {
        n.abort();
    }
}

/// What a node does with a connection it took, without a byte: drop it at once, closed (a
/// FIN) or reset (what a node's kernel sends to the connections left in its listen queue
/// when a rolling restart closes the listener, or a process that exits with bytes unread);
/// hold it; or close it after a while (a server's timeout for a silent client).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DropWith {
    Fin,
    Reset,
    Hold,
    FinAfter(Duration),
}

/// A node that takes each connection, says so on `took`, and does with it what `with` says:
/// at once, or, with `after_bytes`, once the client's first bytes have come (which it
/// reports instead).
async fn dropping_node(
    listener: tokio::net::TcpListener,
    with: DropWith,
    after_bytes: bool,
    took: tokio::sync::mpsc::UnboundedSender<Vec<u8>>,
) {
    let mut held = Vec::new();
    while let Ok((mut s, _)) = listener.accept().await {
        let mut got = Vec::new();
        if after_bytes {
            let mut buf = [0u8; 64];
            if let Ok(n @ 1..) = s.read(&mut buf).await {
                got.extend_from_slice(&buf[..n]);
            }
        }
        if with == DropWith::Reset {
            let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
        }
        // Said before the drop, so that the test knows of it before the client can.
        let _ = took.send(got);
        match with {
            DropWith::Fin | DropWith::Reset => drop(s),
            DropWith::Hold => held.push(s),
            DropWith::FinAfter(d) => {
                tokio::spawn(async move {
                    tokio::time::sleep(d).await;
                    drop(s);
                });
            }
        }
    }
}

/// A node that greets each connection with `node=NAME` and echoes.
async fn greeting_node(listener: tokio::net::TcpListener, name: &'static str) {
    while let Ok((mut s, _)) = listener.accept().await {
        tokio::spawn(async move {
            if s.write_all(format!("node={name}\n").as_bytes())
                .await
                .is_err()
            {
                return;
            }
            let mut buf = [0u8; 1024];
            while let Ok(n @ 1..) = s.read(&mut buf).await {
                if s.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        });
    }
}

/// Node a, doing what `with` says with each connection (with `after_bytes`, once the
/// client's first bytes have come), and node b, greeting, on one port behind the TCP
/// listener `raw` of a source-address table (`extra` added to its config); and what a
/// reports taking.
struct ADropsBGreets {
    running: limpet::runtime::run::Running,
    addr: std::net::SocketAddr,
    a: std::sync::Arc<limpet::nodes::NodeRuntime>,
    took: tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>,
    nodes: [tokio::task::JoinHandle<()>; 2],
    _dir: TempDir,
}

impl ADropsBGreets {
    async fn start(with: DropWith, after_bytes: bool, extra: &str) -> Self {
        let (a, b, port) = common::ports::common_port_pair().await;
        let (took_tx, took) = tokio::sync::mpsc::unbounded_channel();
        let nodes = [
            tokio::spawn(dropping_node(a, with, after_bytes, took_tx)),
            tokio::spawn(greeting_node(b, "b")),
        ];
        let dir = TempDir::new("tcp-a-drops");
        let cfg = tcp_config(&dir, &[("a", "127.0.0.2"), ("b", "127.0.0.3")], port, extra);
        let running = start(cfg).await.expect("start");
        let addr = running.addr("raw").expect("addr");
        let state = running.runtime().state();
        let a = std::sync::Arc::clone(
            state
                .node_rt(state.node_id("a").expect("node a"))
                .expect("a's runtime"),
        );
        ADropsBGreets {
            running,
            addr,
            a,
            took,
            nodes,
            _dir: dir,
        }
    }

    /// Fresh clients from `127.0.0.{first}` on, each sending `first_bytes` then reading a
    /// line, until one lands on a: what that client read, and what a reports taking. Those
    /// b takes are greeted by it; at most 10.
    async fn until_a_takes_one(&mut self, first: u8, first_bytes: &[u8]) -> (String, Vec<u8>) {
        for n in 0..10 {
            let src = format!("127.0.0.{}", first + n).parse().expect("ip");
            let mut s = connect_from(src, self.addr).await;
            if !first_bytes.is_empty() {
                s.write_all(first_bytes).await.expect("client writes");
            }
            let line = read_line(&mut s).await;
            if let Ok(took) = self.took.try_recv() {
                return (line, took);
            }
            assert_eq!(line, "node=b", "a session b took is b's");
        }
        panic!("no session of 10 went to a");
    }

    async fn stop(self) {
        drop(self.a);
        self.running.stop().await;
        for n in self.nodes {
            n.abort();
        }
    }
}

/// A node that takes TCP sessions and drops them before any byte moved either way, closed
/// (a FIN) or reset, as a node in a rolling restart does to the connections caught in its
/// listen queue: nothing of the client's was sent, so each session is taken to the other
/// node (the client, which waits for the node to speak first, is greeted by b and relayed),
/// its table entry re-pinned there, and the node is charged as for a refused connect: DOWN
/// at `fall`. Before, the client's connection was closed or reset with it; and a node
/// observed as connected on each connect, before its drop, would never reach `fall`.
#[tokio::test]
async fn a_node_that_drops_sessions_unused_passes_them_on_and_goes_down() {
    for (i, with) in [DropWith::Fin, DropWith::Reset].into_iter().enumerate() {
        let mut p = ADropsBGreets::start(
            with,
            false,
            "\n[health]\nfall = 2\nfail_timeout = \"60s\"\n",
        )
        .await;
        let (addr, a_rt) = (p.addr, std::sync::Arc::clone(&p.a));
        // Fresh clients until a has dropped `fall` of them; each is b's.
        let mut sessions = 0u64;
        let mut dropped = 0u64;
        while dropped < 2 {
            assert!(
                sessions < 20,
                "{with:?}: a took {dropped} of {sessions} sessions"
            );
            let src = format!("127.0.{}.{}", 100 + i, 10 + sessions);
            let (mut s, node) = tcp_session(&src, addr).await;
            assert_eq!(node, "b", "{with:?}: session {sessions} was greeted by b");
            echo(&mut s, b"relayed").await;
            sessions += 1;
            while p.took.try_recv().is_ok() {
                dropped += 1;
            }
            // The session's table entry follows it to b.
            let (_s, again) = tcp_session(&src, addr).await;
            assert_eq!(again, "b", "{with:?}: the client came back to b");
        }
        let health = a_rt.status().health;
        assert!(
            !health.is_up(),
            "{with:?}: a DOWN after {dropped} sessions it dropped"
        );
        assert_eq!(
            health.down_cause(),
            Some(limpet_core::DownCause::Traffic),
            "{with:?}"
        );
        // DOWN, a is passed over without being tried.
        for n in 0..3 {
            let src = format!("127.0.{}.{}", 100 + i, 200 + n);
            assert_eq!(tcp_session(&src, addr).await.1, "b");
        }
        assert!(
            p.took.try_recv().is_err(),
            "{with:?}: a DOWN takes no session"
        );
        // Each session's pin outcome is counted once, where it went: a dropped one as
        // re-pinned, not also as the fresh pin to a it began with.
        let t = p.running.runtime().state().lifecycle.metrics.totals();
        assert_eq!(
            (t.new + t.repinned, t.repinned, t.sticky),
            (sessions + 3, dropped, sessions),
            "{with:?}: {t:?}"
        );
        drop(a_rt);
        p.stop().await;
    }
}

/// A client that speaks first (its bytes read and sent to the node before the node drops the
/// connection) is not taken to another node: whether the node took those bytes cannot be
/// known, so sending them again elsewhere is not safe. The client's connection ends, as the
/// node's did, and b never sees the session.
#[tokio::test]
async fn a_session_whose_client_spoke_first_is_not_moved_when_its_node_drops_it() {
    let mut p = ADropsBGreets::start(
        DropWith::Fin,
        true,
        "\n[health]\nfall = 2\nfail_timeout = \"60s\"\n",
    )
    .await;
    // Fresh clients until one lands on a (those b takes are greeted by it).
    let (line, sent) = p.until_a_takes_one(120, b"PRINT job 1\n").await;
    assert_eq!(sent, b"PRINT job 1\n", "a got the client's bytes");
    assert_eq!(
        line, "",
        "the client's connection ended with a's, not moved to b"
    );
    p.stop().await;
}

/// One TCP session through `addr` from `src`: the node's greeting, then an echo. What went
/// wrong, if anything.
async fn greeted_and_echoed(src: &str, addr: std::net::SocketAddr) -> Result<String, String> {
    let mut s = connect_from(src.parse().map_err(|e| format!("{e}"))?, addr).await;
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while line.last() != Some(&b'\n') {
        match tokio::time::timeout(common::PATIENCE, s.read(&mut b)).await {
            Ok(Ok(1)) => line.push(b[0]),
            Ok(Ok(_)) => break,
            Ok(Err(e)) => return Err(format!("no greeting: {e}")),
            Err(_) => return Err("no greeting in time".into()),
        }
    }
    let greeting = String::from_utf8_lossy(&line).trim().to_owned();
    let Some(node) = greeting.strip_prefix("node=") else {
        return Err(format!("no greeting (got {greeting:?})"));
    };
    s.write_all(b"ping")
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut back = [0u8; 4];
    match tokio::time::timeout(common::PATIENCE, s.read_exact(&mut back)).await {
        Ok(Ok(_)) if &back == b"ping" => Ok(node.to_owned()),
        other => Err(format!("{node}: no echo: {other:?}")),
    }
}

/// A rolling restart behind a TCP listener, under load: each node in turn stops listening
/// (the connections its kernel completed into its listen queue are reset; its sessions
/// already open finish, and `close_on_node_down = false` lets them), goes DOWN on refused connects, comes back on the same address, and
/// is UP again after its trial. Eight clients open sessions all the while, each from a fresh
/// source address, and every session is greeted and echoed: those that landed in a closing
/// listen queue were dropped unused and went to the other node. Before, one or two sessions
/// in a run were reset without a byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_behind_a_tcp_listener_loses_no_session() {
    let (a, b, port) = common::ports::common_port_pair().await;
    let mut nodes = [
        tokio::spawn(greeting_node(a, "a")),
        tokio::spawn(greeting_node(b, "b")),
    ];
    let dir = TempDir::new("tcp-rolling");
    let cfg = tcp_config(
        &dir,
        &[("a", "127.0.0.2"), ("b", "127.0.0.3")],
        port,
        // A graceful restart: the sessions a node still serves once it is DOWN go on.
        "close_on_node_down = false\n\n[health]\nfall = 2\nfail_timeout = \"100ms\"\n",
    );
    let running = start(cfg).await.expect("start");
    let addr = running.addr("raw").expect("addr");
    let state = running.runtime().state();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut clients = tokio::task::JoinSet::new();
    for k in 0..8u32 {
        let done = std::sync::Arc::clone(&done);
        clients.spawn(async move {
            let (mut failures, mut served) = (Vec::new(), [0u32; 2]);
            // Bounded in count as in time (the restarts below take well under a second).
            for j in 0..5_000u32 {
                if done.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                let src = format!("127.{}.{}.{}", 10 + k, j / 250, 1 + j % 250);
                match greeted_and_echoed(&src, addr).await {
                    Ok(node) => served[usize::from(node == "b")] += 1,
                    Err(e) => failures.push(format!("client {k} session {j}: {e}")),
                }
            }
            (failures, served)
        });
    }
    for (i, (name, ip)) in [("a", "127.0.0.2"), ("b", "127.0.0.3")]
        .into_iter()
        .enumerate()
    {
        let rt = std::sync::Arc::clone(
            state
                .node_rt(state.node_id(name).expect("node"))
                .expect("runtime"),
        );
        let mut changes = rt.status_changes();
        // Stops listening; its open sessions go on.
        nodes[i].abort();
        let _ = (&mut nodes[i]).await;
        tokio::time::timeout(
            common::PATIENCE,
            changes.wait_for(|_| !rt.status().health.is_up()),
        )
        .await
        .unwrap_or_else(|_| panic!("{name} DOWN on refused connects"))
        .expect("status watch");
        let again = tokio::net::TcpListener::bind((ip, port))
            .await
            .unwrap_or_else(|e| panic!("{name} back on its address: {e}"));
        nodes[i] = tokio::spawn(greeting_node(again, name));
        tokio::time::timeout(
            common::PATIENCE,
            changes.wait_for(|_| rt.status().health.is_up()),
        )
        .await
        .unwrap_or_else(|_| panic!("{name} UP after its trial"))
        .expect("status watch");
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut failures, mut served) = (Vec::new(), [0u32; 2]);
    while let Some(r) = clients.join_next().await {
        let (f, s) = r.expect("client task");
        failures.extend(f);
        served[0] += s[0];
        served[1] += s[1];
    }
    assert!(
        failures.is_empty(),
        "{} sessions failed: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    // Every node back in rotation: new sessions after the last restart reach both.
    let mut after = [0u32; 2];
    for j in 0..20u32 {
        let src = format!("127.30.0.{}", 1 + j);
        let node = greeted_and_echoed(&src, addr)
            .await
            .unwrap_or_else(|e| panic!("session {j} after the restarts: {e}"));
        after[usize::from(node == "b")] += 1;
    }
    assert!(
        after[0] > 0 && after[1] > 0,
        "both nodes take new sessions after the restarts: {after:?} (during: {served:?})"
    );
    drop(state);
    running.stop().await;
    for n in nodes {
        n.abort();
    }
}

/// A node that leaves rotation (DOWN, with `close_on_node_down` as by default, or MAINT)
/// while a session it took has moved nothing either way (the client waits for the node to
/// speak first, and it has not): the session goes to the other node, which greets it, and
/// the node in MAINT is charged nothing. Before, the node's close signal reset the client's
/// connection.
#[tokio::test]
async fn a_session_whose_node_leaves_rotation_before_any_byte_moved_goes_to_the_other_node() {
    for (i, how) in ["down", "maint"].into_iter().enumerate() {
        let mut p = ADropsBGreets::start(DropWith::Hold, false, "").await;
        let addr = p.addr;
        // Fresh clients until a takes one (b greets those it takes).
        let mut on_a = None;
        for n in 0..10 {
            let src = format!("127.0.{}.{}", 110 + i, 10 + n).parse().expect("ip");
            let mut s = connect_from(src, addr).await;
            tokio::select! {
                got = p.took.recv() => {
                    got.expect("a runs");
                    on_a = Some(s);
                    break;
                }
                line = read_line(&mut s) => assert_eq!(line, "node=b"),
            }
        }
        let mut s = on_a.unwrap_or_else(|| panic!("{how}: no session of 10 went to a"));
        let state = p.running.runtime().state();
        if how == "down" {
            assert!(state.force_health("a", false).is_some());
        } else {
            assert!(state
                .set_admin("a", limpet_core::AdminState::Maint)
                .is_some());
        }
        assert_eq!(
            read_line(&mut s).await,
            "node=b",
            "{how}: the session went to b"
        );
        echo(&mut s, b"relayed").await;
        if how == "maint" {
            // (A node forced DOWN shows no charge: its streak counts passes toward `rise`.)
            assert_eq!(p.a.status().health.streak(), 0, "{how}: a charged nothing");
        }
        drop((s, state));
        p.stop().await;
    }
}

/// A node that closes a session its client left silent, past the opening's window (the
/// listener's connect timeout, 200 ms here; the node waits 600 ms), is ending a session like
/// any other, not dropping an unused connection: the client's connection ends with it, the
/// session is not moved, and the node is charged nothing. Counted as a drop, a silent client
/// would have charged every node in turn.
#[tokio::test]
async fn a_node_that_closes_a_silent_session_past_the_window_is_not_charged() {
    let mut p = ADropsBGreets::start(
        DropWith::FinAfter(Duration::from_millis(600)),
        false,
        "timeouts = { connect = \"200ms\" }\n\n[health]\nfall = 1\nfail_timeout = \"60s\"\n",
    )
    .await;
    let (line, _) = p.until_a_takes_one(140, b"").await;
    assert_eq!(line, "", "the session ended with a's close, not moved to b");
    let health = p.a.status().health;
    assert!(
        health.is_up() && health.streak() == 0,
        "a charged nothing: {health:?}"
    );
    p.stop().await;
}

/// A DOWN node's trial is a session's connect (no checks): a node that drops every session
/// comes UP on that connect, on probation, and its drop of the trial session takes it DOWN
/// again at once, the session going to b. `fail_timeout` 300 ms: fresh sessions every
/// 50 ms until a takes its second one (the trial), each greeted by b.
#[tokio::test]
async fn a_trial_session_a_node_drops_takes_it_down_again_and_goes_on() {
    let mut p = ADropsBGreets::start(
        DropWith::Fin,
        false,
        "\n[health]\nfall = 1\nfail_timeout = \"300ms\"\n",
    )
    .await;
    let addr = p.addr;
    let mut taken = 0;
    for n in 0..60u32 {
        let src = format!("127.0.{}.{}", 150 + n / 250, 1 + n % 250);
        let (mut s, node) = tcp_session(&src, addr).await;
        assert_eq!(node, "b", "session {n} was greeted by b");
        echo(&mut s, b"relayed").await;
        while p.took.try_recv().is_ok() {
            taken += 1;
            // Its first drop (fall = 1), or its trial's: DOWN either way.
            assert!(
                !p.a.status().health.is_up(),
                "a DOWN after its drop number {taken}"
            );
        }
        if taken >= 2 {
            break;
        }
        if taken == 1 {
            // Waiting for a's trial to be due.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    assert!(taken >= 2, "a's trial came: {taken} sessions taken");
    p.stop().await;
}

/// A node that each connection is handed to, for the test to hold or drop.
async fn handing_node(
    listener: tokio::net::TcpListener,
    to: tokio::sync::mpsc::UnboundedSender<tokio::net::TcpStream>,
) {
    while let Ok((s, _)) = listener.accept().await {
        let _ = to.send(s);
    }
}

/// What a session learns of its node after the node went DOWN is left unsaid: a node that
/// drops a session it took before its DOWN, once its trial has brought it back, is not
/// charged for it. Late, that drop would land on the node's fresh start (here, with
/// `fall = 1`, taking it DOWN again at once, though every connection since its trial went
/// well). Session 1 is held silent by a; a goes DOWN by traffic (`close_on_node_down`
/// off, so session 1 stays); a's trial, a fresh session's connect or limpet's own, brings
/// it UP; then a drops session 1, which goes to b, and a stays UP.
#[tokio::test]
async fn a_drop_of_a_session_from_before_its_node_went_down_does_not_undo_its_trial() {
    let (a, b, port) = common::ports::common_port_pair().await;
    let (handed_tx, mut handed) = tokio::sync::mpsc::unbounded_channel();
    let nodes = [
        tokio::spawn(handing_node(a, handed_tx)),
        tokio::spawn(greeting_node(b, "b")),
    ];
    let dir = TempDir::new("tcp-went-down");
    let cfg = tcp_config(
        &dir,
        &[("a", "127.0.0.2"), ("b", "127.0.0.3")],
        port,
        "close_on_node_down = false\ntimeouts = { connect = \"20s\" }\n\
         [health]\nfall = 1\nfail_timeout = \"300ms\"\n",
    );
    let running = start(cfg).await.expect("start");
    let addr = running.addr("raw").expect("addr");
    let state = running.runtime().state();
    let a_rt = std::sync::Arc::clone(
        state
            .node_rt(state.node_id("a").expect("node a"))
            .expect("a's runtime"),
    );
    // Fresh clients until one lands on a, which holds it; those on b are greeted.
    let mut n = 0u32;
    let (mut first, held) = loop {
        assert!(n < 10, "no session reached a");
        let src: IpAddr = format!("127.0.160.{}", 1 + n).parse().expect("ip");
        n += 1;
        let mut s = connect_from(src, addr).await;
        let mut line = [0u8; 7];
        let to_a = tokio::select! {
            h = handed.recv() => Some(h.expect("a runs")),
            greeted = s.read_exact(&mut line) => {
                greeted.expect("greeting");
                assert_eq!(&line, b"node=b\n");
                None
            }
        };
        if let Some(h) = to_a {
            break (s, h);
        }
    };
    assert!(a_rt.status().health.is_up());
    // a goes DOWN by its traffic (an HTTP request's failure, say): its trial comes after
    // `fail_timeout`. The session it holds stays (`close_on_node_down = false`).
    a_rt.observe(limpet_core::Observation::TrafficFailed);
    assert!(!a_rt.status().health.is_up(), "a DOWN");
    // Fresh sessions until a is UP again by its trial (a session's connect, or limpet's
    // own); a keeps what it is handed.
    let mut trial_conns = Vec::new();
    let deadline = tokio::time::Instant::now() + common::PATIENCE;
    while !a_rt.status().health.is_up() {
        assert!(tokio::time::Instant::now() < deadline, "a never came back");
        let src: IpAddr = format!("127.0.161.{}", 1 + n).parse().expect("ip");
        n += 1;
        trial_conns.push(connect_from(src, addr).await);
        tokio::select! {
            h = handed.recv() => trial_conns.push(h.expect("a runs")),
            () = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
    }
    // a drops the session it took before its DOWN, within the opening's window: the
    // session goes to b, and a, back by its trial, is not charged for it.
    socket2::SockRef::from(&held)
        .set_linger(Some(Duration::ZERO))
        .expect("linger");
    drop(held);
    let mut line = [0u8; 7];
    tokio::time::timeout(common::PATIENCE, first.read_exact(&mut line))
        .await
        .expect("greeted in time")
        .expect("the first session moved on");
    assert_eq!(&line, b"node=b\n", "the first session went to b");
    let health = a_rt.status().health;
    assert!(
        health.is_up() && health.streak() == 0,
        "a, back by its trial, charged nothing for a session from before its DOWN: {health:?}"
    );
    drop((first, trial_conns));
    drop(a_rt);
    drop(state);
    running.stop().await;
    for n in nodes {
        n.abort();
    }
}

/// TLS on both sides of a TCP session (a print server's TLS port, re-encrypted to its node):
/// a node that ends its stream without `close_notify` (many TLS servers skip it) has that end
/// passed on as an end, not as a failure: the client, still sending, gets the node's answer
/// and then a `close_notify` (a clean end its TLS library accepts), and its later bytes still
/// reach the node, which reads them to the client's own `close_notify`. Before, the relay
/// ended both directions at once and closed the client's TCP connection without
/// `close_notify`: a truncation to the client's TLS library, and its last bytes lost.
#[tokio::test]
async fn a_tls_node_that_ends_without_close_notify_gives_a_tls_client_a_clean_end() {
    let pki = Pki::new();
    let node_tls = pki.server("node", &["127.0.0.2"]);
    let (cert, key) = pki.issue("limpet", &["print.example"]);
    let listener = tokio::net::TcpListener::bind("127.0.0.2:0")
        .await
        .expect("bind node");
    let port = listener.local_addr().expect("addr").port();
    // What the node read after it ended its own stream, to the client's end.
    let (read_tx, read_rx) = tokio::sync::oneshot::channel();
    let node = tokio::spawn(async move {
        let (s, _) = listener.accept().await.expect("accept");
        let mut t = tokio_rustls::TlsAcceptor::from(node_tls)
            .accept(s)
            .await
            .expect("node handshake");
        let mut line = [0u8; 4];
        t.read_exact(&mut line).await.expect("the job's first line");
        t.write_all(b"answer").await.expect("answer");
        t.flush().await.expect("flush");
        // The TCP stream's write side ended under TLS, no `close_notify`: what a TLS server
        // that skips it sends.
        let (tcp, _) = t.get_mut();
        tcp.shutdown().await.expect("FIN without close_notify");
        let mut rest = Vec::new();
        let end = t.read_to_end(&mut rest).await;
        let _ = read_tx.send((rest, end.map(|_| ()).map_err(|e| e.kind())));
    });
    let dir = TempDir::new("tcp-tls-eof");
    let cfg = tcp_config(
        &dir,
        &[("a", "127.0.0.2")],
        port,
        &format!(
            "tls = {{ cert = \"{}\", key = \"{}\" }}\nupstream_tls = {{ verify = \"none\" }}",
            cert.display(),
            key.display()
        ),
    );
    let running = start(cfg).await.expect("start");
    let addr = running.addr("raw").expect("addr");
    let s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let mut c = tokio_rustls::TlsConnector::from(pki.client(&[]))
        .connect(
            rustls::pki_types::ServerName::try_from("print.example").expect("name"),
            s,
        )
        .await
        .expect("TLS to limpet");
    c.write_all(b"job\n").await.expect("send");
    let mut got = Vec::new();
    let end = tokio::time::timeout(common::PATIENCE, c.read_to_end(&mut got))
        .await
        .expect("the answer ends in time");
    assert_eq!(
        (got.as_slice(), end.map(|_| ()).map_err(|e| e.kind())),
        (&b"answer"[..], Ok(())),
        "the node's answer, then a clean TLS end"
    );
    c.write_all(b"more")
        .await
        .expect("send after the node's end");
    c.shutdown().await.expect("close_notify");
    let (rest, end) = tokio::time::timeout(common::PATIENCE, read_rx)
        .await
        .expect("the node reads to the end in time")
        .expect("node report");
    assert_eq!(
        (rest.as_slice(), end),
        (&b"more"[..], Ok(())),
        "the client's later bytes, then its end"
    );
    running.stop().await;
    node.abort();
}

/// An HTTP node over TLS that holds each connection's handshake until `go`, then answers
/// one request naming itself (`X-Limpet-Node`) and closes; it tells each connection as it
/// arrives, and each request it answers.
async fn held_tls_http_node(
    listener: tokio::net::TcpListener,
    name: &'static str,
    tls: std::sync::Arc<rustls::ServerConfig>,
    events: tokio::sync::mpsc::UnboundedSender<(&'static str, &'static str)>,
    go: tokio::sync::watch::Receiver<bool>,
) {
    while let Ok((s, _)) = listener.accept().await {
        let (tls, events, mut go) = (std::sync::Arc::clone(&tls), events.clone(), go.clone());
        tokio::spawn(async move {
            let _ = events.send((name, "connection"));
            if go.wait_for(|g| *g).await.is_err() {
                return;
            }
            let Ok(mut t) = tokio_rustls::TlsAcceptor::from(tls).accept(s).await else {
                return;
            };
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match t.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            let _ = events.send((name, "request"));
            let answer = format!(
                "HTTP/1.1 200 OK\r\nX-Limpet-Node: {name}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
            let _ = t.write_all(answer.as_bytes()).await;
            let _ = t.shutdown().await;
        });
    }
}

/// An HTTP request whose connection to its pinned node is still being made (here the TLS
/// handshake, held by the node; a SYN retransmitted is the same window) when the node goes
/// into MAINT: nothing of it was sent, so it routes again, to the other node, re-pinned
/// there, and the node in MAINT gets no request. Before, the request went to the node in
/// MAINT once its handshake completed (a TCP session in the same place was already routed
/// again: `a_node_that_leaves_rotation_while_a_session_connects_to_it_is_not_given_the_session`).
#[tokio::test]
async fn an_http_request_whose_node_goes_into_maint_while_it_connects_goes_elsewhere() {
    let pki = Pki::new();
    let tls = pki.server("node", &["127.0.0.2", "127.0.0.3"]);
    let (events_tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let (la, lb, port) = common::ports::common_port_pair().await;
    let (go, go_rx) = tokio::sync::watch::channel(false);
    let nodes = [
        tokio::spawn(held_tls_http_node(
            la,
            "a",
            std::sync::Arc::clone(&tls),
            events_tx.clone(),
            go_rx.clone(),
        )),
        tokio::spawn(held_tls_http_node(lb, "b", tls, events_tx, go_rx)),
    ];
    let dir = TempDir::new("http-left");
    let cfg = config(
        &dir,
        &format!(
            "[[nodes]]\nname = \"a\"\naddress = \"127.0.0.2\"\n\n\
             [[nodes]]\nname = \"b\"\naddress = \"127.0.0.3\"\n\n\
             [[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = {port}\n\
             upstream_tls = {{ verify = \"none\" }}\n"
        ),
    );
    let running = start(cfg).await.expect("start");
    let url = format!("http://{}/", running.addr("web").expect("addr"));
    let client = tokio::spawn(async move {
        let r = reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("client")
            .get(&url)
            .header("cookie", "route=a")
            .send()
            .await
            .expect("answer");
        let node = r
            .headers()
            .get("x-limpet-node")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let set = common::set_cookie_in(r.headers());
        (r.status().as_u16(), node, set)
    });
    let first = tokio::time::timeout(common::PATIENCE, events.recv())
        .await
        .expect("the request's connect reaches a node")
        .expect("nodes run");
    assert_eq!(first, ("a", "connection"));
    let state = running.runtime().state();
    assert!(state
        .set_admin("a", limpet_core::AdminState::Maint)
        .is_some());
    go.send_replace(true);
    let (status, node, set) = tokio::time::timeout(common::PATIENCE, client)
        .await
        .expect("answered")
        .expect("client task");
    assert_eq!(
        (status, node.as_str()),
        (200, "b"),
        "went to the node in MAINT"
    );
    assert!(
        set.as_deref().is_some_and(|s| s.starts_with("route=b;")),
        "re-pinned: {set:?}"
    );
    let mut requests = Vec::new();
    while let Ok((n, what)) = events.try_recv() {
        if what == "request" {
            requests.push(n);
        }
    }
    assert_eq!(requests, ["b"], "only b got a request");
    drop(state);
    running.stop().await;
    for n in nodes {
        n.abort();
    }
}
