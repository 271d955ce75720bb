//! What the affinity cookie's value holds, and how a value is read back into a [`Pin`].
//!
//! Two modes, one type ([`CookieCodec`]) so the proxy and the sim read and write cookies the same
//! way whatever the mode:
//!
//! - **`name`** (default): the value is the node's configured name, as HAProxy's
//!   `cookie SRV insert` does. Readable, debuggable, and only ever selects among configured
//!   nodes.
//! - **`signed`**: the value is an opaque token. It names the node without revealing its name,
//!   carries when it was issued and last used, and is authenticated under a secret key, so it
//!   cannot be forged to pick a node and limpet can enforce a max idle time and a max lifetime.
//!
//! Whatever a value holds, reading it never fails: a value that names no configured node, fails
//! verification or has expired reads as [`Pin::Unknown`], [`Pin::Invalid`] or [`Pin::Expired`],
//! which the pool treats as "no pin" (a fresh node and a re-pin).
//!
//! ## Signed token layout (version 1)
//!
//! The value is the unpadded base64url encoding of 33 bytes, so always 44 characters:
//!
//! ```text
//!  0        1                 9           13          17                        33
//!  ┌────────┬─────────────────┬───────────┬───────────┬─────────────────────────┐
//!  │ ver=1  │ node tag (8)    │ issued    │ last used │ MAC (16)                │
//!  │        │                 │ u32 BE s  │ u32 BE s  │                         │
//!  └────────┴─────────────────┴───────────┴───────────┴─────────────────────────┘
//!           └───────── body (16), sent XOR-masked ────┘
//! ```
//!
//! With `K` a configured key and `H(K, m)` HMAC-SHA256 (labels are prefix-free, so the three
//! uses of one key never see the same input):
//!
//! - `tag  = H(K, "limpet node:" ‖ name)[..8]`: a stable pseudonym of the node. It depends only
//!   on the key and the name, so every instance with the same keys agrees on it with no shared
//!   state and no randomness, and it says nothing about the name or the node's address.
//! - `MAC  = H(K, "limpet mac:" ‖ ver ‖ body)[..16]`, 128 bits, over the *plain* body.
//! - `wire body = body XOR H(K, "limpet mask:" ‖ MAC)[..16]`.
//!
//! Masking the body with a keystream derived from the MAC is the SIV construction (a
//! deterministic authenticated encryption): without it the tag would be the same bytes in
//! every cookie of a node, so anyone holding a few cookies could tell which clients share a node
//! and count the nodes. Masked, two tokens only look alike when they are the same token. The
//! times are masked too; they are not secret, but there is no reason to show them.
//!
//! Reading: reject anything that is not exactly 44 base64url characters (before decoding; the
//! decode goes into a stack buffer, so no allocation depends on what a client sends), then for
//! each key in order unmask and verify the MAC in constant time (`verify_truncated_left`). The
//! first key that verifies wins. Only then are the times judged and the tag looked up, in a
//! per-key `tag → NodeId` map built with the codec: decoding costs O(keys), never O(nodes).
//!
//! ## Time
//!
//! Times are whole seconds since the Unix epoch in a `u32` (good until 2106), taken from the
//! `now_ms` the caller passes in. A token is expired once `now - issued >= max_lifetime` or
//! `now - last_used >= max_idle`. Times more than [`CLOCK_SKEW_S`] seconds in the future, or a
//! last use before the issue time, are never written by limpet and read as [`Pin::Invalid`]: a
//! peer with a clock a little ahead is tolerated, a token that would never expire is not.
//!
//! ## Refresh (sliding idle window)
//!
//! A sticky hit must push `last_used` forward or the session dies after `max_idle` however busy
//! it is. Re-issuing on every hit would put a `Set-Cookie` on every answer (and make every answer
//! uncacheable), so [`ReadPin::refresh`] is set only when the token's last use is at least a
//! quarter of `max_idle` old, or when it verified under a key other than the first (rotation:
//! move the client to the signing key). The refreshed token keeps its issue time, so refreshing
//! never extends the max lifetime. The cost: a session may expire up to a quarter of `max_idle`
//! earlier than a per-request refresh would allow.
//!
//! ## Key rotation
//!
//! Keys come as a list: the first signs, all verify. To rotate, deploy `[new, old]` everywhere
//! (tokens of either key verify; tokens of `old` are refreshed to `new` on their next sticky
//! hit), then, once `max_lifetime` has passed, `[new]`.
//!
//! ## Pool changes
//!
//! A [`SignedCodec`] is built for one [`Pool`](crate::pool::Pool): its maps give that pool's [`NodeId`]s. Rebuild it
//! ([`CookieCodec::for_pool`]) whenever the pool is rebuilt, and swap both together. As a guard,
//! a codec used with a pool whose node names differ from the ones it was built for reads such
//! pins as [`Pin::Unknown`] rather than sending the client to whichever node now has that id.

use std::fmt;
use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use rustc_hash::FxHashMap;
use sha2::Sha256;

use crate::decision::{Decision, Pin};
use crate::node::NodeId;
use crate::topology::Topology;

type HmacSha256 = Hmac<Sha256>;

