//! Shared pieces of the network seam: accepting a client, connecting to a node, and what
//! running out of file descriptors does. HTTP (`crate::proxy`) and TCP (`crate::tcp`)
//! listeners both take a client through [`accept_client`] (PROXY header from trusted peers,
//! then TLS) and reach a node through [`connect_node`] and [`node_tls`], so each of those
//! rules and timeouts is written once; the relay between them is [`crate::relay`].
//!
//! ```text
//!  accept_loop (permits, shutdown; one rule for errors) ─► accept_client: PROXY header? ─► TLS accept? (header_read)
//!  connect_node (connect timeout, no Nagle) ─► [PROXY header, TCP] ─► node_tls? (connect)
//! ```
//!
//! Every listener (HTTP, TCP, admin) accepts through [`accept_loop`], so an accept error has one
//! rule: back off briefly instead of spinning, and log it at most once per
//! [`LOG_EVERY`] with the count of the errors not logged. Out of file descriptors
//! (EMFILE/ENFILE) is the common one under a connection flood; it recovers by itself as
//! connections close, and it is never held against a node: connect and health-check failures
//! it causes carry no verdict on the node (`crate::error::Cause::Local`), so nodes do not
//! flap DOWN/UP because limpet ran out of sockets.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use crate::config::ListenerDef;
use crate::error::{Stage, UpstreamError};
use crate::socket::{ClientSocket, Listener};
use crate::tcp::{Io, Peer};

/// At most one log line per this interval for each kind of local resource error.
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// The pause after a failed accept: long enough not to spin on an error that persists,
/// short enough that a freed descriptor is used at once.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// A warning logged at most once per [`LOG_EVERY`], with the count of repeats it swallowed.
#[derive(Debug)]
pub struct RateLimitedLog {
    what: &'static str,
    state: Mutex<LogWindow>,
}

impl RateLimitedLog {
    pub const fn new(what: &'static str) -> Self {
        RateLimitedLog {
            what,
            state: Mutex::new(LogWindow::new()),
        }
    }

    /// Notes one occurrence (`context`: where); returns whether it was logged.
    pub fn note(&self, context: &str) -> bool {
        let Some(swallowed) = self.due() else {
            return false;
        };
        tracing::warn!(context, repeats_not_logged = swallowed, "{}", self.what);
        true
    }

    /// [`Self::note`], the context made only when the line is written.
    pub fn note_with(&self, context: impl FnOnce() -> String) -> bool {
        let Some(swallowed) = self.due() else {
            return false;
        };
        let context = context();
        tracing::warn!(context, repeats_not_logged = swallowed, "{}", self.what);
        true
    }

    /// One occurrence now: the repeats swallowed since the last line when this one is to be
    /// logged, `None` when it falls in the window.
    fn due(&self) -> Option<u64> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.note(Instant::now())
    }
}

/// A [`RateLimitedLog`] with a window of its own for each node address: one node failing
/// over and over does not hide a second node's first failure (a bad certificate on one node
/// beside a wrong `ca` for another). The map holds configured node addresses only, and is
/// pruned of quiet ones when it grows past [`PerNodeLog::KEPT`] (reloads that move nodes).
#[derive(Debug)]
pub struct PerNodeLog {
    what: &'static str,
    state: Mutex<BTreeMap<SocketAddr, LogWindow>>,
}

impl PerNodeLog {
    /// How many node addresses the map holds before quiet ones are pruned.
    pub const KEPT: usize = 1024;

    pub const fn new(what: &'static str) -> Self {
        PerNodeLog {
            what,
            state: Mutex::new(BTreeMap::new()),
        }
    }

    /// Notes one occurrence at `node` (`context`: where and what, naming the node); returns
    /// whether it was logged.
    pub fn note(&self, node: SocketAddr, context: &str) -> bool {
        let now = Instant::now();
        let due = {
            let mut map = self.state.lock().unwrap_or_else(|e| e.into_inner());
            if map.len() >= Self::KEPT && !map.contains_key(&node) {
                map.retain(|_, w| w.last.is_some_and(|t| now.duration_since(t) < LOG_EVERY));
            }
            map.entry(node).or_insert_with(LogWindow::new).note(now)
        };
        let Some(swallowed) = due else { return false };
        tracing::warn!(context, repeats_not_logged = swallowed, "{}", self.what);
        true
    }
}

