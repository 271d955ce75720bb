//! `node_port = "same"`: one listener bound to several ports forwards each client to the port
//! it connected to, on whichever node it is given (HAProxy's servers without a port). An HTTP
//! listener and a TCP listener, each bound on two ports; two nodes, each listening on all four
//! ports; every answer says which node and which of its ports served it.
//!
//! limpet binds port 0 (the kernel picks); the nodes then listen on those same port numbers on
//! their own loopback addresses, which is the point of the feature.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use limpet::config::Config;
use limpet::runtime::start;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

const PATIENCE: Duration = Duration::from_secs(20);
const NODES: [(&str, &str); 2] = [("a", "127.0.0.2"), ("b", "127.0.0.3")];

/// Answers one HTTP request per connection with `node=NAME port=PORT` (the port it was
/// reached on), then closes.
async fn http_service(l: TcpListener, name: &'static str) {
    let port = l.local_addr().map_or(0, |a| a.port());
    let mut conns = JoinSet::new();
    while let Ok((mut s, _)) = l.accept().await {
        conns.spawn(async move {
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            let body = format!("node={name} port={port}");
            let resp = format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = s.write_all(resp.as_bytes()).await;
            let _ = s.shutdown().await;
        });
    }
}

/// Greets every TCP connection with `node=NAME port=PORT\n`.
async fn tcp_service(l: TcpListener, name: &'static str) {
    let port = l.local_addr().map_or(0, |a| a.port());
    while let Ok((mut s, _)) = l.accept().await {
        let _ = s
            .write_all(format!("node={name} port={port}\n").as_bytes())
            .await;
        let _ = s.shutdown().await;
    }
}

/// `(node, port)` from `node=NAME port=PORT`.
fn parse(answer: &str) -> (String, u16) {
    let mut node = String::new();
    let mut port = 0;
    for part in answer.split_whitespace() {
        if let Some(n) = part.strip_prefix("node=") {
            node = n.to_owned();
        } else if let Some(p) = part.strip_prefix("port=") {
            port = p.parse().unwrap_or_else(|e| panic!("{answer:?}: {e}"));
        }
    }
    (node, port)
}

