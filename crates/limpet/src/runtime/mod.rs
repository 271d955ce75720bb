//! # The multi-listener runtime: one node set, shared tables, many listeners
//!
//! Affinity belongs to the node. So every listener routes over ONE node set (a node that is
//! DOWN is down for the HTTP port, the HTTPS ports and the TCP port alike), and ONE
//! [`AffinityTable`] per declared table, shared by every listener that names it: a pin made
//! through port 5011 is found by the lookup on port 5022 and on port 5555.
//!
//! ```text
//!                    ┌──────────── State: one generation, immutable, swapped on reload ────────────┐
//!  listener 5011 ───┐│ topology (names, weights, ids)   nodes[NodeId] ─► Arc<NodeRuntime> (by name,│
//!  listener 5022 ───┼┤ snapshot cache (rebuilt when the board's epoch moves)   outlives generations)│
//!  listener 5555 ───┘│ tables["terminal"] (+ snapshot file)   listeners[i]: ListenerDef               │
//!                    └───────────────────────────────────────────────────────────────────────────────┘
//!  request / connection ─► RouteInput ─► State::route: table lock ─► lookup ─► limpet_core::route
//!                        ─► claims: rotation turn, connection pin, trial ─► table write ─► Route ─► connect
//!  checks / traffic / admin ─► NodeRuntime (status) ─► epoch++ ─► every generation's snapshot
//!                                                   └─► events ─► sessions re-check session_end
//! ```
//!
//! [`Runtime`] holds the current `State` in an `ArcSwap`. A request keeps the `Arc<State>`
//! current when it came for its whole life (one generation's node ids, connections and
//! settings); a client connection moves to the newest generation at its next request (one
//! atomic load of [`Runtime::generation`] tells it a reload happened), and a tunnel or TCP
//! session keeps its node but reads its listener's `close_on_node_down` from the running
//! config ([`CloseOnDown`]). Every node state comes from the node runtimes, so all of them
//! obey every later state change.
//!
//! Locks: a table lock is held across one lookup, one `route` and one write, never across an
//! await; node runtimes lock per node for one status change.

mod control;
mod node_states;
pub mod run;
pub(crate) mod snapshot;
pub mod workers;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use arc_swap::ArcSwap;
use limpet_core::table::{
    AffinityTable, Binding, KeyRef, KeySpec, LruTable, NodeRef, PutOutcome, TableConfig,
};
use limpet_core::{
    AdminState, Excluded, HealthPolicy, NodeId, NodeState, NodeStatus, Observation, RepinReason,
    Route, RouteInput, Snapshot, TableIn, Topology, Transition,
};

use crate::config::{Config, ListenerDef, TableDef};
use crate::nodes::{ConnGuard, NodeRuntime, TrialBy, TrialClaim};
use crate::store::{Store, Write};

pub use control::{
    reload, serve_signals, serve_signals_with, start as start_lifecycle, RuntimeControl,
    RuntimeSink, Signals, RELOAD_LOAD_LIMIT,
};
pub(crate) use control::{ConfigLoad, ReloadTasks};
pub use run::{start, Running, StartError};
pub use snapshot::{
    load_snapshot, load_snapshots, save_snapshot, SnapshotLoad, SNAPSHOT_LOAD_LIMIT,
};

pub(crate) use crate::tcp::stopped;

/// Locks ignoring poison: every critical section is one synchronous core call, which leaves
/// the data consistent even if a panic interrupted the caller after it.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A node of one generation: its name and address, and its runtime (shared by name with
/// every other generation).
#[derive(Debug)]
pub struct NodeSlot {
    pub name: String,
    pub addr: IpAddr,
    pub rt: Arc<NodeRuntime>,
    /// The node's [`NodeRuntime::readdressed`] at `addr`: what this generation sees of
    /// the node counts only while the node has that address.
    readdressed: u64,
}

/// The node a client connection was given for an earlier request whose cookie has not come
/// back yet (HTTP/2 streams and pipelined requests sent before the client had the cookie land
/// together). Set only by [`State::route`], and let go there when a request of the
/// connection brings a cookie of another node, which it stays on: the connection carries
/// more than one session ([`limpet_core::ConnPinWrite::Clear`]).
///
/// Node ids are a generation's (a reload may number the nodes anew), so the pin keeps the
/// generation it was set in: a route of another generation reads no pin, and a connection
/// that moves to a newer generation carries its pin over by name ([`ConnPin::carry`]).
#[derive(Debug)]
pub struct ConnPin(AtomicU64);

impl ConnPin {
    const NONE: u64 = u64::MAX;

    pub fn new() -> ConnPin {
        ConnPin(AtomicU64::new(Self::NONE))
    }

    fn pack(generation: u32, node: NodeId) -> u64 {
        (u64::from(generation) << 32) | u64::from(node.0)
    }

    /// What the pin holds (to claim it from), and its node if set in `generation`.
    fn read(&self, generation: u32) -> (u64, Option<NodeId>) {
        let v = self.0.load(Ordering::Acquire);
        let node = (v != Self::NONE && (v >> 32) as u32 == generation).then_some(NodeId(v as u32));
        (v, node)
    }

    /// Whether `seen` is a pin set in a generation newer than `generation`: a request still
    /// routing over an older one (it came before the reload) leaves it as it is.
    fn newer(seen: u64, generation: u32) -> bool {
        seen != Self::NONE && (seen >> 32) as u32 > generation
    }

    /// The node pinned in `generation`, if any.
    pub fn get(&self, generation: u32) -> Option<NodeId> {
        self.read(generation).1
    }

    /// Pins the connection unless a concurrent request changed the pin since it read `seen`.
    fn claim(&self, seen: u64, generation: u32, node: NodeId) -> bool {
        self.0
            .compare_exchange(
                seen,
                Self::pack(generation, node),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
    }

    /// Unpins the connection unless a concurrent request changed the pin since it read
    /// `seen`.
    fn clear(&self, seen: u64) {
        let _ = self
            .0
            .compare_exchange(seen, Self::NONE, Ordering::AcqRel, Ordering::Acquire);
    }

    /// Re-pins the connection (a failover moved its session).
    fn set(&self, generation: u32, node: NodeId) {
        self.0
            .store(Self::pack(generation, node), Ordering::Release);
    }

    /// Moves a pin set in `from`'s generation to the same node, by name, in `to`'s; a pin
    /// to a node `to` no longer has is dropped. A request of `to` that pinned meanwhile
    /// keeps its pin.
    pub fn carry(&self, from: &State, to: &State) {
        let (seen, node) = self.read(from.generation);
        let Some(node) = node else {
            return;
        };
        let _ = match to.node_id(from.node_name(node)) {
            Some(n) => self.claim(seen, to.generation, n),
            None => self
                .0
                .compare_exchange(seen, Self::NONE, Ordering::AcqRel, Ordering::Acquire)
                .is_ok(),
        };
    }
}

impl Default for ConnPin {
    fn default() -> Self {
        ConnPin::new()
    }
}

/// One declared table as one generation sees it: the entries (shared by every listener that
/// names the table, and with later generations while the key is unchanged) and this
/// generation's binding of them to its own node ids. A request that came before a reload
/// routes over its own generation's ids, so it reads and writes pins through its own binding:
/// a pin means the same node by name whichever generation wrote it.
#[derive(Debug)]
pub struct Table {
    pub def: TableDef,
    inner: Arc<Mutex<AffinityTable<LruTable>>>,
    binding: Binding,
    /// A shared table's store (fleet mode) and its name as the store keys it.
    shared: Option<(Arc<Store>, Arc<str>)>,
    /// A reload replaced it and let its entries go ([`Table::let_go`]): its snapshot file is
    /// the new table's from then on (`snapshot::save_snapshot`).
    retired: std::sync::atomic::AtomicBool,
}

impl Table {
    fn new(
        def: TableDef,
        topology: &Topology,
        shared: Option<&Arc<Store>>,
    ) -> Result<Self, String> {
        let cfg = TableConfig::new(
            def.size,
            u64::try_from(def.expire.as_millis()).unwrap_or(u64::MAX),
        )
        .with_hash_seed(random_seed());
        let store = LruTable::new(cfg).map_err(|e| format!("table {}: {e}", def.name))?;
        let mut table = AffinityTable::new(store, topology);
        let binding = table.bind(topology);
        let mut t = Table {
            inner: Arc::new(Mutex::new(table)),
            binding,
            shared: None,
            def,
            retired: std::sync::atomic::AtomicBool::new(false),
        };
        t.link(shared);
        Ok(t)
    }

    /// A table marked `shared` goes through the store, when there is one. Its writes go to
    /// the store from now on; the store itself learns of the entries (reads, refreshes,
    /// re-pins of other instances) by [`Table::register`], once the generation knows which
    /// table it keeps (a fresh one or the carried-over one).
    fn link(&mut self, store: Option<&Arc<Store>>) {
        self.shared = match store {
            Some(s) if self.def.shared => Some((Arc::clone(s), Arc::from(self.def.name.as_str()))),
            _ => None,
        };
    }

    /// Hands a shared table's entries to the store (see [`Table::link`]).
    fn register(&self) {
        if let Some((s, _)) = &self.shared {
            s.register(&self.def.name, &self.inner, self.expire_ms());
        }
    }

    /// Pins were restored into the table (a snapshot, a handover): a shared table's are
    /// reconciled with the store (see [`Store::pins_restored`]).
    pub(crate) fn pins_restored(&self) {
        if let Some((s, _)) = &self.shared {
            s.pins_restored();
        }
    }

