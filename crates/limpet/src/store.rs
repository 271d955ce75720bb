//! # Fleet mode: affinity tables shared through Redis or Valkey
//!
//! Several limpet instances (behind a virtual IP, or DNS) share the pins of the tables marked
//! `shared = true` through one `[store]`. The local [`LruTable`] stays the source of every
//! answer: [`crate::runtime::State::route`] never waits for the store. This module does the
//! store's I/O beside it (docs/fleet.md):
//!
//! ```text
//!  State::route / Table::learn ─► local write ─► Store::send (try_send, never blocks)
//!        ─► writer task: batches ─► one pipeline per batch, bounded by `timeout`
//!             first pin  ─► SET key node NX PX expire GET ─► lost the race? adopt the winner
//!             re-pin     ─► EVAL: SET key node PX expire + PUBLISH channel (one atomic step)
//!  subscriber task ◄─ PUBLISH {prefix}pins ◄─ any instance's re-pin ─► local entry moved
//!  local miss (first request of a key here) ─► Store::fetch: GETEX, bounded ─► local entry
//!  every expire/2 ─► GETEX key PX expire of the entries used since (pipelined): another
//!        node stored ─► adopted (a missed re-pin); a missing key ─► SET NX
//!  circuit breaker: 2 failed round trips ─► down (logged once, admin, metric): no store I/O,
//!        fresh connection, a write probe every second ─► up ─► the re-pins not sent meanwhile
//!        overwritten (newer than the store's), then every local pin published with SET NX
//!        (adopt losers), read and sent a chunk at a time
//!  up: PEXPIRE of this instance's marker every second ─► gone (flushed) ─► the same resync
//!  subscription: PING every second; no answer within the bound ─► resubscribe ─► resync
//! ```
//!
//! Ordering: a re-pin's SET and its PUBLISH run as one script, so every instance receives
//! the re-pins of a key in the order the store applied them; each instance applies every
//! message (its own too), so its local entry ends on the store's value. A message missed
//! anyway (a subscription cut or half-open, a re-pin made before the first SUBSCRIBE) is
//! caught by the resync each (re)subscription triggers, and at the latest by the next expiry
//! refresh of the key, which reads the stored node back.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use futures_util::StreamExt as _;
use limpet_core::table::{AffinityStore, AffinityTable, KeyRef, LruTable, NodeRef, TableKey};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::Value;
use serde::Serialize;
use tokio::sync::{mpsc, watch};

use crate::clock::now_ms;
use crate::config::StoreDef;
use crate::metrics::StoreOpLabels;

/// Writes waiting for the writer task; past this, writes are dropped and the pins published
/// later by the resync (a store that cannot keep up is treated like one that is away).
const QUEUE: usize = 65_536;
/// Most commands in one pipeline ([`Batch`]).
const BATCH: usize = 512;
/// Fewest commands in one pipeline a store's timeouts shrink it to ([`Batch`]).
const BATCH_MIN: usize = 16;
/// Table positions the expiry refresh reads per lock of the table: 0.1-0.2 ms of it at a
/// million entries (`cargo bench -p limpet-core --bench table -- pages`).
const REFRESH_PAGE: usize = 4096;
/// Consecutive failed round trips that open the circuit breaker.
const TRIP_AFTER: u32 = 2;
/// How often a store marked down is tried again (one write, [`Store::probe`]).
const PROBE_EVERY: Duration = Duration::from_secs(1);
/// How long an instance's marker outlives the instance's last check (a minute): a stopped
/// instance's goes by itself.
const MARKER_PX: u64 = 60_000;
/// Most re-pins kept for the resync while the store is away ([`Store::repins_away`]).
const REPINS_KEPT: usize = 65_536;

/// How long one of this instance's re-pins is expected back as the store's message
/// ([`OwnRepins`]), at least: a write goes out within a tick and comes back within a round
/// trip. With a longer `timeout`, longer ([`echo_wait_ms`]).
const ECHO_WAIT_MS: u64 = 2_000;

/// How long a re-pin is expected back with round trips bounded by `timeout`: its batch may
/// wait for the one before it (a round trip) and take one itself, and a round trip that
/// timed out may still have run and be published late. An echo that came after a fixed 2 s
/// was applied as another instance's re-pin when `timeout` was set longer: it moved the
/// entry back to the node the request had failed over from, and ended the session's
/// connections on the node it held.
fn echo_wait_ms(timeout: Duration) -> u64 {
    let round_trip = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
    ECHO_WAIT_MS.max(round_trip.saturating_mul(2).saturating_add(1_000))
}

/// Which way a round trip went, for the breaker: reads (a request's `GET`, the liveness
/// check) and writes (the writer's pipelines).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    Read,
    Write,
}

/// Round trips failed in a row, counted apart for reads and writes: [`TRIP_AFTER`] in a row
/// either way open the breaker. A store that answers reads while it refuses writes, or
/// times them out (out of memory under `noeviction`, pipelines slower than `timeout` where
/// single commands are not), is opened by its writes however many reads succeed between
/// them: with one count, each new client's `GET` cleared the failed write before it, and the
/// store read as up while every pin sent to it was dropped.
#[derive(Debug, Default)]
struct Breaker {
    reads: AtomicU32,
    writes: AtomicU32,
}

impl Breaker {
    fn of(&self, way: Way) -> &AtomicU32 {
        match way {
            Way::Read => &self.reads,
            Way::Write => &self.writes,
        }
    }

    fn success(&self, way: Way) {
        self.of(way).store(0, Ordering::Relaxed);
    }

    /// Counts a failure; whether it is the one that opens the breaker.
    fn failure(&self, way: Way) -> bool {
        self.of(way).fetch_add(1, Ordering::AcqRel) + 1 >= TRIP_AFTER
    }

    /// The store is up again (its probe, a write, went through): nothing in a row.
    fn reset(&self) {
        self.reads.store(0, Ordering::Relaxed);
        self.writes.store(0, Ordering::Relaxed);
    }
}

/// This instance's re-pins on their way through the store, by table and key: how many, and
/// until when they are expected back. Messages arrive in the order the store ran their
/// writes, so while a re-pin of a key has not come back, a message of that key is that
/// re-pin's own echo or older than it, and older than the local entry: it is not applied.
/// Applied, it would move the entry back to an older node (until the next message moved it
/// again) and end the session's connections on the node the entry holds: a request that
/// fails over twice publishes two re-pins, and two instances re-pinning one key cross.
#[derive(Debug)]
struct OwnRepins {
    keys: HashMap<(Arc<str>, TableKey), (u32, u64)>,
    /// How long a re-pin is awaited ([`echo_wait_ms`]).
    wait_ms: u64,
    /// The size at which the next sweep of expired entries runs: twice what the last one
    /// left (at least [`REPINS_KEPT`]), so that a storm of re-pins all still awaited (a
    /// large node going DOWN) costs each insert O(1), not a sweep of the whole map.
    sweep_at: usize,
    sweeps: u64,
}

impl Default for OwnRepins {
    fn default() -> Self {
        OwnRepins::waiting(ECHO_WAIT_MS)
    }
}

/// Keys being read by first requests here ([`crate::runtime::Table::prefetch`]): the reads
/// of each, and how many re-pin messages of it came while any was read.
type Fetching = HashMap<(Arc<str>, TableKey), (u32, u64)>;

/// One first request's read of a key ([`Store::reading`]), counted in [`Store`]'s `fetching`
/// until dropped.
#[derive(Debug)]
pub(crate) struct Reading<'a> {
    all: &'a Mutex<Fetching>,
    key: (Arc<str>, TableKey),
    /// The key's count of messages when this read last looked.
    seen: u64,
}

impl<'a> Reading<'a> {
    fn start(all: &'a Mutex<Fetching>, key: (Arc<str>, TableKey)) -> Self {
        let mut m = lock(all);
        let e = m.entry(key.clone()).or_insert((0, 0));
        e.0 += 1;
        let seen = e.1;
        drop(m);
        Reading { all, key, seen }
    }

    /// Whether a re-pin message of the key came since this read began or last looked; looks
    /// again from now. Each read of the key sees every message, whichever looks first.
    pub(crate) fn moved(&mut self) -> bool {
        let now = lock(self.all).get(&self.key).map_or(self.seen, |e| e.1);
        std::mem::replace(&mut self.seen, now) != now
    }
}

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        let mut all = lock(self.all);
        if let Some(r) = all.get_mut(&self.key) {
            r.0 -= 1;
            if r.0 == 0 {
                all.remove(&self.key);
            }
        }
    }
}

/// Pins from the store to nodes this instance has not got, logged once per interval.
static UNKNOWN_NODES: crate::net::RateLimitedLog = crate::net::RateLimitedLog::new(
    "a pin in the store names a node this instance does not have: ignored",
);

/// Subscriptions to the re-pin channel the store refused for want of the channel's
/// permission (`NOPERM`), logged once per interval.
static SUBSCRIBE_ERRORS: crate::net::RateLimitedLog = crate::net::RateLimitedLog::new(
    "the store refused the subscription to re-pins (the store user needs the channel: the \
     prefix and `pins`): other instances' re-pins reach this one only at each key's expiry \
     refresh",
);

/// Subscriptions the store refused for another reason (`NOAUTH` after a restart with a
/// password, `LOADING`), logged once per interval: tried again at the next connection.
static SUBSCRIBE_REFUSED: crate::net::RateLimitedLog = crate::net::RateLimitedLog::new(
    "the store refused the subscription to re-pins: other instances' re-pins reach this one \
     only at each key's expiry refresh until it is taken",
);

/// Keys the store answered with an error of their own (another type under a pin's key),
/// logged once per interval.
static KEY_ERRORS: crate::net::RateLimitedLog = crate::net::RateLimitedLog::new(
    "a key in the store holds what a pin cannot be (another type): skipped",
);

/// Whether the store's error answer to one command is about that command's key alone
/// (`WRONGTYPE`: someone wrote another type under a pin's key, e.g. with `HSET`): the key is
/// skipped, and the store is not taken for down. Any other error answer (`READONLY`, `OOM`,
/// `MISCONF`, `NOPERM`, `LOADING`, ...) refuses every write alike: a failure of the round
/// trip, toward the breaker.
fn key_error(code: &str) -> bool {
    code == "WRONGTYPE"
}

impl OwnRepins {
    /// Re-pins awaited `wait_ms` each.
    fn waiting(wait_ms: u64) -> Self {
        OwnRepins {
            keys: HashMap::new(),
            wait_ms,
            sweep_at: REPINS_KEPT,
            sweeps: 0,
        }
    }

