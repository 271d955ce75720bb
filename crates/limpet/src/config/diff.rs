//! What a reload changes, setting by setting.
//!
//! Both configurations are compared as `limpet check` lists them ([`Config::listing`]): every
//! default written out, durations and sizes in one spelling, secrets redacted. A setting
//! that was left to its default and is now written out with the same value is therefore no
//! change, and one that moved from `"60s"` to `"1m"` is none either.
//!
//! ```text
//!  running listing ─┐
//!                   ├─► toml tables ─► [[nodes]] / [[tables]] / [[listeners]] matched by name,
//!  new listing ─────┘                 other sections by key ─► "listener web: timeouts.queue: ..."
//! ```
//!
//! Entries added or removed as a whole (a node, a table, a section such as `[admin]`) are the
//! caller's to report, with what they mean for pins and sessions; this module names the
//! settings that changed inside entries both configurations have.
//!
//! [`Config::listing`]: super::Config::listing

use toml::{Table, Value};

/// The arrays of named entries, and the word a change line calls one of them.
const NAMED: [(&str, &str); 3] = [
    ("nodes", "node"),
    ("tables", "table"),
    ("listeners", "listener"),
];

/// A value longer than this is reported as changed, without the values.
const SHOWN: usize = 80;

/// The listing's sections in the order the listing writes them (any other after them).
const ORDER: [&str; 7] = [
    "health",
    "drain",
    "admin",
    "store",
    "nodes",
    "tables",
    "listeners",
];

/// The settings that differ between two listings, one line each, sections in listing order
/// and keys in alphabetical order within one: `health.fall: 3 -> 5`,
/// `listener web: timeouts.upstream_answer: "1m" -> "5s"`. Empty when either is not a
/// listing (a config not read from a file has none).
pub fn setting_changes(old: &str, new: &str) -> Vec<String> {
    let (Ok(old), Ok(new)) = (old.parse::<Table>(), new.parse::<Table>()) else {
        return Vec::new();
    };
    let mut sections: Vec<(&String, &Value)> = new.iter().collect();
    sections.sort_by_key(|(k, _)| ORDER.iter().position(|o| o == k).unwrap_or(ORDER.len()));
    let mut out = Vec::new();
    for (key, new_v) in sections {
        let Some(old_v) = old.get(key) else {
            continue;
        };
        if let Some((_, word)) = NAMED.iter().find(|(k, _)| k == key) {
            for (name, old_e, new_e) in matched(old_v, new_v) {
                let mut lines = Vec::new();
                diff_tables("", old_e, new_e, &mut lines);
                out.extend(lines.into_iter().map(|l| format!("{word} {name}: {l}")));
            }
        } else {
            diff_values(key, old_v, new_v, &mut out);
        }
    }
    out
}

/// The entries of two arrays of named tables that both have, by name, in the new order.
fn matched<'a>(old: &'a Value, new: &'a Value) -> Vec<(&'a str, &'a Table, &'a Table)> {
    let entries = |v: &'a Value| -> Vec<(&'a str, &'a Table)> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|e| {
                        let t = e.as_table()?;
                        Some((t.get("name")?.as_str()?, t))
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let old = entries(old);
    entries(new)
        .into_iter()
        .filter_map(|(name, n)| {
            let (_, o) = old.iter().find(|(o, _)| *o == name)?;
            Some((name, *o, n))
        })
        .collect()
}

fn diff_tables(prefix: &str, old: &Table, new: &Table, out: &mut Vec<String>) {
    let path = |k: &str| {
        if prefix.is_empty() {
            k.to_owned()
        } else {
            format!("{prefix}.{k}")
        }
    };
    for (k, n) in new {
        match old.get(k) {
            Some(o) => diff_values(&path(k), o, n, out),
            None => out.push(format!("{}: set to {}", path(k), shown(n))),
        }
    }
    for (k, o) in old {
        if !new.contains_key(k) {
            out.push(format!("{}: {} unset", path(k), shown(o)));
        }
    }
}

