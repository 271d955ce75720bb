//! Fleet mode (issue 10): two limpet instances in this process share their source-IP and
//! application-cookie tables through a real `redis-server` the test starts on a free
//! loopback port (and kills by PID). Each instance has an HTTP and a TCP listener on the
//! source-IP table and an HTTP listener on the application-cookie table.

mod common;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use common::multiport::{
    config, connect_from, get_with, start_nodes, tcp_session, Pki, TempDir, TestNode,
};
use common::store_server::Redis;
use common::PATIENCE;
use limpet::runtime::{start, Running};
use limpet_core::table::{IpPrefix, KeyRef};
use limpet_core::AdminState;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const NODES: [(&str, &str); 3] = [
    ("LVIV", "127.0.0.2"),
    ("KYIV", "127.0.0.3"),
    ("ODESA", "127.0.0.4"),
];

/// Lines of settings added to an instance's config.
#[derive(Debug, Clone, Copy, Default)]
struct Extra<'a> {
    /// On its TCP listener.
    raw: &'a str,
    /// On its source-IP table (`terminal`).
    terminal: &'a str,
}

/// One limpet instance of the fleet.
struct Instance {
    running: Running,
    _dir: TempDir,
}

impl Instance {
    async fn start_with(
        tag: &str,
        redis: &Redis,
        http: u16,
        tcp: u16,
        node_order: &[usize],
        expire: &str,
        timeout: &str,
    ) -> Instance {
        Instance::start_at(tag, &redis.url(), http, tcp, node_order, expire, timeout).await
    }

    /// An instance whose store is at `url`.
    async fn start_at(
        tag: &str,
        url: &str,
        http: u16,
        tcp: u16,
        node_order: &[usize],
        expire: &str,
        timeout: &str,
    ) -> Instance {
        let extra = Extra::default();
        Instance::start_raw(tag, url, (http, tcp), node_order, expire, timeout, extra).await
    }

    /// [`Instance::start_at`] with `extra` settings.
    async fn start_raw(
        tag: &str,
        url: &str,
        (http, tcp): (u16, u16),
        node_order: &[usize],
        expire: &str,
        timeout: &str,
        extra: Extra<'_>,
    ) -> Instance {
        let dir = TempDir::new(tag);
        let mut text = String::new();
        for &i in node_order {
            let (n, ip) = NODES[i];
            text.push_str(&format!("[[nodes]]\nname = \"{n}\"\naddress = \"{ip}\"\n"));
        }
        text.push_str(&format!(
            r#"
[admin]
listen = "127.0.0.1:0"

[store]
url = "{url}"
timeout = "{timeout}"

[[tables]]
name = "terminal"
key = "source-ip"
expire = "{expire}"
shared = true
{terminal_extra}

[[tables]]
name = "sessions"
app_cookie = "JSESSIONID"
expire = "10m"
shared = true

[[listeners]]
name = "web"
bind = "127.0.0.1:0"
node_port = {http}
table = "terminal"

[[listeners]]
name = "raw"
bind = "127.0.0.1:0"
mode = "tcp"
node_port = {tcp}
table = "terminal"
{raw_extra}

[[listeners]]
name = "app"
bind = "127.0.0.1:0"
node_port = {http}
table = "sessions"
"#,
            url = url,
            terminal_extra = extra.terminal,
            raw_extra = extra.raw,
        ));
        let cfg = config(&dir, &text);
        let running = start(cfg).await.expect("start");
        Instance { running, _dir: dir }
    }

    fn addr(&self, l: &str) -> SocketAddr {
        self.running.addr(l).expect("listener")
    }

    /// The node that answers `GET /` from `src` through the HTTP listener: a 200 from a
    /// configured node, or the test fails (a 503's body is not a node's name).
    async fn http(&self, src: &str) -> String {
        let s = connect_from(src.parse().expect("ip"), self.addr("web")).await;
        let (head, node) = get_with(s, "").await;
        assert!(head.starts_with("HTTP/1.1 200"), "{src}: {head}");
        assert!(NODES.iter().any(|(n, _)| *n == node), "{src}: {node:?}");
        node
    }

    /// The node a TCP session from `src` reaches through the TCP listener (a configured
    /// node, or the test fails).
    async fn tcp(&self, src: &str) -> String {
        let node = tcp_session(src, self.addr("raw")).await.1;
        assert!(NODES.iter().any(|(n, _)| *n == node), "{src}: {node:?}");
        node
    }

    /// The local pin of a source address (what this instance answers from).
    fn pin(&self, src: &str) -> Option<String> {
        let state = self.running.runtime().state();
        let t = state.table("terminal")?;
        let ip: IpAddr = src.parse().ok()?;
        let g = t.lock();
        let r = g
            .store()
            .peek(KeyRef::ip(ip, IpPrefix::HOST), limpet::clock::now_ms())?;
        g.store().names().name(r).map(str::to_owned)
    }

    fn store_up(&self) -> bool {
        self.running
            .runtime()
            .state()
            .store()
            .is_some_and(|s| s.is_up())
    }

    /// GET `path` on the admin listener: the body.
    async fn admin(&self, path: &str) -> String {
        let admin = self
            .running
            .runtime()
            .state()
            .lifecycle
            .admin_addr()
            .expect("admin");
        reqwest::Client::builder()
            .no_proxy()
            .timeout(PATIENCE)
            .build()
            .expect("client")
            .get(format!("http://{admin}{path}"))
            .send()
            .await
            .expect("admin answers")
            .text()
            .await
            .expect("body")
    }

    /// Waits (bounded) until the store's start is over: the subscription made and the resync
    /// it triggers done, so what the test does next is not published by that resync.
    async fn settled(&self) {
        until("the store's start resync is done", async || {
            let st = self.status();
            st.up && st.connections >= 2 && !st.resync_pending && st.resyncs >= 1
        })
        .await;
    }

    fn status(&self) -> limpet::store::StoreStatus {
        self.running
            .runtime()
            .state()
            .store()
            .map(|s| s.status())
            .expect("store")
    }
}

