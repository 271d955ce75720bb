//! The in-memory store: a bounded LRU table with idle expiry.
//!
//! ## Layout
//!
//! ```text
//!   index: HashTable<u32>  ──hash(key)──►  slot holding a slab index
//!                                              │
//!   slab:  Vec<Entry>  [ e0 | e1 | e2 | ... ]  ◄┘   dense: entries 0..len, no holes
//!                         ▲ prev/next (u32) form the LRU list: head = most recent, tail = least
//! ```
//!
//! An [`Entry`] is 40 bytes: the key (24: a `u32`, 16 octets or a boxed value, and the tag),
//! the node identity, the last-use stamp, and the two list links (4 each). The index adds about
//! 5 bytes per bucket (a `u32` and a control byte) at a load of 44-87%. A removal moves the
//! last slab entry into the hole (`swap_remove`) and repoints its index slot and neighbours, so
//! the slab never has holes and needs no free list.
//!
//! ## Time
//!
//! Stamps are `u32` milliseconds since `base_ms`, not `u64` epoch milliseconds: 4 bytes per
//! entry less. The table's clock is the largest `now_ms` it was given (a clock that steps back
//! reads as "no time passed"), so stamps only grow and the list, from head to tail, is in
//! stamp order: the expired entries are exactly a run at the tail, which is what makes
//! [`purge_expired`](LruTable::purge_expired) bounded work. When the clock is about to run
//! past the stamp range (at least every 2^32 - expire ms, i.e. 24.8 days or more), `rebase`
//! drops every expired entry and shifts the others' stamps: O(len) once in that period.
//! That is why `expire` is capped at [`MAX_EXPIRE_MS`] (2^31 - 1 ms, the same cap HAProxy's
//! 32-bit ticks put on a stick table's `expire`).
//!
//! ## Entries open sessions hold
//!
//! A TCP session or a tunnel open on an entry's node [`hold`](LruTable::hold)s its key until it
//! ends ([`release`](LruTable::release)). Such an entry is in use: room for a new key is never
//! made by dropping it. Met at the least recently used end, it is marked used now and moves
//! to the front, and the next entry goes instead (at most [`MAKE_ROOM_WALK`] are passed over
//! per put: bounded work under the lock); when every entry is held, or the walk's bound
//! passed, the new key is not stored ([`PutOutcome::stored`], counted in `refused`) and its
//! session is served unpinned.
//! HAProxy never drops a stick-table entry a session references either. A held entry still
//! expires when idle `expire` (the session's holder marks it used every half `expire`), and an
//! explicit removal or a reload's smaller `size` with nothing else to drop still takes it.
//! Holds are kept by key in a side table (`held`), so an [`Entry`] stays 40 bytes; the count of
//! entries whose key is held (`held_entries`) makes "every entry is held" an O(1) answer.

use std::fmt;

use hashbrown::HashTable;

use super::hash::KeyHasher;
use super::key::{KeyRef, TableKey};
use super::nodes::{NodeNames, NodeRef};
use super::snapshot::Snapshot;
use super::{AffinityStore, EntryInfo, PutOutcome, TableStats};

/// "No entry" in the list links.
const NIL: u32 = u32::MAX;

/// Largest `size` a table accepts. Indices are `u32` (with `u32::MAX` as the list's nil); the
/// cap leaves headroom and is far past what one process can hold (2^31 entries ≈ 100 GiB).
pub const MAX_SIZE: u32 = 1 << 31;

/// Longest `expire` a table accepts: 2^31 - 1 ms, about 24.8 days (see the module docs).
pub const MAX_EXPIRE_MS: u64 = (1 << 31) - 1;

/// The most held entries a put into a full table passes over looking for one to drop
/// (a put of a new key, [`AffinityStore::put`]); past it the new key is not stored.
pub const MAKE_ROOM_WALK: usize = 16;

/// Up to this many entries the debug invariant check walks the whole table after every
/// mutation; past it only O(1) checks run, so debug builds stay usable on big tables.
const FULL_CHECK_MAX: usize = 1024;

/// What an in-memory table is: its bound, its idle time and its hash seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableConfig {
    /// Most entries held; inserting into a full table evicts the least recently used.
    pub size: u32,
    /// An entry idle this long (no lookup hit, no put) is gone.
    pub expire_ms: u64,
    /// Keys the index hash. Randomise it once at start in the proxy (keys come from the
    /// network); a fixed one is fine for tests and `limpet sim`. It never affects placement.
    pub hash_seed: [u64; 2],
}

impl TableConfig {
    /// A table config with a zero hash seed (set one with
    /// [`with_hash_seed`](Self::with_hash_seed) for a table that faces the network).
    pub fn new(size: u32, expire_ms: u64) -> Self {
        TableConfig {
            size,
            expire_ms,
            hash_seed: [0, 0],
        }
    }

    pub fn with_hash_seed(mut self, seed: [u64; 2]) -> Self {
        self.hash_seed = seed;
        self
    }

    pub fn validate(&self) -> Result<(), TableConfigError> {
        match (self.size, self.expire_ms) {
            (0, _) => Err(TableConfigError::ZeroSize),
            (s, _) if s > MAX_SIZE => Err(TableConfigError::SizeTooLarge(s)),
            (_, 0) => Err(TableConfigError::ZeroExpire),
            (_, e) if e > MAX_EXPIRE_MS => Err(TableConfigError::ExpireTooLong(e)),
            _ => Ok(()),
        }
    }
}

/// Why a [`TableConfig`] is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TableConfigError {
    ZeroSize,
    SizeTooLarge(u32),
    ZeroExpire,
    ExpireTooLong(u64),
}

impl fmt::Display for TableConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TableConfigError::ZeroSize => f.write_str("table size must be at least 1"),
            TableConfigError::SizeTooLarge(s) => {
                write!(f, "table size {s} is over the maximum {MAX_SIZE}")
            }
            TableConfigError::ZeroExpire => f.write_str("table expire must be at least 1 ms"),
            TableConfigError::ExpireTooLong(e) => write!(
                f,
                "table expire {e} ms is over the maximum {MAX_EXPIRE_MS} ms (24.8 days)"
            ),
        }
    }
}

impl std::error::Error for TableConfigError {}

/// One pin. See the module docs for the layout.
#[derive(Debug)]
pub(crate) struct Entry {
    key: TableKey,
    node: NodeRef,
    /// Last use, in ms since the table's `base_ms`.
    stamp: u32,
    prev: u32,
    next: u32,
}

