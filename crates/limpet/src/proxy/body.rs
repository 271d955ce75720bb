//! Body types at the two edges of the proxy. Both stream: a frame is passed on as it arrives
//! and nothing ever holds a whole body.
//!
//! - [`UpBody`] goes to a node: the client's body, or nothing for a replayed bodiless request.
//!   It reports when the client's body has been read to its end, which starts the upstream
//!   answer clock (a long upload is not an unanswered request). A client that stops sending
//!   its body for `client_idle` ends it with [`BodyIdle`]: the node connection is
//!   closed, and the client gets 408, or, if the node's answer head already went out, the
//!   answer is cut there (`client-body` in the access log).
//! - [`ProxyBody`] goes to the client: the node's answer, or a short answer limpet wrote. It
//!   holds the connection's "request in flight" mark until hyper drops it, so the keep-alive
//!   idle clock only runs while nothing is in flight. A node that stops sending its answer
//!   body for `answer_body_idle` ends it with [`BodyIdle`]: the answer is cut. A cut answer
//!   (that one, or a node connection that fails mid-body) is counted for its node and logged
//!   ([`crate::metrics::NodeTraffic::answer_cut`]): its status was counted when the head
//!   went out. With the access log on, the answer carries its line
//!   ([`super::forward::AccessLine`]) and writes it when the body ends, with the bytes that
//!   went to the client and how it ended ([`AnswerEnd`]): a cut answer's line says so.
//!
//! Both count body bytes for the stats page's per-node traffic: the answer's bytes go to the
//! node that sent it ([`ProxyBody::counted`]); the request's bytes are read before failover
//! has settled which node takes them, so they wait in a [`BodyTally`] that the answer binds
//! to its node (a body with bytes goes to one node only: only bodiless requests are replayed).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use tokio::sync::watch;
use tokio::time::{Instant, Sleep};

use super::server::ActiveGuard;
use crate::metrics::{AnswerCut, NodeTraffic};

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
    /// The client's body failed (an error, or nothing for `client_idle`): the node
    /// connection was closed for the client's sake, and the answer it cuts is not the node's.
    client_failed: bool,
    /// Since when limpet has waited for the client's next body bytes, asked for them and
    /// none come (`None`: bytes came since, or limpet is not asking: the node is not taking
    /// them).
    waiting_since: Option<Instant>,
}

impl BodyTally {
    fn lock(&self) -> std::sync::MutexGuard<'_, Tally> {
        // Two integers and an Arc: consistent whatever panicked while holding the lock.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn add(&self, n: u64) {
        let mut t = self.lock();
        t.waiting_since = None;
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

    fn client_failed(&self) {
        self.lock().client_failed = true;
    }

    /// limpet asked for the client's next bytes and none have come.
    fn waiting_for_client(&self) {
        let mut t = self.lock();
        if t.waiting_since.is_none() {
            t.waiting_since = Some(Instant::now());
        }
    }

    /// Whether the client's body failed.
    fn failed(&self) -> bool {
        self.lock().client_failed
    }
}

/// Errors of the proxy's bodies: hyper's own, or [`BodyIdle`].
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A body's peer sent nothing for its idle timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BodyIdle;

impl std::fmt::Display for BodyIdle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("body idle timeout")
    }
}

impl std::error::Error for BodyIdle {}

/// Whether `e` (or what caused it) is a [`BodyIdle`].
pub(crate) fn is_body_idle(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if err.is::<BodyIdle>() {
            return true;
        }
        cur = err.source();
    }
    false
}

/// The answer's node left rotation for its session while the answer still streamed: MAINT,
/// DOWN under `close_on_node_down`, the session moved, or its moment past a drain deadline.
/// The answer is cut, as a tunnel of the session is closed: a stream (server-sent events, a
/// long poll, a download) held a drain from completing, and the session on the node, for
/// as long as the node kept it going.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NodeLeft(pub(crate) crate::nodes::EndReason);

impl std::fmt::Display for NodeLeft {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the node left rotation for the session ({})",
            self.0.as_str()
        )
    }
}

impl std::error::Error for NodeLeft {}

/// What ends a streaming answer when its node leaves rotation for its session
/// ([`NodeLeft`]).
type AnswerEndWatch = Pin<Box<dyn Future<Output = crate::nodes::EndReason> + Send>>;

/// How long an answer must have been waiting on its node, off and on, before it watches for
/// the node leaving rotation for its session ([`NodeLeft`]): a stream (server-sent events,
/// a long poll, a download). Most answers are done well before, and never pay for the watch
/// (a lock on the node's session watchers, a boxed future, a reading of the listener's
/// setting).
const WATCH_ANSWER_AFTER: Duration = Duration::from_secs(1);

