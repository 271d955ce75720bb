//! The pool: the configured nodes in order, their states, and the rotation that picks a node
//! for each fresh assignment.
//!
//! Fresh assignments go round-robin over the nodes that take them (UP, in pool order): the k-th
//! fresh assignment goes to `schedule[k mod len]`. With equal weights the schedule is exactly
//! the eligible nodes in pool order (the `limpet sim` rule `up[k mod len(up)]`); with weights,
//! each node appears `weight` times, interleaved so that no node gets a burst (each of a
//! node's turns sits at its ideal point `(i + 1/2) / weight` of the cycle). Least-connections
//! ([`Balance::LeastConn`]) instead picks the eligible node with the fewest open connections
//! per unit of weight: the rotation's turn when that node is among those tied on the fewest,
//! else a tied node drawn by a hash of the turn (`route::least_conn` says why). The pool
//! does not count connections: the caller supplies the live counts with each decision
//! (`active: impl Fn(NodeId) -> u32`), so counts kept outside the pool (by node name, across
//! reloads) are what least-connections reads.
//!
//! Only fresh assignments advance the rotation; a sticky hit does not take a turn. The eligible
//! list and the schedule (a [`Snapshot`]) are rebuilt on every state change rather than
//! filtered per request, so the hot path is an index operation.
//!
//! The pool owns its node states, which suits `limpet sim` and the core's tests. The running
//! proxy keeps each node's status in a per-node runtime that outlives reloads, and builds the
//! same [`Snapshot`]; both route with [`route::route`].

use crate::decision::{Decision, Pin};
use crate::health::{HealthPolicy, Observation, Transition};
use crate::node::{AdminState, Node, NodeId, NodeState, NodeStatus, MAX_WEIGHT};
use crate::route::{self, CookieIn, Excluded, Outcome, Route, RouteInput, Snapshot};
use crate::topology::Topology;

/// How a fresh assignment picks among the nodes that take one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Balance {
    /// Weighted round-robin in pool order.
    #[default]
    RoundRobin,
    /// Fewest open connections per unit of weight; ties go to the rotation's turn when it is
    /// among them, else to a tied node drawn by a hash of the turn.
    LeastConn,
}

/// Why a list of node names cannot form a pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolError {
    /// Two nodes share a name: a pin could not say which one it means.
    DuplicateName(String),
    /// The name cannot be written into a cookie as it is (empty, or holds `;`, `,`, space,
    /// quotes, backslash or control bytes).
    InvalidName(String),
    TooManyNodes,
    /// A weight outside 1 to [`MAX_WEIGHT`].
    InvalidWeight(String, u32),
}

impl std::fmt::Display for PoolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PoolError::DuplicateName(n) => write!(f, "duplicate node name {n:?}"),
            PoolError::InvalidName(n) => write!(
                f,
                "node name {n:?} cannot be a cookie value (use letters, digits and -._~!#$%&'*+^`|:<>=?@[]/)"
            ),
            PoolError::TooManyNodes => f.write_str("too many nodes"),
            PoolError::InvalidWeight(n, w) => {
                write!(f, "node {n:?} has weight {w}; weights go from 1 to {MAX_WEIGHT}")
            }
        }
    }
}

impl std::error::Error for PoolError {}

/// The node set with its states and rotation. See the module docs.
#[derive(Debug, Clone)]
pub struct Pool {
    topo: Topology,
    nodes: Vec<Node>,
    snap: Snapshot,
    rotation: u64,
}

impl std::ops::Deref for Pool {
    type Target = Topology;

    /// Names, weights and ids: a pool is a topology with states.
    fn deref(&self) -> &Topology {
        &self.topo
    }
}

impl Pool {
    /// The topology alone (what codecs and tables bind to).
    pub fn topology(&self) -> &Topology {
        &self.topo
    }

    /// A pool of these nodes, in this order, all of weight 1, UP and ready; the rotation
    /// starts at 0.
    pub fn new<I, S>(names: I) -> Result<Self, PoolError>
    where
        I: IntoIterator<Item = S>,
        S: Into<Box<str>>,
    {
        Self::with_weights(names.into_iter().map(|n| (n, 1)))
    }