/// Waits (bounded) until `cond` holds; `what` names the event in the failure.
async fn until(what: &str, mut cond: impl AsyncFnMut() -> bool) {
    tokio::time::timeout(PATIENCE, async {
        while !cond().await {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting for: {what}"));
}

/// Two instances. The store timeout is ten times the default: on a loaded CI machine a
/// loopback round trip past 50 ms would open the breaker and turn a test of the fleet into
/// one of its fallback.
async fn fleet(tag: &str) -> (Redis, Vec<TestNode>, Instance, Instance) {
    fleet_with(tag, "500ms").await
}

/// Two instances with this store `timeout`.
async fn fleet_with(tag: &str, timeout: &str) -> (Redis, Vec<TestNode>, Instance, Instance) {
    let pki = Pki::new();
    let (nodes, ports) = start_nodes(&NODES, pki.server("n", &["127.0.0.2"])).await;
    let redis = Redis::start().await;
    let a = Instance::start_with(
        &format!("{tag}-a"),
        &redis,
        ports.http,
        ports.tcp,
        &[0, 1, 2],
        "10m",
        timeout,
    )
    .await;
    // The other instance lists its nodes in another order (its rotation differs), so fresh
    // assignments of the two disagree unless the store makes them agree.
    let b = Instance::start_with(
        &format!("{tag}-b"),
        &redis,
        ports.http,
        ports.tcp,
        &[2, 0, 1],
        "10m",
        timeout,
    )
    .await;
    assert!(
        a.store_up() && b.store_up(),
        "both instances reach the store"
    );
    (redis, nodes, a, b)
}

/// `src`'s first request through `inst`; returns its node once the pin is in the store.
async fn pin_in_store(inst: &Instance, redis: &Redis, src: &str) -> String {
    let n = inst.http(src).await;
    let key = format!("limpet:terminal:ip:{src}");
    until("the pin reaches the store", async || {
        redis.get(&key).await.is_some()
    })
    .await;
    n
}

/// Sends new clients (`{net}.1`, `.2`, ...) through `inst` until its breaker opens: each
/// first request asks the store, and with the store away (gone or hung) the failed round
/// trips open it. Every client is answered meanwhile.
async fn breaker_opened_by_new_clients(inst: &Instance, net: &str) {
    let mut n = 0;
    until("the instance marks the store down", async || {
        n += 1;
        assert!(n <= 50, "50 new clients and the store still up");
        // Served by a configured node (`http` asserts the 200 and the node).
        inst.http(&format!("{net}.{n}")).await;
        !inst.store_up()
    })
    .await;
}

async fn stop(redis: Redis, mut nodes: Vec<TestNode>, a: Instance, b: Instance) {
    a.running.stop().await;
    b.running.stop().await;
    for n in &mut nodes {
        n.kill().await;
    }
    drop(redis);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_alternating_instances_and_ports_stays_on_one_node() {
    let (redis, nodes, a, b) = fleet("alternate").await;
    for i in 0..6 {
        let src = format!("127.0.1.{}", 10 + i);
        // Alternate which instance and which protocol sees the client first.
        let first = if i % 2 == 0 {
            a.http(&src).await
        } else {
            b.tcp(&src).await
        };
        let key = format!("limpet:terminal:ip:{src}");
        until("the first pin reaches the store", async || {
            redis.get(&key).await.is_some()
        })
        .await;
        assert_eq!(redis.get(&key).await.as_deref(), Some(first.as_str()));
        for round in 0..3 {
            assert_eq!(b.http(&src).await, first, "{src} via B http, round {round}");
            assert_eq!(a.tcp(&src).await, first, "{src} via A tcp, round {round}");
            assert_eq!(b.tcp(&src).await, first, "{src} via B tcp, round {round}");
            assert_eq!(a.http(&src).await, first, "{src} via A http, round {round}");
        }
    }
    // The application's session cookie: learned from the node's answer through A, found
    // through B.
    let app_a = a.addr("app");
    let app_b = b.addr("app");
    let (head, node) = get_with(
        connect_from("127.0.1.99".parse().expect("ip"), app_a).await,
        "",
    )
    .await;
    assert!(head.contains(&format!("JSESSIONID=sess-{node}")), "{head}");
    let key = format!("limpet:sessions:b:sess-{node}");
    until("the learned session reaches the store", async || {
        redis.get(&key).await.is_some()
    })
    .await;
    let cookie = format!("Cookie: JSESSIONID=sess-{node}\r\n");
    for src in ["127.0.2.1", "127.0.2.2", "127.0.2.3"] {
        let (_, got) = get_with(connect_from(src.parse().expect("ip"), app_b).await, &cookie).await;
        assert_eq!(got, node, "session cookie through B from {src}");
    }
    let st = b.status();
    assert!(st.get_hits >= 1, "B answered from the store: {st:?}");
    stop(redis, nodes, a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_requests_through_both_instances_agree() {
    // A store timeout long enough to wait out the write pause below.
    let (redis, nodes, a, b) = fleet_with("race", "2s").await;
    let srcs: Vec<String> = (0..16).map(|i| format!("127.0.3.{}", 10 + i)).collect();
    // Make the race certain: the store answers reads but holds writes for a moment, so both
    // instances find no pin, route fresh (their rotations differ) and send their
    // create-if-absent writes before either lands; the store then runs them one after the
    // other, and one of each pair loses.
    let mut c = redis.conn().await.expect("connect");
    redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(600)
        .arg("WRITE")
        .query_async::<()>(&mut c)
        .await
        .expect("CLIENT PAUSE");
    let mut disagreed = 0;
    for src in &srcs {
        let (x, y) = tokio::join!(a.http(src), b.http(src));
        if x != y {
            disagreed += 1;
        }
    }
    assert!(
        disagreed > 0,
        "no first answers disagreed: the test did not race"
    );
    // The pin converges: both local tables and the store name one node per client...
    for src in &srcs {
        let key = format!("limpet:terminal:ip:{src}");
        until(&format!("{src} converges"), async || {
            let stored = redis.get(&key).await;
            stored.is_some() && a.pin(src) == stored && b.pin(src) == stored
        })
        .await;
    }
    // ...and every later request agrees, through either instance and either protocol.
    for src in &srcs {
        let n = a.http(src).await;
        assert_eq!(b.http(src).await, n, "{src}");
        assert_eq!(a.tcp(src).await, n, "{src}");
        assert_eq!(b.tcp(src).await, n, "{src}");
    }
    let adopted = a.status().adopted + b.status().adopted;
    assert!(
        adopted > 0,
        "an instance that lost the race adopted the winner's node"
    );
    stop(redis, nodes, a, b).await;
}

/// A key an instance cannot store (its table full of entries open sessions hold) is served
/// unpinned there and not published: the fleet is not told of a pin that instance does not
/// follow (it would balance the key's next request afresh, and the other instances would
/// follow the published node). The store's writes go out in order, so once a later pin is
/// in the store, the refused one would be too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pin_a_table_full_of_held_entries_refuses_is_not_published() {
    use limpet_core::table::AffinityStore as _;
    let (redis, nodes, a, b) = fleet("refused").await;
    a.settled().await;
    let held_ip: IpAddr = "127.0.9.1".parse().expect("ip");
    let held = KeyRef::ip(held_ip, IpPrefix::HOST);
    let table = a
        .running
        .runtime()
        .state()
        .table("terminal")
        .cloned()
        .expect("table");
    {
        let mut g = table.lock();
        let s = g.store_mut();
        let now = limpet::clock::now_ms();
        s.reconfigure(1, 600_000, now).expect("size 1");
        let node = s.intern("a").expect("name");
        s.put(held, node, now);
        s.hold(held);
    }
    a.http("127.0.9.2").await; // served: a 200 from a configured node
    assert_eq!(a.pin("127.0.9.2"), None, "unpinned here");
    assert_eq!(table.lock().store().stats().refused, 1);
    table.lock().store_mut().release(held);
    pin_in_store(&a, &redis, "127.0.9.3").await;
    assert_eq!(
        redis.get("limpet:terminal:ip:127.0.9.2").await,
        None,
        "the refused pin was published"
    );
    stop(redis, nodes, a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_in_maint_on_one_instance_re_pins_the_client_for_both() {
    let (redis, nodes, a, b) = fleet("maint").await;
    let src = "127.0.4.10";
    let first = a.http(src).await;
    let key = format!("limpet:terminal:ip:{src}");
    until("the pin reaches the store", async || {
        redis.get(&key).await.is_some()
    })
    .await;
    assert_eq!(b.http(src).await, first);
    // Node state is per instance: MAINT on A only.
    a.running
        .runtime()
        .state()
        .set_admin(&first, AdminState::Maint)
        .expect("node");
    let moved = a.http(src).await;
    assert_ne!(moved, first, "A re-pins the client off the MAINT node");
    // The overwrite reaches B (published re-pin), which follows although the node is UP
    // there.
    until("B's local pin follows the re-pin", async || {
        b.pin(src).as_deref() == Some(moved.as_str())
    })
    .await;
    assert_eq!(redis.get(&key).await.as_deref(), Some(moved.as_str()));
    assert_eq!(b.http(src).await, moved);
    assert_eq!(b.tcp(src).await, moved);
    assert!(b.status().invalidations >= 1);
    stop(redis, nodes, a, b).await;
}

/// A session split across the fleet, its HTTP through one instance and its TCP session
/// through the other: when the first re-pins it (its node in MAINT there), the second's TCP
/// session on the old node, still UP there, ends as the re-pin reaches it, and the client
/// reconnects to the node its HTTP requests now go to. One session, one node, fleet-wide.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_pin_by_one_instance_ends_the_session_s_tcp_session_through_the_other() {
    let (redis, nodes, a, b) = fleet("fleet-move").await;
    let src = "127.0.4.20";
    let first = pin_in_store(&a, &redis, src).await;
    let (mut session, on) = tcp_session(src, b.addr("raw")).await;
    assert_eq!(on, first, "B's TCP session follows the fleet's pin");
    a.running
        .runtime()
        .state()
        .set_admin(&first, AdminState::Maint)
        .expect("node");
    let moved = a.http(src).await;
    assert_ne!(moved, first, "A re-pins the client off the MAINT node");
    let mut buf = [0u8; 64];
    let ended = tokio::time::timeout(PATIENCE, async {
        loop {
            match session.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => continue,
            }
        }
    })
    .await;
    assert!(
        ended.is_ok(),
        "B's TCP session on {first} (UP on B) outlived the fleet's re-pin"
    );
    assert_eq!(b.pin(src).as_deref(), Some(moved.as_str()));
    assert_eq!(b.tcp(src).await, moved);
    stop(redis, nodes, a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_store_under_load_fails_no_request_and_a_restart_converges() {
    let (mut redis, nodes, a, b) = fleet("kill").await;
    let port = redis.port;
    let srcs: Vec<String> = (0..8).map(|i| format!("127.0.5.{}", 10 + i)).collect();
    let mut pinned = Vec::new();
    for src in &srcs {
        pinned.push(pin_in_store(&a, &redis, src).await);
    }
    // Bounded load through both instances and both protocols; the store dies a third of the
    // way in. Every request must be answered by the client's node.
    let started = tokio::time::Instant::now();
    let mut answered = 0;
    for i in 0..240usize {
        if i == 80 {
            redis.kill();
        }
        let k = i % srcs.len();
        let got = match i % 4 {
            0 => a.http(&srcs[k]).await,
            1 => b.http(&srcs[k]).await,
            2 => a.tcp(&srcs[k]).await,
            _ => b.tcp(&srcs[k]).await,
        };
        assert_eq!(got, pinned[k], "request {i} from {}", srcs[k]);
        answered += 1;
        // Now and then a client never seen before (its first request asks the store, which
        // may be dead): answered all the same.
        if i % 20 == 5 {
            let src = format!("127.0.8.{}", i / 20 + 10);
            let inst = if i % 40 == 5 { &a } else { &b };
            inst.http(&src).await; // a 200 from a configured node
            answered += 1;
        }
        assert!(started.elapsed() < PATIENCE, "load loop too slow");
    }
    assert_eq!(answered, 252);
    until("both instances mark the store down", async || {
        !a.store_up() && !b.store_up()
    })
    .await;
    // New clients while the store is away: pinned locally, each instance on its own, and
    // without a store round trip (the breaker is open: no request waits for a timeout).
    let (gets_a, gets_b) = (a.status().gets, b.status().gets);
    let fresh: Vec<String> = (0..6).map(|i| format!("127.0.6.{}", 10 + i)).collect();
    for src in &fresh {
        // Served over both protocols (`http` and `tcp` assert a configured node answered).
        a.http(src).await;
        b.tcp(src).await;
    }
    assert_eq!((a.status().gets, b.status().gets), (gets_a, gets_b));
    // The operator sees it: admin API and metrics.
    let v: serde_json::Value = serde_json::from_str(&a.admin("/api/v1/store").await).expect("json");
    assert_eq!(v["up"], false, "{v}");
    let metrics = b.admin("/metrics").await;
    assert!(metrics.contains("\nlimpet_store_up 0\n"), "{metrics}");
    assert!(!a.status().up && a.status().dropped >= 6);
    // The store comes back (empty): the breakers close, the pins made meanwhile are published
    // with create-if-absent, and the fleet converges on one node per client.
    let redis = Redis::on(port).await;
    until("both instances mark the store up", async || {
        a.store_up() && b.store_up()
    })
    .await;
    for src in srcs.iter().chain(&fresh) {
        let key = format!("limpet:terminal:ip:{src}");
        // An instance that never saw the client holds no entry: it asks the store.
        until(&format!("{src} converges after the restart"), async || {
            let stored = redis.get(&key).await;
            let agrees = |p: Option<String>| p.is_none() || p == stored;
            stored.is_some() && agrees(a.pin(src)) && agrees(b.pin(src))
        })
        .await;
        let n = a.http(src).await;
        assert_eq!(b.http(src).await, n, "{src}");
        assert_eq!(b.tcp(src).await, n, "{src}");
    }
    assert!(a.status().errors >= 1 && a.status().republished >= 1);
    stop(redis, nodes, a, b).await;
}

/// The failure model's store return, against a key another instance wrote first: the pins
/// an instance made while the store was away are published with create-if-absent, so the
/// store keeps the first writer's node and the returning instance adopts it (the fleet
/// converges on one node per client, never two). The store comes back from a save holding
/// the other instance's pin, so which write is first is not left to a race.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_returning_with_a_pin_another_instance_made_first_keeps_it_and_the_returning_instance_adopts_it(
) {
    let (mut redis, nodes, a, b) = fleet("return-first-writer").await;
    let port = redis.port;
    redis.kill();
    breaker_opened_by_new_clients(&a, "127.0.10").await;
    let src = "127.0.9.10";
    let local = a.http(src).await;
    assert_eq!(
        a.pin(src).as_deref(),
        Some(local.as_str()),
        "pinned locally"
    );
    let first = NODES
        .iter()
        .map(|(name, _)| *name)
        .find(|name| *name != local)
        .expect("another node");
    let key = format!("limpet:terminal:ip:{src}");
    let dir = TempDir::new("store-seed");
    let redis = Redis::on_seeded(port, dir.path(), &[(&key, first)]).await;
    let republished = a.status().republished;
    until("a adopts the node the store already held", async || {
        a.pin(src).as_deref() == Some(first)
    })
    .await;
    assert_eq!(
        redis.get(&key).await.as_deref(),
        Some(first),
        "create-if-absent left the first writer's node"
    );
    let status = a.status();
    assert!(status.up && status.republished > republished && status.adopted >= 1);
    assert_eq!(a.http(src).await, first);
    // b never saw the client: once its breaker closed too, it asks the store (were it asked
    // before, its local pin would go out with create-if-absent and adopt `first` as well).
    until("b marks the store up", async || b.store_up()).await;
    let _ = b.http(src).await;
    until("b holds the store's node", async || {
        b.pin(src).as_deref() == Some(first)
    })
    .await;
    assert_eq!(b.http(src).await, first);
    assert_eq!(b.tcp(src).await, first);
    stop(redis, nodes, a, b).await;
}

/// A re-pin made while the store was away wins over the older pin the store kept: the
/// store comes back (SIGCONT) still holding the session's first node, and the resync
/// overwrites it with the re-pin (and tells the fleet), rather than publishing it with
/// create-if-absent and adopting the stale node back, which moved every session of a failed
/// node twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_pin_made_while_the_store_was_away_overwrites_the_older_pin_when_it_returns() {
    let (redis, nodes, a, b) = fleet_with("repin-away", "200ms").await;
    let src = "127.0.13.10";
    let first = pin_in_store(&a, &redis, src).await;
    assert_eq!(b.http(src).await, first, "b follows the store");
    a.settled().await;
    redis.pause();
    breaker_opened_by_new_clients(&a, "127.0.14").await;
    // The session's node goes to MAINT on a: its next request there re-pins it.
    let state = a.running.runtime().state();
    assert!(state
        .set_admin(&first, limpet_core::AdminState::Maint)
        .is_some());
    let moved = a.http(src).await;
    assert_ne!(moved, first, "re-pinned off the node in MAINT");
    // The node is back in service before the store returns: adopting the store's old pin
    // would now move the session back to it.
    assert!(state
        .set_admin(&first, limpet_core::AdminState::Ready)
        .is_some());
    drop(state);
    let resyncs = a.status().resyncs;
    redis.resume();
    until("a's resync after the store returned", async || {
        let st = a.status();
        st.up && st.resyncs > resyncs && !st.resync_pending
    })
    .await;
    let key = format!("limpet:terminal:ip:{src}");
    assert_eq!(
        redis.get(&key).await.as_deref(),
        Some(moved.as_str()),
        "the store holds the re-pin"
    );
    assert_eq!(a.pin(src).as_deref(), Some(moved.as_str()), "a kept it");
    until("b follows the re-pin", async || {
        b.pin(src).as_deref() == Some(moved.as_str())
    })
    .await;
    assert_eq!(b.http(src).await, moved);
    assert_eq!(a.http(src).await, moved);
    stop(redis, nodes, a, b).await;
}

/// `src` pinned through `y` (the store holds it and `x` finds it), then `x` alone loses the
/// store (its connections go silent and new ones are refused) and re-pins `src` off its node
/// (MAINT there): the first node and the one `x` moved the client to.
async fn x_repins_without_the_store(
    redis: &Redis,
    hole: &BlackHole,
    x: &Instance,
    y: &Instance,
    src: &str,
) -> (String, String) {
    let first = pin_in_store(y, redis, src).await;
    assert_eq!(x.http(src).await, first, "x finds y's pin");
    hole.refuse_new(true);
    hole.swallow_all();
    until("x marks the store down", async || !x.store_up()).await;
    maint(x, &first);
    let moved_x = x.http(src).await;
    assert_ne!(moved_x, first);
    (first, moved_x)
}

/// A re-pin made while only this instance lost the store is sent as a compare-and-set when
/// it returns: another instance, which kept the store, re-pinned the session meanwhile to a
/// third node, and that newer re-pin stays (this instance adopts it). Overwritten blindly,
/// the fleet would move the session back to a node the other instance had left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_pin_replayed_after_an_outage_does_not_undo_a_newer_one() {
    let (redis, hole, mut nodes, x, y) = one_behind_a_hole("replay").await;
    let src = "127.0.16.10";
    let (first, moved_x) = x_repins_without_the_store(&redis, &hole, &x, &y, src).await;
    // y, which keeps the store, moves the session to the third node.
    maint(&y, &first);
    maint(&y, &moved_x);
    let moved_y = y.http(src).await;
    assert!(moved_y != first && moved_y != moved_x, "{moved_y}");
    let key = format!("limpet:terminal:ip:{src}");
    until("y's re-pin is stored", async || {
        redis.get(&key).await.as_deref() == Some(moved_y.as_str())
    })
    .await;
    let resyncs = x.status().resyncs;
    hole.refuse_new(false);
    until("x's resync after the store returned", async || {
        let st = x.status();
        st.up && st.resyncs > resyncs && !st.resync_pending
    })
    .await;
    assert_eq!(
        redis.get(&key).await.as_deref(),
        Some(moved_y.as_str()),
        "the newer re-pin stays"
    );
    until("x adopts it", async || {
        x.pin(src).as_deref() == Some(moved_y.as_str())
    })
    .await;
    x.running.stop().await;
    y.running.stop().await;
    for n in &mut nodes {
        n.kill().await;
    }
    drop(hole);
    drop(redis);
}

/// A re-pin made while this instance lost the store, replayed once it returns over a key that
/// meanwhile holds another type (someone's `HSET`): the key holds no node, and the re-pin
/// replaces it, as a re-pin's plain `SET` does. Before, the replay's compare read the key
/// with `GET`, the store answered `WRONGTYPE`, and the re-pin was dropped, the hash left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_pin_replayed_after_an_outage_replaces_a_key_of_another_type() {
    let (redis, hole, mut nodes, x, y) = one_behind_a_hole("replay-type").await;
    let src = "127.0.16.20";
    let (_, moved_x) = x_repins_without_the_store(&redis, &hole, &x, &y, src).await;
    let key = format!("limpet:terminal:ip:{src}");
    let mut c = redis.conn().await.expect("connect");
    redis::cmd("DEL")
        .arg(&key)
        .query_async::<()>(&mut c)
        .await
        .expect("DEL");
    redis::cmd("HSET")
        .arg(&key)
        .arg("field")
        .arg("value")
        .query_async::<()>(&mut c)
        .await
        .expect("HSET");
    let resyncs = x.status().resyncs;
    hole.refuse_new(false);
    until("x's resync after the store returned", async || {
        let st = x.status();
        st.up && st.resyncs > resyncs && !st.resync_pending
    })
    .await;
    until("the re-pin replaces the hash", async || {
        redis.get(&key).await.as_deref() == Some(moved_x.as_str())
    })
    .await;
    assert_eq!(x.pin(src).as_deref(), Some(moved_x.as_str()), "x kept it");
    x.running.stop().await;
    y.running.stop().await;
    for n in &mut nodes {
        n.kill().await;
    }
    drop(hole);
    drop(redis);
}

/// A store that loses its data while it stays up (`FLUSHALL` here; a restart without its
/// data, eviction) gets each instance's pins again within about a second: each instance
/// checks its own marker key every second, finds it gone and publishes its local pins. Before,
/// they came back only with each key's expiry refresh (half the table's expiry), and the
/// other instance meanwhile pinned the same clients afresh, elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_store_gets_the_pins_again_at_once() {
    let (redis, nodes, a, b) = fleet("flushed").await;
    let srcs: Vec<String> = (0..6).map(|i| format!("127.0.15.{}", 10 + i)).collect();
    let mut pinned = Vec::new();
    for src in &srcs {
        pinned.push(pin_in_store(&a, &redis, src).await);
    }
    a.settled().await;
    b.settled().await;
    let mut c = redis.conn().await.expect("connect");
    let _: () = redis::cmd("FLUSHALL")
        .query_async(&mut c)
        .await
        .expect("FLUSHALL");
    for (src, n) in srcs.iter().zip(&pinned) {
        let key = format!("limpet:terminal:ip:{src}");
        until("the pin is in the store again", async || {
            redis.get(&key).await.as_deref() == Some(n.as_str())
        })
        .await;
    }
    // b, which never saw these clients, finds a's pins.
    for (src, n) in srcs.iter().zip(&pinned) {
        assert_eq!(&b.http(src).await, n, "{src} through b");
        assert_eq!(&b.tcp(src).await, n, "{src} through b's TCP listener");
    }
    stop(redis, nodes, a, b).await;
}

/// The failure model's slow store: a store that stops answering (SIGSTOP: connections open,
/// nothing comes back) costs a request at most the store's operation timeout (200 ms here),
/// and no request fails: pinned clients keep their node, new ones are pinned locally. Once
/// it answers again, both instances see it up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_stops_answering_costs_a_request_at_most_its_timeout() {
    const OP_TIMEOUT: Duration = Duration::from_millis(200);
    const SLACK: Duration = Duration::from_millis(800);
    let (redis, nodes, a, b) = fleet_with("slow", "200ms").await;
    let srcs: Vec<String> = (0..4).map(|i| format!("127.0.7.{}", 10 + i)).collect();
    let mut pinned = Vec::new();
    for src in &srcs {
        let n = pin_in_store(&a, &redis, src).await;
        // b learns it from the store: both instances hold it locally before the store hangs.
        assert_eq!(b.http(src).await, n, "{src} through b");
        pinned.push(n);
    }
    redis.pause();
    for i in 0..16usize {
        let k = i % srcs.len();
        let inst = if i % 2 == 0 { &a } else { &b };
        let t = tokio::time::Instant::now();
        assert_eq!(inst.http(&srcs[k]).await, pinned[k], "request {i}");
        assert!(
            t.elapsed() < OP_TIMEOUT + SLACK,
            "request {i}: {:?}",
            t.elapsed()
        );
        // A client never seen: its first request asks the hung store, and is answered
        // once the operation timeout has passed at most.
        let fresh = format!("127.0.9.{}", 10 + i);
        let t = tokio::time::Instant::now();
        inst.http(&fresh).await; // a 200 from a configured node
        assert!(
            t.elapsed() < OP_TIMEOUT + SLACK,
            "new client {fresh}: {:?}",
            t.elapsed()
        );
    }
    redis.resume();
    until("both instances see the store up", async || {
        a.store_up() && b.store_up()
    })
    .await;
    stop(redis, nodes, a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_keeps_the_store_connection() {
    let (redis, nodes, a, b) = fleet("reload").await;
    let src = "127.0.7.10";
    let first = a.http(src).await;
    let before = redis.connections_received().await;
    let conns = a.status().connections;
    let report = limpet::runtime::reload(a.running.runtime())
        .await
        .expect("reload");
    let _ = report;
    // The admin API shows the store up, and neither limpet nor the server saw a new
    // connection (the reload kept the store's).
    let admin = a
        .running
        .runtime()
        .state()
        .lifecycle
        .admin_addr()
        .expect("admin");
    let body = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client")
        .get(format!("http://{admin}/api/v1/store"))
        .send()
        .await
        .expect("GET /api/v1/store")
        .text()
        .await
        .expect("body");
    let v: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(v["up"], true, "{body}");
    assert_eq!(v["connections"], conns, "{body}");
    let after = redis.connections_received().await;
    // Our own INFO connection is the one new connection the server saw.
    assert_eq!(after, before + 1, "the reload opened no store connection");
    // The reloaded generation still shares the table.
    assert_eq!(a.http(src).await, first);
    let src2 = "127.0.7.11";
    let n = a.http(src2).await;
    let key = format!("limpet:terminal:ip:{src2}");
    until(
        "a pin made after the reload reaches the store",
        async || redis.get(&key).await.is_some(),
    )
    .await;
    assert_eq!(b.tcp(src2).await, n);
    let metrics = reqwest::get(format!("http://{admin}/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("body");
    assert!(metrics.contains("\nlimpet_store_up 1\n"), "{metrics}");
    assert!(
        metrics.contains("limpet_store_ops_total{op=\"create\"}"),
        "{metrics}"
    );
    stop(redis, nodes, a, b).await;
}

#[test]
fn a_bad_store_url_is_refused_with_its_place() {
    let dir = TempDir::new("store-url");
    let text = "[[nodes]]\nname = \"a\"\naddress = \"127.0.0.2\"\n\n[store]\nurl = \"http://127.0.0.1:6379\"\n\n[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = 80\n";
    let path = dir.write("limpet.toml", text);
    let e = limpet::config::Config::from_text(&path, text).expect_err("refused");
    assert_eq!((e.line, e.key.as_str()), (6, "store.url"), "{e}");
    assert!(e.message.contains("redis://"), "{e}");
    let text = "[[nodes]]\nname = \"a\"\naddress = \"127.0.0.2\"\n\n[[tables]]\nname = \"t\"\nkey = \"source-ip\"\nshared = true\n\n[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = 80\ntable = \"t\"\n";
    let e = limpet::config::Config::from_text(&path, text).expect_err("refused");
    assert_eq!((e.line, e.key.as_str()), (8, "tables[0].shared"), "{e}");
    // The listing hides the password, and refuses the placeholder pasted back.
    let text = "[[nodes]]\nname = \"a\"\naddress = \"127.0.0.2\"\n\n[store]\nurl = \"redis://limpet:s3cret@127.0.0.1:6379/2\"\n\n[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = 80\n";
    let path = dir.write("limpet.toml", text);
    let listing = limpet::config::Config::resolved_toml(&path).expect("valid");
    assert!(!listing.contains("s3cret"), "{listing}");
    let e = limpet::config::Config::from_text(&path, &listing).expect_err("placeholder refused");
    assert_eq!(e.key, "store.url", "{e}");
}

/// One instance on its own store, with every node, the table's `expire` given and the store
/// timeout of [`fleet`]: the setting of the tests that watch one instance's store traffic.
struct Alone {
    nodes: Vec<TestNode>,
    redis: Redis,
    a: Instance,
    /// The relay the instance reaches the store through, if any.
    relay: Option<BlackHole>,
}

impl Alone {
    async fn start(tag: &str, expire: &str) -> Alone {
        Alone::start_raw(tag, expire, "").await
    }

    /// [`Alone::start`] with `raw_extra` (lines of settings) on the TCP listener.
    async fn start_raw(tag: &str, expire: &str, raw_extra: &str) -> Alone {
        Alone::start_via(tag, expire, raw_extra, false).await
    }

    /// [`Alone::start_raw`]; `relayed`: the instance reaches the store through a
    /// [`BlackHole`], with a store timeout of 200 ms (shorter than [`SLOW_ANSWERS`]).
    async fn start_via(tag: &str, expire: &str, raw_extra: &str, relayed: bool) -> Alone {
        let relay_timeout = relayed.then_some("200ms");
        Alone::start_relayed(tag, expire, raw_extra, relay_timeout).await
    }

    /// [`Alone::start_raw`]; with `relay_timeout`, the instance reaches the store through a
    /// [`BlackHole`], with that store timeout.
    async fn start_relayed(
        tag: &str,
        expire: &str,
        raw_extra: &str,
        relay_timeout: Option<&str>,
    ) -> Alone {
        let pki = Pki::new();
        let (nodes, ports) = start_nodes(&NODES, pki.server("n", &["127.0.0.2"])).await;
        let redis = Redis::start().await;
        let relay = match relay_timeout {
            Some(_) => Some(BlackHole::start(redis.port).await),
            None => None,
        };
        let (url, timeout) = match (&relay, relay_timeout) {
            (Some(r), Some(t)) => (r.url(), t),
            _ => (redis.url(), "500ms"),
        };
        let a = Instance::start_raw(
            tag,
            &url,
            (ports.http, ports.tcp),
            &[0, 1, 2],
            expire,
            timeout,
            Extra {
                raw: raw_extra,
                ..Extra::default()
            },
        )
        .await;
        a.settled().await;
        Alone {
            nodes,
            redis,
            a,
            relay,
        }
    }

    /// Pins `src` over HTTP and waits (bounded) until the pin is in the store; returns the
    /// node and the store key.
    async fn pin_in_store(&self, src: &str) -> (String, String) {
        let node = self.a.http(src).await;
        let key = format!("limpet:terminal:ip:{src}");
        until("the pin reaches the store", async || {
            self.redis.get(&key).await.is_some()
        })
        .await;
        (node, key)
    }

    async fn stop(mut self) {
        self.a.running.stop().await;
        for n in &mut self.nodes {
            n.kill().await;
        }
    }
}

/// A TCP session whose connect fails over twice (its pinned node and the next one refuse)
/// publishes two re-pins of its key, and the store sends both back once the session runs on
/// the third node. They are this instance's own: the local entry stays on the third node and
/// the session stays open. (Applied as another instance's, the first would move the entry
/// back to the second node and end the session it had just opened.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_that_fails_over_twice_keeps_its_session_when_its_own_re_pins_come_back() {
    let sc = Alone::start_raw("echo", "10m", "balance = \"leastconn\"").await;
    fails_over_twice_and_hears_its_re_pins_back(sc, "127.0.4.30").await;
}

/// [`a_connect_that_fails_over_twice_keeps_its_session_when_its_own_re_pins_come_back`] with
/// a slow store: the re-pins' round trip times out, but the store ran them, and their
/// echoes come back after it. They are still this instance's own. (Before, a write that
/// timed out counted as never sent, its re-pins no longer awaited, and their echoes applied
/// as another instance's: the first moved the entry back and ended the session.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn re_pins_whose_write_timed_out_but_ran_are_still_known_as_this_instance_s_own() {
    let sc = Alone::start_via("echo-slow", "10m", "balance = \"leastconn\"", true).await;
    fails_over_twice_and_hears_its_re_pins_back(sc, "127.0.4.40").await;
}

/// A TCP session from `src` whose connect fails over twice, through `sc` (whose store the
/// relay, if any, slows down from then on); the session stays on the third node, open.
async fn fails_over_twice_and_hears_its_re_pins_back(mut sc: Alone, src: &str) {
    let ip = |last: u8| {
        let mut o = src.parse::<std::net::Ipv4Addr>().expect("ip").octets();
        o[3] += last;
        std::net::Ipv4Addr::from(o).to_string()
    };
    let (pinned, _) = sc.pin_in_store(src).await;
    let names: Vec<&str> = NODES.iter().map(|(n, _)| *n).collect();
    let third = names
        .iter()
        .copied()
        .find(|n| *n != pinned)
        .expect("another node");
    let second = names
        .iter()
        .copied()
        .find(|n| *n != pinned && *n != third)
        .expect("a third node");
    // A session held on `third` makes least-connections try `second` first.
    let state = sc.a.running.runtime().state();
    for n in [pinned.as_str(), second] {
        state.set_admin(n, AdminState::Maint).expect("node");
    }
    let (mut holder, on) = tcp_session(&ip(1), sc.a.addr("raw")).await;
    assert_eq!(on, third);
    for n in [pinned.as_str(), second] {
        state.set_admin(n, AdminState::Ready).expect("node");
    }
    // The key of a later message, pinned while every node and the store answer.
    let marker = ip(2);
    let (marker_node, marker_key) = sc.pin_in_store(&marker).await;
    // Both refuse connections now, still UP (no checks).
    for n in sc.nodes.iter_mut().filter(|n| n.name != third) {
        n.kill().await;
    }
    if let Some(relay) = &sc.relay {
        relay.slow_answers(true);
    }
    let evals = sc.redis.command_calls("eval").await;
    let before = sc.a.status();
    let (mut session, on) = tcp_session(src, sc.a.addr("raw")).await;
    assert_eq!(on, third, "connect failed over twice");
    until("both re-pins reach the store", async || {
        sc.redis.command_calls("eval").await >= evals + 2
    })
    .await;
    // Messages come in order: once a later one is applied, the two echoes were read. It
    // is a re-pin as another instance makes it (stored, then announced), so that the
    // instance's resync, due after a round trip that timed out, agrees with it.
    let moved_to = names
        .iter()
        .copied()
        .find(|n| *n != marker_node)
        .expect("another node");
    sc.redis.set_px(&marker_key, moved_to, 600_000).await;
    let mut conn = sc.redis.conn().await.expect("redis");
    let _: i64 = redis::cmd("PUBLISH")
        .arg("limpet:pins")
        .arg(format!("terminal\n{moved_to}\nip:{marker}"))
        .query_async(&mut conn)
        .await
        .expect("publish");
    until("the later message is applied", async || {
        sc.a.pin(&marker).as_deref() == Some(moved_to)
    })
    .await;
    assert_eq!(sc.a.pin(src).as_deref(), Some(third), "the entry stays");
    if sc.relay.is_some() {
        let st = sc.a.status();
        assert_eq!(
            st.overwrites, before.overwrites,
            "the store's answers came too late for every write: {st:?}"
        );
        assert!(st.errors > before.errors, "{st:?}");
    }
    session
        .write_all(b"still here")
        .await
        .expect("the session on the third node is open");
    let mut back = [0u8; 10];
    tokio::time::timeout(PATIENCE, session.read_exact(&mut back))
        .await
        .expect("echo in time")
        .expect("the session on the third node is open");
    assert_eq!(&back, b"still here");
    drop((session, holder.shutdown().await, state));
    sc.stop().await;
}

/// Sticky requests write nothing; the store's expiry is refreshed in batches, about twice per
/// `expire`, so a pin in use outlives `expire` in the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_refreshes_are_batched_and_keep_a_used_pin_alive() {
    let sc = Alone::start("expire", "2s").await;
    let (a, redis) = (&sc.a, &sc.redis);
    let src = "127.0.9.10";
    let (first, key) = sc.pin_in_store(src).await;
    // Requests paced over 2.5 times the table's expire (the pacing is the load, not a wait
    // for an event).
    let started = tokio::time::Instant::now();
    let mut requests = 0u64;
    while started.elapsed() < Duration::from_millis(5000) && requests < 400 {
        assert_eq!(a.http(src).await, first);
        requests += 1;
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(
        redis.get(&key).await.as_deref(),
        Some(first.as_str()),
        "a used pin outlives expire in the store"
    );
    let st = a.status();
    assert_eq!(
        (st.creates, st.overwrites),
        (1, 0),
        "sticky requests write nothing: {st:?}"
    );
    assert!(st.refreshes >= 2, "the expiry was refreshed: {st:?}");
    // The key never expired: a refresh that came too late would have found it missing and
    // created it again (counted as republished).
    assert_eq!(st.republished, 0, "refreshed on time: {st:?}");
    assert!(
        st.refreshes <= 8 && st.refreshes * 4 < requests,
        "refreshes batched, not per request ({requests} requests): {st:?}"
    );
    sc.stop().await;
}

/// A pin changed in the store without the message reaching this instance (a lost
/// subscription, a message missed): the next expiry refresh reads the stored node back and
/// the instance follows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pin_changed_in_the_store_without_a_message_is_adopted_by_the_refresh() {
    let sc = Alone::start("missed", "2s").await;
    let (a, redis) = (&sc.a, &sc.redis);
    let src = "127.0.11.10";
    let (first, key) = sc.pin_in_store(src).await;
    // Another instance's re-pin whose message this one never got: a plain SET, no PUBLISH.
    let other = NODES
        .iter()
        .map(|(n, _)| *n)
        .find(|n| *n != first)
        .expect("another node");
    redis.set_px(&key, other, 2000).await;
    // The client keeps using its pin (so it is refreshed, every second with expire 2s); the
    // refresh finds the other node stored and the instance routes there.
    until("the instance follows the stored node", async || {
        a.http(src).await == other
    })
    .await;
    assert_eq!(a.pin(src).as_deref(), Some(other));
    assert_eq!(a.tcp(src).await, other);
    assert_eq!(redis.get(&key).await.as_deref(), Some(other));
    let st = a.status();
    assert_eq!(st.invalidations, 0, "no message was published: {st:?}");
    assert!(
        st.adopted >= 1,
        "the refresh adopted the stored node: {st:?}"
    );
    sc.stop().await;
}

/// A re-pin made while the store's writer waits on a round trip, just before a resync reads
/// the local pins, reaches the store before the resync compares what it read with it. Before,
/// the resync's create-if-absent read the store's older node back and adopted it over the
/// re-pin (the entry held what was read): the session's TCP session on the node it had moved
/// to was ended, and the re-pin's own write, applied after, left the store and this instance
/// on two nodes. (The expiry refresh compares alike, and writes first alike.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_pin_queued_as_a_resync_reads_the_pins_is_not_undone_by_it() {
    // A store timeout well past what the test takes while the relay holds a command.
    let sc = Alone::start_relayed("queued-repin", "10m", "", Some("5s")).await;
    let (a, redis) = (&sc.a, &sc.redis);
    let relay = sc.relay.as_ref().expect("relay");
    let (src, other) = ("127.0.14.10", "127.0.14.11");
    let (first, key) = sc.pin_in_store(src).await;
    let (second, _) = sc.pin_in_store(other).await;
    assert_ne!(first, second, "two fresh clients, round robin");
    // The writer's next liveness check is held; meanwhile the store loses this instance's
    // marker, so the check, answered once let go, starts a resync.
    let mut check = relay.hold_next(b"PEXPIRE");
    check.seen("the liveness check").await;
    let mut c = redis.conn().await.expect("connect");
    let markers: Vec<String> = redis::cmd("KEYS")
        .arg("limpet:instance:*")
        .query_async(&mut c)
        .await
        .expect("KEYS");
    assert_eq!(markers.len(), 1, "{markers:?}");
    redis::cmd("DEL")
        .arg(&markers)
        .query_async::<()>(&mut c)
        .await
        .expect("DEL");
    // Another client's re-pin while the check waits: queued, and its write, the writer's
    // next round trip, is held in turn.
    maint(a, &second);
    assert_ne!(a.http(other).await, second);
    let mut write = relay.hold_next(b"EVAL");
    check.release();
    write.seen("the queued re-pin's write").await;
    // The session's own re-pin while that write waits, and its TCP session on the node it
    // moved to.
    maint(a, &first);
    let moved = a.http(src).await;
    assert_ne!(moved, first);
    let (mut session, on) = tcp_session(src, a.addr("raw")).await;
    assert_eq!(on, moved);
    let resyncs = a.status().resyncs;
    write.release();
    until("the resync is done", async || a.status().resyncs > resyncs).await;
    until("the store holds the re-pin", async || {
        redis.get(&key).await.as_deref() == Some(moved.as_str())
    })
    .await;
    assert_eq!(
        a.pin(src).as_deref(),
        Some(moved.as_str()),
        "the instance's pin follows the store's"
    );
    assert_eq!(a.status().adopted, 0, "{:?}", a.status());
    still_open(&mut session, &moved).await;
    assert_eq!(a.http(src).await, moved);
    drop(session);
    sc.stop().await;
}

/// Sets `inst`'s node `node` to MAINT.
fn maint(inst: &Instance, node: &str) {
    inst.running
        .runtime()
        .state()
        .set_admin(node, AdminState::Maint)
        .expect("node");
}

/// `CONFIG SET maxmemory bytes` on the store: 1 makes it refuse writes (out of memory under
/// its default `noeviction`) while it still answers reads; 0 lifts the limit.
async fn maxmemory(redis: &Redis, bytes: u64) {
    redis
        .run("CONFIG", &["SET", "maxmemory", &bytes.to_string()])
        .await;
}

/// A re-pin the store refused (out of memory: it refuses writes and still answers reads) is
/// newer than the node the store holds for the key: the expiry refresh, whose read of the
/// key answers that older node, does not take it back, neither in the tick whose resync's
/// refused write opens the breaker nor later, and the session's TCP session on its new node
/// stays open. Once the store takes writes again, it takes the re-pin. Before, the refresh
/// that followed the failed resync in the same tick adopted the old node: the entry went
/// back to it and the session's connections on the new one were ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_pin_the_store_refused_is_not_undone_by_the_old_node_read_back() {
    // A store timeout well past what the test takes while the relay holds a command.
    let sc = Alone::start_relayed("refused-repin", "10m", "", Some("5s")).await;
    let (a, redis) = (&sc.a, &sc.redis);
    let relay = sc.relay.as_ref().expect("relay");
    let src = "127.0.14.20";
    let (first, key) = sc.pin_in_store(src).await;
    maxmemory(redis, 1).await;
    // The re-pin's write is held while a reload makes the table's expiry refresh due at the
    // writer's next tick (a new `expire` refreshes every key at once).
    let mut write = relay.hold_next(b"EVAL");
    maint(a, &first);
    let moved = a.http(src).await;
    assert_ne!(moved, first);
    let (mut session, on) = tcp_session(src, a.addr("raw")).await;
    assert_eq!(on, moved);
    write.seen("the re-pin's write").await;
    let path = a._dir.path().join("limpet.toml");
    let text = std::fs::read_to_string(&path).expect("config");
    std::fs::write(
        &path,
        text.replacen("expire = \"10m\"", "expire = \"20m\"", 1),
    )
    .expect("write config");
    limpet::runtime::reload(a.running.runtime())
        .await
        .expect("reload");
    // Refused (out of memory): one failure; the resync's overwrite at the next tick, refused
    // too, opens the breaker.
    write.release();
    until("the store is down", async || !a.store_up()).await;
    // The writer's first probe of the store after: the tick that opened the breaker is over.
    let mut probe = relay.hold_next(b"XX");
    probe.seen("the store's probe").await;
    probe.release();
    assert_eq!(
        a.pin(src).as_deref(),
        Some(moved.as_str()),
        "the re-pin was undone"
    );
    assert_eq!(a.status().adopted, 0, "{:?}", a.status());
    still_open(&mut session, &moved).await;
    maxmemory(redis, 0).await;
    until("the store holds the re-pin", async || {
        redis.get(&key).await.as_deref() == Some(moved.as_str())
    })
    .await;
    assert_eq!(a.pin(src).as_deref(), Some(moved.as_str()));
    still_open(&mut session, &moved).await;
    drop(session);
    sc.stop().await;
}

