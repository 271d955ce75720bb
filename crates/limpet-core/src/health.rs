//! Health as a pure state machine on a virtual clock: one model per node, fed by active
//! checks, passive observations of live traffic, and the operator. Each observation says
//! whether the state flipped, so the caller can log and act on it. No timers live here: the
//! caller passes `now_ms` and asks [`Health::availability`] what the node is good for now.
//!
//! ## The rules (docs/operations.md has them next to HAProxy's and nginx's)
//!
//! | node has active checks | goes DOWN after | comes back UP after |
//! |---|---|---|
//! | no  | `fall` consecutive traffic failures | one trial that succeeds, made at the earliest `fail_timeout` after it went DOWN (or after the last failed trial), or earlier when no node can take a request ([`Health::early_trial_possible`]) |
//! | yes | `fall` consecutive failures, checks and traffic alike | `rise` consecutive check successes; traffic never brings it back |
//!
//! - A *traffic failure* is a connect that is refused or times out, a TLS handshake to the
//!   node that fails, or an answer that does not come within the answer timeout while the
//!   node answers no request sent after it ([`answered_since`]): a node that keeps
//!   answering younger requests is alive, and the one it does not answer in time is slow by
//!   itself (a report that outlasts the timeout), not a sign of a hung node. Charged, a few
//!   such requests at once took a healthy node DOWN and, replayed, the next one too.
//! - A *slow answer* ([`Observation::SlowAnswer`]) is the timeout that rule does not charge.
//!   It counts toward nothing unless the operator sets [`HealthPolicy::max_slow_answers`]:
//!   then that many within one `fail_timeout`, whatever was answered between them, take the
//!   node DOWN (a gray failure: a node that answers most requests and hangs the rest, which
//!   its checks pass). Off by default, as in HAProxy: a slow report is the application's,
//!   and counted it would take each node DOWN in turn. The fleet layer does not report the
//!   slow answers of the last node taking sessions ([`crate::pool::counts_for_health`]).
//! - A *traffic success* is an answer (HTTP) or a completed connect (TCP, which has no
//!   answer to wait for). Without checks it resets the failure streak and ends a trial; a
//!   completed connect resets only a streak of failed connects, never one that holds a
//!   request the node took and did not answer ([`Observation::NoAnswer`]): a hung node
//!   behind an HTTP and a TCP listener completes every TCP connect. With
//!   checks it counts for nothing (a node whose kernel still accepts connections while its
//!   process is stopped completes every connect, and must not be kept UP by that), but for
//!   an answer after a request left unanswered: the process answers, and the streak that
//!   request began is cleared. For the same reason a completed HTTP connect is no success
//!   at all: an HTTP node is back when it answers.
//! - A *check pass* of a check that proves only connections (a TCP connect, a TLS
//!   handshake: [`Observation::CheckConnected`]) clears the check's own failures and a
//!   streak of refused connects, never one that holds an unanswered request: a TLS end in
//!   front of a hung process passes it every interval. An HTTP check's pass
//!   ([`Observation::CheckPassed`]) clears both.
//! - A *trial* is one request to a DOWN node (no checks) once its `retry_at` has passed.
//!   [`Health::claim_trial`] hands it to one caller; while the claim holds (the caller's
//!   connect and answer timeouts, or until the caller gives it back with the outcome:
//!   [`Health::trial_abandoned`]), nobody else tries, whatever failures of earlier requests
//!   arrive meanwhile, so a node that is not back costs one request per `fail_timeout`,
//!   never the traffic of a whole probation. The caller
//!   connects first and fails over if the trial is refused; a hung node's trial waits for
//!   its answer timeout, and an idempotent request is then replayed elsewhere.
//! - A node back from a trial is on probation: its failure streak starts at `fall - 1`, so
//!   one more failure takes it DOWN again until a success resets the streak (a TCP
//!   listener's trial is decided by a connect, which a stopped process's kernel completes;
//!   an HTTP request to such a node then costs one answer timeout, not `fall`).
//! - Only a trial's success brings the node back: a success that no claimed trial made
//!   is an attempt that was already in flight when the node went DOWN, and proves nothing
//!   about the node now (taken as one, each late answer of a node dying under load would
//!   flap it UP, and the next failure DOWN again). Every traffic failure seen while DOWN (a
//!   refused trial, or the late answer timeout of a request sent while the node was still
//!   UP) starts the wait again and ends the trial.
//! - The operator's (or the sim's) forced DOWN is never tried: it holds until forced UP or a
//!   check brings the node back.
//! - A node may have several checks (one per listener port it serves, each a [`CheckSlot`]),
//!   and it is healthy only when every one of them passes: a session that lives on the node
//!   uses all of its ports. Each check counts its own consecutive failures, and the node
//!   goes DOWN when one check's count (plus the traffic failures since its checks last all
//!   passed) reaches `fall`: one port that stays dead takes the node DOWN however well the
//!   others do, and two flaky checks that each fail once in a while do not add up. A DOWN
//!   node counts a pass toward `rise` only while none of its checks is failing, and comes
//!   back only once each check that failed has passed `rise` times in a row since (a port
//!   that just came back is not trusted on one pass because another port passed too). A check
//!   removed by a reload is forgotten ([`Health::forget_check`]), so it cannot hold the node
//!   DOWN.

/// How one node's health is judged. Defaults: HAProxy's `fall 3 rise 2`, nginx's
/// `fail_timeout 10s`, no active checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthPolicy {
    pub fall: u32,
    pub rise: u32,
    /// Without checks: how long a DOWN node waits before its next trial.
    pub fail_timeout_ms: u64,
    /// Whether active checks are configured for the node: then only checks bring it back.
    pub checked: bool,
    /// A node that lets this many requests outlast the answer timeout within one
    /// `fail_timeout` while it answers others ([`Observation::SlowAnswer`]) goes DOWN: a
    /// gray failure (one worker of the node stuck, a disk that stalls some reads) that the
    /// slow-request rule alone would keep UP. 0 (the default): slow answers never count.
    pub max_slow_answers: u32,
}

impl Default for HealthPolicy {
    fn default() -> Self {
        HealthPolicy {
            fall: 3,
            rise: 2,
            fail_timeout_ms: 10_000,
            checked: false,
            max_slow_answers: 0,
        }
    }
}

/// Which of a node's active checks a result is from: 0 to 63 (the I/O layer gives each check
/// of a node its own slot while it runs; a 65th and later share the last one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CheckSlot(u8);

impl CheckSlot {
    /// The first slot: a node's only check, the sim's checks.
    pub const FIRST: CheckSlot = CheckSlot(0);
    /// How many distinct slots a node has.
    pub const COUNT: usize = 64;

    /// Slot `i`, or the last one for `i` past [`CheckSlot::COUNT`].
    pub fn new(i: usize) -> CheckSlot {
        CheckSlot(u8::try_from(i.min(Self::COUNT - 1)).unwrap_or(63))
    }

    pub fn index(self) -> usize {
        usize::from(self.0)
    }
}

/// What was seen of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Observation {
    /// An active check (this slot of the node's) passed, with an answer of the node's process
    /// (an HTTP check's).
    CheckPassed(CheckSlot),
    /// An active check that proves only that the node takes connections passed: a TCP
    /// connect, a TLS handshake (a hung process's kernel completes the one, a TLS terminator
    /// or a thread of its own the other). As [`Observation::CheckPassed`] for the check and
    /// toward `rise`, but it does not clear a failure streak that holds an unanswered
    /// request: passing every interval, it kept a node that completes handshakes and never
    /// answers UP under traffic that timed out on it, however much.
    CheckConnected(CheckSlot),
    /// An active check failed (refused, timed out, wrong status, handshake error).
    CheckFailed(CheckSlot),
    /// Live traffic was served: an HTTP answer arrived.
    TrafficOk,
    /// A TCP listener's connect to the node completed (with its PROXY header and TLS): all a
    /// relay can prove, and less than an answer: a stopped process's kernel completes it.
    TrafficConnected,
    /// Live traffic failed before a connection was made: connect refused or timed out; or
    /// (a TCP listener's session) the node dropped the connection, closed or reset, before
    /// any byte moved either way, which is a refused connect a step later (a listen queue
    /// reset as its listener closes, a process that accepts and closes). Not
    /// [`Observation::NoAnswer`]: a TCP listener cannot tell a hang from a protocol where
    /// the client speaks first, and a node DOWN for an unanswered request would wait for an
    /// answer no TCP session can give.
    TrafficFailed,
    /// A connection was made but the node did not answer: its TLS handshake failed or timed
    /// out, no answer head came within the answer timeout, or a fresh connection was closed
    /// or reset around the request. A completed connect does not disprove it.
    NoAnswer,
    /// No answer head came within the answer timeout, but the node answered a request sent
    /// after this one meanwhile ([`answered_since`]): the request is slow by itself, the node
    /// alive. Not a failure: it counts only toward [`HealthPolicy::max_slow_answers`].
    SlowAnswer,
}

/// Whether a node that did not answer a request sent at `sent` within the answer timeout
/// has answered a request sent after it since (`youngest_answered`: the send time of the
/// youngest request the node has answered, on the same clock; any unit, 0 for none). An
/// HTTP check's answer counts as a request's; a completed TCP connect or TLS handshake does
/// not (a stopped process's kernel completes connects).
///
/// If so, the node is alive and the request is slow by itself: no traffic failure, no
/// replay on another node (it would be as slow there, and move its session for nothing):
/// the client is answered 504 and the session keeps its pin, as HAProxy's `timeout server`
/// does. If not, the node may be hung: a traffic failure ([`Observation::NoAnswer`]), and an
/// idempotent request is replayed elsewhere. Only a *younger* request counts: the node
/// finishing requests it took before this one proves nothing about it now (a node that
/// hangs in the middle of a burst answers those first).
pub fn answered_since(sent: u64, youngest_answered: u64) -> bool {
    youngest_answered > sent
}

/// A node's health as seen by checks and traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Health {
    up: bool,
    /// Consecutive results against the current state (failures while up, check successes
    /// while down).
    streak: u32,
    /// While down without checks: when the next trial may start. `u64::MAX`: never (a forced
    /// DOWN).
    retry_at_ms: u64,
    /// While down without checks: a trial was claimed and is not over (its claim not given
    /// back, and no failure seen after its claim ran out), so a success now is that trial's
    /// (or at least a sign of life after it).
    trying: bool,
    /// While down: the last claimed trial holds until then, or until its caller gives it
    /// back with its outcome ([`Health::trial_abandoned`]). No other trial is made
    /// meanwhile, due or early, whatever failures arrive (the late answer timeouts of
    /// requests sent before the node went DOWN, a connect that was already failing: one
    /// trial at a time); they only move the next trial's time.
    claimed_until_ms: u64,
    /// How many trials were claimed, ever (wrapping): the last one's mark, by which its
    /// caller gives it back ([`Health::trial_abandoned`]). Kept through every change of
    /// state, so that a claim from before is never taken for a later one; this process's
    /// own, not carried.
    claims: u32,
    /// Each check's consecutive failures, by [`CheckSlot`] (0: its last result passed).
    /// While UP, `streak` counts the traffic failures since the checks last all passed.
    fails: [u8; CheckSlot::COUNT],
    /// Each check's consecutive passes since its last failure, by [`CheckSlot`]
    /// ([`NO_FAILURE`]: no failure on record since the node last came UP). A DOWN node comes
    /// back only once every check with a failure on record has passed `rise` times since it,
    /// as a server's one check must in HAProxy: a port that just came back is not trusted on
    /// one pass because another port of the node passed too.
    passes: [u8; CheckSlot::COUNT],
    /// While UP: the failure streak holds a [`Observation::NoAnswer`]: a completed connect
    /// ([`Observation::TrafficConnected`]) does not reset it, only an answer does. While
    /// DOWN: the streak that took it there held one, or a trial went unanswered since: a
    /// completed connect is no trial's success, only an answer is.
    unanswered: bool,
    /// While UP: the slow answers ([`Observation::SlowAnswer`]) counted in the window that
    /// began with the first of them at `slow_since_ms` and lasts `fail_timeout` (a fixed
    /// window: the next slow answer after it starts a new one). Answers do not reset it: a
    /// node that hangs one request in five answers the other four, and a count that an
    /// answer reset would never reach its limit.
    slow: u32,
    slow_since_ms: u64,
    /// While DOWN: what took it there. Not revised while it stays DOWN (a failed trial, or
    /// checks failing since, do not change it), except by a forced DOWN, which no trial
    /// lifts.
    down_cause: Option<DownCause>,
}