/// What a table's memory is made of, for the README figure and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryReport {
    pub entries: usize,
    /// `size_of` one slab entry.
    pub entry_size: usize,
    /// Slab capacity × entry size.
    pub slab_bytes: usize,
    /// The hash index's allocation.
    pub index_bytes: usize,
    /// Heap held by header and cookie keys (their values).
    pub key_bytes: usize,
    /// The interned node names.
    pub names_bytes: usize,
}

impl MemoryReport {
    pub fn total(&self) -> usize {
        self.slab_bytes + self.index_bytes + self.key_bytes + self.names_bytes
    }

    /// Total bytes divided by the entries held (0 for an empty table).
    pub fn per_entry(&self) -> f64 {
        if self.entries == 0 {
            0.0
        } else {
            self.total() as f64 / self.entries as f64
        }
    }
}

/// What [`LruTable::restore`] did with a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RestoreReport {
    /// Entries now in the table.
    pub loaded: usize,
    /// Entries that had expired by `now_ms`.
    pub expired: usize,
    /// The oldest entries beyond the table's size.
    pub over_size: usize,
    /// Entries naming a node that could not be interned (only past 2^32 - 1 names).
    pub skipped: usize,
}

/// A key open sessions hold, and how many.
#[derive(Debug)]
struct Holder {
    key: TableKey,
    count: u32,
}

/// The in-memory affinity store. See the module docs.
pub struct LruTable {
    slab: Vec<Entry>,
    index: HashTable<u32>,
    /// Most recently used.
    head: u32,
    /// Least recently used: the next to evict.
    tail: u32,
    size: u32,
    expire_ms: u64,
    base_ms: u64,
    clock_ms: u64,
    hasher: KeyHasher,
    names: NodeNames,
    key_heap: usize,
    stats: TableStats,
    /// Keys open sessions hold (module docs), present in the table or not.
    held: HashTable<Holder>,
    /// Entries in the slab whose key is in `held`.
    held_entries: usize,
    /// Entries in the slab per node identity (by [`NodeRef::index`]), kept as entries come,
    /// move and go, so the pins per node are O(nodes) to read ([`AffinityStore::pins`]): a
    /// count that walked the slab held each page's lock and the admin's thread for tens of
    /// milliseconds per million entries, at every read of the admin API.
    per_node: Vec<u32>,
}

