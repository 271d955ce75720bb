//! Config files: every error names the file, line, column and key, unknown keys come with a
//! "did you mean", bad TLS files are config errors, and the shipped example validates.

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
    assert!(
        stdout.contains("listener terminal-tls 0.0.0.0:5012,0.0.0.0:5022,0.0.0.0:5610 http+tls"),
        "{stdout}"
    );
    assert!(
        stdout.contains("table terminal key source-ip /32 /128 expire 1800s size 100000"),
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
