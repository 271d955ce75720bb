//! `limpet probe --help` (the built binary) as a first user reads it: the exit codes a script
//! acts on and examples to start from, each example accepted by the probe's own parser.

use std::process::Command;

use clap::Parser;
use limpet::probe::ProbeArgs;

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    args: ProbeArgs,
}

fn help(flag: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_limpet"))
        .args(["probe", flag])
        .output()
        .expect("run limpet probe");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).expect("help is UTF-8")
}

/// The words of one shell command line: `'...'` quotes, no other shell syntax.
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut quoted = false;
    let mut in_word = false;
    for c in line.chars() {
        match c {
            '\'' => {
                quoted = !quoted;
                in_word = true;
            }
            ' ' if !quoted => {
                if in_word {
                    out.push(std::mem::take(&mut word));
                }
                in_word = false;
            }
            c => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        out.push(word);
    }
    out
}

#[test]
fn help_lists_the_exit_codes_and_examples() {
    for flag in ["--help", "-h"] {
        let text = help(flag);
        for want in [
            "Exit codes:",
            "  0  PASS: every session kept affinity",
            "  1  FAIL: at least one session broke affinity",
            "  2  usage error, or the run cannot pass",
            "fewer\n     than two answers naming its node (wrong --node-header?)",
            "Examples:",
            "limpet probe http://127.0.0.1:8080/ --ws /ws",
            "--header 'Authorization: Bearer TOKEN' --cookie 'session=abc123'",
            "docs/probe.md",
            "--header <NAME: VALUE>",
            "--cookie <NAME=VALUE>",
        ] {
            assert!(
                text.contains(want),
                "{flag}: {want:?} missing from:\n{text}"
            );
        }
    }
}

#[test]
fn every_example_in_the_help_parses() {
    let text = help("--help");
    let examples = text
        .split_once("Examples:\n")
        .map(|(_, rest)| rest)
        .expect("an Examples section");
    // Join `\` continuations, stop at the section's end.
    let joined = examples.replace(" \\\n", " ");
    let mut n = 0;
    for line in joined.lines().map(str::trim).take_while(|l| !l.is_empty()) {
        let command = line.split(" | ").next().unwrap_or_default();
        let argv = words(command);
        assert_eq!(
            argv.get(..2),
            Some(&["limpet".to_owned(), "probe".to_owned()][..])
        );
        Cli::try_parse_from(&argv[1..]).unwrap_or_else(|e| panic!("{line}: {e}"));
        n += 1;
    }
    assert!(n >= 3, "examples found: {n}\n{text}");
}
