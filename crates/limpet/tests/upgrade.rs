//! Binary upgrades with the real binary: a `limpet run --upgrade-socket PATH` started while
//! another listens at PATH takes over its listening sockets (the same kernel sockets, so no
//! client is refused and none waiting in an accept queue is reset), its pins and its nodes'
//! admin states; the old one drains and exits. A new one that cannot start changes nothing.

mod admin_common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use admin_common::lifecycle::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const NODES: [(&str, &str); 3] = [("a", "127.0.0.2"), ("b", "127.0.0.3"), ("c", "127.0.0.4")];

/// A child killed (SIGKILL, by its own handle) and reaped when dropped.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A `limpet run` process, killed (SIGKILL, by its own handle) if the test ends early.
struct Proc {
    child: Guard,
    web: SocketAddr,
    admin: SocketAddr,
}

impl Proc {
    /// `limpet run -c FILE --upgrade-socket SOCK --threads N`, once it listens: its first
    /// listener's and its admin listener's addresses. Its stderr goes to `tag.err` beside the
    /// config.
    async fn start(cfg: &ConfigFile, sock: &Path, threads: u16, tag: &str) -> Proc {
        Proc::started(spawn(cfg, sock, threads, tag), tag).await
    }

    /// [`start`](Self::start) with one thread, logging at `info`.
    async fn start_logging(cfg: &ConfigFile, sock: &Path, tag: &str) -> Proc {
        Proc::started(spawn_logging(cfg, sock, 1, tag, "info"), tag).await
    }

    /// The process `spawn` made, once it listens.
    async fn started((child, started): (Child, Started), tag: &str) -> Proc {
        // Killed (by the guard) if it does not start.
        let child = Guard(child);
        let (web, admin) = tokio::time::timeout(PATIENCE, started)
            .await
            .unwrap_or_else(|_| panic!("limpet {tag} did not start"))
            .unwrap_or_else(|_| panic!("limpet {tag} exited before listening"));
        Proc { child, web, admin }
    }

    /// Its exit, within `PATIENCE`.
    async fn exited(&mut self) -> ExitStatus {
        exited(&mut self.child.0).await
    }

    fn admin_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.admin)
    }
}

type Started = tokio::sync::oneshot::Receiver<(SocketAddr, SocketAddr)>;

fn spawn(cfg: &ConfigFile, sock: &Path, threads: u16, tag: &str) -> (Child, Started) {
    spawn_logging(cfg, sock, threads, tag, "warn")
}

