//! One test per rule bullet of `sticky-cookie-rules.md`, through the public API: the head
//! reader and the pool decide exactly as the reference says.

use limpet_core::head::{cookie_in_head, head_end, HeadEnd};
use limpet_core::{CookieSpec, Decision, Pin, Pool, RepinReason};

fn route(head: &str) -> Option<String> {
    cookie_in_head(head.as_bytes(), b"route").map(|v| String::from_utf8_lossy(v).into_owned())
}

fn pool(names: &[&str]) -> Pool {
    Pool::new(names.iter().copied()).expect("valid pool")
}

/// Routes a raw head the way the sim does, returning (node, fresh?).
fn route_head(p: &mut Pool, head: &str) -> Option<(String, bool)> {
    let pin = p.pin_by_name(cookie_in_head(head.as_bytes(), b"route"));
    match p.decide(pin, 0) {
        Decision::Sticky(n) => Some((p.name(n).to_owned(), false)),
        Decision::Fresh { node, .. } => Some((p.name(node).to_owned(), true)),
        Decision::Unavailable => None,
    }
}

#[test]
fn rule_zero_or_more_cookie_lines_of_semicolon_separated_pairs() {
    assert_eq!(route("GET / HTTP/1.1\nHost: x\n"), None);
    assert_eq!(
        route("GET / HTTP/1.1\nCookie: a=1;route=b;c=2\n"),
        Some("b".into())
    );
}

#[test]
fn rule_header_names_case_insensitive_and_other_headers_are_not_cookie() {
    for name in ["cookie", "Cookie", "COOKIE"] {
        assert_eq!(
            route(&format!("GET / HTTP/1.1\n{name}: route=b\n")),
            Some("b".into())
        );
    }
    assert_eq!(route("GET / HTTP/1.1\nX-Cookie: route=b\n"), None);
    assert_eq!(route("GET / HTTP/1.1\nSet-Cookie: route=b\n"), None);
}

#[test]
fn rule_cookie_names_case_sensitive_and_matched_whole() {
    for other in ["xroute=b", "route2=b", "myroute=b", "Route=b"] {
        assert_eq!(
            route(&format!("GET / HTTP/1.1\nCookie: {other}\n")),
            None,
            "{other}"
        );
    }
}

#[test]
fn rule_spaces_around_pairs_are_optional() {
    assert_eq!(
        route("GET / HTTP/1.1\nCookie: route=b;lang=en\n"),
        Some("b".into())
    );
    assert_eq!(
        route("GET / HTTP/1.1\nCookie: route=b ; lang=en\n"),
        Some("b".into())
    );
    assert_eq!(
        route("GET / HTTP/1.1\nCookie: lang=en ;route=b\n"),
        Some("b".into())
    );
}

#[test]
fn rule_several_lines_and_repeats_take_the_first_in_byte_order() {
    let head = "GET / HTTP/1.1\nCookie: lang=en\nCookie: route=b2; route=b1\nCookie: route=b3\n";
    assert_eq!(route(head), Some("b2".into()));
}

#[test]
fn rule_first_pin_unusable_means_no_pin_later_duplicates_ignored() {
    let mut p = pool(&["b1", "b2"]);
    // First `route` names an unknown node; the later, valid b2 is not consulted.
    let got = route_head(
        &mut p,
        "GET / HTTP/1.1\nCookie: route=zz\nCookie: route=b2\n",
    );
    assert_eq!(got, Some(("b1".into(), true)));
    // Same when the first names a DOWN node.
    let b1 = p.lookup(b"b1").expect("b1");
    p.force_health(b1, false);
    let got = route_head(&mut p, "GET / HTTP/1.1\nCookie: route=b1; route=b2\n");
    assert_eq!(got, Some(("b2".into(), true)));
}

#[test]
fn rule_head_ends_at_blank_line_and_request_line_is_never_a_header() {
    assert_eq!(
        head_end(b"GET / HTTP/1.1\nCookie: route=b\n\nCookie: route=c\n", 0),
        HeadEnd::Complete {
            head: 31,
            consumed: 32
        }
    );
    assert_eq!(route("Cookie: route=b\nHost: x\n"), None);
}

