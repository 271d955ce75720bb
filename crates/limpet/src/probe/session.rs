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
//! round `r - 1` is done if that is later, but never once `--duration` has passed since
//! `start`. Between rounds the session watches its socket, so a closure is noticed when it
//! happens, not at the next request, and reconnects it when the backoff falls due.
//!
//! Every request goes on a connection of its own (see [`new_jar`]): a balancer that places
//! connections, not sessions, must show it.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::{FutureExt, StreamExt};
use limpet_client::reqwest::AffinityCookieStore;
use limpet_client::tungstenite::{self, outcome_of_error};
use limpet_client::{
    classify, Adoption, AffinityJar, Backoff, Ignored, Origin, Outcome, SharedJar, Verdict,
};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONNECTION, SET_COOKIE};
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
/// means nothing to the probe; reading it lets the connection close cleanly once it is done.
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
    /// The answer set a balancer cookie that the jar took (by its rules: not a `Secure`
    /// one over `ws://`, say).
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

/// The balancer cookies `jar` holds at `now`, to tell a rewrite from a repeat.
fn held(jar: &AffinityJar, now: SystemTime) -> Vec<(String, String)> {
    jar.cookies(now)
        .map(|c| (c.name().to_owned(), c.value().to_owned()))
        .collect()
}

/// What the session's jar did with an answer's balancer cookies.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Adopted {
    /// The jar took a balancer cookie from the answer: stored it, or rewrote a held one
    /// (a repeat of the held value included: the balancer did set it).
    set: bool,
    /// The jar removed a balancer cookie it held, live, before the answer: the balancer
    /// expired it, as limpet's failback expires `route-home`.
    removed: bool,
    /// The first cookie the jar did not keep, and why ([`cookie_refusal`]).
    refused: Option<String>,
}

/// Why the jar did not keep a cookie, as a run's report says it; `None` for what says
/// nothing of the balancer (a deletion of a cookie not held).
fn cookie_refusal(name: &str, why: Ignored) -> Option<String> {
    let why = match why {
        Ignored::NotBalancerCookie => "not a --cookie-names name",
        Ignored::SecureOverInsecure => "Secure over http://",
        Ignored::PathNotRoot => "a Path other than /",
        Ignored::DomainMismatch => "a Domain the URL's host is not in",
        Ignored::ValueTooLong => "a value over 4096 characters",
        Ignored::JarFull => "more balancer cookies than the jar holds",
        Ignored::Malformed(_) => "not a well-formed cookie",
        Ignored::OtherOrigin | Ignored::ExpiredNotHeld => return None,
    };
    let name: String = name.chars().take(64).collect();
    Some(format!("{name}: {why}"))
}

