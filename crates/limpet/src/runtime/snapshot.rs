//! Table snapshots on disk: loaded at start, saved at an interval and on shutdown.
//!
//! The bytes are the core's (`SnapshotPages` / `decode_snapshot`: versioned, checksummed).
//! This module only moves them: a save writes a temporary file beside the target (its name,
//! `.tmp.`, and the process id), flushes it to the disk, renames it over and flushes the
//! directory, so neither a crash of limpet nor one of the machine mid-save leaves anything but
//! the previous snapshot or the new one, whole. A save that fails removes its temporary file;
//! those a killed limpet left are removed by the next load. A load that finds a missing,
//! corrupt or truncated file reports it and starts with an empty table, as does one whose
//! disk does not answer within [`SNAPSHOT_LOAD_LIMIT`]: a snapshot never blocks a start.

use std::io::Write;
use std::path::{Path, PathBuf};

use limpet_core::table::{decode_snapshot, SnapshotPages};

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

/// How long a start waits for its tables' snapshot files, all of them together: a file on a
/// disk that does not answer (a hung network mount, a FIFO) must not keep limpet from
/// starting, nor a new limpet taking over from a running one past its handover limit
/// (`crate::upgrade::HANDOVER_LIMIT`, 30 s). A snapshot of a million pins, some 20 MB, reads
/// in well under a second from any disk that answers.
pub const SNAPSHOT_LOAD_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Loads `table`'s snapshot file, if it has one configured (on this thread, unbounded: a
/// start uses [`load_snapshots`]).
pub fn load_snapshot(table: &Table) -> Option<SnapshotLoad> {
    let snap = table.def.snapshot.as_ref()?;
    Some(restore_read(table, &snap.path, read_snapshot(&snap.path)))
}

/// Loads the snapshot file of each of `tables` that has one, each read on a blocking thread
/// of its own, for at most [`SNAPSHOT_LOAD_LIMIT`] in all. A table whose file has not been
/// read by then starts empty, as from a file it could not read, and is saved as usual; its
/// thread is left to end when the disk answers, and what it read then is dropped. Merged in
/// late, the file's pins would undo what happened to the table since the start (an operator's
/// deletes, evictions, a fleet's newer pins, an upgrade's handed ones), each a case of its
/// own; skipped, they are lost as those of a file that could not be read are: their
/// sessions are pinned afresh at their next request.
pub async fn load_snapshots(tables: impl IntoIterator<Item = std::sync::Arc<Table>>) {
    let tables: Vec<_> = tables
        .into_iter()
        .filter_map(|t| Some((t.def.snapshot.as_ref()?.path.clone(), t)))
        .collect();
    let read = read_snapshots(tables.iter().map(|(path, _)| path.clone()).collect()).await;
    for ((path, table), bytes) in tables.iter().zip(read) {
        restore_read(table, path, bytes);
    }
}

/// Reads the snapshot files at `paths`, each on a blocking thread of its own, for at most
/// [`SNAPSHOT_LOAD_LIMIT`] in all ([`load_snapshots`]): each file's bytes, or what reading
/// it did instead, in `paths`' order.
pub(crate) async fn read_snapshots(paths: Vec<PathBuf>) -> Vec<Result<Vec<u8>, SnapshotLoad>> {
    let deadline = tokio::time::Instant::now() + SNAPSHOT_LOAD_LIMIT;
    let reads: Vec<_> = paths
        .into_iter()
        .map(|path| tokio::task::spawn_blocking(move || read_snapshot(&path)))
        .collect();
    let mut out = Vec::with_capacity(reads.len());
    for read in reads {
        out.push(match tokio::time::timeout_at(deadline, read).await {
            Ok(Ok(read)) => read,
            Ok(Err(e)) => Err(SnapshotLoad::Skipped(format!("the read failed: {e}"))),
            Err(_) => Err(SnapshotLoad::Skipped(format!(
                "not read within {} s (the disk does not answer)",
                SNAPSHOT_LOAD_LIMIT.as_secs()
            ))),
        });
    }
    out
}

/// Restores what [`read_snapshots`] read of `table`'s file at `path` (nothing if it could not
/// be read), and says what it did in the log.
pub(crate) fn restore_read(
    table: &Table,
    path: &Path,
    read: Result<Vec<u8>, SnapshotLoad>,
) -> SnapshotLoad {
    let result = match read {
        Ok(bytes) => restore(table, &bytes),
        Err(not) => not,
    };
    report(table, path, &result);
    result
}

