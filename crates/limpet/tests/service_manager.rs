//! The real `limpet run` under a service manager: what it tells systemd through
//! `NOTIFY_SOCKET` (a Unix datagram socket the test binds where systemd would), and an upgrade
//! in place on SIGUSR2 (the running limpet starts its own successor, which takes over through
//! the upgrade socket and becomes the unit's main process).

mod admin_common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use admin_common::lifecycle::*;

const NODES: [(&str, &str); 2] = [("a", "127.0.0.2"), ("b", "127.0.0.3")];

/// The socket systemd would pass as `NOTIFY_SOCKET`: each message as the text it holds, with
/// the process id of its sender (`SO_PASSCRED`, as systemd reads it to tell the main process
/// from others).
struct Notify {
    sock: tokio::net::UnixDatagram,
    path: PathBuf,
}

impl Notify {
    fn bind(dir: &Path) -> Notify {
        let path = dir.join("notify.sock");
        let sock = tokio::net::UnixDatagram::bind(&path).unwrap_or_else(|e| panic!("{e}"));
        rustix::net::sockopt::set_socket_passcred(&sock, true).unwrap_or_else(|e| panic!("{e}"));
        Notify { sock, path }
    }

    /// A message already received, if any (after its sender exited: every message it sent
    /// is here by then).
    fn pending(&self) -> Option<(u32, String)> {
        Self::receive(&self.sock).ok()
    }

    fn receive(sock: &tokio::net::UnixDatagram) -> Result<(u32, String), rustix::io::Errno> {
        use rustix::net::{recvmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
        use std::mem::MaybeUninit;
        let mut buf = [0u8; 4096];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmCredentials(1))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let mut iov = [std::io::IoSliceMut::new(&mut buf)];
        let got = recvmsg(sock, &mut iov, &mut control, RecvFlags::DONTWAIT)?;
        let pid = control.drain().find_map(|m| match m {
            RecvAncillaryMessage::ScmCredentials(c) => {
                Some(c.pid.as_raw_nonzero().get().unsigned_abs())
            }
            _ => None,
        });
        let text = String::from_utf8_lossy(&buf[..got.bytes]).into_owned();
        Ok((pid.unwrap_or(0), text))
    }

    /// The next message and its sender's pid, within `PATIENCE`.
    async fn next(&self) -> (u32, String) {
        let receive = || Self::receive(&self.sock);
        tokio::time::timeout(
            PATIENCE,
            self.sock.async_io(tokio::io::Interest::READABLE, || {
                receive().map_err(std::io::Error::from)
            }),
        )
        .await
        .unwrap_or_else(|_| panic!("no message within {PATIENCE:?}"))
        .unwrap_or_else(|e| panic!("{e}"))
    }
}

/// Every process whose command line names `config` is killed (SIGKILL, by its PID) when
/// this is dropped: the limpets a test started, and those a limpet started for an upgrade,
/// which are not the test's children.
struct KillAll {
    config: PathBuf,
    child: Option<Child>,
}

impl KillAll {
    fn pids(&self) -> Vec<u32> {
        let needle = self.config.as_os_str().as_encoded_bytes().to_vec();
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        dir.filter_map(Result::ok)
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| c.split(|&b| b == 0).any(|arg| arg == needle.as_slice()))
            })
            .collect()
    }
}

impl Drop for KillAll {
    fn drop(&mut self) {
        for pid in self.pids() {
            signal(pid, "KILL");
        }
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status();
}

/// Whether `pid` has exited: gone, or a zombie nobody has reaped yet.
fn gone(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}

async fn until_gone(pid: u32) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !gone(pid) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "pid {pid} still runs after {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn config(port: u16) -> String {
    format!(
        "{}[[tables]]\nname = \"t\"\nkey = \"source-ip\"\n\n[[listeners]]\nname = \"web\"\n\
         bind = \"127.0.0.1:0\"\nnode_port = {port}\ntable = \"t\"\n\
         timeouts = {{ drain = \"2s\" }}\n\n[admin]\nlisten = \"127.0.0.1:0\"\n",
        nodes_toml(&NODES)
    )
}

/// `limpet run -c CONFIG [--upgrade-socket SOCK]` with `NOTIFY_SOCKET`, once it listens: its
/// process and its first listener's and admin listener's addresses.
async fn start(
    cfg: &ConfigFile,
    notify: &Notify,
    upgrade: Option<&Path>,
) -> (KillAll, std::net::SocketAddr, std::net::SocketAddr) {
    let args: Vec<std::ffi::OsString> = match upgrade {
        Some(sock) => vec!["--upgrade-socket".into(), sock.into()],
        None => Vec::new(),
    };
    start_with(cfg, notify, &args).await
}

