//! `limpet probe` (the built binary) against limpet's proxy and demo nodes running in this
//! process on 127.0.0.1 port 0: it passes with stickiness on, fails with `--sticky none`,
//! reports a re-pin (not a break) when the pinned node dies under `--watch`, and exits 2 when
//! it cannot judge, including when each session had a single answer naming its node. It
//! probes an app behind a login with `--header` and `--cookie`, and names a `--ws` path that
//! answers 200 for what it is.

mod common;

use std::collections::BTreeSet;

use common::probe::{probe, proxy_over_hosts, LoginNode, ProbeProc, LOGIN_COOKIE, LOGIN_TOKEN};
use common::{config, nodes, Proxy};
use limpet::proxy::{NodeConfig, ProxyConfig, Sticky};
use serde_json::Value;

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_with_stickiness_on() {
    let ns = nodes(&["a", "b", "c"]).await;
    let proxy = Proxy::start(config(&ns)).await;
    let run = probe(&[
        &proxy.url("/"),
        "--ws",
        "/ws",
        "--sessions",
        "6",
        "--requests",
        "4",
        "--json",
    ])
    .await;
    assert_eq!(run.code, Some(0), "{run:?}");
    let r = run.report();
    assert_eq!(r["event"], "report");
    assert_eq!(r["outcome"], "kept");
    let s = &r["summary"];
    assert_eq!((u(&s["breaks"]), u(&s["repins"])), (0, 0), "{s}");
    assert_eq!(u(&s["kept_affinity"]), 6);
    assert_eq!(u(&s["stayed_on_one_node"]), 6);
    // Discovery + the socket's greeting + 4 requests, per session, each naming its node.
    assert_eq!(u(&s["answers"]), 6 * 6);
    let spread: BTreeSet<&str> = s["spread"]
        .as_object()
        .expect("spread")
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        spread,
        BTreeSet::from(["a", "b", "c"]),
        "fresh sessions spread over every node"
    );
    // Discovery pinned each session, so its upgrade was a sticky hit: no cookie on the 101.
    // A client arriving without a pin is pinned by the 101 itself.
    assert_eq!(u(&s["cookie_on_101"]["no"]), 6, "{s}");
    assert_eq!(r["fresh_upgrade"]["status"], 101);
    assert_eq!(r["fresh_upgrade"]["cookie_set"], true);
    for session in r["sessions"].as_array().expect("sessions") {
        assert_eq!(session["kept_affinity"], true);
        assert_eq!(session["nodes"].as_array().map(Vec::len), Some(1));
        assert_eq!(session["first_node"], session["last_node"]);
    }
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fails_with_sticky_none() {
    let ns = nodes(&["a", "b"]).await;
    let mut cfg = config(&ns);
    cfg.sticky = Sticky::None;
    let proxy = Proxy::start(cfg).await;
    // One session alone on a round-robin of two: every answer alternates node, so the verdict
    // does not depend on how concurrent sessions interleave.
    let run = probe(&[
        &proxy.url("/"),
        "--ws",
        "/ws",
        "--sessions",
        "1",
        "--requests",
        "3",
    ])
    .await;
    assert_eq!(run.code, Some(1), "{run:?}");
    let out = &run.stdout;
    assert!(out.contains("FAIL: 1 of 1 session broke affinity"), "{out}");
    assert!(out.contains("BROKEN, 4 breaks"), "{out}");
    assert!(out.contains("0 re-pins, 4 breaks"), "{out}");
    proxy.stop().await;
}

