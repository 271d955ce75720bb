//! Header rewriting on the way to a node and back: hop-by-hop removal (never of `Host` and
//! the other [`END_TO_END`] headers), `X-Forwarded-*`, the `Host` rules, `Host` for HTTP/2
//! clients, and the `Cache-Control` that keeps shared caches from storing a
//! pin.

use std::net::IpAddr;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use super::affinity::CookieEdit;

const HOP_COUNT: usize = 8;

/// Headers that describe one connection, never the message (RFC 9110 7.6.1), plus the legacy
/// ones proxies still see. And `Trailer` of a request ([`remove_hop_by_hop`]).
const HOP_BY_HOP: [HeaderName; HOP_COUNT] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    // An `h2c` offer's settings (RFC 9113 3.2.1 makes it connection-specific); limpet never
    // offers `h2c` to a node.
    HeaderName::from_static("http2-settings"),
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
    "http2-settings",
];

/// Where a (lowercase) header name stands in [`HOP_BY_HOP`], if it is hop-by-hop.
fn hop_index(name: &str) -> Option<usize> {
    HOP_NAMES.iter().position(|h| *h == name)
}

/// Headers a `Connection` line cannot remove.
const END_TO_END: [HeaderName; 3] = [header::HOST, header::CONTENT_LENGTH, header::CONTENT_TYPE];

/// Why a request's `Host` is refused (400): several `Host` fields, or an HTTP/1 absolute-form
/// target naming another host than `Host` (two parsers would disagree on which site is asked
/// for: RFC 9112 3.2.2 says the target wins, most servers read `Host`), as HAProxy refuses
/// them; and, as nginx does, an HTTP/1.1 request without `Host` or a `Host` that is not a
/// host and port (RFC 9112 3.2).
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
    // RFC 9110 7.2: `uri-host [ ":" port ]`, or empty when the target has no authority; no
    // user information, no spaces (RFC 9112 3.2: a server answers 400 to any other).
    if host.is_some_and(|h| !h.as_bytes().iter().all(|&b| host_byte(b))) {
        return Some("invalid Host");
    }
    if version >= http::Version::HTTP_2 {
        // RFC 9113 8.3.1: `:authority` carries no user information.
        return uri
            .authority()
            .is_some_and(|a| a.as_str().contains('@'))
            .then_some("user information in :authority");
    }
    if let Some(a) = uri.authority() {
        // RFC 9112 3.2.3: the authority form is for CONNECT alone (refused before this), and
        // hyper would send it on as `/`. nginx and HAProxy answer 400.
        if uri.scheme().is_none() {
            return Some("the authority form is for CONNECT only");
        }
        // RFC 9110 4.2.4: user information in an `http(s)` target is an error; without
        // `Host`, the authority stands in for it, held to the same bytes.
        if !a.as_str().as_bytes().iter().all(|&b| host_byte(b)) {
            return Some("invalid authority in the request target");
        }
    }
    if version == http::Version::HTTP_11 && host.is_none() {
        return Some("HTTP/1.1 request without Host");
    }
    match (uri.authority(), host) {
        (Some(a), Some(h)) if !a.as_str().as_bytes().eq_ignore_ascii_case(h.as_bytes()) => {
            Some("the request target and Host name different hosts")
        }
        _ => None,
    }
}

/// Whether `b` may appear in a `Host` value: what RFC 3986 allows in a host (a name's
/// unreserved, sub-delimiter and percent-encoding characters, an IP literal's brackets and
/// colons) and its port. Not `@` (no user information), white space, `/` or controls. A
/// check per byte in a table, not a parse: it runs on every HTTP/1 request, and `http`'s
/// `Authority` parser would copy the value first.
fn host_byte(b: u8) -> bool {
    const TABLE: [bool; 256] = {
        let mut t = [false; 256];
        let mut i = 0;
        while i < 256 {
            let c = i as u8;
            t[i] = c.is_ascii_alphanumeric();
            i += 1;
        }
        let extra = b"-._~!$&'()*+,;=:[]%";
        let mut j = 0;
        while j < extra.len() {
            t[extra[j] as usize] = true;
            j += 1;
        }
        t
    };
    TABLE[usize::from(b)]
}

