//! One request, from the client's head to the answer's head.
//!
//! ```text
//!  request ─► checks (target length, framing, CONNECT) ─► 400/405/414
//!     ─► choose: cookie pin ─► Pool (under lock) ─► node + pin outcome  ─► 503 if none
//!     ─► rewrite head (strip our cookie, hop-by-hop, X-Forwarded-*, Host, origin-form)
//!     ─► attempt on the node's connections ─┬─ answer ─► Set-Cookie / Cache-Control ─► client
//!                                           ├─ 101 ─► upgrade::tunnel
//!                                           └─ failed ─► failover? (see `attempt`) ─► next node
//!  one access log line per request
//! ```
//!
//! Failover rules: a node that refused or timed out the connection, or whose fresh connection
//! died before taking the request, gets `record_failure` and is excluded for this request; the
//! request (with its streamed body, untouched) goes to a fresh assignment, and the answer
//! re-pins. A stale pooled connection is retried once on a fresh connection to the same node
//! first: keep-alive races are not the node's fault. Once request bytes may have reached a
//! node, only an idempotent request without a body is replayed elsewhere.

use std::convert::Infallible;
use std::fmt;
use std::sync::Arc;

use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri, Version};
use hyper::body::{Body, Incoming};
use limpet_core::table::{KeyRef, TableKey};
use limpet_core::{Decision, NodeId, Pin, RepinReason};
use tokio::sync::watch;
use tokio::time::Instant;

use super::body::{ProxyBody, UpBody};
use super::headers::{self as hdr, X_REQUEST_ID};
use super::server::{ActiveGuard, ConnCtx, Shared};
use super::upgrade;

/// How the request's node was chosen, for the access log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// The cookie named a node that takes it.
    Sticky,
    /// No cookie: a fresh assignment (or this connection's earlier one).
    New,
    /// A cookie that could not be honoured, or a failed node: a fresh assignment.
    Repinned(RepinReason),
    /// `--sticky none`: round-robin, no cookie.
    RoundRobin,
    /// No usable cookie, but the listener's table pinned the client (e.g. through another
    /// port): routed there, and the cookie catches up.
    TableSticky,
    /// `failback = "home"`: the session's home node is UP again; it goes back there.
    Failback,
}

impl Outcome {
    /// The outcome as the metrics count it.
    fn pin_outcome(self) -> Option<crate::metrics::PinOutcome> {
        use crate::metrics::PinOutcome;
        Some(match self {
            // Failback honours the session's home pin.
            Outcome::Sticky | Outcome::TableSticky | Outcome::Failback => PinOutcome::Sticky,
            Outcome::New | Outcome::RoundRobin => PinOutcome::New,
            Outcome::Repinned(r) => PinOutcome::Repinned(r),
        })
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Sticky => f.write_str("sticky"),
            Outcome::New => f.write_str("new"),
            Outcome::Repinned(r) => write!(f, "re-pinned({})", r.as_str()),
            Outcome::RoundRobin => f.write_str("round-robin"),
            Outcome::TableSticky => f.write_str("sticky(table)"),
            Outcome::Failback => f.write_str("failback"),
        }
    }
}

/// Where a request goes and whether its answer pins.
#[derive(Debug, Clone, Copy)]
struct Choice {
    node: NodeId,
    outcome: Outcome,
    set_cookie: bool,
    /// When the cookie to set was first issued: now for a fresh pin, the token's issue time
    /// for a refreshed signed token.
    issued_ms: Option<u64>,
}

/// The access log line, filled in as the request progresses.
struct Access<'a> {
    id: &'a str,
    method: Method,
    path: String,
    node: Option<String>,
    outcome: Option<Outcome>,
    start: Instant,
}