/// [`start`] with more arguments.
async fn start_with(
    cfg: &ConfigFile,
    notify: &Notify,
    more: &[std::ffi::OsString],
) -> (KillAll, std::net::SocketAddr, std::net::SocketAddr) {
    let err = std::fs::File::create(cfg.dir.join("limpet.err")).unwrap_or_else(|e| panic!("{e}"));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_limpet"));
    cmd.args(["run", "--threads", "1", "-c"])
        .arg(&cfg.path)
        .args(more);
    let mut child = cmd
        .env("NOTIFY_SOCKET", &notify.path)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::from(err))
        .spawn()
        .unwrap_or_else(|e| panic!("limpet run: {e}"));
    let started = printed_addresses(child.stdout.take());
    let guard = KillAll {
        config: cfg.path.clone(),
        child: Some(child),
    };
    let (web, admin) = tokio::time::timeout(PATIENCE, started)
        .await
        .unwrap_or_else(|_| panic!("limpet did not start"))
        .unwrap_or_else(|_| panic!("limpet exited before listening"));
    (guard, web, admin)
}

/// SIGTERM to `pid`, a limpet that took over (not the test's child): it says STOPPING=1,
/// then exits.
async fn took_over_stops_on_sigterm(notify: &Notify, pid: u32) {
    signal(pid, "TERM");
    assert_eq!(notify.next().await, (pid, "STOPPING=1\n".to_owned()));
    until_gone(pid).await;
}

/// The value of `key` in a notify message (`KEY=value` lines).
fn field<'a>(msg: &'a str, key: &str) -> Option<&'a str> {
    msg.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
}

/// SIGTERM to `pid`: it says STOPPING=1, then exits 0 (the test's own child, reaped here).
async fn stops_on_sigterm(notify: &Notify, guard: &mut KillAll, pid: u32) {
    signal(pid, "TERM");
    let (from, stopping) = notify.next().await;
    assert_eq!(from, pid);
    assert_eq!(field(&stopping, "STOPPING"), Some("1"), "{stopping:?}");
    until_gone(pid).await;
    let status = guard
        .child
        .as_mut()
        .map(|c| c.wait().unwrap_or_else(|e| panic!("{e}")));
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
}

/// READY=1 once every listener serves; RELOADING=1 (with MONOTONIC_USEC, which
/// `Type=notify-reload` requires) and READY=1 around each SIGHUP reload, a refused one
/// included; STOPPING=1 at SIGTERM. SIGUSR2 without an upgrade socket changes nothing (by
/// its default action it would kill the process).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limpet_tells_systemd_it_is_ready_reloading_and_stopping() {
    let (_nodes, port) = backend_nodes(&NODES).await;
    let cfg = ConfigFile::new("notify", &config(port));
    let notify = Notify::bind(&cfg.dir);
    let (mut guard, web, _) = start(&cfg, &notify, None).await;
    let pid = guard.child.as_ref().map_or(0, Child::id);

    let (from, ready) = notify.next().await;
    assert_eq!(from, pid);
    assert_eq!(field(&ready, "READY"), Some("1"), "{ready:?}");
    assert!(
        field(&ready, "STATUS").is_some_and(|s| s.starts_with("serving")),
        "{ready:?}"
    );
    node_for("127.0.0.51", web).await;

    signal(pid, "HUP");
    let (_, reloading) = notify.next().await;
    assert_eq!(field(&reloading, "RELOADING"), Some("1"), "{reloading:?}");
    assert!(
        field(&reloading, "MONOTONIC_USEC").is_some_and(|v| v.parse::<u64>().is_ok()),
        "{reloading:?}"
    );
    let (_, reloaded) = notify.next().await;
    assert_eq!(field(&reloaded, "READY"), Some("1"), "{reloaded:?}");
    assert!(
        field(&reloaded, "STATUS")
            .is_some_and(|s| s.contains("configuration generation") && s.ends_with("loaded")),
        "{reloaded:?}"
    );

    cfg.write("[[listeners]]\nname = 3\n");
    signal(pid, "HUP");
    assert_eq!(field(&notify.next().await.1, "RELOADING"), Some("1"));
    let (_, refused) = notify.next().await;
    assert_eq!(field(&refused, "READY"), Some("1"), "{refused:?}");
    assert!(
        field(&refused, "STATUS").is_some_and(|s| s.contains("reload refused")),
        "{refused:?}"
    );

    signal(pid, "USR2");
    // Still serving, on the running config: the refused reload and the USR2 changed nothing.
    node_for("127.0.0.52", web).await;

    stops_on_sigterm(&notify, &mut guard, pid).await;
}

