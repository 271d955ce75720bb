//! Helpers of the admin, stats-page and reload tests: the real runtime with its admin
//! listener (see [`lifecycle`]).

#![allow(dead_code, unreachable_pub)]

#[path = "../common/flood.rs"]
pub mod flood;
pub mod lifecycle;
#[path = "../common/ports.rs"]
pub mod ports;
