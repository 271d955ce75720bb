//! The real runtime for the node-lifecycle tests: built-in demo nodes (`limpet::backend`) on
//! distinct loopback addresses sharing one port, a config file in a temporary directory, and
//! `limpet::runtime::start` with its admin listener on port 0.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use limpet::runtime::{start, Running};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub const PATIENCE: Duration = Duration::from_secs(20);

/// A demo node; killed (like a crash) when dropped or on `kill`.
pub struct BackendNode {
    pub name: String,
    pub ip: IpAddr,
    kill: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl BackendNode {
    pub async fn kill(&mut self) {
        if let Some(tx) = self.kill.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

impl Drop for BackendNode {
    fn drop(&mut self) {
        if let Some(t) = &self.task {
            t.abort();
        }
    }
}

fn serve(name: &str, ip: IpAddr, l: TcpListener) -> BackendNode {
    let (tx, rx) = oneshot::channel();
    let owned = name.to_owned();
    let task = tokio::spawn(async move {
        limpet::backend::serve(&owned, l, async {
            let _ = rx.await;
        })
        .await;
    });
    BackendNode {
        name: name.to_owned(),
        ip,
        kill: Some(tx),
        task: Some(task),
    }
}

/// Starts demo node `name` again on `ip:port` (after [`BackendNode::kill`]).
pub async fn backend_node_again(name: &str, ip: IpAddr, port: u16) -> BackendNode {
    let l = TcpListener::bind(SocketAddr::new(ip, port))
        .await
        .unwrap_or_else(|e| panic!("rebind {ip}:{port}: {e}"));
    serve(name, ip, l)
}

/// Starts demo nodes on these loopback addresses, all on one port (returned).
pub async fn backend_nodes(nodes: &[(&str, &str)]) -> (Vec<BackendNode>, u16) {
    'attempt: for _ in 0..50 {
        let ips: Vec<IpAddr> = nodes
            .iter()
            .map(|(_, ip)| ip.parse().unwrap_or_else(|e| panic!("{ip}: {e}")))
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
        let out = nodes
            .iter()
            .zip(ips)
            .zip(ls)
            .map(|(((name, _), ip), l)| serve(name, ip, l))
            .collect();
        return (out, port);
    }
    panic!("no common free port for the test nodes");
}

/// A config file in its own temporary directory (removed on drop).
pub struct ConfigFile {
    pub dir: PathBuf,
    pub path: PathBuf,
}

impl ConfigFile {
    pub fn new(tag: &str, text: &str) -> ConfigFile {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "limpet-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let path = dir.join("limpet.toml");
        let f = ConfigFile { dir, path };
        f.write(text);
        f
    }

    pub fn write(&self, text: &str) {
        std::fs::write(&self.path, text).unwrap_or_else(|e| panic!("{e}"));
    }

    pub fn load(&self) -> limpet::config::Config {
        limpet::config::Config::load(&self.path).unwrap_or_else(|e| panic!("config: {e}"))
    }
}

impl Drop for ConfigFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `[[nodes]]` entries for these nodes.
pub fn nodes_toml(nodes: &[(&str, &str)]) -> String {
    nodes
        .iter()
        .map(|(n, ip)| format!("[[nodes]]\nname = \"{n}\"\naddress = \"{ip}\"\n\n"))
        .collect()
}

/// A running limpet; stopped when dropped (best effort) or with `stop`.
pub struct Limpet {
    pub running: Option<Running>,
    pub admin: SocketAddr,
}

impl Limpet {
    pub async fn start(cfg: &ConfigFile) -> Limpet {
        let running = start(cfg.load())
            .await
            .unwrap_or_else(|e| panic!("start: {e}"));
        let admin = running
            .runtime()
            .state()
            .lifecycle
            .admin_addr()
            .unwrap_or_else(|| panic!("no admin listener"));
        Limpet {
            running: Some(running),
            admin,
        }
    }

    pub fn addr(&self, listener: &str) -> SocketAddr {
        self.running
            .as_ref()
            .and_then(|r| r.addr(listener))
            .unwrap_or_else(|| panic!("no listener {listener}"))
    }

    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.admin)
    }

    pub async fn stop(mut self) {
        if let Some(r) = self.running.take() {
            let _ = tokio::time::timeout(PATIENCE, r.stop()).await;
        }
    }
}

/// POST /api/v1/reload, the running config file read again: (status, report).
pub async fn reload(l: &Limpet) -> (u16, serde_json::Value) {
    let r = bare_client()
        .post(l.admin_url("/api/v1/reload"))
        .header("content-type", "application/json")
        .send()
        .await
        .unwrap_or_else(|e| panic!("reload: {e}"));
    let s = r.status().as_u16();
    let b = r.bytes().await.unwrap_or_default();
    (
        s,
        serde_json::from_slice(&b).unwrap_or(serde_json::Value::Null),
    )
}

