//! The affinity cookie at the HTTP layer: reading a pin out of a request, writing the
//! `Set-Cookie` for a node, and stripping the cookie before the request reaches a node.
//!
//! ```text
//!  Cookie headers ──► cookie::find_in_values ──► value ──► Affinity::read ──► ReadPin
//!  NodeId ──► Affinity::encode ──► value ──► CookieSpec::set_cookie ──► Set-Cookie
//! ```
//!
//! [`Affinity::read`] and [`Affinity::encode`] are the one seam between cookie values and
//! nodes; both go through `limpet_core::CookieCodec`, so the `name` and `signed` modes (and any
//! later one) are read and written exactly as the sim and the core's tests do.

use http::header::{HeaderValue, COOKIE, SET_COOKIE};
use http::HeaderMap;
use limpet_core::{cookie, CookieCodec, CookieSpec, NodeId, ReadPin, Topology};

use super::config::{ConfigError, CookieConfig, Failback};

/// The affinity cookie of one listener, with its codec built for the listener's pool.
#[derive(Debug)]
pub(crate) struct Affinity {
    cfg: CookieConfig,
    codec: CookieCodec,
    /// With `failback = "home"`: the `<name>-home` cookie, same attributes as the pin's.
    home: Option<CookieSpec>,
}

impl Affinity {
    pub(crate) fn new(cfg: CookieConfig, pool: &Topology) -> Result<Self, ConfigError> {
        let codec = cfg.codec(pool)?;
        let home = (cfg.failback == Failback::Home).then(|| CookieSpec {
            name: format!("{}-home", cfg.spec.name).into(),
            ..cfg.spec.clone()
        });
        Ok(Affinity { cfg, codec, home })
    }

    fn name(&self) -> &[u8] {
        self.cfg.spec.name.as_bytes()
    }

    /// True with `failback = "home"`.
    pub(crate) fn fails_back(&self) -> bool {
        self.home.is_some()
    }

    /// The home pin this request carries (`<name>-home`), read with the pin's codec; no pin
    /// without `failback = "home"`.
    pub(crate) fn read_home(&self, pool: &Topology, headers: &HeaderMap, now_ms: u64) -> ReadPin {
        let value = self.home.as_ref().and_then(|h| {
            cookie::find_in_values(
                headers.get_all(COOKIE).iter().map(|v| v.as_bytes()),
                h.name.as_bytes(),
            )
        });
        self.codec.read(value, pool, now_ms)
    }

    /// The `Set-Cookie` value naming `value` as the session's home node.
    pub(crate) fn set_home_cookie(&self, value: &str, tls: bool) -> Option<HeaderValue> {
        let h = self.home.as_ref()?;
        HeaderValue::try_from(h.set_cookie(value, tls)).ok()
    }

    /// The `Set-Cookie` value expiring the home cookie (`Max-Age=0`).
    pub(crate) fn clear_home_cookie(&self, tls: bool) -> Option<HeaderValue> {
        let h = self.home.as_ref()?;
        let expired = CookieSpec {
            max_age: Some(0),
            ..h.clone()
        };
        HeaderValue::try_from(expired.set_cookie("", tls)).ok()
    }

    /// The pin this request carries: the first cookie of our name, in arrival order. Never
    /// fails: a value that means nothing reads as `Pin::Unknown`/`Invalid`/`Expired`, which
    /// the core treats as no pin.
    pub(crate) fn read(&self, pool: &Topology, headers: &HeaderMap, now_ms: u64) -> ReadPin {
        let value = cookie::find_in_values(
            headers.get_all(COOKIE).iter().map(|v| v.as_bytes()),
            self.name(),
        );
        self.codec.read(value, pool, now_ms)
    }

    /// The issue time a cookie written now would carry, as a later request will read it back
    /// (signed cookies keep whole seconds; plain ones carry none). The session's spread key
    /// is derived from it, so the first request (no cookie yet) and every later one agree.
    pub(crate) fn issue_time(&self, now_ms: u64) -> Option<u64> {
        matches!(self.codec, CookieCodec::Signed(_)).then_some(now_ms / 1000 * 1000)
    }

