//! Table snapshots: pins that survive a restart, as pure functions over bytes.
//!
//! ```text
//!  LruTable ──encode_snapshot(&table, now)──► Vec<u8> ──(binary writes the file)
//!  (binary reads the file) ──► &[u8] ──decode_snapshot(bytes, now, expire)──► Snapshot
//!  Snapshot ──LruTable::restore(&snapshot, now)──► table filled, LRU order and idle times kept
//! ```
//!
//! ## Format, version 1 (all integers little-endian)
//!
//! ```text
//!  offset size
//!   0      8   magic "LMPTSTCK"
//!   8      2   version = 1
//!  10      2   flags: 0, or 1 when the next field holds the table's key
//!                (a reader refuses any other value)
//!  12      4   with flag 1, the key's [`KeySpec::fingerprint`]; else 0
//!  16      8   total length of the snapshot in bytes, this header and the checksum included
//!  24      8   saved_at_ms: the table's clock when written
//!  32      4   name count N
//!  36      4   entry count M
//!  40          N names:   u32 length, UTF-8 bytes (node names; entries refer to them by index)
//!              M entries, least recently used first:
//!                 u8 kind: 1 IPv4 | 2 IPv6 | 3 bytes | 4 digest
//!                 key: 4 bytes | 16 bytes | u16 length + bytes (<= MAX_KEY_LEN) | 16 bytes
//!                 u32 node: index into the names
//!                 u32 idle_ms at saved_at_ms
//!  end-4   4   CRC-32 (IEEE) of every byte before it
//! ```
//!
//! Idle times, not absolute times, are stored so the format does not depend on the table's
//! internal stamp base; the downtime between save and load counts as idle time, since the
//! clients were idle then too. The total length makes a truncated file say "truncated" rather
//! than "checksum mismatch". Decoding never panics and never trusts a count to size an
//! allocation: each count is checked against the bytes left first.

use std::fmt;

use super::hash::crc32;
use super::key::{KeyRef, RefRepr, TableKey, MAX_KEY_LEN};
use super::lru::LruTable;
use super::nodes::{NodeNames, NodeRef};
use super::AffinityStore;
use super::KeySpec;

const MAGIC: [u8; 8] = *b"LMPTSTCK";
/// The format version this code writes and reads.
pub const SNAPSHOT_VERSION: u16 = 1;
const HEADER_LEN: usize = 40;
const CRC_LEN: usize = 4;
/// Smallest entry record: kind, an empty byte key (2), node, idle.
const MIN_ENTRY_LEN: usize = 1 + 2 + 4 + 4;
/// Smallest name record: its length field.
const MIN_NAME_LEN: usize = 4;

const KIND_V4: u8 = 1;
const KIND_V6: u8 = 2;
const KIND_BYTES: u8 = 3;
const KIND_DIGEST: u8 = 4;

/// Flag: the header's next word is the key's fingerprint.
const FLAG_KEYED: u16 = 1;

/// A decoded snapshot: the entries still live at load time, least recently used first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub saved_at_ms: u64,
    /// The [`KeySpec::fingerprint`] of the table that wrote it, if recorded (a snapshot of
    /// [`SnapshotPages::keyed`]; files written before keys were recorded have none). A
    /// reader compares it with its own table's before it restores.
    pub key: Option<u32>,
    /// Node names; [`SnapshotEntry::node`] indexes this list.
    pub names: Vec<Box<str>>,
    pub entries: Vec<SnapshotEntry>,
    /// Entries dropped because they had expired by load time.
    pub expired: usize,
}

/// One pin of a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotEntry {
    pub key: TableKey,
    /// Index into [`Snapshot::names`].
    pub node: u32,
    /// Last use, epoch milliseconds.
    pub last_used_ms: u64,
}

impl Snapshot {
    /// The node name of an entry.
    pub fn node_name(&self, entry: &SnapshotEntry) -> Option<&str> {
        self.names.get(entry.node as usize).map(|n| &**n)
    }
}

