//! Body types at the two edges of the proxy. Both stream: a frame is passed on as it arrives
//! and nothing ever holds a whole body.
//!
//! - [`UpBody`] goes to a node: the client's body, or nothing for a replayed bodiless request.
//!   It reports when the client's body has been read to its end, which starts the upstream
//!   answer clock (a long upload is not an unanswered request).
//! - [`ProxyBody`] goes to the client: the node's answer, or a short answer limpet wrote. It
//!   holds the connection's "request in flight" mark until hyper drops it, so the keep-alive
//!   idle clock only runs while nothing is in flight.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use tokio::sync::watch;

use super::server::ActiveGuard;

/// The body of a request to a node.
#[derive(Debug)]
pub(crate) struct UpBody {
    inner: Option<Incoming>,
    /// Set to true once `inner` ended; dropped (closing the channel) with the body.
    done: Option<watch::Sender<bool>>,
}

impl UpBody {
    /// The client's streamed body and a receiver that resolves once it has been read through.
    pub(crate) fn streamed(inner: Incoming) -> (Self, watch::Receiver<bool>) {
        let (tx, rx) = watch::channel(false);
        (
            UpBody {
                inner: Some(inner),
                done: Some(tx),
            },
            rx,
        )
    }

    pub(crate) fn empty() -> Self {
        UpBody {
            inner: None,
            done: None,
        }
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
        if let Poll::Ready(None | Some(Err(_))) = polled {
            self.finish();
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
}

impl ProxyBody {
    pub(crate) fn upstream(body: Incoming) -> Self {
        ProxyBody {
            inner: Inner::Upstream(body),
            _active: None,
            _node: None,
        }
    }

    pub(crate) fn local(text: impl Into<Bytes>) -> Self {
        ProxyBody {
            inner: Inner::Local(Full::new(text.into())),
            _active: None,
            _node: None,
        }
    }

    pub(crate) fn with_guard(mut self, guard: ActiveGuard) -> Self {
        self._active = Some(guard);
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
        match &mut self.inner {
            Inner::Upstream(b) => Pin::new(b).poll_frame(cx),
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
