//! Table keys and the pure extractors that read them out of a request or a response.
//!
//! A key is one of:
//!
//! * an **IP address**, masked to a prefix ([`IpPrefix`]): IPv4 as a `u32`, IPv6 as 16 octets,
//!   both inline, so an IP table never allocates per entry. An IPv4-mapped IPv6 address
//!   (`::ffff:a.b.c.d`, what a dual-stack socket reports for an IPv4 client) is read as the IPv4
//!   address, so one client keeps one pin whichever listener it came through.
//! * the **bytes of a header or cookie value**, up to [`MAX_KEY_LEN`] bytes, kept verbatim.
//! * the **digest** of a longer value: the first 16 bytes of its SHA-256. A digest keeps memory
//!   bounded whatever a client sends, and a collision-resistant digest means a client cannot
//!   craft a value that lands on someone else's entry (a fast fixed-seed hash would allow that).
//!
//! [`KeyRef`] borrows (what a lookup builds: no allocation); [`TableKey`] owns (what an entry
//! stores). Both are opaque, so every key went through the same masking and length rules.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use sha2::{Digest as _, Sha256};

use crate::cookie::{find_in_values, is_cookie_name, trim_ows};

/// Longest header or cookie value kept verbatim; longer values are keyed by their digest.
/// 256 covers session ids (JSESSIONID is 32 hex digits, PHPSESSID 26-32 characters) with room.
pub const MAX_KEY_LEN: usize = 256;

/// What kind of key an entry holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyKind {
    V4,
    V6,
    Bytes,
    Digest,
}

impl KeyKind {
    pub fn as_str(self) -> &'static str {
        match self {
            KeyKind::V4 => "ipv4",
            KeyKind::V6 => "ipv6",
            KeyKind::Bytes => "bytes",
            KeyKind::Digest => "digest",
        }
    }
}

/// A borrowed table key. Build it with [`KeyRef::ip`], [`KeyRef::bytes`] or a [`KeySpec`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyRef<'a>(pub(crate) RefRepr<'a>);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum RefRepr<'a> {
    V4(u32),
    /// Octets, not `u128`: a `u128` is 16-aligned on x86-64, which would make every table
    /// entry 8 bytes larger for nothing.
    V6([u8; 16]),
    Bytes(&'a [u8]),
    Digest([u8; 16]),
}

/// An owned table key: 24 bytes, no heap for IP keys and digests.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TableKey(pub(crate) Repr);

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Repr {
    V4(u32),
    V6([u8; 16]),
    /// At most [`MAX_KEY_LEN`] bytes.
    Bytes(Box<[u8]>),
    Digest([u8; 16]),
}

impl<'a> KeyRef<'a> {
    /// The key of a client address under `prefix` (see [`IpPrefix`]).
    pub fn ip(addr: IpAddr, prefix: IpPrefix) -> KeyRef<'static> {
        match addr.to_canonical() {
            IpAddr::V4(a) => KeyRef(RefRepr::V4(mask_v4(u32::from(a), prefix.v4))),
            IpAddr::V6(a) => KeyRef(RefRepr::V6(mask_v6(u128::from(a), prefix.v6).to_be_bytes())),
        }
    }

    /// The key of one IPv4 address, unmasked.
    pub fn v4(addr: Ipv4Addr) -> KeyRef<'static> {
        KeyRef(RefRepr::V4(u32::from(addr)))
    }

    /// The key of one IPv6 address, unmasked (an IPv4-mapped address becomes the IPv4 key).
    pub fn v6(addr: Ipv6Addr) -> KeyRef<'static> {
        KeyRef::ip(IpAddr::V6(addr), IpPrefix::HOST)
    }

    /// The key of a header or cookie value: the bytes themselves up to [`MAX_KEY_LEN`], the
    /// digest of longer ones.
    pub fn bytes(value: &'a [u8]) -> KeyRef<'a> {
        if value.len() <= MAX_KEY_LEN {
            KeyRef(RefRepr::Bytes(value))
        } else {
            let full = Sha256::digest(value);
            let mut d = [0u8; 16];
            d.copy_from_slice(&full[..16]);
            KeyRef(RefRepr::Digest(d))
        }
    }

    /// The key of a value longer than [`MAX_KEY_LEN`], from its digest (the 16 bytes
    /// [`digest`](Self::digest) returns): how a shared store hands such a key back.
    pub fn from_digest(d: [u8; 16]) -> KeyRef<'static> {
        KeyRef(RefRepr::Digest(d))
    }

    /// The digest of a digest key (`None` for the other kinds).
    pub fn digest(self) -> Option<[u8; 16]> {
        match self.0 {
            RefRepr::Digest(d) => Some(d),
            _ => None,
        }
    }

    pub fn kind(self) -> KeyKind {
        match self.0 {
            RefRepr::V4(_) => KeyKind::V4,
            RefRepr::V6(_) => KeyKind::V6,
            RefRepr::Bytes(_) => KeyKind::Bytes,
            RefRepr::Digest(_) => KeyKind::Digest,
        }
    }

    /// The owned key (allocates for a byte key only).
    pub fn to_key(self) -> TableKey {
        TableKey(match self.0 {
            RefRepr::V4(v) => Repr::V4(v),
            RefRepr::V6(v) => Repr::V6(v),
            RefRepr::Bytes(b) => Repr::Bytes(b.into()),
            RefRepr::Digest(d) => Repr::Digest(d),
        })
    }

    /// The address of an IP key (the masked one).
    pub fn ip_addr(self) -> Option<IpAddr> {
        match self.0 {
            RefRepr::V4(v) => Some(IpAddr::V4(Ipv4Addr::from(v))),
            RefRepr::V6(o) => Some(IpAddr::V6(Ipv6Addr::from(o))),
            _ => None,
        }
    }

    /// The bytes of a byte key (`None` for IP keys and digests).
    pub fn as_bytes(self) -> Option<&'a [u8]> {
        match self.0 {
            RefRepr::Bytes(b) => Some(b),
            _ => None,
        }
    }
}

