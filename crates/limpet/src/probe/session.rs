//! One probe session on the wire: its own affinity jar, HTTP client and WebSocket.
//!
//! A session behaves like a well-behaved client of the affinity reference: one
//! [`SharedJar`] serves both its reqwest client (through [`AffinityCookieStore`]) and its
//! WebSocket upgrades (through [`tungstenite::connect_async_with_connector`], with the plan's
//! TLS config over `wss://`), discovery runs immediately
//! before every upgrade, and a closed socket is reconnected after the backoff the client
//! crate's [`classify`] and [`Backoff`] call for. Everything it sees becomes an [`Event`] on the
//! channel to the driver, which judges; a session never decides anything about affinity.
//!
//! Every request and upgrade carries the plan's `--header` and `--cookie` additions; the jar's
//! balancer cookies are merged into the same `Cookie` header (reqwest consults its cookie store
//! only for a request without one, so [`AffinityCookieStore::attach`] does the merge).
//!
//! Time per round: round 0 starts at once; round `r` at `start + r * interval`, or as soon as
//! round `r - 1` is done if that is later. Between rounds the session watches its socket, so a
//! closure is noticed when it happens, not at the next request.

use std::sync::Arc;
use std::time::Duration;

use futures_util::{FutureExt, StreamExt};
use limpet_client::reqwest::AffinityCookieStore;
use limpet_client::tungstenite::{self, outcome_of_error};
use limpet_client::{
    classify, AffinityJar, Backoff, CookieNames, Origin, Outcome, SetCookie, SharedJar, Verdict,
};
use reqwest::header::{HeaderMap, HeaderName, SET_COOKIE};
use tokio::net::TcpStream;
use tokio::sync::mpsc::UnboundedSender;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::{header::LOCATION, Response as WsResponse};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::{Connector, MaybeTlsStream, WebSocketStream};

use super::judge::{Answer, Event, Via};
use super::Plan;

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Node names longer than this (in characters) are cut: they go to a terminal and a report.
const MAX_NODE_CHARS: usize = 128;
/// Bytes of an answer body read before the rest is dropped (with its connection). The body
/// means nothing to the probe; reading a little lets small answers reuse the connection.
const MAX_BODY_READ: usize = 1 << 20;

/// What a session tells the driver.
#[derive(Debug)]
pub(crate) enum Msg {
    /// Something to judge.
    Event { session: usize, event: Event },
    /// Why a request or upgrade failed, for the report (the event says that it did).
    Error { error: String },
    /// The session finished this round.
    RoundDone { session: usize, round: u32 },
}

/// Where the session's WebSocket is.
#[derive(Debug)]
enum Socket {
    /// No `--ws`.
    NotWanted,
    Open(Box<Ws>),
    /// Closed or refused; the next attempt is due at this instant.
    Retry(Instant),
    /// Refused in a way retrying will not fix (see [`classify`]); left closed.
    GivenUp,
}

/// The result of one cookie-less upgrade: does the balancer pin a client by its 101?
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct FreshUpgrade {
    /// The upgrade's status; `None` without an answer.
    pub status: Option<u16>,
    /// The node the 101's node header, or without one the socket's first text frame, named.
    pub node: Option<String>,
    /// The answer carried a balancer cookie.
    pub cookie_set: bool,
}

/// A node name as the probe shows it: trimmed, control characters replaced, at most
/// [`MAX_NODE_CHARS`]; `None` if nothing is left. The name comes from the network.
pub(crate) fn clean_node(raw: &str) -> Option<String> {
    let name: String = raw
        .trim()
        .chars()
        .take(MAX_NODE_CHARS)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    (!name.is_empty()).then_some(name)
}

fn node_in(headers: &HeaderMap, name: &HeaderName) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .and_then(clean_node)
}

/// Whether an answer carries a `Set-Cookie` of a balancer name (whatever the jar then does).
fn carries_balancer_cookie(headers: &HeaderMap, names: &CookieNames) -> bool {
    headers
        .get_all(SET_COOKIE)
        .iter()
        .any(|v| SetCookie::parse(v.as_bytes()).is_ok_and(|c| names.matches(c.name())))
}

/// The balancer cookies held now, to tell a rewrite from a repeat.
fn snapshot(jar: &SharedJar) -> Vec<(String, String)> {
    let now = jar.now();
    jar.lock()
        .cookies(now)
        .map(|c| (c.name().to_owned(), c.value().to_owned()))
        .collect()
}

