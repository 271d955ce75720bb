//! # Per-node traffic for the stats page: what each node is doing now, and the last minutes
//!
//! Prometheus gets counters and histograms (the parent module) and computes rates itself. An
//! operator on the stats page wants the answers directly: per node, requests and errors per
//! second, p50/p99 answer time, bytes, and a chart of the last minutes. This module keeps what
//! that takes, in memory: the counters for the life of the process, the history for as long
//! as the node is configured:
//!
//! ```text
//!  data plane hooks ─► NodeTraffic (cumulative atomics, one per node name)
//!        Metrics::request, Metrics::upstream_latency, body byte counts (proxy::body)
//!  sampler (the admin server, every SAMPLE_EVERY) ─► a ring of HISTORY_SAMPLES samples per
//!        configured node (a node a reload removed or renamed: its ring dropped)
//!  reads ─► TrafficView: rates over the last RATE_WINDOW, p50/p99 over the last LATENCY_WINDOW
//!        ─► HistoryView: one point per sample (requests/s, errors/s, p99) for the charts
//! ```
//!
//! The hot path only adds to atomics. Answer times go into a log-linear histogram (8 buckets
//! per power of two of microseconds, so a quantile is within about 6 % of the true value); a
//! sample keeps only the buckets that moved since the previous one, so five minutes of history
//! cost a few kilobytes per node.
//!
//! Before a node's first count, every count is zero: a node registered 3 s ago that served 30
//! requests did 30 requests in the last 10 s, so its rate is 3/s, not 10/s.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use serde::Serialize;

/// How often the admin server samples every node's counters for the charts.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(5);
/// Samples kept per node: five minutes at [`SAMPLE_EVERY`].
pub const HISTORY_SAMPLES: usize = 60;
/// The window of the "now" rates (requests/s, errors/s, bytes/s).
pub const RATE_WINDOW: Duration = Duration::from_secs(10);
/// The window of the p50/p99 answer times.
pub const LATENCY_WINDOW: Duration = Duration::from_secs(60);

/// Sub-buckets per power of two: a bucket spans 1/8 of its octave.
const SUB: usize = 8;
/// Octaves above the first linear ones: up to 2^28 µs (about 268 s), the rest in the last.
const BUCKETS: usize = 26 * SUB;

/// The histogram bucket of an answer time in microseconds: values under 8 µs each have their
/// own; above, 8 buckets per power of two.
fn bucket(us: u64) -> usize {
    if us < SUB as u64 {
        return us as usize;
    }
    let exp = 63 - us.leading_zeros() as usize; // >= 3
    let sub = ((us >> (exp - 3)) & (SUB as u64 - 1)) as usize;
    ((exp - 2) * SUB + sub).min(BUCKETS - 1)
}

/// The middle of a bucket, in microseconds: what a quantile falling in it reports.
fn bucket_mid_us(i: usize) -> f64 {
    if i < SUB {
        return i as f64;
    }
    let exp = i / SUB + 2;
    let sub = (i % SUB) as u64;
    let width = 1u64 << (exp - 3);
    ((SUB as u64 + sub) << (exp - 3)) as f64 + width as f64 / 2.0
}

/// The `q` quantile (0..=1) of bucket counts, in milliseconds; `None` without any count.
fn quantile_ms(counts: &[u64], q: f64) -> Option<f64> {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return None;
    }
    // The smallest bucket holding the rank-th value (1-based), as Prometheus ranks.
    let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
    let mut seen = 0;
    for (i, &c) in counts.iter().enumerate() {
        seen += c;
        if seen >= rank {
            return Some(bucket_mid_us(i) / 1000.0);
        }
    }
    None
}

/// Why a node's answer was cut after its head had gone to the client (the client sees the
/// answer end early; its status was already counted and logged as the node gave it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerCut {
    /// The node sent nothing more for `answer_body_idle` (a node stalled mid-answer).
    Idle,
    /// The node's connection failed mid-answer: reset, closed before the announced length,
    /// or a body framing error.
    Error,
}

impl AnswerCut {
    pub const ALL: [AnswerCut; 2] = [AnswerCut::Idle, AnswerCut::Error];

