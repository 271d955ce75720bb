//! Raw (as written) to validated (as run). Each check names the key it is about; positions
//! come from `Spanned` fields. Files (certificates, CA bundles) are read here, so `limpet
//! check` catches a bad path or a mismatched key before anything binds.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use limpet_core::proxy_protocol;
use limpet_core::table::{IpPrefix, KeySpec, TableConfig};
use limpet_core::{Balance, CookieSpec, HealthPolicy, Pool, SameSite};
use toml::Spanned;

use super::error::{closest, ConfigError, Places, Source};
use super::listener::{CookieConfig, CookieMode, Failback, IpNet, Limits, Timeouts};
use super::raw::*;
use super::{
    Config, ListenerDef, Mode, NodeDef, ProxyProtocolDef, SnapshotDef, StoreDef, TableDef, TcpDef,
    UpstreamTls, Upstreams,
};
use crate::tls::{self, CertSpec, TlsPart, UpstreamVerify};

/// The validated configuration, and the file as parsed (which `limpet check` writes back
/// with what validation resolved).
pub(super) fn validate(path: &Path, text: &str) -> Result<(Config, RawConfig), ConfigError> {
    let src = Source { file: path, text };
    let raw: RawConfig = toml::from_str(text).map_err(|e| src.toml_error(&e))?;
    let v = Validator {
        src,
        dir: path.parent().map(Path::to_owned).unwrap_or_default(),
    };
    let cfg = v.config(&raw)?;
    Ok((cfg, raw))
}

/// Shortest signed-cookie key a config file may hold (docs/config.md).
const MIN_COOKIE_KEY_BYTES: usize = 32;

/// Active check timing, defaults applied: `(interval, timeout, jitter)`. HAProxy's `inter`
/// default of 2 s; a check may take one interval; jitter a tenth of it.
pub(super) fn check_timing(h: Option<&RawHealth>) -> (Duration, Duration, Duration) {
    let get = |d: Option<&Spanned<Dur>>| d.map(|v| v.get_ref().0);
    let interval = h
        .and_then(|h| get(h.interval.as_ref()))
        .unwrap_or(Duration::from_secs(2));
    let timeout = h.and_then(|h| get(h.timeout.as_ref())).unwrap_or(interval);
    let jitter = h
        .and_then(|h| get(h.jitter.as_ref()))
        .unwrap_or(interval / 10);
    (interval, timeout, jitter)
}

/// The port a listener's check probes on a node: the node's `check_port`, else the check's
/// `port`, else the listener's node port (none with `node_port = "same"`).
pub(super) fn check_port_of(
    node_check_port: Option<u16>,
    check_port: Option<u16>,
    l: &ListenerDef,
) -> Option<u16> {
    node_check_port
        .or(check_port)
        .or((!l.upstreams.is_same_port()).then_some(l.node_port))
}

/// The PROXY header a check at `port` opens with: the listener's, when it sends one to its
/// nodes and `port` is the node port it sends it to (a node that requires the header closes
/// a connection without one, and every check would fail); none at a check port, as
/// HAProxy's checks of a `send-proxy` server send none once a check `port` is set.
pub(super) fn check_proxy_default(l: &ListenerDef, port: u16) -> Option<proxy_protocol::Version> {
    l.proxy_protocol
        .send
        .filter(|_| !l.upstreams.is_same_port() && port == l.node_port)
}

/// Whether an `http` check that does not say (`tls` unset) runs over TLS at `port`: exactly
/// when the listener reaches its nodes over TLS and `port` is the node port, where that TLS
/// is. HAProxy's `server ... ssl check` likewise checks over TLS unless a check `port` is set
/// (then plain unless `check-ssl`); a check port here that is the node port by number is the
/// node port, since plain HTTP there can never pass.
pub(super) fn http_check_tls_default(l: &ListenerDef, port: u16) -> bool {
    l.upstream_tls.is_some() && !l.upstreams.is_same_port() && port == l.node_port
}

/// A cookie `Path` attribute: RFC 6265's path-value (any CHAR but CTLs and `;`), starting
/// with `/` (anything else a browser replaces with the request's own directory), and without
/// a space (which cannot be told from the white space around an attribute).
fn cookie_path(p: &str) -> Result<(), String> {
    if !p.starts_with('/') {
        return Err(format!("{p:?} must start with / (e.g. \"/\" or \"/app\")"));
    }
    if p.contains(';') {
        return Err(format!(
            "{p:?} holds a \";\", which would end the path and start another cookie attribute"
        ));
    }
    if let Some(c) = p.chars().find(|c| !c.is_ascii_graphic()) {
        return Err(format!(
            "{p:?} holds {c:?}: a cookie path is visible ASCII, without spaces or control characters (percent-encode the rest)"
        ));
    }
    Ok(())
}

/// A cookie `Domain` attribute: what can stand in the attribute as written, a host name
/// (letters, digits, `-`, `_` and `.`, an optional leading `.`, which browsers ignore) or an
/// address. Only what would break the header or the attribute is refused, as HAProxy checks
/// nothing: a `;`, a `,`, white space, control or non-ASCII characters, or no host at all.
fn cookie_domain(d: &str) -> Result<(), String> {
    let host = d.strip_prefix('.').unwrap_or(d);
    if host.is_empty() {
        return Err(format!(
            "{d:?} names no host: give one (e.g. \"example.com\"), or leave `domain` out for the cookie to go back to the host that set it"
        ));
    }
    if let Some(c) = host
        .chars()
        .find(|&c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | ':' | '[' | ']')))
    {
        return Err(format!(
            "{d:?} holds {c:?}: a cookie domain is a host name or address, letters, digits, \"-\", \"_\" and \".\" (an internationalised name in its xn-- form)"
        ));
    }
    Ok(())
}

/// A listener's or table's name: it goes as it is into Prometheus label values
/// (`listener="..."`, `table="..."`; `prometheus-client` writes label values unescaped, so
/// a `"`, a `\` or a line break would break the whole scrape, not one series) and into
/// log lines (a TCP session's access line names its listener), where a control character or
/// a line separator could start a forged line. `what`: `listener` or `table`.
fn label_name(what: &str, name: &str) -> Result<(), String> {
    match name
        .chars()
        .find(|&c| c.is_control() || matches!(c, '"' | '\\' | '\u{2028}' | '\u{2029}'))
    {
        Some(c) => Err(format!(
            "{name:?} holds {c:?}: a {what} name is a metric label value and a log value: no \
             control characters, line separators, quotes (\") or backslashes (\\)"
        )),
        None => Ok(()),
    }
}

/// Refuses the placeholder `limpet check` prints for a secret, so a listing pasted back as a
/// config cannot run with a secret everyone can read.
fn not_redacted(v: &str) -> Result<(), String> {
    if v == super::REDACTED {
        Err(format!(
            "{:?} is the placeholder `limpet check` prints for a secret: put the real value back",
            super::REDACTED
        ))
    } else {
        Ok(())
    }
}

struct Validator<'a> {
    src: Source<'a>,
    dir: PathBuf,
}

/// Two paths naming one file: each made absolute (from the working directory) and its `.`
/// and `..` components folded (`./pins.snap` is `pins.snap`, `../etc/limpet.toml` from
/// `/etc` is `/etc/limpet.toml`, an absolute path is its relative one). Links are not
/// followed.
fn same_path(a: &Path, b: &Path) -> bool {
    fn normal(p: &Path) -> PathBuf {
        use std::path::Component;
        let abs = std::path::absolute(p).unwrap_or_else(|_| p.to_owned());
        let mut out = PathBuf::new();
        for c in abs.components() {
            match c {
                Component::CurDir => {}
                Component::ParentDir => {
                    out.pop();
                }
                other => out.push(other),
            }
        }
        out
    }
    normal(a) == normal(b)
}

fn span<T>(s: &Spanned<T>) -> Option<std::ops::Range<usize>> {
    Some(s.span())
}

