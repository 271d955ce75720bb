//! `limpet proxy` as a user runs it: the real binary, its stdout line, its exit codes.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use common::{
    h2_client, has_fields, node_of, nodes, plain_client, raw_exchange, read_request_head,
    set_cookie, AccessLines, PATIENCE,
};

fn limpet() -> Command {
    Command::new(env!("CARGO_BIN_EXE_limpet"))
}

#[test]
fn bad_arguments_exit_2_with_a_clear_message() {
    let cases: &[&[&str]] = &[
        &["proxy"],
        &["proxy", "--to", "nohostport"],
        &["proxy", "--to", "a;b=127.0.0.1:1"],
        &["proxy", "--to", "127.0.0.1:1", "--sticky", "maybe"],
        &["proxy", "--to", "127.0.0.1:1", "--threads", "0"],
        &["proxy", "--to", "a=127.0.0.1:1", "--to", "a=127.0.0.1:2"],
        &["proxy", "--to", "127.0.0.1:1", "--cookie", "bad name"],
        &["proxy", "--to", "127.0.0.1:1", "--listen", "not-an-address"],
    ];
    for args in cases {
        let out = limpet().args(*args).output().expect("run limpet");
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !err.trim().is_empty() && !err.contains("panicked"),
            "{args:?}: {err}"
        );
    }
}

/// `limpet proxy` refuses what a config file refuses: a `--fail-timeout` under 100 ms (at 0
/// every request tried a DOWN node, and `--max-slow-answers` had no window), and a node at
/// its own listening address (each request would come back to it, until connections ran
/// out). Before, both ran. Each run is bounded: one that starts serving is killed, and fails.
#[tokio::test]
async fn a_fail_timeout_under_100ms_or_a_node_at_its_own_address_is_refused() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let own = format!("127.0.0.1:{port}");
    let to_nowhere = |timeout| {
        vec![
            "proxy",
            "--listen",
            "127.0.0.1:0",
            "--to",
            "127.0.0.1:1",
            "--fail-timeout",
            timeout,
        ]
    };
    let to_itself = |more: &[&'static str]| {
        let mut args = vec!["proxy", "--listen", own.as_str(), "--to", own.as_str()];
        args.extend_from_slice(more);
        args
    };
    let cases: [(Vec<&str>, &str); 5] = [
        (to_nowhere("0s"), "fail timeout"),
        (to_nowhere("50ms"), "fail timeout"),
        (to_itself(&[]), "forward to itself"),
        (to_itself(&["--threads", "1"]), "forward to itself"),
        (to_itself(&["--threads", "2"]), "forward to itself"),
    ];
    for (args, says) in cases {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_limpet"))
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(PATIENCE, out)
            .await
            .unwrap_or_else(|_| panic!("{args:?}: still running (not refused)"))
            .expect("run limpet");
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
        // Refused before `listening on`, which scripts wait for.
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(!said.contains("listening on"), "{args:?}: {said}");
    }
}

