//! The one routing decision: from what a request or connection presents to where it goes,
//! what the answer pins, and what the affinity table learns.
//!
//! [`route`] is a pure function. It takes no lock and reads no clock: the node states come
//! in a [`Snapshot`], the rotation turn and open-connection counts as arguments, time as
//! `now_ms`. HTTP, TCP and `limpet sim` all call it and carry out the [`Route`] it returns;
//! none of them chooses a node on its own.
//!
//! ```text
//!  RouteInput { cookie pin + home, connection's pin, table entry, spread key, excluded, now }
//!        │                         Snapshot { per-node status, eligible, schedule }
//!        ▼                                    │
//!   route() ◄─────────────────────────────────┘  + rotation turn + open counts
//!        │
//!   Route { node, outcome, cookie to set, home cookie, table write, trial, took_turn }
//! ```
//!
//! Precedence (first that applies):
//! 1. `failback = "home"`: the session's home node is UP again and the session is elsewhere.
//! 2. A table the listener writes (shared with other listeners: source IP, request header)
//!    names a node that honours it, and the cookie names another: the table wins and the
//!    cookie is rewritten. The table is what every listener of the session reads; a TCP
//!    connection that moved it (say while the cookie's node was in MAINT) must not be undone
//!    by a stale cookie, or the session would be split across two nodes.
//! 3. The affinity cookie names a node that honours it ([`NodeStatus::verdict`]).
//! 4. No usable cookie, but this connection already got a node for an earlier request whose
//!    cookie the client has not sent back yet: follow it (concurrent first requests agree),
//!    and write it into the table, which had no entry a node could honour.
//! 5. The table's entry for the session's key names a node that honours it.
//! 6. A fresh assignment: a DOWN node due its trial first (without checks nothing else would
//!    ever try it), then the listener's balance over the UP nodes. Not the trial when the
//!    request already went out to a node that failed it (a second wait, maybe on a hung
//!    node), nor after two DOWN nodes refused it (`TRIALS_PER_REQUEST`): an UP node then;
//!    with none, a due trial still beats an error. Steps 2, 3 and 5 make no trial of a
//!    request that went out either, while an UP node can take it.
//!
//! Pins to nodes in `exclude` (nodes that already failed for this request) are re-pinned
//! with the reason each was excluded for ([`Excluded`]: how the node failed, e.g.
//! [`RepinReason::AnswerTimeout`]); that is how failover routes again.
//!
//! The session's *spread key* is derived once ([`spread_key`]): from the table key when the
//! listener has a table, else from the client address and the cookie's issue time. Every
//! listener sharing a table therefore places a session at the same point of a drain's
//! re-pin window, and all of them move it at the same moment.

use crate::decision::{Pin, RepinReason};
use crate::node::{AdminState, NodeId, NodeStatus, Verdict};
use crate::pool::Balance;

/// Node states as the router reads them: a copy per node, plus the nodes that take fresh
/// assignments and the weighted round-robin cycle over them, rebuilt whenever a state
/// changes (never per request).
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    statuses: Vec<NodeStatus>,
    weights: Vec<u32>,
    /// Nodes that take fresh assignments, in pool order.
    eligible: Vec<NodeId>,
    /// The round-robin cycle over `eligible`, each node `weight` times, interleaved.
    schedule: Vec<NodeId>,
    /// When the first trial of a READY node DOWN by its traffic comes due (`u64::MAX`:
    /// none): until then [`Snapshot::trials_due`] has nothing, read with one comparison.
    /// Without the nodes that left requests unanswered, then with them.
    next_trial_ms: u64,
    next_answer_trial_ms: u64,
}

impl Snapshot {
    /// A snapshot of these `(weight, status)` nodes, in pool order.
    pub fn new(nodes: impl IntoIterator<Item = (u32, NodeStatus)>) -> Self {
        let (weights, statuses): (Vec<u32>, Vec<NodeStatus>) = nodes.into_iter().unzip();
        let eligible: Vec<NodeId> = statuses
            .iter()
            .enumerate()
            .filter(|(_, s)| s.takes_fresh())
            .map(|(i, _)| NodeId(i as u32))
            .collect();
        let schedule = schedule(&eligible, &weights);
        let next_trial = |answers: bool| {
            statuses
                .iter()
                .filter(|s| {
                    s.admin == AdminState::Ready && (answers || !s.health.awaits_an_answer())
                })
                .filter_map(|s| s.health.retry_at_ms(s.policy))
                .min()
                .unwrap_or(u64::MAX)
        };
        let (next_trial_ms, next_answer_trial_ms) = (next_trial(false), next_trial(true));
        let snap = Snapshot {
            statuses,
            weights,
            eligible,
            schedule,
            next_trial_ms,
            next_answer_trial_ms,
        };
        snap.debug_check();
        snap
    }

    pub fn len(&self) -> usize {
        self.statuses.len()
    }

    pub fn is_empty(&self) -> bool {
        self.statuses.is_empty()
    }

    pub fn status(&self, id: NodeId) -> Option<&NodeStatus> {
        self.statuses.get(id.index())
    }

    pub fn weight(&self, id: NodeId) -> u32 {
        self.weights.get(id.index()).copied().unwrap_or(1)
    }

    /// The nodes that take fresh assignments, in pool order.
    pub fn eligible(&self) -> &[NodeId] {
        &self.eligible
    }

    /// The READY nodes DOWN by their traffic whose trial is due at `now_ms`, in pool order
    /// (with `answers` false, only those a connect may decide: not one that left requests
    /// unanswered). A route tries such a node only for a fresh assignment or a session
    /// pinned to it; when every session was moved off it and none comes fresh (a fixed set
    /// of clients on a source-address table), the I/O layer tries these itself with an
    /// attempt of its own ([`Health::claim_trial`](crate::Health::claim_trial) as for any
    /// trial), so that a node that blinked does not stay DOWN for want of new clients.
    ///
    /// `answers`: the trial the I/O layer would make gets an answer from the node's process
    /// (an HTTP listener's `OPTIONS *`, or a TLS handshake where only TCP listeners reach the
    /// node), so a node that left requests unanswered may be tried too; a bare connect would
    /// not tell (its kernel completes it while the process hangs).
    pub fn trials_due(&self, now_ms: u64, answers: bool) -> impl Iterator<Item = NodeId> + '_ {
        let any = now_ms
            >= if answers {
                self.next_answer_trial_ms
            } else {
                self.next_trial_ms
            };
        self.statuses
            .iter()
            .enumerate()
            .take(if any { usize::MAX } else { 0 })
            .filter(move |(_, s)| s.trial_due(now_ms) && (answers || !s.health.awaits_an_answer()))
            .map(|(i, _)| NodeId(i as u32))
    }

    /// Whether a request waiting on `node` could be replayed now on another node that takes
    /// fresh assignments and has not failed it (`exclude`). When none could, a request
    /// waiting for `node`'s answer as `node` goes DOWN keeps waiting: cut, it would only be
    /// answered an error, where the node may still answer it.
    pub fn takes_elsewhere(&self, node: NodeId, exclude: &[Excluded]) -> bool {
        self.eligible
            .iter()
            .any(|&n| n != node && Excluded::find(exclude, n).is_none())
    }

    fn debug_check(&self) {
        debug_assert!(
            self.eligible.iter().all(|n| self.schedule.contains(n))
                && self.schedule.iter().all(|n| self.eligible.contains(n)),
            "the schedule covers exactly the eligible nodes"
        );
        debug_assert!(
            self.eligible.windows(2).all(|w| w[0] < w[1]),
            "eligible nodes are in pool order"
        );
    }
}

