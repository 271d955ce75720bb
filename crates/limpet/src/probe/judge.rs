//! The probe's verdict, with no I/O: what a sequence of observations says about affinity.
//!
//! A session's driver turns every answer into an [`Event`] (which node served it, whether the
//! balancer's cookie changed) and feeds it to that session's [`SessionJudge`], which answers
//! at once with the [`Move`] it makes, if any, so `--watch` can report moves as they happen.
//! [`summarise`] then folds the sessions' [`SessionVerdict`]s into the run's [`Summary`].
//!
//! # The rules
//! - The node of an answer is what the backend says (the node header, or the WebSocket's first
//!   text frame). Answers whose node is unknown (no answer, no header) never move a session:
//!   the probe cannot tell where they went, so it does not guess.
//! - A **move** is an identified answer from another node than the session's previous
//!   identified answer.
//! - A move is a **re-pin** when the balancer rewrote its cookie (set, changed or removed it)
//!   on the answer that showed the new node or on any answer since the last identified one;
//!   otherwise it is a **break**. The window covers a balancer that re-pins on an answer the
//!   probe cannot attribute (a refused upgrade from the balancer itself, say) and serves the
//!   next request from the new node. It does not reach further back: a cookie refreshed on the
//!   old node says nothing about a later move.
//! - A re-pin must **hold**: the session's next identified answer must come from the node it
//!   was just moved to. A move on that next answer is a break even with a rewrite: the
//!   balancer did not honour the pin it had just written. Without this rule a balancer that
//!   ignores its cookie and sets a new one on every answer (round-robin with a cookie of
//!   its own) passed with every move a "re-pin". A balancer that moves a session because
//!   its node stopped keeps it on the new node, unless that one stops too before the
//!   session's next request: a double failure the probe then reports as a break. One
//!   exception: a move that also removes one of the balancer's cookies is clean, as
//!   limpet's failback is (the session goes home and its `route-home` expires, which can
//!   come on the very next answer when the home node was out only briefly).
//! - A session **kept affinity** when it has no break. Re-pins are allowed: they are the
//!   balancer moving a session cleanly, cookie and all.
//! - A session is **judged** when at least [`MIN_NAMED_ANSWERS`] of its answers named their
//!   node: with one, no move can show, so a balancer that is not sticky at all would pass.
//!   A run passes only when every session is judged (a break fails it whatever the rest).
//! - The **spread** counts each session once, under the node of its first identified answer
//!   (its discovery, unless that failed): where the balancer puts a fresh session.
//! - A **split** is an HTTP answer from another node than the one holding the session's open
//!   WebSocket: the failure the affinity reference starts from (claims on one node, socket on
//!   another). Right after a re-pin a socket on the old node is expected until it closes, so
//!   a split alone does not decide the verdict; a session that **ends split** (its socket
//!   still open on another node than its last HTTP answer's, after a grace for the close to
//!   come) broke affinity: every claim from then on fails.

use std::collections::BTreeMap;

use serde::Serialize;

/// At most this many moves are kept per session; beyond it they are only counted, so a long
/// `--watch` against a balancer that never sticks keeps its memory bounded.
pub const MAX_MOVES_KEPT: usize = 100;
/// At most this many distinct nodes are listed per session (a server that names itself
/// differently on every answer must not grow the report without bound).
pub const MAX_NODES_KEPT: usize = 64;
/// A session needs this many answers naming their node before it can pass: a move is a
/// difference between two of them. (The reported case: a wrong node header, so only the
/// WebSocket's first frame named a node, one per session, and a balancer that was not sticky
/// passed.)
pub const MIN_NAMED_ANSWERS: u32 = 2;

/// Which request of a session produced an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Via {
    /// The HTTP request that runs before each upgrade (and first, for every session).
    Discovery,
    /// The WebSocket upgrade (its node is the 101's node header, or without one the socket's
    /// first text frame).
    Upgrade,
    /// One of the `--requests` HTTP requests of a round.
    Request,
}

impl Via {
    /// The name used in the human output and the JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Via::Discovery => "discovery",
            Via::Upgrade => "upgrade",
            Via::Request => "request",
        }
    }
}