    /// A re-pin of `key` is on its way.
    fn sent(&mut self, table: &Arc<str>, key: &TableKey, now: u64) {
        if self.keys.len() >= self.sweep_at {
            self.keys.retain(|_, (_, until)| *until >= now);
            self.sweep_at = REPINS_KEPT.max(2 * self.keys.len());
            self.sweeps += 1;
        }
        let e = self
            .keys
            .entry((Arc::clone(table), key.clone()))
            .or_insert((0, 0));
        e.0 += 1;
        e.1 = now + self.wait_ms;
    }

    /// Forgets `k`; an empty map sweeps again at the usual size, not at twice a storm's.
    fn remove(&mut self, k: &(Arc<str>, TableKey)) {
        self.keys.remove(k);
        if self.keys.is_empty() {
            self.sweep_at = REPINS_KEPT;
        }
    }

    /// A re-pin of `key` did not reach the store: no echo will come for it.
    fn not_sent(&mut self, table: &Arc<str>, key: &TableKey) {
        let k = (Arc::clone(table), key.clone());
        if let Some((n, _)) = self.keys.get_mut(&k) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.remove(&k);
            }
        }
    }

    /// A message of `key` came: whether to skip it (one of this instance's re-pins of the
    /// key is still on its way back: the message is its echo, or older).
    fn skip(&mut self, table: &str, key: &TableKey, now: u64) -> bool {
        let k = (Arc::from(table), key.clone());
        match self.keys.get_mut(&k) {
            Some((n, until)) if *until >= now && *n > 0 => {
                *n -= 1;
                if *n == 0 {
                    self.remove(&k);
                }
                true
            }
            Some(_) => {
                self.remove(&k);
                false
            }
            None => false,
        }
    }
}
/// The writer's housekeeping tick (probe, resync, refresh when due).
const TICK: Duration = Duration::from_millis(200);

/// A re-pin: the store's SET and the invalidation message in one atomic step, so messages
/// reach every instance in the order the store applied the SETs.
const REPIN_SCRIPT: &str =
    "redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) redis.call('PUBLISH', ARGV[3], ARGV[4]) return 1";

/// Re-pins not sent to the store: (table, key) to the node, and the node the key had before
/// the first of them.
type RepinsAway = HashMap<(Arc<str>, TableKey), (Arc<str>, Option<Arc<str>>)>;

/// [`Write::Reapply`]: the re-pin's SET and message only if the store holds the former node
/// (`ARGV[5]`, empty for none) or nothing; otherwise the stored node, to adopt. A key of
/// another type holds no node: replaced, as a re-pin's plain SET replaces it (a GET of it
/// failed the script with `WRONGTYPE`, and the re-pin was dropped). `pcall`, not `TYPE`:
/// a store user allowed limpet's commands alone has no `TYPE`.
const REAPPLY_SCRIPT: &str = "local cur = redis.pcall('GET', KEYS[1]) \
if type(cur) == 'table' then cur = false end \
if (not cur) or cur == ARGV[5] then \
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) redis.call('PUBLISH', ARGV[3], ARGV[4]) \
return false end return cur";

/// Why a round trip brought no replies: what became of its commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failed {
    /// They never left this instance: its connection to the store was refused.
    NotSent,
    /// They may have run: sent, and no answer within the bound (the store slow, the
    /// connection cut or half-open), or an error answer. A re-pin among them may come back
    /// as the store's message, late.
    MaybeRan,
}

/// The table's identity of a node named by the store, if it is one of the running config's
/// nodes. A name the table knows from an earlier config (a node a reload removed: names are
/// never dropped) is no more a node to pin than one it never had: adopted, it undid a
/// re-pin made off the removed node (the store still naming it), and the session moved
/// again at its next request.
pub(crate) fn serving(t: &AffinityTable<LruTable>, name: &str) -> Option<NodeRef> {
    t.store().known(name).filter(|r| t.node_of(*r).is_some())
}

/// Pins of one table with their node's name, as sent to the store.
type Pins = Vec<(TableKey, String)>;

/// The entries of one table (shared with every generation that carries it over).
pub(crate) type Entries = Arc<Mutex<AffinityTable<LruTable>>>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What a local write asks of the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    /// A first pin: create-if-absent (`SET NX`), adopt the winner's node if it existed.
    Create,
    /// A re-pin (the node was DOWN, MAINT, unknown): overwrite for the whole fleet.
    Overwrite,
    /// A re-pin made while the store was away, sent once it is back: it overwrites only
    /// what it replaced (the store still holds the node it moved the key from, or nothing);
    /// a store holding another node has a newer re-pin of another instance's, which is
    /// adopted instead.
    Reapply,
}

#[derive(Debug)]
struct Op {
    write: Write,
    table: Arc<str>,
    key: TableKey,
    node: Arc<str>,
    /// A re-pin's former node (what [`Write::Reapply`] compares the store with).
    from: Option<Arc<str>>,
}

#[derive(Debug)]
struct Registered {
    entries: Weak<Mutex<AffinityTable<LruTable>>>,
    expire_ms: u64,
    /// Entries used at or after this instant get their store expiry refreshed next.
    refreshed_ms: u64,
}

/// How many commands go in one pipeline: [`BATCH`] at most, halved after each pipeline that
/// timed out (down to [`BATCH_MIN`]), doubled back after each one of as many commands that
/// came back within a quarter of the timeout. A store, or a link to it, that answers one
/// command within `timeout` but not 512 at once (a narrow link, a store busy with others)
/// failed every resync pipeline: two in a row opened the breaker, the next probe (one
/// command) closed it, and the resync began again from the start, for as long as it lasted.
#[derive(Debug)]
struct Batch(AtomicUsize);

impl Batch {
    fn size(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }

    /// A pipeline of `len` commands was answered after `took` of `timeout` (`None`: it
    /// timed out). One that timed out halves the size only if it held half of it or more:
    /// a shorter one (a probe, a read, a small batch of queued writes) says nothing of the
    /// size, only that the store is slow or away.
    fn came_back(&self, len: usize, took: Option<Duration>, timeout: Duration) {
        let size = self.size();
        let next = match took {
            None if len > BATCH_MIN && len.saturating_mul(2) >= size => (size / 2).max(BATCH_MIN),
            Some(t) if len >= size && t <= timeout / 4 => size.saturating_mul(2).min(BATCH),
            _ => return,
        };
        if next != size {
            tracing::debug!(from = size, to = next, "store pipeline resized");
            self.0.store(next, Ordering::Relaxed);
        }
    }
}

impl Default for Batch {
    fn default() -> Self {
        Batch(AtomicUsize::new(BATCH))
    }
}

/// Counters of store traffic (also in `/metrics` as `limpet_store_ops_total`).
#[derive(Debug, Default)]
struct Counts {
    gets: AtomicU64,
    get_hits: AtomicU64,
    creates: AtomicU64,
    adopted: AtomicU64,
    overwrites: AtomicU64,
    refreshes: AtomicU64,
    invalidations: AtomicU64,
    unknown_nodes: AtomicU64,
    key_errors: AtomicU64,
    republished: AtomicU64,
    resyncs: AtomicU64,
    errors: AtomicU64,
    dropped: AtomicU64,
    subscribe_failures: AtomicU64,
}

/// What the admin API shows of the store (`GET /api/v1/store`).
#[derive(Debug, Clone, Serialize)]
pub struct StoreStatus {
    /// The url, password redacted.
    pub url: String,
    pub prefix: String,
    pub up: bool,
    /// When `up` last changed (ms since the epoch).
    pub since_ms: u64,
    pub timeout_ms: u64,
    /// Shared tables going through the store.
    pub tables: Vec<String>,
    /// Commands sent, by kind.
    pub gets: u64,
    pub get_hits: u64,
    pub creates: u64,
    /// Local entries that took the store's node where it held another: a first pin or a
    /// pin published on the store's return that lost to an earlier writer, or a re-pin
    /// missed and found by the expiry refresh.
    pub adopted: u64,
    pub overwrites: u64,
    pub refreshes: u64,
    /// Re-pins of other instances applied to local entries.
    pub invalidations: u64,
    /// Pins from the store (a message, a GET, a write that lost, a refresh) naming a node
    /// this instance has not got: left alone.
    pub unknown_nodes: u64,
    /// Commands the store refused for their key alone (another type under a pin's key):
    /// skipped, the store still up.
    pub key_errors: u64,
    /// Pins published with create-if-absent after the store was away.
    pub republished: u64,
    /// Full resyncs done (every local pin published: after the store or the subscription
    /// was away, or a table newly shared).
    pub resyncs: u64,
    /// A resync is due or running.
    pub resync_pending: bool,
    pub errors: u64,
    /// Writes dropped while the store was down or its queue full (republished later).
    pub dropped: u64,
    /// Connections limpet itself opened to the store: the first command connection, each
    /// subscription, and each recovery after the breaker opened (a reload opens none).
    pub connections: u64,
    /// The subscription to other instances' re-pins holds now. Without it (a subscription
    /// cut or refused; a store user without the channel has the store down too, its re-pins
    /// publishing there), their re-pins reach this instance only at each key's expiry
    /// refresh, and a session can meanwhile run on two nodes; it is tried again every
    /// second, each failure logged (once per interval).
    pub subscribed: bool,
    /// Subscriptions the store refused (it answered the `SUBSCRIBE` with an error).
    pub subscribe_failures: u64,
    /// Most commands sent in one pipeline now: 512, less after pipelines that timed out
    /// (see `docs/fleet.md`).
    pub pipeline_commands: usize,
}