    /// Node to cookie value. `issued_ms` is now for a fresh pin, the token's first issue time
    /// for a refresh (so refreshing never extends a signed token's lifetime).
    pub(crate) fn encode(
        &self,
        pool: &Topology,
        node: NodeId,
        issued_ms: u64,
        now_ms: u64,
    ) -> String {
        self.codec.write(node, pool, issued_ms, now_ms)
    }

    /// The `Set-Cookie` header value pinning to `node`.
    pub(crate) fn set_cookie(&self, value: &str, tls: bool) -> Option<HeaderValue> {
        HeaderValue::try_from(self.cfg.spec.set_cookie(value, tls)).ok()
    }

    /// Takes out of a node's answer every `Set-Cookie` of our cookie's name (or its `-home`
    /// name): the pin is limpet's to write. Passed on, a node's `route=x` would replace the
    /// client's pin with a value limpet reads as unknown (or, on a longer `Path`, come first
    /// in every request) and move a session off a node that is UP. HAProxy's `cookie ...
    /// insert` removes a server's cookie of its name the same way (unless `preserve`). The
    /// name is matched as the pin is read: case-sensitive and whole.
    pub(crate) fn drop_node_cookies(&self, headers: &mut HeaderMap) {
        // Most answers set no cookie at all: one lookup, nothing more.
        if !headers.contains_key(SET_COOKIE) {
            return;
        }
        let home = self.home.as_ref().map(|h| h.name.as_bytes());
        let ours = |v: &HeaderValue| {
            let name = set_cookie_name(v.as_bytes());
            name == self.name() || Some(name) == home
        };
        // Most answers set no cookie, or none of ours: nothing is rebuilt for them.
        if !headers.get_all(SET_COOKIE).iter().any(ours) {
            return;
        }
        let kept: Vec<HeaderValue> = headers
            .get_all(SET_COOKIE)
            .iter()
            .filter(|v| !ours(v))
            .cloned()
            .collect();
        tracing::debug!("a node's Set-Cookie of limpet's cookie name was left out");
        headers.remove(SET_COOKIE);
        for v in kept {
            headers.append(SET_COOKIE, v);
        }
    }

    /// Takes every pair of our cookie out of the request's `Cookie` headers, unless configured
    /// to keep it. Other pairs pass byte for byte; a header left empty is dropped. With one
    /// `Cookie` line and no home cookie (the usual request) the map is left as it is and the
    /// edit returned, for whoever writes the head ([`CookieEdit`]); otherwise the map is
    /// edited here and [`CookieEdit::Keep`] returned.
    pub(crate) fn strip(&self, headers: &mut HeaderMap) -> CookieEdit {
        if self.cfg.keep_in_request {
            return CookieEdit::Keep;
        }
        let edit = strip_named(headers, self.name());
        match &self.home {
            None => edit,
            Some(h) => {
                edit.apply(headers);
                strip_named(headers, h.name.as_bytes())
            }
        }
    }
}

/// The cookie name a `Set-Cookie` value sets, as a browser reads it (RFC 6265 5.2): the
/// text before the first `=` of the part before the first `;`, without surrounding blanks;
/// none (empty) without an `=`.
fn set_cookie_name(value: &[u8]) -> &[u8] {
    let pair = value.split(|&b| b == b';').next().unwrap_or_default();
    match pair.iter().position(|&b| b == b'=') {
        Some(eq) => trim(&pair[..eq]),
        None => &[],
    }
}

/// What becomes of a request's one `Cookie` line on its way to the node, once our pairs are
/// taken out. The node-side writer (`super::node_h1`) leaves the line out or writes what is
/// left in its place as it writes the client's fields; hyper's client path gets the map
/// edited ([`CookieEdit::apply`]). Removing the line from the map was about 270
/// instructions of a pinned request's 25,000 (callgrind), for a line that is then not
/// written anyway.
#[derive(Debug, Clone, Default)]
pub(crate) enum CookieEdit {
    /// Forwarded as the client sent it.
    #[default]
    Keep,
    /// Left out: it held only our pairs.
    Drop,
    /// Forwarded as this value: the pairs left.
    Replace(HeaderValue),
}

