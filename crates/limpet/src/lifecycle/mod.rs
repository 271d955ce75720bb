//! # Node lifecycle in the running limpet: checks, drains, accounting, reload, admin
//!
//! The glue between the multi-listener runtime ([`crate::runtime`]) and the node-lifecycle
//! parts: active health checks ([`crate::health`]), the admin API ([`crate::admin`]), metrics
//! ([`crate::metrics`]) and the distinct-session estimator (`limpet_core::seen`).
//!
//! One [`Lifecycle`] lives as long as the process and is carried from state to state across
//! reloads. It holds the [`NodeBoard`]: one [`NodeRuntime`] per node *name* (status, open
//! connections and tunnels, sessions seen, the events long-lived sessions watch), shared by
//! every generation that names the node.
//!
//! ```text
//!  data plane ─► NodeRuntime::seen / open / tunnel      (each routed request / session)
//!             ─► NodeRuntime::session_end               (tunnels and TCP sessions wait on it)
//!             ─► Lifecycle::metrics                     (one-line hooks)
//!  health checks ─► RuntimeSink ─► State::observe ─► transition ─► metrics, board
//!  admin API ─► runtime::RuntimeControl (admin::Control) ─► State::set_admin / tables / reload
//!  SIGHUP, POST /api/v1/reload ─► runtime::reload(): Config::load ─► State::rebuild ─► swap
//!
//! This module depends on the configuration and the parts it holds, never on the runtime:
//! the runtime holds a `Lifecycle`, and the glue over a running `Runtime` (admin control,
//! health sink, reload) lives in `runtime::control`.
//! ```

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use arc_swap::ArcSwap;
use limpet_core::Transition;

pub use crate::config::LifecycleDef;
use crate::health::{HealthBoard, HealthChecks};
use crate::metrics::Metrics;
use crate::nodes::{NodeBoard, NodeRuntime};

/// Per-process node-lifecycle state. See the module docs.
#[derive(Debug)]
pub struct Lifecycle {
    pub metrics: Arc<Metrics>,
    pub(crate) def: ArcSwap<LifecycleDef>,
    /// Every node's runtime, by name, for the life of the process.
    pub nodes: NodeBoard,
    pub(crate) checks: Mutex<HealthChecks>,
    pub(crate) admin_addr: OnceLock<SocketAddr>,
    reloads: AtomicU64,
    /// One reload at a time. Holds the read of a reload refused at `RELOAD_LOAD_LIMIT`
    /// while it has not returned: the next reload waits for it (within the same limit)
    /// rather than start another, so a hung file leaves at most one thread blocked.
    pub(crate) reloading: tokio::sync::Mutex<Option<crate::runtime::ConfigLoad>>,
    /// Every reload running, to abort them and refuse more at a stop.
    pub(crate) reload_tasks: crate::runtime::ReloadTasks,
    /// Each listener's `max_connections`, by name, shared by its sockets and changed in
    /// place by a reload.
    conn_limits: Mutex<std::collections::HashMap<String, Arc<crate::net::ConnLimit>>>,
    /// Held while a slow answer is judged and recorded (`State::observe_at`): slow answers
    /// are judged one at a time, across threads and config generations, so two nodes' last
    /// slow answers cannot each count on the other. (Another node's change by its checks,
    /// traffic or the operator is not under it: that can still land between the read and
    /// the record, a window of microseconds.)
    pub(crate) slow_answers: Mutex<()>,
    /// The listeners' accept loops running now (a handover to a new limpet waits for none).
    pub accepting: Arc<crate::net::AcceptLoops>,
    /// Told when what the operator asked of a node (`State::set_admin`) or the set of nodes
    /// (a reload) changed: the node-state file's writer waits on it
    /// (`crate::runtime::node_states`).
    pub(crate) admin_changed: tokio::sync::Notify,
    /// Held by the node-state file's writer for each write: a hand-over to a new limpet
    /// takes it (bounded) so that this process's last write lands before the new one's
    /// first, never after it.
    pub(crate) state_write: tokio::sync::Mutex<()>,
    /// Set from a hand-over's start: this process writes the node-state file no more (the
    /// new limpet does), and its admin API refuses writes (the new limpet takes the states
    /// and tables as they are then: a later write here would be lost with this process);
    /// cleared when it serves again after a hand-over that failed.
    pub(crate) handing_state_over: std::sync::atomic::AtomicBool,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Lifecycle {
    pub fn new(def: LifecycleDef) -> Arc<Self> {
        Arc::new(Lifecycle {
            nodes: NodeBoard::new(def.seen_window),
            metrics: Arc::new(Metrics::new()),
            def: ArcSwap::from_pointee(def),
            checks: Mutex::new(HealthChecks::new()),
            admin_addr: OnceLock::new(),
            reloads: AtomicU64::new(0),
            reloading: tokio::sync::Mutex::new(None),
            reload_tasks: crate::runtime::ReloadTasks::default(),
            conn_limits: Mutex::new(std::collections::HashMap::new()),
            slow_answers: Mutex::new(()),
            accepting: Arc::default(),
            admin_changed: tokio::sync::Notify::new(),
            state_write: tokio::sync::Mutex::new(()),
            handing_state_over: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Listener `name`'s connection limit, made with `max` on first use.
    pub fn conn_limit(&self, name: &str, max: usize) -> Arc<crate::net::ConnLimit> {
        Arc::clone(
            lock(&self.conn_limits)
                .entry(name.to_owned())
                .or_insert_with(|| crate::net::ConnLimit::new(max)),
        )
    }

    /// A reload's listener `max_connections`, into the limits the sockets use.
    pub(crate) fn apply_conn_limits<'a>(&self, limits: impl Iterator<Item = (&'a str, usize)>) {
        let held = lock(&self.conn_limits);
        for (name, max) in limits {
            if let Some(l) = held.get(name) {
                l.set(max);
            }
        }
    }

    pub fn def(&self) -> Arc<LifecycleDef> {
        self.def.load_full()
    }

    /// Where the admin listener bound, once started.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr.get().copied()
    }

    /// The health checks' per-node detail.
    pub fn board(&self) -> Arc<HealthBoard> {
        lock(&self.checks).board()
    }

    /// The runtime of node `name` (created on first use).
    pub fn node(&self, name: &str) -> Arc<NodeRuntime> {
        self.nodes.node(name)
    }

    /// The limpet an upgrade took over from has exited ([`NodeBoard::predecessor_gone`]).
    ///
    /// [`NodeBoard::predecessor_gone`]: crate::nodes::NodeBoard::predecessor_gone
    pub fn predecessor_gone(&self) {
        self.nodes.predecessor_gone();
    }

    /// A health transition happened (logs are the runtime's; this counts it).
    pub fn transition(&self, node: &str, t: Transition) {
        self.metrics.health_transition(node, t);
    }

    pub(crate) fn reloaded(&self) -> u64 {
        self.reloads.fetch_add(1, Ordering::Relaxed) + 1
    }
}
