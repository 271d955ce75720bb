//! Active health checks against real loopback listeners, on paused tokio time: transitions
//! after `fall` failures and `rise` successes, HTTP status ranges, TLS handshakes, timeouts,
//! jitter bounds, and the detail kept for the admin API.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use limpet::health::{
    insecure_tls_config, CheckDetail, CheckKind, CheckSpec, HealthChecks, HealthSink, HttpCheck,
    StatusRange, TlsCheck,
};
use limpet_core::{CheckSlot, Observation, Pool, Transition};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

#[derive(Debug, Clone)]
struct Event {
    node: String,
    ok: bool,
    transition: Option<Transition>,
    detail: CheckDetail,
    at: Instant,
}

/// The real decision core behind the sink, as the runtime wires it.
struct PoolSink {
    pool: Mutex<Pool>,
    events: mpsc::UnboundedSender<Event>,
}

impl HealthSink for PoolSink {
    fn record(
        &self,
        node: &str,
        check: CheckSlot,
        ok: bool,
        _answered: bool,
        detail: &CheckDetail,
    ) -> Option<Transition> {
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        let id = pool.lookup(node.as_bytes())?;
        let obs = if ok {
            Observation::CheckPassed(check)
        } else {
            Observation::CheckFailed(check)
        };
        let t = pool.observe(id, obs, limpet::clock::now_ms());
        let _ = self.events.send(Event {
            node: node.to_owned(),
            ok,
            transition: t,
            detail: detail.clone(),
            at: Instant::now(),
        });
        t
    }

    fn forget(&self, node: &str, check: CheckSlot) {
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(id) = pool.lookup(node.as_bytes()) {
            pool.forget_check(id, check);
        }
    }
}

fn sink(nodes: &[&str], spec: &CheckSpec) -> (Arc<PoolSink>, mpsc::UnboundedReceiver<Event>) {
    let pool = Pool::new(nodes.iter().copied())
        .unwrap_or_else(|e| panic!("{e}"))
        .with_health_policy(spec.policy());
    let (tx, rx) = mpsc::unbounded_channel();
    (
        Arc::new(PoolSink {
            pool: Mutex::new(pool),
            events: tx,
        }),
        rx,
    )
}

async fn next(rx: &mut mpsc::UnboundedReceiver<Event>) -> Event {
    match rx.recv().await {
        Some(e) => e,
        None => panic!("check events ended"),
    }
}

/// Aborts the server task when dropped.
struct Server(JoinHandle<()>);

impl Drop for Server {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// An HTTP node that answers every request with the status held in `status`, and reports
/// each request head it read.
async fn http_node(
    status: Arc<AtomicU16>,
) -> (SocketAddr, Server, mpsc::UnboundedReceiver<String>) {
    http_node_requiring(status, Vec::new()).await
}

/// [`http_node`] that requires each connection to open with `first` (a PROXY header), as
/// nginx's `listen ... proxy_protocol` does: anything else first, and it closes.
async fn http_node_requiring(
    status: Arc<AtomicU16>,
    first: Vec<u8>,
) -> (SocketAddr, Server, mpsc::UnboundedReceiver<String>) {
    let l = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = l.local_addr().unwrap_or_else(|e| panic!("{e}"));
    let (tx, rx) = mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let status = Arc::clone(&status);
            let tx = tx.clone();
            let want = first.clone();
            tokio::spawn(async move {
                let mut got = vec![0u8; want.len()];
                if s.read_exact(&mut got).await.is_err() || got != want {
                    return;
                }
                let mut buf = Vec::new();
                let mut chunk = [0u8; 1024];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 16_384 {
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let _ = tx.send(String::from_utf8_lossy(&buf).into_owned());
                let code = status.load(Ordering::SeqCst);
                let resp =
                    format!("HTTP/1.1 {code} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
                let _ = s.write_all(resp.as_bytes()).await;
            });
        }
    });
    (addr, Server(task), rx)
}

fn spec(kind: CheckKind, addr: SocketAddr) -> CheckSpec {
    let mut s = CheckSpec::new(kind, addr);
    s.jitter = Duration::ZERO;
    s
}