impl fmt::Debug for LruTable {
    // Not derived: a derived Debug would print every entry of a million-entry table.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LruTable")
            .field("len", &self.slab.len())
            .field("size", &self.size)
            .field("expire_ms", &self.expire_ms)
            .field("nodes", &self.names.len())
            .field("held", &self.held.len())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl LruTable {
    /// Lets every entry go and gives their memory back, where [`AffinityStore::clear`] keeps
    /// it for the entries to come: for a table no one will fill again (one a reload
    /// replaced, which only connections of the generation before it still reach). The keys
    /// open sessions hold stay held, as a clear keeps them.
    pub fn let_go(&mut self) {
        AffinityStore::clear(self);
        self.slab = Vec::new();
        self.index = HashTable::new();
        self.per_node = Vec::new();
        self.debug_check();
    }

    /// An empty table. Memory is taken as entries arrive, never beyond `size`.
    pub fn new(config: TableConfig) -> Result<Self, TableConfigError> {
        config.validate()?;
        Ok(LruTable {
            slab: Vec::new(),
            index: HashTable::new(),
            head: NIL,
            tail: NIL,
            size: config.size,
            expire_ms: config.expire_ms,
            base_ms: 0,
            clock_ms: 0,
            hasher: KeyHasher::new(config.hash_seed),
            names: NodeNames::new(),
            key_heap: 0,
            stats: TableStats::default(),
            held: HashTable::new(),
            held_entries: 0,
            per_node: Vec::new(),
        })
    }

    pub fn size(&self) -> u32 {
        self.size
    }

    pub fn expire_ms(&self) -> u64 {
        self.expire_ms
    }

    /// The node names entries refer to.
    pub fn names(&self) -> &NodeNames {
        &self.names
    }

    /// The table's clock: the largest `now_ms` it has been given.
    pub fn clock_ms(&self) -> u64 {
        self.clock_ms
    }

    /// The pin for `key` without refreshing it or counting a hit (for the admin API).
    pub fn peek(&self, key: KeyRef<'_>, now_ms: u64) -> Option<NodeRef> {
        self.peek_idle(key, now_ms).map(|(node, _)| node)
    }

    /// The pin for `key` and how long it has been idle (ms), without refreshing it or
    /// counting a hit: what an operator's look at an entry must not change.
    pub fn peek_idle(&self, key: KeyRef<'_>, now_ms: u64) -> Option<(NodeRef, u64)> {
        let i = self.find(self.hasher.hash(key), key)?;
        let reference = now_ms.max(self.clock_ms);
        let idle = self.age(i, reference);
        (idle < self.expire_ms).then(|| (self.slab[i as usize].node, idle))
    }

    /// Marks `key`'s entry used at `now_ms` if it is live and still pins `node`, without
    /// counting a hit: a session that holds the pin (an open tunnel or TCP session) keeps
    /// its entry from expiring, as HAProxy keeps a stick-table entry a session references.
    /// False when the entry is gone or pins another node (nothing changes then).
    pub fn keep(&mut self, key: KeyRef<'_>, node: NodeRef, now_ms: u64) -> bool {
        self.tick(now_ms);
        let Some(i) = self.find(self.hasher.hash(key), key) else {
            return false;
        };
        if self.is_expired(i) || self.slab[i as usize].node != node {
            return false;
        }
        let stamp = self.now_stamp();
        self.touch(i, stamp);
        self.debug_check();
        true
    }

    /// Marks `key` held by one more open session (a TCP session, a WebSocket or other tunnel)
    /// until its [`release`](Self::release): while held, its entry is never dropped to make
    /// room (module docs). The key need not have an entry yet; one put later is held too.
    pub fn hold(&mut self, key: KeyRef<'_>) {
        let h = self.hasher.hash(key);
        if let Some(holder) = self.held.find_mut(h, |x| x.key.matches(key)) {
            holder.count = holder.count.saturating_add(1);
            return;
        }
        let hasher = &self.hasher;
        self.held.insert_unique(
            h,
            Holder {
                key: key.to_key(),
                count: 1,
            },
            |x| hasher.hash(x.key.as_key_ref()),
        );
        if self.find(h, key).is_some() {
            self.held_entries += 1;
        }
        self.debug_check();
    }

    /// Ends one hold of `key` (its session ended). A key no session holds any more is an
    /// entry like any other again. A release without a hold changes nothing.
    pub fn release(&mut self, key: KeyRef<'_>) {
        let h = self.hasher.hash(key);
        let Ok(mut slot) = self.held.find_entry(h, |x| x.key.matches(key)) else {
            return;
        };
        if slot.get().count > 1 {
            slot.get_mut().count -= 1;
            return;
        }
        slot.remove();
        if self.find(h, key).is_some() {
            self.held_entries -= 1;
        }
        self.debug_check();
    }

    /// Keys open sessions hold now (whether or not the table has their entry).
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// Changes the table's size and expiry in place (a reload), at `now_ms`. Entries keep
    /// their last use and LRU order: a shorter `expire` ends the ones already idle past it, a
    /// longer one keeps the live ones longer; a smaller `size` drops the least recently used
    /// beyond it (counted as evictions), sparing the entries open sessions hold while others
    /// are left to drop (module docs), and a larger one lets the table grow. Returns how many
    /// entries went.
    pub fn reconfigure(
        &mut self,
        size: u32,
        expire_ms: u64,
        now_ms: u64,
    ) -> Result<usize, TableConfigError> {
        TableConfig::new(size, expire_ms).validate()?;
        self.tick(now_ms);
        // What expired under the old `expire` is gone first: a longer one must not bring
        // back entries no lookup could return any more.
        let mut gone = self.purge_tail(usize::MAX);
        self.expire_ms = expire_ms;
        self.size = size;
        gone += self.purge_tail(usize::MAX);
        let stamp = self.now_stamp();
        while self.slab.len() > size as usize {
            let t = self.tail;
            let h = self.hasher.hash(self.slab[t as usize].key.as_key_ref());
            // A size below the sessions open drops held entries too: `size` bounds memory.
            if self.held_entries < self.slab.len() && self.is_held(h, t) {
                self.touch(t, stamp);
                continue;
            }
            self.remove_at(t, h);
            self.stats.evictions += 1;
            gone += 1;
        }
        // A full table holds no spare slab: give back what a smaller size no longer needs,
        // the index's buckets too (a hash table keeps them through removals).
        if self.slab.capacity() > size as usize {
            self.slab.shrink_to(size as usize);
            let (slab, hasher) = (&self.slab, &self.hasher);
            self.index.shrink_to(size as usize, |&j| {
                hasher.hash(slab[j as usize].key.as_key_ref())
            });
        }
        self.debug_check();
        Ok(gone)
    }

    /// Allocates room for `additional` more entries now (capped at `size`), so a table that
    /// will fill up costs its memory at start rather than in steps under traffic.
    pub fn reserve(&mut self, additional: usize) {
        let want = additional.min((self.size as usize).saturating_sub(self.slab.len()));
        self.slab.reserve_exact(want);
        let (slab, hasher) = (&self.slab, &self.hasher);
        self.index
            .reserve(want, |&j| hasher.hash(slab[j as usize].key.as_key_ref()));
    }

    /// Up to `limit` live entries from position `offset` of the slab (O(limit)), for the
    /// admin API's pages. The order is unspecified and shifts as entries are removed;
    /// expired entries not yet purged are skipped, so a page may be short.
    pub fn entries_at(&self, offset: usize, limit: usize, now_ms: u64) -> Vec<EntryInfo> {
        let reference = now_ms.max(self.clock_ms);
        (offset..self.slab.len().min(offset.saturating_add(limit)))
            .filter_map(|i| {
                let idle_ms = self.age(i as u32, reference);
                let e = &self.slab[i];
                (idle_ms < self.expire_ms).then(|| EntryInfo {
                    key: e.key.clone(),
                    node: e.node,
                    idle_ms,
                })
            })
            .collect()
    }

    /// The memory the table holds now.
    pub fn memory(&self) -> MemoryReport {
        MemoryReport {
            entries: self.slab.len(),
            entry_size: std::mem::size_of::<Entry>(),
            slab_bytes: self.slab.capacity() * std::mem::size_of::<Entry>(),
            index_bytes: self.index.allocation_size(),
            key_bytes: self.key_heap,
            names_bytes: self.names.heap_bytes(),
        }
    }

    /// The live entries, least recently used first, with their last use in epoch ms (what a
    /// snapshot writes: loading them in this order rebuilds the same LRU order).
    pub(crate) fn iter_oldest_first(
        &self,
        now_ms: u64,
    ) -> impl Iterator<Item = (&TableKey, NodeRef, u64)> + '_ {
        let reference = now_ms.max(self.clock_ms);
        let mut at = self.tail;
        std::iter::from_fn(move || {
            while at != NIL {
                let i = at;
                let e = &self.slab[i as usize];
                at = e.prev;
                if self.age(i, reference) < self.expire_ms {
                    return Some((&e.key, e.node, self.base_ms + u64::from(e.stamp)));
                }
            }
            None
        })
    }

    /// The live entries used at or after `since_ms` among up to `limit` slab positions from
    /// `offset` (O(limit)), each with its last use (epoch ms). For work over the whole table
    /// a page at a time, the table locked only for the page (a shared table's expiry
    /// refresh, a snapshot save): a big table read at once held its lock for 100 ms per
    /// million entries, and every request to it waited.
    ///
    /// The order is the slab's. A removal between pages moves the last entry into the hole,
    /// so a walk that has passed the hole misses that entry; none is read twice, though a
    /// key removed and put again can be (at its new position, with its new last use).
    pub fn used_at(
        &self,
        offset: usize,
        limit: usize,
        since_ms: u64,
        now_ms: u64,
    ) -> Vec<(TableKey, NodeRef, u64)> {
        let reference = now_ms.max(self.clock_ms);
        (offset..self.slab.len().min(offset.saturating_add(limit)))
            .filter_map(|i| {
                let e = &self.slab[i];
                let last_used = self.base_ms + u64::from(e.stamp);
                (last_used >= since_ms && self.age(i as u32, reference) < self.expire_ms)
                    .then(|| (e.key.clone(), e.node, last_used))
            })
            .collect()
    }

