//! # Binary upgrades without a refused client: a new limpet takes over a running one's sockets
//!
//! `limpet run --upgrade-socket PATH` listens on a Unix socket at PATH. A second `limpet run`
//! started with the same flag finds the first there and takes over from it, as HAProxy's
//! `-x` and nginx's binary upgrade do:
//!
//! ```text
//!  running limpet (the holder)                       new limpet (the taker)
//!    Unix listener at PATH  ◄──── connect, "limpet-upgrade 1" ──── config loaded and valid;
//!    (a peer of another user: refused)                             the holder must be of
//!                                                                  its user too
//!    ── offer: header (JSON) and the listening sockets' descriptors (SCM_RIGHTS) ──►
//!                                                    takes those its config binds (none:
//!                                                    refused, the wrong limpet), binds the
//!                                                    others, starts everything but does not
//!                                                    accept yet (at most HANDOVER_LIMIT)
//!    ◄──────────────────────────── "ready" ──────────
//!    stops accepting (its accept loops end; it keeps copies of the sockets) and waits for
//!    its accept loops to end; then reads its state as it is now
//!    ── "stopping", then each table's pins (snapshot bytes), each node's admin state ──►
//!       and health
//!                                                    loads them
//!    ◄──────────────────────────── "took" ───────────
//!    closes its copies; drains as on SIGTERM,        accepts from now on, binds PATH anew
//!    exits (no snapshot save: the taker owns         for the next upgrade; watches the
//!    the files now); keeps the connection open       connection: its end is the holder's
//!    until it exits                                  exit ([`Predecessor`])
//!    ◄──── node states and health as they change, sessions moved off a node ([`Told`]) ──
//!    what it drains obeys them
//!    no "took" (the taker died or hangs): serves its sockets again from its copies
//! ```
//!
//! The listening sockets are the same kernel objects before and after, so a client connecting
//! at any moment of an upgrade lands in an accept queue someone serves: none is refused, and
//! none waiting in a queue is reset (closing a listener and binding it again refuses the first
//! and resets the second). Until the holder reads "ready" nothing changes for it: a taker that
//! fails (a bind error, a store it cannot reach) exits and the holder serves on; one the
//! holder started itself on SIGUSR2 and that is not ready within its limit
//! ([`SUCCESSOR_LIMIT`] by default; hung on its config's mount) is killed by it. A taker
//! that hears no "stopping" within [`HANDOVER_LIMIT`], or cannot say "took", exits without
//! having accepted anything, so two processes never serve one socket with tables of their
//! own. Past "stopping" the holder takes no client until it has heard "took" or given up on
//! it: a taker that dies there costs a wait in the accept queues, not a refused client. The
//! pins and states cross once the holder has stopped accepting, so none it made meanwhile is
//! left behind (but for what its requests still in flight do while it drains).
//!
//! Linux only (`SO_PEERCRED`, `SCM_RIGHTS` with close-on-exec), like the rest of limpet's
//! socket handling.
//!
//! Only this module touches descriptors; it hands `std::net::TcpListener`s to the runtime.

use std::io::{IoSlice, IoSliceMut, Write};
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use limpet_core::{AdminState, CarriedHealth, CheckCounts};
use serde::{Deserialize, Serialize};

/// The first line a taker sends.
const HELLO: &[u8] = b"limpet-upgrade 1\n";
const READY: &[u8] = b"ready\n";
const STOPPING: &[u8] = b"stopping\n";
const TOOK: &[u8] = b"took\n";

/// How long each step of a handover may take: the offer, the taker's start up to "ready",
/// the holder's "stopping" and the taker's "took". A step past it ends the handover: before
/// "stopping" nothing has changed hands; after it, the holder serves again.
pub const HANDOVER_LIMIT: Duration = Duration::from_secs(30);

/// How long a taker has from its connect to its "ready": the offer's step and its start's.
const OFFER_LIMIT: Duration = Duration::from_secs(2 * HANDOVER_LIMIT.as_secs());

/// The least difference between the holder's clock and the taker's taken as a step of the
/// wall clock between their starts ([`State::clock_offset`]); less is the handover's own
/// time.
pub use crate::clock::CLOCK_STEP_MIN;

/// Descriptors per `SCM_RIGHTS` message (the kernel takes at most 253).
const FDS_PER_MESSAGE: usize = 200;

/// The largest offer header read (JSON: sockets, table names and lengths, node states).
const MAX_HEADER: u64 = 16 << 20;

/// What a listening socket serves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    /// A listener of the config, by name.
    Listener(String),
    /// The admin listener.
    Admin,
}

/// One listening socket as the holder describes it.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct SocketEntry {
    role: Role,
    /// The address as the config wrote it (port 0 included).
    configured: SocketAddr,
    /// Where it is bound.
    local: SocketAddr,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct TableEntry {
    name: String,
    len: u64,
}

/// A node's admin state, as it crosses (deadlines are wall-clock milliseconds, the same in
/// both processes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum NodeAdmin {
    Ready,
    Drain {
        deadline_ms: Option<u64>,
        spread_ms: u64,
    },
    Maint,
}

impl From<AdminState> for NodeAdmin {
    fn from(a: AdminState) -> Self {
        match a {
            AdminState::Ready => Self::Ready,
            AdminState::Drain {
                deadline_ms,
                spread_ms,
            } => Self::Drain {
                deadline_ms,
                spread_ms,
            },
            AdminState::Maint => Self::Maint,
        }
    }
}

impl From<NodeAdmin> for AdminState {
    fn from(a: NodeAdmin) -> Self {
        match a {
            NodeAdmin::Ready => Self::Ready,
            NodeAdmin::Drain {
                deadline_ms,
                spread_ms,
            } => Self::Drain {
                deadline_ms,
                spread_ms,
            },
            NodeAdmin::Maint => Self::Maint,
        }
    }
}

/// The offer: who offers, and the sockets whose descriptors follow.
#[derive(Debug, Serialize, Deserialize)]
struct Header {
    pid: u32,
    sockets: Vec<SocketEntry>,
}

/// The holder's state once it has stopped accepting; the tables' bytes follow.
#[derive(Debug, Serialize, Deserialize)]
struct Last {
    tables: Vec<TableEntry>,
    nodes: Vec<(String, NodeAdmin)>,
    /// Added after the first version: a holder without it hands no health over (the taker
    /// starts every node UP), and one with it is understood by a taker that ignores it.
    /// Each entry is read on its own ([`HealthEntry`]): one a later version wrote in another
    /// shape is left out, not the whole state with it.
    #[serde(default)]
    health: Vec<serde_json::Value>,
    /// The holder's clock ([`crate::clock::now_ms`]) as it sent this: the taker moves every
    /// time it hands over onto its own clock by the difference (each process anchors its
    /// clock to the wall clock once, at its start, so a wall clock stepped in between sets
    /// them apart). Added after the first version.
    #[serde(default)]
    now_ms: Option<u64>,
    /// Each node's connections open in the holder and its last sighting of a session
    /// ([`NodeSeen`]), read entry by entry as `health` is. Added after the first version.
    #[serde(default)]
    seen: Vec<serde_json::Value>,
}

/// A node's health as it crosses ([`limpet_core::CarriedHealth`], its checks named by what
/// they ask; times wall-clock milliseconds).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct HealthEntry {
    node: String,
    up: bool,
    streak: u32,
    unanswered: bool,
    retry_at_ms: Option<u64>,
    #[serde(default)]
    trial_claimed_until_ms: u64,
    slow: u32,
    slow_since_ms: u64,
    /// `checks`, `traffic`, `slow-answers` or `forced` (a name not known here reads as
    /// `traffic`).
    down_cause: Option<String>,
    checks: Vec<CheckEntry>,
    since_ms: u64,
    /// The node's address in the holder: health is of that address. Added after the first
    /// version (a holder without it is taken at its word).
    #[serde(default)]
    address: Option<std::net::IpAddr>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct CheckEntry {
    label: String,
    fails: u8,
    passes: Option<u8>,
}

impl From<&NodeHealth> for HealthEntry {
    fn from(n: &NodeHealth) -> Self {
        let h = &n.health;
        HealthEntry {
            node: n.node.clone(),
            up: h.up,
            streak: h.streak,
            unanswered: h.unanswered,
            retry_at_ms: h.retry_at_ms,
            trial_claimed_until_ms: h.trial_claimed_until_ms,
            slow: h.slow,
            slow_since_ms: h.slow_since_ms,
            down_cause: h.down_cause.map(|c| c.as_str().to_owned()),
            checks: h
                .checks
                .iter()
                .map(|(label, c)| CheckEntry {
                    label: label.clone(),
                    fails: c.fails,
                    passes: c.passes,
                })
                .collect(),
            since_ms: n.since_ms,
            address: n.address,
        }
    }
}

impl From<HealthEntry> for NodeHealth {
    fn from(e: HealthEntry) -> Self {
        NodeHealth {
            node: e.node,
            health: CarriedHealth {
                up: e.up,
                streak: e.streak,
                unanswered: e.unanswered,
                retry_at_ms: e.retry_at_ms,
                trial_claimed_until_ms: e.trial_claimed_until_ms,
                slow: e.slow,
                slow_since_ms: e.slow_since_ms,
                down_cause: e.down_cause.map(|c| {
                    limpet_core::DownCause::from_name(&c).unwrap_or(limpet_core::DownCause::Traffic)
                }),
                checks: e
                    .checks
                    .into_iter()
                    .map(|c| {
                        (
                            c.label,
                            CheckCounts {
                                fails: c.fails,
                                passes: c.passes,
                            },
                        )
                    })
                    .collect(),
            },
            since_ms: e.since_ms,
            address: e.address,
        }
    }
}

/// A listening socket the running limpet serves, kept to be offered (a duplicate of the
/// descriptor it accepts on).
#[derive(Debug)]
pub struct HeldSocket {
    pub role: Role,
    pub configured: SocketAddr,
    pub local: SocketAddr,
    pub fd: OwnedFd,
}

impl HeldSocket {
    /// A duplicate of `listener` to offer later.
    pub fn of(
        role: Role,
        configured: SocketAddr,
        listener: &std::net::TcpListener,
    ) -> std::io::Result<Self> {
        Ok(Self {
            role,
            configured,
            local: listener.local_addr()?,
            fd: OwnedFd::from(listener.try_clone()?),
        })
    }
}