impl TableKey {
    pub fn as_key_ref(&self) -> KeyRef<'_> {
        KeyRef(match &self.0 {
            Repr::V4(v) => RefRepr::V4(*v),
            Repr::V6(v) => RefRepr::V6(*v),
            Repr::Bytes(b) => RefRepr::Bytes(b),
            Repr::Digest(d) => RefRepr::Digest(*d),
        })
    }

    pub fn kind(&self) -> KeyKind {
        self.as_key_ref().kind()
    }

    /// Whether this stored key is `key` (no allocation, no hashing).
    #[inline]
    pub(crate) fn matches(&self, key: KeyRef<'_>) -> bool {
        match (&self.0, key.0) {
            (Repr::V4(a), RefRepr::V4(b)) => *a == b,
            (Repr::V6(a), RefRepr::V6(b)) | (Repr::Digest(a), RefRepr::Digest(b)) => *a == b,
            (Repr::Bytes(a), RefRepr::Bytes(b)) => **a == *b,
            _ => false,
        }
    }

    /// Heap bytes this key owns (its value, for a byte key).
    pub(crate) fn heap_len(&self) -> usize {
        match &self.0 {
            Repr::Bytes(b) => b.len(),
            _ => 0,
        }
    }
}

impl From<KeyRef<'_>> for TableKey {
    fn from(k: KeyRef<'_>) -> Self {
        k.to_key()
    }
}

/// Shows the key as an operator reads it: an address, a value (non-printable bytes escaped),
/// or `sha256:` and the 16 digest bytes in hex.
impl fmt::Display for KeyRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            RefRepr::V4(v) => write!(f, "{}", Ipv4Addr::from(v)),
            RefRepr::V6(o) => write!(f, "{}", Ipv6Addr::from(o)),
            RefRepr::Bytes(b) => write!(f, "{}", b.escape_ascii()),
            RefRepr::Digest(d) => {
                f.write_str("sha256:")?;
                d.iter().try_for_each(|b| write!(f, "{b:02x}"))
            }
        }
    }
}

/// The value keys (header and cookie tables) an operator's `text` can name, as the
/// [`Display`](fmt::Display) of a key writes it, most likely first: `sha256:` and 32 hex
/// digits is the key of a value longer than [`MAX_KEY_LEN`]; a value with `\` escapes (as
/// the display writes quotes, backslashes and bytes that are not printable ASCII) is the
/// bytes they stand for; and the text as it is, for a value typed as the client sent it.
/// Text that is the display of some key always names that key among these.
pub fn value_keys_shown_as(text: &str) -> Vec<TableKey> {
    let mut out: Vec<TableKey> = Vec::with_capacity(3);
    if let Some(hex) = text.strip_prefix("sha256:") {
        if let Some(d) = digest_from_hex(hex.as_bytes()) {
            out.push(KeyRef::from_digest(d).to_key());
        }
    }
    if let Some(bytes) = unescape_ascii(text) {
        let k = KeyRef::bytes(&bytes).to_key();
        if !out.contains(&k) {
            out.push(k);
        }
    }
    let raw = KeyRef::bytes(text.as_bytes()).to_key();
    if !out.contains(&raw) {
        out.push(raw);
    }
    out
}