/// A snapshot file's bytes, after removing the temporary files killed limpets left beside
/// it; or what loading it did instead (missing, unreadable). No more is read than the length
/// the file's first bytes give, and one byte (which the decoder takes for trailing bytes), or
/// than those first bytes when they are not a snapshot's: a path naming `/dev/zero`, a log
/// that keeps growing or a large unrelated file is not read until memory runs out (past the
/// start's wait its thread read on, and the allocation that failed aborted the process).
fn read_snapshot(path: &Path) -> Result<Vec<u8>, SnapshotLoad> {
    use limpet_core::table::{snapshot_len, SNAPSHOT_PREFIX_LEN};
    use std::io::Read as _;
    remove_stale_temporaries(path);
    let mut bytes = Vec::new();
    let read = std::fs::File::open(path).and_then(|mut f| {
        (&mut f)
            .take(SNAPSHOT_PREFIX_LEN as u64)
            .read_to_end(&mut bytes)?;
        let rest = snapshot_len(&bytes)
            .map_or(0, |total| total.saturating_sub(SNAPSHOT_PREFIX_LEN as u64))
            .saturating_add(1);
        f.take(rest).read_to_end(&mut bytes)
    });
    match read {
        Ok(_) => Ok(bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(SnapshotLoad::Missing),
        Err(e) => Err(SnapshotLoad::Skipped(format!("cannot read: {e}"))),
    }
}

/// What loading `table`'s snapshot at `path` did, in the log.
fn report(table: &Table, path: &Path, result: &SnapshotLoad) {
    match result {
        SnapshotLoad::Missing => {
            tracing::info!(table = %table.def.name, path = %path.display(), "no snapshot yet")
        }
        SnapshotLoad::Loaded { loaded, expired } => tracing::info!(
            table = %table.def.name, path = %path.display(), loaded, expired, "snapshot loaded"
        ),
        SnapshotLoad::Skipped(why) => tracing::warn!(
            table = %table.def.name, path = %path.display(), error = %why,
            "snapshot skipped; starting with an empty table"
        ),
    }
}

/// Replaces `table`'s pins with those a running limpet handed over (`crate::upgrade`): its
/// snapshot bytes, newer than any file, their times on a clock `offset_ms` behind this
/// process's ([`crate::upgrade::State::clock_offset`]): read on that clock, then moved onto
/// this one, so a wall clock stepped since the running limpet started neither ages every
/// pin by the step (past `expire`, all of them lost) nor keeps them past their time. Bad
/// bytes are reported and leave the table as it is.
pub(crate) fn restore_handed(table: &Table, bytes: &[u8], offset_ms: i64) -> SnapshotLoad {
    let result = restore_on(table, bytes, offset_ms);
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

/// Restores a snapshot file's bytes: their times are the wall clock's at the save
/// ([`save_snapshot`]), moved onto this process's clock by the step the wall clock took
/// since it started ([`crate::clock::wall_step_ms`], none at a start).
fn restore(table: &Table, bytes: &[u8]) -> SnapshotLoad {
    restore_on(table, bytes, crate::clock::wall_step_ms().saturating_neg())
}

/// [`restore`] of bytes whose times are on a clock `offset_ms` behind this one.
fn restore_on(table: &Table, bytes: &[u8], offset_ms: i64) -> SnapshotLoad {
    let now = now_ms();
    let expire_ms = u64::try_from(table.def.expire.as_millis()).unwrap_or(u64::MAX);
    match decode_on(bytes, now, offset_ms, expire_ms) {
        // Saved by a table keyed on another key (its prefix, header or cookie changed since,
        // with a restart or an upgrade between): its keys mean something else here, so none
        // is restored, as a reload that changes a table's key drops its entries. Restored,
        // most would never be found again while they took room and counted as pins, and
        // some would pin other clients (a `/32` pin catching a whole `/24`).
        Ok(snap) if snap.key.is_some_and(|k| k != table.def.key.fingerprint()) => {
            SnapshotLoad::Skipped(
                "saved by a table keyed on another key (its key changed since): its pins \
                 would mean other clients here"
                    .into(),
            )
        }
        Ok(snap) => {
            let report = table.lock().store_mut().restore(&snap, now);
            if report.loaded > 0 {
                table.pins_restored();
            }
            SnapshotLoad::Loaded {
                loaded: report.loaded,
                expired: report.expired + snap.expired,
            }
        }
        Err(e) => SnapshotLoad::Skipped(e.to_string()),
    }
}

/// Decodes snapshot bytes written on a clock `offset_ms` behind the one that reads `now`:
/// read on that clock (entries idle `expire_ms` there are dropped), then each time moved
/// onto this one.
fn decode_on(
    bytes: &[u8],
    now: u64,
    offset_ms: i64,
    expire_ms: u64,
) -> Result<limpet_core::table::Snapshot, limpet_core::table::SnapshotError> {
    use crate::clock::shifted;
    let mut snap = decode_snapshot(bytes, shifted(now, offset_ms.saturating_neg()), expire_ms)?;
    if offset_ms != 0 {
        snap.saved_at_ms = shifted(snap.saved_at_ms, offset_ms);
        for e in &mut snap.entries {
            e.last_used_ms = shifted(e.last_used_ms, offset_ms);
        }
    }
    Ok(snap)
}

/// Table positions a snapshot save reads per lock of the table: 0.1-0.2 ms of it at a
/// million entries (`cargo bench -p limpet-core --bench table -- pages`).
const SNAPSHOT_PAGE: usize = 4096;

/// `table`'s snapshot bytes (a save's, a hand-over's), read a page of positions at a time
/// with the table locked only for the page, and encoded with it let go: routing never waits
/// for a whole big table (read and encoded at once, a million entries held the lock for
/// about 50 ms). Blocking work for a blocking thread.
pub(crate) fn encode_paged(table: &Table) -> Vec<u8> {
    encode_paged_on(table, 0)
}

/// [`encode_paged`] with every time moved by `offset_ms` (onto another clock).
fn encode_paged_on(table: &Table, offset_ms: i64) -> Vec<u8> {
    let mut pages = SnapshotPages::keyed(&table.def.key);
    while pages.read(table.lock().store(), SNAPSHOT_PAGE, now_ms()) {}
    pages.encode_on(now_ms(), offset_ms)
}

/// Saves `table` to its snapshot file, if it has one. Errors are returned for the log; the
/// table is untouched either way.
pub fn save_snapshot(table: &Table) -> Option<std::io::Result<usize>> {
    let snap = table.def.snapshot.as_ref()?;
    // One save of the file at a time (`file_lock`). Saves run on blocking threads, where
    // waiting here is fine.
    let lock = file_lock(&snap.path);
    let _one = lock
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    // A table a reload replaced (keyed anew, or its file given to another) saves no more:
    // its save, begun before the reload and let in after the new table's, wrote the old
    // table's entries (let go by then: none) over the new table's, which a crash before
    // the new table's next save then lost.
    if table.retired() {
        tracing::debug!(table = %table.def.name, "snapshot of a table a reload replaced: not saved");
        return None;
    }
    // On the wall clock as it reads now, which is what a limpet started later anchors its
    // clock to: this process's clock is apart from it by any step the wall clock took since
    // it started (an NTP step of hours on a machine whose clock was off), and a file on it
    // would have a restart take every pin as older by the step (past `expire`, all lost)
    // or younger (kept past its time).
    let bytes = encode_paged_on(table, crate::clock::wall_step_ms());
    // This process's own temporary name: a limpet handing over to a new one may still be
    // saving when the new one saves (`crate::upgrade`).
    let tmp = temporary(&snap.path, std::process::id());
    let result = write_durably(&tmp, &snap.path, &bytes, Some(SNAPSHOT_MODE)).map(|()| bytes.len());
    match &result {
        Ok(n) => tracing::debug!(table = %table.def.name, bytes = n, "snapshot saved"),
        Err(e) => {
            tracing::warn!(table = %table.def.name, path = %snap.path.display(), error = %e, "snapshot not saved")
        }
    }
    Some(result)
}

/// The lock of snapshot file `path` in this process: one save of a file at a time, whichever
/// table saves it. A reload that keys a table anew, or gives a removed table's file to
/// another, makes a new table; a save of the old one still under way (a slow disk) and one
/// of the new one (its interval's, or the shutdown's) would both write the one temporary
/// file, and the file would end as neither's. One lock per file the process ever saved: a
/// few, named by the config.
fn file_lock(path: &Path) -> std::sync::Arc<std::sync::Mutex<()>> {
    static LOCKS: std::sync::OnceLock<
        std::sync::Mutex<std::collections::HashMap<PathBuf, std::sync::Arc<std::sync::Mutex<()>>>>,
    > = std::sync::OnceLock::new();
    let mut all = LOCKS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    std::sync::Arc::clone(all.entry(path.to_owned()).or_default())
}

/// A snapshot file's mode: its owner's only. Its keys are what pins sessions, a cookie's or a
/// header's value an application session id that lets its reader take the session over (the
/// admin API shows them only with the token, and the log not at all); with the usual umask,
/// it was readable by every user of the machine, and an operator's `chmod` was undone by the
/// next save.
pub(super) const SNAPSHOT_MODE: u32 = 0o600;

/// The temporary file a save of `path` by process `pid` writes before renaming it over:
/// `path` with `.tmp.PID` added (not in place of its extension: two tables saved to `t.a`
/// and `t.b` at once would share `t.tmp.PID`, and each could rename the other's bytes over
/// its own file).
pub(crate) fn temporary(path: &Path, pid: u32) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".tmp.{pid}"));
    PathBuf::from(name)
}

