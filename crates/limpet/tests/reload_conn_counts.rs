//! Open-connection counts survive a reload: they are kept per node *name* by the process's
//! lifecycle, not per `State`, so a TCP session opened before a reload still counts on its
//! node after it (admin view, drain completion) and least-connections still sees it.

mod admin_common;

use std::net::{IpAddr, SocketAddr};

use admin_common::lifecycle::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Echo nodes on these loopback addresses, all on one port (returned). Every connection
/// stays open until its client closes it.
async fn echo_nodes(ips: &[&str]) -> (Vec<tokio::task::JoinHandle<()>>, u16) {
    'attempt: for _ in 0..50 {
        let ips: Vec<IpAddr> = ips
            .iter()
            .map(|ip| ip.parse().unwrap_or_else(|e| panic!("{ip}: {e}")))
            .collect();
        let first = TcpListener::bind(SocketAddr::new(ips[0], 0))
            .await
            .unwrap_or_else(|e| panic!("bind: {e}"));
        let port = first.local_addr().map(|a| a.port()).unwrap_or(0);
        let mut ls = vec![first];
        for ip in &ips[1..] {
            match TcpListener::bind(SocketAddr::new(*ip, port)).await {
                Ok(l) => ls.push(l),
                Err(_) => continue 'attempt,
            }
        }
        let tasks = ls
            .into_iter()
            .map(|l| {
                tokio::spawn(async move {
                    while let Ok((mut s, _)) = l.accept().await {
                        tokio::spawn(async move {
                            let mut buf = [0u8; 256];
                            while let Ok(n) = s.read(&mut buf).await {
                                if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                                    break;
                                }
                            }
                        });
                    }
                })
            })
            .collect();
        return (tasks, port);
    }
    panic!("no common free port for the test nodes");
}

fn config(port: u16) -> String {
    format!(
        "{}[[listeners]]\nname = \"raw\"\nbind = \"127.0.0.1:0\"\nmode = \"tcp\"\n\
         node_port = {port}\nbalance = \"leastconn\"\n\n[admin]\nlisten = \"127.0.0.1:0\"\n",
        nodes_toml(&[("a", "127.0.0.2"), ("b", "127.0.0.3")])
    )
}

/// A TCP session through limpet, established end to end (one echo round trip).
async fn session(l: &Limpet) -> TcpStream {
    let mut s = TcpStream::connect(l.addr("raw"))
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"));
    s.write_all(b"ping").await.unwrap_or_else(|e| panic!("{e}"));
    let mut buf = [0u8; 4];
    tokio::time::timeout(PATIENCE, s.read_exact(&mut buf))
        .await
        .unwrap_or_else(|_| panic!("no echo"))
        .unwrap_or_else(|e| panic!("echo: {e}"));
    assert_eq!(&buf, b"ping");
    s
}

fn active(l: &Limpet) -> Vec<(String, u32)> {
    let rt = l.running.as_ref().map(|r| r.runtime().state());
    rt.map(|s| {
        s.node_views()
            .into_iter()
            .map(|v| (v.name, v.active))
            .collect()
    })
    .unwrap_or_default()
}

/// Waits (bounded) until the counts read `want`: a closed session's guard drops on limpet's
/// side once it sees the close, which is not synchronous with the client's close.
async fn wait_active(l: &Limpet, want: &[(&str, u32)]) {
    let want: Vec<(String, u32)> = want.iter().map(|(n, c)| ((*n).to_owned(), *c)).collect();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let got = active(l);
        if got == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "active counts {got:?}, want {want:?}"
        );
        tokio::task::yield_now().await;
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_sessions_still_count_after_a_reload_and_leastconn_sees_them() {
    let (_nodes, port) = echo_nodes(&["127.0.0.2", "127.0.0.3"]).await;
    let cfg = ConfigFile::new("reload-counts", &config(port));
    let l = Limpet::start(&cfg).await;

    // Rotation 0 -> a; then leastconn sends the second to b (a holds one).
    let held_a = session(&l).await;
    let held_b = session(&l).await;
    wait_active(&l, &[("a", 1), ("b", 1)]).await;
    drop(held_b);
    wait_active(&l, &[("a", 1), ("b", 0)]).await;

    // Same nodes; a new State and pool. a's session is still open.
    let (s, report) = reload(&l).await;
    assert_eq!(s, 200, "{report}");
    wait_active(&l, &[("a", 1), ("b", 0)]).await;
    let v = node_view(&l, "a").await;
    assert_eq!(v["active_connections"], 1, "{v}");

    // Least-connections after the reload: the busy node is avoided. (With the counts reset
    // it would be a tie, and the carried rotation, 2, would pick a.)
    let fresh = session(&l).await;
    wait_active(&l, &[("a", 1), ("b", 1)]).await;
    drop(fresh);

    // A drain of a is not complete while the pre-reload session is open.
    set_state(&l, "a", r#"{"state":"drain"}"#).await;
    let v = node_view(&l, "a").await;
    assert_eq!(v["drain"]["complete"], false, "{v}");

    // Closing the pre-reload session brings a back to 0 on the new state.
    drop(held_a);
    wait_active(&l, &[("a", 0), ("b", 0)]).await;
    l.stop().await;
}
