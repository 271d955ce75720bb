//! One request, from the client's head to the answer's head.
//!
//! ```text
//!  request ─► checks (target length, framing, Host rules, CONNECT) ─► 400/405/414
//!     ─► presented (cookie, home cookie, table key, spread key) ─► route (the core's one
//!        decision, via State::route) ─► node, outcome, cookies, table write ─► 503 if none
//!     ─► rewrite head (strip our cookie, hop-by-hop, X-Forwarded-*, Host, origin-form)
//!     ─► attempt on the node's connections ─┬─ answer ─► Set-Cookie / Cache-Control ─► client
//!                                           ├─ 101 ─► upgrade::tunnel
//!                                           └─ UpstreamError ─► failover? ─► route again
//!                                                              (excluding failed nodes)
//!  one access log line per request
//! ```
//!
//! Failover rules (decided from the [`UpstreamError`], see `crate::error`): a node that refused
//! or timed out the connection, or whose fresh connection died before taking the request, is
//! a passive failure and is excluded for this request; the request (with its streamed body,
//! untouched) routes again, and the answer re-pins. A stale pooled connection is retried once
//! on a fresh connection to the same node first: keep-alive races are not the node's fault.
//! Once request bytes may have reached a node (an answer that does not come in time, a reset
//! mid-request), only an idempotent request without a body is replayed elsewhere.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri, Version};
use hyper::body::{Body, Incoming};
use limpet_core::table::{KeyRef, TableKey};
use limpet_core::{
    CookieIn, CookieWrite, Excluded, HomeWrite, NodeId, Observation, Outcome, Pin, Route,
    RouteInput,
};
use tokio::time::Instant;

use super::affinity::CookieEdit;
use super::body::{AnswerEnd, NodeAnswer, ProxyBody, UpBody};
use super::headers::{self as hdr, Forwarding, X_REQUEST_ID};
use super::server::{ActiveGuard, ConnCtx, RequestId, Shared};
use super::upgrade;
use crate::clock;
use crate::error::{Cause, Stage, UpstreamError};
use crate::logging::access::{Ms, Or, PinText};
use crate::runtime::SeenIn;

/// The access log line, filled in as the request progresses. It keeps ids, not text: the
/// line is only formatted when the access log is on.
struct Access<'a> {
    id: &'a str,
    /// Kept only while the access log is on (a `Uri` clone per request otherwise spent on a
    /// line nobody writes), and boxed: the request's future holds a pointer, not the line.
    line: Option<Box<Line>>,
    node: Option<NodeId>,
    outcome: Option<Outcome>,
    /// The generation the request moved to when it routed again after a reload
    /// ([`Attempt::route_in`]): `node` is one of its ids.
    moved: Option<Arc<Shared>>,
}

/// What the access log line tells of the request itself.
struct Line {
    id: RequestId,
    method: Method,
    uri: Uri,
    /// When the request came (its reading as it arrived).
    start: Instant,
    /// The request's generation, for the node's name.
    shared: Arc<Shared>,
}

impl Access<'_> {
    /// The request's access log line, as its answer head goes out; `None` while the
    /// access log is off. The answer writes it when it ends ([`ProxyBody::logged`]).
    fn into_line(mut self, status: StatusCode) -> Option<AccessLine> {
        self.take_line(Some(status))
    }

    fn take_line(&mut self, status: Option<StatusCode>) -> Option<AccessLine> {
        // `None`: the access log was switched on while this request was on its way.
        let line = self.line.take()?;
        if !crate::logging::access::on() {
            return None;
        }
        let Line {
            id,
            method,
            uri,
            start,
            shared,
        } = *line;
        // Text, not the request's `Uri` and generation: an answer may stream for hours,
        // and those would keep the client's read buffer and the generation's node pools
        // (after a reload) for as long. The path only: query strings often carry tokens
        // that do not belong in logs; at most 256 characters, its control characters and
        // line separators escaped (the client chose them: raw, a U+0085 or U+2028 would
        // start a forged line for a reader that splits lines by Unicode's rules).
        let path = uri.path();
        let shared = self.moved.as_ref().unwrap_or(&shared);
        let node = self.node.map_or("-", |n| shared.node_name(n));
        let max = crate::logging::access::PATH_CHARS;
        // Exact for a path of printable ASCII; escapes and wider characters may grow it.
        let mut text = String::with_capacity(path.len().min(max) + node.len());
        crate::logging::access::push_escaped(&mut text, path, max);
        let path_len = text.len();
        text.push_str(node);
        Some(AccessLine {
            id,
            method,
            path_len,
            text,
            pin: PinText(
                self.outcome,
                shared.affinity.is_some() || shared.table.is_some(),
            ),
            head: status.map(|s| (s.as_u16(), start.elapsed())),
            start,
        })
    }
}

impl Drop for Access<'_> {
    /// A request whose future is dropped before its answer head still gets its line, with
    /// no status and `end=client-gone`, as HAProxy logs such a request (`CH--`, `CQ--`):
    /// its client went away first (an HTTP/2 stream reset, an HTTP/2 connection closed;
    /// HTTP/1 sees a client leave only when it writes the answer), or limpet closed the
    /// connection (a drain's deadline).
    fn drop(&mut self) {
        if let Some(line) = self.take_line(None) {
            line.emit(AnswerEnd::ClientGone, 0);
        }
    }
}

/// One request's access log line, written when its answer ends: what the request was,
/// where it went (the node it was routed to first, for a request that ended before an
/// answer) and its status as the head went out (`ms`: the time to the head), then the time
/// to the answer's end (`total_ms`), the body bytes handed to the client's connection
/// (`bytes`) and how the answer ended (`end`: see [`AnswerEnd`]), so that an answer cut
/// after its head went out is told from a whole one, as HAProxy's termination state and
/// byte count tell it.
#[derive(Debug)]
pub(crate) struct AccessLine {
    id: RequestId,
    method: Method,
    /// The path, then the node's name (`-` for none): one allocation.
    text: String,
    path_len: usize,
    pin: PinText,
    /// The answer head's status and the time to it; `None`: no head went out (`status`
    /// and `ms` written `-`).
    head: Option<(u16, Duration)>,
    /// When the request came.
    start: Instant,
}

impl AccessLine {
    /// Whether the answer goes out without a body whatever it holds (RFC 9110 6.4.1).
    pub(crate) fn bodiless(&self) -> bool {
        self.method == Method::HEAD
            || self
                .head
                .is_some_and(|(s, _)| s < 200 || s == 204 || s == 304)
    }

    pub(crate) fn emit(&self, end: AnswerEnd, bytes: u64) {
        let (path, node) = self.text.split_at(self.path_len);
        tracing::info!(
            target: "limpet::access",
            id = %self.id.as_str(),
            method = %crate::logging::access::Method(&self.method),
            path = %path,
            node = %node,
            status = %Or(self.head.map(|(s, _)| s)),
            pin = %self.pin,
            ms = %Or(self.head.map(|(_, t)| Ms(t))),
            total_ms = %Ms(self.start.elapsed()),
            bytes,
            end = %end.as_str(),
        );
    }
}

/// The hyper service of a client connection: never fails, every problem is an answer.
#[expect(
    clippy::manual_async_fn,
    reason = "an async fn would hold its arguments twice"
)]
/// `clock`: an HTTP/2 stream's answer clock, made as hyper spawned the stream
/// (`server::h2_service`), so the stall watch can cut this stream alone.
pub(crate) fn handle(
    ctx: Arc<ConnCtx>,
    req: Request<Incoming>,
    clock: Option<Arc<super::body::AnswerClock>>,
) -> impl std::future::Future<Output = Result<Response<ProxyBody>, Infallible>> {
    // A block, not an `async fn`: an `async fn` keeps each argument twice in its future
    // (the argument and the local it is moved into), and this future is every request's
    // task on HTTP/2 (moved, boxed and held for the whole request).
    async move {
        // The request's one clock reading as it comes: the connection's idle clock, what the
        // request presents and its first route, and the access log's duration.
        let arrived = Instant::now();
        let guard = ActiveGuard::new(&ctx, arrived);
        let h2 = req.version() == Version::HTTP_2;
        let unanswered = super::server::Unanswered::stream(&ctx, h2);
        // The listener's current generation, for the whole request (a reload since the
        // connection's last request is followed from this one on).
        let shared = ctx.shared();
        let id = shared.next_request_id();
        let mut log = Access {
            id: id.as_str(),
            line: crate::logging::access::on().then(|| {
                Box::new(Line {
                    id,
                    method: req.method().clone(),
                    uri: req.uri().clone(),
                    start: arrived,
                    shared: Arc::clone(&shared),
                })
            }),
            node: None,
            outcome: None,
            moved: None,
        };
        // Read before the request is handed on: hyper closes the connection after this
        // answer (HTTP/1 only). Not after CONNECT or any request with `Upgrade`, even one
        // that does not list it in `Connection`: hyper hands such a connection to the
        // upgrade after the answer instead of shutting it down. Only bodiless requests:
        // hyper may still be reading an unread body when the answer is written.
        // `client_closes` first: false for a kept-alive request, it spares the rest.
        let closes = !h2 && hdr::client_closes(&req);
        let last = closes
            && req.body().is_end_stream()
            && req.method() != Method::CONNECT
            && !req.headers().contains_key(header::UPGRADE);
        let body_unread = !h2 && !req.body().is_end_stream();
        let resp = proxy(&ctx, &shared, req, &mut log, arrived).await;
        if last && resp.body().whole_in_hand() {
            ctx.hints.set_last_answer();
        }
        // limpet's own answers only: a node's `Connection` is not passed on.
        if closes
            || (!h2
                && resp.body().is_local()
                && (body_unread || hdr::answer_closes(resp.headers())))
        {
            ctx.hints.set_closing();
        }
        // Node lifecycle: metrics hooks, through the listener's pre-resolved handles (of
        // the generation whose node ids `log.node` is in).
        let counted = log.moved.as_deref().unwrap_or(&shared);
        counted.metrics.request(log.node, resp.status().as_u16());
        if let Some(o) = log.outcome.and_then(crate::metrics::PinOutcome::of_route) {
            counted.metrics.pin(o);
        }
        let line = log.into_line(resp.status());
        unanswered.answered();
        Ok(resp.map(|b| {
            let mut b = b.with_guard(guard);
            if let Some(line) = line {
                b = b.logged(line);
            }
            if h2 {
                ctx.watch_answer(&mut b, clock);
            }
            b
        }))
    }
}