pub(crate) static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
pub(crate) static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
pub(crate) static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
pub(crate) static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Whether hyper's HTTP/1 server closes the connection after answering `req`, by hyper's own
/// rule (hyper 1.12, `Server::parse` in `proto::h1::role`): a `close` token on any
/// `Connection` line closes it; otherwise HTTP/1.1 keeps it alive, and HTTP/1.0 only with a
/// `keep-alive` token. A line that is not text is passed over, as hyper reads lines with
/// `to_str`. It must not say "closes" where hyper keeps the connection: the last answer's
/// bytes wait for the FIN (`client_io::StreamHints::set_last_answer`).
pub(crate) fn client_closes<B>(req: &http::Request<B>) -> bool {
    let lines = || req.headers().get_all(header::CONNECTION).iter();
    let has = |v: &HeaderValue, token: &str| {
        v.to_str()
            .is_ok_and(|s| s.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
    };
    match req.version() {
        http::Version::HTTP_11 => lines().any(|v| has(v, "close")),
        http::Version::HTTP_10 => {
            !lines().any(|v| has(v, "keep-alive")) || lines().any(|v| has(v, "close"))
        }
        _ => false,
    }
}

/// A node's answer trailers without the fields no trailer may carry on to a client: the
/// hop-by-hop ones (and the names a trailer `Connection` lists) and `Content-Length`. An
/// HTTP/2 client's stream was reset at its very end for one of them (h2 refuses to send
/// connection-specific fields), after every byte of its answer; an HTTP/1.1 client's hyper
/// drops what it has not declared.
pub(crate) fn strip_trailer_hop_fields(trailers: &mut HeaderMap) {
    let listed: Vec<HeaderName> = trailers
        .get_all(header::CONNECTION)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .filter_map(|t| HeaderName::from_bytes(t.trim_ascii()).ok())
        .collect();
    for name in HOP_BY_HOP.iter().chain(&listed) {
        trailers.remove(name);
    }
    trailers.remove(header::CONTENT_LENGTH);
}

/// Whether an answer has no body whatever its headers say (RFC 9110 6.4.1, RFC 9112 6.3):
/// an answer to a HEAD, an interim (1xx) one, a 204 or a 304.
pub(crate) fn answer_has_no_body(status: http::StatusCode, head_request: bool) -> bool {
    head_request
        || status.is_informational()
        || status == http::StatusCode::NO_CONTENT
        || status == http::StatusCode::NOT_MODIFIED
}

/// Whether an answer's own `Connection` says `close` (limpet's answers to a request whose
/// framing it does not trust): hyper closes the connection after it.
pub(crate) fn answer_closes(headers: &HeaderMap) -> bool {
    headers.get_all(header::CONNECTION).iter().any(|v| {
        v.to_str()
            .is_ok_and(|s| s.split(',').any(|t| t.trim().eq_ignore_ascii_case("close")))
    })
}

/// The transfer codings of a message's `Transfer-Encoding` other than `chunked`, in order
/// (`gzip, chunked` gives `gzip`), or `None` when it names none. They say how the body is
/// encoded on this hop; a proxy that reframes the body must carry them on or refuse it, or
/// the next hop reads encoded bytes as the body itself.
pub(crate) fn other_transfer_codings(headers: &HeaderMap) -> Option<HeaderValue> {
    let mut codings: Vec<u8> = Vec::new();
    for c in headers
        .get_all(header::TRANSFER_ENCODING)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|c| !c.is_empty() && !c.eq_ignore_ascii_case(b"chunked"))
    {
        if !codings.is_empty() {
            codings.extend_from_slice(b", ");
        }
        codings.extend_from_slice(c);
    }
    if codings.is_empty() {
        return None;
    }
    HeaderValue::from_bytes(&codings).ok()
}

/// Whether the `Transfer-Encoding` lines of `headers` name `chunked` more than once (RFC
/// 9112 7: a sender must not apply it twice; HAProxy answers 400).
pub(crate) fn chunked_twice(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::TRANSFER_ENCODING)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .filter(|c| c.trim_ascii().eq_ignore_ascii_case(b"chunked"))
        .nth(1)
        .is_some()
}

/// The one value of a `Content-Length` given as a list (`5, 5`) or on several lines, or
/// `None` when it is a single value or absent. Both paths from a node have already refused
/// values that differ, so the first stands for all; RFC 9110 8.6 lets a recipient replace
/// the list with it, and a proxy that passed the list on would have strict clients refuse
/// the answer.
pub(crate) fn repeated_content_length(headers: &HeaderMap) -> Option<HeaderValue> {
    let mut lines = headers.get_all(header::CONTENT_LENGTH).iter();
    let first = lines.next()?;
    if lines.next().is_none() && !first.as_bytes().contains(&b',') {
        return None;
    }
    let value = first.as_bytes().split(|&b| b == b',').next()?.trim_ascii();
    HeaderValue::from_bytes(value).ok()
}

/// Removes hop-by-hop headers, including every header the `Connection` lines name. For an
/// upgrade (`keep_upgrade`), `Upgrade` stays and `Connection: upgrade` is written back, since
/// the upgrade must be negotiated with the node itself.
///
/// Runs twice per request (request and answer), so it works from one pass over the names
/// present: no name is parsed or allocated, and only names that are there are removed
/// (callgrind: a `remove` per candidate name was 6% of a keep-alive request's instructions).
///
/// `keep_trailer` (answers): `Trailer` is not hop-by-hop (RFC 9110 6.6.2), and hyper writes
/// an answer's trailers to an HTTP/1.1 client only for the fields it names (removed, it
/// took every trailer with it; HAProxy keeps it). A request's goes, and with it the client's
/// trailers: after the body they could carry fields limpet sets or strips for the node
/// (`X-Forwarded-For`, `X-Request-Id`, the affinity cookie) to a node that merges trailers
/// into the head.
pub(crate) fn remove_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool, keep_trailer: bool) {
    let mut present = [false; HOP_COUNT];
    for k in headers.keys() {
        if let Some(i) = hop_index(k.as_str()) {
            present[i] = true;
        }
    }
    // HOP_BY_HOP[4] is Trailer.
    present[4] &= !keep_trailer;
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
        connection_listed(headers)
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

/// Every protocol the `Upgrade` lines of `headers` offer but `h2c`, in order, as one value
/// (`websocket, foo/2`); `None` when no other is offered.
pub(crate) fn upgrade_offer(headers: &HeaderMap) -> Option<HeaderValue> {
    let mut offer: Vec<u8> = Vec::new();
    for p in upgrade_protocols(headers).filter(|p| !p.eq_ignore_ascii_case(b"h2c")) {
        if !offer.is_empty() {
            offer.extend_from_slice(b", ");
        }
        offer.extend_from_slice(p);
    }
    if offer.is_empty() {
        return None;
    }
    HeaderValue::from_bytes(&offer).ok()
}

/// The protocols of the `Upgrade` lines of `headers`, each trimmed, empty ones left out.
fn upgrade_protocols(headers: &HeaderMap) -> impl Iterator<Item = &[u8]> {
    headers
        .get_all(header::UPGRADE)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|p| !p.is_empty())
}

