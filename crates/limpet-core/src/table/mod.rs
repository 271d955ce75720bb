//! # Affinity tables: pins by key, shared by every listener that names the table
//!
//! A table (a *stick table* in HAProxy's words) maps a key read from a connection or request
//! (the client address, a header value, an application's session cookie) to a node. It is
//! how one client lands on one node across an HTTP port, an HTTPS port and a raw TCP port: all
//! three listeners look the key up in the same table. Like the rest of the core it does no
//! I/O: time is `now_ms`, the hash seed is an argument, snapshots are bytes.
//!
//! ## Data flow
//!
//! ```text
//!  client addr / header values ──KeySpec::request_key──► KeyRef (borrowed, no allocation)
//!                                                          │
//!            AffinityTable::lookup_in(binding, key, now) ▼
//!      AffinityStore::get ──► Option<NodeRef> ──Binding (by name)──► Pin::{None, Node, Unknown}
//!                                                          │
//!                     crate::route (as RouteInput::table) ▼
//!                      Route { node, outcome, table: Option<NodeId>, .. }
//!                                                          │
//!   route.table ──AffinityTable::learn_in(binding, key, node, now)──► AffinityStore::put
//!  node's Set-Cookie ──KeySpec::response_key──► learn (application-cookie tables)
//!  reload: new Topology ──AffinityTable::bind──► a Binding per generation; entries untouched
//!  timer:  AffinityStore::purge_expired(now, budget)   shutdown/interval: SnapshotPages
//! ```
//!
//! ## Pieces
//!
//! * [`key`]: [`KeyRef`]/[`TableKey`], [`IpPrefix`] masking, [`KeySpec`] and the pure
//!   application-cookie helpers.
//! * [`AffinityStore`]: the one interface every store implements; [`LruTable`] is the
//!   in-memory one (bounded, LRU eviction, idle expiry, ~50 bytes per IPv4 entry all in).
//! * [`NodeRef`]/[`NodeNames`]/[`Binding`]: entries store node *names* (interned), so pins
//!   survive a reload that renumbers or removes nodes.
//! * [`encode_snapshot`]/[`decode_snapshot`]: versioned, checksummed snapshot bytes;
//!   [`SnapshotPages`] reads a table for them a page of positions at a time (the binary
//!   locks a table shared with traffic only for a page), as [`LruTable::used_at`] does for
//!   a shared table's expiry refresh.
//!
//! ## Other stores
//!
//! The trait is synchronous and knows nothing of slabs, LRU lists or memory: a store maps keys
//! to node identities, expires them and pages through them. The shared store of fleet mode
//! (Redis or Valkey) is an I/O-layer part of the binary, not a core type: every instance keeps
//! its [`LruTable`] as the local cache that answers lookups, the binary queues each local write
//! for the remote asynchronously (by node name), and on a local miss awaits one bounded GET
//! before routing. See `docs/affinity-tables.md` and `docs/fleet.md`.

mod hash;
pub mod key;
mod lru;
mod nodes;
mod snapshot;

use std::fmt;

pub use key::{
    app_cookie_in_request, app_cookie_in_set_cookie, app_cookie_in_set_cookies, digest_from_hex,
    value_keys_shown_as, IpPrefix, KeyError, KeyKind, KeyRef, KeySpec, TableKey, MAX_KEY_LEN,
};
pub use lru::{
    LruTable, MemoryReport, RestoreReport, TableConfig, TableConfigError, MAKE_ROOM_WALK,
    MAX_EXPIRE_MS, MAX_SIZE,
};
pub use nodes::{Binding, NodeNames, NodeRef};
pub use snapshot::{
    decode_snapshot, encode_snapshot, snapshot_len, Snapshot, SnapshotEntry, SnapshotError,
    SnapshotPages, SNAPSHOT_PREFIX_LEN, SNAPSHOT_VERSION,
};

use crate::decision::{Decision, Pin};
use crate::node::NodeId;
use crate::topology::Topology;

