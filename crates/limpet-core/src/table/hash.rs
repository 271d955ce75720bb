//! Hashing for the table index, and the snapshot checksum.
//!
//! Keys come from the network, so the index hash is keyed by a per-table seed that the caller
//! randomises once at start (tests and `limpet sim` pass a fixed one). Two functions, chosen by
//! how much of the key an attacker controls:
//!
//! * **Byte keys** (header and cookie values) are attacker-chosen in full: SipHash-1-3, the
//!   keyed function std's `HashMap` uses against HashDoS. It is written out here (30 lines,
//!   checked against std's SipHash-2-4 and the reference vector) because std does not expose
//!   the 1-3 variant and the core takes no extra dependency for it.
//! * **IP keys** are bounded by the addresses a client can really send from (a TCP handshake
//!   has to complete). A seeded folded multiply, as foldhash does for integers, costs two
//!   multiplications; without the seed an attacker cannot aim collisions at it.
//!
//! Nothing here decides placement: the hash only finds an entry, so the seed may differ between
//! instances and restarts without moving a pin.

use super::key::KeyRef;

/// The keyed hash of the table index. `Debug` hides the keys.
#[derive(Clone)]
pub(crate) struct KeyHasher {
    sip: (u64, u64),
    mix: [u64; 3],
}

impl std::fmt::Debug for KeyHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyHasher { .. }")
    }
}

impl KeyHasher {
    /// Derives the hash keys from the caller's seed (splitmix64 spreads a weak seed, e.g. a
    /// small test constant, over all key words).
    pub(crate) fn new(seed: [u64; 2]) -> Self {
        let mut state = seed[0] ^ seed[1].rotate_left(32);
        let mut next = || {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        let sip = (next() ^ seed[1], next());
        let mix = [next(), next() | 1, next() | 1];
        KeyHasher { sip, mix }
    }

    #[inline]
    pub(crate) fn hash(&self, key: KeyRef<'_>) -> u64 {
        use super::key::RefRepr;
        let [m0, m1, m2] = self.mix;
        match key.0 {
            RefRepr::V4(ip) => folded_multiply(folded_multiply(u64::from(ip) ^ m0, m1), m2),
            RefRepr::V6(octets) | RefRepr::Digest(octets) => {
                let v = u128::from_be_bytes(octets);
                let (hi, lo) = ((v >> 64) as u64, v as u64);
                folded_multiply(folded_multiply(lo ^ m0, hi ^ m1), m2)
            }
            RefRepr::Bytes(b) => siphash::<1, 3>(self.sip.0, self.sip.1, b),
        }
    }
}

#[inline]
fn folded_multiply(x: u64, y: u64) -> u64 {
    let full = u128::from(x) * u128::from(y);
    (full as u64) ^ ((full >> 64) as u64)
}

/// SipHash-C-D of `msg` under the key `(k0, k1)`.
pub(crate) fn siphash<const C: usize, const D: usize>(k0: u64, k1: u64, msg: &[u8]) -> u64 {
    let mut v = [
        k0 ^ 0x736f_6d65_7073_6575,
        k1 ^ 0x646f_7261_6e64_6f6d,
        k0 ^ 0x6c79_6765_6e65_7261,
        k1 ^ 0x7465_6462_7974_6573,
    ];
    let compress = |v: &mut [u64; 4], m: u64, rounds: usize| {
        v[3] ^= m;
        for _ in 0..rounds {
            sip_round(v);
        }
        v[0] ^= m;
    };
    let mut chunks = msg.chunks_exact(8);
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        compress(&mut v, u64::from_le_bytes(word), C);
    }
    let mut last = [0u8; 8];
    let rest = chunks.remainder();
    last[..rest.len()].copy_from_slice(rest);
    last[7] = msg.len() as u8; // the length mod 256, as the algorithm specifies
    compress(&mut v, u64::from_le_bytes(last), C);
    v[2] ^= 0xff;
    for _ in 0..D {
        sip_round(&mut v);
    }
    v[0] ^ v[1] ^ v[2] ^ v[3]
}

#[inline]
fn sip_round(v: &mut [u64; 4]) {
    v[0] = v[0].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(13) ^ v[0];
    v[0] = v[0].rotate_left(32);
    v[2] = v[2].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(16) ^ v[2];
    v[0] = v[0].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(21) ^ v[0];
    v[2] = v[2].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(17) ^ v[2];
    v[2] = v[2].rotate_left(32);
}

/// CRC-32 (IEEE 802.3, the zlib/PNG one): catches torn writes and bit rot in snapshots. It is
/// not a MAC; a snapshot file is as trusted as the directory it sits in.
pub(crate) fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc = CRC_TABLE[((crc ^ u32::from(b)) & 0xff) as usize] ^ (crc >> 8);
    }
    !crc
}

const CRC_TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                0xedb8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        table[i] = c;
        i += 1;
    }
    table
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn siphash24_matches_the_reference_vector() {
        // From the SipHash paper, appendix A: key 00..0f, message 00..0e.
        let key: Vec<u8> = (0u8..16).collect();
        let k0 = u64::from_le_bytes(key[..8].try_into().unwrap_or_default());
        let k1 = u64::from_le_bytes(key[8..].try_into().unwrap_or_default());
        let msg: Vec<u8> = (0u8..15).collect();
        assert_eq!(siphash::<2, 4>(k0, k1, &msg), 0xa129_ca61_49be_45e5);
    }

    #[test]
    #[allow(deprecated)] // std's SipHasher is deprecated but still the 2-4 reference we check.
    fn siphash24_matches_std_for_every_length() {
        use std::hash::Hasher;
        let data: Vec<u8> = (0..300u32).map(|i| (i * 7 + 3) as u8).collect();
        for len in 0..data.len() {
            let mut std_hasher = std::hash::SipHasher::new_with_keys(0x0123_4567, 0x89ab_cdef);
            std_hasher.write(&data[..len]);
            assert_eq!(
                siphash::<2, 4>(0x0123_4567, 0x89ab_cdef, &data[..len]),
                std_hasher.finish(),
                "len {len}"
            );
        }
    }

    #[test]
    fn crc32_check_value() {
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
        assert_eq!(crc32(b""), 0);
    }

    #[test]
    fn seeds_change_the_hash() {
        let a = KeyHasher::new([1, 2]);
        let b = KeyHasher::new([1, 3]);
        for key in [
            KeyRef::v4(std::net::Ipv4Addr::new(10, 1, 2, 3)),
            KeyRef::bytes(b"JSESSIONID-value"),
        ] {
            assert_ne!(a.hash(key), b.hash(key));
            assert_eq!(a.hash(key), a.clone().hash(key));
        }
    }
}