    /// A pool of these `(name, weight)` nodes, in this order, UP and ready.
    pub fn with_weights<I, S>(nodes: I) -> Result<Self, PoolError>
    where
        I: IntoIterator<Item = (S, u32)>,
        S: Into<Box<str>>,
    {
        let topo = Topology::with_weights(nodes)?;
        let list = topo
            .names()
            .map(|(id, name)| Node {
                name: name.into(),
                weight: topo.weight(id),
                status: NodeStatus::default(),
            })
            .collect();
        let mut pool = Pool {
            topo,
            nodes: list,
            snap: Snapshot::default(),
            rotation: 0,
        };
        pool.rebuild();
        Ok(pool)
    }

    /// Sets the health policy of every node.
    pub fn with_health_policy(mut self, policy: HealthPolicy) -> Self {
        for n in &mut self.nodes {
            n.status.policy = policy;
        }
        self.rebuild();
        self
    }

    /// Sets one node's health policy (e.g. `checked` for a node with active checks).
    pub fn set_policy(&mut self, id: NodeId, policy: HealthPolicy) {
        if let Some(n) = self.nodes.get_mut(id.index()) {
            n.status.policy = policy;
            self.rebuild();
        }
    }

    pub fn nodes(&self) -> impl ExactSizeIterator<Item = (NodeId, &Node)> {
        self.nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (NodeId(i as u32), n))
    }

    /// The node with this id. Ids come from this pool, so this only fails on a caller bug.
    pub fn node(&self, id: NodeId) -> Option<&Node> {
        self.nodes.get(id.index())
    }

    /// How many fresh assignments were made since the pool was built.
    pub fn rotation(&self) -> u64 {
        self.rotation
    }

    /// The nodes that take fresh assignments now, in pool order.
    pub fn eligible(&self) -> &[NodeId] {
        self.snap.eligible()
    }

    /// The node states as the router reads them.
    pub fn snapshot(&self) -> &Snapshot {
        &self.snap
    }

    pub fn state(&self, id: NodeId) -> Option<NodeState> {
        self.node(id).map(Node::state)
    }

    /// Sets what the operator asks of a node. Returns false for an id not in this pool.
    pub fn set_admin(&mut self, id: NodeId, admin: AdminState) -> bool {
        let Some(node) = self.nodes.get_mut(id.index()) else {
            return false;
        };
        node.status.admin = admin;
        self.rebuild();
        true
    }

    /// Forces a node's health, as an operator command or the sim's `UP`/`DOWN`.
    pub fn force_health(&mut self, id: NodeId, up: bool) -> Option<Transition> {
        let t = self.nodes.get_mut(id.index())?.status.health.force(up);
        self.rebuild();
        t
    }

    /// Records what was seen of a node at `now_ms` (see [`crate::health`]), unless
    /// [`counts_for_health`] says it does not count. A node back from a trial makes the
    /// trials of the others DOWN by their traffic due now
    /// ([`crate::health::Health::trial_due_now`]).
    pub fn observe(&mut self, id: NodeId, obs: Observation, now_ms: u64) -> Option<Transition> {
        if !counts_for_health(id, obs, self.nodes.iter().map(|n| n.status)) {
            return None;
        }
        let status = &mut self.nodes.get_mut(id.index())?.status;
        let t = status.health.observe(obs, status.policy, now_ms);
        if t == Some(Transition::WentUp) && back_from_trial(obs) {
            for (i, node) in self.nodes.iter_mut().enumerate() {
                if i != id.index() {
                    let s = &mut node.status;
                    s.health.trial_due_now(s.policy, now_ms);
                }
            }
        }
        self.rebuild();
        t
    }

    /// Forgets a node's stopped check (see [`crate::health::Health::forget_check`]).
    pub fn forget_check(&mut self, id: NodeId, check: crate::health::CheckSlot) {
        if let Some(node) = self.nodes.get_mut(id.index()) {
            node.status.health.forget_check(check);
            self.rebuild();
        }
    }

    /// Claims the trial of a DOWN node due one (see [`crate::health::Health::claim_trial`]).
    pub fn claim_trial(&mut self, id: NodeId, now_ms: u64, hold_ms: u64, early: bool) -> bool {
        let Some(node) = self.nodes.get_mut(id.index()) else {
            return false;
        };
        let status = &mut node.status;
        let claimed = status
            .health
            .claim_trial(status.policy, now_ms, hold_ms, early);
        self.rebuild();
        claimed
    }

    /// The mark of the last trial of a node claimed ([`crate::health::Health::trial_claim`]),
    /// which its caller gives back with [`Pool::give_back_trial`].
    pub fn trial_claim(&self, id: NodeId) -> Option<u32> {
        self.nodes
            .get(id.index())
            .map(|n| n.status.health.trial_claim())
    }

    /// The trial of a node claimed as `claim` is over at `now_ms`: its caller gives the claim
    /// back once it has the outcome, or has given up on it, as the I/O layer's claim does
    /// when dropped (see [`crate::health::Health::trial_abandoned`]). A later claim is left
    /// alone.
    pub fn give_back_trial(&mut self, id: NodeId, claim: u32, now_ms: u64) {
        if let Some(node) = self.nodes.get_mut(id.index()) {
            let status = &mut node.status;
            status.health.trial_abandoned(status.policy, claim, now_ms);
            self.rebuild();
        }
    }

    /// Carries what a running pool learned into this one, built from a new configuration:
    /// each node's admin state and health (streaks included) by name, and the rotation.
    /// Policies stay the new configuration's.
    pub fn carry_over(&mut self, old: &Pool) {
        for node in &mut self.nodes {
            if let Some(id) = old.topo.lookup(node.name.as_bytes()) {
                let was = &old.nodes[id.index()];
                node.status.admin = was.status.admin;
                node.status.health = was.status.health;
                node.status
                    .health
                    .policy_changed(was.status.policy, node.status.policy);
            }
        }
        self.rotation = old.rotation;
        self.rebuild();
    }

    /// Routes with [`route::route`] over this pool's states and rotation, advancing the
    /// rotation when the route took a turn. `active` gives each node's open connections
    /// (read by [`Balance::LeastConn`] only).
    pub fn route(&mut self, input: &RouteInput<'_>, active: &dyn Fn(NodeId) -> u32) -> Route {
        let r = route::route(&self.snap, self.rotation, active, input);
        if r.took_turn {
            self.rotation = self.rotation.wrapping_add(1);
        }
        r
    }

    /// Decides where a request with this cookie pin goes (round-robin, no table): the
    /// cookie rules of `limpet sim`, through [`route::route`].
    pub fn decide(&mut self, pin: Pin, now_ms: u64) -> Decision {
        let r = self.route(
            &RouteInput {
                cookie: Some(CookieIn {
                    pin,
                    issued_ms: None,
                    refresh: false,
                    home: Pin::None,
                }),
                failback: false,
                conn_pin: None,
                table: None,
                spread_key: 0,
                balance: Balance::RoundRobin,
                exclude: &[],
                now_ms,
            },
            &|_| 0,
        );
        match (r.node, r.outcome) {
            (None, _) => Decision::Unavailable,
            (Some(n), Outcome::Sticky) => Decision::Sticky(n),
            (Some(node), Outcome::Repin(reason)) => Decision::Fresh {
                node,
                repin: Some(reason),
            },
            (Some(node), _) => Decision::Fresh { node, repin: None },
        }
    }

    /// A fresh round-robin assignment avoiding `exclude`, through [`route::route`].
    pub fn assign(&mut self, exclude: &[Excluded], now_ms: u64) -> Option<NodeId> {
        self.route(
            &RouteInput {
                cookie: None,
                failback: false,
                conn_pin: None,
                table: None,
                spread_key: 0,
                balance: Balance::RoundRobin,
                exclude,
                now_ms,
            },
            &|_| 0,
        )
        .node
    }

    fn rebuild(&mut self) {
        self.snap = Snapshot::new(self.nodes.iter().map(|n| (n.weight, n.status)));
        debug_assert_eq!(
            self.topo.len(),
            self.nodes.len(),
            "one state per node of the topology"
        );
    }
}

