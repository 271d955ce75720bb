//! Who may write through the admin API, and the start-up rule that an admin listener off
//! loopback has a token. Also the cross-site rule ([`cross_site_refusal`]): a token is the
//! only guard off loopback, but on loopback without one, a page any browser on the
//! operator's machine opens could otherwise post to the API.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

/// The admin listener's default address: loopback only.
pub const DEFAULT_ADMIN_LISTEN: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 9900);

/// The admin listener's settings.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminSettings {
    pub listen: SocketAddr,
    /// The bearer token writes must carry. Required off loopback.
    pub token: Option<String>,
    /// Names the listener is reached by (lowercase, no port), besides IP addresses and
    /// `localhost`: a request without the token is answered only when its `Host` is one of
    /// these (DNS rebinding: see `rebinding_refusal`).
    pub hosts: Vec<String>,
    /// Where the operator's node states are kept across restarts
    /// (`crate::runtime::node_states`); `None`: they last as long as the process.
    pub state_file: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for AdminSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminSettings")
            .field("listen", &self.listen)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("hosts", &self.hosts)
            .field("state_file", &self.state_file)
            .finish()
    }
}

impl Default for AdminSettings {
    fn default() -> Self {
        AdminSettings {
            listen: DEFAULT_ADMIN_LISTEN,
            token: None,
            hosts: Vec::new(),
            state_file: None,
        }
    }
}

/// Why limpet refuses these admin settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminSettingsError {
    /// The listener is reachable beyond this machine and nothing guards its writes.
    TokenRequired(SocketAddr),
    /// An empty token, or one with characters a header cannot carry.
    BadToken,
}

impl std::fmt::Display for AdminSettingsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AdminSettingsError::TokenRequired(a) => write!(
                f,
                "admin listener {a} is not on loopback: set an admin token (writes need `Authorization: Bearer <token>`)"
            ),
            AdminSettingsError::BadToken => f.write_str(
                "the admin token must be 16 to 256 visible ASCII characters (no spaces)",
            ),
        }
    }
}

impl std::error::Error for AdminSettingsError {}

impl AdminSettings {
    /// The start-up check: a listener off loopback must have a token, and a token must be
    /// usable in a header.
    pub fn validate(&self) -> Result<(), AdminSettingsError> {
        match &self.token {
            Some(t) => {
                let ok = (16..=256).contains(&t.len()) && t.bytes().all(|b| b.is_ascii_graphic());
                if !ok {
                    return Err(AdminSettingsError::BadToken);
                }
            }
            None if !self.listen.ip().is_loopback() => {
                return Err(AdminSettingsError::TokenRequired(self.listen));
            }
            None => {}
        }
        Ok(())
    }

    /// Whether a write carrying this `Authorization` header value may proceed.
    pub fn authorizes(&self, header: Option<&[u8]>) -> bool {
        let Some(token) = &self.token else {
            // Only reachable on loopback (validate refuses the rest).
            return true;
        };
        let Some(h) = header else { return false };
        // The scheme is case-insensitive (RFC 9110 11.1), and at least one space follows it.
        let Some((scheme, rest)) = h.split_first_chunk::<7>() else {
            return false;
        };
        if !scheme.eq_ignore_ascii_case(b"bearer ") {
            return false;
        }
        let given = rest.trim_ascii();
        constant_time_eq(given, token.as_bytes())
    }
}

