//! Validated listener settings: the affinity cookie, limits, timeouts, trusted networks.
//!
//! Plain data, no I/O: addresses are already resolved, durations already parsed. A config
//! file (`limpet run`) and quick mode (`limpet proxy`) both fill these types; the proxy reads
//! them. They live with the configuration so that the configuration depends on nothing that
//! runs.

use std::net::IpAddr;
use std::time::Duration;

use limpet_core::{CookieCodec, CookieSpec, SignedCodec, Topology};

/// A configuration that cannot run, with the reason in words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

/// The affinity cookie: how it is written, how its value encodes a node, whether the node
/// sees it.
#[derive(Debug, Clone)]
pub struct CookieConfig {
    pub spec: CookieSpec,
    pub mode: CookieMode,
    /// Forward the affinity cookie to the node (default: stripped, the node never sees it).
    pub keep_in_request: bool,
    /// Whether sessions moved off their node go back to it once it is UP again.
    pub failback: Failback,
}

/// The failback policy of a cookie (issue 4): what happens to a session re-pinned away from
/// its node when that node comes back UP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Failback {
    /// The session stays where it was moved (moving it twice costs it twice).
    #[default]
    None,
    /// The re-pinning answer also sets `<name>-home=<original node>`; once that node is UP
    /// again, the next request goes home, re-pins there and expires the home cookie.
    Home,
}

impl CookieConfig {
    /// The codec of this mode, built for `pool`.
    pub fn codec(&self, pool: &Topology) -> Result<CookieCodec, ConfigError> {
        let codec = match &self.mode {
            CookieMode::Name => CookieCodec::Name,
            CookieMode::Signed {
                keys,
                max_idle,
                max_lifetime,
            } => SignedCodec::new(keys, *max_idle, *max_lifetime, pool)
                .map(CookieCodec::Signed)
                .map_err(|e| ConfigError(e.to_string()))?,
        };
        // A cookie with a `Max-Age` is set again before it lapses while its session is active.
        Ok(codec.renewed_within(self.spec.max_age))
    }
}

impl Default for CookieConfig {
    fn default() -> Self {
        CookieConfig {
            spec: CookieSpec::proxy_default(),
            mode: CookieMode::Name,
            keep_in_request: false,
            failback: Failback::None,
        }
    }
}

/// How a cookie value encodes a node (`limpet_core::codec`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum CookieMode {
    /// The node's configured name, verbatim.
    #[default]
    Name,
    /// An opaque token authenticated under `keys[0]` (all keys verify, for rotation), with a
    /// sliding idle limit and a max lifetime.
    Signed {
        keys: Vec<Vec<u8>>,
        max_idle: Duration,
        max_lifetime: Duration,
    },
}

/// Size and count limits. Defaults follow common practice (nginx/HAProxy order of magnitude).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest request head (request line plus headers) in bytes: 431 above it. Also the
    /// HTTP/2 header list limit.
    pub max_header_bytes: usize,
    /// Most header fields in one HTTP/1 request head: 431 above it.
    pub max_headers: usize,
    /// Longest request target (path and query) in bytes: 414 above it. A target longer than
    /// `max_header_bytes` does not fit the read buffer and is answered 431 by hyper.
    pub max_uri_bytes: usize,
    /// Client connections served at once; further connections wait in the kernel backlog.
    pub max_client_connections: usize,
    /// Concurrent HTTP/2 streams per client connection (HAProxy's
    /// `tune.h2.max-concurrent-streams`, 100). Each stream holds at most one node connection,
    /// so this also bounds the node connections one client connection can hold.
    pub h2_max_concurrent_streams: u32,
    /// Idle keep-alive connections kept per node.
    pub max_idle_per_node: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_header_bytes: 64 * 1024,
            max_headers: 100,
            max_uri_bytes: 8 * 1024,
            max_client_connections: 10_000,
            h2_max_concurrent_streams: 100,
            // A bound, not a target: the pool only keeps connections that were in use, so it
            // follows demand. 64 made HTTP/2 clients with 100+ streams in flight open and
            // close a node connection for most requests.
            max_idle_per_node: 1024,
        }
    }
}

