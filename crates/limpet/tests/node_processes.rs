//! Nodes that fail the way real ones do, under traffic, as clients see them: a node process
//! stopped with SIGSTOP and resumed with SIGCONT (the failure model's hung node, as a stopped
//! process really is: its kernel completes connects into its backlog and takes the bytes of
//! connections already open, and it answers all of them late when it resumes), not a socket
//! that never accepts; a rolling restart of every node process, each stopped gracefully
//! (SIGTERM) or killed (SIGKILL) and started again on its address; and a node whose check
//! flaps.
//!
//! A node process is `limpet proxy --sticky none` in front of a demo node (a process of its
//! own, so a signal reaches it alone); other nodes are demo nodes or servers in the test.
//! limpet, HTTP-checked, is in front.

mod admin_common;

use std::io::BufRead;
use std::net::{IpAddr, SocketAddr};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use admin_common::lifecycle::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinSet;
use tokio::time::Instant;

const FALL: u64 = 2;
const RISE: u64 = 2;
const INTERVAL_MS: u64 = 100;
// Roomy for a loaded machine: an answer or a check slower than these outside the stop would
// be a verdict on the node (a 504, a flip) the test did not ask for.
const TIMEOUT_MS: u64 = 500;
const ANSWER_MS: u64 = 1000;
/// Scheduling on a loaded 2-core machine.
const SLACK: Duration = Duration::from_millis(1500);

