//! # Where log lines go: stderr, from a thread of their own
//!
//! Every log line (the access log's one per request, a health transition, a rate-limited
//! warning) is handed to a bounded queue and written to stderr by one writer thread
//! (`tracing-appender`'s non-blocking writer). A line is never written from a thread that
//! serves traffic, so a log reader that stops reading (a pipe to a hung process, a full disk
//! behind journald) cannot stop the data plane: written in place, one blocked `write(2)`
//! held stderr's lock and every thread that logged next waited behind it.
//!
//! When the queue is full the line is dropped and counted
//! (`limpet_log_lines_dropped_total`), as HAProxy drops and counts log lines its syslog
//! ring cannot take (`DroppedLogs`). At exit, the lines still queued are flushed for at most
//! about a second.
//!
//! ```text
//!  any thread ──► tracing ──► fmt layer ──► queue (LINES) ──► writer thread ──► stderr
//!                                              └─ full: dropped, counted
//! ```

use std::io::Write;
use std::sync::OnceLock;

use tracing_appender::non_blocking::{ErrorCounter, NonBlocking, NonBlockingBuilder, WorkerGuard};

/// What is logged without `RUST_LOG`: limpet's own lines from `info` up; the protocol
/// libraries' only from `error`. Their warnings are about what a client sent (an HTTP/2 PING
/// ACK nobody asked for, a malformed SNI), one line per frame or handshake at the client's
/// pace: a client could fill a disk with them. limpet answers such input itself, and says
/// what matters about it at its own levels.
pub const DEFAULT_FILTER: &str = "info,h2=error,hyper=error,rustls=error,tokio_rustls=error";

/// Lines queued for the writer at most (`tracing-appender`'s default): about a second of
/// the access log at 100,000 requests/s. What a client sends is clipped in them (a path to
/// 256 characters as written, escapes included, a method to 32), so an access line stays
/// under about 600 bytes and a full queue under about 80 MB.
pub const LINES: usize = 128_000;

/// The writer's count of dropped lines, once logging is set up.
static DROPPED: OnceLock<ErrorCounter> = OnceLock::new();

/// Log lines dropped because the queue was full (0 before logging is set up).
pub fn dropped_lines() -> u64 {
    DROPPED
        .get()
        .map_or(0, |c| u64::try_from(c.dropped_lines()).unwrap_or(u64::MAX))
}

/// Sets up logging to stderr through the writer thread; `RUST_LOG` filters (default
/// [`DEFAULT_FILTER`]). Keep the guard until the process ends: dropping it flushes the
/// queue (bounded) and stops the thread.
pub fn init() -> WorkerGuard {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_FILTER));
    let (writer, guard) = off_thread(std::io::stderr(), LINES);
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    guard
}

/// A writer that queues at most `lines` lines for a thread writing them to `out`, dropping
/// and counting ([`dropped_lines`]) what does not fit.
fn off_thread<W: Write + Send + 'static>(out: W, lines: usize) -> (NonBlocking, WorkerGuard) {
    let (writer, guard) = NonBlockingBuilder::default()
        .lossy(true)
        .buffered_lines_limit(lines)
        .thread_name("limpet-log")
        .finish(out);
    // The first setup's counter: a process sets up logging once (a second setup, in tests,
    // counts into its own).
    let _ = DROPPED.set(writer.error_counter());
    (writer, guard)
}

/// The pieces of the access log's lines (target `limpet::access`: one per HTTP request,
/// written when its answer ends, `proxy::forward`; one per TCP session, written when it
/// ends, `tcp`): values written as they are, with `-` for none.
pub(crate) mod access {
    use std::fmt;
    use std::time::Duration;

    use limpet_core::Outcome;

    /// Whether the access log is on.
    pub(crate) fn on() -> bool {
        tracing::enabled!(target: "limpet::access", tracing::Level::INFO)
    }

    /// A value, or `-` for none.
    pub(crate) struct Or<T>(pub Option<T>);

