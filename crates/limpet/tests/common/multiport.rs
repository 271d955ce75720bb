//! Helpers for the multi-listener tests (`print_server`, `tcp_*`, `tls_*`, `config_*`):
//! test certificates made at run time (rcgen, never committed), nodes that each run an HTTP
//! service, an HTTPS service and a raw TCP service naming the node, and clients that connect
//! from a chosen loopback source address (the whole 127.0.0.0/8 is local on Linux).
//!
//! Every service is bound before its task starts, and every one is stopped by its handle
//! (like a crash: listener closed, connections cut).

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use limpet::config::Config;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::oneshot;
use tokio::task::{JoinHandle, JoinSet};

use super::PATIENCE;

/// A directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "limpet-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn write(&self, name: &str, content: impl AsRef<[u8]>) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, content).expect("write temp file");
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A test CA, and certificates it issues, as PEM files in a temp dir.
pub struct Pki {
    pub dir: TempDir,
    pub ca_pem: PathBuf,
    ca: rcgen::Certificate,
    ca_key: rcgen::KeyPair,
}

impl Pki {
    pub fn new() -> Pki {
        let dir = TempDir::new("pki");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("ca params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "limpet test CA");
        let ca_key = rcgen::KeyPair::generate().expect("ca key");
        let ca = params.self_signed(&ca_key).expect("ca cert");
        let ca_pem = dir.write("ca.pem", ca.pem());
        Pki {
            dir,
            ca_pem,
            ca,
            ca_key,
        }
    }

    /// A certificate for `names` (DNS names or IP addresses) signed by the CA: `(cert, key)`
    /// PEM paths named after `stem`.
    pub fn issue(&self, stem: &str, names: &[&str]) -> (PathBuf, PathBuf) {
        let params =
            rcgen::CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .expect("params");
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = params
            .signed_by(&key, &self.ca, &self.ca_key)
            .expect("sign");
        let c = self.dir.write(&format!("{stem}.pem"), cert.pem());
        let k = self.dir.write(&format!("{stem}.key"), key.serialize_pem());
        (c, k)
    }

    /// A client config trusting this CA, offering `alpn`.
    pub fn client(&self, alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        let pem = std::fs::read(&self.ca_pem).expect("ca pem");
        use rustls::pki_types::pem::PemObject;
        for c in rustls::pki_types::CertificateDer::pem_slice_iter(&pem) {
            roots.add(c.expect("ca der")).expect("add ca");
        }
        let mut cfg = rustls::ClientConfig::builder_with_provider(limpet::tls::provider())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Arc::new(cfg)
    }

    /// A server config with one certificate for `names`.
    pub fn server(&self, stem: &str, names: &[&str]) -> Arc<rustls::ServerConfig> {
        let (cert, key) = self.issue(stem, names);
        let spec = limpet::tls::CertSpec {
            cert: &cert,
            key: &key,
            names: &[],
        };
        Arc::new(limpet::tls::server_config(&[spec], &[]).expect("server config"))
    }
}

/// One service task, stopped like a crash.
pub struct Service {
    kill: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Service {
    pub async fn kill(&mut self) {
        if let Some(tx) = self.kill.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

/// Accepts on `listener`, running `handler` per connection, until killed; then every
/// connection is cut.
fn spawn_service<F, Fut>(listener: TcpListener, handler: F) -> Service
where
    F: Fn(TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, mut rx) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let mut conns = JoinSet::new();
        loop {
            tokio::select! {
                _ = &mut rx => break,
                r = listener.accept() => {
                    if let Ok((s, _)) = r {
                        conns.spawn(handler(s));
                    }
                }
            }
        }
        conns.abort_all();
        while conns.join_next().await.is_some() {}
    });
    Service {
        kill: Some(tx),
        task: Some(task),
    }
}

/// Upgrades to `GET /held-upgrade` that have reached a node (one permit each).
pub static HELD_UPGRADES_ARRIVED: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(0);
/// Permits for held upgrades to be answered 101 (one each; a test adds them).
pub static HELD_UPGRADES_RELEASED: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(0);
/// A WebSocket upgrade to `/held-upgrade`, as a client sends it.
pub const HELD_UPGRADE_REQUEST: &[u8] = b"GET /held-upgrade HTTP/1.1\r\nHost: print.example\r\n\
    Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
    Sec-WebSocket-Version: 13\r\n\r\n";

/// Answers every HTTP/1.1 request on `io` with `node NAME` (keep-alive until the client asks
/// to close or closes); `GET /slow?ms=N&on=NAME` waits N ms first on node NAME (a slow page
/// of an UP node), and answers at once on the others; `GET /drop?on=NAME` closes the
/// connection unanswered on node NAME (an UP node that loses one request). `GET /held-upgrade` (any node) is an
/// upgrade the node answers 101 only once a test releases it ([`HELD_UPGRADES_RELEASED`],
/// at most [`PATIENCE`]), telling it arrived ([`HELD_UPGRADES_ARRIVED`]); the connection
/// then stays open, silent, until the other side closes it.
async fn respond<I: AsyncRead + AsyncWrite + Unpin>(mut io: I, name: Arc<str>) {
    let mut buf = Vec::new();
    loop {
        let end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let mut chunk = [0u8; 2048];
            match io.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
        buf.drain(..end);
        let drop_here = head
            .strip_prefix("get /drop?on=")
            .and_then(|r| r.split(' ').next())
            .is_some_and(|on| on.eq_ignore_ascii_case(&name));
        if drop_here {
            return;
        }
        if head.starts_with("get /held-upgrade ") {
            HELD_UPGRADES_ARRIVED.add_permits(1);
            if let Ok(Ok(p)) =
                tokio::time::timeout(PATIENCE, HELD_UPGRADES_RELEASED.acquire()).await
            {
                p.forget();
            }
            let switched = format!(
                "HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\nx-limpet-node: {name}\r\n\r\n"
            );
            if io.write_all(switched.as_bytes()).await.is_ok() {
                let mut sink = [0u8; 1024];
                while let Ok(n) = io.read(&mut sink).await {
                    if n == 0 {
                        break;
                    }
                }
            }
            return;
        }
        let slow = head
            .strip_prefix("get /slow?ms=")
            .and_then(|r| r.split(' ').next())
            .and_then(|q| q.split_once("&on="))
            .filter(|(_, on)| on.eq_ignore_ascii_case(&name))
            .and_then(|(ms, _)| ms.parse::<u64>().ok());
        if let Some(ms) = slow {
            tokio::time::sleep(Duration::from_millis(ms.min(10_000))).await;
        }
        let body = format!("node {name}");
        let close = head.contains("connection: close");
        // Like an application server: a session cookie for a client that has none yet.
        let session = if head.contains("\ncookie:") && head.contains("jsessionid=") {
            String::new()
        } else {
            format!("set-cookie: JSESSIONID=sess-{name}; Path=/\r\n")
        };
        // The request id limpet gave the request, echoed so tests can see which listener
        // instance (worker thread) served it.
        let id = head
            .split("\r\n")
            .find_map(|l| l.strip_prefix("x-request-id: "))
            .unwrap_or("-")
            .to_owned();
        let resp = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nx-limpet-node: {name}\r\nx-seen-request-id: {id}\r\n{session}{}\r\n{body}",
            body.len(),
            if close { "connection: close\r\n" } else { "" }
        );
        if io.write_all(resp.as_bytes()).await.is_err() || close {
            let _ = io.shutdown().await;
            return;
        }
    }
}