/// A short answer written by limpet itself, carrying the request id the log line has.
fn local(status: StatusCode, id: &str, msg: &str) -> Response<ProxyBody> {
    let mut resp = Response::new(ProxyBody::local(format!(
        "{} {msg} (request id {id})\n",
        status.as_u16()
    )));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    if let Ok(v) = HeaderValue::from_str(id) {
        h.insert(&X_REQUEST_ID, v);
    }
    resp
}

/// A local answer after which the connection closes (the request's framing is not trusted).
fn local_close(status: StatusCode, id: &str, msg: &str) -> Response<ProxyBody> {
    let mut resp = local(status, id, msg);
    resp.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}

fn unavailable(shared: &Shared, id: &str) -> Response<ProxyBody> {
    let mut resp = local(StatusCode::SERVICE_UNAVAILABLE, id, "no node available");
    resp.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(shared.retry_after));
    resp
}

/// What `req` offers the node to switch to, when it asks to switch protocols (a WebSocket,
/// or any protocol but `h2c`): every protocol of its `Upgrade` lines but `h2c`, as one
/// value. An offer of `h2c` alone (curl's `--http2` on an `http://` URL) is no upgrade: it
/// is dropped with the other hop-by-hop fields, as HAProxy and nginx drop it, and the GET
/// goes on as HTTP/1.1. limpet speaks HTTP/2 to clients itself (prior knowledge, ALPN), and
/// taken for an upgrade the GET would lose its replay off a failed node and its kept-alive
/// node connection, for an answer that is HTTP/1.1 all the same. Offered beside another
/// protocol, `h2c` is left out of what the node is offered: a node that switched to it would
/// open a tunnel of HTTP/2 requests limpet never sees (h2c smuggling).
fn upgrade_offer<B>(req: &Request<B>) -> Option<HeaderValue> {
    if req.version() != Version::HTTP_11
        || !req
            .headers()
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
    {
        return None;
    }
    hdr::upgrade_offer(req.headers())
}

/// Whether `headers` hold more than `max` fields, an HTTP/2 request's `Cookie` crumbs
/// counted as the one field they are joined into (browsers send one field per cookie over
/// HTTP/2, RFC 9113 8.2.3, and one line over HTTP/1.1, where hyper counts it once).
fn too_many_fields(headers: &HeaderMap, max: usize) -> bool {
    let crumbs = headers.get_all(header::COOKIE).iter().count();
    headers.len() - crumbs.saturating_sub(1) > max
}

/// RFC 9110 9.2.2. Only these may be sent twice when the first attempt's fate is unknown.
fn is_idempotent(m: &Method) -> bool {
    matches!(
        *m,
        Method::GET | Method::HEAD | Method::PUT | Method::DELETE | Method::OPTIONS | Method::TRACE
    )
}

/// The listener's table key for this request: the client address, a header, or the
/// application cookie, as the table is keyed. Borrowed from the headers, never allocated.
fn table_key<'a>(ctx: &ConnCtx, shared: &Shared, headers: &'a HeaderMap) -> Option<KeyRef<'a>> {
    let table = shared.table.as_ref()?;
    let spec = table.key_spec();
    let values = spec
        .request_header()
        .into_iter()
        .flat_map(|h| headers.get_all(h).iter())
        .map(HeaderValue::as_bytes);
    spec.request_key(ctx.peer.ip(), values)
}

/// What a request presents for routing, read once from its head: the affinity cookie and
/// home cookie, the table key, and the session's spread key.
#[derive(Clone)]
struct Presented {
    cookie: Option<CookieIn>,
    key: Option<TableKey>,
    spread: u64,
    /// The cookie's issue time, or the one a new cookie will carry (signed cookies).
    issued_ms: Option<u64>,
}

impl Presented {
    /// What the request presented as generation `to` reads it, for a request that routes
    /// again after a reload ([`Attempt::route_in`]). Pins name nodes by name: one to a node
    /// `to` still has is to its id there, one to a node the reload removed reads unknown and
    /// re-pins, as the same cookie would on a request that came after the reload. The table
    /// key carries over when the table is keyed alike; a table the reload keyed otherwise is
    /// keyed by the client's address where it can be, and by a header or cookie from the
    /// session's next request on.
    fn carried(&self, ctx: &ConnCtx, from: &Shared, to: &Shared) -> Presented {
        let pin = |p: Pin| match p {
            Pin::Node(n) => to
                .state
                .node_id(from.node_name(n))
                .map_or(Pin::Unknown, Pin::Node),
            other => other,
        };
        let key = match (&from.table, &to.table) {
            (Some(a), Some(b)) if a.key_spec() == b.key_spec() => self.key.clone(),
            _ => table_key(ctx, to, &HeaderMap::new()).map(KeyRef::to_key),
        };
        Presented {
            cookie: to.affinity.as_ref().and(self.cookie).map(|c| CookieIn {
                pin: pin(c.pin),
                home: pin(c.home),
                ..c
            }),
            key,
            spread: self.spread,
            issued_ms: self.issued_ms,
        }
    }
}

fn presented(ctx: &ConnCtx, shared: &Shared, headers: &HeaderMap, now: u64) -> Presented {
    let topology = shared.state.topology();
    let cookie = shared.affinity.as_ref().map(|a| {
        let read = a.read(topology, headers, now);
        CookieIn {
            pin: read.pin,
            issued_ms: read.issued_ms,
            refresh: read.refresh,
            home: if a.fails_back() {
                a.read_home(topology, headers, now).pin
            } else {
                Pin::None
            },
        }
    });
    let key = table_key(ctx, shared, headers);
    // A session without a (valid) cookie yet is given the issue time its cookie will carry.
    let issued_ms = cookie
        .and_then(|c| c.issued_ms)
        .or_else(|| shared.affinity.as_ref().and_then(|a| a.issue_time(now)));
    let spread = crate::runtime::spread_of(key, ctx.peer.ip(), issued_ms);
    Presented {
        cookie,
        key: key.map(KeyRef::to_key),
        spread,
        issued_ms,
    }
}

/// Routes the request through the one core decision ([`crate::runtime::State::route`]),
/// excluding the nodes that already failed for it; the route claims this connection's pin and
/// a DOWN node's trial itself. `now_ms`: the request's reading for its first route; a
/// failover reads the clock again (the failed attempt took time).
fn route(
    ctx: &ConnCtx,
    shared: &Shared,
    p: &Presented,
    exclude: &[Excluded],
    now_ms: u64,
) -> (Route, Option<crate::nodes::TrialClaim>) {
    let (table, input, trial_hold) = route_input(shared, p, exclude, now_ms);
    shared.state.route(
        table,
        input,
        Some(&ctx.pin),
        trial_hold,
        crate::nodes::TrialBy::Answer,
    )
}

/// [`route`] for the request's first route, which waits a little for the outcome of another
/// request's trial of the session's own node ([`crate::runtime::State::route_first`]).
async fn route_first(
    ctx: &ConnCtx,
    shared: &Shared,
    p: &Presented,
    now_ms: u64,
) -> (Route, Option<crate::nodes::TrialClaim>) {
    let (table, input, trial_hold) = route_input(shared, p, &[], now_ms);
    shared
        .state
        .route_first(
            table,
            input,
            Some(&ctx.pin),
            trial_hold,
            crate::nodes::TrialBy::Answer,
        )
        .await
}

