//! `limpet sim`: the cookie-stickiness line protocol of `sticky-cookie-rules.md`.
//!
//! [`Sim`] is the protocol engine and does no I/O: [`Sim::feed`] takes the bytes read so far,
//! answers the commands that are complete (until its answers fill a budget: the caller writes
//! them and feeds the rest again), and says how many bytes it consumed; the caller keeps the
//! rest for the next read. [`run`] is the thin loop around it: read stdin, feed, write the
//! answers and flush before blocking on the next read, so the sim works in a pipe and
//! interactively alike.
//!
//! Every decision comes from `limpet_core`: the head is cut with `head::head_end`, the cookie
//! found with `head::cookie_in_head`, the node chosen by `limpet_core::route` (through
//! `Pool::decide`, which holds the sim's node statuses and rotation), the `Set-Cookie` written by
//! `CookieSpec`. The proxy routes through the same `route`.
//!
//! Memory stays bounded whatever the input: a command line longer than `max_line` or a head
//! longer than `max_head` is skipped as it streams by and answered with one `ERR` line.

use std::io::{self, Read, Write};
use std::process::ExitCode;

use limpet_core::head::{cookie_in_head, head_end, HeadEnd};
use limpet_core::{CookieSpec, Decision, Pool};

/// Arguments of `limpet sim`.
#[derive(Debug, clap::Args)]
pub struct SimArgs {
    /// Longest command line accepted, in bytes.
    #[arg(long, default_value_t = 64 * 1024)]
    max_line: usize,
    /// Longest request head accepted, in bytes (the proxy's default header limit).
    #[arg(long, default_value_t = 64 * 1024)]
    max_head: usize,
}

/// Limits that keep the engine's memory bounded.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_line: usize,
    pub max_head: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_line: 64 * 1024,
            max_head: 64 * 1024,
        }
    }
}

/// Where the engine is in the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Expecting a command line.
    Command,
    /// Inside a REQUEST head; the scan for its end resumes at `scan` (relative to the input).
    /// `refused`: the answer for the whole request when its `REQUEST` line was refused (with
    /// arguments, or too long): its head is read all the same, to stay in step.
    Head {
        scan: usize,
        refused: Option<&'static [u8]>,
    },
    /// Discarding an over-long command line up to its newline; `word`: whether it is a
    /// `REQUEST` (whose head follows it and is read, and refused, with it), as far as its
    /// bytes so far tell.
    SkipLine { word: FirstWord },
    /// Discarding an over-long head up to the empty line that ends it.
    SkipHead { line: LineSoFar },
}

/// What the current line held so far while skipping: an empty line ends a head, and a line
/// holding only `\r` is empty too (CRLF).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LineSoFar {
    Nothing,
    Cr,
    Text,
}

impl LineSoFar {
    fn then(self, seg: &[u8]) -> Self {
        match (self, seg) {
            (s, []) => s,
            (LineSoFar::Nothing, b"\r") => LineSoFar::Cr,
            _ => LineSoFar::Text,
        }
    }
}

/// The protocol engine. See the module docs.
#[derive(Debug)]
pub struct Sim {
    pool: Pool,
    cookie: CookieSpec,
    limits: Limits,
    state: State,
    /// Answers per node, written once per `POOL`: `"<b> sticky\n"` and
    /// `"<b> new Set-Cookie: ...\n"`, so answering a request is a copy.
    sticky_lines: Vec<Box<[u8]>>,
    fresh_lines: Vec<Box<[u8]>>,
}

impl Sim {
    pub fn new(limits: Limits) -> Self {
        let mut sim = Sim {
            pool: Pool::new(Vec::<Box<str>>::new()).unwrap_or_else(|_| unreachable!()),
            cookie: CookieSpec::sim(),
            limits,
            state: State::Command,
            sticky_lines: Vec::new(),
            fresh_lines: Vec::new(),
        };
        sim.rebuild_lines();
        sim
    }

    fn rebuild_lines(&mut self) {
        let (sticky, fresh) = self
            .pool
            .nodes()
            .map(|(_, n)| {
                let sticky = format!("{} sticky\n", n.name());
                let fresh = format!(
                    "{} new Set-Cookie: {}\n",
                    n.name(),
                    self.cookie.set_cookie(n.name(), false)
                );
                (sticky.into_bytes().into(), fresh.into_bytes().into())
            })
            .unzip();
        self.sticky_lines = sticky;
        self.fresh_lines = fresh;
    }

