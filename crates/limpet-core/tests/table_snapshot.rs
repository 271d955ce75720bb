//! Snapshots: pins survive a restart, expired ones are dropped at load, and a corrupt or
//! truncated snapshot is an error (never a panic), so the binary can report it and start empty.

use std::net::Ipv4Addr;

use limpet_core::table::{
    decode_snapshot, encode_snapshot, snapshot_len, AffinityStore, KeyKind, KeyRef, LruTable,
    SnapshotError, SnapshotPages, TableConfig, SNAPSHOT_PREFIX_LEN,
};
use proptest::prelude::*;

const T0: u64 = 1_700_000_000_000;
const EXPIRE: u64 = 30 * 60_000;

fn store(size: u32) -> LruTable {
    LruTable::new(TableConfig::new(size, EXPIRE).with_hash_seed([3, 4])).expect("valid")
}

fn v4(i: u32) -> KeyRef<'static> {
    KeyRef::v4(Ipv4Addr::from(0x0a00_0000 + i))
}

/// A table with every kind of key, used at T0 + i ms.
fn sample() -> LruTable {
    let mut t = store(100);
    let a = t.intern("lviv").expect("intern");
    let b = t.intern("kyiv").expect("intern");
    for i in 0..20 {
        t.put(v4(i), if i % 2 == 0 { a } else { b }, T0 + u64::from(i));
    }
    t.put(KeyRef::v6("2001:db8::7".parse().expect("v6")), b, T0 + 30);
    t.put(KeyRef::bytes(b"JSESSIONID-abc"), a, T0 + 31);
    t.put(KeyRef::bytes(&[0u8; 1000]), b, T0 + 32);
    t.put(KeyRef::bytes(b""), a, T0 + 33);
    t
}

/// (key, node name, idle) for every live entry, least recently used first.
fn contents(t: &LruTable, now: u64) -> Vec<(String, String, u64)> {
    let mut all: Vec<_> = (0..)
        .map(|page| t.entries(page, 7, now))
        .take_while(|p| !p.is_empty())
        .flatten()
        .map(|e| {
            (
                format!("{:?}", e.key),
                t.node_name(e.node).unwrap_or("?").to_owned(),
                e.idle_ms,
            )
        })
        .collect();
    all.sort_by(|x, y| y.2.cmp(&x.2).then(x.0.cmp(&y.0)));
    all
}

#[test]
fn a_snapshot_round_trips() {
    let t = sample();
    let bytes = encode_snapshot(&t, T0 + 100);
    let snap = decode_snapshot(&bytes, T0 + 100, EXPIRE).expect("valid snapshot");
    assert_eq!(snap.entries.len(), 24);
    assert_eq!(snap.expired, 0);
    assert!(snap.entries.iter().any(|e| e.key.kind() == KeyKind::Digest));

    let mut restored = store(100);
    let report = restored.restore(&snap, T0 + 100);
    assert_eq!(report.loaded, 24);
    assert_eq!(contents(&restored, T0 + 100), contents(&t, T0 + 100));

    // LRU order survives: fill past the size and the oldest (10.0.0.0) goes first.
    let n = restored.intern("kyiv").expect("intern");
    for i in 0..77 {
        restored.put(v4(1000 + i), n, T0 + 200);
    }
    assert_eq!(restored.get(v4(0), T0 + 200), None);
    assert!(restored.get(v4(1), T0 + 200).is_some());
}