/// What took a node DOWN: the kind of observation that reached its limit, or the operator.
/// Shown by the admin API: a node DOWN for its slow answers passes its checks, and nothing
/// else would say why it is DOWN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DownCause {
    /// An active check's failures reached `fall`.
    Checks,
    /// Traffic failures (refused or timed-out connects, failed TLS handshakes, unanswered
    /// requests, fresh connections the node closed or reset) reached `fall`.
    Traffic,
    /// Slow answers reached `max_slow_answers` within one `fail_timeout`.
    SlowAnswers,
    /// Forced DOWN (the sim's `DOWN`, the library's `force_health`).
    Forced,
}

impl DownCause {
    pub fn as_str(self) -> &'static str {
        match self {
            DownCause::Checks => "checks",
            DownCause::Traffic => "traffic",
            DownCause::SlowAnswers => "slow-answers",
            DownCause::Forced => "forced",
        }
    }

    /// The cause [`as_str`](Self::as_str) names.
    pub fn from_name(name: &str) -> Option<DownCause> {
        [
            DownCause::Checks,
            DownCause::Traffic,
            DownCause::SlowAnswers,
            DownCause::Forced,
        ]
        .into_iter()
        .find(|c| c.as_str() == name)
    }
}

/// A node's [`Health`] as it crosses to another process ([`Health::carry`]), each check
/// named by a `K` both processes know it by. Times are the core's `now_ms` scale, the
/// carrying process's (the I/O layer's is wall-clock milliseconds, and it moves them onto
/// the receiving process's clock as they cross).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CarriedHealth<K> {
    pub up: bool,
    /// Consecutive results against the current state: traffic failures while UP (beyond the
    /// checks' own counts), check passes while DOWN.
    pub streak: u32,
    /// The failure streak holds a request the node took and did not answer (while DOWN: the
    /// streak that took it there did, or a trial since).
    pub unanswered: bool,
    /// While DOWN: when traffic may try it next (`None`: never, a forced DOWN; a checked
    /// node ignores it).
    pub retry_at_ms: Option<u64>,
    /// While DOWN: until when the trial the carrying process claimed holds (0: none). The
    /// trial stays that process's; the receiving one makes no other, early or not, before
    /// then.
    pub trial_claimed_until_ms: u64,
    /// While UP: the slow answers counted in the window that began at `slow_since_ms`.
    pub slow: u32,
    pub slow_since_ms: u64,
    /// While DOWN: what took it there.
    pub down_cause: Option<DownCause>,
    /// The checks with something on record (a failure, or passes owed since one).
    pub checks: Vec<(K, CheckCounts)>,
}

/// The most a carried streak or slow-answer count is taken as: far above any `fall`, `rise`
/// or `max_slow_answers` a config allows (255), far below where counting on overflows.
const CARRIED_COUNT_MAX: u32 = 1 << 20;

/// One check's counts in a [`CarriedHealth`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckCounts {
    /// Consecutive failures (0: its last result passed).
    pub fails: u8,
    /// Passes since its last failure (`None`: no failure on record since the node was last
    /// UP).
    pub passes: Option<u8>,
}

/// In [`Health`]'s per-check passes: the check has not failed since the node was last UP.
const NO_FAILURE: u8 = u8::MAX;
const NO_FAILURE_ALL: [u8; CheckSlot::COUNT] = [NO_FAILURE; CheckSlot::COUNT];

/// A change of health state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    WentDown,
    WentUp,
}

/// What a node's health allows now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Availability {
    Up,
    /// DOWN, without checks, and its `fail_timeout` has passed: one connection may try it.
    TrialDue,
    Down,
}

impl Default for Health {
    /// A declared node starts UP, as in HAProxy: traffic is not withheld until a first check.
    fn default() -> Self {
        Health {
            up: true,
            streak: 0,
            retry_at_ms: 0,
            trying: false,
            claimed_until_ms: 0,
            claims: 0,
            fails: [0; CheckSlot::COUNT],
            passes: NO_FAILURE_ALL,
            unanswered: false,
            slow: 0,
            slow_since_ms: 0,
            down_cause: None,
        }
    }
}

impl Health {
    /// The health of a node new to limpet ([`Health::default`]: UP, nothing counted) for a
    /// node whose past no longer applies (added back by a reload, or moved to another
    /// address), keeping the count of trials claimed: a trial claimed before, still in
    /// flight, must not be taken for a later one's when it ends ([`Self::trial_abandoned`]).
    pub fn afresh(&self) -> Health {
        Health {
            claims: self.claims,
            ..Health::default()
        }
    }

    pub fn is_up(&self) -> bool {
        self.up
    }

    /// What took the node DOWN (`None` while UP).
    pub fn down_cause(&self) -> Option<DownCause> {
        self.down_cause
    }

    /// Consecutive results counted toward the next flip (failures while UP: the traffic's
    /// plus the most any one check counts; check successes while DOWN): the "going down
    /// 1/3" of a stats page.
    pub fn streak(&self) -> u32 {
        if self.up {
            self.streak + u32::from(self.most_check_fails())
        } else {
            // Passes toward `rise`: a check that still owes passes of its own holds it back
            // ("coming up 3/2" would say a node is due that is not).
            let owed = self
                .passes
                .iter()
                .filter(|&&p| p != NO_FAILURE)
                .map(|&p| u32::from(p))
                .min()
                .unwrap_or(u32::MAX);
            self.streak.min(owed)
        }
    }

    /// The slow answers ([`Observation::SlowAnswer`]) counted toward
    /// [`HealthPolicy::max_slow_answers`] at `now_ms`: those of the current `fail_timeout`
    /// window of an UP node with the limit set, else 0.
    pub fn slow_answers(&self, policy: HealthPolicy, now_ms: u64) -> u32 {
        let open = now_ms < self.slow_since_ms.saturating_add(policy.fail_timeout_ms);
        if self.up && policy.max_slow_answers > 0 && open {
            self.slow
        } else {
            0
        }
    }

    /// The most consecutive failures any one check of the node counts now.
    fn most_check_fails(&self) -> u8 {
        self.fails.iter().copied().max().unwrap_or(0)
    }

    /// Whether a check of the node failed last time it ran.
    fn a_check_fails(&self) -> bool {
        self.fails.iter().any(|&f| f > 0)
    }

    /// Whether every check that failed since the node was last UP has passed `rise` times in
    /// a row since.
    fn every_check_passed(&self, rise: u32) -> bool {
        // `rise` is at most 255 in a config; a larger one (the sim's) waits for 254 passes.
        let rise = rise.min(u32::from(NO_FAILURE - 1));
        self.passes
            .iter()
            .all(|&p| p == NO_FAILURE || u32::from(p) >= rise)
    }

    /// While DOWN without checks: when the next trial may start (`None` when UP, checked,
    /// or forced DOWN).
    pub fn retry_at_ms(&self, policy: HealthPolicy) -> Option<u64> {
        (!self.up && !policy.checked && self.retry_at_ms != u64::MAX).then_some(self.retry_at_ms)
    }

    /// Whether `other` routes exactly like this one: the same state, the same trial time and
    /// the same trial claim, in flight or not (an early trial waits for the claim to end, and
    /// no trial is due while one is in flight).
    /// The failure or success streak does not route; the I/O layer rebuilds its routing
    /// snapshot only when this changes, not on every streak step.
    pub fn routes_like(&self, other: &Health) -> bool {
        self.up == other.up
            && self.retry_at_ms == other.retry_at_ms
            && self.claimed_until_ms == other.claimed_until_ms
            && self.trying == other.trying
    }

    /// Whether an [`Observation::TrafficOk`] (or a [`Observation::TrafficConnected`]) would
    /// leave this health exactly as it is, whenever it came: an UP node with no failure
    /// counted, or one that only checks move with no request left unanswered.
    /// The data plane reports an answer on every request; this is what lets it skip a report
    /// that changes nothing instead of taking the node's lock for it.
    pub fn traffic_ok_changes_nothing(&self, policy: HealthPolicy) -> bool {
        self.up && (self.streak == 0 || (policy.checked && !self.unanswered))
    }

    /// Whether the node takes requests at `now_ms`: UP, DOWN with its trial due, or DOWN.
    /// One trial at a time: a failure seen while one is in flight may be a request's from
    /// before the node went DOWN (its answer timeout comes late), which leaves the trial to
    /// its own outcome and only moves the next one's time (see `observe`), so no trial is
    /// due while one is in flight.
    pub fn availability(&self, policy: HealthPolicy, now_ms: u64) -> Availability {
        if self.up {
            Availability::Up
        } else if !policy.checked
            && self.retry_at_ms != u64::MAX
            && now_ms >= self.retry_at_ms
            && !self.trial_in_flight(now_ms)
        {
            Availability::TrialDue
        } else {
            Availability::Down
        }
    }

    /// Whether this DOWN node may be tried before its `fail_timeout` has passed, when no
    /// other node can take a request: DOWN by its traffic alone (no checks, which alone
    /// decide a checked node; not forced DOWN), with no trial in flight. nginx, when every
    /// peer has failed, marks them all live again "for quick recovery"; without this, a node
    /// that blinked for half a second, alone or with every other node, answered 503 for its
    /// whole `fail_timeout` (chaos run 25).
    pub fn early_trial_possible(&self, policy: HealthPolicy, now_ms: u64) -> bool {
        !self.up
            && !policy.checked
            && self.retry_at_ms != u64::MAX
            && now_ms >= self.claimed_until_ms
    }

    /// Takes the trial of a DOWN node whose `fail_timeout` has passed (or, with `early`, of
    /// one that [may be tried early](Self::early_trial_possible)): true for the one caller
    /// that gets it, which must then report the outcome ([`Observation::TrafficOk`] or
    /// [`Observation::TrafficFailed`]). The claim holds for `hold_ms` (the longest the
    /// caller may take to know: its connect and answer timeouts): a trial whose outcome is
    /// never reported is simply due again then.
    pub fn claim_trial(
        &mut self,
        policy: HealthPolicy,
        now_ms: u64,
        hold_ms: u64,
        early: bool,
    ) -> bool {
        let due = self.availability(policy, now_ms) == Availability::TrialDue;
        let may = due || (early && self.early_trial_possible(policy, now_ms));
        if !may {
            return false;
        }
        self.retry_at_ms = now_ms.saturating_add(hold_ms.max(1));
        self.claimed_until_ms = self.retry_at_ms;
        self.trying = true;
        self.claims = self.claims.wrapping_add(1);
        true
    }

