//! `limpet proxy`: the quick mode, no config file, in the spirit of `caddy reverse-proxy`.
//!
//! ```text
//! limpet proxy --listen 127.0.0.1:8080 --to a=10.0.0.1:80 --to 10.0.0.2:80 [--sticky none]
//! ```
//!
//! Arguments become a [`ProxyConfig`] (the same type a config file will fill), the listener is
//! bound, its address printed on stdout (`listening on 127.0.0.1:PORT`, so scripts can use
//! port 0), and [`serve`] runs until Ctrl-C; with `--threads N` > 1 (the default is one per
//! core), N worker threads serve it, each on its own `SO_REUSEPORT` socket
//! (`crate::runtime::workers`).
//! Every argument error exits with code 2 and one line saying what is wrong.

use std::io::Write;
use std::net::{SocketAddr, ToSocketAddrs};
use std::process::ExitCode;

use limpet_core::CookieSpec;

use super::config::{CookieConfig, IpNet, NodeConfig, ProxyConfig, Sticky};
use super::serve;

/// `--sticky`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StickyArg {
    /// Pin each client with a cookie (default).
    Cookie,
    /// Plain round-robin, no cookie.
    None,
}

/// Arguments of `limpet proxy`.
#[derive(Debug, Clone, clap::Args)]
pub struct ProxyArgs {
    /// Address to listen on (port 0 picks a free port; the bound address is printed).
    #[arg(long, default_value = "127.0.0.1:8080", value_name = "ADDR")]
    pub listen: String,
    /// A node: `HOST:PORT`, or `NAME=HOST:PORT` to choose the name its cookie carries.
    /// Without a name, a stable name derived from the address is used: it does not show the
    /// address, but someone who can guess node addresses can test a guess against it; give a
    /// name where that matters. Repeat for each node; the order is the rotation order.
    #[arg(long = "to", value_name = "[NAME=]HOST:PORT", required = true, value_parser = parse_target)]
    pub to: Vec<Target>,
    /// How clients are pinned to nodes.
    #[arg(long, value_enum, default_value_t = StickyArg::Cookie)]
    pub sticky: StickyArg,
    /// Name of the affinity cookie.
    #[arg(long, default_value = "route", value_name = "NAME")]
    pub cookie: String,
    /// Without active checks, how long a node taken DOWN by failed connections waits before
    /// one connection tries it again (nginx's `fail_timeout`); 100 ms at least.
    #[arg(long = "fail-timeout", default_value = "10s", value_name = "DURATION", value_parser = crate::config::parse_duration)]
    pub fail_timeout: std::time::Duration,
    /// A node that lets this many requests outlast the answer timeout within one
    /// `--fail-timeout` while it answers others goes DOWN (a gray failure; never the last
    /// node taking sessions). 0: never (docs/operations.md).
    #[arg(long = "max-slow-answers", default_value_t = 0, value_name = "N")]
    pub max_slow_answers: u32,
    /// How long an idle kept-alive connection to a node is kept for reuse; keep it below the
    /// nodes' own keep-alive timeout (Node.js and Apache 5 s, gunicorn 2 s).
    #[arg(long = "upstream-idle", default_value = "4s", value_name = "DURATION", value_parser = crate::config::parse_duration)]
    pub upstream_idle: std::time::Duration,
    /// Worker threads, each serving its own SO_REUSEPORT socket (default: one per core).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub threads: Option<u16>,
    /// A peer whose X-Forwarded-For is extended rather than replaced (address or CIDR).
    /// Repeatable. Default: none.
    #[arg(long = "trust-proxy", value_name = "CIDR", value_parser = parse_net)]
    pub trust_proxy: Vec<IpNet>,
}

/// One `--to` value, parsed but not yet resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub name: Option<String>,
    pub addr: String,
}

