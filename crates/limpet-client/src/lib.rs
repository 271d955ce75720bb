//! limpet-client: keep a load balancer's affinity from a program that is not a browser.
//!
//! A balancer pins a client to one node with a cookie (`route` for limpet, `AWSALB*` for AWS
//! ALB, `SERVERID` for HAProxy). A browser keeps it without being told; an HTTP client whose
//! application attaches only its own session cookie loses it, and then its requests and its
//! WebSocket land on different nodes. This crate is the missing piece: an **affinity jar** that
//! keeps exactly the balancer's cookies for one session origin, in memory, and puts them on
//! every later request and WebSocket upgrade to that origin, beside the application's own
//! cookies. It also says what each failure means for the session ([`classify`]) and how long
//! to wait before reconnecting ([`Backoff`]).
//!
//! # How data flows
//! ```text
//!                 every answer of the origin (200, 409, 503, 101, refused upgrade...)
//!   server ──Set-Cookie──► adapter ──(origin, bytes, now)──► AffinityJar::adopt
//!                                                              │ keeps balancer names only,
//!                                                              │ within bounds; rewrites
//!                                                              │ replace, expiries remove
//!   server ◄──Cookie───── adapter ◄──(origin, app cookies, now)─ AffinityJar::merge_cookie_*
//!                                    every later request and upgrade to the same origin
//!
//!   Outcome (status / transport failure / socket closed) ──► classify ──► Verdict
//!                                                RetryLater ──► Backoff (1 s .. 30 s)
//! ```
//! The core ([`AffinityJar`], [`SetCookie`], [`classify`], [`Backoff`]) is sans-io: it never
//! reads a clock (time is an argument), never does I/O and never persists anything. The
//! adapters, behind features, connect it to real clients and read the clock through
//! [`SharedJar`]:
//! - feature `reqwest`: [`reqwest::AffinityCookieStore`], a `reqwest::cookie::CookieStore`.
//! - feature `tungstenite`: [`tungstenite`] helpers for a tokio-tungstenite handshake, for the
//!   101 answer and for a refused upgrade.
//!
//! One [`SharedJar`] serves both, so the socket opens on the node the HTTP requests reach
//! (run discovery, an HTTP request, immediately before each upgrade).
//!
//! # Example: the core alone
//! ```
//! use std::time::SystemTime;
//! use limpet_client::{classify, AffinityJar, Origin, Outcome, Verdict};
//!
//! let origin = Origin::parse("https://print.example/api/jobs")?;
//! let mut jar = AffinityJar::new(origin.clone());
//! let now = SystemTime::now();
//!
//! // A 409 still carries the balancer's cookie; the application's own cookie is left alone.
//! for line in ["AWSALB=abc123; Path=/; Expires=Fri, 01 Jan 2100 00:00:00 GMT", "sid=s3cr3t"] {
//!     jar.adopt(&origin, line.as_bytes(), now);
//! }
//! assert_eq!(classify(Outcome::RequestAnswered(409)), Verdict::HandBack);
//!
//! // The next request carries both: the application's cookie and the pin.
//! let socket = Origin::parse("wss://print.example/socket")?;
//! let cookie = jar.merge_cookie_header(&socket, Some("sid=s3cr3t"), now);
//! assert_eq!(cookie.as_deref(), Some("sid=s3cr3t; AWSALB=abc123"));
//! # Ok::<(), limpet_client::OriginError>(())
//! ```
//!
//! The adapters' examples are in their modules and, as programs that take a URL, in
//! `examples/reqwest.rs` and `examples/websocket.rs`.

mod date;
mod failure;
mod jar;
mod names;
mod origin;
mod set_cookie;

#[cfg(feature = "reqwest")]
pub mod reqwest;
#[cfg(feature = "tungstenite")]
pub mod tungstenite;

pub use failure::{classify, Backoff, Outcome, Verdict};
pub use jar::{Adoption, AffinityJar, HeldCookie, Ignored, SharedJar, MAX_COOKIES, MAX_VALUE_LEN};
pub use names::{CookieNames, NamePattern, PatternError};
pub use origin::{Origin, OriginError};
pub use set_cookie::{Expiry, SetCookie, SetCookieError};
