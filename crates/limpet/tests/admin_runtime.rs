//! Node lifecycle against the real multi-listener runtime, driven through the admin API:
//! DRAIN keeps existing pins and gives no fresh ones; the drain deadline re-pins with
//! Set-Cookie and closes WebSockets with 1001 and TCP sessions; MAINT re-pins at once; a node
//! back UP gets fresh assignments while moved pins stay; active checks take a dead node DOWN;
//! tables are listed, looked up, deleted and cleared; drain completion is reported.

mod admin_common;

use std::time::Duration;

use admin_common::lifecycle::*;
use futures_util::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message;

const NODES: [(&str, &str); 2] = [("a", "127.0.0.2"), ("b", "127.0.0.3")];

fn config(port: u16, extra: &str) -> String {
    format!(
        "{}[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = {port}\n\n\
         [[listeners]]\nname = \"raw\"\nbind = \"127.0.0.1:0\"\nmode = \"tcp\"\nnode_port = {port}\n\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n\n[drain]\nspread = \"0s\"\nidle = \"0s\"\n{extra}",
        nodes_toml(&NODES)
    )
}

/// A cookie pinning a fresh client to `want`, taken from the rotation.
async fn pin_to(client: &reqwest::Client, url: &str, want: &str) -> String {
    for _ in 0..4 {
        let _ = client;
        let (s, node, set) = get(&bare_client(), url, None).await;
        assert_eq!(s, 200);
        if node == want {
            return set.unwrap_or_else(|| panic!("a fresh assignment sets the cookie"));
        }
    }
    panic!("never assigned to {want}");
}