/// Whether an answer deletes (`Max-Age=0`, a past `Expires`) a balancer cookie held
/// `before` it: the balancer itself removed it, as limpet's failback removes `route-home`.
/// Read from the answer, not from the jar: a cookie whose own time ran out meanwhile is
/// gone from the jar all the same, and says nothing of the balancer.
fn deletes_held_cookie(
    headers: &HeaderMap,
    names: &CookieNames,
    before: &[(String, String)],
    now: std::time::SystemTime,
) -> bool {
    headers.get_all(SET_COOKIE).iter().any(|v| {
        SetCookie::parse(v.as_bytes()).is_ok_and(|c| {
            names.matches(c.name())
                && matches!(c.expiry(now), limpet_client::Expiry::Expired)
                && before.iter().any(|(n, _)| n == c.name())
        })
    })
}

/// An error and its causes on one line (reqwest hides the useful part in the sources).
fn describe(error: &(dyn std::error::Error + 'static)) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        out.push_str(": ");
        out.push_str(&e.to_string());
        source = e.source();
    }
    out
}

/// The first text frame of a fresh socket: the node that holds it. Control frames before it
/// are skipped; anything else (binary, close, end, error, timeout) leaves the node unknown.
/// The second value says whether the socket is still usable.
async fn greeting(ws: &mut Ws, timeout: Duration) -> (Option<String>, bool) {
    let read = tokio::time::timeout(timeout, async {
        loop {
            match ws.next().await {
                Some(Ok(Message::Text(t))) => return (clean_node(&t), true),
                Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => {}
                Some(Ok(Message::Binary(_))) => return (None, true),
                Some(Ok(Message::Close(_)) | Err(_)) | None => return (None, false),
            }
        }
    })
    .await;
    read.unwrap_or((None, true))
}

/// The largest WebSocket message (and frame) the probe takes: it reads only a greeting's
/// first characters, and with tungstenite's 64 MiB a server under test could make each of up
/// to 1,000 sessions hold one whole. A larger one fails the socket's read, which the probe
/// takes as the socket's end.
const MAX_WS_MESSAGE: usize = 1 << 20;

/// The most messages one look at an open socket reads (`Session::poll_socket`).
const POLLED_MESSAGES: usize = 64;

/// The probe's WebSocket settings: tungstenite's, messages and frames capped at
/// [`MAX_WS_MESSAGE`].
fn ws_config() -> tokio_tungstenite::tungstenite::protocol::WebSocketConfig {
    tokio_tungstenite::tungstenite::protocol::WebSocketConfig {
        max_message_size: Some(MAX_WS_MESSAGE),
        max_frame_size: Some(MAX_WS_MESSAGE),
        ..Default::default()
    }
}

/// Whether a frame read from an open socket ends it. Frames after the greeting mean nothing
/// to the probe; pings are answered by tungstenite as it reads.
fn is_closing(msg: Option<Result<Message, WsError>>) -> bool {
    match msg {
        Some(Ok(m)) => m.is_close(),
        Some(Err(_)) | None => true,
    }
}

/// Why an upgrade got no socket, for the report: a refusal says what the path answered and,
/// for the answers that mean the wrong path rather than a failing node, what to check.
fn upgrade_error(url: &str, error: &WsError) -> String {
    let WsError::Http(resp) = error else {
        return format!("the WebSocket upgrade at {url} failed: {}", describe(error));
    };
    refusal(url, resp)
}

fn refusal(url: &str, resp: &WsResponse<Option<Vec<u8>>>) -> String {
    let status = resp.status();
    let path = reqwest::Url::parse(url).map_or_else(|_| url.to_owned(), |u| u.path().to_owned());
    let shown = format!(
        "{} {}",
        status.as_u16(),
        status.canonical_reason().unwrap_or_default()
    );
    let shown = shown.trim_end();
    if status.is_success() {
        // What a web page, an API or a catch-all route answers: the path is no WebSocket.
        format!(
            "the WebSocket path {path} answered {shown}, not 101 Switching Protocols: is \
             --ws {path} a WebSocket endpoint?"
        )
    } else if status.is_redirection() {
        let to = resp
            .headers()
            .get(LOCATION)
            .and_then(|v| v.to_str().ok())
            .map_or_else(String::new, |l| format!(" to {l}"));
        format!(
            "the WebSocket path {path} answered {shown}{to}, not 101 Switching Protocols; \
             the probe follows no redirect: give --ws the path it points to"
        )
    } else {
        format!("the WebSocket upgrade at {url} was refused: {shown}")
    }
}

