//! # Active health checks
//!
//! One task per (node, check) probes the node's check address every `interval` (plus or minus
//! a random `jitter`, and a random first offset, so the checks of many nodes never align), and
//! reports every result to a [`HealthSink`]. The sink owns the state: in limpet it is the
//! node's runtime, which feeds the decision core's `Health::observe` (`CheckPassed` /
//! `CheckFailed`); that applies `fall` / `rise` and says whether the node flipped. Probing
//! never decides anything; the same state machine also takes passive observations from live
//! traffic.
//!
//! ```text
//!  HealthChecks::spawn ─► task per (node, check) ─ sleep(next) ─► probe::run(kind, addr, timeout)
//!                                                                   │ ok / error + detail
//!                                     HealthBoard (per-node detail) ◄┤
//!                                                                   ▼
//!                          HealthSink::record(node, slot, ok, detail) ─► Option<Transition>
//! ```
//!
//! Each check of a node runs in a slot of its own (`limpet_core::CheckSlot`, the lowest free
//! one among that node's checks), so the core can tell a node whose checks all pass from one
//! with a port that keeps failing while another answers. A check a reload stops frees its
//! slot and is forgotten by the node's health ([`HealthSink::forget`]).
//!
//! Kinds ([`CheckKind`]): a TCP connect; an HTTP/1.1 request with an expected status range,
//! over TLS where the node is reached over TLS (the listener's own client config, so the
//! check sees what the proxy's connections see); a TLS handshake. Defaults are HAProxy's:
//! `inter 2s`, `fall 3`, `rise 2`; the timeout defaults to the interval (HAProxy's `timeout
//! check` falls back to `inter` the same way), the jitter to a tenth of the interval.
//!
//! The [`HealthBoard`] keeps, per check, the last result, its error, its duration and the
//! consecutive counts, for the admin API.

mod probe;

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use limpet_core::{CheckSlot, HealthPolicy, Transition};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tokio::task::JoinHandle;
use tokio::time::Instant;

pub use probe::{insecure_tls_config, probe};

/// An inclusive range of HTTP status codes a check accepts (`200-399`, or one code `204`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatusRange {
    pub lo: u16,
    pub hi: u16,
}

impl Default for StatusRange {
    /// 2xx and 3xx, as HAProxy's `option httpchk` without `http-check expect`.
    fn default() -> Self {
        StatusRange { lo: 200, hi: 399 }
    }
}

impl StatusRange {
    pub fn contains(&self, status: u16) -> bool {
        (self.lo..=self.hi).contains(&status)
    }
}

impl fmt::Display for StatusRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.lo == self.hi {
            write!(f, "{}", self.lo)
        } else {
            write!(f, "{}-{}", self.lo, self.hi)
        }
    }
}

impl FromStr for StatusRange {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let code = |t: &str| {
            t.trim()
                .parse::<u16>()
                .ok()
                .filter(|c| (100..=599).contains(c))
                .ok_or_else(|| format!("{t:?} is not an HTTP status code (100 to 599)"))
        };
        let (lo, hi) = match s.split_once('-') {
            Some((a, b)) => (code(a)?, code(b)?),
            None => (code(s)?, code(s)?),
        };
        if lo > hi {
            return Err(format!("status range {s:?} is empty"));
        }
        Ok(StatusRange { lo, hi })
    }
}

/// An HTTP check: one request, `Connection: close`, the status line decides.
#[derive(Debug, Clone)]
pub struct HttpCheck {
    pub method: http::Method,
    /// Path and query, starting with `/`.
    pub path: String,
    /// The `Host` header; the check address when unset.
    pub host: Option<String>,
    pub expect: StatusRange,
    /// The TLS the request goes over (`None`: plain). A node its listener reaches over TLS
    /// answers only through TLS on that port: plain HTTP there fails every check, and a TLS
    /// handshake alone does not show that the node answers requests.
    pub tls: Option<TlsCheck>,
}

impl Default for HttpCheck {
    fn default() -> Self {
        HttpCheck {
            method: http::Method::GET,
            path: "/".into(),
            host: None,
            expect: StatusRange::default(),
            tls: None,
        }
    }
}

/// A TLS check: the handshake must complete (certificate verified as `config` says). Also
/// the TLS an [`HttpCheck`] goes over.
#[derive(Clone)]
pub struct TlsCheck {
    pub server_name: rustls_pki_types::ServerName<'static>,
    pub config: Arc<rustls::ClientConfig>,
    /// What `config` trusts ([`crate::tls::client_config_trusting`]): part of the check's
    /// settings, so that a reload that changes it (a new CA file, or the same file
    /// rewritten) restarts the check with the new config.
    pub trust: String,
}