/// The listening sockets a running limpet would hand over: copies, kept until it stops (a
/// stopping limpet refuses new clients at once rather than leaving them queued on a socket
/// nobody serves) or until a new limpet has taken the sockets over.
#[derive(Debug, Default)]
pub struct Held(std::sync::Mutex<Option<Vec<HeldSocket>>>);

impl Held {
    pub fn new(sockets: Vec<HeldSocket>) -> Self {
        Self(std::sync::Mutex::new(Some(sockets)))
    }

    /// Closes every copy held (the listeners' own close as their accept loops end).
    pub fn close(&self) {
        drop(self.lock().take());
    }

    /// Copies of the listeners' sockets (not the admin one's), in the order they were held,
    /// each with its listener's name and where it is bound, to serve them again after a
    /// handover that failed late.
    pub fn listeners(&self) -> Vec<(String, SocketAddr, std::net::TcpListener)> {
        self.lock()
            .iter()
            .flatten()
            .filter_map(|s| match &s.role {
                Role::Listener(name) => {
                    s.fd.try_clone()
                        .ok()
                        .map(|fd| (name.clone(), s.local, std::net::TcpListener::from(fd)))
                }
                Role::Admin => None,
            })
            .collect()
    }

    /// A copy of the admin listener's socket, if one is held.
    pub fn admin(&self) -> Option<std::net::TcpListener> {
        self.lock()
            .iter()
            .flatten()
            .find(|s| s.role == Role::Admin)
            .and_then(|s| s.fd.try_clone().ok())
            .map(std::net::TcpListener::from)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Vec<HeldSocket>>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The holder's state, read once it has stopped accepting, sent with "stopping".
#[derive(Debug, Default, PartialEq, Eq)]
pub struct State {
    /// Each table's pins (snapshot bytes), by name.
    pub tables: Vec<(String, Vec<u8>)>,
    /// Each node's admin state, by name.
    pub nodes: Vec<(String, AdminState)>,
    /// Each node's health.
    pub health: Vec<NodeHealth>,
    /// The holder's clock ([`crate::clock::now_ms`]) as it read this state (`None` from a
    /// holder of the first version): see [`State::on_clock`].
    pub holder_now_ms: Option<u64>,
    /// What each node has open in the holder, and when it last saw a session there.
    pub seen: Vec<NodeSeen>,
}

impl State {
    /// How far the clock that reads `now_ms` now is ahead of the holder's (ms; negative:
    /// behind): each process anchors its clock to the wall clock at its start, and a wall
    /// clock stepped since the holder started sets the two apart by the step. 0 without the
    /// holder's reading, and below [`CLOCK_STEP_MIN`]: the holder read its clock before the
    /// state crossed, so the difference holds the crossing's time too, which is no step.
    pub fn clock_offset(&self, now_ms: u64) -> i64 {
        let Some(then) = self.holder_now_ms else {
            return 0;
        };
        let offset = i64::try_from(i128::from(now_ms) - i128::from(then)).unwrap_or(0);
        if offset.unsigned_abs() < CLOCK_STEP_MIN.as_millis() as u64 {
            0
        } else {
            offset
        }
    }

    /// This state with every time in it (drain deadlines, trial times, slow-answer windows,
    /// times in state) moved by [`clock_offset`](Self::clock_offset) onto the clock that
    /// reads `now_ms` now. The tables' pins move as they are loaded
    /// (`runtime::snapshot::restore_handed`).
    pub fn on_clock(mut self, now_ms: u64) -> State {
        let offset = i128::from(self.clock_offset(now_ms));
        if offset == 0 {
            return self;
        }
        let shift = |t: u64| u64::try_from((i128::from(t) + offset).max(0)).unwrap_or(u64::MAX);
        for (_, admin) in &mut self.nodes {
            if let AdminState::Drain {
                deadline_ms: Some(d),
                ..
            } = admin
            {
                *d = shift(*d);
            }
        }
        for n in &mut self.health {
            let h = &mut n.health;
            h.retry_at_ms = h.retry_at_ms.map(shift);
            if h.trial_claimed_until_ms > 0 {
                h.trial_claimed_until_ms = shift(h.trial_claimed_until_ms);
            }
            if h.slow > 0 {
                h.slow_since_ms = shift(h.slow_since_ms);
            }
            n.since_ms = shift(n.since_ms);
        }
        for n in &mut self.seen {
            n.last_seen_ms = n.last_seen_ms.map(shift);
        }
        self.holder_now_ms = Some(now_ms);
        self
    }
}

/// A node's health as the holder judged it, carried so that a node DOWN there is DOWN in
/// the taker (not UP until its checks or traffic fail again), with the counts toward its
/// next flip.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeHealth {
    pub node: String,
    /// Its checks named by what they ask ([`crate::health::CheckSpec::label`]): a check slot
    /// is a process's own.
    pub health: CarriedHealth<String>,
    /// When the node entered its state (wall-clock ms).
    pub since_ms: u64,
    /// The address the health is of (`None` from a holder that did not say): a taker whose
    /// config gives the node another address starts its health anew, as a reload does.
    pub address: Option<std::net::IpAddr>,
}

/// What the holder had of a node as it handed over, so that the taker does not call the
/// node's drain complete while the holder still drains sessions on it, or saw one within
/// the drain's idle window: it has neither of its own yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeSeen {
    pub node: String,
    /// Connections, TCP sessions and tunnels open to it.
    pub open: u64,
    /// When a session was last seen on it (wall-clock ms).
    pub last_seen_ms: Option<u64>,
}

/// The taker's end of the handover's connection, once it took over: the holder keeps its
/// own end open until it exits, so this one's end of file is the holder's exit, drain
/// included. A holder of an earlier version closes it at once: gone at once, as before.
#[derive(Debug)]
pub struct Predecessor {
    conn: UnixStream,
}

impl Predecessor {
    /// Resolves once the limpet taken over from has exited (or its end failed). Meanwhile
    /// tells it what `told` brings ([`Told`]): it drains connections of its own, which
    /// must obey what happens here as they would there. Each message is written within
    /// a second (`TELL_LIMIT`); one that is not (a holder of an earlier version, which reads
    /// nothing after "took", once the socket's buffer is full) ends the telling, not the
    /// watch for the holder's exit.
    pub async fn gone_telling(self, mut told: tokio::sync::mpsc::Receiver<Told>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let Ok(conn) = self
            .conn
            .set_nonblocking(true)
            .and_then(|()| tokio::net::UnixStream::from_std(self.conn))
        else {
            return;
        };
        let (mut rd, mut wr) = conn.into_split();
        let mut buf = [0u8; 64];
        let mut telling = true;
        loop {
            tokio::select! {
                // The holder says nothing on it: read (and drop) until its end.
                r = rd.read(&mut buf) => if matches!(r, Ok(0) | Err(_)) {
                    return;
                },
                t = told.recv(), if telling => {
                    let Some(mut t) = t else {
                        telling = false;
                        continue;
                    };
                    // The clock reading the holder measures the two clocks' difference by:
                    // as the message leaves, not as it was made (it may have waited).
                    t.state.holder_now_ms = Some(crate::clock::now_ms());
                    let Ok(json) = serde_json::to_vec(&ToldWire::from(t)) else {
                        continue;
                    };
                    let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
                    bytes.extend_from_slice(&json);
                    let wrote = tokio::time::timeout(TELL_LIMIT, wr.write_all(&bytes)).await;
                    if !matches!(wrote, Ok(Ok(()))) {
                        tracing::warn!("upgrade: the limpet taken over from does not take what this one tells it; it drains on what it knew");
                        telling = false;
                        // Its sender learns it, and stops gathering what to tell.
                        told.close();
                    }
                }
            }
        }
    }
}

/// How long one message to the limpet taken over from may take to write ([`Told`]).
const TELL_LIMIT: Duration = Duration::from_secs(1);

/// What a taker tells the limpet it took over from while that one drains: each node's
/// admin state and health as they change in the taker (an operator's MAINT, a node its
/// checks took DOWN, a node its reload removed), and the sessions it moved off a node.
/// The holder's own checks stopped when it handed over and its admin API refuses writes:
/// without this, the connections and TCP sessions it drains obeyed none of it until its
/// drain's end (a session moved on the taker while its TCP session drains on the holder
/// lived on two nodes).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Told {
    /// The changed nodes' admin states and health, with the taker's clock reading as the
    /// message leaves (`holder_now_ms`, as the handover's state has it; its tables and
    /// sightings empty).
    pub state: State,
    /// Sessions moved off a node in the taker: node, spread key, why.
    pub moved: Vec<crate::nodes::MovedOff>,
}

/// [`Told`] as it crosses: a length and JSON, as a header ([`read_json`]): the handover's
/// state header ([`Last`], its tables and sightings empty) and the moves. What is not
/// understood is left out alone.
#[derive(Debug, Serialize, Deserialize)]
struct ToldWire {
    #[serde(flatten)]
    state: Last,
    /// Node, spread key, why (as logs write it).
    #[serde(default)]
    moved: Vec<(String, u64, String)>,
}

impl From<Told> for ToldWire {
    fn from(t: Told) -> Self {
        ToldWire {
            state: Last::from(&t.state),
            moved: t
                .moved
                .into_iter()
                .map(|(n, k, why)| (n, k, why.as_str().to_owned()))
                .collect(),
        }
    }
}

impl From<ToldWire> for Told {
    fn from(w: ToldWire) -> Self {
        Told {
            state: state_of(w.state, Vec::new()),
            moved: w
                .moved
                .into_iter()
                .filter_map(|(n, k, why)| Some((n, k, crate::nodes::EndReason::parse(&why)?)))
                .collect(),
        }
    }
}

/// The holder's end of the handover's connection after the taker took over: kept open until
/// the holder exits ([`Predecessor`]).
#[derive(Debug)]
pub struct HandedOver {
    conn: UnixStream,
}

