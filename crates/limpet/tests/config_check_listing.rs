//! `limpet check -c FILE` prints the whole configuration as it would run, defaults included,
//! as TOML: saved to a file and checked again, it prints the same listing. Secrets are
//! printed as `"<redacted>"`, which check refuses until the real value is back.

mod common;

use std::path::Path;
use std::process::Command;

use common::multiport::{Pki, TempDir};

const TOKEN: &str = "admin-token-0123456789";
const KEY_NEW: &str = "0123456789abcdef0123456789abcdef-new";
const KEY_OLD: &str = "0123456789abcdef0123456789abcdef-old";

/// `limpet check -c path`: (exit code, stdout, stderr).
fn check(path: &Path) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_limpet"))
        .args(["check", "-c"])
        .arg(path)
        .output()
        .expect("run limpet check");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The listing without its last line (`# FILE: configuration OK`, which names the file).
fn listing(path: &Path) -> String {
    let (code, out, err) = check(path);
    assert_eq!(code, Some(0), "{}\n{out}\n{err}", path.display());
    let body = out
        .strip_suffix(&format!("# {}: configuration OK\n", path.display()))
        .unwrap_or_else(|| panic!("no verdict line at the end:\n{out}"));
    body.to_owned()
}

#[test]
fn a_small_file_is_listed_with_every_default_and_reads_back_the_same() {
    let dir = TempDir::new("listing-small");
    let path = dir.write(
        "limpet.toml",
        "[[nodes]]\nname = \"a\"\naddress = \"10.0.0.1\"\n\n[[listeners]]\nname = \"web\"\nbind = \"0.0.0.0:80\"\nnode_port = 8080\n",
    );
    let first = listing(&path);
    for default in [
        "[health]\nfall = 3\nrise = 2\nfail_timeout = \"10s\"\nmax_slow_answers = 0\ninterval = \"2s\"\ntimeout = \"2s\"\njitter = \"200ms\"\n",
        "[drain]\nspread = \"1m\"\nidle = \"1m\"\nseen_window = \"10m\"\n",
        "[[nodes]]\nname = \"a\"\naddress = \"10.0.0.1\"\nweight = 1\n",
        "bind = [\"0.0.0.0:80\"]\nmode = \"http\"\nnode_port = 8080\nbalance = \"round-robin\"\n",
        "max_connections = 10000\nh2_max_concurrent_streams = 100\n",
        "[listeners.cookie]\nenabled = true\nname = \"route\"\npath = \"/\"\n",
        "http_only = true\nsecure = false\nsame_site = \"lax\"\nkeep_in_request = false\nfailback = \"none\"\nmode = \"name\"\n",
        "[listeners.timeouts]\nconnect = \"3s\"\nidle = \"1m\"\nheader_read = \"15s\"\nupstream_answer = \"1m\"\nclient_idle = \"1m\"\nanswer_body_idle = \"1m\"\ntunnel_idle = \"5m\"\nupstream_idle = \"4s\"\ndrain = \"10s\"\nproxy_header = \"5s\"\n",
    ] {
        assert!(first.contains(default), "missing {default:?} in:\n{first}");
    }
    // Pasted into a file elsewhere and checked: the same listing.
    let other = TempDir::new("listing-small-again");
    let again = other.write("pasted.toml", &first);
    assert_eq!(listing(&again), first);
}