    /// The `cause` label of `limpet_node_answers_cut_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            AnswerCut::Idle => "idle",
            AnswerCut::Error => "error",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// One node's cumulative counts since it was first seen. The data plane adds to them.
#[derive(Debug)]
pub struct NodeTraffic {
    name: Box<str>,
    /// When this node's counts started (all were zero before): `clock::now_ms` scale.
    created_ms: u64,
    requests: AtomicU64,
    errors: AtomicU64,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    latency: Box<[AtomicU64]>,
    /// Answers cut mid-body, by [`AnswerCut`]: HAProxy's `srv_abrt`, the `sD` and `SD` of its
    /// log. Neither HAProxy nor nginx counts one against the node's health (the node answered,
    /// and may be streaming on purpose), and limpet does not either; it makes them visible.
    answers_cut: [AtomicU64; AnswerCut::ALL.len()],
    cut_log: crate::net::RateLimitedLog,
    /// Requests answered 504 as slow by themselves: no answer within the answer timeout
    /// while the node answered requests sent after them (`limpet_core::answered_since`), so
    /// neither charged to the node nor replayed. HAProxy's `timeout server` 504s.
    answers_slow: AtomicU64,
    slow_log: crate::net::RateLimitedLog,
}

impl NodeTraffic {
    fn new(name: &str, created_ms: u64) -> Self {
        NodeTraffic {
            name: name.into(),
            created_ms,
            requests: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
            latency: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            answers_cut: std::array::from_fn(|_| AtomicU64::new(0)),
            cut_log: crate::net::RateLimitedLog::new(
                "a node's answer was cut mid-body: the client saw it end early",
            ),
            answers_slow: AtomicU64::new(0),
            slow_log: crate::net::RateLimitedLog::new(
                "a request got no answer in time from a node that answers others: 504, not \
                 replayed, no failure of the node (a slow answer toward max_slow_answers)",
            ),
        }
    }

    /// A node's answer was cut after its head went out (`detail`: what the node did).
    /// Counted, and logged at most once per [`crate::net::LOG_EVERY`] per node.
    pub fn answer_cut(&self, cut: AnswerCut, detail: &dyn std::fmt::Display) {
        self.answers_cut[cut.index()].fetch_add(1, Ordering::Relaxed);
        self.cut_log
            .note_with(|| format!("node {}, cause {}: {detail}", self.name, cut.as_str()));
    }

    /// A request to the node was answered 504 as slow by itself. Counted, and logged at most
    /// once per [`crate::net::LOG_EVERY`] per node.
    pub fn answer_slow(&self) {
        self.answers_slow.fetch_add(1, Ordering::Relaxed);
        self.slow_log.note_with(|| format!("node {}", self.name));
    }

    /// Requests answered 504 as slow by themselves since the node was first seen.
    pub fn answers_slow(&self) -> u64 {
        self.answers_slow.load(Ordering::Relaxed)
    }

    /// The node's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Answers cut mid-body for `cut` since the node was first seen.
    pub fn answers_cut(&self, cut: AnswerCut) -> u64 {
        self.answers_cut[cut.index()].load(Ordering::Relaxed)
    }

    /// Request bytes forwarded to the node (client to node).
    pub fn add_in(&self, n: u64) {
        self.bytes_in.fetch_add(n, Ordering::Relaxed);
    }

    /// Answer bytes relayed from the node (node to client).
    pub fn add_out(&self, n: u64) {
        self.bytes_out.fetch_add(n, Ordering::Relaxed);
    }