impl HandedOver {
    /// What the taker tells this limpet from now on ([`Told`]), read on a copy of the
    /// connection (this one stays open until the process exits). `None`: no copy.
    pub fn told(&self) -> Option<Telling> {
        let conn = self.conn.try_clone().ok()?;
        conn.set_nonblocking(true).ok()?;
        tokio::net::UnixStream::from_std(conn)
            .ok()
            .map(|conn| Telling { conn })
    }
}

/// What the taker tells the holder it took over from, a message at a time
/// ([`HandedOver::told`]).
#[derive(Debug)]
pub struct Telling {
    conn: tokio::net::UnixStream,
}

impl Telling {
    /// The next message; `None` at the taker's end (or a message too large, or a read that
    /// failed: nothing more is read then). One not understood is skipped.
    pub async fn next(&mut self) -> Option<Told> {
        use tokio::io::AsyncReadExt;
        loop {
            let mut len = [0u8; 8];
            self.conn.read_exact(&mut len).await.ok()?;
            let len = u64::from_le_bytes(len);
            if len > MAX_HEADER {
                tracing::warn!(
                    len,
                    "upgrade: a message from the new limpet too large; no more are read"
                );
                return None;
            }
            let mut json = vec![0u8; usize::try_from(len).ok()?];
            self.conn.read_exact(&mut json).await.ok()?;
            match serde_json::from_slice::<ToldWire>(&json) {
                Ok(w) => return Some(w.into()),
                Err(e) => {
                    tracing::warn!(error = %e, "upgrade: a message from the new limpet not understood; skipped")
                }
            }
        }
    }
}

/// What a taker received from the running limpet.
#[derive(Debug)]
pub struct Handover {
    /// The running limpet's process id, as the kernel tells it (its socket's credentials),
    /// not as it says it.
    pub from_pid: u32,
    sockets: Vec<(SocketEntry, OwnedFd)>,
    conn: UnixStream,
}

impl Handover {
    /// The sockets offered for `role` at the configured address `configured`: every one of
    /// them (one per worker thread of the running limpet), to be served all, since the
    /// kernel deals new clients to each. A port-0 address matches only a listener of the
    /// same name (two such lines would otherwise be one).
    pub fn take(
        &mut self,
        role: &Role,
        configured: SocketAddr,
    ) -> std::io::Result<Vec<std::net::TcpListener>> {
        let matches = |e: &SocketEntry| {
            e.configured == configured
                && match (&e.role, role) {
                    (Role::Admin, Role::Admin) => true,
                    (Role::Listener(a), Role::Listener(b)) => configured.port() != 0 || a == b,
                    _ => false,
                }
        };
        let mut out = Vec::new();
        let mut rest = Vec::with_capacity(self.sockets.len());
        for (e, fd) in self.sockets.drain(..) {
            if matches(&e) {
                let l = std::net::TcpListener::from(fd);
                l.set_nonblocking(true)?;
                out.push(l);
            } else {
                rest.push((e, fd));
            }
        }
        self.sockets = rest;
        Ok(out)
    }

    /// How many of the listener sockets offered (not the admin one's) are not taken yet.
    pub fn listeners_offered(&self) -> usize {
        self.sockets
            .iter()
            .filter(|(e, _)| matches!(e.role, Role::Listener(_)))
            .count()
    }

    /// The offered sockets no listener of this config took (closed with the handover: the
    /// running limpet closes its copies once this one took over, and clients are refused
    /// there from then on).
    pub fn untaken(&self) -> Vec<SocketAddr> {
        self.sockets.iter().map(|(e, _)| e.local).collect()
    }

    /// Tells the running limpet that this one is ready, waits for it to stop accepting (at
    /// most [`HANDOVER_LIMIT`]), reads its pins and node states as they are then, and says
    /// it took over. Blocking.
    ///
    /// `Err`: not taken over (no confirmation, a state this one could not read whole, or
    /// this one's "took" did not reach it: it serves on, or again); this one must exit
    /// without accepting. `Ok`: this one must serve, with the state, and the running one's
    /// end, to learn when it has exited.
    ///
    /// "took" is said only once the whole state is read. Said after a state it could not
    /// read (too large, a header it does not understand, a transfer that stalled), it
    /// stopped reading with the rest unsent: the running one, blocked writing it, gave up
    /// at its limit and served again, never reading the "took" behind it, while this one
    /// served too: two limpets on one socket, each with tables of its own.
    pub fn complete(self) -> Result<(State, Predecessor), String> {
        self.complete_after_stopping(|| {})
    }

    /// [`complete`](Self::complete), running `between` once the running one has said it
    /// stopped accepting, before its state is read: where a test makes something happen to
    /// the running one in the middle of a handover.
    pub fn complete_after_stopping(
        mut self,
        between: impl FnOnce(),
    ) -> Result<(State, Predecessor), String> {
        self.sockets.clear();
        let pid = self.from_pid;
        // Bounded as a whole, as the running one bounds its side: each read's own timeout
        // is pushed back by every byte, and a holder that dribbled them held this start.
        let _whole = Whole::within(&self.conn, OFFER_LIMIT).map_err(|e| {
            format!("the running limpet (pid {pid}) did not confirm the handover: {e}")
        })?;
        let fail = |e: std::io::Error| {
            format!("the running limpet (pid {pid}) did not confirm the handover: {e}")
        };
        (&self.conn).write_all(READY).map_err(fail)?;
        let mut fds = Vec::new();
        let mut got = [0u8; STOPPING.len()];
        read_exact_fds(&self.conn, &mut got, &mut fds).map_err(fail)?;
        if got != STOPPING {
            return Err(format!(
                "the running limpet (pid {pid}) answered the handover with something else"
            ));
        }
        between();
        let state = receive_state(&self.conn, &mut fds).map_err(|e| {
            format!("the running limpet's (pid {pid}) pins and node states: {e}; it serves on")
        })?;
        (&self.conn).write_all(TOOK).map_err(|e| {
            format!("the running limpet (pid {pid}) did not hear that this one took over: {e}")
        })?;
        Ok((state, Predecessor { conn: self.conn }))
    }
}

/// Asks the limpet listening at `path` for its sockets. `Ok(None)` when none listens there
/// (no file, or a file left by one that exited): start afresh. Blocking; each read and write
/// bounded by [`HANDOVER_LIMIT`], the whole offer by twice that (`OFFER_LIMIT`).
pub fn take_over(path: &Path) -> Result<Option<Handover>, String> {
    let conn = match UnixStream::connect(path) {
        Ok(c) => c,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            return Ok(None)
        }
        Err(e) => return Err(format!("upgrade socket {}: {e}", path.display())),
    };
    let fail = |e: std::io::Error| {
        format!(
            "upgrade socket {}: taking over from the running limpet: {e}",
            path.display()
        )
    };
    // Sockets, pins and states are taken from a process of this user (or root) only: a
    // socket at PATH made by anyone else could hand over listeners it keeps copies of.
    let peer = rustix::net::sockopt::socket_peercred(&conn).map_err(|e| fail(e.into()))?;
    if !(peer.uid == rustix::process::getuid() || peer.uid.is_root()) {
        return Err(format!(
            "upgrade socket {}: its process runs as uid {}, not this one's: not taking over",
            path.display(),
            peer.uid.as_raw()
        ));
    }
    conn.set_read_timeout(Some(HANDOVER_LIMIT)).map_err(fail)?;
    conn.set_write_timeout(Some(HANDOVER_LIMIT)).map_err(fail)?;
    take_over_within(
        conn,
        OFFER_LIMIT,
        peer.pid.as_raw_nonzero().get().unsigned_abs(),
    )
    .map(Some)
    .map_err(fail)
}

/// [`take_over`]'s offer, read within `limit` as a whole: the socket is shut down at the
/// limit, which ends a read a holder keeps alive a byte at a time (each read's own timeout
/// is pushed back by every byte). A real limpet sends its offer within [`OFFER_LIMIT`].
fn take_over_within(conn: UnixStream, limit: Duration, holder: u32) -> std::io::Result<Handover> {
    let _whole = Whole::within(&conn, limit)?;
    (&conn).write_all(HELLO)?;
    receive(conn).map(|h| Handover {
        from_pid: holder,
        ..h
    })
}

