//! Cookie affinity end to end: spread, stickiness, failover re-pin, hostile cookies, what the
//! node sees (stripped cookie, X-Forwarded-*, no hop-by-hop), what the client gets
//! (Set-Cookie, Cache-Control).

mod common;

use std::collections::BTreeSet;

use common::{
    body_of, config, jar_client, node_in, node_of, nodes, plain_client, raw_exchange, set_cookie,
    set_cookie_in, Proxy,
};
use limpet::proxy::Sticky;

#[tokio::test]
async fn fresh_clients_spread_over_all_nodes_and_a_jar_client_stays() {
    let ns = nodes(&["a", "b", "c"]).await;
    let proxy = Proxy::start(config(&ns)).await;

    let mut seen = BTreeSet::new();
    for _ in 0..6 {
        let resp = plain_client()
            .get(proxy.url("/"))
            .send()
            .await
            .expect("get");
        assert_eq!(resp.status(), 200);
        let cookie = set_cookie(&resp).expect("a fresh client is pinned");
        let node = node_of(&resp);
        assert!(cookie.starts_with(&format!("route={node}; ")), "{cookie}");
        seen.insert(node);
    }
    assert_eq!(seen.len(), 3, "round-robin over every node: {seen:?}");

    let client = jar_client();
    let first = client.get(proxy.url("/")).send().await.expect("get");
    let pinned = node_of(&first);
    assert!(set_cookie(&first).is_some());
    for _ in 0..10 {
        let resp = client.get(proxy.url("/")).send().await.expect("get");
        assert_eq!(node_of(&resp), pinned);
        assert!(set_cookie(&resp).is_none(), "a sticky hit sends no cookie");
    }
    proxy.stop().await;
}

/// The failure model's "node answers 5xx": the answer reaches the client as the node gave
/// it (status, body, the node's own header), from the pinned node and no other (not retried
/// elsewhere), and the session stays pinned: no Set-Cookie, and after more 5xx answers in a
/// row than `fall` the next request still goes to that node (a 5xx is an answer, not a
/// failure of the node).
#[tokio::test]
async fn a_node_s_5xx_answers_pass_through_and_the_session_stays_pinned() {
    let ns = nodes(&["a", "b"]).await;
    let proxy = Proxy::start(config(&ns)).await;
    let client = jar_client();
    let first = client.get(proxy.url("/")).send().await.expect("get");
    let pinned = node_of(&first);
    assert!(set_cookie(&first).is_some(), "pinned by the first answer");
    for status in [500u16, 502, 503, 500, 500, 504] {
        let resp = client
            .get(proxy.url(&format!("/status/{status}")))
            .send()
            .await
            .expect("get");
        assert_eq!(resp.status().as_u16(), status, "the node's status as it is");
        assert_eq!(
            node_of(&resp),
            pinned,
            "from the pinned node, not retried elsewhere"
        );
        assert!(set_cookie(&resp).is_none(), "a 5xx does not move the pin");
        assert_eq!(
            resp.text().await.expect("body"),
            format!("node {pinned}: status {status}\n"),
            "the node's own body"
        );
    }
    let after = client.get(proxy.url("/")).send().await.expect("get");
    assert_eq!(after.status(), 200);
    assert_eq!(
        node_of(&after),
        pinned,
        "still pinned after six 5xx answers"
    );
    assert!(set_cookie(&after).is_none());
    proxy.stop().await;
}

#[tokio::test]
async fn set_cookie_attributes_and_cache_control() {
    let ns = nodes(&["a"]).await;
    let proxy = Proxy::start(config(&ns)).await;
    let resp = plain_client()
        .get(proxy.url("/"))
        .send()
        .await
        .expect("get");
    assert_eq!(
        set_cookie(&resp).as_deref(),
        Some("route=a; Path=/; HttpOnly; SameSite=Lax")
    );
    assert_eq!(
        resp.headers()
            .get("cache-control")
            .and_then(|v| v.to_str().ok()),
        Some("no-cache=\"set-cookie\"")
    );
    proxy.stop().await;
}

