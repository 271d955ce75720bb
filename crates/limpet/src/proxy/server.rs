//! The listener side: accepting client connections, serving HTTP/1.1 and HTTP/2 on each
//! (h2c by prior knowledge, or h2 by ALPN over TLS), the per-connection state, and draining
//! on shutdown. The pool and the affinity table come from the runtime state, shared with
//! every other listener; the node connections and settings are this listener's own.
//!
//! ```text
//!  accept (one permit of max_client_connections each)
//!    └─► task per connection: crate::net::accept_client (PROXY header from trusted peers,
//!        TLS accept on TLS listeners; shared with TCP listeners)
//!          └─► hyper-util auto (HTTP/1.1 or HTTP/2) over client_io::ClientIo (the first
//!              read taken whole; answers written at the end of the event-loop turn)
//!          ├─► forward::handle per request, sharing this connection's ConnCtx
//!          ├─► writes blocked for client_idle (a client that stopped reading) ─► closed
//!          ├─► idle watch: no request in flight for keep_alive_idle (header_read before the
//!          │     first request, and between HTTP/1 requests when it is lower: the wait for
//!          │     the next head) ─► graceful close ─► socket dropped if the client stays
//!          │     (a stalled HTTP/2 header block never lets the connection end by itself)
//!          ├─► park watch (HTTP/1): no request in flight for PARK_AFTER ─► hyper's
//!          │     connection let go at a message boundary, its buffers freed, the socket
//!          │     kept ─► the client's next bytes: a new hyper connection on it
//!          └─► shutdown signal ─► graceful close (finish in-flight, then close; cut at drain)
//!        (the watchers are polled only when one of them is woken: crate::wake::OnWake)
//! ```

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwap;
use hyper::server::conn::{http1, http2};
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use limpet_core::NodeId;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use super::affinity::Affinity;
use super::config::{ConfigError, IpNet, Limits, ProxyConfig, Timeouts};
use super::forward;
use super::upstream::NodeConns;
use crate::config::ListenerDef;
use crate::runtime::{ConnPin, Runtime, State, Table};

/// State shared by every connection of one listener: its settings and connections, and the
/// runtime's pool and table (shared with every other listener).
#[derive(Debug)]
pub(crate) struct Shared {
    /// The runtime state (generation) this was built from: its topology, the shared tables.
    pub(crate) state: Arc<State>,
    pub(crate) def: Arc<ListenerDef>,
    /// The affinity table this listener names (shared with other listeners).
    pub(crate) table: Option<Arc<Table>>,
    /// Connections per node, indexed by `NodeId`.
    pub(crate) conns: Vec<Arc<NodeConns>>,
    pub(crate) affinity: Option<Affinity>,
    trusted: Vec<IpNet>,
    pub(crate) limits: Limits,
    pub(crate) timeouts: Timeouts,
    pub(crate) retry_after: u32,
    ids: Arc<RequestIds>,
    /// Turns true when the listener starts draining; tunnels watch it too.
    pub(crate) draining: watch::Receiver<bool>,
    /// The listener socket's tunnels (WebSockets and other upgrades), which outlive the
    /// requests that opened them: shutdown waits for them to close (close 1001 at a frame
    /// boundary) before the runtime goes.
    pub(crate) tunnels: TaskTracker,
    /// This listener's metric series over this generation's nodes, resolved once.
    pub(crate) metrics: crate::metrics::ListenerMetrics,
}

impl Shared {
    /// The listener `name` of `state`, serving a socket bound to `local_port` (the port
    /// `node_port = "same"` forwards to).
    fn new(
        state: Arc<State>,
        name: &str,
        ids: Arc<RequestIds>,
        draining: watch::Receiver<bool>,
        tunnels: TaskTracker,
        local_port: u16,
    ) -> Result<Self, ConfigError> {
        let slot = state
            .listeners
            .iter()
            .find(|l| l.def.load().name == name)
            .ok_or_else(|| ConfigError(format!("no listener named {name:?}")))?;
        let def = slot.def.load_full();
        let table = slot.table.clone();
        let conns = def
            .upstreams
            .for_port(local_port)
            .map(|addr| {
                let tls = def.upstream_tls.as_ref().map(|u| {
                    (
                        Arc::clone(&u.config),
                        crate::tls::upstream_name(u.server_name.as_deref(), addr.ip()),
                    )
                });
                Arc::new(NodeConns::new(
                    addr,
                    def.limits.max_idle_per_node,
                    def.timeouts.upstream_idle,
                    def.timeouts.connect,
                    tls,
                ))
            })
            .collect();
        let affinity = match &def.cookie {
            Some(c) => Some(Affinity::new(c.clone(), state.topology())?),
            None => None,
        };
        if limits_invalid(&def.limits) {
            return Err(ConfigError(
                "max header bytes must be at least 8192 and max connections at least 1".into(),
            ));
        }
        let metrics = crate::metrics::ListenerMetrics::new(
            &state.lifecycle.metrics,
            &def.name,
            state.nodes().iter().map(|n| n.name.as_str()),
        );
        Ok(Shared {
            metrics,
            trusted: def.trusted_proxies.clone(),
            limits: def.limits,
            timeouts: def.timeouts,
            retry_after: def.retry_after_secs,
            state,
            def,
            table,
            conns,
            affinity,
            ids,
            draining,
            tunnels,
        })
    }

    pub(crate) fn node_name(&self, node: NodeId) -> &str {
        self.state.node_name(node)
    }

    pub(crate) fn next_request_id(&self) -> RequestId {
        self.ids.next()
    }
}

/// One listener socket's [`Shared`], kept current with the runtime's state: built again
/// once per reload, by the first connection or request that sees the reload. Every request
/// routes over the generation current when it came ([`ConnCtx::shared`]), on a connection
/// opened before the reload too: a node the reload added is one its cookie can choose, a
/// node it moved is reached at its new address, a node it removed is one no request goes to.
pub(crate) struct Generations {
    runtime: Arc<Runtime>,
    name: String,
    ids: Arc<RequestIds>,
    draining: watch::Receiver<bool>,
    tunnels: TaskTracker,
    /// The socket's local port (`node_port = "same"`).
    port: u16,
    current: ArcSwap<Shared>,
    /// The generation whose settings for this listener were refused: the previous ones
    /// serve, and it is not built again on each request.
    refused: AtomicU32,
    /// Held while a generation is built: one build per reload, whose result every
    /// connection then shares (two would split the node connection pools).
    building: std::sync::Mutex<()>,
}

impl std::fmt::Debug for Generations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generations")
            .field("name", &self.name)
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

impl Generations {
    fn new(
        runtime: Arc<Runtime>,
        name: &str,
        ids: Arc<RequestIds>,
        draining: watch::Receiver<bool>,
        tunnels: TaskTracker,
        port: u16,
    ) -> Result<Self, ConfigError> {
        let first = Shared::new(
            runtime.state(),
            name,
            Arc::clone(&ids),
            draining.clone(),
            tunnels.clone(),
            port,
        )?;
        Ok(Generations {
            runtime,
            name: name.to_owned(),
            ids,
            draining,
            tunnels,
            port,
            current: ArcSwap::from_pointee(first),
            refused: AtomicU32::new(u32::MAX),
            building: std::sync::Mutex::new(()),
        })
    }

    /// Whether `shared` is what the runtime's current state asks for: built from it, or
    /// the last one when its settings for this listener were refused.
    fn serves(&self, shared: &Shared) -> bool {
        let now = self.runtime.generation();
        shared.state.generation() == now || self.refused.load(Ordering::Relaxed) == now
    }

    /// The `drain` the running config gives this listener, read without building its
    /// settings for a generation no connection asked for yet (at a stop, that would only
    /// make node connection pools to drop).
    fn drain(&self) -> Duration {
        let current = self.current.load();
        if self.serves(&current) {
            return current.timeouts.drain;
        }
        self.runtime
            .state()
            .listeners
            .iter()
            .map(|l| l.def.load())
            .find(|d| d.name == self.name)
            .map_or(current.timeouts.drain, |d| d.timeouts.drain)
    }

    /// The listener's settings and connections for the runtime's current state.
    fn current(&self) -> Arc<Shared> {
        let current = self.current.load_full();
        if self.serves(&current) {
            return current;
        }
        let _building = self.building.lock().unwrap_or_else(PoisonError::into_inner);
        // Another thread may have built it meanwhile.
        let current = self.current.load_full();
        if self.serves(&current) {
            return current;
        }
        let state = self.runtime.state();
        let generation = state.generation();
        match Shared::new(
            state,
            &self.name,
            Arc::clone(&self.ids),
            self.draining.clone(),
            self.tunnels.clone(),
            self.port,
        ) {
            Ok(next) => {
                let next = Arc::new(next);
                self.current.store(Arc::clone(&next));
                next
            }
            Err(e) => {
                tracing::warn!(listener = %self.name, error = %e, "reloaded listener settings refused; keeping the previous ones");
                self.refused.store(generation, Ordering::Relaxed);
                current
            }
        }
    }
}

/// hyper refuses (panics on) a read buffer below 8 KiB; a zero permit count would never
/// accept.
fn limits_invalid(l: &Limits) -> bool {
    l.max_header_bytes < 8192 || l.max_client_connections == 0
}

/// Request ids: a prefix per listener socket and a counter, so ids from two limpet instances
/// (or two runs, or two worker threads of one) do not collide in shared logs, and no id costs
/// more than an atomic increment.
#[derive(Debug)]
struct RequestIds {
    prefix: u32,
    next: AtomicU64,
}

/// The [`RequestIds`] made so far in this process: one per listener socket, so one per worker
/// thread (and per generation).
static ID_INSTANCES: AtomicU32 = AtomicU32::new(0);

/// The prefix every socket's prefix is offset from: the process's start time and pid, spread
/// over all bits (splitmix64 finaliser), so other instances and runs differ. Not a secret,
/// just distinct.
fn process_prefix(nanos: u64, pid: u32) -> u32 {
    let mut z = nanos ^ (u64::from(pid) << 32);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    z as u32
}

impl RequestIds {
    fn new() -> Self {
        static BASE: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
        let base = *BASE.get_or_init(|| {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            process_prefix(nanos, std::process::id())
        });
        Self::numbered(base, ID_INSTANCES.fetch_add(1, Ordering::Relaxed))
    }

    /// The ids of the process's `instance`-th listener socket. The offset is the instance
    /// times an odd constant, one-to-one on u32: two sockets of one process (two worker
    /// threads starting together, or a reload's new generation) never share a prefix, which
    /// a clock reading per socket could not promise.
    fn numbered(base: u32, instance: u32) -> Self {
        RequestIds {
            prefix: base.wrapping_add(instance.wrapping_mul(0x9e37_79b9)),
            next: AtomicU64::new(1),
        }
    }

    fn next(&self) -> RequestId {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        RequestId::new(self.prefix, n as u32)
    }
}

/// One request's id: 16 lowercase hex digits (the socket's prefix, then the counter), kept
/// inline. Written by hand because it is made on every request and `format!` with padding
/// cost more than the rest of the id's life (measured with callgrind, bench/README.md).
#[derive(Clone, Copy, Debug)]
pub(crate) struct RequestId([u8; 16]);

impl RequestId {
    fn new(prefix: u32, n: u32) -> Self {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let v = (u64::from(prefix) << 32) | u64::from(n);
        let mut out = [0u8; 16];
        for (i, b) in out.iter_mut().enumerate() {
            *b = HEX[((v >> (60 - 4 * i)) & 0xf) as usize];
        }
        RequestId(out)
    }

    pub(crate) fn as_str(&self) -> &str {
        // Only ASCII hex digits are ever written.
        std::str::from_utf8(&self.0).unwrap_or("")
    }
}

