//! `limpet.toml`: loading, validating, and the validated types the runtime runs.
//!
//! ```text
//!  file text ──► toml + serde (raw: mirrors the file, unknown keys refused) ──► RawConfig
//!      │            syntax/type errors: span ─► line:col, key path from the text, "did you mean"
//!      ▼
//!  validate: names unique and resolvable, tables exist, files read, TLS built ──► Config
//!      │            semantic errors: Spanned positions ─► file:line:col: key: message
//!      ▼
//!  runtime (limpet run) / printed summary (limpet check)
//! ```
//!
//! The model (see `docs/config.md`): **nodes** are declared once (name, address, weight);
//! **tables** are declared once (key, expire, size, snapshot); **listeners** bind addresses,
//! forward to `node_port` on every node, and name their affinity (cookie, table or both).
//! Affinity belongs to the node, so a pin made through one listener holds on every listener
//! that names the same table.
//!
//! Nothing here panics on any file; every problem is a [`ConfigError`].

mod error;
pub mod listener;
mod raw;
mod validate;

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use limpet_core::proxy_protocol;
use limpet_core::table::KeySpec;
use limpet_core::{Balance, HealthPolicy};

use crate::admin::AdminSettings;
use crate::health::CheckSpec;
pub use listener::{CookieConfig, CookieMode, Failback, IpNet, Limits, Timeouts};

pub use error::ConfigError;
pub use raw::parse_duration;

/// A validated configuration: everything [`crate::runtime`] needs, files already read.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it came from (for messages).
    pub path: PathBuf,
    /// In pool order: the order fresh round-robin assignments go through.
    pub nodes: Vec<NodeDef>,
    pub tables: Vec<TableDef>,
    pub listeners: Vec<ListenerDef>,
    /// Passive health (connection failures seen by traffic): fall and rise counts.
    pub health: HealthPolicy,
    /// Active checks, `[admin]`, `[drain]` (docs/admin.md, docs/operations.md).
    pub lifecycle: LifecycleDef,
}

/// A node: a machine, named once. Every listener reaches it at `addr:node_port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeDef {
    pub name: String,
    pub addr: IpAddr,
    pub weight: u32,
}

/// An affinity table, shared by name between listeners.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableDef {
    pub name: String,
    /// What the table is keyed on (the core's own type: source IP with prefixes, a header,
    /// an application cookie).
    pub key: KeySpec,
    /// Idle time after which an entry is gone; each use refreshes it.
    pub expire: Duration,
    /// Most entries; the least recently used goes first.
    pub size: u32,
    pub snapshot: Option<SnapshotDef>,
}

/// Where and how often a table is saved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotDef {
    pub path: PathBuf,
    /// Also save at this interval (not only on shutdown).
    pub interval: Option<Duration>,
}

/// What a listener speaks to clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Http,
    Tcp,
}

/// One listener: where it binds, what it speaks, where it forwards, how it pins.
#[derive(Debug, Clone)]
pub struct ListenerDef {
    pub name: String,
    pub bind: Vec<SocketAddr>,
    pub mode: Mode,
    /// The port on every node this listener forwards to.
    pub node_port: u16,
    /// Per node (pool order): the address this listener connects to. Built from the node's
    /// address and `node_port`; quick mode fills it with each node's own `HOST:PORT`.
    pub upstreams: Vec<SocketAddr>,
    pub balance: Balance,
    /// The affinity table this listener shares, by name.
    pub table: Option<String>,
    /// HTTP only: the limpet cookie (`None`: no cookie). Precedence: cookie first, then table.
    pub cookie: Option<CookieConfig>,
    /// TLS for clients.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// TLS to nodes.
    pub upstream_tls: Option<UpstreamTls>,
    pub proxy_protocol: ProxyProtocolDef,
    pub timeouts: Timeouts,
    pub tcp: TcpDef,
    /// Peers whose `X-Forwarded-For` is extended rather than replaced (HTTP).
    pub trusted_proxies: Vec<IpNet>,
    pub limits: Limits,
    /// Seconds announced in `Retry-After` when no node can take a request (HTTP).
    pub retry_after_secs: u32,
}

/// TLS from a listener to its nodes.
#[derive(Debug, Clone)]
pub struct UpstreamTls {
    pub config: Arc<rustls::ClientConfig>,
    /// SNI and verification name; `None`: the node's IP address.
    pub server_name: Option<String>,
}

