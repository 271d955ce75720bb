//! The PROXY protocol (HAProxy's, versions 1 and 2), sans-io: parse a header from the first
//! bytes of a connection, and write one for a connection to a node.
//!
//! A balancer in front of limpet (or limpet in front of a node) prepends one header to the
//! stream naming the real client address, so source-IP affinity works behind another
//! balancer and nodes see the real client.
//!
//! ```text
//!  first bytes read ──► parse(&buf) ─┬─ Ok(Parsed { header, consumed }) ─► skip `consumed`,
//!                                    │                                      the rest is payload
//!                                    ├─ Err(Incomplete) ─► read more and call again
//!                                    ├─ Err(NotProxy)   ─► no header: the bytes are payload
//!                                    └─ Err(Invalid)    ─► refuse the connection
//!  (src, dst) ──► write_v1 / write_v2 ──► bytes to send first on the node connection
//! ```
//!
//! Whether a header is *accepted* at all (only from trusted peers) is the caller's decision:
//! this module only reads and writes bytes. Nothing here panics on any input; the property
//! test below feeds it arbitrary bytes.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The 12-byte signature that opens a version 2 header.
pub const V2_SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";

/// The longest version 1 header, CRLF included (spec section 2.1).
pub const V1_MAX_LEN: usize = 107;

/// The largest version 2 header limpet accepts: the 16 fixed bytes plus addresses and TLVs.
/// The format allows 65 535 bytes of payload; real headers are well under 1 KiB, and a bound
/// keeps a peer from making us buffer 64 KiB before a connection even starts.
pub const V2_MAX_LEN: usize = 16 + 4096;

/// Which version a header was written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

/// What a header says about the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Header {
    /// A proxied TCP connection: the real client (`src`) and the address it connected to.
    Proxied { src: SocketAddr, dst: SocketAddr },
    /// No address to use: v1 `UNKNOWN`, v2 `LOCAL` (health checks of the sender), or an
    /// address family other than TCP over IPv4/IPv6. The peer's own address stands.
    Unknown,
}

/// A parsed header and how many bytes of the buffer it took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parsed {
    pub header: Header,
    pub version: Version,
    pub consumed: usize,
}

/// Why [`parse`] returned no header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParseError {
    /// The bytes so far are a valid beginning of a header: read more.
    Incomplete,
    /// The bytes cannot begin a header (the connection does not speak the PROXY protocol).
    NotProxy,
    /// A header that breaks the format; the connection should be refused.
    Invalid(&'static str),
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ParseError::Incomplete => f.write_str("incomplete PROXY header"),
            ParseError::NotProxy => f.write_str("no PROXY header"),
            ParseError::Invalid(why) => write!(f, "invalid PROXY header: {why}"),
        }
    }
}

impl std::error::Error for ParseError {}

/// Parses a PROXY header (v1 or v2) at the start of `buf`.
pub fn parse(buf: &[u8]) -> Result<Parsed, ParseError> {
    const V1_PREFIX: &[u8] = b"PROXY ";
    if starts_like(buf, &V2_SIGNATURE) {
        if buf.len() < V2_SIGNATURE.len() {
            return Err(ParseError::Incomplete);
        }
        return parse_v2(buf);
    }
    if starts_like(buf, V1_PREFIX) {
        if buf.len() < V1_PREFIX.len() {
            return Err(ParseError::Incomplete);
        }
        return parse_v1(buf);
    }
    Err(ParseError::NotProxy)
}

/// Whether `buf` and `prefix` agree on their common length.
fn starts_like(buf: &[u8], prefix: &[u8]) -> bool {
    let n = buf.len().min(prefix.len());
    buf[..n] == prefix[..n]
}

