//! Which cookie names belong to the balancer.

use std::fmt;
use std::str::FromStr;

use crate::set_cookie::is_tchar;

/// One balancer cookie-name pattern. Names are case-sensitive (`Route` is not `route`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum NamePattern {
    /// Exactly this name, e.g. `route`.
    Exact(String),
    /// Every name beginning with this, the prefix itself included, e.g. `AWSALB` for
    /// `AWSALB`, `AWSALBCORS`, `AWSALBTG`, `AWSALBAPP-0`...
    Prefix(String),
}

/// Why a pattern was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PatternError {
    /// Empty name or prefix: a pattern that matches every name would keep the application's
    /// cookies too, which the jar must never do.
    Empty,
    /// The name holds a character that cannot be in a cookie name.
    NotAToken(String),
}

impl fmt::Display for PatternError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => f.write_str("empty cookie-name pattern"),
            Self::NotAToken(s) => write!(f, "{s:?} is not a valid cookie name"),
        }
    }
}

impl std::error::Error for PatternError {}

impl NamePattern {
    /// An exact name; refused if empty or not a token.
    pub fn exact(name: impl Into<String>) -> Result<Self, PatternError> {
        validate(name.into()).map(Self::Exact)
    }

    /// A prefix; refused if empty or not a token.
    pub fn prefix(prefix: impl Into<String>) -> Result<Self, PatternError> {
        validate(prefix.into()).map(Self::Prefix)
    }

    /// Whether `name` matches.
    pub fn matches(&self, name: &str) -> bool {
        match self {
            Self::Exact(n) => name == n,
            Self::Prefix(p) => name.starts_with(p.as_str()),
        }
    }
}

fn validate(s: String) -> Result<String, PatternError> {
    if s.is_empty() {
        Err(PatternError::Empty)
    } else if !s.bytes().all(is_tchar) {
        Err(PatternError::NotAToken(s))
    } else {
        Ok(s)
    }
}

/// Configuration syntax: `route` is exact, `AWSALB*` is a prefix (a trailing `*` only).
impl FromStr for NamePattern {
    type Err = PatternError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.strip_suffix('*') {
            Some(prefix) => Self::prefix(prefix),
            None => Self::exact(s),
        }
    }
}

impl fmt::Display for NamePattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Exact(n) => f.write_str(n),
            Self::Prefix(p) => write!(f, "{p}*"),
        }
    }
}

/// The set of balancer cookie-name patterns a jar keeps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CookieNames {
    patterns: Vec<NamePattern>,
}

impl CookieNames {
    /// limpet's own cookie name.
    pub const LIMPET: &'static str = "route";
    /// limpet's home cookie (`failback = "home"`): the node a moved session goes back to.
    /// Dropped, the session never goes home.
    pub const LIMPET_HOME: &'static str = "route-home";
    /// The prefix of every AWS Application Load Balancer stickiness cookie.
    pub const AWS_ALB_PREFIX: &'static str = "AWSALB";
    /// The stickiness cookie of the AWS Classic Load Balancer (ELB) with duration-based
    /// stickiness; not of the `AWSALB` family, so it needs its own name.
    pub const AWS_CLASSIC_ELB: &'static str = "AWSELB";
    /// The name HAProxy configurations conventionally use (`cookie SERVERID insert`).
    pub const HAPROXY: &'static str = "SERVERID";

    /// Exactly these patterns (possibly none, which makes a jar that keeps nothing).
    pub fn new(patterns: impl IntoIterator<Item = NamePattern>) -> Self {
        CookieNames {
            patterns: patterns.into_iter().collect(),
        }
    }

    /// Adds one pattern.
    pub fn with(mut self, pattern: NamePattern) -> Self {
        self.patterns.push(pattern);
        self
    }

    /// Whether `name` belongs to the balancer.
    pub fn matches(&self, name: &str) -> bool {
        self.patterns.iter().any(|p| p.matches(name))
    }

    /// The configured patterns, in order.
    pub fn patterns(&self) -> &[NamePattern] {
        &self.patterns
    }
}

/// `route` and `route-home` (limpet), `AWSALB*` (AWS ALB), `AWSELB` (AWS Classic ELB),
/// `SERVERID` (HAProxy).
impl Default for CookieNames {
    fn default() -> Self {
        CookieNames::new([
            NamePattern::Exact(Self::LIMPET.to_owned()),
            NamePattern::Exact(Self::LIMPET_HOME.to_owned()),
            NamePattern::Prefix(Self::AWS_ALB_PREFIX.to_owned()),
            NamePattern::Exact(Self::AWS_CLASSIC_ELB.to_owned()),
            NamePattern::Exact(Self::HAPROXY.to_owned()),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        let names = CookieNames::default();
        for yes in [
            "route",
            "route-home",
            "SERVERID",
            "AWSALB",
            "AWSALBCORS",
            "AWSALBTG",
            "AWSALBTGCORS",
            "AWSALBAPP-0",
            "AWSELB",
        ] {
            assert!(names.matches(yes), "{yes}");
        }
        for no in [
            "Route",
            "xroute",
            "route2",
            "route-",
            "route-homes",
            "AWSAL",
            "awsalb",
            "serverid",
            "session",
            "",
            "awselb",
            "AWSELBX",
        ] {
            assert!(!names.matches(no), "{no}");
        }
    }

    #[test]
    fn config_syntax() {
        assert_eq!("AWSALB*".parse(), NamePattern::prefix("AWSALB"));
        assert_eq!("route".parse(), NamePattern::exact("route"));
        assert_eq!("*".parse::<NamePattern>(), Err(PatternError::Empty));
        assert!(matches!(
            "ro ute".parse::<NamePattern>(),
            Err(PatternError::NotAToken(_))
        ));
        let p: NamePattern = "lb_*".parse().expect("valid");
        assert_eq!(p.to_string(), "lb_*");
    }
}
