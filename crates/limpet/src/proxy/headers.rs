//! Header rewriting on the way to a node and back: hop-by-hop removal (never of `Host` and
//! the other [`END_TO_END`] headers), `X-Forwarded-*`, the `Host` rules, `Host` for HTTP/2
//! clients, and the `Cache-Control` that keeps shared caches from storing a
//! pin.

use std::net::IpAddr;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

const HOP_COUNT: usize = 7;

/// Headers that describe one connection, never the message (RFC 9110 7.6.1), plus the legacy
/// ones proxies still see.
const HOP_BY_HOP: [HeaderName; HOP_COUNT] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// [`HOP_BY_HOP`]'s names as text, in the same order: what lookups compare against. Each use
/// of a `const` array of `HeaderName`s builds the array and drops it again, which in the loop
/// over a head's names was about 1% of a keep-alive request's instructions (callgrind); an
/// array of `&str` needs no drop and lives in read-only data. (A `static` `HeaderName` array
/// cost more: comparisons against a constant name fold to a tag check, against a static's do
/// not.)
const HOP_NAMES: [&str; HOP_COUNT] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Where a (lowercase) header name stands in [`HOP_BY_HOP`], if it is hop-by-hop.
fn hop_index(name: &str) -> Option<usize> {
    HOP_NAMES.iter().position(|h| *h == name)
}

/// Headers a `Connection` line cannot remove.
const END_TO_END: [HeaderName; 3] = [header::HOST, header::CONTENT_LENGTH, header::CONTENT_TYPE];

/// Why a request's `Host` is refused (400), as HAProxy refuses it: several `Host` fields, or
/// an HTTP/1 absolute-form target naming another host than `Host` (two parsers would disagree
/// on which site is asked for: RFC 9112 3.2.2 says the target wins, most servers read `Host`).
///
/// HTTP/2 is left as it was: `:authority` is always there, common clients add a `Host` of
/// their own (`curl -H Host:`, hyper), and a node only ever sees `Host`: the `Host` field
/// wins when present, `:authority` fills it in when not.
pub(crate) fn host_problem(
    version: http::Version,
    uri: &http::Uri,
    headers: &HeaderMap,
) -> Option<&'static str> {
    let mut hosts = headers.get_all(header::HOST).iter();
    let host = hosts.next();
    if hosts.next().is_some() {
        return Some("several Host headers");
    }
    if version >= http::Version::HTTP_2 {
        return None;
    }
    match (uri.authority(), host) {
        (Some(a), Some(h)) if !a.as_str().as_bytes().eq_ignore_ascii_case(h.as_bytes()) => {
            Some("the request target and Host name different hosts")
        }
        _ => None,
    }
}