/// [`spawn`], logging at `level` to `TAG.err` in the config's directory.
fn spawn_logging(
    cfg: &ConfigFile,
    sock: &Path,
    threads: u16,
    tag: &str,
    level: &str,
) -> (Child, Started) {
    let err =
        std::fs::File::create(cfg.dir.join(format!("{tag}.err"))).unwrap_or_else(|e| panic!("{e}"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_limpet"))
        .args(["run", "--threads", &threads.to_string(), "-c"])
        .arg(&cfg.path)
        .arg("--upgrade-socket")
        .arg(sock)
        .env("RUST_LOG", level)
        .stdout(Stdio::piped())
        .stderr(Stdio::from(err))
        .spawn()
        .unwrap_or_else(|e| panic!("limpet run: {e}"));
    let rx = printed_addresses(child.stdout.take());
    (child, rx)
}

async fn exited(child: &mut Child) -> ExitStatus {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if let Some(s) = child.try_wait().unwrap_or_else(|e| panic!("{e}")) {
            return s;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "limpet did not exit within {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn config(port: u16, extra_listener: &str) -> String {
    format!(
        "{}[[tables]]\nname = \"t\"\nkey = \"source-ip\"\n\n[[listeners]]\nname = \"web\"\n\
         bind = \"127.0.0.1:0\"\nnode_port = {port}\ntable = \"t\"\nmax_connections = 1\n\
         timeouts = {{ drain = \"10s\" }}\n\n{extra_listener}[admin]\nlisten = \"127.0.0.1:0\"\n",
        nodes_toml(&NODES)
    )
}

/// POSTs `{"state": state}` to a node's state endpoint `url`: the answer.
async fn post_state(url: &str, state: &str) -> reqwest::Response {
    bare_client()
        .post(url)
        .header("content-type", "application/json")
        .body(format!(r#"{{"state":"{state}"}}"#))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// An upgrade whose config adds a listener at a specific address on the port of a wildcard
/// one it takes over (`127.0.0.1:P` beside `0.0.0.0:P`, a pair a fresh start allows, as
/// nginx's) takes over: the old one exits, and the added listener answers. Before, the check
/// that no other process listens there met the wildcard socket just taken over, and the new
/// limpet refused to start ("another socket listens").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_may_add_a_listener_beside_a_wildcard_one_it_takes_over() {
    let (_nodes, port) = backend_nodes(&NODES).await;
    let p = std::net::TcpListener::bind("0.0.0.0:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("{e}"));
    let web = |extra: &str| {
        format!(
            "{}[[tables]]\nname = \"t\"\nkey = \"source-ip\"\n\n[[listeners]]\nname = \"web\"\n\
             bind = \"0.0.0.0:{p}\"\nnode_port = {port}\ntable = \"t\"\n\n{extra}\
             [admin]\nlisten = \"127.0.0.1:0\"\n",
            nodes_toml(&NODES)
        )
    };
    let cfg = ConfigFile::new("upgrade-overlap", &web(""));
    let sock = upgrade_socket(&cfg);
    let mut old = Proc::start(&cfg, &sock, 1, "old").await;
    cfg.write(&web(&format!(
        "[[listeners]]\nname = \"local\"\nbind = \"127.0.0.1:{p}\"\nnode_port = {port}\n\
         table = \"t\"\n\n"
    )));
    let _new = Proc::start(&cfg, &sock, 1, "new").await;
    assert!(old.exited().await.success());
    let at = SocketAddr::from(([127, 0, 0, 1], p));
    get_once(at)
        .await
        .unwrap_or_else(|e| panic!("the added listener: {e}"));
}

fn upgrade_socket(cfg: &ConfigFile) -> PathBuf {
    cfg.dir.join("upgrade.sock")
}

/// One request on a connection of its own (`Connection: close`): the status line and the
/// node that answered, or what went wrong.
async fn get_once(web: SocketAddr) -> Result<String, String> {
    let mut s = tokio::net::TcpStream::connect(web)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    s.write_all(b"GET / HTTP/1.1\r\nHost: web\r\nConnection: close\r\n\r\n")
        .await
        .map_err(|e| format!("write: {e}"))?;
    answer(&mut s).await
}

/// The node named by the answer read to its end from `s` (which must be a 200).
async fn answer(s: &mut tokio::net::TcpStream) -> Result<String, String> {
    let mut buf = Vec::new();
    tokio::time::timeout(PATIENCE, s.read_to_end(&mut buf))
        .await
        .map_err(|_| "no answer".to_owned())?
        .map_err(|e| format!("read: {e}"))?;
    let text = String::from_utf8_lossy(&buf);
    if !text.starts_with("HTTP/1.1 200") {
        return Err(format!("answered: {text:?}"));
    }
    text.lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("x-limpet-node: ")
                .map(str::to_owned)
        })
        .ok_or_else(|| format!("no node named: {text:?}"))
}

/// Clients that connected and sent their requests while the old limpet is at its listener's
/// `max_connections` (1, held by a kept-alive client): the first is accepted and held for the
/// slot, and is served by the old limpet in its drain; the next waits in the kernel's accept
/// queue of the listening socket. A restart closes that socket and resets the client; an
/// upgrade hands the socket to the new limpet, which serves the client. The new
/// one runs two worker threads where the old ran one (a socket bound beside the one taken),
/// and takes the admin listener too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_waiting_at_max_connections_during_an_upgrade_are_all_served() {
    let (_nodes, port) = backend_nodes(&NODES).await;
    let cfg = ConfigFile::new("upgrade-queue", &config(port, ""));
    let sock = upgrade_socket(&cfg);
    let mut old = Proc::start(&cfg, &sock, 1, "old").await;

    // The one slot, held by a kept-alive connection that was answered.
    let mut holder = tokio::net::TcpStream::connect(old.web)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    holder
        .write_all(b"GET / HTTP/1.1\r\nHost: web\r\n\r\n")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut head = [0u8; 12];
    tokio::time::timeout(PATIENCE, holder.read_exact(&mut head))
        .await
        .unwrap_or_else(|_| panic!("the first client got no answer"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(&head, b"HTTP/1.1 200");
    // The next client is accepted and waits for the slot in the old limpet, which serves it
    // in its drain once the kept-alive client's connection closes at it (before, it was
    // closed unanswered at the stop). The one after waits in the kernel.
    let mut accepted = tokio::net::TcpStream::connect(old.web)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    accepted
        .write_all(b"GET / HTTP/1.1\r\nHost: web\r\nConnection: close\r\n\r\n")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut queued = tokio::net::TcpStream::connect(old.web)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    queued
        .write_all(b"GET / HTTP/1.1\r\nHost: web\r\nConnection: close\r\n\r\n")
        .await
        .unwrap_or_else(|e| panic!("{e}"));

    let new = Proc::start(&cfg, &sock, 2, "new").await;
    assert_eq!(new.web, old.web, "the new limpet listens where the old did");
    assert_eq!(new.admin, old.admin, "and takes the admin listener too");
    let served_by = answer(&mut queued)
        .await
        .unwrap_or_else(|e| panic!("the queued client: {e}"));
    assert!(["a", "b", "c"].contains(&served_by.as_str()));
    let served_by = answer(&mut accepted)
        .await
        .unwrap_or_else(|e| panic!("the client waiting for a slot in the old limpet: {e}"));
    assert!(["a", "b", "c"].contains(&served_by.as_str()));
    assert!(
        old.exited().await.success(),
        "the old limpet exits 0 once drained"
    );
    // The old one's slot went with it; the new one serves fresh clients on both workers'
    // sockets, and its admin API answers.
    drop(holder);
    for _ in 0..20 {
        get_once(new.web)
            .await
            .unwrap_or_else(|e| panic!("after the upgrade: {e}"));
    }
    let nodes = bare_client()
        .get(new.admin_url("/api/v1/nodes"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("the admin API after the upgrade: {e}"));
    assert_eq!(nodes.status(), 200);
}

/// Clients keep coming, one connection each, while a new limpet takes over: every one is
/// answered 200, by the old limpet before the handover and by the new one after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_under_load_refuses_no_client_and_fails_no_request() {
    let (_nodes, port) = backend_nodes(&NODES).await;
    let cfg = ConfigFile::new(
        "upgrade-load",
        &config(port, "").replace("max_connections = 1\n", ""),
    );
    let sock = upgrade_socket(&cfg);
    let mut old = Proc::start(&cfg, &sock, 2, "old").await;
    let web = old.web;

    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicU64::new(0));
    let load = {
        let stop = Arc::clone(&stop);
        let answered = Arc::clone(&answered);
        tokio::spawn(async move {
            let mut errors = Vec::new();
            // Bounded in count and time whatever happens.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            for _ in 0..20_000 {
                if stop.load(Ordering::Relaxed) || tokio::time::Instant::now() > deadline {
                    break;
                }
                match get_once(web).await {
                    Ok(_) => {
                        answered.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => errors.push(e),
                }
            }
            errors
        })
    };
    // Under way before the upgrade starts.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while answered.load(Ordering::Relaxed) < 100 {
        assert!(tokio::time::Instant::now() < deadline, "no load");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let before = answered.load(Ordering::Relaxed);
    let new = Proc::start(&cfg, &sock, 1, "new").await;
    assert_eq!(new.web, web);
    assert!(old.exited().await.success());
    let at_exit = answered.load(Ordering::Relaxed);
    eprintln!("answered: {before} before the new limpet started, {at_exit} when the old exited");
    assert!(at_exit > before, "no client came during the upgrade");
    // And on, served by the new one alone.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while answered.load(Ordering::Relaxed) < at_exit + 200 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "load stalled after the upgrade"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let errors = load.await.unwrap_or_else(|e| panic!("{e}"));
    assert!(
        errors.is_empty(),
        "{} of {} clients failed, first: {:?}",
        errors.len(),
        answered.load(Ordering::Relaxed) + errors.len() as u64,
        errors.first()
    );
}

/// The pins of a table with no snapshot file, and an operator's MAINT, cross the upgrade:
/// the new limpet has them from the old one, not from a file. (A fresh table gives the
/// rotation's first node first; the second client keeps the other node when it comes first.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pins_and_a_node_in_maint_cross_an_upgrade() {
    let (_nodes, port) = backend_nodes(&NODES).await;
    let cfg = ConfigFile::new("upgrade-pins", &config(port, ""));
    let sock = upgrade_socket(&cfg);
    let mut old = Proc::start(&cfg, &sock, 1, "old").await;
    let first = node_for("127.0.0.91", old.web).await;
    let second = node_for("127.0.0.92", old.web).await;
    assert_ne!(first, second);
    let maint = NODES
        .iter()
        .map(|(n, _)| *n)
        .find(|n| *n != first && *n != second)
        .unwrap_or_else(|| panic!("a third node"));
    let r = post_state(
        &old.admin_url(&format!("/api/v1/nodes/{maint}/state")),
        "maint",
    )
    .await;
    assert_eq!(r.status(), 200);

    let new = Proc::start(&cfg, &sock, 1, "new").await;
    assert!(old.exited().await.success());
    assert_eq!(node_for("127.0.0.92", new.web).await, second);
    assert_eq!(node_for("127.0.0.91", new.web).await, first);
    let view = json(&new.admin_url(&format!("/api/v1/nodes/{maint}"))).await;
    assert_eq!(view["admin"], "maint", "{view}");
    assert_eq!(view["state"], "MAINT", "{view}");
    for ip in ["127.0.0.93", "127.0.0.94", "127.0.0.95"] {
        assert_ne!(node_for(ip, new.web).await, maint);
    }
}

/// A node drained on the running limpet, with a TCP session open on it, is not called
/// drained by the new limpet the moment it takes over: the old one drains that session on,
/// and the new one has neither a connection to the node nor a session seen there of its own.
/// Before, `complete` read true at once after the upgrade, and an operator's script that
/// waits for it stopped the node under the old limpet's session. Complete once the old one
/// has exited and no session was seen within `[drain] idle`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_is_not_complete_after_an_upgrade_while_the_old_limpet_drains_its_sessions() {
    let Drained {
        _nodes,
        cfg,
        sock,
        first: mut old,
        session,
        node,
    } = drained_under_a_session("upgrade-drain-complete", "old").await;

    let new = Proc::start(&cfg, &sock, 1, "new").await;
    let url = new.admin_url(&format!("/api/v1/nodes/{node}"));
    let view = json(&url).await;
    assert_eq!(view["admin"], "drain", "{view}");
    assert_eq!(
        view["drain"]["complete"], false,
        "complete while the old limpet drains a session on the node: {view}"
    );
    assert!(
        old.child.0.try_wait().ok().flatten().is_none(),
        "the old one drains its session"
    );
    // Its last sighting of a session crossed too (it was before the idle wait above).
    assert!(
        view["last_seen_ago_ms"]
            .as_u64()
            .is_some_and(|ms| (1_500..PATIENCE.as_millis() as u64).contains(&ms)),
        "{view}"
    );
    // The session ends: the old one exits, and the drain is complete on the new one.
    drop(session);
    assert!(old.exited().await.success());
    let view = node_view_once(&url, |v| v["drain"]["complete"] == true).await;
    assert_eq!(view["admin"], "drain", "{view}");
}

/// Back-to-back upgrades: A drains a TCP session on a drained node, B took over from A, and
/// C takes over from B at once. C watches B's end alone, so B, drained of its own, waits for
/// A to exit before it exits: C's drain is not complete while A still relays the session.
/// Before, B exited as soon as it had drained nothing, and C called the drain complete
/// under A's session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn back_to_back_upgrades_keep_the_first_limpet_s_sessions_counted() {
    let (
        Drained {
            _nodes,
            first: mut a,
            session,
            node,
            ..
        },
        mut b,
        c,
    ) = three_in_a_row("upgrade-drain-twice").await;
    let url = c.admin_url(&format!("/api/v1/nodes/{node}"));
    let view = json(&url).await;
    assert_eq!(
        view["drain"]["complete"], false,
        "complete on C while A still drains a session on the node: {view}"
    );
    // The session ends: A exits, then B, and the drain is complete on C.
    drop(session);
    assert!(a.exited().await.success());
    assert!(b.exited().await.success());
    node_view_once(&url, |v| v["drain"]["complete"] == true).await;
}

/// An operator's MAINT set on the new limpet reaches what the old one still drains: its TCP
/// session on the node ends at once, not at its drain's end (30 s), and the old limpet,
/// with nothing left to drain, exits. Before, the old one's node states were frozen at the
/// handover (its checks stopped, its admin API refuses writes) and the session went on on a
/// node in maintenance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_maint_set_on_the_new_limpet_ends_the_old_one_s_session_on_the_node() {
    let Drained {
        _nodes,
        cfg,
        sock,
        first: mut old,
        mut session,
        node,
    } = drained_under_a_session("upgrade-told-maint", "old").await;
    let new = Proc::start(&cfg, &sock, 1, "new").await;
    assert!(
        old.child.0.try_wait().ok().flatten().is_none(),
        "the old one drains its session"
    );
    let r = post_state(
        &new.admin_url(&format!("/api/v1/nodes/{node}/state")),
        "maint",
    )
    .await;
    assert_eq!(r.status(), 200);
    let mut rest = [0u8; 256];
    let ended = tokio::time::timeout(Duration::from_secs(5), session.read(&mut rest)).await;
    assert!(
        matches!(ended, Ok(Ok(0) | Err(_))),
        "the old limpet's session on {node} still open 5 s after MAINT on the new one: {ended:?}"
    );
    assert!(old.exited().await.success());
    // The new one's state is its own: MAINT there too.
    assert_eq!(
        json(&new.admin_url(&format!("/api/v1/nodes/{node}"))).await["admin"],
        "maint"
    );
}

