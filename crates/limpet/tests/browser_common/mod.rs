//! A headless Chromium driven through chromedriver, for the tests of limpet's pages (the stats
//! page, the demo page). Needs Debian's `chromium` and `chromium-driver` (scripts/test installs
//! them); without them the tests fail, they never skip.

#![allow(dead_code, unreachable_pub)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder};
use hyper_util::client::legacy::connect::HttpConnector;

pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
pub const CHROMIUM: &str = "/usr/bin/chromium";

/// A running chromedriver: killed (by its own handle) and its directory removed when dropped.
pub struct Driver {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Driver {
    /// Starts chromedriver on a free loopback port and waits for its "started successfully"
    /// line (bounded).
    pub async fn start(label: &str) -> Driver {
        assert!(
            Path::new(CHROMIUM).exists(),
            "{CHROMIUM} is missing: install Debian's chromium and chromium-driver"
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or_else(|e| panic!("{e}"));
        let dir =
            std::env::temp_dir().join(format!("limpet-{label}-{}-{port}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let mut child = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {CHROMEDRIVER} ({e}): install Debian's chromium and chromium-driver"
                )
            });
        let stdout = child.stdout.take();
        let driver = Driver { child, dir, port };
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            if let Some(out) = stdout {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    if line.contains("started successfully") {
                        if let Some(tx) = tx.take() {
                            let _ = tx.send(());
                        }
                    }
                }
            }
        });
        match tokio::time::timeout(Duration::from_secs(20), rx).await {
            Ok(Ok(())) => {}
            _ => panic!("chromedriver did not start"),
        }
        driver
    }

    /// A Chromium session through this driver, its window (and viewport) this size.
    pub async fn browser(&self, width: u32, height: u32) -> Client {
        let user_data = self.dir.join(format!("profile-{width}x{height}"));
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            serde_json::json!({
                "binary": CHROMIUM,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--disable-background-networking", "--disable-component-update",
                    "--disable-sync", "--no-first-run", "--no-proxy-server",
                    "--force-device-scale-factor=1",
                    format!("--window-size={width},{height}"),
                    format!("--user-data-dir={}", user_data.display()),
                ],
            }),
        );
        ClientBuilder::new(HttpConnector::new())
            .capabilities(caps)
            .connect(&format!("http://127.0.0.1:{}", self.port))
            .await
            .unwrap_or_else(|e| panic!("chromium session: {e}"))
    }
}

/// Writes a screenshot to target/test-artifacts/`name`; returns its width and height in
/// pixels, read from the PNG header.
pub fn save_screenshot(png: &[u8], name: &str) -> (u32, u32) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/test-artifacts");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(dir.join(name), png).unwrap_or_else(|e| panic!("{e}"));
    // The 8-byte signature, then the IHDR chunk: length, "IHDR", width, height (big-endian).
    assert!(
        png.len() > 24 && png.starts_with(b"\x89PNG\r\n\x1a\n") && &png[12..16] == b"IHDR",
        "{name} is not a PNG"
    );
    let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    (be(&png[16..20]), be(&png[20..24]))
}