/// Asserts that `session` (a TCP session on `node`) is still open: the node echoes a line.
async fn still_open(session: &mut tokio::net::TcpStream, node: &str) {
    session.write_all(b"still here\n").await.expect("write");
    assert_eq!(
        common::multiport::read_line(session).await,
        "still here",
        "the TCP session on {node} is still open"
    );
}

/// Reloads `inst` with its config less the node `node`.
async fn reload_without(inst: &Instance, node: &str) {
    let path = inst._dir.path().join("limpet.toml");
    let text = std::fs::read_to_string(&path).expect("config");
    let (_, ip) = NODES.iter().find(|(n, _)| *n == node).expect("node");
    let block = format!("[[nodes]]\nname = \"{node}\"\naddress = \"{ip}\"\n");
    assert!(text.contains(&block), "{text}");
    std::fs::write(&path, text.replacen(&block, "", 1)).expect("write config");
    limpet::runtime::reload(inst.running.runtime())
        .await
        .expect("reload");
}

/// A re-pin made while the store was away, off a node a reload removed meanwhile, is
/// replayed over that node when the store returns: the store, still naming the removed
/// node, takes the re-pin as it is. Before, the replay compared the store with no node at
/// all (the running config has no name for the removed node), lost, and the instance
/// adopted the removed node back (its table keeps every name it had): the session's TCP
/// session on its new node was ended, and its next request re-pinned it afresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_pin_off_a_removed_node_made_while_the_store_was_away_stands_when_it_returns() {
    let sc = Alone::start("removed-away", "10m").await;
    let (a, redis) = (&sc.a, &sc.redis);
    let src = "127.0.14.20";
    let (first, key) = sc.pin_in_store(src).await;
    redis.pause();
    breaker_opened_by_new_clients(a, "127.0.17").await;
    reload_without(a, &first).await;
    let (mut session, moved) = tcp_session(src, a.addr("raw")).await;
    assert_ne!(moved, first, "re-pinned off the removed node");
    let before = a.status();
    redis.resume();
    until("the resync after the store returned", async || {
        let st = a.status();
        st.up && st.resyncs > before.resyncs && !st.resync_pending
    })
    .await;
    assert_eq!(
        redis.get(&key).await.as_deref(),
        Some(moved.as_str()),
        "the store holds the re-pin"
    );
    assert_eq!(a.pin(src).as_deref(), Some(moved.as_str()));
    let st = a.status();
    assert_eq!(
        (st.adopted, st.unknown_nodes),
        (before.adopted, before.unknown_nodes),
        "the replay took the store's pin as the node it replaced: {st:?}"
    );
    still_open(&mut session, &moved).await;
    drop(session);
    assert_eq!(a.http(src).await, moved);
    sc.stop().await;
}