/// Whether a node's 101 `answer` switches to protocols of `offer` alone (RFC 9110 7.8: the
/// server's `Upgrade` says what it switches to, among those the client listed). Compared as
/// tokens, in any case. A 101 that names none (no `Upgrade`, against the RFC's "must") is
/// taken as it was before, when the client offered one protocol: that one.
pub(crate) fn switched_as_offered(answer: &HeaderMap, offer: &HeaderValue) -> bool {
    let offered = || {
        offer
            .as_bytes()
            .split(|&b| b == b',')
            .map(<[u8]>::trim_ascii)
    };
    let mut named = false;
    for p in upgrade_protocols(answer) {
        if !offered().any(|o| o.eq_ignore_ascii_case(p)) {
            return false;
        }
        named = true;
    }
    named || offered().count() == 1
}

/// Whether a `Connection` line lists anything but hop-by-hop names (`keep-alive`,
/// `upgrade`), which go anyway: most lines list only those, and need no matching.
fn lists_other_names(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .any(|v| !lists_only_hop_names(v.as_bytes()))
}

/// Whether one `Connection` value lists only hop-by-hop names: removing the hop-by-hop
/// headers removes all it names, so the line itself is all that needs to go.
pub(crate) fn lists_only_hop_names(value: &[u8]) -> bool {
    // The line nearly every kept-alive answer carries, without splitting it into tokens
    // (a third of what the general case costs, callgrind).
    if value.eq_ignore_ascii_case(b"keep-alive") {
        return true;
    }
    value
        .split(|&b| b == b',')
        .map(<[u8]>::trim_ascii)
        .all(|t| {
            t.is_empty()
                || HOP_NAMES
                    .iter()
                    .any(|h| t.eq_ignore_ascii_case(h.as_bytes()))
        })
}

/// The names present in `headers` that a `Connection` line lists, but for the hop-by-hop
/// ones (removed anyway) and the END_TO_END ones (never removed). One pass over the listed
/// tokens, each looked up among the names present: matching every name present against every
/// token cost their product, and a head of 100 names with a 64 KiB `Connection` line of short
/// tokens (an answer's may be 400 KiB) made a request cost tens of milliseconds of a worker.
/// Tokens compare case-insensitively (the map's names are lowercase).
fn connection_listed(headers: &HeaderMap) -> Vec<HeaderName> {
    let mut names: std::collections::HashMap<&[u8], &HeaderName> = headers
        .keys()
        .filter(|k| !HOP_BY_HOP.contains(k) && !END_TO_END.contains(k))
        .map(|k| (k.as_str().as_bytes(), k))
        .collect();
    let mut listed = Vec::new();
    let mut token = Vec::new();
    for t in headers
        .get_all(header::CONNECTION)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
    {
        if names.is_empty() {
            break;
        }
        token.clear();
        token.extend(t.iter().map(u8::to_ascii_lowercase));
        if let Some(name) = names.remove(token.as_slice()) {
            listed.push(name.clone());
        }
    }
    listed
}

/// The client's address as `X-Forwarded-For` writes it (an IPv4-mapped IPv6 address as the
/// IPv4 one). Made once per client connection, since formatting an address costs more than
/// the rest of [`Forwarding::new`].
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

/// The fields limpet adds to a request it forwards: `Host` for an HTTP/2 client that sent
/// none, `X-Forwarded-For/-Proto/-Host` and `X-Request-Id`. They are kept beside the client's
/// fields instead of inserted among them, and so is what becomes of the client's `Cookie`
/// line once our pairs are out ([`CookieEdit`]): the node-side HTTP/1.1 writer (`super::node_h1`)
/// writes them after the client's fields straight into the head's bytes
/// ([`Forwarding::write_fields`]), and only hyper's client path, which needs one map, gets them
/// inserted ([`Forwarding::insert_into`]). Five inserts into a `HeaderMap` (each a hash, a
/// probe and, as the map outgrows its table, a rehash) and two values copied out were about
/// 3% of an HTTP/2 request's instructions and 4% of a keep-alive HTTP/1.1 one's (callgrind).
///
/// Whichever path carries the request, the node sees the same fields (a test checks that).
#[derive(Debug, Clone)]
pub(crate) struct Forwarding<'a> {
    /// `Host`, from HTTP/2's `:authority`, when the request has no `Host` field.
    host: Option<HeaderValue>,
    /// `X-Forwarded-For`: the connection's address, after a trusted peer's chain.
    forwarded_for: HeaderValue,
    /// `X-Forwarded-Proto`, unless a trusted peer's is kept.
    proto: Option<&'static str>,
    /// Whether `X-Forwarded-Host` is written, as a copy of `Host` (there is one to copy, and
    /// no trusted peer's is kept).
    copy_host: bool,
    request_id: &'a str,
    /// The client's `Cookie` line without our pairs.
    cookie: CookieEdit,
}

