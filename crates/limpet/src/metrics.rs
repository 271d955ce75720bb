//! # Metrics: what the data plane counts, in Prometheus text at `/metrics`
//!
//! One [`Metrics`] per limpet process, shared (`Arc`) by every listener and the admin server.
//! The data plane calls one-line hooks; the admin server fills the gauges that describe the
//! present (active connections, pins held, table sizes) from a snapshot right before it
//! encodes, so gauges never drift from the state they describe.
//!
//! Encoding is `prometheus-client`'s, never hand-formatted. Families:
//!
//! | name | kind | labels |
//! |---|---|---|
//! | `limpet_requests_total` | counter | listener, node, class (`1xx`..`5xx`, `error` when no answer, a failed attempt that went on to another node included) |
//! | `limpet_pins_total` | counter | listener, outcome (`sticky`, `new`, `repinned`), reason (`RepinReason::as_str`, or `none`) |
//! | `limpet_health_transitions_total` | counter | node, to (`up`, `down`) |
//! | `limpet_upstream_latency_seconds` | histogram | listener, node (time to the node's answer head) |
//! | `limpet_table_evictions_total` | counter | table |
//! | `limpet_table_pins_refused_total` | counter | table (puts not stored: the table full of entries open sessions hold; each try counts) |
//! | `limpet_node_active_connections` | gauge | node |
//! | `limpet_node_tunnels` | gauge | node (WebSocket and TCP tunnels open) |
//! | `limpet_node_pins` | gauge | node (pins held in affinity tables) |
//! | `limpet_node_sessions_seen` | gauge | node (distinct sessions seen in the window, estimated) |
//! | `limpet_node_state` | gauge | node, state (1 for the current state, 0 otherwise) |
//! | `limpet_table_entries` | gauge | table |
//! | `limpet_table_held_keys` | gauge | table (keys open TCP sessions and tunnels hold) |
//! | `limpet_config_reloads_total` | counter | result (`ok`, `refused`) |
//! | `limpet_out_of_fds_total` | counter | at (`accept`, `connect`, `check`) |
//! | `limpet_node_answers_cut_total` | counter | node, cause (`idle`: nothing for `answer_body_idle`; `error`: the node's connection failed mid-body) |
//! | `limpet_node_answers_slow_total` | counter | node (requests answered 504 as slow by themselves: the node answered younger ones meanwhile) |
//! | `limpet_log_lines_dropped_total` | counter | none (lines the log writer's queue could not take: [`crate::logging`]) |
//!
//! Every family is in the text from the first scrape, before anything happened: families
//! are registered as `Eager` (their `# TYPE` line is written even without a series), and
//! right before encoding the admin server creates the zero series of every label set it
//! knows: reloads `ok` and `refused`; per node, health transitions `up` and `down`; per HTTP
//! listener and node, every request class and the latency histogram; per HTTP listener, every
//! pin outcome and reason; per table, evictions and refused pins. So a first reload refused, a first 5xx or a
//! first eviction is an increase from 0 that `rate()` and `increase()` see, not a new series.
//!
//! Next to the Prometheus families, a few process-wide totals ([`Totals`]) feed the stats
//! page's counts and rates without parsing the text format, and per-node traffic
//! (`traffic`: requests, errors, bytes, answer-time quantiles and a five-minute history)
//! feeds its node table and charts.

mod handles;
mod traffic;

pub use handles::ListenerMetrics;

