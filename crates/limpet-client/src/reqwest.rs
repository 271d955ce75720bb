//! Adapter for [reqwest] 0.12: a [`CookieStore`] that keeps only the balancer's cookies.
//!
//! Install it with [`ClientBuilder::cookie_provider`](::reqwest::ClientBuilder::cookie_provider).
//! reqwest then hands it every answer's `Set-Cookie` lines (whatever the status) and asks it for
//! the `Cookie` header of every request. Cookies of other names are dropped: the application
//! keeps its own cookies itself.
//!
//! **One trap.** reqwest consults the store only when the request has no `Cookie` header of
//! its own. An application that sets `Cookie` by hand (its session cookie, say) must pass the
//! built request through [`AffinityCookieStore::attach`], which merges the jar's cookies into
//! that header; otherwise the pin is silently lost, which is the very failure this crate exists
//! to prevent. That includes a `Cookie` put in the client's `default_headers`: reqwest adds
//! those after `attach` ran and only where the request has none, so the store is never asked
//! (the pin lost) and, once `attach` has put the pin there, the default is dropped (the
//! application's cookie lost). Set the application's cookie on each request instead.
//!
//! **And its redirects.** A request given a `Cookie` header (by hand or by `attach`) sends
//! that header on every hop of a redirect reqwest follows, and reqwest does not ask the store
//! again: a pin the redirect's answer rewrote (a balancer moving the session, or expiring
//! its cookie) is not what the next hop carries. Send such requests with a client built with
//! `redirect(reqwest::redirect::Policy::none())` and follow a redirect as a new request,
//! attached again. Requests without a `Cookie` of their own are best left to the store, which
//! reqwest asks on every hop.
//!
//! ```no_run
//! use std::sync::Arc;
//! use limpet_client::{reqwest::AffinityCookieStore, AffinityJar, Origin, SharedJar};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let origin = Origin::parse("https://print.example")?;
//! let jar = SharedJar::new(AffinityJar::new(origin));
//! let store = Arc::new(AffinityCookieStore::new(jar.clone()));
//! let client = reqwest::Client::builder().cookie_provider(Arc::clone(&store)).build()?;
//!
//! // Cookies are adopted and sent by reqwest itself, on every hop of a redirect too.
//! client.get("https://print.example/api/discovery").send().await?;
//!
//! // With a Cookie header of the application's own, attach the jar explicitly, on a client
//! // that does not follow redirects (see above).
//! let attached = reqwest::Client::builder()
//!     .cookie_provider(Arc::clone(&store))
//!     .redirect(reqwest::redirect::Policy::none())
//!     .build()?;
//! let mut request = attached
//!     .post("https://print.example/api/jobs/7/claim")
//!     .header(reqwest::header::COOKIE, "sid=s3cr3t")
//!     .build()?;
//! store.attach(&mut request);
//! let answer = attached.execute(request).await?;
//! # let _ = answer;
//! # Ok(())
//! # }
//! ```

use ::reqwest::cookie::CookieStore;
use ::reqwest::header::HeaderValue;
use ::reqwest::Url;

use crate::{Origin, Outcome, SharedJar};

/// A `reqwest` cookie store over a [`SharedJar`]; the origin is the jar's, fixed when the jar
/// was made.
#[derive(Clone, Debug)]
pub struct AffinityCookieStore {
    jar: SharedJar,
}

impl AffinityCookieStore {
    /// A store over `jar` (clone the [`SharedJar`] first to share it with a WebSocket).
    pub fn new(jar: SharedJar) -> Self {
        AffinityCookieStore { jar }
    }

    /// The jar.
    pub fn jar(&self) -> &SharedJar {
        &self.jar
    }

    /// The `Cookie` header for a request to `url` that carries the application's cookies
    /// `app_cookies`: those, plus the jar's when `url` is the jar's origin.
    pub fn cookie_header_with(&self, url: &Url, app_cookies: Option<&str>) -> Option<HeaderValue> {
        let to = match Origin::from_url(url) {
            Ok(o) => o,
            // Not an http(s) URL: nothing of ours to send; the application's cookies go as-is.
            Err(_) => return app_cookies.and_then(|c| HeaderValue::from_str(c).ok()),
        };
        let merged = self
            .jar
            .merge_cookie_lines(&to, app_cookies.map(str::as_bytes))?;
        HeaderValue::from_bytes(&merged).ok()
    }

    /// Merges the jar's cookies into a built request's `Cookie` header(s), leaving one header.
    /// Use it for requests that carry a `Cookie` header of the application's own (see the
    /// module docs). On others it only takes the store out of the request's redirect hops,
    /// which then carry the pin as it was (the module docs, "And its redirects").
    pub fn attach(&self, request: &mut ::reqwest::Request) {
        let Ok(to) = Origin::from_url(request.url()) else {
            return;
        };
        self.jar.apply_to_headers(&to, request.headers_mut());
    }
}

impl CookieStore for AffinityCookieStore {
    fn set_cookies(&self, cookie_headers: &mut dyn Iterator<Item = &HeaderValue>, url: &Url) {
        match Origin::from_url(url) {
            Ok(from) => self
                .jar
                .adopt_all(&from, cookie_headers.map(HeaderValue::as_bytes)),
            Err(error) => tracing::debug!(%url, %error, "Set-Cookie from a non-web URL ignored"),
        }
    }

    fn cookies(&self, url: &Url) -> Option<HeaderValue> {
        self.cookie_header_with(url, None)
    }
}

/// The [`Outcome`] of a failed request, for [`classify`](crate::classify): an error that
/// carries a status (from `error_for_status`) is an answer; any other (connect, reset, timeout,
/// body) is a transport failure. A request that got an answer is
/// `Outcome::RequestAnswered(response.status().as_u16())`.
pub fn outcome_of_error(error: &::reqwest::Error) -> Outcome {
    match error.status() {
        Some(status) => Outcome::RequestAnswered(status.as_u16()),
        None => Outcome::RequestTransportFailed,
    }
}