/// What [`route`] and [`route_first`] ask of the routing step: the table and key, the
/// core's input, and how long a trial is claimed for.
fn route_input<'a>(
    shared: &'a Shared,
    p: &'a Presented,
    exclude: &'a [Excluded],
    now_ms: u64,
) -> (
    Option<(&'a crate::runtime::Table, limpet_core::table::KeyRef<'a>)>,
    RouteInput<'a>,
    std::time::Duration,
) {
    let input = RouteInput {
        cookie: p.cookie,
        failback: shared.affinity.as_ref().is_some_and(|a| a.fails_back()),
        conn_pin: None,
        table: None,
        spread_key: p.spread,
        balance: shared.def.balance,
        exclude,
        now_ms,
    };
    let table = shared
        .table
        .as_deref()
        .zip(p.key.as_ref().map(TableKey::as_key_ref));
    // A DOWN node's trial is decided by its answer: claimed for as long as that may take
    // (its wait in the node's queue, the connect and a TLS handshake, the answer), and ended
    // with the request if it ends first.
    let trial_hold =
        shared.timeouts.queue + shared.timeouts.connect * 2 + shared.timeouts.upstream_answer;
    (table, input, trial_hold)
}

/// A table that learns from answers learns the session the node just handed out
/// (`Set-Cookie: JSESSIONID=...`, or `Mcp-Session-Id: ...`), pinned to the node that set it;
/// later requests carrying it, on any listener naming the table, go there.
fn learn_from_answer(shared: &Shared, answer: &HeaderMap, node: NodeId) {
    let Some(table) = &shared.table else {
        return;
    };
    let spec = table.key_spec();
    let Some(name) = spec.response_header() else {
        return;
    };
    let values = answer.get_all(name).iter().map(HeaderValue::as_bytes);
    if let Some(k) = spec.response_key(values) {
        table.learn(k, node, clock::now_ms(), shared.state.topology());
    }
}

/// The parts of the request that every attempt sends: the client's fields as forwarded, and
/// limpet's own beside them ([`Forwarding`]).
#[derive(Clone)]
struct Head<'a> {
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    forwarding: Forwarding<'a>,
}

impl Head<'_> {
    /// The request hyper's client sends: limpet's fields inserted into the one map.
    fn into_request(self, body: UpBody) -> Request<UpBody> {
        let mut headers = self.headers;
        // A body of no stated length goes chunked, whatever the method: hyper's client frames
        // a GET, HEAD or CONNECT without `Content-Length` or `Transfer-Encoding` as bodiless,
        // and the client's `Transfer-Encoding` went with the hop-by-hop fields, so a chunked
        // GET's body would be dropped on the way.
        if !body.is_end_stream() && !headers.contains_key(header::CONTENT_LENGTH) {
            headers.insert(
                header::TRANSFER_ENCODING,
                HeaderValue::from_static("chunked"),
            );
        }
        let mut req = Request::new(body);
        *req.method_mut() = self.method;
        *req.uri_mut() = self.uri;
        self.forwarding.insert_into(&mut headers);
        *req.headers_mut() = headers;
        req
    }
}

