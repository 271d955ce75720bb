//! A hand-written `Set-Cookie` parser (RFC 6265 §5.2, with the strict server-side syntax of
//! §4.1.1 for names and values).
//!
//! Parsing is lenient where the RFC is lenient (attribute names in any case, unknown attributes
//! skipped, an unusable attribute value ignored, the last of a repeated attribute winning) and
//! strict where leniency would let a value through that cannot be sent back byte for byte in a
//! `Cookie` header (a name that is not a token, a value with spaces, commas, backslashes or
//! control characters). A line that fails is simply not a cookie: the jar ignores it.

use std::fmt;
use std::time::SystemTime;

use crate::date::parse_cookie_date;

/// One parsed `Set-Cookie` line. Borrows from the header bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetCookie<'a> {
    name: &'a str,
    value: &'a str,
    max_age: Option<i64>,
    expires: Option<SystemTime>,
    domain: Option<&'a str>,
    path: Option<&'a str>,
    secure: bool,
    http_only: bool,
    same_site: Option<&'a str>,
}

/// Why a `Set-Cookie` line is not a cookie.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetCookieError {
    /// The part before the first `;` has no `=`.
    NoEquals,
    /// The name is empty.
    EmptyName,
    /// The name is not an RFC 7230 token (or not ASCII).
    InvalidName,
    /// The value holds bytes other than RFC 6265 cookie-octets (optionally in one pair of
    /// double quotes).
    InvalidValue,
}

impl fmt::Display for SetCookieError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::NoEquals => "no '=' in the name-value pair",
            Self::EmptyName => "empty cookie name",
            Self::InvalidName => "cookie name is not a token",
            Self::InvalidValue => "cookie value holds characters outside cookie-octet",
        })
    }
}

impl std::error::Error for SetCookieError {}

impl<'a> SetCookie<'a> {
    /// Parses one `Set-Cookie` header value.
    pub fn parse(header: &'a [u8]) -> Result<Self, SetCookieError> {
        let mut parts = header.split(|&b| b == b';');
        // `split` always yields at least one item, even for empty input.
        let pair = parts.next().unwrap_or_default();
        let eq = pair
            .iter()
            .position(|&b| b == b'=')
            .ok_or(SetCookieError::NoEquals)?;
        let name = trim(&pair[..eq]);
        let value = trim(&pair[eq + 1..]);
        if name.is_empty() {
            return Err(SetCookieError::EmptyName);
        }
        if !name.iter().all(|&b| is_tchar(b)) {
            return Err(SetCookieError::InvalidName);
        }
        if !is_cookie_value(value) {
            return Err(SetCookieError::InvalidValue);
        }
        // Both were checked to be ASCII, so these conversions cannot fail; `?` keeps that
        // reasoning out of the panic path all the same.
        let name = std::str::from_utf8(name).map_err(|_| SetCookieError::InvalidName)?;
        let value = std::str::from_utf8(value).map_err(|_| SetCookieError::InvalidValue)?;

        let mut cookie = SetCookie {
            name,
            value,
            max_age: None,
            expires: None,
            domain: None,
            path: None,
            secure: false,
            http_only: false,
            same_site: None,
        };
        for attribute in parts {
            cookie.apply_attribute(attribute);
        }
        Ok(cookie)
    }

    fn apply_attribute(&mut self, attribute: &'a [u8]) {
        let (key, value) = match attribute.iter().position(|&b| b == b'=') {
            Some(eq) => (trim(&attribute[..eq]), trim(&attribute[eq + 1..])),
            None => (trim(attribute), &attribute[..0]),
        };
        // An attribute whose value is not UTF-8 cannot be any of the values we act on.
        let text = std::str::from_utf8(value).ok();
        if key.eq_ignore_ascii_case(b"max-age") {
            // An unusable Max-Age is ignored (and so does not hide a previous valid one).
            if let Some(delta) = parse_max_age(value) {
                self.max_age = Some(delta);
            }
        } else if key.eq_ignore_ascii_case(b"expires") {
            if let Some(t) = parse_cookie_date(value) {
                self.expires = Some(t);
            }
        } else if key.eq_ignore_ascii_case(b"domain") {
            // RFC 6265 §5.2.3: an empty Domain is ignored; one leading dot is dropped.
            if let Some(d) = text.map(|d| d.strip_prefix('.').unwrap_or(d)) {
                if !d.is_empty() {
                    self.domain = Some(d);
                }
            }
        } else if key.eq_ignore_ascii_case(b"path") {
            // RFC 6265 §5.2.4: a Path that is empty or does not begin with '/' means "the
            // default path"; `None` stands for that.
            self.path = text.filter(|p| p.starts_with('/'));
        } else if key.eq_ignore_ascii_case(b"secure") {
            self.secure = true;
        } else if key.eq_ignore_ascii_case(b"httponly") {
            self.http_only = true;
        } else if key.eq_ignore_ascii_case(b"samesite") {
            self.same_site = text;
        }
        // Anything else (Partitioned, Priority, extensions) does not concern a non-browser.
    }