/// What one client connection shares between its requests (HTTP/2 streams, pipelined or
/// keep-alive HTTP/1.1 requests).
#[derive(Debug)]
pub(crate) struct ConnCtx {
    /// The generation of the listener's settings this connection's last request used
    /// ([`ConnCtx::shared`]).
    shared: std::sync::Mutex<Arc<Shared>>,
    generations: Arc<Generations>,
    pub(crate) peer: SocketAddr,
    pub(crate) tls: bool,
    /// The peer may hand us `X-Forwarded-*` we extend.
    pub(crate) trusted: bool,
    /// `peer` as `X-Forwarded-For` writes it, made once for all the connection's requests.
    pub(crate) forwarded_for: http::HeaderValue,
    /// The node assigned to this connection's first unpinned request, so requests sent
    /// before the client has the cookie land together.
    pub(crate) pin: ConnPin,
    /// How long a write to this client may stay blocked (`client_idle`); lifted when the
    /// connection becomes a tunnel, whose relay has its own per-direction rule.
    pub(crate) write_limit: crate::relay::WriteLimit,
    /// HTTP/2: the clocks of the answers in flight, for [`stall_watch`].
    answers: AnswerClocks,
    /// What the service tells the stream: set while the connection is being parked (see
    /// [`PARK_AFTER`]), and when the answer written next is its last.
    pub(crate) hints: super::client_io::StreamHints,
    /// How many times it was parked.
    parks: AtomicU64,
    /// HTTP/1: a request body was let go before its end since the last request came (see
    /// [`ConnCtx::note_body_cut`]).
    body_cut: AtomicBool,
    /// The connection's watchers' wake flag (`crate::wake::OnWake::on`; the context is their
    /// waker, so that no connection allocates one).
    control: crate::wake::Signal,
    active: AtomicUsize,
    served: AtomicU64,
    /// Milliseconds since `started` at the last request start or end.
    last_touch_ms: AtomicU64,
    /// The last (session, node, second) this connection reported to its node's sessions-seen
    /// window: see [`ConnCtx::first_sighting`].
    last_sighting: AtomicU64,
    /// The spread key of the connection's last answered request: an answer still streaming
    /// when its node leaves rotation for the session is cut at the session's own moment
    /// ([`super::body::ProxyBody`]). Kept here, not in each answer's body, which is moved
    /// several times a request; an HTTP/2 connection's streams almost always carry one
    /// session, and one that carries several has the moment of the latest.
    last_spread: AtomicU64,
    /// Requests a node answered on this connection: what the share of streams reset in
    /// flight is counted against ([`Unanswered`]). limpet's own answers (a 400 for a bad
    /// `:path`) cost no node connection, and padded a rapid reset past its limit.
    node_answered: AtomicU64,
    started: Instant,
    /// When the connection was ready for its first bytes: taken, its PROXY header read and
    /// its TLS handshake done ([`FIRST_BYTES_GRACE`] runs from here).
    ready: Instant,
    /// The connection's slot among its listener's `max_connections`: held as long as the
    /// connection, and handed to the tunnel an upgrade opens, which outlives the connection's
    /// task ([`ConnCtx::take_slot`]).
    slot: std::sync::Mutex<Option<crate::net::ConnPermit>>,
    /// HTTP/2: streams the client reset while limpet still forwarded them
    /// ([`Unanswered`]), and the notice that they reached [`cancel_limit`].
    cancelled: std::sync::atomic::AtomicU32,
    too_many_cancels: tokio::sync::Notify,
    /// Over TLS: where the client's records stand (`crate::tls::records`), for
    /// [`idle_watch`].
    records: Option<Arc<crate::tls::RecordClock>>,
}

impl ConnCtx {
    /// A request body of this connection was let go before its end: hyper, its reader gone,
    /// stops reading the body and closes the connection, which is then not between two
    /// messages and must not be parked ([`run_connection`]'s `Park`).
    pub(crate) fn note_body_cut(&self) {
        self.body_cut.store(true, Ordering::Release);
    }

    /// `peer` is the client (from a PROXY header when one was accepted); `tcp_peer` the
    /// address the connection came from, which decides whether its `X-Forwarded-*` is trusted.
    /// `shared` is `generations`' current one (the accept loop has it at hand).
    pub(crate) fn new(
        generations: Arc<Generations>,
        shared: Arc<Shared>,
        peer: SocketAddr,
        tcp_peer: SocketAddr,
        tls: bool,
    ) -> Self {
        let trusted = shared.trusted.iter().any(|n| n.contains(tcp_peer.ip()));
        let now = Instant::now();
        ConnCtx {
            peer,
            tls,
            trusted,
            forwarded_for: super::headers::forwarded_for(peer.ip()),
            pin: ConnPin::new(),
            write_limit: crate::relay::WriteLimit::new(shared.timeouts.client_idle),
            answers: AnswerClocks::default(),
            hints: super::client_io::StreamHints::default(),
            parks: AtomicU64::new(0),
            body_cut: AtomicBool::new(false),
            control: crate::wake::Signal::new(),
            active: AtomicUsize::new(0),
            served: AtomicU64::new(0),
            last_touch_ms: AtomicU64::new(0),
            last_sighting: AtomicU64::new(0),
            last_spread: AtomicU64::new(0),
            node_answered: AtomicU64::new(0),
            started: now,
            ready: now,
            shared: std::sync::Mutex::new(shared),
            generations,
            slot: std::sync::Mutex::new(None),
            cancelled: std::sync::atomic::AtomicU32::new(0),
            too_many_cancels: tokio::sync::Notify::new(),
            records: None,
        }
    }

    /// A TLS connection whose records `records` follows.
    pub(crate) fn reading_records(mut self, records: Option<Arc<crate::tls::RecordClock>>) -> Self {
        self.records = records;
        self
    }

    /// The connection as taken at `accepted` (before its PROXY header and TLS handshake):
    /// its first request head is due `header_read` after that, not after the handshake.
    pub(crate) fn since(mut self, accepted: Instant) -> Self {
        self.started = accepted;
        self
    }

    /// The running limpet this connection's listener serves.
    pub(crate) fn runtime(&self) -> &Arc<Runtime> {
        &self.generations.runtime
    }

    /// The connection holding `slot`, its listener's permit.
    pub(crate) fn holding(self, slot: Option<crate::net::ConnPermit>) -> Self {
        *self.slot.lock().unwrap_or_else(PoisonError::into_inner) = slot;
        self
    }

    /// The connection's slot, for the tunnel its upgrade opens: counted against the
    /// listener's `max_connections` until the tunnel ends, as HAProxy's `maxconn` counts it.
    pub(crate) fn take_slot(&self) -> Option<crate::net::ConnPermit> {
        self.slot
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    /// The listener's `close_on_node_down` for a tunnel opened now under `def`, read again
    /// from the running config when its node changes or limpet reloads.
    pub(crate) fn close_on_down(&self, def: &ListenerDef) -> crate::runtime::CloseOnDown {
        crate::runtime::CloseOnDown::new(
            Arc::clone(&self.generations.runtime),
            &def.name,
            def.tcp.close_on_node_down,
        )
    }

    /// The listener's settings and connections for a request that comes now: the
    /// generation of the runtime's current state, so that a connection opened before a
    /// reload follows it from its next request on (the connection's pin carried over to
    /// the new generation's node ids). A request keeps what this returned for its whole
    /// life, so that its node ids, connections and metrics are of one generation. When
    /// nothing was reloaded: the connection's own lock, one atomic load and a reference
    /// count (about 150 instructions a request, measured with `bench/cost.sh`).
    pub(crate) fn shared(&self) -> Arc<Shared> {
        // A lock of the connection's own (uncontended but for concurrent HTTP/2 streams of
        // one worker thread): cheaper per request than an `ArcSwap` load.
        let mut mine = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
        if mine.state.generation() != self.generations.runtime.generation() {
            let next = self.generations.current();
            if !Arc::ptr_eq(&next, &mine) {
                self.pin.carry(&mine.state, &next.state);
                // The client's write stall limit is the running `client_idle` too.
                self.write_limit.set(next.timeouts.client_idle);
                *mine = next;
            }
        }
        Arc::clone(&mine)
    }

    /// The listener's timeouts as the running config has them, for the connection's own
    /// watches: read without moving the connection to a new generation, which only a
    /// request does ([`Self::shared`]), so a request in flight keeps writing its pin where
    /// it began.
    pub(crate) fn running_timeouts(&self) -> Timeouts {
        {
            let mine = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
            if mine.state.generation() == self.generations.runtime.generation() {
                return mine.timeouts;
            }
        }
        let t = self.generations.current().timeouts;
        // The socket's write stall limit is the connection's own: it follows at once.
        self.write_limit.set(t.client_idle);
        t
    }

    /// The listener's settings of the running config, when a reload came since `shared` (a
    /// request's generation, from [`ConnCtx::shared`]) was taken; `None` while `shared` is
    /// still current, one atomic load. For a request that waited (in a node's queue, or an
    /// answer timeout before a failover): it reaches its node where the running config
    /// has it, and a request that routes again moves to the running generation whole
    /// (`forward::Attempt::route_in`).
    pub(crate) fn reloaded_since(&self, shared: &Shared) -> Option<Arc<Shared>> {
        if shared.state.generation() == self.generations.runtime.generation() {
            return None;
        }
        // By identity, not by `serves`: a later reload whose settings for this listener were
        // refused keeps the one built after `shared`, which is the running one.
        let now = self.generations.current();
        (!std::ptr::eq(Arc::as_ptr(&now), shared)).then_some(now)
    }

    /// Whether this request is the connection's first sighting of `spread` (the session) on
    /// `node` this second. The node's sessions-seen window counts distinct sessions, so the
    /// same session again within the second changes nothing but its "last seen", which a
    /// second's precision serves: the keep-alive requests of one session skip the window's
    /// lock, which threads would otherwise share on every request.
    ///
    /// `now_ms` is the reading the request took when it came, not one at its answer (a
    /// clock read per request saved): a session is reported in the second its request
    /// came. The node records the sighting at its own reading; only when two requests of
    /// one session overlap on one connection (HTTP/2) and came in the same second is the
    /// later answer's report skipped, so "last seen" can lag by that request's wait.
    pub(crate) fn first_sighting(
        &self,
        node: limpet_core::NodeId,
        spread: u64,
        now_ms: u64,
    ) -> bool {
        self.last_spread.store(spread, Ordering::Relaxed);
        self.node_answered.fetch_add(1, Ordering::Relaxed);
        let second = now_ms / 1000;
        let tag = spread
            ^ (node.index() as u64).rotate_left(40)
            ^ second.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.last_sighting.swap(tag, Ordering::Relaxed) != tag
    }

    /// What ends an answer still streaming from `node` (see [`super::body::ProxyBody`]):
    /// its session's end on the node, as a tunnel's ([`crate::nodes::NodeRuntime::session_end`]:
    /// MAINT, DOWN under `close_on_node_down`, a move, the session's moment past a drain
    /// deadline; [`crate::nodes::NodeRuntime::answer_end`]), for the session of `spread`
    /// (HTTP/2: the stream's), else the connection's last one (HTTP/1: this answer's
    /// request is the last that came).
    pub(crate) fn answer_end(
        &self,
        node: &Arc<crate::nodes::NodeRuntime>,
        spread: Option<u64>,
    ) -> impl Future<Output = crate::nodes::EndReason> + Send + 'static {
        let spread = spread.unwrap_or_else(|| self.last_spread.load(Ordering::Relaxed));
        let moves = node.watch(spread);
        let close_on_down = self.close_on_down(&self.shared().def);
        let node = Arc::clone(node);
        async move {
            node.answer_end(moves, || close_on_down.now(), close_on_down.reloads())
                .await
        }
    }

    /// Watches an HTTP/2 answer for the client stalling it (see [`stall_watch`]), with the
    /// clock its stream was given ([`h2_service`]).
    pub(crate) fn watch_answer(
        &self,
        body: &mut super::body::ProxyBody,
        clock: Option<Arc<super::body::AnswerClock>>,
    ) {
        // An answer with nothing to send is never polled for data: nothing to watch.
        if hyper::body::Body::is_end_stream(body) {
            return;
        }
        let clock = clock.unwrap_or_else(|| super::body::AnswerClock::new(self.started));
        clock.start_now();
        // The connection's last answered request is this stream's: no other stream ran
        // between its answer and this (one task, no wait in between).
        clock.set_spread(self.last_spread.load(Ordering::Relaxed));
        self.answers.add(&clock);
        body.watch(clock);
    }

    fn touch(&self) {
        self.touch_at(Instant::now());
    }

    /// [`touch`](Self::touch) with a reading the caller took.
    fn touch_at(&self, now: Instant) {
        let ms = now.saturating_duration_since(self.started).as_millis() as u64;
        self.last_touch_ms.store(ms, Ordering::Relaxed);
    }

    /// How long no request has been in flight (None while one is).
    fn idle_for(&self) -> Option<Duration> {
        if self.active.load(Ordering::Acquire) > 0 {
            return None;
        }
        let now = self.started.elapsed().as_millis() as u64;
        let last = self.last_touch_ms.load(Ordering::Relaxed);
        Some(Duration::from_millis(now.saturating_sub(last)))
    }
}

impl AsRef<crate::wake::Signal> for ConnCtx {
    fn as_ref(&self) -> &crate::wake::Signal {
        &self.control
    }
}

impl AsRef<super::client_io::StreamHints> for ConnCtx {
    fn as_ref(&self) -> &super::client_io::StreamHints {
        &self.hints
    }
}

