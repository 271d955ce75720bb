//! Table snapshots on disk: loaded at start, saved at an interval and on shutdown.
//!
//! The bytes are the core's (`encode_snapshot` / `decode_snapshot`: versioned, checksummed).
//! This module only moves them: a save writes a temporary file beside the target and renames
//! it over, so a crash mid-write leaves the previous snapshot whole. A load that finds a
//! missing, corrupt or truncated file reports it and starts with an empty table: a snapshot
//! never blocks a start.

use std::path::Path;

use limpet_core::table::{decode_snapshot, encode_snapshot};

use super::Table;
use crate::clock::now_ms;

/// What loading a snapshot did, for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SnapshotLoad {
    /// No file yet (first start).
    Missing,
    Loaded {
        loaded: usize,
        expired: usize,
    },
    /// Unreadable, corrupt or truncated: reported and skipped.
    Skipped(String),
}

/// Loads `table`'s snapshot file, if it has one configured.
pub fn load_snapshot(table: &Table) -> Option<SnapshotLoad> {
    let snap = table.def.snapshot.as_ref()?;
    let result = load_from(table, &snap.path);
    match &result {
        SnapshotLoad::Missing => {
            tracing::info!(table = %table.def.name, path = %snap.path.display(), "no snapshot yet")
        }
        SnapshotLoad::Loaded { loaded, expired } => tracing::info!(
            table = %table.def.name, path = %snap.path.display(), loaded, expired, "snapshot loaded"
        ),
        SnapshotLoad::Skipped(why) => tracing::warn!(
            table = %table.def.name, path = %snap.path.display(), error = %why,
            "snapshot skipped; starting with an empty table"
        ),
    }
    Some(result)
}

fn load_from(table: &Table, path: &Path) -> SnapshotLoad {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return SnapshotLoad::Missing,
        Err(e) => return SnapshotLoad::Skipped(format!("cannot read: {e}")),
    };
    restore(table, &bytes)
}

/// Replaces `table`'s pins with those a running limpet handed over (`crate::upgrade`): its
/// snapshot bytes, newer than any file. Bad bytes are reported and leave the table as it is.
pub(crate) fn restore_handed(table: &Table, bytes: &[u8]) -> SnapshotLoad {
    let result = restore(table, bytes);
    match &result {
        SnapshotLoad::Loaded { loaded, expired } => tracing::info!(
            table = %table.def.name, loaded, expired, "pins taken over from the running limpet"
        ),
        other => tracing::warn!(
            table = %table.def.name, result = ?other, "pins of the running limpet not taken over"
        ),
    }
    result
}

fn restore(table: &Table, bytes: &[u8]) -> SnapshotLoad {
    let now = now_ms();
    let expire_ms = u64::try_from(table.def.expire.as_millis()).unwrap_or(u64::MAX);
    match decode_snapshot(bytes, now, expire_ms) {
        Ok(snap) => {
            let mut t = table.lock();
            let report = t.store_mut().restore(&snap, now);
            SnapshotLoad::Loaded {
                loaded: report.loaded,
                expired: report.expired + snap.expired,
            }
        }
        Err(e) => SnapshotLoad::Skipped(e.to_string()),
    }
}

/// Saves `table` to its snapshot file, if it has one. Errors are returned for the log; the
/// table is untouched either way.
pub fn save_snapshot(table: &Table) -> Option<std::io::Result<usize>> {
    let snap = table.def.snapshot.as_ref()?;
    // One save of the table at a time (see `Table::saving`). Saves run on blocking threads,
    // where waiting here is fine.
    let _one = table
        .saving
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let bytes = {
        let t = table.lock();
        encode_snapshot(t.store(), now_ms())
    };
    // This process's own temporary name: a limpet handing over to a new one may still be
    // saving when the new one saves (`crate::upgrade`).
    let tmp = snap
        .path
        .with_extension(format!("tmp.{}", std::process::id()));
    let result = std::fs::write(&tmp, &bytes)
        .and_then(|()| std::fs::rename(&tmp, &snap.path))
        .map(|()| bytes.len());
    match &result {
        Ok(n) => tracing::debug!(table = %table.def.name, bytes = n, "snapshot saved"),
        Err(e) => {
            tracing::warn!(table = %table.def.name, path = %snap.path.display(), error = %e, "snapshot not saved")
        }
    }
    Some(result)
}
