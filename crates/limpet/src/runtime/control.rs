//! The runtime behind the admin API ([`RuntimeControl`]), behind the health checks
//! ([`RuntimeSink`]), the reload, and the start of the lifecycle tasks.

use std::sync::{Arc, Weak};
use std::time::Duration;

use limpet_core::table::{AffinityStore, KeyKind, KeySpec, TableKey};
use limpet_core::{AdminState, CheckSlot, Observation};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::admin::{
    drain_complete, BoxFuture, Control, ControlError, DrainView, EntryView, NodeCommand, NodeView,
    ReloadReport, TablePage, TableView,
};
use crate::clock::now_ms;
use crate::config::Config;
use crate::health::{CheckDetail, HealthSink};
use crate::lifecycle::lock;
use crate::metrics::Metrics;
use crate::runtime::{stopped, Runtime, State, Table};

/// Health check results into the runtime's state machine.
#[derive(Debug)]
pub struct RuntimeSink {
    pub runtime: Weak<Runtime>,
}

impl HealthSink for RuntimeSink {
    fn record(
        &self,
        node: &str,
        check: CheckSlot,
        ok: bool,
        answered: bool,
        _detail: &CheckDetail,
    ) -> Option<limpet_core::Transition> {
        // State::observe counts and logs the transition (as for passive failures). A pass
        // with an answer (an HTTP check's status, on a port traffic reaches) proves the
        // node's process answers; a TCP connect or a TLS handshake (or an answer on another
        // port) only that it takes connections.
        let obs = if ok && answered {
            Observation::CheckPassed(check)
        } else if ok {
            Observation::CheckConnected(check)
        } else {
            Observation::CheckFailed(check)
        };
        self.runtime.upgrade()?.state().observe_named(node, obs)
    }

    fn forget(&self, node: &str, check: CheckSlot) {
        if let Some(rt) = self.runtime.upgrade() {
            rt.state().forget_check(node, check);
        }
    }

    fn answered(&self, node: &str, port: u16, sent_at: tokio::time::Instant) {
        if let Some(rt) = self.runtime.upgrade() {
            let state = rt.state();
            if let Some(n) = state.node_id(node).and_then(|id| state.node_rt(id)) {
                n.answered(port, crate::clock::us_at(sent_at));
            }
        }
    }
}

/// The admin API's view of the running limpet.
#[derive(Debug)]
pub struct RuntimeControl {
    pub runtime: Arc<Runtime>,
}

fn key_text(spec: &KeySpec) -> String {
    match spec {
        KeySpec::SourceIp(p) => format!("source-ip /{} /{}", p.v4(), p.v6()),
        KeySpec::Header(h) => format!("header {h}"),
        KeySpec::AppCookie(c) => format!("app-cookie {c}"),
        KeySpec::LearnHeader(h) => format!("learn-header {h}"),
    }
}

fn table<'a>(state: &'a State, name: &str) -> Result<&'a Arc<Table>, ControlError> {
    state
        .table(name)
        .ok_or_else(|| ControlError::NotFound(format!("no table {name:?}")))
}

/// Reads an entry key as the admin writes it, as the keys it can name, most likely first:
/// an IP address for source-IP tables (masked by the table's prefix); for header and cookie
/// tables the key as the table's listing shows it (`sha256:` and hex for a long value,
/// escapes for quotes, backslashes and bytes that are not printable ASCII) or the value
/// as it is ([`value_keys_shown_as`](limpet_core::table::value_keys_shown_as)).
fn parse_key(t: &Table, key: &str) -> Result<Vec<TableKey>, ControlError> {
    match &t.def.key {
        KeySpec::SourceIp(_) => {
            let ip: std::net::IpAddr = key
                .parse()
                .map_err(|_| ControlError::BadRequest(format!("{key:?} is not an IP address")))?;
            t.def
                .key
                .request_key(ip, std::iter::empty::<&[u8]>())
                .map(|k| vec![k.to_key()])
                .ok_or_else(|| ControlError::BadRequest(format!("no key for {key:?}")))
        }
        _ => Ok(limpet_core::table::value_keys_shown_as(key)),
    }
}