const VERSION: u8 = 1;
const TAG_LEN: usize = 8;
const BODY_LEN: usize = TAG_LEN + 4 + 4;
const MAC_LEN: usize = 16;
const TOKEN_LEN: usize = 1 + BODY_LEN + MAC_LEN;

/// Length of every signed cookie value: unpadded base64url of the 33-byte token.
pub const SIGNED_VALUE_LEN: usize = 44;
const _: () = assert!(TOKEN_LEN % 3 == 0 && SIGNED_VALUE_LEN == TOKEN_LEN / 3 * 4);

/// Shortest key accepted: 128 bits. Longer (32 random bytes) is better.
pub const MIN_KEY_LEN: usize = 16;
/// Most keys accepted at once. An invalid token is tried against every key, so this bounds
/// what a forged cookie costs to reject.
pub const MAX_KEYS: usize = 8;
/// How far in the future a token's times may be (clock differences between instances).
pub const CLOCK_SKEW_S: u32 = 300;

const LABEL_NODE: &[u8] = b"limpet node:";
const LABEL_MAC: &[u8] = b"limpet mac:";
const LABEL_MASK: &[u8] = b"limpet mask:";

/// Why a signed codec cannot be built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CodecError {
    NoKeys,
    TooManyKeys,
    /// The key at this position (0 = the signing key) is shorter than [`MIN_KEY_LEN`].
    ShortKey {
        index: usize,
    },
    /// Max idle or max lifetime is under one second (times are kept in whole seconds).
    ZeroLimit,
    /// Two node names get the same tag under one key (a 1 in 2^64 event per pair; rename one).
    TagCollision {
        key: usize,
        a: String,
        b: String,
    },
}

impl fmt::Display for CodecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CodecError::NoKeys => f.write_str("signed cookies need at least one key"),
            CodecError::TooManyKeys => write!(f, "at most {MAX_KEYS} cookie keys"),
            CodecError::ShortKey { index } => write!(
                f,
                "cookie key #{index} is shorter than {MIN_KEY_LEN} bytes (use 32 random bytes)"
            ),
            CodecError::ZeroLimit => {
                f.write_str("cookie max idle and max lifetime must be at least 1 second")
            }
            CodecError::TagCollision { key, a, b } => write!(
                f,
                "nodes {a:?} and {b:?} get the same cookie tag under key #{key}; rename one"
            ),
        }
    }
}

impl std::error::Error for CodecError {}

/// A cookie value read back: the pin, and whether a sticky answer should re-issue the cookie.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadPin {
    pub pin: Pin,
    /// When the request goes where the pin says ([`Decision::Sticky`]), re-issue the cookie
    /// (with [`CookieCodec::write`] and [`issued_ms`](Self::issued_ms)) to slide its idle
    /// window or move it to the signing key, or to renew its `Max-Age`
    /// ([`CookieCodec::renewed_within`]). Always false in plain `name` mode.
    pub refresh: bool,
    /// When a verified signed token was first issued (ms since the epoch, whole seconds): a
    /// refreshed token keeps it, so its max lifetime stays where it was.
    pub issued_ms: Option<u64>,
}

impl ReadPin {
    fn bare(pin: Pin) -> Self {
        ReadPin {
            pin,
            refresh: false,
            issued_ms: None,
        }
    }
}

/// How the affinity cookie's value is written and read. See the module docs.
#[derive(Debug, Clone, Default)]
pub enum CookieCodec {
    /// The node's configured name.
    #[default]
    Name,
    /// The node's configured name, re-issued on every answer that follows it: the cookie has
    /// a `Max-Age`, which counts from when it was last set, and a name carries no time to
    /// renew it by, so without this an active session's cookie would lapse `Max-Age` after
    /// its first answer and the session be balanced afresh ([`CookieCodec::renewed_within`]).
    NameRenewed,
    /// An opaque authenticated token.
    Signed(SignedCodec),
}

impl CookieCodec {
    /// Reads a cookie value (`None`: the request carried no such cookie). Never fails: a value
    /// that cannot be honoured is a pin the pool re-pins.
    pub fn read(&self, value: Option<&[u8]>, pool: &Topology, now_ms: u64) -> ReadPin {
        match self {
            CookieCodec::Name => ReadPin::bare(pool.pin_by_name(value)),
            CookieCodec::NameRenewed => {
                let pin = pool.pin_by_name(value);
                ReadPin {
                    refresh: matches!(pin, Pin::Node(_)),
                    ..ReadPin::bare(pin)
                }
            }
            CookieCodec::Signed(codec) => codec.read(value, pool, now_ms),
        }
    }

    /// The cookie value pinning to `node`. `issued_ms` is `now_ms` for a fresh assignment and
    /// [`ReadPin::issued_ms`] for a refresh. Name mode ignores the times.
    pub fn write(&self, node: NodeId, pool: &Topology, issued_ms: u64, now_ms: u64) -> String {
        match self {
            CookieCodec::Name | CookieCodec::NameRenewed => pool.name(node).to_owned(),
            CookieCodec::Signed(codec) => codec.write(node, pool, issued_ms, now_ms),
        }
    }