/// Lays out one round-robin cycle: node `n` takes `weight(n)` turns, its i-th at the ideal
/// point `(i + 1/2) / weight(n)` of the cycle; turns at the same point go in pool order.
/// With equal weights every node has one turn at 1/2, so the cycle is `eligible` itself.
fn schedule(eligible: &[NodeId], weights: &[u32]) -> Vec<NodeId> {
    let w = |n: &NodeId| weights.get(n.index()).copied().unwrap_or(1).max(1);
    let g = eligible.iter().map(w).fold(0, gcd);
    if eligible.iter().all(|n| w(n) == g) {
        return eligible.to_vec();
    }
    // (numerator, denominator) of each turn's point, compared by cross-multiplication.
    let mut turns: Vec<(u64, u64, NodeId)> = Vec::new();
    for n in eligible {
        let k = u64::from(w(n) / g);
        turns.extend((0..k).map(|i| (2 * i + 1, 2 * k, *n)));
    }
    turns.sort_by(|a, b| (a.0 * b.1).cmp(&(b.0 * a.1)).then(a.2.cmp(&b.2)));
    turns.into_iter().map(|t| t.2).collect()
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The affinity cookie as a request carried it (listeners with cookie affinity).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CookieIn {
    pub pin: Pin,
    /// When the (signed) cookie was first issued; kept when it is refreshed.
    pub issued_ms: Option<u64>,
    /// The cookie is valid but must be sent again (a signed cookie near its idle limit).
    pub refresh: bool,
    /// The home cookie (`failback = "home"`); `Pin::None` without failback.
    pub home: Pin,
}

/// The table's entry for the session's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableIn {
    /// What the entry says (`Pin::None`: no entry).
    pub pin: Pin,
    /// Whether routing writes the entry. False for tables that learn from answers (an
    /// application cookie or a header the node sets): they are looked up, and written only
    /// to re-pin an entry whose node cannot take it, so the session's later requests agree.
    pub writes: bool,
}

/// What a request or connection presents to the router.
#[derive(Debug, Clone, Copy)]
pub struct RouteInput<'a> {
    /// `None`: the listener has no cookie affinity.
    pub cookie: Option<CookieIn>,
    /// `failback = "home"` on the listener.
    pub failback: bool,
    /// The node this client connection was given for an earlier request whose cookie has not
    /// come back yet (HTTP).
    pub conn_pin: Option<NodeId>,
    /// `None`: the listener has no table, or the request has no key.
    pub table: Option<TableIn>,
    /// The session's place in a drain's re-pin window; see [`spread_key`].
    pub spread_key: u64,
    pub balance: Balance,
    /// Nodes that already failed for this request or connection, each with how.
    pub exclude: &'a [Excluded],
    pub now_ms: u64,
}

/// A node the route must not choose, and why: a pin to it is re-pinned for `why`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Excluded {
    pub node: NodeId,
    /// How the node failed for this request ([`RepinReason::ConnectFailed`],
    /// [`RepinReason::AnswerTimeout`], [`RepinReason::AnswerFailed`]), or, for a node left
    /// out for another reason (its trial taken by another connection), that reason.
    pub why: RepinReason,
}

impl Excluded {
    /// Why `node` is in `list`, if it is.
    pub fn find(list: &[Excluded], node: NodeId) -> Option<RepinReason> {
        list.iter().find(|e| e.node == node).map(|e| e.why)
    }
}

/// How the route's node was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The cookie named a node that honours it.
    Sticky,
    /// The table's entry named a node that honours it, and the cookie was missing, or named
    /// another node that would honour it too (the shared table wins; the cookie is rewritten).
    TableHit,
    /// No pin at all: a fresh assignment (or this connection's earlier one).
    Fresh,
    /// A pin that could not be honoured: a fresh assignment, and the pin moves.
    Repin(RepinReason),
    /// `failback = "home"`: back to the session's home node.
    Failback,
    /// No node can take it.
    None,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Sticky => "sticky",
            Outcome::TableHit => "sticky(table)",
            Outcome::Fresh => "new",
            Outcome::Repin(_) => "re-pinned",
            Outcome::Failback => "failback",
            Outcome::None => "none",
        }
    }
}

/// The affinity cookie the answer sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CookieWrite {
    None,
    /// Set the cookie to the route's node. `issued_ms`: the original issue time of a
    /// refreshed signed cookie (`None`: issued now).
    Set {
        issued_ms: Option<u64>,
    },
}

/// What the answer does with the home cookie (`failback = "home"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HomeWrite {
    Keep,
    /// Moved away from this node because of the node: remember it as home.
    Set(NodeId),
    /// Back home: the home cookie has done its job.
    Clear,
}

/// What the answer does with the client connection's pin ([`RouteInput::conn_pin`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnPinWrite {
    Keep,
    /// Remember this node on the connection until the cookie comes back.
    Set(NodeId),
    /// A request of the connection brought a cookie naming another node than the pin's, one
    /// it stays on: the connection carries more than one session (a front proxy pooling
    /// its connections to limpet), so a later request without a cookie is a new session,
    /// balanced as any other; kept, the pin sent every new session of a pooled connection
    /// to one node. A cookie naming the pin's own node keeps it: one client's requests that
    /// go without the cookie (outside its `Path`, a `SameSite` it does not meet) stay with
    /// the ones that carry it, on one connection as before.
    Clear,
}

/// The whole decision for one request or connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// `None`: no node can take it (answer 503, close the connection).
    pub node: Option<NodeId>,
    pub outcome: Outcome,
    pub cookie: CookieWrite,
    pub home: HomeWrite,
    /// Pin the table's key to this node now (before connecting: concurrent connections of
    /// the same session must find it).
    pub table: Option<NodeId>,
    /// The client connection's pin (HTTP: a node remembered until the cookie comes back).
    pub conn_pin: ConnPinWrite,
    /// The node is DOWN and due a trial: the caller claims it before connecting, and routes
    /// again with the node excluded if the claim is taken.
    pub trial: bool,
    /// The route used a turn of the rotation: the caller advances it.
    pub took_turn: bool,
    /// With `trial`: the node's `fail_timeout` has not passed, but no node can take the
    /// request otherwise (every node that could is DOWN by its traffic alone): it is tried
    /// now rather than the client answered 503 (nginx marks all its peers live again in
    /// that case, "for quick recovery"). The caller claims it as such
    /// (`Health::claim_trial`'s `early`).
    pub trial_early: bool,
}

impl Route {
    /// No node: answer 503, close the connection.
    pub fn none() -> Route {
        Route {
            node: None,
            outcome: Outcome::None,
            cookie: CookieWrite::None,
            home: HomeWrite::Keep,
            table: None,
            conn_pin: ConnPinWrite::Keep,
            trial: false,
            took_turn: false,
            trial_early: false,
        }
    }
}

/// The session's spread key: a well-mixed hash of the table key's bytes when there is one
/// (`table_key`), else of the client address and the cookie's issue time. One derivation for
/// HTTP, TCP, the drain re-pin and the long-lived sessions' end, fixed seed.
pub fn spread_key(table_key: Option<&[u8]>, client: &[u8], issued_ms: Option<u64>) -> u64 {
    // FNV-1a then the splitmix64 finaliser: stable across restarts and instances.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut feed = |bytes: &[u8]| {
        for &x in bytes {
            h = (h ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3);
        }
    };
    match table_key {
        Some(k) => {
            feed(b"k");
            feed(k);
        }
        None => {
            feed(b"c");
            feed(client);
            if let Some(t) = issued_ms {
                feed(&t.to_be_bytes());
            }
        }
    }
    let mut z = h;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The decision. See the module docs for the precedence.
