//! The affinity jar: a sans-io, single-origin, memory-only store of balancer cookies.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

use crate::names::CookieNames;
use crate::origin::Origin;
use crate::set_cookie::{trim, Expiry, SetCookie, SetCookieError};

/// At most this many balancer cookies are held; a new name beyond it is ignored.
pub const MAX_COOKIES: usize = 8;
/// A value longer than this (in characters, which are bytes: values are ASCII) is ignored.
pub const MAX_VALUE_LEN: usize = 4096;

/// One balancer cookie the jar holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldCookie {
    name: String,
    value: String,
    secure: bool,
    expires: Option<SystemTime>,
}

impl HeldCookie {
    /// The cookie's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The value, sent back verbatim.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// Whether it was set with `Secure` (only possible on an `https`/`wss` origin).
    pub fn secure(&self) -> bool {
        self.secure
    }

    /// When it expires; `None` for a session cookie.
    pub fn expires(&self) -> Option<SystemTime> {
        self.expires
    }

    fn is_live(&self, now: SystemTime) -> bool {
        self.expires.is_none_or(|t| now < t)
    }
}

/// What [`AffinityJar::adopt`] did with one `Set-Cookie` line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Adoption {
    /// A new balancer cookie is now held.
    Stored,
    /// A held cookie of that name was rewritten (value, `Secure` and expiry replaced).
    Replaced,
    /// The balancer expired a held cookie; it is gone.
    Removed,
    /// Nothing changed, for this reason.
    Ignored(Ignored),
}

/// Why a `Set-Cookie` line left the jar unchanged. None of these is an error: a balancer and
/// an application add cookies freely, and no cookie makes an answer invalid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ignored {
    /// The answer came from another origin than the jar's.
    OtherOrigin,
    /// The line is not a well-formed cookie.
    Malformed(SetCookieError),
    /// The name matches no balancer pattern: the application's cookie, not ours.
    NotBalancerCookie,
    /// `Secure` on an `http`/`ws` origin.
    SecureOverInsecure,
    /// `Path` other than `/`.
    PathNotRoot,
    /// `Domain` that the origin's host does not domain-match.
    DomainMismatch,
    /// Value longer than [`MAX_VALUE_LEN`] (and not a deletion). A held cookie of that name is
    /// kept unchanged.
    ValueTooLong,
    /// [`MAX_COOKIES`] are held already and this is a new name.
    JarFull,
    /// Already expired, and no cookie of that name was held: nothing to remove.
    ExpiredNotHeld,
}

/// The affinity jar for one session origin.
///
/// Sans-io: it is fed `Set-Cookie` lines with the origin they came from and the current time,
/// and asked for the `Cookie` header to send to an origin at a given time. It never reads a
/// clock, never touches the network and never persists anything.
///
/// # Rules (where RFC 6265 leaves room, the choice made here)
/// - **Names**: only names matching the configured [`CookieNames`] (case-sensitive) are kept;
///   every other cookie is ignored and never affects anything.
/// - **Origin**: answers from any other origin (scheme, host or port) are ignored; cookies are
///   only ever sent to the jar's origin. `ws`/`wss` count as `http`/`https`.
/// - **Path**: `Path=/` or no usable `Path` (absent, empty, not starting with `/`) is accepted
///   and the cookie is sent on every path; any other `Path` (`/x`, `/x/`, `/api`) is ignored.
///   RFC 6265 would scope a Path-less cookie to the request's directory; balancers set their
///   cookie for the whole origin (limpet, ALB and HAProxy all send `Path=/`), so the jar does
///   too rather than lose the pin on another path.
/// - **Domain**: absent, or one the origin host domain-matches (equal, or a parent domain
///   when the host is a name; `Domain=example.com` is accepted from `app.example.com`).
///   Either way the cookie stays host-only: it is never sent to a sibling host.
/// - **Value**: RFC 6265 cookie-octets (optionally in double quotes, which are kept and count
///   towards the length), at most [`MAX_VALUE_LEN`] characters. An empty value is kept. The
///   length bound does not apply to a deletion (an expired cookie), which stores nothing.
/// - **Secure**: refused from an `http` origin; a `Secure` cookie is only sent to `https`.
/// - **Rewrite**: a valid line for a held name replaces value, `Secure` and expiry, keeping the
///   cookie's place in the header. An invalid rewrite (too long, wrong path, ...) is ignored and
///   the held cookie stays.
/// - **Expiry**: `Max-Age <= 0`, or (without `Max-Age`) an `Expires` at or before `now`,
///   removes a held cookie. `Max-Age` wins over `Expires`. A held cookie past its expiry is not
///   sent, and is purged when a cookie of a new name is stored (or by [`remove_expired`](Self::remove_expired)).
/// - **Count**: at most [`MAX_COOKIES`]; a new name beyond that is ignored, rewrites and
///   removals of held names still apply.
/// - `HttpOnly` and `SameSite` are parsed and have no effect: this is not a browser.
#[derive(Clone, Debug)]
pub struct AffinityJar {
    origin: Origin,
    names: CookieNames,
    cookies: Vec<HeldCookie>,
}