/// A pin in the store to a node a reload removed is no more a node to pin than one no
/// config ever had, although the table keeps its name: a re-pin message naming it leaves
/// the local entry alone, and a first request whose stored pin names it gets a configured
/// node, which then overwrites the store's for the fleet. Before, both took the removed
/// node (its name known): the client's next request found it unknown and was re-pinned
/// afresh, a second move, and its TCP session on the node it had was ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pin_in_the_store_to_a_node_a_reload_removed_is_left_alone() {
    let sc = Alone::start("removed-store", "10m").await;
    let (a, redis) = (&sc.a, &sc.redis);
    let (src, fresh, gone) = ("127.0.14.30", "127.0.14.31", "127.0.14.32");
    let (first, key) = sc.pin_in_store(src).await;
    // A client pinned to the node the reload removes.
    let (removed, gone_key) = sc.pin_in_store(gone).await;
    assert_ne!(removed, first, "round robin");
    let removed = removed.as_str();
    reload_without(a, removed).await;
    let (mut session, on) = tcp_session(src, a.addr("raw")).await;
    assert_eq!(on, first);
    let unknown = a.status().unknown_nodes;
    let mut c = redis.conn().await.expect("connect");
    redis::cmd("PUBLISH")
        .arg("limpet:pins")
        .arg(format!("terminal\n{removed}\nip:{src}"))
        .query_async::<()>(&mut c)
        .await
        .expect("PUBLISH");
    until("the message was seen", async || {
        a.status().unknown_nodes > unknown
    })
    .await;
    assert_eq!(a.pin(src).as_deref(), Some(first.as_str()));
    still_open(&mut session, &first).await;
    drop(session);
    assert_eq!(redis.get(&key).await.as_deref(), Some(first.as_str()));

    let fresh_key = format!("limpet:terminal:ip:{fresh}");
    redis.set_px(&fresh_key, removed, 60_000).await;
    let unknown = a.status().unknown_nodes;
    let got = a.http(fresh).await;
    assert_ne!(got, removed);
    assert_eq!(a.pin(fresh).as_deref(), Some(got.as_str()));
    until("the store holds the client's configured node", async || {
        redis.get(&fresh_key).await.as_deref() == Some(got.as_str())
    })
    .await;
    assert_eq!(a.http(fresh).await, got);
    let st = a.status();
    assert_eq!(
        (st.unknown_nodes - unknown, st.adopted),
        (2, 0),
        "the GET and the create's answer named the removed node: {st:?}"
    );

    // The store loses its data: the resync publishes the pins again, but not one naming the
    // removed node (its client's next request re-pins it).
    let resyncs = a.status().resyncs;
    redis::cmd("FLUSHALL")
        .query_async::<()>(&mut c)
        .await
        .expect("FLUSHALL");
    until("the resync after the flush", async || {
        let st = a.status();
        st.resyncs > resyncs && !st.resync_pending
    })
    .await;
    assert_eq!(redis.get(&key).await.as_deref(), Some(first.as_str()));
    assert_eq!(redis.get(&gone_key).await, None, "the removed node's pin");
    sc.stop().await;
}

