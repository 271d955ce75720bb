//! `limpet probe`: checks end to end that a balancer (limpet, HAProxy, nginx, an AWS ALB...)
//! keeps each client session on one node, from the client's side of the wire.
//!
//! ```text
//!                      ┌─ session 0: SharedJar ─┬─ reqwest + AffinityCookieStore ─ GET URL ──┐
//!  ProbeArgs ─► Plan ──┤   (limpet-client)      └─ tungstenite::connect_async ─ ws://.../PATH ┤
//!                      ├─ session 1 ...                                                        │ balancer
//!                      └─ session N-1 ...                                                      │
//!                                                                                              ▼
//!   session::Msg (Event: node + cookie rewritten?) ◄── node header (a 101's too) / first text frame, Set-Cookie
//!        │
//!        ▼
//!   driver ─► judge::SessionJudge per session (pure) ─► Move (re-pin / break), as it happens
//!        │                                                   │
//!        ▼                                                   ▼
//!   judge::summarise ─► Summary ─► output: human text or JSON lines on stdout ─► exit code
//! ```
//!
//! Each session is an independent, well-behaved client of the affinity reference
//! (`affinity-client.md`): its own jar keeping only the balancer's cookies, shared by its HTTP
//! client and its WebSocket; discovery (a GET of the URL) before every upgrade; then
//! `--requests` GETs per round. `session` does the I/O and reports what it saw as
//! [`judge::Event`]s; [`judge`] alone decides what they mean (re-pin or break, spread, cookie on
//! the 101), without I/O, so the rules are unit-tested apart from any network.
//!
//! Without `--watch` there is one round. With it, round `r` starts `r * --interval` after the
//! first (or when round `r - 1` ends, if later), for `--rounds` rounds (or those that start
//! within `--duration`, or until Ctrl-C); a socket that closes is reconnected as soon as the
//! client crate's backoff, scaled to start at `--backoff-min`, is due, between rounds too.
//! Each HTTP request goes on a new connection, so a balancer that places connections rather
//! than sessions is caught.
//!
//! Exit codes: 0 when every session kept affinity (re-pins allowed) with at least two answers
//! naming its node, 1 when any session broke it, 2 for a usage error or when the run cannot
//! pass (nothing answered, or a session had fewer than two answers naming its node). Flags,
//! output and the JSON fields are documented in `docs/probe.md`; `--help` repeats the exit
//! codes with examples.
//!
//! `--header` and `--cookie` go on every request and upgrade of every session, beside the
//! jar's balancer cookies (merged into one `Cookie` header), so an application behind a login
//! can be probed; a balancer cookie name is refused there, since the jar owns those.
//!
//! Over `https://` (and so `wss://`) every session's HTTP client and WebSocket share one
//! rustls config (`tls`): the system's roots plus `--ca`, or `--insecure`.

pub mod judge;
mod output;
mod session;
mod tls;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use limpet_client::{Backoff, CookieNames, NamePattern};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, COOKIE};
use reqwest::Url;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;

use judge::{Outcome, SessionJudge};
use output::{Output, Report};
use session::Msg;

pub use session::FreshUpgrade;

/// The longest duration any flag takes: a week.
const MAX_DURATION: Duration = Duration::from_secs(7 * 24 * 3600);
/// The longest `--backoff-min`: its schedule doubles to 30 times it, already 30 h between two
/// attempts, and `Plan::backoff_delay` relies on the bound.
const MAX_BACKOFF_MIN: Duration = Duration::from_secs(3600);
/// Distinct error messages kept for the report.
const MAX_ERRORS_KEPT: usize = 8;

/// Printed after the flags by `limpet probe --help` (and `-h`): what a script reads from the
/// exit code, and the commands a first user is after.
const AFTER_HELP: &str = "\
Exit codes:
  0  PASS: every session kept affinity (re-pins allowed), each with at least two
     answers naming its node
  1  FAIL: at least one session broke affinity (changed node without the balancer
     rewriting its cookie)
  2  usage error, or the run cannot pass: nothing answered, or a session had fewer
     than two answers naming its node (wrong --node-header?)