    /// The cookie value the answer must set, if any: always for a fresh assignment, and for a
    /// sticky hit whose token asked for a refresh. This is the rule in one place, so the proxy
    /// and the sim cannot disagree on when a `Set-Cookie` is due.
    pub fn value_to_set(
        &self,
        read: &ReadPin,
        decision: &Decision,
        pool: &Topology,
        now_ms: u64,
    ) -> Option<String> {
        match *decision {
            Decision::Fresh { node, .. } => Some(self.write(node, pool, now_ms, now_ms)),
            Decision::Sticky(node) if read.refresh => {
                Some(self.write(node, pool, read.issued_ms.unwrap_or(now_ms), now_ms))
            }
            Decision::Sticky(_) | Decision::Unavailable => None,
        }
    }

    /// The codec for a cookie sent with `Max-Age` `max_age_s` (`None`: a session cookie,
    /// which lasts as long as the browser runs, and this codec as it is). A `Max-Age` counts
    /// from when the cookie was last set, so an active session's cookie must be set again
    /// before it lapses: in `name` mode on every answer that follows it (a name carries no
    /// time; AWS's load balancer cookie is set on every answer too), in `signed` mode once
    /// its token has been idle for half the `Max-Age`, if that comes before its usual
    /// refresh (a quarter of `max_idle`).
    pub fn renewed_within(self, max_age_s: Option<u64>) -> Self {
        let Some(max_age_s) = max_age_s else {
            return self;
        };
        match self {
            CookieCodec::Name | CookieCodec::NameRenewed => CookieCodec::NameRenewed,
            CookieCodec::Signed(mut c) => {
                let half = u32::try_from(max_age_s / 2).unwrap_or(u32::MAX);
                c.refresh_after_s = c.refresh_after_s.min(half);
                CookieCodec::Signed(c)
            }
        }
    }

    /// The same codec for another pool (after a reload). Keys and limits are kept.
    pub fn for_pool(&self, pool: &Topology) -> Result<Self, CodecError> {
        match self {
            CookieCodec::Name => Ok(CookieCodec::Name),
            CookieCodec::NameRenewed => Ok(CookieCodec::NameRenewed),
            CookieCodec::Signed(codec) => codec.for_pool(pool).map(CookieCodec::Signed),
        }
    }
}

/// One key, prepared: the HMAC state with the key already absorbed, cloned per use so a MAC
/// costs two SHA-256 blocks and not the key schedule.
#[derive(Clone)]
struct Key(HmacSha256);

impl Key {
    fn new(bytes: &[u8]) -> Self {
        // HMAC takes keys of any length: long ones are hashed, short ones padded.
        Key(<HmacSha256 as Mac>::new_from_slice(bytes)
            .unwrap_or_else(|_| unreachable!("HMAC accepts every key length")))
    }

    fn tag(&self, name: &[u8]) -> [u8; TAG_LEN] {
        let mut h = self.0.clone();
        h.update(LABEL_NODE);
        h.update(name);
        let mut tag = [0; TAG_LEN];
        tag.copy_from_slice(&h.finalize().into_bytes()[..TAG_LEN]);
        tag
    }

    fn mac_state(&self, body: &[u8; BODY_LEN]) -> HmacSha256 {
        let mut h = self.0.clone();
        h.update(LABEL_MAC);
        h.update(&[VERSION]);
        h.update(body);
        h
    }

    fn mask(&self, mac: &[u8; MAC_LEN]) -> [u8; BODY_LEN] {
        let mut h = self.0.clone();
        h.update(LABEL_MASK);
        h.update(mac);
        let mut mask = [0; BODY_LEN];
        mask.copy_from_slice(&h.finalize().into_bytes()[..BODY_LEN]);
        mask
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print key material, even derived state.
        f.write_str("Key(..)")
    }
}

fn xor(a: &mut [u8; BODY_LEN], b: &[u8; BODY_LEN]) {
    for (x, y) in a.iter_mut().zip(b) {
        *x ^= y;
    }
}

/// Whole seconds since the epoch, saturated (a `u32` lasts until 2106).
fn secs(ms: u64) -> u32 {
    u32::try_from(ms / 1000).unwrap_or(u32::MAX)
}

fn limit_secs(d: Duration) -> Result<u32, CodecError> {
    match d.as_secs() {
        0 => Err(CodecError::ZeroLimit),
        s => Ok(u32::try_from(s).unwrap_or(u32::MAX)),
    }
}

/// The `signed` mode, built for one pool. See the module docs for the token and its rules.
#[derive(Debug, Clone)]
pub struct SignedCodec {
    /// `keys[0]` signs; all verify.
    keys: Vec<Key>,
    max_idle_s: u32,
    max_lifetime_s: u32,
    /// A sticky hit re-issues the token once its last use is this old.
    refresh_after_s: u32,
    /// Per key (same order as `keys`): node tag → node. Built from configuration only, and
    /// looked up only with tags that passed the MAC, so a client cannot choose what is hashed.
    by_tag: Vec<FxHashMap<[u8; TAG_LEN], NodeId>>,
    /// Each node's tag under the signing key, by `NodeId`.
    signing_tags: Vec<[u8; TAG_LEN]>,
    /// The node names the maps were built from, by `NodeId`: the guard against a stale codec.
    names: Vec<Box<str>>,
}