fn parse_target(s: &str) -> Result<Target, String> {
    let (name, addr) = match s.split_once('=') {
        Some((n, a)) => (Some(n.to_owned()), a),
        None => (None, s),
    };
    if let Some(n) = &name {
        if !limpet_core::cookie::is_cookie_value_safe(n.as_bytes()) {
            return Err(format!(
                "node name {n:?} cannot be a cookie value (use letters, digits and -._~)"
            ));
        }
    }
    let Some((host, port)) = addr.rsplit_once(':') else {
        return Err(format!("{addr:?} is not HOST:PORT"));
    };
    if host.is_empty() || port.parse::<u16>().is_err() {
        return Err(format!("{addr:?} is not HOST:PORT"));
    }
    Ok(Target {
        name,
        addr: addr.to_owned(),
    })
}

fn parse_net(s: &str) -> Result<IpNet, String> {
    s.parse().map_err(|e: super::ConfigError| e.0)
}

/// A node name derived from its address: `n-` and 6 hex digits of a fixed-seed FNV-1a hash
/// of the address as written. Stable across restarts, instances and reorderings of `--to`
/// (so pins survive them), and the cookie does not show the address. It is not secret: the
/// hash has no key, so whoever can guess the node addresses (a private range and a few
/// ports) can test guesses against a cookie. A key would have to be shared by every
/// instance and kept across restarts for the names to stay stable; an operator who needs
/// the cookie to tell nothing names the nodes (`NAME=HOST:PORT`), as with HAProxy's
/// `cookie` values.
pub fn stable_name(addr: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in addr.trim().to_ascii_lowercase().bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("n-{:06x}", h >> 40)
}

fn resolve(addr: &str) -> Result<SocketAddr, String> {
    addr.to_socket_addrs()
        .map_err(|e| format!("cannot resolve {addr}: {e}"))?
        .next()
        .ok_or_else(|| format!("{addr} resolves to no address"))
}

impl ProxyArgs {
    /// The config these arguments describe. Resolves node host names once, now (like
    /// HAProxy's default `init-addr`): a node's address never changes while limpet runs.
    pub fn to_config(&self) -> Result<ProxyConfig, String> {
        let nodes = self
            .to
            .iter()
            .map(|t| {
                Ok(NodeConfig {
                    name: t.name.clone().unwrap_or_else(|| stable_name(&t.addr)),
                    addr: resolve(&t.addr)?,
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        let mut cfg = ProxyConfig::new(nodes);
        cfg.sticky = match self.sticky {
            StickyArg::None => Sticky::None,
            StickyArg::Cookie => Sticky::Cookie(CookieConfig {
                spec: CookieSpec {
                    name: self.cookie.as_str().into(),
                    ..CookieSpec::proxy_default()
                },
                ..CookieConfig::default()
            }),
        };
        cfg.trusted_proxies = self.trust_proxy.clone();
        cfg.health.fail_timeout_ms = crate::clock::ms(self.fail_timeout);
        cfg.health.max_slow_answers = self.max_slow_answers;
        if self.upstream_idle.is_zero() {
            return Err("--upstream-idle must be more than 0".into());
        }
        cfg.timeouts.upstream_idle = self.upstream_idle;
        cfg.validate().map_err(|e| e.0)?;
        Ok(cfg)
    }
}

/// Runs `limpet proxy` to completion. Tracing is set up by the caller (the binary).
pub fn run(args: ProxyArgs) -> ExitCode {
    let cfg = match args.to_config() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("limpet proxy: {e}");
            return ExitCode::from(2);
        }
    };
    let rt = match crate::runtime::tokio_runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("limpet proxy: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let workers = crate::runtime::workers::count(args.threads);
    for n in &cfg.nodes {
        tracing::info!(node = %n.name, addr = %n.addr, "node");
    }
    rt.block_on(async move {
        if workers > 1 {
            return serve_on_workers(cfg, &args.listen, workers).await;
        }
        crate::runtime::workers::keep_a_timer_due();
        let listener = match tokio::net::TcpListener::bind(&args.listen).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("limpet proxy: cannot listen on {}: {e}", args.listen);
                return ExitCode::from(2);
            }
        };
        // What the bound address decides (a node at the proxy's own address) is refused
        // before `listening on`, which scripts wait for.
        if let Ok(Err(e)) = listener.local_addr().map(|a| cfg.to_config(a)) {
            eprintln!("limpet proxy: invalid proxy configuration: {e}");
            return ExitCode::from(2);
        }
        let local = listener
            .local_addr()
            .map_or_else(|_| args.listen.clone(), |a| a.to_string());
        say_listening(&local);
        let shutdown = async {
            stop_signal().await;
            tracing::info!("shutting down: draining connections");
        };
        match serve(cfg, listener, shutdown).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("limpet proxy: {e}");
                ExitCode::from(2)
            }
        }
    })
}