fn diff_values(path: &str, old: &Value, new: &Value, out: &mut Vec<String>) {
    match (old, new) {
        (Value::Table(o), Value::Table(n)) => diff_tables(path, o, n, out),
        (o, n) if o == n => {}
        // A listener's addresses in another order are the same sockets (the reload takes
        // them so): no change to name.
        (Value::Array(o), Value::Array(n))
            if path.ends_with("bind")
                && o.len() == n.len()
                && o.iter().all(|x| n.contains(x))
                && n.iter().all(|x| o.contains(x)) => {}
        (o, n) => {
            let (o, n) = (shown(o), shown(n));
            if o.len() + n.len() > SHOWN {
                out.push(format!("{path}: changed"));
            } else {
                out.push(format!("{path}: {o} -> {n}"));
            }
        }
    }
}

fn shown(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > SHOWN {
        "(a long value)".to_owned()
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: &str = r#"
[health]
fall = 3
rise = 2

[[nodes]]
name = "a"
address = "127.0.0.2"
weight = 1

[[nodes]]
name = "b"
address = "127.0.0.3"
weight = 1

[[listeners]]
name = "web"
balance = "round-robin"
check = { kind = "http", path = "/" }

[listeners.timeouts]
connect = "3s"
upstream_answer = "1m"
"#;

    #[test]
    fn an_unchanged_listing_has_no_changes() {
        assert_eq!(setting_changes(OLD, OLD), Vec::<String>::new());
    }

    #[test]
    fn every_changed_setting_is_named_with_its_entry_and_both_values() {
        let new = OLD
            .replace("fall = 3", "fall = 5")
            .replace("address = \"127.0.0.3\"", "address = \"127.0.0.9\"")
            .replace("path = \"/\"", "path = \"/health\"")
            .replace("upstream_answer = \"1m\"", "upstream_answer = \"5s\"")
            .replace(
                "balance = \"round-robin\"",
                "balance = \"leastconn\"\ntable = \"t\"",
            );
        assert_eq!(
            setting_changes(OLD, &new),
            [
                "health.fall: 3 -> 5",
                r#"node b: address: "127.0.0.3" -> "127.0.0.9""#,
                r#"listener web: balance: "round-robin" -> "leastconn""#,
                r#"listener web: check.path: "/" -> "/health""#,
                r#"listener web: table: set to "t""#,
                r#"listener web: timeouts.upstream_answer: "1m" -> "5s""#,
            ]
        );
    }

    #[test]
    fn entries_are_matched_by_name_not_position_and_added_ones_are_left_to_the_caller() {
        // b moved before a, c is new, nothing else changed.
        let new = r#"
[health]
fall = 3
rise = 2

[[nodes]]
name = "c"
address = "127.0.0.4"
weight = 1

[[nodes]]
name = "b"
address = "127.0.0.3"
weight = 1

[[nodes]]
name = "a"
address = "127.0.0.2"
weight = 1
"#;
        let old = OLD.split("[[listeners]]").next().unwrap_or("");
        assert_eq!(setting_changes(old, new), Vec::<String>::new());
    }

    #[test]
    fn a_setting_removed_says_so_and_a_long_value_is_not_printed() {
        let long = format!("{:?}", "x".repeat(100));
        let old = OLD.replace(
            "weight = 1\n\n[[nodes]]",
            &format!("weight = 1\nnote = {long}\n\n[[nodes]]"),
        );
        let new = OLD.replace(
            "weight = 1\n\n[[nodes]]",
            "weight = 1\nnote = \"short\"\n\n[[nodes]]",
        );
        assert_eq!(
            setting_changes(&old, &new),
            [r#"node a: note: (a long value) -> "short""#]
        );
        let gone = OLD.replace("rise = 2\n", "");
        assert_eq!(setting_changes(OLD, &gone), ["health.rise: 2 unset"]);
    }

    #[test]
    fn text_that_is_not_a_listing_compares_as_no_change() {
        assert_eq!(setting_changes("", OLD), Vec::<String>::new());
        assert_eq!(setting_changes("[x", OLD), Vec::<String>::new());
    }
}