impl SignedCodec {
    /// A codec signing with `keys[0]` and verifying with every key, for `pool`.
    ///
    /// Limits are kept in whole seconds (sub-second parts are dropped) and must be at least
    /// one second.
    pub fn new<K: AsRef<[u8]>>(
        keys: &[K],
        max_idle: Duration,
        max_lifetime: Duration,
        pool: &Topology,
    ) -> Result<Self, CodecError> {
        if keys.is_empty() {
            return Err(CodecError::NoKeys);
        }
        if keys.len() > MAX_KEYS {
            return Err(CodecError::TooManyKeys);
        }
        if let Some(index) = keys.iter().position(|k| k.as_ref().len() < MIN_KEY_LEN) {
            return Err(CodecError::ShortKey { index });
        }
        let max_idle_s = limit_secs(max_idle)?;
        let codec = SignedCodec {
            keys: keys.iter().map(|k| Key::new(k.as_ref())).collect(),
            max_idle_s,
            max_lifetime_s: limit_secs(max_lifetime)?,
            // A quarter: frequent enough that an active session never comes near its idle limit,
            // rare enough that most sticky answers carry no Set-Cookie.
            refresh_after_s: max_idle_s / 4,
            by_tag: Vec::new(),
            signing_tags: Vec::new(),
            names: Vec::new(),
        };
        codec.for_pool(pool)
    }

    /// The same keys and limits, with maps for `pool`.
    pub fn for_pool(&self, pool: &Topology) -> Result<Self, CodecError> {
        let names: Vec<Box<str>> = pool.names().map(|(_, n)| n.into()).collect();
        let mut by_tag = Vec::with_capacity(self.keys.len());
        let mut signing_tags = Vec::with_capacity(names.len());
        for (k, key) in self.keys.iter().enumerate() {
            let mut map =
                FxHashMap::with_capacity_and_hasher(names.len(), rustc_hash::FxBuildHasher);
            for (i, name) in names.iter().enumerate() {
                let tag = key.tag(name.as_bytes());
                let id = NodeId(u32::try_from(i).unwrap_or(u32::MAX));
                if let Some(other) = map.insert(tag, id) {
                    return Err(CodecError::TagCollision {
                        key: k,
                        a: names[other.index()].to_string(),
                        b: name.to_string(),
                    });
                }
                if k == 0 {
                    signing_tags.push(tag);
                }
            }
            by_tag.push(map);
        }
        let codec = SignedCodec {
            keys: self.keys.clone(),
            max_idle_s: self.max_idle_s,
            max_lifetime_s: self.max_lifetime_s,
            refresh_after_s: self.refresh_after_s,
            by_tag,
            signing_tags,
            names,
        };
        codec.debug_check();
        Ok(codec)
    }

    pub fn max_idle(&self) -> Duration {
        Duration::from_secs(self.max_idle_s.into())
    }

    pub fn max_lifetime(&self) -> Duration {
        Duration::from_secs(self.max_lifetime_s.into())
    }

    /// See [`CookieCodec::read`].
    pub fn read(&self, value: Option<&[u8]>, pool: &Topology, now_ms: u64) -> ReadPin {
        let Some(value) = value else {
            return ReadPin::bare(Pin::None);
        };
        match self.open(value) {
            Some((key, body)) => self.judge(key, &body, pool, now_ms),
            None => ReadPin::bare(Pin::Invalid),
        }
    }

    /// Decodes and verifies a value: the index of the key that verified it and the plain body.
    fn open(&self, value: &[u8]) -> Option<(usize, [u8; BODY_LEN])> {
        // Every token has the same length: anything else is refused before any work, so an
        // oversized cookie costs one comparison.
        if value.len() != SIGNED_VALUE_LEN {
            return None;
        }
        let mut raw = [0u8; TOKEN_LEN];
        // The engine is strict (no padding, canonical trailing bits), so one token has exactly
        // one spelling.
        match URL_SAFE_NO_PAD.decode_slice(value, &mut raw) {
            Ok(TOKEN_LEN) => {}
            _ => return None,
        }
        let (version, rest) = raw.split_first()?;
        if *version != VERSION {
            return None;
        }
        let (wire_body, mac) = rest.split_at(BODY_LEN);
        let wire_body: &[u8; BODY_LEN] = wire_body.try_into().ok()?;
        let mac: &[u8; MAC_LEN] = mac.try_into().ok()?;
        self.keys.iter().enumerate().find_map(|(k, key)| {
            let mut body = *wire_body;
            xor(&mut body, &key.mask(mac));
            // Constant-time comparison of the leftmost MAC_LEN bytes.
            key.mac_state(&body)
                .verify_truncated_left(mac)
                .ok()
                .map(|()| (k, body))
        })
    }