/// Refuses an admin write once this limpet began handing its state over to a new one (an
/// upgrade): the new one takes the nodes' states and the tables as they are then, so a
/// write here would change only a process about to exit, and be lost with it. Refused, the
/// operator's retry reaches the new limpet, which has the admin listener's socket by then
/// (or this one again, should the hand-over fail).
fn writable(state: &State) -> Result<(), ControlError> {
    if state
        .lifecycle
        .handing_state_over
        .load(std::sync::atomic::Ordering::Acquire)
    {
        return Err(ControlError::Stopping(
            "limpet is handing over to a new process (an upgrade): write refused; \
             retry, the new one answers on this address"
                .into(),
        ));
    }
    Ok(())
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl RuntimeControl {
    /// The nodes as the admin API shows them; their table pins counted when `pins` says
    /// ([`State::node_views_counting`]).
    fn view(&self, state: &State, pins: bool) -> Vec<NodeView> {
        let life = &state.lifecycle;
        let board = life.board();
        let def = life.def();
        let now = now_ms();
        // Every listener forwards to every node (each has an upstream per node).
        let listeners: Vec<crate::admin::ListenerRef> = state
            .listeners
            .iter()
            .map(|l| {
                let d = l.def.load();
                crate::admin::ListenerRef {
                    name: d.name.clone(),
                    mode: match d.mode {
                        crate::config::Mode::Http => "http",
                        crate::config::Mode::Tcp => "tcp",
                    },
                }
            })
            .collect();
        state
            .node_views_counting(pins)
            .into_iter()
            .map(|v| {
                let rt = life.node(&v.name);
                let (seen, ago) = rt.seen_stats();
                let tunnels = rt.tunnels();
                let active = u64::from(v.active);
                let drain = match v.status.admin {
                    AdminState::Drain {
                        deadline_ms,
                        spread_ms,
                    } => Some(DrainView {
                        deadline_unix_ms: deadline_ms,
                        spread_ms,
                        complete: drain_complete(rt.open_to_drain(), ago, def.drain_idle),
                    }),
                    _ => None,
                };
                NodeView {
                    checks: board.node(&v.name),
                    address: v.addr.to_string(),
                    weight: v.weight,
                    state: v.state.as_str(),
                    admin: match v.status.admin {
                        AdminState::Ready => "ready",
                        AdminState::Drain { .. } => "drain",
                        AdminState::Maint => "maint",
                    },
                    healthy: v.status.health.is_up(),
                    in_state_ms: ms(rt.in_state_for()),
                    health: crate::admin::HealthView::of(v.status.health, v.status.policy, now),
                    drain,
                    active_connections: active.max(tunnels),
                    tunnels,
                    queued: u64::from(rt.queued()),
                    table_pins: v.pins.values().sum(),
                    sessions_seen: seen,
                    seen_window_secs: def.seen_window.as_secs(),
                    last_seen_ago_ms: ago.map(ms),
                    traffic: life.metrics.traffic(&v.name, now),
                    listeners: listeners.clone(),
                    name: v.name,
                }
            })
            .collect()
    }
}

impl Control for RuntimeControl {
    fn nodes(&self) -> Vec<NodeView> {
        self.view(&self.runtime.state(), true)
    }

    fn node_states(&self) -> Vec<NodeView> {
        self.view(&self.runtime.state(), false)
    }

    fn set_node(&self, node: &str, cmd: NodeCommand) -> Result<NodeView, ControlError> {
        let state = self.runtime.state();
        writable(&state)?;
        let life = Arc::clone(&state.lifecycle);
        let def = life.def();
        let admin = match cmd {
            NodeCommand::Ready => AdminState::Ready,
            NodeCommand::Maint => AdminState::Maint,
            NodeCommand::Drain { deadline, spread } => AdminState::Drain {
                deadline_ms: deadline.map(|d| now_ms().saturating_add(ms(d))),
                spread_ms: ms(spread.unwrap_or(def.drain_spread)),
            },
        };
        state
            .set_admin(node, admin)
            .ok_or_else(|| ControlError::NotFound(format!("no node {node:?}")))?;
        // MAINT and drain deadlines end the node's sessions through the node runtime
        // (`NodeRuntime::session_end`): each session watches it, whatever generation opened it.
        let rt = life.node(node);
        let n = rt.command();
        if let NodeCommand::Drain {
            deadline: Some(d), ..
        } = cmd
        {
            // Only a log line at the deadline (the deadline itself is the node's state); it
            // ends with the next command to the node, or a reload removing or re-adding it.
            tokio::spawn(async move {
                tokio::select! {
                    () = tokio::time::sleep(d) => tracing::info!(
                        node = rt.name(),
                        "drain deadline: sessions re-pinned and closed over the spread window"
                    ),
                    () = rt.superseded(n) => {}
                }
            });
        }
        self.view(&state, true)
            .into_iter()
            .find(|v| v.name == node)
            .ok_or_else(|| ControlError::NotFound(format!("no node {node:?}")))
    }

    fn tables(&self) -> Vec<TableView> {
        let state = self.runtime.state();
        state
            .tables()
            .map(|t| {
                // What the table runs with, not what the file says: the two agree unless a
                // change failed to apply, and then the view must not hide it.
                let (stats, size, expire_ms, held) = {
                    let tl = t.lock();
                    let s = tl.store();
                    (s.stats(), s.size(), s.expire_ms(), s.held())
                };
                TableView {
                    name: t.def.name.clone(),
                    key: key_text(&t.def.key),
                    size: stats.len,
                    capacity: u64::from(size),
                    expire_secs: expire_ms / 1000,
                    evictions: stats.evictions,
                    held: held as u64,
                    refused: stats.refused,
                }
            })
            .collect()
    }

    fn table_page(
        &self,
        name: &str,
        offset: usize,
        limit: usize,
    ) -> Result<TablePage, ControlError> {
        let state = self.runtime.state();
        let t = table(&state, name)?;
        let limit = limit.max(1);
        let expire = ms(t.def.expire);
        let tl = t.lock();
        let store = tl.store();
        let entries = store
            .entries_at(offset, limit, now_ms())
            .into_iter()
            .map(|e| EntryView {
                key: e.key.to_string(),
                node: store.node_name(e.node).unwrap_or("").to_owned(),
                expires_in_ms: expire.saturating_sub(e.idle_ms),
            })
            .collect();
        Ok(TablePage {
            table: name.to_owned(),
            offset,
            limit,
            total: store.len() as u64,
            entries,
        })
    }

    fn table_get(&self, name: &str, key: &str) -> Result<Option<EntryView>, ControlError> {
        let state = self.runtime.state();
        let t = table(&state, name)?;
        let keys = parse_key(t, key)?;
        let tl = t.lock();
        let store = tl.store();
        // A look, not a use: it neither refreshes the entry nor counts a hit.
        let now = now_ms();
        Ok(keys.iter().find_map(|k| {
            store
                .peek_idle(k.as_key_ref(), now)
                .map(|(node, idle)| EntryView {
                    key: k.to_string(),
                    node: store.node_name(node).unwrap_or("").to_owned(),
                    expires_in_ms: store.expire_ms().saturating_sub(idle),
                })
        }))
    }

    fn table_delete(&self, name: &str, key: &str) -> Result<bool, ControlError> {
        let state = self.runtime.state();
        writable(&state)?;
        let t = table(&state, name)?;
        let keys = parse_key(t, key)?;
        let mut tl = t.lock();
        // The first of the keys the text names that the table has.
        let removed = keys
            .iter()
            .find(|k| tl.store_mut().remove(k.as_key_ref()).is_some());
        if let Some(k) = removed {
            // A cookie's or a header's value is an application session id, which the admin
            // API shows only to a holder of the token (docs/admin.md): the log, read more
            // widely, does not get it. A client address it does, as the access log has it.
            match k.kind() {
                KeyKind::V4 | KeyKind::V6 => {
                    tracing::info!(table = %name, key = %k, "operator deleted table entry");
                }
                KeyKind::Bytes | KeyKind::Digest => tracing::info!(
                    table = %name,
                    key = "(a session id: not logged)",
                    "operator deleted table entry"
                ),
            }
        }
        Ok(removed.is_some())
    }

    fn table_clear(&self, name: &str) -> Result<u64, ControlError> {
        let state = self.runtime.state();
        writable(&state)?;
        let t = table(&state, name)?;
        let mut tl = t.lock();
        let n = tl.store().len() as u64;
        tl.store_mut().clear();
        Ok(n)
    }

    fn reload(&self) -> BoxFuture<'_, Result<ReloadReport, ControlError>> {
        Box::pin(async move {
            // The new limpet read the file at its start; a reload here would apply to a
            // process about to exit. Asked again once done: a reload that was under way
            // as the hand-over began applied here alone, and is to be sent again.
            writable(&self.runtime.state())?;
            let report = reload(&self.runtime).await?;
            if writable(&self.runtime.state()).is_err() {
                return Err(ControlError::Stopping(
                    "the reload was applied to this limpet, which is handing over to a new \
                     process (an upgrade): send it again to reach the new one"
                        .into(),
                ));
            }
            Ok(report)
        })
    }

    fn metrics(&self) -> Arc<Metrics> {
        Arc::clone(&self.runtime.state().lifecycle.metrics)
    }

    fn store(&self) -> Option<crate::store::StoreStatus> {
        self.runtime.state().store().map(|s| s.status())
    }
}

