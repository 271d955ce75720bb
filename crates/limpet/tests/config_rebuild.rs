//! The structure a reload needs: `State::rebuild` from a new validated config keeps node
//! states and table pins by name, and `Runtime::swap` makes new connections use it.

use std::net::IpAddr;
use std::path::Path;

use limpet::clock::now_ms;
use limpet::config::Config;
use limpet::runtime::{Runtime, State};
use limpet_core::table::{AffinityStore as _, KeyRef};
use limpet_core::{AdminState, NodeState, Pin};
use limpet_core::{Balance, RouteInput};

fn cfg(nodes: &[&str], expire: &str) -> Config {
    let mut text = String::new();
    // Each node at an address of its own name's (a: 127.0.0.2, b: .3, ...): a reload that
    // reorders the nodes moves none of them.
    for n in nodes {
        let host = 2 + n.bytes().next().map_or(0, |b| b.saturating_sub(b'a'));
        text.push_str(&format!(
            "[[nodes]]\nname = \"{n}\"\naddress = \"127.0.0.{host}\"\n"
        ));
    }
    text.push_str(&format!(
        "[[tables]]\nname = \"t\"\nkey = \"source-ip\"\nexpire = \"{expire}\"\n[[listeners]]\nname = \"raw\"\nbind = \"127.0.0.1:0\"\nmode = \"tcp\"\nnode_port = 9\ntable = \"t\"\n"
    ));
    Config::from_text(Path::new("limpet.toml"), &text).unwrap_or_else(|e| panic!("{e}"))
}

fn pin(state: &State, client: &str) -> Option<String> {
    let ip: IpAddr = client.parse().ok()?;
    let table = state.table("t")?;
    let p = table
        .lock()
        .lookup(KeyRef::ip(ip, Default::default()), now_ms());
    match p {
        Pin::Node(id) => Some(state.node_name(id).to_owned()),
        _ => None,
    }
}

#[test]
fn rebuild_keeps_node_states_and_pins_by_name() {
    let old = State::new(cfg(&["a", "b", "c"], "30m")).expect("state");
    let table = old.table("t").expect("table");
    for (client, node) in [("10.0.0.1", "a"), ("10.0.0.2", "b"), ("10.0.0.3", "c")] {
        let id = old.node_id(node).expect("node");
        let ip: IpAddr = client.parse().expect("ip");
        table
            .lock()
            .learn(KeyRef::ip(ip, Default::default()), id, now_ms());
    }
    old.set_admin("b", AdminState::Maint);
    old.force_health("a", false);

    // The new config drops node c and puts a new node d first: ids change, names do not.
    let new = old.rebuild(cfg(&["d", "a", "b"], "30m")).expect("rebuild");
    let state = |n: &str| {
        new.node_views()
            .into_iter()
            .find(|v| v.name == n)
            .map(|v| v.state)
    };
    assert_eq!(state("a"), Some(NodeState::Down));
    assert_eq!(state("b"), Some(NodeState::Maint));
    assert_eq!(state("d"), Some(NodeState::Up));
    assert_eq!(pin(&new, "10.0.0.1").as_deref(), Some("a"));
    assert_eq!(pin(&new, "10.0.0.2").as_deref(), Some("b"));
    assert_eq!(
        pin(&new, "10.0.0.3"),
        None,
        "a pin to a removed node reads as no pin"
    );

    let rt = Runtime::new(old);
    rt.swap(new);
    assert_eq!(rt.state().nodes().len(), 3);
    assert_eq!(rt.state().nodes()[0].name, "d");
}

/// A reload that changes a table's key replaces it (as one that removes it: `reload_runtime`):
/// the generation before it, which a TCP session opened then holds for as long as it is
/// open, lets the replaced table's entries go, and keeps the table the reload carried on.
/// Before, the replaced table's entries stayed in memory until the last such session ended.
#[test]
fn a_table_a_reload_keys_anew_lets_its_entries_go() {
    let with = |tables: &str| {
        let text = format!(
            "[[nodes]]\nname = \"a\"\naddress = \"127.0.0.2\"\n{tables}\
             [[listeners]]\nname = \"raw\"\nbind = \"127.0.0.1:0\"\nmode = \"tcp\"\n\
             node_port = 9\ntable = \"t\"\n"
        );
        Config::from_text(Path::new("limpet.toml"), &text).unwrap_or_else(|e| panic!("{e}"))
    };
    let kept = "[[tables]]\nname = \"t\"\nkey = \"source-ip\"\n";
    let old = State::new(with(&format!(
        "{kept}[[tables]]\nname = \"u\"\nkey = \"source-ip\"\n"
    )))
    .expect("state");
    let a = old.node_id("a").expect("a");
    for name in ["t", "u"] {
        let table = old.table(name).expect("table");
        for i in 1..=100u8 {
            let ip = IpAddr::from([10, 0, 0, i]);
            table
                .lock()
                .learn(KeyRef::ip(ip, Default::default()), a, now_ms());
        }
    }
    // `u` keyed anew: one key per /24.
    let new = old
        .rebuild(with(&format!(
            "{kept}[[tables]]\nname = \"u\"\nkey = \"source-ip\"\nipv4_prefix = 24\n"
        )))
        .expect("rebuild");
    let replaced = old.replaced_tables(&new);
    assert_eq!(
        replaced
            .iter()
            .map(|t| t.def.name.as_str())
            .collect::<Vec<_>>(),
        ["u"]
    );
    for t in &replaced {
        t.let_go();
    }
    let len = |s: &State, name: &str| s.table(name).map(|t| t.lock().store().len());
    assert_eq!(
        len(&old, "u"),
        Some(0),
        "the replaced table's entries let go"
    );
    assert_eq!(len(&old, "t"), Some(100), "the carried table kept whole");
    assert_eq!(len(&new, "t"), Some(100));
    assert_eq!(len(&new, "u"), Some(0), "a table keyed anew starts empty");
    assert_eq!(pin(&new, "10.0.0.7").as_deref(), Some("a"));
}