    /// The cookie's name (case-sensitive).
    pub fn name(&self) -> &'a str {
        self.name
    }

    /// The value exactly as it must be sent back (surrounding double quotes included, if any).
    pub fn value(&self) -> &'a str {
        self.value
    }

    /// `Max-Age` in seconds, if a valid one was present (the last valid one wins).
    pub fn max_age(&self) -> Option<i64> {
        self.max_age
    }

    /// `Expires`, if a parseable one was present (the last parseable one wins).
    pub fn expires(&self) -> Option<SystemTime> {
        self.expires
    }

    /// `Domain` without its leading dot, if a non-empty one was present. Not lower-cased.
    pub fn domain(&self) -> Option<&'a str> {
        self.domain
    }

    /// `Path`, if the last Path attribute was usable (non-empty, beginning with `/`).
    pub fn path(&self) -> Option<&'a str> {
        self.path
    }

    /// Whether `Secure` was present.
    pub fn secure(&self) -> bool {
        self.secure
    }

    /// Whether `HttpOnly` was present (meaningless outside a browser; parsed for completeness).
    pub fn http_only(&self) -> bool {
        self.http_only
    }

    /// The raw `SameSite` value, if present (meaningless outside a browser).
    pub fn same_site(&self) -> Option<&'a str> {
        self.same_site
    }

    /// The cookie's lifetime as seen at `now`. `Max-Age` wins over `Expires` (RFC 6265 §5.3
    /// step 3); `Max-Age <= 0` and an `Expires` at or before `now` mean the server deletes it.
    pub fn expiry(&self, now: SystemTime) -> Expiry {
        if let Some(delta) = self.max_age {
            if delta <= 0 {
                return Expiry::Expired;
            }
            // A Max-Age too large for the clock is as good as "never": keep it for the
            // session, which is all this memory-only jar ever does anyway.
            return match now.checked_add(std::time::Duration::from_secs(delta.unsigned_abs())) {
                Some(t) => Expiry::At(t),
                None => Expiry::Session,
            };
        }
        match self.expires {
            Some(t) if t <= now => Expiry::Expired,
            Some(t) => Expiry::At(t),
            None => Expiry::Session,
        }
    }
}

/// A cookie's lifetime, from [`SetCookie::expiry`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expiry {
    /// No (usable) `Max-Age` or `Expires`: valid until the jar is dropped.
    Session,
    /// Valid while `now < t`.
    At(SystemTime),
    /// Already expired: the server is deleting the cookie.
    Expired,
}

