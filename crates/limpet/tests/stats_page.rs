//! The live stats page in a real headless Chromium, driven through chromedriver.
//!
//! - With three nodes: the page loads, shows the nodes, refuses a drain without the token
//!   and one whose deadline is not a number, drains a node once the token is entered, and
//!   shows the new state
//!   (`target/test-artifacts/stats-page.png`).
//! - With ten nodes at 1280 px: no horizontal scrolling and the actions column in view; per
//!   node the requests, errors, answer times, bytes, open connections, time in state and
//!   health progress ("going down 1/3", "trial in 60s") update after traffic, and the chart
//!   gets its points; the empty tables section says so in a sentence
//!   (`target/test-artifacts/stats-page-1280.png`, checked to be 1280 px wide).
//!
//! Needs Debian's `chromium` and `chromium-driver` (scripts/test installs them). Without them
//! the tests fail; they never skip.

mod admin_common;

mod browser_common;

use std::time::Duration;

use admin_common::lifecycle::*;
use browser_common::{save_screenshot, Driver};
use fantoccini::Locator;

const TOKEN: &str = "stats-page-token-0123456789";
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_page_shows_nodes_and_drains_one_in_chromium() {
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
    let driver = Driver::start("stats-page").await;

    let browser = driver.browser(1400, 800).await;

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
        on_fresh(async || browser.find(Locator::Css(drain_beta)).await?.click().await).await?;
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
        on_fresh(async || browser.find(Locator::Id("save-token")).await?.click().await).await?;
        // A deadline the browser cannot read as a number ("1e": the field's value reads
        // empty) is refused on the page, not sent as a drain without a deadline.
        let deadline = browser.find(Locator::Id("deadline")).await?;
        deadline.send_keys("1e").await?;
        on_fresh(async || browser.find(Locator::Css(drain_beta)).await?.click().await).await?;
        browser
            .wait()
            .at_most(Duration::from_secs(10))
            .for_element(Locator::XPath(
                "//div[@id='msg'][contains(., 'not a number of seconds')]",
            ))
            .await?;
        assert_eq!(node_view(&admin, "beta").await["state"], "UP");
        deadline.clear().await?;
        on_fresh(async || browser.find(Locator::Css(drain_beta)).await?.click().await).await?;
        browser
            .wait()
            .at_most(Duration::from_secs(10))
            .for_element(Locator::XPath(
                "//tr[@data-node='beta']//span[text()='DRAIN']",
            ))
            .await?;
        assert_eq!(node_view(&admin, "beta").await["state"], "DRAIN");
        // Outcomes are shown as counts.
        let totals =
            on_fresh(async || browser.find(Locator::Id("totals")).await?.text().await).await?;
        assert!(totals.contains("Requests\n3"), "{totals}");

        save_screenshot(&browser.screenshot().await?, "stats-page.png");
        Ok::<_, fantoccini::error::CmdError>(())
    }
    .await;
    let _ = browser.close().await;
    drop(driver);
    admin.stop().await;
    result.unwrap_or_else(|e| panic!("{e}"));
}

/// Runs `act` (a find and a use of what it found) again when the page re-rendered the
/// element between the two: the page refreshes itself every 2 s, and an element found just
/// before is then stale. At most three tries.
async fn on_fresh<T>(
    mut act: impl AsyncFnMut() -> Result<T, fantoccini::error::CmdError>,
) -> Result<T, fantoccini::error::CmdError> {
    let mut tries = 1;
    loop {
        match act().await {
            Err(e) if tries < 3 && e.to_string().contains("stale element") => tries += 1,
            r => return r,
        }
    }
}

