//! The admin API over real HTTP on loopback: reads, node state writes, errors, metrics, and
//! bearer-token authorization of writes.

mod admin_common;

use admin_common::{client, Admin, PoolControl};
use limpet::admin::{AdminSettings, AdminSettingsError};
use serde_json::Value;

const TOKEN: &str = "s3cret-admin-token-0123";

async fn get_json(url: &str) -> (u16, Value) {
    let r = client()
        .get(url)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let status = r.status().as_u16();
    let body = r.bytes().await.unwrap_or_else(|e| panic!("{url}: {e}"));
    let v = serde_json::from_slice(&body).unwrap_or_else(|e| panic!("{url}: {e}"));
    (status, v)
}

async fn post_state(admin: &Admin, node: &str, body: &str, token: Option<&str>) -> (u16, Value) {
    let mut req = client()
        .post(admin.url(&format!("/api/v1/nodes/{node}/state")))
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
    let control = PoolControl::new(&["a", "b"]);
    let admin = Admin::start("127.0.0.1:0", control.clone(), None).await;

    let (s, v) = get_json(&admin.url("/api/v1/nodes")).await;
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
    for field in [
        "active_connections",
        "tunnels",
        "table_pins",
        "sessions_seen",
        "checks",
        "healthy",
        "admin",
    ] {
        assert!(v[0].get(field).is_some(), "missing {field} in {}", v[0]);
    }

    // On loopback with no token configured, writes go through.
    let (s, v) = post_state(&admin, "a", r#"{"state":"drain","deadline_secs":30}"#, None).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["state"], "DRAIN");
    assert_eq!(control.state_of("a"), "DRAIN");
    let (s, v) = post_state(&admin, "a", r#"{"state":"maint"}"#, None).await;
    assert_eq!((s, v["state"].as_str()), (200, Some("MAINT")));
    let (s, _) = post_state(&admin, "a", r#"{"state":"ready"}"#, None).await;
    assert_eq!(s, 200);
    assert_eq!(control.state_of("a"), "UP");

    let (s, v) = get_json(&admin.url("/api/v1/nodes/b")).await;
    assert_eq!((s, v["name"].as_str()), (200, Some("b")));
    admin.stop().await;
}

#[tokio::test]
async fn bad_requests_get_clear_errors() {
    let control = PoolControl::new(&["a"]);
    let admin = Admin::start("127.0.0.1:0", control.clone(), None).await;
    let (s, v) = post_state(&admin, "zz", r#"{"state":"maint"}"#, None).await;
    assert_eq!(s, 404, "{v}");
    let (s, v) = post_state(&admin, "a", r#"{"state":"sideways"}"#, None).await;
    assert_eq!(s, 400);
    assert!(
        v["error"].as_str().unwrap_or("").contains("sideways"),
        "{v}"
    );
    let (s, _) = post_state(&admin, "a", "not json", None).await;
    assert_eq!(s, 400);
    let (s, _) = post_state(&admin, "a", &"x".repeat(20_000), None).await;
    assert_eq!(s, 413);
    let (s, _) = get_json(&admin.url("/api/v1/nodes/zz")).await;
    assert_eq!(s, 404);
    let (s, _) = get_json(&admin.url("/api/v1/nope")).await;
    assert_eq!(s, 404);
    let r = client()
        .put(admin.url("/api/v1/nodes"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status().as_u16(), 405);
    let (s, v) = get_json(&admin.url("/api/v1/tables/t?limit=abc")).await;
    assert_eq!(s, 400, "{v}");
    // A refused reload says why, with 422.
    let r = client()
        .post(admin.url("/api/v1/reload"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status().as_u16(), 422);
    assert_eq!(control.state_of("a"), "UP", "nothing changed");
    admin.stop().await;
}

#[tokio::test]
async fn writes_need_the_token_beyond_loopback() {
    // Refused at start without a token (the pure check limpet runs before binding).
    let open = AdminSettings {
        listen: "0.0.0.0:9900".parse().unwrap_or_else(|e| panic!("{e}")),
        token: None,
    };
    assert!(matches!(
        open.validate(),
        Err(AdminSettingsError::TokenRequired(_))
    ));

    // Bound on every address (not loopback) with a token: writes need it, reads do not.
    let control = PoolControl::new(&["a", "b"]);
    let admin = Admin::start("0.0.0.0:0", control.clone(), Some(TOKEN)).await;
    let (s, v) = post_state(&admin, "a", r#"{"state":"maint"}"#, None).await;
    assert_eq!(s, 401, "{v}");
    let (s, _) = post_state(
        &admin,
        "a",
        r#"{"state":"maint"}"#,
        Some("wrong-token-000000000"),
    )
    .await;
    assert_eq!(s, 401);
    assert_eq!(control.state_of("a"), "UP");
    for (method, path) in [
        (reqwest::Method::POST, "/api/v1/reload"),
        (reqwest::Method::DELETE, "/api/v1/tables/t"),
        (reqwest::Method::DELETE, "/api/v1/tables/t/entry?key=1"),
    ] {
        let r = client()
            .request(method, admin.url(path))
            .send()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.status().as_u16(), 401, "{path}");
    }
    let (s, v) = post_state(&admin, "a", r#"{"state":"maint"}"#, Some(TOKEN)).await;
    assert_eq!((s, v["state"].as_str()), (200, Some("MAINT")));
    assert_eq!(control.state_of("a"), "MAINT");
    let (s, _) = get_json(&admin.url("/api/v1/nodes")).await;
    assert_eq!(s, 200, "reads need no token");
    admin.stop().await;
}

#[tokio::test]
async fn metrics_and_page_are_served() {
    let control = PoolControl::new(&["a", "b"]);
    control.metrics.request("web", Some("a"), 200);
    control.metrics.pin(
        "web",
        limpet::metrics::PinOutcome::Repinned(limpet_core::RepinReason::NodeMaint),
    );
    let admin = Admin::start("127.0.0.1:0", control.clone(), None).await;
    let r = client()
        .get(admin.url("/metrics"))
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
        r#"limpet_requests_total{listener="web",node="a",class="2xx"} 1"#,
        r#"limpet_pins_total{listener="web",outcome="repinned",reason="node-maint"} 1"#,
        r#"limpet_node_state{node="b",state="UP"} 1"#,
        "# EOF",
    ] {
        assert!(text.contains(want), "missing {want}:\n{text}");
    }
    let (s, v) = get_json(&admin.url("/api/v1/stats")).await;
    assert_eq!(s, 200);
    assert_eq!(v["totals"]["requests"], 1);
    assert_eq!(v["totals"]["repinned"], 1);
    let page = client()
        .get(admin.url("/"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(page
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .starts_with("text/html"));
    let html = page.text().await.unwrap_or_default();
    assert!(html.contains("<title>limpet stats</title>"));
    assert!(
        !html.contains("src=\"http") && !html.contains("href=\"http"),
        "no external assets"
    );
    let r = client()
        .get(admin.url("/ready"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status().as_u16(), 200);
    admin.stop().await;
}