/// The first request of a client through an instance that holds no entry for it reads the
/// fleet's pin and renews its key: the pin is in use again, so the key gets the table's whole
/// expiry. Before, a plain GET left the key the time the last instance to use the pin had
/// given it: the key could expire before this instance's first refresh of it, and a first
/// request through another instance (the session's other port) pinned the client afresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pin_read_from_the_store_gets_the_whole_expiry_again() {
    let sc = Alone::start("getex", "10m").await;
    let (a, redis) = (&sc.a, &sc.redis);
    let src = "127.0.14.40";
    let key = format!("limpet:terminal:ip:{src}");
    let (node, _) = NODES[1];
    // Another instance's pin, its key with 10 s left of the table's 10 minutes.
    redis.set_px(&key, node, 10_000).await;
    let gets = a.status().get_hits;
    assert_eq!(a.http(src).await, node, "the fleet's pin");
    assert_eq!(a.status().get_hits, gets + 1, "{:?}", a.status());
    let ttl = redis.pttl(&key).await;
    assert!(
        ttl > 10_000 && ttl <= 600_000,
        "the key has the table's expiry (10 minutes) again: {ttl} ms left"
    );
    assert_eq!(redis.get(&key).await.as_deref(), Some(node));
    sc.stop().await;
}

/// A store slower than the instance's `timeout` (300 ms against 200 ms) but quick enough
/// for a connect and a write within a connect's bound (`connect_timeout`, 1 s) keeps the
/// breaker open: the probe's bound is the connect's, but each command on the connection is
/// bounded inside `timeout` (the connection's own response timeout), so the probe fails.
/// (Closed at each probe, it would open again at the next two round trips: a resync started,
/// a new connection made and a new client kept waiting `timeout`, every second or so.) Once
/// the store is quick again, the breaker closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_slower_than_its_timeout_keeps_the_breaker_open() {
    let sc = Alone::start_via("slow-breaker", "10m", "", true).await;
    let (a, redis) = (&sc.a, &sc.redis);
    let relay = sc.relay.as_ref().expect("relay");
    relay.slow_answers_by(Duration::from_millis(300));
    breaker_opened_by_new_clients(a, "127.0.18").await;
    let connections = a.status().connections;
    // Probes go out every second, each a `SET .. XX` of the marker (which the store runs at
    // once: only its answers are late); three of them cover two probe rounds at least.
    let sets = redis.command_calls("set").await;
    until("three more probes reached the store", async || {
        assert!(
            !a.store_up(),
            "the breaker closed on a store slower than its timeout"
        );
        redis.command_calls("set").await >= sets + 3
    })
    .await;
    assert!(!a.store_up());
    assert_eq!(a.status().connections, connections, "{:?}", a.status());
    relay.slow_answers(false);
    until("the breaker closes once the store is quick", async || {
        a.store_up()
    })
    .await;
    sc.stop().await;
}