/// When a rate-limited warning was last logged, and how many notes were not logged since.
#[derive(Debug)]
struct LogWindow {
    last: Option<Instant>,
    swallowed: u64,
}

impl LogWindow {
    const fn new() -> Self {
        LogWindow {
            last: None,
            swallowed: 0,
        }
    }

    /// One occurrence at `now`: the count of those swallowed since the last line when this
    /// one is to be logged, `None` when it falls in the window.
    fn note(&mut self, now: Instant) -> Option<u64> {
        if self
            .last
            .is_some_and(|last| now.duration_since(last) < LOG_EVERY)
        {
            self.swallowed += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.swallowed))
    }
}

/// Where limpet ran out of file descriptors: the label of `limpet_out_of_fds_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FdsAt {
    /// An accept try (the client waits in the listen backlog; tried again every
    /// [`ACCEPT_BACKOFF`], so one waiting client counts about 20 a second).
    Accept,
    /// Opening a connection to a node: no verdict on it (an HTTP request fails over or gets
    /// 503; a TCP session is closed).
    Connect,
    /// Opening an active health check's socket (the check is skipped; no verdict).
    Check,
}

impl FdsAt {
    pub const ALL: [FdsAt; 3] = [FdsAt::Accept, FdsAt::Connect, FdsAt::Check];

    pub fn as_str(self) -> &'static str {
        match self {
            FdsAt::Accept => "accept",
            FdsAt::Connect => "connect",
            FdsAt::Check => "check",
        }
    }
}

/// Every time this process ran out of file descriptors, counted by where ([`FdsAt`], for
/// the metrics) and logged at most once per [`LOG_EVERY`] whatever the place.
#[derive(Debug)]
pub struct OutOfFds {
    log: RateLimitedLog,
    /// Indexed by `FdsAt as usize`: its variants have the discriminants 0, 1, 2, in the
    /// order of [`FdsAt::ALL`].
    counts: [AtomicU64; FdsAt::ALL.len()],
    /// Woken at every occurrence: the idle node connection pools drop what they keep
    /// ([`OutOfFds::pressure`]).
    pressure: tokio::sync::Notify,
}

impl OutOfFds {
    const fn new() -> Self {
        OutOfFds {
            log: RateLimitedLog::new(
                "out of file descriptors: raise the limit (ulimit -n, LimitNOFILE) or lower max_connections",
            ),
            counts: [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)],
            pressure: tokio::sync::Notify::const_new(),
        }
    }

    /// Notes one occurrence at `at` (`context`: the listener or the node's role, for the log).
    pub fn note(&self, at: FdsAt, context: &str) {
        self.counts[at as usize].fetch_add(1, Ordering::Relaxed);
        self.log.note(context);
        self.pressure.notify_waiters();
    }

    /// Resolves at the next occurrence. Idle kept-alive node connections each hold a
    /// descriptor: out of them, the pools drop the ones unused for a second at once rather
    /// than at their expiry (`upstream_idle`), so new clients get descriptors back, as
    /// HAProxy's `tune.pool-high-fd-ratio` closes idle connections when descriptors run low.
    pub async fn pressure(&self) {
        self.pressure.notified().await;
    }

    /// How many times this process ran out at `at` since it started.
    pub fn count(&self, at: FdsAt) -> u64 {
        self.counts[at as usize].load(Ordering::Relaxed)
    }
}

/// Raises this process's soft limit on open files to its hard limit, as HAProxy raises it
/// to what its `maxconn` needs and nginx's `worker_rlimit_nofile` sets it: with the common
/// default soft limit (1024) a proxy runs out of descriptors at a few hundred connections,
/// far below `max_connections` (10,000 by default). Logged when it changed; the limit now.
pub fn raise_fd_limit() -> Option<u64> {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let was = getrlimit(Resource::Nofile);
    // No hard limit: a million, as the kernel's default `nr_open` allows.
    let to = was.maximum.unwrap_or(1 << 20);
    match was.current {
        Some(soft) if soft >= to => return Some(soft),
        None => return None,
        Some(_) => {}
    }
    let raised = Rlimit {
        current: Some(to),
        maximum: was.maximum,
    };
    match setrlimit(Resource::Nofile, raised) {
        Ok(()) => {
            tracing::info!(
                from = was.current,
                to,
                "open file limit raised to the hard limit"
            );
            Some(to)
        }
        Err(e) => {
            tracing::warn!(limit = was.current, error = %e, "open file limit not raised");
            was.current
        }
    }
}