#[test]
fn a_full_file_round_trips_with_its_secrets_redacted() {
    let pki = Pki::new();
    let (cert, key) = pki.issue("site", &["print.example"]);
    let (cert2, key2) = pki.issue("other", &["other.example"]);
    let dir = TempDir::new("listing-full");
    std::fs::copy(&cert, dir.path().join("site.pem")).expect("cert");
    std::fs::copy(&key, dir.path().join("site.key")).expect("key");
    let text = format!(
        r#"
[health]
fall = 2
rise = 3
fail_timeout = "30s"
max_slow_answers = 4
interval = "5s"

[drain]
spread = "90s"

[admin]
listen = "127.0.0.1:0"
token = "{TOKEN}"

[[nodes]]
name = "LVIV"
address = "localhost"

[[nodes]]
name = "KYIV"
address = "127.0.0.3"
weight = 2
check_port = 9000

[[tables]]
name = "terminal"
key = "source-ip"
ipv4_prefix = 24
size = "100k"
snapshot = "terminal.snapshot"
snapshot_interval = "5m"

[[tables]]
name = "by-id"
header = "X-Terminal-Id"
expire = "8h"

[[tables]]
name = "sessions"
app_cookie = "JSESSIONID"

[[listeners]]
name = "terminal-tls"
bind = ["127.0.0.1:0", "127.0.0.1:0"]
node_port = "same"
balance = "leastconn"
table = "terminal"
trusted_proxies = ["10.0.0.0/8"]
max_connections = "2k"
check = {{ kind = "http", port = 8081, path = "/health", expect = "200" }}

[listeners.cookie]
name = "srv"
max_age = "8h"
same_site = "strict"
failback = "home"
mode = "signed"
keys = ["{KEY_NEW}", "{KEY_OLD}"]

[listeners.tls]
cert = "site.pem"
key = "site.key"

[[listeners.tls.certs]]
cert = "{cert2}"
key = "{key2}"
names = ["other.example"]

[listeners.upstream_tls]
ca = "{ca}"
server_name = "nodes.internal"

[listeners.proxy_protocol]
accept_from = ["10.0.0.5", "192.168.0.0/16"]

[listeners.timeouts]
upstream_answer = "90s"

[[listeners]]
name = "raw"
bind = "127.0.0.1:0"
mode = "tcp"
node_port = 5555
table = "terminal"
close_on_node_down = false
proxy_protocol = {{ send = "v2" }}
timeouts = {{ idle = "10m", connect = "1500ms" }}

[[listeners]]
name = "plain"
bind = "127.0.0.1:0"
node_port = 80
table = "by-id"
"#,
        cert2 = cert2.display(),
        key2 = key2.display(),
        ca = pki.ca_pem.display(),
    );
    let path = dir.write("limpet.toml", &text);
    let first = listing(&path);

    // Defaults and resolved values.
    let abs = std::path::absolute(dir.path()).expect("absolute dir");
    for expected in [
        "[health]\nfall = 2\nrise = 3\nfail_timeout = \"30s\"\nmax_slow_answers = 4\ninterval = \"5s\"\ntimeout = \"5s\"\njitter = \"500ms\"\n".to_owned(),
        "spread = \"1m30s\"\n".to_owned(),
        "address = \"localhost\"  # 127.0.0.1 now\n".to_owned(),
        "weight = 2\ncheck_port = 9000\n".to_owned(),
        "ipv4_prefix = 24\nipv6_prefix = 128\nexpire = \"30m\"\nsize = 102400\n".to_owned(),
        format!("snapshot = \"{}\"\nsnapshot_interval = \"5m\"\n", abs.join("terminal.snapshot").display()),
        "header = \"X-Terminal-Id\"\nexpire = \"8h\"\nsize = 100000\n".to_owned(),
        "node_port = \"same\"\nbalance = \"leastconn\"\ntable = \"terminal\"\n".to_owned(),
        "trusted_proxies = [\"10.0.0.0/8\"]\nmax_connections = 2048\nh2_max_concurrent_streams = 100\n".to_owned(),
        // Plain, though the listener has upstream_tls: `node_port = "same"`, so the check
        // goes to a port of its own (HAProxy's check `port` without `check-ssl`).
        "check = { kind = \"http\", port = 8081, path = \"/health\", method = \"GET\", expect = \"200\", tls = false }\n".to_owned(),
        format!("cert = \"{}\"\nkey = \"{}\"\n", abs.join("site.pem").display(), abs.join("site.key").display()),
        "names = [\"other.example\"]\n".to_owned(),
        "server_name = \"nodes.internal\"\n".to_owned(),
        "accept_from = [\"10.0.0.5/32\", \"192.168.0.0/16\"]\n\n[listeners.timeouts]".to_owned(),
        "accept_from = []\nsend = \"v2\"\n".to_owned(),
        "upstream_answer = \"1m30s\"\n".to_owned(),
        "mode = \"tcp\"\nnode_port = 5555\nbalance = \"round-robin\"\ntable = \"terminal\"\nclose_on_node_down = false\n".to_owned(),
        "connect = \"1s500ms\"\nidle = \"10m\"\n".to_owned(),
        // A listener with a table and no cookie section has no cookie, said explicitly.
        "table = \"by-id\"\nclose_on_node_down = true\ntrusted_proxies = []\nmax_connections = 10000\nh2_max_concurrent_streams = 100\n\n[listeners.cookie]\nenabled = false\n".to_owned(),
        "max_age = \"8h\"\nhttp_only = true\nsecure = false\nsame_site = \"strict\"\nkeep_in_request = false\nfailback = \"home\"\nmode = \"signed\"\n".to_owned(),
        "max_idle = \"30m\"\nmax_lifetime = \"12h\"\n".to_owned(),
    ] {
        assert!(first.contains(&expected), "missing {expected:?} in:\n{first}");
    }

    // Secrets never appear; each is a placeholder, and there are as many as secrets.
    for secret in [TOKEN, KEY_NEW, KEY_OLD] {
        assert!(!first.contains(secret), "{secret} printed:\n{first}");
    }
    assert!(first.contains("token = \"<redacted>\"\n"), "{first}");
    assert!(
        first.contains("keys = [\"<redacted>\", \"<redacted>\"]\n"),
        "{first}"
    );

    // The listing as it is, elsewhere: refused at a placeholder, never run with one. The
    // cookie keys are checked first (listeners before `[admin]`), then the token.
    let other = TempDir::new("listing-full-again");
    let line_of = |text: &str, needle: &str| {
        text[..text
            .find(needle)
            .unwrap_or_else(|| panic!("{needle} in {text}"))]
            .matches('\n')
            .count()
            + 1
    };
    let pasted = other.write("pasted.toml", &first);
    let (code, _, err) = check(&pasted);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "pasted.toml:{}:8: listeners[0].cookie.keys: \"<redacted>\" is the placeholder `limpet check` prints for a secret",
            line_of(&first, "keys = ")
        )),
        "{err}"
    );
    let keys_back = first.replacen(
        "keys = [\"<redacted>\", \"<redacted>\"]",
        &format!("keys = [\"{KEY_NEW}\", \"{KEY_OLD}\"]"),
        1,
    );
    let pasted = other.write("pasted.toml", &keys_back);
    let (code, _, err) = check(&pasted);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "pasted.toml:{}:9: admin.token: \"<redacted>\" is the placeholder",
            line_of(&first, "token = ")
        )),
        "{err}"
    );

    // With the secrets put back, the same listing again.
    let restored = keys_back.replacen("token = \"<redacted>\"", &format!("token = \"{TOKEN}\""), 1);
    let pasted = other.write("restored.toml", &restored);
    assert_eq!(listing(&pasted), first);
}

