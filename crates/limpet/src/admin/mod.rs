//! # The admin listener: JSON API, Prometheus metrics and the live stats page
//!
//! Served on its own listener (default `127.0.0.1:9900`), over HTTP/1.1, by [`serve`]. It
//! reads and changes the running limpet only through the [`Control`] trait, which the runtime
//! implements; the admin code holds no state of its own.
//!
//! ## Endpoints
//!
//! | method | path | what |
//! |---|---|---|
//! | GET | `/` | the live stats page (one self-contained HTML page; refreshes itself from the JSON API) |
//! | GET | `/metrics` | Prometheus text ([`crate::metrics`]) |
//! | GET | `/ready` | `200 ready` while the admin server runs |
//! | GET | `/api/v1/nodes` | every node: [`NodeView`] (state, health detail, weight, counts, drain progress) |
//! | GET | `/api/v1/nodes/{node}` | one node |
//! | POST | `/api/v1/nodes/{node}/state` | **write**: `{"state":"ready"}`, `{"state":"maint"}`, or `{"state":"drain", "deadline_secs":N?, "spread_secs":N?}` |
//! | GET | `/api/v1/tables` | every affinity table: [`TableView`] (size, capacity, expiry) |
//! | GET | `/api/v1/tables/{table}?offset=O&limit=L` | a page of entries ([`TablePage`]; `limit` at most 1000, default 100) |
//! | GET | `/api/v1/tables/{table}/entry?key=K` | look up one entry (404 when absent) |
//! | DELETE | `/api/v1/tables/{table}/entry?key=K` | **write**: delete one entry |
//! | DELETE | `/api/v1/tables/{table}` | **write**: clear the table |
//! | GET | `/api/v1/store` | fleet mode: the shared store's state ([`crate::store::StoreStatus`]; 404 without a `[store]`) |
//! | POST | `/api/v1/reload` | **write**: reload the configuration file (422 with the reason when refused, 503 once limpet is stopping); applied or refused whole even if the caller hangs up first |
//! | GET | `/api/v1/stats` | totals of requests and pin outcomes, and the server's uptime (the page computes rates) |
//! | GET | `/api/v1/history` | per node, one point per sample of the last five minutes: requests/s, errors/s, p99 answer time ([`HistoryView`]) |
//!
//! `HEAD` answers wherever `GET` does. Errors are JSON `{"error": "..."}` with 400 (bad
//! request), 401 (missing or wrong token), 403 (a cross-site write, or a `POST` without
//! `Content-Type: application/json`), 404 (no such node, table, entry or endpoint, or no
//! `[store]`), 405 (a method the path does not answer), 408 (a write's body not whole within
//! 10 s), 413 (body over 16 KiB), 421 (a request without the token whose `Host` the listener
//! is not known by: DNS rebinding, `auth::rebinding_refusal`), 422 (reload refused), 503
//! (reload asked for, or still reading its file, once limpet is stopping; a write that
//! reaches a limpet handing over to a new one in an upgrade).
//!
//! ## Authorization
//!
//! Writes carry `Authorization: Bearer <token>` whenever a token is configured, and a token
//! must be configured whenever the listener is not on a loopback address:
//! [`AdminSettings::validate`] refuses such a configuration, so limpet does not start with an
//! open admin API on the network. Reads (the page, the JSON reads, `/metrics`) need no token,
//! except a table's entries (`/api/v1/tables/{table}` and its `entry`), whose keys can be
//! session ids: with a token configured they are read with it.
//! Tokens are compared in constant time; the Bearer scheme is case-insensitive. Token or not,
//! a write from another site is refused (`auth::cross_site_refusal`): a `POST` needs
//! `Content-Type: application/json`, and a foreign `Origin` or `Sec-Fetch-Site` gets 403.
//!
//! ## Traffic and history
//!
//! Each node's traffic (requests, errors, bytes, answer times) is counted by the data plane
//! into [`crate::metrics`]; [`serve`] samples it every [`SAMPLE_EVERY`] into a five-minute
//! ring for the stats page's charts, for as long as the admin listener runs: the running
//! configuration's nodes only ([`Control::node_states`]), a node a reload removed or renamed
//! leaving the history at the next sample.

mod auth;
mod server;
mod stats_page;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use limpet_core::{Health, HealthPolicy};
use serde::Serialize;