/// Out of file descriptors, wherever limpet noticed it (accept, connect, health check).
pub static LOCAL_FDS: OutOfFds = OutOfFds::new();

/// No local port free for a connection to a node or a check: limpet's own shortage, logged
/// at most once per interval, never a verdict on the node.
pub static NO_LOCAL_PORT: RateLimitedLog = RateLimitedLog::new(
    "no local address or port free to connect from (EADDRNOTAVAIL): the ephemeral ports to that address taken (widen net.ipv4.ip_local_port_range, keep node connections alive), or no source address of the node's family on this host; the node is not charged",
);

/// Other accept errors.
static ACCEPT_ERRORS: RateLimitedLog = RateLimitedLog::new("accept failed");

/// A listener's `max_connections`: the client connections served at once, over every
/// socket and worker thread of the listener, tunnels included. A reload changes the limit
/// in place ([`ConnLimit::set`]): raised, the connections waiting are served at once;
/// lowered, the connections over the new limit go on, and their slots are not given out
/// again as they close, until the count is under it.
#[derive(Debug)]
pub struct ConnLimit {
    permits: Arc<tokio::sync::Semaphore>,
    /// The limit in force.
    limit: Mutex<usize>,
    /// Slots to take back as their connections close (a lowered limit whose slots were
    /// in use): a permit returned while this is above 0 is forgotten instead.
    owed: AtomicU64,
}

impl ConnLimit {
    pub fn new(limit: usize) -> Arc<ConnLimit> {
        Arc::new(ConnLimit {
            permits: Arc::new(tokio::sync::Semaphore::new(limit)),
            limit: Mutex::new(limit),
            owed: AtomicU64::new(0),
        })
    }

    /// The limit in force.
    pub fn limit(&self) -> usize {
        *self
            .limit
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Changes the limit (a reload). One change at a time (the lock), so the permits and
    /// the debt always add up to it.
    pub fn set(&self, limit: usize) {
        let mut current = self
            .limit
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if limit > *current {
            let want = (limit - *current) as u64;
            // First cancel what a lower limit still owes. The update may run again when a
            // closing connection pays a debt meanwhile: it must not carry state between runs.
            let owed = self
                .owed
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |owed| {
                    Some(owed - owed.min(want))
                })
                .unwrap_or_else(|o| o);
            let more = want - owed.min(want);
            self.permits
                .add_permits(usize::try_from(more).unwrap_or(usize::MAX));
        } else {
            let fewer = *current - limit;
            let free = self.permits.forget_permits(fewer);
            self.owed.fetch_add((fewer - free) as u64, Ordering::AcqRel);
        }
        *current = limit;
    }

    /// A slot, once one is free.
    async fn acquire(self: &Arc<Self>) -> Option<ConnPermit> {
        let permit = Arc::clone(&self.permits).acquire_owned().await.ok()?;
        Some(ConnPermit {
            permit: Some(permit),
            limit: Arc::clone(self),
        })
    }
}

/// One client connection's slot in its listener's [`ConnLimit`], given back when dropped
/// (or kept back, when a lowered limit is owed one).
#[derive(Debug)]
pub struct ConnPermit {
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
    limit: Arc<ConnLimit>,
}

impl Drop for ConnPermit {
    fn drop(&mut self) {
        let owed = self
            .limit
            .owed
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |o| o.checked_sub(1));
        if let (Ok(_), Some(p)) = (owed, self.permit.take()) {
            p.forget();
        }
    }
}

/// How many accept loops of a process's listeners are running, to tell when all have
/// stopped: a limpet handing its sockets to a new one (`crate::upgrade`) confirms only
/// then, so the two never accept on them at once.
#[derive(Debug, Default)]
pub struct AcceptLoops {
    running: std::sync::atomic::AtomicUsize,
    stopped: tokio::sync::Notify,
}

/// One accept loop counted in [`AcceptLoops`] until dropped.
#[derive(Debug)]
pub struct Accepting(Arc<AcceptLoops>);

impl AcceptLoops {
    /// Counts an accept loop until the guard drops (after the loop has returned).
    pub fn enter(self: &Arc<Self>) -> Accepting {
        self.running.fetch_add(1, Ordering::AcqRel);
        Accepting(Arc::clone(self))
    }

