//! # limpet-core: the decision core of a session-affinity load balancer
//!
//! This crate decides, for each request, which node it goes to and whether the answer must
//! carry a (re-)pinning cookie. It does no I/O: no sockets, no tokio, no clock. Time is an
//! argument (`now_ms`, milliseconds since the Unix epoch). `limpet sim`, the proxy and the tests
//! all drive this same code, so a rule fixed here is fixed everywhere.
//!
//! ## Data flow
//!
//! ```text
//!  raw head bytes ──► head::head_end / head::cookie_in_head ─┐
//!                                                            ├─► cookie value (borrowed)
//!  HeaderMap values ──► cookie::find_in_values ──────────────┘          │
//!                                              Topology::pin_by_name (or a codec) ─► Pin
//!  table key ──► AffinityTable::lookup ─► Pin                            │
//!                                         └──────────► RouteInput ◄──────┘  + spread key, now
//!  checks / traffic / operator ─► Health::observe,     │
//!                       NodeStatus ─► Snapshot ───────►route() ─► Route { node, outcome,
//!                                                                  cookie, home, table write,
//!                                                                  trial, took_turn }
//!                                     Route.cookie ─► CookieSpec::set_cookie ─► Set-Cookie
//! ```
//!
//! [`route()`] is the only place a node is chosen. [`Health`] is the only place a node's
//! health changes; [`NodeStatus`] combines it with the operator's [`AdminState`]. [`Pool`] owns
//! statuses and a rotation for `limpet sim` and tests; the proxy keeps statuses per node in
//! its own runtime and builds the same [`Snapshot`].
//!
//! Nodes are identified by name: the name is what a cookie carries (in the default mode), so a
//! cookie can only choose among configured nodes, never name an address to connect to.

pub mod codec;
pub mod cookie;
pub mod decision;
pub mod head;
pub mod health;
pub mod node;
pub mod pool;
pub mod proxy_protocol;
pub mod route;
pub mod seen;
pub mod table;
pub mod topology;

pub use codec::{CodecError, CookieCodec, ReadPin, SignedCodec};
pub use cookie::{CookieSpec, SameSite, Secure};
pub use decision::{Decision, Pin, RepinReason};
pub use health::{
    answered_since, Availability, CarriedHealth, CheckCounts, CheckSlot, DownCause, Health,
    HealthPolicy, Observation, Transition,
};
pub use node::{AdminState, Node, NodeId, NodeState, NodeStatus, SessionEnd, Verdict, MAX_WEIGHT};
pub use pool::{Balance, Pool, PoolError};
pub use route::{
    leaves, route, spread_key, ConnPinWrite, CookieIn, CookieWrite, Excluded, HomeWrite, Leave,
    Outcome, Route, RouteInput, Snapshot, TableIn,
};
pub use table::{
    AffinityStore, AffinityTable, KeyRef, KeySpec, LruTable, NodeRef, TableConfig, TableKey,
};
pub use topology::Topology;