fn parse_v1(buf: &[u8]) -> Result<Parsed, ParseError> {
    let window = &buf[..buf.len().min(V1_MAX_LEN)];
    let Some(cr) = window.iter().position(|&b| b == b'\r') else {
        if buf.len() >= V1_MAX_LEN {
            return Err(ParseError::Invalid("v1 line longer than 107 bytes"));
        }
        if window.contains(&b'\n') {
            return Err(ParseError::Invalid("v1 line without CR"));
        }
        return Err(ParseError::Incomplete);
    };
    // The CR found in the window's last byte would make a line of 108 with its LF.
    if cr + 2 > V1_MAX_LEN {
        return Err(ParseError::Invalid("v1 line longer than 107 bytes"));
    }
    match buf.get(cr + 1) {
        None => return Err(ParseError::Incomplete),
        Some(b'\n') => {}
        Some(_) => return Err(ParseError::Invalid("v1 CR not followed by LF")),
    }
    let line = std::str::from_utf8(&buf[..cr]).map_err(|_| ParseError::Invalid("v1 not ASCII"))?;
    let consumed = cr + 2;
    let mut parts = line.split(' ');
    // "PROXY"
    parts.next();
    let header = match parts.next() {
        Some("UNKNOWN") => Header::Unknown,
        Some(proto @ ("TCP4" | "TCP6")) => {
            let missing = ParseError::Invalid("v1 missing field");
            let src_ip = parts.next().ok_or(missing)?;
            let dst_ip = parts.next().ok_or(missing)?;
            let src_port = parts.next().ok_or(missing)?;
            let dst_port = parts.next().ok_or(missing)?;
            if parts.next().is_some() {
                return Err(ParseError::Invalid("v1 extra fields"));
            }
            let ip = |s: &str| -> Result<IpAddr, ParseError> {
                if proto == "TCP4" {
                    s.parse::<Ipv4Addr>()
                        .map(IpAddr::V4)
                        .map_err(|_| ParseError::Invalid("v1 bad IPv4 address"))
                } else {
                    s.parse::<Ipv6Addr>()
                        .map(IpAddr::V6)
                        .map_err(|_| ParseError::Invalid("v1 bad IPv6 address"))
                }
            };
            let port = |s: &str| -> Result<u16, ParseError> {
                // Leading zeros and signs are not allowed by the spec.
                if s.is_empty()
                    || (s.len() > 1 && s.starts_with('0'))
                    || !s.bytes().all(|b| b.is_ascii_digit())
                {
                    return Err(ParseError::Invalid("v1 bad port"));
                }
                s.parse().map_err(|_| ParseError::Invalid("v1 bad port"))
            };
            Header::Proxied {
                src: SocketAddr::new(ip(src_ip)?, port(src_port)?),
                dst: SocketAddr::new(ip(dst_ip)?, port(dst_port)?),
            }
        }
        _ => return Err(ParseError::Invalid("v1 unknown protocol")),
    };
    Ok(Parsed {
        header,
        version: Version::V1,
        consumed,
    })
}

fn parse_v2(buf: &[u8]) -> Result<Parsed, ParseError> {
    if buf.len() < 16 {
        return Err(ParseError::Incomplete);
    }
    let ver_cmd = buf[12];
    let fam = buf[13];
    let len = usize::from(u16::from_be_bytes([buf[14], buf[15]]));
    if ver_cmd >> 4 != 2 {
        return Err(ParseError::Invalid("v2 version is not 2"));
    }
    let total = 16 + len;
    if total > V2_MAX_LEN {
        return Err(ParseError::Invalid("v2 header too long"));
    }
    if buf.len() < total {
        return Err(ParseError::Incomplete);
    }
    let body = &buf[16..total];
    let header = match ver_cmd & 0x0f {
        // LOCAL: the sender's own connection (e.g. its health check); addresses ignored.
        0x0 => Header::Unknown,
        0x1 => match fam {
            // TCP over IPv4
            0x11 => {
                let a = body
                    .get(..12)
                    .ok_or(ParseError::Invalid("v2 short IPv4 block"))?;
                let ip = |o: usize| Ipv4Addr::new(a[o], a[o + 1], a[o + 2], a[o + 3]);
                Header::Proxied {
                    src: SocketAddr::new(ip(0).into(), u16::from_be_bytes([a[8], a[9]])),
                    dst: SocketAddr::new(ip(4).into(), u16::from_be_bytes([a[10], a[11]])),
                }
            }
            // TCP over IPv6
            0x21 => {
                let a = body
                    .get(..36)
                    .ok_or(ParseError::Invalid("v2 short IPv6 block"))?;
                let ip = |o: usize| {
                    let mut b = [0u8; 16];
                    b.copy_from_slice(&a[o..o + 16]);
                    Ipv6Addr::from(b)
                };
                Header::Proxied {
                    src: SocketAddr::new(ip(0).into(), u16::from_be_bytes([a[32], a[33]])),
                    dst: SocketAddr::new(ip(16).into(), u16::from_be_bytes([a[34], a[35]])),
                }
            }
            // UNSPEC, UDP, unix sockets: nothing limpet can key on.
            _ => Header::Unknown,
        },
        _ => return Err(ParseError::Invalid("v2 unknown command")),
    };
    Ok(Parsed {
        header,
        version: Version::V2,
        consumed: total,
    })
}

