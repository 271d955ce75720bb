//! Config errors that point at the file: `limpet.toml:12:5: listeners[1].tls.cert: message`.
//!
//! Two sources feed them. Syntax and type errors come from the TOML deserializer with a byte
//! span but no key path in its public API, so the path is recovered from the text around the
//! span ([`key_path_at`]). Semantic errors come from validation, which knows the path it is
//! checking and takes the span from a `toml::Spanned` field.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// A configuration that cannot run: where, which key, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: PathBuf,
    /// 1-based line and column; 0 when the error has no place in the file (e.g. unreadable).
    pub line: usize,
    pub column: usize,
    /// Dotted key path with array indices, e.g. `listeners[1].tls.cert` (may be empty).
    pub key: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if self.line > 0 {
            write!(f, ":{}:{}", self.line, self.column)?;
        }
        if !self.key.is_empty() {
            write!(f, ": {}", self.key)?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ConfigError {}

/// Where some keys of a validated configuration are written: for errors found only after
/// validation, such as a reload refusing a listener change, which compares two valid files.
/// Key path (`listeners[1].bind`) to 1-based line and column.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Places(BTreeMap<String, (usize, usize)>);

impl Places {
    pub(crate) fn note(&mut self, key: String, at: (usize, usize)) {
        self.0.insert(key, at);
    }

    /// The line and column noted for `key`.
    pub fn get(&self, key: &str) -> Option<(usize, usize)> {
        self.0.get(key).copied()
    }

    /// An error about `key` of `file`, at the place noted for it (none if it was not noted:
    /// a configuration not read from a file, or a key the file does not have).
    pub fn error(&self, file: &Path, key: &str, message: impl Into<String>) -> ConfigError {
        let (line, column) = self.get(key).unwrap_or((0, 0));
        ConfigError {
            file: file.to_owned(),
            line,
            column,
            key: key.to_owned(),
            message: message.into(),
        }
    }
}

/// Builds errors for one file's text.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Source<'a> {
    pub(crate) file: &'a Path,
    pub(crate) text: &'a str,
}

impl Source<'_> {
    /// The line and column of a byte range's start.
    pub(crate) fn place(&self, span: &Range<usize>) -> (usize, usize) {
        line_col(self.text, span.start)
    }

    /// An error at `span` (a byte range of the text) about `key`.
    pub(crate) fn error(
        &self,
        span: Option<Range<usize>>,
        key: impl Into<String>,
        msg: impl Into<String>,
    ) -> ConfigError {
        let (line, column) = span.map_or((0, 0), |s| line_col(self.text, s.start));
        ConfigError {
            file: self.file.to_owned(),
            line,
            column,
            key: key.into(),
            message: msg.into(),
        }
    }

    /// Turns a deserializer error into one naming the key, with a "did you mean" for unknown
    /// keys and variants: a near-typo of a known name, or the limpet key for an HAProxy or
    /// nginx name ([`super::hints`]).
    pub(crate) fn toml_error(&self, e: &toml::de::Error) -> ConfigError {
        let span = e.span();
        let key = span
            .as_ref()
            .map(|s| key_path_at(self.text, s.start))
            .unwrap_or_default();
        let mut message = e.message().trim().to_owned();
        if let Some(s) = suggestion(&message, &key) {
            message.push_str("; ");
            message.push_str(&s);
        }
        self.error(span, key, message)
    }
}

/// 1-based line and column (in characters) of a byte offset.
pub(crate) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    // Back up to a char boundary: spans from the parser are byte offsets.
    let mut offset = offset;
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    (line, column)
}

