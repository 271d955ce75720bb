//! Running out of file descriptors (issue 13, finding 2): requests fail while limpet cannot
//! open a socket to the node, but the node is not held responsible: once descriptors are
//! free again, the next request is served at once (the node was never taken DOWN).
//!
//! A test binary of its own: it lowers this process's descriptor limit (with `prlimit`, on
//! its own PID) and fills it, which would disturb any other test sharing the process.

mod common;

use bytes::Bytes;
use common::{config, nodes, Proxy, PATIENCE};
use http_body_util::{BodyExt, Empty};
use tokio::net::TcpStream;

#[tokio::test]
async fn out_of_file_descriptors_never_takes_a_node_down() {
    let ns = nodes(&["a"]).await;
    let mut cfg = config(&ns);
    // Every request opens a fresh node connection (nothing pooled to hide the failure).
    cfg.limits.max_idle_per_node = 0;
    let proxy = Proxy::start(cfg).await;
    // One keep-alive client connection, opened while descriptors are plenty.
    let stream = TcpStream::connect(proxy.addr).await.expect("connect");
    let (mut sender, conn) = hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .expect("handshake");
    tokio::spawn(conn);
    assert_eq!(get(&mut sender).await, 200);

    // Lower this process's limit and fill it.
    let pid = std::process::id().to_string();
    let limit = std::process::Command::new("prlimit")
        .args(["--pid", &pid, "--nofile=512"])
        .status()
        .expect("prlimit");
    assert!(limit.success());
    let mut hogs = Vec::new();
    for _ in 0..1024 {
        match std::fs::File::open("/dev/null") {
            Ok(f) => hogs.push(f),
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(24), "{e}");
                break;
            }
        }
    }
    assert!(std::fs::File::open("/dev/null").is_err(), "limit reached");

    // More failures than the fall count (3): none is the node's.
    for _ in 0..5 {
        assert_eq!(get(&mut sender).await, 503, "no socket to the node");
    }
    drop(hogs);
    assert_eq!(
        get(&mut sender).await,
        200,
        "recovers by itself; the node is still UP"
    );
    proxy.stop().await;
}

async fn get(sender: &mut hyper::client::conn::http1::SendRequest<Empty<Bytes>>) -> u16 {
    let req = http::Request::get("/")
        .header("host", "t")
        .body(Empty::new())
        .expect("request");
    let resp = tokio::time::timeout(PATIENCE, sender.send_request(req))
        .await
        .expect("answered in time")
        .expect("answer");
    let status = resp.status().as_u16();
    let _ = resp.into_body().collect().await;
    status
}
