//! `limpet run -c FILE` as a process: binds every listener (port 0 here), prints where,
//! serves, and on SIGTERM drains and saves its table snapshot.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::multiport::*;

#[tokio::test]
async fn limpet_run_serves_a_config_and_saves_its_snapshot_on_sigterm() {
    let pki = Pki::new();
    let (mut nodes, ports) = start_nodes(
        &[("a", "127.0.0.2"), ("b", "127.0.0.3")],
        pki.server("n", &["127.0.0.2"]),
    )
    .await;
    let dir = TempDir::new("run-cli");
    let text = format!(
        "[[nodes]]\nname = \"a\"\naddress = \"127.0.0.2\"\n[[nodes]]\nname = \"b\"\naddress = \"127.0.0.3\"\n[[tables]]\nname = \"t\"\nkey = \"source-ip\"\nsnapshot = \"t.snapshot\"\n[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = {}\ntable = \"t\"\n[[listeners]]\nname = \"raw\"\nbind = \"127.0.0.1:0\"\nmode = \"tcp\"\nnode_port = {}\ntable = \"t\"\n",
        ports.http, ports.tcp
    );
    let path = dir.write("limpet.toml", &text);
    let mut child = Command::new(env!("CARGO_BIN_EXE_limpet"))
        .args(["run", "-c"])
        .arg(&path)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn limpet run");
    // Two "listening on ADDR (listener NAME)" lines, read off the async workers.
    let listening = listening(&mut child, 2).await;
    let (web, raw) = (listening.addr("web"), listening.addr("raw"));
    let home = http_node("127.0.0.99", web).await;
    assert_eq!(
        tcp_session("127.0.0.99", raw).await.1,
        home,
        "one table across both listeners"
    );

    let pid = child.id().to_string();
    let status = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(status.success());
    let exit = tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(s) = child.try_wait().expect("wait") {
                return Some(s);
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    })
    .await
    .expect("waiter");
    assert!(
        exit.is_some_and(|s| s.success()),
        "clean exit on SIGTERM: {exit:?}"
    );
    assert!(
        dir.path().join("t.snapshot").exists(),
        "snapshot saved on shutdown"
    );
    for n in &mut nodes {
        n.kill().await;
    }
}