    pub(super) fn request(&self, error: bool) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        if error {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(super) fn answer_time(&self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        if let Some(b) = self.latency.get(bucket(us)) {
            b.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn counts(&self) -> Counts {
        Counts {
            requests: self.requests.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            bytes_in: self.bytes_in.load(Ordering::Relaxed),
            bytes_out: self.bytes_out.load(Ordering::Relaxed),
        }
    }

    fn latency_counts(&self) -> Vec<u64> {
        self.latency
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect()
    }
}

/// The plain counters of a node at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Counts {
    requests: u64,
    errors: u64,
    bytes_in: u64,
    bytes_out: u64,
}

impl Counts {
    fn since(self, earlier: Counts) -> Counts {
        Counts {
            requests: self.requests.saturating_sub(earlier.requests),
            errors: self.errors.saturating_sub(earlier.errors),
            bytes_in: self.bytes_in.saturating_sub(earlier.bytes_in),
            bytes_out: self.bytes_out.saturating_sub(earlier.bytes_out),
        }
    }
}

/// One sample of one node.
#[derive(Debug)]
struct Sample {
    t_ms: u64,
    /// The previous point's time (the previous sample, or the node's start).
    since_ms: u64,
    /// Cumulative counts at `t_ms`, and what they moved by since the previous point.
    counts: Counts,
    moved: Counts,
    /// Answer-time buckets that moved since the previous point: (bucket, count).
    latency: Box<[(u8, u32)]>,
}

impl Sample {
    fn per_sec(&self, n: u64) -> f64 {
        n as f64 * 1000.0 / self.t_ms.saturating_sub(self.since_ms).max(1) as f64
    }
}

#[derive(Debug)]
struct NodeHistory {
    samples: VecDeque<Sample>,
    /// Cumulative answer-time buckets at the newest sample.
    latency: Vec<u64>,
}

/// What the admin API shows of a node's traffic (HTTP requests relayed through limpet).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrafficView {
    /// Requests answered by the node since limpet started, and those answered 5xx or not at
    /// all.
    pub requests: u64,
    pub errors: u64,
    /// Body bytes forwarded to the node (requests) and from it (answers).
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// Rates over the last `rate_window_secs` (at most one sample interval more).
    pub requests_per_sec: f64,
    pub errors_per_sec: f64,
    pub bytes_in_per_sec: f64,
    pub bytes_out_per_sec: f64,
    pub rate_window_secs: u64,
    /// Time to the node's answer head: median and 99th percentile over the last
    /// `latency_window_secs`, within about 6 %; `null` without an answer in the window.
    pub answer_p50_ms: Option<f64>,
    pub answer_p99_ms: Option<f64>,
    pub latency_window_secs: u64,
    /// Answers cut after their head went to the client (the node stalled for
    /// `answer_body_idle`, or its connection failed mid-body), since limpet started; counted
    /// in `requests` by their status too.
    pub answers_cut: u64,
    /// Requests answered 504 because the node did not answer them in time while it answered
    /// requests sent after them (slow by themselves: no failure of the node, not replayed;
    /// counted toward `max_slow_answers`), since limpet started.
    pub answers_slow: u64,
}

/// The charts' data for one node: one point per sample, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeHistoryView {
    pub node: String,
    /// When each sample was taken (milliseconds since the Unix epoch).
    pub t_ms: Vec<u64>,
    /// Over the interval that ends at the sample.
    pub requests_per_sec: Vec<f64>,
    pub errors_per_sec: Vec<f64>,
    pub answer_p99_ms: Vec<Option<f64>>,
}

/// The charts' data of every node asked for.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HistoryView {
    pub now_ms: u64,
    pub every_ms: u64,
    /// How far back the history reaches at most.
    pub span_ms: u64,
    pub nodes: Vec<NodeHistoryView>,
}

/// Every node's traffic counters and history. See the module docs.
#[derive(Debug, Default)]
pub(super) struct Traffic {
    nodes: RwLock<BTreeMap<String, Arc<NodeTraffic>>>,
    history: Mutex<BTreeMap<String, NodeHistory>>,
}

fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

impl Traffic {
    /// The counters of `node`, created (all zero as of `now_ms()`) on first use.
    pub(super) fn node(&self, node: &str, now_ms: impl FnOnce() -> u64) -> Arc<NodeTraffic> {
        if let Some(t) = self
            .nodes
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(node)
        {
            return Arc::clone(t);
        }
        let mut nodes = self.nodes.write().unwrap_or_else(|e| e.into_inner());
        Arc::clone(
            nodes
                .entry(node.to_owned())
                .or_insert_with(|| Arc::new(NodeTraffic::new(node, now_ms()))),
        )
    }

