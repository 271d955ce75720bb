//! The admin API of the real runtime over HTTP on loopback: reads, node state writes, errors,
//! metrics and the page, bearer-token authorization of writes (and of table entry reads)
//! beyond loopback, and the refusal to start an admin listener off loopback without a token.

mod admin_common;

use admin_common::lifecycle::*;
use serde_json::Value;

const TOKEN: &str = "s3cret-admin-token-0123";
const NODES: [(&str, &str); 2] = [("a", "127.0.0.2"), ("b", "127.0.0.3")];

fn config(port: u16, admin: &str) -> String {
    format!(
        "{}[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = {port}\n\n[admin]\n{admin}\n",
        nodes_toml(&NODES)
    )
}

async fn get_json(url: &str) -> (u16, Value) {
    let r = bare_client()
        .get(url)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let status = r.status().as_u16();
    let body = r.bytes().await.unwrap_or_else(|e| panic!("{url}: {e}"));
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

async fn post_state(l: &Limpet, node: &str, body: &str, token: Option<&str>) -> (u16, Value) {
    let mut req = bare_client()
        .post(format!(
            "http://127.0.0.1:{}/api/v1/nodes/{node}/state",
            l.admin.port()
        ))
        .header("content-type", "application/json")
        .body(body.to_owned());
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let r = req.send().await.unwrap_or_else(|e| panic!("{e}"));
    let status = r.status().as_u16();
    let body = r.bytes().await.unwrap_or_default();
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

#[tokio::test]
async fn nodes_are_listed_and_their_state_set() {
    let (_nodes, port) = backend_nodes(&NODES).await;
    let cfg = ConfigFile::new("admin-api", &config(port, "listen = \"127.0.0.1:0\""));
    let l = Limpet::start(&cfg).await;

    let (s, v) = get_json(&l.admin_url("/api/v1/nodes")).await;
    assert_eq!(s, 200);
    let names: Vec<_> = v
        .as_array()
        .unwrap_or_else(|| panic!("{v}"))
        .iter()
        .map(|n| n["name"].as_str().unwrap_or("").to_owned())
        .collect();
    assert_eq!(names, ["a", "b"]);
    assert_eq!(v[0]["state"], "UP");
    assert_eq!(v[0]["weight"], 1);
    assert_eq!(v[0]["address"], "127.0.0.2");
    for field in [
        "active_connections",
        "tunnels",
        "table_pins",
        "sessions_seen",
        "seen_window_secs",
        "checks",
        "healthy",
        "admin",
    ] {
        assert!(v[0].get(field).is_some(), "missing {field} in {}", v[0]);
    }

    // On loopback with no token configured, writes go through.
    let (s, v) = post_state(&l, "a", r#"{"state":"drain","deadline_secs":30}"#, None).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["state"], "DRAIN");
    assert!(v["drain"]["deadline_unix_ms"].as_u64().is_some(), "{v}");
    let (s, v) = post_state(&l, "a", r#"{"state":"maint"}"#, None).await;
    assert_eq!((s, v["state"].as_str()), (200, Some("MAINT")));
    let (s, v) = post_state(&l, "a", r#"{"state":"ready"}"#, None).await;
    assert_eq!((s, v["state"].as_str()), (200, Some("UP")));

    let (s, v) = get_json(&l.admin_url("/api/v1/nodes/b")).await;
    assert_eq!((s, v["name"].as_str()), (200, Some("b")));
    l.stop().await;
}

#[tokio::test]
async fn bad_requests_get_clear_errors() {
    let (_nodes, port) = backend_nodes(&NODES).await;
    let cfg = ConfigFile::new("admin-errors", &config(port, "listen = \"127.0.0.1:0\""));
    let l = Limpet::start(&cfg).await;
    let (s, v) = post_state(&l, "zz", r#"{"state":"maint"}"#, None).await;
    assert_eq!(s, 404, "{v}");
    let (s, v) = post_state(&l, "a", r#"{"state":"sideways"}"#, None).await;
    assert_eq!(s, 400);
    assert!(
        v["error"].as_str().unwrap_or("").contains("sideways"),
        "{v}"
    );
    let (s, _) = post_state(&l, "a", "not json", None).await;
    assert_eq!(s, 400);
    let (s, _) = post_state(&l, "a", &"x".repeat(20_000), None).await;
    assert_eq!(s, 413);
    let (s, _) = get_json(&l.admin_url("/api/v1/nodes/zz")).await;
    assert_eq!(s, 404);
    let (s, _) = get_json(&l.admin_url("/api/v1/nope")).await;
    assert_eq!(s, 404);
    let (s, _) = get_json(&l.admin_url("/api/v1/tables/none")).await;
    assert_eq!(s, 404);
    let r = bare_client()
        .put(l.admin_url("/api/v1/nodes"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status().as_u16(), 405);
    let (s, v) = get_json(&l.admin_url("/api/v1/tables/t?limit=abc")).await;
    assert_eq!(s, 400, "{v}");
    assert_eq!(
        get_json(&l.admin_url("/api/v1/nodes/a")).await.1["state"],
        "UP",
        "nothing changed"
    );
    l.stop().await;
}

/// `/api/v1/store` is a read: another method there is 405 (wrong method), as on every other
/// endpoint, while a `GET` without a `[store]` stays 404. Before, the 405 fallback left the
/// store out and `PUT /api/v1/store` answered 404, "no such endpoint".
#[tokio::test]
async fn a_wrong_method_on_the_store_endpoint_is_405() {
    let (_nodes, port) = backend_nodes(&NODES).await;
    let cfg = ConfigFile::new("admin-store-405", &config(port, "listen = \"127.0.0.1:0\""));
    let l = Limpet::start(&cfg).await;
    let url = l.admin_url("/api/v1/store");
    for method in [
        reqwest::Method::PUT,
        reqwest::Method::DELETE,
        reqwest::Method::POST,
    ] {
        let r = bare_client()
            .request(method.clone(), &url)
            .header("content-type", "application/json")
            .body("{}")
            .send()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let status = r.status().as_u16();
        let body = r.text().await.unwrap_or_default();
        assert_eq!(status, 405, "{method} /api/v1/store: {body}");
        assert!(body.contains("method not allowed"), "{method}: {body}");
    }
    let (s, v) = get_json(&url).await;
    assert_eq!(s, 404, "no [store] configured: {v}");
    l.stop().await;
}

#[test]
fn limpet_refuses_an_admin_listener_off_loopback_without_a_token() {
    let text = config(8080, "listen = \"0.0.0.0:9900\"");
    let path = std::path::Path::new("/etc/limpet/limpet.toml");
    let err = limpet::config::Config::from_text(path, &text)
        .err()
        .unwrap_or_else(|| panic!("accepted an open admin listener"));
    let msg = err.to_string();
    assert!(
        msg.contains("admin.listen") && msg.contains("not on loopback"),
        "{msg}"
    );
    // With a token it is accepted; on loopback no token is needed.
    let ok = config(
        8080,
        &format!("listen = \"0.0.0.0:9900\"\ntoken = \"{TOKEN}\""),
    );
    assert!(limpet::config::Config::from_text(path, &ok).is_ok());
    assert!(
        limpet::config::Config::from_text(path, &config(8080, "listen = \"127.0.0.1:9900\""))
            .is_ok()
    );
    let short = config(8080, "token = \"short\"");
    let msg = limpet::config::Config::from_text(path, &short)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(msg.contains("admin.token"), "{msg}");
}

#[tokio::test]
async fn writes_need_the_token_beyond_loopback() {
    let (_nodes, port) = backend_nodes(&NODES).await;
    // Bound on every address (not loopback) with a token.
    let cfg = ConfigFile::new(
        "admin-auth",
        &config(
            port,
            &format!("listen = \"0.0.0.0:0\"\ntoken = \"{TOKEN}\""),
        ),
    );
    let l = Limpet::start(&cfg).await;
    assert!(l.admin.ip().is_unspecified());
    let (s, v) = post_state(&l, "a", r#"{"state":"maint"}"#, None).await;
    assert_eq!(s, 401, "{v}");
    let (s, _) = post_state(
        &l,
        "a",
        r#"{"state":"maint"}"#,
        Some("wrong-token-000000000"),
    )
    .await;
    assert_eq!(s, 401);
    let base = format!("http://127.0.0.1:{}", l.admin.port());
    for (method, path) in [
        (reqwest::Method::POST, "/api/v1/reload"),
        (reqwest::Method::DELETE, "/api/v1/tables/t"),
        (reqwest::Method::DELETE, "/api/v1/tables/t/entry?key=1"),
    ] {
        let r = bare_client()
            .request(method, format!("{base}{path}"))
            .send()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.status().as_u16(), 401, "{path}");
    }
    let (_, v) = get_json(&format!("{base}/api/v1/nodes/a")).await;
    assert_eq!(v["state"], "UP", "reads need no token; nothing changed");
    // Except a table's entries, keyed by what pins sessions (session ids, client addresses).
    let (s, _) = get_json(&format!("{base}/api/v1/tables")).await;
    assert_eq!(s, 200, "table sizes stay open");
    for path in ["/api/v1/tables/t", "/api/v1/tables/t/entry?key=1"] {
        let (s, v) = get_json(&format!("{base}{path}")).await;
        assert_eq!(s, 401, "{path}: {v}");
        let r = bare_client()
            .get(format!("{base}{path}"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            r.status().as_u16(),
            404,
            "{path} with the token: past the check, to the route (this config has no table t)"
        );
    }
    let (s, v) = post_state(&l, "a", r#"{"state":"maint"}"#, Some(TOKEN)).await;
    assert_eq!((s, v["state"].as_str()), (200, Some("MAINT")));
    let r = bare_client()
        .post(format!("{base}/api/v1/reload"))
        .header("content-type", "application/json")
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status().as_u16(), 200, "reload with the token");
    l.stop().await;
}

#[tokio::test]
async fn metrics_stats_and_page_are_served() {
    let (_nodes, port) = backend_nodes(&NODES).await;
    let cfg = ConfigFile::new("admin-metrics", &config(port, "listen = \"127.0.0.1:0\""));
    let l = Limpet::start(&cfg).await;
    let url = format!("http://{}/", l.addr("web"));
    let (_, node, cookie) = get(&bare_client(), &url, None).await;
    let (_, again, _) = get(&bare_client(), &url, cookie.as_deref()).await;
    assert_eq!(node, again);
    let r = bare_client()
        .get(l.admin_url("/metrics"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status().as_u16(), 200);
    let ct = r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    assert!(ct.starts_with("application/openmetrics-text"), "{ct}");
    let text = r.text().await.unwrap_or_default();
    for want in [
        format!(r#"limpet_requests_total{{listener="web",node="{node}",class="2xx"}} 2"#),
        r#"limpet_pins_total{listener="web",outcome="new",reason="none"} 1"#.to_owned(),
        r#"limpet_pins_total{listener="web",outcome="sticky",reason="none"} 1"#.to_owned(),
        r#"limpet_node_state{node="b",state="UP"} 1"#.to_owned(),
        format!(r#"limpet_node_sessions_seen{{node="{node}"}} 1"#),
        "# EOF".to_owned(),
    ] {
        assert!(text.contains(&want), "missing {want}:\n{text}");
    }
    let (s, v) = get_json(&l.admin_url("/api/v1/stats")).await;
    assert_eq!(s, 200);
    assert_eq!(v["totals"]["requests"], 2);
    assert_eq!(v["totals"]["sticky"], 1);
    let page = bare_client()
        .get(l.admin_url("/"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(page
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .starts_with("text/html"));
    // Never framed by another site (its buttons would write under a decoy).
    let h = |name: &str| {
        page.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    assert_eq!(h("x-frame-options"), "DENY");
    assert_eq!(h("content-security-policy"), "frame-ancestors 'none'");
    let html = page.text().await.unwrap_or_default();
    assert!(html.contains("<title>limpet stats</title>"));
    assert!(
        !html.contains("src=\"http") && !html.contains("href=\"http"),
        "no external assets"
    );
    let r = bare_client()
        .get(l.admin_url("/ready"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status().as_u16(), 200);
    l.stop().await;
}
