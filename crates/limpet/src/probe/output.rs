//! What the probe prints: the human summary or JSON lines on stdout, progress on stderr.
//!
//! stdout carries results only. Under `--watch`, moves (and, with `--json`, one line per
//! finished round) are printed as they happen, so a person or a script can follow a long run;
//! the report comes last. Progress goes to stderr, and only when stderr is a terminal, the
//! output is not JSON, and the run has lasted over [`PROGRESS_AFTER`]: short runs and pipes
//! stay quiet. Write errors (a closed pipe) are ignored: the exit code still tells the result.

use std::fmt::Write as _;
use std::io::Write;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::judge::{
    Move, MoveKind, Outcome, SessionJudge, SessionVerdict, Summary, MIN_NAMED_ANSWERS,
};
use super::session::FreshUpgrade;
use super::Plan;

/// Progress starts after the run has taken this long.
const PROGRESS_AFTER: Duration = Duration::from_secs(2);
/// At most this many progress updates a second.
const PROGRESS_EVERY: Duration = Duration::from_millis(100);
/// The human report lists every session up to this many; beyond, only the notable ones.
const LIST_ALL_UP_TO: usize = 20;
/// Moves spelled out per session in the human report.
const MOVES_SHOWN: usize = 3;
/// The nodes column grows with the names up to this width; longer lists just run over.
const MAX_NODES_COLUMN: usize = 32;

/// Everything the final report says.
#[derive(Debug)]
pub(crate) struct Report<'a> {
    pub(crate) plan: &'a Plan,
    pub(crate) sessions: &'a [SessionVerdict],
    pub(crate) summary: &'a Summary,
    pub(crate) outcome: Outcome,
    pub(crate) exit_code: u8,
    pub(crate) rounds: u32,
    pub(crate) interrupted: bool,
    pub(crate) fresh: Option<&'a FreshUpgrade>,
    pub(crate) errors: &'a [String],
}

/// The printer for one run.
#[derive(Debug)]
pub(crate) struct Output {
    json: bool,
    watch: bool,
    progress: bool,
    start: Instant,
    last_progress: Option<Instant>,
}

#[derive(Serialize)]
struct MoveLine<'a> {
    event: &'static str,
    session: usize,
    #[serde(flatten)]
    r#move: &'a Move,
}

#[derive(Serialize)]
struct RoundLine<'a> {
    event: &'static str,
    round: u32,
    /// Each session's current node, by session id.
    nodes: Vec<Option<&'a str>>,
    repins: u32,
    breaks: u32,
}

#[derive(Serialize)]
struct SessionLine<'a> {
    id: usize,
    kept_affinity: bool,
    stayed_on_one_node: bool,
    judged: bool,
    #[serde(flatten)]
    verdict: &'a SessionVerdict,
}

#[derive(Serialize)]
struct ReportLine<'a> {
    event: &'static str,
    url: &'a str,
    ws: Option<&'a str>,
    node_header: &'a str,
    cookie_names: Vec<String>,
    /// Names of the `--header` lines sent (never their values).
    headers: &'a [String],
    /// Names of the `--cookie` pairs sent (never their values).
    cookies: &'a [String],
    requests: u32,
    watch: bool,
    rounds: u32,
    interrupted: bool,
    outcome: Outcome,
    exit_code: u8,
    /// What to try when the run could not pass; null otherwise.
    hint: Option<String>,
    summary: &'a Summary,
    fresh_upgrade: Option<&'a FreshUpgrade>,
    sessions: Vec<SessionLine<'a>>,
    errors: &'a [String],
}

