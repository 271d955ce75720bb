//! The pool: the configured nodes in order, their states, and the rotation that picks a node
//! for each fresh assignment.
//!
//! Fresh assignments go round-robin over the nodes that take them (UP, in pool order): the k-th
//! fresh assignment goes to `schedule[k mod len]`. With equal weights the schedule is exactly
//! the eligible nodes in pool order (the `limpet sim` rule `up[k mod len(up)]`); with weights,
//! each node appears `weight` times, interleaved so that no node gets a burst (each of a
//! node's turns sits at its ideal point `(i + 1/2) / weight` of the cycle). Least-connections
//! ([`Balance::LeastConn`]) instead picks the eligible node with the fewest open connections
//! per unit of weight, ties going to rotation order. The pool does not count connections: the
//! caller supplies the live counts with each decision (`active: impl Fn(NodeId) -> u32`), so
//! counts kept outside the pool (by node name, across reloads) are what least-connections reads.
//!
//! Only fresh assignments advance the rotation; a sticky hit does not take a turn. The eligible
//! list and the schedule are rebuilt on every state change rather than filtered per request, so
//! the hot path is an index operation.

use rustc_hash::FxHashMap;

use crate::cookie::is_cookie_value_safe;
use crate::decision::{Decision, Pin, RepinReason};
use crate::health::{Health, HealthPolicy, Transition};
use crate::node::{AdminState, Node, NodeId, NodeState, MAX_WEIGHT};

/// How a fresh assignment picks among the nodes that take one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Balance {
    /// Weighted round-robin in pool order.
    #[default]
    RoundRobin,
    /// Fewest open connections per unit of weight; ties go to rotation order.
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
    nodes: Vec<Node>,
    // Fixed-seed hasher: lookups only, the map is built from configuration, never from requests.
    index: FxHashMap<Box<[u8]>, NodeId>,
    /// Nodes that take fresh assignments, in pool order.
    eligible: Vec<NodeId>,
    /// The round-robin cycle over `eligible`, each node `weight` times, interleaved.
    schedule: Vec<NodeId>,
    rotation: u64,
    health_policy: HealthPolicy,
}

