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

/// A fleet store whose server is away (nothing listens at its port), taken for up: a re-pin is
/// queued (nothing runs the writer while the test holds the thread), and re-pin messages are
/// handed to `Store::apply` by the test. With the runtime it was started on.
pub(crate) fn offline_store() -> (tokio::runtime::Runtime, std::sync::Arc<crate::store::Store>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let metrics = crate::metrics::Metrics::new();
    let def = crate::config::StoreDef {
        url: "redis://127.0.0.1:1".into(),
        prefix: "t:".into(),
        timeout: Duration::from_millis(100),
        connect_timeout: Duration::from_millis(100),
    };
    let store = rt
        .block_on(crate::store::Store::start(
            def,
            &metrics,
            Box::new(|_, _| {}),
        ))
        .expect("store");
    store.set_up(true);
    (rt, store)
}

/// The wall clock as it reads now (ms since the Unix epoch), as a limpet started now anchors
/// its clock to it.
pub(crate) fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// On a paused tokio runtime, advances its time until this process's clock
/// ([`crate::clock::now_ms`]) reads at least `by` ahead of the wall clock: as after the wall
/// clock was stepped back by `by` while limpet ran. In steps (the clock's anchor is the
/// process's, and may have been taken on another test's runtime), bounded.
pub(crate) async fn clock_ahead_of_wall(by: Duration) {
    let by_ms = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
    for _ in 0..1000 {
        if crate::clock::now_ms().saturating_sub(wall_ms()) >= by_ms {
            return;
        }
        tokio::time::advance(by).await;
    }
    panic!("this process's clock never read {by:?} ahead of the wall clock");
}
