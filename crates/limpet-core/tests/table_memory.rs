//! Memory per entry at 1,000,000 IPv4 entries, computed and measured (resident set growth).
//! Ignored by default: it wants a release build and a quiet machine.
//!
//! `cargo test --release -p limpet-core --test table_memory -- --ignored --nocapture`

use std::net::Ipv4Addr;

use limpet_core::table::{AffinityStore, KeyRef, LruTable, TableConfig};

const N: u32 = 1_000_000;

fn rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[test]
#[ignore = "1M entries: run in release with --ignored --nocapture"]
fn memory_per_entry_at_one_million_ipv4_entries() {
    let before = rss_bytes();
    let mut t = LruTable::new(TableConfig::new(N, 30 * 60_000).with_hash_seed([1, 2]))
        .expect("valid config");
    let node = t.intern("node-a").expect("intern");
    for i in 0..N {
        let key = KeyRef::v4(Ipv4Addr::from(i.wrapping_mul(0x9e37_79b1)));
        t.put(key, node, 1_700_000_000_000);
    }
    let after = rss_bytes();
    assert_eq!(t.len(), N as usize);
    let m = t.memory();
    println!(
        "computed: {:.1} B/entry (entry {} B, slab {} B, index {} B)",
        m.per_entry(),
        m.entry_size,
        m.slab_bytes,
        m.index_bytes
    );
    assert!(m.per_entry() < 56.0, "{m:?}");
    if let (Some(b), Some(a)) = (before, after) {
        let per = a.saturating_sub(b) as f64 / f64::from(N);
        println!("measured: resident set grew {:.1} B/entry", per);
        // Slack for allocator rounding and the slab's growth steps.
        assert!(per < 80.0, "{per} B/entry");
    }
}