    /// Replaces the table's content with a decoded snapshot's entries. Entries that expired by
    /// `now_ms` under this table's `expire` are dropped, and so are the oldest ones beyond its
    /// `size`; the rest keep their idle time and LRU order. Traffic counters
    /// ([`stats`](AffinityStore::stats)) are left as they were: a restore is not traffic.
    pub fn restore(&mut self, snapshot: &Snapshot, now_ms: u64) -> RestoreReport {
        let stats = self.stats;
        self.clear();
        self.tick(now_ms);
        // With the table empty, any base within `expire` of the clock keeps every live entry's
        // stamp in range: a live entry was used after `clock - expire`.
        self.base_ms = self.clock_ms.saturating_sub(self.expire_ms);
        let refs: Vec<Option<NodeRef>> = snapshot
            .names
            .iter()
            .map(|n| self.names.intern(n))
            .collect();
        let mut report = RestoreReport::default();
        let clock = self.clock_ms;
        let expire = self.expire_ms;
        let live: Vec<_> = snapshot
            .entries
            .iter()
            .filter(|e| {
                let alive = clock.saturating_sub(e.last_used_ms.min(clock)) < expire;
                report.expired += usize::from(!alive);
                alive
            })
            .collect();
        // The newest `size` keys, each once: a snapshot read a page at a time holds an entry
        // twice when a removal moved it between pages, and the newer of the two is its last
        // use. Counted before the duplicates were merged, the room left out one older key
        // per duplicate, though all of them fit.
        let mut seen = std::collections::HashSet::with_capacity(live.len().min(self.size as usize));
        let mut kept = Vec::with_capacity(live.len().min(self.size as usize));
        for e in live.iter().rev() {
            if seen.contains(&e.key) {
                continue;
            }
            if kept.len() == self.size as usize {
                report.over_size += 1;
                continue;
            }
            let Some(node) = refs.get(e.node as usize).copied().flatten() else {
                report.skipped += 1;
                continue;
            };
            seen.insert(&e.key);
            kept.push((*e, node));
        }
        for (e, node) in kept.into_iter().rev() {
            // Decode sorted entries by last use, so stamps arrive in order and the list stays
            // sorted; clamp anyway so a clock that stepped back cannot break that.
            let last = e.last_used_ms.clamp(self.base_ms, clock);
            let stamp = (last - self.base_ms) as u32;
            let key = e.key.as_key_ref();
            let h = self.hasher.hash(key);
            self.upsert(key, h, node, stamp);
        }
        report.loaded = self.slab.len();
        self.stats = stats;
        self.debug_check();
        report
    }

    // ----- time -----

    /// Advances the clock to `now_ms` (never back) and rebases stamps when they would overflow.
    fn tick(&mut self, now_ms: u64) {
        if now_ms > self.clock_ms {
            self.clock_ms = now_ms;
        }
        if self.clock_ms - self.base_ms > u64::from(u32::MAX) {
            self.rebase();
        }
    }

    fn rebase(&mut self) {
        // Everything used before `clock - expire` is expired: drop it, then that instant is
        // the new zero. Live stamps stay positive and the next rebase is 2^32 - expire away.
        self.purge_tail(usize::MAX);
        let new_base = self.clock_ms - self.expire_ms;
        let shift = new_base - self.base_ms;
        for e in &mut self.slab {
            debug_assert!(
                u64::from(e.stamp) > shift,
                "a live entry predates the new base"
            );
            e.stamp = u64::from(e.stamp).saturating_sub(shift) as u32;
        }
        self.base_ms = new_base;
    }

    /// The stamp of "now". `tick` keeps `clock - base` within `u32`.
    fn now_stamp(&self) -> u32 {
        (self.clock_ms - self.base_ms) as u32
    }

    fn age(&self, i: u32, reference_ms: u64) -> u64 {
        reference_ms.saturating_sub(self.base_ms + u64::from(self.slab[i as usize].stamp))
    }

    fn is_expired(&self, i: u32) -> bool {
        self.age(i, self.clock_ms) >= self.expire_ms
    }

    // ----- index and list -----

    #[inline]
    fn find(&self, hash: u64, key: KeyRef<'_>) -> Option<u32> {
        let slab = &self.slab;
        self.index
            .find(hash, |&i| slab[i as usize].key.matches(key))
            .copied()
    }

    /// Whether entry `i` (whose key hashes to `hash`) is held by an open session.
    #[inline]
    fn is_held(&self, hash: u64, i: u32) -> bool {
        self.key_held(hash, self.slab[i as usize].key.as_key_ref())
    }

    fn key_held(&self, hash: u64, key: KeyRef<'_>) -> bool {
        !self.held.is_empty() && self.held.find(hash, |x| x.key.matches(key)).is_some()
    }

    /// Counts one more entry pinned to `node`.
    fn count_in(&mut self, node: NodeRef) {
        let i = node.index();
        if self.per_node.len() <= i {
            self.per_node.resize(i + 1, 0);
        }
        self.per_node[i] += 1;
    }

    /// Counts one entry pinned to `node` less.
    fn count_out(&mut self, node: NodeRef) {
        match self.per_node.get_mut(node.index()) {
            Some(n) if *n > 0 => *n -= 1,
            _ => debug_assert!(false, "no entry of {node:?} was counted"),
        }
    }

    fn unlink(&mut self, i: u32) {
        let (p, n) = {
            let e = &self.slab[i as usize];
            (e.prev, e.next)
        };
        if p != NIL {
            self.slab[p as usize].next = n;
        } else {
            self.head = n;
        }
        if n != NIL {
            self.slab[n as usize].prev = p;
        } else {
            self.tail = p;
        }
    }

    fn push_front(&mut self, i: u32) {
        let old = self.head;
        {
            let e = &mut self.slab[i as usize];
            e.prev = NIL;
            e.next = old;
        }
        if old != NIL {
            self.slab[old as usize].prev = i;
        } else {
            self.tail = i;
        }
        self.head = i;
    }

    fn touch(&mut self, i: u32, stamp: u32) {
        self.slab[i as usize].stamp = stamp;
        if self.head != i {
            self.unlink(i);
            self.push_front(i);
        }
    }

    /// Removes entry `i` (whose key hashes to `hash`), moving the last entry into its place.
    fn remove_at(&mut self, i: u32, hash: u64) -> Entry {
        self.unlink(i);
        match self.index.find_entry(hash, |&j| j == i) {
            Ok(slot) => {
                slot.remove();
            }
            Err(_) => debug_assert!(false, "entry {i} missing from the index"),
        }
        if self.is_held(hash, i) {
            self.held_entries -= 1;
        }
        let last = (self.slab.len() - 1) as u32;
        let removed = self.slab.swap_remove(i as usize);
        if i != last {
            // The former last entry now sits at `i`: repoint its index slot and neighbours.
            let moved_hash = self.hasher.hash(self.slab[i as usize].key.as_key_ref());
            match self.index.find_mut(moved_hash, |&j| j == last) {
                Some(slot) => *slot = i,
                None => debug_assert!(false, "moved entry {last} missing from the index"),
            }
            let (p, n) = {
                let e = &self.slab[i as usize];
                (e.prev, e.next)
            };
            if p != NIL {
                self.slab[p as usize].next = i;
            } else {
                self.head = i;
            }
            if n != NIL {
                self.slab[n as usize].prev = i;
            } else {
                self.tail = i;
            }
        }
        self.key_heap -= removed.key.heap_len();
        self.count_out(removed.node);
        removed
    }