#[expect(
    clippy::manual_async_fn,
    reason = "an async fn would hold its arguments twice"
)]
fn proxy<'a, 'b>(
    ctx: &'a Arc<ConnCtx>,
    shared: &'a Shared,
    mut req: Request<Incoming>,
    log: &'a mut Access<'b>,
    arrived: Instant,
) -> impl std::future::Future<Output = Response<ProxyBody>> + use<'a, 'b> {
    // A block for the reason `handle` is one: `req` is held once, not twice.
    async move {
        let id = log.id;
        // hyper prepares an upgrade for every HTTP/1.1 request with `Upgrade`, and every
        // HTTP/1 CONNECT (told here by the head, cheaper than its extension map), and keeps
        // it whatever the answer: the refusals below included.
        let upgrade_offered =
            req.version() == Version::HTTP_11 && req.headers().contains_key(header::UPGRADE);
        if upgrade_offered || (req.method() == Method::CONNECT && req.version() < Version::HTTP_2) {
            ctx.hints.set_upgrade_held();
        }

        // Checks hyper does not make. Framing problems close the connection: once two parsers
        // could disagree on where this request ends, nothing after it on the connection is safe.
        if req.method() == Method::CONNECT {
            let mut refused = local(StatusCode::METHOD_NOT_ALLOWED, id, "CONNECT is not proxied");
            // A 405 lists what is allowed (RFC 9110 15.5.6): every method but this one.
            refused.headers_mut().insert(
                header::ALLOW,
                HeaderValue::from_static("GET, HEAD, POST, PUT, DELETE, OPTIONS, PATCH, TRACE"),
            );
            return refused;
        }
        // An HTTP/2 `:path` is an origin-form target or `*` for OPTIONS (RFC 9113 8.3.1); h2
        // refuses only an empty one, and `?a=1` would reach the node as the request line
        // `GET ?a=1 HTTP/1.1`, which it cannot take. (HTTP/1's request line is held to its
        // forms by hyper's parse.)
        if req.version() == Version::HTTP_2 {
            let target = req.uri().path_and_query().map_or("", |p| p.as_str());
            let options_star = target == "*" && req.method() == Method::OPTIONS;
            if !target.starts_with('/') && !options_star {
                return local(
                    StatusCode::BAD_REQUEST,
                    id,
                    "HTTP/2 :path not in origin form",
                );
            }
        }
        let target_len = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
        if target_len > shared.limits.max_uri_bytes {
            return local(StatusCode::URI_TOO_LONG, id, "request target too long");
        }
        // hyper holds HTTP/1 to `max_headers` as it parses; HTTP/2 has only a size limit
        // (SETTINGS_MAX_HEADER_LIST_SIZE), under which a thousand small fields fit. The same
        // count for both, as HAProxy's `tune.http.maxhdr`; the stream's answer, not the
        // connection's end.
        if req.headers().len() > shared.limits.max_headers
            && too_many_fields(req.headers(), shared.limits.max_headers)
        {
            return local(
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                id,
                "too many header fields",
            );
        }
        if req.version() <= Version::HTTP_11
            && req.headers().contains_key(header::TRANSFER_ENCODING)
        {
            if req.headers().contains_key(header::CONTENT_LENGTH) {
                return local_close(
                    StatusCode::BAD_REQUEST,
                    id,
                    "both Content-Length and Transfer-Encoding",
                );
            }
            // A coding other than chunked (`gzip, chunked`): hyper decodes the chunks only,
            // and the node would take the still-encoded bytes for the body. RFC 9112 6.1
            // says 501, as nginx answers.
            if hdr::other_transfer_codings(req.headers()).is_some() {
                return local_close(
                    StatusCode::NOT_IMPLEMENTED,
                    id,
                    "transfer coding other than chunked",
                );
            }
            // After the 501: a coding limpet does not decode says more than a repeat.
            if hdr::chunked_twice(req.headers()) {
                return local_close(StatusCode::BAD_REQUEST, id, "chunked applied twice");
            }
        }

        if let Some(why) = hdr::host_problem(req.version(), req.uri(), req.headers()) {
            return local_close(StatusCode::BAD_REQUEST, id, why);
        }
        // The asterisk form names no resource: only OPTIONS may use it (RFC 9112 3.2.4, RFC
        // 9113 8.3.1), as nginx holds.
        if req.uri().path() == "*" && req.method() != Method::OPTIONS {
            return local_close(
                StatusCode::BAD_REQUEST,
                id,
                "the asterisk form is for OPTIONS only",
            );
        }

        let offer = if upgrade_offered {
            upgrade_offer(&req)
        } else {
            None
        };
        let upgrade = offer.is_some();
        let client_upgrade = offer.map(|o| (hyper::upgrade::on(&mut req), o));
        let client_version = req.version();
        // One clock reading for what the request presents, its first route and its sighting.
        // A shared table's prefetch may come between the reading and the route: it is bounded
        // by the store's timeout (50 ms by default), the table's clock never goes back, and a
        // DOWN node's trial is claimed on a reading of its own.
        let now = clock::ms_at(arrived);
        let p = presented(ctx, shared, req.headers(), now);
        // Fleet mode: a key this instance holds no pin for asks the store first (bounded).
        if let (Some(t), Some(k)) = (&shared.table, &p.key) {
            t.prefetch(k.as_key_ref()).await;
        }
        let failed: Vec<Excluded> = Vec::new();
        let (first, trial) = route_first(ctx, shared, &p, now).await;
        if trial.is_none() {
            // An HTTP listener tries the node as a request would, and is answered: so a node
            // that left requests unanswered is tried too (a connect would not tell).
            let (connect, answer) = (shared.timeouts.connect, shared.timeouts.upstream_answer);
            shared.state.try_due_trial(
                now,
                |n| shared.conns.get(n.index()).map(|c| c.addr()),
                (
                    super::upstream::answer_trial_hold(connect, answer),
                    crate::nodes::TrialBy::Answer,
                ),
                |n, _| {
                    let conns = shared.conns.get(n.index()).cloned();
                    let rt = shared.state.node_rt(n).cloned();
                    let port = conns.as_ref().map(|c| c.addr().port());
                    super::upstream::counted_as_answer(rt.zip(port), async move {
                        match conns {
                            Some(c) => c.answers(answer).await,
                            None => Err(crate::error::UpstreamError::new(
                                crate::error::Stage::Connect,
                                crate::error::Cause::Local,
                                false,
                                "no connections to the node",
                            )),
                        }
                    })
                },
            );
        }
        // No node: unless a reload came meanwhile (in which `Attempt::run` routes it once
        // more), the answer is 503.
        if first.node.is_none() && ctx.reloaded_since(shared).is_none() {
            return unavailable(shared, id);
        }
        // Counted open to its node from now until the answer body is done (drain accounting,
        // `active`): on each node the request goes to as it goes there (`Attempt::run`).
        let in_flight = (first.node, first.node.and_then(|n| shared.state.open(n)));

        // The head every attempt sends, and the request as handed to its first attempt. In a
        // block: `parts`, the head and the body are moved on or dropped here, and a binding
        // in scope across the attempts' await below would keep its slot in every request's
        // future (about 450 bytes more, copied in with the future), moved or not.
        let (replay, pending, body_done, request_bytes) = {
            let (parts, body) = req.into_parts();
            let mut headers = parts.headers;
            let cookie = match &shared.affinity {
                Some(a) => a.strip(&mut headers),
                None => CookieEdit::Keep,
            };
            if parts.version == Version::HTTP_2 {
                join_cookie_lines(&mut headers);
            }
            // A request's `Trailer` too: its trailers go no further.
            hdr::remove_hop_by_hop(&mut headers, upgrade, false);
            if let Some((_, offer)) = &client_upgrade {
                headers.insert(header::UPGRADE, offer.clone());
            }
            // HTTP/2 carries the host in :authority; HTTP/1.1 nodes need it as Host.
            let forwarding = Forwarding::new(
                &mut headers,
                parts.uri.authority(),
                &ctx.forwarded_for,
                ctx.tls,
                ctx.trusted,
                id,
                cookie,
            );
            let uri = parts
                .uri
                .path_and_query()
                .and_then(|pq| Uri::builder().path_and_query(pq.clone()).build().ok())
                .unwrap_or_else(|| Uri::from_static("/"));
            let head = Head {
                method: parts.method,
                uri,
                headers,
                forwarding,
            };
            // A copy to replay elsewhere, kept only when replaying is allowed at all.
            // A replayable request is kept whole (each attempt sends a copy, or writes it
            // from there on the request-driven path); any other is handed to its first
            // attempt.
            let replayable = is_idempotent(&head.method) && body.is_end_stream() && !upgrade;
            let (up_body, body_done) = UpBody::streamed(body, ctx, shared.timeouts.client_idle);
            // Request body bytes, counted to the node that finally answers.
            let request_bytes = up_body.tally();
            if replayable {
                (Some(head), None, body_done, request_bytes)
            } else {
                (
                    None,
                    Some(head.into_request(up_body)),
                    body_done,
                    request_bytes,
                )
            }
        };

        // Where the request goes first, for the line of a request whose client leaves
        // before its answer; the final route replaces it below.
        log.node = first.node;
        log.outcome = Some(first.outcome);
        let mut attempt = Attempt {
            ctx,
            shared,
            presented: &p,
            moved: None,
            route: first,
            trial,
            failed,
            replay,
            upgrade,
            id,
            admitted: None,
            moves: None,
            sent_failed: false,
            open: in_flight,
            seen_in: None,
        };
        let upload = body_done.watcher();
        let result = attempt.run(pending, body_done).await;
        let in_flight = attempt.open;
        let chosen = attempt.route;
        let admitted = attempt.admitted.take();
        let moves = attempt.moves.take();
        // A request that routed again after a reload ends in the running generation: its
        // node id, cookie, table and counts are of that one from here on.
        let moved = attempt.moved.take();
        let shared: &Shared = moved.as_ref().map_or(shared, |m| &m.shared);
        let p: &Presented = moved.as_ref().map_or(&p, |m| &m.presented);
        log.moved = moved.as_ref().map(|m| Arc::clone(&m.shared));
        log.outcome = Some(chosen.outcome);
        log.node = chosen.node;
        let Some(node) = chosen.node else {
            return unavailable(shared, id);
        };
        let mut resp = match result {
            Ok(resp) => resp,
            Err(e) if e.stage == Stage::ClientBody && e.is_timeout() => {
                // HAProxy's `timeout client` answer for a body that stopped coming.
                return local_close(
                    StatusCode::REQUEST_TIMEOUT,
                    id,
                    "request body not received in time",
                );
            }
            Err(e) if e.stage == Stage::ClientBody => {
                return local_close(
                    StatusCode::BAD_REQUEST,
                    id,
                    "request body could not be read",
                )
            }
            // No node took the request: nothing was sent anywhere.
            Err(e) if !e.sent && e.stage != Stage::ClientBody => {
                tracing::debug!(id, error = %e, "no node reachable");
                // No node served it: the answer is limpet's, not the last node tried.
                log.node = None;
                return unavailable(shared, id);
            }
            Err(e) if e.is_timeout() && e.stage == Stage::AnswerHead => {
                return local(
                    StatusCode::GATEWAY_TIMEOUT,
                    id,
                    "node did not answer in time",
                )
            }
            // The node went DOWN under the request, which could not be replayed further: it
            // had already failed another node once sent (or, in a race, no node was left).
            Err(e) if e.cause == Cause::NodeDown => {
                return local(
                    StatusCode::SERVICE_UNAVAILABLE,
                    id,
                    "node went DOWN before answering",
                )
            }
            Err(e) => {
                tracing::debug!(id, error = %e, "upstream error");
                return local(StatusCode::BAD_GATEWAY, id, "bad answer from node");
            }
        };

        // `Attempt::run` moved the count to each node it went to, this one last.
        debug_assert_eq!(
            in_flight.0,
            Some(node),
            "the request is counted open on its node"
        );
        if ctx.first_sighting(node, p.spread, now) {
            if let Some(rt) = shared.state.node_rt(node) {
                rt.seen(p.spread);
            }
        }
        let switching = resp.status() == StatusCode::SWITCHING_PROTOCOLS;
        if switching && !upgrade {
            return local(
                StatusCode::BAD_GATEWAY,
                id,
                "node switched protocols unasked",
            );
        }
        // RFC 9110 7.8: a server switches only to protocols the client listed.
        if let (true, Some((_, offer))) = (switching, &client_upgrade) {
            if !hdr::switched_as_offered(resp.headers(), offer) {
                return local(
                    StatusCode::BAD_GATEWAY,
                    id,
                    "node switched to a protocol not offered",
                );
            }
        }
        let mut out = Response::builder()
            .status(resp.status())
            .version(Version::HTTP_11)
            .body(ProxyBody::local(""))
            .unwrap_or_else(|_| Response::new(ProxyBody::local("")));
        let upstream_upgrade = switching.then(|| hyper::upgrade::on(&mut resp));
        let (rparts, rbody) = resp.into_parts();
        let mut rheaders = rparts.headers;
        // A node answer with both: its body was read by Transfer-Encoding, and RFC 9112 6.3
        // says a sender removes the Content-Length before forwarding it (left in, the client
        // would read the decoded body by a length it does not have).
        // Codings other than chunked (`gzip, chunked`) say how the body is encoded on this
        // hop: carried on to an HTTP/1.1 client (hyper adds `chunked` and frames the body);
        // HTTP/2 and HTTP/1.0 cannot carry them, and without them the client would take the
        // encoded bytes for the body.
        let mut codings = None;
        if rheaders.contains_key(header::TRANSFER_ENCODING) {
            rheaders.remove(header::CONTENT_LENGTH);
            codings = hdr::other_transfer_codings(&rheaders);
            if codings.is_some() && client_version != Version::HTTP_11 && !rbody.is_end_stream() {
                return local(
                    StatusCode::BAD_GATEWAY,
                    id,
                    "node answer in a transfer coding the client's protocol cannot carry",
                );
            }
        } else if matches!(rbody, NodeAnswer::Hyper(_)) {
            // (`node_h1` does this for its answers as it reads their framing.)
            if let Some(length) = hdr::repeated_content_length(&rheaders) {
                rheaders.insert(header::CONTENT_LENGTH, length);
            }
        }
        hdr::remove_hop_by_hop(&mut rheaders, switching, true);
        if let Some(c) = codings {
            rheaders.insert(header::TRANSFER_ENCODING, c);
        }
        learn_from_answer(shared, &rheaders, node);
        if let Some(a) = &shared.affinity {
            a.drop_node_cookies(&mut rheaders);
        }
        if let (CookieWrite::Set { issued_ms }, Some(a)) = (chosen.cookie, &shared.affinity) {
            let now = clock::now_ms();
            let topology = shared.state.topology();
            let value = a.encode(
                topology,
                node,
                issued_ms.or(p.issued_ms).unwrap_or(now),
                now,
            );
            let cookie = a.set_cookie(&value, ctx.tls);
            let home = match chosen.home {
                HomeWrite::Set(was) => {
                    a.set_home_cookie(&a.encode(topology, was, now, now), ctx.tls)
                }
                HomeWrite::Clear => a.clear_home_cookie(ctx.tls),
                HomeWrite::Keep => None,
            };
            // A node's answer that fits an HTTP/2 head, but not with the cookie, goes
            // without it (the client is pinned at its next request): never a 502 for a
            // cookie.
            let fits = client_version != Version::HTTP_2 || {
                let ours: usize = [&cookie, &home]
                    .into_iter()
                    .flatten()
                    .map(|v| header::SET_COOKIE.as_str().len() + v.len() + 32)
                    .sum();
                hdr::fits_h2_with(&rheaders, ours + hdr::NO_CACHE_SET_COOKIE_SIZE).is_some()
            };
            if fits {
                for v in [cookie, home].into_iter().flatten() {
                    rheaders.append(header::SET_COOKIE, v);
                }
                hdr::add_no_cache_set_cookie(&mut rheaders);
            }
        }
        if client_version == Version::HTTP_2 && hdr::too_large_for_h2(&rheaders) {
            return local(
                StatusCode::BAD_GATEWAY,
                id,
                "node answer head too large for HTTP/2",
            );
        }
        *out.headers_mut() = rheaders;
        // hyper answers in the client's version; the node's is irrelevant.
        *out.version_mut() = Version::HTTP_11;
        if let (Some((client, _)), Some(upstream), Some(rt)) =
            (client_upgrade, upstream_upgrade, shared.state.node_rt(node))
        {
            // The protocol the node switched to (its 101's `Upgrade`, RFC 9110 7.8), not the
            // client's offer, which may list several: it decides whether a close signal ends
            // the tunnel with a WebSocket close frame or a reset.
            let websocket = out
                .headers()
                .get(header::UPGRADE)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.split(',').next())
                .and_then(|p| p.trim().split('/').next())
                .is_some_and(|p| p.eq_ignore_ascii_case("websocket"));
            upgrade::spawn_tunnel(
                client,
                upstream,
                shared.timeouts.tunnel_idle,
                shared.draining.clone(),
                upgrade::NodeTunnel {
                    websocket,
                    node: Arc::clone(rt),
                    // Watched from the attempt on (see `Attempt::moves`).
                    moves: moves.unwrap_or_else(|| rt.watch(p.spread)),
                    close_on_down: ctx.close_on_down(&shared.def),
                    _open: rt.open(),
                    _tunnel: rt.tunnel(),
                    _admitted: admitted,
                    _slot: ctx.take_slot(),
                    hold: shared.table.as_ref().zip(p.key.clone()).map(|(t, k)| {
                        crate::runtime::PinHold::new(
                            Arc::clone(ctx.runtime()),
                            t,
                            k,
                            shared.state.node_name(node),
                        )
                    }),
                    write_limit: ctx.write_limit.clone(),
                    start_limit: shared.timeouts.client_idle,
                },
                &shared.tunnels,
            );
            return out;
        }
        let body = ProxyBody::upstream(rbody, shared.timeouts.answer_body_idle);
        let body = match shared.metrics.node_traffic(node) {
            Some(t) => body.counted(Arc::clone(t), request_bytes),
            None => body,
        };
        let body = body.with_admission(admitted);
        let body = match in_flight.1 {
            Some(guard) => body.with_node_guard(guard),
            None => body,
        };
        out.map(|_| body.held_until_upload_done(upload))
    }
}