/// The waker of the connection's watchers (`serve_connection`).
impl std::task::Wake for ConnCtx {
    fn wake(self: Arc<Self>) {
        self.control.fire();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.control.fire();
    }
}

/// Marks a request in flight on its connection from the moment it arrives until its answer
/// body is dropped.
#[derive(Debug)]
pub(crate) struct ActiveGuard(Arc<ConnCtx>);

impl ActiveGuard {
    /// The connection the request came on.
    pub(crate) fn ctx(&self) -> &Arc<ConnCtx> {
        &self.0
    }

    /// `arrived`: the request's clock reading as it came.
    pub(crate) fn new(ctx: &Arc<ConnCtx>, arrived: Instant) -> Self {
        // A request head came: hyper read the one before to its end (HTTP/1 reads one
        // message at a time). (The body's reader may still let it go later, not at its
        // end, with frames hyper had read still unread: the mark then stands against a
        // connection that was at a boundary, which closes it rather than parks it. Safe,
        // and rare: a node connection that fails after the answer.)
        if ctx.body_cut.load(Ordering::Relaxed) {
            ctx.body_cut.store(false, Ordering::Relaxed);
        }
        ctx.hints.request_came();
        ctx.active.fetch_add(1, Ordering::AcqRel);
        ctx.served.fetch_add(1, Ordering::Relaxed);
        ctx.touch_at(arrived);
        ActiveGuard(Arc::clone(ctx))
    }
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.touch();
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

/// HTTP/2: the clocks of a connection's answers in flight, for [`stall_watch`], as weak
/// references: an answer drops its clock when it is done.
#[derive(Debug, Default)]
struct AnswerClocks(std::sync::Mutex<Vec<std::sync::Weak<super::body::AnswerClock>>>);

impl AnswerClocks {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<std::sync::Weak<super::body::AnswerClock>>> {
        // A list of weak references: consistent whatever panicked while holding the lock.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds an answer's clock.
    ///
    /// The answers that are done are forgotten before the list would grow, so it stays
    /// within twice the answers in flight: the watch scans it only every `client_idle / 4`
    /// (15 s by default), and a weak reference keeps its clock's allocation, so a busy
    /// connection would otherwise keep every answer of the last 15 s (about 70,000 at 4,500
    /// requests/s, each an allocation the allocator could not reuse).
    fn add(&self, clock: &Arc<super::body::AnswerClock>) {
        let mut list = self.lock();
        if list.len() == list.capacity() {
            list.retain(|w| w.strong_count() > 0);
        }
        list.push(Arc::downgrade(clock));
    }

    /// Forgets the answers that are done, and cuts the streams of those stalled for
    /// `limit`, each alone. Tells whether one could not be cut by itself: the connection
    /// must then close.
    fn scan(&self, limit: Duration) -> bool {
        let mut list = self.lock();
        let mut uncut = false;
        list.retain(|w| match w.upgrade() {
            Some(c) => {
                if c.stalled_for().is_some_and(|d| d >= limit) {
                    tracing::debug!(
                        "an HTTP/2 answer stalled by the client for client_idle: its stream reset"
                    );
                    uncut |= !c.cut();
                }
                true
            }
            None => false,
        });
        uncut
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }
}

/// Cuts each HTTP/2 answer of this connection that has had data to give while the client
/// took none for `client_idle`: its stream's flow-control window stayed shut (a client that
/// never opens it, or stopped reading that stream). Its stream is reset alone, which releases
/// the node connection and slot the answer holds, and the connection's other streams go on,
/// as HAProxy's `timeout client` and nginx's `send_timeout` apply per stream. (A client that
/// stops reading the socket itself blocks limpet's writes, which `client_idle` bounds for the
/// whole connection, as for HTTP/1.) Resolves only if a stalled stream could not be cut by
/// itself: the connection is then dropped.
///
/// The watch looks every `client_idle / 4`, whether answers are in flight or not, so a stall
/// is seen within 1.25 `client_idle`. It used to sleep while the connection had no answer in
/// flight and be woken (a `Notify`) by the next one; but short answers are mostly done by the
/// time the watch runs, so the list was empty again at nearly every look, and the watch and
/// the connection's other watchers were polled about once per 10 requests of a busy
/// connection (counted with a print in the watch: about 29,000 looks in a 4 s `h2load -c16
/// -m10` run of about 280,000 requests).
async fn stall_watch(ctx: &ConnCtx) {
    loop {
        // Read at each look, as in `idle_watch`: a reload's `client_idle` applies here too.
        let limit = ctx.running_timeouts().client_idle;
        let step = (limit / 4).max(Duration::from_millis(25));
        if ctx.answers.scan(limit) {
            return;
        }
        tokio::time::sleep(step).await;
    }
}

/// Resolves once the connection has had no request in flight for long enough: the header
/// read timeout before its first request (a connection that never sends one, even during
/// protocol detection, is a slow-loris), the keep-alive idle timeout after.
///
/// HTTP/1 (`h1`): between requests a connection waits for the next head, so the header read
/// timeout bounds that wait too, from the end of the last answer, whether nothing came or
/// half a head did: the lower of the two limits. This is the request-head clock of an
/// HTTP/1 connection; hyper's own (`header_read_timeout`) is not set, as it would take a
/// boxed timer and a clock reading for every request for the same rule.
///
/// HTTP/2: a request head the client has begun and not finished (a HEADERS frame not whole,
/// or a header block without its END_HEADERS: `client_io::H2Heads`) may take `header_read`
/// from its first bytes, whatever else is in flight; h2 surfaces no request until its head
/// is whole, so without this a stalled head on a later stream would count as idle time and
/// hold the connection for `idle`. It is looked at every quarter of `header_read`, so it is
/// closed within 1.25 `header_read`. Over TLS no frame header shows until its record is
/// whole: a TLS record begun and not finished while no request is in flight is given
/// `header_read` too (`crate::tls::records`).
async fn idle_watch(ctx: &ConnCtx, h1: bool) {
    loop {
        // Read at each look: limits a reload set apply to the connections open before it
        // from their next look on (an HTTP/2 connection may never go through another
        // watch), as HTTP/1's do from their next request.
        let t = ctx.running_timeouts();
        // Re-check at least this often, so a first request arriving mid-sleep switches the
        // limit from header_read to keep_alive_idle without waiting out the longer one.
        let mut step = t.header_read.min(t.keep_alive_idle);
        if !h1 {
            step = step.min((t.header_read / 4).max(Duration::from_millis(25)));
        }
        let between = if h1 { step } else { t.keep_alive_idle };
        if !h1 {
            let now_ms = crate::clock::now_ms();
            if let Some(open) = ctx.hints.head_open_for(now_ms) {
                if open >= t.header_read {
                    tracing::debug!(peer = %ctx.peer, "an HTTP/2 request head unfinished for header_read: connection closed");
                    return;
                }
            }
            // Over TLS, a head inside a record that never ends shows nothing above rustls:
            // with no request in flight, a record unfinished for `header_read` is taken for
            // one. (With a request in flight the record may be its upload's, which a slow
            // link sends slower than that; the connection is in use then anyway.)
            let record = ctx.records.as_ref().and_then(|r| r.open_for(now_ms));
            if let (Some(open), Some(idle)) = (record, ctx.idle_for()) {
                if open.min(idle) >= t.header_read {
                    tracing::debug!(peer = %ctx.peer, "a TLS record unfinished for header_read on an idle HTTP/2 connection: connection closed");
                    return;
                }
            }
        }
        let limit = if ctx.served.load(Ordering::Relaxed) == 0 {
            t.header_read
        } else {
            between
        };
        match ctx.idle_for() {
            Some(idle) if idle >= limit => return,
            Some(idle) => tokio::time::sleep((limit - idle).min(step)).await,
            None => tokio::time::sleep(step).await,
        }
    }
}

/// Why [`serve`] stopped early.
#[derive(Debug)]
pub enum ServeError {
    Config(ConfigError),
}

impl std::fmt::Display for ServeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServeError::Config(e) => write!(f, "invalid proxy configuration: {e}"),
        }
    }
}

impl std::error::Error for ServeError {}

/// Spawns what hyper hands off (each HTTP/2 stream of a client connection is a task) on the
/// current runtime, boxed first. The future of a stream holds the whole request's state (4-5
/// KiB); spawned as it is, tokio moves it by value through several calls into the task, a
/// copy each time. Boxed, the copy is made once and the task holds a pointer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BoxingExecutor;

impl<F> hyper::rt::Executor<F> for BoxingExecutor
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, fut: F) {
        // Boxed first: the stream's future (4-5 KiB) is moved once, into the box.
        let fut = Box::pin(fut);
        let task = tokio::spawn(fut);
        if let Some(clock) = NEXT_H2_STREAM.take() {
            clock.carried_by(task.abort_handle());
        }
    }
}

thread_local! {
    /// The clock of the HTTP/2 stream whose service future hyper has just made: hyper spawns
    /// the stream's task right after, on this thread with nothing in between
    /// (`hyper::proto::h2::server`: `service.call(req)`, then `execute_h2stream`), so
    /// [`BoxingExecutor`] hands the clock that task to cut ([`super::body::AnswerClock::cut`]).
    /// Should that order ever change, a clock without its task makes the stall close the
    /// connection, as it did before streams were cut alone.
    static NEXT_H2_STREAM: std::cell::Cell<Option<Arc<super::body::AnswerClock>>> =
        const { std::cell::Cell::new(None) };
}

/// The service of an HTTP/2 connection: each stream's request gets its answer clock first,
/// for [`stall_watch`] to cut that stream alone.
fn h2_service(
    ctx: &Arc<ConnCtx>,
) -> impl hyper::service::Service<
    hyper::Request<hyper::body::Incoming>,
    Response = hyper::Response<super::body::ProxyBody>,
    Error = std::convert::Infallible,
    Future = impl Future<
        Output = Result<hyper::Response<super::body::ProxyBody>, std::convert::Infallible>,
    > + Send,
> {
    let ctx = Arc::clone(ctx);
    service_fn(move |req| {
        let clock = super::body::AnswerClock::new(ctx.started);
        NEXT_H2_STREAM.set(Some(Arc::clone(&clock)));
        forward::handle(Arc::clone(&ctx), req, Some(clock))
    })
}

/// How many of its streams an HTTP/2 client may reset while limpet still forwards them
/// before the connection is closed (with GOAWAY, and a second's grace), once they are also
/// more than half of its streams: twice the streams it may have open at once, and 200 at
/// least. Each such reset costs a request at a node and the node
/// connection it was on (cut mid-exchange, not pooled); a client that opens streams and
/// resets them at once, round after round (the rapid reset of CVE-2023-44487 spread over
/// many reads, which h2's own limit on resets of streams not yet accepted does not see), made
/// one connection open node connections without bound, until the machine ran out of ports.
/// A browser cancels a few requests at a time (a page left while it loads, fetches aborted as
/// the user types): over a long-lived connection its resets add up, but stay a small part
/// of what it asked, so the share is what tells an attacker. HAProxy counts
/// such "glitches" per connection (`tune.h2.fe.glitches-threshold`); nginx caps a
/// connection's streams (`keepalive_requests`, 1,000).
fn cancel_limit(max_concurrent_streams: u32) -> u32 {
    max_concurrent_streams.saturating_mul(2).max(200)
}

/// Held by an HTTP/2 stream's service future ([`super::forward::handle`]) until its answer
/// is made: dropped before, the client reset the stream (or the connection went) while limpet
/// forwarded it, and the connection counts it toward [`cancel_limit`]. A reference into the
/// future's own state: a wrapper future around the service's would copy the whole request's
/// state (4-5 KiB) once more per stream (callgrind, `h2c-m1`: about 1,700 instructions a
/// request).
pub(crate) struct Unanswered<'a>(Option<&'a ConnCtx>);

impl<'a> Unanswered<'a> {
    /// A stream of `ctx` (counted only on HTTP/2, `h2`).
    pub(crate) fn stream(ctx: &'a ConnCtx, h2: bool) -> Self {
        Unanswered(h2.then_some(ctx))
    }

    /// The answer was made: nothing to count.
    pub(crate) fn answered(mut self) {
        self.0 = None;
    }
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        let Some(ctx) = self.0.take() else {
            return;
        };
        let n = ctx
            .cancelled
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1);
        // More than half of the streams that reached a node (answered, or reset in flight).
        if n >= cancel_limit(ctx.shared().limits.h2_max_concurrent_streams)
            && u64::from(n) > ctx.node_answered.load(Ordering::Relaxed)
        {
            // One stored permit however many come: the connection's watch takes it once.
            ctx.too_many_cancels.notify_one();
        }
    }
}