/// Shuts a socket down both ways once `limit` has passed, unless dropped first: what bounds
/// a blocking exchange as a whole. A thread of its own waits for the limit or the drop.
struct Whole {
    done: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Whole {
    fn within(conn: &UnixStream, limit: Duration) -> std::io::Result<Whole> {
        let copy = conn.try_clone()?;
        let (done, stop) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("limpet-handover-limit".into())
            .spawn(move || {
                if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = stop.recv_timeout(limit) {
                    let _ = copy.shutdown(std::net::Shutdown::Both);
                }
            })?;
        Ok(Whole {
            done: Some(done),
            thread: Some(thread),
        })
    }
}

impl Drop for Whole {
    fn drop(&mut self) {
        // The sender gone ends the thread's wait at once.
        drop(self.done.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn invalid(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned())
}

/// Reads an offer: the header, the descriptors, the tables' bytes.
fn receive(conn: UnixStream) -> std::io::Result<Handover> {
    let mut fds = Vec::new();
    let header: Header = read_json(&conn, &mut fds, "offer header")?;
    let mut marks = vec![0u8; header.sockets.len().div_ceil(FDS_PER_MESSAGE)];
    read_exact_fds(&conn, &mut marks, &mut fds)?;
    if fds.len() != header.sockets.len() {
        return Err(invalid(&format!(
            "offered {} sockets, received {} descriptors",
            header.sockets.len(),
            fds.len()
        )));
    }
    Ok(Handover {
        from_pid: header.pid,
        sockets: header.sockets.into_iter().zip(fds).collect(),
        conn,
    })
}

/// Reads the holder's last state: its header, then each table's bytes.
fn receive_state(conn: &UnixStream, fds: &mut Vec<OwnedFd>) -> std::io::Result<State> {
    let last: Last = read_json(conn, fds, "state header")?;
    let mut tables = Vec::with_capacity(last.tables.len());
    for t in &last.tables {
        let n = usize::try_from(t.len).map_err(|_| invalid("table length"))?;
        // Grown as the bytes come, not allocated up front from a length the peer wrote.
        let mut bytes = Vec::with_capacity(n.min(1 << 20));
        let mut chunk = vec![0u8; n.min(1 << 16)];
        let mut left = n;
        while left > 0 {
            let k = left.min(chunk.len());
            let part = chunk.get_mut(..k).ok_or_else(|| invalid("table chunk"))?;
            read_exact_fds(conn, part, fds)?;
            bytes.extend_from_slice(part);
            left -= k;
        }
        tables.push((t.name.clone(), bytes));
    }
    if !fds.is_empty() {
        return Err(invalid("descriptors with the state"));
    }
    Ok(state_of(last, tables))
}

/// The state a header tells, with its tables' bytes.
fn state_of(last: Last, tables: Vec<(String, Vec<u8>)>) -> State {
    State {
        tables,
        nodes: last.nodes.into_iter().map(|(n, a)| (n, a.into())).collect(),
        health: read_health(last.health),
        holder_now_ms: last.now_ms,
        seen: last
            .seen
            .into_iter()
            .filter_map(|v| serde_json::from_value::<NodeSeen>(v).ok())
            .collect(),
    }
}

impl From<&State> for Last {
    /// The header of `state`: its tables by name and length (their bytes follow it).
    fn from(state: &State) -> Self {
        Last {
            tables: state
                .tables
                .iter()
                .map(|(name, b)| TableEntry {
                    name: name.clone(),
                    len: b.len() as u64,
                })
                .collect(),
            nodes: state
                .nodes
                .iter()
                .map(|(n, a)| (n.clone(), NodeAdmin::from(*a)))
                .collect(),
            health: state
                .health
                .iter()
                .filter_map(|h| serde_json::to_value(HealthEntry::from(h)).ok())
                .collect(),
            now_ms: state.holder_now_ms,
            seen: state
                .seen
                .iter()
                .filter_map(|n| serde_json::to_value(n).ok())
                .collect(),
        }
    }
}

/// Each node's health as the holder wrote it, entry by entry: one not understood (a later
/// version's shape) is logged and left out, its node judged by this limpet's checks and
/// traffic alone, and the others are kept.
fn read_health(entries: Vec<serde_json::Value>) -> Vec<NodeHealth> {
    entries
        .into_iter()
        .filter_map(|v| match serde_json::from_value::<HealthEntry>(v) {
            Ok(e) => Some(NodeHealth::from(e)),
            Err(e) => {
                tracing::warn!(error = %e, "upgrade: a node's health not understood; left to this limpet's checks and traffic");
                None
            }
        })
        .collect()
}

/// A header as it crosses: its length (8 bytes, little-endian, at most [`MAX_HEADER`]), then
/// its JSON.
fn read_json<T: serde::de::DeserializeOwned>(
    conn: &UnixStream,
    fds: &mut Vec<OwnedFd>,
    what: &str,
) -> std::io::Result<T> {
    let mut len = [0u8; 8];
    read_exact_fds(conn, &mut len, fds)?;
    let len = u64::from_le_bytes(len);
    if len > MAX_HEADER {
        return Err(invalid(&format!("{what} too large")));
    }
    let mut json = vec![0u8; usize::try_from(len).map_err(|_| invalid(what))?];
    read_exact_fds(conn, &mut json, fds)?;
    serde_json::from_slice(&json).map_err(|e| invalid(&format!("{what}: {e}")))
}

/// [`read_json`]'s counterpart.
fn write_json(mut conn: &UnixStream, header: &impl Serialize) -> std::io::Result<()> {
    let json = serde_json::to_vec(header).map_err(std::io::Error::other)?;
    conn.write_all(&(json.len() as u64).to_le_bytes())?;
    conn.write_all(&json)
}

/// Fills `buf` from `conn`, keeping every descriptor that comes with the bytes (every read
/// goes through `recvmsg`, so none is dropped by a plain read).
fn read_exact_fds(
    conn: &UnixStream,
    mut buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
) -> std::io::Result<()> {
    use rustix::net::{recvmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    while !buf.is_empty() {
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(253))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let n = {
            let mut iov = [IoSliceMut::new(buf)];
            match recvmsg(conn, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC) {
                Ok(r) => r.bytes,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        };
        for msg in control.drain() {
            if let RecvAncillaryMessage::ScmRights(got) = msg {
                fds.extend(got);
            }
        }
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf = buf.get_mut(n..).unwrap_or_default();
    }
    Ok(())
}

/// Sends the offer to a taker that said hello, then waits for its "ready". `Ok` once it is
/// ready: the caller stops accepting and then calls [`Ready::confirm`]. Blocking.
fn offer(conn: &UnixStream, held: &Held) -> std::io::Result<()> {
    let mut hello = [0u8; HELLO.len()];
    read_exact_fds(conn, &mut hello, &mut Vec::new())?;
    if hello != HELLO {
        return Err(invalid("not a limpet upgrade"));
    }
    // Copies, so that a stop closing the held sockets never waits for a slow taker.
    let sockets = held
        .lock()
        .as_deref()
        .ok_or_else(|| invalid("this limpet is stopping"))?
        .iter()
        .map(|s| {
            Ok(HeldSocket {
                role: s.role.clone(),
                configured: s.configured,
                local: s.local,
                fd: s.fd.try_clone()?,
            })
        })
        .collect::<std::io::Result<Vec<_>>>()?;
    send_offer(conn, &sockets)?;
    drop(sockets);
    let mut ready = [0u8; READY.len()];
    read_exact_fds(conn, &mut ready, &mut Vec::new())?;
    if ready != READY {
        return Err(invalid("the new limpet did not say ready"));
    }
    Ok(())
}

/// The offer itself: the header, then the descriptors.
fn send_offer(conn: &UnixStream, sockets: &[HeldSocket]) -> std::io::Result<()> {
    use rustix::net::{sendmsg, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    let header = Header {
        pid: std::process::id(),
        sockets: sockets
            .iter()
            .map(|s| SocketEntry {
                role: s.role.clone(),
                configured: s.configured,
                local: s.local,
            })
            .collect(),
    };
    write_json(conn, &header)?;
    for chunk in sockets.chunks(FDS_PER_MESSAGE) {
        let borrowed: Vec<_> = chunk
            .iter()
            .map(|s| std::os::fd::AsFd::as_fd(&s.fd))
            .collect();
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(FDS_PER_MESSAGE))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !control.push(SendAncillaryMessage::ScmRights(&borrowed)) {
            return Err(invalid("descriptors do not fit one message"));
        }
        let sent = sendmsg(
            conn,
            &[IoSlice::new(b"F")],
            &mut control,
            SendFlags::NOSIGNAL,
        )?;
        if sent != 1 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
    }
    Ok(())
}

/// "stopping", then the state: its header and each table's bytes.
fn send_state(conn: &UnixStream, state: &State) -> std::io::Result<()> {
    let last = Last::from(state);
    let mut w = conn;
    w.write_all(STOPPING)?;
    write_json(conn, &last)?;
    for (_, bytes) in &state.tables {
        w.write_all(bytes)?;
    }
    Ok(())
}

/// Binds the Unix listener at `path` for takers to come: made beside it and renamed over it
/// (a file left by a limpet that exited, or the one a taker took over from), owner-only.
pub fn listen(path: &Path) -> std::io::Result<tokio::net::UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".{}.tmp", std::process::id()));
    let tmp = PathBuf::from(tmp);
    // Only a socket is replaced (one a limpet left, or the one just taken over from): a
    // mistyped path must not cost a file.
    match std::fs::symlink_metadata(path) {
        Ok(m) if !std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket", path.display()),
            ))
        }
        _ => {}
    }
    let _ = std::fs::remove_file(&tmp);
    let l = std::os::unix::net::UnixListener::bind(&tmp)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
    std::fs::rename(&tmp, path)?;
    l.set_nonblocking(true)?;
    tokio::net::UnixListener::from_std(l)
}

/// How long a successor started on SIGUSR2 has to take over by default (`limpet run
/// --upgrade-limit`), from its start to the "ready" that begins the handover: the offer and
/// its own start may each take [`HANDOVER_LIMIT`], and as much again is left for what comes
/// before (its config read, its runtime). Past it, and not in a handover, it is killed: a
/// successor hung before it connects (its config on a mount that does not answer) would
/// otherwise keep every later SIGUSR2 ignored, and one hung after it took the offer would
/// hold copies of the listening sockets for good.
pub const SUCCESSOR_LIMIT: Duration = Duration::from_secs(90);

/// How a running limpet starts its own successor on SIGUSR2 (nginx's binary upgrade on
/// USR2, HAProxy's master re-exec): the binary at the path it was started by, now (a
/// package upgrade put the new one there), with the same arguments, so that it takes over
/// through the same upgrade socket. Started by the running limpet, the new one is in its
/// service's control group, as systemd requires of a main process: an operator's
/// `systemctl kill -s USR2 --kill-whom=main limpet` upgrades a unit in place
/// (`crate::notify`).
///
/// One successor at a time, watched until it exits. It is killed (SIGKILL: one blocked in
/// the kernel on a dead mount heeds no other signal) when its limit passed, or when this
/// limpet [abandons](Self::abandon) it (it stops, or another limpet took over), unless a
/// handover with it is under way ([`handing_over`](Self::handing_over)) or it took over: the
/// service's main process then, never killed by this one. A SIGUSR2 while one runs is
/// ignored; once it was killed, the next starts another.
#[derive(Debug)]
pub struct Successor {
    exe: PathBuf,
    args: Vec<std::ffi::OsString>,
    limit: Duration,
    slot: std::sync::Arc<std::sync::Mutex<Slot>>,
}

/// The successor that may still take over, and the last one killed.
#[derive(Debug, Default)]
struct Slot {
    current: Option<Watched>,
    /// Killed before it took over: its "ready" may still be on its way, and is refused.
    killed: Option<u32>,
    /// How many successors were started: each one's watcher knows its own by this.
    started: u64,
}

/// What is known of the successor that runs. Its watcher decides whether to kill it from
/// these alone ([`Watched::to_kill`]), under the slot's lock, each time one changes.
#[derive(Debug)]
struct Watched {
    /// Its number among the successors started ([`Slot::started`]).
    seq: u64,
    /// Its process id, unknown while its binary is being started (an `exec` that a mount
    /// that does not answer holds; [`Successor::start`]).
    pid: Option<u32>,
    /// A handover with it is under way: nothing kills it until that ends.
    handing_over: bool,
    /// It took over: the service's main process now.
    took: bool,
    limit_passed: bool,
    /// This limpet stops, or handed over to another: it can no longer take over.
    abandoned: bool,
    /// Wakes its watcher to decide again.
    wake: std::sync::Arc<tokio::sync::Notify>,
    /// Turns true once its watcher killed it, or it exited.
    done: tokio::sync::watch::Receiver<bool>,
}