/// A pin in the store to a node this instance has not got (another instance's config, or
/// anyone who can write the store) is never adopted, whichever way it comes, and the table's
/// list of node names does not grow (it grew by one name for each distinct value, for the
/// table's life):
/// - a first request's GET, then the create that lost to it: the client gets a configured
///   node, which overwrites the store's for the fleet (every instance then routes it alike);
/// - re-pin messages: the client keeps its node;
/// - the stored pin read back by the expiry refresh: the client keeps its node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pin_in_the_store_to_a_node_no_config_has_is_left_alone() {
    let sc = Alone::start("ghost", "2s").await;
    let (a, redis) = (&sc.a, &sc.redis);
    let names = || {
        let state = a.running.runtime().state();
        let t = state.table("terminal").expect("table");
        let g = t.lock();
        g.store().names().len()
    };
    let unknown = || a.status().unknown_nodes;
    let src = "127.0.11.30";
    let (first, key) = sc.pin_in_store(src).await;
    let before = names();
    let mut c = redis.conn().await.expect("connect");

    let fresh = "127.0.11.31";
    let fresh_key = format!("limpet:terminal:ip:{fresh}");
    redis.set_px(&fresh_key, "GHOST-FIRST", 60_000).await;
    let got = a.http(fresh).await;
    assert!(NODES.iter().any(|(n, _)| *n == got), "{got}");
    until("the store holds the client's configured node", async || {
        redis.get(&fresh_key).await.as_deref() == Some(got.as_str())
    })
    .await;
    assert_eq!(unknown(), 2, "the GET and the create's answer");

    for i in 0..100 {
        redis::cmd("PUBLISH")
            .arg("limpet:pins")
            .arg(format!("terminal\nGHOST-{i}\nip:{src}"))
            .query_async::<()>(&mut c)
            .await
            .expect("PUBLISH");
    }
    until("the messages were seen", async || unknown() >= 102).await;
    assert_eq!(unknown(), 102);
    assert_eq!(a.http(src).await, first);

    redis.set_px(&key, "GHOST-STORED", 2000).await;
    // Used, the pin is refreshed every second (expire 2s); so is the fresh client's.
    until("the refresh read the stored pin back", async || {
        a.http(src).await;
        a.http(fresh).await;
        unknown() > 102
    })
    .await;
    assert_eq!(a.http(src).await, first);
    assert_eq!(a.pin(src).as_deref(), Some(first.as_str()));
    assert_eq!(a.http(fresh).await, got);
    assert_eq!(names(), before, "names from the store were added");
    let st = a.status();
    assert_eq!((st.adopted, st.invalidations), (0, 0), "{st:?}");
    sc.stop().await;
}

/// A reload that changes a shared table's `expire` gives every live pin's key the new expiry
/// at the writer's next tick. Before, the next refresh came at the new cadence (2 s -> 20 s:
/// ten seconds on), and a key in use expired from the store meanwhile, at its old expiry,
/// while the local entry lived on: another instance's first request for the client found no
/// pin and could send it elsewhere. (The reverse, 20 s -> 2 s, kept pins the tables had
/// dropped in the store for up to 20 s.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_changes_expire_gives_the_stored_pins_the_new_one() {
    let sc = Alone::start("expire-reload", "2s").await;
    let (a, redis) = (&sc.a, &sc.redis);
    let (node, key) = sc.pin_in_store("127.0.13.10").await;
    let ttl = redis.pttl(&key).await;
    assert!((1..=2_000).contains(&ttl), "the old expiry: {ttl} ms");
    let path = sc.a._dir.path().join("limpet.toml");
    let text = std::fs::read_to_string(&path).expect("config");
    let text = text.replacen("expire = \"2s\"", "expire = \"20s\"", 1);
    std::fs::write(&path, text).expect("write config");
    limpet::runtime::reload(a.running.runtime())
        .await
        .expect("reload");
    let reloaded = tokio::time::Instant::now();
    // The writer ticks every 200 ms: well within the key's old 2 s.
    loop {
        let ttl = redis.pttl(&key).await;
        if ttl > 2_000 {
            break;
        }
        assert!(
            ttl > 0 && reloaded.elapsed() < Duration::from_millis(1_500),
            "the key took the new expiry within 1.5 s of the reload: {ttl} ms left after {:?}",
            reloaded.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(redis.get(&key).await.as_deref(), Some(node.as_str()));
    sc.stop().await;
}

/// A reload that changes nothing about the store keeps the carried tables' pins without
/// sending any of them again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_with_pins_sends_no_store_writes() {
    let sc = Alone::start("reload-quiet", "10m").await;
    let (a, redis) = (&sc.a, &sc.redis);
    let srcs: Vec<String> = (0..24).map(|i| format!("127.0.12.{}", 10 + i)).collect();
    let mut pinned = Vec::new();
    for src in &srcs {
        pinned.push(a.http(src).await);
    }
    for src in &srcs {
        let key = format!("limpet:terminal:ip:{src}");
        until("the pin reaches the store", async || {
            redis.get(&key).await.is_some()
        })
        .await;
    }
    a.settled().await;
    let before = a.status();
    let sets = redis.command_calls("set").await;
    let evals = redis.command_calls("eval").await;
    let checks = redis.command_calls("pexpire").await;
    limpet::runtime::reload(a.running.runtime())
        .await
        .expect("reload");
    // A resync would run on the writer's next tick: wait for two of its liveness checks
    // (`PEXPIRE` of its marker, a second apart) after the reload, so at least one full tick
    // ran.
    until("the writer ticks after the reload", async || {
        redis.command_calls("pexpire").await >= checks + 2
    })
    .await;
    let after = a.status();
    assert_eq!(
        redis.command_calls("set").await,
        sets,
        "no SET after the reload"
    );
    assert_eq!(redis.command_calls("eval").await, evals, "no re-pin");
    assert!(!after.resync_pending, "{after:?}");
    assert_eq!(
        (after.resyncs, after.republished, after.creates),
        (before.resyncs, before.republished, before.creates),
        "the reload published nothing: {before:?} -> {after:?}"
    );
    // The pins were carried over, and new ones still reach the store.
    for (src, n) in srcs.iter().zip(&pinned) {
        assert_eq!(&a.http(src).await, n, "{src}");
    }
    let src = "127.0.12.200";
    let n = a.http(src).await;
    let key = format!("limpet:terminal:ip:{src}");
    until(
        "a pin made after the reload reaches the store",
        async || redis.get(&key).await.as_deref() == Some(n.as_str()),
    )
    .await;
    sc.stop().await;
}

/// Two instances, both settled: the first reaches the store through a [`BlackHole`] (store
/// timeout 200 ms), the second directly (500 ms); their nodes listed in different orders.
async fn one_behind_a_hole(tag: &str) -> (Redis, BlackHole, Vec<TestNode>, Instance, Instance) {
    let pki = Pki::new();
    let (nodes, ports) = start_nodes(&NODES, pki.server("n", &["127.0.0.2"])).await;
    let redis = Redis::start().await;
    let hole = BlackHole::start(redis.port).await;
    let behind = Instance::start_at(
        &format!("{tag}-behind"),
        &hole.url(),
        ports.http,
        ports.tcp,
        &[0, 1, 2],
        "10m",
        "200ms",
    )
    .await;
    let direct = Instance::start_with(
        &format!("{tag}-direct"),
        &redis,
        ports.http,
        ports.tcp,
        &[2, 0, 1],
        "10m",
        "500ms",
    )
    .await;
    behind.settled().await;
    direct.settled().await;
    (redis, hole, nodes, behind, direct)
}

/// A TCP relay to the store that can turn every connection it carries into a half-open one:
/// bytes are read and dropped in both directions, nothing is closed (a store host gone
/// without a RST, a firewall dropping the flow). Connections made after that are relayed.
/// It can also slow the store down: the store's bytes reach limpet [`SLOW_ANSWERS`] late,
/// while limpet's reach the store at once (the store runs each command as it comes, and
/// its answers and messages come after limpet stopped waiting).
struct BlackHole {
    port: u16,
    holed: std::sync::Arc<std::sync::Mutex<Vec<std::sync::Arc<std::sync::atomic::AtomicBool>>>>,
    /// New connections are accepted and closed at once (the store unreachable).
    refusing: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// The store's bytes are held [`SLOW_ANSWERS`] before they are passed on.
    /// How late, in milliseconds (0: at once).
    slow: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// limpet's bytes reach the store at most this many a second, on each connection (0:
    /// as fast as they come): a narrow link ([`BlackHole::narrow_to`]).
    rate: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// limpet's bytes from the next command that holds a pattern on are held until the test
    /// lets them go ([`BlackHole::hold_next`]).
    gate: std::sync::Arc<std::sync::Mutex<Option<Gate>>>,
    task: tokio::task::JoinHandle<()>,
}

/// An armed [`BlackHole::hold_next`]: the pattern, who to tell when it passes, and what lets
/// it go.
struct Gate {
    pattern: &'static [u8],
    seen: tokio::sync::oneshot::Sender<()>,
    release: tokio::sync::oneshot::Receiver<()>,
}

/// A command of limpet's held by the relay ([`BlackHole::hold_next`]).
struct Held {
    seen: tokio::sync::oneshot::Receiver<()>,
    release: tokio::sync::oneshot::Sender<()>,
}

impl Held {
    /// Waits (bounded) until the command has reached the relay: limpet waits for its answer.
    async fn seen(&mut self, what: &str) {
        tokio::time::timeout(PATIENCE, &mut self.seen)
            .await
            .unwrap_or_else(|_| panic!("{what}: not sent within {PATIENCE:?}"))
            .expect("relay");
    }