fn out_line(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn json_line(value: &impl Serialize) {
    // Serialising these plain structs cannot fail; should it, a line is better lost than
    // the process.
    if let Ok(s) = serde_json::to_string(value) {
        out_line(&s);
    }
}

fn plural(n: u32, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn describe_move(m: &Move) -> String {
    format!(
        "{} -> {} (round {}, {})",
        m.from,
        m.to,
        m.round,
        m.via.as_str()
    )
}

impl Output {
    pub(crate) fn new(json: bool, watch: bool, progress: bool) -> Self {
        Output {
            json,
            watch,
            progress,
            start: Instant::now(),
            last_progress: None,
        }
    }

    /// A session changed node (printed under `--watch` only; the report lists every move).
    pub(crate) fn moved(&mut self, session: usize, m: &Move) {
        if !self.watch {
            return;
        }
        self.clear_progress();
        if self.json {
            json_line(&MoveLine {
                event: "move",
                session,
                r#move: m,
            });
        } else {
            let what = match m.kind {
                MoveKind::Repin => "re-pinned",
                MoveKind::Break => "BROKE affinity",
            };
            out_line(&format!("session {session} {what}: {}", describe_move(m)));
        }
    }

    /// Every session finished `round` (a JSON line under `--watch --json`).
    pub(crate) fn round(&mut self, round: u32, judges: &[SessionJudge]) {
        if !(self.watch && self.json) {
            return;
        }
        let (repins, breaks) = judges.iter().fold((0u32, 0u32), |(r, b), j| {
            let v = j.verdict();
            (r.saturating_add(v.repins), b.saturating_add(v.breaks))
        });
        json_line(&RoundLine {
            event: "round",
            round,
            nodes: judges.iter().map(SessionJudge::current_node).collect(),
            repins,
            breaks,
        });
    }

    /// One progress line on stderr, when wanted and due.
    pub(crate) fn progress(
        &mut self,
        plan: &Plan,
        rounds: u32,
        session_rounds: u64,
        summary: &Summary,
    ) {
        let now = Instant::now();
        if !self.progress
            || now.duration_since(self.start) < PROGRESS_AFTER
            || self
                .last_progress
                .is_some_and(|t| now.duration_since(t) < PROGRESS_EVERY)
        {
            return;
        }
        self.last_progress = Some(now);
        let of = if plan.rounds == u32::MAX {
            String::new()
        } else {
            format!("/{}", plan.rounds)
        };
        let line = format!(
            "limpet probe: round {rounds}{of}, {session_rounds} session-rounds, {} answers, {}, {}",
            summary.answers,
            plural(summary.repins, "re-pin", "re-pins"),
            plural(summary.breaks, "break", "breaks"),
        );
        let _ = write!(std::io::stderr(), "\r\x1b[2K{line}");
    }

    fn clear_progress(&mut self) {
        if self.last_progress.take().is_some() {
            let _ = write!(std::io::stderr(), "\r\x1b[2K");
        }
    }

    /// The final report.
    pub(crate) fn finish(&mut self, report: &Report<'_>) {
        self.clear_progress();
        if self.json {
            json_line(&report_line(report));
        } else {
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(human(report).as_bytes());
            let _ = out.flush();
        }
    }
}

fn report_line<'a>(r: &'a Report<'a>) -> ReportLine<'a> {
    ReportLine {
        event: "report",
        url: r.plan.url.as_str(),
        ws: r.plan.ws_url.as_ref().map(|u| u.as_str()),
        node_header: r.plan.node_header.as_str(),
        cookie_names: r
            .plan
            .names
            .patterns()
            .iter()
            .map(ToString::to_string)
            .collect(),
        headers: &r.plan.extra.header_names,
        cookies: &r.plan.extra.cookie_names,
        requests: r.plan.requests,
        watch: r.plan.watch,
        rounds: r.rounds,
        interrupted: r.interrupted,
        outcome: r.outcome,
        exit_code: r.exit_code,
        hint: hint(r),
        summary: r.summary,
        fresh_upgrade: r.fresh,
        sessions: r
            .sessions
            .iter()
            .enumerate()
            .map(|(id, v)| SessionLine {
                id,
                kept_affinity: v.kept_affinity(),
                stayed_on_one_node: v.stayed_on_one_node(),
                judged: v.judged(),
                verdict: v,
            })
            .collect(),
        errors: r.errors,
    }
}

/// What to try when a run cannot pass, from what its answers did and did not show.
pub(crate) fn hint(r: &Report<'_>) -> Option<String> {
    let s = r.summary;
    let h = r.plan.node_header.as_str();
    match r.outcome {
        // A balancer whose cookie the probe could not keep breaks every session as one
        // that is not sticky does: say which cookies, and why.
        Outcome::Broken if !s.refused_cookies.is_empty() => Some(format!(
            "answers set cookies the probe did not keep ({}): give the balancer's cookie \
             name with --cookie-names, or probe over https:// for a Secure one",
            s.refused_cookies.join("; ")
        )),
        Outcome::Kept | Outcome::Broken => None,
        Outcome::Unreachable => Some(format!(
            "check the URL, and that the balancer listens there{}",
            if r.plan.tls.is_some() {
                " (and, for a private CA, --ca FILE)"
            } else {
                ""
            }
        )),
        // Discovery alone: one answer per session whatever the balancer does.
        Outcome::Unjudged if r.plan.requests == 0 && r.plan.ws_url.is_none() => Some(format!(
            "with --requests 0 and no --ws each session has one answer, its discovery; a \
             session needs {MIN_NAMED_ANSWERS} answers naming its node: ask for --requests 1 \
             or more"
        )),
        // A login in front of the app answers for it, naming no node.
        Outcome::Unjudged if s.denied > 0 => Some(format!(
            "{} without a node {} 401 or 403: if the app is behind a login, pass its \
             credentials with --header (e.g. 'Authorization: Bearer TOKEN') or --cookie \
             (e.g. 'session=...')",
            plural(s.denied, "answer", "answers"),
            if s.denied == 1 { "was" } else { "were" },
        )),
        Outcome::Unjudged if s.judged == s.sessions && r.plan.ws_url.is_some() && s.upgrades == 0 => Some(
            "--ws was asked, but no WebSocket upgrade was accepted, so the WebSocket's affinity \
             was not checked: see the errors above (is the --ws path right?)"
                .to_owned(),
        ),
        Outcome::Unjudged if s.named_by_header == 0 => Some(format!(
            "no answer carried the node header {h}{}: is --node-header right? Pass the header \
             your nodes set to name themselves with --node-header NAME",
            if s.answers > 0 {
                " (only WebSocket first frames named a node)"
            } else {
                ""
            }
        )),
        Outcome::Unjudged => Some(format!(
            "a session needs {MIN_NAMED_ANSWERS} answers naming its node to show it stayed; \
             answers without the header {h} or without any answer do not count: is \
             --node-header right on every node? See the errors above, or send more --requests"
        )),
    }
}

/// One session's verdict in words.
fn session_words(v: &SessionVerdict) -> String {
    let mut s = if v.breaks > 0 {
        format!("BROKEN, {}", plural(v.breaks, "break", "breaks"))
    } else if !v.judged() {
        match v.answers {
            0 => "UNJUDGED, no answer named its node".to_owned(),
            n => format!(
                "UNJUDGED, only {} named its node",
                plural(n, "answer", "answers")
            ),
        }
    } else {
        "kept".to_owned()
    };
    if v.repins > 0 {
        let _ = write!(s, ", {}", plural(v.repins, "re-pin", "re-pins"));
    }
    if !v.moves.is_empty() {
        // Name each move's kind only when both kinds occur; otherwise the counts say it.
        let mixed = v.repins > 0 && v.breaks > 0;
        let shown: Vec<String> = v
            .moves
            .iter()
            .take(MOVES_SHOWN)
            .map(|m| {
                let kind = match (mixed, m.kind) {
                    (false, _) => "",
                    (true, MoveKind::Repin) => "re-pin ",
                    (true, MoveKind::Break) => "break ",
                };
                format!("{kind}{}", describe_move(m))
            })
            .collect();
        let more = if v.repins.saturating_add(v.breaks) as usize > MOVES_SHOWN {
            ", ..."
        } else {
            ""
        };
        let _ = write!(s, ": {}{more}", shown.join(", "));
    }
    let mut trouble = Vec::new();
    if v.unidentified > 0 {
        trouble.push(format!("{} without a node", v.unidentified));
    }
    if v.no_answer > 0 {
        trouble.push(format!("{} unanswered", v.no_answer));
    }
    if v.socket_closes > 0 {
        trouble.push(plural(v.socket_closes, "socket close", "socket closes"));
    }
    if v.split > 0 {
        trouble.push(format!("{} away from the socket", v.split));
    }
    if v.ended_split {
        trouble.push("ended with its socket on another node".to_owned());
    }
    if !trouble.is_empty() {
        let _ = write!(s, " [{}]", trouble.join(", "));
    }
    s
}

fn notable(v: &SessionVerdict) -> bool {
    !v.judged()
        || v.repins > 0
        || v.breaks > 0
        || v.unidentified > 0
        || v.no_answer > 0
        || v.socket_closes > 0
        || v.split > 0
        || v.ended_split
}

/// The human summary.
pub(crate) fn human(r: &Report<'_>) -> String {
    let p = r.plan;
    let s = r.summary;
    let mut o = String::new();
    let mut steps = vec!["discovery".to_owned()];
    if let Some(ws) = &p.ws_url {
        steps.push(format!("WebSocket {ws}"));
    }
    steps.push(plural(p.requests, "request", "requests"));
    let _ = writeln!(
        o,
        "limpet probe {}: {} x ({}), {}{}",
        p.url,
        plural(p.sessions, "session", "sessions"),
        steps.join(", "),
        plural(r.rounds, "round", "rounds"),
        if r.interrupted { " (interrupted)" } else { "" },
    );
    let names: Vec<String> = p.names.patterns().iter().map(ToString::to_string).collect();
    let _ = writeln!(
        o,
        "node named by header {}{}; balancer cookies: {}",
        p.node_header,
        if p.ws_url.is_some() {
            " (a WebSocket's 101 too; without it, the socket's first text frame)"
        } else {
            ""
        },
        names.join(", ")
    );
    let extra = &p.extra;
    if !(extra.header_names.is_empty() && extra.cookie_names.is_empty()) {
        let mut sent = Vec::new();
        if !extra.header_names.is_empty() {
            sent.push(format!("headers {}", extra.header_names.join(", ")));
        }
        if !extra.cookie_names.is_empty() {
            sent.push(format!("cookies {}", extra.cookie_names.join(", ")));
        }
        let _ = writeln!(o, "sent with every request: {}", sent.join("; "));
    }
    o.push('\n');

    let listed: Vec<(usize, &SessionVerdict)> = r
        .sessions
        .iter()
        .enumerate()
        .filter(|(_, v)| r.sessions.len() <= LIST_ALL_UP_TO || notable(v))
        .take(LIST_ALL_UP_TO)
        .collect();
    if !listed.is_empty() {
        let nodes: Vec<String> = listed
            .iter()
            .map(|(_, v)| {
                if v.nodes.is_empty() {
                    "-".to_owned()
                } else {
                    v.nodes.join(",")
                }
            })
            .collect();
        let width = nodes
            .iter()
            .map(|n| n.chars().count())
            .max()
            .unwrap_or(0)
            .clamp("nodes".len(), MAX_NODES_COLUMN);
        let _ = writeln!(o, "session  {:<width$}  answers  verdict", "nodes");
        for ((id, v), nodes) in listed.iter().zip(&nodes) {
            let _ = writeln!(
                o,
                "{id:>7}  {nodes:<width$}  {:>7}  {}",
                v.answers,
                session_words(v)
            );
        }
    }
    let hidden = r.sessions.len() - listed.len();
    if hidden > 0 {
        let _ = writeln!(o, "({hidden} more sessions not listed)");
    }
    o.push('\n');

    let spread: Vec<String> = s.spread.iter().map(|(n, c)| format!("{n} {c}")).collect();
    let _ = writeln!(
        o,
        "fresh sessions per node: {}",
        if spread.is_empty() {
            "-".to_owned()
        } else {
            spread.join(", ")
        }
    );
    if p.ws_url.is_some() {
        let t = s.cookie_on_101;
        let _ = writeln!(
            o,
            "cookie on the 101: set for {}, not set for {}, no 101 for {} (after discovery a \
             session already holds its pin)",
            plural(t.yes, "session", "sessions"),
            t.no,
            t.unknown
        );
        let fresh = match r.fresh {
            Some(FreshUpgrade {
                status: Some(101),
                node,
                cookie_set,
            }) => format!(
                "101 from {}, cookie {}",
                node.as_deref().unwrap_or("an unnamed node"),
                if *cookie_set { "set" } else { "NOT set" }
            ),
            Some(FreshUpgrade {
                status: Some(st),
                cookie_set,
                ..
            }) => format!(
                "refused with {st}, cookie {}",
                if *cookie_set { "set" } else { "not set" }
            ),
            Some(FreshUpgrade { status: None, .. }) | None => "no answer".to_owned(),
        };
        let _ = writeln!(o, "cookie-less upgrade: {fresh}");
    }
    let _ = writeln!(
        o,
        "answers: {} named their node, {} did not, {} unanswered; {}",
        s.answers,
        s.unidentified,
        s.no_answer,
        plural(s.socket_closes, "socket close", "socket closes")
    );
    let _ = writeln!(
        o,
        "moves: {}, {}",
        plural(s.repins, "re-pin", "re-pins"),
        plural(s.breaks, "break", "breaks")
    );
    if s.split > 0 {
        let _ = writeln!(
            o,
            "split: {} from another node than their session's open WebSocket{}",
            plural(s.split, "HTTP answer", "HTTP answers"),
            if s.breaks == 0 && s.ended_split == 0 {
                " (after a re-pin, until the old socket closed)"
            } else {
                ""
            }
        );
    }
    if s.ended_split > 0 {
        let _ = writeln!(
            o,
            "ended split: {} with its WebSocket still open on another node than its requests \
             went to ({} s after the last): every claim there would fail",
            plural(s.ended_split, "session", "sessions"),
            super::session::SPLIT_GRACE.as_secs()
        );
    }
    for e in r.errors {
        let _ = writeln!(o, "error: {e}");
    }
    let verdict = match r.outcome {
        Outcome::Kept => format!(
            "PASS: every session kept affinity ({} of {} stayed on one node; re-pins are the \
             balancer moving a session cleanly)",
            s.stayed_on_one_node, s.sessions
        ),
        Outcome::Broken => format!(
            "FAIL: {} of {} broke affinity ({}{})",
            s.sessions - s.kept_affinity,
            plural(s.sessions, "session", "sessions"),
            plural(s.breaks, "break", "breaks"),
            if s.ended_split > 0 {
                format!(", {} ended split", s.ended_split)
            } else {
                String::new()
            }
        ),
        Outcome::Unjudged if s.judged == s.sessions => {
            "CANNOT JUDGE: no WebSocket upgrade was accepted".to_owned()
        }
        Outcome::Unjudged => format!(
            "CANNOT JUDGE: {} of {} fewer than {MIN_NAMED_ANSWERS} answers naming a node ({} \
             of {} answers named one)",
            s.sessions - s.judged,
            plural(s.sessions, "session had", "sessions had"),
            s.answers,
            s.answers.saturating_add(s.unidentified),
        ),
        Outcome::Unreachable => format!("CANNOT JUDGE: nothing answered at {}", p.url),
    };
    let _ = writeln!(o, "{verdict}");
    if let Some(h) = hint(r) {
        let _ = writeln!(o, "hint: {h}");
    }
    o
}
