//! # What limpet tells its service manager: systemd's notify protocol
//!
//! Under a unit with `Type=notify` (or `Type=notify-reload`), systemd passes `NOTIFY_SOCKET`
//! and waits for the service to say how it is. `limpet run` says:
//!
//! ```text
//!  serving (every listener accepting)        READY=1, STATUS=...
//!  a reload begins (SIGHUP or admin API)     RELOADING=1, MONOTONIC_USEC=...
//!  the reload is over (applied or refused)   READY=1, STATUS=...
//!  a stop signal: the drain begins           STOPPING=1
//!  an upgrade: the new limpet took over      (old)  MAINPID=<new>, READY=1, STATUS=...
//!                                            (new)  MAINPID=<own>, READY=1, STATUS=...
//!  after STOPPING=1, or after handing over   nothing
//! ```
//!
//! A unit's main process is the one systemd watches: when a binary upgrade
//! ([`crate::upgrade`]) hands the sockets to a new process, the old one names the new one
//! main before it drains and exits, so its exit does not end the unit (with the default
//! `NotifyAccess=main` only the main process may do that, which the old one still is then;
//! the new one says it again for `NotifyAccess=all`). After handing over, the old one says
//! nothing more: its `STOPPING=1` would stop the unit the new one now serves.
//!
//! Without `NOTIFY_SOCKET` (not under systemd) every call does nothing. Messages go out in
//! order from a thread of their own, so a manager that stops reading holds no thread of
//! limpet's; a message that cannot be sent is logged and changes nothing else: limpet serves
//! whether or not its manager hears it. Before exiting, `limpet run` waits up to 5 s for
//! the messages still queued ([`flush`]).

use std::sync::atomic::{AtomicBool, Ordering};

use sd_notify::NotifyState;

/// Set once this process has named another the unit's main process: from then on it says
/// nothing (its drain's end), since the unit is the new one's.
static HANDED_OVER: AtomicBool = AtomicBool::new(false);

/// Set once this process said `STOPPING=1`: a reload that ends after it (one the stop cut
/// short, whose guard drops later) says nothing, or systemd would read the unit as ready
/// again while it stops. (No reload starts after a stop: `runtime::control::ReloadTasks`.)
static STOPPING: AtomicBool = AtomicBool::new(false);