/// Back-to-back upgrades: A ([`drained_under_a_session`]) drains its TCP session, B took
/// over from A, and C from B at once; B, drained of its own, waits for A (seen in its log
/// within `PATIENCE`). Returns A's, B and C.
async fn three_in_a_row(tag: &str) -> (Drained, Proc, Proc) {
    let a = drained_under_a_session(tag, "a").await;
    let b = Proc::start_logging(&a.cfg, &a.sock, "b").await;
    let c = Proc::start(&a.cfg, &a.sock, 1, "c").await;
    let log = a.cfg.dir.join("b.err");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("waiting for the limpet this one took over from to exit")
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "B did not wait for A: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (a, b, c)
}

/// A limpet waiting, drained, for the one it took over from (back-to-back upgrades) exits on
/// a SIGTERM: the operator or the service manager stopping it. Before, the signal was
/// handled and ignored, and it waited up to ten minutes for the first one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limpet_waiting_for_the_one_it_took_over_from_exits_on_a_signal() {
    let (
        Drained {
            _nodes,
            first: a,
            session,
            ..
        },
        mut b,
        _c,
    ) = three_in_a_row("upgrade-wait-signal").await;
    signal(b.child.0.id(), rustix::process::Signal::TERM);
    assert!(b.exited().await.success());
    drains_on_until_its_session_ends(a, session).await;
}

/// Takes over from the limpet (pid `pid`) at the upgrade socket `sock` as a new limpet would
/// (`limpet::upgrade`'s own taker), sending it SIGTERM once it has stopped accepting and
/// before its state is read: the middle of the handover. The running one's end, to keep.
async fn take_over_signalling_midway(sock: &Path, pid: u32) -> limpet::upgrade::Predecessor {
    let path = sock.to_owned();
    tokio::task::spawn_blocking(move || {
        let h = limpet::upgrade::take_over(&path)
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("no running limpet at the upgrade socket"));
        h.complete_after_stopping(|| {
            signal(pid, rustix::process::Signal::TERM);
            // Delivered and seen by the running one before its state is read.
            std::thread::sleep(Duration::from_millis(300));
        })
        .map(|(_, predecessor)| predecessor)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"))
    .unwrap_or_else(|e| panic!("the handover: {e}"))
}

/// A stop signal that reaches the running limpet in the middle of a handover, after it
/// stopped accepting and before the new one says it took over, is the first signal: the
/// handover completes and the running one drains, its request in flight answered. Before,
/// nothing waited for the signal then, so it was kept and taken at the drain's first wait
/// as the one that cuts: the request in flight was cut about a second after "took", and the
/// log said "cutting the open sessions". (The new limpet is played here by
/// `limpet::upgrade`'s own taker, which sends the signal at that moment.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_signal_during_a_handover_drains_rather_than_cuts() {
    let (_nodes, port) = backend_nodes(&NODES).await;
    let cfg = ConfigFile::new("upgrade-signal-mid", &config(port, ""));
    let sock = upgrade_socket(&cfg);
    let mut old = Proc::start_logging(&cfg, &sock, "old").await;
    let web = old.web;
    // A request the node answers in 3 s, in flight through the handover.
    let slow = tokio::spawn(async move {
        let status = bare_client()
            .get(format!("http://{web}/slow?ms=3000"))
            .send()
            .await
            .map_err(|e| e.to_string())?
            .status()
            .as_u16();
        Ok::<u16, String>(status)
    });
    let metrics = old.admin_url("/metrics");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let text = bare_client()
            .get(&metrics)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .text()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        if text
            .lines()
            .any(|l| l.starts_with("limpet_node_active_connections{") && l.ends_with(" 1"))
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the request never reached a node"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _predecessor = take_over_signalling_midway(&sock, old.child.0.id()).await;
    let status = slow.await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        status,
        Ok(200),
        "the request in flight through the handover"
    );
    assert!(old.exited().await.success());
    let log = std::fs::read_to_string(cfg.dir.join("old.err")).unwrap_or_default();
    assert!(
        !log.contains("cutting the open sessions"),
        "the first signal cut the drain:\n{log}"
    );
}

/// Back to back, the stop signal during the handover also ends the wait for the limpet
/// before: B, which took over from A (still draining a session), is signalled while C takes
/// over from it, drains nothing of its own, and exits without waiting for A. Before the
/// handover watched for signals, the kept signal did end that wait (by cutting); once it
/// was watched, it was forgotten there, and B waited for A (up to ten minutes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limpet_signalled_during_its_handover_does_not_wait_for_the_one_before() {
    let Drained {
        _nodes,
        cfg,
        sock,
        first: a,
        session,
        ..
    } = drained_under_a_session("upgrade-handover-signal", "a").await;
    let mut b = Proc::start_logging(&cfg, &sock, "b").await;
    let _c = take_over_signalling_midway(&sock, b.child.0.id()).await;
    assert!(b.exited().await.success(), "B waits for A");
    let log = std::fs::read_to_string(cfg.dir.join("b.err")).unwrap_or_default();
    assert!(
        !log.contains("waiting for the limpet this one took over from"),
        "{log}"
    );
    drains_on_until_its_session_ends(a, session).await;
}