/// Keys a check of another kind reads are ignored and said, at their line, by `limpet
/// check`: `path`, `method`, `host`, `expect` on a `tcp` or `tls` check, `verify` and
/// `server_name` on a `tcp` one, and the TLS keys of an `http` check that runs plain. The
/// file still loads (it loaded before they were said), and the listing leaves the `tcp`
/// check's TLS keys out. Before, nothing was said, and `limpet check` showed no warning at
/// all: it did not set up the log.
#[test]
fn keys_a_check_of_another_kind_reads_are_ignored_and_said_at_their_line() {
    let dir = TempDir::new("check-foreign-keys");
    let text = "[[nodes]]\nname = \"a\"\naddress = \"127.0.0.2\"\n\n\
        [[listeners]]\nname = \"raw\"\nbind = \"127.0.0.1:0\"\nmode = \"tcp\"\nnode_port = 9100\n\
        check = { kind = \"tcp\", path = \"/health\", verify = \"none\" }\n\n\
        [[listeners]]\nname = \"ipps\"\nbind = \"127.0.0.1:0\"\nmode = \"tcp\"\nnode_port = 443\n\
        check = { kind = \"tls\", verify = \"none\", expect = \"200\" }\n\n\
        [[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = 80\n\
        check = { kind = \"http\", server_name = \"n.example\" }\n";
    let path = dir.write("limpet.toml", text);
    let (code, out, err) = check(&path);
    assert_eq!(code, Some(0), "{out}\n{err}");
    // FILE:LINE:COLUMN of a value, as configuration errors point at it.
    let at = |value: &str| {
        let i = text
            .find(value)
            .unwrap_or_else(|| panic!("{value} in the text"));
        let line = text[..i].matches('\n').count() + 1;
        let col = i - text[..i].rfind('\n').map_or(0, |n| n + 1) + 1;
        format!("{}:{line}:{col}: ", path.display())
    };
    for (value, key, says) in [
        (
            "\"/health\"",
            "listeners[0].check.path",
            "ignored: a tcp check only opens a connection; `path` is for an http check",
        ),
        (
            "\"none\" }\n\n[[listeners]]\nname = \"ipps\"",
            "listeners[0].check.verify",
            "ignored: a tcp check only opens a connection; `verify` is for a check over TLS",
        ),
        (
            "\"200\"",
            "listeners[1].check.expect",
            "ignored: a tls check only completes a TLS handshake; `expect` is for an http check",
        ),
        (
            "\"n.example\"",
            "listeners[2].check.server_name",
            "ignored: this http check runs plain",
        ),
    ] {
        let line = format!("{}{key}: {says}", at(value));
        assert!(err.contains(&line), "no {line:?} in:\n{err}");
    }
    assert!(
        out.contains("check = { kind = \"tcp\" }"),
        "the tcp check's listing without the keys it ignores:\n{out}"
    );
}

