//! Nodes on one port, as one listener's `node_port` reaches them. Depends on tokio only, so
//! both helper trees (`common`, `admin_common`) include it.

use tokio::net::TcpListener;

/// Two listening sockets on one free port, of 127.0.0.2 and of 127.0.0.3 (nodes a and b:
/// one listener's `node_port` reaches both), and the port.
pub async fn common_port_pair() -> (TcpListener, TcpListener, u16) {
    let (mut l, port) = common_port_on(&["127.0.0.2", "127.0.0.3"]).await;
    let b = l.pop().unwrap_or_else(|| panic!("two sockets"));
    let a = l.pop().unwrap_or_else(|| panic!("two sockets"));
    (a, b, port)
}

/// A listening socket of each of `ips` on one free port (one node each, which one
/// listener's `node_port` reaches), in their order, and the port.
pub async fn common_port_on(ips: &[&str]) -> (Vec<TcpListener>, u16) {
    'again: for _ in 0..50 {
        let first = TcpListener::bind((ips[0], 0))
            .await
            .unwrap_or_else(|e| panic!("bind {}: {e}", ips[0]));
        let port = first.local_addr().map(|a| a.port()).unwrap_or(0);
        let mut all = vec![first];
        for ip in &ips[1..] {
            match TcpListener::bind((*ip, port)).await {
                Ok(l) => all.push(l),
                Err(_) => continue 'again,
            }
        }
        return (all, port);
    }
    panic!("no common free port for the nodes {ips:?}");
}