/// Which of the fields [`Forwarding`] writes the client sent too.
#[derive(Default)]
struct Sent {
    /// `Host` itself (whether `:authority` must stand in for it).
    host_field: bool,
    forwarded_for: bool,
    proto: bool,
    forwarded_host: bool,
    request_id: bool,
    /// RFC 7239's `Forwarded`, which nodes' frameworks read before the `X-Forwarded-*`
    /// fields: it says the same things, and from an untrusted peer it is as forged.
    forwarded: bool,
    /// Names that read as one of limpet's fields with `_` for `-` (`X-Forwarded_For`):
    /// servers that map names to CGI-style variables (`HTTP_X_FORWARDED_FOR`) let such a
    /// field overwrite limpet's. nginx drops every name with `_` by default.
    underscored: Vec<HeaderName>,
}

impl Sent {
    /// One pass over the names present: most requests carry none of these, and a `remove`
    /// per name would cost what the inserts did.
    fn scan(headers: &HeaderMap) -> Self {
        let mut sent = Self::default();
        for k in headers.keys() {
            // A tag comparison: `Host` is one of the map's standard names.
            if k == header::HOST {
                sent.host_field = true;
                continue;
            }
            match k.as_str() {
                "x-forwarded-for" => sent.forwarded_for = true,
                "x-forwarded-proto" => sent.proto = true,
                "x-forwarded-host" => sent.forwarded_host = true,
                "x-request-id" => sent.request_id = true,
                "forwarded" => sent.forwarded = true,
                name if name.as_bytes().contains(&b'_') && reads_as_limpets(name) => {
                    sent.underscored.push(k.clone());
                }
                _ => {}
            }
        }
        sent
    }
}

/// Whether a name with `_` in it reads as one of the fields limpet writes or strips for the
/// node once each `_` is taken for `-`.
fn reads_as_limpets(name: &str) -> bool {
    [
        "x-forwarded-for",
        "x-forwarded-proto",
        "x-forwarded-host",
        "x-request-id",
        "forwarded",
    ]
    .iter()
    .any(|ours| {
        ours.len() == name.len()
            && ours
                .bytes()
                .zip(name.bytes())
                .all(|(o, n)| o == n || (o == b'-' && n == b'_'))
    })
}

impl<'a> Forwarding<'a> {
    /// What to add to `headers` on the way to a node, removing from them the client's fields
    /// that limpet's replace. `peer` is the connection's [`forwarded_for`]; `authority` is the
    /// request target's, which becomes `Host` when the client sent none (HTTP/2).
    ///
    /// A trusted peer's `X-Forwarded-For` is extended with the peer; its `-Proto` and `-Host`
    /// describe the original request better than we can and are kept. From any other peer,
    /// all three are replaced: a client cannot forge its address. A client's `X-Request-Id`
    /// is always replaced by limpet's own (the id its access log names).
    pub(crate) fn new(
        headers: &mut HeaderMap,
        authority: Option<&http::uri::Authority>,
        peer: &HeaderValue,
        tls: bool,
        trusted: bool,
        request_id: &'a str,
        cookie: CookieEdit,
    ) -> Self {
        let sent = Sent::scan(headers);
        // Nodes are spoken to in HTTP/1.1, which requires a Host line: the target's
        // authority, or an empty one when the request has none (an HTTP/1.0 request without
        // Host, an HTTP/2 one without `:authority`), as RFC 9112 3.2 says a client sends then.
        let host = if sent.host_field {
            None
        } else {
            Some(
                authority
                    .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
                    .unwrap_or_else(|| HeaderValue::from_static("")),
            )
        };
        let has_host = host.as_ref().is_some_and(|h| !h.is_empty()) || sent.host_field;
        let mut forwarded_for = None;
        if sent.forwarded_for {
            if trusted {
                let lines: Vec<&str> = headers
                    .get_all(&X_FORWARDED_FOR)
                    .iter()
                    .filter_map(|v| v.to_str().ok())
                    .map(str::trim)
                    .filter(|v| !v.is_empty())
                    .collect();
                if !lines.is_empty() {
                    let chain = format!(
                        "{}, {}",
                        lines.join(", "),
                        String::from_utf8_lossy(peer.as_bytes())
                    );
                    forwarded_for = HeaderValue::try_from(chain).ok();
                }
            }
            headers.remove(&X_FORWARDED_FOR);
        }
        let keep_proto = trusted && sent.proto;
        let keep_host = trusted && sent.forwarded_host;
        if sent.proto && !keep_proto {
            headers.remove(&X_FORWARDED_PROTO);
        }
        if sent.forwarded_host && !keep_host {
            headers.remove(&X_FORWARDED_HOST);
        }
        if sent.request_id {
            headers.remove(&X_REQUEST_ID);
        }
        // A trusted peer's `Forwarded` describes the original request, as its `-Proto` and
        // `-Host` do; limpet writes none of its own (HAProxy's `option forwarded` is opt-in).
        if sent.forwarded && !trusted {
            headers.remove(header::FORWARDED);
        }
        for name in &sent.underscored {
            headers.remove(name);
        }
        Forwarding {
            host,
            forwarded_for: forwarded_for.unwrap_or_else(|| peer.clone()),
            proto: (!keep_proto).then_some(if tls { "https" } else { "http" }),
            copy_host: !keep_host && has_host,
            request_id,
            cookie,
        }
    }

