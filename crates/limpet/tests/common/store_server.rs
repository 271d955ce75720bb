//! A real `redis-server` for the fleet-mode tests and the fleet benchmark: started on a free
//! loopback port (bind 0, release, start there), without persistence, waited for with PING,
//! and SIGKILLed by PID (like `kill -9`) on `kill` or drop.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::PATIENCE;

/// A `redis-server` on 127.0.0.1, no persistence; SIGKILLed (like `kill -9`) on drop.
pub struct Redis {
    child: Child,
    pub port: u16,
}

impl Redis {
    /// Picks a free port (bind 0, release) and starts there.
    pub async fn start() -> Redis {
        Redis::on_a_free_port(&[]).await
    }

    /// Starts on a free port, another one while the port turns out taken (another test's
    /// server took it between the release and the start).
    async fn on_a_free_port(args: &[&str]) -> Redis {
        for _ in 0..20 {
            if let Some(r) = Redis::spawn(free_port(), args).await {
                return r;
            }
        }
        panic!("redis-server: no free port in 20 tries");
    }

    /// Starts on `port` and waits (bounded) until it answers PING.
    pub async fn on(port: u16) -> Redis {
        Redis::spawn(port, &[])
            .await
            .unwrap_or_else(|| panic!("redis-server: port {port} taken"))
    }

    /// Starts on `port` holding `keys` (with a 10-minute expiry) from its first answer on, as a
    /// store restarted from its own save would: a throwaway server on a free port writes
    /// them and `SAVE`s into `dir`, and this one loads that file before it serves.
    pub async fn on_seeded(port: u16, dir: &std::path::Path, keys: &[(&str, &str)]) -> Redis {
        let dir = dir.to_str().expect("utf-8 temp dir");
        let file = ["--dir", dir, "--dbfilename", "seed.rdb"];
        let mut seed = Redis::on_a_free_port(&file).await;
        let mut c = seed.conn().await.expect("seed connection");
        for (k, v) in keys {
            redis::cmd("SET")
                .arg(k)
                .arg(v)
                .arg("PX")
                .arg(600_000)
                .query_async::<()>(&mut c)
                .await
                .expect("SET seed key");
        }
        redis::cmd("SAVE")
            .query_async::<()>(&mut c)
            .await
            .expect("SAVE");
        seed.kill();
        Redis::spawn(port, &file)
            .await
            .unwrap_or_else(|| panic!("redis-server: port {port} taken"))
    }

    /// Starts a server on `port` and waits (bounded) until it answers PING as itself (its
    /// `process_id`): `None` when it exited first, the port being another's.
    async fn spawn(port: u16, args: &[&str]) -> Option<Redis> {
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server (scripts/test installs the Debian package redis-server)");
        let mut r = Redis { child, port };
        let pid = format!("process_id:{}", r.child.id());
        let up = tokio::time::timeout(PATIENCE, async {
            loop {
                if !matches!(r.child.try_wait(), Ok(None)) {
                    return false;
                }
                if let Ok(mut c) = r.conn().await {
                    if let Ok(info) = redis::cmd("INFO")
                        .arg("server")
                        .query_async::<String>(&mut c)
                        .await
                    {
                        if info.lines().any(|l| l.trim() == pid) {
                            return true;
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("redis-server answers in time");
        up.then_some(r)
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    pub async fn conn(&self) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
        redis::Client::open(self.url())?
            .get_multiplexed_async_connection()
            .await
    }

    /// Runs `command args...` on the server (an administrative command: `CONFIG SET`, `ACL
    /// SETUSER`), which must succeed.
    pub async fn run(&self, command: &str, args: &[&str]) {
        let mut c = self.conn().await.expect("connect");
        redis::cmd(command)
            .arg(args)
            .query_async::<()>(&mut c)
            .await
            .unwrap_or_else(|e| panic!("{command} {args:?}: {e}"));
    }

    /// `kill -9`: the process dies at once, connections are cut.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// `kill -STOP`: the process stops answering; its connections stay open and nothing
    /// comes back on them (a store that hangs, not one that is gone).
    pub fn pause(&self) {
        self.signal("STOP");
    }

    /// `kill -CONT`: it answers again, the requests that waited first.
    pub fn resume(&self) {
        self.signal("CONT");
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.child.id().to_string())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill -{sig} redis-server");
    }

    /// The server's count of connections it ever accepted.
    pub async fn connections_received(&self) -> u64 {
        self.stat("total_connections_received").await
    }

    /// A counter of `INFO stats` (e.g. `total_commands_processed`).
    pub async fn stat(&self, name: &str) -> u64 {
        let mut c = self.conn().await.expect("connect");
        let info: String = redis::cmd("INFO")
            .arg("stats")
            .query_async(&mut c)
            .await
            .expect("INFO");
        info.lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(k, _)| *k == name)
            .and_then(|(_, v)| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("INFO stats has no {name}"))
    }

    /// How many times the server ran `command` (lower case, e.g. `set`, `ping`), from
    /// `INFO commandstats`; 0 before its first call.
    pub async fn command_calls(&self, command: &str) -> u64 {
        let mut c = self.conn().await.expect("connect");
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut c)
            .await
            .expect("INFO commandstats");
        let prefix = format!("cmdstat_{command}:calls=");
        info.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }

    /// How many keys match `pattern` (`KEYS`: a test's small store).
    pub async fn count(&self, pattern: &str) -> usize {
        let mut c = self.conn().await.expect("connect");
        let keys: Vec<Vec<u8>> = redis::cmd("KEYS")
            .arg(pattern)
            .query_async(&mut c)
            .await
            .expect("KEYS");
        keys.len()
    }

    pub async fn get(&self, key: &str) -> Option<String> {
        let mut c = self.conn().await.ok()?;
        redis::cmd("GET").arg(key).query_async(&mut c).await.ok()?
    }

    /// `PTTL key`: the key's time left in milliseconds (-2: no such key, -1: no expiry).
    pub async fn pttl(&self, key: &str) -> i64 {
        let mut c = self.conn().await.expect("connect");
        redis::cmd("PTTL")
            .arg(key)
            .query_async(&mut c)
            .await
            .expect("PTTL")
    }

    /// `SET key value PX px`, as another instance (or a hand) writes the store.
    pub async fn set_px(&self, key: &str, value: &str, px: u64) {
        let mut c = self.conn().await.expect("connect");
        redis::cmd("SET")
            .arg(key)
            .arg(value)
            .arg("PX")
            .arg(px)
            .query_async::<()>(&mut c)
            .await
            .expect("SET");
    }
}

/// A loopback port free now (bound to 0, then released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}