/// The answer to one upgrade attempt and the socket, if it opened.
struct Upgrade {
    answer: Answer,
    socket: Option<Ws>,
    outcome: Outcome,
    error: Option<String>,
}

async fn upgrade(plan: &Plan, jar: &SharedJar, url: &str, round: u32, via: Via) -> Upgrade {
    let before = snapshot(jar);
    // `None` over ws://: tokio-tungstenite's plain connector.
    let connector = plan.tls.clone().map(Connector::Rustls);
    let connect = async {
        // The user's `--header`/`--cookie` additions; the jar's cookies are merged into the
        // same `Cookie` header by `connect_async_with_connector`.
        let mut request = url.into_client_request()?;
        for (name, value) in &plan.extra.headers {
            request.headers_mut().append(name.clone(), value.clone());
        }
        tungstenite::connect_async_with_config(jar, request, Some(ws_config()), connector).await
    };
    let attempt = tokio::time::timeout(plan.timeout, connect).await;
    let mut answer = Answer {
        round,
        via,
        status: None,
        node: None,
        by_header: false,
        cookie_set: false,
        rewritten: false,
        removed: false,
    };
    let (socket, outcome, error) = match attempt {
        Ok(Ok((mut ws, resp))) => {
            answer.status = Some(resp.status().as_u16());
            answer.cookie_set = carries_balancer_cookie(resp.headers(), &plan.names);
            answer.removed = deletes_held_cookie(resp.headers(), &plan.names, &before, jar.now());
            // The node header when the 101 carries it (a socket's first frame is the
            // application's: `{"type":"welcome"}` named as a node was a move, and a sticky
            // balancer's run broken); else the first text frame, as limpet's nodes send.
            let (node, usable) = match node_in(resp.headers(), &plan.node_header) {
                Some(named) => {
                    answer.by_header = true;
                    (Some(named), true)
                }
                None => greeting(&mut ws, plan.timeout).await,
            };
            answer.node = node;
            let outcome = Outcome::UpgradeAnswered(resp.status().as_u16());
            (usable.then_some(ws), outcome, None)
        }
        Ok(Err(e)) => {
            // A refusal is an answer: it may name its node and carry a re-pin (already adopted
            // by the jar). Anything else got no answer.
            if let WsError::Http(resp) = &e {
                answer.status = Some(resp.status().as_u16());
                answer.node = node_in(resp.headers(), &plan.node_header);
                answer.by_header = answer.node.is_some();
                answer.cookie_set = carries_balancer_cookie(resp.headers(), &plan.names);
                answer.removed =
                    deletes_held_cookie(resp.headers(), &plan.names, &before, jar.now());
            }
            (None, outcome_of_error(&e), Some(upgrade_error(url, &e)))
        }
        Err(_) => (
            None,
            Outcome::UpgradeTransportFailed,
            Some(format!(
                "no answer to the upgrade within {:?}",
                plan.timeout
            )),
        ),
    };
    answer.rewritten = snapshot(jar) != before;
    Upgrade {
        answer,
        socket,
        outcome,
        error,
    }
}