/// The idle clock of a streamed body: armed lazily the first time the body has nothing to
/// give (a body that always has bytes ready never allocates a timer), pushed back by every
/// frame. An answer's also sets, [`WATCH_ANSWER_AFTER`] its first wait, what ends it when its
/// node leaves rotation for its session, on the same timer.
#[derive(Debug)]
struct IdleClock {
    limit: Duration,
    armed: Option<Pin<Box<Armed>>>,
    /// A frame passed since the clock last looked.
    moved: bool,
    /// An answer's clock (a request body's watches no node).
    answer: bool,
}

pin_project_lite::pin_project! {
    /// An armed [`IdleClock`]: one allocation, so that a body that never waits is no larger.
    /// Its timer wakes the body at its idle limit (`quiet_since`, when nothing last passed,
    /// and the limit), or first when its end watch is due (`since`, when it first waited,
    /// and [`WATCH_ANSWER_AFTER`]).
    struct Armed {
        #[pin]
        timer: Sleep,
        since: Instant,
        quiet_since: Instant,
        end: EndWatch,
    }
}

/// An answer's watch for its node leaving rotation for its session.
enum EndWatch {
    /// Not yet set (before [`WATCH_ANSWER_AFTER`]).
    NotYet,
    Watching(AnswerEndWatch),
    /// Nothing to watch (a request body, or an answer counted to no node).
    Never,
}

impl std::fmt::Debug for Armed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Armed")
            .field("timer", &self.timer)
            .field("since", &self.since)
            .field("quiet_since", &self.quiet_since)
            .field("watching", &matches!(self.end, EndWatch::Watching(_)))
            .finish()
    }
}

/// What an answer's wait for its node came to ([`IdleClock::poll_wait`]).
enum Wait {
    Pending,
    /// Nothing came for `answer_body_idle`.
    Idle,
    /// The node left rotation for the answer's session.
    Left(crate::nodes::EndReason),
}

impl IdleClock {
    fn new(limit: Duration) -> Self {
        IdleClock {
            limit,
            armed: None,
            moved: false,
            answer: false,
        }
    }

    /// An answer's clock: [`Self::poll_wait`] watches its node too.
    fn for_answer(limit: Duration) -> Self {
        IdleClock {
            answer: true,
            ..IdleClock::new(limit)
        }
    }

    fn moved(&mut self) {
        self.moved = true;
    }

    /// Called when the body is pending: whether it has been quiet for too long.
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        matches!(self.poll_wait(cx, || None), Wait::Idle)
    }

    /// Called when the body is pending: whether it has been quiet for too long, or (an
    /// answer's, once it has waited [`WATCH_ANSWER_AFTER`]) its node left rotation for its
    /// session. `watch` makes the answer's end watch, once.
    fn poll_wait(
        &mut self,
        cx: &mut Context<'_>,
        watch: impl FnOnce() -> Option<AnswerEndWatch>,
    ) -> Wait {
        let now = Instant::now();
        let (limit, answer) = (self.limit, self.answer);
        let armed = self.armed.get_or_insert_with(|| {
            Box::pin(Armed {
                timer: tokio::time::sleep_until(now + limit),
                since: now,
                quiet_since: now,
                end: if answer {
                    EndWatch::NotYet
                } else {
                    EndWatch::Never
                },
            })
        });
        let mut a = armed.as_mut().project();
        if std::mem::take(&mut self.moved) {
            *a.quiet_since = now;
        }
        let idle_at = *a.quiet_since + limit;
        if now >= idle_at {
            return Wait::Idle;
        }
        let watch_at = *a.since + WATCH_ANSWER_AFTER;
        if matches!(a.end, EndWatch::NotYet) && now >= watch_at {
            *a.end = watch().map_or(EndWatch::Never, EndWatch::Watching);
        }
        if let EndWatch::Watching(w) = a.end {
            if let Poll::Ready(why) = w.as_mut().poll(cx) {
                return Wait::Left(why);
            }
        }
        let wake_at = match a.end {
            EndWatch::NotYet => idle_at.min(watch_at),
            _ => idle_at,
        };
        if a.timer.deadline() != wake_at {
            a.timer.as_mut().reset(wake_at);
        }
        // Past already (the clock moved on since `now`): looked at again at once.
        if a.timer.poll(cx).is_ready() {
            cx.waker().wake_by_ref();
        }
        Wait::Pending
    }
}

