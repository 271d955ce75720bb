//! # limpet: the I/O layer of a session-affinity load balancer
//!
//! This crate carries out what `limpet-core` decides. It owns every socket, timer and file;
//! the core owns every rule. Data flows one way:
//!
//! ```text
//!  stdin ──► sim::pump ──► sim::Sim ──┐
//!                                     ├──► limpet_core (head, cookie, Pool::decide) ──► answers
//!  client socket ──► proxy ───────────┘                                      │
//!                      ▲                                                     ▼
//!                      └────────── upstream connection to the chosen node ◄──┘
//! ```
//!
//! Modules:
//! - [`sim`]: `limpet sim`, the line protocol of the cookie rules, sans-io engine plus stdin loop.
//! - [`proxy`]: the HTTP reverse proxy (HTTP/1.1 and h2c, cookie affinity, WebSocket tunnels,
//!   failover re-pin) and `limpet proxy`.
//! - [`demo`]: `limpet demo`: three built-in nodes, the proxy, the admin listener, and the page's
//!   control endpoint (stop, start, drain a node and watch the session move).
//! - [`backend`]: a small built-in HTTP node (`limpet demo`, tests).
//! - [`health`]: active health checks (TCP, HTTP, TLS) feeding the core's health state machine.
//! - [`admin`]: the admin listener: JSON API, `/metrics`, the live stats page.
//! - [`drain`]: closing WebSocket tunnels cleanly (close 1001 between frames) at a drain deadline.
//! - [`net`]: the accept rule every listener shares; out of file descriptors logged once per
//!   interval and never held against a node.
//! - [`socket`]: the listening and the accepted client socket, which joins the reactor only
//!   once it has to wait (a `Connection: close` client never does).
//! - [`relay`]: the one relay of every tunnel (TCP sessions, WebSocket and other upgrades):
//!   idle and stalled-writer timers per direction, close signals that interrupt a blocked write.
//! - [`lifecycle`]: the runtime's node lifecycle: checks, drains, accounting, reload, admin.
//! - [`logging`]: log lines written to stderr by a thread of their own, never by one that
//!   serves traffic; dropped and counted when the reader does not keep up.
//! - [`nodes`]: the per-node runtime (status, counts, session signals), outliving reloads.
//! - [`error`]: upstream errors with their stage, for the retry and health rules.
//! - [`clock`]: the one clock (`now_ms`), tokio's, so paused-time tests move it.
//! - [`metrics`]: Prometheus metrics and the data plane's recording hooks.
//! - [`probe`]: `limpet probe`, checks from the client side that a balancer keeps sessions on one node.
//! - [`config`]: `limpet.toml` loaded and validated (raw -> validated types).
//! - [`tls`]: rustls server and client configs (SNI, ALPN, CA or `verify = "none"`).
//! - [`runtime`]: `limpet run`: one pool, shared tables, every listener of the config.
//! - [`store`]: fleet mode: shared tables through Redis or Valkey (local cache, create-if-absent
//!   first pins, re-pins published, circuit breaker).
//! - [`tcp`]: TCP mode (relay, half-close, idle, failover, node-down close, PROXY protocol).
//! - [`upgrade`]: binary upgrades without a refused client: a new `limpet run` takes over the
//!   running one's listening sockets, pins, node admin states and health through a Unix socket;
//!   on SIGUSR2 a running one starts its successor itself.
//! - [`notify`]: what `limpet run` tells systemd (`READY`, `RELOADING`, `STOPPING`, and the new
//!   main process after an upgrade).
//! - [`wake`]: futures polled only when woken: the watchers (idle clocks, drain and
//!   node-state signals) beside a connection's or a relay's I/O, and a relay's pumps.

pub mod admin;
pub mod backend;
pub mod clock;
pub mod config;
pub mod demo;
pub mod drain;
pub mod error;
pub mod health;
pub mod lifecycle;
pub mod logging;
pub mod metrics;
pub mod net;
pub mod nodes;
pub mod notify;
pub mod probe;
pub mod proxy;
pub mod relay;
pub mod runtime;
pub mod sim;
pub mod socket;
pub mod store;
pub mod tcp;
pub mod tls;
pub mod upgrade;
pub mod wake;

#[cfg(test)]
mod test_util;