/// Greets with `node=NAME\n`, then echoes until the client ends its side, then ends ours.
async fn echo<I: AsyncRead + AsyncWrite + Unpin>(mut io: I, name: Arc<str>) {
    if io
        .write_all(format!("node={name}\n").as_bytes())
        .await
        .is_err()
    {
        return;
    }
    let mut buf = [0u8; 4096];
    loop {
        match io.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if io.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
    let _ = io.shutdown().await;
}

/// The ports every node of a scenario serves on (the same on each node: listeners forward to
/// one `node_port`).
#[derive(Debug, Clone, Copy)]
pub struct Ports {
    pub http: u16,
    pub https: u16,
    pub tcp: u16,
}

/// A node: an HTTP, an HTTPS and a raw TCP service on one loopback address.
pub struct TestNode {
    pub name: String,
    pub ip: IpAddr,
    services: Vec<Service>,
}

impl TestNode {
    /// Crashes the node: every service closed, every connection cut.
    pub async fn kill(&mut self) {
        for s in &mut self.services {
            s.kill().await;
        }
    }
}

async fn bind(ip: IpAddr, port: u16) -> Option<TcpListener> {
    TcpListener::bind(SocketAddr::new(ip, port)).await.ok()
}

/// Starts nodes at these addresses, all serving on the same three ports.
pub async fn start_nodes(
    nodes: &[(&str, &str)],
    tls: Arc<rustls::ServerConfig>,
) -> (Vec<TestNode>, Ports) {
    'attempt: for _ in 0..50 {
        let ips: Vec<IpAddr> = nodes
            .iter()
            .map(|(_, ip)| ip.parse().expect("ip"))
            .collect();
        // The first node picks free ports; the others must get the same ones.
        let mut first = Vec::new();
        for _ in 0..3 {
            first.push(bind(ips[0], 0).await.expect("bind first node"));
        }
        let ports: Vec<u16> = first
            .iter()
            .map(|l| l.local_addr().map(|a| a.port()).unwrap_or(0))
            .collect();
        let mut all = vec![first];
        for ip in &ips[1..] {
            let mut ls = Vec::new();
            for p in &ports {
                match bind(*ip, *p).await {
                    Some(l) => ls.push(l),
                    None => continue 'attempt,
                }
            }
            all.push(ls);
        }
        let mut out = Vec::new();
        for ((name, _), (ip, mut ls)) in nodes.iter().zip(ips.into_iter().zip(all)) {
            let tcp = ls.pop().expect("tcp");
            let https = ls.pop().expect("https");
            let http = ls.pop().expect("http");
            let n: Arc<str> = Arc::from(*name);
            let mut services = Vec::new();
            {
                let n = Arc::clone(&n);
                services.push(spawn_service(http, move |s| respond(s, Arc::clone(&n))));
            }
            {
                let n = Arc::clone(&n);
                let acceptor = tokio_rustls::TlsAcceptor::from(Arc::clone(&tls));
                services.push(spawn_service(https, move |s| {
                    let n = Arc::clone(&n);
                    let acceptor = acceptor.clone();
                    async move {
                        if let Ok(t) = acceptor.accept(s).await {
                            respond(t, n).await;
                        }
                    }
                }));
            }
            {
                let n = Arc::clone(&n);
                services.push(spawn_service(tcp, move |s| echo(s, Arc::clone(&n))));
            }
            out.push(TestNode {
                name: (*name).to_owned(),
                ip,
                services,
            });
        }
        return (
            out,
            Ports {
                http: ports[0],
                https: ports[1],
                tcp: ports[2],
            },
        );
    }
    panic!("could not find common free ports for the test nodes");
}