impl Pool {
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
        let mut list = Vec::new();
        let mut index = FxHashMap::default();
        for (name, weight) in nodes {
            let name: Box<str> = name.into();
            if !is_cookie_value_safe(name.as_bytes()) {
                return Err(PoolError::InvalidName(name.into()));
            }
            if !(1..=MAX_WEIGHT).contains(&weight) {
                return Err(PoolError::InvalidWeight(name.into(), weight));
            }
            let id = NodeId(u32::try_from(list.len()).map_err(|_| PoolError::TooManyNodes)?);
            if index
                .insert(Box::<[u8]>::from(name.as_bytes()), id)
                .is_some()
            {
                return Err(PoolError::DuplicateName(name.into()));
            }
            list.push(Node {
                name,
                weight,
                admin: AdminState::Ready,
                health: Health::default(),
            });
        }
        let mut pool = Pool {
            eligible: Vec::with_capacity(list.len()),
            schedule: Vec::with_capacity(list.len()),
            nodes: list,
            index,
            rotation: 0,
            health_policy: HealthPolicy::default(),
        };
        pool.rebuild_eligible();
        Ok(pool)
    }

    /// Sets the fall/rise policy used by [`record_success`](Self::record_success) and
    /// [`record_failure`](Self::record_failure).
    pub fn with_health_policy(mut self, policy: HealthPolicy) -> Self {
        self.health_policy = policy;
        self
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
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

    /// The name of a node of this pool (`""` for an id from elsewhere).
    pub fn name(&self, id: NodeId) -> &str {
        self.nodes.get(id.index()).map_or("", |n| n.name())
    }

    /// The node with exactly this name.
    pub fn lookup(&self, name: &[u8]) -> Option<NodeId> {
        self.index.get(name).copied()
    }

    /// Reads a pin that holds a node name (the `name` cookie mode).
    pub fn pin_by_name(&self, value: Option<&[u8]>) -> Pin {
        match value {
            None => Pin::None,
            Some(v) => self.lookup(v).map_or(Pin::Unknown, Pin::Node),
        }
    }

    /// How many fresh assignments were made since the pool was built.
    pub fn rotation(&self) -> u64 {
        self.rotation
    }

    /// The nodes that take fresh assignments now, in pool order.
    pub fn eligible(&self) -> &[NodeId] {
        &self.eligible
    }

    pub fn state(&self, id: NodeId) -> Option<NodeState> {
        self.node(id).map(Node::state)
    }

    /// Sets what the operator asks of a node. Returns false for an id not in this pool.
    pub fn set_admin(&mut self, id: NodeId, admin: AdminState) -> bool {
        let Some(node) = self.nodes.get_mut(id.index()) else {
            return false;
        };
        node.admin = admin;
        self.rebuild_eligible();
        true
    }

    /// Forces a node's health, as an operator command or the sim's `UP`/`DOWN`.
    pub fn force_health(&mut self, id: NodeId, up: bool) -> Option<Transition> {
        let t = self.nodes.get_mut(id.index())?.health.force(up);
        if t.is_some() {
            self.rebuild_eligible();
        }
        t
    }

    /// Records a successful check or request against a node.
    pub fn record_success(&mut self, id: NodeId) -> Option<Transition> {
        let policy = self.health_policy;
        let t = self
            .nodes
            .get_mut(id.index())?
            .health
            .record_success(policy);
        if t.is_some() {
            self.rebuild_eligible();
        }
        t
    }

    /// Records a failed check or connection against a node.
    pub fn record_failure(&mut self, id: NodeId) -> Option<Transition> {
        let policy = self.health_policy;
        let t = self
            .nodes
            .get_mut(id.index())?
            .health
            .record_failure(policy);
        if t.is_some() {
            self.rebuild_eligible();
        }
        t
    }

    /// Carries what a running pool learned into this one, built from a new configuration
    /// (a reload): each node's admin state and health (streaks included) by name, and the
    /// rotation, so a reload neither resets who is next nor forgets a node's state. Nodes new
    /// in this pool keep their fresh defaults; nodes gone from it are simply not carried.
    pub fn carry_over(&mut self, old: &Pool) {
        for node in &mut self.nodes {
            if let Some(&id) = old.index.get(node.name.as_bytes()) {
                let was = &old.nodes[id.index()];
                node.admin = was.admin;
                node.health = was.health;
            }
        }
        self.rotation = old.rotation;
        self.rebuild_eligible();
    }

    /// Decides where a request with this pin goes, round-robin for fresh assignments.
    /// `now_ms` (milliseconds since the Unix epoch) is only read for drain deadlines.
    pub fn decide(&mut self, pin: Pin, now_ms: u64) -> Decision {
        self.decide_with(pin, now_ms, Balance::RoundRobin, 0, |_| 0)
    }

    /// [`decide`](Self::decide) with a balancing choice, and the pin's `spread_key`: a
    /// well-mixed hash of what identifies the session (client address, table key), which
    /// places its re-pin inside a drain's spread window. `active` gives each node's open
    /// connections now (read by [`Balance::LeastConn`] only).
    pub fn decide_with(
        &mut self,
        pin: Pin,
        now_ms: u64,
        balance: Balance,
        spread_key: u64,
        active: impl Fn(NodeId) -> u32,
    ) -> Decision {
        let repin = match pin {
            Pin::None => None,
            Pin::Node(id) => match self.honours_pin_keyed(id, now_ms, spread_key) {
                Ok(()) => return Decision::Sticky(id),
                Err(reason) => Some(reason),
            },
            Pin::Unknown => Some(RepinReason::UnknownNode),
            Pin::Invalid => Some(RepinReason::InvalidCookie),
            Pin::Expired => Some(RepinReason::ExpiredCookie),
        };
        match self.assign_with(balance, |_| false, active) {
            Some(node) => Decision::Fresh { node, repin },
            None => Decision::Unavailable,
        }
    }

    /// The failback rule (a listener with `failback = "home"`): a session that was moved away
    /// from its `home` node (which went DOWN, MAINT, past a drain deadline, or failed to
    /// connect) goes back there once the home node is UP again. Returns the home node when the
    /// session should go home now: `home` names a node of this pool that is UP and differs
    /// from the `current` pin. A draining home takes no one back (it takes no fresh pins).
    /// `now_ms` is read for symmetry with the other decisions; UP does not depend on it.
    pub fn failback(&self, current: Pin, home: Pin, _now_ms: u64) -> Option<NodeId> {
        let Pin::Node(home) = home else {
            return None;
        };
        if current == Pin::Node(home) {
            return None;
        }
        (self.state(home)? == NodeState::Up).then_some(home)
    }

    /// Whether a pin to `id` is honoured now, and if not, why.
    pub fn honours_pin(&self, id: NodeId, now_ms: u64) -> Result<(), RepinReason> {
        self.honours_pin_keyed(id, now_ms, 0)
    }

    /// [`honours_pin`](Self::honours_pin) for a session with this spread key: past a drain
    /// deadline, the session is re-pinned once `now` passes `deadline + spread * f(key)`, with
    /// `f(key)` in [0, 1) taken from the key's top 32 bits.
    pub fn honours_pin_keyed(
        &self,
        id: NodeId,
        now_ms: u64,
        spread_key: u64,
    ) -> Result<(), RepinReason> {
        let Some(node) = self.nodes.get(id.index()) else {
            return Err(RepinReason::UnknownNode);
        };
        match node.state() {
            NodeState::Up => Ok(()),
            NodeState::Drain => match node.admin {
                AdminState::Drain {
                    deadline_ms: Some(deadline),
                    spread_ms,
                } => {
                    let offset = (u128::from(spread_ms) * u128::from(spread_key >> 32)) >> 32;
                    let at = deadline.saturating_add(u64::try_from(offset).unwrap_or(u64::MAX));
                    if now_ms >= at {
                        Err(RepinReason::DrainEnded)
                    } else {
                        Ok(())
                    }
                }
                _ => Ok(()),
            },
            NodeState::Down => Err(RepinReason::NodeDown),
            NodeState::Maint => Err(RepinReason::NodeMaint),
        }
    }

    /// Makes a fresh round-robin assignment, skipping the nodes `exclude` names (e.g. nodes
    /// that already failed for this request). Consumes one turn of the rotation when it finds
    /// a node.
    pub fn assign(&mut self, exclude: impl Fn(NodeId) -> bool) -> Option<NodeId> {
        self.assign_with(Balance::RoundRobin, exclude, |_| 0)
    }

    /// [`assign`](Self::assign) with a balancing choice; `active` gives each node's open
    /// connections now (read by [`Balance::LeastConn`] only).
    pub fn assign_with(
        &mut self,
        balance: Balance,
        exclude: impl Fn(NodeId) -> bool,
        active: impl Fn(NodeId) -> u32,
    ) -> Option<NodeId> {
        let node = match balance {
            Balance::RoundRobin => {
                let len = self.schedule.len();
                if len == 0 {
                    return None;
                }
                let start = (self.rotation % len as u64) as usize;
                (0..len)
                    .map(|i| self.schedule[(start + i) % len])
                    .find(|&n| !exclude(n))?
            }
            Balance::LeastConn => {
                let len = self.eligible.len();
                if len == 0 {
                    return None;
                }
                let start = (self.rotation % len as u64) as usize;
                // Fewest connections per unit of weight: a/wa < b/wb  <=>  a*wb < b*wa.
                (0..len)
                    .map(|i| self.eligible[(start + i) % len])
                    .filter(|&n| !exclude(n))
                    .min_by(|&a, &b| {
                        let (wa, wb) = (self.nodes[a.index()].weight, self.nodes[b.index()].weight);
                        (u64::from(active(a)) * u64::from(wb))
                            .cmp(&(u64::from(active(b)) * u64::from(wa)))
                    })?
            }
        };
        self.rotation = self.rotation.wrapping_add(1);
        Some(node)
    }

    fn rebuild_eligible(&mut self) {
        self.eligible.clear();
        self.eligible.extend(
            self.nodes
                .iter()
                .enumerate()
                .filter(|(_, n)| n.takes_fresh())
                .map(|(i, _)| NodeId(i as u32)),
        );
        self.rebuild_schedule();
        self.debug_check();
    }

    /// Lays out one round-robin cycle: node `n` takes `weight(n)` turns, its i-th at the ideal
    /// point `(i + 1/2) / weight(n)` of the cycle; turns at the same point go in pool order.
    /// With equal weights every node has one turn at 1/2, so the cycle is `eligible` itself.
    fn rebuild_schedule(&mut self) {
        self.schedule.clear();
        let weights = || self.eligible.iter().map(|n| self.nodes[n.index()].weight);
        let g = weights().fold(0, gcd);
        if weights().all(|w| w == g) {
            self.schedule.extend_from_slice(&self.eligible);
            return;
        }
        // (numerator, denominator) of each turn's point, compared by cross-multiplication.
        let mut turns: Vec<(u64, u64, NodeId)> = Vec::new();
        for &n in &self.eligible {
            let w = u64::from(self.nodes[n.index()].weight / g);
            turns.extend((0..w).map(|i| (2 * i + 1, 2 * w, n)));
        }
        turns.sort_by(|a, b| (a.0 * b.1).cmp(&(b.0 * a.1)).then(a.2.cmp(&b.2)));
        self.schedule.extend(turns.into_iter().map(|t| t.2));
    }

    fn debug_check(&self) {
        debug_assert!(
            self.eligible.iter().all(|n| self.schedule.contains(n))
                && self.schedule.iter().all(|n| self.eligible.contains(n)),
            "the schedule covers exactly the eligible nodes"
        );
        debug_assert_eq!(
            self.index.len(),
            self.nodes.len(),
            "index covers every node once"
        );
        debug_assert!(
            self.eligible.windows(2).all(|w| w[0] < w[1]),
            "eligible nodes are in pool order"
        );
        debug_assert!(
            self.eligible
                .iter()
                .all(|&n| self.nodes[n.index()].takes_fresh()),
            "every eligible node takes fresh assignments"
        );
    }
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(names: &[&str]) -> Pool {
        Pool::new(names.iter().copied()).unwrap_or_else(|e| panic!("{e}"))
    }

    fn id(p: &Pool, name: &str) -> NodeId {
        p.lookup(name.as_bytes())
            .unwrap_or_else(|| panic!("no node {name}"))
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
        let a = id(&p, "a");
        assert_eq!(p.assign(|n| n == a), Some(id(&p, "b")));
        assert_eq!(p.assign(|_| true), None);
        assert_eq!(p.rotation(), 1);
    }

    #[test]
    fn passive_failures_take_a_node_down() {
        let mut p = pool(&["a", "b"]);
        let a = id(&p, "a");
        assert_eq!(p.record_failure(a), None);
        assert_eq!(p.record_failure(a), None);
        assert_eq!(p.record_failure(a), Some(Transition::WentDown));
        assert_eq!(p.eligible(), &[id(&p, "b")]);
        assert_eq!(p.record_success(a), None);
        assert_eq!(p.record_success(a), Some(Transition::WentUp));
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
            .map(|_| p.assign(|_| false).map_or("-", |n| p.name(n)).to_owned())
            .collect();
        // a's turns at 1/6, 3/6, 5/6 and b's at 1/2 of each cycle.
        assert_eq!(got, "aabaaaba");
        // Equal weights reduce to plain rotation in pool order.
        let mut q = Pool::with_weights([("x", 5), ("y", 5)]).unwrap_or_else(|e| panic!("{e}"));
        let got: String = (0..4)
            .map(|_| q.assign(|_| false).map_or("-", |n| q.name(n)).to_owned())
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
        // a: 1/1, b: 2/2, c: 0/1 -> c
        assert_eq!(
            p.assign_with(Balance::LeastConn, |_| false, counts(1, 2, 0)),
            Some(c)
        );
        // a: 0, b: 1 per weight, c: 2 -> a
        assert_eq!(
            p.assign_with(Balance::LeastConn, |_| false, counts(0, 2, 2)),
            Some(a)
        );
        assert_eq!(
            p.assign_with(Balance::LeastConn, |n| n == a, counts(0, 2, 2)),
            Some(b)
        );
        // Round-robin ignores the counts.
        let mut q = pool(&["x", "y"]);
        let x = id(&q, "x");
        assert_eq!(
            q.assign_with(Balance::RoundRobin, |_| false, |_| 99),
            Some(x)
        );
    }

    #[test]
    fn failback_goes_home_only_when_home_is_up_and_elsewhere() {
        let mut p = pool(&["a", "b", "c"]);
        let (a, b) = (id(&p, "a"), id(&p, "b"));
        // Home UP, session elsewhere: go home.
        assert_eq!(p.failback(Pin::Node(b), Pin::Node(a), 0), Some(a));
        // No current pin (cookie lost or invalid) with a home UP: go home too.
        assert_eq!(p.failback(Pin::None, Pin::Node(a), 0), Some(a));
        assert_eq!(p.failback(Pin::Invalid, Pin::Node(a), 0), Some(a));
        // Already home: nothing to do.
        assert_eq!(p.failback(Pin::Node(a), Pin::Node(a), 0), None);
        // No home, or a home no longer configured.
        assert_eq!(p.failback(Pin::Node(b), Pin::None, 0), None);
        assert_eq!(p.failback(Pin::Node(b), Pin::Unknown, 0), None);
        assert_eq!(p.failback(Pin::Node(b), Pin::Node(NodeId(99)), 0), None);
        // Home not UP: DOWN, MAINT and DRAIN all keep the session where it is.
        p.force_health(a, false);
        assert_eq!(p.failback(Pin::Node(b), Pin::Node(a), 0), None);
        p.force_health(a, true);
        p.set_admin(a, AdminState::Maint);
        assert_eq!(p.failback(Pin::Node(b), Pin::Node(a), 0), None);
        p.set_admin(
            a,
            AdminState::Drain {
                deadline_ms: None,
                spread_ms: 0,
            },
        );
        assert_eq!(p.failback(Pin::Node(b), Pin::Node(a), 0), None);
        p.set_admin(a, AdminState::Ready);
        assert_eq!(p.failback(Pin::Node(b), Pin::Node(a), 0), Some(a));
        // Deciding failback takes no turn of the rotation.
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
        let early_key = 0u64; // f = 0: re-pinned right at the deadline
        let late_key = u64::MAX; // f close to 1: re-pinned near the end of the window
        let mid_key = 1u64 << 63; // f = 1/2: at deadline + 5 s
        assert_eq!(p.honours_pin_keyed(a, 999, early_key), Ok(()));
        assert_eq!(
            p.honours_pin_keyed(a, 1_000, early_key),
            Err(RepinReason::DrainEnded)
        );
        assert_eq!(p.honours_pin_keyed(a, 5_999, mid_key), Ok(()));
        assert_eq!(
            p.honours_pin_keyed(a, 6_000, mid_key),
            Err(RepinReason::DrainEnded)
        );
        assert_eq!(p.honours_pin_keyed(a, 10_998, late_key), Ok(()));
        assert_eq!(
            p.honours_pin_keyed(a, 11_000, late_key),
            Err(RepinReason::DrainEnded)
        );
        // Spread over many sessions: about half are moved halfway through the window.
        let moved = (0..1000u64)
            .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .filter(|&k| p.honours_pin_keyed(a, 6_000, k).is_err())
            .count();
        assert!(
            (400..600).contains(&moved),
            "{moved} of 1000 moved at mid-window"
        );
    }

    #[test]
    fn carry_over_keeps_states_and_rotation_by_name() {
        let mut old = pool(&["a", "b", "c"]);
        let (a, b) = (id(&old, "a"), id(&old, "b"));
        old.set_admin(b, AdminState::Maint);
        old.record_failure(a); // one failure: a streak, still UP
        for _ in 0..4 {
            old.assign(|_| false);
        }
        // The reload drops c, adds d, and reorders.
        let mut new = pool(&["d", "b", "a"]);
        new.carry_over(&old);
        assert_eq!(new.rotation(), 4);
        assert_eq!(new.state(id(&new, "b")), Some(NodeState::Maint));
        assert_eq!(new.state(id(&new, "d")), Some(NodeState::Up));
        let a2 = id(&new, "a");
        assert_eq!(new.record_failure(a2), None);
        assert_eq!(
            new.record_failure(a2),
            Some(Transition::WentDown),
            "the failure streak survived the reload"
        );
        // Rotation continues: eligible is [d], so the next fresh one is d either way; with two
        // eligible nodes, k=4 picks index 0.
        new.force_health(a2, true);
        assert_eq!(new.eligible().len(), 2);
        assert_eq!(new.assign(|_| false), Some(id(&new, "d")));
        assert_eq!(new.assign(|_| false), Some(a2));
    }
}
