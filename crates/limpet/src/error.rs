//! Errors on the way to a node, carrying the facts the retry and health rules act on: at which
//! stage the attempt failed, whether any byte of the request may have reached the node, and
//! whether it was a timeout. HTTP and TCP build them where the failure happens; the rules
//! read them in one place ([`UpstreamError::retry_safe`], [`UpstreamError::observation`]).
//!
//! | stage | bytes sent | passive health | retried on another node |
//! |---|---|---|---|
//! | connect (refused, unreachable, timeout) | no | failure | always |
//! | connect: no local port free ([`Cause::NoLocalPort`]) | no | — (limpet's own shortage) | always |
//! | TLS to the node | no | failure | always |
//! | send: the connection was dead before the request went out | no | failure on a fresh connection; — on a kept-alive one (stale) | always |
//! | send / answer head: reset or closed after the request went out | maybe | failure on a fresh connection | idempotent requests without a body only |
//! | answer head: no answer within the answer timeout | yes | failure | idempotent requests without a body only |
//! | answer head: no answer within the answer timeout, while the node answered a request sent after it ([`UpstreamError::slow`]) | yes | — (the node is alive) | never (504): as slow elsewhere |
//! | answer head: the node went DOWN while the request waited ([`Cause::NodeDown`]) | yes | — (its state says it) | idempotent requests without a body only (the only ones that wait for it) |
//! | answer head: not HTTP | yes | — | never (502) |
//! | request body: the client's body failed | maybe | — | never (400) |

use std::fmt;
use std::io;

use limpet_core::{Observation, RepinReason};

/// Where an attempt to reach a node failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Connect,
    Tls,
    /// Handing the request to the node's connection.
    Send,
    /// Waiting for the answer's head.
    AnswerHead,
    /// The client's request body (not the node's fault).
    ClientBody,
    /// Waiting for a slot of a node at its `max_connections` (a busy node is not a failed
    /// one: no failover, no health observation).
    Queue,
}

impl Stage {
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Connect => "connect",
            Stage::Tls => "tls",
            Stage::Send => "send",
            Stage::AnswerHead => "answer head",
            Stage::ClientBody => "request body",
            Stage::Queue => "queue",
        }
    }
}

/// What went wrong at that stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// An I/O error (refused, reset, closed).
    Io(io::ErrorKind),
    Timeout,
    /// The node's bytes were not valid HTTP.
    Protocol,
    /// The node's health went DOWN (its checks or its traffic) while the request waited
    /// for its answer: a replayable request stops waiting and is replayed elsewhere at once
    /// instead of out its answer timeout (a hung node's requests in flight when it hung).
    NodeDown,
    /// limpet itself is out of file descriptors (EMFILE, ENFILE): says nothing about the
    /// node, so passive health learns nothing from it (a node must not flap DOWN/UP because
    /// limpet ran out of sockets).
    Local,
    /// No local port was free for a connection to the node (EADDRNOTAVAIL at connect: the
    /// ephemeral range taken by connections to that address, most of them in TIME_WAIT
    /// after short sessions). limpet's own shortage, not the node's: charged to it, it took
    /// healthy nodes DOWN under a burst of short sessions, and their load onto the others.
    /// Unlike [`Cause::Local`], another node (another address) may have ports left: the
    /// attempt moves on, nothing charged.
    NoLocalPort,
}

/// Whether `e` says this process (or the machine) ran out of file descriptors.
pub fn out_of_fds(e: &io::Error) -> bool {
    // EMFILE (per process) and ENFILE (system-wide) are 24 and 23 on Linux, the BSDs and
    // macOS alike.
    matches!(e.raw_os_error(), Some(23 | 24))
}

/// Whether `e`, from a connect, says no local port was free for it (EADDRNOTAVAIL).
pub fn no_local_port(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EADDRNOTAVAIL)
}

/// An attempt that failed at a node. See the module docs for the rules.
#[derive(Debug, Clone)]
pub struct UpstreamError {
    pub stage: Stage,
    pub cause: Cause,
    /// Whether any byte of the request may have reached the node.
    pub sent: bool,
    /// Whether the connection was a fresh one (not a kept-alive one that may have gone stale).
    pub fresh: bool,
    /// No answer came in time, but the node answered a request sent after this one
    /// meanwhile ([`limpet_core::answered_since`]): the request is slow by itself, the node
    /// alive. Neither a failure of the node nor a reason to replay the request elsewhere.
    pub slow: bool,
    pub detail: String,
}

impl UpstreamError {
    pub fn new(stage: Stage, cause: Cause, sent: bool, detail: impl fmt::Display) -> Self {
        UpstreamError {
            stage,
            cause,
            sent,
            fresh: true,
            slow: false,
            detail: detail.to_string(),
        }
    }

    pub fn io(stage: Stage, e: &io::Error) -> Self {
        let cause = if out_of_fds(e) {
            Cause::Local
        } else if stage == Stage::Connect && no_local_port(e) {
            Cause::NoLocalPort
        } else {
            Cause::Io(e.kind())
        };
        UpstreamError::new(stage, cause, false, e)
    }

