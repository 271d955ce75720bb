//! The session origin: the one place a jar takes cookies from and sends them to.

use std::fmt;

use url::{Host, Url};

/// A scheme-host-port triple, the unit the jar is scoped to.
///
/// `ws` is the same origin as `http` and `wss` the same as `https` (with the same default
/// ports), because the WebSocket upgrade is an HTTP request to the same server: a cookie the
/// balancer sets on `https://app.example` must go on the upgrade to `wss://app.example/socket`
/// and the other way round. Hosts are compared after the URL parser's normalisation
/// (lower-case, IDNA to punycode, IPv6 in brackets).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Origin {
    secure: bool,
    host: String,
    is_ip: bool,
    port: u16,
}

/// Why a URL cannot be an [`Origin`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OriginError {
    /// The text is not a URL.
    Invalid(url::ParseError),
    /// Only `http`, `https`, `ws` and `wss` are origins a balancer answers on.
    UnsupportedScheme(String),
    /// The URL has no host.
    NoHost,
}

impl fmt::Display for OriginError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Invalid(e) => write!(f, "not a URL: {e}"),
            Self::UnsupportedScheme(s) => write!(f, "unsupported scheme {s:?}"),
            Self::NoHost => f.write_str("URL has no host"),
        }
    }
}

impl std::error::Error for OriginError {}

impl Origin {
    /// The origin of a URL such as `https://app.example/api` or `ws://127.0.0.1:8080/socket`.
    pub fn parse(url: &str) -> Result<Self, OriginError> {
        Self::from_url(&Url::parse(url).map_err(OriginError::Invalid)?)
    }

    /// The origin of a parsed URL; the path, query and user info are not part of it.
    pub fn from_url(url: &Url) -> Result<Self, OriginError> {
        let secure = match url.scheme() {
            "http" | "ws" => false,
            "https" | "wss" => true,
            other => return Err(OriginError::UnsupportedScheme(other.to_owned())),
        };
        let (host, is_ip) = match url.host() {
            Some(Host::Domain(d)) => (d.to_ascii_lowercase(), false),
            Some(Host::Ipv4(a)) => (a.to_string(), true),
            Some(Host::Ipv6(a)) => (format!("[{a}]"), true),
            None => return Err(OriginError::NoHost),
        };
        // The four accepted schemes all have a known default port.
        let port = url
            .port_or_known_default()
            .unwrap_or(if secure { 443 } else { 80 });
        Ok(Origin {
            secure,
            host,
            is_ip,
            port,
        })
    }

    /// Whether the origin is `https`/`wss`, the only kind that may hold `Secure` cookies.
    pub fn is_secure(&self) -> bool {
        self.secure
    }

    /// The normalised host (IPv6 in brackets).
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The port, explicit or the scheme's default.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// RFC 6265 §5.1.3 domain-match of this origin's host against a `Domain` attribute value
    /// (leading dot already removed): identical, or a subdomain of it when the host is a name
    /// (an IP address only matches itself).
    pub(crate) fn domain_matches(&self, domain: &str) -> bool {
        let domain = domain.to_ascii_lowercase();
        if self.host == domain {
            return true;
        }
        !self.is_ip
            && self
                .host
                .strip_suffix(domain.as_str())
                .is_some_and(|rest| rest.ends_with('.'))
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.secure { "https" } else { "http" };
        write!(f, "{scheme}://{}:{}", self.host, self.port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin(s: &str) -> Origin {
        Origin::parse(s).expect("valid origin")
    }

    #[test]
    fn websocket_schemes_share_the_http_origin() {
        assert_eq!(
            origin("ws://app.example/socket"),
            origin("http://app.example/")
        );
        assert_eq!(
            origin("wss://app.example/socket"),
            origin("https://app.example:443/x")
        );
        assert_ne!(
            origin("https://app.example"),
            origin("http://app.example:443")
        );
    }

    #[test]
    fn host_is_normalised_and_port_defaults() {
        let o = origin("HTTPS://App.Example/Path?q#f");
        assert_eq!(
            (o.host(), o.port(), o.is_secure()),
            ("app.example", 443, true)
        );
        assert_eq!(origin("http://[::1]:8080/").host(), "[::1]");
        assert_eq!(
            origin("http://127.0.0.1:9/").to_string(),
            "http://127.0.0.1:9"
        );
    }

    #[test]
    fn rejects_non_web_urls() {
        assert!(matches!(
            Origin::parse("ftp://x.example"),
            Err(OriginError::UnsupportedScheme(_))
        ));
        assert!(matches!(
            Origin::parse("nonsense"),
            Err(OriginError::Invalid(_))
        ));
    }

    #[test]
    fn domain_match() {
        let o = origin("https://app.example.com");
        assert!(o.domain_matches("app.example.com"));
        assert!(o.domain_matches("APP.example.com"));
        assert!(o.domain_matches("example.com"));
        assert!(!o.domain_matches("xample.com"));
        assert!(!o.domain_matches("other.example.com"));
        assert!(!o.domain_matches("sub.app.example.com"));
        let ip = origin("http://10.0.0.1");
        assert!(ip.domain_matches("10.0.0.1"));
        assert!(!ip.domain_matches("0.0.1"));
    }
}
