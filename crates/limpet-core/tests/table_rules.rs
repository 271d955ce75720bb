//! The affinity-table rules of issue 5, through the public API: idle expiry refreshed on use,
//! the size bound with least-recently-used eviction, prefix masking, application-cookie
//! learning, pins that survive a reload by node name, and one table shared by several
//! listeners.

use std::net::IpAddr;

use limpet_core::table::{
    AffinityStore, AffinityTable, IpPrefix, KeyRef, KeySpec, LruTable, TableConfig,
};
use limpet_core::{Decision, NodeId, Pin, Pool, RepinReason};

const T0: u64 = 1_700_000_000_000;
const MIN: u64 = 60_000;

fn pool(names: &[&str]) -> Pool {
    Pool::new(names.iter().copied()).expect("valid pool")
}

fn store(size: u32, expire_ms: u64) -> LruTable {
    LruTable::new(TableConfig::new(size, expire_ms).with_hash_seed([1, 2])).expect("valid")
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("test address")
}

fn host(s: &str) -> KeyRef<'static> {
    KeyRef::ip(ip(s), IpPrefix::HOST)
}

fn id(p: &Pool, name: &str) -> NodeId {
    p.lookup(name.as_bytes()).expect("node in pool")
}

#[test]
fn idle_entries_expire_and_use_refreshes_them() {
    let p = pool(&["a", "b"]);
    let mut t = AffinityTable::new(store(100, 30 * MIN), &p);
    let a = id(&p, "a");
    t.learn(host("10.0.0.1"), a, T0);
    t.learn(host("10.0.0.2"), a, T0);

    // 10.0.0.1 comes back every 20 minutes: each hit restarts its idle time.
    for step in 1..=5 {
        assert_eq!(
            t.lookup(host("10.0.0.1"), T0 + step * 20 * MIN),
            Pin::Node(a)
        );
    }
    // 10.0.0.2 was idle for 100 minutes: gone, and removed by the lookup that found it so.
    assert_eq!(t.lookup(host("10.0.0.2"), T0 + 100 * MIN), Pin::None);
    assert_eq!(t.store().len(), 1);
    // Idle exactly `expire` is gone too; one millisecond less is not.
    let last = T0 + 100 * MIN;
    assert_eq!(
        t.lookup(host("10.0.0.1"), last + 30 * MIN - 1),
        Pin::Node(a)
    );
    assert_eq!(t.lookup(host("10.0.0.1"), last + 60 * MIN - 1), Pin::None);
    assert_eq!(t.store().stats().expirations, 2);
}

#[test]
fn purge_expired_does_bounded_work_from_the_oldest() {
    let p = pool(&["a"]);
    let a = id(&p, "a");
    let mut t = AffinityTable::new(store(100, 1000), &p);
    for i in 0..10u64 {
        t.learn(host(&format!("10.0.0.{i}")), a, T0 + i * 100);
    }
    // At T0 + 1450 the entries used at T0..=T0+400 are idle >= 1000 ms: five of them.
    let s = t.store_mut();
    assert_eq!(s.purge_expired(T0 + 1450, 3), 3);
    assert_eq!(s.purge_expired(T0 + 1450, 3), 2);
    assert_eq!(s.purge_expired(T0 + 1450, 3), 0);
    assert_eq!(s.len(), 5);
    assert_eq!(t.lookup(host("10.0.0.5"), T0 + 1450), Pin::Node(a));
}

#[test]
fn a_full_table_evicts_the_least_recently_used() {
    let p = pool(&["a"]);
    let a = id(&p, "a");
    let mut t = AffinityTable::new(store(3, 30 * MIN), &p);
    t.learn(host("10.0.0.1"), a, T0);
    t.learn(host("10.0.0.2"), a, T0 + 1);
    t.learn(host("10.0.0.3"), a, T0 + 2);
    // Using .1 makes .2 the least recently used.
    assert_eq!(t.lookup(host("10.0.0.1"), T0 + 3), Pin::Node(a));
    let out = t
        .learn(host("10.0.0.4"), a, T0 + 4)
        .expect("node of the pool");
    assert!(out.evicted);
    assert_eq!(t.store().len(), 3);
    assert_eq!(t.lookup(host("10.0.0.2"), T0 + 5), Pin::None);
    // Now .3 is the oldest, then .1, .4.
    t.learn(host("10.0.0.5"), a, T0 + 6);
    assert_eq!(t.lookup(host("10.0.0.3"), T0 + 7), Pin::None);
    for live in ["10.0.0.1", "10.0.0.4", "10.0.0.5"] {
        assert_eq!(t.lookup(host(live), T0 + 8), Pin::Node(a), "{live}");
    }
    assert_eq!(t.store().stats().evictions, 2);
}

#[test]
fn an_expired_tail_makes_room_without_counting_an_eviction() {
    let p = pool(&["a"]);
    let a = id(&p, "a");
    let mut t = AffinityTable::new(store(1, 1000), &p);
    t.learn(host("10.0.0.1"), a, T0);
    let out = t.learn(host("10.0.0.2"), a, T0 + 5000).expect("bound");
    assert!(!out.evicted);
    let stats = t.store().stats();
    assert_eq!((stats.evictions, stats.expirations), (0, 1));
}