/// `limpet run --upgrade-limit 0s` is refused before anything else (the config named does
/// not exist): every successor SIGUSR2 started would be killed at its start. A duration that
/// does not parse is refused the same way; one that does is taken (the error is then about
/// the config).
#[test]
fn an_upgrade_limit_of_zero_or_no_duration_is_refused() {
    for (limit, refused) in [("0s", true), ("soon", true), ("2m", false)] {
        let out = limpet()
            .args([
                "run",
                "-c",
                "/nonexistent/limpet.toml",
                "--upgrade-limit",
                limit,
            ])
            .output()
            .expect("run limpet");
        assert_eq!(out.status.code(), Some(2), "{limit}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.contains("--upgrade-limit"), refused, "{limit}: {err}");
    }
}

/// Kills the child on drop, so a failing assertion does not leak a process.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `limpet proxy --listen 127.0.0.1:0 --threads 1` with `cmd`'s further arguments, and
/// returns it with the address its first stdout line names.
async fn start_quick(mut cmd: Command) -> (Child, String) {
    let mut child = Child(
        cmd.args(["--listen", "127.0.0.1:0", "--threads", "1"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn limpet"),
    );
    let addr = listening_on(&mut child).await;
    (child, addr)
}

/// The address of the first `listening on ADDR[ (listener NAME)]` line `child` prints.
async fn listening_on(child: &mut Child) -> String {
    let stdout = child.0.stdout.take().expect("stdout");
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).map(|_| line)
    })
    .await
    .expect("join")
    .expect("read stdout");
    line.trim()
        .strip_prefix("listening on ")
        .and_then(|r| r.split(' ').next())
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_mode_prints_its_address_and_proxies_with_derived_names() {
    let ns = nodes(&["ignored-a", "ignored-b"]).await;
    let mut cmd = limpet();
    cmd.args(["proxy", "--to", &ns[0].addr.to_string(), "--to"])
        .arg(format!("named={}", ns[1].addr))
        .stderr(Stdio::null());
    let (child, addr) = start_quick(cmd).await;

    let expected = limpet::proxy::quick::stable_name(&ns[0].addr.to_string());
    let mut cookies = Vec::new();
    for _ in 0..2 {
        let resp = plain_client()
            .get(format!("http://{addr}/"))
            .send()
            .await
            .expect("get");
        assert_eq!(resp.status(), 200);
        let _ = node_of(&resp);
        cookies.push(set_cookie(&resp).expect("pinned"));
    }
    assert!(
        cookies[0].starts_with(&format!("route={expected};")),
        "{cookies:?}"
    );
    assert!(cookies[1].starts_with("route=named;"), "{cookies:?}");
    assert!(
        !cookies[0].contains("127.0.0.1"),
        "derived names do not show the address"
    );
    drop(child);
}

/// `limpet proxy --to solo=NODE` with the access log on (and nothing else at `info`): the
/// process, its address, and its stderr.
async fn logging_proxy(node: &common::Node) -> (Child, String, std::process::ChildStderr) {
    let mut cmd = limpet();
    cmd.arg("proxy")
        .arg("--to")
        .arg(format!("solo={}", node.addr))
        .env("RUST_LOG", "warn,limpet::access=info")
        .env("NO_COLOR", "1")
        .stderr(Stdio::piped());
    let (mut child, addr) = start_quick(cmd).await;
    let stderr = child.0.stderr.take().expect("stderr");
    (child, addr, stderr)
}

/// The first access log line on `stderr`, within 10 s. The line is written as the answer
/// ends; stderr is read until it comes (a failure drops the child, which ends stderr and
/// the read).
async fn first_access_line(stderr: std::process::ChildStderr) -> String {
    let read = tokio::task::spawn_blocking(move || {
        BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
            .find(|l| l.contains("limpet::access"))
    });
    tokio::time::timeout(std::time::Duration::from_secs(10), read)
        .await
        .expect("an access log line within 10 s")
        .expect("join")
        .expect("an access log line")
}

/// With the access log on, each request gets one line naming its method, its path without
/// the query (which often carries tokens), its status, its node and its duration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_log_writes_one_line_per_request_without_the_query() {
    let ns = nodes(&["a"]).await;
    let (child, addr, stderr) = logging_proxy(&ns[0]).await;
    let resp = plain_client()
        .get(format!("http://{addr}/print/job?token=secret123"))
        .send()
        .await
        .expect("get");
    assert_eq!(resp.status(), 200);
    let logged = first_access_line(stderr).await;
    for part in [
        "method=GET",
        "path=/print/job",
        "status=200",
        "node=solo",
        "ms=",
    ] {
        assert!(logged.contains(part), "{part} missing from {logged:?}");
    }
    assert!(!logged.contains("secret123"), "query logged: {logged:?}");
    drop(child);
}

/// An extension method of any length is a valid request (passed to the node, which answers
/// it), but the access log writes its first 32 characters and `...`: the log queue counts
/// lines, and a stalled log reader would otherwise hold a head's worth (64 KiB) per line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_log_clips_a_long_method() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let ns = nodes(&["a"]).await;
    let (child, addr, stderr) = logging_proxy(&ns[0]).await;
    let method = "X".repeat(20_000);
    let mut s = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    s.write_all(format!("{method} / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .expect("write");
    let mut answer = Vec::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        s.read_to_end(&mut answer),
    )
    .await
    .expect("an answer within 10 s")
    .expect("read");
    assert!(
        answer.starts_with(b"HTTP/1.1 "),
        "{:?}",
        String::from_utf8_lossy(&answer)
    );
    let logged = first_access_line(stderr).await;
    let clipped = format!("method={}... ", &method[..32]);
    assert!(logged.contains(&clipped), "{logged:?}");
    assert!(logged.len() < 1_000, "{} bytes", logged.len());
    drop(child);
}