/// When hyper last asked an HTTP/2 answer for more, and whether that ask is still waiting on
/// the node. hyper polls an HTTP/2 answer body only while the client's flow-control window
/// lets it send: a client that never opens its window, or stops reading, leaves the body
/// unpolled (so its own idle clocks never run) while the answer holds its node connection and
/// slot. The client connection's stall watch reads these clocks (see `server::stall_watch`).
///
/// It also cuts its stream alone: the stream's task (hyper spawns one per HTTP/2 stream) is
/// aborted, which drops the stream's answer and sends the client `RST_STREAM(CANCEL)`, while
/// the connection's other streams go on, as HAProxy's `timeout client` and nginx's
/// `send_timeout` apply per stream.
#[derive(Debug)]
pub(crate) struct AnswerClock {
    start: Instant,
    /// Milliseconds since `start` at the last poll.
    polled_ms: std::sync::atomic::AtomicU64,
    /// The last poll is waiting for the node (its own `answer_body_idle` bounds that).
    waiting_on_node: std::sync::atomic::AtomicBool,
    /// The stream's task and the task the answer was made in ([`Self::cut`]). A mutex, not
    /// two `OnceLock`s: each is set once per stream, and an uncontended lock costs less than
    /// a `OnceLock`'s first set (callgrind: about 160 instructions per HTTP/2 request).
    pairing: std::sync::Mutex<Pairing>,
    /// The spread key of the stream's session ([`Self::spread`]).
    spread: std::sync::atomic::AtomicU64,
}

/// The stream's task, once spawned, and the task the answer was made in: the stream's own,
/// or the pairing of clock and task went wrong ([`AnswerClock::cut`] then refuses).
#[derive(Debug, Default)]
struct Pairing {
    stream_task: Option<tokio::task::AbortHandle>,
    answered_in: Option<tokio::task::Id>,
}