/// `listening on ADDR` on stdout, at once (scripts wait for it).
fn say_listening(local: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "listening on {local}");
    let _ = out.flush();
}

/// `limpet proxy --threads N` (N > 1): the listener served by N worker threads, each with its
/// own `SO_REUSEPORT` socket (`crate::runtime::workers`); this thread waits for the signal.
async fn serve_on_workers(cfg: ProxyConfig, listen: &str, workers: usize) -> ExitCode {
    let addrs: Vec<SocketAddr> = match tokio::net::lookup_host(listen).await {
        Ok(a) => a.collect(),
        Err(_) => Vec::new(),
    };
    // As `TcpListener::bind`: the first address that binds.
    let mut bound = Err(std::io::Error::new(
        std::io::ErrorKind::AddrNotAvailable,
        "no such address",
    ));
    let mut addr = SocketAddr::from(([127, 0, 0, 1], 0));
    for a in addrs {
        addr = a;
        bound = crate::runtime::workers::refuse_if_listened(a)
            .and_then(|()| crate::runtime::workers::bind_reuseport(a, workers));
        if bound.is_ok() {
            break;
        }
    }
    let sockets = match bound {
        Ok(s) => s,
        Err(e) => {
            eprintln!("limpet proxy: cannot listen on {listen}: {e}");
            return ExitCode::from(2);
        }
    };
    let local = sockets
        .first()
        .and_then(|l| l.local_addr().ok())
        .unwrap_or(addr);
    let runtime = match super::runtime_of(cfg, local) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("limpet proxy: {e}");
            return ExitCode::from(2);
        }
    };
    let sockets = crate::runtime::workers::Sockets {
        name: super::QUICK_LISTENER.to_owned(),
        mode: crate::config::Mode::Http,
        local,
        per_worker: sockets,
        permits: crate::runtime::listener_permits(&runtime, super::QUICK_LISTENER),
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (_go, go) = tokio::sync::watch::channel(true);
    let done = match crate::runtime::workers::spawn(&runtime, vec![sockets], workers, &go, &stop_rx)
    {
        Ok(d) => d,
        Err(e) => {
            eprintln!("limpet proxy: cannot start worker threads: {e}");
            return ExitCode::FAILURE;
        }
    };
    say_listening(&local.to_string());
    stop_signal().await;
    tracing::info!("shutting down: draining connections");
    let _ = stop_tx.send(true);
    let _ = done.await;
    ExitCode::SUCCESS
}

/// Ctrl-C, or SIGTERM (what service managers and `kill` send).
pub(crate) async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_names_are_stable_and_opaque() {
        assert_eq!(stable_name("10.0.0.1:80"), stable_name("10.0.0.1:80"));
        assert_ne!(stable_name("10.0.0.1:80"), stable_name("10.0.0.2:80"));
        let n = stable_name("10.0.0.1:80");
        assert!(n.starts_with("n-") && n.len() == 8, "{n}");
        assert!(!n.contains("10.0"));
        // Fixed seed: this value must never change, or every pin in the field breaks.
        assert_eq!(
            stable_name("127.0.0.1:9001"),
            stable_name(" 127.0.0.1:9001 ")
        );
    }

    #[test]
    fn targets_parse() {
        assert_eq!(
            parse_target("a=127.0.0.1:80"),
            Ok(Target {
                name: Some("a".into()),
                addr: "127.0.0.1:80".into()
            })
        );
        assert!(parse_target("127.0.0.1").is_err());
        assert!(parse_target("a;b=127.0.0.1:80").is_err());
        assert!(parse_target("x:99999").is_err());
        assert!(parse_target("[::1]:80").is_ok());
    }
}
