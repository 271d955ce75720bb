//! HAProxy and nginx names, mapped to limpet's keys, for the "did you mean" of config errors.
//!
//! An operator coming from HAProxy writes `inter`, `maxconn`, `stick-table` or
//! `timeout server`; edit distance cannot find `interval`, `max_connections`, `[[tables]]` or
//! `upstream_answer` from those. This table can. It is consulted only for a name the file's
//! table refuses, after no near-typo was found, and answers in one of three ways:
//!
//! - the limpet key is a field of the same table: "did you mean `interval`? (HAProxy's
//!   `inter`)";
//! - it lives elsewhere: "HAProxy's `inter` is `interval` in `[health]`";
//! - there is no key, only a way: a note (`option redispatch` is what limpet always does).

/// One foreign name (or several spellings of it) and where it goes in limpet.
struct Alias {
    /// Whose name it is (`H`, `N`, or `""` for a name of no one product) and the name as it
    /// is written there. Matching ignores case and treats `-`, `_` and spaces alike, so
    /// `timeout server`, `timeout-server` and `timeout_server` all match.
    names: &'static [(&'static str, &'static str)],
    /// The tables where the alias applies, as key paths without indices (`listeners`,
    /// `listeners.timeouts`, `""` for the top level); empty: everywhere. For an unknown enum
    /// value the "table" is the key holding it (`listeners.balance`).
    within: &'static [&'static str],
    /// The limpet key (or value) it becomes; empty when there is no one key.
    key: &'static str,
    /// Where `key` lives, as written in a file (`[health]`); shown when the error is in
    /// another table.
    place: &'static str,
    /// Said after the suggestion.
    note: &'static str,
}