/// Appends a version 1 header for a connection from `src` to `dst`. Mixed families (an IPv4
/// client on an IPv6 listener) are written as IPv6 with the IPv4-mapped address, as the spec
/// asks.
pub fn write_v1(src: SocketAddr, dst: SocketAddr, out: &mut Vec<u8>) {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(V1_MAX_LEN);
    let _ = match same_family(src, dst) {
        (IpAddr::V4(s4), IpAddr::V4(d4)) => {
            write!(s, "PROXY TCP4 {s4} {d4} {} {}\r\n", src.port(), dst.port())
        }
        (s6, d6) => write!(
            s,
            "PROXY TCP6 {} {} {} {}\r\n",
            to_v6(s6),
            to_v6(d6),
            src.port(),
            dst.port()
        ),
    };
    out.extend_from_slice(s.as_bytes());
}

/// Appends a header for the sender's own connection, with no client behind it (its health
/// checks and trials): v1 `PROXY UNKNOWN`, v2 `LOCAL`. A receiver keeps the connection's own
/// addresses, as HAProxy's `check-send-proxy` asks of it.
pub fn write_local(version: Version, out: &mut Vec<u8>) {
    match version {
        Version::V1 => out.extend_from_slice(b"PROXY UNKNOWN\r\n"),
        Version::V2 => {
            out.extend_from_slice(&V2_SIGNATURE);
            // Version 2, LOCAL; unspecified family; no address block.
            out.extend_from_slice(&[0x20, 0x00, 0, 0]);
        }
    }
}

/// Appends a version 2 `PROXY` header (TCP, no TLVs) for a connection from `src` to `dst`.
pub fn write_v2(src: SocketAddr, dst: SocketAddr, out: &mut Vec<u8>) {
    out.extend_from_slice(&V2_SIGNATURE);
    out.push(0x21);
    match same_family(src, dst) {
        (IpAddr::V4(s4), IpAddr::V4(d4)) => {
            out.push(0x11);
            out.extend_from_slice(&12u16.to_be_bytes());
            out.extend_from_slice(&s4.octets());
            out.extend_from_slice(&d4.octets());
        }
        (s6, d6) => {
            out.push(0x21);
            out.extend_from_slice(&36u16.to_be_bytes());
            out.extend_from_slice(&to_v6(s6).octets());
            out.extend_from_slice(&to_v6(d6).octets());
        }
    }
    out.extend_from_slice(&src.port().to_be_bytes());
    out.extend_from_slice(&dst.port().to_be_bytes());
}

/// Both addresses as IPv4 when both are (or map to) IPv4, else both as they are.
fn same_family(src: SocketAddr, dst: SocketAddr) -> (IpAddr, IpAddr) {
    let canon = |ip: IpAddr| match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    (canon(src.ip()), canon(dst.ip()))
}