/// Writes `bytes` to `tmp`, flushed to the disk, then renames it over `target` and flushes
/// the directory: after a crash of the machine the file holds the old snapshot or the new
/// one, never a name that points at blocks not yet written (the rename can reach the disk
/// before the data). On an error the temporary file is removed.
///
/// With a `mode`, the file gets it whatever the umask, and whatever an earlier file at `tmp`
/// had (open keeps an existing file's mode); without one, the umask's. A symbolic link at
/// `tmp` is not followed (the name is predictable).
pub(crate) fn write_durably(
    tmp: &Path,
    target: &Path,
    bytes: &[u8],
    mode: Option<u32>,
) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let mut open = std::fs::OpenOptions::new();
    open.write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_NOFOLLOW);
    if let Some(m) = mode {
        open.mode(m);
    }
    let written = open.open(tmp).and_then(|mut f| {
        if let Some(m) = mode {
            f.set_permissions(std::fs::Permissions::from_mode(m))?;
        }
        f.write_all(bytes)?;
        f.sync_all()
    });
    let renamed = written.and_then(|()| std::fs::rename(tmp, target));
    if renamed.is_err() {
        let _ = std::fs::remove_file(tmp);
        return renamed;
    }
    // The rename's own flush. Best effort: some filesystems refuse to flush a directory,
    // and the snapshot is saved all the same.
    let dir = match target.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if let Err(e) = std::fs::File::open(dir).and_then(|d| d.sync_all()) {
        tracing::debug!(dir = %dir.display(), error = %e, "snapshot directory not flushed");
    }
    Ok(())
}