impl AffinityJar {
    /// An empty jar for `origin` keeping the default names (`route`, `route-home`, `AWSALB*`, `AWSELB`, `SERVERID`).
    pub fn new(origin: Origin) -> Self {
        Self::with_names(origin, CookieNames::default())
    }

    /// An empty jar for `origin` keeping exactly `names`.
    pub fn with_names(origin: Origin, names: CookieNames) -> Self {
        AffinityJar {
            origin,
            names,
            cookies: Vec::new(),
        }
    }

    /// The session origin.
    pub fn origin(&self) -> &Origin {
        &self.origin
    }

    /// The configured names.
    pub fn names(&self) -> &CookieNames {
        &self.names
    }

    /// Takes one `Set-Cookie` header value from an answer of `from`, received at `now`.
    ///
    /// Call it for every `Set-Cookie` of every answer, whatever the status: a refused upgrade
    /// (e.g. 503) carries the balancer's re-pin as much as a 200 or a 101 does. Lines that are
    /// out of bounds are ignored and logged at debug level (names only, never values).
    pub fn adopt(&mut self, from: &Origin, set_cookie: &[u8], now: SystemTime) -> Adoption {
        let adoption = self.adopt_inner(from, set_cookie, now);
        match adoption {
            Adoption::Ignored(Ignored::NotBalancerCookie | Ignored::ExpiredNotHeld) => {
                tracing::trace!(origin = %self.origin, ?adoption, "Set-Cookie left alone");
            }
            // Field expressions only run when the level is enabled, so the re-parse for the
            // name costs nothing in production.
            Adoption::Ignored(reason) => {
                tracing::debug!(
                    origin = %self.origin,
                    from = %from,
                    name = SetCookie::parse(set_cookie).map(|c| c.name()).unwrap_or(""),
                    ?reason,
                    "balancer cookie ignored"
                );
            }
            Adoption::Stored | Adoption::Replaced | Adoption::Removed => {
                tracing::trace!(
                    origin = %self.origin,
                    name = SetCookie::parse(set_cookie).map(|c| c.name()).unwrap_or(""),
                    ?adoption,
                    "balancer cookie"
                );
            }
        }
        self.check_invariants();
        adoption
    }

