//! Thread per core: with `--threads N` (N ≥ 2; the default is one per core), N worker
//! threads each run a current-thread tokio runtime and serve their own `SO_REUSEPORT` socket
//! of every listener address. The kernel spreads new connections over the sockets, and a
//! connection stays on the thread that accepted it for its whole life: its requests, its node
//! connections and their wake-ups never cross threads.
//!
//! ```text
//!  main thread (current-thread runtime): signals, reloads, admin API, health checks, store,
//!     table timers ─── shares ──► Runtime (ArcSwap<State>): node runtime, affinity tables
//!  worker k (current-thread runtime), per listener address:
//!     its own SO_REUSEPORT socket ─► proxy::serve_listener_on | tcp::serve_on
//!        (its own node connection pools and metric handles; the listener's permits shared)
//!  shutdown watch ─► every worker drains its connections ─► thread exits ─► `done` resolves
//! ```
//!
//! What stays shared is what must agree across connections: node state, pins, the routing
//! rotation, the listener's `max_connections`. What is per worker is what only makes a
//! request cheaper: the idle node connections, which a worker's own runtime drives.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::{oneshot, watch};

use super::Runtime;
use crate::config::Mode;

/// How far ahead the timer [`keep_a_timer_due`] keeps due: below most timers a request sets
/// (`proxy::forward`'s DOWN watch, 100 ms; its answer, idle and stall timeouts are longer).
const TIMER_FLOOR: std::time::Duration = std::time::Duration::from_millis(50);

/// Keeps a timer due within 50 ms (`TIMER_FLOOR`) on the runtime that serves listeners (call
/// it once per such runtime): a request's timers then never come before every timer tokio's
/// time driver knew of when it last parked. Such a timer makes the driver wake itself (tokio
/// 1.x, `time::Handle::reregister`: a `write` to the runtime's eventfd, then one more turn of
/// the event loop that finds nothing to do), and every request's timer was one whenever
/// nothing was in flight as the thread parked, until it parked again: 0.17 `write` per
/// request in `h2c-m1`, 0.02 in `sticky` (`bench/cost.sh`, strace), 0.02 and none with this.
/// A timer shorter than the floor (a fleet store's `timeout` under 50 ms, for a first
/// request's read) still wakes the driver, at most once per park. Its cost: twenty wake-ups
/// a second of each serving runtime (one per worker thread), idle or not. The effect depends
/// on tokio's internals; should they change, it only stops saving the calls.
pub fn keep_a_timer_due() {
    tokio::spawn(async {
        let mut floor = tokio::time::interval(TIMER_FLOOR);
        floor.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            floor.tick().await;
        }
    });
}

/// How many worker threads `--threads` asks for: `None` is one per core. One means no
/// workers: the main runtime serves the listeners itself.
pub fn count(threads: Option<u16>) -> usize {
    threads.map_or_else(
        || std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
        usize::from,
    )
}

/// `n` listening sockets on one address, each with `SO_REUSEPORT`, so each worker accepts on
/// its own. Port 0 is resolved by the first bind; the others take the same port.
///
/// `SO_REUSEPORT` would also let this bind beside another process listening on the address
/// (a second limpet started by mistake, or one left behind by a restart that did not wait),
/// and the kernel would then deal new clients between two processes with affinity tables of
/// their own, splitting sessions between nodes: the pitfall of HAProxy's old processes that
/// keep accepting on a shared port. Callers therefore check every address they will bind with
/// [`refuse_if_listened`] first, before binding any (their own addresses may overlap:
/// `0.0.0.0:P` beside `[::]:P`).
pub fn bind_reuseport(addr: SocketAddr, n: usize) -> std::io::Result<Vec<std::net::TcpListener>> {
    bind_reuseport_with(addr, n, true)
}

