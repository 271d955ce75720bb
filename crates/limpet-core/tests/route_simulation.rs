//! Seeded simulation of [`route`] with an HTTP listener and a TCP listener sharing one
//! source-IP affinity table: one client is never on two nodes at once, and every route
//! matches a plain model written from the rules in `route.rs`'s module docs.
//!
//! Each seed builds a pool of 3 to 5 nodes (weight 1) whose health is judged by traffic
//! alone (no active checks, `fall` 1 or 2, a `fail_timeout` of 0.1 to 3 s), one
//! [`AffinityTable`] keyed by source IP, and 8 clients. Each node has a backend that is alive
//! or dead. A client has a cookie jar (the affinity cookie and, with `failback = "home"`, the
//! home cookie) and at most one open TCP session. Random actions run on a virtual clock that
//! moves forward by random steps:
//!
//! - an HTTP request (cookie affinity, `failback` chosen per seed, the table written);
//! - a TCP connect (no cookie, the table written), replacing the client's previous session;
//! - a TCP close, a lost cookie jar, a forged cookie;
//! - a node set MAINT, READY, DRAIN (deadline now + random or none, random spread), forced
//!   DOWN or UP;
//! - a node's backend dies (its open TCP sessions are reset) or comes back;
//! - an HTTP request or TCP connect whose first connect(s) are refused although the backend
//!   is alive (a transient refusal).
//!
//! Every connect goes as the I/O layer makes it: the route's table write is made first; a
//! route with `trial` claims the node's trial ([`Pool::claim_trial`]); a connect to a dead
//! backend, or a transiently refused one, is observed as [`Observation::TrafficFailed`] and
//! the request is routed again with the node in `exclude`; a completed connect is observed as
//! [`Observation::TrafficOk`]. Nodes therefore go DOWN by traffic (`fall` failures in a row),
//! become due a trial `fail_timeout` later, and come back UP when a trial reaches a live
//! backend.
//!
//! After every action each open session whose node says [`SessionEnd::Now`]
//! (`close_on_down = true`) is closed, as the I/O layer does, and then:
//!
//! 1. **Model.** Every route (applied, and the side-effect-free check below) equals the
//!    model's: node, outcome, cookie write, home write, table write, connection pin, trial,
//!    turn taken. The model keeps its own node states (health included: failure streak, DOWN,
//!    next trial time, forced DOWN), checked against the pool's after every action, and its
//!    own round-robin counter `k`; every trial claim is checked against it; the table is
//!    checked against a plain map; `session_end` against the model's "MAINT, DOWN, or past
//!    the key's drain end".
//! 2. **No split.** For each client with an open TCP session on node X, the route its next
//!    HTTP request would take (computed with the pure [`route`] over the pool's snapshot, so
//!    no turn is consumed) is X and the table's entry is X.
//!
//! ## Exempted splits
//!
//! An open TCP session stays on its node until that node's state ends it (MAINT, DOWN, or
//! the key's drain end): nothing else moves it. So whatever moves the client's HTTP side
//! while the session's node stays usable splits the client. Two such moves are documented
//! behaviour. Each is recognised narrowly at the moment the split first appears, counted,
//! and then tolerated for the rest of that TCP session (once the HTTP side has left X,
//! later HTTP routes are independent of the session, so a split that began for an explained
//! reason may change shape until the session ends). Anything else fails.
//! `LIMPET_STRICT_SPLIT=1` fails on these too.
//!
//! - `Failback`: `failback = "home"` sends the client's HTTP requests back to its home node
//!   as soon as home is UP, while its TCP session stays on the node it moved to (nothing
//!   ends a session because another node came back). The check route's outcome is
//!   `Failback`. This is the intended behaviour of failback; it cannot hold with it.
//! - `ConnectFailed`: one of the client's HTTP connects to X, the node of its open TCP
//!   session, was refused (transiently: X's backend is alive) and X stays UP (with
//!   `fall = 2` one refused connect is not a health verdict; with `fall = 1` X goes DOWN and
//!   the session ends). The request and the table, written before each connect, moved to
//!   another node Y; if every connect was refused the request got a 503 and the table was
//!   left on the last node tried, which served nothing. Either way the table no longer names
//!   X, and while Y takes pins the client's next HTTP request goes to Y (rule 2) while its
//!   TCP session stays on X. The split appears right after the refused connect; the stats
//!   count the 503 case apart (`ConnectFailed then 503`).
//!
//! What used to be a third exemption, the stale cookie, now fails the test: a TCP connect
//! that moves the shared table from X to Y (say while X was MAINT) leaves the cookie naming
//! X, and once X takes pins again rule 2 (a writing table's entry over a disagreeing cookie)
//! sends HTTP to Y and rewrites the cookie, where the cookie used to win. The same holds
//! after a TCP connect that failed over, and after an HTTP request that ended in a 503 with
//! no TCP session open: whatever the table says, HTTP and TCP both follow it.
//!
//! Replay a seed with `LIMPET_SEED=<seed> cargo test -p limpet-core --test route_simulation
//! -- --nocapture`; `LIMPET_SIM_SEEDS=<n>` runs more seeds (default 300).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use limpet_core::table::{
    AffinityTable, IpPrefix, KeySpec, LruTable, TableConfig, TableKey, MAX_EXPIRE_MS,
};
use limpet_core::{
    route, spread_key, AdminState, Balance, ConnPinWrite, CookieIn, CookieWrite, Excluded,
    HealthPolicy, HomeWrite, NodeId, Observation, Outcome, Pin, Pool, RepinReason, Route,
    RouteInput, SessionEnd, TableIn, Transition,
};

const T0: u64 = 1_700_000_000_000;
const CLIENTS: usize = 8;
const STEPS: usize = 500;
/// How long a trial claim holds (the connect timeout).
const TRIAL_HOLD_MS: u64 = 1_000;