    fn lock_history(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, NodeHistory>> {
        // Every critical section leaves the rings consistent: a poisoned lock is still usable.
        self.history.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes one sample of the counters of every node in `configured`, and drops the
    /// history of every other: a node a reload removed or renamed was sampled, and its ring
    /// kept and served, for the life of the process (one more for each rename). Its counters
    /// stay: they are what its Prometheus series read, and a node added back carries on
    /// under its name (its history starts anew).
    pub(super) fn sample<'a>(&self, now_ms: u64, configured: impl IntoIterator<Item = &'a str>) {
        let configured: std::collections::BTreeSet<&str> = configured.into_iter().collect();
        let nodes: Vec<(String, Arc<NodeTraffic>)> = self
            .nodes
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(n, _)| configured.contains(n.as_str()))
            .map(|(n, t)| (n.clone(), Arc::clone(t)))
            .collect();
        let mut history = self.lock_history();
        history.retain(|n, _| configured.contains(n.as_str()));
        for (name, t) in nodes {
            let h = history.entry(name).or_insert_with(|| NodeHistory {
                samples: VecDeque::with_capacity(HISTORY_SAMPLES),
                latency: vec![0; BUCKETS],
            });
            let since_ms = h.samples.back().map_or(t.created_ms, |s| s.t_ms);
            if now_ms <= since_ms {
                continue;
            }
            let latency = t.latency_counts();
            let moved: Box<[(u8, u32)]> = latency
                .iter()
                .zip(&h.latency)
                .enumerate()
                .filter(|(_, (now, was))| now > was)
                .map(|(i, (now, was))| {
                    (
                        u8::try_from(i).unwrap_or(u8::MAX),
                        u32::try_from(now - was).unwrap_or(u32::MAX),
                    )
                })
                .collect();
            h.latency = latency;
            let counts = t.counts();
            let before = h.samples.back().map_or(Counts::default(), |s| s.counts);
            if h.samples.len() == HISTORY_SAMPLES {
                h.samples.pop_front();
            }
            h.samples.push_back(Sample {
                t_ms: now_ms,
                since_ms,
                counts,
                moved: counts.since(before),
                latency: moved,
            });
        }
    }

    /// A node's counts, rates and answer times as of `now_ms`.
    pub(super) fn view(&self, node: &str, now_ms: u64) -> TrafficView {
        let t = self.node(node, || now_ms);
        let now = t.counts();
        let live_latency = t.latency_counts();
        let history = self.lock_history();
        let node_history = history.get(node);
        let samples = node_history.map(|h| &h.samples);
        // Known counts at a time no later than `at`, and the index of the first sample after
        // it: the newest sample at or before `at`; else the node's start, or `at` itself when
        // the node started later (every count was zero then).
        let base = |at: u64| -> (u64, Counts, usize) {
            let i = samples.map_or(0, |s| s.partition_point(|x| x.t_ms <= at));
            match samples.and_then(|s| i.checked_sub(1).and_then(|j| s.get(j))) {
                Some(s) => (s.t_ms, s.counts, i),
                None if at >= t.created_ms => (t.created_ms, Counts::default(), 0),
                None => (at, Counts::default(), 0),
            }
        };
        let (t0, c0, _) = base(now_ms.saturating_sub(crate::clock::ms(RATE_WINDOW)));
        let d = now.since(c0);
        let secs = (now_ms.saturating_sub(t0) as f64 / 1000.0).max(1.0);
        let rate = |n: u64| round2(n as f64 / secs);

        // Answer times in the window: what moved after the base sample.
        let (_, _, first) = base(now_ms.saturating_sub(crate::clock::ms(LATENCY_WINDOW)));
        // Without a sample before the window: everything since the node's start.
        let mut window = live_latency;
        if let Some(h) = node_history.filter(|_| first > 0) {
            for (w, last) in window.iter_mut().zip(&h.latency) {
                *w = w.saturating_sub(*last);
            }
            for sample in h.samples.iter().skip(first) {
                for &(b, n) in sample.latency.iter() {
                    if let Some(w) = window.get_mut(usize::from(b)) {
                        *w += u64::from(n);
                    }
                }
            }
        }
        TrafficView {
            requests: now.requests,
            errors: now.errors,
            bytes_in: now.bytes_in,
            bytes_out: now.bytes_out,
            requests_per_sec: rate(d.requests),
            errors_per_sec: rate(d.errors),
            bytes_in_per_sec: rate(d.bytes_in),
            bytes_out_per_sec: rate(d.bytes_out),
            rate_window_secs: RATE_WINDOW.as_secs(),
            answer_p50_ms: quantile_ms(&window, 0.5).map(round2),
            answer_p99_ms: quantile_ms(&window, 0.99).map(round2),
            latency_window_secs: LATENCY_WINDOW.as_secs(),
            answers_cut: AnswerCut::ALL.iter().map(|&c| t.answers_cut(c)).sum(),
            answers_slow: t.answers_slow(),
        }
    }