/// Whether an I/O error behind a hyper error is a timeout (the node connection's write
/// deadline).
fn timed_out(err: &hyper::Error) -> bool {
    let mut source = std::error::Error::source(err);
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return io.kind() == std::io::ErrorKind::TimedOut;
        }
        source = e.source();
    }
    false
}

/// HTTP/2 may split one cookie header into many fields; an HTTP/1.1 node expects one line
/// (RFC 9113 8.2.3).
fn join_cookie_lines(headers: &mut HeaderMap) {
    if headers.get_all(header::COOKIE).iter().nth(1).is_none() {
        return;
    }
    let joined: Vec<u8> = headers
        .get_all(header::COOKIE)
        .iter()
        .map(HeaderValue::as_bytes)
        .collect::<Vec<_>>()
        .join(&b"; "[..]);
    if let Ok(v) = HeaderValue::from_bytes(&joined) {
        headers.insert(header::COOKIE, v);
    }
}

/// The generation a request moved to, and what it presented as that generation reads it
/// ([`Attempt::route_in`]).
struct Moved {
    shared: Arc<Shared>,
    presented: Presented,
    /// Nodes that failed the request in an earlier generation, by name, which this one
    /// lacks: excluded again should a later reload add them back, so that the request's
    /// attempts stay bounded by the node names it meets however many reloads come.
    gone: Vec<(Box<str>, limpet_core::RepinReason)>,
}

/// One request's attempts at nodes: the route it follows, the nodes that failed for it, and
/// the failover rules of the module docs, decided from each [`UpstreamError`].
struct Attempt<'a> {
    ctx: &'a ConnCtx,
    /// The request's generation of the listener's settings ([`ConnCtx::shared`]), until it
    /// routes again after a reload (`moved`).
    shared: &'a Shared,
    presented: &'a Presented,
    /// The running generation, when the request routed again after a reload: boxed, as a
    /// rare path's state in every request's future.
    moved: Option<Box<Moved>>,
    /// The route being tried; on return, the node that answered (or was last tried).
    route: Route,
    /// The route's node is DOWN and this request is its trial: the claim lasts while the
    /// request does, and a request that ends before its outcome was observed (its client
    /// left, its body stopped coming) ends it.
    trial: Option<crate::nodes::TrialClaim>,
    failed: Vec<Excluded>,
    /// A copy of the head to replay elsewhere, kept only when replaying is allowed at all.
    replay: Option<Head<'a>>,
    upgrade: bool,
    id: &'a str,
    /// The answering node's slot among its `max_connections` (see `NodeRuntime::admit`).
    admitted: Option<crate::nodes::Admitted>,
    /// An upgrade's watch for moves of its session off the node it is trying, taken before
    /// the request is sent: a node that takes its time to answer 101 while another request
    /// of the session fails on it and moves the session must not get the tunnel (it would
    /// split the session). On the answering node it becomes the tunnel's watch.
    moves: Option<crate::nodes::MoveWatch>,
    /// A node failed the request once it went out (see [`Attempt::fail_over`]).
    sent_failed: bool,
    /// The node the request is counted open to, moved with it when it goes to another:
    /// left on the first, a request that failed over or left a queue counted on a node it
    /// had left and not on the one it waited for, whose drain could read complete under it.
    /// (`None`: a node a reload removed, the request moved on.)
    open: (Option<NodeId>, Option<crate::nodes::ConnGuard>),
    /// This turn's node as the running generation has it, when the turn connects where a
    /// reload since put the node (the request waited across it): what the turn sees of the
    /// node is observed there ([`SeenIn`]).
    seen_in: Option<SeenIn>,
}

impl<'a> Attempt<'a> {
    /// The generation it moved to, held apart from `self` (for a turn that also changes
    /// the attempt); `None` while it routes in its own.
    fn moved_shared(&self) -> Option<Arc<Shared>> {
        self.moved.as_ref().map(|m| Arc::clone(&m.shared))
    }

    /// The generation the request routes in: its own, or the one it moved to.
    fn shared(&self) -> &Shared {
        self.moved.as_ref().map_or(self.shared, |m| &m.shared)
    }

    fn presented(&self) -> &Presented {
        self.moved.as_ref().map_or(self.presented, |m| &m.presented)
    }

    /// Routes the request in `now`, the running generation, and moves it there when a node
    /// of `now` takes it: a node the reload added is a candidate and one it removed is not
    /// (routed over its own generation, a request that waited across a blue/green reload
    /// found every node of its own gone and was answered 503 while the next request was
    /// served). Its failed nodes and the node it is counted open to are carried by name;
    /// the answer then re-pins, counts and logs in `now` ([`Attempt::run`]'s caller reads
    /// `moved`). False, and nothing changed, when no node of `now` takes it.
    fn route_in(&mut self, now: Arc<Shared>, now_ms: u64) -> bool {
        let was = self.shared();
        let by_name = |n: NodeId| now.state.node_id(was.node_name(n));
        let presented = self.presented().carried(self.ctx, was, &now);
        let mut gone = self
            .moved
            .as_ref()
            .map(|m| m.gone.clone())
            .unwrap_or_default();
        let failed = was
            .state
            .carry_excluded(&self.failed, &now.state, &mut gone);
        let (next, trial) = route(self.ctx, &now, &presented, &failed, now_ms);
        if next.node.is_none() {
            return false;
        }
        let open = self.open.0.and_then(by_name);
        self.failed = failed;
        self.open.0 = open;
        self.route = next;
        self.trial = trial;
        self.moved = Some(Box::new(Moved {
            shared: now,
            presented,
            gone,
        }));
        true
    }

