//! Seeded random operations on an [`LruTable`] against a shadow model that states the rules
//! plainly: a `BTreeMap` of entries and an explicit LRU order `Vec`, times as `u64`.
//!
//! Every seed runs a few thousand gets, puts, removals, purges, clock moves (forward, back,
//! and jumps past the table's internal stamp range), clears, snapshot round trips, and holds
//! and releases of keys by open sessions, and compares every answer, the live contents and
//! the pins per node. The table's own debug invariant checks run after each mutation too.
//!
//! A failure names its seed. Replay it alone with
//! `LIMPET_SEED=<seed> cargo test -p limpet-core --test table_sim -- --nocapture`;
//! `LIMPET_SIM_SEEDS=<n>` runs more seeds (default 100).

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use limpet_core::table::{
    decode_snapshot, encode_snapshot, AffinityStore, KeyRef, LruTable, NodeRef, PutOutcome,
    TableConfig, TableKey, TableStats, MAKE_ROOM_WALK, MAX_EXPIRE_MS,
};

const T0: u64 = 1_700_000_000_000;

/// splitmix64: small, seedable, good enough to drive a simulation.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }
}

/// The rules, stated as plainly as possible.
struct Model {
    size: usize,
    expire: u64,
    clock: u64,
    entries: BTreeMap<TableKey, (NodeRef, u64)>,
    /// Least recently used first.
    order: Vec<TableKey>,
    /// Keys open sessions hold, and how many hold each.
    held: BTreeMap<TableKey, u32>,
    stats: TableStats,
}

impl Model {
    fn tick(&mut self, now: u64) {
        self.clock = self.clock.max(now);
    }

    fn expired(&self, key: &TableKey) -> bool {
        self.entries
            .get(key)
            .is_some_and(|&(_, last)| self.clock - last >= self.expire)
    }

    fn drop_key(&mut self, key: &TableKey) {
        self.entries.remove(key);
        self.order.retain(|k| k != key);
    }

    fn touch(&mut self, key: &TableKey) {
        self.order.retain(|k| k != key);
        self.order.push(key.clone());
        if let Some(e) = self.entries.get_mut(key) {
            e.1 = self.clock;
        }
    }

    fn get(&mut self, key: &TableKey, now: u64) -> Option<NodeRef> {
        self.tick(now);
        if !self.entries.contains_key(key) {
            self.stats.misses += 1;
            return None;
        }
        if self.expired(key) {
            self.drop_key(key);
            self.stats.expirations += 1;
            self.stats.misses += 1;
            return None;
        }
        self.touch(key);
        self.stats.hits += 1;
        self.entries.get(key).map(|e| e.0)
    }

    fn put(&mut self, key: &TableKey, node: NodeRef, now: u64) -> PutOutcome {
        self.tick(now);
        if let Some(&(old, _)) = self.entries.get(key) {
            let previous = if self.expired(key) {
                self.stats.expirations += 1;
                self.stats.inserts += 1;
                None
            } else {
                self.stats.updates += 1;
                Some(old)
            };
            self.entries.insert(key.clone(), (node, self.clock));
            self.touch(key);
            return PutOutcome {
                previous,
                evicted: false,
                stored: true,
            };
        }
        let mut evicted = false;
        if self.entries.len() >= self.size {
            // The least recently used entry goes, unless an open session holds it and it is
            // live: then it is in use, marked used now, and the next one is looked at. When
            // every entry is held, or MAKE_ROOM_WALK held ones were passed over, the new key
            // is not stored.
            let mut passed = 0;
            loop {
                let oldest = self.order[0].clone();
                let expired = self.expired(&oldest);
                if !expired && self.held.contains_key(&oldest) {
                    if self.entries.keys().all(|k| self.held.contains_key(k))
                        || passed == MAKE_ROOM_WALK
                    {
                        self.stats.refused += 1;
                        return PutOutcome {
                            previous: None,
                            evicted: false,
                            stored: false,
                        };
                    }
                    self.touch(&oldest);
                    passed += 1;
                    continue;
                }
                if expired {
                    self.stats.expirations += 1;
                } else {
                    self.stats.evictions += 1;
                    evicted = true;
                }
                self.drop_key(&oldest);
                break;
            }
        }
        self.entries.insert(key.clone(), (node, self.clock));
        self.order.push(key.clone());
        self.stats.inserts += 1;
        PutOutcome {
            previous: None,
            evicted,
            stored: true,
        }
    }