    /// DOWN leaving a request unanswered (the streak that took it there held one, or a trial
    /// since went unanswered): only an answer brings it back, so only a trial that waits for
    /// one may be made (an HTTP request), not a TCP listener's session or a connect, which
    /// a hung process's kernel completes.
    pub fn awaits_an_answer(&self) -> bool {
        !self.up && self.unanswered
    }

    /// DOWN with a trial claimed and in flight at `now_ms`: its outcome is on its way.
    pub fn trial_in_flight(&self, now_ms: u64) -> bool {
        !self.up && self.trying && now_ms < self.claimed_until_ms
    }

    /// The last claimed trial's mark ([`Self::claim_trial`]), which its caller gives back to
    /// [`Self::trial_abandoned`].
    pub fn trial_claim(&self) -> u32 {
        self.claims
    }

    /// The trial claimed as `claim` is over at `now_ms`, given back by its caller: with its
    /// outcome observed (a failure, which does not end a trial by itself: see `observe`),
    /// or with nothing learnt of the node: its request was cancelled (the client left, an
    /// HTTP/2 stream reset, a drain's cut), or ended for the client's fault or limpet's
    /// before the node could answer (a body that stopped coming, a queue timeout). Left to
    /// its claim, it would hold every early trial until the longest its outcome could take
    /// (about a minute by default): with no other node to take them, every request
    /// meanwhile answered 503 though the node may well be back. So the claim ends now, and
    /// the next trial is due as after a failed one (`fail_timeout` from now, or from a
    /// failure seen during the trial, never later than the claim would have made it): a
    /// node that hangs is not handed one request after another by clients that give up on
    /// it. A claim another trial replaced, or one whose success brought the node back, is
    /// left alone.
    pub fn trial_abandoned(&mut self, policy: HealthPolicy, claim: u32, now_ms: u64) {
        if !self.up
            && !policy.checked
            && self.trying
            && self.claims == claim
            && self.retry_at_ms != u64::MAX
        {
            self.trial_ended_unlearnt(policy, now_ms);
        }
        self.debug_check();
    }

    /// The trial in flight ended at `now_ms` with nothing learnt of the node: its claim ends
    /// now, and the next trial is due `fail_timeout` on, never later than the claim said.
    fn trial_ended_unlearnt(&mut self, policy: HealthPolicy, now_ms: u64) {
        self.trying = false;
        self.claimed_until_ms = now_ms.min(self.claimed_until_ms);
        self.retry_at_ms = self
            .retry_at_ms
            .min(now_ms.saturating_add(policy.fail_timeout_ms));
    }

    /// Records what was seen of the node at `now_ms`.
    pub fn observe(
        &mut self,
        obs: Observation,
        policy: HealthPolicy,
        now_ms: u64,
    ) -> Option<Transition> {
        let t = match (self.up, obs) {
            (true, Observation::CheckPassed(slot) | Observation::CheckConnected(slot)) => {
                self.fails[slot.index()] = 0;
                self.check_passed(slot);
                let answered = matches!(obs, Observation::CheckPassed(_));
                if !self.a_check_fails() && (answered || !self.unanswered) {
                    self.streak = 0;
                    self.unanswered = false;
                }
                None
            }
            // With checks, traffic that gets through proves nothing about the process, but
            // for an answer after a request left unanswered: the process answers, which
            // disproves the hang the unanswered request suggested (with connect-level checks
            // nothing else would: their passes leave such a streak standing).
            (true, Observation::TrafficOk) => {
                if !policy.checked || self.unanswered {
                    self.streak = 0;
                    self.unanswered = false;
                }
                None
            }
            // A connect proves the node takes connections, not that it answers: it resets a
            // streak of failed connects, never one that holds an unanswered request (a hung
            // node serving an HTTP and a TCP listener stayed UP on the TCP connects).
            (true, Observation::TrafficConnected) => {
                if !policy.checked && !self.unanswered {
                    self.streak = 0;
                }
                None
            }
            (
                true,
                Observation::CheckFailed(_) | Observation::TrafficFailed | Observation::NoAnswer,
            ) => {
                match obs {
                    Observation::CheckFailed(slot) => {
                        let f = &mut self.fails[slot.index()];
                        *f = f.saturating_add(1);
                        self.passes[slot.index()] = 0;
                    }
                    Observation::NoAnswer => {
                        self.unanswered = true;
                        self.streak += 1;
                    }
                    _ => self.streak += 1,
                }
                if self.streak() >= policy.fall.max(1) {
                    // The observation that tipped it: with checks, a streak may hold both.
                    let cause = match obs {
                        Observation::CheckFailed(_) => DownCause::Checks,
                        _ => DownCause::Traffic,
                    };
                    Some(self.go_down(policy, now_ms, cause))
                } else {
                    None
                }
            }
            (true, Observation::SlowAnswer) => {
                if policy.max_slow_answers == 0 {
                    return None;
                }
                if self.slow == 0
                    || now_ms >= self.slow_since_ms.saturating_add(policy.fail_timeout_ms)
                {
                    self.slow = 0;
                    self.slow_since_ms = now_ms;
                }
                self.slow += 1;
                if self.slow >= policy.max_slow_answers {
                    Some(self.go_down(policy, now_ms, DownCause::SlowAnswers))
                } else {
                    None
                }
            }
            // A DOWN node is sent only its trial, the youngest request it has: a slow answer
            // now is one sent before it went DOWN, and says nothing of it since.
            (false, Observation::SlowAnswer) => None,
            // A connect-level check counts toward `rise` as any: a node DOWN for requests it
            // left unanswered and checked only so comes back this way, there being no trial
            // for a checked node. An answer (an HTTP check's pass) disproves the hang; with
            // none, the node comes back on probation: one more unanswered request takes it
            // DOWN again, not `fall` of them (each a client waiting out its answer timeout,
            // on every cycle of a hang that outlasts `rise` connects).
            (false, Observation::CheckPassed(slot) | Observation::CheckConnected(slot)) => {
                self.fails[slot.index()] = 0;
                self.check_passed(slot);
                if matches!(obs, Observation::CheckPassed(_)) {
                    self.unanswered = false;
                }
                if self.a_check_fails() {
                    // Another check of the node still fails: not a pass of the node.
                    None
                } else {
                    self.streak += 1;
                    if self.streak >= policy.rise.max(1) && self.every_check_passed(policy.rise) {
                        let probation = self.unanswered && policy.fall > 1;
                        *self = Health {
                            claims: self.claims,
                            ..Health::default()
                        };
                        if probation {
                            self.streak = policy.fall - 1;
                            self.unanswered = true;
                        }
                        Some(Transition::WentUp)
                    } else {
                        None
                    }
                }
            }
            (false, Observation::CheckFailed(slot)) => {
                let f = &mut self.fails[slot.index()];
                *f = f.saturating_add(1);
                self.passes[slot.index()] = 0;
                self.streak = 0;
                None
            }
            // A trial succeeded: one is enough (nginx). A forced DOWN is not tried, and a
            // success no trial made (an attempt in flight when the node went DOWN) does not
            // lift it.
            (false, Observation::TrafficOk | Observation::TrafficConnected) => {
                if policy.checked || self.retry_at_ms == u64::MAX || !self.trying {
                    None
                } else if obs == Observation::TrafficConnected && self.unanswered {
                    // A node that went DOWN leaving a request unanswered (hung, SIGSTOP:
                    // its kernel still completes connects) is back only once it answers. A
                    // TCP listener's connect proves nothing of that: the trial ends with
                    // nothing learnt, the next is due as after a failed one. Brought UP by
                    // it, the node took its share of fresh HTTP sessions, each waiting out
                    // its answer timeout, once every `fail_timeout`.
                    self.trial_ended_unlearnt(policy, now_ms);
                    None
                } else {
                    // Back on probation: its failure streak starts at `fall - 1`, so one
                    // more failure takes it DOWN again until another success resets it. A
                    // node whose trial was a TCP listener's connect may be a stopped
                    // process's kernel: its first timed-out HTTP answer ends that.
                    *self = Health {
                        streak: policy.fall.max(1) - 1,
                        claims: self.claims,
                        ..Health::default()
                    };
                    Some(Transition::WentUp)
                }
            }
            (false, Observation::TrafficFailed | Observation::NoAnswer) => {
                if obs == Observation::NoAnswer {
                    self.unanswered = true;
                }
                if !policy.checked && self.retry_at_ms != u64::MAX {
                    self.retry_at_ms = now_ms.saturating_add(policy.fail_timeout_ms);
                    if !self.trial_in_flight(now_ms) {
                        self.trying = false;
                        if obs == Observation::TrafficFailed {
                            self.claimed_until_ms = 0;
                        }
                    }
                    // With a trial in flight this failure may be the trial's own or a
                    // request's from before the node went DOWN, whose answer timeout comes
                    // late: nothing here tells them apart. The trial goes on (its success
                    // still brings the node back, and no other trial is made meanwhile);
                    // it ends with its claim, which its caller gives back once it has its
                    // outcome (`trial_abandoned`), or which runs out. The next trial is
                    // then due `fail_timeout` after this failure at the earliest. Before,
                    // a late answer timeout ended the trial: a second one was due while
                    // the first still waited on the node, and the first's success was
                    // taken for one no trial made.
                }
                None
            }
        };
        self.debug_check();
        t
    }

    /// Takes the UP node DOWN: without checks its trial is due `fail_timeout` from now. What
    /// the checks said stands; the traffic's counts start again when it is back.
    fn go_down(&mut self, policy: HealthPolicy, now_ms: u64, cause: DownCause) -> Transition {
        *self = Health {
            up: false,
            streak: 0,
            retry_at_ms: now_ms.saturating_add(policy.fail_timeout_ms),
            trying: false,
            claimed_until_ms: 0,
            fails: self.fails,
            passes: self.passes,
            // While DOWN: the streak that took it there held a request it took and did not
            // answer, so only an answer brings it back.
            unanswered: self.unanswered,
            claims: self.claims,
            down_cause: Some(cause),
            ..Health::default()
        };
        Transition::WentDown
    }

    /// Another node just came back from a trial while this one is DOWN by its traffic too:
    /// its trial is due now (unless one is in flight). Nodes that went DOWN together usually
    /// come back together (a fleet restart, a network blip); without this, the first one back
    /// took every session of the others, which were then never tried again while no new
    /// client came (every session pinned, none fresh), though healthy (verification run 27).
    pub fn trial_due_now(&mut self, policy: HealthPolicy, now_ms: u64) {
        if !self.up
            && !policy.checked
            && self.retry_at_ms != u64::MAX
            && now_ms >= self.claimed_until_ms
        {
            self.retry_at_ms = self.retry_at_ms.min(now_ms);
        }
        self.debug_check();
    }

    /// The policy changed under a node (a reload): a DOWN node waiting for its trial waits
    /// `fail_timeout` as the new policy says, counted from when the wait began, so a reload
    /// that shortens it reaches a node already DOWN (a trial claimed and in flight is left
    /// to finish).
    pub fn policy_changed(&mut self, old: HealthPolicy, new: HealthPolicy) {
        if !self.up
            && !self.trying
            && !old.checked
            && !new.checked
            && self.retry_at_ms != u64::MAX
            && old.fail_timeout_ms != new.fail_timeout_ms
        {
            let began = self.retry_at_ms.saturating_sub(old.fail_timeout_ms);
            self.retry_at_ms = began.saturating_add(new.fail_timeout_ms);
        }
        self.debug_check();
    }

    /// A check that no longer runs (a reload removed it or moved it to another slot): its last
    /// failure no longer holds the node. A DOWN node still needs `rise` passes to come back.
    pub fn forget_check(&mut self, slot: CheckSlot) {
        self.fails[slot.index()] = 0;
        self.passes[slot.index()] = NO_FAILURE;
        self.debug_check();
    }

