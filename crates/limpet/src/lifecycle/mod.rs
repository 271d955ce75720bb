//! # Node lifecycle in the running limpet: checks, drains, accounting, reload, admin
//!
//! The glue between the multi-listener runtime ([`crate::runtime`]) and the node-lifecycle
//! parts: active health checks ([`crate::health`]), the admin API ([`crate::admin`]), metrics
//! ([`crate::metrics`]) and the distinct-session estimator (`limpet_core::seen`).
//!
//! One [`Lifecycle`] lives as long as the process and is carried from state to state across
//! reloads, so what it holds is keyed by node *name*: per node, the sessions seen, the
//! connections and tunnels open, and a close signal that long-lived connections (WebSocket tunnels, TCP sessions)
//! watch. The signal fires at a drain deadline, on MAINT, and when a reload removes the node.
//!
//! ```text
//!  data plane ─► Lifecycle::seen(node, session key)     (each routed request / session)
//!             ─► Lifecycle::tunnel(node) guard          (each WebSocket tunnel)
//!             ─► Lifecycle::close_signal(node)          (tunnels and TCP sessions watch it)
//!             ─► Lifecycle::metrics                     (one-line hooks)
//!  health checks ─► RuntimeSink ─► State::record ─► transition ─► metrics, board
//!  admin API ─► RuntimeControl (admin::Control) ─► State::set_admin / tables / reload
//!  SIGHUP, POST /api/v1/reload ─► reload(): Config::load ─► State::rebuild ─► swap
//! ```

mod control;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use limpet_core::seen::SeenWindow;
use limpet_core::Transition;
use tokio::sync::watch;

pub use control::{reload, serve_signals, start, RuntimeControl, RuntimeSink};

use crate::admin::AdminSettings;
use crate::health::{CheckSpec, HealthBoard, HealthChecks};
use crate::metrics::Metrics;

/// The lifecycle settings of a configuration (`[admin]`, `[drain]`, checks).
#[derive(Debug, Clone)]
pub struct LifecycleDef {
    /// The admin listener, when `[admin]` is configured.
    pub admin: Option<AdminSettings>,
    /// The re-pin window after a drain deadline when the operator gives none.
    pub drain_spread: Duration,
    /// A drain is complete once no session was seen on the node for this long (and nothing
    /// is open to it).
    pub drain_idle: Duration,
    /// The window of "distinct sessions seen".
    pub seen_window: Duration,
    /// Active checks: (node name, check).
    pub checks: Vec<(String, CheckSpec)>,
}

impl Default for LifecycleDef {
    fn default() -> Self {
        LifecycleDef {
            admin: None,
            drain_spread: Duration::from_secs(60),
            drain_idle: Duration::from_secs(60),
            seen_window: Duration::from_secs(600),
            checks: Vec::new(),
        }
    }
}

#[derive(Debug)]
struct NodeLife {
    seen: SeenWindow,
    tunnels: u64,
    /// Connections and TCP sessions open to the node now, on every state (so across
    /// reloads): each connection's guard holds this counter and decrements it on close.
    active: Arc<AtomicU32>,
    close: watch::Sender<u64>,
    /// Bumped on every operator command, so a stale drain timer knows it is stale.
    command: u64,
}

impl NodeLife {
    fn new(window: Duration) -> Self {
        NodeLife {
            seen: seen_window(window),
            tunnels: 0,
            active: Arc::new(AtomicU32::new(0)),
            close: watch::channel(0).0,
            command: 0,
        }
    }
}

fn seen_window(window: Duration) -> SeenWindow {
    SeenWindow::new(
        u64::try_from(window.as_millis()).unwrap_or(u64::MAX),
        limpet_core::seen::DEFAULT_SLOT_MS,
        limpet_core::seen::DEFAULT_PRECISION,
    )
}

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> u64 {
    crate::runtime::now_ms()
}