/// xorshift64*: tiny, deterministic, good enough to pick actions.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        // Mix the seed so that small seeds do not start in a weak state.
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Rng((z ^ (z >> 31)) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

// ---------------------------------------------------------------------------------------
// The model: the module docs of route.rs, node.rs and health.rs, written out plainly.
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Admin {
    Ready,
    Drain { deadline: Option<u64>, spread: u64 },
    Maint,
}

#[derive(Debug, Clone, Copy)]
struct ModelNode {
    admin: Admin,
    up: bool,
    /// Traffic failures in a row while UP.
    streak: u32,
    /// While DOWN: when the next trial may start; `None` for a forced DOWN (never tried).
    retry_at: Option<u64>,
    /// While DOWN: a trial was claimed since it went DOWN or last failed (only then does a
    /// success bring it back).
    trying: bool,
    /// While DOWN: the last claimed trial holds until then (a refused connect frees it).
    claimed_until: u64,
}

#[derive(Debug)]
struct Model {
    nodes: Vec<ModelNode>,
    /// Fresh assignments made so far: the next one goes to `up[k mod len(up)]`.
    k: u64,
    fall: u32,
    fail_timeout: u64,
}

/// What a request or connection presents, as the model reads it.
struct Ask<'a> {
    /// `(cookie pin, home pin)` for the cookie listener; `None` for TCP.
    cookie: Option<(Pin, Pin)>,
    failback: bool,
    table: Pin,
    /// Whether routing writes the table (a shared source-IP table: always, here).
    table_writes: bool,
    key: u64,
    exclude: &'a [NodeId],
    now: u64,
}

/// What the rules say a route does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Expect {
    node: Option<NodeId>,
    outcome: Outcome,
    cookie: CookieWrite,
    home: HomeWrite,
    table: Option<NodeId>,
    conn_pin: ConnPinWrite,
    trial: bool,
    trial_early: bool,
    took_turn: bool,
}

impl Expect {
    fn of(r: &Route) -> Expect {
        Expect {
            node: r.node,
            outcome: r.outcome,
            cookie: r.cookie,
            home: r.home,
            table: r.table,
            conn_pin: r.conn_pin,
            trial: r.trial,
            trial_early: r.trial_early,
            took_turn: r.took_turn,
        }
    }

    fn none() -> Expect {
        Expect {
            node: None,
            outcome: Outcome::None,
            cookie: CookieWrite::None,
            home: HomeWrite::Keep,
            table: None,
            conn_pin: ConnPinWrite::Keep,
            trial: false,
            trial_early: false,
            took_turn: false,
        }
    }
}

/// The rule of the precedence that decided (rule 4, the connection's earlier choice, never
/// applies: the simulation has no keep-alive connections).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Rule {
    /// 1.
    Failback,
    /// 2.
    TableOverCookie,
    /// 3.
    Cookie,
    /// 5.
    Table,
    /// 6.
    Fresh,
    /// No node.
    Nothing,
}

const SET: CookieWrite = CookieWrite::Set { issued_ms: None };

impl Model {
    fn node(&self, n: NodeId) -> ModelNode {
        self.nodes[n.index()]
    }

    /// A drain with a deadline re-pins the session with key `key` at
    /// `deadline + spread * (key >> 32) / 2^32`.
    fn drain_over(&self, n: NodeId, key: u64, now: u64) -> bool {
        match self.node(n).admin {
            Admin::Drain {
                deadline: Some(d),
                spread,
            } => {
                let offset = (u128::from(spread) * u128::from(key >> 32)) / (1u128 << 32);
                now >= d + offset as u64
            }
            _ => false,
        }
    }

    /// DOWN, not forced, its `fail_timeout` (or the hold of a claimed trial) has passed, and
    /// no trial in flight (one at a time).
    fn trial_due(&self, n: NodeId, now: u64) -> bool {
        let node = self.node(n);
        !node.up
            && node.retry_at.is_some_and(|t| now >= t)
            && !(node.trying && now < node.claimed_until)
    }

    /// Whether a pin to `n` is honoured: not refused for this request, not MAINT, not DOWN
    /// (unless due its trial and not past the key's drain end: `Ok(true)`, try it), not past
    /// the key's drain end.
    fn honours(&self, n: NodeId, a: &Ask<'_>) -> Result<bool, RepinReason> {
        if a.exclude.contains(&n) {
            return Err(RepinReason::ConnectFailed);
        }
        let node = self.node(n);
        if node.admin == Admin::Maint {
            return Err(RepinReason::NodeMaint);
        }
        if !node.up {
            if !self.drain_over(n, a.key, a.now) && self.trial_due(n, a.now) {
                return Ok(true);
            }
            return Err(RepinReason::NodeDown);
        }
        if self.drain_over(n, a.key, a.now) {
            return Err(RepinReason::DrainEnded);
        }
        Ok(false)
    }

    /// `Ok(Some((node, trial)))`: the pin names a node that honours it.
    fn pin(&self, pin: Pin, a: &Ask<'_>) -> Result<Option<(NodeId, bool)>, RepinReason> {
        match pin {
            Pin::None => Ok(None),
            Pin::Node(n) => self.honours(n, a).map(|trial| Some((n, trial))),
            Pin::Unknown => Err(RepinReason::UnknownNode),
            Pin::Invalid => Err(RepinReason::InvalidCookie),
            Pin::Expired => Err(RepinReason::ExpiredCookie),
        }
    }

    /// UP and READY: the nodes that take fresh assignments, in pool order.
    fn up(&self) -> Vec<NodeId> {
        (0..self.nodes.len())
            .map(|i| NodeId(i as u32))
            .filter(|&n| self.node(n).up && self.node(n).admin == Admin::Ready)
            .collect()
    }