    /// [`adopt`](Self::adopt) for each line of one answer.
    pub fn adopt_all<'a>(
        &mut self,
        from: &Origin,
        set_cookies: impl IntoIterator<Item = &'a [u8]>,
        now: SystemTime,
    ) {
        for line in set_cookies {
            self.adopt(from, line, now);
        }
    }

    fn adopt_inner(&mut self, from: &Origin, line: &[u8], now: SystemTime) -> Adoption {
        use Adoption::Ignored as No;
        if *from != self.origin {
            return No(Ignored::OtherOrigin);
        }
        let cookie = match SetCookie::parse(line) {
            Ok(c) => c,
            Err(e) => return No(Ignored::Malformed(e)),
        };
        if !self.names.matches(cookie.name()) {
            return No(Ignored::NotBalancerCookie);
        }
        if cookie.secure() && !self.origin.is_secure() {
            return No(Ignored::SecureOverInsecure);
        }
        if cookie.path().is_some_and(|p| p != "/") {
            return No(Ignored::PathNotRoot);
        }
        if cookie
            .domain()
            .is_some_and(|d| !self.origin.domain_matches(d))
        {
            return No(Ignored::DomainMismatch);
        }
        let held = self.cookies.iter().position(|c| c.name == cookie.name());
        let expires = match cookie.expiry(now) {
            Expiry::Expired => {
                return match held {
                    Some(i) => {
                        self.cookies.remove(i);
                        Adoption::Removed
                    }
                    None => No(Ignored::ExpiredNotHeld),
                };
            }
            Expiry::At(t) => Some(t),
            Expiry::Session => None,
        };
        // Checked after expiry on purpose: the length bound is about what is held and sent,
        // and a deletion holds nothing, so the balancer can always expire its cookie.
        if cookie.value().len() > MAX_VALUE_LEN {
            return No(Ignored::ValueTooLong);
        }
        if let Some(i) = held {
            let c = &mut self.cookies[i];
            cookie.value().clone_into(&mut c.value);
            c.secure = cookie.secure();
            c.expires = expires;
            return Adoption::Replaced;
        }
        // A cookie that lapsed on its own must not take a slot from a new one.
        self.remove_expired(now);
        if self.cookies.len() >= MAX_COOKIES {
            return No(Ignored::JarFull);
        }
        self.cookies.push(HeldCookie {
            name: cookie.name().to_owned(),
            value: cookie.value().to_owned(),
            secure: cookie.secure(),
            expires,
        });
        Adoption::Stored
    }

    /// The held cookies still valid at `now`, oldest first.
    pub fn cookies(&self, now: SystemTime) -> impl Iterator<Item = &HeldCookie> + '_ {
        self.cookies.iter().filter(move |c| c.is_live(now))
    }

    /// The value of the held cookie `name`, if valid at `now`.
    pub fn get(&self, name: &str, now: SystemTime) -> Option<&str> {
        self.cookies(now)
            .find(|c| c.name == name)
            .map(|c| c.value.as_str())
    }

    /// The cookies to send to `to` at `now`: the jar's own cookies if `to` is the jar's origin
    /// (minus `Secure` ones when `to` is not secure, which cannot differ today as the scheme is
    /// part of the origin, but is checked so that it never can), none otherwise.
    fn to_send<'s>(&'s self, to: &Origin, now: SystemTime) -> impl Iterator<Item = &'s HeldCookie> {
        let same_origin = *to == self.origin;
        let secure = to.is_secure();
        self.cookies(now)
            .filter(move |c| same_origin && (secure || !c.secure))
    }

    /// The `Cookie` header value holding only the jar's cookies for `to`, e.g.
    /// `route=n1; AWSALB=abc`; `None` when there is nothing to send.
    pub fn cookie_header(&self, to: &Origin, now: SystemTime) -> Option<String> {
        self.merge_cookie_header(to, None, now)
    }

    /// The `Cookie` header value for a request to `to` that already carries the application's
    /// cookies `existing` (a `Cookie` header value, or `None`): the application's pairs in their
    /// order, then the jar's. An application pair with the same name as a cookie the jar sends
    /// is dropped, because the balancer's latest value is the one that counts and a server
    /// reading the first `route` would otherwise see a stale copy. `None` when the result is
    /// empty. For another origin, `existing` comes back with only its spacing normalised.
    pub fn merge_cookie_header(
        &self,
        to: &Origin,
        existing: Option<&str>,
        now: SystemTime,
    ) -> Option<String> {
        let merged = self.merge_cookie_lines(to, existing.map(str::as_bytes), now)?;
        // Only whole `;`-separated pieces of valid UTF-8 input and ASCII cookies were joined.
        Some(
            String::from_utf8(merged)
                .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
        )
    }

    /// [`merge_cookie_header`](Self::merge_cookie_header) over raw header bytes, for any number
    /// of `Cookie` header lines (HTTP/2 splits one into many; a request may carry several). The
    /// result is one line, as RFC 6265 §5.4 requires of a client.
    pub fn merge_cookie_lines<'a>(
        &self,
        to: &Origin,
        existing: impl IntoIterator<Item = &'a [u8]>,
        now: SystemTime,
    ) -> Option<Vec<u8>> {
        let ours: Vec<&HeldCookie> = self.to_send(to, now).collect();
        let mut out = Vec::new();
        let mut push = |pair: &[u8]| {
            if !out.is_empty() {
                out.extend_from_slice(b"; ");
            }
            out.extend_from_slice(pair);
        };
        for line in existing {
            for pair in line.split(|&b| b == b';') {
                let pair = trim(pair);
                if pair.is_empty() {
                    continue;
                }
                let name = trim(pair.split(|&b| b == b'=').next().unwrap_or_default());
                if ours.iter().any(|c| c.name.as_bytes() == name) {
                    continue;
                }
                push(pair);
            }
        }
        for c in &ours {
            push(format!("{}={}", c.name, c.value).as_bytes());
        }
        (!out.is_empty()).then_some(out)
    }

    /// Drops every cookie whose expiry is at or before `now`.
    pub fn remove_expired(&mut self, now: SystemTime) {
        self.cookies.retain(|c| c.is_live(now));
        self.check_invariants();
    }

    /// Forgets every cookie, e.g. when the session ends (authorisation withdrawn): the next
    /// answer pins the client afresh.
    pub fn clear(&mut self) {
        self.cookies.clear();
    }

    /// How many cookies are held (expired ones not yet purged included).
    pub fn len(&self) -> usize {
        self.cookies.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.cookies.is_empty()
    }

    fn check_invariants(&self) {
        debug_assert!(
            self.cookies.len() <= MAX_COOKIES,
            "jar holds {} cookies, more than {MAX_COOKIES}",
            self.cookies.len()
        );
        for (i, c) in self.cookies.iter().enumerate() {
            debug_assert!(
                self.names.matches(&c.name),
                "held non-balancer cookie {}",
                c.name
            );
            debug_assert!(
                c.value.len() <= MAX_VALUE_LEN,
                "held oversize value of {}",
                c.name
            );
            debug_assert!(
                !c.secure || self.origin.is_secure(),
                "held Secure cookie {} on an insecure origin",
                c.name
            );
            debug_assert!(
                self.cookies[..i].iter().all(|o| o.name != c.name),
                "cookie {} held twice",
                c.name
            );
        }
    }
}