#[tokio::test]
async fn killing_the_pinned_node_repins_on_the_very_next_request() {
    let mut ns = nodes(&["a", "b", "c"]).await;
    let proxy = Proxy::start(config(&ns)).await;
    let client = jar_client();
    let first = client.get(proxy.url("/")).send().await.expect("get");
    let pinned = node_of(&first);
    // Keep-alive connections to the node exist now; killing it must not leak an error.
    let victim = ns
        .iter_mut()
        .find(|n| n.name == pinned)
        .expect("pinned node");
    victim.kill().await;

    let resp = client.get(proxy.url("/")).send().await.expect("get");
    assert_eq!(resp.status(), 200);
    let moved = node_of(&resp);
    assert_ne!(moved, pinned);
    assert_eq!(
        set_cookie(&resp).map(|c| c.starts_with(&format!("route={moved};"))),
        Some(true),
        "re-pinned with a new cookie"
    );
    for _ in 0..5 {
        let resp = client.get(proxy.url("/")).send().await.expect("get");
        assert_eq!(resp.status(), 200);
        assert_eq!(node_of(&resp), moved, "the client stays on its new node");
        assert!(set_cookie(&resp).is_none());
    }
    proxy.stop().await;
}

/// Over HTTP/2 a client may send its cookies as several `cookie` fields (RFC 9113 8.2.3, as
/// browsers do): the first `route` pair across them decides, as across HTTP/1.1 `Cookie`
/// lines. Another cookie first changes nothing; an unusable first `route` gets a fresh pin
/// with its cookie, a later valid one never looked at.
#[tokio::test]
async fn over_http2_the_first_route_pair_across_cookie_fields_decides() {
    let ns = nodes(&["a", "b"]).await;
    let proxy = Proxy::start(config(&ns)).await;
    let (mut send, _conn) = common::h2_client(&proxy.addr.to_string()).await;
    for (fields, sticky) in [
        (&["lang=en", "route=b"][..], Some("b")),
        (&["route=b; x=1", "route=a"][..], Some("b")),
        (&["route=zz", "route=b"][..], None),
        (&["route=", "route=b"][..], None),
    ] {
        let mut req = http::Request::get(proxy.url("/"));
        for f in fields {
            req = req.header("cookie", *f);
        }
        let req = req
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .expect("request");
        let resp = send.send_request(req).await.expect("answer");
        assert_eq!(resp.status(), 200, "{fields:?}");
        let (node, set) = (node_in(resp.headers()), set_cookie_in(resp.headers()));
        match sticky {
            Some(home) => assert_eq!((node.as_str(), set), (home, None), "{fields:?}"),
            None => assert!(
                set.is_some_and(|c| c.starts_with(&format!("route={node};"))),
                "{fields:?}: a fresh pin on {node}"
            ),
        }
    }
    proxy.stop().await;
}

/// The sim and the proxy refuse the same request heads as too large, to the byte: a head of
/// 64 KiB with the empty line that ends it is read by both (the cookie routes it), one byte
/// more is refused by both (431 from the proxy, `ERR` from the sim), with LF and with CRLF
/// line endings. Before, the sim left the empty line out of the count and routed heads the
/// proxy refused.
#[tokio::test]
async fn the_sim_and_the_proxy_refuse_the_same_heads_as_too_large() {
    let ns = nodes(&["a", "b"]).await;
    let proxy = Proxy::start(config(&ns)).await;
    let limit = limpet::sim::Limits::default().max_head;
    for eol in ["\n", "\r\n"] {
        for size in [limit - 1, limit, limit + 1] {
            let start = format!(
                "GET / HTTP/1.1{eol}Host: x{eol}Connection: close{eol}Cookie: route=b{eol}X-Pad: "
            );
            let pad = size - start.len() - 2 * eol.len();
            let head = format!("{start}{}{eol}{eol}", "p".repeat(pad));
            assert_eq!(head.len(), size);
            let answer = raw_exchange(proxy.addr, head.as_bytes()).await;
            let status = answer.split(' ').nth(1).unwrap_or("none").to_owned();
            let mut out = Vec::new();
            let input = format!("POOL a b\nREQUEST\n{head}");
            limpet::sim::pump(
                limpet::sim::Sim::new(limpet::sim::Limits::default()),
                input.as_bytes(),
                &mut out,
            )
            .expect("the sim runs");
            let said = String::from_utf8_lossy(&out).into_owned();
            let fits = size <= limit;
            assert_eq!(
                (status.as_str(), said.as_str()),
                if fits {
                    ("200", "OK\nb sticky\n")
                } else {
                    ("431", "OK\nERR request head too large\n")
                },
                "a head of {size} bytes, line ending {eol:?}"
            );
        }
    }
    proxy.stop().await;
}