/// The same signal while that limpet still drains a session of its own: the session is cut,
/// and it exits without waiting for the one before. Before, the signal cut the session and
/// the wait that followed listened for another one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limpet_signalled_while_it_drains_does_not_wait_for_the_one_before() {
    let Drained {
        _nodes,
        cfg,
        sock,
        first: a,
        session,
        ..
    } = drained_under_a_session("upgrade-drain-signal", "a").await;
    let mut b = Proc::start_logging(&cfg, &sock, "b").await;
    let (mut own, _) = tcp_session_through(b.web).await;
    let _c = Proc::start(&cfg, &sock, 1, "c").await;
    // B drains its own session (its drain is 30 s).
    assert!(
        b.child.0.try_wait().ok().flatten().is_none(),
        "B drains its session"
    );
    signal(b.child.0.id(), rustix::process::Signal::TERM);
    let mut rest = [0u8; 64];
    let cut = tokio::time::timeout(PATIENCE, own.read(&mut rest)).await;
    assert!(matches!(cut, Ok(Ok(0) | Err(_))), "B's session: {cut:?}");
    assert!(b.exited().await.success());
    drains_on_until_its_session_ends(a, session).await;
}

/// `a` still runs, draining `session`, and exits once the session ends.
async fn drains_on_until_its_session_ends(mut a: Proc, session: tokio::net::TcpStream) {
    assert!(
        a.child.0.try_wait().ok().flatten().is_none(),
        "A drains its session on"
    );
    drop(session);
    assert!(a.exited().await.success());
}

/// A limpet with a TCP listener, one of whose nodes is drained under a TCP session still
/// open through it, past `[drain] idle` (1 s): only that session keeps the drain going.
struct Drained {
    _nodes: Vec<BackendNode>,
    cfg: ConfigFile,
    sock: PathBuf,
    first: Proc,
    session: tokio::net::TcpStream,
    node: String,
}

async fn drained_under_a_session(tag: &str, first: &str) -> Drained {
    let (nodes, port) = backend_nodes(&NODES).await;
    let text = format!(
        "{}[[listeners]]\nname = \"raw\"\nbind = \"127.0.0.1:0\"\nmode = \"tcp\"\n\
         node_port = {port}\ntimeouts = {{ drain = \"30s\" }}\n\n[drain]\nidle = \"1s\"\n\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n",
        nodes_toml(&NODES)
    );
    let cfg = ConfigFile::new(tag, &text);
    let sock = upgrade_socket(&cfg);
    let proc = Proc::start(&cfg, &sock, 1, first).await;
    // One request through the TCP listener; the session stays open after its answer.
    let (session, node) = tcp_session_through(proc.web).await;
    let r = post_state(
        &proc.admin_url(&format!("/api/v1/nodes/{node}/state")),
        "drain",
    )
    .await;
    assert_eq!(r.status(), 200);
    // The idle window passes; the open session keeps the drain going.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let view = json(&proc.admin_url(&format!("/api/v1/nodes/{node}"))).await;
    assert_eq!(view["drain"]["complete"], false, "{view}");
    Drained {
        _nodes: nodes,
        cfg,
        sock,
        first: proc,
        session,
        node,
    }
}

/// A TCP session through `web` (a TCP listener to the HTTP nodes), open after one answer,
/// and the node that answered.
async fn tcp_session_through(web: SocketAddr) -> (tokio::net::TcpStream, String) {
    let mut session = tokio::net::TcpStream::connect(web)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    session
        .write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut head = Vec::new();
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let mut b = [0u8; 256];
        let n = tokio::time::timeout(PATIENCE, session.read(&mut b))
            .await
            .unwrap_or_else(|_| panic!("no answer through the TCP listener"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(n > 0, "closed: {:?}", String::from_utf8_lossy(&head));
        head.extend_from_slice(&b[..n]);
    }
    let node = String::from_utf8_lossy(&head)
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("x-limpet-node: ")
                .map(str::to_owned)
        })
        .unwrap_or_else(|| panic!("no node named: {:?}", String::from_utf8_lossy(&head)));
    (session, node)
}

/// Nodes a, b, c answer; d (127.0.0.5, where nothing listens) refuses every connection.
const WITH_DEAD: [(&str, &str); 4] = [
    ("a", "127.0.0.2"),
    ("b", "127.0.0.3"),
    ("c", "127.0.0.4"),
    ("d", "127.0.0.5"),
];

/// The node's admin view once `done` says yes of it, read every 50 ms within `PATIENCE`.
async fn node_view_once(
    admin: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let view = json(admin).await;
        if done(&view) {
            return view;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not so within {PATIENCE:?}: {view}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The config of [`d_down_by_traffic`]: `nodes` on `port`, DOWN at one failure for an hour.
fn d_down_config(port: u16, nodes: &[(&str, &str)]) -> String {
    config(port, "").replace(
        &nodes_toml(&NODES),
        &format!(
            "{}[health]\nfall = 1\nfail_timeout = \"1h\"\n\n",
            nodes_toml(nodes)
        ),
    )
}

/// A limpet (to be upgraded) of nodes a, b, c answering on `port` and d refusing, `fall = 1`
/// and `fail_timeout = "1h"`, once d is DOWN by its traffic: fresh clients go round the
/// nodes, the one given d is refused there and answered by another node (the connect failed
/// before any byte was sent).
async fn d_down_by_traffic(tag: &str, port: u16) -> (ConfigFile, PathBuf, Proc) {
    let cfg = ConfigFile::new(tag, &d_down_config(port, &WITH_DEAD));
    let sock = upgrade_socket(&cfg);
    let old = Proc::start(&cfg, &sock, 1, "old").await;
    for ip in ["127.0.0.81", "127.0.0.82", "127.0.0.83", "127.0.0.84"] {
        assert_ne!(node_for(ip, old.web).await, "d");
    }
    let before = json(&old.admin_url("/api/v1/nodes/d")).await;
    assert_eq!(before["state"], "DOWN", "{before}");
    (cfg, sock, old)
}

/// A node the running limpet has DOWN by its traffic (a refused connect, `fall = 1`) is DOWN
/// in the new one from its first moment, with the trial the old one set (an hour away):
/// not UP, to be found dead again by a client's connect. The new one has no way to learn it
/// but the handover: it has no checks, and no client reaches it before the test reads it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_down_by_its_traffic_is_down_after_an_upgrade_until_its_trial() {
    let (_nodes, port) = backend_nodes(&WITH_DEAD[..3]).await;
    let (cfg, sock, mut old) = d_down_by_traffic("upgrade-health-traffic", port).await;

    let new = Proc::start(&cfg, &sock, 1, "new").await;
    assert!(old.exited().await.success());
    let view = json(&new.admin_url("/api/v1/nodes/d")).await;
    assert_eq!(view["state"], "DOWN", "{view}");
    assert_eq!(view["health"]["down_cause"], "traffic", "{view}");
    let trial_in = view["health"]["trial_in_ms"].as_u64().unwrap_or(0);
    assert!(trial_in > 3_000_000, "the old one's trial time: {view}");
    for n in ["a", "b", "c"] {
        let up = json(&new.admin_url(&format!("/api/v1/nodes/{n}"))).await;
        assert_eq!(up["state"], "UP", "{up}");
    }
}

/// A node the running limpet has DOWN at one address, which the new limpet's config moves
/// to another, starts its health anew in the new one (as a reload that moves it does): UP at
/// once at the address that answers, where the old one's trial was an hour away. Before, the
/// health of the old address crossed by name and held the node out for that hour.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_the_new_config_moves_does_not_take_the_old_address_s_health() {
    let (_nodes, port) = backend_nodes(&WITH_DEAD[..3]).await;
    let (cfg, sock, mut old) = d_down_by_traffic("upgrade-health-moved", port).await;

    // d answers at a new address, which the new limpet's config gives it.
    let moved = "127.0.0.6";
    let _d = backend_node_again("d", moved.parse().unwrap_or_else(|e| panic!("{e}")), port).await;
    let mut nodes = WITH_DEAD;
    nodes[3] = ("d", moved);
    cfg.write(&d_down_config(port, &nodes));
    let new = Proc::start(&cfg, &sock, 1, "new").await;
    assert!(old.exited().await.success());
    let view = json(&new.admin_url("/api/v1/nodes/d")).await;
    assert_eq!(view["state"], "UP", "{view}");
    assert_eq!(view["address"], moved, "{view}");
    // And it takes clients there: the rotation reaches it within four fresh ones.
    let mut served = Vec::new();
    for ip in ["127.0.0.85", "127.0.0.86", "127.0.0.87", "127.0.0.88"] {
        served.push(node_for(ip, new.web).await);
    }
    assert!(served.iter().any(|n| n == "d"), "{served:?}");
}

