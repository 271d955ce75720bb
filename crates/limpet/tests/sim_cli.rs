//! `limpet sim` as a user runs it: the real binary, stdin and stdout.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

fn limpet() -> Command {
    Command::new(env!("CARGO_BIN_EXE_limpet"))
}

/// Runs `limpet sim` on `input`, returning stdout. Fails if it exits non-zero or prints on stderr.
fn sim(input: &[u8]) -> String {
    let mut child = limpet()
        .arg("sim")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn limpet sim");
    let mut stdin = child.stdin.take().expect("stdin");
    let input = input.to_vec();
    // Write from another thread: the sim answers while it reads, and a large input would fill
    // the stdout pipe before all of it is written.
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let out = child.wait_with_output().expect("wait for limpet sim");
    writer.join().expect("writer thread");
    assert!(out.status.success(), "exit status {:?}", out.status);
    assert!(
        out.stderr.is_empty(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("stdout is UTF-8")
}

fn golden(name: &str) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let input = std::fs::read(dir.join(format!("{name}.in"))).expect("golden input");
    let want = std::fs::read_to_string(dir.join(format!("{name}.out"))).expect("golden output");
    assert_eq!(sim(&input), want, "transcript {name}");
}

#[test]
fn golden_reference_example() {
    golden("reference");
}

#[test]
fn golden_cookie_rules() {
    golden("rules");
}

#[test]
fn golden_errors_then_normal_answers() {
    golden("errors");
}

/// Kills the child when the test ends, however it ends.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn answers_each_command_before_the_next_is_sent() {
    let mut child = Running(
        limpet()
            .arg("sim")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn"),
    );
    let mut stdin = child.0.stdin.take().expect("stdin");
    let stdout = child.0.stdout.take().expect("stdout");
    // Lines are read on a thread so a sim that withholds its answer fails the test at a
    // deadline instead of hanging it.
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if tx.send(line.expect("read line")).is_err() {
                break;
            }
        }
    });
    let mut ask = |cmd: &str| -> String {
        stdin.write_all(cmd.as_bytes()).expect("write");
        stdin.flush().expect("flush");
        rx.recv_timeout(Duration::from_secs(20))
            .expect("an answer while stdin is still open")
    };
    assert_eq!(ask("POOL a b\n"), "OK");
    assert_eq!(
        ask("REQUEST\nGET / HTTP/1.1\r\n\r\n"),
        "a new Set-Cookie: route=a; Path=/; HttpOnly"
    );
    assert_eq!(
        ask("REQUEST\nGET / HTTP/1.1\nCookie: route=a\n\n"),
        "a sticky"
    );
    assert_eq!(ask("DOWN a\n"), "OK");
    assert_eq!(
        ask("REQUEST\nGET / HTTP/1.1\nCookie: route=a\n\n"),
        "b new Set-Cookie: route=b; Path=/; HttpOnly"
    );
}

const AFTER: &str = "UP x\n";

#[test]
fn bad_input_gets_err_and_the_next_command_is_answered() {
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("unknown command", b"HELLO\n".to_vec(), "ERR unknown command \"HELLO\"\n"),
        ("DOWN without a name", b"DOWN\n".to_vec(), "ERR UP and DOWN take exactly one backend name\n"),
        ("UP without a name", b"UP \r\n".to_vec(), "ERR UP and DOWN take exactly one backend name\n"),
        ("invalid UTF-8 command", b"\xff\xfe\n".to_vec(), "ERR unknown command \"\u{fffd}\u{fffd}\"\n"),
        ("invalid UTF-8 in POOL", b"POOL a \xc3\x28\n".to_vec(), "ERR POOL line is not valid UTF-8\n"),
        ("invalid UTF-8 in a name to UP", b"UP \xff\n".to_vec(), "OK\n"),
        ("NUL in a command", b"PO\0OL a\n".to_vec(), "ERR unknown command \"PO\\0OL\"\n"),
        ("NUL in a node name", b"POOL a\0b\n".to_vec(), "ERR node name \"a\\0b\" cannot be a cookie value (use letters, digits and -._~!#$%&'*+^`|:<>=?@[]/)\n"),
    ];
    for (what, mut input, want) in cases {
        input.extend_from_slice(AFTER.as_bytes());
        assert_eq!(sim(&input), format!("{want}OK\n"), "{what}");
    }
}