pub fn route(
    snap: &Snapshot,
    rotation: u64,
    active: &dyn Fn(NodeId) -> u32,
    input: &RouteInput<'_>,
) -> Route {
    let now = input.now_ms;
    let verdict = |id: NodeId| -> Verdict {
        if let Some(why) = Excluded::find(input.exclude, id) {
            return Verdict::Repin(why);
        }
        match snap.status(id) {
            Some(s) => s.verdict(now, input.spread_key),
            None => Verdict::Repin(RepinReason::UnknownNode),
        }
    };
    // A request that went out to a node that failed it is no trial of a DOWN node while a
    // node UP can take it, whatever pins the DOWN node (as for a fresh assignment, 6): the
    // trial, of a node possibly hung, would be its second wait, with no replay after it.
    let sent = sent_before(input);
    let pin_reason = |pin: Pin| -> Result<Option<(NodeId, bool)>, RepinReason> {
        match pin {
            Pin::None => Ok(None),
            Pin::Node(id) => match verdict(id) {
                Verdict::Honour => Ok(Some((id, false))),
                Verdict::Trial if sent && snap.takes_elsewhere(id, input.exclude) => {
                    Err(RepinReason::NodeDown)
                }
                Verdict::Trial => Ok(Some((id, true))),
                Verdict::Repin(r) => Err(r),
            },
            Pin::Unknown => Err(RepinReason::UnknownNode),
            Pin::Invalid => Err(RepinReason::InvalidCookie),
            Pin::Expired => Err(RepinReason::ExpiredCookie),
        }
    };
    let table_writes = input.table.is_some_and(|t| t.writes);
    let learn = |node: NodeId| table_writes.then_some(node);
    let cookie = input.cookie;
    let has_cookie = cookie.is_some();

    let mut cookie_reason = None;
    if let Some(c) = cookie {
        // 1. Failback: home is UP again and the session is elsewhere.
        if input.failback {
            if let Pin::Node(home) = c.home {
                let home_up = Excluded::find(input.exclude, home).is_none()
                    && snap.status(home).is_some_and(NodeStatus::takes_fresh);
                if home_up && c.pin != Pin::Node(home) {
                    return Route {
                        node: Some(home),
                        outcome: Outcome::Failback,
                        cookie: CookieWrite::Set { issued_ms: None },
                        home: HomeWrite::Clear,
                        table: learn(home),
                        conn_pin: ConnPinWrite::Set(home),
                        trial: false,
                        took_turn: false,
                        trial_early: false,
                    };
                }
            }
        }
        // 2. A shared table that disagrees with the cookie: the table is the session's truth.
        if let Some(t) = input.table.filter(|t| t.writes) {
            if let (Ok(Some((node, trial))), true) = (pin_reason(t.pin), c.pin != t.pin) {
                // The cookie's own verdict still names the re-pin (stats, logs, home).
                let why = pin_reason(c.pin).err();
                return Route {
                    node: Some(node),
                    outcome: why.map_or(Outcome::TableHit, Outcome::Repin),
                    cookie: CookieWrite::Set { issued_ms: None },
                    home: home_write(input, why, node),
                    table: None,
                    conn_pin: ConnPinWrite::Set(node),
                    trial,
                    took_turn: false,
                    trial_early: false,
                };
            }
        }
        // 3. The cookie's pin.
        match pin_reason(c.pin) {
            Ok(Some((node, trial))) => {
                return Route {
                    node: Some(node),
                    outcome: Outcome::Sticky,
                    cookie: if c.refresh {
                        CookieWrite::Set {
                            issued_ms: c.issued_ms,
                        }
                    } else {
                        CookieWrite::None
                    },
                    home: HomeWrite::Keep,
                    table: learn(node),
                    conn_pin: if input.conn_pin.is_some_and(|p| p != node) {
                        ConnPinWrite::Clear
                    } else {
                        ConnPinWrite::Keep
                    },
                    trial,
                    took_turn: false,
                    trial_early: false,
                }
            }
            Ok(None) => {}
            Err(r) => cookie_reason = Some(r),
        }
        // 4. This connection's earlier choice, not yet confirmed by the cookie.
        if let Some(node) = input.conn_pin {
            if verdict(node) == Verdict::Honour {
                return Route {
                    node: Some(node),
                    outcome: cookie_reason.map_or(Outcome::Fresh, Outcome::Repin),
                    cookie: CookieWrite::Set { issued_ms: None },
                    home: home_write(input, cookie_reason, node),
                    // Reached only when the table has no entry this node could honour (an
                    // entry that could wins at 2): the session's other listeners read the
                    // table, so it is written here as at 3 and 6, or a client that keeps
                    // no cookie, on its kept-alive connection, would be sent to one node
                    // while its TCP ports, finding no entry, were balanced to another.
                    table: learn(node),
                    conn_pin: ConnPinWrite::Keep,
                    trial: false,
                    took_turn: false,
                    trial_early: false,
                };
            }
        }
    }
    // 5. The table's entry.
    let mut table_reason = None;
    if let Some(t) = input.table {
        match pin_reason(t.pin) {
            Ok(Some((node, trial))) => {
                return Route {
                    node: Some(node),
                    outcome: if has_cookie {
                        cookie_reason.map_or(Outcome::TableHit, Outcome::Repin)
                    } else {
                        Outcome::TableHit
                    },
                    cookie: if has_cookie {
                        CookieWrite::Set { issued_ms: None }
                    } else {
                        CookieWrite::None
                    },
                    home: home_write(input, cookie_reason, node),
                    table: None,
                    conn_pin: if has_cookie {
                        ConnPinWrite::Set(node)
                    } else {
                        ConnPinWrite::Keep
                    },
                    trial,
                    took_turn: false,
                    trial_early: false,
                };
            }
            Ok(None) => {}
            Err(r) => table_reason = Some(r),
        }
    }
    // 6. A fresh assignment.
    let Some(Fresh {
        node,
        trial,
        trial_early,
        took_turn,
    }) = fresh(snap, rotation, active, input)
    else {
        return Route::none();
    };
    let reason = cookie_reason.or(table_reason);
    Route {
        node: Some(node),
        outcome: reason.map_or(Outcome::Fresh, Outcome::Repin),
        cookie: if has_cookie {
            CookieWrite::Set { issued_ms: None }
        } else {
            CookieWrite::None
        },
        home: home_write(input, cookie_reason, node),
        // A learning table's entry to a node that is gone re-pins like any other table's.
        table: (table_writes || table_reason.is_some()).then_some(node),
        conn_pin: if has_cookie {
            ConnPinWrite::Set(node)
        } else {
            ConnPinWrite::Keep
        },
        trial,
        took_turn,
        trial_early,
    }
}

/// Why a session leaves the node its table entry named ([`leaves`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leave {
    /// The node failed one of the session's requests.
    Failed(RepinReason),
    /// Failback: the session goes home, its cookie's home node UP again.
    Failback,
}

/// The node `route` moves the session off while that node may be UP, so that nothing in its
/// state ends the session's other connections there (a TCP session, a tunnel, through any
/// listener sharing the table): the caller ends them, or the session would live on two
/// nodes. Either the node failed one of its requests (excluded for a failure,
/// [`RepinReason::is_failure`]), or the session fails back home (`failback = "home"`: its
/// requests go home, and a TCP session on the node it had moved to stayed there until the
/// next table hold, up to a minute; chaos run 27). The session's table entry named the node
/// and the route writes it to another. Only a table entry says the session moved, at once
/// and for every listener: a cookie moves only with an answer, and without a table the
/// spread key is not one session's (in `name` mode it is the client address, which every
/// client behind one NAT shares). A node left for its state (DOWN, MAINT, a drain) is not
/// reported: its state ends them. The node, and why.
pub fn leaves(input: &RouteInput<'_>, route: &Route) -> Option<(NodeId, Leave)> {
    let (
        Some(TableIn {
            pin: Pin::Node(n), ..
        }),
        Some(to),
    ) = (input.table, route.table)
    else {
        return None;
    };
    let why = match route.outcome {
        Outcome::Failback => Leave::Failback,
        // Whatever the outcome says of the cookie: a request re-pinned, and just as much one
        // the cookie's own node took (`Sticky`: a cookie naming another node than the
        // table's, stale after the session's TCP port moved the entry) once the table's node
        // failed it. The entry moves off a node that may be UP either way.
        _ => Leave::Failed(Excluded::find(input.exclude, n).filter(|w| w.is_failure())?),
    };
    (n != to).then_some((n, why))
}

