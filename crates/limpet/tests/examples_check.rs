//! Every config in `examples/` passes `limpet check` as shipped, after the commands its own
//! comments document (`#   limpet cert ...`), run verbatim from a copy of the repository
//! layout; and the print-server example has the deployment's active health checks.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use limpet::config::Config;
use limpet::health::CheckKind;

fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

/// Every `*.toml` in `examples/`.
fn examples() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(examples_dir())
        .expect("examples/ exists")
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    v.sort();
    v
}

/// A temporary directory shaped like the repository root (`examples/` inside), removed on drop.
struct Root(PathBuf);

impl Root {
    fn new(tag: &str) -> Root {
        let dir = std::env::temp_dir().join(format!(
            "limpet-examples-{tag}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("examples")).expect("temp examples dir");
        Root(dir)
    }
}

impl Drop for Root {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The `limpet ...` command lines an example's comments document, in order.
fn documented_commands(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.trim_start().strip_prefix('#'))
        .map(str::trim)
        .filter(|l| l.starts_with("limpet "))
        .map(str::to_owned)
        .collect()
}

/// Runs a documented `limpet` command line from `cwd` (plain words, no shell quoting).
fn run_limpet(line: &str, cwd: &Path) -> Output {
    assert!(
        !line.contains(['\'', '"', '$', '|', '>']),
        "documented commands are plain words: {line}"
    );
    let mut words = line.split_whitespace();
    assert_eq!(words.next(), Some("limpet"));
    Command::new(env!("CARGO_BIN_EXE_limpet"))
        .args(words)
        .current_dir(cwd)
        .output()
        .unwrap_or_else(|e| panic!("run {line}: {e}"))
}

fn text_of(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn every_example_passes_limpet_check_after_its_documented_commands() {
    let all = examples();
    assert!(!all.is_empty(), "examples/ has configs");
    for example in all {
        let file = example
            .file_name()
            .and_then(|f| f.to_str())
            .expect("utf-8 file name")
            .to_owned();
        let text = std::fs::read_to_string(&example).expect("read example");
        let root = Root::new(file.trim_end_matches(".toml"));
        std::fs::copy(&example, root.0.join("examples").join(&file)).expect("copy example");

        let commands = documented_commands(&text);
        let check = format!("limpet check -c examples/{file}");
        assert!(
            commands.contains(&check),
            "{file} documents how to check it (`{check}`): {commands:?}"
        );
        // The prerequisites (`limpet cert`), exactly as documented, then the check itself.
        for line in commands
            .iter()
            .filter(|l| l.starts_with("limpet cert ") || l.starts_with("limpet check "))
        {
            let out = run_limpet(line, &root.0);
            assert!(out.status.success(), "{file}: `{line}`: {}", text_of(&out));
        }
        let out = run_limpet(&check, &root.0);
        assert!(out.status.success(), "{file}: {}", text_of(&out));
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("configuration OK"),
            "{file}: {}",
            text_of(&out)
        );
    }
}

#[test]
fn without_its_certificate_the_print_server_example_fails_the_check_and_cert_keeps_files() {
    let root = Root::new("no-cert");
    std::fs::copy(
        examples_dir().join("print-server.toml"),
        root.0.join("examples/print-server.toml"),
    )
    .expect("copy example");
    let check = "limpet check -c examples/print-server.toml";
    let out = run_limpet(check, &root.0);
    assert_eq!(out.status.code(), Some(2), "{}", text_of(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("listeners[1].tls.cert"),
        "{}",
        text_of(&out)
    );

    let cert = "limpet cert --out examples/certs --name ha-safeq --san print.example";
    let out = run_limpet(cert, &root.0);
    assert!(out.status.success(), "{}", text_of(&out));
    let pem = root.0.join("examples/certs/ha-safeq.pem");
    let first = std::fs::read(&pem).expect("certificate written");
    assert!(String::from_utf8_lossy(&first).starts_with("-----BEGIN CERTIFICATE-----"));
    let key = std::fs::read(root.0.join("examples/certs/ha-safeq.key")).expect("key written");
    assert!(String::from_utf8_lossy(&key).contains("PRIVATE KEY-----"));

    // A second run keeps the files (exit 2), --force replaces them.
    let out = run_limpet(cert, &root.0);
    assert_eq!(out.status.code(), Some(2), "{}", text_of(&out));
    assert_eq!(std::fs::read(&pem).expect("kept"), first);
    let out = run_limpet(&format!("{cert} --force"), &root.0);
    assert!(out.status.success(), "{}", text_of(&out));
    assert_ne!(std::fs::read(&pem).expect("replaced"), first);

    let out = run_limpet(check, &root.0);
    assert!(out.status.success(), "{}", text_of(&out));
}

#[test]
fn the_print_server_example_checks_every_node_every_5s_fall_3_rise_2() {
    let root = Root::new("checks");
    let path = root.0.join("examples/print-server.toml");
    std::fs::copy(examples_dir().join("print-server.toml"), &path).expect("copy example");
    let out = run_limpet("limpet cert --out examples/certs --name ha-safeq", &root.0);
    assert!(out.status.success(), "{}", text_of(&out));
    let cfg = Config::load(&path).unwrap_or_else(|e| panic!("{e}"));
    let checks = &cfg.lifecycle.checks;
    for node in ["LVIV", "KYIV"] {
        let mine: Vec<_> = checks.iter().filter(|(n, _)| n == node).collect();
        // HAProxy: `check inter 5s fall 3 rise 2` on the 5011 servers and `check port 5022`
        // on the TLS servers.
        let kinds: Vec<(&str, u16)> = mine
            .iter()
            .map(|(_, c)| (c.kind.as_str(), c.addr.port()))
            .collect();
        assert!(kinds.contains(&("tcp", 5011)), "{node}: {kinds:?}");
        assert!(kinds.contains(&("tls", 5022)), "{node}: {kinds:?}");
        for (_, c) in &mine {
            assert_eq!(c.interval, Duration::from_secs(5), "{node} {}", c.label());
            assert_eq!((c.fall, c.rise), (3, 2), "{node} {}", c.label());
            if let CheckKind::Tls(_) = c.kind {
                assert_eq!(c.addr.port(), 5022);
            }
        }
    }
}
