//! Config files: every error names the file, line, column and key, unknown keys come with a
//! "did you mean" (for typos, and for HAProxy's and nginx's names), counts take HAProxy's
//! `k`/`m` suffixes, bad TLS files are config errors, and the shipped example validates.

mod common;

use std::path::Path;
use std::process::Command;

use common::multiport::{Pki, TempDir};
use limpet::config::Config;

const NODES: &str = "[[nodes]]\nname = \"a\"\naddress = \"127.0.0.2\"\n\n";

/// The error for `text`, as `limpet.toml` in the current directory.
fn error(text: &str) -> String {
    match Config::from_text(Path::new("limpet.toml"), text) {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(e) => e.to_string(),
    }
}

/// `limpet.toml:LINE:COL: ` where LINE is the line of `needle` in `text`.
fn at(text: &str, needle: &str) -> String {
    let off = text
        .find(needle)
        .unwrap_or_else(|| panic!("{needle} not in text"));
    let line = text[..off].matches('\n').count() + 1;
    let col = off - text[..off].rfind('\n').map_or(0, |i| i + 1) + 1;
    format!("limpet.toml:{line}:{col}: ")
}

#[test]
fn unknown_keys_are_errors_with_a_suggestion() {
    let text = format!("{NODES}[[tables]]\nname = \"t\"\nkey = \"source-ip\"\nexpir = \"30m\"\n");
    let e = error(&text);
    assert!(
        e.starts_with(&format!(
            "{}tables[0].expir: unknown field `expir`",
            at(&text, "expir")
        )),
        "{e}"
    );
    assert!(e.ends_with("did you mean `expire`?"), "{e}");

    let text = format!("{NODES}[[listeners]]\nname = \"l\"\nbind = \"127.0.0.1:0\"\nnode_port = 80\nbalance = \"leastcon\"\n");
    let e = error(&text);
    assert!(e.starts_with(&at(&text, "\"leastcon\"")), "{e}");
    assert!(
        e.contains("listeners[0].balance") && e.ends_with("did you mean `leastconn`?"),
        "{e}"
    );

    // Far from anything known: no suggestion, still the key and place.
    let text = format!("zzzzzzzz = 1\n{NODES}");
    let e = error(&text);
    assert!(
        e.starts_with(&format!("{}zzzzzzzz: unknown field", at(&text, "zzzzzzzz"))),
        "{e}"
    );
    assert!(!e.contains("did you mean"), "{e}");
}

/// HAProxy and nginx habits, each as written in the table where an operator would write it:
/// (text after the nodes, where the error points, the key, what the hint says).
#[test]
fn haproxy_and_nginx_names_get_the_limpet_key() {
    const L: &str = "[[listeners]]\nname = \"l\"\nbind = \"127.0.0.1:0\"\nnode_port = 80\n";
    let cases: &[(String, &str, &str, &str)] = &[
        (
            "[health]\ninter = \"5s\"\n".into(),
            "inter",
            "health.inter",
            "did you mean `interval`? (HAProxy's `inter`)",
        ),
        (
            format!("{L}inter = \"5s\"\n"),
            "inter",
            "listeners[0].inter",
            "HAProxy's `inter` is `interval` in `[health]`",
        ),
        (
            format!("{L}fall = 3\n"),
            "fall",
            "listeners[0].fall",
            "`fall` goes in `[health]`",
        ),
        (
            format!("{L}rise = 2\n"),
            "rise",
            "listeners[0].rise",
            "`rise` goes in `[health]`",
        ),
        (
            format!("{L}check = {{ kind = \"tcp\", fall = 3 }}\n"),
            "fall = 3",
            "listeners[0].check.fall",
            "`fall` goes in `[health]`",
        ),
        (
            format!("{L}maxconn = 2000\n"),
            "maxconn",
            "listeners[0].maxconn",
            "did you mean `max_connections`? (HAProxy's `maxconn`)",
        ),
        (
            format!("{L}stick-table = \"t\"\n"),
            "stick-table",
            "listeners[0].stick-table",
            "did you mean `table`? (HAProxy's `stick-table`); declare the table once in `[[tables]]`",
        ),
        (
            "[stick-table]\nsize = 1\n".into(),
            "stick-table",
            "stick-table",
            "did you mean `tables`? (HAProxy's `stick-table`)",
        ),
        (
            "[[tables]]\nname = \"t\"\nstore-response = \"Mcp-Session-Id\"\n".into(),
            "store-response",
            "tables[0].store-response",
            "did you mean `learn_header`? (HAProxy's `store-response`); a table keyed on a header the node's answer sets",
        ),
        (
            format!("{L}timeout_server = \"30s\"\n"),
            "timeout_server",
            "listeners[0].timeout_server",
            "HAProxy's `timeout server` is `upstream_answer` in `[listeners.timeouts]`",
        ),
        (
            format!("{L}[listeners.timeouts]\nserver = \"30s\"\n"),
            "server",
            "listeners[0].timeouts.server",
            "did you mean `upstream_answer`? (HAProxy's `timeout server`)",
        ),
        (
            format!("{L}[listeners.timeouts]\nclient = \"30s\"\n"),
            "client",
            "listeners[0].timeouts.client",
            "did you mean `idle`? (HAProxy's `timeout client`)",
        ),
        (
            format!("{L}proxy_read_timeout = \"30s\"\n"),
            "proxy_read_timeout",
            "listeners[0].proxy_read_timeout",
            "nginx's `proxy_read_timeout` is `upstream_answer` in `[listeners.timeouts]`",
        ),
        (
            format!("{L}balance = \"static-rr\"\n"),
            "\"static-rr\"",
            "listeners[0].balance",
            "did you mean `round-robin`? (HAProxy's `static-rr`)",
        ),
        (
            format!("{L}balance = \"roundrobin\"\n"),
            "\"roundrobin\"",
            "listeners[0].balance",
            "did you mean `round-robin`?",
        ),
        (
            format!("{L}balance = \"source\"\n"),
            "\"source\"",
            "listeners[0].balance",
            "HAProxy's `source`: pinning a client address is an affinity table",
        ),
        (
            "[[nodes]]\nname = \"b\"\naddress = \"127.0.0.3\"\ncheck = true\n".into(),
            "check = true",
            "nodes[1].check",
            "`check` goes in `[[listeners]]`; checks belong to a listener",
        ),
        (
            "[[nodes]]\nname = \"b\"\naddress = \"127.0.0.3\"\nport = 8080\n".into(),
            "port = 8080",
            "nodes[1].port",
            "did you mean `check_port`? (HAProxy's `port`); a node has no service port",
        ),
        (
            format!("{L}max_fails = 3\n"),
            "max_fails",
            "listeners[0].max_fails",
            "nginx's `max_fails` is `fall` in `[health]`",
        ),
        (
            format!("{L}option_redispatch = true\n"),
            "option_redispatch",
            "listeners[0].option_redispatch",
            "not needed: a pin to a node that is DOWN or in MAINT is always re-pinned",
        ),
    ];
    for (tail, needle, key, hint) in cases {
        let text = format!("{NODES}{tail}");
        let e = error(&text);
        assert!(
            e.starts_with(&format!("{}{key}: unknown ", at(&text, needle))),
            "place and key of {tail:?}: {e}"
        );
        assert!(e.contains(hint), "hint for {tail:?}: {e}");
    }
}