/// hyper's two servers, set up once per listener generation: a connection goes to one or
/// the other by its first bytes ([`super::client_io::ClientIo::opens_http2`]).
pub(crate) struct Builder {
    h1: http1::Builder,
    h2: http2::Builder<BoxingExecutor>,
}

/// How much of one HTTP/2 stream's answer limpet holds for a client that has not taken it.
/// hyper's default (400 KiB) let a client that opened its flow-control windows wide and
/// stopped reading make limpet hold 100 streams × 400 KiB, about 47 MB per connection (chaos
/// run); at 64 KiB a connection holds at most 6.4 MB, and a stream still has a window's
/// worth of data ahead of a reading client. (HAProxy holds one 16 KiB buffer per stream.)
const H2_SEND_BUF: usize = 64 * 1024;

/// How much of one HTTP/2 stream's request body a client may send ahead of limpet's reading
/// it (the stream's flow-control window). The connection's window is this times the streams
/// a connection may have open, up to [`H2_CONN_WINDOW_MAX`]: with hyper's default (1 MiB
/// each, the connection's as large as one stream's), one stream whose body limpet was not
/// reading (queued for a node at its `max_connections`, waiting for a trial, or sent to a
/// node that stopped reading) held the whole connection window, and every other stream's
/// upload on the connection waited for it (a node's slot held by a stream whose own body
/// could not come: a deadlock until the queue timeout). At 256 KiB a stream still uploads at
/// 5 MB/s over a 50 ms round trip (nginx and HAProxy open 64 KiB per stream).
const H2_STREAM_WINDOW: u32 = 256 * 1024;

/// The most of its streams' request bodies one HTTP/2 connection may have sent ahead of
/// limpet's reading them: 32 streams' windows. It bounds what a connection holds (hyper's
/// default held 1 MiB), and only 32 streams stuck at once would hold up the others.
const H2_CONN_WINDOW_MAX: u32 = 32 * H2_STREAM_WINDOW;

fn builder(limits: &Limits) -> Builder {
    let mut h1 = http1::Builder::new();
    // `idle_watch` is the request-head clock of HTTP/1 connections (hyper's would take a
    // boxed timer per request for the same rule).
    //
    // `half_close`: a client's FIN ends what it sends, not what it waits for, so a request
    // is answered when the client half-closed after it (HAProxy's default; nginx, which
    // aborts, has `proxy_ignore_client_abort` for it). Without it hyper reads the client
    // socket while the node answers, to notice an EOF, and aborts the request on one:
    // `nc -N` and tools that half-close lose their answer, and the read makes every
    // client socket join the reactor (`crate::socket`), two `epoll_ctl` per
    // `Connection: close` request that HAProxy does not make. A client that went away
    // altogether is noticed when its answer is written, once the node answered (within
    // `timeouts.response`).
    h1.header_read_timeout(None)
        .max_buf_size(limits.max_header_bytes)
        .max_headers(limits.max_headers)
        .keep_alive(true)
        .half_close(true);
    let mut h2 = http2::Builder::new(BoxingExecutor);
    h2.timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX))
        .max_concurrent_streams(limits.h2_max_concurrent_streams)
        .max_send_buf_size(H2_SEND_BUF)
        .initial_stream_window_size(H2_STREAM_WINDOW)
        .initial_connection_window_size(
            H2_STREAM_WINDOW
                .saturating_mul(limits.h2_max_concurrent_streams.max(1))
                .min(H2_CONN_WINDOW_MAX),
        );
    Builder { h1, h2 }
}

/// Serves the proxy on an already-bound listener until `shutdown` resolves, then stops
/// accepting, lets in-flight requests finish (up to `timeouts.drain`) and returns. A runtime
/// of its own with this one listener: quick mode and the demo.
pub async fn serve(
    config: ProxyConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let bind = listener
        .local_addr()
        .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0)));
    serve_listener(
        runtime_of(config, bind)?,
        QUICK_LISTENER,
        listener,
        shutdown,
    )
    .await
}

/// The name of the one listener of [`serve`] and `limpet proxy`.
pub const QUICK_LISTENER: &str = "proxy";

/// The runtime of a one-listener proxy bound at `bind` ([`serve`], `limpet proxy`).
pub fn runtime_of(config: ProxyConfig, bind: SocketAddr) -> Result<Arc<Runtime>, ServeError> {
    let cfg = config.to_config(bind).map_err(ServeError::Config)?;
    let state = State::new(cfg).map_err(|e| ServeError::Config(ConfigError(e)))?;
    Ok(Runtime::new(state))
}

/// Serves HTTP listener `name` of `runtime` on an already-bound socket until `shutdown`
/// resolves; then drains as [`serve`] does. Connections are served with the runtime state
/// current when they arrive (a reload takes effect for new connections).
pub async fn serve_listener(
    runtime: Arc<Runtime>,
    name: &str,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let permits = crate::runtime::listener_permits(&runtime, name);
    serve_listener_on(runtime, name, listener, shutdown, permits).await
}

/// An HTTP client speaks first and waits for the answer, so the ACK of its request can ride
/// on the answer instead of going out alone: off with `TCP_QUICKACK` on the listening socket,
/// which the connections it accepts inherit (HAProxy does this on HTTP listeners). Without
/// it a new connection's first request is acknowledged at once, one packet more per
/// connection. Not for TCP listeners: a client there may send several small writes before
/// any answer comes, and with Nagle on its side each would wait for a delayed ACK. On an
/// HTTP connection that does the same (a head and a body in two writes, with Nagle on) or
/// that becomes a tunnel, it costs at most one delayed ACK (about 40 ms) once: Linux leaves
/// this mode when its delayed-ACK timer first fires. Best effort: a socket that refuses it
/// only costs that packet.
fn delay_first_acks(listener: &TcpListener) {
    #[cfg(target_os = "linux")]
    if let Err(e) = socket2::SockRef::from(listener).set_tcp_quickack(false) {
        tracing::debug!(error = %e, "TCP_QUICKACK stays on");
    }
}

/// [`serve_listener`] with the listener's connection permits given: several sockets of one
/// listener (one per worker thread, `crate::runtime::workers`) share its `max_connections`.
/// Each call has its own node connection pools (in its `Shared`), so a worker thread only
/// ever uses connections its own runtime drives.
pub async fn serve_listener_on(
    runtime: Arc<Runtime>,
    name: &str,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
    permits: Arc<crate::net::ConnLimit>,
) -> Result<(), ServeError> {
    delay_first_acks(&listener);
    let (drain_tx, drain_rx) = watch::channel(false);
    let ids = Arc::new(RequestIds::new());
    // One socket, one port: every connection it accepts has this local port.
    let bound = listener
        .local_addr()
        .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
    let port = bound.port();
    let tunnels = TaskTracker::new();
    let drain_gate = Arc::clone(&runtime);
    let generations = Arc::new(
        Generations::new(runtime, name, ids, drain_rx, tunnels.clone(), port)
            .map_err(ServeError::Config)?,
    );
    let mut shared = generations.current();
    let mut builder = Arc::new(builder(&shared.limits));
    // Every connection task holds a clone; recv() returns None once all are gone.
    let (done_tx, mut done_rx) = mpsc::channel::<()>(1);

    crate::net::accept_loop(
        listener,
        name,
        permits,
        shutdown,
        |stream, peer, slot| {
            let current = generations.current();
            if !Arc::ptr_eq(&current, &shared) {
                // A reload: new connections get the new hyper settings.
                builder = Arc::new(self::builder(&current.limits));
                shared = current;
            }
            let generations = Arc::clone(&generations);
            let current = Arc::clone(&shared);
            let builder = Arc::clone(&builder);
            let done = done_tx.clone();
            // Boxed before it is spawned: the connection's future is several KiB, and tokio
            // moves a spawned future by value through several calls into its task and again
            // at each change of the task's stage (callgrind, `close`: about 3,900
            // instructions of `memcpy` per connection against one allocation).
            tokio::spawn(Box::pin(async move {
                let _done = done;
                // A client accepted before the stop that waits for its slot through the
                // drain has `header_read` to get one, as its head would have.
                let permit = match slot {
                    crate::net::Slot::Held(p) => p,
                    awaited => {
                        let header_read = current.def.timeouts.header_read;
                        match tokio::time::timeout(header_read, awaited.taken()).await {
                            Ok(Some(p)) => p,
                            _ => {
                                tracing::debug!(%peer, "client connection closed: no slot by header_read in the drain");
                                return;
                            }
                        }
                    }
                };
                match crate::net::accept_client(stream, peer, bound, &current.def).await {
                    Ok(c) => {
                        let ctx = Arc::new(
                            ConnCtx::new(generations, current, c.who.client, c.tcp_peer, c.tls)
                                .holding(Some(permit))
                                .since(c.accepted)
                                .reading_records(c.records),
                        );
                        serve_connection(ctx, builder, c.io).await;
                    }
                    Err(why) => tracing::debug!(%peer, why, "client connection refused"),
                }
            }));
        },
    )
    .await;
    // Not while an upgrade's handover is pending: it may fail, and this limpet serve again.
    drain_gate.drain_allowed().await;
    let _ = drain_tx.send(true);
    drop(done_tx);
    // Connections, then the tunnels they opened: a tunnel's task outlives its connection's,
    // and returning before it closed would let the runtime drop it mid-frame, without its
    // close 1001.
    tunnels.close();
    // The drain as the running config says now: a reload since the listener started may
    // have changed it (TCP listeners read it at the drain too).
    let drain_timeout = generations.drain();
    // The drain, unless a second signal ends it sooner (as the TCP listeners' does): the
    // snapshot saves wait for every listener, and the second signal gives them a second.
    let ended = tokio::select! {
        r = tokio::time::timeout(drain_timeout, async {
            let _ = done_rx.recv().await;
            tunnels.wait().await;
        }) => r.is_ok(),
        () = generations.runtime.cut_requested() => false,
    };
    if !ended {
        tracing::warn!("drain over: closing remaining connections");
    }
    Ok(())
}

/// Serves one client connection (plain or TLS) until it ends, idles out or the listener
/// drains.
///
/// A graceful close (GOAWAY on HTTP/2) asks the client to go; it does not make it go. A
/// client that never answers, or one stuck in the middle of a header block (HEADERS without
/// END_HEADERS, after which HTTP/2 allows no other frame), would keep the socket and its
/// `max_connections` slot for good. So the socket is dropped once the connection has stayed
/// without a request in flight for [`CLOSE_GRACE`] after an idle close, or after `drain` on
/// shutdown.
async fn serve_connection<I: crate::tcp::Io + 'static>(
    ctx: Arc<ConnCtx>,
    builder: Arc<Builder>,
    io: I,
) {
    let mut draining = ctx.shared().draining.clone();
    let svc = {
        let ctx = Arc::clone(&ctx);
        service_fn(move |req| forward::handle(Arc::clone(&ctx), req, None))
    };
    // A client that stops reading an answer fails the blocked write after `client_idle`;
    // reads and writes reach the socket as `ClientIo` says.
    let mut io = super::client_io::ClientIo::new(
        crate::relay::WriteDeadline::new(io, ctx.write_limit.clone()),
        super::client_io::batching_pays(),
    );
    // HTTP/2 by prior knowledge or HTTP/1.1, told by the first bytes. A client that sends
    // nothing is closed after `header_read`, and one that has sent nothing yet when the
    // listener drains is closed once [`FIRST_BYTES_GRACE`] from its accept has passed, as
    // hyper closes a connection with no request. No request yet, so the limit is
    // `header_read` whichever the protocol turns out.
    let h2 = match until_first_bytes(&ctx, &mut draining, io.opens_http2()).await {
        Some(Ok(h2)) => h2,
        Some(Err(e)) => {
            tracing::debug!(peer = %ctx.peer, error = %e, "client connection ended before its first bytes");
            return;
        }
        None => return,
    };
    // hyper's connections are boxed, so that what a parked connection keeps (its task's
    // future) does not have their size: 3,552 bytes with them inline, 2,320 boxed
    // (`-Zprint-type-sizes`; the HTTP/2 one alone is 1,528).
    if h2 {
        // Its request heads are watched for `idle_watch` (a head begun and not ended).
        let io = io
            .watch_h2_heads()
            .with_hints(Arc::clone(&ctx) as super::client_io::HintsRef);
        let mut conn = Box::pin(
            builder
                .h2
                .serve_connection(TokioIo::new(io), h2_service(&ctx)),
        );
        let _ = run_connection(&ctx, &mut draining, conn.as_mut(), false).await;
        return;
    }
    let mut io = io.with_hints(Arc::clone(&ctx) as super::client_io::HintsRef);
    let mut svc = svc;
    loop {
        let mut conn = Box::new(
            builder
                .h1
                .serve_connection(TokioIo::new(io), svc)
                .with_upgrades(),
        );
        if !run_connection(&ctx, &mut draining, Pin::new(&mut *conn), true).await {
            return;
        }
        // Parked: hyper let the connection go at a message boundary without closing it.
        ctx.hints.set_parking(false);
        ctx.parks.fetch_add(1, Ordering::Relaxed);
        let Some(parts) = (*conn).into_parts() else {
            return; // upgraded meanwhile: the tunnel has the stream
        };
        let http1::Parts {
            io: parked,
            read_buf,
            service,
            ..
        } = parts;
        io = parked.into_inner();
        svc = service;
        if !read_buf.is_empty() {
            io.put_back(read_buf.to_vec());
        }
        // Empty or not, it holds hyper's whole read buffer: gone before the wait.
        drop(read_buf);
        // The same limits hold while parked: `idle_watch` reads the connection's own clock,
        // which parking does not touch.
        let more = until_idle_or_drain(&ctx, &mut draining, io.wait_for_bytes()).await;
        if !matches!(more, Some(Ok(true))) {
            // What hyper does with an idle connection it closes.
            let _ = tokio::io::AsyncWriteExt::shutdown(&mut io).await;
            tracing::debug!(peer = %ctx.peer, parks = ctx.parks.load(Ordering::Relaxed), "parked client connection closed");
            return;
        }
    }
}

