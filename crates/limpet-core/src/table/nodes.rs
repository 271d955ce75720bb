//! Node identities as tables store them, and their binding to the current [`Pool`].
//!
//! A table entry must survive a configuration reload, which rebuilds the pool and may renumber
//! its [`NodeId`]s. So entries store a [`NodeRef`]: the index of the node's **name** in a
//! name list the store owns ([`NodeNames`], append-only). After each reload a [`Binding`] maps
//! every `NodeRef` to the new pool's `NodeId` by name, once per reload, so a lookup resolves a
//! pin with one array index. A pin to a name the new pool lacks resolves to
//! [`Pin::Unknown`](crate::Pin::Unknown), and `route` re-pins it.

use rustc_hash::FxHashMap;

use crate::node::NodeId;
use crate::topology::Topology;

/// A node identity in one store: the index of its name in that store's [`NodeNames`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeRef(pub(crate) u32);

impl NodeRef {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// Interned node names, append-only: a name keeps its [`NodeRef`] for the life of the store,
/// even after a reload removes the node (entries may still name it; names are few and small).
#[derive(Debug, Clone, Default)]
pub struct NodeNames {
    names: Vec<Box<str>>,
    // Fixed-seed hasher: names come from configuration and snapshots, never from requests
    // (a shared store's names are only looked up: `AffinityStore::known`).
    index: FxHashMap<Box<str>, NodeRef>,
}

impl NodeNames {
    pub fn new() -> Self {
        Self::default()
    }

    /// The identity of `name`, added if new. `None` only past 2^32 - 1 names.
    pub fn intern(&mut self, name: &str) -> Option<NodeRef> {
        if let Some(&r) = self.index.get(name) {
            return Some(r);
        }
        let r = NodeRef(
            u32::try_from(self.names.len())
                .ok()
                .filter(|&i| i < u32::MAX)?,
        );
        self.names.push(name.into());
        self.index.insert(name.into(), r);
        Some(r)
    }

    pub fn get(&self, name: &str) -> Option<NodeRef> {
        self.index.get(name).copied()
    }

    pub fn name(&self, node: NodeRef) -> Option<&str> {
        self.names.get(node.index()).map(|n| &**n)
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    pub fn iter(&self) -> impl ExactSizeIterator<Item = (NodeRef, &str)> {
        self.names
            .iter()
            .enumerate()
            .map(|(i, n)| (NodeRef(i as u32), &**n))
    }

    /// Heap bytes held (names twice, plus the map), for memory reports.
    pub(crate) fn heap_bytes(&self) -> usize {
        let text: usize = self.names.iter().map(|n| n.len()).sum();
        self.names.capacity() * std::mem::size_of::<Box<str>>()
            + 2 * text
            + self.index.capacity() * (std::mem::size_of::<(Box<str>, NodeRef)>() + 1)
    }
}

/// The mapping between a store's [`NodeRef`]s and one pool's [`NodeId`]s, built by name.
#[derive(Debug, Clone, Default)]
pub struct Binding {
    /// By `NodeRef` index: the node of that name in the pool, if it has one.
    to_pool: Vec<Option<NodeId>>,
    /// By `NodeId` index: the identity of that node's name (`None`: could not be interned).
    from_pool: Vec<Option<NodeRef>>,
}

impl Binding {
    /// Binds `pool` to identities from `intern` (a store's interner). Nodes whose name cannot
    /// be interned (past 2^32 - 1 names) are left unbound: pins to them read as unknown.
    pub fn new(pool: &Topology, mut intern: impl FnMut(&str) -> Option<NodeRef>) -> Self {
        let mut b = Binding {
            to_pool: Vec::new(),
            from_pool: Vec::with_capacity(pool.len()),
        };
        for (id, name) in pool.names() {
            // Pool ids are dense from 0, so pushing keeps `from_pool` indexed by id.
            debug_assert_eq!(b.from_pool.len(), id.index(), "pool ids are dense");
            let r = intern(name);
            b.from_pool.push(r);
            let Some(r) = r else {
                continue;
            };
            if b.to_pool.len() <= r.index() {
                b.to_pool.resize(r.index() + 1, None);
            }
            b.to_pool[r.index()] = Some(id);
        }
        b
    }

    /// The pool's node for a stored identity.
    #[inline]
    pub fn node(&self, r: NodeRef) -> Option<NodeId> {
        self.to_pool.get(r.index()).copied().flatten()
    }

    /// The identity to store for a pool node.
    #[inline]
    pub fn node_ref(&self, id: NodeId) -> Option<NodeRef> {
        self.from_pool.get(id.index()).copied().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Pool;

    #[test]
    fn interning_is_stable_and_deduplicated() {
        let mut n = NodeNames::new();
        let a = n.intern("a");
        let b = n.intern("b");
        assert_ne!(a, b);
        assert_eq!(n.intern("a"), a);
        assert_eq!(n.len(), 2);
        assert_eq!(a.and_then(|a| n.name(a)), Some("a"));
        assert_eq!(n.get("c"), None);
    }

    #[test]
    fn binding_follows_names_across_reloads() {
        let mut names = NodeNames::new();
        let p1 = Pool::new(["a", "b"]).expect("pool");
        let b1 = Binding::new(&p1, |n| names.intern(n));
        let ra = b1.node_ref(NodeId(0)).expect("bound");
        let rb = b1.node_ref(NodeId(1)).expect("bound");
        // Reload: "a" removed, "b" moves to index 0, "c" added.
        let p2 = Pool::new(["b", "c"]).expect("pool");
        let b2 = Binding::new(&p2, |n| names.intern(n));
        assert_eq!(b2.node(ra), None);
        assert_eq!(b2.node(rb), Some(NodeId(0)));
        assert_eq!(b2.node(NodeRef(99)), None);
        assert_eq!(b2.node_ref(NodeId(5)), None);
    }
}