/// Timeouts. `None` disables one where that makes sense.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// From the moment a connection waits for a request head until the whole head arrived
    /// (slow-loris). On HTTP/1 this clock starts as soon as the connection is idle (the end
    /// of the last answer), so it also bounds the idle time between keep-alive requests.
    pub header_read: Duration,
    /// A client connection with no request in flight for this long is closed.
    pub keep_alive_idle: Duration,
    /// Establishing a TCP connection to a node.
    pub connect: Duration,
    /// From sending a request to a node until its answer head arrives: 504 after it.
    pub upstream_answer: Duration,
    /// The longest the client may leave limpet waiting in the middle of an exchange
    /// (HAProxy's `timeout client`): for the next bytes of a request body it announced (then
    /// 408, and the node connection is closed), or to take the next bytes of an answer
    /// (a write to it blocked this long closes the connection). Tunnels use `tunnel_idle`.
    pub client_idle: Duration,
    /// While an answer body is being relayed, the longest wait for the node's next bytes: the
    /// answer is cut and the node connection closed (HAProxy's `timeout server`).
    pub answer_body_idle: Duration,
    /// An upgraded tunnel (WebSocket) with no bytes either way for this long is closed, and
    /// so is one where either direction has bytes it could not write for this long (a peer
    /// that stopped reading). See [`crate::relay`].
    pub tunnel_idle: Duration,
    /// How long a request or session waits for a slot of a node at its `max_connections`
    /// (HAProxy's `timeout queue`; unset, the `connect` timeout, as in HAProxy): 503 after it.
    pub queue: Duration,
    /// An idle pooled connection to a node older than this is not reused, and is closed.
    /// Keep it below the node's own keep-alive timeout, with a margin (limpet counts from
    /// the end of the answer it read, the node from its last write): a request sent on a
    /// connection the node is closing at that moment is lost (a POST cannot be replayed).
    /// The default, 4 s, is a second below the 5 s of Node.js and Apache (HAProxy purges
    /// idle server connections every 5 s, nginx keeps them 60 s).
    pub upstream_idle: Duration,
    /// On shutdown, how long in-flight connections get to finish before being cut.
    pub drain: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            header_read: Duration::from_secs(15),
            keep_alive_idle: Duration::from_secs(60),
            connect: Duration::from_secs(3),
            upstream_answer: Duration::from_secs(60),
            client_idle: Duration::from_secs(60),
            answer_body_idle: Duration::from_secs(60),
            tunnel_idle: Duration::from_secs(300),
            queue: Duration::from_secs(3),
            upstream_idle: Duration::from_secs(4),
            drain: Duration::from_secs(10),
        }
    }
}

/// An address range in CIDR notation (`10.0.0.0/8`, `::1/128`, or a bare address).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpNet {
    addr: IpAddr,
    prefix: u8,
}

impl IpNet {
    pub fn contains(&self, ip: IpAddr) -> bool {
        // An IPv4 peer on a dual-stack socket shows up as ::ffff:a.b.c.d.
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            // An IPv6 range holds the IPv4 peers its IPv4-mapped part covers: a range
            // written as the log prints a dual-stack socket's peer (`::ffff:10.0.0.5`,
            // `::ffff:10.0.0.0/104`) or one that covers them all (`::/0`). Compared as IPv6
            // only, it never matched, and a balancer's PROXY header was taken for data.
            (IpAddr::V6(net), ip) => {
                let ip = match ip {
                    IpAddr::V4(v4) => v4.to_ipv6_mapped(),
                    IpAddr::V6(v6) => v6,
                };
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            (IpAddr::V4(_), IpAddr::V6(_)) => false,
        }
    }
}

/// CIDR notation, which [`IpNet`]'s `FromStr` reads back (`limpet check` prints it).
impl std::fmt::Display for IpNet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl std::str::FromStr for IpNet {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || ConfigError(format!("{s:?} is not an address or CIDR range"));
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| bad())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p.parse::<u8>().map_err(|_| bad())?,
            None => max,
        };
        if prefix > max {
            return Err(bad());
        }
        Ok(IpNet { addr, prefix })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap_or_else(|e| panic!("{e}"))
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn cidr_ranges_match() {
        assert!(net("10.0.0.0/8").contains(ip("10.1.2.3")));
        assert!(!net("10.0.0.0/8").contains(ip("11.0.0.1")));
        assert!(net("127.0.0.1").contains(ip("127.0.0.1")));
        assert!(net("127.0.0.1").contains(ip("::ffff:127.0.0.1")));
        assert!(net("0.0.0.0/0").contains(ip("1.2.3.4")));
        assert!(net("::1").contains(ip("::1")));
        assert!(!net("::1").contains(ip("127.0.0.1")));
        // IPv6 ranges of IPv4-mapped addresses hold the IPv4 peers they map.
        assert!(net("::ffff:127.0.0.1").contains(ip("127.0.0.1")));
        assert!(net("::ffff:127.0.0.1").contains(ip("::ffff:127.0.0.1")));
        assert!(net("::ffff:10.0.0.0/104").contains(ip("10.1.2.3")));
        assert!(!net("::ffff:10.0.0.0/104").contains(ip("11.0.0.1")));
        assert!(net("::/0").contains(ip("1.2.3.4")));
        assert!(!net("::ffff:127.0.0.1").contains(ip("127.0.0.2")));
        assert!("10.0.0.0/33".parse::<IpNet>().is_err());
        assert!("nope".parse::<IpNet>().is_err());
    }
}