/// A balancer whose cookie the probe does not keep (a name not among `--cookie-names`, here
/// `SRV`) breaks every session as one that is not sticky does; the report says which cookie
/// and why. Before, it read like a balancer with no stickiness at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cookie_the_probe_does_not_keep_is_named_in_the_failure() {
    let ns = nodes(&["a", "b"]).await;
    let mut cfg = config(&ns);
    cfg.sticky = Sticky::Cookie(limpet::proxy::CookieConfig {
        spec: limpet_core::CookieSpec {
            name: "SRV".into(),
            ..limpet_core::CookieSpec::proxy_default()
        },
        ..Default::default()
    });
    let proxy = Proxy::start(cfg).await;
    let run = probe(&[&proxy.url("/"), "--sessions", "1", "--requests", "3"]).await;
    assert_eq!(run.code, Some(1), "{run:?}");
    let out = &run.stdout;
    assert!(out.contains("FAIL: 1 of 1 session broke affinity"), "{out}");
    assert!(
        out.contains(
            "hint: answers set cookies the probe did not keep (SRV: not a --cookie-names name)"
        ),
        "{out}"
    );
    // Named, it is kept: the run passes.
    let run = probe(&[
        &proxy.url("/"),
        "--sessions",
        "1",
        "--requests",
        "3",
        "--cookie-names",
        "SRV",
    ])
    .await;
    assert_eq!(run.code, Some(0), "{run:?}");
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_pinned_node_under_watch_is_a_repin_not_a_break() {
    let ns = nodes(&["a", "b", "c"]).await;
    // Each node behind a host that can crash with every connection, the socket included.
    let (proxy, mut hosts) = proxy_over_hosts(&ns).await;
    let mut p = ProbeProc::spawn(&[
        &proxy.url("/"),
        "--ws",
        "/ws",
        "--sessions",
        "3",
        "--requests",
        "2",
        "--watch",
        "--rounds",
        "12",
        "--interval",
        "100ms",
        "--backoff-min",
        "20ms",
        "--json",
    ]);
    // The probe says when round 0 is over and where each session is: kill session 0's node
    // then. Eleven rounds (over a second) remain for the re-pin and the socket's reconnect.
    let round0 = p
        .wait_for_json(|v| v["event"] == "round" && v["round"] == 0)
        .await;
    let victim = round0["nodes"][0]
        .as_str()
        .expect("session 0 has a node")
        .to_owned();
    let moved_sessions: Vec<usize> = round0["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .enumerate()
        .filter(|(_, n)| n.as_str() == Some(victim.as_str()))
        .map(|(i, _)| i)
        .collect();
    hosts
        .iter_mut()
        .find(|(name, _)| *name == victim)
        .expect("victim host")
        .1
        .crash()
        .await;

    let run = p.finish().await;
    assert_eq!(run.code, Some(0), "re-pins keep affinity: {run:?}");
    let r = run.report();
    assert_eq!(r["outcome"], "kept", "{r}");
    assert_eq!(u(&r["rounds"]), 12);
    let s = &r["summary"];
    assert_eq!(u(&s["breaks"]), 0, "{s}");
    assert_eq!(u(&s["repins"]), moved_sessions.len() as u64, "{s}");
    // `split` may be non-zero here: a request can be re-pinned before the socket's close
    // reaches the probe. That window is what the count is for; it does not fail a run.
    // Each moved session's socket closed with the node and was reconnected on the new one.
    let sessions = r["sessions"].as_array().expect("sessions");
    for &i in &moved_sessions {
        let sess = &sessions[i];
        assert_eq!(u(&sess["repins"]), 1, "{sess}");
        let m = &sess["moves"][0];
        assert_eq!(
            (m["kind"].as_str(), m["from"].as_str()),
            (Some("repin"), Some(victim.as_str()))
        );
        assert_ne!(sess["last_node"], victim.as_str());
        assert_eq!(u(&sess["socket_closes"]), 1, "{sess}");
        assert_eq!(u(&sess["upgrades"]), 2, "reconnected: {sess}");
    }
    // The live move line came before the report, as it happened.
    assert!(
        run.stdout
            .lines()
            .any(|l| l.contains(r#""event":"move""#) && l.contains(r#""kind":"repin""#)),
        "{}",
        run.stdout
    );
    proxy.stop().await;
}

#[tokio::test]
async fn exits_2_when_it_cannot_judge() {
    // A port nothing listens on: bound, then closed.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port");
    let run = probe(&[&format!("http://{addr}/"), "--sessions", "2"]).await;
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(
        run.stdout.contains("CANNOT JUDGE: nothing answered"),
        "{run:?}"
    );

    let run = probe(&["ftp://127.0.0.1/"]).await;
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(run.stderr.contains("unsupported scheme"), "{run:?}");
    let run = probe(&["http://127.0.0.1/", "--rounds", "3"]).await;
    assert_eq!(run.code, Some(2), "--rounds needs --watch: {run:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exits_2_when_no_answer_names_its_node() {
    let ns = nodes(&["a", "b"]).await;
    let proxy = Proxy::start(config(&ns)).await;
    let run = probe(&[&proxy.url("/"), "--node-header", "X-Served-By", "--json"]).await;
    assert_eq!(run.code, Some(2), "{run:?}");
    let r = run.report();
    assert_eq!(r["outcome"], "unjudged");
    assert_eq!(r["exit_code"], 2);

    // Discovery alone names the node once per session: too little to pass, and said so.
    let run = probe(&[&proxy.url("/"), "--requests", "0", "--json"]).await;
    assert_eq!(run.code, Some(2), "{run:?}");
    let r = run.report();
    assert_eq!(
        (&r["outcome"], &r["summary"]["answers"]),
        (&"unjudged".into(), &4.into())
    );
    let hint = r["hint"].as_str().expect("a hint");
    assert!(hint.contains("--requests 1"), "{hint}");
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_named_answer_per_session_is_unjudged_not_a_pass() {
    // The reported case: a balancer that is not sticky, a node header the nodes do not set,
    // and only each WebSocket's first frame naming a node (6 of 36 answers). It used to PASS.
    let ns = nodes(&["a", "b", "c"]).await;
    let mut cfg = config(&ns);
    cfg.sticky = Sticky::None;
    let proxy = Proxy::start(cfg).await;
    let run = probe(&[
        &proxy.url("/"),
        "--ws",
        "/ws",
        "--node-header",
        "X-Served-By",
        "--sessions",
        "6",
        "--requests",
        "4",
        "--json",
    ])
    .await;
    assert_eq!(run.code, Some(2), "{run:?}");
    let r = run.report();
    assert_eq!(r["outcome"], "unjudged", "{r}");
    assert_eq!(r["exit_code"], 2);
    let s = &r["summary"];
    assert_eq!(
        (
            u(&s["answers"]),
            u(&s["named_by_header"]),
            u(&s["unidentified"])
        ),
        (6, 0, 30),
        "{s}"
    );
    assert_eq!((u(&s["judged"]), u(&s["breaks"])), (0, 0), "{s}");
    for session in r["sessions"].as_array().expect("sessions") {
        assert_eq!(session["judged"], false, "{session}");
    }
    let hint = r["hint"].as_str().expect("a hint");
    assert!(hint.contains("--node-header"), "{hint}");

    // The human report says why, session by session, and what to try.
    let run = probe(&[
        &proxy.url("/"),
        "--ws",
        "/ws",
        "--node-header",
        "X-Served-By",
        "--sessions",
        "2",
        "--requests",
        "1",
    ])
    .await;
    assert_eq!(run.code, Some(2), "{run:?}");
    let out = &run.stdout;
    assert!(!out.contains("PASS"), "{out}");
    assert!(
        out.contains("CANNOT JUDGE: 2 of 2 sessions had fewer than 2 answers naming a node"),
        "{out}"
    );
    assert!(
        out.contains("UNJUDGED, only 1 answer named its node"),
        "{out}"
    );
    assert!(
        out.contains(
            "hint: no answer carried the node header x-served-by (only WebSocket first frames \
             named a node): is --node-header right?"
        ),
        "{out}"
    );
    proxy.stop().await;
}

/// Two nodes of an application behind a login (`a`, `b`), and limpet in front of them.
async fn behind_a_login() -> ([LoginNode; 2], Proxy) {
    let ns = [LoginNode::start("a").await, LoginNode::start("b").await];
    let proxy = Proxy::start(ProxyConfig::new(
        ns.iter()
            .map(|n| NodeConfig {
                name: n.name.clone(),
                addr: n.addr,
            })
            .collect(),
    ))
    .await;
    (ns, proxy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_and_cookie_options_reach_an_app_behind_a_login() {
    let (ns, proxy) = behind_a_login().await;
    let totals = || {
        ns.iter().fold((0, 0, 0), |(a, u, r), n| {
            let (na, nu, nr) = n.counts.get();
            (a + na, u + nu, r + nr)
        })
    };
    // One session alone on a round-robin of two: had the jar's pin been lost beside the
    // user's cookie, its answers would alternate node and break.
    let url = proxy.url("/");
    let base = [
        url.as_str(),
        "--ws",
        "/ws",
        "--sessions",
        "1",
        "--requests",
        "4",
        "--json",
    ];

    // Not logged in: every answer is the login's 401, naming no node.
    let run = probe(&base).await;
    assert_eq!(run.code, Some(2), "{run:?}");
    let r = run.report();
    assert_eq!(r["outcome"], "unjudged");
    assert_eq!(r["summary"]["denied"], r["summary"]["unidentified"], "{r}");
    let hint = r["hint"].as_str().expect("a hint");
    assert!(
        hint.contains("401 or 403") && hint.contains("--header") && hint.contains("--cookie"),
        "{hint}"
    );
    let (answered, upgraded, refused) = totals();
    assert_eq!((answered, upgraded), (0, 0));
    assert!(
        refused >= 6,
        "discovery, upgrades and requests refused: {refused}"
    );

    // Half logged in (the token without the session cookie): still refused.
    let auth = format!("Authorization: {LOGIN_TOKEN}");
    let mut token_only = base.to_vec();
    token_only.extend(["--header", auth.as_str()]);
    let run = probe(&token_only).await;
    assert_eq!(run.code, Some(2), "{run:?}");
    let (_, _, refused) = totals();

    let mut logged_in = token_only.clone();
    logged_in.extend(["--cookie", LOGIN_COOKIE, "--header", "X-Tenant: acme"]);
    let run = probe(&logged_in).await;
    assert_eq!(run.code, Some(0), "{run:?}");
    let r = run.report();
    assert_eq!(r["outcome"], "kept", "{r}");
    let s = &r["summary"];
    assert_eq!((u(&s["answers"]), u(&s["breaks"])), (6, 0), "{s}");
    // Every request and upgrade of the session, and the cookie-less upgrade, got through.
    assert_eq!(
        totals(),
        (5, 2, refused),
        "discovery + 4 requests, 2 upgrades, no refusal"
    );
    assert_eq!(r["fresh_upgrade"]["status"], 101);
    assert_eq!(
        r["headers"],
        serde_json::json!(["authorization", "x-tenant", "cookie"])
    );
    assert_eq!(r["cookies"], serde_json::json!(["sid"]));
    // Names are reported, values never.
    assert!(
        !run.stdout.contains("s3cr3t") && !run.stdout.contains("t0ken"),
        "{}",
        run.stdout
    );
    proxy.stop().await;
}

/// A WebSocket whose first text frame is the application's (a welcome message), not its
/// node's name, is named by the 101's node header: the run through sticky limpet is kept.
/// Before, the welcome was taken for the socket's node, every upgrade a move without a
/// rewrite, and the run broken (exit 1) against a balancer that kept every session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_named_by_its_101_s_header_is_judged_by_it() {
    let (_nodes, proxy) = behind_a_login().await;
    let url = proxy.url("/");
    let auth = format!("Authorization: {LOGIN_TOKEN}");
    let run = probe(&[
        url.as_str(),
        "--ws",
        "/ws-app",
        "--sessions",
        "2",
        "--requests",
        "3",
        "--header",
        auth.as_str(),
        "--cookie",
        LOGIN_COOKIE,
        "--json",
    ])
    .await;
    assert_eq!(run.code, Some(0), "{run:?}");
    let r = run.report();
    assert_eq!(r["outcome"], "kept", "{r}");
    let s = &r["summary"];
    assert_eq!(u(&s["breaks"]), 0, "{s}");
    assert_eq!(
        u(&s["answers"]),
        u(&s["named_by_header"]),
        "every answer, the upgrades too, named by the header: {s}"
    );
    assert!(u(&s["upgrades"]) >= 2, "{s}");
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_path_answering_200_is_named_for_what_it_is() {
    // The demo nodes answer `/` with a page: a wrong `--ws` is a 200, not a 101.
    let ns = nodes(&["a", "b"]).await;
    let proxy = Proxy::start(config(&ns)).await;
    let run = probe(&[
        &proxy.url("/"),
        "--ws",
        "/",
        "--sessions",
        "1",
        "--requests",
        "1",
    ])
    .await;
    let out = &run.stdout;
    assert!(
        out.contains(
            "error: the WebSocket path / answered 200 OK, not 101 Switching Protocols: is --ws / \
             a WebSocket endpoint?"
        ),
        "{run:?}"
    );
    assert!(!out.contains("HTTP error"), "{out}");
    assert!(
        out.contains("cookie-less upgrade: refused with 200"),
        "{out}"
    );
    // The WebSocket was asked for and never checked: the run cannot pass.
    assert!(
        out.contains("CANNOT JUDGE: no WebSocket upgrade was accepted"),
        "{out}"
    );
    assert_eq!(run.code, Some(2), "{run:?}");
    proxy.stop().await;
}
