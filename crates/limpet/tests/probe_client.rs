//! `limpet probe` (the built binary) as a client on the wire, against demo nodes on 127.0.0.1
//! port 0: each request goes on a connection of its own, so a balancer that spreads
//! connections with no stickiness is caught; `--duration` bounds a run whose answers are slow;
//! a closed WebSocket is reconnected once its backoff is due, not at the next round; and the
//! probe raises a low descriptor limit, as `--sessions 1000 --ws` needs.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::probe::{probe, proxy_over_hosts, ProbeProc};
use common::{nodes, Node, PATIENCE};
use serde_json::Value;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

/// A balancer that spreads TCP connections over its nodes in turn and knows nothing of
/// sessions: the first connection goes to the first node, the next to the second, and so on.
/// Stopped, with every connection through it, when dropped.
struct RoundRobinTcp {
    addr: SocketAddr,
    /// Connections accepted so far.
    accepted: Arc<AtomicU32>,
    task: JoinHandle<()>,
}

impl RoundRobinTcp {
    async fn start(nodes: Vec<SocketAddr>) -> RoundRobinTcp {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind balancer");
        let addr = listener.local_addr().expect("balancer addr");
        let accepted = Arc::new(AtomicU32::new(0));
        let count = Arc::clone(&accepted);
        let task = tokio::spawn(async move {
            // Aborting this task drops the set, which aborts every relay and its sockets.
            let mut relays = JoinSet::new();
            loop {
                tokio::select! {
                    Some(_) = relays.join_next(), if !relays.is_empty() => {}
                    conn = listener.accept() => {
                        let Ok((mut client, _)) = conn else { continue };
                        let turn = count.fetch_add(1, SeqCst) as usize;
                        let node = nodes[turn % nodes.len()];
                        relays.spawn(async move {
                            if let Ok(mut upstream) = TcpStream::connect(node).await {
                                let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream)
                                    .await;
                            }
                        });
                    }
                }
            }
        });
        RoundRobinTcp {
            addr,
            accepted,
            task,
        }
    }
}

impl Drop for RoundRobinTcp {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Round-robin TCP moves a client at each new connection. A real client opens new ones
/// (keep-alive ends, parallel requests, a restart), so the probe opens one per request and
/// sees the moves. It used to send each session's requests over one kept-alive connection,
/// all to one node, and passed such a balancer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_balancer_spreading_connections_without_stickiness_fails() {
    let ns = nodes(&["a", "b"]).await;
    let lb = RoundRobinTcp::start(ns.iter().map(|n| n.addr).collect()).await;
    let url = format!("http://{}/", lb.addr);
    let run = probe(&[&url, "--sessions", "1", "--requests", "4", "--json"]).await;
    assert_eq!(run.code, Some(1), "{run:?}");
    let r = run.report();
    assert_eq!(r["outcome"], "broken", "{r}");
    let s = &r["summary"];
    // Discovery and 4 requests, each on a connection of its own: a, b, a, b, a.
    assert_eq!((u(&s["answers"]), u(&s["breaks"])), (5, 4), "{s}");
    assert_eq!(lb.accepted.load(SeqCst), 5, "one connection per request");
}

/// `--duration` bounds the run even when answers are slow: no round starts once it has passed.
/// Round 0 here (discovery and 3 requests, 300 ms each) ends 1.2 s in, past the 1 s given.
/// The probe used to run every round the interval fits in the duration (10), each at once
/// after the one before: about 9 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duration_bounds_a_watch_whose_answers_are_slow() {
    let node = Node::start("a").await;
    let url = format!("http://{}/slow?ms=300", node.addr);
    let began = Instant::now();
    let run = probe(&[
        &url,
        "--sessions",
        "1",
        "--requests",
        "3",
        "--watch",
        "--duration",
        "1s",
        "--interval",
        "100ms",
        "--json",
    ])
    .await;
    let took = began.elapsed();
    assert_eq!(run.code, Some(0), "{run:?}");
    let r = run.report();
    assert_eq!(u(&r["rounds"]), 1, "no round starts after 1 s: {r}");
    assert!(took < Duration::from_secs(3), "a 1 s run took {took:?}");
}

/// A WebSocket that closes between rounds is reconnected (discovery first) once the backoff
/// (`--backoff-min 20ms`) is due, as the client library's schedule says, not when the next
/// round starts 8 s later: the re-pin the reconnect shows comes well before then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_socket_reconnects_when_its_backoff_is_due_not_at_the_next_round() {
    let ns = nodes(&["a", "b"]).await;
    // Each node behind a host that can crash with every connection, the socket included.
    let (proxy, mut hosts) = proxy_over_hosts(&ns).await;
    let mut p = ProbeProc::spawn(&[
        &proxy.url("/"),
        "--ws",
        "/ws",
        "--sessions",
        "1",
        "--requests",
        "1",
        "--watch",
        "--rounds",
        "2",
        "--interval",
        "8s",
        "--backoff-min",
        "20ms",
        "--json",
    ]);
    let round0 = p
        .wait_for_json(|v| v["event"] == "round" && v["round"] == 0)
        .await;
    let victim = round0["nodes"][0]
        .as_str()
        .expect("session 0 has a node")
        .to_owned();
    hosts
        .iter_mut()
        .find(|(name, _)| *name == victim)
        .expect("victim host")
        .1
        .crash()
        .await;
    let crashed = Instant::now();
    let m = p.wait_for_json(|v| v["event"] == "move").await;
    let took = crashed.elapsed();
    assert_eq!(
        (m["kind"].as_str(), m["from"].as_str(), m["via"].as_str()),
        (Some("repin"), Some(victim.as_str()), Some("discovery")),
        "{m}"
    );
    // A reconnect between two rounds counts in the round it prepares.
    assert_eq!(m["round"], 1, "{m}");
    assert!(
        took < Duration::from_secs(4),
        "reconnected {took:?} after the close; round 1 starts 8 s after round 0"
    );
    // Dropping `p` stops the probe: the rest of its 8 s round says nothing more here.
    drop(p);
    proxy.stop().await;
}

/// `--sessions 1000 --ws` needs a descriptor per socket and per connection: the probe raises
/// its soft limit to the hard one, as `limpet proxy` does. Under a soft limit of 64, 100
/// sessions used to fail to connect (`Too many open files`) and the run could not pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_low_descriptor_limit_is_raised() {
    let node = Node::start("a").await;
    let url = format!("http://{}/", node.addr);
    let out = tokio::time::timeout(
        PATIENCE,
        tokio::process::Command::new("prlimit")
            .args([
                // The soft limit only; the hard one stays what it is, the probe's to reach.
                "--nofile=64:",
                env!("CARGO_BIN_EXE_limpet"),
                "probe",
                &url,
                "--ws",
                "/ws",
                "--sessions",
                "100",
                "--requests",
                "1",
                "--json",
            ])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("probe done in time")
    .expect("run prlimit (util-linux)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let last = stdout.lines().last().unwrap_or_default();
    let r: Value = serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    let s = &r["summary"];
    assert_eq!((u(&s["judged"]), u(&s["no_answer"])), (100, 0), "{s}");
    assert_eq!(r["errors"], serde_json::json!([]), "{r}");
}