/// SIGUSR2 to a `limpet run --upgrade-socket`: it starts its own binary again with its
/// arguments; the new one takes the sockets, pins and node states over, and the old one
/// names it the unit's main process (MAINPID) before draining and exiting 0, without a
/// STOPPING=1 that would stop the unit. A successor that cannot start (a bad config) exits
/// and leaves the running one serving, and a later SIGUSR2 succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigusr2_upgrades_in_place_and_hands_the_unit_to_the_new_limpet() {
    let (_nodes, port) = backend_nodes(&NODES).await;
    let good = config(port);
    let cfg = ConfigFile::new("notify-usr2", &good);
    let notify = Notify::bind(&cfg.dir);
    let sock = cfg.dir.join("upgrade.sock");
    let (mut guard, web, admin) = start(&cfg, &notify, Some(&sock)).await;
    let old = guard.child.as_ref().map_or(0, Child::id);
    assert_eq!(
        notify.next().await,
        (
            old,
            "READY=1\nSTATUS=serving 1 listening sockets\n".to_owned()
        )
    );
    let pinned = node_for("127.0.0.61", web).await;

    // A successor that cannot start: the running one hears of it only in its log.
    cfg.write("[[listeners]]\nname = 3\n");
    signal(old, "USR2");
    let log = cfg.dir.join("limpet.err");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("the new limpet started for an upgrade exited")
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the failed successor was not reaped"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(node_for("127.0.0.61", web).await, pinned);
    assert!(!gone(old));

    cfg.write(&good);
    signal(old, "USR2");
    // Two messages, in either order: the old one, still the main process, names the new one
    // main and says the unit is ready (systemd's default `NotifyAccess=main` takes only its
    // word); the new one says the same of itself (for `NotifyAccess=all`).
    let (mut handed, mut took) = (None, None);
    while handed.is_none() || took.is_none() {
        let (from, msg) = notify.next().await;
        let main: u32 = field(&msg, "MAINPID")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("{msg:?}"));
        assert_ne!(main, old, "{msg:?}");
        assert_eq!(field(&msg, "READY"), Some("1"), "{msg:?}");
        assert!(
            field(&msg, "STATUS").is_some_and(|s| s.ends_with(&format!("from pid {old}"))),
            "{msg:?}"
        );
        if from == old {
            handed = Some(main);
        } else {
            assert_eq!(from, main, "the new one names itself");
            took = Some(main);
        }
    }
    assert_eq!(handed, took);
    let new = took.unwrap_or_default();
    let status = guard
        .child
        .as_mut()
        .map(|c| c.wait().unwrap_or_else(|e| panic!("{e}")));
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    guard.child = None;

    // The new one serves the same addresses, with the old one's pins.
    assert!(!gone(new));
    assert_eq!(node_for("127.0.0.61", web).await, pinned);
    let view = json(&format!("http://{admin}/api/v1/nodes/{pinned}")).await;
    assert_eq!(view["state"], "UP", "{view}");
    // The old one said nothing after handing over (its drain's end is no STOPPING=1 of the
    // unit's); the new one says it stops.
    took_over_stops_on_sigterm(&notify, new).await;
}