impl Watched {
    fn to_kill(&self) -> bool {
        !self.took && !self.handing_over && (self.limit_passed || self.abandoned)
    }
}

/// Set in a successor's environment to the pid of the limpet that started it: the successor
/// must take over from that limpet, or exit. Without it, one whose starter stopped (a SIGTERM
/// in between) before it connected would find no limpet at the socket and start afresh,
/// serving on after the operator stopped the service; or one that connected late would take
/// over from whichever limpet listens there by then.
pub const STARTED_BY: &str = "LIMPET_UPGRADE_FROM";

/// A successor being started: its pid once its binary runs, and its exit status once it
/// exited and was reaped (an error: it could not be started).
#[derive(Debug)]
pub struct Started {
    running: tokio::sync::watch::Receiver<Option<u32>>,
    pub exit: tokio::task::JoinHandle<std::io::Result<std::process::ExitStatus>>,
}

impl Started {
    /// Its process id, once its binary runs (its `exec` done); `None` if it could not be
    /// started.
    pub async fn pid(&mut self) -> Option<u32> {
        let running = self.running.wait_for(Option::is_some).await.map(|pid| *pid);
        running.unwrap_or_else(|_| *self.running.borrow())
    }

    /// Its process id if its binary runs by now.
    pub fn pid_now(&self) -> Option<u32> {
        *self.running.borrow()
    }
}

/// Whose "ready" a holder has: [`Successor::handing_over`].
#[derive(Debug)]
pub enum Taker<'a> {
    /// The successor this limpet started: its limit waits while the handover lasts.
    Ours(HandingOver<'a>),
    /// The successor this limpet started and killed (its limit passed just before its "ready"
    /// was read): it is dead or dying, and must not be handed anything.
    Killed,
    /// Another process (an operator's own `limpet run`), which no limit of this one's concerns.
    Other,
}

impl Successor {
    /// The binary `exe`, started with `args`, given `limit` to take over.
    pub fn new(exe: PathBuf, args: Vec<std::ffi::OsString>, limit: Duration) -> Successor {
        Successor {
            exe,
            args,
            limit,
            slot: std::sync::Arc::default(),
        }
    }

    /// This process's binary and arguments, read at its start. The binary is the path it was
    /// started by (`argv[0]`, made absolute against the directory it started in, or found
    /// in `PATH`), not the file it runs: `/proc/self/exe` has every link resolved, so for a
    /// binary behind a link an upgrade moves (`/opt/limpet/current`, alternatives, Nix) it
    /// names the old version, and once a package upgrade replaced the file, a deleted one.
    ///
    /// The path is taken only if it is, now, the file this process runs (its device and
    /// inode): an `argv[0]` set to something else (`exec -a`, systemd's `@` prefix) or a
    /// `PATH` whose first match is another binary would start a different program.
    /// Otherwise the file this process runs is named.
    pub fn of_this_process(limit: Duration) -> std::io::Result<Successor> {
        use std::os::unix::fs::MetadataExt;
        let mut argv = std::env::args_os();
        let started_as = argv.next().map(PathBuf::from);
        let running = std::fs::metadata("/proc/self/exe")?;
        let is_running = |p: &Path| {
            std::fs::metadata(p).is_ok_and(|m| {
                m.dev() == running.dev() && m.ino() == running.ino() && m.mode() & 0o111 != 0
            })
        };
        let named = match started_as {
            Some(p) if p.components().count() > 1 || p.is_absolute() => {
                Some(std::env::current_dir()?.join(p))
            }
            Some(name) => std::env::var_os("PATH").and_then(|path| {
                std::env::split_paths(&path)
                    .map(|dir| dir.join(&name))
                    .find(|candidate| is_running(candidate))
            }),
            None => None,
        };
        let exe = match named.filter(|p| is_running(p)) {
            Some(p) => p,
            None => std::env::current_exe()?,
        };
        Ok(Successor::new(exe, argv.collect(), limit))
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Slot> {
        lock(&self.slot)
    }

    /// Starts the successor (stdin closed; stdout and stderr, and `NOTIFY_SOCKET`, this
    /// process's; [`STARTED_BY`] set), unless one runs or is being started already (`None`).
    /// Its exit is reaped on a task of its own and logged: one that exits before taking over
    /// (a bad config, a bind error: exit 2) leaves this limpet serving, and a later SIGUSR2
    /// may try again. On a tokio runtime.
    ///
    /// Returns at once: the binary is started on a blocking thread. Starting a process holds
    /// the thread that does it until the new one's `exec` is done (the child shares its
    /// memory until then), and the `exec` of a binary on a mount that does not answer does
    /// not end; on the thread that heard SIGUSR2, which serves clients, that stopped them
    /// all. The successor's limit runs from here: one whose `exec` outlasts it is killed as
    /// soon as it has a process id, as is one abandoned meanwhile; until then a SIGUSR2 is
    /// ignored, and a "ready" from a child of this process is known as its own.
    pub fn start(&self) -> Option<Started> {
        let mut slot = self.slot();
        if let Some(w) = &slot.current {
            match w.pid {
                Some(_) => tracing::warn!(
                    "SIGUSR2: a new limpet started for an upgrade still runs; ignored"
                ),
                None => tracing::warn!(
                    "SIGUSR2: a new limpet is still being started for an upgrade (its binary not yet running); ignored"
                ),
            }
            return None;
        }
        let mut command = tokio::process::Command::new(&self.exe);
        command
            .args(&self.args)
            .env(STARTED_BY, std::process::id().to_string())
            .stdin(std::process::Stdio::null());
        let wake = std::sync::Arc::new(tokio::sync::Notify::new());
        let (done, done_rx) = tokio::sync::watch::channel(false);
        let (running_tx, running) = tokio::sync::watch::channel(None);
        // The killed one's "ready" could only have been on its way just as it was killed.
        slot.killed = None;
        slot.started += 1;
        let seq = slot.started;
        slot.current = Some(Watched {
            seq,
            pid: None,
            handing_over: false,
            took: false,
            limit_passed: false,
            abandoned: false,
            wake: std::sync::Arc::clone(&wake),
            done: done_rx,
        });
        drop(slot);
        tracing::info!(exe = %self.exe.display(), "SIGUSR2: starting a new limpet to take over");
        let (shared, limit, exe) = (
            std::sync::Arc::clone(&self.slot),
            self.limit,
            self.exe.clone(),
        );
        let exit = tokio::spawn(async move {
            let ours = |w: &&mut Watched| w.seq == seq;
            // Its limit passed: said in its slot, for `to_kill`.
            let mark_limit = |shared: &std::sync::Mutex<Slot>| {
                if let Some(w) = lock(shared).current.as_mut().filter(ours) {
                    w.limit_passed = true;
                }
            };
            // Dropped once it passed or the successor was killed: a timer left behind would
            // only be a wake-up for nothing.
            let mut until = Some(Box::pin(tokio::time::sleep(limit)));
            let mut limit_passed = false;
            let recorder = std::sync::Arc::clone(&shared);
            let mut spawning = tokio::task::spawn_blocking(move || {
                let spawned = command.spawn();
                // Known as soon as it runs: its "ready" may be read before this task runs
                // again (and a child of this process is taken for it until then).
                if let Some(pid) = spawned.as_ref().ok().and_then(tokio::process::Child::id) {
                    if let Some(w) = lock(&recorder).current.as_mut().filter(|w| w.seq == seq) {
                        w.pid = Some(pid);
                    }
                }
                spawned
            });
            let spawned = loop {
                tokio::select! {
                    spawned = &mut spawning => break spawned,
                    () = limit_passes(&mut until) => {
                        until = None;
                        limit_passed = true;
                        mark_limit(&shared);
                        tracing::error!(exe = %exe.display(), ?limit, "the new limpet started for an upgrade is not running yet (its binary's exec holds: a mount that does not answer?): it will be killed as soon as it runs; serving on");
                    }
                    // Abandoned while its `exec` lasts: decided once it has a process id.
                    () = wake.notified() => {}
                }
            };
            let spawned = spawned.unwrap_or_else(|e| Err(std::io::Error::other(e)));
            let mut child = match spawned {
                Ok(c) => c,
                Err(e) => {
                    tracing::error!(exe = %exe.display(), error = %e, "SIGUSR2: cannot start the new limpet; serving on");
                    let mut slot = lock(&shared);
                    if slot.current.as_mut().filter(ours).is_some() {
                        slot.current = None;
                    }
                    drop(slot);
                    let _ = done.send(true);
                    return Err(e);
                }
            };
            // A child that has not been waited for always has its id.
            let pid = child.id().unwrap_or_default();
            if let Some(w) = lock(&shared).current.as_mut().filter(ours) {
                w.pid = Some(pid);
            }
            let _ = running_tx.send(Some(pid));
            tracing::info!(pid, exe = %exe.display(), "SIGUSR2: started a new limpet to take over");
            let status = loop {
                // Decided first: its limit may have passed, or it may have been abandoned,
                // while its `exec` lasted.
                {
                    let mut slot = lock(&shared);
                    if slot
                        .current
                        .as_mut()
                        .filter(ours)
                        .is_some_and(|w| w.to_kill())
                    {
                        if limit_passed {
                            tracing::error!(pid, ?limit, "the new limpet started for an upgrade did not take over within its limit: killing it; serving on");
                        } else {
                            tracing::warn!(pid, "the new limpet started for an upgrade can no longer take over: killing it");
                        }
                        if let Err(e) = child.start_kill() {
                            tracing::warn!(pid, error = %e, "the new limpet started for an upgrade: kill failed");
                        }
                        // Killed, it runs no more code of its own: a later SIGUSR2 may start
                        // another even while this one's kernel work (a dead mount) holds its exit.
                        slot.current = None;
                        slot.killed = Some(pid);
                        until = None;
                        let _ = done.send(true);
                    }
                }
                tokio::select! {
                    status = child.wait() => break status,
                    () = limit_passes(&mut until) => {
                        until = None;
                        limit_passed = true;
                        mark_limit(&shared);
                    }
                    () = wake.notified() => {}
                }
            };
            let mut slot = lock(&shared);
            if slot.current.as_mut().filter(ours).is_some() {
                slot.current = None;
            }
            drop(slot);
            let _ = done.send(true);
            match &status {
                Ok(s) => {
                    tracing::warn!(pid, status = %s, "the new limpet started for an upgrade exited")
                }
                Err(e) => {
                    tracing::warn!(pid, error = %e, "the new limpet started for an upgrade: wait failed")
                }
            }
            status
        });
        Some(Started { running, exit })
    }

    /// A taker of process id `pid` said "ready": whose it is. The successor's limit waits
    /// while the returned handover lasts. While the successor's binary is being started its
    /// process id is not known yet; a taker that is a child of this process is it then (one
    /// is started at a time, and this limpet starts no other).
    pub fn handing_over(&self, pid: u32) -> Taker<'_> {
        let mut slot = self.slot();
        let killed = slot.killed == Some(pid);
        match slot.current.as_mut() {
            Some(w)
                if w.pid == Some(pid)
                    || (w.pid.is_none() && parent_of(pid) == Some(std::process::id())) =>
            {
                w.pid = Some(pid);
                w.handing_over = true;
                Taker::Ours(HandingOver {
                    successor: self,
                    seq: w.seq,
                })
            }
            _ if killed => Taker::Killed,
            _ => Taker::Other,
        }
    }