fn config(text: &str) -> Config {
    Config::from_text(Path::new("limpet.toml"), text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

fn nodes_toml() -> String {
    NODES
        .iter()
        .map(|(n, ip)| format!("[[nodes]]\nname = \"{n}\"\naddress = \"{ip}\"\n\n"))
        .collect()
}

/// The addresses listener `name` is bound to.
fn bound(running: &limpet::runtime::run::Running, name: &str) -> Vec<SocketAddr> {
    running
        .addrs()
        .iter()
        .filter(|(n, _)| n == name)
        .map(|(_, a)| *a)
        .collect()
}

#[tokio::test]
async fn each_client_reaches_the_node_on_the_port_it_connected_to() {
    // No cookie and no table: every request and connection is a fresh round-robin
    // assignment, so both nodes serve each port.
    let text = format!(
        "{}[[listeners]]\nname = \"web\"\nbind = [\"127.0.0.1:0\", \"127.0.0.1:0\"]\nnode_port = \"same\"\ncookie = {{ enabled = false }}\n\n[[listeners]]\nname = \"raw\"\nbind = [\"127.0.0.1:0\", \"127.0.0.1:0\"]\nmode = \"tcp\"\nnode_port = \"same\"\n",
        nodes_toml()
    );
    let running = start(config(&text)).await.expect("start limpet");
    let (web, raw) = (bound(&running, "web"), bound(&running, "raw"));
    assert_eq!(web.len(), 2, "two binds: {web:?}");
    assert_eq!(raw.len(), 2, "two binds: {raw:?}");
    assert_ne!(web[0].port(), web[1].port());

    // Every node listens on every port limpet got, on its own address.
    let mut services = JoinSet::new();
    for (name, ip) in NODES {
        for a in &web {
            let l = TcpListener::bind((ip, a.port()))
                .await
                .expect("node http bind");
            services.spawn(http_service(l, name));
        }
        for a in &raw {
            let l = TcpListener::bind((ip, a.port()))
                .await
                .expect("node tcp bind");
            services.spawn(tcp_service(l, name));
        }
    }

    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(PATIENCE)
        .build()
        .expect("client");
    for a in &web {
        let mut seen = BTreeSet::new();
        for _ in 0..4 {
            let body = client
                .get(format!("http://{a}/"))
                .send()
                .await
                .expect("request")
                .text()
                .await
                .expect("body");
            let (node, port) = parse(&body);
            assert_eq!(port, a.port(), "HTTP client on {a} served by {body:?}");
            seen.insert(node);
        }
        assert_eq!(
            seen.len(),
            2,
            "both nodes serve port {}: {seen:?}",
            a.port()
        );
    }
    for a in &raw {
        let mut seen = BTreeSet::new();
        for _ in 0..4 {
            let s = tokio::time::timeout(PATIENCE, TcpStream::connect(a))
                .await
                .expect("connect in time")
                .expect("connect");
            let mut line = String::new();
            tokio::time::timeout(PATIENCE, BufReader::new(s).read_line(&mut line))
                .await
                .expect("greeting in time")
                .expect("greeting");
            let (node, port) = parse(&line);
            assert_eq!(port, a.port(), "TCP client on {a} reached {line:?}");
            seen.insert(node);
        }
        assert_eq!(
            seen.len(),
            2,
            "both nodes serve port {}: {seen:?}",
            a.port()
        );
    }

    running.stop().await;
    services.abort_all();
    while services.join_next().await.is_some() {}
}

/// The error for `text`.
fn error(text: &str) -> String {
    match Config::from_text(Path::new("limpet.toml"), text) {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_check_on_a_same_port_listener_needs_its_own_port() {
    let listener = |check: &str| {
        format!(
            "[[listeners]]\nname = \"tls\"\nbind = [\"192.0.2.1:5012\", \"192.0.2.1:5022\"]\nnode_port = \"same\"\n{check}\n"
        )
    };
    let e = error(&format!(
        "{}{}",
        nodes_toml(),
        listener("check = { kind = \"tcp\" }")
    ));
    // The port is missing: the error points at the check's `kind`.
    assert!(
        e.starts_with("limpet.toml:13:18: listeners[0].check.port: "),
        "{e}"
    );
    assert!(
        e.contains("node_port = \"same\"") && e.contains("check_port"),
        "{e}"
    );

    // A port on the check, or a check_port on every node, is enough.
    let cfg = config(&format!(
        "{}{}",
        nodes_toml(),
        listener("check = { kind = \"tcp\", port = 9000 }")
    ));
    let ports: Vec<u16> = cfg
        .lifecycle
        .checks
        .iter()
        .map(|(_, c)| c.addr.port())
        .collect();
    assert_eq!(ports, [9000, 9000]);
    let nodes = "[[nodes]]\nname = \"a\"\naddress = \"127.0.0.2\"\ncheck_port = 81\n\n[[nodes]]\nname = \"b\"\naddress = \"127.0.0.3\"\ncheck_port = 82\n\n";
    let cfg = config(&format!(
        "{nodes}{}",
        listener("check = { kind = \"tcp\" }")
    ));
    let ports: Vec<u16> = cfg
        .lifecycle
        .checks
        .iter()
        .map(|(_, c)| c.addr.port())
        .collect();
    assert_eq!(ports, [81, 82]);
    // One node without a check_port is still an error, naming that node.
    let nodes = "[[nodes]]\nname = \"a\"\naddress = \"127.0.0.2\"\ncheck_port = 81\n\n[[nodes]]\nname = \"b\"\naddress = \"127.0.0.3\"\n\n";
    let e = error(&format!(
        "{nodes}{}",
        listener("check = { kind = \"tcp\" }")
    ));
    assert!(e.contains("node \"b\""), "{e}");
}

#[test]
fn node_port_takes_a_port_or_same_and_refuses_forwarding_to_itself() {
    let with = |node_port: &str, addr: &str, bind: &str| {
        format!(
            "[[nodes]]\nname = \"a\"\naddress = \"{addr}\"\n\n[[listeners]]\nname = \"l\"\nbind = {bind}\nnode_port = {node_port}\n"
        )
    };
    let e = error(&with("\"sam\"", "127.0.0.2", "\"127.0.0.1:80\""));
    assert!(
        e.starts_with("limpet.toml:8:13: listeners[0].node_port: "),
        "{e}"
    );
    assert!(e.contains("\"same\""), "{e}");
    let e = error(&with("70000", "127.0.0.2", "\"127.0.0.1:80\""));
    assert!(
        e.contains("listeners[0].node_port") && e.contains("not a port"),
        "{e}"
    );

    // The node is limpet's own address: every connection would come back to limpet.
    let e = error(&with("\"same\"", "127.0.0.1", "[\"127.0.0.1:8080\"]"));
    assert!(
        e.starts_with("limpet.toml:8:13: listeners[0].node_port: ") && e.contains("itself"),
        "{e}"
    );
    let e = error(&with("\"same\"", "127.0.0.5", "\"0.0.0.0:8080\""));
    assert!(
        e.contains("itself"),
        "a wildcard bind covers loopback nodes: {e}"
    );
    let e = error(&with("8080", "10.0.0.1", "\"10.0.0.1:8080\""));
    assert!(e.contains("itself"), "{e}");
    // Another port on limpet's own address is another service: allowed.
    config(&with("8081", "127.0.0.1", "\"127.0.0.1:8080\""));

    let cfg = config(&with(
        "\"same\"",
        "127.0.0.2",
        "[\"127.0.0.1:5012\", \"127.0.0.1:5022\"]",
    ));
    let l = &cfg.listeners[0];
    assert!(l.upstreams.is_same_port());
    assert_eq!(
        l.upstreams.get(0, 5022),
        Some("127.0.0.2:5022".parse().expect("addr"))
    );
}

/// A node that stops listening on one port of a `node_port = "same"` listener (a print
/// server whose service on 5022 died while the rest of it runs): a request on that port goes
/// to the other node on that same port, and the session, one source-address table shared by
/// an HTTP and a TCP listener each bound on two ports, moves with it on every port. The
/// node's health is per node: one refused connect counts toward its `fall` whatever port.
#[tokio::test]
async fn a_node_dead_on_one_port_of_a_same_port_listener_moves_the_session_on_every_port() {
    let text = format!(
        "{}[[tables]]\nname = \"t\"\nkey = \"source-ip\"\n\n\
         [[listeners]]\nname = \"web\"\nbind = [\"127.0.0.1:0\", \"127.0.0.1:0\"]\nnode_port = \"same\"\ntable = \"t\"\ncookie = {{ enabled = false }}\n\n\
         [[listeners]]\nname = \"raw\"\nbind = [\"127.0.0.1:0\", \"127.0.0.1:0\"]\nmode = \"tcp\"\nnode_port = \"same\"\ntable = \"t\"\n",
        nodes_toml()
    );
    let running = start(config(&text)).await.expect("start limpet");
    let (web, raw) = (bound(&running, "web"), bound(&running, "raw"));
    let mut services = std::collections::HashMap::new();
    for (name, ip) in NODES {
        for a in &web {
            let l = TcpListener::bind((ip, a.port()))
                .await
                .expect("node http bind");
            services.insert((name, a.port()), tokio::spawn(http_service(l, name)));
        }
        for a in &raw {
            let l = TcpListener::bind((ip, a.port()))
                .await
                .expect("node tcp bind");
            services.insert((name, a.port()), tokio::spawn(tcp_service(l, name)));
        }
    }
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(PATIENCE)
        .build()
        .expect("client");
    let get = |a: SocketAddr| {
        let client = client.clone();
        async move {
            let body = client
                .get(format!("http://{a}/"))
                .send()
                .await
                .expect("request")
                .text()
                .await
                .expect("body");
            let (node, port) = parse(&body);
            assert_eq!(port, a.port(), "HTTP client on {a} served by {body:?}");
            node
        }
    };
    let greeting = |a: SocketAddr| async move {
        let s = tokio::time::timeout(PATIENCE, TcpStream::connect(a))
            .await
            .expect("connect in time")
            .expect("connect");
        let mut line = String::new();
        tokio::time::timeout(PATIENCE, BufReader::new(s).read_line(&mut line))
            .await
            .expect("greeting in time")
            .expect("greeting");
        let (node, port) = parse(&line);
        assert_eq!(port, a.port(), "TCP client on {a} reached {line:?}");
        node
    };
    // The client's pin, the same on every port.
    let home = get(web[0]).await;
    assert_eq!(get(web[1]).await, home);
    for a in &raw {
        assert_eq!(greeting(*a).await, home);
    }
    let other = if home == "a" { "b" } else { "a" };
    // The home node's service on the second web port dies.
    let (dead, _) = NODES
        .iter()
        .find(|(n, _)| *n == home)
        .copied()
        .expect("home is a node");
    let svc = services.remove(&(dead, web[1].port())).expect("service");
    svc.abort();
    let _ = svc.await;
    // A request on that port is the other node's, on that same port; the session follows
    // on every port, TCP ones too.
    assert_eq!(get(web[1]).await, other, "failed over on the dead port");
    assert_eq!(get(web[0]).await, other, "moved on the other web port");
    for a in &raw {
        assert_eq!(greeting(*a).await, other, "moved on raw port {}", a.port());
    }
    // One refused connect, counted for the node as a whole.
    let state = running.runtime().state();
    let rt = state
        .node_rt(state.node_id(dead).expect("node"))
        .expect("runtime");
    assert_eq!(rt.status().health.streak(), 1, "{:?}", rt.status().health);
    drop(state);
    running.stop().await;
    for (_, s) in services {
        s.abort();
    }
}