pub use crate::metrics::{HistoryView, TrafficView, SAMPLE_EVERY};
pub(crate) use auth::rebinding_refusal;
pub use auth::{AdminSettings, AdminSettingsError, DEFAULT_ADMIN_LISTEN};
pub use server::serve;

use crate::health::CheckStatus;
use crate::metrics::Metrics;

/// What the operator asks of a node through the admin API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeCommand {
    /// Back to normal service.
    Ready,
    /// Honour existing pins, no fresh assignments; after `deadline` (if any), re-pin the
    /// node's sessions spread over `spread` (the listener's default when `None`), and close
    /// its long-lived connections.
    Drain {
        deadline: Option<Duration>,
        spread: Option<Duration>,
    },
    /// Nothing goes to the node; its pins are re-pinned at once.
    Maint,
}

/// A drain in progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DrainView {
    /// When pins stop being honoured (milliseconds since the Unix epoch), if a deadline was set.
    pub deadline_unix_ms: Option<u64>,
    /// The window over which pins are re-pinned after the deadline.
    pub spread_ms: u64,
    /// Complete: no active connection, and no pinned session seen within the idle window.
    pub complete: bool,
}

/// Where a node's health is heading: the fall/rise progress of a stats page.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HealthView {
    /// Consecutive results counted toward the next flip: failures while UP, passing checks
    /// while DOWN.
    pub streak: u32,
    pub fall: u32,
    pub rise: u32,
    /// Active checks judge the node: then only checks bring it back.
    pub checked: bool,
    /// DOWN without checks: milliseconds until traffic may try the node again (0: due now).
    pub trial_in_ms: Option<u64>,
    /// The same in words, as the stats page shows it: `going down 1/3`, `coming up 1/2`,
    /// `trial in 7s`, `trial due`, `forced down`, `slow 1/3`; `null` when nothing is under
    /// way.
    pub progress: Option<String>,
    /// While UP: requests that outlasted the answer timeout while the node answered others,
    /// counted in the current `fail_timeout` window, and how many take it DOWN (0: never).
    pub slow_answers: u32,
    pub max_slow_answers: u32,
    /// While DOWN: what took it there, `checks`, `traffic`, `slow-answers` or `forced`
    /// (`null` while UP). A node DOWN for its slow answers may well pass its checks.
    pub down_cause: Option<&'static str>,
}

impl HealthView {
    /// The progress of `health` under `policy` at `now_ms`.
    pub fn of(health: Health, policy: HealthPolicy, now_ms: u64) -> Self {
        let trial_in_ms = health
            .retry_at_ms(policy)
            .map(|at| at.saturating_sub(now_ms));
        let (fall, rise, streak) = (policy.fall.max(1), policy.rise.max(1), health.streak());
        let slow_answers = health.slow_answers(policy, now_ms);
        let max_slow = policy.max_slow_answers;
        let progress = match (health.is_up(), policy.checked, trial_in_ms) {
            (true, _, _) if streak > 0 => Some(format!("going down {streak}/{fall}")),
            (true, _, _) if slow_answers > 0 => Some(format!("slow {slow_answers}/{max_slow}")),
            (true, _, _) => None,
            (false, true, _) if streak > 0 => Some(format!("coming up {streak}/{rise}")),
            (false, true, _) => None,
            (false, false, Some(0)) => Some("trial due".to_owned()),
            (false, false, Some(ms)) => Some(format!("trial in {}s", ms.div_ceil(1000))),
            (false, false, None) => Some("forced down".to_owned()),
        };
        HealthView {
            streak,
            fall,
            rise,
            checked: policy.checked,
            trial_in_ms,
            progress,
            slow_answers,
            max_slow_answers: max_slow,
            down_cause: health.down_cause().map(limpet_core::DownCause::as_str),
        }
    }
}

/// A listener that forwards to a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ListenerRef {
    pub name: String,
    /// `http` or `tcp`.
    pub mode: &'static str,
}