/// A digest key's 16 bytes from its 32 hex digits (either case), as the key's display and a
/// shared store write them; `None` for anything else.
pub fn digest_from_hex(hex: &[u8]) -> Option<[u8; 16]> {
    if hex.len() != 32 {
        return None;
    }
    let mut d = [0u8; 16];
    for (i, pair) in hex.chunks_exact(2).enumerate() {
        let text = std::str::from_utf8(pair).ok()?;
        d[i] = u8::from_str_radix(text, 16).ok()?;
    }
    Some(d)
}

/// The inverse of `<[u8]>::escape_ascii`: `\t`, `\r`, `\n`, `\\`, `\'`, `\"` and `\xNN`;
/// `None` for any other backslash sequence (the text is then no escaped display).
fn unescape_ascii(text: &str) -> Option<Vec<u8>> {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' {
            out.push(b[i]);
            i += 1;
            continue;
        }
        let (byte, len) = match b.get(i + 1)? {
            b't' => (b'\t', 2),
            b'r' => (b'\r', 2),
            b'n' => (b'\n', 2),
            b'\\' => (b'\\', 2),
            b'\'' => (b'\'', 2),
            b'"' => (b'"', 2),
            b'x' => {
                let hex = std::str::from_utf8(b.get(i + 2..i + 4)?).ok()?;
                (u8::from_str_radix(hex, 16).ok()?, 4)
            }
            _ => return None,
        };
        out.push(byte);
        i += len;
    }
    Some(out)
}

impl fmt::Debug for KeyRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyRef({}: {})", self.kind().as_str(), self)
    }
}

impl fmt::Display for TableKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.as_key_ref(), f)
    }
}

impl fmt::Debug for TableKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TableKey({}: {})", self.kind().as_str(), self)
    }
}

/// How many leading bits of a client address form the key: `/24` makes one key of a whole
/// IPv4 NAT range, `/64` one key of an IPv6 subnet (one site, usually). The default is one
/// address (`/32`, `/128`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpPrefix {
    v4: u8,
    v6: u8,
}

impl Default for IpPrefix {
    fn default() -> Self {
        IpPrefix::HOST
    }
}

impl IpPrefix {
    /// One address per key.
    pub const HOST: IpPrefix = IpPrefix { v4: 32, v6: 128 };

    /// Prefix lengths for IPv4 (0..=32) and IPv6 (0..=128).
    pub fn new(v4: u8, v6: u8) -> Result<Self, KeyError> {
        if v4 > 32 {
            return Err(KeyError::PrefixTooLong { family: 4, len: v4 });
        }
        if v6 > 128 {
            return Err(KeyError::PrefixTooLong { family: 6, len: v6 });
        }
        Ok(IpPrefix { v4, v6 })
    }

    pub fn v4(self) -> u8 {
        self.v4
    }

    pub fn v6(self) -> u8 {
        self.v6
    }
}

fn mask_v4(ip: u32, len: u8) -> u32 {
    // checked_shl: a shift by 32 (len 0) would overflow; it means "no bits kept".
    ip & u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0)
}

fn mask_v6(ip: u128, len: u8) -> u128 {
    ip & u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0)
}

/// Why a key description is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyError {
    PrefixTooLong {
        family: u8,
        len: u8,
    },
    /// Not an HTTP token (header names and cookie names are tokens).
    InvalidName(String),
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyError::PrefixTooLong { family, len } => {
                let max = if *family == 4 { 32 } else { 128 };
                write!(f, "IPv{family} prefix length {len} is over {max}")
            }
            KeyError::InvalidName(n) => write!(f, "{n:?} is not a valid header or cookie name"),
        }
    }
}

impl std::error::Error for KeyError {}

/// What a table is keyed on, as declared in configuration. The I/O layer asks
/// [`request_header`](Self::request_header) which header to hand over, then calls
/// [`request_key`](Self::request_key) (and, for an application cookie,
/// [`response_key`](Self::response_key) on the node's answer to learn the pin).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySpec {
    /// The client address, masked.
    SourceIp(IpPrefix),
    /// The first value of this request header, as sent (surrounding white space trimmed).
    Header(Box<str>),
    /// An application's own session cookie (e.g. `JSESSIONID`): learned from the node's
    /// `Set-Cookie`, looked up on later requests' `Cookie`.
    AppCookie(Box<str>),
    /// A session id the node hands out in a response header and the client sends back in the
    /// same request header (e.g. `Mcp-Session-Id` of the Model Context Protocol, SignalR's
    /// connection token): learned from the node's answer, looked up on later requests.
    LearnHeader(Box<str>),
}

