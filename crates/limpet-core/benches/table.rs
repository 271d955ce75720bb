//! Affinity table cost at 1,000,000 IPv4 entries (issue 5, point 5): memory per entry, lookup
//! time on a hit and on a miss, and insert time into a full table (each insert evicts the
//! least recently used entry, the steady state of a busy table).
//!
//! Whole-table reads (`table_1m_ipv4_reads`) against one page of the paged reads the binary
//! makes (`table_1m_ipv4_pages`): what a snapshot save or an expiry refresh holds the table's
//! lock for; and the pins per node the admin API's node view shows, counted by a walk of the
//! entries against the counts the table keeps (`pins_by_walk`, `pins_kept`).
//!
//! Run: `cargo bench -p limpet-core --bench table`. The memory figures print first, twice:
//! computed from the table's allocations, and measured as the growth of the process's resident
//! set (`VmRSS` in /proc/self/status, so no counting allocator and no `unsafe` is needed).
//!
//! Keys are spread over the address space (a bijective mix of 0..N), and lookups pick keys at
//! random, so the figures include the cache misses a real table of this size pays.

use std::hint::black_box;
use std::net::Ipv4Addr;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use limpet_core::table::{
    encode_snapshot, AffinityStore, AffinityTable, KeyRef, LruTable, SnapshotPages, TableConfig,
};
use limpet_core::{Pin, Pool};

const N: u32 = 1_000_000;
const T0: u64 = 1_700_000_000_000;
const EXPIRE: u64 = 30 * 60_000;

/// The i-th distinct address: multiplication by an odd constant is a bijection on u32.
fn addr(i: u32) -> KeyRef<'static> {
    KeyRef::v4(Ipv4Addr::from(i.wrapping_mul(0x9e37_79b1)))
}

/// xorshift: a cheap random index per iteration.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

fn rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

fn full_table(pool: &Pool) -> AffinityTable {
    let store = LruTable::new(TableConfig::new(N, EXPIRE).with_hash_seed([0x5eed, 0xcafe]))
        .unwrap_or_else(|e| panic!("bench table: {e}"));
    let mut t = AffinityTable::new(store, pool);
    let nodes: Vec<_> = pool.nodes().map(|(id, _)| id).collect();
    for i in 0..N {
        t.learn(
            addr(i),
            nodes[i as usize % nodes.len()],
            T0 + u64::from(i / 1000),
        );
    }
    t
}

fn memory(pool: &Pool) {
    let before = rss_bytes();
    let t = full_table(pool);
    let after = rss_bytes();
    let m = t.store().memory();
    println!(
        "table/memory: {} IPv4 entries: entry {} B; slab {} B + index {} B + keys {} B + names {} B = {} B, {:.1} B/entry (computed)",
        m.entries,
        m.entry_size,
        m.slab_bytes,
        m.index_bytes,
        m.key_bytes,
        m.names_bytes,
        m.total(),
        m.per_entry()
    );
    if let (Some(b), Some(a)) = (before, after) {
        println!(
            "table/memory: resident set grew {} B while filling, {:.1} B/entry (measured)",
            a.saturating_sub(b),
            a.saturating_sub(b) as f64 / f64::from(N)
        );
    }
    drop(t);
}

fn bench(c: &mut Criterion) {
    let mut pool = Pool::new(["lviv", "kyiv", "odesa"]).unwrap_or_else(|e| panic!("{e}"));
    memory(&pool);

    let mut t = full_table(&pool);
    let now = T0 + 2000;
    let mut g = c.benchmark_group("table_1m_ipv4");
    g.throughput(Throughput::Elements(1));

    let mut s = 0x1234_5678_9abc_def0u64;
    g.bench_function("lookup_hit", |b| {
        b.iter(|| {
            let i = (next(&mut s) % u64::from(N)) as u32;
            black_box(t.store_mut().get(black_box(addr(i)), now))
        })
    });
    g.bench_function("peek_hit", |b| {
        b.iter(|| {
            let i = (next(&mut s) % u64::from(N)) as u32;
            black_box(t.store().peek(black_box(addr(i)), now))
        })
    });
    g.bench_function("lookup_hit_to_pin", |b| {
        b.iter(|| {
            let i = (next(&mut s) % u64::from(N)) as u32;
            black_box(t.lookup(black_box(addr(i)), now))
        })
    });
    g.bench_function("lookup_miss", |b| {
        b.iter(|| {
            let i = N + (next(&mut s) % u64::from(N)) as u32;
            black_box(t.store_mut().get(black_box(addr(i)), now))
        })
    });
    // The whole per-request path of a sticky client: lookup then decide.
    g.bench_function("lookup_then_decide", |b| {
        b.iter(|| {
            let i = (next(&mut s) % u64::from(N)) as u32;
            let pin = t.lookup(black_box(addr(i)), now);
            black_box(pool.decide(pin, now))
        })
    });
    g.finish();

    // Whole-table reads (a snapshot save, a shared table's expiry refresh): how long the
    // table's lock would be held read at once, against one page of the paged read.
    let mut g = c.benchmark_group("table_1m_ipv4_reads");
    g.sample_size(10);
    g.bench_function("snapshot_whole", |b| {
        b.iter(|| black_box(encode_snapshot(t.store(), now)))
    });
    g.bench_function("used_at_whole", |b| {
        b.iter(|| black_box(t.store().used_at(0, N as usize, 0, now)))
    });
    // The pins per node as the admin API's node view read them: counted page by page
    // before, read from the counts the table keeps now.
    g.bench_function("pins_by_walk", |b| {
        b.iter(|| {
            let mut counts = std::collections::BTreeMap::new();
            let mut page = 0;
            while page * 4096 < t.store().len() {
                for e in t.store().entries(page, 4096, now) {
                    *counts.entry(e.node).or_insert(0u64) += 1;
                }
                page += 1;
            }
            black_box(counts)
        })
    });
    g.bench_function("pins_kept", |b| b.iter(|| black_box(t.store().pins(now))));
    g.finish();
    let mut g = c.benchmark_group("table_1m_ipv4_pages");
    g.bench_function("snapshot_page_4096", |b| {
        b.iter(|| {
            let mut pages = SnapshotPages::new();
            black_box(pages.read(t.store(), 4096, now));
            pages
        })
    });
    g.bench_function("used_at_page_4096", |b| {
        b.iter(|| black_box(t.store().used_at(4096, 4096, 0, now)))
    });
    g.finish();

    let mut g = c.benchmark_group("table_1m_ipv4");
    g.throughput(Throughput::Elements(1));
    let node = t
        .store_mut()
        .intern("kyiv")
        .unwrap_or_else(|| panic!("intern"));
    let mut fresh = 2 * N;
    g.bench_function("insert_evicting", |b| {
        b.iter(|| {
            fresh = fresh.wrapping_add(1);
            black_box(t.store_mut().put(black_box(addr(fresh)), node, now))
        })
    });
    g.finish();
    // The insert benchmark ran last because it replaces the original keys with new ones.
    assert!(t.store().len() <= N as usize);
    black_box(t.lookup(addr(0), now) != Pin::None);
}

criterion_group!(benches, bench);
criterion_main!(benches);