impl CookieEdit {
    /// The edit made on `headers` themselves.
    pub(crate) fn apply(self, headers: &mut HeaderMap) {
        match self {
            CookieEdit::Keep => {}
            CookieEdit::Drop => {
                headers.remove(COOKIE);
            }
            // Only over a line still there: a `Cookie` the client's `Connection` line named
            // was removed with the hop-by-hop fields, and stays out (as the path that writes
            // the head itself leaves it out).
            CookieEdit::Replace(v) => {
                if let Some(line) = headers.get_mut(COOKIE) {
                    *line = v;
                }
            }
        }
    }
}

/// Takes every pair named `name` out of the request's `Cookie` headers: one line's edit is
/// returned, several lines are edited in the map.
fn strip_named(headers: &mut HeaderMap, name: &[u8]) -> CookieEdit {
    // One Cookie line (HTTP/1.1 always): no list built, the value searched once.
    let mut lines = headers.get_all(COOKIE).iter();
    match (lines.next(), lines.next()) {
        (None, _) => return CookieEdit::Keep,
        (Some(only), None) => {
            return match strip_value(only, name) {
                Stripped::Unchanged => CookieEdit::Keep,
                Stripped::Replaced(v) => CookieEdit::Replace(v),
                Stripped::Emptied => CookieEdit::Drop,
            };
        }
        (Some(_), Some(_)) => {}
    }
    // Several lines (HTTP/2 may split a cookie header): rebuilt only when one mentions it.
    if !headers
        .get_all(COOKIE)
        .iter()
        .any(|v| memchr::memmem::find(v.as_bytes(), name).is_some())
    {
        return CookieEdit::Keep;
    }
    let kept: Vec<HeaderValue> = headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| match strip_value(v, name) {
            Stripped::Unchanged => Some(v.clone()),
            Stripped::Replaced(new) => Some(new),
            Stripped::Emptied => None,
        })
        .collect();
    headers.remove(COOKIE);
    for v in kept {
        headers.append(COOKIE, v);
    }
    CookieEdit::Keep
}

/// What [`strip_value`] made of one `Cookie` value.
#[derive(Debug)]
enum Stripped {
    /// No pair was named `name`: the value stays as it is.
    Unchanged,
    /// The pairs left.
    Replaced(HeaderValue),
    /// Nothing is left.
    Emptied,
}