/// A connection's requests sent before its client had the cookie go where its first one went
/// (the connection's pin), and so do its requests without the cookie once it came back (one
/// client, some of whose requests go without it: outside its `Path`, a `SameSite` they do
/// not meet). Once a cookie of another node comes on the connection (a front proxy pooling
/// its connections to limpet carries more than one client), a request without one is a new
/// session, balanced as any other. Before, the pin held for the connection's life, and
/// every new session of a pooled connection went to its first node.
#[tokio::test]
async fn a_connection_carrying_another_session_s_cookie_balances_its_cookieless_requests() {
    let ns = nodes(&["a", "b", "c"]).await;
    let proxy = Proxy::start(config(&ns)).await;
    let (mut send, _conn) = common::h2_client(&proxy.addr.to_string()).await;
    let mut get = async |cookie: Option<String>| {
        let mut req = http::Request::get(proxy.url("/"));
        if let Some(c) = cookie {
            req = req.header("cookie", c);
        }
        let req = req
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .expect("request");
        let resp = send.send_request(req).await.expect("answer");
        assert_eq!(resp.status(), 200);
        (node_in(resp.headers()), set_cookie_in(resp.headers()))
    };
    let (first, set) = get(None).await;
    assert!(set.is_some_and(|c| c.starts_with(&format!("route={first};"))));
    let (second, set) = get(None).await;
    assert_eq!(
        second, first,
        "sent before the cookie came back: the connection's node"
    );
    assert!(set.is_some_and(|c| c.starts_with(&format!("route={first};"))));
    let (back, set) = get(Some(format!("route={first}"))).await;
    assert_eq!(
        (back.as_str(), set),
        (first.as_str(), None),
        "the cookie came back"
    );
    let (again, _) = get(None).await;
    assert_eq!(
        again, first,
        "one client's request without its cookie: its node still"
    );
    let other = ["a", "b", "c"]
        .into_iter()
        .find(|n| *n != first)
        .unwrap_or("a");
    let (there, set) = get(Some(format!("route={other}"))).await;
    assert_eq!(
        (there.as_str(), set),
        (other, None),
        "another session's cookie"
    );
    let (fresh, set) = get(None).await;
    assert_ne!(
        fresh, first,
        "a new session after another's cookie: the next turn"
    );
    assert!(set.is_some_and(|c| c.starts_with(&format!("route={fresh};"))));
    let (follows, _) = get(None).await;
    assert_eq!(
        follows, fresh,
        "and its own requests follow it until its cookie comes back"
    );
    proxy.stop().await;
}

#[tokio::test]
async fn hostile_cookie_values_get_a_fresh_pin_never_an_error() {
    let ns = nodes(&["a", "b"]).await;
    let proxy = Proxy::start(config(&ns)).await;
    let huge = "x".repeat(16 * 1024);
    let many: String = (0..300)
        .map(|i| format!("c{i}=v{i}"))
        .collect::<Vec<_>>()
        .join("; ");
    let cases = [
        "route=nonexistent".to_owned(),
        "route=127.0.0.1:1".to_owned(),
        format!("route={}", ns[0].addr),
        "route=a%7F".to_owned(),
        "route=\"a\"".to_owned(),
        "route=".to_owned(),
        "route=A".to_owned(),
        format!("route={huge}"),
        format!("{many}; route=zz"),
    ];
    for cookie in &cases {
        let resp = plain_client()
            .get(proxy.url("/"))
            .header("cookie", cookie)
            .send()
            .await
            .expect("get");
        assert_eq!(resp.status(), 200, "cookie {:.40}", cookie);
        let set = set_cookie(&resp).expect("fresh pin");
        let node = node_of(&resp);
        assert!(set.starts_with(&format!("route={node};")), "{set}");
    }
    proxy.stop().await;
}