/// A node-state file given relative to a config that `-c` names by a relative path is listed
/// absolute, as every other path is: saved elsewhere and checked, the listing names the same
/// file. Before, it was listed relative to the directory `check` ran in (`conf/nodes.state`),
/// which the saved listing then read relative to its own directory: another file, and every
/// node's MAINT or DRAIN gone at the next start from it.
#[test]
fn a_state_file_given_relative_is_listed_absolute() {
    let dir = TempDir::new("listing-state-file");
    let conf = dir.path().join("conf");
    std::fs::create_dir_all(&conf).expect("conf dir");
    std::fs::write(
        conf.join("limpet.toml"),
        "[[nodes]]\nname = \"a\"\naddress = \"10.0.0.1\"\n\n[[listeners]]\nname = \"web\"\n\
         bind = \"127.0.0.1:0\"\nnode_port = 8080\n\n[admin]\nlisten = \"127.0.0.1:0\"\n\
         state_file = \"nodes.state\"\n",
    )
    .expect("write config");
    let out = Command::new(env!("CARGO_BIN_EXE_limpet"))
        .args(["check", "-c", "conf/limpet.toml"])
        .current_dir(dir.path())
        .output()
        .expect("run limpet check");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    let want = format!("state_file = \"{}\"", conf.join("nodes.state").display());
    assert!(text.contains(&want), "{want} not in:\n{text}");
    let first = text
        .strip_suffix("# conf/limpet.toml: configuration OK\n")
        .unwrap_or_else(|| panic!("no verdict line at the end:\n{text}"))
        .to_owned();
    let other = TempDir::new("listing-state-file-again");
    let again = other.write("pasted.toml", &first);
    assert_eq!(listing(&again), first);
}