/// Why a snapshot cannot be loaded. The binary reports it and starts with an empty table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SnapshotError {
    /// Fewer bytes than the header says the snapshot has (or than a header).
    Truncated {
        len: usize,
        expected: u64,
    },
    /// More bytes than the header says.
    TrailingBytes {
        len: usize,
        expected: u64,
    },
    /// Not a limpet table snapshot.
    BadMagic,
    UnsupportedVersion(u16),
    /// The content does not match its checksum: the file is corrupt.
    Checksum {
        stored: u32,
        computed: u32,
    },
    /// The checksum matched but the content does not parse (written by a buggy or hostile
    /// writer): `what` failed at byte `offset`.
    Malformed {
        offset: usize,
        what: &'static str,
    },
}

impl fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SnapshotError::Truncated { len, expected } => {
                write!(f, "snapshot truncated: {len} bytes of {expected}")
            }
            SnapshotError::TrailingBytes { len, expected } => write!(
                f,
                "snapshot has trailing bytes: {len} bytes, header says {expected}"
            ),
            SnapshotError::BadMagic => f.write_str("not a limpet table snapshot"),
            SnapshotError::UnsupportedVersion(v) => write!(
                f,
                "snapshot format version {v} is not supported (this build reads {SNAPSHOT_VERSION})"
            ),
            SnapshotError::Checksum { stored, computed } => write!(
                f,
                "snapshot is corrupt: checksum {computed:08x}, stored {stored:08x}"
            ),
            SnapshotError::Malformed { offset, what } => {
                write!(f, "snapshot is malformed at byte {offset}: {what}")
            }
        }
    }
}

impl std::error::Error for SnapshotError {}

/// Writes the live entries of `table` (idle times taken at `now_ms`, or the table's clock if
/// later), least recently used first, in one pass: the table is read whole. A table shared
/// with traffic is read a page at a time with [`SnapshotPages`] instead.
pub fn encode_snapshot(table: &LruTable, now_ms: u64) -> Vec<u8> {
    let saved_at = now_ms.max(table.clock_ms());
    encode_entries(
        saved_at,
        saved_at,
        0,
        table.names(),
        table.len(),
        table
            .iter_oldest_first(saved_at)
            .map(|(key, node, last_used)| (key.as_key_ref(), node, last_used)),
    )
}

/// A snapshot read from its table a page of positions at a time
/// ([`LruTable::used_at`]), so the caller can let go of the table's lock between pages: the
/// table read whole for a save held it about 50 ms per million entries (and a request to it
/// waited that long).
///
/// Pages go from the slab's end down to its start. A removal between pages fills its hole
/// with the slab's last entry, which is behind the read (already read: it is read again, and
/// a restore keeps it once) or an entry put since the read began; so every entry there when
/// the read began and still there is read. What the snapshot may leave out is only what was
/// put during the read (a key removed and put again included), as a snapshot taken when
/// the read began would. [`encode`](Self::encode) needs no table: the caller encodes with
/// the table's lock let go.
#[derive(Debug, Default)]
pub struct SnapshotPages {
    entries: Vec<(TableKey, NodeRef, u64)>,
    /// The positions at and above this are read (`None`: nothing yet).
    below: Option<usize>,
    /// The table's names and clock, taken at the last page.
    names: NodeNames,
    clock_ms: u64,
    /// The key's fingerprint written in the header (0: none).
    key: u32,
}

impl SnapshotPages {
    /// Nothing read yet.
    pub fn new() -> Self {
        SnapshotPages::default()
    }

    /// Nothing read yet, for a table keyed on `key`, which the snapshot records
    /// ([`Snapshot::key`]).
    pub fn keyed(key: &KeySpec) -> Self {
        SnapshotPages {
            key: key.fingerprint(),
            ..SnapshotPages::default()
        }
    }