const H: &str = "HAProxy";
const N: &str = "nginx";
const HEALTH: &str = "`[health]` (one setting for every node)";
const TIMEOUTS: &str = "`[listeners.timeouts]`";
const LISTENERS: &str = "`[[listeners]]`";
const CHECK_NOTE: &str = "checks belong to a listener: `check = { kind = \"http\", path = \"/health\" }` probes every node on the listener's node port (or a node's `check_port`); timing, `fall` and `rise` are in `[health]`";
const TABLE_NOTE: &str = "declare the table once in `[[tables]]` (`key = \"source-ip\"`, `expire`, `size`) and name it on each listener with `table = \"NAME\"`";
static ALIASES: &[Alias] = &[
    // Health checks: HAProxy's server keywords, nginx's upstream parameters.
    Alias {
        names: &[(H, "inter")],
        within: &[],
        key: "interval",
        place: HEALTH,
        note: "",
    },
    Alias {
        names: &[(H, "fastinter"), (H, "downinter")],
        within: &[],
        key: "interval",
        place: HEALTH,
        note: "limpet checks at one interval whatever the node's state",
    },
    Alias {
        names: &[(H, "fall"), (H, "rise"), (N, "fail_timeout")],
        within: &[],
        key: "",
        place: HEALTH,
        note: "",
    },
    Alias {
        names: &[(N, "max_fails")],
        within: &[],
        key: "fall",
        place: HEALTH,
        note: "",
    },
    Alias {
        names: &[(H, "error-limit"), (H, "observe"), (H, "on-error")],
        within: &[],
        key: "max_slow_answers",
        place: HEALTH,
        note: "connect failures and unanswered requests already count toward `fall`; this counts the requests that outlast `upstream_answer` while the node answers others",
    },
    Alias {
        names: &[(H, "timeout check")],
        within: &[],
        key: "timeout",
        place: HEALTH,
        note: "",
    },
    Alias {
        names: &[(H, "check"), (H, "option httpchk"), (N, "health_check")],
        within: &["", "nodes", "health", "tables"],
        key: "check",
        place: LISTENERS,
        note: CHECK_NOTE,
    },
    Alias {
        names: &[(H, "option httpchk"), (H, "httpchk"), (N, "health_check")],
        within: &["listeners"],
        key: "check",
        place: LISTENERS,
        note: CHECK_NOTE,
    },
    Alias {
        names: &[(H, "check-ssl"), (H, "ssl"), (H, "no-check-ssl")],
        within: &["listeners.check"],
        key: "tls",
        place: "a listener's `check`",
        note: "`tls = true` or `false`; unset, an `http` check runs over TLS at the node port of a listener with `upstream_tls`",
    },
    Alias {
        names: &[(H, "check-ssl"), (H, "no-check-ssl")],
        within: &[],
        key: "tls",
        place: "a listener's `check`",
        note: "`check = { kind = \"http\", tls = true }`; unset, an `http` check runs over TLS at the node port of a listener with `upstream_tls`",
    },
    Alias {
        names: &[(H, "port"), (H, "check port")],
        within: &["nodes"],
        key: "check_port",
        place: "`[[nodes]]`",
        note: "a node has no service port of its own: each listener's `node_port` says which port it forwards to (`\"same\"`: the port the client used); `check_port` is the port checks probe",
    },
    // Limits.
    Alias {
        names: &[(H, "maxconn"), (N, "max_conns")],
        within: &[],
        key: "max_connections",
        place: LISTENERS,
        note: "",
    },
    Alias {
        names: &[(H, "maxqueue")],
        within: &[],
        key: "max_queue",
        place: "`[[nodes]]`",
        note: "with `max_connections` on the node",
    },
    Alias {
        names: &[
            (H, "tune.h2.max-concurrent-streams"),
            (N, "http2_max_concurrent_streams"),
        ],
        within: &[],
        key: "h2_max_concurrent_streams",
        place: LISTENERS,
        note: "",
    },
    // Affinity.
    Alias {
        names: &[(H, "stick-table"), (H, "stick-tables")],
        within: &["", "nodes"],
        key: "tables",
        place: "`[[tables]]`",
        note: TABLE_NOTE,
    },
    Alias {
        names: &[
            (H, "stick-table"),
            (H, "stick"),
            (H, "stick on"),
            (H, "stick match"),
            (H, "stick store-request"),
            (N, "ip_hash"),
        ],
        within: &["listeners"],
        key: "table",
        place: LISTENERS,
        note: TABLE_NOTE,
    },
    Alias {
        names: &[(H, "expire"), (H, "size")],
        within: &["listeners"],
        key: "",
        place: "`[[tables]]`",
        note: TABLE_NOTE,
    },
    Alias {
        names: &[(H, "type")],
        within: &["tables"],
        key: "key",
        place: "`[[tables]]`",
        note: "`stick-table type ip` is `key = \"source-ip\"`; a header or cookie is `header = \"X-...\"` or `app_cookie = \"NAME\"`",
    },
    Alias {
        names: &[
            (H, "stick store-response"),
            (H, "store-response"),
            (N, "sticky learn"),
        ],
        within: &[],
        key: "learn_header",
        place: "`[[tables]]`",
        note: "a table keyed on a header the node's answer sets (e.g. `learn_header = \"Mcp-Session-Id\"`): later requests carrying it go to that node",
    },
    Alias {
        names: &[(H, "appsession")],
        within: &[],
        key: "app_cookie",
        place: "`[[tables]]`",
        note: "a table keyed on the application's session cookie, learned from the node's `Set-Cookie`",
    },
    Alias {
        names: &[(H, "cookie")],
        within: &["nodes"],
        key: "",
        place: "",
        note: "a node's cookie value is its `name`; the cookie itself is set per listener in `[listeners.cookie]`",
    },
    Alias {
        names: &[(N, "sticky")],
        within: &[],
        key: "cookie",
        place: "`[listeners.cookie]`",
        note: "",
    },
    Alias {
        names: &[(H, "maxlife")],
        within: &["listeners.cookie"],
        key: "max_lifetime",
        place: "`[listeners.cookie]`",
        note: "",
    },
    Alias {
        names: &[(H, "option redispatch"), (H, "redispatch")],
        within: &[],
        key: "",
        place: "",
        note: "not needed: a pin to a node that is DOWN or in MAINT is always re-pinned to a live node",
    },
    // Balancing: the key outside a listener, and HAProxy's and nginx's algorithm names.
    Alias {
        names: &[(H, "balance")],
        within: &["", "nodes", "tables", "health"],
        key: "balance",
        place: LISTENERS,
        note: "",
    },
    Alias {
        names: &[(H, "roundrobin"), (H, "static-rr")],
        within: &["listeners.balance"],
        key: "round-robin",
        place: "",
        note: "",
    },
    Alias {
        names: &[(N, "least_conn")],
        within: &["listeners.balance"],
        key: "leastconn",
        place: "",
        note: "",
    },
    Alias {
        names: &[(H, "source"), (N, "ip_hash"), (N, "hash")],
        within: &["listeners.balance"],
        key: "",
        place: "",
        note: "pinning a client address is an affinity table in limpet: `[[tables]]` with `key = \"source-ip\"`, and `table = \"NAME\"` on the listener",
    },
    // Timeouts, at listener level (`timeout_server`) or in `[listeners.timeouts]` (`server`).
    Alias {
        names: &[(H, "timeout server"), (N, "proxy_read_timeout")],
        within: &[],
        key: "upstream_answer",
        place: TIMEOUTS,
        note: "",
    },
    Alias {
        names: &[
            (H, "timeout client"),
            (H, "timeout http-keep-alive"),
            (N, "keepalive_timeout"),
            (N, "proxy_timeout"),
        ],
        within: &[],
        key: "idle",
        place: TIMEOUTS,
        note: "",
    },
    Alias {
        names: &[(H, "pool-purge-delay")],
        within: &[],
        key: "upstream_idle",
        place: TIMEOUTS,
        note: "",
    },
    Alias {
        names: &[(H, "timeout connect"), (N, "proxy_connect_timeout")],
        within: &[],
        key: "connect",
        place: TIMEOUTS,
        note: "",
    },
    Alias {
        names: &[(H, "timeout http-request"), (N, "client_header_timeout")],
        within: &[],
        key: "header_read",
        place: TIMEOUTS,
        note: "",
    },
    Alias {
        names: &[(H, "timeout queue")],
        within: &[],
        key: "queue",
        place: TIMEOUTS,
        note: "",
    },
    Alias {
        names: &[(H, "timeout tunnel")],
        within: &[],
        key: "tunnel_idle",
        place: TIMEOUTS,
        note: "",
    },
    Alias {
        names: &[(H, "hard-stop-after"), (H, "grace")],
        within: &[],
        key: "drain",
        place: TIMEOUTS,
        note: "",
    },
    // Sections.
    Alias {
        names: &[
            (H, "server"),
            (H, "servers"),
            (H, "backend"),
            (H, "backends"),
            (N, "upstream"),
            (N, "upstreams"),
        ],
        within: &[""],
        key: "nodes",
        place: "`[[nodes]]`",
        note: "a node is declared once (name, address without a port) and every listener reaches it",
    },
    Alias {
        names: &[(H, "frontend"), (H, "frontends"), (H, "listen"), (H, "bind")],
        within: &[""],
        key: "listeners",
        place: LISTENERS,
        note: "",
    },
    Alias {
        names: &[(H, "global"), (H, "defaults"), (H, "default-server")],
        within: &[""],
        key: "",
        place: "",
        note: "every key has a built-in default, and `limpet check` prints them all; checks, `fall` and `rise` are in `[health]`",
    },
    Alias {
        names: &[(H, "stats"), (H, "stats uri"), (H, "stats socket")],
        within: &[],
        key: "admin",
        place: "`[admin]`",
        note: "the admin listener serves the stats page, the API and /metrics",
    },
    Alias {
        names: &[(H, "nbthread"), (N, "worker_processes")],
        within: &[],
        key: "",
        place: "",
        note: "threads are a command-line option: `limpet run --threads N`",
    },
    // Addresses and ports.
    Alias {
        names: &[(N, "listen"), ("", "address"), ("", "port")],
        within: &["listeners"],
        key: "bind",
        place: LISTENERS,
        note: "`bind` is where limpet listens; `node_port` is the port it forwards to on every node",
    },
    Alias {
        names: &[(H, "addr")],
        within: &["nodes"],
        key: "address",
        place: "`[[nodes]]`",
        note: "",
    },
    Alias {
        names: &[(H, "bind")],
        within: &["admin"],
        key: "listen",
        place: "`[admin]`",
        note: "",
    },
    // TLS and PROXY protocol.
    Alias {
        names: &[(H, "ssl")],
        within: &["listeners"],
        key: "tls",
        place: LISTENERS,
        note: "`tls` is TLS to clients (`bind ... ssl crt`); `upstream_tls` is TLS to the nodes (`server ... ssl`)",
    },
    Alias {
        names: &[(N, "ssl_certificate")],
        within: &[],
        key: "cert",
        place: "`[listeners.tls]`",
        note: "",
    },
    Alias {
        names: &[(N, "ssl_certificate_key")],
        within: &[],
        key: "key",
        place: "`[listeners.tls]`",
        note: "",
    },
    Alias {
        names: &[(N, "proxy_ssl_verify")],
        within: &[],
        key: "verify",
        place: "`[listeners.upstream_tls]`",
        note: "`verify = \"none\"`, or `ca = \"ca.pem\"` to verify",
    },
    Alias {
        names: &[(H, "crt")],
        within: &[],
        key: "cert",
        place: "`[listeners.tls]`",
        note: "",
    },
    Alias {
        names: &[(H, "ca-file"), (N, "proxy_ssl_trusted_certificate")],
        within: &[],
        key: "ca",
        place: "`[listeners.upstream_tls]`",
        note: "",
    },
    Alias {
        names: &[(H, "sni"), (N, "proxy_ssl_name")],
        within: &[],
        key: "server_name",
        place: "`[listeners.upstream_tls]`",
        note: "",
    },
    Alias {
        names: &[(H, "verify")],
        within: &["listeners"],
        key: "verify",
        place: "`[listeners.upstream_tls]`",
        note: "",
    },
    Alias {
        names: &[(H, "send-proxy"), (H, "send-proxy-v2")],
        within: &[],
        key: "send",
        place: "`[listeners.proxy_protocol]`",
        note: "`send = \"v1\"` or `\"v2\"`",
    },
    Alias {
        names: &[(H, "accept-proxy"), (N, "set_real_ip_from")],
        within: &[],
        key: "accept_from",
        place: "`[listeners.proxy_protocol]`",
        note: "the peers whose PROXY header is read",
    },
    Alias {
        names: &[(H, "on-marked-down"), (H, "shutdown-sessions")],
        within: &[],
        key: "close_on_node_down",
        place: LISTENERS,
        note: "on by default for TCP listeners",
    },
];