pub(crate) static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
pub(crate) static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
pub(crate) static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
pub(crate) static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Removes hop-by-hop headers, including every header the `Connection` lines name. For an
/// upgrade (`keep_upgrade`), `Upgrade` stays and `Connection: upgrade` is written back, since
/// the upgrade must be negotiated with the node itself.
///
/// Runs twice per request (request and answer), so it works from one pass over the names
/// present: no name is parsed or allocated, and only names that are there are removed
/// (callgrind: a `remove` per candidate name was 6% of a keep-alive request's instructions).
pub(crate) fn remove_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) {
    let mut present = [false; HOP_COUNT];
    for k in headers.keys() {
        if let Some(i) = hop_index(k.as_str()) {
            present[i] = true;
        }
    }
    if !present.contains(&true) {
        return;
    }
    // Names listed in Connection are removed too (e.g. `Connection: close, X-Secret`): each
    // name present is looked for among the listed tokens. A listed name is the sender's
    // claim that the header is hop-by-hop; the END_TO_END ones never are: the node needs them
    // to know what is asked and how long it is (`Connection: close, Host` would otherwise
    // strip the Host the node routes on).
    // HOP_BY_HOP[0] is Connection.
    let listed: Vec<HeaderName> = if present[0] && lists_other_names(headers) {
        headers
            .keys()
            .filter(|k| !HOP_BY_HOP.contains(k) && !END_TO_END.contains(k))
            .filter(|k| connection_lists(headers, k))
            .cloned()
            .collect()
    } else {
        Vec::new()
    };
    for name in listed {
        headers.remove(name);
    }
    let upgrade = if keep_upgrade {
        headers.remove(header::UPGRADE)
    } else {
        None
    };
    for (name, _) in HOP_BY_HOP.iter().zip(present).filter(|(_, p)| *p) {
        headers.remove(name);
    }
    if let Some(proto) = upgrade {
        headers.insert(header::UPGRADE, proto);
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
}

/// Whether a `Connection` line lists anything but hop-by-hop names (`keep-alive`,
/// `upgrade`), which go anyway: most lines list only those, and need no matching.
fn lists_other_names(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
        .any(|t| {
            !t.is_empty()
                && !HOP_NAMES
                    .iter()
                    .any(|h| t.eq_ignore_ascii_case(h.as_bytes()))
        })
}

/// Whether a `Connection` line lists `name` (names compare case-insensitively; the map's
/// names are lowercase).
fn connection_lists(headers: &HeaderMap, name: &HeaderName) -> bool {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .any(|t| {
            t.trim_ascii()
                .eq_ignore_ascii_case(name.as_str().as_bytes())
        })
}

/// The client's address as `X-Forwarded-For` writes it (an IPv4-mapped IPv6 address as the
/// IPv4 one). Made once per client connection, since formatting an address costs more than
/// the rest of [`set_forwarded`].
pub(crate) fn forwarded_for(peer: IpAddr) -> HeaderValue {
    let text = match peer {
        IpAddr::V4(v4) => ipv4_text(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => ipv4_text(v4),
            None => v6.to_string().into_bytes(),
        },
    };
    // An address's text is always a valid header value.
    HeaderValue::from_maybe_shared(bytes::Bytes::from(text))
        .unwrap_or_else(|_| HeaderValue::from_static("-"))
}

/// An IPv4 address in dotted decimal, as `Ipv4Addr`'s `Display` writes it. By hand because
/// `Display` goes through the formatting machinery (width, padding) for every octet:
/// callgrind put it at 2.5% of a `Connection: close` request's instructions, where each
/// request is a connection of its own; this is a few dozen.
fn ipv4_text(ip: std::net::Ipv4Addr) -> Vec<u8> {
    let mut out = Vec::with_capacity(15);
    for (i, octet) in ip.octets().into_iter().enumerate() {
        if i > 0 {
            out.push(b'.');
        }
        if octet >= 100 {
            out.push(b'0' + octet / 100);
        }
        if octet >= 10 {
            out.push(b'0' + octet / 10 % 10);
        }
        out.push(b'0' + octet % 10);
    }
    out
}

/// Sets `X-Forwarded-For/-Proto/-Host`; `peer` is the connection's [`forwarded_for`]. A
/// trusted peer's `X-Forwarded-For` is extended with the peer; its `-Proto` and `-Host`
/// describe the original request better than we can and are kept. From any other peer, all
/// three are replaced: a client cannot forge its address.
pub(crate) fn set_forwarded(headers: &mut HeaderMap, peer: &HeaderValue, tls: bool, trusted: bool) {
    let prior = if trusted {
        let lines: Vec<&str> = headers
            .get_all(&X_FORWARDED_FOR)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .collect();
        (!lines.is_empty()).then(|| lines.join(", "))
    } else {
        None
    };
    let xff = match prior {
        Some(p) => {
            HeaderValue::try_from(format!("{p}, {}", String::from_utf8_lossy(peer.as_bytes()))).ok()
        }
        None => Some(peer.clone()),
    };
    if let Some(v) = xff {
        headers.insert(&X_FORWARDED_FOR, v);
    }
    if !(trusted && headers.contains_key(&X_FORWARDED_PROTO)) {
        headers.insert(
            &X_FORWARDED_PROTO,
            HeaderValue::from_static(if tls { "https" } else { "http" }),
        );
    }
    if !(trusted && headers.contains_key(&X_FORWARDED_HOST)) {
        match headers.get(header::HOST).cloned() {
            Some(host) => {
                headers.insert(&X_FORWARDED_HOST, host);
            }
            None => {
                headers.remove(&X_FORWARDED_HOST);
            }
        }
    }
}

/// Adds `no-cache="set-cookie"` to `Cache-Control`, keeping the node's directives. Nothing is
/// added when a stronger directive (`no-store`, `private`, bare `no-cache`) is already there.
pub(crate) fn add_no_cache_set_cookie(headers: &mut HeaderMap) {
    const OURS: &str = "no-cache=\"set-cookie\"";
    let existing: Vec<String> = headers
        .get_all(header::CACHE_CONTROL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
        .collect();
    let covered = existing
        .iter()
        .flat_map(|v| v.split(','))
        .map(|d| d.trim().to_ascii_lowercase())
        .any(|d| d == "no-store" || d == "private" || d == "no-cache" || d == OURS);
    if covered {
        return;
    }
    let merged = if existing.is_empty() {
        OURS.to_owned()
    } else {
        format!("{}, {OURS}", existing.join(", "))
    };
    if let Ok(v) = HeaderValue::try_from(merged) {
        headers.insert(header::CACHE_CONTROL, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The text names lookups use are the hop-by-hop names, in the same order: a name found
    /// at `i` is the one removed at `i`.
    #[test]
    fn hop_names_are_the_hop_by_hop_headers_in_order() {
        for (i, h) in HOP_BY_HOP.iter().enumerate() {
            assert_eq!(HOP_NAMES[i], h.as_str());
            assert_eq!(hop_index(h.as_str()), Some(i));
        }
        assert_eq!(hop_index("host"), None);
        assert_eq!(hop_index("x-keep-alive"), None);
    }

    fn map(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn hop_by_hop_and_listed_headers_go() {
        let mut h = map(&[
            ("connection", "close, x-secret"),
            ("x-secret", "1"),
            ("keep-alive", "timeout=5"),
            ("te", "trailers"),
            ("upgrade", "websocket"),
            ("x-kept", "1"),
        ]);
        remove_hop_by_hop(&mut h, false);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-kept"));
        // Listed in a second Connection line, in any case, with spaces; END_TO_END stay.
        let mut h = map(&[
            ("connection", "keep-alive"),
            ("connection", " X-Other ,Host"),
            ("x-other", "1"),
            ("host", "shop"),
            ("x-kept", "1"),
        ]);
        remove_hop_by_hop(&mut h, false);
        let mut names: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        names.sort_unstable();
        assert_eq!(names, ["host", "x-kept"]);
        // Nothing hop-by-hop: nothing changes, even a header that a Connection line would name.
        let mut h = map(&[("x-other", "1"), ("host", "shop")]);
        remove_hop_by_hop(&mut h, false);
        assert_eq!(h.len(), 2);
    }

    #[test]
    fn upgrades_keep_upgrade() {
        let mut h = map(&[
            ("connection", "keep-alive, Upgrade"),
            ("upgrade", "websocket"),
        ]);
        remove_hop_by_hop(&mut h, true);
        assert_eq!(
            h.get("upgrade").map(|v| v.as_bytes()),
            Some(&b"websocket"[..])
        );
        assert_eq!(
            h.get("connection").map(|v| v.as_bytes()),
            Some(&b"upgrade"[..])
        );
    }

    proptest::proptest! {
        /// The hand-written IPv4 text is `Display`'s, for any address, mapped or not.
        #[test]
        fn forwarded_for_writes_an_ipv4_address_as_display_does(bits in proptest::prelude::any::<u32>()) {
            let ip = std::net::Ipv4Addr::from(bits);
            let want = ip.to_string();
            let (plain, mapped) = (forwarded_for(ip.into()), forwarded_for(ip.to_ipv6_mapped().into()));
            proptest::prop_assert_eq!(plain.as_bytes(), want.as_bytes());
            proptest::prop_assert_eq!(mapped.as_bytes(), want.as_bytes());
        }
    }

    #[test]
    fn forwarded_for_writes_the_edges_of_each_octet() {
        for (ip, text) in [
            ([0, 0, 0, 0], "0.0.0.0"),
            ([255, 255, 255, 255], "255.255.255.255"),
            ([9, 10, 99, 100], "9.10.99.100"),
            ([127, 0, 0, 1], "127.0.0.1"),
        ] {
            assert_eq!(forwarded_for(ip.into()).as_bytes(), text.as_bytes());
        }
    }

    #[test]
    fn forwarded_for_is_replaced_unless_trusted() {
        let peer = forwarded_for([10, 0, 0, 1].into());
        assert_eq!(
            forwarded_for("::ffff:10.0.0.1".parse().expect("address")).as_bytes(),
            b"10.0.0.1"
        );
        assert_eq!(
            forwarded_for("::1".parse().expect("address")).as_bytes(),
            b"::1"
        );
        let peer = &peer;
        let mut h = map(&[("x-forwarded-for", "6.6.6.6"), ("host", "shop")]);
        set_forwarded(&mut h, peer, false, false);
        assert_eq!(
            h.get(&X_FORWARDED_FOR).map(|v| v.as_bytes()),
            Some(&b"10.0.0.1"[..])
        );
        assert_eq!(
            h.get(&X_FORWARDED_HOST).map(|v| v.as_bytes()),
            Some(&b"shop"[..])
        );
        assert_eq!(
            h.get(&X_FORWARDED_PROTO).map(|v| v.as_bytes()),
            Some(&b"http"[..])
        );
        let mut h = map(&[
            ("x-forwarded-for", "1.1.1.1"),
            ("x-forwarded-for", "2.2.2.2"),
        ]);
        set_forwarded(&mut h, peer, false, true);
        assert_eq!(
            h.get(&X_FORWARDED_FOR).map(|v| v.as_bytes()),
            Some(&b"1.1.1.1, 2.2.2.2, 10.0.0.1"[..])
        );
    }

    #[test]
    fn cache_control_is_merged() {
        let mut h = map(&[("cache-control", "max-age=60")]);
        add_no_cache_set_cookie(&mut h);
        assert_eq!(
            h.get("cache-control").map(|v| v.as_bytes()),
            Some(&b"max-age=60, no-cache=\"set-cookie\""[..])
        );
        let mut h = HeaderMap::new();
        add_no_cache_set_cookie(&mut h);
        assert_eq!(
            h.get("cache-control").map(|v| v.as_bytes()),
            Some(&b"no-cache=\"set-cookie\""[..])
        );
        let mut h = map(&[("cache-control", "no-store")]);
        add_no_cache_set_cookie(&mut h);
        assert_eq!(
            h.get("cache-control").map(|v| v.as_bytes()),
            Some(&b"no-store"[..])
        );
    }
}