#[test]
fn counts_take_haproxy_suffixes() {
    let text = |size: &str, max: &str| {
        format!("{NODES}[[tables]]\nname = \"t\"\nkey = \"source-ip\"\nsize = {size}\n[[listeners]]\nname = \"l\"\nbind = \"127.0.0.1:0\"\nnode_port = 80\ntable = \"t\"\nmax_connections = {max}\n")
    };
    let ok = |size: &str, max: &str| {
        Config::from_text(Path::new("limpet.toml"), &text(size, max))
            .unwrap_or_else(|e| panic!("{size} {max}: {e}"))
    };
    // Binary, as HAProxy's `size 100k` (102400 entries): a number copied over means the same.
    let cfg = ok("\"100k\"", "\"2k\"");
    assert_eq!(cfg.table("t").map(|t| t.size), Some(102_400));
    assert_eq!(cfg.listeners[0].limits.max_client_connections, 2048);
    let cfg = ok("\"1m\"", "500");
    assert_eq!(cfg.table("t").map(|t| t.size), Some(1_048_576));
    assert_eq!(cfg.listeners[0].limits.max_client_connections, 500);
    assert_eq!(
        ok("100000", "\"1K\"").table("t").map(|t| t.size),
        Some(100_000)
    );

    for (size, what) in [
        ("\"100x\"", "is not a count"),
        ("\"1.5k\"", "is not a count"),
        ("-5", "is negative"),
        ("1.5", "expected a count"),
    ] {
        let t = text(size, "1");
        let e = error(&t);
        assert!(
            e.starts_with(&format!("{}tables[0].size: ", at(&t, size))),
            "{size}: {e}"
        );
        assert!(e.contains(what), "{size}: {e}");
    }
    let t = text("1", "\"0k\"");
    let e = error(&t);
    assert!(
        e.contains("listeners[0].max_connections: must be at least 1"),
        "{e}"
    );
    // Durations keep their units: HAProxy's bare milliseconds are refused, with the reason.
    let t = format!("{NODES}[health]\ninterval = 5000\n");
    let e = error(&t);
    assert!(
        e.starts_with(&format!(
            "{}health.interval: 5000 has no unit",
            at(&t, "5000")
        )),
        "{e}"
    );
}

#[test]
fn bad_values_name_their_key_and_line() {
    let text =
        format!("{NODES}[[tables]]\nname = \"t\"\nkey = \"source-ip\"\nexpire = \"30 minutes\"\n");
    let e = error(&text);
    assert!(
        e.starts_with(&format!(
            "{}tables[0].expire: ",
            at(&text, "\"30 minutes\"")
        )),
        "{e}"
    );
    assert!(e.contains("is not a duration"), "{e}");

    // A duration too long for a deadline (each segment fits, the sum would overflow
    // `Instant` arithmetic or the checks' jitter): refused, with its key and line.
    let long = "9223372036854775ms".repeat(3);
    for (key, text) in [
        (
            "health.interval",
            format!("{NODES}[health]\ninterval = \"{long}\"\n"),
        ),
        (
            "health.jitter",
            format!("{NODES}[health]\njitter = \"3651d\"\n"),
        ),
    ] {
        let e = error(&text);
        let value = text
            .lines()
            .last()
            .and_then(|l| l.split_once("= "))
            .map_or("", |(_, v)| v);
        assert!(
            e.starts_with(&format!("{}{key}: ", at(&text, value))),
            "{e}"
        );
        assert!(e.contains("longer than 3650d"), "{e}");
    }

    // `fall` and `rise` are counted per check in a byte: 0 and 256 are refused alike.
    for (key, value) in [("fall", "0"), ("rise", "256")] {
        let text = format!("{NODES}[health]\n{key} = {value}\n");
        let e = error(&text);
        // The value on the last line, after `key = `.
        let (line, col) = (text.lines().count(), key.len() + 4);
        assert!(
            e.starts_with(&format!(
                "limpet.toml:{line}:{col}: health.{key}: must be between 1 and 255"
            )),
            "{e}"
        );
    }
    let ok = format!("{NODES}[health]\nfall = 255\nrise = 255\n[[listeners]]\nname = \"l\"\nbind = \"127.0.0.1:0\"\nnode_port = 80\n");
    if let Err(e) = Config::from_text(Path::new("limpet.toml"), &ok) {
        panic!("255 is refused: {e}");
    }

    // A cookie's `secure` takes true, false or "never", and says so at its line.
    let text = format!("{NODES}[[listeners]]\nname = \"l\"\nbind = \"127.0.0.1:0\"\nnode_port = 80\n[listeners.cookie]\nsecure = \"sometimes\"\n");
    let e = error(&text);
    assert!(
        e.starts_with(&format!(
            "{}listeners[0].cookie.secure: ",
            at(&text, "\"sometimes\"")
        )) && e.contains("expected true, false or \"never\""),
        "{e}"
    );

    let text = "[[nodes]]\nname = \"a\"\naddress = \"10.0.0.1:80\"\n[[listeners]]\nname = \"l\"\nbind = \"127.0.0.1:0\"\nnode_port = 80\n";
    let e = error(text);
    assert!(
        e.starts_with(&format!(
            "{}nodes[0].address: ",
            at(text, "\"10.0.0.1:80\"")
        )),
        "{e}"
    );
    assert!(e.contains("without a port"), "{e}");

    let text = format!("{NODES}[[tables]]\nname = \"terminal\"\nkey = \"source-ip\"\n[[listeners]]\nname = \"l\"\nbind = \"127.0.0.1:0\"\nnode_port = 80\ntable = \"termnal\"\n");
    let e = error(&text);
    assert!(
        e.starts_with(&format!(
            "{}listeners[0].table: no table named \"termnal\"",
            at(&text, "\"termnal\"")
        )),
        "{e}"
    );
    assert!(e.ends_with("did you mean \"terminal\"?"), "{e}");

    let text = format!("{NODES}[[listeners]]\nname = \"l\"\nbind = \"127.0.0.1:0\"\nnode_port = 80\nupstream_tls = {{ verify = \"yes\" }}\n");
    let e = error(&text);
    assert!(
        e.contains("listeners[0].upstream_tls.verify: \"yes\""),
        "{e}"
    );

    let text = "[[nodes]]\nname = \"a\"\naddress = \"127.0.0.2\"\n[[nodes]]\nname = \"a\"\naddress = \"127.0.0.3\"\n";
    let e = error(text);
    assert!(
        e.starts_with("limpet.toml:5:8: nodes[1].name: duplicate node name"),
        "{e}"
    );

    let e = error(&format!(
        "{NODES}[[listeners]]\nname = \"l\"\nbind = \"127.0.0.1:0\"\n"
    ));
    assert!(
        e.contains("listeners[0]") && e.contains("missing field `node_port`"),
        "{e}"
    );

    let e = error("[[nodes]\nname = 1\n");
    assert!(
        e.starts_with("limpet.toml:1:"),
        "syntax errors have a place too: {e}"
    );
}