impl fmt::Debug for TlsCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsCheck")
            .field("server_name", &self.server_name)
            .field("trust", &self.trust)
            .finish_non_exhaustive()
    }
}

/// What a check does.
#[derive(Debug, Clone)]
pub enum CheckKind {
    /// The TCP connection opens.
    Tcp,
    /// An HTTP/1.1 request (over TLS when [`HttpCheck::tls`] says) answers with a status in
    /// the expected range.
    Http(HttpCheck),
    /// A TLS handshake completes.
    Tls(TlsCheck),
}

impl CheckKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            CheckKind::Tcp => "tcp",
            CheckKind::Http(_) => "http",
            CheckKind::Tls(_) => "tls",
        }
    }
}

/// One check of one node.
#[derive(Debug, Clone)]
pub struct CheckSpec {
    pub kind: CheckKind,
    /// Where to probe: the node's address with the check port.
    pub addr: SocketAddr,
    /// Time between the starts of two checks (`inter`).
    pub interval: Duration,
    /// How long one check may take before it counts as failed.
    pub timeout: Duration,
    /// Consecutive failures that take an UP node DOWN.
    pub fall: u32,
    /// Consecutive successes that bring a DOWN node UP.
    pub rise: u32,
    /// Each wait is `interval` plus a uniformly random offset in `[-jitter, +jitter]`, and the
    /// first check waits a random part of one interval.
    pub jitter: Duration,
    /// An HTTP check's answer speaks for the node's HTTP traffic: it probes a port an HTTP
    /// listener forwards to. One on another port (a management port, a print server's web
    /// port beside its raw one) proves that port's process answers, not the traffic's: its
    /// pass counts as a connect-level one for a request left unanswered (it neither clears
    /// that streak nor makes such a request a slow one), so a node whose traffic port hangs
    /// while its check port answers goes DOWN on its unanswered requests.
    pub answers_for_traffic: bool,
    /// The PROXY header the check's connection opens with: the listener's own, when the
    /// check probes the node port its connections send one to (HAProxy's checks of a
    /// `send-proxy` server, without a check `port`). A check port gets none.
    pub proxy: Option<limpet_core::proxy_protocol::Version>,
}

impl CheckSpec {
    /// A check of this kind at `addr` with HAProxy's defaults (inter 2 s, fall 3, rise 2),
    /// a timeout of one interval and a jitter of a tenth of it.
    pub fn new(kind: CheckKind, addr: SocketAddr) -> Self {
        let interval = Duration::from_secs(2);
        CheckSpec {
            kind,
            addr,
            interval,
            timeout: interval,
            fall: 3,
            rise: 2,
            jitter: interval / 10,
            answers_for_traffic: true,
            proxy: None,
        }
    }

    /// The fall/rise policy the core applies to this check's results.
    pub fn policy(&self) -> HealthPolicy {
        HealthPolicy {
            fall: self.fall.max(1),
            rise: self.rise.max(1),
            checked: true,
            ..HealthPolicy::default()
        }
    }

    /// A short label naming the check, e.g. `tcp 127.0.0.1:9100`, `http 127.0.0.1:8081 GET
    /// /health` (with ` host H` and ` expect R` when set, and ` over tls name N` when it runs
    /// over TLS), `tls 127.0.0.1:8443 name n.example`. It is the check's identity on its
    /// node: two listeners asking for the same check share one, and checks that differ in
    /// what they ask (two paths on one port, or one port plain and over TLS) both run. It is
    /// also how a check's counts cross an upgrade, so it stays as it was: the PROXY header a
    /// check sends ([`Self::proxy`]) follows from its port, which the label has.
    pub fn label(&self) -> String {
        let (kind, addr) = (self.kind.as_str(), self.addr);
        match &self.kind {
            CheckKind::Tcp => format!("{kind} {addr}"),
            CheckKind::Http(h) => {
                let mut l = format!("{kind} {addr} {} {}", h.method, h.path);
                if let Some(host) = &h.host {
                    l.push_str(&format!(" host {host}"));
                }
                if h.expect != StatusRange::default() {
                    l.push_str(&format!(" expect {}", h.expect));
                }
                if let Some(t) = &h.tls {
                    l.push_str(&format!(" over tls name {}", t.server_name.to_str()));
                }
                l
            }
            CheckKind::Tls(t) => format!("{kind} {addr} name {}", t.server_name.to_str()),
        }
    }
}