/// A wait on an HTTP/1 connection with no hyper connection on it (for its first bytes, or
/// parked): what `wait` gives, or `None` once the connection has idled out ([`idle_watch`]'s
/// HTTP/1 limits) or the listener drains. The bytes are usually there already: then no timer
/// is set.
async fn until_idle_or_drain<T>(
    ctx: &ConnCtx,
    draining: &mut watch::Receiver<bool>,
    wait: impl Future<Output = T>,
) -> Option<T> {
    tokio::select! {
        biased;
        r = wait => Some(r),
        () = idle_watch(ctx, true) => None,
        () = drained(draining) => None,
    }
}

/// How long a connection accepted just before its listener drains has, from the moment it
/// is ready (accepted, and its TLS handshake done), to send its first bytes. A client's
/// request leaves right after its connect (or its handshake) completes, and a drain that
/// falls between that and the bytes (a shutdown, or an upgrade handing the socket to a new
/// limpet: `crate::upgrade`) would otherwise close it unanswered, the request reset on its
/// way. Counted from the accept, a TLS handshake slower than the grace (a far client) used
/// it all up before the client could send anything.
const FIRST_BYTES_GRACE: Duration = Duration::from_secs(1);

/// [`until_idle_or_drain`] for a connection's first bytes: a drain leaves it until
/// [`FIRST_BYTES_GRACE`] after it was ready (within `header_read` of its accept) to send
/// them.
async fn until_first_bytes<T>(
    ctx: &ConnCtx,
    draining: &mut watch::Receiver<bool>,
    wait: impl Future<Output = T>,
) -> Option<T> {
    tokio::pin!(wait);
    tokio::select! {
        biased;
        r = &mut wait => return Some(r),
        () = idle_watch(ctx, true) => return None,
        () = drained(draining) => {}
    }
    let header_read = ctx.shared().timeouts.header_read;
    let by = (ctx.ready + FIRST_BYTES_GRACE).min(ctx.started + header_read);
    tokio::time::timeout_at(by, wait).await.ok()
}

/// Resolves once the listener drains.
async fn drained(draining: &mut watch::Receiver<bool>) {
    let _ = draining.wait_for(|d| *d).await;
}

/// hyper's two server connections, as [`run_connection`] drives them.
trait ServerConn: Future<Output = hyper::Result<()>> {
    /// Asks the connection to close once its requests in flight are answered (GOAWAY on
    /// HTTP/2); an idle HTTP/1 connection closes at once, at a message boundary.
    fn graceful_shutdown(self: Pin<&mut Self>);
}

impl<I, S, B> ServerConn for http1::UpgradeableConnection<I, S>
where
    S: hyper::service::HttpService<hyper::body::Incoming, ResBody = B>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    B: hyper::body::Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn graceful_shutdown(self: Pin<&mut Self>) {
        http1::UpgradeableConnection::graceful_shutdown(self);
    }
}

impl<I, S, B, E> ServerConn for http2::Connection<I, S, E>
where
    S: hyper::service::HttpService<hyper::body::Incoming, ResBody = B>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin,
    B: hyper::body::Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    E: hyper::rt::bounds::Http2ServerConnExec<S::Future, B>,
{
    fn graceful_shutdown(self: Pin<&mut Self>) {
        http2::Connection::graceful_shutdown(self);
    }
}

/// Drives one hyper connection beside the connection's watchers until it ends, idles out,
/// stalls (HTTP/2) or the listener drains; `true` when it was parked instead (HTTP/1 only,
/// `h1`): idle for [`PARK_AFTER`], hyper let it go at a message boundary with the socket
/// left open (see [`PARK_AFTER`]), for the caller to take back.
async fn run_connection<C: ServerConn>(
    ctx: &Arc<ConnCtx>,
    draining: &mut watch::Receiver<bool>,
    mut conn: Pin<&mut C>,
    h1: bool,
) -> bool {
    let served_before = ctx.served.load(Ordering::Relaxed);
    // The watchers beside the connection, polled only when one of them was woken (not on
    // each of the connection's own wakes, about three per request: `crate::wake`).
    let control = crate::wake::OnWake::on(Arc::clone(ctx), async {
        tokio::select! {
            biased;
            () = idle_watch(ctx, h1) => Control::Idle,
            () = drained(draining) => Control::Drain,
            // HTTP/1 needs none (see `stall_watch`).
            () = stall_watch(ctx), if !h1 => Control::Stall,
            () = ctx.too_many_cancels.notified(), if !h1 => Control::Cancels,
            () = park_watch(ctx, served_before), if h1 => Control::Park,
        }
    });
    tokio::pin!(control);
    // The connection first: a request whose bytes have come is read (from memory) before a
    // drain that is already signalled asks the connection to close, so it is answered, not
    // dropped (hyper closes an HTTP/1 connection at once if it has read nothing yet).
    let result = tokio::select! {
        biased;
        r = conn.as_mut() => Some(r),
        c = &mut control => match c {
            Control::Idle => {
                conn.as_mut().graceful_shutdown();
                let grace = CLOSE_GRACE.min(ctx.shared().timeouts.header_read);
                ctx.touch();
                // A request that crossed the GOAWAY (h2 takes new streams until the client
                // acks the GOAWAY's PING) is in flight, so `quiet_for` waits for it: its
                // answer is bounded as on an open connection, a stalled one by the stall
                // watch (without it, a client that keeps its window shut would hold the
                // connection, its node connection and its slots for good). A client that
                // never acks the PING may go on opening streams: the open connection's
                // other limits hold too, on resets (a rapid reset after the GOAWAY went on
                // for as long as the client liked, each reset a node connection) and on a
                // head left unfinished (`idle_watch`, which the quiet second precedes
                // otherwise). And a drain: what is in flight has `drain` from then, as on
                // any connection (the listener's drain gives up waiting, it cuts nothing).
                // The watch is the listener's own; the one `control` holds is borrowed.
                let mut draining = ctx.shared().draining.clone();
                // `Err`: the listener drains.
                let closing = tokio::select! {
                    r = conn.as_mut() => Ok(Some(r)),
                    () = quiet_for(ctx, grace) => Ok(None),
                    () = stall_watch(ctx), if !h1 => Ok(None),
                    () = ctx.too_many_cancels.notified(), if !h1 => Ok(None),
                    () = idle_watch(ctx, h1), if !h1 => Ok(None),
                    () = drained(&mut draining) => Err(()),
                };
                match closing {
                    Ok(r) => r,
                    // An HTTP/1 connection closing for its idleness keeps its quiet second
                    // (a head begun and left: hyper waits for it).
                    Err(()) => drain_tail(ctx, conn.as_mut(), h1, true).await,
                }
            }
            Control::Drain => {
                conn.as_mut().graceful_shutdown();
                drain_tail(ctx, conn.as_mut(), h1, false).await
            }
            Control::Stall => {
                tracing::debug!(peer = %ctx.peer, "an HTTP/2 answer stalled by the client for client_idle, its stream not cut alone: connection closed");
                Some(Ok(()))
            }
            // GOAWAY, and a second for the streams in flight (what such a client has in
            // flight is mostly what it resets); then closed.
            Control::Cancels => {
                tracing::info!(
                    peer = %ctx.peer,
                    cancelled = ctx.cancelled.load(Ordering::Relaxed),
                    served = ctx.served.load(Ordering::Relaxed),
                    "an HTTP/2 client reset most of its streams in flight: its connection closed"
                );
                conn.as_mut().graceful_shutdown();
                tokio::time::timeout(CLOSE_GRACE, conn.as_mut()).await.ok()
            }
            Control::Park => {
                // No request in flight: hyper closes at once, between two messages (a head
                // that has only begun to come is handed back with the stream), and the
                // close it makes only flushes. Were hyper not between messages (a body still
                // coming after an answer limpet gave without reading it), it would go on to
                // the message's end first; the idle limit holds meanwhile.
                ctx.hints.set_parking(true);
                conn.as_mut().graceful_shutdown();
                tokio::select! {
                    biased;
                    // hyper also ends a connection whose request body lost its reader
                    // (the node's connection went, the client's body idled out) mid-body:
                    // it stops reading and closes, and the close only flushed. The socket
                    // is not between two messages then, and is closed, not parked: its
                    // next bytes are the rest of the body, which a parked connection would
                    // read as a request head (smuggled past a proxy in front that sends
                    // them as a body).
                    r = conn.as_mut() => match r {
                        Ok(()) if !ctx.body_cut.load(Ordering::Acquire) => return true,
                        Ok(()) => Some(Ok(())),
                        Err(e) => Some(Err(e)),
                    },
                    () = idle_watch(ctx, h1) => None,
                }
            }
        }
    };
    match result {
        Some(Err(e)) => {
            tracing::debug!(peer = %ctx.peer, error = %e, "client connection ended with an error")
        }
        Some(Ok(())) => {}
        None => {
            tracing::debug!(peer = %ctx.peer, "client did not close after a graceful close: socket dropped")
        }
    }
    false
}

/// The end of a connection whose listener drains, asked to close already (GOAWAY on
/// HTTP/2): in flight, a request has `drain` to finish. HTTP/2 without one goes once it has
/// had no request in flight and taken no byte for the close grace: h2 closes an idle
/// connection only once the client acks the GOAWAY's PING, and one that never does (a frozen
/// process, a vanished phone) held the stop for all of `drain`. An answer's last bytes h2
/// still holds keep it while the client takes them. (hyper closes an idle HTTP/1
/// connection at once; with `quiet_h1`, one that has had no request in flight for the close
/// grace goes too.) `None` when the connection is dropped unfinished.
async fn drain_tail<C: ServerConn>(
    ctx: &Arc<ConnCtx>,
    mut conn: Pin<&mut C>,
    h1: bool,
    quiet_h1: bool,
) -> Option<hyper::Result<()>> {
    let grace = CLOSE_GRACE.min(ctx.shared().timeouts.header_read);
    ctx.touch();
    tokio::time::timeout(ctx.shared().timeouts.drain, async {
        tokio::select! {
            r = conn.as_mut() => Some(r),
            () = quiet_and_unwritten_for(ctx, grace), if !h1 => None,
            () = quiet_for(ctx, grace), if h1 && quiet_h1 => None,
        }
    })
    .await
    .ok()
    .flatten()
}

/// Which of a connection's watchers fired first.
enum Control {
    /// No request in flight for too long ([`idle_watch`]).
    Idle,
    /// The listener started draining.
    Drain,
    /// An HTTP/2 answer stalled by the client ([`stall_watch`]).
    Stall,
    /// An HTTP/2 client reset [`cancel_limit`] streams in flight.
    Cancels,
    /// An HTTP/1 connection without a request in flight for [`PARK_AFTER`].
    Park,
}

/// How long an HTTP/1 connection stays without a request in flight before it is parked:
/// hyper's connection (its 8 KiB read buffer, its 8 KiB head buffer, the slot it keeps for
/// a request's future) is let go and only the socket kept, waited on with nothing allocated;
/// the client's next bytes get a new one. HAProxy and nginx give a connection's buffers
/// back as soon as it is idle; a new hyper connection costs about what a `Connection: close`
/// request's does, so a connection only idle between the requests of a busy client keeps
/// its own, and one left idle longer than this (most keep-alive connections, most of the
/// time) costs about 4 KiB instead of about 28.
const PARK_AFTER: Duration = Duration::from_secs(1);