/// The dotted key path (with array-of-tables indices) of the key or value at `offset`,
/// recovered from the text: the last `[table]` / `[[array]]` header above it, then the keys
/// and array positions the text opens on the way to it, inline tables and arrays included,
/// across lines (`timeouts = { connect = "5s", idle = 5 }` at the `5` is
/// `listeners[0].timeouts.idle`; the third element of a `certs` array written over several
/// lines is `certs[2]`).
pub(crate) fn key_path_at(text: &str, offset: usize) -> String {
    /// What the text has open at a point.
    enum Frame {
        /// A table (the header's, or an inline one): the key whose value is being read.
        Table { key: Option<String> },
        /// An array: the element being read.
        Array { index: usize },
    }
    let path_of = |header: &str, frames: &[Frame]| {
        let mut path = header.to_owned();
        for f in frames {
            match f {
                Frame::Table { key: Some(k) } if !k.is_empty() => {
                    if !path.is_empty() {
                        path.push('.');
                    }
                    path.push_str(k);
                }
                Frame::Table { .. } => {}
                Frame::Array { index } => path.push_str(&format!("[{index}]")),
            }
        }
        path
    };
    let bytes = text.as_bytes();
    // An offset past the last line is on it, and one on a line's blanks is on what follows.
    let mut offset = offset.min(text.trim_end_matches(['\n', '\r']).len().saturating_sub(1));
    while matches!(bytes.get(offset), Some(b' ' | b'\t')) {
        offset += 1;
    }
    let mut counts: Vec<(String, usize)> = Vec::new();
    let mut header = String::new();
    let mut frames = vec![Frame::Table { key: None }];
    let mut i = 0;
    let mut line_start = true;
    while i < bytes.len() {
        let c = bytes[i];
        if line_start && frames.len() == 1 {
            // A header line: only at the top level (a line inside an array may start with `[`).
            let rest = &text[i..];
            let line = rest.split_inclusive('\n').next().unwrap_or(rest);
            let t = strip_comment(line).trim();
            if t.starts_with('[') {
                header = header_path(t, &mut counts);
                frames = vec![Frame::Table { key: None }];
                if offset < i + line.len() {
                    return header;
                }
                i += line.len();
                continue;
            }
        }
        line_start = false;
        let in_value = |frames: &[Frame]| match frames.last() {
            Some(Frame::Table { key }) => key.is_some(),
            _ => true,
        };
        // A key starting at the offset is read first: the path ends with it.
        let key_here = !in_value(&frames)
            && !matches!(c, b'\n' | b'#' | b',' | b'}' | b']' | b' ' | b'\t' | b'\r');
        if i >= offset && !key_here {
            break;
        }
        match c {
            b'\n' => {
                line_start = true;
                if frames.len() == 1 {
                    frames = vec![Frame::Table { key: None }];
                }
                i += 1;
            }
            b'#' => {
                i += text[i..].find('\n').unwrap_or(text.len() - i);
            }
            b'"' | b'\'' if in_value(&frames) => i = skip_string(bytes, i),
            b'{' if in_value(&frames) => {
                frames.push(Frame::Table { key: None });
                i += 1;
            }
            b'[' if in_value(&frames) => {
                frames.push(Frame::Array { index: 0 });
                i += 1;
            }
            b'}' | b']' => {
                if frames.len() > 1 {
                    frames.pop();
                }
                i += 1;
            }
            b',' => {
                match frames.last_mut() {
                    Some(Frame::Array { index }) => *index += 1,
                    Some(Frame::Table { key }) => *key = None,
                    None => {}
                }
                i += 1;
            }
            b' ' | b'\t' | b'\r' => i += 1,
            _ if !in_value(&frames) => {
                // A key, up to its `=` (quoted parts may hold anything but their quote).
                let start = i;
                let mut j = i;
                while j < bytes.len() && bytes[j] != b'=' && bytes[j] != b'\n' {
                    j = if bytes[j] == b'"' || bytes[j] == b'\'' {
                        skip_string(bytes, j)
                    } else {
                        j + 1
                    };
                }
                let key: String = text[start..j.min(text.len())]
                    .split('.')
                    .map(|s| s.trim().trim_matches('"').trim_matches('\''))
                    .collect::<Vec<_>>()
                    .join(".");
                if let Some(Frame::Table { key: k }) = frames.last_mut() {
                    *k = Some(key);
                }
                if offset < j {
                    return path_of(&header, &frames);
                }
                // Past the `=`; a line with none keeps its newline, which ends it.
                i = if bytes.get(j) == Some(&b'=') {
                    j + 1
                } else {
                    j
                };
            }
            _ => i += 1,
        }
    }
    path_of(&header, &frames)
}