    /// The home cookie: a session re-pinned away from its cookie's node because of that
    /// node (DOWN, MAINT, drain ended, connect failed) remembers the node as home, unless it
    /// already has one.
    fn home(&self, a: &Ask<'_>, reason: Option<RepinReason>, to: NodeId) -> HomeWrite {
        let Some((pin, home)) = a.cookie.filter(|_| a.failback) else {
            return HomeWrite::Keep;
        };
        let node_fault = matches!(
            reason,
            Some(
                RepinReason::NodeDown
                    | RepinReason::NodeMaint
                    | RepinReason::DrainEnded
                    | RepinReason::ConnectFailed
            )
        );
        match (pin, home) {
            (_, Pin::Node(_)) => HomeWrite::Keep,
            (Pin::Node(was), _) if node_fault && was != to => HomeWrite::Set(was),
            _ => HomeWrite::Keep,
        }
    }

    fn route(&self, a: &Ask<'_>) -> (Expect, Rule) {
        let has_cookie = a.cookie.is_some();
        let learn = |n: NodeId| a.table_writes.then_some(n);
        let mut cookie_reason = None;
        if let Some((pin, home)) = a.cookie {
            // 1. Failback: home is UP again (and READY) and the session is elsewhere.
            if let (true, Pin::Node(h)) = (a.failback, home) {
                if !a.exclude.contains(&h) && self.up().contains(&h) && pin != Pin::Node(h) {
                    let e = Expect {
                        node: Some(h),
                        outcome: Outcome::Failback,
                        cookie: SET,
                        home: HomeWrite::Clear,
                        table: learn(h),
                        conn_pin: ConnPinWrite::Set(h),
                        trial: false,
                        took_turn: false,
                        trial_early: false,
                    };
                    return (e, Rule::Failback);
                }
            }
            // 2. A table the listener writes names a node that honours it (or is due its
            //    trial), and the cookie says something else: the table wins, the cookie is
            //    rewritten.
            if a.table_writes && pin != a.table {
                if let Ok(Some((n, trial))) = self.pin(a.table, a) {
                    // The cookie's own verdict still names the re-pin (and the home).
                    let why = self.pin(pin, a).err();
                    let e = Expect {
                        node: Some(n),
                        outcome: why.map_or(Outcome::TableHit, Outcome::Repin),
                        cookie: SET,
                        home: self.home(a, why, n),
                        table: None,
                        conn_pin: ConnPinWrite::Set(n),
                        trial,
                        took_turn: false,
                        trial_early: false,
                    };
                    return (e, Rule::TableOverCookie);
                }
            }
            // 3. The cookie names a node that honours it.
            match self.pin(pin, a) {
                Ok(Some((n, trial))) => {
                    let e = Expect {
                        node: Some(n),
                        outcome: Outcome::Sticky,
                        cookie: CookieWrite::None,
                        home: HomeWrite::Keep,
                        table: learn(n),
                        // No connection pin in this model (no keep-alive): none to clear.
                        conn_pin: ConnPinWrite::Keep,
                        trial,
                        took_turn: false,
                        trial_early: false,
                    };
                    return (e, Rule::Cookie);
                }
                Ok(None) => {}
                Err(r) => cookie_reason = Some(r),
            }
            // 4. This connection's earlier choice: never, no keep-alive here.
        }
        // 5. The table's entry names a node that honours it.
        let mut table_reason = None;
        match self.pin(a.table, a) {
            Ok(Some((n, trial))) => {
                let e = Expect {
                    node: Some(n),
                    outcome: cookie_reason.map_or(Outcome::TableHit, Outcome::Repin),
                    cookie: if has_cookie { SET } else { CookieWrite::None },
                    home: self.home(a, cookie_reason, n),
                    table: None,
                    conn_pin: if has_cookie {
                        ConnPinWrite::Set(n)
                    } else {
                        ConnPinWrite::Keep
                    },
                    trial,
                    took_turn: false,
                    trial_early: false,
                };
                return (e, Rule::Table);
            }
            Ok(None) => {}
            Err(r) => table_reason = Some(r),
        }
        // 6. Fresh: the first READY node (pool order) DOWN and due its trial, else
        //    up[k mod len(up)]; nodes refused for this request skipped either way. At most
        //    two DOWN nodes tried per request, due or early (every refusal here is a connect
        //    that sent nothing).
        let nodes = (0..self.nodes.len()).map(|i| NodeId(i as u32));
        let tried_down = a
            .exclude
            .iter()
            .filter(|&&n| !(self.node(n).up && self.node(n).admin == Admin::Ready))
            .count();
        let due = nodes.clone().find(|&n| {
            tried_down < 2
                && self.node(n).admin == Admin::Ready
                && self.trial_due(n, a.now)
                && !a.exclude.contains(&n)
        });
        let up = self.up();
        let start = if up.is_empty() {
            0
        } else {
            (self.k % up.len() as u64) as usize
        };
        let rotation = (0..up.len())
            .map(|i| up[(start + i) % up.len()])
            .find(|n| !a.exclude.contains(n));
        // ... and when neither: a READY node DOWN by traffic (not forced) with no trial in
        // flight, tried early: the session's own (cookie, then table), else the one whose
        // trial comes soonest (pool order among equals).
        let may = |n: NodeId| {
            self.node(n).admin == Admin::Ready
                && self.early_possible(n, a.now)
                && !a.exclude.contains(&n)
        };
        let early = || {
            if tried_down >= 2 {
                return None;
            }
            let pinned = [a.cookie.map(|(p, _)| p), Some(a.table)];
            if let Some(n) = pinned.into_iter().find_map(|p| match p {
                Some(Pin::Node(n)) if may(n) => Some(n),
                _ => None,
            }) {
                return Some(n);
            }
            nodes
                .clone()
                .filter(|&n| may(n))
                .min_by_key(|&n| self.node(n).retry_at)
        };
        let (n, trial, trial_early) = match (due, rotation) {
            (Some(n), _) => (n, true, false),
            (None, Some(n)) => (n, false, false),
            (None, None) => match early() {
                Some(n) => (n, true, true),
                None => return (Expect::none(), Rule::Nothing),
            },
        };
        let reason = cookie_reason.or(table_reason);
        let e = Expect {
            node: Some(n),
            outcome: reason.map_or(Outcome::Fresh, Outcome::Repin),
            cookie: if has_cookie { SET } else { CookieWrite::None },
            home: self.home(a, cookie_reason, n),
            table: learn(n),
            conn_pin: if has_cookie {
                ConnPinWrite::Set(n)
            } else {
                ConnPinWrite::Keep
            },
            trial,
            trial_early,
            took_turn: !trial,
        };
        (e, Rule::Fresh)
    }