/// How long a connection asked to close (GOAWAY) may stay without a request in flight before
/// its socket is dropped: enough for a request that crossed the GOAWAY to arrive.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// Resolves once an HTTP/1 connection has had no request in flight for [`PARK_AFTER`] and
/// has answered one since its hyper connection was made (`served_before`: the connection's
/// count then). Before its first answer hyper holds a connection busy, and asked to close
/// it would answer the request still to come with `Connection: close`; after one, idle, it
/// closes at once between two messages. Never for a connection whose hyper holds an
/// upgrade ([`super::client_io::StreamHints::set_upgrade_held`]).
async fn park_watch(ctx: &ConnCtx, served_before: u64) {
    loop {
        if ctx.hints.upgrade_held() {
            return std::future::pending().await;
        }
        match ctx.idle_for() {
            Some(idle) if idle < PARK_AFTER => tokio::time::sleep(PARK_AFTER - idle).await,
            // A connection whose last answer is out is closing: its shutdown must reach the
            // socket, where the answer's bytes wait for the FIN
            // (`client_io::StreamHints::set_last_answer`).
            Some(_) if ctx.hints.last_answer() || ctx.hints.closing() => {
                tokio::time::sleep(PARK_AFTER).await;
            }
            Some(_) if ctx.served.load(Ordering::Relaxed) > served_before => return,
            _ => tokio::time::sleep(PARK_AFTER).await,
        }
    }
}

/// HTTP/2: resolves once the connection has had no request in flight and written nothing
/// to the client for `limit`.
async fn quiet_and_unwritten_for(ctx: &ConnCtx, limit: Duration) {
    loop {
        let written = ctx.hints.written();
        tokio::time::sleep(limit).await;
        if ctx.idle_for().is_some_and(|idle| idle >= limit) && ctx.hints.written() == written {
            return;
        }
    }
}