    /// Forces a state (operator command, or the sim's `UP`/`DOWN`). A forced DOWN is never
    /// tried by traffic; checks, if configured, may still bring the node back.
    pub fn force(&mut self, up: bool) -> Option<Transition> {
        let was = self.up;
        *self = Health {
            up,
            streak: 0,
            retry_at_ms: if up { 0 } else { u64::MAX },
            trying: false,
            claimed_until_ms: 0,
            // What the checks last said stands: a forced state does not make a dead port's
            // check pass.
            fails: self.fails,
            // A check failing now owes `rise` passes when the node next goes DOWN.
            passes: if up {
                self.fails.map(|f| if f > 0 { 0 } else { NO_FAILURE })
            } else {
                self.passes
            },
            down_cause: (!up).then_some(DownCause::Forced),
            claims: self.claims,
            ..Health::default()
        };
        match (was, up) {
            (true, false) => Some(Transition::WentDown),
            (false, true) => Some(Transition::WentUp),
            _ => None,
        }
    }

    /// What this health is, to be [carried](Health::carried) to another process that judges
    /// the same node (a binary upgrade): the verdict and what it is waiting for (a DOWN
    /// node's trial time, every check's counts toward `fall` and `rise`, an UP node's
    /// failure streak and slow answers). A check slot is this process's own: `name` says
    /// what names each check to the other process (`None`: a check that no longer runs, left
    /// out). A trial claimed here stays this process's (its outcome is seen here): the other
    /// one makes none before its claim would have ended.
    pub fn carry<K>(&self, name: impl Fn(CheckSlot) -> Option<K>) -> CarriedHealth<K> {
        CarriedHealth {
            up: self.up,
            streak: self.streak,
            unanswered: self.unanswered,
            retry_at_ms: (!self.up && self.retry_at_ms != u64::MAX).then_some(self.retry_at_ms),
            trial_claimed_until_ms: self.claimed_until_ms,
            slow: self.slow,
            slow_since_ms: self.slow_since_ms,
            down_cause: self.down_cause,
            checks: (0..CheckSlot::COUNT)
                .map(CheckSlot::new)
                .filter(|s| self.fails[s.index()] > 0 || self.passes[s.index()] != NO_FAILURE)
                .filter_map(|slot| {
                    let counts = CheckCounts {
                        fails: self.fails[slot.index()],
                        passes: Some(self.passes[slot.index()]).filter(|&p| p != NO_FAILURE),
                    };
                    Some((name(slot)?, counts))
                })
                .collect(),
        }
    }

    /// The health [`carry`](Health::carry) described, with each check's counts in the slot
    /// `slot` gives its name here (`None`: no such check here, its counts left out, as a
    /// reload forgets a removed check). Of two checks given one slot, the last counts.
    ///
    /// The description comes from another process, so it is made whole where it is not,
    /// to the rules the model keeps: an UP node has no trial and no cause; a DOWN one counts
    /// no slow answers, has a cause (`traffic` if none is given), and counts no passes toward
    /// `rise` while a check of its fails; a failing check has passed 0 times since; an
    /// UP node's unanswered request is part of its failure streak; a pass count is held below "no
    /// failure", and a streak or a slow-answer count at 2^20 (far above any limit a config
    /// allows, far below an overflow).
    pub fn carried<K>(c: &CarriedHealth<K>, slot: impl Fn(&K) -> Option<CheckSlot>) -> Health {
        let mut h = Health::default();
        for (name, counts) in &c.checks {
            if let Some(s) = slot(name) {
                h.fails[s.index()] = counts.fails;
                h.passes[s.index()] = if counts.fails > 0 {
                    0
                } else {
                    counts.passes.map_or(NO_FAILURE, |p| p.min(NO_FAILURE - 1))
                };
            }
        }
        h.streak = c.streak.min(CARRIED_COUNT_MAX);
        if c.up {
            h.unanswered = c.unanswered && h.streak > 0;
            h.slow = c.slow.min(CARRIED_COUNT_MAX);
            h.slow_since_ms = c.slow_since_ms;
        } else {
            h.up = false;
            h.unanswered = c.unanswered;
            h.claimed_until_ms = c.trial_claimed_until_ms;
            // The carrying process's trial stays its own: none is due here before its claim
            // ends, though a failure seen there meanwhile (a late answer timeout) set the next
            // trial's time earlier (`trying`, which holds that off there, is not carried).
            h.retry_at_ms = c
                .retry_at_ms
                .map_or(u64::MAX, |r| r.max(c.trial_claimed_until_ms));
            h.down_cause = Some(c.down_cause.unwrap_or(DownCause::Traffic));
            if h.a_check_fails() {
                h.streak = 0;
            }
        }
        h.debug_check();
        h
    }

    /// A pass of the check in `slot`: one more since its last failure, if it has one.
    fn check_passed(&mut self, slot: CheckSlot) {
        let p = &mut self.passes[slot.index()];
        if *p != NO_FAILURE {
            *p = (*p + 1).min(NO_FAILURE - 1);
        }
    }