/// What the node sees of a request, on both paths to it: a bodiless GET (written by
/// `node_h1`) and a POST with a body (hyper's client).
#[tokio::test]
async fn the_node_sees_other_cookies_untouched_and_not_ours() {
    let ns = nodes(&["a"]).await;
    let proxy = Proxy::start(config(&ns)).await;
    for method in [reqwest::Method::GET, reqwest::Method::POST] {
        let request = |cookie: &'static str| {
            let r = plain_client()
                .request(method.clone(), proxy.url("/headers"))
                .header("cookie", cookie);
            if method == reqwest::Method::POST {
                r.body("a body")
            } else {
                r
            }
        };
        let body = body_of(
            request("theme=dark; route=a;lang=en ;  x=\"q\"")
                .header("x-forwarded-for", "6.6.6.6")
                .header("x-forwarded-proto", "https")
                .header("forwarded", "for=6.6.6.6;proto=https;host=admin")
                .header("x-forwarded_for", "6.6.6.6")
                .header("x_forwarded_proto", "https")
                .header("x-api_key", "kept")
                .header("connection", "x-secret")
                .header("x-secret", "hop")
                .header("te", "trailers"),
        )
        .await;
        let lines: Vec<&str> = body.lines().collect();
        assert!(
            lines.contains(&"cookie: theme=dark;lang=en ;  x=\"q\""),
            "{method}: {body}"
        );
        assert!(
            lines.contains(&"x-forwarded-for: 127.0.0.1"),
            "{method}: {body}"
        );
        assert!(
            lines.contains(&"x-forwarded-proto: http"),
            "{method}: {body}"
        );
        assert!(
            lines.contains(&format!("x-forwarded-host: {}", proxy.addr).as_str()),
            "{method}: {body}"
        );
        assert!(
            lines.contains(&format!("host: {}", proxy.addr).as_str()),
            "Host is kept: {method}: {body}"
        );
        assert!(!body.contains("x-secret"), "{method}: {body}");
        assert!(!body.contains("\nte:"), "{method}: {body}");
        // RFC 7239's field and look-alikes of limpet's with `_` (which CGI-style servers
        // read as limpet's own) are the client's forgeries too; other `_` names pass.
        assert!(
            !lines.iter().any(|l| l.starts_with("forwarded:")),
            "{method}: {body}"
        );
        assert!(!body.contains("x-forwarded_for"), "{method}: {body}");
        assert!(!body.contains("x_forwarded_proto"), "{method}: {body}");
        assert!(lines.contains(&"x-api_key: kept"), "{method}: {body}");
        assert!(body.contains("x-request-id: "), "{method}: {body}");
        assert_eq!(
            lines.iter().filter(|l| l.starts_with("cookie:")).count(),
            1,
            "{method}: {body}"
        );

        // A Cookie header holding only our cookie disappears.
        let body = body_of(request("route=a")).await;
        assert!(!body.contains("cookie:"), "{method}: {body}");
    }
    proxy.stop().await;
}

#[tokio::test]
async fn trusted_proxies_extend_x_forwarded_for() {
    let ns = nodes(&["a"]).await;
    let mut cfg = config(&ns);
    cfg.trusted_proxies = vec!["127.0.0.0/8".parse().expect("cidr")];
    let proxy = Proxy::start(cfg).await;
    let body = body_of(
        plain_client()
            .get(proxy.url("/headers"))
            .header("x-forwarded-for", "203.0.113.9")
            .header("x-forwarded-proto", "https")
            .header("forwarded", "for=203.0.113.9;proto=https"),
    )
    .await;
    assert!(
        body.contains("x-forwarded-for: 203.0.113.9, 127.0.0.1"),
        "{body}"
    );
    assert!(body.contains("x-forwarded-proto: https"), "{body}");
    // A trusted proxy's `Forwarded` is kept, as its `X-Forwarded-Proto` is.
    assert!(
        body.contains("forwarded: for=203.0.113.9;proto=https"),
        "{body}"
    );
    proxy.stop().await;
}