fn to_v6(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A header for the sender's own connection reads back as one with no client: the
    /// connection's own addresses stand, in both versions.
    #[test]
    fn a_local_header_reads_back_as_no_client() {
        for v in [Version::V1, Version::V2] {
            let mut out = Vec::new();
            write_local(v, &mut out);
            let n = out.len();
            out.extend_from_slice(b"after");
            let p = parse(&out).unwrap_or_else(|e| panic!("{v:?}: {e}"));
            assert_eq!(
                (p.header, p.version, p.consumed),
                (Header::Unknown, v, n),
                "{v:?}"
            );
        }
    }

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn v1_tcp4_parses_and_leaves_the_payload() {
        let buf = b"PROXY TCP4 192.168.0.1 10.0.0.1 56324 443\r\nGET / HTTP/1.1\r\n";
        let p = parse(buf).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            p.header,
            Header::Proxied {
                src: sa("192.168.0.1:56324"),
                dst: sa("10.0.0.1:443")
            }
        );
        assert_eq!(p.version, Version::V1);
        assert_eq!(&buf[p.consumed..], b"GET / HTTP/1.1\r\n");
    }

    /// A line of 107 bytes, CRLF included, is the longest the spec allows; one of 108 is
    /// refused (its CR in the 107th byte was taken before).
    #[test]
    fn a_v1_line_of_108_bytes_is_refused_and_one_of_107_read() {
        let line = |len: usize| {
            let mut l = b"PROXY UNKNOWN ".to_vec();
            l.resize(len - 2, b'x');
            l.extend_from_slice(b"\r\n");
            l
        };
        let longest = line(V1_MAX_LEN);
        let p = parse(&longest).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((p.header, p.consumed), (Header::Unknown, V1_MAX_LEN));
        assert!(matches!(
            parse(&line(V1_MAX_LEN + 1)),
            Err(ParseError::Invalid(_))
        ));
    }

    #[test]
    fn v1_tcp6_and_unknown() {
        let p = parse(b"PROXY TCP6 ::1 2001:db8::2 1 2\r\n").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            p.header,
            Header::Proxied {
                src: sa("[::1]:1"),
                dst: sa("[2001:db8::2]:2")
            }
        );
        let p =
            parse(b"PROXY UNKNOWN ffff::1 ffff::2 1 2\r\nxyz").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(p.header, Header::Unknown);
        assert_eq!(p.consumed, 35);
    }

    #[test]
    fn every_prefix_of_a_header_is_incomplete() {
        let mut v1 = Vec::new();
        write_v1(sa("1.2.3.4:5"), sa("6.7.8.9:10"), &mut v1);
        let mut v2 = Vec::new();
        write_v2(sa("[2001:db8::1]:5"), sa("[2001:db8::2]:10"), &mut v2);
        for h in [&v1, &v2] {
            for n in 0..h.len() {
                assert_eq!(parse(&h[..n]), Err(ParseError::Incomplete), "{n} of {h:?}");
            }
            assert_eq!(parse(h).map(|p| p.consumed), Ok(h.len()));
        }
    }

    #[test]
    fn other_protocols_are_not_proxy() {
        assert_eq!(parse(b"GET / HTTP/1.1\r\n"), Err(ParseError::NotProxy));
        assert_eq!(parse(b"\x16\x03\x01"), Err(ParseError::NotProxy));
        assert_eq!(parse(b"PROXZ"), Err(ParseError::NotProxy));
        assert_eq!(parse(b"\r\n\r\n\0\r\nQUIX"), Err(ParseError::NotProxy));
    }

    #[test]
    fn malformed_headers_are_invalid() {
        for bad in [
            &b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2 3\r\n"[..],
            b"PROXY TCP4 ::1 5.6.7.8 1 2\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 01 2\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 1 99999\r\n",
            b"PROXY UDP4 1.2.3.4 5.6.7.8 1 2\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\rX",
            b"PROXY TCP4 1.2.3.4\n",
        ] {
            assert!(
                matches!(parse(bad), Err(ParseError::Invalid(_))),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let long = [b"PROXY ".as_slice(), &[b'a'; 200]].concat();
        assert!(matches!(parse(&long), Err(ParseError::Invalid(_))));
        // v2 with version 1 in the high nibble
        let mut v2 = V2_SIGNATURE.to_vec();
        v2.extend_from_slice(&[0x11, 0x11, 0, 0]);
        assert!(matches!(parse(&v2), Err(ParseError::Invalid(_))));
        // v2 with a length past the bound
        let mut v2 = V2_SIGNATURE.to_vec();
        v2.extend_from_slice(&[0x21, 0x11, 0xff, 0xff]);
        assert!(matches!(parse(&v2), Err(ParseError::Invalid(_))));
    }

    #[test]
    fn v2_round_trips_and_skips_tlvs() {
        let (src, dst) = (sa("10.1.2.3:4000"), sa("10.9.9.9:443"));
        let mut h = Vec::new();
        write_v2(src, dst, &mut h);
        assert_eq!(h.len(), 28);
        // Add a TLV (type 0x04 NOOP, 3 bytes) and fix the length.
        h.extend_from_slice(&[0x04, 0, 3, 1, 2, 3]);
        let len = u16::try_from(h.len() - 16).unwrap_or(0).to_be_bytes();
        h[14..16].copy_from_slice(&len);
        h.extend_from_slice(b"payload");
        let p = parse(&h).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(p.header, Header::Proxied { src, dst });
        assert_eq!(&h[p.consumed..], b"payload");
    }

    #[test]
    fn v2_local_is_unknown() {
        let mut h = V2_SIGNATURE.to_vec();
        h.extend_from_slice(&[0x20, 0x00, 0, 0]);
        assert_eq!(parse(&h).map(|p| p.header), Ok(Header::Unknown));
    }

    #[test]
    fn mixed_families_are_written_as_v6() {
        let mut h = Vec::new();
        write_v1(sa("1.2.3.4:1"), sa("[2001:db8::1]:2"), &mut h);
        assert_eq!(h, b"PROXY TCP6 ::ffff:1.2.3.4 2001:db8::1 1 2\r\n");
        let mut h = Vec::new();
        write_v1(sa("[::ffff:1.2.3.4]:1"), sa("5.6.7.8:2"), &mut h);
        assert_eq!(h, b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\n");
    }

    fn any_addr() -> impl Strategy<Value = SocketAddr> {
        prop_oneof![
            (any::<[u8; 4]>(), any::<u16>())
                .prop_map(|(o, p)| SocketAddr::new(Ipv4Addr::from(o).into(), p)),
            (any::<[u8; 16]>(), any::<u16>())
                .prop_map(|(o, p)| SocketAddr::new(Ipv6Addr::from(o).into(), p)),
        ]
    }

    proptest! {
        #[test]
        fn never_panics_on_arbitrary_bytes(buf in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = parse(&buf);
        }

        #[test]
        fn never_panics_after_a_signature(
            v2 in any::<bool>(),
            rest in proptest::collection::vec(any::<u8>(), 0..200),
        ) {
            let mut buf = if v2 { V2_SIGNATURE.to_vec() } else { b"PROXY ".to_vec() };
            buf.extend_from_slice(&rest);
            if let Ok(p) = parse(&buf) {
                prop_assert!(p.consumed <= buf.len());
            }
        }

        #[test]
        fn written_headers_parse_back(src in any_addr(), dst in any_addr(), v2 in any::<bool>()) {
            let mut h = Vec::new();
            if v2 { write_v2(src, dst, &mut h) } else { write_v1(src, dst, &mut h) }
            let p = parse(&h).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(p.consumed, h.len());
            let Header::Proxied { src: s, dst: d } = p.header else {
                return Err(TestCaseError::fail("not proxied"));
            };
            let (es, ed) = same_family(src, dst);
            let canon = |a: IpAddr, b: IpAddr| match (a, b) { (IpAddr::V4(_), IpAddr::V4(_)) => a, _ => IpAddr::V6(to_v6(a)) };
            prop_assert_eq!(s, SocketAddr::new(canon(es, ed), src.port()));
            prop_assert_eq!(d, SocketAddr::new(canon(ed, es), dst.port()));
        }
    }
}