/// A path's control characters and line separators are written escaped in the access line:
/// the request target may hold any byte from 0x80 up (httparse and `http` take valid UTF-8
/// there), so a client could send U+0085 (NEL), U+2028 or the 8-bit CSI U+009B. Before,
/// they went into the line raw (tracing escapes only the `message` field), and a log reader
/// splitting lines by Unicode's rules read what followed a NEL as a second, forged access
/// record. A backslash is escaped too, so a path holding the text `\u{85}` reads apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_log_escapes_control_characters_and_line_separators_of_the_path() {
    let ns = nodes(&["a"]).await;
    let (child, addr, stderr) = logging_proxy(&ns[0]).await;
    let addr: std::net::SocketAddr = addr.parse().expect("listen address");
    // No spaces: a request target has none (a NEL and what follows is the forgery).
    let target = "/x\u{85}id=forged\u{2028}y\u{2029}\u{9b}2J\\z";
    let answer = raw_exchange(
        addr,
        format!("GET {target} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 "), "{answer:?}");
    let logged = first_access_line(stderr).await;
    let bad: Vec<char> = logged
        .chars()
        .filter(|c| c.is_control() || matches!(c, '\u{2028}' | '\u{2029}'))
        .collect();
    assert!(bad.is_empty(), "{bad:?} raw in {logged:?}");
    assert!(
        logged.contains(r"path=/x\u{85}id=forged\u{2028}y\u{2029}\u{9b}2J\\z "),
        "NEL, separators, CSI or backslash not escaped: {logged:?}"
    );
    drop(child);
}

/// The access log line is written when the answer ends, and says how it ended: a whole
/// answer `end=done` with its body bytes; one whose node failed after its head went out
/// keeps its status (the client got a 200 head) but says `end=node-error` and the bytes
/// that went out; one whose client went away before its end (an HTTP/2 stream reset while
/// the node still holds the rest) says `end=client-gone`, and so does one whose client went
/// away before any answer head, with no status. Before, each line was written at the head:
/// the first three read as plain 200s, and the last wrote no line at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_log_line_says_how_the_answer_ended() {
    use tokio::io::AsyncWriteExt;
    // A node that answers `/whole` in full, `/cut` with 10 bytes of 100 then closes,
    // `/held` with 10 bytes of 100 then holds its connection for as long as the test runs,
    // and `/silent` not at all, holding its connection too.
    let node = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind node");
    let node_addr = node.local_addr().expect("node addr");
    let (held_tx, mut held_rx) = tokio::sync::mpsc::unbounded_channel();
    let serve = tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = node.accept().await else {
                return;
            };
            let held_tx = held_tx.clone();
            tokio::spawn(async move {
                // Kept alive: limpet may send its next request on this connection.
                while let Some(head) = read_request_head(&mut s).await {
                    if head.starts_with("GET /silent ") {
                        let _ = held_tx.send(s);
                        return;
                    }
                    if head.starts_with("GET /whole ") {
                        let whole = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello";
                        if s.write_all(whole).await.is_err() {
                            return;
                        }
                        continue;
                    }
                    let partial = b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n0123456789";
                    let _ = s.write_all(partial).await;
                    if head.starts_with("GET /held ") {
                        let _ = held_tx.send(s);
                    }
                    // `/cut`: dropped here, 90 bytes short.
                    return;
                }
            });
        }
    });

    let mut cmd = limpet();
    cmd.arg("proxy")
        .arg("--to")
        .arg(format!("solo={node_addr}"))
        .env("RUST_LOG", "warn,limpet::access=info")
        .env("NO_COLOR", "1")
        .stderr(Stdio::piped());
    let (mut child, addr) = start_quick(cmd).await;
    let lines = AccessLines::of(child.0.stderr.take().expect("stderr"));

    let resp = plain_client()
        .get(format!("http://{addr}/whole"))
        .send()
        .await
        .expect("get");
    assert_eq!(resp.text().await.expect("body"), "hello");
    let line = lines.next().await;
    has_fields(
        &line,
        &[
            "path=/whole",
            "status=200",
            "bytes=5",
            "end=done",
            "node=solo",
        ],
    );
    assert!(line.contains(" total_ms="), "{line:?}");

    // The client reads what comes until limpet closes its connection.
    let got = raw_exchange(
        addr.parse().expect("address"),
        b"GET /cut HTTP/1.1\r\nhost: x\r\n\r\n",
    )
    .await;
    assert!(
        got.starts_with("HTTP/1.1 200 OK") && got.ends_with("0123456789"),
        "{got:?}"
    );
    has_fields(
        &lines.next().await,
        &["path=/cut", "status=200", "bytes=10", "end=node-error"],
    );

    // limpet's own answer to a HEAD (400: no Host) has a body hyper never sends: done.
    let mut c = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    c.write_all(b"HEAD /nohost HTTP/1.1\r\n\r\n")
        .await
        .expect("send");
    has_fields(
        &lines.next().await,
        &["path=/nohost", "status=400", "bytes=0", "end=done"],
    );
    drop(c);

    // HTTP/2: the head and 10 bytes come, then the client drops the answer (RST_STREAM)
    // while the node holds the rest.
    let (mut send, conn) = h2_client(&addr).await;
    let req = http::Request::get(format!("http://{addr}/held"))
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .expect("request");
    let mut resp = send.send_request(req).await.expect("h2 answer head");
    assert_eq!(resp.status(), 200);
    let first = http_body_util::BodyExt::frame(resp.body_mut())
        .await
        .expect("a first frame")
        .expect("its data");
    assert_eq!(first.into_data().expect("data").as_ref(), b"0123456789");
    let held = held_rx.recv().await.expect("the node holds /held");
    drop(resp);
    has_fields(
        &lines.next().await,
        &["path=/held", "status=200", "bytes=10", "end=client-gone"],
    );

    // The client gives up before any answer head: the line has no status.
    let req = http::Request::get(format!("http://{addr}/silent"))
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .expect("request");
    let waiting = tokio::spawn(send.send_request(req));
    let silent = held_rx.recv().await.expect("the node holds /silent");
    waiting.abort();
    let line = lines.next().await;
    has_fields(
        &line,
        &[
            "path=/silent",
            "status=-",
            "ms=-",
            "bytes=0",
            "end=client-gone",
            "node=solo",
        ],
    );
    drop((held, silent));
    conn.abort();
    serve.abort();
    drop(child);
}