    /// A long-lived session ends when its node is MAINT, DOWN (`close_on_down`), or past
    /// its key's drain end.
    fn session_ends(&self, n: NodeId, key: u64, now: u64) -> bool {
        let node = self.node(n);
        node.admin == Admin::Maint || !node.up || self.drain_over(n, key, now)
    }

    /// Health without checks. A traffic success resets the streak, or brings a DOWN node
    /// (not forced) whose trial was claimed back UP, on probation (its streak at
    /// `fall - 1`); a failure counts toward `fall` while UP and takes the node DOWN at
    /// `fall`, with its first trial `fail_timeout` later; while DOWN (not forced) it starts
    /// that wait again and ends the trial. Returns the new state when it flipped.
    fn observe(&mut self, n: NodeId, ok: bool, now: u64) -> Option<bool> {
        let (fall, wait) = (self.fall, self.fail_timeout);
        let node = &mut self.nodes[n.index()];
        match (node.up, ok) {
            (true, true) => {
                node.streak = 0;
                None
            }
            (true, false) => {
                node.streak += 1;
                if node.streak < fall {
                    return None;
                }
                node.up = false;
                node.streak = 0;
                node.retry_at = Some(now + wait);
                node.trying = false;
                node.claimed_until = 0;
                Some(false)
            }
            (false, true) => {
                node.retry_at?;
                if !node.trying {
                    return None;
                }
                node.up = true;
                node.streak = fall.max(1) - 1;
                node.retry_at = None;
                node.trying = false;
                node.claimed_until = 0;
                // Back from a trial: every other node DOWN by traffic with no trial in
                // flight is due its trial now.
                for other in &mut self.nodes {
                    if !other.up && now >= other.claimed_until {
                        if let Some(t) = other.retry_at.as_mut() {
                            *t = (*t).min(now);
                        }
                    }
                }
                Some(true)
            }
            (false, false) => {
                // Every failure here is a refused connect: it frees the claim too.
                if let Some(t) = node.retry_at.as_mut() {
                    *t = now + wait;
                    node.trying = false;
                    node.claimed_until = 0;
                }
                None
            }
        }
    }

    /// DOWN by traffic (not forced), and no trial in flight (its claim's hold has passed, or
    /// a refused connect freed it): may be tried before its `fail_timeout` when no other
    /// node can be.
    fn early_possible(&self, n: NodeId, now: u64) -> bool {
        let node = self.node(n);
        !node.up && node.retry_at.is_some() && now >= node.claimed_until
    }

    /// The trial of a node due one (or, `early`, one that may be tried early) goes to the one
    /// caller that claims it, and nobody else tries until the claim's hold has passed (or its
    /// outcome is observed).
    fn claim(&mut self, n: NodeId, now: u64, early: bool) -> bool {
        if !(self.trial_due(n, now) || (early && self.early_possible(n, now))) {
            return false;
        }
        let node = &mut self.nodes[n.index()];
        node.retry_at = Some(now + TRIAL_HOLD_MS);
        node.claimed_until = now + TRIAL_HOLD_MS;
        node.trying = true;
        true
    }

    /// The operator's UP or DOWN: a forced DOWN is never tried.
    fn force(&mut self, n: NodeId, up: bool) {
        let node = &mut self.nodes[n.index()];
        node.up = up;
        node.streak = 0;
        node.retry_at = None;
        node.trying = false;
        node.claimed_until = 0;
    }
}

// ---------------------------------------------------------------------------------------
// The simulation.
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Split {
    Failback,
    ConnectFailed,
}

#[derive(Debug)]
struct Session {
    node: NodeId,
    /// Set when the client first split for an exempted reason (see the module docs).
    split: Option<Split>,
}

#[derive(Debug)]
struct Client {
    ip: IpAddr,
    key: TableKey,
    spread: u64,
    /// The affinity cookie's value (a node name, or a forged one).
    cookie: Option<String>,
    /// The home cookie's value.
    home: Option<String>,
    tcp: Option<Session>,
}

#[derive(Debug, Default)]
struct Stats {
    /// Requests and connects by how they ended.
    served: BTreeMap<&'static str, u64>,
    outcomes: BTreeMap<&'static str, u64>,
    repins: BTreeMap<&'static str, u64>,
    /// Committed routes by the rule that decided (", trial": the route was a trial).
    rules: BTreeMap<String, u64>,
    /// Rule 2 with a cookie naming another node: the case that used to split.
    stale_cookies_overridden: u64,
    closed: BTreeMap<&'static str, u64>,
    /// Health flips seen by traffic.
    went_down: u64,
    trials_ok: u64,
    trials_refused: u64,
    splits: BTreeMap<String, u64>,
    exempt_checks: u64,
    agreeing_checks: u64,
    model_checks: u64,
}

