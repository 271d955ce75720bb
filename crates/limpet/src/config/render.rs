//! `limpet check`'s listing: a validated configuration written back as TOML, every default
//! spelled out, so the operator sees what would really run and can paste it back.
//!
//! Most values come from the validated [`Config`] (what runs); what validation turns into
//! something that cannot be printed (certificate files become a `rustls` config, a listener's
//! check becomes one check per node) comes from the file as parsed, with the same defaults.
//! Secrets are printed as [`REDACTED`], which validation refuses, so a listing pasted back
//! cannot run with a secret anyone who saw the listing knows.

use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use limpet_core::table::KeySpec;
use limpet_core::{Balance, SameSite};

use super::listener::{CookieMode, Failback};
use super::raw::{RawCheck, RawConfig, RawListener};
use super::validate::{check_port_of, check_timing, http_check_tls_default};
use super::{Config, ListenerDef, Mode};

/// What `limpet check` prints in place of a secret (admin token, cookie keys).
pub const REDACTED: &str = "<redacted>";

/// `writeln!` into a `String`, which cannot fail.
macro_rules! w {
    ($o:expr) => {{
        $o.push('\n');
    }};
    ($o:expr, $($t:tt)*) => {{
        let _ = writeln!($o, $($t)*);
    }};
}

/// A TOML basic string.
fn q(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A duration as the file writes it (`"1h30m"`, `"250ms"`, `"0s"`), quoted.
fn dur(d: Duration) -> String {
    let mut ms = d.as_millis();
    if ms == 0 {
        return q("0s");
    }
    let mut s = String::new();
    for (unit, per) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
        ("ms", 1),
    ] {
        if ms >= per {
            let _ = write!(s, "{}{unit}", ms / per);
            ms %= per;
        }
    }
    q(&s)
}

fn list<T: ToString>(items: impl IntoIterator<Item = T>) -> String {
    let v: Vec<String> = items.into_iter().map(|i| q(&i.to_string())).collect();
    format!("[{}]", v.join(", "))
}

/// A file named in the config, as validation resolved it (relative to the config's
/// directory), made absolute so the listing means the same file wherever it is saved.
fn file(dir: &Path, p: &str) -> String {
    let p = Path::new(p);
    let joined: PathBuf = if p.is_absolute() {
        p.to_owned()
    } else {
        dir.join(p)
    };
    abs(&joined)
}

fn abs(p: &Path) -> String {
    q(&std::path::absolute(p)
        .unwrap_or_else(|_| p.to_owned())
        .to_string_lossy())
}

