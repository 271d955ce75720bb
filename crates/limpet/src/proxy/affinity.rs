//! The affinity cookie at the HTTP layer: reading a pin out of a request, writing the
//! `Set-Cookie` for a node, and stripping the cookie before the request reaches a node.
//!
//! ```text
//!  Cookie headers ──► cookie::find_in_values ──► value ──► Affinity::decode ──► PinRead
//!  NodeId ──► Affinity::encode ──► value ──► CookieSpec::set_cookie ──► Set-Cookie
//! ```
//!
//! [`Affinity::decode`] and [`Affinity::encode`] are the one seam between cookie values and
//! nodes: a new value mode (e.g. signed tokens from `limpet_core::codec`) is a new
//! [`CookieMode`] arm in those two functions and nothing else changes.

use http::header::{HeaderValue, COOKIE};
use http::HeaderMap;
use limpet_core::{cookie, NodeId, Pin, Pool};

use super::config::{CookieConfig, CookieMode};

/// A decoded cookie: the pin, and whether a sticky hit must still re-send the cookie (a
/// signed token past half its idle time is re-issued on use; name values never are).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PinRead {
    pub(crate) pin: Pin,
    pub(crate) refresh: bool,
}

/// The affinity cookie of one listener.
#[derive(Debug)]
pub(crate) struct Affinity {
    cfg: CookieConfig,
}

impl Affinity {
    pub(crate) fn new(cfg: CookieConfig) -> Self {
        Affinity { cfg }
    }

    fn name(&self) -> &[u8] {
        self.cfg.spec.name.as_bytes()
    }

    /// The pin this request carries: the first cookie of our name, in arrival order.
    pub(crate) fn read(&self, pool: &Pool, headers: &HeaderMap, now_ms: u64) -> PinRead {
        let value = cookie::find_in_values(
            headers.get_all(COOKIE).iter().map(|v| v.as_bytes()),
            self.name(),
        );
        match value {
            None => PinRead {
                pin: Pin::None,
                refresh: false,
            },
            Some(v) => self.decode(pool, v, now_ms),
        }
    }

    /// Cookie value to pin. Never fails: a value that means nothing is `Pin::Unknown` (or
    /// `Invalid`/`Expired` for modes that can tell), which the core treats as no pin.
    pub(crate) fn decode(&self, pool: &Pool, value: &[u8], _now_ms: u64) -> PinRead {
        match self.cfg.mode {
            CookieMode::Name => PinRead {
                pin: pool.pin_by_name(Some(value)),
                refresh: false,
            },
        }
    }

    /// Node to cookie value.
    pub(crate) fn encode(&self, pool: &Pool, node: NodeId, _now_ms: u64) -> String {
        match self.cfg.mode {
            CookieMode::Name => pool.name(node).to_owned(),
        }
    }

    /// The `Set-Cookie` header value pinning to `node`.
    pub(crate) fn set_cookie(&self, value: &str, tls: bool) -> Option<HeaderValue> {
        HeaderValue::try_from(self.cfg.spec.set_cookie(value, tls)).ok()
    }

    /// Removes every pair of our cookie from the request's `Cookie` headers, unless configured
    /// to keep it. Other pairs pass byte for byte; a header left empty is dropped.
    pub(crate) fn strip(&self, headers: &mut HeaderMap) {
        if self.cfg.keep_in_request || !headers.contains_key(COOKIE) {
            return;
        }
        let name = self.name();
        // Fast path: no Cookie line mentions the name, nothing to rebuild.
        if !headers
            .get_all(COOKIE)
            .iter()
            .any(|v| memchr::memmem::find(v.as_bytes(), name).is_some())
        {
            return;
        }
        let kept: Vec<HeaderValue> = headers
            .get_all(COOKIE)
            .iter()
            .filter_map(|v| strip_value(v, name))
            .collect();
        headers.remove(COOKIE);
        for v in kept {
            headers.append(COOKIE, v);
        }
    }
}

/// One `Cookie` value without the pairs named `name`; `None` when nothing is left.
fn strip_value(value: &HeaderValue, name: &[u8]) -> Option<HeaderValue> {
    let bytes = value.as_bytes();
    if memchr::memmem::find(bytes, name).is_none() {
        return Some(value.clone());
    }
    let mut out = Vec::with_capacity(bytes.len());
    for pair in bytes.split(|&b| b == b';') {
        let pair_name = match memchr::memchr(b'=', pair) {
            Some(eq) => trim(&pair[..eq]),
            None => &[][..],
        };
        if pair_name == name {
            continue;
        }
        if !out.is_empty() {
            out.push(b';');
        }
        out.extend_from_slice(pair);
    }
    let out = trim(&out);
    if out.is_empty() {
        return None;
    }
    // A subset of a valid value is valid; keep the original if that ever fails.
    Some(HeaderValue::from_bytes(out).unwrap_or_else(|_| value.clone()))
}

fn trim(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strip(v: &str) -> Option<String> {
        strip_value(&HeaderValue::from_str(v).ok()?, b"route")
            .map(|h| String::from_utf8_lossy(h.as_bytes()).into_owned())
    }

    #[test]
    fn strips_only_our_pairs_and_keeps_the_rest_verbatim() {
        assert_eq!(
            strip("theme=dark; route=b1; lang=en").as_deref(),
            Some("theme=dark; lang=en")
        );
        assert_eq!(strip("route=b1;lang=en").as_deref(), Some("lang=en"));
        assert_eq!(strip("a=1 ;route=x").as_deref(), Some("a=1"));
        assert_eq!(strip("route=1; route=2").as_deref(), None);
        assert_eq!(
            strip("xroute=1; Route=2; route2=3").as_deref(),
            Some("xroute=1; Route=2; route2=3")
        );
        assert_eq!(strip("a=route").as_deref(), Some("a=route"));
    }

    #[test]
    fn strip_drops_emptied_headers() {
        let a = Affinity::new(CookieConfig::default());
        let mut h = HeaderMap::new();
        h.append(COOKIE, HeaderValue::from_static("route=b1"));
        h.append(COOKIE, HeaderValue::from_static("x=1; route=b2"));
        a.strip(&mut h);
        let got: Vec<_> = h.get_all(COOKIE).iter().collect();
        assert_eq!(got, [HeaderValue::from_static("x=1")]);
    }
}
