//! What the core decides for one request, and why.

use crate::node::NodeId;

/// What a request's pin (a cookie, a table entry, a connection's earlier choice) says, once
/// decoded. Decoding is the caller's (or a codec's) job; the decision only needs the outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pin {
    /// The request carried no pin.
    None,
    /// The pin names this configured node.
    Node(NodeId),
    /// The pin names no configured node (e.g. kept across a config change, or forged).
    Unknown,
    /// The pin failed verification (signed cookies).
    Invalid,
    /// The pin was valid once and has expired (signed cookies).
    Expired,
}

/// Why a request that carried a pin was given a fresh node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RepinReason {
    UnknownNode,
    NodeDown,
    NodeMaint,
    DrainEnded,
    InvalidCookie,
    ExpiredCookie,
    /// The node failed this request before answering: no connection (refused, timed out,
    /// TLS failed), or the connection died before the request could go out.
    ConnectFailed,
    /// The node took the request and gave no answer head within the answer timeout.
    AnswerTimeout,
    /// The node took the request, then closed or reset the connection before any answer
    /// byte reached the client. (An answer that is not HTTP is a 502, never replayed.)
    AnswerFailed,
}

impl RepinReason {
    /// The node failed one of the session's requests (rather than being DOWN, in MAINT,
    /// drained or unknown, which its own state says).
    pub fn is_failure(self) -> bool {
        matches!(
            self,
            RepinReason::ConnectFailed | RepinReason::AnswerTimeout | RepinReason::AnswerFailed
        )
    }

    /// Every reason, in declaration order.
    pub const ALL: [RepinReason; 9] = [
        RepinReason::UnknownNode,
        RepinReason::NodeDown,
        RepinReason::NodeMaint,
        RepinReason::DrainEnded,
        RepinReason::InvalidCookie,
        RepinReason::ExpiredCookie,
        RepinReason::ConnectFailed,
        RepinReason::AnswerTimeout,
        RepinReason::AnswerFailed,
    ];

    /// The reason [`as_str`](Self::as_str) writes as `s`.
    pub fn parse(s: &str) -> Option<RepinReason> {
        RepinReason::ALL.into_iter().find(|r| r.as_str() == s)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            RepinReason::UnknownNode => "unknown-node",
            RepinReason::NodeDown => "node-down",
            RepinReason::NodeMaint => "node-maint",
            RepinReason::DrainEnded => "drain-ended",
            RepinReason::InvalidCookie => "invalid-cookie",
            RepinReason::ExpiredCookie => "expired-cookie",
            RepinReason::ConnectFailed => "connect-failed",
            RepinReason::AnswerTimeout => "answer-timeout",
            RepinReason::AnswerFailed => "answer-failed",
        }
    }
}

/// The decision for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// The pin names a node that accepts it: go there, no cookie to send.
    Sticky(NodeId),
    /// A fresh assignment: go to `node` and send the affinity cookie. `repin` is set when the
    /// request carried a pin that could not be honoured.
    Fresh {
        node: NodeId,
        repin: Option<RepinReason>,
    },
    /// No node can take the request.
    Unavailable,
}

impl Decision {
    pub fn node(&self) -> Option<NodeId> {
        match *self {
            Decision::Sticky(n) | Decision::Fresh { node: n, .. } => Some(n),
            Decision::Unavailable => None,
        }
    }
}