    /// Judges a verified body: its times, then its node.
    fn judge(&self, key: usize, body: &[u8; BODY_LEN], pool: &Topology, now_ms: u64) -> ReadPin {
        let (tag, times) = body.split_at(TAG_LEN);
        let (issued, last_used) = times.split_at(4);
        let (Ok(tag), Ok(issued), Ok(last_used)) = (
            <[u8; TAG_LEN]>::try_from(tag),
            <[u8; 4]>::try_from(issued),
            <[u8; 4]>::try_from(last_used),
        ) else {
            return ReadPin::bare(Pin::Invalid);
        };
        let issued = u32::from_be_bytes(issued);
        let last_used = u32::from_be_bytes(last_used);
        let now = secs(now_ms);
        let horizon = now.saturating_add(CLOCK_SKEW_S);
        if last_used < issued || issued > horizon || last_used > horizon {
            return ReadPin::bare(Pin::Invalid);
        }
        let idle = now.saturating_sub(last_used);
        if now.saturating_sub(issued) >= self.max_lifetime_s || idle >= self.max_idle_s {
            return ReadPin::bare(Pin::Expired);
        }
        let Some(&id) = self.by_tag.get(key).and_then(|m| m.get(&tag)) else {
            return ReadPin::bare(Pin::Unknown);
        };
        if !self.built_for(id, pool) {
            return ReadPin::bare(Pin::Unknown);
        }
        ReadPin {
            pin: Pin::Node(id),
            refresh: key != 0 || idle >= self.refresh_after_s,
            issued_ms: Some(u64::from(issued) * 1000),
        }
    }

    /// Whether `id` means the same node in `pool` as in the pool this codec was built for.
    fn built_for(&self, id: NodeId, pool: &Topology) -> bool {
        self.names
            .get(id.index())
            .is_some_and(|n| **n == *pool.name(id))
    }

    /// See [`CookieCodec::write`]. The issue time is clamped to `now_ms`.
    pub fn write(&self, node: NodeId, pool: &Topology, issued_ms: u64, now_ms: u64) -> String {
        debug_assert!(
            pool.contains(node),
            "writing a cookie for node {node:?}, which is not in the pool"
        );
        let signer = &self.keys[0];
        let tag = match self.signing_tags.get(node.index()) {
            Some(tag) if self.built_for(node, pool) => *tag,
            // A codec not rebuilt with its pool: still write the right node, the slow way.
            _ => signer.tag(pool.name(node).as_bytes()),
        };
        let now = secs(now_ms);
        let mut body = [0u8; BODY_LEN];
        body[..TAG_LEN].copy_from_slice(&tag);
        body[TAG_LEN..TAG_LEN + 4].copy_from_slice(&secs(issued_ms).min(now).to_be_bytes());
        body[TAG_LEN + 4..].copy_from_slice(&now.to_be_bytes());

        let mut mac = [0u8; MAC_LEN];
        mac.copy_from_slice(&signer.mac_state(&body).finalize().into_bytes()[..MAC_LEN]);
        xor(&mut body, &signer.mask(&mac));

        let mut raw = [0u8; TOKEN_LEN];
        raw[0] = VERSION;
        raw[1..1 + BODY_LEN].copy_from_slice(&body);
        raw[1 + BODY_LEN..].copy_from_slice(&mac);
        URL_SAFE_NO_PAD.encode(raw)
    }

