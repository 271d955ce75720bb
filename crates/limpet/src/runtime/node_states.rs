//! The operator's node states on disk (`[admin] state_file`): what the admin API set (MAINT,
//! DRAIN and its deadline), written at each change and read at start, so that a node an
//! operator took out of service stays out through a crash and a restart (HAProxy's
//! `server-state-file`, which there takes a dump before each reload).
//!
//! ```text
//!  State::set_admin (admin API, upgrade hand-over, start) ─┐
//!  reload (nodes added or removed)                        ─┴► Lifecycle::admin_changed
//!     ─► writer task: the running nodes' states ─► temporary file, flushed, renamed over
//!  start: read (bounded, off the async threads) ─► State::set_admin per node the config has
//! ```
//!
//! The file is text, one line per node not READY (`maint NAME`, `drain NAME DEADLINE
//! SPREAD_MS`, the deadline in Unix milliseconds or `-`), after a version line. A line it
//! cannot read is reported and skipped, a node the config no longer has is left out, and a
//! file that cannot be read at all starts every node READY: the file never keeps limpet
//! from starting. An upgrade's hand-over comes after it, and wins (it is newer).

use std::path::Path;
use std::sync::Arc;

use limpet_core::AdminState;

use super::{Runtime, State};

/// The file's first line: what it is, and its format's version.
const HEADER: &str = "limpet-node-states 1";

/// The file's text for `states` (every node of the running config): the nodes not READY.
pub(super) fn encode(states: &[(String, AdminState)]) -> String {
    let mut out = format!("{HEADER}\n");
    for (node, admin) in states {
        match admin {
            AdminState::Ready => {}
            AdminState::Maint => out.push_str(&format!("maint {node}\n")),
            AdminState::Drain {
                deadline_ms,
                spread_ms,
            } => {
                let deadline = deadline_ms.map_or_else(|| "-".to_owned(), |d| d.to_string());
                out.push_str(&format!("drain {node} {deadline} {spread_ms}\n"));
            }
        }
    }
    out
}

/// The file's text for the running nodes' states. Drain deadlines are on the wall clock as
/// it reads now, which a limpet started later anchors its clock to: on this process's clock,
/// a wall clock stepped since it started (an NTP step of hours) would move every deadline
/// by the step at a restart (a drain of minutes cut at once, or held for hours).
fn file_text(state: &State) -> String {
    encode(&moved(
        state.node_admin_states(),
        crate::clock::wall_step_ms(),
    ))
}

/// `states` with their drain deadlines moved by `by_ms` (onto another clock).
fn moved(mut states: Vec<(String, AdminState)>, by_ms: i64) -> Vec<(String, AdminState)> {
    if by_ms != 0 {
        for (_, admin) in &mut states {
            if let AdminState::Drain {
                deadline_ms: Some(d),
                ..
            } = admin
            {
                *d = crate::clock::shifted(*d, by_ms);
            }
        }
    }
    states
}

/// The states `text` holds, and a reason for each line it could not read (numbered from 1).
/// A text without the version line holds none.
pub(super) fn decode(text: &str) -> (Vec<(String, AdminState)>, Vec<String>) {
    let mut lines = text.lines();
    if lines.next() != Some(HEADER) {
        return (
            Vec::new(),
            vec![format!("line 1: not {HEADER:?}: nothing read")],
        );
    }
    let mut states = Vec::new();
    let mut refused = Vec::new();
    for (i, line) in lines.enumerate() {
        let words: Vec<&str> = line.split_ascii_whitespace().collect();
        let state = match words.as_slice() {
            [] => continue,
            ["maint", node] => Some((node, AdminState::Maint)),
            ["drain", node, deadline, spread] => {
                let deadline_ms = match *deadline {
                    "-" => Some(None),
                    d => d.parse::<u64>().ok().map(Some),
                };
                deadline_ms
                    .zip(spread.parse::<u64>().ok())
                    .map(|(deadline_ms, spread_ms)| {
                        (
                            node,
                            AdminState::Drain {
                                deadline_ms,
                                spread_ms,
                            },
                        )
                    })
            }
            _ => None,
        };
        match state {
            Some((node, admin)) => states.push(((*node).to_owned(), admin)),
            None => refused.push(format!(
                "line {}: expected `maint NODE` or `drain NODE DEADLINE_MS|- SPREAD_MS`",
                i + 2
            )),
        }
    }
    (states, refused)
}