    /// Removes up to `budget` expired entries from the tail; returns how many.
    fn purge_tail(&mut self, budget: usize) -> usize {
        let mut removed = 0;
        while removed < budget && self.tail != NIL && self.is_expired(self.tail) {
            let t = self.tail;
            let h = self.hasher.hash(self.slab[t as usize].key.as_key_ref());
            self.remove_at(t, h);
            removed += 1;
        }
        self.stats.expirations += removed as u64;
        removed
    }

    /// Sets `key` → `node` used at `stamp`, inserting (and making room) if needed.
    fn upsert(&mut self, key: KeyRef<'_>, hash: u64, node: NodeRef, stamp: u32) -> PutOutcome {
        if let Some(i) = self.find(hash, key) {
            let expired = self.is_expired(i);
            let previous = std::mem::replace(&mut self.slab[i as usize].node, node);
            if previous != node {
                self.count_out(previous);
                self.count_in(node);
            }
            self.touch(i, stamp);
            if expired {
                // Logically the old entry was gone: this is a new pin, not a change.
                self.stats.expirations += 1;
                self.stats.inserts += 1;
                return PutOutcome {
                    previous: None,
                    evicted: false,
                    stored: true,
                };
            }
            self.stats.updates += 1;
            return PutOutcome {
                previous: Some(previous),
                evicted: false,
                stored: true,
            };
        }
        let mut evicted = false;
        if self.slab.len() >= self.size as usize {
            match self.make_room() {
                Some(e) => evicted = e,
                None => {
                    self.stats.refused += 1;
                    return PutOutcome {
                        previous: None,
                        evicted: false,
                        stored: false,
                    };
                }
            }
        }
        if self.slab.len() == self.slab.capacity() {
            // Grow by doubling, but never past `size`: a full table holds no spare slab.
            let len = self.slab.len();
            let room = self.size as usize - len;
            self.slab.reserve_exact(len.max(64).min(room));
        }
        let i = self.slab.len() as u32;
        let key = key.to_key();
        self.key_heap += key.heap_len();
        self.slab.push(Entry {
            key,
            node,
            stamp,
            prev: NIL,
            next: NIL,
        });
        self.count_in(node);
        self.push_front(i);
        let (slab, hasher) = (&self.slab, &self.hasher);
        self.index
            .insert_unique(hash, i, |&j| hasher.hash(slab[j as usize].key.as_key_ref()));
        if self.is_held(hash, i) {
            self.held_entries += 1;
        }
        self.stats.inserts += 1;
        PutOutcome {
            previous: None,
            evicted,
            stored: true,
        }
    }

    /// Drops one entry of a full table for a new one: the least recently used that is
    /// expired or held by no open session. A held one met on the way is marked used now and
    /// moves to the front (it is in use), so each is passed over once per trip through the
    /// list, and at most [`MAKE_ROOM_WALK`] are passed over per put: a table nearly full of
    /// held entries costs each new key bounded work under the lock, not a walk of the table
    /// (HAProxy's `stktable_trash_oldest` gives up after a batch too). `Some(true)` for an
    /// eviction, `Some(false)` for an expired entry, `None` when every entry is held, or the
    /// walk's bound passed (nothing dropped).
    fn make_room(&mut self) -> Option<bool> {
        let stamp = self.now_stamp();
        let mut passed = 0;
        loop {
            let t = self.tail;
            let h = self.hasher.hash(self.slab[t as usize].key.as_key_ref());
            let expired = self.is_expired(t);
            if !expired && self.is_held(h, t) {
                if self.held_entries >= self.slab.len() || passed == MAKE_ROOM_WALK {
                    return None;
                }
                self.touch(t, stamp);
                passed += 1;
                continue;
            }
            self.remove_at(t, h);
            if expired {
                self.stats.expirations += 1;
            } else {
                self.stats.evictions += 1;
            }
            return Some(!expired);
        }
    }

    /// Checks the table's invariants (debug builds): the index and the list cover the slab
    /// exactly, links are mutual, stamps fall from head to tail, `len <= size`.
    fn debug_check(&self) {
        if !cfg!(debug_assertions) {
            return;
        }
        let len = self.slab.len();
        assert!(
            len <= self.size as usize,
            "table holds {len} entries, over its size {}",
            self.size
        );
        assert_eq!(
            self.index.len(),
            len,
            "the index and the slab disagree on len"
        );
        assert_eq!(
            self.head == NIL,
            len == 0,
            "head is nil iff the table is empty"
        );
        assert_eq!(
            self.tail == NIL,
            len == 0,
            "tail is nil iff the table is empty"
        );
        assert!(
            self.clock_ms - self.base_ms <= u64::from(u32::MAX),
            "the clock ran past the stamp range"
        );
        if len == 0 {
            return;
        }
        assert_eq!(
            self.slab[self.head as usize].prev, NIL,
            "the head has a predecessor"
        );
        assert_eq!(
            self.slab[self.tail as usize].next, NIL,
            "the tail has a successor"
        );
        if len > FULL_CHECK_MAX {
            return;
        }
        let (mut at, mut prev, mut seen, mut prev_stamp) = (self.head, NIL, 0usize, u32::MAX);
        while at != NIL {
            assert!((at as usize) < len, "list link {at} is out of the slab");
            assert!(seen < len, "the LRU list has a cycle");
            let e = &self.slab[at as usize];
            assert_eq!(e.prev, prev, "entry {at}: prev link is not mutual");
            assert!(
                e.stamp <= prev_stamp,
                "entry {at}: stamps do not fall from head to tail"
            );
            assert_eq!(
                self.find(self.hasher.hash(e.key.as_key_ref()), e.key.as_key_ref()),
                Some(at),
                "entry {at}: the index does not find it"
            );
            prev_stamp = e.stamp;
            prev = at;
            at = e.next;
            seen += 1;
        }
        assert_eq!(prev, self.tail, "the list does not end at the tail");
        assert_eq!(seen, len, "the LRU list misses entries");
        let heap: usize = self.slab.iter().map(|e| e.key.heap_len()).sum();
        assert_eq!(heap, self.key_heap, "key heap accounting is off");
        let held = self
            .slab
            .iter()
            .filter(|e| {
                let key = e.key.as_key_ref();
                self.key_held(self.hasher.hash(key), key)
            })
            .count();
        assert_eq!(held, self.held_entries, "held entry count is off");
        let mut per_node = vec![0u32; self.per_node.len()];
        for e in &self.slab {
            match per_node.get_mut(e.node.index()) {
                Some(n) => *n += 1,
                None => panic!("entry of {:?} was never counted", e.node),
            }
        }
        assert_eq!(per_node, self.per_node, "pins per node are off");
    }
}

