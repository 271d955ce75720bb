use std::time::{Duration, SystemTime};

use super::*;
use crate::names::NamePattern;

const ORIGIN: &str = "https://app.example:8443";

fn origin(s: &str) -> Origin {
    Origin::parse(s).expect("valid origin")
}

fn t(secs: u64) -> SystemTime {
    // 2020-09-13 12:26:40 UTC, a fixed instant well inside every date form's range.
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_600_000_000 + secs)
}

fn jar() -> AffinityJar {
    AffinityJar::new(origin(ORIGIN))
}

/// Adopts `line` from the jar's own origin at `t(0)`.
fn adopt(jar: &mut AffinityJar, line: &str) -> Adoption {
    let from = jar.origin().clone();
    jar.adopt(&from, line.as_bytes(), t(0))
}

fn header(jar: &AffinityJar) -> Option<String> {
    jar.cookie_header(&origin(ORIGIN), t(0))
}

#[test]
fn keeps_a_balancer_cookie_and_sends_it_to_its_origin() {
    let mut j = jar();
    assert_eq!(
        adopt(&mut j, "route=n1; Path=/; HttpOnly"),
        Adoption::Stored
    );
    assert_eq!(header(&j).as_deref(), Some("route=n1"));
    // Any path and the WebSocket scheme of the same origin get it too.
    let ws = origin("wss://app.example:8443/socket?x=1");
    assert_eq!(j.cookie_header(&ws, t(0)).as_deref(), Some("route=n1"));
}

#[test]
fn rotation_rewrite_replaces_the_value_in_place() {
    let mut j = jar();
    adopt(&mut j, "route=n1; Path=/");
    adopt(&mut j, "AWSALB=a1; Path=/");
    assert_eq!(adopt(&mut j, "route=n2; Path=/"), Adoption::Replaced);
    assert_eq!(j.len(), 2);
    assert_eq!(header(&j).as_deref(), Some("route=n2; AWSALB=a1"));
}

#[test]
fn rewrite_replaces_the_expiry_too() {
    let mut j = jar();
    let from = j.origin().clone();
    j.adopt(&from, b"route=n1; Max-Age=10", t(0));
    j.adopt(&from, b"route=n2", t(5));
    // The rewrite carried no expiry: it is now a session cookie, valid after the old 10 s.
    assert_eq!(j.get("route", t(100)), Some("n2"));
}

#[test]
fn expiry_by_max_age_zero_removes() {
    let mut j = jar();
    adopt(&mut j, "route=n1; Path=/");
    assert_eq!(
        adopt(&mut j, "route=; Path=/; Max-Age=0"),
        Adoption::Removed
    );
    assert!(j.is_empty());
    assert_eq!(header(&j), None);
}

#[test]
fn expiry_by_negative_max_age_removes() {
    let mut j = jar();
    adopt(&mut j, "SERVERID=s1; path=/");
    assert_eq!(
        adopt(&mut j, "SERVERID=s1; path=/; max-age=-1"),
        Adoption::Removed
    );
    assert!(j.is_empty());
}

#[test]
fn expiry_by_past_expires_against_the_passed_in_clock() {
    let mut j = jar();
    let from = j.origin().clone();
    // Sun, 13 Sep 2020 12:26:40 GMT is t(0).
    let line = b"route=n1; Path=/; Expires=Sun, 13 Sep 2020 12:26:40 GMT";
    // Seen a second before that instant it is valid, and lapses at the instant.
    assert_eq!(
        j.adopt(&from, line, t(0) - Duration::from_secs(1)),
        Adoption::Stored
    );
    assert_eq!(
        j.cookie_header(&from, t(0) - Duration::from_millis(1))
            .as_deref(),
        Some("route=n1")
    );
    assert_eq!(j.cookie_header(&from, t(0)), None);
    // The same line seen at that instant deletes a held cookie.
    j.adopt(&from, b"route=n0; Path=/", t(0));
    assert_eq!(j.adopt(&from, line, t(0)), Adoption::Removed);
    assert!(j.is_empty());
    // And an already-expired cookie that was never held changes nothing.
    assert_eq!(
        j.adopt(&from, line, t(9)),
        Adoption::Ignored(Ignored::ExpiredNotHeld)
    );
}