/// A node the running limpet's checks have DOWN is DOWN in the new one, held there by that
/// check: the new config checks every hour, so nothing but the handover can have told it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_down_by_its_check_is_down_after_an_upgrade() {
    let (_nodes, port) = backend_nodes(&WITH_DEAD[..3]).await;
    let with_checks = |interval: &str| {
        config(port, "")
            .replace(
                &nodes_toml(&NODES),
                &format!(
                    "{}[health]\nfall = 1\nrise = 2\ninterval = \"{interval}\"\ntimeout = \"1s\"\n\n",
                    nodes_toml(&WITH_DEAD)
                ),
            )
            .replace("table = \"t\"\n", "table = \"t\"\ncheck = { kind = \"tcp\" }\n")
    };
    let cfg = ConfigFile::new("upgrade-health-checks", &with_checks("100ms"));
    let sock = upgrade_socket(&cfg);
    let mut old = Proc::start(&cfg, &sock, 1, "old").await;
    let before = node_view_once(&old.admin_url("/api/v1/nodes/d"), |v| v["state"] == "DOWN").await;
    assert_eq!(before["health"]["down_cause"], "checks", "{before}");

    cfg.write(&with_checks("1h"));
    let new = Proc::start(&cfg, &sock, 1, "new").await;
    assert!(old.exited().await.success());
    let view = json(&new.admin_url("/api/v1/nodes/d")).await;
    assert_eq!(view["state"], "DOWN", "{view}");
    assert_eq!(view["health"]["down_cause"], "checks", "{view}");
    for n in ["a", "b", "c"] {
        let up = json(&new.admin_url(&format!("/api/v1/nodes/{n}"))).await;
        assert_eq!(up["state"], "UP", "{up}");
    }
}

/// A new limpet that cannot start (a listener address another socket holds) exits 2 and the
/// running one serves on, unchanged; a new one that can takes over afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_limpet_that_cannot_start_leaves_the_running_one_serving() {
    let (_nodes, port) = backend_nodes(&NODES).await;
    let cfg = ConfigFile::new("upgrade-fail", &config(port, ""));
    let sock = upgrade_socket(&cfg);
    let mut old = Proc::start(&cfg, &sock, 1, "old").await;
    let before = node_for("127.0.0.91", old.web).await;

    let squatter = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
    let taken = squatter.local_addr().unwrap_or_else(|e| panic!("{e}"));
    let bad = ConfigFile::new(
        "upgrade-fail-new",
        &config(
            port,
            &format!("[[listeners]]\nname = \"more\"\nbind = \"{taken}\"\nnode_port = {port}\n\n"),
        ),
    );
    let mut failing = Guard(spawn(&bad, &sock, 1, "bad").0);
    let status = exited(&mut failing.0).await;
    assert_eq!(status.code(), Some(2));
    let err = std::fs::read_to_string(bad.dir.join("bad.err")).unwrap_or_default();
    assert!(err.contains(&taken.to_string()), "{err}");

    assert!(old
        .child
        .0
        .try_wait()
        .unwrap_or_else(|e| panic!("{e}"))
        .is_none());
    assert_eq!(node_for("127.0.0.91", old.web).await, before);
    get_once(old.web)
        .await
        .unwrap_or_else(|e| panic!("the running limpet after a failed upgrade: {e}"));

    let new = Proc::start(&cfg, &sock, 1, "new").await;
    assert!(old.exited().await.success());
    assert_eq!(node_for("127.0.0.91", new.web).await, before);
}

/// An upgrade socket path shared by mistake: a limpet whose config binds none of the running
/// one's listener addresses does not take over (that would stop another service). It exits
/// 2 and the running one serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limpet_of_another_config_does_not_take_over() {
    let (_nodes, port) = backend_nodes(&NODES).await;
    let cfg = ConfigFile::new("upgrade-other", &config(port, ""));
    let sock = upgrade_socket(&cfg);
    let old = Proc::start(&cfg, &sock, 1, "old").await;
    let other = ConfigFile::new(
        "upgrade-other-new",
        &config(port, "").replace("name = \"web\"", "name = \"print\""),
    );
    let mut refused = Guard(spawn(&other, &sock, 1, "other").0);
    assert_eq!(exited(&mut refused.0).await.code(), Some(2));
    let err = std::fs::read_to_string(other.dir.join("other.err")).unwrap_or_default();
    assert!(
        err.contains("serves none of this config's listener addresses"),
        "{err}"
    );
    let mut old = old;
    assert!(old
        .child
        .0
        .try_wait()
        .unwrap_or_else(|e| panic!("{e}"))
        .is_none());
    for _ in 0..5 {
        get_once(old.web)
            .await
            .unwrap_or_else(|e| panic!("the running limpet after a refused takeover: {e}"));
    }
}

/// The admin listener is bound without `SO_REUSEPORT`: one on a listener's address is refused
/// (were it bound like the listeners, the kernel would deal that address's clients between
/// the proxy and the admin API), by the config's check, naming `admin.listen`, before
/// anything binds.
#[tokio::test]
async fn an_admin_listener_on_a_listener_s_address_is_refused_at_start() {
    let (_nodes, port) = backend_nodes(&NODES).await;
    let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
    let at = probe.local_addr().unwrap_or_else(|e| panic!("{e}"));
    drop(probe);
    let text = config(port, "")
        .replace("bind = \"127.0.0.1:0\"", &format!("bind = \"{at}\""))
        .replace("listen = \"127.0.0.1:0\"", &format!("listen = \"{at}\""));
    let cfg = ConfigFile::new("upgrade-admin-clash", &text);
    match limpet::config::Config::load(&cfg.path) {
        Ok(config) => {
            if let Ok(running) = limpet::runtime::start(config).await {
                running.stop().await;
            }
            panic!("the admin listener on the web listener's address {at} passed the check");
        }
        Err(e) => assert!(
            e.to_string()
                .contains(&format!("admin.listen: {at} is already bound by listener")),
            "{e}"
        ),
    }
}

/// The rest of an admin request sent on `s`, then its answer: the status line and the body.
async fn admin_answer(s: &mut tokio::net::TcpStream, rest: &str) -> (String, String) {
    s.write_all(rest.as_bytes())
        .await
        .unwrap_or_else(|e| panic!("write: {e}"));
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&got[..end]).into_owned();
            let len: usize = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length: ")?
                        .parse()
                        .ok()
                })
                .unwrap_or_else(|| panic!("no content-length: {head:?}"));
            if got.len() >= end + 4 + len {
                let body = String::from_utf8_lossy(&got[end + 4..end + 4 + len]).into_owned();
                let status = head.lines().next().unwrap_or("").to_owned();
                return (status, body);
            }
        }
        let mut b = [0u8; 4096];
        let n = tokio::time::timeout_at(deadline, s.read(&mut b))
            .await
            .unwrap_or_else(|_| panic!("no answer: {:?}", String::from_utf8_lossy(&got)))
            .unwrap_or_else(|e| panic!("read: {e}"));
        assert!(n > 0, "closed: {:?}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&b[..n]);
    }
}

