//! Reading the pinning cookie out of `Cookie` header values, and writing `Set-Cookie`.
//!
//! The rules (see `sticky-cookie-rules.md`): a request may carry several `Cookie` header lines,
//! each a `;`-separated list of `name=value` pairs with optional spaces around each pair. Cookie
//! names are case-sensitive and matched whole. The **first** occurrence of the name, in the
//! order the bytes arrived, is the pin; later duplicates are never consulted.
//!
//! Everything here borrows: finding a cookie allocates nothing.

use std::fmt;

/// Optional white space as HTTP defines it (SP / HTAB).
#[inline]
fn is_ows(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

#[inline]
pub(crate) fn trim_ows(mut s: &[u8]) -> &[u8] {
    while let [first, rest @ ..] = s {
        if is_ows(*first) {
            s = rest;
        } else {
            break;
        }
    }
    while let [rest @ .., last] = s {
        if is_ows(*last) {
            s = rest;
        } else {
            break;
        }
    }
    s
}

/// Returns the value of the first pair named exactly `name` in one `Cookie` header value.
///
/// Pairs without `=` carry no name and are skipped. White space around the pair, the name and
/// the value is not part of them. The value is returned as sent (quotes included): a quoted
/// value therefore names no node, which is the safe reading.
pub fn find_in_value<'a>(value: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    // One pass over the pairs. (A memmem pre-check was measured slower: building its searcher
    // costs more than scanning the short values real Cookie headers carry.)
    for pair in value.split(|&b| b == b';') {
        let Some(eq) = memchr::memchr(b'=', pair) else {
            continue;
        };
        if trim_ows(&pair[..eq]) == name {
            return Some(trim_ows(&pair[eq + 1..]));
        }
    }
    None
}

/// Returns the first value of cookie `name` across several `Cookie` header values, taken in the
/// order given (the order the bytes arrived). This is the entry point for a `HeaderMap`
/// (`map.get_all(COOKIE)`), where HTTP/2 may have split one cookie header into many fields.
pub fn find_in_values<'a, I>(values: I, name: &[u8]) -> Option<&'a [u8]>
where
    I: IntoIterator<Item = &'a [u8]>,
{
    values.into_iter().find_map(|v| find_in_value(v, name))
}

/// `SameSite` attribute of the affinity cookie.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SameSite {
    Strict,
    Lax,
    /// Cross-site allowed; browsers then require `Secure`, so it forces `Secure`.
    None,
}

impl SameSite {
    fn as_str(self) -> &'static str {
        match self {
            SameSite::Strict => "Strict",
            SameSite::Lax => "Lax",
            SameSite::None => "None",
        }
    }
}

/// When the cookie carries `Secure`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Secure {
    /// On cookies set over TLS (the default).
    #[default]
    OverTls,
    /// Always (behind a proxy that terminates TLS).
    Always,
    /// Never: a site served over both HTTP and HTTPS, whose HTTP requests must carry the pin
    /// an HTTPS answer set (a browser neither sends a `Secure` cookie over HTTP nor lets an
    /// HTTP answer replace it).
    Never,
}

/// How the affinity cookie is written: its name and attributes are data, so the sim, the quick
/// proxy mode and a config file can all describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CookieSpec {
    pub name: Box<str>,
    pub path: Option<Box<str>>,
    pub domain: Option<Box<str>>,
    pub max_age: Option<u64>,
    pub http_only: bool,
    /// When `Secure` is written (with `SameSite=None` always: browsers refuse such a cookie
    /// without it).
    pub secure: Secure,
    pub same_site: Option<SameSite>,
}

impl CookieSpec {
    /// The cookie of the `limpet sim` protocol: `route=<b>; Path=/; HttpOnly`.
    pub fn sim() -> Self {
        CookieSpec {
            name: "route".into(),
            path: Some("/".into()),
            domain: None,
            max_age: None,
            http_only: true,
            secure: Secure::OverTls,
            same_site: None,
        }
    }

    /// The proxy's default: the sim's cookie plus `SameSite=Lax`.
    pub fn proxy_default() -> Self {
        CookieSpec {
            same_site: Some(SameSite::Lax),
            ..Self::sim()
        }
    }

    /// Writes the `Set-Cookie` value for `value`. `tls` says whether the client connection is
    /// TLS: a cookie set over TLS is `Secure` unless [`secure`](Self::secure) says never, and
    /// `SameSite=None` forces it too.
    pub fn write_set_cookie(
        &self,
        value: &str,
        tls: bool,
        out: &mut impl fmt::Write,
    ) -> fmt::Result {
        write!(out, "{}={}", self.name, value)?;
        if let Some(path) = &self.path {
            write!(out, "; Path={path}")?;
        }
        if let Some(domain) = &self.domain {
            write!(out, "; Domain={domain}")?;
        }
        if let Some(max_age) = self.max_age {
            write!(out, "; Max-Age={max_age}")?;
        }
        if self.http_only {
            out.write_str("; HttpOnly")?;
        }
        let secure = match self.secure {
            Secure::OverTls => tls,
            Secure::Always => true,
            Secure::Never => false,
        };
        if secure || self.same_site == Some(SameSite::None) {
            out.write_str("; Secure")?;
        }
        if let Some(same_site) = self.same_site {
            write!(out, "; SameSite={}", same_site.as_str())?;
        }
        Ok(())
    }