#[test]
fn prefix_masking_groups_a_nat_range() {
    let p = pool(&["a", "b"]);
    let (a, b) = (id(&p, "a"), id(&p, "b"));
    let p24 = IpPrefix::new(24, 64).expect("valid");
    let mut t = AffinityTable::new(store(100, 30 * MIN), &p);

    t.learn(KeyRef::ip(ip("10.1.2.3"), p24), a, T0);
    assert_eq!(
        t.lookup(KeyRef::ip(ip("10.1.2.200"), p24), T0),
        Pin::Node(a)
    );
    assert_eq!(t.lookup(KeyRef::ip(ip("10.1.3.1"), p24), T0), Pin::None);

    // /32: two addresses of the same /24 are two keys.
    t.learn(host("10.9.9.3"), b, T0);
    assert_eq!(t.lookup(host("10.9.9.200"), T0), Pin::None);

    // IPv6 /64: one site, one pin; another /64 is another key.
    t.learn(KeyRef::ip(ip("2001:db8:1:2::10"), p24), b, T0);
    assert_eq!(
        t.lookup(KeyRef::ip(ip("2001:db8:1:2:ffff::1"), p24), T0),
        Pin::Node(b)
    );
    assert_eq!(
        t.lookup(KeyRef::ip(ip("2001:db8:1:3::10"), p24), T0),
        Pin::None
    );
    // An IPv4 client seen through a dual-stack socket is the same client.
    assert_eq!(
        t.lookup(KeyRef::ip(ip("::ffff:10.1.2.77"), p24), T0),
        Pin::Node(a)
    );
}

#[test]
fn app_cookie_is_learned_from_set_cookie_and_found_in_cookie() {
    let mut p = pool(&["app1", "app2"]);
    let spec = KeySpec::app_cookie("JSESSIONID").expect("valid");
    let mut t = AffinityTable::new(store(100, 30 * MIN), &p);
    let client = ip("192.0.2.1");

    // First request: no session cookie, balanced fresh; the table learns nothing yet.
    assert_eq!(spec.request_key(client, std::iter::empty()), None);
    let d = p.decide(Pin::None, T0);
    let node = d.node().expect("a node is up");
    // The node's response starts a session: learn it.
    let set_cookie: [&[u8]; 2] = [
        b"theme=dark; Path=/",
        b"JSESSIONID=8F3A1C0DE5B74A2F9C1D3E5A7B9C0D1E; Path=/app; HttpOnly",
    ];
    let learned = spec
        .response_key(set_cookie)
        .expect("the response sets the cookie");
    t.learn(learned, node, T0);

    // Later requests carry the cookie, from anywhere (another address, another port).
    let cookie: [&[u8]; 1] = [b"theme=dark; JSESSIONID=8F3A1C0DE5B74A2F9C1D3E5A7B9C0D1E"];
    let key = spec
        .request_key(ip("198.51.100.9"), cookie)
        .expect("the request carries the cookie");
    let pin = t.lookup(key, T0 + MIN);
    assert_eq!(pin, Pin::Node(node));
    assert_eq!(p.decide(pin, T0 + MIN), Decision::Sticky(node));

    // Another session id is another key.
    let other: [&[u8]; 1] = [b"JSESSIONID=0000"];
    let key = spec.request_key(client, other).expect("cookie present");
    assert_eq!(t.lookup(key, T0 + MIN), Pin::None);
}

#[test]
fn a_header_key_pins_by_value() {
    let p = pool(&["a", "b"]);
    let spec = KeySpec::header("X-Tenant").expect("valid");
    let mut t = AffinityTable::new(store(100, 30 * MIN), &p);
    let client = ip("192.0.2.1");
    let acme = spec.request_key(client, [&b"acme"[..]]).expect("value");
    t.learn(acme, id(&p, "b"), T0);
    let again = spec
        .request_key(ip("192.0.2.99"), [&b" acme "[..]])
        .expect("value");
    assert_eq!(t.lookup(again, T0 + 1), Pin::Node(id(&p, "b")));
}