    /// This limpet stops, or handed its sockets to another: a successor of its own that did
    /// not take over can no longer do so, and is killed by its watcher (left running, it
    /// would start afresh, or take over from whichever limpet listens by then). Not async: a
    /// stop must not wait for it before it listens for a second signal; the caller awaits
    /// [`Abandoned::killed`] later, if it is about to exit.
    pub fn abandon(&self) -> Abandoned {
        let mut slot = self.slot();
        let Some(w) = slot.current.as_mut().filter(|w| !w.took) else {
            return Abandoned(None);
        };
        w.abandoned = true;
        // A handover under way ends first: its end decides again.
        if !w.handing_over {
            w.wake.notify_one();
        }
        Abandoned(Some(w.done.clone()))
    }
}

/// A successor abandoned ([`Successor::abandon`]).
#[derive(Debug)]
pub struct Abandoned(Option<tokio::sync::watch::Receiver<bool>>);

impl Abandoned {
    /// Once its watcher killed it (or it exited), or after `within`: the watcher is a task
    /// of the runtime, which a process about to exit must let run.
    pub async fn killed(self, within: Duration) {
        if let Some(mut done) = self.0 {
            let _ = tokio::time::timeout(within, done.wait_for(|d| *d)).await;
        }
    }
}

/// A successor's limit: its timer, or never once it passed (`None`).
async fn limit_passes(until: &mut Option<std::pin::Pin<Box<tokio::time::Sleep>>>) {
    match until.as_mut() {
        Some(u) => u.await,
        None => std::future::pending().await,
    }
}

/// The parent of process `pid` (`/proc/PID/stat`), if it can be read.
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command name, which may hold spaces and parentheses: the state, then the
    // parent's id.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

fn lock(slot: &std::sync::Mutex<Slot>) -> std::sync::MutexGuard<'_, Slot> {
    slot.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A handover with the successor under way ([`Successor::handing_over`]). Ended by
/// [`took`](Self::took), or dropped: the handover failed, and a successor whose limit passed
/// meanwhile is killed then.
#[derive(Debug)]
pub struct HandingOver<'a> {
    successor: &'a Successor,
    /// The successor's number ([`Slot::started`]).
    seq: u64,
}

impl HandingOver<'_> {
    /// The successor took over: it is the service's main process, never killed by this one.
    pub fn took(self) {
        self.with_successor(|w| w.took = true);
    }

    /// `f` on the successor's state, if it is still the one watched.
    fn with_successor(&self, f: impl FnOnce(&mut Watched)) {
        if let Some(w) = self
            .successor
            .slot()
            .current
            .as_mut()
            .filter(|w| w.seq == self.seq)
        {
            f(w);
        }
    }
}

impl Drop for HandingOver<'_> {
    fn drop(&mut self) {
        self.with_successor(|w| {
            w.handing_over = false;
            if w.to_kill() {
                w.wake.notify_one();
            }
        });
    }
}

/// A taker that is ready: the caller stops accepting, then [`confirm`](Self::confirm)s.
#[derive(Debug)]
pub struct Ready {
    conn: UnixStream,
    /// The taker's process id (its socket's credentials).
    pid: u32,
}

impl Ready {
    /// The taker's process id: the service's main process once it took over.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Tells the taker this limpet has stopped accepting, with its `state` as it is now, and
    /// waits for it to say it took over (at most [`HANDOVER_LIMIT`]). `false`: it did not
    /// (it died, or hangs); it does not accept then, and this limpet must serve again.
    /// Blocking.
    pub fn confirm(self, state: &State) -> bool {
        self.confirm_on(state)
    }

    /// [`confirm`](Self::confirm) on a blocking thread, within `limit` as a whole. The
    /// socket's own timeouts bound each read and write alone, and each byte that comes
    /// restarts them: a taker that reads the state slowly, or says "took" a byte at a time,
    /// held this limpet, which accepts no one meanwhile, for as long as it kept going (a
    /// "took" dribbled over 100 s held it 100 s). Past `limit` the socket is shut down, the
    /// blocked call returns at once, and the taker did not take over unless its "took" was
    /// read by then (a taker that wrote it after the shutdown fails to, and does not accept).
    ///
    /// Took over: this limpet's end of the connection, to keep until it exits
    /// ([`Predecessor`]).
    pub async fn confirm_within(self, state: State, limit: Duration) -> Option<HandedOver> {
        let end = self.conn.try_clone();
        let mut confirming = tokio::task::spawn_blocking(move || {
            self.confirm_on(&state)
                .then_some(HandedOver { conn: self.conn })
        });
        if let Ok(r) = tokio::time::timeout(limit, &mut confirming).await {
            return r.ok().flatten();
        }
        match &end {
            Ok(end) => {
                tracing::error!(?limit, "upgrade: the new limpet did not take over within the limit; ending the handover");
                let _ = end.shutdown(std::net::Shutdown::Both);
            }
            Err(e) => {
                tracing::error!(error = %e, "upgrade: the handover cannot be cut short; waiting for it");
            }
        }
        let took = confirming.await.ok().flatten();
        if took.is_some() && end.is_ok() {
            // Its "took" came just before the cut: it serves, but the connection it would
            // watch this limpet's exit on is shut down, so it counts nothing of this one's
            // drain as open (a drain there may read complete while this one still drains).
            tracing::warn!("upgrade: the new limpet took over at the limit; it cannot tell when this one exits");
        }
        took
    }

    fn confirm_on(&self, state: &State) -> bool {
        let took = send_state(&self.conn, state).and_then(|()| {
            let mut got = [0u8; TOOK.len()];
            read_exact_fds(&self.conn, &mut got, &mut Vec::new())?;
            if got == TOOK {
                Ok(())
            } else {
                Err(invalid("not took"))
            }
        });
        match took {
            Ok(()) => true,
            Err(e) => {
                tracing::error!(error = %e, "upgrade: the new limpet did not take over");
                false
            }
        }
    }
}

/// Serves takers at `listener` until one is ready (returned) or `stop` resolves (`None`).
/// A taker of another user is refused; one that fails midway changes nothing, and the next
/// may try. A stop during an exchange ends it at once (the taker then gives its copies of
/// the sockets up rather than holding them to its limit).
pub async fn hold(
    listener: tokio::net::UnixListener,
    sockets: std::sync::Arc<Held>,
    stop: impl std::future::Future<Output = ()>,
) -> Option<Ready> {
    hold_within(listener, sockets, stop, OFFER_LIMIT).await
}