/// [`bind_reuseport`], the sockets listening only if `listen` (else `serve_socket` makes
/// them listen once it may accept: a socket bound beside ones taken over from a running
/// limpet must not take a share of new clients before the handover is confirmed,
/// `crate::upgrade`).
pub fn bind_reuseport_with(
    addr: SocketAddr,
    n: usize,
    listen: bool,
) -> std::io::Result<Vec<std::net::TcpListener>> {
    let mut out = Vec::with_capacity(n);
    let mut at = addr;
    for _ in 0..n.max(1) {
        let socket = tcp_socket(at)?;
        socket.set_reuse_port(true)?;
        socket.bind(&at.into())?;
        if listen {
            socket.listen(BACKLOG)?;
        }
        socket.set_nonblocking(true)?;
        let listener: std::net::TcpListener = socket.into();
        if let Ok(local) = listener.local_addr() {
            at = local;
        }
        out.push(listener);
    }
    Ok(out)
}

/// A TCP socket for `addr`'s family with `SO_REUSEADDR` (a port whose old connections linger
/// in TIME_WAIT can be bound), as every listening socket of limpet's is made.
fn tcp_socket(addr: SocketAddr) -> std::io::Result<socket2::Socket> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    socket.set_reuse_address(true)?;
    Ok(socket)
}

/// The listen backlog of every listening socket (tokio's `TcpListener::bind`'s).
const BACKLOG: i32 = 1024;

/// A listening socket at `addr` without `SO_REUSEPORT` (the admin listener's: one socket,
/// and a bind error, not a shared port, if anything else listens there).
pub fn bind_one(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let socket = tcp_socket(addr)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

/// `AddrInUse` when a socket is already bound or listening at `addr` (port 0 is always
/// free): a bind without `SO_REUSEPORT` (which a listener sharing the port would need) is
/// tried and let go. `SO_REUSEADDR` as on the listeners, so a port whose old connections
/// linger in TIME_WAIT is free. Two limpets starting in the same instant could both pass
/// before either binds; that window is the time between two system calls.
pub fn refuse_if_listened(addr: SocketAddr) -> std::io::Result<()> {
    if addr.port() == 0 {
        return Ok(());
    }
    let probe = tcp_socket(addr)?;
    match probe.bind(&addr.into()) {
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => Err(std::io::Error::new(
            std::io::ErrorKind::AddrInUse,
            format!(
                "{e}: another socket listens on {addr} (another limpet? Two would share its \
                 clients through SO_REUSEPORT, each with affinity tables of its own; stop it \
                 first)"
            ),
        )),
        other => other,
    }
}

/// One listener address, bound once per worker.
#[derive(Debug)]
pub struct Sockets {
    pub name: String,
    pub mode: Mode,
    /// Where the sockets bound (port 0 resolved).
    pub local: SocketAddr,
    /// One per worker, in worker order (more than the workers when taken over from a
    /// limpet with more: `spawn` deals them round the workers).
    pub per_worker: Vec<std::net::TcpListener>,
    /// The listener's `max_connections`, shared by all its sockets.
    pub permits: Arc<crate::net::ConnLimit>,
}

impl Sockets {
    /// The sockets of listener `name` on one address (at least one), bound or taken over.
    pub fn of(
        runtime: &Runtime,
        name: &str,
        mode: Mode,
        per_worker: Vec<std::net::TcpListener>,
    ) -> std::io::Result<Self> {
        let local = per_worker
            .first()
            .ok_or(std::io::ErrorKind::AddrNotAvailable)?
            .local_addr()?;
        Ok(Self {
            name: name.to_owned(),
            mode,
            local,
            per_worker,
            permits: super::listener_permits(runtime, name),
        })
    }
}

/// Starts `workers` threads serving `sockets` once `go` turns true, until `shutdown` turns
/// true. Returns once every worker has its runtime (an error if one cannot have it: its
/// sockets would take a share of clients and never accept them); the returned receiver
/// resolves once every worker has drained and exited. All or none: a worker serves nothing
/// until every one has its runtime, and on an error those that had it exit at once (no
/// thread left serving that nobody waits for).
pub fn spawn(
    runtime: &Arc<Runtime>,
    sockets: Vec<Sockets>,
    workers: usize,
    go: &watch::Receiver<bool>,
    shutdown: &watch::Receiver<bool>,
) -> std::io::Result<oneshot::Receiver<()>> {
    // Deal the sockets out: worker k takes the k-th socket of every listener address. An
    // address taken over from a limpet with more workers has more sockets than workers, and
    // every one is served (the kernel deals clients to each): they go round the workers.
    let mut per_worker: Vec<Vec<WorkerSocket>> = (0..workers).map(|_| Vec::new()).collect();
    for s in sockets {
        for (k, l) in s.per_worker.into_iter().enumerate() {
            if let Some(w) = per_worker.get_mut(k % workers.max(1)) {
                w.push(WorkerSocket {
                    name: s.name.clone(),
                    mode: s.mode,
                    listener: l,
                    permits: Arc::clone(&s.permits),
                    accepting: runtime.state().lifecycle.accepting.enter(),
                });
            }
        }
    }
    let (all_done, done_rx) = oneshot::channel();
    let mut threads = Vec::with_capacity(workers);
    let (built_tx, built) = std::sync::mpsc::channel();
    // Some(true) once every worker has its runtime; dropped (or Some(false)) otherwise.
    let (all_built, gate) = watch::channel(None);
    for (k, listeners) in per_worker.into_iter().enumerate() {
        let runtime = Arc::clone(runtime);
        let go = go.clone();
        let shutdown = shutdown.clone();
        let built = built_tx.clone();
        let gate = gate.clone();
        let thread = std::thread::Builder::new()
            .name(format!("limpet-worker-{k}"))
            .spawn(move || worker(k, &runtime, listeners, (&go, &shutdown), &built, gate))?;
        threads.push(thread);
    }
    drop(built_tx);
    for _ in 0..threads.len() {
        match built.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(std::io::Error::other("a worker thread ended at its start")),
        }
    }
    all_built.send_replace(Some(true));
    // Joining blocks: a thread of its own reports when all are gone.
    std::thread::Builder::new()
        .name("limpet-workers-join".to_owned())
        .spawn(move || {
            for t in threads {
                let _ = t.join();
            }
            let _ = all_done.send(());
        })?;
    Ok(done_rx)
}