pub use traffic::{
    AnswerCut, HistoryView, NodeHistoryView, NodeTraffic, TrafficView, HISTORY_SAMPLES,
    LATENCY_WINDOW, RATE_WINDOW, SAMPLE_EVERY,
};

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use limpet_core::{Decision, RepinReason, Transition};
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use serde::Serialize;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    listener: String,
    node: String,
    class: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PinLabels {
    listener: String,
    outcome: &'static str,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TransitionLabels {
    node: String,
    to: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LatencyLabels {
    listener: String,
    node: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabels {
    node: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeStateLabels {
    node: String,
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TableLabels {
    table: String,
}

/// `limpet_store_ops_total{op}`: commands sent to the shared store by kind (fleet mode).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StoreOpLabels {
    pub op: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

/// A gauge without labels whose sample exists only once what it measures is configured
/// (`limpet_store_up` without a `[store]` is its `# TYPE` line alone, not a misleading 0).
#[derive(Debug, Clone, Default)]
struct ConfiguredGauge {
    gauge: Gauge,
    configured: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl EncodeMetric for ConfiguredGauge {
    fn encode(&self, encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        if self.configured.load(Ordering::Relaxed) {
            self.gauge.encode(encoder)
        } else {
            Ok(())
        }
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Gauge
    }

    fn is_empty(&self) -> bool {
        false
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AtLabels {
    at: &'static str,
}

/// `limpet_out_of_fds_total{at}`: read at each scrape from the process-wide
/// [`crate::net::LOCAL_FDS`], which accept loops, node connects and health checks count into
/// (they run before and beside any `Metrics`), every `at` from 0.
#[derive(Debug)]
struct OutOfFdsCounters;

impl EncodeMetric for OutOfFdsCounters {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        for at in crate::net::FdsAt::ALL {
            let labels = AtLabels { at: at.as_str() };
            ConstCounter::new(crate::net::LOCAL_FDS.count(at))
                .encode(encoder.encode_family(&labels)?)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Counter
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CutLabels {
    node: String,
    cause: &'static str,
}

/// `limpet_node_answers_cut_total{node, cause}`: read at each scrape from the per-node
/// traffic counters the answer bodies count into, every cause from 0 for each node.
#[derive(Debug)]
struct AnswersCutCounters(std::sync::Arc<traffic::Traffic>);

impl EncodeMetric for AnswersCutCounters {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        for t in self.0.nodes() {
            for cut in AnswerCut::ALL {
                let labels = CutLabels {
                    node: t.name().to_owned(),
                    cause: cut.as_str(),
                };
                ConstCounter::new(t.answers_cut(cut)).encode(encoder.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Counter
    }
}

/// `limpet_node_answers_slow_total{node}`: read at each scrape from the per-node traffic
/// counters, every node from 0.
#[derive(Debug)]
struct AnswersSlowCounters(std::sync::Arc<traffic::Traffic>);

impl EncodeMetric for AnswersSlowCounters {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        for t in self.0.nodes() {
            let labels = NodeLabels {
                node: t.name().to_owned(),
            };
            ConstCounter::new(t.answers_slow()).encode(encoder.encode_family(&labels)?)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Counter
    }
}

/// `limpet_log_lines_dropped_total`: read at each scrape from the process's log writer
/// ([`crate::logging::dropped_lines`]).
#[derive(Debug)]
struct LogLinesDropped;

impl EncodeMetric for LogLinesDropped {
    fn encode(&self, encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        ConstCounter::new(crate::logging::dropped_lines()).encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Counter
    }
}

/// A metric family written even while it has no series (`prometheus-client` leaves empty
/// families out of the text), so a scrape shows every documented family from the start.
#[derive(Debug)]
struct Eager<M>(M);

impl<M: EncodeMetric> EncodeMetric for Eager<M> {
    fn encode(&self, encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        self.0.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        self.0.metric_type()
    }

    fn is_empty(&self) -> bool {
        false
    }
}

/// Every status class a request is counted under.
const CLASSES: [&str; 6] = ["1xx", "2xx", "3xx", "4xx", "5xx", "error"];

/// How a request's pin was handled, for [`Metrics::pin`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PinOutcome {
    /// The pin was honoured.
    Sticky,
    /// No pin: a fresh assignment.
    New,
    /// A pin that could not be honoured: a fresh assignment, for this reason.
    Repinned(RepinReason),
}

impl PinOutcome {
    /// The pin outcome of a route (`None` when no node could take it).
    pub fn of_route(o: limpet_core::Outcome) -> Option<Self> {
        use limpet_core::Outcome;
        Some(match o {
            // Failback honours the session's home pin.
            Outcome::Sticky | Outcome::TableHit | Outcome::Failback => PinOutcome::Sticky,
            Outcome::Fresh => PinOutcome::New,
            Outcome::Repin(r) => PinOutcome::Repinned(r),
            Outcome::None => return None,
        })
    }

    /// The outcome of a core decision (`None` for `Unavailable`).
    pub fn of(decision: &Decision) -> Option<Self> {
        match *decision {
            Decision::Sticky(_) => Some(PinOutcome::Sticky),
            Decision::Fresh { repin: None, .. } => Some(PinOutcome::New),
            Decision::Fresh { repin: Some(r), .. } => Some(PinOutcome::Repinned(r)),
            Decision::Unavailable => None,
        }
    }
}

/// Process-wide totals for the stats page.
#[derive(Debug, Default)]
pub struct Totals {
    requests: AtomicU64,
    errors: AtomicU64,
    sticky: AtomicU64,
    new: AtomicU64,
    repinned: AtomicU64,
    transitions: AtomicU64,
}

/// A snapshot of [`Totals`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct TotalsView {
    /// Requests answered (any status), and those answered 5xx or not at all.
    pub requests: u64,
    pub errors: u64,
    pub sticky: u64,
    pub new: u64,
    pub repinned: u64,
    pub health_transitions: u64,
}

/// The metrics of one limpet process. See the module docs.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    pins: Family<PinLabels, Counter>,
    transitions: Family<TransitionLabels, Counter>,
    latency: Family<LatencyLabels, Histogram>,
    evictions: Family<TableLabels, Counter>,
    refused: Family<TableLabels, Counter>,
    reloads: Family<ResultLabels, Counter>,
    node_active: Family<NodeLabels, Gauge>,
    node_tunnels: Family<NodeLabels, Gauge>,
    node_pins: Family<NodeLabels, Gauge>,
    node_seen: Family<NodeLabels, Gauge>,
    node_state: Family<NodeStateLabels, Gauge>,
    table_entries: Family<TableLabels, Gauge>,
    table_held: Family<TableLabels, Gauge>,
    /// Fleet mode: a series only when a `[store]` is configured.
    store_up: ConfiguredGauge,
    store_ops: Family<StoreOpLabels, Counter>,
    totals: Totals,
    /// Per-node traffic for the stats page (and the answers-cut counters' scrape).
    traffic: std::sync::Arc<traffic::Traffic>,
    /// Evictions and refused pins per table as last read, so the counters grow by the
    /// difference; keyed by the table's name and key ([`TableGauges`]): a reload that keys
    /// a table anew builds another table, whose totals start again from 0.
    evictions_seen: std::sync::Mutex<std::collections::BTreeMap<(String, String), (u64, u64)>>,
}

fn latency_histogram() -> Histogram {
    // 0.5 ms to about 16 s.
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// A gauge per node, as the admin server reads it from the runtime before encoding.
#[derive(Debug, Clone, Default)]
pub struct NodeGauges<'a> {
    pub node: &'a str,
    pub state: &'static str,
    pub active: u64,
    pub tunnels: u64,
    pub pins: u64,
    pub seen: u64,
    /// The HTTP listeners forwarding to the node: its request and latency series are created
    /// at zero for each.
    pub http_listeners: Vec<&'a str>,
}

/// A table's gauges and totals, as the admin server reads them before encoding.
#[derive(Debug, Clone, Copy, Default)]
pub struct TableGauges<'a> {
    pub table: &'a str,
    /// What the table is keyed on (`source-ip`, `header x-user`...): with the name, which
    /// table this is. A reload keeps a table (and its totals) exactly when it keeps both;
    /// one that keys it anew builds another, whose totals start at 0.
    pub key: &'a str,
    pub entries: u64,
    /// Keys open sessions hold.
    pub held: u64,
    /// Totals so far (the table's own counters).
    pub evictions: u64,
    pub refused: u64,
}

const STATES: [&str; 4] = ["UP", "DOWN", "DRAIN", "MAINT"];

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        let pins = Family::<PinLabels, Counter>::default();
        let transitions = Family::<TransitionLabels, Counter>::default();
        let latency = Family::<LatencyLabels, Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        let evictions = Family::<TableLabels, Counter>::default();
        let refused = Family::<TableLabels, Counter>::default();
        let reloads = Family::<ResultLabels, Counter>::default();
        let node_active = Family::<NodeLabels, Gauge>::default();
        let node_tunnels = Family::<NodeLabels, Gauge>::default();
        let node_pins = Family::<NodeLabels, Gauge>::default();
        let node_seen = Family::<NodeLabels, Gauge>::default();
        let node_state = Family::<NodeStateLabels, Gauge>::default();
        let table_entries = Family::<TableLabels, Gauge>::default();
        let table_held = Family::<TableLabels, Gauge>::default();
        let store_up = ConfiguredGauge::default();
        let store_ops = Family::<StoreOpLabels, Counter>::default();
        registry.register(
            "limpet_requests",
            "Requests answered, by listener, node and status class",
            Eager(requests.clone()),
        );
        registry.register(
            "limpet_pins",
            "Pin outcomes of routing decisions: sticky, new, or re-pinned with a reason",
            Eager(pins.clone()),
        );
        registry.register(
            "limpet_health_transitions",
            "Node health state changes",
            Eager(transitions.clone()),
        );
        registry.register(
            "limpet_upstream_latency_seconds",
            "Time from sending a request to a node to its answer head",
            Eager(latency.clone()),
        );
        registry.register(
            "limpet_table_evictions",
            "Affinity table entries evicted by the size bound",
            Eager(evictions.clone()),
        );
        registry.register(
            "limpet_table_pins_refused",
            "Puts of a new key an affinity table did not store, full of entries open sessions hold (each try counts)",
            Eager(refused.clone()),
        );
        registry.register(
            "limpet_config_reloads",
            "Configuration reloads, applied or refused",
            Eager(reloads.clone()),
        );
        registry.register(
            "limpet_node_active_connections",
            "Connections and tunnels open to a node",
            Eager(node_active.clone()),
        );
        registry.register(
            "limpet_node_tunnels",
            "WebSocket and TCP tunnels open to a node",
            Eager(node_tunnels.clone()),
        );
        registry.register(
            "limpet_node_pins",
            "Pins to a node held in affinity tables",
            Eager(node_pins.clone()),
        );
        registry.register(
            "limpet_node_sessions_seen",
            "Distinct sessions seen on a node within the window (HyperLogLog estimate)",
            Eager(node_seen.clone()),
        );
        registry.register(
            "limpet_node_state",
            "A node's state: 1 for the current one",
            Eager(node_state.clone()),
        );
        registry.register(
            "limpet_table_entries",
            "Entries held in an affinity table",
            Eager(table_entries.clone()),
        );
        registry.register(
            "limpet_table_held_keys",
            "Keys of an affinity table that open TCP sessions and tunnels hold (never evicted for room)",
            Eager(table_held.clone()),
        );
        registry.register(
            "limpet_store_up",
            "1 while the shared store (fleet mode) answers, 0 while its circuit breaker is open",
            store_up.clone(),
        );
        registry.register(
            "limpet_store_ops",
            "Commands sent to the shared store, by kind (get, create, overwrite, refresh), and adopted pins, applied invalidations and errors",
            Eager(store_ops.clone()),
        );
        registry.register(
            "limpet_out_of_fds",
            "Times limpet ran out of file descriptors on a client or node socket, by where: accept (tries, every 50 ms while a client waits in the backlog), connect (to a node; no verdict on it), check (skipped; no verdict)",
            OutOfFdsCounters,
        );
        registry.register(
            "limpet_log_lines_dropped",
            "Log lines dropped because the log writer's queue was full: the reader of limpet's stderr did not keep up (lines are never written from a thread that serves traffic)",
            LogLinesDropped,
        );
        let traffic = std::sync::Arc::new(traffic::Traffic::default());
        registry.register(
            "limpet_node_answers_cut",
            "Answers cut after their head went to the client, by node and cause: idle (the node sent nothing for answer_body_idle), error (the node's connection failed mid-body). Not counted against the node's health",
            Eager(AnswersCutCounters(std::sync::Arc::clone(&traffic))),
        );
        registry.register(
            "limpet_node_answers_slow",
            "Requests answered 504 as slow by themselves, by node: no answer head within upstream_answer while the node answered requests sent after them. Not counted against the node's health, not replayed",
            Eager(AnswersSlowCounters(std::sync::Arc::clone(&traffic))),
        );
        let m = Metrics {
            registry,
            requests,
            pins,
            transitions,
            latency,
            evictions,
            refused,
            reloads,
            node_active,
            node_tunnels,
            node_pins,
            node_seen,
            node_state,
            table_entries,
            table_held,
            store_up,
            store_ops,
            totals: Totals::default(),
            traffic,
            evictions_seen: Default::default(),
        };
        for ok in [true, false] {
            let _ = m.reloads.get_or_create(&ResultLabels {
                result: if ok { "ok" } else { "refused" },
            });
        }
        m
    }

    /// The store's up gauge (its series appears now) and op counters, for [`crate::store`].
    pub fn store_handles(&self) -> (Gauge, Family<StoreOpLabels, Counter>) {
        self.store_up
            .configured
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let up = self.store_up.gauge.clone();
        for op in [
            "get",
            "create",
            "overwrite",
            "refresh",
            "adopt",
            "invalidation",
            "unknown-node",
            "key-error",
            "error",
        ] {
            let _ = self.store_ops.get_or_create(&StoreOpLabels { op });
        }
        (up, self.store_ops.clone())
    }

    /// A routing decision's pin outcome on `listener`.
    pub fn pin(&self, listener: &str, outcome: PinOutcome) {
        let (name, reason) = match outcome {
            PinOutcome::Sticky => {
                self.totals.sticky.fetch_add(1, Ordering::Relaxed);
                ("sticky", "none")
            }
            PinOutcome::New => {
                self.totals.new.fetch_add(1, Ordering::Relaxed);
                ("new", "none")
            }
            PinOutcome::Repinned(r) => {
                self.totals.repinned.fetch_add(1, Ordering::Relaxed);
                ("repinned", r.as_str())
            }
        };
        self.pins
            .get_or_create(&PinLabels {
                listener: listener.to_owned(),
                outcome: name,
                reason,
            })
            .inc();
    }

    /// [`pin`](Self::pin) for a core decision (nothing for `Unavailable`).
    pub fn decision(&self, listener: &str, decision: &Decision) {
        if let Some(o) = PinOutcome::of(decision) {
            self.pin(listener, o);
        }
    }

    /// A node changed health state.
    pub fn health_transition(&self, node: &str, t: Transition) {
        let to = match t {
            Transition::WentUp => "up",
            Transition::WentDown => "down",
        };
        self.transitions
            .get_or_create(&TransitionLabels {
                node: node.to_owned(),
                to,
            })
            .inc();
        self.totals.transitions.fetch_add(1, Ordering::Relaxed);
    }

    /// The traffic counters of `node`, for the data plane to count bytes into.
    pub fn node_traffic(&self, node: &str) -> std::sync::Arc<NodeTraffic> {
        self.traffic.node(node, crate::clock::now_ms)
    }

    /// What `node` is doing as of `now_ms` (`clock::now_ms` scale), for the admin API.
    pub fn traffic(&self, node: &str, now_ms: u64) -> TrafficView {
        self.traffic.view(node, now_ms)
    }

    /// Samples the traffic of the `configured` nodes (the running configuration's) for the
    /// charts, and drops the history of every other node; the admin server calls it every
    /// [`SAMPLE_EVERY`]. The counters of a node no longer configured stay (its Prometheus
    /// series keep their last value, and a node added back carries on under its name).
    pub fn sample<'a>(&self, now_ms: u64, configured: impl IntoIterator<Item = &'a str>) {
        self.traffic.sample(now_ms, configured);
    }

    /// The charts' points of every configured node, as last sampled.
    pub fn history(&self, now_ms: u64) -> HistoryView {
        self.traffic.history(now_ms)
    }

    /// `n` entries of `table` were evicted by its size bound.
    pub fn table_evictions(&self, table: &str, n: u64) {
        self.evictions
            .get_or_create(&TableLabels {
                table: table.to_owned(),
            })
            .inc_by(n);
    }

    /// A reload replaced table `table` keyed on `key` (a new key, or the table removed), whose
    /// totals were `evictions` and `refused`: what it counted since the last scrape goes to
    /// the counters now, as the scrapes after the reload read the running tables only.
    pub fn table_replaced(&self, table: &str, key: &str, evictions: u64, refused: u64) {
        let mut seen = self
            .evictions_seen
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let (last_evicted, last_refused) = seen
            .remove(&(table.to_owned(), key.to_owned()))
            .unwrap_or((0, 0));
        let labels = TableLabels {
            table: table.to_owned(),
        };
        self.evictions
            .get_or_create(&labels)
            .inc_by(evictions.saturating_sub(last_evicted));
        self.refused
            .get_or_create(&labels)
            .inc_by(refused.saturating_sub(last_refused));
    }

    /// A configuration reload was applied (`ok`) or refused.
    pub fn reload(&self, ok: bool) {
        self.reloads
            .get_or_create(&ResultLabels {
                result: if ok { "ok" } else { "refused" },
            })
            .inc();
    }

    /// Replaces the per-node and per-table gauges with this snapshot (nodes and tables no
    /// longer configured disappear). Tables come with their totals so far; the eviction and
    /// refused-pin counters grow by the difference since the last snapshot of the same table
    /// (its name and key: a table a reload keyed anew counts from 0, its totals added to
    /// the old one's, not diffed against them). Snapshots must come in the order they were
    /// read (the admin server reads and applies one scrape at a time). Creates the zero
    /// series of every counter label set the snapshot names (see the module docs); counters
    /// of nodes and tables no longer configured keep their last value.
    ///
    /// What a replaced table counted after the last snapshot reaches the counters at the
    /// reload ([`Metrics::table_replaced`]): the snapshot reads the running tables only.
    pub fn set_gauges<'a>(
        &self,
        nodes: impl IntoIterator<Item = NodeGauges<'a>>,
        tables: impl IntoIterator<Item = TableGauges<'a>>,
    ) {
        for f in [
            &self.node_active,
            &self.node_tunnels,
            &self.node_pins,
            &self.node_seen,
        ] {
            f.clear();
        }
        self.node_state.clear();
        self.table_entries.clear();
        self.table_held.clear();
        let gauge = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let mut http_listeners = std::collections::BTreeSet::new();
        for n in nodes {
            for to in ["up", "down"] {
                let _ = self.transitions.get_or_create(&TransitionLabels {
                    node: n.node.to_owned(),
                    to,
                });
            }
            for &listener in &n.http_listeners {
                http_listeners.insert(listener);
                for class in CLASSES {
                    let _ = self.requests.get_or_create(&RequestLabels {
                        listener: listener.to_owned(),
                        node: n.node.to_owned(),
                        class,
                    });
                }
                let _ = self.latency.get_or_create(&LatencyLabels {
                    listener: listener.to_owned(),
                    node: n.node.to_owned(),
                });
            }
            let l = NodeLabels {
                node: n.node.to_owned(),
            };
            self.node_active.get_or_create(&l).set(gauge(n.active));
            self.node_tunnels.get_or_create(&l).set(gauge(n.tunnels));
            self.node_pins.get_or_create(&l).set(gauge(n.pins));
            self.node_seen.get_or_create(&l).set(gauge(n.seen));
            for s in STATES {
                self.node_state
                    .get_or_create(&NodeStateLabels {
                        node: n.node.to_owned(),
                        state: s,
                    })
                    .set(i64::from(s == n.state));
            }
        }
        for listener in http_listeners {
            let outcomes = [("sticky", "none"), ("new", "none")]
                .into_iter()
                .chain(RepinReason::ALL.iter().map(|r| ("repinned", r.as_str())));
            for (outcome, reason) in outcomes {
                let _ = self.pins.get_or_create(&PinLabels {
                    listener: listener.to_owned(),
                    outcome,
                    reason,
                });
            }
        }
        let mut seen = self
            .evictions_seen
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        // The tables of this snapshot only: one removed and later added back (a new table,
        // its totals from 0) is not diffed against what the old one had.
        let mut now_seen = std::collections::BTreeMap::new();
        for t in tables {
            let labels = TableLabels {
                table: t.table.to_owned(),
            };
            self.table_entries
                .get_or_create(&labels)
                .set(gauge(t.entries));
            self.table_held.get_or_create(&labels).set(gauge(t.held));
            let id = (t.table.to_owned(), t.key.to_owned());
            let (last_evicted, last_refused) = seen.get(&id).copied().unwrap_or((0, 0));
            // A table's totals only grow while it lives: lower ones are of a table built
            // anew under the same name and key (removed and added back between two
            // scrapes), counted from 0.
            let grown = |now: u64, last: u64| if now >= last { now - last } else { now };
            self.table_evictions(t.table, grown(t.evictions, last_evicted));
            self.refused
                .get_or_create(&labels)
                .inc_by(grown(t.refused, last_refused));
            now_seen.insert(id, (t.evictions, t.refused));
        }
        *seen = now_seen;
    }

    pub fn totals(&self) -> TotalsView {
        let t = &self.totals;
        TotalsView {
            requests: t.requests.load(Ordering::Relaxed),
            errors: t.errors.load(Ordering::Relaxed),
            sticky: t.sticky.load(Ordering::Relaxed),
            new: t.new.load(Ordering::Relaxed),
            repinned: t.repinned.load(Ordering::Relaxed),
            health_transitions: t.transitions.load(Ordering::Relaxed),
        }
    }

    /// The Prometheus text exposition (OpenMetrics flavour, as `prometheus-client` writes it).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if encode(&mut out, &self.registry).is_err() {
            // Writing to a String cannot fail; keep the endpoint answering if it ever does.
            out.clear();
            let _ = writeln!(out, "# metrics encoding failed");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use limpet_core::NodeId;
    use std::time::Duration;

    #[test]
    fn hooks_show_up_in_the_text_format() {
        let m = std::sync::Arc::new(Metrics::new());
        let web = ListenerMetrics::new(&m, "web", ["a"]);
        web.request(Some(NodeId(0)), 200);
        web.request(None, 503);
        m.decision("web", &Decision::Sticky(NodeId(0)));
        m.decision(
            "web",
            &Decision::Fresh {
                node: NodeId(1),
                repin: Some(RepinReason::DrainEnded),
            },
        );
        m.health_transition("a", Transition::WentDown);
        web.upstream_latency(NodeId(0), Duration::from_millis(3));
        m.table_evictions("by-ip", 2);
        m.reload(false);
        m.set_gauges(
            [NodeGauges {
                node: "a",
                state: "DRAIN",
                active: 4,
                tunnels: 1,
                pins: 7,
                seen: 12,
                http_listeners: vec!["web"],
            }],
            [TableGauges {
                table: "by-ip",
                entries: 9,
                held: 2,
                ..TableGauges::default()
            }],
        );
        let text = m.encode();
        for want in [
            r#"limpet_requests_total{listener="web",node="a",class="2xx"} 1"#,
            r#"limpet_requests_total{listener="web",node="",class="5xx"} 1"#,
            r#"limpet_pins_total{listener="web",outcome="sticky",reason="none"} 1"#,
            r#"limpet_pins_total{listener="web",outcome="repinned",reason="drain-ended"} 1"#,
            r#"limpet_health_transitions_total{node="a",to="down"} 1"#,
            r#"limpet_upstream_latency_seconds_count{listener="web",node="a"} 1"#,
            r#"limpet_table_evictions_total{table="by-ip"} 2"#,
            r#"limpet_config_reloads_total{result="refused"} 1"#,
            r#"limpet_node_active_connections{node="a"} 4"#,
            r#"limpet_node_sessions_seen{node="a"} 12"#,
            r#"limpet_node_state{node="a",state="DRAIN"} 1"#,
            r#"limpet_node_state{node="a",state="UP"} 0"#,
            r#"limpet_table_entries{table="by-ip"} 9"#,
            r#"limpet_table_held_keys{table="by-ip"} 2"#,
            r#"limpet_table_pins_refused_total{table="by-ip"} 0"#,
        ] {
            assert!(text.contains(want), "missing {want} in\n{text}");
        }
        // Table totals read from the store feed the eviction and refused counters by
        // difference.
        let by_ip = |evictions, refused| TableGauges {
            table: "by-ip",
            key: "",
            entries: 9,
            held: 0,
            evictions,
            refused,
        };
        m.set_gauges([], [by_ip(3, 4)]);
        m.set_gauges([], [by_ip(3, 6)]);
        let text = m.encode();
        assert!(text.contains(r#"limpet_table_evictions_total{table="by-ip"} 5"#));
        assert!(text.contains(r#"limpet_table_pins_refused_total{table="by-ip"} 6"#));
        let t = m.totals();
        assert_eq!((t.requests, t.errors, t.sticky, t.repinned), (2, 1, 1, 1));
        // A node gone from the snapshot disappears from the gauges.
        m.set_gauges([], []);
        assert!(!m.encode().contains(r#"limpet_node_pins{node="a"}"#));
    }

    /// A reload that keys a table anew builds another table, whose totals start at 0: its
    /// evictions add to the old one's (3 seen, then 4 in the new table: 7), where a diff by
    /// name alone counted 4 - 3. A table removed and added back later starts at 0 too.
    #[test]
    fn a_table_keyed_anew_adds_its_totals_to_the_old_one_s() {
        let m = Metrics::new();
        let t = |key, evictions, refused| TableGauges {
            table: "t",
            key,
            evictions,
            refused,
            ..TableGauges::default()
        };
        let counted = |m: &Metrics| {
            let text = m.encode();
            let value = |family: &str| {
                text.lines()
                    .find_map(|l| l.strip_prefix(&format!("{family}{{table=\"t\"}} ")))
                    .and_then(|v| v.parse::<u64>().ok())
            };
            (
                value("limpet_table_evictions_total"),
                value("limpet_table_pins_refused_total"),
            )
        };
        m.set_gauges([], [t("source-ip", 3, 1)]);
        assert_eq!(counted(&m), (Some(3), Some(1)));
        m.set_gauges([], [t("header x-sess", 4, 2)]);
        assert_eq!(counted(&m), (Some(7), Some(3)));
        m.set_gauges([], [t("header x-sess", 6, 2)]);
        assert_eq!(counted(&m), (Some(9), Some(3)));
        // Removed, then added back with the key it had: a new table again.
        m.set_gauges([], []);
        m.set_gauges([], [t("header x-sess", 1, 0)]);
        assert_eq!(counted(&m), (Some(10), Some(3)));
    }

    /// The names of the families as scraped: a counter's samples end in `_total`.
    const FAMILIES: [&str; 14] = [
        "limpet_requests_total",
        "limpet_pins_total",
        "limpet_health_transitions_total",
        "limpet_upstream_latency_seconds",
        "limpet_table_evictions_total",
        "limpet_config_reloads_total",
        "limpet_node_active_connections",
        "limpet_node_tunnels",
        "limpet_node_pins",
        "limpet_node_sessions_seen",
        "limpet_node_state",
        "limpet_table_entries",
        "limpet_table_pins_refused_total",
        "limpet_table_held_keys",
    ];

    #[test]
    fn every_family_is_written_before_anything_happened() {
        // Nothing known at all: every family still has its TYPE line.
        let text = Metrics::new().encode();
        for f in FAMILIES {
            let base = f.trim_end_matches("_total");
            assert!(
                text.contains(&format!("# TYPE {base} ")),
                "no TYPE line for {f} in\n{text}"
            );
        }
        assert!(text.contains(r#"limpet_config_reloads_total{result="refused"} 0"#));
        // Once the admin server has named the nodes, listeners and tables: a zero series each.
        let m = Metrics::new();
        m.set_gauges(
            [NodeGauges {
                node: "a",
                state: "UP",
                http_listeners: vec!["web"],
                ..NodeGauges::default()
            }],
            [TableGauges {
                table: "by-ip",
                ..TableGauges::default()
            }],
        );
        let text = m.encode();
        for f in FAMILIES {
            let sample = if f == "limpet_upstream_latency_seconds" {
                format!("{f}_count{{")
            } else {
                format!("{f}{{")
            };
            assert!(text.contains(&sample), "no series of {f} in\n{text}");
        }
        for want in [
            r#"limpet_requests_total{listener="web",node="a",class="5xx"} 0"#,
            r#"limpet_pins_total{listener="web",outcome="repinned",reason="node-down"} 0"#,
            r#"limpet_health_transitions_total{node="a",to="down"} 0"#,
            r#"limpet_table_evictions_total{table="by-ip"} 0"#,
            r#"limpet_upstream_latency_seconds_count{listener="web",node="a"} 0"#,
        ] {
            assert!(text.contains(want), "missing {want} in\n{text}");
        }
    }

    #[test]
    fn requests_and_answer_times_feed_the_node_traffic() {
        let m = std::sync::Arc::new(Metrics::new());
        let web = ListenerMetrics::new(&m, "web", ["a"]);
        web.request(Some(NodeId(0)), 200);
        web.request(Some(NodeId(0)), 502);
        web.request(Some(NodeId(0)), 0);
        web.request(None, 503);
        web.upstream_latency(NodeId(0), Duration::from_millis(40));
        m.node_traffic("a").add_out(1234);
        let v = m.traffic("a", crate::clock::now_ms());
        assert_eq!((v.requests, v.errors, v.bytes_out), (3, 2, 1234));
        let p50 = v.answer_p50_ms.unwrap_or(0.0);
        assert!((37.0..=43.0).contains(&p50), "{v:?}");
    }
}