#[tokio::test(start_paused = true)]
async fn defaults_are_haproxys() {
    let s = CheckSpec::new(
        CheckKind::Tcp,
        "127.0.0.1:1".parse().unwrap_or_else(|e| panic!("{e}")),
    );
    assert_eq!(s.interval, Duration::from_secs(2));
    assert_eq!((s.fall, s.rise), (3, 2));
    assert_eq!(s.timeout, Duration::from_secs(2));
    assert_eq!(s.jitter, Duration::from_millis(200));
}

#[tokio::test(start_paused = true)]
async fn tcp_check_goes_down_after_fall_failures_and_up_after_rise_successes() {
    let l = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = l.local_addr().unwrap_or_else(|e| panic!("{e}"));
    let spec = spec(CheckKind::Tcp, addr);
    let (sink, mut rx) = sink(&["a"], &spec);
    let mut checks = HealthChecks::with_seed(1);
    checks.update(vec![("a".into(), spec)], sink.clone());

    // Accepting: every check passes, no transition.
    for _ in 0..2 {
        let accept = l.accept();
        let (e, _) = tokio::join!(next(&mut rx), accept);
        assert!(e.ok, "{e:?}");
        assert_eq!(e.transition, None);
    }
    // Listener gone: connections are refused; the third failure takes the node down.
    drop(l);
    let mut times = Vec::new();
    for i in 1..=3 {
        let e = next(&mut rx).await;
        assert!(!e.ok);
        assert!(
            e.detail
                .error
                .as_deref()
                .unwrap_or("")
                .starts_with("connect:"),
            "{e:?}"
        );
        assert_eq!(
            e.transition,
            (i == 3).then_some(Transition::WentDown),
            "failure {i}"
        );
        times.push(e.at);
    }
    // One interval apart, exactly (no jitter).
    assert_eq!(times[1] - times[0], Duration::from_secs(2));
    assert_eq!(times[2] - times[1], Duration::from_secs(2));
    {
        let pool = sink.pool.lock().unwrap_or_else(|e| e.into_inner());
        assert_eq!(pool.eligible(), &[] as &[limpet_core::NodeId]);
    }
    let board = checks.board().node("a");
    assert_eq!(board.len(), 1);
    assert_eq!(board[0].consecutive_failures, 3);
    assert_eq!(board[0].transitions, 1);

    // Back: two passes bring it up.
    let l = TcpListener::bind(addr)
        .await
        .unwrap_or_else(|e| panic!("rebind {addr}: {e}"));
    let _acceptor = Server(tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            drop(s);
        }
    }));
    let e1 = next(&mut rx).await;
    assert!(e1.ok && e1.transition.is_none(), "{e1:?}");
    let e2 = next(&mut rx).await;
    assert_eq!(e2.transition, Some(Transition::WentUp));
    let board = checks.board().node("a");
    assert_eq!(board[0].consecutive_successes, 2);
    assert_eq!(board[0].transitions, 2);
    assert!(
        board[0]
            .last_error
            .as_deref()
            .unwrap_or("")
            .starts_with("connect:"),
        "the last error is kept after recovery"
    );
    assert_eq!(board[0].checks, 7);
    assert_eq!(board[0].failures, 3);
}

#[tokio::test(start_paused = true)]
async fn http_check_accepts_only_the_expected_status_range() {
    let status = Arc::new(AtomicU16::new(503));
    let (addr, _server, mut heads) = http_node(Arc::clone(&status)).await;
    let mut s = spec(
        CheckKind::Http(HttpCheck {
            method: http::Method::HEAD,
            path: "/healthz?deep=1".into(),
            host: Some("svc.example".into()),
            expect: "200-204".parse().unwrap_or_else(|e: String| panic!("{e}")),
            tls: None,
        }),
        addr,
    );
    s.fall = 2;
    s.rise = 1;
    let (sink, mut rx) = sink(&["a"], &s);
    let _checks = {
        let mut c = HealthChecks::with_seed(2);
        c.update(vec![("a".into(), s)], sink);
        c
    };

    let e = next(&mut rx).await;
    assert!(!e.ok);
    assert_eq!(e.detail.status, Some(503));
    assert_eq!(e.detail.error.as_deref(), Some("status 503 not in 200-204"));
    let head = heads.recv().await.unwrap_or_default();
    assert!(
        head.starts_with("HEAD /healthz?deep=1 HTTP/1.1\r\n"),
        "{head}"
    );
    assert!(
        head.to_ascii_lowercase().contains("host: svc.example\r\n"),
        "{head}"
    );
    assert_eq!(next(&mut rx).await.transition, Some(Transition::WentDown));

    // A redirect is outside 200-204 too.
    status.store(302, Ordering::SeqCst);
    let e = next(&mut rx).await;
    assert!(!e.ok && e.detail.status == Some(302), "{e:?}");

    status.store(204, Ordering::SeqCst);
    let e = next(&mut rx).await;
    assert!(e.ok, "{e:?}");
    assert_eq!(e.detail.status, Some(204));
    assert_eq!(e.transition, Some(Transition::WentUp));
}