impl Access<'_> {
    fn emit(&self, status: StatusCode) {
        let node = self.node.as_deref().unwrap_or("-");
        let pin = self
            .outcome
            .map_or_else(|| "-".to_owned(), |o| o.to_string());
        tracing::info!(
            target: "limpet::access",
            id = %self.id,
            method = %self.method,
            path = %self.path,
            node = %node,
            status = status.as_u16(),
            pin = %pin,
            ms = self.start.elapsed().as_secs_f64() * 1000.0,
        );
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The hyper service of a client connection: never fails, every problem is an answer.
pub(crate) async fn handle(
    ctx: Arc<ConnCtx>,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, Infallible> {
    let guard = ActiveGuard::new(&ctx);
    let id = ctx.shared.next_request_id();
    let mut log = Access {
        id: &id,
        method: req.method().clone(),
        // The path only: query strings often carry tokens that do not belong in logs.
        path: req.uri().path().chars().take(256).collect(),
        node: None,
        outcome: None,
        start: Instant::now(),
    };
    let resp = proxy(&ctx, req, &mut log).await;
    log.emit(resp.status());
    // Node lifecycle: metrics hooks.
    let (life, listener) = (&ctx.shared.state.lifecycle, &ctx.shared.def.name);
    life.metrics
        .request(listener, log.node.as_deref(), resp.status().as_u16());
    if let Some(o) = log.outcome.and_then(Outcome::pin_outcome) {
        life.metrics.pin(listener, o);
    }
    Ok(resp.map(|b| b.with_guard(guard)))
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

fn is_upgrade_request<B>(req: &Request<B>) -> bool {
    req.version() == Version::HTTP_11
        && req.headers().contains_key(header::UPGRADE)
        && req
            .headers()
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
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
fn table_key<'a>(ctx: &ConnCtx, headers: &'a HeaderMap) -> Option<KeyRef<'a>> {
    let table = ctx.shared.table.as_ref()?;
    let spec = table.key_spec();
    let values = spec
        .request_header()
        .into_iter()
        .flat_map(|h| headers.get_all(h).iter())
        .map(HeaderValue::as_bytes);
    spec.request_key(ctx.peer.ip(), values)
}

/// Picks the node. Precedence: the limpet cookie first (a valid pin to a node that takes it
/// wins, and refreshes the table's entry so the other listeners follow the client); then this
/// connection's earlier fresh choice; then the table's pin; then a fresh assignment by the
/// listener's balance, recorded in the table. Locks: table, then pool; never awaits.
fn choose(ctx: &ConnCtx, headers: &HeaderMap) -> Option<Choice> {
    let shared = &ctx.shared;
    let balance = shared.def.balance;
    let now = now_ms();
    let key = table_key(ctx, headers);
    // Application-cookie tables learn from answers; the request only looks up.
    let records = shared
        .table
        .as_ref()
        .is_some_and(|t| !t.key_spec().learns_from_response());
    let mut table = match (&shared.table, key) {
        (Some(t), Some(_)) => Some(t.lock()),
        _ => None,
    };
    let mut pool = shared.pool();
    // The session's place in a drain's re-pin window: its table key, else its client.
    let client_key = crate::lifecycle::session_key(ctx.peer.ip(), None);
    let spread = key.map_or(client_key, |k| spread_of(&k));

    let (read, reason) = match &shared.affinity {
        Some(affinity) => {
            let read = affinity.read(&pool, headers, now);
            let session = crate::lifecycle::session_key(ctx.peer.ip(), read.issued_ms);
            if affinity.fails_back() {
                let home = affinity.read_home(&pool, headers, now).pin;
                if let Some(node) = pool.failback(read.pin, home, now) {
                    if let (Some(t), Some(k), true) = (table.as_mut(), key, records) {
                        t.learn(k, node, now);
                    }
                    ctx.set_pinned(node);
                    return Some(Choice {
                        node,
                        outcome: Outcome::Failback,
                        set_cookie: true,
                        issued_ms: None,
                    });
                }
            }
            if let Pin::Node(node) = read.pin {
                if pool.honours_pin_keyed(node, now, session).is_ok() {
                    if let (Some(t), Some(k), true) = (table.as_mut(), key, records) {
                        t.learn(k, node, now);
                    }
                    return Some(Choice {
                        node,
                        outcome: Outcome::Sticky,
                        set_cookie: read.refresh,
                        issued_ms: read.issued_ms,
                    });
                }
            }
            let reason = match read.pin {
                Pin::None => None,
                Pin::Node(n) => pool.honours_pin_keyed(n, now, session).err(),
                Pin::Unknown => Some(RepinReason::UnknownNode),
                Pin::Invalid => Some(RepinReason::InvalidCookie),
                Pin::Expired => Some(RepinReason::ExpiredCookie),
            };
            (Some(read), reason)
        }
        None => (None, None),
    };
    let cookie = read.is_some();
    let outcome = |r: Option<RepinReason>| r.map_or(Outcome::New, Outcome::Repinned);
    // No usable cookie. If this connection already got a node for an earlier request the
    // client has not yet confirmed with the cookie, follow it: concurrent first requests agree.
    if cookie {
        if let Some(node) = ctx.pinned() {
            if pool.honours_pin_keyed(node, now, client_key).is_ok() {
                return Some(Choice {
                    node,
                    outcome: outcome(reason),
                    set_cookie: true,
                    issued_ms: None,
                });
            }
        }
    }
    let table_pin = match (table.as_mut(), key) {
        (Some(t), Some(k)) => t.lookup(k, now),
        _ => Pin::None,
    };
    let has_table = table.is_some();
    match pool.decide_with(table_pin, now, balance, spread, |n| shared.state.active(n)) {
        Decision::Sticky(node) => {
            if cookie {
                ctx.set_pinned(node);
            }
            Some(Choice {
                node,
                outcome: if cookie {
                    Outcome::TableSticky
                } else {
                    Outcome::Sticky
                },
                set_cookie: cookie,
                issued_ms: None,
            })
        }
        Decision::Fresh { node, repin } => {
            if let (Some(t), Some(k), true) = (table.as_mut(), key, records) {
                t.learn(k, node, now);
            }
            if cookie {
                ctx.set_pinned(node);
            }
            Some(Choice {
                node,
                outcome: if cookie || has_table {
                    outcome(reason.or(repin))
                } else {
                    Outcome::RoundRobin
                },
                set_cookie: cookie,
                issued_ms: None,
            })
        }
        Decision::Unavailable => None,
    }
}

/// The cookies of a request on a `failback = "home"` listener: its pin and its home pin.
#[derive(Debug, Clone, Copy)]
struct HomePins {
    pinned: Pin,
    home: Pin,
}

/// What the answer does with the home cookie.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HomeCookie {
    Keep,
    /// Moved away from this node because of the node: remember it as home.
    Set(NodeId),
    /// Back home: the home cookie has done its job.
    Clear,
}

/// The home-cookie rule. A session re-pinned away from its pinned node because of that node
/// (DOWN, MAINT, drain ended, connect failed) remembers the node as home, unless it already
/// has a home (moved twice: the first node stays home). A session that went home forgets it.
fn home_cookie(choice: &Choice, pins: HomePins) -> HomeCookie {
    match choice.outcome {
        Outcome::Failback => HomeCookie::Clear,
        Outcome::Repinned(
            RepinReason::NodeDown
            | RepinReason::NodeMaint
            | RepinReason::DrainEnded
            | RepinReason::ConnectFailed,
        ) => match (pins.pinned, pins.home) {
            (_, Pin::Node(_)) => HomeCookie::Keep,
            (Pin::Node(was), _) if was != choice.node => HomeCookie::Set(was),
            _ => HomeCookie::Keep,
        },
        _ => HomeCookie::Keep,
    }
}

/// An application-cookie table learns the session the node just set (`Set-Cookie:
/// JSESSIONID=...`), pinned to the node that set it; later requests carrying that cookie, on
/// any listener naming the table, go there.
fn learn_app_cookie(ctx: &ConnCtx, answer: &HeaderMap, node: NodeId) {
    let Some(table) = &ctx.shared.table else {
        return;
    };
    let spec = table.key_spec();
    if !spec.learns_from_response() {
        return;
    }
    let values = answer
        .get_all(header::SET_COOKIE)
        .iter()
        .map(HeaderValue::as_bytes);
    if let Some(k) = spec.response_key(values) {
        table.lock().learn(k, node, now_ms());
    }
}

/// A well-mixed hash of the table key, placing the session's re-pin in a drain window.
fn spread_of(key: &KeyRef<'_>) -> u64 {
    match key.ip_addr() {
        Some(ip) => crate::tcp::spread_key(ip),
        None => key.as_bytes().map_or(0, |b| {
            // FNV-1a then the splitmix64 finaliser: fixed seed, stable across restarts.
            let mut h: u64 = 0xcbf2_9ce4_8422_2325;
            for &x in b {
                h = (h ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3);
            }
            h ^= h >> 31;
            h.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        }),
    }
}

/// A fresh node for a request whose node failed, excluding every node that failed for it;
/// the table's entry for the request moves with it.
fn reassign(ctx: &ConnCtx, key: Option<&TableKey>, failed: &[NodeId]) -> Option<Choice> {
    let shared = &ctx.shared;
    // Application-cookie tables learn from the answer of the node that finally serves.
    let table = shared
        .table
        .as_deref()
        .filter(|t| !t.key_spec().learns_from_response());
    let node = shared.state.reassign(
        table,
        key.map(TableKey::as_key_ref),
        shared.def.balance,
        failed,
    )?;
    let sticky = shared.affinity.is_some();
    if sticky {
        ctx.set_pinned(node);
    }
    Some(Choice {
        node,
        outcome: if sticky || shared.table.is_some() {
            Outcome::Repinned(RepinReason::ConnectFailed)
        } else {
            Outcome::RoundRobin
        },
        set_cookie: sticky,
        issued_ms: None,
    })
}

/// The parts of the request that every attempt sends.
#[derive(Clone)]
struct Head {
    method: Method,
    uri: Uri,
    headers: HeaderMap,
}

impl Head {
    fn into_request(self, body: UpBody) -> Request<UpBody> {
        let mut req = Request::new(body);
        *req.method_mut() = self.method;
        *req.uri_mut() = self.uri;
        *req.headers_mut() = self.headers;
        req
    }
}

async fn proxy(
    ctx: &Arc<ConnCtx>,
    mut req: Request<Incoming>,
    log: &mut Access<'_>,
) -> Response<ProxyBody> {
    let shared = &ctx.shared;
    let id = log.id;

    // Checks hyper does not make. Framing problems close the connection: once two parsers
    // could disagree on where this request ends, nothing after it on the connection is safe.
    if req.method() == Method::CONNECT {
        return local(StatusCode::METHOD_NOT_ALLOWED, id, "CONNECT is not proxied");
    }
    let target_len = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
    if target_len > shared.limits.max_uri_bytes {
        return local(StatusCode::URI_TOO_LONG, id, "request target too long");
    }
    if req.version() <= Version::HTTP_11
        && req.headers().contains_key(header::TRANSFER_ENCODING)
        && req.headers().contains_key(header::CONTENT_LENGTH)
    {
        return local_close(
            StatusCode::BAD_REQUEST,
            id,
            "both Content-Length and Transfer-Encoding",
        );
    }

    let upgrade = is_upgrade_request(&req);
    let websocket = req
        .headers()
        .get(header::UPGRADE)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"));
    let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
    // `failback = "home"`: the pins as the request carried them, before any re-pin.
    let home_pins = shared
        .affinity
        .as_ref()
        .filter(|a| a.fails_back())
        .map(|a| {
            let (pool, now) = (shared.pool(), now_ms());
            HomePins {
                pinned: a.read(&pool, req.headers(), now).pin,
                home: a.read_home(&pool, req.headers(), now).pin,
            }
        });

    let Some(mut choice) = choose(ctx, req.headers()) else {
        return unavailable(shared, id);
    };
    // Counted open to its node from now until the answer body is done (drain accounting).
    let mut in_flight = (choice.node, shared.state.open(choice.node));
    // Owned: the failover path re-pins it after the headers have moved into the request.
    let key = table_key(ctx, req.headers()).map(|k| k.to_key());

    // The head every attempt sends.
    let (parts, body) = req.into_parts();
    let mut headers = parts.headers;
    if let Some(a) = &shared.affinity {
        a.strip(&mut headers);
    }
    if parts.version == Version::HTTP_2 {
        join_cookie_lines(&mut headers);
    }
    hdr::remove_hop_by_hop(&mut headers, upgrade);
    if !headers.contains_key(header::HOST) {
        // HTTP/2 carries the host in :authority; HTTP/1.1 nodes need it as Host.
        if let Some(v) = parts
            .uri
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        {
            headers.insert(header::HOST, v);
        }
    }
    hdr::set_forwarded(&mut headers, ctx.peer.ip(), ctx.tls, ctx.trusted);
    if let Ok(v) = HeaderValue::from_str(id) {
        headers.insert(&X_REQUEST_ID, v);
    }
    let uri = parts
        .uri
        .path_and_query()
        .and_then(|pq| Uri::builder().path_and_query(pq.clone()).build().ok())
        .unwrap_or_else(|| Uri::from_static("/"));
    let head = Head {
        method: parts.method,
        uri,
        headers,
    };
    // A copy to replay elsewhere, kept only when replaying is allowed at all.
    let replay =
        (is_idempotent(&head.method) && body.is_end_stream() && !upgrade).then(|| head.clone());
    let (up_body, body_done) = UpBody::streamed(body);

    let result = attempt(
        ctx,
        &mut choice,
        head,
        up_body,
        body_done,
        replay,
        upgrade,
        key.as_ref(),
        log,
    )
    .await;
    log.node = Some(shared.node_name(choice.node).to_owned());
    log.outcome = Some(choice.outcome);
    if in_flight.0 != choice.node {
        in_flight = (choice.node, shared.state.open(choice.node));
    }
    shared.state.lifecycle.seen(
        shared.node_name(choice.node),
        crate::lifecycle::session_key(ctx.peer.ip(), choice.issued_ms),
    );
    let mut resp = match result {
        Ok(resp) => resp,
        Err(Failure::Unavailable) => {
            log.node = None;
            return unavailable(shared, id);
        }
        Err(Failure::Timeout) => {
            return local(
                StatusCode::GATEWAY_TIMEOUT,
                id,
                "node did not answer in time",
            )
        }
        Err(Failure::BadGateway(why)) => {
            tracing::debug!(id, error = %why, "upstream error");
            return local(StatusCode::BAD_GATEWAY, id, "bad answer from node");
        }
        Err(Failure::ClientBody) => {
            return local_close(
                StatusCode::BAD_REQUEST,
                id,
                "request body could not be read",
            )
        }
    };

    let switching = resp.status() == StatusCode::SWITCHING_PROTOCOLS;
    if switching && !upgrade {
        return local(
            StatusCode::BAD_GATEWAY,
            id,
            "node switched protocols unasked",
        );
    }
    let mut out = Response::builder()
        .status(resp.status())
        .version(Version::HTTP_11)
        .body(ProxyBody::local(""))
        .unwrap_or_else(|_| Response::new(ProxyBody::local("")));
    let upstream_upgrade = switching.then(|| hyper::upgrade::on(&mut resp));
    let (rparts, rbody) = resp.into_parts();
    let mut rheaders = rparts.headers;
    hdr::remove_hop_by_hop(&mut rheaders, switching);
    learn_app_cookie(ctx, &rheaders, choice.node);
    if choice.set_cookie {
        if let Some(a) = &shared.affinity {
            let now = now_ms();
            let pool = shared.pool();
            let value = a.encode(&pool, choice.node, choice.issued_ms.unwrap_or(now), now);
            if let Some(v) = a.set_cookie(&value, ctx.tls) {
                rheaders.append(header::SET_COOKIE, v);
            }
            let home = match home_pins.map(|p| home_cookie(&choice, p)) {
                Some(HomeCookie::Set(was)) => {
                    a.set_home_cookie(&a.encode(&pool, was, now, now), ctx.tls)
                }
                Some(HomeCookie::Clear) => a.clear_home_cookie(ctx.tls),
                Some(HomeCookie::Keep) | None => None,
            };
            drop(pool);
            if let Some(v) = home {
                rheaders.append(header::SET_COOKIE, v);
            }
            hdr::add_no_cache_set_cookie(&mut rheaders);
        }
    }
    *out.headers_mut() = rheaders;
    // hyper answers in the client's version; the node's is irrelevant.
    *out.version_mut() = Version::HTTP_11;
    if let (Some(client), Some(upstream)) = (client_upgrade, upstream_upgrade) {
        let name = shared.node_name(choice.node);
        upgrade::spawn_tunnel(
            client,
            upstream,
            shared.timeouts.tunnel_idle,
            shared.draining.clone(),
            upgrade::NodeTunnel {
                websocket,
                close: shared.state.lifecycle.close_signal(name),
                _open: shared.state.open(choice.node),
                _tunnel: shared.state.lifecycle.tunnel(name),
            },
        );
        return out;
    }
    out.map(|_| ProxyBody::upstream(rbody).with_node_guard(in_flight.1))
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

/// Why no answer came back from any node.
#[derive(Debug)]
enum Failure {
    Unavailable,
    Timeout,
    BadGateway(String),
    ClientBody,
}

/// Sends the request, failing over per the module rules. On return `choice` names the node
/// that answered (or was last tried) and whether the answer must pin.
#[allow(clippy::too_many_arguments)]
async fn attempt(
    ctx: &ConnCtx,
    choice: &mut Choice,
    head: Head,
    body: UpBody,
    mut body_done: watch::Receiver<bool>,
    replay: Option<Head>,
    upgrade: bool,
    key: Option<&TableKey>,
    log: &Access<'_>,
) -> Result<Response<Incoming>, Failure> {
    let shared = &ctx.shared;
    let answer_timeout = shared.timeouts.upstream_answer;
    let mut failed: Vec<NodeId> = Vec::new();
    // The request not yet handed to any connection, or handed back unsent.
    let mut pending: Option<Request<UpBody>> = Some(head.into_request(body));
    let mut force_fresh = upgrade;
    let fail_over = |choice: &mut Choice, node: NodeId, failed: &mut Vec<NodeId>| {
        shared.record_failure(node);
        failed.push(node);
        match reassign(ctx, key, failed) {
            Some(c) => {
                *choice = c;
                Ok(())
            }
            None => Err(Failure::Unavailable),
        }
    };

    // Each turn either returns or adds a node to `failed` (or spends the one fresh-connection
    // retry), so the loop ends within 2 * nodes turns.
    loop {
        let node = choice.node;
        let Some(conns) = shared.conns.get(node.index()) else {
            return Err(Failure::BadGateway("node without connections".into()));
        };
        let pooled = if force_fresh { None } else { conns.checkout() };
        let was_pooled = pooled.is_some();
        let mut sender = match pooled {
            Some(s) => s,
            None => match conns.connect().await {
                Ok(s) => {
                    shared.record_success(node);
                    s
                }
                Err(e) => {
                    tracing::debug!(id = log.id, node = node.0, error = %e, "connect failed");
                    fail_over(choice, node, &mut failed)?;
                    force_fresh = upgrade;
                    continue;
                }
            },
        };
        let req = match pending.take() {
            Some(r) => r,
            None => match &replay {
                Some(h) => h.clone().into_request(UpBody::empty()),
                None => return Err(Failure::BadGateway("request cannot be replayed".into())),
            },
        };
        let sent_at = Instant::now();
        let send = sender.try_send_request(req);
        // The answer clock starts once the client's body is fully sent: a slow upload is not a
        // slow node.
        let clock = async {
            let _ = body_done.wait_for(|d| *d).await;
            tokio::time::sleep(answer_timeout).await;
        };
        let outcome = tokio::select! {
            r = send => r,
            () = clock => return Err(Failure::Timeout),
        };
        match outcome {
            Ok(resp) => {
                if !upgrade {
                    conns.recycle(sender);
                }
                shared.state.lifecycle.metrics.upstream_latency(
                    &shared.def.name,
                    shared.node_name(node),
                    sent_at.elapsed(),
                );
                return Ok(resp);
            }
            Err(mut e) => {
                if let Some(req) = e.take_message() {
                    // Nothing of the request left: the connection was already dead.
                    pending = Some(req);
                    if was_pooled {
                        force_fresh = true;
                    } else {
                        fail_over(choice, node, &mut failed)?;
                        force_fresh = upgrade;
                    }
                    continue;
                }
                let err = e.into_error();
                if err.is_user() || err.is_body_write_aborted() {
                    return Err(Failure::ClientBody);
                }
                if err.is_parse() || err.is_parse_status() {
                    return Err(Failure::BadGateway(err.to_string()));
                }
                // Request bytes may have reached the node; no answer byte was relayed.
                if replay.is_some() {
                    tracing::debug!(id = log.id, error = %err, "node failed mid-request; replaying idempotent request");
                    fail_over(choice, node, &mut failed)?;
                    force_fresh = upgrade;
                    continue;
                }
                shared.record_failure(node);
                return Err(Failure::BadGateway(err.to_string()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn choice(node: u32, outcome: Outcome) -> Choice {
        Choice {
            node: NodeId(node),
            outcome,
            set_cookie: true,
            issued_ms: None,
        }
    }

    fn pins(pinned: Pin, home: Pin) -> HomePins {
        HomePins { pinned, home }
    }

    #[test]
    fn home_cookie_is_set_only_when_the_node_made_the_session_move() {
        let (a, b) = (NodeId(0), NodeId(1));
        for r in [
            RepinReason::NodeDown,
            RepinReason::NodeMaint,
            RepinReason::DrainEnded,
            RepinReason::ConnectFailed,
        ] {
            assert_eq!(
                home_cookie(
                    &choice(1, Outcome::Repinned(r)),
                    pins(Pin::Node(a), Pin::None)
                ),
                HomeCookie::Set(a),
                "{r:?}"
            );
        }
        // Not the node's fault: nowhere to return to.
        for r in [
            RepinReason::UnknownNode,
            RepinReason::InvalidCookie,
            RepinReason::ExpiredCookie,
        ] {
            assert_eq!(
                home_cookie(
                    &choice(1, Outcome::Repinned(r)),
                    pins(Pin::Unknown, Pin::None)
                ),
                HomeCookie::Keep
            );
        }
        // Moved twice: the first home stays.
        assert_eq!(
            home_cookie(
                &choice(2, Outcome::Repinned(RepinReason::NodeDown)),
                pins(Pin::Node(b), Pin::Node(a))
            ),
            HomeCookie::Keep
        );
        // Back home: forget it. Sticky and fresh answers leave it alone.
        assert_eq!(
            home_cookie(
                &choice(0, Outcome::Failback),
                pins(Pin::Node(b), Pin::Node(a))
            ),
            HomeCookie::Clear
        );
        assert_eq!(
            home_cookie(
                &choice(1, Outcome::Sticky),
                pins(Pin::Node(b), Pin::Node(a))
            ),
            HomeCookie::Keep
        );
        assert_eq!(
            home_cookie(&choice(1, Outcome::New), pins(Pin::None, Pin::None)),
            HomeCookie::Keep
        );
    }
}
