//! # The multi-listener runtime: one node set, shared tables, many listeners
//!
//! Affinity belongs to the node. So there is ONE [`Pool`] for every listener (a node that is
//! DOWN is down for the HTTP port, the HTTPS ports and the TCP port alike), and ONE
//! [`AffinityTable`] per declared table, shared by every listener that names it: a pin made
//! through port 5011 is found by the lookup on port 5022 and on port 5555.
//!
//! ```text
//!                       ┌──────────────── State (swapped whole on reload: ArcSwap) ─────────────┐
//!  listener 5011 http ─┐│ pool: Mutex<Pool>   nodes[NodeId]: name, addr, down-generation watch │
//!  listener 5022 https ┼┤ tables["terminal"]: Mutex<AffinityTable<LruTable>> (+ snapshot file) │
//!  listener 5555 tcp  ─┘│ listeners[i]: ListenerDef (ports, TLS, affinity, balance, timeouts)  │
//!                       └───────────────────────────────────────────────────────────────────────┘
//!  connection ─► key (source IP / header / app cookie) ─► table.lookup ─► Pool::decide_with
//!              ─► fresh? table.record ─► connect node (fail: record_failure, re-pin, next)
//!  health checks / passive failures / admin ─► State::record / set_admin ─► transition?
//!              ─► node DOWN or MAINT: its down-generation bumps ─► its TCP sessions close
//! ```
//!
//! Entry points for node lifecycle (health checks, admin API, reload): [`State::record`],
//! [`State::set_admin`], [`State::node_views`], [`State::table`] / [`State::tables`], and
//! [`State::rebuild`] (a new `State` from a new validated config, carrying node states and
//! tables over by name). [`Runtime`] holds the current `State` in an `ArcSwap`; sessions keep
//! the `Arc<State>` they started with.
//!
//! Locks: the pool lock and a table lock are only held across synchronous core calls, never
//! across an await. When both are needed the table lock is taken first.

pub mod run;
mod snapshot;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use arc_swap::ArcSwap;
use limpet_core::table::{AffinityTable, KeyRef, KeySpec, LruTable, TableConfig};
use limpet_core::{AdminState, Balance, Decision, NodeId, NodeState, Pin, Pool, Transition};
use tokio::sync::watch;

use crate::config::{Config, ListenerDef, TableDef};

pub use run::{start, Running, StartError};
pub use snapshot::{load_snapshot, save_snapshot, SnapshotLoad};

pub(crate) use crate::tcp::stopped;

/// Milliseconds since the Unix epoch: the core's clock.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Locks ignoring poison: every critical section is one synchronous core call, which leaves
/// the data consistent even if a panic interrupted the caller after it.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A node as the runtime knows it: the core's view plus the I/O facts.
#[derive(Debug)]
pub struct NodeSlot {
    pub name: String,
    pub addr: IpAddr,
    /// Bumped every time the node goes DOWN or MAINT; TCP sessions to it watch this.
    down: watch::Sender<u64>,
    /// Connections open to the node now: the lifecycle's counter for this name, shared with
    /// every earlier and later state, so it survives reloads.
    active: Arc<AtomicU32>,
}

/// One declared table, shared by every listener that names it.
#[derive(Debug)]
pub struct Table {
    pub def: TableDef,
    inner: Mutex<AffinityTable<LruTable>>,
}

impl Table {
    fn new(def: TableDef, pool: &Pool) -> Result<Self, String> {
        let cfg = TableConfig::new(
            def.size,
            u64::try_from(def.expire.as_millis()).unwrap_or(u64::MAX),
        )
        .with_hash_seed(random_seed());
        let store = LruTable::new(cfg).map_err(|e| format!("table {}: {e}", def.name))?;
        Ok(Table {
            inner: Mutex::new(AffinityTable::new(store, pool)),
            def,
        })
    }

    pub fn key_spec(&self) -> &KeySpec {
        &self.def.key
    }

    /// The table, locked for one synchronous operation.
    pub fn lock(&self) -> MutexGuard<'_, AffinityTable<LruTable>> {
        lock(&self.inner)
    }
}

/// The hash seed of a table's index: keys come from the network, so it is random per process
/// (it never affects placement, only where an entry sits in memory).
fn random_seed() -> [u64; 2] {
    use std::hash::{BuildHasher, RandomState};
    let a = RandomState::new().hash_one(0x5eed_u64);
    let b = RandomState::new().hash_one(std::process::id());
    [a, b]
}