/// PROXY protocol on a listener.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProxyProtocolDef {
    /// Peers whose PROXY header is read (the real client address replaces theirs). From any
    /// other peer, bytes are never parsed as a header: they are payload.
    pub accept_from: Vec<IpNet>,
    /// Send a header of this version first on every connection to a node.
    pub send: Option<proxy_protocol::Version>,
    /// How long a trusted peer has to send its header.
    pub header_timeout: Duration,
}

/// TCP-mode settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpDef {
    /// A session with no bytes either way for this long is closed.
    pub idle: Duration,
    /// Close a node's open sessions the moment it goes DOWN or MAINT.
    pub close_on_node_down: bool,
}

impl Default for TcpDef {
    fn default() -> Self {
        TcpDef {
            idle: Duration::from_secs(300),
            close_on_node_down: true,
        }
    }
}

impl Config {
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: path.to_owned(),
            line: 0,
            column: 0,
            key: String::new(),
            message: format!("cannot read: {e}"),
        })?;
        Self::from_text(path, &text)
    }

    /// Validates config text; `path` names it in errors and anchors relative file paths
    /// (certificates, snapshots) at its directory.
    pub fn from_text(path: &Path, text: &str) -> Result<Config, ConfigError> {
        validate::validate(path, text)
    }

    pub fn table(&self, name: &str) -> Option<&TableDef> {
        self.tables.iter().find(|t| t.name == name)
    }

    /// One line per item, for `limpet check`.
    pub fn summary(&self) -> String {
        use std::fmt::Write as _;
        let mut s = String::new();
        for n in &self.nodes {
            let _ = writeln!(s, "node {} {} weight {}", n.name, n.addr, n.weight);
        }
        for t in &self.tables {
            let key = match &t.key {
                KeySpec::SourceIp(p) => format!("source-ip /{} /{}", p.v4(), p.v6()),
                KeySpec::Header(h) => format!("header {h}"),
                KeySpec::AppCookie(c) => format!("app-cookie {c}"),
            };
            let _ = writeln!(
                s,
                "table {} key {key} expire {}s size {}{}",
                t.name,
                t.expire.as_secs(),
                t.size,
                t.snapshot
                    .as_ref()
                    .map_or(String::new(), |p| format!(" snapshot {}", p.path.display()))
            );
        }
        for l in &self.listeners {
            let binds: Vec<String> = l.bind.iter().map(ToString::to_string).collect();
            let _ = writeln!(
                s,
                "listener {} {} {}{} -> node port {}{}; affinity: {}",
                l.name,
                binds.join(","),
                match l.mode {
                    Mode::Http => "http",
                    Mode::Tcp => "tcp",
                },
                if l.tls.is_some() { "+tls" } else { "" },
                l.node_port,
                if l.upstream_tls.is_some() {
                    " (tls)"
                } else {
                    ""
                },
                match (&l.cookie, &l.table) {
                    (Some(c), Some(t)) => format!("cookie {} then table {t}", c.spec.name),
                    (Some(c), None) => format!("cookie {}", c.spec.name),
                    (None, Some(t)) => format!("table {t}"),
                    (None, None) => "none".to_owned(),
                }
            );
        }
        s
    }
}

/// The lifecycle settings of a configuration (`[admin]`, `[drain]`, checks).
#[derive(Debug, Clone)]
pub struct LifecycleDef {
    /// The admin listener, when `[admin]` is configured.
    pub admin: Option<AdminSettings>,
    /// The re-pin window after a drain deadline when the operator gives none.
    pub drain_spread: Duration,
    /// A drain is complete once no session was seen on the node for this long (and nothing
    /// is open to it).
    pub drain_idle: Duration,
    /// The window of "distinct sessions seen".
    pub seen_window: Duration,
    /// Active checks: (node name, check).
    pub checks: Vec<(String, CheckSpec)>,
}

impl Default for LifecycleDef {
    fn default() -> Self {
        LifecycleDef {
            admin: None,
            drain_spread: Duration::from_secs(60),
            drain_idle: Duration::from_secs(60),
            seen_window: Duration::from_secs(600),
            checks: Vec::new(),
        }
    }
}