/// A snapshot read a page of positions at a time (the binary locks the table per page)
/// restores the same table as one read whole, LRU order included. With traffic between
/// pages: a key removed from positions not read yet moves the last entry (read) into its
/// hole, where it is read again and restored once; a key put during the read is left out,
/// as from a snapshot taken when the read began; nothing else is lost.
#[test]
fn a_snapshot_read_a_page_at_a_time_restores_as_one_read_whole() {
    let t = sample();
    let mut pages = SnapshotPages::new();
    let mut reads = 1;
    while pages.read(&t, 5, T0 + 100) {
        reads += 1;
    }
    assert_eq!(reads, 5, "24 entries, five positions a page");
    assert_eq!(
        pages.encode(T0 + 100),
        encode_snapshot(&t, T0 + 100),
        "the same bytes"
    );

    let mut t = sample();
    let a = t.intern("lviv").expect("intern");
    let mut pages = SnapshotPages::new();
    assert!(pages.read(&t, 12, T0 + 100));
    // Key 2 (position 2, not read yet) removed: the last entry (read) fills its hole.
    assert_eq!(t.remove(v4(2)), Some(a));
    t.put(v4(500), a, T0 + 130);
    while pages.read(&t, 12, T0 + 140) {}
    let snap = decode_snapshot(&pages.encode(T0 + 140), T0 + 140, EXPIRE).expect("valid");
    assert_eq!(snap.entries.len(), 23 + 1, "the moved entry read twice");
    let mut restored = store(100);
    restored.restore(&snap, T0 + 140);
    t.remove(v4(500));
    assert_eq!(contents(&restored, T0 + 140), contents(&t, T0 + 140));
    // Into a table with room for exactly the 23 keys: all of them, the duplicate taking no
    // room of its own (before, the oldest key was left out for it).
    let mut exact = store(23);
    let report = exact.restore(&snap, T0 + 140);
    assert_eq!((report.loaded, report.over_size), (23, 0));
    assert_eq!(contents(&exact, T0 + 140), contents(&t, T0 + 140));
    // One less room: the oldest key left out, and only it.
    let report = store(22).restore(&snap, T0 + 140);
    assert_eq!((report.loaded, report.over_size), (22, 1));
}

/// A snapshot encoded for a reader on another clock (the wall clock, stepped since the table's
/// clock was set to it) reads there with every time moved by the step: entries as idle as on
/// the table's clock, neither aged by the step nor kept past their time.
#[test]
fn a_snapshot_encoded_for_another_clock_reads_there_as_idle_as_here() {
    const STEP: i64 = -2 * 3_600_000;
    let t = sample();
    let here = {
        let mut pages = SnapshotPages::new();
        while pages.read(&t, 5, T0 + 100) {}
        decode_snapshot(&pages.encode(T0 + 100), T0 + 100, EXPIRE).expect("valid")
    };
    let mut pages = SnapshotPages::new();
    while pages.read(&t, 5, T0 + 100) {}
    let there_now = T0 + 100 - 2 * 3_600_000;
    let there =
        decode_snapshot(&pages.encode_on(T0 + 100, STEP), there_now, EXPIRE).expect("valid");
    assert_eq!(there.saved_at_ms, there_now);
    assert_eq!(
        there.entries.len(),
        here.entries.len(),
        "none aged by the step"
    );
    for (a, b) in here.entries.iter().zip(&there.entries) {
        assert_eq!(a.key, b.key);
        assert_eq!(b.last_used_ms, a.last_used_ms - 2 * 3_600_000);
    }
}

#[test]
fn downtime_counts_as_idle_time_and_expired_entries_are_dropped_at_load() {
    let t = sample();
    let bytes = encode_snapshot(&t, T0 + 100);
    // Load when entries used at T0..T0+9 are idle >= EXPIRE.
    let load = T0 + 9 + EXPIRE;
    let snap = decode_snapshot(&bytes, load, EXPIRE).expect("valid");
    assert_eq!(snap.expired, 10);
    assert_eq!(snap.entries.len(), 14);
    let mut r = store(100);
    assert_eq!(r.restore(&snap, load).loaded, 14);
    assert_eq!(r.get(v4(9), load), None);
    assert!(r.get(v4(10), load).is_some());
    // The survivors keep their age: 10.0.0.10, used at T0 + 10, expires at T0 + 10 + EXPIRE
    // unless used (the get above used it); 10.0.0.11 was not used.
    assert!(r.get(v4(11), T0 + 11 + EXPIRE).is_none());

    // A shorter expire in the new config applies at load.
    let snap = decode_snapshot(&bytes, T0 + 100, 80).expect("valid");
    assert_eq!(
        snap.entries.len(),
        4,
        "only entries used at T0+30.. are idle < 80 ms"
    );
}