impl KeySpec {
    /// A number that tells apart keys whose pins do not carry over to each other: written in
    /// a table's snapshot, so that one read back by a table keyed anew (another prefix,
    /// header or cookie) is refused rather than restored under keys that mean something else
    /// now (a `/32` pin of `10.1.2.0` catching a whole `/24`, an old header's value taken for
    /// a new header's). Never 0 (a snapshot's "no key recorded"). Header names count without
    /// their case, as HTTP reads them; cookie names with it.
    pub fn fingerprint(&self) -> u32 {
        let text = match self {
            KeySpec::SourceIp(p) => format!("source-ip/{}/{}", p.v4, p.v6),
            KeySpec::Header(h) => format!("header:{}", h.to_ascii_lowercase()),
            KeySpec::AppCookie(c) => format!("cookie:{c}"),
            KeySpec::LearnHeader(h) => format!("learn-header:{}", h.to_ascii_lowercase()),
        };
        super::hash::crc32(text.as_bytes()).max(1)
    }

    /// A header key; `name` must be an HTTP token.
    pub fn header(name: &str) -> Result<Self, KeyError> {
        if !is_cookie_name(name.as_bytes()) {
            return Err(KeyError::InvalidName(name.into()));
        }
        Ok(KeySpec::Header(name.into()))
    }

    /// A learned-header key; `name` must be an HTTP token.
    pub fn learn_header(name: &str) -> Result<Self, KeyError> {
        if !is_cookie_name(name.as_bytes()) {
            return Err(KeyError::InvalidName(name.into()));
        }
        Ok(KeySpec::LearnHeader(name.into()))
    }

    /// An application-cookie key; `name` must be a cookie name (an HTTP token).
    pub fn app_cookie(name: &str) -> Result<Self, KeyError> {
        if !is_cookie_name(name.as_bytes()) {
            return Err(KeyError::InvalidName(name.into()));
        }
        Ok(KeySpec::AppCookie(name.into()))
    }

    /// The request header whose values [`request_key`](Self::request_key) reads: the named
    /// header, `cookie`, or none for a source-IP key.
    pub fn request_header(&self) -> Option<&str> {
        match self {
            KeySpec::SourceIp(_) => None,
            KeySpec::Header(name) | KeySpec::LearnHeader(name) => Some(name),
            KeySpec::AppCookie(_) => Some("cookie"),
        }
    }

    /// The response header whose values [`response_key`](Self::response_key) reads:
    /// `set-cookie` for an application cookie, the named header for a learned header.
    pub fn response_header(&self) -> Option<&str> {
        match self {
            KeySpec::AppCookie(_) => Some("set-cookie"),
            KeySpec::LearnHeader(name) => Some(name),
            _ => None,
        }
    }

    /// Whether pins are learned from the node's response (application cookie, learned
    /// header) rather than recorded when the request is routed.
    pub fn learns_from_response(&self) -> bool {
        matches!(self, KeySpec::AppCookie(_) | KeySpec::LearnHeader(_))
    }

    /// The key of a request: `client` is the client address (the one PROXY protocol gave, if
    /// any); `values` are the values of [`request_header`](Self::request_header), in the order
    /// they arrived. `None`: the request carries no key (no header, an empty value).
    pub fn request_key<'a, I>(&self, client: IpAddr, values: I) -> Option<KeyRef<'a>>
    where
        I: IntoIterator<Item = &'a [u8]>,
    {
        match self {
            KeySpec::SourceIp(prefix) => Some(KeyRef::ip(client, *prefix)),
            KeySpec::Header(_) | KeySpec::LearnHeader(_) => first_value(values),
            KeySpec::AppCookie(name) => {
                app_cookie_in_request(values, name.as_bytes()).map(KeyRef::bytes)
            }
        }
    }

    /// The key a response teaches, from the values of
    /// [`response_header`](Self::response_header) in order: for an application cookie, the
    /// value the node sets in `Set-Cookie`; for a learned header, the header's first value.
    /// `None` for other key kinds.
    pub fn response_key<'a, I>(&self, values: I) -> Option<KeyRef<'a>>
    where
        I: IntoIterator<Item = &'a [u8]>,
    {
        match self {
            KeySpec::AppCookie(name) => {
                app_cookie_in_set_cookies(values, name.as_bytes()).map(KeyRef::bytes)
            }
            KeySpec::LearnHeader(_) => first_value(values),
            _ => None,
        }
    }
}