/// Reloads the configuration file of the running state: validated first (a bad file is
/// refused with the reason, and nothing changes), then swapped in. Unchanged nodes keep
/// their state, health and pins; removed nodes are set to MAINT in the old state (their TCP
/// sessions and tunnels close, their pins re-pin); health checks are updated in place.
///
/// The reload runs on a task of its own (`ReloadTasks`): a caller that goes away (an
/// admin client that hung up, or timed out, while the file was read) does not cut it short,
/// so a reload asked for is applied or refused whole, logged, and told to systemd, as a
/// SIGHUP's is. A request that comes while another reload waits its turn shares that one's
/// result: it will read the file after this request came, which is all a request asks. Once
/// a stop began a reload is refused (`ControlError::Stopping` through the API), and one still
/// reading its file then is cut short, before it changed anything.
pub async fn reload(runtime: &Arc<Runtime>) -> Result<ReloadReport, ControlError> {
    let life = Arc::clone(&runtime.state().lifecycle);
    let Some(mut result) = life.reload_tasks.ask(runtime) else {
        return Err(ControlError::Stopping(
            "limpet is stopping: reload refused".into(),
        ));
    };
    let got = result
        .wait_for(Option::is_some)
        .await
        .ok()
        .and_then(|r| r.clone());
    match got {
        Some(r) => r.map_err(ControlError::Refused),
        // Ended without a result: aborted by a stop, or failed (a panic, logged by tokio).
        None if life.reload_tasks.stopped() => Err(ControlError::Stopping(
            "limpet is stopping: the reload was cut short before it changed anything".into(),
        )),
        None => Err(ControlError::Internal(
            "the reload failed; see the log".into(),
        )),
    }
}

/// A reload's result, once it has one.
type ReloadResult = watch::Receiver<Option<Result<ReloadReport, String>>>;

/// One reload, whole: waits for the reloads before it (one at a time), reads and checks the
/// file, swaps it in, and says what happened (log, metrics, systemd).
async fn reload_whole(runtime: &Arc<Runtime>, mine: &ReloadResult) -> Result<ReloadReport, String> {
    let life = Arc::clone(&runtime.state().lifecycle);
    let mut blocked = life.reloading.lock().await;
    // Its turn: a request from now on reads the file after this one did, in a reload of its
    // own.
    life.reload_tasks.started(mine);
    let notice = crate::notify::Reload::begin();
    let result = reload_locked(runtime, &mut blocked).await;
    life.metrics.reload(result.is_ok());
    match &result {
        Ok(r) => {
            tracing::info!(generation = r.generation, changes = ?r.changes, "configuration reloaded");
            notice.done(&format!(
                "serving; configuration generation {} loaded",
                r.generation
            ));
        }
        Err(e) => {
            tracing::warn!(error = %e, "configuration reload refused; the running configuration stays");
            notice.done(&format!("serving; reload refused: {e}"));
        }
    }
    result
}

