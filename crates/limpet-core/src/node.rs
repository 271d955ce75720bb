//! Nodes: the backend machines limpet pins sessions to, and their states.
//!
//! A node's effective state combines what the operator said ([`AdminState`]) with what health
//! checks and traffic saw ([`Health`]), the way HAProxy separates administrative and
//! operational state. The operator's MAINT wins over everything; otherwise a DOWN node is down;
//! otherwise a draining node drains.

use crate::decision::RepinReason;
use crate::health::{Availability, Health, HealthPolicy};

/// The largest node weight, as in HAProxy. Weights bound the length of the rotation schedule.
pub const MAX_WEIGHT: u32 = 256;

/// Index of a node in its [`Pool`](crate::Pool). Stable for the life of that pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u32);

impl NodeId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// What the operator asked of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AdminState {
    /// Normal service.
    #[default]
    Ready,
    /// Existing pins are honoured until `deadline_ms` (if any); no fresh assignments. After
    /// the deadline, each pin is re-pinned at a moment spread over `spread_ms`, so the other
    /// nodes are not stampeded by every session of the drained node at once.
    Drain {
        deadline_ms: Option<u64>,
        spread_ms: u64,
    },
    /// Out of service: nothing goes to the node, its pins are re-pinned at once.
    Maint,
}

/// The state that decides routing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeState {
    Up,
    Down,
    Drain,
    Maint,
}

impl NodeState {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Up => "UP",
            NodeState::Down => "DOWN",
            NodeState::Drain => "DRAIN",
            NodeState::Maint => "MAINT",
        }
    }
}

/// Everything that decides how a node is routed to: what the operator asked, what checks and
/// traffic saw, and the rules its health is judged by. Small and `Copy`: the I/O layer keeps
/// one per node (by name, for the life of the process) and the router reads copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NodeStatus {
    pub admin: AdminState,
    pub health: Health,
    pub policy: HealthPolicy,
}

impl NodeStatus {
    /// Whether `other` routes exactly like this status (everything but the health streak,
    /// which counts toward a flip but does not route).
    pub fn routes_like(&self, other: &NodeStatus) -> bool {
        self.admin == other.admin
            && self.policy == other.policy
            && self.health.routes_like(&other.health)
    }
}

/// Whether a pin to a node is honoured now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The node takes the pin.
    Honour,
    /// The node is DOWN and due a trial: the pin may try it (the caller claims the trial,
    /// connects first, and re-pins if it is refused).
    Trial,
    /// The pin must move, for this reason.
    Repin(RepinReason),
}

/// When a long-lived session (a TCP session, a WebSocket tunnel) pinned to a node must end,
/// as far as the node's state says now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionEnd {
    /// Not while the node's state stays as it is.
    Never,
    /// At this time: past a drain deadline, at the session's place in the spread window.
    At(u64),
    /// Now, for this reason.
    Now(RepinReason),
}

impl NodeStatus {
    pub fn state(&self) -> NodeState {
        match self.admin {
            AdminState::Maint => NodeState::Maint,
            _ if !self.health.is_up() => NodeState::Down,
            AdminState::Drain { .. } => NodeState::Drain,
            AdminState::Ready => NodeState::Up,
        }
    }

    /// Whether the node takes fresh assignments (it is UP and ready).
    pub fn takes_fresh(&self) -> bool {
        self.state() == NodeState::Up
    }

    /// Whether a fresh assignment may make this DOWN node's trial now (ready, not drained or
    /// in maintenance, and its `fail_timeout` has passed).
    pub fn trial_due(&self, now_ms: u64) -> bool {
        self.admin == AdminState::Ready
            && self.health.availability(self.policy, now_ms) == Availability::TrialDue
    }

    /// Whether this DOWN node may be tried before its `fail_timeout` when no other node can
    /// take a request: ready, and DOWN by its traffic alone with no trial in flight (see
    /// [`crate::health::Health::early_trial_possible`]).
    pub fn early_trial_possible(&self, now_ms: u64) -> bool {
        self.admin == AdminState::Ready && self.health.early_trial_possible(self.policy, now_ms)
    }

    /// When a drain's re-pin reaches the session with this spread key: `deadline + spread *
    /// f(key)`, `f(key)` in [0, 1) from the key's top 32 bits. `None` without a deadline.
    pub fn drain_end(&self, spread_key: u64) -> Option<u64> {
        match self.admin {
            AdminState::Drain {
                deadline_ms: Some(deadline),
                spread_ms,
            } => {
                let offset = (u128::from(spread_ms) * u128::from(spread_key >> 32)) >> 32;
                Some(deadline.saturating_add(u64::try_from(offset).unwrap_or(u64::MAX)))
            }
            _ => None,
        }
    }

    /// Whether a pin to this node, held by the session with this spread key, is honoured now.
    pub fn verdict(&self, now_ms: u64, spread_key: u64) -> Verdict {
        match self.state() {
            NodeState::Up => Verdict::Honour,
            NodeState::Drain => match self.drain_end(spread_key) {
                Some(at) if now_ms >= at => Verdict::Repin(RepinReason::DrainEnded),
                _ => Verdict::Honour,
            },
            NodeState::Maint => Verdict::Repin(RepinReason::NodeMaint),
            NodeState::Down => {
                let draining_past = self.drain_end(spread_key).is_some_and(|at| now_ms >= at);
                if !draining_past
                    && self.health.availability(self.policy, now_ms) == Availability::TrialDue
                {
                    Verdict::Trial
                } else {
                    Verdict::Repin(RepinReason::NodeDown)
                }
            }
        }
    }

    /// When a long-lived session with this spread key must end. `close_on_down`: whether the
    /// session ends when its node goes DOWN (a TCP listener's `close_on_node_down`).
    /// MAINT ends every session at once; a drain deadline ends each at its own place in the
    /// spread window, the moment [`verdict`](Self::verdict) re-pins the same key, so a client
    /// is never held on a node its other connections have already left.
    pub fn session_end(&self, now_ms: u64, spread_key: u64, close_on_down: bool) -> SessionEnd {
        if self.admin == AdminState::Maint {
            return SessionEnd::Now(RepinReason::NodeMaint);
        }
        if close_on_down && !self.health.is_up() {
            return SessionEnd::Now(RepinReason::NodeDown);
        }
        match self.drain_end(spread_key) {
            Some(at) if now_ms >= at => SessionEnd::Now(RepinReason::DrainEnded),
            Some(at) => SessionEnd::At(at),
            None => SessionEnd::Never,
        }
    }
}

/// A node as the core knows it: a stable name (what cookies and tables store), its weight
/// and its status. Addresses are the I/O layer's business and never live here, so nothing in
/// a request can reach one except through a configured node.
#[derive(Debug, Clone)]
pub struct Node {
    pub(crate) name: Box<str>,
    pub(crate) weight: u32,
    pub(crate) status: NodeStatus,
}

impl Node {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Relative share of fresh assignments (1 to [`MAX_WEIGHT`]).
    pub fn weight(&self) -> u32 {
        self.weight
    }

    pub fn admin(&self) -> AdminState {
        self.status.admin
    }

    pub fn health(&self) -> Health {
        self.status.health
    }

    pub fn status(&self) -> NodeStatus {
        self.status
    }

    pub fn state(&self) -> NodeState {
        self.status.state()
    }

    /// Whether the node takes fresh assignments.
    pub fn takes_fresh(&self) -> bool {
        self.status.takes_fresh()
    }
}
