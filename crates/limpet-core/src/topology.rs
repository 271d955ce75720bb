//! The topology: the configured nodes by name and weight, in pool order, and the ids the
//! rest of the core uses for them. Immutable once built; a reload builds a new one.
//!
//! Node states are not here: [`Pool`](crate::Pool) adds them for `limpet sim` and the core's
//! tests, and the running proxy keeps them in per-node runtimes that outlive topologies.
//! Cookie codecs and affinity tables bind to a topology (names to ids), never to states.

use rustc_hash::FxHashMap;

use crate::cookie::is_cookie_value_safe;
use crate::decision::Pin;
use crate::node::{NodeId, MAX_WEIGHT};
use crate::pool::PoolError;

/// The configured nodes. See the module docs.
#[derive(Debug, Clone, Default)]
pub struct Topology {
    names: Vec<Box<str>>,
    weights: Vec<u32>,
    // Fixed-seed hasher: lookups only, the map is built from configuration, never from requests.
    index: FxHashMap<Box<[u8]>, NodeId>,
}

impl Topology {
    /// These `(name, weight)` nodes, in this order. Names must be usable as cookie values and
    /// distinct; weights go from 1 to [`MAX_WEIGHT`].
    pub fn with_weights<I, S>(nodes: I) -> Result<Self, PoolError>
    where
        I: IntoIterator<Item = (S, u32)>,
        S: Into<Box<str>>,
    {
        let mut t = Topology::default();
        for (name, weight) in nodes {
            let name: Box<str> = name.into();
            if !is_cookie_value_safe(name.as_bytes()) {
                return Err(PoolError::InvalidName(name.into()));
            }
            if !(1..=MAX_WEIGHT).contains(&weight) {
                return Err(PoolError::InvalidWeight(name.into(), weight));
            }
            let id = NodeId(u32::try_from(t.names.len()).map_err(|_| PoolError::TooManyNodes)?);
            if t.index
                .insert(Box::<[u8]>::from(name.as_bytes()), id)
                .is_some()
            {
                return Err(PoolError::DuplicateName(name.into()));
            }
            t.names.push(name);
            t.weights.push(weight);
        }
        Ok(t)
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Every node's id and name, in pool order.
    pub fn names(&self) -> impl ExactSizeIterator<Item = (NodeId, &str)> {
        self.names
            .iter()
            .enumerate()
            .map(|(i, n)| (NodeId(i as u32), &**n))
    }

    pub fn contains(&self, id: NodeId) -> bool {
        id.index() < self.names.len()
    }

    /// The name of a node (`""` for an id from elsewhere).
    pub fn name(&self, id: NodeId) -> &str {
        self.names.get(id.index()).map_or("", |n| n)
    }

    /// A node's weight (1 for an id from elsewhere).
    pub fn weight(&self, id: NodeId) -> u32 {
        self.weights.get(id.index()).copied().unwrap_or(1)
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
}