    /// Answers the complete commands in `input`, appending one line per command to `out`,
    /// until `out` holds `OUT_BUDGET` bytes or more (so that one read of thousands of
    /// requests naming long nodes does not gather their answers in memory). Returns how many
    /// bytes of `input` were consumed; the caller writes `out` and passes the rest again (with
    /// more bytes after it, once nothing more is consumed).
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> usize {
        let mut pos = 0;
        loop {
            let rest = &input[pos..];
            match self.state {
                State::Command => {
                    // A line's length leaves out its ending, `\n` or `\r\n`: a line refused
                    // with one ending is refused with the other. A `\r` last in what came so
                    // far may be the start of that ending.
                    let Some(nl) = memchr::memchr(b'\n', rest) else {
                        if without_cr(rest).len() > self.limits.max_line {
                            self.state = State::SkipLine {
                                word: FirstWord::Leading.then(rest),
                            };
                            pos = input.len();
                        }
                        return pos;
                    };
                    pos += nl + 1;
                    // The limit holds however reads split the input: a long line that arrived
                    // whole is refused like one that arrived in pieces.
                    if without_cr(&rest[..nl]).len() > self.limits.max_line {
                        if FirstWord::Leading.then(&rest[..nl]).is_request() {
                            self.state = State::Head {
                                scan: 0,
                                refused: Some(LINE_TOO_LONG),
                            };
                        } else {
                            out.extend_from_slice(LINE_TOO_LONG);
                        }
                    } else {
                        self.command(&rest[..nl], out);
                    }
                    if out.len() >= OUT_BUDGET {
                        return pos;
                    }
                }
                State::Head { scan, refused } => match head_end(rest, scan) {
                    HeadEnd::Complete { head, consumed } => {
                        pos += consumed;
                        self.state = State::Command;
                        // The head's size first, as when the head arrives in pieces (it is
                        // then skipped as too large before its end is seen). Counted with the
                        // empty line that ends it, as the proxy counts a head against its
                        // buffer: a head the proxy answers 431 is refused here too.
                        if consumed > self.limits.max_head {
                            out.extend_from_slice(b"ERR request head too large\n");
                        } else if let Some(why) = refused {
                            out.extend_from_slice(why);
                        } else {
                            self.request(&rest[..head], out);
                        }
                        if out.len() >= OUT_BUDGET {
                            return pos;
                        }
                    }
                    HeadEnd::Incomplete { resume_at } => {
                        // Every byte seen so far belongs to the head (its empty line
                        // included): the lower bound on the head's final size.
                        if rest.len() > self.limits.max_head {
                            // The lines before resume_at were scanned and are not empty, so
                            // only the partial line after them decides what comes next.
                            let line = LineSoFar::Nothing.then(&rest[resume_at..]);
                            self.state = State::SkipHead { line };
                            return input.len();
                        }
                        self.state = State::Head {
                            scan: resume_at,
                            refused,
                        };
                        return pos;
                    }
                },
                State::SkipLine { word } => match memchr::memchr(b'\n', rest) {
                    Some(nl) => {
                        pos += nl + 1;
                        if word.then(&rest[..nl]).is_request() {
                            self.state = State::Head {
                                scan: 0,
                                refused: Some(LINE_TOO_LONG),
                            };
                        } else {
                            self.state = State::Command;
                            out.extend_from_slice(LINE_TOO_LONG);
                            if out.len() >= OUT_BUDGET {
                                return pos;
                            }
                        }
                    }
                    None => {
                        self.state = State::SkipLine {
                            word: word.then(rest),
                        };
                        return input.len();
                    }
                },
                State::SkipHead { mut line } => {
                    let mut at = 0;
                    let ended = loop {
                        match memchr::memchr(b'\n', &rest[at..]) {
                            Some(nl) => {
                                let done = line.then(&rest[at..at + nl]) != LineSoFar::Text;
                                at += nl + 1;
                                if done {
                                    break true;
                                }
                                line = LineSoFar::Nothing;
                            }
                            None => {
                                line = line.then(&rest[at..]);
                                break false;
                            }
                        }
                    };
                    if !ended {
                        self.state = State::SkipHead { line };
                        return input.len();
                    }
                    pos += at;
                    self.state = State::Command;
                    out.extend_from_slice(b"ERR request head too large\n");
                }
            }
        }
    }

