//! The live stats page at `/`: one HTML document with its style and script inline (no
//! external assets, so it works on an isolated admin network; the charts are inline SVG the
//! script draws). It polls the JSON API every two seconds: per node the state and how long
//! it has held, the health progress (`going down 1/3`, `trial in 7s`), requests and errors
//! per second, p50/p99 answer time, bytes, open connections and tunnels, pins, the last check,
//! and a chart of the last five minutes from `/api/v1/history` (kept by limpet, so a page
//! opened after an incident still shows it). The outcome totals get per-second rates from the
//! difference between two polls. Once the operator enters the token (kept in
//! `sessionStorage`, never sent anywhere but this admin listener), its buttons post node state
//! changes.
//!
//! The layout fits a 1280 px window with ten nodes without scrolling sideways (two-line cells,
//! long names and errors cut with an ellipsis); sections with nothing to show say so in a
//! sentence. Everything from the API is written with `textContent`, never as HTML.

pub(crate) const PAGE: &str = include_str!("stats.html");
