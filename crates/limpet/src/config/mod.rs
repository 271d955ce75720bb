//! `limpet.toml`: loading, validating, and the validated types the runtime runs.
//!
//! ```text
//!  file text ──► toml + serde (raw: mirrors the file, unknown keys refused) ──► RawConfig
//!      │            syntax/type errors: span ─► line:col, key path from the text, "did you mean"
//!      │            (a near-typo, or the limpet key for an HAProxy/nginx name: hints.rs)
//!      ▼
//!  validate: names unique and resolvable, tables exist, files read, TLS built ──► Config
//!      │            semantic errors: Spanned positions ─► file:line:col: key: message
//!      ▼
//!  runtime (limpet run) / render: written back as TOML, defaults included (limpet check)
//! ```
//!
//! The model (see `docs/config.md`): **nodes** are declared once (name, address, weight);
//! **tables** are declared once (key, expire, size, snapshot); **listeners** bind addresses,
//! forward to `node_port` on every node (or, with `node_port = "same"`, to the port the client
//! connected to), and name their affinity (cookie, table or both).
//! Affinity belongs to the node, so a pin made through one listener holds on every listener
//! that names the same table.
//!
//! Nothing here panics on any file; every problem is a [`ConfigError`].

mod diff;
mod error;
mod hints;
pub mod listener;
mod raw;
mod render;
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

pub use diff::setting_changes;
pub use error::{ConfigError, Places};
pub use raw::{parse_duration, parse_size};
pub use render::REDACTED;

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
    /// `[store]`: where shared tables go (fleet mode).
    pub store: Option<StoreDef>,
    /// The configuration as `limpet check` lists it (every default written out, secrets
    /// redacted): what a reload compares ([`setting_changes`]). Empty for a configuration
    /// not read from a file (quick mode, the demo).
    pub listing: String,
    /// Where the keys a reload compares after validation are written (listeners' `name`,
    /// `bind` and `mode`), so its refusals name file, line and key. Empty when not from a file.
    pub places: Places,
}

/// A node: a machine, named once. Every listener reaches it at `addr:node_port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeDef {
    pub name: String,
    pub addr: IpAddr,
    pub weight: u32,
    /// Connections open to the node at once over every listener (`None`: no limit); more
    /// wait in the node's queue (HAProxy's `maxconn`).
    pub max_connections: Option<u32>,
    /// How many may wait in that queue (HAProxy's `maxqueue`); more are refused at once.
    pub max_queue: u32,
}

/// The default `max_queue` of a node with `max_connections`.
pub const DEFAULT_MAX_QUEUE: u32 = 1024;

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
    /// Pins go through the `[store]` too, shared with every instance of the fleet.
    pub shared: bool,
}

/// `[store]`: the Redis or Valkey server shared tables go through (docs/fleet.md).
#[derive(Clone, PartialEq, Eq)]
pub struct StoreDef {
    /// `redis://[user:password@]host:port/db` or `rediss://` (TLS). Holds the password:
    /// never logged, printed redacted.
    pub url: String,
    /// Prefix of every key and of the invalidation channel (several fleets on one server).
    pub prefix: String,
    /// Longest wait for one store operation; past it the operation counts as failed.
    pub timeout: Duration,
    /// Longest wait for a connection to the store.
    pub connect_timeout: Duration,
}

impl StoreDef {
    /// The url with its password replaced by [`REDACTED`] (for logs, listings, the admin API).
    pub fn redacted_url(&self) -> String {
        match url::Url::parse(&self.url) {
            Ok(mut u) if u.password().is_some() => {
                let _ = u.set_password(Some(REDACTED));
                u.to_string()
            }
            _ => self.url.clone(),
        }
    }
}

impl std::fmt::Debug for StoreDef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreDef")
            .field("url", &self.redacted_url())
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
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
    /// The port on every node this listener forwards to; 0 when there is no one port:
    /// `node_port = "same"`, or quick mode (each node's own port, in `upstreams`).
    pub node_port: u16,
    /// Per node (pool order): the address this listener connects to. Built from the node's
    /// address and `node_port`; quick mode fills it with each node's own `HOST:PORT`.
    pub upstreams: Upstreams,
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

/// Where a listener connects for each node, in pool order: a fixed address per node, or (for
/// `node_port = "same"`) the node's IP with the port the client connected to, known only
/// per accepted connection. Collecting addresses gives fixed ones, as quick mode does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstreams {
    addrs: Vec<SocketAddr>,
    same_port: bool,
}

impl Upstreams {
    /// `node_port = "same"`: each node's IP, with the port of the connection being served.
    pub fn same_port(ips: impl IntoIterator<Item = IpAddr>) -> Self {
        Upstreams {
            addrs: ips.into_iter().map(|ip| SocketAddr::new(ip, 0)).collect(),
            same_port: true,
        }
    }