    /// End of input: answers what is left (a last line without a newline, a cut-off head).
    pub fn finish(&mut self, rest: &[u8], out: &mut Vec<u8>) {
        match std::mem::replace(&mut self.state, State::Command) {
            State::Command if without_cr(rest).len() > self.limits.max_line => {
                out.extend_from_slice(LINE_TOO_LONG);
            }
            State::Command if !rest.is_empty() => {
                self.command(rest, out);
                // A last `REQUEST` line starts a head that never comes.
                if matches!(self.state, State::Head { .. }) {
                    out.extend_from_slice(b"ERR request cut off by end of input\n");
                }
            }
            State::Command => {}
            State::Head { .. } => out.extend_from_slice(b"ERR request cut off by end of input\n"),
            State::SkipLine { .. } => out.extend_from_slice(LINE_TOO_LONG),
            State::SkipHead { .. } => out.extend_from_slice(b"ERR request head too large\n"),
        }
    }

    fn command(&mut self, line: &[u8], out: &mut Vec<u8>) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let mut words = line
            .split(u8::is_ascii_whitespace)
            .filter(|w| !w.is_empty());
        let Some(verb) = words.next() else {
            return; // blank line between commands
        };
        match verb {
            b"REQUEST" => {
                self.state = State::Head {
                    scan: 0,
                    refused: words
                        .next()
                        .is_some()
                        .then_some(b"ERR REQUEST takes no arguments\n".as_slice()),
                };
            }
            b"POOL" => match std::str::from_utf8(line) {
                Err(_) => err(out, "POOL line is not valid UTF-8"),
                Ok(text) => match Pool::new(text.split_ascii_whitespace().skip(1)) {
                    Ok(pool) => {
                        self.pool = pool;
                        self.rebuild_lines();
                        out.extend_from_slice(b"OK\n");
                    }
                    Err(e) => err(out, &e.to_string()),
                },
            },
            b"UP" | b"DOWN" => {
                let (Some(name), None) = (words.next(), words.next()) else {
                    return err(out, "UP and DOWN take exactly one backend name");
                };
                if let Some(id) = self.pool.lookup(name) {
                    self.pool.force_health(id, verb == b"UP");
                }
                out.extend_from_slice(b"OK\n");
            }
            other => {
                let shown = String::from_utf8_lossy(&other[..other.len().min(32)]);
                err(out, &format!("unknown command {shown:?}"));
            }
        }
    }

    fn request(&mut self, head: &[u8], out: &mut Vec<u8>) {
        if head.is_empty() {
            return err(out, "empty request head");
        }
        let pin = self
            .pool
            .pin_by_name(cookie_in_head(head, self.cookie.name.as_bytes()));
        match self.pool.decide(pin, 0) {
            Decision::Sticky(n) => out.extend_from_slice(&self.sticky_lines[n.index()]),
            Decision::Fresh { node, .. } => out.extend_from_slice(&self.fresh_lines[node.index()]),
            Decision::Unavailable => out.extend_from_slice(b"NONE\n"),
        }
    }
}

fn err(out: &mut Vec<u8>, reason: &str) {
    out.extend_from_slice(b"ERR ");
    // One answer is one line, whatever the reason quotes.
    out.extend(
        reason
            .bytes()
            .map(|b| if b == b'\n' || b == b'\r' { b' ' } else { b }),
    );
    out.push(b'\n');
}

