//! # The HTTP reverse proxy with cookie affinity
//!
//! A client connection is served by hyper (HTTP/1.1 with keep-alive, or h2c with prior
//! knowledge); every request asks the one routing step (`State::route`, over `limpet_core::route`)
//! which node it goes to, is forwarded over
//! a pooled HTTP/1.1 connection to that node, and its answer streams back. Bodies are never
//! buffered whole in either direction.
//!
//! ```text
//!  TcpListener ─► server::serve ── accept (max connections) ─► task per client connection
//!                                                                 │ hyper-util auto
//!                                                                 ▼
//!  affinity::read(Cookie) ─► Pin ─► State::route ─► forward::handle ─► upstream::NodeConns
//!          ▲                  (ConnCtx: first choice pinned     │  (own keep-alive pool,
//!          │                   to the client connection)        │   configured address only)
//!          └── Set-Cookie (affinity::encode) ◄── answer ◄───────┘
//!                                     └─ 101 ─► upgrade::spawn_tunnel (bytes both ways)
//! ```
//!
//! Modules:
//! - [`config`]: the settings as plain data ([`ProxyConfig`]); quick mode and config files
//!   fill the same types.
//! - `client_io`: the client connection's stream under hyper: its first read taken whole,
//!   answers written at the end of the event-loop turn.
//! - `server`: per-connection state; idle, write-stall and drain handling; idle HTTP/1
//!   connections parked (hyper's connection and its buffers let go, the socket kept).
//!   Accepting is [`crate::net`]'s, shared with TCP and admin listeners. [`serve`] (a
//!   one-listener runtime of its own) and [`serve_listener`] (one listener of a shared
//!   [`crate::runtime::Runtime`]: the pool and tables shared with the other listeners).
//! - `forward`: one request: checks (framing, Host rules), decision, the node's queue,
//!   head rewriting, failover, access log.
//! - `affinity`: the cookie seam (value to pin, node to value), stripping the cookie.
//! - `headers`: hop-by-hop, the Host rules, `X-Forwarded-*`, `Cache-Control`.
//! - `upstream`: connections to nodes (connect and TLS through [`crate::net`]).
//! - `node_h1`: HTTP/1.1 to a node driven from the request's own task, for bodiless
//!   replayable requests to plaintext nodes (the rest goes through hyper's client).
//! - `upgrade`: tunnels after 101, relayed by [`crate::relay`].
//! - `body`: streaming body types of both edges, with their idle timers.
//! - [`quick`]: `limpet proxy --to ...` arguments to a [`ProxyConfig`].

mod affinity;
mod body;
mod client_io;
pub mod config;
mod forward;
mod headers;
mod node_h1;
pub mod quick;
mod server;
mod upgrade;
pub(crate) mod upstream;

pub use body::ProxyBody;
pub use config::{
    ConfigError, CookieConfig, CookieMode, Failback, IpNet, Limits, NodeConfig, ProxyConfig,
    Sticky, Timeouts,
};
pub use server::{
    runtime_of, serve, serve_listener, serve_listener_on, ServeError, QUICK_LISTENER,
};
