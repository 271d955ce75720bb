//! Every metric family docs/admin.md documents is in `/metrics` at the first scrape, before
//! any request, reload, transition or eviction: counters start at zero for every label set
//! limpet knows (nodes, HTTP listeners, tables, reload results), so their first increase is
//! seen by `rate()` instead of appearing as a new series.

mod admin_common;

use admin_common::lifecycle::*;

const NODES: [(&str, &str); 2] = [("a", "127.0.0.2"), ("b", "127.0.0.3")];

/// (name, kind) of every row of the metrics table in docs/admin.md.
fn documented_families() -> Vec<(String, String)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/admin.md");
    let doc = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    doc.lines()
        .filter(|l| l.starts_with("| `limpet_"))
        .map(|l| {
            let cols: Vec<&str> = l.split('|').map(str::trim).collect();
            (cols[1].trim_matches('`').to_owned(), cols[2].to_owned())
        })
        .collect()
}

#[tokio::test]
async fn every_documented_family_is_scraped_before_anything_happened() {
    let families = documented_families();
    assert!(
        families.len() >= 12,
        "docs/admin.md lists {families:?}: the metrics table was not found"
    );
    let (_nodes, port) = backend_nodes(&NODES).await;
    let cfg = ConfigFile::new(
        "metrics-families",
        &format!(
            "{}[[tables]]\nname = \"by-ip\"\nkey = \"source-ip\"\n\n\
             [[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = {port}\ntable = \"by-ip\"\n\n\
             [[listeners]]\nname = \"raw\"\nbind = \"127.0.0.1:0\"\nmode = \"tcp\"\nnode_port = {port}\n\n\
             [admin]\nlisten = \"127.0.0.1:0\"\n",
            nodes_toml(&NODES)
        ),
    );
    let l = Limpet::start(&cfg).await;
    let text = metrics_text(&l).await;
    l.stop().await;

    for (name, kind) in &families {
        // A series of the family, not only its `# TYPE` line.
        let series = match kind.as_str() {
            "histogram" => format!("\n{name}_count{{"),
            _ => format!("\n{name}{{"),
        };
        // Or the one series of a family without labels.
        let bare = format!("\n{name} ");
        assert!(
            text.contains(&series) || text.contains(&bare),
            "documented {kind} {name} has no series at start:\n{text}"
        );
    }
    for zero in [
        r#"limpet_config_reloads_total{result="ok"} 0"#,
        r#"limpet_config_reloads_total{result="refused"} 0"#,
        r#"limpet_table_evictions_total{table="by-ip"} 0"#,
        r#"limpet_table_entries{table="by-ip"} 0"#,
        r#"limpet_table_held_keys{table="by-ip"} 0"#,
        r#"limpet_table_pins_refused_total{table="by-ip"} 0"#,
        r#"limpet_health_transitions_total{node="b",to="down"} 0"#,
        r#"limpet_requests_total{listener="web",node="a",class="5xx"} 0"#,
        r#"limpet_pins_total{listener="web",outcome="repinned",reason="node-down"} 0"#,
        r#"limpet_upstream_latency_seconds_count{listener="web",node="b"} 0"#,
        r#"limpet_out_of_fds_total{at="accept"} 0"#,
        r#"limpet_out_of_fds_total{at="connect"} 0"#,
        r#"limpet_out_of_fds_total{at="check"} 0"#,
        "\nlimpet_log_lines_dropped_total 0\n",
    ] {
        assert!(text.contains(zero), "missing {zero}:\n{text}");
    }
    // A TCP listener answers no HTTP request: no request series is made up for it.
    assert!(
        !text.contains(r#"listener="raw""#),
        "request series for a TCP listener:\n{text}"
    );
}
