//! `limpet probe` judges another balancer: HAProxy 2.6 with `cookie SRV insert indirect
//! nocache` in front of limpet's demo nodes; with the classic ELB's cookie name `AWSELB`,
//! which the probe knows without `--cookie-names`; and without any stickiness, probed with a
//! wrong node header, where only WebSocket greetings name a node and the run cannot pass.
//! A missing `haproxy` fails these tests (with how to install it); they are never skipped.

mod common;

use std::collections::BTreeSet;

use common::haproxy::{cookie_config, Haproxy, Server};
use common::nodes;
use common::probe::probe;
use common::Node;

fn servers(ns: &[Node]) -> Vec<Server<'_>> {
    ns.iter()
        .map(|n| Server {
            name: &n.name,
            addr: n.addr,
        })
        .collect()
}

/// The test configuration with its cookie renamed.
fn cookie_named(ns: &[Node], cookie: &str) -> String {
    let cfg = cookie_config(&servers(ns));
    let renamed = cfg.replace("cookie SRV insert", &format!("cookie {cookie} insert"));
    assert_ne!(cfg, renamed, "the cookie line moved:\n{cfg}");
    renamed
}

/// The test configuration without any stickiness: round-robin, no cookie at all.
fn not_sticky(ns: &[Node]) -> String {
    let mut cfg = String::new();
    for line in cookie_config(&servers(ns)).lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("cookie ") {
            continue;
        }
        let line = match line.find(" cookie ") {
            Some(i) if trimmed.starts_with("server ") => &line[..i],
            _ => line,
        };
        cfg.push_str(line);
        cfg.push('\n');
    }
    assert!(!cfg.contains("cookie"), "{cfg}");
    cfg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_against_haproxy_with_an_inserted_cookie() {
    let ns = nodes(&["a", "b", "c"]).await;
    let servers: Vec<Server<'_>> = ns
        .iter()
        .map(|n| Server {
            name: &n.name,
            addr: n.addr,
        })
        .collect();
    let mut haproxy = Haproxy::start(&cookie_config(&servers));
    let run = probe(&[
        &haproxy.url("/"),
        "--ws",
        "/ws",
        "--cookie-names",
        "SRV",
        "--sessions",
        "6",
        "--requests",
        "4",
        "--json",
    ])
    .await;
    if let Some(exit) = haproxy.exited() {
        panic!("{exit}\nconfig:\n{}", haproxy.config);
    }
    assert_eq!(run.code, Some(0), "{run:?}");
    let r = run.report();
    assert_eq!(r["outcome"], "kept", "{r}");
    assert_eq!(r["cookie_names"], serde_json::json!(["SRV"]));
    let s = &r["summary"];
    assert_eq!(s["breaks"], 0, "{s}");
    assert_eq!(s["kept_affinity"], 6, "{s}");
    assert_eq!(s["answers"], 6 * 6, "{s}");
    let spread: BTreeSet<&str> = s["spread"]
        .as_object()
        .expect("spread")
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(spread, BTreeSet::from(["a", "b", "c"]), "{s}");

    // The same run without telling the probe HAProxy's cookie name: its jar keeps nothing,
    // every request is a stranger to HAProxy, and the probe sees affinity break.
    let blind = probe(&[
        &haproxy.url("/"),
        "--sessions",
        "1",
        "--requests",
        "4",
        "--json",
    ])
    .await;
    assert_eq!(blind.code, Some(1), "{blind:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_classic_elb_cookie_awselb_is_known_by_default() {
    let ns = nodes(&["a", "b", "c"]).await;
    let mut haproxy = Haproxy::start(&cookie_named(&ns, "AWSELB"));
    // One session alone on a round-robin of three: a jar that dropped AWSELB would see every
    // request on another node.
    let run = probe(&[
        &haproxy.url("/"),
        "--ws",
        "/ws",
        "--sessions",
        "1",
        "--requests",
        "4",
        "--json",
    ])
    .await;
    if let Some(exit) = haproxy.exited() {
        panic!("{exit}\nconfig:\n{}", haproxy.config);
    }
    assert_eq!(run.code, Some(0), "{run:?}");
    let r = run.report();
    assert_eq!(r["outcome"], "kept", "{r}");
    assert!(
        r["cookie_names"]
            .as_array()
            .expect("cookie_names")
            .contains(&serde_json::json!("AWSELB")),
        "{r}"
    );
    let s = &r["summary"];
    assert_eq!((&s["answers"], &s["breaks"]), (&6.into(), &0.into()), "{s}");
    // The cookie-less upgrade was pinned by HAProxy's AWSELB on its 101.
    assert_eq!(r["fresh_upgrade"]["cookie_set"], true, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_balancer_that_is_not_sticky_cannot_pass_on_websocket_greetings_alone() {
    let ns = nodes(&["a", "b", "c"]).await;
    let mut haproxy = Haproxy::start(&not_sticky(&ns));
    let url = haproxy.url("/");
    let args = |header: &'static str| {
        [
            url.clone(),
            "--ws".into(),
            "/ws".into(),
            "--node-header".into(),
            header.into(),
            "--sessions".into(),
            "6".into(),
            "--requests".into(),
            "4".into(),
            "--json".into(),
        ]
    };
    // The reported case: the nodes do not set X-Served-By, so only each socket's first
    // frame names a node, once per session: nothing shows a move, and nothing may pass.
    let wrong = args("X-Served-By");
    let run = probe(&wrong.iter().map(String::as_str).collect::<Vec<_>>()).await;
    if let Some(exit) = haproxy.exited() {
        panic!("{exit}\nconfig:\n{}", haproxy.config);
    }
    assert_eq!(run.code, Some(2), "{run:?}");
    let r = run.report();
    assert_eq!(r["outcome"], "unjudged", "{r}");
    let s = &r["summary"];
    assert_eq!((&s["answers"], &s["judged"]), (&6.into(), &0.into()), "{s}");
    assert!(
        r["hint"]
            .as_str()
            .is_some_and(|h| h.contains("--node-header")),
        "{r}"
    );

    // With the header the nodes set, the same balancer is seen for what it is.
    let right = args("X-Limpet-Node");
    let run = probe(&right.iter().map(String::as_str).collect::<Vec<_>>()).await;
    assert_eq!(run.code, Some(1), "{run:?}");
    assert_eq!(run.report()["outcome"], "broken");
}