    /// The node failed this request: passive health learns what the error says, and the
    /// request routes again without it (the answer re-pins).
    fn fail_over(&mut self, node: NodeId, e: &UpstreamError) -> Result<(), UpstreamError> {
        // limpet out of file descriptors: nothing was learnt about the node, so the session
        // stays pinned to it and no other node is tried (it would fail the same way, or
        // move the session for nothing); the answer is 503 and the node is charged nothing.
        if e.cause == Cause::Local {
            return Err(e.clone());
        }
        // The generation `node` is of (the request may move on below).
        let here = self.moved_shared();
        let was: &Shared = here.as_deref().unwrap_or(self.shared);
        let state = &was.state;
        // A second node that fails the request once it went out (no answer in time, or the
        // connection lost after it): the request is the likely cause (a report that
        // outlasts `upstream_answer`, a request that crashes whichever worker takes it),
        // more likely than two nodes failing at once. It is not replayed on every node in
        // turn, which would keep its client waiting once per node and charge each node a
        // failure (a few such requests took every node DOWN, chaos runs): 504 or 502 after
        // the second. A connect that fails sent nothing and still moves on.
        // Only failures charged to their node count: a kept-alive connection that the node
        // closed as the request went out (a keep-alive race) is not a failed node.
        let observed = e.observation();
        // A node that went DOWN under the request counts too: a request that hangs whichever
        // node takes it until its checks fail must not take every node DOWN in turn.
        // (A slow answer is never failed over: it is the request's, not the node's.)
        let charged = observed.is_some_and(|o| o != limpet_core::Observation::SlowAnswer);
        let sent_failure = e.failed_after_sending() && (charged || e.cause == Cause::NodeDown);
        if let Some(obs) = observed {
            SeenIn::observe(self.seen_in.as_ref(), state, node, obs);
        }
        if sent_failure && self.sent_failed {
            return Err(e.clone());
        }
        self.sent_failed |= sent_failure;
        tracing::debug!(id = self.id, node = state.node_name(node), error = %e, "failing over");
        if !self.route_without(node, e.repin_reason()) {
            // Nowhere else to go: the answer reports this node's error.
            return Err(e.clone());
        }
        // Answered elsewhere, if at all: this node's failure is counted here.
        was.metrics.attempt_failed(node);
        Ok(())
    }

    /// Routes the request again without `node` (excluded for `why`, which the answer's
    /// re-pin reports); false when no node is left, the route unchanged.
    /// After a reload, it routes in the running generation ([`Attempt::route_in`]) when a
    /// node there takes it.
    fn route_without(&mut self, node: NodeId, why: limpet_core::RepinReason) -> bool {
        self.failed.push(Excluded { node, why });
        let now_ms = clock::now_ms();
        if let Some(now) = self.ctx.reloaded_since(self.shared()) {
            if self.route_in(now, now_ms) {
                return true;
            }
        }
        let (next, trial) = route(
            self.ctx,
            self.shared(),
            self.presented(),
            &self.failed,
            now_ms,
        );
        if next.node.is_none() {
            return false;
        }
        self.route = next;
        // The last node's trial, if it was one, ends here (its outcome, if any, was observed).
        self.trial = trial;
        true
    }

    /// After a fresh connect to `node` (which may take up to `connect`, and a TLS handshake
    /// besides): whether the node left rotation for the session meanwhile, MAINT or its
    /// moment past a drain deadline (a DOWN is watched during the connect itself). Nothing
    /// of the request was sent: it routes again without the node, nothing charged, as a TCP
    /// session does. Before, it went to a node in MAINT. Not for a trial, made on a DOWN
    /// node on purpose.
    fn left_meanwhile(&self, node: NodeId) -> Option<limpet_core::RepinReason> {
        if self.route.trial {
            return None;
        }
        let rt = self.shared().state.node_rt(node)?;
        match rt
            .status()
            .session_end(clock::now_ms(), self.presented.spread, true)
        {
            limpet_core::SessionEnd::Now(why) => Some(why),
            _ => None,
        }
    }

    /// The node left rotation while the request waited in its queue or connected: the
    /// request routes again without it (the answer re-pins for `why`). Nothing was sent: no
    /// passive failure and no failed attempt are counted.
    fn leave(&mut self, node: NodeId, why: limpet_core::RepinReason) -> Result<(), UpstreamError> {
        if self.route_without(node, why) {
            return Ok(());
        }
        Err(UpstreamError::new(
            Stage::Queue,
            Cause::Io(std::io::ErrorKind::NotFound),
            false,
            "no node available",
        ))
    }