    fn expire_ms(&self) -> u64 {
        u64::try_from(self.def.expire.as_millis()).unwrap_or(u64::MAX)
    }

    /// Whether the table's pins go through the store (fleet mode).
    pub fn is_shared(&self) -> bool {
        self.shared.is_some()
    }

    /// Before routing a key this instance holds no entry for (the session's first request
    /// here): the fleet's pin from the store, into the local table. Awaits a read bounded by
    /// the store's `timeout` (two at most, below), and nothing when the key is held locally,
    /// the table is not shared or the store is down. [`State::route`] itself never waits for
    /// the store.
    ///
    /// A re-pin message of the key that comes while it is read finds no local entry to move
    /// (the store's `apply` drops it), and the read's answer may be older than the message:
    /// put in the table, it kept this instance on the older node while the fleet was on the
    /// newer one, until the key's expiry refresh. So whether one came is looked at under the
    /// table's lock, under which `apply` tells it, and the key is then read once more; a key
    /// moved during that read too is left to the route, whose create is answered the store's
    /// pin and adopts it.
    pub async fn prefetch(&self, key: KeyRef<'_>) {
        let Some((store, name)) = &self.shared else {
            return;
        };
        self.prefetch_with(key, || store.read_pin(name, key)).await;
    }

    /// [`Table::prefetch`] with `read` as the store's read of the key.
    async fn prefetch_with<F: std::future::Future<Output = Option<String>>>(
        &self,
        key: KeyRef<'_>,
        mut read: impl FnMut() -> F,
    ) {
        let Some((store, name)) = &self.shared else {
            return;
        };
        if !store.is_up()
            || self
                .lock()
                .store()
                .peek(key, crate::clock::now_ms())
                .is_some()
        {
            return;
        }
        let mut reading = store.reading(name, key);
        for _ in 0..2 {
            let Some(node) = read().await else {
                return;
            };
            let now = crate::clock::now_ms();
            let mut t = self.lock();
            if reading.moved() {
                continue;
            }
            let s = t.store_mut();
            // A concurrent request may have pinned it meanwhile: its write is on its way to
            // the store (and adopts the store's node if it lost). A node this generation has
            // not got (a name the table keeps from an earlier config) is not taken: the
            // request pins afresh, and its create, losing, heals the store's pin for the
            // fleet.
            if s.peek(key, now).is_none() {
                let known = limpet_core::table::AffinityStore::known(s, &node);
                match known.filter(|r| self.binding.node(*r).is_some()) {
                    Some(r) => {
                        limpet_core::table::AffinityStore::put(s, key, r, now);
                    }
                    None => {
                        drop(t);
                        store.unknown_node(&node);
                    }
                }
            }
            return;
        }
    }

    /// Tells the store what a local write did: a new pin is created if absent, a moved one
    /// overwritten for the fleet; a pin put again on the same node sends nothing (the expiry
    /// refresh is lazy and batched). Called under the table lock, so the store receives the
    /// writes of a key in the order they were made.
    ///
    /// `t` is the table, locked: a re-pin's former node is named by the table's own name for
    /// it, which a node a reload removed still has (the store holds that name, and a re-pin
    /// replayed after an outage compares the store with it).
    fn published(
        &self,
        t: &AffinityTable<LruTable>,
        key: KeyRef<'_>,
        node: NodeId,
        out: Option<PutOutcome>,
        names: &Topology,
    ) {
        let (Some((store, name)), Some(out)) = (&self.shared, out) else {
            return;
        };
        // Not stored here (the table full of entries open sessions hold): this instance
        // serves the key unpinned, and the fleet is not told of a pin it does not follow.
        if !out.stored {
            return;
        }
        let (write, from) = match out.previous {
            None => (Write::Create, None),
            Some(prev) if self.binding.node(prev) != Some(node) => (
                Write::Overwrite,
                limpet_core::table::AffinityStore::node_name(t.store(), prev),
            ),
            Some(_) => return,
        };
        store.send(write, name, key, names.name(node), from);
    }

    /// The same entries, bound to a newer generation's topology (a reload that kept the
    /// table's key). The table's own binding follows the newest generation, for the admin
    /// API and snapshots.
    /// `store` is the new generation's: a reload that marks a table `shared` links it.
    fn carried_over(
        &self,
        def: TableDef,
        topology: &Topology,
        store: Option<&Arc<Store>>,
    ) -> Table {
        let binding = {
            let mut t = self.lock();
            t.rebind(topology);
            // A reload's `size` and `expire` apply to the entries kept (validated with the
            // config, so the core refuses neither).
            if (def.size, def.expire) != (self.def.size, self.def.expire) {
                let expire_ms = u64::try_from(def.expire.as_millis()).unwrap_or(u64::MAX);
                match t
                    .store_mut()
                    .reconfigure(def.size, expire_ms, crate::clock::now_ms())
                {
                    Ok(gone) => {
                        tracing::info!(table = %def.name, size = def.size, expire_ms, gone, "table resized by the reload")
                    }
                    Err(e) => {
                        tracing::warn!(table = %def.name, error = ?e, "table size and expire kept: the reload's were refused")
                    }
                }
            }
            t.bind(topology)
        };
        let mut t = Table {
            def,
            inner: Arc::clone(&self.inner),
            binding,
            shared: None,
            retired: std::sync::atomic::AtomicBool::new(false),
        };
        t.link(store);
        t
    }

    pub fn key_spec(&self) -> &KeySpec {
        &self.def.key
    }

    /// The table, locked for one synchronous operation.
    pub fn lock(&self) -> MutexGuard<'_, AffinityTable<LruTable>> {
        lock(&self.inner)
    }

    /// Lets every entry go and gives their memory back ([`LruTable::let_go`]): a table a
    /// reload replaced ([`State::replaced_tables`]). Under one lock: a million entries take
    /// tens of milliseconds, and only the generation before the reload waits for it.
    pub fn let_go(&self) {
        self.retire();
        self.lock().store_mut().let_go();
    }

    /// A reload replaces the table: its snapshot file is the new table's from now on.
    pub fn retire(&self) {
        self.retired
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// Whether a reload replaced the table ([`Table::let_go`]).
    pub(crate) fn retired(&self) -> bool {
        self.retired.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Pins `key` to `node` of this generation (a learned answer header), `topology` being
    /// this generation's (for the node's name, when the table is shared).
    pub fn learn(&self, key: KeyRef<'_>, node: NodeId, now_ms: u64, topology: &Topology) {
        let mut t = self.lock();
        let out = t.learn_in(&self.binding, key, node, now_ms);
        self.published(&t, key, node, out, topology);
    }

    /// This generation's node for a stored identity.
    pub fn node_of(&self, r: NodeRef) -> Option<NodeId> {
        self.binding.node(r)
    }

    /// Holds `key`'s pin to `node` (of this generation) for a session open on it (see
    /// [`keep_pin`]): marks the entry used, or puts it back if it is gone (expired before the
    /// session started, evicted, deleted: the session is on `node` all the same). `None` when
    /// the entry pins another node; else how long until the next hold ([`KEEP_EVERY_MIN`]
    /// to [`KEEP_EVERY_MAX`]: half the table's expiry as it runs now). `None` when the node
    /// has no identity in the table.
    fn hold(
        &self,
        key: KeyRef<'_>,
        node: NodeId,
        now_ms: u64,
        topology: &Topology,
    ) -> Option<Held> {
        let r = self.binding.node_ref(node)?;
        let mut t = self.lock();
        match t.store().peek(key, now_ms) {
            Some(p) if p != r => return Some(Held::Elsewhere),
            Some(_) => {
                t.store_mut().keep(key, r, now_ms);
            }
            None => {
                let out = t.learn_in(&self.binding, key, node, now_ms);
                self.published(&t, key, node, out, topology);
            }
        }
        let expire = Duration::from_millis(t.store().expire_ms());
        Some(Held::Next(
            (expire / 2).clamp(KEEP_EVERY_MIN, KEEP_EVERY_MAX),
        ))
    }
}

/// What one hold of a session's pin found ([`Table::hold`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    /// Held; the next hold is due after this long.
    Next(Duration),
    /// The entry pins another node: the session's requests go there now.
    Elsewhere,
}

/// The bounds of the interval of [`keep_pin`]: half the expiry, so an open session's entry
/// never expires between two holds, however short the expiry (a table lock per session every
/// half of it: only a test sets an expiry of a second or less), and a long one still within
/// a minute.
const KEEP_EVERY_MIN: Duration = Duration::from_millis(1);
const KEEP_EVERY_MAX: Duration = Duration::from_secs(60);

/// What an open session holds in a table: the table (by name, and the entries it had when
/// the session opened), its key and its node (by name). From its making until it is dropped,
/// the key is held in those entries ([`LruTable::hold`]): its entry is never dropped to make
/// room for another key while the session is open.
#[derive(Debug)]
pub struct PinHold {
    runtime: Arc<Runtime>,
    table: String,
    /// The table's entries when the session opened: a reload that replaced the table (a new
    /// key) leaves the session nothing to hold there. Weak: an open session must not keep
    /// a replaced table's entries in memory.
    entries: std::sync::Weak<Mutex<AffinityTable<LruTable>>>,
    key: limpet_core::table::TableKey,
    node: String,
}

impl PinHold {
    /// The hold of a session open on the node named `node`, keyed `key` in `table`.
    pub fn new(
        runtime: Arc<Runtime>,
        table: &Table,
        key: limpet_core::table::TableKey,
        node: &str,
    ) -> PinHold {
        table.lock().store_mut().hold(key.as_key_ref());
        PinHold {
            runtime,
            table: table.def.name.clone(),
            entries: Arc::downgrade(&table.inner),
            key,
            node: node.to_owned(),
        }
    }

