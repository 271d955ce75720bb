//! `limpet demo` as a newcomer runs it: the real binary, curl with a cookie jar, the stats
//! page it prints, Ctrl-C.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// Stops the demo when the test ends, however it ends.
struct Demo(Child);

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn curl(args: &[&str]) -> Output {
    Command::new("curl")
        .args(["-sS", "--max-time", "10"])
        .args(args)
        .output()
        .expect("curl is installed (scripts/test installs it)")
}

fn header(out: &Output, name: &str) -> Option<String> {
    String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
    })
}

#[test]
fn demo_pins_a_cookie_jar_client_spreads_fresh_ones_serves_its_stats_page_and_stops_on_ctrl_c() {
    // Port 0 instead of the default 8080, so the test never collides with a running demo.
    let mut child = Demo(
        Command::new(env!("CARGO_BIN_EXE_limpet"))
            .args(["demo", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn limpet demo"),
    );
    let stdout = child.0.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let first = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the demo prints its address");
    let addr = first
        .strip_prefix("listening on ")
        .expect("first line names the address");
    let welcome: Vec<String> = std::iter::from_fn(|| rx.recv_timeout(Duration::from_secs(5)).ok())
        .take_while(|l| !l.starts_with("Ctrl-C"))
        .collect();
    let welcome = welcome.join("\n");
    assert!(
        welcome.contains("curl -si -c"),
        "prints a curl command with a cookie jar: {welcome}"
    );
    assert!(
        welcome.contains(&format!("http://{addr}/index.html")),
        "prints the page URL"
    );
    // The admin listener runs too, on loopback, and its stats page answers.
    let stats = welcome
        .lines()
        .find_map(|l| l.strip_prefix("stats page: "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("prints the stats page's address: {welcome}"));
    assert!(stats.starts_with("http://127.0.0.1:"), "{stats}");
    let page = curl(&["-i", stats]);
    assert_eq!(
        String::from_utf8_lossy(&page.stdout).lines().next(),
        Some("HTTP/1.1 200 OK"),
        "GET {stats}"
    );

    // Fresh clients (no jar) take turns over the three nodes.
    let url = format!("http://{addr}/");
    let fresh: BTreeSet<String> = (0..3)
        .map(|_| header(&curl(&["-i", &url]), "x-limpet-node").expect("node header"))
        .collect();
    assert_eq!(
        fresh,
        BTreeSet::from(["alpha", "bravo", "charlie"].map(String::from))
    );

    // A cookie-jar client is pinned by the first answer and stays.
    let jar = std::env::temp_dir().join(format!("limpet-demo-test-{}.jar", std::process::id()));
    let jar = jar.to_str().expect("utf-8 temp path");
    let first = curl(&["-i", "-c", jar, "-b", jar, &url]);
    let pinned = header(&first, "x-limpet-node").expect("node header");
    let set_cookie = header(&first, "set-cookie").expect("first answer pins");
    assert!(
        set_cookie.starts_with(&format!("route={pinned};")),
        "{set_cookie}"
    );
    for _ in 0..5 {
        let again = curl(&["-i", "-c", jar, "-b", jar, &url]);
        assert_eq!(
            header(&again, "x-limpet-node").as_deref(),
            Some(pinned.as_str())
        );
        assert_eq!(
            header(&again, "set-cookie"),
            None,
            "a sticky hit sends no cookie"
        );
    }
    let _ = std::fs::remove_file(jar);

    // The page names the node and opens a WebSocket to /ws.
    let page = curl(&[
        "-H",
        "Accept: text/html",
        &format!("http://{addr}/index.html"),
    ]);
    let page = String::from_utf8_lossy(&page.stdout);
    assert!(page.contains("/ws"), "the page opens a WebSocket");
    assert!(
        page.contains("/demo/nodes"),
        "the page calls the demo's control endpoint"
    );

    // Ctrl-C stops everything cleanly.
    let pid = child.0.id().to_string();
    let status = Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .expect("kill -INT");
    assert!(status.success());
    let (done_tx, done_rx) = mpsc::channel();
    let mut proc = std::mem::replace(
        &mut child.0,
        Command::new("true").spawn().expect("placeholder child"),
    );
    std::thread::spawn(move || {
        let _ = done_tx.send(proc.wait());
    });
    let exit = done_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the demo exits after Ctrl-C")
        .expect("wait");
    assert!(exit.success(), "clean exit, got {exit:?}");
}

#[test]
fn demo_refuses_an_admin_listener_off_loopback() {
    // The demo's admin API has no token: anywhere but loopback it would be open to writes.
    let out = Command::new(env!("CARGO_BIN_EXE_limpet"))
        .args(["demo", "--listen", "127.0.0.1:0", "--admin", "0.0.0.0:0"])
        .output()
        .expect("run limpet demo");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("loopback only"), "{stderr}");
    assert!(out.stdout.is_empty(), "nothing started: {out:?}");
}

#[test]
fn demo_refuses_a_proxy_listener_off_loopback() {
    // The demo page's control endpoint, served through the proxy, stops and starts nodes with
    // no token: anywhere but loopback anyone reaching the port could.
    let out = Command::new(env!("CARGO_BIN_EXE_limpet"))
        .args(["demo", "--listen", "0.0.0.0:0", "--admin", "127.0.0.1:0"])
        .output()
        .expect("run limpet demo");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--listen 0.0.0.0:0"), "{stderr}");
    assert!(stderr.contains("loopback only"), "{stderr}");
    assert!(out.stdout.is_empty(), "nothing started: {out:?}");
}
