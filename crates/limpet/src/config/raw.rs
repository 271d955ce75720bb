//! The config file as written: serde types that mirror the TOML one to one. Every table
//! denies unknown keys. Values that parse on their own (durations, enums) are parsed here, so
//! their errors carry the deserializer's position; everything that needs context (names that
//! refer to each other, files to read) is left to `validate`, with `Spanned` positions.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Deserializer};
use toml::Spanned;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawConfig {
    #[serde(default)]
    pub(crate) nodes: Vec<RawNode>,
    #[serde(default)]
    pub(crate) tables: Vec<RawTable>,
    #[serde(default)]
    pub(crate) listeners: Vec<RawListener>,
    pub(crate) health: Option<RawHealth>,
    pub(crate) admin: Option<RawAdmin>,
    pub(crate) drain: Option<RawDrain>,
    pub(crate) store: Option<RawStore>,
}

/// `[store]`: the Redis or Valkey server that tables marked `shared` go through
/// (docs/fleet.md).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawStore {
    pub(crate) url: Spanned<String>,
    pub(crate) prefix: Option<Spanned<String>>,
    pub(crate) timeout: Option<Spanned<Dur>>,
    pub(crate) connect_timeout: Option<Spanned<Dur>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHealth {
    pub(crate) fall: Option<Spanned<u32>>,
    pub(crate) rise: Option<Spanned<u32>>,
    /// Without active checks: how long a node DOWN by traffic failures waits for its trial.
    pub(crate) fail_timeout: Option<Spanned<Dur>>,
    /// Requests outlasting the answer timeout while the node answers others that take the
    /// node DOWN within one `fail_timeout` (0: never).
    pub(crate) max_slow_answers: Option<Spanned<u32>>,
    /// Active checks (node lifecycle): time between checks, per-check timeout, jitter.
    pub(crate) interval: Option<Spanned<Dur>>,
    pub(crate) timeout: Option<Spanned<Dur>>,
    pub(crate) jitter: Option<Spanned<Dur>>,
}

/// `[admin]`: the admin API listener (docs/admin.md).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAdmin {
    pub(crate) listen: Option<Spanned<String>>,
    pub(crate) token: Option<Spanned<String>>,
    pub(crate) hosts: Option<Vec<Spanned<String>>>,
    pub(crate) state_file: Option<Spanned<String>>,
}

/// `[drain]`: drain defaults (docs/operations.md).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDrain {
    pub(crate) spread: Option<Spanned<Dur>>,
    pub(crate) idle: Option<Spanned<Dur>>,
    pub(crate) seen_window: Option<Spanned<Dur>>,
}

