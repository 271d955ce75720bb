//! `limpet probe` judges another balancer: HAProxy 2.6 with `cookie SRV insert indirect
//! nocache` in front of limpet's demo nodes. A missing `haproxy` fails this test (with how to
//! install it); it is never skipped.

mod common;

use std::collections::BTreeSet;

use common::haproxy::{cookie_config, Haproxy, Server};
use common::nodes;
use common::probe::probe;

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