/// The path of a `[table]` or `[[array]]` header line, counting arrays of tables in `counts`.
fn header_path(t: &str, counts: &mut Vec<(String, usize)>) -> String {
    let array = t.starts_with("[[");
    let inner = strip_comment(t)
        .trim()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .trim();
    let mut path = String::new();
    let segs: Vec<&str> = inner
        .split('.')
        .map(|s| s.trim().trim_matches('"').trim_matches('\''))
        .collect();
    for (i, seg) in segs.iter().enumerate() {
        if !path.is_empty() {
            path.push('.');
        }
        path.push_str(seg);
        let last = i + 1 == segs.len();
        if array && last {
            match counts.iter_mut().find(|(p, _)| *p == path) {
                Some((_, n)) => *n += 1,
                None => counts.push((path.clone(), 1)),
            }
        }
        if let Some((_, n)) = counts.iter().find(|(p, _)| *p == path) {
            path.push_str(&format!("[{}]", n - 1));
        }
    }
    path
}

/// The position after the string starting at `i` (`"..."` with escapes, `'...'` literal,
/// and their triple-quoted forms); the end of the text for one left open.
fn skip_string(bytes: &[u8], i: usize) -> usize {
    let q = bytes[i];
    let triple = bytes.get(i..i + 3) == Some(&[q, q, q][..]);
    let mut j = i + if triple { 3 } else { 1 };
    while j < bytes.len() {
        if q == b'"' && bytes[j] == b'\\' {
            j += 2;
            continue;
        }
        if bytes[j] == q {
            if !triple {
                return j + 1;
            }
            if bytes.get(j..j + 3) == Some(&[q, q, q][..]) {
                // Up to two more quotes belong to the value (`"""x""""` is `x"`).
                let mut end = j + 3;
                while end < (j + 5).min(bytes.len()) && bytes[end] == q {
                    end += 1;
                }
                return end;
            }
        }
        if bytes[j] == b'\n' && !triple {
            return j;
        }
        j += 1;
    }
    bytes.len()
}

fn strip_comment(line: &str) -> &str {
    // Good enough for key lines: a `#` inside a quoted value only matters after the `=`.
    match line.find('#') {
        Some(i) if !line[..i].contains('"') => &line[..i],
        _ => line,
    }
}

/// For "unknown field `x`, expected one of `a`, `b`" (or "unknown variant") at `key_path`:
/// "did you mean `a`?" when `x` is close enough to a known name to be a typo, else what an
/// HAProxy or nginx name `x` is in limpet.
pub(crate) fn suggestion(message: &str, key_path: &str) -> Option<String> {
    if !(message.starts_with("unknown field") || message.starts_with("unknown variant")) {
        return None;
    }
    let mut names = message.split('`').skip(1).step_by(2);
    let got = names.next()?;
    if let Some(s) = closest(got, names.clone()) {
        return Some(format!("did you mean `{s}`?"));
    }
    super::hints::foreign_hint(got, &super::hints::table_of(key_path, got), names)
}

/// The candidate within edit distance max(1, len/3) of `got`, nearest first.
pub(crate) fn closest<'a>(got: &str, candidates: impl Iterator<Item = &'a str>) -> Option<String> {
    let limit = (got.chars().count() / 3).max(1);
    candidates
        .map(|c| {
            (
                edit_distance(&got.to_ascii_lowercase(), &c.to_ascii_lowercase()),
                c,
            )
        })
        .filter(|&(d, _)| d <= limit)
        .min_by_key(|&(d, _)| d)
        .map(|(_, c)| c.to_owned())
}