#[test]
fn max_age_expiry_lapses_with_the_clock() {
    let mut j = jar();
    let from = j.origin().clone();
    j.adopt(&from, b"route=n1; Max-Age=60", t(0));
    assert_eq!(j.get("route", t(59)), Some("n1"));
    assert_eq!(j.get("route", t(60)), None);
    j.remove_expired(t(60));
    assert!(j.is_empty());
}

#[test]
fn max_age_wins_over_expires() {
    let mut j = jar();
    // Far-future Expires, Max-Age=0: deleted.
    adopt(&mut j, "route=n1");
    let del = "route=n1; Expires=Fri, 01 Jan 2100 00:00:00 GMT; Max-Age=0";
    assert_eq!(adopt(&mut j, del), Adoption::Removed);
    // Past Expires, positive Max-Age: kept.
    let keep = "route=n2; Max-Age=30; Expires=Thu, 01 Jan 1970 00:00:00 GMT";
    assert_eq!(adopt(&mut j, keep), Adoption::Stored);
    assert_eq!(j.get("route", t(29)), Some("n2"));
}

#[test]
fn scope_answer_from_other_host_is_ignored_and_nothing_is_sent_there() {
    let mut j = jar();
    let other = origin("https://idp.example:8443");
    assert_eq!(
        j.adopt(&other, b"route=x; Path=/", t(0)),
        Adoption::Ignored(Ignored::OtherOrigin)
    );
    adopt(&mut j, "route=n1; Path=/");
    assert_eq!(j.cookie_header(&other, t(0)), None);
}

#[test]
fn scope_other_port() {
    let mut j = jar();
    let other = origin("https://app.example:9443");
    assert_eq!(
        j.adopt(&other, b"route=x", t(0)),
        Adoption::Ignored(Ignored::OtherOrigin)
    );
    adopt(&mut j, "route=n1");
    assert_eq!(j.cookie_header(&other, t(0)), None);
    // The default port is a different port too.
    assert_eq!(j.cookie_header(&origin("https://app.example"), t(0)), None);
}

#[test]
fn scope_other_scheme() {
    let mut j = jar();
    let http = origin("http://app.example:8443");
    assert_eq!(
        j.adopt(&http, b"route=x", t(0)),
        Adoption::Ignored(Ignored::OtherOrigin)
    );
    adopt(&mut j, "route=n1");
    assert_eq!(j.cookie_header(&http, t(0)), None);
    assert_eq!(
        j.cookie_header(&origin("ws://app.example:8443"), t(0)),
        None
    );
}

#[test]
fn scope_path_other_than_root_is_ignored() {
    let mut j = jar();
    for line in [
        "route=x; Path=/x",
        "route=x; Path=/x/",
        "route=x; Path=/api; Path=/api",
    ] {
        assert_eq!(
            adopt(&mut j, line),
            Adoption::Ignored(Ignored::PathNotRoot),
            "{line}"
        );
    }
    assert!(j.is_empty());
    // A rewrite with another path is another cookie: the held one stays.
    adopt(&mut j, "route=n1; Path=/");
    assert_eq!(
        adopt(&mut j, "route=n2; Path=/x"),
        Adoption::Ignored(Ignored::PathNotRoot)
    );
    assert_eq!(j.get("route", t(0)), Some("n1"));
    // No usable Path counts as root.
    assert_eq!(adopt(&mut j, "AWSALB=a; Path=relative"), Adoption::Stored);
}

#[test]
fn scope_domain_mismatch_is_ignored() {
    let mut j = jar();
    for line in [
        "route=x; Domain=other.example",
        "route=x; Domain=sub.app.example",
        "route=x; Domain=pp.example",
    ] {
        assert_eq!(
            adopt(&mut j, line),
            Adoption::Ignored(Ignored::DomainMismatch),
            "{line}"
        );
    }
    assert!(j.is_empty());
    // The host itself (any case, leading dot) and a parent domain are accepted, host-only.
    assert_eq!(
        adopt(&mut j, "route=n1; Domain=.APP.example"),
        Adoption::Stored
    );
    assert_eq!(
        adopt(&mut j, "SERVERID=s1; Domain=example"),
        Adoption::Stored
    );
    assert_eq!(
        j.cookie_header(&origin("https://www.example:8443"), t(0)),
        None
    );
}

