//! `limpet probe` over https:// and wss:// (the built binary): limpet with an HTTPS listener
//! (certificate from a test CA made here with rcgen) in front of demo nodes, cookie affinity.
//! With `--ca` the probe trusts the CA, keeps limpet's `Secure` cookie and passes; without it
//! the handshake fails and the probe says why (exit 2).

mod common;

use std::net::{IpAddr, SocketAddr};

use common::multiport::{config, Pki, TempDir};
use common::probe::probe;
use common::PATIENCE;
use limpet::runtime::{start, Running};
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

/// Demo nodes (`limpet::backend::serve`) on 127.0.0.2.. all on one port, as a listener's
/// `node_port` wants; each stopped by its sender.
struct Nodes {
    port: u16,
    names: Vec<&'static str>,
    stops: Vec<oneshot::Sender<()>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Nodes {
    async fn start(names: &[&'static str]) -> Nodes {
        let ips: Vec<IpAddr> = (0..names.len())
            .map(|i| IpAddr::from([127, 0, 0, 2 + i as u8]))
            .collect();
        'attempt: for _ in 0..50 {
            let first = TcpListener::bind(SocketAddr::new(ips[0], 0))
                .await
                .expect("bind first node");
            let port = first.local_addr().expect("addr").port();
            let mut listeners = vec![first];
            for ip in &ips[1..] {
                match TcpListener::bind(SocketAddr::new(*ip, port)).await {
                    Ok(l) => listeners.push(l),
                    Err(_) => continue 'attempt,
                }
            }
            let mut stops = Vec::new();
            let mut tasks = Vec::new();
            for (&name, listener) in names.iter().zip(listeners) {
                let (tx, rx) = oneshot::channel::<()>();
                stops.push(tx);
                tasks.push(tokio::spawn(async move {
                    limpet::backend::serve(name, listener, async {
                        let _ = rx.await;
                    })
                    .await;
                }));
            }
            return Nodes {
                port,
                names: names.to_vec(),
                stops,
                tasks,
            };
        }
        panic!("no common free port for the demo nodes");
    }

    async fn stop(self) {
        for tx in self.stops {
            let _ = tx.send(());
        }
        for t in self.tasks {
            let _ = tokio::time::timeout(PATIENCE, t).await;
        }
    }
}

/// limpet with one HTTPS listener (`https`) and the default `route` cookie.
async fn limpet_https(pki: &Pki, dir: &TempDir, nodes: &Nodes) -> Running {
    let (cert, key) = pki.issue("limpet", &["127.0.0.1"]);
    let mut text = String::new();
    for (i, name) in nodes.names.iter().enumerate() {
        text.push_str(&format!(
            "[[nodes]]\nname = \"{name}\"\naddress = \"127.0.0.{}\"\n\n",
            i + 2
        ));
    }
    text.push_str(&format!(
        "[[listeners]]\nname = \"https\"\nbind = \"127.0.0.1:0\"\nnode_port = {}\n\
         tls = {{ cert = \"{}\", key = \"{}\" }}\n",
        nodes.port,
        cert.display(),
        key.display()
    ));
    start(config(dir, &text)).await.expect("start limpet")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_over_https_and_wss_with_the_ca() {
    let pki = Pki::new();
    let dir = TempDir::new("probe-tls");
    let nodes = Nodes::start(&["a", "b", "c"]).await;
    let running = limpet_https(&pki, &dir, &nodes).await;
    let url = format!("https://{}/", running.addr("https").expect("https addr"));
    let ca = pki.ca_pem.display().to_string();

    // limpet's cookie over TLS carries Secure: the jar must keep it all the same (it is an
    // https origin), or no session below could stay on its node.
    let pem = std::fs::read(&pki.ca_pem).expect("ca pem");
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&pem).expect("ca cert"))
        .build()
        .expect("client");
    let resp = client.get(&url).send().await.expect("https answer");
    let cookie = common::set_cookie(&resp).unwrap_or_default();
    assert!(
        cookie.starts_with("route=") && cookie.contains("Secure"),
        "limpet's cookie over TLS: {cookie:?}"
    );

