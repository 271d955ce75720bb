//! A node that is a real process, stopped with SIGSTOP under traffic and resumed with
//! SIGCONT: the failure model's hung node, as a stopped process really is (its kernel
//! completes connects into its backlog and takes the bytes of connections already open, and
//! it answers all of them late when it resumes), not a socket that never accepts.
//!
//! Node a is `limpet proxy --sticky none` in front of a demo node (a process of its own, so
//! the signal stops it alone); node b is a demo node in the test. limpet, HTTP-checked, is in
//! front of both.

mod admin_common;

use std::io::BufRead;
use std::net::{IpAddr, SocketAddr};
use std::process::{Command, Stdio};
use std::time::Duration;

use admin_common::lifecycle::*;
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

/// `limpet proxy --sticky none --listen IP:0 --to a=TO`, once it listens: the process and
/// its port.
async fn node_process(ip: &str, to: SocketAddr) -> (Proc, u16) {
    let mut child = Proc(
        Command::new(env!("CARGO_BIN_EXE_limpet"))
            .args(["proxy", "--threads", "1", "--sticky", "none", "--listen"])
            .arg(format!("{ip}:0"))
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
    let started = Instant::now();
    loop {
        let view = node_view(l, "a").await;
        if view["state"] == state {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "node a not {state} within {within:?}: {view}"
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
    let mut gets = JoinSet::new();
    for _ in 0..rounds {
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
        SocketAddr::new(IpAddr::from([127, 0, 0, 2]), a_port),
    )
    .await;
    let mut b = backend_node_again("b", IpAddr::from([127, 0, 0, 13]), port).await;
    let text = format!(
        "{}[health]\nfall = {FALL}\nrise = {RISE}\ninterval = \"{INTERVAL_MS}ms\"\n\
         timeout = \"{TIMEOUT_MS}ms\"\nfail_timeout = \"60s\"\n\n\
         [[listeners]]\nname = \"l\"\nbind = \"127.0.0.1:0\"\nnode_port = {port}\n\
         timeouts = {{ upstream_answer = \"{ANSWER_MS}ms\", drain = \"1s\" }}\n\
         check = {{ kind = \"http\", path = \"/\" }}\n\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n",
        nodes_toml(&[("a", "127.0.0.12"), ("b", "127.0.0.13")])
    );
    let cfg = ConfigFile::new("node-stopped", &text);
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
        let node = get(&c, addr, next_id)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        next_id += 1;
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
        let flips: Vec<&str> = metrics
            .lines()
            .filter(|m| {
                m.starts_with("limpet_health_transitions_total{")
                    && m.contains("node=\"a\"")
                    && m.contains(&format!("to=\"{to}\""))
            })
            .collect();
        assert!(
            flips.len() == 1 && flips[0].ends_with(" 1"),
            "a's transitions {to}: {flips:?}"
        );
    }
    l.stop().await;
    drop(node_a);
    b.kill().await;
    for n in &mut backends {
        n.kill().await;
    }
}

/// The checks' jitter: each interval may run up to a tenth longer.
const INTERVAL_MS_SLACK: Duration = Duration::from_millis(INTERVAL_MS);