    fn hold(&mut self, key: &TableKey) {
        *self.held.entry(key.clone()).or_insert(0) += 1;
    }

    fn release(&mut self, key: &TableKey) {
        if let Some(n) = self.held.get_mut(key) {
            *n -= 1;
            if *n == 0 {
                self.held.remove(key);
            }
        }
    }

    fn remove(&mut self, key: &TableKey) -> Option<NodeRef> {
        let &(node, _) = self.entries.get(key)?;
        let expired = self.expired(key);
        self.drop_key(key);
        if expired {
            self.stats.expirations += 1;
            None
        } else {
            self.stats.removals += 1;
            Some(node)
        }
    }

    fn purge(&mut self, now: u64, budget: usize) -> usize {
        self.tick(now);
        let mut n = 0;
        while n < budget && !self.order.is_empty() && self.expired(&self.order[0].clone()) {
            let k = self.order[0].clone();
            self.drop_key(&k);
            n += 1;
        }
        self.stats.expirations += n as u64;
        n
    }

    /// Live entries as seen at `now` (or the clock, if later): key -> (node, idle).
    fn live(&self, now: u64) -> BTreeMap<TableKey, (NodeRef, u64)> {
        let at = now.max(self.clock);
        self.entries
            .iter()
            .filter(|(_, &(_, last))| at - last < self.expire)
            .map(|(k, &(n, last))| (k.clone(), (n, at - last)))
            .collect()
    }
}

fn live_of(t: &LruTable, now: u64) -> BTreeMap<TableKey, (NodeRef, u64)> {
    let mut out = BTreeMap::new();
    let mut page = 0;
    loop {
        let p = t.entries(page, 5, now);
        if p.is_empty() && page * 5 >= t.len() {
            break;
        }
        for e in p {
            out.insert(e.key, (e.node, e.idle_ms));
        }
        page += 1;
    }
    out
}

fn key_space() -> Vec<TableKey> {
    let mut keys: Vec<TableKey> = (0..24u32)
        .map(|i| KeyRef::v4(Ipv4Addr::from(0x0a00_0000 | i)).to_key())
        .collect();
    keys.extend(
        (0..6u16).map(|i| KeyRef::v6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, i)).to_key()),
    );
    keys.extend(
        ["a", "JSESSIONID=1", "", "tenant-acme", "x"]
            .iter()
            .map(|s| KeyRef::bytes(s.as_bytes()).to_key()),
    );
    keys.extend((0..3u8).map(|i| KeyRef::bytes(&[i; 300]).to_key()));
    keys
}