    fn debug_check(&self) {
        debug_assert!(
            !self.up || (self.retry_at_ms == 0 && !self.trying && self.claimed_until_ms == 0),
            "an UP node has no trial"
        );
        debug_assert!(
            !self.unanswered || !self.up || self.streak > 0,
            "an unanswered request is part of a failure streak"
        );
        debug_assert!(
            self.up || self.slow == 0,
            "a DOWN node counts no slow answers"
        );
        debug_assert_eq!(
            self.up,
            self.down_cause.is_none(),
            "a DOWN node has its cause"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Observation::*;

    const S0: CheckSlot = CheckSlot::FIRST;

    proptest::proptest! {
        /// Whatever led to a health, when it says a `TrafficOk` changes nothing, one changes
        /// nothing (so skipping the report is the same as making it).
        #[test]
        fn traffic_ok_changes_nothing_when_it_says_so(
            steps in proptest::collection::vec((0u8..11, 0u64..30_000), 0..40),
            checked in proptest::prelude::any::<bool>(),
            fall in 1u32..4,
            max_slow_answers in 0u32..3,
        ) {
            let policy = HealthPolicy { checked, fall, max_slow_answers, ..HealthPolicy::default() };
            let mut h = Health::default();
            let mut now = 0;
            for (obs, dt) in steps {
                now += dt;
                let s1 = CheckSlot::new(1);
                let obs = [CheckPassed(S0), CheckFailed(S0), TrafficOk, TrafficFailed, CheckPassed(s1), CheckFailed(s1), TrafficConnected, NoAnswer, SlowAnswer, CheckConnected(S0), CheckConnected(s1)]
                    [usize::from(obs)];
                h.observe(obs, policy, now);
                if h.traffic_ok_changes_nothing(policy) {
                    for ok in [TrafficOk, TrafficConnected] {
                        let mut after = h;
                        proptest::prop_assert_eq!(after.observe(ok, policy, now), None);
                        proptest::prop_assert_eq!(after, h);
                    }
                } else if h.is_up() {
                    // The one other UP case: a failure streak that an answer resets.
                    let mut after = h;
                    after.observe(TrafficOk, policy, now);
                    proptest::prop_assert_ne!(after, h);
                }
            }
        }
    }

    /// A node DOWN by one of its checks, carried to a process where that check has another
    /// slot, is held DOWN there by that check: only `rise` passes of it bring the node back,
    /// not those of another. A check the receiver does not run is left out.
    #[test]
    fn a_carried_down_node_waits_for_its_failing_check_in_that_check_s_new_slot() {
        let policy = HealthPolicy {
            checked: true,
            fall: 1,
            rise: 2,
            ..HealthPolicy::default()
        };
        let (s1, s3, s5) = (CheckSlot::new(1), CheckSlot::new(3), CheckSlot::new(5));
        let mut h = Health::default();
        h.observe(CheckFailed(s1), policy, 10);
        h.observe(CheckFailed(CheckSlot::new(2)), policy, 10);
        assert!(!h.is_up());
        // Here: "port 80" in slot 1 and "port 9100" in slot 2; there: port 80's in slot 3,
        // and no check of port 9100's.
        let carried = h.carry(|s| {
            [(s1, "port 80"), (CheckSlot::new(2), "port 9100")]
                .into_iter()
                .find(|(k, _)| *k == s)
                .map(|(_, name)| name)
        });
        assert_eq!(carried.checks.len(), 2);
        let mut there = Health::carried(&carried, |&name| (name == "port 80").then_some(s3));
        assert_eq!(there.down_cause(), Some(DownCause::Checks));
        for _ in 0..3 {
            assert_eq!(
                there.observe(CheckPassed(s5), policy, 20),
                None,
                "another check's passes"
            );
        }
        assert_eq!(there.observe(CheckPassed(s3), policy, 30), None);
        assert_eq!(
            there.observe(CheckPassed(s3), policy, 40),
            Some(Transition::WentUp)
        );
    }

    proptest::proptest! {
        /// Whatever led to a health, the one carried to another process is the same health,
        /// but for a claimed trial, which stays with the process that claimed it: it goes on
        /// exactly as the first would have.
        #[test]
        fn a_carried_health_is_the_health_it_was(
            steps in proptest::collection::vec((0u8..13, 0u64..30_000), 0..40),
            checked in proptest::prelude::any::<bool>(),
            fall in 1u32..4,
            rise in 1u32..4,
            max_slow_answers in 0u32..3,
        ) {
            let policy = HealthPolicy { checked, fall, rise, max_slow_answers, ..HealthPolicy::default() };
            let mut h = Health::default();
            let mut now = 0;
            for (step, dt) in steps {
                now += dt;
                let s1 = CheckSlot::new(1);
                match step {
                    11 => { h.claim_trial(policy, now, 5_000, true); }
                    12 => { h.force(false); }
                    _ => {
                        let obs = [CheckPassed(S0), CheckFailed(S0), TrafficOk, TrafficFailed, CheckPassed(s1), CheckFailed(s1), TrafficConnected, NoAnswer, SlowAnswer, CheckConnected(S0), CheckConnected(s1)]
                            [usize::from(step)];
                        h.observe(obs, policy, now);
                    }
                }
                let carried = Health::carried(&h.carry(Some), |&s| Some(s));
                proptest::prop_assert_eq!(carried, Health { trying: false, claims: 0, ..h });
                proptest::prop_assert_eq!(carried.carry(Some), h.carry(Some));
            }
        }

        /// A description from another process is made whole whatever it says: the health
        /// made from it keeps every rule of the model (`debug_check`, which panics here),
        /// and carried again it is described the same.
        #[test]
        fn any_carried_description_makes_a_whole_health(
            up in proptest::prelude::any::<bool>(),
            streak in proptest::prop_oneof![proptest::prelude::Just(u32::MAX), 0u32..300, proptest::prelude::any::<u32>()],
            unanswered in proptest::prelude::any::<bool>(),
            retry_at_ms in proptest::option::of(proptest::prelude::any::<u64>()),
            claimed in proptest::prelude::any::<u64>(),
            slow in proptest::prop_oneof![proptest::prelude::Just(u32::MAX), 0u32..300, proptest::prelude::any::<u32>()],
            steps in proptest::collection::vec(0u8..11, 0..20),
            cause in proptest::option::of(0usize..4),
            checks in proptest::collection::vec((0usize..70, 0u8..=255, proptest::option::of(0u8..=255)), 0..5),
        ) {
            let c = CarriedHealth {
                up,
                streak,
                unanswered,
                retry_at_ms,
                trial_claimed_until_ms: claimed,
                slow,
                slow_since_ms: 7,
                down_cause: cause.map(|i| [DownCause::Checks, DownCause::Traffic, DownCause::SlowAnswers, DownCause::Forced][i]),
                checks: checks
                    .into_iter()
                    .map(|(slot, fails, passes)| (CheckSlot::new(slot), CheckCounts { fails, passes }))
                    .collect(),
            };
            let h = Health::carried(&c, |&s| Some(s));
            proptest::prop_assert_eq!(h.is_up(), up);
            proptest::prop_assert_eq!(h.down_cause().is_some(), !up);
            proptest::prop_assert_eq!(Health::carried(&h.carry(Some), |&s| Some(s)), h);
            // A failing check owes `rise` passes of its own whatever the description said
            // (its passes, the node's streak): one pass of it does not bring the node UP.
            let rise2 = HealthPolicy { checked: true, rise: 2, ..HealthPolicy::default() };
            for (slot, _) in &c.checks {
                if h.fails[slot.index()] > 0 && !up {
                    let mut once = h;
                    proptest::prop_assert_eq!(once.observe(CheckPassed(*slot), rise2, 1_000), None, "{:?}", h);
                    // Nor do the passes of another check after it: this one owes one more.
                    let other = CheckSlot::new((slot.index() + 1) % CheckSlot::COUNT);
                    for _ in 0..3 {
                        proptest::prop_assert_eq!(once.observe(CheckPassed(other), rise2, 1_000), None, "{:?}", h);
                    }
                }
            }
            // And it goes on under the model's rules (`debug_check` after every step), with
            // counts that do not overflow.
            let policy = HealthPolicy { checked: true, max_slow_answers: 3, ..HealthPolicy::default() };
            let mut h = h;
            for (i, step) in steps.into_iter().enumerate() {
                let s1 = CheckSlot::new(1);
                let obs = [CheckPassed(S0), CheckFailed(S0), TrafficOk, TrafficFailed, CheckPassed(s1), CheckFailed(s1), TrafficConnected, NoAnswer, SlowAnswer, CheckConnected(S0), CheckConnected(s1)]
                    [usize::from(step)];
                h.observe(obs, policy, 1_000 + i as u64);
                // The counts read back without overflowing.
                let _ = (h.streak(), h.slow_answers(policy, 1_000 + i as u64));
            }
        }
    }

    proptest::proptest! {
        /// Whatever happened to a checked node, `rise` rounds in which every check it has
        /// passes bring it UP (or leave it UP): no history keeps a healthy node DOWN.
        #[test]
        fn rise_rounds_of_passes_always_bring_a_checked_node_up(
            steps in proptest::collection::vec(0u8..12, 0..60),
            fall in 1u32..5,
            rise in 1u32..5,
            max_slow_answers in 0u32..3,
        ) {
            let policy = HealthPolicy { checked: true, fall, rise, max_slow_answers, ..HealthPolicy::default() };
            let slots = [CheckSlot::new(0), CheckSlot::new(1), CheckSlot::new(2)];
            let mut h = Health::default();
            for step in steps {
                match step {
                    0..=2 => { h.observe(CheckPassed(slots[usize::from(step)]), policy, 0); }
                    3..=5 => { h.observe(CheckFailed(slots[usize::from(step - 3)]), policy, 0); }
                    6 => { h.observe(TrafficFailed, policy, 0); }
                    7 => { h.force(false); }
                    8 => { h.observe(SlowAnswer, policy, 0); }
                    10 => { h.observe(NoAnswer, policy, 0); }
                    11 => { h.observe(CheckConnected(slots[0]), policy, 0); }
                    _ => { h.force(true); }
                }
            }
            for _ in 0..rise {
                for s in slots {
                    h.observe(CheckPassed(s), policy, 0);
                }
            }
            proptest::prop_assert!(h.is_up(), "{h:?}");
        }
    }

    /// A forced UP keeps what the checks said: a check failing then owes `rise` passes of its
    /// own when the node next goes DOWN, though by traffic.
    #[test]
    fn a_forced_up_keeps_the_failing_check_s_debt() {
        let p = checked();
        let (web, raw) = (CheckSlot::new(0), CheckSlot::new(1));
        let mut h = Health::default();
        for _ in 0..3 {
            h.observe(CheckFailed(raw), p, 0);
        }
        h.force(true);
        h.observe(CheckPassed(raw), p, 0);
        for _ in 0..3 {
            h.observe(TrafficFailed, p, 0);
        }
        assert!(!h.is_up());
        assert_eq!(h.observe(CheckPassed(web), p, 0), None);
        assert_eq!(
            h.observe(CheckPassed(web), p, 0),
            None,
            "the raw port passed once"
        );
        assert_eq!(h.observe(CheckPassed(raw), p, 0), Some(Transition::WentUp));
    }

    fn checked() -> HealthPolicy {
        HealthPolicy {
            checked: true,
            ..HealthPolicy::default()
        }
    }

    #[test]
    fn checks_take_a_node_down_after_fall_and_up_after_rise() {
        let p = checked();
        let mut h = Health::default();
        assert_eq!(h.observe(CheckFailed(S0), p, 0), None);
        assert_eq!(h.observe(CheckFailed(S0), p, 0), None);
        assert_eq!(h.observe(CheckFailed(S0), p, 0), Some(Transition::WentDown));
        assert!(!h.is_up());
        assert_eq!(h.observe(CheckFailed(S0), p, 0), None);
        assert_eq!(h.observe(CheckPassed(S0), p, 0), None);
        assert_eq!(h.observe(CheckPassed(S0), p, 0), Some(Transition::WentUp));
        assert!(h.is_up());
    }

    /// A node with two checks (say its HTTP port's and its raw TCP port's): the raw port
    /// dead, the HTTP port answering. The HTTP check's passes must not keep resetting the
    /// raw check's failures: the node goes DOWN in `fall` of them, and stays DOWN while the
    /// HTTP check passes, until the raw check has passed too, `rise` times.
    #[test]
    fn one_check_that_keeps_failing_takes_the_node_down_whatever_the_others_say() {
        let p = checked();
        let (web, raw) = (CheckSlot::new(0), CheckSlot::new(1));
        let mut h = Health::default();
        for _ in 0..2 {
            assert_eq!(h.observe(CheckPassed(web), p, 0), None);
            assert_eq!(h.observe(CheckFailed(raw), p, 0), None);
        }
        assert_eq!(h.observe(CheckPassed(web), p, 0), None);
        assert_eq!(
            h.observe(CheckFailed(raw), p, 0),
            Some(Transition::WentDown)
        );
        for _ in 0..10 {
            assert_eq!(h.observe(CheckPassed(web), p, 0), None, "still DOWN");
            assert_eq!(h.observe(CheckFailed(raw), p, 0), None);
        }
        assert!(!h.is_up());
        // The raw port comes back: `rise` passes of its own, the web check's between them
        // counting for nothing more.
        assert_eq!(h.observe(CheckPassed(raw), p, 0), None);
        assert_eq!(
            h.observe(CheckPassed(web), p, 0),
            None,
            "the raw port passed once"
        );
        assert_eq!(
            h.observe(CheckPassed(web), p, 0),
            None,
            "the raw port passed once"
        );
        assert_eq!(h.observe(CheckPassed(raw), p, 0), Some(Transition::WentUp));
        // And a check that fails once, then passes, counts nothing against the node.
        h.observe(CheckFailed(raw), p, 0);
        h.observe(CheckPassed(raw), p, 0);
        assert_eq!(h.streak(), 0);
    }

    /// A port that comes back after taking its node DOWN must pass `rise` times in a row of
    /// its own: a port that flaps (pass, fail, pass...) keeps the node DOWN however often its
    /// other ports pass between, where counting every check's passes together brought it back
    /// on each of its single passes. A node DOWN by traffic alone (no check failing) still
    /// comes back on any `rise` passes.
    #[test]
    fn a_port_back_from_the_dead_passes_rise_times_of_its_own() {
        let p = HealthPolicy {
            rise: 3,
            ..checked()
        };
        let (web, raw) = (CheckSlot::new(0), CheckSlot::new(1));
        let mut h = Health::default();
        for _ in 0..3 {
            h.observe(CheckFailed(raw), p, 0);
        }
        assert!(!h.is_up());
        for _ in 0..5 {
            assert_eq!(h.observe(CheckPassed(raw), p, 0), None);
            assert_eq!(h.observe(CheckPassed(web), p, 0), None);
            assert_eq!(
                h.observe(CheckPassed(web), p, 0),
                None,
                "the raw port flaps"
            );
            assert_eq!(h.observe(CheckFailed(raw), p, 0), None);
        }
        assert!(!h.is_up());
        assert_eq!(h.observe(CheckPassed(raw), p, 0), None);
        assert_eq!(h.observe(CheckPassed(raw), p, 0), None);
        assert_eq!(
            h.observe(CheckPassed(web), p, 0),
            None,
            "two passes of its own"
        );
        assert_eq!(
            h.streak(),
            2,
            "the stats page's coming up 2/3: the raw port's count"
        );
        assert_eq!(h.observe(CheckPassed(raw), p, 0), Some(Transition::WentUp));

        // A node DOWN by its traffic comes back on any `rise` passes, except that a check
        // that failed while it was UP owes its passes since that failure.
        let mut h = Health::default();
        h.observe(CheckFailed(raw), p, 0);
        h.observe(CheckPassed(raw), p, 0);
        for _ in 0..3 {
            h.observe(TrafficFailed, p, 0);
        }
        assert!(!h.is_up());
        assert_eq!(h.observe(CheckPassed(web), p, 0), None);
        assert_eq!(h.observe(CheckPassed(web), p, 0), None);
        assert_eq!(
            h.observe(CheckPassed(raw), p, 0),
            None,
            "three passes, but the raw port's second since its failure"
        );
        assert_eq!(h.observe(CheckPassed(raw), p, 0), Some(Transition::WentUp));
    }

    /// Two flaky checks, each failing now and then but never `fall` times in a row, do not
    /// add up to a DOWN node; neither does one round in which `fall` checks each fail once
    /// (a blip). Traffic failures still count on top of the worst check.
    #[test]
    fn each_check_counts_its_own_failures() {
        let p = checked();
        let (a, b, c) = (CheckSlot::new(0), CheckSlot::new(1), CheckSlot::new(2));
        let mut h = Health::default();
        for _ in 0..10 {
            assert_eq!(h.observe(CheckFailed(a), p, 0), None);
            assert_eq!(h.observe(CheckFailed(b), p, 0), None);
            assert_eq!(h.observe(CheckPassed(a), p, 0), None);
            assert_eq!(h.observe(CheckPassed(b), p, 0), None);
        }
        for s in [a, b, c] {
            assert_eq!(h.observe(CheckFailed(s), p, 0), None, "one round of a blip");
        }
        assert_eq!(h.streak(), 1);
        assert_eq!(h.observe(TrafficFailed, p, 0), None);
        assert_eq!(h.observe(CheckFailed(a), p, 0), Some(Transition::WentDown));
    }

    /// A failing check that a reload removes no longer holds the node: UP, the checks left
    /// passing reset its count; DOWN, the checks left bring it back in `rise` passes.
    #[test]
    fn a_forgotten_check_holds_the_node_no_more() {
        let p = checked();
        let (web, raw) = (CheckSlot::new(0), CheckSlot::new(1));
        let mut h = Health::default();
        h.observe(CheckFailed(raw), p, 0);
        h.observe(CheckFailed(raw), p, 0);
        h.forget_check(raw);
        assert_eq!(h.streak(), 0);
        assert_eq!(h.observe(CheckFailed(web), p, 0), None);
        assert_eq!(h.observe(CheckPassed(web), p, 0), None);

        let mut h = Health::default();
        for _ in 0..3 {
            h.observe(CheckFailed(raw), p, 0);
        }
        assert!(!h.is_up());
        assert_eq!(h.observe(CheckPassed(web), p, 0), None);
        h.forget_check(raw);
        assert!(!h.is_up(), "forgetting is no pass");
        assert_eq!(h.observe(CheckPassed(web), p, 0), None);
        assert_eq!(h.observe(CheckPassed(web), p, 0), Some(Transition::WentUp));
    }

    /// A reload that shortens `fail_timeout` reaches a node already DOWN: its trial is due
    /// at the new wait from when the old one began; one that lengthens it pushes the trial
    /// back. A trial in flight is left alone.
    #[test]
    fn a_new_fail_timeout_reaches_a_node_already_down() {
        let long = HealthPolicy {
            fall: 1,
            fail_timeout_ms: 60_000,
            ..HealthPolicy::default()
        };
        let short = HealthPolicy {
            fail_timeout_ms: 2_000,
            ..long
        };
        let mut h = Health::default();
        h.observe(TrafficFailed, long, 1_000);
        assert_eq!(h.retry_at_ms(long), Some(61_000));
        h.policy_changed(long, short);
        assert_eq!(h.retry_at_ms(short), Some(3_000));
        assert_eq!(h.availability(short, 3_000), Availability::TrialDue);
        h.policy_changed(short, long);
        assert_eq!(h.retry_at_ms(long), Some(61_000));
        assert!(h.claim_trial(long, 61_000, 5_000, false));
        h.policy_changed(long, short);
        assert_eq!(h.retry_at_ms(short), Some(66_000), "the claim holds");
    }

    /// With checks that only connect (TCP, a TLS handshake), a node that completes them and
    /// never answers: their passes do not clear a streak that holds an unanswered request,
    /// so it goes DOWN on its `fall`-th unanswered request whatever passed between (before,
    /// every pass cleared it: under traffic slower than one unanswered request per check
    /// interval it never went DOWN). An HTTP check's pass, or an answer, clears it; and the
    /// connect-level passes count toward `rise` once it is DOWN, bringing it back on
    /// probation (below).
    #[test]
    fn connect_level_check_passes_do_not_hide_unanswered_requests() {
        let p = checked();
        let mut h = Health::default();
        for _ in 0..2 {
            assert_eq!(h.observe(NoAnswer, p, 0), None);
            for _ in 0..5 {
                assert_eq!(h.observe(CheckConnected(S0), p, 0), None);
            }
        }
        assert_eq!(h.observe(NoAnswer, p, 0), Some(Transition::WentDown));
        assert_eq!(h.observe(CheckConnected(S0), p, 0), None);
        assert_eq!(
            h.observe(CheckConnected(S0), p, 0),
            Some(Transition::WentUp),
            "back at rise"
        );
        for clears in [CheckPassed(S0), TrafficOk] {
            let mut h = Health::default();
            h.observe(NoAnswer, p, 0);
            h.observe(NoAnswer, p, 0);
            assert_eq!(h.observe(clears, p, 0), None);
            assert_eq!(
                h.observe(NoAnswer, p, 0),
                None,
                "{clears:?} cleared the streak"
            );
        }
        // A streak of refused connects alone is cleared by a connect-level pass, as before.
        let mut h = Health::default();
        h.observe(TrafficFailed, p, 0);
        h.observe(TrafficFailed, p, 0);
        h.observe(CheckConnected(S0), p, 0);
        assert_eq!(h.observe(TrafficFailed, p, 0), None);
    }

    /// A node DOWN for requests it left unanswered, checked only at the connect level (a
    /// `tcp` or `tls` check, which a hung process's kernel completes): back at `rise`, it is
    /// on probation, as after a trial, so its first unanswered request (or any failure)
    /// takes it DOWN again (before, `fall` of them, each a client waiting out its answer
    /// timeout, on every cycle of the hang). A connect-level pass does not end the
    /// probation; an answer does, as does an HTTP check's pass while it is DOWN (the process
    /// answers), after which it comes back without one.
    #[test]
    fn a_node_back_on_connect_level_passes_after_a_hang_is_on_probation() {
        let p = checked();
        let hung = || {
            let mut h = Health::default();
            for _ in 0..p.fall {
                h.observe(NoAnswer, p, 0);
            }
            assert!(!h.is_up());
            h
        };
        let back = |h: &mut Health, pass: Observation| {
            for _ in 1..p.rise {
                assert_eq!(h.observe(pass, p, 0), None);
            }
            assert_eq!(h.observe(pass, p, 0), Some(Transition::WentUp));
        };
        let mut h = hung();
        back(&mut h, CheckConnected(S0));
        assert_eq!(h.observe(CheckConnected(S0), p, 0), None);
        assert_eq!(
            h.observe(NoAnswer, p, 0),
            Some(Transition::WentDown),
            "still hung: DOWN at its first unanswered request"
        );
        // As after a trial, any failure ends it: a failed check too.
        let mut h = hung();
        back(&mut h, CheckConnected(S0));
        assert_eq!(
            h.observe(CheckFailed(S0), p, 0),
            Some(Transition::WentDown),
            "a failed check on probation"
        );
        // An answer ends the probation: `fall` unanswered requests again.
        let mut h = hung();
        back(&mut h, CheckConnected(S0));
        h.observe(TrafficOk, p, 0);
        for _ in 1..p.fall {
            assert_eq!(h.observe(NoAnswer, p, 0), None);
        }
        // An HTTP check that answered while it was DOWN: back without probation.
        let mut h = hung();
        back(&mut h, CheckPassed(S0));
        assert_eq!(h.observe(NoAnswer, p, 0), None);
        // `fall = 1`: DOWN at the first unanswered request anyway.
        let one = HealthPolicy { fall: 1, ..p };
        let mut h = Health::default();
        h.observe(NoAnswer, one, 0);
        for _ in 0..one.rise {
            h.observe(CheckConnected(S0), one, 0);
        }
        assert!(h.is_up());
        assert_eq!(h.observe(NoAnswer, one, 0), Some(Transition::WentDown));
    }

    /// Without checks, a hung node behind an HTTP and a TCP listener: the TCP connects
    /// complete (its kernel accepts), the HTTP requests get no answer. The connects reset a
    /// streak of refused connects, never one that holds an unanswered request: the node goes
    /// DOWN on its `fall`-th unanswered request whatever the connects between (chaos run 25:
    /// it stayed UP, every HTTP request waiting out its answer timeout). An answer resets it.
    #[test]
    fn completed_connects_do_not_hide_unanswered_requests() {
        let p = HealthPolicy::default();
        let mut h = Health::default();
        for _ in 0..2 {
            assert_eq!(h.observe(NoAnswer, p, 0), None);
            assert_eq!(h.observe(TrafficConnected, p, 0), None);
        }
        assert_eq!(h.observe(NoAnswer, p, 0), Some(Transition::WentDown));

        let mut h = Health::default();
        h.observe(TrafficFailed, p, 0);
        h.observe(TrafficFailed, p, 0);
        h.observe(TrafficConnected, p, 0);
        assert_eq!(h.streak(), 0, "a connect answers failed connects");
        h.observe(NoAnswer, p, 0);
        h.observe(TrafficOk, p, 0);
        assert_eq!(h.streak(), 0, "an answer answers everything");
        h.observe(TrafficConnected, p, 0);
        assert_eq!(h.observe(NoAnswer, p, 0), None);
        assert_eq!(h.streak(), 1);
    }

    /// An early trial in flight is not reopened by the late answer timeout of a request sent
    /// before the node went DOWN (one trial at a time), nor by a failed connect, which may be
    /// a late one too; its own refused connect frees it at once, as its caller moves on and
    /// gives the claim back.
    #[test]
    fn an_early_trial_holds_until_its_claim_lapses_or_a_connect_is_refused() {
        let p = HealthPolicy {
            fall: 1,
            ..HealthPolicy::default()
        };
        let mut h = Health::default();
        h.observe(TrafficFailed, p, 0);
        assert!(h.early_trial_possible(p, 1));
        assert!(h.claim_trial(p, 1, 5_000, true));
        assert!(!h.early_trial_possible(p, 2));
        h.observe(NoAnswer, p, 3);
        assert!(!h.early_trial_possible(p, 4), "a late answer timeout");
        assert!(!h.claim_trial(p, 4, 5_000, true));
        h.observe(TrafficFailed, p, 10);
        assert!(
            !h.early_trial_possible(p, 11),
            "a failed connect, maybe late"
        );
        h.trial_abandoned(p, h.trial_claim(), 10);
        assert!(h.early_trial_possible(p, 11), "its own refused connect");
        assert!(h.claim_trial(p, 11, 5_000, true));
        assert!(h.early_trial_possible(p, 5_011), "the claim lapsed");
    }

    /// A node DOWN at 0 ms by its one failure (`fall = 1`, no checks), its trial due a
    /// `fail_timeout` (10 s) on, and its policy.
    fn down_by_one_failure() -> (HealthPolicy, Health) {
        let p = HealthPolicy {
            fall: 1,
            fail_timeout_ms: 10_000,
            ..HealthPolicy::default()
        };
        let mut h = Health::default();
        h.observe(TrafficFailed, p, 0);
        (p, h)
    }

    /// A node that starts afresh (a reload moved it to another address) while a trial of it
    /// is in flight keeps its count of claims: the old trial's end, with nothing learnt,
    /// does not end the trial claimed at the new address (with the count back at 0, its
    /// number was the old one's, and its success went unheard: DOWN a `fail_timeout` more).
    #[test]
    fn a_trial_claimed_before_a_fresh_start_does_not_end_a_later_one() {
        let (p, mut h) = down_by_one_failure();
        assert!(h.claim_trial(p, 10_000, 63_000, false));
        let before = h.trial_claim();
        // Moved to another address (a reload) while that trial is in flight: UP afresh,
        // then DOWN at the new address, and its own trial claimed.
        h = h.afresh();
        assert!(h.is_up());
        h.observe(TrafficFailed, p, 11_000);
        assert!(h.claim_trial(p, 21_000, 63_000, false));
        assert_ne!(h.trial_claim(), before, "a claim number used again");
        // The old trial ends with nothing learnt: the new one holds on, and its success
        // brings the node back.
        h.trial_abandoned(p, before, 21_500);
        assert!(
            h.trial_in_flight(21_500),
            "the old claim ended the new trial"
        );
        assert_eq!(h.observe(TrafficOk, p, 22_000), Some(Transition::WentUp));
    }

    /// A trial whose request ended with nothing learnt of the node (the client left, a
    /// stream reset) frees its claim at once: an early trial may go again, and a trial when
    /// due is due `fail_timeout` on, never later than the claim said. Before, the claim held
    /// for its whole `connect + upstream_answer`: every request meanwhile found no node. A
    /// claim another replaced, or whose outcome came, is not touched.
    #[test]
    fn an_abandoned_trial_frees_its_claim() {
        let (p, mut h) = down_by_one_failure();
        assert!(h.claim_trial(p, 1, 63_000, true));
        let claim = h.trial_claim();
        assert!(!h.early_trial_possible(p, 100));
        h.trial_abandoned(p, claim, 100);
        assert!(h.early_trial_possible(p, 100), "the claim ends at once");
        assert_eq!(h.availability(p, 10_099), Availability::Down);
        assert_eq!(
            h.availability(p, 10_100),
            Availability::TrialDue,
            "due fail_timeout after it ended"
        );

        // A later claim is not ended by an earlier one's end.
        assert!(h.claim_trial(p, 10_100, 63_000, false));
        let second = h.trial_claim();
        let until = h.claimed_until_ms;
        h.trial_abandoned(p, claim, 10_200);
        assert!(!h.early_trial_possible(p, 10_200));
        assert_eq!(h.claimed_until_ms, until);

        // One that failed and is given back after: the next waits `fail_timeout` from the
        // failure, not from the give-back.
        h.observe(NoAnswer, p, 20_000);
        h.trial_abandoned(p, second, 20_001);
        assert!(!h.trial_in_flight(20_001));
        assert_eq!(h.availability(p, 29_999), Availability::Down);
        assert_eq!(h.availability(p, 30_000), Availability::TrialDue);

        // A short claim is not lengthened: due when it would have lapsed.
        assert!(h.claim_trial(p, 30_000, 2_000, false));
        let short = h.trial_claim();
        h.trial_abandoned(p, short, 30_500);
        assert_eq!(h.availability(p, 32_000), Availability::TrialDue);

        // A success ends the claim as ever.
        assert!(h.claim_trial(p, 32_000, 2_000, false));
        assert_eq!(h.observe(TrafficOk, p, 32_100), Some(Transition::WentUp));
        let up = h;
        h.trial_abandoned(p, h.trial_claim(), 32_200);
        assert_eq!(h, up);

        // Two claims in one millisecond are told apart: the first, whose connect was
        // refused and whose claim ran out, does not end the second when it is given back
        // after it.
        let mut h = Health::default();
        h.observe(TrafficFailed, p, 0);
        assert!(h.claim_trial(p, 1, 1, true));
        let refused = h.trial_claim();
        h.observe(TrafficFailed, p, 1);
        assert!(h.claim_trial(p, 2, 5_000, true));
        let until = h.claimed_until_ms;
        h.trial_abandoned(p, refused, 2);
        assert_eq!(
            (h.claimed_until_ms, h.trying),
            (until, true),
            "the second trial holds"
        );
    }

    /// A node that went DOWN leaving requests unanswered (a hung process: its kernel still
    /// completes connects) is not brought back by a TCP listener's connect, only by an answer:
    /// the connect ends the trial with nothing learnt. One DOWN by refused connects comes back
    /// on a connect, as before. Before, the connect brought the hung node UP, and it took its
    /// share of fresh HTTP sessions, each waiting out its answer timeout, at every
    /// `fail_timeout`.
    #[test]
    fn a_connect_is_no_trial_success_for_a_node_that_left_requests_unanswered() {
        let p = HealthPolicy {
            fall: 2,
            fail_timeout_ms: 1_000,
            ..HealthPolicy::default()
        };
        let mut hung = Health::default();
        hung.observe(TrafficFailed, p, 0);
        assert_eq!(hung.observe(NoAnswer, p, 0), Some(Transition::WentDown));
        assert!(hung.claim_trial(p, 1_000, 3_000, false));
        assert_eq!(hung.observe(TrafficConnected, p, 1_010), None);
        assert!(!hung.is_up());
        assert_eq!(
            hung.availability(p, 1_010),
            Availability::Down,
            "the trial ended"
        );
        assert!(hung.early_trial_possible(p, 1_010), "its claim too");
        assert_eq!(hung.availability(p, 2_010), Availability::TrialDue);
        assert!(hung.claim_trial(p, 2_010, 3_000, false));
        assert_eq!(
            hung.observe(TrafficOk, p, 2_020),
            Some(Transition::WentUp),
            "an answer"
        );

        // A trial that went unanswered counts too, whatever took the node DOWN.
        let mut h = Health::default();
        h.observe(TrafficFailed, p, 0);
        h.observe(TrafficFailed, p, 0);
        assert!(h.claim_trial(p, 1_000, 3_000, false));
        h.observe(NoAnswer, p, 1_500);
        h.trial_abandoned(p, h.trial_claim(), 1_500);
        assert!(h.claim_trial(p, 2_500, 3_000, false));
        assert_eq!(h.observe(TrafficConnected, p, 2_510), None);

        let mut refused = Health::default();
        refused.observe(TrafficFailed, p, 0);
        refused.observe(TrafficFailed, p, 0);
        assert!(refused.claim_trial(p, 1_000, 3_000, false));
        assert_eq!(
            refused.observe(TrafficConnected, p, 1_010),
            Some(Transition::WentUp)
        );
    }

    #[test]
    fn check_slots_past_the_last_share_it() {
        assert_eq!(CheckSlot::new(63), CheckSlot::new(1000));
        assert_eq!(CheckSlot::new(63).index(), 63);
        assert_ne!(CheckSlot::new(62), CheckSlot::new(63));
    }

    #[test]
    fn a_check_success_resets_the_failure_streak() {
        let p = checked();
        let mut h = Health::default();
        h.observe(CheckFailed(S0), p, 0);
        h.observe(TrafficFailed, p, 0);
        h.observe(CheckPassed(S0), p, 0);
        assert_eq!(h.observe(CheckFailed(S0), p, 0), None);
        assert_eq!(h.observe(CheckFailed(S0), p, 0), None);
        assert_eq!(h.observe(CheckFailed(S0), p, 0), Some(Transition::WentDown));
    }

    #[test]
    fn with_checks_completed_connects_neither_hold_a_node_up_nor_bring_it_back() {
        let p = checked();
        let mut h = Health::default();
        // A hung node: every connect completes, every check times out.
        for _ in 0..2 {
            h.observe(CheckFailed(S0), p, 0);
            assert_eq!(h.observe(TrafficOk, p, 0), None);
        }
        assert_eq!(h.observe(CheckFailed(S0), p, 0), Some(Transition::WentDown));
        for t in 0..100 {
            assert_eq!(h.observe(TrafficOk, p, t * 1000), None);
            assert_eq!(h.availability(p, t * 1000), Availability::Down);
        }
        assert!(!h.claim_trial(p, 1_000_000, 100, false));
    }

    #[test]
    fn without_checks_a_down_node_gets_one_trial_after_fail_timeout() {
        let p = HealthPolicy::default();
        let mut h = Health::default();
        h.observe(TrafficFailed, p, 0);
        h.observe(TrafficFailed, p, 0);
        assert_eq!(h.observe(TrafficFailed, p, 5), Some(Transition::WentDown));
        assert_eq!(h.availability(p, 10_004), Availability::Down);
        assert_eq!(h.availability(p, 10_005), Availability::TrialDue);
        assert!(h.claim_trial(p, 10_005, 1_000, false));
        // Claimed: nobody else tries until the claim lapses.
        assert!(!h.claim_trial(p, 10_006, 1_000, false));
        assert_eq!(h.availability(p, 10_006), Availability::Down);
        // The trial is refused: the next one is a whole fail_timeout later.
        assert_eq!(h.observe(TrafficFailed, p, 10_010), None);
        assert_eq!(h.availability(p, 20_009), Availability::Down);
        assert!(h.claim_trial(p, 20_010, 1_000, false));
        assert_eq!(h.observe(TrafficOk, p, 20_011), Some(Transition::WentUp));
        assert_eq!(h.availability(p, 20_011), Availability::Up);
    }

    #[test]
    fn a_trial_never_reported_is_due_again_when_its_claim_lapses() {
        let p = HealthPolicy {
            fall: 1,
            ..HealthPolicy::default()
        };
        let mut h = Health::default();
        h.observe(TrafficFailed, p, 0);
        assert!(h.claim_trial(p, 10_000, 500, false));
        assert_eq!(h.availability(p, 10_499), Availability::Down);
        assert_eq!(h.availability(p, 10_500), Availability::TrialDue);
    }

    #[test]
    fn without_checks_traffic_success_resets_the_failure_streak() {
        let p = HealthPolicy::default();
        let mut h = Health::default();
        h.observe(TrafficFailed, p, 0);
        h.observe(TrafficFailed, p, 0);
        h.observe(TrafficOk, p, 0);
        assert_eq!(h.observe(TrafficFailed, p, 0), None);
        assert_eq!(h.streak(), 1);
    }

    #[test]
    fn a_hung_node_s_trial_keeps_it_down_until_an_answer_comes() {
        let p = HealthPolicy::default();
        let mut h = Health::default();
        // A hung node without checks: every answer times out.
        for _ in 0..2 {
            assert_eq!(h.observe(TrafficFailed, p, 0), None);
        }
        assert_eq!(h.observe(TrafficFailed, p, 0), Some(Transition::WentDown));
        // Its trial (claimed for the connect and answer timeouts) times out too: still
        // DOWN, and nobody else tried it meanwhile.
        assert!(h.claim_trial(p, 10_000, 6_000, false));
        assert!(
            !h.claim_trial(p, 12_000, 6_000, false),
            "one trial at a time"
        );
        assert_eq!(h.observe(TrafficFailed, p, 16_000), None);
        assert!(!h.is_up());
        assert_eq!(h.retry_at_ms(p), Some(26_000), "the wait starts again");
        // The next trial is answered: back UP, on probation (one failure from DOWN)
        // until another answer.
        assert!(h.claim_trial(p, 26_000, 6_000, false));
        assert_eq!(h.observe(TrafficOk, p, 26_001), Some(Transition::WentUp));
        assert_eq!(h.streak(), p.fall - 1);
        assert_eq!(h.observe(TrafficOk, p, 26_002), None);
        assert_eq!(h.streak(), 0);
        // A node brought back by a trial that proved little (a TCP connect to a stopped
        // process): its first failure takes it DOWN again.
        for t in [26_003, 26_004] {
            h.observe(TrafficFailed, p, t);
        }
        assert_eq!(
            h.observe(TrafficFailed, p, 26_005),
            Some(Transition::WentDown)
        );
        assert!(h.claim_trial(p, 36_005, 1_000, false));
        assert_eq!(h.observe(TrafficOk, p, 36_006), Some(Transition::WentUp));
        assert_eq!(
            h.observe(TrafficFailed, p, 36_007),
            Some(Transition::WentDown),
            "on probation"
        );
    }

    #[test]
    fn a_success_no_trial_made_does_not_bring_a_node_back() {
        let p = HealthPolicy {
            fall: 1,
            ..HealthPolicy::default()
        };
        let mut h = Health::default();
        assert_eq!(h.observe(TrafficFailed, p, 0), Some(Transition::WentDown));
        // Answers of requests sent while it was still UP, arriving now or after its
        // fail_timeout: no trial was claimed, so they prove nothing.
        assert_eq!(h.observe(TrafficOk, p, 1), None);
        assert_eq!(h.observe(TrafficOk, p, 10_500), None);
        assert!(!h.is_up());
        assert!(h.claim_trial(p, 11_000, 1_000, false));
        // The trial fails, and its caller gives the claim back: a success after that
        // (another request's from before) is no trial's, and the wait starts again.
        assert_eq!(h.observe(TrafficFailed, p, 11_100), None);
        h.trial_abandoned(p, h.trial_claim(), 11_100);
        assert_eq!(h.observe(TrafficOk, p, 11_200), None);
        assert!(!h.claim_trial(p, 21_099, 1_000, false));
        assert!(h.claim_trial(p, 21_100, 1_000, false));
        assert_eq!(h.observe(TrafficOk, p, 21_200), Some(Transition::WentUp));
    }

    /// A trial in flight crosses an upgrade as the carrying process's: a late failure there
    /// made the next trial's time earlier than the claim's end, which `trying` holds off
    /// there; the receiving process makes no trial before the claim ends either.
    #[test]
    fn a_carried_trial_in_flight_holds_off_the_next_one_across_an_upgrade() {
        let p = HealthPolicy::default();
        let mut h = Health::default();
        for t in [0, 1, 2] {
            h.observe(NoAnswer, p, t);
        }
        assert!(h.claim_trial(p, 10_002, 33_000, false), "held to 43_002");
        h.observe(NoAnswer, p, 15_000);
        assert_eq!(h.availability(p, 30_000), Availability::Down);
        let carried = Health::carried(&h.carry(Some), |&s| Some(s));
        assert_eq!(carried.availability(p, 30_000), Availability::Down);
        assert!(!carried.early_trial_possible(p, 30_000));
        assert_eq!(carried.availability(p, 43_002), Availability::TrialDue);
    }

    /// A failure seen while a trial is in flight may be a request's from before the node
    /// went DOWN, whose answer timeout comes late: the trial goes on to its own outcome, no
    /// second trial is made meanwhile, and the next one is due `fail_timeout` after the
    /// failure at the earliest. Before, the late timeout ended the trial: a second trial
    /// was due while the first still waited on the (hung) node, each trial's timeout opened
    /// the next (two clients at once waiting on it for as long as it hung), and the first
    /// trial's success, had the node come back, was not counted.
    #[test]
    fn a_late_failure_opens_no_second_trial_while_one_is_in_flight() {
        let p = HealthPolicy::default(); // fall 3, fail_timeout 10 s
        let mut h = Health::default();
        for t in [30_000, 30_001, 30_002] {
            h.observe(NoAnswer, p, t);
        }
        assert!(!h.is_up());
        assert!(h.claim_trial(p, 40_002, 33_000, false), "held to 73_002");
        let first = h.trial_claim();
        // A POST sent at 25_000 times out now.
        assert_eq!(h.observe(NoAnswer, p, 55_000), None);
        assert!(h.trial_in_flight(55_000));
        assert!(!h.early_trial_possible(p, 65_000));
        assert!(
            !h.claim_trial(p, 65_000, 33_000, false),
            "one trial at a time while the claim holds"
        );
        // The node came back meanwhile: the trial's answer brings it UP.
        let mut back = h;
        assert_eq!(
            back.observe(TrafficOk, p, 66_000),
            Some(Transition::WentUp),
            "the trial's success counts"
        );
        // Or the trial times out too, and its caller gives the claim back: the next trial
        // is due `fail_timeout` after that.
        assert_eq!(h.observe(NoAnswer, p, 70_002), None);
        h.trial_abandoned(p, first, 70_002);
        assert!(!h.trial_in_flight(70_003));
        assert_eq!(h.availability(p, 80_001), Availability::Down);
        assert!(h.claim_trial(p, 80_002, 33_000, false));
    }

    #[test]
    fn a_forced_down_is_never_tried() {
        let p = HealthPolicy::default();
        let mut h = Health::default();
        assert_eq!(h.force(false), Some(Transition::WentDown));
        assert_eq!(h.availability(p, u64::MAX - 1), Availability::Down);
        assert_eq!(h.observe(TrafficOk, p, 50_000), None);
        assert_eq!(h.observe(TrafficFailed, p, 50_000), None);
        assert_eq!(h.availability(p, u64::MAX - 1), Availability::Down);
        assert_eq!(h.force(false), None);
        assert_eq!(h.force(true), Some(Transition::WentUp));
    }

    /// A node on a virtual clock as the data plane drives it: requests sent, answered or
    /// timed out, each timeout judged by [`answered_since`] before it is reported.
    struct Driven {
        health: Health,
        policy: HealthPolicy,
        youngest_answered: u64,
    }

    impl Driven {
        fn new(policy: HealthPolicy) -> Driven {
            Driven {
                health: Health::default(),
                policy,
                youngest_answered: 0,
            }
        }

        fn answered(&mut self, sent: u64, now: u64) {
            self.youngest_answered = self.youngest_answered.max(sent);
            self.health.observe(TrafficOk, self.policy, now);
        }

        /// True when the timeout was charged to the node.
        fn timed_out(&mut self, sent: u64, now: u64) -> bool {
            if answered_since(sent, self.youngest_answered) {
                self.health.observe(SlowAnswer, self.policy, now);
                return false;
            }
            self.health.observe(NoAnswer, self.policy, now);
            true
        }
    }

    #[test]
    fn requests_slow_on_a_node_that_answers_younger_ones_charge_it_nothing() {
        for checked in [false, true] {
            let p = HealthPolicy {
                checked,
                ..HealthPolicy::default()
            };
            let mut n = Driven::new(p);
            // Three reports sent at 1, 2, 3 ms outlast the 30 s answer timeout; requests
            // sent after them are answered meanwhile.
            for sent in 10..20 {
                n.answered(sent, sent + 2);
            }
            for sent in 1..=3 {
                assert!(!n.timed_out(sent, sent + 30_000), "checked {checked}");
            }
            assert!(n.health.is_up(), "checked {checked}");
            assert_eq!(n.health.streak(), 0);
        }
    }

    #[test]
    fn a_node_that_hangs_mid_burst_is_charged_for_what_it_took_after_its_last_answer() {
        let p = HealthPolicy::default();
        let mut n = Driven::new(p);
        // Requests sent at 1..=5 ms; the node answers those sent at 1 and 2 (at 6 and 7 ms,
        // after the others were sent) and hangs.
        n.answered(1, 6);
        n.answered(2, 7);
        // The answers came after 3, 4 and 5 were sent, but to older requests: no sign of
        // life for those. Their timeouts are charged and take the node DOWN.
        assert!(n.timed_out(3, 30_003));
        assert!(n.timed_out(4, 30_004));
        assert!(n.timed_out(5, 30_005));
        assert!(!n.health.is_up());
        // Same send time as the youngest answer: not younger, no proof.
        assert!(!answered_since(7, 7));
        assert!(answered_since(6, 7));
    }

    /// A node that answers most requests and lets some outlast the answer timeout (a gray
    /// failure): with `max_slow_answers`, that many within one `fail_timeout` take it DOWN
    /// whatever it answered between them; slow answers spread wider, or with the limit off,
    /// never do.
    #[test]
    fn slow_answers_take_a_node_down_at_their_limit_within_fail_timeout() {
        for checked in [false, true] {
            let p = HealthPolicy {
                checked,
                max_slow_answers: 3,
                ..HealthPolicy::default()
            };
            let mut n = Driven::new(p);
            // One request in four hangs; the node answers the others, younger ones included.
            let mut sent = 0;
            let mut downs = 0;
            for round in 0..3 {
                // The hung request, then three that are answered.
                sent += 1;
                let hung = sent;
                for _ in 0..3 {
                    sent += 1;
                    n.answered(sent, sent + 5);
                }
                let now = hung + 30_000 + round * 100;
                assert!(!n.timed_out(hung, now), "checked {checked}: not charged");
                if !n.health.is_up() {
                    downs += 1;
                    assert_eq!(round, 2, "checked {checked}: DOWN at the third slow answer");
                }
            }
            assert_eq!(downs, 1, "checked {checked}");
            // Not a failure streak: the node is DOWN for its slow answers alone.
            assert_eq!(n.health.availability(p, 30_300), Availability::Down);
        }
    }

    #[test]
    fn slow_answers_further_apart_than_fail_timeout_or_with_the_limit_off_count_for_nothing() {
        let spread = HealthPolicy {
            max_slow_answers: 3,
            fail_timeout_ms: 10_000,
            ..HealthPolicy::default()
        };
        let mut h = Health::default();
        // Two in one window, the third as the next begins: the count starts again there.
        assert_eq!(h.observe(SlowAnswer, spread, 1_000), None);
        assert_eq!(h.observe(SlowAnswer, spread, 2_000), None);
        assert_eq!(h.observe(SlowAnswer, spread, 11_000), None);
        assert_eq!(h.observe(SlowAnswer, spread, 12_000), None);
        assert!(h.is_up());
        assert_eq!(
            h.observe(SlowAnswer, spread, 20_999),
            Some(Transition::WentDown),
            "the third within 10 s of 11_000"
        );

        let off = HealthPolicy::default();
        assert_eq!(off.max_slow_answers, 0, "off by default");
        let mut h = Health::default();
        for t in 0..1_000 {
            assert_eq!(h.observe(SlowAnswer, off, t), None);
        }
        assert!(h.is_up());
        assert!(h.traffic_ok_changes_nothing(off), "no count kept");
    }

    /// DOWN for its slow answers, a node comes back as from any other DOWN (its trial after
    /// `fail_timeout`; with checks, `rise` passes) with a fresh count: the limit again, not one
    /// more, takes it DOWN the next time.
    #[test]
    fn a_node_down_for_slow_answers_comes_back_with_its_count_started_again() {
        for checked in [false, true] {
            let p = HealthPolicy {
                checked,
                max_slow_answers: 2,
                ..HealthPolicy::default()
            };
            let mut h = Health::default();
            h.observe(SlowAnswer, p, 0);
            assert_eq!(h.observe(SlowAnswer, p, 10), Some(Transition::WentDown));
            // Late slow answers of requests sent while it was UP change nothing.
            assert_eq!(h.observe(SlowAnswer, p, 20), None);
            if checked {
                assert_eq!(h.observe(CheckPassed(S0), p, 2_000), None);
                assert_eq!(
                    h.observe(CheckPassed(S0), p, 4_000),
                    Some(Transition::WentUp)
                );
            } else {
                assert_eq!(h.availability(p, 10_009), Availability::Down);
                assert!(h.claim_trial(p, 10_010, 1_000, false));
                assert_eq!(h.observe(TrafficOk, p, 10_050), Some(Transition::WentUp));
            }
            assert_eq!(h.observe(SlowAnswer, p, 10_100), None, "checked {checked}");
            assert_eq!(
                h.observe(SlowAnswer, p, 10_200),
                Some(Transition::WentDown),
                "checked {checked}"
            );
        }
    }

    /// The cause a DOWN node shows is the kind of observation that reached its limit, or the
    /// operator; UP again, it has none.
    #[test]
    fn a_down_node_says_what_took_it_down() {
        let gray = HealthPolicy {
            checked: true,
            max_slow_answers: 1,
            ..HealthPolicy::default()
        };
        let down = |steps: &[Observation]| {
            let mut h = Health::default();
            for &o in steps {
                h.observe(o, gray, 0);
            }
            assert!(!h.is_up(), "{steps:?}");
            h.down_cause()
        };
        assert_eq!(
            down(&[CheckFailed(S0), CheckFailed(S0), CheckFailed(S0)]),
            Some(DownCause::Checks)
        );
        // A streak of checks and traffic: the one that tipped it.
        assert_eq!(
            down(&[CheckFailed(S0), CheckFailed(S0), NoAnswer]),
            Some(DownCause::Traffic)
        );
        assert_eq!(
            down(&[TrafficFailed, NoAnswer, CheckFailed(S0)]),
            Some(DownCause::Checks)
        );
        assert_eq!(down(&[SlowAnswer]), Some(DownCause::SlowAnswers));
        let mut h = Health::default();
        assert_eq!(h.down_cause(), None);
        h.force(false);
        assert_eq!(h.down_cause(), Some(DownCause::Forced));
        assert_eq!(DownCause::SlowAnswers.as_str(), "slow-answers");
        h.observe(CheckPassed(S0), gray, 0);
        h.observe(CheckPassed(S0), gray, 0);
        assert!(h.is_up());
        assert_eq!(h.down_cause(), None);
    }
}
