//! The proxy's settings as plain data.
//!
//! Quick mode (`limpet proxy --to ...`) fills these types today; a config file fills the same
//! types later. Nothing here does I/O: addresses are already resolved, durations already parsed.
//! [`ProxyConfig::validate`] is the one place that checks them before [`serve`](super::serve)
//! builds its shared state.

use std::net::SocketAddr;

use limpet_core::{HealthPolicy, Pool};

pub use crate::config::listener::{
    ConfigError, CookieConfig, CookieMode, Failback, IpNet, Limits, Timeouts,
};

/// Everything the HTTP proxy needs to run one listener in front of one pool.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// The nodes, in pool order (the order fresh assignments rotate through).
    pub nodes: Vec<NodeConfig>,
    /// How clients are pinned to nodes.
    pub sticky: Sticky,
    /// Which peers may hand us `X-Forwarded-*` headers we extend rather than replace.
    pub trusted_proxies: Vec<IpNet>,
    pub limits: Limits,
    pub timeouts: Timeouts,
    /// Passive health: consecutive failures that take a node DOWN, successes that bring it UP.
    pub health: HealthPolicy,
    /// Seconds announced in `Retry-After` when no node can take a request.
    pub retry_after_secs: u32,
}

impl ProxyConfig {
    /// A config with the default limits, timeouts and cookie for these nodes.
    pub fn new(nodes: Vec<NodeConfig>) -> Self {
        ProxyConfig {
            nodes,
            sticky: Sticky::Cookie(CookieConfig::default()),
            trusted_proxies: Vec::new(),
            limits: Limits::default(),
            timeouts: Timeouts::default(),
            health: HealthPolicy::default(),
            retry_after_secs: 5,
        }
    }

    /// Checks what the types cannot: node names usable as cookie values and unique, a cookie
    /// name that is a token, limits hyper accepts.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.nodes.is_empty() {
            return Err(ConfigError("at least one node is needed".into()));
        }
        let pool = Pool::new(self.nodes.iter().map(|n| n.name.as_str()))
            .map_err(|e| ConfigError(e.to_string()))?;
        if let Sticky::Cookie(c) = &self.sticky {
            c.codec(&pool)?;
            if !limpet_core::cookie::is_cookie_name(c.spec.name.as_bytes()) {
                return Err(ConfigError(format!(
                    "cookie name {:?} is not a valid cookie name",
                    c.spec.name
                )));
            }
        }
        // hyper refuses (panics on) a read buffer below 8 KiB.
        if self.limits.max_header_bytes < 8192 {
            return Err(ConfigError("max header bytes must be at least 8192".into()));
        }
        if self.limits.max_client_connections == 0 {
            return Err(ConfigError(
                "max client connections must be at least 1".into(),
            ));
        }
        // As a config file's `health.fail_timeout`: at 0 a DOWN node's trial is due at once
        // (every request tries it), and `max_slow_answers` has no window to count in.
        if self.health.fail_timeout_ms < 100 {
            return Err(ConfigError("fail timeout must be at least 100 ms".into()));
        }
        Ok(())
    }
}

impl ProxyConfig {
    /// These settings as a one-listener config of the config-file types (listener `proxy`,
    /// HTTP, no table), so quick mode, the demo and config files all run on one runtime.
    /// Each node keeps its own address and port (`upstreams`).
    pub fn to_config(&self, bind: SocketAddr) -> Result<crate::config::Config, ConfigError> {
        use crate::config::{Config, ListenerDef, Mode, NodeDef, ProxyProtocolDef, TcpDef};
        self.validate()?;
        // A node at the proxy's own address (its port, on the address it listens on, or on
        // loopback when it listens on every address): each request would come back to it,
        // as a config file's listener is refused for (`node_port` at its own `bind`).
        if bind.port() != 0 {
            if let Some(n) = self
                .nodes
                .iter()
                .find(|n| crate::config::loops_back(bind, n.addr))
            {
                return Err(ConfigError(format!(
                    "node {:?} at {} is the proxy's own address {bind}: limpet would forward to itself",
                    n.name, n.addr
                )));
            }
        }
        let listener = ListenerDef {
            name: "proxy".into(),
            bind: vec![bind],
            mode: Mode::Http,
            node_port: 0,
            upstreams: self.nodes.iter().map(|n| n.addr).collect(),
            balance: limpet_core::Balance::RoundRobin,
            table: None,
            cookie: match &self.sticky {
                Sticky::Cookie(c) => Some(c.clone()),
                Sticky::None => None,
            },
            tls: None,
            upstream_tls: None,
            proxy_protocol: ProxyProtocolDef::default(),
            timeouts: self.timeouts,
            tcp: TcpDef::default(),
            trusted_proxies: self.trusted_proxies.clone(),
            limits: self.limits,
            retry_after_secs: self.retry_after_secs,
        };
        Ok(Config {
            path: "(command line)".into(),
            nodes: self
                .nodes
                .iter()
                .map(|n| NodeDef {
                    name: n.name.clone(),
                    addr: n.addr.ip(),
                    weight: 1,
                    max_connections: None,
                    max_queue: crate::config::DEFAULT_MAX_QUEUE,
                })
                .collect(),
            tables: Vec::new(),
            listeners: vec![listener],
            health: self.health,
            lifecycle: Default::default(),
            store: None,
            listing: String::new(),
            places: Default::default(),
        })
    }
}

/// One node: the name cookies carry, and the only address limpet will connect to for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeConfig {
    pub name: String,
    pub addr: SocketAddr,
}

/// How requests are pinned.
#[derive(Debug, Clone)]
pub enum Sticky {
    /// Cookie affinity (the default).
    Cookie(CookieConfig),
    /// Plain round-robin: every request is a fresh assignment, no cookie is read or written.
    None,
}