struct Sim<'s> {
    rng: Rng,
    pool: Pool,
    policy: HealthPolicy,
    model: Model,
    /// Whether each node's backend accepts connections.
    alive: Vec<bool>,
    table: AffinityTable<LruTable>,
    /// The table as a plain list: each client's entry.
    shadow_table: Vec<Option<NodeId>>,
    clients: Vec<Client>,
    failback: bool,
    strict: bool,
    now: u64,
    /// The HTTP connects refused in the last action: `(client, node)`.
    refused: Vec<(usize, NodeId)>,
    /// Whether the last action was an HTTP request that got a 503.
    unanswered: bool,
    trace: Vec<String>,
    stats: &'s mut Stats,
}

impl Sim<'_> {
    fn new(seed: u64, strict: bool, stats: &mut Stats) -> Result<Sim<'_>, String> {
        let mut rng = Rng::new(seed);
        let n = 3 + rng.below(3) as usize;
        let names: Vec<String> = (0..n).map(|i| format!("n{i}")).collect();
        let policy = HealthPolicy {
            fall: 1 + rng.below(2) as u32,
            fail_timeout_ms: 100 + rng.below(2_900),
            checked: false,
            ..HealthPolicy::default()
        };
        let pool = Pool::new(names.clone())
            .map_err(|e| e.to_string())?
            .with_health_policy(policy);
        let store = LruTable::new(
            TableConfig::new(16, MAX_EXPIRE_MS).with_hash_seed([rng.next(), rng.next()]),
        )
        .map_err(|e| e.to_string())?;
        let table = AffinityTable::new(store, &pool);
        let spec = KeySpec::SourceIp(IpPrefix::HOST);
        let mut clients: Vec<Client> = Vec::new();
        while clients.len() < CLIENTS {
            let ip = IpAddr::V4(Ipv4Addr::from(
                0x0a00_0000 | (rng.next() as u32 & 0x00ff_ffff),
            ));
            if clients.iter().any(|c| c.ip == ip) {
                continue;
            }
            let key = spec
                .request_key(ip, std::iter::empty::<&[u8]>())
                .ok_or("source-ip keys always exist")?;
            // The table key of a source-ip table is the client address: its bytes are the
            // spread key's input on both listeners.
            let key_bytes = match key.ip_addr() {
                Some(IpAddr::V4(a)) => a.octets().to_vec(),
                Some(IpAddr::V6(a)) => a.octets().to_vec(),
                None => return Err("a source-ip key has an address".into()),
            };
            let client_bytes = match ip {
                IpAddr::V4(a) => a.octets().to_vec(),
                IpAddr::V6(a) => a.octets().to_vec(),
            };
            clients.push(Client {
                ip,
                key: key.to_key(),
                spread: spread_key(Some(&key_bytes), &client_bytes, None),
                cookie: None,
                home: None,
                tcp: None,
            });
        }
        let failback = rng.chance(50);
        Ok(Sim {
            rng,
            pool,
            policy,
            model: Model {
                nodes: vec![
                    ModelNode {
                        admin: Admin::Ready,
                        up: true,
                        streak: 0,
                        retry_at: None,
                        trying: false,
                        claimed_until: 0,
                    };
                    n
                ],
                k: 0,
                fall: policy.fall,
                fail_timeout: policy.fail_timeout_ms,
            },
            alive: vec![true; n],
            table,
            shadow_table: vec![None; CLIENTS],
            clients,
            failback,
            strict,
            now: T0,
            refused: Vec::new(),
            unanswered: false,
            trace: Vec::new(),
            stats,
        })
    }

    fn log(&mut self, what: String) {
        self.trace.push(format!("t+{} {what}", self.now - T0));
    }

    fn name(&self, n: Option<NodeId>) -> String {
        n.map_or_else(|| "-".to_owned(), |n| self.pool.name(n).to_owned())
    }

    fn lookup(&mut self, c: usize) -> Result<Pin, String> {
        let got = self
            .table
            .lookup(self.clients[c].key.as_key_ref(), self.now);
        let want = self.shadow_table[c].map_or(Pin::None, Pin::Node);
        if got != want {
            return Err(format!(
                "client {c}: table lookup {got:?}, plain map {want:?}"
            ));
        }
        Ok(got)
    }

    /// Routes client `c` on the HTTP listener (`http`) or the TCP one, and checks the route
    /// against the model. `commit`: through the pool (a turn taken advances the rotation);
    /// otherwise the pure function over the pool's snapshot, nothing consumed. The table is
    /// looked up (and compared with the plain map) for every committed route and every
    /// client with a TCP session; the other checks read the map, because the table's own
    /// debug checks make a lookup slow in debug builds.
    fn route(
        &mut self,
        c: usize,
        http: bool,
        exclude: &[NodeId],
        commit: bool,
    ) -> Result<Route, String> {
        let table_pin = if commit || self.clients[c].tcp.is_some() {
            self.lookup(c)?
        } else {
            self.shadow_table[c].map_or(Pin::None, Pin::Node)
        };
        let client = &self.clients[c];
        let pin = self
            .pool
            .pin_by_name(client.cookie.as_deref().map(str::as_bytes));
        let home = if self.failback {
            self.pool
                .pin_by_name(client.home.as_deref().map(str::as_bytes))
        } else {
            Pin::None
        };
        // The simulation's only node failure for a request is a refused connect.
        let excluded: Vec<Excluded> = exclude
            .iter()
            .map(|&node| Excluded {
                node,
                why: RepinReason::ConnectFailed,
            })
            .collect();
        let input = RouteInput {
            cookie: http.then_some(CookieIn {
                pin,
                issued_ms: None,
                refresh: false,
                home,
            }),
            failback: http && self.failback,
            conn_pin: None,
            table: Some(TableIn {
                pin: table_pin,
                writes: true,
            }),
            spread_key: client.spread,
            balance: Balance::RoundRobin,
            exclude: &excluded,
            now_ms: self.now,
        };
        let ask = Ask {
            cookie: http.then_some((pin, home)),
            failback: http && self.failback,
            table: table_pin,
            table_writes: true,
            key: client.spread,
            exclude,
            now: self.now,
        };
        let got = if commit {
            self.pool.route(&input, &|_| 0)
        } else {
            route(self.pool.snapshot(), self.pool.rotation(), &|_| 0, &input)
        };
        let (want, rule) = self.model.route(&ask);
        self.stats.model_checks += 1;
        if Expect::of(&got) != want {
            return Err(format!(
                "client {c} {} (cookie {pin:?}, home {home:?}, table {table_pin:?}, \
                 exclude {exclude:?}, commit {commit}):\n  route {got:?}\n  model {want:?} \
                 ({rule:?})",
                if http { "HTTP" } else { "TCP" },
            ));
        }
        if commit {
            if want.took_turn {
                self.model.k += 1;
            }
            *self.stats.outcomes.entry(got.outcome.as_str()).or_default() += 1;
            if let Outcome::Repin(r) = got.outcome {
                *self.stats.repins.entry(r.as_str()).or_default() += 1;
            }
            let trial = if got.trial { ", trial" } else { "" };
            *self
                .stats
                .rules
                .entry(format!("{rule:?}{trial}"))
                .or_default() += 1;
            if rule == Rule::TableOverCookie && matches!(pin, Pin::Node(_)) {
                self.stats.stale_cookies_overridden += 1;
            }
        }
        Ok(got)
    }

    /// The table write of a route, made before connecting.
    fn learn(&mut self, c: usize, r: &Route) -> Result<(), String> {
        if let Some(n) = r.table {
            self.table
                .learn(self.clients[c].key.as_key_ref(), n, self.now)
                .ok_or("learned a node of another pool")?;
            self.shadow_table[c] = Some(n);
        }
        Ok(())
    }

    /// Connects to `n` as the I/O layer does: claims the node's trial first if the route is
    /// one, then the connect completes unless `refuse` or the backend is dead, and its outcome
    /// is observed. Returns whether the connection is open.
    fn connect(&mut self, n: NodeId, r: &Route, refuse: bool) -> Result<bool, String> {
        if r.trial {
            let got = self
                .pool
                .claim_trial(n, self.now, TRIAL_HOLD_MS, r.trial_early);
            let want = self.model.claim(n, self.now, r.trial_early);
            if got != want {
                return Err(format!(
                    "claim of {}'s trial: {got}, model {want}",
                    self.name(Some(n))
                ));
            }
            if !got {
                // Someone else holds it: routed again without the node, nothing observed.
                self.log(format!("trial of {} taken", self.name(Some(n))));
                return Ok(false);
            }
        }
        let claim = self.pool.trial_claim(n).unwrap_or_default();
        let ok = !refuse && self.alive[n.index()];
        let obs = if ok {
            Observation::TrafficOk
        } else {
            Observation::TrafficFailed
        };
        let got = self.pool.observe(n, obs, self.now);
        let want = self.model.observe(n, ok, self.now);
        if got.map(|t| t == Transition::WentUp) != want {
            return Err(format!(
                "{obs:?} on {}: transition {got:?}, model {want:?}",
                self.name(Some(n))
            ));
        }
        if r.trial {
            // Its outcome observed, the trial's claim is given back, as the I/O layer's
            // claim is dropped with the attempt.
            self.pool.give_back_trial(n, claim, self.now);
            if ok {
                self.stats.trials_ok += 1;
            } else {
                self.stats.trials_refused += 1;
            }
        }
        if got == Some(Transition::WentDown) {
            self.stats.went_down += 1;
        }
        if let Some(t) = got {
            self.log(format!("node {} {t:?} (traffic)", self.name(Some(n))));
        }
        Ok(ok)
    }

    /// One HTTP request; its first `refusals` connects are refused.
    fn http(&mut self, c: usize, refusals: usize) -> Result<(), String> {
        let mut exclude: Vec<NodeId> = Vec::new();
        loop {
            let r = self.route(c, true, &exclude, true)?;
            self.learn(c, &r)?;
            let Some(n) = r.node else {
                self.log(format!("HTTP c{c}: 503 ({})", r.outcome.as_str()));
                *self.stats.served.entry("HTTP 503").or_default() += 1;
                self.unanswered = true;
                return Ok(());
            };
            if !self.connect(n, &r, exclude.len() < refusals)? {
                self.log(format!(
                    "HTTP c{c}: {} refused{}",
                    self.name(Some(n)),
                    if r.trial { " (trial)" } else { "" }
                ));
                self.refused.push((c, n));
                exclude.push(n);
                continue;
            }
            *self.stats.served.entry("HTTP answered").or_default() += 1;
            // The answer: the cookies it sets.
            if let CookieWrite::Set { .. } = r.cookie {
                self.clients[c].cookie = Some(self.pool.name(n).to_owned());
            }
            match r.home {
                HomeWrite::Keep => {}
                HomeWrite::Set(h) => self.clients[c].home = Some(self.pool.name(h).to_owned()),
                HomeWrite::Clear => self.clients[c].home = None,
            }
            self.log(format!(
                "HTTP c{c} -> {} ({:?}{}, home {:?})",
                self.name(Some(n)),
                r.outcome,
                if r.trial { ", trial" } else { "" },
                r.home
            ));
            return Ok(());
        }
    }

    /// A TCP connect replacing the client's session; its first `refusals` connects are refused.
    fn tcp(&mut self, c: usize, refusals: usize) -> Result<(), String> {
        self.clients[c].tcp = None;
        let mut exclude: Vec<NodeId> = Vec::new();
        loop {
            let r = self.route(c, false, &exclude, true)?;
            self.learn(c, &r)?;
            let Some(n) = r.node else {
                self.log(format!("TCP c{c}: no node"));
                *self.stats.served.entry("TCP refused").or_default() += 1;
                return Ok(());
            };
            if !self.connect(n, &r, exclude.len() < refusals)? {
                self.log(format!(
                    "TCP c{c}: {} refused{}",
                    self.name(Some(n)),
                    if r.trial { " (trial)" } else { "" }
                ));
                exclude.push(n);
                continue;
            }
            *self.stats.served.entry("TCP connected").or_default() += 1;
            self.clients[c].tcp = Some(Session {
                node: n,
                split: None,
            });
            self.log(format!(
                "TCP c{c} -> {} ({:?}{})",
                self.name(Some(n)),
                r.outcome,
                if r.trial { ", trial" } else { "" }
            ));
            return Ok(());
        }
    }

    /// The client closes its TCP session.
    fn close(&mut self, c: usize) {
        if self.clients[c].tcp.take().is_some() {
            self.log(format!("TCP c{c} closed by the client"));
        }
    }

    /// A node's backend dies (its open sessions are reset) or comes back. Its state follows
    /// only through traffic.
    fn backend(&mut self, alive: bool) {
        let i = self.rng.below(self.model.nodes.len() as u64) as usize;
        if self.alive[i] == alive {
            return;
        }
        self.alive[i] = alive;
        let name = self.name(Some(NodeId(i as u32)));
        self.log(format!(
            "backend {name} {}",
            if alive { "back" } else { "dies" }
        ));
        if alive {
            return;
        }
        for c in 0..CLIENTS {
            if self.clients[c]
                .tcp
                .as_ref()
                .is_some_and(|s| s.node.index() == i)
            {
                self.clients[c].tcp = None;
                *self.stats.closed.entry("backend reset").or_default() += 1;
                self.log(format!("TCP c{c} on {name} reset"));
            }
        }
    }

    fn node_action(&mut self, roll: u64) {
        let i = self.rng.below(self.model.nodes.len() as u64) as usize;
        let id = NodeId(i as u32);
        let what = match roll {
            0 => {
                self.pool.set_admin(id, AdminState::Maint);
                self.model.nodes[i].admin = Admin::Maint;
                "MAINT".to_owned()
            }
            1 => {
                self.pool.set_admin(id, AdminState::Ready);
                self.model.nodes[i].admin = Admin::Ready;
                "READY".to_owned()
            }
            2 => {
                let deadline = (!self.rng.chance(20)).then(|| self.now + self.rng.below(8_000));
                let spread = if self.rng.chance(20) {
                    0
                } else {
                    self.rng.below(20_000)
                };
                self.pool.set_admin(
                    id,
                    AdminState::Drain {
                        deadline_ms: deadline,
                        spread_ms: spread,
                    },
                );
                self.model.nodes[i].admin = Admin::Drain { deadline, spread };
                format!(
                    "DRAIN deadline {:?} spread {spread}",
                    deadline.map(|d| d - T0)
                )
            }
            3 => {
                self.pool.force_health(id, false);
                self.model.force(id, false);
                "forced DOWN".to_owned()
            }
            _ => {
                self.pool.force_health(id, true);
                self.model.force(id, true);
                "forced UP".to_owned()
            }
        };
        self.log(format!("node {} {what}", self.pool.name(id)));
    }

    fn step(&mut self) -> Result<(), String> {
        self.now += if self.rng.chance(5) {
            self.rng.below(30_000)
        } else {
            self.rng.below(800)
        };
        self.refused.clear();
        self.unanswered = false;
        let c = self.rng.below(CLIENTS as u64) as usize;
        match self.rng.below(100) {
            0..=28 => self.http(c, 0)?,
            29..=42 => self.tcp(c, 0)?,
            43..=47 => {
                let n = 1 + self.rng.below(2) as usize;
                self.http(c, n)?;
            }
            48..=52 => {
                let n = 1 + self.rng.below(2) as usize;
                self.tcp(c, n)?;
            }
            53..=59 => self.close(c),
            60..=61 => {
                self.clients[c].cookie = None;
                self.clients[c].home = None;
                self.log(format!("c{c} lost its cookies"));
            }
            62 => {
                self.clients[c].cookie = Some("forged".to_owned());
                self.log(format!("c{c} forged its cookie"));
            }
            // READY and UP are likelier than the others, so that most of the time some
            // node takes fresh assignments.
            63..=64 => self.node_action(0),
            65..=76 => self.node_action(1),
            77..=79 => self.node_action(2),
            80 => self.node_action(3),
            81..=84 => self.node_action(4),
            85 => self.backend(false),
            86..=91 => self.backend(true),
            _ => {}
        }
        self.end_sessions()?;
        self.check_nodes()?;
        self.check_clients()
    }

    /// What the I/O layer does after every state change and at every drain moment.
    fn end_sessions(&mut self) -> Result<(), String> {
        for c in 0..CLIENTS {
            let Some(s) = &self.clients[c].tcp else {
                continue;
            };
            let node = s.node;
            let key = self.clients[c].spread;
            let status = self
                .pool
                .node(node)
                .ok_or("a session on a node of the pool")?
                .status();
            let end = status.session_end(self.now, key, true);
            let model = self.model.session_ends(node, key, self.now);
            if matches!(end, SessionEnd::Now(_)) != model {
                return Err(format!(
                    "client {c} session on {}: session_end {end:?}, model ends: {model}",
                    self.name(Some(node))
                ));
            }
            if let SessionEnd::Now(r) = end {
                *self.stats.closed.entry(r.as_str()).or_default() += 1;
                self.clients[c].tcp = None;
                self.log(format!(
                    "TCP c{c} on {} ended: {}",
                    self.name(Some(node)),
                    r.as_str()
                ));
            }
        }
        Ok(())
    }

    fn check_nodes(&self) -> Result<(), String> {
        if self.pool.rotation() != self.model.k {
            return Err(format!(
                "rotation {} but the model made {} fresh assignments",
                self.pool.rotation(),
                self.model.k
            ));
        }
        if self.pool.eligible() != self.model.up().as_slice() {
            return Err(format!(
                "eligible {:?}, model up {:?}",
                self.pool.eligible(),
                self.model.up()
            ));
        }
        for (id, node) in self.pool.nodes() {
            let h = node.health();
            let m = self.model.node(id);
            let retry_at = if m.up { None } else { m.retry_at };
            if h.is_up() != m.up || h.streak() != m.streak || h.retry_at_ms(self.policy) != retry_at
            {
                return Err(format!("node {}: health {h:?}, model {m:?}", node.name()));
            }
        }
        Ok(())
    }

    fn check_clients(&mut self) -> Result<(), String> {
        for c in 0..CLIENTS {
            // The client's next HTTP request, with nothing consumed (checked against the
            // model inside).
            let check = self.route(c, true, &[], false)?;
            let Some(session) = &self.clients[c].tcp else {
                continue;
            };
            let x = session.node;
            let table = self.shadow_table[c];
            if check.node == Some(x) && table == Some(x) {
                self.stats.agreeing_checks += 1;
                continue;
            }
            if session.split.is_some() {
                self.stats.exempt_checks += 1;
                continue;
            }
            let cause = if self.refused.contains(&(c, x)) {
                Some(Split::ConnectFailed)
            } else if check.outcome == Outcome::Failback {
                Some(Split::Failback)
            } else {
                None
            };
            let what = format!(
                "client {c} ({}) split: TCP session on {}, its HTTP route {} ({:?}), table {}, \
                 cookie {:?}, home {:?}",
                self.clients[c].ip,
                self.name(Some(x)),
                self.name(check.node),
                check.outcome,
                self.name(table),
                self.clients[c].cookie,
                self.clients[c].home,
            );
            match cause {
                Some(cause) if !self.strict => {
                    *self
                        .stats
                        .splits
                        .entry(format!(
                            "{cause:?}{} (failback {})",
                            if self.unanswered { " then 503" } else { "" },
                            self.failback
                        ))
                        .or_default() += 1;
                    self.log(format!("exempt {cause:?}: {what}"));
                    if let Some(s) = self.clients[c].tcp.as_mut() {
                        s.split = Some(cause);
                    }
                }
                Some(cause) => return Err(format!("{what} [would be exempt as {cause:?}]")),
                None => return Err(what),
            }
        }
        Ok(())
    }
}