#[test]
fn tls_files_are_checked_when_the_config_is() {
    let pki = Pki::new();
    let (cert, key) = pki.issue("one", &["print.example"]);
    let (_, other_key) = pki.issue("two", &["print.example"]);
    let listener = |c: &Path, k: &Path| {
        format!(
            "{NODES}[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = 80\n\n[[listeners]]\nname = \"tls\"\nbind = \"127.0.0.1:0\"\nnode_port = 443\n\n[listeners.tls]\ncert = \"{}\"\nkey = \"{}\"\n",
            c.display(),
            k.display()
        )
    };
    let text = listener(Path::new("/nonexistent/x.pem"), &key);
    let e = error(&text);
    assert!(
        e.starts_with(&format!(
            "{}listeners[1].tls.cert: cannot read /nonexistent/x.pem: ",
            at(&text, "\"/nonexistent/x.pem\"")
        )),
        "{e}"
    );
    let text = listener(&cert, &other_key);
    let e = error(&text);
    assert!(
        e.contains("listeners[1].tls.key: ") && e.contains("does not match the certificate"),
        "{e}"
    );
    // A key block the crypto provider cannot load (a kind or curve it does not sign with; here
    // bytes that are no key at all) is said to be that, not a mismatch.
    let unusable = key.with_file_name("unusable.key");
    std::fs::write(
        &unusable,
        "-----BEGIN PRIVATE KEY-----\nbm90IGEga2V5IGF0IGFsbA==\n-----END PRIVATE KEY-----\n",
    )
    .expect("write");
    let text = listener(&cert, &unusable);
    let e = error(&text);
    assert!(
        e.contains("listeners[1].tls.key: ")
            && e.contains("a private key this build cannot sign with")
            && !e.contains("does not match"),
        "{e}"
    );
    // A CERTIFICATE block whose bytes are no certificate is the certificate's fault.
    let unreadable = key.with_file_name("unreadable.pem");
    std::fs::write(
        &unreadable,
        "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n",
    )
    .expect("write");
    let e = error(&listener(&unreadable, &key));
    assert!(
        e.contains("listeners[1].tls.cert: ")
            && e.contains("not a certificate this build can read"),
        "{e}"
    );
    let text = listener(&key, &key);
    let e = error(&text);
    assert!(
        e.contains("listeners[1].tls.cert: ") && e.contains("no CERTIFICATE"),
        "{e}"
    );
    // A cert that does not cover the SNI name it is listed for.
    let text = format!(
        "{NODES}[[listeners]]\nname = \"tls\"\nbind = \"127.0.0.1:0\"\nnode_port = 443\n[[listeners.tls.certs]]\ncert = \"{}\"\nkey = \"{}\"\nnames = [\"other.example\"]\n",
        cert.display(),
        key.display()
    );
    let e = error(&text);
    assert!(e.contains("listeners[0].tls.certs[0].names: "), "{e}");
    // One name on two certificates (without regard to case, or to a trailing dot, which the
    // resolver drops): the SNI resolver would keep the second alone, silently; refused at
    // the second's name.
    let (cert2, key2) = pki.issue("three", &["print.example"]);
    for second in ["Print.Example", "print.example."] {
        let text = format!(
            "{NODES}[[listeners]]\nname = \"tls\"\nbind = \"127.0.0.1:0\"\nnode_port = 443\n\
             [[listeners.tls.certs]]\ncert = \"{}\"\nkey = \"{}\"\nnames = [\"print.example\"]\n\
             [[listeners.tls.certs]]\ncert = \"{}\"\nkey = \"{}\"\nnames = [\"{second}\"]\n",
            cert.display(),
            key.display(),
            cert2.display(),
            key2.display()
        );
        let e = error(&text);
        assert!(
            e.starts_with(&format!(
                "{}listeners[0].tls.certs[1].names: \"{second}\" is already a name of",
                at(&text, &format!("\"{second}\""))
            )),
            "{e}"
        );
    }
    // One certificate naming a name twice maps it to itself: it loads.
    let text = format!(
        "{NODES}[[listeners]]\nname = \"tls\"\nbind = \"127.0.0.1:0\"\nnode_port = 443\n\
         [[listeners.tls.certs]]\ncert = \"{}\"\nkey = \"{}\"\nnames = [\"print.example\", \"Print.Example\"]\n",
        cert.display(),
        key.display()
    );
    Config::from_text(Path::new("limpet.toml"), &text).expect("a name twice on one certificate");
    // The good pair passes.
    Config::from_text(Path::new("limpet.toml"), &listener(&cert, &key)).expect("valid TLS config");
}

fn limpet() -> Command {
    Command::new(env!("CARGO_BIN_EXE_limpet"))
}

#[test]
fn limpet_check_validates_the_shipped_example_and_reports_errors() {
    // The example, with test certificates where it expects its own.
    let pki = Pki::new();
    let (cert, key) = pki.issue("ha-safeq", &["print.example"]);
    let dir = TempDir::new("example");
    std::fs::create_dir_all(dir.path().join("certs")).expect("certs dir");
    std::fs::copy(&cert, dir.path().join("certs/ha-safeq.pem")).expect("cert");
    std::fs::copy(&key, dir.path().join("certs/ha-safeq.key")).expect("key");
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/print-server.toml"
    );
    let path = dir.path().join("print-server.toml");
    std::fs::copy(example, &path).expect("copy example");
    let out = limpet()
        .args(["check", "-c"])
        .arg(&path)
        .output()
        .expect("run limpet check");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("configuration OK"), "{stdout}");
    // What would run, as TOML (tests/config_check_listing.rs covers the listing itself).
    assert!(
        stdout.contains("name = \"terminal-tls\"\nbind = [\"0.0.0.0:5012\", \"0.0.0.0:5022\", \"0.0.0.0:5610\"]\nmode = \"http\""),
        "{stdout}"
    );
    assert!(
        stdout.contains("name = \"terminal\"\nkey = \"source-ip\"\nipv4_prefix = 32\nipv6_prefix = 128\nexpire = \"30m\"\nsize = 100000\n"),
        "{stdout}"
    );

    // Without the certificates: exit 2, and the error names file, line and key.
    std::fs::remove_file(dir.path().join("certs/ha-safeq.pem")).expect("rm");
    let out = limpet()
        .args(["check", "-c"])
        .arg(&path)
        .output()
        .expect("run limpet check");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let text = std::fs::read_to_string(&path).expect("example");
    let line = text[..text.find("cert = ").expect("cert key")]
        .matches('\n')
        .count()
        + 1;
    assert!(
        stderr.contains(&format!(
            "print-server.toml:{line}:8: listeners[1].tls.cert: cannot read "
        )),
        "{stderr}"
    );
}

/// An HTTP listener cannot send a PROXY header: its node connections are shared by every
/// client, so the header would name the wrong one. Refused with file, line and key.
#[test]
fn proxy_protocol_send_is_refused_on_an_http_listener() {
    let text = format!(
        "{NODES}[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = 80\n\
         proxy_protocol = {{ send = \"v2\" }}\n"
    );
    let e = error(&text);
    assert!(
        e.starts_with(&format!(
            "{}listeners[0].proxy_protocol.send: only for mode = \"tcp\"",
            at(&text, "\"v2\"")
        )),
        "{e}"
    );
    let tcp = text.replace("node_port = 80\n", "node_port = 80\nmode = \"tcp\"\n");
    assert!(Config::from_text(Path::new("limpet.toml"), &tcp).is_ok());
}

/// `limpet.toml:LINE:COL: ` of the value in `assignment` (`key = value`, found in `text`).
fn at_value(text: &str, assignment: &str) -> String {
    let (k, _) = assignment
        .split_once("= ")
        .unwrap_or_else(|| panic!("{assignment} is not `key = value`"));
    let off = text
        .find(assignment)
        .unwrap_or_else(|| panic!("{assignment} not in text"));
    let line = text[..off].matches('\n').count() + 1;
    let col = off + k.len() + 2 - text[..off].rfind('\n').map_or(0, |i| i + 1) + 1;
    format!("limpet.toml:{line}:{col}: ")
}

/// Two listeners; what follows the text is the second's (`listeners[1]`).
const TWO_LISTENERS: &str = "[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = 80\n\n[[listeners]]\nname = \"api\"\nbind = \"127.0.0.1:0\"\nnode_port = 81\n";