#[test]
fn rule_pinned_backend_down_is_treated_as_no_cookie_with_fresh_cookie() {
    let mut p = pool(&["b1", "b2"]);
    let b1 = p.lookup(b"b1").expect("b1");
    p.force_health(b1, false);
    assert_eq!(
        p.decide(Pin::Node(b1), 0),
        Decision::Fresh {
            node: p.lookup(b"b2").expect("b2"),
            repin: Some(RepinReason::NodeDown)
        }
    );
}

#[test]
fn rule_pin_not_in_pool_after_config_change_is_treated_as_no_cookie() {
    let mut before = pool(&["old", "b1"]);
    let old = before.lookup(b"old").expect("old");
    assert_eq!(before.decide(Pin::Node(old), 0), Decision::Sticky(old));
    let mut after = pool(&["b1", "b2"]);
    let pin = after.pin_by_name(Some(b"old"));
    assert_eq!(pin, Pin::Unknown);
    assert!(matches!(
        after.decide(pin, 0),
        Decision::Fresh {
            repin: Some(RepinReason::UnknownNode),
            ..
        }
    ));
}

#[test]
fn rule_every_new_assignment_answers_with_set_cookie() {
    // A fresh decision always carries a node, and the spec writes the sim's exact cookie for it.
    let mut p = pool(&["b1"]);
    let Decision::Fresh { node, repin: None } = p.decide(Pin::None, 0) else {
        panic!("expected a fresh assignment");
    };
    assert_eq!(
        CookieSpec::sim().set_cookie(p.name(node), false),
        "route=b1; Path=/; HttpOnly"
    );
}

#[test]
fn rule_pinned_hit_does_not_advance_the_rotation() {
    let mut p = pool(&["b1", "b2", "b3"]);
    assert_eq!(
        route_head(&mut p, "GET / HTTP/1.1\n"),
        Some(("b1".into(), true))
    );
    for _ in 0..5 {
        assert_eq!(
            route_head(&mut p, "GET / HTTP/1.1\nCookie: route=b3\n"),
            Some(("b3".into(), false))
        );
    }
    assert_eq!(
        route_head(&mut p, "GET / HTTP/1.1\n"),
        Some(("b2".into(), true))
    );
}

#[test]
fn rule_cookie_only_selects_among_pool_members() {
    let mut p = pool(&["b1"]);
    for forged in ["10.0.0.12:8080", "127.0.0.1:80", "../b1", "b1 ", ""] {
        assert_ne!(
            p.pin_by_name(Some(forged.as_bytes())),
            Pin::Node(p.lookup(b"b1").expect("b1"))
        );
        let d = p.decide(p.pin_by_name(Some(forged.as_bytes())), 0);
        assert!(
            matches!(d, Decision::Fresh { repin: Some(_), .. }),
            "{forged:?}: {d:?}"
        );
    }
}

#[test]
fn rule_kth_fresh_assignment_goes_to_up_k_mod_len_up() {
    let mut p = pool(&["b1", "b2", "b3", "b4"]);
    let b2 = p.lookup(b"b2").expect("b2");
    assert_eq!(
        route_head(&mut p, "GET / HTTP/1.1\n"),
        Some(("b1".into(), true))
    ); // k=0
    p.force_health(b2, false);
    // k=1, up = [b1, b3, b4] -> b3; k=2 -> b4; k=3 -> b1
    for want in ["b3", "b4", "b1"] {
        assert_eq!(
            route_head(&mut p, "GET / HTTP/1.1\n"),
            Some((want.into(), true))
        );
    }
}

#[test]
fn rule_nothing_up_gives_none_and_does_not_move_the_counter() {
    let mut p = pool(&["b1", "b2"]);
    for n in ["b1", "b2"] {
        let id = p.lookup(n.as_bytes()).expect("node");
        p.force_health(id, false);
    }
    assert_eq!(route_head(&mut p, "GET / HTTP/1.1\n"), None);
    let b2 = p.lookup(b"b2").expect("b2");
    p.force_health(b2, true);
    assert_eq!(p.rotation(), 0);
    assert_eq!(
        route_head(&mut p, "GET / HTTP/1.1\n"),
        Some(("b2".into(), true))
    );
}