impl Validator<'_> {
    fn err<T>(
        &self,
        at: &Spanned<T>,
        key: impl Into<String>,
        msg: impl Into<String>,
    ) -> ConfigError {
        self.src.error(span(at), key, msg)
    }

    fn err_nowhere(&self, key: impl Into<String>, msg: impl Into<String>) -> ConfigError {
        self.src.error(None, key, msg)
    }

    /// A file path from the config, relative to the config file's directory.
    fn file(&self, p: &str) -> PathBuf {
        let p = Path::new(p);
        if p.is_absolute() {
            p.to_owned()
        } else {
            self.dir.join(p)
        }
    }

    fn config(&self, raw: &RawConfig) -> Result<Config, ConfigError> {
        let mut health = HealthPolicy::default();
        if let Some(h) = &raw.health {
            for (v, key, slot) in [
                (&h.fall, "health.fall", &mut health.fall),
                (&h.rise, "health.rise", &mut health.rise),
            ] {
                if let Some(v) = v {
                    // Each check counts its failures and passes in a byte (limpet_core's
                    // Health); HAProxy's defaults are 3 and 2.
                    if !(1..=255).contains(v.get_ref()) {
                        return Err(self.err(v, key, "must be between 1 and 255"));
                    }
                    *slot = *v.get_ref();
                }
            }
            if let Some(v) = &h.fail_timeout {
                let d = v.get_ref().0;
                if d < Duration::from_millis(100) {
                    return Err(self.err(v, "health.fail_timeout", "must be at least 100 ms"));
                }
                health.fail_timeout_ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
            }
            if let Some(v) = &h.max_slow_answers {
                health.max_slow_answers = *v.get_ref();
            }
        }
        let nodes = self.nodes(&raw.nodes)?;
        let store = raw.store.as_ref().map(|s| self.store(s)).transpose()?;
        let tables = self.tables(&raw.tables)?;
        if store.is_none() {
            if let Some((t, at)) = raw
                .tables
                .iter()
                .enumerate()
                .find_map(|(i, t)| t.shared.as_ref().filter(|s| *s.get_ref()).map(|s| (i, s)))
            {
                return Err(self.err(
                    at,
                    format!("tables[{t}].shared"),
                    "a shared table needs a [store] (url = \"redis://host:6379/0\")",
                ));
            }
        }
        let mut listeners = Vec::new();
        for (i, l) in raw.listeners.iter().enumerate() {
            let key = format!("listeners[{i}]");
            if let Some(prev) = raw.listeners[..i]
                .iter()
                .position(|p| p.name.get_ref() == l.name.get_ref())
            {
                return Err(self.err(
                    &l.name,
                    format!("{key}.name"),
                    format!("duplicate listener name (listeners[{prev}] has it)"),
                ));
            }
            listeners.push(self.listener(&key, l, &nodes, &tables)?);
        }
        if listeners.is_empty() {
            return Err(self.err_nowhere("listeners", "at least one [[listeners]] is needed"));
        }
        // Two listeners on one address would fail at bind time; say so now.
        let mut seen: Vec<(SocketAddr, &str)> = Vec::new();
        for (i, (l, raw_l)) in listeners.iter().zip(&raw.listeners).enumerate() {
            // Port 0 (tests, `limpet run` on any free port) never clashes.
            for a in l.bind.iter().filter(|a| a.port() != 0) {
                if let Some((_, other)) = seen.iter().find(|(b, _)| b == a) {
                    return Err(self.err(
                        &raw_l.bind,
                        format!("listeners[{i}].bind"),
                        format!("{a} is already bound by listener {other:?}"),
                    ));
                }
                seen.push((*a, &l.name));
            }
        }
        self.warn_split_sessions(raw, &listeners, &tables);
        let lifecycle = self.lifecycle(raw, &nodes, &listeners, health, &tables)?;
        let mut places = Places::default();
        for (i, l) in raw.listeners.iter().enumerate() {
            let name = self.src.place(&l.name.span());
            places.note(format!("listeners[{i}].name"), name);
            places.note(
                format!("listeners[{i}].bind"),
                self.src.place(&l.bind.span()),
            );
            // A mode left to its default is pointed at by the listener's name.
            let mode = l.mode.as_ref().map_or(name, |m| self.src.place(&m.span()));
            places.note(format!("listeners[{i}].mode"), mode);
        }
        // The admin listener's bind error at start names its place too.
        if let Some(l) = raw.admin.as_ref().and_then(|a| a.listen.as_ref()) {
            places.note("admin.listen".to_owned(), self.src.place(&l.span()));
        }
        Ok(Config {
            path: self.src.file.to_owned(),
            nodes,
            tables,
            listeners,
            health,
            lifecycle,
            store,
            listing: String::new(),
            places,
        })
    }

    /// Every listener reaches every node (nodes are declared once), so a client machine that
    /// uses two listeners is one session only if both pin it through one source-address
    /// table: a listener with another one, or none (a cookie alone), beside one with such a
    /// table keeps its own pins, and the client's two connections may land on two nodes
    /// (HAProxy's separate stick-tables, the print server's pitfall). Not an error, as the
    /// listeners may serve unrelated clients: a warning naming the place. A listener keyed
    /// on an application's session (a cookie or header it issues) is its own kind of
    /// session and draws none.
    fn warn_split_sessions(&self, raw: &RawConfig, listeners: &[ListenerDef], tables: &[TableDef]) {
        let by_source = |name: &str| {
            tables
                .iter()
                .any(|t| t.name == name && matches!(t.key, KeySpec::SourceIp(_)))
        };
        let warn = |at, key: String, message: String| {
            tracing::warn!("{}", self.src.error(Some(at), key, message));
        };
        let Some((first, table)) = listeners
            .iter()
            .find_map(|l| l.table.as_deref().filter(|t| by_source(t)).map(|t| (l, t)))
        else {
            // No source-address table at all: a TCP listener with no table beside other
            // listeners balances each connection by itself, so a client's connections there
            // land anywhere, apart from its requests on the others (a print server's raw
            // port beside its web pages pinned by cookie: the reference's pitfall).
            let Some(other) = listeners.iter().find(|l| l.mode == Mode::Http) else {
                return;
            };
            for (i, (l, r)) in listeners.iter().zip(&raw.listeners).enumerate() {
                if l.mode == Mode::Tcp && l.table.is_none() {
                    warn(
                        r.name.span(),
                        format!("listeners[{i}].name"),
                        format!(
                            "tcp listener {:?} pins by no table: each of its connections is balanced by itself, and a client's connections there may land on other nodes than its requests on listener {:?}; name one source-ip table on both to make them one session",
                            l.name, other.name
                        ),
                    );
                }
            }
            return;
        };
        for (i, (l, r)) in listeners.iter().zip(&raw.listeners).enumerate() {
            let (at, key, how) = match (&l.table, &r.table) {
                (Some(t), _) if t == table || !by_source(t) => continue,
                (Some(t), Some(at)) => (at.span(), "table", format!("by table {t:?}")),
                _ => (r.name.span(), "name", "by no table".to_owned()),
            };
            warn(
                at,
                format!("listeners[{i}].{key}"),
                format!(
                    "listener {:?} pins {how}, listener {:?} by table {table:?}: a client using both is two sessions, which may land on two nodes; name one table on both to make them one",
                    l.name, first.name
                ),
            );
        }
        // Listeners on one source-address table key it on the address each reads for the
        // client: the PROXY header's where `proxy_protocol.accept_from` trusts its sender,
        // the socket's otherwise. Read differently (one behind an L4 balancer that sends
        // PROXY headers, one reached directly or through a proxy), one client is two keys.
        // And an HTTP listener behind an L7 proxy (`trusted_proxies`) keys on the proxy's
        // address: `X-Forwarded-For` is never a key (a client could forge it), so every
        // client through the proxy shares one pin.
        for (i, (l, r)) in listeners.iter().zip(&raw.listeners).enumerate() {
            let Some(table) = l.table.as_deref().filter(|t| by_source(t)) else {
                continue;
            };
            let first = listeners
                .iter()
                .find(|f| f.table.as_deref() == Some(table))
                .unwrap_or(l);
            if l.proxy_protocol.accept_from != first.proxy_protocol.accept_from {
                warn(
                    r.name.span(),
                    format!("listeners[{i}].name"),
                    format!(
                        "listener {:?} and listener {:?} share table {table:?} but trust PROXY headers from different senders (`proxy_protocol.accept_from`): one reads the client's address from the header, the other the connection's, so one client may be two keys, on two nodes",
                        l.name, first.name
                    ),
                );
            }
            // A listener that reads PROXY headers keys on the address they carry, the
            // client's, whatever proxies it trusts for `X-Forwarded-For`.
            if !l.trusted_proxies.is_empty() && l.proxy_protocol.accept_from.is_empty() {
                warn(
                    r.name.span(),
                    format!("listeners[{i}].trusted_proxies"),
                    format!(
                        "listener {:?} trusts proxies and pins by source-ip table {table:?}: the key is the connecting address, a proxy's for its clients (X-Forwarded-For is never a key), so all of them share one pin; have the proxy send a PROXY header (`proxy_protocol.accept_from`) or key the table on a header or cookie",
                        l.name
                    ),
                );
            }
        }
    }

    /// `[store]`: a redis:// or rediss:// url the client accepts, a prefix, timeouts.
    fn store(&self, raw: &RawStore) -> Result<StoreDef, ConfigError> {
        let u = &raw.url;
        let text = u.get_ref().trim();
        let parsed = url::Url::parse(text).map_err(|e| {
            self.err(
                u,
                "store.url",
                format!("not a url ({e}): expected \"redis://host:6379/0\""),
            )
        })?;
        if !matches!(parsed.scheme(), "redis" | "rediss") {
            return Err(self.err(
                u,
                "store.url",
                format!(
                    "scheme {:?}: expected redis:// (or rediss:// for TLS)",
                    parsed.scheme()
                ),
            ));
        }
        if parsed.host_str().is_none_or(str::is_empty) {
            return Err(self.err(u, "store.url", "no host: expected \"redis://host:6379/0\""));
        }
        let path = parsed.path().trim_start_matches('/');
        if !path.is_empty() && path.parse::<u16>().is_err() {
            return Err(self.err(
                u,
                "store.url",
                format!("database {path:?} is not a number (redis://host:port/DB)"),
            ));
        }
        if let Some(p) = parsed.password() {
            // The url keeps the password percent-encoded (`%3Credacted%3E`).
            let decoded = p
                .replace("%3C", "<")
                .replace("%3E", ">")
                .replace("%3c", "<")
                .replace("%3e", ">");
            not_redacted(&decoded).map_err(|m| self.err(u, "store.url", m))?;
        }
        // What the client itself makes of it (it is what connects).
        redis::Client::open(text).map_err(|e| self.err(u, "store.url", e.to_string()))?;
        let prefix = match &raw.prefix {
            Some(p) => {
                let v = p.get_ref();
                if v.is_empty() || v.len() > 64 || v.bytes().any(|b| b <= b' ' || b == 0x7f) {
                    return Err(self.err(
                        p,
                        "store.prefix",
                        "1 to 64 printable characters without spaces, e.g. \"limpet:\"",
                    ));
                }
                v.clone()
            }
            None => {
                // Redis's publish/subscribe ignores the database: two fleets kept apart by
                // database alone (`/1`, `/2`) under the one default prefix share the
                // re-pin channel, and each applies the other's re-pins to its own pins of
                // the same keys and node names. Warned, not refused: it loaded before.
                if !matches!(path, "" | "0") {
                    tracing::warn!(
                        "{}",
                        self.err(
                            u,
                            "store.url",
                            format!("database {path} with the default prefix: publish/subscribe ignores the database, so fleets on other databases of this store share limpet's re-pin channel; give each fleet its own `prefix`")
                        )
                    );
                }
                "limpet:".to_owned()
            }
        };
        let bounded = |d: &Option<Spanned<Dur>>, key: &str, default: Duration| match d {
            Some(v)
                if v.get_ref().0 < Duration::from_millis(1)
                    || v.get_ref().0 > Duration::from_secs(10) =>
            {
                Err(self.err(v, key, "must be between 1ms and 10s"))
            }
            Some(v) => Ok(v.get_ref().0),
            None => Ok(default),
        };
        Ok(StoreDef {
            url: text.to_owned(),
            prefix,
            timeout: bounded(&raw.timeout, "store.timeout", Duration::from_millis(50))?,
            connect_timeout: bounded(
                &raw.connect_timeout,
                "store.connect_timeout",
                Duration::from_secs(1),
            )?,
        })
    }

    fn nodes(&self, raw: &[RawNode]) -> Result<Vec<NodeDef>, ConfigError> {
        if raw.is_empty() {
            return Err(self.err_nowhere("nodes", "at least one [[nodes]] is needed"));
        }
        let mut out: Vec<NodeDef> = Vec::new();
        // By name, for the duplicate check: a scan of `out` made 80,000 nodes take 47 s.
        let mut names: std::collections::HashSet<&str> =
            std::collections::HashSet::with_capacity(raw.len());
        for (i, n) in raw.iter().enumerate() {
            let key = format!("nodes[{i}]");
            let name = n.name.get_ref();
            if let Err(e) = Pool::new([name.as_str()]) {
                return Err(self.err(&n.name, format!("{key}.name"), e.to_string()));
            }
            if !names.insert(name.as_str()) {
                return Err(self.err(
                    &n.name,
                    format!("{key}.name"),
                    format!("duplicate node name {name:?}"),
                ));
            }
            let addr = self.host(&n.address, &format!("{key}.address"))?;
            let weight = match &n.weight {
                Some(w) => {
                    let v = *w.get_ref();
                    if !(1..=limpet_core::MAX_WEIGHT).contains(&v) {
                        return Err(self.err(
                            w,
                            format!("{key}.weight"),
                            format!("weights go from 1 to {}", limpet_core::MAX_WEIGHT),
                        ));
                    }
                    v
                }
                None => 1,
            };
            let count = |v: &Option<Spanned<Size>>, k: &str| -> Result<Option<u32>, ConfigError> {
                match v {
                    None => Ok(None),
                    Some(v) => match u32::try_from(v.get_ref().0) {
                        Ok(n) if n >= 1 => Ok(Some(n)),
                        _ => Err(self.err(v, format!("{key}.{k}"), "must be 1 to 4g")),
                    },
                }
            };
            if let Some(p) = n.check_port.as_ref().filter(|p| *p.get_ref() == 0) {
                return Err(self.err(
                    p,
                    format!("{key}.check_port"),
                    "port 0 cannot be connected to",
                ));
            }
            let max_connections = count(&n.max_connections, "max_connections")?;
            let max_queue = count(&n.max_queue, "max_queue")?;
            if let (Some(q), None) = (&n.max_queue, max_connections) {
                return Err(self.err(
                    q,
                    format!("{key}.max_queue"),
                    "a queue is for a node with max_connections",
                ));
            }
            out.push(NodeDef {
                name: name.clone(),
                addr,
                weight,
                max_connections,
                max_queue: max_queue.unwrap_or(crate::config::DEFAULT_MAX_QUEUE),
            });
        }
        Ok(out)
    }

    /// A node address: an IP, or a host name resolved once now (like HAProxy's default
    /// `init-addr`). A port is refused: each listener says which port it forwards to.
    fn host(&self, s: &Spanned<String>, key: &str) -> Result<IpAddr, ConfigError> {
        let v = s.get_ref().trim();
        if let Ok(ip) = v.parse::<IpAddr>() {
            return Ok(ip);
        }
        if v.parse::<SocketAddr>().is_ok()
            || v.rsplit_once(':')
                .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        {
            return Err(self.err(s, key, format!("{v:?}: write the address without a port; each listener's `node_port` says which port")));
        }
        if v.is_empty() {
            return Err(self.err(s, key, "empty address"));
        }
        // The resolver takes `fe80::1%lo` and drops the zone: limpet would then connect to
        // the address with no interface, which fails at runtime.
        if v.contains('%') && v.contains(':') {
            return Err(self.err(
                s,
                key,
                format!("{v:?}: a link-local IPv6 address with a zone is not supported; give the node a global or loopback address"),
            ));
        }
        (v, 0)
            .to_socket_addrs()
            .map_err(|e| self.err(s, key, format!("cannot resolve {v:?}: {e}")))?
            .next()
            .map(|a| a.ip())
            .ok_or_else(|| self.err(s, key, format!("{v:?} resolves to no address")))
    }

    fn tables(&self, raw: &[RawTable]) -> Result<Vec<TableDef>, ConfigError> {
        let mut out: Vec<TableDef> = Vec::new();
        for (i, t) in raw.iter().enumerate() {
            let key = format!("tables[{i}]");
            let name = t.name.get_ref();
            if name.is_empty() {
                return Err(self.err(&t.name, format!("{key}.name"), "empty table name"));
            }
            if let Err(e) = label_name("table", name) {
                return Err(self.err(&t.name, format!("{key}.name"), e));
            }
            if out.iter().any(|o| &o.name == name) {
                return Err(self.err(
                    &t.name,
                    format!("{key}.name"),
                    format!("duplicate table name {name:?}"),
                ));
            }
            // A shared table's name is part of its keys in the store (`{prefix}{table}:`)
            // and of the re-pin messages (`table\nnode\nkey`): with a `:`, two tables could
            // share store keys (`a` keyed `b:x` and `a:b` keyed `x`), and a control character
            // would break the message.
            if t.shared.as_ref().is_some_and(|s| *s.get_ref())
                && name.chars().any(|c| c == ':' || c.is_control())
            {
                return Err(self.err(
                    &t.name,
                    format!("{key}.name"),
                    format!(
                        "{name:?}: a shared table's name is part of its store keys; \
                         no ':' or control characters"
                    ),
                ));
            }
            let set = [
                t.key.is_some(),
                t.header.is_some(),
                t.app_cookie.is_some(),
                t.learn_header.is_some(),
            ];
            let tkey = match (&t.key, &t.header, &t.app_cookie) {
                _ if set.iter().filter(|b| **b).count() > 1 => {
                    return Err(self.err(
                        &t.name,
                        key,
                        "give one of `key = \"source-ip\"`, `header`, `app_cookie` or `learn_header`, not several",
                    ));
                }
                (Some(k), _, _) => {
                    if k.get_ref() != "source-ip" {
                        let hint = closest(k.get_ref(), ["source-ip"].into_iter())
                            .map_or(String::new(), |s| format!("; did you mean `{s}`?"));
                        return Err(self.err(k, format!("{key}.key"), format!("unknown key {:?}: `key` takes \"source-ip\" (use `header = ...` or `app_cookie = ...` for the others){hint}", k.get_ref())));
                    }
                    let p4 = self.prefix(&t.ipv4_prefix, 32, &format!("{key}.ipv4_prefix"))?;
                    let p6 = self.prefix(&t.ipv6_prefix, 128, &format!("{key}.ipv6_prefix"))?;
                    let prefix = IpPrefix::new(p4, p6)
                        .map_err(|e| self.err(k, format!("{key}.key"), e.to_string()))?;
                    KeySpec::SourceIp(prefix)
                }
                (None, Some(h), _) => KeySpec::header(h.get_ref())
                    .map_err(|e| self.err(h, format!("{key}.header"), e.to_string()))?,
                (None, None, Some(c)) => KeySpec::app_cookie(c.get_ref())
                    .map_err(|e| self.err(c, format!("{key}.app_cookie"), e.to_string()))?,
                (None, None, None) => match &t.learn_header {
                    Some(l) => KeySpec::learn_header(l.get_ref())
                        .map_err(|e| self.err(l, format!("{key}.learn_header"), e.to_string()))?,
                    None => {
                        return Err(self.err(&t.name, key, "a table needs a key: `key = \"source-ip\"`, `header = \"X-...\"`, `app_cookie = \"NAME\"` or `learn_header = \"X-...\"`"));
                    }
                },
            };
            if !matches!(tkey, KeySpec::SourceIp(_)) {
                for (p, k) in [
                    (&t.ipv4_prefix, "ipv4_prefix"),
                    (&t.ipv6_prefix, "ipv6_prefix"),
                ] {
                    if let Some(p) = p {
                        return Err(self.err(
                            p,
                            format!("{key}.{k}"),
                            "prefixes only apply to `key = \"source-ip\"`",
                        ));
                    }
                }
            }
            let expire = match &t.expire {
                Some(e) if e.get_ref().0.is_zero() => {
                    return Err(self.err(e, format!("{key}.expire"), "must be more than 0"));
                }
                Some(e) => e.get_ref().0,
                None => Duration::from_secs(30 * 60),
            };
            let size = match &t.size {
                Some(s) => {
                    let Ok(v) = u32::try_from(s.get_ref().0) else {
                        return Err(self.err(
                            s,
                            format!("{key}.size"),
                            format!(
                                "table size {} is over the maximum {}",
                                s.get_ref().0,
                                limpet_core::table::MAX_SIZE
                            ),
                        ));
                    };
                    if let Err(e) = TableConfig::new(v, 1).validate() {
                        return Err(self.err(s, format!("{key}.size"), e.to_string()));
                    }
                    v
                }
                None => 100_000,
            };
            let expire_ms = u64::try_from(expire.as_millis()).unwrap_or(u64::MAX);
            if let Err(e) = TableConfig::new(1, expire_ms).validate() {
                let at = t.expire.as_ref().map_or(t.name.span(), |e| e.span());
                return Err(self
                    .src
                    .error(Some(at), format!("{key}.expire"), e.to_string()));
            }
            let snapshot = match (&t.snapshot, &t.snapshot_interval) {
                (None, Some(iv)) => {
                    return Err(self.err(
                        iv,
                        format!("{key}.snapshot_interval"),
                        "needs `snapshot = \"path\"`",
                    ));
                }
                (None, None) => None,
                (Some(p), iv) => {
                    if p.get_ref().is_empty() {
                        return Err(self.err(p, format!("{key}.snapshot"), "empty path"));
                    }
                    if let Some(iv) = iv {
                        if iv.get_ref().0 < Duration::from_secs(1) {
                            return Err(self.err(
                                iv,
                                format!("{key}.snapshot_interval"),
                                "must be at least 1s",
                            ));
                        }
                    }
                    let path = self.file(p.get_ref());
                    // Compared as files (`./pins.snap` is `pins.snap`, see `same_path`): a save would
                    // overwrite the config, or two tables would load each other's pins and
                    // write over each other's saves.
                    if same_path(&path, self.src.file) {
                        return Err(self.err(
                            p,
                            format!("{key}.snapshot"),
                            "is this configuration file itself",
                        ));
                    }
                    if let Some(other) = out.iter().find(|o: &&TableDef| {
                        o.snapshot
                            .as_ref()
                            .is_some_and(|s| same_path(&s.path, &path))
                    }) {
                        return Err(self.err(
                            p,
                            format!("{key}.snapshot"),
                            format!("table {:?} saves to the same file", other.name),
                        ));
                    }
                    Some(SnapshotDef {
                        path,
                        interval: iv.as_ref().map(|i| i.get_ref().0),
                    })
                }
            };
            out.push(TableDef {
                name: name.clone(),
                key: tkey,
                expire,
                size,
                snapshot,
                shared: t.shared.as_ref().is_some_and(|s| *s.get_ref()),
            });
        }
        Ok(out)
    }

    fn prefix(&self, p: &Option<Spanned<u8>>, max: u8, key: &str) -> Result<u8, ConfigError> {
        match p {
            None => Ok(max),
            Some(v) if *v.get_ref() > max => {
                Err(self.err(v, key, format!("prefix length goes from 0 to {max}")))
            }
            Some(v) => Ok(*v.get_ref()),
        }
    }

    fn listener(
        &self,
        key: &str,
        l: &RawListener,
        nodes: &[NodeDef],
        tables: &[TableDef],
    ) -> Result<ListenerDef, ConfigError> {
        let mode = match l.mode.as_ref().map(Spanned::get_ref) {
            Some(RawMode::Tcp) => Mode::Tcp,
            Some(RawMode::Http) | None => Mode::Http,
        };
        if l.name.get_ref().is_empty() {
            return Err(self.err(&l.name, format!("{key}.name"), "empty listener name"));
        }
        if let Err(e) = label_name("listener", l.name.get_ref()) {
            return Err(self.err(&l.name, format!("{key}.name"), e));
        }
        let bind_strs: Vec<String> = match l.bind.get_ref() {
            OneOrMany::One(s) => vec![s.clone()],
            OneOrMany::Many(v) => v.clone(),
        };
        if bind_strs.is_empty() {
            return Err(self.err(&l.bind, format!("{key}.bind"), "at least one address"));
        }
        let mut bind = Vec::new();
        for b in &bind_strs {
            let a = b.parse::<SocketAddr>().map_err(|_| {
                self.err(
                    &l.bind,
                    format!("{key}.bind"),
                    format!("{b:?} is not IP:PORT (e.g. \"0.0.0.0:5011\" or \"[::]:5011\")"),
                )
            })?;
            bind.push(a);
        }
        let node_port = match *l.node_port.get_ref() {
            RawNodePort::Port(0) => {
                return Err(self.err(
                    &l.node_port,
                    format!("{key}.node_port"),
                    "port 0 cannot be connected to",
                ));
            }
            RawNodePort::Port(p) => Some(p),
            RawNodePort::Same => None,
        };
        // A node that is this listener's own address would send every connection back to
        // limpet, which forwards it again: refuse the loop before it starts.
        for b in bind.iter().filter(|b| b.port() != 0) {
            let to = node_port.unwrap_or(b.port());
            if let Some(n) = nodes
                .iter()
                .find(|n| super::loops_back(*b, SocketAddr::new(n.addr, to)))
            {
                return Err(self.err(
                    &l.node_port,
                    format!("{key}.node_port"),
                    format!(
                        "node {:?} at {} port {to} is this listener's own address {b}: limpet would forward to itself",
                        n.name, n.addr
                    ),
                ));
            }
        }
        let table = match &l.table {
            None => None,
            Some(t) => {
                let Some(def) = tables.iter().find(|d| &d.name == t.get_ref()) else {
                    let hint = closest(t.get_ref(), tables.iter().map(|d| d.name.as_str()))
                        .map_or(String::new(), |s| format!("; did you mean {s:?}?"));
                    return Err(self.err(
                        t,
                        format!("{key}.table"),
                        format!("no table named {:?} in [[tables]]{hint}", t.get_ref()),
                    ));
                };
                if mode == Mode::Tcp && !matches!(def.key, KeySpec::SourceIp(_)) {
                    return Err(self.err(t, format!("{key}.table"), format!("table {:?} is keyed on an HTTP header or cookie; a tcp listener can only use a `source-ip` table", def.name)));
                }
                Some(def.name.clone())
            }
        };
        let cookie = match (&l.cookie, mode) {
            (Some(_), Mode::Tcp) => {
                return Err(self.err(
                    &l.name,
                    format!("{key}.cookie"),
                    "cookies are for mode = \"http\" listeners",
                ));
            }
            (Some(c), Mode::Http) => self.cookie(&format!("{key}.cookie"), &l.name, c, nodes)?,
            // An HTTP listener pins with the cookie by default, unless it names a table only.
            (None, Mode::Http) if table.is_none() => Some(CookieConfig::default()),
            (None, _) => None,
        };
        // limpet takes its cookie out of every request and drops a node's `Set-Cookie` of its
        // name: named as the table's application cookie (HAProxy's `cookie JSESSIONID prefix`
        // carried over), the application's own session would never reach it again.
        if let (Some(c), Some(t)) = (&cookie, &table) {
            let app = tables
                .iter()
                .find(|d| &d.name == t)
                .and_then(|d| match &d.key {
                    KeySpec::AppCookie(name) => Some(name),
                    _ => None,
                });
            // Its `-home` cookie only with `failback = "home"`.
            let home = (c.failback == crate::config::Failback::Home)
                .then(|| format!("{}-home", c.spec.name));
            let ours = std::iter::once(c.spec.name.to_string()).chain(home);
            let mut ours = ours;
            if let Some(app) = app.filter(|a| ours.any(|o| o == ***a)) {
                let msg = format!(
                    "{app:?} is table {t:?}'s application cookie: limpet's own cookie (and its `-home`) needs another name, or the application loses its session"
                );
                return Err(match l.cookie.as_ref().and_then(|r| r.name.as_ref()) {
                    Some(n) => self.err(n, format!("{key}.cookie.name"), msg),
                    None => self.err(&l.name, format!("{key}.cookie.name"), msg),
                });
            }
        }
        let balance = match l.balance {
            Some(RawBalance::LeastConn) => Balance::LeastConn,
            Some(RawBalance::RoundRobin) | None => Balance::RoundRobin,
        };
        let tls = match &l.tls {
            None => None,
            Some(t) => Some(Arc::new(self.server_tls(
                &format!("{key}.tls"),
                &l.name,
                t,
                mode,
            )?)),
        };
        let upstream_tls = match &l.upstream_tls {
            None => None,
            Some(u) => Some(self.upstream_tls(&format!("{key}.upstream_tls"), &l.name, u, mode)?),
        };
        let mut timeouts = Timeouts::default();
        let mut tcp = TcpDef::default();
        let mut proxy_protocol = ProxyProtocolDef {
            header_timeout: Duration::from_secs(5),
            ..ProxyProtocolDef::default()
        };
        if let Some(t) = &l.timeouts {
            // `drain = "0s"` closes at once on shutdown; every other timeout must allow time.
            for (d, k) in [
                (&t.connect, "connect"),
                (&t.idle, "idle"),
                (&t.header_read, "header_read"),
                (&t.upstream_answer, "upstream_answer"),
                (&t.client_idle, "client_idle"),
                (&t.answer_body_idle, "answer_body_idle"),
                (&t.tunnel_idle, "tunnel_idle"),
                (&t.proxy_header, "proxy_header"),
                (&t.queue, "queue"),
                (&t.upstream_idle, "upstream_idle"),
            ] {
                if let Some(d) = d.as_ref().filter(|d| d.get_ref().0.is_zero()) {
                    return Err(self.err(d, format!("{key}.timeouts.{k}"), "must be more than 0"));
                }
            }
            // A tcp listener's sessions run on `idle` (both ways), `connect`, `queue`,
            // `proxy_header`, `header_read` (a TLS handshake) and `drain`: the HTTP ones would
            // be taken and never used (HAProxy's `timeout tunnel` carried over as `tunnel_idle`,
            // the sessions still ending at `idle`).
            if mode == Mode::Tcp {
                for (d, k) in [
                    (&t.upstream_answer, "upstream_answer"),
                    (&t.client_idle, "client_idle"),
                    (&t.answer_body_idle, "answer_body_idle"),
                    (&t.tunnel_idle, "tunnel_idle"),
                    (&t.upstream_idle, "upstream_idle"),
                ] {
                    if let Some(d) = d {
                        return Err(self.err(
                            d,
                            format!("{key}.timeouts.{k}"),
                            "only for mode = \"http\" (a tcp listener's sessions end at `idle`)",
                        ));
                    }
                }
            }
            let get = |d: &Option<Spanned<Dur>>| d.as_ref().map(|d| d.get_ref().0);
            let set = |d: &Option<Spanned<Dur>>, slot: &mut Duration| {
                if let Some(d) = get(d) {
                    *slot = d;
                }
            };
            set(&t.connect, &mut timeouts.connect);
            set(&t.header_read, &mut timeouts.header_read);
            set(&t.upstream_answer, &mut timeouts.upstream_answer);
            set(&t.client_idle, &mut timeouts.client_idle);
            set(&t.answer_body_idle, &mut timeouts.answer_body_idle);
            set(&t.tunnel_idle, &mut timeouts.tunnel_idle);
            set(&t.upstream_idle, &mut timeouts.upstream_idle);
            set(&t.drain, &mut timeouts.drain);
            set(&t.proxy_header, &mut proxy_protocol.header_timeout);
            // HAProxy: `timeout queue` unset is `timeout connect`.
            timeouts.queue = get(&t.queue).or(get(&t.connect)).unwrap_or(timeouts.queue);
            if let Some(d) = get(&t.idle) {
                timeouts.keep_alive_idle = d;
                tcp.idle = d;
            }
        }
        if let Some(c) = &l.close_on_node_down {
            // TCP sessions, and on an HTTP listener its tunnels (WebSocket and other
            // upgrades); HTTP requests re-pin one by one whatever it says.
            tcp.close_on_node_down = *c.get_ref();
        }
        if let Some(pp) = &l.proxy_protocol {
            for a in &pp.accept_from {
                proxy_protocol
                    .accept_from
                    .push(self.net(a, &format!("{key}.proxy_protocol.accept_from"))?);
            }
            if let (Some(send), Mode::Http) = (&pp.send, mode) {
                // A PROXY header names one client, and an HTTP listener's node connections
                // are shared by every client (kept alive, reused): it would name the wrong one.
                return Err(self.err(
                    send,
                    format!("{key}.proxy_protocol.send"),
                    "only for mode = \"tcp\": an HTTP listener's node connections are shared \
                     between clients, so its nodes get the client's address in X-Forwarded-For",
                ));
            }
            proxy_protocol.send = pp.send.as_ref().map(|v| match v.get_ref() {
                RawPpVersion::V1 => proxy_protocol::Version::V1,
                RawPpVersion::V2 => proxy_protocol::Version::V2,
            });
        }
        let mut trusted_proxies = Vec::new();
        if let (Mode::Tcp, Some(a)) = (mode, l.trusted_proxies.iter().flatten().next()) {
            return Err(self.err(
                a,
                format!("{key}.trusted_proxies"),
                "only for mode = \"http\" (X-Forwarded-For); a tcp listener trusts PROXY headers with `proxy_protocol.accept_from`",
            ));
        }
        for a in l.trusted_proxies.iter().flatten() {
            trusted_proxies.push(self.net(a, &format!("{key}.trusted_proxies"))?);
        }
        let mut limits = Limits::default();
        if let Some(m) = &l.max_connections {
            let n = m.get_ref().0;
            if n == 0 {
                return Err(self.err(m, format!("{key}.max_connections"), "must be at least 1"));
            }
            // A semaphore holds at most usize::MAX >> 3 permits; far beyond any file limit.
            if n > 1 << 32 {
                return Err(self.err(
                    m,
                    format!("{key}.max_connections"),
                    format!("{n} is more connections than a machine can hold (at most 4g)"),
                ));
            }
            limits.max_client_connections = usize::try_from(n).unwrap_or(usize::MAX);
        }
        if let Some(m) = &l.h2_max_concurrent_streams {
            let k = format!("{key}.h2_max_concurrent_streams");
            if mode != Mode::Http {
                return Err(self.err(m, k, "only for mode = \"http\""));
            }
            limits.h2_max_concurrent_streams = match u32::try_from(m.get_ref().0) {
                Ok(n) if (1..=65_535).contains(&n) => n,
                _ => return Err(self.err(m, k, "must be 1 to 65535")),
            };
        }
        Ok(ListenerDef {
            name: l.name.get_ref().clone(),
            bind,
            mode,
            node_port: node_port.unwrap_or(0),
            upstreams: match node_port {
                Some(p) => nodes.iter().map(|n| SocketAddr::new(n.addr, p)).collect(),
                None => Upstreams::same_port(nodes.iter().map(|n| n.addr)),
            },
            balance,
            table,
            cookie,
            tls,
            upstream_tls,
            proxy_protocol,
            timeouts,
            tcp,
            trusted_proxies,
            limits,
            retry_after_secs: 5,
        })
    }

    fn net(&self, s: &Spanned<String>, key: &str) -> Result<IpNet, ConfigError> {
        s.get_ref()
            .parse::<IpNet>()
            .map_err(|e| self.err(s, key, e.to_string()))
    }

    fn cookie(
        &self,
        key: &str,
        at: &Spanned<String>,
        r: &RawCookie,
        nodes: &[NodeDef],
    ) -> Result<Option<CookieConfig>, ConfigError> {
        if r.enabled == Some(false) {
            return Ok(None);
        }
        let mut spec = CookieSpec::proxy_default();
        if let Some(n) = &r.name {
            if !limpet_core::cookie::is_cookie_name(n.get_ref().as_bytes()) {
                return Err(self.err(
                    n,
                    format!("{key}.name"),
                    format!("{:?} is not a cookie name", n.get_ref()),
                ));
            }
            spec.name = n.get_ref().as_str().into();
        }
        // Both go into every Set-Cookie value as written: a byte a header cannot hold would
        // make each one fail (no answer would pin), and a `;` would add an attribute.
        if let Some(p) = &r.path {
            cookie_path(p.get_ref()).map_err(|m| self.err(p, format!("{key}.path"), m))?;
            spec.path = Some(p.get_ref().as_str().into());
        }
        if let Some(d) = &r.domain {
            cookie_domain(d.get_ref()).map_err(|m| self.err(d, format!("{key}.domain"), m))?;
            spec.domain = Some(d.get_ref().as_str().into());
        }
        if let Some(m) = &r.max_age {
            // `Max-Age` counts whole seconds, and 0 deletes the cookie: under a second, every
            // pin limpet sent would have unpinned its client at once.
            let d = m.get_ref().0;
            if d < std::time::Duration::from_secs(1) || d.subsec_nanos() != 0 {
                return Err(self.err(
                    m,
                    format!("{key}.max_age"),
                    "a whole number of seconds, 1 or more (a browser deletes a cookie of Max-Age=0)",
                ));
            }
            spec.max_age = Some(d.as_secs());
        }
        if let Some(h) = r.http_only {
            spec.http_only = h;
        }
        spec.secure = match r.secure {
            None | Some(RawSecure::Bool(false)) => limpet_core::Secure::OverTls,
            Some(RawSecure::Bool(true)) => limpet_core::Secure::Always,
            Some(RawSecure::Never) => limpet_core::Secure::Never,
        };
        if let Some(s) = r.same_site {
            spec.same_site = Some(match s {
                RawSameSite::Lax => SameSite::Lax,
                RawSameSite::Strict => SameSite::Strict,
                RawSameSite::None => SameSite::None,
            });
        }
        let mode = match r.mode {
            None | Some(RawCookieMode::Name) => {
                if let Some(k) = &r.keys {
                    return Err(self.err(
                        k,
                        format!("{key}.keys"),
                        "keys are for mode = \"signed\"",
                    ));
                }
                // A name-mode cookie carries no time: a limit here would be silently ignored.
                for (field, v) in [("max_idle", &r.max_idle), ("max_lifetime", &r.max_lifetime)] {
                    if let Some(v) = v {
                        return Err(self.err(
                            v,
                            format!("{key}.{field}"),
                            format!(
                                "{field} is for mode = \"signed\" (a node's name carries no time)"
                            ),
                        ));
                    }
                }
                CookieMode::Name
            }
            Some(RawCookieMode::Signed) => {
                let Some(keys) = &r.keys else {
                    return Err(self.err(
                        at,
                        key.to_owned(),
                        "mode = \"signed\" needs `keys = [\"...\"]` (secrets, newest first)",
                    ));
                };
                let count = keys.get_ref().len();
                if !(1..=limpet_core::codec::MAX_KEYS).contains(&count) {
                    return Err(self.err(
                        keys,
                        format!("{key}.keys"),
                        format!(
                            "{count} keys: signed cookies need 1 to {} (the first signs, all verify)",
                            limpet_core::codec::MAX_KEYS
                        ),
                    ));
                }
                // Kept in whole seconds: a limit under one would be none.
                for (field, v) in [("max_idle", &r.max_idle), ("max_lifetime", &r.max_lifetime)] {
                    if let Some(v) = v
                        .as_ref()
                        .filter(|v| v.get_ref().0 < Duration::from_secs(1))
                    {
                        return Err(self.err(
                            v,
                            format!("{key}.{field}"),
                            format!("{field} must be at least 1 second"),
                        ));
                    }
                }
                for (i, k) in keys.get_ref().iter().enumerate() {
                    not_redacted(k).map_err(|m| self.err(keys, format!("{key}.keys"), m))?;
                    // HMAC-SHA256 keys shorter than its 32-byte output weaken it; the core
                    // accepts 16 (tests, the library API), a config file never less than 32.
                    if k.len() < MIN_COOKIE_KEY_BYTES {
                        return Err(self.err(
                            keys,
                            format!("{key}.keys[{i}]"),
                            format!(
                                "is {} bytes: signed-cookie keys need at least {MIN_COOKIE_KEY_BYTES} (e.g. `openssl rand -base64 32`)",
                                k.len()
                            ),
                        ));
                    }
                }
                CookieMode::Signed {
                    keys: keys
                        .get_ref()
                        .iter()
                        .map(|k| k.as_bytes().to_vec())
                        .collect(),
                    max_idle: r
                        .max_idle
                        .as_ref()
                        .map_or(Duration::from_secs(30 * 60), |d| d.get_ref().0),
                    max_lifetime: r
                        .max_lifetime
                        .as_ref()
                        .map_or(Duration::from_secs(12 * 3600), |d| d.get_ref().0),
                }
            }
        };
        let cfg = CookieConfig {
            spec,
            mode,
            keep_in_request: r.keep_in_request.unwrap_or(false),
            failback: match r.failback {
                None | Some(RawFailback::None) => Failback::None,
                Some(RawFailback::Home) => Failback::Home,
            },
        };
        let pool = Pool::new(nodes.iter().map(|n| n.name.as_str()))
            .map_err(|e| self.err(at, key.to_owned(), e.to_string()))?;
        cfg.codec(&pool)
            .map_err(|e| self.err(at, key.to_owned(), e.0))?;
        Ok(Some(cfg))
    }

    fn server_tls(
        &self,
        key: &str,
        at: &Spanned<String>,
        r: &RawTls,
        mode: Mode,
    ) -> Result<rustls::ServerConfig, ConfigError> {
        // (cert, key, names) with the spans to blame for each part.
        struct Entry<'a> {
            cert: PathBuf,
            key: PathBuf,
            names: Vec<String>,
            at_cert: &'a Spanned<String>,
            at_key: &'a Spanned<String>,
            at_names: Option<&'a Spanned<String>>,
            path: String,
        }
        let mut entries = Vec::new();
        match (&r.cert, &r.key) {
            (Some(c), Some(k)) => entries.push(Entry {
                cert: self.file(c.get_ref()),
                key: self.file(k.get_ref()),
                names: Vec::new(),
                at_cert: c,
                at_key: k,
                at_names: None,
                path: key.to_owned(),
            }),
            (Some(c), None) => return Err(self.err(c, format!("{key}.key"), "`cert` needs `key`")),
            (None, Some(k)) => {
                return Err(self.err(k, format!("{key}.cert"), "`key` needs `cert`"))
            }
            (None, None) => {}
        }
        // A name given to two certificates: the SNI resolver keeps the last it is given (names
        // compared without case, and without a trailing dot, which DNS names may end with),
        // so the first would never be served; say so at the second.
        let mut named: Vec<(String, usize)> = Vec::new();
        for (i, c) in r.certs.iter().enumerate() {
            for n in &c.names {
                let name = n.get_ref();
                let lower = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
                // One certificate naming a name twice maps it to itself: harmless.
                if let Some((_, first)) = named.iter().find(|(m, j)| *m == lower && *j != i) {
                    return Err(self.err(
                        n,
                        format!("{key}.certs[{i}].names"),
                        format!(
                            "{:?} is already a name of {key}.certs[{first}]: a name goes to one certificate",
                            n.get_ref()
                        ),
                    ));
                }
                named.push((lower, i));
            }
        }
        for (i, c) in r.certs.iter().enumerate() {
            entries.push(Entry {
                cert: self.file(c.cert.get_ref()),
                key: self.file(c.key.get_ref()),
                names: c.names.iter().map(|n| n.get_ref().clone()).collect(),
                at_cert: &c.cert,
                at_key: &c.key,
                at_names: c.names.first(),
                path: format!("{key}.certs[{i}]"),
            });
        }
        if entries.is_empty() {
            return Err(self.err(
                at,
                key.to_owned(),
                "TLS needs `cert` and `key`, or [[...tls.certs]]",
            ));
        }
        let specs: Vec<CertSpec<'_>> = entries
            .iter()
            .map(|e| CertSpec {
                cert: &e.cert,
                key: &e.key,
                names: &e.names,
            })
            .collect();
        let alpn: &[&[u8]] = match mode {
            // HTTP/1.0 too: a client that offers it alone (`curl --http1.0`) would otherwise
            // be refused at its handshake (rustls refuses a client whose list holds none of
            // the server's protocols); the protocol is told by the first bytes, not by ALPN.
            Mode::Http => &[b"h2", b"http/1.1", b"http/1.0"],
            Mode::Tcp => &[],
        };
        tls::server_config(&specs, alpn).map_err(|(i, e)| {
            let Some(entry) = entries.get(i) else {
                return self.err(at, key.to_owned(), e.message);
            };
            match e.part {
                TlsPart::Key => self.err(entry.at_key, format!("{}.key", entry.path), e.message),
                TlsPart::Name => match entry.at_names {
                    Some(n) => self.err(n, format!("{}.names", entry.path), e.message),
                    None => self.err(entry.at_cert, format!("{}.cert", entry.path), e.message),
                },
                TlsPart::Cert | TlsPart::Ca => {
                    self.err(entry.at_cert, format!("{}.cert", entry.path), e.message)
                }
            }
        })
    }

    fn upstream_tls(
        &self,
        key: &str,
        at: &Spanned<String>,
        r: &RawUpstreamTls,
        mode: Mode,
    ) -> Result<UpstreamTls, ConfigError> {
        let verify = match (&r.ca, &r.verify) {
            (Some(ca), None) => UpstreamVerify::Ca(Path::new(ca.get_ref())),
            (None, Some(v)) if v.get_ref() == "none" => UpstreamVerify::None,
            (None, Some(v)) => {
                return Err(self.err(
                    v,
                    format!("{key}.verify"),
                    format!(
                        "{:?}: `verify` only takes \"none\"; to verify, give `ca = \"ca.pem\"`",
                        v.get_ref()
                    ),
                ));
            }
            (Some(ca), Some(_)) => {
                return Err(self.err(
                    ca,
                    key.to_owned(),
                    "give `ca` or `verify = \"none\"`, not both",
                ));
            }
            (None, None) => {
                return Err(self.err(at, key.to_owned(), "say how nodes are verified: `ca = \"ca.pem\"`, or `verify = \"none\"` to accept any certificate"));
            }
        };
        let ca_path;
        let verify = match verify {
            UpstreamVerify::Ca(p) => {
                ca_path = self.file(&p.to_string_lossy());
                UpstreamVerify::Ca(&ca_path)
            }
            v => v,
        };
        // The HTTP engine speaks HTTP/1.1 to nodes.
        let alpn: &[&[u8]] = match mode {
            Mode::Http => &[b"http/1.1"],
            Mode::Tcp => &[],
        };
        let (config, trust) =
            tls::client_config_trusting(verify, alpn).map_err(|e| match &r.ca {
                Some(ca) => self.err(ca, format!("{key}.ca"), e.message),
                None => self.err(at, key.to_owned(), e.message),
            })?;
        if let Some(n) = &r.server_name {
            if rustls_pki_types::ServerName::try_from(n.get_ref().as_str()).is_err() {
                return Err(self.err(
                    n,
                    format!("{key}.server_name"),
                    format!("{:?} is not a DNS name or IP address", n.get_ref()),
                ));
            }
        }
        Ok(UpstreamTls {
            config: Arc::new(config),
            trust,
            server_name: r.server_name.as_ref().map(|n| n.get_ref().clone()),
        })
    }
}