/// A successor that took over is never killed by the limpet that started it, however long
/// that one's drain lasts past the successor's limit (`--upgrade-limit 3s`; the old one's
/// drain held 8 s by a TCP session through it): the old one marks the handover as taken
/// once the new one said "took". Before it did, its watcher would have killed the unit's
/// new main process at the limit while it drained.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successor_that_took_over_outlives_its_limit_while_the_old_one_drains() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (_nodes, port) = backend_nodes(&NODES).await;
    let text = format!(
        "{}[[listeners]]\nname = \"raw\"\nbind = \"127.0.0.1:0\"\nmode = \"tcp\"\n\
         node_port = {port}\ntimeouts = {{ drain = \"8s\" }}\n\n[admin]\nlisten = \"127.0.0.1:0\"\n",
        nodes_toml(&NODES)
    );
    let cfg = ConfigFile::new("notify-usr2-limit", &text);
    let notify = Notify::bind(&cfg.dir);
    let sock = cfg.dir.join("upgrade.sock");
    let limit = Duration::from_secs(3);
    let args = [
        "--upgrade-socket".into(),
        sock.into(),
        "--upgrade-limit".into(),
        "3s".into(),
    ];
    let (mut guard, raw, _) = start_with(&cfg, &notify, &args).await;
    let old = guard.child.as_ref().map_or(0, Child::id);
    assert_eq!(field(&notify.next().await.1, "READY"), Some("1"));

    // One request through the TCP listener; the session stays open after its answer.
    let get = b"GET / HTTP/1.1\r\nHost: t\r\n\r\n";
    let mut session = tokio::net::TcpStream::connect(raw)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    session
        .write_all(get)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut buf = [0u8; 12];
    tokio::time::timeout(PATIENCE, session.read_exact(&mut buf))
        .await
        .unwrap_or_else(|_| panic!("no answer through the TCP listener"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(&buf, b"HTTP/1.1 200");

    signal(old, "USR2");
    // The old one's word and the new one's, in either order.
    let (mut handed, mut took) = (None, None);
    while handed.is_none() || took.is_none() {
        let (from, msg) = notify.next().await;
        let main = field(&msg, "MAINPID").and_then(|p| p.parse::<u32>().ok());
        if from == old {
            handed = main;
        } else {
            took = main;
        }
    }
    assert_eq!(handed, took);
    let new = took.unwrap_or_default();
    let took_at = tokio::time::Instant::now();
    // The guard stays (it kills every limpet of this config when dropped), its child waited
    // for on a thread.
    let mut old_child = guard.child.take();
    let status = tokio::task::spawn_blocking(move || {
        old_child
            .as_mut()
            .map(|c| c.wait().unwrap_or_else(|e| panic!("{e}")))
    });
    let status = tokio::time::timeout(PATIENCE, status)
        .await
        .unwrap_or_else(|_| panic!("the old limpet did not exit"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    assert!(
        took_at.elapsed() >= limit,
        "the old one's drain ended before the new one's limit: the test shows nothing"
    );
    drop(session);

    let log = std::fs::read_to_string(cfg.dir.join("limpet.err")).unwrap_or_default();
    assert!(!gone(new), "the new limpet was killed: {log}");
    assert!(!log.contains("killing it"), "{log}");
    let mut again = tokio::net::TcpStream::connect(raw)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    again.write_all(get).await.unwrap_or_else(|e| panic!("{e}"));
    tokio::time::timeout(PATIENCE, again.read_exact(&mut buf))
        .await
        .unwrap_or_else(|_| panic!("no answer from the new limpet"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(&buf, b"HTTP/1.1 200");
    drop(again);
    took_over_stops_on_sigterm(&notify, new).await;
}

/// A successor hung reading its config (a FIFO nobody writes in place of the file, as a
/// mount that does not answer) is killed, long before its limit, when the limpet that
/// started it stops, or when another limpet takes over from that one: it could no longer
/// take over from its starter, and nothing would watch it any more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successor_hung_on_its_config_is_killed_when_its_starter_stops() {
    let (_nodes, port) = backend_nodes(&NODES).await;
    let cfg = ConfigFile::new("notify-usr2-abandoned", &config(port));
    let notify = Notify::bind(&cfg.dir);
    let (mut guard, successor) = hung_successor(&cfg, &notify).await;
    let old = guard.child.as_ref().map_or(0, Child::id);
    stops_on_sigterm(&notify, &mut guard, old).await;
    until_gone(successor).await;
    let text = std::fs::read_to_string(cfg.dir.join("limpet.err")).unwrap_or_default();
    assert!(
        text.contains("can no longer take over: killing it"),
        "{text}"
    );
}

/// The same when an operator's own `limpet run` (another config file, the same listeners and
/// upgrade socket) takes over from the starter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successor_hung_on_its_config_is_killed_when_another_limpet_takes_over() {
    let (_nodes, port) = backend_nodes(&NODES).await;
    let cfg = ConfigFile::new("notify-usr2-overtaken", &config(port));
    let notify = Notify::bind(&cfg.dir);
    let (mut guard, successor) = hung_successor(&cfg, &notify).await;
    let old = guard.child.take();
    let other = ConfigFile::new("notify-usr2-other", &config(port));
    let other_notify = Notify::bind(&other.dir);
    let (mut other_guard, _, _) =
        start(&other, &other_notify, Some(&cfg.dir.join("upgrade.sock"))).await;
    let status = tokio::task::spawn_blocking(move || {
        old.map(|mut c| c.wait().unwrap_or_else(|e| panic!("{e}")))
    });
    let status = tokio::time::timeout(PATIENCE, status)
        .await
        .unwrap_or_else(|_| panic!("the old limpet did not exit"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    until_gone(successor).await;
    let text = std::fs::read_to_string(cfg.dir.join("limpet.err")).unwrap_or_default();
    assert!(
        text.contains("can no longer take over: killing it"),
        "{text}"
    );
    let new = other_guard.child.as_ref().map_or(0, Child::id);
    assert_eq!(field(&other_notify.next().await.1, "READY"), Some("1"));
    stops_on_sigterm(&other_notify, &mut other_guard, new).await;
}

/// A reload signal that reaches a limpet while it reads its config is kept, not fatal: a
/// successor started for an upgrade, reading its config from a slow mount (here a FIFO),
/// got an operator's `pkill -HUP limpet` too, and SIGHUP's default action killed it there,
/// unseen, and the upgrade with it. Now it takes over once its config comes, and the
/// SIGHUP is its first reload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sighup_while_a_successor_reads_its_config_is_its_first_reload() {
    use std::io::Write;
    let (_nodes, port) = backend_nodes(&NODES).await;
    let good = config(port);
    let cfg = ConfigFile::new("notify-usr2-hup", &good);
    let notify = Notify::bind(&cfg.dir);
    let (mut guard, successor) = hung_successor(&cfg, &notify).await;
    // Open for reading by the successor: it is in its config's read.
    let mut writer = fifo_writer_once_read(&cfg.path).await;
    signal(successor, "HUP");
    // Queued before the read returns: by the default action it kills on the way out of it.
    let _ = writer.write_all(good.as_bytes());
    drop(writer);
    // In any order across the two processes: the old one's word that the successor is the
    // main process; the successor's own, then its reload (of the kept SIGHUP), which reads
    // the config again from the FIFO, then the reload's end.
    let (mut handed, mut took, mut reloaded, mut reload_end) = (false, false, false, false);
    while !(handed && reload_end) {
        let (from, msg) = notify.next().await;
        let main = field(&msg, "MAINPID") == Some(&successor.to_string());
        if from != successor {
            assert!(main, "{msg:?}");
            handed = true;
        } else if main {
            assert_eq!(field(&msg, "READY"), Some("1"), "{msg:?}");
            took = true;
        } else if field(&msg, "RELOADING") == Some("1") {
            assert!(took, "reloaded before it took over: {msg:?}");
            reloaded = true;
            let mut writer = fifo_writer_once_read(&cfg.path).await;
            writer.write_all(good.as_bytes()).expect("config");
        } else {
            assert!(reloaded, "{msg:?}");
            assert_eq!(field(&msg, "READY"), Some("1"), "the reload's end: {msg:?}");
            reload_end = true;
        }
    }
    let status = guard
        .child
        .as_mut()
        .map(|c| c.wait().unwrap_or_else(|e| panic!("{e}")));
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    guard.child = None;
    took_over_stops_on_sigterm(&notify, successor).await;
}

/// A `limpet run --upgrade-socket` started with `cfg`, told SIGUSR2 once its config is a FIFO
/// nobody writes: the successor it starts hangs reading it. The running limpet, and the
/// successor's pid (from the running one's log).
async fn hung_successor(cfg: &ConfigFile, notify: &Notify) -> (KillAll, u32) {
    let sock = cfg.dir.join("upgrade.sock");
    let (guard, _, _) = start(cfg, notify, Some(&sock)).await;
    let old = guard.child.as_ref().map_or(0, Child::id);
    assert_eq!(field(&notify.next().await.1, "READY"), Some("1"));
    fifo_in_place_of(&cfg.path);
    signal(old, "USR2");
    let log = cfg.dir.join("limpet.err");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let successor = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let pid = text
            .lines()
            .find(|l| l.contains("started a new limpet to take over"))
            .and_then(|l| l.split("pid=").nth(1))
            .and_then(|rest| rest.split(' ').next())
            .and_then(|p| p.parse::<u32>().ok());
        if let Some(pid) = pid {
            break pid;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no successor started: {text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(!gone(successor));
    (guard, successor)
}

/// A limpet started to take over from one pid (`LIMPET_UPGRADE_FROM`) that finds another
/// limpet at the upgrade socket does not take over from it: its starter stopped or handed
/// over meanwhile, and the one there now did not ask for it. It exits 2, and the limpet
/// there serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successor_does_not_take_over_from_a_limpet_other_than_its_starter() {
    let (_nodes, port) = backend_nodes(&NODES).await;
    let cfg = ConfigFile::new("notify-other-starter", &config(port));
    let notify = Notify::bind(&cfg.dir);
    let sock = cfg.dir.join("upgrade.sock");
    let (mut guard, web, _) = start(&cfg, &notify, Some(&sock)).await;
    let running = guard.child.as_ref().map_or(0, Child::id);
    assert_eq!(field(&notify.next().await.1, "READY"), Some("1"));
    let pinned = node_for("127.0.0.71", web).await;
    let out = successor_of_another(&cfg.path, &sock, "it took over").await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(&format!("but pid {running} listens")), "{err}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("listening on"));
    assert!(!gone(running));
    assert_eq!(node_for("127.0.0.71", web).await, pinned);
    stops_on_sigterm(&notify, &mut guard, running).await;
}

/// `limpet run -c CONFIG --upgrade-socket SOCK` as if started for an upgrade by a limpet of
/// a pid that none has (`LIMPET_UPGRADE_FROM`, above the kernel's largest), once it exited
/// (within `PATIENCE`, else it did what `not` says).
async fn successor_of_another(config: &Path, sock: &Path, not: &str) -> std::process::Output {
    let out = tokio::task::spawn_blocking({
        let (path, sock) = (config.to_owned(), sock.to_owned());
        move || {
            Command::new(env!("CARGO_BIN_EXE_limpet"))
                .args(["run", "--threads", "1", "-c"])
                .arg(&path)
                .arg("--upgrade-socket")
                .arg(&sock)
                .env("LIMPET_UPGRADE_FROM", "4194321")
                .stdin(Stdio::null())
                .output()
        }
    });
    tokio::time::timeout(PATIENCE, out)
        .await
        .unwrap_or_else(|_| panic!("limpet did not exit: {not}"))
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A limpet started by a running one for an upgrade (`LIMPET_UPGRADE_FROM` set), that finds
/// nobody at the upgrade socket (its starter was stopped meanwhile), does not start afresh:
/// it would serve on after the operator stopped the service. It exits 2 and binds nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successor_whose_starter_stopped_does_not_start_afresh() {
    let (_nodes, port) = backend_nodes(&NODES).await;
    let cfg = ConfigFile::new("notify-orphan", &config(port));
    let sock = cfg.dir.join("upgrade.sock");
    // Should it start afresh after all, killed when the test ends.
    let _guard = KillAll {
        config: cfg.path.clone(),
        child: None,
    };
    let out = successor_of_another(&cfg.path, &sock, "it started afresh").await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("no longer listens"), "{err}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("listening on"));
    assert!(!sock.exists(), "no upgrade socket bound");
}

/// A stop while a reload waits on its file (a FIFO nobody writes, as a hung mount): systemd
/// hears RELOADING=1, then STOPPING=1, and nothing after it; the reload the stop cut short
/// says no READY=1 that would read as the unit serving again while it stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_cut_short_by_a_stop_says_nothing_after_stopping() {
    let (_nodes, port) = backend_nodes(&NODES).await;
    let cfg = ConfigFile::new("notify-cut", &config(port));
    let notify = Notify::bind(&cfg.dir);
    let (mut guard, _, _) = start(&cfg, &notify, None).await;
    let pid = guard.child.as_ref().map_or(0, Child::id);
    assert_eq!(field(&notify.next().await.1, "READY"), Some("1"));

    fifo_in_place_of(&cfg.path);
    signal(pid, "HUP");
    assert_eq!(field(&notify.next().await.1, "RELOADING"), Some("1"));
    signal(pid, "TERM");
    assert_eq!(notify.next().await, (pid, "STOPPING=1\n".to_owned()));
    let status = guard
        .child
        .as_mut()
        .map(|c| c.wait().unwrap_or_else(|e| panic!("{e}")));
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    assert_eq!(notify.pending(), None, "a message after STOPPING=1");
}

/// A stdout nobody reads (journald stalled, a pipe whose reader hung) holds nothing up: the
/// lines that say where limpet listens are written by a thread of their own, and the main
/// thread says READY=1, takes SIGTERM (STOPPING=1) and exits 0 while they still wait. With
/// one worker the main thread also serves the listeners. Before, it wrote them itself after
/// the listeners began to accept, and hung there: no READY, no admin API, no health checks,
/// no signals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stdout_nobody_reads_holds_up_neither_ready_nor_the_stop() {
    let (_nodes, port) = backend_nodes(&NODES).await;
    let cfg = ConfigFile::new("notify-stdout-full", &config(port));
    let notify = Notify::bind(&cfg.dir);
    // A pipe filled to the brim, its reader kept and never read.
    let (_reader, writer) = std::io::pipe().unwrap_or_else(|e| panic!("{e}"));
    let full = tokio::net::unix::pipe::Sender::from_owned_fd(writer.into())
        .unwrap_or_else(|e| panic!("{e}"));
    let chunk = [b'x'; 4096];
    loop {
        full.writable().await.unwrap_or_else(|e| panic!("{e}"));
        match full.try_write(&chunk) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("{e}"),
        }
    }
    let stdout = full.into_blocking_fd().unwrap_or_else(|e| panic!("{e}"));
    let err = std::fs::File::create(cfg.dir.join("limpet.err")).unwrap_or_else(|e| panic!("{e}"));
    let child = Command::new(env!("CARGO_BIN_EXE_limpet"))
        .args(["run", "--threads", "1", "-c"])
        .arg(&cfg.path)
        .env("NOTIFY_SOCKET", &notify.path)
        .stdout(Stdio::from(stdout))
        .stderr(Stdio::from(err))
        .spawn()
        .unwrap_or_else(|e| panic!("limpet run: {e}"));
    let pid = child.id();
    let mut guard = KillAll {
        config: cfg.path.clone(),
        child: Some(child),
    };
    let (from, ready) = notify.next().await;
    assert_eq!(from, pid);
    assert_eq!(field(&ready, "READY"), Some("1"), "{ready:?}");
    stops_on_sigterm(&notify, &mut guard, pid).await;
}

/// A service manager that stops reading its socket (a PID 1 that hung, a container
/// supervisor gone quiet) holds up no thread of limpet's: its queue full, the main thread
/// goes on to serve the admin API, and READY=1 waits on a thread of its own, to reach the
/// manager, in order, once it reads again; then SIGTERM gives STOPPING=1 and exit 0. Before,
/// the send waited for room on the main thread, for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_manager_that_stops_reading_holds_nothing_up() {
    let (_nodes, port) = backend_nodes(&NODES).await;
    let cfg = ConfigFile::new("notify-full", &config(port));
    let notify = Notify::bind(&cfg.dir);
    // Its queue filled to the brim: filler sockets each send until they cannot, until a
    // fresh one cannot send even once (a socket's own send buffer can run out before the
    // manager's queue, at `net.unix.max_dgram_qlen`, is full).
    let mut fillers = Vec::new();
    let mut queued = 0;
    'full: loop {
        let filler = std::os::unix::net::UnixDatagram::unbound().unwrap_or_else(|e| panic!("{e}"));
        filler
            .set_nonblocking(true)
            .unwrap_or_else(|e| panic!("{e}"));
        let mut sent = 0;
        loop {
            match filler.send_to(b"STATUS=filler\n", &notify.path) {
                Ok(_) => sent += 1,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("{e}"),
            }
        }
        fillers.push(filler);
        queued += sent;
        assert!(queued < 100_000, "the queue never filled");
        if sent == 0 {
            break 'full;
        }
    }
    let (mut guard, _web, admin) = start(&cfg, &notify, None).await;
    let pid = guard.child.as_ref().map_or(0, Child::id);
    let nodes = bare_client()
        .get(format!("http://{admin}/api/v1/nodes"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("the admin API does not answer: {e}"));
    assert_eq!(nodes.status(), 200);
    // The manager reads again: the fillers, then limpet's READY=1.
    let ready = loop {
        let (from, msg) = notify.next().await;
        if from == pid {
            break msg;
        }
        assert_eq!(msg, "STATUS=filler\n");
    };
    assert_eq!(field(&ready, "READY"), Some("1"), "{ready:?}");
    stops_on_sigterm(&notify, &mut guard, pid).await;
}