Examples:
  limpet probe http://127.0.0.1:8080/ --ws /ws --sessions 6 --requests 4
  limpet probe http://haproxy.internal/ --cookie-names SRV --node-header X-Served-By
  limpet probe https://app.example/ --ws /socket --cookie-names 'AWSALB*' \\
      --header 'Authorization: Bearer TOKEN' --cookie 'session=abc123'
  limpet probe http://lb.internal/ --ws /ws --watch --interval 2s --json | tail -n1

Full reference: docs/probe.md";

/// Headers the probe writes itself (framing, the connection, the WebSocket handshake): one
/// of the user's would break the request rather than identify it.
const OWN_HEADERS: &[&str] = &[
    "host",
    "connection",
    "upgrade",
    "content-length",
    "transfer-encoding",
    "te",
    "trailer",
    "keep-alive",
    "proxy-connection",
];

/// Arguments of `limpet probe`.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = AFTER_HELP)]
pub struct ProbeArgs {
    /// The balancer's URL (`http://...` or `https://...`). Discovery and every request GET
    /// it; the WebSocket is `ws://` or `wss://` to match.
    #[arg(value_name = "URL")]
    pub url: String,
    /// After discovery, open a WebSocket at this path on the URL's origin (e.g. `/ws`); its
    /// node is the node header on its 101, or without one the first text frame the server
    /// sends.
    #[arg(long, value_name = "PATH")]
    pub ws: Option<String>,
    /// Independent client sessions, each with its own cookie jar and connections.
    #[arg(long, default_value_t = 4, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub sessions: u32,
    /// HTTP requests per session per round, after discovery (and the upgrade).
    #[arg(long, default_value_t = 5, value_name = "M",
          value_parser = clap::value_parser!(u32).range(0..=100_000))]
    pub requests: u32,
    /// The answer header that names the node that served it.
    #[arg(long, default_value = "X-Limpet-Node", value_name = "NAME")]
    pub node_header: String,
    /// The balancer's cookie names, comma-separated; `NAME*` is a prefix. Replaces the default
    /// (limpet, AWS ALB, AWS classic ELB, HAProxy's conventional name).
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        default_value = "route,route-home,AWSALB*,AWSELB,SERVERID"
    )]
    pub cookie_names: Vec<NamePattern>,
    /// Send this header with every request and upgrade of every session (e.g.
    /// `'Authorization: Bearer TOKEN'` for an app behind a login). Repeatable.
    #[arg(long = "header", value_name = "NAME: VALUE", value_parser = parse_header)]
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// Send this cookie with every request and upgrade of every session, beside the
    /// balancer's (e.g. the application's session cookie). Repeatable.
    #[arg(long = "cookie", value_name = "NAME=VALUE", value_parser = parse_cookie)]
    pub cookies: Vec<(String, String)>,
    /// Keep the sessions going, one round per `--interval`, and report moves as they happen.
    #[arg(long)]
    pub watch: bool,
    /// Time between the starts of two rounds under `--watch` (e.g. `500ms`, `2s`, `1m`).
    #[arg(long, default_value = "1s", value_name = "DUR", value_parser = parse_duration)]
    pub interval: Duration,
    /// Stop `--watch` after this many rounds (default: at Ctrl-C).
    #[arg(long, value_name = "K", requires = "watch", conflicts_with = "duration",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub rounds: Option<u32>,
    /// Stop `--watch` after the rounds that start within this time.
    #[arg(long, value_name = "DUR", requires = "watch", value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// First delay before reconnecting a closed WebSocket; it doubles per failed attempt up
    /// to 30 times this (the client library's 1 s to 30 s, scaled). At most 1h.
    #[arg(long, default_value = "1s", value_name = "DUR", value_parser = parse_duration)]
    pub backoff_min: Duration,
    /// Give up on a request, an upgrade or a greeting after this long.
    #[arg(long, default_value = "5s", value_name = "DUR", value_parser = parse_duration)]
    pub timeout: Duration,
    /// JSON lines on stdout instead of the human summary (see docs/probe.md).
    #[arg(long)]
    pub json: bool,
    /// With `https://`: also trust the CA certificate(s) in this PEM file (a private CA),
    /// besides the system's roots.
    #[arg(long, value_name = "FILE")]
    pub ca: Option<PathBuf>,
    /// With `https://`: accept any server certificate, unverified. For testing only: the
    /// probe then cannot tell the balancer from anyone in between.
    #[arg(long, conflicts_with = "ca")]
    pub insecure: bool,
}