/// [`hold`], each taker given `offer_limit` from its connect to its "ready".
async fn hold_within(
    listener: tokio::net::UnixListener,
    sockets: std::sync::Arc<Held>,
    stop: impl std::future::Future<Output = ()>,
    offer_limit: Duration,
) -> Option<Ready> {
    tokio::pin!(stop);
    loop {
        let conn = tokio::select! {
            () = &mut stop => return None,
            c = listener.accept() => match c {
                Ok((c, _)) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "upgrade socket: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let own = rustix::process::getuid();
        let pid = match rustix::net::sockopt::socket_peercred(&conn) {
            Ok(c) if c.uid == own || c.uid.is_root() => c.pid.as_raw_nonzero().get().unsigned_abs(),
            Ok(c) => {
                tracing::warn!(
                    uid = c.uid.as_raw(),
                    "upgrade socket: a process of another user refused"
                );
                continue;
            }
            Err(e) => {
                tracing::warn!(error = %e, "upgrade socket: peer unknown, refused");
                continue;
            }
        };
        let conn = match conn.into_std().and_then(|c| {
            c.set_nonblocking(false)?;
            c.set_read_timeout(Some(HANDOVER_LIMIT))?;
            c.set_write_timeout(Some(HANDOVER_LIMIT))?;
            Ok(c)
        }) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "upgrade socket: connection unusable");
                continue;
            }
        };
        let Ok(end) = conn.try_clone() else {
            continue;
        };
        let sockets = std::sync::Arc::clone(&sockets);
        let exchange = tokio::task::spawn_blocking(move || offer(&conn, &sockets).map(|()| conn));
        tokio::pin!(exchange);
        // The hello and the offer, then the taker's start up to "ready": a step each, as a
        // whole (the socket's timeouts restart at each byte that comes).
        let limit = tokio::time::sleep(offer_limit);
        tokio::pin!(limit);
        tokio::select! {
            () = &mut stop => {
                let _ = end.shutdown(std::net::Shutdown::Both);
                return None;
            }
            () = &mut limit => {
                let _ = end.shutdown(std::net::Shutdown::Both);
                tracing::warn!(limit = ?offer_limit, "upgrade: the new limpet was not ready within the limit; serving on");
                // Returns at once now; a taker that said "ready" meanwhile is not heeded.
                let _ = exchange.await;
            }
            r = &mut exchange => match r {
                Ok(Ok(conn)) => return Some(Ready { conn, pid }),
                Ok(Err(e)) => tracing::warn!(error = %e, "upgrade: handover not completed; serving on"),
                Err(e) => tracing::warn!(error = %e, "upgrade: handover task failed; serving on"),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An empty directory of this test process's own (removed by the test at its end).
    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("limpet-upgrade-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::create_dir_all(&dir);
        dir
    }

    /// Everything crosses: a listening socket given over accepts what is sent to the address
    /// the holder bound; the tables' bytes and the nodes' states come with the holder's
    /// confirmation, as they are when it gives it.
    #[tokio::test]
    async fn an_offer_carries_the_listening_sockets_then_the_pins_and_the_node_states() {
        let dir = scratch("unit");
        let path = dir.join("up.sock");
        let web = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
        let configured: SocketAddr = "127.0.0.1:0".parse().unwrap_or_else(|e| panic!("{e}"));
        let at = web.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let held = vec![
            HeldSocket::of(Role::Listener("web".into()), configured, &web)
                .unwrap_or_else(|e| panic!("{e}")),
        ];
        drop(web);
        let listener = listen(&path).unwrap_or_else(|e| panic!("{e}"));
        let holder = tokio::spawn(hold(
            listener,
            std::sync::Arc::new(Held::new(held)),
            std::future::pending(),
        ));
        let p = path.clone();
        let mut h = tokio::task::spawn_blocking(move || take_over(&p))
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("no holder found"));
        assert_eq!(h.from_pid, std::process::id());
        assert_eq!(h.listeners_offered(), 1);
        // Another name on a port-0 line is another listener.
        assert!(h
            .take(&Role::Listener("other".into()), configured)
            .unwrap_or_else(|e| panic!("{e}"))
            .is_empty());
        let mut got = h
            .take(&Role::Listener("web".into()), configured)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(got.len(), 1);
        assert!(h.untaken().is_empty());
        let taken = got.pop().unwrap_or_else(|| panic!("no socket"));
        assert_eq!(taken.local_addr().ok(), Some(at));
        // The holder's own copy was closed above: the taken one is the live socket.
        let client = std::net::TcpStream::connect(at).unwrap_or_else(|e| panic!("{e}"));
        taken
            .set_nonblocking(false)
            .unwrap_or_else(|e| panic!("{e}"));
        let (accepted, _) = taken.accept().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(accepted.peer_addr().ok(), client.local_addr().ok());

        let completing = tokio::task::spawn_blocking(move || h.complete());
        let ready = holder
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("the holder saw no ready taker"));
        let drain = AdminState::Drain {
            deadline_ms: Some(1_234),
            spread_ms: 5,
        };
        let state = move || State {
            tables: vec![("t".into(), vec![7; 100_000]), ("u".into(), Vec::new())],
            nodes: vec![("a".into(), AdminState::Maint), ("b".into(), drain)],
            health: vec![NodeHealth {
                node: "c".into(),
                health: CarriedHealth {
                    up: false,
                    streak: 1,
                    unanswered: false,
                    retry_at_ms: Some(99),
                    trial_claimed_until_ms: 98,
                    slow: 0,
                    slow_since_ms: 0,
                    down_cause: Some(limpet_core::DownCause::Checks),
                    checks: vec![(
                        "http 127.0.0.4:80 GET /".into(),
                        CheckCounts {
                            fails: 0,
                            passes: Some(1),
                        },
                    )],
                },
                since_ms: 1_000,
                address: Some(std::net::IpAddr::from([10, 0, 0, 3])),
            }],
            holder_now_ms: Some(77),
            seen: vec![NodeSeen {
                node: "b".into(),
                open: 3,
                last_seen_ms: Some(70),
            }],
        };
        let handed = ready
            .confirm_within(state(), HANDOVER_LIMIT)
            .await
            .unwrap_or_else(|| panic!("the taker said it took over"));
        let (got, predecessor) = completing
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(got, state());
        // The holder's end stays open until it exits (here: until it is dropped), and the
        // taker learns of its end. Meanwhile what the taker tells reaches the holder as
        // it was told: node states and health, and moves.
        let (tell, told) = tokio::sync::mpsc::channel(4);
        let mut gone = std::pin::pin!(predecessor.gone_telling(told));
        assert!(
            tokio::time::timeout(Duration::from_millis(100), &mut gone)
                .await
                .is_err(),
            "gone while the holder runs"
        );
        let mut telling = handed
            .told()
            .unwrap_or_else(|| panic!("the holder's end read"));
        let news = || Told {
            state: State {
                nodes: state().nodes,
                health: state().health,
                holder_now_ms: Some(78),
                ..State::default()
            },
            moved: vec![(
                "a".to_owned(),
                42,
                crate::nodes::EndReason::Repin(limpet_core::RepinReason::AnswerTimeout),
            )],
        };
        let now = crate::clock::now_ms();
        for _ in 0..2 {
            tell.send(news()).await.unwrap_or_else(|e| panic!("{e}"));
            let mut got = tokio::select! {
                t = telling.next() => t,
                () = &mut gone => panic!("gone while the holder runs"),
            }
            .unwrap_or_else(|| panic!("told"));
            // Stamped with the taker's clock as it left.
            let left = got.state.holder_now_ms.take();
            assert!(left.is_some_and(|ms| ms >= now), "{left:?}");
            got.state.holder_now_ms = Some(78);
            assert_eq!(got, news());
        }
        drop(telling);
        drop(handed);
        tokio::time::timeout(HANDOVER_LIMIT, gone)
            .await
            .unwrap_or_else(|_| panic!("the holder's end not seen"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A holder of the first version sends no health: its state still reads, every node's
    /// health left to the taker's own checks and traffic. A taker of the first version
    /// ignores the health a newer holder sends.
    #[test]
    fn a_state_header_without_health_reads_and_one_with_it_is_read_by_the_first_version() {
        let first: Last = serde_json::from_str(r#"{"tables":[],"nodes":[["a","Maint"]]}"#)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(first.health.is_empty());
        assert_eq!(first.nodes, vec![("a".to_owned(), NodeAdmin::Maint)]);
        #[derive(Deserialize)]
        struct FirstLast {
            tables: Vec<TableEntry>,
            nodes: Vec<(String, NodeAdmin)>,
        }
        let now = Last {
            tables: Vec::new(),
            nodes: vec![("a".into(), NodeAdmin::Ready)],
            now_ms: Some(1),
            seen: Vec::new(),
            health: vec![serde_json::json!(HealthEntry {
                node: "a".into(),
                up: true,
                streak: 0,
                unanswered: false,
                retry_at_ms: None,
                slow: 0,
                slow_since_ms: 0,
                down_cause: None,
                checks: Vec::new(),
                since_ms: 0,
                trial_claimed_until_ms: 0,
                address: None,
            })],
        };
        let text = serde_json::to_string(&now).unwrap_or_else(|e| panic!("{e}"));
        let read: FirstLast = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((read.tables.len(), read.nodes), (0, now.nodes));
    }

    /// A health entry this version does not understand (a count past a `u8`, a field
    /// missing) is left out alone: the other nodes' health, and the pins and admin states
    /// around it, are kept.
    #[test]
    fn a_health_entry_not_understood_is_left_out_alone() {
        let good = serde_json::json!({
            "node": "a", "up": false, "streak": 0, "unanswered": false, "retry_at_ms": 5,
            "slow": 0, "slow_since_ms": 0, "down_cause": "traffic", "checks": [], "since_ms": 1
        });
        let mut wide = good.clone();
        wide["node"] = "b".into();
        wide["checks"] =
            serde_json::json!([{ "label": "tcp 10.0.0.2:80", "fails": 300, "passes": 0 }]);
        let mut short = good.clone();
        short["node"] = "c".into();
        if let Some(o) = short.as_object_mut() {
            o.remove("up");
        }
        let read = read_health(vec![wide, good, short]);
        assert_eq!(read.len(), 1);
        assert_eq!(read[0].node, "a");
        assert_eq!(read[0].health.retry_at_ms, Some(5));
        // Written before `trial_claimed_until_ms` was: none claimed.
        assert_eq!(read[0].health.trial_claimed_until_ms, 0);
    }

    /// Every time handed over moves onto the taker's clock by the difference between the
    /// two clocks' readings (a wall clock stepped since the holder started); without the
    /// holder's reading (a first-version holder), nothing moves.
    #[test]
    fn handed_times_move_onto_the_taker_s_clock() {
        let node = |since_ms| NodeHealth {
            node: "a".into(),
            health: CarriedHealth {
                up: false,
                streak: 0,
                unanswered: false,
                retry_at_ms: Some(10_000),
                trial_claimed_until_ms: 10_000,
                slow: 0,
                slow_since_ms: 0,
                down_cause: Some(limpet_core::DownCause::Traffic),
                checks: Vec::new(),
            },
            since_ms,
            address: None,
        };
        let state = |holder_now_ms| State {
            seen: vec![NodeSeen {
                node: "a".into(),
                open: 1,
                last_seen_ms: Some(6_000),
            }],
            tables: Vec::new(),
            nodes: vec![(
                "a".into(),
                AdminState::Drain {
                    deadline_ms: Some(70_000),
                    spread_ms: 5,
                },
            )],
            health: vec![node(4_000)],
            holder_now_ms,
        };
        // The holder's clock reads 8 s, the taker's 3 s: 5 s back.
        let moved = state(Some(8_000)).on_clock(3_000);
        assert_eq!(
            moved.nodes[0].1,
            AdminState::Drain {
                deadline_ms: Some(65_000),
                spread_ms: 5
            }
        );
        let h = &moved.health[0];
        assert_eq!(h.health.retry_at_ms, Some(5_000));
        assert_eq!(h.health.trial_claimed_until_ms, 5_000);
        assert_eq!(h.since_ms, 0, "held at the clock's start, not wrapped");
        assert_eq!(moved.seen[0].last_seen_ms, Some(1_000));
        // Forward, and without a reading.
        assert_eq!(
            state(Some(1_000)).on_clock(3_000).health[0]
                .health
                .retry_at_ms,
            Some(12_000)
        );
        assert_eq!(state(None).on_clock(3_000), state(None));
        // Less than a second apart: the handover's own time, no step.
        assert_eq!(
            state(Some(2_500)).on_clock(3_000).health[0]
                .health
                .retry_at_ms,
            Some(10_000)
        );
        assert_eq!(state(Some(8_000)).clock_offset(3_000), -5_000);
    }

    /// A holder of no sockets at `path`, on a task until a taker is ready, and a taker that
    /// received its offer.
    async fn holding_nothing_taken_over(
        path: &Path,
    ) -> (tokio::task::JoinHandle<Option<Ready>>, Handover) {
        let listener = listen(path).unwrap_or_else(|e| panic!("{e}"));
        let holder = tokio::spawn(hold(
            listener,
            std::sync::Arc::new(Held::new(Vec::new())),
            std::future::pending(),
        ));
        let p = path.to_owned();
        let h = tokio::task::spawn_blocking(move || take_over(&p))
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("no holder found"));
        (holder, h)
    }

    /// A taker that goes away after the holder stopped accepting, before it said it took
    /// over, is not counted on: `confirm` says so, and the holder serves again.
    #[tokio::test]
    async fn a_taker_gone_before_it_took_over_is_not_counted_on() {
        let dir = scratch("gone");
        let path = dir.join("up.sock");
        let (holder, h) = holding_nothing_taken_over(&path).await;
        // Ready, then gone once "stopping" comes.
        let gone = tokio::task::spawn_blocking(move || {
            (&h.conn).write_all(READY).unwrap_or_else(|e| panic!("{e}"));
            let mut got = [0u8; STOPPING.len()];
            read_exact_fds(&h.conn, &mut got, &mut Vec::new()).unwrap_or_else(|e| panic!("{e}"));
            drop(h);
        });
        let ready = holder
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("the holder saw no ready taker"));
        let took = tokio::task::spawn_blocking(move || ready.confirm(&State::default()))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        gone.await.unwrap_or_else(|e| panic!("{e}"));
        assert!(!took);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A taker that cannot read the state whole (here a header over its limit, as one it does
    /// not understand or a transfer that stalls would be too) does not take over: the two
    /// sides agree, and only the holder serves. Before, the taker said "took" and served
    /// while the holder, blocked writing the rest of the state, gave up at its limit and
    /// served again, the "took" unread: two limpets on one socket.
    #[tokio::test]
    async fn a_taker_that_cannot_read_the_state_whole_does_not_take_over() {
        let dir = scratch("unread");
        let path = dir.join("up.sock");
        let (holder, h) = holding_nothing_taken_over(&path).await;
        let taker = tokio::task::spawn_blocking(move || h.complete().map(|_| ()));
        let ready = holder
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("the holder saw no ready taker"));
        // A header over `MAX_HEADER`: a node name of 17 MiB.
        let state = State {
            nodes: vec![("x".repeat(17 << 20), AdminState::Maint)],
            ..State::default()
        };
        let held = ready
            .confirm_within(state, Duration::from_secs(2))
            .await
            .is_some();
        let took = taker.await.unwrap_or_else(|e| panic!("{e}"));
        assert!(took.is_err(), "the taker serves though it read no state");
        assert!(!held, "the holder counts on a taker that did not take over");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A holder that sends its offer a byte at a time, each within the socket's own timeout,
    /// holds a new limpet's start no longer than the offer's limit as a whole (300 ms here):
    /// the socket is shut down then, and the start fails. Before, each byte restarted the
    /// timeout, and the new limpet waited, deaf to signals, for as long as the bytes came.
    #[test]
    fn a_holder_that_offers_a_byte_at_a_time_is_cut_at_the_offer_limit() {
        use std::os::unix::net::UnixListener;
        let dir = scratch("offer-dribble");
        let path = dir.join("up.sock");
        let listener = UnixListener::bind(&path).unwrap_or_else(|e| panic!("{e}"));
        let holder = std::thread::spawn(move || {
            let Ok((mut c, _)) = listener.accept() else {
                return;
            };
            let mut hello = [0u8; HELLO.len()];
            if std::io::Read::read_exact(&mut c, &mut hello).is_err() {
                return;
            }
            // A header of 1,000 bytes, then a byte of it every 50 ms: at most 5 s (bounded).
            if c.write_all(&1_000u64.to_le_bytes()).is_err() {
                return;
            }
            for _ in 0..100 {
                if c.write_all(b" ").is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let conn = UnixStream::connect(&path).unwrap_or_else(|e| panic!("{e}"));
        conn.set_read_timeout(Some(HANDOVER_LIMIT))
            .unwrap_or_else(|e| panic!("{e}"));
        let started = std::time::Instant::now();
        let got = take_over_within(conn, Duration::from_millis(300), 1);
        let took = started.elapsed();
        assert!(got.is_err(), "an offer that never ends is taken");
        assert!(
            took < Duration::from_secs(2),
            "held {took:?} by a 300 ms limit"
        );
        let _ = holder.join();
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A taker that says "took" a byte at a time, each within the socket's own timeout, is
    /// cut at the confirmation's limit as a whole: the holder, which accepts no one
    /// meanwhile, serves again then. Before, each byte restarted the timeout, and the holder
    /// waited for as long as the taker kept dribbling (here 10 s, against a 500 ms limit).
    /// The taker's late bytes find the handover ended; one whose "took" came in time counts.
    #[tokio::test]
    async fn a_taker_that_says_took_a_byte_at_a_time_is_cut_at_the_limit() {
        let dir = scratch("dribble");
        let path = dir.join("up.sock");
        for (gap, limit, want) in [
            (Duration::from_secs(2), Duration::from_millis(500), false),
            (Duration::ZERO, Duration::from_secs(10), true),
        ] {
            let (holder, h) = holding_nothing_taken_over(&path).await;
            let taker = tokio::task::spawn_blocking(move || {
                (&h.conn).write_all(READY)?;
                let mut fds = Vec::new();
                let mut got = [0u8; STOPPING.len()];
                read_exact_fds(&h.conn, &mut got, &mut fds)?;
                receive_state(&h.conn, &mut fds)?;
                for b in TOOK {
                    std::thread::sleep(gap);
                    (&h.conn).write_all(&[*b])?;
                }
                Ok::<(), std::io::Error>(())
            });
            let ready = holder
                .await
                .unwrap_or_else(|e| panic!("{e}"))
                .unwrap_or_else(|| panic!("the holder saw no ready taker"));
            let started = std::time::Instant::now();
            let took = ready.confirm_within(State::default(), limit).await;
            let waited = started.elapsed();
            assert_eq!(took.is_some(), want, "gap {gap:?}");
            if !want {
                assert!(
                    waited < Duration::from_millis(1_900),
                    "cut at the limit, not after the taker's {} bytes: {waited:?}",
                    TOOK.len()
                );
                assert!(
                    taker.await.unwrap_or_else(|e| panic!("{e}")).is_err(),
                    "the taker's late bytes find the handover ended"
                );
            } else {
                taker
                    .await
                    .unwrap_or_else(|e| panic!("{e}"))
                    .unwrap_or_else(|e| panic!("taker: {e}"));
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A taker that says hello a byte at a time is let go at the offer's limit, and the next
    /// taker is served: before, each byte restarted the socket's timeout, and the upgrade
    /// socket served no one else for as long as the first kept going.
    #[tokio::test]
    async fn a_taker_that_says_hello_a_byte_at_a_time_is_let_go_at_the_offer_limit() {
        let dir = scratch("slow-hello");
        let path = dir.join("up.sock");
        let listener = listen(&path).unwrap_or_else(|e| panic!("{e}"));
        let holder = tokio::spawn(hold_within(
            listener,
            std::sync::Arc::new(Held::new(Vec::new())),
            std::future::pending(),
            Duration::from_millis(300),
        ));
        // Connected first, so accepted first.
        let mut conn = UnixStream::connect(&path).unwrap_or_else(|e| panic!("{e}"));
        let slow = tokio::task::spawn_blocking(move || {
            for b in HELLO {
                conn.write_all(&[*b])?;
                std::thread::sleep(Duration::from_millis(200));
            }
            Ok::<(), std::io::Error>(())
        });
        let p = path.clone();
        let started = std::time::Instant::now();
        let h = tokio::task::spawn_blocking(move || take_over(&p))
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("no holder found"));
        let second = tokio::task::spawn_blocking(move || (&h.conn).write_all(READY).map(|()| h));
        let ready = holder
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("the holder saw no ready taker"));
        assert!(
            started.elapsed() < Duration::from_millis(1_500),
            "the second taker was served at the first's limit, not after its {} bytes: {:?}",
            HELLO.len(),
            started.elapsed()
        );
        drop(ready);
        let _ = second.await;
        assert!(
            slow.await.unwrap_or_else(|e| panic!("{e}")).is_err(),
            "the slow one's late bytes find its exchange ended"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A path that holds something other than a socket is not replaced.
    /// A "ready" that comes while the successor's binary is being started is known as its
    /// own by its parent: this process.
    #[test]
    fn a_child_s_parent_is_read_from_proc() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap_or_else(|e| panic!("sleep: {e}"));
        let parent = parent_of(child.id());
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(parent, Some(std::process::id()));
        assert_ne!(parent_of(std::process::id()), Some(std::process::id()));
    }

    #[test]
    fn the_upgrade_socket_replaces_a_socket_only() {
        let dir = scratch("file");
        let path = dir.join("limpet.toml");
        std::fs::write(&path, "kept").unwrap_or_else(|e| panic!("{e}"));
        assert!(listen(&path).is_err());
        assert_eq!(std::fs::read_to_string(&path).ok().as_deref(), Some("kept"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// No limpet at the path (no file, or a file one left behind): start afresh.
    #[test]
    fn no_holder_at_the_path_is_a_fresh_start() {
        let dir = scratch("none");
        let path = dir.join("up.sock");
        assert!(matches!(take_over(&path), Ok(None)));
        let stale = std::os::unix::net::UnixListener::bind(&path).unwrap_or_else(|e| panic!("{e}"));
        drop(stale);
        assert!(path.exists());
        assert!(matches!(take_over(&path), Ok(None)));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
