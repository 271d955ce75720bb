//! The admin HTTP server: accept loop, routing, JSON in and out. See the module docs of
//! [`crate::admin`] for the endpoints.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde::Serialize;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::time::Instant;

use super::{AdminSettings, Control, ControlError, NodeCommand};

const MAX_BODY: usize = 16 * 1024;
const MAX_PAGE: usize = 1000;
/// Admin connections served at once; more wait in the kernel backlog.
const MAX_CONNECTIONS: usize = 256;
/// A request head must arrive within it, and a write's body; a blocked write to the client
/// fails after it.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);

struct State {
    control: Arc<dyn Control>,
    settings: AdminSettings,
    started: Instant,
    /// Held by a `/metrics` scrape (see there). Waited for, not blocked on: a scrape waiting
    /// its turn leaves its thread to the tasks that share it.
    scrape: tokio::sync::Mutex<()>,
}

/// The task sampling node traffic for the stats page's charts; stopped with the server,
/// however the server's future ends.
struct Sampler(tokio::task::JoinHandle<()>);

impl Sampler {
    fn start(control: Arc<dyn Control>) -> Self {
        let metrics = control.metrics();
        Sampler(tokio::spawn(async move {
            let mut every = tokio::time::interval(super::SAMPLE_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                // The running configuration's nodes only: a node a reload removed or renamed
                // leaves the charts, and its history goes (`Metrics::sample`).
                let nodes = control.node_states();
                metrics.sample(
                    crate::clock::now_ms(),
                    nodes.iter().map(|n| n.name.as_str()),
                );
            }
        }))
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Serves the admin API on an already-bound listener until `shutdown` resolves; open
/// connections then finish their current request. Meanwhile samples node traffic every
/// [`super::SAMPLE_EVERY`] for the stats page's charts.
pub async fn serve(
    listener: TcpListener,
    control: Arc<dyn Control>,
    settings: AdminSettings,
    shutdown: impl Future<Output = ()>,
) {
    let _sampler = Sampler::start(Arc::clone(&control));
    let state = Arc::new(State {
        control,
        settings,
        started: Instant::now(),
        scrape: tokio::sync::Mutex::new(()),
    });
    let (stop_tx, stop_rx) = watch::channel(false);
    // The admin listener is for a few operators and scrapers: its connections are bounded
    // like a proxy listener's, so a flood there cannot take the descriptors traffic needs.
    let permits = crate::net::ConnLimit::new(MAX_CONNECTIONS);
    crate::net::accept_loop(
        listener,
        "admin",
        permits,
        shutdown,
        |stream, _peer, slot| {
            // The admin API is not drained (its stop closes idle connections at once): a
            // client the stop finds waiting for a slot is let go.
            let crate::net::Slot::Held(permit) = slot else {
                return;
            };
            let state = Arc::clone(&state);
            let mut stop = stop_rx.clone();
            // A client that stops reading an answer (a large table page) is cut like a proxy
            // client is.
            let stream = crate::relay::WriteDeadline::new(
                stream,
                crate::relay::WriteLimit::new(HEAD_TIMEOUT),
            );
            tokio::spawn(async move {
                let _permit = permit;
                let svc = service_fn(move |req| {
                    let state = Arc::clone(&state);
                    async move { Ok::<_, Infallible>(handle(&state, req).await) }
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEAD_TIMEOUT)
                    .serve_connection(TokioIo::new(stream), svc);
                tokio::pin!(conn);
                tokio::select! {
                    r = conn.as_mut() => { let _ = r; }
                    () = async { let _ = stop.wait_for(|s| *s).await; } => {
                        // The answer in flight may finish, within the head timeout.
                        conn.as_mut().graceful_shutdown();
                        let _ = tokio::time::timeout(HEAD_TIMEOUT, conn).await;
                    }
                }
            });
        },
    )
    .await;
    let _ = stop_tx.send(true);
}

type Resp = Response<Full<Bytes>>;

fn json<T: Serialize>(status: StatusCode, body: &T) -> Resp {
    match serde_json::to_vec(body) {
        Ok(v) => Response::builder()
            .status(status)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::CACHE_CONTROL, "no-store")
            .body(Full::new(Bytes::from(v)))
            .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()))),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

fn error(status: StatusCode, msg: &str) -> Resp {
    let body = serde_json::json!({ "error": msg }).to_string();
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CACHE_CONTROL, "no-store")
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

fn text(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Resp {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, content_type)
        .header(header::CACHE_CONTROL, "no-store")
        // Never inside another site's frame: framed under a decoy, the stats page's own
        // buttons would make writes the cross-site checks let through (same origin, same
        // host), a click on the other site putting a node in MAINT.
        .header(header::X_FRAME_OPTIONS, "DENY")
        .header(header::CONTENT_SECURITY_POLICY, "frame-ancestors 'none'")
        .body(Full::new(body.into()))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

fn control_error(e: ControlError) -> Resp {
    let status = match &e {
        ControlError::NotFound(_) => StatusCode::NOT_FOUND,
        ControlError::BadRequest(_) => StatusCode::BAD_REQUEST,
        ControlError::Refused(_) => StatusCode::UNPROCESSABLE_ENTITY,
        ControlError::Stopping(_) => StatusCode::SERVICE_UNAVAILABLE,
        ControlError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
    };
    error(status, &e.to_string())
}

async fn handle(state: &State, req: Request<Incoming>) -> Resp {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let query = parse_query(req.uri().query().unwrap_or(""));
    let segments: Vec<String> = path
        .trim_start_matches('/')
        .split('/')
        .map(percent_decode)
        .collect();
    let segs: Vec<&str> = segments.iter().map(String::as_str).collect();
    let auth = req
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    // With the token a request is what no rebound page can send; without it (or with no
    // token configured) its `Host` must be one the listener is known by.
    let with_token = state.settings.token.is_some() && state.settings.authorizes(auth);
    if !with_token {
        if let Some(why) = super::auth::rebinding_refusal(req.headers(), &state.settings.hosts) {
            return error(StatusCode::MISDIRECTED_REQUEST, why);
        }
    }
    let write = !matches!(method, Method::GET | Method::HEAD);
    // A table's entries are keyed by what pins a session: a client address, or an
    // application's session id (a cookie, a learned header), which would let whoever reads
    // it take the session over. Where a token is configured they are read with it, as
    // HAProxy's `show table` needs its admin socket; sizes (`/api/v1/tables`) stay open.
    let reads_keys = matches!(
        segs.as_slice(),
        ["api", "v1", "tables", _] | ["api", "v1", "tables", _, "entry"]
    );
    if write || reads_keys {
        if !state.settings.authorizes(auth) {
            return error(
                StatusCode::UNAUTHORIZED,
                if write {
                    "writes need `Authorization: Bearer <token>`"
                } else {
                    "table entries (session keys) are read with `Authorization: Bearer <token>`"
                },
            );
        }
        // With or without a token: a browser page elsewhere must not write here.
        if write {
            if let Some(why) = super::auth::cross_site_refusal(&method, req.headers()) {
                return error(StatusCode::FORBIDDEN, why);
            }
        }
    }
    let c = &state.control;
    // HEAD answers as GET does; hyper sends the head without the body.
    let method = if method == Method::HEAD {
        Method::GET
    } else {
        method
    };
    match (&method, segs.as_slice()) {
        (&Method::GET, [""]) => text(
            StatusCode::OK,
            "text/html; charset=utf-8",
            super::stats_page::PAGE,
        ),
        (&Method::GET, ["ready"]) => text(StatusCode::OK, "text/plain", "ready\n"),
        (&Method::GET, ["metrics"]) => {
            // One scrape at a time, from its read of the tables to its encoding: the table
            // counters grow by the difference from the snapshot applied before, and a
            // scrape's older snapshot applied after a newer one read as totals gone down.
            let _one = state.scrape.lock().await;
            let m = c.metrics();
            let nodes = c.nodes();
            let tables = c.tables();
            m.set_gauges(
                nodes.iter().map(|n| crate::metrics::NodeGauges {
                    node: &n.name,
                    state: n.state,
                    active: n.active_connections,
                    tunnels: n.tunnels,
                    pins: n.table_pins,
                    seen: n.sessions_seen,
                    http_listeners: n
                        .listeners
                        .iter()
                        .filter(|l| l.mode == "http")
                        .map(|l| l.name.as_str())
                        .collect(),
                }),
                tables.iter().map(|t| crate::metrics::TableGauges {
                    table: &t.name,
                    key: &t.key,
                    entries: t.size,
                    held: t.held,
                    evictions: t.evictions,
                    refused: t.refused,
                }),
            );
            text(
                StatusCode::OK,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                m.encode(),
            )
        }
        (&Method::GET, ["api", "v1", "stats"]) => json(
            StatusCode::OK,
            &serde_json::json!({
                "totals": c.metrics().totals(),
                "uptime_ms": state.started.elapsed().as_millis() as u64,
            }),
        ),
        (&Method::GET, ["api", "v1", "history"]) => {
            json(StatusCode::OK, &c.metrics().history(crate::clock::now_ms()))
        }
        (&Method::GET, ["api", "v1", "nodes"]) => json(StatusCode::OK, &c.nodes()),
        (&Method::GET, ["api", "v1", "nodes", name]) => {
            match c.nodes().into_iter().find(|n| n.name == *name) {
                Some(n) => json(StatusCode::OK, &n),
                None => error(StatusCode::NOT_FOUND, &format!("no node {name:?}")),
            }
        }
        (&Method::POST, ["api", "v1", "nodes", name, "state"]) => {
            let name = (*name).to_owned();
            let body = match read_body(req).await {
                Ok(b) => b,
                Err((status, m)) => return error(status, &m),
            };
            match parse_command(&body) {
                Ok(cmd) => match c.set_node(&name, cmd) {
                    Ok(v) => {
                        tracing::info!(node = %name, state = v.state, "operator set node state");
                        json(StatusCode::OK, &v)
                    }
                    Err(e) => control_error(e),
                },
                Err(msg) => error(StatusCode::BAD_REQUEST, &msg),
            }
        }
        (&Method::GET, ["api", "v1", "store"]) => match c.store() {
            Some(st) => json(StatusCode::OK, &st),
            None => error(
                StatusCode::NOT_FOUND,
                "no [store] configured (fleet mode is off)",
            ),
        },
        (&Method::GET, ["api", "v1", "tables"]) => json(StatusCode::OK, &c.tables()),
        (&Method::GET, ["api", "v1", "tables", table]) => {
            let (offset, limit) = match (number(&query, "offset", 0), number(&query, "limit", 100))
            {
                (Ok(o), Ok(l)) => (o, l.clamp(1, MAX_PAGE)),
                (Err(m), _) | (_, Err(m)) => return error(StatusCode::BAD_REQUEST, &m),
            };
            match c.table_page(table, offset, limit) {
                Ok(p) => json(StatusCode::OK, &p),
                Err(e) => control_error(e),
            }
        }
        (&Method::GET, ["api", "v1", "tables", table, "entry"]) => {
            let Some(key) = query_value(&query, "key") else {
                return error(StatusCode::BAD_REQUEST, "missing ?key=");
            };
            match c.table_get(table, key) {
                Ok(Some(e)) => json(StatusCode::OK, &e),
                Ok(None) => error(StatusCode::NOT_FOUND, &format!("no entry {key:?}")),
                Err(e) => control_error(e),
            }
        }
        (&Method::DELETE, ["api", "v1", "tables", table, "entry"]) => {
            let Some(key) = query_value(&query, "key") else {
                return error(StatusCode::BAD_REQUEST, "missing ?key=");
            };
            match c.table_delete(table, key) {
                Ok(true) => json(StatusCode::OK, &serde_json::json!({ "deleted": key })),
                Ok(false) => error(StatusCode::NOT_FOUND, &format!("no entry {key:?}")),
                Err(e) => control_error(e),
            }
        }
        (&Method::DELETE, ["api", "v1", "tables", table]) => match c.table_clear(table) {
            Ok(n) => {
                tracing::info!(table = %table, entries = n, "operator cleared table");
                json(StatusCode::OK, &serde_json::json!({ "cleared": n }))
            }
            Err(e) => control_error(e),
        },
        (&Method::POST, ["api", "v1", "reload"]) => match c.reload().await {
            Ok(report) => json(StatusCode::OK, &report),
            Err(e) => control_error(e),
        },
        // Every path some method answers: a wrong method there is 405, not 404.
        (_, ["" | "ready" | "metrics"])
        | (_, ["api", "v1", "stats" | "history" | "nodes" | "tables" | "reload" | "store"])
        | (_, ["api", "v1", "nodes", _] | ["api", "v1", "tables", _])
        | (_, ["api", "v1", "nodes", _, "state"] | ["api", "v1", "tables", _, "entry"]) => {
            error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed")
        }
        _ => error(StatusCode::NOT_FOUND, "no such endpoint"),
    }
}

/// A write's body, whole within [`HEAD_TIMEOUT`] (hyper's head timeout stops at the head: a
/// client that sends a length and then not the bytes would hold one of the listener's
/// connections for good); 408 after, and hyper closes the connection with its body unread.
async fn read_body(req: Request<Incoming>) -> Result<Bytes, (StatusCode, String)> {
    let read = Limited::new(req.into_body(), MAX_BODY).collect();
    match tokio::time::timeout(HEAD_TIMEOUT, read).await {
        Ok(Ok(b)) => Ok(b.to_bytes()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            Err((StatusCode::PAYLOAD_TOO_LARGE, "body over 16 KiB".into()))
        }
        Ok(Err(e)) => Err((StatusCode::BAD_REQUEST, format!("body: {e}"))),
        Err(_) => Err((
            StatusCode::REQUEST_TIMEOUT,
            format!("body not received within {} s", HEAD_TIMEOUT.as_secs()),
        )),
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct StateBody {
    state: String,
    deadline_secs: Option<f64>,
    spread_secs: Option<f64>,
}

/// Parses a state command body.
pub(crate) fn parse_command(body: &[u8]) -> Result<NodeCommand, String> {
    let b: StateBody =
        serde_json::from_slice(body).map_err(|e| format!("expected {{\"state\": ...}}: {e}"))?;
    let secs = |v: Option<f64>, what: &str| -> Result<Option<Duration>, String> {
        match v {
            None => Ok(None),
            Some(s) if s.is_finite() && (0.0..=31_536_000.0).contains(&s) => {
                Ok(Some(Duration::from_secs_f64(s)))
            }
            Some(s) => Err(format!("{what} {s} is not 0 to 31536000 seconds")),
        }
    };
    match b.state.to_ascii_lowercase().as_str() {
        "ready" | "up" => Ok(NodeCommand::Ready),
        "maint" => Ok(NodeCommand::Maint),
        "drain" => Ok(NodeCommand::Drain {
            deadline: secs(b.deadline_secs, "deadline_secs")?,
            spread: secs(b.spread_secs, "spread_secs")?,
        }),
        other => Err(format!(
            "unknown state {other:?}: use \"ready\", \"drain\" or \"maint\""
        )),
    }
}

fn parse_query(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (
                percent_decode(&k.replace('+', " ")),
                percent_decode(&v.replace('+', " ")),
            )
        })
        .collect()
}

fn query_value<'a>(q: &'a [(String, String)], key: &str) -> Option<&'a str> {
    q.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

fn number(q: &[(String, String)], key: &str, default: usize) -> Result<usize, String> {
    match query_value(q, key) {
        None => Ok(default),
        Some(v) => v
            .parse()
            .map_err(|_| format!("{key}={v:?} is not a number")),
    }
}

/// Decodes `%XX` escapes; invalid escapes stay as they are, invalid UTF-8 is replaced.
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = |c: u8| (c as char).to_digit(16);
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_parse_and_bad_ones_are_refused() {
        assert_eq!(
            parse_command(br#"{"state":"ready"}"#),
            Ok(NodeCommand::Ready)
        );
        assert_eq!(
            parse_command(br#"{"state":"MAINT"}"#),
            Ok(NodeCommand::Maint)
        );
        assert_eq!(
            parse_command(br#"{"state":"drain","deadline_secs":30,"spread_secs":1.5}"#),
            Ok(NodeCommand::Drain {
                deadline: Some(Duration::from_secs(30)),
                spread: Some(Duration::from_millis(1500))
            })
        );
        assert!(parse_command(br#"{"state":"drain","deadline_secs":-1}"#).is_err());
        assert!(parse_command(br#"{"state":"off"}"#).is_err());
        assert!(parse_command(br#"{"state":"ready","x":1}"#).is_err());
        assert!(parse_command(b"\xff").is_err());
    }

    #[test]
    fn percent_decoding_is_total() {
        assert_eq!(percent_decode("10.0.0.1"), "10.0.0.1");
        assert_eq!(percent_decode("a%2Fb%3a"), "a/b:");
        assert_eq!(percent_decode("%"), "%");
        assert_eq!(percent_decode("%4"), "%4");
        assert_eq!(percent_decode("%zz%41"), "%zzA");
        assert_eq!(percent_decode("%ff"), "\u{fffd}");
        let q = parse_query("key=2001%3Adb8%3A%3A1&limit=5&x");
        assert_eq!(query_value(&q, "key"), Some("2001:db8::1"));
        assert_eq!(query_value(&q, "x"), Some(""));
    }
}