/// Reads the state file `path` (off the async threads, at most
/// [`super::snapshot::SNAPSHOT_LOAD_LIMIT`]) and sets each node it names that `state` has:
/// what the operator had set when the last limpet stopped or crashed.
pub(super) async fn load(state: &State, path: &Path) {
    let read = tokio::task::spawn_blocking({
        let path = path.to_owned();
        move || read_bounded(&path)
    });
    let read = async { read.await.map_err(std::io::Error::other)? };
    let text = match tokio::time::timeout(super::snapshot::SNAPSHOT_LOAD_LIMIT, read).await {
        Ok(Ok(text)) => text,
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => return,
        Ok(Err(e)) => {
            tracing::warn!(path = %path.display(), error = %e, "node states not read: every node starts READY");
            return;
        }
        Err(_) => {
            tracing::warn!(path = %path.display(), "node states not read within {} s (the disk does not answer): every node starts READY", super::snapshot::SNAPSHOT_LOAD_LIMIT.as_secs());
            return;
        }
    };
    let (states, refused) = decode(&text);
    // Written on the wall clock of the write: moved onto this process's (`write_on_change`).
    let states = moved(states, crate::clock::wall_step_ms().saturating_neg());
    for why in refused {
        tracing::warn!(path = %path.display(), "node states: {why}: skipped");
    }
    for (node, admin) in states {
        match state.set_admin(&node, admin) {
            Some(now) => {
                tracing::info!(node = %node, state = now.as_str(), "node state from {}", path.display());
            }
            None => {
                tracing::info!(node = %node, "node states: no node {node:?} in the config: left out");
            }
        }
    }
}

/// The file's text, at most 1 MiB (a path naming `/dev/zero` or a log is not read until
/// memory runs out).
fn read_bounded(path: &Path) -> std::io::Result<String> {
    use std::io::Read as _;
    // Those a limpet killed mid-write left beside it, as for snapshots.
    super::snapshot::remove_stale_temporaries(path);
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(1 << 20)
        .read_to_end(&mut bytes)?;
    String::from_utf8(bytes)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))
}

/// Writes the running nodes' states to `path` each time they change
/// ([`crate::lifecycle::Lifecycle::admin_changed`]), once `serving` turns true, until
/// dropped. One write at a time, the latest states each time (changes while a write runs
/// are written by the next); a disk that does not answer holds this task only. Not before
/// limpet serves: a new limpet taking over from a running one writes nothing until the
/// hand-over is confirmed and its states taken (one that never takes over leaves the file
/// to the running one), and none while it hands over in turn.
pub(super) async fn write_on_change(
    runtime: Arc<Runtime>,
    path: std::path::PathBuf,
    mut serving: tokio::sync::watch::Receiver<bool>,
) {
    if serving.wait_for(|s| *s).await.is_err() {
        return;
    }
    let life = Arc::clone(&runtime.state().lifecycle);
    // After a write that failed (a full disk, a directory made read-only), the states are
    // written again at a backoff as well as at the next change, until a write succeeds:
    // waiting for the next change only, an operator's MAINT answered 200 stayed off the disk
    // for good once the disk was back, and a crash then brought the node back READY.
    let mut retry: Option<std::time::Duration> = None;
    let mut failures = 0u32;
    loop {
        match retry {
            None => life.admin_changed.notified().await,
            Some(after) => tokio::select! {
                () = life.admin_changed.notified() => {}
                () = tokio::time::sleep(after) => {}
            },
        }
        let _one = life.state_write.lock().await;
        if life
            .handing_state_over
            .load(std::sync::atomic::Ordering::Acquire)
        {
            continue;
        }
        let text = file_text(&runtime.state());
        let target = path.clone();
        let written = tokio::task::spawn_blocking(move || {
            let tmp = super::snapshot::temporary(&target, std::process::id());
            // The umask's mode: node names and states.
            super::snapshot::write_durably(&tmp, &target, text.as_bytes(), None)
        })
        .await
        .map_err(std::io::Error::other)
        .and_then(|w| w);
        match written {
            Ok(()) if failures > 0 => {
                tracing::info!(path = %path.display(), failures, "node states saved again");
                (retry, failures) = (None, 0);
            }
            Ok(()) => tracing::debug!(path = %path.display(), "node states saved"),
            Err(e) => {
                // Logged at the first failure of a streak; the retries that fail too, at
                // debug (one a second at first, then at most one every `RETRY_MAX`).
                if failures == 0 {
                    tracing::warn!(path = %path.display(), error = %e, "node states not saved: written again once the disk takes them");
                } else {
                    tracing::debug!(path = %path.display(), error = %e, failures, "node states still not saved");
                }
                failures = failures.saturating_add(1);
                retry = Some(retry.map_or(RETRY_FIRST, |d| (d * 2).min(RETRY_MAX)));
            }
        }
    }
}

