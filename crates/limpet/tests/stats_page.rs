//! The live stats page in a real headless Chromium, driven through chromedriver: the page
//! loads, shows the nodes, refuses a drain without the token, drains a node once the token is
//! entered, and shows the new state. A screenshot is saved to
//! `target/test-artifacts/stats-page.png`.
//!
//! Needs Debian's `chromium` and `chromium-driver` (scripts/test installs them). Without them
//! the test fails; it never skips.

mod admin_common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use admin_common::lifecycle::*;
use fantoccini::{ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;

const TOKEN: &str = "stats-page-token-0123456789";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const CHROMIUM: &str = "/usr/bin/chromium";

/// Kills a child process (by its own handle) and removes a directory when dropped.
struct Proc {
    child: Child,
    dir: PathBuf,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Starts chromedriver on a free port and waits for its "started successfully" line.
async fn chromedriver() -> (Proc, u16) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("{e}"));
    let dir = std::env::temp_dir().join(format!("limpet-stats-page-{}-{port}", std::process::id()));
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
    let proc = Proc { child, dir };
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
    (proc, port)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_page_shows_nodes_and_drains_one_in_chromium() {
    assert!(
        std::path::Path::new(CHROMIUM).exists(),
        "{CHROMIUM} is missing: install Debian's chromium and chromium-driver"
    );
    // The real runtime: three demo nodes, an HTTP listener, the admin listener with a token.
    let nodes = [
        ("alpha", "127.0.0.2"),
        ("beta", "127.0.0.3"),
        ("gamma", "127.0.0.4"),
    ];
    let (_nodes, port) = backend_nodes(&nodes).await;
    let cfg = ConfigFile::new(
        "stats-page",
        &format!(
            "{}[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = {port}\n\n\
             [admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"{TOKEN}\"\n",
            nodes_toml(&nodes)
        ),
    );
    let admin = Limpet::start(&cfg).await;
    for _ in 0..3 {
        let (s, _, _) = get(
            &bare_client(),
            &format!("http://{}/", admin.addr("web")),
            None,
        )
        .await;
        assert_eq!(s, 200);
    }
    let (driver, port) = chromedriver().await;

    let user_data = driver.dir.join("profile");
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({
            "binary": CHROMIUM,
            "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--no-first-run", "--window-size=1400,800",
                format!("--user-data-dir={}", user_data.display()),
            ],
        }),
    );
    let browser = ClientBuilder::new(HttpConnector::new())
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{port}"))
        .await
        .unwrap_or_else(|e| panic!("chromium session: {e}"));

    let result = async {
        browser.goto(&admin.admin_url("/")).await?;
        // The nodes appear, all UP.
        for n in ["alpha", "beta", "gamma"] {
            browser
                .wait()
                .at_most(Duration::from_secs(10))
                .for_element(Locator::XPath(&format!(
                    "//tr[@data-node='{n}']//span[text()='UP']"
                )))
                .await?;
        }
        // Without the token the drain is refused, and the page says so.
        let drain_beta = "tr[data-node='beta'] button[data-action='drain']";
        browser
            .find(Locator::Css(drain_beta))
            .await?
            .click()
            .await?;
        browser
            .wait()
            .at_most(Duration::from_secs(10))
            .for_element(Locator::XPath(
                "//div[@id='msg'][contains(., 'Could not set beta to drain')]",
            ))
            .await?;
        assert_eq!(node_view(&admin, "beta").await["state"], "UP");

        // With the token, the drain goes through and the row shows it.
        browser
            .find(Locator::Id("token"))
            .await?
            .send_keys(TOKEN)
            .await?;
        browser
            .find(Locator::Id("save-token"))
            .await?
            .click()
            .await?;
        browser
            .find(Locator::Css(drain_beta))
            .await?
            .click()
            .await?;
        browser
            .wait()
            .at_most(Duration::from_secs(10))
            .for_element(Locator::XPath(
                "//tr[@data-node='beta']//span[text()='DRAIN']",
            ))
            .await?;
        assert_eq!(node_view(&admin, "beta").await["state"], "DRAIN");
        // Outcomes are shown as counts.
        let totals = browser.find(Locator::Id("totals")).await?.text().await?;
        assert!(totals.contains("Requests\n3"), "{totals}");

        let png = browser.screenshot().await?;
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/test-artifacts");
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(dir.join("stats-page.png"), png).unwrap_or_else(|e| panic!("{e}"));
        Ok::<_, fantoccini::error::CmdError>(())
    }
    .await;
    let _ = browser.close().await;
    drop(driver);
    admin.stop().await;
    result.unwrap_or_else(|e| panic!("{e}"));
}