/// The reloads of one limpet, whoever asked for them (SIGHUP or the admin API): each runs on
/// a task of its own, which its callers only wait for, and a request that comes while one
/// waits its turn joins that one (so callers that retry and give up cannot queue reloads
/// without bound: at most one runs and one waits). A stop aborts the ones still running and
/// refuses later ones: a reload applied mid-drain would start again the health checks the
/// drain stopped, and close sessions of nodes it removed while the drain lets them finish.
/// A reload changes nothing before its file is read and checked, and applies it under this
/// owner's lock ([`applying`](Self::applying)), which a stop takes too: so a reload is
/// either applied whole before the stop or not at all, on any runtime.
#[derive(Debug)]
pub(crate) struct ReloadTasks(std::sync::Mutex<Reloads>);

#[derive(Debug, Default)]
struct Reloads {
    stopped: bool,
    /// The reloads started and not known to be over.
    running: Vec<tokio::task::AbortHandle>,
    /// The result of the reload waiting its turn (not yet reading the file), if one does.
    waiting: Option<ReloadResult>,
}

impl Default for ReloadTasks {
    fn default() -> Self {
        Self(std::sync::Mutex::new(Reloads::default()))
    }
}

impl ReloadTasks {
    /// A reload of `runtime`'s file: the one waiting its turn, or a new one on a task of its
    /// own (on the current runtime); `None` once a stop began.
    fn ask(&self, runtime: &Arc<Runtime>) -> Option<ReloadResult> {
        let mut r = lock(&self.0);
        if r.stopped {
            return None;
        }
        if let Some(waiting) = &r.waiting {
            return Some(waiting.clone());
        }
        let (tx, rx) = watch::channel(None);
        let runtime = Arc::clone(runtime);
        r.running.retain(|t| !t.is_finished());
        let mine = rx.clone();
        let task = tokio::spawn(async move {
            let result = reload_whole(&runtime, &mine).await;
            tx.send_replace(Some(result));
        });
        r.running.push(task.abort_handle());
        r.waiting = Some(rx.clone());
        Some(rx)
    }

    /// The reload whose result is `mine` has its turn now: it no longer waits.
    fn started(&self, mine: &ReloadResult) {
        let mut r = lock(&self.0);
        if r.waiting.as_ref().is_some_and(|w| w.same_channel(mine)) {
            r.waiting = None;
        }
    }

    fn stopped(&self) -> bool {
        lock(&self.0).stopped
    }

    /// Held while a reload applies what it read: `None` once a stop began (the reload then
    /// changes nothing).
    fn applying(&self) -> Option<std::sync::MutexGuard<'_, Reloads>> {
        Some(lock(&self.0)).filter(|r| !r.stopped)
    }

    /// A stop began: waits for a reload applying to end, aborts the reloads still running,
    /// refuses later ones.
    pub(crate) fn stop(&self) {
        let running = {
            let mut r = lock(&self.0);
            r.stopped = true;
            r.waiting = None;
            std::mem::take(&mut r.running)
        };
        for t in running {
            t.abort();
        }
    }
}

/// How long a reload may take to read and check the file. Reading can block (a config on a
/// hung network mount, a FIFO) and checking resolves node host names, bounded only by the
/// resolver's own timeouts: past this the reload is refused. The blocked read is left to
/// finish on its thread, and the next reload first waits for it, within the same limit.
pub const RELOAD_LOAD_LIMIT: Duration = Duration::from_secs(30);

/// A reload's read and check of the file, on a blocking thread.
pub(crate) type ConfigLoad = tokio::task::JoinHandle<Result<Config, crate::config::ConfigError>>;

/// Whether two `bind` lists hold the same addresses, in whatever order.
fn same_addresses(a: &[std::net::SocketAddr], b: &[std::net::SocketAddr]) -> bool {
    a.len() == b.len() && a.iter().all(|x| b.contains(x)) && b.iter().all(|x| a.contains(x))
}

