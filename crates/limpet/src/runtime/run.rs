//! `limpet run -c limpet.toml` and `limpet check -c limpet.toml`.
//!
//! ```text
//!  Config::load ─► [store] connected (fleet mode) ─► State::new ─► snapshots loaded
//!     (bad ones reported, skipped)
//!     ─► bind every listener address (all before serving: a bind error stops the start)
//!     ─► per socket: proxy::serve_listener (http) | tcp::serve (tcp)
//!        (with --threads N > 1: one SO_REUSEPORT socket per worker thread, `super::workers`)
//!     ─► timers: snapshot interval, expired-entry purge
//!  Ctrl-C / SIGTERM ─► shutdown watch ─► listeners drain ─► snapshots saved
//! ```
//!
//! [`start`] is the in-process entry (tests use it with port 0 binds); [`Running::addrs`]
//! says where each listener really bound.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::{save_snapshot, Runtime, State};
use crate::clock::now_ms;
use crate::config::Config;

/// Arguments of `limpet run`.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// The configuration file (see docs/config.md).
    #[arg(
        short = 'c',
        long = "config",
        value_name = "FILE",
        default_value = "limpet.toml"
    )]
    pub config: PathBuf,
    /// Worker threads, each serving its own SO_REUSEPORT socket of every listener (default:
    /// one per core). With 1, one thread does everything.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub threads: Option<u16>,
    /// A Unix socket for binary upgrades: a limpet already listening there hands this one its
    /// listening sockets, pins, node admin states and health, then drains and exits (no client is
    /// refused); this one then listens there for the next (see docs/operations.md).
    #[arg(long, value_name = "PATH")]
    pub upgrade_socket: Option<PathBuf>,
    /// How long a new limpet that SIGUSR2 started has to say it is ready to take over; past
    /// it, it is killed and this one serves on (see docs/operations.md).
    #[arg(long, value_name = "DURATION", default_value = "90s", value_parser = upgrade_limit)]
    pub upgrade_limit: Duration,
}

/// `--upgrade-limit`: a duration, not zero (every successor would be killed at its start).
fn upgrade_limit(s: &str) -> Result<Duration, String> {
    match crate::config::parse_duration(s)? {
        d if d.is_zero() => Err("a successor needs some time to start; not 0".into()),
        d => Ok(d),
    }
}

/// Arguments of `limpet check`.
#[derive(Debug, Clone, clap::Args)]
pub struct CheckArgs {
    /// The configuration file to validate (certificates and keys are read too).
    #[arg(
        short = 'c',
        long = "config",
        value_name = "FILE",
        default_value = "limpet.toml"
    )]
    pub config: PathBuf,
}