#[test]
fn status_ranges_parse() {
    let r: StatusRange = "200-399".parse().unwrap_or_else(|e: String| panic!("{e}"));
    assert!(r.contains(200) && r.contains(399) && !r.contains(400) && !r.contains(199));
    assert_eq!(r, StatusRange::default());
    let one: StatusRange = "204".parse().unwrap_or_else(|e: String| panic!("{e}"));
    assert!(one.contains(204) && !one.contains(200));
    assert_eq!(one.to_string(), "204");
    for bad in ["", "abc", "399-200", "99", "600", "200-"] {
        assert!(bad.parse::<StatusRange>().is_err(), "{bad:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_node_that_never_answers_fails_by_timeout() {
    // Accepts, reads, never answers.
    let l = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = l.local_addr().unwrap_or_else(|e| panic!("{e}"));
    let _server = Server(tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = l.accept().await {
            held.push(s);
        }
    }));
    let mut s = spec(CheckKind::Http(HttpCheck::default()), addr);
    s.timeout = Duration::from_millis(500);
    let (sink, mut rx) = sink(&["a"], &s);
    let mut checks = HealthChecks::with_seed(3);
    checks.update(vec![("a".into(), s)], sink);
    let e = next(&mut rx).await;
    assert!(!e.ok);
    assert_eq!(e.detail.error.as_deref(), Some("timeout after 500 ms"));
    assert_eq!(e.detail.duration_ms, 500);
}

#[tokio::test(start_paused = true)]
async fn jitter_keeps_checks_apart_and_within_bounds() {
    let l = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = l.local_addr().unwrap_or_else(|e| panic!("{e}"));
    let _acceptor = Server(tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            drop(s);
        }
    }));
    let mut s = CheckSpec::new(CheckKind::Tcp, addr);
    s.interval = Duration::from_secs(1);
    s.jitter = Duration::from_millis(200);
    let nodes = ["a", "b", "c", "d"];
    let (sink, mut rx) = sink(&nodes, &s);
    let start = Instant::now();
    let mut checks = HealthChecks::with_seed(4);
    checks.update(
        nodes.iter().map(|n| ((*n).to_owned(), s.clone())).collect(),
        sink,
    );
    let mut per_node: std::collections::BTreeMap<String, Vec<Duration>> = Default::default();
    for _ in 0..(nodes.len() * 20) {
        let e = next(&mut rx).await;
        assert!(e.ok, "{e:?}");
        per_node.entry(e.node).or_default().push(e.at - start);
    }
    let mut firsts = Vec::new();
    let mut gaps = Vec::new();
    for (node, times) in &per_node {
        assert!(times.len() >= 15, "{node}: {times:?}");
        assert!(
            times[0] < Duration::from_secs(1),
            "{node}: first at {:?}",
            times[0]
        );
        firsts.push(times[0]);
        for w in times.windows(2) {
            let gap = w[1] - w[0];
            assert!(
                (Duration::from_millis(800)..=Duration::from_millis(1200)).contains(&gap),
                "{node}: gap {gap:?}"
            );
            gaps.push(gap);
        }
    }
    firsts.sort();
    firsts.dedup();
    assert_eq!(
        firsts.len(),
        nodes.len(),
        "first checks are spread: {firsts:?}"
    );
    gaps.sort();
    gaps.dedup();
    assert!(gaps.len() > 10, "gaps vary: {gaps:?}");
}