    pub fn timeout(stage: Stage, sent: bool) -> Self {
        UpstreamError::new(stage, Cause::Timeout, sent, "timed out")
    }

    /// No answer within the answer timeout to a request sent on a kept-alive connection
    /// (`pooled`) or a fresh one; `node_answered_since`: the node answered a request sent
    /// after it meanwhile (see [`UpstreamError::slow`]).
    pub fn unanswered(pooled: bool, node_answered_since: bool) -> Self {
        UpstreamError {
            slow: node_answered_since,
            ..UpstreamError::timeout(Stage::AnswerHead, true).on_pooled(pooled)
        }
    }

    /// Marks the attempt as made on a kept-alive connection.
    pub fn on_pooled(mut self, pooled: bool) -> Self {
        self.fresh = !pooled;
        self
    }

    /// Whether the request may be sent to another node: nothing reached this one, or the
    /// request may be sent twice (`replayable`: idempotent, no body, not an upgrade).
    pub fn retry_safe(&self, replayable: bool) -> bool {
        match (self.stage, self.cause) {
            (Stage::ClientBody | Stage::Queue, _) | (_, Cause::Protocol) => false,
            _ if self.slow => false,
            _ => !self.sent || replayable,
        }
    }

    /// What passive health learns from the error, if anything: a connection not made
    /// ([`Observation::TrafficFailed`]), or one made and not answered, TLS included
    /// ([`Observation::NoAnswer`], which a later completed connect does not disprove), or a
    /// request slow by itself ([`Observation::SlowAnswer`], not a failure).
    pub fn observation(&self) -> Option<Observation> {
        match (self.stage, self.cause) {
            (_, Cause::Local | Cause::NoLocalPort | Cause::NodeDown) => None,
            (Stage::Connect, _) => Some(Observation::TrafficFailed),
            // The TCP connection was made (a stopped process's kernel makes it too): the
            // handshake that fails or never ends is the node not answering, which a TCP
            // listener's completed connect does not disprove.
            (Stage::Tls, _) => Some(Observation::NoAnswer),
            // Slow by itself: no failure, but counted toward `max_slow_answers`.
            (Stage::AnswerHead, Cause::Timeout) if self.slow => Some(Observation::SlowAnswer),
            (Stage::AnswerHead, Cause::Timeout) => Some(Observation::NoAnswer),
            // A kept-alive connection the node closed meanwhile says nothing about the node;
            // a fresh one it closed before the request could go out does (accept, then drop).
            (Stage::Send, Cause::Io(_)) => self.fresh.then_some(Observation::NoAnswer),
            (Stage::AnswerHead, Cause::Io(_)) => {
                (self.fresh && self.sent).then_some(Observation::NoAnswer)
            }
            _ => None,
        }
    }

    /// The node went DOWN while the request waited for its answer head ([`Cause::NodeDown`]).
    pub fn node_down() -> Self {
        UpstreamError::new(
            Stage::AnswerHead,
            Cause::NodeDown,
            true,
            "node went DOWN before answering",
        )
    }

    /// What a session pinned to the node is re-pinned for when this error moves its request
    /// elsewhere: no connection, no answer in time, the node DOWN meanwhile, or a connection
    /// lost (or broken) after the request went out, a part of it included.
    pub fn repin_reason(&self) -> RepinReason {
        match (self.stage, self.cause) {
            (_, Cause::NodeDown) => RepinReason::NodeDown,
            (Stage::AnswerHead, Cause::Timeout) => RepinReason::AnswerTimeout,
            (Stage::AnswerHead, _) => RepinReason::AnswerFailed,
            (Stage::Send, _) if self.sent => RepinReason::AnswerFailed,
            _ => RepinReason::ConnectFailed,
        }
    }

    /// Whether the request had gone out, whole or in part, when its node failed it: the
    /// node lost the connection or left it unanswered once bytes of it were written. A
    /// write that fails after a first part went out (a node that resets the connection on
    /// a head it will not take, while limpet still writes it) is one too: the request may be
    /// the cause, as a request that outlasts the answer timeout may be, and it is not
    /// replayed on every node in turn ([`crate::proxy`]'s cap of one replay after sending).
    pub fn failed_after_sending(&self) -> bool {
        match self.stage {
            Stage::AnswerHead => true,
            Stage::Send => self.sent,
            _ => false,
        }
    }

    pub fn is_timeout(&self) -> bool {
        self.cause == Cause::Timeout
    }
}

impl fmt::Display for UpstreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.stage.as_str(), self.detail)
    }
}

impl std::error::Error for UpstreamError {}

#[cfg(test)]
mod tests {
    use super::*;