/// A listener's active check of every node (`check = { kind = "http", path = "/health" }`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCheck {
    pub(crate) kind: Spanned<String>,
    pub(crate) port: Option<Spanned<u16>>,
    pub(crate) path: Option<Spanned<String>>,
    pub(crate) method: Option<Spanned<String>>,
    pub(crate) host: Option<Spanned<String>>,
    pub(crate) expect: Option<Spanned<String>>,
    pub(crate) verify: Option<Spanned<String>>,
    pub(crate) server_name: Option<Spanned<String>>,
    /// An `http` check over TLS or plain (HAProxy's `check-ssl` / `no-check-ssl`); unset:
    /// over TLS exactly where the listener's own connections to the node are.
    pub(crate) tls: Option<Spanned<bool>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawNode {
    pub(crate) name: Spanned<String>,
    pub(crate) address: Spanned<String>,
    pub(crate) weight: Option<Spanned<u32>>,
    /// The port active checks of this node probe (HAProxy's `check port`).
    pub(crate) check_port: Option<Spanned<u16>>,
    /// Connections open to the node at once, over every listener (HAProxy's `maxconn`).
    pub(crate) max_connections: Option<Spanned<Size>>,
    /// Requests or sessions that may wait for one of them (HAProxy's `maxqueue`).
    pub(crate) max_queue: Option<Spanned<Size>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTable {
    pub(crate) name: Spanned<String>,
    /// `"source-ip"`; or use `header` / `app_cookie` instead.
    pub(crate) key: Option<Spanned<String>>,
    pub(crate) header: Option<Spanned<String>>,
    pub(crate) app_cookie: Option<Spanned<String>>,
    /// A session id the node sets in this response header (e.g. `Mcp-Session-Id`), sent
    /// back by the client in the same request header.
    pub(crate) learn_header: Option<Spanned<String>>,
    pub(crate) ipv4_prefix: Option<Spanned<u8>>,
    pub(crate) ipv6_prefix: Option<Spanned<u8>>,
    pub(crate) expire: Option<Spanned<Dur>>,
    pub(crate) size: Option<Spanned<Size>>,
    pub(crate) snapshot: Option<Spanned<String>>,
    pub(crate) snapshot_interval: Option<Spanned<Dur>>,
    /// Share the table's pins with the other instances through `[store]` (fleet mode).
    pub(crate) shared: Option<Spanned<bool>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum RawMode {
    Http,
    Tcp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub(crate) enum RawBalance {
    #[serde(rename = "round-robin")]
    RoundRobin,
    #[serde(rename = "leastconn")]
    LeastConn,
}

/// One address or a list of them.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

// Tables inside `[[listeners]]` are not wrapped in `Spanned` (toml 0.8 cannot span a table
// under an array of tables); errors about a whole sub-table point at the listener's name, and
// every value inside one that validation can refuse is `Spanned`, so errors about it point at
// its own line.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawListener {
    pub(crate) name: Spanned<String>,
    pub(crate) bind: Spanned<OneOrMany>,
    pub(crate) mode: Option<Spanned<RawMode>>,
    pub(crate) node_port: Spanned<RawNodePort>,
    pub(crate) balance: Option<RawBalance>,
    pub(crate) table: Option<Spanned<String>>,
    pub(crate) cookie: Option<RawCookie>,
    pub(crate) tls: Option<RawTls>,
    pub(crate) upstream_tls: Option<RawUpstreamTls>,
    pub(crate) proxy_protocol: Option<RawProxyProtocol>,
    pub(crate) timeouts: Option<RawTimeouts>,
    pub(crate) close_on_node_down: Option<Spanned<bool>>,
    pub(crate) trusted_proxies: Option<Vec<Spanned<String>>>,
    pub(crate) max_connections: Option<Spanned<Size>>,
    /// Concurrent HTTP/2 streams per client connection.
    pub(crate) h2_max_concurrent_streams: Option<Spanned<Size>>,
    pub(crate) check: Option<RawCheck>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCookie {
    pub(crate) enabled: Option<bool>,
    pub(crate) name: Option<Spanned<String>>,
    /// Checked at load: it goes into every `Set-Cookie` value as written.
    pub(crate) path: Option<Spanned<String>>,
    pub(crate) domain: Option<Spanned<String>>,
    pub(crate) max_age: Option<Spanned<Dur>>,
    pub(crate) http_only: Option<bool>,
    pub(crate) secure: Option<RawSecure>,
    pub(crate) same_site: Option<RawSameSite>,
    pub(crate) keep_in_request: Option<bool>,
    /// `"none"` (default) or `"home"`: sessions moved off a failed node go back when it is UP.
    pub(crate) failback: Option<RawFailback>,
    pub(crate) mode: Option<RawCookieMode>,
    pub(crate) keys: Option<Spanned<Vec<String>>>,
    pub(crate) max_idle: Option<Spanned<Dur>>,
    pub(crate) max_lifetime: Option<Spanned<Dur>>,
}

/// `secure`: `true` (always), `false` (over TLS: the default, as it always read) or
/// `"never"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RawSecure {
    Bool(bool),
    Never,
}

impl<'de> Deserialize<'de> for RawSecure {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = RawSecure;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("true, false or \"never\"")
            }
            fn visit_bool<E: serde::de::Error>(self, b: bool) -> Result<RawSecure, E> {
                Ok(RawSecure::Bool(b))
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<RawSecure, E> {
                if s == "never" {
                    Ok(RawSecure::Never)
                } else {
                    Err(E::invalid_value(serde::de::Unexpected::Str(s), &self))
                }
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum RawSameSite {
    Lax,
    Strict,
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum RawFailback {
    None,
    Home,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum RawCookieMode {
    Name,
    Signed,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTls {
    /// Shorthand for one default certificate.
    pub(crate) cert: Option<Spanned<String>>,
    pub(crate) key: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) certs: Vec<RawCert>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCert {
    pub(crate) cert: Spanned<String>,
    pub(crate) key: Spanned<String>,
    /// SNI names this certificate answers; none makes it the default.
    #[serde(default)]
    pub(crate) names: Vec<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawUpstreamTls {
    pub(crate) ca: Option<Spanned<String>>,
    pub(crate) verify: Option<Spanned<String>>,
    pub(crate) server_name: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawProxyProtocol {
    #[serde(default)]
    pub(crate) accept_from: Vec<Spanned<String>>,
    pub(crate) send: Option<Spanned<RawPpVersion>>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum RawPpVersion {
    V1,
    V2,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTimeouts {
    pub(crate) connect: Option<Spanned<Dur>>,
    pub(crate) idle: Option<Spanned<Dur>>,
    pub(crate) header_read: Option<Spanned<Dur>>,
    pub(crate) upstream_answer: Option<Spanned<Dur>>,
    pub(crate) client_idle: Option<Spanned<Dur>>,
    pub(crate) answer_body_idle: Option<Spanned<Dur>>,
    pub(crate) tunnel_idle: Option<Spanned<Dur>>,
    pub(crate) drain: Option<Spanned<Dur>>,
    pub(crate) proxy_header: Option<Spanned<Dur>>,
    pub(crate) queue: Option<Spanned<Dur>>,
    pub(crate) upstream_idle: Option<Spanned<Dur>>,
}

/// A duration written as a string: `"30m"`, `"5s"`, `"250ms"`, `"1h30m"`, `"2d"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Dur(pub(crate) Duration);

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Dur;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration such as \"5s\"")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Dur, E> {
                parse_duration(s).map(Dur).map_err(E::custom)
            }
            // HAProxy reads `inter 5000` as milliseconds; a bare number here would be a guess.
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<Dur, E> {
                Err(E::custom(format!(
                    "{n} has no unit: write a string such as \"{n}ms\" or \"{n}s\" (HAProxy reads bare numbers as milliseconds)"
                )))
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Dur, E> {
                self.visit_i64(i64::try_from(n).unwrap_or(i64::MAX))
            }
        }
        d.deserialize_any(V)
    }
}

/// A count or size: an integer, or a string with a `k`, `m` or `g` suffix (`"100k"`). The
/// suffixes are binary, as in HAProxy (`size 100k` there is 102400 entries), so a number
/// copied from an HAProxy configuration means the same here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Size(pub(crate) u64);

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Size;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a count such as 100000 or \"100k\"")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Size, E> {
                parse_size(s).map(Size).map_err(E::custom)
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Size, E> {
                Ok(Size(n))
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<Size, E> {
                u64::try_from(n)
                    .map(Size)
                    .map_err(|_| E::custom(format!("{n} is negative: a count is 0 or more")))
            }
        }
        d.deserialize_any(V)
    }
}

/// Parses a count: digits, then optionally `k` (x1024), `m` (x1024²) or `g` (x1024³), either
/// case, like HAProxy's sizes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let bad = || {
        format!(
            "{s:?} is not a count (write e.g. 100000, \"100k\" or \"1m\"; k = 1024 and m = 1048576, as in HAProxy)"
        )
    };
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    if digits == 0 {
        return Err(bad());
    }
    let n: u64 = t[..digits].parse().map_err(|_| bad())?;
    let factor: u64 = match &t[digits..] {
        "" => 1,
        "k" | "K" => 1 << 10,
        "m" | "M" => 1 << 20,
        "g" | "G" => 1 << 30,
        _ => return Err(bad()),
    };
    n.checked_mul(factor).ok_or_else(bad)
}

/// A listener's `node_port`: a port, or `"same"` (the port the client connected to).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RawNodePort {
    Port(u16),
    Same,
}

impl<'de> Deserialize<'de> for RawNodePort {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = RawNodePort;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a port number or \"same\"")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<RawNodePort, E> {
                match s {
                    "same" => Ok(RawNodePort::Same),
                    _ => match s.parse::<u16>() {
                        Ok(p) => Ok(RawNodePort::Port(p)),
                        Err(_) => Err(E::custom(format!(
                            "{s:?}: `node_port` is a port number, or \"same\" for the port the client connected to"
                        ))),
                    },
                }
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<RawNodePort, E> {
                u16::try_from(n)
                    .map(RawNodePort::Port)
                    .map_err(|_| E::custom(format!("{n} is not a port (0 to 65535), nor \"same\"")))
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<RawNodePort, E> {
                self.visit_i64(i64::try_from(n).unwrap_or(i64::MAX))
            }
        }
        d.deserialize_any(V)
    }
}

/// The longest duration a config takes: ten years. Longer ones are refused, not clamped: a
/// deadline that far off overflows `Instant` arithmetic (`Instant + Duration` panics) and
/// the health checks' microsecond jitter (`i64`), and no timeout needs it.
pub(crate) const MAX_DURATION: Duration = Duration::from_secs(3650 * 86_400);

/// Parses `<number><unit>` segments (`ms`, `s`, `m`, `h`, `d`), summed; at most ten years
/// (`3650d`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad =
        || format!("{s:?} is not a duration (write e.g. \"30m\", \"5s\", \"250ms\", \"1h30m\")");
    let mut rest = s.trim();
    if rest.is_empty() {
        return Err(bad());
    }
    let mut total = Duration::ZERO;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return Err(bad());
        }
        let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let ms_per: u64 = match unit {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => return Err(bad()),
        };
        let add = n.checked_mul(ms_per).ok_or_else(bad)?;
        total = total
            .checked_add(Duration::from_millis(add))
            .ok_or_else(bad)?;
    }
    if total > MAX_DURATION {
        return Err(format!(
            "{s:?} is longer than 3650d, the longest duration limpet takes"
        ));
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("30m"), Ok(Duration::from_secs(1800)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("2d"), Ok(Duration::from_secs(172_800)));
        for bad in ["", "5", "m", "5x", "-5s", "1.5s", "99999999999999999999s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_duration("3650d"), Ok(MAX_DURATION));
        // Each segment fits, the sum does not: refused, not left to overflow a deadline.
        for long in [
            "3650d1ms",
            "18446744073709551615ms",
            &"9223372036854775ms".repeat(3),
        ] {
            let e = parse_duration(long).expect_err(long);
            assert!(e.contains("longer than 3650d"), "{long}: {e}");
        }
    }

    #[test]
    fn sizes_take_binary_suffixes_like_haproxy() {
        assert_eq!(parse_size("100000"), Ok(100_000));
        assert_eq!(parse_size("100k"), Ok(102_400));
        assert_eq!(parse_size("1m"), Ok(1_048_576));
        assert_eq!(parse_size("2M"), Ok(2_097_152));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        for bad in [
            "",
            "k",
            "1.5k",
            "100 k",
            "100kb",
            "-1",
            "1kk",
            "99999999999999999999",
            "20000000000g",
        ] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }
}