fn self_signed() -> (
    rustls_pki_types::CertificateDer<'static>,
    Arc<rustls::ServerConfig>,
) {
    let ck = rcgen::generate_simple_self_signed(vec!["node.test".to_owned()])
        .unwrap_or_else(|e| panic!("{e}"));
    let cert = ck.cert.der().clone();
    let key = rustls_pki_types::PrivatePkcs8KeyDer::from(ck.key_pair.serialize_der());
    let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap_or_else(|e| panic!("{e}"))
    .with_no_client_auth()
    .with_single_cert(vec![cert.clone()], key.into())
    .unwrap_or_else(|e| panic!("{e}"));
    (cert, Arc::new(cfg))
}

#[tokio::test(start_paused = true)]
async fn tls_check_needs_a_completed_handshake() {
    let (cert, server_cfg) = self_signed();
    let l = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = l.local_addr().unwrap_or_else(|e| panic!("{e}"));
    let acceptor = tokio_rustls::TlsAcceptor::from(server_cfg);
    let _server = Server(tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let _ = acceptor.accept(s).await;
            });
        }
    }));
    let name = rustls_pki_types::ServerName::try_from("node.test")
        .unwrap_or_else(|e| panic!("{e}"))
        .to_owned();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert).unwrap_or_else(|e| panic!("{e}"));
    let verified = Arc::new(
        rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .unwrap_or_else(|e| panic!("{e}"))
            .with_root_certificates(roots)
            .with_no_client_auth(),
    );
    let strangers = Arc::new(
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap_or_else(|e| panic!("{e}"))
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth(),
    );
    let insecure = insecure_tls_config().unwrap_or_else(|e| panic!("{e}"));
    for (config, want_ok) in [(verified, true), (insecure, true), (strangers, false)] {
        let s = spec(
            CheckKind::Tls(TlsCheck {
                server_name: name.clone(),
                config,
                trust: String::new(),
            }),
            addr,
        );
        let detail = limpet::health::probe(&s.kind, s.addr, s.timeout, None).await;
        assert_eq!(detail.ok, want_ok, "{detail:?}");
        assert_eq!(detail.kind, "tls");
        if !want_ok {
            assert!(
                detail.error.as_deref().unwrap_or("").starts_with("tls:"),
                "{detail:?}"
            );
        }
    }
    // Plain TCP where TLS is expected fails too.
    let (plain, _srv, _heads) = http_node(Arc::new(AtomicU16::new(200))).await;
    let s = spec(
        CheckKind::Tls(TlsCheck {
            server_name: name,
            config: insecure_tls_config().unwrap_or_else(|e| panic!("{e}")),
            trust: "none".to_owned(),
        }),
        plain,
    );
    assert!(
        !limpet::health::probe(&s.kind, s.addr, s.timeout, None)
            .await
            .ok
    );
}

#[tokio::test(start_paused = true)]
async fn update_keeps_unchanged_checks_and_stops_removed_ones() {
    let l = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = l.local_addr().unwrap_or_else(|e| panic!("{e}"));
    let _acceptor = Server(tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            drop(s);
        }
    }));
    let s = spec(CheckKind::Tcp, addr);
    let (sink, mut rx) = sink(&["a", "b"], &s);
    let mut checks = HealthChecks::with_seed(5);
    checks.update(
        vec![("a".into(), s.clone()), ("b".into(), s.clone())],
        sink.clone(),
    );
    let mut seen = std::collections::BTreeSet::new();
    while seen.len() < 2 {
        seen.insert(next(&mut rx).await.node);
    }
    let a_checks = checks.board().node("a")[0].checks;
    assert!(a_checks >= 1);
    // Reload: "a" unchanged, "b" removed.
    checks.update(vec![("a".into(), s)], sink);
    assert_eq!(checks.len(), 1);
    assert!(checks.board().node("b").is_empty());
    assert!(
        checks.board().node("a")[0].checks >= a_checks,
        "history kept"
    );
    for _ in 0..4 {
        assert_eq!(next(&mut rx).await.node, "a");
    }
    drop(checks);
    // Every task stopped: the channel's senders (held by the sink in the tasks) remain only in
    // this test's `sink` clones, so nothing more arrives.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(rx.try_recv().is_err());
}