async fn reload_locked(
    runtime: &Arc<Runtime>,
    blocked: &mut Option<ConfigLoad>,
) -> Result<ReloadReport, String> {
    let state = runtime.state();
    let path = state.config.path.clone();
    let too_slow = |what: &str| {
        format!(
            "{}: {what} within {} s (a blocked read or slow name resolution)",
            path.display(),
            RELOAD_LOAD_LIMIT.as_secs()
        )
    };
    if let Some(previous) = blocked.as_mut() {
        // Its result is stale: only its thread is waited for.
        if tokio::time::timeout(RELOAD_LOAD_LIMIT, previous)
            .await
            .is_err()
        {
            return Err(too_slow("the previous reload's read has not returned"));
        }
        *blocked = None;
    }
    let load_path = path.clone();
    let mut load = tokio::task::spawn_blocking(move || Config::load(&load_path));
    let cfg = match tokio::time::timeout(RELOAD_LOAD_LIMIT, &mut load).await {
        Ok(done) => done
            .map_err(|e| format!("reload task failed: {e}"))?
            .map_err(|e| e.to_string())?,
        Err(_) => {
            *blocked = Some(load);
            return Err(too_slow("not read and checked"));
        }
    };
    let old = &state.config;
    // Listeners are bound once, at start. A refusal names the file, line and key of the new
    // configuration, as a refusal found while checking it would.
    let refuse = |i: usize, field: &str, msg: String| {
        cfg.places
            .error(&path, &format!("listeners[{i}].{field}"), msg)
            .to_string()
    };
    for (i, l) in cfg.listeners.iter().enumerate() {
        match old.listeners.iter().find(|o| o.name == l.name) {
            None => {
                return Err(refuse(
                    i,
                    "name",
                    format!(
                        "listener {:?} is new: adding a listener needs a restart",
                        l.name
                    ),
                ))
            }
            // As a set: the same addresses in another order bind the same sockets.
            Some(o) if !same_addresses(&o.bind, &l.bind) => {
                return Err(refuse(
                    i,
                    "bind",
                    format!(
                        "listener {:?}: bind addresses changed: that needs a restart",
                        l.name
                    ),
                ))
            }
            // Its sockets are served by an HTTP or a TCP accept loop, chosen at start.
            Some(o) if o.mode != l.mode => {
                return Err(refuse(
                    i,
                    "mode",
                    format!("listener {:?}: mode changed: that needs a restart", l.name),
                ))
            }
            Some(_) => {}
        }
    }
    if let Some((i, o)) = old
        .listeners
        .iter()
        .enumerate()
        .find(|(_, o)| !cfg.listeners.iter().any(|l| l.name == o.name))
    {
        // The new file has no place for it: name where the running one had it.
        let was = old
            .places
            .get(&format!("listeners[{i}].name"))
            .map(|(line, _)| format!(" (line {line} of the running configuration)"))
            .unwrap_or_default();
        return Err(cfg
            .places
            .error(
                &path,
                "listeners",
                format!(
                    "listener {:?}{was} is gone: removing a listener needs a restart",
                    o.name
                ),
            )
            .to_string());
    }
    // Every setting that changed inside what both have, by its key.
    let settings = crate::config::setting_changes(&old.listing, &cfg.listing);
    let mut changes = Vec::new();
    let removed: Vec<String> = old
        .nodes
        .iter()
        .filter(|o| !cfg.nodes.iter().any(|n| n.name == o.name))
        .map(|o| o.name.clone())
        .collect();
    for n in &cfg.nodes {
        match old.nodes.iter().find(|o| o.name == n.name) {
            None => changes.push(format!("node {} added", n.name)),
            // A node given by host name lists the same name; what it resolves to moved.
            Some(o)
                if o.addr != n.addr
                    && !settings
                        .iter()
                        .any(|c| c.starts_with(&format!("node {}: address:", n.name))) =>
            {
                changes.push(format!(
                    "node {}: its address is {} now (was {}): its health starts anew",
                    n.name, n.addr, o.addr
                ))
            }
            Some(_) => {}
        }
    }
    for n in &removed {
        changes.push(format!("node {n} removed (its pins re-pin as for MAINT)"));
    }
    for t in &cfg.tables {
        match old.table(&t.name) {
            None => changes.push(format!("table {} added", t.name)),
            Some(o) if o.key != t.key => {
                changes.push(format!("table {} key changed: entries dropped", t.name))
            }
            Some(_) => {}
        }
    }
    for o in old.tables.iter().filter(|o| cfg.table(&o.name).is_none()) {
        changes.push(format!("table {} removed: its entries dropped", o.name));
    }
    // A table the reload adds starts from its snapshot file, as at a start: read here,
    // before anything applies (within the start's bound), and restored into the new table
    // before it serves. Before, it started empty, and its first save wrote over the file: a
    // table removed by one reload and added back by another lost its pins on disk too.
    let added_snapshots: Vec<(String, std::path::PathBuf)> = cfg
        .tables
        .iter()
        .filter(|t| old.table(&t.name).is_none())
        .filter_map(|t| Some((t.name.clone(), t.snapshot.as_ref()?.path.clone())))
        .collect();
    let snapshots_read =
        super::snapshot::read_snapshots(added_snapshots.iter().map(|(_, p)| p.clone()).collect())
            .await;
    changes.extend(settings);
    let new_def = cfg.lifecycle.clone();
    if new_def.admin != state.lifecycle.def().admin {
        changes.push("[admin] settings changed: they apply after a restart".into());
    }
    // Against the store running, not the last file's: a reload keeps the connection it
    // started with, so an unapplied change is named at every reload until a restart.
    if cfg.store.as_ref() != state.store().map(|s| s.def()) {
        changes.push("[store] settings changed: they apply after a restart".into());
    }
    // From here to the end, nothing waits: the rest is applied whole, or, once a stop
    // began, not at all.
    let Some(applying) = state.lifecycle.reload_tasks.applying() else {
        return Err("limpet is stopping: nothing of this reload was applied".into());
    };
    let next = state.rebuild(cfg)?;
    for ((name, path), read) in added_snapshots.iter().zip(snapshots_read) {
        if let Some(table) = next.table(name) {
            if let super::SnapshotLoad::Loaded { loaded, .. } =
                super::snapshot::restore_read(table, path, read)
            {
                changes.push(format!(
                    "table {name}: {loaded} pins loaded from its snapshot"
                ));
            }
        }
    }
    // Removed nodes: MAINT in their runtime, so the sessions still open to them close and
    // the pins move; new connections never see them (a node added back starts fresh).
    for n in &removed {
        state.set_admin(n, AdminState::Maint);
    }
    // The tables it replaces save no more from before the swap: a save of one let in after
    // the new table's would write its entries over them (`snapshot::save_snapshot`).
    let replaced = state.replaced_tables(&next);
    for t in &replaced {
        t.retire();
    }
    runtime.swap(next);
    // What the replaced tables counted since the last scrape, to the counters now (the
    // scrapes read the running tables). One whose name and key the new config keeps had its
    // totals carried to the new table, which the scrapes go on diffing.
    {
        let running = runtime.state();
        for t in &replaced {
            let key = key_text(&t.def.key);
            let kept = running
                .table(&t.def.name)
                .is_some_and(|n| key_text(&n.def.key) == key);
            if !kept {
                let stats = t.lock().store().stats();
                state.lifecycle.metrics.table_replaced(
                    &t.def.name,
                    &key,
                    stats.evictions,
                    stats.refused,
                );
            }
        }
    }
    // The tables the reload replaced: their entries go now, not with the last connection of
    // the generation before (a TCP session holds it while open), on a blocking thread;
    // awaited once the rest is applied.
    let let_go = (!replaced.is_empty())
        .then(|| tokio::task::spawn_blocking(move || replaced.iter().for_each(|t| t.let_go())));
    let life = Arc::clone(&state.lifecycle);
    // The node-state file lists the running config's nodes: a removed one leaves it.
    life.admin_changed.notify_one();
    // Listener `max_connections`: the limits the listening sockets share, changed in place.
    {
        let defs: Vec<_> = runtime
            .state()
            .listeners
            .iter()
            .map(|l| l.def.load_full())
            .collect();
        life.apply_conn_limits(
            defs.iter()
                .map(|d| (d.name.as_str(), d.limits.max_client_connections)),
        );
    }
    let mut keep = new_def.clone();
    keep.admin = life.def().admin.clone();
    life.def.store(Arc::new(keep));
    life.nodes.set_seen_window(new_def.seen_window);
    lock(&life.checks).update(
        new_def.checks.clone(),
        Arc::new(RuntimeSink {
            runtime: Arc::downgrade(runtime),
        }),
    );
    // Applied whole: a stop may come from here on.
    drop(applying);
    if let Some(h) = let_go {
        let _ = h.await;
    }
    Ok(ReloadReport {
        generation: life.reloaded(),
        changes,
    })
}