/// The first value of a header, surrounding white space trimmed; none when empty.
fn first_value<'a, I>(values: I) -> Option<KeyRef<'a>>
where
    I: IntoIterator<Item = &'a [u8]>,
{
    let v = trim_ows(values.into_iter().next()?);
    (!v.is_empty()).then(|| KeyRef::bytes(v))
}

/// The value cookie `name` gets in one `Set-Cookie` value (`NAME=VALUE; attributes...`), or
/// `None` when it sets another cookie or an empty value (an empty value is how applications
/// delete a session cookie, and must not become a key). The value is kept as sent, quotes
/// included, which is what browsers send back.
pub fn app_cookie_in_set_cookie<'a>(set_cookie: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    let pair = set_cookie.split(|&b| b == b';').next()?;
    let eq = memchr::memchr(b'=', pair)?;
    if trim_ows(&pair[..eq]) != name {
        return None;
    }
    let value = trim_ows(&pair[eq + 1..]);
    (!value.is_empty()).then_some(value)
}

/// The value cookie `name` gets across a response's `Set-Cookie` values: the **last** one that
/// sets it, since that is the one a browser keeps.
pub fn app_cookie_in_set_cookies<'a, I>(values: I, name: &[u8]) -> Option<&'a [u8]>
where
    I: IntoIterator<Item = &'a [u8]>,
{
    values
        .into_iter()
        .filter_map(|v| app_cookie_in_set_cookie(v, name))
        .last()
}

