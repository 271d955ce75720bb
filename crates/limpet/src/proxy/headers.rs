//! Header rewriting on the way to a node and back: hop-by-hop removal (never of `Host` and
//! the other [`END_TO_END`] headers), `X-Forwarded-*`, the `Host` rules, `Host` for HTTP/2
//! clients, and the `Cache-Control` that keeps shared caches from storing a
//! pin.

use std::net::IpAddr;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// Headers that describe one connection, never the message (RFC 9110 7.6.1), plus the legacy
/// ones proxies still see.
const HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

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
pub(crate) fn remove_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) {
    // Names listed in Connection are removed too (e.g. `Connection: close, X-Secret`).
    let listed: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in listed {
        if keep_upgrade && name == header::UPGRADE {
            continue;
        }
        // A name listed in Connection is the sender's claim that the header is hop-by-hop;
        // these never are: the node needs them to know what is asked and how long it is
        // (`Connection: close, Host` would otherwise strip the Host the node routes on).
        if END_TO_END.contains(&name) {
            continue;
        }
        headers.remove(name);
    }
    let upgrade = if keep_upgrade {
        headers.remove(header::UPGRADE)
    } else {
        None
    };
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
    if let Some(proto) = upgrade {
        headers.insert(header::UPGRADE, proto);
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
}

/// Sets `X-Forwarded-For/-Proto/-Host`. A trusted peer's `X-Forwarded-For` is extended with
/// the peer; its `-Proto` and `-Host` describe the original request better than we can and are
/// kept. From any other peer, all three are replaced: a client cannot forge its address.
pub(crate) fn set_forwarded(headers: &mut HeaderMap, peer: IpAddr, tls: bool, trusted: bool) {
    let peer = match peer {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(peer, IpAddr::V4),
        v4 => v4,
    };
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
        Some(p) => format!("{p}, {peer}"),
        None => peer.to_string(),
    };
    if let Ok(v) = HeaderValue::try_from(xff) {
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

    #[test]
    fn forwarded_for_is_replaced_unless_trusted() {
        let peer: IpAddr = [10, 0, 0, 1].into();
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