    /// Resolves once no accept loop runs, or after `limit`; `false` at the limit.
    pub async fn all_stopped(&self, limit: Duration) -> bool {
        tokio::time::timeout(limit, async {
            loop {
                let stopped = self.stopped.notified();
                tokio::pin!(stopped);
                stopped.as_mut().enable();
                if self.running.load(Ordering::Acquire) == 0 {
                    return;
                }
                stopped.await;
            }
        })
        .await
        .is_ok()
    }
}

impl Drop for Accepting {
    fn drop(&mut self) {
        if self.0.running.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.stopped.notify_waiters();
        }
    }
}

/// A client's slot in its listener's [`ConnLimit`], as [`accept_loop`] hands it over.
#[derive(Debug)]
pub enum Slot {
    /// Taken: the client is served now.
    Held(ConnPermit),
    /// The listener stopped while this client, accepted already, waited at the limit: it is
    /// served once the drain gives a slot back (a kept-alive connection closing at it), not
    /// dropped, which would reset the request it has sent (an upgrade handing the socket to
    /// a new limpet, or a shutdown). The server bounds the wait.
    Awaited(Arc<ConnLimit>),
}

impl Slot {
    /// The slot, once it is free; `None` only if the limit was closed (it never is).
    pub async fn taken(self) -> Option<ConnPermit> {
        match self {
            Slot::Held(p) => Some(p),
            Slot::Awaited(limit) => limit.acquire().await,
        }
    }
}

/// The accept loop of every listener (HTTP, TCP, admin): until `shutdown` resolves, takes
/// the next client and then one permit of `permits` (a listener's `max_connections`), and
/// hands both to `serve`, which spawns what serves it. At the limit, the client just accepted
/// waits for a permit and further clients wait in the kernel backlog. Returns once `shutdown`
/// resolved; the caller drains. A client the stop finds waiting for a permit is handed over
/// all the same, its slot to be awaited ([`Slot::Awaited`]), once the listener is closed.
///
/// Accepting before taking the permit matters with worker threads: the sockets of one
/// listener (one per worker) share its permits, and a worker waiting for a client must not
/// hold a permit that a client arriving on another worker's socket needs.
///
/// The listener is taken over (a [`Listener`]: accepted sockets join the reactor only when
/// they first wait) and closed when this returns, so that new clients are refused from then
/// on while the caller drains.
pub async fn accept_loop<F>(
    listener: TcpListener,
    name: &str,
    permits: Arc<ConnLimit>,
    shutdown: impl std::future::Future<Output = ()>,
    mut serve: F,
) where
    F: FnMut(ClientSocket, SocketAddr, Slot),
{
    let listener = match Listener::new(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(listener = name, error = %e, "listener could not be registered; it accepts nothing");
            return;
        }
    };
    tokio::pin!(shutdown);
    loop {
        // The stop first: once it has come, no client more is taken (a limpet handing its
        // sockets over counts on that, `crate::upgrade`).
        let (stream, peer) = tokio::select! {
            biased;
            () = &mut shutdown => return,
            s = accept(&listener, name) => s,
        };
        // A slot free now is taken before a stop that came meanwhile is seen: the client was
        // accepted, and dropping it would reset its request (a stop from another thread, as
        // a handover to a new limpet or a shutdown signal is, can land between the accept
        // and this). One waiting for a slot at the limit is served by the drain.
        let slot = tokio::select! {
            biased;
            p = permits.acquire() => match p {
                Some(p) => Slot::Held(p),
                None => return,
            },
            () = &mut shutdown => {
                // Closed first: the new limpet, or nobody, takes the next clients.
                drop(listener);
                serve(stream, peer, Slot::Awaited(permits));
                return;
            }
        };
        serve(stream, peer, slot);
    }
}

/// The next client of `listener` (named `name` in logs). Errors are logged per the module
/// rule and retried after a short pause; this never returns an error.
pub async fn accept(listener: &Listener, name: &str) -> (ClientSocket, SocketAddr) {
    loop {
        match listener.accept().await {
            Ok(s) => return s,
            Err(e) => {
                if crate::error::out_of_fds(&e) {
                    LOCAL_FDS.note(FdsAt::Accept, name);
                } else {
                    // The error in the line itself: ENOBUFS, EPERM (a firewall) and
                    // ECONNABORTED call for different things.
                    ACCEPT_ERRORS.note_with(|| format!("{name}: {e}"));
                }
                tokio::time::sleep(ACCEPT_BACKOFF).await;
            }
        }
    }
}