/// What a [`put`](AffinityStore::put) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PutOutcome {
    /// The node the key was pinned to before (`None`: a new pin).
    pub previous: Option<NodeRef>,
    /// The store was full and dropped its least recently used live entry to make room.
    pub evicted: bool,
    /// False when the pin was not stored: the store was full of entries open sessions hold
    /// ([`LruTable::hold`]: every one, or the first [`MAKE_ROOM_WALK`] at its least recently
    /// used end). The key stays unpinned.
    pub stored: bool,
}

/// Counters for metrics. All but `len` and `size` only grow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TableStats {
    pub len: u64,
    pub size: u64,
    pub hits: u64,
    pub misses: u64,
    /// New pins.
    pub inserts: u64,
    /// Pins moved to another node (or re-put to the same one).
    pub updates: u64,
    /// Live entries dropped to make room.
    pub evictions: u64,
    /// Entries dropped for being idle `expire` or longer.
    pub expirations: u64,
    /// Entries removed on request.
    pub removals: u64,
    /// Puts of a key not in the table that were not stored, the table being full of entries
    /// open sessions hold: a new pin, or an open session putting back its own entry (each
    /// try counts).
    pub refused: u64,
}

/// One entry as the admin API shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryInfo {
    pub key: TableKey,
    pub node: NodeRef,
    /// Time since last use.
    pub idle_ms: u64,
}

/// The one interface of an affinity store: keys to node identities, with idle expiry. See
/// the module docs for how a remote store fits.
///
/// Node identities ([`NodeRef`]) belong to the store that interned them: resolve them with
/// [`node_name`](Self::node_name) or through an [`AffinityTable`].
pub trait AffinityStore: fmt::Debug {
    /// The identity of a node name in this store, added if new (`None` only when the store
    /// cannot hold more names).
    fn intern(&mut self, name: &str) -> Option<NodeRef>;

    /// The identity of `name` if this store holds it already (every node's any configuration
    /// of this process had, bound at each reload, and those its snapshots named), never
    /// adding one: for names from outside the process (another instance, through a shared
    /// store), which must not grow the name list. A name known but not in the current pool
    /// (a node a reload removed) resolves as unknown at routing and is re-pinned there.
    fn known(&self, name: &str) -> Option<NodeRef>;

    /// The name behind an identity of this store.
    fn node_name(&self, node: NodeRef) -> Option<&str>;