/// One process's link to the store: a connection manager for commands, a subscription for
/// invalidations, the circuit breaker. Outlives reloads (a reload keeps the connection).
pub struct Store {
    def: StoreDef,
    client: redis::Client,
    /// Replaced by a fresh one when the breaker opens and after each failed probe: the
    /// manager reconnects on a dropped connection, but not on timeouts, so a half-open
    /// connection (a store host gone without a RST) would otherwise be kept for ever.
    conn: Mutex<ConnectionManager>,
    channel: String,
    /// This instance's marker key (`{prefix}instance:{pid}-{start ms}`), written after each
    /// resync: the store without it lost the pins this instance published (`FLUSHALL`, a
    /// restart without its data, eviction), and the instance publishes them again at once
    /// rather than at each key's expiry refresh. One per instance, so one instance's
    /// resync cannot hide the loss from another.
    marker: String,
    ops: mpsc::Sender<Op>,
    up: AtomicBool,
    since_ms: AtomicU64,
    failures: Breaker,
    /// Commands per pipeline.
    batch: Batch,
    /// [`StoreStatus::subscribed`].
    subscribed: AtomicBool,
    /// Pins not published (breaker open, queue full, a missed invalidation): publish every
    /// local pin with create-if-absent when the store is up.
    dirty: AtomicBool,
    /// A resync is running (set before `dirty` is cleared, for [`StoreStatus::resync_pending`]).
    resyncing: AtomicBool,
    /// Re-pins this instance made that did not reach the store (breaker open, queue full, a
    /// failed round trip), by table and key, the latest node each. The resync overwrites
    /// them before it publishes the rest with create-if-absent: a re-pin is newer than what
    /// the store kept from before it, and must not be undone by it (every session of a
    /// failed node would move twice). Bounded by [`REPINS_KEPT`]; past it, a re-pin is
    /// published as a first pin.
    repins_away: Mutex<RepinsAway>,
    /// This instance's re-pins on their way through the store (see [`OwnRepins`]).
    own_repins: Mutex<OwnRepins>,
    /// Keys a first request here is reading from the store ([`Store::fetch`]): how many
    /// reads, and whether a re-pin message of the key came meanwhile.
    fetching: Mutex<Fetching>,
    /// Told of every local entry the store moved off a node (another instance's re-pin, or
    /// the store's node adopted): the node the entry left, and the key. The runtime ends
    /// the session's long-lived connections on that node (`close_on_node_down`), so a
    /// session never lives on two nodes because two instances each held one of its ports.
    left: LeftNode,
    tables: Mutex<HashMap<Arc<str>, Registered>>,
    counts: Counts,
    connections: AtomicU64,
    up_gauge: Gauge,
    op_counters: Family<StoreOpLabels, Counter>,
    stop: watch::Sender<bool>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("def", &self.def)
            .field("up", &self.up.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// See [`Store`]'s `left`: the node a local entry left, and its key.
pub type LeftNode = Box<dyn Fn(&str, KeyRef<'_>) + Send + Sync>;

impl Store {
    /// Connects (one write probe, bounded by `connect_timeout`; a store that is away at
    /// start only opens the breaker) and starts the writer and subscriber tasks. `left` is
    /// told of each local entry the store moves off a node.
    pub async fn start(
        def: StoreDef,
        metrics: &crate::metrics::Metrics,
        left: LeftNode,
    ) -> Result<Arc<Store>, String> {
        let client = redis::Client::open(def.url.as_str())
            .map_err(|e| format!("store {}: {e}", def.redacted_url()))?;
        let conn = Mutex::new(
            manager(&client, &def).map_err(|e| format!("store {}: {e}", def.redacted_url()))?,
        );
        let (tx, rx) = mpsc::channel(QUEUE);
        let (stop, _) = watch::channel(false);
        let (up_gauge, op_counters) = metrics.store_handles();
        let echo_wait = echo_wait_ms(def.timeout);
        let store = Arc::new(Store {
            channel: format!("{}pins", def.prefix),
            marker: format!("{}instance:{}-{}", def.prefix, std::process::id(), now_ms()),
            def,
            client,
            conn,
            ops: tx,
            up: AtomicBool::new(false),
            since_ms: AtomicU64::new(now_ms()),
            failures: Breaker::default(),
            batch: Batch::default(),
            subscribed: AtomicBool::new(false),
            dirty: AtomicBool::new(true),
            resyncing: AtomicBool::new(false),
            repins_away: Mutex::new(HashMap::new()),
            own_repins: Mutex::new(OwnRepins::waiting(echo_wait)),
            fetching: Mutex::new(HashMap::new()),
            left,
            tables: Mutex::new(HashMap::new()),
            counts: Counts::default(),
            connections: AtomicU64::new(0),
            up_gauge,
            op_counters,
            stop,
        });
        match store.probe(store.def.connect_timeout).await {
            Ok(()) => {
                store.connections.fetch_add(1, Ordering::Relaxed);
                store.set_up(true);
                tracing::info!(store = %store.def.redacted_url(), "store connected");
            }
            Err(e) => {
                store.set_up(false);
                tracing::warn!(store = %store.def.redacted_url(), error = %e,
                    "store unavailable at start: serving from local tables until it answers");
            }
        }
        tokio::spawn(writer(Arc::clone(&store), rx));
        tokio::spawn(subscriber(Arc::clone(&store)));
        Ok(store)
    }

    pub fn def(&self) -> &StoreDef {
        &self.def
    }

    /// The command connection (a cheap handle on the shared manager).
    fn conn(&self) -> ConnectionManager {
        lock(&self.conn).clone()
    }

    /// Drops the command connection for a fresh one (connected lazily by the next command).
    fn reconnect(&self) {
        match manager(&self.client, &self.def) {
            Ok(m) => *lock(&self.conn) = m,
            Err(e) => tracing::debug!(error = %e, "store connection not rebuilt"),
        }
    }

    /// Stops the tasks (the process is stopping).
    pub fn stop(&self) {
        let _ = self.stop.send(true);
    }

    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    /// Makes `entries` (a shared table) go through the store. Called once per generation for
    /// the table it finally uses (built, or carried over: then the same entries as before).
    /// Only entries new to the store that already hold pins (a table made shared by a reload)
    /// mark a resync: a reload that changes nothing about the store sends nothing.
    pub(crate) fn register(&self, name: &str, entries: &Entries, expire_ms: u64) {
        let mut t = lock(&self.tables);
        let now = now_ms();
        let e = t.entry(Arc::from(name)).or_insert_with(|| Registered {
            entries: Weak::new(),
            expire_ms,
            refreshed_ms: now,
        });
        if !e.entries.ptr_eq(&Arc::downgrade(entries)) && !lock(entries).store().is_empty() {
            self.dirty.store(true, Ordering::Release);
        }
        e.entries = Arc::downgrade(entries);
        // A new `expire` reaches the store's keys at the next tick, every live entry's: a
        // key's time left was set with the old one, and the next refresh would otherwise
        // come at the new cadence (a key in use lived in the store only as long as the old
        // expiry let it, while the local entry lived on), or the store would keep pins the
        // table dropped for longer than it keeps them.
        if e.expire_ms != expire_ms {
            e.refreshed_ms = 0;
        }
        e.expire_ms = expire_ms;
    }

    /// Pins came into a shared table from outside the store (a snapshot read at start, or a
    /// running limpet's handover): publish every local pin at the writer's next tick, as
    /// after an outage. The start's own resyncs (the writer's first tick, the first
    /// subscription) may have run before they came: a snapshot read on a slow disk lands
    /// seconds later, a handover's pins after the new limpet serves. Unreconciled, a
    /// restored pin the fleet re-pinned meanwhile would route its session elsewhere than
    /// the other instances until its first expiry refresh, up to `expire / 2` later.
    pub(crate) fn pins_restored(&self) {
        self.dirty.store(true, Ordering::Release);
    }

    /// Forgets the tables a reload removed or made local again (`shared`: the tables that
    /// go through the store now), so they are neither refreshed nor published.
    pub(crate) fn retain(&self, shared: &[&str]) {
        lock(&self.tables).retain(|name, _| shared.contains(&&**name));
    }

    /// Queues what a local write asks of the store. Never blocks: with the store down or the
    /// queue full, the pin is published by the resync once the store is back.
    /// `from`: a re-pin's former node.
    pub(crate) fn send(
        &self,
        write: Write,
        table: &Arc<str>,
        key: KeyRef<'_>,
        node: &str,
        from: Option<&str>,
    ) {
        if !self.is_up() && write == Write::Create {
            // Published by the resync with every other local pin; nothing to keep.
            self.dirty.store(true, Ordering::Release);
            self.counts.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let op = Op {
            write,
            table: Arc::clone(table),
            key: key.to_key(),
            node: Arc::from(node),
            from: from.map(Arc::from),
        };
        // Counted before anything can refuse it: each one counted is either not sent
        // (`not_sent` takes it back), or comes back as the store's message, or is forgotten
        // after `ECHO_WAIT_MS`.
        if write == Write::Overwrite {
            lock(&self.own_repins).sent(table, &op.key, now_ms());
        }
        if !self.is_up() {
            self.not_sent(std::slice::from_ref(&op), Failed::NotSent);
            return;
        }
        if let Err(e) = self.ops.try_send(op) {
            let op = match e {
                mpsc::error::TrySendError::Full(op) | mpsc::error::TrySendError::Closed(op) => op,
            };
            self.not_sent(std::slice::from_ref(&op), Failed::NotSent);
        }
    }

    /// `ops` did not reach the store, or may not have (`failed`): the resync publishes the
    /// local pins, and overwrites the re-pins among them first.
    ///
    /// Only re-pins that surely never left stop being awaited as echoes. One that may have
    /// run (its round trip timed out, a slow store) is awaited still: the store ran it and
    /// publishes it late, and applied as another instance's, its echo would move the entry
    /// back to an older node and end the session on the node it holds. If it did not run,
    /// it holds back the key's messages for at most `ECHO_WAIT_MS`, and the resync, which
    /// compares the store with the node it replaced, settles the key either way.
    ///
    /// A round trip that timed out marks the resync too, although the store is slow: a
    /// write whose fate is unknown is only reconciled by one (a create that did not run
    /// would leave the key to other instances' fresh choices until its expiry refresh), and
    /// its writes (create-if-absent, compare-and-set) are right whether the write ran or
    /// not. A store still too slow fails its next round trip (the liveness check, or the
    /// resync's first), the second failure in a row, which opens the breaker: it is not sent
    /// the whole table meanwhile.
    fn not_sent(&self, ops: &[Op], failed: Failed) {
        if failed == Failed::NotSent {
            let mut own = lock(&self.own_repins);
            for op in ops.iter().filter(|op| op.write == Write::Overwrite) {
                own.not_sent(&op.table, &op.key);
            }
        }
        self.dirty.store(true, Ordering::Release);
        self.counts
            .dropped
            .fetch_add(ops.len() as u64, Ordering::Relaxed);
        let mut away = lock(&self.repins_away);
        for op in ops.iter().filter(|op| op.write != Write::Create) {
            let k = (Arc::clone(&op.table), op.key.clone());
            let room = away.len() < REPINS_KEPT;
            match away.get_mut(&k) {
                // Moved again: the latest node, and still the node before the first move.
                Some(e) => e.0 = Arc::clone(&op.node),
                None if room => {
                    away.insert(k, (Arc::clone(&op.node), op.from.clone()));
                }
                None => {}
            }
        }
    }

    /// The re-pins made while the store was away that the local table still holds (an
    /// entry moved again or gone since has nothing to overwrite), sent as
    /// [`Write::Reapply`]: the store takes them over the node they replaced, every instance
    /// hears of them, and a newer re-pin another instance stored meanwhile is adopted. False
    /// if a round trip failed (they are kept for the next resync).
    async fn overwrite_repins(&self) -> bool {
        let away: RepinsAway = std::mem::take(&mut *lock(&self.repins_away));
        let now = now_ms();
        let ops: Vec<Op> = away
            .into_iter()
            .filter(|((table, key), (node, _))| {
                self.entries(table).is_some_and(|e| {
                    let t = lock(&e);
                    let s = t.store();
                    s.peek(key.as_key_ref(), now)
                        .and_then(|r| s.node_name(r))
                        .is_some_and(|n| n == &**node)
                })
            })
            .map(|((table, key), (node, from))| Op {
                write: Write::Reapply,
                table,
                key,
                node,
                from,
            })
            .collect();
        let mut rest = &ops[..];
        while !rest.is_empty() {
            let (chunk, after) = rest.split_at(rest.len().min(self.batch.size()));
            if let Err(failed) = self.write(chunk).await {
                self.not_sent(rest, failed);
                return false;
            }
            rest = after;
        }
        true
    }

    /// A first request's read of `key` in `table` ([`crate::runtime::Table::prefetch`]),
    /// told of the re-pin messages of the key that come meanwhile (`apply` finds no local
    /// entry to move for them).
    pub(crate) fn reading(&self, table: &str, key: KeyRef<'_>) -> Reading<'_> {
        Reading::start(&self.fetching, (Arc::from(table), key.to_key()))
    }

    /// The fleet's pin of `key` for a key this instance has no entry for (the first request
    /// of a session here: a failover of the virtual IP, or the other protocol's port on
    /// another instance): one GETEX (renewing the key's expiry) bounded by `timeout`; `None`
    /// when the store has none, is down or too slow (then the request is routed fresh and the
    /// pin reconciled by the create-if-absent write).
    pub(crate) async fn read_pin(&self, table: &str, key: KeyRef<'_>) -> Option<String> {
        if !self.is_up() {
            return None;
        }
        let rkey = self.key(table, key);
        let mut conn = self.conn();
        self.count("get", 1);
        self.counts.gets.fetch_add(1, Ordering::Relaxed);
        // GETEX, not GET: the pin is in use again from now (here), so its key gets the whole
        // expiry, as a use's refresh would give it. Read with GET, it kept the time the last
        // instance to use it left, and this instance's first refresh of it comes up to
        // `expire / 2` later: the key could expire meanwhile, and a first request through
        // another instance (the session's other port) pin the client afresh, elsewhere. A
        // table a reload made local or removed (a request of the generation before it) only
        // reads: its expiry is not this instance's to set.
        let px = self.registered_expire_ms(table);
        let mut read = redis::cmd(if px.is_some() { "GETEX" } else { "GET" });
        read.arg(&rkey);
        if let Some(px) = px {
            read.arg("PX").arg(px);
        }
        let r = tokio::time::timeout(
            self.def.timeout,
            read.query_async::<Option<Vec<u8>>>(&mut conn),
        )
        .await;
        match r {
            Ok(Ok(v)) => {
                self.success(Way::Read);
                // A value that is not text names no node either: it goes the way of any
                // unknown node's (counted, and overwritten by this instance's create), not
                // passed over, which kept every instance's own choice of the key for good.
                let name = v.map(|b| String::from_utf8_lossy(&b).into_owned())?;
                self.counts.get_hits.fetch_add(1, Ordering::Relaxed);
                Some(name)
            }
            Ok(Err(e)) if e.code().is_some_and(key_error) => {
                self.success(Way::Read);
                self.key_error("GET", &e.to_string());
                None
            }
            Ok(Err(e)) => {
                self.failure(Way::Read, "GET", &e.to_string());
                None
            }
            Err(_) => {
                self.failure(Way::Read, "GET", "timed out");
                None
            }
        }
    }

    pub fn status(&self) -> StoreStatus {
        let c = &self.counts;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut tables: Vec<String> = lock(&self.tables).keys().map(|k| k.to_string()).collect();
        tables.sort();
        StoreStatus {
            url: self.def.redacted_url(),
            prefix: self.def.prefix.clone(),
            up: self.is_up(),
            since_ms: self.since_ms.load(Ordering::Relaxed),
            timeout_ms: u64::try_from(self.def.timeout.as_millis()).unwrap_or(u64::MAX),
            tables,
            gets: g(&c.gets),
            get_hits: g(&c.get_hits),
            creates: g(&c.creates),
            adopted: g(&c.adopted),
            unknown_nodes: g(&c.unknown_nodes),
            key_errors: g(&c.key_errors),
            overwrites: g(&c.overwrites),
            refreshes: g(&c.refreshes),
            invalidations: g(&c.invalidations),
            republished: g(&c.republished),
            resyncs: g(&c.resyncs),
            resync_pending: self.dirty.load(Ordering::SeqCst)
                || self.resyncing.load(Ordering::SeqCst),
            errors: g(&c.errors),
            dropped: g(&c.dropped),
            connections: g(&self.connections),
            subscribed: self.subscribed.load(Ordering::Acquire),
            subscribe_failures: g(&c.subscribe_failures),
            pipeline_commands: self.batch.size(),
        }
    }

    /// `{prefix}{table}:{key}`: `ip:10.0.0.7`, `b:` and the value's bytes, `d:` and a
    /// digest in hex.
    fn key(&self, table: &str, key: KeyRef<'_>) -> Vec<u8> {
        let mut k = Vec::with_capacity(self.def.prefix.len() + table.len() + 48);
        k.extend_from_slice(self.def.prefix.as_bytes());
        k.extend_from_slice(table.as_bytes());
        k.push(b':');
        encode_key(key, &mut k);
        k
    }

    /// A pin from the store names a node this instance has not got (another instance's
    /// config, or anyone who can write the store): left alone, counted, and logged once per
    /// interval. It must not add a name (the list only grows).
    pub(crate) fn unknown_node(&self, name: &str) {
        self.counts.unknown_nodes.fetch_add(1, Ordering::Relaxed);
        self.count("unknown-node", 1);
        UNKNOWN_NODES.note_with(|| format!("node {:?}", name.chars().take(64).collect::<String>()));
    }

    /// The store answered one command with an error about its key alone ([`key_error`]):
    /// counted, and logged once per interval.
    fn key_error(&self, what: &str, err: &str) {
        self.counts.key_errors.fetch_add(1, Ordering::Relaxed);
        self.count("key-error", 1);
        KEY_ERRORS.note_with(|| format!("{what}: {}", err.chars().take(200).collect::<String>()));
    }

    fn count(&self, op: &'static str, n: u64) {
        self.op_counters
            .get_or_create(&StoreOpLabels { op })
            .inc_by(n);
    }

    pub(crate) fn set_up(&self, up: bool) {
        self.up.store(up, Ordering::Release);
        self.since_ms.store(now_ms(), Ordering::Relaxed);
        self.up_gauge.set(i64::from(up));
    }

    fn success(&self, way: Way) {
        self.failures.success(way);
    }

    /// A failed round trip; the second in a row of its way opens the breaker (logged once).
    fn failure(&self, way: Way, what: &str, err: &str) {
        self.counts.errors.fetch_add(1, Ordering::Relaxed);
        self.count("error", 1);
        if self.failures.failure(way) && self.up.swap(false, Ordering::AcqRel) {
            self.set_up(false);
            self.dirty.store(true, Ordering::Release);
            self.reconnect();
            tracing::warn!(store = %self.def.redacted_url(), op = what, error = err,
                "store unavailable: serving from local tables; pins are published when it is back");
        } else {
            tracing::debug!(op = what, error = err, "store operation failed");
        }
    }

    /// Whether the store still holds this instance's marker (one round trip, the up store's
    /// liveness check too). `PEXPIRE` renews it as it checks, so a running instance's marker
    /// never expires, and counts as a use under an LRU or LFU eviction policy.
    async fn holds_marker(&self, limit: Duration) -> Result<bool, String> {
        let mut conn = self.conn();
        match tokio::time::timeout(
            limit,
            redis::cmd("PEXPIRE")
                .arg(&self.marker)
                .arg(MARKER_PX)
                .query_async::<u64>(&mut conn),
        )
        .await
        {
            Ok(Ok(n)) => Ok(n > 0),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("timed out".into()),
        }
    }

    /// Writes this instance's marker (after a resync published its pins); it expires after
    /// [`MARKER_PX`], so a stopped instance's goes by itself.
    async fn set_marker(&self) {
        let mut conn = self.conn();
        let _ = tokio::time::timeout(
            self.def.timeout,
            redis::cmd("SET")
                .arg(&self.marker)
                .arg(1)
                .arg("PX")
                .arg(MARKER_PX)
                .query_async::<Value>(&mut conn),
        )
        .await;
    }

    /// Whether the store takes writes, and every command limpet sends it: a write that
    /// changes nothing but this instance's marker's expiry (`SET marker 1 PX .. XX`: renewed
    /// if it is there, not made if it is not, so the marker still tells whether a resync's
    /// pins are in the store), then, in the same round trip, the other commands of the
    /// writes and reads (`GETEX` of the marker, an `EVAL` that publishes an empty message on
    /// the re-pin channel, as a re-pin's script does, which every instance drops, and
    /// `SET .. NX GET` of a probe key of the instance's own, which lives a second). A `PING`
    /// answers on a store that refuses writes (a read-only replica, out of memory, a failed
    /// save with `stop-writes-on-bgsave-error`), and a `SET` on one that refuses a command
    /// limpet needs (an ACL user without `eval`, `getex` or the re-pin channel, a Redis older
    /// than 7.0): the breaker closed on it, the next writes failed and opened it again, every
    /// second or two for as long as the store refused, and a refused re-pin kept every resync
    /// from publishing.
    async fn probe(&self, limit: Duration) -> Result<(), String> {
        let mut conn = self.conn();
        let mut probe = pipeline();
        probe
            .cmd("SET")
            .arg(&self.marker)
            .arg(1)
            .arg("PX")
            .arg(MARKER_PX)
            .arg("XX")
            .cmd("GETEX")
            .arg(&self.marker)
            .cmd("EVAL")
            .arg("redis.call('PUBLISH', ARGV[1], '') return 1")
            .arg(0)
            .arg(&self.channel)
            .cmd("SET")
            .arg(format!("{}:probe", self.marker))
            .arg(1)
            .arg("NX")
            .arg("GET")
            .arg("PX")
            .arg(PROBE_EVERY.as_millis().to_string());
        match tokio::time::timeout(limit, probe.query_async::<Vec<Value>>(&mut conn)).await {
            Ok(Ok(replies)) => match replies.iter().find_map(|r| match r {
                Value::ServerError(e) => Some(e.to_string()),
                _ => None,
            }) {
                Some(e) => Err(e),
                None => Ok(()),
            },
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("timed out".into()),
        }
    }

    /// The entries of a registered table.
    fn entries(&self, table: &str) -> Option<Entries> {
        lock(&self.tables)
            .get(table)
            .and_then(|r| r.entries.upgrade())
    }

    fn expire_ms(&self, table: &str) -> u64 {
        self.registered_expire_ms(table).unwrap_or(1)
    }

    /// The `expire` of a table that goes through the store now.
    fn registered_expire_ms(&self, table: &str) -> Option<u64> {
        lock(&self.tables).get(table).map(|r| r.expire_ms)
    }

    /// The store had another node for a key this instance created (or published) with
    /// `tried`: the local entry takes it, unless the entry moved on meanwhile, or `tried` is
    /// a re-pin of this instance the store has not taken yet ([`Self::repins_away`]: newer
    /// than what the store holds, which the resync overwrites, or adopts a newer re-pin
    /// of another instance's). Before, an expiry refresh that read the key while the store
    /// refused writes, or a resync's page that met a re-pin the full queue had not taken,
    /// put the old node back: the session moved twice, its connections on the new node
    /// ended.
    ///
    /// A winner naming a node this instance has not got is not adopted; with `heal` (the
    /// answer to this instance's own create, or a publication after an outage) this
    /// instance's node overwrites it for the fleet, so that every instance routes the key
    /// alike: a pin written by an instance of another config, or by hand, would otherwise
    /// split the session between the instances that lack its node, for as long as it is used.
    fn adopt(&self, table: &Arc<str>, key: KeyRef<'_>, tried: &str, winner: &[u8], heal: bool) {
        let Some(entries) = self.entries(table) else {
            return;
        };
        // Not text: no node's name, healed as an unknown node's ([`Self::read_pin`]).
        let winner = String::from_utf8_lossy(winner);
        let winner = &*winner;
        if winner == tried {
            return;
        }
        let unsent_repin = lock(&self.repins_away)
            .get(&(Arc::clone(table), key.to_key()))
            .is_some_and(|(node, _)| &**node == tried);
        if unsent_repin {
            return;
        }
        let now = now_ms();
        let adopted = {
            let mut t = lock(&entries);
            let s = t.store();
            let current = s.peek(key, now).and_then(|r| s.node_name(r));
            if current != Some(tried) {
                return;
            }
            let w = serving(&t, winner);
            if let Some(w) = w {
                t.store_mut().put(key, w, now);
            }
            w.is_some()
        };
        if !adopted {
            self.unknown_node(winner);
            if heal {
                self.send(Write::Overwrite, table, key, tried, Some(winner));
            }
            return;
        }
        self.counts.adopted.fetch_add(1, Ordering::Relaxed);
        self.count("adopt", 1);
        (self.left)(tried, key);
    }

    /// Another instance (or this one) re-pinned `key`: a local entry follows; a key this
    /// instance has no entry for is left to the GET of its first request here.
    pub(crate) fn apply(&self, payload: &[u8]) {
        let mut parts = payload.splitn(3, |b| *b == b'\n');
        let (Some(table), Some(node), Some(k)) = (parts.next(), parts.next(), parts.next()) else {
            return;
        };
        let (Ok(table), Ok(node)) = (std::str::from_utf8(table), std::str::from_utf8(node)) else {
            return;
        };
        let (Some(entries), Some(key)) = (self.entries(table), decode_key(k)) else {
            return;
        };
        let now = now_ms();
        let left = {
            let mut t = lock(&entries);
            // Decided under the table's lock, which a local re-pin holds from its put to its
            // `sent` (`runtime::Table::published`). Decided before it, a message taken for
            // another instance's re-pin could be applied after a local re-pin of the key made
            // meanwhile, which the store runs after the message's: the entry back on the
            // message's node (the session's connections on the newer one ended), the local
            // re-pin's echo skipped, and the fleet on the newer node, until the key's
            // expiry refresh.
            if lock(&self.own_repins).skip(table, &key, now) {
                return;
            }
            let s = t.store();
            let Some(current) = s.peek(key.as_key_ref(), now) else {
                // A first request here may be reading the key: its answer may be older. Told
                // under the table's lock, under which that request looks.
                let mut reads = lock(&self.fetching);
                if !reads.is_empty() {
                    if let Some(r) = reads.get_mut(&(Arc::from(table), key)) {
                        r.1 += 1;
                    }
                }
                return;
            };
            let was = s.node_name(current).map(str::to_owned);
            if was.as_deref() == Some(node) {
                return;
            }
            let Some(r) = serving(&t, node) else {
                drop(t);
                self.unknown_node(node);
                return;
            };
            t.store_mut().put(key.as_key_ref(), r, now);
            was
        };
        self.counts.invalidations.fetch_add(1, Ordering::Relaxed);
        self.count("invalidation", 1);
        if let Some(was) = left {
            (self.left)(&was, key.as_key_ref());
        }
    }

    /// Sends one batch of writes as one pipeline.
    async fn write(&self, ops: &[Op]) -> Result<(), Failed> {
        let mut pipe = pipeline();
        for op in ops {
            let k = self.key(&op.table, op.key.as_key_ref());
            let px = self.expire_ms(&op.table);
            match op.write {
                Write::Create => {
                    pipe.cmd("SET")
                        .arg(k)
                        .arg(op.node.as_bytes())
                        .arg("NX")
                        .arg("PX")
                        .arg(px)
                        .arg("GET");
                }
                Write::Overwrite | Write::Reapply => {
                    let mut msg = Vec::with_capacity(64);
                    msg.extend_from_slice(op.table.as_bytes());
                    msg.push(b'\n');
                    msg.extend_from_slice(op.node.as_bytes());
                    msg.push(b'\n');
                    encode_key(op.key.as_key_ref(), &mut msg);
                    let script = if op.write == Write::Reapply {
                        REAPPLY_SCRIPT
                    } else {
                        REPIN_SCRIPT
                    };
                    pipe.cmd("EVAL")
                        .arg(script)
                        .arg(1)
                        .arg(k)
                        .arg(op.node.as_bytes())
                        .arg(px)
                        .arg(&self.channel)
                        .arg(msg);
                    if op.write == Write::Reapply {
                        pipe.arg(op.from.as_deref().unwrap_or("").as_bytes());
                    }
                }
            }
        }
        let creates = ops.iter().filter(|o| o.write == Write::Create).count() as u64;
        let overwrites = ops.len() as u64 - creates;
        let replies = self.round_trip(&pipe, "write").await?;
        self.counts.creates.fetch_add(creates, Ordering::Relaxed);
        self.counts
            .overwrites
            .fetch_add(overwrites, Ordering::Relaxed);
        self.count("create", creates);
        self.count("overwrite", overwrites);
        for (op, v) in ops.iter().zip(&replies) {
            match v {
                // Refused for its key alone (counted by `round_trip`): it did not run, and
                // no echo of it comes.
                Value::ServerError(_) if op.write == Write::Overwrite => {
                    lock(&self.own_repins).not_sent(&op.table, &op.key);
                }
                Value::BulkString(b) if op.write != Write::Overwrite => {
                    self.adopt(&op.table, op.key.as_key_ref(), &op.node, b, true);
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// One pipeline, bounded by `timeout`. Its commands count as not sent only when the
    /// connection was refused: any other failure (a timeout above all) may come after the
    /// store ran them.
    ///
    /// Each reply is judged on its own (the pipeline is built by [`pipeline`], which keeps
    /// error replies in place): an error about one command's key ([`key_error`]) is that
    /// key's, counted and logged, and left in the replies for the caller to skip; any other
    /// error reply is the store refusing writes, and fails the round trip. (One `WRONGTYPE`
    /// used to fail the whole pipeline, drop every reply in it and count toward the
    /// breaker, whose probe then closed it: it flapped for as long as the key was used.)
    async fn round_trip(&self, pipe: &redis::Pipeline, what: &str) -> Result<Vec<Value>, Failed> {
        let mut conn = self.conn();
        let sent = tokio::time::Instant::now();
        let answer =
            tokio::time::timeout(self.def.timeout, pipe.query_async::<Vec<Value>>(&mut conn)).await;
        match &answer {
            Ok(Ok(_)) => self
                .batch
                .came_back(pipe.len(), Some(sent.elapsed()), self.def.timeout),
            // The manager's own timeout ([`response_timeout`]) comes first.
            Ok(Err(e)) if e.is_timeout() => {
                self.batch.came_back(pipe.len(), None, self.def.timeout);
            }
            Err(_) => self.batch.came_back(pipe.len(), None, self.def.timeout),
            Ok(Err(_)) => {}
        }
        match answer {
            Ok(Ok(v)) => {
                let refused = v.iter().find_map(|r| match r {
                    Value::ServerError(e) if !key_error(e.code()) => Some(e),
                    _ => None,
                });
                if let Some(e) = refused {
                    self.failure(Way::Write, what, &e.to_string());
                    return Err(Failed::MaybeRan);
                }
                self.success(Way::Write);
                for r in &v {
                    if let Value::ServerError(e) = r {
                        self.key_error(what, &e.to_string());
                    }
                }
                Ok(v)
            }
            Ok(Err(e)) => {
                self.failure(Way::Write, what, &e.to_string());
                Err(if e.is_connection_refusal() {
                    Failed::NotSent
                } else {
                    Failed::MaybeRan
                })
            }
            Err(_) => {
                self.failure(Way::Write, what, "timed out");
                Err(Failed::MaybeRan)
            }
        }
    }

    /// Writes what is queued now (`rx`: the writer's queue), a batch at a time. False if a
    /// round trip failed.
    ///
    /// Called after local pins are read and before the round trip that compares them with
    /// the store: a re-pin made before the read is queued by then (a local write queues its
    /// store write under the table lock), and reaches the store first. Read back before it,
    /// the store's older node would be adopted over the re-pin (the entry still holding the
    /// node that was read), ending the session's connections on the node it moved to, and the
    /// re-pin's own write, applied after, left the store and this instance on two nodes.
    /// A re-pin made after the read moved the entry off what was read, which
    /// [`adopt`](Self::adopt) leaves alone.
    async fn flush(&self, rx: &mut mpsc::Receiver<Op>) -> bool {
        // What is queued now, no more: a storm of new writes does not hold the caller.
        let mut left = rx.len();
        let mut batch = Vec::with_capacity(left.min(BATCH));
        while left > 0 {
            while batch.len() < self.batch.size().min(left) {
                match rx.try_recv() {
                    Ok(op) => batch.push(op),
                    Err(_) => break,
                }
            }
            if batch.is_empty() {
                break;
            }
            left -= batch.len();
            let written = self.write(&batch).await;
            if let Err(failed) = written {
                self.not_sent(&batch, failed);
                return false;
            }
            batch.clear();
        }
        true
    }

    /// Publishes `pins` of `table` with create-if-absent, adopting the store's node where it
    /// had another. False if a round trip failed. The writes queued meanwhile go first
    /// ([`flush`](Self::flush)).
    async fn publish(&self, table: &Arc<str>, pins: Pins, rx: &mut mpsc::Receiver<Op>) -> bool {
        let px = self.expire_ms(table);
        let mut rest = &pins[..];
        while !rest.is_empty() {
            let (chunk, after) = rest.split_at(rest.len().min(self.batch.size()));
            rest = after;
            if !self.flush(rx).await {
                return false;
            }
            let mut pipe = pipeline();
            for (key, node) in chunk {
                pipe.cmd("SET")
                    .arg(self.key(table, key.as_key_ref()))
                    .arg(node.as_bytes())
                    .arg("NX")
                    .arg("PX")
                    .arg(px)
                    .arg("GET");
            }
            let Ok(replies) = self.round_trip(&pipe, "publish").await else {
                return false;
            };
            self.counts
                .republished
                .fetch_add(chunk.len() as u64, Ordering::Relaxed);
            self.count("create", chunk.len() as u64);
            for ((key, node), v) in chunk.iter().zip(&replies) {
                if let Value::BulkString(b) = v {
                    self.adopt(table, key.as_key_ref(), node, b, true);
                }
            }
        }
        true
    }

    /// The shared tables' live entries.
    fn registered(&self) -> Vec<(Arc<str>, Entries)> {
        lock(&self.tables)
            .iter()
            .filter_map(|(n, r)| Some((Arc::clone(n), r.entries.upgrade()?)))
            .collect()
    }

    /// After the store was away (or missed invalidations): publish every local pin with
    /// create-if-absent; where the store had another node, take it. The fleet converges on
    /// the first writer's node. The pins are read a chunk at a time, the table locked only
    /// for the chunk, so routing never waits for a whole big table ([`page_down`]); an entry
    /// added or moved meanwhile went to the store by its own write.
    async fn resync(&self, rx: &mut mpsc::Receiver<Op>) {
        self.resyncing.store(true, Ordering::SeqCst);
        self.dirty.store(false, Ordering::SeqCst);
        let done = self.overwrite_repins().await && self.publish_all(rx).await;
        self.resyncing.store(false, Ordering::SeqCst);
        if done {
            self.set_marker().await;
            self.counts.resyncs.fetch_add(1, Ordering::Relaxed);
            tracing::info!(store = %self.def.redacted_url(), "local pins published to the store");
        } else {
            self.dirty.store(true, Ordering::SeqCst);
        }
    }

    /// The resync's work: false if a round trip failed.
    async fn publish_all(&self, rx: &mut mpsc::Receiver<Op>) -> bool {
        for (table, entries) in self.registered() {
            let mut below = usize::MAX;
            loop {
                let (pins, more) = page_down(&entries, &mut below, BATCH, 0, now_ms());
                if !pins.is_empty() && !self.publish(&table, pins, rx).await {
                    return false;
                }
                if !more {
                    break;
                }
            }
        }
        true
    }

    /// Lazy expiry refresh: per table every `expire / 2`, one `GETEX key PX expire` per entry
    /// used since the last refresh (pipelined), so a key in use never has less than half its
    /// expiry left in the store and a sticky request never writes. The reply is the stored
    /// node: another one than the local entry's means a re-pin this instance missed (a lost
    /// message), and the local entry takes it unless it moved meanwhile. A key the store lost
    /// (expired, restarted empty) is published again with create-if-absent.
    async fn refresh_due(&self, rx: &mut mpsc::Receiver<Op>) {
        let now = now_ms();
        let due: Vec<(Arc<str>, Entries, u64, u64)> = lock(&self.tables)
            .iter()
            .filter(|(_, r)| now.saturating_sub(r.refreshed_ms) >= (r.expire_ms / 2).max(100))
            .filter_map(|(n, r)| {
                Some((
                    Arc::clone(n),
                    r.entries.upgrade()?,
                    r.refreshed_ms,
                    r.expire_ms,
                ))
            })
            .collect();
        for (table, entries, since, px) in due {
            let mut missing = Vec::new();
            let mut below = usize::MAX;
            loop {
                let (pins, more) = page_down(&entries, &mut below, REFRESH_PAGE, since, now);
                let mut rest = &pins[..];
                while !rest.is_empty() {
                    let (chunk, after) = rest.split_at(rest.len().min(self.batch.size()));
                    rest = after;
                    // Re-pins made before the read go first ([`Store::flush`]).
                    if !self.flush(rx).await {
                        return;
                    }
                    let mut pipe = pipeline();
                    for (key, _) in chunk {
                        pipe.cmd("GETEX")
                            .arg(self.key(&table, key.as_key_ref()))
                            .arg("PX")
                            .arg(px);
                    }
                    let Ok(replies) = self.round_trip(&pipe, "refresh").await else {
                        return;
                    };
                    self.counts
                        .refreshes
                        .fetch_add(chunk.len() as u64, Ordering::Relaxed);
                    self.count("refresh", chunk.len() as u64);
                    for (pin, v) in chunk.iter().zip(&replies) {
                        match v {
                            Value::BulkString(stored) => {
                                self.adopt(&table, pin.0.as_key_ref(), &pin.1, stored, false);
                            }
                            Value::Nil => missing.push(pin.clone()),
                            _ => {}
                        }
                    }
                }
                if !more {
                    break;
                }
            }
            if !missing.is_empty() && !self.publish(&table, missing, rx).await {
                return;
            }
            if let Some(r) = lock(&self.tables).get_mut(&table) {
                // A reload that changed `expire` meanwhile asked for a refresh of every key
                // with the new one (`register`): this one went out with the old.
                if r.expire_ms == px {
                    r.refreshed_ms = now;
                }
            }
        }
    }
}

/// The next page of a table's pins for work over the whole table (the resync's publication,
/// the expiry refresh): the live entries used since `since_ms` at the `limit` positions
/// below `below` (`usize::MAX` to start), which moves down to the page's start; whether any
/// position is left below. The table is locked only for the page (read whole, a million
/// entries held it about 100 ms, and every request to it waited), and read from the slab's
/// end down: a removal between pages moves the last entry, already read, into its hole, so
/// no entry that stays is missed (one is read twice at most; one put during the walk went to
/// the store by its own write). Read upwards, as the publication once was, each removal in
/// a page already read (an eviction for a new client, an expiry, an admin delete) moved an
/// unread entry there, and that pin was never published. Entries naming a node a reload
/// removed are left out: their next use re-pins them, and published they would be made in
/// the store again.
fn page_down(
    entries: &Entries,
    below: &mut usize,
    limit: usize,
    since_ms: u64,
    now_ms: u64,
) -> (Pins, bool) {
    let t = lock(entries);
    let s = t.store();
    let end = (*below).min(s.len());
    let start = end.saturating_sub(limit);
    let pins = s
        .used_at(start, end - start, since_ms, now_ms)
        .into_iter()
        .filter(|(_, r, _)| t.node_of(*r).is_some())
        .filter_map(|(k, r, _)| Some((k, s.node_name(r)?.to_owned())))
        .collect();
    *below = start;
    (pins, start > 0)
}

/// The writer: batches of queued writes, and the housekeeping (probe while down, resync,
/// expiry refresh).
async fn writer(store: Arc<Store>, mut rx: mpsc::Receiver<Op>) {
    let mut stop = store.stop.subscribe();
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_probe = tokio::time::Instant::now();
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        tokio::select! {
            () = crate::runtime::stopped(&mut stop) => return,
            n = rx.recv_many(&mut batch, store.batch.size()) => {
                if n == 0 {
                    return;
                }
                if !store.is_up() {
                    store.not_sent(&batch, Failed::NotSent);
                } else if let Err(failed) = store.write(&batch).await {
                    store.not_sent(&batch, failed);
                }
                batch.clear();
            }
            _ = tick.tick() => {
                if !store.is_up() {
                    if last_probe.elapsed() >= PROBE_EVERY {
                        last_probe = tokio::time::Instant::now();
                        if store.probe(store.def.timeout.max(store.def.connect_timeout)).await.is_ok() {
                            store.failures.reset();
                            store.connections.fetch_add(1, Ordering::Relaxed);
                            store.set_up(true);
                            tracing::info!(store = %store.def.redacted_url(),
                                "store available again: publishing the pins made meanwhile");
                        } else {
                            // The next probe on a fresh connection: this one may be half-open.
                            store.reconnect();
                        }
                    }
                    continue;
                }
                // An idle store is checked every second, so a dead one is noticed (and
                // shown) before a request needs it.
                if last_probe.elapsed() >= PROBE_EVERY {
                    last_probe = tokio::time::Instant::now();
                    match store.holds_marker(store.def.timeout).await {
                        Ok(true) => store.success(Way::Read),
                        Ok(false) => {
                            store.success(Way::Read);
                            let pending = store.dirty.swap(true, Ordering::AcqRel)
                                || store.resyncing.load(Ordering::Acquire);
                            if !pending && store.counts.resyncs.load(Ordering::Relaxed) > 0 {
                                tracing::warn!(store = %store.def.redacted_url(),
                                    "the store lost this instance's pins (flushed, or restarted without its data): publishing them again");
                            }
                        }
                        Err(e) => store.failure(Way::Read, "PEXPIRE", &e),
                    }
                    if !store.is_up() {
                        continue;
                    }
                }
                if store.dirty.load(Ordering::Acquire) {
                    store.resync(&mut rx).await;
                }
                // Not once the resync's failure opened the breaker: no store I/O while it is
                // open.
                if store.is_up() {
                    store.refresh_due(&mut rx).await;
                }
            }
        }
    }
}

/// The subscriber: applies every re-pin message. Every subscription, the first included,
/// marks the local pins for a resync: a re-pin published before it (between the start's
/// resync and the SUBSCRIBE, or while the last one was cut) was missed. The subscription is
/// pinged every second; one that does not answer within `max(timeout, connect_timeout)`
/// (half-open: the store's host gone without a RST) is dropped and made again, so a lost
/// subscription is noticed within about a second plus that bound.
async fn subscriber(store: Arc<Store>) {
    let mut stop = store.stop.subscribe();
    let check = store.def.timeout.max(store.def.connect_timeout);
    loop {
        let sub = async {
            let ps =
                tokio::time::timeout(store.def.connect_timeout, store.client.get_async_pubsub())
                    .await
                    .map_err(|_| "timed out".to_owned())?
                    .map_err(|e| e.to_string())?;
            let (mut sink, msgs) = ps.split();
            match tokio::time::timeout(store.def.connect_timeout, sink.subscribe(&store.channel))
                .await
            {
                Err(_) => return Err("timed out".to_owned()),
                // The store answered, with a refusal (`NOPERM`: an ACL user without the
                // channel): said, as a store that is up all the same.
                Ok(Err(e)) if e.code().is_some() => {
                    store
                        .counts
                        .subscribe_failures
                        .fetch_add(1, Ordering::Relaxed);
                    let text = e.to_string();
                    // The channel hint only where it helps: not for a password or a load.
                    let log = if e.code() == Some("NOPERM") {
                        &SUBSCRIBE_ERRORS
                    } else {
                        &SUBSCRIBE_REFUSED
                    };
                    log.note_with(|| text.chars().take(200).collect());
                    return Err(text);
                }
                Ok(Err(e)) => return Err(e.to_string()),
                Ok(Ok(())) => {}
            }
            Ok::<_, String>((sink, msgs))
        };
        let ps = tokio::select! {
            () = crate::runtime::stopped(&mut stop) => return,
            r = sub => r,
        };
        match ps {
            Ok((mut sink, mut msgs)) => {
                store.dirty.store(true, Ordering::SeqCst);
                store.connections.fetch_add(1, Ordering::Relaxed);
                store.subscribed.store(true, Ordering::Release);
                let mut ping = tokio::time::interval(PROBE_EVERY);
                ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                ping.tick().await;
                loop {
                    tokio::select! {
                        () = crate::runtime::stopped(&mut stop) => return,
                        m = msgs.next() => match m {
                            Some(m) => store.apply(m.get_payload_bytes()),
                            None => break,
                        },
                        _ = ping.tick() => {
                            match tokio::time::timeout(check, sink.ping::<Value>()).await {
                                Ok(Ok(_)) => {}
                                Ok(Err(e)) => {
                                    tracing::debug!(error = %e, "store subscription ping failed");
                                    break;
                                }
                                Err(_) => {
                                    tracing::debug!("store subscription ping timed out");
                                    break;
                                }
                            }
                        }
                    }
                }
                store.subscribed.store(false, Ordering::Release);
                tracing::debug!("store subscription lost");
            }
            Err(e) => tracing::debug!(error = %e, "store subscription failed"),
        }
        tokio::select! {
            () = crate::runtime::stopped(&mut stop) => return,
            () = tokio::time::sleep(PROBE_EVERY) => {}
        }
    }
}

/// A pipeline whose error replies stay in place among the others (see
/// [`Store::round_trip`]): without it, one error reply fails the whole pipeline.
fn pipeline() -> redis::Pipeline {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    pipe
}

/// The command connection: connects lazily, bounded by `connect_timeout`. Its own response
/// timeout is a fifth shorter than `timeout`, the bound every caller puts around a round
/// trip, so the manager's error (and its reconnect on a dropped connection) comes first.
fn manager(client: &redis::Client, def: &StoreDef) -> redis::RedisResult<ConnectionManager> {
    let cfg = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(def.connect_timeout))
        .set_response_timeout(Some(response_timeout(def.timeout)))
        .set_number_of_retries(1)
        .set_max_delay(Duration::from_secs(1));
    ConnectionManager::new_lazy_with_config(client.clone(), cfg)
}

/// The manager's response timeout inside the caller's `timeout`.
fn response_timeout(timeout: Duration) -> Duration {
    timeout
        .saturating_sub(timeout / 5)
        .max(Duration::from_millis(1))
}

/// A table key as the store's keys and messages carry it.
fn encode_key(key: KeyRef<'_>, out: &mut Vec<u8>) {
    use std::io::Write as _;
    if let Some(ip) = key.ip_addr() {
        let _ = write!(out, "ip:{ip}");
    } else if let Some(b) = key.as_bytes() {
        out.extend_from_slice(b"b:");
        out.extend_from_slice(b);
    } else if let Some(d) = key.digest() {
        out.extend_from_slice(b"d:");
        for b in d {
            let _ = write!(out, "{b:02x}");
        }
    }
}

/// The key [`encode_key`] wrote (from a message: any bytes).
fn decode_key(b: &[u8]) -> Option<TableKey> {
    if let Some(ip) = b.strip_prefix(b"ip:") {
        let ip: IpAddr = std::str::from_utf8(ip).ok()?.parse().ok()?;
        return Some(match ip {
            IpAddr::V4(v4) => KeyRef::v4(v4).to_key(),
            IpAddr::V6(v6) => KeyRef::v6(v6).to_key(),
        });
    }
    if let Some(v) = b.strip_prefix(b"b:") {
        if v.len() > limpet_core::table::MAX_KEY_LEN {
            return None;
        }
        return Some(KeyRef::bytes(v).to_key());
    }
    let d = limpet_core::table::digest_from_hex(b.strip_prefix(b"d:")?)?;
    Some(KeyRef::from_digest(d).to_key())
}

/// The payload of another instance's re-pin of `key` in `table` to `node`, as the store
/// publishes it.
#[cfg(test)]
pub(crate) fn repin_message(table: &str, node: &str, key: KeyRef<'_>) -> Vec<u8> {
    let mut payload = format!("{table}\n{node}\n").into_bytes();
    encode_key(key, &mut payload);
    payload
}

#[cfg(test)]
mod tests {
    use super::*;
    use limpet_core::table::IpPrefix;

    /// Pipelines halve at each that timed out, to the least; a small one that timed out (a
    /// probe) says nothing of the size; one of the full size answered within a quarter of
    /// the timeout doubles it back, to the most; a slower one, or a shorter one, keeps it.
    #[test]
    fn pipelines_shrink_when_they_time_out_and_grow_back_when_quick() {
        let timeout = Duration::from_millis(200);
        let b = Batch::default();
        b.came_back(BATCH, None, timeout);
        assert_eq!(b.size(), BATCH / 2);
        b.came_back(1, None, timeout);
        assert_eq!(b.size(), BATCH / 2, "a probe's timeout");
        b.came_back(BATCH / 4 - 1, None, timeout);
        assert_eq!(b.size(), BATCH / 2, "a batch of less than half the size");
        for _ in 0..10 {
            b.came_back(b.size(), None, timeout);
        }
        assert_eq!(b.size(), BATCH_MIN);
        b.came_back(BATCH_MIN, Some(Duration::from_millis(60)), timeout);
        assert_eq!(b.size(), BATCH_MIN, "answered, but not quickly");
        b.came_back(BATCH_MIN - 1, Some(Duration::from_millis(1)), timeout);
        assert_eq!(b.size(), BATCH_MIN, "quick, but not full");
        b.came_back(BATCH_MIN, Some(Duration::from_millis(50)), timeout);
        assert_eq!(b.size(), 2 * BATCH_MIN);
        for _ in 0..10 {
            b.came_back(b.size(), Some(Duration::from_millis(1)), timeout);
        }
        assert_eq!(b.size(), BATCH);
    }

    /// Writes that fail with a successful read between each two (each new client's `GET`
    /// answered, its pin's write refused) open the breaker at the second; reads alone do
    /// too; a success clears its own way's count only, and the probe's both.
    #[test]
    fn failed_writes_open_the_breaker_whatever_reads_succeed_between_them() {
        let b = Breaker::default();
        assert!(!b.failure(Way::Write));
        b.success(Way::Read);
        assert!(
            b.failure(Way::Write),
            "a read's success cleared a failed write"
        );
        b.reset();
        assert!(!b.failure(Way::Read));
        b.success(Way::Write);
        assert!(b.failure(Way::Read));
        b.reset();
        assert!(!b.failure(Way::Write));
        b.success(Way::Write);
        assert!(
            !b.failure(Way::Write),
            "a write's success clears the writes' count"
        );
    }

    /// While this instance's re-pins of a key are on their way, as many messages of the key
    /// are skipped (their echoes, or older messages), then messages apply again; one that
    /// was not sent, or did not come back in time, holds nothing back.
    #[test]
    fn messages_of_a_key_this_instance_re_pinned_are_skipped_until_its_re_pins_come_back() {
        let mut own = OwnRepins::default();
        let t: Arc<str> = Arc::from("terminal");
        let k = KeyRef::ip("10.0.0.1".parse().expect("ip"), IpPrefix::HOST).to_key();
        let other = KeyRef::ip("10.0.0.2".parse().expect("ip"), IpPrefix::HOST).to_key();
        // A request that failed over twice: two re-pins of one key.
        own.sent(&t, &k, 1_000);
        own.sent(&t, &k, 1_001);
        assert!(!own.skip("terminal", &other, 1_002), "another key applies");
        assert!(!own.skip("sessions", &k, 1_002), "another table applies");
        assert!(own.skip("terminal", &k, 1_002), "the first echo");
        assert!(own.skip("terminal", &k, 1_003), "the second echo");
        assert!(
            !own.skip("terminal", &k, 1_004),
            "then another's re-pin applies"
        );
        // Not sent: nothing to wait for.
        own.sent(&t, &k, 2_000);
        own.not_sent(&t, &k);
        assert!(!own.skip("terminal", &k, 2_001));
        // Its echo lost: it holds the key back no longer than the wait.
        own.sent(&t, &k, 3_000);
        assert!(!own.skip("terminal", &k, 3_000 + ECHO_WAIT_MS + 1));
        assert!(own.keys.is_empty(), "nothing kept");
    }

    /// With round trips bounded by a longer `timeout` (5 s), a re-pin is awaited longer than
    /// the 2 s floor: its echo published 4 s after the write was queued (a batch behind a
    /// slow one) is still known as this instance's own, not applied as another's re-pin.
    #[test]
    fn a_longer_timeout_awaits_re_pins_longer() {
        assert_eq!(echo_wait_ms(Duration::from_millis(500)), ECHO_WAIT_MS);
        let wait = echo_wait_ms(Duration::from_secs(5));
        assert_eq!(wait, 11_000);
        let mut own = OwnRepins::waiting(wait);
        let t: Arc<str> = Arc::from("terminal");
        let k = KeyRef::ip("10.0.0.1".parse().expect("ip"), IpPrefix::HOST).to_key();
        own.sent(&t, &k, 1_000);
        assert!(own.skip("terminal", &k, 5_000), "the late echo is its own");
        own.sent(&t, &k, 6_000);
        assert!(
            !own.skip("terminal", &k, 6_000 + wait + 1),
            "a lost echo waits no longer"
        );
    }

    /// A storm of re-pins all still awaited (a large node going DOWN: more than 65,536 keys
    /// within the echo wait) sweeps the map once, not at every insert past 65,536 (which made
    /// the storm quadratic: 1,000 sweeps of the whole map here, and one per key beyond);
    /// entries past the wait are still swept once the map reaches the next threshold.
    #[test]
    fn a_storm_of_re_pins_sweeps_the_awaited_ones_once() {
        let mut own = OwnRepins::default();
        let t: Arc<str> = Arc::from("terminal");
        let key = |i: u32| KeyRef::v4(std::net::Ipv4Addr::from(i)).to_key();
        let n = REPINS_KEPT as u32 + 1_000;
        for i in 0..n {
            own.sent(&t, &key(i), 1_000);
        }
        assert_eq!(own.keys.len(), n as usize, "every one still awaited");
        assert_eq!(own.sweeps, 1);
        // Past the wait, the next sweep takes them all.
        let later = 1_000 + ECHO_WAIT_MS + 1;
        let mut i = n;
        while own.sweeps == 1 {
            own.sent(&t, &key(i), later);
            i += 1;
        }
        assert_eq!(own.keys.len(), (i - n) as usize, "only the new ones left");
        assert!(own.skip("terminal", &key(n), later), "a new one is awaited");
        assert!(!own.skip("terminal", &key(0), later), "an old one is not");
        // Once every echo came back, the next storm sweeps at the usual size again.
        for k in n + 1..i {
            assert!(own.skip("terminal", &key(k), later));
        }
        assert!(own.keys.is_empty());
        assert_eq!(own.sweep_at, REPINS_KEPT);
    }

    /// A re-pin message is decided (this instance's own echo, or another's re-pin) under the
    /// table's lock, which a local re-pin holds from its put to its announcement: a local
    /// re-pin of the key made while the message waits for the lock comes after it in the
    /// store too, and the message is skipped. Before, the decision came before the lock: the
    /// message, taken for another instance's re-pin, overwrote the newer local pin (and
    /// ended the session's connections on its node), while the fleet kept the newer one.
    #[test]
    fn a_message_waiting_for_the_table_behind_a_local_re_pin_does_not_undo_it() {
        let (_rt, store) = crate::test_util::offline_store();
        let entries = table_t(&store, &["x", "w", "z"]);
        let (x, w) = (limpet_core::NodeId(0), limpet_core::NodeId(1));
        let key = KeyRef::v4(std::net::Ipv4Addr::new(192, 0, 2, 9));
        let now = now_ms();
        lock(&entries).learn(key, x, now);

        // Another instance's re-pin of the key to z arrives while this instance's route holds
        // the table to re-pin it to w.
        let table = lock(&entries);
        let payload = repin_message("t", "z", key);
        let applying = std::thread::Builder::new()
            .name("store-applies".into())
            .spawn({
                let store = Arc::clone(&store);
                move || store.apply(&payload)
            })
            .expect("thread");
        crate::test_util::until_asleep("store-applies");
        let mut table = table;
        table.learn(key, w, now);
        store.send(Write::Overwrite, &Arc::from("t"), key, "w", Some("x"));
        drop(table);
        applying.join().expect("apply");
        let t = lock(&entries);
        let pinned = t
            .store()
            .peek(key, now)
            .and_then(|r| t.store().node_name(r));
        assert_eq!(pinned, Some("w"), "the newer local re-pin holds");
    }

    /// A re-pin the store has not taken (kept for the resync) is newer than the node the
    /// store answers for its key: a refresh's or a publication's read of that node does not
    /// take the entry back to it (the resync's overwrite decides), where an entry with no
    /// re-pin kept takes the store's node as before.
    #[test]
    fn the_store_s_node_does_not_undo_a_re_pin_it_has_not_taken() {
        let (_rt, store) = crate::test_util::offline_store();
        let entries = table_t(&store, &["x", "w"]);
        let w = limpet_core::NodeId(1);
        let table: Arc<str> = Arc::from("t");
        let now = now_ms();
        let held = KeyRef::v4(std::net::Ipv4Addr::new(192, 0, 2, 21));
        let plain = KeyRef::v4(std::net::Ipv4Addr::new(192, 0, 2, 22));
        {
            let mut t = lock(&entries);
            t.learn(held, w, now);
            t.learn(plain, w, now);
        }
        // `held` was re-pinned x -> w while the store was away: kept for the resync.
        store.set_up(false);
        store.send(Write::Overwrite, &table, held, "w", Some("x"));
        assert_eq!(lock(&store.repins_away).len(), 1);
        store.adopt(&table, held, "w", b"x", false);
        store.adopt(&table, plain, "w", b"x", false);
        let t = lock(&entries);
        let pinned = |k| t.store().peek(k, now).and_then(|r| t.store().node_name(r));
        assert_eq!(pinned(held), Some("w"), "the re-pin holds");
        assert_eq!(pinned(plain), Some("x"), "the store's node adopted");
    }

    /// A walk of a table's pins a page at a time ([`page_down`], the resync's publication and
    /// the expiry refresh) misses no entry that stays in the table, however many are removed
    /// between its pages (evicted for new clients, expired, deleted by the admin API): each
    /// removal below moves an entry the walk has read into the hole. Read upwards, as the
    /// publication was, each removal in a page already read moved an unread entry there, and
    /// that pin was never published.
    #[test]
    fn a_walk_of_the_pins_misses_none_that_stay_whatever_is_removed_between_pages() {
        let (_rt, store) = crate::test_util::offline_store();
        let lru = LruTable::new(limpet_core::table::TableConfig::new(1000, 60_000)).expect("lru");
        let topology = limpet_core::Topology::with_weights([("x", 1)]).expect("nodes");
        let entries: Entries = Arc::new(Mutex::new(AffinityTable::new(lru, &topology)));
        store.register("t", &entries, 60_000);
        let now = now_ms();
        let key = |i: u32| TableKey::from(KeyRef::v4(std::net::Ipv4Addr::from(0x0a00_0000 + i)));
        for i in 0..100 {
            lock(&entries).learn(key(i).as_key_ref(), limpet_core::NodeId(0), now);
        }
        let (mut below, mut read, mut removed) = (usize::MAX, Vec::new(), Vec::new());
        let mut next_removal = 0u32;
        loop {
            let (pins, more) = page_down(&entries, &mut below, 10, 0, now);
            read.extend(pins.into_iter().map(|(k, _)| k));
            if !more {
                break;
            }
            // Two removals between pages: one among the pins read, one among those not yet.
            let mut t = lock(&entries);
            for k in [read[read.len() / 2].clone(), key(next_removal)] {
                if t.store_mut().remove(k.as_key_ref()).is_some() {
                    removed.push(k);
                }
            }
            next_removal += 1;
        }
        let missed: Vec<TableKey> = (0..100)
            .map(key)
            .filter(|k| !removed.contains(k) && !read.contains(k))
            .collect();
        assert!(!removed.is_empty());
        assert_eq!(missed, Vec::<TableKey>::new(), "pins that stay, never read");
    }

    /// Every read of a key in flight is told of a re-pin message of it, whichever looks
    /// first, and each looks again from then on; one that began after the message is not.
    #[test]
    fn every_read_of_a_key_is_told_of_a_message_that_came_meanwhile() {
        let (_rt, store) = crate::test_util::offline_store();
        let _entries = table_t(&store, &["y", "z"]);
        let key = KeyRef::v4(std::net::Ipv4Addr::new(192, 0, 2, 11));
        let (mut first, mut second) = (store.reading("t", key), store.reading("t", key));
        store.apply(&repin_message("t", "z", key));
        let mut later = store.reading("t", key);
        assert!(first.moved() && second.moved(), "both reads told");
        assert!(!first.moved() && !second.moved(), "and told once");
        assert!(!later.moved(), "a read begun after the message");
        drop((first, second, later));
        assert!(lock(&store.fetching).is_empty(), "nothing kept");
    }

    /// Table `t` over `nodes` (in that order), shared through `store`.
    fn table_t(store: &Store, nodes: &[&str]) -> Entries {
        let topology =
            limpet_core::Topology::with_weights(nodes.iter().map(|n| (*n, 1))).expect("nodes");
        let lru = LruTable::new(limpet_core::table::TableConfig::new(10, 60_000)).expect("lru");
        let entries: Entries = Arc::new(Mutex::new(AffinityTable::new(lru, &topology)));
        store.register("t", &entries, 60_000);
        entries
    }

    #[test]
    fn keys_round_trip_through_their_store_form() {
        let long = vec![b'x'; 400];
        for k in [
            KeyRef::ip("10.0.0.7".parse().expect("ip"), IpPrefix::HOST),
            KeyRef::ip("2001:db8::1".parse().expect("ip"), IpPrefix::HOST),
            KeyRef::bytes(b"JSESSION\n:42"),
            KeyRef::bytes(&long),
        ] {
            let mut out = Vec::new();
            encode_key(k, &mut out);
            assert_eq!(decode_key(&out), Some(k.to_key()), "{k:?}");
        }
        assert_eq!(decode_key(b"ip:not-an-ip"), None);
        assert_eq!(decode_key(b"d:zz"), None);
        assert_eq!(decode_key(b"?"), None);
    }
}