/// A client that keeps no cookies and uses no proxy: tests handle cookies by hand.
pub fn bare_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(PATIENCE)
        .build()
        .unwrap_or_else(|e| panic!("{e}"))
}

/// GET `url` with an optional `Cookie` header: (status, node, Set-Cookie).
pub async fn get(
    client: &reqwest::Client,
    url: &str,
    cookie: Option<&str>,
) -> (u16, String, Option<String>) {
    let mut req = client.get(url);
    if let Some(c) = cookie {
        req = req.header("cookie", c);
    }
    let r = req
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    let node = r
        .headers()
        .get(limpet::backend::NODE_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let set = r
        .headers()
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .map(|s| s.split(';').next().unwrap_or("").to_owned());
    let status = r.status().as_u16();
    let _ = r.bytes().await;
    (status, node, set)
}

/// POSTs a node state through the admin API.
pub async fn set_state(l: &Limpet, node: &str, body: &str) -> serde_json::Value {
    let r = bare_client()
        .post(l.admin_url(&format!("/api/v1/nodes/{node}/state")))
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status().as_u16(), 200, "set {node} {body}");
    let b = r.bytes().await.unwrap_or_default();
    serde_json::from_slice(&b).unwrap_or(serde_json::Value::Null)
}

/// The admin listener's `/metrics` text.
pub async fn metrics_text(l: &Limpet) -> String {
    bare_client()
        .get(l.admin_url("/metrics"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .text()
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

pub async fn admin_json(l: &Limpet, path: &str) -> serde_json::Value {
    let r = bare_client()
        .get(l.admin_url(path))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let b = r.bytes().await.unwrap_or_default();
    serde_json::from_slice(&b).unwrap_or(serde_json::Value::Null)
}

/// The node entry of `name` in `/api/v1/nodes`.
pub async fn node_view(l: &Limpet, name: &str) -> serde_json::Value {
    admin_json(l, &format!("/api/v1/nodes/{name}")).await
}

/// A FIFO in place of the config file at `path`: a read of it blocks until a writer comes,
/// as a read from a hung network mount does.
pub fn fifo_in_place_of(path: &std::path::Path) {
    std::fs::remove_file(path).unwrap_or_else(|e| panic!("{e}"));
    let made = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap_or_else(|e| panic!("mkfifo: {e}"));
    assert!(made.success());
}

/// The write end of the FIFO at `path`, once limpet has it open for reading (a writer
/// opens a FIFO without waiting only then; within [`PATIENCE`]). Held open and silent, it
/// keeps limpet's read waiting; its bytes and close end that read. Looks again after a
/// yield, not a sleep: on paused time, a blocked read keeps the clock from moving.
pub async fn fifo_writer_once_read(path: &std::path::Path) -> std::fs::File {
    use std::os::unix::fs::OpenOptionsExt;
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        match std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
        {
            Ok(w) => return w,
            Err(e) => {
                assert!(std::time::Instant::now() < deadline, "no reader: {e}");
                tokio::task::yield_now().await;
            }
        }
    }
}

/// The addresses a `limpet run` prints on its stdout: its first listener's (`listening on`)
/// and its admin listener's (`admin on`), sent once both are read. Read on a thread of its
/// own until the process closes its stdout.
pub fn printed_addresses(
    out: Option<std::process::ChildStdout>,
) -> oneshot::Receiver<(SocketAddr, SocketAddr)> {
    use std::io::{BufRead, BufReader};
    let (tx, rx) = oneshot::channel();
    std::thread::spawn(move || {
        let mut web = None;
        let mut tx = Some(tx);
        if let Some(out) = out {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if let Some(rest) = line.strip_prefix("listening on ") {
                    web = web.or_else(|| {
                        rest.split(' ')
                            .next()
                            .and_then(|a| a.parse::<SocketAddr>().ok())
                    });
                }
                if let Some(a) = line.strip_prefix("admin on ") {
                    if let (Some(tx), Some(w), Ok(a)) = (tx.take(), web, a.parse::<SocketAddr>()) {
                        let _ = tx.send((w, a));
                    }
                }
            }
        }
    });
    rx
}

/// The node `client_ip`'s request lands on (a fresh client from that address).
pub async fn node_for(client_ip: &str, web: SocketAddr) -> String {
    let ip: IpAddr = client_ip.parse().unwrap_or_else(|e| panic!("{e}"));
    let c = reqwest::Client::builder()
        .local_address(ip)
        .timeout(PATIENCE)
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let r = c
        .get(format!("http://{web}/"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status(), 200);
    r.headers()
        .get("x-limpet-node")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

/// GETs `url` and reads it as JSON (`Null` if it is not).
pub async fn json(url: &str) -> serde_json::Value {
    let r = bare_client()
        .get(url)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let b = r.bytes().await.unwrap_or_default();
    serde_json::from_slice(&b).unwrap_or(serde_json::Value::Null)
}