    /// No local port free for a connect: nothing charged to the node, and the attempt may go
    /// to another (nothing was sent; another address may have ports left).
    #[test]
    fn no_local_port_is_never_the_nodes_fault_and_moves_on() {
        let e = UpstreamError::io(
            Stage::Connect,
            &io::Error::from_raw_os_error(libc::EADDRNOTAVAIL),
        );
        assert_eq!(e.cause, Cause::NoLocalPort);
        assert_eq!(e.observation(), None);
        assert!(e.retry_safe(false));
        let refused = UpstreamError::io(
            Stage::Connect,
            &io::Error::from_raw_os_error(libc::ECONNREFUSED),
        );
        assert_eq!(refused.observation(), Some(Observation::TrafficFailed));
    }

    /// A write that failed once a first part of the request had gone out (a node resetting
    /// a head it will not take) is a failure after sending, as an unanswered request is:
    /// counted toward the one replay after sending, and the session re-pinned for a
    /// connection lost after the request went out, not for a connect that failed.
    #[test]
    fn a_write_cut_after_a_first_part_went_out_is_a_failure_after_sending() {
        let reset = Cause::Io(io::ErrorKind::ConnectionReset);
        let cut = UpstreamError::new(Stage::Send, reset, true, "");
        assert!(cut.failed_after_sending());
        assert_eq!(cut.repin_reason(), RepinReason::AnswerFailed);
        let before = UpstreamError::new(Stage::Send, reset, false, "");
        assert!(!before.failed_after_sending());
        assert_eq!(before.repin_reason(), RepinReason::ConnectFailed);
        assert!(UpstreamError::timeout(Stage::AnswerHead, true).failed_after_sending());
        assert!(!UpstreamError::timeout(Stage::Connect, false).failed_after_sending());
    }

    #[test]
    fn running_out_of_file_descriptors_is_never_the_nodes_fault() {
        for errno in [23, 24] {
            let e = UpstreamError::io(Stage::Connect, &io::Error::from_raw_os_error(errno));
            assert_eq!(e.cause, Cause::Local);
            assert_eq!(e.observation(), None, "errno {errno}");
        }
    }

    #[test]
    fn nothing_sent_is_always_retried_and_a_sent_request_only_when_replayable() {
        let refused = UpstreamError::io(Stage::Connect, &io::ErrorKind::ConnectionRefused.into());
        assert!(refused.retry_safe(false));
        assert_eq!(refused.observation(), Some(Observation::TrafficFailed));
        let timeout = UpstreamError::timeout(Stage::AnswerHead, true);
        assert!(!timeout.retry_safe(false));
        assert!(timeout.retry_safe(true));
        assert_eq!(timeout.observation(), Some(Observation::NoAnswer));
        // A TLS handshake that fails or never ends came after a completed TCP connect.
        let tls = UpstreamError::timeout(Stage::Tls, false);
        assert!(tls.retry_safe(false));
        assert_eq!(tls.observation(), Some(Observation::NoAnswer));
        let garbage = UpstreamError::new(Stage::AnswerHead, Cause::Protocol, true, "bad");
        assert!(!garbage.retry_safe(true));
        assert_eq!(garbage.observation(), None);
        let stale =
            UpstreamError::new(Stage::Send, Cause::Io(io::ErrorKind::BrokenPipe), false, "")
                .on_pooled(true);
        assert!(stale.retry_safe(false));
        assert_eq!(stale.observation(), None);
        let dropped = UpstreamError::new(
            Stage::Send,
            Cause::Io(io::ErrorKind::ConnectionReset),
            false,
            "",
        );
        assert!(dropped.retry_safe(false));
        assert_eq!(
            dropped.observation(),
            Some(Observation::NoAnswer),
            "a fresh connection the node dropped before the request went out is its fault"
        );
        let body = UpstreamError::new(Stage::ClientBody, Cause::Io(io::ErrorKind::Other), true, "");
        assert!(!body.retry_safe(true));
    }

    #[test]
    fn a_timeout_on_a_node_answering_younger_requests_is_neither_charged_nor_replayed() {
        for pooled in [false, true] {
            let hung = UpstreamError::unanswered(pooled, false);
            assert_eq!(hung.observation(), Some(Observation::NoAnswer));
            assert!(hung.retry_safe(true));
            assert_eq!(hung.repin_reason(), RepinReason::AnswerTimeout);
            let slow = UpstreamError::unanswered(pooled, true);
            assert!(slow.is_timeout() && slow.sent && slow.stage == Stage::AnswerHead);
            assert_eq!(
                slow.observation(),
                Some(Observation::SlowAnswer),
                "pooled {pooled}: counted as slow, not as a failure"
            );
            assert!(!slow.retry_safe(true), "pooled {pooled}");
        }
    }

    #[test]
    fn a_node_gone_down_under_a_waiting_request_is_not_charged_and_moves_only_a_replayable_one() {
        let e = UpstreamError::node_down();
        assert_eq!(e.observation(), None, "the node's state already says it");
        assert!(e.retry_safe(true));
        assert!(!e.retry_safe(false));
        assert_eq!(e.repin_reason(), RepinReason::NodeDown);
        assert!(!e.is_timeout());
    }
}
