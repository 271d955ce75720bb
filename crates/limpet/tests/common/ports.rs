//! Two nodes on one port, as one listener's `node_port` reaches them. Depends on tokio only, so
//! both helper trees (`common`, `admin_common`) include it.

use tokio::net::TcpListener;

/// Two listening sockets on one free port, of 127.0.0.2 and of 127.0.0.3 (nodes a and b:
/// one listener's `node_port` reaches both), and the port.
pub async fn common_port_pair() -> (TcpListener, TcpListener, u16) {
    for _ in 0..50 {
        let a = TcpListener::bind("127.0.0.2:0")
            .await
            .unwrap_or_else(|e| panic!("bind node a: {e}"));
        let port = a.local_addr().map(|a| a.port()).unwrap_or(0);
        if let Ok(b) = TcpListener::bind(("127.0.0.3", port)).await {
            return (a, b, port);
        }
    }
    panic!("no common free port for the two nodes");
}
