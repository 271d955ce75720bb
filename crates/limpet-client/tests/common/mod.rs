//! Small real servers on 127.0.0.1:0 for the adapter tests. Each one answers a fixed script,
//! reports every request head it saw over a channel (so tests wait on data, never on time),
//! and is stopped when dropped.

#![allow(dead_code, unreachable_pub)] // each test binary uses part of it

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// A running server: its address, the request heads it received, and its task.
pub struct Server {
    pub addr: SocketAddr,
    heads: mpsc::UnboundedReceiver<RequestHead>,
    task: JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Server {
    /// `http://127.0.0.1:port`, or another scheme on the same address.
    pub fn url(&self, scheme: &str, path: &str) -> String {
        format!("{scheme}://{}{path}", self.addr)
    }

    /// The next request head the server received (waits for it).
    pub async fn next_request(&mut self) -> RequestHead {
        self.heads
            .recv()
            .await
            .expect("server stopped before a request")
    }
}

/// What the server saw of one request.
#[derive(Debug, Clone)]
pub struct RequestHead {
    pub request_line: String,
    /// Header (name lower-cased, value) pairs in arrival order.
    pub headers: Vec<(String, String)>,
}

impl RequestHead {
    /// All `Cookie` header values, in order.
    pub fn cookies(&self) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n == "cookie")
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// The only `Cookie` header value, or `None` when there is none; panics if several.
    pub fn cookie(&self) -> Option<&str> {
        let all = self.cookies();
        assert!(all.len() <= 1, "several Cookie headers: {all:?}");
        all.first().copied()
    }
}

fn parse_head(raw: &str) -> RequestHead {
    let mut lines = raw.split("\r\n");
    let request_line = lines.next().unwrap_or_default().to_owned();
    let headers = lines
        .filter(|l| !l.is_empty())
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    RequestHead {
        request_line,
        headers,
    }
}

/// An HTTP/1.1 server that answers the k-th connection with `answers[k]` (a whole raw
/// response) and closes it. Connections beyond the script get a 500.
pub async fn http_server(answers: Vec<String>) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let (tx, heads) = mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        let mut answers = answers.into_iter();
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let answer = answers
                .next()
                .unwrap_or_else(|| response(500, &[], "unscripted"));
            serve_one(stream, &answer, &tx).await;
        }
    });
    Server { addr, heads, task }
}

async fn serve_one(mut stream: TcpStream, answer: &str, tx: &mpsc::UnboundedSender<RequestHead>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let _ = tx.send(parse_head(&String::from_utf8_lossy(&buf)));
    let _ = stream.write_all(answer.as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// A raw HTTP/1.1 response with these `Set-Cookie` lines, a body, and `Connection: close`.
pub fn response(status: u16, set_cookies: &[&str], body: &str) -> String {
    let mut r = format!("HTTP/1.1 {status} Scripted\r\n");
    for c in set_cookies {
        r.push_str(&format!("Set-Cookie: {c}\r\n"));
    }
    r.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    ));
    r
}
