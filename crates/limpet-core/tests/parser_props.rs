//! Property tests: the head and cookie readers never panic on arbitrary bytes, and they agree
//! with a plain model (structured headers, no byte tricks) on generated heads.

use limpet_core::cookie::{find_in_value, find_in_values};
use limpet_core::head::{cookie_in_head, head_end, HeadEnd, HeaderLines};
use proptest::prelude::*;

/// A generated header: its name and, for cookie-like ones, its pairs.
#[derive(Debug, Clone)]
struct Header {
    name: String,
    pairs: Vec<(String, Option<String>)>, // None: a pair without '='
    sep: &'static str,
}

fn header() -> impl Strategy<Value = Header> {
    let name = prop::sample::select(vec![
        "Cookie",
        "cookie",
        "COOKIE",
        "cOOkie",
        "X-Cookie",
        "Set-Cookie",
        "Cookie2",
        "Host",
        "Accept",
    ]);
    let pair_name = prop::sample::select(vec![
        "route", "Route", "xroute", "route2", "myroute", "theme", "lang", "ROUTE",
    ]);
    let value = "[a-z0-9:.=-]{0,6}";
    let pair = (pair_name, prop::option::weighted(0.9, value)).prop_map(|(n, v)| (n.to_owned(), v));
    let sep = prop::sample::select(vec![";", "; ", " ; ", ";  ", "\t;"]);
    (name, prop::collection::vec(pair, 0..5), sep).prop_map(|(name, pairs, sep)| Header {
        name: name.to_owned(),
        pairs,
        sep,
    })
}

fn render(request_line: &str, headers: &[Header], crlf: bool) -> String {
    let eol = if crlf { "\r\n" } else { "\n" };
    let mut s = format!("{request_line}{eol}");
    for h in headers {
        let pairs: Vec<String> = h
            .pairs
            .iter()
            .map(|(n, v)| match v {
                Some(v) => format!("{n}={v}"),
                None => n.clone(),
            })
            .collect();
        s.push_str(&format!("{}: {}{eol}", h.name, pairs.join(h.sep)));
    }
    s
}

/// The plain model: first `route` pair of the first Cookie header (any case) that has one.
fn model(headers: &[Header]) -> Option<String> {
    headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("cookie"))
        .flat_map(|h| h.pairs.iter())
        .find(|(n, v)| n == "route" && v.is_some())
        .and_then(|(_, v)| v.clone())
}

proptest! {
    #[test]
    fn head_reader_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..512), from in 0usize..64) {
        let from = from.min(bytes.len());
        // head_end's contract: `from` is a line start; any offset must still not panic.
        let _ = head_end(&bytes, from);
        let _ = cookie_in_head(&bytes, b"route");
        let _ = HeaderLines::new(&bytes).count();
        let _ = find_in_value(&bytes, b"route");
        let _ = find_in_values([&bytes[..], &bytes[..]], b"");
    }

    #[test]
    fn cookie_reader_agrees_with_the_model(
        request_line in prop::sample::select(vec![
            "GET / HTTP/1.1", "Cookie: route=evil", "POST /x?route=q HTTP/1.1", "",
        ]),
        headers in prop::collection::vec(header(), 0..6),
        crlf: bool,
    ) {
        let head = render(request_line, &headers, crlf);
        let got = cookie_in_head(head.as_bytes(), b"route").map(|v| String::from_utf8_lossy(v).into_owned());
        prop_assert_eq!(got, model(&headers), "head: {:?}", head);
        // The same answer from header values, as a HeaderMap would give them.
        let values: Vec<String> = headers
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case("cookie"))
            .map(|h| render("", std::slice::from_ref(h), false))
            .map(|line| {
                line.trim_end()
                    .split_once(':')
                    .map_or("", |(_, v)| v)
                    .trim()
                    .to_owned()
            })
            .collect();
        let got = find_in_values(values.iter().map(|v| v.as_bytes()), b"route")
            .map(|v| String::from_utf8_lossy(v).into_owned());
        prop_assert_eq!(got, model(&headers));
    }

    #[test]
    fn head_end_finds_the_first_empty_line(lines in prop::collection::vec("[ -~]{1,20}", 0..8), crlf: bool) {
        let eol = if crlf { "\r\n" } else { "\n" };
        let mut head = String::new();
        for l in &lines {
            head.push_str(l);
            head.push_str(eol);
        }
        let full = format!("{head}{eol}trailing");
        // Lines of printable text are never empty, so the head ends exactly after them.
        let lines_len = head.len();
        prop_assert_eq!(head_end(full.as_bytes(), 0), HeadEnd::Complete { head: lines_len, consumed: lines_len + eol.len() });
    }
}
