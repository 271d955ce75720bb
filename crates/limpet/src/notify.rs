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
//!  an upgrade: the new limpet took over      (old)  MAINPID=<new>, STATUS=...
//!                                            (new)  MAINPID=<own>, READY=1, STATUS=...
//! ```
//!
//! A unit's main process is the one systemd watches: when a binary upgrade
//! ([`crate::upgrade`]) hands the sockets to a new process, the old one names the new one
//! main before it drains and exits, so its exit does not end the unit (with the default
//! `NotifyAccess=main` only the main process may do that, which the old one still is then;
//! the new one says it again for `NotifyAccess=all`). After handing over, the old one says
//! nothing more: its `STOPPING=1` would stop the unit the new one now serves.
//!
//! Without `NOTIFY_SOCKET` (not under systemd) every call does nothing. A message that
//! cannot be sent is logged and changes nothing else: limpet serves whether or not its
//! manager hears it.

use std::sync::atomic::{AtomicBool, Ordering};

use sd_notify::NotifyState;

/// Set once this process has named another the unit's main process: from then on it says
/// nothing (a reload answered on an admin connection still open while it drains, its drain's
/// end), since the unit is the new one's.
static HANDED_OVER: AtomicBool = AtomicBool::new(false);

/// Sends `states` in one message (nothing without `NOTIFY_SOCKET`, or after handing over).
/// The variable is kept: a new limpet started for an upgrade
/// ([`crate::upgrade::start_successor`]) needs it too.
fn send(states: &[NotifyState<'_>]) {
    if HANDED_OVER.load(Ordering::Acquire) {
        return;
    }
    if let Err(e) = sd_notify::notify(false, states) {
        tracing::warn!(error = %e, "could not notify the service manager (NOTIFY_SOCKET)");
    }
}

/// Every listener accepts: the unit is started (or a reload is over).
pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// A reload begins. `MONOTONIC_USEC` goes with it: `Type=notify-reload` (systemd 253 and
/// later) requires it to tell this reload's messages from a late one's.
pub fn reloading() {
    match NotifyState::monotonic_usec_now() {
        Ok(now) => send(&[NotifyState::Reloading, now]),
        Err(_) => send(&[NotifyState::Reloading]),
    }
}

/// A stop signal: the drain begins. Not after handing over to a new limpet.
pub fn stopping() {
    send(&[NotifyState::Stopping]);
}

/// A new limpet (`pid`) took over: it is the unit's main process from now on, and this one
/// says nothing more.
pub fn handed_over(pid: u32) {
    let status = format!("handed over to pid {pid}; draining");
    send(&[NotifyState::MainPid(pid), NotifyState::Status(&status)]);
    HANDED_OVER.store(true, Ordering::Release);
}

/// This process took over from a running limpet and serves: it is the unit's main process,
/// and ready.
pub fn took_over(status: &str) {
    send(&[
        NotifyState::MainPid(std::process::id()),
        NotifyState::Ready,
        NotifyState::Status(status),
    ]);
}