/// Per-process node-lifecycle state. See the module docs.
#[derive(Debug)]
pub struct Lifecycle {
    pub metrics: Arc<Metrics>,
    def: ArcSwap<LifecycleDef>,
    nodes: Mutex<BTreeMap<String, NodeLife>>,
    checks: Mutex<HealthChecks>,
    admin_addr: OnceLock<SocketAddr>,
    reloads: AtomicU64,
    /// One reload at a time.
    reloading: tokio::sync::Mutex<()>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Lifecycle {
    pub fn new(def: LifecycleDef) -> Arc<Self> {
        Arc::new(Lifecycle {
            metrics: Arc::new(Metrics::new()),
            def: ArcSwap::from_pointee(def),
            nodes: Mutex::new(BTreeMap::new()),
            checks: Mutex::new(HealthChecks::new()),
            admin_addr: OnceLock::new(),
            reloads: AtomicU64::new(0),
            reloading: tokio::sync::Mutex::new(()),
        })
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

    fn with_node<R>(&self, node: &str, f: impl FnOnce(&mut NodeLife) -> R) -> R {
        let mut nodes = lock(&self.nodes);
        if !nodes.contains_key(node) {
            let window = self.def.load().seen_window;
            nodes.insert(node.to_owned(), NodeLife::new(window));
        }
        match nodes.get_mut(node) {
            Some(n) => f(n),
            None => f(&mut NodeLife::new(Duration::from_secs(60))),
        }
    }

    /// A session with this well-mixed key (see [`session_key`]) was routed to `node`.
    pub fn seen(&self, node: &str, key: u64) {
        let now = now_ms();
        self.with_node(node, |n| n.seen.record(key, now));
    }

    /// Distinct sessions seen on `node` in the window, and how long ago the last one was.
    pub fn seen_stats(&self, node: &str) -> (u64, Option<Duration>) {
        let now = now_ms();
        self.with_node(node, |n| {
            (
                n.seen.estimate(now),
                n.seen
                    .last_seen_ms()
                    .map(|t| Duration::from_millis(now.saturating_sub(t))),
            )
        })
    }

    /// Counts a tunnel to `node` open until the guard drops.
    pub fn tunnel(self: &Arc<Self>, node: &str) -> TunnelGuard {
        self.with_node(node, |n| n.tunnels += 1);
        TunnelGuard {
            life: Arc::downgrade(self),
            node: node.to_owned(),
        }
    }

    /// The live count of connections open to `node`, shared by every state built for this
    /// process: a reload hands the same counter to the new state, and connections opened
    /// under the old one decrement it when they close.
    pub fn active_counter(&self, node: &str) -> Arc<AtomicU32> {
        self.with_node(node, |n| Arc::clone(&n.active))
    }

    pub fn tunnels(&self, node: &str) -> u64 {
        self.with_node(node, |n| n.tunnels)
    }

    /// A receiver that changes when `node`'s long-lived connections must close (drain
    /// deadline, MAINT, removed by a reload).
    pub fn close_signal(&self, node: &str) -> watch::Receiver<u64> {
        self.with_node(node, |n| n.close.subscribe())
    }

    /// Tells `node`'s long-lived connections to close now.
    pub fn close_now(&self, node: &str) {
        self.with_node(node, |n| n.close.send_modify(|g| *g = g.wrapping_add(1)));
    }

    /// Notes an operator command on `node`; returns its number (for drain timers).
    fn command(&self, node: &str) -> u64 {
        self.with_node(node, |n| {
            n.command += 1;
            n.command
        })
    }

    fn current_command(&self, node: &str) -> u64 {
        self.with_node(node, |n| n.command)
    }

    /// A health transition happened (logs are the runtime's; this counts it).
    pub fn transition(&self, node: &str, t: Transition) {
        self.metrics.health_transition(node, t);
    }

    fn reloaded(&self) -> u64 {
        self.reloads.fetch_add(1, Ordering::Relaxed) + 1
    }
}

/// A tunnel counted open; dropping it counts it closed.
#[derive(Debug)]
pub struct TunnelGuard {
    life: Weak<Lifecycle>,
    node: String,
}

impl Drop for TunnelGuard {
    fn drop(&mut self) {
        if let Some(l) = self.life.upgrade() {
            l.with_node(&self.node, |n| n.tunnels = n.tunnels.saturating_sub(1));
        }
    }
}

/// The session identity of a client for counting and for the drain spread: its address and,
/// when its cookie is signed, the token's issue time. Well mixed, fixed seed.
pub fn session_key(client: std::net::IpAddr, issued_ms: Option<u64>) -> u64 {
    let ip = match client {
        std::net::IpAddr::V4(v4) => v4.octets().to_vec(),
        std::net::IpAddr::V6(v6) => v6.octets().to_vec(),
    };
    match issued_ms {
        Some(t) => limpet_core::seen::session_key(&[&ip, &t.to_be_bytes()]),
        None => limpet_core::seen::session_key(&[&ip]),
    }
}