/// A client's protocol noise is not the log's: unsolicited HTTP/2 PING ACKs (each of which
/// the HTTP/2 library warns about) write nothing at the default log level, however many come.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsolicited_h2_ping_acks_write_no_log_line_at_the_default_level() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let ns = nodes(&["a"]).await;
    let mut cmd = limpet();
    cmd.arg("proxy")
        .arg("--to")
        .arg(format!("solo={}", ns[0].addr))
        .env_remove("RUST_LOG")
        .env("NO_COLOR", "1")
        .stderr(Stdio::piped());
    let (mut child, addr) = start_quick(cmd).await;
    // Read as it comes: a pipe nobody reads would block limpet's writes to it once full.
    let mut stderr = child.0.stderr.take().expect("stderr");
    let log = std::thread::spawn(move || {
        let mut log = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut log);
        log
    });
    let mut s = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]); // SETTINGS, empty
    for _ in 0..500 {
        // PING, ACK flag, stream 0: an answer to a PING limpet never sent.
        out.extend_from_slice(&[0, 0, 8, 6, 1, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1]);
    }
    // A PING of the client's own, answered only once every frame before it was read.
    out.extend_from_slice(&[0, 0, 8, 6, 0, 0, 0, 0, 0]);
    out.extend_from_slice(b"marker!!");
    s.write_all(&out).await.expect("write frames");
    let answered = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            // The answer to the marker PING: a PING frame with the ACK flag and its payload.
            if buf
                .windows(17)
                .any(|w| w[..9] == [0, 0, 8, 6, 1, 0, 0, 0, 0] && &w[9..] == b"marker!!")
            {
                return true;
            }
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await
    .expect("an answer to the marker PING within 10 s");
    assert!(
        answered,
        "the connection closed before the marker PING's ACK"
    );
    let _ = child.0.kill();
    let _ = child.0.wait();
    let log = log.join().expect("stderr reader");
    assert!(
        !log.contains("PING") && !log.contains("h2::"),
        "client-sent frames reached the log: {} lines, first: {:?}",
        log.lines().count(),
        log.lines().find(|l| l.contains("h2::"))
    );
    drop(child);
}

