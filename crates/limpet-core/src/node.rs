//! Nodes: the backend machines limpet pins sessions to, and their states.
//!
//! A node's effective state combines what the operator said ([`AdminState`]) with what health
//! checks and traffic saw ([`Health`]), the way HAProxy separates administrative and
//! operational state. The operator's MAINT wins over everything; otherwise a DOWN node is down;
//! otherwise a draining node drains.

use crate::health::Health;

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

/// A node as the core knows it: a stable name (what cookies and tables store) and its state.
/// Addresses are the I/O layer's business and never live here, so nothing in a request can
/// reach one except through a configured node.
#[derive(Debug, Clone)]
pub struct Node {
    pub(crate) name: Box<str>,
    pub(crate) weight: u32,
    pub(crate) admin: AdminState,
    pub(crate) health: Health,
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
        self.admin
    }

    pub fn health(&self) -> Health {
        self.health
    }

    pub fn state(&self) -> NodeState {
        match self.admin {
            AdminState::Maint => NodeState::Maint,
            _ if !self.health.is_up() => NodeState::Down,
            AdminState::Drain { .. } => NodeState::Drain,
            AdminState::Ready => NodeState::Up,
        }
    }

    /// Whether the node takes fresh assignments.
    pub fn takes_fresh(&self) -> bool {
        self.state() == NodeState::Up
    }
}