/// A second `limpet run` on an address a running one listens on stops at once with an error
/// naming the address, and the first goes on serving alone. With worker threads every socket
/// is bound with `SO_REUSEPORT`, which used to let the second bind beside the first without a
/// word: the kernel then dealt new clients between two processes, each with a source-IP table
/// of its own, and one client's connections landed on two nodes.
#[tokio::test]
async fn a_second_limpet_on_a_listened_address_is_refused_and_the_first_serves_on() {
    let pki = Pki::new();
    let (mut nodes, ports) = start_nodes(
        &[("a", "127.0.0.2"), ("b", "127.0.0.3")],
        pki.server("n", &["127.0.0.2"]),
    )
    .await;
    let dir = TempDir::new("run-twice");
    let text = |web: &str| {
        format!(
            "[[nodes]]\nname = \"a\"\naddress = \"127.0.0.2\"\n[[nodes]]\nname = \"b\"\naddress = \"127.0.0.3\"\n[[tables]]\nname = \"t\"\nkey = \"source-ip\"\n[[listeners]]\nname = \"web\"\nbind = \"{web}\"\nnode_port = {}\ntable = \"t\"\n",
            ports.http
        )
    };
    let spawn = |path: &std::path::Path| {
        Command::new(env!("CARGO_BIN_EXE_limpet"))
            .args(["run", "--threads", "2", "-c"])
            .arg(path)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn limpet run")
    };
    let mut first = Reaped(spawn(&dir.write("first.toml", text("127.0.0.1:0"))));
    let stdout = first.0.stdout.take().expect("stdout");
    let line = tokio::task::spawn_blocking(move || {
        BufReader::new(stdout)
            .lines()
            .next()
            .and_then(Result::ok)
            .unwrap_or_default()
    })
    .await
    .expect("read stdout");
    let web: std::net::SocketAddr = line
        .split(' ')
        .nth(2)
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    let home = http_node("127.0.0.99", web).await;

    let second_path = dir.write("second.toml", text(&web.to_string()));
    let second = spawn(&second_path);
    let out = tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let mut second = second;
        loop {
            if second.try_wait().expect("wait").is_some() {
                return Ok(second.wait_with_output().expect("output"));
            }
            if std::time::Instant::now() > deadline {
                let _ = second.kill();
                return Err(second.wait_with_output().expect("output"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    })
    .await
    .expect("waiter")
    .unwrap_or_else(|out| {
        panic!(
            "the second limpet kept running beside the first: {}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!("cannot bind {web}")) && err.contains("another socket listens"),
        "{err}"
    );
    // Named as a config error is: the file, the line and column of the listener's `bind`
    // (line 12: after two nodes, a table and the listener's name), and its key.
    assert!(
        err.contains(&format!(
            "{}:12:8: listeners[0].bind: listener \"web\": cannot bind {web}",
            second_path.display()
        )),
        "{err}"
    );
    for _ in 0..20 {
        assert_eq!(
            http_node("127.0.0.99", web).await,
            home,
            "the first limpet serves alone, its pin kept"
        );
    }

    drop(first);
    for n in &mut nodes {
        n.kill().await;
    }
}

/// The listeners' addresses from the first `n` lines `child` prints (`listening on ADDR
/// (listener NAME)`), by listener name.
async fn listening(child: &mut std::process::Child, n: usize) -> Listening {
    let stdout = child.stdout.take().expect("stdout");
    let lines = tokio::task::spawn_blocking(move || {
        BufReader::new(stdout)
            .lines()
            .take(n)
            .map(|l| l.unwrap_or_default())
            .collect::<Vec<_>>()
    })
    .await
    .expect("read stdout");
    Listening(lines)
}

struct Listening(Vec<String>);

impl Listening {
    /// The admin listener's address (`admin on ADDR`).
    fn admin(&self) -> std::net::SocketAddr {
        self.0
            .iter()
            .find_map(|l| l.strip_prefix("admin on "))
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("no admin address in {:?}", self.0))
    }

    fn addr(&self, name: &str) -> std::net::SocketAddr {
        self.0
            .iter()
            .find(|l| l.ends_with(&format!("(listener {name})")))
            .and_then(|l| l.split(' ').nth(2))
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("no address for {name} in {:?}", self.0))
    }
}

/// `limpet run -c path` with one worker thread and its access log on: the process, its
/// access lines, and the first `n` lines it printed (where it listens).
async fn run_logged(path: &std::path::Path, n: usize) -> (Reaped, common::AccessLines, Listening) {
    let mut child = Reaped(
        Command::new(env!("CARGO_BIN_EXE_limpet"))
            .args(["run", "--threads", "1", "-c"])
            .arg(path)
            .env("RUST_LOG", "warn,limpet::access=info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn limpet run"),
    );
    let lines = common::AccessLines::of(child.0.stderr.take().expect("stderr"));
    let listening = listening(&mut child.0, n).await;
    (child, lines, listening)
}

/// An access line's `total_ms`.
fn total_ms(line: &str) -> f64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("total_ms="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no total_ms in {line:?}"))
}

/// A child process killed (by its PID) and reaped when the test ends, also on a panic.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// An echo node on loopback: what comes goes back, and each session closes once its client
/// has. Its port, and the task that accepts (aborted, the port closes; sessions go on).
async fn echo_node() -> (u16, tokio::task::JoinHandle<()>) {
    let node = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind node");
    let port = node.local_addr().expect("node addr").port();
    let accepting = tokio::spawn(async move {
        while let Ok((mut s, _)) = node.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    (port, accepting)
}

/// A TCP session through `addr` with two bytes echoed by its node, held open by the client.
async fn echoed_session(addr: std::net::SocketAddr) -> tokio::net::TcpStream {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut c = tokio::net::TcpStream::connect(addr).await.expect("connect");
    c.write_all(b"hi").await.expect("send");
    let mut back = [0u8; 2];
    c.read_exact(&mut back).await.expect("echo");
    c
}

/// One node as the running limpet's admin API shows it and takes commands for it.
struct NodeAdmin {
    client: reqwest::Client,
    url: String,
}

impl NodeAdmin {
    fn new(listening: &Listening, node: &str) -> Self {
        NodeAdmin {
            client: reqwest::Client::builder()
                .no_proxy()
                .build()
                .expect("client"),
            url: format!("http://{}/api/v1/nodes/{node}", listening.admin()),
        }
    }

    /// Posts a state command (`{"state":"maint"}`), which must be taken.
    async fn set(&self, body: &'static str) {
        let r = self
            .client
            .post(format!("{}/state", self.url))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("admin");
        assert_eq!(r.status().as_u16(), 200, "{body}");
    }

    async fn view(&self) -> serde_json::Value {
        let body = self
            .client
            .get(&self.url)
            .send()
            .await
            .expect("admin")
            .bytes()
            .await
            .expect("node view");
        serde_json::from_slice(&body).expect("json")
    }

    /// Waits (at most 500 looks, 10 ms apart) until `n` connections wait in the node's queue.
    async fn until_queued(&self, n: u64) {
        for _ in 0..500 {
            if self.view().await["queued"].as_u64() == Some(n) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{n} connections never queued for the node");
    }
}

/// A TCP session gets an access log line when it ends (HAProxy's `option tcplog`), saying
/// how: both sides closed (`end=done`, the bytes each way), nothing moved for the
/// listener's `idle` (`end=idle`), the client stopped reading for `idle` (`end=
/// client-stalled`) or its node did (`end=node-stalled`), no node took it (`end=no-node`), its node's queue refused it
/// (`end=queue-timeout`), or limpet cut it (`end=cut`: its node set to MAINT, `cut=
/// node-maint`; a shutdown's drain deadline, `cut=shutdown`, also for a connection still in
/// its node's queue then). Before, a TCP session wrote no access log line at all, and one still
/// queued at the drain's end was dropped without one a second later.
#[tokio::test]
async fn a_tcp_session_s_access_log_line_says_how_it_ended() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (node_port, echo) = echo_node().await;
    // A node that writes more than any buffer on the way holds, whether or not its client
    // reads.
    let flood = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind flood node");
    let flood_port = flood.local_addr().expect("flood addr").port();
    let flooding = tokio::spawn(async move {
        while let Ok((mut s, _)) = flood.accept().await {
            tokio::spawn(async move {
                let chunk = vec![b'x'; 1 << 20];
                for _ in 0..64 {
                    if s.write_all(&chunk).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    // A node that never reads what its client sends, and sends a byte every 100 ms.
    let deaf = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind deaf node");
    let deaf_port = deaf.local_addr().expect("deaf addr").port();
    let deafening = tokio::spawn(async move {
        while let Ok((mut s, _)) = deaf.accept().await {
            tokio::spawn(async move {
                for _ in 0..200 {
                    if s.write_all(b".").await.is_err() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            });
        }
    });
    // A port nobody listens on: bound without listening, so that connections to it are
    // refused and no other test takes it meanwhile.
    let dead = tokio::net::TcpSocket::new_v4().expect("socket");
    dead.bind("127.0.0.1:0".parse().expect("address"))
        .expect("bind");
    let dead_port = dead.local_addr().expect("dead addr").port();
    let dir = TempDir::new("tcp-access");
    let path = dir.write(
        "limpet.toml",
        format!(
            "[[nodes]]\nname = \"a\"\naddress = \"127.0.0.1\"\nmax_connections = 1\n\
             [[listeners]]\nname = \"raw\"\nbind = \"127.0.0.1:0\"\nmode = \"tcp\"\n\
             node_port = {node_port}\ntimeouts = {{ idle = \"2s\" }}\n\
             [[listeners]]\nname = \"held\"\nbind = \"127.0.0.1:0\"\nmode = \"tcp\"\n\
             node_port = {node_port}\n\
             timeouts = {{ idle = \"60s\", drain = \"200ms\", queue = \"30s\" }}\n\
             [[listeners]]\nname = \"flood\"\nbind = \"127.0.0.1:0\"\nmode = \"tcp\"\n\
             node_port = {flood_port}\ntimeouts = {{ idle = \"1s\" }}\n\
             [[listeners]]\nname = \"deaf\"\nbind = \"127.0.0.1:0\"\nmode = \"tcp\"\n\
             node_port = {deaf_port}\ntimeouts = {{ idle = \"1s\" }}\n\
             [[listeners]]\nname = \"dead\"\nbind = \"127.0.0.1:0\"\nmode = \"tcp\"\n\
             node_port = {dead_port}\n\
             [[listeners]]\nname = \"brief\"\nbind = \"127.0.0.1:0\"\nmode = \"tcp\"\n\
             node_port = {node_port}\ntimeouts = {{ queue = \"300ms\" }}\n\
             [admin]\nlisten = \"127.0.0.1:0\"\n"
        ),
    );
    let (child, lines, listening) = run_logged(&path, 7).await;
    let addr_of = |name: &str| listening.addr(name);
    // A connection the client keeps open until limpet closes it.
    let until_closed = |addr| async move {
        let mut c = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let mut rest = Vec::new();
        let _ = c.read_to_end(&mut rest).await;
    };

    // Five bytes each way, then the client closes and the node follows.
    let mut c = tokio::net::TcpStream::connect(addr_of("raw"))
        .await
        .expect("connect");
    c.write_all(b"hello").await.expect("send");
    let mut back = [0u8; 5];
    c.read_exact(&mut back).await.expect("echo");
    c.shutdown().await.expect("shutdown");
    let mut rest = Vec::new();
    c.read_to_end(&mut rest).await.expect("the session ends");
    common::has_fields(
        &lines.next().await,
        &[
            "listener=raw",
            "node=a",
            "pin=round-robin",
            "bytes_in=5",
            "bytes_out=5",
            "end=done",
            "cut=-",
        ],
    );

    // Nothing either way: closed at the listener's idle.
    until_closed(addr_of("raw")).await;
    let line = lines.next().await;
    common::has_fields(
        &line,
        &[
            "listener=raw",
            "node=a",
            "bytes_in=0",
            "bytes_out=0",
            "end=idle",
        ],
    );
    assert!(total_ms(&line) >= 2000.0, "{line:?}");

    // A client that sends a byte every 100 ms (the session is not idle) and never reads
    // what its node sends: closed once that has stalled for the listener's idle. (Quiet
    // both ways, a stall reads as `idle`.)
    let mut stalled = tokio::net::TcpStream::connect(addr_of("flood"))
        .await
        .expect("connect");
    let sending = tokio::spawn(async move {
        for _ in 0..100 {
            if stalled.write_all(b".").await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let line = lines.next().await;
    common::has_fields(&line, &["listener=flood", "node=a", "end=client-stalled"]);
    assert!(total_ms(&line) >= 1000.0, "{line:?}");
    sending.abort();

    // The other way round: a client that reads all its node sends (a byte every 100 ms) and
    // sends more than the node, which never reads, can take: closed once its node has
    // stopped reading for the listener's idle.
    let flooding_up = tokio::net::TcpStream::connect(addr_of("deaf"))
        .await
        .expect("connect");
    let (mut down, mut up) = flooding_up.into_split();
    let sending = tokio::spawn(async move {
        let chunk = vec![b'y'; 64 * 1024];
        // At most 64 MiB: far more than the buffers on the way hold.
        for _ in 0..1024 {
            if up.write_all(&chunk).await.is_err() {
                return;
            }
        }
    });
    let reading = tokio::spawn(async move {
        let mut sink = [0u8; 1024];
        while matches!(down.read(&mut sink).await, Ok(n) if n > 0) {}
    });
    let line = lines.next().await;
    common::has_fields(&line, &["listener=deaf", "node=a", "end=node-stalled"]);
    assert!(total_ms(&line) >= 1000.0, "{line:?}");
    sending.abort();
    reading.abort();

    // The only node refuses this listener's port: no session.
    until_closed(addr_of("dead")).await;
    common::has_fields(
        &lines.next().await,
        &["listener=dead", "node=-", "pin=-", "end=no-node"],
    );

    let node_a = NodeAdmin::new(&listening, "a");
    // An open session holds node a's one slot (`max_connections = 1`): a connection to a
    // listener whose queue waits 300 ms is refused at that. Then the node is set to MAINT,
    // which cuts the open session. (Sessions held across steps are on `held`, whose idle
    // limit no slow step reaches.)
    let mut holder = echoed_session(addr_of("held")).await;
    until_closed(addr_of("brief")).await;
    let line = lines.next().await;
    common::has_fields(
        &line,
        &["listener=brief", "node=a", "pin=-", "end=queue-timeout"],
    );
    assert!(total_ms(&line) >= 300.0, "{line:?}");
    node_a.set(r#"{"state":"maint"}"#).await;
    let mut rest = Vec::new();
    let _ = holder.read_to_end(&mut rest).await;
    common::has_fields(
        &lines.next().await,
        &[
            "listener=held",
            "node=a",
            "bytes_in=2",
            "bytes_out=2",
            "end=cut",
            "cut=node-maint",
        ],
    );
    node_a.set(r#"{"state":"ready"}"#).await;

    // Open at SIGTERM: cut (reset) at the drain's deadline.
    let mut c = echoed_session(addr_of("held")).await;
    // And one waiting in the node's queue behind it (`max_connections = 1`), seen there by
    // the admin API.
    let queued = tokio::spawn(until_closed(addr_of("held")));
    node_a.until_queued(1).await;
    let status = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let mut rest = Vec::new();
    let _ = c.read_to_end(&mut rest).await;
    // The two lines in either order: the open session's and the queued connection's.
    let (first, second) = (lines.next().await, lines.next().await);
    let (open, waiting) = if first.contains("bytes_in=2") {
        (first, second)
    } else {
        (second, first)
    };
    common::has_fields(
        &open,
        &[
            "listener=held",
            "bytes_in=2",
            "bytes_out=2",
            "end=cut",
            "cut=shutdown",
        ],
    );
    assert!(total_ms(&open) >= 200.0, "{open:?}");
    common::has_fields(
        &waiting,
        &[
            "listener=held",
            "node=a",
            "pin=-",
            "bytes_in=0",
            "bytes_out=0",
            "end=cut",
            "cut=shutdown",
        ],
    );
    // Cut when the open session was: it came later, so its line counts no longer.
    assert!(
        total_ms(&waiting) <= total_ms(&open) + 100.0,
        "{waiting:?} {open:?}"
    );
    tokio::time::timeout(Duration::from_secs(5), queued)
        .await
        .expect("the queued client's connection closed")
        .expect("queued client");

    drop(child);
    drop(dead);
    echo.abort();
    flooding.abort();
    deafening.abort();
}

/// The rest of a TCP session's ends, on the real binary: a drain's deadline cuts an open
/// session (`end=cut cut=drain-ended`); a connection that finds its node's one slot taken and
/// its queue (`max_queue = 1`) full is refused at once (`end=queue-full`); the node going DOWN
/// by its checks cuts the open session (`end=cut cut=node-down`, `close_on_node_down` being
/// on by default) and lets the connection queued for it go, with no other node to take it
/// (`end=no-node`).
#[tokio::test]
async fn a_tcp_session_cut_by_its_node_s_state_or_refused_by_a_full_queue_says_why() {
    use tokio::io::AsyncReadExt;
    // Its listener closes when `accepting` is aborted; its sessions go on.
    let (node_port, accepting) = echo_node().await;
    // Checked every 100 ms, node a goes DOWN at its first refused check; the 1 s timeout
    // keeps one slow check on a loaded machine from doing it early.
    let dir = TempDir::new("tcp-cuts");
    let path = dir.write(
        "limpet.toml",
        format!(
            "[health]\nfall = 1\nrise = 1\ninterval = \"100ms\"\ntimeout = \"1s\"\n\
             [[nodes]]\nname = \"a\"\naddress = \"127.0.0.1\"\nmax_connections = 1\n\
             max_queue = 1\n\
             [[listeners]]\nname = \"held\"\nbind = \"127.0.0.1:0\"\nmode = \"tcp\"\n\
             node_port = {node_port}\ncheck = {{ kind = \"tcp\" }}\n\
             timeouts = {{ idle = \"60s\", queue = \"30s\" }}\n\
             [admin]\nlisten = \"127.0.0.1:0\"\n"
        ),
    );
    let (child, lines, listening) = run_logged(&path, 2).await;
    let held = listening.addr("held");
    let until_closed = |mut c: tokio::net::TcpStream| async move {
        let mut rest = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut rest)).await;
    };
    let node_a = NodeAdmin::new(&listening, "a");

    // A drain with a 500 ms deadline: the open session is cut then.
    let c = echoed_session(held).await;
    node_a
        .set(r#"{"state":"drain","deadline_secs":0.5,"spread_secs":0}"#)
        .await;
    until_closed(c).await;
    let line = lines.next().await;
    common::has_fields(
        &line,
        &[
            "listener=held",
            "node=a",
            "bytes_in=2",
            "bytes_out=2",
            "end=cut",
            "cut=drain-ended",
        ],
    );
    assert!(total_ms(&line) >= 500.0, "{line:?}");
    node_a.set(r#"{"state":"ready"}"#).await;

    // The one slot held, one connection in the queue (seen there by the admin API): the next
    // is refused at once.
    let holder = echoed_session(held).await;
    let queued = tokio::net::TcpStream::connect(held).await.expect("connect");
    node_a.until_queued(1).await;
    let refused = tokio::net::TcpStream::connect(held).await.expect("connect");
    until_closed(refused).await;
    let line = lines.next().await;
    common::has_fields(
        &line,
        &["listener=held", "node=a", "pin=-", "end=queue-full"],
    );
    assert!(total_ms(&line) < 1000.0, "refused at once: {line:?}");

    // The node's port closes: its check fails, it goes DOWN, and both go.
    accepting.abort();
    tokio::join!(until_closed(holder), until_closed(queued));
    let (first, second) = (lines.next().await, lines.next().await);
    let (cut, let_go) = if first.contains("bytes_in=2") {
        (first, second)
    } else {
        (second, first)
    };
    common::has_fields(
        &cut,
        &["listener=held", "node=a", "end=cut", "cut=node-down"],
    );
    common::has_fields(&let_go, &["listener=held", "node=-", "end=no-node"]);
    assert_eq!(node_a.view().await["health"]["down_cause"], "checks");
    drop(child);
}

/// An answer cut mid-body says whose end it was. One whose node stops sending is cut at the
/// listener's `answer_body_idle` (HAProxy's `timeout server`): the HTTP/1 client gets the head
/// and the bytes that came, then its connection closes (the answer cannot end cleanly), and
/// the access line keeps the status the client got with `end=node-idle` and the bytes that
/// went out. One whose client stops its own upload is ended at `client_idle` with the node
/// connection, and says `end=client-body`. Before, the line was written at the head and read
/// as a plain 200 in both.
#[tokio::test]
async fn an_answer_cut_mid_body_is_logged_with_whose_end_it_was() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // A node that answers every request with 10 bytes of 100 without reading a body, then
    // holds its connection open.
    let node = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind node");
    let node_port = node.local_addr().expect("node addr").port();
    let (held_tx, mut held_rx) = tokio::sync::mpsc::unbounded_channel();
    let serving = tokio::spawn(async move {
        while let Ok((mut s, _)) = node.accept().await {
            let held_tx = held_tx.clone();
            tokio::spawn(async move {
                let _ = common::read_request_head(&mut s).await;
                let partial = b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n0123456789";
                if s.write_all(partial).await.is_ok() {
                    let _ = held_tx.send(s);
                }
            });
        }
    });
    let dir = TempDir::new("body-ends");
    let path = dir.write(
        "limpet.toml",
        format!(
            "[[nodes]]\nname = \"a\"\naddress = \"127.0.0.1\"\n\
             [[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = {node_port}\n\
             timeouts = {{ answer_body_idle = \"5s\", client_idle = \"1s\" }}\n"
        ),
    );
    let (child, lines, listening) = run_logged(&path, 1).await;
    // Sends `request`, keeps the connection open, and returns what came back until limpet
    // closed it.
    let exchange = |request: &'static [u8]| {
        let addr = listening.addr("web");
        async move {
            let mut c = tokio::net::TcpStream::connect(addr).await.expect("connect");
            c.write_all(request).await.expect("send");
            let mut got = Vec::new();
            tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut got))
                .await
                .expect("the connection closes within the test")
                .expect("read");
            String::from_utf8_lossy(&got).into_owned()
        }
    };

    let got = exchange(b"GET /held HTTP/1.1\r\nHost: print.example\r\n\r\n").await;
    assert!(got.starts_with("HTTP/1.1 200"), "{got:?}");
    assert!(
        got.ends_with("\r\n\r\n0123456789"),
        "the 10 bytes that came, then the close: {got:?}"
    );
    let line = lines.next().await;
    common::has_fields(
        &line,
        &[
            "method=GET",
            "node=a",
            "status=200",
            "bytes=10",
            "end=node-idle",
        ],
    );
    assert!(
        total_ms(&line) >= 5000.0,
        "cut at answer_body_idle: {line:?}"
    );

    // 10 bytes of an announced 100, then nothing more from the client.
    let got = exchange(
        b"POST /upload HTTP/1.1\r\nHost: print.example\r\ncontent-length: 100\r\n\r\n0123456789",
    )
    .await;
    assert!(
        got.starts_with("HTTP/1.1 200") && got.ends_with("\r\n\r\n0123456789"),
        "the node's head and 10 bytes, then the close: {got:?}"
    );
    let line = lines.next().await;
    common::has_fields(
        &line,
        &[
            "method=POST",
            "node=a",
            "status=200",
            "bytes=10",
            "end=client-body",
        ],
    );
    let t = total_ms(&line);
    assert!(
        (1000.0..5000.0).contains(&t),
        "ended at client_idle, before answer_body_idle: {line:?}"
    );
    drop(child);
    held_rx.close();
    while held_rx.recv().await.is_some() {}
    serving.abort();
}

/// An admin listener that cannot bind (another process listens there) stops `limpet run`
/// with the file, line and column of `admin.listen` and its key, as a listener's bind error
/// does. Before, it named the address only.
#[test]
fn an_admin_listener_that_cannot_bind_names_its_place() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("hold a port");
    let addr = taken.local_addr().expect("addr");
    let dir = TempDir::new("admin-bind");
    let text = format!(
        "[[nodes]]\nname = \"a\"\naddress = \"127.0.0.2\"\n[[listeners]]\nname = \"web\"\n\
         bind = \"127.0.0.1:0\"\nnode_port = 80\n[admin]\nlisten = \"{addr}\"\n"
    );
    let path = dir.write("limpet.toml", &text);
    let mut child = Command::new(env!("CARGO_BIN_EXE_limpet"))
        .args(["run", "-c"])
        .arg(&path)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn limpet run");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("limpet run kept running with its admin address taken");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        std::io::Read::read_to_string(&mut e, &mut err).expect("stderr");
    }
    assert!(!status.success(), "{err}");
    // Line 9, after the node, the listener and `[admin]`; column 10, the value.
    assert!(
        err.contains(&format!(
            "{}:9:10: admin.listen: admin listener: cannot bind {addr}",
            path.display()
        )),
        "{err}"
    );
    drop(taken);
}