#[test]
fn a_snapshot_larger_than_the_table_keeps_the_most_recent() {
    let bytes = encode_snapshot(&sample(), T0 + 100);
    let snap = decode_snapshot(&bytes, T0 + 100, EXPIRE).expect("valid");
    let mut small = store(5);
    let report = small.restore(&snap, T0 + 100);
    assert_eq!((report.loaded, report.over_size), (5, 19));
    // The five most recent: 10.0.0.19, the IPv6 key and the three byte keys.
    assert!(small.get(KeyRef::bytes(b""), T0 + 100).is_some());
    assert!(small.get(v4(19), T0 + 100).is_some());
    assert!(small.get(v4(18), T0 + 100).is_none());
}

/// A snapshot's first bytes say how long it is, so a reader of a file needs no more than
/// that; bytes that are not a snapshot's (zeros, as `/dev/zero` gives) or too few say nothing.
#[test]
fn a_snapshot_s_prefix_says_its_length() {
    for t in [store(10), sample()] {
        let bytes = encode_snapshot(&t, T0);
        assert_eq!(
            snapshot_len(&bytes[..SNAPSHOT_PREFIX_LEN]),
            Some(bytes.len() as u64)
        );
        assert_eq!(snapshot_len(&bytes[..SNAPSHOT_PREFIX_LEN - 1]), None);
    }
    assert_eq!(snapshot_len(&[0u8; SNAPSHOT_PREFIX_LEN]), None);
    let mut other_version = encode_snapshot(&sample(), T0);
    other_version[8] = 9;
    assert_eq!(snapshot_len(&other_version[..SNAPSHOT_PREFIX_LEN]), None);
}

#[test]
fn an_empty_table_round_trips() {
    let t = store(10);
    let bytes = encode_snapshot(&t, T0);
    let snap = decode_snapshot(&bytes, T0, EXPIRE).expect("valid");
    assert!(snap.entries.is_empty() && snap.names.is_empty());
}

#[test]
fn corrupt_snapshots_are_errors() {
    let bytes = encode_snapshot(&sample(), T0 + 100);
    // Any single flipped bit is caught: by the checksum, or before it by the header checks.
    for i in 0..bytes.len() {
        for bit in 0..8 {
            let mut bad = bytes.clone();
            bad[i] ^= 1 << bit;
            assert!(
                decode_snapshot(&bad, T0 + 100, EXPIRE).is_err(),
                "flip of bit {bit} of byte {i} went unnoticed"
            );
        }
    }
    let mut bad = bytes.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 0x55;
    assert!(matches!(
        decode_snapshot(&bad, T0, EXPIRE),
        Err(SnapshotError::Checksum { .. })
    ));
    assert_eq!(
        decode_snapshot(
            b"GIF89a..........................................",
            T0,
            EXPIRE
        ),
        Err(SnapshotError::BadMagic)
    );
    let mut v2 = bytes.clone();
    v2[8] = 2;
    assert_eq!(
        decode_snapshot(&v2, T0, EXPIRE),
        Err(SnapshotError::UnsupportedVersion(2))
    );
}

#[test]
fn truncated_snapshots_say_so() {
    let bytes = encode_snapshot(&sample(), T0 + 100);
    for len in 0..bytes.len() {
        let err = decode_snapshot(&bytes[..len], T0, EXPIRE).expect_err("truncated");
        assert!(
            matches!(err, SnapshotError::Truncated { .. }),
            "length {len}: {err}"
        );
    }
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(matches!(
        decode_snapshot(&longer, T0, EXPIRE),
        Err(SnapshotError::TrailingBytes { .. })
    ));
    let msg = decode_snapshot(&bytes[..100], T0, EXPIRE)
        .expect_err("truncated")
        .to_string();
    assert!(msg.contains("truncated"), "{msg}");
}