/// An admin write that reaches the old limpet after it handed its state over (a request
/// under way at the upgrade, which the old one still serves while it drains) is refused with
/// a 503 that says why, not applied: the new limpet took the nodes' states and the tables
/// before it, so the write would change only the process about to exit. Before, the old one
/// answered 200 and the node stayed READY in the new one: the operator's MAINT was lost
/// without a word. The same write sent again reaches the new limpet and holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_write_to_a_limpet_that_handed_over_is_refused_not_lost() {
    let (_nodes, port) = backend_nodes(&NODES).await;
    let text = format!(
        "{}[[listeners]]\nname = \"raw\"\nbind = \"127.0.0.1:0\"\nmode = \"tcp\"\n\
         node_port = {port}\ntimeouts = {{ drain = \"30s\" }}\n\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n",
        nodes_toml(&NODES)
    );
    let cfg = ConfigFile::new("upgrade-late-write", &text);
    let sock = upgrade_socket(&cfg);
    let mut old = Proc::start(&cfg, &sock, 1, "old").await;
    // A session the old limpet drains after the hand-over: it stays until that ends.
    let (session, _) = tcp_session_through(old.web).await;
    // A MAINT under way when the upgrade comes: its head and the first bytes of its body.
    let mut admin = tokio::net::TcpStream::connect(old.admin)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    admin
        .write_all(
            b"POST /api/v1/nodes/c/state HTTP/1.1\r\nHost: localhost\r\n\
              Content-Type: application/json\r\nContent-Length: 17\r\n\r\n{\"state\":\"mai",
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));

    let new = Proc::start(&cfg, &sock, 1, "new").await;
    let (status, body) = admin_answer(&mut admin, "nt\"}").await;
    assert!(status.starts_with("HTTP/1.1 503"), "{status} {body}");
    assert!(body.contains("handing over"), "{body}");
    let view = json(&new.admin_url("/api/v1/nodes/c")).await;
    assert_eq!(view["admin"], "ready", "{view}");
    // Sent again, it reaches the new limpet.
    let r = post_state(&new.admin_url("/api/v1/nodes/c/state"), "maint").await;
    assert_eq!(r.status(), 200);
    let view = json(&new.admin_url("/api/v1/nodes/c")).await;
    assert_eq!(view["admin"], "maint", "{view}");
    drop((admin, session));
    assert!(old.exited().await.success());
}

/// The new limpet died (or hung) after the running one stopped accepting and before it said it
/// took over: the running one serves again, from the copies of its sockets it held, and the
/// client that waited in the accept queue meanwhile is served; its admin API takes writes
/// again. (In process: the moment is not one a real process can be killed at on purpose.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limpet_whose_new_one_did_not_take_over_serves_again() {
    let (_nodes, port) = backend_nodes(&NODES).await;
    let cfg = ConfigFile::new(
        "upgrade-resume",
        &config(port, "").replace("max_connections = 1\n", ""),
    );
    let mut limpet = Limpet::start(&cfg).await;
    let (web, admin) = (limpet.addr("web"), limpet.admin);
    let running = limpet
        .running
        .as_mut()
        .unwrap_or_else(|| panic!("not running"));
    get_once(web).await.unwrap_or_else(|e| panic!("{e}"));
    running.hand_node_states_over().await;
    running.stop_accepting();
    assert!(running.accepting_stopped(PATIENCE).await);
    // Nobody accepts now; the sockets stay open (the copies held for the new limpet), so a
    // client waits in the queue, and so does a metrics scrape.
    let waiting = tokio::spawn(get_once(web));
    let url = format!("http://{admin}/api/v1/nodes");
    let scrape = tokio::spawn(async move { json(&url).await });
    assert_eq!(
        running.resume(),
        2,
        "the listener's socket and the admin one"
    );
    waiting
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|e| panic!("the client that waited: {e}"));
    let nodes = scrape.await.unwrap_or_else(|e| panic!("{e}"));
    assert!(
        nodes.is_array() || nodes.is_object(),
        "the admin API answers again: {nodes}"
    );
    // Its admin writes are its own again (refused while it was handing over).
    let r = post_state(&format!("http://{admin}/api/v1/nodes/c/state"), "maint").await;
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    for _ in 0..5 {
        get_once(web)
            .await
            .unwrap_or_else(|e| panic!("served again: {e}"));
    }
    limpet.stop().await;
    assert!(
        tokio::net::TcpStream::connect(web).await.is_err(),
        "a stop closes the sockets"
    );
}

/// A GET on kept-alive connection `s`: its answer's head (lower case), its body read.
async fn keep_alive_get(s: &mut tokio::net::TcpStream) -> String {
    s.write_all(b"GET / HTTP/1.1\r\nHost: web\r\n\r\n")
        .await
        .unwrap_or_else(|e| panic!("write: {e}"));
    let mut got = Vec::new();
    let mut b = [0u8; 4096];
    loop {
        if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or_else(|| panic!("a Content-Length answer: {head}"));
            if got.len() >= end + 4 + len {
                return head;
            }
        }
        let n = tokio::time::timeout(PATIENCE, s.read(&mut b))
            .await
            .unwrap_or_else(|_| panic!("no answer"))
            .unwrap_or_else(|e| panic!("read: {e}"));
        assert!(n > 0, "closed before the answer was whole: {got:?}");
        got.extend_from_slice(&b[..n]);
    }
}

/// A kept-alive client connection open when the old limpet stops accepting for a new one
/// that then does not take over is left alone while the handover is pending, and served on
/// once the old one serves again: the listeners drain only once a new limpet took over (or
/// this one stops). Before, they drained from the moment they stopped accepting: the
/// connection was closed (a tunnel got 1001, a TCP session was cut at the drain's end),
/// although nothing was handed over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_open_through_an_upgrade_that_failed_is_served_on() {
    let (_nodes, port) = backend_nodes(&NODES).await;
    let cfg = ConfigFile::new(
        "upgrade-failed-kept",
        &config(port, "").replace("max_connections = 1\n", ""),
    );
    let mut limpet = Limpet::start(&cfg).await;
    let web = limpet.addr("web");
    let running = limpet
        .running
        .as_mut()
        .unwrap_or_else(|| panic!("not running"));
    let mut kept = tokio::net::TcpStream::connect(web)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(keep_alive_get(&mut kept).await.starts_with("http/1.1 200"));
    running.hand_node_states_over().await;
    running.stop_accepting();
    assert!(running.accepting_stopped(PATIENCE).await);
    // Half a second with the handover pending (the observation window is the check): the
    // connection stays open.
    let mut b = [0u8; 1];
    assert!(
        tokio::time::timeout(Duration::from_millis(500), kept.read(&mut b))
            .await
            .is_err(),
        "the kept-alive connection was closed (or written to) while the handover was pending"
    );
    running.resume();
    for _ in 0..2 {
        let head = keep_alive_get(&mut kept).await;
        assert!(head.starts_with("http/1.1 200"), "{head}");
        assert!(!head.contains("connection: close"), "{head}");
    }
    drop(kept);
    limpet.stop().await;
}