/// The home-cookie rule. A session re-pinned away from its cookie's node because of that node
/// (DOWN, MAINT, drain ended, failed this request) remembers the node as home, unless it already
/// has a home (moved twice: the first node stays home).
fn home_write(input: &RouteInput<'_>, reason: Option<RepinReason>, to: NodeId) -> HomeWrite {
    let Some(c) = input.cookie.filter(|_| input.failback) else {
        return HomeWrite::Keep;
    };
    let node_fault = matches!(
        reason,
        Some(
            RepinReason::NodeDown
                | RepinReason::NodeMaint
                | RepinReason::DrainEnded
                | RepinReason::ConnectFailed
                | RepinReason::AnswerTimeout
                | RepinReason::AnswerFailed
        )
    );
    match (c.pin, c.home) {
        (_, Pin::Node(_)) => HomeWrite::Keep,
        (Pin::Node(was), _) if node_fault && was != to => HomeWrite::Set(was),
        _ => HomeWrite::Keep,
    }
}

/// A fresh node, and how it was chosen.
struct Fresh {
    node: NodeId,
    /// The node is DOWN: this is its trial.
    trial: bool,
    /// A trial before the node's `fail_timeout`, for want of any other node.
    trial_early: bool,
    took_turn: bool,
}

/// A fresh node. A DOWN node due its trial goes first, in pool order; otherwise the balance
/// over the nodes that take fresh assignments; and when none of them can (every one is
/// DOWN, or excluded for this request), the DOWN node whose trial comes soonest among those
/// DOWN by their traffic alone, tried early ([`Route::trial_early`]).
fn fresh(
    snap: &Snapshot,
    rotation: u64,
    active: &dyn Fn(NodeId) -> u32,
    input: &RouteInput<'_>,
) -> Option<Fresh> {
    let excluded = |n: NodeId| Excluded::find(input.exclude, n).is_some();
    let due_trial = || {
        snap.statuses
            .iter()
            .enumerate()
            .position(|(i, s)| s.trial_due(input.now_ms) && !excluded(NodeId(i as u32)))
            .map(|i| Fresh {
                node: NodeId(i as u32),
                trial: true,
                trial_early: false,
                took_turn: false,
            })
    };
    // A request that already went out to a node that failed it goes to a node UP first: the
    // trial of a node DOWN, possibly hung, would be its second wait, with no replay after
    // it. With no node UP to take it, a due trial still beats its error.
    // Nor after it tried as many DOWN nodes as one request may (their connects refused or
    // timed out): a fleet with several nodes blackholed costs the client two connect
    // timeouts, not one per node, before an UP node takes it; the next request tries the
    // next node due.
    let sent = sent_before(input);
    if !sent && down_tried(snap, input) < TRIALS_PER_REQUEST {
        if let Some(f) = due_trial() {
            return Some(f);
        }
    }
    let balanced = match input.balance {
        Balance::RoundRobin => {
            let len = snap.schedule.len();
            let start = (rotation % len.max(1) as u64) as usize;
            (0..len)
                .map(|i| snap.schedule[(start + i) % len])
                .find(|&n| !excluded(n))
        }
        Balance::LeastConn => least_conn(snap, rotation, active, &excluded),
    };
    if let Some(node) = balanced {
        return Some(Fresh {
            node,
            trial: false,
            trial_early: false,
            took_turn: true,
        });
    }
    if sent {
        if let Some(f) = due_trial() {
            return Some(f);
        }
    }
    early_trial(snap, input).map(|node| Fresh {
        node,
        trial: true,
        trial_early: true,
        took_turn: false,
    })
}

/// Whether the request went out to a node that then failed it (no answer in time, or its
/// connection lost after it): a node excluded for one of those reasons. (`NodeDown` is no
/// sign of it: a request that left a node's queue, lost a trial's claim, or a TCP session
/// moved before any byte, are excluded for it too, and nothing of theirs went out.)
fn sent_before(input: &RouteInput<'_>) -> bool {
    input.exclude.iter().any(|e| {
        matches!(
            e.why,
            RepinReason::AnswerTimeout | RepinReason::AnswerFailed
        )
    })
}

/// How many DOWN nodes one request may try (due their trial, or early) before it goes to a
/// node UP, or is answered 503 when none is: a fleet that is blackholed (every connect waits
/// out its timeout) costs a client two connect timeouts, not one per node.
const TRIALS_PER_REQUEST: usize = 2;

/// How many DOWN nodes this request tried already (their connects failed).
fn down_tried(snap: &Snapshot, input: &RouteInput<'_>) -> usize {
    input
        .exclude
        .iter()
        .filter(|e| {
            e.why == RepinReason::ConnectFailed
                && snap.status(e.node).is_some_and(|s| !s.takes_fresh())
        })
        .count()
}

/// The DOWN node to try early when no node takes the request ([`Route::trial_early`]), if
/// any. Only while nothing was sent for this request: a node that took it and did not answer
/// (an answer timeout, a lost connection) ends it with its error rather than replaying it on
/// a node already known to be DOWN, possibly hung. At most [`TRIALS_PER_REQUEST`] per
/// request. The session's own node first (its cookie's or table entry's: a session whose
/// node came back as quickly as the others stays home), then the one whose trial comes
/// soonest.
fn early_trial(snap: &Snapshot, input: &RouteInput<'_>) -> Option<NodeId> {
    if sent_before(input) || down_tried(snap, input) >= TRIALS_PER_REQUEST {
        return None;
    }
    let may = |n: NodeId| {
        Excluded::find(input.exclude, n).is_none()
            && snap
                .status(n)
                .is_some_and(|s| s.early_trial_possible(input.now_ms))
    };
    let pinned = [input.cookie.map(|c| c.pin), input.table.map(|t| t.pin)];
    if let Some(n) = pinned.into_iter().find_map(|p| match p {
        Some(Pin::Node(n)) if may(n) => Some(n),
        _ => None,
    }) {
        return Some(n);
    }
    (0..snap.statuses.len())
        .map(|i| NodeId(i as u32))
        .filter(|&n| may(n))
        .min_by_key(|&n| {
            snap.status(n)
                .and_then(|s| s.health.retry_at_ms(s.policy))
                .unwrap_or(u64::MAX)
        })
}

/// Fewest connections per unit of weight, among the nodes that take fresh assignments and
/// are not excluded. The rotation's turn names a node: taken when it is among those tied on
/// the fewest (with every node tied, plain round-robin); otherwise a tied node is drawn by
/// a hash of the turn. Taking the first tied node after the turn's instead gave the node
/// after a busy one in pool order twice the others' share (chaos run 25: 4 / 317 / 181 with
/// the first node slow), and dealing the ties by the turn modulo their number was uneven
/// whenever that number changed between picks (verification run 27: 2:1 with all nodes
/// fast under concurrent load).
fn least_conn(
    snap: &Snapshot,
    rotation: u64,
    active: &dyn Fn(NodeId) -> u32,
    excluded: &dyn Fn(NodeId) -> bool,
) -> Option<NodeId> {
    // Each count read once: they are live counters that other threads move, and a second
    // read could find no node tied at a minimum taken from the first.
    let loads: Vec<(NodeId, u64, u64)> = snap
        .eligible
        .iter()
        .copied()
        .filter(|&n| !excluded(n))
        .map(|n| (n, u64::from(active(n)), u64::from(snap.weight(n))))
        .collect();
    // a/wa < b/wb  <=>  a*wb < b*wa.
    let less = |a: (u64, u64), b: (u64, u64)| a.0 * b.1 < b.0 * a.1;
    let least = loads
        .iter()
        .map(|&(_, a, w)| (a, w))
        .reduce(|m, l| if less(l, m) { l } else { m })?;
    let is_tied = |&&(_, a, w): &&(NodeId, u64, u64)| !less(least, (a, w));
    let turn = loads.get((rotation % loads.len() as u64) as usize)?;
    if is_tied(&turn) {
        return Some(turn.0);
    }
    let count = loads.iter().filter(is_tied).count().max(1);
    let draw = mix(rotation) % count as u64;
    loads
        .iter()
        .filter(is_tied)
        .nth(draw as usize)
        .map(|&(n, _, _)| n)
}