/// The application cookie in a request's `Cookie` values: the first occurrence, by the same
/// rule as the affinity cookie ([`find_in_values`]); an empty value is no key.
pub fn app_cookie_in_request<'a, I>(cookie_values: I, name: &[u8]) -> Option<&'a [u8]>
where
    I: IntoIterator<Item = &'a [u8]>,
{
    find_in_values(cookie_values, name).filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the admin API lists, it reads back: every value key's display names that key,
    /// first for a digest or an escaped value, and a plain value as it is.
    #[test]
    fn a_value_key_s_display_reads_back_as_that_key() {
        let long = vec![b'j'; MAX_KEY_LEN + 44];
        for value in [
            &b"JSESSIONID=abc"[..],
            b"a\"b'c\\d",
            b"tab\tand\xff\x00",
            &long,
            b"sha256:not-hex",
        ] {
            let key = KeyRef::bytes(value);
            let shown = key.to_string();
            let read = value_keys_shown_as(&shown);
            assert_eq!(read.first(), Some(&key.to_key()), "{shown}");
        }
        // A value typed as sent, with a backslash no escape would write, is itself.
        assert_eq!(
            value_keys_shown_as(r"C:\tmp\q"),
            vec![KeyRef::bytes(br"C:\tmp\q").to_key()]
        );
        // Text both a digest and a short value display as: both, the digest first.
        let hex = "00112233445566778899aabbccddeeff";
        let both = value_keys_shown_as(&format!("sha256:{hex}"));
        assert_eq!(both.len(), 2);
        assert_eq!(both[0].as_key_ref().kind(), KeyKind::Digest);
        assert_eq!(
            both[1],
            KeyRef::bytes(format!("sha256:{hex}").as_bytes()).to_key()
        );
    }

    proptest::proptest! {
        #[test]
        fn any_value_key_reads_back_from_its_display(value in proptest::collection::vec(proptest::num::u8::ANY, 0..300)) {
            let key = KeyRef::bytes(&value);
            let read = value_keys_shown_as(&key.to_string());
            proptest::prop_assert!(read.contains(&key.to_key()));
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("test address")
    }

    #[test]
    fn prefix_masks_and_defaults() {
        let p24 = IpPrefix::new(24, 64).expect("valid");
        assert_eq!(
            KeyRef::ip(ip("10.1.2.3"), p24),
            KeyRef::ip(ip("10.1.2.200"), p24)
        );
        assert_ne!(
            KeyRef::ip(ip("10.1.2.3"), IpPrefix::HOST),
            KeyRef::ip(ip("10.1.2.200"), IpPrefix::HOST)
        );
        assert_eq!(KeyRef::ip(ip("10.1.2.3"), p24).to_string(), "10.1.2.0");
        let p0 = IpPrefix::new(0, 0).expect("valid");
        assert_eq!(KeyRef::ip(ip("1.2.3.4"), p0).to_string(), "0.0.0.0");
        assert_eq!(KeyRef::ip(ip("2001:db8::1"), p0).to_string(), "::");
        assert!(IpPrefix::new(33, 64).is_err());
        assert!(IpPrefix::new(24, 129).is_err());
    }

    #[test]
    fn v4_mapped_v6_is_the_v4_key() {
        assert_eq!(
            KeyRef::ip(ip("::ffff:10.0.0.1"), IpPrefix::HOST),
            KeyRef::v4(Ipv4Addr::new(10, 0, 0, 1))
        );
    }

    #[test]
    fn long_values_become_digests() {
        let long = vec![b'a'; MAX_KEY_LEN + 1];
        let k = KeyRef::bytes(&long);
        assert_eq!(k.kind(), KeyKind::Digest);
        assert!(k.to_string().starts_with("sha256:"));
        assert_eq!(KeyRef::bytes(&long[..MAX_KEY_LEN]).kind(), KeyKind::Bytes);
        let mut other = long.clone();
        other[0] = b'b';
        assert_ne!(KeyRef::bytes(&other), k);
    }

    #[test]
    fn set_cookie_extraction() {
        fn f(v: &str) -> Option<&[u8]> {
            app_cookie_in_set_cookie(v.as_bytes(), b"JSESSIONID")
        }
        assert_eq!(
            f("JSESSIONID=abc123; Path=/; HttpOnly"),
            Some(&b"abc123"[..])
        );
        assert_eq!(f(" JSESSIONID = abc ;Secure"), Some(&b"abc"[..]));
        assert_eq!(f("JSESSIONID=; Max-Age=0"), None);
        assert_eq!(
            f("OTHER=x; JSESSIONID=abc"),
            None,
            "attributes are not cookies"
        );
        assert_eq!(f("jsessionid=abc"), None, "names are case-sensitive");
        assert_eq!(f("JSESSIONID=\"q\""), Some(&b"\"q\""[..]));
        let many: [&[u8]; 3] = [b"JSESSIONID=one", b"a=b", b"JSESSIONID=two; Path=/"];
        assert_eq!(
            app_cookie_in_set_cookies(many, b"JSESSIONID"),
            Some(&b"two"[..])
        );
    }

    #[test]
    fn request_keys_by_spec() {
        let client = ip("192.0.2.7");
        let spec = KeySpec::app_cookie("JSESSIONID").expect("valid");
        assert_eq!(spec.request_header(), Some("cookie"));
        let lines: [&[u8]; 2] = [b"theme=dark", b"JSESSIONID=abc; JSESSIONID=def"];
        assert_eq!(spec.request_key(client, lines), Some(KeyRef::bytes(b"abc")));
        assert_eq!(spec.request_key(client, [&b"JSESSIONID="[..]]), None);

        let learned = KeySpec::learn_header("Mcp-Session-Id").expect("valid");
        assert!(learned.learns_from_response());
        assert_eq!(learned.request_header(), Some("Mcp-Session-Id"));
        assert_eq!(learned.response_header(), Some("Mcp-Session-Id"));
        assert_eq!(
            learned.response_key([&b" s-1 "[..]]),
            Some(KeyRef::bytes(b"s-1"))
        );
        assert_eq!(
            learned.request_key(client, [&b"s-1"[..]]),
            Some(KeyRef::bytes(b"s-1"))
        );
        assert_eq!(learned.response_key([&b"  "[..]]), None);
        let spec = KeySpec::header("X-Tenant").expect("valid");
        assert_eq!(
            spec.request_key(client, [&b"  acme "[..], b"other"]),
            Some(KeyRef::bytes(b"acme"))
        );
        assert_eq!(spec.request_key(client, [&b"  "[..]]), None);
        assert_eq!(spec.request_key(client, std::iter::empty()), None);
        assert_eq!(spec.response_key([&b"X-Tenant=a"[..]]), None);

        let spec = KeySpec::SourceIp(IpPrefix::HOST);
        assert_eq!(spec.request_header(), None);
        assert_eq!(
            spec.request_key(client, std::iter::empty()),
            Some(KeyRef::v4(Ipv4Addr::new(192, 0, 2, 7)))
        );
        assert!(KeySpec::header("bad name").is_err());
        assert!(KeySpec::learn_header("Mcp Session").is_err());
        assert!(KeySpec::app_cookie("a=b").is_err());
    }
}