impl AnswerClock {
    /// A clock whose times count from `base` (its connection's start: made for every
    /// HTTP/2 stream as hyper spawns it, it reads no clock until [`Self::start_now`]).
    pub(crate) fn new(base: Instant) -> Arc<Self> {
        Arc::new(AnswerClock {
            start: base,
            polled_ms: std::sync::atomic::AtomicU64::new(0),
            waiting_on_node: std::sync::atomic::AtomicBool::new(false),
            pairing: std::sync::Mutex::default(),
            spread: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// The spread key of the stream's session: what its answer's end watch follows, the
    /// connection's other streams may carry other sessions.
    pub(crate) fn spread(&self) -> u64 {
        self.spread.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sets [`Self::spread`].
    pub(crate) fn set_spread(&self, spread: u64) {
        self.spread
            .store(spread, std::sync::atomic::Ordering::Relaxed);
    }

    /// The answer is there, made in the current task: its stall is counted from now, not
    /// from the request.
    pub(crate) fn start_now(&self) {
        self.pairing().answered_in = tokio::task::try_id();
        self.polled(false);
    }

    fn pairing(&self) -> std::sync::MutexGuard<'_, Pairing> {
        // Two options set whole: consistent whatever panicked while holding the lock.
        self.pairing.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The task that carries this answer's stream, for [`Self::cut`].
    pub(crate) fn carried_by(&self, task: tokio::task::AbortHandle) {
        self.pairing().stream_task = Some(task);
    }

    /// Ends this answer's stream alone (see the type's doc). `false` when its task is not
    /// known for certain (none was paired with the clock, or the one paired is not the task
    /// the answer was made in), and the stream cannot be cut by itself.
    pub(crate) fn cut(&self) -> bool {
        let p = self.pairing();
        match (&p.stream_task, p.answered_in) {
            (Some(task), Some(id)) if task.id() == id => {
                task.abort();
                true
            }
            _ => false,
        }
    }

    fn polled(&self, waiting_on_node: bool) {
        use std::sync::atomic::Ordering::Relaxed;
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.polled_ms.store(ms, Relaxed);
        self.waiting_on_node.store(waiting_on_node, Relaxed);
    }

    /// How long the client side has not asked for more of this answer (`None` while the
    /// answer waits for the node).
    pub(crate) fn stalled_for(&self) -> Option<Duration> {
        use std::sync::atomic::Ordering::Relaxed;
        if self.waiting_on_node.load(Relaxed) {
            return None;
        }
        let now = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        Some(Duration::from_millis(
            now.saturating_sub(self.polled_ms.load(Relaxed)),
        ))
    }
}

/// The body of a request to a node.
#[derive(Debug)]
pub(crate) struct UpBody {
    inner: Option<Incoming>,
    /// The client connection the body comes on, told when the body is let go before its end
    /// ([`super::server::ConnCtx::note_body_cut`]); none without a body.
    conn: Option<Arc<super::server::ConnCtx>>,
    /// Set to true once `inner` ended; dropped (closing the channel) with the body.
    done: Option<watch::Sender<bool>>,
    /// The bytes read so far; none for a request without a body (there is nothing to count,
    /// and the allocation was one of every request's).
    tally: Option<Arc<BodyTally>>,
    idle: Option<IdleClock>,
}

/// Resolves once the client's body has been read through: at once for a request without one.
#[derive(Debug, Default)]
pub(crate) struct BodyDone(Option<(watch::Receiver<bool>, Arc<BodyTally>)>);

impl BodyDone {
    pub(crate) async fn wait(&mut self) {
        if let Some((rx, _)) = &mut self.0 {
            // A closed channel means the body is gone: done either way.
            let _ = rx.wait_for(|d| *d).await;
        }
    }

    /// Another watch of the same body (`None` for a request without one).
    pub(crate) fn watcher(&self) -> Option<BodyDone> {
        self.0
            .as_ref()
            .map(|(rx, tally)| BodyDone(Some((rx.clone(), Arc::clone(tally)))))
    }

    /// Whether the body's upload is over: read through, or let go (its reader gone: the
    /// node connection it went on closes with it).
    fn is_over(&self) -> bool {
        self.0
            .as_ref()
            .is_none_or(|(rx, _)| *rx.borrow() || rx.has_changed().is_err())
    }

    /// How long limpet has been waiting for the client's next body bytes, the body not read
    /// through (`None`: read through, no body, or bytes came since limpet last asked).
    pub(crate) fn client_quiet_for(&self) -> Option<Duration> {
        let (rx, tally) = self.0.as_ref()?;
        if *rx.borrow() {
            return None;
        }
        tally.lock().waiting_since.map(|t| t.elapsed())
    }
}

impl UpBody {
    /// The client's streamed body, coming on `conn`, and a receiver that resolves once it has
    /// been read through. Ended with [`BodyIdle`] once nothing came for `idle`.
    pub(crate) fn streamed(
        inner: Incoming,
        conn: &Arc<super::server::ConnCtx>,
        idle: Duration,
    ) -> (Self, BodyDone) {
        if inner.is_end_stream() {
            // No body (most requests): nothing to stream, time or wait for.
            return (UpBody::empty(), BodyDone(None));
        }
        let (tx, rx) = watch::channel(false);
        let tally: Arc<BodyTally> = Arc::default();
        (
            UpBody {
                inner: Some(inner),
                conn: Some(Arc::clone(conn)),
                done: Some(tx),
                tally: Some(Arc::clone(&tally)),
                idle: Some(IdleClock::new(idle)),
            },
            BodyDone(Some((rx, tally))),
        )
    }

    pub(crate) fn empty() -> Self {
        UpBody {
            inner: None,
            conn: None,
            done: None,
            tally: None,
            idle: None,
        }
    }

    /// The count of this body's bytes, for the answer to bind to its node; none for a
    /// request without a body.
    pub(crate) fn tally(&self) -> Option<Arc<BodyTally>> {
        self.tally.clone()
    }

    fn finish(&mut self) {
        if let Some(tx) = self.done.take() {
            let _ = tx.send(true);
        }
    }

    /// Lets the client's body go before its end: its connection is told first, so that it
    /// is never parked (hyper, its reader gone, stops reading the body and closes, and a
    /// parked socket's next bytes, the rest of the body, would be read as a request head).
    fn cut(&mut self) {
        if let Some(conn) = self.conn.take() {
            conn.note_body_cut();
        }
        self.inner = None;
    }
}

impl Drop for UpBody {
    fn drop(&mut self) {
        // A body with a length is dropped by hyper's client once its last byte went out,
        // never polled to its end: read through, it is no cut, and it is done.
        if self.inner.as_ref().is_some_and(|b| !b.is_end_stream()) {
            self.cut();
        } else {
            self.finish();
        }
    }
}

impl Body for UpBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        match Pin::new(inner).poll_frame(cx) {
            Poll::Ready(None) => {
                // Read to its end: hyper is between two messages.
                this.inner = None;
                this.finish();
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => {
                this.finish();
                if let Some(t) = &this.tally {
                    t.client_failed();
                }
                Poll::Ready(Some(Err(Box::new(e))))
            }
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    if let Some(t) = &this.tally {
                        t.add(data.len() as u64);
                    }
                } else if frame.is_trailers() {
                    // A body's trailers are its last frame: hyper's client lets the body go
                    // after them without polling it to its end. Read through.
                    this.inner = None;
                    this.finish();
                }
                if let Some(c) = &mut this.idle {
                    c.moved();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Pending => {
                if this.idle.as_mut().is_some_and(|c| c.expired(cx)) {
                    // The client went quiet mid-body: end it, which closes the node
                    // connection (hyper never reuses one whose request did not finish).
                    this.cut();
                    this.finish();
                    if let Some(t) = &this.tally {
                        t.client_failed();
                    }
                    return Poll::Ready(Some(Err(Box::new(BodyIdle))));
                }
                if let Some(t) = &this.tally {
                    t.waiting_for_client();
                }
                Poll::Pending
            }
        }
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
    Upstream(NodeAnswer, IdleClock),
    Local(Full<Bytes>),
    /// The node's answer failed mid-body: the error, held for one poll so that what came
    /// before it is written to the client first.
    Failed(Option<BoxError>),
    /// The access log is on: the answer with its line, written when it ends. Boxed, so
    /// that an answer without a line is no larger for it.
    Logged(Box<Logged>),
}

impl Inner {
    fn is_end_stream(&self) -> bool {
        match self {
            Inner::Upstream(b, _) => b.is_end_stream(),
            Inner::Local(b) => b.is_end_stream(),
            Inner::Failed(e) => e.is_none(),
            Inner::Logged(l) => l.inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Inner::Upstream(b, _) => b.size_hint(),
            Inner::Local(b) => b.size_hint(),
            Inner::Failed(_) => SizeHint::default(),
            Inner::Logged(l) => l.inner.size_hint(),
        }
    }

    fn whole_in_hand(&self) -> bool {
        match self {
            Inner::Local(_) => true,
            Inner::Upstream(NodeAnswer::Direct(b), _) => b.whole_in_hand(),
            Inner::Upstream(NodeAnswer::Hyper(b), _) => b.is_end_stream(),
            Inner::Failed(_) => false,
            Inner::Logged(l) => l.inner.whole_in_hand(),
        }
    }
}

/// How an answer's body ended, as its access log line says (`end=`). HAProxy's log has the
/// same in its termination state (`----` done, `SD--` the server aborted during the data,
/// `CD--` the client did).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AnswerEnd {
    /// All of it was handed to the client's connection.
    Done,
    /// Cut: the node sent nothing for `answer_body_idle`.
    NodeIdle,
    /// Cut: the node's connection failed mid-body.
    NodeError,
    /// Cut: the client's own upload failed, and limpet closed the node connection for it.
    ClientBody,
    /// The client's connection or stream went away before the answer ended, or limpet
    /// closed it (a drain's deadline, a stalled HTTP/2 client).
    ClientGone,
    /// Cut: the node left rotation for the session while the answer streamed ([`NodeLeft`]).
    NodeLeft,
}

impl AnswerEnd {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            AnswerEnd::Done => "done",
            AnswerEnd::NodeIdle => "node-idle",
            AnswerEnd::NodeError => "node-error",
            AnswerEnd::ClientBody => "client-body",
            AnswerEnd::ClientGone => "client-gone",
            AnswerEnd::NodeLeft => "node-left",
        }
    }

    /// The end that a body's error says.
    fn of_error(e: &(dyn std::error::Error + 'static), client_failed: bool) -> Self {
        if e.is::<NodeLeft>() {
            AnswerEnd::NodeLeft
        } else if client_failed {
            AnswerEnd::ClientBody
        } else if is_body_idle(e) {
            AnswerEnd::NodeIdle
        } else {
            AnswerEnd::NodeError
        }
    }
}

/// An answer whose access log line is written when it ends: on its last frame, on its
/// error, or when hyper drops it unfinished (the client went away).
#[derive(Debug)]
struct Logged {
    inner: Inner,
    line: super::forward::AccessLine,
    /// Body bytes handed to the client's connection.
    bytes: u64,
    end: Option<AnswerEnd>,
}

impl Logged {
    /// Notes what one poll of the answer gave.
    fn saw(&mut self, r: &Poll<Option<Result<Frame<Bytes>, BoxError>>>, cuts: &Cuts<'_>) {
        match r {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    self.bytes += data.len() as u64;
                }
            }
            Poll::Ready(Some(Err(e))) => {
                self.end
                    .get_or_insert_with(|| AnswerEnd::of_error(e.as_ref(), cuts.client_failed()));
            }
            Poll::Ready(None) => {
                self.end.get_or_insert(AnswerEnd::Done);
            }
            // A node's error is held back for one poll (`Inner::Failed`); it is the end.
            Poll::Pending => {
                if let Inner::Failed(Some(e)) = &self.inner {
                    self.end.get_or_insert_with(|| {
                        AnswerEnd::of_error(e.as_ref(), cuts.client_failed())
                    });
                }
            }
        }
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        // Dropped without an end seen: hyper writes no more of it. An answer with nothing
        // (more) to send is never polled for it (an empty body, and whatever body an answer
        // to a HEAD, a 1xx, a 204 or a 304 has: hyper sends none): done.
        let end = self
            .end
            .unwrap_or(if self.inner.is_end_stream() || self.line.bodiless() {
                AnswerEnd::Done
            } else {
                AnswerEnd::ClientGone
            });
        self.line.emit(end, self.bytes);
    }
}

