//! Metric handles of one HTTP listener, resolved once when the listener's state is built, so
//! the per-request path counts with plain atomic adds: no label `String`s to allocate, no
//! family map to hash and lock. A handle shares its series with the registry's family
//! (prometheus-client metrics are `Arc`s inside), so `/metrics` shows the same numbers.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use limpet_core::{NodeId, RepinReason};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;

use super::{LatencyLabels, Metrics, NodeTraffic, PinLabels, PinOutcome, RequestLabels, CLASSES};

/// One node's series on one listener.
#[derive(Debug)]
struct NodeHandles {
    /// By status class, as [`CLASSES`].
    requests: [Counter; 6],
    latency: Histogram,
    traffic: Arc<NodeTraffic>,
}

/// The pre-resolved series of one HTTP listener over one generation's nodes (by `NodeId`).
#[derive(Debug)]
pub struct ListenerMetrics {
    metrics: Arc<Metrics>,
    nodes: Vec<NodeHandles>,
    /// Answers limpet wrote itself (no node), by status class.
    own: [Counter; 6],
    sticky: Counter,
    new: Counter,
    /// By [`RepinReason::ALL`] order.
    repinned: [Counter; RepinReason::ALL.len()],
}

/// The index of a status's class in [`CLASSES`] (0 means no answer).
fn class_of(status: u16) -> usize {
    match status {
        100..=199 => 0,
        200..=299 => 1,
        300..=399 => 2,
        400..=499 => 3,
        500..=599 => 4,
        _ => 5,
    }
}

impl ListenerMetrics {
    /// Resolves `listener`'s series for `nodes` (names by `NodeId` order).
    pub fn new<'a>(
        metrics: &Arc<Metrics>,
        listener: &str,
        nodes: impl IntoIterator<Item = &'a str>,
    ) -> Self {
        let m = metrics;
        let requests = |node: &str| {
            CLASSES.map(|class| {
                m.requests
                    .get_or_create(&RequestLabels {
                        listener: listener.to_owned(),
                        node: node.to_owned(),
                        class,
                    })
                    .clone()
            })
        };
        let pin = |outcome: &'static str, reason: &'static str| {
            m.pins
                .get_or_create(&PinLabels {
                    listener: listener.to_owned(),
                    outcome,
                    reason,
                })
                .clone()
        };
        let nodes = nodes
            .into_iter()
            .map(|node| NodeHandles {
                requests: requests(node),
                latency: m
                    .latency
                    .get_or_create(&LatencyLabels {
                        listener: listener.to_owned(),
                        node: node.to_owned(),
                    })
                    .clone(),
                traffic: m.node_traffic(node),
            })
            .collect();
        ListenerMetrics {
            metrics: Arc::clone(m),
            nodes,
            own: requests(""),
            sticky: pin("sticky", "none"),
            new: pin("new", "none"),
            repinned: RepinReason::ALL.map(|r| pin("repinned", r.as_str())),
        }
    }

    /// A request was answered with `status` by `node` (`None`: by limpet itself, e.g. a 503
    /// when no node is available). `status` 0 means no answer.
    pub fn request(&self, node: Option<NodeId>, status: u16) {
        let class = class_of(status);
        let handles = node.and_then(|n| self.nodes.get(n.index()));
        match handles {
            Some(h) => &h.requests[class],
            None => &self.own[class],
        }
        .inc();
        let totals = &self.metrics.totals;
        totals.requests.fetch_add(1, Ordering::Relaxed);
        let error = !(100..500).contains(&status);
        if error {
            totals.errors.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(h) = handles {
            h.traffic.request(error);
        }
    }

    /// An attempt at `node` that failed before the request went on to another node (a
    /// refused connect, an answer that did not come in time): the node did not answer it, so
    /// it counts against the node as an error (`class="error"`, and the errors of its stats
    /// and API view), where an operator looks for a node that times out. Not in the totals,
    /// which count each client request once, by the node that answered it.
    pub fn attempt_failed(&self, node: NodeId) {
        if let Some(h) = self.nodes.get(node.index()) {
            h.requests[class_of(0)].inc();
            h.traffic.request(true);
        }
    }

    /// A routing decision's pin outcome.
    pub fn pin(&self, outcome: PinOutcome) {
        let totals = &self.metrics.totals;
        match outcome {
            PinOutcome::Sticky => {
                totals.sticky.fetch_add(1, Ordering::Relaxed);
                self.sticky.inc();
            }
            PinOutcome::New => {
                totals.new.fetch_add(1, Ordering::Relaxed);
                self.new.inc();
            }
            PinOutcome::Repinned(r) => {
                totals.repinned.fetch_add(1, Ordering::Relaxed);
                self.repinned[repin_index(r)].inc();
            }
        }
    }

    /// `node` answered a request's head after `elapsed`.
    pub fn upstream_latency(&self, node: NodeId, elapsed: Duration) {
        if let Some(h) = self.nodes.get(node.index()) {
            h.latency.observe(elapsed.as_secs_f64());
            h.traffic.answer_time(elapsed);
        }
    }

    /// The traffic counters of `node`, for the data plane to count bytes into.
    pub fn node_traffic(&self, node: NodeId) -> Option<&Arc<NodeTraffic>> {
        self.nodes.get(node.index()).map(|h| &h.traffic)
    }
}

fn repin_index(r: RepinReason) -> usize {
    RepinReason::ALL.iter().position(|x| *x == r).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_count_into_the_registry_series() {
        let m = Arc::new(Metrics::new());
        let l = ListenerMetrics::new(&m, "web", ["a", "b"]);
        l.request(Some(NodeId(1)), 200);
        l.request(Some(NodeId(1)), 502);
        l.request(None, 503);
        l.pin(PinOutcome::Repinned(RepinReason::NodeMaint));
        l.upstream_latency(NodeId(0), Duration::from_millis(3));
        let text = m.encode();
        for line in [
            r#"limpet_requests_total{listener="web",node="b",class="2xx"} 1"#,
            r#"limpet_requests_total{listener="web",node="b",class="5xx"} 1"#,
            r#"limpet_requests_total{listener="web",node="",class="5xx"} 1"#,
            r#"limpet_pins_total{listener="web",outcome="repinned",reason="node-maint"} 1"#,
            r#"limpet_upstream_latency_seconds_count{listener="web",node="a"} 1"#,
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
        let t = m.totals();
        assert_eq!((t.requests, t.errors, t.repinned), (3, 2, 1));
        let b = m.traffic("b", crate::clock::now_ms());
        assert_eq!((b.requests, b.errors), (2, 1));
        assert_eq!(class_of(0), 5);
        assert_eq!(repin_index(RepinReason::ConnectFailed), 6);
    }

    /// A request that failed on a and was answered by b: an error of a's, a request of b's,
    /// one client request in the totals.
    #[test]
    fn a_failed_attempt_counts_against_its_node_not_the_totals() {
        let m = Arc::new(Metrics::new());
        let l = ListenerMetrics::new(&m, "web", ["a", "b"]);
        l.attempt_failed(NodeId(0));
        l.request(Some(NodeId(1)), 200);
        let text = m.encode();
        for line in [
            r#"limpet_requests_total{listener="web",node="a",class="error"} 1"#,
            r#"limpet_requests_total{listener="web",node="b",class="2xx"} 1"#,
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
        let now = crate::clock::now_ms();
        let (a, b) = (m.traffic("a", now), m.traffic("b", now));
        assert_eq!((a.requests, a.errors), (1, 1));
        assert_eq!((b.requests, b.errors), (1, 0));
        let t = m.totals();
        assert_eq!((t.requests, t.errors), (1, 0));
    }
}
