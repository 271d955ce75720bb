//! The real `limpet run` binary and signals: SIGHUP reloads the configuration (a bad one is
//! refused and the running one stays); SIGTERM stops accepting, lets the request in flight
//! finish, closes the WebSocket tunnel with 1001 (after the frame in flight), and exits 0,
//! also while a SIGHUP's reload is blocked reading its file; a crash is survived through the
//! periodic snapshot. And the binary's log: a reader of its stderr that stops reading
//! stops no traffic.

mod admin_common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use admin_common::lifecycle::*;
use futures_util::StreamExt;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message;

const NODES: [(&str, &str); 3] = [("a", "127.0.0.2"), ("b", "127.0.0.3"), ("c", "127.0.0.4")];

fn config(port: u16, nodes: &[(&str, &str)]) -> String {
    format!(
        "{}[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = {port}\n\
         timeouts = {{ drain = \"10s\" }}\n\n[admin]\nlisten = \"127.0.0.1:0\"\n",
        nodes_toml(nodes)
    )
}

/// The limpet process; killed (SIGKILL, by its own handle) if the test ends early.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn signal(child: &Child, sig: &str) {
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(child.id().to_string())
        .status()
        .unwrap_or_else(|e| panic!("kill: {e}"));
    assert!(status.success());
}

/// Starts `limpet run -c FILE`; returns it with its web and admin addresses.
async fn run(cfg: &ConfigFile) -> (Proc, SocketAddr, SocketAddr) {
    run_logging(cfg, "warn", Stdio::null()).await
}

/// Starts `limpet run -c FILE` with `RUST_LOG` and its stderr given.
async fn run_logging(
    cfg: &ConfigFile,
    rust_log: &str,
    stderr: Stdio,
) -> (Proc, SocketAddr, SocketAddr) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_limpet"))
        .args(["run", "-c"])
        .arg(&cfg.path)
        .env("RUST_LOG", rust_log)
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap_or_else(|e| panic!("limpet run: {e}"));
    let out = child.stdout.take();
    let proc = Proc(child);
    let rx = printed_addresses(out);
    let (web, admin) = tokio::time::timeout(PATIENCE, rx)
        .await
        .unwrap_or_else(|_| panic!("limpet did not start"))
        .unwrap_or_else(|_| panic!("limpet exited before listening"));
    (proc, web, admin)
}