/// `500ms`, `2s`, `1.5s`, `3m`, `1h`; a bare number is seconds. Between 1 ms and a week.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let s = text.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let bad = || format!("{text:?} is not a duration (e.g. 500ms, 2s, 1.5s, 1m)");
    let n: f64 = number.parse().map_err(|_| bad())?;
    let secs = match unit.trim() {
        "ms" => n / 1000.0,
        "" | "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(bad()),
    };
    if !(0.001..=MAX_DURATION.as_secs_f64()).contains(&secs) {
        return Err(format!("{text:?} is out of range (1ms to 7 days)"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// `--header 'Name: value'`: a header name and a value (spaces around it trimmed). Headers the
/// probe writes itself are refused.
pub fn parse_header(text: &str) -> Result<(HeaderName, HeaderValue), String> {
    let Some((name, value)) = text.split_once(':') else {
        return Err(format!("{text:?} is not 'NAME: VALUE'"));
    };
    let name = HeaderName::from_bytes(name.trim().as_bytes())
        .map_err(|_| format!("{:?} is not a header name", name.trim()))?;
    if OWN_HEADERS.contains(&name.as_str()) || name.as_str().starts_with("sec-websocket-") {
        return Err(format!("{name} is a header the probe sets itself"));
    }
    let mut value = HeaderValue::from_str(value.trim())
        .map_err(|_| format!("the value of {name} holds a character a header cannot carry"))?;
    // Tokens and session cookies: kept out of any debug output.
    value.set_sensitive(true);
    Ok((name, value))
}

/// `--cookie name=value`: a cookie-name token and a value without `;` (spaces around both
/// trimmed).
pub fn parse_cookie(text: &str) -> Result<(String, String), String> {
    let Some((name, value)) = text.split_once('=') else {
        return Err(format!("{text:?} is not NAME=VALUE"));
    };
    let name = name.trim();
    NamePattern::exact(name).map_err(|e| e.to_string())?;
    let value = value.trim();
    if value.contains(';') || HeaderValue::from_str(value).is_err() {
        return Err(format!(
            "the value of cookie {name} holds ';' or a character a header cannot carry"
        ));
    }
    Ok((name.to_owned(), value.to_owned()))
}

/// What the user asked to send with every request: a header map for the wire, and the names
/// (never the values) for the report.
#[derive(Debug, Default)]
pub(crate) struct Extra {
    /// The `--header` lines, then one `Cookie` line with the `--cookie` pairs.
    pub(crate) headers: HeaderMap,
    /// Lower-case header names, in order, each once (`cookie` included when sent).
    pub(crate) header_names: Vec<String>,
    /// Names of the cookies sent, from `--cookie` and any `--header 'Cookie: ...'`.
    pub(crate) cookie_names: Vec<String>,
}

impl Extra {
    /// Refuses a cookie of a balancer name: the session's jar owns those, and a pin of the
    /// user's would put every session on one node before the balancer chose.
    fn from_args(args: &ProbeArgs, names: &CookieNames) -> Result<Extra, String> {
        let mut extra = Extra::default();
        let mut add_cookie = |name: &str, flag: &str| -> Result<(), String> {
            if names.matches(name) {
                return Err(format!(
                    "{flag}: {name} is a balancer cookie (see --cookie-names); each session's \
                     jar holds it, so that every session starts unpinned"
                ));
            }
            if !extra.cookie_names.iter().any(|n| n == name) {
                extra.cookie_names.push(name.to_owned());
            }
            Ok(())
        };
        for (name, value) in &args.headers {
            if name == COOKIE {
                for pair in value.as_bytes().split(|&b| b == b';') {
                    let pair = String::from_utf8_lossy(pair);
                    let cookie = pair.split('=').next().unwrap_or_default().trim();
                    if !cookie.is_empty() {
                        add_cookie(cookie, "--header Cookie")?;
                    }
                }
            }
        }
        for (name, _) in &args.cookies {
            add_cookie(name, &format!("--cookie {name}"))?;
        }
        for (name, value) in &args.headers {
            extra.headers.append(name.clone(), value.clone());
        }
        if !args.cookies.is_empty() {
            let line: Vec<String> = args
                .cookies
                .iter()
                .map(|(n, v)| format!("{n}={v}"))
                .collect();
            let mut value = HeaderValue::from_str(&line.join("; "))
                .map_err(|_| "--cookie: not a valid Cookie header".to_owned())?;
            value.set_sensitive(true);
            extra.headers.append(COOKIE, value);
        }
        for name in extra.headers.keys() {
            extra.header_names.push(name.as_str().to_owned());
        }
        Ok(extra)
    }
}

/// What to do, validated.
#[derive(Debug)]
pub(crate) struct Plan {
    pub(crate) url: Url,
    pub(crate) ws_url: Option<Url>,
    pub(crate) sessions: u32,
    pub(crate) requests: u32,
    pub(crate) node_header: HeaderName,
    pub(crate) names: CookieNames,
    /// `--header` and `--cookie`, sent with every request and upgrade.
    pub(crate) extra: Extra,
    pub(crate) watch: bool,
    /// Rounds per session; `u32::MAX` for "until interrupted".
    pub(crate) rounds: u32,
    /// `--duration`: no round starts once this long has passed since the first.
    pub(crate) duration: Option<Duration>,
    pub(crate) interval: Duration,
    pub(crate) backoff_min: Duration,
    pub(crate) timeout: Duration,
    /// For `https://` URLs: the TLS config of every HTTP client and WebSocket.
    pub(crate) tls: Option<Arc<rustls::ClientConfig>>,
}

impl Plan {
    /// Checks the arguments; the error is one line for the user.
    pub(crate) fn from_args(args: &ProbeArgs) -> Result<Plan, String> {
        let url = Url::parse(&args.url).map_err(|e| format!("{:?} is not a URL: {e}", args.url))?;
        let (ws_scheme, tls) = match url.scheme() {
            "http" => ("ws", None),
            "https" => {
                let cfg = tls::client_config(args.ca.as_deref(), args.insecure)?;
                ("wss", Some(Arc::new(cfg)))
            }
            s => {
                return Err(format!(
                    "unsupported scheme {s:?}: the URL must be http:// or https://"
                ))
            }
        };
        if url.host_str().is_none() {
            return Err(format!("{:?} has no host", args.url));
        }
        let ws_url = match &args.ws {
            None => None,
            // `//host/ws` is a path to `Url::join`'s eyes only as a scheme-relative URL: it
            // would probe another host, whose answers the session's jar does not follow.
            Some(path) if !path.starts_with('/') || path.starts_with("//") => {
                return Err(format!(
                    "--ws {path:?} must be a path starting with / (on the URL's host)"
                ));
            }
            Some(path) => {
                let mut u = url.join(path).map_err(|e| format!("--ws {path:?}: {e}"))?;
                // Whatever else the URL parser reads as another host (`/\host`, a tab
                // inside `//`): the URL's origin or nothing.
                if (u.host_str(), u.port_or_known_default())
                    != (url.host_str(), url.port_or_known_default())
                {
                    return Err(format!(
                        "--ws {path:?} must be a path starting with / (on the URL's host)"
                    ));
                }
                u.set_scheme(ws_scheme)
                    .map_err(|()| format!("--ws {path:?}: cannot make a {ws_scheme}:// URL"))?;
                Some(u)
            }
        };
        let node_header = HeaderName::from_bytes(args.node_header.as_bytes())
            .map_err(|_| format!("--node-header {:?} is not a header name", args.node_header))?;
        if args.cookie_names.is_empty() {
            return Err("--cookie-names needs at least one name".into());
        }
        let names = CookieNames::new(args.cookie_names.iter().cloned());
        let extra = Extra::from_args(args, &names)?;
        let rounds = match (args.watch, args.rounds, args.duration) {
            (false, _, _) => 1,
            (true, Some(k), _) => k,
            (true, None, Some(d)) => {
                // The rounds due within `d`; the sessions also stop at `d` when answers are
                // slow enough to make rounds late (`Plan::duration`).
                let k = d.as_nanos().div_ceil(args.interval.as_nanos().max(1));
                u32::try_from(k).unwrap_or(u32::MAX).max(1)
            }
            (true, None, None) => u32::MAX,
        };
        if args.backoff_min > MAX_BACKOFF_MIN {
            return Err("--backoff-min is at most 1h".into());
        }
        Ok(Plan {
            url,
            ws_url,
            sessions: args.sessions,
            requests: args.requests,
            node_header,
            names,
            extra,
            watch: args.watch,
            rounds,
            duration: args.duration.filter(|_| args.watch),
            interval: args.interval,
            backoff_min: args.backoff_min,
            timeout: args.timeout,
            tls,
        })
    }

    /// The client crate's reconnect schedule (1 s doubling to 30 s) scaled to start at
    /// `--backoff-min`, so tests and impatient users keep its shape without its pace.
    pub(crate) fn backoff_delay(&self, backoff: &mut Backoff) -> Duration {
        let scale = self.backoff_min.as_secs_f64() / Backoff::MIN.as_secs_f64();
        // Both are at most an hour and at least a millisecond: the product is finite.
        backoff.next_delay().mul_f64(scale)
    }
}

/// What a run produced, before it is rendered.
#[derive(Debug)]
struct Run {
    judges: Vec<SessionJudge>,
    /// Rounds every session completed.
    rounds: u32,
    interrupted: bool,
    errors: Vec<String>,
    fresh: Option<FreshUpgrade>,
}

/// Runs the sessions and feeds the judges until the rounds are done, Ctrl-C, or round 0 showed
/// that nothing answers.
async fn drive(plan: Arc<Plan>, out: &mut Output) -> Run {
    // One cookie-less upgrade first: whether the balancer pins by the 101 is only visible to
    // a client that arrives without a pin, which the sessions (discovery first) never are.
    let fresh = session::fresh_upgrade(&plan).await;
    let n = plan.sessions as usize;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let start = Instant::now();
    let mut tasks = JoinSet::new();
    for id in 0..n {
        tasks.spawn(session::run(Arc::clone(&plan), id, start, tx.clone()));
    }
    // The channel ends when the last session does.
    drop(tx);
    let mut run = Run {
        judges: vec![SessionJudge::new(); n],
        rounds: 0,
        interrupted: false,
        errors: Vec::new(),
        fresh,
    };
    let mut done = vec![0u32; n];
    let interrupt = async {
        // Without a signal handler there is nothing to wait for; the run ends by its bounds.
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    tokio::pin!(interrupt);
    loop {
        let msg = tokio::select! {
            m = rx.recv() => m,
            () = &mut interrupt => {
                run.interrupted = true;
                break;
            }
        };
        let Some(msg) = msg else { break };
        match msg {
            Msg::Event { session, event } => {
                if let Some(judge) = run.judges.get_mut(session) {
                    if let Some(m) = judge.observe(&event) {
                        out.moved(session, &m);
                    }
                }
            }
            Msg::Error { error, .. } => {
                if run.errors.len() < MAX_ERRORS_KEPT && !run.errors.contains(&error) {
                    run.errors.push(error);
                }
            }
            Msg::RoundDone { session, round } => {
                if let Some(d) = done.get_mut(session) {
                    *d = round.saturating_add(1);
                }
                let all = done.iter().copied().min().unwrap_or(0);
                while run.rounds < all {
                    out.round(run.rounds, &run.judges);
                    run.rounds += 1;
                }
                // Nothing answered in the whole first round: the URL is unreachable, and
                // watching it longer would only repeat that.
                if run.rounds >= 1 && summary_of(&run.judges).outcome() == Outcome::Unreachable {
                    break;
                }
                let finished: u64 = done.iter().map(|&d| u64::from(d)).sum();
                out.progress(&plan, run.rounds, finished, &summary_of(&run.judges));
            }
        }
    }
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    run
}

fn summary_of(judges: &[SessionJudge]) -> judge::Summary {
    judge::summarise(judges.iter().map(SessionJudge::verdict))
}

/// The exit code of an outcome.
pub fn exit_code(outcome: Outcome) -> u8 {
    match outcome {
        Outcome::Kept => 0,
        Outcome::Broken => 1,
        Outcome::Unjudged | Outcome::Unreachable => 2,
    }
}

/// Runs `limpet probe` to completion.
pub fn run(args: ProbeArgs) -> ExitCode {
    let plan = match Plan::from_args(&args) {
        Ok(p) => Arc::new(p),
        Err(e) => {
            eprintln!("limpet probe: {e}");
            return ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("limpet probe: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let progress = !args.json && std::io::stderr().is_terminal();
    let mut out = Output::new(args.json, plan.watch, progress);
    let run = rt.block_on(drive(Arc::clone(&plan), &mut out));
    // An interrupted run stopped its sessions where they were: one split then may have been
    // about to get its close.
    let verdicts: Vec<judge::SessionVerdict> = run
        .judges
        .into_iter()
        .map(|j| {
            let mut v = j.finish();
            v.ended_split &= !run.interrupted;
            v
        })
        .collect();
    let summary = judge::summarise(&verdicts);
    let outcome = summary.outcome_with_ws(plan.ws_url.is_some());
    out.finish(&Report {
        plan: &plan,
        sessions: &verdicts,
        summary: &summary,
        outcome,
        exit_code: exit_code(outcome),
        rounds: run.rounds,
        interrupted: run.interrupted,
        fresh: run.fresh.as_ref(),
        errors: &run.errors,
    });
    // Sessions were aborted or done; their sockets close as the runtime drops.
    rt.shutdown_timeout(Duration::from_millis(100));
    ExitCode::from(exit_code(outcome))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: ProbeArgs,
    }

    fn plan(argv: &[&str]) -> Result<Plan, String> {
        let cli = Cli::try_parse_from(std::iter::once("probe").chain(argv.iter().copied()))
            .map_err(|e| e.to_string())?;
        Plan::from_args(&cli.args)
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        for bad in ["", "s", "1x", "-1s", "0", "0.1ms", "9999h", "1e3"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn plan_defaults_and_ws_url() {
        let p = plan(&["http://127.0.0.1:8080/app?x=1", "--ws", "/ws"]).expect("plan");
        assert_eq!(
            p.ws_url.as_ref().map(Url::as_str),
            Some("ws://127.0.0.1:8080/ws")
        );
        assert_eq!((p.sessions, p.requests, p.rounds), (4, 5, 1));
        assert_eq!(p.node_header.as_str(), "x-limpet-node");
        for name in ["route", "route-home", "AWSALBTG", "AWSELB", "SERVERID"] {
            assert!(p.names.matches(name), "{name}");
        }
        assert!(!p.names.matches("sid"));
        assert!(p.extra.headers.is_empty());
        // A scheme-relative `//host/ws` would probe another host than the URL's.
        for other in ["//other/ws", "/\\other/ws", "/\t/other/ws"] {
            let e = plan(&["http://h/", "--ws", other]).map(|p| p.ws_url);
            assert!(
                e.as_ref().is_err_and(|e| e.contains("must be a path")),
                "{other:?}: {e:?}"
            );
        }
    }

    #[test]
    fn default_cookie_names_are_the_client_crates() {
        // One list of the balancers' names: the probe's default is the client jar's.
        let p = plan(&["http://h/"]).expect("plan");
        assert_eq!(p.names, CookieNames::default());
    }

    #[test]
    fn headers_and_cookies_to_send() {
        let p = plan(&[
            "http://h/",
            "--header",
            "Authorization: Bearer t0k:en ",
            "--header",
            "X-Tenant:acme",
            "--header",
            "Cookie: lang=en",
            "--cookie",
            "sid=s3cr3t",
            "--cookie",
            " theme = dark",
        ])
        .expect("plan");
        let h = &p.extra.headers;
        assert_eq!(
            h.get("authorization").map(HeaderValue::as_bytes),
            Some(&b"Bearer t0k:en"[..])
        );
        assert_eq!(
            h.get("x-tenant").map(HeaderValue::as_bytes),
            Some(&b"acme"[..])
        );
        let cookies: Vec<&[u8]> = h
            .get_all(COOKIE)
            .iter()
            .map(HeaderValue::as_bytes)
            .collect();
        assert_eq!(cookies, [&b"lang=en"[..], b"sid=s3cr3t; theme=dark"]);
        assert!(
            h.values().all(HeaderValue::is_sensitive),
            "kept out of logs"
        );
        assert_eq!(
            p.extra.header_names,
            ["authorization", "x-tenant", "cookie"]
        );
        assert_eq!(p.extra.cookie_names, ["lang", "sid", "theme"]);
    }

    #[test]
    fn headers_and_cookies_refused() {
        for argv in [
            &["--header", "no colon"][..],
            &["--header", "bad name: x"],
            &["--header", "Host: other"],
            &["--header", "Sec-WebSocket-Key: x"],
            &["--header", "Connection: close"],
            &["--header", "X-A: line\nbreak"],
            &["--cookie", "novalue"],
            &["--cookie", "=x"],
            &["--cookie", "a b=x"],
            &["--cookie", "a=x; b=y"],
            // The jar owns the balancer's cookies: a pin of the user's would pre-pin sessions.
            &["--cookie", "route=a"],
            &["--cookie", "AWSALBTG=x"],
            &["--header", "Cookie: sid=1; SERVERID=s1"],
            &["--cookie-names", "SRV", "--cookie", "SRV=s1"],
        ] {
            let mut full = vec!["http://h/"];
            full.extend_from_slice(argv);
            assert!(plan(&full).is_err(), "{argv:?}");
        }
        // Under other --cookie-names, `route` is the application's own cookie.
        assert!(plan(&["http://h/", "--cookie-names", "SRV", "--cookie", "route=a"]).is_ok());
    }

    #[test]
    fn https_means_wss_and_tls() {
        let p = plan(&["https://127.0.0.1:8443/", "--ws", "/ws", "--insecure"]).expect("plan");
        assert_eq!(
            p.ws_url.as_ref().map(Url::as_str),
            Some("wss://127.0.0.1:8443/ws")
        );
        assert!(p.tls.is_some());
        assert!(plan(&["http://h/"]).expect("plan").tls.is_none());
        assert!(
            plan(&["https://h/", "--ca", "/nonexistent/ca.pem"]).is_err(),
            "an unreadable --ca is a usage error"
        );
        assert!(
            plan(&["https://h/", "--ca", "x.pem", "--insecure"]).is_err(),
            "--ca and --insecure exclude each other"
        );
    }

    #[test]
    fn plan_rounds() {
        let watch = |extra: &[&str]| {
            let mut argv = vec!["http://h/", "--watch"];
            argv.extend_from_slice(extra);
            plan(&argv).map(|p| p.rounds)
        };
        assert_eq!(watch(&["--rounds", "7"]), Ok(7));
        assert_eq!(watch(&["--duration", "10s", "--interval", "3s"]), Ok(4));
        let d = plan(&["http://h/", "--watch", "--duration", "10s"]).map(|p| p.duration);
        assert_eq!(
            d,
            Ok(Some(Duration::from_secs(10))),
            "the sessions stop at it too"
        );
        assert_eq!(
            plan(&["http://h/", "--watch"]).map(|p| p.duration),
            Ok(None)
        );
        assert_eq!(watch(&[]), Ok(u32::MAX));
        assert!(watch(&["--rounds", "2", "--duration", "1s"]).is_err());
        assert!(
            plan(&["http://h/", "--rounds", "2"]).is_err(),
            "needs --watch"
        );
    }

    #[test]
    fn plan_refuses_bad_input() {
        for argv in [
            &["ftp://h/"][..],
            &["not a url"],
            &["http://h/", "--ws", "ws"],
            &["http://h/", "--node-header", "bad header"],
            &["http://h/", "--cookie-names", "ro ute"],
            &["http://h/", "--cookie-names", "*"],
            &["http://h/", "--sessions", "0"],
        ] {
            assert!(plan(argv).is_err(), "{argv:?}");
        }
        let p = plan(&["http://h/", "--cookie-names", "SRV,lb_*"]).expect("plan");
        assert!(p.names.matches("SRV") && p.names.matches("lb_x") && !p.names.matches("route"));
    }

    #[test]
    fn backoff_is_scaled_from_the_client_schedule() {
        let p = plan(&["http://h/", "--backoff-min", "50ms"]).expect("plan");
        let mut b = Backoff::new();
        let delays: Vec<u128> = (0..7)
            .map(|_| p.backoff_delay(&mut b).as_millis())
            .collect();
        assert_eq!(delays, [50, 100, 200, 400, 800, 1500, 1500]);
        // As documented: up to an hour, not the week other durations take.
        assert!(plan(&["http://h/", "--backoff-min", "1h"]).is_ok());
        let e = plan(&["http://h/", "--backoff-min", "61m"]).map(|p| p.backoff_min);
        assert!(e.as_ref().is_err_and(|e| e.contains("at most 1h")), "{e:?}");
    }
}