fn new_jar(plan: &Plan) -> Result<(SharedJar, reqwest::Client), String> {
    let origin = Origin::from_url(&plan.url).map_err(|e| e.to_string())?;
    let jar = SharedJar::new(AffinityJar::with_names(origin, plan.names.clone()));
    let store = Arc::new(AffinityCookieStore::new(jar.clone()));
    // Requests with the user's own `Cookie` line bypass the store; `Session::get` attaches
    // the jar to those itself.
    let mut http = reqwest::Client::builder();
    if let Some(tls) = &plan.tls {
        // The same trust as the WebSocket's; ALPN http/1.1 (see `tls`).
        http = http.use_preconfigured_tls(rustls::ClientConfig::clone(tls));
    }
    let http = http
        .cookie_provider(store)
        // The probe judges the balancer's answers, not where they point.
        .redirect(reqwest::redirect::Policy::none())
        // Straight to the balancer: an HTTP proxy in between would decide connections itself.
        .no_proxy()
        .timeout(plan.timeout)
        .user_agent(concat!("limpet-probe/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| describe(&e))?;
    Ok((jar, http))
}

/// One cookie-less upgrade with a jar of its own, closed at once.
pub(crate) async fn fresh_upgrade(plan: &Plan) -> Option<FreshUpgrade> {
    let url = plan.ws_url.as_ref()?;
    let (jar, _) = new_jar(plan).ok()?;
    let up = upgrade(plan, &jar, url.as_str(), 0, Via::Upgrade).await;
    if let Some(mut ws) = up.socket {
        let _ = tokio::time::timeout(plan.timeout, ws.close(None)).await;
    }
    Some(FreshUpgrade {
        status: up.answer.status,
        node: up.answer.node,
        cookie_set: up.answer.cookie_set,
    })
}

/// One session.
struct Session {
    id: usize,
    plan: Arc<Plan>,
    jar: SharedJar,
    http: reqwest::Client,
    socket: Socket,
    backoff: Backoff,
    tx: UnboundedSender<Msg>,
}

impl Session {
    fn send(&self, event: Event) {
        // The driver only stops listening when the run is over (or interrupted): nothing
        // left to tell it then.
        let _ = self.tx.send(Msg::Event {
            session: self.id,
            event,
        });
    }

    fn error(&self, error: String) {
        let _ = self.tx.send(Msg::Error { error });
    }

    /// A GET of the URL: discovery or one of the round's requests.
    async fn get(&mut self, via: Via, round: u32) {
        // A socket that closed since it was last read must count as closed before this
        // answer is judged, or the judge would see HTTP away from a socket that is gone.
        self.poll_socket(round);
        let before = snapshot(&self.jar);
        let mut answer = Answer {
            round,
            via,
            status: None,
            node: None,
            by_header: false,
            cookie_set: false,
            rewritten: false,
            removed: false,
        };
        let sent = self
            .http
            .get(self.plan.url.clone())
            .headers(self.plan.extra.headers.clone())
            .build()
            .map(|mut request| {
                // reqwest asks the store only when the request has no Cookie header; a user's
                // `--cookie` gives it one, so the jar's cookies are merged in here.
                AffinityCookieStore::new(self.jar.clone()).attach(&mut request);
                request
            });
        // reqwest hands the answer's Set-Cookie lines to the jar before `execute` returns.
        let result = match sent {
            Ok(request) => self.http.execute(request).await,
            Err(e) => Err(e),
        };
        match result {
            Ok(mut resp) => {
                answer.status = Some(resp.status().as_u16());
                answer.node = node_in(resp.headers(), &self.plan.node_header);
                answer.by_header = answer.node.is_some();
                answer.cookie_set = carries_balancer_cookie(resp.headers(), &self.plan.names);
                answer.removed =
                    deletes_held_cookie(resp.headers(), &self.plan.names, &before, self.jar.now());
                let mut read = 0usize;
                while read <= MAX_BODY_READ {
                    match resp.chunk().await {
                        Ok(Some(c)) => read += c.len(),
                        // A body cut short does not undo the answer's head.
                        Ok(None) | Err(_) => break,
                    }
                }
            }
            Err(e) => self.error(describe(&e)),
        }
        answer.rewritten = snapshot(&self.jar) != before;
        self.send(Event::Answer(answer));
    }

    /// Discovery, then the upgrade; schedules the next attempt as the client crate says.
    async fn connect_socket(&mut self, round: u32) {
        let Some(url) = self.plan.ws_url.clone() else {
            return;
        };
        self.get(Via::Discovery, round).await;
        let up = upgrade(&self.plan, &self.jar, url.as_str(), round, Via::Upgrade).await;
        if let Some(e) = up.error {
            self.error(e);
        }
        self.send(Event::Answer(up.answer));
        match (up.socket, classify(up.outcome)) {
            (Some(ws), _) => {
                self.backoff.reset();
                self.socket = Socket::Open(Box::new(ws));
            }
            // Accepted, but closed before or while it greeted: a closed socket.
            (None, _) if up.outcome == Outcome::UpgradeAnswered(101) => {
                self.send(Event::SocketClosed { round });
                self.retry_later();
            }
            (None, Verdict::RetryLater) => self.retry_later(),
            (None, Verdict::HandBack | Verdict::AuthorisationWithdrawn) => {
                self.socket = Socket::GivenUp;
            }
        }
    }

    fn retry_later(&mut self) {
        self.socket = Socket::Retry(Instant::now() + self.plan.backoff_delay(&mut self.backoff));
    }

    fn reconnect_due(&self) -> bool {
        matches!(self.socket, Socket::Retry(at) if at <= Instant::now())
    }

    /// Waits until `deadline`, watching the socket; a closure is recorded in `round` (the
    /// round just finished) and schedules a reconnect.
    async fn idle_until(&mut self, deadline: Instant, round: u32) {
        loop {
            let Socket::Open(ws) = &mut self.socket else {
                tokio::time::sleep_until(deadline).await;
                return;
            };
            let closed = tokio::select! {
                () = tokio::time::sleep_until(deadline) => return,
                msg = ws.next() => is_closing(msg),
            };
            if closed {
                self.socket_closed(round);
            }
        }
    }

    /// Reads what the open socket already has, without waiting: [`POLLED_MESSAGES`] at most,
    /// so a server that keeps sending cannot hold the session here.
    fn poll_socket(&mut self, round: u32) {
        let Socket::Open(ws) = &mut self.socket else {
            return;
        };
        for _ in 0..POLLED_MESSAGES {
            let Some(msg) = ws.next().now_or_never() else {
                return;
            };
            if is_closing(msg) {
                self.socket_closed(round);
                return;
            }
        }
    }

    /// The open socket closed: the client crate says what to do next.
    fn socket_closed(&mut self, round: u32) {
        self.send(Event::SocketClosed { round });
        match classify(Outcome::SocketClosed) {
            Verdict::RetryLater => self.retry_later(),
            Verdict::HandBack | Verdict::AuthorisationWithdrawn => self.socket = Socket::GivenUp,
        }
    }

    async fn close(self) {
        if let Socket::Open(mut ws) = self.socket {
            let _ = tokio::time::timeout(self.plan.timeout, (*ws).close(None)).await;
        }
    }
}

/// Runs session `id` to the end of its rounds. Sends everything it sees to `tx`.
pub(crate) async fn run(plan: Arc<Plan>, id: usize, start: Instant, tx: UnboundedSender<Msg>) {
    let (jar, http) = match new_jar(&plan) {
        Ok(j) => j,
        Err(e) => {
            let _ = tx.send(Msg::Error {
                error: format!("cannot build the HTTP client: {e}"),
            });
            return;
        }
    };
    let mut s = Session {
        id,
        socket: if plan.ws_url.is_some() {
            Socket::Retry(start)
        } else {
            Socket::NotWanted
        },
        plan,
        jar,
        http,
        backoff: Backoff::new(),
        tx,
    };
    for round in 0..s.plan.rounds {
        if round > 0 {
            // A deadline past what an Instant can hold means an endless watch: stop there.
            let Some(at) = s
                .plan
                .interval
                .checked_mul(round)
                .and_then(|d| start.checked_add(d))
            else {
                break;
            };
            s.idle_until(at, round - 1).await;
        }
        if s.reconnect_due() {
            s.connect_socket(round).await;
        } else if round == 0 {
            s.get(Via::Discovery, round).await;
        }
        for _ in 0..s.plan.requests {
            s.get(Via::Request, round).await;
        }
        let _ = s.tx.send(Msg::RoundDone { session: id, round });
    }
    s.close().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    /// A deletion is the answer's: a `Set-Cookie` of a balancer name held before it that
    /// expires the cookie. A cookie set anew, one never held, or one of another name is not.
    #[test]
    fn an_answer_deletes_a_held_cookie_only_by_expiring_it() {
        let names = CookieNames::default();
        let held = vec![
            ("route".to_owned(), "b".to_owned()),
            ("route-home".to_owned(), "a".to_owned()),
        ];
        let now = std::time::SystemTime::now();
        let with = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.append(SET_COOKIE, HeaderValue::from_static(v));
            h
        };
        let deletes = |v| deletes_held_cookie(&with(v), &names, &held, now);
        assert!(deletes("route-home=; Path=/; Max-Age=0"));
        assert!(deletes(
            "route-home=; Expires=Thu, 01 Jan 1970 00:00:00 GMT"
        ));
        assert!(!deletes("route=a; Path=/"), "set anew");
        assert!(!deletes("SERVERID=; Max-Age=0"), "never held");
        assert!(!deletes("sid=; Max-Age=0"), "not a balancer name");
        assert!(!deletes_held_cookie(&HeaderMap::new(), &names, &held, now));
    }
}