/// A worker's own socket of one listener address.
struct WorkerSocket {
    name: String,
    mode: Mode,
    listener: std::net::TcpListener,
    permits: Arc<crate::net::ConnLimit>,
    accepting: crate::net::Accepting,
}

/// One worker thread: its own current-thread runtime (reported on `built`), serving its
/// sockets until shutdown.
fn worker(
    k: usize,
    runtime: &Arc<Runtime>,
    listeners: Vec<WorkerSocket>,
    (go, shutdown): (&watch::Receiver<bool>, &watch::Receiver<bool>),
    built: &std::sync::mpsc::Sender<std::io::Result<()>>,
    mut all_built: watch::Receiver<Option<bool>>,
) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => {
            let _ = built.send(Ok(()));
            rt
        }
        Err(e) => {
            let _ = built.send(Err(std::io::Error::other(format!(
                "worker thread {k} cannot start its runtime: {e}"
            ))));
            return;
        }
    };
    rt.block_on(async {
        keep_a_timer_due();
        // Serving only once every worker has its runtime: else `spawn` failed, and this one
        // exits with its sockets unserved.
        let every_one = all_built
            .wait_for(Option::is_some)
            .await
            .is_ok_and(|b| *b == Some(true));
        if !every_one {
            return;
        }
        let mut tasks = tokio::task::JoinSet::new();
        for WorkerSocket {
            name,
            mode,
            listener,
            permits,
            accepting,
        } in listeners
        {
            let listener = match tokio::net::TcpListener::from_std(listener) {
                Ok(l) => l,
                Err(e) => {
                    tracing::error!(worker = k, listener = %name, error = %e, "cannot serve socket");
                    continue;
                }
            };
            tasks.spawn(serve_socket(
                Arc::clone(runtime),
                name,
                mode,
                listener,
                permits,
                Turn {
                    go: go.clone(),
                    stop: shutdown.clone(),
                    accepting,
                },
            ));
        }
        while tasks.join_next().await.is_some() {}
    });
}