    fn debug_check(&self) {
        debug_assert!(!self.keys.is_empty(), "a signed codec has a signing key");
        debug_assert_eq!(self.by_tag.len(), self.keys.len(), "one tag map per key");
        debug_assert!(
            self.by_tag.iter().all(|m| m.len() == self.names.len()),
            "every tag map covers every node once"
        );
        debug_assert_eq!(
            self.signing_tags.len(),
            self.names.len(),
            "one signing tag per node"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::RepinReason;
    use crate::Pool;
    use proptest::prelude::*;

    const K1: &[u8] = b"first key, 32 bytes long........";
    const K2: &[u8] = b"second key, also 32 bytes long..";
    const IDLE: Duration = Duration::from_secs(60);
    const LIFE: Duration = Duration::from_secs(3600);
    /// A fixed "now": 2023-11-14T22:13:20Z.
    const T0: u64 = 1_700_000_000_000;
    const S: u64 = 1000;

    fn pool(names: &[&str]) -> Pool {
        Pool::new(names.iter().copied()).unwrap_or_else(|e| panic!("{e}"))
    }

    fn id(p: &Pool, name: &str) -> NodeId {
        p.lookup(name.as_bytes())
            .unwrap_or_else(|| panic!("no node {name}"))
    }

    fn signed(keys: &[&[u8]], p: &Pool) -> CookieCodec {
        CookieCodec::Signed(SignedCodec::new(keys, IDLE, LIFE, p).unwrap_or_else(|e| panic!("{e}")))
    }

    fn read(c: &CookieCodec, v: &str, p: &Pool, now: u64) -> ReadPin {
        c.read(Some(v.as_bytes()), p, now)
    }

    #[test]
    fn name_mode_round_trips_the_name() {
        let p = pool(&["a", "b"]);
        let c = CookieCodec::Name;
        let v = c.write(id(&p, "b"), &p, T0, T0);
        assert_eq!(v, "b");
        assert_eq!(read(&c, &v, &p, T0).pin, Pin::Node(id(&p, "b")));
        assert_eq!(read(&c, "zz", &p, T0).pin, Pin::Unknown);
        assert_eq!(c.read(None, &p, T0).pin, Pin::None);
    }

    #[test]
    fn signed_round_trip() {
        let p = pool(&["alpha", "beta", "gamma"]);
        let c = signed(&[K1], &p);
        for name in ["alpha", "beta", "gamma"] {
            let v = c.write(id(&p, name), &p, T0, T0);
            assert_eq!(v.len(), SIGNED_VALUE_LEN);
            assert!(crate::cookie::is_cookie_value_safe(v.as_bytes()));
            assert_eq!(
                read(&c, &v, &p, T0 + 5 * S),
                ReadPin {
                    pin: Pin::Node(id(&p, name)),
                    refresh: false,
                    issued_ms: Some(T0),
                }
            );
        }
        assert_eq!(c.read(None, &p, T0).pin, Pin::None);
    }

    #[test]
    fn every_tampered_character_is_invalid() {
        let p = pool(&["a", "b"]);
        let c = signed(&[K1], &p);
        let v = c.write(id(&p, "a"), &p, T0, T0);
        for i in 0..v.len() {
            for repl in [b'A', b'z', b'0', b'-', b'_'] {
                let mut t = v.clone().into_bytes();
                if t[i] == repl {
                    continue;
                }
                t[i] = repl;
                assert_eq!(
                    c.read(Some(&t), &p, T0).pin,
                    Pin::Invalid,
                    "position {i} -> {}",
                    repl as char
                );
            }
        }
    }

    #[test]
    fn malformed_values_are_invalid() {
        let p = pool(&["a"]);
        let c = signed(&[K1], &p);
        let v = c.write(id(&p, "a"), &p, T0, T0);
        let huge = "A".repeat(64 * 1024);
        for bad in [
            "",
            "a",
            &v[..43],
            &format!("{v}A"),
            &format!("{}=", &v[..43]),
            &format!("+{}", &v[1..]),
            &huge,
            "############################################",
        ] {
            assert_eq!(read(&c, bad, &p, T0).pin, Pin::Invalid, "{bad:.50}");
        }
        // A name is no token.
        assert_eq!(read(&c, "a", &p, T0).pin, Pin::Invalid);
    }

    #[test]
    fn token_from_another_key_set_is_invalid() {
        let p = pool(&["a", "b"]);
        let ours = signed(&[K1], &p);
        let theirs = signed(&[K2], &p);
        let v = theirs.write(id(&p, "a"), &p, T0, T0);
        assert_eq!(read(&ours, &v, &p, T0).pin, Pin::Invalid);
    }

    #[test]
    fn token_for_a_removed_node_is_unknown() {
        let before = pool(&["a", "b"]);
        let c = signed(&[K1], &before);
        let v = c.write(id(&before, "b"), &before, T0, T0);
        let after = pool(&["a", "c"]);
        let c = c.for_pool(&after).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(read(&c, &v, &after, T0).pin, Pin::Unknown);
        // And it still finds a node that stayed, whatever its new id.
        let moved = pool(&["c", "a"]);
        let c = c.for_pool(&moved).unwrap_or_else(|e| panic!("{e}"));
        let va = signed(&[K1], &before).write(id(&before, "a"), &before, T0, T0);
        assert_eq!(read(&c, &va, &moved, T0).pin, Pin::Node(id(&moved, "a")));
    }

    #[test]
    fn a_stale_codec_never_sends_a_pin_to_another_node() {
        let built_for = pool(&["a", "b"]);
        let c = signed(&[K1], &built_for);
        let va = c.write(id(&built_for, "a"), &built_for, T0, T0);
        // Same ids, other names: the codec was not rebuilt with the pool.
        let swapped = pool(&["b", "a"]);
        assert_eq!(read(&c, &va, &swapped, T0).pin, Pin::Unknown);
        // Writing with a stale codec still names the right node.
        let vb = c.write(id(&swapped, "b"), &swapped, T0, T0);
        assert_eq!(
            read(&c, &vb, &built_for, T0).pin,
            Pin::Node(id(&built_for, "b"))
        );
    }

    #[test]
    fn expires_after_max_idle() {
        let p = pool(&["a"]);
        let c = signed(&[K1], &p);
        let v = c.write(id(&p, "a"), &p, T0, T0);
        assert_eq!(read(&c, &v, &p, T0 + 59 * S).pin, Pin::Node(id(&p, "a")));
        assert_eq!(read(&c, &v, &p, T0 + 60 * S).pin, Pin::Expired);
    }

    #[test]
    fn refresh_slides_the_idle_window_but_not_the_lifetime() {
        let p = pool(&["a"]);
        let a = id(&p, "a");
        let c = signed(&[K1], &p);
        let mut v = c.write(a, &p, T0, T0);
        let mut now = T0;
        // A client active every 40 s keeps its session past many idle windows...
        loop {
            now += 40 * S;
            let r = read(&c, &v, &p, now);
            if now - T0 >= 3600 * S {
                // ...until the max lifetime, which refreshes never extend.
                assert_eq!(r.pin, Pin::Expired);
                break;
            }
            assert_eq!(r.pin, Pin::Node(a), "at +{}s", (now - T0) / S);
            assert!(r.refresh, "40 s is over a quarter of the 60 s idle window");
            assert_eq!(r.issued_ms, Some(T0));
            let d = Decision::Sticky(a);
            v = c
                .value_to_set(&r, &d, &p, now)
                .unwrap_or_else(|| panic!("a refresh writes a value"));
        }
    }

    #[test]
    fn refresh_only_after_a_quarter_of_max_idle() {
        let p = pool(&["a"]);
        let a = id(&p, "a");
        let c = signed(&[K1], &p);
        let v = c.write(a, &p, T0, T0);
        let fresh = read(&c, &v, &p, T0 + 14 * S);
        assert!(!fresh.refresh);
        assert_eq!(c.value_to_set(&fresh, &Decision::Sticky(a), &p, T0), None);
        assert!(read(&c, &v, &p, T0 + 15 * S).refresh);
    }

    #[test]
    fn value_to_set_follows_the_decision() {
        let p = pool(&["a", "b"]);
        let (a, b) = (id(&p, "a"), id(&p, "b"));
        let c = signed(&[K1], &p);
        let r = c.read(None, &p, T0);
        let fresh = Decision::Fresh {
            node: b,
            repin: Some(RepinReason::NodeDown),
        };
        let v = c.value_to_set(&r, &fresh, &p, T0);
        assert_eq!(
            v.map(|v| read(&c, &v, &p, T0).pin),
            Some(Pin::Node(b)),
            "a fresh assignment always sets the cookie"
        );
        assert_eq!(c.value_to_set(&r, &Decision::Unavailable, &p, T0), None);
        let name = CookieCodec::Name;
        assert_eq!(name.value_to_set(&r, &fresh, &p, T0).as_deref(), Some("b"));
        let sticky = name.read(Some(b"a"), &p, T0);
        assert_eq!(
            name.value_to_set(&sticky, &Decision::Sticky(a), &p, T0),
            None
        );
    }

    /// A cookie with a `Max-Age` is set again before it lapses while its session is active:
    /// a name on every sticky answer (it carries no time to renew it by), a signed token once
    /// idle for half the `Max-Age` when that comes before a quarter of `max_idle`. Before, a
    /// name cookie was set once, and an active session lost its node `Max-Age` after its
    /// first answer. Without a `Max-Age` (a session cookie) nothing changes.
    #[test]
    fn a_cookie_with_a_max_age_is_renewed_while_its_session_is_active() {
        let p = pool(&["a", "b"]);
        let a = id(&p, "a");
        let name = CookieCodec::Name.renewed_within(Some(60));
        let sticky = name.read(Some(b"a"), &p, T0);
        assert!(sticky.refresh);
        assert_eq!(
            name.value_to_set(&sticky, &Decision::Sticky(a), &p, T0)
                .as_deref(),
            Some("a")
        );
        // A pin that is not a node's is no sticky answer to renew.
        assert!(!name.read(Some(b"zz"), &p, T0).refresh);
        assert!(!name.read(None, &p, T0).refresh);
        let plain = CookieCodec::Name.renewed_within(None);
        assert!(!plain.read(Some(b"a"), &p, T0).refresh);
        // Signed: IDLE's quarter, or half the Max-Age if sooner.
        let c = signed(&[K1], &p);
        let v = c.write(a, &p, T0, T0);
        let short = signed(&[K1], &p).renewed_within(Some(20));
        assert!(!read(&short, &v, &p, T0 + 9 * S).refresh);
        assert!(read(&short, &v, &p, T0 + 10 * S).refresh);
        let long = signed(&[K1], &p).renewed_within(Some(1_000_000));
        assert_eq!(
            read(&long, &v, &p, T0 + 10 * S).refresh,
            read(&c, &v, &p, T0 + 10 * S).refresh,
            "a long Max-Age leaves the usual refresh"
        );
    }

    #[test]
    fn expires_after_max_lifetime() {
        let p = pool(&["a"]);
        let a = id(&p, "a");
        let c = signed(&[K1], &p);
        // Issued an hour ago, last used just now.
        let v = c.write(a, &p, T0, T0 + 3599 * S);
        assert_eq!(read(&c, &v, &p, T0 + 3599 * S).pin, Pin::Node(a));
        assert_eq!(read(&c, &v, &p, T0 + 3600 * S).pin, Pin::Expired);
    }

    #[test]
    fn times_in_the_future_are_invalid_beyond_the_skew() {
        let p = pool(&["a"]);
        let a = id(&p, "a");
        let c = signed(&[K1], &p);
        let ahead = c.write(a, &p, T0 + 200 * S, T0 + 200 * S);
        assert_eq!(read(&c, &ahead, &p, T0).pin, Pin::Node(a));
        let far = c.write(a, &p, T0 + 301 * S, T0 + 301 * S);
        assert_eq!(read(&c, &far, &p, T0).pin, Pin::Invalid);
    }

    #[test]
    fn rotation_old_key_verifies_new_key_signs() {
        let p = pool(&["a", "b"]);
        let b = id(&p, "b");
        let old = signed(&[K1], &p);
        let rotated = signed(&[K2, K1], &p);
        let new_only = signed(&[K2], &p);

        let v_old = old.write(b, &p, T0, T0);
        let r = read(&rotated, &v_old, &p, T0 + S);
        assert_eq!(r.pin, Pin::Node(b));
        assert!(
            r.refresh,
            "a token under an old key is moved to the signing key"
        );

        let v_new = rotated
            .value_to_set(&r, &Decision::Sticky(b), &p, T0 + S)
            .unwrap_or_else(|| panic!("refresh"));
        assert_eq!(read(&new_only, &v_new, &p, T0 + S).pin, Pin::Node(b));
        assert_eq!(read(&old, &v_new, &p, T0 + S).pin, Pin::Invalid);
        let r = read(&rotated, &v_new, &p, T0 + S);
        assert!(!r.refresh, "signed with the first key, used just now");
        assert_eq!(r.issued_ms, Some(T0), "rotation keeps the issue time");
    }

    #[test]
    fn token_reveals_neither_name_nor_node_identity() {
        let name = "backend-alpha.internal";
        let p = pool(&[name, "other"]);
        let n = id(&p, name);
        let c = signed(&[K1], &p);
        let v1 = c.write(n, &p, T0, T0);
        let v2 = c.write(n, &p, T0, T0 + S);
        for v in [&v1, &v2] {
            assert!(!v.contains("alpha"));
            let raw = URL_SAFE_NO_PAD.decode(v).unwrap_or_else(|e| panic!("{e}"));
            assert!(!raw.windows(5).any(|w| w == b"alpha"));
        }
        // The tag is masked: two cookies of one node share no bytes where the tag sits
        // (2^-64 odds of a false failure), so cookies cannot be grouped by node.
        let (r1, r2) = (
            URL_SAFE_NO_PAD.decode(&v1).unwrap_or_default(),
            URL_SAFE_NO_PAD.decode(&v2).unwrap_or_default(),
        );
        assert_ne!(r1[1..1 + TAG_LEN], r2[1..1 + TAG_LEN]);
    }

    #[test]
    fn instances_with_the_same_keys_agree() {
        // Built separately, nodes in another order: tags come from names, not ids.
        let p1 = pool(&["a", "b", "c"]);
        let p2 = pool(&["c", "b", "a"]);
        let c1 = signed(&[K1, K2], &p1);
        let c2 = signed(&[K1, K2], &p2);
        for name in ["a", "b", "c"] {
            let v1 = c1.write(id(&p1, name), &p1, T0, T0 + S);
            let v2 = c2.write(id(&p2, name), &p2, T0, T0 + S);
            assert_eq!(v1, v2, "deterministic: no randomness in a token");
            assert_eq!(read(&c2, &v1, &p2, T0 + S).pin, Pin::Node(id(&p2, name)));
        }
    }

    #[test]
    fn bad_configurations_are_refused() {
        let p = pool(&["a"]);
        let none: [&[u8]; 0] = [];
        let new = |keys: &[&[u8]], idle, life| SignedCodec::new(keys, idle, life, &p).err();
        assert_eq!(new(&none, IDLE, LIFE), Some(CodecError::NoKeys));
        assert_eq!(
            new(&[K1, b"short"], IDLE, LIFE),
            Some(CodecError::ShortKey { index: 1 })
        );
        assert_eq!(new(&[K1; 9], IDLE, LIFE), Some(CodecError::TooManyKeys));
        assert_eq!(
            new(&[K1], Duration::from_millis(999), LIFE),
            Some(CodecError::ZeroLimit)
        );
        assert_eq!(
            new(&[K1], IDLE, Duration::ZERO),
            Some(CodecError::ZeroLimit)
        );
        assert_eq!(new(&[K1], IDLE, LIFE), None);
    }

    #[test]
    fn debug_output_holds_no_key_material() {
        let p = pool(&["a"]);
        let c = signed(&[K1], &p);
        let s = format!("{c:?}");
        assert!(!s.contains("first key"));
        assert!(s.contains("Key(..)"));
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic_nor_pin(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let p = pool(&["a", "b"]);
            let c = signed(&[K1, K2], &p);
            let r = c.read(Some(&bytes), &p, T0);
            prop_assert_eq!(r.pin, Pin::Invalid);
            prop_assert!(!r.refresh);
        }

        #[test]
        // "A[Q-Za-f]" makes the first byte the version (1), so each case reaches the MAC.
        fn well_formed_forgeries_are_invalid(s in "A[Q-Za-f][A-Za-z0-9_-]{42}") {
            let p = pool(&["a", "b"]);
            let c = signed(&[K1, K2], &p);
            prop_assert_eq!(c.read(Some(s.as_bytes()), &p, T0).pin, Pin::Invalid);
        }

        #[test]
        fn round_trip_at_any_time(now in 0u64..(u64::from(u32::MAX) * 1000), which in 0usize..3) {
            let p = pool(&["a", "b", "c"]);
            let c = signed(&[K1], &p);
            let n = NodeId(which as u32);
            let v = c.write(n, &p, now, now);
            prop_assert_eq!(c.read(Some(v.as_bytes()), &p, now).pin, Pin::Node(n));
        }
    }
}