/// A jar shared between clients (an HTTP client and a WebSocket, say) with the clock they use.
///
/// The adapters take this. The clock is the only place time enters; tests pass their own.
/// The lock is a std `Mutex` held only for the few microseconds of one jar call, never across
/// an await.
#[derive(Clone)]
pub struct SharedJar {
    jar: Arc<Mutex<AffinityJar>>,
    clock: Arc<dyn Fn() -> SystemTime + Send + Sync>,
}

impl fmt::Debug for SharedJar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedJar")
            .field("jar", &self.jar)
            .finish_non_exhaustive()
    }
}

impl SharedJar {
    /// Shares `jar`, reading time from [`SystemTime::now`].
    pub fn new(jar: AffinityJar) -> Self {
        Self::with_clock(jar, SystemTime::now)
    }

    /// Shares `jar`, reading time from `clock`.
    pub fn with_clock(
        jar: AffinityJar,
        clock: impl Fn() -> SystemTime + Send + Sync + 'static,
    ) -> Self {
        SharedJar {
            jar: Arc::new(Mutex::new(jar)),
            clock: Arc::new(clock),
        }
    }

    /// The current time by this jar's clock.
    pub fn now(&self) -> SystemTime {
        (self.clock)()
    }

    /// The jar itself, for anything the helpers below do not cover.
    ///
    /// A panic while the lock was held cannot have left the jar half-updated (each method
    /// leaves it consistent before it can panic), so a poisoned lock is simply taken over.
    pub fn lock(&self) -> MutexGuard<'_, AffinityJar> {
        self.jar.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The session origin.
    pub fn origin(&self) -> Origin {
        self.lock().origin().clone()
    }

    /// [`AffinityJar::adopt_all`] at the clock's `now`.
    pub fn adopt_all<'a>(&self, from: &Origin, set_cookies: impl IntoIterator<Item = &'a [u8]>) {
        let now = self.now();
        self.lock().adopt_all(from, set_cookies, now);
    }

    /// [`AffinityJar::cookie_header`] at the clock's `now`.
    pub fn cookie_header(&self, to: &Origin) -> Option<String> {
        let now = self.now();
        self.lock().cookie_header(to, now)
    }

    /// [`AffinityJar::merge_cookie_header`] at the clock's `now`.
    pub fn merge_cookie_header(&self, to: &Origin, existing: Option<&str>) -> Option<String> {
        let now = self.now();
        self.lock().merge_cookie_header(to, existing, now)
    }

    /// Merges the jar's cookies for `to` into a request's `Cookie` header(s), leaving one
    /// header, or none when there is nothing to send. The one merge both adapters use.
    #[cfg(any(feature = "reqwest", feature = "tungstenite"))]
    pub(crate) fn apply_to_headers(&self, to: &Origin, headers: &mut http::HeaderMap) {
        use http::header::{HeaderValue, COOKIE};
        let merged = self.merge_cookie_lines(
            to,
            headers.get_all(COOKIE).iter().map(HeaderValue::as_bytes),
        );
        match merged.map(|m| HeaderValue::from_bytes(&m)) {
            Some(Ok(value)) => {
                headers.insert(COOKIE, value);
            }
            // Nothing to send: drop the empty header(s) the application may have left.
            None => {
                headers.remove(COOKIE);
            }
            // Only pieces of valid header values and ASCII cookies were joined; should that
            // ever fail, the application's header is better kept than lost.
            Some(Err(_)) => tracing::debug!("merged Cookie header invalid; request unchanged"),
        }
    }

    /// [`AffinityJar::merge_cookie_lines`] at the clock's `now`.
    pub fn merge_cookie_lines<'a>(
        &self,
        to: &Origin,
        existing: impl IntoIterator<Item = &'a [u8]>,
    ) -> Option<Vec<u8>> {
        let now = self.now();
        self.lock().merge_cookie_lines(to, existing, now)
    }

    /// The value of the held cookie `name`, if valid now.
    pub fn get(&self, name: &str) -> Option<String> {
        let now = self.now();
        self.lock().get(name, now).map(str::to_owned)
    }

    /// [`AffinityJar::clear`].
    pub fn clear(&self) {
        self.lock().clear();
    }
}

#[cfg(test)]
mod tests;
