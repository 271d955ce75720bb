//! A raw HTTP/1 request head in borrowed bytes: where it ends, and its header lines.
//!
//! Used by `limpet sim` and by anything that inspects raw bytes (TCP listeners peeking at a
//! request). Lines end in LF or CRLF. The first line is the request line and is never read as a
//! header, whatever it contains. The head ends at the first empty line.
//!
//! Parsing is incremental in the mini-redis way: [`head_end`] answers
//! [`HeadEnd::Incomplete`] on partial input instead of failing, and the caller resumes the
//! scan from the offset it was given back, so slowly arriving bytes are never scanned twice.

use crate::cookie::{find_in_value, trim_ows};

/// Where the head ends in a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadEnd {
    /// The head is complete: `head` bytes of lines (the empty line excluded), and `consumed`
    /// bytes including the empty line that ends it.
    Complete { head: usize, consumed: usize },
    /// No empty line yet. Resume the scan at `resume_at` once more bytes arrived.
    Incomplete { resume_at: usize },
}

/// Finds the empty line that ends a head, scanning `buf` from `from` (an offset that is always
/// the start of a line: 0, or a `resume_at` given back earlier).
pub fn head_end(buf: &[u8], from: usize) -> HeadEnd {
    let mut line_start = from;
    while let Some(nl) = memchr::memchr(b'\n', &buf[line_start..]) {
        let line = &buf[line_start..line_start + nl];
        if line.is_empty() || line == b"\r" {
            return HeadEnd::Complete {
                head: line_start,
                consumed: line_start + nl + 1,
            };
        }
        line_start += nl + 1;
    }
    HeadEnd::Incomplete {
        resume_at: line_start,
    }
}

/// Iterates over the header lines of a head as `(name, value)`, skipping the request line.
///
/// The value has its surrounding white space removed. Lines without a colon and obsolete
/// continuation lines (starting with white space) are skipped: they cannot be a header named
/// `Cookie`.
#[derive(Debug, Clone)]
pub struct HeaderLines<'a> {
    rest: &'a [u8],
}

impl<'a> HeaderLines<'a> {
    /// `head` is the head without its terminating empty line (as [`HeadEnd::Complete`] gives).
    pub fn new(head: &'a [u8]) -> Self {
        // Skip the request line.
        let rest = match memchr::memchr(b'\n', head) {
            Some(nl) => &head[nl + 1..],
            None => &[],
        };
        HeaderLines { rest }
    }
}

impl<'a> Iterator for HeaderLines<'a> {
    type Item = (&'a [u8], &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.rest.is_empty() {
                return None;
            }
            let (line, rest) = match memchr::memchr(b'\n', self.rest) {
                Some(nl) => (&self.rest[..nl], &self.rest[nl + 1..]),
                None => (self.rest, &[][..]),
            };
            self.rest = rest;
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if matches!(line.first(), Some(b' ' | b'\t')) {
                continue;
            }
            if let Some(colon) = memchr::memchr(b':', line) {
                return Some((&line[..colon], trim_ows(&line[colon + 1..])));
            }
        }
    }
}

/// True for the header name `Cookie`, in any case, and no other (`X-Cookie`, `Set-Cookie`,
/// `Cookie2` and `Cookie ` with a space are other names).
#[inline]
pub fn is_cookie_header(name: &[u8]) -> bool {
    name.eq_ignore_ascii_case(b"cookie")
}

/// The first value of cookie `name` across every `Cookie` line of a raw head.
pub fn cookie_in_head<'a>(head: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    HeaderLines::new(head)
        .filter(|(n, _)| is_cookie_header(n))
        .find_map(|(_, v)| find_in_value(v, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(head: &str) -> Option<&str> {
        cookie_in_head(head.as_bytes(), b"route").map(|v| std::str::from_utf8(v).unwrap_or("?"))
    }

    #[test]
    fn header_names_are_case_insensitive() {
        for h in ["cookie", "Cookie", "COOKIE", "cOoKiE"] {
            assert_eq!(
                route(&format!("GET / HTTP/1.1\n{h}: route=b1\n")),
                Some("b1"),
                "{h}"
            );
        }
    }

    #[test]
    fn other_headers_are_not_cookie() {
        assert_eq!(route("GET / HTTP/1.1\nX-Cookie: route=b1\n"), None);
        assert_eq!(route("GET / HTTP/1.1\nSet-Cookie: route=b1\n"), None);
        assert_eq!(route("GET / HTTP/1.1\nCookie2: route=b1\n"), None);
        assert_eq!(route("GET / HTTP/1.1\nCookie : route=b1\n"), None);
    }

    #[test]
    fn several_cookie_lines_first_in_byte_order() {
        let head = "GET / HTTP/1.1\nCookie: a=1\nHost: x\ncookie: route=b2\nCOOKIE: route=b1\n";
        assert_eq!(route(head), Some("b2"));
    }

    #[test]
    fn request_line_is_never_a_header() {
        assert_eq!(route("Cookie: route=b1\nHost: x\n"), None);
        assert_eq!(route("Cookie: route=b1"), None);
    }

    #[test]
    fn crlf_and_lf_lines() {
        assert_eq!(route("GET / HTTP/1.1\r\nCookie: route=b1\r\n"), Some("b1"));
        assert_eq!(
            route("GET / HTTP/1.1\r\nCookie: route=b1 \r\nX: y\r\n"),
            Some("b1")
        );
    }

    #[test]
    fn continuation_lines_are_not_headers() {
        assert_eq!(route("GET / HTTP/1.1\nX-A: 1\n Cookie: route=b1\n"), None);
    }

    #[test]
    fn head_end_lf_and_crlf() {
        assert_eq!(
            head_end(b"GET / HTTP/1.1\nA: b\n\nrest", 0),
            HeadEnd::Complete {
                head: 20,
                consumed: 21
            }
        );
        assert_eq!(
            head_end(b"GET / HTTP/1.1\r\nA: b\r\n\r\nrest", 0),
            HeadEnd::Complete {
                head: 22,
                consumed: 24
            }
        );
    }

    #[test]
    fn head_end_incomplete_resumes_at_line_start() {
        let buf = b"GET / HTTP/1.1\nA: b";
        assert_eq!(head_end(buf, 0), HeadEnd::Incomplete { resume_at: 15 });
        let buf = b"GET / HTTP/1.1\nA: b\n\n";
        assert_eq!(
            head_end(buf, 15),
            HeadEnd::Complete {
                head: 20,
                consumed: 21
            }
        );
    }
}