pub(super) fn render(cfg: &Config, raw: &RawConfig, dir: &Path) -> String {
    let mut o = String::new();
    w!(
        o,
        "# The configuration as limpet runs it: every default written out, file paths"
    );
    w!(
        o,
        "# absolute. `limpet check` accepts it as it is, except where a secret shows as"
    );
    w!(o, "# {}: put the real value back there first.", q(REDACTED));
    w!(o);
    let (interval, timeout, jitter) = check_timing(raw.health.as_ref());
    w!(o, "[health]");
    w!(o, "fall = {}", cfg.health.fall);
    w!(o, "rise = {}", cfg.health.rise);
    w!(
        o,
        "fail_timeout = {}",
        dur(Duration::from_millis(cfg.health.fail_timeout_ms))
    );
    w!(o, "max_slow_answers = {}", cfg.health.max_slow_answers);
    w!(o, "interval = {}", dur(interval));
    w!(o, "timeout = {}", dur(timeout));
    w!(o, "jitter = {}", dur(jitter));
    w!(o);
    let life = &cfg.lifecycle;
    w!(o, "[drain]");
    w!(o, "spread = {}", dur(life.drain_spread));
    w!(o, "idle = {}", dur(life.drain_idle));
    w!(o, "seen_window = {}", dur(life.seen_window));
    if let Some(a) = &life.admin {
        w!(o);
        w!(o, "[admin]");
        w!(o, "listen = {}", q(&a.listen.to_string()));
        match &a.token {
            Some(_) => w!(o, "token = {}", q(REDACTED)),
            None => w!(
                o,
                "# no token: writes are accepted from anyone who can reach {}",
                a.listen
            ),
        }
        if !a.hosts.is_empty() {
            let names: Vec<String> = a.hosts.iter().map(|h| q(h)).collect();
            w!(o, "hosts = [{}]", names.join(", "));
        }
        match &a.state_file {
            // Absolute, as every other path of the listing: relative to a config given by a
            // relative path, it named another file once the listing was saved elsewhere.
            Some(p) => w!(o, "state_file = {}", abs(p)),
            None => w!(
                o,
                "# no state_file: node states set through the admin API last until a restart"
            ),
        }
    }
    if let Some(st) = &cfg.store {
        w!(o);
        w!(o, "[store]");
        w!(o, "url = {}", q(&st.redacted_url()));
        w!(o, "prefix = {}", q(&st.prefix));
        w!(o, "timeout = {}", dur(st.timeout));
        w!(o, "connect_timeout = {}", dur(st.connect_timeout));
    }
    for (i, n) in cfg.nodes.iter().enumerate() {
        let r = raw.nodes.get(i);
        w!(o);
        w!(o, "[[nodes]]");
        w!(o, "name = {}", q(&n.name));
        // A host name stays a name (it is resolved at every start, and the listing must
        // read back the same); what it resolved to now is a comment.
        let written = r.map_or("", |r| r.address.get_ref().trim());
        if written.parse::<IpAddr>().is_ok() || written.is_empty() {
            w!(o, "address = {}", q(&n.addr.to_string()));
        } else {
            w!(o, "address = {}  # {} now", q(written), n.addr);
        }
        w!(o, "weight = {}", n.weight);
        if let Some(p) = r.and_then(|r| r.check_port.as_ref()) {
            w!(o, "check_port = {}", p.get_ref());
        }
        if let Some(m) = n.max_connections {
            w!(o, "max_connections = {m}");
            w!(o, "max_queue = {}", n.max_queue);
        }
    }
    for t in &cfg.tables {
        w!(o);
        w!(o, "[[tables]]");
        w!(o, "name = {}", q(&t.name));
        match &t.key {
            KeySpec::SourceIp(p) => {
                w!(o, "key = \"source-ip\"");
                w!(o, "ipv4_prefix = {}", p.v4());
                w!(o, "ipv6_prefix = {}", p.v6());
            }
            KeySpec::Header(h) => w!(o, "header = {}", q(h)),
            KeySpec::AppCookie(c) => w!(o, "app_cookie = {}", q(c)),
            KeySpec::LearnHeader(h) => w!(o, "learn_header = {}", q(h)),
        }
        w!(o, "expire = {}", dur(t.expire));
        w!(o, "size = {}", t.size);
        if t.shared {
            w!(o, "shared = true");
        }
        match &t.snapshot {
            Some(s) => {
                w!(o, "snapshot = {}", abs(&s.path));
                match s.interval {
                    Some(iv) => w!(o, "snapshot_interval = {}", dur(iv)),
                    None => w!(o, "# no snapshot_interval: saved on shutdown only"),
                }
            }
            None => w!(o, "# no snapshot: the table starts empty on every start"),
        }
    }
    let check_ports: Vec<Option<u16>> = raw
        .nodes
        .iter()
        .map(|n| n.check_port.as_ref().map(|p| *p.get_ref()))
        .collect();
    for (l, r) in cfg.listeners.iter().zip(&raw.listeners) {
        listener(&mut o, l, r, dir, &check_ports);
    }
    o
}