    /// Whether the port is the client's (`node_port = "same"`).
    pub fn is_same_port(&self) -> bool {
        self.same_port
    }

    /// The address for the node at `index` (pool order), for a client that connected to
    /// `local_port` on limpet.
    pub fn get(&self, index: usize, local_port: u16) -> Option<SocketAddr> {
        let a = *self.addrs.get(index)?;
        Some(if self.same_port {
            SocketAddr::new(a.ip(), local_port)
        } else {
            a
        })
    }

    /// Every node's address (pool order) for clients that connected to `local_port`.
    pub fn for_port(&self, local_port: u16) -> impl Iterator<Item = SocketAddr> + '_ {
        (0..self.addrs.len()).filter_map(move |i| self.get(i, local_port))
    }
}

impl FromIterator<SocketAddr> for Upstreams {
    fn from_iter<I: IntoIterator<Item = SocketAddr>>(iter: I) -> Self {
        Upstreams {
            addrs: iter.into_iter().collect(),
            same_port: false,
        }
    }
}

/// TLS from a listener to its nodes.
#[derive(Debug, Clone)]
pub struct UpstreamTls {
    pub config: Arc<rustls::ClientConfig>,
    /// What `config` trusts ([`crate::tls::client_config_trusting`]).
    pub trust: String,
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
    /// Close a node's open TCP sessions and tunnels the moment it goes DOWN (MAINT closes
    /// them whatever this says).
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
        Self::from_text(path, &read(path)?)
    }

    /// Validates config text; `path` names it in errors and anchors relative file paths
    /// (certificates, snapshots) at its directory.
    pub fn from_text(path: &Path, text: &str) -> Result<Config, ConfigError> {
        let (mut cfg, raw) = validate::validate(path, text)?;
        let dir = path.parent().map(Path::to_owned).unwrap_or_default();
        cfg.listing = render::render(&cfg, &raw, &dir);
        Ok(cfg)
    }

    /// `limpet check`: reads and validates a config file, and writes it back as it would
    /// run, in TOML that `limpet check` accepts again: every default written out, file paths
    /// absolute, secrets (admin token, cookie keys) replaced by [`REDACTED`].
    pub fn resolved_toml(path: &Path) -> Result<String, ConfigError> {
        Self::resolved_text(path, &read(path)?)
    }

    /// [`Config::resolved_toml`] of config text (`path` as for [`Config::from_text`]).
    pub fn resolved_text(path: &Path, text: &str) -> Result<String, ConfigError> {
        Self::from_text(path, text).map(|cfg| cfg.listing)
    }

    pub fn table(&self, name: &str) -> Option<&TableDef> {
        self.tables.iter().find(|t| t.name == name)
    }
}

/// The most a file the configuration names (the config itself, a certificate, a key, a CA)
/// may hold: far above any real one, and a bound on what a path to `/dev/zero`, or a file
/// that keeps growing, makes limpet read.
pub(crate) const MAX_FILE_BYTES: u64 = 16 << 20;

/// A file's bytes, at most [`MAX_FILE_BYTES`] of them: a longer file is an error.
/// Whether a connection to `node` comes back to a listener bound at `bind`: the same port,
/// at the address it binds, or at loopback (or the unspecified address, which reaches it)
/// when it binds every address. A config file's listener and `limpet proxy` refuse such a
/// node: each request would be forwarded to limpet again, until connections ran out.
pub(crate) fn loops_back(bind: SocketAddr, node: SocketAddr) -> bool {
    node.port() == bind.port()
        && (node.ip() == bind.ip()
            || (bind.ip().is_unspecified()
                && (node.ip().is_loopback() || node.ip().is_unspecified())))
}

pub(crate) fn read_bounded(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("longer than {} MiB", MAX_FILE_BYTES >> 20),
        ));
    }
    Ok(bytes)
}

/// A config file's text, or an error naming the file (and, for bytes that are not UTF-8,
/// where the first one is).
fn read(path: &Path) -> Result<String, ConfigError> {
    let at = |line, column, message| ConfigError {
        file: path.to_owned(),
        line,
        column,
        key: String::new(),
        message,
    };
    let bytes = read_bounded(path).map_err(|e| at(0, 0, format!("cannot read: {e}")))?;
    String::from_utf8(bytes).map_err(|e| {
        let valid = e.utf8_error().valid_up_to();
        let text = std::str::from_utf8(&e.as_bytes()[..valid]).unwrap_or_default();
        let (line, column) = error::line_col(text, valid);
        at(
            line,
            column,
            "not valid UTF-8 from here (a config file is UTF-8 text)".into(),
        )
    })
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