/// A child process, killed (SIGKILL, by its own handle) and reaped when dropped.
struct Proc(std::process::Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn signal(p: &Proc, sig: rustix::process::Signal) {
    let pid = i32::try_from(p.0.id())
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .unwrap_or_else(|| panic!("no pid"));
    rustix::process::kill_process(pid, sig).unwrap_or_else(|e| panic!("kill: {e}"));
}

/// `limpet proxy --sticky none --listen IP:PORT --to a=TO` (`port` 0: any), once it
/// listens: the process and its port.
async fn node_process(ip: &str, port: u16, to: SocketAddr) -> (Proc, u16) {
    let mut child = Proc(
        Command::new(env!("CARGO_BIN_EXE_limpet"))
            .args(["proxy", "--threads", "1", "--sticky", "none", "--listen"])
            .arg(format!("{ip}:{port}"))
            .arg("--to")
            .arg(format!("a={to}"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn limpet proxy: {e}")),
    );
    let stdout = child.0.stdout.take().unwrap_or_else(|| panic!("stdout"));
    let line = tokio::time::timeout(
        PATIENCE,
        tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            std::io::BufReader::new(stdout)
                .read_line(&mut line)
                .map(|_| line)
        }),
    )
    .await
    .unwrap_or_else(|_| panic!("the node process did not start"))
    .unwrap_or_else(|e| panic!("{e}"))
    .unwrap_or_else(|e| panic!("{e}"));
    let port = line
        .trim()
        .strip_prefix("listening on ")
        .and_then(|r| r.split(' ').next())
        .and_then(|a| a.parse::<SocketAddr>().ok())
        .map(|a| a.port())
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
    (child, port)
}

/// limpet's config: `nodes` (name, address) HTTP-checked every `INTERVAL_MS` (`fall`,
/// `rise`), one listener at `node_port`, an admin API.
fn checked_config(name: &str, nodes: &[(&str, &str)], node_port: u16) -> ConfigFile {
    let text = format!(
        "{}[health]\nfall = {FALL}\nrise = {RISE}\ninterval = \"{INTERVAL_MS}ms\"\n\
         timeout = \"{TIMEOUT_MS}ms\"\nfail_timeout = \"60s\"\n\n\
         [[listeners]]\nname = \"l\"\nbind = \"127.0.0.1:0\"\nnode_port = {node_port}\n\
         timeouts = {{ upstream_answer = \"{ANSWER_MS}ms\", drain = \"1s\" }}\n\
         check = {{ kind = \"http\", path = \"/\" }}\n\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n",
        nodes_toml(nodes)
    );
    ConfigFile::new(name, &text)
}

/// A client with a cookie jar: its own session.
fn session() -> reqwest::Client {
    reqwest::Client::builder()
        .cookie_store(true)
        .no_proxy()
        .timeout(PATIENCE)
        .build()
        .unwrap_or_else(|e| panic!("{e}"))
}

/// One GET of `/headers` with request id `id` through `client`: the node that answered,
/// after checking that the answer is this request's (it echoes the id) and a 200.
async fn get(client: &reqwest::Client, addr: SocketAddr, id: u64) -> Result<String, String> {
    let resp = client
        .get(format!("http://{addr}/headers"))
        .header("x-test-id", id.to_string())
        .send()
        .await
        .map_err(|e| format!("request {id}: {e}"))?;
    let status = resp.status();
    let node = resp
        .headers()
        .get("x-limpet-node")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let body = resp
        .text()
        .await
        .map_err(|e| format!("request {id}: body: {e}"))?;
    if status != 200 {
        return Err(format!("request {id}: {status} from {node:?}"));
    }
    if !body
        .lines()
        .any(|l| l.eq_ignore_ascii_case(&format!("x-test-id: {id}")))
    {
        return Err(format!(
            "request {id}: another request's answer from {node:?}: {body:?}"
        ));
    }
    Ok(node)
}

/// Waits (bounded) until the admin API says node a is `state`; how long it took.
async fn until_a_is(l: &Limpet, state: &str, within: Duration) -> Duration {
    until_is(l, "a", state, within).await
}

/// Waits (bounded) until the admin API says node `node` is `state`; how long it took.
async fn until_is(l: &Limpet, node: &str, state: &str, within: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let view = node_view(l, node).await;
        if view["state"] == state {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "node {node} not {state} within {within:?}: {view}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Runs `rounds` rounds of traffic, one every 25 ms: a GET from each pinned session and from
/// a fresh one, each checked to be its own answer and a 200 within `bound`. The nodes the
/// fresh sessions reached.
async fn traffic(
    addr: SocketAddr,
    pinned: &[reqwest::Client],
    next_id: &mut u64,
    rounds: usize,
    bound: Duration,
) -> Vec<String> {
    traffic_until(
        addr,
        pinned,
        next_id,
        rounds,
        bound,
        &AtomicBool::new(false),
    )
    .await
}

/// [`traffic`], its rounds ending early once `done`.
async fn traffic_until(
    addr: SocketAddr,
    pinned: &[reqwest::Client],
    next_id: &mut u64,
    rounds: usize,
    bound: Duration,
    done: &AtomicBool,
) -> Vec<String> {
    let mut gets = JoinSet::new();
    for _ in 0..rounds {
        if done.load(Ordering::Acquire) {
            break;
        }
        for (i, c) in pinned.iter().enumerate() {
            let (c, id) = (c.clone(), *next_id);
            *next_id += 1;
            gets.spawn(async move {
                let t = Instant::now();
                (false, i, get(&c, addr, id).await, t.elapsed())
            });
        }
        let id = *next_id;
        *next_id += 1;
        gets.spawn(async move {
            let t = Instant::now();
            (true, 0, get(&session(), addr, id).await, t.elapsed())
        });
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let mut fresh_nodes = Vec::new();
    while let Some(r) = gets.join_next().await {
        let (fresh, _, got, took) = r.unwrap_or_else(|e| panic!("{e}"));
        let node = got.unwrap_or_else(|e| panic!("{e}"));
        assert!(took <= bound, "answered in {took:?}, over {bound:?}");
        if fresh {
            fresh_nodes.push(node);
        }
    }
    fresh_nodes
}

/// A node process stopped for 2.5 s under steady traffic (four sessions pinned to it and a
/// fresh session every 25 ms) and resumed: no request fails, each is answered with its own
/// answer (a connection whose request timed out is never used again, though the node answers
/// on it once resumed), each within one answer timeout and the checks' verdict; the node is
/// DOWN within `fall` checks of the stop, UP again within `rise` checks of the resume, and
/// fresh sessions reach it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_node_process_fails_no_request_and_comes_back_when_resumed() {
    let (mut backends, a_port) = backend_nodes(&[("a", "127.0.0.2")]).await;
    let (node_a, port) = node_process(
        "127.0.0.12",
        0,
        SocketAddr::new(IpAddr::from([127, 0, 0, 2]), a_port),
    )
    .await;
    let mut b = backend_node_again("b", IpAddr::from([127, 0, 0, 13]), port).await;
    let cfg = checked_config(
        "node-stopped",
        &[("a", "127.0.0.12"), ("b", "127.0.0.13")],
        port,
    );
    let l = Limpet::start(&cfg).await;
    let addr = l.addr("l");
    until_a_is(&l, "UP", PATIENCE).await;

    // Four sessions pinned to a (fresh sessions alternate between the nodes).
    let mut next_id = 0;
    let mut pinned = Vec::new();
    for _ in 0..16 {
        if pinned.len() == 4 {
            break;
        }
        let c = session();
        let node = answered_by(&c, addr, &mut next_id).await;
        if node == "a" {
            pinned.push(c);
        }
    }
    assert_eq!(pinned.len(), 4, "four sessions pinned to a");
    // Warm: kept-alive connections to a in limpet's pool.
    traffic(addr, &pinned, &mut next_id, 4, SLACK).await;

    // Stopped: a GET waits at most its answer timeout there, then goes to b (idempotent);
    // or the checks' verdict comes first.
    signal(&node_a, rustix::process::Signal::STOP);
    let per_get = Duration::from_millis(ANSWER_MS) + SLACK;
    let stop_traffic = traffic(addr, &pinned, &mut next_id, 100, per_get);
    let down = until_a_is(
        &l,
        "DOWN",
        Duration::from_millis(FALL * (INTERVAL_MS + TIMEOUT_MS)) + INTERVAL_MS_SLACK + SLACK,
    );
    let (fresh_while_stopped, _) = tokio::join!(stop_traffic, down);
    assert!(
        fresh_while_stopped.iter().any(|n| n == "b"),
        "{fresh_while_stopped:?}"
    );
    // By its checks, or first by its unanswered requests (`fall` answer timeouts).
    let cause = node_view(&l, "a").await["health"]["down_cause"].clone();
    assert!(cause == "checks" || cause == "traffic", "{cause}");

    // Resumed: it answers everything it took meanwhile, late; its checks bring it back.
    signal(&node_a, rustix::process::Signal::CONT);
    until_a_is(
        &l,
        "UP",
        Duration::from_millis(RISE * INTERVAL_MS + TIMEOUT_MS) + INTERVAL_MS_SLACK + SLACK,
    )
    .await;
    // (No lower bound: the check in flight at the resume passes at once, and the next one,
    // due an interval after it started, 200 ms before, starts at once too.)
    let fresh_after = traffic(addr, &pinned, &mut next_id, 40, SLACK).await;
    assert!(
        fresh_after.iter().any(|n| n == "a"),
        "fresh sessions reach a again: {fresh_after:?}"
    );
    // One flip each way: no flapping on the way down or back.
    let metrics = metrics_text(&l).await;
    for to in ["down", "up"] {
        assert_eq!(transitions(&metrics, "a", to), 1, "a's transitions {to}");
    }
    l.stop().await;
    drop(node_a);
    b.kill().await;
    for n in &mut backends {
        n.kill().await;
    }
}

/// How many times `node`'s health went `to` ("up", "down"), by the metrics' text.
fn transitions(metrics: &str, node: &str, to: &str) -> u64 {
    metrics
        .lines()
        .filter(|m| {
            m.starts_with("limpet_health_transitions_total{")
                && m.contains(&format!("node=\"{node}\""))
                && m.contains(&format!("to=\"{to}\""))
        })
        .map(|m| {
            m.rsplit(' ')
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("a transitions line without a count: {m}"))
        })
        .sum()
}

/// How long a node process of the rolling restart stays gone (ten rounds of traffic).
const DOWNTIME: Duration = Duration::from_millis(250);

/// How a node process is stopped for its restart.
#[derive(Debug, Clone, Copy)]
enum Stop {
    /// SIGTERM: it stops accepting, finishes what it took and exits.
    Term,
    /// SIGKILL: its connections are reset, its port refuses at once.
    Kill,
}

/// A rolling restart of every node, twice: each node process in turn stopped (first
/// gracefully, SIGTERM, then killed, SIGKILL), waited for until it is gone, started again on
/// its address and brought back UP by its checks before the next one goes, under steady
/// traffic (four sessions pinned and a fresh session every 25 ms, all GETs): no request
/// fails, each is answered with its own answer within slack (refused connects and reset
/// connections fail over at once, the GETs replayed), each node DOWN within `fall` checks of
/// its stop and UP within `rise` checks of its start, one transition each way per restart,
/// and fresh sessions reach every node at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_of_checked_node_processes_fails_no_request_and_every_node_returns() {
    let (mut backends, be_port) = backend_nodes(&[("a", "127.0.0.2"), ("b", "127.0.0.3")]).await;
    let names = ["a", "b"];
    let ips = ["127.0.0.14", "127.0.0.15"];
    let to = |i: u8| SocketAddr::new(IpAddr::from([127, 0, 0, 2 + i]), be_port);
    let (first, port) = node_process(ips[0], 0, to(0)).await;
    let (second, _) = node_process(ips[1], port, to(1)).await;
    let mut procs = [Some(first), Some(second)];
    let cfg = checked_config(
        "node-rolling-restart",
        &[("a", ips[0]), ("b", ips[1])],
        port,
    );
    let l = Limpet::start(&cfg).await;
    let addr = l.addr("l");
    for n in names {
        until_is(&l, n, "UP", PATIENCE).await;
    }
    let mut next_id = 0;
    let pinned: Vec<reqwest::Client> = (0..4).map(|_| session()).collect();
    // Warm: each session pinned, kept-alive connections to both nodes in limpet's pool.
    let warm = traffic(addr, &pinned, &mut next_id, 8, SLACK).await;
    assert!(
        names.iter().all(|n| warm.iter().any(|w| w == n)),
        "{warm:?}"
    );

    let done = AtomicBool::new(false);
    let restarts = async {
        for (i, how) in [
            (0, Stop::Term),
            (1, Stop::Term),
            (0, Stop::Kill),
            (1, Stop::Kill),
        ] {
            let name = names[i];
            let p = procs[i].take().unwrap_or_else(|| panic!("{name} runs"));
            signal(
                &p,
                match how {
                    Stop::Term => rustix::process::Signal::TERM,
                    Stop::Kill => rustix::process::Signal::KILL,
                },
            );
            let stopped = Instant::now();
            // Gone (its port free) before it starts again, as a service manager restarts one.
            let exited = tokio::time::timeout(
                PATIENCE,
                tokio::task::spawn_blocking(move || {
                    let mut p = p;
                    p.0.wait().map(|_| ())
                }),
            )
            .await;
            assert!(
                matches!(exited, Ok(Ok(Ok(())))),
                "{name} did not exit after {how:?}: {exited:?}"
            );
            until_is(
                &l,
                name,
                "DOWN",
                Duration::from_millis(FALL * (INTERVAL_MS + TIMEOUT_MS))
                    + INTERVAL_MS_SLACK
                    + SLACK,
            )
            .await;
            let down = stopped.elapsed();
            // A restart takes a while: the traffic meanwhile goes to the other node.
            tokio::time::sleep(DOWNTIME).await;
            let (p, _) = node_process(ips[i], port, to(u8::try_from(i).unwrap_or(0))).await;
            procs[i] = Some(p);
            let up = until_is(
                &l,
                name,
                "UP",
                Duration::from_millis(RISE * INTERVAL_MS + TIMEOUT_MS) + INTERVAL_MS_SLACK + SLACK,
            )
            .await;
            eprintln!("{name} {how:?}: DOWN {down:?} after the signal, UP {up:?} after its start");
        }
        done.store(true, Ordering::Release);
    };
    // Bounded: 2,000 rounds of 25 ms at most (the restarts take a few seconds).
    let load = traffic_until(addr, &pinned, &mut next_id, 2000, SLACK, &done);
    let (during, ()) = tokio::join!(load, restarts);
    eprintln!("{} rounds of traffic during the restarts", during.len());

    // Every node in rotation again: fresh sessions reach each.
    let after = traffic(addr, &pinned, &mut next_id, 40, SLACK).await;
    assert!(
        names.iter().all(|n| after.iter().any(|w| w == n)),
        "fresh sessions reach every node after the restarts: {after:?}"
    );
    let metrics = metrics_text(&l).await;
    for n in names {
        for to in ["down", "up"] {
            assert_eq!(
                transitions(&metrics, n, to),
                2,
                "{n}'s transitions {to}: one per restart"
            );
        }
    }
    l.stop().await;
    drop(procs);
    for n in &mut backends {
        n.kill().await;
    }
}

/// The checks' jitter: each interval may run up to a tenth longer.
const INTERVAL_MS_SLACK: Duration = Duration::from_millis(INTERVAL_MS);

/// The node that answered a GET of session `c` (request id `next_id`, then moved on), after
/// checking the answer is its own and a 200.
async fn answered_by(c: &reqwest::Client, addr: SocketAddr, next_id: &mut u64) -> String {
    let id = *next_id;
    *next_id += 1;
    get(c, addr, id).await.unwrap_or_else(|e| panic!("{e}"))
}

/// What [`FlappingNode`]'s check answers.
const PASS: u8 = 0;
const FAIL: u8 = 1;
/// The opposite of its last answer: pass, fail, pass... never two the same in a row.
const FLAP: u8 = 2;

/// Node a, whose check (`GET /`) answers as its `mode` says, and whose other paths answer
/// 200 with the request's head as the body (as a demo node's `/headers`, and with its name
/// in `x-limpet-node`), a request per connection. `checks` counts the checks it answered.
struct FlappingNode {
    mode: Arc<AtomicU8>,
    checks: tokio::sync::watch::Receiver<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl FlappingNode {
    async fn start(listener: tokio::net::TcpListener) -> FlappingNode {
        let mode = Arc::new(AtomicU8::new(PASS));
        let (count, checks) = tokio::sync::watch::channel(0u64);
        let (m, last_ok) = (Arc::clone(&mode), Arc::new(AtomicBool::new(true)));
        let task = tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let (m, last_ok, count) = (Arc::clone(&m), Arc::clone(&last_ok), count.clone());
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16384 {
                        match s.read(&mut buf).await {
                            Ok(n @ 1..) => head.extend_from_slice(&buf[..n]),
                            _ => return,
                        }
                    }
                    let head = String::from_utf8_lossy(&head).into_owned();
                    let path = head.split(' ').nth(1).unwrap_or("");
                    let (status, body) = if path == "/" {
                        let ok = match m.load(Ordering::Acquire) {
                            PASS => true,
                            FAIL => false,
                            _ => !last_ok.load(Ordering::Acquire),
                        };
                        last_ok.store(ok, Ordering::Release);
                        count.send_modify(|n| *n += 1);
                        (
                            if ok {
                                "200 OK"
                            } else {
                                "503 Service Unavailable"
                            },
                            String::new(),
                        )
                    } else {
                        ("200 OK", head)
                    };
                    let answer = format!(
                        "HTTP/1.1 {status}\r\nX-Limpet-Node: a\r\nContent-Length: {}\r\n\
                         Connection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = s.write_all(answer.as_bytes()).await;
                    let _ = s.shutdown().await;
                });
            }
        });
        FlappingNode { mode, checks, task }
    }

    fn set(&self, mode: u8) {
        self.mode.store(mode, Ordering::Release);
    }

    /// Waits (bounded) until it has answered `n` more checks.
    async fn checked(&mut self, n: u64) {
        let target = *self.checks.borrow() + n;
        tokio::time::timeout(PATIENCE, self.checks.wait_for(|c| *c >= target))
            .await
            .unwrap_or_else(|_| panic!("fewer than {n} checks within {PATIENCE:?}"))
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

impl Drop for FlappingNode {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A node whose check flaps (pass, fail, pass...) never reaches `fall` or `rise`: UP, it stays
/// UP and keeps its sessions (every GET of a session pinned to it is answered by it, with no
/// transition); DOWN, it stays DOWN (no fresh session reaches it); once its check passes
/// `rise` times in a row it is UP again and fresh sessions reach it. One transition each way
/// in all, as the client saw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flapping_check_neither_moves_sessions_off_a_node_nor_brings_it_back() {
    let a_listener = tokio::net::TcpListener::bind("127.0.0.16:0")
        .await
        .unwrap_or_else(|e| panic!("bind: {e}"));
    let port = a_listener
        .local_addr()
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("{e}"));
    let mut a = FlappingNode::start(a_listener).await;
    let mut b = backend_node_again("b", IpAddr::from([127, 0, 0, 17]), port).await;
    let cfg = checked_config(
        "node-flapping",
        &[("a", "127.0.0.16"), ("b", "127.0.0.17")],
        port,
    );
    let l = Limpet::start(&cfg).await;
    let addr = l.addr("l");
    a.checked(RISE).await;
    until_is(&l, "a", "UP", PATIENCE).await;
    let mut next_id = 0;
    let mut pinned = None;
    for _ in 0..8 {
        let c = session();
        let node = answered_by(&c, addr, &mut next_id).await;
        if node == "a" {
            pinned = Some(c);
            break;
        }
    }
    let pinned = pinned.unwrap_or_else(|| panic!("no fresh session reached a"));

    // UP and flapping: the session stays on a, check after check.
    a.set(FLAP);
    for _ in 0..(4 * FALL) {
        a.checked(1).await;
        let node = answered_by(&pinned, addr, &mut next_id).await;
        assert_eq!(node, "a", "a flapping check moved the session off a");
    }
    assert_eq!(node_view(&l, "a").await["state"], "UP");

    // Dead: DOWN after `fall`; the session moves to b.
    a.set(FAIL);
    until_is(
        &l,
        "a",
        "DOWN",
        Duration::from_millis(FALL * INTERVAL_MS) + INTERVAL_MS_SLACK + SLACK,
    )
    .await;
    let node = answered_by(&pinned, addr, &mut next_id).await;
    assert_eq!(node, "b");

    // DOWN and flapping: nothing reaches a, check after check.
    a.set(FLAP);
    for _ in 0..(4 * RISE) {
        a.checked(1).await;
        for c in [&pinned, &session()] {
            let node = answered_by(c, addr, &mut next_id).await;
            assert_eq!(node, "b", "a flapping check brought a back");
        }
    }
    assert_eq!(node_view(&l, "a").await["state"], "DOWN");

    // Passing again: UP after `rise`, and fresh sessions reach it.
    a.set(PASS);
    until_is(
        &l,
        "a",
        "UP",
        Duration::from_millis(RISE * INTERVAL_MS) + INTERVAL_MS_SLACK + SLACK,
    )
    .await;
    let fresh = traffic(addr, &[], &mut next_id, 8, SLACK).await;
    assert!(fresh.iter().any(|n| n == "a"), "{fresh:?}");
    let metrics = metrics_text(&l).await;
    for to in ["down", "up"] {
        assert_eq!(transitions(&metrics, "a", to), 1, "a's transitions {to}");
    }
    l.stop().await;
    b.kill().await;
}