/// A node's answer body: from hyper's client connection, or read from the node's socket by
/// the request's own task ([`super::node_h1`]).
#[derive(Debug)]
pub(crate) enum NodeAnswer {
    Hyper(Incoming),
    Direct(super::node_h1::NodeBody),
}

impl Body for NodeAnswer {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            NodeAnswer::Hyper(b) => match Pin::new(b).poll_frame(cx) {
                Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(Box::new(e)))),
                Poll::Ready(Some(Ok(f))) => Poll::Ready(Some(Ok(f))),
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            },
            NodeAnswer::Direct(b) => Pin::new(b).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            NodeAnswer::Hyper(b) => b.is_end_stream(),
            NodeAnswer::Direct(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            NodeAnswer::Hyper(b) => b.size_hint(),
            NodeAnswer::Direct(b) => b.size_hint(),
        }
    }
}

/// The body of an answer to a client.
#[derive(Debug)]
pub struct ProxyBody {
    inner: Inner,
    _active: Option<ActiveGuard>,
    /// Counts the request as open to its node until the answer body is done.
    _node: Option<crate::nodes::ConnGuard>,
    /// The request's slot among its node's `max_connections`, held until the body is done.
    _admitted: Option<crate::nodes::Admitted>,
    /// The node's traffic, counting the answer's bytes.
    traffic: Option<Arc<NodeTraffic>>,
    /// HTTP/2: when the client side last asked for more (read by the stall watch).
    clock: Option<Arc<AnswerClock>>,
    /// The request's body, when it had one: a cut that its client caused is not the node's.
    request: Option<Arc<BodyTally>>,
    /// The slot and the open count, with the request's upload, when it had a body
    /// ([`ProxyBody::held_until_upload_done`]).
    _upload: Option<Box<UploadHold>>,
}

