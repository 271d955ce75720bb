//! Hot reload of the real runtime through the admin API: under a running load generator no
//! request fails and every pin holds; node states survive; a bad config is refused with the
//! reason while the old one keeps serving; a removed node's pins re-pin as for MAINT.

mod admin_common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use admin_common::lifecycle::*;

const NODES: [(&str, &str); 3] = [("a", "127.0.0.2"), ("b", "127.0.0.3"), ("c", "127.0.0.4")];

fn config(port: u16, nodes: &[(&str, &str)], b_weight: u32) -> String {
    let mut n = nodes_toml(nodes);
    n = n.replace(
        "name = \"b\"\naddress = \"127.0.0.3\"\n",
        &format!("name = \"b\"\naddress = \"127.0.0.3\"\nweight = {b_weight}\n"),
    );
    format!(
        "{n}[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = {port}\n\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloads_under_load_fail_no_request_and_keep_every_pin() {
    let (_nodes, port) = backend_nodes(&NODES).await;
    let cfg = ConfigFile::new("reload-load", &config(port, &NODES[..2], 1));
    let l = Limpet::start(&cfg).await;
    let url = format!("http://{}/", l.addr("web"));

    // Eight sessions, each with its cookie and node.
    let mut sessions = Vec::new();
    for _ in 0..8 {
        let (s, node, set) = get(&bare_client(), &url, None).await;
        assert_eq!(s, 200);
        sessions.push((node, set.unwrap_or_else(|| panic!("cookie"))));
    }
    // A node state that must survive the reloads.
    set_state(&l, "b", r#"{"state":"drain"}"#).await;

    let failures = Arc::new(AtomicU64::new(0));
    let served = Arc::new(AtomicU64::new(0));
    let mut load = tokio::task::JoinSet::new();
    for (node, cookie) in sessions.clone() {
        let (url, failures, served) = (url.clone(), Arc::clone(&failures), Arc::clone(&served));
        load.spawn(async move {
            let c = bare_client();
            for _ in 0..150 {
                let (s, got, set) = get(&c, &url, Some(&cookie)).await;
                if s != 200 || got != node || set.is_some() {
                    failures.fetch_add(1, Ordering::Relaxed);
                }
                served.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    // Reload five times while the load runs, changing the config each time.
    let before = served.load(Ordering::Relaxed);
    for i in 0..5u32 {
        let text = if i % 2 == 0 {
            config(port, &NODES, 2)
        } else {
            config(port, &NODES[..2], 1)
        };
        cfg.write(&text);
        let (s, report) = reload(&l).await;
        assert_eq!(s, 200, "{report}");
        assert_eq!(report["generation"], u64::from(i) + 1);
    }
    let after = served.load(Ordering::Relaxed);
    while let Some(r) = load.join_next().await {
        r.unwrap_or_else(|e| panic!("{e}"));
    }
    assert!(
        before < 8 * 150 && after < 8 * 150,
        "the reloads ran while the load did ({before}, {after})"
    );
    assert_eq!(
        failures.load(Ordering::Relaxed),
        0,
        "no request failed or moved"
    );
    assert_eq!(served.load(Ordering::Relaxed), 8 * 150);
    assert_eq!(node_view(&l, "b").await["state"], "DRAIN", "state kept");
    let metrics = metrics_text(&l).await;
    assert!(
        metrics.contains(r#"limpet_config_reloads_total{result="ok"} 5"#),
        "{metrics}"
    );
    l.stop().await;
}

#[tokio::test]
async fn a_bad_config_is_refused_with_the_reason_and_the_old_one_serves() {
    let (_nodes, port) = backend_nodes(&NODES[..2]).await;
    let good = config(port, &NODES[..2], 1);
    let cfg = ConfigFile::new("reload-bad", &good);
    let l = Limpet::start(&cfg).await;
    let url = format!("http://{}/", l.addr("web"));
    let (_, node, cookie) = get(&bare_client(), &url, None).await;
    let cookie = cookie.unwrap_or_default();

    cfg.write(&good.replace("node_port", "node_prot"));
    let (s, v) = reload(&l).await;
    assert_eq!(s, 422, "{v}");
    let why = v["error"].as_str().unwrap_or("");
    assert!(
        why.contains("limpet.toml") && why.contains("node_prot"),
        "names the file and key: {why}"
    );
    // A config that parses but cannot run is refused too.
    cfg.write(&good.replace("127.0.0.3", "not an address!"));
    let (s, _) = reload(&l).await;
    assert_eq!(s, 422);
    // The old config still serves, pins and all.
    let (st, again, set) = get(&bare_client(), &url, Some(&cookie)).await;
    assert_eq!((st, again, set), (200, node, None));
    let nodes = admin_json(&l, "/api/v1/nodes").await;
    assert_eq!(nodes.as_array().map(Vec::len), Some(2));
    l.stop().await;
}

/// A reload whose cookie `path` cannot stand in a `Set-Cookie` value (here a `;` that would
/// add an attribute) is refused with the file, line and key, and the running listener goes on
/// setting its cookie as before: stickiness is not silently lost.
#[tokio::test]
async fn a_reload_with_a_cookie_path_that_cannot_be_sent_is_refused() {
    let (_nodes, port) = backend_nodes(&NODES[..2]).await;
    let with_path = |path: &str| {
        config(port, &NODES[..2], 1).replace(
            "\n\n[admin]",
            &format!("\n[listeners.cookie]\npath = \"{path}\"\n\n[admin]"),
        )
    };
    let good = with_path("/app");
    let cfg = ConfigFile::new("reload-cookie-path", &good);
    let l = Limpet::start(&cfg).await;
    let url = format!("http://{}/", l.addr("web"));
    let (s, before) = set_cookie(&url).await;
    assert_eq!(s, 200);
    assert!(before.contains("; Path=/app;"), "{before}");

    let bad = with_path("/app; Domain=evil.example");
    cfg.write(&bad);
    let (s, v) = reload(&l).await;
    assert_eq!(s, 422, "{v}");
    let why = v["error"].as_str().unwrap_or("");
    let off = bad
        .find("\"/app; Domain")
        .unwrap_or_else(|| panic!("{bad}"));
    let line = bad[..off].matches('\n').count() + 1;
    let col = off - bad[..off].rfind('\n').map_or(0, |i| i + 1) + 1;
    assert!(
        why.contains(&format!(
            "limpet.toml:{line}:{col}: listeners[0].cookie.path: "
        )),
        "names the file, line and key: {why}"
    );
    // The running config still sets its cookie, with its own path, and nothing else.
    let (s, after) = set_cookie(&url).await;
    assert_eq!(s, 200);
    assert!(
        after.contains("; Path=/app;") && !after.contains("evil"),
        "{after}"
    );
    l.stop().await;
}

/// The status and whole `Set-Cookie` value of a GET without a cookie.
async fn set_cookie(url: &str) -> (u16, String) {
    let r = bare_client()
        .get(url)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    let set = r
        .headers()
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    (r.status().as_u16(), set)
}

#[tokio::test]
async fn a_removed_node_is_maint_for_its_pins() {
    let (_nodes, port) = backend_nodes(&NODES[..2]).await;
    let cfg = ConfigFile::new("reload-remove", &config(port, &NODES[..2], 1));
    let l = Limpet::start(&cfg).await;
    let url = format!("http://{}/", l.addr("web"));
    let mut cookie_b = None;
    for _ in 0..4 {
        let (_, node, set) = get(&bare_client(), &url, None).await;
        if node == "b" {
            cookie_b = set;
            break;
        }
    }
    let cookie_b = cookie_b.unwrap_or_else(|| panic!("no pin to b"));
    cfg.write(&config(port, &NODES[..1], 1));
    let (s, v) = reload(&l).await;
    assert_eq!(s, 200, "{v}");
    assert!(
        v["changes"].as_array().is_some_and(|c| c
            .iter()
            .any(|x| x.as_str().unwrap_or("").contains("node b removed"))),
        "{v}"
    );
    let (st, node, set) = get(&bare_client(), &url, Some(&cookie_b)).await;
    assert_eq!(
        (st, node.as_str(), set.as_deref()),
        (200, "a", Some("route=a"))
    );
    l.stop().await;
}

/// The reload's answer names every setting that changed, by key, with both values: a
/// node's weight, passive health, a listener's timeout and its check. A reload of the same
/// file names none. A reload that changes a listener's mode is refused (its sockets are
/// served by an HTTP or a TCP loop chosen at start), and the running configuration stays.
#[tokio::test]
async fn a_reload_names_each_changed_setting_and_refuses_a_mode_change() {
    let (_nodes, port) = backend_nodes(&NODES[..2]).await;
    let base = config(port, &NODES[..2], 1);
    let cfg = ConfigFile::new("reload-changes", &base);
    let l = Limpet::start(&cfg).await;
    let changes = |v: &serde_json::Value| -> Vec<String> {
        v["changes"]
            .as_array()
            .map(|c| {
                c.iter()
                    .filter_map(|x| x.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_else(|| panic!("no changes list in {v}"))
    };

    let (s, v) = reload(&l).await;
    assert_eq!((s, changes(&v)), (200, Vec::<String>::new()), "{v}");

    let changed = format!("[health]\nfall = 5\n\n{}", config(port, &NODES[..2], 3)).replace(
        "node_port = ",
        "check = { kind = \"http\", path = \"/health\" }\n\
         timeouts = { upstream_answer = \"5s\" }\nnode_port = ",
    );
    cfg.write(&changed);
    let (s, v) = reload(&l).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        changes(&v),
        [
            "health.fall: 3 -> 5",
            "node b: weight: 1 -> 3",
            "listener web: check: set to { expect = \"200-399\", kind = \"http\", method = \"GET\", \
             path = \"/health\" }",
            r#"listener web: timeouts.upstream_answer: "1m" -> "5s""#,
        ],
        "{v}"
    );

    // (Without the HTTP timeout, which a tcp listener refuses for itself.)
    cfg.write(
        &changed
            .replace("timeouts = { upstream_answer = \"5s\" }\n", "")
            .replace("node_port = ", "mode = \"tcp\"\nnode_port = "),
    );
    let (s, v) = reload(&l).await;
    assert_eq!(s, 422, "{v}");
    assert!(
        v.to_string().contains("mode changed: that needs a restart"),
        "{v}"
    );
    // Still HTTP, on the configuration of the last good reload.
    let url = format!("http://{}/", l.addr("web"));
    let (st, _, set) = get(&bare_client(), &url, None).await;
    assert_eq!((st, set.is_some()), (200, true));
    l.stop().await;
}

/// Where `needle` starts in `text`: 1-based line and column, as config errors give them.
fn place_of(text: &str, needle: &str) -> (usize, usize) {
    let at = text
        .find(needle)
        .unwrap_or_else(|| panic!("{needle:?} not in the config"));
    let line = text[..at].matches('\n').count() + 1;
    let column = at - text[..at].rfind('\n').map_or(0, |i| i + 1) + 1;
    (line, column)
}

/// A reload that adds a listener, removes one, or changes one's `bind` or `mode` needs a
/// restart: it is refused with the file, line and key of what changed, as an error found
/// while checking the file would be, and the running configuration keeps serving.
#[tokio::test]
async fn a_reload_refuses_a_listener_change_naming_file_line_and_key() {
    let (_nodes, port) = backend_nodes(&NODES[..2]).await;
    let extra = "[[listeners]]\nname = \"extra\"\nbind = \"127.0.0.1:0\"\nmode = \"tcp\"\n\
                 node_port = 9\n\n";
    let base = format!("{extra}{}", config(port, &NODES[..2], 1));
    let cfg = ConfigFile::new("reload-listeners", &base);
    let l = Limpet::start(&cfg).await;
    let file = cfg.path.display().to_string();
    let refused = |text: String| {
        cfg.write(&text);
        async {
            let (s, v) = reload(&l).await;
            assert_eq!(s, 422, "{v}");
            v["error"]
                .as_str()
                .unwrap_or_else(|| panic!("no error in {v}"))
                .to_owned()
        }
    };

    // A new listener: its name.
    let added = format!(
        "{base}[[listeners]]\nname = \"more\"\nbind = \"127.0.0.1:0\"\nnode_port = {port}\n"
    );
    let (line, col) = place_of(&added, "\"more\"");
    assert_eq!(
        refused(added).await,
        format!(
            "{file}:{line}:{col}: listeners[2].name: listener \"more\" is new: adding a listener \
             needs a restart"
        )
    );

    // Moved: its bind, in the listener's index of the new file.
    let moved = base.replacen("bind = \"127.0.0.1:0\"", "bind = \"127.0.0.5:0\"", 2);
    let moved = moved.replacen("bind = \"127.0.0.5:0\"", "bind = \"127.0.0.1:0\"", 1);
    let (line, col) = place_of(&moved, "\"127.0.0.5:0\"");
    assert_eq!(
        refused(moved).await,
        format!(
            "{file}:{line}:{col}: listeners[1].bind: listener \"web\": bind addresses changed: \
             that needs a restart"
        )
    );

    // A mode written out: its value; a mode left to its default: the listener's name.
    let to_tcp = base.replace("name = \"web\"\n", "name = \"web\"\nmode = \"tcp\"\n");
    // The line after web's name, after `mode = `.
    let (name_line, _) = place_of(&to_tcp, "name = \"web\"\nmode = \"tcp\"");
    let (line, col) = (name_line + 1, "mode = ".len() + 1);
    assert_eq!(
        refused(to_tcp).await,
        format!(
            "{file}:{line}:{col}: listeners[1].mode: listener \"web\": mode changed: that needs \
             a restart"
        )
    );
    let to_http = base.replace("mode = \"tcp\"\n", "");
    let (line, col) = place_of(&to_http, "\"extra\"");
    assert_eq!(
        refused(to_http).await,
        format!(
            "{file}:{line}:{col}: listeners[0].mode: listener \"extra\": mode changed: that \
             needs a restart"
        )
    );

    // Gone: the new file has no place for it, so the running one's line is named.
    let (was, _) = place_of(&base, "\"extra\"");
    assert_eq!(
        refused(base.replacen(extra, "", 1)).await,
        format!(
            "{file}: listeners: listener \"extra\" (line {was} of the running configuration) is \
             gone: removing a listener needs a restart"
        )
    );

    // Every refusal kept the running configuration: the file as it was reloads with no change.
    cfg.write(&base);
    let (s, v) = reload(&l).await;
    assert_eq!((s, &v["changes"]), (200, &serde_json::json!([])), "{v}");
    let (st, _, _) = get(&bare_client(), &format!("http://{}/", l.addr("web")), None).await;
    assert_eq!(st, 200);
    l.stop().await;
}

/// The error of `reload`, a task whose limit has just passed: it ends within a few
/// yields (paused time, moved by hand), refused.
async fn refused_now(
    reload: tokio::task::JoinHandle<
        Result<limpet::admin::ReloadReport, limpet::admin::ControlError>,
    >,
) -> String {
    for _ in 0..1000 {
        if reload.is_finished() {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert!(reload.is_finished(), "refused at the limit");
    reload
        .await
        .expect("reload task")
        .expect_err("refused")
        .to_string()
}

/// A reload whose file read never returns is refused after `RELOAD_LOAD_LIMIT` (30 s, on
/// paused time) with the file named, the running config serving meanwhile. The next reload
/// waits for that read rather than start a second one (refused again while it is blocked),
/// and runs once it has returned.
#[tokio::test(start_paused = true)]
async fn a_reload_whose_read_blocks_is_refused_at_the_load_limit_and_the_next_one_runs() {
    let (_nodes, port) = backend_nodes(&NODES[..2]).await;
    let text = config(port, &NODES[..2], 1);
    let cfg = ConfigFile::new("reload-blocked", &text);
    let l = Limpet::start(&cfg).await;
    let runtime = std::sync::Arc::clone(l.running.as_ref().expect("running").runtime());
    fifo_in_place_of(&cfg.path);
    let started = tokio::time::Instant::now();
    let reloading = tokio::spawn({
        let runtime = std::sync::Arc::clone(&runtime);
        async move { limpet::runtime::reload(&runtime).await }
    });
    // Once the reload is in its read, kept waiting by a silent writer.
    let mut writer = fifo_writer_once_read(&cfg.path).await;
    // Paused time does not move by itself while a blocking task runs (the read): moved by
    // hand, to just before the limit and then to it.
    let limit = limpet::runtime::RELOAD_LOAD_LIMIT;
    tokio::time::advance(limit - Duration::from_millis(1)).await;
    assert!(!reloading.is_finished(), "refused before the limit");
    tokio::time::advance(Duration::from_millis(1)).await;
    let e = refused_now(reloading).await;
    let took = started.elapsed();
    assert!(
        e.contains("not read and checked within 30 s") && e.contains("limpet.toml"),
        "{e}"
    );
    assert!(
        took >= limpet::runtime::RELOAD_LOAD_LIMIT
            && took < limpet::runtime::RELOAD_LOAD_LIMIT + Duration::from_secs(1),
        "{took:?}"
    );
    assert_eq!(
        get(&bare_client(), &format!("http://{}/", l.addr("web")), None)
            .await
            .0,
        200,
        "the running config serves"
    );
    // The next reload first waits for that read, within the same limit: refused again, and
    // no second thread is left blocked on the file.
    let again = tokio::spawn({
        let runtime = std::sync::Arc::clone(&runtime);
        async move { limpet::runtime::reload(&runtime).await }
    });
    // Into its wait (time stands still meanwhile: the blocked read holds auto-advance off).
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    tokio::time::advance(limit).await;
    let e = refused_now(again).await;
    assert!(
        e.contains("the previous reload's read has not returned"),
        "{e}"
    );
    // The blocked read gets its bytes (its result is dropped), and with the file back the
    // next reload runs.
    std::io::Write::write_all(&mut writer, text.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
    drop(writer);
    std::fs::remove_file(&cfg.path).unwrap_or_else(|e| panic!("{e}"));
    cfg.write(&config(port, &NODES, 1));
    let report = limpet::runtime::reload(&runtime).await.expect("applied");
    assert!(report.generation >= 1);
    assert_eq!(runtime.state().nodes().len(), 3);
    l.stop().await;
}

/// A reload's table `size` and `expire` apply to the table running, entries and all: a
/// smaller size drops the least recently used beyond it, and the admin API shows what the
/// table runs with (chaos run: the reload reported both changes and the API showed them,
/// while the table kept its old size and expiry).
#[tokio::test]
async fn a_reload_resizes_a_table_and_changes_its_expiry() {
    let (_nodes, port) = backend_nodes(&NODES[..1]).await;
    let text = |size: u32, expire: &str| {
        format!(
            "{}[[tables]]\nname = \"t\"\nheader = \"X-Sess\"\nsize = {size}\nexpire = \"{expire}\"\n\n\
             [[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = {port}\ntable = \"t\"\n\n\
             [admin]\nlisten = \"127.0.0.1:0\"\n",
            nodes_toml(&NODES[..1])
        )
    };
    let cfg = ConfigFile::new("reload-table", &text(4, "30m"));
    let l = Limpet::start(&cfg).await;
    let url = format!("http://{}/", l.addr("web"));
    let c = bare_client();
    // Four sessions, s0 the least recently used.
    for s in ["s0", "s1", "s2", "s3"] {
        let r = c
            .get(&url)
            .header("x-sess", s)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.status().as_u16(), 200);
    }
    cfg.write(&text(2, "5s"));
    let (s, report) = reload(&l).await;
    assert_eq!(s, 200, "{report}");
    let tables = admin_json(&l, "/api/v1/tables").await;
    let t = tables
        .as_array()
        .and_then(|ts| ts.iter().find(|t| t["name"] == "t"))
        .unwrap_or_else(|| panic!("{tables}"));
    assert_eq!(
        (&t["size"], &t["capacity"], &t["expire_secs"]),
        (&2.into(), &2.into(), &5.into()),
        "{t}"
    );
    for (key, kept) in [("s0", false), ("s1", false), ("s2", true), ("s3", true)] {
        let r = c
            .get(l.admin_url(&format!("/api/v1/tables/t/entry?key={key}")))
            .send()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.status().as_u16() == 200, kept, "entry {key}");
        if kept {
            let b = r.bytes().await.unwrap_or_default();
            let v: serde_json::Value = serde_json::from_slice(&b).unwrap_or_default();
            let left = v["expires_in_ms"].as_u64().unwrap_or(u64::MAX);
            assert!(left <= 5_000, "{key} under the new expiry: {v}");
        }
    }
    l.stop().await;
}

/// A reload that shortens `fail_timeout` reaches a node already DOWN (chaos run 25: a
/// reload from 60 s to 2 s was reported, and the node's trial stayed a minute away). `b`
/// goes DOWN on a refused connect under `fail_timeout = "60s"`, comes back, and the reload
/// to `"1s"` has it tried, and serving, within seconds.
#[tokio::test]
async fn a_reload_that_shortens_fail_timeout_reaches_a_node_already_down() {
    let (mut nodes, port) = backend_nodes(&NODES[..2]).await;
    let with = |ft: &str| {
        format!(
            "{}[health]\nfall = 1\nfail_timeout = \"{ft}\"\n",
            config(port, &NODES[..2], 1)
        )
    };
    let cfg = ConfigFile::new("reload-fail-timeout", &with("60s"));
    let l = Limpet::start(&cfg).await;
    let url = format!("http://{}/", l.addr("web"));
    let ip = nodes[1].ip;
    nodes[1].kill().await;
    for _ in 0..4 {
        let (s, node, _) = get(&bare_client(), &url, None).await;
        assert_eq!(
            (s, node.as_str()),
            (200, "a"),
            "the refused connect fails over"
        );
    }
    let v = node_view(&l, "b").await;
    assert_eq!(v["state"], "DOWN", "{v}");
    nodes[1] = backend_node_again("b", ip, port).await;

    cfg.write(&with("1s"));
    let (s, v) = reload(&l).await;
    assert_eq!(s, 200, "{v}");
    let reloaded = tokio::time::Instant::now();
    loop {
        let (s, node, _) = get(&bare_client(), &url, None).await;
        assert_eq!(s, 200);
        if node == "b" {
            break;
        }
        assert!(
            reloaded.elapsed() < Duration::from_secs(10),
            "b not tried within 10 s of the reload: {}",
            node_view(&l, "b").await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(node_view(&l, "b").await["state"], "UP");
    l.stop().await;
}

/// `POST /api/v1/reload` on a raw connection to `admin`, which is left open.
async fn post_reload(admin: std::net::SocketAddr) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut s = tokio::net::TcpStream::connect(admin)
        .await
        .unwrap_or_else(|e| panic!("connect to the admin listener: {e}"));
    let head = format!(
        "POST /api/v1/reload HTTP/1.1\r\nHost: {admin}\r\n\
         Content-Type: application/json\r\nContent-Length: 0\r\n\r\n"
    );
    s.write_all(head.as_bytes())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    s
}

/// What the admin listener sends on `s` until it closes it, within `PATIENCE` (else `late`).
async fn read_to_its_end(s: &mut tokio::net::TcpStream, late: &str) -> String {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    tokio::time::timeout(PATIENCE, s.read_to_end(&mut got))
        .await
        .unwrap_or_else(|_| panic!("{late}"))
        .unwrap_or_else(|e| panic!("{e}"));
    String::from_utf8_lossy(&got).into_owned()
}

/// The config file a reload is reading from its FIFO comes: `text` through `writer`, which
/// is closed, and the FIFO replaced by a plain file holding the same, for the reloads after.
fn the_file_comes(mut writer: std::fs::File, cfg: &ConfigFile, text: &str) {
    // The regular file takes the FIFO's place first (the reader holds the FIFO open): a
    // reload that opens the path once the FIFO's bytes are read gets the file, not a FIFO
    // with no writer left, which it would wait on for good. (Replaced after the bytes, a
    // reload joined behind the first could open the FIFO in between on a loaded machine.)
    let next = cfg.path.with_extension("next");
    std::fs::write(&next, text).unwrap_or_else(|e| panic!("{e}"));
    std::fs::rename(&next, &cfg.path).unwrap_or_else(|e| panic!("{e}"));
    std::io::Write::write_all(&mut writer, text.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
    drop(writer);
}

/// An admin reload whose caller hangs up (or times out) while the file is read is applied
/// whole, as a SIGHUP's is: a reload asked for is done, whoever waits for its answer. Before,
/// the caller's connection carried the reload, and it was dropped with it: whether a
/// `curl --max-time` reload was applied depended on how slow the file was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_reload_whose_caller_hung_up_is_applied_whole() {
    use tokio::io::AsyncWriteExt;
    let (_nodes, port) = backend_nodes(&NODES).await;
    let cfg = ConfigFile::new("reload-hung-up", &config(port, &NODES[..2], 1));
    let l = Limpet::start(&cfg).await;
    let runtime = Arc::clone(l.running.as_ref().expect("running").runtime());
    fifo_in_place_of(&cfg.path);
    let mut caller = post_reload(l.admin).await;
    let writer = fifo_writer_once_read(&cfg.path).await;
    // The caller hangs up mid-reload, and the admin listener lets its connection go (its
    // close comes back): the request's handler is gone.
    caller.shutdown().await.unwrap_or_else(|e| panic!("{e}"));
    read_to_its_end(&mut caller, "the admin listener kept the connection").await;
    // The file comes: three nodes.
    let three = config(port, &NODES, 1);
    the_file_comes(writer, &cfg, &three);
    // Reloads run one at a time: this one runs after the first has ended.
    let report = limpet::runtime::reload(&runtime).await.expect("applied");
    assert_eq!(
        report.generation, 2,
        "the reload whose caller hung up was applied, then this one"
    );
    assert_eq!(runtime.state().nodes().len(), 3);
    l.stop().await;
}

/// A stop cuts short an admin reload still reading its file, before it changed anything,
/// and answers its caller 503 at once; a reload asked for after the stop began is refused.
/// A reload applied mid-drain would start again the health checks the drain stopped. Before,
/// the admin reload went on through the drain: its caller got no answer until the file came
/// (or the admin listener's 10 s grace ended), and the file was then applied mid-drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_cuts_an_admin_reload_short_and_refuses_later_ones() {
    let (_nodes, port) = backend_nodes(&NODES).await;
    let cfg = ConfigFile::new("reload-stopped", &config(port, &NODES[..2], 1));
    let l = Limpet::start(&cfg).await;
    let runtime = Arc::clone(l.running.as_ref().expect("running").runtime());
    fifo_in_place_of(&cfg.path);
    let mut caller = post_reload(l.admin).await;
    let mut writer = fifo_writer_once_read(&cfg.path).await;
    let stopping = tokio::spawn(l.stop());
    // Answered while the file still has not come.
    let answer = read_to_its_end(&mut caller, "no answer").await;
    assert!(
        answer.starts_with("HTTP/1.1 503") && answer.contains("stopping"),
        "{answer}"
    );
    let later = limpet::runtime::reload(&runtime)
        .await
        .expect_err("refused after the stop began");
    assert!(later.to_string().contains("stopping"), "{later}");
    // The file comes now; nothing reads it into the running limpet.
    std::io::Write::write_all(&mut writer, config(port, &NODES, 1).as_bytes())
        .unwrap_or_else(|e| panic!("{e}"));
    drop(writer);
    stopping.await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        runtime.state().nodes().len(),
        2,
        "the running config stayed"
    );
}

/// Reloads asked for while another waits its turn share that one's result: it reads the file
/// after they came, which is all they ask. So callers that give up and ask again (a script
/// retrying with `--max-time` against a file on a hung mount) cannot queue reloads without
/// bound: at most one runs and one waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloads_asked_while_one_waits_its_turn_share_its_result() {
    let (_nodes, port) = backend_nodes(&NODES).await;
    let cfg = ConfigFile::new("reload-joined", &config(port, &NODES[..2], 1));
    let l = Limpet::start(&cfg).await;
    let runtime = Arc::clone(l.running.as_ref().expect("running").runtime());
    fifo_in_place_of(&cfg.path);
    let first = tokio::spawn({
        let runtime = Arc::clone(&runtime);
        async move { limpet::runtime::reload(&runtime).await }
    });
    let writer = fifo_writer_once_read(&cfg.path).await;
    // Three more while the first reads its file, each asked for (polled once) in turn.
    let mut asked = Vec::new();
    for _ in 0..3 {
        let mut reload = Box::pin(limpet::runtime::reload(&runtime));
        tokio::select! {
            biased;
            r = &mut reload => panic!("answered before the file came: {r:?}"),
            () = std::future::ready(()) => {}
        }
        asked.push(reload);
    }
    let three = config(port, &NODES, 1);
    the_file_comes(writer, &cfg, &three);
    let first = first
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .expect("applied");
    assert_eq!(first.generation, 1);
    let mut generations = Vec::new();
    for reload in asked {
        generations.push(reload.await.expect("applied").generation);
    }
    assert_eq!(generations, [2, 2, 2], "one reload for the three");
    let next = limpet::runtime::reload(&runtime).await.expect("applied");
    assert_eq!(next.generation, 3);
    assert_eq!(runtime.state().nodes().len(), 3);
    l.stop().await;
}

/// What a reload cannot apply is named at every reload until a restart, measured against what
/// runs: a `[store]` added to a limpet started without one (before, the second reload of the
/// same file named nothing, the file's last version being taken for what ran). And a
/// listener's `bind` addresses given in another order are the same sockets: no restart asked.
#[tokio::test]
async fn a_reload_names_an_unapplied_store_every_time_and_takes_bind_in_any_order() {
    let (_nodes, port) = backend_nodes(&NODES[..1]).await;
    let text = |bind: &str, store: &str| {
        format!(
            "{}[[listeners]]\nname = \"web\"\nbind = {bind}\nnode_port = {port}\n\n\
             [admin]\nlisten = \"127.0.0.1:0\"\n{store}",
            nodes_toml(&NODES[..1])
        )
    };
    let binds = "[\"127.0.0.1:0\", \"127.0.0.5:0\"]";
    let cfg = ConfigFile::new("reload-store", &text(binds, ""));
    let l = Limpet::start(&cfg).await;
    let store = "\n[store]\nurl = \"redis://127.0.0.1:1/0\"\n";
    cfg.write(&text(binds, store));
    for round in 0..2 {
        let (s, v) = reload(&l).await;
        assert_eq!(s, 200, "{v}");
        assert!(
            v["changes"]
                .as_array()
                .is_some_and(|c| c.contains(&serde_json::json!(
                    "[store] settings changed: they apply after a restart"
                ))),
            "reload {round}: {v}"
        );
    }
    cfg.write(&text("[\"127.0.0.5:0\", \"127.0.0.1:0\"]", store));
    let (s, v) = reload(&l).await;
    assert_eq!(s, 200, "the same addresses in another order: {v}");
    assert!(
        v["changes"]
            .as_array()
            .is_some_and(|c| !c.iter().any(|x| x.as_str().unwrap_or("").contains("bind"))),
        "nothing changed in bind: {v}"
    );
    let (st, _, _) = get(&bare_client(), &format!("http://{}/", l.addr("web")), None).await;
    assert_eq!(st, 200);
    l.stop().await;
}

/// A reload that removes a table lets its entries go in the generation before it (which a
/// TCP session opened then holds for as long as it is open), and keeps the table it carries
/// on whole. Before, the removed table's entries stayed in memory until the last session of
/// that generation ended.
#[tokio::test]
async fn a_table_a_reload_removes_lets_its_entries_go_at_once() {
    use limpet_core::table::{AffinityStore as _, KeyRef};
    let (_nodes, port) = backend_nodes(&NODES[..1]).await;
    let text = |tables: &[&str]| {
        let mut t = nodes_toml(&NODES[..1]);
        for name in tables {
            t.push_str(&format!(
                "[[tables]]\nname = \"{name}\"\nkey = \"source-ip\"\n"
            ));
        }
        format!(
            "{t}[[listeners]]\nname = \"raw\"\nbind = \"127.0.0.1:0\"\nmode = \"tcp\"\n\
             node_port = {port}\ntable = \"t\"\n\n[admin]\nlisten = \"127.0.0.1:0\"\n"
        )
    };
    let cfg = ConfigFile::new("reload-table-gone", &text(&["t", "u"]));
    let l = Limpet::start(&cfg).await;
    let old = l
        .running
        .as_ref()
        .unwrap_or_else(|| panic!("running"))
        .runtime()
        .state();
    let a = old.node_id("a").unwrap_or_else(|| panic!("a"));
    for name in ["t", "u"] {
        let table = old.table(name).unwrap_or_else(|| panic!("{name}"));
        for i in 1..=50u8 {
            let key = KeyRef::ip(std::net::IpAddr::from([10, 0, 0, i]), Default::default());
            table.lock().learn(key, a, limpet::clock::now_ms());
        }
    }
    cfg.write(&text(&["t"]));
    let (s, report) = reload(&l).await;
    assert_eq!(s, 200, "{report}");
    let len = |name: &str| old.table(name).map(|t| t.lock().store().len());
    assert_eq!(len("u"), Some(0), "the removed table's entries let go");
    assert_eq!(len("t"), Some(50), "the carried table kept whole");
    l.stop().await;
}

/// Pins each of `ips` (source addresses) to node a in `l`'s table `table`.
fn pin_to_a(l: &Limpet, table: &str, ips: impl Iterator<Item = [u8; 4]>) {
    let state = l
        .running
        .as_ref()
        .unwrap_or_else(|| panic!("running"))
        .runtime()
        .state();
    let a = state.node_id("a").unwrap_or_else(|| panic!("a"));
    let t = state.table(table).unwrap_or_else(|| panic!("{table}"));
    for ip in ips {
        let key = limpet_core::table::KeyRef::ip(std::net::IpAddr::from(ip), Default::default());
        t.lock().learn(key, a, limpet::clock::now_ms());
    }
}

/// A table a reload adds starts from its snapshot file, as at a start, and the file keeps
/// its pins: 50 pins saved by a first run's stop; a second run started without the table,
/// then reloaded with it, holds the 50 (the report says so), and its stop saves them with
/// one learnt since.
/// A reload that removes a table says so. Before, the added table started empty, its stop
/// wrote the empty table over the file, and the report named no removed table.
#[tokio::test]
async fn a_table_a_reload_adds_starts_from_its_snapshot_and_keeps_the_file() {
    use limpet_core::table::AffinityStore as _;
    let (_nodes, port) = backend_nodes(&NODES[..1]).await;
    let text = |with_u: bool| {
        let mut t = nodes_toml(&NODES[..1]);
        t.push_str("[[tables]]\nname = \"t\"\nkey = \"source-ip\"\n");
        if with_u {
            t.push_str(
                "[[tables]]\nname = \"u\"\nkey = \"source-ip\"\nsnapshot = \"u.snapshot\"\n",
            );
        }
        format!(
            "{t}[[listeners]]\nname = \"raw\"\nbind = \"127.0.0.1:0\"\nmode = \"tcp\"\n\
             node_port = {port}\ntable = \"t\"\n\n[admin]\nlisten = \"127.0.0.1:0\"\n"
        )
    };
    let u_len = |l: &Limpet| {
        l.running
            .as_ref()
            .unwrap_or_else(|| panic!("running"))
            .runtime()
            .state()
            .table("u")
            .map(|t| t.lock().store().len())
    };
    let cfg = ConfigFile::new("reload-table-back", &text(true));
    let l = Limpet::start(&cfg).await;
    pin_to_a(&l, "u", (1..=50u8).map(|i| [10, 0, 1, i]));
    l.stop().await;
    cfg.write(&text(false));
    let l = Limpet::start(&cfg).await;
    assert_eq!(u_len(&l), None);
    cfg.write(&text(true));
    let (s, report) = reload(&l).await;
    assert_eq!(s, 200, "{report}");
    assert!(report.to_string().contains("table u added"), "{report}");
    assert!(
        report
            .to_string()
            .contains("table u: 50 pins loaded from its snapshot"),
        "{report}"
    );
    assert_eq!(u_len(&l), Some(50), "the added table's pins, from its file");
    cfg.write(&text(false));
    let (s, report) = reload(&l).await;
    assert_eq!(s, 200, "{report}");
    assert!(report.to_string().contains("table u removed"), "{report}");
    cfg.write(&text(true));
    let (s, report) = reload(&l).await;
    assert_eq!(s, 200, "{report}");
    assert_eq!(u_len(&l), Some(50), "added back: its file kept the pins");
    // One pin more, which only a save after the reload can have written.
    pin_to_a(&l, "u", [[10, 0, 2, 1]].into_iter());
    l.stop().await;
    // The stop saved the table, with its pins.
    let l = Limpet::start(&cfg).await;
    assert_eq!(u_len(&l), Some(51), "the file the stop saved");
    l.stop().await;
}

/// `limpet_table_evictions_total{table}` of the `/metrics` text (`None`: no such series).
fn evictions(metrics: &str, table: &str) -> Option<u64> {
    let series = format!("limpet_table_evictions_total{{table=\"{table}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&series))
        .and_then(|v| v.trim().parse().ok())
}

/// A reload that keys a table anew builds another table, whose own totals start at 0: its
/// evictions add to what the old one counted, those since the last scrape included. A table
/// of size 2 keyed on the source address evicts 3 of 5 client addresses, scraped, then 2
/// more unscraped; keyed on a header by the reload, it evicts 4 of 6 sessions: the counter
/// says 9. Before, the counter grew by the difference of the totals under the table's name,
/// and said 4 (the new table's 4 less the old one's 3 scraped); keyed by name and key, it
/// said 7 (the old table's last 2 never scraped).
#[tokio::test]
async fn a_table_keyed_anew_by_a_reload_adds_its_evictions_to_the_counter() {
    let (_nodes, port) = backend_nodes(&NODES[..1]).await;
    let text = |key: &str| {
        format!(
            "{}[[tables]]\nname = \"t\"\n{key}\nsize = 2\n\n\
             [[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = {port}\ntable = \"t\"\n\n\
             [admin]\nlisten = \"127.0.0.1:0\"\n",
            nodes_toml(&NODES[..1])
        )
    };
    let cfg = ConfigFile::new("reload-table-evictions", &text("key = \"source-ip\""));
    let l = Limpet::start(&cfg).await;
    let web = l.addr("web");
    for i in 1..=5 {
        assert_eq!(node_for(&format!("127.0.1.{i}"), web).await, "a");
    }
    assert_eq!(evictions(&metrics_text(&l).await, "t"), Some(3));
    for i in 6..=7 {
        assert_eq!(node_for(&format!("127.0.1.{i}"), web).await, "a");
    }

    cfg.write(&text("header = \"X-Sess\""));
    let (s, report) = reload(&l).await;
    assert_eq!(s, 200, "{report}");
    let url = format!("http://{web}/");
    let c = bare_client();
    for i in 0..6 {
        let r = c
            .get(&url)
            .header("x-sess", format!("s{i}"))
            .send()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.status().as_u16(), 200);
    }
    let tables = admin_json(&l, "/api/v1/tables").await;
    assert_eq!(tables[0]["evictions"], 4, "the new table's own: {tables}");
    assert_eq!(evictions(&metrics_text(&l).await, "t"), Some(9));
    l.stop().await;
}

/// The names in `/api/v1/history`.
async fn history_nodes(l: &Limpet) -> Vec<String> {
    let h = admin_json(l, "/api/v1/history").await;
    h["nodes"]
        .as_array()
        .unwrap_or_else(|| panic!("{h}"))
        .iter()
        .map(|n| n["node"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// Waits (bounded) until `/api/v1/history` lists `node`: the admin server samples every
/// 5 s. The names listed then.
async fn history_with(l: &Limpet, node: &str) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let names = history_nodes(l).await;
        if names.iter().any(|n| n == node) {
            return names;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{node} never sampled: {names:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A node a reload renames leaves the charts' history at the next sample, the one that
/// first samples its new name: the history is of the running configuration's nodes. Before,
/// every node name ever seen was sampled and served for the life of the process, one ring
/// more for each rename.
#[tokio::test]
async fn a_node_a_reload_renames_leaves_the_history() {
    let (_nodes, port) = backend_nodes(&NODES[..2]).await;
    let cfg = ConfigFile::new("reload-history", &config(port, &NODES[..2], 1));
    let l = Limpet::start(&cfg).await;
    let names = history_with(&l, "b").await;
    assert_eq!(names, ["a", "b"]);

    // `b` renamed `b2`, at the same address.
    cfg.write(&config(port, &[NODES[0], ("b2", NODES[1].1)], 1));
    let (s, report) = reload(&l).await;
    assert_eq!(s, 200, "{report}");
    let names = history_with(&l, "b2").await;
    assert_eq!(names, ["a", "b2"], "b's history is gone");
    // Its counters stay, as its Prometheus series do.
    let text = metrics_text(&l).await;
    assert!(
        text.contains(r#"limpet_node_answers_slow_total{node="b"} 0"#),
        "{text}"
    );
    l.stop().await;
}