/// Runs the protocol on stdin/stdout until end of input.
pub fn run(args: SimArgs) -> ExitCode {
    let limits = Limits {
        max_line: args.max_line,
        max_head: args.max_head,
    };
    match pump(Sim::new(limits), io::stdin().lock(), io::stdout().lock()) {
        Ok(()) => ExitCode::SUCCESS,
        // A closed stdout (e.g. `limpet sim | head`) ends the run quietly, like other filters.
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("limpet sim: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The I/O loop: read, feed, write, flush before the next read blocks.
pub fn pump(mut sim: Sim, mut input: impl Read, mut output: impl Write) -> io::Result<()> {
    const CHUNK: usize = 64 * 1024;
    let mut buf: Vec<u8> = Vec::with_capacity(2 * CHUNK);
    let mut out: Vec<u8> = Vec::with_capacity(CHUNK);
    loop {
        let filled = buf.len();
        buf.resize(filled + CHUNK, 0);
        let n = match input.read(&mut buf[filled..]) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                buf.truncate(filled);
                continue;
            }
            Err(e) => return Err(e),
        };
        buf.truncate(filled + n);
        if n == 0 {
            sim.finish(&buf, &mut out);
            output.write_all(&out)?;
            return output.flush();
        }
        // `feed` returns once its output reaches `OUT_BUDGET`: written, then fed again with
        // the rest, until it wants more input.
        loop {
            let consumed = sim.feed(&buf, &mut out);
            buf.drain(..consumed);
            let more = out.len() >= OUT_BUDGET;
            output.write_all(&out)?;
            out.clear();
            if !more {
                break;
            }
        }
        output.flush()?;
    }
}

/// The answer to a command line over `--max-line`.
const LINE_TOO_LONG: &[u8] = b"ERR command line too long\n";

/// How much output [`Sim::feed`] gathers before it returns for it to be written: each answer
/// may be as long as two node names, and one read holds thousands of commands.
const OUT_BUDGET: usize = 64 * 1024;

/// How far a command line's first word, read as its bytes come, is `REQUEST`. A `REQUEST`
/// line refused for its length still has a head after it, which is read with it, or the
/// head's lines would be taken for commands; an over-long line is judged as it streams by,
/// so the word may be cut between two reads (or come after white space longer than a read).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FirstWord {
    /// White space only so far.
    Leading,
    /// The word so far is the first `n` bytes of `REQUEST`.
    Matching(u8),
    /// The word is `REQUEST`, and ended.
    Request,
    /// The word is another, or the line has none.
    Other,
}

impl FirstWord {
    const WORD: &'static [u8] = b"REQUEST";

    /// After `bytes`, the next ones of the line.
    fn then(mut self, bytes: &[u8]) -> FirstWord {
        for &b in bytes {
            self = match self {
                FirstWord::Leading if b.is_ascii_whitespace() => FirstWord::Leading,
                FirstWord::Leading if b == Self::WORD[0] => FirstWord::Matching(1),
                FirstWord::Matching(n) if usize::from(n) == Self::WORD.len() => {
                    if b.is_ascii_whitespace() {
                        FirstWord::Request
                    } else {
                        FirstWord::Other
                    }
                }
                FirstWord::Matching(n) if Self::WORD.get(usize::from(n)) == Some(&b) => {
                    FirstWord::Matching(n + 1)
                }
                FirstWord::Request => return FirstWord::Request,
                _ => return FirstWord::Other,
            };
        }
        self
    }

    /// At the end of the line: whether its first word is `REQUEST`.
    fn is_request(self) -> bool {
        match self {
            FirstWord::Request => true,
            FirstWord::Matching(n) => usize::from(n) == Self::WORD.len(),
            FirstWord::Leading | FirstWord::Other => false,
        }
    }
}