/// `limpet check`: validates, prints what would run as TOML that `limpet check` accepts
/// again (the verdict is its last line, a comment), exits 0; or prints the error
/// (`file:line:col: key: message`) and exits 2.
pub fn check(args: CheckArgs) -> ExitCode {
    match Config::resolved_toml(&args.config) {
        Ok(listing) => {
            let mut out = std::io::stdout().lock();
            let _ = write!(out, "{listing}");
            let _ = writeln!(out, "\n# {}: configuration OK", args.config.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("limpet check: {e}");
            ExitCode::from(2)
        }
    }
}

/// Why [`start`] failed.
#[derive(Debug)]
pub struct StartError(pub String);

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for StartError {}

/// A running configuration: its runtime, where its listeners bound, and a way to stop it.
#[derive(Debug)]
pub struct Running {
    runtime: Arc<Runtime>,
    addrs: Vec<(String, SocketAddr)>,
    /// Turns true when the listeners may accept ([`serve`](Self::serve)).
    go: watch::Sender<bool>,
    /// Turns true when the listeners (and the admin listener) stop accepting: at a stop, or
    /// when a new limpet takes over ([`stop_accepting`](Self::stop_accepting)).
    accept_stop: watch::Sender<bool>,
    /// Turns true when everything stops.
    shutdown: watch::Sender<bool>,
    tasks: JoinSet<()>,
    /// How many worker threads serve the listeners (one: this runtime serves them).
    workers: usize,
    /// Duplicates of every listening socket, to hand to a new limpet (`crate::upgrade`);
    /// closed at a stop, or once a new limpet has taken the sockets over.
    held: Arc<crate::upgrade::Held>,
}

impl Running {
    pub fn runtime(&self) -> &Arc<Runtime> {
        &self.runtime
    }

    /// Every bound address with its listener's name, in config order.
    pub fn addrs(&self) -> &[(String, SocketAddr)] {
        &self.addrs
    }

    /// The first bound address of listener `name`.
    pub fn addr(&self, name: &str) -> Option<SocketAddr> {
        self.addrs.iter().find(|(n, _)| n == name).map(|(_, a)| *a)
    }

    /// Lets the listeners accept (a start with a handover holds them until the running
    /// limpet has stopped accepting).
    pub fn serve(&self) {
        let _ = self.go.send(true);
    }

    /// Every listening socket, to hand to a new limpet.
    pub fn held(&self) -> Arc<crate::upgrade::Held> {
        Arc::clone(&self.held)
    }

    /// What a new limpet taking over gets once this one has stopped accepting: every
    /// table's pins and every node's admin state and health, as they are now (read off the async
    /// threads: a large table takes a while to encode).
    pub async fn handover_state(&self) -> crate::upgrade::State {
        let runtime = Arc::clone(&self.runtime);
        let read = move || {
            let state = runtime.state();
            crate::upgrade::State {
                tables: state
                    .tables()
                    .map(|t| (t.def.name.clone(), super::snapshot::encode_paged(t)))
                    .collect(),
                nodes: state.node_admin_states(),
                health: state.node_health(),
                holder_now_ms: Some(now_ms()),
                seen: state.node_seen(),
            }
        };
        tokio::task::spawn_blocking(read).await.unwrap_or_default()
    }

    /// Before a hand-over, while this limpet still accepts: the node-state file is the new
    /// limpet's from here, so this one writes no more, and a write of its still on its way
    /// lands first (bounded: a disk that does not answer holds the hand-over no longer, and
    /// clients are still served meanwhile). The states are read for the new limpet after
    /// this ([`Running::handover_state`]); [`Running::resume`] gives the file back.
    pub async fn hand_node_states_over(&self) {
        let life = Arc::clone(&self.runtime.state().lifecycle);
        life.handing_state_over
            .store(true, std::sync::atomic::Ordering::Release);
        if tokio::time::timeout(
            super::snapshot::SNAPSHOT_LOAD_LIMIT,
            life.state_write.lock(),
        )
        .await
        .is_err()
        {
            tracing::warn!("upgrade: a write of the node-state file still waits on the disk; handing over all the same");
        }
    }

    /// The node-state file is this one's again ([`Self::hand_node_states_over`] undone: no
    /// new limpet took it over), written as the states are now.
    pub fn keep_node_states(&self) {
        let life = Arc::clone(&self.runtime.state().lifecycle);
        life.handing_state_over
            .store(false, std::sync::atomic::Ordering::Release);
        life.admin_changed.notify_one();
    }

    /// Loads what a running limpet handed over with its confirmation: its pins (newer than
    /// any snapshot file), its operator's MAINT and DRAIN, which hold on here, its nodes'
    /// health (a node DOWN there is DOWN here, and comes back as it would have there), and
    /// what it still has open to each node and when it last saw a session there (a drain is
    /// complete here only once that limpet has exited and the idle window has passed).
    pub async fn take_state(&self, handed: crate::upgrade::State) {
        let runtime = Arc::clone(&self.runtime);
        let now = now_ms();
        let offset = handed.clock_offset(now);
        let handed = handed.on_clock(now);
        let load = move || {
            let state = runtime.state();
            for (name, bytes) in &handed.tables {
                if let Some(t) = state.table(name) {
                    super::snapshot::restore_handed(t, bytes, offset);
                }
            }
            for (node, admin) in &handed.nodes {
                let _ = state.set_admin(node, *admin);
            }
            for health in &handed.health {
                state.take_node_health(health);
            }
            for seen in &handed.seen {
                state.take_node_seen(seen);
            }
        };
        let _ = tokio::task::spawn_blocking(load).await;
    }

    /// Resolves once every listener's accept loop, the admin listener's included, has
    /// returned (at most `limit`).
    pub async fn accepting_stopped(&self, limit: Duration) -> bool {
        let accepting = Arc::clone(&self.runtime.state().lifecycle.accepting);
        accepting.all_stopped(limit).await
    }

    /// Stops accepting, for a new limpet to take over: the listeners and the admin listener
    /// close their copies of their sockets. The copies held for the new limpet stay open,
    /// for it or for [`resume`](Self::resume), and the listeners drain only once it took
    /// over ([`let_go`](Self::let_go)) or this one stops: one that does not take over leaves
    /// this one serving its kept-alive connections, tunnels and TCP sessions as they were
    /// (`Runtime::hold_drain`).
    pub fn stop_accepting(&self) {
        self.runtime.hold_drain(true);
        let _ = self.accept_stop.send(true);
    }

    /// Closes the copies held for a new limpet (it has taken the sockets over), and lets the
    /// listeners drain.
    pub fn let_go(&self) {
        self.held.close();
        self.runtime.hold_drain(false);
    }

    /// Serves the listeners' sockets again after [`stop_accepting`](Self::stop_accepting),
    /// when the new limpet that was to take them over did not (it died, or hung, after
    /// this one stopped accepting): from the copies held, the admin listener's too, with as
    /// many worker threads as at the start (fresh ones: those that served before drain and
    /// exit at the stop, as at any stop). Returns how many sockets serve again, the admin one
    /// included.
    pub fn resume(&mut self) -> usize {
        self.keep_node_states();
        let (accept_stop, accept_stop_rx) = watch::channel(false);
        self.accept_stop = accept_stop;
        let sockets = self.held_listeners();
        let mut n = if self.workers > 1 {
            let count = sockets.iter().map(|s| s.per_worker.len()).sum();
            match super::workers::spawn(
                &self.runtime,
                sockets,
                self.workers,
                &self.go.subscribe(),
                &accept_stop_rx,
            ) {
                Ok(done) => {
                    self.tasks.spawn(async move {
                        let _ = done.await;
                    });
                    count
                }
                Err(e) => {
                    // None of them serves (`workers::spawn` is all or none): this runtime
                    // serves every socket, as with one worker.
                    tracing::error!(error = %e, "cannot start worker threads again: serving on the main thread");
                    self.serve_here(self.held_listeners(), &accept_stop_rx)
                }
            }
        } else {
            self.serve_here(sockets, &accept_stop_rx)
        };
        if let Some(admin) = self.held.admin() {
            match admin
                .set_nonblocking(true)
                .and_then(|()| TcpListener::from_std(admin))
            {
                Ok(listener) => {
                    let (shutdown, go) = (self.shutdown.subscribe(), self.go.subscribe());
                    super::control::serve_admin(
                        &self.runtime,
                        &mut self.tasks,
                        listener,
                        super::control::Turn {
                            shutdown: &shutdown,
                            go: &go,
                            accept_stop: &accept_stop_rx,
                        },
                    );
                    n += 1;
                }
                Err(e) => tracing::error!(error = %e, "cannot serve the admin socket again"),
            }
        }
        n
    }

    /// The copies held of the listeners' sockets, one group per listener address in the
    /// order they were bound (a worker takes the k-th socket of each), non-blocking.
    fn held_listeners(&self) -> Vec<super::workers::Sockets> {
        let state = self.runtime.state();
        let mut groups: Vec<super::workers::Sockets> = Vec::new();
        for (name, local, l) in self.held.listeners() {
            let Some(mode) = state
                .listeners
                .iter()
                .map(|slot| slot.def.load_full())
                .find(|d| d.name == name)
                .map(|d| d.mode)
            else {
                continue;
            };
            if let Err(e) = l.set_nonblocking(true) {
                tracing::error!(listener = %name, error = %e, "cannot serve a socket again");
                continue;
            }
            match groups
                .iter_mut()
                .find(|s| s.name == name && s.local == local)
            {
                Some(s) => s.per_worker.push(l),
                None => groups.push(super::workers::Sockets {
                    permits: super::listener_permits(&self.runtime, &name),
                    name,
                    mode,
                    local,
                    per_worker: vec![l],
                }),
            }
        }
        groups
    }

    /// Serves `sockets` on this runtime until `stop` turns true; how many serve.
    fn serve_here(
        &mut self,
        sockets: Vec<super::workers::Sockets>,
        stop: &watch::Receiver<bool>,
    ) -> usize {
        let state = self.runtime.state();
        let mut n = 0;
        for s in sockets {
            for l in s.per_worker {
                let listener = match TcpListener::from_std(l) {
                    Ok(l) => l,
                    Err(e) => {
                        tracing::error!(listener = %s.name, error = %e, "cannot serve a socket again");
                        continue;
                    }
                };
                self.tasks.spawn(super::workers::serve_socket(
                    Arc::clone(&self.runtime),
                    s.name.clone(),
                    s.mode,
                    listener,
                    Arc::clone(&s.permits),
                    super::workers::Turn {
                        go: self.go.subscribe(),
                        stop: stop.clone(),
                        accepting: state.lifecycle.accepting.enter(),
                    },
                ));
                n += 1;
            }
        }
        n
    }

    /// Stops accepting, drains the listeners (each up to its drain timeout), and saves the
    /// tables that have a snapshot file, for at most [`SNAPSHOT_SAVE_LIMIT`].
    pub async fn stop(self) {
        self.stop_saving(true).await;
    }

    /// [`stop`](Self::stop), saving the snapshots only if `save` (a limpet that handed its
    /// tables to a new one leaves the files to it).
    pub async fn stop_saving(mut self, save: bool) {
        // No reload from now on (`control::ReloadTasks`).
        self.runtime.state().lifecycle.reload_tasks.stop();
        self.held.close();
        let _ = self.accept_stop.send(true);
        // Listeners left serving by a handover that failed drain now too.
        self.runtime.hold_drain(false);
        let _ = self.shutdown.send(true);
        while self.tasks.join_next().await.is_some() {}
        let state = self.runtime.state();
        let saves: Vec<_> = state
            .tables()
            .filter(|t| save && t.def.snapshot.is_some())
            .map(|t| {
                let t = Arc::clone(t);
                // Off this thread, one thread per table, and bounded: a disk that hangs (a
                // dead network mount) must neither keep the process from exiting, nor keep a
                // second signal from being taken while it waits, nor keep the tables on
                // other disks from being saved. The pins not saved are lost, as they would be
                // to a kill.
                tokio::task::spawn_blocking(move || {
                    save_snapshot(&t);
                })
            })
            .collect();
        if !saves.is_empty() {
            let all = async {
                for s in saves {
                    let _ = s.await;
                }
            };
            if tokio::time::timeout(SNAPSHOT_SAVE_LIMIT, all)
                .await
                .is_err()
            {
                tracing::error!(
                    limit_s = SNAPSHOT_SAVE_LIMIT.as_secs(),
                    "table snapshots not saved within the limit (the disk does not answer): exiting without them"
                );
            }
        }
        if let Some(s) = state.store() {
            s.stop();
        }
    }
}

/// After a second signal, how long the sessions cut at once get to reset their sockets before
/// the process exits.
const SECOND_SIGNAL_GRACE: Duration = Duration::from_secs(1);

/// The longest shutdown waits for the tables' snapshots to be written (as long as a reload
/// waits for its file, `RELOAD_LOAD_LIMIT`).
pub const SNAPSHOT_SAVE_LIMIT: Duration = Duration::from_secs(30);

/// Starts everything `config` describes: loads snapshots, binds every listener address, and
/// serves them on the caller's runtime. Returns once all are bound (so a caller can connect
/// at once).
pub async fn start(config: Config) -> Result<Running, StartError> {
    start_with(config, 1).await
}

/// [`start`] with `workers` threads serving the listeners ([`super::workers`]); with one,
/// the caller's runtime serves them.
pub async fn start_with(config: Config, workers: usize) -> Result<Running, StartError> {
    let running = start_from(config, workers, None).await?;
    running.serve();
    Ok(running)
}

/// [`start_with`], taking over the listening sockets `handover` brings from a running limpet
/// (`crate::upgrade`), and not accepting until [`Running::serve`]: everything that can fail
/// has been done by then. Its pins and node states come later, with its confirmation
/// ([`Running::take_state`]).
pub async fn start_from(
    config: Config,
    workers: usize,
    mut handover: Option<&mut crate::upgrade::Handover>,
) -> Result<Running, StartError> {
    let state = match config.store.clone() {
        // Fleet mode: one store connection for the life of the process (reloads keep it).
        Some(def) => {
            let lifecycle = crate::lifecycle::Lifecycle::new(config.lifecycle.clone());
            // A session the fleet moved off a node ends its TCP sessions and tunnels there
            // (`close_on_node_down`), as a re-pin of this instance's does.
            let nodes = Arc::clone(&lifecycle);
            let left = Box::new(move |node: &str, key: limpet_core::table::KeyRef<'_>| {
                if let Some(rt) = nodes.nodes.get(node) {
                    // A table key's spread key does not depend on the client.
                    let any = std::net::IpAddr::from([0, 0, 0, 0]);
                    rt.session_moved_by_fleet(super::spread_of(Some(key), any, None));
                }
            });
            let store = crate::store::Store::start(def, &lifecycle.metrics, left)
                .await
                .map_err(StartError)?;
            State::with_store(config, lifecycle, store).map_err(StartError)?
        }
        None => State::new(config).map_err(StartError)?,
    };
    // Off the async threads and bounded: a snapshot never blocks a start.
    super::load_snapshots(state.tables().cloned().collect::<Vec<_>>()).await;
    // The operator's node states from before a stop or a crash (an upgrade's come later).
    if let Some(path) = state
        .lifecycle
        .def()
        .admin
        .as_ref()
        .and_then(|a| a.state_file.clone())
    {
        super::node_states::load(&state, &path).await;
    }
    let runtime = Runtime::new(state);
    let state = runtime.state();
    let (go_tx, go_rx) = watch::channel(false);
    let (accept_stop_tx, accept_stop_rx) = watch::channel(false);
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let mut tasks = JoinSet::new();
    let mut addrs = Vec::new();
    let mut held = Vec::new();
    // Named by the file, line and key of the listener's `bind` when the config has them.
    let config = Arc::clone(&state.config);
    let bind_error = |name: &str, addr: &SocketAddr, e: &dyn std::fmt::Display| {
        let msg = format!("listener {name:?}: cannot bind {addr}: {e}");
        let key = config
            .listeners
            .iter()
            .position(|l| l.name == name)
            .map(|i| format!("listeners[{i}].bind"))
            .filter(|k| config.places.get(k).is_some());
        StartError(match key {
            Some(k) => config.places.error(&config.path, &k, msg).to_string(),
            None => msg,
        })
    };
    // Every socket taken over or checked before any is bound (see
    // `workers::bind_reuseport`): this limpet's own addresses may overlap, another
    // process's must not (a taken-over address is this limpet's now, and so is an address it
    // overlaps: a new `127.0.0.1:P` beside a `0.0.0.0:P` taken over, which its probe's bind
    // would meet, as nginx's pair of a wildcard and a specific address on one port).
    let taking_over = handover.is_some();
    let mut taken = Vec::new();
    for slot in &state.listeners {
        let def = slot.def.load_full();
        for addr in &def.bind {
            let role = crate::upgrade::Role::Listener(def.name.clone());
            let got = match handover.as_deref_mut() {
                Some(h) => h
                    .take(&role, *addr)
                    .map_err(|e| bind_error(&def.name, addr, &e))?,
                None => Vec::new(),
            };
            taken.push((def.name.clone(), *addr, got));
        }
    }
    let held_addrs: Vec<SocketAddr> = taken
        .iter()
        .filter(|(_, _, got)| !got.is_empty())
        .map(|(_, addr, _)| *addr)
        .collect();
    for (name, addr, got) in &taken {
        if got.is_empty() && !held_addrs.iter().any(|h| overlaps(*h, *addr)) {
            super::workers::refuse_if_listened(*addr).map_err(|e| bind_error(name, addr, &e))?;
        }
    }
    let taken: Vec<_> = taken.into_iter().map(|(_, _, got)| got).collect();
    if let Some(h) = handover.as_deref() {
        // A running limpet none of whose listeners this config has is another service's
        // (an upgrade socket path shared by mistake): taking over would stop it.
        if taken.iter().all(Vec::is_empty) && h.listeners_offered() > 0 {
            return Err(StartError(format!(
                "the limpet at the upgrade socket (pid {}) serves none of this config's \
                 listener addresses: not taking over from it",
                h.from_pid
            )));
        }
    }
    // Each listener address: its sockets taken over, then as many more bound as there are
    // workers to serve them (one socket each), all with `SO_REUSEPORT`.
    let per_address = workers.max(1);
    let mut sockets = Vec::new();
    let mut taken = taken.into_iter();
    for slot in &state.listeners {
        let def = slot.def.load_full();
        for addr in &def.bind {
            let mut per_worker = taken.next().unwrap_or_default();
            if per_worker.len() < per_address {
                let at = per_worker
                    .first()
                    .and_then(|l| l.local_addr().ok())
                    .unwrap_or(*addr);
                // Beside sockets taken over, or at an address the running limpet lacks, not
                // listening until this limpet may accept: a listening one would take a share
                // of new clients at once, or queue clients a failed handover then resets.
                let listen = per_worker.is_empty() && !taking_over;
                match super::workers::bind_reuseport_with(
                    at,
                    per_address - per_worker.len(),
                    listen,
                ) {
                    Ok(more) => per_worker.extend(more),
                    // A socket taken over without `SO_REUSEPORT` (an older limpet's): the
                    // sockets taken over serve on their own.
                    Err(e) if !per_worker.is_empty() => tracing::info!(
                        listener = %def.name, %at, error = %e,
                        "upgrade: no more sockets beside the one taken over"
                    ),
                    Err(e) => return Err(bind_error(&def.name, addr, &e)),
                }
            }
            let s = super::workers::Sockets::of(&runtime, &def.name, def.mode, per_worker)
                .map_err(|e| bind_error(&def.name, addr, &e))?;
            for l in &s.per_worker {
                let h = crate::upgrade::HeldSocket::of(
                    crate::upgrade::Role::Listener(def.name.clone()),
                    *addr,
                    l,
                )
                .map_err(|e| bind_error(&def.name, addr, &e))?;
                held.push(h);
            }
            addrs.push((def.name.clone(), s.local));
            sockets.push(s);
        }
    }
    // The admin listener: taken over, or bound (without `SO_REUSEPORT`: a listener on the
    // same address is a bind error, not a shared port).
    let admin_def = state.lifecycle.def().admin.clone();
    let admin_socket = match &admin_def {
        Some(admin) => {
            let got = match &mut handover {
                Some(h) => h
                    .take(&crate::upgrade::Role::Admin, admin.listen)
                    .map_err(|e| StartError(format!("admin listener: {e}")))?,
                None => Vec::new(),
            };
            let l = match got.into_iter().next() {
                Some(l) => l,
                None => super::workers::bind_one(admin.listen).map_err(|e| {
                    // Named by the file, line and key of `admin.listen` when the file has it.
                    let msg = format!("admin listener: cannot bind {}: {e}", admin.listen);
                    StartError(match config.places.get("admin.listen") {
                        Some(_) => config
                            .places
                            .error(&config.path, "admin.listen", msg)
                            .to_string(),
                        None => msg,
                    })
                })?,
            };
            let h = crate::upgrade::HeldSocket::of(crate::upgrade::Role::Admin, admin.listen, &l)
                .map_err(|e| StartError(format!("admin listener: {e}")))?;
            held.push(h);
            Some(l)
        }
        None => None,
    };
    if let Some(h) = &handover {
        for addr in h.untaken() {
            tracing::warn!(%addr, "upgrade: a socket of the running limpet that no listener of this config binds: its clients are refused once the handover completes");
        }
    }
    if workers > 1 {
        let done = super::workers::spawn(&runtime, sockets, workers, &go_rx, &accept_stop_rx)
            .map_err(|e| StartError(format!("cannot start worker threads: {e}")))?;
        tasks.spawn(async move {
            let _ = done.await;
        });
    } else {
        for s in sockets {
            for l in s.per_worker {
                let l = TcpListener::from_std(l)
                    .map_err(|e| StartError(format!("listener {:?}: cannot serve: {e}", s.name)))?;
                tasks.spawn(super::workers::serve_socket(
                    Arc::clone(&runtime),
                    s.name.clone(),
                    s.mode,
                    l,
                    Arc::clone(&s.permits),
                    super::workers::Turn {
                        go: go_rx.clone(),
                        stop: accept_stop_rx.clone(),
                        accepting: state.lifecycle.accepting.enter(),
                    },
                ));
            }
        }
    }
    tasks.spawn(table_upkeep(Arc::clone(&runtime), shutdown_rx.clone()));
    drop(state);
    // Health checks, the admin listener, drain tracking (node lifecycle).
    super::start_lifecycle(
        &runtime,
        &mut tasks,
        &shutdown_rx,
        admin_socket,
        &go_rx,
        &accept_stop_rx,
    )
    .await
    .map_err(StartError)?;
    Ok(Running {
        runtime,
        addrs,
        go: go_tx,
        accept_stop: accept_stop_tx,
        shutdown: shutdown_tx,
        tasks,
        workers: workers.max(1),
        held: Arc::new(crate::upgrade::Held::new(held)),
    })
}

