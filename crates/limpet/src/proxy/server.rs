//! The listener side: accepting client connections, serving HTTP/1.1 and h2c on each, the
//! per-connection state, and draining on shutdown.
//!
//! ```text
//!  accept (one permit of max_client_connections each)
//!    └─► task per connection: hyper-util auto (HTTP/1.1 or h2c prior knowledge)
//!          ├─► forward::handle per request, sharing this connection's ConnCtx
//!          ├─► idle watch: no request in flight for keep_alive_idle ─► graceful close
//!          └─► shutdown signal ─► graceful close (finish in-flight, then close)
//! ```

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use limpet_core::{NodeId, Pool, Transition};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::time::Instant;

use super::affinity::Affinity;
use super::config::{ConfigError, IpNet, Limits, ProxyConfig, Sticky, Timeouts};
use super::forward;
use super::upstream::NodeConns;

/// State shared by every connection of one listener.
#[derive(Debug)]
pub(crate) struct Shared {
    /// The decision core. Held only across non-async calls (decide, assign, record_*).
    pool: Mutex<Pool>,
    /// Connections per node, indexed by `NodeId`.
    pub(crate) conns: Vec<Arc<NodeConns>>,
    /// Node names by `NodeId`, for logs without taking the pool lock.
    names: Vec<Box<str>>,
    pub(crate) affinity: Option<Affinity>,
    trusted: Vec<IpNet>,
    pub(crate) limits: Limits,
    pub(crate) timeouts: Timeouts,
    pub(crate) retry_after: u32,
    ids: RequestIds,
    /// Turns true when the listener starts draining; tunnels watch it too.
    pub(crate) draining: watch::Receiver<bool>,
}

impl Shared {
    fn new(cfg: ProxyConfig, draining: watch::Receiver<bool>) -> Result<Self, ConfigError> {
        cfg.validate()?;
        let pool = Pool::new(cfg.nodes.iter().map(|n| n.name.as_str()))
            .map_err(|e| ConfigError(e.to_string()))?
            .with_health_policy(cfg.health);
        let conns = cfg
            .nodes
            .iter()
            .map(|n| {
                Arc::new(NodeConns::new(
                    n.addr,
                    cfg.limits.max_idle_per_node,
                    cfg.timeouts.upstream_idle,
                    cfg.timeouts.connect,
                ))
            })
            .collect();
        let affinity = match cfg.sticky {
            Sticky::Cookie(c) => Some(Affinity::new(c, &pool)?),
            Sticky::None => None,
        };
        Ok(Shared {
            names: cfg.nodes.iter().map(|n| n.name.as_str().into()).collect(),
            pool: Mutex::new(pool),
            conns,
            affinity,
            trusted: cfg.trusted_proxies,
            limits: cfg.limits,
            timeouts: cfg.timeouts,
            retry_after: cfg.retry_after_secs,
            ids: RequestIds::new(),
            draining,
        })
    }

    /// The pool, for one synchronous decision. A panic while it was held cannot leave it
    /// half-updated in a way that matters more than refusing service would, so poisoning is
    /// ignored.
    pub(crate) fn pool(&self) -> MutexGuard<'_, Pool> {
        self.pool.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn node_name(&self, node: NodeId) -> &str {
        self.names.get(node.index()).map_or("", |n| n)
    }

    pub(crate) fn next_request_id(&self) -> String {
        self.ids.next()
    }

    pub(crate) fn record_failure(&self, node: NodeId) {
        let mut pool = self.pool();
        if pool.record_failure(node) == Some(Transition::WentDown) {
            tracing::warn!(
                node = pool.name(node),
                "node DOWN after consecutive failures"
            );
        }
    }

    pub(crate) fn record_success(&self, node: NodeId) {
        let mut pool = self.pool();
        if pool.record_success(node) == Some(Transition::WentUp) {
            tracing::info!(node = pool.name(node), "node UP again");
        }
    }
}

/// Request ids: a per-process prefix and a counter, so ids from two limpet instances (or two
/// runs) do not collide in shared logs, and no id costs more than an atomic increment.
#[derive(Debug)]
struct RequestIds {
    prefix: u32,
    next: AtomicU64,
}

impl RequestIds {
    fn new() -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        // splitmix64 finaliser: spreads time and pid over all bits. Not a secret, just distinct.
        let mut z = nanos ^ (u64::from(std::process::id()) << 32);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        RequestIds {
            prefix: z as u32,
            next: AtomicU64::new(1),
        }
    }

    fn next(&self) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        format!("{:08x}{:08x}", self.prefix, n as u32)
    }
}

const NO_PIN: u32 = u32::MAX;

/// What one client connection shares between its requests (HTTP/2 streams, pipelined or
/// keep-alive HTTP/1.1 requests).
#[derive(Debug)]
pub(crate) struct ConnCtx {
    pub(crate) shared: Arc<Shared>,
    pub(crate) peer: SocketAddr,
    pub(crate) tls: bool,
    /// The peer may hand us `X-Forwarded-*` we extend.
    pub(crate) trusted: bool,
    /// The node assigned to this connection's first unpinned request, so requests sent
    /// before the client has the cookie land together.
    pin: AtomicU32,
    active: AtomicUsize,
    served: AtomicU64,
    /// Milliseconds since `started` at the last request start or end.
    last_touch_ms: AtomicU64,
    started: Instant,
}

