//! Helpers shared by the crate's unit tests.

use std::time::Duration;

/// Waits (bounded) until this process's thread named `name` sleeps: here, waiting for a
/// lock another thread holds, or blocked opening a FIFO nobody reads. Reads the thread's
/// state in `/proc` (Linux), not a sleep standing in for it.
pub(crate) fn until_asleep(name: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let asleep = |task: std::path::PathBuf| {
        std::fs::read_to_string(task.join("comm")).is_ok_and(|c| c.trim_end() == name)
            && std::fs::read_to_string(task.join("stat")).is_ok_and(|s| {
                s.rsplit_once(')')
                    .is_some_and(|(_, rest)| rest.trim_start().starts_with('S'))
            })
    };
    while !std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .flatten()
        .any(|t| asleep(t.path()))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "thread {name} never waited"
        );
        std::thread::yield_now();
    }
}