/// `foo-Bar baz` -> `foo_bar_baz`: how names are compared.
fn normalize(s: &str) -> String {
    s.trim()
        .chars()
        .map(|c| match c {
            '-' | ' ' => '_',
            c => c.to_ascii_lowercase(),
        })
        .collect()
}

/// The table an error is in, from its key path: indices dropped, and the refused name
/// itself when it ends the path (`listeners[0].timeouts.server` -> `listeners.timeouts`).
/// An unknown name inside an inline table does not end the path (the path is the key holding
/// the table), so the whole path is the table.
pub(crate) fn table_of(key_path: &str, got: &str) -> String {
    let mut segs: Vec<String> = key_path
        .split('.')
        .filter(|s| !s.is_empty())
        .map(|s| s.split('[').next().unwrap_or(s).to_owned())
        .collect();
    if segs.last().is_some_and(|l| normalize(l) == normalize(got)) {
        segs.pop();
    }
    segs.join(".")
}

/// The hint for `got`, refused in `table`, whose known names are `expected`.
pub(crate) fn foreign_hint<'a>(
    got: &str,
    table: &str,
    mut expected: impl Iterator<Item = &'a str>,
) -> Option<String> {
    let g = normalize(got);
    // Inside `[listeners.timeouts]`, HAProxy's `timeout server` is written `server`.
    let matches = |n: &str| {
        let n = normalize(n);
        n == g || (table == "listeners.timeouts" && n.strip_prefix("timeout_") == Some(&g))
    };
    let (alias, (from, name)) = ALIASES.iter().find_map(|a| {
        let applies = a.within.is_empty() || a.within.contains(&table);
        let n = a.names.iter().find(|(_, n)| matches(n))?;
        applies.then_some((a, *n))
    })?;
    let whose = if from.is_empty() {
        format!("`{name}`")
    } else {
        format!("{from}'s `{name}`")
    };
    if alias.key.is_empty() && alias.place.is_empty() {
        return Some(format!("{whose}: {}", alias.note));
    }
    let key = if alias.key.is_empty() { got } else { alias.key };
    let mut out = if expected.any(|e| e == key) {
        if from.is_empty() {
            format!("did you mean `{key}`?")
        } else {
            format!("did you mean `{key}`? ({whose})")
        }
    } else if normalize(key) == g {
        format!("`{key}` goes in {}", alias.place)
    } else {
        format!("{whose} is `{key}` in {}", alias.place)
    };
    if !alias.note.is_empty() {
        out.push_str("; ");
        out.push_str(alias.note);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hint(got: &str, table: &str, expected: &[&str]) -> Option<String> {
        foreign_hint(got, table, expected.iter().copied())
    }

    #[test]
    fn tables_come_from_key_paths() {
        assert_eq!(
            table_of("listeners[1].timeouts.server", "server"),
            "listeners.timeouts"
        );
        assert_eq!(table_of("listeners[0].check", "inter"), "listeners.check");
        assert_eq!(table_of("inter", "inter"), "");
        assert_eq!(
            table_of("listeners[0].balance", "source"),
            "listeners.balance"
        );
    }

    #[test]
    fn the_same_table_gets_did_you_mean_and_others_get_the_place() {
        assert_eq!(
            hint("inter", "health", &["fall", "interval"]).as_deref(),
            Some("did you mean `interval`? (HAProxy's `inter`)")
        );
        assert_eq!(
            hint("inter", "listeners", &["name", "bind"]).as_deref(),
            Some("HAProxy's `inter` is `interval` in `[health]` (one setting for every node)")
        );
        assert_eq!(
            hint("error-limit", "health", &["fall", "max_slow_answers"]).as_deref(),
            Some(
                "did you mean `max_slow_answers`? (HAProxy's `error-limit`); connect failures \
                 and unanswered requests already count toward `fall`; this counts the requests \
                 that outlast `upstream_answer` while the node answers others"
            )
        );
        assert_eq!(
            hint("fall", "listeners", &["name"]).as_deref(),
            Some("`fall` goes in `[health]` (one setting for every node)")
        );
        assert_eq!(
            hint("timeout-server", "listeners", &["timeouts"]).as_deref(),
            Some("HAProxy's `timeout server` is `upstream_answer` in `[listeners.timeouts]`")
        );
        assert_eq!(
            hint("max_conns", "listeners", &["max_connections"]).as_deref(),
            Some("did you mean `max_connections`? (nginx's `max_conns`)")
        );
        assert_eq!(
            hint(
                "server",
                "listeners.timeouts",
                &["connect", "upstream_answer"]
            )
            .as_deref(),
            Some("did you mean `upstream_answer`? (HAProxy's `timeout server`)")
        );
        assert_eq!(
            hint(
                "pool_purge_delay",
                "listeners.timeouts",
                &["connect", "upstream_idle"]
            )
            .as_deref(),
            Some("did you mean `upstream_idle`? (HAProxy's `pool-purge-delay`)")
        );
        assert_eq!(
            hint("check-ssl", "listeners.check", &["kind", "tls"]).as_deref(),
            Some(
                "did you mean `tls`? (HAProxy's `check-ssl`); `tls = true` or `false`; unset, \
                 an `http` check runs over TLS at the node port of a listener with \
                 `upstream_tls`"
            )
        );
        assert!(
            hint("check-ssl", "listeners", &["name", "check"]).is_some_and(
                |h| h.starts_with("HAProxy's `check-ssl` is `tls` in a listener's `check`")
            )
        );
        assert!(hint("server", "listeners", &["name"]).is_none());
        assert!(hint("zzz", "", &["nodes"]).is_none());
    }
}