/// What the admin API and tests see of a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    pub name: String,
    pub addr: IpAddr,
    pub state: NodeState,
    pub admin: AdminState,
    pub weight: u32,
    /// Connections and TCP sessions open to it now (all listeners).
    pub active: u32,
    /// Entries pinned to it, per table name.
    pub pins: BTreeMap<String, u64>,
}

/// A listener's settings and the table it shares.
#[derive(Debug)]
pub struct ListenerSlot {
    /// Swappable so a reload can change timeouts, TLS or balance without rebinding.
    pub def: ArcSwap<ListenerDef>,
    pub table: Option<Arc<Table>>,
}

/// The running state: one pool, its nodes, the tables, the listeners' settings.
#[derive(Debug)]
pub struct State {
    pool: Mutex<Pool>,
    nodes: Vec<NodeSlot>,
    tables: BTreeMap<String, Arc<Table>>,
    pub listeners: Vec<ListenerSlot>,
    pub config: Arc<Config>,
    /// Node lifecycle (checks, drains, accounting, metrics): one per process, carried over
    /// by `rebuild`.
    pub lifecycle: Arc<crate::lifecycle::Lifecycle>,
}

/// Where a connection goes, as the runtime chose it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice {
    pub node: NodeId,
    /// True when the table had no usable pin and this is a fresh assignment.
    pub fresh: bool,
}

impl State {
    /// A fresh state for a validated config: every node UP, every table empty.
    pub fn new(config: Config) -> Result<State, String> {
        let lifecycle = crate::lifecycle::Lifecycle::new(config.lifecycle.clone());
        State::with_lifecycle(config, lifecycle)
    }

    /// A fresh state using this lifecycle (whose per-node counters it reads).
    fn with_lifecycle(
        config: Config,
        lifecycle: Arc<crate::lifecycle::Lifecycle>,
    ) -> Result<State, String> {
        let pool = Pool::with_weights(config.nodes.iter().map(|n| (n.name.as_str(), n.weight)))
            .map_err(|e| e.to_string())?
            .with_health_policy(config.health);
        let nodes = config
            .nodes
            .iter()
            .map(|n| NodeSlot {
                name: n.name.clone(),
                addr: n.addr,
                down: watch::channel(0).0,
                active: lifecycle.active_counter(&n.name),
            })
            .collect();
        let mut tables = BTreeMap::new();
        for t in &config.tables {
            tables.insert(t.name.clone(), Arc::new(Table::new(t.clone(), &pool)?));
        }
        let listeners = config
            .listeners
            .iter()
            .map(|l| ListenerSlot {
                table: l.table.as_ref().and_then(|t| tables.get(t).cloned()),
                def: ArcSwap::from_pointee(l.clone()),
            })
            .collect();
        Ok(State {
            pool: Mutex::new(pool),
            nodes,
            tables,
            listeners,
            lifecycle,
            config: Arc::new(config),
        })
    }

    /// A state for a new config that keeps what the running one learned, by name: node
    /// admin state and health, the rotation, open-connection counts (the lifecycle's, by
    /// name), and the entries of every table whose key is unchanged (pins
    /// to removed nodes read as unknown and re-pin). Open connections keep the old state.
    pub fn rebuild(&self, config: Config) -> Result<State, String> {
        let mut next = State::with_lifecycle(config, Arc::clone(&self.lifecycle))?;
        {
            let old = self.pool();
            let new = next.pool.get_mut().unwrap_or_else(|e| e.into_inner());
            new.carry_over(&old);
        }
        for (name, table) in next.tables.iter_mut() {
            if let Some(old) = self.tables.get(name) {
                if old.def.key == table.def.key {
                    // Share the old table: its entries are keyed by node name, so rebinding
                    // to the new pool keeps every pin whose node still exists.
                    old.lock().rebind(&lock(&next.pool));
                    *table = Arc::clone(old);
                }
            }
        }
        for (slot, def) in next.listeners.iter_mut().zip(next.config.listeners.iter()) {
            slot.table = def.table.as_ref().and_then(|t| next.tables.get(t).cloned());
        }
        Ok(next)
    }