/// What a request with a body holds until its upload is through as well as its answer: an
/// answer that ends first (a node that answers 401 or 413 at once and reads on) leaves the
/// node connection in use. Boxed, and only for a request with a body: `ProxyBody` is moved
/// several times per request, and a `Drop` of its own made those moves copies (callgrind,
/// `sticky`: about 500 instructions a request more in `memcpy`).
#[derive(Debug)]
struct UploadHold {
    upload: BodyDone,
    admitted: Option<crate::nodes::Admitted>,
    node: Option<crate::nodes::ConnGuard>,
}

impl Drop for UploadHold {
    fn drop(&mut self) {
        if self.upload.is_over() || (self.admitted.is_none() && self.node.is_none()) {
            return;
        }
        let upload = std::mem::take(&mut self.upload);
        let held = (self.admitted.take(), self.node.take());
        // Off the runtime (a body dropped by a test's own thread), they go now.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let mut upload = upload;
                upload.wait().await;
                drop(held);
            });
        }
    }
}

impl ProxyBody {
    /// The node's answer body, cut with [`BodyIdle`] once nothing came for `idle`.
    pub(crate) fn upstream(body: NodeAnswer, idle: Duration) -> Self {
        ProxyBody {
            inner: Inner::Upstream(body, IdleClock::for_answer(idle)),
            _active: None,
            _node: None,
            _admitted: None,
            traffic: None,
            clock: None,
            request: None,
            _upload: None,
        }
    }

    pub(crate) fn local(text: impl Into<Bytes>) -> Self {
        ProxyBody {
            inner: Inner::Local(Full::new(text.into())),
            _active: None,
            _node: None,
            _admitted: None,
            traffic: None,
            clock: None,
            request: None,
            _upload: None,
        }
    }

    pub(crate) fn with_guard(mut self, guard: ActiveGuard) -> Self {
        self._active = Some(guard);
        self
    }