/// The resident memory of process `pid` in KiB (`VmRSS`), 0 if it cannot be read.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// HTTP/2 clients that open their flow-control windows wide and never read what they asked
/// for make limpet hold a bounded buffer per stream: four connections of 100 streams of a
/// 4 MB download add under 96 MiB to limpet's resident memory (about 56 MiB measured: the
/// streams' buffers and the 400 node connections'). With hyper's default (400 KiB a
/// stream) they passed 130 MiB before the test stopped watching; 47 MB a connection in the
/// chaos run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_clients_that_stop_reading_hold_a_bounded_buffer_per_stream() {
    use tokio::io::AsyncWriteExt;
    const BOUND_KIB: u64 = 96 * 1024;
    let ns = nodes(&["a"]).await;
    let mut cmd = limpet();
    cmd.arg("proxy")
        .arg("--to")
        .arg(format!("solo={}", ns[0].addr))
        .env("RUST_LOG", "error");
    let (child, addr) = start_quick(cmd).await;
    let pid = child.0.id();
    let before = rss_kib(pid);
    assert!(before > 0, "VmRSS readable");
    let path = b"/download?bytes=4000000";
    let mut conns = Vec::new();
    for _ in 0..4 {
        let mut s = tokio::net::TcpStream::connect(&addr)
            .await
            .expect("connect");
        let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        // SETTINGS: INITIAL_WINDOW_SIZE 2^31-1; the connection's window opened as wide.
        out.extend_from_slice(&[0, 0, 6, 4, 0, 0, 0, 0, 0, 0, 4, 0x7f, 0xff, 0xff, 0xff]);
        out.extend_from_slice(&[0, 0, 4, 8, 0, 0, 0, 0, 0]);
        out.extend_from_slice(&(0x7fff_ffffu32 - 65_535).to_be_bytes());
        for i in 0..100u32 {
            // GET, http, :authority "a" and :path, literals without indexing.
            let mut block = vec![0x82, 0x86, 0x01, 1, b'a', 0x04, path.len() as u8];
            block.extend_from_slice(path);
            out.extend_from_slice(&(block.len() as u32).to_be_bytes()[1..]);
            out.extend_from_slice(&[1, 0x05]); // HEADERS, END_STREAM | END_HEADERS
            out.extend_from_slice(&(2 * i + 1).to_be_bytes());
            out.extend_from_slice(&block);
        }
        s.write_all(&out).await.expect("write frames");
        conns.push(s); // never read
    }
    // The answers flow until every stream's buffer is full; watch for a while (bounded).
    let mut peak = before;
    for _ in 0..50 {
        peak = peak.max(rss_kib(pid));
        if peak - before > BOUND_KIB {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(
        peak - before <= BOUND_KIB,
        "limpet grew by {} KiB for 400 streams nobody reads (bound {BOUND_KIB} KiB)",
        peak - before
    );
    eprintln!(
        "400 unread HTTP/2 streams: limpet grew by {} KiB",
        peak - before
    );
    drop(conns);
    drop(child);
}

/// Refused TCP sessions are logged at most once per interval, with the count, not once per
/// connection: clients decide how often a TCP listener with no node to go to refuses them,
/// and a line each would let them fill the log. 40 refused connections write one line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_tcp_sessions_are_logged_once_per_interval_not_once_each() {
    use tokio::io::AsyncReadExt;
    // The node's port: bound, then closed, so connects to it are refused.
    let port = std::net::TcpListener::bind("127.0.0.2:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    let dir = std::env::temp_dir().join(format!("limpet-tcp-log-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let cfg = dir.join("limpet.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[nodes]]\nname = \"a\"\naddress = \"127.0.0.2\"\n\n\
             [[listeners]]\nname = \"raw\"\nbind = \"127.0.0.1:0\"\nmode = \"tcp\"\nnode_port = {port}\n"
        ),
    )
    .expect("config");
    let mut child = Child(
        limpet()
            .args(["run", "-c"])
            .arg(&cfg)
            .env_remove("RUST_LOG")
            .env("NO_COLOR", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn limpet"),
    );
    let addr = listening_on(&mut child).await;
    let mut stderr = child.0.stderr.take().expect("stderr");
    let log = std::thread::spawn(move || {
        let mut log = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut log);
        log
    });
    for _ in 0..40 {
        let mut s = tokio::net::TcpStream::connect(&addr)
            .await
            .expect("connect");
        // Refused: closed without a byte.
        let mut b = [0u8; 1];
        let n = tokio::time::timeout(std::time::Duration::from_secs(10), s.read(&mut b))
            .await
            .expect("closed in time");
        assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
    }
    let _ = child.0.kill();
    let _ = child.0.wait();
    let log = log.join().expect("stderr reader");
    let refused = log
        .lines()
        .filter(|l| l.contains("TCP session refused"))
        .count();
    assert_eq!(refused, 1, "one line for 40 refusals:\n{log}");
    let _ = std::fs::remove_dir_all(&dir);
    drop(child);
}