    /// The pool, for one synchronous decision.
    pub fn pool(&self) -> MutexGuard<'_, Pool> {
        lock(&self.pool)
    }

    pub fn nodes(&self) -> &[NodeSlot] {
        &self.nodes
    }

    pub fn node_name(&self, id: NodeId) -> &str {
        self.nodes.get(id.index()).map_or("", |n| n.name.as_str())
    }

    pub fn node_id(&self, name: &str) -> Option<NodeId> {
        self.pool().lookup(name.as_bytes())
    }

    pub fn table(&self, name: &str) -> Option<&Arc<Table>> {
        self.tables.get(name)
    }

    pub fn tables(&self) -> impl Iterator<Item = &Arc<Table>> {
        self.tables.values()
    }

    /// A receiver that changes whenever `node` goes DOWN or MAINT.
    pub fn watch_down(&self, node: NodeId) -> Option<watch::Receiver<u64>> {
        self.nodes.get(node.index()).map(|n| n.down.subscribe())
    }

    /// Tells the node's sessions it went down (they close if their listener says so).
    fn notify_down(&self, node: NodeId) {
        if let Some(n) = self.nodes.get(node.index()) {
            n.down.send_modify(|g| *g = g.wrapping_add(1));
        }
    }

    /// Records a health result (active check or passive traffic) by node id; the returned
    /// transition, if any, has already been acted on (DOWN: sessions told to close).
    pub fn record_id(&self, node: NodeId, ok: bool) -> Option<Transition> {
        let t = {
            let mut pool = self.pool();
            if ok {
                pool.record_success(node)
            } else {
                pool.record_failure(node)
            }
        };
        if let Some(t) = t {
            self.lifecycle.transition(self.node_name(node), t);
        }
        match t {
            Some(Transition::WentDown) => {
                tracing::warn!(node = self.node_name(node), "node DOWN");
                self.notify_down(node);
            }
            Some(Transition::WentUp) => tracing::info!(node = self.node_name(node), "node UP"),
            None => {}
        }
        t
    }

    /// [`record_id`](Self::record_id) by node name (health checks know names). `None` also
    /// for an unknown name.
    pub fn record(&self, node: &str, ok: bool) -> Option<Transition> {
        let id = self.node_id(node)?;
        self.record_id(id, ok)
    }

    /// Forces a node's health (operator command, tests).
    pub fn force_health(&self, node: &str, up: bool) -> Option<Transition> {
        let id = self.node_id(node)?;
        let t = self.pool().force_health(id, up);
        if t == Some(Transition::WentDown) {
            self.notify_down(id);
        }
        t
    }

    /// Sets what the operator asks of a node. Returns the node's new state, or `None` for an
    /// unknown name. Entering MAINT (or DOWN by any path) closes its TCP sessions.
    pub fn set_admin(&self, node: &str, admin: AdminState) -> Option<NodeState> {
        let id = self.node_id(node)?;
        let (before, after) = {
            let mut pool = self.pool();
            let before = pool.state(id);
            pool.set_admin(id, admin);
            (before, pool.state(id))
        };
        let out = matches!(after, Some(NodeState::Down | NodeState::Maint));
        if out && before != after {
            self.notify_down(id);
        }
        after
    }

    /// Every node with its state, open connections and pins per table.
    pub fn node_views(&self) -> Vec<NodeView> {
        let now = now_ms();
        let mut pins: Vec<BTreeMap<String, u64>> = vec![BTreeMap::new(); self.nodes.len()];
        for (name, table) in &self.tables {
            let t = table.lock();
            let mut page = 0;
            loop {
                let entries =
                    limpet_core::table::AffinityStore::entries(t.store(), page, 4096, now);
                if entries.is_empty() {
                    break;
                }
                for e in &entries {
                    if let Some(id) = t.node_of(e.node) {
                        if let Some(m) = pins.get_mut(id.index()) {
                            *m.entry(name.clone()).or_insert(0) += 1;
                        }
                    }
                }
                page += 1;
            }
        }
        let pool = self.pool();
        pool.nodes()
            .map(|(id, n)| NodeView {
                name: n.name().to_owned(),
                addr: self
                    .nodes
                    .get(id.index())
                    .map_or(IpAddr::from([0, 0, 0, 0]), |s| s.addr),
                state: n.state(),
                admin: n.admin(),
                weight: n.weight(),
                active: self.active(id),
                pins: pins.get(id.index()).cloned().unwrap_or_default(),
            })
            .collect()
    }

    /// Chooses the node for a connection of listener `listener` whose table key is `key`
    /// (`None`: no table, or no key in this request). A table pin is honoured when its node
    /// takes it; otherwise a fresh assignment is made and recorded as the key's pin.
    pub fn choose(
        &self,
        table: Option<&Table>,
        key: Option<KeyRef<'_>>,
        balance: Balance,
        spread_key: u64,
    ) -> Option<Choice> {
        let now = now_ms();
        match (table, key) {
            (Some(t), Some(k)) => {
                let mut t = t.lock();
                let pin = t.lookup(k, now);
                let d = self
                    .pool()
                    .decide_with(pin, now, balance, spread_key, |n| self.active(n));
                t.record(k, d, now);
                choice(d)
            }
            _ => {
                let d = self
                    .pool()
                    .decide_with(Pin::None, now, balance, spread_key, |n| self.active(n));
                choice(d)
            }
        }
    }

    /// A fresh node for a connection whose node failed, excluding `failed`; re-pins the key.
    pub fn reassign(
        &self,
        table: Option<&Table>,
        key: Option<KeyRef<'_>>,
        balance: Balance,
        failed: &[NodeId],
    ) -> Option<NodeId> {
        let node = self
            .pool()
            .assign_with(balance, |n| failed.contains(&n), |n| self.active(n))?;
        if let (Some(t), Some(k)) = (table, key) {
            t.lock().learn(k, node, now_ms());
        }
        Some(node)
    }

    /// Connections open to `node` now, across every state of this process.
    pub fn active(&self, node: NodeId) -> u32 {
        self.nodes
            .get(node.index())
            .map_or(0, |n| n.active.load(Ordering::Relaxed))
    }

    /// Counts a connection to `node` as open until the guard drops (least-connections,
    /// admin views, drain completion). The count lives in the lifecycle by node name, so
    /// it stays right across reloads.
    pub fn open(&self, node: NodeId) -> ConnGuard {
        let counter = self.nodes.get(node.index()).map(|n| Arc::clone(&n.active));
        if let Some(c) = &counter {
            c.fetch_add(1, Ordering::Relaxed);
        }
        ConnGuard { counter }
    }

    /// The address `listener` connects to for `node`.
    pub fn upstream(&self, def: &ListenerDef, node: NodeId) -> Option<SocketAddr> {
        def.upstreams.get(node.index()).copied()
    }
}