    /// Every node's traffic counters seen so far, by name (for a scrape).
    pub(super) fn nodes(&self) -> Vec<Arc<NodeTraffic>> {
        self.nodes
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// The charts' points of every node sampled since limpet started, by name.
    pub(super) fn history(&self, now_ms: u64) -> HistoryView {
        let history = self.lock_history();
        let nodes = history
            .iter()
            .map(|(name, h)| {
                let mut v = NodeHistoryView {
                    node: name.clone(),
                    t_ms: Vec::new(),
                    requests_per_sec: Vec::new(),
                    errors_per_sec: Vec::new(),
                    answer_p99_ms: Vec::new(),
                };
                let mut buckets = vec![0u64; BUCKETS];
                for s in &h.samples {
                    buckets.iter_mut().for_each(|b| *b = 0);
                    for &(b, n) in s.latency.iter() {
                        if let Some(x) = buckets.get_mut(usize::from(b)) {
                            *x = u64::from(n);
                        }
                    }
                    v.t_ms.push(s.t_ms);
                    v.requests_per_sec.push(round2(s.per_sec(s.moved.requests)));
                    v.errors_per_sec.push(round2(s.per_sec(s.moved.errors)));
                    v.answer_p99_ms
                        .push(quantile_ms(&buckets, 0.99).map(round2));
                }
                v
            })
            .collect();
        HistoryView {
            now_ms,
            every_ms: crate::clock::ms(SAMPLE_EVERY),
            span_ms: crate::clock::ms(SAMPLE_EVERY) * HISTORY_SAMPLES as u64,
            nodes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_the_range_in_order_within_a_sixteenth() {
        let mut last = 0;
        for us in [
            0u64,
            1,
            7,
            8,
            9,
            15,
            16,
            100,
            1_000,
            12_345,
            1_000_000,
            100_000_000,
        ] {
            let b = bucket(us);
            assert!(b >= last, "{us} µs went to bucket {b} after {last}");
            last = b;
            if us >= 8 {
                let mid = bucket_mid_us(b);
                let err = (mid - us as f64).abs() / us as f64;
                assert!(err <= 1.0 / 16.0 + 1e-9, "{us} µs reads as {mid} ({err})");
            }
        }
        assert_eq!(
            bucket(u64::MAX),
            BUCKETS - 1,
            "huge values land in the last bucket"
        );
    }

    #[test]
    fn quantiles_rank_like_prometheus() {
        let mut counts = vec![0u64; BUCKETS];
        // 98 answers at 1 ms, 2 at 100 ms.
        counts[bucket(1_000)] = 98;
        counts[bucket(100_000)] = 2;
        let p50 = quantile_ms(&counts, 0.5).unwrap_or(0.0);
        let p99 = quantile_ms(&counts, 0.99).unwrap_or(0.0);
        assert!((0.94..=1.07).contains(&p50), "{p50}");
        assert!((94.0..=107.0).contains(&p99), "{p99}");
        assert_eq!(quantile_ms(&[0; BUCKETS], 0.5), None);
    }

    #[test]
    fn rates_use_the_window_and_zero_before_a_node_started() {
        let t = Traffic::default();
        let start = 1_000_000;
        let a = t.node("a", || start);
        for _ in 0..30 {
            a.request(false);
        }
        a.request(true);
        a.add_out(5_000);
        // 3 s after the node's start: 31 requests in the last 10 s.
        let v = t.view("a", start + 3_000);
        assert_eq!((v.requests, v.errors, v.bytes_out), (31, 1, 5_000));
        assert!((v.requests_per_sec - 3.1).abs() < 1e-9, "{v:?}");
        assert!((v.errors_per_sec - 0.1).abs() < 1e-9, "{v:?}");
        // Sampled, then quiet: once the window has passed, nothing per second.
        t.sample(start + 5_000, ["a"]);
        t.sample(start + 10_000, ["a"]);
        t.sample(start + 15_000, ["a"]);
        let v = t.view("a", start + 25_000);
        assert_eq!(v.requests_per_sec, 0.0, "{v:?}");
        assert_eq!(v.requests, 31, "totals stay");
        // New traffic after the samples counts in the window.
        for _ in 0..20 {
            a.request(false);
        }
        let v = t.view("a", start + 25_000);
        // Base: the sample at +15 s (the newest at or before +15 s): 20 over 10 s.
        assert!((v.requests_per_sec - 2.0).abs() < 1e-9, "{v:?}");
    }

    #[test]
    fn answer_times_cover_the_last_minute_only() {
        let t = Traffic::default();
        let start = 5_000_000;
        let a = t.node("a", || start);
        for _ in 0..100 {
            a.answer_time(Duration::from_millis(200));
        }
        t.sample(start + 5_000, ["a"]);
        let v = t.view("a", start + 6_000);
        let p50 = v.answer_p50_ms.unwrap_or(0.0);
        assert!((188.0..=213.0).contains(&p50), "{v:?}");
        // A minute later, fast answers only: the slow ones left the window.
        for i in 2..=14 {
            t.sample(start + i * 5_000, ["a"]);
        }
        for _ in 0..10 {
            a.answer_time(Duration::from_millis(2));
        }
        let v = t.view("a", start + 70_000);
        let p99 = v.answer_p99_ms.unwrap_or(0.0);
        assert!((1.8..=2.2).contains(&p99), "{v:?}");
        // Nothing at all in the window: no figure.
        for i in 15..=30 {
            t.sample(start + i * 5_000, ["a"]);
        }
        assert_eq!(t.view("a", start + 150_000).answer_p50_ms, None);
    }

    /// A node the configuration no longer has (a reload removed or renamed it) is not
    /// sampled, and its history goes, while its counters stay; added back, it is sampled
    /// again from there. Before, every node ever seen was sampled and kept for good.
    #[test]
    fn a_node_no_longer_configured_leaves_the_history_and_keeps_its_counters() {
        let t = Traffic::default();
        let start = 7_000_000;
        for n in ["a", "b"] {
            t.node(n, || start).request(false);
        }
        t.sample(start + 5_000, ["a", "b"]);
        let names = |t: &Traffic, at| {
            t.history(at)
                .nodes
                .into_iter()
                .map(|n| (n.node, n.t_ms.len()))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            names(&t, start + 5_000),
            [("a".to_owned(), 1), ("b".to_owned(), 1)]
        );
        // `b` renamed `c`.
        t.node("c", || start + 6_000);
        t.sample(start + 10_000, ["a", "c"]);
        assert_eq!(
            names(&t, start + 10_000),
            [("a".to_owned(), 2), ("c".to_owned(), 1)]
        );
        assert_eq!(t.view("b", start + 10_000).requests, 1, "counters kept");
        // `b` added back: a history of its own again, from its next sample.
        t.sample(start + 15_000, ["a", "b", "c"]);
        assert_eq!(
            names(&t, start + 15_000),
            [
                ("a".to_owned(), 3),
                ("b".to_owned(), 1),
                ("c".to_owned(), 2)
            ]
        );
    }

    #[test]
    fn history_gives_one_point_per_sample_and_keeps_five_minutes() {
        let t = Traffic::default();
        let start = 9_000_000;
        let a = t.node("a", || start);
        for i in 1..=(HISTORY_SAMPLES as u64 + 10) {
            for _ in 0..i {
                a.request(i % 10 == 0);
            }
            a.answer_time(Duration::from_millis(i));
            t.sample(start + i * 5_000, ["a"]);
        }
        t.node("b", || start);
        let h = t.history(start + 400_000);
        assert_eq!(h.nodes.len(), 1, "a node never sampled has no history");
        let a = &h.nodes[0];
        assert_eq!(a.node, "a");
        // The ring holds HISTORY_SAMPLES: five minutes.
        assert_eq!(a.t_ms.len(), HISTORY_SAMPLES);
        assert_eq!(a.requests_per_sec.len(), a.t_ms.len());
        let last = a.requests_per_sec.last().copied().unwrap_or(0.0);
        assert!((last - 70.0 / 5.0).abs() < 1e-9, "{last}");
        assert_eq!(a.errors_per_sec.last().copied(), Some(70.0 / 5.0));
        assert!(a.answer_p99_ms.last().copied().flatten().is_some());
        assert_eq!(h.span_ms, 300_000);
    }
}