/// One listener; `check_ports` are the nodes' `check_port`s, in order.
fn listener(
    o: &mut String,
    l: &ListenerDef,
    r: &RawListener,
    dir: &Path,
    check_ports: &[Option<u16>],
) {
    let http = l.mode == Mode::Http;
    w!(o);
    w!(o, "[[listeners]]");
    w!(o, "name = {}", q(&l.name));
    w!(o, "bind = {}", list(&l.bind));
    w!(o, "mode = {}", q(if http { "http" } else { "tcp" }));
    if l.upstreams.is_same_port() {
        w!(o, "node_port = \"same\"");
    } else {
        w!(o, "node_port = {}", l.node_port);
    }
    let balance = match l.balance {
        Balance::RoundRobin => "round-robin",
        Balance::LeastConn => "leastconn",
    };
    w!(o, "balance = {}", q(balance));
    if let Some(t) = &l.table {
        w!(o, "table = {}", q(t));
    }
    w!(o, "close_on_node_down = {}", l.tcp.close_on_node_down);
    if http || !l.trusted_proxies.is_empty() {
        w!(o, "trusted_proxies = {}", list(&l.trusted_proxies));
    }
    w!(o, "max_connections = {}", l.limits.max_client_connections);
    if http {
        w!(
            o,
            "h2_max_concurrent_streams = {}",
            l.limits.h2_max_concurrent_streams
        );
    }
    if let Some(c) = &r.check {
        check(o, c, l, check_ports);
    }
    if http {
        cookie(o, l);
    }
    if let Some(t) = &r.tls {
        w!(o);
        w!(o, "[listeners.tls]");
        if let (Some(c), Some(k)) = (&t.cert, &t.key) {
            w!(o, "cert = {}", file(dir, c.get_ref()));
            w!(o, "key = {}", file(dir, k.get_ref()));
        }
        for c in &t.certs {
            w!(o);
            w!(o, "[[listeners.tls.certs]]");
            w!(o, "cert = {}", file(dir, c.cert.get_ref()));
            w!(o, "key = {}", file(dir, c.key.get_ref()));
            if !c.names.is_empty() {
                w!(o, "names = {}", list(c.names.iter().map(|n| n.get_ref())));
            }
        }
    }
    if let Some(u) = &r.upstream_tls {
        w!(o);
        w!(o, "[listeners.upstream_tls]");
        match &u.ca {
            Some(ca) => w!(o, "ca = {}", file(dir, ca.get_ref())),
            None => w!(o, "verify = \"none\""),
        }
        match l
            .upstream_tls
            .as_ref()
            .and_then(|u| u.server_name.as_deref())
        {
            Some(n) => w!(o, "server_name = {}", q(n)),
            None if u.ca.is_some() => w!(
                o,
                "# no server_name: each node's IP address is verified (an IP SAN; no SNI is sent)"
            ),
            None => w!(o, "# no server_name, nothing verified"),
        }
    }
    let pp = &l.proxy_protocol;
    w!(o);
    w!(o, "[listeners.proxy_protocol]");
    w!(o, "accept_from = {}", list(&pp.accept_from));
    match pp.send {
        Some(limpet_core::proxy_protocol::Version::V1) => w!(o, "send = \"v1\""),
        Some(limpet_core::proxy_protocol::Version::V2) => w!(o, "send = \"v2\""),
        None if !http => w!(o, "# no send: nodes get no PROXY header"),
        // HTTP listeners cannot send one (their node connections are shared).
        None => {}
    }
    let t = &l.timeouts;
    w!(o);
    w!(o, "[listeners.timeouts]");
    w!(o, "connect = {}", dur(t.connect));
    w!(
        o,
        "idle = {}",
        dur(if http { t.keep_alive_idle } else { l.tcp.idle })
    );
    w!(o, "header_read = {}", dur(t.header_read));
    if http {
        w!(o, "upstream_answer = {}", dur(t.upstream_answer));
        w!(o, "client_idle = {}", dur(t.client_idle));
        w!(o, "answer_body_idle = {}", dur(t.answer_body_idle));
        w!(o, "tunnel_idle = {}", dur(t.tunnel_idle));
        w!(o, "upstream_idle = {}", dur(t.upstream_idle));
    }
    w!(o, "drain = {}", dur(t.drain));
    w!(o, "proxy_header = {}", dur(pp.header_timeout));
    w!(o, "queue = {}", dur(t.queue));
}

/// An optional string of the file, as written.
fn text(v: &Option<toml::Spanned<String>>) -> Option<&str> {
    v.as_ref().map(|v| v.get_ref().as_str())
}