/// A client ready to be served: who it is, and its byte stream (TLS already accepted on a
/// TLS listener).
pub struct Client {
    /// From a trusted PROXY header, else the connection's own addresses.
    pub who: Peer,
    /// The address the TCP connection came from (trust decisions use this one).
    pub tcp_peer: SocketAddr,
    /// limpet's own socket address the client reached (`node_port = "same"` uses its port).
    pub local: SocketAddr,
    pub io: Box<dyn Io>,
    /// When the connection was taken: `header_read` runs from here.
    pub accepted: Instant,
    pub tls: bool,
    /// An HTTP listener's TLS client: where its records stand (`crate::tls::records`).
    pub records: Option<Arc<crate::tls::RecordClock>>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("who", &self.who)
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

/// Takes an accepted connection (Nagle already off: [`Listener`]) through a listener's
/// client side: the PROXY header from a trusted peer (within `proxy_header`), then the TLS
/// handshake on a TLS listener (within `header_read`, like the request head that follows
/// it). `Err` says why the connection is refused, for a debug log line.
///
/// `bound` is the listening socket's address: a connection to a listener bound to one address
/// has that local address, so only a wildcard listener (`0.0.0.0`, `[::]`) asks the kernel
/// (one `getsockname` saved per connection, which `Connection: close` traffic pays each time).
pub async fn accept_client(
    stream: ClientSocket,
    peer: SocketAddr,
    bound: SocketAddr,
    def: &ListenerDef,
) -> Result<Client, String> {
    let local = if bound.ip().is_unspecified() {
        // Were the kernel ever not to say, the listener's own address (its port is the
        // one reached), never the peer's: `node_port = "same"` connects to this port.
        stream.local_addr().unwrap_or(bound)
    } else {
        bound
    };
    // `header_read` runs from here: a PROXY header, the TLS handshake and (on an HTTP
    // listener) the first request head share it, so a client slow at each step holds its
    // slot for `header_read` in all, not once per step.
    let accepted = Instant::now();
    let (who, stream) = crate::tcp::read_proxy_header(stream, peer, local, &def.proxy_protocol)
        .await
        .map_err(|e| format!("PROXY header refused: {e}"))?;
    let mut records = None;
    let (io, tls): (Box<dyn Io>, bool) = match &def.tls {
        Some(cfg) => {
            let acceptor = tokio_rustls::TlsAcceptor::from(Arc::clone(cfg));
            let by = accepted + def.timeouts.header_read;
            let handshake = if def.mode == crate::config::Mode::Http {
                // Its records are followed for the idle watch (`crate::tls::records`).
                let clock = Arc::new(crate::tls::RecordClock::default());
                let watched = crate::tls::RecordWatch::new(stream, Arc::clone(&clock));
                records = Some(clock);
                tokio::time::timeout_at(by, acceptor.accept(watched))
                    .await
                    .map(|r| {
                        r.map(|mut s| {
                            // Only HTTP/2 reads where its records stand.
                            if s.get_ref().1.alpn_protocol() != Some(b"h2") {
                                s.get_mut().0.unwatched();
                            }
                            Box::new(s) as Box<dyn Io>
                        })
                    })
            } else {
                tokio::time::timeout_at(by, acceptor.accept(stream))
                    .await
                    .map(|r| r.map(|s| Box::new(s) as Box<dyn Io>))
            };
            match handshake {
                Ok(Ok(s)) => (s, true),
                Ok(Err(e)) => return Err(format!("TLS handshake failed: {e}")),
                Err(_) => return Err("TLS handshake timed out".into()),
            }
        }
        None => (Box::new(stream), false),
    };
    Ok(Client {
        who,
        tcp_peer: peer,
        local,
        io,
        tls,
        records,
        accepted,
    })
}

/// A TCP connection to a node within `timeout`, Nagle off (small writes, heads and WebSocket
/// frames, must not wait). Out of file descriptors is noted once per interval and carries
/// no verdict on the node.
pub async fn connect_node(addr: SocketAddr, timeout: Duration) -> Result<TcpStream, UpstreamError> {
    let stream = match tokio::time::timeout(timeout, connect_tcp(addr)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            if crate::error::out_of_fds(&e) {
                LOCAL_FDS.note(FdsAt::Connect, "connect to a node");
            } else if crate::error::no_local_port(&e) {
                NO_LOCAL_PORT.note_with(|| format!("connect to node address {addr}"));
            }
            return Err(UpstreamError::io(Stage::Connect, &e));
        }
        Err(_) => return Err(UpstreamError::timeout(Stage::Connect, false)),
    };
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// `TcpStream::connect`, less the `getsockopt(SO_ERROR)` it makes after every connect: the
/// readiness a connect ends with already tells a failed one (a failed connect closes the
/// socket, `EPOLLHUP`: write-closed), so the socket's error is asked for only then. One syscall fewer per node connection, which each
/// short session through a TCP listener makes (HAProxy does not ask either).
async fn connect_tcp(addr: SocketAddr) -> std::io::Result<TcpStream> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(
        Domain::for_address(addr),
        Type::STREAM.nonblocking(),
        Some(Protocol::TCP),
    )?;
    match socket.connect(&addr.into()) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    let stream = TcpStream::from_std(std::net::TcpStream::from(socket))?;
    let ready = stream.ready(tokio::io::Interest::WRITABLE).await?;
    if ready.is_write_closed() {
        return Err(stream.take_error()?.unwrap_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                "the connection closed while it was being made",
            )
        }));
    }
    Ok(stream)
}