/// The splitmix64 finaliser: a well-mixed 64-bit value of `x`.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::{Health, HealthPolicy, Observation};
    use crate::node::AdminState;

    fn snap(states: &[NodeStatus]) -> Snapshot {
        Snapshot::new(states.iter().map(|s| (1, *s)))
    }

    fn up() -> NodeStatus {
        NodeStatus::default()
    }

    fn down_passive(at: u64) -> NodeStatus {
        let policy = HealthPolicy {
            fall: 1,
            ..HealthPolicy::default()
        };
        let mut health = Health::default();
        health.observe(Observation::TrafficFailed, policy, at);
        NodeStatus {
            admin: AdminState::Ready,
            health,
            policy,
        }
    }

    fn input<'a>(exclude: &'a [Excluded]) -> RouteInput<'a> {
        RouteInput {
            cookie: None,
            failback: false,
            conn_pin: None,
            table: None,
            spread_key: 0,
            balance: Balance::RoundRobin,
            exclude,
            now_ms: 0,
        }
    }

    /// A table entry naming `pin`; `writes`: routing writes it (not a learned table).
    fn table(pin: Pin, writes: bool) -> Option<TableIn> {
        Some(TableIn { pin, writes })
    }

    fn cookie(pin: Pin) -> Option<CookieIn> {
        cookie_home(pin, Pin::None)
    }

    /// A pin cookie with a home cookie beside it (`failback = "home"`).
    fn cookie_home(pin: Pin, home: Pin) -> Option<CookieIn> {
        Some(CookieIn {
            pin,
            issued_ms: None,
            refresh: false,
            home,
        })
    }

    const A: NodeId = NodeId(0);
    const B: NodeId = NodeId(1);
    const C: NodeId = NodeId(2);

    #[test]
    fn a_cookie_to_a_node_that_honours_it_is_sticky_and_takes_no_turn() {
        let s = snap(&[up(), up()]);
        let r = route(
            &s,
            0,
            &|_| 0,
            &RouteInput {
                cookie: cookie(Pin::Node(B)),
                ..input(&[])
            },
        );
        assert_eq!(r.node, Some(B));
        assert_eq!(r.outcome, Outcome::Sticky);
        assert_eq!(r.cookie, CookieWrite::None);
        assert!(!r.took_turn);
    }

    /// `node` failed this request in the way `why` says.
    fn failed(node: NodeId, why: RepinReason) -> Excluded {
        Excluded { node, why }
    }

    #[test]
    fn an_excluded_pin_repins_for_how_its_node_failed_and_the_table_follows() {
        let s = snap(&[up(), up(), up()]);
        for why in [
            RepinReason::ConnectFailed,
            RepinReason::AnswerTimeout,
            RepinReason::AnswerFailed,
        ] {
            let r = route(
                &s,
                0,
                &|_| 0,
                &RouteInput {
                    cookie: cookie(Pin::Node(A)),
                    table: table(Pin::Node(A), true),
                    failback: true,
                    ..input(&[failed(A, why)])
                },
            );
            assert_eq!(r.node, Some(B), "{why:?}");
            assert_eq!(r.outcome, Outcome::Repin(why));
            assert_eq!(r.table, Some(B));
            assert_eq!(r.home, HomeWrite::Set(A), "{why:?}");
            assert_eq!(r.cookie, CookieWrite::Set { issued_ms: None });
            assert!(r.took_turn);
        }
    }

    /// A session whose table entry names a node that failed its request leaves that node
    /// (its other connections there must end); one moved for its node's state, one pinned
    /// by its cookie alone, or one with no pin leaves none.
    #[test]
    fn a_route_leaves_the_table_s_node_only_when_that_node_failed_the_request() {
        let s = snap(&[up(), up(), down_passive(0)]);
        let moved =
            |input: RouteInput<'_>| leaves(&input, &route(&s, 0, &|_| 0, &input)).map(|(n, _)| n);
        let timed_out = [failed(A, RepinReason::AnswerTimeout)];
        assert_eq!(
            moved(RouteInput {
                table: table(Pin::Node(A), true),
                ..input(&timed_out)
            }),
            Some(A)
        );
        assert_eq!(
            moved(RouteInput {
                cookie: cookie(Pin::Node(A)),
                table: table(Pin::Node(A), true),
                ..input(&[failed(A, RepinReason::ConnectFailed)])
            }),
            Some(A)
        );
        // The cookie alone: no session identity to end connections by.
        assert_eq!(
            moved(RouteInput {
                cookie: cookie(Pin::Node(A)),
                ..input(&timed_out)
            }),
            None
        );
        // Not pinned to the node that failed: a fresh request that failed on A leaves nothing.
        assert_eq!(moved(input(&timed_out)), None);
        assert_eq!(
            moved(RouteInput {
                table: table(Pin::Node(B), true),
                ..input(&timed_out)
            }),
            None
        );
        // Moved for the node's state: DOWN ends its sessions by itself.
        assert_eq!(
            moved(RouteInput {
                table: table(Pin::Node(C), true),
                ..input(&[])
            }),
            None
        );
        // A trial held by another connection re-pins as node-down: not a failure.
        assert_eq!(
            moved(RouteInput {
                table: table(Pin::Node(A), true),
                ..input(&[failed(A, RepinReason::NodeDown)])
            }),
            None
        );
        // A cookie naming another node than the table's: the request that failed on the
        // table's node goes to the cookie's (`Sticky`), and the entry with it, off a node
        // that is UP. Before, only a re-pin said so, and the session's TCP sessions stayed
        // on A while its requests went to B.
        let cookie_b = RouteInput {
            cookie: cookie(Pin::Node(B)),
            table: table(Pin::Node(A), true),
            ..input(&timed_out)
        };
        let r = route(&s, 0, &|_| 0, &cookie_b);
        assert_eq!(
            (r.node, r.outcome, r.table),
            (Some(B), Outcome::Sticky, Some(B))
        );
        assert_eq!(
            leaves(&cookie_b, &r),
            Some((A, Leave::Failed(RepinReason::AnswerTimeout)))
        );
        // The same cookie with nothing failed: the table's node wins, nothing is left.
        let no_failure = RouteInput {
            cookie: cookie(Pin::Node(B)),
            table: table(Pin::Node(A), true),
            ..input(&[])
        };
        let r = route(&s, 0, &|_| 0, &no_failure);
        assert_eq!(r.node, Some(A));
        assert_eq!(leaves(&no_failure, &r), None);
    }

    /// A session failing back home leaves the node its table entry names (its TCP session
    /// there must end, chaos run 27: it stayed up to a minute beside the requests gone home);
    /// without a table, nothing names its other connections.
    #[test]
    fn failback_leaves_the_table_s_node() {
        let s = snap(&[up(), up(), up()]);
        let home_a = |table: Option<TableIn>| RouteInput {
            cookie: cookie_home(Pin::Node(B), Pin::Node(A)),
            table,
            failback: true,
            ..input(&[])
        };
        let with_table = home_a(table(Pin::Node(B), true));
        let r = route(&s, 0, &|_| 0, &with_table);
        assert_eq!((r.node, r.outcome), (Some(A), Outcome::Failback));
        assert_eq!(leaves(&with_table, &r), Some((B, Leave::Failback)));
        let cookie_only = home_a(None);
        let r = route(&s, 0, &|_| 0, &cookie_only);
        assert_eq!(r.outcome, Outcome::Failback);
        assert_eq!(leaves(&cookie_only, &r), None);
    }

    /// The pin's node timed out, and the fresh node then refused: the re-pin still says why
    /// the pinned node was left, not what happened to the node tried after it.
    #[test]
    fn the_repin_reason_is_the_pinned_node_s_failure_not_the_last_one() {
        let s = snap(&[up(), up(), up()]);
        let r = route(
            &s,
            0,
            &|_| 0,
            &RouteInput {
                cookie: cookie(Pin::Node(A)),
                ..input(&[
                    failed(A, RepinReason::AnswerTimeout),
                    failed(B, RepinReason::ConnectFailed),
                ])
            },
        );
        assert_eq!(r.node, Some(C));
        assert_eq!(r.outcome, Outcome::Repin(RepinReason::AnswerTimeout));
    }

    #[test]
    fn a_table_entry_routes_and_the_cookie_catches_up() {
        let s = snap(&[up(), up()]);
        let r = route(
            &s,
            0,
            &|_| 0,
            &RouteInput {
                cookie: cookie(Pin::None),
                table: table(Pin::Node(B), true),
                ..input(&[])
            },
        );
        assert_eq!((r.node, r.outcome), (Some(B), Outcome::TableHit));
        assert_eq!(r.cookie, CookieWrite::Set { issued_ms: None });
        assert_eq!(r.conn_pin, ConnPinWrite::Set(B));
    }

    /// The connection's pin lasts until a cookie of another session comes on it: a request
    /// whose cookie names another node it stays on lets it go (the connection carries more
    /// than one client), one whose cookie names the pin's node keeps it (one client, some of
    /// whose requests go without the cookie), one whose cookie is unusable follows it, and
    /// one without a pin has none to let go.
    #[test]
    fn a_cookie_of_another_node_lets_the_connection_s_pin_go() {
        let s = snap(&[up(), up(), up()]);
        let ask = |pin: Pin, conn_pin: Option<NodeId>| {
            route(
                &s,
                2,
                &|_| 0,
                &RouteInput {
                    cookie: cookie(pin),
                    conn_pin,
                    ..input(&[])
                },
            )
        };
        for (home, write) in [(B, ConnPinWrite::Keep), (C, ConnPinWrite::Clear)] {
            let r = ask(Pin::Node(home), Some(B));
            assert_eq!(
                (r.node, r.outcome, r.conn_pin),
                (Some(home), Outcome::Sticky, write)
            );
        }
        let r = ask(Pin::Node(B), None);
        assert_eq!((r.node, r.conn_pin), (Some(B), ConnPinWrite::Keep));
        let r = ask(Pin::Unknown, Some(B));
        assert_eq!(
            (r.node, r.outcome, r.conn_pin),
            (
                Some(B),
                Outcome::Repin(RepinReason::UnknownNode),
                ConnPinWrite::Keep
            )
        );
        let r = ask(Pin::None, Some(B));
        assert_eq!((r.node, r.outcome), (Some(B), Outcome::Fresh));
    }

    /// A client that keeps no cookie, on a kept-alive connection whose earlier request went
    /// to B, and whose table entry went meanwhile (evicted, expired, deleted): the request
    /// follows the connection to B and writes B into the table, which the session's TCP
    /// ports read (chaos run 24: it wrote nothing, and the TCP ports were balanced to C).
    #[test]
    fn the_connection_s_earlier_node_is_written_into_a_table_that_lost_the_entry() {
        let s = snap(&[up(), up(), up()]);
        let r = route(
            &s,
            2,
            &|_| 0,
            &RouteInput {
                cookie: cookie(Pin::None),
                conn_pin: Some(B),
                table: table(Pin::None, true),
                ..input(&[])
            },
        );
        assert_eq!((r.node, r.table), (Some(B), Some(B)));
        // A learning table (one this listener only reads) is not written.
        let r = route(
            &s,
            2,
            &|_| 0,
            &RouteInput {
                cookie: cookie(Pin::None),
                conn_pin: Some(B),
                table: table(Pin::None, false),
                ..input(&[])
            },
        );
        assert_eq!((r.node, r.table), (Some(B), None));
    }

    #[test]
    fn a_shared_table_that_moved_the_session_wins_over_a_stale_cookie() {
        // The cookie still names A (back from MAINT), but a TCP connection moved the table
        // entry to B meanwhile: HTTP follows the table and the cookie is rewritten.
        let s = snap(&[up(), up()]);
        let r = route(
            &s,
            0,
            &|_| 0,
            &RouteInput {
                cookie: cookie(Pin::Node(A)),
                table: table(Pin::Node(B), true),
                ..input(&[])
            },
        );
        assert_eq!((r.node, r.outcome), (Some(B), Outcome::TableHit));
        assert_eq!(r.cookie, CookieWrite::Set { issued_ms: None });
        // A table learned from answers (an application cookie) does not override.
        let r = route(
            &s,
            0,
            &|_| 0,
            &RouteInput {
                cookie: cookie(Pin::Node(A)),
                table: table(Pin::Node(B), false),
                ..input(&[])
            },
        );
        assert_eq!((r.node, r.outcome), (Some(A), Outcome::Sticky));
    }

    #[test]
    fn a_down_node_due_its_trial_takes_the_next_fresh_assignment() {
        let s = snap(&[down_passive(0), up()]);
        let early = route(&s, 0, &|_| 0, &RouteInput { ..input(&[]) });
        assert_eq!((early.node, early.trial), (Some(B), false));
        let due = route(
            &s,
            0,
            &|_| 0,
            &RouteInput {
                now_ms: 10_000,
                ..input(&[])
            },
        );
        assert_eq!((due.node, due.trial, due.took_turn), (Some(A), true, false));
        // Once the trial failed for this request, the request goes elsewhere.
        let failed = route(
            &s,
            0,
            &|_| 0,
            &RouteInput {
                now_ms: 10_000,
                ..input(&[failed(A, RepinReason::ConnectFailed)])
            },
        );
        assert_eq!((failed.node, failed.trial), (Some(B), false));
    }

    /// A request that went out to a node that failed it (no answer in time, its connection
    /// lost after it) is not made a DOWN node's trial while a node UP takes it: that trial
    /// would be its second wait, with no replay after it. One that only met refused connects
    /// is (nothing of it went out); so is one with no node UP left, if a trial is due (not
    /// early). Before, the replay of a timed-out GET went to the node due its trial, hung
    /// again, and the client got 504 after two answer timeouts though another node was UP.
    #[test]
    fn a_request_that_went_out_is_no_trial_of_a_down_node() {
        let s = snap(&[up(), up(), down_passive(0)]);
        for why in [RepinReason::AnswerTimeout, RepinReason::AnswerFailed] {
            let r = route(
                &s,
                0,
                &|_| 0,
                &RouteInput {
                    now_ms: 10_000,
                    ..input(&[failed(A, why)])
                },
            );
            assert_eq!((r.node, r.trial), (Some(B), false), "{why:?}");
        }
        let r = route(
            &s,
            0,
            &|_| 0,
            &RouteInput {
                now_ms: 10_000,
                ..input(&[failed(A, RepinReason::ConnectFailed)])
            },
        );
        assert_eq!((r.node, r.trial), (Some(C), true), "nothing went out");
        // Nor is a node left for being DOWN (its queue left, a trial's claim lost): nothing
        // went out either.
        let r = route(
            &s,
            0,
            &|_| 0,
            &RouteInput {
                now_ms: 10_000,
                ..input(&[failed(A, RepinReason::NodeDown)])
            },
        );
        assert_eq!((r.node, r.trial), (Some(C), true), "left for node-down");
        // With no node UP left to take it, a due trial still beats its error; an early one
        // does not; one left for node-down may be tried early.
        let s = snap(&[up(), down_passive(0)]);
        let due = route(
            &s,
            0,
            &|_| 0,
            &RouteInput {
                now_ms: 10_000,
                ..input(&[failed(A, RepinReason::AnswerTimeout)])
            },
        );
        assert_eq!((due.node, due.trial), (Some(B), true));
        let r = route(
            &s,
            0,
            &|_| 0,
            &input(&[failed(A, RepinReason::AnswerTimeout)]),
        );
        assert_eq!(r.node, None);
        let r = route(&s, 0, &|_| 0, &input(&[failed(A, RepinReason::NodeDown)]));
        assert_eq!((r.node, r.trial_early), (Some(B), true));
    }

    /// Nor does a pin make a request that went out a DOWN node's trial while a node UP can
    /// take it: not the cookie's pin once the home node it failed back to timed out, not a
    /// stale cookie's once the table's node failed it, not the table's own. (Before, each
    /// made the replay the trial: a second answer timeout, possibly on a hung node, then a
    /// 504 with a node UP.) With no node UP left, the pin's trial still beats an error.
    #[test]
    fn a_pin_makes_a_request_that_went_out_no_trial_of_a_down_node() {
        // A the home (UP), B DOWN and due its trial, C UP.
        let s = snap(&[up(), down_passive(0), up()]);
        for why in [RepinReason::AnswerTimeout, RepinReason::AnswerFailed] {
            let timed_out = [failed(A, why)];
            let failback = RouteInput {
                cookie: cookie_home(Pin::Node(B), Pin::Node(A)),
                failback: true,
                now_ms: 10_000,
                ..input(&timed_out)
            };
            let r = route(&s, 0, &|_| 0, &failback);
            assert_eq!((r.node, r.trial), (Some(C), false), "failback, {why:?}");
            let stale_cookie = RouteInput {
                cookie: cookie(Pin::Node(B)),
                table: table(Pin::Node(A), true),
                now_ms: 10_000,
                ..input(&timed_out)
            };
            let r = route(&s, 0, &|_| 0, &stale_cookie);
            assert_eq!(
                (r.node, r.trial),
                (Some(C), false),
                "table and cookie, {why:?}"
            );
            let table_pin = RouteInput {
                table: table(Pin::Node(B), false),
                now_ms: 10_000,
                ..input(&timed_out)
            };
            let r = route(&s, 0, &|_| 0, &table_pin);
            assert_eq!((r.node, r.trial), (Some(C), false), "table, {why:?}");
        }
        let pinned_to_b = |exclude: &[Excluded]| {
            let r = route(
                &s,
                0,
                &|_| 0,
                &RouteInput {
                    cookie: cookie(Pin::Node(B)),
                    now_ms: 10_000,
                    ..input(exclude)
                },
            );
            (r.node, r.trial)
        };
        // Nothing went out (a refused connect): the pin's trial goes first.
        let refused = [failed(A, RepinReason::ConnectFailed)];
        assert_eq!(pinned_to_b(&refused), (Some(B), true), "nothing went out");
        // No node UP left to take it: the pin's trial.
        let timed_out = [
            failed(A, RepinReason::AnswerTimeout),
            failed(C, RepinReason::AnswerTimeout),
        ];
        assert_eq!(pinned_to_b(&timed_out), (Some(B), true), "no node UP left");
    }

    #[test]
    fn a_pin_to_a_node_due_its_trial_tries_it() {
        let s = snap(&[down_passive(0), up()]);
        let r = route(
            &s,
            0,
            &|_| 0,
            &RouteInput {
                cookie: cookie(Pin::Node(A)),
                now_ms: 10_000,
                ..input(&[])
            },
        );
        assert_eq!(
            (r.node, r.outcome, r.trial),
            (Some(A), Outcome::Sticky, true)
        );
    }

    #[test]
    fn failback_goes_home_when_home_is_up_again() {
        let s = snap(&[up(), up(), up()]);
        let r = route(
            &s,
            5,
            &|_| 0,
            &RouteInput {
                cookie: cookie_home(Pin::Node(C), Pin::Node(A)),
                failback: true,
                ..input(&[])
            },
        );
        assert_eq!(
            (r.node, r.outcome, r.home),
            (Some(A), Outcome::Failback, HomeWrite::Clear)
        );
    }

    #[test]
    fn nothing_up_and_nothing_to_try_is_none() {
        let forced = {
            let mut s = down_passive(0);
            s.health.force(false);
            s
        };
        let checked = {
            let mut s = down_passive(0);
            s.policy.checked = true;
            s
        };
        let maint = NodeStatus {
            admin: AdminState::Maint,
            ..down_passive(0)
        };
        let r = route(&snap(&[forced, checked, maint]), 0, &|_| 0, &input(&[]));
        assert_eq!((r.node, r.outcome), (None, Outcome::None));
        assert_eq!(
            route(&Snapshot::default(), 0, &|_| 0, &input(&[])).node,
            None
        );
    }

    /// The trials the I/O layer may make with a connect of its own: READY nodes DOWN by their
    /// traffic whose trial is due, in pool order; none before the first is due, and none of a
    /// node checked, forced DOWN, in MAINT or draining, or whose trial is claimed.
    #[test]
    fn trials_due_are_those_of_ready_nodes_down_by_their_traffic() {
        let due_at = |s: &NodeStatus| s.health.retry_at_ms(s.policy);
        let (a, b) = (down_passive(0), down_passive(5_000));
        assert_eq!(due_at(&a), Some(10_000));
        let s = snap(&[up(), a, b]);
        assert_eq!(s.trials_due(9_999, false).count(), 0);
        assert_eq!(s.trials_due(10_000, false).collect::<Vec<_>>(), [B]);
        assert_eq!(s.trials_due(15_000, false).collect::<Vec<_>>(), [B, C]);

        let forced = {
            let mut s = down_passive(0);
            s.health.force(false);
            s
        };
        let checked = NodeStatus {
            policy: HealthPolicy {
                checked: true,
                ..a.policy
            },
            ..a
        };
        let maint = NodeStatus {
            admin: AdminState::Maint,
            ..a
        };
        let draining = NodeStatus {
            admin: AdminState::Drain {
                deadline_ms: None,
                spread_ms: 0,
            },
            ..a
        };
        let unanswered = {
            let mut s = up();
            s.policy.fall = 1;
            s.health.observe(Observation::NoAnswer, s.policy, 0);
            s
        };
        assert!(unanswered.trial_due(10_000), "an HTTP request may try it");
        let mut claimed = a;
        assert!(claimed
            .health
            .claim_trial(claimed.policy, 10_000, 1_000, false));
        let s = snap(&[forced, checked, maint, draining, claimed, unanswered]);
        assert_eq!(
            s.next_trial_ms, 11_000,
            "the unanswered node is not counted"
        );
        assert_eq!(s.trials_due(10_500, false).count(), 0);
        assert_eq!(
            s.trials_due(11_000, false).collect::<Vec<_>>(),
            [NodeId(4)],
            "a claim that lapsed"
        );
        // A trial that gets an answer (a TLS handshake) may try the unanswered node too.
        assert_eq!(s.next_answer_trial_ms, 10_000);
        assert_eq!(
            s.trials_due(10_500, true).collect::<Vec<_>>(),
            [NodeId(5)],
            "an answer may decide the unanswered node's trial"
        );
    }

    /// Several nodes due their trial (blackholed: each connect waits out its timeout): one
    /// request tries two of them at most, then goes to the node UP. Before, it tried every
    /// one in turn, a connect timeout each.
    #[test]
    fn one_request_tries_two_nodes_due_their_trial_at_most() {
        let s = snap(&[
            down_passive(0),
            down_passive(0),
            down_passive(0),
            down_passive(0),
            up(),
        ]);
        let mut refused = Vec::new();
        let up_node = NodeId(4);
        loop {
            let r = route(
                &s,
                0,
                &|_| 0,
                &RouteInput {
                    now_ms: 10_000,
                    ..input(&refused)
                },
            );
            let node = r.node.expect("routed");
            if node == up_node {
                assert!(!r.trial);
                break;
            }
            assert!(r.trial, "{node:?} is a trial");
            refused.push(Excluded {
                node,
                why: RepinReason::ConnectFailed,
            });
            assert!(refused.len() <= 4, "a loop");
        }
        assert_eq!(
            refused.len(),
            2,
            "two trials, then the node UP: {refused:?}"
        );
        // With nothing UP, two trials then none.
        let s = snap(&[down_passive(0), down_passive(0), down_passive(0)]);
        let two = [
            Excluded {
                node: A,
                why: RepinReason::ConnectFailed,
            },
            Excluded {
                node: B,
                why: RepinReason::ConnectFailed,
            },
        ];
        let r = route(
            &s,
            0,
            &|_| 0,
            &RouteInput {
                now_ms: 10_000,
                ..input(&two)
            },
        );
        assert_eq!(r.node, None);
    }

    /// Every node DOWN by its traffic alone, none due its trial: the one whose trial comes
    /// soonest is tried now (early), not the client answered 503 for the rest of its
    /// `fail_timeout`; one refused for this request is passed over; while a trial is in
    /// flight, the node is not tried again. An UP node is always preferred.
    #[test]
    fn nothing_up_tries_the_node_whose_trial_comes_soonest_early() {
        let (a, b) = (down_passive(2_000), down_passive(1_000));
        let r = route(&snap(&[a, b]), 0, &|_| 0, &input(&[]));
        assert_eq!(
            (r.node, r.trial, r.trial_early, r.took_turn),
            (Some(B), true, true, false)
        );
        let refused = [Excluded {
            node: B,
            why: RepinReason::ConnectFailed,
        }];
        let r = route(&snap(&[a, b]), 0, &|_| 0, &input(&refused));
        assert_eq!((r.node, r.trial_early), (Some(A), true));

        let mut tried = b;
        assert!(tried.health.claim_trial(tried.policy, 3_000, 1_000, true));
        let r = route(&snap(&[a, tried]), 0, &|_| 0, &input(&[]));
        assert_eq!(r.node, Some(A), "B's trial is in flight");

        let r = route(&snap(&[a, b, up()]), 0, &|_| 0, &input(&[]));
        assert_eq!((r.node, r.trial), (Some(C), false));
    }

    /// The session's own node is tried early before the others (a fleet that blinked
    /// together keeps its sessions home), by its cookie or its table entry.
    #[test]
    fn an_early_trial_goes_to_the_session_s_own_node_first() {
        let (a, b) = (down_passive(2_000), down_passive(1_000));
        let s = snap(&[a, b]);
        let by_cookie = RouteInput {
            cookie: cookie(Pin::Node(A)),
            ..input(&[])
        };
        let r = route(&s, 0, &|_| 0, &by_cookie);
        assert_eq!((r.node, r.trial_early), (Some(A), true));
        let by_table = RouteInput {
            table: table(Pin::Node(A), true),
            ..input(&[])
        };
        let r = route(&s, 0, &|_| 0, &by_table);
        assert_eq!((r.node, r.trial_early, r.table), (Some(A), true, Some(A)));
    }

    /// No early trial once the request was sent somewhere and not answered (it ends with
    /// that error, not replayed onto a node known to be DOWN), and at most two DOWN nodes
    /// tried early per request.
    #[test]
    fn early_trials_stop_after_a_sent_request_or_two_down_nodes() {
        let s = snap(&[down_passive(0), down_passive(0), down_passive(0), up()]);
        let timed_out = [Excluded {
            node: NodeId(3),
            why: RepinReason::AnswerTimeout,
        }];
        assert_eq!(route(&s, 0, &|_| 0, &input(&timed_out)).node, None);
        let refused_up = [Excluded {
            node: NodeId(3),
            why: RepinReason::ConnectFailed,
        }];
        assert_eq!(route(&s, 0, &|_| 0, &input(&refused_up)).node, Some(A));
        let refused = |n: NodeId| Excluded {
            node: n,
            why: RepinReason::ConnectFailed,
        };
        let one_down = [refused(NodeId(3)), refused(A)];
        assert_eq!(route(&s, 0, &|_| 0, &input(&one_down)).node, Some(B));
        let two_down = [refused(NodeId(3)), refused(A), refused(B)];
        assert_eq!(route(&s, 0, &|_| 0, &input(&two_down)).node, None);
    }

    /// leastconn deals nodes tied on the fewest connections evenly, whatever their place in
    /// pool order next to a busy node (the first tied node after a rotating start gave the
    /// node after a busy one twice the others' share), and with every node tied it is plain
    /// round-robin.
    #[test]
    fn least_conn_deals_its_ties_evenly() {
        let s = snap(&[up(), up(), up()]);
        let lc = RouteInput {
            balance: Balance::LeastConn,
            ..input(&[])
        };
        let shares = |active: &dyn Fn(NodeId) -> u32| {
            let mut share = [0u32; 3];
            for turn in 0..600 {
                let r = route(&s, turn, active, &lc);
                share[r.node.map_or(0, NodeId::index)] += 1;
            }
            share
        };
        assert_eq!(shares(&|_| 0), [200, 200, 200], "all tied: round-robin");
        let [a, b, c] = shares(&|n| if n == A { 5 } else { 0 });
        assert_eq!(a, 0);
        assert!(
            (270..=330).contains(&b) && (270..=330).contains(&c),
            "{b} {c}"
        );
        let r = route(&s, 7, &|n| if n == B { 0 } else { 2 }, &lc);
        assert_eq!(r.node, Some(B), "the least loaded wins outright");
    }

    #[test]
    fn spread_keys_of_a_table_key_ignore_the_client() {
        assert_eq!(
            spread_key(Some(b"k1"), b"\x7f\0\0\x01", None),
            spread_key(Some(b"k1"), b"\x7f\0\0\x02", Some(5))
        );
        assert_ne!(
            spread_key(None, b"\x7f\0\0\x01", None),
            spread_key(None, b"\x7f\0\0\x02", None)
        );
    }

    #[test]
    fn a_request_may_move_only_to_a_node_that_takes_it_and_has_not_failed_it() {
        let up = NodeStatus::default();
        let mut down = NodeStatus::default();
        down.health.force(false);
        let snap = Snapshot::new([(1, up), (1, up), (1, down)]);
        let (a, b) = (NodeId(0), NodeId(1));
        assert!(snap.takes_elsewhere(a, &[]));
        assert!(!snap.takes_elsewhere(a, &[failed(b, RepinReason::AnswerTimeout)]));
        assert!(!snap.takes_elsewhere(b, &[failed(a, RepinReason::ConnectFailed)]));
        // The third node is DOWN: not a place to go.
        let lone = Snapshot::new([(1, up), (1, down)]);
        assert!(!lone.takes_elsewhere(a, &[]));
        assert!(lone.takes_elsewhere(b, &[]));
    }
}