/// A listener's check, on one line (an inline table), its defaults filled in; what differs
/// per node (the port, whether an `http` check runs over TLS) as a comment after it.
fn check(o: &mut String, c: &RawCheck, l: &ListenerDef, check_ports: &[Option<u16>]) {
    let kind = c.kind.get_ref();
    let port = c.port.as_ref().map(|p| *p.get_ref());
    let mut parts = vec![format!("kind = {}", q(kind))];
    let mut per_node = Vec::new();
    if let Some(p) = port {
        parts.push(format!("port = {p}"));
    }
    if kind == "http" {
        parts.push(format!("path = {}", q(text(&c.path).unwrap_or("/"))));
        parts.push(format!("method = {}", q(text(&c.method).unwrap_or("GET"))));
        if let Some(h) = text(&c.host) {
            parts.push(format!("host = {}", q(h)));
        }
        let expect = text(&c.expect)
            .and_then(|e| e.parse::<crate::health::StatusRange>().ok())
            .unwrap_or_default();
        parts.push(format!("expect = {}", q(&expect.to_string())));
        // Unset, over TLS or not by the port each node's check probes (validation's rule).
        // Written out where it is a choice: set, or on a listener with TLS to its nodes
        // (elsewhere always plain, and the line kept short enough for a reload's report).
        let over_tls = c.tls.as_ref().map(|t| *t.get_ref());
        let mut defaults = check_ports
            .iter()
            .filter_map(|&p| check_port_of(p, port, l))
            .map(|p| http_check_tls_default(l, p));
        let first = defaults.next().unwrap_or(false);
        match over_tls {
            Some(t) => parts.push(format!("tls = {t}")),
            None if l.upstream_tls.is_none() => {}
            None if defaults.all(|d| d == first) => parts.push(format!("tls = {first}")),
            None => per_node.push("tls: over TLS at the node port, plain at another".to_owned()),
        }
    }
    // A tcp check ignores them (validation says so): the listing leaves them out.
    if kind != "tcp" {
        if let Some(v) = text(&c.verify) {
            parts.push(format!("verify = {}", q(v)));
        }
        if let Some(n) = text(&c.server_name) {
            parts.push(format!("server_name = {}", q(n)));
        }
    }
    match (port, l.upstreams.is_same_port()) {
        (Some(_), _) => {}
        (None, false) => per_node.insert(
            0,
            format!("port: a node's check_port, else {}", l.node_port),
        ),
        (None, true) => per_node.insert(0, "port: each node's check_port".to_owned()),
    }
    let comment = if per_node.is_empty() {
        String::new()
    } else {
        format!("  # {}", per_node.join("; "))
    };
    w!(o, "check = {{ {} }}{comment}", parts.join(", "));
}

fn cookie(o: &mut String, l: &ListenerDef) {
    w!(o);
    w!(o, "[listeners.cookie]");
    let Some(c) = &l.cookie else {
        w!(o, "enabled = false");
        return;
    };
    let s = &c.spec;
    w!(o, "enabled = true");
    w!(o, "name = {}", q(&s.name));
    if let Some(p) = &s.path {
        w!(o, "path = {}", q(p));
    }
    match &s.domain {
        Some(d) => w!(o, "domain = {}", q(d)),
        None => w!(
            o,
            "# no domain: the cookie goes back to the host that set it"
        ),
    }
    match s.max_age {
        Some(m) => w!(o, "max_age = {}", dur(Duration::from_secs(m))),
        None => w!(o, "# no max_age: a session cookie"),
    }
    w!(o, "http_only = {}", s.http_only);
    match s.secure {
        limpet_core::Secure::OverTls => w!(o, "secure = false"),
        limpet_core::Secure::Always => w!(o, "secure = true"),
        limpet_core::Secure::Never => w!(o, "secure = \"never\""),
    }
    if let Some(ss) = s.same_site {
        let v = match ss {
            SameSite::Lax => "lax",
            SameSite::Strict => "strict",
            SameSite::None => "none",
        };
        w!(o, "same_site = {}", q(v));
    }
    w!(o, "keep_in_request = {}", c.keep_in_request);
    let failback = match c.failback {
        Failback::None => "none",
        Failback::Home => "home",
    };
    w!(o, "failback = {}", q(failback));
    match &c.mode {
        CookieMode::Name => w!(o, "mode = \"name\""),
        CookieMode::Signed {
            keys,
            max_idle,
            max_lifetime,
        } => {
            w!(o, "mode = \"signed\"");
            w!(o, "keys = {}", list(keys.iter().map(|_| REDACTED)));
            w!(o, "max_idle = {}", dur(*max_idle));
            w!(o, "max_lifetime = {}", dur(*max_lifetime));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_print_as_the_parser_reads_them() {
        for (d, s) in [
            (Duration::ZERO, "\"0s\""),
            (Duration::from_millis(250), "\"250ms\""),
            (Duration::from_secs(1800), "\"30m\""),
            (Duration::from_secs(5400), "\"1h30m\""),
            (Duration::from_millis(90_500), "\"1m30s500ms\""),
            (Duration::from_secs(172_800), "\"2d\""),
        ] {
            assert_eq!(dur(d), s);
            let back = super::super::parse_duration(s.trim_matches('"'));
            assert_eq!(back, Ok(d), "{s}");
        }
    }

    #[test]
    fn strings_are_escaped() {
        assert_eq!(q("a\"b\\c\n"), "\"a\\\"b\\\\c\\n\"");
        let v: toml::Value =
            toml::from_str(&format!("x = {}", q("t\u{1}é\"\\"))).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(v.get("x").and_then(|x| x.as_str()), Some("t\u{1}é\"\\"));
    }
}