/// The first wait before the node states are written again after a failed write.
const RETRY_FIRST: std::time::Duration = std::time::Duration::from_secs(1);
/// The longest wait between two writes of node states that keep failing.
const RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(30);

#[cfg(test)]
mod tests {
    use super::*;

    /// What the operator set reads back as it was written, READY nodes left out; a line
    /// that cannot be read is named and skipped, the others kept; a file without the
    /// version line holds nothing.
    #[test]
    fn states_read_back_as_written_and_a_bad_line_is_skipped() {
        let states = vec![
            ("a".to_owned(), AdminState::Ready),
            ("b".to_owned(), AdminState::Maint),
            (
                "c".to_owned(),
                AdminState::Drain {
                    deadline_ms: Some(1_800_000_000_000),
                    spread_ms: 60_000,
                },
            ),
            (
                "d".to_owned(),
                AdminState::Drain {
                    deadline_ms: None,
                    spread_ms: 0,
                },
            ),
        ];
        let text = encode(&states);
        assert_eq!(
            text,
            "limpet-node-states 1\nmaint b\ndrain c 1800000000000 60000\ndrain d - 0\n"
        );
        let (read, refused) = decode(&text);
        assert_eq!(read, states[1..]);
        assert!(refused.is_empty());

        let (read, refused) = decode(&format!("{text}drain e soon 0\nup f\n\nmaint g\n"));
        assert_eq!(read.len(), 4);
        assert_eq!(read[3], ("g".to_owned(), AdminState::Maint));
        assert_eq!(refused.len(), 2, "{refused:?}");
        assert!(refused[0].starts_with("line 5:"), "{refused:?}");
        assert!(refused[1].starts_with("line 6:"), "{refused:?}");

        let (read, refused) = decode("maint b\n");
        assert!(read.is_empty());
        assert_eq!(refused.len(), 1);
    }

    /// A drain deadline crosses a restart on the wall clock, whatever this process's clock
    /// reads: here it reads two hours ahead of the wall clock (as after the wall clock was
    /// stepped back two hours while limpet ran). A deadline ten minutes off is written as
    /// ten minutes past the wall clock (which a limpet started now anchors to; on this
    /// process's clock, it would hold the drain two hours more), and a file that says ten
    /// minutes past the wall clock is read as ten minutes past this one (read as it is, the
    /// deadline would be two hours past, the drain cut at once).
    #[tokio::test(start_paused = true)]
    async fn drain_deadlines_cross_a_restart_on_the_wall_clock() {
        const TEN_MIN: u64 = 600_000;
        let text = "[[nodes]]\nname = \"a\"\naddress = \"127.0.0.2\"\n\n\
                    [[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = 9\n";
        let config =
            crate::config::Config::from_text(std::path::Path::new("t.toml"), text).expect("config");
        let state = State::new(config).expect("state");
        crate::test_util::clock_ahead_of_wall(std::time::Duration::from_secs(2 * 3600)).await;
        let drain = |deadline| AdminState::Drain {
            deadline_ms: Some(deadline),
            spread_ms: 0,
        };
        let deadline = |state: &State| match state.node_admin_states().as_slice() {
            [(
                _,
                AdminState::Drain {
                    deadline_ms: Some(d),
                    ..
                },
            )] => *d,
            other => panic!("{other:?}"),
        };
        let near = |a: u64, b: u64| a.abs_diff(b) < 60_000;

        state.set_admin("a", drain(crate::clock::now_ms() + TEN_MIN));
        let (written, _) = decode(&file_text(&state));
        let wall = crate::test_util::wall_ms();
        match written.as_slice() {
            [(
                _,
                AdminState::Drain {
                    deadline_ms: Some(d),
                    ..
                },
            )] => assert!(near(*d, wall + TEN_MIN), "{d} against {wall}"),
            other => panic!("{other:?}"),
        }

        let dir = std::env::temp_dir().join(format!("limpet-states-wall-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("states");
        std::fs::write(&path, encode(&[("a".to_owned(), drain(wall + TEN_MIN))])).expect("write");
        state.set_admin("a", AdminState::Ready);
        load(&state, &path).await;
        let now = crate::clock::now_ms();
        assert!(
            near(deadline(&state), now + TEN_MIN),
            "{} against {now}",
            deadline(&state)
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