/// The result of one probe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckDetail {
    pub kind: &'static str,
    pub ok: bool,
    /// Why it failed (connect error, timeout, unexpected status, handshake error).
    pub error: Option<String>,
    /// The HTTP status, for HTTP checks that got one.
    pub status: Option<u16>,
    pub duration_ms: u64,
}

/// Where check results go. Implemented by the runtime over the decision core; `record`
/// returns the state change the result caused, if any.
pub trait HealthSink: Send + Sync + 'static {
    /// A result of the check in `check`'s slot of `node`. `answered`: a pass that proves the
    /// node's traffic answers (an HTTP check's answer on a port traffic reaches,
    /// [`CheckSpec::answers_for_traffic`]); any other pass only that the node takes
    /// connections.
    fn record(
        &self,
        node: &str,
        check: CheckSlot,
        ok: bool,
        answered: bool,
        detail: &CheckDetail,
    ) -> Option<Transition>;

    /// The check in `check`'s slot of `node` was stopped (a reload removed or changed it):
    /// its last result no longer counts.
    fn forget(&self, node: &str, check: CheckSlot);

    /// An HTTP check of `node` at its `port` sent at `sent_at` was answered (whatever its
    /// status): the node's process there answers requests, a sign of life for the slow-request rule
    /// (`limpet_core::answered_since`) as an answer to traffic is. A completed TCP connect
    /// or TLS handshake is not one: a stopped process's kernel completes connects.
    fn answered(&self, _node: &str, _port: u16, _sent_at: Instant) {}
}

/// What the admin API shows of one check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckStatus {
    pub check: String,
    pub kind: &'static str,
    pub interval_ms: u64,
    pub fall: u32,
    pub rise: u32,
    /// Checks run so far, and how many failed.
    pub checks: u64,
    pub failures: u64,
    pub consecutive_successes: u32,
    pub consecutive_failures: u32,
    /// Milliseconds since the last check finished (None before the first).
    pub last_check_ago_ms: Option<u64>,
    pub last: Option<CheckDetail>,
    /// The last error seen, even if later checks passed.
    pub last_error: Option<String>,
    /// State changes this check caused.
    pub transitions: u64,
}

#[derive(Debug)]
struct Entry {
    status: CheckStatus,
    finished: Option<Instant>,
}

/// Per-node, per-check detail, shared by the check tasks and the admin API.
#[derive(Debug, Default)]
pub struct HealthBoard {
    // node name -> check label -> entry
    entries: Mutex<BTreeMap<String, BTreeMap<String, Entry>>>,
}

impl HealthBoard {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, BTreeMap<String, Entry>>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The checks of one node.
    pub fn node(&self, node: &str) -> Vec<CheckStatus> {
        let now = Instant::now();
        self.lock()
            .get(node)
            .map(|checks| checks.values().map(|e| Self::view(e, now)).collect())
            .unwrap_or_default()
    }

    /// Every node's checks.
    pub fn all(&self) -> BTreeMap<String, Vec<CheckStatus>> {
        let now = Instant::now();
        self.lock()
            .iter()
            .map(|(n, checks)| {
                (
                    n.clone(),
                    checks.values().map(|e| Self::view(e, now)).collect(),
                )
            })
            .collect()
    }

    fn view(e: &Entry, now: Instant) -> CheckStatus {
        let mut s = e.status.clone();
        s.last_check_ago_ms = e
            .finished
            .map(|t| now.saturating_duration_since(t).as_millis() as u64);
        s
    }

    fn register(&self, node: &str, spec: &CheckSpec) {
        let label = spec.label();
        self.lock().entry(node.to_owned()).or_default().insert(
            label.clone(),
            Entry {
                status: CheckStatus {
                    check: label,
                    kind: spec.kind.as_str(),
                    interval_ms: spec.interval.as_millis() as u64,
                    fall: spec.fall,
                    rise: spec.rise,
                    checks: 0,
                    failures: 0,
                    consecutive_successes: 0,
                    consecutive_failures: 0,
                    last_check_ago_ms: None,
                    last: None,
                    last_error: None,
                    transitions: 0,
                },
                finished: None,
            },
        );
    }

    fn unregister(&self, node: &str, label: &str) {
        let mut map = self.lock();
        if let Some(checks) = map.get_mut(node) {
            checks.remove(label);
            if checks.is_empty() {
                map.remove(node);
            }
        }
    }