/// The same with worker threads: a limpet that serves again does so on as many worker threads
/// as it started with, fresh ones (those that served before drain and exit at the stop), not
/// on its main thread alone. Before, `resume` served every socket on the main thread: after
/// an upgrade that failed late, a limpet of N workers served on one core until its next
/// restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limpet_with_worker_threads_serves_again_on_as_many() {
    let (_nodes, port) = backend_nodes(&NODES).await;
    let cfg = ConfigFile::new(
        "upgrade-resume-workers",
        &config(port, "").replace("max_connections = 1\n", ""),
    );
    let mut running = limpet::runtime::run::start_with(cfg.load(), 2)
        .await
        .unwrap_or_else(|e| panic!("start: {e}"));
    let web = running
        .addr("web")
        .unwrap_or_else(|| panic!("no listener web"));
    let before = worker_threads();
    assert_eq!(before.len(), 2, "two worker threads at the start");
    get_once(web).await.unwrap_or_else(|e| panic!("{e}"));
    running.stop_accepting();
    assert!(running.accepting_stopped(PATIENCE).await);
    let waiting = tokio::spawn(get_once(web));
    assert_eq!(
        running.resume(),
        3,
        "the listener's two sockets (one per worker) and the admin one"
    );
    let fresh: Vec<_> = worker_threads()
        .into_iter()
        .filter(|t| !before.contains(t))
        .collect();
    assert_eq!(
        fresh.len(),
        2,
        "two worker threads started again: {fresh:?} beside {before:?}"
    );
    waiting
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|e| panic!("the client that waited: {e}"));
    for _ in 0..5 {
        get_once(web)
            .await
            .unwrap_or_else(|e| panic!("served again: {e}"));
    }
    let _ = tokio::time::timeout(PATIENCE, running.stop()).await;
    assert!(
        tokio::net::TcpStream::connect(web).await.is_err(),
        "a stop closes the sockets"
    );
}

/// The ids of this process's limpet worker threads (named `limpet-worker-K`). The other
/// in-process tests of this file start no workers.
fn worker_threads() -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        panic!("no /proc/self/task");
    };
    tasks
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .is_ok_and(|name| name.starts_with("limpet-worker-"))
        })
        .map(|t| t.file_name().to_string_lossy().into_owned())
        .collect()
}

/// A successor started as SIGUSR2 starts one (the real binary, `run -c FILE
/// --upgrade-socket SOCK`, given `SUCCESSOR_LIMIT` unless said), whose config is a FIFO the test holds
/// open and never writes: it hangs reading it, before it connects, as one whose config is on
/// a mount that does not answer.
struct HungSuccessor {
    successor: limpet::upgrade::Successor,
    exe: PathBuf,
    cfg: ConfigFile,
    _writer: Option<std::fs::File>,
}

impl HungSuccessor {
    fn new(tag: &str) -> HungSuccessor {
        HungSuccessor::with_limit(tag, limpet::upgrade::SUCCESSOR_LIMIT)
    }

    fn with_limit(tag: &str, limit: Duration) -> HungSuccessor {
        HungSuccessor::started_by(tag, limit, |_| PathBuf::from(env!("CARGO_BIN_EXE_limpet")))
    }

    /// Started by the file `exe` gives in its config's directory.
    fn started_by(tag: &str, limit: Duration, exe: impl FnOnce(&Path) -> PathBuf) -> HungSuccessor {
        let cfg = ConfigFile::new(tag, "");
        fifo_in_place_of(&cfg.path);
        let exe = exe(&cfg.dir);
        let args = ["run", "--threads", "1", "-c"]
            .into_iter()
            .map(std::ffi::OsString::from)
            .chain([
                cfg.path.clone().into_os_string(),
                "--upgrade-socket".into(),
                cfg.dir.join("upgrade.sock").into_os_string(),
            ])
            .collect();
        let successor = limpet::upgrade::Successor::new(exe.clone(), args, limit);
        HungSuccessor {
            successor,
            exe,
            cfg,
            _writer: None,
        }
    }

    /// Starts it, and returns once it is blocked reading its config.
    async fn start(&mut self) -> Launched {
        let started = self
            .successor
            .start()
            .unwrap_or_else(|| panic!("no successor started"));
        let mut started = Launched(Some(started));
        started.running_soon().await;
        self._writer = Some(fifo_writer_once_read(&self.cfg.path).await);
        started
    }

    /// The successor's handover with a taker of `pid`, which must be its own.
    fn handing_over(&self, pid: u32) -> limpet::upgrade::HandingOver<'_> {
        match self.successor.handing_over(pid) {
            limpet::upgrade::Taker::Ours(h) => h,
            other => panic!("the successor's ready not known as its own: {other:?}"),
        }
    }
}

impl Drop for HungSuccessor {
    /// A successor still waiting to open its config (one this test did not kill: it ended
    /// early) reads its end and exits, rather than wait there for good once the FIFO is gone.
    fn drop(&mut self) {
        use std::os::unix::fs::OpenOptionsExt;
        let _ = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&self.cfg.path);
    }
}

/// A successor started, killed (SIGKILL, by its PID) if the test ends before it exited.
struct Launched(Option<limpet::upgrade::Started>);

impl Launched {
    /// Its process id, once its binary runs.
    async fn running(&mut self) -> u32 {
        let s = self.0.as_mut().unwrap_or_else(|| panic!("exited"));
        s.pid()
            .await
            .unwrap_or_else(|| panic!("the successor could not be started"))
    }

    /// [`running`](Self::running) within `PATIENCE`.
    async fn running_soon(&mut self) -> u32 {
        tokio::time::timeout(PATIENCE, self.running())
            .await
            .unwrap_or_else(|_| panic!("not running within {PATIENCE:?}"))
    }

    fn pid(&self) -> u32 {
        self.0
            .as_ref()
            .and_then(limpet::upgrade::Started::pid_now)
            .unwrap_or(0)
    }

    /// Its exit status, once reaped. Bounded in real time (the paused clock moves only when
    /// the runtime has nothing to do): a successor nobody killed within `PATIENCE` gets
    /// SIGABRT from a watchdog, which shows in the status.
    async fn exit(mut self) -> ExitStatus {
        let pid = self.pid();
        let s = self.0.take().unwrap_or_else(|| panic!("awaited twice"));
        let (done, watch) = std::sync::mpsc::channel::<()>();
        let watchdog = std::thread::spawn(move || {
            if watch.recv_timeout(PATIENCE).is_err() {
                signal(pid, rustix::process::Signal::ABORT);
            }
        });
        let status = s.exit.await;
        let _ = done.send(());
        let _ = watchdog.join();
        status
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|e| panic!("{e}"))
    }
}

impl Drop for Launched {
    fn drop(&mut self) {
        if let Some(pid) = self.0.as_ref().and_then(limpet::upgrade::Started::pid_now) {
            signal(pid, rustix::process::Signal::KILL);
        }
    }
}

fn signal(pid: u32, sig: rustix::process::Signal) {
    if let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process(pid, sig);
    }
}

/// Lets every task that can run do so (the successor's watcher among them), without moving
/// the paused clock.
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

/// A successor that hangs before it connects is killed at `SUCCESSOR_LIMIT`, not before; its
/// "ready", were it to come late, is refused; a later SIGUSR2 starts another, which has a
/// limit of its own. Before, SIGUSR2 stayed ignored ("a new limpet ... still runs") until
/// someone killed the hung one by hand.
#[tokio::test(start_paused = true)]
async fn a_successor_that_hangs_before_it_connects_is_killed_at_its_limit() {
    use limpet::upgrade::{Taker, SUCCESSOR_LIMIT};
    use std::os::unix::process::ExitStatusExt;
    let mut hung = HungSuccessor::new("upgrade-hung-successor");
    let started = hung.start().await;
    let pid = started.pid();
    let t0 = tokio::time::Instant::now();
    assert!(
        hung.successor.start().is_none(),
        "a second SIGUSR2 while one runs"
    );
    tokio::time::advance(SUCCESSOR_LIMIT - Duration::from_secs(1)).await;
    settle().await;
    let status = started.exit().await;
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    let at = t0.elapsed();
    assert!(
        at >= SUCCESSOR_LIMIT && at <= SUCCESSOR_LIMIT + Duration::from_secs(1),
        "killed after {at:?}"
    );
    assert!(matches!(hung.successor.handing_over(pid), Taker::Killed));

    let again = hung.start().await;
    let t1 = tokio::time::Instant::now();
    let status = again.exit().await;
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    let at = t1.elapsed();
    assert!(
        at >= SUCCESSOR_LIMIT && at <= SUCCESSOR_LIMIT + Duration::from_secs(1),
        "killed after {at:?}"
    );
}