    impl<T: fmt::Display> fmt::Display for Or<T> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            match &self.0 {
                Some(v) => v.fmt(f),
                None => f.write_str("-"),
            }
        }
    }

    /// A request's method, at most [`METHOD_CHARS`] characters and `...`: an extension
    /// method is any token the client sends, up to the whole head (64 KiB), and the log's
    /// queue counts lines, not bytes (a stalled log reader would hold gigabytes of them).
    pub(crate) struct Method<'a>(pub &'a http::Method);

    /// The longest method written whole (the longest registered, `VERSION-CONTROL` and
    /// `BASELINE-CONTROL`, have 16 characters).
    pub(crate) const METHOD_CHARS: usize = 32;

    impl fmt::Display for Method<'_> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            let m = self.0.as_str();
            match m.char_indices().nth(METHOD_CHARS) {
                None => f.write_str(m),
                Some((i, _)) => {
                    f.write_str(&m[..i])?;
                    f.write_str("...")
                }
            }
        }
    }

    /// The longest path an access line writes, in characters as written: an escape counts
    /// its own length ([`push_escaped`]), so a path of escapes makes no longer a line than a
    /// path of plain characters.
    pub(crate) const PATH_CHARS: usize = 256;

    /// Whether `c` is written escaped in an access line: every control character (C0, DEL
    /// and C1, among them U+0085 NEL and the 8-bit CSI U+009B), the line and paragraph
    /// separators U+2028 and U+2029, and the backslash that starts an escape (so that a
    /// path holding the text `\u{85}` reads apart from one holding the character).
    /// tracing's formatter escapes only the `message` field; a client's path goes out as it
    /// came, and a log reader splitting lines by Unicode's rules (U+0085, U+2028) would read
    /// whatever follows as a record of its own: a forged access line.
    fn needs_escape(c: char) -> bool {
        c.is_control() || matches!(c, '\\' | '\u{2028}' | '\u{2029}')
    }

    /// Appends `s` to `out` as a log value, at most `max` characters as written: what
    /// [`needs_escape`] says as `\u{85}` (Rust's escape, the hex of the code point) and a
    /// backslash as `\\`; any other character, ASCII or not, as it is. An escape that
    /// does not fit whole is left out with the rest. No allocation of its own: a path with
    /// nothing to escape in its first `max` bytes (all printable ASCII, the common case,
    /// told apart with one pass over them) is copied at once.
    pub(crate) fn push_escaped(out: &mut String, s: &str, max: usize) {
        let head = &s.as_bytes()[..s.len().min(max)];
        if head.iter().all(|&b| matches!(b, 0x20..=0x7e) && b != b'\\') {
            // ASCII: a character is a byte, and `head` ends on a character's boundary.
            out.push_str(&s[..head.len()]);
            return;
        }
        let mut left = max;
        // The start of the characters kept as they are, not yet copied.
        let mut plain = 0;
        for (i, c) in s.char_indices() {
            if left == 0 {
                out.push_str(&s[plain..i]);
                return;
            }
            if !needs_escape(c) {
                left -= 1;
                continue;
            }
            out.push_str(&s[plain..i]);
            plain = i + c.len_utf8();
            let before = out.len();
            if c == '\\' {
                out.push_str("\\\\");
            } else {
                use std::fmt::Write as _;
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
            // Escapes are ASCII: their length in bytes is their length in characters.
            let n = out.len() - before;
            if n > left {
                out.truncate(before);
                return;
            }
            left -= n;
        }
        out.push_str(&s[plain..]);
    }

    /// Milliseconds, to the microsecond (integer arithmetic: a float's formatting costs
    /// more).
    pub(crate) struct Ms(pub Duration);

    impl fmt::Display for Ms {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            let us = self.0.as_micros();
            write!(f, "{}.{:03}", us / 1000, us % 1000)
        }
    }

    /// The pin outcome: the core's outcome, with the reason of a re-pin, and `round-robin`
    /// on a listener with no affinity at all (`affinity`: it has some); `-` before any route.
    #[derive(Debug, Clone, Copy)]
    pub(crate) struct PinText(pub Option<Outcome>, pub bool);

    impl fmt::Display for PinText {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            match self.0 {
                Some(Outcome::Repin(r)) => write!(f, "re-pinned({})", r.as_str()),
                Some(Outcome::Fresh) if !self.1 => f.write_str("round-robin"),
                Some(o) => f.write_str(o.as_str()),
                None => f.write_str("-"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// A sink that blocks every write until the test lets it go: a log reader that stopped.
    struct Stalled(mpsc::Receiver<()>);

    impl Write for Stalled {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let _ = self.0.recv();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Writes to a stalled sink return at once; past the queue's size the lines are dropped
    /// and counted, not waited for.
    #[test]
    fn a_stalled_log_reader_drops_and_counts_lines_and_blocks_no_writer() {
        let (go, stalled) = mpsc::channel();
        let (mut writer, guard) = off_thread(Stalled(stalled), 4);
        let started = std::time::Instant::now();
        for i in 0..100 {
            writer
                .write_all(format!("line {i}\n").as_bytes())
                .unwrap_or_else(|e| panic!("{e}"));
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "writes waited for the sink"
        );
        // The writer thread holds one line in its blocked write, the queue 4: the rest are
        // dropped.
        let dropped = writer.error_counter().dropped_lines();
        assert!((95..=96).contains(&dropped), "{dropped}");
        drop(go);
        drop(guard);
    }

    /// A path's control characters, line separators and backslashes are escaped, other
    /// characters kept; the clip counts characters as written, and an escape that does not
    /// fit is left out whole, not cut into something that reads as another escape.
    #[test]
    fn access_values_escape_line_breaks_and_clip_as_written() {
        let esc = |s: &str, max: usize| {
            let mut out = String::from("<");
            access::push_escaped(&mut out, s, max);
            out
        };
        assert_eq!(esc("/plain/path", 256), "</plain/path");
        assert_eq!(esc("/plain/path", 3), "</pl");
        assert_eq!(esc("/caf\u{e9}/\u{65e5}", 256), "</caf\u{e9}/\u{65e5}");
        assert_eq!(
            esc("/x\u{85}a\u{2028}b\u{2029}c\u{9b}d\u{7f}e\\f", 256),
            r"</x\u{85}a\u{2028}b\u{2029}c\u{9b}d\u{7f}e\\f"
        );
        // `/x` (2) and `\u{85}` (6) fit in 8; in 7 the escape is left out.
        assert_eq!(esc("/x\u{85}yz", 8), r"</x\u{85}");
        assert_eq!(esc("/x\u{85}yz", 7), "</x");
        assert_eq!(esc("\u{e9}\u{e9}\u{e9}", 2), "<\u{e9}\u{e9}");
        // Past the clip, nothing more is looked at: a long plain head is copied at once.
        let long = format!("/{}\u{85}", "a".repeat(300));
        assert_eq!(esc(&long, 256).len(), 257);
    }
}