    fn update(&self, node: &str, label: &str, detail: &CheckDetail, flipped: bool) {
        let mut map = self.lock();
        let Some(e) = map.get_mut(node).and_then(|c| c.get_mut(label)) else {
            return;
        };
        let s = &mut e.status;
        s.checks += 1;
        if detail.ok {
            s.consecutive_successes = s.consecutive_successes.saturating_add(1);
            s.consecutive_failures = 0;
        } else {
            s.failures += 1;
            s.consecutive_failures = s.consecutive_failures.saturating_add(1);
            s.consecutive_successes = 0;
            s.last_error.clone_from(&detail.error);
        }
        if flipped {
            s.transitions += 1;
        }
        s.last = Some(detail.clone());
        e.finished = Some(Instant::now());
    }
}

/// The running checks. Dropping it stops them.
#[derive(Debug)]
pub struct HealthChecks {
    board: Arc<HealthBoard>,
    // (node, label) -> (spec fingerprint, the check's slot, task)
    tasks: BTreeMap<(String, String), (String, CheckSlot, JoinHandle<()>)>,
    rng: StdRng,
}

impl HealthChecks {
    /// No checks yet; [`update`](Self::update) starts them. Randomness (first offsets and
    /// jitter) is seeded from the OS.
    pub fn new() -> Self {
        Self::with_seed(rand::random())
    }

    /// As [`new`](Self::new) with a fixed seed (tests, replays).
    pub fn with_seed(seed: u64) -> Self {
        HealthChecks {
            board: Arc::new(HealthBoard::default()),
            tasks: BTreeMap::new(),
            rng: StdRng::seed_from_u64(seed),
        }
    }

    /// Starts these checks. A shortcut for `new()` + `update`.
    pub fn spawn(checks: Vec<(String, CheckSpec)>, sink: Arc<dyn HealthSink>) -> Self {
        let mut hc = Self::new();
        hc.update(checks, sink);
        hc
    }

    pub fn board(&self) -> Arc<HealthBoard> {
        Arc::clone(&self.board)
    }

    /// How many checks run.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Each running check of `node`: what it asks ([`CheckSpec::label`]) and its slot. A
    /// slot is this process's own; the label is what names the check to another process
    /// (a binary upgrade carries each check's counts by it).
    pub fn slots_of(&self, node: &str) -> Vec<(String, CheckSlot)> {
        self.tasks
            .iter()
            .filter(|((n, _), _)| n == node)
            .map(|((_, label), (_, slot, _))| (label.clone(), *slot))
            .collect()
    }

    /// Makes the running set exactly `checks` (on start and on reload): a check whose node,
    /// kind, address and settings are unchanged keeps running with its history; others are
    /// stopped or started. Must be called inside a tokio runtime.
    pub fn update(&mut self, checks: Vec<(String, CheckSpec)>, sink: Arc<dyn HealthSink>) {
        let mut wanted = BTreeMap::new();
        for (node, spec) in checks {
            wanted.insert((node, spec.label()), spec);
        }
        let stale: Vec<_> = self
            .tasks
            .iter()
            .filter(|(k, (fp, _, _))| wanted.get(*k).is_none_or(|s| fingerprint(s) != *fp))
            .map(|(k, _)| k.clone())
            .collect();
        // A check whose settings changed (interval, timeout...) but that asks the same thing
        // keeps its slot, and its last result stands until the restarted check's first: a
        // dead port's failure must not be forgotten by a reload that retimes its check.
        let mut kept = BTreeMap::new();
        for key in stale {
            if let Some((_, slot, task)) = self.tasks.remove(&key) {
                // Health checks run on the runtime that calls this (the main thread's), so
                // the aborted task cannot be inside `record` now, nor record again after.
                task.abort();
                if wanted.contains_key(&key) {
                    kept.insert(key.clone(), slot);
                } else {
                    sink.forget(&key.0, slot);
                }
            }
            self.board.unregister(&key.0, &key.1);
        }
        for ((node, label), spec) in wanted {
            if self.tasks.contains_key(&(node.clone(), label.clone())) {
                continue;
            }
            let taken: Vec<CheckSlot> = self
                .tasks
                .iter()
                .filter(|((n, _), _)| *n == node)
                .map(|(_, (_, slot, _))| *slot)
                .chain(
                    kept.iter()
                        .filter(|((n, _), _)| *n == node)
                        .map(|(_, slot)| *slot),
                )
                .collect();
            let slot = kept
                .get(&(node.clone(), label.clone()))
                .copied()
                .or_else(|| {
                    (0..CheckSlot::COUNT)
                        .map(CheckSlot::new)
                        .find(|s| !taken.contains(s))
                })
                .unwrap_or(CheckSlot::new(CheckSlot::COUNT));
            self.board.register(&node, &spec);
            let seed = self.rng.gen();
            let task = tokio::spawn(run_check(
                node.clone(),
                label.clone(),
                slot,
                spec.clone(),
                Arc::clone(&sink),
                Arc::clone(&self.board),
                seed,
            ));
            self.tasks
                .insert((node, label), (fingerprint(&spec), slot, task));
        }
    }