/// When a socket serves: from when `go` turns true until `stop` does, counted among the
/// accept loops by `accepting` meanwhile (taken when its task is made, so that it counts
/// before the task first runs).
pub(crate) struct Turn {
    pub go: watch::Receiver<bool>,
    pub stop: watch::Receiver<bool>,
    pub accepting: crate::net::Accepting,
}

/// Serves one socket of listener `name` from when `go` turns true (at once but during a
/// takeover, `crate::upgrade`) until `stop` turns true, then drains it: the HTTP proxy or
/// the TCP relay, as the listener's mode says. `permits` is the listener's
/// `max_connections`, shared by all its sockets. `accepting` is dropped once the socket
/// takes no more clients.
pub(crate) async fn serve_socket(
    runtime: Arc<Runtime>,
    name: String,
    mode: Mode,
    listener: tokio::net::TcpListener,
    permits: Arc<crate::net::ConnLimit>,
    turn: Turn,
) {
    let Turn {
        mut go,
        mut stop,
        accepting,
    } = turn;
    // Not yet ours to accept on: clients wait in the kernel's queue meanwhile. A stop that
    // has come wins.
    tokio::select! {
        biased;
        () = super::stopped(&mut stop) => return,
        r = go.wait_for(|g| *g) => if r.is_err() { return },
    }
    // A socket bound but not yet listening listens now (`bind_reuseport_with`); again on
    // one that does, which changes nothing.
    if let Err(e) = socket2::SockRef::from(&listener).listen(BACKLOG) {
        tracing::error!(listener = %name, error = %e, "socket cannot listen; it accepts nothing");
        return;
    }
    let mut leave = LeaveUnlessStopped {
        socket: socket2::SockRef::from(&listener).try_clone().ok(),
        stop: stop.clone(),
        name: name.clone(),
    };
    let mut stopping = stop.clone();
    let serving = async move {
        match mode {
            Mode::Http => {
                // The accept loop returns as soon as this resolves.
                let shutdown = async move {
                    let _ = stop.wait_for(|s| *s).await;
                    drop(accepting);
                };
                if let Err(e) =
                    crate::proxy::serve_listener_on(runtime, &name, listener, shutdown, permits)
                        .await
                {
                    tracing::error!(listener = %name, error = %e, "listener stopped");
                }
            }
            Mode::Tcp => {
                crate::tcp::serve_on(runtime, name, listener, stop, permits, Some(accepting)).await
            }
        }
    };
    tokio::pin!(serving);
    tokio::select! {
        biased;
        // Ended before its stop: `leave` takes the socket out of its group as it drops (and
        // as it drops in a panic's unwinding).
        () = &mut serving => return,
        // Its stop: the copy goes at once, so that the socket closes as the accept loop
        // lets go of it (a copy held through the drain kept it listening, its new clients
        // queued, to be reset at the drain's end).
        _ = stopping.wait_for(|s| *s) => leave.socket = None,
    }
    serving.await;
}

/// Takes a socket out of its port's `SO_REUSEPORT` group if its accept loop ends before its
/// stop (an error, a panic): copies of it stay open (the ones kept for an upgrade), so it
/// would go on listening, the kernel dealing it a share of the port's new clients that
/// nobody accepts, each left waiting in its queue. A shutdown of its reading side stops a
/// listening socket on Linux (it leaves the group, and the clients in its queue are reset:
/// refused, so they retry, rather than left hanging), whichever descriptor it is made on.
struct LeaveUnlessStopped {
    socket: Option<socket2::Socket>,
    stop: watch::Receiver<bool>,
    name: String,
}