/// Resolves once the connection has had no request in flight for `limit`.
async fn quiet_for(ctx: &ConnCtx, limit: Duration) {
    loop {
        match ctx.idle_for() {
            Some(idle) if idle >= limit => return,
            Some(idle) => tokio::time::sleep(limit - idle).await,
            None => tokio::time::sleep(limit).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A busy HTTP/2 connection's list of answer clocks stays the size of what is in flight:
    /// the answers that are done are forgotten as it grows, not only at the watch's scan.
    #[test]
    fn answers_that_are_done_are_forgotten_as_the_list_grows() {
        let clocks = AnswerClocks::default();
        let in_flight = super::super::body::AnswerClock::new(Instant::now());
        clocks.add(&in_flight);
        for _ in 0..10_000 {
            // Each answer is done (its clock dropped) as soon as it is added.
            clocks.add(&super::super::body::AnswerClock::new(Instant::now()));
        }
        let kept = clocks.len();
        assert!(kept <= 4, "{kept} clocks kept for one answer in flight");
        assert!(!clocks.scan(Duration::from_secs(60)), "nothing stalled");
        assert_eq!(clocks.len(), 1, "the scan keeps the answer in flight only");
        drop(in_flight);
        assert!(!clocks.scan(Duration::from_secs(60)));
        assert_eq!(clocks.len(), 0);
    }

    #[test]
    fn request_ids_are_the_prefix_then_the_counter_in_hex() {
        assert_eq!(
            RequestId::new(0xdead_beef, 0x0000_002a).as_str(),
            format!("{:08x}{:08x}", 0xdead_beef_u32, 42)
        );
        assert_eq!(RequestId::new(0, u32::MAX).as_str(), "00000000ffffffff");
    }

    /// Worker threads start together: the listener sockets of one process number their
    /// requests apart, whatever the clock read, and so do the sockets made here.
    #[test]
    fn listener_sockets_of_one_process_never_share_an_id_prefix() {
        let prefixes: std::collections::HashSet<u32> = (0..64)
            .map(|i| {
                RequestIds::numbered(process_prefix(1_764_000_000_000_000_000, 4242), i).prefix
            })
            .collect();
        assert_eq!(prefixes.len(), 64, "one clock reading, 64 sockets");
        let a = RequestIds::new();
        let b = RequestIds::new();
        assert_ne!(a.next().as_str()[..8], b.next().as_str()[..8]);
    }

    /// A node that answers each request head it reads (on any of its connections) with
    /// what `answer` makes of it, in order; `None` closes that connection.
    async fn node_answering<F, A>(answer: F) -> SocketAddr
    where
        F: Fn(Vec<u8>) -> A + Clone + Send + 'static,
        A: Future<Output = Option<Vec<u8>>> + Send,
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let node = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind node");
        let addr = node.local_addr().expect("node addr");
        tokio::spawn(async move {
            while let Ok((mut s, _)) = node.accept().await {
                let answer = answer.clone();
                tokio::spawn(async move {
                    let mut got = Vec::new();
                    let mut buf = [0u8; 4096];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        got.extend_from_slice(&buf[..n]);
                        while let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                            let head: Vec<u8> = got.drain(..end + 4).collect();
                            let Some(bytes) = answer(head).await else {
                                return;
                            };
                            if s.write_all(&bytes).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        addr
    }

    /// A node that answers each request with its request line as the body.
    async fn echo_node() -> SocketAddr {
        node_answering(|head| async move {
            let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
            let mut answer =
                format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", line.len()).into_bytes();
            answer.extend_from_slice(line);
            Some(answer)
        })
        .await
    }

    /// A proxy runtime for one node `a` at `node`, and the listener its client connections
    /// are accepted from.
    async fn proxy_to(node: SocketAddr) -> (Arc<Runtime>, tokio::net::TcpListener) {
        proxy_to_with(node, |_| {}).await
    }

    /// [`proxy_to`], its config changed by `edit` first.
    async fn proxy_to_with(
        node: SocketAddr,
        edit: impl FnOnce(&mut ProxyConfig),
    ) -> (Arc<Runtime>, tokio::net::TcpListener) {
        let mut cfg = ProxyConfig::new(vec![super::super::config::NodeConfig {
            name: "a".to_owned(),
            addr: node,
        }]);
        edit(&mut cfg);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        (runtime_of(cfg, addr).expect("runtime"), listener)
    }

    /// What [`accepted`] gives: the client's end, the accepted end, the connection's context
    /// and builder, and the drain switch of its listener.
    type Accepted = (
        tokio::net::TcpStream,
        tokio::net::TcpStream,
        Arc<ConnCtx>,
        Arc<Builder>,
        watch::Sender<bool>,
    );

    /// A client connection to `listener`, not yet served: the client's end, the accepted
    /// end, the connection's context and builder, and the drain switch of its listener.
    async fn accepted(runtime: &Arc<Runtime>, listener: &tokio::net::TcpListener) -> Accepted {
        accepted_ago(runtime, listener, Duration::ZERO).await
    }

    /// [`accepted`], the connection taken `ago` before it was ready (a TLS handshake's time).
    async fn accepted_ago(
        runtime: &Arc<Runtime>,
        listener: &tokio::net::TcpListener,
        ago: Duration,
    ) -> Accepted {
        let addr = listener.local_addr().expect("addr");
        let (drain_tx, drain_rx) = watch::channel(false);
        let generations = Arc::new(
            Generations::new(
                Arc::clone(runtime),
                QUICK_LISTENER,
                Arc::new(RequestIds::new()),
                drain_rx,
                TaskTracker::new(),
                addr.port(),
            )
            .expect("listener settings"),
        );
        let builder = Arc::new(builder(&generations.current().limits));
        let (client, accepted) =
            tokio::join!(tokio::net::TcpStream::connect(addr), listener.accept());
        let (client, (server_side, peer)) = (client.expect("connect"), accepted.expect("accept"));
        let current = generations.current();
        let taken = Instant::now()
            .checked_sub(ago)
            .expect("an instant that long ago");
        let ctx = Arc::new(ConnCtx::new(generations, current, peer, peer, false).since(taken));
        (client, server_side, ctx, builder, drain_tx)
    }

    /// A client connection being served: the client's end, the connection's context, the
    /// drain switch of its listener and the serving task.
    type Served = (
        tokio::net::TcpStream,
        Arc<ConnCtx>,
        watch::Sender<bool>,
        tokio::task::JoinHandle<()>,
    );

    /// One client connection served by `serve_connection` through a proxy to `node`: the
    /// client's end, the connection's context, the drain switch and the serving task.
    async fn one_connection(node: SocketAddr) -> Served {
        one_connection_ago(node, Duration::ZERO).await
    }

    /// [`one_connection`], the connection taken `ago` before it was ready (a TLS handshake's
    /// time).
    async fn one_connection_ago(node: SocketAddr, ago: Duration) -> Served {
        served_from(proxy_to(node).await, ago).await
    }

    /// [`one_connection_ago`] through `runtime`'s `listener`.
    async fn served_from(
        (runtime, listener): (Arc<Runtime>, tokio::net::TcpListener),
        ago: Duration,
    ) -> Served {
        let (client, server_side, ctx, builder, drain_tx) =
            accepted_ago(&runtime, &listener, ago).await;
        let served = tokio::spawn(serve_connection(Arc::clone(&ctx), builder, server_side));
        (client, ctx, drain_tx, served)
    }

    /// A request sent on `client` `after` its listener drained (the client's pace, not a
    /// wait for an event), answered 200.
    async fn answered_after_the_drain(client: &mut tokio::net::TcpStream, after: Duration) {
        use tokio::io::AsyncWriteExt;
        tokio::time::sleep(after).await;
        client
            .write_all(b"GET /late HTTP/1.1\r\nHost: a\r\n\r\n")
            .await
            .expect("request");
        let answer = read_answer(client).await;
        assert!(answer.contains(" 200 OK\r\n"), "{answer:?}");
    }

    /// Reads one answer of the echo node (its head, then the body its length says).
    async fn read_answer(client: &mut tokio::net::TcpStream) -> String {
        use tokio::io::AsyncReadExt;
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let text = String::from_utf8_lossy(&got).into_owned();
            if let Some(end) = text.find("\r\n\r\n") {
                let len: usize = text
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length: "))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                if got.len() >= end + 4 + len {
                    return text;
                }
            }
            let n = client.read(&mut buf).await.expect("read the answer");
            assert!(n > 0, "the connection ended before its answer: {text:?}");
            got.extend_from_slice(&buf[..n]);
        }
    }

    /// An HTTP/1 connection hyper will close after its answer is never parked, however long
    /// it stays without a request in flight: its answer's last bytes may still wait on a slow
    /// client, and parked, its close would only flush and keep the socket (an HTTP/1.0
    /// client waiting for the end of an answer the close delimits, a `Connection: close`
    /// not honoured, bytes after a request answered 400 for its framing read as a new
    /// request). One that is not closing is parked after [`PARK_AFTER`].
    #[tokio::test(start_paused = true)]
    async fn a_closing_connection_is_never_parked() {
        let node = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let (runtime, listener) = proxy_to(node.local_addr().expect("addr")).await;
        for closing in [false, true] {
            let (_client, _server_side, ctx, _builder, _drain) =
                accepted(&runtime, &listener).await;
            // One request served; none in flight since.
            drop(ActiveGuard::new(&ctx, Instant::now()));
            if closing {
                ctx.hints.set_closing();
            }
            let parked = tokio::time::timeout(PARK_AFTER * 10, park_watch(&ctx, 0))
                .await
                .is_ok();
            assert_eq!(parked, !closing, "closing: {closing}");
        }
        // A request that comes after all (hyper read an unread body through and kept the
        // connection) clears it: the connection may be parked again.
        let (_client, _server_side, ctx, _builder, _drain) = accepted(&runtime, &listener).await;
        ctx.hints.set_closing();
        drop(ActiveGuard::new(&ctx, Instant::now()));
        assert!(!ctx.hints.closing());
    }

    /// An answer is marked its connection's last, to leave with the FIN
    /// (`client_io::StreamHints::set_last_answer`), only when hyper closes the connection
    /// after it and all of it is in hand (a node's answer that has all come, or limpet's own):
    /// not on a connection kept alive, not for a request with a body (hyper may still be
    /// reading it), not after CONNECT or `Upgrade`, not for an answer still coming.
    #[tokio::test]
    async fn only_a_closing_connections_answer_whole_in_hand_is_marked_its_last() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let whole = echo_node().await;
        // (request, whether hyper closes after it, whether the answer is marked last)
        let cases = [
            ("GET /a HTTP/1.1\r\nHost: a\r\n\r\n", false, false),
            (
                "GET /a HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
                true,
                true,
            ),
            (
                "GET /a HTTP/1.1\r\nHost: a\r\nConnection: x, Close\r\n\r\n",
                true,
                true,
            ),
            (
                "GET /a HTTP/1.1\r\nHost: a\r\nConnection: close\r\nConnection: keep-alive\r\n\r\n",
                true,
                true,
            ),
            ("GET /a HTTP/1.0\r\nHost: a\r\n\r\n", true, true),
            (
                "GET /a HTTP/1.0\r\nHost: a\r\nConnection: keep-alive\r\n\r\n",
                false,
                false,
            ),
            (
                "POST /a HTTP/1.1\r\nHost: a\r\nConnection: close\r\nContent-Length: 2\r\n\r\nhi",
                true,
                false,
            ),
        ];
        for (head, closes, last) in cases {
            let (mut client, ctx, _drain, served) = one_connection(whole).await;
            client.write_all(head.as_bytes()).await.expect("request");
            let answer = read_answer(&mut client).await;
            assert!(answer.contains(" 200 OK\r\n"), "{answer:?}");
            assert_eq!(ctx.hints.last_answer(), last, "{head:?}");
            // Closing whenever hyper closes, whole in hand or not (never parked).
            assert_eq!(ctx.hints.closing(), closes, "{head:?}");
            // What hyper did: a second request is answered, or meets the end.
            let second = client
                .write_all(b"GET /b HTTP/1.1\r\nHost: a\r\n\r\n")
                .await;
            let mut buf = [0u8; 1024];
            let ended = second.is_err() || matches!(client.read(&mut buf).await, Ok(0) | Err(_));
            assert_eq!(ended, closes, "{head:?}");
            drop(client);
            served.await.expect("served");
        }

        // limpet's own answers are whole in hand too: the node refuses connections.
        let dead = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let dead_addr = dead.local_addr().expect("addr");
        drop(dead);
        let cases = [
            (
                "GET /a HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
                true,
            ),
            (
                "POST /a HTTP/1.1\r\nHost: a\r\nConnection: close\r\nContent-Length: 2\r\n\r\nhi",
                false,
            ),
        ];
        for (head, last) in cases {
            let (mut client, ctx, _drain, served) = one_connection(dead_addr).await;
            client.write_all(head.as_bytes()).await.expect("request");
            let answer = read_answer(&mut client).await;
            assert!(answer.starts_with("HTTP/1.1 5"), "{answer:?}");
            assert_eq!(ctx.hints.last_answer(), last, "{head:?}");
            drop(client);
            served.await.expect("served");
        }
        // limpet's own answers after which the connection is not kept for parking, whatever
        // the client asked: one to a request whose framing it does not trust (400 with
        // `Connection: close`), and one to a request whose body it did not read (the node
        // refuses: 503).
        for (head, status) in [
            (
                "GET /a HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
                "HTTP/1.1 400",
            ),
            (
                "POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nhi",
                "HTTP/1.1 503",
            ),
        ] {
            let (mut client, ctx, _drain, served) = one_connection(dead_addr).await;
            client.write_all(head.as_bytes()).await.expect("request");
            let answer = read_answer(&mut client).await;
            assert!(answer.starts_with(status), "{answer:?}");
            assert!(ctx.hints.closing(), "{head:?}");
            drop(client);
            served.await.expect("served");
        }

        // Never after CONNECT or a request with `Upgrade`, listed in `Connection` or not:
        // hyper hands the connection to the upgrade after the answer, it does not shut it
        // down.
        for head in [
            "CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\nConnection: close\r\n\r\n",
            "GET /a HTTP/1.1\r\nHost: a\r\nUpgrade: x\r\nConnection: close\r\n\r\n",
        ] {
            let (mut client, ctx, _drain, served) = one_connection(whole).await;
            client.write_all(head.as_bytes()).await.expect("request");
            let answer = read_answer(&mut client).await;
            assert!(answer.starts_with("HTTP/1.1 "), "{answer:?}");
            assert!(!ctx.hints.last_answer(), "{head:?}");
            drop(client);
            served.abort();
        }

        // The node sends the head and the first part of the body, then nothing more.
        let streaming = node_answering(|_| async {
            Some(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nfirst".to_vec())
        })
        .await;
        let (mut client, ctx, _drain, served) = one_connection(streaming).await;
        client
            .write_all(b"GET /a HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            .await
            .expect("request");
        let mut got = Vec::new();
        while !got.ends_with(b"first") {
            let mut buf = [0u8; 1024];
            let n = client.read(&mut buf).await.expect("read");
            assert!(n > 0, "ended early: {:?}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buf[..n]);
        }
        assert!(!ctx.hints.last_answer(), "the rest is still to come");
        drop(client);
        served.abort();
    }

    /// A client that half-closes once its request is sent (`nc -N`, HTTP/1.0 tools, a
    /// `Connection: close` client done writing) gets its answer, as from HAProxy and as
    /// RFC 9112 allows: the client's FIN ends what it sends, not what it waits for. Served
    /// through the listener's own accept, so the request is read from a socket that has not
    /// joined the reactor.
    #[tokio::test]
    async fn a_client_that_half_closes_after_its_request_still_gets_its_answer() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (runtime, listener) = proxy_to(echo_node().await).await;
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = tokio::spawn(serve_listener(runtime, QUICK_LISTENER, listener, async {
            let _ = stopped.await;
        }));
        for close in [false, true] {
            let mut client = tokio::net::TcpStream::connect(addr).await.expect("connect");
            let head = if close {
                "GET /half HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
            } else {
                "GET /half HTTP/1.1\r\nHost: a\r\n\r\n"
            };
            client.write_all(head.as_bytes()).await.expect("request");
            client.shutdown().await.expect("half-closed");
            let mut answer = Vec::new();
            client
                .read_to_end(&mut answer)
                .await
                .expect("read to the end");
            let answer = String::from_utf8_lossy(&answer);
            assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer:?}");
            assert!(answer.ends_with("GET /half HTTP/1.1"), "{answer:?}");
        }
        let _ = stop.send(());
        served.await.expect("served").expect("drained");
    }

    /// Clients that go away hurt no one else: one reset before its socket was ever read, one
    /// reset while its request is at the node (noticed when its answer is written, since a
    /// FIN or reset is not watched for meanwhile: `half_close`). The listener goes on
    /// accepting, and the next client is answered by the same node.
    #[tokio::test]
    async fn clients_that_reset_before_or_during_their_request_leave_the_listener_serving() {
        use tokio::io::AsyncWriteExt;
        // The node tells each request head it reads, and answers it once let go.
        let (heads_tx, mut heads) = mpsc::unbounded_channel::<()>();
        let answers = Arc::new(tokio::sync::Semaphore::new(0));
        let node_addr = {
            let answers = Arc::clone(&answers);
            node_answering(move |_head| {
                let (heads_tx, answers) = (heads_tx.clone(), Arc::clone(&answers));
                async move {
                    let _ = heads_tx.send(());
                    answers.acquire().await.ok()?.forget();
                    Some(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".to_vec())
                }
            })
            .await
        };
        let (runtime, listener) = proxy_to(node_addr).await;
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = tokio::spawn(serve_listener(runtime, QUICK_LISTENER, listener, async {
            let _ = stopped.await;
        }));
        let reset = |c: tokio::net::TcpStream| {
            socket2::SockRef::from(&c)
                .set_linger(Some(Duration::ZERO))
                .expect("linger 0");
            drop(c);
        };

        reset(tokio::net::TcpStream::connect(addr).await.expect("connect"));

        let mut gone = tokio::net::TcpStream::connect(addr).await.expect("connect");
        gone.write_all(b"GET /gone HTTP/1.1\r\nHost: a\r\n\r\n")
            .await
            .expect("request");
        heads.recv().await.expect("the request reached the node");
        reset(gone);
        answers.add_permits(1);

        let mut next = tokio::net::TcpStream::connect(addr).await.expect("connect");
        next.write_all(b"GET /next HTTP/1.1\r\nHost: a\r\n\r\n")
            .await
            .expect("request");
        heads
            .recv()
            .await
            .expect("the next request reached the node");
        answers.add_permits(1);
        let answer = read_answer(&mut next).await;
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer:?}");
        assert!(answer.ends_with("ok"), "{answer:?}");
        let _ = stop.send(());
        served.await.expect("served").expect("drained");
    }

    /// An idle HTTP/1 connection is parked (hyper's connection and its buffers let go, the
    /// socket kept) once it has had no request in flight for `PARK_AFTER`; the next request
    /// on it is served as any other, on the same socket, and so is one after a second park.
    #[tokio::test(start_paused = true)]
    async fn an_idle_http1_connection_is_parked_and_serves_its_next_request() {
        use tokio::io::AsyncWriteExt;
        let (mut client, ctx, _drain, _served) = one_connection(echo_node().await).await;
        for (k, path) in ["/one", "/two", "/three"].into_iter().enumerate() {
            client
                .write_all(format!("GET {path} HTTP/1.1\r\nHost: a\r\n\r\n").as_bytes())
                .await
                .expect("request");
            let answer = read_answer(&mut client).await;
            assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer:?}");
            assert!(
                answer.ends_with(&format!("GET {path} HTTP/1.1")),
                "{answer:?}"
            );
            assert_eq!(
                ctx.parks.load(Ordering::Relaxed),
                k as u64,
                "before the idle time"
            );
            tokio::time::sleep(PARK_AFTER + Duration::from_millis(100)).await;
            assert_eq!(
                ctx.parks.load(Ordering::Relaxed),
                k as u64 + 1,
                "parked once more"
            );
        }
    }

    /// An idle connection that has served a request is parked after `PARK_AFTER`, but never
    /// one whose last answer is out: that one is closing, and its shutdown must reach the
    /// socket, where the answer waits for the FIN.
    #[tokio::test(start_paused = true)]
    async fn a_connection_whose_last_answer_is_out_is_never_parked() {
        let (runtime, listener) = proxy_to(echo_node().await).await;
        let (_client, _server_side, ctx, _builder, _drain) = accepted(&runtime, &listener).await;
        drop(ActiveGuard::new(&ctx, Instant::now()));
        let parks = || tokio::time::timeout(PARK_AFTER * 4, park_watch(&ctx, 0));
        assert!(
            parks().await.is_ok(),
            "an idle kept-alive connection is parked"
        );
        ctx.hints.set_last_answer();
        assert!(parks().await.is_err(), "a closing one is not");
    }

    /// A connection that is busy is not parked: requests closer together than `PARK_AFTER`
    /// keep hyper's connection.
    #[tokio::test(start_paused = true)]
    async fn a_connection_busier_than_the_park_time_is_not_parked() {
        use tokio::io::AsyncWriteExt;
        let (mut client, ctx, _drain, _served) = one_connection(echo_node().await).await;
        for _ in 0..5 {
            client
                .write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
                .await
                .expect("request");
            read_answer(&mut client).await;
            tokio::time::sleep(PARK_AFTER / 2).await;
        }
        assert_eq!(ctx.parks.load(Ordering::Relaxed), 0);
    }

    /// A head that had only begun to come when the connection was parked is not lost: hyper
    /// hands back what it had read with the socket, and the rest completes it.
    #[tokio::test(start_paused = true)]
    async fn a_head_begun_before_the_park_is_kept_and_completed() {
        parked_between(
            (
                b"GET /first HTTP/1.1\r\nHost: a\r\n\r\nGET /sec",
                "GET /first HTTP/1.1",
            ),
            (b"ond HTTP/1.1\r\nHost: a\r\n\r\n", "GET /second HTTP/1.1"),
        )
        .await;
    }

    /// On one connection: `first`'s bytes sent and their answer read (ending with its
    /// text), the connection idle past `PARK_AFTER` and parked once, then `then`'s bytes
    /// sent and their answer read (a 200 ending with its text). Through [`echo_node`].
    async fn parked_between(first: (&[u8], &str), then: (&[u8], &str)) {
        parked_between_at(echo_node().await, first, then).await;
    }

    /// [`parked_between`] through `node`.
    async fn parked_between_at(node: SocketAddr, first: (&[u8], &str), then: (&[u8], &str)) {
        use tokio::io::AsyncWriteExt;
        let (mut client, ctx, _drain, _served) = one_connection(node).await;
        client.write_all(first.0).await.expect("the first bytes");
        let answer = read_answer(&mut client).await;
        assert!(answer.ends_with(first.1), "{answer:?}");
        tokio::time::sleep(PARK_AFTER + Duration::from_millis(100)).await;
        assert_eq!(ctx.parks.load(Ordering::Relaxed), 1, "parked once");
        client.write_all(then.0).await.expect("the next bytes");
        let answer = read_answer(&mut client).await;
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer:?}");
        assert!(answer.ends_with(then.1), "{answer:?}");
    }

    /// A head that takes longer than `PARK_AFTER` to come, on a connection that has not
    /// answered yet (hyper holds it busy until its first answer), is answered as usual and
    /// the connection kept alive: not parked, and no `Connection: close`.
    #[tokio::test(start_paused = true)]
    async fn a_first_head_slower_than_the_park_time_keeps_the_connection_alive() {
        use tokio::io::AsyncWriteExt;
        let (mut client, ctx, _drain, _served) = one_connection(echo_node().await).await;
        client
            .write_all(b"GET /slow HTTP/1.1\r\nHo")
            .await
            .expect("half a head");
        tokio::time::sleep(PARK_AFTER * 3).await;
        client
            .write_all(b"st: a\r\n\r\n")
            .await
            .expect("the rest of the head");
        let answer = read_answer(&mut client).await;
        assert!(answer.ends_with("GET /slow HTTP/1.1"), "{answer:?}");
        assert!(
            !answer.to_ascii_lowercase().contains("connection: close"),
            "{answer:?}"
        );
        assert_eq!(ctx.parks.load(Ordering::Relaxed), 0);
        client
            .write_all(b"GET /next HTTP/1.1\r\nHost: a\r\n\r\n")
            .await
            .expect("the next request");
        assert!(read_answer(&mut client)
            .await
            .ends_with("GET /next HTTP/1.1"));
    }

    /// A connection whose POST body (with a `Content-Length`) was read through is parked as
    /// any other once idle, and serves its next request: hyper's client lets such a body go
    /// after its last byte without polling it to its end, which is no cut. (Taken for one,
    /// every such connection was closed at `PARK_AFTER` instead.)
    #[tokio::test(start_paused = true)]
    async fn a_connection_whose_post_body_was_read_through_is_parked() {
        // The echo node reads the POST's body in front of the next head.
        parked_between(
            (
                b"POST /form HTTP/1.1\r\nHost: a\r\ncontent-length: 5\r\n\r\nhello",
                "POST /form HTTP/1.1",
            ),
            (
                b"GET /next HTTP/1.1\r\nHost: a\r\n\r\n",
                "GET /next HTTP/1.1",
            ),
        )
        .await;
    }

    /// The same for a chunked body with trailers, the last frame hyper's client takes of a
    /// body before it lets it go (without polling it to its end).
    #[tokio::test(start_paused = true)]
    async fn a_connection_whose_chunked_body_with_trailers_was_read_through_is_parked() {
        // The echo node's answers, to request heads only: the chunked body's size lines
        // and its end come to it as blocks of their own.
        let node = node_answering(|head| async move {
            let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
            if !line.ends_with(b" HTTP/1.1") {
                return Some(Vec::new());
            }
            let mut answer =
                format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", line.len()).into_bytes();
            answer.extend_from_slice(line);
            Some(answer)
        })
        .await;
        parked_between_at(
            node,
            (
                b"POST /form HTTP/1.1\r\nHost: a\r\ntransfer-encoding: chunked\r\n\r\n\
                  5\r\nhello\r\n0\r\nx-sum: 1\r\n\r\n",
                "POST /form HTTP/1.1",
            ),
            (
                b"GET /next HTTP/1.1\r\nHost: a\r\n\r\n",
                "GET /next HTTP/1.1",
            ),
        )
        .await;
    }

    /// A connection whose request body lost its reader mid-body after it had idled past
    /// `PARK_AFTER` is closed, not parked: hyper, its body's reader gone, stops reading the
    /// body and ends the connection, not between two messages. Two ways: a node that
    /// answered a POST at once (401) without reading its body closes its connection a while
    /// later, or the client's body idles out (`client_idle`, here below the idle limit).
    /// Before, it was parked, and the rest of the body (a request head, were a proxy in
    /// front to send another user's bytes as the body) was read as a request and sent to
    /// the node: request smuggling.
    #[tokio::test(start_paused = true)]
    async fn a_connection_whose_request_body_lost_its_reader_is_closed_not_parked() {
        for idled_out in [false, true] {
            body_lost_its_reader(idled_out).await;
        }
    }

    async fn body_lost_its_reader(idled_out: bool) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        // The node answers each head with a 401 at once, reads nothing more, and closes the
        // connection once told to.
        let node = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind node");
        let node_addr = node.local_addr().expect("node addr");
        let (heads_tx, mut heads) = mpsc::unbounded_channel::<String>();
        let (close_tx, close) = watch::channel(false);
        tokio::spawn(async move {
            while let Ok((mut s, _)) = node.accept().await {
                let (heads_tx, mut close) = (heads_tx.clone(), close.clone());
                tokio::spawn(async move {
                    let mut got = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => got.extend_from_slice(&buf[..n]),
                        }
                    }
                    let line = String::from_utf8_lossy(&got)
                        .lines()
                        .next()
                        .map(str::to_owned);
                    let _ = heads_tx.send(line.unwrap_or_default());
                    let _ = s
                        .write_all(b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 0\r\n\r\n")
                        .await;
                    let _ = close.wait_for(|c| *c).await;
                });
            }
        });
        let proxy = proxy_to_with(node_addr, |c| {
            if idled_out {
                c.timeouts.client_idle = Duration::from_secs(3);
            }
        })
        .await;
        let (mut client, ctx, _drain, served) = served_from(proxy, Duration::ZERO).await;
        client
            .write_all(
                b"POST /upload HTTP/1.1\r\nHost: a\r\ncontent-length: 100000\r\n\r\n0123456789",
            )
            .await
            .expect("a head and the start of its body");
        let answer = read_answer(&mut client).await;
        assert!(answer.starts_with("HTTP/1.1 401 "), "{answer:?}");
        assert_eq!(heads.recv().await.as_deref(), Some("POST /upload HTTP/1.1"));
        // Idle past the park time, the body still to come: hyper goes on reading it.
        tokio::time::sleep(PARK_AFTER + Duration::from_millis(100)).await;
        assert_eq!(ctx.parks.load(Ordering::Relaxed), 0, "parked mid-body");
        if !idled_out {
            let _ = close_tx.send(true);
        }
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(
            ctx.shared().timeouts.header_read / 2,
            client.read_to_end(&mut rest),
        )
        .await;
        assert!(
            matches!(closed, Ok(Ok(0) | Err(_))),
            "the connection stayed open (parks: {}): its next bytes, the rest of the body, \
             would be read as a request head; {rest:?}",
            ctx.parks.load(Ordering::Relaxed)
        );
        assert_eq!(ctx.parks.load(Ordering::Relaxed), 0);
        served.await.expect("served");
        assert!(
            heads.try_recv().is_err(),
            "no other request reached the node"
        );
    }

    /// Parking keeps the connection's limits: a parked connection is closed (a FIN, no
    /// answer) once it has been idle for the wait between requests (`header_read`), and at
    /// once when the listener drains.
    #[tokio::test(start_paused = true)]
    async fn a_parked_connection_closes_at_its_idle_limit_and_on_drain() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let node = echo_node().await;
        for drain in [false, true] {
            let (mut client, ctx, drain_tx, served) = one_connection(node).await;
            client
                .write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
                .await
                .expect("request");
            read_answer(&mut client).await;
            let idle_at = tokio::time::Instant::now();
            tokio::time::sleep(PARK_AFTER + Duration::from_millis(100)).await;
            assert_eq!(ctx.parks.load(Ordering::Relaxed), 1);
            if drain {
                drain_tx.send(true).expect("drain");
            }
            let mut rest = Vec::new();
            let n = client
                .read_to_end(&mut rest)
                .await
                .expect("read to the end");
            assert_eq!(n, 0, "nothing written to a parked connection: {rest:?}");
            let waited = idle_at.elapsed();
            let limit = ctx.shared().timeouts.header_read;
            if drain {
                assert!(
                    waited < limit,
                    "closed on drain, not at the idle limit: {waited:?}"
                );
            } else {
                assert!(waited >= limit, "closed before its idle limit: {waited:?}");
            }
            served.await.expect("served");
        }
    }

    /// A request whose bytes had come before the listener started draining is answered:
    /// the connection is served from those bytes before the drain asks it to close (hyper
    /// closes an HTTP/1 connection at once when it has read nothing). Each round is a
    /// connection whose task first runs after the drain signal; without the connection
    /// polled first, about half of them went unanswered.
    #[tokio::test]
    async fn a_request_that_came_before_the_drain_is_answered() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (runtime, listener) = proxy_to(echo_node().await).await;
        for round in 0..8 {
            let (mut client, server_side, ctx, builder, drain_tx) =
                accepted(&runtime, &listener).await;
            client
                .write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
                .await
                .expect("request");
            drain_tx.send(true).expect("drain");
            let served = tokio::spawn(serve_connection(ctx, builder, server_side));
            let mut answer = Vec::new();
            tokio::time::timeout(Duration::from_secs(10), client.read_to_end(&mut answer))
                .await
                .expect("the connection ends")
                .expect("read");
            let answer = String::from_utf8_lossy(&answer);
            assert!(
                answer.starts_with("HTTP/1.1 200 OK") && answer.ends_with("GET / HTTP/1.1"),
                "round {round}: {answer:?}"
            );
            served.await.expect("served");
        }
    }

    /// An HTTP listener's socket has `TCP_QUICKACK` off (on by default). What that does, one
    /// packet fewer per new connection, shows in packets per request (`bench/cost.sh
    /// --events net:net_dev_xmit`); `getsockopt` on an accepted socket reports its own
    /// pingpong state, not what it inherited, so it cannot show it here.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn an_http_listener_delays_the_ack_of_a_first_request() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let quickack = |s: socket2::SockRef<'_>| s.tcp_quickack().expect("TCP_QUICKACK");
        assert!(quickack((&listener).into()), "on by default");
        super::delay_first_acks(&listener);
        assert!(!quickack((&listener).into()));
    }

    /// A client whose connection was accepted just before its listener drained (a shutdown,
    /// or an upgrade handing the socket over) and whose request was still on its way is
    /// answered: it has `FIRST_BYTES_GRACE` from its accept to send its first bytes. One that
    /// sends nothing is closed once that has passed. Before, both were closed at the drain.
    #[tokio::test]
    async fn a_request_on_its_way_as_the_listener_drains_is_answered() {
        use tokio::io::AsyncReadExt;
        let node = echo_node().await;
        let (mut client, _ctx, drain, served) = one_connection(node).await;
        let (mut silent, _ctx2, drain2, served2) = one_connection(node).await;
        drain.send(true).expect("drain");
        drain2.send(true).expect("drain");
        // The request comes 50 ms after the drain (with the grace at 0 the connection is
        // closed by then and this fails).
        answered_after_the_drain(&mut client, Duration::from_millis(50)).await;
        // Answered, then closed: the listener is draining.
        let mut buf = [0u8; 64];
        assert!(matches!(client.read(&mut buf).await, Ok(0) | Err(_)));
        tokio::time::timeout(Duration::from_secs(5), served)
            .await
            .expect("the connection ends")
            .expect("served");
        let started = tokio::time::Instant::now();
        assert!(matches!(
            tokio::time::timeout(Duration::from_secs(5), silent.read(&mut buf)).await,
            Ok(Ok(0) | Err(_))
        ));
        assert!(started.elapsed() < FIRST_BYTES_GRACE + Duration::from_secs(1));
        tokio::time::timeout(Duration::from_secs(5), served2)
            .await
            .expect("the silent connection ends")
            .expect("served");
    }

    /// The grace runs from when the connection is ready for its request, not from its
    /// accept: a client whose TLS handshake took 900 ms (a far client) and whose request
    /// leaves 200 ms after it, as the listener drains, is answered. Before, the grace had
    /// run out 100 ms before the request and the connection was closed unanswered.
    #[tokio::test]
    async fn a_request_after_a_slow_handshake_as_the_listener_drains_is_answered() {
        let node = echo_node().await;
        let (mut client, _ctx, drain, served) =
            one_connection_ago(node, Duration::from_millis(900)).await;
        drain.send(true).expect("drain");
        // Counted from the accept, the grace ends 100 ms before the request.
        answered_after_the_drain(&mut client, Duration::from_millis(200)).await;
        tokio::time::timeout(Duration::from_secs(5), served)
            .await
            .expect("the connection ends")
            .expect("served");
    }
}