    /// Counts this answer's body bytes, and the request's (`request`, from
    /// [`UpBody::tally`]), to the node that answered.
    pub(crate) fn counted(
        mut self,
        node: Arc<NodeTraffic>,
        request: Option<Arc<BodyTally>>,
    ) -> Self {
        if let Some(request) = &request {
            request.bind(Arc::clone(&node));
        }
        self.traffic = Some(node);
        self.request = request;
        self
    }

    /// Reports every poll to `clock` (HTTP/2 answers; see [`AnswerClock`]).
    /// Watched through `clock` (set in place: the body is not moved, which copied it twice
    /// per HTTP/2 answer, about 390 instructions).
    pub(crate) fn watch(&mut self, clock: Arc<AnswerClock>) {
        self.clock = Some(clock);
    }

    /// Whether the answer is limpet's own (no node's).
    pub(crate) fn is_local(&self) -> bool {
        matches!(self.inner, Inner::Local(_))
    }

    /// Whether all of the body is in memory already, so that writing it waits for nothing:
    /// a local answer, an empty one, or a node's answer whose bytes have all come
    /// ([`super::node_h1::NodeBody::whole_in_hand`]).
    pub(crate) fn whole_in_hand(&self) -> bool {
        self.inner.whole_in_hand()
    }

    /// Writes `line` to the access log when the answer ends, with how it ended.
    pub(crate) fn logged(mut self, line: super::forward::AccessLine) -> Self {
        let inner = std::mem::replace(&mut self.inner, Inner::Failed(None));
        self.inner = Inner::Logged(Box::new(Logged {
            inner,
            line,
            bytes: 0,
            end: None,
        }));
        self
    }

    /// Holds the node slot until the body is done.
    pub(crate) fn with_admission(mut self, admitted: Option<crate::nodes::Admitted>) -> Self {
        self._admitted = admitted;
        self
    }

