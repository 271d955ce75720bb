//! Running `limpet probe` as a real process for the `probe_*` tests.
//!
//! [`ProbeProc`] owns the child and kills it by its PID when dropped, so a failed assertion
//! never leaves a probe running. Its stdout is read line by line as the probe writes it: under
//! `--watch --json` a test waits on the probe's own `round` lines, never on time.

use std::process::Stdio;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStderr, ChildStdout, Command};

use super::PATIENCE;

/// A running probe.
pub struct ProbeProc {
    child: Child,
    stdout: Lines<BufReader<ChildStdout>>,
    stderr: Option<ChildStderr>,
    /// Every stdout line read so far.
    pub seen: Vec<String>,
}

/// A finished probe.
#[derive(Debug)]
pub struct Finished {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Finished {
    /// The last stdout line as JSON: the report under `--json`.
    pub fn report(&self) -> Value {
        let last = self.stdout.lines().last().unwrap_or_default();
        serde_json::from_str(last)
            .unwrap_or_else(|e| panic!("last line is not JSON ({e}): {last:?}\n{self:?}"))
    }
}

impl ProbeProc {
    /// Starts `limpet probe ARGS...` (the binary cargo built for this test).
    pub fn spawn(args: &[&str]) -> ProbeProc {
        let mut child = Command::new(env!("CARGO_BIN_EXE_limpet"))
            .arg("probe")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start limpet probe");
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take();
        ProbeProc {
            child,
            stdout: BufReader::new(stdout).lines(),
            stderr,
            seen: Vec::new(),
        }
    }

    /// The next stdout line, or `None` at the end of output.
    pub async fn next_line(&mut self) -> Option<String> {
        let line = tokio::time::timeout(PATIENCE, self.stdout.next_line())
            .await
            .expect("probe printed a line in time")
            .expect("read probe stdout");
        if let Some(l) = &line {
            self.seen.push(l.clone());
        }
        line
    }

    /// Reads JSON lines until one satisfies `pred`; panics if output ends first.
    pub async fn wait_for_json(&mut self, pred: impl Fn(&Value) -> bool) -> Value {
        while let Some(line) = self.next_line().await {
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                if pred(&v) {
                    return v;
                }
            }
        }
        panic!(
            "probe output ended before the expected line: {:?}",
            self.seen
        );
    }

    /// Reads the rest of the output and waits for the exit.
    pub async fn finish(mut self) -> Finished {
        while self.next_line().await.is_some() {}
        let mut stderr = String::new();
        if let Some(mut e) = self.stderr.take() {
            let _ = tokio::time::timeout(PATIENCE, e.read_to_string(&mut stderr)).await;
        }
        let status = tokio::time::timeout(PATIENCE, self.child.wait())
            .await
            .expect("probe exited in time")
            .expect("wait for probe");
        let mut stdout = self.seen.join("\n");
        stdout.push('\n');
        Finished {
            code: status.code(),
            stdout,
            stderr,
        }
    }
}

impl Drop for ProbeProc {
    fn drop(&mut self) {
        // Already exited: harmless. Otherwise this is a failed test; do not leave it behind.
        let _ = self.child.start_kill();
        let _ = self.child.try_wait();
    }
}

/// Runs `limpet probe ARGS...` to the end.
pub async fn probe(args: &[&str]) -> Finished {
    ProbeProc::spawn(args).finish().await
}

/// A node's host that can crash: a TCP relay in front of a node, which [`Host::crash`] stops
/// together with every connection through it, WebSockets included, as a dead machine would.
/// (Stopping an in-process node alone leaves its upgraded sockets running.)
pub struct Host {
    pub addr: std::net::SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Host {
    /// Relays 127.0.0.1:PORT (bound before this returns) to `node`.
    pub async fn start(node: std::net::SocketAddr) -> Host {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind host");
        let addr = listener.local_addr().expect("host addr");
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    _ = &mut stopped => break,
                    Some(_) = conns.join_next(), if !conns.is_empty() => {}
                    accepted = listener.accept() => {
                        let Ok((mut client, _)) = accepted else { continue };
                        conns.spawn(async move {
                            if let Ok(mut upstream) = tokio::net::TcpStream::connect(node).await {
                                let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream)
                                    .await;
                            }
                        });
                    }
                }
            }
            // Dropping the listener and aborting every relay closes all their sockets.
            drop(listener);
            conns.shutdown().await;
        });
        Host {
            addr,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Crashes the host; returns once every connection through it is closed.
    pub async fn crash(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(PATIENCE, task).await;
        }
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}
