//! # limpet: a session-affinity load balancer
//!
//! The binary is the I/O layer around `limpet-core`: it reads input (stdin for `limpet sim`,
//! sockets for the proxy), asks the core for every decision, and carries the decision out.
//!
//! Subcommands:
//! - `limpet sim`: the line protocol of `sticky-cookie-rules.md` on stdin/stdout.
//! - `limpet demo`: the proxy in front of three built-in nodes, no files needed.
//! - `limpet proxy`: the HTTP proxy in quick mode (`--listen`, `--to [NAME=]HOST:PORT`...).
//! - `limpet run -c limpet.toml`: every listener of a config file; `limpet check` validates it.
//! - `limpet probe`: checks that a balancer keeps each client session on one node.
//! - `limpet cert`: writes a self-signed certificate and key for trying a TLS listener.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// mimalloc instead of the system allocator: the proxy allocates small, short-lived buffers
/// per request, and `bench/http.sh` measured glibc malloc/free at several percent of the
/// proxy's time.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use limpet::sim;

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
    /// Run limpet in front of three built-in demo nodes on loopback (no files needed).
    Demo(limpet::demo::DemoArgs),
    /// Run the HTTP proxy in front of nodes given on the command line.
    Proxy(limpet::proxy::quick::ProxyArgs),
    /// Run every listener of a config file (see docs/config.md).
    Run(limpet::runtime::run::RunArgs),
    /// Validate a config file (certificates included) and print what it would run.
    Check(limpet::runtime::run::CheckArgs),
    /// Check from the client side that a balancer keeps each session on one node (docs/probe.md).
    Probe(limpet::probe::ProbeArgs),
    /// Write a self-signed certificate and key (PEM) for trying a TLS listener.
    Cert(CertArgs),
}

/// Arguments of `limpet cert`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Example: the certificate examples/print-server.toml names\n  \
    limpet cert --out examples/certs --name ha-safeq --san print.example\n\n\
    Clients do not trust a self-signed certificate: give them the .pem (curl --cacert) or\n\
    tell them not to verify (curl -k). Use a certificate from your CA in production."
)]
struct CertArgs {
    /// The directory to write into (created if missing); relative to the current directory.
    #[arg(long, value_name = "DIR")]
    out: std::path::PathBuf,
    /// The file name: writes DIR/NAME.pem (certificate) and DIR/NAME.key (private key).
    #[arg(long, value_name = "NAME")]
    name: String,
    /// A DNS name or IP address the certificate is valid for; repeatable.
    /// Default: localhost, 127.0.0.1 and ::1.
    #[arg(long = "san", value_name = "NAME")]
    san: Vec<String>,
    /// Replace existing files (by default they are kept and the command fails).
    #[arg(long)]
    force: bool,
}

/// `limpet cert`: exit 0 and the two paths on stdout, or exit 2 and why on stderr.
fn cert(args: CertArgs) -> ExitCode {
    let names = if args.san.is_empty() {
        vec![
            "localhost".to_owned(),
            "127.0.0.1".to_owned(),
            "::1".to_owned(),
        ]
    } else {
        args.san
    };
    match limpet::tls::write_self_signed(&args.out, &args.name, &names, args.force) {
        Ok((cert, key)) => {
            println!("certificate {}", cert.display());
            println!("key         {}", key.display());
            println!("valid for   {} (self-signed)", names.join(", "));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("limpet cert: {e}");
            ExitCode::from(2)
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Held to the end of `main`: its drop flushes the queued log lines (bounded).
    let _log;
    match cli.command {
        Command::Sim(args) => sim::run(args),
        Command::Demo(args) => {
            _log = limpet::logging::init();
            limpet::net::raise_fd_limit();
            limpet::demo::run(args)
        }
        Command::Proxy(args) => {
            _log = limpet::logging::init();
            limpet::net::raise_fd_limit();
            limpet::proxy::quick::run(args)
        }
        Command::Run(args) => {
            _log = limpet::logging::init();
            limpet::net::raise_fd_limit();
            limpet::runtime::run::run(args)
        }
        Command::Check(args) => {
            // The warnings validation logs (keys it ignores, naming their lines) are for the
            // operator checking the file above all.
            _log = limpet::logging::init();
            limpet::runtime::run::check(args)
        }
        Command::Probe(args) => {
            // Each session holds a WebSocket and a connection at once: `--sessions 1000 --ws`
            // needs more than a 1024 soft limit. Raised before logging starts, so its info
            // line does not precede every report; a limit still too low shows in the
            // report's errors (`Too many open files`).
            limpet::net::raise_fd_limit();
            _log = limpet::logging::init();
            limpet::probe::run(args)
        }
        Command::Cert(args) => cert(args),
    }
}
