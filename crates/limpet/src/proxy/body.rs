//! Body types at the two edges of the proxy. Both stream: a frame is passed on as it arrives
//! and nothing ever holds a whole body.
//!
//! - [`UpBody`] goes to a node: the client's body, or nothing for a replayed bodiless request.
//!   It reports when the client's body has been read to its end, which starts the upstream
//!   answer clock (a long upload is not an unanswered request).
//! - [`ProxyBody`] goes to the client: the node's answer, or a short answer limpet wrote. It
//!   holds the connection's "request in flight" mark until hyper drops it, so the keep-alive
//!   idle clock only runs while nothing is in flight.
//!
//! Both count body bytes for the stats page's per-node traffic: the answer's bytes go to the
//! node that sent it ([`ProxyBody::counted`]); the request's bytes are read before failover
//! has settled which node takes them, so they wait in a [`BodyTally`] that the answer binds
//! to its node (a body with bytes goes to one node only: only bodiless requests are replayed).

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use tokio::sync::watch;

use super::server::ActiveGuard;
use crate::metrics::NodeTraffic;

/// The bytes of a request body read so far, counted to its node once the node is known.
#[derive(Debug, Default)]
pub(crate) struct BodyTally {
    inner: Mutex<Tally>,
}

#[derive(Debug, Default)]
struct Tally {
    /// Bytes read before a node was bound.
    pending: u64,
    node: Option<Arc<NodeTraffic>>,
}

impl BodyTally {
    fn lock(&self) -> std::sync::MutexGuard<'_, Tally> {
        // Two integers and an Arc: consistent whatever panicked while holding the lock.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn add(&self, n: u64) {
        let mut t = self.lock();
        match &t.node {
            Some(node) => node.add_in(n),
            None => t.pending += n,
        }
    }

    /// Counts the bytes read so far, and every later one, to `node`.
    pub(crate) fn bind(&self, node: Arc<NodeTraffic>) {
        let mut t = self.lock();
        node.add_in(std::mem::take(&mut t.pending));
        t.node = Some(node);
    }
}

/// The body of a request to a node.
#[derive(Debug)]
pub(crate) struct UpBody {
    inner: Option<Incoming>,
    /// Set to true once `inner` ended; dropped (closing the channel) with the body.
    done: Option<watch::Sender<bool>>,
    tally: Arc<BodyTally>,
}

impl UpBody {
    /// The client's streamed body and a receiver that resolves once it has been read through.
    pub(crate) fn streamed(inner: Incoming) -> (Self, watch::Receiver<bool>) {
        let (tx, rx) = watch::channel(false);
        (
            UpBody {
                inner: Some(inner),
                done: Some(tx),
                tally: Arc::default(),
            },
            rx,
        )
    }

    pub(crate) fn empty() -> Self {
        UpBody {
            inner: None,
            done: None,
            tally: Arc::default(),
        }
    }

    /// The count of this body's bytes, for the answer to bind to its node.
    pub(crate) fn tally(&self) -> Arc<BodyTally> {
        Arc::clone(&self.tally)
    }

    fn finish(&mut self) {
        if let Some(tx) = self.done.take() {
            let _ = tx.send(true);
        }
    }
}

impl Body for UpBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let Some(inner) = self.inner.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = Pin::new(inner).poll_frame(cx);
        match &polled {
            Poll::Ready(None | Some(Err(_))) => self.finish(),
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    self.tally.add(data.len() as u64);
                }
            }
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}

#[derive(Debug)]
enum Inner {
    Upstream(Incoming),
    Local(Full<Bytes>),
}

/// The body of an answer to a client.
#[derive(Debug)]
pub struct ProxyBody {
    inner: Inner,
    _active: Option<ActiveGuard>,
    /// Counts the request as open to its node until the answer body is done.
    _node: Option<crate::nodes::ConnGuard>,
    /// The node's traffic, counting the answer's bytes.
    traffic: Option<Arc<NodeTraffic>>,
}

impl ProxyBody {
    pub(crate) fn upstream(body: Incoming) -> Self {
        ProxyBody {
            inner: Inner::Upstream(body),
            _active: None,
            _node: None,
            traffic: None,
        }
    }

    pub(crate) fn local(text: impl Into<Bytes>) -> Self {
        ProxyBody {
            inner: Inner::Local(Full::new(text.into())),
            _active: None,
            _node: None,
            traffic: None,
        }
    }

    pub(crate) fn with_guard(mut self, guard: ActiveGuard) -> Self {
        self._active = Some(guard);
        self
    }

    /// Counts this answer's body bytes, and the request's (`request`, from
    /// [`UpBody::tally`]), to the node that answered.
    pub(crate) fn counted(mut self, node: Arc<NodeTraffic>, request: &BodyTally) -> Self {
        request.bind(Arc::clone(&node));
        self.traffic = Some(node);
        self
    }

    /// Keeps the node's open-connection count up until the body is done.
    pub(crate) fn with_node_guard(mut self, guard: crate::nodes::ConnGuard) -> Self {
        self._node = Some(guard);
        self
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        match &mut this.inner {
            Inner::Upstream(b) => {
                let polled = Pin::new(b).poll_frame(cx);
                if let (Poll::Ready(Some(Ok(frame))), Some(t)) = (&polled, &this.traffic) {
                    if let Some(data) = frame.data_ref() {
                        t.add_out(data.len() as u64);
                    }
                }
                polled
            }
            Inner::Local(b) => match Pin::new(b).poll_frame(cx) {
                Poll::Ready(Some(Ok(f))) => Poll::Ready(Some(Ok(f))),
                Poll::Ready(Some(Err(never))) => match never {},
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Upstream(b) => b.is_end_stream(),
            Inner::Local(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Upstream(b) => b.size_hint(),
            Inner::Local(b) => b.size_hint(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_bytes_wait_for_their_node_then_count_to_it() {
        let node = Arc::new(crate::metrics::Metrics::new());
        let traffic = node.node_traffic("a");
        let tally = BodyTally::default();
        tally.add(100);
        tally.add(20);
        let now = crate::clock::now_ms();
        assert_eq!(node.traffic("a", now).bytes_in, 0, "no node yet");
        tally.bind(Arc::clone(&traffic));
        assert_eq!(node.traffic("a", now).bytes_in, 120);
        tally.add(5);
        assert_eq!(
            node.traffic("a", now).bytes_in,
            125,
            "later bytes go straight to it"
        );
    }
}