    /// Holds the node slot and the open count (set before), should the answer end first,
    /// until `upload` (the request's body, on the same node connection) is read through or
    /// let go: HAProxy counts a stream against a server's `maxconn` until both its
    /// directions end. Before, the slot went with the answer's end, and a node at
    /// `max_connections = 1` that answered an upload at once and read on had a second
    /// connection while it did, and a drain read it as having none.
    pub(crate) fn held_until_upload_done(mut self, upload: Option<BodyDone>) -> Self {
        if let Some(upload) = upload {
            self._upload = Some(Box::new(UploadHold {
                upload,
                admitted: self._admitted.take(),
                node: self._node.take(),
            }));
        }
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
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let r = this.poll_inner(cx);
        if let Some(c) = &this.clock {
            c.polled(r.is_pending());
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl ProxyBody {
    /// The answer's next frame; a logged answer notes it for its line. An answer that has
    /// waited on its node for [`WATCH_ANSWER_AFTER`] watches for the node leaving rotation
    /// for its session ([`NodeLeft`]).
    fn poll_inner(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let ProxyBody {
            inner,
            _active,
            _node,
            _upload,
            traffic,
            clock,
            request,
            ..
        } = self;
        let mut cuts = Cuts {
            traffic,
            request: request.as_deref(),
        };
        let watch = || {
            let node = _node
                .as_ref()
                .or_else(|| _upload.as_ref().and_then(|u| u.node.as_ref()))?;
            let ctx = _active.as_ref()?.ctx();
            // HTTP/2: the stream's own session, as its clock has it; HTTP/1: the
            // connection's last request is this one.
            let spread = clock.as_ref().map(|c| c.spread());
            let end: AnswerEndWatch = Box::pin(ctx.answer_end(node.node(), spread));
            Some(end)
        };
        match inner {
            Inner::Logged(l) => {
                let r = poll_answer(&mut l.inner, &mut cuts, cx, watch);
                l.saw(&r, &cuts);
                r
            }
            inner => poll_answer(inner, &mut cuts, cx, watch),
        }
    }
}

/// What reports an answer's cut: the node's traffic (taken at the first cut) and the
/// request's body.
struct Cuts<'a> {
    traffic: &'a mut Option<Arc<NodeTraffic>>,
    request: Option<&'a BodyTally>,
}

impl Cuts<'_> {
    fn client_failed(&self) -> bool {
        self.request.is_some_and(BodyTally::failed)
    }

    /// Reports the node's answer cut, unless the client's own body failed first (limpet
    /// then closed the node connection itself, and the answer's error is that close). Once:
    /// the body ends with the error, and counts nothing after. The request's id is not kept
    /// for the cut's log line (the access log line, when on, rides in `Inner::Logged`): 16
    /// bytes more in every answer body cost about 300 instructions per request in moves
    /// (callgrind, `sticky`).
    fn report(&mut self, cut: AnswerCut, detail: &dyn std::fmt::Display) {
        let Some(t) = self.traffic.take() else { return };
        if !self.client_failed() {
            t.answer_cut(cut, detail);
        }
    }
}

fn poll_answer(
    inner: &mut Inner,
    cuts: &mut Cuts<'_>,
    cx: &mut Context<'_>,
    watch: impl FnOnce() -> Option<AnswerEndWatch>,
) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
    match inner {
        Inner::Upstream(b, idle) => match Pin::new(b).poll_frame(cx) {
            Poll::Ready(Some(Ok(mut frame))) => {
                if let Some(data) = frame.data_ref() {
                    if let Some(t) = &*cuts.traffic {
                        t.add_out(data.len() as u64);
                    }
                } else if let Some(trailers) = frame.trailers_mut() {
                    super::headers::strip_trailer_hop_fields(trailers);
                }
                idle.moved();
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                cuts.report(AnswerCut::Error, &e);
                // hyper drops what it has not written yet when a body fails, and a node
                // that resets right after its head and first bytes lost the client those
                // too (an empty reply). One pending poll lets hyper flush them; the error
                // comes on the next.
                *inner = Inner::Failed(Some(e));
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => match idle.poll_wait(cx, watch) {
                Wait::Pending => Poll::Pending,
                // The node went quiet mid-answer: cut the answer (the client sees it end
                // early, as HAProxy's `timeout server` does).
                Wait::Idle => {
                    cuts.report(AnswerCut::Idle, &"nothing came for answer_body_idle");
                    Poll::Ready(Some(Err(Box::new(BodyIdle))))
                }
                // Not the node's failure: nothing reported against it.
                Wait::Left(why) => Poll::Ready(Some(Err(Box::new(NodeLeft(why))))),
            },
        },
        Inner::Local(b) => match Pin::new(b).poll_frame(cx) {
            Poll::Ready(Some(Ok(f))) => Poll::Ready(Some(Ok(f))),
            Poll::Ready(Some(Err(never))) => match never {},
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        },
        Inner::Failed(e) => Poll::Ready(e.take().map(Err)),
        // `logged` wraps a body once; a line within a line has nothing to add.
        Inner::Logged(l) => poll_answer(&mut l.inner, cuts, cx, watch),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A clock cuts the task it was paired with only if its answer was made in that task:
    /// paired with another (should hyper ever spawn something between a stream's service
    /// call and its task), it cuts nothing, and the stall watch closes the connection instead.
    #[tokio::test]
    async fn a_clock_cuts_its_own_stream_s_task_only() {
        let stranger = AnswerClock::new(Instant::now());
        let c = Arc::clone(&stranger);
        tokio::spawn(async move { c.start_now() })
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let other = tokio::spawn(std::future::pending::<()>());
        stranger.carried_by(other.abort_handle());
        assert!(!stranger.cut(), "answered in another task");
        assert!(!other.is_finished(), "the other task was not aborted");
        other.abort();

        let clock = AnswerClock::new(Instant::now());
        let (answered, made) = tokio::sync::oneshot::channel();
        let c = Arc::clone(&clock);
        let own = tokio::spawn(async move {
            c.start_now();
            let _ = answered.send(());
            std::future::pending::<()>().await;
        });
        clock.carried_by(own.abort_handle());
        made.await.unwrap_or_else(|e| panic!("{e}"));
        assert!(clock.cut(), "its own stream's task");
        let ended = own.await;
        assert!(ended.is_err_and(|e| e.is_cancelled()), "aborted");
        assert!(!AnswerClock::new(Instant::now()).cut(), "no task paired");
    }

    #[test]
    fn an_answer_s_error_says_whose_end_it_was() {
        let reset: BoxError = Box::new(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        let idle: BoxError = Box::new(BodyIdle);
        assert_eq!(
            AnswerEnd::of_error(idle.as_ref(), false),
            AnswerEnd::NodeIdle
        );
        assert_eq!(
            AnswerEnd::of_error(reset.as_ref(), false),
            AnswerEnd::NodeError
        );
        // The client's upload failed first: limpet closed the node connection, whatever
        // the answer's error reads.
        assert_eq!(
            AnswerEnd::of_error(idle.as_ref(), true),
            AnswerEnd::ClientBody
        );
        assert_eq!(
            AnswerEnd::of_error(reset.as_ref(), true),
            AnswerEnd::ClientBody
        );
    }

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