/// Why a write must be refused as cross-site, if it must. Browsers can send a `POST` to any
/// address without asking (a "simple" request: `text/plain`, form encodings) and without
/// the page being able to read the answer; they cannot send other content types or methods
/// without a CORS preflight, which the admin API never approves. So:
/// - a `POST` must carry `Content-Type: application/json` (the stats page sends it);
/// - an `Origin` header, when present, must be this listener's own (`http://` + the `Host`
///   the request was sent to); `Origin: null` (sandboxed pages, some redirects) is refused;
/// - `Sec-Fetch-Site`, when present, must be `same-origin` or `none` (typed by the user).
///
/// Clients that are not browsers (curl, scripts) send none of these headers and are not
/// affected beyond the content type.
pub(crate) fn cross_site_refusal(
    method: &http::Method,
    headers: &http::HeaderMap,
) -> Option<&'static str> {
    use http::header;
    if method == http::Method::POST {
        let json = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"));
        if !json {
            return Some("writes need `Content-Type: application/json`");
        }
    }
    if let Some(site) = headers.get("sec-fetch-site") {
        let ok = site.as_bytes().eq_ignore_ascii_case(b"same-origin")
            || site.as_bytes().eq_ignore_ascii_case(b"none");
        if !ok {
            return Some("cross-site writes are refused");
        }
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let own = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .zip(origin.to_str().ok())
            .is_some_and(|(host, origin)| {
                origin
                    .strip_prefix("http://")
                    .is_some_and(|o| o.eq_ignore_ascii_case(host))
            });
        if !own {
            return Some("cross-site writes are refused");
        }
    }
    None
}