/// A temporary file younger than this may belong to a save under way: kept.
const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(120);

/// Whether process `pid` exists (this one's, or any `kill(pid, 0)` does not call unknown:
/// one it may not signal exists too).
fn process_exists(pid: u32) -> bool {
    if pid == std::process::id() {
        return true;
    }
    let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    else {
        return false;
    };
    !matches!(
        rustix::process::test_kill_process(pid),
        Err(rustix::io::Errno::SRCH)
    )
}

/// Removes the temporary files that saves of `path` by processes no longer running left
/// beside it (a limpet killed mid-save): without this they would pile up, one per crash.
/// A file of a process that exists (another limpet saving now, or a process that took a
/// dead one's id), one younger than [`STALE_AFTER`], and a name limpet does not write
/// (`FILE.tmp.` and a process id in decimal) are kept.
pub(super) fn remove_stale_temporaries(path: &Path) {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return;
    };
    let prefix = format!("{name}.tmp.");
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let file = entry.file_name();
        let Some(pid) = file
            .to_str()
            .and_then(|f| f.strip_prefix(&prefix))
            .and_then(|p| p.parse::<u32>().ok().filter(|pid| pid.to_string() == p))
        else {
            continue;
        };
        // Young: a save of a limpet this one cannot see (another pid namespace sharing the
        // directory) may be writing it now.
        let young = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_none_or(|age| age < STALE_AFTER);
        if !young && !process_exists(pid) {
            let stale = entry.path();
            match std::fs::remove_file(&stale) {
                Ok(()) => {
                    tracing::info!(path = %stale.display(), "removed a temporary file (a snapshot's or the node states') left by a limpet that no longer runs")
                }
                Err(e) => {
                    tracing::warn!(path = %stale.display(), error = %e, "cannot remove a stale temporary file (a snapshot's or the node states')")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A snapshot path naming `/dev/zero` is read no further than a snapshot's first bytes,
    /// and a snapshot file that keeps growing no further than the length it gives and one
    /// byte (the decoder then reports trailing bytes); before, both were read until memory
    /// ran out. A snapshot whole is read whole.
    #[test]
    fn a_snapshot_file_is_read_no_further_than_its_length() {
        use limpet_core::table::{encode_snapshot, AffinityStore, KeyRef, LruTable, TableConfig};
        let dir = scratch("endless");
        let zero = dir.join("zero.snapshot");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap_or_else(|e| panic!("{e}"));
        let read = read_snapshot(&zero).map(|b| b.len());
        assert!(matches!(read, Ok(n) if n <= 25), "{read:?}");

        let mut t = LruTable::new(TableConfig::new(10, 60_000)).unwrap_or_else(|e| panic!("{e}"));
        let n = t.intern("a").unwrap_or_else(|| panic!("name"));
        t.put(KeyRef::bytes(b"k"), n, 1_000);
        let whole = encode_snapshot(&t, 1_000);
        let path = dir.join("t.snapshot");
        std::fs::write(&path, &whole).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(read_snapshot(&path).ok(), Some(whole.clone()));
        let mut grown = whole.clone();
        grown.extend(std::iter::repeat_n(7u8, 10_000));
        std::fs::write(&path, &grown).unwrap_or_else(|e| panic!("{e}"));
        let read = read_snapshot(&path).map(|b| b.len());
        assert_eq!(read.ok(), Some(whole.len() + 1));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A table of more positions than a page is saved whole, read a page at a time: every
    /// live entry of three pages' worth is in the bytes, and loads back.
    #[test]
    fn a_table_of_several_pages_is_saved_whole() {
        use limpet_core::table::{AffinityStore, IpPrefix, KeyRef, KeySpec};
        use limpet_core::Topology;
        let topology =
            Topology::with_weights([("a", 1), ("b", 1)]).unwrap_or_else(|e| panic!("{e}"));
        let def = crate::config::TableDef {
            name: "t".into(),
            key: KeySpec::SourceIp(IpPrefix::HOST),
            expire: std::time::Duration::from_secs(600),
            size: 100_000,
            snapshot: None,
            shared: false,
        };
        let table =
            super::super::Table::new(def, &topology, None).unwrap_or_else(|e| panic!("{e}"));
        let n = 3 * SNAPSHOT_PAGE as u32 + 7;
        let now = now_ms();
        {
            let mut t = table.lock();
            let s = t.store_mut();
            let a = s.intern("a").unwrap_or_else(|| panic!("intern"));
            for i in 0..n {
                s.put(KeyRef::v4(std::net::Ipv4Addr::from(i)), a, now);
            }
        }
        let bytes = encode_paged(&table);
        let snap = decode_snapshot(&bytes, now, 600_000).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(snap.entries.len(), n as usize);
    }

    /// Saves of one file by two tables take turns: a reload that keys a table anew makes a
    /// new table, whose save may start while the old one's still writes on a slow disk.
    /// Here the old one's save blocks on its temporary file (a FIFO nobody reads, as a disk
    /// that hangs), then the new one's starts; once the disk goes on (the FIFO read, which
    /// fails the old save at its flush), the file holds the new table's pins, whole. Before,
    /// each table had a lock of its own: both wrote the one temporary file, and the file
    /// was neither's.
    #[test]
    fn saves_of_one_file_by_two_tables_take_turns() {
        let dir = scratch("turns");
        let path = dir.join("t.snapshot");
        // Two tables of one name and file, as a reload that keys a table anew makes.
        let table = |node: &str| std::sync::Arc::new(saving_table(&path, 600_000, Some(node)));
        let (old, new) = (table("a"), table("b"));
        let tmp = temporary(&path, std::process::id());
        let made = std::process::Command::new("mkfifo")
            .arg(&tmp)
            .status()
            .unwrap_or_else(|e| panic!("mkfifo: {e}"));
        assert!(made.success());
        let save = |name: &str, t: &std::sync::Arc<super::super::Table>| {
            let t = std::sync::Arc::clone(t);
            std::thread::Builder::new()
                .name(name.to_owned())
                .spawn(move || save_snapshot(&t))
                .unwrap_or_else(|e| panic!("{e}"))
        };
        let saving_old = save("save-old", &old);
        crate::test_util::until_asleep("save-old");
        let saving_new = save("save-new", &new);
        crate::test_util::until_asleep("save-new");
        // The disk goes on.
        let mut f = std::fs::File::open(&tmp).unwrap_or_else(|e| panic!("{e}"));
        let _ = std::io::Read::read_to_end(&mut f, &mut Vec::new());
        drop(f);
        let old_saved = saving_old.join().unwrap_or_else(|_| panic!("old save"));
        let new_saved = saving_new.join().unwrap_or_else(|_| panic!("new save"));
        assert!(
            matches!(new_saved, Some(Ok(_))),
            "{new_saved:?} ({old_saved:?})"
        );
        let bytes = read_snapshot(&path).unwrap_or_else(|e| panic!("{e:?}"));
        let now = now_ms();
        let snap = decode_snapshot(&bytes, now, 600_000).unwrap_or_else(|e| panic!("{e}"));
        let nodes: Vec<&str> = snap
            .entries
            .iter()
            .filter_map(|e| snap.node_name(e))
            .collect();
        assert_eq!(nodes, ["b"], "the new table's pins, whole");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A snapshot file crosses a restart on the wall clock, whatever this process's clock
    /// reads: here it reads two hours ahead of the wall clock (as after the wall clock was
    /// stepped back two hours while limpet ran). A pin used just now is saved as used just
    /// now on the wall clock (which a limpet started now anchors to; on this process's
    /// clock, its pins would be kept two hours past their time), and a file a limpet wrote
    /// just now on the wall clock loads with its pins as idle as they were (read on this
    /// clock, two hours old: past the table's `expire` of one hour, every pin dropped).
    #[tokio::test(start_paused = true)]
    async fn snapshot_files_cross_a_restart_on_the_wall_clock() {
        use limpet_core::table::{encode_snapshot, AffinityStore, KeyRef, LruTable, TableConfig};
        const HOUR: u64 = 3_600_000;
        let dir = scratch("wall");
        let path = dir.join("t.snapshot");
        let table = || saving_table(&path, HOUR, None);
        let key = KeyRef::v4(std::net::Ipv4Addr::new(192, 0, 2, 1));
        crate::test_util::clock_ahead_of_wall(std::time::Duration::from_millis(2 * HOUR)).await;
        let near = |a: u64, b: u64| a.abs_diff(b) < 60_000;

        let saved = table();
        {
            let mut l = saved.lock();
            let s = l.store_mut();
            let a = s.intern("a").unwrap_or_else(|| panic!("intern"));
            s.put(key, a, now_ms());
        }
        assert!(matches!(save_snapshot(&saved), Some(Ok(_))));
        let wall = crate::test_util::wall_ms();
        let bytes = read_snapshot(&path).unwrap_or_else(|e| panic!("{e:?}"));
        let snap = decode_snapshot(&bytes, wall, HOUR).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(snap.entries.len(), 1);
        let used = snap.entries[0].last_used_ms;
        assert!(
            near(used, wall),
            "used at {used}, the wall clock reads {wall}"
        );

        let mut written =
            LruTable::new(TableConfig::new(10, HOUR)).unwrap_or_else(|e| panic!("{e}"));
        let a = written.intern("a").unwrap_or_else(|| panic!("intern"));
        written.put(key, a, wall);
        std::fs::write(&path, encode_snapshot(&written, wall)).unwrap_or_else(|e| panic!("{e}"));
        let loaded = table();
        assert_eq!(
            load_snapshot(&loaded),
            Some(SnapshotLoad::Loaded {
                loaded: 1,
                expired: 0
            })
        );
        let idle = loaded
            .lock()
            .store()
            .peek_idle(key, now_ms())
            .map(|(_, idle)| idle);
        assert!(idle.is_some_and(|i| i < 60_000), "idle {idle:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A table a reload replaced saves no more: its save, let in after the new table's
    /// (begun before the reload, on a slow disk), leaves the file the new table's. Before, it
    /// wrote the old table's entries, let go by then, over them: an empty snapshot until the
    /// new table's next save, and a crash meanwhile lost every pin.
    #[test]
    fn a_table_a_reload_replaced_does_not_save_over_the_new_one() {
        let dir = scratch("replaced");
        let path = dir.join("t.snapshot");
        let table = |node: &str| saving_table(&path, 600_000, Some(node));
        let (old, new) = (table("a"), table("b"));
        assert!(matches!(save_snapshot(&new), Some(Ok(_))));
        old.let_go();
        assert!(save_snapshot(&old).is_none(), "the replaced table's save");
        let bytes = read_snapshot(&path).unwrap_or_else(|e| panic!("{e:?}"));
        let snap = decode_snapshot(&bytes, now_ms(), 600_000).unwrap_or_else(|e| panic!("{e}"));
        let nodes: Vec<&str> = snap
            .entries
            .iter()
            .filter_map(|e| snap.node_name(e))
            .collect();
        assert_eq!(nodes, ["b"], "the new table's pins");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Table `t` of nodes a and b, keyed on the source address, expiring entries after
    /// `expire_ms` and saving to `path`; with 192.0.2.1 pinned to `node` now, if given.
    fn saving_table(path: &Path, expire_ms: u64, node: Option<&str>) -> super::super::Table {
        use limpet_core::table::{AffinityStore, IpPrefix, KeyRef, KeySpec};
        let topology = limpet_core::Topology::with_weights([("a", 1), ("b", 1)])
            .unwrap_or_else(|e| panic!("{e}"));
        let def = crate::config::TableDef {
            name: "t".into(),
            key: KeySpec::SourceIp(IpPrefix::HOST),
            expire: std::time::Duration::from_millis(expire_ms),
            size: 100,
            snapshot: Some(crate::config::SnapshotDef {
                path: path.to_owned(),
                interval: None,
            }),
            shared: false,
        };
        let t = super::super::Table::new(def, &topology, None).unwrap_or_else(|e| panic!("{e}"));
        if let Some(node) = node {
            let mut l = t.lock();
            let s = l.store_mut();
            let n = s.intern(node).unwrap_or_else(|| panic!("intern"));
            s.put(
                KeyRef::v4(std::net::Ipv4Addr::new(192, 0, 2, 1)),
                n,
                now_ms(),
            );
        }
        t
    }

    fn scratch(tag: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("limpet-snapshot-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        dir
    }

    /// Pins handed over by a limpet whose clock is ten minutes behind (a wall clock stepped
    /// since it started) keep their idle time on this one: read on the holder's clock and
    /// moved onto this one, a pin idle 10 ms there is idle 10 ms here, not 10 minutes (past
    /// a 1-minute `expire`: dropped) and not in the future.
    #[test]
    fn handed_pins_keep_their_idle_time_across_clocks() {
        use limpet_core::table::{encode_snapshot, AffinityStore, KeyRef, LruTable, TableConfig};
        const HOLDER: u64 = 1_700_000_000_000;
        const STEP: i64 = 600_000;
        let mut t = LruTable::new(TableConfig::new(10, 60_000)).unwrap_or_else(|e| panic!("{e}"));
        let n = t.intern("a").unwrap_or_else(|| panic!("intern"));
        t.put(KeyRef::bytes(b"client"), n, HOLDER);
        let bytes = encode_snapshot(&t, HOLDER + 10);
        for offset in [STEP, -STEP] {
            let here = HOLDER.saturating_add_signed(10 + offset);
            let snap = decode_on(&bytes, here, offset, 60_000).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(snap.entries.len(), 1, "offset {offset}");
            assert_eq!(
                snap.entries[0].last_used_ms,
                HOLDER.saturating_add_signed(offset)
            );
            let mut back =
                LruTable::new(TableConfig::new(10, 60_000)).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(back.restore(&snap, here).loaded, 1);
            let idle = back
                .peek_idle(KeyRef::bytes(b"client"), here)
                .map(|(_, idle)| idle);
            assert_eq!(idle, Some(10), "offset {offset}");
        }
        // Read on this clock as if it were the holder's, the pin is 10 minutes old: gone.
        let here = HOLDER.saturating_add_signed(10 + STEP);
        let unmoved = decode_on(&bytes, here, 0, 60_000).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(unmoved.entries.len(), 0);
        // A holder whose clock reading is as far off as an i64 goes (a holder's bytes are
        // its word): no overflow (debug builds panicked negating it), the pins read as old.
        for offset in [i64::MIN, i64::MAX] {
            let snap = decode_on(&bytes, here, offset, 60_000).unwrap_or_else(|e| panic!("{e}"));
            assert!(snap.entries.len() <= 1, "offset {offset}");
        }
    }

    /// Two snapshot files that differ only in their extension have temporary files of their
    /// own (the old name, with the extension replaced, was one for both).
    #[test]
    fn snapshots_that_differ_in_their_extension_have_temporary_files_of_their_own() {
        let (a, b) = (
            Path::new("/var/lib/limpet/t.a"),
            Path::new("/var/lib/limpet/t.b"),
        );
        assert_ne!(temporary(a, 7), temporary(b, 7));
        assert_eq!(temporary(a, 7), Path::new("/var/lib/limpet/t.a.tmp.7"));
    }

    /// A save writes the bytes and leaves no temporary file; one whose rename fails (the
    /// target is a directory) removes its temporary file and says why.
    #[test]
    fn a_save_leaves_no_temporary_file_whether_it_succeeds_or_fails() {
        let dir = scratch("save");
        let target = dir.join("t.snapshot");
        let tmp = temporary(&target, std::process::id());
        write_durably(&tmp, &target, b"pins", Some(SNAPSHOT_MODE))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(std::fs::read(&target).ok().as_deref(), Some(&b"pins"[..]));
        assert!(!tmp.exists());

        let blocked = dir.join("blocked");
        std::fs::create_dir_all(blocked.join("inside")).unwrap_or_else(|e| panic!("{e}"));
        let tmp = temporary(&blocked, std::process::id());
        assert!(write_durably(&tmp, &blocked, b"pins", Some(SNAPSHOT_MODE)).is_err());
        assert!(!tmp.exists(), "the failed save's temporary file is removed");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A snapshot file is its owner's only, whatever the umask, the mode the file had before
    /// (an operator's `chmod 644`) or a temporary file left with another mode: its keys may
    /// be session ids. Before, it took the umask's mode (usually world-readable).
    #[test]
    fn a_saved_snapshot_is_readable_by_its_owner_only() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = scratch("mode");
        let target = dir.join("t.snapshot");
        let mode = |p: &Path| {
            std::fs::metadata(p)
                .map(|m| m.permissions().mode() & 0o777)
                .unwrap_or_else(|e| panic!("{e}"))
        };
        std::fs::write(&target, b"old").unwrap_or_else(|e| panic!("{e}"));
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o644))
            .unwrap_or_else(|e| panic!("{e}"));
        let tmp = temporary(&target, std::process::id());
        std::fs::write(&tmp, b"left").unwrap_or_else(|e| panic!("{e}"));
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o666))
            .unwrap_or_else(|e| panic!("{e}"));
        write_durably(&tmp, &target, b"pins", Some(SNAPSHOT_MODE))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(mode(&target), 0o600);
        assert_eq!(std::fs::read(&target).ok().as_deref(), Some(&b"pins"[..]));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A symbolic link at the temporary file's name (predictable: the path and the pid) is
    /// not followed: the save fails and the file it points at is left as it was. Followed,
    /// the save truncated and rewrote whatever file the link named, with the snapshot's mode.
    #[test]
    fn a_save_does_not_follow_a_link_at_its_temporary_name() {
        let dir = scratch("link");
        let target = dir.join("t.snapshot");
        let other = dir.join("other");
        std::fs::write(&other, b"someone else's").unwrap_or_else(|e| panic!("{e}"));
        let tmp = temporary(&target, std::process::id());
        std::os::unix::fs::symlink(&other, &tmp).unwrap_or_else(|e| panic!("{e}"));
        assert!(write_durably(&tmp, &target, b"pins", Some(SNAPSHOT_MODE)).is_err());
        assert_eq!(
            std::fs::read(&other).ok().as_deref(),
            Some(&b"someone else's"[..])
        );
        assert!(!target.exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Temporary files of processes that no longer run are removed at load, once older than
    /// a save could be; this process's, a running process's (pid 1), a young one, another
    /// snapshot's and names limpet does not write are kept.
    #[test]
    fn a_load_removes_the_temporary_files_of_limpets_that_no_longer_run() {
        let dir = scratch("stale");
        let target = dir.join("t.snapshot");
        // The kernel's pid limit is at most 2^22: these pids run nowhere.
        let dead = temporary(&target, 4_194_304 + 17);
        let young = temporary(&target, 4_194_304 + 18);
        let own = temporary(&target, std::process::id());
        let init = temporary(&target, 1);
        let other = temporary(&dir.join("u.snapshot"), 4_194_304 + 17);
        let unrelated = dir.join("t.snapshot.tmp.notes");
        let signed = dir.join(format!("t.snapshot.tmp.+{}", 4_194_304 + 17));
        let old = std::time::SystemTime::now() - 2 * STALE_AFTER;
        for f in [&dead, &young, &own, &init, &other, &unrelated, &signed] {
            std::fs::write(f, b"x").unwrap_or_else(|e| panic!("{e}"));
            if f != &young {
                std::fs::File::options()
                    .write(true)
                    .open(f)
                    .and_then(|h| h.set_modified(old))
                    .unwrap_or_else(|e| panic!("{e}"));
            }
        }
        remove_stale_temporaries(&target);
        assert!(
            !dead.exists(),
            "a dead process's old temporary file is removed"
        );
        for kept in [&young, &own, &init, &other, &unrelated, &signed] {
            assert!(kept.exists(), "{} is kept", kept.display());
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