/// Sends `states` in one message (nothing without `NOTIFY_SOCKET`, or after handing over).
/// The variable is kept: a new limpet started for an upgrade
/// ([`crate::upgrade::Successor`]) needs it too.
fn send(states: &[NotifyState<'_>]) {
    if !HANDED_OVER.load(Ordering::Acquire) {
        send_anyway(states);
    }
}

fn send_anyway(states: &[NotifyState<'_>]) {
    let outbox = match outbox() {
        Outbox::Unmanaged => return,
        Outbox::Thread(outbox) => outbox,
        // No thread could be had: said here, waiting for room at most `HERE_LIMIT`.
        Outbox::Here(path) => {
            if let Err(e) = send_to(path, &message(states), Some(HERE_LIMIT)) {
                tracing::warn!(error = %e, "could not notify the service manager (NOTIFY_SOCKET)");
            }
            return;
        }
    };
    match outbox.try_send(Out::Message(message(states))) {
        Ok(()) => {}
        Err(std::sync::mpsc::TrySendError::Full(_)) => tracing::warn!(
            "a message to the service manager dropped: {OUTBOX_LEN} wait already (it does not read NOTIFY_SOCKET)"
        ),
        Err(std::sync::mpsc::TrySendError::Disconnected(_)) => {
            tracing::warn!("a message to the service manager dropped: its sender thread is gone")
        }
    }
}

/// One message: each state on a line of its own, as `sd_notify::notify` writes them.
fn message(states: &[NotifyState<'_>]) -> String {
    states.iter().map(|s| format!("{s}\n")).collect()
}

/// What the sender thread is given: a message, or a flush to answer once every message
/// before it went out.
enum Out {
    Message(String),
    Flush(std::sync::mpsc::Sender<()>),
}

/// How many messages may wait for the service manager: far more than limpet sends while a
/// manager could stall (a reload sends two, and reloads asked for meanwhile share one), so
/// none is dropped, STOPPING=1 and MAINPID included, short of a storm of reloads the whole
/// while.
const OUTBOX_LEN: usize = 1024;

/// How long a message said on the caller's thread ([`Outbox::Here`]) waits for room at the
/// manager's socket before it is dropped and logged.
const HERE_LIMIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Where messages go.
enum Outbox {
    /// Not under a service manager (no `NOTIFY_SOCKET`).
    Unmanaged,
    /// To the sender thread, which sends them in order.
    Thread(std::sync::mpsc::SyncSender<Out>),
    /// No thread could be had: sent on the caller's, to the socket at this path.
    Here(std::ffi::OsString),
}

/// The messages to the service manager, sent in order by a thread of their own: a datagram
/// send waits while the manager's queue is full (a PID 1 that stopped reading, a container
/// supervisor that hung), and these are said on the runtime's threads (the main one takes
/// the signals and serves the admin API and the health checks). A manager that reads again
/// later gets every message, in order (a READY=1 dropped instead would fail the unit at its
/// start timeout). `NOTIFY_SOCKET` is read once, at the first message.
fn outbox() -> &'static Outbox {
    static OUTBOX: std::sync::OnceLock<Outbox> = std::sync::OnceLock::new();
    OUTBOX.get_or_init(|| {
        let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
            return Outbox::Unmanaged;
        };
        let (tx, rx) = std::sync::mpsc::sync_channel(OUTBOX_LEN);
        let to = path.clone();
        let sender = std::thread::Builder::new()
            .name("limpet-notify".to_owned())
            .spawn(move || {
                for out in rx {
                    match out {
                        Out::Message(msg) => {
                            if let Err(e) = send_to(&to, &msg, None) {
                                tracing::warn!(error = %e, "could not notify the service manager (NOTIFY_SOCKET)");
                            }
                        }
                        Out::Flush(done) => {
                            let _ = done.send(());
                        }
                    }
                }
            });
        match sender {
            Ok(_) => Outbox::Thread(tx),
            Err(e) => {
                tracing::warn!(error = %e, "no thread to notify the service manager: said on the caller's");
                Outbox::Here(path)
            }
        }
    })
}

/// `sd_notify::notify`'s send (one datagram of `KEY=value` lines to the socket at `path`, a
/// socket of its own each time, so a manager that restarted is found again), of a message
/// already made, waiting for room at most `limit` (`None`: as long as it takes).
fn send_to(
    path: &std::ffi::OsStr,
    msg: &str,
    limit: Option<std::time::Duration>,
) -> std::io::Result<()> {
    let sock = std::os::unix::net::UnixDatagram::unbound()?;
    sock.set_write_timeout(limit)?;
    sock.connect(path)?;
    if sock.send(msg.as_bytes())? == msg.len() {
        Ok(())
    } else {
        Err(std::io::ErrorKind::WriteZero.into())
    }
}

/// Waits until every message said so far has gone out to the service manager, for at most
/// `limit`: before the process exits (its last words, STOPPING=1 or the new main process's
/// pid after an upgrade, must not die with it).
pub fn flush(limit: std::time::Duration) {
    use std::sync::mpsc::TrySendError;
    let Outbox::Thread(outbox) = outbox() else {
        return;
    };
    let until = std::time::Instant::now() + limit;
    let (done, sent) = std::sync::mpsc::channel();
    let mut flush = Out::Flush(done);
    // A full queue makes room as the manager reads again.
    let queued = loop {
        match outbox.try_send(flush) {
            Ok(()) => break true,
            Err(TrySendError::Full(again)) if std::time::Instant::now() < until => {
                flush = again;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(TrySendError::Full(_)) => break false,
            Err(TrySendError::Disconnected(_)) => {
                tracing::warn!("messages to the service manager not sent before exiting: its sender thread is gone");
                return;
            }
        }
    };
    let left = until.saturating_duration_since(std::time::Instant::now());
    if !queued || sent.recv_timeout(left).is_err() {
        tracing::warn!(
            limit_s = limit.as_secs(),
            "messages to the service manager not sent before exiting (it does not read NOTIFY_SOCKET)"
        );
    }
}

/// Whether a service manager listens (`NOTIFY_SOCKET` is set).
fn managed() -> bool {
    std::env::var_os("NOTIFY_SOCKET").is_some()
}

/// A `STATUS` on one line: systemd shows a status up to its first line break (a config
/// error's text may have several).
fn one_line(status: &str) -> String {
    status.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Every listener accepts: the unit is started (or a reload is over). Not once stopping.
pub fn ready(status: &str) {
    if !STOPPING.load(Ordering::Acquire) {
        send(&[NotifyState::Ready, NotifyState::Status(&one_line(status))]);
    }
}

/// A reload under way, told to the service manager: `RELOADING=1` now, and `READY=1` with
/// the status given to [`done`](Self::done), or, if the reload is dropped before it is done,
/// with "reload abandoned": systemd waits for `READY=1` after `RELOADING=1`, and would
/// otherwise show the unit reloading until its timeout. After `STOPPING=1` neither is said
/// ([`ready`]); `limpet run` aborts reloads only after it (`runtime::control::ReloadTasks`),
/// so "abandoned" is said only for a reload that failed (a panic) or a stop of an embedding
/// program that said no `STOPPING=1`.
#[derive(Debug)]
pub struct Reload {
    over: bool,
}

impl Reload {
    pub fn begin() -> Reload {
        reloading();
        Reload { over: false }
    }

    pub fn done(mut self, status: &str) {
        self.over = true;
        ready(status);
    }
}

impl Drop for Reload {
    fn drop(&mut self) {
        if !self.over {
            ready("serving; reload abandoned, the running configuration stays");
        }
    }
}

/// A reload begins. `MONOTONIC_USEC` goes with it: `Type=notify-reload` (systemd 253 and
/// later) requires it to tell this reload's messages from a late one's.
fn reloading() {
    if STOPPING.load(Ordering::Acquire) {
        return;
    }
    match NotifyState::monotonic_usec_now() {
        Ok(now) => send(&[NotifyState::Reloading, now]),
        Err(_) => send(&[NotifyState::Reloading]),
    }
}

/// A stop signal: the drain begins. Not after handing over to a new limpet.
pub fn stopping() {
    STOPPING.store(true, Ordering::Release);
    send(&[NotifyState::Stopping]);
}

/// A new limpet (`pid`) took over: it is the unit's main process from now on, ready, and
/// this one says nothing more. Said by this one, still the main process as it says it: with
/// the default `NotifyAccess=main`, systemd takes only the main process's word, and the new
/// one's own message ([`took_over`]) may come first and be dropped.
pub fn handed_over(pid: u32) {
    HANDED_OVER.store(true, Ordering::Release);
    let status = format!(
        "serving: pid {pid} took over from pid {}",
        std::process::id()
    );
    send_anyway(&[
        NotifyState::MainPid(pid),
        NotifyState::Ready,
        NotifyState::Status(&status),
    ]);
}

/// Whether process `pid` may become this service's main process: systemd accepts only a
/// process of the service's own control group (a new limpet started from a shell is in the
/// shell's, and systemd would refuse it, leaving the unit to stop with this process while
/// the new one serves outside it). Always yes when no service manager listens.
pub fn may_take_over(pid: u32) -> Result<(), String> {
    if !managed() {
        return Ok(());
    }
    let read = |who: &str| std::fs::read_to_string(format!("/proc/{who}/cgroup")).ok();
    match (read("self"), read(&pid.to_string())) {
        (Some(own), Some(theirs)) if same_service(&own, &theirs) => Ok(()),
        (Some(own), Some(theirs)) => Err(format!(
            "the new limpet (pid {pid}) runs outside this service's control group ({} here, {} there): under a service manager, upgrade with SIGUSR2 to this limpet, which starts the new one inside the service",
            service_cgroup(&own).unwrap_or("?"),
            service_cgroup(&theirs).unwrap_or("?")
        )),
        _ => Err(format!("the control group of pid {pid} is unknown")),
    }
}

/// The control group systemd tracks a process by, from its `/proc/PID/cgroup`: the unified
/// hierarchy's (`0::PATH`) under cgroup v2, else the `name=systemd` one (v1, hybrid).
fn service_cgroup(text: &str) -> Option<&str> {
    let line = |prefix: &str| {
        text.lines().find_map(|l| {
            l.split_once(':')
                .and_then(|(_, rest)| rest.strip_prefix(prefix))
        })
    };
    line("name=systemd:").or_else(|| line(":"))
}

/// Whether two `/proc/PID/cgroup` texts are of one service: the same control group systemd
/// tracks, or, on a host without systemd's (cgroup v1 with no `name=systemd`), the same
/// groups in every hierarchy.
fn same_service(a: &str, b: &str) -> bool {
    match (service_cgroup(a), service_cgroup(b)) {
        (Some(x), Some(y)) => x == y,
        (None, None) => !a.trim().is_empty() && a == b,
        _ => false,
    }
}

/// This process took over from a running limpet and serves: it is the unit's main process,
/// and ready.
pub fn took_over(status: &str) {
    send(&[
        NotifyState::MainPid(std::process::id()),
        NotifyState::Ready,
        NotifyState::Status(&one_line(status)),
    ]);
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1_UNIT: &str = "9:name=systemd:/system.slice/limpet.service\n4:memory:/system.slice/limpet.service\n0::/system.slice/limpet.service\n";
    const V1_SHELL: &str = "9:name=systemd:/user.slice/user-0.slice/session-3.scope\n4:memory:/system.slice/limpet.service\n0::/user.slice/user-0.slice/session-3.scope\n";
    const V2_UNIT: &str = "0::/system.slice/limpet.service\n";
    const V2_SHELL: &str = "0::/user.slice/user-1000.slice/session-2.scope\n";

    /// The control group systemd tracks: `name=systemd` on v1 and hybrid hosts (whatever
    /// other controllers say), the unified one on v2.
    #[test]
    fn a_process_is_of_the_service_whose_control_group_systemd_tracks_it_in() {
        assert_eq!(
            service_cgroup(V1_UNIT),
            Some("/system.slice/limpet.service")
        );
        assert_eq!(
            service_cgroup(V2_SHELL),
            Some("/user.slice/user-1000.slice/session-2.scope")
        );
        assert!(same_service(V1_UNIT, V1_UNIT));
        assert!(same_service(V2_UNIT, V2_UNIT));
        assert!(
            !same_service(V1_UNIT, V1_SHELL),
            "another name=systemd group, though the memory one is the same"
        );
        assert!(!same_service(V2_UNIT, V2_SHELL));
        assert!(!same_service("", ""), "unknown is not the same");
        let v1_bare = "4:memory:/a\n3:cpu:/a\n";
        assert!(
            same_service(v1_bare, v1_bare),
            "no systemd: every hierarchy alike"
        );
        assert!(!same_service(v1_bare, "4:memory:/b\n3:cpu:/a\n"));
        // This test process and a child of its are of one service, whatever host runs them.
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap_or_else(|e| panic!("{e}"));
        let theirs =
            std::fs::read_to_string(format!("/proc/{}/cgroup", child.id())).unwrap_or_default();
        let _ = child.kill();
        let _ = child.wait();
        assert!(same_service(&own, &theirs), "{own:?} / {theirs:?}");
    }

    #[test]
    fn a_status_is_sent_on_one_line() {
        assert_eq!(
            one_line("reload refused: limpet.toml:3:\n  bad key\n"),
            "reload refused: limpet.toml:3: bad key"
        );
    }
}