/// One answer (or the lack of one) as the session's driver saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// The round it belongs to, from 0.
    pub round: u32,
    /// What was sent.
    pub via: Via,
    /// The status; `None` when there was no answer (connection failed, timed out).
    pub status: Option<u16>,
    /// The node that served it; `None` when it could not be identified.
    pub node: Option<String>,
    /// `node` is the node header's (not a socket's first text frame).
    pub by_header: bool,
    /// The session's jar took a balancer cookie from the answer (stored it or rewrote it, a
    /// repeat included). One the jar refuses (`Secure` over `http://`, a `Path` other than
    /// `/`, another `Domain`...) pins nothing and is not counted.
    pub cookie_set: bool,
    /// After this answer the session holds different balancer cookies than before it (one was
    /// set, given a new value, or removed). A `Set-Cookie` repeating the held value is not a
    /// rewrite.
    pub rewritten: bool,
    /// The answer expired a balancer cookie held before it, and the jar removed it (e.g.
    /// limpet's `route-home` once a session is home again). Only a balancer that keeps track
    /// of the session removes one; a deletion the jar refuses (`Path=/x`) removes nothing.
    pub removed: bool,
    /// A cookie the answer set that the jar did not keep, and why (`SRV: not a
    /// --cookie-names name`, `route: Secure over http://`): what a run that broke shows, so
    /// that a balancer whose cookie the probe cannot keep is told from one that is not sticky.
    pub refused: Option<String>,
}

/// Something that happened to a session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// An answer, or the lack of one.
    Answer(Answer),
    /// The session's open WebSocket closed (the driver reconnects it under `--watch`).
    SocketClosed {
        /// The round during (or after) which it closed.
        round: u32,
    },
}

/// Re-pin or break.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MoveKind {
    /// The node changed and the balancer rewrote its cookie: a clean move.
    Repin,
    /// The node changed and the cookie did not: affinity broken.
    Break,
}

/// A session changing node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Move {
    /// Re-pin or break.
    pub kind: MoveKind,
    /// The round of the answer that showed the new node.
    pub round: u32,
    /// What was sent when the new node showed.
    pub via: Via,
    /// The previous node.
    pub from: String,
    /// The new node.
    pub to: String,
}

/// What one session's events add up to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SessionVerdict {
    /// The node of the session's first identified answer: where the balancer put it.
    pub first_node: Option<String>,
    /// The node of its latest identified answer.
    pub last_node: Option<String>,
    /// Every node that served it, in the order first seen (at most [`MAX_NODES_KEPT`]).
    pub nodes: Vec<String>,
    /// Moves counted as re-pins.
    pub repins: u32,
    /// Moves counted as breaks.
    pub breaks: u32,
    /// The moves, in order (at most [`MAX_MOVES_KEPT`]; the counts above are complete).
    pub moves: Vec<Move>,
    /// HTTP answers from another node than the one holding the session's open WebSocket.
    pub split: u32,
    /// The session ended with its WebSocket open on another node than its last HTTP
    /// answer's: the socket outlived the re-pin for good.
    pub ended_split: bool,
    /// Answers whose node was identified.
    pub answers: u32,
    /// Of `answers`, those named by the node header (the rest by a WebSocket's first frame):
    /// zero with answers elsewhere points at a wrong `--node-header`.
    pub named_by_header: u32,
    /// Answers whose node could not be identified (no node header, no first text frame).
    pub unidentified: u32,
    /// Of `unidentified`, those with status 401 or 403: a login in front of the app, which
    /// `--header` or `--cookie` get past.
    pub denied: u32,
    /// Requests and upgrades that got no answer at all.
    pub no_answer: u32,
    /// Accepted upgrades (101).
    pub upgrades: u32,
    /// Times the open WebSocket closed.
    pub socket_closes: u32,
    /// Whether the session's first accepted upgrade (101) carried the balancer's cookie;
    /// `None` when no upgrade was accepted (no `--ws`, or every attempt refused).
    pub cookie_on_101: Option<bool>,
    /// Cookies its answers set that the jar did not keep, and why (distinct, at most
    /// [`MAX_REFUSED_KEPT`]).
    pub refused_cookies: Vec<String>,
}

/// At most this many distinct refused cookies are kept per session and per run.
pub const MAX_REFUSED_KEPT: usize = 4;

/// Adds `r` to `to` unless it is there or `to` is full.
fn keep_refused(to: &mut Vec<String>, r: &str) {
    if to.len() < MAX_REFUSED_KEPT && !to.iter().any(|k| k == r) {
        to.push(r.to_owned());
    }
}

