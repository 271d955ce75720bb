//! The failback policy (issue 4) end to end on loopback: with `failback = "home"` a session
//! moved off its node carries a `route-home` cookie and goes back once the node is UP again;
//! with the default (`"none"`) it stays where it was moved.

mod admin_common;

use admin_common::lifecycle::*;

const NODES: [(&str, &str); 2] = [("a", "127.0.0.2"), ("b", "127.0.0.3")];

fn config(port: u16, failback: Option<&str>) -> String {
    let cookie = failback.map_or(String::new(), |f| {
        format!("cookie = {{ failback = \"{f}\" }}\n")
    });
    format!(
        "{}[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = {port}\n{cookie}\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n",
        nodes_toml(&NODES)
    )
}

/// GET with these cookies: (status, node, every Set-Cookie in full).
async fn get_all(url: &str, cookie: &str) -> (u16, String, Vec<String>) {
    let mut req = bare_client().get(url);
    if !cookie.is_empty() {
        req = req.header("cookie", cookie);
    }
    let r = req
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    let node = r
        .headers()
        .get(limpet::backend::NODE_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let set = r
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(str::to_owned)
        .collect();
    let status = r.status().as_u16();
    let _ = r.bytes().await;
    (status, node, set)
}

/// The `name=value` of the Set-Cookie for `name`, and its attributes.
fn cookie<'a>(set: &'a [String], name: &str) -> Option<&'a str> {
    set.iter()
        .map(String::as_str)
        .find(|c| c.split('=').next() == Some(name))
}

/// Pins a fresh session to a, then puts a in MAINT and asks again: (the answer's cookies).
async fn pin_to_a_then_maint(l: &Limpet, url: &str) -> Vec<String> {
    let (s, node, set) = get_all(url, "").await;
    assert_eq!((s, node.as_str()), (200, "a"), "{set:?}");
    assert!(cookie(&set, "route").is_some_and(|c| c.starts_with("route=a;")));
    set_state(l, "a", r#"{"state":"maint"}"#).await;
    let (s, node, set) = get_all(url, "route=a").await;
    assert_eq!((s, node.as_str()), (200, "b"), "{set:?}");
    assert!(
        cookie(&set, "route").is_some_and(|c| c.starts_with("route=b;")),
        "{set:?}"
    );
    set
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failback_home_returns_the_session_once_its_node_is_up() {
    let (_nodes, port) = backend_nodes(&NODES).await;
    let cfg = ConfigFile::new("failback-home", &config(port, Some("home")));
    let l = Limpet::start(&cfg).await;
    let url = format!("http://{}/", l.addr("web"));

    let set = pin_to_a_then_maint(&l, &url).await;
    let home = cookie(&set, "route-home").unwrap_or_else(|| panic!("no home cookie: {set:?}"));
    let route = cookie(&set, "route").unwrap_or_default();
    // Same attributes as the pin cookie.
    assert_eq!(
        home.split_once(';').map(|x| x.1),
        route.split_once(';').map(|x| x.1),
        "{set:?}"
    );
    assert!(home.starts_with("route-home=a;"), "{home}");

    // While a is out, the session stays on b and keeps its home.
    let (s, node, set) = get_all(&url, "route=b; route-home=a").await;
    assert_eq!((s, node.as_str(), set.len()), (200, "b", 0), "{set:?}");

    // a is back UP: the next request goes home and the home cookie is expired.
    set_state(&l, "a", r#"{"state":"ready"}"#).await;
    let (s, node, set) = get_all(&url, "route=b; route-home=a").await;
    assert_eq!((s, node.as_str()), (200, "a"), "{set:?}");
    assert!(
        cookie(&set, "route").is_some_and(|c| c.starts_with("route=a;")),
        "{set:?}"
    );
    let cleared = cookie(&set, "route-home").unwrap_or_else(|| panic!("{set:?}"));
    assert!(
        cleared.starts_with("route-home=;") && cleared.contains("Max-Age=0"),
        "{cleared}"
    );
    // Home for good: plain sticky from now on.
    let (s, node, set) = get_all(&url, "route=a").await;
    assert_eq!((s, node.as_str(), set.len()), (200, "a", 0), "{set:?}");
    l.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_failback_by_default_and_with_none() {
    let (_nodes, port) = backend_nodes(&NODES).await;
    for failback in [None, Some("none")] {
        let cfg = ConfigFile::new("failback-none", &config(port, failback));
        let l = Limpet::start(&cfg).await;
        let url = format!("http://{}/", l.addr("web"));
        let set = pin_to_a_then_maint(&l, &url).await;
        assert_eq!(cookie(&set, "route-home"), None, "{set:?}");
        set_state(&l, "a", r#"{"state":"ready"}"#).await;
        // Even a client sending a home cookie is not moved back.
        let (s, node, set) = get_all(&url, "route=b; route-home=a").await;
        assert_eq!((s, node.as_str(), set.len()), (200, "b", 0), "{set:?}");
        l.stop().await;
    }
}

/// The client library with its default names keeps limpet's home cookie beside its pin, so a
/// session of it goes home like a browser's. Before, its jar kept `route` alone and dropped
/// `route-home`: the session stayed on b for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_library_session_goes_home_too() {
    use limpet_client::reqwest::AffinityCookieStore;
    use limpet_client::{AffinityJar, Origin, SharedJar};
    let (_nodes, port) = backend_nodes(&NODES).await;
    let cfg = ConfigFile::new("failback-client", &config(port, Some("home")));
    let l = Limpet::start(&cfg).await;
    let url = format!("http://{}/", l.addr("web"));
    let origin = Origin::parse(&url).unwrap_or_else(|e| panic!("{e}"));
    let jar = SharedJar::new(AffinityJar::new(origin));
    let store = std::sync::Arc::new(AffinityCookieStore::new(jar.clone()));
    let client = reqwest::Client::builder()
        .cookie_provider(store)
        .no_proxy()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let node = || async {
        let r = client
            .get(&url)
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET: {e}"));
        let n = r
            .headers()
            .get(limpet::backend::NODE_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let _ = r.bytes().await;
        n
    };
    let held = || jar.cookie_header(&jar.origin()).unwrap_or_default();

    assert_eq!(node().await, "a");
    set_state(&l, "a", r#"{"state":"maint"}"#).await;
    assert_eq!(node().await, "b");
    assert!(
        held().contains("route-home=a"),
        "the jar holds {:?}",
        held()
    );
    assert_eq!(node().await, "b", "stays on b while a is out");
    set_state(&l, "a", r#"{"state":"ready"}"#).await;
    assert_eq!(node().await, "a", "home once a is back");
    assert!(
        !held().contains("route-home"),
        "home cookie expired: {:?}",
        held()
    );
    assert_eq!(node().await, "a");
    l.stop().await;
}