#[test]
fn request_cut_off_by_end_of_input_is_an_err() {
    assert_eq!(
        sim(b"POOL a\nREQUEST\nGET / HTTP/1.1\nCookie: route=a\n"),
        "OK\nERR request cut off by end of input\n"
    );
    assert_eq!(
        sim(b"POOL a\nREQUEST\n"),
        "OK\nERR request cut off by end of input\n"
    );
    // The last line without its newline is a line all the same.
    for last in [&b"REQUEST"[..], b"REQUEST\r"] {
        let input = [&b"POOL a\n"[..], last].concat();
        assert_eq!(
            sim(&input),
            "OK\nERR request cut off by end of input\n",
            "{:?}",
            String::from_utf8_lossy(&input)
        );
    }
}

#[test]
fn nul_bytes_in_a_head_are_just_bytes() {
    assert_eq!(
        sim(b"POOL a b\nREQUEST\nGET /\0 HTTP/1.1\nX: \0\nCookie: route=b\0\n\nREQUEST\nGET / HTTP/1.1\nCookie: route=b\n\n"),
        "OK\na new Set-Cookie: route=a; Path=/; HttpOnly\nb sticky\n"
    );
}

/// The first `route` pair decides, whatever its value: empty, or with bytes that are not
/// UTF-8, it names no node, and the request is pinned afresh, the later valid pair never
/// looked at; a node's name followed by such a byte names no node either.
#[test]
fn a_first_route_value_that_names_no_node_pins_afresh_whatever_follows() {
    assert_eq!(
        sim(b"POOL a b\n\
              REQUEST\nGET / HTTP/1.1\nCookie: route=; route=b\n\n\
              REQUEST\nGET / HTTP/1.1\nCookie: route=\xff\xfe; route=a\n\n\
              REQUEST\nGET / HTTP/1.1\nCookie: route=b\xe9\nCookie: route=b\n\n\
              REQUEST\nGET / HTTP/1.1\nCookie: x=\xff; route=b\n\n"),
        "OK\n\
         a new Set-Cookie: route=a; Path=/; HttpOnly\n\
         b new Set-Cookie: route=b; Path=/; HttpOnly\n\
         a new Set-Cookie: route=a; Path=/; HttpOnly\n\
         b sticky\n"
    );
}

#[test]
fn one_megabyte_header_line_is_refused_and_the_run_goes_on() {
    let mut input = b"POOL a b\nREQUEST\nGET / HTTP/1.1\nX-Big: ".to_vec();
    input.extend(std::iter::repeat_n(b'x', 1_000_000));
    input.extend_from_slice(b"\nCookie: route=b\n\nREQUEST\nGET / HTTP/1.1\nCookie: route=b\n\n");
    assert_eq!(sim(&input), "OK\nERR request head too large\nb sticky\n");
}

#[test]
fn million_pair_cookie_line_is_refused_and_the_run_goes_on() {
    let mut input = b"POOL a b\nREQUEST\nGET / HTTP/1.1\nCookie: ".to_vec();
    for i in 0..1_000_000u32 {
        input.extend_from_slice(format!("c{i}=v;").as_bytes());
    }
    input.extend_from_slice(b"route=b\n\nREQUEST\nGET / HTTP/1.1\nCookie: route=b\n\n");
    assert_eq!(sim(&input), "OK\nERR request head too large\nb sticky\n");
}

#[test]
fn larger_head_limit_reads_a_big_cookie_line() {
    // With the limit raised, the same million-pair line is read and the pin after it found.
    let mut input = b"POOL a b\nREQUEST\nGET / HTTP/1.1\nCookie: ".to_vec();
    for i in 0..1_000_000u32 {
        input.extend_from_slice(format!("c{i}=v;").as_bytes());
    }
    input.extend_from_slice(b"route=b\n\n");
    let mut child = limpet()
        .args(["sim", "--max-head", "100000000"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut stdin = child.stdin.take().expect("stdin");
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let mut out = String::new();
    child
        .stdout
        .take()
        .expect("stdout")
        .read_to_string(&mut out)
        .expect("read");
    writer.join().expect("writer");
    assert!(child.wait().expect("wait").success());
    assert_eq!(out, "OK\nb sticky\n");
}

#[test]
fn a_closed_stdout_ends_the_run_quietly() {
    // `limpet sim < big | head -1`: the sim must stop without an error message or a panic.
    let mut child = limpet()
        .arg("sim")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    drop(child.stdout.take());
    let mut stdin = child.stdin.take().expect("stdin");
    let _ = stdin.write_all(&b"POOL a\n".repeat(100_000));
    drop(stdin);
    let out = child.wait_with_output().expect("wait");
    assert!(out.status.success(), "status {:?}", out.status);
    assert!(
        out.stderr.is_empty(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