#[test]
fn rebuild_keeps_the_rotation() {
    let old = State::new(cfg(&["a", "b", "c"], "30m")).expect("state");
    for _ in 0..5 {
        let _ = fresh(&old);
    }
    let new = old.rebuild(cfg(&["a", "b", "c"], "30m")).expect("rebuild");
    assert_eq!(new.rotation(), 5, "a reload does not reset who is next");
    let next = fresh(&new);
    // k = 5 over [a, b, c] is c, as it would have been without the reload.
    assert_eq!(next.as_deref(), Some("c"));
}

/// A fresh assignment through the one routing decision (no cookie, no table).
fn fresh(state: &State) -> Option<String> {
    route_keyed(state, None).0
}

/// A route with no cookie, over table `t` keyed by `client` (a source IP) when given: the
/// node, and the trial's claim when the route is one (held until dropped).
fn route_keyed(
    state: &State,
    client: Option<&str>,
) -> (Option<String>, Option<limpet::nodes::TrialClaim>) {
    let key = client.map(|c| {
        let ip: IpAddr = c.parse().unwrap_or_else(|e| panic!("{e}"));
        KeyRef::ip(ip, Default::default())
    });
    let table = key.map(|k| (&**state.table("t").unwrap_or_else(|| panic!("no table")), k));
    let (r, trial) = state.route(
        table,
        RouteInput {
            cookie: None,
            failback: false,
            conn_pin: None,
            table: None,
            spread_key: 0,
            balance: Balance::RoundRobin,
            exclude: &[],
            now_ms: now_ms(),
        },
        None,
        std::time::Duration::from_secs(1),
        limpet::nodes::TrialBy::Answer,
    );
    (r.node.map(|id| state.node_name(id).to_owned()), trial)
}

#[test]
fn concurrent_fresh_routes_never_share_a_turn_of_the_rotation() {
    const PER_THREAD: usize = 20_000;
    let state = State::new(cfg(&["a", "b"], "30m")).expect("state");
    let counts: Vec<(usize, usize)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    let mut on_a = 0;
                    for _ in 0..PER_THREAD {
                        if fresh(&state).as_deref() == Some("a") {
                            on_a += 1;
                        }
                    }
                    (on_a, PER_THREAD - on_a)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or_else(|_| panic!("worker panicked")))
            .collect()
    });
    let a: usize = counts.iter().map(|c| c.0).sum();
    let b: usize = counts.iter().map(|c| c.1).sum();
    assert_eq!((a, b), (PER_THREAD, PER_THREAD), "per thread: {counts:?}");
    assert_eq!(state.rotation(), 2 * PER_THREAD as u64);
}

/// A DOWN node's trial is claimed inside the route, before anything is written: the session
/// that wins it is pinned to the node on trial, and a second session routed while the trial
/// is held goes elsewhere, with its table entry naming where it went (not the node on trial).
#[tokio::test(start_paused = true)]
async fn a_held_trial_sends_the_next_session_elsewhere_and_pins_it_there() {
    let state = State::new(cfg(&["a", "b"], "30m")).expect("state");
    let a = state.node_id("a").expect("a");
    while state
        .observe(a, limpet_core::Observation::TrafficFailed)
        .is_none()
    {}
    assert_eq!(
        state.node_views()[0].state,
        NodeState::Down,
        "a is DOWN by passive failures"
    );
    // Before fail_timeout, nothing goes to a.
    let (node, trial) = route_keyed(&state, Some("10.0.0.1"));
    assert_eq!((node.as_deref(), trial.is_some()), (Some("b"), false));
    tokio::time::advance(std::time::Duration::from_secs(11)).await;

    let (node, trial) = route_keyed(&state, Some("10.0.0.2"));
    assert_eq!(
        (node.as_deref(), trial.is_some()),
        (Some("a"), true),
        "after fail_timeout the next fresh session tries a"
    );
    assert_eq!(pin(&state, "10.0.0.2").as_deref(), Some("a"));
    let (node, next) = route_keyed(&state, Some("10.0.0.3"));
    assert_eq!(
        (node.as_deref(), next.is_some()),
        (Some("b"), false),
        "a's trial is held: the next session goes to b"
    );
    drop(trial);
    assert_eq!(pin(&state, "10.0.0.3").as_deref(), Some("b"));
}

/// A node's pins are counted over the whole table, past a first page (4096 slots) of
/// entries expired but not yet purged. Before, the count stopped at the first page with no
/// live entry: after a burst of expiries, a node's pins read 0.
#[test]
fn pins_are_counted_past_a_page_of_expired_entries() {
    let state = State::new(cfg(&["a"], "1s")).expect("state");
    let table = state.table("t").expect("table");
    let a = state.node_id("a").expect("node");
    let now = now_ms();
    {
        let mut t = table.lock();
        for i in 0..5_000u32 {
            let ip = IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i));
            t.learn(KeyRef::ip(ip, Default::default()), a, now - 60_000);
        }
        for i in 0..3u32 {
            let ip = IpAddr::from(std::net::Ipv4Addr::from(0x0b00_0000 + i));
            t.learn(KeyRef::ip(ip, Default::default()), a, now);
        }
    }
    let view = state
        .node_views()
        .into_iter()
        .find(|v| v.name == "a")
        .expect("a");
    assert_eq!(view.pins.get("t"), Some(&3), "{:?}", view.pins);
}