    /// Sends the request (`pending`: the request not yet handed to any connection, or
    /// handed back unsent; `None` when only `replay` is sent), failing over per the
    /// module rules. A block, not an `async fn`, for the reason `handle` is one.
    #[expect(
        clippy::manual_async_fn,
        reason = "an async fn would hold its arguments twice"
    )]
    fn run<'s>(
        &'s mut self,
        mut pending: Option<Request<UpBody>>,
        mut body_done: super::body::BodyDone,
    ) -> impl std::future::Future<Output = Result<Response<NodeAnswer>, UpstreamError>> + use<'s, 'a>
    {
        async move {
            let mut force_fresh = self.upgrade;
            // The slot a turn that goes once more to the same node on a fresh connection
            // (the keep-alive race) keeps for it: given back and asked for again, it woke the
            // next waiter and queued behind it (503 at once when the queue was full).
            let mut kept: Option<(NodeId, crate::nodes::Admitted)> = None;
            // Each turn either returns or adds a node to `failed` (or spends the one
            // fresh-connection retry), so the loop ends within 2 * nodes turns. A move to a
            // running generation carries `failed` by name, keeping aside the nodes it lacks
            // (`Moved::gone`), so it stays within twice the node names the request meets.
            loop {
                // The generation the request routes in this turn: its own, or the running
                // one it moved to on a route after a reload.
                let here = self.moved_shared();
                let shared: &Shared = here.as_deref().unwrap_or(self.shared);
                let answer_timeout = shared.timeouts.upstream_answer;
                let Some(node) = self.route.node else {
                    // No node in the request's generation for its first route, and a reload
                    // since that generation was taken (the request came as the reload
                    // swapped, or its first route waited for a trial meanwhile): routed
                    // once more, in the running generation.
                    if let Some(now) = self.ctx.reloaded_since(shared) {
                        if self.route_in(now, clock::now_ms()) {
                            continue;
                        }
                    }
                    return Err(UpstreamError::new(
                        Stage::Connect,
                        Cause::Io(std::io::ErrorKind::NotFound),
                        false,
                        "no node available",
                    ));
                };
                if self.open.0 != Some(node) {
                    self.open = (Some(node), shared.state.open(node));
                }
                if self.upgrade {
                    self.moves = shared
                        .state
                        .node_rt(node)
                        .map(|rt| rt.watch(self.presented.spread));
                }
                // From here on, a DOWN of the node ends a replayable request's wait for its
                // answer ([`wait_answer`]): one that comes while it queues or connects too.
                let watch = shared.state.node_rt(node).map(|rt| rt.watch_down());
                // A node at its max_connections: wait in its queue (no failover: a busy node is
                // not a failed one, and moving a pinned session would break its affinity).
                // A node that leaves rotation (DOWN, MAINT, past a drain) while the request
                // waits lets it go: it routes again without the node, nothing sent and nothing
                // charged.
                let admitted = match (kept.take(), shared.state.node_rt(node)) {
                    (Some((n, slot)), _) if n == node => Some(slot),
                    (_, Some(rt)) => {
                        match rt
                            .admit_watching(
                                shared.timeouts.queue,
                                self.presented.spread,
                                self.route.trial,
                                self.moves.as_ref(),
                            )
                            .await
                        {
                            Ok(a) => Some(a),
                            Err(crate::nodes::Refused::Left(why)) => {
                                self.leave(node, why)?;
                                force_fresh = self.upgrade;
                                continue;
                            }
                            Err(r) => {
                                return Err(UpstreamError::new(
                                    Stage::Queue,
                                    Cause::Timeout,
                                    false,
                                    r.as_str(),
                                ))
                            }
                        }
                    }
                    (_, None) => None,
                };
                // The node's connections where the running config has the node: a reload
                // while the request waited (in the queue above, or out an answer timeout
                // before this failover) may have moved its address, and a request that
                // came before it must not connect to the old one.
                self.seen_in = None;
                let reloaded = match self.ctx.reloaded_since(shared) {
                    None => None,
                    Some(now) => match now
                        .state
                        .node_id(shared.state.node_name(node))
                        .and_then(|id| Some((id, now.conns.get(id.index()).cloned()?)))
                    {
                        Some((id, c)) => {
                            self.seen_in = Some(SeenIn::new(Arc::clone(&now.state), id));
                            Some(c)
                        }
                        // The reload removed the node: it left, as one set to MAINT (what
                        // the reload does to it), nothing sent.
                        None => {
                            self.leave(node, limpet_core::RepinReason::NodeMaint)?;
                            force_fresh = self.upgrade;
                            continue;
                        }
                    },
                };
                let Some(conns) = reloaded.as_ref().or_else(|| shared.conns.get(node.index()))
                else {
                    return Err(UpstreamError::new(
                        Stage::Connect,
                        Cause::Io(std::io::ErrorKind::NotFound),
                        false,
                        "node without connections",
                    ));
                };
                // A bodiless replayable request to a plaintext node: driven from this task
                // (`node_h1`); everything else through hyper's client below.
                if let (Some(head), false, true) = (&self.replay, self.upgrade, conns.plain()) {
                    let err = match self
                        .direct(conns, node, head, answer_timeout, force_fresh, watch)
                        .await
                    {
                        Ok(resp) => {
                            self.admitted = admitted;
                            return Ok(resp.map(NodeAnswer::Direct));
                        }
                        Err(Direct::Stale) => {
                            // The kept-alive connection ended before any answer byte: the node
                            // closed it while idle (the keep-alive race, not the node's fault). The
                            // request is replayable: once more, on a fresh connection to the same
                            // node, so the session stays where it is pinned.
                            force_fresh = true;
                            kept = admitted.map(|slot| (node, slot));
                            continue;
                        }
                        Err(Direct::ConnectFailed(e)) => {
                            self.fail_over(node, &e)?;
                            force_fresh = false;
                            continue;
                        }
                        Err(Direct::Left(why)) => {
                            self.leave(node, why)?;
                            force_fresh = false;
                            continue;
                        }
                        Err(Direct::Failed(e)) => e,
                    };
                    if err.retry_safe(true) {
                        self.fail_over(node, &err)?;
                        force_fresh = false;
                        continue;
                    }
                    if let Some(obs) = err.observation() {
                        SeenIn::observe(self.seen_in.as_ref(), &shared.state, node, obs);
                    }
                    return Err(err);
                }
                // A trial must prove the node answers now: never on a connection kept from before.
                let pooled = if force_fresh || self.route.trial {
                    None
                } else {
                    conns.checkout()
                };
                let was_pooled = pooled.is_some();
                let mut sender = match pooled {
                    Some(s) => s,
                    // Writes to the node are bounded like its answer (`upstream_answer`); an
                    // upgrade's connection becomes a tunnel, bounded like one (`tunnel_idle`).
                    // Boxed: the connect future is the largest of this function's awaits, and
                    // inline it would grow every request's future (moved by value into hyper's
                    // connection or an HTTP/2 stream's task) by that much, for a rare path.
                    None => match connect_unless_down(
                        conns.connect(
                            if self.upgrade {
                                shared.timeouts.tunnel_idle
                            } else {
                                shared.timeouts.upstream_answer
                            },
                            self.upgrade,
                        ),
                        watch,
                    )
                    .await
                    {
                        Some(Ok(s)) => match self.left_meanwhile(node) {
                            None => s,
                            Some(why) => {
                                self.leave(node, why)?;
                                force_fresh = self.upgrade;
                                continue;
                            }
                        },
                        Some(Err(e)) => {
                            self.fail_over(node, &e)?;
                            force_fresh = self.upgrade;
                            continue;
                        }
                        None => {
                            self.leave(node, limpet_core::RepinReason::NodeDown)?;
                            force_fresh = self.upgrade;
                            continue;
                        }
                    },
                };
                let req = match pending.take() {
                    Some(r) => r,
                    None => match &self.replay {
                        Some(h) => h.clone().into_request(UpBody::empty()),
                        None => {
                            return Err(UpstreamError::new(
                                Stage::Send,
                                Cause::Io(std::io::ErrorKind::Other),
                                true,
                                "request cannot be replayed",
                            ))
                        }
                    },
                };
                let sent_at = Instant::now();
                // When the answer clock started: once the client's body was fully sent (a
                // slow upload is not a slow node), for the slow-request rule as well.
                let mut answer_from = sent_at;
                let read_before = sender.read();
                let mut send = std::pin::pin!(sender.try_send_request(req));
                let outcome = if self.replay.is_some() && !self.upgrade {
                    // Replayable, so without a body: its clock starts now, and it watches
                    // the node for a DOWN.
                    let failed = &self.failed;
                    let elsewhere = || shared.state.takes_elsewhere(node, failed);
                    wait_answer(send, watch, elsewhere, sent_at, answer_timeout).await
                } else {
                    let clock = async {
                        body_done.wait().await;
                        answer_from = Instant::now();
                        tokio::time::sleep(answer_timeout).await;
                    };
                    tokio::select! {
                        r = send.as_mut() => r.map_err(Waited::Failed),
                        () = clock => Err(Waited::Timeout),
                    }
                };
                let err = match outcome {
                    Ok(resp) => {
                        self.admitted = admitted;
                        // Not a connection whose answer had a body framed by both a
                        // Content-Length and a Transfer-Encoding (read by the latter, as RFC
                        // 9112 says): had the node framed it by the length, the rest would be
                        // read as the next request's answer, another client's. `node_h1` does
                        // not keep such a connection either. (An answer without a body,
                        // whatever its headers say, leaves nothing behind.)
                        let bodiless = hdr::answer_has_no_body(
                            resp.status(),
                            self.replay
                                .as_ref()
                                .is_some_and(|h| h.method == Method::HEAD),
                        );
                        let both_lengths = !bodiless
                            && resp.headers().contains_key(header::CONTENT_LENGTH)
                            && resp.headers().contains_key(header::TRANSFER_ENCODING);
                        if !self.upgrade && !both_lengths {
                            conns.recycle(sender);
                        }
                        answered(shared, node, sent_at, self.seen_in.as_ref());
                        return Ok(resp.map(NodeAnswer::Hyper));
                    }
                    // No answer within the answer timeout: the node is hung or overloaded,
                    // or the request is slow by itself.
                    Err(Waited::Timeout) => unanswered(shared, node, answer_from, was_pooled),
                    Err(Waited::NodeDown) => UpstreamError::node_down(),
                    Err(Waited::Failed(mut e)) => {
                        if let Some(req) = e.take_message() {
                            // Nothing of the request left: the connection was already dead.
                            pending = Some(req);
                            if was_pooled {
                                force_fresh = true;
                                kept = admitted.map(|slot| (node, slot));
                                continue;
                            }
                            let err = UpstreamError::new(
                                Stage::Send,
                                Cause::Io(std::io::ErrorKind::ConnectionReset),
                                false,
                                e.into_error(),
                            );
                            self.fail_over(node, &err)?;
                            force_fresh = self.upgrade;
                            continue;
                        }
                        let err = e.into_error();
                        if err.is_user() || err.is_body_write_aborted() {
                            // The client's body failed or went quiet: not the node's fault. The
                            // node connection is dropped with the unfinished request.
                            let cause = if super::body::is_body_idle(&err) {
                                Cause::Timeout
                            } else {
                                Cause::Io(std::io::ErrorKind::Other)
                            };
                            return Err(UpstreamError::new(Stage::ClientBody, cause, true, err));
                        }
                        let cause = if err.is_parse() || err.is_parse_status() {
                            Cause::Protocol
                        } else if timed_out(&err) {
                            // A write to the node blocked past its limit: it stopped reading.
                            Cause::Timeout
                        } else {
                            Cause::Io(std::io::ErrorKind::ConnectionReset)
                        };
                        // The node ended the connection while limpet waited for the
                        // client's body (a node's own body timeout shorter than
                        // `client_idle`: nginx's `client_body_timeout`, Apache's
                        // `mod_reqtimeout`): the client's doing, answered 408 and not the
                        // node's failure. Charged, a few clients that stall their uploads
                        // took a healthy node DOWN, and every session on it moved.
                        if matches!(cause, Cause::Io(_))
                            && body_done
                                .client_quiet_for()
                                .is_some_and(|q| q >= CLIENT_QUIET_BEFORE_NODE_GAVE_UP)
                        {
                            return Err(UpstreamError::new(
                                Stage::ClientBody,
                                Cause::Timeout,
                                true,
                                err,
                            ));
                        }
                        // A kept-alive connection that ended before any answer byte: the node
                        // closed it while idle (the keep-alive race, not the node's fault), as
                        // on the direct path above, which a TLS node never takes. A replayable
                        // request goes once more, on a fresh connection to the same node, so
                        // the session stays where it is pinned. Not one whose answer began
                        // (hyper tells a head cut short no apart from no answer at all: the
                        // count of bytes read does): the node failed it, as on the direct
                        // path. Taken for the race, a GET that broke TLS nodes went out four
                        // times, twice to each of two nodes, where the rule says two.
                        if was_pooled
                            && self.replay.is_some()
                            && !self.upgrade
                            && matches!(cause, Cause::Io(_))
                            && sender.read() == read_before
                        {
                            force_fresh = true;
                            kept = admitted.map(|slot| (node, slot));
                            continue;
                        }
                        // Request bytes may have reached the node; no answer byte was relayed.
                        // Taken for the keep-alive race (a pooled connection) only when no
                        // answer byte came: one whose answer began is the node's failure,
                        // charged and counted as the one replay after sending (before, a GET
                        // that broke each node went to every node, none charged; an upload a
                        // node crashed on, kept alive, charged it nothing).
                        UpstreamError::new(Stage::AnswerHead, cause, true, err)
                            .on_pooled(was_pooled && sender.read() == read_before)
                    }
                };
                if err.retry_safe(self.replay.is_some()) {
                    self.fail_over(node, &err)?;
                    force_fresh = self.upgrade;
                    continue;
                }
                if let Some(obs) = err.observation() {
                    SeenIn::observe(self.seen_in.as_ref(), &shared.state, node, obs);
                }
                return Err(err);
            }
        }
    }
}