/// Whether a socket bound at `a` and one at `b` would meet in a bind: the same port, and
/// the same address or a wildcard on either side (an IPv6 wildcard may hold IPv4 too).
fn overlaps(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() == b.port() && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

/// Writes `lines` to stdout on a thread of its own: the listeners accept by now, and a
/// reader that stopped reading (journald stalled, a pipe nobody reads) must not hold the main
/// thread, which takes the signals and serves the admin API and the health checks (and, with
/// one worker, the listeners). The log has its writer thread for the same reason
/// (`crate::logging`). Written here if no thread can be had.
fn say_on_stdout(lines: String) {
    let write = |lines: &str| {
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(lines.as_bytes());
        let _ = out.flush();
    };
    let shared = std::sync::Arc::new(lines);
    let for_thread = std::sync::Arc::clone(&shared);
    if std::thread::Builder::new()
        .name("limpet-stdout".to_owned())
        .spawn(move || write(&for_thread))
        .is_err()
    {
        write(&shared);
    }
}

/// Tells the limpet this one took over from, until it exits, what changes here that the
/// connections it still drains must obey ([`crate::upgrade::Told`]): each node whose
/// status changes in a way that routes differently (its admin state, by the operator or a
/// reload removing it; its health), each session moved off a node (`moves`, from the node
/// board), and first, MAINT for the nodes it handed over that this config lacks (`gone`),
/// as a reload removing them would set. The nodes are watched from this call on, before the
/// returned future runs: a change made as this one starts serving is not missed. A node
/// this config lacks and a later reload adds is not watched (its MAINT, told first, ended
/// the predecessor's sessions on it).
fn tell_predecessor(
    runtime: Arc<super::Runtime>,
    mut moves: tokio::sync::mpsc::Receiver<crate::nodes::MovedOff>,
    told: tokio::sync::mpsc::Sender<crate::upgrade::Told>,
    gone: Vec<String>,
) -> impl std::future::Future<Output = ()> {
    let watched: Vec<_> = runtime
        .state()
        .lifecycle
        .nodes
        .all()
        .into_iter()
        .map(|rt| (rt.status_changes(), rt))
        .collect();
    async move {
        let (changed_tx, mut changed) = tokio::sync::mpsc::unbounded_channel::<String>();
        let mut watchers = tokio::task::JoinSet::new();
        for (mut events, rt) in watched {
            let tx = changed_tx.clone();
            watchers.spawn(async move {
                while events.changed().await.is_ok() {
                    if tx.send(rt.name().to_owned()).is_err() {
                        return;
                    }
                }
            });
        }
        drop(changed_tx);
        if !gone.is_empty() {
            let first = crate::upgrade::Told {
                state: crate::upgrade::State {
                    nodes: gone
                        .into_iter()
                        .map(|n| (n, limpet_core::AdminState::Maint))
                        .collect(),
                    ..crate::upgrade::State::default()
                },
                moved: Vec::new(),
            };
            if told.send(first).await.is_err() {
                return;
            }
        }
        loop {
            let t = tokio::select! {
                () = told.closed() => return,
                Some(name) = changed.recv() => {
                    let mut names = std::collections::BTreeSet::from([name]);
                    while let Ok(n) = changed.try_recv() {
                        names.insert(n);
                    }
                    let state = runtime.state();
                    let board = &state.lifecycle.nodes;
                    crate::upgrade::Told {
                        state: crate::upgrade::State {
                            nodes: names
                                .iter()
                                .filter_map(|n| Some((n.clone(), board.get(n)?.status().admin)))
                                .collect(),
                            health: state
                                .node_health()
                                .into_iter()
                                .filter(|h| names.contains(&h.node))
                                .collect(),
                            ..crate::upgrade::State::default()
                        },
                        moved: Vec::new(),
                    }
                }
                Some(m) = moves.recv() => crate::upgrade::Told {
                    moved: vec![m],
                    ..crate::upgrade::Told::default()
                },
                else => return,
            };
            if told.send(t).await.is_err() {
                return;
            }
        }
    }
}

/// Takes what the limpet that took over from this one told it ([`tell_predecessor`]): the
/// nodes' admin states and health, moved onto this one's clock, and the sessions it moved
/// off a node, whose long-lived connections this one still drains there end.
fn take_told(runtime: &super::Runtime, told: crate::upgrade::Told) {
    let state = runtime.state();
    let board = &state.lifecycle.nodes;
    let handed = told.state.on_clock(now_ms());
    for (node, admin) in &handed.nodes {
        if let Some(rt) = board.get(node) {
            // Set again, an unchanged state would end a drain's deadline timer for nothing.
            if rt.status().admin != *admin {
                rt.set_admin(*admin);
            }
        }
    }
    for health in &handed.health {
        state.take_node_health(health);
    }
    for (node, key, why) in told.moved {
        if let Some(rt) = board.get(&node) {
            rt.session_moved_by_successor(key, why);
        }
    }
}

/// How long a limpet that handed over waits, once drained, for the limpet it took over from
/// to exit (back-to-back upgrades; that one's drain is bounded by its `timeouts.drain`).
const PREDECESSOR_WAIT_LIMIT: Duration = Duration::from_secs(600);

/// How long a limpet handing over waits for its accept loops to return before it hands
/// over all the same (they return as soon as they see the stop; this bounds a stuck one).
const ACCEPT_LOOPS_LIMIT: Duration = Duration::from_secs(5);

type NextHold = Option<tokio::task::JoinHandle<Option<crate::upgrade::Ready>>>;

/// Listens at the upgrade socket (if there is one) for the next limpet to take over from
/// `running`: the stop of that wait, and the wait.
fn hold_next(path: &Option<PathBuf>, running: &Running) -> (watch::Sender<bool>, NextHold) {
    let (stop, mut stopped) = watch::channel(false);
    let Some(path) = path else {
        return (stop, None);
    };
    match crate::upgrade::listen(path) {
        Ok(listener) => {
            let hold = crate::upgrade::hold(listener, running.held(), async move {
                super::stopped(&mut stopped).await;
            });
            (stop, Some(tokio::spawn(hold)))
        }
        Err(e) => {
            tracing::error!(
                path = %path.display(), error = %e,
                "upgrade socket not bound: this limpet cannot be upgraded in place"
            );
            (stop, None)
        }
    }
}

/// `limpet run`: loads the config, starts (taking over from the limpet at `--upgrade-socket`
/// if one listens there), prints `listening on ADDR (listener NAME)` per bound address on
/// stdout, and runs until Ctrl-C or SIGTERM, or until a new limpet takes over.
pub fn run(args: RunArgs) -> ExitCode {
    let rt = match crate::runtime::tokio_runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("limpet run: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // First of all, before the config is read: from here on a reload or upgrade signal
    // never ends the process by its default action, and one that comes before they are
    // awaited is kept. A config read can take long (a slow mount), and a successor started
    // for an upgrade is a process an operator's `pkill -HUP limpet` reaches too: by the
    // default action it died unseen, and the upgrade with it. A new limpet must not die
    // between its "ready" and serving either (`crate::upgrade`). A stop (SIGTERM, SIGINT)
    // while the config is read stops it there, with nothing served yet.
    let mut signals = {
        let _in_runtime = rt.enter();
        super::Signals::new()
    };
    let path = args.config.clone();
    let loaded = rt.block_on(async {
        let load = tokio::task::spawn_blocking(move || Config::load(&path));
        tokio::select! {
            r = load => Some(r),
            () = signals.stop_requested() => None,
        }
    });
    let cfg = match loaded {
        Some(Ok(Ok(c))) => c,
        Some(Ok(Err(e))) => {
            eprintln!("limpet run: {e}");
            return ExitCode::from(2);
        }
        Some(Err(e)) => {
            eprintln!("limpet run: reading the config: {e}");
            return ExitCode::from(2);
        }
        None => {
            eprintln!("limpet run: stopped while reading its config, before serving");
            // Not a plain drop: that would wait for the read, which may never return.
            rt.shutdown_background();
            return ExitCode::SUCCESS;
        }
    };
    let workers = super::workers::count(args.threads);
    let code = rt.block_on(async move {
        if workers <= 1 {
            super::workers::keep_a_timer_due();
        }
        // SIGUSR2 starts this binary's successor, with these arguments (read now: a package
        // upgrade replaces the file under a running process).
        let successor = match &args.upgrade_socket {
            Some(_) => crate::upgrade::Successor::of_this_process(args.upgrade_limit)
                .map_err(|e| tracing::warn!(error = %e, "this binary's path is unknown: SIGUSR2 cannot start a successor"))
                .ok(),
            None => None,
        };
        let mut upgrade_signal = || match &successor {
            // Started on a blocking thread and watched on a task of its own until it exits:
            // this thread serves clients.
            Some(s) => drop(s.start()),
            None => tracing::warn!(
                "SIGUSR2: an upgrade in place needs `--upgrade-socket` (and this binary's path); ignored"
            ),
        };
        // The config is valid by now: only then is a running limpet asked for its sockets.
        let mut handover = match &args.upgrade_socket {
            Some(path) => {
                let started_by = std::env::var_os(crate::upgrade::STARTED_BY);
                let at = path.clone();
                match tokio::task::spawn_blocking(move || crate::upgrade::take_over(&at)).await {
                    Ok(Ok(None)) if started_by.is_some() => {
                        // Started by a running limpet to take over from it, which no longer
                        // listens: it stopped meanwhile, and so must this one.
                        eprintln!(
                            "limpet run: started to take over from pid {}, which no longer listens at {}: not starting",
                            started_by.unwrap_or_default().to_string_lossy(),
                            path.display()
                        );
                        return ExitCode::from(2);
                    }
                    Ok(Ok(Some(h)))
                        if started_by
                            .as_ref()
                            .is_some_and(|by| *by != *h.from_pid.to_string()) =>
                    {
                        // Started by one limpet, and another listens there now (its starter
                        // handed over to a third, or stopped and was started anew): this one
                        // was not started to take over from that one.
                        eprintln!(
                            "limpet run: started to take over from pid {}, but pid {} listens at {}: not taking over",
                            started_by.unwrap_or_default().to_string_lossy(),
                            h.from_pid,
                            path.display()
                        );
                        return ExitCode::from(2);
                    }
                    Ok(Ok(h)) => h,
                    Ok(Err(e)) => {
                        eprintln!("limpet run: {e}");
                        return ExitCode::from(2);
                    }
                    Err(e) => {
                        eprintln!("limpet run: upgrade: {e}");
                        return ExitCode::FAILURE;
                    }
                }
            }
            None => None,
        };
        let taking_over = handover.is_some();
        let started = start_from(cfg, workers, handover.as_mut());
        let started = if taking_over {
            // The running limpet waits for "ready" at most this long, holding nothing back
            // meanwhile; a start that takes longer is given up here too.
            match tokio::time::timeout(crate::upgrade::HANDOVER_LIMIT, started).await {
                Ok(r) => r,
                Err(_) => Err(StartError(format!(
                    "not started within {:?}: not taking over",
                    crate::upgrade::HANDOVER_LIMIT
                ))),
            }
        } else {
            started.await
        };
        let mut running = match started {
            Ok(r) => r,
            Err(e) => {
                // The running limpet, if any, never heard "ready": it serves on.
                eprintln!("limpet run: {e}");
                return ExitCode::from(2);
            }
        };
        let mut took_from = None;
        // Whether the limpet this one took over from (if any) has exited: one that hands
        // over in its turn waits for that before it exits, so that the next one, which
        // watches this one alone, is not told of an end while that one still drains.
        let (predecessor_gone_tx, mut predecessor_gone) = watch::channel(true);
        if let Some(h) = handover {
            predecessor_gone_tx.send_replace(false);
            let pid = h.from_pid;
            match tokio::task::spawn_blocking(move || h.complete()).await {
                Ok(Ok((handed, predecessor))) => {
                    let state = running.runtime().state();
                    // The nodes the limpet taken over from has and this config lacks:
                    // MAINT there.
                    let mut handed_only: Vec<String> = handed
                        .nodes
                        .iter()
                        .map(|(n, _)| n)
                        .chain(handed.health.iter().map(|h| &h.node))
                        .filter(|n| state.node_id(n).is_none())
                        .cloned()
                        .collect::<std::collections::BTreeSet<_>>()
                        .into_iter()
                        .collect();
                    running.take_state(handed).await;
                    tracing::info!(pid, "took over from the running limpet");
                    took_from = Some(pid);
                    // What it had open drains there until it exits; then none of it is.
                    // Meanwhile it is told what changes here, which what it drains obeys.
                    let runtime = Arc::clone(running.runtime());
                    let gone = predecessor_gone_tx.clone();
                    let (told_tx, told) = tokio::sync::mpsc::channel(64);
                    let (moves_tx, moves) = tokio::sync::mpsc::channel(1024);
                    runtime.state().lifecycle.nodes.tell_moves(Some(moves_tx));
                    tokio::spawn(tell_predecessor(
                        Arc::clone(&runtime),
                        moves,
                        told_tx,
                        std::mem::take(&mut handed_only),
                    ));
                    tokio::spawn(async move {
                        predecessor.gone_telling(told).await;
                        runtime.state().lifecycle.nodes.tell_moves(None);
                        runtime.state().lifecycle.predecessor_gone();
                        gone.send_replace(true);
                    });
                }
                Ok(Err(e)) => {
                    // Nothing accepted yet: leaving now loses no client.
                    eprintln!("limpet run: {e}");
                    return ExitCode::FAILURE;
                }
                Err(e) => {
                    eprintln!("limpet run: upgrade: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
        running.serve();
        // The next upgrade's socket, bound before this one says it listens (a script that
        // upgrades again at once finds it).
        let (mut upgrade_stop, mut next) = hold_next(&args.upgrade_socket, &running);
        {
            let mut lines = String::new();
            for (name, addr) in running.addrs() {
                lines.push_str(&format!("listening on {addr} (listener {name})\n"));
            }
            if let Some(a) = running.runtime().state().lifecycle.admin_addr() {
                lines.push_str(&format!("admin on {a}\n"));
            }
            say_on_stdout(lines);
        }
        let status = format!("serving {} listening sockets", running.addrs().len());
        match took_from {
            Some(pid) => crate::notify::took_over(&format!("{status}; took over from pid {pid}")),
            None => crate::notify::ready(&status),
        }
        // SIGHUP reloads; SIGTERM / Ctrl-C stop; a second one stops at once; SIGUSR2 starts
        // a successor. Or a new limpet is ready to take over: stop accepting, wait until no
        // accept loop runs, hand it the pins, node states and health as they are then;
        // drain once it says it took over, or serve again if it does not. Reloads run on
        // tasks of their own across the loop's turns (a new limpet refused, or one that did
        // not take over, must not cost a reload under way), and are aborted once it ends.
        let mut handed_line = None;
        // A stop signal came during a handover: it drains as the first one does, and does
        // not wait for a limpet before it (below).
        let mut stopped_in_handover = false;
        let handed_over = loop {
            let ready = tokio::select! {
                () = super::serve_signals_with(running.runtime(), &mut signals, &mut upgrade_signal) => None,
                Ok(Some(ready)) = async { match next.as_mut() {
                    Some(n) => n.await,
                    None => std::future::pending().await,
                } } => Some(ready),
            };
            // A new limpet ready as a stop signal won is let go (its wait for "stopping"
            // ends at once, and it exits without having accepted), as is one on its way.
            let _ = upgrade_stop.send(true);
            drop(next.take());
            let Some(ready) = ready else { break false };
            // The successor SIGUSR2 started, if it is this taker: its limit waits for the
            // handover's end. One killed as its limit passed, just before its "ready" was
            // read, is refused before this one stops accepting for it.
            let taker = successor.as_ref().map(|s| s.handing_over(ready.pid()));
            let handing_over = match taker {
                Some(crate::upgrade::Taker::Ours(h)) => Some(h),
                Some(crate::upgrade::Taker::Killed) => {
                    tracing::error!("upgrade refused: the new limpet was killed as its limit passed");
                    drop(ready);
                    (upgrade_stop, next) = hold_next(&args.upgrade_socket, &running);
                    continue;
                }
                Some(crate::upgrade::Taker::Other) | None => None,
            };
            if let Err(why) = crate::notify::may_take_over(ready.pid()) {
                // Before anything changed hands: the new one hears no "stopping" and exits
                // without accepting; this one serves on.
                tracing::error!("upgrade refused: {why}");
                drop(ready);
                (upgrade_stop, next) = hold_next(&args.upgrade_socket, &running);
                continue;
            }
            // A stop signal before this one stops accepting wins: the new one is let go (it
            // hears no "stopping", and exits without having accepted), and this one stops.
            // (A signal that comes while nothing waits for it is kept for the next wait:
            // unwatched here, it went on to cut this one's drain once the handover was done.)
            let stop_first = tokio::select! {
                biased;
                () = signals.stop_requested() => true,
                () = running.hand_node_states_over() => false,
            };
            if stop_first {
                tracing::info!("upgrade: a stop signal came first: the new limpet is let go");
                drop(ready);
                running.keep_node_states();
                break false;
            }
            running.stop_accepting();
            let taker = ready.pid();
            // From here the handover completes: a stop signal meanwhile is the first one,
            // whose drain follows (after the handover, or at once if the new one does not
            // take over), not the second one's cut.
            let mut stop_came = false;
            let took = {
                let handoff = async {
                    if !running.accepting_stopped(ACCEPT_LOOPS_LIMIT).await {
                        tracing::warn!("upgrade: an accept loop still runs after {ACCEPT_LOOPS_LIMIT:?}; handing over all the same");
                    }
                    let handed = running.handover_state().await;
                    ready
                        .confirm_within(handed, crate::upgrade::HANDOVER_LIMIT)
                        .await
                };
                tokio::pin!(handoff);
                loop {
                    tokio::select! {
                        biased;
                        took = &mut handoff => break took,
                        () = signals.stop_requested(), if !stop_came => {
                            stop_came = true;
                            stopped_in_handover = true;
                            tracing::info!("upgrade: a stop signal during the handover: draining once it ends");
                        }
                    }
                }
            };
            if let Some(line) = took {
                // What the new one tells this one while it drains: what it drains obeys
                // the node states and moves made there from now on.
                if let Some(mut telling) = line.told() {
                    let runtime = Arc::clone(running.runtime());
                    tokio::spawn(async move {
                        while let Some(told) = telling.next().await {
                            take_told(&runtime, told);
                        }
                    });
                }
                // Kept until this process exits: its end tells the new one so.
                handed_line = Some(line);
                // Before the drain: this process's exit must not end the unit.
                crate::notify::handed_over(taker);
                if let Some(h) = handing_over {
                    h.took();
                }
                running.let_go();
                tracing::info!("a new limpet took over: draining, then exiting");
                break true;
            }
            if stop_came {
                tracing::error!("upgrade: the new limpet did not take over; stopping, as signalled");
                running.keep_node_states();
                break false;
            }
            let n = running.resume();
            tracing::error!(
                sockets = n,
                "upgrade: the new limpet did not take over after this one stopped accepting: serving again"
            );
            (upgrade_stop, next) = hold_next(&args.upgrade_socket, &running);
        };
        // A successor of this one's that did not take over can no longer do so (this one
        // stops, or another took over): killed, not left behind with no limit watching it.
        let abandoned = successor.as_ref().map(crate::upgrade::Successor::abandon);
        if !handed_over {
            tracing::info!("shutting down: draining listeners, saving snapshots");
            crate::notify::stopping();
        }
        // A reload applied mid-drain would restart the health checks the drain stops. After
        // STOPPING=1: a reload cut short says nothing to systemd after it.
        running.runtime().state().lifecycle.reload_tasks.stop();
        let runtime = Arc::clone(running.runtime());
        let stop = running.stop_saving(!handed_over);
        tokio::pin!(stop);
        // On the signals registered at the start: one that comes at any moment from here on
        // is taken (a listener made anew at each wait would miss one that came between).
        let mut signalled = stopped_in_handover;
        tokio::select! {
            () = &mut stop => {}
            () = signals.stop_requested() => {
                signalled = true;
                if handed_over {
                    tracing::warn!("signal: cutting the open sessions, exiting now");
                } else {
                    tracing::warn!("second signal: cutting the open sessions, exiting now");
                }
                // Cut, not dropped: a dropped relay ends its node's stream with a FIN, and a
                // print job cut mid-upload would look whole to the node (chaos run 27).
                runtime.cut_now();
                let _ = tokio::time::timeout(SECOND_SIGNAL_GRACE, &mut stop).await;
            }
        }
        // The abandoned successor's watcher has run by now, but for a drain that never
        // waited: a second, at most, to send its kill.
        if let Some(a) = abandoned {
            a.killed(Duration::from_secs(1)).await;
        }
        // Its last words to systemd (STOPPING=1, or the new main process after an upgrade)
        // go out before it exits.
        crate::notify::flush(Duration::from_secs(5));
        if handed_line.is_some() && !*predecessor_gone.borrow() && !signalled {
            // Back-to-back upgrades: the new one learns of the one before this from this
            // one's end, so this one outlives it (its drain is bounded, and so is this wait).
            // A signal, during the drain or this wait, ends it (the operator, or a service
            // manager stopping this process: it has nothing of its own left, and a signal is
            // no longer its death once limpet handles them).
            tracing::info!("drained: waiting for the limpet this one took over from to exit, which the new one learns from this one's exit");
            tokio::select! {
                _ = tokio::time::timeout(
                    PREDECESSOR_WAIT_LIMIT,
                    predecessor_gone.wait_for(|gone| *gone),
                ) => {}
                () = signals.stop_requested() => {
                    tracing::warn!("signal: exiting before the limpet this one took over from");
                }
            }
        }
        drop(handed_line);
        ExitCode::SUCCESS
    });
    // Not a plain drop, which waits for every blocking task: a reload's read that never
    // returns (`RELOAD_LOAD_LIMIT`) must not keep the process from exiting.
    rt.shutdown_timeout(Duration::from_secs(1));
    code
}

/// Every table's upkeep, as the running config has its tables: expired entries purged every
/// second (lookups drop those they meet; this bounds the memory of entries nobody looks up
/// again, and the walk a count of pins makes, a page at a time), and each table's snapshot saved at its
/// `snapshot_interval`, on its own clock. Read from the running state at each wake, so that
/// a reload's tables are the ones kept: one it adds, or a `snapshot` or interval it sets or
/// changes, is saved from then on, where it says; a table it removes or re-keys is no longer
/// saved. (One task per table made at the start saved those tables for good: a reload's
/// were never saved between shutdowns, and a re-keyed table's old entries were written over
/// the new ones' file at every interval.)
async fn table_upkeep(runtime: Arc<Runtime>, mut stop: watch::Receiver<bool>) {
    const PURGE_EVERY: Duration = Duration::from_secs(1);
    const PURGE_PAGE: usize = 4096;
    let mut reloads = runtime.reloads();
    reloads.mark_unchanged();
    let mut reloads_gone = false;
    let mut next_purge = tokio::time::Instant::now() + PURGE_EVERY;
    // By table name: where and how often it is saved, as last read, and its next save.
    let mut saves: std::collections::HashMap<String, (PathBuf, Duration, tokio::time::Instant)> =
        std::collections::HashMap::new();
    // By table name: its save under way, if any.
    let mut saving = std::collections::HashMap::new();
    loop {
        let now = tokio::time::Instant::now();
        {
            let state = runtime.state();
            saves.retain(|name, _| state.table(name).is_some());
            for t in state.tables() {
                match t
                    .def
                    .snapshot
                    .as_ref()
                    .and_then(|s| Some((&s.path, s.interval?)))
                {
                    Some((path, every)) => {
                        let plan = saves.get(&t.def.name);
                        if plan.is_none_or(|(p, e, _)| p != path || *e != every) {
                            saves.insert(t.def.name.clone(), (path.clone(), every, now + every));
                        }
                    }
                    None => {
                        saves.remove(&t.def.name);
                    }
                }
            }
        }
        let wake = saves
            .values()
            .map(|(_, _, at)| *at)
            .fold(next_purge, std::cmp::Ord::min);
        tokio::select! {
            () = super::stopped(&mut stop) => return,
            () = tokio::time::sleep_until(wake) => {}
            r = reloads.changed(), if !reloads_gone => {
                // No more reloads (the runtime is gone): the timers alone.
                reloads_gone = r.is_err();
                continue;
            }
        }
        let now = tokio::time::Instant::now();
        let state = runtime.state();
        let due: Vec<Arc<super::Table>> = state
            .tables()
            .filter(|t| saves.get(&t.def.name).is_some_and(|(_, _, at)| now >= *at))
            .map(Arc::clone)
            .collect();
        let purged: Vec<Arc<super::Table>> = if now >= next_purge {
            next_purge = now + PURGE_EVERY;
            state.tables().map(Arc::clone).collect()
        } else {
            Vec::new()
        };
        drop(state);
        for t in purged {
            // Every expired entry, a page at a time under the table's lock, the thread given
            // back between pages: the run of expired entries a count of pins walks
            // (`State::node_views_counting`) stays one second's worth, and a burst of
            // expiries holds routing on the table for a page at most.
            while limpet_core::table::AffinityStore::purge_expired(
                t.lock().store_mut(),
                now_ms(),
                PURGE_PAGE,
            ) == PURGE_PAGE
            {
                tokio::task::yield_now().await;
            }
        }
        for t in due {
            if let Some((_, every, at)) = saves.get_mut(&t.def.name) {
                *at = now + *every;
            }
            // File I/O off the async workers, and not waited for: a save stuck on a disk
            // that hangs holds neither the other tables' upkeep nor the shutdown (which
            // saves again, within its limit). A table whose last save has not returned
            // skips this one rather than piling blocked threads up behind it.
            if saving
                .get(&t.def.name)
                .is_some_and(|h: &tokio::task::JoinHandle<_>| !h.is_finished())
            {
                continue;
            }
            let name = t.def.name.clone();
            saving.insert(name, tokio::task::spawn_blocking(move || save_snapshot(&t)));
        }
        saving.retain(|_, h| !h.is_finished());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nodes::EndReason;
    use crate::proxy::{runtime_of, NodeConfig, ProxyConfig};
    use limpet_core::{AdminState, Leave, RepinReason};

    /// The next message told, within 5 s.
    async fn next(
        told: &mut tokio::sync::mpsc::Receiver<crate::upgrade::Told>,
    ) -> Option<crate::upgrade::Told> {
        tokio::time::timeout(Duration::from_secs(5), told.recv())
            .await
            .ok()
            .flatten()
    }

    /// A runtime with nodes `names`.
    fn runtime_with(names: &[&str]) -> Arc<Runtime> {
        let cfg = ProxyConfig::new(
            names
                .iter()
                .zip(2u8..)
                .map(|(n, ip)| NodeConfig {
                    name: (*n).to_owned(),
                    addr: SocketAddr::from(([127, 0, 0, ip], 1)),
                })
                .collect(),
        );
        runtime_of(cfg, SocketAddr::from(([127, 0, 0, 1], 1))).unwrap_or_else(|e| panic!("{e:?}"))
    }

    /// A long-lived session of `key` on `node`, ending as its node's state says (DOWN
    /// included).
    fn session_on(
        node: &Arc<crate::nodes::NodeRuntime>,
        key: u64,
    ) -> tokio::task::JoinHandle<EndReason> {
        let (watch, node) = (node.watch(key), Arc::clone(node));
        tokio::spawn(async move {
            node.session_end(watch, || true, tokio::sync::watch::channel(0).1)
                .await
        })
    }

    /// What `session` ended with, within 5 s.
    async fn ended(session: tokio::task::JoinHandle<EndReason>) -> Option<EndReason> {
        tokio::time::timeout(Duration::from_secs(5), session)
            .await
            .ok()
            .and_then(Result::ok)
    }

    /// What a new limpet tells the one it took over from, end to end between two runtimes:
    /// first MAINT for a node it handed over that the new config lacks; then a DOWN there
    /// (made before the telling ran: the nodes are watched from the call on) ends the old
    /// one's sessions on the node as its own DOWN would; a session the new one moves off a
    /// node ends the old one's long-lived session of the same key there, with the move's
    /// reason (the node back UP there first, and so here); a MAINT there is the old one's.
    /// (The wire between them: `upgrade`'s tests.)
    #[tokio::test]
    async fn what_the_new_limpet_tells_reaches_the_old_one_s_sessions() {
        let (taker, holder) = (runtime_with(&["a"]), runtime_with(&["a", "z"]));
        let node = |r: &Arc<Runtime>, name: &str| {
            r.state()
                .lifecycle
                .nodes
                .get(name)
                .unwrap_or_else(|| panic!("node {name}"))
        };
        let (held, held_z) = (node(&holder, "a"), node(&holder, "z"));
        let on_z = session_on(&held_z, 9);
        let on_a = session_on(&held, 8);
        let (told_tx, mut told) = tokio::sync::mpsc::channel(8);
        let (moves_tx, moves) = tokio::sync::mpsc::channel(8);
        taker.state().lifecycle.nodes.tell_moves(Some(moves_tx));
        let telling = tell_predecessor(Arc::clone(&taker), moves, told_tx, vec!["z".to_owned()]);
        assert!(taker.state().force_health("a", false).is_some());
        tokio::spawn(telling);

        let t = next(&mut told).await.unwrap_or_else(|| panic!("z told"));
        take_told(&holder, t);
        assert_eq!(held_z.status().admin, AdminState::Maint);
        assert_eq!(
            ended(on_z).await,
            Some(EndReason::Repin(RepinReason::NodeMaint))
        );

        let t = next(&mut told)
            .await
            .unwrap_or_else(|| panic!("the DOWN told"));
        assert!(held.status().health.is_up());
        take_told(&holder, t);
        assert!(!held.status().health.is_up());
        assert_eq!(
            ended(on_a).await,
            Some(EndReason::Repin(RepinReason::NodeDown))
        );

        // Back UP there, back UP here.
        assert!(taker.state().force_health("a", true).is_some());
        let t = next(&mut told)
            .await
            .unwrap_or_else(|| panic!("the UP told"));
        take_told(&holder, t);
        assert!(held.status().health.is_up());

        let on_a = session_on(&held, 7);
        node(&taker, "a").session_moved(7, Leave::Failed(RepinReason::AnswerTimeout));
        let t = next(&mut told)
            .await
            .unwrap_or_else(|| panic!("the move told"));
        take_told(&holder, t);
        assert_eq!(
            ended(on_a).await,
            Some(EndReason::Repin(RepinReason::AnswerTimeout))
        );

        assert!(taker.state().set_admin("a", AdminState::Maint).is_some());
        let t = next(&mut told)
            .await
            .unwrap_or_else(|| panic!("the MAINT told"));
        assert_eq!(held.status().admin, AdminState::Ready);
        take_told(&holder, t);
        assert_eq!(held.status().admin, AdminState::Maint);
    }
}