impl SessionVerdict {
    /// No break: every move, if any, was a re-pin, and the session did not end split.
    pub fn kept_affinity(&self) -> bool {
        self.breaks == 0 && !self.ended_split
    }

    /// Every identified answer came from one node.
    pub fn stayed_on_one_node(&self) -> bool {
        self.nodes.len() <= 1
    }

    /// Enough answers named their node to show a move, had there been one.
    pub fn judged(&self) -> bool {
        self.answers >= MIN_NAMED_ANSWERS
    }
}

/// Judges one session, one event at a time.
#[derive(Clone, Debug, Default)]
pub struct SessionJudge {
    verdict: SessionVerdict,
    /// The balancer rewrote its cookie since the last identified answer (that one included).
    rewrite_pending: bool,
    /// The node holding the open WebSocket, if one is open and greeted.
    socket_node: Option<String>,
    /// The node of the latest identified HTTP answer (not an upgrade's).
    last_http_node: Option<String>,
    /// The last identified answer was a re-pin, which the next one must hold.
    repin_to_hold: bool,
    /// The balancer removed one of its cookies since the last identified answer (that one
    /// included).
    removal_pending: bool,
}

impl SessionJudge {
    /// A session that has seen nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes the next event; returns the move it makes, if any.
    pub fn observe(&mut self, event: &Event) -> Option<Move> {
        let v = &mut self.verdict;
        let answer = match event {
            Event::SocketClosed { .. } => {
                v.socket_closes = v.socket_closes.saturating_add(1);
                self.socket_node = None;
                return None;
            }
            Event::Answer(a) => a,
        };
        if answer.via == Via::Upgrade && answer.status == Some(101) {
            v.upgrades = v.upgrades.saturating_add(1);
            v.cookie_on_101.get_or_insert(answer.cookie_set);
            self.socket_node.clone_from(&answer.node);
        }
        if let Some(r) = &answer.refused {
            keep_refused(&mut v.refused_cookies, r);
        }
        self.rewrite_pending |= answer.rewritten;
        self.removal_pending |= answer.removed;
        let Some(node) = &answer.node else {
            if let Some(status) = answer.status {
                v.unidentified = v.unidentified.saturating_add(1);
                if matches!(status, 401 | 403) {
                    v.denied = v.denied.saturating_add(1);
                }
            } else {
                v.no_answer = v.no_answer.saturating_add(1);
            }
            return None;
        };
        v.answers = v.answers.saturating_add(1);
        if answer.by_header {
            v.named_by_header = v.named_by_header.saturating_add(1);
        }
        if answer.via != Via::Upgrade {
            if self.socket_node.as_ref().is_some_and(|s| s != node) {
                v.split = v.split.saturating_add(1);
            }
            self.last_http_node = Some(node.clone());
        }
        if v.first_node.is_none() {
            v.first_node = Some(node.clone());
        }
        if !v.nodes.contains(node) && v.nodes.len() < MAX_NODES_KEPT {
            v.nodes.push(node.clone());
        }
        let moved = match &v.last_node {
            Some(prev) if prev != node => {
                // A move right after a re-pin is clean only if the balancer also removed a
                // cookie of its own: limpet's failback takes a session home and expires its
                // `route-home`, which a balancer that ignores its cookie never does.
                let held = !self.repin_to_hold || self.removal_pending;
                let kind = if self.rewrite_pending && held {
                    MoveKind::Repin
                } else {
                    MoveKind::Break
                };
                Some(Move {
                    kind,
                    round: answer.round,
                    via: answer.via,
                    from: prev.clone(),
                    to: node.clone(),
                })
            }
            _ => None,
        };
        if let Some(m) = &moved {
            match m.kind {
                MoveKind::Repin => v.repins = v.repins.saturating_add(1),
                MoveKind::Break => v.breaks = v.breaks.saturating_add(1),
            }
            if v.moves.len() < MAX_MOVES_KEPT {
                v.moves.push(m.clone());
            }
        }
        v.last_node = Some(node.clone());
        self.rewrite_pending = false;
        self.removal_pending = false;
        self.repin_to_hold = moved.as_ref().is_some_and(|m| m.kind == MoveKind::Repin);
        moved
    }

    /// The verdict so far.
    pub fn verdict(&self) -> &SessionVerdict {
        &self.verdict
    }