/// Whether `obs` of node `id` goes to the node's health, given every node's status now
/// (`statuses`, in pool order): everything does but a slow answer
/// ([`Observation::SlowAnswer`]) while no other node takes fresh assignments. Counted then,
/// slow answers could take DOWN the last node serving, and turn a slow service into none
/// (Envoy's outlier detection ejects at most a share of its hosts for the same reason); a
/// node answering most requests serves better than no node.
pub fn counts_for_health(
    id: NodeId,
    obs: Observation,
    statuses: impl IntoIterator<Item = NodeStatus>,
) -> bool {
    obs != Observation::SlowAnswer
        || statuses
            .into_iter()
            .enumerate()
            .any(|(i, s)| i != id.index() && s.takes_fresh())
}

/// Whether a node that went UP on `obs` came back from a trial (traffic), not on checks.
pub fn back_from_trial(obs: Observation) -> bool {
    matches!(obs, Observation::TrafficOk | Observation::TrafficConnected)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::RepinReason;
    use crate::route::TableIn;

    fn pool(names: &[&str]) -> Pool {
        Pool::new(names.iter().copied()).unwrap_or_else(|e| panic!("{e}"))
    }

    fn id(p: &Pool, name: &str) -> NodeId {
        p.lookup(name.as_bytes())
            .unwrap_or_else(|| panic!("no node {name}"))
    }

    /// `nodes` excluded as failed connects.
    fn failed(nodes: &[NodeId]) -> Vec<Excluded> {
        nodes
            .iter()
            .map(|&node| Excluded {
                node,
                why: RepinReason::ConnectFailed,
            })
            .collect()
    }

    fn fresh_input(balance: Balance, exclude: &[Excluded]) -> RouteInput<'_> {
        RouteInput {
            cookie: None,
            failback: false,
            conn_pin: None,
            table: None,
            spread_key: 0,
            balance,
            exclude,
            now_ms: 0,
        }
    }

    #[test]
    fn fresh_assignments_rotate_in_pool_order() {
        let mut p = pool(&["b1", "b2", "b3"]);
        let got: Vec<_> = (0..4)
            .map(|_| p.decide(Pin::None, 0).node().map(|n| p.name(n).to_owned()))
            .collect();
        assert_eq!(got, ["b1", "b2", "b3", "b1"].map(|s| Some(s.to_owned())));
    }

    #[test]
    fn sticky_hit_does_not_take_a_turn() {
        let mut p = pool(&["b1", "b2"]);
        let b2 = id(&p, "b2");
        assert_eq!(p.decide(Pin::Node(b2), 0), Decision::Sticky(b2));
        assert_eq!(p.rotation(), 0);
        assert_eq!(p.decide(Pin::None, 0).node(), Some(id(&p, "b1")));
    }

    #[test]
    fn pin_to_down_node_is_repinned() {
        let mut p = pool(&["b1", "b2", "b3"]);
        let b1 = id(&p, "b1");
        assert_eq!(p.decide(Pin::None, 0).node(), Some(b1));
        p.force_health(b1, false);
        // Second fresh assignment (k=1) over up = [b2, b3] is b3.
        assert_eq!(
            p.decide(Pin::Node(b1), 0),
            Decision::Fresh {
                node: id(&p, "b3"),
                repin: Some(RepinReason::NodeDown)
            }
        );
    }

    #[test]
    fn unknown_pin_is_treated_as_no_pin_with_a_repin() {
        let mut p = pool(&["b1"]);
        let pin = p.pin_by_name(Some(b"10.0.0.1:80"));
        assert_eq!(pin, Pin::Unknown);
        assert_eq!(
            p.decide(pin, 0),
            Decision::Fresh {
                node: id(&p, "b1"),
                repin: Some(RepinReason::UnknownNode)
            }
        );
    }

    #[test]
    fn nothing_up_is_unavailable_and_keeps_the_rotation() {
        let mut p = pool(&["b1"]);
        let b1 = id(&p, "b1");
        p.force_health(b1, false);
        assert_eq!(p.decide(Pin::None, 0), Decision::Unavailable);
        assert_eq!(p.rotation(), 0);
        assert_eq!(pool(&[]).decide(Pin::None, 0), Decision::Unavailable);
    }

    #[test]
    fn drain_honours_pins_until_the_deadline_and_takes_no_fresh() {
        let mut p = pool(&["a", "b"]);
        let a = id(&p, "a");
        p.set_admin(
            a,
            AdminState::Drain {
                deadline_ms: Some(1000),
                spread_ms: 0,
            },
        );
        assert_eq!(p.decide(Pin::Node(a), 999), Decision::Sticky(a));
        assert_eq!(p.decide(Pin::None, 0).node(), Some(id(&p, "b")));
        assert_eq!(
            p.decide(Pin::Node(a), 1000),
            Decision::Fresh {
                node: id(&p, "b"),
                repin: Some(RepinReason::DrainEnded)
            }
        );
    }

    #[test]
    fn maint_repins_at_once_even_when_healthy() {
        let mut p = pool(&["a", "b"]);
        let a = id(&p, "a");
        p.set_admin(a, AdminState::Maint);
        assert_eq!(
            p.decide(Pin::Node(a), 0),
            Decision::Fresh {
                node: id(&p, "b"),
                repin: Some(RepinReason::NodeMaint)
            }
        );
    }

    #[test]
    fn assign_skips_excluded_nodes() {
        let mut p = pool(&["a", "b", "c"]);
        let (a, b, c) = (id(&p, "a"), id(&p, "b"), id(&p, "c"));
        assert_eq!(p.assign(&failed(&[a]), 0), Some(b));
        assert_eq!(p.assign(&failed(&[a, b, c]), 0), None);
        assert_eq!(p.rotation(), 1);
    }

    #[test]
    fn passive_failures_take_a_node_down_and_a_trial_brings_it_back() {
        let mut p = pool(&["a", "b"]);
        let a = id(&p, "a");
        assert_eq!(p.observe(a, Observation::TrafficFailed, 0), None);
        assert_eq!(p.observe(a, Observation::TrafficFailed, 0), None);
        assert_eq!(
            p.observe(a, Observation::TrafficFailed, 0),
            Some(Transition::WentDown)
        );
        assert_eq!(p.eligible(), &[id(&p, "b")]);
        // fail_timeout (10 s) later the next fresh assignment is a's trial.
        assert_eq!(p.assign(&[], 9_999), Some(id(&p, "b")));
        let r = p.route(
            &RouteInput {
                now_ms: 10_000,
                ..fresh_input(Balance::RoundRobin, &[])
            },
            &|_| 0,
        );
        assert_eq!((r.node, r.trial), (Some(a), true));
        assert!(p.claim_trial(a, 10_000, 1_000, false));
        assert_eq!(
            p.observe(a, Observation::TrafficOk, 10_001),
            Some(Transition::WentUp)
        );
        assert_eq!(p.eligible().len(), 2);
    }

    #[test]
    fn bad_names_are_refused() {
        assert_eq!(
            Pool::new(["a", "a"]).err(),
            Some(PoolError::DuplicateName("a".into()))
        );
        assert_eq!(
            Pool::new(["a;b"]).err(),
            Some(PoolError::InvalidName("a;b".into()))
        );
    }

    #[test]
    fn weighted_rotation_interleaves_turns_by_weight() {
        let mut p = Pool::with_weights([("a", 3), ("b", 1)]).unwrap_or_else(|e| panic!("{e}"));
        let got: String = (0..8)
            .map(|_| p.assign(&[], 0).map_or("-", |n| p.name(n)).to_owned())
            .collect();
        // a's turns at 1/6, 3/6, 5/6 and b's at 1/2 of each cycle.
        assert_eq!(got, "aabaaaba");
        // Equal weights reduce to plain rotation in pool order.
        let mut q = Pool::with_weights([("x", 5), ("y", 5)]).unwrap_or_else(|e| panic!("{e}"));
        let got: String = (0..4)
            .map(|_| q.assign(&[], 0).map_or("-", |n| q.name(n)).to_owned())
            .collect();
        assert_eq!(got, "xyxy");
        assert!(matches!(
            Pool::with_weights([("z", 0)]),
            Err(PoolError::InvalidWeight(_, 0))
        ));
    }

    #[test]
    fn least_conn_picks_fewest_connections_per_weight() {
        let mut p =
            Pool::with_weights([("a", 1), ("b", 2), ("c", 1)]).unwrap_or_else(|e| panic!("{e}"));
        let (a, b, c) = (id(&p, "a"), id(&p, "b"), id(&p, "c"));
        let counts = |ca: u32, cb: u32, cc: u32| {
            move |n: NodeId| {
                if n == a {
                    ca
                } else if n == b {
                    cb
                } else if n == c {
                    cc
                } else {
                    0
                }
            }
        };
        let lc = |p: &mut Pool, exclude: &[NodeId], f: &dyn Fn(NodeId) -> u32| {
            p.route(&fresh_input(Balance::LeastConn, &failed(exclude)), f)
                .node
        };
        // a: 1/1, b: 2/2, c: 0/1 -> c
        assert_eq!(lc(&mut p, &[], &counts(1, 2, 0)), Some(c));
        // a: 0, b: 1 per weight, c: 2 -> a
        assert_eq!(lc(&mut p, &[], &counts(0, 2, 2)), Some(a));
        assert_eq!(lc(&mut p, &[a], &counts(0, 2, 2)), Some(b));
        // Round-robin ignores the counts.
        let mut q = pool(&["x", "y"]);
        let x = id(&q, "x");
        assert_eq!(
            q.route(&fresh_input(Balance::RoundRobin, &[]), &|_| 99)
                .node,
            Some(x)
        );
    }

    #[test]
    fn failback_goes_home_only_when_home_is_up_and_elsewhere() {
        let mut p = pool(&["a", "b", "c"]);
        let (a, b) = (id(&p, "a"), id(&p, "b"));
        let go = |p: &mut Pool, current: Pin, home: Pin| {
            let r = p.route(
                &RouteInput {
                    cookie: Some(CookieIn {
                        pin: current,
                        issued_ms: None,
                        refresh: false,
                        home,
                    }),
                    failback: true,
                    ..fresh_input(Balance::RoundRobin, &[])
                },
                &|_| 0,
            );
            (r.outcome == Outcome::Failback).then_some(r.node).flatten()
        };
        // Home UP, session elsewhere: go home.
        assert_eq!(go(&mut p, Pin::Node(b), Pin::Node(a)), Some(a));
        // No current pin (cookie lost or invalid) with a home UP: go home too.
        assert_eq!(go(&mut p, Pin::None, Pin::Node(a)), Some(a));
        assert_eq!(go(&mut p, Pin::Invalid, Pin::Node(a)), Some(a));
        // Already home: nothing to do.
        assert_eq!(go(&mut p, Pin::Node(a), Pin::Node(a)), None);
        // No home, or a home no longer configured.
        assert_eq!(go(&mut p, Pin::Node(b), Pin::None), None);
        assert_eq!(go(&mut p, Pin::Node(b), Pin::Unknown), None);
        assert_eq!(go(&mut p, Pin::Node(b), Pin::Node(NodeId(99))), None);
        // Home not UP: DOWN, MAINT and DRAIN all keep the session where it is.
        p.force_health(a, false);
        assert_eq!(go(&mut p, Pin::Node(b), Pin::Node(a)), None);
        p.force_health(a, true);
        p.set_admin(a, AdminState::Maint);
        assert_eq!(go(&mut p, Pin::Node(b), Pin::Node(a)), None);
        p.set_admin(
            a,
            AdminState::Drain {
                deadline_ms: None,
                spread_ms: 0,
            },
        );
        assert_eq!(go(&mut p, Pin::Node(b), Pin::Node(a)), None);
        p.set_admin(a, AdminState::Ready);
        assert_eq!(go(&mut p, Pin::Node(b), Pin::Node(a)), Some(a));
        // Failing back takes no turn of the rotation; the sticky routes in between neither.
        assert_eq!(p.rotation(), 0);
    }

    #[test]
    fn drain_deadline_repins_spread_over_the_window() {
        let mut p = pool(&["a", "b"]);
        let a = id(&p, "a");
        p.set_admin(
            a,
            AdminState::Drain {
                deadline_ms: Some(1_000),
                spread_ms: 10_000,
            },
        );
        let s = p.node(a).map(Node::status).unwrap_or_default();
        let honoured = |now: u64, key: u64| s.verdict(now, key) == crate::node::Verdict::Honour;
        let early_key = 0u64; // f = 0: re-pinned right at the deadline
        let late_key = u64::MAX; // f close to 1: re-pinned near the end of the window
        let mid_key = 1u64 << 63; // f = 1/2: at deadline + 5 s
        assert!(honoured(999, early_key));
        assert!(!honoured(1_000, early_key));
        assert!(honoured(5_999, mid_key));
        assert!(!honoured(6_000, mid_key));
        assert!(honoured(10_998, late_key));
        assert!(!honoured(11_000, late_key));
        // Spread over many sessions: about half are moved halfway through the window.
        let moved = (0..1000u64)
            .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .filter(|&k| !honoured(6_000, k))
            .count();
        assert!(
            (400..600).contains(&moved),
            "{moved} of 1000 moved at mid-window"
        );
        // A table pin held past the key's moment re-pins with the same reason.
        let r = p.route(
            &RouteInput {
                table: Some(TableIn {
                    pin: Pin::Node(a),
                    writes: true,
                }),
                spread_key: mid_key,
                now_ms: 6_000,
                ..fresh_input(Balance::RoundRobin, &[])
            },
            &|_| 0,
        );
        assert_eq!(r.outcome, Outcome::Repin(RepinReason::DrainEnded));
        assert_eq!(r.table, Some(id(&p, "b")));
    }

    #[test]
    fn a_node_back_from_a_trial_makes_the_others_trials_due() {
        let mut p = pool(&["a", "b"]).with_health_policy(HealthPolicy {
            fall: 1,
            fail_timeout_ms: 60_000,
            ..HealthPolicy::default()
        });
        let (a, b) = (id(&p, "a"), id(&p, "b"));
        p.observe(a, Observation::TrafficFailed, 0);
        p.observe(b, Observation::TrafficFailed, 0);
        assert!(p.claim_trial(a, 1_000, 500, true), "early: nothing else");
        assert_eq!(
            p.observe(a, Observation::TrafficOk, 1_001),
            Some(Transition::WentUp)
        );
        assert!(
            p.claim_trial(b, 1_002, 500, false),
            "b's trial is due at once, 59 s early"
        );
    }

    #[test]
    fn carry_over_keeps_states_and_rotation_by_name() {
        let mut old = pool(&["a", "b", "c"]);
        let (a, b) = (id(&old, "a"), id(&old, "b"));
        old.set_admin(b, AdminState::Maint);
        old.observe(a, Observation::TrafficFailed, 0); // one failure: a streak, still UP
        for _ in 0..4 {
            old.assign(&[], 0);
        }
        // The reload drops c, adds d, and reorders.
        let mut new = pool(&["d", "b", "a"]);
        new.carry_over(&old);
        assert_eq!(new.rotation(), 4);
        assert_eq!(new.state(id(&new, "b")), Some(NodeState::Maint));
        assert_eq!(new.state(id(&new, "d")), Some(NodeState::Up));
        let a2 = id(&new, "a");
        assert_eq!(new.observe(a2, Observation::TrafficFailed, 0), None);
        assert_eq!(
            new.observe(a2, Observation::TrafficFailed, 0),
            Some(Transition::WentDown),
            "the failure streak survived the reload"
        );
        new.force_health(a2, true);
        assert_eq!(new.eligible().len(), 2);
        assert_eq!(new.assign(&[], 0), Some(id(&new, "d")));
        assert_eq!(new.assign(&[], 0), Some(a2));
    }

    /// Slow answers of the last node taking fresh assignments are not counted: they would
    /// take it DOWN and leave no node at all. Once another node takes them again, they count.
    #[test]
    fn slow_answers_never_take_down_the_last_node_taking_sessions() {
        let mut p = pool(&["a", "b"]).with_health_policy(HealthPolicy {
            max_slow_answers: 2,
            ..HealthPolicy::default()
        });
        let (a, b) = (id(&p, "a"), id(&p, "b"));
        let drain = AdminState::Drain {
            deadline_ms: None,
            spread_ms: 0,
        };
        for admin in [AdminState::Maint, drain] {
            p.set_admin(b, admin);
            for t in 0..5 {
                assert_eq!(p.observe(a, Observation::SlowAnswer, t), None, "{admin:?}");
            }
            assert_eq!(p.state(a), Some(NodeState::Up));
        }
        p.set_admin(b, AdminState::Ready);
        assert_eq!(p.observe(a, Observation::SlowAnswer, 10), None);
        assert_eq!(
            p.observe(a, Observation::SlowAnswer, 20),
            Some(Transition::WentDown),
            "b takes sessions again"
        );
        // And b, now the only node left, keeps serving however slow.
        for t in 30..40 {
            assert_eq!(p.observe(b, Observation::SlowAnswer, t), None);
        }
        assert_eq!(p.state(b), Some(NodeState::Up));
    }
}