fn choice(d: Decision) -> Option<Choice> {
    match d {
        Decision::Sticky(node) => Some(Choice { node, fresh: false }),
        Decision::Fresh { node, .. } => Some(Choice { node, fresh: true }),
        Decision::Unavailable => None,
    }
}

/// An open connection to a node; closing it (drop) updates the node's count.
#[derive(Debug)]
pub struct ConnGuard {
    counter: Option<Arc<AtomicU32>>,
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        if let Some(c) = &self.counter {
            // Never below zero: every decrement pairs with the increment in `open`.
            let _ = c.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| v.checked_sub(1));
        }
    }
}

/// The running limpet: the current [`State`], swapped whole on reload.
#[derive(Debug)]
pub struct Runtime {
    state: ArcSwap<State>,
}

impl Runtime {
    pub fn new(state: State) -> Arc<Runtime> {
        Arc::new(Runtime {
            state: ArcSwap::from_pointee(state),
        })
    }

    /// The current state. Hold the `Arc` for the life of one connection, not longer.
    pub fn state(&self) -> Arc<State> {
        self.state.load_full()
    }

    /// Installs a state built by [`State::rebuild`]. Listeners are bound once at start, so a
    /// reload that adds or moves bind addresses needs a restart (the caller checks).
    pub fn swap(&self, next: State) {
        self.state.store(Arc::new(next));
    }
}

/// The tokio runtime of `limpet run` and `limpet proxy`. With one thread it is a
/// current-thread runtime: the same single worker without the work-stealing machinery, which
/// costs a single-threaded proxy for nothing. Otherwise a multi-thread runtime with `threads`
/// workers (default: one per core).
pub fn tokio_runtime(threads: Option<u16>) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = match threads {
        Some(1) => tokio::runtime::Builder::new_current_thread(),
        Some(n) => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(usize::from(n));
            b
        }
        None => tokio::runtime::Builder::new_multi_thread(),
    };
    builder.enable_all().build()
}