/// A zero timeout is refused at the line of its value, written in `[listeners.timeouts]` or
/// inline, with the listener's index in the key.
#[test]
fn a_zero_timeout_is_refused_at_its_line() {
    for (timeouts, bad, key) in [
        (
            "[listeners.timeouts]\nidle = \"10m\"\nconnect = \"0s\"\n",
            "connect = \"0s\"",
            "connect",
        ),
        (
            "timeouts = { idle = \"10m\", queue = \"0ms\" }\n",
            "queue = \"0ms\"",
            "queue",
        ),
        (
            "\n[listeners.timeouts]\nheader_read = \"5s\"\n\nupstream_idle = \"0s\"\n",
            "upstream_idle = \"0s\"",
            "upstream_idle",
        ),
        (
            "timeouts = { idle = \"0s\" }\nmode = \"tcp\"\n",
            "idle = \"0s\"",
            "idle",
        ),
    ] {
        let text = format!("{NODES}{TWO_LISTENERS}{timeouts}");
        let e = error(&text);
        assert!(
            e.starts_with(&format!(
                "{}listeners[1].timeouts.{key}: must be more than 0",
                at_value(&text, bad)
            )),
            "{timeouts:?}: {e}"
        );
    }
    // `drain = "0s"` (close at once on shutdown) is a choice, not a mistake.
    let text = format!("{NODES}{TWO_LISTENERS}timeouts = {{ drain = \"0s\" }}\n");
    if let Err(e) = Config::from_text(Path::new("limpet.toml"), &text) {
        panic!("drain = \"0s\" is refused: {e}");
    }
}