    /// Reads the live entries at the next `limit` positions of `table` (downwards); false
    /// once the read has reached the table's start. The last page also takes the table's
    /// names (a table only ever adds names, so every entry read names its node by the same
    /// index in them) and clock.
    pub fn read(&mut self, table: &LruTable, limit: usize, now_ms: u64) -> bool {
        let end = self.below.unwrap_or(usize::MAX).min(table.len());
        let start = end.saturating_sub(limit.max(1));
        self.entries
            .extend(table.used_at(start, end - start, 0, now_ms));
        self.below = Some(start);
        if start > 0 {
            return true;
        }
        self.names = table.names().clone();
        self.clock_ms = table.clock_ms();
        false
    }

    /// The snapshot of the entries read, least recently used first, idle times taken at
    /// `now_ms` (or the table's clock at the last page, if later).
    pub fn encode(self, now_ms: u64) -> Vec<u8> {
        self.encode_on(now_ms, 0)
    }

    /// [`encode`](Self::encode) for a reader on a clock `offset_ms` ahead of the table's
    /// (negative: behind): idle times as `encode` takes them, the save time moved by the
    /// offset, so that every entry's time moves with it. A file is written on the wall clock
    /// as it reads at the save, which a clock kept monotonic since its process started (the
    /// binary's) is apart from by any step the wall clock took since.
    pub fn encode_on(mut self, now_ms: u64, offset_ms: i64) -> Vec<u8> {
        let saved_at = now_ms.max(self.clock_ms);
        self.entries.sort_by_key(|&(_, _, last_used)| last_used);
        encode_entries(
            saved_at,
            u64::try_from((i128::from(saved_at) + i128::from(offset_ms)).max(0))
                .unwrap_or(u64::MAX),
            self.key,
            &self.names,
            self.entries.len(),
            self.entries
                .iter()
                .map(|(key, node, last_used)| (key.as_key_ref(), *node, *last_used)),
        )
    }
}

