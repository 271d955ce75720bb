//! Health as a pure state machine: `fall` consecutive failures take a node DOWN, `rise`
//! consecutive successes bring it back UP. Each record says whether the state flipped, so the
//! caller (active probes, or passive failures seen by live traffic) can log and act on it.
//!
//! No timers live here: probing is async code in the binary that calls in with results.

/// How many consecutive results flip the state. Defaults are HAProxy's (`fall 3 rise 2`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthPolicy {
    pub fall: u32,
    pub rise: u32,
}

impl Default for HealthPolicy {
    fn default() -> Self {
        HealthPolicy { fall: 3, rise: 2 }
    }
}

/// A node's health as seen by checks and traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Health {
    up: bool,
    /// Consecutive results against the current state (failures while up, successes while down).
    streak: u32,
}

/// A change of health state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    WentDown,
    WentUp,
}

impl Default for Health {
    /// A declared node starts UP, as in HAProxy: traffic is not withheld until a first check.
    fn default() -> Self {
        Health {
            up: true,
            streak: 0,
        }
    }
}

impl Health {
    pub fn is_up(&self) -> bool {
        self.up
    }

    /// Records a successful check or request.
    pub fn record_success(&mut self, policy: HealthPolicy) -> Option<Transition> {
        if self.up {
            self.streak = 0;
            return None;
        }
        self.streak += 1;
        if self.streak >= policy.rise.max(1) {
            *self = Health {
                up: true,
                streak: 0,
            };
            return Some(Transition::WentUp);
        }
        None
    }

    /// Records a failed check or connection.
    pub fn record_failure(&mut self, policy: HealthPolicy) -> Option<Transition> {
        if !self.up {
            self.streak = 0;
            return None;
        }
        self.streak += 1;
        if self.streak >= policy.fall.max(1) {
            *self = Health {
                up: false,
                streak: 0,
            };
            return Some(Transition::WentDown);
        }
        None
    }

    /// Forces a state (operator command, or the sim's `UP`/`DOWN`).
    pub fn force(&mut self, up: bool) -> Option<Transition> {
        let was = self.up;
        *self = Health { up, streak: 0 };
        match (was, up) {
            (true, false) => Some(Transition::WentDown),
            (false, true) => Some(Transition::WentUp),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn falls_after_fall_failures_and_rises_after_rise_successes() {
        let p = HealthPolicy::default();
        let mut h = Health::default();
        assert_eq!(h.record_failure(p), None);
        assert_eq!(h.record_failure(p), None);
        assert_eq!(h.record_failure(p), Some(Transition::WentDown));
        assert!(!h.is_up());
        assert_eq!(h.record_failure(p), None);
        assert_eq!(h.record_success(p), None);
        assert_eq!(h.record_success(p), Some(Transition::WentUp));
        assert!(h.is_up());
    }

    #[test]
    fn a_success_resets_the_failure_streak() {
        let p = HealthPolicy::default();
        let mut h = Health::default();
        h.record_failure(p);
        h.record_failure(p);
        h.record_success(p);
        assert_eq!(h.record_failure(p), None);
        assert_eq!(h.record_failure(p), None);
        assert_eq!(h.record_failure(p), Some(Transition::WentDown));
    }

    #[test]
    fn force_reports_flips_only() {
        let mut h = Health::default();
        assert_eq!(h.force(true), None);
        assert_eq!(h.force(false), Some(Transition::WentDown));
        assert_eq!(h.force(false), None);
        assert_eq!(h.force(true), Some(Transition::WentUp));
    }
}