proptest! {
    #[test]
    fn decode_never_panics_on_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode_snapshot(&bytes, T0, EXPIRE);
    }

    /// Arbitrary bytes behind a valid header, and a checksum fixed up to match, reach the
    /// structural parser: it must refuse or accept, never panic or over-allocate.
    #[test]
    fn decode_never_panics_behind_a_valid_checksum(
        body in prop::collection::vec(any::<u8>(), 0..512),
        names in 0u32..4,
        entries in any::<u32>(),
    ) {
        let _ = decode_snapshot(&checksummed(names, entries, &body), T0, EXPIRE);
    }

    /// Records that are nearly well formed (names of a few bytes, entries of each kind and
    /// some of none, node indexes in and just past the names, any idle time), with a byte
    /// changed or cut here and there and the checksum fixed up: the parser gets past the
    /// counts and into the records (arbitrary bytes almost never do: a random entry count
    /// exceeds the data), and what it accepts restores into a table, smaller than the
    /// snapshot or not, without a panic and within the table's size.
    #[test]
    fn nearly_well_formed_records_decode_and_restore_without_panic(
        names in prop::collection::vec(
            prop_oneof![
                8 => "[a-z]{1,5}".prop_map(String::into_bytes),
                1 => prop::collection::vec(any::<u8>(), 0..6),
            ],
            1..4,
        ),
        records in prop::collection::vec(
            (
                prop_oneof![12 => 1u8..=4, 1 => any::<u8>()],
                prop::collection::vec(any::<u8>(), 0..20),
                prop_oneof![12 => 0u32..3, 1 => any::<u32>()],
                any::<u32>(),
            ),
            0..24,
        ),
        extra_entries in prop_oneof![6 => Just(0u32), 1 => 1u32..3],
        flip in prop::option::weighted(0.15, (any::<prop::sample::Index>(), any::<u8>())),
        cut in prop::option::weighted(0.15, any::<prop::sample::Index>()),
        size in 1u32..64,
    ) {
        let mut body = Vec::new();
        for n in &names {
            body.extend_from_slice(&(n.len() as u32).to_le_bytes());
            body.extend_from_slice(n);
        }
        for (kind, key, node, idle) in &records {
            body.push(*kind);
            match kind {
                1 => body.extend_from_slice(&key.iter().copied().chain([0; 4]).take(4).collect::<Vec<_>>()),
                2 | 4 => body.extend_from_slice(&key.iter().copied().chain([0; 16]).take(16).collect::<Vec<_>>()),
                3 => {
                    body.extend_from_slice(&(key.len() as u16).to_le_bytes());
                    body.extend_from_slice(key);
                }
                _ => body.extend_from_slice(key),
            }
            // Mostly one of the names, sometimes any index.
            let node = if *node < 3 { node % names.len() as u32 } else { *node };
            body.extend_from_slice(&node.to_le_bytes());
            body.extend_from_slice(&(idle % (2 * EXPIRE as u32)).to_le_bytes());
        }
        if let Some((at, byte)) = flip {
            if !body.is_empty() {
                let i = at.index(body.len());
                body[i] ^= byte;
            }
        }
        if let Some(at) = cut {
            if !body.is_empty() {
                body.truncate(at.index(body.len()));
            }
        }
        let count = records.len() as u32 + extra_entries;
        if let Ok(snap) = decode_snapshot(&checksummed(names.len() as u32, count, &body), T0, EXPIRE) {
            let mut t = store(size);
            t.restore(&snap, T0);
            prop_assert!(t.len() <= size as usize);
            prop_assert!(t.len() <= snap.entries.len());
        }
    }

    #[test]
    fn any_mutation_of_a_snapshot_is_caught(pos in any::<prop::sample::Index>(), byte in 1u8..) {
        let mut bytes = encode_snapshot(&sample(), T0 + 100);
        let i = pos.index(bytes.len());
        bytes[i] ^= byte;
        prop_assert!(decode_snapshot(&bytes, T0 + 100, EXPIRE).is_err());
    }
}