/// One node, as the admin API shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeView {
    pub name: String,
    pub address: String,
    pub weight: u32,
    /// `UP`, `DOWN`, `DRAIN` or `MAINT`.
    pub state: &'static str,
    /// What the operator set: `ready`, `drain` or `maint`.
    pub admin: &'static str,
    /// What checks and traffic say.
    pub healthy: bool,
    /// Milliseconds since the node entered its current `state`.
    pub in_state_ms: u64,
    pub health: HealthView,
    pub drain: Option<DrainView>,
    /// Connections and tunnels open to the node now.
    pub active_connections: u64,
    /// WebSocket and TCP tunnels among them.
    pub tunnels: u64,
    /// Requests and TCP sessions waiting in the node's queue now (`max_connections` reached;
    /// HAProxy's `qcur`).
    pub queued: u64,
    /// Pins to the node held in affinity tables.
    pub table_pins: u64,
    /// Distinct sessions seen on the node within `seen_window_secs` (estimated).
    pub sessions_seen: u64,
    pub seen_window_secs: u64,
    /// Milliseconds since a session was last seen on the node.
    pub last_seen_ago_ms: Option<u64>,
    pub checks: Vec<CheckStatus>,
    /// HTTP requests relayed to the node: counts, rates, bytes, answer times.
    pub traffic: TrafficView,
    /// The listeners that forward to the node.
    pub listeners: Vec<ListenerRef>,
}

/// One affinity table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TableView {
    pub name: String,
    /// What the key is (`source-ip/24`, `header x-user`, `cookie JSESSIONID`).
    pub key: String,
    pub size: u64,
    pub capacity: u64,
    pub expire_secs: u64,
    pub evictions: u64,
    /// Keys open TCP sessions and tunnels hold: their entries are never evicted for room.
    pub held: u64,
    /// Puts of a key not in the table that were not stored, the table being full of entries
    /// open sessions hold (each try counts).
    pub refused: u64,
}

/// One table entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EntryView {
    pub key: String,
    pub node: String,
    /// Milliseconds until the entry expires unless used.
    pub expires_in_ms: u64,
}

/// A page of a table's entries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TablePage {
    pub table: String,
    pub offset: usize,
    pub limit: usize,
    pub total: u64,
    pub entries: Vec<EntryView>,
}

/// What a reload did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReloadReport {
    /// Counts reloads applied since start.
    pub generation: u64,
    /// One line per change (`node c added`, `listener web: balance leastconn`...).
    pub changes: Vec<String>,
}

/// Why a control operation failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControlError {
    NotFound(String),
    BadRequest(String),
    /// A reload refused: the configuration is invalid; the running one stays.
    Refused(String),
    /// limpet is stopping: no reload now.
    Stopping(String),
    Internal(String),
}

impl std::fmt::Display for ControlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ControlError::NotFound(m)
            | ControlError::BadRequest(m)
            | ControlError::Refused(m)
            | ControlError::Stopping(m)
            | ControlError::Internal(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for ControlError {}

/// A boxed future, so [`Control`] stays object-safe.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What the admin API reads and changes. The runtime implements it.
pub trait Control: Send + Sync + 'static {
    fn nodes(&self) -> Vec<NodeView>;
    /// [`Control::nodes`] without their table pins (`table_pins` 0): what needs only the
    /// nodes' states, which must not walk every table's entries to count pins, nor wait on
    /// a table's lock (the drain watch, every second).
    fn node_states(&self) -> Vec<NodeView> {
        self.nodes()
    }
    fn set_node(&self, node: &str, cmd: NodeCommand) -> Result<NodeView, ControlError>;
    fn tables(&self) -> Vec<TableView>;
    fn table_page(
        &self,
        table: &str,
        offset: usize,
        limit: usize,
    ) -> Result<TablePage, ControlError>;
    fn table_get(&self, table: &str, key: &str) -> Result<Option<EntryView>, ControlError>;
    fn table_delete(&self, table: &str, key: &str) -> Result<bool, ControlError>;
    /// Clears a table; returns how many entries it held.
    fn table_clear(&self, table: &str) -> Result<u64, ControlError>;
    /// Reloads the configuration: validated first, refused with the reason when invalid.
    fn reload(&self) -> BoxFuture<'_, Result<ReloadReport, ControlError>>;
    fn metrics(&self) -> Arc<Metrics>;
    /// Fleet mode: the shared store's state (`None`: no `[store]`).
    fn store(&self) -> Option<crate::store::StoreStatus> {
        None
    }
}

/// Whether a drain is complete: nothing open to the node, and no session seen on it for
/// `idle` (a node never seen counts as idle).
pub fn drain_complete(active: u64, last_seen_ago: Option<Duration>, idle: Duration) -> bool {
    active == 0 && last_seen_ago.is_none_or(|ago| ago >= idle)
}