impl Drop for LeaveUnlessStopped {
    fn drop(&mut self) {
        if *self.stop.borrow() {
            return;
        }
        if let Some(s) = self.socket.take() {
            let left = s.shutdown(std::net::Shutdown::Read);
            tracing::error!(
                listener = %self.name,
                left = left.is_ok(),
                "a socket's accept loop ended before its stop: it listens no more"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    /// A socket whose accept loop ends before its stop (here at once: the runtime has no
    /// listener of its name) listens no more, though a copy of it stays open (as the ones
    /// kept for an upgrade do): a client is refused, not left in a queue nobody accepts
    /// from. One whose loop ends at its stop is left listening, for the next limpet.
    #[tokio::test]
    async fn a_socket_whose_accept_loop_ends_before_its_stop_listens_no_more() {
        let text = "[[nodes]]\nname = \"a\"\naddress = \"127.0.0.2\"\n\n\
                    [[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = 9\n";
        let config =
            crate::config::Config::from_text(std::path::Path::new("t.toml"), text).expect("config");
        let runtime = Runtime::new(crate::runtime::State::new(config).expect("state"));
        let loops = Arc::new(crate::net::AcceptLoops::default());
        for (name, ended_by_stop) in [("not-a-listener", false), ("web", true)] {
            let socket = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            socket.set_nonblocking(true).expect("nonblocking");
            let held = socket.try_clone().expect("a copy, as an upgrade keeps");
            let addr = socket.local_addr().expect("addr");
            let (_go_tx, go) = watch::channel(true);
            let (stop_tx, stop) = watch::channel(false);
            let serving = tokio::spawn(serve_socket(
                Arc::clone(&runtime),
                name.into(),
                Mode::Http,
                tokio::net::TcpListener::from_std(socket).expect("listener"),
                crate::net::ConnLimit::new(10),
                Turn {
                    go,
                    stop,
                    accepting: loops.enter(),
                },
            ));
            if ended_by_stop {
                // Serving: a client is taken. Then the stop.
                let mut c = tokio::net::TcpStream::connect(addr).await.expect("served");
                c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    .await
                    .expect("send");
                let mut answer = Vec::new();
                let _ = c.read_to_end(&mut answer).await;
                assert!(answer.starts_with(b"HTTP/1.1 "), "{answer:?}");
                stop_tx.send_replace(true);
            }
            serving.await.expect("the loop ends");
            let connected = tokio::net::TcpStream::connect(addr).await;
            assert_eq!(connected.is_ok(), ended_by_stop, "{name}: {connected:?}");
            drop(held);
        }
    }

    /// A second set of worker sockets on an address the first set listens on is refused (a
    /// second limpet would otherwise share the first one's clients); once the first is
    /// closed, the address binds again.
    #[test]
    fn an_address_another_socket_listens_on_is_refused() {
        let first = bind_reuseport(SocketAddr::from(([127, 0, 0, 1], 0)), 2).expect("bind");
        let addr = first[0].local_addr().expect("addr");
        assert_eq!(first[1].local_addr().expect("addr"), addr, "one port");
        let e = refuse_if_listened(addr).expect_err("the address is taken");
        assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse);
        assert!(e.to_string().contains(&addr.to_string()), "{e}");
        drop(first);
        refuse_if_listened(addr).expect("free again");
        assert_eq!(bind_reuseport(addr, 2).expect("bind").len(), 2);
    }

    /// A limpet's own addresses may overlap (the wildcard of both families on one port, as
    /// `docs/config.md` shows): each is checked before any is bound, then all bind.
    #[test]
    fn overlapping_addresses_of_one_limpet_all_bind() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let addrs = [
            SocketAddr::from(([0, 0, 0, 0], port)),
            SocketAddr::from(([127, 0, 0, 1], port)),
        ];
        for a in addrs {
            refuse_if_listened(a).expect("nothing listens yet");
        }
        let bound: Vec<_> = addrs
            .iter()
            .map(|&a| bind_reuseport(a, 2).expect("bind"))
            .collect();
        assert_eq!(bound.len(), 2);
    }
}