impl AffinityStore for LruTable {
    fn intern(&mut self, name: &str) -> Option<NodeRef> {
        self.names.intern(name)
    }

    fn known(&self, name: &str) -> Option<NodeRef> {
        self.names.get(name)
    }

    fn node_name(&self, node: NodeRef) -> Option<&str> {
        self.names.name(node)
    }

    /// A hit refreshes the entry (idle time restarts, it becomes the most recent); an expired
    /// entry found here is removed.
    fn get(&mut self, key: KeyRef<'_>, now_ms: u64) -> Option<NodeRef> {
        self.tick(now_ms);
        let h = self.hasher.hash(key);
        let Some(i) = self.find(h, key) else {
            self.stats.misses += 1;
            return None;
        };
        if self.is_expired(i) {
            self.remove_at(i, h);
            self.stats.expirations += 1;
            self.stats.misses += 1;
            self.debug_check();
            return None;
        }
        let stamp = self.now_stamp();
        self.touch(i, stamp);
        self.stats.hits += 1;
        self.debug_check();
        Some(self.slab[i as usize].node)
    }

    fn put(&mut self, key: KeyRef<'_>, node: NodeRef, now_ms: u64) -> PutOutcome {
        self.tick(now_ms);
        let h = self.hasher.hash(key);
        let stamp = self.now_stamp();
        let out = self.upsert(key, h, node, stamp);
        self.debug_check();
        out
    }

    fn remove(&mut self, key: KeyRef<'_>) -> Option<NodeRef> {
        let h = self.hasher.hash(key);
        let i = self.find(h, key)?;
        let expired = self.is_expired(i);
        let e = self.remove_at(i, h);
        if expired {
            self.stats.expirations += 1;
        } else {
            self.stats.removals += 1;
        }
        self.debug_check();
        (!expired).then_some(e.node)
    }

    fn len(&self) -> usize {
        self.slab.len()
    }

    fn clear(&mut self) {
        self.slab.clear();
        self.index.clear();
        self.head = NIL;
        self.tail = NIL;
        self.key_heap = 0;
        self.held_entries = 0;
        self.per_node.clear();
        self.debug_check();
    }

    fn purge_expired(&mut self, now_ms: u64, budget: usize) -> usize {
        self.tick(now_ms);
        let n = self.purge_tail(budget);
        self.debug_check();
        n
    }

    /// Pages through the slab (O(page_size) per page). The order is unspecified and shifts as
    /// entries are removed; expired entries not yet purged are skipped, so a page may be short.
    fn entries(&self, page: usize, page_size: usize, now_ms: u64) -> Vec<EntryInfo> {
        self.entries_at(page.saturating_mul(page_size), page_size, now_ms)
    }

    /// The counts kept per node, less the expired entries not yet purged: those are a run
    /// at the list's tail (module docs), walked here. A holder that purges often
    /// ([`purge_expired`](AffinityStore::purge_expired) on a timer: the binary's every
    /// second) keeps that run to the expiries since, so a read is O(nodes) plus those.
    fn pins(&self, now_ms: u64) -> Vec<(NodeRef, u64)> {
        let reference = now_ms.max(self.clock_ms);
        let mut live: Vec<u64> = self.per_node.iter().map(|&n| u64::from(n)).collect();
        let mut at = self.tail;
        while at != NIL && self.age(at, reference) >= self.expire_ms {
            let e = &self.slab[at as usize];
            if let Some(n) = live.get_mut(e.node.index()) {
                *n = n.saturating_sub(1);
            }
            at = e.prev;
        }
        live.into_iter()
            .enumerate()
            .filter(|&(_, n)| n > 0)
            .filter_map(|(i, n)| Some((NodeRef(u32::try_from(i).ok()?), n)))
            .collect()
    }

