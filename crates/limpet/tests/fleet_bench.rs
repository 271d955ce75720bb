//! Fleet-mode figures for the README (ignored: run by `bench/fleet.sh`, in release mode).
//!
//! One limpet with two HTTP listeners in front of the same three nodes, one on a local
//! source-IP table and one on a shared one (through a real `redis-server`), measured in the
//! same run, alternating, loopback only, every loop bounded in count and time:
//!
//! 1. sticky requests/s: keep-alive connections from distinct source addresses, every
//!    request after the first a table hit;
//! 2. the latency of a first pin: a new source address, one connection, one request;
//! 3. the store traffic per thousand sessions (commands the server processed, and limpet's
//!    own counts), each session five requests.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::multiport::{config, connect_from, start_nodes, Pki, TempDir};
use common::store_server::Redis;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use limpet::runtime::start;

const CONNS: usize = 32;
const ROUND: Duration = Duration::from_secs(3);
const ROUNDS: usize = 3;
const FIRST_PINS: usize = 300;
const SESSIONS: usize = 1000;

type Sender = hyper::client::conn::http1::SendRequest<Empty<Bytes>>;

async fn open(src: std::net::IpAddr, to: SocketAddr) -> Sender {
    let s = connect_from(src, to).await;
    let (tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    tx
}

async fn get(tx: &mut Sender) -> bool {
    try_get(tx).await.is_ok()
}

async fn try_get(tx: &mut Sender) -> Result<(), String> {
    let req = hyper::Request::get("/")
        .header("host", "print.example")
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    // An HTTP/1 connection takes the next request once the last answer is done.
    tx.ready().await.map_err(|e| e.to_string())?;
    let r = tx.send_request(req).await.map_err(|e| e.to_string())?;
    let status = r.status();
    r.into_body().collect().await.map_err(|e| e.to_string())?;
    if status.is_success() {
        Ok(())
    } else {
        Err(status.to_string())
    }
}

/// The `n`-th test source address of a block (127.B.x.y, never .0 or .255).
fn src(block: u8, n: usize) -> std::net::IpAddr {
    let x = (n / 250) as u8;
    let y = (n % 250) as u8 + 1;
    std::net::IpAddr::from([127, block, x, y])
}

/// Requests/s of `CONNS` keep-alive connections for `ROUND`, and the errors.
async fn sticky_rate(to: SocketAddr, block: u8) -> (f64, u64) {
    let mut senders = Vec::new();
    for i in 0..CONNS {
        let mut tx = open(src(block, i), to).await;
        assert!(get(&mut tx).await, "first request");
        senders.push(tx);
    }
    let started = Instant::now();
    let tasks: Vec<_> = senders
        .into_iter()
        .map(|mut tx| {
            tokio::spawn(async move {
                let (mut ok, mut err) = (0u64, 0u64);
                while started.elapsed() < ROUND {
                    if get(&mut tx).await {
                        ok += 1;
                    } else {
                        err += 1;
                    }
                }
                (ok, err)
            })
        })
        .collect();
    let (mut ok, mut err) = (0, 0);
    for t in tasks {
        let (o, e) = t.await.expect("task");
        ok += o;
        err += e;
    }
    (ok as f64 / started.elapsed().as_secs_f64(), err)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * p) as usize]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: bench/fleet.sh"]
