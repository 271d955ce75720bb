//! # limpet: a session-affinity load balancer
//!
//! The binary is the I/O layer around `limpet-core`: it reads input (stdin for `limpet sim`,
//! sockets for the proxy), asks the core for every decision, and carries the decision out.
//!
//! Subcommands:
//! - `limpet sim`: the line protocol of `sticky-cookie-rules.md` on stdin/stdout.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod sim;

#[derive(Debug, Parser)]
#[command(name = "limpet", version, about = "A session-affinity load balancer")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the cookie-stickiness line protocol on stdin/stdout (see docs/sim.md).
    Sim(sim::SimArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Sim(args) => sim::run(args),
    }
}