    /// The node the session is on now (its latest identified answer's).
    pub fn current_node(&self) -> Option<&str> {
        self.verdict.last_node.as_deref()
    }

    /// Whether the open WebSocket is on another node than the latest HTTP answer's.
    pub fn split_now(&self) -> bool {
        matches!((&self.socket_node, &self.last_http_node), (Some(s), Some(h)) if s != h)
    }

    /// The final verdict: a session still split at its end broke affinity.
    pub fn finish(mut self) -> SessionVerdict {
        self.verdict.ended_split = self.split_now();
        self.verdict
    }
}

/// Judges a whole sequence of one session's events.
pub fn judge<'a>(events: impl IntoIterator<Item = &'a Event>) -> SessionVerdict {
    let mut j = SessionJudge::new();
    for e in events {
        j.observe(e);
    }
    j.finish()
}

/// Sessions counted yes / no / unknown.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Tally {
    /// Sessions for which it was so.
    pub yes: u32,
    /// Sessions for which it was not.
    pub no: u32,
    /// Sessions for which it cannot be said.
    pub unknown: u32,
}

impl Tally {
    fn add(&mut self, v: Option<bool>) {
        let slot = match v {
            Some(true) => &mut self.yes,
            Some(false) => &mut self.no,
            None => &mut self.unknown,
        };
        *slot = slot.saturating_add(1);
    }
}

/// How the whole run went.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Every session kept affinity (re-pins allowed) and was judged: at least
    /// [`MIN_NAMED_ANSWERS`] of its answers named their node.
    Kept,
    /// At least one session broke affinity.
    Broken,
    /// Answers came, but some session had fewer than [`MIN_NAMED_ANSWERS`] naming their node
    /// (wrong `--node-header`?), and none broke: too little to pass.
    Unjudged,
    /// Nothing answered at all.
    Unreachable,
}

/// The run's totals.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// Sessions run.
    pub sessions: u32,
    /// Sessions with at least [`MIN_NAMED_ANSWERS`] answers naming their node.
    pub judged: u32,
    /// Sessions without a break.
    pub kept_affinity: u32,
    /// Sessions all of whose identified answers came from one node.
    pub stayed_on_one_node: u32,
    /// Fresh sessions per node (the node of each session's first identified answer).
    pub spread: BTreeMap<String, u32>,
    /// Re-pins over all sessions.
    pub repins: u32,
    /// Breaks over all sessions.
    pub breaks: u32,
    /// Split answers over all sessions.
    pub split: u32,
    /// Sessions that ended split.
    pub ended_split: u32,
    /// Identified answers over all sessions.
    pub answers: u32,
    /// Of `answers`, those named by the node header.
    pub named_by_header: u32,
    /// Answers whose node could not be identified.
    pub unidentified: u32,
    /// Of `unidentified`, those with status 401 or 403.
    pub denied: u32,
    /// Requests and upgrades without an answer.
    pub no_answer: u32,
    /// WebSocket closures.
    pub socket_closes: u32,
    /// Per session, whether its first accepted upgrade carried the balancer's cookie.
    pub cookie_on_101: Tally,
    /// Accepted WebSocket upgrades over all sessions.
    pub upgrades: u32,
    /// Cookies answers set that the sessions' jars did not keep, and why (distinct, at most
    /// [`MAX_REFUSED_KEPT`]).
    pub refused_cookies: Vec<String>,
}

impl Summary {
    /// Kept, broken, or why the run cannot pass. A break is evidence on its own; a pass
    /// needs every session judged.
    pub fn outcome(&self) -> Outcome {
        if self.breaks > 0 || self.ended_split > 0 {
            Outcome::Broken
        } else if self.answers == 0 && self.unidentified == 0 {
            Outcome::Unreachable
        } else if self.judged < self.sessions {
            Outcome::Unjudged
        } else {
            Outcome::Kept
        }
    }

    /// [`outcome`](Self::outcome) for a run that asked for WebSockets (`--ws`): a run in which
    /// no upgrade was accepted did not check what it was asked to check, so it cannot pass.
    pub fn outcome_with_ws(&self, ws_asked: bool) -> Outcome {
        match self.outcome() {
            Outcome::Kept if ws_asked && self.upgrades == 0 => Outcome::Unjudged,
            o => o,
        }
    }
}

