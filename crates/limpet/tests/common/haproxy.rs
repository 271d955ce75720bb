//! HAProxy as a real process in front of test nodes, for tests that judge another balancer.
//!
//! The test binds the frontend's listener itself (127.0.0.1 port 0) and hands it to HAProxy as
//! its standard input (`bind fd@0`), so the port is known and accepting before HAProxy even
//! starts: a client may connect at once, no polling for readiness. [`Haproxy`] kills the
//! process by its PID when dropped. A missing `haproxy` fails the test with the way to install
//! it; it never skips.

use std::fmt::Write as _;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// A running HAProxy and the directory holding its configuration.
pub struct Haproxy {
    pub addr: SocketAddr,
    child: Child,
    dir: PathBuf,
    pub config: String,
}

/// One `server` line: name, address, cookie value.
pub struct Server<'a> {
    pub name: &'a str,
    pub addr: SocketAddr,
}

/// The configuration under test: `mode http`, round-robin, `cookie SRV insert indirect
/// nocache`, `option redispatch`, the server cookie being the server's name.
pub fn cookie_config(servers: &[Server<'_>]) -> String {
    let mut cfg = String::from(
        "global\n\
         \x20   maxconn 256\n\
         defaults\n\
         \x20   mode http\n\
         \x20   option redispatch\n\
         \x20   retries 2\n\
         \x20   timeout connect 2s\n\
         \x20   timeout client 20s\n\
         \x20   timeout server 20s\n\
         \x20   timeout tunnel 30s\n\
         frontend fe\n\
         \x20   bind fd@0\n\
         \x20   default_backend be\n\
         backend be\n\
         \x20   balance roundrobin\n\
         \x20   cookie SRV insert indirect nocache\n",
    );
    for s in servers {
        let _ = writeln!(cfg, "    server {0} {1} cookie {0}", s.name, s.addr);
    }
    cfg
}

/// Panics, with how to install it, when `haproxy` is not on the PATH.
pub fn require_haproxy() -> String {
    match Command::new("haproxy").arg("-v").output() {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap_or_default()
            .to_owned(),
        other => panic!(
            "haproxy is required by this test and was not found or does not run ({other:?}). \
             Install it: `apt-get install -y haproxy`, or run `scripts/test`, which does."
        ),
    }
}

impl Haproxy {
    /// Starts `haproxy -db` (foreground) on `config`, which must bind its frontend to `fd@0`.
    pub fn start(config: &str) -> Haproxy {
        require_haproxy();
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind haproxy frontend");
        let addr = listener.local_addr().expect("frontend addr");
        let dir = std::env::temp_dir().join(format!(
            "limpet-haproxy-{}-{}",
            std::process::id(),
            addr.port()
        ));
        std::fs::create_dir_all(&dir).expect("haproxy temp dir");
        let cfg_path = dir.join("haproxy.cfg");
        std::fs::write(&cfg_path, config).expect("write haproxy.cfg");
        let child = Command::new("haproxy")
            .arg("-db")
            .arg("-f")
            .arg(&cfg_path)
            .stdin(Stdio::from(OwnedFd::from(listener)))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start haproxy");
        Haproxy {
            addr,
            child,
            dir,
            config: config.to_owned(),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// `None` while running; the exit status and stderr if HAProxy has stopped (a config it
    /// refused, say), to explain a failure.
    pub fn exited(&mut self) -> Option<String> {
        let status = self.child.try_wait().ok().flatten()?;
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut err);
        }
        Some(format!("haproxy exited with {status}: {err}"))
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
