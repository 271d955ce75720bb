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

/// The dotted key path (with array-of-tables indices) of the key or header at `offset`,
/// recovered from the text: the last `[table]` / `[[array]]` header above it, and the key on
/// its line. Inline tables spanning lines are not followed; the path is then the enclosing
/// one, which still names the right region of the file.
pub(crate) fn key_path_at(text: &str, offset: usize) -> String {
    let mut counts: Vec<(String, usize)> = Vec::new();
    let mut current = String::new();
    let mut pos = 0;
    for line in text.split_inclusive('\n') {
        let end = pos + line.len();
        let t = strip_comment(line).trim();
        let is_header = t.starts_with('[');
        if is_header {
            let array = t.starts_with("[[");
            let inner = t.trim_start_matches('[').trim_end_matches(']').trim();
            let mut path = String::new();
            let segs: Vec<&str> = inner
                .split('.')
                .map(|s| s.trim().trim_matches('"'))
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
            current = path;
        }
        if offset < end || end == text.len() {
            if is_header {
                return current;
            }
            let key = t
                .split_once('=')
                .map_or("", |(k, _)| k.trim().trim_matches('"'));
            return match (current.is_empty(), key.is_empty()) {
                (_, true) => current,
                (true, false) => key.to_owned(),
                (false, false) => format!("{current}.{key}"),
            };
        }
        pos = end;
    }
    current
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