#[test]
fn secure_cookie_over_http_is_refused() {
    let http = origin("http://app.example");
    let mut j = AffinityJar::new(http.clone());
    assert_eq!(
        j.adopt(&http, b"route=n1; Secure; Path=/", t(0)),
        Adoption::Ignored(Ignored::SecureOverInsecure)
    );
    // A Secure rewrite does not touch the held plain one either.
    j.adopt(&http, b"route=n0", t(0));
    j.adopt(&http, b"route=n1; Secure", t(0));
    assert_eq!(j.get("route", t(0)), Some("n0"));
}

#[test]
fn secure_cookie_is_sent_over_https_only() {
    let mut j = AffinityJar::new(origin("https://app.example"));
    assert_eq!(adopt(&mut j, "AWSALB=a1; Secure; Path=/"), Adoption::Stored);
    let h = |s: &str| j.cookie_header(&origin(s), t(0));
    assert_eq!(h("https://app.example/").as_deref(), Some("AWSALB=a1"));
    assert_eq!(h("wss://app.example/socket").as_deref(), Some("AWSALB=a1"));
    assert_eq!(h("http://app.example:443/"), None);
    assert_eq!(h("ws://app.example:443/"), None);
    assert_eq!(h("http://app.example/"), None);
}

#[test]
fn value_of_4096_is_kept_and_4097_is_ignored() {
    let mut j = jar();
    let max = "v".repeat(MAX_VALUE_LEN);
    let over = "w".repeat(MAX_VALUE_LEN + 1);
    assert_eq!(adopt(&mut j, &format!("route={max}")), Adoption::Stored);
    assert_eq!(
        adopt(&mut j, &format!("AWSALB={over}")),
        Adoption::Ignored(Ignored::ValueTooLong)
    );
    // An oversize rewrite leaves the held value alone.
    assert_eq!(
        adopt(&mut j, &format!("route={over}")),
        Adoption::Ignored(Ignored::ValueTooLong)
    );
    assert_eq!(j.get("route", t(0)), Some(max.as_str()));
    assert_eq!(j.len(), 1);
    // A deletion stores nothing, so its value's length does not stop it.
    assert_eq!(
        adopt(&mut j, &format!("route={over}; Max-Age=0")),
        Adoption::Removed
    );
    assert!(j.is_empty());
}

#[test]
fn a_ninth_cookie_is_ignored_but_rewrites_and_removals_still_apply() {
    let mut j = jar();
    for i in 0..MAX_COOKIES {
        assert_eq!(adopt(&mut j, &format!("AWSALB{i}=v{i}")), Adoption::Stored);
    }
    assert_eq!(
        adopt(&mut j, "route=n1"),
        Adoption::Ignored(Ignored::JarFull)
    );
    assert_eq!(j.get("route", t(0)), None);
    assert_eq!(adopt(&mut j, "AWSALB3=rewritten"), Adoption::Replaced);
    assert_eq!(j.get("AWSALB3", t(0)), Some("rewritten"));
    assert_eq!(j.len(), MAX_COOKIES);
    // A removal frees a slot for a new name.
    assert_eq!(adopt(&mut j, "AWSALB0=; Max-Age=0"), Adoption::Removed);
    assert_eq!(adopt(&mut j, "route=n1"), Adoption::Stored);
}

#[test]
fn a_cookie_that_lapsed_does_not_take_a_slot() {
    let mut j = jar();
    let from = j.origin().clone();
    for i in 0..MAX_COOKIES {
        j.adopt(&from, format!("AWSALB{i}=v; Max-Age=10").as_bytes(), t(0));
    }
    assert_eq!(j.adopt(&from, b"route=n1", t(10)), Adoption::Stored);
    assert_eq!(j.len(), 1);
}