/// How long the client must have left limpet waiting for its body's next bytes for a node
/// that then ends the connection unanswered to be taken as giving up on the client (its body
/// timeout), not as failing: a node's body timeout is seconds; a node that fails while a
/// client pauses this long is charged at the next request's connect.
const CLIENT_QUIET_BEFORE_NODE_GAVE_UP: Duration = Duration::from_secs(1);

/// An answer head from `node` to a request sent at `sent_at`: the node's health sees live
/// traffic served (it resets the failure streak; with checks, only one that holds a request
/// left unanswered) and the
/// latency is counted, on one clock reading.
fn answered(shared: &Shared, node: NodeId, sent_at: Instant, seen_in: Option<&SeenIn>) {
    let now = Instant::now();
    if let (Some(rt), Some(port)) = (shared.state.node_rt(node), node_port(shared, node)) {
        rt.answered(port, clock::us_at(sent_at));
    }
    SeenIn::observe_at(
        seen_in,
        &shared.state,
        node,
        Observation::TrafficOk,
        clock::ms_at(now),
    );
    shared
        .metrics
        .upstream_latency(node, now.saturating_duration_since(sent_at));
}

/// How waiting for a node's answer head ended without one.
enum Waited<E> {
    /// The connection failed (hyper's error).
    Failed(E),
    /// No answer within the answer timeout.
    Timeout,
    /// The node went DOWN meanwhile (see [`wait_answer`]).
    NodeDown,
}

/// How long a replayable request waits for its node's answer before it also waits on the
/// node for a DOWN (see [`wait_answer`]): most answers come sooner and never pay for that.
const DOWN_WATCH_AFTER: Duration = Duration::from_millis(100);

/// Waits for the answer head of a replayable request sent at `sent_at`: its answer, or
/// [`Waited::Timeout`] at `answer_timeout`, or [`Waited::NodeDown`] once its node has gone
/// DOWN since `watch` was made (when the request was routed to it; `None`: nothing to
/// watch) and another node could take the request (`elsewhere`, asked then): the request is
/// then replayed there at once rather than wait out its answer timeout on a node its checks
/// or its traffic found hung. With nowhere else to go it keeps waiting: cut, it would only
/// be answered an error, where the node may still answer it.
///
/// An answer within [`DOWN_WATCH_AFTER`] (most of them) costs what a plain answer timeout
/// does: one timer (and the watch's one atomic load). A request still waiting then waits on
/// the node too (a DOWN since the watch was made ends it at once), in a boxed future of its
/// own so that every request's future does not carry it; so a DOWN ends every waiting
/// replayable request within [`DOWN_WATCH_AFTER`].
async fn wait_answer<T, E>(
    mut answer: std::pin::Pin<&mut impl std::future::Future<Output = Result<T, E>>>,
    watch: Option<crate::nodes::DownWatch<'_>>,
    elsewhere: impl Fn() -> bool,
    sent_at: Instant,
    answer_timeout: Duration,
) -> Result<T, Waited<E>> {
    let deadline = sent_at + answer_timeout;
    let check_in = (sent_at + DOWN_WATCH_AFTER).min(deadline);
    match tokio::time::timeout_at(check_in, answer.as_mut()).await {
        Ok(r) => return r.map_err(Waited::Failed),
        Err(_) if check_in >= deadline => return Err(Waited::Timeout),
        Err(_) => {}
    }
    Box::pin(async move {
        let deadline = tokio::time::sleep_until(deadline);
        tokio::pin!(deadline);
        if let Some(watch) = watch {
            tokio::select! {
                biased;
                r = answer.as_mut() => return r.map_err(Waited::Failed),
                () = watch.wait() => {
                    if elsewhere() {
                        return Err(Waited::NodeDown);
                    }
                }
                () = deadline.as_mut() => return Err(Waited::Timeout),
            }
        }
        tokio::select! {
            biased;
            r = answer.as_mut() => r.map_err(Waited::Failed),
            () = deadline => Err(Waited::Timeout),
        }
    })
    .await
}

/// The port of `node` this listener's requests go to: a node's answers tell its requests
/// slow by themselves only on the port they were sent to ([`crate::nodes::NodeRuntime::answered`]).
fn node_port(shared: &Shared, node: NodeId) -> Option<u16> {
    shared.conns.get(node.index()).map(|c| c.addr().port())
}

/// The error of a request sent to `node` at `sent_at` that got no answer head within the
/// answer timeout: slow by itself if the node answered a younger request meanwhile, on the
/// same port.
fn unanswered(shared: &Shared, node: NodeId, sent_at: Instant, pooled: bool) -> UpstreamError {
    let alive = shared
        .state
        .node_rt(node)
        .zip(node_port(shared, node))
        .is_some_and(|(rt, port)| rt.answered_since(port, clock::us_at(sent_at)));
    if alive {
        if let Some(t) = shared.metrics.node_traffic(node) {
            t.answer_slow();
        }
    }
    UpstreamError::unanswered(pooled, alive)
}

/// How an attempt on the request-driven path ended without an answer.
enum Direct {
    /// A kept-alive connection turned out closed before any answer byte: retry fresh.
    Stale,
    /// The node left rotation for the session while the connection to it was being made
    /// (DOWN, [`connect_unless_down`]; MAINT or past a drain, [`Attempt::left_meanwhile`]):
    /// nothing sent, nothing charged; routed again without it.
    Left(limpet_core::RepinReason),
    /// No connection to the node (connect failed): fail over, as on the hyper path.
    ConnectFailed(UpstreamError),
    /// Sent, or partly: the failover rules decide.
    Failed(UpstreamError),
}

/// [`crate::nodes::unless_down`], boxed: the connect and the watch together are the largest
/// of an attempt's awaits, and inline they would grow every request's future (moved by value
/// into hyper's connection or an HTTP/2 stream's task) for a path a kept-alive connection
/// skips.
fn connect_unless_down<'a, T: 'a>(
    connect: impl std::future::Future<Output = T> + Send + 'a,
    watch: Option<crate::nodes::DownWatch<'a>>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Option<T>> + Send + 'a>> {
    Box::pin(crate::nodes::unless_down(connect, watch))
}

impl Attempt<'_> {
    /// One attempt of a bodiless replayable request on the request-driven path
    /// ([`super::node_h1`]): a kept-alive connection of the node (none for a trial or after
    /// a stale one), the head written and the answer head read within `upstream_answer`.
    async fn direct(
        &self,
        conns: &Arc<super::upstream::NodeConns>,
        node: NodeId,
        head: &Head<'_>,
        answer_timeout: Duration,
        force_fresh: bool,
        watch: Option<crate::nodes::DownWatch<'_>>,
    ) -> Result<Response<super::node_h1::NodeBody>, Direct> {
        let shared = self.shared();
        // One reading for the idle connections' expiry, the send time and the answer's
        // deadline (a connect in between takes a new one).
        let mut sent_at = Instant::now();
        // In a block: the connection is moved into the exchange, and bindings that outlived
        // the exchange's await would keep its slots (136 bytes each) in every request's future.
        let (exchange, was_pooled) = {
            let pooled = if force_fresh || self.route.trial {
                None
            } else {
                conns.checkout_h1(sent_at)
            };
            let was_pooled = pooled.is_some();
            let conn = match pooled {
                Some(c) => c,
                None => match connect_unless_down(conns.connect_h1(answer_timeout), watch).await {
                    Some(Ok(c)) => {
                        if let Some(why) = self.left_meanwhile(node) {
                            return Err(Direct::Left(why));
                        }
                        sent_at = Instant::now();
                        c
                    }
                    Some(Err(e)) => return Err(Direct::ConnectFailed(e)),
                    None => return Err(Direct::Left(limpet_core::RepinReason::NodeDown)),
                },
            };
            let exchange = conn.exchange(
                &head.method,
                &head.uri,
                &head.headers,
                &head.forwarding,
                conns,
            );
            (exchange, was_pooled)
        };
        let exchange = std::pin::pin!(exchange);
        let elsewhere = || shared.state.takes_elsewhere(node, &self.failed);
        let waited = wait_answer(exchange, watch, elsewhere, sent_at, answer_timeout).await;
        match waited {
            Ok(resp) => {
                answered(shared, node, sent_at, self.seen_in.as_ref());
                Ok(resp)
            }
            Err(Waited::Failed(e)) if was_pooled && e.closed_before_answer => Err(Direct::Stale),
            // Anything else failed after the node took the request: on a kept-alive
            // connection too, not the keep-alive race (that ends before any answer byte, and
            // is `Stale` above), but the node failing the request (a head begun and cut off,
            // a garbled one), charged and replayed once at most as on a fresh connection.
            // Taken for the race, it was charged to no node and replayed on every one.
            Err(Waited::Failed(e)) => Err(Direct::Failed(e.error)),
            // No answer within the answer timeout: the node is hung or overloaded, or the
            // request is slow by itself.
            Err(Waited::Timeout) => Err(Direct::Failed(unanswered(
                shared, node, sent_at, was_pooled,
            ))),
            Err(Waited::NodeDown) => Err(Direct::Failed(UpstreamError::node_down())),
        }
    }
}