/// Starts the lifecycle of a running limpet: its health checks, its admin listener (when
/// configured; refused off loopback without a token) and the drain-completion log. Every
/// task ends when `shutdown` turns true.
///
/// `admin_socket` is the admin listener's socket when the caller has it already (bound, or
/// taken over from a running limpet, `crate::upgrade`); else it is bound here. The admin
/// listener accepts once `go` turns true and until `accept_stop` or `shutdown` does; its
/// accept loop is counted in the lifecycle's `accepting` from now on.
pub async fn start(
    runtime: &Arc<Runtime>,
    tasks: &mut JoinSet<()>,
    shutdown: &watch::Receiver<bool>,
    admin_socket: Option<std::net::TcpListener>,
    go: &watch::Receiver<bool>,
    accept_stop: &watch::Receiver<bool>,
) -> Result<(), String> {
    let state = runtime.state();
    let life = Arc::clone(&state.lifecycle);
    let def = life.def();
    if let Some(admin) = &def.admin {
        admin.validate().map_err(|e| e.to_string())?;
    }
    lock(&life.checks).update(
        def.checks.clone(),
        Arc::new(RuntimeSink {
            runtime: Arc::downgrade(runtime),
        }),
    );
    let control: Arc<dyn Control> = Arc::new(RuntimeControl {
        runtime: Arc::clone(runtime),
    });
    if let Some(admin) = &def.admin {
        let listener = match admin_socket {
            Some(l) => TcpListener::from_std(l),
            None => TcpListener::bind(admin.listen).await,
        }
        .map_err(|e| format!("admin listener: cannot bind {}: {e}", admin.listen))?;
        let local = listener.local_addr().unwrap_or(admin.listen);
        let _ = life.admin_addr.set(local);
        tracing::info!(addr = %local, "admin API and stats page on {}", crate::admin::describe(local));
        serve_admin(
            runtime,
            tasks,
            listener,
            Turn {
                shutdown,
                go,
                accept_stop,
            },
        );
    }
    if let Some(path) = def.admin.as_ref().and_then(|a| a.state_file.clone()) {
        let mut stop = shutdown.clone();
        let runtime = Arc::clone(runtime);
        let serving = go.clone();
        tasks.spawn(async move {
            tokio::select! {
                () = super::node_states::write_on_change(runtime, path, serving) => {}
                () = stopped(&mut stop) => {}
            }
        });
    }
    {
        let mut stop = shutdown.clone();
        let life = Arc::clone(&life);
        tasks.spawn(async move {
            tokio::select! {
                () = crate::admin::log_drain_completions(control, Duration::from_secs(1)) => {}
                () = stopped(&mut stop) => {}
            }
            lock(&life.checks).stop();
        });
    }
    Ok(())
}

/// When a listener of the running limpet accepts: from `go` turning true until
/// `accept_stop` or `shutdown` does.
#[derive(Debug, Clone, Copy)]
pub(super) struct Turn<'a> {
    pub(super) shutdown: &'a watch::Receiver<bool>,
    pub(super) go: &'a watch::Receiver<bool>,
    pub(super) accept_stop: &'a watch::Receiver<bool>,
}