/// A drain command with a deadline keeps a timer (for its log line at the deadline) only
/// until the next command to the node: automation that posts drains with far deadlines
/// again and again leaves no sleeping task behind for each. Before, each stayed until its
/// deadline, up to a year.
#[tokio::test]
async fn a_superseded_drain_deadline_leaves_no_timer_behind() {
    let (_nodes, port) = backend_nodes(&NODES).await;
    let cfg = ConfigFile::new("drain-timers", &config(port, ""));
    let l = Limpet::start(&cfg).await;
    let alive = || {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    };
    let before = alive();
    for _ in 0..50 {
        let v = set_state(&l, "a", r#"{"state":"drain","deadline_secs":31536000}"#).await;
        assert_eq!(v["state"], "DRAIN");
    }
    let v = set_state(&l, "a", r#"{"state":"ready"}"#).await;
    assert_eq!(v["state"], "UP", "{v}");
    // The timers end as they next run; the admin connections' tasks as their clients go.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while alive() > before + 5 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} tasks alive, {before} before 50 drain commands",
            alive()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    l.stop().await;
}

#[tokio::test]
async fn drain_keeps_pins_then_the_deadline_repins_and_maint_repins_at_once() {
    let (_nodes, port) = backend_nodes(&NODES).await;
    let cfg = ConfigFile::new("drain", &config(port, ""));
    let l = Limpet::start(&cfg).await;
    let url = format!("http://{}/", l.addr("web"));
    let c = bare_client();

    // A client pinned to a.
    let cookie_a = pin_to(&c, &url, "a").await;
    assert!(cookie_a.starts_with("route=a"), "{cookie_a}");

    // DRAIN without a deadline: the pin holds, fresh clients all go to b.
    let v = set_state(&l, "a", r#"{"state":"drain"}"#).await;
    assert_eq!(v["state"], "DRAIN");
    for _ in 0..5 {
        let (s, node, set) = get(&c, &url, Some(&cookie_a)).await;
        assert_eq!((s, node.as_str(), set), (200, "a", None), "pin honoured");
    }
    for _ in 0..6 {
        // A new client (a new connection: a connection's first node is its own pin).
        let (_, node, set) = get(&bare_client(), &url, None).await;
        assert_eq!(node, "b", "no fresh assignment to a draining node");
        assert!(set.is_some_and(|s| s.starts_with("route=b")));
    }
    // Nothing open, idle window 0: the drain is complete and the API says so.
    let view = node_view(&l, "a").await;
    assert_eq!(view["drain"]["complete"], true, "{view}");
    assert!(view["sessions_seen"].as_u64().unwrap_or(0) >= 1, "{view}");

    // The deadline (now, no spread): the next request moves with a Set-Cookie.
    set_state(&l, "a", r#"{"state":"drain","deadline_secs":0}"#).await;
    let (s, node, set) = get(&c, &url, Some(&cookie_a)).await;
    assert_eq!((s, node.as_str()), (200, "b"));
    assert_eq!(set.as_deref(), Some("route=b"), "re-pinned with Set-Cookie");

    // Back UP: fresh assignments reach a again; the moved client stays on b (no failback).
    set_state(&l, "a", r#"{"state":"ready"}"#).await;
    let (_, node, set) = get(&c, &url, Some("route=b")).await;
    assert_eq!((node.as_str(), set), ("b", None));
    let mut fresh = Vec::new();
    for _ in 0..4 {
        fresh.push(get(&bare_client(), &url, None).await.1);
    }
    assert!(fresh.iter().any(|n| n == "a"), "{fresh:?}");

    // MAINT: re-pinned at once, no deadline.
    let cookie_a = pin_to(&c, &url, "a").await;
    set_state(&l, "a", r#"{"state":"maint"}"#).await;
    let (_, node, set) = get(&c, &url, Some(&cookie_a)).await;
    assert_eq!((node.as_str(), set.as_deref()), ("b", Some("route=b")));

    // The outcomes are counted.
    let metrics = metrics_text(&l).await;
    for want in [
        r#"limpet_pins_total{listener="web",outcome="repinned",reason="drain-ended"} 1"#,
        r#"limpet_pins_total{listener="web",outcome="repinned",reason="node-maint"} 1"#,
        r#"limpet_node_state{node="a",state="MAINT"} 1"#,
        r#"limpet_requests_total{listener="web",node="b",class="2xx"}"#,
        r#"limpet_upstream_latency_seconds_count{listener="web",node="a"}"#,
    ] {
        assert!(metrics.contains(want), "missing {want}:\n{metrics}");
    }
    l.stop().await;
}

#[tokio::test]
async fn the_drain_deadline_closes_websockets_with_1001_and_tcp_sessions() {
    let (_nodes, port) = backend_nodes(&NODES).await;
    let cfg = ConfigFile::new("deadline", &config(port, ""));
    let l = Limpet::start(&cfg).await;

    // A WebSocket through the HTTP listener and a TCP session through the raw one, both on a.
    let ws_url = format!("ws://{}/ws", l.addr("web"));
    let mut ws = None;
    for _ in 0..4 {
        let (mut s, _) = tokio_tungstenite::connect_async(ws_url.as_str())
            .await
            .unwrap_or_else(|e| panic!("websocket: {e}"));
        let first = tokio::time::timeout(PATIENCE, s.next())
            .await
            .ok()
            .flatten();
        match first {
            Some(Ok(Message::Text(t))) if t.as_str() == "a" => {
                ws = Some(s);
                break;
            }
            _ => {}
        }
    }
    let mut ws = ws.unwrap_or_else(|| panic!("no websocket landed on a"));
    // A TCP session on a: ask the node over the raw session who it is (keep-alive).
    let mut tcp = None;
    for _ in 0..4 {
        let mut s = tokio::net::TcpStream::connect(l.addr("raw"))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let mut head = Vec::new();
        let mut b = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = tokio::time::timeout(PATIENCE, s.read(&mut b))
                .await
                .unwrap_or_else(|_| panic!("no answer"))
                .unwrap_or(0);
            if n == 0 {
                break;
            }
            head.extend_from_slice(&b[..n]);
        }
        if String::from_utf8_lossy(&head)
            .to_ascii_lowercase()
            .contains("x-limpet-node: a\r\n")
        {
            tcp = Some(s);
            break;
        }
    }
    let mut tcp = tcp.unwrap_or_else(|| panic!("no TCP session landed on a"));
    let view = node_view(&l, "a").await;
    assert_eq!(
        view["tunnels"], 2,
        "the WebSocket and the TCP session: {view}"
    );

    set_state(&l, "a", r#"{"state":"drain","deadline_secs":0.05}"#).await;
    let m = tokio::time::timeout(PATIENCE, ws.next())
        .await
        .unwrap_or_else(|_| panic!("no close in time"));
    match m {
        Some(Ok(Message::Close(Some(f)))) => {
            assert_eq!(f.code, CloseCode::Away, "{f:?}");
        }
        other => panic!("expected close 1001, got {other:?}"),
    }
    let mut buf = [0u8; 4096];
    loop {
        let n = tokio::time::timeout(PATIENCE, tcp.read(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("TCP session not closed at the deadline"));
        if matches!(n, Ok(0) | Err(_)) {
            break;
        }
    }
    l.stop().await;
}

#[tokio::test]
async fn an_http_check_takes_a_dead_node_down_and_the_api_shows_why() {
    let (mut nodes, port) = backend_nodes(&NODES).await;
    let extra = "\n[health]\nfall = 2\nrise = 1\ninterval = \"100ms\"\ntimeout = \"500ms\"\n";
    let text = config(port, extra).replace(
        "name = \"web\"\nbind = \"127.0.0.1:0\"\n",
        "name = \"web\"\nbind = \"127.0.0.1:0\"\ncheck = { kind = \"http\", path = \"/status/204\", expect = \"200-299\" }\n",
    );
    let cfg = ConfigFile::new("checks", &text);
    let l = Limpet::start(&cfg).await;
    // Both UP and checked.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let v = node_view(&l, "b").await;
        if v["checks"][0]["checks"].as_u64().unwrap_or(0) >= 1 {
            assert_eq!(v["checks"][0]["last"]["status"], 204, "{v}");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "no check ran: {v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    nodes[1].kill().await;
    let v = wait_state(&l, "b", "DOWN").await;
    assert_eq!(v["healthy"], false);
    // No traffic went to b: its checks took it DOWN.
    assert_eq!(v["health"]["down_cause"], "checks", "{v}");
    assert!(
        v["checks"][0]["last_error"]
            .as_str()
            .unwrap_or("")
            .starts_with("connect:"),
        "{v}"
    );
    // Traffic avoids it.
    let c = bare_client();
    for _ in 0..4 {
        assert_eq!(
            get(&c, &format!("http://{}/", l.addr("web")), None).await.1,
            "a"
        );
    }
    let metrics = metrics_text(&l).await;
    assert!(
        metrics.contains(r#"limpet_health_transitions_total{node="b",to="down"} 1"#),
        "{metrics}"
    );

    // The failure model's flapping node: back (UP after `rise`), then dead again (DOWN
    // after `fall`). Each change is counted, in the API and in the metrics.
    let ip = nodes[1].ip;
    nodes[1] = backend_node_again("b", ip, port).await;
    wait_state(&l, "b", "UP").await;
    nodes[1].kill().await;
    let v = wait_state(&l, "b", "DOWN").await;
    assert_eq!(v["checks"][0]["transitions"], 3, "down, up, down: {v}");
    let metrics = metrics_text(&l).await;
    for line in [
        r#"limpet_health_transitions_total{node="b",to="down"} 2"#,
        r#"limpet_health_transitions_total{node="b",to="up"} 1"#,
        r#"limpet_health_transitions_total{node="a",to="down"} 0"#,
    ] {
        assert!(metrics.contains(line), "{line} in:\n{metrics}");
    }
    l.stop().await;
}

/// Waits (bounded) until node `name`'s state is `state`; its view then.
async fn wait_state(l: &Limpet, name: &str, state: &str) -> serde_json::Value {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let v = node_view(l, name).await;
        if v["state"] == state {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name} never went {state}: {v}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn tables_are_listed_paged_looked_up_deleted_and_cleared() {
    let (_nodes, port) = backend_nodes(&NODES).await;
    let text = format!(
        "{}[[tables]]\nname = \"by-ip\"\nkey = \"source-ip\"\nsize = 100\n\n\
         [[listeners]]\nname = \"raw\"\nbind = \"127.0.0.1:0\"\nmode = \"tcp\"\nnode_port = {port}\ntable = \"by-ip\"\n\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n",
        nodes_toml(&NODES)
    );
    let cfg = ConfigFile::new("tables", &text);
    let l = Limpet::start(&cfg).await;
    // Three clients from three source addresses, each pinned in the table.
    for src in ["127.0.0.11", "127.0.0.12", "127.0.0.13"] {
        let sock = tokio::net::TcpSocket::new_v4().unwrap_or_else(|e| panic!("{e}"));
        sock.bind(format!("{src}:0").parse().unwrap_or_else(|e| panic!("{e}")))
            .unwrap_or_else(|e| panic!("{e}"));
        let s = sock
            .connect(l.addr("raw"))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        drop(s);
    }
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let tables = loop {
        let t = admin_json(&l, "/api/v1/tables").await;
        if t[0]["size"].as_u64() == Some(3) {
            break t;
        }
        assert!(tokio::time::Instant::now() < deadline, "{t}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(tables[0]["name"], "by-ip");
    assert_eq!(tables[0]["capacity"], 100);
    let page = admin_json(&l, "/api/v1/tables/by-ip?offset=0&limit=2").await;
    assert_eq!(page["total"], 3);
    assert_eq!(page["entries"].as_array().map(Vec::len), Some(2));
    let e = admin_json(&l, "/api/v1/tables/by-ip/entry?key=127.0.0.12").await;
    assert!(e["node"] == "a" || e["node"] == "b", "{e}");
    let pins: u64 = {
        let nodes = admin_json(&l, "/api/v1/nodes").await;
        nodes
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|n| n["table_pins"].as_u64().unwrap_or(0))
                    .sum()
            })
            .unwrap_or(0)
    };
    assert_eq!(pins, 3, "pins held in tables, per node");
    let c = bare_client();
    let r = c
        .delete(l.admin_url("/api/v1/tables/by-ip/entry?key=127.0.0.12"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status().as_u16(), 200);
    let r = c
        .get(l.admin_url("/api/v1/tables/by-ip/entry?key=127.0.0.12"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status().as_u16(), 404);
    let r = c
        .get(l.admin_url("/api/v1/tables/by-ip/entry?key=not-an-ip"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status().as_u16(), 400);
    let r = c
        .delete(l.admin_url("/api/v1/tables/by-ip"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status().as_u16(), 200);
    let t = admin_json(&l, "/api/v1/tables").await;
    assert_eq!(t[0]["size"], 0);
    l.stop().await;
}

/// A header table's entries are found and deleted by the key its page lists, whatever the
/// value: one over 256 bytes (kept as its digest, listed as `sha256:` and hex) and one with a
/// quote and a byte that is not ASCII (listed with escapes). Before, the admin API read the
/// listed text as a raw value and answered 404 to both: the one pin an operator most needs
/// to remove (a stuck or hijacked session's) could not be. A page starts at its `offset`
/// exactly (it was rounded down to a multiple of `limit`).
#[tokio::test]
async fn a_header_table_s_entries_are_found_and_deleted_by_the_key_listed() {
    let (_nodes, port) = backend_nodes(&NODES).await;
    let text = format!(
        "{}[[tables]]\nname = \"t\"\nheader = \"X-Sess\"\n\n\
         [[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = {port}\ntable = \"t\"\n\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n",
        nodes_toml(&NODES)
    );
    let cfg = ConfigFile::new("tables-keys", &text);
    let l = Limpet::start(&cfg).await;
    let long = vec![b'j'; 300];
    let values: [&[u8]; 3] = [&long, b"a\"b\xff", b"plain"];
    let c = bare_client();
    for v in values {
        let r = c
            .get(format!("http://{}/", l.addr("web")))
            .header(
                "x-sess",
                reqwest::header::HeaderValue::from_bytes(v).unwrap_or_else(|e| panic!("{e}")),
            )
            .send()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.status().as_u16(), 200);
    }
    let page = admin_json(&l, "/api/v1/tables/t?offset=0&limit=10").await;
    let listed: Vec<(String, String)> = page["entries"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|e| {
                    let s = |k: &str| e[k].as_str().unwrap_or_default().to_owned();
                    (s("key"), s("node"))
                })
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(listed.len(), 3, "{page}");
    assert!(
        listed.iter().any(|(k, _)| k.starts_with("sha256:")),
        "{page}"
    );
    assert!(listed.iter().any(|(k, _)| k == "a\\\"b\\xff"), "{page}");
    // From position 1 exactly, not from the page that holds it.
    let from_one = admin_json(&l, "/api/v1/tables/t?offset=1&limit=2").await;
    assert_eq!(from_one["offset"], 1, "{from_one}");
    let keys = |p: &serde_json::Value| -> Vec<String> {
        p["entries"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|e| e["key"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(keys(&from_one), keys(&page)[1..3].to_vec());
    let entry_url = |key: &str| {
        let mut u = reqwest::Url::parse(&l.admin_url("/api/v1/tables/t/entry"))
            .unwrap_or_else(|e| panic!("{e}"));
        u.query_pairs_mut().append_pair("key", key);
        u
    };
    for (key, node) in &listed {
        let e = admin_json(
            &l,
            &format!(
                "/api/v1/tables/t/entry?{}",
                entry_url(key).query().unwrap_or_default()
            ),
        )
        .await;
        assert_eq!(e["key"], key.as_str(), "{e}");
        assert_eq!(e["node"], node.as_str(), "{e}");
        let r = c
            .delete(entry_url(key))
            .send()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.status().as_u16(), 200, "delete {key}");
        let r = c
            .get(entry_url(key))
            .send()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.status().as_u16(), 404, "{key} still there");
    }
    l.stop().await;
}

/// A node checked on two ports (the failure of a print server whose print service stopped
/// while its web pages still load): `b`'s raw port is dead, its web port answers. `b` goes
/// DOWN on the raw check's `fall`-th failure although its web check passes in between (each
/// pass used to reset the count: the node stayed UP, and sessions kept being pinned to a node
/// whose raw port refused them), stays DOWN while the web check passes, and `a`, whose ports
/// all answer, stays UP. A reload that drops the raw check brings `b` back on the web check.
#[tokio::test]
async fn a_node_whose_raw_port_is_dead_goes_down_although_its_web_check_passes() {
    let (_nodes, port) = backend_nodes(&NODES).await;
    // The raw service, alive on `a` only (nothing listens on `b`'s address at that port).
    let raw_a = tokio::net::TcpListener::bind("127.0.0.2:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let raw_port = raw_a.local_addr().unwrap_or_else(|e| panic!("{e}")).port();
    let raw_service = tokio::spawn(async move {
        while let Ok((s, _)) = raw_a.accept().await {
            drop(s);
        }
    });
    let extra = "\n[health]\nfall = 2\nrise = 1\ninterval = \"100ms\"\ntimeout = \"500ms\"\n";
    let web_checked = config(port, extra).replace(
        "name = \"web\"\nbind = \"127.0.0.1:0\"\n",
        "name = \"web\"\nbind = \"127.0.0.1:0\"\ncheck = { kind = \"http\", path = \"/status/204\" }\n",
    );
    let both_checked = web_checked.replace(
        "mode = \"tcp\"\n",
        &format!("mode = \"tcp\"\ncheck = {{ kind = \"tcp\", port = {raw_port} }}\n"),
    );
    let cfg = ConfigFile::new("two-checks", &both_checked);
    let l = Limpet::start(&cfg).await;
    let web_checks = |v: &serde_json::Value| {
        v["checks"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["kind"] == "http"))
            .and_then(|c| c["checks"].as_u64())
            .unwrap_or(0)
    };
    let v = wait_state(&l, "b", "DOWN").await;
    let at_down = web_checks(&v);
    // Ten more web checks of `b`, all passing: `b` stays DOWN, `a` UP.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let v = node_view(&l, "b").await;
        assert_eq!(v["state"], "DOWN", "{v}");
        if web_checks(&v) >= at_down + 10 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "web checks stopped: {v}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(node_view(&l, "a").await["state"], "UP");
    let c = bare_client();
    for _ in 0..4 {
        assert_eq!(
            get(&c, &format!("http://{}/", l.addr("web")), None).await.1,
            "a"
        );
    }

    cfg.write(&web_checked);
    let (status, report) = reload(&l).await;
    assert_eq!(status, 200, "{report}");
    wait_state(&l, "b", "UP").await;
    raw_service.abort();
    l.stop().await;
}

/// Without checks, a hung node behind an HTTP and a TCP listener (its kernel completes every
/// connect into the backlog; nothing ever answers): the TCP sessions' completed connects do
/// not hide its unanswered HTTP requests, and it goes DOWN on the `fall`-th of them (chaos
/// run 25: each completed connect reset the count, and the node stayed UP while every HTTP
/// request sent to it waited out its answer timeout). A TCP session pinned to it by the
/// table connects between every two HTTP requests.
#[tokio::test]
async fn without_checks_a_hung_node_behind_http_and_tcp_listeners_goes_down() {
    let (hung, port, _b) = loop {
        let hung = tokio::net::TcpListener::bind("127.0.0.2:0")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let port = hung.local_addr().unwrap_or_else(|e| panic!("{e}")).port();
        if std::net::TcpListener::bind(("127.0.0.3", port)).is_ok() {
            let b = backend_node_again("b", "127.0.0.3".parse().expect("ip"), port).await;
            break (hung, port, b);
        }
    };
    let text = format!(
        "[[tables]]\nname = \"t\"\nkey = \"source-ip\"\n\n{}",
        config(port, "\n[health]\nfail_timeout = \"60s\"\n")
            .replace(
                "name = \"web\"\nbind = \"127.0.0.1:0\"\n",
                "name = \"web\"\nbind = \"127.0.0.1:0\"\ntimeouts = { upstream_answer = \"300ms\" }\n",
            )
            .replace("mode = \"tcp\"\n", "mode = \"tcp\"\ntable = \"t\"\n")
    );
    let cfg = ConfigFile::new("hung-mixed", &text);
    let l = Limpet::start(&cfg).await;
    let tcp_from = |src: String| {
        let raw = l.addr("raw");
        async move {
            let sock = tokio::net::TcpSocket::new_v4().unwrap_or_else(|e| panic!("{e}"));
            sock.bind(format!("{src}:0").parse().unwrap_or_else(|e| panic!("{e}")))
                .unwrap_or_else(|e| panic!("{e}"));
            sock.connect(raw).await.unwrap_or_else(|e| panic!("{e}"))
        }
    };
    let tunnels_of_a = || async { node_view(&l, "a").await["tunnels"].as_u64().unwrap_or(0) };
    // A source the table pins to the hung node a.
    let mut held = Vec::new();
    for i in 0..8 {
        let src = format!("127.0.0.{}", 20 + i);
        let s = tcp_from(src.clone()).await;
        let deadline = tokio::time::Instant::now() + PATIENCE;
        let node = loop {
            let e = admin_json(&l, &format!("/api/v1/tables/t/entry?key={src}")).await;
            if let Some(n) = e["node"].as_str() {
                break n.to_owned();
            }
            assert!(tokio::time::Instant::now() < deadline, "no entry for {src}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        if node == "a" {
            held.push(s);
            break;
        }
    }
    let src = match held.first() {
        Some(s) => s.local_addr().expect("addr").ip().to_string(),
        None => panic!("no source pinned to a"),
    };
    let url = format!("http://{}/", l.addr("web"));
    let mut down = false;
    for _ in 0..20 {
        // One TCP session more on a, its connect completed (and observed) before the next
        // HTTP request: a's tunnel count shows it.
        held.push(tcp_from(src.clone()).await);
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while tunnels_of_a().await < held.len() as u64 {
            if node_view(&l, "a").await["state"] == "DOWN" {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "session not relayed"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let (s, node, _) = get(&bare_client(), &url, None).await;
        assert_eq!(
            (s, node.as_str()),
            (200, "b"),
            "a GET that met a fails over"
        );
        if node_view(&l, "a").await["state"] == "DOWN" {
            down = true;
            break;
        }
    }
    assert!(
        down,
        "the hung node never went DOWN: {}",
        node_view(&l, "a").await
    );
    drop((held, hung));
    l.stop().await;
}

/// An answer that streams (server-sent events) from a node, read as it comes: the node that
/// answered and the end, once it comes (`Ok` for a clean end, `Err` for a cut).
struct EventStream {
    node: String,
    ended: tokio::sync::oneshot::Receiver<Result<(), String>>,
    events: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    reader: tokio::task::JoinHandle<()>,
}

impl Drop for EventStream {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// Opens `/events` through `web` with `cookie` over HTTP/1.1 (a GET, which limpet's own
/// HTTP/1 path carries, or a POST with a body, which hyper's client carries) or HTTP/2, and
/// waits for its first event.
async fn events(web: std::net::SocketAddr, cookie: &str, how: &str) -> EventStream {
    use std::sync::atomic::{AtomicUsize, Ordering};
    // No whole-request timeout: the answer is meant to last.
    let mut client = reqwest::Client::builder().no_proxy();
    if how == "h2" {
        client = client.http2_prior_knowledge();
    }
    let client = client.build().unwrap_or_else(|e| panic!("{e}"));
    let url = format!("http://{web}/events?ms=100");
    let req = if how == "post" {
        client.post(&url).body("a body")
    } else {
        client.get(&url)
    };
    let mut resp = req
        .header("cookie", cookie)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{how}: {e}"));
    assert_eq!(resp.status(), 200, "{how}");
    let node = resp
        .headers()
        .get(limpet::backend::NODE_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let first = tokio::time::timeout(PATIENCE, resp.chunk())
        .await
        .unwrap_or_else(|_| panic!("{how}: no first event"));
    assert!(matches!(first, Ok(Some(_))), "{how}: {first:?}");
    let events = std::sync::Arc::new(AtomicUsize::new(1));
    let (tx, ended) = tokio::sync::oneshot::channel();
    let counted = std::sync::Arc::clone(&events);
    let reader = tokio::spawn(async move {
        let end = loop {
            match resp.chunk().await {
                Ok(Some(_)) => {
                    counted.fetch_add(1, Ordering::Relaxed);
                }
                Ok(None) => break Ok(()),
                Err(e) => break Err(e.to_string()),
            }
        };
        let _ = tx.send(end);
    });
    EventStream {
        node,
        ended,
        events,
        reader,
    }
}

/// Answers still streaming from a draining node (server-sent events over HTTP/1.1 on both of
/// limpet's paths to the node, and over HTTP/2) go on until the drain's deadline, and are
/// cut at it, as its tunnels are closed; the drain is then complete. Before, they ran on for
/// as long as the node kept them going, the drain never complete.
#[tokio::test]
async fn answers_streaming_from_a_draining_node_are_cut_at_its_deadline() {
    let (_nodes, port) = backend_nodes(&NODES).await;
    let cfg = ConfigFile::new("drain-streams", &config(port, ""));
    let l = Limpet::start(&cfg).await;
    let url = format!("http://{}/", l.addr("web"));
    let cookie = pin_to(&bare_client(), &url, "a").await;
    let mut streams = Vec::new();
    for how in ["get", "post", "h2"] {
        let s = events(l.addr("web"), &cookie, how).await;
        assert_eq!(s.node, "a", "{how}");
        streams.push((how, s));
    }
    let set = tokio::time::Instant::now();
    set_state(&l, "a", r#"{"state":"drain","deadline_secs":1}"#).await;
    let view = node_view(&l, "a").await;
    assert_eq!(view["drain"]["complete"], false, "{view}");
    for (how, s) in &mut streams {
        let ended = tokio::time::timeout(PATIENCE, &mut s.ended)
            .await
            .unwrap_or_else(|_| panic!("{how}: still streaming {PATIENCE:?} after the drain"))
            .unwrap_or_else(|e| panic!("{how}: {e}"));
        let took = set.elapsed();
        assert!(ended.is_err(), "{how}: cut, not ended cleanly");
        // Kept until the deadline (a second), events coming all along.
        assert!(
            took >= Duration::from_millis(900),
            "{how}: cut {took:?} after the drain, before its deadline"
        );
        assert!(
            s.events.load(std::sync::atomic::Ordering::Relaxed) >= 5,
            "{how}: the stream went on until the deadline"
        );
    }
    assert!(set.elapsed() < Duration::from_millis(1000 + 2000));
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let view = node_view(&l, "a").await;
        if view["drain"]["complete"] == true {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{view}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    l.stop().await;
}

/// MAINT cuts an answer still streaming from the node at once, as it closes the node's
/// tunnels; a node that stays UP keeps its streams. (An answer watches its node once it has
/// waited on it for a second, so that most answers, done sooner, never pay for the watch.)
#[tokio::test]
async fn maint_cuts_answers_streaming_from_the_node_at_once() {
    let (_nodes, port) = backend_nodes(&NODES).await;
    let cfg = ConfigFile::new("maint-streams", &config(port, ""));
    let l = Limpet::start(&cfg).await;
    let url = format!("http://{}/", l.addr("web"));
    let on_a = pin_to(&bare_client(), &url, "a").await;
    let on_b = pin_to(&bare_client(), &url, "b").await;
    let mut a = events(l.addr("web"), &on_a, "h2").await;
    let mut b = events(l.addr("web"), &on_b, "get").await;
    assert_eq!((a.node.as_str(), b.node.as_str()), ("a", "b"));
    // A stream: it has been going for a while (an answer watches its node once it has
    // waited on it a second), 15 events at 100 ms.
    tokio::time::timeout(PATIENCE, async {
        while a.events.load(std::sync::atomic::Ordering::Relaxed) < 15 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("a's stream stopped"));
    let set = tokio::time::Instant::now();
    set_state(&l, "a", r#"{"state":"maint"}"#).await;
    let ended = tokio::time::timeout(PATIENCE, &mut a.ended)
        .await
        .unwrap_or_else(|_| panic!("still streaming {PATIENCE:?} after MAINT"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(ended.is_err(), "cut, not ended cleanly");
    assert!(
        set.elapsed() < Duration::from_secs(1),
        "{:?}",
        set.elapsed()
    );
    // b's goes on: three more events come, and no end.
    let before = b.events.load(std::sync::atomic::Ordering::Relaxed);
    tokio::time::timeout(PATIENCE, async {
        while b.events.load(std::sync::atomic::Ordering::Relaxed) < before + 3 {
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("b's stream stopped"));
    assert!(b.ended.try_recv().is_err(), "b's stream goes on");
    drop(b);
    l.stop().await;
}