fn run(seed: u64, strict: bool, stats: &mut Stats) -> Result<(), String> {
    let mut sim = Sim::new(seed, strict, stats)?;
    for step in 0..STEPS {
        let r = catch_unwind(AssertUnwindSafe(|| sim.step())).unwrap_or_else(|panic| {
            Err(panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "panic".into()))
        });
        if let Err(e) = r {
            let from = sim.trace.len().saturating_sub(40);
            return Err(format!(
                "step {step} (failback {}, {} nodes, fall {}, fail_timeout {} ms): {e}\n\
                 last actions:\n  {}",
                sim.failback,
                sim.model.nodes.len(),
                sim.policy.fall,
                sim.policy.fail_timeout_ms,
                sim.trace[from..].join("\n  ")
            ));
        }
    }
    Ok(())
}

#[test]
fn one_client_is_never_on_two_nodes_and_route_matches_the_model() {
    let strict = std::env::var("LIMPET_STRICT_SPLIT").is_ok_and(|v| v == "1");
    let mut stats = Stats::default();
    if let Ok(seed) = std::env::var("LIMPET_SEED") {
        let seed: u64 = seed.parse().expect("LIMPET_SEED is a number");
        if let Err(e) = run(seed, strict, &mut stats) {
            panic!("seed {seed}: {e}");
        }
        eprintln!("{stats:#?}");
        return;
    }
    let seeds: u64 = std::env::var("LIMPET_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    for seed in 0..seeds {
        if let Err(e) = run(seed, strict, &mut stats) {
            panic!(
                "seed {seed}: {e}\nreplay: LIMPET_SEED={seed} cargo test -p limpet-core \
                 --test route_simulation -- --nocapture"
            );
        }
    }
    eprintln!("{stats:#?}");
    // The run exercised what it claims to.
    let outcome = |k: &str| stats.outcomes.get(k).copied().unwrap_or(0);
    let repin = |k: &str| stats.repins.get(k).copied().unwrap_or(0);
    let closed = |k: &str| stats.closed.get(k).copied().unwrap_or(0);
    let rule = |k: &str| stats.rules.get(k).copied().unwrap_or(0);
    if seeds >= 50 {
        for (what, n) in [
            ("sticky routes", outcome("sticky")),
            ("table hits", outcome("sticky(table)")),
            ("failbacks", outcome("failback")),
            ("no-node routes", outcome("none")),
            ("drain-ended re-pins", repin("drain-ended")),
            ("connect-failed re-pins", repin("connect-failed")),
            ("node-down re-pins", repin("node-down")),
            ("node-maint re-pins", repin("node-maint")),
            ("unknown-node re-pins", repin("unknown-node")),
            (
                "stale cookies overridden by the table",
                stats.stale_cookies_overridden,
            ),
            (
                "trials of a pinned node",
                rule("Cookie, trial") + rule("Table, trial"),
            ),
            (
                "trials of the table over the cookie",
                rule("TableOverCookie, trial"),
            ),
            ("fresh trials", rule("Fresh, trial")),
            ("trials that brought a node back", stats.trials_ok),
            ("trials refused", stats.trials_refused),
            ("nodes DOWN by traffic", stats.went_down),
            ("sessions ended by a drain", closed("drain-ended")),
            ("sessions ended by DOWN", closed("node-down")),
            ("sessions ended by MAINT", closed("node-maint")),
            ("checks with a TCP session agreeing", stats.agreeing_checks),
        ] {
            assert!(n >= 20, "only {n} {what} over {seeds} seeds");
        }
    }
}
