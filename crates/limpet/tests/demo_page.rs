//! The `limpet demo` page in a real headless Chromium, driven through chromedriver: it shows
//! the node that served it and opens a WebSocket to the same node, has stop / start / drain /
//! maint / ready buttons for every node and a link to the stats page; pressing "Stop" on the
//! visitor's node moves its HTTP requests and its WebSocket to one other node. A screenshot
//! is saved to `target/test-artifacts/demo-page.png`.
//!
//! Needs Debian's `chromium` and `chromium-driver` (scripts/test installs them). Without them
//! the test fails; it never skips.

mod browser_common;

use std::time::Duration;

use browser_common::{save_screenshot, Driver};
use fantoccini::{Client, Locator};
use limpet::demo::{Demo, NODES};

const PATIENCE: Duration = Duration::from_secs(15);

async fn text_of(browser: &Client, id: &str) -> Result<String, fantoccini::error::CmdError> {
    browser.find(Locator::Id(id)).await?.text().await
}

/// Polls the page (bounded) until `(#http-node, #ws-node)` satisfies `ok`; returns them.
async fn wait_nodes(
    browser: &Client,
    what: &str,
    ok: impl Fn(&str, &str) -> bool,
) -> Result<(String, String), fantoccini::error::CmdError> {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let http = text_of(browser, "http-node").await?;
        let ws = text_of(browser, "ws-node").await?;
        if ok(&http, &ws) {
            return Ok((http, ws));
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: the page shows HTTP {http:?}, WebSocket {ws:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_page_buttons_stop_the_visitors_node_and_the_page_follows_in_chromium() {
    let demo = Demo::start(
        "127.0.0.1:0".parse().expect("addr"),
        "127.0.0.1:0".parse().expect("addr"),
    )
    .await
    .unwrap_or_else(|e| panic!("demo: {e}"));
    let driver = Driver::start("demo-page").await;
    let browser = driver.browser(1280, 900).await;

    let result = async {
        browser
            .goto(&format!("http://{}/index.html", demo.addr()))
            .await?;
        let home = text_of(&browser, "page-node").await?;
        assert!(NODES.contains(&home.as_str()), "{home}");
        // HTTP and the WebSocket show the page's node.
        wait_nodes(&browser, "pinned", |h, w| h == home && w == home).await?;
        // Every node has its buttons, and the stats page is linked.
        for n in NODES {
            for action in ["stop", "drain", "maint", "ready"] {
                browser
                    .wait()
                    .at_most(PATIENCE)
                    .for_element(Locator::Css(&format!(
                        "tr[data-node='{n}'] button[data-action='{action}']"
                    )))
                    .await?;
            }
        }
        browser
            .find(Locator::Css(&format!(
                "#stats a[href='{}']",
                demo.stats_url()
            )))
            .await?;

        // Stop the visitor's node from the page: both HTTP and the WebSocket move, together.
        browser
            .find(Locator::Css(&format!(
                "tr[data-node='{home}'] button[data-action='stop']"
            )))
            .await?
            .click()
            .await?;
        let (http, ws) = wait_nodes(&browser, "after stop", |h, w| {
            h != home && NODES.contains(&h) && w == h
        })
        .await?;
        assert_eq!(http, ws);
        // The stopped node's row offers "Start", and the log tells the move.
        browser
            .wait()
            .at_most(PATIENCE)
            .for_element(Locator::Css(&format!(
                "tr[data-node='{home}'] button[data-action='start']"
            )))
            .await?;
        let log = text_of(&browser, "log").await?;
        assert!(
            log.contains(&format!("node {home} stopped")),
            "the log shows the stop: {log}"
        );
        assert!(
            log.contains(&format!("reconnected to node {http} (was {home})")),
            "the log shows the WebSocket's move: {log}"
        );

        save_screenshot(&browser.screenshot().await?, "demo-page.png");
        Ok::<_, fantoccini::error::CmdError>(())
    }
    .await;
    let _ = browser.close().await;
    drop(driver);
    tokio::time::timeout(Duration::from_secs(30), demo.stop())
        .await
        .expect("the demo stops");
    result.unwrap_or_else(|e| panic!("{e}"));
}