/// Node `a`'s two checks: an HTTP check of a port that answers 200 (its server, kept alive
/// while the returned handle is), and a TCP check of a port nothing listens on.
async fn web_and_dead_raw() -> (Server, CheckSpec, CheckSpec) {
    let (web, server, _heads) = http_node(Arc::new(AtomicU16::new(200))).await;
    let raw = {
        let l = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        l.local_addr().unwrap_or_else(|e| panic!("{e}"))
    };
    (
        server,
        spec(CheckKind::Http(HttpCheck::default()), web),
        spec(CheckKind::Tcp, raw),
    )
}

/// A node checked on two ports, its HTTP port answering and its raw TCP port dead (a print
/// server whose print service stopped while its web pages still load): the node goes DOWN on
/// the dead port's `fall`-th failure although the HTTP check passes in between (each pass
/// used to reset the count, so the node stayed UP for ever), and stays DOWN while the HTTP
/// check keeps passing. A reload that removes the failing check lets the node come back on
/// the checks left, in `rise` passes.
#[tokio::test(start_paused = true)]
async fn a_node_with_one_dead_port_goes_down_whatever_its_other_checks_say() {
    let (_server, web_check, raw_check) = web_and_dead_raw().await;
    let (sink, mut rx) = sink(&["a"], &web_check);
    let mut checks = HealthChecks::with_seed(1);
    checks.update(
        vec![("a".into(), web_check.clone()), ("a".into(), raw_check)],
        sink.clone(),
    );

    let (mut raw_failures, mut web_passes) = (0, 0);
    loop {
        let e = next(&mut rx).await;
        if e.detail.kind == "tcp" {
            assert!(!e.ok, "{e:?}");
            raw_failures += 1;
        } else {
            assert!(e.ok, "{e:?}");
            web_passes += 1;
        }
        if e.transition == Some(Transition::WentDown) {
            break;
        }
        assert!(
            raw_failures < 3,
            "the third failure of the raw port takes the node down"
        );
    }
    assert_eq!(raw_failures, 3);
    assert!(
        web_passes >= 2,
        "the web check passed in between: {web_passes}"
    );
    for _ in 0..20 {
        let e = next(&mut rx).await;
        assert_eq!(e.transition, None, "DOWN while its raw port is dead: {e:?}");
    }
    {
        let pool = sink.pool.lock().unwrap_or_else(|e| e.into_inner());
        assert_eq!(pool.eligible(), &[] as &[limpet_core::NodeId]);
    }

    // The reload: only the web check is left.
    checks.update(vec![("a".into(), web_check)], sink.clone());
    let mut passes = 0;
    loop {
        let e = next(&mut rx).await;
        if e.detail.kind == "tcp" {
            continue; // a result sent before the reload, still queued
        }
        assert!(e.ok, "{e:?}");
        passes += 1;
        if e.transition == Some(Transition::WentUp) {
            break;
        }
        assert!(passes < 2, "up on the second pass");
    }
    assert_eq!(passes, 2);
}