/// TLS to a node (`tls`: the client config and the name to send and verify) within
/// `timeout`; the plain stream when the listener does not use TLS to its nodes.
pub async fn node_tls<S>(
    addr: SocketAddr,
    stream: S,
    tls: Option<(
        &Arc<rustls::ClientConfig>,
        rustls_pki_types::ServerName<'static>,
    )>,
    timeout: Duration,
) -> Result<Box<dyn Io>, UpstreamError>
where
    S: Io + 'static,
{
    let Some((cfg, name)) = tls else {
        return Ok(Box::new(stream));
    };
    let connector = tokio_rustls::TlsConnector::from(Arc::clone(cfg));
    match tokio::time::timeout(timeout, connector.connect(name.clone(), stream)).await {
        Ok(Ok(s)) => Ok(Box::new(s)),
        Ok(Err(e)) => {
            // Said at `warn` (rate-limited): a certificate the CA does not verify or a name
            // it does not cover is a configuration fault that fails every request to the
            // node, and without active checks nothing else would name it (chaos run: a wrong
            // `ca` read as a dead fleet at the default log level).
            NODE_TLS_FAILED.note(addr, &format!("node {addr} (name {}): {e}", name.to_str()));
            Err(UpstreamError::io(Stage::Tls, &e))
        }
        Err(_) => Err(UpstreamError::timeout(Stage::Tls, false)),
    }
}

/// TLS handshakes with nodes that failed (not those that timed out), per node.
static NODE_TLS_FAILED: PerNodeLog = PerNodeLog::new("TLS to a node failed");

#[cfg(test)]
mod tests {
    use super::*;

    /// `all_stopped` resolves when the last counted loop is gone, not before, and gives up
    /// at its limit (paused time).
    #[tokio::test(start_paused = true)]
    async fn accept_loops_are_all_stopped_when_the_last_goes() {
        let loops = Arc::new(AcceptLoops::default());
        assert!(loops.all_stopped(Duration::from_millis(1)).await);
        let a = loops.enter();
        let b = loops.enter();
        assert!(!loops.all_stopped(Duration::from_secs(1)).await);
        drop(a);
        assert!(!loops.all_stopped(Duration::from_secs(1)).await);
        let waiting = tokio::spawn({
            let loops = Arc::clone(&loops);
            async move { loops.all_stopped(Duration::from_secs(60)).await }
        });
        tokio::task::yield_now().await;
        drop(b);
        assert!(waiting.await.expect("waited"));
    }