/// The soft limit on open files is raised to the hard limit at start, as HAProxy and nginx
/// (`worker_rlimit_nofile`) do: started with 1024 of 8192, `limpet proxy` runs with 8192.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_open_file_limit_is_raised_to_the_hard_limit_at_start() {
    let ns = nodes(&["a"]).await;
    let mut cmd = Command::new("prlimit");
    cmd.arg("--nofile=1024:8192")
        .arg(env!("CARGO_BIN_EXE_limpet"))
        .arg("proxy")
        .arg("--to")
        .arg(format!("solo={}", ns[0].addr))
        .env("RUST_LOG", "error");
    let (child, _addr) = start_quick(cmd).await;
    // prlimit runs limpet in its own process: the PID is limpet's.
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", child.0.id()))
        .expect("the process's limits");
    let files = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .unwrap_or_default();
    assert_eq!(
        files.get(3..5),
        Some(&["8192", "8192"][..]),
        "soft and hard limits:\n{limits}"
    );
    drop(child);
}

/// An HTTP/2 client whose answer its node cuts mid-body gets what the node sent before the
/// cut, as an HTTP/1 client does: the head, then the bytes that came, then its stream's
/// reset (`INTERNAL_ERROR`, so the answer does not read as whole), whether the node closed
/// its connection short (`/cut`) or reset it (`/reset`), with 10 bytes or 4 KiB before the
/// cut. Each round on a new client connection, as a client that sends one request does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_client_gets_the_head_and_the_bytes_of_an_answer_its_node_cut() {
    use tokio::io::AsyncWriteExt;
    // A node that answers `n` bytes of 100,000 (the path's query), then closes (`/cut`) or
    // resets (`/reset`).
    let node = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind node");
    let node_addr = node.local_addr().expect("node addr");
    let serve = tokio::spawn(async move {
        while let Ok((mut s, _)) = node.accept().await {
            tokio::spawn(async move {
                let Some(head) = read_request_head(&mut s).await else {
                    return;
                };
                let n: usize = head
                    .split_once('?')
                    .and_then(|(_, q)| q.split_once(' '))
                    .and_then(|(n, _)| n.parse().ok())
                    .unwrap_or(10);
                let mut partial = b"HTTP/1.1 200 OK\r\ncontent-length: 100000\r\n\r\n".to_vec();
                partial.resize(partial.len() + n, b'x');
                let _ = s.write_all(&partial).await;
                if head.starts_with("GET /reset") {
                    // Dropped with a zero linger: a reset, not a FIN.
                    let _ = s.set_zero_linger();
                }
            });
        }
    });
    let mut cmd = limpet();
    cmd.arg("proxy")
        .arg("--to")
        .arg(format!("solo={node_addr}"))
        .env("RUST_LOG", "warn");
    let (child, addr) = start_quick(cmd).await;
    for (path, n) in [
        ("/cut", 10),
        ("/reset", 10),
        ("/cut", 4096),
        ("/reset", 4096),
    ] {
        for round in 0..20 {
            let (mut send, conn) = h2_client(&addr).await;
            let req = http::Request::get(format!("http://{addr}{path}?{n}"))
                .body(http_body_util::Empty::<bytes::Bytes>::new())
                .expect("request");
            let what = format!("{path} with {n} bytes, round {round}");
            let (status, got, end) = tokio::time::timeout(PATIENCE, async {
                let mut resp = send
                    .send_request(req)
                    .await
                    .unwrap_or_else(|e| panic!("{what}: no answer head, only {e:?}"));
                let mut got = 0;
                let end = loop {
                    match http_body_util::BodyExt::frame(resp.body_mut()).await {
                        Some(Ok(f)) => got += f.into_data().map_or(0, |d| d.len()),
                        Some(Err(e)) => break Some(e),
                        None => break None,
                    }
                };
                (resp.status(), got, end)
            })
            .await
            .unwrap_or_else(|_| panic!("{what}: the answer did not end"));
            assert_eq!(status, 200, "{what}");
            assert_eq!(got, n, "{what}: the bytes that came");
            // hyper's HTTP/2 server resets a stream whose answer body failed with
            // INTERNAL_ERROR; the error says so in its h2 source.
            let end = end.map(|e| format!("{e:?}"));
            assert!(
                end.as_deref().is_some_and(|e| e.contains("INTERNAL_ERROR")),
                "{what}: the answer ends in the stream's reset, not whole: {end:?}"
            );
            conn.abort();
        }
    }
    serve.abort();
    drop(child);
}