#[test]
fn foreign_cookies_are_ignored_and_never_invalidate_anything() {
    let mut j = jar();
    adopt(&mut j, "route=n1; Path=/");
    // A balancer's and an application's cookies arrive on the same answers: none of these,
    // malformed or not, may touch the pin or make the adoption fail.
    for line in [
        "session=abc; Path=/; HttpOnly",
        "theme=dark",
        "session=; Max-Age=0",
        "Route=n9",
        "xroute=n9",
        "route2=n9",
        "awsalb=n9",
        "garbage without equals",
        "=novalue",
        "bad name=1",
        "route=bad value",
        "",
        ";;;",
    ] {
        let a = adopt(&mut j, line);
        assert!(matches!(a, Adoption::Ignored(_)), "{line:?} gave {a:?}");
    }
    assert_eq!(header(&j).as_deref(), Some("route=n1"));
    assert_eq!(j.len(), 1);
}

#[test]
fn the_awsalb_prefix_family_is_kept() {
    let mut j = jar();
    let family = [
        "AWSALB",
        "AWSALBCORS",
        "AWSALBTG",
        "AWSALBTGCORS",
        "AWSALBAPP-0",
    ];
    for name in family {
        assert_eq!(
            adopt(&mut j, &format!("{name}=x{name}; Path=/")),
            Adoption::Stored
        );
    }
    let expected: Vec<String> = family.iter().map(|n| format!("{n}=x{n}")).collect();
    assert_eq!(header(&j), Some(expected.join("; ")));
}

#[test]
fn configured_custom_names() {
    let names = CookieNames::new([
        NamePattern::exact("lb").expect("valid"),
        NamePattern::prefix("BIGip").expect("valid"),
    ]);
    let mut j = AffinityJar::with_names(origin(ORIGIN), names);
    assert_eq!(adopt(&mut j, "lb=1"), Adoption::Stored);
    assert_eq!(adopt(&mut j, "BIGipServerpool=2"), Adoption::Stored);
    for default_name in ["route=3", "AWSALB=4", "SERVERID=5"] {
        assert_eq!(
            adopt(&mut j, default_name),
            Adoption::Ignored(Ignored::NotBalancerCookie)
        );
    }
    assert_eq!(header(&j).as_deref(), Some("lb=1; BIGipServerpool=2"));
}

#[test]
fn merge_puts_jar_cookies_beside_the_applications() {
    let mut j = jar();
    let to = origin(ORIGIN);
    assert_eq!(j.merge_cookie_header(&to, None, t(0)), None);
    assert_eq!(
        j.merge_cookie_header(&to, Some("session=abc"), t(0))
            .as_deref(),
        Some("session=abc")
    );
    adopt(&mut j, "route=n2");
    assert_eq!(
        j.merge_cookie_header(&to, Some("session=abc;lang=en"), t(0))
            .as_deref(),
        Some("session=abc; lang=en; route=n2")
    );
    // A stale copy of the balancer's cookie from the application is replaced, not repeated.
    assert_eq!(
        j.merge_cookie_header(&to, Some("route=n1; session=abc"), t(0))
            .as_deref(),
        Some("session=abc; route=n2")
    );
    // Several header lines become one.
    let lines: [&[u8]; 2] = [b"a=1; b=2", b" c=3 ;"];
    assert_eq!(
        j.merge_cookie_lines(&to, lines, t(0)).as_deref(),
        Some(&b"a=1; b=2; c=3; route=n2"[..])
    );
    // Another origin gets the application's cookies only, its own route included.
    let idp = origin("https://idp.example");
    assert_eq!(
        j.merge_cookie_header(&idp, Some("route=mine"), t(0))
            .as_deref(),
        Some("route=mine")
    );
}

#[test]
fn clear_forgets_everything() {
    let mut j = jar();
    adopt(&mut j, "route=n1");
    j.clear();
    assert!(j.is_empty());
    assert_eq!(header(&j), None);
}

#[test]
fn shared_jar_reads_its_clock() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let clock = Arc::new(AtomicU64::new(0));
    let c = Arc::clone(&clock);
    let shared = SharedJar::with_clock(jar(), move || t(c.load(Ordering::SeqCst)));
    let o = shared.origin();
    shared.adopt_all(&o, [&b"route=n1; Max-Age=5"[..], b"theme=dark"]);
    assert_eq!(shared.cookie_header(&o).as_deref(), Some("route=n1"));
    clock.store(5, Ordering::SeqCst);
    assert_eq!(shared.cookie_header(&o), None);
    assert_eq!(shared.get("route"), None);
}