/// One `Cookie` value without the pairs named `name`.
fn strip_value(value: &HeaderValue, name: &[u8]) -> Stripped {
    let bytes = value.as_bytes();
    if memchr::memmem::find(bytes, name).is_none() {
        return Stripped::Unchanged;
    }
    // Allocated only once a pair is kept: a line holding only our pair (the usual one
    // from a browser that has no other cookie for the site) costs nothing here.
    let mut out = Vec::new();
    let mut removed = false;
    for pair in bytes.split(|&b| b == b';') {
        let pair_name = match memchr::memchr(b'=', pair) {
            Some(eq) => trim(&pair[..eq]),
            None => &[][..],
        };
        if pair_name == name {
            removed = true;
            continue;
        }
        if !out.is_empty() {
            out.push(b';');
        }
        out.extend_from_slice(pair);
    }
    if !removed {
        // The name was only part of another pair's name or value.
        return Stripped::Unchanged;
    }
    let out = trim(&out);
    if out.is_empty() {
        return Stripped::Emptied;
    }
    // A subset of a valid value is valid; keep the original if that ever fails.
    Stripped::Replaced(HeaderValue::from_bytes(out).unwrap_or_else(|_| value.clone()))
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

    #[test]
    fn a_set_cookie_s_name_is_read_as_a_browser_reads_it() {
        for (v, name) in [
            ("route=b1; Path=/", &b"route"[..]),
            (" route =b1", b"route"),
            ("\troute\t=", b"route"),
            ("Route=b1", b"Route"),
            ("xroute=b1", b"xroute"),
            ("route", b""),
            ("; route=b1", b""),
            ("a=route=b1", b"a"),
        ] {
            assert_eq!(set_cookie_name(v.as_bytes()), name, "{v:?}");
        }
    }

    /// Every `Set-Cookie` of our name or our home name goes, whatever its attributes and
    /// wherever it stands; the others stay, in their order, byte for byte.
    #[test]
    fn a_node_s_cookies_of_our_names_are_left_out_and_the_rest_kept_in_order() {
        let pool = Topology::with_weights([("a", 1), ("b", 1)]).unwrap_or_else(|e| panic!("{e}"));
        let cfg = CookieConfig {
            failback: Failback::Home,
            ..CookieConfig::default()
        };
        let a = Affinity::new(cfg, &pool).unwrap_or_else(|e| panic!("{e}"));
        let mut headers = HeaderMap::new();
        for v in [
            "theme=dark; Path=/",
            "route=evil; Path=/app",
            "Route=kept",
            " route-home = x",
            "routex=kept",
            "lang=en",
        ] {
            headers.append(SET_COOKIE, HeaderValue::from_static(v));
        }
        a.drop_node_cookies(&mut headers);
        let left: Vec<&[u8]> = headers
            .get_all(SET_COOKIE)
            .iter()
            .map(HeaderValue::as_bytes)
            .collect();
        assert_eq!(
            left,
            [
                &b"theme=dark; Path=/"[..],
                b"Route=kept",
                b"routex=kept",
                b"lang=en"
            ]
        );
    }

    fn strip(v: &str) -> Option<String> {
        let value = HeaderValue::from_str(v).ok()?;
        let kept = match strip_value(&value, b"route") {
            Stripped::Unchanged => value,
            Stripped::Replaced(h) => h,
            Stripped::Emptied => return None,
        };
        Some(String::from_utf8_lossy(kept.as_bytes()).into_owned())
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
        let pool = limpet_core::Pool::new(["b1"]).unwrap_or_else(|e| panic!("{e}"));
        let a = Affinity::new(CookieConfig::default(), &pool).unwrap_or_else(|e| panic!("{e}"));
        let mut h = HeaderMap::new();
        h.append(COOKIE, HeaderValue::from_static("route=b1"));
        h.append(COOKIE, HeaderValue::from_static("x=1; route=b2"));
        a.strip(&mut h);
        let got: Vec<_> = h.get_all(COOKIE).iter().collect();
        assert_eq!(got, [HeaderValue::from_static("x=1")]);
    }

    /// One `Cookie` line (every HTTP/1.1 request): only our pair goes a line that holds
    /// only it, the rest of a line is kept byte for byte, and a line that merely mentions
    /// the name stays as it was (the same value, not a rebuilt one).
    #[test]
    fn strip_on_one_line_removes_replaces_or_keeps_it() {
        let pool = limpet_core::Pool::new(["b1"]).unwrap_or_else(|e| panic!("{e}"));
        let a = Affinity::new(CookieConfig::default(), &pool).unwrap_or_else(|e| panic!("{e}"));
        let stripped = |line: Option<&'static str>| {
            let mut h = HeaderMap::new();
            h.insert(http::header::HOST, HeaderValue::from_static("site"));
            if let Some(l) = line {
                h.insert(COOKIE, HeaderValue::from_static(l));
            }
            let edit = a.strip(&mut h);
            // One line: the map is left as sent, the edit is returned for the head's writer.
            assert_eq!(
                h.get(COOKIE).map(HeaderValue::as_bytes),
                line.map(str::as_bytes)
            );
            edit.apply(&mut h);
            assert_eq!(
                h.get(http::header::HOST).map(HeaderValue::as_bytes),
                Some(&b"site"[..])
            );
            let lines: Vec<String> = h
                .get_all(COOKIE)
                .iter()
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                .collect();
            lines
        };
        assert!(stripped(Some("route=b1")).is_empty(), "the line goes");
        assert_eq!(stripped(Some("theme=dark; route=b1")), ["theme=dark"]);
        assert_eq!(stripped(Some("route=b1;  a=1")), ["a=1"]);
        assert_eq!(stripped(Some("xroute=1; a=route")), ["xroute=1; a=route"]);
        // As sent, not rebuilt from its pairs (which would drop the empty first one).
        assert_eq!(stripped(Some(";xroute=1")), [";xroute=1"]);
        assert!(stripped(None).is_empty(), "no Cookie line, nothing added");
    }
}