/// The snapshot bytes of `entries` (least recently used first) naming `names`, saved at
/// `saved_at` on their clock, written as saved at `written_at` (the reader's clock), keyed
/// on the key whose fingerprint is `key` (0: none recorded); `len` sizes the buffer.
fn encode_entries<'k>(
    saved_at: u64,
    written_at: u64,
    key: u32,
    names: &NodeNames,
    len: usize,
    entries: impl Iterator<Item = (KeyRef<'k>, NodeRef, u64)>,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + 16 * names.len() + 17 * len + 4);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&SNAPSHOT_VERSION.to_le_bytes());
    let flags = if key == 0 { 0 } else { FLAG_KEYED };
    out.extend_from_slice(&flags.to_le_bytes());
    out.extend_from_slice(&key.to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes()); // total length, patched below
    out.extend_from_slice(&written_at.to_le_bytes());
    out.extend_from_slice(&(names.len() as u32).to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes()); // entry count, patched below
    for (_, name) in names.iter() {
        out.extend_from_slice(&(name.len() as u32).to_le_bytes());
        out.extend_from_slice(name.as_bytes());
    }
    let mut count: u32 = 0;
    for (key, node, last_used) in entries {
        write_key(&mut out, key);
        out.extend_from_slice(&(node.index() as u32).to_le_bytes());
        // Live entries are idle less than `expire` <= 2^31 - 1 ms, so this fits (an entry
        // that expired while a paged read went on says so on load).
        let idle = u32::try_from(saved_at.saturating_sub(last_used)).unwrap_or(u32::MAX);
        out.extend_from_slice(&idle.to_le_bytes());
        count += 1;
    }
    out[36..40].copy_from_slice(&count.to_le_bytes());
    let total = (out.len() + CRC_LEN) as u64;
    out[16..24].copy_from_slice(&total.to_le_bytes());
    let crc = crc32(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

fn write_key(out: &mut Vec<u8>, key: KeyRef<'_>) {
    match key.0 {
        RefRepr::V4(v) => {
            out.push(KIND_V4);
            out.extend_from_slice(&v.to_le_bytes());
        }
        RefRepr::V6(o) => {
            out.push(KIND_V6);
            out.extend_from_slice(&o);
        }
        RefRepr::Bytes(b) => {
            out.push(KIND_BYTES);
            // KeyRef keeps byte keys within MAX_KEY_LEN (256), so the length fits a u16.
            out.extend_from_slice(&(b.len() as u16).to_le_bytes());
            out.extend_from_slice(b);
        }
        RefRepr::Digest(d) => {
            out.push(KIND_DIGEST);
            out.extend_from_slice(&d);
        }
    }
}

/// How many bytes of a file [`snapshot_len`] reads: the magic, the version, the flags, the
/// reserved word and the total length.
pub const SNAPSHOT_PREFIX_LEN: usize = 24;

/// The length a snapshot says it has (its total-length field), from the file's first
/// [`SNAPSHOT_PREFIX_LEN`] bytes; `None` when they are not the start of a snapshot this code
/// reads (another magic, another version, too few bytes). A reader of a file reads no more
/// than that length and one byte (to tell trailing bytes), or than the prefix when `None`:
/// a path naming `/dev/zero`, or a file that keeps growing, is not read until memory runs out.
pub fn snapshot_len(prefix: &[u8]) -> Option<u64> {
    let magic = prefix.get(..MAGIC.len())?;
    let version = prefix.get(8..10)?;
    let total = prefix.get(16..SNAPSHOT_PREFIX_LEN)?;
    (magic == MAGIC && version == SNAPSHOT_VERSION.to_le_bytes())
        .then(|| u64::from_le_bytes(total.try_into().unwrap_or([0; 8])))
}

/// Reads a snapshot, dropping entries idle for `expire_ms` or more at `now_ms` (the table's
/// current `expire`, which may differ from the one in force when the snapshot was written).
/// Entries come back sorted by last use, oldest first.
pub fn decode_snapshot(
    bytes: &[u8],
    now_ms: u64,
    expire_ms: u64,
) -> Result<Snapshot, SnapshotError> {
    let len = bytes.len();
    if !MAGIC.starts_with(&bytes[..len.min(MAGIC.len())]) {
        return Err(SnapshotError::BadMagic);
    }
    let mut r = Reader { bytes, at: 0 };
    if len < 24 {
        // Too short to hold even the length field: a prefix of a header.
        return Err(SnapshotError::Truncated {
            len,
            expected: (HEADER_LEN + CRC_LEN) as u64,
        });
    }
    r.take(MAGIC.len())?;
    let version = r.u16()?;
    if version != SNAPSHOT_VERSION {
        return Err(SnapshotError::UnsupportedVersion(version));
    }
    let flags = r.u16()?;
    let reserved = r.u32()?;
    let total = r.u64()?;
    if total > len as u64 {
        return Err(SnapshotError::Truncated {
            len,
            expected: total,
        });
    }
    if total < len as u64 {
        return Err(SnapshotError::TrailingBytes {
            len,
            expected: total,
        });
    }
    if len < HEADER_LEN + CRC_LEN {
        return Err(r.malformed("length field smaller than a header"));
    }
    let body = len - CRC_LEN;
    let stored = u32::from_le_bytes(copy_array(&bytes[body..]));
    let computed = crc32(&bytes[..body]);
    if stored != computed {
        return Err(SnapshotError::Checksum { stored, computed });
    }
    let key = match (flags, reserved) {
        (0, 0) => None,
        (FLAG_KEYED, k) if k != 0 => Some(k),
        _ => return Err(r.malformed("unknown flags")),
    };
    // From here on the bytes are what a writer meant; errors are a writer's bugs, but still
    // only errors.
    let r_body = &bytes[..body];
    let mut r = Reader {
        bytes: r_body,
        at: r.at,
    };
    let saved_at_ms = r.u64()?;
    let name_count = r.u32()? as usize;
    let entry_count = r.u32()? as usize;
    if name_count > r.left() / MIN_NAME_LEN {
        return Err(r.malformed("name count exceeds the data"));
    }
    let mut names = Vec::with_capacity(name_count);
    for _ in 0..name_count {
        let n = r.u32()? as usize;
        let at = r.at;
        let raw = r.take(n)?;
        let name = std::str::from_utf8(raw).map_err(|_| SnapshotError::Malformed {
            offset: at,
            what: "node name is not UTF-8",
        })?;
        if name.is_empty() {
            return Err(SnapshotError::Malformed {
                offset: at,
                what: "empty node name",
            });
        }
        names.push(Box::<str>::from(name));
    }
    if entry_count > r.left() / MIN_ENTRY_LEN {
        return Err(r.malformed("entry count exceeds the data"));
    }
    let mut entries = Vec::with_capacity(entry_count);
    let mut expired = 0;
    for _ in 0..entry_count {
        let key = read_key(&mut r)?;
        let node_at = r.at;
        let node = r.u32()?;
        if node as usize >= names.len() {
            return Err(SnapshotError::Malformed {
                offset: node_at,
                what: "entry names no node of the snapshot",
            });
        }
        let idle = r.u32()?;
        let last_used_ms = saved_at_ms.saturating_sub(u64::from(idle));
        if now_ms.saturating_sub(last_used_ms) >= expire_ms {
            expired += 1;
            continue;
        }
        entries.push(SnapshotEntry {
            key,
            node,
            last_used_ms,
        });
    }
    if r.left() != 0 {
        return Err(r.malformed("data after the last entry"));
    }
    // A faithful writer already wrote them in this order; sorting (stable, so a later
    // duplicate of a key stays later and wins) makes a restore correct for any writer.
    entries.sort_by_key(|e| e.last_used_ms);
    Ok(Snapshot {
        saved_at_ms,
        key,
        names,
        entries,
        expired,
    })
}

fn read_key(r: &mut Reader<'_>) -> Result<TableKey, SnapshotError> {
    let at = r.at;
    let key = match r.u8()? {
        KIND_V4 => KeyRef(RefRepr::V4(r.u32()?)),
        KIND_V6 => KeyRef(RefRepr::V6(copy_array(r.take(16)?))),
        KIND_BYTES => {
            let n = r.u16()? as usize;
            if n > MAX_KEY_LEN {
                return Err(SnapshotError::Malformed {
                    offset: at,
                    what: "byte key longer than the maximum",
                });
            }
            KeyRef(RefRepr::Bytes(r.take(n)?))
        }
        KIND_DIGEST => KeyRef(RefRepr::Digest(copy_array(r.take(16)?))),
        _ => {
            return Err(SnapshotError::Malformed {
                offset: at,
                what: "unknown key kind",
            })
        }
    };
    Ok(key.to_key())
}

/// Copies `b` into an array (callers pass slices of exactly `N` bytes; this never panics).
fn copy_array<const N: usize>(b: &[u8]) -> [u8; N] {
    let mut a = [0u8; N];
    let n = b.len().min(N);
    a[..n].copy_from_slice(&b[..n]);
    a
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn left(&self) -> usize {
        self.bytes.len() - self.at
    }

    fn malformed(&self, what: &'static str) -> SnapshotError {
        SnapshotError::Malformed {
            offset: self.at,
            what,
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], SnapshotError> {
        if n > self.left() {
            return Err(self.malformed("field runs past the end"));
        }
        let s = &self.bytes[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8, SnapshotError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, SnapshotError> {
        Ok(u16::from_le_bytes(copy_array(self.take(2)?)))
    }

    fn u32(&mut self) -> Result<u32, SnapshotError> {
        Ok(u32::from_le_bytes(copy_array(self.take(4)?)))
    }

    fn u64(&mut self) -> Result<u64, SnapshotError> {
        Ok(u64::from_le_bytes(copy_array(self.take(8)?)))
    }
}