    /// [`write_set_cookie`](Self::write_set_cookie) into a new `String`.
    pub fn set_cookie(&self, value: &str, tls: bool) -> String {
        let mut s = String::with_capacity(self.name.len() + value.len() + 48);
        // Writing into a String cannot fail.
        let _ = self.write_set_cookie(value, tls, &mut s);
        s
    }
}

/// True when `s` can stand as a cookie value without quoting (RFC 6265 `cookie-octet`), so a
/// node name can be written into `Set-Cookie` verbatim.
pub fn is_cookie_value_safe(s: &[u8]) -> bool {
    !s.is_empty()
        && s.iter()
            .all(|&b| matches!(b, 0x21 | 0x23..=0x2B | 0x2D..=0x3A | 0x3C..=0x5B | 0x5D..=0x7E))
}

/// True when `s` is an RFC 6265 cookie name (an HTTP token).
pub fn is_cookie_name(s: &[u8]) -> bool {
    !s.is_empty()
        && s.iter()
            .all(|&b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn find(v: &str) -> Option<&str> {
        find_in_value(v.as_bytes(), b"route").map(|b| std::str::from_utf8(b).unwrap_or("<bin>"))
    }

    #[test]
    fn finds_the_pair_among_others() {
        assert_eq!(find("theme=dark; route=b1; lang=en"), Some("b1"));
    }

    #[test]
    fn names_are_matched_whole() {
        assert_eq!(find("xroute=b"), None);
        assert_eq!(find("route2=b"), None);
        assert_eq!(find("myroute=b"), None);
        assert_eq!(find("xroute=a; route=b"), Some("b"));
    }

    #[test]
    fn names_are_case_sensitive() {
        assert_eq!(find("Route=b"), None);
        assert_eq!(find("ROUTE=b; route=c"), Some("c"));
    }

    #[test]
    fn spaces_around_pairs_are_optional() {
        assert_eq!(find("route=b;lang=en"), Some("b"));
        assert_eq!(find("route=b ; lang=en"), Some("b"));
        assert_eq!(find("lang=en;route=b"), Some("b"));
        assert_eq!(find("lang=en ;  \troute=b  "), Some("b"));
    }

    #[test]
    fn first_duplicate_wins_within_a_line() {
        assert_eq!(find("route=b2; route=b1"), Some("b2"));
    }

    #[test]
    fn first_line_wins_across_lines() {
        let lines: [&[u8]; 3] = [b"theme=dark", b"route=first", b"route=second"];
        assert_eq!(find_in_values(lines, b"route"), Some(&b"first"[..]));
    }

    #[test]
    fn value_in_a_pair_may_contain_equals_and_be_empty() {
        assert_eq!(find("route=a=b"), Some("a=b"));
        assert_eq!(find("route="), Some(""));
        assert_eq!(find("route"), None);
    }

    #[test]
    fn value_named_like_the_cookie_is_not_a_name() {
        assert_eq!(find("x=route; y=route=1"), None);
    }

    #[test]
    fn set_cookie_of_the_sim_is_exact() {
        assert_eq!(
            CookieSpec::sim().set_cookie("b1", false),
            "route=b1; Path=/; HttpOnly"
        );
    }

    #[test]
    fn set_cookie_secure_over_tls_and_for_samesite_none() {
        let spec = CookieSpec::proxy_default();
        assert_eq!(
            spec.set_cookie("n", false),
            "route=n; Path=/; HttpOnly; SameSite=Lax"
        );
        assert_eq!(
            spec.set_cookie("n", true),
            "route=n; Path=/; HttpOnly; Secure; SameSite=Lax"
        );
        let none = CookieSpec {
            same_site: Some(SameSite::None),
            max_age: Some(60),
            domain: Some("example.com".into()),
            ..CookieSpec::sim()
        };
        assert_eq!(
            none.set_cookie("n", false),
            "route=n; Path=/; Domain=example.com; Max-Age=60; HttpOnly; Secure; SameSite=None"
        );
    }

    /// `Always` or `Never`, whatever the connection; by default, over TLS only.
    /// `SameSite=None` needs it whatever `secure` says (a browser refuses the cookie without).
    #[test]
    fn secure_set_is_always_or_never() {
        for (secure, tls, want) in [
            (Secure::OverTls, false, false),
            (Secure::OverTls, true, true),
            (Secure::Always, false, true),
            (Secure::Always, true, true),
            (Secure::Never, false, false),
            (Secure::Never, true, false),
        ] {
            let spec = CookieSpec {
                secure,
                ..CookieSpec::proxy_default()
            };
            assert_eq!(
                spec.set_cookie("n", tls).contains("; Secure"),
                want,
                "secure {secure:?}, TLS {tls}"
            );
        }
        let none = CookieSpec {
            secure: Secure::Never,
            same_site: Some(SameSite::None),
            ..CookieSpec::sim()
        };
        assert!(none.set_cookie("n", true).contains("; Secure"));
    }

    #[test]
    fn cookie_value_safety() {
        assert!(is_cookie_value_safe(b"node-1.a_b"));
        assert!(!is_cookie_value_safe(b"a;b"));
        assert!(!is_cookie_value_safe(b"a b"));
        assert!(!is_cookie_value_safe(b"a,b"));
        assert!(!is_cookie_value_safe(b"\"a\""));
        assert!(!is_cookie_value_safe(b""));
        assert!(is_cookie_name(b"route"));
        assert!(!is_cookie_name(b"ro=ute"));
    }
}