    /// Passes the command on to the store, and what came after it.
    fn release(self) {
        let _ = self.release.send(());
    }
}

/// How late a [`BlackHole`] slowing the store down passes its answers on: longer than two
/// store timeouts of an instance behind it (200 ms), so that two writes sent one after the
/// other's timeout have both timed out when the first one's answer comes.
const SLOW_ANSWERS: Duration = Duration::from_millis(500);

impl BlackHole {
    async fn start(to: u16) -> BlackHole {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::{Arc, Mutex};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = l.local_addr().expect("addr").port();
        let holed: Arc<Mutex<Vec<Arc<AtomicBool>>>> = Arc::default();
        let list = Arc::clone(&holed);
        let refusing = Arc::new(AtomicBool::new(false));
        let refuse = Arc::clone(&refusing);
        let slow = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let slowing = Arc::clone(&slow);
        let rate = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let narrowing = Arc::clone(&rate);
        let gate: Arc<Mutex<Option<Gate>>> = Arc::default();
        let gating = Arc::clone(&gate);
        let task = tokio::spawn(async move {
            while let Ok((down, _)) = l.accept().await {
                if refuse.load(Ordering::Acquire) {
                    drop(down);
                    continue;
                }
                let Ok(up) = tokio::net::TcpStream::connect(("127.0.0.1", to)).await else {
                    continue;
                };
                let hole = Arc::new(AtomicBool::new(false));
                list.lock().expect("lock").push(Arc::clone(&hole));
                let (dr, dw) = down.into_split();
                let (ur, uw) = up.into_split();
                for (mut r, mut w, hole, slow, gate, rate) in [
                    (
                        Box::new(dr) as Box<dyn tokio::io::AsyncRead + Send + Unpin>,
                        Box::new(uw) as Box<dyn tokio::io::AsyncWrite + Send + Unpin>,
                        Arc::clone(&hole),
                        None,
                        Some(Arc::clone(&gating)),
                        Some(Arc::clone(&narrowing)),
                    ),
                    (
                        Box::new(ur),
                        Box::new(dw),
                        hole,
                        Some(Arc::clone(&slowing)),
                        None,
                        None,
                    ),
                ] {
                    // Read and passed on by two tasks, so that bytes held back do not hold
                    // back the reading of the next ones: each chunk is written at its time,
                    // in order.
                    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
                    tokio::spawn(async move {
                        use tokio::io::AsyncReadExt as _;
                        let mut buf = vec![0u8; 16 * 1024];
                        // When the link is free again (a narrow one's).
                        let mut free = tokio::time::Instant::now();
                        loop {
                            let n = match r.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            if hole.load(Ordering::Acquire) {
                                continue;
                            }
                            let mut at = tokio::time::Instant::now();
                            if let Some(s) = &slow {
                                at += Duration::from_millis(s.load(Ordering::Acquire));
                            }
                            let per_second = rate.as_ref().map_or(0, |r| r.load(Ordering::Acquire));
                            let n_us = u64::try_from(n).expect("n") * 1_000_000;
                            if let Some(us) = n_us.checked_div(per_second) {
                                at = at.max(free) + Duration::from_micros(us);
                                free = at;
                            }
                            let bytes = buf[..n].to_vec();
                            let held = gate.as_ref().and_then(|g| {
                                let mut g = g.lock().expect("lock");
                                let hit = g.as_ref().is_some_and(|g| {
                                    bytes.windows(g.pattern.len()).any(|w| w == g.pattern)
                                });
                                let armed = if hit { g.take() } else { None };
                                armed.map(|a| {
                                    let _ = a.seen.send(());
                                    a.release
                                })
                            });
                            if tx.send((at, bytes, held)).is_err() {
                                return;
                            }
                        }
                    });
                    tokio::spawn(async move {
                        use tokio::io::AsyncWriteExt as _;
                        while let Some((at, bytes, held)) = rx.recv().await {
                            if let Some(release) = held {
                                let _ = release.await;
                            }
                            tokio::time::sleep_until(at).await;
                            if w.write_all(&bytes).await.is_err() {
                                return;
                            }
                        }
                    });
                }
            }
        });
        BlackHole {
            port,
            holed,
            refusing,
            slow,
            rate,
            gate,
            task,
        }
    }

    /// Holds the next command of limpet's that holds `pattern` (and everything limpet sends
    /// after it on that connection) until [`Held::release`].
    fn hold_next(&self, pattern: &'static [u8]) -> Held {
        let (seen_tx, seen) = tokio::sync::oneshot::channel();
        let (release, release_rx) = tokio::sync::oneshot::channel();
        *self.gate.lock().expect("lock") = Some(Gate {
            pattern,
            seen: seen_tx,
            release: release_rx,
        });
        Held { seen, release }
    }

    /// The store's bytes are passed on [`SLOW_ANSWERS`] late (`true`), or at once again.
    fn slow_answers(&self, slow: bool) {
        self.slow_answers_by(if slow { SLOW_ANSWERS } else { Duration::ZERO });
    }

    /// The store's bytes are passed on `late`.
    fn slow_answers_by(&self, late: Duration) {
        let ms = u64::try_from(late.as_millis()).expect("ms");
        self.slow.store(ms, std::sync::atomic::Ordering::Release);
    }

    /// limpet's bytes reach the store at most `per_second` a second on each connection, in
    /// order: one command crosses at once, a pipeline of many takes its time.
    fn narrow_to(&self, per_second: u64) {
        self.rate
            .store(per_second, std::sync::atomic::Ordering::Release);
    }

    /// New connections are closed at once (`true`), or relayed again (`false`).
    fn refuse_new(&self, refuse: bool) {
        self.refusing
            .store(refuse, std::sync::atomic::Ordering::Release);
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// Every connection relayed so far goes silent (neither end is told).
    fn swallow_all(&self) {
        for h in self.holed.lock().expect("lock").iter() {
            h.store(true, std::sync::atomic::Ordering::Release);
        }
    }
}

impl Drop for BlackHole {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The store's connections go half-open (no RST, no FIN): the command connection is
/// replaced once the breaker opens, and the subscription's ping notices its own, so a
/// re-pin of another instance reaches this one again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_open_store_connections_are_replaced() {
    let (redis, hole, mut nodes, a, b) = one_behind_a_hole("halfopen").await;
    let src = "127.0.13.10";
    let first = a.http(src).await;
    let key = format!("limpet:terminal:ip:{src}");
    until("the pin reaches the store", async || {
        redis.get(&key).await.is_some()
    })
    .await;
    assert_eq!(b.http(src).await, first);
    let conns = a.status().connections;
    hole.swallow_all();
    // The command connection: PINGs time out, the breaker opens, the next probe runs on a
    // fresh connection (through the relay, which carries new connections).
    until("A marks the store down", async || !a.store_up()).await;
    // And the subscription: its ping times out and it is made again; both new connections
    // counted, and the resync the new subscription asks for done.
    until("A reconnects both connections", async || {
        let st = a.status();
        st.up && st.connections >= conns + 2 && !st.resync_pending
    })
    .await;
    // A re-pin on B now reaches A only through the new subscription (A's refresh is minutes
    // away, and no resync is pending).
    b.running
        .runtime()
        .state()
        .set_admin(&first, AdminState::Maint)
        .expect("node");
    let moved = b.http(src).await;
    assert_ne!(moved, first);
    until("A follows B's re-pin", async || {
        a.pin(src).as_deref() == Some(moved.as_str())
    })
    .await;
    assert_eq!(a.http(src).await, moved);
    assert!(a.status().invalidations >= 1, "{:?}", a.status());
    a.running.stop().await;
    b.running.stop().await;
    for n in &mut nodes {
        n.kill().await;
    }
}

/// Subscribers of the store's channel of re-pins.
async fn subscribers(redis: &Redis) -> u64 {
    let Ok(mut c) = redis.conn().await else {
        return 0;
    };
    redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg("limpet:pins")
        .query_async::<(String, u64)>(&mut c)
        .await
        .map_or(0, |(_, n)| n)
}

/// A snapshot that reaches the table after the start's resyncs (read from a slow disk; here
/// a FIFO the test writes once they ran) is reconciled with the store all the same: the
/// fleet re-pinned the client since the snapshot was saved, and the instance routes it to
/// the store's node, not the snapshot's. (Before, only the start's resyncs published the
/// local pins, on a table still empty, and the restored pin held until its key's first
/// expiry refresh, up to `expire / 2` later, while the other instances routed the client
/// to the store's node.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pins_restored_from_a_snapshot_after_the_start_s_resyncs_follow_the_store() {
    use limpet_core::table::{encode_snapshot, AffinityStore as _, LruTable, TableConfig};
    let pki = Pki::new();
    let (mut nodes, ports) = start_nodes(&NODES, pki.server("n", &["127.0.0.2"])).await;
    let redis = Redis::start().await;
    let src = "127.0.14.10";
    let (saved, fleet) = (NODES[0].0, NODES[1].0);
    // Another instance re-pinned the client since this one's snapshot was saved.
    let key = format!("limpet:terminal:ip:{src}");
    redis.set_px(&key, fleet, 600_000).await;
    let dir = TempDir::new("restored-late-fifo");
    let snapshot = dir.path().join("terminal.snapshot");
    let made = std::process::Command::new("mkfifo")
        .arg(&snapshot)
        .status()
        .unwrap_or_else(|e| panic!("mkfifo: {e}"));
    assert!(made.success());
    let bytes = {
        let mut t = LruTable::new(TableConfig::new(100, 600_000)).expect("table");
        let n = t.intern(saved).expect("intern");
        let ip = src.parse().expect("ip");
        t.put(KeyRef::ip(ip, IpPrefix::HOST), n, limpet::clock::now_ms());
        encode_snapshot(&t, limpet::clock::now_ms())
    };
    // The disk: its open for writing returns once limpet's read opened the FIFO; the bytes
    // are written, and the FIFO closed (the read's end of file), when `go` says so or is
    // dropped (a test failing before lets the start go on).
    let (go, wait) = std::sync::mpsc::channel::<()>();
    let disk = std::thread::spawn({
        let path = snapshot.clone();
        move || -> std::io::Result<()> {
            let mut f = std::fs::OpenOptions::new().write(true).open(&path)?;
            let _ = wait.recv();
            std::io::Write::write_all(&mut f, &bytes)
        }
    });
    let terminal = format!("snapshot = \"{}\"", snapshot.display());
    let url = redis.url();
    let starting = Instance::start_raw(
        "restored-late",
        &url,
        (ports.http, ports.tcp),
        &[0, 1, 2],
        "10m",
        "500ms",
        Extra {
            terminal: &terminal,
            ..Extra::default()
        },
    );
    let resynced = async move {
        // The start's resyncs: the writer's first tick's, and the one its subscription asks
        // for at the writer's next tick (200 ms). Two of the writer's once-a-second checks
        // (`PEXPIRE` of its marker) after the subscription mean a whole tick ran after it.
        until("the instance subscribes", async || {
            subscribers(&redis).await == 1
        })
        .await;
        let checks = redis.command_calls("pexpire").await;
        until("the writer ticks after the subscription", async || {
            redis.command_calls("pexpire").await >= checks + 2
        })
        .await;
        let _ = go.send(());
        redis
    };
    let (a, redis) = tokio::join!(starting, resynced);
    match disk.join() {
        Ok(written) => written.expect("the snapshot written into the FIFO"),
        Err(_) => panic!("the disk thread panicked"),
    }
    a.settled().await;
    assert_eq!(
        a.http(src).await,
        fleet,
        "the client follows the store's pin"
    );
    assert_eq!(a.pin(src).as_deref(), Some(fleet));
    assert_eq!(redis.get(&key).await.as_deref(), Some(fleet));
    let st = a.status();
    assert!(
        st.adopted >= 1,
        "the restored pin took the store's node: {st:?}"
    );
    a.running.stop().await;
    for n in &mut nodes {
        n.kill().await;
    }
}

