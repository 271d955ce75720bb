//! Tunnels after `101 Switching Protocols` (WebSocket and any other upgrade).
//!
//! Once hyper has written the 101 to the client and read it from the node, both connections
//! are plain byte streams, relayed by the one relay of [`crate::relay`] (the TCP listeners'
//! too): until either side closes, the tunnel stops making progress for `tunnel_idle` (quiet
//! both ways, or one side not reading what it is sent), or a close signal (the listener
//! drains, the node goes to MAINT or past its drain deadline). WebSocket tunnels follow frame
//! boundaries so that a close signal closes them cleanly with a close frame 1001 written
//! between two frames.

use std::sync::Arc;
use std::time::Duration;

use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::sync::watch;

use crate::relay::{relay, Framing};
use crate::tcp::{Io, Prefixed};

/// What a tunnel holds of its node: whether it is a WebSocket, the node's runtime and the
/// session's watch for moves (the tunnel ends when the node's state says this session must:
/// MAINT, DOWN, its moment past a drain deadline, or the session moved off the node), and
/// the guards that count it open.
#[derive(Debug)]
pub(crate) struct NodeTunnel {
    pub(crate) websocket: bool,
    pub(crate) node: Arc<crate::nodes::NodeRuntime>,
    pub(crate) moves: crate::nodes::MoveWatch,
    /// The listener's `close_on_node_down` (as the running config has it when the node
    /// changes): end the tunnel when the node goes DOWN.
    pub(crate) close_on_down: crate::runtime::CloseOnDown,
    pub(crate) _open: crate::nodes::ConnGuard,
    pub(crate) _tunnel: crate::nodes::TunnelGuard,
    /// The tunnel's slot among the node's `max_connections`.
    pub(crate) _admitted: Option<crate::nodes::Admitted>,
    /// The client connection's slot among its listener's `max_connections`.
    pub(crate) _slot: Option<crate::net::ConnPermit>,
    /// The table entry the tunnel keeps while it is open ([`crate::runtime::keep_pin`]).
    pub(crate) hold: Option<crate::runtime::PinHold>,
    /// The client connection's write limit (`client_idle`): it bounds the write of the 101
    /// and is lifted only once the tunnel runs, when the relay's own rule takes over.
    pub(crate) write_limit: crate::relay::WriteLimit,
    /// How long the two upgrades may take to complete (the 101 written to the client).
    pub(crate) start_limit: Duration,
}

/// Starts the tunnel in its own task; the request's task returns the 101 right away.
pub(crate) fn spawn_tunnel(
    client: OnUpgrade,
    upstream: OnUpgrade,
    idle: Duration,
    draining: watch::Receiver<bool>,
    node: NodeTunnel,
    tunnels: &tokio_util::task::TaskTracker,
) {
    tunnels.spawn(async move {
        let NodeTunnel {
            websocket,
            node,
            moves,
            close_on_down,
            _open,
            _tunnel,
            _admitted,
            _slot,
            hold,
            write_limit,
            start_limit,
        } = node;
        let closing = async move {
            tokio::select! {
                () = crate::drain::turned_true(draining) => "limpet shutting down",
                // On DOWN too (by default): the session's HTTP requests already go to another
                // node, and a tunnel left on the old one would split the session.
                r = node.session_end(moves, || close_on_down.now(), close_on_down.reloads()) => {
                    crate::drain::close_reason(r)
                }
                // The session's table entry kept while the tunnel is open; ends the tunnel
                // when the session's requests were pinned elsewhere meanwhile.
                r = crate::runtime::keep_pin(hold, || close_on_down.now()) => {
                    crate::drain::close_reason(r)
                }
            }
        };
        tokio::pin!(closing);
        // The upgrades complete once hyper has written the 101 to the client: a client that
        // does not read it holds the node connection and its slot, so this is bounded. A
        // close signal meanwhile (a shutdown, MAINT, the session moved) does not drop the
        // upgrade: hyper writes the 101 all the same, and a client then cut without a word
        // sees an abnormal end (WebSocket 1006). The tunnel starts, already closing: a
        // WebSocket client gets close 1001 with the reason, a byte stream is reset.
        let start = tokio::time::timeout(start_limit, async { tokio::join!(client, upstream) });
        tokio::pin!(start);
        let mut closed = None;
        let started = tokio::select! {
            r = &mut start => r,
            reason = &mut closing => {
                tracing::debug!(reason, "tunnel closing before it started");
                closed = Some(reason);
                start.await
            }
        };
        let (client, upstream) = match started {
            Ok((Ok(c), Ok(u))) => (c, u),
            Ok((Err(e), _) | (_, Err(e))) => {
                tracing::debug!(error = %e, "upgrade did not complete");
                return;
            }
            Err(_) => {
                tracing::debug!("upgrade did not complete in time: the 101 was not delivered");
                return;
            }
        };
        // From here the relay's per-direction rule (`tunnel_idle`) bounds writes to the
        // client.
        write_limit.lift();
        let framing = if websocket {
            Framing::WebSocket
        } else {
            Framing::Bytes
        };
        let stop = async {
            match closed {
                Some(reason) => reason,
                None => closing.await,
            }
        };
        // The streams under hyper's upgraded connections, what hyper read past the upgrade
        // put back in front of them, so that the relay reaches the sockets: a byte stream
        // that one side aborted (a node's crash, a reset), that a close signal cut (MAINT,
        // DOWN, a moved session, a shutdown) or that a timer ended is reset on both sides
        // ([`crate::tcp::Io::abort_on_close`]), as a TCP listener's session is. Through
        // `Upgraded` no socket is reachable, and each ended with a FIN, which a peer takes for
        // the whole stream: what a node sent through the tunnel (a `docker attach`'s output,
        // a file) cut by its crash or a MAINT read as complete at the client, and a client's
        // upload cut so read as complete at the node. (Concrete types, not `Box<dyn Io>`: that
        // instantiation of the relay cost TCP sessions 1.5 % more instructions per request,
        // by changing what the compiler inlined in theirs.)
        let end = match client.downcast::<TokioIo<ClientStream>>() {
            Ok(c) => match upstream.downcast::<TokioIo<NodeStream>>() {
                Ok(n) => {
                    relay(
                        Prefixed::new(c.read_buf.to_vec(), c.io.into_inner()),
                        Prefixed::new(n.read_buf.to_vec(), n.io.into_inner()),
                        idle,
                        framing,
                        stop,
                    )
                    .await
                }
                // Every node connection is opened by `super::upstream` as a `NodeStream`.
                Err(_) => {
                    tracing::debug!("tunnel not started: a node connection of another kind");
                    return;
                }
            },
            // A client stream of another kind (a test serving an in-memory pipe): relayed as
            // hyper hands it over.
            Err(client) => {
                relay(
                    TokioIo::new(client),
                    TokioIo::new(upstream),
                    idle,
                    framing,
                    stop,
                )
                .await
            }
        };
        tracing::debug!(?end, "tunnel ended");
    });
}

/// A client connection's stream as the proxy serves it ([`super::server`]).
type ClientStream = super::client_io::ClientIo<crate::relay::WriteDeadline<Box<dyn Io>>>;
/// A node connection's stream as [`super::upstream`] opens it.
type NodeStream = crate::relay::WriteDeadline<Box<dyn Io>>;