/// Folds the sessions' verdicts into the run's totals.
pub fn summarise<'a>(sessions: impl IntoIterator<Item = &'a SessionVerdict>) -> Summary {
    let mut s = Summary::default();
    for v in sessions {
        s.sessions = s.sessions.saturating_add(1);
        if v.kept_affinity() {
            s.kept_affinity = s.kept_affinity.saturating_add(1);
        }
        if v.stayed_on_one_node() {
            s.stayed_on_one_node = s.stayed_on_one_node.saturating_add(1);
        }
        if v.judged() {
            s.judged = s.judged.saturating_add(1);
        }
        if let Some(n) = &v.first_node {
            let c = s.spread.entry(n.clone()).or_default();
            *c = c.saturating_add(1);
        }
        s.repins = s.repins.saturating_add(v.repins);
        s.breaks = s.breaks.saturating_add(v.breaks);
        s.split = s.split.saturating_add(v.split);
        s.ended_split = s.ended_split.saturating_add(u32::from(v.ended_split));
        s.answers = s.answers.saturating_add(v.answers);
        s.named_by_header = s.named_by_header.saturating_add(v.named_by_header);
        s.unidentified = s.unidentified.saturating_add(v.unidentified);
        s.denied = s.denied.saturating_add(v.denied);
        s.no_answer = s.no_answer.saturating_add(v.no_answer);
        s.socket_closes = s.socket_closes.saturating_add(v.socket_closes);
        s.cookie_on_101.add(v.cookie_on_101);
        s.upgrades = s.upgrades.saturating_add(v.upgrades);
        for r in &v.refused_cookies {
            keep_refused(&mut s.refused_cookies, r);
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(round: u32, via: Via, node: &str) -> Event {
        Event::Answer(Answer {
            round,
            via,
            status: Some(if via == Via::Upgrade { 101 } else { 200 }),
            node: Some(node.to_owned()),
            // As limpet's nodes name themselves: an accepted socket by its first frame.
            by_header: via != Via::Upgrade,
            cookie_set: false,
            rewritten: false,
            removed: false,
            refused: None,
        })
    }

    /// An answer on which the balancer set a new cookie value.
    fn pinned(round: u32, via: Via, node: &str) -> Event {
        match at(round, via, node) {
            Event::Answer(a) => Event::Answer(Answer {
                cookie_set: true,
                rewritten: true,
                ..a
            }),
            e => e,
        }
    }

    fn unidentified(round: u32, status: Option<u16>, rewritten: bool) -> Event {
        Event::Answer(Answer {
            round,
            via: Via::Request,
            status,
            node: None,
            by_header: false,
            cookie_set: rewritten,
            rewritten,
            removed: false,
            refused: None,
        })
    }

    #[test]
    fn a_session_that_stays_keeps_affinity() {
        let events = [
            pinned(0, Via::Discovery, "a"),
            at(0, Via::Upgrade, "a"),
            at(0, Via::Request, "a"),
            at(0, Via::Request, "a"),
        ];
        let v = judge(&events);
        assert!(v.kept_affinity() && v.stayed_on_one_node());
        assert_eq!(v.first_node.as_deref(), Some("a"));
        assert_eq!((v.answers, v.repins, v.breaks, v.upgrades), (4, 0, 0, 1));
        assert_eq!(v.nodes, ["a"]);
        assert!(v.moves.is_empty());
    }

    #[test]
    fn a_node_change_with_a_rewritten_cookie_is_a_repin() {
        let mut j = SessionJudge::new();
        assert_eq!(j.observe(&pinned(0, Via::Discovery, "a")), None);
        assert_eq!(j.observe(&at(0, Via::Request, "a")), None);
        let m = j.observe(&pinned(3, Via::Request, "b"));
        assert_eq!(
            m,
            Some(Move {
                kind: MoveKind::Repin,
                round: 3,
                via: Via::Request,
                from: "a".into(),
                to: "b".into(),
            })
        );
        assert_eq!(j.current_node(), Some("b"));
        let v = j.finish();
        assert!(v.kept_affinity());
        assert!(!v.stayed_on_one_node());
        assert_eq!((v.repins, v.breaks), (1, 0));
        assert_eq!(v.nodes, ["a", "b"]);
    }

    /// A balancer that ignores its cookie and sets a new one on every answer moves the
    /// session on nearly every request: each move after a re-pin that did not hold is a
    /// break. One that re-pins and keeps the session where it put it passes.
    #[test]
    fn a_repin_the_next_answer_does_not_hold_is_followed_by_a_break() {
        let churn = [
            pinned(0, Via::Discovery, "a"),
            pinned(0, Via::Request, "b"),
            pinned(0, Via::Request, "c"),
            pinned(0, Via::Request, "a"),
            pinned(0, Via::Request, "b"),
        ];
        let v = judge(&churn);
        assert_eq!((v.repins, v.breaks), (2, 2), "{:?}", v.moves);
        assert!(!v.kept_affinity());
        let kinds: Vec<MoveKind> = v.moves.iter().map(|m| m.kind).collect();
        assert_eq!(
            kinds,
            [
                MoveKind::Repin,
                MoveKind::Break,
                MoveKind::Repin,
                MoveKind::Break
            ]
        );

        let held = [
            pinned(0, Via::Discovery, "a"),
            pinned(1, Via::Request, "b"),
            at(1, Via::Request, "b"),
            pinned(2, Via::Request, "c"),
            at(2, Via::Request, "c"),
        ];
        let v = judge(&held);
        assert_eq!((v.repins, v.breaks), (2, 0), "{:?}", v.moves);
        assert!(v.kept_affinity());

        // limpet's failback: moved to b while a was out, home on the very next answer, which
        // expires `route-home`: clean.
        let home_again = match pinned(2, Via::Request, "a") {
            Event::Answer(a) => Event::Answer(Answer { removed: true, ..a }),
            e => e,
        };
        let failback = [
            pinned(0, Via::Discovery, "a"),
            pinned(1, Via::Request, "b"),
            home_again,
            at(2, Via::Request, "a"),
        ];
        let v = judge(&failback);
        assert_eq!((v.repins, v.breaks), (2, 0), "{:?}", v.moves);
    }

    #[test]
    fn a_node_change_without_a_rewrite_is_a_break() {
        let events = [
            pinned(0, Via::Discovery, "a"),
            at(0, Via::Upgrade, "b"),
            at(0, Via::Request, "a"),
        ];
        let v = judge(&events);
        assert!(!v.kept_affinity());
        assert_eq!((v.repins, v.breaks), (0, 2));
        assert_eq!(v.moves[0].kind, MoveKind::Break);
        assert_eq!(
            (v.moves[0].via, v.moves[1].via),
            (Via::Upgrade, Via::Request)
        );
    }

    #[test]
    fn http_away_from_the_open_socket_is_a_split_until_it_closes() {
        let events = [
            pinned(0, Via::Discovery, "a"),
            at(0, Via::Upgrade, "a"),
            at(0, Via::Request, "a"),
            // Re-pinned while the socket is still open on a.
            pinned(1, Via::Request, "b"),
            at(1, Via::Request, "b"),
            Event::SocketClosed { round: 1 },
            at(2, Via::Request, "b"),
            at(2, Via::Discovery, "b"),
            at(2, Via::Upgrade, "b"),
            at(2, Via::Request, "b"),
        ];
        let v = judge(&events);
        assert_eq!((v.repins, v.breaks, v.split), (1, 0, 2));
        assert!(!v.ended_split && v.kept_affinity());
        assert_eq!(summarise(&[v]).split, 2);
    }

    /// A session whose socket stays open on its old node after a re-pin, to the session's
    /// end, broke affinity: every claim from then on meets the node without the socket (the
    /// affinity reference's 409). Before, it passed, reported as a split "until the old
    /// socket closed" though it never did.
    #[test]
    fn a_session_that_ends_split_broke_affinity() {
        let events = [
            pinned(0, Via::Discovery, "a"),
            at(0, Via::Upgrade, "a"),
            at(0, Via::Request, "a"),
            pinned(1, Via::Request, "b"),
            at(1, Via::Request, "b"),
            at(2, Via::Request, "b"),
        ];
        let v = judge(&events);
        assert_eq!((v.repins, v.breaks, v.split), (1, 0, 3));
        assert!(v.ended_split && !v.kept_affinity());
        let s = summarise(&[v]);
        assert_eq!((s.ended_split, s.outcome()), (1, Outcome::Broken));
        // A socket that follows the session to its new node ends whole.
        let mut moved = events.to_vec();
        moved.push(Event::SocketClosed { round: 2 });
        moved.push(at(2, Via::Upgrade, "b"));
        assert!(!judge(&moved).ended_split);
    }

    #[test]
    fn the_first_pin_is_not_a_move() {
        let v = judge(&[pinned(0, Via::Discovery, "c")]);
        assert_eq!((v.repins, v.breaks, v.moves.len()), (0, 0, 0));
    }

    #[test]
    fn a_rewrite_on_an_unattributed_answer_covers_the_next_move() {
        // The balancer refuses on its own (no node header) but re-pins in that answer; the
        // next answer comes from the new node without a cookie: a clean move.
        let events = [
            pinned(0, Via::Discovery, "a"),
            unidentified(1, Some(503), true),
            at(1, Via::Request, "b"),
        ];
        let v = judge(&events);
        assert_eq!((v.repins, v.breaks, v.unidentified), (1, 0, 1));
    }

    #[test]
    fn a_rewrite_on_the_old_node_does_not_excuse_a_later_move() {
        // A refreshed cookie (same node) followed by a move with no rewrite: a break.
        let events = [
            pinned(0, Via::Discovery, "a"),
            pinned(1, Via::Request, "a"),
            at(2, Via::Request, "b"),
        ];
        let v = judge(&events);
        assert_eq!((v.repins, v.breaks), (0, 1));
    }

    #[test]
    fn unknown_answers_never_move_a_session() {
        let events = [
            pinned(0, Via::Discovery, "a"),
            unidentified(0, None, false),
            unidentified(0, Some(502), false),
            Event::SocketClosed { round: 0 },
            at(1, Via::Request, "a"),
        ];
        let v = judge(&events);
        assert_eq!((v.repins, v.breaks), (0, 0));
        assert_eq!((v.no_answer, v.unidentified, v.socket_closes), (1, 1, 1));
        assert_eq!(v.denied, 0);
        let login = judge(&[
            unidentified(0, Some(401), false),
            unidentified(0, Some(403), false),
        ]);
        assert_eq!((login.unidentified, login.denied), (2, 2));
        assert!(v.stayed_on_one_node());
    }

    #[test]
    fn cookie_on_101_is_the_first_accepted_upgrade() {
        let no = judge(&[pinned(0, Via::Discovery, "a"), at(0, Via::Upgrade, "a")]);
        assert_eq!(no.cookie_on_101, Some(false));

        let yes = judge(&[
            unidentified(0, None, false),
            pinned(0, Via::Upgrade, "a"),
            at(2, Via::Upgrade, "a"),
        ]);
        assert_eq!(yes.cookie_on_101, Some(true));
        assert_eq!(yes.upgrades, 2);

        // A refused upgrade is not a 101, whatever it carries.
        let refused = Event::Answer(Answer {
            round: 0,
            via: Via::Upgrade,
            status: Some(503),
            node: Some("a".into()),
            by_header: true,
            cookie_set: true,
            rewritten: true,
            removed: false,
            refused: None,
        });
        let none = judge(&[refused]);
        assert_eq!((none.cookie_on_101, none.upgrades), (None, 0));
        assert_eq!(judge(&[]).cookie_on_101, None);
    }

    #[test]
    fn summary_spread_counts_each_session_once_by_its_first_node() {
        let sessions = [
            judge(&[pinned(0, Via::Discovery, "a"), at(0, Via::Request, "a")]),
            judge(&[pinned(0, Via::Discovery, "b"), pinned(2, Via::Request, "c")]),
            judge(&[unidentified(0, None, false), pinned(0, Via::Upgrade, "b")]),
            judge(&[pinned(0, Via::Discovery, "a"), at(0, Via::Request, "c")]),
        ];
        let s = summarise(&sessions);
        assert_eq!(s.sessions, 4);
        let spread: Vec<(&str, u32)> = s.spread.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        assert_eq!(spread, [("a", 2), ("b", 2)]);
        assert_eq!((s.repins, s.breaks), (1, 1));
        assert_eq!((s.kept_affinity, s.stayed_on_one_node), (3, 2));
        assert_eq!(
            s.cookie_on_101,
            Tally {
                yes: 1,
                no: 0,
                unknown: 3
            }
        );
        assert_eq!(s.outcome(), Outcome::Broken);
    }

    #[test]
    fn outcome_needs_an_identified_answer_and_no_break() {
        let kept = summarise(&[judge(&[
            pinned(0, Via::Discovery, "a"),
            pinned(1, Via::Request, "b"),
        ])]);
        assert_eq!(kept.outcome(), Outcome::Kept);
        let blind = summarise(&[judge(&[
            unidentified(0, Some(200), false),
            unidentified(0, None, false),
        ])]);
        assert_eq!(blind.outcome(), Outcome::Unjudged);
        let silent = summarise(&[judge(&[unidentified(0, None, false)])]);
        assert_eq!(silent.outcome(), Outcome::Unreachable);
        assert_eq!(summarise(&[]).outcome(), Outcome::Unreachable);
    }

    #[test]
    fn one_named_answer_per_session_cannot_pass() {
        // The reported case: a balancer that is not sticky, a node header nobody sets, and only
        // each WebSocket's first frame naming a node. No move can show, so no pass.
        let session = |node: &str| {
            let mut events = vec![unidentified(0, Some(200), false), at(0, Via::Upgrade, node)];
            events.extend((0..4).map(|_| unidentified(0, Some(200), false)));
            judge(&events)
        };
        let sessions: Vec<SessionVerdict> = ["a", "b", "c"].map(session).into();
        for v in &sessions {
            assert!(v.kept_affinity() && !v.judged(), "{v:?}");
            assert_eq!((v.answers, v.named_by_header, v.unidentified), (1, 0, 5));
        }
        let s = summarise(&sessions);
        assert_eq!((s.judged, s.answers, s.named_by_header), (0, 3, 0));
        assert_eq!(s.outcome(), Outcome::Unjudged);
    }

    #[test]
    fn a_ws_run_without_an_accepted_upgrade_cannot_pass() {
        let http_only = summarise(&[judge(&[
            pinned(0, Via::Discovery, "a"),
            at(0, Via::Request, "a"),
        ])]);
        assert_eq!(http_only.outcome_with_ws(false), Outcome::Kept);
        assert_eq!(http_only.outcome_with_ws(true), Outcome::Unjudged);
        let with_ws = summarise(&[judge(&[
            pinned(0, Via::Discovery, "a"),
            at(0, Via::Upgrade, "a"),
            at(0, Via::Request, "a"),
        ])]);
        assert_eq!(with_ws.upgrades, 1);
        assert_eq!(with_ws.outcome_with_ws(true), Outcome::Kept);
        let broken = summarise(&[judge(&[
            at(0, Via::Discovery, "a"),
            at(0, Via::Request, "b"),
        ])]);
        assert_eq!(broken.outcome_with_ws(true), Outcome::Broken);
    }

    #[test]
    fn every_session_must_be_judged_and_a_break_still_fails() {
        let judged = judge(&[pinned(0, Via::Discovery, "a"), at(0, Via::Request, "a")]);
        let thin = judge(&[pinned(0, Via::Discovery, "b"), unidentified(0, None, false)]);
        assert!(judged.judged() && !thin.judged());
        let s = summarise(&[judged.clone(), thin.clone()]);
        assert_eq!((s.sessions, s.judged), (2, 1));
        assert_eq!(s.outcome(), Outcome::Unjudged);
        let broken = judge(&[at(0, Via::Discovery, "a"), at(0, Via::Request, "b")]);
        assert_eq!(
            summarise(&[judged, thin, broken]).outcome(),
            Outcome::Broken
        );
    }

    #[test]
    fn named_by_header_counts_the_answers_the_header_named() {
        let refused = Event::Answer(Answer {
            round: 0,
            via: Via::Upgrade,
            status: Some(503),
            node: Some("a".into()),
            by_header: true,
            cookie_set: false,
            rewritten: false,
            removed: false,
            refused: None,
        });
        let v = judge(&[
            at(0, Via::Discovery, "a"),
            at(0, Via::Upgrade, "a"),
            refused,
            at(0, Via::Request, "a"),
        ]);
        assert_eq!((v.answers, v.named_by_header), (4, 3));
    }

    #[test]
    fn memory_stays_bounded_against_a_server_that_never_sticks() {
        let mut j = SessionJudge::new();
        for i in 0..10_000u32 {
            j.observe(&at(i, Via::Request, &format!("n{i}")));
        }
        let v = j.finish();
        assert_eq!(v.breaks, 9_999);
        assert_eq!(v.moves.len(), MAX_MOVES_KEPT);
        assert_eq!(v.nodes.len(), MAX_NODES_KEPT);
        assert_eq!(v.last_node.as_deref(), Some("n9999"));
    }
}
