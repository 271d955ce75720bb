//! Shared pieces of the network seam: accepting clients, and what running out of file
//! descriptors does.
//!
//! Every listener (HTTP, TCP, admin) accepts through [`accept`], so an accept error has one
//! rule: back off briefly instead of spinning, and log it at most once per
//! [`LOG_EVERY`] with the count of the errors not logged. Out of file descriptors
//! (EMFILE/ENFILE) is the common one under a connection flood; it recovers by itself as
//! connections close, and it is never held against a node: connect and health-check failures
//! it causes carry no verdict on the node (`crate::error::Cause::Local`), so nodes do not
//! flap DOWN/UP because limpet ran out of sockets.

use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

/// At most one log line per this interval for each kind of local resource error.
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// The pause after a failed accept: long enough not to spin on an error that persists,
/// short enough that a freed descriptor is used at once.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// A warning logged at most once per [`LOG_EVERY`], with the count of repeats it swallowed.
#[derive(Debug)]
pub struct RateLimitedLog {
    what: &'static str,
    /// When it last logged, and how many notes were not logged since.
    state: Mutex<(Option<Instant>, u64)>,
}

impl RateLimitedLog {
    pub const fn new(what: &'static str) -> Self {
        RateLimitedLog {
            what,
            state: Mutex::new((None, 0)),
        }
    }

    /// Notes one occurrence (`context`: where); returns whether it was logged.
    pub fn note(&self, context: &str) -> bool {
        let now = Instant::now();
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let due =
            st.0.is_none_or(|last| now.duration_since(last) >= LOG_EVERY);
        if !due {
            st.1 += 1;
            return false;
        }
        let swallowed = std::mem::take(&mut st.1);
        st.0 = Some(now);
        drop(st);
        tracing::warn!(context, repeats_not_logged = swallowed, "{}", self.what);
        true
    }
}

/// Out of file descriptors, wherever limpet noticed it (accept, connect, health check).
pub static LOCAL_FDS: RateLimitedLog = RateLimitedLog::new(
    "out of file descriptors: raise the limit (ulimit -n, LimitNOFILE) or lower max_connections",
);

/// Other accept errors.
static ACCEPT_ERRORS: RateLimitedLog = RateLimitedLog::new("accept failed");

/// The next client of `listener` (named `name` in logs). Errors are logged per the module
/// rule and retried after a short pause; this never returns an error.
pub async fn accept(listener: &TcpListener, name: &str) -> (TcpStream, SocketAddr) {
    loop {
        match listener.accept().await {
            Ok(s) => return s,
            Err(e) => {
                if crate::error::out_of_fds(&e) {
                    LOCAL_FDS.note(name);
                } else if ACCEPT_ERRORS.note(name) {
                    tracing::debug!(listener = name, error = %e, "accept error");
                }
                tokio::time::sleep(ACCEPT_BACKOFF).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_flood_of_errors_is_logged_once_per_interval() {
        let log = RateLimitedLog::new("test");
        assert!(log.note("a"), "the first is logged");
        for _ in 0..1000 {
            assert!(!log.note("a"));
        }
        tokio::time::advance(LOG_EVERY).await;
        assert!(log.note("a"), "then once per interval");
        assert!(!log.note("a"));
    }
}