    /// Writes the request's fields as `name: value` lines: the client's as forwarded (its
    /// `Cookie` line as [`CookieEdit`] says), then limpet's own.
    pub(crate) fn write_fields(&self, out: &mut Vec<u8>, headers: &HeaderMap) {
        let mut host = None;
        for (name, value) in headers {
            // Tag comparisons: `Host` and `Cookie` are among the map's standard names.
            if name == header::HOST {
                host = Some(value);
            }
            let value = if name == header::COOKIE {
                match &self.cookie {
                    CookieEdit::Keep => value,
                    CookieEdit::Drop => continue,
                    CookieEdit::Replace(v) => v,
                }
            } else {
                value
            };
            out.extend_from_slice(name.as_str().as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        // Each name is written with its `: ` in one piece: three copies a field, not four.
        let mut line = |name_colon: &[u8], value: &[u8]| {
            out.extend_from_slice(name_colon);
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        };
        if let Some(h) = &self.host {
            line(b"host: ", h.as_bytes());
        }
        line(b"x-forwarded-for: ", self.forwarded_for.as_bytes());
        if let Some(p) = self.proto {
            line(b"x-forwarded-proto: ", p.as_bytes());
        }
        if self.copy_host {
            if let Some(h) = self.host.as_ref().or(host) {
                line(b"x-forwarded-host: ", h.as_bytes());
            }
        }
        line(b"x-request-id: ", self.request_id.as_bytes());
    }

    /// Inserts the fields into `headers` (and edits its `Cookie` line), for hyper's client
    /// path.
    pub(crate) fn insert_into(self, headers: &mut HeaderMap) {
        self.cookie.apply(headers);
        if let Some(h) = self.host {
            headers.insert(header::HOST, h);
        }
        headers.insert(&X_FORWARDED_FOR, self.forwarded_for);
        if let Some(p) = self.proto {
            headers.insert(&X_FORWARDED_PROTO, HeaderValue::from_static(p));
        }
        if self.copy_host {
            if let Some(h) = headers.get(header::HOST).cloned() {
                headers.insert(&X_FORWARDED_HOST, h);
            }
        }
        // Request ids are limpet's own hex text: always a valid value.
        if let Ok(v) = HeaderValue::from_str(self.request_id) {
            headers.insert(&X_REQUEST_ID, v);
        }
    }
}

/// The most an answer head to an HTTP/2 client may hold, as a field section's size (RFC 9113
/// 6.5.2: each field's name and value, plus 32). HTTP/2 carries a head in HEADERS and
/// CONTINUATION frames of 16 KiB, and clients bound how many of those they read (nghttp2,
/// and so curl and h2load, at most 8 CONTINUATION frames since CVE-2024-28182) and take more
/// for an attack on the whole connection: every other stream on it is lost. A node's head
/// past this is that stream's 502, as nginx (`proxy_buffer_size`, 4 or 8 KiB) and HAProxy
/// (`tune.bufsize`, 16 KiB) answer heads past their buffers; HTTP/1 clients take heads up
/// to the node-side limit.
pub(crate) const H2_MAX_ANSWER_HEAD: usize = 64 * 1024;

/// Whether `headers` is larger than [`H2_MAX_ANSWER_HEAD`] as a field section (stops
/// counting once it is).
pub(crate) fn too_large_for_h2(headers: &HeaderMap) -> bool {
    fits_h2_with(headers, 0).is_none()
}

/// What `headers` and `more` bytes of fields (as a field section counts them) leave of
/// [`H2_MAX_ANSWER_HEAD`]; `None` when they do not fit (counting stops there).
pub(crate) fn fits_h2_with(headers: &HeaderMap, more: usize) -> Option<usize> {
    let mut size = more;
    for (n, v) in headers {
        size += n.as_str().len() + v.len() + 32;
        if size > H2_MAX_ANSWER_HEAD {
            return None;
        }
    }
    H2_MAX_ANSWER_HEAD.checked_sub(size)
}

/// The most [`add_no_cache_set_cookie`] adds to a field section: its directive, a separator,
/// and a field of its own.
pub(crate) const NO_CACHE_SET_COOKIE_SIZE: usize = 13 + 32 + 24;

/// Adds `no-cache="set-cookie"` to `Cache-Control`, keeping the node's directives. Nothing is
/// added when a stronger directive (`no-store`, `private`, bare `no-cache`) is already there.
pub(crate) fn add_no_cache_set_cookie(headers: &mut HeaderMap) {
    const OURS: &[u8] = b"no-cache=\"set-cookie\"";
    // As bytes: a node's value that is not text (an extension's quoted value of bytes above
    // 0x7f) is kept as it came. Read as text, it was left out of the merge and the merged
    // line replaced it, a `private` beside it lost (a shared cache could then keep the
    // answer).
    let existing: Vec<&[u8]> = headers
        .get_all(header::CACHE_CONTROL)
        .iter()
        .map(|v| v.as_bytes().trim_ascii())
        .filter(|v| !v.is_empty())
        .collect();
    let covered = existing
        .iter()
        .flat_map(|v| v.split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
        .any(|d| {
            d.eq_ignore_ascii_case(b"no-store")
                || d.eq_ignore_ascii_case(b"private")
                || d.eq_ignore_ascii_case(b"no-cache")
                || d.eq_ignore_ascii_case(OURS)
        });
    if covered {
        return;
    }
    let mut merged = existing.join(&b", "[..]);
    if !merged.is_empty() {
        merged.extend_from_slice(b", ");
    }
    merged.extend_from_slice(OURS);
    if let Ok(v) = HeaderValue::from_bytes(&merged) {
        headers.insert(header::CACHE_CONTROL, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The HTTP/2 answer head limit counts a field section as RFC 9113 does: name, value
    /// and 32 per field, so many small fields count as well as one large one.
    #[test]
    fn an_answer_head_is_too_large_for_http2_by_its_field_section_size() {
        let mut h = HeaderMap::new();
        let v = HeaderValue::from_bytes(&vec![b'a'; H2_MAX_ANSWER_HEAD - 32 - 5]).expect("value");
        h.insert("x-big", v);
        assert!(!too_large_for_h2(&h), "exactly at the limit");
        h.insert("x", HeaderValue::from_static(""));
        assert!(too_large_for_h2(&h), "one empty field more: 33 over");
        let mut many = HeaderMap::new();
        for i in 0..(H2_MAX_ANSWER_HEAD / 64 + 1) {
            many.append(
                HeaderName::from_bytes(format!("x-{i:05}").as_bytes()).expect("name"),
                HeaderValue::from_static("0123456789012345678901234"),
            );
        }
        assert!(too_large_for_h2(&many), "64 bytes a field, counted");
    }

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

    /// An answer's `Trailer` stays (it names the trailers the client gets); a request's goes.
    #[test]
    fn an_answer_keeps_its_trailer_field_and_a_request_loses_it() {
        assert_eq!(HOP_NAMES[4], "trailer");
        let fields = [("trailer", "x-sum"), ("te", "trailers"), ("x-kept", "1")];
        let mut answer = map(&fields);
        remove_hop_by_hop(&mut answer, false, true);
        assert_eq!(answer.len(), 2);
        assert!(answer.contains_key("trailer") && answer.contains_key("x-kept"));
        let mut request = map(&fields);
        remove_hop_by_hop(&mut request, false, false);
        assert_eq!(request.len(), 1);
        assert!(request.contains_key("x-kept"));
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
        remove_hop_by_hop(&mut h, false, false);
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
        remove_hop_by_hop(&mut h, false, false);
        let mut names: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        names.sort_unstable();
        assert_eq!(names, ["host", "x-kept"]);
        // A line of many tokens, names listed twice: each listed name goes once, the rest
        // stay.
        let mut pairs: Vec<(String, String)> = (0..90)
            .map(|i| (format!("x-h{i}"), "1".to_owned()))
            .collect();
        let mut line = "x,".repeat(20_000);
        line.push_str("X-H7, x-h7, x-h89");
        pairs.push(("connection".into(), line));
        let mut h = HeaderMap::new();
        for (name, value) in &pairs {
            h.append(
                HeaderName::from_bytes(name.as_bytes()).expect("name"),
                HeaderValue::from_str(value).expect("value"),
            );
        }
        remove_hop_by_hop(&mut h, false, false);
        assert_eq!(h.len(), 88);
        assert!(!h.contains_key("x-h7") && !h.contains_key("x-h89") && h.contains_key("x-h8"));
        // Nothing hop-by-hop: nothing changes, even a header that a Connection line would name.
        let mut h = map(&[("x-other", "1"), ("host", "shop")]);
        remove_hop_by_hop(&mut h, false, false);
        assert_eq!(h.len(), 2);
    }

    /// An upgrade offers the node every protocol the client listed, on any of its lines,
    /// but `h2c`, whose settings go too; a 101 must switch to protocols of that offer.
    #[test]
    fn an_upgrade_offers_all_but_h2c_and_is_answered_within_the_offer() {
        let offer = |pairs: &[(&'static str, &'static str)]| {
            upgrade_offer(&map(pairs)).map(|v| v.as_bytes().to_vec())
        };
        assert_eq!(
            offer(&[("upgrade", "h2c"), ("upgrade", "websocket")]),
            Some(b"websocket".to_vec())
        );
        assert_eq!(
            offer(&[("upgrade", "foo/2, H2C ,websocket"), ("upgrade", "bar")]),
            Some(b"foo/2, websocket, bar".to_vec())
        );
        assert_eq!(offer(&[("upgrade", "h2c")]), None);
        assert_eq!(offer(&[("upgrade", " , ")]), None);
        let mut h = map(&[("http2-settings", "AAMAAABkAAQAAP__"), ("x-kept", "1")]);
        remove_hop_by_hop(&mut h, true, false);
        assert!(!h.contains_key("http2-settings") && h.contains_key("x-kept"));

        let offered = HeaderValue::from_static("websocket, foo/2");
        let switched = |v: &'static str| switched_as_offered(&map(&[("upgrade", v)]), &offered);
        assert!(switched("websocket"));
        assert!(switched("WebSocket"));
        assert!(switched("foo/2"));
        assert!(!switched("h2c"));
        assert!(!switched("foo"));
        assert!(!switched("websocket, h2c"));
        // Nothing named: taken for the one protocol offered, refused among several.
        assert!(!switched(""));
        assert!(!switched_as_offered(&HeaderMap::new(), &offered));
        let one = HeaderValue::from_static("websocket");
        assert!(switched_as_offered(&HeaderMap::new(), &one));
    }

    #[test]
    fn upgrades_keep_upgrade() {
        let mut h = map(&[
            ("connection", "keep-alive, Upgrade"),
            ("upgrade", "websocket"),
        ]);
        remove_hop_by_hop(&mut h, true, false);
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

    /// A request's fields as the node gets them on hyper's client path.
    fn forwarded(
        mut h: HeaderMap,
        authority: Option<&str>,
        peer: &HeaderValue,
        tls: bool,
        trusted: bool,
    ) -> HeaderMap {
        let authority = authority.map(|a| a.parse::<http::uri::Authority>().expect("authority"));
        let f = Forwarding::new(
            &mut h,
            authority.as_ref(),
            peer,
            tls,
            trusted,
            "00ab-1",
            CookieEdit::Keep,
        );
        f.insert_into(&mut h);
        h
    }

    fn value<'h>(h: &'h HeaderMap, name: &HeaderName) -> Option<&'h [u8]> {
        h.get(name).map(HeaderValue::as_bytes)
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
        let client = map(&[
            ("x-forwarded-for", "6.6.6.6"),
            ("x-forwarded-proto", "gopher"),
            ("x-forwarded-host", "forged"),
            ("x-request-id", "mine"),
            ("host", "shop"),
        ]);
        let h = forwarded(client.clone(), None, peer, false, false);
        assert_eq!(value(&h, &X_FORWARDED_FOR), Some(&b"10.0.0.1"[..]));
        assert_eq!(value(&h, &X_FORWARDED_HOST), Some(&b"shop"[..]));
        assert_eq!(value(&h, &X_FORWARDED_PROTO), Some(&b"http"[..]));
        assert_eq!(value(&h, &X_REQUEST_ID), Some(&b"00ab-1"[..]));
        assert_eq!(h.get_all(&X_FORWARDED_FOR).iter().count(), 1);
        // A trusted peer's -Proto and -Host stay; its -For is extended; the id is limpet's.
        let h = forwarded(client.clone(), None, peer, true, true);
        assert_eq!(value(&h, &X_FORWARDED_FOR), Some(&b"6.6.6.6, 10.0.0.1"[..]));
        assert_eq!(value(&h, &X_FORWARDED_HOST), Some(&b"forged"[..]));
        assert_eq!(value(&h, &X_FORWARDED_PROTO), Some(&b"gopher"[..]));
        assert_eq!(value(&h, &X_REQUEST_ID), Some(&b"00ab-1"[..]));
        let h = forwarded(
            map(&[
                ("x-forwarded-for", "1.1.1.1"),
                ("x-forwarded-for", "2.2.2.2"),
            ]),
            None,
            peer,
            true,
            true,
        );
        assert_eq!(
            value(&h, &X_FORWARDED_FOR),
            Some(&b"1.1.1.1, 2.2.2.2, 10.0.0.1"[..])
        );
        assert_eq!(value(&h, &X_FORWARDED_PROTO), Some(&b"https"[..]));
    }

    /// RFC 7239's `Forwarded` says what the `X-Forwarded-*` fields say, and frameworks read
    /// it first: an untrusted peer's goes, a trusted one's stays. A name that reads as one of
    /// limpet's with `_` for `-` goes whoever sent it (a CGI-style server maps both to
    /// `HTTP_X_FORWARDED_FOR`); other names with `_` stay.
    #[test]
    fn forwarded_and_underscored_look_alikes_are_not_passed_on_as_the_client_s() {
        let peer = &forwarded_for([10, 0, 0, 1].into());
        let client = map(&[
            ("forwarded", "for=6.6.6.6;proto=https;host=admin"),
            ("x-forwarded_for", "6.6.6.6"),
            ("x_forwarded_proto", "https"),
            ("x-forwarded_host", "admin"),
            ("x_request_id", "mine"),
            ("x_forwarded", "kept"),
            ("x-api_key", "kept"),
            ("host", "shop"),
        ]);
        for trusted in [false, true] {
            let h = forwarded(client.clone(), None, peer, false, trusted);
            for gone in [
                "x-forwarded_for",
                "x_forwarded_proto",
                "x-forwarded_host",
                "x_request_id",
            ] {
                assert!(!h.contains_key(gone), "{gone} (trusted: {trusted})");
            }
            assert_eq!(
                h.contains_key(header::FORWARDED),
                trusted,
                "trusted: {trusted}"
            );
            assert!(h.contains_key("x_forwarded") && h.contains_key("x-api_key"));
            // The look-alike never extended the chain.
            assert_eq!(value(&h, &X_FORWARDED_FOR), Some(&b"10.0.0.1"[..]));
        }
    }

    #[test]
    fn http2_authority_becomes_host_and_forwarded_host() {
        let peer = &forwarded_for([10, 0, 0, 1].into());
        let h = forwarded(HeaderMap::new(), Some("shop:8443"), peer, true, false);
        assert_eq!(value(&h, &header::HOST), Some(&b"shop:8443"[..]));
        assert_eq!(value(&h, &X_FORWARDED_HOST), Some(&b"shop:8443"[..]));
        // A Host field of the client's wins over :authority.
        let h = forwarded(map(&[("host", "a")]), Some("b"), peer, true, false);
        assert_eq!(h.get_all(header::HOST).iter().count(), 1);
        assert_eq!(value(&h, &header::HOST), Some(&b"a"[..]));
        assert_eq!(value(&h, &X_FORWARDED_HOST), Some(&b"a"[..]));
        // No host at all: an empty Host (HTTP/1.1 to the node needs one), no -Host, and a
        // client's is not passed on.
        let h = forwarded(
            map(&[("x-forwarded-host", "forged")]),
            None,
            peer,
            false,
            false,
        );
        assert_eq!(value(&h, &X_FORWARDED_HOST), None);
        assert_eq!(value(&h, &header::HOST), Some(&b""[..]));
    }

    /// The fields of a forwarded request as `node_h1` writes them ([`Forwarding::write_fields`]),
    /// read back as (name, value) pairs.
    fn written(h: &HeaderMap, f: &Forwarding<'_>) -> Vec<(String, Vec<u8>)> {
        let mut out = Vec::new();
        f.write_fields(&mut out, h);
        out.split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| {
                let l = l.strip_suffix(b"\r").expect("CRLF");
                let colon = l.iter().position(|b| *b == b':').expect("colon");
                let name = String::from_utf8(l[..colon].to_vec()).expect("name");
                (name, l[colon + 2..].to_vec())
            })
            .collect()
    }

    proptest::proptest! {
        /// Both ways to a node carry the same fields: what `node_h1` writes is what hyper's
        /// client gets in its map, whatever the client sent, however it is trusted and
        /// whatever becomes of its `Cookie` line.
        #[test]
        fn written_fields_are_the_inserted_ones(
            host in proptest::option::of("[a-z]{1,4}"),
            authority in proptest::option::of("[a-z]{1,4}"),
            xff in proptest::collection::vec("[0-9.]{0,7}", 0..3),
            xfp in proptest::option::of("[a-z]{0,5}"),
            xfh in proptest::option::of("[a-z]{0,5}"),
            xri in proptest::option::of("[a-z0-9]{1,5}"),
            tls in proptest::prelude::any::<bool>(),
            trusted in proptest::prelude::any::<bool>(),
            cookie in proptest::option::of("[a-z]{1,3}=[a-z0-9]{1,3}(; [a-z]{1,3}=[a-z0-9]{1,3}){0,2}"),
            edit in 0u8..3,
        ) {
            let mut h = HeaderMap::new();
            h.append("x-other", HeaderValue::from_static("1"));
            // An edit is only ever made of a Cookie line the request has (`Affinity::strip`).
            let edit = match (&cookie, edit) {
                (Some(c), _) => {
                    h.append(header::COOKIE, HeaderValue::from_str(c).expect("cookie"));
                    match edit {
                        0 => CookieEdit::Keep,
                        1 => CookieEdit::Drop,
                        _ => CookieEdit::Replace(HeaderValue::from_static("kept=1")),
                    }
                }
                (None, _) => CookieEdit::Keep,
            };
            let fields = host.iter().map(|v| (header::HOST, v))
                .chain(xff.iter().map(|v| (X_FORWARDED_FOR.clone(), v)))
                .chain(xfp.iter().map(|v| (X_FORWARDED_PROTO.clone(), v)))
                .chain(xfh.iter().map(|v| (X_FORWARDED_HOST.clone(), v)))
                .chain(xri.iter().map(|v| (X_REQUEST_ID.clone(), v)));
            for (k, v) in fields {
                h.append(k, HeaderValue::from_str(v).expect("value"));
            }
            let authority = authority.map(|a| a.parse::<http::uri::Authority>().expect("authority"));
            let peer = forwarded_for([10, 0, 0, 1].into());
            let f = Forwarding::new(&mut h, authority.as_ref(), &peer, tls, trusted, "7f-2", edit);
            let mut got = written(&h, &f);
            let mut inserted = h.clone();
            f.insert_into(&mut inserted);
            let mut want: Vec<(String, Vec<u8>)> = inserted
                .iter()
                .map(|(k, v)| (k.as_str().to_owned(), v.as_bytes().to_vec()))
                .collect();
            got.sort();
            want.sort();
            proptest::prop_assert_eq!(got, want);
        }
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
        // A node's lines that are not text are kept, and a `private` among them counts
        // (before, such a line was left out of the merge, and its `private` lost).
        let mut h = HeaderMap::new();
        h.append(
            header::CACHE_CONTROL,
            HeaderValue::from_bytes(b"max-age=5, x=\"\xe9\"").expect("value"),
        );
        add_no_cache_set_cookie(&mut h);
        assert_eq!(
            h.get("cache-control").map(|v| v.as_bytes()),
            Some(&b"max-age=5, x=\"\xe9\", no-cache=\"set-cookie\""[..])
        );
        let mut h = HeaderMap::new();
        h.append(
            header::CACHE_CONTROL,
            HeaderValue::from_bytes(b"private, x=\"\xe9\"").expect("value"),
        );
        add_no_cache_set_cookie(&mut h);
        assert_eq!(
            h.get("cache-control").map(|v| v.as_bytes()),
            Some(&b"private, x=\"\xe9\""[..])
        );
    }
}