/// RFC 6265 §5.2.2: a `-` or digit first, digits after; anything else is ignored. Values too
/// large for `i64` saturate, which keeps their meaning (far future / already expired).
fn parse_max_age(value: &[u8]) -> Option<i64> {
    let (negative, digits) = match value.split_first() {
        Some((b'-', rest)) => (true, rest),
        Some(_) => (false, value),
        None => return None,
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let magnitude = digits.iter().fold(0i64, |acc, &d| {
        acc.saturating_mul(10).saturating_add(i64::from(d - b'0'))
    });
    Some(if negative { -magnitude } else { magnitude })
}

/// Strips RFC 6265's whitespace (SP and HTAB) from both ends.
pub(crate) fn trim(bytes: &[u8]) -> &[u8] {
    let is_ws = |b: &u8| *b == b' ' || *b == b'\t';
    let start = bytes.iter().position(|b| !is_ws(b)).unwrap_or(bytes.len());
    let end = bytes
        .iter()
        .rposition(|b| !is_ws(b))
        .map_or(start, |i| i + 1);
    &bytes[start..end]
}

/// RFC 7230 `tchar`.
pub(crate) fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// RFC 6265 `cookie-octet = %x21 / %x23-2B / %x2D-3A / %x3C-5B / %x5D-7E`.
fn is_cookie_octet(b: u8) -> bool {
    matches!(b, 0x21 | 0x23..=0x2B | 0x2D..=0x3A | 0x3C..=0x5B | 0x5D..=0x7E)
}

/// RFC 6265 `cookie-value = *cookie-octet / ( DQUOTE *cookie-octet DQUOTE )`.
fn is_cookie_value(value: &[u8]) -> bool {
    let inner = match value {
        [b'"', inner @ .., b'"'] => inner,
        _ => value,
    };
    inner.iter().all(|&b| is_cookie_octet(b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn parse(s: &str) -> Result<SetCookie<'_>, SetCookieError> {
        SetCookie::parse(s.as_bytes())
    }

    #[test]
    fn name_value_and_attributes_in_any_case() {
        let c = parse("route=n1; pAtH=/; hTTpOnly; SECURE; samesite=Lax; DOMAIN=.Example.com")
            .expect("valid");
        assert_eq!((c.name(), c.value()), ("route", "n1"));
        assert_eq!(c.path(), Some("/"));
        assert!(c.http_only() && c.secure());
        assert_eq!(c.same_site(), Some("Lax"));
        assert_eq!(c.domain(), Some("Example.com"));
    }

    #[test]
    fn whitespace_around_name_value_and_attributes_is_trimmed() {
        let c = parse("  AWSALB = abc+/= ;  Max-Age = 60 ").expect("valid");
        assert_eq!((c.name(), c.value()), ("AWSALB", "abc+/="));
        assert_eq!(c.max_age(), Some(60));
    }

    #[test]
    fn empty_and_quoted_values() {
        assert_eq!(parse("route=").map(|c| c.value()), Ok(""));
        assert_eq!(
            parse("route=\"n 1\"").map(|c| c.value()),
            Err(SetCookieError::InvalidValue)
        );
        assert_eq!(parse("route=\"n1\"").map(|c| c.value()), Ok("\"n1\""));
    }

    #[test]
    fn malformed_lines() {
        assert_eq!(parse(""), Err(SetCookieError::NoEquals));
        assert_eq!(parse("route; Path=/"), Err(SetCookieError::NoEquals));
        assert_eq!(parse("=n1"), Err(SetCookieError::EmptyName));
        assert_eq!(parse("ro ute=n1"), Err(SetCookieError::InvalidName));
        assert_eq!(parse("route=a,b"), Err(SetCookieError::InvalidValue));
        assert_eq!(parse("route=a b"), Err(SetCookieError::InvalidValue));
        assert_eq!(parse("route=a\\b"), Err(SetCookieError::InvalidValue));
        assert_eq!(
            SetCookie::parse(b"route=caf\xc3\xa9"),
            Err(SetCookieError::InvalidValue)
        );
    }

    #[test]
    fn max_age_syntax() {
        assert_eq!(parse_max_age(b"0"), Some(0));
        assert_eq!(parse_max_age(b"-5"), Some(-5));
        assert_eq!(parse_max_age(b"99999999999999999999999"), Some(i64::MAX));
        assert_eq!(parse_max_age(b"-99999999999999999999999"), Some(-i64::MAX));
        for bad in [&b""[..], b"-", b"+5", b"5s", b" 5x"] {
            assert_eq!(parse_max_age(bad), None);
        }
        // An invalid Max-Age does not erase an earlier valid one.
        assert_eq!(
            parse("a=b; Max-Age=5; Max-Age=x").map(|c| c.max_age()),
            Ok(Some(5))
        );
    }

    #[test]
    fn last_path_wins_and_unusable_path_means_default() {
        assert_eq!(
            parse("a=b; Path=/x; Path=/").map(|c| c.path()),
            Ok(Some("/"))
        );
        assert_eq!(parse("a=b; Path=/; Path=x").map(|c| c.path()), Ok(None));
        assert_eq!(parse("a=b; Path=").map(|c| c.path()), Ok(None));
    }

    #[test]
    fn expiry_max_age_wins_over_expires() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        // Past Expires, positive Max-Age: kept for Max-Age.
        let c = parse("a=b; Expires=Thu, 01 Jan 1970 00:00:00 GMT; Max-Age=10").expect("valid");
        assert_eq!(c.expiry(now), Expiry::At(now + Duration::from_secs(10)));
        // Future Expires, Max-Age=0: deleted.
        let c = parse("a=b; Max-Age=0; Expires=Fri, 01 Jan 2100 00:00:00 GMT").expect("valid");
        assert_eq!(c.expiry(now), Expiry::Expired);
        // Expires alone, at exactly now: expired.
        let c = parse("a=b; Expires=Sun, 09 Sep 2001 01:46:40 GMT").expect("valid");
        assert_eq!(c.expires(), Some(now));
        assert_eq!(c.expiry(now), Expiry::Expired);
        // Unparseable Expires is ignored: a session cookie.
        let c = parse("a=b; Expires=tomorrow").expect("valid");
        assert_eq!(c.expiry(now), Expiry::Session);
    }
}