/// A TCP connection to `dst` from source address `src` (any port).
pub async fn connect_from(src: IpAddr, dst: SocketAddr) -> TcpStream {
    let sock = match src {
        IpAddr::V4(_) => TcpSocket::new_v4(),
        IpAddr::V6(_) => TcpSocket::new_v6(),
    }
    .expect("socket");
    sock.bind(SocketAddr::new(src, 0)).expect("bind client");
    tokio::time::timeout(PATIENCE, sock.connect(dst))
        .await
        .expect("connect in time")
        .expect("connect")
}

/// GET / with `Connection: close` over `io`; the node name from the answer body. Returns
/// the whole answer head too.
pub async fn get_over<I: AsyncRead + AsyncWrite + Unpin>(io: I) -> (String, String) {
    get_with(io, "").await
}

/// [`get_over`] with extra header lines (each ending in `\r\n`).
pub async fn get_with<I: AsyncRead + AsyncWrite + Unpin>(io: I, extra: &str) -> (String, String) {
    let req = format!("GET / HTTP/1.1\r\nHost: print.example\r\n{extra}Connection: close\r\n\r\n");
    get_raw(io, &req).await
}

/// Sends `req` (a whole request that asks to close) over `io`; the answer head and the node
/// name from the answer body.
pub async fn get_raw<I: AsyncRead + AsyncWrite + Unpin>(mut io: I, req: &str) -> (String, String) {
    io.write_all(req.as_bytes()).await.expect("send request");
    let mut out = Vec::new();
    let _ = tokio::time::timeout(PATIENCE, io.read_to_end(&mut out))
        .await
        .expect("answer in time");
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    (
        head.to_owned(),
        body.trim().trim_start_matches("node ").to_owned(),
    )
}

/// The node that answers GET / through a plain HTTP listener, from `src`.
pub async fn http_node(src: &str, addr: SocketAddr) -> String {
    let s = connect_from(src.parse().expect("ip"), addr).await;
    get_over(s).await.1
}

/// The node that answers GET / through an HTTPS listener, from `src`.
pub async fn https_node(src: &str, addr: SocketAddr, client: &Arc<rustls::ClientConfig>) -> String {
    let s = connect_from(src.parse().expect("ip"), addr).await;
    let tls = tokio_rustls::TlsConnector::from(Arc::clone(client))
        .connect(ServerName::try_from("print.example").expect("name"), s)
        .await
        .expect("TLS to limpet");
    get_over(tls).await.1
}

/// Opens a TCP session through a TCP listener from `src`; returns it and the node that
/// greeted it.
pub async fn tcp_session(src: &str, addr: SocketAddr) -> (TcpStream, String) {
    let mut s = connect_from(src.parse().expect("ip"), addr).await;
    let line = read_line(&mut s).await;
    (s, line.trim_start_matches("node=").to_owned())
}

/// Reads one `\n`-terminated line (without it), byte by byte (tests only).
pub async fn read_line<I: AsyncRead + Unpin>(io: &mut I) -> String {
    let mut line = Vec::new();
    loop {
        let mut b = [0u8; 1];
        let n = tokio::time::timeout(PATIENCE, io.read(&mut b))
            .await
            .expect("line in time")
            .expect("read line");
        if n == 0 || b[0] == b'\n' {
            break;
        }
        line.push(b[0]);
    }
    String::from_utf8_lossy(&line).into_owned()
}

/// Validates `text` as `limpet.toml` in `dir`.
pub fn config(dir: &TempDir, text: &str) -> Config {
    let path = dir.write("limpet.toml", text);
    Config::from_text(&path, text).unwrap_or_else(|e| panic!("config: {e}\n{text}"))
}