    let run = probe(&[
        &url,
        "--ws",
        "/ws",
        "--sessions",
        "6",
        "--requests",
        "4",
        "--ca",
        &ca,
        "--json",
    ])
    .await;
    assert_eq!(run.code, Some(0), "{run:?}");
    let r = run.report();
    assert_eq!(r["outcome"], "kept", "{r}");
    assert_eq!(r["url"], url.as_str());
    let ws = format!("wss://{}/ws", running.addr("https").expect("addr"));
    assert_eq!(r["ws"], ws.as_str());
    assert_eq!(r["errors"].as_array().map(Vec::len), Some(0), "{r}");
    let s = &r["summary"];
    assert_eq!((u(&s["breaks"]), u(&s["repins"])), (0, 0), "{s}");
    assert_eq!(u(&s["kept_affinity"]), 6, "{s}");
    assert_eq!(u(&s["stayed_on_one_node"]), 6, "{s}");
    // Discovery, the socket's greeting and 4 requests per session, all naming their node.
    assert_eq!(u(&s["answers"]), 6 * 6, "{s}");
    assert_eq!((u(&s["unidentified"]), u(&s["no_answer"])), (0, 0), "{s}");
    // Fresh sessions were spread round-robin, and each then stayed put: the Secure cookie
    // was kept and sent back over TLS (without it every request would be a fresh one).
    let spread = s["spread"].as_object().expect("spread");
    assert!(spread.len() >= 2, "sessions spread over nodes: {s}");
    for session in r["sessions"].as_array().expect("sessions") {
        assert_eq!(
            session["nodes"].as_array().map(Vec::len),
            Some(1),
            "{session}"
        );
        assert_eq!(u(&session["upgrades"]), 1, "{session}");
    }
    // A cookie-less wss:// upgrade is pinned by its 101 (the cookie crossed TLS too).
    assert_eq!(r["fresh_upgrade"]["status"], 101, "{r}");
    assert_eq!(r["fresh_upgrade"]["cookie_set"], true, "{r}");

    running.stop().await;
    nodes.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_certificate_is_a_clear_tls_error() {
    let pki = Pki::new();
    let dir = TempDir::new("probe-tls-untrusted");
    let nodes = Nodes::start(&["a", "b"]).await;
    let running = limpet_https(&pki, &dir, &nodes).await;
    let url = format!("https://{}/", running.addr("https").expect("https addr"));

    // The test CA is in no system store: every handshake fails, nothing is judged.
    let run = probe(&[&url, "--ws", "/ws", "--sessions", "2", "--json"]).await;
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(!run.stderr.contains("panicked"), "{run:?}");
    let r = run.report();
    assert_eq!(r["outcome"], "unreachable", "{r}");
    assert_eq!(r["exit_code"], 2);
    let errors: Vec<&str> = r["errors"]
        .as_array()
        .expect("errors")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        !errors.is_empty()
            && errors
                .iter()
                .all(|e| e.contains("invalid peer certificate: UnknownIssuer")),
        "every failure names the certificate problem: {errors:?}"
    );
    // Human output says the same.
    let run = probe(&[&url, "--sessions", "1", "--requests", "0"]).await;
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(run.stdout.contains("UnknownIssuer"), "{run:?}");

    // `--insecure` (testing only) accepts the certificate unverified.
    let run = probe(&[
        &url,
        "--ws",
        "/ws",
        "--sessions",
        "2",
        "--insecure",
        "--json",
    ])
    .await;
    assert_eq!(run.code, Some(0), "{run:?}");
    assert_eq!(run.report()["outcome"], "kept");

    running.stop().await;
    nodes.stop().await;
}
