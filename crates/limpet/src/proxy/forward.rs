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
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Sticky => f.write_str("sticky"),
            Outcome::New => f.write_str("new"),
            Outcome::Repinned(r) => write!(f, "re-pinned({})", r.as_str()),
            Outcome::RoundRobin => f.write_str("round-robin"),
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

/// Picks the node. Runs under the pool lock and never awaits.
fn choose(ctx: &ConnCtx, headers: &HeaderMap) -> Option<Choice> {
    let shared = &ctx.shared;
    let mut pool = shared.pool();
    let Some(affinity) = &shared.affinity else {
        return pool.assign(|_| false).map(|node| Choice {
            node,
            outcome: Outcome::RoundRobin,
            set_cookie: false,
            issued_ms: None,
        });
    };
    let now = now_ms();
    let read = affinity.read(&pool, headers, now);
    if let Pin::Node(node) = read.pin {
        if pool.honours_pin(node, now).is_ok() {
            return Some(Choice {
                node,
                outcome: Outcome::Sticky,
                set_cookie: read.refresh,
                issued_ms: read.issued_ms,
            });
        }
    }
    // No usable pin. If this connection already got a node for an earlier request the client
    // has not yet confirmed with the cookie, follow it: concurrent first requests agree.
    let reason = match read.pin {
        Pin::None => None,
        Pin::Node(n) => pool.honours_pin(n, now).err(),
        Pin::Unknown => Some(RepinReason::UnknownNode),
        Pin::Invalid => Some(RepinReason::InvalidCookie),
        Pin::Expired => Some(RepinReason::ExpiredCookie),
    };
    let outcome = |r: Option<RepinReason>| r.map_or(Outcome::New, Outcome::Repinned);
    if let Some(node) = ctx.pinned() {
        if pool.honours_pin(node, now).is_ok() {
            return Some(Choice {
                node,
                outcome: outcome(reason),
                set_cookie: true,
                issued_ms: None,
            });
        }
    }
    match pool.decide(read.pin, now) {
        Decision::Fresh { node, repin } => {
            ctx.set_pinned(node);
            Some(Choice {
                node,
                outcome: outcome(repin),
                set_cookie: true,
                issued_ms: None,
            })
        }
        // Unreachable: a usable pin returned above. Treat as a fresh request would be.
        Decision::Sticky(node) => Some(Choice {
            node,
            outcome: Outcome::Sticky,
            set_cookie: false,
            issued_ms: None,
        }),
        Decision::Unavailable => None,
    }
}

/// A fresh node for a request whose node failed, excluding every node that failed for it.
fn reassign(ctx: &ConnCtx, failed: &[NodeId]) -> Option<Choice> {
    let node = ctx.shared.pool().assign(|n| failed.contains(&n))?;
    let sticky = ctx.shared.affinity.is_some();
    if sticky {
        ctx.set_pinned(node);
    }
    Some(Choice {
        node,
        outcome: if sticky {
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
    let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));

    let Some(mut choice) = choose(ctx, req.headers()) else {
        return unavailable(shared, id);
    };

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
        log,
    )
    .await;
    log.node = Some(shared.node_name(choice.node).to_owned());
    log.outcome = Some(choice.outcome);
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
    if choice.set_cookie {
        if let Some(a) = &shared.affinity {
            let now = now_ms();
            let value = a.encode(
                &shared.pool(),
                choice.node,
                choice.issued_ms.unwrap_or(now),
                now,
            );
            if let Some(v) = a.set_cookie(&value, ctx.tls) {
                rheaders.append(header::SET_COOKIE, v);
            }
            hdr::add_no_cache_set_cookie(&mut rheaders);
        }
    }
    *out.headers_mut() = rheaders;
    // hyper answers in the client's version; the node's is irrelevant.
    *out.version_mut() = Version::HTTP_11;
    if let (Some(client), Some(upstream)) = (client_upgrade, upstream_upgrade) {
        upgrade::spawn_tunnel(
            client,
            upstream,
            shared.timeouts.tunnel_idle,
            shared.draining.clone(),
        );
        return out;
    }
    out.map(|_| ProxyBody::upstream(rbody))
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
        match reassign(ctx, failed) {
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