/// Watches drains and logs, once per drain, the moment one completes. Runs until dropped.
pub async fn log_drain_completions(control: Arc<dyn Control>, every: Duration) {
    let mut reported: std::collections::BTreeSet<String> = Default::default();
    loop {
        for n in control.node_states() {
            match &n.drain {
                Some(d) if d.complete => {
                    if reported.insert(n.name.clone()) {
                        tracing::info!(node = %n.name, "drain complete: no active connection, no session seen within the idle window");
                    }
                }
                _ => {
                    reported.remove(&n.name);
                }
            }
        }
        tokio::time::sleep(every).await;
    }
}

/// The address the admin API is reachable on, for logs.
pub fn describe(addr: SocketAddr) -> String {
    format!("http://{addr}/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_progress_reads_like_a_stats_page() {
        let policy = HealthPolicy {
            fall: 3,
            rise: 2,
            fail_timeout_ms: 10_000,
            checked: false,
            max_slow_answers: 0,
        };
        let progress = |h: Health, p: HealthPolicy, now| HealthView::of(h, p, now).progress;
        let mut h = Health::default();
        assert_eq!(progress(h, policy, 0), None, "UP and steady");
        h.observe(limpet_core::Observation::TrafficFailed, policy, 0);
        assert_eq!(progress(h, policy, 0).as_deref(), Some("going down 1/3"));
        h.observe(limpet_core::Observation::TrafficFailed, policy, 0);
        h.observe(limpet_core::Observation::TrafficFailed, policy, 1_000);
        assert!(!h.is_up());
        // Without checks: the trial after fail_timeout, counted down in whole seconds.
        assert_eq!(progress(h, policy, 1_000).as_deref(), Some("trial in 10s"));
        let v = HealthView::of(h, policy, 4_500);
        assert_eq!(
            (v.trial_in_ms, v.progress.as_deref()),
            (Some(6_500), Some("trial in 7s"))
        );
        assert_eq!(progress(h, policy, 11_000).as_deref(), Some("trial due"));
        // With checks: passing checks bring it up, one at a time.
        let checked = HealthPolicy {
            checked: true,
            ..policy
        };
        let mut h = Health::default();
        h.force(false);
        assert_eq!(progress(h, checked, 0), None, "DOWN, no check passed yet");
        h.observe(
            limpet_core::Observation::CheckPassed(limpet_core::CheckSlot::FIRST),
            checked,
            0,
        );
        assert_eq!(progress(h, checked, 0).as_deref(), Some("coming up 1/2"));
        // Forced DOWN without checks is never tried.
        let mut h = Health::default();
        h.force(false);
        assert_eq!(progress(h, policy, 0).as_deref(), Some("forced down"));
        // Slow answers toward `max_slow_answers`, within their `fail_timeout` window.
        let gray = HealthPolicy {
            max_slow_answers: 3,
            ..policy
        };
        let mut h = Health::default();
        h.observe(limpet_core::Observation::SlowAnswer, gray, 1_000);
        let v = HealthView::of(h, gray, 2_000);
        assert_eq!(
            (v.slow_answers, v.max_slow_answers, v.progress.as_deref()),
            (1, 3, Some("slow 1/3"))
        );
        assert_eq!(progress(h, gray, 11_000), None, "the window is over");
        assert_eq!(progress(h, policy, 2_000), None, "the limit is off");
        assert_eq!(v.down_cause, None, "UP");
        h.observe(limpet_core::Observation::SlowAnswer, gray, 2_000);
        h.observe(limpet_core::Observation::SlowAnswer, gray, 3_000);
        let v = HealthView::of(h, gray, 3_000);
        assert_eq!(
            (v.down_cause, v.progress.as_deref()),
            (Some("slow-answers"), Some("trial in 10s"))
        );
    }

    #[test]
    fn drain_completion_needs_no_connection_and_an_idle_window() {
        let idle = Duration::from_secs(60);
        assert!(drain_complete(0, None, idle));
        assert!(drain_complete(0, Some(Duration::from_secs(61)), idle));
        assert!(!drain_complete(0, Some(Duration::from_secs(10)), idle));
        assert!(!drain_complete(1, None, idle));
    }
}