    /// The node pinned for `key`. A hit counts as a use: the idle time restarts.
    fn get(&mut self, key: KeyRef<'_>, now_ms: u64) -> Option<NodeRef>;

    /// Pins `key` to `node` (a use, as for `get`), replacing any pin it had.
    fn put(&mut self, key: KeyRef<'_>, node: NodeRef, now_ms: u64) -> PutOutcome;

    /// Drops the pin of `key`; returns the node it had, if live.
    fn remove(&mut self, key: KeyRef<'_>) -> Option<NodeRef>;

    /// Entries held (for a caching store: held locally). May count expired entries not yet
    /// purged.
    fn len(&self) -> usize;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every pin (node identities stay).
    fn clear(&mut self);

    /// Drops up to `budget` expired entries and returns how many it dropped: bounded work, to
    /// be called from a timer. (Lookups drop expired entries they meet in any case.)
    fn purge_expired(&mut self, now_ms: u64, budget: usize) -> usize;

    /// Page `page` (from 0) of `page_size` entries, for the admin API. Live entries only.
    fn entries(&self, page: usize, page_size: usize, now_ms: u64) -> Vec<EntryInfo>;

    /// Live pins per node identity at `now_ms` (identities with none left out), for the
    /// admin API's node view and metrics, without a walk of the entries.
    fn pins(&self, now_ms: u64) -> Vec<(NodeRef, u64)>;

    fn stats(&self) -> TableStats;
}

/// A store bound to a topology: lookups answer with a [`Pin`] for [`crate::route()`] (or
/// [`Pool::decide`](crate::Pool::decide)), and pins are recorded by [`NodeId`]. Holders that
/// route over several topologies at once (generations around a reload) keep a [`Binding`]
/// each ([`bind`](Self::bind)) and use the `_in` methods.
#[derive(Debug)]
pub struct AffinityTable<S: AffinityStore = LruTable> {
    store: S,
    binding: Binding,
}

impl<S: AffinityStore> AffinityTable<S> {
    pub fn new(store: S, pool: &Topology) -> Self {
        let mut t = AffinityTable {
            store,
            binding: Binding::default(),
        };
        t.rebind(pool);
        t
    }

    /// Binds to a rebuilt pool (after a config reload). Entries are untouched: a pin to a node
    /// the new pool still has (by name) keeps working, one to a removed node reads as
    /// [`Pin::Unknown`].
    pub fn rebind(&mut self, pool: &Topology) {
        let store = &mut self.store;
        self.binding = Binding::new(pool, |name| store.intern(name));
    }

    /// The pin for `key`: [`Pin::None`] when the table has none, [`Pin::Unknown`] when it
    /// names a node the pool no longer has. A hit refreshes the entry.
    pub fn lookup(&mut self, key: KeyRef<'_>, now_ms: u64) -> Pin {
        lookup_in(&mut self.store, &self.binding, key, now_ms)
    }

    /// Pins `key` to `node` of the bound pool. `None` (nothing stored) for an id that is not
    /// from the bound pool.
    pub fn learn(&mut self, key: KeyRef<'_>, node: NodeId, now_ms: u64) -> Option<PutOutcome> {
        learn_in(&mut self.store, &self.binding, key, node, now_ms)
    }

    /// A binding of this table's entries to `pool`, without changing the table's own: for a
    /// holder that keeps routing over an older pool while the table is shared with a newer
    /// one (connections opened before a reload). Names are interned, so the binding stays
    /// valid for the life of the store.
    pub fn bind(&mut self, pool: &Topology) -> Binding {
        let store = &mut self.store;
        Binding::new(pool, |name| store.intern(name))
    }

    /// [`lookup`](Self::lookup) through `binding` (from [`bind`](Self::bind)) instead of the
    /// table's own.
    pub fn lookup_in(&mut self, binding: &Binding, key: KeyRef<'_>, now_ms: u64) -> Pin {
        lookup_in(&mut self.store, binding, key, now_ms)
    }

    /// [`learn`](Self::learn) through `binding` (from [`bind`](Self::bind)).
    pub fn learn_in(
        &mut self,
        binding: &Binding,
        key: KeyRef<'_>,
        node: NodeId,
        now_ms: u64,
    ) -> Option<PutOutcome> {
        learn_in(&mut self.store, binding, key, node, now_ms)
    }

    /// Records what `decide` chose for a request keyed `key`: a fresh assignment becomes the
    /// key's pin; a sticky hit was already refreshed by the lookup. (Application-cookie
    /// tables learn from the response instead, with [`learn`](Self::learn).)
    pub fn record(&mut self, key: KeyRef<'_>, decision: Decision, now_ms: u64) {
        if let Decision::Fresh { node, .. } = decision {
            self.learn(key, node, now_ms);
        }
    }

    /// Drops the pin of `key`; true if it had a live one.
    pub fn forget(&mut self, key: KeyRef<'_>) -> bool {
        self.store.remove(key).is_some()
    }

    /// The bound pool's node for a stored identity (e.g. for [`EntryInfo::node`]).
    pub fn node_of(&self, r: NodeRef) -> Option<NodeId> {
        self.binding.node(r)
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    pub fn store_mut(&mut self) -> &mut S {
        &mut self.store
    }

    pub fn into_store(self) -> S {
        self.store
    }
}

fn lookup_in<S: AffinityStore>(store: &mut S, b: &Binding, key: KeyRef<'_>, now_ms: u64) -> Pin {
    match store.get(key, now_ms) {
        None => Pin::None,
        Some(r) => b.node(r).map_or(Pin::Unknown, Pin::Node),
    }
}

fn learn_in<S: AffinityStore>(
    store: &mut S,
    b: &Binding,
    key: KeyRef<'_>,
    node: NodeId,
    now_ms: u64,
) -> Option<PutOutcome> {
    let r = b.node_ref(node)?;
    Some(store.put(key, r, now_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_can_be_shared_between_threads() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<LruTable>();
        send_sync::<AffinityTable<LruTable>>();
    }

    #[test]
    fn the_trait_is_object_safe() {
        let t = LruTable::new(TableConfig::new(4, 1000)).expect("valid");
        let b: Box<dyn AffinityStore> = Box::new(t);
        assert!(b.is_empty());
    }
}