    /// One hold in the running config; `None` once there is nothing to hold.
    fn once(&self) -> Option<Held> {
        let state = self.runtime.state();
        let table = state.table(&self.table)?;
        if !std::ptr::eq(self.entries.as_ptr(), Arc::as_ptr(&table.inner)) {
            return None;
        }
        let node = state.node_id(&self.node)?;
        table.hold(
            self.key.as_key_ref(),
            node,
            crate::clock::now_ms(),
            state.topology(),
        )
    }
}

impl Drop for PinHold {
    /// The session ended: its key is no longer held where it was (a table a reload replaced
    /// and no one uses any more is gone, and its holds with it).
    fn drop(&mut self) {
        if let Some(entries) = self.entries.upgrade() {
            lock(&entries).store_mut().release(self.key.as_key_ref());
        }
    }
}

/// Keeps the table entry of a session that holds a node for as long as it is open (a TCP
/// session, a WebSocket or other tunnel): at once, then every half expiry and at each
/// reload (which may shorten the expiry), its pin is marked used (or put back, if it went
/// meanwhile), so it neither expires nor falls to the least recently used end while the
/// session runs, and the session's next connection or request finds the same node. Without
/// it, a WebSocket open past `expire` with no request beside it lost its entry, and the
/// session's next request was pinned afresh, maybe elsewhere: the session on two nodes (chaos
/// run). HAProxy keeps a stick-table entry a session references the same way.
///
/// Each hold reads the running config (a reload may move the node's id, resize the table or
/// change its expiry). Resolves when the entry pins another node while `close_on_move` says
/// so (the listener's `close_on_node_down`): the session's requests go there now (a re-pin,
/// or a request that came between an eviction and the next hold), and the session must
/// follow them, closed as a moved session is. Else never resolves; it stops holding once
/// the node or the table is gone, or the table was replaced. Run it beside the session,
/// which drops it.
pub async fn keep_pin(
    hold: Option<PinHold>,
    close_on_move: impl Fn() -> bool,
) -> crate::nodes::EndReason {
    if let Some(hold) = hold {
        let mut reloads = hold.runtime.reloads();
        reloads.mark_unchanged();
        loop {
            match hold.once() {
                Some(Held::Next(next)) => {
                    tokio::select! {
                        () = tokio::time::sleep(next) => {}
                        r = reloads.changed() => if r.is_err() {
                            // No more reloads (the runtime is gone): the interval only.
                            tokio::time::sleep(next).await;
                        },
                    }
                }
                Some(Held::Elsewhere) if close_on_move() => {
                    return crate::nodes::EndReason::TableMoved
                }
                Some(Held::Elsewhere) | None => break,
            }
        }
    }
    std::future::pending().await
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
    pub status: NodeStatus,
    pub weight: u32,
    /// Connections and TCP sessions open to it now (all listeners, all generations).
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

/// A snapshot of the node states and the board epoch it was built at.
#[derive(Debug)]
struct Cached {
    epoch: u64,
    snap: Snapshot,
}

/// One generation of the running state: the topology, its node slots, the tables, the
/// listeners' settings. Immutable once built, except the rotation and the snapshot cache.
#[derive(Debug)]
pub struct State {
    /// This generation's number, one per state built in the process ([`State::generation`]).
    generation: u32,
    topology: Topology,
    nodes: Vec<NodeSlot>,
    snapshot: ArcSwap<Cached>,
    rotation: AtomicU64,
    tables: BTreeMap<String, Arc<Table>>,
    pub listeners: Vec<ListenerSlot>,
    pub config: Arc<Config>,
    /// Node lifecycle (node runtimes, checks, metrics): one per process, carried over by
    /// `rebuild`.
    pub lifecycle: Arc<crate::lifecycle::Lifecycle>,
    /// Fleet mode: the store shared tables go through. One per process, carried over by
    /// `rebuild` (a reload keeps the connection).
    store: Option<Arc<Store>>,
}

/// The session's spread key, one derivation for every protocol: from the table key when
/// there is one (so every listener sharing the table places the session alike), else from
/// the client address and the cookie's issue time. See `limpet_core::spread_key`.
pub fn spread_of(key: Option<KeyRef<'_>>, client: IpAddr, issued_ms: Option<u64>) -> u64 {
    let client = Octets::of(client);
    match key {
        Some(k) => match (k.ip_addr(), k.as_bytes()) {
            (Some(ip), _) => {
                limpet_core::spread_key(Some(Octets::of(ip).bytes()), client.bytes(), None)
            }
            (None, Some(b)) => limpet_core::spread_key(Some(b), client.bytes(), None),
            // A long key is held as its digest: the session is still the key's, whatever
            // client presents it (the fleet's re-pins name the key, not a client).
            (None, None) => match k.digest() {
                Some(d) => limpet_core::spread_key(Some(&d), client.bytes(), None),
                None => limpet_core::spread_key(None, client.bytes(), issued_ms),
            },
        },
        None => limpet_core::spread_key(None, client.bytes(), issued_ms),
    }
}

/// An address's octets on the stack ([`spread_of`] runs on every request: no allocation).
struct Octets {
    buf: [u8; 16],
    len: usize,
}

impl Octets {
    /// An IPv4 client as the same 4 bytes whichever socket it came through (an IPv4-mapped
    /// `::ffff:a.b.c.d` on a dual-stack socket included), as table keys take it: its
    /// listeners, one of each kind, place it alike in a drain's re-pin window.
    fn of(ip: IpAddr) -> Self {
        let mut buf = [0u8; 16];
        let len = match ip.to_canonical() {
            IpAddr::V4(v4) => {
                buf[..4].copy_from_slice(&v4.octets());
                4
            }
            IpAddr::V6(v6) => {
                buf = v6.octets();
                16
            }
        };
        Octets { buf, len }
    }

    fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// The health policy of a node under `config`: its active checks' `fall`/`rise` when it has
/// checks (then only checks bring it back), else the passive `[health]` policy.
pub fn node_policy(config: &Config, node: &str) -> HealthPolicy {
    match config.lifecycle.checks.iter().find(|(n, _)| n == node) {
        Some((_, spec)) => HealthPolicy {
            fall: spec.fall.max(1),
            rise: spec.rise.max(1),
            checked: true,
            ..config.health
        },
        None => HealthPolicy {
            checked: false,
            ..config.health
        },
    }
}

impl State {
    /// A fresh state for a validated config: every node UP, every table empty.
    pub fn new(config: Config) -> Result<State, String> {
        let lifecycle = crate::lifecycle::Lifecycle::new(config.lifecycle.clone());
        State::with_lifecycle(config, lifecycle, None)
    }

    /// A fresh state whose shared tables go through `store` (fleet mode), with `lifecycle`
    /// (the one the store's metrics were registered with).
    pub fn with_store(
        config: Config,
        lifecycle: Arc<crate::lifecycle::Lifecycle>,
        store: Arc<Store>,
    ) -> Result<State, String> {
        let state = State::with_lifecycle(config, lifecycle, Some(store))?;
        for t in state.tables.values() {
            t.register();
        }
        Ok(state)
    }

    /// The store of fleet mode, if configured.
    pub fn store(&self) -> Option<&Arc<Store>> {
        self.store.as_ref()
    }

    /// A state using this lifecycle (whose node runtimes it shares by name). Its shared
    /// tables are linked to the store but not registered with it: the caller registers the
    /// ones it keeps.
    fn with_lifecycle(
        config: Config,
        lifecycle: Arc<crate::lifecycle::Lifecycle>,
        store: Option<Arc<Store>>,
    ) -> Result<State, String> {
        let topology =
            Topology::with_weights(config.nodes.iter().map(|n| (n.name.as_str(), n.weight)))
                .map_err(|e| e.to_string())?;
        let mut tables = BTreeMap::new();
        for t in &config.tables {
            tables.insert(
                t.name.clone(),
                Arc::new(Table::new(t.clone(), &topology, store.as_ref())?),
            );
        }
        // Only once nothing else can fail: a refused reload leaves the node runtimes as they
        // were.
        let nodes: Vec<NodeSlot> = config
            .nodes
            .iter()
            .map(|n| {
                let rt = lifecycle.node(&n.name);
                rt.set_policy(node_policy(&config, &n.name));
                rt.set_limits(n.max_connections, n.max_queue);
                NodeSlot {
                    name: n.name.clone(),
                    addr: n.addr,
                    readdressed: rt.readdressed(),
                    rt,
                }
            })
            .collect();
        let listeners = config
            .listeners
            .iter()
            .map(|l| ListenerSlot {
                table: l.table.as_ref().and_then(|t| tables.get(t).cloned()),
                def: ArcSwap::from_pointee(l.clone()),
            })
            .collect();
        let state = State {
            generation: GENERATIONS.fetch_add(1, Ordering::Relaxed),
            snapshot: ArcSwap::from_pointee(Cached {
                epoch: u64::MAX,
                snap: Snapshot::default(),
            }),
            rotation: AtomicU64::new(0),
            topology,
            nodes,
            tables,
            listeners,
            lifecycle,
            store,
            config: Arc::new(config),
        };
        Ok(state)
    }

    /// A state for a new config that keeps what the running one learned: node runtimes are
    /// shared by name (admin state, health, counts, session signals), the rotation goes on,
    /// and every table whose key is unchanged keeps its entries (pins to removed nodes read
    /// as unknown and re-pin). A node added back after a reload removed it starts fresh.
    pub fn rebuild(&self, config: Config) -> Result<State, String> {
        let added: Vec<String> = config
            .nodes
            .iter()
            .filter(|n| !self.config.nodes.iter().any(|o| o.name == n.name))
            .map(|n| n.name.clone())
            .collect();
        if let Some(s) = &self.store {
            if config.store.as_ref() != Some(s.def()) {
                tracing::warn!(
                    "[store] changed or removed: the running connection is kept until a restart"
                );
            }
        } else if config.store.is_some() {
            tracing::warn!("[store] added: shared tables go through it after a restart");
        }
        let mut next =
            State::with_lifecycle(config, Arc::clone(&self.lifecycle), self.store.clone())?;
        // A node added back starts fresh, and one at another address than before starts as
        // a new one would (its health was the old address's), keeping its admin state and
        // its pins (they name the node). Either way what the older generations still see of
        // it (a request unanswered at the address it had, whether the same or not: a
        // removal took it out of every check's reckoning) no longer counts.
        for slot in &mut next.nodes {
            let policy = node_policy(&next.config, &slot.name);
            if added.contains(&slot.name) {
                slot.readdressed = slot.rt.reset(policy);
            } else if self
                .nodes
                .iter()
                .any(|o| o.name == slot.name && o.addr != slot.addr)
            {
                slot.readdressed = slot.rt.readdress(policy);
            }
        }
        next.rotation = AtomicU64::new(self.rotation.load(Ordering::Relaxed));
        for (name, table) in next.tables.iter_mut() {
            if let Some(old) = self.tables.get(name) {
                if old.def.key == table.def.key {
                    // Share the old entries: they are keyed by node name, so binding them to
                    // the new topology keeps every pin whose node still exists, while the old
                    // generation keeps its own binding for its connections.
                    *table = Arc::new(old.carried_over(
                        table.def.clone(),
                        &next.topology,
                        next.store.as_ref(),
                    ));
                }
            }
        }
        // Only the tables this generation keeps go to the store: a fresh table a carried one
        // replaced never receives the store's reads or the fleet's re-pins.
        for t in next.tables.values() {
            t.register();
        }
        if let Some(s) = &next.store {
            let shared: Vec<&str> = next
                .tables
                .values()
                .filter(|t| t.is_shared())
                .map(|t| t.def.name.as_str())
                .collect();
            s.retain(&shared);
        }
        for (slot, def) in next.listeners.iter_mut().zip(next.config.listeners.iter()) {
            slot.table = def.table.as_ref().and_then(|t| next.tables.get(t).cloned());
        }
        Ok(next)
    }

    /// This state's number: distinct for every state built in the process, and rising with
    /// each reload. A connection tells from it, with one load, that a reload happened
    /// since it last looked ([`Runtime::generation`]).
    pub fn generation(&self) -> u32 {
        self.generation
    }

    /// Names, weights and ids of this generation's nodes (what codecs and tables bind to).
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    pub fn nodes(&self) -> &[NodeSlot] {
        &self.nodes
    }

    pub fn node_name(&self, id: NodeId) -> &str {
        self.topology.name(id)
    }

    pub fn node_id(&self, name: &str) -> Option<NodeId> {
        self.topology.lookup(name.as_bytes())
    }

    /// The runtime of a node of this generation.
    pub fn node_rt(&self, id: NodeId) -> Option<&Arc<NodeRuntime>> {
        self.nodes.get(id.index()).map(|n| &n.rt)
    }

    pub fn table(&self, name: &str) -> Option<&Arc<Table>> {
        self.tables.get(name)
    }

    /// This generation's tables that `next` (the generation a reload installed after it)
    /// does not carry on: their key changed, or the reload removed them. Only this
    /// generation's connections still reach them, and a TCP session holds its generation
    /// for as long as it is open: their entries are let go ([`Table::let_go`]) rather
    /// than kept until the last such session ends.
    pub fn replaced_tables(&self, next: &State) -> Vec<Arc<Table>> {
        self.tables
            .values()
            .filter(|t| {
                !next
                    .tables
                    .values()
                    .any(|n| Arc::ptr_eq(&n.inner, &t.inner))
            })
            .cloned()
            .collect()
    }

    pub fn tables(&self) -> impl Iterator<Item = &Arc<Table>> {
        self.tables.values()
    }

    /// The node states as the router reads them, rebuilt only when a status changed since.
    fn snapshot(&self) -> arc_swap::Guard<Arc<Cached>> {
        let epoch = self.lifecycle.nodes.epoch();
        let cached = self.snapshot.load();
        if cached.epoch == epoch {
            return cached;
        }
        let snap = Snapshot::new(
            self.nodes
                .iter()
                .enumerate()
                .map(|(i, n)| (self.topology.weight(NodeId(i as u32)), n.rt.status())),
        );
        self.snapshot.store(Arc::new(Cached { epoch, snap }));
        self.snapshot.load()
    }

    /// THE routing step of every protocol: looks the session's key up in `table` (when
    /// there is one), routes with `limpet_core::route`, and carries out what the route asks,
    /// all under the table's lock so that two connections of one session cannot route on
    /// different entries:
    ///
    /// 1. a turn of the rotation, taken with a compare-and-swap (two sessions routed at once
    ///    never share a turn; the loser routes again on the next one);
    /// 2. the client connection's pin (`conn`), claimed if it had none (concurrent first
    ///    requests of one connection: the first wins, the others route again and follow it);
    /// 3. the trial of a DOWN node due one, claimed for at most `trial_hold` (as long as its
    ///    outcome may take to be known), and returned: the caller holds the claim until the
    ///    outcome is observed, and dropped before, it ends the claim. A trial another
    ///    connection holds, or one `trial_by` cannot decide (a connect, for a node that
    ///    left a request unanswered), makes this route again without that node;
    /// 4. the table write.
    ///
    /// Nothing is written before every claim is won, so a route that is retried leaves no
    /// trace.
    pub fn route(
        &self,
        table: Option<(&Table, KeyRef<'_>)>,
        input: RouteInput<'_>,
        conn: Option<&ConnPin>,
        trial_hold: Duration,
        trial_by: TrialBy,
    ) -> (Route, Option<TrialClaim>) {
        match self.route_or_await(table, input, conn, trial_hold, trial_by, false) {
            Routed::Go(r, trial) => (r, trial),
            // Not asked to wait: never.
            Routed::AwaitTrial(_) => (Route::none(), None),
        }
    }

    /// [`route`](Self::route), for the first route of a request or session, which may wait:
    /// when the session's own node (the one routing would send it to once back: the written
    /// table's entry, else its cookie's, else the table's) is DOWN with a trial another
    /// request holds, it waits for that trial's outcome, for at most
    /// [`TRIAL_AWAIT`], and routes again: there to the node if it is back, elsewhere if not
    /// (or if the trial is still in flight). Routed on at once, the session moved off a node
    /// that was back: a browser's parallel requests, or every session pinned to a node that
    /// arrived while its trial's request was out, were re-pinned to other nodes for good.
    pub async fn route_first(
        &self,
        table: Option<(&Table, KeyRef<'_>)>,
        input: RouteInput<'_>,
        conn: Option<&ConnPin>,
        trial_hold: Duration,
        trial_by: TrialBy,
    ) -> (Route, Option<TrialClaim>) {
        match self.route_or_await(table, input, conn, trial_hold, trial_by, true) {
            Routed::Go(r, trial) => (r, trial),
            Routed::AwaitTrial(mut decided) => {
                // Boxed: the rare path's timer would otherwise grow every request's future.
                let _ = Box::pin(tokio::time::timeout(TRIAL_AWAIT, decided.changed())).await;
                let input = RouteInput {
                    now_ms: crate::clock::now_ms(),
                    ..input
                };
                self.route(table, input, conn, trial_hold, trial_by)
            }
        }
    }

    fn route_or_await(
        &self,
        table: Option<(&Table, KeyRef<'_>)>,
        mut input: RouteInput<'_>,
        conn: Option<&ConnPin>,
        trial_hold: Duration,
        trial_by: TrialBy,
        await_trial: bool,
    ) -> Routed {
        let now = input.now_ms;
        let mut held = table.map(|(t, k)| {
            (
                t.lock(),
                &t.binding,
                k,
                !t.key_spec().learns_from_response(),
                t,
            )
        });
        if let Some((t, b, k, writes, _)) = held.as_mut() {
            input.table = Some(TableIn {
                pin: t.lookup_in(b, *k, now),
                writes: *writes,
            });
        }
        // Trials another connection holds (rare: allocated only then). Such a node is DOWN:
        // a pin to it moves as from any DOWN node.
        let mut taken: Vec<Excluded> = Vec::new();
        // Each pass either returns, or loses a race that moved shared state on (a turn, the
        // connection's pin) or adds a node to `taken`: bounded by the contention.
        loop {
            let with_taken;
            let mut input = input;
            if !taken.is_empty() {
                with_taken = [input.exclude, &taken].concat();
                input.exclude = &with_taken;
            }
            let seen = conn.map(|c| c.read(self.generation));
            input.conn_pin = seen.and_then(|(_, n)| n);
            let cached = self.snapshot();
            let turn = self.rotation.load(Ordering::Acquire);
            let r = limpet_core::route(&cached.snap, turn, &|n| self.active(n), &input);
            // The session's own node is DOWN with another request's trial of it in flight:
            // its outcome is waited for, before anything is written, rather than the session
            // moved off a node that may be back.
            if await_trial {
                if let Some(decided) = self.trial_to_await(&input, &r, &cached.snap, now) {
                    return Routed::AwaitTrial(decided);
                }
            }
            if r.took_turn
                && self
                    .rotation
                    .compare_exchange(
                        turn,
                        turn.wrapping_add(1),
                        Ordering::AcqRel,
                        Ordering::Relaxed,
                    )
                    .is_err()
            {
                continue;
            }
            match (conn, seen, r.conn_pin) {
                (Some(c), Some((seen, _)), limpet_core::ConnPinWrite::Set(n)) => {
                    match input.conn_pin {
                        None if ConnPin::newer(seen, self.generation) => {}
                        None if !c.claim(seen, self.generation, n) => continue,
                        None => {}
                        Some(_) => c.set(self.generation, n),
                    }
                }
                // Another session's cookie came on the connection. A concurrent request that
                // changed the pin meanwhile keeps what it set.
                (Some(c), Some((seen, _)), limpet_core::ConnPinWrite::Clear) => c.clear(seen),
                _ => {}
            }
            let mut trial = None;
            if let (true, Some(n)) = (r.trial, r.node) {
                // The session's own node, its trial just claimed by another request (a race
                // with the snapshot): waited for as above, watched from before the claim and
                // read again after it.
                let decided = (await_trial && own_node(&input) == Some(n))
                    .then(|| self.node_rt(n).map(|rt| rt.status_changes()))
                    .flatten();
                trial = self
                    .node_rt(n)
                    .and_then(|rt| rt.claim_trial(trial_hold, r.trial_early, trial_by));
                if trial.is_none() {
                    let now = crate::clock::now_ms();
                    let in_flight = self
                        .node_rt(n)
                        .is_some_and(|rt| worth_awaiting(&rt.status(), now));
                    if let Some(decided) = decided.filter(|_| in_flight) {
                        return Routed::AwaitTrial(decided);
                    }
                    taken.push(Excluded {
                        node: n,
                        why: RepinReason::NodeDown,
                    });
                    continue;
                }
                if r.trial_early {
                    // At debug: with every node DOWN, each request may make one.
                    tracing::debug!(
                        node = self.node_name(n),
                        "trying a DOWN node before its fail_timeout: no other node can take the request"
                    );
                } else {
                    tracing::info!(
                        node = self.node_name(n),
                        "trying a DOWN node again (fail_timeout passed)"
                    );
                }
            }
            if let (Some((t, b, k, _, table)), Some(node)) = (held.as_mut(), r.table) {
                let out = t.learn_in(b, *k, node, now);
                table.published(t, *k, node, out, &self.topology);
            }
            // The session moves off a node that failed its request, or fails back home: its
            // TCP sessions and tunnels there end, so the session lives on one node.
            if let Some((n, why)) = limpet_core::leaves(&input, &r) {
                if let Some(rt) = self.node_rt(n) {
                    rt.session_moved(input.spread_key, why);
                }
            }
            return Routed::Go(r, trial);
        }
    }

    /// Tries, with an attempt of its own at `addr` (the node as the caller's listener reaches
    /// it), a DOWN node whose trial is due though no route made it: a route tries such a
    /// node only for a fresh assignment or a session pinned to it, so once every session moved
    /// off it and none came fresh (the fixed clients of a source-address table, the print
    /// server's), a node that blinked stayed DOWN for good, its share of the load on the
    /// others. Called after a route that was no trial; one comparison until a trial is due.
    /// The trial is claimed as a route claims one (one at a time, for `hold`: what the
    /// attempt may take, and a margin for getting to its task), and `attempt`'s outcome
    /// observed as the caller's listener would observe its own: with `by`
    /// [`TrialBy::Connect`] (a TCP listener's connect), a completed attempt brings back a
    /// node DOWN by failed connects, and a node that left requests unanswered is not tried
    /// this way; with [`TrialBy::Answer`] (an HTTP listener's `OPTIONS *`, or a TLS handshake
    /// where only TCP listeners reach the node), it is the node's answer, and such a node is
    /// tried too.
    /// Only once the trial has been due for [`TRIAL_BY_CONNECT_AFTER`] with no request to
    /// make it: under fresh traffic a request tries the node, as ever.
    /// Whether a trial was started.
    pub fn try_due_trial<A>(
        self: &Arc<Self>,
        now_ms: u64,
        addr: impl Fn(NodeId) -> Option<SocketAddr>,
        (hold, by): (Duration, TrialBy),
        attempt: impl FnOnce(NodeId, SocketAddr) -> A,
    ) -> bool
    where
        A: std::future::Future<Output = Result<(), crate::error::UpstreamError>> + Send + 'static,
    {
        let cached = self.snapshot();
        let due_since = now_ms.saturating_sub(crate::clock::ms(TRIAL_BY_CONNECT_AFTER));
        let answers = by == TrialBy::Answer;
        let Some((node, addr, claim)) = cached.snap.trials_due(due_since, answers).find_map(|n| {
            let addr = addr(n)?;
            Some((n, addr, self.node_rt(n)?.claim_trial(hold, false, by)?))
        }) else {
            return false;
        };
        drop(cached);
        tracing::info!(
            node = self.node_name(node),
            "trying a DOWN node again with an attempt of limpet's own (fail_timeout passed, no request tried it)"
        );
        let state = Arc::clone(self);
        let attempt = attempt(node, addr);
        tokio::spawn(async move {
            let outcome = match attempt.await {
                Ok(()) if answers => Some(Observation::TrafficOk),
                Ok(()) => Some(Observation::TrafficConnected),
                // Out of file descriptors says nothing of the node: the claim just ends.
                Err(e) => e.observation(),
            };
            if let Some(obs) = outcome {
                state.observe(node, obs);
            }
            drop(claim);
        });
        true
    }

    /// Whether a DOWN node is due a trial that an attempt of limpet's own decided by an
    /// answer may make ([`State::try_due_trial`] with [`TrialBy::Answer`]): one comparison
    /// until one is.
    pub fn answer_trial_due(&self, now_ms: u64) -> bool {
        let due_since = now_ms.saturating_sub(crate::clock::ms(TRIAL_BY_CONNECT_AFTER));
        self.snapshot()
            .snap
            .trials_due(due_since, true)
            .next()
            .is_some()
    }

    /// The session's own node, when `r` moves the session off it because it is DOWN with
    /// another request's trial of it in flight ([`worth_awaiting`]): a watch of the node's
    /// status, subscribed before the status is read again (at the same `now` as the snapshot
    /// was), so that an outcome in between is not missed, and a claim that ran out meanwhile
    /// lets the route stand rather than routing again on the same snapshot. Not when the route
    /// sends the session home (`failback`) or elsewhere for a reason the node's return would
    /// not change.
    fn trial_to_await(
        &self,
        input: &RouteInput<'_>,
        r: &Route,
        snap: &Snapshot,
        now: u64,
    ) -> Option<tokio::sync::watch::Receiver<u64>> {
        if r.outcome == limpet_core::Outcome::Failback {
            return None;
        }
        let own = own_node(input)?;
        if r.node == Some(own) || Excluded::find(input.exclude, own).is_some() {
            return None;
        }
        if !snap.status(own).is_some_and(|s| worth_awaiting(s, now)) {
            return None;
        }
        let rt = self.node_rt(own)?;
        let decided = rt.status_changes();
        worth_awaiting(&rt.status(), now).then_some(decided)
    }

    /// How many turns of the rotation fresh assignments took (carried over by reloads).
    pub fn rotation(&self) -> u64 {
        self.rotation.load(Ordering::Relaxed)
    }

    /// Whether a request waiting on `node` could be replayed now on another node (one that
    /// takes fresh assignments and is not in `exclude`): `Snapshot::takes_elsewhere`.
    pub fn takes_elsewhere(&self, node: NodeId, exclude: &[limpet_core::Excluded]) -> bool {
        self.snapshot().snap.takes_elsewhere(node, exclude)
    }

    /// Records what was seen of a node; logs and counts a transition.
    pub fn observe(&self, node: NodeId, obs: Observation) -> Option<Transition> {
        self.observe_at(node, obs, crate::clock::now_ms())
    }

    /// [`observe`](Self::observe) at `now_ms`, a reading the caller took (the request path
    /// shares one between the answer's latency and its health observation).
    pub fn observe_at(&self, node: NodeId, obs: Observation, now_ms: u64) -> Option<Transition> {
        // A slow answer of the last node taking sessions is not counted (as in the core's
        // `Pool::observe`). Slow answers are judged one at a time, on the nodes' statuses
        // now rather than the cached snapshot: the last two nodes timing out together on
        // two threads must not each see the other still taking sessions and both go DOWN.
        let _one_at_a_time = (obs == Observation::SlowAnswer)
            .then(|| crate::lifecycle::lock(&self.lifecycle.slow_answers));
        if !limpet_core::pool::counts_for_health(
            node,
            obs,
            self.nodes.iter().map(|n| n.rt.status()),
        ) {
            return None;
        }
        let slot = self.nodes.get(node.index())?;
        let rt = &slot.rt;
        let t = rt.observe_at_address(obs, slot.readdressed, now_ms);
        if t == Some(Transition::WentUp) && limpet_core::pool::back_from_trial(obs) {
            // Back from a trial: the others DOWN by their traffic are due theirs now
            // (`Health::trial_due_now`), as in the core's `Pool::observe`.
            for (i, n) in self.nodes.iter().enumerate() {
                if i != node.index() {
                    n.rt.trial_due_now(now_ms);
                }
            }
        }
        if let Some(t) = t {
            self.lifecycle.transition(rt.name(), t);
            // A check's result is logged where the check runs, with the check and its error
            // (`crate::health`): one line per change, not two.
            let by_check = matches!(
                obs,
                Observation::CheckPassed(_)
                    | Observation::CheckFailed(_)
                    | Observation::CheckConnected(_)
            );
            match t {
                _ if by_check => {}
                Transition::WentDown => tracing::warn!(node = rt.name(), cause = ?obs, "node DOWN"),
                Transition::WentUp => tracing::info!(node = rt.name(), cause = ?obs, "node UP"),
            }
        }
        t
    }

    /// [`observe`](Self::observe) by node name (health checks know names).
    pub fn observe_named(&self, node: &str, obs: Observation) -> Option<Transition> {
        let id = self.node_id(node)?;
        self.observe(id, obs)
    }

    /// A health check of `node` stopped (a reload removed or changed it): its last result
    /// no longer counts toward the node's health.
    pub fn forget_check(&self, node: &str, check: limpet_core::CheckSlot) {
        if let Some(rt) = self.node_id(node).and_then(|id| self.node_rt(id)) {
            rt.forget_check(check);
        }
    }

    /// Forces a node's health (operator command, tests).
    pub fn force_health(&self, node: &str, up: bool) -> Option<Transition> {
        let id = self.node_id(node)?;
        let t = self.node_rt(id)?.force_health(up);
        if let Some(t) = t {
            self.lifecycle.transition(node, t);
        }
        t
    }

    /// Sets what the operator asks of a node. Returns the node's new state, or `None` for an
    /// unknown name. Every generation sees it at once; MAINT ends the node's sessions.
    pub fn set_admin(&self, node: &str, admin: AdminState) -> Option<NodeState> {
        let id = self.node_id(node)?;
        let rt = self.node_rt(id)?;
        rt.set_admin(admin);
        self.lifecycle.admin_changed.notify_one();
        Some(rt.status().state())
    }

    /// `failed` (nodes of this generation that failed a request or session) as generation
    /// `to` names them, for one that routes again after a reload: carried by name, those
    /// `to` lacks kept aside in `gone`, and those of `gone` that `to` has back excluded again,
    /// so that its attempts stay bounded by the node names it meets however many reloads
    /// come (HTTP's `forward::Attempt::route_in`, TCP's `tcp::follow_reload`).
    pub fn carry_excluded(
        &self,
        failed: &[limpet_core::Excluded],
        to: &State,
        gone: &mut Vec<(Box<str>, limpet_core::RepinReason)>,
    ) -> Vec<limpet_core::Excluded> {
        use limpet_core::Excluded;
        let mut carried = Vec::with_capacity(failed.len());
        for e in failed {
            match to.node_id(self.node_name(e.node)) {
                Some(node) => carried.push(Excluded { node, why: e.why }),
                None => gone.push((self.node_name(e.node).into(), e.why)),
            }
        }
        gone.retain(|(name, why)| match to.node_id(name) {
            Some(node) => {
                carried.push(Excluded { node, why: *why });
                false
            }
            None => true,
        });
        carried
    }

    /// What the operator asked of each node (MAINT, DRAIN, READY), by name: what a new limpet
    /// taking over from this one keeps (`crate::upgrade`).
    pub fn node_admin_states(&self) -> Vec<(String, AdminState)> {
        self.nodes
            .iter()
            .map(|n| (n.name.clone(), n.rt.status().admin))
            .collect()
    }

    /// What each node has open here (connections, TCP sessions and tunnels, and what a
    /// limpet this one took over from still had) and when a session was last seen on it, to
    /// carry to a new limpet (`crate::upgrade`): it drains on here after the handover.
    pub fn node_seen(&self) -> Vec<crate::upgrade::NodeSeen> {
        let now = crate::clock::now_ms();
        self.nodes
            .iter()
            .map(|n| {
                let (_, ago) = n.rt.seen_stats();
                crate::upgrade::NodeSeen {
                    node: n.name.clone(),
                    open: n.rt.open_to_drain(),
                    last_seen_ms: ago.map(|a| {
                        now.saturating_sub(u64::try_from(a.as_millis()).unwrap_or(u64::MAX))
                    }),
                }
            })
            .collect()
    }

    /// Takes what the limpet taken over from had of a node ([`Self::node_seen`] there).
    pub fn take_node_seen(&self, carried: &crate::upgrade::NodeSeen) {
        if let Some(rt) = self.node_id(&carried.node).and_then(|id| self.node_rt(id)) {
            rt.handed(carried.open, carried.last_seen_ms);
        }
    }

    /// Each node's health, to carry to a new limpet (`crate::upgrade`): its checks named by
    /// what they ask, as `checks` (the running set) knows them.
    pub fn node_health(&self) -> Vec<crate::upgrade::NodeHealth> {
        let checks = lock(&self.lifecycle.checks);
        self.nodes
            .iter()
            .map(|n| {
                let slots = checks.slots_of(&n.name);
                let (health, since_ms) = n.rt.carry(|slot| {
                    slots
                        .iter()
                        .find(|(_, s)| *s == slot)
                        .map(|(label, _)| label.clone())
                });
                crate::upgrade::NodeHealth {
                    node: n.name.clone(),
                    health,
                    since_ms,
                    address: Some(n.addr),
                }
            })
            .collect()
    }

    /// Takes a node's health from the limpet this one took over from: a node it had DOWN is
    /// DOWN here, each of its checks' counts in the slot this process gave the check that asks
    /// the same (a check this config does not have is left out, as a reload forgets it).
    /// Unknown nodes are ignored, and so is the health of a node this config gives another
    /// address (as a reload starts such a node's health anew: [`NodeRuntime::readdress`]).
    pub fn take_node_health(&self, carried: &crate::upgrade::NodeHealth) {
        let Some(slot) = self
            .node_id(&carried.node)
            .and_then(|id| self.nodes.get(id.index()))
        else {
            return;
        };
        if carried.address.is_some_and(|a| a != slot.addr) {
            tracing::info!(
                node = %carried.node,
                "upgrade: the node's address changed; its health starts anew here"
            );
            return;
        }
        let rt = &slot.rt;
        let slots = lock(&self.lifecycle.checks).slots_of(&carried.node);
        let health = limpet_core::Health::carried(&carried.health, |label: &String| {
            slots.iter().find(|(l, _)| l == label).map(|(_, s)| *s)
        });
        rt.take_carried(health, carried.since_ms);
    }

    /// Every node with its state, open connections and pins per table.
    pub fn node_views(&self) -> Vec<NodeView> {
        self.node_views_counting(true)
    }

    /// [`State::node_views`], with the pins per table counted only when `pins` says (the
    /// tables kept a count per node as entries change, read under each table's lock: what
    /// needs only the nodes' states takes no table's lock).
    pub fn node_views_counting(&self, pins: bool) -> Vec<NodeView> {
        let now = crate::clock::now_ms();
        use limpet_core::table::AffinityStore as _;
        let counted = pins;
        let mut pins: Vec<BTreeMap<String, u64>> = vec![BTreeMap::new(); self.nodes.len()];
        for (name, table) in self.tables.iter().filter(|_| counted) {
            // The count walks the expired entries not yet purged (`AffinityStore::pins`),
            // which the tables' upkeep purges every second (`table_upkeep`).
            let g = table.lock();
            for (node, n) in g.store().pins(now) {
                if let Some(m) = table.node_of(node).and_then(|id| pins.get_mut(id.index())) {
                    m.insert(name.clone(), n);
                }
            }
        }
        self.nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let id = NodeId(i as u32);
                let status = n.rt.status();
                NodeView {
                    name: n.name.clone(),
                    addr: n.addr,
                    state: status.state(),
                    status,
                    weight: self.topology.weight(id),
                    active: n.rt.active(),
                    pins: pins.get(i).cloned().unwrap_or_default(),
                }
            })
            .collect()
    }

    /// Connections open to `node` now, across every generation of this process.
    pub fn active(&self, node: NodeId) -> u32 {
        self.node_rt(node).map_or(0, |rt| rt.active())
    }

    /// Counts a connection to `node` as open until the guard drops (least-connections,
    /// admin views, drain completion).
    pub fn open(&self, node: NodeId) -> Option<ConnGuard> {
        self.node_rt(node).map(NodeRuntime::open)
    }

    /// The address `listener` connects to for `node`, for a client that connected to
    /// `local_port` on limpet (which `node_port = "same"` forwards to).
    pub fn upstream(&self, def: &ListenerDef, node: NodeId, local_port: u16) -> Option<SocketAddr> {
        def.upstreams.get(node.index(), local_port)
    }
}

/// The node the session would be sent to once it is back: the shared table's entry where
/// routing writes the table (the fleet's truth wins over the cookie), else the cookie's, else
/// the table's.
fn own_node(input: &RouteInput<'_>) -> Option<NodeId> {
    let node_of = |p: limpet_core::Pin| match p {
        limpet_core::Pin::Node(n) => Some(n),
        _ => None,
    };
    let table = input
        .table
        .and_then(|t| node_of(t.pin).map(|n| (n, t.writes)));
    match table {
        Some((n, true)) => Some(n),
        _ => input
            .cookie
            .and_then(|c| node_of(c.pin))
            .or(table.map(|(n, _)| n)),
    }
}

/// A node whose trial a session waits for rather than move: READY (MAINT and a drain move
/// sessions whatever the trial says), DOWN with a trial in flight at `now`, and not one
/// that left requests unanswered (its trial most likely waits out its answer timeout too,
/// and every session coming meanwhile would wait for nothing).
fn worth_awaiting(s: &NodeStatus, now: u64) -> bool {
    s.admin == AdminState::Ready && s.health.trial_in_flight(now) && !s.health.awaits_an_answer()
}

/// What [`State::route_or_await`] found.
enum Routed {
    /// The route, and the trial's claim when it is one.
    Go(Route, Option<TrialClaim>),
    /// The session's own node's trial is another request's: a watch of the node's status.
    AwaitTrial(tokio::sync::watch::Receiver<u64>),
}

/// The longest a request or session waits for the outcome of another's trial of its own node
/// before it is routed elsewhere ([`State::route_first`]): a refused connect decides a trial
/// in milliseconds, an answer in about what the node takes to answer; a node that hangs is
/// not waited on for long.
pub const TRIAL_AWAIT: Duration = Duration::from_secs(1);

/// How long a DOWN node's trial may be due with no request to make it before limpet makes it
/// with a connect of its own ([`State::try_due_trial`]).
pub const TRIAL_BY_CONNECT_AFTER: Duration = Duration::from_secs(1);

/// The numbers of [`State::generation`]: one per state built in the process.
static GENERATIONS: AtomicU32 = AtomicU32::new(0);

/// The running limpet: the current [`State`], swapped whole on reload.
#[derive(Debug)]
pub struct Runtime {
    state: ArcSwap<State>,
    /// The current state's [`State::generation`], readable without touching the state.
    generation: AtomicU32,
    /// Moves at each reload: long-lived sessions re-read their listener's settings.
    reloads: tokio::sync::watch::Sender<u32>,
    /// Turns true when a shutdown must not wait for its drain any longer (a second signal):
    /// TCP listeners cut their open sessions at once, as at the drain's end.
    cut_now: tokio::sync::watch::Sender<bool>,
    /// True while a new limpet's handover is pending ([`Self::hold_drain`]): the listeners
    /// that stopped accepting for it go on serving what they have, and drain only once it
    /// took over or this limpet stops.
    drain_held: tokio::sync::watch::Sender<bool>,
}

impl Runtime {
    pub fn new(state: State) -> Arc<Runtime> {
        Arc::new(Runtime {
            generation: AtomicU32::new(state.generation),
            reloads: tokio::sync::watch::Sender::new(state.generation),
            cut_now: tokio::sync::watch::Sender::new(false),
            drain_held: tokio::sync::watch::Sender::new(false),
            state: ArcSwap::from_pointee(state),
        })
    }

    /// Holds (`true`) or lets go (`false`) the drain of the listeners that stop accepting
    /// ([`Self::drain_allowed`]). An upgrade holds it from before this limpet stops
    /// accepting until the new one took over (or this one stops): a new limpet that dies or
    /// hangs before it takes over leaves this one serving again (`Running::resume`) with its
    /// kept-alive connections, tunnels and TCP sessions as they were. Before, they drained
    /// from the moment it stopped accepting: WebSockets closed with 1001, TCP sessions cut
    /// at the drain's end, though nothing was handed over.
    pub(crate) fn hold_drain(&self, held: bool) {
        self.drain_held.send_replace(held);
    }

    /// Resolves once a listener that stopped accepting may drain: at once, unless an
    /// upgrade holds the drain ([`Self::hold_drain`]).
    pub(crate) async fn drain_allowed(&self) {
        let mut rx = self.drain_held.subscribe();
        let _ = rx.wait_for(|held| !*held).await;
    }

    /// Ends the drain of a shutdown now: open TCP sessions are cut (reset, so that a node
    /// mid-upload sees the transfer aborted, not a stream that ended whole).
    pub fn cut_now(&self) {
        self.cut_now.send_replace(true);
    }

    /// Resolves once [`Self::cut_now`] was called.
    pub async fn cut_requested(&self) {
        let mut rx = self.cut_now.subscribe();
        if rx.wait_for(|cut| *cut).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Changes at each reload (the new generation).
    pub fn reloads(&self) -> tokio::sync::watch::Receiver<u32> {
        self.reloads.subscribe()
    }

    /// The current state. Hold the `Arc` for one connection or one request, not longer.
    pub fn state(&self) -> Arc<State> {
        self.state.load_full()
    }

    /// The current state's generation: what a connection compares with its own state's
    /// on each request, one atomic load, to learn that a reload happened.
    pub fn generation(&self) -> u32 {
        self.generation.load(Ordering::Acquire)
    }

    /// Listener `def`'s settings and the address of `node` (a node of `since`, the
    /// generation a session routed in) as the running config has them: a reload while the
    /// session waited in the node's queue may have moved the node, or changed how the
    /// listener reaches nodes (TLS, PROXY header, connect timeout). The node and the
    /// listener are found by name; `None` when the reload removed the node.
    pub fn upstream_now(
        &self,
        since: &State,
        def: &Arc<ListenerDef>,
        node: NodeId,
        local_port: u16,
    ) -> Option<(Arc<ListenerDef>, SocketAddr, Option<SeenIn>)> {
        if since.generation() == self.generation() {
            let addr = since.upstream(def, node, local_port)?;
            return Some((Arc::clone(def), addr, None));
        }
        let now = self.state();
        let id = now.node_id(since.node_name(node))?;
        // Listeners are never removed by a reload (one that tries is refused).
        let def = now
            .listeners
            .iter()
            .map(|l| l.def.load_full())
            .find(|l| l.name == def.name)
            .unwrap_or_else(|| Arc::clone(def));
        let addr = now.upstream(&def, id, local_port)?;
        Some((def, addr, Some(SeenIn::new(now, id))))
    }

    /// Installs a state built by [`State::rebuild`]. Listeners are bound once at start, so a
    /// reload that adds or moves bind addresses needs a restart (the caller checks).
    pub fn swap(&self, next: State) {
        let generation = next.generation;
        self.state.store(Arc::new(next));
        // After the store: whoever sees the new number finds the new state.
        self.generation.store(generation, Ordering::Release);
        self.reloads.send_replace(generation);
    }
}

/// The generation (and the node's id in it) whose address a connection used, when not the
/// connection's own ([`Runtime::upstream_now`]: a session that waited in a node's queue
/// across a reload connects where the running config has the node): what the connection
/// sees of the node is observed there, at the address it went to, not in its own
/// generation, whose address for a node the reload moved no longer counts
/// ([`crate::nodes::NodeRuntime::observe_at_address`]).
#[derive(Debug, Clone)]
pub struct SeenIn {
    state: Arc<State>,
    node: NodeId,
}

impl SeenIn {
    /// `node` of `state` (the running generation a connection went to).
    pub fn new(state: Arc<State>, node: NodeId) -> SeenIn {
        SeenIn { state, node }
    }

    /// Observes `obs` of `node` of `own` where the connection saw it: in `seen`'s
    /// generation when it has one, else in `own`.
    pub fn observe(seen: Option<&SeenIn>, own: &State, node: NodeId, obs: Observation) {
        SeenIn::observe_at(seen, own, node, obs, crate::clock::now_ms());
    }

    /// [`SeenIn::observe`] at `now_ms`, a reading the caller took.
    pub fn observe_at(
        seen: Option<&SeenIn>,
        own: &State,
        node: NodeId,
        obs: Observation,
        now_ms: u64,
    ) {
        match seen {
            Some(s) => {
                s.state.observe_at(s.node, obs, now_ms);
            }
            None => {
                own.observe_at(node, obs, now_ms);
            }
        }
    }
}

/// A listener's `close_on_node_down` as the running config has it: read again by a tunnel
/// or TCP session opened earlier each time its node changes and at each reload
/// ([`crate::nodes::NodeRuntime::session_end`]), so that a reload changing the setting
/// reaches the sessions already open.
#[derive(Debug, Clone)]
pub struct CloseOnDown {
    runtime: Arc<Runtime>,
    listener: String,
    /// The setting when the session opened: kept if the listener is ever missing.
    opened_with: bool,
}

impl CloseOnDown {
    /// The setting of `listener`, as `opened_with` now and as the running config later.
    pub fn new(runtime: Arc<Runtime>, listener: &str, opened_with: bool) -> CloseOnDown {
        CloseOnDown {
            runtime,
            listener: listener.to_owned(),
            opened_with,
        }
    }

    /// The setting now.
    pub fn now(&self) -> bool {
        let state = self.runtime.state.load();
        state
            .listeners
            .iter()
            .map(|l| l.def.load())
            .find(|d| d.name == self.listener)
            .map_or(self.opened_with, |d| d.tcp.close_on_node_down)
    }

    /// What moves at each reload.
    pub fn reloads(&self) -> tokio::sync::watch::Receiver<u32> {
        self.runtime.reloads()
    }
}

/// The main tokio runtime of `limpet run` and `limpet proxy`: one current-thread runtime.
/// With `--threads 1` it serves the listeners too; with more, it keeps the control side
/// (signals, reloads, admin, health checks, store, timers) and the listeners are served by
/// [`workers`], one current-thread runtime per thread. No work-stealing runtime anywhere:
/// its cross-thread wake-ups cost a proxy more than they give (see bench/README.md).
pub fn tokio_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// The connection permits of listener `name` (its `max_connections`), one set for all the
/// sockets that serve it, kept by the node lifecycle so that a reload changes the limit
/// (`Lifecycle::apply_conn_limits`).
pub fn listener_permits(runtime: &Runtime, name: &str) -> Arc<crate::net::ConnLimit> {
    let state = runtime.state();
    let max = state
        .listeners
        .iter()
        .find(|l| l.def.load().name == name)
        .map_or(10_000, |l| l.def.load().limits.max_client_connections);
    state.lifecycle.conn_limit(name, max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use limpet_core::table::IpPrefix;

    /// An IPv4 client has one spread key whether it came through an IPv4 socket or, mapped,
    /// through a dual-stack one (before, two: a drain moved it at two moments), with a
    /// cookie's issue time or without; other clients have other keys.
    #[test]
    fn an_ipv4_client_has_one_spread_key_through_any_socket() {
        let v4: IpAddr = "10.1.2.3".parse().expect("ip");
        let mapped: IpAddr = "::ffff:10.1.2.3".parse().expect("ip");
        for issued in [None, Some(1_700_000_000_000)] {
            assert_eq!(spread_of(None, v4, issued), spread_of(None, mapped, issued));
            let other: IpAddr = "10.1.2.4".parse().expect("ip");
            assert_ne!(spread_of(None, v4, issued), spread_of(None, other, issued));
        }
    }

    /// A re-pin message of a key that a first request here is reading (no local entry for
    /// the message to move) has the key read once more, after the message: the store's newer
    /// pin is the one put in the table, not the read's older answer; a key moved during that
    /// read too is left to the route. Before, the older answer went into the table and held
    /// the key on the older node until its expiry refresh, the fleet on the newer.
    #[test]
    fn a_re_pin_that_comes_while_a_key_is_read_has_it_read_again() {
        use limpet_core::table::AffinityStore as _;
        let (rt, store) = crate::test_util::offline_store();
        let topology = Topology::with_weights([("y", 1), ("z", 1)]).expect("nodes");
        let def = crate::config::TableDef {
            name: "t".into(),
            key: limpet_core::table::KeySpec::SourceIp(IpPrefix::HOST),
            expire: Duration::from_secs(600),
            size: 10,
            snapshot: None,
            shared: true,
        };
        let table = Table::new(def, &topology, Some(&store)).expect("table");
        table.register();
        let key = limpet_core::table::KeyRef::v4(std::net::Ipv4Addr::new(192, 0, 2, 10));
        let message = crate::store::repin_message("t", "z", key);
        // The store's reads: the first answers y, and another instance's re-pin to z comes
        // (as the subscriber hands it to `apply`) before that answer is taken; the next
        // answer z.
        let reads = std::cell::Cell::new(0);
        let read = |moved_during: &'static [bool]| {
            reads.set(0);
            let (store, message, reads) = (&store, &message, &reads);
            move || {
                let n = reads.get();
                reads.set(n + 1);
                if moved_during.get(n).copied().unwrap_or(false) {
                    store.apply(message);
                }
                std::future::ready(Some(if n == 0 { "y" } else { "z" }.to_owned()))
            }
        };
        let pinned = || {
            let t = table.lock();
            let s = t.store();
            s.peek(key, crate::clock::now_ms())
                .and_then(|r| s.node_name(r).map(str::to_owned))
        };
        rt.block_on(table.prefetch_with(key, read(&[true])));
        assert_eq!(
            pinned().as_deref(),
            Some("z"),
            "read again after the message"
        );
        assert_eq!(reads.get(), 2);
        table.lock().store_mut().clear();
        rt.block_on(table.prefetch_with(key, read(&[])));
        assert_eq!(pinned().as_deref(), Some("y"), "no message: one read");
        assert_eq!(reads.get(), 1);
        table.lock().store_mut().clear();
        rt.block_on(table.prefetch_with(key, read(&[true, true])));
        assert_eq!(pinned(), None, "moved during both reads: left to the route");
    }

    /// A state of nodes named `nodes`, in that order.
    fn state_of(nodes: &[&str]) -> State {
        state_with(nodes, |_| {})
    }

    /// [`state_of`], its config changed by `edit`.
    fn state_with(nodes: &[&str], edit: impl FnOnce(&mut crate::proxy::ProxyConfig)) -> State {
        let mut cfg = crate::proxy::ProxyConfig::new(
            (2u8..)
                .zip(nodes)
                .map(|(i, n)| crate::proxy::NodeConfig {
                    name: (*n).to_owned(),
                    addr: SocketAddr::from(([127, 0, 0, i], 8080)),
                })
                .collect(),
        );
        edit(&mut cfg);
        let config = cfg
            .to_config(SocketAddr::from(([127, 0, 0, 1], 0)))
            .expect("config");
        State::new(config).expect("state")
    }

    /// The last two nodes, each one slow answer short of `max_slow_answers`, get their last
    /// one at the same moment on two threads: one goes DOWN, never both (each judged on the
    /// other's status then, not on a snapshot read before the other's went DOWN).
    #[test]
    fn the_last_two_nodes_slow_at_once_never_both_go_down() {
        let state = Arc::new(state_with(&["a", "b"], |cfg| {
            cfg.health.max_slow_answers = 2;
        }));
        let ids = [
            state.node_id("a").expect("a"),
            state.node_id("b").expect("b"),
        ];
        let mut one_down = 0;
        for round in 0..300 {
            for n in ["a", "b"] {
                state.force_health(n, true);
            }
            for id in ids {
                assert_eq!(state.observe(id, Observation::SlowAnswer), None);
            }
            let start = Arc::new(std::sync::Barrier::new(2));
            let threads = ids.map(|id| {
                let (state, start) = (Arc::clone(&state), Arc::clone(&start));
                std::thread::spawn(move || {
                    start.wait();
                    state.observe(id, Observation::SlowAnswer)
                })
            });
            let downs = threads
                .into_iter()
                .map(|t| t.join().expect("thread"))
                .filter(|t| *t == Some(Transition::WentDown))
                .count();
            assert!(downs <= 1, "round {round}: both went DOWN");
            one_down += downs;
        }
        assert_eq!(one_down, 300, "one of the two goes DOWN each round");
    }

    /// A connection's pin is read only by routes of the generation that set it (node ids are
    /// a generation's), and a connection moving to a newer one carries it over by name.
    #[test]
    fn a_connection_pin_is_read_in_its_generation_and_carried_over_by_name() {
        let old = state_of(&["a", "b"]);
        let renumbered = state_of(&["c", "b", "a"]);
        assert_ne!(old.generation(), renumbered.generation());
        let a_old = old.node_id("a").expect("a");
        let pin = ConnPin::new();
        pin.set(old.generation(), a_old);
        assert_eq!(pin.get(old.generation()), Some(a_old));
        assert_eq!(
            pin.get(renumbered.generation()),
            None,
            "another generation's ids"
        );
        pin.carry(&old, &renumbered);
        assert_eq!(pin.get(renumbered.generation()), renumbered.node_id("a"));
        // A request still routing over the older generation leaves the newer pin alone.
        let (seen, none) = pin.read(old.generation());
        assert_eq!(none, None);
        assert!(ConnPin::newer(seen, old.generation()));
        assert!(!ConnPin::newer(seen, renumbered.generation()));
        assert_ne!(renumbered.node_id("a"), Some(a_old), "a was renumbered");
        // A pin to a node the next generation does not have is dropped.
        let without_a = state_of(&["b", "c"]);
        pin.carry(&renumbered, &without_a);
        assert_eq!(pin.get(without_a.generation()), None);
        assert_eq!(pin.get(renumbered.generation()), None);
    }

    /// The spread key is the core's hash of the address octets as they always were (4 bytes
    /// for IPv4, 16 for IPv6), so sessions placed before stay placed alike.
    #[test]
    fn spread_of_hashes_the_octets_of_each_address_family() {
        let v4: IpAddr = "192.0.2.7".parse().expect("v4");
        let v6: IpAddr = "2001:db8::7".parse().expect("v6");
        let v6_octets = match v6 {
            IpAddr::V6(a) => a.octets(),
            IpAddr::V4(_) => unreachable!("v6"),
        };
        assert_eq!(
            spread_of(None, v4, Some(42)),
            limpet_core::spread_key(None, &[192, 0, 2, 7], Some(42))
        );
        assert_eq!(
            spread_of(None, v6, None),
            limpet_core::spread_key(None, &v6_octets, None)
        );
        assert_eq!(
            spread_of(Some(KeyRef::ip(v6, IpPrefix::HOST)), v4, None),
            limpet_core::spread_key(Some(&v6_octets), &[192, 0, 2, 7], None)
        );
    }

    /// A key long enough to be held as its digest spreads by the digest, whatever client
    /// presents it: one key, one session, as the fleet's re-pins (which name the key and
    /// no client) need.
    #[test]
    fn a_digest_key_spreads_alike_for_every_client() {
        let long = vec![b'k'; limpet_core::table::MAX_KEY_LEN + 1];
        let key = KeyRef::bytes(&long);
        let d = key.digest().expect("held as a digest");
        let (a, b): (IpAddr, IpAddr) = (
            "192.0.2.7".parse().expect("a"),
            "0.0.0.0".parse().expect("b"),
        );
        assert_eq!(
            spread_of(Some(key), a, Some(1)),
            spread_of(Some(key), b, None)
        );
        assert_eq!(
            spread_of(Some(KeyRef::from_digest(d)), b, None),
            limpet_core::spread_key(Some(&d), &[192, 0, 2, 7], None)
        );
    }
}