    /// A stop that comes between a client's accept and its slot (from another thread: a
    /// handover to a new limpet, a shutdown signal) no longer drops the client, whose
    /// request it reset: a free slot is taken first. The stop here turns ready at its k-th
    /// look (k = 2 or 3: right after an accept that was ready at once, or one that waited
    /// for the client), so the loop either stops before accepting (the client is still
    /// queued on the socket, which a copy keeps open) or accepts and serves it; never
    /// accepts and drops it, which it did in about every other round that accepted
    /// (`select!` polls in random order).
    #[tokio::test]
    async fn a_stop_between_an_accept_and_a_free_slot_does_not_drop_the_client() {
        /// Pending (without waking anyone) until its k-th poll, ready from then on.
        struct ReadyAt(usize);
        impl std::future::Future for ReadyAt {
            type Output = ();
            fn poll(
                mut self: std::pin::Pin<&mut Self>,
                _: &mut std::task::Context<'_>,
            ) -> std::task::Poll<()> {
                if self.0 <= 1 {
                    return std::task::Poll::Ready(());
                }
                self.0 -= 1;
                std::task::Poll::Pending
            }
        }
        let mut accepted_rounds = 0;
        for round in 0..64 {
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let addr = listener.local_addr().expect("addr");
            let copy = socket2::SockRef::from(&listener)
                .try_clone()
                .expect("a copy of the socket");
            let _client = tokio::net::TcpStream::connect(addr).await.expect("connect");
            let mut served = 0;
            accept_loop(
                listener,
                "test",
                ConnLimit::new(4),
                ReadyAt(2 + round % 2),
                |_, _, slot| {
                    assert!(matches!(slot, Slot::Held(_)));
                    served += 1;
                },
            )
            .await;
            copy.set_nonblocking(true).expect("nonblocking");
            let still_queued = copy.accept().is_ok();
            assert!(
                served == 1 || still_queued,
                "round {round}: the client was accepted and dropped"
            );
            assert!(served + usize::from(still_queued) == 1);
            accepted_rounds += served;
        }
        // Both sides of the race were met.
        assert!(accepted_rounds > 0);
    }