#[tokio::test]
async fn sticky_none_is_plain_round_robin_without_cookies() {
    let ns = nodes(&["a", "b"]).await;
    let mut cfg = config(&ns);
    cfg.sticky = Sticky::None;
    let proxy = Proxy::start(cfg).await;
    let client = jar_client();
    let mut got = Vec::new();
    for _ in 0..4 {
        let resp = client.get(proxy.url("/")).send().await.expect("get");
        assert!(resp.headers().get("set-cookie").is_none());
        got.push(node_of(&resp));
    }
    assert_eq!(got, ["a", "b", "a", "b"]);
    proxy.stop().await;
}

#[tokio::test]
async fn node_answers_pass_through_with_status_and_stream_headers() {
    let ns = nodes(&["a"]).await;
    let proxy = Proxy::start(config(&ns)).await;
    let resp = plain_client()
        .get(proxy.url("/status/418"))
        .send()
        .await
        .expect("get");
    assert_eq!(resp.status(), 418);
    assert_eq!(node_of(&resp), "a");
    // HTTP/1.0-style raw request with an absolute-form target still reaches the node.
    let answer = raw_exchange(
        proxy.addr,
        b"GET http://example.test/ HTTP/1.1\r\nHost: example.test\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    proxy.stop().await;
}

fn signed_config(ns: &[common::Node], key: &[u8]) -> limpet::proxy::ProxyConfig {
    let mut cfg = config(ns);
    cfg.sticky = Sticky::Cookie(limpet::proxy::CookieConfig {
        mode: limpet::proxy::CookieMode::Signed {
            keys: vec![key.to_vec()],
            max_idle: std::time::Duration::from_secs(3600),
            max_lifetime: std::time::Duration::from_secs(86_400),
        },
        ..Default::default()
    });
    cfg
}

#[tokio::test]
async fn signed_cookies_are_opaque_sticky_and_unforgeable() {
    let ns = nodes(&["alpha", "beta"]).await;
    let proxy = Proxy::start(signed_config(&ns, &[7u8; 32])).await;
    let resp = plain_client()
        .get(proxy.url("/"))
        .send()
        .await
        .expect("get");
    let node = node_of(&resp);
    let set = set_cookie(&resp).expect("pinned");
    let value = set
        .strip_prefix("route=")
        .and_then(|v| v.split(';').next())
        .expect("value")
        .to_owned();
    assert_eq!(value.len(), 44, "{value}");
    assert!(!value.contains("alpha") && !value.contains("beta"));

    // The token pins.
    for _ in 0..3 {
        let resp = plain_client()
            .get(proxy.url("/"))
            .header("cookie", format!("route={value}"))
            .send()
            .await
            .expect("get");
        assert_eq!(node_of(&resp), node);
        assert!(set_cookie(&resp).is_none());
    }

    // A tampered token, a node name, and a token from another key are no pin.
    let mut tampered = value.clone().into_bytes();
    tampered[10] = if tampered[10] == b'A' { b'B' } else { b'A' };
    let other = Proxy::start(signed_config(&ns, &[9u8; 32])).await;
    let foreign = plain_client()
        .get(other.url("/"))
        .send()
        .await
        .expect("get");
    let foreign = set_cookie(&foreign).expect("pinned");
    let foreign = foreign.split(';').next().expect("pair").to_owned();
    for cookie in [
        format!("route={}", String::from_utf8_lossy(&tampered)),
        "route=alpha".to_owned(),
        foreign,
    ] {
        let resp = plain_client()
            .get(proxy.url("/"))
            .header("cookie", &cookie)
            .send()
            .await
            .expect("get");
        assert_eq!(resp.status(), 200);
        assert!(set_cookie(&resp).is_some(), "{cookie} must not pin");
    }
    other.stop().await;
    proxy.stop().await;
}

/// A node that sets its own cookie of limpet's name on every answer (`route=evil`, once on
/// `Path=/` and once on a longer path, which a browser would send first), beside one of its
/// own. Its answers name it, and its task ends when dropped.
struct CookieSettingNode {
    addr: std::net::SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for CookieSettingNode {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn cookie_setting_node(name: &'static str) -> CookieSettingNode {
    use hyper::body::{Bytes, Incoming};
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("bind: {e}"));
    let addr = listener
        .local_addr()
        .unwrap_or_else(|e| panic!("addr: {e}"));
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let svc =
                    hyper::service::service_fn(move |_req: hyper::Request<Incoming>| async move {
                        hyper::Response::builder()
                            .header("x-limpet-node", name)
                            .header("set-cookie", "route=evil; Path=/")
                            .header("set-cookie", "theme=dark; Path=/")
                            .header("set-cookie", "route=evil; Path=/app")
                            .body(http_body_util::Full::new(Bytes::from(name)))
                    });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    CookieSettingNode { addr, task }
}

/// The pin is limpet's to write: a node's own `Set-Cookie` of limpet's cookie name is left
/// out of its answers (HAProxy's `cookie ... insert` does the same), its other cookies pass.
/// Before, the node's `route=evil` reached the jar on the second answer, the third request
/// carried it, read as an unknown node, and the session moved off a node that was UP.
#[tokio::test]
async fn a_node_s_own_cookie_of_limpet_s_name_does_not_reach_the_client() {
    let (a, b) = (
        cookie_setting_node("a").await,
        cookie_setting_node("b").await,
    );
    let proxy = Proxy::start(limpet::proxy::ProxyConfig::new(vec![
        limpet::proxy::NodeConfig {
            name: "a".into(),
            addr: a.addr,
        },
        limpet::proxy::NodeConfig {
            name: "b".into(),
            addr: b.addr,
        },
    ]))
    .await;
    let client = jar_client();
    let mut home = None;
    for i in 0..5 {
        let resp = client.get(proxy.url("/")).send().await.expect("get");
        assert_eq!(resp.status(), 200);
        let node = node_of(&resp);
        assert_eq!(
            home.get_or_insert_with(|| node.clone()),
            &node,
            "request {i}"
        );
        let cookies: Vec<&str> = resp
            .headers()
            .get_all("set-cookie")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        assert!(
            cookies.contains(&"theme=dark; Path=/"),
            "the node's other cookie passes: {cookies:?}"
        );
        let routes: Vec<&&str> = cookies.iter().filter(|c| c.starts_with("route=")).collect();
        if i == 0 {
            assert_eq!(routes.len(), 1, "limpet's pin alone: {cookies:?}");
            assert!(
                routes[0].starts_with(&format!("route={node}; ")),
                "{cookies:?}"
            );
        } else {
            assert!(routes.is_empty(), "a sticky hit sets no route: {cookies:?}");
        }
    }
    proxy.stop().await;
}

/// A cookie with a `Max-Age` is set again on every answer that follows it (`name` mode: the
/// value carries no time), with its `Max-Age`, so an active session's cookie never lapses
/// while it is used; without a `Max-Age` a sticky answer sets none. Before, it was set on
/// the first answer only, and a browser dropped it `Max-Age` later, busy or not: the
/// session balanced afresh, its WebSocket left behind.
#[tokio::test]
async fn a_cookie_with_a_max_age_is_set_again_on_every_answer_that_follows_it() {
    let ns = nodes(&["a", "b"]).await;
    for max_age in [Some(60), None] {
        let mut cfg = config(&ns);
        cfg.sticky = Sticky::Cookie(limpet::proxy::CookieConfig {
            spec: limpet_core::CookieSpec {
                max_age,
                ..limpet_core::CookieSpec::proxy_default()
            },
            ..Default::default()
        });
        let proxy = Proxy::start(cfg).await;
        let client = plain_client();
        let first = client.get(proxy.url("/")).send().await.expect("get");
        let node = node_of(&first);
        let set = common::set_cookie_in(first.headers()).expect("a fresh pin sets the cookie");
        assert_eq!(set.contains("Max-Age=60"), max_age.is_some(), "{set}");
        for _ in 0..3 {
            let again = client
                .get(proxy.url("/"))
                .header("cookie", format!("route={node}"))
                .send()
                .await
                .expect("get");
            assert_eq!(node_of(&again), node);
            let set = common::set_cookie_in(again.headers());
            match max_age {
                Some(_) => {
                    let set = set.unwrap_or_else(|| panic!("renewed on a sticky answer"));
                    assert!(set.starts_with(&format!("route={node};")), "{set}");
                    assert!(set.contains("Max-Age=60"), "{set}");
                }
                None => assert_eq!(set, None, "a session cookie is not set again"),
            }
        }
        proxy.stop().await;
    }
}