/// What answers a request without the token is where the listener runs: loopback, or a
/// management network. DNS rebinding would turn that into trust in any web page an operator
/// opens (a name the attacker controls resolves to the listener's address, and the browser
/// then calls the page "same origin": it can read node addresses, traffic, and, without a
/// token, write). So a request without the token is answered only when addressed by an IP
/// literal, `localhost` or a name the operator lists (`[admin] hosts`) in `Host`; anything
/// else is refused before it is read (Kubernetes, Jupyter and Docker do the same). A request
/// with the token is what a rebound page cannot send, whatever its `Host`.
pub(crate) fn rebinding_refusal(
    headers: &http::HeaderMap,
    hosts: &[String],
) -> Option<&'static str> {
    let Some(host) = headers.get(http::header::HOST) else {
        // HTTP/1.0 without Host: no browser sends that.
        return None;
    };
    let host = host.to_str().unwrap_or("");
    // Strip the port: `[::1]:9900`, `127.0.0.1:9900`, `localhost:9900`.
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(n, _)| n),
    };
    let name = name.strip_suffix('.').unwrap_or(name);
    let known = name.eq_ignore_ascii_case("localhost")
        || name.parse::<std::net::IpAddr>().is_ok()
        || hosts.iter().any(|h| h.eq_ignore_ascii_case(name));
    (!known).then_some(
        "the admin listener answers a request without its token only when sent to an IP address, localhost or a name in `[admin] hosts`",
    )
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(listen: &str, token: Option<&str>) -> AdminSettings {
        AdminSettings {
            listen: listen.parse().unwrap_or(DEFAULT_ADMIN_LISTEN),
            token: token.map(str::to_owned),
            hosts: Vec::new(),
            state_file: None,
        }
    }

    #[test]
    fn a_request_without_the_token_is_answered_at_ip_literals_localhost_and_listed_names_only() {
        let hosts = vec!["lb1.example.net".to_owned()];
        let with_host = |h: &str| {
            let mut m = http::HeaderMap::new();
            m.insert(
                http::header::HOST,
                http::HeaderValue::from_str(h).unwrap_or(http::HeaderValue::from_static("x")),
            );
            rebinding_refusal(&m, &hosts)
        };
        for ok in [
            "lb1.example.net:9900",
            "LB1.Example.NET",
            "lb1.example.net.:9900",
            "localhost.",
        ] {
            assert_eq!(with_host(ok), None, "{ok}");
        }
        assert!(with_host("lb2.example.net:9900").is_some());
        assert!(with_host("lb1.example.net.evil.example").is_some());
        for ok in [
            "127.0.0.1:9900",
            "localhost:9900",
            "[::1]:9900",
            "LOCALHOST",
            "10.1.2.3",
        ] {
            assert_eq!(with_host(ok), None, "{ok}");
        }
        for bad in [
            "evil.example:9900",
            "evil.example",
            "127.0.0.1.nip.io:9900",
            "[evil]:1",
        ] {
            assert!(with_host(bad).is_some(), "{bad}");
        }
        assert_eq!(rebinding_refusal(&http::HeaderMap::new(), &[]), None);
    }

    #[test]
    fn off_loopback_without_a_token_is_refused() {
        assert_eq!(
            settings("0.0.0.0:9900", None).validate(),
            Err(AdminSettingsError::TokenRequired(
                "0.0.0.0:9900".parse().unwrap_or(DEFAULT_ADMIN_LISTEN)
            ))
        );
        assert!(settings("[::]:9900", None).validate().is_err());
        assert!(settings("192.0.2.1:9900", None).validate().is_err());
        assert!(settings("127.0.0.1:9900", None).validate().is_ok());
        assert!(settings("[::1]:9900", None).validate().is_ok());
        assert!(settings("0.0.0.0:9900", Some("0123456789abcdef"))
            .validate()
            .is_ok());
        assert_eq!(
            settings("0.0.0.0:9900", Some("short")).validate(),
            Err(AdminSettingsError::BadToken)
        );
    }

    #[test]
    fn cross_site_writes_are_refused_same_origin_ones_pass() {
        use http::{HeaderMap, HeaderValue, Method};
        let h = |pairs: &[(&'static str, &'static str)]| {
            let mut m = HeaderMap::new();
            for (k, v) in pairs {
                m.append(*k, HeaderValue::from_static(v));
            }
            m
        };
        let json = ("content-type", "application/json");
        let host = ("host", "127.0.0.1:9900");
        assert_eq!(cross_site_refusal(&Method::POST, &h(&[json, host])), None);
        assert_eq!(
            cross_site_refusal(
                &Method::POST,
                &h(&[("content-type", "Application/JSON; charset=utf-8"), host])
            ),
            None
        );
        assert!(
            cross_site_refusal(&Method::POST, &h(&[("content-type", "text/plain"), host]))
                .is_some()
        );
        assert!(cross_site_refusal(&Method::POST, &h(&[host])).is_some());
        let same = ("origin", "http://127.0.0.1:9900");
        assert_eq!(
            cross_site_refusal(&Method::POST, &h(&[json, host, same])),
            None
        );
        let evil = ("origin", "http://evil.example");
        assert!(cross_site_refusal(&Method::POST, &h(&[json, host, evil])).is_some());
        assert!(cross_site_refusal(&Method::DELETE, &h(&[host, evil])).is_some());
        assert!(cross_site_refusal(&Method::POST, &h(&[json, host, ("origin", "null")])).is_some());
        for ok in ["same-origin", "none"] {
            let m = h(&[json, host, ("sec-fetch-site", ok)]);
            assert_eq!(cross_site_refusal(&Method::POST, &m), None, "{ok}");
        }
        for bad in ["cross-site", "same-site"] {
            let m = h(&[json, host, ("sec-fetch-site", bad)]);
            assert!(cross_site_refusal(&Method::POST, &m).is_some(), "{bad}");
        }
        assert_eq!(cross_site_refusal(&Method::DELETE, &h(&[host])), None);
    }

    #[test]
    fn writes_need_the_exact_bearer_token() {
        let s = settings("0.0.0.0:9900", Some("0123456789abcdef"));
        assert!(s.authorizes(Some(b"Bearer 0123456789abcdef")));
        assert!(!s.authorizes(Some(b"Bearer 0123456789abcdeF")));
        assert!(!s.authorizes(Some(b"0123456789abcdef")));
        assert!(s.authorizes(Some(b"bearer 0123456789abcdef")));
        assert!(s.authorizes(Some(b"BEARER  0123456789abcdef")));
        assert!(!s.authorizes(Some(b"Basic 0123456789abcdef")));
        assert!(!s.authorizes(Some(b"Bearer")));
        assert!(!s.authorizes(None));
        assert!(settings("127.0.0.1:1", None).authorizes(None));
    }
}