impl ConnCtx {
    pub(crate) fn new(shared: Arc<Shared>, peer: SocketAddr, tls: bool) -> Self {
        let trusted = shared.trusted.iter().any(|n| n.contains(peer.ip()));
        ConnCtx {
            shared,
            peer,
            tls,
            trusted,
            pin: AtomicU32::new(NO_PIN),
            active: AtomicUsize::new(0),
            served: AtomicU64::new(0),
            last_touch_ms: AtomicU64::new(0),
            started: Instant::now(),
        }
    }

    /// The node this connection was assigned, if any. Read and written under the pool lock,
    /// which orders concurrent first requests: the first assigns, the others follow.
    pub(crate) fn pinned(&self) -> Option<NodeId> {
        match self.pin.load(Ordering::Acquire) {
            NO_PIN => None,
            n => Some(NodeId(n)),
        }
    }

    pub(crate) fn set_pinned(&self, node: NodeId) {
        self.pin.store(node.0, Ordering::Release);
    }

    fn touch(&self) {
        let ms = self.started.elapsed().as_millis() as u64;
        self.last_touch_ms.store(ms, Ordering::Relaxed);
    }

    /// How long no request has been in flight (None while one is).
    fn idle_for(&self) -> Option<Duration> {
        if self.active.load(Ordering::Acquire) > 0 {
            return None;
        }
        let now = self.started.elapsed().as_millis() as u64;
        let last = self.last_touch_ms.load(Ordering::Relaxed);
        Some(Duration::from_millis(now.saturating_sub(last)))
    }
}

/// Marks a request in flight on its connection from the moment it arrives until its answer
/// body is dropped.
#[derive(Debug)]
pub(crate) struct ActiveGuard(Arc<ConnCtx>);

impl ActiveGuard {
    pub(crate) fn new(ctx: &Arc<ConnCtx>) -> Self {
        ctx.active.fetch_add(1, Ordering::AcqRel);
        ctx.served.fetch_add(1, Ordering::Relaxed);
        ctx.touch();
        ActiveGuard(Arc::clone(ctx))
    }
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.touch();
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Resolves once the connection has had no request in flight for long enough: the header
/// read timeout before its first request (a connection that never sends one, even during
/// protocol detection, is a slow-loris), the keep-alive idle timeout after.
async fn idle_watch(ctx: &ConnCtx) {
    let t = ctx.shared.timeouts;
    // Re-check at least this often, so a first request arriving mid-sleep switches the limit
    // from header_read to keep_alive_idle without waiting out the longer one.
    let step = t.header_read.min(t.keep_alive_idle);
    loop {
        let limit = if ctx.served.load(Ordering::Relaxed) == 0 {
            t.header_read
        } else {
            t.keep_alive_idle
        };
        match ctx.idle_for() {
            Some(idle) if idle >= limit => return,
            Some(idle) => tokio::time::sleep((limit - idle).min(step)).await,
            None => tokio::time::sleep(step).await,
        }
    }
}

/// Why [`serve`] stopped early.
#[derive(Debug)]
pub enum ServeError {
    Config(ConfigError),
}

impl std::fmt::Display for ServeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServeError::Config(e) => write!(f, "invalid proxy configuration: {e}"),
        }
    }
}

impl std::error::Error for ServeError {}

fn builder(limits: &Limits, timeouts: &Timeouts) -> auto::Builder<TokioExecutor> {
    let mut b = auto::Builder::new(TokioExecutor::new());
    b.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(timeouts.header_read)
        .max_buf_size(limits.max_header_bytes)
        .max_headers(limits.max_headers)
        .keep_alive(true);
    b.http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX))
        .max_concurrent_streams(limits.h2_max_concurrent_streams);
    b
}

/// Serves the proxy on an already-bound listener until `shutdown` resolves, then stops
/// accepting, lets in-flight requests finish (up to `timeouts.drain`) and returns.
pub async fn serve(
    config: ProxyConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let (drain_tx, drain_rx) = watch::channel(false);
    let drain_timeout = config.timeouts.drain;
    let shared = Arc::new(Shared::new(config, drain_rx).map_err(ServeError::Config)?);
    let builder = Arc::new(builder(&shared.limits, &shared.timeouts));
    let permits = Arc::new(Semaphore::new(shared.limits.max_client_connections));
    // Every connection task holds a clone; recv() returns None once all are gone.
    let (done_tx, mut done_rx) = mpsc::channel::<()>(1);

    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            () = &mut shutdown => break,
            p = Arc::clone(&permits).acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            r = listener.accept() => match r {
                Ok(s) => s,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning on the error.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let ctx = Arc::new(ConnCtx::new(Arc::clone(&shared), peer, false));
        let builder = Arc::clone(&builder);
        let mut draining = shared.draining.clone();
        let done = done_tx.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let _done = done;
            let svc = {
                let ctx = Arc::clone(&ctx);
                service_fn(move |req| forward::handle(Arc::clone(&ctx), req))
            };
            let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), svc);
            tokio::pin!(conn);
            let result = tokio::select! {
                r = conn.as_mut() => r,
                () = idle_watch(&ctx) => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
                () = async { let _ = draining.wait_for(|d| *d).await; } => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = result {
                tracing::debug!(peer = %ctx.peer, error = %e, "client connection ended with an error");
            }
        });
    }
    drop(listener);
    let _ = drain_tx.send(true);
    drop(done_tx);
    if tokio::time::timeout(drain_timeout, done_rx.recv())
        .await
        .is_err()
    {
        tracing::warn!("drain timeout: closing remaining connections");
    }
    Ok(())
}