/// A cookie `path` or `domain` that cannot stand in a `Set-Cookie` value (a control
/// character, DEL, a `;` that would add an attribute) used to load, and then no answer ever
/// carried the cookie. Refused at the line of the value; what is accepted makes a header.
#[test]
fn cookie_path_and_domain_that_cannot_be_sent_are_refused_at_their_line() {
    let listener = |cookie: &str| {
        format!(
            "{NODES}{TWO_LISTENERS}\n[listeners.cookie]\nname = \"srv\"\n{cookie}\nhttp_only = true\n"
        )
    };
    for (bad, key) in [
        (r#"path = "/app; Domain=evil.example""#, "path"),
        (r#"path = "/app\u0001""#, "path"),
        (r#"path = "/app\u007F""#, "path"),
        (r#"path = "/app\r\nX-Evil: 1""#, "path"),
        (r#"path = "/a b""#, "path"),
        (r#"path = "/é""#, "path"),
        (r#"path = "app""#, "path"),
        (r#"path = """#, "path"),
        (r#"domain = "example.com; Secure""#, "domain"),
        (r#"domain = "example.com\u0001""#, "domain"),
        (r#"domain = "example.com\u007F""#, "domain"),
        (r#"domain = "exa mple.com""#, "domain"),
        (r#"domain = "example.com/x""#, "domain"),
        (r#"domain = "exa,mple.com""#, "domain"),
        (r#"domain = "exämple.com""#, "domain"),
        (r#"domain = ".""#, "domain"),
        (r#"domain = """#, "domain"),
    ] {
        let text = listener(bad);
        let e = error(&text);
        assert!(
            e.starts_with(&format!(
                "{}listeners[1].cookie.{key}: ",
                at_value(&text, bad)
            )),
            "{bad}: {e}"
        );
    }
    // Inline, the same.
    let text = format!("{NODES}{TWO_LISTENERS}cookie = {{ name = \"srv\", path = \"/;x\" }}\n");
    let e = error(&text);
    assert!(
        e.starts_with(&format!(
            "{}listeners[1].cookie.path: ",
            at_value(&text, "path = \"/;x\"")
        )),
        "{e}"
    );
    for (path, domain) in [
        ("/", "example.com"),
        ("/app/v1", ".example.com"),
        ("/a,b=c~!$&'()*+:@%20", "print-01.Example.COM"),
        ("/x", "10.0.0.1"),
        // What loaded and worked before the check came, and browsers take.
        ("/", "my_app.internal"),
        ("/", "localhost"),
        ("/", "example.com."),
    ] {
        let text = listener(&format!("path = \"{path}\"\ndomain = \"{domain}\""));
        let cfg = Config::from_text(Path::new("limpet.toml"), &text)
            .unwrap_or_else(|e| panic!("{path} {domain}: {e}"));
        let spec = &cfg.listeners[1].cookie.as_ref().expect("a cookie").spec;
        let set = spec.set_cookie("a", true);
        assert!(http::HeaderValue::try_from(set.as_str()).is_ok(), "{set}");
        assert!(
            set.contains(&format!("; Path={path}; Domain={domain};")),
            "{set}"
        );
    }
}

/// A cookie `max_age` under a second, or not a whole number of seconds, is refused at its
/// line: `Max-Age` counts whole seconds, and `Max-Age=0` has a browser delete the cookie, so
/// every pin limpet sent unpinned its client at once (before, "500ms" loaded as 0).
#[test]
fn a_cookie_max_age_under_a_second_is_refused_at_its_line() {
    let listener = |max_age: &str| {
        format!(
            "{NODES}{TWO_LISTENERS}\n[listeners.cookie]\nname = \"srv\"\nmax_age = \"{max_age}\"\n"
        )
    };
    for bad in ["0s", "500ms", "1500ms"] {
        let text = listener(bad);
        let e = error(&text);
        assert!(
            e.starts_with(&format!(
                "{}listeners[1].cookie.max_age: ",
                at_value(&text, &format!("max_age = \"{bad}\""))
            )),
            "{bad}: {e}"
        );
    }
    let text = listener("8h");
    let cfg = Config::from_text(Path::new("limpet.toml"), &text).unwrap_or_else(|e| panic!("{e}"));
    let spec = &cfg.listeners[1].cookie.as_ref().expect("a cookie").spec;
    assert!(spec.set_cookie("a", false).contains("Max-Age=28800"));
}

/// limpet's cookie named as its table's application cookie (or its `-home` so) is refused
/// at the cookie's name: limpet strips its cookie from requests and drops a node's
/// `Set-Cookie` of that name, so the application would lose its session (HAProxy's `cookie
/// JSESSIONID prefix` carried over). Another name loads.
#[test]
fn a_cookie_named_as_the_table_s_application_cookie_is_refused_at_its_name() {
    let text = |cookie: &str, app: &str| {
        format!(
            "{NODES}[[tables]]\nname = \"s\"\napp_cookie = \"{app}\"\n\n\
             [[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = 80\ntable = \"s\"\n\
             [listeners.cookie]\nname = \"{cookie}\"\n"
        )
    };
    for (cookie, app, failback) in [
        ("JSESSIONID", "JSESSIONID", ""),
        ("srv", "srv-home", "failback = \"home\"\n"),
    ] {
        let t = format!("{}{failback}", text(cookie, app));
        let e = error(&t);
        assert!(
            e.starts_with(&format!(
                "{}listeners[0].cookie.name: ",
                at_value(&t, &format!("name = \"{cookie}\""))
            )),
            "{cookie}: {e}"
        );
    }
    // Another name loads, and so does a `-home` name without `failback = "home"` (no such
    // cookie is made then).
    for (cookie, app) in [("route", "JSESSIONID"), ("srv", "srv-home")] {
        let t = text(cookie, app);
        assert!(
            Config::from_text(Path::new("limpet.toml"), &t).is_ok(),
            "{cookie} {app}"
        );
    }
}

/// The HTTP listeners' timeouts and `trusted_proxies` on a tcp listener are refused at their
/// line: taken and never used, a `tunnel_idle = "1h"` (HAProxy's `timeout tunnel` carried
/// over) left the sessions ending at `idle` all the same, and `limpet check` said nothing.
#[test]
fn http_only_settings_on_a_tcp_listener_are_refused_at_their_line() {
    let tcp = |extra: &str| {
        format!(
            "{NODES}[[listeners]]\nname = \"raw\"\nbind = \"127.0.0.1:0\"\nmode = \"tcp\"\nnode_port = 9100\n{extra}"
        )
    };
    for k in [
        "upstream_answer",
        "client_idle",
        "answer_body_idle",
        "tunnel_idle",
        "upstream_idle",
    ] {
        let text = tcp(&format!("[listeners.timeouts]\n{k} = \"1h\"\n"));
        let e = error(&text);
        assert!(
            e.starts_with(&format!(
                "{}listeners[0].timeouts.{k}: only for mode = \"http\"",
                at_value(&text, &format!("{k} = \"1h\""))
            )),
            "{k}: {e}"
        );
    }
    let text = tcp("trusted_proxies = [\"10.0.0.0/8\"]\n");
    let e = error(&text);
    assert!(
        e.starts_with(&format!(
            "{}listeners[0].trusted_proxies: only for mode = \"http\"",
            at(&text, "\"10.0.0.0/8\"")
        )),
        "{e}"
    );
    // What a tcp listener runs on loads.
    let text = tcp("[listeners.timeouts]\nidle = \"1h\"\nconnect = \"2s\"\nheader_read = \"5s\"\n");
    assert!(Config::from_text(Path::new("limpet.toml"), &text).is_ok());
}

/// `[listeners.check]` errors point at the offending value (not the listener's name) and
/// name the listener by its index, table or inline.
#[test]
fn check_errors_name_the_offending_value_and_the_listener_index() {
    for (check, bad, key, says) in [
        (
            "[listeners.check]\nkind = \"http\"\npath = \"health\"\n",
            "path = \"health\"",
            "path",
            "must start with /",
        ),
        (
            "check = { kind = \"http\", path = \"/a<b>\" }\n",
            "path = \"/a<b>\"",
            "path",
            "",
        ),
        (
            "check = { kind = \"http\", path = \"/health#x\" }\n",
            "path = \"/health#x\"",
            "path",
            "",
        ),
        (
            "check = { kind = \"http\", path = \"/é\" }\n",
            "path = \"/é\"",
            "path",
            "",
        ),
        (
            "[listeners.check]\nkind = \"http\"\n\nmethod = \"G T\"\n",
            "method = \"G T\"",
            "method",
            "is not an HTTP method",
        ),
        (
            "check = { kind = \"http\", host = \"a\\u0001b\" }\n",
            "host = \"a\\u0001b\"",
            "host",
            "cannot be a Host header",
        ),
        (
            "check = { kind = \"http\", host = \"print example\" }\n",
            "host = \"print example\"",
            "host",
            "cannot be a Host header",
        ),
        (
            "[listeners.check]\nkind = \"http\"\nexpect = \"2xx\"\n",
            "expect = \"2xx\"",
            "expect",
            "",
        ),
        (
            "check = { kind = \"htp\" }\n",
            "kind = \"htp\"",
            "kind",
            "did you mean \"http\"?",
        ),
        (
            "check = { kind = \"tls\" }\n",
            "kind = \"tls\"",
            "kind",
            "upstream_tls",
        ),
        (
            "[listeners.check]\nkind = \"tls\"\nverify = \"yes\"\n",
            "verify = \"yes\"",
            "verify",
            "only \"none\"",
        ),
        (
            "check = { kind = \"tls\", verify = \"none\", server_name = \"a b\" }\n",
            "server_name = \"a b\"",
            "server_name",
            "is not a server name",
        ),
        (
            "[listeners.check]\nkind = \"tcp\"\nport = 0\n",
            "port = 0",
            "port",
            "port 0",
        ),
    ] {
        let text = format!("{NODES}{TWO_LISTENERS}{check}");
        let e = error(&text);
        assert!(
            e.starts_with(&format!(
                "{}listeners[1].check.{key}: ",
                at_value(&text, bad)
            )),
            "{check:?}: {e}"
        );
        assert!(e.contains(says), "{check:?}: {e}");
    }
    // A node's `check_port` of 0 too, at its line.
    let text = format!(
        "[[nodes]]\nname = \"a\"\naddress = \"127.0.0.2\"\ncheck_port = 0\n\n{TWO_LISTENERS}check = {{ kind = \"tcp\" }}\n"
    );
    let e = error(&text);
    assert!(
        e.starts_with(&format!(
            "{}nodes[0].check_port: port 0 cannot be connected to",
            at_value(&text, "check_port = 0")
        )),
        "{e}"
    );
    let text = format!("{NODES}{TWO_LISTENERS}check = {{ kind = \"http\", path = \"/health?full=1\", method = \"HEAD\", host = \"print.example:8080\" }}\n");
    if let Err(e) = Config::from_text(Path::new("limpet.toml"), &text) {
        panic!("a good check is refused: {e}");
    }
}

/// A check's `tls` (whether an `http` check runs over TLS) is refused where it cannot mean
/// what it says, at the line of its value with the listener's index: on a `tcp` or `tls`
/// check; `true` on a listener with no upstream TLS settings to verify with (unless
/// `verify = "none"`); not a boolean. HAProxy's `check-ssl` in a check gets the key. What
/// is accepted: `tls = true` with `verify = "none"`, and over the listener's
/// `upstream_tls`; and `verify` or `server_name` on an `http` check that runs plain, which
/// loaded before checks could run over TLS (ignored, with a warning).
#[test]
fn a_check_s_tls_errors_name_the_value_and_the_listener_index() {
    let upstream = "upstream_tls = { verify = \"none\" }\n";
    for (check, bad, key, says) in [
        (
            "check = { kind = \"tcp\", tls = true }\n",
            "tls = true",
            "tls",
            "`tls` says whether an http check runs over TLS; a tcp check only opens the connection",
        ),
        (
            "[listeners.check]\nkind = \"tls\"\nverify = \"none\"\ntls = false\n",
            "tls = false",
            "tls",
            "a tls check is a TLS handshake",
        ),
        (
            "check = { kind = \"http\", path = \"/health\", tls = true }\n",
            "tls = true",
            "tls",
            "an http check over TLS verifies as the listener's upstream_tls does: configure upstream_tls, or set verify = \"none\"",
        ),
        (
            "[listeners.check]\nkind = \"http\"\ntls = \"yes\"\n",
            "tls = \"yes\"",
            "tls",
            "invalid type: string \"yes\", expected a boolean",
        ),
        (
            "check = { kind = \"http\", tls = true, verify = \"yes\" }\n",
            "verify = \"yes\"",
            "verify",
            "only \"none\"",
        ),
        (
            "check = { kind = \"http\", tls = true, verify = \"none\", server_name = \"a b\" }\n",
            "server_name = \"a b\"",
            "server_name",
            "is not a server name",
        ),
        (
            "check = { kind = \"http\", check-ssl = true }\n",
            "check-ssl = true",
            "check-ssl",
            "did you mean `tls`? (HAProxy's `check-ssl`)",
        ),
    ] {
        let text = format!("{NODES}{TWO_LISTENERS}{check}");
        let e = error(&text);
        // An unknown key is pointed at by its name, and named in the table that refused it.
        let at = if key == "check-ssl" {
            format!(
                "{}listeners[1].check.check-ssl: unknown field `check-ssl`",
                at(&text, bad)
            )
        } else {
            format!("{}listeners[1].check.{key}: ", at_value(&text, bad))
        };
        assert!(e.starts_with(&at), "{check:?}: {e}");
        assert!(e.contains(says), "{check:?}: {e}");
    }
    for good in [
        // Plain checks with TLS keys: ignored, as they were before checks could run over TLS.
        "check = { kind = \"http\", verify = \"none\" }\n".to_owned(),
        "[listeners.check]\nkind = \"http\"\ntls = false\nserver_name = \"n.example\"\n".to_owned(),
        format!("{upstream}check = {{ kind = \"http\", port = 8443, server_name = \"n.example\" }}\n"),
        format!("{upstream}check = {{ kind = \"http\", port = 8443, server_name = \"n.example\", tls = true }}\n"),
        format!("{upstream}check = {{ kind = \"http\", server_name = \"n.example\" }}\n"),
        "check = { kind = \"http\", tls = true, verify = \"none\" }\n".to_owned(),
        "check = { kind = \"http\", tls = false }\n".to_owned(),
    ] {
        let text = format!("{NODES}{TWO_LISTENERS}{good}");
        if let Err(e) = Config::from_text(Path::new("limpet.toml"), &text) {
            panic!("a good check is refused: {e}\n{text}");
        }
    }
}

/// Two listeners on one address: the second's `bind` value, by index.
#[test]
fn a_bind_taken_by_another_listener_names_its_line_and_index() {
    let text = format!(
        "{NODES}[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:5011\"\nnode_port = 80\n\n\
         [[listeners]]\nname = \"api\"\nnode_port = 81\nbind = [\"127.0.0.2:5012\", \"127.0.0.1:5011\"]\n"
    );
    let e = error(&text);
    assert!(
        e.starts_with(&format!(
            "{}listeners[1].bind: 127.0.0.1:5011 is already bound by listener \"web\"",
            at_value(&text, "bind = [\"127.0.0.2")
        )),
        "{e}"
    );
}

/// The admin listener on an address a listener binds (or one a wildcard of either covers):
/// refused by the check, at `admin.listen`, or at the listener's `bind` when `admin.listen`
/// is left to its default. Before, `limpet check` passed and `limpet run` failed at the bind
/// with no line.
#[test]
fn the_admin_listener_on_a_listener_s_address_names_its_place() {
    let web = |bind: &str| {
        format!("{NODES}[[listeners]]\nname = \"web\"\nbind = \"{bind}\"\nnode_port = 80\n\n")
    };
    let text = format!(
        "{}[admin]\nlisten = \"127.0.0.1:5011\"\n",
        web("127.0.0.1:5011")
    );
    let e = error(&text);
    assert!(
        e.starts_with(&format!(
            "{}admin.listen: 127.0.0.1:5011 is already bound by listener \"web\"",
            at_value(&text, "listen = \"127.0.0.1:5011\"")
        )),
        "{e}"
    );
    let text = format!(
        "{}[admin]\nlisten = \"127.0.0.1:5013\"\n",
        web("0.0.0.0:5013")
    );
    let e = error(&text);
    assert!(
        e.starts_with(&format!(
            "{}admin.listen: 127.0.0.1:5013 is already bound by listener \"web\"",
            at_value(&text, "listen = \"127.0.0.1:5013\"")
        )),
        "a wildcard listener covers it: {e}"
    );
    let text = format!("{}[admin]\n", web("127.0.0.1:9900"));
    let e = error(&text);
    assert!(
        e.starts_with(&format!(
            "{}listeners[0].bind: 127.0.0.1:9900 is the admin listener's address (the default of admin.listen)",
            at_value(&text, "bind = \"127.0.0.1:9900\"")
        )),
        "{e}"
    );
    let text = format!("{}[admin]\nlisten = \"127.0.0.1:5015\"\n", web("[::]:5015"));
    let e = error(&text);
    assert!(
        e.contains("admin.listen: 127.0.0.1:5015 is already bound by listener \"web\""),
        "`[::]` covers IPv4 too: {e}"
    );
    for good in [
        format!(
            "{}[admin]\nlisten = \"127.0.0.1:5014\"\n",
            web("127.0.0.1:5011")
        ),
        // A wildcard of one family leaves the other's addresses free.
        format!("{}[admin]\nlisten = \"[::1]:5016\"\n", web("0.0.0.0:5016")),
        format!(
            "{}[admin]\nlisten = \"127.0.0.2:5011\"\n",
            web("127.0.0.1:5011")
        ),
        format!("{}[admin]\nlisten = \"127.0.0.1:0\"\n", web("127.0.0.1:0")),
    ] {
        if let Err(e) = Config::from_text(Path::new("limpet.toml"), &good) {
            panic!("refused: {e}\n{good}");
        }
    }
}

/// Errors that used to point at the wrong line or key, or say the wrong thing: a signed
/// cookie's limits and key count at their own values (they pointed at the listener's name),
/// limits a name-mode cookie would silently ignore, a shared table without a store by its
/// index (it was named by its name in the index's place), a table size over the maximum with
/// the size given (it said 4294967295), and a file that is not UTF-8 at its first bad byte
/// (it named no line).
#[test]
fn errors_found_by_review_name_their_own_place() {
    const L: &str = "[[listeners]]\nname = \"l\"\nbind = \"127.0.0.1:0\"\nnode_port = 80\n";
    let key = "0123456789abcdef0123456789abcdef";
    let signed = |rest: &str| {
        format!("{NODES}{L}[listeners.cookie]\nmode = \"signed\"\nkeys = [\"{key}\"]\n{rest}")
    };
    let text = signed("max_idle = \"500ms\"\n");
    let e = error(&text);
    assert_eq!(
        e,
        format!(
            "{}listeners[0].cookie.max_idle: max_idle must be at least 1 second",
            at(&text, "\"500ms\"")
        )
    );
    let text = signed("max_lifetime = \"0s\"\n");
    assert!(
        error(&text).starts_with(&format!(
            "{}listeners[0].cookie.max_lifetime: ",
            at(&text, "\"0s\"")
        )),
        "{}",
        error(&text)
    );
    let nine = vec![format!("\"{key}\""); 9].join(", ");
    let text = format!("{NODES}{L}[listeners.cookie]\nmode = \"signed\"\nkeys = [{nine}]\n");
    let e = error(&text);
    assert!(
        e.starts_with(&format!(
            "{}listeners[0].cookie.keys: 9 keys",
            at(&text, &format!("[\"{key}\", "))
        )),
        "{e}"
    );
    let text = format!("{NODES}{L}[listeners.cookie]\nmode = \"signed\"\nkeys = []\n");
    let e = error(&text);
    assert!(
        e.starts_with(&format!(
            "{}listeners[0].cookie.keys: 0 keys",
            at(&text, "[]")
        )),
        "{e}"
    );

    let text = format!("{NODES}{L}[listeners.cookie]\nmax_idle = \"10m\"\n");
    assert_eq!(
        error(&text),
        format!(
            "{}listeners[0].cookie.max_idle: max_idle is for mode = \"signed\" (a node's name \
             carries no time)",
            at(&text, "\"10m\"")
        )
    );

    let text = format!(
        "{NODES}[[tables]]\nname = \"first\"\nkey = \"source-ip\"\n\
         [[tables]]\nname = \"second\"\nkey = \"source-ip\"\nshared = true\n"
    );
    let e = error(&text);
    assert!(
        e.contains("tables[1].shared: a shared table needs a [store]"),
        "{e}"
    );

    // Sessions seen are counted in minutes, a day of them at most.
    let text = format!("{NODES}{L}[drain]\nseen_window = \"25h\"\n");
    assert_eq!(
        error(&text),
        format!(
            "{}drain.seen_window: must be at most 24h",
            at(&text, "\"25h\"")
        )
    );

    // A shared table's name is part of its store keys: `a:b` keyed `x` and `a` keyed `b:x`
    // would share them. A local table may take the name.
    let store = "[store]\nurl = \"redis://127.0.0.1:6379/0\"\n";
    let text =
        format!("{NODES}{store}[[tables]]\nname = \"a:b\"\nheader = \"X-Tenant\"\nshared = true\n");
    let e = error(&text);
    assert!(
        e.starts_with(&format!(
            "{}tables[0].name: \"a:b\": a shared table's name is part of its store keys",
            at(&text, "\"a:b\"")
        )),
        "{e}"
    );
    let local = format!("{NODES}{L}[[tables]]\nname = \"a:b\"\nheader = \"X-Tenant\"\n");
    if let Err(e) = Config::from_text(Path::new("limpet.toml"), &local) {
        panic!("a local table named a:b: {e}");
    }

    let text =
        format!("{NODES}[[tables]]\nname = \"t\"\nkey = \"source-ip\"\nsize = 99999999999\n");
    let e = error(&text);
    assert!(
        e.starts_with(&format!(
            "{}tables[0].size: table size 99999999999 is over the maximum",
            at(&text, "99999999999")
        )),
        "{e}"
    );

    // Two tables saving to one file (by two spellings of it), or to the config itself.
    let text = format!(
        "{NODES}{L}[[tables]]\nname = \"t\"\nkey = \"source-ip\"\nsnapshot = \"pins.snap\"\n\
         [[tables]]\nname = \"u\"\nkey = \"source-ip\"\nsnapshot = \"./pins.snap\"\n"
    );
    assert_eq!(
        error(&text),
        format!(
            "{}tables[1].snapshot: table \"t\" saves to the same file",
            at(&text, "\"./pins.snap\"")
        )
    );
    let text = format!(
        "{NODES}{L}[[tables]]\nname = \"t\"\nkey = \"source-ip\"\nsnapshot = \"limpet.toml\"\n"
    );
    assert_eq!(
        error(&text),
        format!(
            "{}tables[0].snapshot: is this configuration file itself",
            at(&text, "\"limpet.toml\"")
        )
    );
    // The config reached another way: through `..`, or by its absolute path (the config is
    // `limpet.toml` in the working directory).
    let here = std::env::current_dir().expect("working directory");
    let dir = here
        .file_name()
        .expect("a directory name")
        .to_string_lossy();
    for other in [
        format!("../{dir}/limpet.toml"),
        here.join("limpet.toml").display().to_string(),
    ] {
        let text = format!(
            "{NODES}{L}[[tables]]\nname = \"t\"\nkey = \"source-ip\"\nsnapshot = \"{other}\"\n"
        );
        assert_eq!(
            error(&text),
            format!(
                "{}tables[0].snapshot: is this configuration file itself",
                at(&text, &format!("\"{other}\""))
            ),
            "{other}"
        );
    }

    // The admin state file: not the config, not a table's snapshot, not empty.
    let text = format!(
        "{NODES}{L}[[tables]]\nname = \"t\"\nkey = \"source-ip\"\nsnapshot = \"pins.snap\"\n\n\
         [admin]\nstate_file = \"./pins.snap\"\n"
    );
    assert_eq!(
        error(&text),
        format!(
            "{}admin.state_file: table \"t\" saves its snapshot to the same file",
            at(&text, "\"./pins.snap\"")
        )
    );
    for (path, why) in [
        ("limpet.toml", "is this configuration file itself"),
        ("", "empty path"),
    ] {
        let text = format!("{NODES}{L}[admin]\nstate_file = \"{path}\"\n");
        assert_eq!(
            error(&text),
            format!(
                "{}admin.state_file: {why}",
                at(&text, &format!("\"{path}\"\n"))
            )
        );
    }

    // More distinct checks of one node than the core keeps apart (64): refused at the
    // check that would be the 65th; 64 load.
    let listeners = |n: usize| {
        (0..n)
            .map(|i| {
                format!(
                    "[[listeners]]\nname = \"l{i}\"\nbind = \"127.0.0.1:{}\"\nnode_port = 80\n\
                     check = {{ kind = \"http\", path = \"/c{i}\" }}\n\n",
                    20000 + i
                )
            })
            .collect::<String>()
    };
    assert!(Config::from_text(
        Path::new("limpet.toml"),
        &format!("{NODES}{}", listeners(64))
    )
    .is_ok());
    let text = format!("{NODES}{}", listeners(65));
    let e = error(&text);
    assert!(
        e.starts_with(&format!(
            "{}listeners[64].check.kind: node \"a\" would have more than 64 distinct checks",
            at(&text, "\"http\", path = \"/c64\"")
        )),
        "{e}"
    );

    // A zoned link-local node address: the zone would be dropped.
    let text = format!("[[nodes]]\nname = \"a\"\naddress = \"fe80::1%lo\"\n{L}");
    assert!(
        error(&text).starts_with(&format!("{}nodes[0].address: ", at(&text, "\"fe80"))),
        "{}",
        error(&text)
    );

    // Inside an inline table, and an array over several lines: the key and the element.
    let text = format!("{NODES}{L}timeouts = {{ connect = \"5s\", idle = 5 }}\n");
    let e = error(&text);
    assert!(
        e.starts_with(&format!("{}listeners[0].timeouts.idle: ", at(&text, "5 }"))),
        "{e}"
    );
    let text = format!("{NODES}{L}trusted_proxies = [\n  \"10.0.0.0/8\",\n  5,\n]\n");
    let e = error(&text);
    assert!(
        e.starts_with(&format!(
            "{}listeners[0].trusted_proxies[1]: ",
            at(&text, "5,")
        )),
        "{e}"
    );

    let dir = TempDir::new("config-utf8");
    let mut bytes = NODES.as_bytes().to_vec();
    bytes.extend_from_slice(b"# caf\xe9\n");
    let path = dir.write("latin1.toml", &bytes);
    let e = match Config::load(&path) {
        Ok(_) => panic!("accepted a file that is not UTF-8"),
        Err(e) => e.to_string().replace(&path.display().to_string(), "F"),
    };
    assert_eq!(
        e, "F:5:6: not valid UTF-8 from here (a config file is UTF-8 text)",
        "the é of `café`, in Latin-1, on line 5"
    );
}

/// `[admin] hosts` takes DNS names only: one with a port, an IP address or an empty one is
/// refused at its own place in the array.
#[test]
fn admin_hosts_name_a_bad_entry_at_its_place() {
    const L: &str = "[[listeners]]\nname = \"l\"\nbind = \"127.0.0.1:0\"\nnode_port = 80\n";
    for bad in ["lb1.example.net:9900", "10.0.0.5", "", "a..b"] {
        let text = format!(
            "{NODES}{L}[admin]\nlisten = \"127.0.0.1:0\"\nhosts = [\"lb1.example.net\", \"{bad}\"]\n"
        );
        let e = error(&text);
        assert!(
            e.starts_with(&format!(
                "{}admin.hosts[1]: expected a DNS name",
                at(&text, &format!("\"{bad}\"]"))
            )),
            "{bad:?}: {e}"
        );
    }
    // Any case, an underscore, a trailing dot: taken.
    let ok = format!(
        "{NODES}{L}[admin]\nlisten = \"127.0.0.1:0\"\nhosts = [\"LB1.example.net\", \"lb_2.internal.\"]\n"
    );
    assert!(
        Config::from_text(Path::new("limpet.toml"), &ok).is_ok(),
        "{ok}"
    );
}

/// Listeners that pin a client machine through different source-address tables (or one
/// through none) keep two sessions for a client that uses both: `limpet check` accepts the
/// file and warns, naming the listener's place; listeners on one table, or one keyed on the
/// application's own session, draw no warning.
#[test]
fn listeners_on_different_tables_are_warned_of() {
    let dir = TempDir::new("split-tables");
    let text = format!(
        "{NODES}[[tables]]\nname = \"t\"\nkey = \"source-ip\"\n\n\
         [[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = 80\n\n\
         [[listeners]]\nname = \"raw\"\nbind = \"127.0.0.1:0\"\nmode = \"tcp\"\nnode_port = 81\n\
         table = \"t\"\n"
    );
    let check = |text: &str| warnings_of(&dir, text);
    let stderr = check(&text);
    let (line, col) = (
        text[..text.find("name = \"web\"").unwrap_or(0)]
            .matches('\n')
            .count()
            + 1,
        8,
    );
    assert!(
        stderr.contains(&format!(
            "F:{line}:{col}: listeners[0].name: listener \"web\" pins by no table, listener \"raw\" by table \"t\""
        )),
        "{stderr}"
    );
    let one_table = text.replace("node_port = 80\n", "node_port = 80\ntable = \"t\"\n");
    assert!(
        !check(&one_table).contains("pins by"),
        "one table: no warning"
    ); // A listener keyed on the application's own session is another kind of session.
    let app_session = text.replace("node_port = 80\n", "node_port = 80\ntable = \"s\"\n")
        + "\n[[tables]]\nname = \"s\"\napp_cookie = \"JSESSIONID\"\n";
    assert!(
        !check(&app_session).contains("pins by"),
        "an application-session table: no warning"
    );
    // No source-address table at all: a TCP listener with none beside an HTTP listener
    // balances each connection by itself, apart from the client's requests.
    let no_table = text.replace("table = \"t\"\n", "");
    assert!(
        check(&no_table).contains(
            "listeners[1].name: tcp listener \"raw\" pins by no table: each of its connections is balanced by itself"
        ),
        "{no_table}"
    );
    // On one table, a listener that reads client addresses from PROXY headers beside one
    // that reads its sockets', and an HTTP listener keying on its proxy's address.
    let pp = format!("{one_table}[listeners.proxy_protocol]\naccept_from = [\"10.0.0.0/8\"]\n");
    assert!(
        check(&pp).contains(
            "listeners[1].name: listener \"raw\" and listener \"web\" share table \"t\" but trust PROXY headers from different senders"
        ),
        "{pp}"
    );
    let behind = one_table.replace(
        "node_port = 80\ntable = \"t\"\n",
        "node_port = 80\ntable = \"t\"\ntrusted_proxies = [\"10.0.0.5\"]\n",
    );
    assert!(
        check(&behind).contains(
            "listeners[0].trusted_proxies: listener \"web\" trusts proxies and pins by source-ip table \"t\""
        ),
        "{behind}"
    );
    // One that reads PROXY headers keys on the client's address, whatever proxies it trusts.
    let reads_headers = behind.replace(
        "trusted_proxies = [\"10.0.0.5\"]\n",
        "trusted_proxies = [\"10.0.0.5\"]\n[listeners.proxy_protocol]\naccept_from = [\"10.0.0.5/32\"]\n",
    );
    assert!(
        !check(&reads_headers).contains("trusts proxies"),
        "{reads_headers}"
    );
    assert!(
        !check(&one_table).contains("PROXY headers")
            && !check(&one_table).contains("trusts proxies"),
        "one table, one way to read addresses: no warning"
    );
}

/// A listener's or table's name that would break a Prometheus scrape or a log line is
/// refused at its line: `prometheus-client` writes label values as they are, so one `"`,
/// `\` or line break in `listener="..."` or `table="..."` made the whole `/metrics` text
/// unreadable, and a TCP session's access line writes its listener's name. Before, any name
/// but an empty one was taken.
#[test]
fn listener_and_table_names_that_break_metric_labels_or_log_lines_are_refused() {
    const TABLE: &str = "[[tables]]\nname = \"t\"\nkey = \"source-ip\"\n\n";
    const LISTENER: &str =
        "[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = 80\ntable = \"t\"\n";
    // (the name as the TOML file writes it, the character the error names)
    let bad = [
        (r#""we\"b""#, r#"'"'"#),
        (r#""we\\b""#, r"'\\'"),
        (r#""we\nb""#, r"'\n'"),
        (r#""we\u0085b""#, r"'\u{85}'"),
        (r#""we\u2028b""#, r"'\u{2028}'"),
        (r#""we\u009bb""#, r"'\u{9b}'"),
    ];
    for (name, c) in bad {
        let listener = LISTENER.replace("\"web\"", name);
        let text = format!("{NODES}{TABLE}{listener}");
        let e = error(&text);
        let want = format!(
            "{}listeners[0].name: ",
            at_value(&text, &format!("name = {name}"))
        );
        assert!(e.starts_with(&want), "{name}: {e}");
        assert!(e.contains(&format!("holds {c}")), "{name}: {e}");
        assert!(e.contains("a listener name is a metric label value"), "{e}");

        let table = TABLE.replace("\"t\"", name);
        let listener = LISTENER.replace("\"t\"", name);
        let text = format!("{NODES}{table}{listener}");
        let e = error(&text);
        let want = format!(
            "{}tables[0].name: ",
            at_value(&text, &format!("name = {name}"))
        );
        assert!(e.starts_with(&want), "{name}: {e}");
        assert!(e.contains(&format!("holds {c}")), "{name}: {e}");
        assert!(e.contains("a table name is a metric label value"), "{e}");
    }
    // Anything else printable stays a name, spaces and non-ASCII letters included.
    let text = format!(
        "{NODES}{}{}",
        TABLE.replace("\"t\"", "\"by ip/24 é\""),
        LISTENER
            .replace("\"web\"", "\"web front-1 (ü)\"")
            .replace("\"t\"", "\"by ip/24 é\"")
    );
    assert!(
        Config::from_text(Path::new("limpet.toml"), &text).is_ok(),
        "{text}"
    );
}

/// What `limpet check` says of `text` (written as `limpet.toml` in `dir`) at `warn`, the
/// file's path written `F`; the check must pass.
fn warnings_of(dir: &TempDir, text: &str) -> String {
    let path = dir.write("limpet.toml", text);
    let out = limpet()
        .args(["check", "-c"])
        .arg(&path)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run limpet check");
    let stderr = String::from_utf8_lossy(&out.stderr).replace(&path.display().to_string(), "F");
    assert!(out.status.success(), "{stderr}");
    stderr
}

/// A store url on a database other than 0 with the default prefix is warned of, at its
/// line: publish/subscribe ignores the database, so fleets kept apart by database alone
/// would share the re-pin channel. A prefix of its own, or database 0, draws none.
#[test]
fn a_store_database_under_the_default_prefix_is_warned_of() {
    let dir = TempDir::new("store-db");
    let check = |store: &str| {
        let text = format!(
            "{NODES}[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = 80\n\n\
             [store]\n{store}"
        );
        let stderr = warnings_of(&dir, &text);
        let line = text[..text.find("url =").unwrap_or(0)]
            .matches('\n')
            .count()
            + 1;
        (stderr, line)
    };
    let (stderr, line) = check("url = \"redis://127.0.0.1:6379/2\"\n");
    assert!(
        stderr.contains(&format!(
            "F:{line}:7: store.url: database 2 with the default prefix"
        )),
        "{stderr}"
    );
    for quiet in [
        "url = \"redis://127.0.0.1:6379/2\"\nprefix = \"shop:\"\n",
        "url = \"redis://127.0.0.1:6379/0\"\n",
        "url = \"redis://127.0.0.1:6379\"\n",
    ] {
        let (stderr, _) = check(quiet);
        assert!(!stderr.contains("default prefix"), "{quiet}: {stderr}");
    }
}

/// Two listeners asking a node for the same check another way (one sends its nodes a PROXY
/// header, the other none; or TLS trusting other things) share one check, the last one's:
/// warned of, at the check, naming both ways. The same check asked alike draws nothing.
#[test]
fn one_check_asked_two_ways_is_warned_of() {
    let dir = TempDir::new("check-two-ways");
    let listener = |name: &str, extra: &str| {
        format!(
            "[[listeners]]\nname = \"{name}\"\nbind = \"127.0.0.1:0\"\nmode = \"tcp\"\n\
             node_port = 9000\ncheck = {{ kind = \"tcp\" }}\n{extra}\n"
        )
    };
    let text = format!(
        "{NODES}{}{}",
        listener("a", "proxy_protocol = { send = \"v1\" }\n"),
        listener("b", "")
    );
    let stderr = warnings_of(&dir, &text);
    let line = text[..text.rfind("check = ").unwrap_or(0)]
        .matches('\n')
        .count()
        + 1;
    assert!(
        stderr.contains(&format!(
            "F:{line}:18: listeners[1].check.kind: node \"a\": the same check as listeners[0]'s (tcp 127.0.0.2:9000), made another way (plain, against plain, PROXY v1): one runs, this listener's"
        )),
        "{stderr}"
    );
    let alike = format!("{NODES}{}{}", listener("a", ""), listener("b", ""));
    assert!(!warnings_of(&dir, &alike).contains("another way"));
}