/// The limit does not run while a handover with the successor is under way (the holder has
/// its "ready" and is handing over its state): a successor past its limit then is killed
/// only if the handover ends without "took"; one that took over is the service's main
/// process and is never killed, not even when its starter abandons it. Another process's
/// "ready" changes nothing for it. That nothing killed it shows in the exit status: the
/// test's own SIGTERM, sent once the limit passed, ends the successor (it stops while it
/// reads its config, exit 0), not an earlier SIGKILL.
#[tokio::test(start_paused = true)]
async fn a_successor_in_a_handover_is_killed_past_its_limit_only_if_it_did_not_take_over() {
    use limpet::upgrade::{Taker, SUCCESSOR_LIMIT};
    use std::os::unix::process::ExitStatusExt;
    let mut hung = HungSuccessor::new("upgrade-handing-over");

    // A handover under way past the limit: not killed.
    let started = hung.start().await;
    assert!(matches!(
        hung.successor.handing_over(started.pid() + 1),
        Taker::Other
    ));
    let handing_over = hung.handing_over(started.pid());
    tokio::time::advance(SUCCESSOR_LIMIT * 2).await;
    settle().await;
    signal(started.pid(), rustix::process::Signal::TERM);
    let status = started.exit().await;
    assert_eq!(
        (status.code(), status.signal()),
        (Some(0), None),
        "killed during its handover: {status:?}"
    );
    drop(handing_over);

    // The same, and the handover fails: killed then.
    let started = hung.start().await;
    let handing_over = hung.handing_over(started.pid());
    tokio::time::advance(SUCCESSOR_LIMIT * 2).await;
    settle().await;
    drop(handing_over);
    let status = started.exit().await;
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");

    // It took over: never killed.
    let took = hung.start().await;
    hung.handing_over(took.pid()).took();
    tokio::time::advance(SUCCESSOR_LIMIT * 2).await;
    settle().await;
    hung.successor
        .abandon()
        .killed(Duration::from_secs(1))
        .await;
    settle().await;
    signal(took.pid(), rustix::process::Signal::TERM);
    let status = took.exit().await;
    assert_eq!(
        (status.code(), status.signal()),
        (Some(0), None),
        "killed after it took over: {status:?}"
    );
}

/// A write lease on a file (`fcntl(F_SETLEASE, F_WRLCK)`, held by perl with the lease
/// break's SIGIO ignored): an `exec` of the file waits until the lease is let go, as that of
/// a binary on a mount that does not answer waits for the mount. Let go when dropped (the
/// holder is killed by its PID), or after 30 s (below the kernel's own 45 s lease break).
struct Lease {
    _holder: Guard,
}

impl Lease {
    fn hold(path: &Path) -> Lease {
        use std::io::BufRead;
        let script = format!(
            "$SIG{{IO}} = 'IGNORE'; open(my $f, '<', $ARGV[0]) or die \"open: $!\"; \
             fcntl($f, {}, {}) or die \"lease: $!\"; $| = 1; print \"held\\n\"; sleep 30;",
            libc::F_SETLEASE,
            libc::F_WRLCK
        );
        let mut child = Command::new("perl")
            .arg("-e")
            .arg(script)
            .arg(path)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("perl: {e}"));
        let out = child
            .stdout
            .take()
            .unwrap_or_else(|| panic!("perl's stdout"));
        let holder = Guard(child);
        let mut line = String::new();
        let _ = std::io::BufReader::new(out).read_line(&mut line);
        assert_eq!(line, "held\n", "no lease on {}", path.display());
        Lease { _holder: holder }
    }
}

/// A successor whose binary's `exec` does not end (a binary on a mount that does not
/// answer; here a file under a lease) holds no thread that serves: `start` returns at once
/// and this runtime's one thread runs on (its timers fire); a SIGUSR2 meanwhile is ignored.
/// Once the `exec` is let go, a successor whose limit passed meanwhile is killed at once, as
/// is one its starter abandoned meanwhile. Before, `start` held the thread that heard
/// SIGUSR2, the one that serves clients, for as long as the `exec` lasted (30 s here).
#[tokio::test]
async fn a_successor_whose_exec_hangs_holds_no_thread_and_is_killed_once_it_runs() {
    use limpet::upgrade::Taker;
    use std::os::unix::process::ExitStatusExt;
    for abandoned in [false, true] {
        // Past its limit while its `exec` lasts, or abandoned with a limit it never reaches.
        let limit = if abandoned {
            Duration::from_secs(365 * 86_400)
        } else {
            Duration::from_secs(1)
        };
        let hung = HungSuccessor::started_by("upgrade-exec-hangs", limit, |dir| {
            use std::os::unix::fs::PermissionsExt;
            let exe = dir.join("limpet-on-a-dead-mount");
            let script = format!(
                "#!/bin/sh\nexec '{}' \"$@\"\n",
                env!("CARGO_BIN_EXE_limpet")
            );
            std::fs::write(&exe, script).unwrap_or_else(|e| panic!("{e}"));
            std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755))
                .unwrap_or_else(|e| panic!("{e}"));
            exe
        });
        let lease = Lease::hold(&hung.exe);
        let t0 = std::time::Instant::now();
        let started = hung
            .successor
            .start()
            .unwrap_or_else(|| panic!("not started"));
        let took = t0.elapsed();
        let mut started = Launched(Some(started));
        assert!(
            took < Duration::from_millis(500),
            "start held its thread {took:?}"
        );
        // Its `exec` is held: no process id while this thread's timer runs out, on time.
        let t1 = std::time::Instant::now();
        assert!(
            tokio::time::timeout(Duration::from_millis(1500), started.running())
                .await
                .is_err(),
            "the exec was not held"
        );
        let held = t1.elapsed();
        assert!(
            held < Duration::from_secs(3),
            "this thread was held {held:?}"
        );
        assert!(
            hung.successor.start().is_none(),
            "a second SIGUSR2 while one is being started"
        );
        if abandoned {
            hung.successor.abandon();
        }
        let let_go = std::time::Instant::now();
        drop(lease);
        let pid = started.running_soon().await;
        let status = started.exit().await;
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
        let at = let_go.elapsed();
        assert!(
            at < Duration::from_secs(5),
            "killed {at:?} after its exec was let go"
        );
        assert!(matches!(hung.successor.handing_over(pid), Taker::Killed));
    }
}

/// A limpet that stops, or hands over to another process, before its successor took over
/// kills it at once, long before its limit (a year here): the successor can no longer take
/// over from it, and left running it would start afresh, or take over from whichever limpet
/// listens by then, with nothing watching it.
#[tokio::test(start_paused = true)]
async fn a_successor_abandoned_by_its_starter_is_killed_at_once() {
    use std::os::unix::process::ExitStatusExt;
    let mut hung =
        HungSuccessor::with_limit("upgrade-abandoned", Duration::from_secs(365 * 86_400));
    let started = hung.start().await;
    let t0 = tokio::time::Instant::now();
    hung.successor
        .abandon()
        .killed(Duration::from_secs(1))
        .await;
    let status = started.exit().await;
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    let at = t0.elapsed();
    assert!(at < Duration::from_secs(1), "killed after {at:?}");
    let again = hung.start().await;
    drop(again);
}
