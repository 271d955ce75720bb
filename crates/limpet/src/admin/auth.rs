//! Who may write through the admin API, and the start-up rule that an admin listener off
//! loopback has a token.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

/// The admin listener's default address: loopback only.
pub const DEFAULT_ADMIN_LISTEN: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 9900);

/// The admin listener's settings.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminSettings {
    pub listen: SocketAddr,
    /// The bearer token writes must carry. Required off loopback.
    pub token: Option<String>,
}

impl std::fmt::Debug for AdminSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminSettings")
            .field("listen", &self.listen)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl Default for AdminSettings {
    fn default() -> Self {
        AdminSettings {
            listen: DEFAULT_ADMIN_LISTEN,
            token: None,
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
        let Some(given) = h.strip_prefix(b"Bearer ") else {
            return false;
        };
        constant_time_eq(given, token.as_bytes())
    }
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
        }
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
    fn writes_need_the_exact_bearer_token() {
        let s = settings("0.0.0.0:9900", Some("0123456789abcdef"));
        assert!(s.authorizes(Some(b"Bearer 0123456789abcdef")));
        assert!(!s.authorizes(Some(b"Bearer 0123456789abcdeF")));
        assert!(!s.authorizes(Some(b"0123456789abcdef")));
        assert!(!s.authorizes(None));
        assert!(settings("127.0.0.1:1", None).authorizes(None));
    }
}