/// A line without the `\r` of a CRLF ending.
fn without_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_str(input: &[u8]) -> String {
        let mut out = Vec::new();
        pump(Sim::new(Limits::default()), input, &mut out).unwrap_or_else(|e| panic!("{e}"));
        String::from_utf8(out).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Feeds the input one byte at a time: answers must not depend on how reads split it.
    fn run_bytewise(input: &[u8], limits: Limits) -> String {
        let mut sim = Sim::new(limits);
        let mut buf = Vec::new();
        let mut out = Vec::new();
        for &b in input {
            buf.push(b);
            let consumed = sim.feed(&buf, &mut out);
            buf.drain(..consumed);
        }
        sim.finish(&buf, &mut out);
        String::from_utf8(out).unwrap_or_else(|e| panic!("{e}"))
    }

    /// A `REQUEST` line over `--max-line` (trailing white space) is refused once, with its
    /// head: the head's lines are not taken for commands. Before, `DOWN b1` inside the head
    /// ran, `Host: x` was an unknown command, and the next request found no node UP.
    #[test]
    fn an_over_long_request_line_is_refused_with_its_head() {
        let input =
            b"POOL b1\nREQUEST                 \nDOWN b1\nHost: x\n\nREQUEST\nGET / HTTP/1.1\n\n";
        let limits = Limits {
            max_line: 16,
            max_head: 1024,
        };
        let want = "OK\nERR command line too long\nb1 new Set-Cookie: route=b1; Path=/; HttpOnly\n";
        assert_eq!(run_bytewise(input, limits), want);
        let mut sim = Sim::new(limits);
        let mut out = Vec::new();
        let consumed = sim.feed(input, &mut out);
        assert_eq!(consumed, input.len());
        assert_eq!(String::from_utf8_lossy(&out), want);
        // An over-long line of another command is one line.
        let other = b"POOL b1\nDOWN b1                 \nREQUEST\nGET / HTTP/1.1\n\n";
        assert_eq!(
            run_bytewise(other, limits),
            "OK\nERR command line too long\nb1 new Set-Cookie: route=b1; Path=/; HttpOnly\n"
        );
    }

    /// One read of thousands of requests naming a long node: `feed` returns once its output
    /// reaches its budget, and the pump writes it before feeding the rest. Before, every
    /// answer of the read was gathered first (about 120 MB here, the square of the name's
    /// length in general).
    #[test]
    fn the_answers_to_one_read_are_written_as_they_come() {
        let mut input = format!("POOL {}\n", "n".repeat(60_000)).into_bytes();
        for _ in 0..1000 {
            input.extend_from_slice(b"REQUEST\nG\n\n");
        }
        let mut sim = Sim::new(Limits::default());
        let mut out = Vec::new();
        let mut fed = 0;
        let mut answers = 0;
        while fed < input.len() {
            let consumed = sim.feed(&input[fed..], &mut out);
            assert!(consumed > 0, "nothing consumed at {fed}");
            assert!(out.len() < 4 << 20, "{} bytes of answers held", out.len());
            fed += consumed;
            answers += out.iter().filter(|&&b| b == b'\n').count();
            out.clear();
        }
        assert_eq!(answers, 1001);
        let mut written = Vec::new();
        pump(Sim::new(Limits::default()), &input[..], &mut written)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(written.iter().filter(|&&b| b == b'\n').count(), 1001);
    }

    const REFERENCE: &str = "POOL b1 b2 b3\nREQUEST\nGET /cart HTTP/1.1\nHost: shop.example\n\n\
REQUEST\nGET /cart HTTP/1.1\nCookie: theme=dark; route=b1; lang=en\n\nDOWN b1\n\
REQUEST\nGET /cart HTTP/1.1\nCookie: route=b1\n\n";

    const REFERENCE_ANSWERS: &str =
        "OK\nb1 new Set-Cookie: route=b1; Path=/; HttpOnly\nb1 sticky\n\
OK\nb3 new Set-Cookie: route=b3; Path=/; HttpOnly\n";

    #[test]
    fn reference_example_in_one_read_and_byte_by_byte() {
        assert_eq!(run_str(REFERENCE.as_bytes()), REFERENCE_ANSWERS);
        assert_eq!(
            run_bytewise(REFERENCE.as_bytes(), Limits::default()),
            REFERENCE_ANSWERS
        );
    }

    #[test]
    fn crlf_input_gives_the_same_answers() {
        let crlf = REFERENCE.replace('\n', "\r\n");
        assert_eq!(run_str(crlf.as_bytes()), REFERENCE_ANSWERS);
        assert_eq!(
            run_bytewise(crlf.as_bytes(), Limits::default()),
            REFERENCE_ANSWERS
        );
    }

    /// `--max-line` counts a command line without its ending: the longest line allowed is
    /// allowed with LF and with CRLF, one byte more is refused with either, however the
    /// input is split.
    #[test]
    fn the_line_limit_is_the_same_with_lf_and_crlf_endings() {
        let limits = Limits {
            max_line: 10,
            max_head: 64,
        };
        // Each line ending, and the last line cut by the end of input with a `\r` of its
        // ending or with none: the same answers.
        for (ending, last) in [("\n", "\n"), ("\r\n", "\r\n"), ("\r\n", "\r"), ("\n", "")] {
            let input =
                format!("POOL b1 b2{ending}POOL b1 b22{ending}UP b1{ending}POOL b1 b2{last}");
            let want = "OK\nERR command line too long\nOK\nOK\n";
            assert_eq!(
                run_bytewise(input.as_bytes(), limits),
                want,
                "{ending:?} {last:?}"
            );
            let mut out = Vec::new();
            pump(Sim::new(limits), input.as_bytes(), &mut out).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(
                String::from_utf8_lossy(&out),
                want,
                "{ending:?} {last:?}, one read"
            );
        }
    }

    #[test]
    fn over_long_head_is_skipped_in_bounded_memory() {
        let limits = Limits {
            max_line: 64,
            max_head: 64,
        };
        let big = format!(
            "POOL a\nREQUEST\nGET / HTTP/1.1\nX: {}\r\n\r\nUP a\n",
            "y".repeat(500)
        );
        assert_eq!(
            run_bytewise(big.as_bytes(), limits),
            "OK\nERR request head too large\nOK\n"
        );
        let long_cmd = format!("{}\nUP a\n", "P".repeat(500));
        assert_eq!(
            run_bytewise(long_cmd.as_bytes(), limits),
            "ERR command line too long\nOK\n"
        );
    }

    /// Feeds `buf` as the pump does: again after each budget of answers, until nothing more
    /// is consumed; what is left waits for more input.
    fn feed_all(sim: &mut Sim, buf: &mut Vec<u8>, out: &mut Vec<u8>) {
        loop {
            let used = sim.feed(buf, out);
            buf.drain(..used);
            if used == 0 {
                return;
            }
        }
    }

    /// A `REQUEST` with arguments and a head over the limit is answered the same whether its
    /// head arrives whole or in pieces (the size first); a `REQUEST` line over the limit whose
    /// word comes after more white space than one read holds is still read with its head.
    #[test]
    fn refused_requests_answer_alike_however_reads_split_them() {
        let limits = Limits {
            max_line: 16,
            max_head: 64,
        };
        let big = format!(
            "POOL a\nREQUEST x\nGET / HTTP/1.1\nX: {}\n\nUP a\n",
            "y".repeat(500)
        );
        let mut out = Vec::new();
        pump(Sim::new(limits), big.as_bytes(), &mut out).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            String::from_utf8_lossy(&out),
            "OK\nERR request head too large\nOK\n"
        );
        assert_eq!(
            run_bytewise(big.as_bytes(), limits),
            "OK\nERR request head too large\nOK\n"
        );
        let spaced = format!(
            "POOL b1\n{}REQUEST\nDOWN b1\n\nREQUEST\nG\n\n",
            " ".repeat(14)
        );
        let want = "OK\nERR command line too long\nb1 new Set-Cookie: route=b1; Path=/; HttpOnly\n";
        assert_eq!(run_bytewise(spaced.as_bytes(), limits), want);
        let mut out = Vec::new();
        pump(Sim::new(limits), spaced.as_bytes(), &mut out).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(String::from_utf8_lossy(&out), want);
        // `REQUESTX` is another word.
        let x = format!("POOL b1\nREQUESTX{}\nUP b1\n", " ".repeat(20));
        assert_eq!(
            run_bytewise(x.as_bytes(), limits),
            "OK\nERR command line too long\nOK\n"
        );
    }

    proptest::proptest! {
        /// However reads split the input, the answers are the same as for one read.
        #[test]
        fn answers_do_not_depend_on_read_boundaries(
            cuts in proptest::collection::vec(0usize..400, 0..12),
            max in 16usize..200,
        ) {
            let input = format!("{REFERENCE}POOL a b\r\nREQUEST\nGET / HTTP/1.1\nX: {}\n\n\nFOO\nREQUEST\nGET / HTTP/1.1\r\nCookie: route=b\r\n\r\n{}\nUP a\nREQUEST x\nGET / HTTP/1.1\nX: {}\n\n{}REQUEST\nDOWN a\n\nREQUEST\nGET /", "z".repeat(150), "Q".repeat(150), "w".repeat(150), " ".repeat(150));
            let limits = Limits { max_line: max, max_head: max };
            let whole = {
                let mut sim = Sim::new(limits);
                let mut out = Vec::new();
                let mut buf = input.as_bytes().to_vec();
                feed_all(&mut sim, &mut buf, &mut out);
                sim.finish(&buf, &mut out);
                out
            };
            let mut cuts = cuts;
            cuts.push(input.len());
            cuts.sort_unstable();
            let mut sim = Sim::new(limits);
            let mut buf = Vec::new();
            let mut out = Vec::new();
            let mut from = 0;
            for cut in cuts {
                let cut = cut.min(input.len()).max(from);
                buf.extend_from_slice(&input.as_bytes()[from..cut]);
                from = cut;
                feed_all(&mut sim, &mut buf, &mut out);
            }
            sim.finish(&buf, &mut out);
            proptest::prop_assert_eq!(String::from_utf8_lossy(&out), String::from_utf8_lossy(&whole));
        }
    }

    #[test]
    fn last_line_without_newline_is_answered() {
        assert_eq!(run_str(b"POOL a\nUP a"), "OK\nOK\n");
    }
}