    fn stats(&self) -> TableStats {
        TableStats {
            len: self.slab.len() as u64,
            size: u64::from(self.size),
            ..self.stats
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    const T0: u64 = 1_700_000_000_000;

    fn table(size: u32, expire_ms: u64) -> LruTable {
        LruTable::new(TableConfig::new(size, expire_ms).with_hash_seed([7, 9]))
            .expect("valid config")
    }

    fn k(i: u32) -> KeyRef<'static> {
        KeyRef::v4(Ipv4Addr::from(i))
    }

    #[test]
    fn used_at_reads_a_page_of_positions_for_the_entries_used_since() {
        let mut t = table(8, 10_000);
        let n = t.intern("a").expect("name");
        for i in 0..5 {
            t.put(k(i), n, T0 + u64::from(i) * 100);
        }
        // A hit gives key 1 a new last use.
        assert_eq!(t.get(k(1), T0 + 1_000), Some(n));
        let used = |offset, limit, since, now| {
            let mut keys: Vec<(TableKey, u64)> = t
                .used_at(offset, limit, since, now)
                .into_iter()
                .map(|(key, _, last)| (key, last))
                .collect();
            keys.sort_by_key(|(_, last)| *last);
            keys
        };
        assert_eq!(
            used(0, 8, T0 + 300, T0 + 1_000),
            vec![
                (k(3).to_key(), T0 + 300),
                (k(4).to_key(), T0 + 400),
                (k(1).to_key(), T0 + 1_000)
            ]
        );
        // Pages of two positions cover the same entries, none twice.
        let mut paged: Vec<(TableKey, u64)> = (0..3)
            .flat_map(|p| used(p * 2, 2, T0 + 300, T0 + 1_000))
            .collect();
        paged.sort_by_key(|(_, last)| *last);
        assert_eq!(paged, used(0, 8, T0 + 300, T0 + 1_000));
        assert_eq!(
            used(4, 8, 0, T0 + 1_000).len(),
            1,
            "positions past the end are none"
        );
        assert_eq!(used(0, 8, 0, T0 + 1_000).len(), 5);
        // Expired entries are left out: keys 0, 2 (idle 10 s by then) go.
        assert_eq!(used(0, 8, 0, T0 + 10_250).len(), 3);
    }

    /// A smaller size gives the memory of a larger one back, the index's as the slab's: a
    /// table shrunk from 100,000 entries to 1,000 holds what one made with 1,000 holds (and
    /// reserved). Before, the index kept its buckets for 100,000 for the table's life.
    /// `let_go` empties the table and gives back what its entries took (a clear keeps it);
    /// the table takes entries again afterwards.
    #[test]
    fn let_go_gives_the_entries_memory_back() {
        let mut t = table(10_000, 10_000);
        let n = t.intern("a").expect("name");
        for i in 0..10_000 {
            t.put(k(i), n, T0);
        }
        t.clear();
        assert!(t.memory().slab_bytes > 0, "a clear keeps the memory");
        for i in 0..10_000 {
            t.put(k(i), n, T0);
        }
        t.let_go();
        let m = t.memory();
        assert_eq!((m.entries, m.slab_bytes, m.index_bytes), (0, 0, 0));
        t.put(k(7), n, T0);
        assert_eq!(t.get(k(7), T0 + 1), Some(n));
    }

    #[test]
    fn a_smaller_size_gives_its_memory_back() {
        let mut t = table(100_000, 10_000);
        let n = t.intern("a").expect("name");
        for i in 0..100_000 {
            t.put(k(i), n, T0);
        }
        assert_eq!(t.reconfigure(1_000, 10_000, T0), Ok(99_000));
        let mut fresh = table(1_000, 10_000);
        fresh.reserve(1_000);
        let (shrunk, made) = (t.memory(), fresh.memory());
        assert!(
            shrunk.index_bytes <= made.index_bytes && shrunk.slab_bytes <= made.slab_bytes,
            "shrunk {shrunk:?}, made {made:?}"
        );
        assert_eq!(t.len(), 1_000);
        assert_eq!(t.get(k(99_999), T0), Some(n));
    }

    /// A reload's size and expiry apply to the entries already held, on the virtual clock:
    /// a smaller size drops the least recently used, a larger one lets the table grow, a
    /// shorter expiry ends the entries idle past it and a longer one keeps them.
    #[test]
    fn reconfigure_applies_size_and_expire_to_the_entries_held() {
        let mut t = table(4, 10_000);
        let n = t.intern("a").expect("name");
        for i in 0..4 {
            t.put(k(i), n, T0 + u64::from(i) * 1_000);
        }
        // Size 4 -> 2: keys 0 and 1, the least recently used, go.
        assert_eq!(t.reconfigure(2, 10_000, T0 + 4_000), Ok(2));
        assert_eq!(t.get(k(0), T0 + 4_000), None);
        assert_eq!(t.get(k(3), T0 + 4_000), Some(n));
        assert_eq!(t.stats().evictions, 2);
        // Size 2 -> 6: room for four more without evicting.
        assert_eq!(t.reconfigure(6, 10_000, T0 + 4_000), Ok(0));
        for i in 10..14 {
            t.put(k(i), n, T0 + 4_000);
        }
        assert_eq!(t.len(), 6);
        assert_eq!(t.stats().evictions, 2);
        // Expire 10 s -> 3 s at T0 + 6.5 s: key 2 (idle 4.5 s) goes, key 3 (read at 4 s) stays.
        assert_eq!(t.reconfigure(6, 3_000, T0 + 6_500), Ok(1));
        assert_eq!(t.get(k(2), T0 + 6_500), None);
        assert_eq!(t.get(k(3), T0 + 6_500), Some(n));
        // Expire 3 s -> 60 s at 9 s: the entries put at 4 s, idle 5 s, had expired and stay
        // gone; key 3, read at 6.5 s, lives past 3 s idle now.
        assert_eq!(t.reconfigure(6, 60_000, T0 + 9_000), Ok(4));
        assert_eq!(t.get(k(10), T0 + 9_000), None);
        assert_eq!(t.get(k(3), T0 + 30_000), Some(n));
        assert_eq!(
            t.reconfigure(0, 1, T0 + 30_000),
            Err(TableConfigError::ZeroSize)
        );
    }

    /// An entry an open session holds is never dropped to make room: the next least
    /// recently used goes instead, and a table full of held entries stores no new key. Once
    /// released (by every session that held it), it is an entry like any other again.
    #[test]
    fn a_held_entry_is_never_dropped_for_room_and_a_full_table_of_them_stores_nothing() {
        let mut t = table(2, 10_000);
        let a = t.intern("a").expect("name");
        t.put(k(1), a, T0);
        t.put(k(2), a, T0 + 1);
        t.hold(k(1));
        t.hold(k(1));
        let out = t.put(k(3), a, T0 + 2);
        assert!(out.stored && out.evicted, "{out:?}");
        assert_eq!(t.peek(k(1), T0 + 2), Some(a), "held: passed over");
        assert_eq!(
            t.peek(k(2), T0 + 2),
            None,
            "the next least recently used went"
        );
        t.hold(k(3));
        let out = t.put(k(4), a, T0 + 3);
        assert_eq!(
            out,
            PutOutcome {
                previous: None,
                evicted: false,
                stored: false
            }
        );
        assert_eq!(t.peek(k(4), T0 + 3), None);
        assert_eq!((t.len(), t.stats().refused, t.stats().evictions), (2, 1, 1));
        // A put to a key already in, held or not, is no new entry: stored.
        assert!(t.put(k(1), a, T0 + 4).stored);
        // Held twice, released once: still held.
        t.release(k(1));
        assert!(!t.put(k(4), a, T0 + 5).stored);
        t.release(k(1));
        t.release(k(1)); // a release without a hold changes nothing
        assert_eq!(t.held(), 1);
        let out = t.put(k(4), a, T0 + 6);
        assert!(out.stored && out.evicted);
        assert_eq!(t.peek(k(1), T0 + 6), None, "released: dropped as any other");
        assert_eq!(t.peek(k(3), T0 + 6), Some(a));
        // A key held before its entry exists is held once put.
        t.hold(k(5));
        t.put(k(5), a, T0 + 7);
        assert!(!t.put(k(6), a, T0 + 8).stored);
        // Held, an entry still expires when idle `expire` (its holder marks it used).
        assert!(t.put(k(6), a, T0 + 20_000).stored);
        assert_eq!(t.peek(k(6), T0 + 20_000), Some(a));
    }

    /// A put into a full table passes over at most [`MAKE_ROOM_WALK`] held entries: bounded
    /// work under the lock however many are held. The next put goes on from where it stopped.
    #[test]
    fn a_put_passes_over_a_bounded_number_of_held_entries() {
        let n = MAKE_ROOM_WALK as u32 + 2;
        let mut t = table(n, 10_000);
        let a = t.intern("a").expect("name");
        for i in 0..n {
            t.put(k(i), a, T0 + u64::from(i));
            if i <= MAKE_ROOM_WALK as u32 {
                t.hold(k(i));
            }
        }
        let out = t.put(k(100), a, T0 + 100);
        assert!(!out.stored, "{MAKE_ROOM_WALK} held passed over: refused");
        assert_eq!(
            t.peek(k(n - 1), T0 + 100),
            Some(a),
            "the unheld one is still in"
        );
        let out = t.put(k(101), a, T0 + 101);
        assert!(out.stored && out.evicted, "{out:?}");
        assert_eq!(t.peek(k(n - 1), T0 + 101), None, "reached and dropped");
        assert_eq!(t.stats().refused, 1);
    }

    /// A reload's smaller `size` spares held entries while others are left to drop, and
    /// drops held ones too, least recently used first, when the sessions open outnumber it:
    /// the size bounds memory.
    #[test]
    fn a_smaller_size_spares_held_entries_while_it_can() {
        let mut t = table(4, 10_000);
        let a = t.intern("a").expect("name");
        for i in 1..=4 {
            t.put(k(i), a, T0 + u64::from(i));
        }
        t.hold(k(1));
        t.hold(k(2));
        assert_eq!(t.reconfigure(2, 10_000, T0 + 10), Ok(2));
        assert_eq!(t.peek(k(1), T0 + 10), Some(a));
        assert_eq!(t.peek(k(2), T0 + 10), Some(a));
        assert_eq!(t.peek(k(3), T0 + 10), None);
        assert_eq!(t.reconfigure(1, 10_000, T0 + 11), Ok(1));
        assert_eq!(t.len(), 1);
        assert_eq!(
            t.peek(k(2), T0 + 11),
            Some(a),
            "the more recently used of the two"
        );
        assert_eq!(t.stats().evictions, 3);
    }

    /// `keep` refreshes a live entry of the node it names and nothing else, and counts no
    /// hit: a session held open keeps its pin past `expire`.
    #[test]
    fn keep_refreshes_only_a_live_entry_of_its_node() {
        let mut t = table(4, 10_000);
        let a = t.intern("a").expect("name");
        let b = t.intern("b").expect("name");
        t.put(k(1), a, T0);
        // Kept every 6 s, it outlives three expiry periods.
        for step in 1..=5 {
            assert!(t.keep(k(1), a, T0 + step * 6_000));
        }
        assert_eq!(t.peek(k(1), T0 + 39_000), Some(a));
        assert_eq!(t.stats().hits, 0);
        // Another node's keep changes nothing; an absent key is not made.
        assert!(!t.keep(k(1), b, T0 + 45_000));
        assert!(!t.keep(k(2), a, T0 + 45_000));
        assert_eq!(t.len(), 1);
        // Not kept past expire: gone, and a late keep does not bring it back.
        assert!(!t.keep(k(1), a, T0 + 60_000));
        assert_eq!(t.peek(k(1), T0 + 60_000), None);
    }

    #[test]
    fn entry_is_40_bytes() {
        assert_eq!(std::mem::size_of::<TableKey>(), 24);
        assert_eq!(std::mem::size_of::<Entry>(), 40);
    }

    #[test]
    fn config_bounds() {
        assert_eq!(
            TableConfig::new(0, 1).validate(),
            Err(TableConfigError::ZeroSize)
        );
        assert_eq!(
            TableConfig::new(1, 0).validate(),
            Err(TableConfigError::ZeroExpire)
        );
        assert!(TableConfig::new(1, MAX_EXPIRE_MS).validate().is_ok());
        assert!(TableConfig::new(1, MAX_EXPIRE_MS + 1).validate().is_err());
        assert!(TableConfig::new(MAX_SIZE + 1, 1).validate().is_err());
    }

    #[test]
    fn removal_in_the_middle_keeps_the_structure() {
        let mut t = table(8, 1000);
        let n = t.intern("a").expect("intern");
        for i in 0..8 {
            t.put(k(i), n, T0 + u64::from(i));
        }
        assert_eq!(t.remove(k(0)), Some(n)); // the tail
        assert_eq!(t.remove(k(7)), Some(n)); // the head
        assert_eq!(t.remove(k(3)), Some(n)); // the middle
        assert_eq!(t.remove(k(3)), None);
        assert_eq!(t.len(), 5);
        for i in [1, 2, 4, 5, 6] {
            assert_eq!(t.peek(k(i), T0 + 10), Some(n), "key {i}");
        }
    }

    #[test]
    fn clock_stepping_back_reads_as_no_time() {
        let mut t = table(4, 100);
        let n = t.intern("a").expect("intern");
        t.put(k(1), n, T0 + 50);
        assert_eq!(t.get(k(1), T0), Some(n));
        assert_eq!(t.get(k(1), T0 + 149), Some(n));
        assert_eq!(t.get(k(1), T0 + 249), None);
    }

    #[test]
    fn rebase_keeps_live_entries_and_drops_expired_ones() {
        let expire = MAX_EXPIRE_MS;
        let mut t = table(16, expire);
        let n = t.intern("a").expect("intern");
        t.put(k(1), n, T0);
        // k(2) is refreshed all along; k(1) is left to expire.
        let mut now = T0;
        for _ in 0..5 {
            now += expire / 2;
            t.put(k(2), n, now);
        }
        assert!(now - T0 > u64::from(u32::MAX), "a rebase happened");
        assert_eq!(t.len(), 1);
        assert_eq!(t.get(k(2), now + expire - 1), Some(n));
        assert_eq!(t.get(k(1), now), None);
        // A jump far beyond the stamp range drops everything.
        assert_eq!(t.get(k(2), now + 100 * u64::from(u32::MAX)), None);
        assert!(t.is_empty());
    }

    #[test]
    fn memory_report_counts_the_parts() {
        let mut t = table(1000, 1000);
        let n = t.intern("node-a").expect("intern");
        for i in 0..1000 {
            t.put(k(i), n, T0);
        }
        t.put(KeyRef::bytes(b"abc"), n, T0);
        let m = t.memory();
        assert_eq!(m.entries, 1000);
        assert_eq!(m.slab_bytes, 1000 * 40, "the slab stops at size");
        assert_eq!(m.key_bytes, 3);
        assert!(m.index_bytes >= 1000 * 5);
        assert!(m.per_entry() < 60.0, "{m:?}");
    }
}
