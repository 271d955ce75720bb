//! The live stats page at `/`: one HTML document with its style and script inline (no
//! external assets, so it works on an isolated admin network). It polls the JSON API every
//! two seconds, shows counts and per-second rates computed from the difference between two
//! polls, and, once the operator enters the token (kept in `sessionStorage`, never sent
//! anywhere but this admin listener), its buttons post node state changes.
//!
//! Everything from the API is written with `textContent`, never as HTML.

pub(crate) const PAGE: &str = include_str!("stats.html");