// Node lifecycle keys (issue 4): active checks, `[admin]`, `[drain]`.
impl Validator<'_> {
    fn lifecycle(
        &self,
        raw: &RawConfig,
        nodes: &[NodeDef],
        listeners: &[ListenerDef],
        health: HealthPolicy,
        tables: &[TableDef],
    ) -> Result<super::LifecycleDef, ConfigError> {
        use crate::health::{CheckKind, CheckSpec, HttpCheck, TlsCheck};
        let mut def = super::LifecycleDef::default();
        let dur = |d: &Option<Spanned<Dur>>, key: &str, min: Duration| match d {
            Some(v) if v.get_ref().0 < min => {
                Err(self.err(v, key, format!("must be at least {} ms", min.as_millis())))
            }
            Some(v) => Ok(Some(v.get_ref().0)),
            None => Ok(None),
        };
        if let Some(h) = &raw.health {
            dur(&h.interval, "health.interval", Duration::from_millis(100))?;
            dur(&h.timeout, "health.timeout", Duration::from_millis(10))?;
            dur(&h.jitter, "health.jitter", Duration::ZERO)?;
        }
        let (interval, timeout, jitter) = check_timing(raw.health.as_ref());
        if let Some(d) = &raw.drain {
            if let Some(v) = dur(&d.spread, "drain.spread", Duration::ZERO)? {
                def.drain_spread = v;
            }
            if let Some(v) = dur(&d.idle, "drain.idle", Duration::ZERO)? {
                def.drain_idle = v;
            }
            if let Some(v) = dur(&d.seen_window, "drain.seen_window", Duration::from_secs(60))? {
                // Counted in minute slots, a day of them at most.
                let most = Duration::from_millis(limpet_core::seen::MAX_WINDOW_MS);
                if v > most {
                    if let Some(at) = &d.seen_window {
                        return Err(self.err(at, "drain.seen_window", "must be at most 24h"));
                    }
                }
                def.seen_window = v;
            }
        }
        if let Some(a) = &raw.admin {
            let listen = match &a.listen {
                Some(l) => l.get_ref().parse::<SocketAddr>().map_err(|_| {
                    self.err(
                        l,
                        "admin.listen",
                        "expected IP:PORT, e.g. \"127.0.0.1:9900\"",
                    )
                })?,
                None => crate::admin::DEFAULT_ADMIN_LISTEN,
            };
            if let Some(t) = &a.token {
                not_redacted(t.get_ref()).map_err(|m| self.err(t, "admin.token", m))?;
            }
            let mut hosts = Vec::new();
            for (i, h) in a.hosts.iter().flatten().enumerate() {
                // A trailing dot (a fully qualified name) is the same name.
                let name = h.get_ref();
                let name = name.strip_suffix('.').unwrap_or(name);
                let ok = !name.is_empty()
                    && name.len() <= 253
                    && name.parse::<std::net::IpAddr>().is_err()
                    && name.split('.').all(|label| {
                        !label.is_empty()
                            && label.len() <= 63
                            && label
                                .bytes()
                                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                    });
                if !ok {
                    return Err(self.err(
                        h,
                        format!("admin.hosts[{i}]"),
                        "expected a DNS name the admin listener is reached by, without a port (e.g. \"lb1.example.net\"); IP addresses and localhost are always answered",
                    ));
                }
                hosts.push(name.to_ascii_lowercase());
            }
            let state_file = match &a.state_file {
                None => None,
                Some(p) if p.get_ref().is_empty() => {
                    return Err(self.err(p, "admin.state_file", "empty path"));
                }
                Some(p) => {
                    let path = self.file(p.get_ref());
                    if same_path(&path, self.src.file) {
                        return Err(self.err(
                            p,
                            "admin.state_file",
                            "is this configuration file itself",
                        ));
                    }
                    if let Some(t) = tables.iter().find(|t| {
                        t.snapshot
                            .as_ref()
                            .is_some_and(|s| same_path(&s.path, &path))
                    }) {
                        return Err(self.err(
                            p,
                            "admin.state_file",
                            format!("table {:?} saves its snapshot to the same file", t.name),
                        ));
                    }
                    Some(path)
                }
            };
            let settings = crate::admin::AdminSettings {
                listen,
                token: a.token.as_ref().map(|t| t.get_ref().clone()),
                hosts,
                state_file,
            };
            if let Err(e) = settings.validate() {
                return Err(match (&a.token, &a.listen) {
                    (Some(t), _) => self.err(t, "admin.token", e.to_string()),
                    (None, Some(l)) => self.err(l, "admin.listen", e.to_string()),
                    (None, None) => self.err_nowhere("admin", e.to_string()),
                });
            }
            // The admin listener binds without `SO_REUSEPORT`: on an address a listener binds
            // (or one a wildcard of either covers: `0.0.0.0` every IPv4 address, `[::]` every
            // address of both families, as limpet binds it) it fails at start; say so now, as
            // for two listeners. Port 0 never clashes.
            let covers = |wild: &SocketAddr, a: &SocketAddr| {
                wild.ip().is_unspecified() && (wild.is_ipv6() || a.is_ipv4())
            };
            let overlaps = |b: &SocketAddr| {
                b.port() == listen.port()
                    && (b.ip() == listen.ip() || covers(b, &listen) || covers(&listen, b))
            };
            if listen.port() != 0 {
                if let Some((i, l)) = listeners
                    .iter()
                    .enumerate()
                    .find(|(_, l)| l.bind.iter().any(overlaps))
                {
                    let msg = format!("{listen} is already bound by listener {:?}", l.name);
                    return Err(match (&a.listen, raw.listeners.get(i)) {
                        (Some(at), _) => self.err(at, "admin.listen", msg),
                        // `admin.listen` left to its default: the listener's `bind` is the
                        // place to point at.
                        (None, Some(rl)) => self.err(
                            &rl.bind,
                            format!("listeners[{i}].bind"),
                            format!(
                                "{listen} is the admin listener's address (the default of admin.listen): bind the listener elsewhere or set admin.listen"
                            ),
                        ),
                        (None, None) => self.err_nowhere("admin.listen", msg),
                    });
                }
            }
            def.admin = Some(settings);
        }
        // Each node's distinct checks (by what they ask): the core keeps the results of at
        // most `CheckSlot::COUNT` apart, and more would share its last slot, where a pass of
        // one clears the other's failures (a dead port that never takes its node DOWN).
        let mut distinct: std::collections::HashMap<&str, std::collections::HashSet<String>> =
            std::collections::HashMap::new();
        // Each node's checks by label, with the listener that asked and how its connection
        // goes (the TLS it trusts, the PROXY header it sends), which the label leaves out:
        // two listeners asking one check another way share one, the last one's.
        let mut asked: std::collections::HashMap<(String, String), (usize, String)> =
            std::collections::HashMap::new();
        for (i, (l, rl)) in listeners.iter().zip(&raw.listeners).enumerate() {
            let Some(c) = &rl.check else { continue };
            let key = format!("listeners[{i}].check");
            // Each error points at the value it is about; what is missing, at the `kind`.
            let bad = |at: std::ops::Range<usize>, field: &str, msg: String| {
                self.src.error(Some(at), format!("{key}.{field}"), msg)
            };
            if let Some(p) = c.port.as_ref().filter(|p| *p.get_ref() == 0) {
                return Err(bad(
                    p.span(),
                    "port",
                    "port 0 cannot be connected to".into(),
                ));
            }
            // The TLS a check runs over (a `tls` check's handshake, an `http` check's
            // connection): the listener's own upstream TLS, the very client config its
            // connections to the nodes use (so the same CA or `verify = "none"`, and ALPN),
            // unless the check says `verify = "none"`; the name is set per node below. With
            // no upstream TLS to take and no `verify = "none"`, nothing says what to trust:
            // refused, pointing at `needs`. The name here stands for every node's until then.
            let check_tls = |needs: (std::ops::Range<usize>, &str),
                             what: &str|
             -> Result<TlsCheck, ConfigError> {
                let verify = c.verify.as_ref();
                let verify_at = verify.map_or(c.kind.span(), Spanned::span);
                let (config, trust) = match (verify.map(|v| v.get_ref().as_str()), &l.upstream_tls) {
                    (Some("none"), _) => (
                        crate::health::insecure_tls_config()
                            .map_err(|e| bad(verify_at.clone(), "verify", e.to_string()))?,
                        "none".to_owned(),
                    ),
                    (Some(other), _) => {
                        return Err(bad(verify_at, "verify", format!("{other:?}: only \"none\" is accepted here (omit it to verify as upstream_tls does)")))
                    }
                    (None, Some(u)) => (Arc::clone(&u.config), u.trust.clone()),
                    (None, None) => {
                        return Err(bad(
                            needs.0,
                            needs.1,
                            format!("{what} verifies as the listener's upstream_tls does: configure upstream_tls, or set verify = \"none\""),
                        ))
                    }
                };
                let server_name = match &c.server_name {
                    Some(n) => rustls_pki_types::ServerName::try_from(n.get_ref().clone())
                        .map_err(|_| {
                            bad(
                                n.span(),
                                "server_name",
                                format!("{:?} is not a server name", n.get_ref()),
                            )
                        })?,
                    None => rustls_pki_types::ServerName::IpAddress(
                        nodes
                            .first()
                            .map_or(IpAddr::from([127, 0, 0, 1]), |n| n.addr)
                            .into(),
                    ),
                };
                Ok(TlsCheck {
                    server_name,
                    config,
                    trust,
                })
            };
            // Keys another kind of check reads, on a `tcp` or `tls` check: ignored, and said,
            // naming the line (the operator most likely meant another kind). Said, not
            // refused: such a file loaded before, and a restart or an upgrade must not fail
            // on it.
            let what = match c.kind.get_ref().as_str() {
                "tcp" => Some("a tcp check only opens a connection"),
                "tls" => Some("a tls check only completes a TLS handshake"),
                _ => None,
            };
            if let Some(what) = what {
                let span = |v: &Option<Spanned<String>>| v.as_ref().map(Spanned::span);
                let mut foreign = vec![
                    ("path", span(&c.path), "an http check"),
                    ("method", span(&c.method), "an http check"),
                    ("host", span(&c.host), "an http check"),
                    ("expect", span(&c.expect), "an http check"),
                ];
                if c.kind.get_ref() == "tcp" {
                    foreign.push(("verify", span(&c.verify), "a check over TLS"));
                    foreign.push(("server_name", span(&c.server_name), "a check over TLS"));
                }
                for (field, at, of) in foreign {
                    if let Some(at) = at {
                        let says = format!("ignored: {what}; `{field}` is for {of}");
                        tracing::warn!("{}", bad(at, field, says));
                    }
                }
            }
            let kind = match c.kind.get_ref().as_str() {
                "tcp" => CheckKind::Tcp,
                "http" => {
                    let mut h = HttpCheck::default();
                    if let Some(p) = &c.path {
                        check_path(p.get_ref()).map_err(|m| bad(p.span(), "path", m))?;
                        h.path.clone_from(p.get_ref());
                    }
                    if let Some(m) = &c.method {
                        h.method = m.get_ref().parse().map_err(|_| {
                            bad(
                                m.span(),
                                "method",
                                format!("{:?} is not an HTTP method", m.get_ref()),
                            )
                        })?;
                    }
                    if let Some(host) = &c.host {
                        let v = host.get_ref();
                        // What the probe sends as is: a header value, and an authority (the
                        // node reads it as one) with no white space a node would refuse.
                        if http::HeaderValue::from_str(v).is_err()
                            || v.parse::<http::uri::Authority>().is_err()
                        {
                            return Err(bad(
                                host.span(),
                                "host",
                                format!("{v:?} cannot be a Host header (a host name or address, optionally with :PORT)"),
                            ));
                        }
                        h.host = Some(v.clone());
                    }
                    if let Some(e) = &c.expect {
                        h.expect = e
                            .get_ref()
                            .parse()
                            .map_err(|m: String| bad(e.span(), "expect", m))?;
                    }
                    // Over TLS or plain is decided per node, by the port it probes (below).
                    CheckKind::Http(h)
                }
                "tls" => CheckKind::Tls(check_tls((c.kind.span(), "kind"), "a tls check")?),
                other => {
                    let hint = closest(other, ["tcp", "http", "tls"].into_iter())
                        .map_or(String::new(), |s| format!(" (did you mean {s:?}?)"));
                    return Err(bad(
                        c.kind.span(),
                        "kind",
                        format!(
                            "unknown check kind {other:?}{hint}: use \"tcp\", \"http\" or \"tls\""
                        ),
                    ));
                }
            };
            let http = matches!(kind, CheckKind::Http(_));
            if let Some(t) = c.tls.as_ref().filter(|_| !http) {
                let is = match kind {
                    CheckKind::Tls(_) => "a tls check is a TLS handshake",
                    _ => "a tcp check only opens the connection",
                };
                return Err(bad(
                    t.span(),
                    "tls",
                    format!("`tls` says whether an http check runs over TLS; {is}"),
                ));
            }
            let check_port = c.port.as_ref().map(|p| *p.get_ref());
            let mut ports = Vec::with_capacity(nodes.len());
            for (ni, n) in nodes.iter().enumerate() {
                let node_check_port = raw
                    .nodes
                    .get(ni)
                    .and_then(|r| r.check_port.as_ref().map(|p| *p.get_ref()));
                let Some(port) = check_port_of(node_check_port, check_port, l) else {
                    return Err(bad(
                        c.kind.span(),
                        "port",
                        format!("node_port = \"same\" forwards to whichever port the client used, so the check of node {:?} needs a port: give `port` here or `check_port` on the node", n.name),
                    ));
                };
                ports.push(port);
            }
            // Per node: whether its http check runs over TLS, as the check says or else by
            // the port it probes.
            let over_tls: Vec<bool> = ports
                .iter()
                .map(|&port| {
                    http && c
                        .tls
                        .as_ref()
                        .map_or_else(|| http_check_tls_default(l, port), |t| *t.get_ref())
                })
                .collect();
            let http_tls = if over_tls.contains(&true) {
                let needs = c
                    .tls
                    .as_ref()
                    .map_or((c.kind.span(), "kind"), |t| (t.span(), "tls"));
                Some(check_tls(needs, "an http check over TLS")?)
            } else {
                if http {
                    // They say how a check over TLS verifies: on a plain one they are ignored,
                    // and the operator most likely meant TLS. Said, not refused: such a file
                    // loaded before checks could run over TLS, and a restart or an upgrade
                    // must not fail on it.
                    let why = match &c.tls {
                        Some(_) => "`tls = false`",
                        None if l.upstream_tls.is_none() => "the listener has no upstream_tls",
                        None => "it probes a check port, not the node port TLS is on",
                    };
                    for (field, v) in [("verify", &c.verify), ("server_name", &c.server_name)] {
                        if let Some(v) = v {
                            tracing::warn!(
                                "{}",
                                bad(
                                    v.span(),
                                    field,
                                    format!("ignored: this http check runs plain ({why}): `{field}` is for a check over TLS; set `tls = true` for one"),
                                )
                            );
                        }
                    }
                }
                None
            };
            for ((n, port), over_tls) in nodes.iter().zip(ports).zip(over_tls) {
                let mut kind = kind.clone();
                let tls = match &mut kind {
                    CheckKind::Tls(t) => Some(t),
                    CheckKind::Http(h) if over_tls => {
                        h.tls.clone_from(&http_tls);
                        h.tls.as_mut()
                    }
                    _ => None,
                };
                if let Some(t) = tls {
                    if c.server_name.is_none() {
                        // The name the listener's own connections to this node send and
                        // verify: its `server_name`, else the node's address.
                        t.server_name = tls::upstream_name(
                            l.upstream_tls
                                .as_ref()
                                .and_then(|u| u.server_name.as_deref()),
                            n.addr,
                        );
                    }
                }
                let mut spec = CheckSpec::new(kind, SocketAddr::new(n.addr, port));
                spec.proxy = check_proxy_default(l, port);
                spec.interval = interval;
                spec.timeout = timeout;
                spec.jitter = jitter;
                spec.fall = health.fall;
                spec.rise = health.rise;
                let how = {
                    let trust = match &spec.kind {
                        CheckKind::Tls(t) => Some(t.trust.as_str()),
                        CheckKind::Http(h) => h.tls.as_ref().map(|t| t.trust.as_str()),
                        CheckKind::Tcp => None,
                    };
                    let proxy = match spec.proxy {
                        Some(proxy_protocol::Version::V1) => ", PROXY v1",
                        Some(proxy_protocol::Version::V2) => ", PROXY v2",
                        None => "",
                    };
                    match trust {
                        Some(t) => format!("TLS trusting {t}{proxy}"),
                        None => format!("plain{proxy}"),
                    }
                };
                match asked.insert((n.name.clone(), spec.label()), (i, how.clone())) {
                    Some((j, before)) if before != how && j != i => tracing::warn!(
                        "{}",
                        bad(
                            c.kind.span(),
                            "kind",
                            format!(
                                "node {:?}: the same check as listeners[{j}]'s ({}), made another way ({how}, against {before}): one runs, this listener's",
                                n.name,
                                spec.label()
                            ),
                        )
                    ),
                    _ => {}
                }
                let checks = distinct.entry(n.name.as_str()).or_default();
                if checks.insert(spec.label()) && checks.len() > limpet_core::CheckSlot::COUNT {
                    return Err(bad(
                        c.kind.span(),
                        "kind",
                        format!(
                            "node {:?} would have more than {} distinct checks (each listener's check that asks something else is one more)",
                            n.name,
                            limpet_core::CheckSlot::COUNT
                        ),
                    ));
                }
                def.checks.push((n.name.clone(), spec));
            }
        }
        // Whether a check's answer speaks for the node's traffic: it probes a port that
        // traffic whose silence counts as unanswered reaches (an HTTP listener's, or a TCP
        // listener's speaking TLS to the nodes, whose handshakes count so). With
        // `node_port = "same"` those are the listener's own bound ports (any, for one bound
        // to port 0).
        let answering: Vec<&ListenerDef> = listeners
            .iter()
            .filter(|l| l.mode == crate::config::Mode::Http || l.upstream_tls.is_some())
            .collect();
        let index: std::collections::HashMap<&str, usize> = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.name.as_str(), i))
            .collect();
        for (node, spec) in &mut def.checks {
            let port = spec.addr.port();
            let i = index.get(node.as_str()).copied();
            spec.answers_for_traffic = answering.iter().any(|l| {
                if l.upstreams.is_same_port() {
                    l.bind.iter().any(|b| b.port() == 0 || b.port() == port)
                } else {
                    i.and_then(|i| l.upstreams.get(i, 0))
                        .is_some_and(|a| a.port() == port)
                }
            });
        }
        Ok(def)
    }
}