#[test]
fn pins_follow_node_names_across_a_reload() {
    let p1 = pool(&["lviv", "kyiv", "odesa"]);
    let mut t = AffinityTable::new(store(100, 30 * MIN), &p1);
    t.learn(host("10.0.0.1"), id(&p1, "lviv"), T0);
    t.learn(host("10.0.0.2"), id(&p1, "kyiv"), T0);
    t.learn(host("10.0.0.3"), id(&p1, "odesa"), T0);

    // Reload: lviv removed, the others reordered, a new node added.
    let mut p2 = pool(&["dnipro", "odesa", "kyiv"]);
    t.rebind(&p2);
    assert_eq!(
        t.lookup(host("10.0.0.2"), T0 + 1),
        Pin::Node(id(&p2, "kyiv"))
    );
    assert_eq!(
        t.lookup(host("10.0.0.3"), T0 + 1),
        Pin::Node(id(&p2, "odesa"))
    );
    let pin = t.lookup(host("10.0.0.1"), T0 + 1);
    assert_eq!(pin, Pin::Unknown);
    // decide re-pins it, and recording the decision overwrites the stale pin.
    let d = p2.decide(pin, T0 + 1);
    assert!(matches!(
        d,
        Decision::Fresh {
            repin: Some(RepinReason::UnknownNode),
            ..
        }
    ));
    t.record(host("10.0.0.1"), d, T0 + 1);
    assert_eq!(
        t.lookup(host("10.0.0.1"), T0 + 2),
        Pin::Node(d.node().expect("fresh"))
    );

    // The removed node comes back in a later reload: pins to it work again.
    let p3 = pool(&["lviv"]);
    let mut t = AffinityTable::new(store(10, 30 * MIN), &p1);
    t.learn(host("10.0.0.9"), id(&p1, "lviv"), T0);
    t.rebind(&p2);
    assert_eq!(t.lookup(host("10.0.0.9"), T0), Pin::Unknown);
    t.rebind(&p3);
    assert_eq!(t.lookup(host("10.0.0.9"), T0), Pin::Node(id(&p3, "lviv")));
}

#[test]
fn learning_a_node_of_another_pool_stores_nothing() {
    let p = pool(&["a"]);
    let mut t = AffinityTable::new(store(10, 1000), &p);
    assert_eq!(t.learn(host("10.0.0.1"), NodeId(7), T0), None);
    assert!(t.store().is_empty());
}

/// The print-server case: one table named by an HTTP, an HTTPS and a TCP listener. The first
/// connection's choice is the pin for all three, and a dead node moves the client on all three.
#[test]
fn one_table_shared_by_three_listeners() {
    let mut p = pool(&["lviv", "kyiv"]);
    let spec = KeySpec::SourceIp(IpPrefix::HOST);
    let mut shared = AffinityTable::new(store(100_000, 30 * MIN), &p);
    let printer = ip("192.0.2.50");

    // Each listener runs the same steps: key, lookup, decide, record.
    let route = |p: &mut Pool, t: &mut AffinityTable, now: u64| -> NodeId {
        let key = spec
            .request_key(printer, std::iter::empty())
            .expect("source-ip keys always exist");
        let d = p.decide(t.lookup(key, now), now);
        t.record(key, d, now);
        d.node().expect("a node is up")
    };
    // Another client takes the first turn of the rotation, so the printer's first pick is
    // the second node: the later listeners must follow the pin, not the rotation.
    p.decide(Pin::None, T0);
    let http = route(&mut p, &mut shared, T0);
    let https = route(&mut p, &mut shared, T0 + 10);
    let tcp = route(&mut p, &mut shared, T0 + 20);
    assert_eq!((http, https), (tcp, tcp));
    assert_eq!(p.name(tcp), "kyiv");

    p.force_health(tcp, false);
    let moved = route(&mut p, &mut shared, T0 + 30);
    assert_ne!(moved, tcp);
    assert_eq!(route(&mut p, &mut shared, T0 + 40), moved);
    assert_eq!(route(&mut p, &mut shared, T0 + 50), moved);
}

#[test]
fn admin_pages_list_live_entries() {
    let p = pool(&["a", "b"]);
    let mut t = AffinityTable::new(store(100, 1000), &p);
    for i in 0..25u64 {
        t.learn(host(&format!("10.0.0.{i}")), id(&p, "a"), T0 + i * 10);
    }
    let s = t.store();
    let all: Vec<_> = (0..3)
        .flat_map(|page| s.entries(page, 10, T0 + 300))
        .collect();
    assert_eq!(all.len(), 25);
    assert!(all.iter().all(|e| s.node_name(e.node) == Some("a")));
    let e = all
        .iter()
        .find(|e| e.key.to_string() == "10.0.0.3")
        .expect("listed");
    assert_eq!(e.idle_ms, 270);
    assert!(s.entries(3, 10, T0 + 300).is_empty());
    assert!(s.entries(usize::MAX, usize::MAX, T0).is_empty());
    // Past expiry of the first 8 (used at T0..T0+70), they are no longer listed.
    let later: usize = (0..3).map(|pg| s.entries(pg, 10, T0 + 1075).len()).sum();
    assert_eq!(later, 17);
}

#[test]
fn byte_keys_longer_than_the_limit_are_kept_as_digests() {
    let p = pool(&["a"]);
    let mut t = AffinityTable::new(store(10, 1000), &p);
    let long = vec![b'x'; 10_000];
    t.learn(KeyRef::bytes(&long), id(&p, "a"), T0);
    assert_eq!(t.lookup(KeyRef::bytes(&long), T0), Pin::Node(id(&p, "a")));
    let m = t.store().memory();
    assert_eq!(m.key_bytes, 0, "a digest is inline");
}