    /// A client accepted and waiting for a slot when the stop comes is handed over with
    /// its slot to await, after the listening socket is closed, and gets the slot once one
    /// is given back (as a drain does); before, it was dropped at the stop, its request
    /// reset. (Paused time: the stop is a timer, which fires only once the loop has accepted the
    /// client and waits, nothing else left to do.)
    #[tokio::test(start_paused = true)]
    async fn a_client_waiting_for_a_slot_at_the_stop_is_handed_over_to_await_it() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let limit = ConnLimit::new(1);
        let held = limit.acquire().await.expect("the one slot");
        let waiting = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let mut handed = Vec::new();
        accept_loop(
            listener,
            "test",
            Arc::clone(&limit),
            tokio::time::sleep(Duration::from_secs(1)),
            |_, peer, slot| handed.push((peer, slot)),
        )
        .await;
        let [(peer, slot)] = <[_; 1]>::try_from(handed).expect("one client handed over");
        assert_eq!(peer, waiting.local_addr().expect("addr"));
        assert!(matches!(slot, Slot::Awaited(_)), "{slot:?}");
        assert!(
            tokio::net::TcpStream::connect(addr).await.is_err(),
            "the listening socket is closed"
        );
        let taking = tokio::spawn(slot.taken());
        tokio::task::yield_now().await;
        assert!(!taking.is_finished(), "the slot is still held");
        drop(held);
        let taken = taking.await.expect("the task");
        assert!(taken.is_some(), "the slot given back is taken");
    }

    /// Limits changed while connections come and go on other threads: once all are closed,
    /// the free slots are exactly the last limit (no slot lost or made up by a race between
    /// a change and a closing connection). Bounded: 4 tasks of 3,000 connections each.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_connection_limit_changed_under_churn_ends_at_its_limit() {
        let limit = ConnLimit::new(4);
        let churn: Vec<_> = (0..4)
            .map(|_| {
                let limit = Arc::clone(&limit);
                tokio::spawn(async move {
                    for _ in 0..3_000 {
                        if let Some(p) = limit.acquire().await {
                            tokio::task::yield_now().await;
                            drop(p);
                        }
                    }
                })
            })
            .collect();
        for i in 0..3_000usize {
            // Between 1 and 8, never 0: the churn must go on.
            limit.set(1 + (i * 7919) % 8);
            tokio::task::yield_now().await;
        }
        // A lost slot shows as churn that never ends (every slot lost): bounded.
        tokio::time::timeout(Duration::from_secs(30), async {
            for t in churn {
                t.await.expect("churn");
            }
        })
        .await
        .expect("every connection got a slot: none lost");
        assert_eq!(limit.owed.load(Ordering::Acquire), 0);
        assert_eq!(limit.permits.available_permits(), limit.limit());
    }

    /// A limit lowered below the slots in use takes them back as they close; raised again,
    /// it first cancels what it was still owed. Free slots always match the limit minus
    /// the slots held.
    #[tokio::test]
    async fn a_connection_limit_changed_in_use_converges_to_the_new_limit() {
        let limit = ConnLimit::new(2);
        let a = limit.acquire().await.expect("a slot");
        let b = limit.acquire().await.expect("a slot");
        limit.set(0);
        assert_eq!(limit.permits.available_permits(), 0);
        limit.set(1);
        // One of the two owed slots cancelled, none added: two held, limit 1.
        assert_eq!(limit.permits.available_permits(), 0);
        drop(a);
        // Taken back: one held, limit 1.
        assert_eq!(limit.permits.available_permits(), 0);
        drop(b);
        assert_eq!(limit.permits.available_permits(), 1);
        limit.set(3);
        assert_eq!(limit.permits.available_permits(), 3);
        assert_eq!(limit.limit(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_flood_of_errors_is_logged_once_per_interval() {
        let log = RateLimitedLog::new("test");
        assert!(log.note("a"), "the first is logged");
        for _ in 0..1000 {
            assert!(!log.note("a"));
        }
        tokio::time::advance(LOG_EVERY).await;
        assert!(log.note("a"), "then once per interval");
        assert!(!log.note("a"));
    }

    #[tokio::test(start_paused = true)]
    async fn one_node_s_flood_of_errors_hides_no_other_node_s() {
        let log = PerNodeLog::new("test");
        let a: SocketAddr = "127.0.0.2:443".parse().expect("addr");
        let b: SocketAddr = "127.0.0.3:443".parse().expect("addr");
        assert!(log.note(a, "x"), "a's first is logged");
        for _ in 0..100 {
            assert!(!log.note(a, "x"));
        }
        assert!(log.note(b, "y"), "b's first is logged, in a's window");
        assert!(!log.note(b, "y"));
        tokio::time::advance(LOG_EVERY).await;
        assert!(log.note(a, "x"), "each once per interval");
        assert!(log.note(b, "y"));
    }

    /// Reloads that keep moving nodes cannot grow the map without bound: past its size, the
    /// nodes quiet for a window are forgotten (and log at once if they fail again).
    #[tokio::test(start_paused = true)]
    async fn the_per_node_log_forgets_quiet_nodes_past_its_size() {
        let log = PerNodeLog::new("test");
        let node =
            |i: usize| SocketAddr::from(([127, 0, (i / 250) as u8, (i % 250) as u8 + 1], 443));
        for i in 0..PerNodeLog::KEPT {
            assert!(log.note(node(i), "x"));
        }
        tokio::time::advance(LOG_EVERY).await;
        assert!(log.note(node(PerNodeLog::KEPT), "x"));
        let held = log.state.lock().expect("lock").len();
        assert_eq!(held, 1, "the quiet ones went");
    }

    /// The connect that reads no socket error: a refused connect is still an error (from its
    /// readiness), with the kernel's own error kind; an accepted one is a connected stream.
    #[tokio::test]
    async fn a_node_connect_tells_refused_from_connected_without_asking_each_socket() {
        let closed = {
            let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            l.local_addr().expect("addr")
        };
        let refused = connect_node(closed, Duration::from_secs(5))
            .await
            .expect_err("nothing listens there");
        assert_eq!(refused.stage, Stage::Connect);
        assert_eq!(
            refused.cause,
            crate::error::Cause::Io(std::io::ErrorKind::ConnectionRefused),
            "{refused:?}"
        );
        assert!(!refused.sent);

        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr");
        let (stream, accepted) =
            tokio::join!(connect_node(addr, Duration::from_secs(5)), l.accept());
        let stream = stream.expect("connected");
        let (peer, _) = accepted.expect("accepted");
        assert_eq!(stream.peer_addr().expect("peer"), addr);
        assert_eq!(
            peer.peer_addr().expect("peer"),
            stream.local_addr().expect("local")
        );
        assert!(stream.nodelay().expect("nodelay"), "Nagle is off");
    }
}