/// Polls the admin API (bounded) until `done` holds.
async fn until(url: &str, what: &str, done: impl Fn(&serde_json::Value, &str) -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let r = bare_client().get(url).send().await;
        let text = match r {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        let v = serde_json::from_str(&text).unwrap_or(serde_json::Value::Null);
        if done(&v, &text) {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{what}: {text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits (bounded) for the process to exit, and asserts it exited 0.
async fn exits_0(proc: &mut Proc) {
    let deadline = std::time::Instant::now() + PATIENCE;
    let code = loop {
        if let Some(s) = proc.0.try_wait().unwrap_or(None) {
            break s;
        }
        assert!(std::time::Instant::now() < deadline, "limpet did not exit");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(code.success(), "{code:?}");
}

/// Until the admin API at `admin` counts one reload applied.
async fn until_reloaded(admin: SocketAddr) {
    until(
        &format!("http://{admin}/metrics"),
        "the reload applied",
        |_, text| text.contains(r#"limpet_config_reloads_total{result="ok"} 1"#),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_and_sigterm_shuts_down_gracefully() {
    let (_nodes, port) = backend_nodes(&NODES).await;
    let cfg = ConfigFile::new("signals", &config(port, &NODES[..2]));
    let (mut proc, web, admin) = run(&cfg).await;
    let nodes_url = format!("http://{admin}/api/v1/nodes");
    assert_eq!(json(&nodes_url).await.as_array().map(Vec::len), Some(2));

    // SIGHUP with a node added: applied.
    cfg.write(&config(port, &NODES));
    signal(&proc.0, "HUP");
    until(&nodes_url, "node c after SIGHUP", |v, _| {
        v.as_array().map(Vec::len) == Some(3)
    })
    .await;
    // SIGHUP with a broken file: refused, the running config stays.
    cfg.write("[[nodes]]\nname = \n");
    signal(&proc.0, "HUP");
    until(
        &format!("http://{admin}/metrics"),
        "refused reload counted",
        |_, text| text.contains(r#"limpet_config_reloads_total{result="refused"} 1"#),
    )
    .await;
    assert_eq!(json(&nodes_url).await.as_array().map(Vec::len), Some(3));

    // In flight at SIGTERM: a slow request and a WebSocket.
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{web}/ws"))
        .await
        .unwrap_or_else(|e| panic!("websocket: {e}"));
    let first = tokio::time::timeout(PATIENCE, ws.next()).await;
    assert!(matches!(first, Ok(Some(Ok(Message::Text(_))))), "{first:?}");
    let slow = slow_get(web, 800);
    until(&nodes_url, "the slow request in flight", |v, _| {
        let active: u64 = v
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|n| n["active_connections"].as_u64().unwrap_or(0))
                    .sum()
            })
            .unwrap_or(0);
        let tunnels: u64 = v
            .as_array()
            .map(|a| a.iter().map(|n| n["tunnels"].as_u64().unwrap_or(0)).sum())
            .unwrap_or(0);
        active >= 2 && tunnels == 1
    })
    .await;
    signal(&proc.0, "TERM");

    // The WebSocket is closed cleanly, with 1001.
    let m = tokio::time::timeout(PATIENCE, ws.next())
        .await
        .unwrap_or_else(|_| panic!("no close frame"));
    match m {
        Some(Ok(Message::Close(Some(f)))) => {
            assert_eq!(f.code, CloseCode::Away);
            assert_eq!(f.reason.as_ref(), "limpet shutting down");
        }
        other => panic!("expected close 1001, got {other:?}"),
    }
    // The request in flight finishes.
    let status = tokio::time::timeout(PATIENCE, slow)
        .await
        .unwrap_or_else(|_| panic!("slow request hung"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(status.ok(), Some(200));
    // And the process exits 0.
    exits_0(&mut proc).await;
    // Nothing accepts any more.
    assert!(tokio::net::TcpStream::connect(web).await.is_err());
}

/// A reload that lengthens `drain` reaches the HTTP listeners already serving: a request in
/// flight at the SIGTERM that follows has the new drain to finish in. Before, an HTTP
/// listener bounded its drain by the `drain` it started with (TCP listeners read it at the
/// drain), and the request was cut at the old 1 s with no answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_lengthened_by_a_reload_lets_the_request_in_flight_finish() {
    let (_nodes, port) = backend_nodes(&NODES[..1]).await;
    let short = config(port, &NODES[..1]).replace("drain = \"10s\"", "drain = \"1s\"");
    let cfg = ConfigFile::new("drain-reload", &short);
    let (mut proc, web, admin) = run(&cfg).await;
    cfg.write(&config(port, &NODES[..1]));
    signal(&proc.0, "HUP");
    until_reloaded(admin).await;

    let slow = slow_get(web, 2500);
    until(
        &format!("http://{admin}/api/v1/nodes/a"),
        "the slow request in flight",
        |v, _| v["active_connections"] == 1,
    )
    .await;
    signal(&proc.0, "TERM");
    let status = tokio::time::timeout(PATIENCE, slow)
        .await
        .unwrap_or_else(|_| panic!("slow request hung"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        status.ok(),
        Some(200),
        "answered within the reloaded drain (10 s), not cut at the first (1 s)"
    );
    exits_0(&mut proc).await;
}

/// The failure model's crash and restart: a `limpet run` killed with SIGKILL (no shutdown,
/// no final save) comes back with the pins of its last periodic snapshot, which it writes
/// every `snapshot_interval` (1 s here, the least allowed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_and_restart_brings_the_pins_back_from_the_periodic_snapshot() {
    let (_nodes, port) = backend_nodes(&NODES[..2]).await;
    let text = format!(
        "{}[[tables]]\nname = \"t\"\nkey = \"source-ip\"\nsnapshot = \"t.snapshot\"\n\
         snapshot_interval = \"1s\"\n\n[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\n\
         node_port = {port}\ntable = \"t\"\n\n[admin]\nlisten = \"127.0.0.1:0\"\n",
        nodes_toml(&NODES[..2])
    );
    let cfg = ConfigFile::new("crash", &text);
    let (proc, web, _) = run(&cfg).await;
    pins_survive_a_crash(&cfg, proc, web, ["127.0.0.91", "127.0.0.92"]).await;
}

/// Two clients (`clients`) pinned in rotation order, so the second is on the node a fresh
/// start does not give first; a periodic save of `t.snapshot` after the pins (within its 1 s
/// interval and 2 s of slack); then SIGKILL (no shutdown, no final save) and a restart: each
/// keeps its node, the second asked first.
async fn pins_survive_a_crash(cfg: &ConfigFile, proc: Proc, web: SocketAddr, clients: [&str; 2]) {
    let snap = cfg.dir.join("t.snapshot");
    let first = node_for(clients[0], web).await;
    let second = node_for(clients[1], web).await;
    assert_ne!(first, second);
    let pinned_at = std::time::SystemTime::now();
    let deadline = tokio::time::Instant::now() + Duration::from_millis(1000 + 2000);
    loop {
        let saved_after = std::fs::metadata(&snap)
            .and_then(|m| m.modified())
            .is_ok_and(|t| t > pinned_at);
        if saved_after {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no snapshot saved within snapshot_interval (1 s) + 2 s of the pins"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The crash: SIGKILL, reaped.
    signal(&proc.0, "KILL");
    drop(proc);

    let (_proc, web, _) = run(cfg).await;
    assert_eq!(
        node_for(clients[1], web).await,
        second,
        "the second client comes first after the restart and keeps its node"
    );
    assert_eq!(node_for(clients[0], web).await, first);
}

/// A periodic snapshot a reload sets up is saved, and a crash after it is survived: the
/// table had no `snapshot` at the start; the reload gives it one, every second. Before, the
/// periodic saves were tasks made at the start for the tables then, so a reload's snapshot was
/// never written until a shutdown, and a crash lost every pin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_periodic_snapshot_a_reload_sets_up_is_saved_and_survives_a_crash() {
    let (_nodes, port) = backend_nodes(&NODES[..2]).await;
    let text = |snapshot: &str| {
        format!(
            "{}[[tables]]\nname = \"t\"\nkey = \"source-ip\"\n{snapshot}\n\
             [[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\n\
             node_port = {port}\ntable = \"t\"\n\n[admin]\nlisten = \"127.0.0.1:0\"\n",
            nodes_toml(&NODES[..2])
        )
    };
    let cfg = ConfigFile::new("reload-snapshot", &text(""));
    let (proc, web, admin) = run(&cfg).await;
    cfg.write(&text(
        "snapshot = \"t.snapshot\"\nsnapshot_interval = \"1s\"\n",
    ));
    signal(&proc.0, "HUP");
    until_reloaded(admin).await;
    pins_survive_a_crash(&cfg, proc, web, ["127.0.0.93", "127.0.0.94"]).await;
}

/// What the operator set survives a crash with `[admin] state_file`: MAINT on b and a
/// DRAIN of c with its deadline, set through the admin API and written at once; after a
/// SIGKILL and a restart, b is MAINT and c DRAIN with the same deadline and spread, and
/// fresh clients go to a alone. A reload that removes c takes it out of the file. Before,
/// every node came back READY and took fresh clients.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_states_survive_a_crash_with_a_state_file() {
    let (_nodes, port) = backend_nodes(&NODES).await;
    let text = |nodes: &[(&str, &str)]| {
        format!(
            "{}[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = {port}\n\n\
             [admin]\nlisten = \"127.0.0.1:0\"\nstate_file = \"nodes.state\"\n",
            nodes_toml(nodes)
        )
    };
    let cfg = ConfigFile::new("node-states", &text(&NODES));
    let file = cfg.dir.join("nodes.state");
    // Until the state file reads as `done` says (bounded).
    let file_until = |what: &'static str, done: fn(&str) -> bool| {
        let file = file.clone();
        async move {
            let deadline = tokio::time::Instant::now() + PATIENCE;
            loop {
                let text = std::fs::read_to_string(&file).unwrap_or_default();
                if done(&text) {
                    return text;
                }
                assert!(tokio::time::Instant::now() < deadline, "{what}: {text:?}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let (proc, _, admin) = run(&cfg).await;
    for (node, body) in [
        ("b", r#"{"state":"maint"}"#),
        (
            "c",
            r#"{"state":"drain","deadline_secs":3600,"spread_secs":5}"#,
        ),
    ] {
        let r = bare_client()
            .post(format!("http://{admin}/api/v1/nodes/{node}/state"))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.status(), 200, "{node}");
    }
    let drain_before = json(&format!("http://{admin}/api/v1/nodes/c")).await["drain"].clone();
    assert!(
        drain_before["deadline_unix_ms"].as_u64().is_some(),
        "{drain_before}"
    );
    file_until("b and c written", |t| {
        t.contains("maint b\n") && t.contains("drain c ")
    })
    .await;
    signal(&proc.0, "KILL");
    drop(proc);

    let (_proc, web, admin) = run(&cfg).await;
    let view = |n: &'static str| {
        let url = format!("http://{admin}/api/v1/nodes/{n}");
        async move { json(&url).await }
    };
    assert_eq!(view("a").await["state"], "UP");
    assert_eq!(view("b").await["state"], "MAINT");
    let c = view("c").await;
    assert_eq!(c["state"], "DRAIN", "{c}");
    assert_eq!(
        c["drain"]["deadline_unix_ms"],
        drain_before["deadline_unix_ms"]
    );
    assert_eq!(c["drain"]["spread_ms"], 5000);
    for i in 0..6 {
        let (s, node, _) = get(&bare_client(), &format!("http://{web}/"), None).await;
        assert_eq!((s, node.as_str()), (200, "a"), "fresh client {i}");
    }
    // A reload without c: the file lists the nodes the running config has.
    cfg.write(&text(&NODES[..2]));
    signal(&_proc.0, "HUP");
    until_reloaded(admin).await;
    file_until("c left out after the reload", |t| {
        t.contains("maint b\n") && !t.contains("drain c ")
    })
    .await;
}

/// A node state the disk refused at first is written once it takes it, with no further
/// change to prompt it: MAINT on b is answered 200 while the state file cannot be written (a
/// directory in place of its temporary file, as a full disk or a read-only one refuses it);
/// once the disk takes it again, the file reads `maint b` within the retry's first seconds,
/// and a SIGKILL then leaves b MAINT after a restart. Before, the write waited for the next
/// change, and the crash brought b back READY.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_state_the_disk_refused_is_written_once_it_takes_it() {
    let (_nodes, port) = backend_nodes(&NODES[..2]).await;
    let text = format!(
        "{}[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = {port}\n\n\
         [admin]\nlisten = \"127.0.0.1:0\"\nstate_file = \"nodes.state\"\n",
        nodes_toml(&NODES[..2])
    );
    let cfg = ConfigFile::new("node-states-retry", &text);
    let file = cfg.dir.join("nodes.state");
    let (mut proc, _, admin) = run_logging(&cfg, "warn", Stdio::piped()).await;
    // Told when the write fails (the warning on limpet's stderr).
    let err = proc.0.stderr.take().expect("stderr");
    let (tx, refused) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            if line.contains("node states not saved") {
                if let Some(tx) = tx.take() {
                    let _ = tx.send(line);
                }
            }
        }
    });
    // The write's temporary file (`nodes.state.tmp.PID`) cannot be created.
    let blocker = cfg.dir.join(format!("nodes.state.tmp.{}", proc.0.id()));
    std::fs::create_dir(&blocker).unwrap_or_else(|e| panic!("{e}"));
    let r = bare_client()
        .post(format!("http://{admin}/api/v1/nodes/b/state"))
        .header("content-type", "application/json")
        .body(r#"{"state":"maint"}"#)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status(), 200);
    // The write was tried and refused: nothing of b in the file.
    tokio::time::timeout(PATIENCE, refused)
        .await
        .expect("the refused write is logged")
        .expect("line");
    assert!(!std::fs::read_to_string(&file)
        .unwrap_or_default()
        .contains("maint b"));
    // The disk takes writes again; nothing else changes.
    std::fs::remove_dir(&blocker).unwrap_or_else(|e| panic!("{e}"));
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !std::fs::read_to_string(&file)
        .unwrap_or_default()
        .contains("maint b\n")
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "b's MAINT never reached the file"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    signal(&proc.0, "KILL");
    drop(proc);
    let (_proc, _, admin) = run(&cfg).await;
    let view = json(&format!("http://{admin}/api/v1/nodes/b")).await;
    assert_eq!(view["state"], "MAINT", "{view}");
}

/// SIGTERM while a SIGHUP's reload cannot read its file (a FIFO with a writer that sends
/// nothing, as a hung network mount would hold it): the reload waits on a task of its own,
/// so the stop is taken at once, and the exit does not wait for the blocked read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_a_reload_whose_read_never_returns_exits_at_once() {
    let (_nodes, port) = backend_nodes(&NODES).await;
    let cfg = ConfigFile::new("blocked-reload", &config(port, &NODES[..2]));
    let (mut proc, _web, admin) = run(&cfg).await;
    // An answer from the admin API: the signal handlers are installed (before it, a SIGHUP
    // would kill the process).
    let nodes = json(&format!("http://{admin}/api/v1/nodes")).await;
    assert_eq!(nodes.as_array().map(Vec::len), Some(2));
    fifo_in_place_of(&cfg.path);
    signal(&proc.0, "HUP");
    // limpet's reload in its read, which waits for bytes that never come while this is open.
    let _writer = fifo_writer_once_read(&cfg.path).await;
    signal(&proc.0, "TERM");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let code = loop {
        if let Some(s) = proc.0.try_wait().unwrap_or(None) {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "limpet did not exit within 5 s of SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(code.success(), "{code:?}");
}

/// The node of [`sigterm_finishes_the_websocket_frame_in_flight_then_closes_with_1001`]: one
/// WebSocket whose first message is a binary frame of `FRAME` bytes, sent in two halves, the
/// second when `go` fires. Returns once the connection ends.
async fn half_a_frame_node(node: tokio::net::TcpListener, go: tokio::sync::oneshot::Receiver<()>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok((mut s, _)) = node.accept().await else {
        return;
    };
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let text = String::from_utf8_lossy(&head).into_owned();
    let key = text
        .lines()
        .find_map(|l| {
            l.strip_prefix("sec-websocket-key: ")
                .or(l.strip_prefix("Sec-WebSocket-Key: "))
        })
        .unwrap_or("")
        .trim()
        .to_owned();
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    let mut out = format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Accept: {accept}\r\n\r\n"
    )
    .into_bytes();
    out.extend_from_slice(&[0x82, 127]);
    out.extend_from_slice(&(FRAME as u64).to_be_bytes());
    out.extend_from_slice(&[0x5a; FRAME / 2]);
    if s.write_all(&out).await.is_err() {
        return;
    }
    let _ = go.await;
    if s.write_all(&[0x5a; FRAME - FRAME / 2]).await.is_err() {
        return;
    }
    while let Ok(n) = s.read(&mut buf).await {
        if n == 0 {
            return;
        }
    }
}

const FRAME: usize = 200_000;

/// SIGTERM in the middle of a WebSocket frame: the client gets the rest of the frame, then
/// close 1001 `limpet shutting down`, and limpet exits 0. A tunnel's task outlives the
/// request that opened it, and the process used to exit ~10 ms after the signal, cutting
/// the frame with no close frame at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_the_websocket_frame_in_flight_then_closes_with_1001() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let node = tokio::net::TcpListener::bind("127.0.0.2:0")
        .await
        .unwrap_or_else(|e| panic!("bind node: {e}"));
    let port = node.local_addr().map(|a| a.port()).unwrap_or(0);
    let (go, went) = tokio::sync::oneshot::channel();
    let node_task = tokio::spawn(half_a_frame_node(node, went));
    let cfg = ConfigFile::new("sigterm-frame", &config(port, &NODES[..1]));
    let (mut proc, web, _admin) = run(&cfg).await;

    let mut c = tokio::net::TcpStream::connect(web)
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"));
    c.write_all(
        b"GET /ws HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
          Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
    )
    .await
    .unwrap_or_else(|e| panic!("upgrade: {e}"));
    // The 101, and the frame's first half under way.
    let mut got = Vec::new();
    let mut buf = vec![0u8; 65536];
    let body_at = tokio::time::timeout(PATIENCE, async {
        loop {
            if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                if got.len() >= i + 4 + 10 + FRAME / 4 {
                    return i + 4;
                }
            }
            match c.read(&mut buf).await {
                Ok(0) | Err(_) => panic!("closed before the frame: {got:?}"),
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no 101 and half a frame"));
    assert!(
        got.starts_with(b"HTTP/1.1 101"),
        "{:?}",
        String::from_utf8_lossy(&got[..body_at])
    );

    signal(&proc.0, "TERM");
    // Once limpet refuses new connections it has taken the signal, with the frame half
    // sent; then the node sends the rest.
    tokio::time::timeout(PATIENCE, async {
        while tokio::net::TcpStream::connect(web).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("limpet still accepts after SIGTERM"));
    let _ = go.send(());
    tokio::time::timeout(PATIENCE, async {
        loop {
            match c.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the tunnel was not closed"));
    let frames = &got[body_at..];
    assert!(
        frames.len() >= 10 + FRAME,
        "the whole frame: {} of {} bytes",
        frames.len().saturating_sub(10),
        FRAME
    );
    assert_eq!(&frames[..2], &[0x82, 127]);
    assert!(frames[10..10 + FRAME].iter().all(|&b| b == 0x5a));
    let close = &frames[10 + FRAME..];
    let reason = b"limpet shutting down";
    assert!(
        close.len() >= 4 + reason.len() && close[0] == 0x88 && close[2..4] == [0x03, 0xe9],
        "then close 1001: {close:?}"
    );
    assert_eq!(&close[4..4 + reason.len()], reason);
    let exited = tokio::time::timeout(PATIENCE, async {
        loop {
            if let Ok(Some(status)) = proc.0.try_wait() {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("limpet did not exit"));
    assert!(exited.success(), "{exited:?}");
    node_task.abort();
}

/// A reader of limpet's stderr that stops reading (a pipe to a hung process) stops no
/// traffic: with the access log on, 3,000 requests write far more than the pipe holds
/// (64 KiB), and every one is answered. Log lines are written by a thread of their own
/// (`limpet::logging`); written in place, the first write to the full pipe blocked the
/// thread serving the listener, and every request after it waited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_reader_that_stops_reading_stops_no_traffic() {
    const REQUESTS: usize = 3_000;
    let (_nodes, port) = backend_nodes(&NODES[..1]).await;
    let cfg = ConfigFile::new("log-stalled", &config(port, &NODES[..1]));
    // The read end of stderr stays open and is never read.
    let (proc, web, admin) = run_logging(&cfg, "info", Stdio::piped()).await;
    let client = bare_client();
    let url = format!("http://{web}/");
    let served = tokio::time::timeout(PATIENCE, async {
        let mut served = 0;
        for _ in 0..REQUESTS {
            let r = client.get(&url).send().await;
            if r.is_ok_and(|r| r.status().as_u16() == 200) {
                served += 1;
            }
        }
        served
    })
    .await
    .expect("every request answered, none held behind the log");
    assert_eq!(served, REQUESTS);
    let metrics = bare_client()
        .get(format!("http://{admin}/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .unwrap_or_default();
    assert!(
        metrics.contains("limpet_log_lines_dropped_total "),
        "the dropped-lines counter is exposed"
    );
    drop(proc);
}

/// A TLS handshake with a node that fails (here: the node speaks plain HTTP, not TLS) is
/// said at the default log level, with the reason: a configuration fault that fails every
/// request to the node (a wrong `ca`, a name the certificate does not cover) must not read
/// as a dead fleet (chaos run: only `node DOWN` and 503s, the reason at `debug`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_tls_handshake_with_a_node_is_logged_with_its_reason() {
    let (_nodes, port) = backend_nodes(&NODES[..1]).await;
    let cfg = ConfigFile::new(
        "node-tls-log",
        &config(port, &NODES[..1]).replace(
            "[admin]",
            "[listeners.upstream_tls]\nca = \"ca.pem\"\n\n[admin]",
        ),
    );
    limpet::tls::write_self_signed(&cfg.dir, "ca", &["127.0.0.2".to_owned()], true)
        .unwrap_or_else(|e| panic!("cert: {e}"));
    let (mut proc, web, _admin) = run_logging(
        &cfg,
        "info,h2=error,hyper=error,rustls=error,tokio_rustls=error",
        Stdio::piped(),
    )
    .await;
    let err = proc.0.stderr.take().expect("stderr");
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            if line.contains("TLS to a node failed") {
                if let Some(tx) = tx.take() {
                    let _ = tx.send(line);
                }
            }
        }
    });
    let (status, _, _) = get(&bare_client(), &format!("http://{web}/"), None).await;
    assert_eq!(status, 503, "no node reachable over TLS");
    let line = tokio::time::timeout(PATIENCE, rx)
        .await
        .expect("the failed handshake is logged")
        .expect("line");
    assert!(
        line.contains("WARN") && line.contains(&format!("node 127.0.0.2:{port} ")),
        "{line}"
    );
    drop(proc);
}

/// SIGTERM, and once limpet logs its shutdown (`shut_down`, from [`shutting_down_line`]),
/// SIGTERM again: the second signal, not one taken for the first.
async fn sigterm_twice(proc: &Proc, shut_down: std::sync::mpsc::Receiver<()>) {
    signal(&proc.0, "TERM");
    tokio::task::spawn_blocking(move || shut_down.recv_timeout(PATIENCE))
        .await
        .expect("join")
        .expect("limpet logs its shutdown");
    signal(&proc.0, "TERM");
}

/// A GET of the backend's `/slow?ms=MS` through `web`, spawned: its status, once answered.
fn slow_get(web: SocketAddr, ms: u64) -> tokio::task::JoinHandle<reqwest::Result<u16>> {
    tokio::spawn(async move {
        bare_client()
            .get(format!("http://{web}/slow?ms={ms}"))
            .send()
            .await
            .map(|r| r.status().as_u16())
    })
}

/// Told of the log's "shutting down" line (`proc` started logging at `info` to a pipe):
/// the first signal was taken, and a second one sent after it is not taken for the first.
fn shutting_down_line(proc: &mut Proc) -> std::sync::mpsc::Receiver<()> {
    let (shutting, shut_down) = std::sync::mpsc::channel::<()>();
    if let Some(err) = proc.0.stderr.take() {
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                if line.contains("shutting down") {
                    let _ = shutting.send(());
                }
            }
        });
    }
    shut_down
}

/// A second SIGTERM during the drain cuts the open TCP sessions as the drain's end would:
/// the node sees its stream reset, not ended. Dropped instead, a session ended with a FIN
/// after the 1,600 bytes the node had, and a print job cut mid-upload looked whole to the
/// node (chaos run 27). The process exits at once, as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sigterm_resets_the_open_tcp_sessions() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let node = tokio::net::TcpListener::bind("127.0.0.2:0")
        .await
        .expect("bind");
    let port = node.local_addr().expect("addr").port();
    let cfg = ConfigFile::new(
        "second-sigterm",
        &format!(
            "{}[[listeners]]\nname = \"raw\"\nbind = \"127.0.0.1:0\"\nmode = \"tcp\"\n\
             node_port = {port}\ntimeouts = {{ drain = \"60s\" }}\n\n\
             [admin]\nlisten = \"127.0.0.1:0\"\n",
            nodes_toml(&NODES[..1])
        ),
    );
    let (mut proc, raw, _admin) = run_logging(&cfg, "info", Stdio::piped()).await;
    let shut_down = shutting_down_line(&mut proc);
    let mut client = tokio::net::TcpStream::connect(raw).await.expect("connect");
    let (mut at_node, _) = tokio::time::timeout(PATIENCE, node.accept())
        .await
        .expect("the session reaches the node")
        .expect("accept");
    client.write_all(&[b'p'; 1600]).await.expect("write");
    let mut got = vec![0u8; 1600];
    tokio::time::timeout(PATIENCE, at_node.read_exact(&mut got))
        .await
        .expect("the job's first bytes reach the node")
        .expect("read");

    sigterm_twice(&proc, shut_down).await;
    let mut byte = [0u8; 1];
    let end = tokio::time::timeout(PATIENCE, at_node.read(&mut byte))
        .await
        .expect("the session ends at the second signal, not at the 60 s drain");
    assert_eq!(
        end.map_err(|e| e.kind()),
        Err(std::io::ErrorKind::ConnectionReset),
        "the node sees the session reset, not a stream that ended whole"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while proc.0.try_wait().unwrap_or(None).is_none() {
        assert!(std::time::Instant::now() < deadline, "limpet did not exit");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(client);
}

/// A second SIGTERM during an HTTP listener's drain ends it too, and the shutdown's snapshot
/// is saved before the exit: with a request in flight for the 60 s drain, limpet exits
/// within seconds of the second signal and a restart finds the pins. Before, only TCP
/// listeners heeded the second signal: the save waited for the HTTP drain, the process
/// exited a second later without it, and every pin since the start was lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sigterm_ends_an_http_drain_and_the_snapshot_is_saved() {
    let (_nodes, port) = backend_nodes(&NODES[..2]).await;
    let cfg = ConfigFile::new(
        "second-sigterm-http",
        &format!(
            "{}[[tables]]\nname = \"t\"\nkey = \"source-ip\"\nsnapshot = \"t.snapshot\"\n\n\
             [[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = {port}\n\
             table = \"t\"\ntimeouts = {{ drain = \"60s\", upstream_answer = \"120s\" }}\n\n\
             [admin]\nlisten = \"127.0.0.1:0\"\n",
            nodes_toml(&NODES[..2])
        ),
    );
    let (mut proc, web, admin) = run_logging(&cfg, "info", Stdio::piped()).await;
    let shut_down = shutting_down_line(&mut proc);
    let clients = ["127.0.0.93", "127.0.0.94"];
    let first = node_for(clients[0], web).await;
    let second = node_for(clients[1], web).await;
    assert_ne!(first, second);
    // In flight for the whole drain: a request its node answers after two minutes.
    let slow = slow_get(web, 120_000);
    until(
        &format!("http://{admin}/api/v1/nodes"),
        "the slow request in flight",
        |v, _| {
            v.as_array().is_some_and(|a| {
                a.iter()
                    .any(|n| n["active_connections"].as_u64().unwrap_or(0) >= 1)
            })
        },
    )
    .await;
    let snap = cfg.dir.join("t.snapshot");
    assert!(!snap.exists(), "no snapshot before the shutdown");
    sigterm_twice(&proc, shut_down).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while proc.0.try_wait().unwrap_or(None).is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "limpet did not exit within 5 s of the second signal"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(snap.exists(), "the shutdown's snapshot was saved");
    slow.abort();
    drop(proc);

    let (_proc, web, _) = run(&cfg).await;
    assert_eq!(node_for(clients[1], web).await, second, "pins came back");
    assert_eq!(node_for(clients[0], web).await, first);
}