    /// Stops every check.
    pub fn stop(&mut self) {
        for (_, (_, _, task)) in std::mem::take(&mut self.tasks) {
            task.abort();
        }
    }
}

impl Default for HealthChecks {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for HealthChecks {
    fn drop(&mut self) {
        self.stop();
    }
}

fn fingerprint(spec: &CheckSpec) -> String {
    format!("{spec:?}")
}

/// The wait before the check after one that started at `started`: `interval ± jitter`.
pub fn next_delay(interval: Duration, jitter: Duration, rng: &mut impl Rng) -> Duration {
    let jitter = jitter.min(interval);
    if jitter.is_zero() {
        return interval;
    }
    // A config's durations are at most ten years (`config::raw::MAX_DURATION`), about
    // 3.2e14 µs: far inside `i64`, so neither the range nor the sum can overflow.
    let j = i64::try_from(jitter.as_micros()).unwrap_or(i64::MAX / 4);
    let offset = rng.gen_range(-j..=j);
    let base = i64::try_from(interval.as_micros()).unwrap_or(i64::MAX / 4);
    Duration::from_micros(u64::try_from(base.saturating_add(offset).max(1_000)).unwrap_or(1_000))
}

/// The wait before a check's first run: a uniformly random part of one interval.
pub fn first_delay(interval: Duration, rng: &mut impl Rng) -> Duration {
    let us = u64::try_from(interval.as_micros()).unwrap_or(u64::MAX);
    if us == 0 {
        return Duration::ZERO;
    }
    Duration::from_micros(rng.gen_range(0..us))
}

async fn run_check(
    node: String,
    label: String,
    slot: CheckSlot,
    spec: CheckSpec,
    sink: Arc<dyn HealthSink>,
    board: Arc<HealthBoard>,
    seed: u64,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut next = Instant::now() + first_delay(spec.interval, &mut rng);
    loop {
        tokio::time::sleep_until(next).await;
        let started = Instant::now();
        let detail = probe(&spec.kind, spec.addr, spec.timeout, spec.proxy).await;
        let local = detail.error.as_deref().and_then(|e| {
            if e.starts_with(probe::LOCAL_FAILURE) {
                Some(true)
            } else {
                e.starts_with(probe::NO_LOCAL_PORT).then_some(false)
            }
        });
        if let Some(fds) = local {
            // limpet could not even open a socket, or had no local port for it: no verdict
            // on the node (it must not flap DOWN for this process's own shortage).
            if fds {
                crate::net::LOCAL_FDS.note(crate::net::FdsAt::Check, "health check");
            } else {
                // Shown as this check's failure (the admin API's last error says why), the
                // node's health left as it is: a lasting cause (no source address of the
                // node's family on this host) must not look like a passing check.
                crate::net::NO_LOCAL_PORT.note("health check");
                board.update(&node, &label, &detail, false);
            }
            next = (started + next_delay(spec.interval, spec.jitter, &mut rng)).max(Instant::now());
            continue;
        }
        let answered = detail.status.is_some() && spec.answers_for_traffic;
        if answered {
            sink.answered(&node, spec.addr.port(), started);
        }
        let t = sink.record(&node, slot, detail.ok, answered, &detail);
        board.update(&node, &label, &detail, t.is_some());
        match t {
            Some(Transition::WentDown) => tracing::warn!(
                node = %node, check = %label, error = detail.error.as_deref().unwrap_or(""),
                "node DOWN: this check's failure made {} in a row (checks and traffic)", spec.fall
            ),
            Some(Transition::WentUp) => tracing::info!(
                node = %node, check = %label,
                "node UP: {} passes in a row with none of its checks failing", spec.rise
            ),
            None => {}
        }
        // The next check starts one interval after this one started; a check slower than
        // that is followed at once, never overlapped.
        next = (started + next_delay(spec.interval, spec.jitter, &mut rng)).max(Instant::now());
    }
}