/// Two listeners checking one node's port with different HTTP requests (`/health`, and
/// `/deep` expecting 204) get both checks run and shown; a third listener asking for the
/// same check as the first shares it. Checks were told apart by kind and address only, so
/// the second replaced the first without a word (chaos run 25).
#[tokio::test(start_paused = true)]
async fn http_checks_that_ask_different_things_of_one_port_both_run() {
    let (addr, _server, mut heads) = http_node(Arc::new(AtomicU16::new(200))).await;
    let health = spec(
        CheckKind::Http(HttpCheck {
            path: "/health".into(),
            ..HttpCheck::default()
        }),
        addr,
    );
    let deep = spec(
        CheckKind::Http(HttpCheck {
            path: "/deep".into(),
            expect: "204".parse().unwrap_or_else(|e: String| panic!("{e}")),
            ..HttpCheck::default()
        }),
        addr,
    );
    let (sink, _rx) = sink(&["a"], &health);
    let mut checks = HealthChecks::with_seed(3);
    checks.update(
        vec![
            ("a".into(), health.clone()),
            ("a".into(), deep),
            ("a".into(), health),
        ],
        sink,
    );
    assert_eq!(checks.len(), 2, "the same check twice runs once");
    let mut labels: Vec<String> = checks
        .board()
        .node("a")
        .iter()
        .map(|c| c.check.clone())
        .collect();
    labels.sort();
    assert_eq!(
        labels,
        [
            format!("http {addr} GET /deep expect 204"),
            format!("http {addr} GET /health"),
        ]
    );
    let mut asked = std::collections::BTreeSet::new();
    for _ in 0..10 {
        let head = heads.recv().await.unwrap_or_default();
        asked.insert(head.lines().next().unwrap_or("").to_owned());
        if asked.len() == 2 {
            break;
        }
    }
    assert_eq!(
        asked.into_iter().collect::<Vec<_>>(),
        ["GET /deep HTTP/1.1", "GET /health HTTP/1.1"]
    );
}

/// A reload that retimes a failing check (its settings change, what it asks does not) keeps
/// the check's last failure until the restarted check reports: the node, DOWN for its dead
/// raw port, does not come up on its web check's passes meanwhile (it did when the restarted
/// check was forgotten, here with the raw check's first result a minute off).
#[tokio::test(start_paused = true)]
async fn a_retimed_failing_check_keeps_the_node_down() {
    let (_server, web_check, raw_check) = web_and_dead_raw().await;
    let (sink, mut rx) = sink(&["a"], &web_check);
    let mut checks = HealthChecks::with_seed(2);
    checks.update(
        vec![
            ("a".into(), web_check.clone()),
            ("a".into(), raw_check.clone()),
        ],
        sink.clone(),
    );
    loop {
        if next(&mut rx).await.transition == Some(Transition::WentDown) {
            break;
        }
    }
    let mut slow_raw = raw_check;
    slow_raw.interval = Duration::from_secs(60);
    slow_raw.timeout = Duration::from_secs(1);
    checks.update(
        vec![("a".into(), web_check), ("a".into(), slow_raw)],
        sink.clone(),
    );
    let mut web_passes = 0;
    while web_passes < 5 {
        let e = next(&mut rx).await;
        assert_eq!(e.transition, None, "still DOWN: {e:?}");
        if e.detail.kind == "http" {
            web_passes += 1;
        }
    }
    let pool = sink.pool.lock().unwrap_or_else(|e| e.into_inner());
    assert_eq!(pool.eligible(), &[] as &[limpet_core::NodeId]);
}

/// A check whose connection opens with a PROXY header (its listener sends one to the node
/// port it probes) writes it first, v1 `UNKNOWN` or v2 `LOCAL`, then its request or
/// handshake: a node that requires the header, as nginx's `listen ... proxy_protocol` does,
/// passes it. Before, the request came first, the node closed the connection, and every
/// check failed: the node DOWN for good.
#[tokio::test(start_paused = true)]
async fn a_check_sends_the_proxy_header_its_listener_sends_first() {
    use limpet_core::proxy_protocol::{self, Version};
    for version in [Version::V1, Version::V2] {
        let mut header = Vec::new();
        proxy_protocol::write_local(version, &mut header);
        let (addr, _server, mut heads) =
            http_node_requiring(Arc::new(AtomicU16::new(200)), header).await;
        let mut s = spec(CheckKind::Http(HttpCheck::default()), addr);
        s.proxy = Some(version);
        s.fall = 1;
        let (sink, mut rx) = sink(&["a"], &s);
        let _checks = {
            let mut c = HealthChecks::with_seed(3);
            c.update(vec![("a".into(), s)], sink);
            c
        };
        for _ in 0..3 {
            let e = next(&mut rx).await;
            assert!(e.ok, "{version:?}: {e:?}");
            assert_eq!(e.detail.status, Some(200));
            let head = heads.recv().await.unwrap_or_default();
            assert!(head.starts_with("GET / HTTP/1.1\r\n"), "{head}");
        }
    }
}