async fn fleet_figures() {
    let pki = Pki::new();
    let (_nodes, ports) = start_nodes(
        &[
            ("LVIV", "127.0.0.2"),
            ("KYIV", "127.0.0.3"),
            ("ODESA", "127.0.0.4"),
        ],
        pki.server("n", &["127.0.0.2"]),
    )
    .await;
    let redis = Redis::start().await;
    let dir = TempDir::new("fleet-bench");
    let text = format!(
        r#"
[[nodes]]
name = "LVIV"
address = "127.0.0.2"
[[nodes]]
name = "KYIV"
address = "127.0.0.3"
[[nodes]]
name = "ODESA"
address = "127.0.0.4"

[store]
url = "{url}"

[[tables]]
name = "local"
key = "source-ip"

[[tables]]
name = "shared"
key = "source-ip"
shared = true

[[listeners]]
name = "local"
bind = "127.0.0.1:0"
node_port = {http}
table = "local"

[[listeners]]
name = "shared"
bind = "127.0.0.1:0"
node_port = {http}
table = "shared"
"#,
        url = redis.url(),
        http = ports.http
    );
    let running = start(config(&dir, &text)).await.expect("start");
    let local = running.addr("local").expect("local");
    let shared = running.addr("shared").expect("shared");

    // 1. Sticky requests/s, alternating which table goes first.
    let (mut l_rates, mut s_rates) = (Vec::new(), Vec::new());
    let mut errors = 0;
    for round in 0..ROUNDS {
        let order = if round % 2 == 0 {
            [(local, 10u8, false), (shared, 11u8, true)]
        } else {
            [(shared, 11u8, true), (local, 10u8, false)]
        };
        for (to, block, is_shared) in order {
            let (rate, err) = sticky_rate(to, block).await;
            errors += err;
            if is_shared {
                s_rates.push(rate);
            } else {
                l_rates.push(rate);
            }
        }
    }
    let (l, s) = (median(&mut l_rates), median(&mut s_rates));
    println!("sticky requests/s ({CONNS} keep-alive connections, {ROUNDS} rounds of {ROUND:?}, median): local {l:.0}, shared {s:.0}, shared/local {:.3}x, errors {errors}", s / l);

    // 2. First pins: a new client, one connection, one request, alternating tables.
    let (mut l_first, mut s_first) = (Vec::new(), Vec::new());
    for i in 0..FIRST_PINS {
        for (to, block, out) in [(local, 20u8, &mut l_first), (shared, 21u8, &mut s_first)] {
            let t = Instant::now();
            let mut tx = open(src(block, i), to).await;
            assert!(get(&mut tx).await, "first pin");
            out.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    println!(
        "first pin, connect + one request (ms, {FIRST_PINS} new clients each): local p50 {:.3} p99 {:.3}; shared p50 {:.3} p99 {:.3}; added p50 {:.3}",
        pct(&mut l_first, 0.5),
        pct(&mut l_first, 0.99),
        pct(&mut s_first, 0.5),
        pct(&mut s_first, 0.99),
        pct(&mut s_first, 0.5) - pct(&mut l_first, 0.5)
    );

    // 3. Store traffic per thousand sessions of five requests (the INFO calls themselves are
    // two commands, taken off).
    let store = running.runtime().state().store().cloned().expect("store");
    let before = (redis.stat("total_commands_processed").await, store.status());
    for i in 0..SESSIONS {
        let mut tx = open(src(30, i), shared).await;
        for j in 0..5 {
            if let Err(e) = try_get(&mut tx).await {
                panic!("session {i} request {j}: {e}");
            }
        }
    }
    // Wait (bounded) for the writer to send the last pins.
    let want = before.1.creates + SESSIONS as u64;
    tokio::time::timeout(common::PATIENCE, async {
        while store.status().creates < want {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("every first pin written");
    let after = (redis.stat("total_commands_processed").await, store.status());
    let commands = after.0 - before.0 - 1;
    let per = |a: u64, b: u64| (a - b) as f64 * 1000.0 / SESSIONS as f64;
    println!(
        "store traffic per 1000 sessions of 5 requests: {:.0} commands processed by the server (GET {:.0}, SET NX {:.0}, overwrites {:.0}, refreshes {:.0}; the rest PINGs), {:.0} of them per 1000 requests",
        commands as f64 * 1000.0 / SESSIONS as f64,
        per(after.1.gets, before.1.gets),
        per(after.1.creates, before.1.creates),
        per(after.1.overwrites, before.1.overwrites),
        per(after.1.refreshes, before.1.refreshes),
        commands as f64 * 1000.0 / (SESSIONS * 5) as f64,
    );
    running.stop().await;
}