/// An HTTP check's request target, sent as written: it starts with `/`, and holds only what
/// a request target takes (no `#`: a fragment would be dropped, and another path checked).
fn check_path(p: &str) -> Result<(), String> {
    if !p.starts_with('/') {
        return Err(format!("{p:?} must start with /"));
    }
    if p.contains('#')
        || !p.bytes().all(|b| b.is_ascii_graphic())
        || p.parse::<http::uri::PathAndQuery>().is_err()
    {
        return Err(format!(
            "{p:?} is not a request target: ASCII without spaces, \"#\" or control characters (percent-encode the rest)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::Config;

    /// Each check's `answers_for_traffic` for `text`, by node and port.
    fn answering(text: &str) -> Vec<(String, u16, bool)> {
        let cfg = Config::from_text(std::path::Path::new("limpet.toml"), text)
            .unwrap_or_else(|e| panic!("{e}\n{text}"));
        cfg.lifecycle
            .checks
            .iter()
            .map(|(n, c)| (n.clone(), c.addr.port(), c.answers_for_traffic))
            .collect()
    }

    /// An HTTP check's answer speaks for a node's traffic only on a port an HTTP listener
    /// forwards to: a node's `check_port` elsewhere (a management port), or a check of a TCP
    /// listener with no HTTP listener at its port, proves only that port's process answers.
    /// With `node_port = "same"` the traffic's ports are the listener's bound ones (any, for
    /// one bound to port 0); a TCP listener speaking TLS to the nodes counts as traffic.
    #[test]
    fn a_check_answers_for_traffic_only_on_a_port_http_traffic_reaches() {
        let nodes = "[[nodes]]\nname = \"a\"\naddress = \"127.0.0.2\"\ncheck_port = 9000\n\n\
                     [[nodes]]\nname = \"b\"\naddress = \"127.0.0.3\"\n\n";
        let http = |port: &str| {
            format!(
                "[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nnode_port = {port}\n\
                 check = {{ kind = \"http\" }}\n\n"
            )
        };
        let tcp = "[[listeners]]\nname = \"raw\"\nbind = \"127.0.0.1:0\"\nmode = \"tcp\"\n\
                   node_port = 9100\ncheck = { kind = \"http\", port = 8080 }\n\n";
        let row = |n: &str, port: u16, answers: bool| (n.to_owned(), port, answers);
        assert_eq!(
            answering(&format!("{nodes}{}", http("8080"))),
            [row("a", 9000, false), row("b", 8080, true)]
        );
        // The TCP listener's check at 8080 speaks for the HTTP listener's traffic there.
        let both = answering(&format!("{nodes}{}{tcp}", http("8080")));
        assert!(both.contains(&row("b", 8080, true)), "{both:?}");
        assert!(both.contains(&row("a", 9000, false)), "{both:?}");
        // Without an HTTP listener, no check's answer speaks for traffic.
        assert_eq!(
            answering(&format!("{nodes}{tcp}")),
            [row("a", 9000, false), row("b", 8080, false)]
        );
        // `node_port = "same"`: the listener's own bound ports (any, bound to port 0).
        let same = |bind: &str| {
            answering(
                &format!("{nodes}{}", http("\"same\""))
                    .replace("127.0.0.1:0", bind)
                    .replace(
                        "check = { kind = \"http\" }",
                        "check = { kind = \"http\", port = 8081 }",
                    ),
            )
        };
        assert_eq!(
            same("127.0.0.1:8081"),
            [row("a", 9000, false), row("b", 8081, true)]
        );
        assert_eq!(
            same("127.0.0.1:0"),
            [row("a", 9000, true), row("b", 8081, true)]
        );
        // A TCP listener speaking TLS to the nodes: its handshakes' silence counts as
        // unanswered, so a check at its node port speaks for it.
        let tls = tcp.replace(
            "node_port = 9100\n",
            "node_port = 8080\nupstream_tls = { verify = \"none\" }\n",
        );
        assert_eq!(
            answering(&format!("{nodes}{tls}")),
            [row("a", 9000, false), row("b", 8080, true)]
        );
    }

    /// A listener that sends its nodes a PROXY header has its checks of the node port open
    /// with one too (a node that requires it closes every connection without it: every
    /// check would fail); a check at a check port gets none. The check's label, its
    /// identity across an upgrade, does not change.
    #[test]
    fn a_check_of_a_node_port_sent_proxy_headers_sends_one() {
        use limpet_core::proxy_protocol::Version;
        let text = |send: &str, check: &str| {
            format!(
                "[[nodes]]\nname = \"a\"\naddress = \"127.0.0.2\"\n\n\
                 [[nodes]]\nname = \"b\"\naddress = \"127.0.0.3\"\ncheck_port = 9000\n\n\
                 [[listeners]]\nname = \"raw\"\nbind = \"127.0.0.1:0\"\nmode = \"tcp\"\n\
                 node_port = 8631\nproxy_protocol = {{ send = \"{send}\" }}\ncheck = {check}\n"
            )
        };
        let proxies = |t: &str| {
            let cfg = Config::from_text(std::path::Path::new("limpet.toml"), t)
                .unwrap_or_else(|e| panic!("{e}\n{t}"));
            cfg.lifecycle
                .checks
                .iter()
                .map(|(n, c)| (n.clone(), c.addr.port(), c.proxy, c.label()))
                .collect::<Vec<_>>()
        };
        let got = proxies(&text("v2", "{ kind = \"http\" }"));
        assert_eq!(got[0].0, "a");
        assert_eq!((got[0].1, got[0].2), (8631, Some(Version::V2)));
        // The label, a check's identity across an upgrade, is as it was.
        assert_eq!(got[0].3, "http 127.0.0.2:8631 GET /", "{got:?}");
        assert_eq!((got[1].1, got[1].2), (9000, None), "b's check port");
        let got = proxies(&text("v1", "{ kind = \"tcp\" }"));
        assert_eq!(got[0].2, Some(Version::V1));
        // A check `port` other than the node port: none.
        let got = proxies(&text("v1", "{ kind = \"tcp\", port = 8080 }"));
        assert_eq!(got[0].2, None);
    }
}