fn run(seed: u64) -> Result<(), String> {
    let mut rng = Rng(seed);
    let size = rng.pick(&[1u32, 2, 3, 8, 16, 32, 64]);
    let expire = rng.pick(&[1u64, 50, 1000, MAX_EXPIRE_MS]);
    let config = TableConfig::new(size, expire).with_hash_seed([rng.next(), rng.next()]);
    let mut t = LruTable::new(config).map_err(|e| e.to_string())?;
    let nodes: Vec<NodeRef> = ["n0", "n1", "n2", "n3"]
        .iter()
        .map(|n| t.intern(n).ok_or("intern"))
        .collect::<Result<_, _>>()?;
    let mut m = Model {
        size: size as usize,
        expire,
        clock: 0,
        entries: BTreeMap::new(),
        order: Vec::new(),
        held: BTreeMap::new(),
        stats: TableStats::default(),
    };
    let keys = key_space();
    let mut now = T0;
    let step = (expire / 3).max(1);

    for op in 0..3000 {
        let key = &keys[rng.below(keys.len() as u64) as usize];
        let what = rng.below(110);
        let at = now;
        let ctx = |msg: String| format!("op {op} (roll {what}, key {key:?}, now {at}): {msg}");
        match what {
            0..=34 => {
                let (got, want) = (t.get(key.as_key_ref(), now), m.get(key, now));
                if got != want {
                    return Err(ctx(format!("get: table {got:?}, model {want:?}")));
                }
            }
            35..=69 => {
                let node = rng.pick(&nodes);
                let (got, want) = (t.put(key.as_key_ref(), node, now), m.put(key, node, now));
                if got != want {
                    return Err(ctx(format!("put: table {got:?}, model {want:?}")));
                }
            }
            70..=77 => {
                let (got, want) = (t.remove(key.as_key_ref()), m.remove(key));
                if got != want {
                    return Err(ctx(format!("remove: table {got:?}, model {want:?}")));
                }
            }
            78..=87 => now += rng.below(step),
            88 => now = now.saturating_sub(rng.below(step)), // a clock that steps back
            89 => now += u64::from(u32::MAX) / 2 + rng.below(u64::from(u32::MAX)),
            90..=94 => {
                let budget = rng.below(4) as usize;
                let (got, want) = (t.purge_expired(now, budget), m.purge(now, budget));
                // The table may have purged expired entries on its own (when it rebases its
                // stamps), so it can find fewer; never more.
                if got > want {
                    return Err(ctx(format!("purge: table {got}, model {want}")));
                }
            }
            95 => {
                t.clear();
                m.entries.clear();
                m.order.clear();
            }
            96..=97 => {
                let bytes = encode_snapshot(&t, now);
                let snap = decode_snapshot(&bytes, now, expire).map_err(|e| ctx(e.to_string()))?;
                t.restore(&snap, now);
                // The model: restoring keeps every live entry as it was (node, idle time, LRU
                // order); expired ones go; traffic counters are untouched.
                m.tick(now);
                let live = m.live(now);
                m.entries.retain(|k, _| live.contains_key(k));
                m.order.retain(|k| live.contains_key(k));
            }
            100..=104 => {
                t.hold(key.as_key_ref());
                m.hold(key);
            }
            105..=109 => {
                t.release(key.as_key_ref());
                m.release(key);
            }
            _ => {}
        }
        if t.held() != m.held.len() {
            return Err(ctx(format!(
                "held: table {}, model {}",
                t.held(),
                m.held.len()
            )));
        }
        let (got, want) = (live_of(&t, now), m.live(now));
        if got != want {
            return Err(ctx(format!("live entries: table {got:?}, model {want:?}")));
        }
        // The pins per node the table keeps as entries change match a count of the live ones.
        let mut per_node: BTreeMap<NodeRef, u64> = BTreeMap::new();
        for &(node, _) in want.values() {
            *per_node.entry(node).or_default() += 1;
        }
        let pins: BTreeMap<NodeRef, u64> = t.pins(now).into_iter().collect();
        if pins != per_node {
            return Err(ctx(format!("pins: table {pins:?}, model {per_node:?}")));
        }
        // Expired entries may linger until something drops them, and the table may drop
        // them earlier than the model (a rebase purges), so only bounds hold for len.
        if t.len() < want.len() || t.len() > m.entries.len() {
            return Err(ctx(format!(
                "len: table {}, model live {} of {}",
                t.len(),
                want.len(),
                m.entries.len()
            )));
        }
        let (ts, ms) = (t.stats(), m.stats);
        let strip = |s: TableStats| {
            (
                s.hits,
                s.misses,
                s.inserts,
                s.updates,
                s.evictions,
                s.removals,
                s.refused,
            )
        };
        if strip(ts) != strip(ms) {
            return Err(ctx(format!("stats: table {ts:?}, model {ms:?}")));
        }
        if ts.len > u64::from(size) {
            return Err(ctx(format!("len {} over size {size}", ts.len)));
        }
    }
    Ok(())
}

fn run_reporting(seed: u64) -> Result<(), String> {
    match catch_unwind(AssertUnwindSafe(|| run(seed))) {
        Ok(r) => r,
        Err(panic) => Err(panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "panic".into())),
    }
}

#[test]
fn table_matches_the_shadow_model() {
    if let Ok(seed) = std::env::var("LIMPET_SEED") {
        let seed: u64 = seed.parse().expect("LIMPET_SEED is a number");
        if let Err(e) = run_reporting(seed) {
            panic!("seed {seed}: {e}");
        }
        return;
    }
    let seeds: u64 = std::env::var("LIMPET_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100);
    for seed in 0..seeds {
        if let Err(e) = run_reporting(seed) {
            panic!("seed {seed}: {e}\nreplay: LIMPET_SEED={seed} cargo test -p limpet-core --test table_sim");
        }
    }
}