/// A store reached over a link too narrow for a whole pipeline within the store timeout
/// (64 KiB/s, 200 ms: the 512 commands of a full pipeline take about 0.8 s to cross, one
/// command well under a millisecond): the pipelines shrink after each that timed out until
/// they fit, and the start's resync publishes every pin of a table of 2,000 restored from
/// its snapshot. (Before, every resync pipeline timed out, two in a row opened the breaker,
/// the next probe closed it and the resync began again: not one pin reached the store.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_too_slow_for_a_whole_pipeline_gets_every_pin_in_smaller_ones() {
    use limpet_core::table::{encode_snapshot, AffinityStore as _, LruTable, TableConfig};
    const PINS: u32 = 2_000;
    let pki = Pki::new();
    let (mut nodes, ports) = start_nodes(&NODES, pki.server("n", &["127.0.0.2"])).await;
    let redis = Redis::start().await;
    let relay = BlackHole::start(redis.port).await;
    relay.narrow_to(64 * 1024);
    let dir = TempDir::new("narrow-snapshot");
    let snapshot = dir.path().join("terminal.snapshot");
    let bytes = {
        let mut t = LruTable::new(TableConfig::new(10_000, 600_000)).expect("table");
        let n = t.intern(NODES[0].0).expect("intern");
        let now = limpet::clock::now_ms();
        for i in 0..PINS {
            let ip = std::net::Ipv4Addr::from(0x0a00_0000 + i);
            t.put(KeyRef::ip(IpAddr::V4(ip), IpPrefix::HOST), n, now);
        }
        encode_snapshot(&t, now)
    };
    std::fs::write(&snapshot, bytes).expect("snapshot");
    let terminal = format!("snapshot = \"{}\"", snapshot.display());
    let a = Instance::start_raw(
        "narrow",
        &relay.url(),
        (ports.http, ports.tcp),
        &[0, 1, 2],
        "10m",
        "200ms",
        Extra {
            terminal: &terminal,
            ..Extra::default()
        },
    )
    .await;
    a.settled().await;
    assert_eq!(
        redis.count("limpet:terminal:ip:*").await,
        PINS as usize,
        "every pin in the store"
    );
    let st = a.status();
    assert!(
        st.pipeline_commands < 512 && st.up,
        "pipelines shrunk to fit the link: {st:?}"
    );
    a.running.stop().await;
    for n in &mut nodes {
        n.kill().await;
    }
}

/// A key under a pin's name that holds another type (someone's `HSET`): the store answers
/// each command of that key with `WRONGTYPE`, and the key alone is skipped (counted in
/// `key_errors`), while the store stays up and other clients' pins reach it. (Before, the
/// error failed the whole round trip and counted toward the breaker: the client's GET and
/// create opened it, its probe closed it a second later, and it flapped for as long as the
/// client was used.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_of_another_type_is_skipped_and_the_store_stays_up() {
    let sc = Alone::start("wrongtype", "2s").await;
    let (a, redis) = (&sc.a, &sc.redis);
    let src = "127.0.15.10";
    let key = format!("limpet:terminal:ip:{src}");
    let mut c = redis.conn().await.expect("connect");
    redis::cmd("HSET")
        .arg(&key)
        .arg("field")
        .arg("value")
        .query_async::<()>(&mut c)
        .await
        .expect("HSET");
    let before = a.status();
    let node = a.http(src).await;
    // The client used for 3 s: its GET, its create and its expiry refreshes (every second,
    // expire 2s) all meet the hash (the pacing is the load, not a wait for an event).
    let started = tokio::time::Instant::now();
    while started.elapsed() < Duration::from_secs(3) {
        assert_eq!(a.http(src).await, node);
        assert!(a.store_up(), "the store marked down: {:?}", a.status());
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let st = a.status();
    // At most one: a round trip that a loaded machine let time out once is not the hash's.
    assert!(
        st.errors <= before.errors + 1,
        "no round trip failed for the hash: {st:?}"
    );
    assert!(
        st.key_errors >= 3 && st.refreshes > before.refreshes,
        "the GET, the create and a refresh met the hash: {st:?}"
    );
    // The hash is left as it is, and another client's pin reaches the store.
    let kind: String = redis::cmd("TYPE")
        .arg(&key)
        .query_async(&mut c)
        .await
        .expect("TYPE");
    assert_eq!(kind, "hash");
    sc.pin_in_store("127.0.15.11").await;
    sc.stop().await;
}

/// A pin in the store whose value is not text (bytes no node name is): an unknown node's, so
/// counted and overwritten by the instance's own choice for the fleet, as a pin naming a
/// node it lacks is. Before, it was passed over uncounted and never healed: each instance
/// kept its own choice of the client for as long as it was used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pin_in_the_store_that_is_not_text_is_healed_as_an_unknown_node() {
    let sc = Alone::start("not-text", "10m").await;
    let (a, redis) = (&sc.a, &sc.redis);
    let src = "127.0.15.40";
    let key = format!("limpet:terminal:ip:{src}");
    let mut c = redis.conn().await.expect("connect");
    redis::cmd("SET")
        .arg(&key)
        .arg(&[0xffu8, 0xfe, b'a'][..])
        .arg("PX")
        .arg(60_000)
        .query_async::<()>(&mut c)
        .await
        .expect("SET");
    let unknown = a.status().unknown_nodes;
    let got = a.http(src).await;
    until("the store holds the client's node", async || {
        redis.get(&key).await.as_deref() == Some(got.as_str())
    })
    .await;
    assert_eq!(a.http(src).await, got);
    let st = a.status();
    assert_eq!(
        st.unknown_nodes - unknown,
        2,
        "the GET and the create's answer met it: {st:?}"
    );
    sc.stop().await;
}

/// The nodes, a store whose user `fleet` (password `pw`) has `rules`, and an instance that
/// reaches the store as that user.
async fn as_store_user(tag: &str, rules: &[&str]) -> (Vec<TestNode>, Redis, Instance) {
    let pki = Pki::new();
    let (nodes, ports) = start_nodes(&NODES, pki.server("n", &["127.0.0.2"])).await;
    let redis = Redis::start().await;
    acl(&redis, rules).await;
    let url = format!("redis://fleet:pw@127.0.0.1:{}/0", redis.port);
    let a = Instance::start_raw(
        tag,
        &url,
        (ports.http, ports.tcp),
        &[0, 1, 2],
        "10m",
        "500ms",
        Extra::default(),
    )
    .await;
    (nodes, redis, a)
}

/// `ACL SETUSER fleet RULES...` on the store: the store user of the ACL tests.
async fn acl(redis: &Redis, rules: &[&str]) {
    let args: Vec<&str> = ["SETUSER", "fleet"]
        .into_iter()
        .chain(rules.iter().copied())
        .collect();
    redis.run("ACL", &args).await;
}

/// A store user refused a command limpet needs (here `EVAL`, a re-pin's write; `GETEX`, or
/// a Redis before 7.0 and its `SET .. NX GET`, alike) while `SET` is allowed: the store is
/// down from the start and stays down, its probe refused every second (no flapping), the
/// instance serving from its local table; once the user may run it, the store is up
/// within a second and the pins made meanwhile reach it. Before, the probe (a `SET`)
/// passed: the store read as up, and each re-pin's refused write opened the breaker, which
/// the next probe closed again, for as long as the user lacked the command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_user_refused_a_command_limpet_needs_keeps_the_store_down_without_flapping() {
    let (mut nodes, redis, a) =
        as_store_user("acl-no-eval", &["on", ">pw", "~*", "&*", "+@all", "-eval"]).await;
    // Clients and a re-pin for 3 s, and the probes of each second (the pacing is the load,
    // not a wait for an event): never up.
    let src = "127.0.18.1";
    let first = a.http(src).await;
    maint(&a, &first);
    let mut n = 0;
    let started = tokio::time::Instant::now();
    while started.elapsed() < Duration::from_secs(3) {
        n += 1;
        a.http(&format!("127.0.18.{}", 10 + n % 200)).await;
        assert!(!a.store_up(), "the store read as up: {:?}", a.status());
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let moved = a.http(src).await;
    assert_ne!(moved, first);
    acl(&redis, &["+eval"]).await;
    until("the store is up", async || a.store_up()).await;
    until("the re-pin made meanwhile reaches the store", async || {
        redis
            .get(&format!("limpet:terminal:ip:{src}"))
            .await
            .as_deref()
            == Some(moved.as_str())
    })
    .await;
    a.running.stop().await;
    for n in &mut nodes {
        n.kill().await;
    }
}

/// A store user without access to the re-pin channel (what Redis 7 gives a new ACL user:
/// `resetchannels`): every re-pin's write publishes on it, so the store is refused what
/// limpet needs, and stays down (its probe publishes too): the instance serves from its
/// local table, and the subscription's refusal is counted. Given the channel, the store is
/// up within a second, subscribed, and the pins made meanwhile reach it. Before, the store
/// read as up (first pins reached it) while every re-pin's write was refused: the breaker
/// opened at the first failover and the probe closed it again, and the re-pins it kept
/// failed each resync, for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_user_without_the_re_pin_channel_keeps_the_store_down_until_given_it() {
    let (mut nodes, redis, a) = as_store_user(
        "acl-channel",
        &["on", ">pw", "~*", "+@all", "resetchannels"],
    )
    .await;
    let node = a.http("127.0.17.1").await;
    until("the subscription is refused", async || {
        a.status().subscribe_failures > 0
    })
    .await;
    let st = a.status();
    assert!(!st.up && !st.subscribed, "{st:?}");
    acl(&redis, &["&limpet:pins"]).await;
    until("the store is up and subscribed", async || {
        let st = a.status();
        st.up && st.subscribed
    })
    .await;
    until("the pin made meanwhile reaches the store", async || {
        redis.get("limpet:terminal:ip:127.0.17.1").await.as_deref() == Some(node.as_str())
    })
    .await;
    a.running.stop().await;
    for n in &mut nodes {
        n.kill().await;
    }
}

/// A store that refuses writes but answers reads and `PING` (out of memory here:
/// `maxmemory` under what it holds, no eviction): the refused writes open the breaker, which
/// stays open while the store refuses them (its probe is a write), and closes once the store
/// takes writes again; the pins made meanwhile are published then. (Before, a `PING` probe
/// closed it every second and the next writes opened it again.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_refuses_writes_stays_down_until_it_takes_them_again() {
    let sc = Alone::start("refusing", "10m").await;
    let (a, redis) = (&sc.a, &sc.redis);
    maxmemory(redis, 1).await;
    breaker_opened_by_new_clients(a, "127.0.16").await;
    // Three of its once-a-second probes, each refused (the observation window is the
    // check, not a wait for an event).
    let started = tokio::time::Instant::now();
    while started.elapsed() < Duration::from_secs(3) {
        assert!(
            !a.store_up(),
            "the breaker closed on a store refusing writes"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    maxmemory(redis, 0).await;
    until("the store is up again", async || a.store_up()).await;
    a.settled().await;
    until(
        "the pins made while it refused reach the store",
        async || redis.get("limpet:terminal:ip:127.0.16.1").await.is_some(),
    )
    .await;
    sc.stop().await;
}
