//! Tunnels after `101 Switching Protocols` (WebSocket and any other upgrade).
//!
//! Once hyper has written the 101 to the client and read it from the node, both connections
//! are plain byte streams. Bytes are copied both ways until either side closes, the tunnel has
//! been idle (no byte either way) for the configured time, or the listener drains.
//!
//! WebSocket tunnels go through [`crate::drain::relay_websocket`], which follows frame
//! boundaries so that a drain deadline, MAINT or shutdown closes them cleanly with a close
//! frame 1001 written between two frames.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;
use tokio::time::Instant;

/// What a tunnel holds of its node: whether it is a WebSocket, the node's runtime and the
/// session's spread key (the tunnel ends when the node's state says this session must:
/// MAINT, or its moment past a drain deadline), and the guards that count it open.
#[derive(Debug)]
pub(crate) struct NodeTunnel {
    pub(crate) websocket: bool,
    pub(crate) node: Arc<crate::nodes::NodeRuntime>,
    pub(crate) spread: u64,
    /// The listener's `close_on_node_down`: end the tunnel when the node goes DOWN.
    pub(crate) close_on_down: bool,
    pub(crate) _open: crate::nodes::ConnGuard,
    pub(crate) _tunnel: crate::nodes::TunnelGuard,
}

/// Starts the tunnel in its own task; the request's task returns the 101 right away.
pub(crate) fn spawn_tunnel(
    client: OnUpgrade,
    upstream: OnUpgrade,
    idle: Duration,
    draining: watch::Receiver<bool>,
    node: NodeTunnel,
) {
    tokio::spawn(async move {
        let (client, upstream) = match tokio::join!(client, upstream) {
            (Ok(c), Ok(u)) => (c, u),
            (Err(e), _) | (_, Err(e)) => {
                tracing::debug!(error = %e, "upgrade did not complete");
                return;
            }
        };
        let NodeTunnel {
            websocket,
            node,
            spread,
            close_on_down,
            _open,
            _tunnel,
        } = node;
        let closing = async move {
            tokio::select! {
                () = crate::drain::turned_true(draining) => "limpet shutting down",
                // On DOWN too (by default): the session's HTTP requests already go to another
                // node, and a tunnel left on the old one would split the session.
                r = node.session_end(spread, close_on_down) => crate::drain::close_reason(r),
            }
        };
        if websocket {
            let end = crate::drain::relay_websocket(
                TokioIo::new(client),
                TokioIo::new(upstream),
                idle,
                closing,
            )
            .await;
            tracing::debug!(?end, "websocket tunnel ended");
            return;
        }
        let clock = Arc::new(Activity::new());
        let mut client = Tracked::new(TokioIo::new(client), Arc::clone(&clock));
        let mut upstream = Tracked::new(TokioIo::new(upstream), Arc::clone(&clock));
        tokio::select! {
            r = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {
                if let Err(e) = r {
                    tracing::debug!(error = %e, "tunnel ended with an error");
                }
            }
            () = clock.expired(idle) => tracing::debug!("tunnel idle timeout"),
            _ = closing => {}
        }
    });
}

/// When a tunnel last moved a byte, as milliseconds since it opened.
#[derive(Debug)]
struct Activity {
    start: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Activity {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }

    fn touch(&self) {
        self.last_ms
            .store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// Resolves once no byte moved for `idle`. One timer per tunnel, re-armed from the last
    /// activity instead of reset on every read.
    async fn expired(&self, idle: Duration) {
        loop {
            let now = self.start.elapsed().as_millis() as u64;
            let quiet =
                Duration::from_millis(now.saturating_sub(self.last_ms.load(Ordering::Relaxed)));
            if quiet >= idle {
                return;
            }
            tokio::time::sleep(idle - quiet).await;
        }
    }
}

/// A stream that notes every byte moved on the tunnel's clock.
struct Tracked<T> {
    io: T,
    clock: Arc<Activity>,
}

impl<T> Tracked<T> {
    fn new(io: T, clock: Arc<Activity>) -> Self {
        Tracked { io, clock }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Tracked<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.clock.touch();
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Tracked<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