/// A version-1 snapshot header (no key) saying `names` names and `entries` entries, `body`
/// after it, and a checksum that matches.
fn checksummed(names: u32, entries: u32, body: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(b"LMPTSTCK");
    b.extend_from_slice(&1u16.to_le_bytes());
    b.extend_from_slice(&[0; 6]);
    b.extend_from_slice(&((40 + body.len() + 4) as u64).to_le_bytes());
    b.extend_from_slice(&T0.to_le_bytes());
    b.extend_from_slice(&names.to_le_bytes());
    b.extend_from_slice(&entries.to_le_bytes());
    b.extend_from_slice(body);
    let crc = crc32(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

/// The IEEE CRC-32, bit by bit: a second implementation to forge checksums in the test above.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// A restart: the new process has a pool in another order, without one of the old nodes.
#[test]
fn pins_survive_a_restart_by_node_name() {
    use limpet_core::table::AffinityTable;
    use limpet_core::{Pin, Pool};

    let old_pool = Pool::new(["lviv", "kyiv", "odesa"]).expect("pool");
    let mut before = AffinityTable::new(store(100), &old_pool);
    for (i, name) in ["lviv", "kyiv", "odesa"].iter().enumerate() {
        let id = old_pool.lookup(name.as_bytes()).expect("node");
        before.learn(v4(i as u32), id, T0);
    }
    let bytes = encode_snapshot(before.store(), T0 + 5);

    let new_pool = Pool::new(["odesa", "dnipro", "kyiv"]).expect("pool");
    let mut after = AffinityTable::new(store(100), &new_pool);
    let snap = decode_snapshot(&bytes, T0 + 10, EXPIRE).expect("valid");
    assert_eq!(after.store_mut().restore(&snap, T0 + 10).loaded, 3);
    let id = |n: &str| new_pool.lookup(n.as_bytes()).expect("node");
    assert_eq!(after.lookup(v4(0), T0 + 10), Pin::Unknown);
    assert_eq!(after.lookup(v4(1), T0 + 10), Pin::Node(id("kyiv")));
    assert_eq!(after.lookup(v4(2), T0 + 10), Pin::Node(id("odesa")));
}

/// A snapshot read a page at a time for a keyed table records its key, and one written
/// without a key reads back with none; the key tells apart what does not carry over
/// (another prefix, header or cookie, or another kind) and not what does (a header name's
/// case, which HTTP ignores).
#[test]
fn a_keyed_snapshot_records_its_key() {
    use limpet_core::table::{IpPrefix, KeySpec};
    let t = sample();
    let host = KeySpec::SourceIp(IpPrefix::HOST);
    let mut pages = SnapshotPages::keyed(&host);
    while pages.read(&t, 5, T0 + 100) {}
    let snap = decode_snapshot(&pages.encode(T0 + 100), T0 + 100, EXPIRE).expect("valid");
    assert_eq!(snap.key, Some(host.fingerprint()));
    assert_eq!(snap.entries.len(), 24);
    let unkeyed = decode_snapshot(&encode_snapshot(&t, T0 + 100), T0 + 100, EXPIRE).expect("valid");
    assert_eq!(unkeyed.key, None);
    let keys = [
        host.clone(),
        KeySpec::SourceIp(IpPrefix::new(24, 128).expect("prefix")),
        KeySpec::SourceIp(IpPrefix::new(32, 64).expect("prefix")),
        KeySpec::header("X-Session").expect("header"),
        KeySpec::header("X-Other").expect("header"),
        KeySpec::learn_header("X-Session").expect("header"),
        KeySpec::AppCookie("X-Session".into()),
        KeySpec::AppCookie("x-session".into()),
    ];
    for (i, a) in keys.iter().enumerate() {
        assert_ne!(a.fingerprint(), 0, "{a:?}");
        for b in &keys[i + 1..] {
            assert_ne!(a.fingerprint(), b.fingerprint(), "{a:?} and {b:?}");
        }
    }
    assert_eq!(
        KeySpec::header("X-Session").expect("header").fingerprint(),
        KeySpec::header("x-session").expect("header").fingerprint()
    );
}