/// Polls a JavaScript condition in the page until it holds; fails (with the node table's
/// text) after 20 s.
async fn wait_until(
    b: &fantoccini::Client,
    what: &str,
    condition: &str,
) -> Result<(), fantoccini::error::CmdError> {
    let script = format!(
        "const row = (n) => document.querySelector('tr[data-node=\"' + n + '\"]');\n\
         const cell = (n, c) => row(n) && row(n).querySelector('td.' + c);\n\
         const text = (n, c) => (cell(n, c) || {{ innerText: '' }}).innerText;\n\
         return !!({condition});"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if b.execute(&script, vec![]).await? == serde_json::Value::Bool(true) {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            let table = b
                .execute("return document.querySelector('main').innerText", vec![])
                .await?;
            panic!(
                "{what}: `{condition}` never held; the page says:\n{}",
                table.as_str().unwrap_or("")
            );
        }
        // Bounded polling of the page's condition: it refreshes itself every 2 s.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_page_at_1280_px_with_ten_nodes_shows_what_each_node_does() {
    let owned: Vec<(String, String)> = (1..=10)
        .map(|i| (format!("node{i:02}"), format!("127.0.0.{}", i + 1)))
        .collect();
    let nodes: Vec<(&str, &str)> = owned
        .iter()
        .map(|(n, ip)| (n.as_str(), ip.as_str()))
        .collect();
    let (mut backends, port) = backend_nodes(&nodes).await;
    // node10 is stopped: connections to it are refused (node09 is stopped further down).
    backends[9].kill().await;
    let cfg = ConfigFile::new(
        "stats-page-1280",
        &format!(
            "{}[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = {port}\n\n\
             [health]\nfall = 3\nfail_timeout = \"60s\"\n\n[admin]\nlisten = \"127.0.0.1:0\"\n",
            nodes_toml(&nodes)
        ),
    );
    let l = Limpet::start(&cfg).await;
    let url = format!("http://{}", l.addr("web"));
    let driver = Driver::start("stats-page-1280").await;
    let browser = driver.browser(1280, 900).await;

    let result = async {
        browser.goto(&l.admin_url("/")).await?;
        wait_until(
            &browser,
            "ten node rows",
            "document.querySelectorAll('#nodes tbody tr').length === 10",
        )
        .await?;
        let width = browser.execute("return window.innerWidth", vec![]).await?;
        assert_eq!(width, 1280, "the viewport is 1280 px wide");
        // Nothing yet.
        wait_until(
            &browser,
            "no traffic yet",
            "cell('node01', 'requests').dataset.total === '0'",
        )
        .await?;

        // Traffic pinned by cookie: 5 answers from each live node, 3 of node01's are 500 (the
        // requests failing over below add a few more, anywhere).
        for i in 1..=8 {
            let pin = format!("route=node{i:02}");
            for j in 0..5 {
                let path = if i == 1 && j < 3 { "/status/500" } else { "/" };
                let (s, node, _) = get(&bare_client(), &format!("{url}{path}"), Some(&pin)).await;
                assert_eq!(node, format!("node{i:02}"));
                assert_eq!(s, if path == "/" { 200 } else { 500 });
            }
        }
        // Three refused connects take node10 DOWN (each request fails over to a live node,
        // and counts as one of node10's errors);
        // then one to node09, stopped now, puts it on its way down (its request fails over
        // too, never to node10, which waits for its trial).
        for _ in 0..3 {
            let (s, _, _) = get(&bare_client(), &format!("{url}/"), Some("route=node10")).await;
            assert_eq!(s, 200, "failed over");
        }
        backends[8].kill().await;
        let (s, _, _) = get(&bare_client(), &format!("{url}/"), Some("route=node09")).await;
        assert_eq!(s, 200, "failed over");

        // The page updates: counts, rates, errors, answer times, bytes, connections.
        wait_until(
            &browser,
            "node01's traffic",
            "Number(cell('node01', 'requests').dataset.total) >= 5 \
             && Number(cell('node01', 'requests').dataset.rate) > 0 \
             && /\\/s/.test(text('node01', 'requests')) \
             && cell('node01', 'errors').dataset.total === '3' \
             && /^p50 [0-9.]+ m?s\\np99 [0-9.]+ m?s$/.test(text('node01', 'latency')) \
             && /^in [0-9.]+ \\S+\\nout [0-9.]+ \\S+$/.test(text('node01', 'bytes')) \
             && /^[0-9]+ conns?\\n[0-9]+ tunnels?$/.test(text('node01', 'open')) \
             && /^[0-9]+ pins?\\n[0-9]+ sessions?$/.test(text('node01', 'pins'))",
        )
        .await?;
        // Time in state and health progress.
        wait_until(
            &browser,
            "node01 UP for some seconds",
            "/^UP [0-9]+s/.test(text('node01', 'state'))",
        )
        .await?;
        wait_until(
            &browser,
            "node09 going down",
            "/^UP [0-9]+s\\ngoing down 1\\/3$/.test(text('node09', 'state'))",
        )
        .await?;
        wait_until(
            &browser,
            "node10 DOWN, waiting for its trial",
            "row('node10').dataset.state === 'DOWN' \
             && (m => m !== null && m[1] >= 1 && m[1] <= 60)\
                  (text('node10', 'state').match(/^DOWN [0-9]+s\\ntrial in ([0-9]+)s$/)) \
             && cell('node10', 'requests').dataset.total === '3' \
             && cell('node10', 'errors').dataset.total === '3'",
        )
        .await?;
        // The chart gets its first sample (every 5 s) with the traffic in it.
        wait_until(
            &browser,
            "node01's chart",
            "Number(cell('node01', 'history').querySelector('svg').dataset.points) >= 1 \
             && Number(cell('node01', 'history').querySelector('svg').dataset.peak) > 0 \
             && cell('node01', 'history').querySelector('path.requests') !== null \
             && cell('node01', 'history').querySelector('path.errors') !== null",
        )
        .await?;

        // No horizontal scrolling, of the page or of the node table's box.
        let sizes = browser
            .execute(
                "const d = document.documentElement, box = document.getElementById('nodes-box');\n\
                 return [d.scrollWidth, d.clientWidth, box.scrollWidth, box.clientWidth];",
                vec![],
            )
            .await?;
        let n = |i: usize| sizes[i].as_f64().unwrap_or(f64::NAN);
        assert!(n(0) <= n(1), "the page scrolls sideways: {sizes}");
        assert!(n(2) <= n(3), "the node table scrolls sideways: {sizes}");
        // Every row's actions are in view, all three buttons.
        let actions = browser
            .execute(
                "const w = document.documentElement.clientWidth;\n\
                 return [...document.querySelectorAll('#nodes tbody td.actions')].map((td) => {\n\
                   const b = [...td.querySelectorAll('button')];\n\
                   return b.length === 3 && b.every((x) => {\n\
                     const r = x.getBoundingClientRect();\n\
                     return r.width > 0 && r.left >= 0 && r.right <= w;\n\
                   });\n\
                 });",
                vec![],
            )
            .await?;
        assert_eq!(
            actions,
            serde_json::Value::from(vec![true; 10]),
            "actions out of view at 1280 px"
        );

        // An empty tables section says so in a sentence, without bare headers.
        let tables = browser.find(Locator::Id("tables-box")).await?;
        let said = tables.text().await?;
        assert!(said.contains("No affinity tables are configured"), "{said}");
        assert!(
            tables.find_all(Locator::Css("th")).await?.is_empty(),
            "bare table headers"
        );

        let (w, h) = save_screenshot(&browser.screenshot().await?, "stats-page-1280.png");
        assert_eq!(w, 1280, "screenshot width");
        assert!(h >= 600, "screenshot height {h}");
        Ok::<_, fantoccini::error::CmdError>(())
    }
    .await;
    let _ = browser.close().await;
    drop(driver);
    l.stop().await;
    result.unwrap_or_else(|e| panic!("{e}"));
}