/// Serves the admin API on `listener` (bound, from the config's `[admin]`, which must be
/// set), in `turn`; its accept loop is counted in the lifecycle's `accepting`. At start,
/// and again when a limpet serves its sockets anew after a new one did not take over
/// (`Running::resume`).
pub(super) fn serve_admin(
    runtime: &Arc<Runtime>,
    tasks: &mut JoinSet<()>,
    listener: TcpListener,
    turn: Turn<'_>,
) {
    let life = Arc::clone(&runtime.state().lifecycle);
    let def = life.def();
    let Some(admin) = &def.admin else {
        return;
    };
    let mut settings = admin.clone();
    settings.listen = listener.local_addr().unwrap_or(admin.listen);
    let control: Arc<dyn Control> = Arc::new(RuntimeControl {
        runtime: Arc::clone(runtime),
    });
    let mut stop = turn.shutdown.clone();
    let mut accept_stop = turn.accept_stop.clone();
    let mut go = turn.go.clone();
    let accepting = life.accepting.enter();
    tasks.spawn(async move {
        tokio::select! {
            biased;
            () = stopped(&mut stop) => return,
            () = stopped(&mut accept_stop) => return,
            r = go.wait_for(|g| *g) => if r.is_err() { return },
        }
        crate::admin::serve(listener, control, settings, async move {
            tokio::select! {
                () = stopped(&mut stop) => {}
                () = stopped(&mut accept_stop) => {}
            }
            drop(accepting);
        })
        .await;
    });
}

/// The signals `limpet run` answers, registered once and early: from then on SIGTERM, SIGINT,
/// SIGHUP and SIGUSR2 no longer end the process by their default action (a new limpet taking
/// over from a running one must not die between "ready" and serving: `crate::upgrade`), and
/// one that comes before they are awaited is kept for [`serve_signals_with`].
#[derive(Debug)]
pub struct Signals {
    #[cfg(unix)]
    streams: Option<[tokio::signal::unix::Signal; 4]>,
}

impl Signals {
    /// Registers SIGHUP, SIGTERM, SIGINT and SIGUSR2 (on the current tokio runtime).
    pub fn new() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let streams = match (
                signal(SignalKind::hangup()),
                signal(SignalKind::terminate()),
                signal(SignalKind::interrupt()),
                signal(SignalKind::user_defined2()),
            ) {
                (Ok(hup), Ok(term), Ok(int), Ok(usr2)) => Some([hup, term, int, usr2]),
                _ => None,
            };
            Self { streams }
        }
        #[cfg(not(unix))]
        Self {}
    }
}

impl Signals {
    /// Resolves at the first SIGTERM or SIGINT (never, without signals), leaving SIGHUP and
    /// SIGUSR2 kept for [`serve_signals_with`]: a stop while limpet has not served yet
    /// (reading its config) stops it there.
    pub async fn stop_requested(&mut self) {
        #[cfg(unix)]
        if let Some([_, term, int, _]) = self.streams.as_mut() {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            return;
        }
        std::future::pending::<()>().await;
    }
}

impl Default for Signals {
    fn default() -> Self {
        Self::new()
    }
}

/// Runs until SIGTERM or SIGINT; each SIGHUP reloads the configuration (a refused reload is
/// logged and changes nothing). SIGUSR2 (an upgrade in place) is logged and ignored: only
/// `limpet run --upgrade-socket` answers it ([`serve_signals_with`]). When it returns for a
/// stop, the reloads still running are aborted: limpet is stopping.
pub async fn serve_signals(runtime: &Arc<Runtime>) {
    serve_signals_with(runtime, &mut Signals::new(), &mut || {
        tracing::warn!("SIGUSR2: an upgrade in place needs `limpet run --upgrade-socket`; ignored");
    })
    .await;
    runtime.state().lifecycle.reload_tasks.stop();
}