/// Levenshtein distance, counting `_`/`-` confusion as a substitution like any other.
pub(crate) fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, &cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_follow_tables_and_arrays() {
        let text = "[[nodes]]\nname = \"a\"\n[[listeners]]\nname = \"x\"\n[[listeners]]\nname = \"y\"\n[listeners.tls]\ncert = \"/x.pem\"\n";
        let at = |needle: &str| key_path_at(text, text.find(needle).unwrap_or(0));
        assert_eq!(at("name = \"a\""), "nodes[0].name");
        assert_eq!(at("name = \"y\""), "listeners[1].name");
        assert_eq!(at("cert"), "listeners[1].tls.cert");
        assert_eq!(at("[listeners.tls]"), "listeners[1].tls");
    }

    /// Inline tables and arrays are followed, on one line and across lines, to the key or
    /// element at the offset; strings and comments hold no structure.
    #[test]
    fn paths_follow_inline_tables_and_arrays() {
        let text = "[[listeners]]\nname = \"x\"\n\
                    timeouts = { connect = \"5s\", idle = 5 }\n\
                    check = { kind = \"http\", port = 70000 } # a { comment [\n\
                    trusted_proxies = [\n  \"10.0.0.0/8\", # first\n  5,\n]\n\
                    [listeners.tls]\n\
                    certs = [\n  { cert = \"/x.pem\", key = \"/y,{[.pem\", nmes = [\"a\"] },\n]\n\
                    after = 1\n";
        let at = |needle: &str| key_path_at(text, text.find(needle).unwrap_or(0));
        assert_eq!(at("5 }"), "listeners[0].timeouts.idle");
        assert_eq!(at("connect"), "listeners[0].timeouts.connect");
        assert_eq!(at("70000"), "listeners[0].check.port");
        assert_eq!(at("5,"), "listeners[0].trusted_proxies[1]");
        assert_eq!(at("\"10.0"), "listeners[0].trusted_proxies[0]");
        assert_eq!(at("nmes"), "listeners[0].tls.certs[0].nmes");
        assert_eq!(at("[\"a\"]"), "listeners[0].tls.certs[0].nmes");
        assert_eq!(at("after"), "listeners[0].tls.after");
        assert_eq!(at("name"), "listeners[0].name");
    }

    /// What review found: a multi-line string closed by extra quotes, a key line with no
    /// `=`, an empty key, the end of the text, and a line's leading blanks.
    #[test]
    fn paths_survive_odd_but_valid_text() {
        let text = "a = { s = \"\"\"x\"\"\"\", t = 1 }\nb = 2\n[h]\nc = 3\n";
        let at = |t: &str, needle: &str| key_path_at(t, t.find(needle).unwrap_or(0));
        assert_eq!(at(text, "t ="), "a.t");
        assert_eq!(at(text, "b ="), "b");
        assert_eq!(at(text, "c ="), "h.c");
        let text = "[[l]]\nfoo\n[[l]]\na = 1\n";
        assert_eq!(key_path_at(text, 10), "l[1]");
        assert_eq!(at(text, "a ="), "l[1].a");
        assert_eq!(key_path_at("[t]\n\"\" = 1\n", 4), "t");
        assert_eq!(key_path_at("[t]\na = 1\n", 10), "t.a");
        assert_eq!(key_path_at("[t]\n  a = 1\n", 4), "t.a");
        assert_eq!(key_path_at("['q']\nk = 1\n", 6), "q.k");
    }

    #[test]
    fn suggestions_catch_typos_only() {
        assert_eq!(
            suggestion(
                "unknown field `expir`, expected one of `name`, `expire`, `size`",
                "tables[0].expir"
            )
            .as_deref(),
            Some("did you mean `expire`?")
        );
        assert_eq!(
            suggestion(
                "unknown variant `leastcon`, expected `round-robin` or `leastconn`",
                "listeners[0].balance"
            )
            .as_deref(),
            Some("did you mean `leastconn`?")
        );
        assert_eq!(
            suggestion("unknown field `zzzzzz`, expected `name`", "zzzzzz"),
            None
        );
        assert_eq!(suggestion("missing field `name`", "nodes[0]"), None);
        assert_eq!(
            suggestion(
                "unknown field `inter`, expected one of `fall`, `rise`, `interval`",
                "health.inter"
            )
            .as_deref(),
            Some("did you mean `interval`? (HAProxy's `inter`)")
        );
    }

    #[test]
    fn line_and_column_are_one_based() {
        assert_eq!(line_col("ab\ncd", 0), (1, 1));
        assert_eq!(line_col("ab\ncd", 4), (2, 2));
        assert_eq!(line_col("é\nx", 3), (2, 1));
    }
}