/// What the jar did with the answer's `Set-Cookie` lines, by replaying them on a copy of the
/// jar as it was before the answer (`before`). The jar's rules decide, not the names alone:
/// a `Secure` cookie over `http://`, a `Path` other than `/` or a foreign `Domain` is refused
/// by the jar, so it pins nothing and removes nothing, and must not be reported as a cookie
/// set or excuse a move as a removal. Each session sends one request at a time, so `before`
/// is the jar the adapter fed this answer to.
fn adopted(before: &AffinityJar, headers: &HeaderMap, now: SystemTime) -> Adopted {
    let mut jar = before.clone();
    // A cookie whose own time ran out meanwhile is gone from the jar all the same; an answer
    // expiring it too says nothing of the balancer.
    jar.remove_expired(now);
    // The adapters adopt an answer as the jar's origin's (redirects are not followed, and the
    // WebSocket's `ws://` is the same origin as `http://`).
    let origin = jar.origin().clone();
    let mut out = Adopted::default();
    for line in headers.get_all(SET_COOKIE) {
        match jar.adopt(&origin, line.as_bytes(), now) {
            Adoption::Stored | Adoption::Replaced => out.set = true,
            Adoption::Removed => out.removed = true,
            Adoption::Ignored(why) if out.refused.is_none() => {
                let name = line
                    .to_str()
                    .ok()
                    .and_then(|l| l.split_once('='))
                    .map_or("", |(n, _)| n.trim());
                out.refused = cookie_refusal(name, why);
            }
            Adoption::Ignored(_) => {}
        }
    }
    out
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
    let before_jar = jar.lock().clone();
    let before = held(&before_jar, jar.now());
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
        refused: None,
    };
    let (socket, outcome, error) = match attempt {
        Ok(Ok((mut ws, resp))) => {
            answer.status = Some(resp.status().as_u16());
            let cookies = adopted(&before_jar, resp.headers(), jar.now());
            (answer.cookie_set, answer.removed) = (cookies.set, cookies.removed);
            answer.refused = cookies.refused;
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
                let cookies = adopted(&before_jar, resp.headers(), jar.now());
                (answer.cookie_set, answer.removed) = (cookies.set, cookies.removed);
                answer.refused = cookies.refused;
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
    answer.rewritten = held(&jar.lock(), jar.now()) != before;
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
    // One connection per request, announced with `Connection: close`: a balancer may decide
    // by connection (round-robin TCP, an L4 balancer), and a real client's next request can
    // go on a new one (keep-alive expired, requests in parallel, the client restarted). With
    // one kept-alive connection per session, all its requests would reach one node and such
    // a balancer would pass. `close` lets the server close first, so the TIME_WAIT of the
    // many short connections is mostly the server's, not the probe's ephemeral ports'.
    let mut every_request = HeaderMap::new();
    every_request.insert(CONNECTION, HeaderValue::from_static("close"));
    let http = http
        .pool_max_idle_per_host(0)
        .default_headers(every_request)
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
    /// The session's own view of its events, to tell whether it is split at its end.
    judge: super::judge::SessionJudge,
}

/// How long a session that would end split (its socket on another node than its last HTTP
/// answer's) waits for the balancer's close of that socket: a re-pin on the last request
/// and the close it sends cross each other.
pub(crate) const SPLIT_GRACE: Duration = Duration::from_secs(2);

impl Session {
    fn send(&mut self, event: Event) {
        self.judge.observe(&event);
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
        let before_jar = self.jar.lock().clone();
        let before = held(&before_jar, self.jar.now());
        let mut answer = Answer {
            round,
            via,
            status: None,
            node: None,
            by_header: false,
            cookie_set: false,
            rewritten: false,
            removed: false,
            refused: None,
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
                let cookies = adopted(&before_jar, resp.headers(), self.jar.now());
                (answer.cookie_set, answer.removed) = (cookies.set, cookies.removed);
                answer.refused = cookies.refused;
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
        answer.rewritten = held(&self.jar.lock(), self.jar.now()) != before;
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

    /// Waits until `deadline`, the start of `next_round`, watching the socket. A closure is
    /// recorded in the round just finished; a reconnect whose backoff falls due before the
    /// deadline happens then, as the client library's schedule says, not at the round's start,
    /// and counts in `next_round` (the round it prepares).
    ///
    /// Bounded in time by `deadline`; each pass waits for it, a frame, or a reconnect's due
    /// time (each attempt pushes the next one back by the backoff, at least `--backoff-min`).
    async fn idle_until(&mut self, deadline: Instant, next_round: u32) {
        while Instant::now() < deadline {
            match &mut self.socket {
                Socket::Open(ws) => {
                    let closed = tokio::select! {
                        () = tokio::time::sleep_until(deadline) => return,
                        msg = ws.next() => is_closing(msg),
                    };
                    if closed {
                        self.socket_closed(next_round.saturating_sub(1));
                    }
                }
                Socket::Retry(at) if *at < deadline => {
                    tokio::time::sleep_until(*at).await;
                    self.connect_socket(next_round).await;
                }
                Socket::Retry(_) | Socket::NotWanted | Socket::GivenUp => {
                    tokio::time::sleep_until(deadline).await;
                }
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

    /// A session about to end split (its socket on another node than its last HTTP answer's)
    /// gives the balancer [`SPLIT_GRACE`] to close that socket: the close of a re-pin on the
    /// last request may still be on its way. Recorded in `round`, the last one.
    async fn await_split_close(&mut self, round: u32) {
        if !self.judge.split_now() {
            return;
        }
        let deadline = Instant::now() + SPLIT_GRACE;
        loop {
            let Socket::Open(ws) = &mut self.socket else {
                return;
            };
            let closed = tokio::select! {
                () = tokio::time::sleep_until(deadline) => return,
                msg = ws.next() => is_closing(msg),
            };
            if closed {
                self.socket_closed(round);
                return;
            }
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
        judge: super::judge::SessionJudge::new(),
    };
    let mut last_round = 0;
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
            s.idle_until(at, round).await;
            // `--duration` bounds the run: a round due within it but reached after it, behind
            // slow answers, does not start.
            if s.plan.duration.is_some_and(|d| start.elapsed() >= d) {
                break;
            }
        }
        if s.reconnect_due() {
            s.connect_socket(round).await;
        } else if round == 0 {
            s.get(Via::Discovery, round).await;
        }
        for _ in 0..s.plan.requests {
            s.get(Via::Request, round).await;
        }
        last_round = round;
        let _ = s.tx.send(Msg::RoundDone { session: id, round });
    }
    s.await_split_close(last_round).await;
    s.close().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use limpet_client::CookieNames;

    fn answer_setting(lines: &[&'static str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for &line in lines {
            h.append(SET_COOKIE, HeaderValue::from_static(line));
        }
        h
    }

    /// A jar for `url` with the default names, holding `route=b` and `route-home=a`.
    fn jar_holding(url: &str, now: SystemTime) -> AffinityJar {
        let origin = Origin::parse(url).expect("origin");
        let mut jar = AffinityJar::with_names(origin.clone(), CookieNames::default());
        for line in ["route=b; Path=/", "route-home=a; Path=/"] {
            assert_eq!(
                jar.adopt(&origin, line.as_bytes(), now),
                Adoption::Stored,
                "{line}"
            );
        }
        jar
    }

    /// A deletion is the answer's: a `Set-Cookie` of a balancer name held before it that
    /// expires the cookie. A cookie set anew, one never held, or one of another name is not.
    #[test]
    fn an_answer_deletes_a_held_cookie_only_by_expiring_it() {
        let now = SystemTime::now();
        let jar = jar_holding("http://lb.example/", now);
        let removes = |line| adopted(&jar, &answer_setting(&[line]), now).removed;
        assert!(removes("route-home=; Path=/; Max-Age=0"));
        assert!(removes(
            "route-home=; Expires=Thu, 01 Jan 1970 00:00:00 GMT"
        ));
        assert!(!removes("route=a; Path=/"), "set anew");
        assert!(!removes("SERVERID=; Max-Age=0"), "never held");
        assert!(!removes("sid=; Max-Age=0"), "not a balancer name");
        assert_eq!(adopted(&jar, &HeaderMap::new(), now), Adopted::default());
    }

    /// A deletion the jar refuses keeps the cookie, so it removes nothing: with `Path=/x`
    /// (the jar keeps only root-path cookies) or a `Domain` the origin is not in. Counted as
    /// a removal, it would excuse a move right after a re-pin, which the judge breaks.
    #[test]
    fn a_deletion_the_jar_refuses_is_not_a_removal() {
        let now = SystemTime::now();
        let jar = jar_holding("http://lb.example/", now);
        let removes = |line| adopted(&jar, &answer_setting(&[line]), now).removed;
        assert!(!removes("route-home=; Path=/x; Max-Age=0"), "Path=/x");
        assert!(
            !removes("route-home=; Domain=other.example; Max-Age=0"),
            "another domain"
        );
        assert!(
            !removes("route-home=; Path=/; Secure; Max-Age=0"),
            "Secure over http"
        );
        // The same lines over https, on the root path, in the origin's domain: removals.
        let tls = jar_holding("https://app.lb.example/", now);
        for line in [
            "route-home=; Path=/; Max-Age=0",
            "route-home=; Domain=lb.example; Max-Age=0",
            "route-home=; Path=/; Secure; Max-Age=0",
        ] {
            assert!(
                adopted(&tls, &answer_setting(&[line]), now).removed,
                "{line}"
            );
        }
    }

    /// A cookie is set only when the jar takes it. A `Secure` one over `http://` (on a 101,
    /// say) is refused by the jar, which then sends nothing: no cookie set. Over `https://`
    /// the same line is one.
    #[test]
    fn a_cookie_the_jar_refuses_is_not_a_cookie_set() {
        let now = SystemTime::now();
        let sets = |url: &str, lines: &[&'static str]| {
            let origin = Origin::parse(url).expect("origin");
            let empty = AffinityJar::with_names(origin, CookieNames::default());
            adopted(&empty, &answer_setting(lines), now).set
        };
        assert!(!sets("http://lb.example/", &["route=a; Path=/; Secure"]));
        assert!(sets("https://lb.example/", &["route=a; Path=/; Secure"]));
        assert!(!sets("http://lb.example/", &["route=a; Path=/ws"]), "Path");
        assert!(
            !sets("http://lb.example/", &["route=a; Domain=other.example"]),
            "Domain"
        );
        assert!(
            !sets("http://lb.example/", &["sid=a; Path=/"]),
            "not a balancer name"
        );
        // One line the jar refuses beside one it takes: the answer did set a cookie.
        assert!(sets(
            "http://lb.example/",
            &["AWSALB=x; Path=/; Secure", "route=a; Path=/"]
        ));
        assert!(
            sets("ws://lb.example/", &["route=a"]),
            "ws:// is http://'s origin"
        );
    }

    /// A rewrite of a held cookie, even to the value held, is a cookie set (the balancer did
    /// set it); a held cookie that ran out on its own is no removal when the answer expires it.
    #[test]
    fn a_repeat_is_set_and_a_lapsed_cookie_is_not_removed() {
        let now = SystemTime::now();
        let origin = Origin::parse("http://lb.example/").expect("origin");
        let mut jar = jar_holding("http://lb.example/", now);
        assert!(adopted(&jar, &answer_setting(&["route=b; Path=/"]), now).set);
        let short = "route-home=a; Path=/; Max-Age=1";
        assert_eq!(
            jar.adopt(&origin, short.as_bytes(), now),
            Adoption::Replaced
        );
        let later = now + Duration::from_secs(2);
        let expire = answer_setting(&["route-home=; Path=/; Max-Age=0"]);
        assert!(!adopted(&jar, &expire, later).removed);
        assert!(adopted(&jar, &expire, now).removed);
    }
}