/// [`serve_signals`] on signals registered before (a signal that came meanwhile is taken
/// at once), with `upgrade` called on each SIGUSR2. Each SIGHUP's reload runs on a task of
/// its own ([`reload`]), so a stop signal is taken at once, even while a reload waits (they
/// run one at a time, `Lifecycle::reloading`); it goes on when this returns, until the
/// caller stops them (`ReloadTasks::stop`, which `Running::stop` does).
pub async fn serve_signals_with(
    runtime: &Arc<Runtime>,
    signals: &mut Signals,
    upgrade: &mut dyn FnMut(),
) {
    #[cfg(unix)]
    if let Some([hup, term, int, usr2]) = signals.streams.as_mut() {
        loop {
            tokio::select! {
                _ = int.recv() => return,
                _ = term.recv() => return,
                _ = hup.recv() => {
                    tracing::info!("SIGHUP: reloading the configuration");
                    let runtime = Arc::clone(runtime);
                    // Not waited for here: `reload` logs what it did.
                    tokio::spawn(async move {
                        if let Err(ControlError::Stopping(why)) = reload(&runtime).await {
                            tracing::info!("SIGHUP: {why}");
                        }
                    });
                }
                _ = usr2.recv() => upgrade(),
            }
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

#[cfg(test)]
mod tests {
    use super::ReloadTasks;

    /// What needs only the nodes' states (the drain watch, every second on the main
    /// thread, beside the health checks) neither walks the tables nor waits for one: read
    /// while a table's lock is held elsewhere, it answers at once; the full view counts the
    /// table's pins (before, the drain watch walked every entry of every table each second,
    /// tens of milliseconds per million, waiting on each page's lock).
    #[test]
    fn node_states_answer_without_the_tables() {
        use crate::admin::Control as _;
        let text = "[[nodes]]\nname = \"a\"\naddress = \"127.0.0.2\"\n\n\
                    [[tables]]\nname = \"t\"\nkey = \"source-ip\"\n\n\
                    [[listeners]]\nname = \"raw\"\nbind = \"127.0.0.1:0\"\nmode = \"tcp\"\n\
                    node_port = 9\ntable = \"t\"\n";
        let config =
            crate::config::Config::from_text(std::path::Path::new("t.toml"), text).expect("config");
        let state = crate::runtime::State::new(config).expect("state");
        let table = std::sync::Arc::clone(state.table("t").expect("table t"));
        let a = state.node_id("a").expect("a");
        table.learn(
            limpet_core::table::KeyRef::v4(std::net::Ipv4Addr::new(192, 0, 2, 1)),
            a,
            crate::clock::now_ms(),
            state.topology(),
        );
        let control = std::sync::Arc::new(super::RuntimeControl {
            runtime: crate::runtime::Runtime::new(state),
        });
        let held = table.lock();
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = std::thread::spawn({
            let control = std::sync::Arc::clone(&control);
            move || {
                let _ = tx.send(control.node_states());
            }
        });
        let states = rx
            .recv_timeout(std::time::Duration::from_secs(5))
            .expect("answered while the table is locked");
        drop(held);
        reader.join().expect("reader");
        assert_eq!(states.len(), 1);
        assert_eq!(states[0].name, "a");
        assert_eq!(states[0].table_pins, 0, "pins not counted");
        assert_eq!(
            control.nodes()[0].table_pins,
            1,
            "the full view counts them"
        );
    }

    /// An operator's delete of a table entry is logged with the key only when the key is a
    /// client address: a cookie's or a header's value is a session id, which the admin API
    /// shows only with the token, and the log would show to whoever reads it.
    #[test]
    fn a_deleted_entry_s_session_id_stays_out_of_the_log() {
        use crate::admin::Control as _;
        let text = "[[nodes]]\nname = \"a\"\naddress = \"127.0.0.2\"\n\n\
                    [[tables]]\nname = \"by-id\"\nheader = \"X-Terminal-Id\"\n\n\
                    [[tables]]\nname = \"by-ip\"\nkey = \"source-ip\"\n\n\
                    [[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\n\
                    node_port = 9\ntable = \"by-id\"\n\n\
                    [[listeners]]\nname = \"raw\"\nbind = \"127.0.0.1:0\"\nmode = \"tcp\"\n\
                    node_port = 9\ntable = \"by-ip\"\n";
        let config =
            crate::config::Config::from_text(std::path::Path::new("t.toml"), text).expect("config");
        let state = crate::runtime::State::new(config).expect("state");
        let a = state.node_id("a").expect("a");
        let now = crate::clock::now_ms();
        state.table("by-id").expect("by-id").learn(
            limpet_core::table::KeyRef::bytes(b"s3cret-session-id"),
            a,
            now,
            state.topology(),
        );
        state.table("by-ip").expect("by-ip").learn(
            limpet_core::table::KeyRef::v4(std::net::Ipv4Addr::new(192, 0, 2, 7)),
            a,
            now,
            state.topology(),
        );
        let control = super::RuntimeControl {
            runtime: crate::runtime::Runtime::new(state),
        };
        let written = Log::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(written.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            assert!(matches!(
                control.table_delete("by-id", "s3cret-session-id"),
                Ok(true)
            ));
            assert!(matches!(
                control.table_delete("by-ip", "192.0.2.7"),
                Ok(true)
            ));
        });
        let log = written.text();
        assert_eq!(
            log.matches("operator deleted table entry").count(),
            2,
            "{log}"
        );
        assert!(!log.contains("s3cret"), "the session id was logged: {log}");
        assert!(
            log.contains("192.0.2.7"),
            "the address was not logged: {log}"
        );
    }

    /// What a test's subscriber wrote.
    #[derive(Clone, Default)]
    struct Log(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl Log {
        fn text(&self) -> String {
            String::from_utf8_lossy(&self.0.lock().expect("log")).into_owned()
        }
    }

    impl std::io::Write for Log {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("log").extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Log {
        type Writer = Log;
        fn make_writer(&'a self) -> Log {
            self.clone()
        }
    }

    /// A stop waits for a reload applying what it read (on another thread of a multi-thread
    /// runtime, an abort cannot stop it mid-way), and no reload applies after it: a reload is
    /// applied whole before the stop or not at all.
    #[test]
    fn a_stop_waits_for_a_reload_applying_and_none_applies_after_it() {
        let tasks = std::sync::Arc::new(ReloadTasks::default());
        let applying = tasks.applying().expect("no stop yet");
        let (stopped_tx, stopped) = std::sync::mpsc::channel();
        let stopper = std::thread::spawn({
            let tasks = std::sync::Arc::clone(&tasks);
            move || {
                tasks.stop();
                let _ = stopped_tx.send(());
            }
        });
        assert_eq!(
            stopped.recv_timeout(std::time::Duration::from_millis(200)),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout),
            "the stop waits for the reload applying"
        );
        drop(applying);
        stopped
            .recv()
            .expect("the stop ends once the reload has applied");
        stopper.join().expect("stopper");
        assert!(tasks.stopped());
        assert!(tasks.applying().is_none(), "nothing applies after a stop");
    }
}
