//! Adapter for [tokio-tungstenite](::tokio_tungstenite) 0.24: the jar on the WebSocket
//! upgrade.
//!
//! The upgrade is a request to the session origin like any other (`ws`/`wss` are the origin of
//! `http`/`https`), so it carries the jar's cookies, and its answer is an answer of the origin,
//! so its cookies are adopted: from the 101 that opens the socket, and just as much from a
//! refused upgrade, which tungstenite returns as [`Error::Http`] carrying the non-101 answer.
//! A balancer that refuses the upgrade because the pinned node is down re-pins the client in
//! that refusal; adopting it is what lets the retry reach a healthy node.
//!
//! [`connect_async`] does all three around tokio-tungstenite's own `connect_async`; the
//! smaller helpers are for code that drives the handshake itself. For `wss`, enable one of
//! tokio-tungstenite's TLS features in the application, or this crate's `tungstenite-rustls`
//! feature and pass a rustls config of your own to [`connect_async_with_connector`] (its
//! roots, its crypto provider: the crate picks neither).
//!
//! ```no_run
//! use limpet_client::{classify, tungstenite, AffinityJar, Backoff, Origin, SharedJar, Verdict};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let jar = SharedJar::new(AffinityJar::new(Origin::parse("ws://print.example")?));
//! let mut backoff = Backoff::new();
//! let socket = loop {
//!     // Discovery first, before each attempt: an HTTP request to the origin through the
//!     // same jar (the `reqwest` adapter's store), so the socket opens on the node the
//!     // session's requests reach, under the pin that request may have rewritten.
//!     let attempt = tungstenite::connect_async(&jar, "ws://print.example/socket").await;
//!     match attempt {
//!         Ok((socket, _answer)) => break socket,
//!         // The refusal's cookies are already in the jar.
//!         Err(error) => match classify(tungstenite::outcome_of_error(&error)) {
//!             Verdict::RetryLater => tokio::time::sleep(backoff.next_delay()).await,
//!             Verdict::HandBack => return Err(error.into()),
//!             Verdict::AuthorisationWithdrawn => {
//!                 jar.clear();
//!                 return Err("sign in again".into());
//!             }
//!         },
//!     }
//! };
//! # drop(socket);
//! # Ok(())
//! # }
//! ```

use ::tokio_tungstenite::tungstenite::client::IntoClientRequest;
use ::tokio_tungstenite::tungstenite::handshake::client::{Request, Response};
use ::tokio_tungstenite::tungstenite::http::header::SET_COOKIE;
use ::tokio_tungstenite::tungstenite::http::{self, HeaderValue, Uri};
use ::tokio_tungstenite::tungstenite::Error;
use ::tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use tokio::net::TcpStream;

use crate::{Origin, Outcome, SharedJar};

/// The origin of a handshake request's URI (`ws://host:port/path`), if it has one.
pub fn origin_of(uri: &Uri) -> Option<Origin> {
    match Origin::parse(&uri.to_string()) {
        Ok(o) => Some(o),
        Err(error) => {
            tracing::debug!(%uri, %error, "upgrade URI has no web origin; jar not used");
            None
        }
    }
}

/// Puts the jar's cookies on an upgrade request, beside any `Cookie` header the application
/// already set (merged into one header; see [`AffinityJar::merge_cookie_header`]).
///
/// [`AffinityJar::merge_cookie_header`]: crate::AffinityJar::merge_cookie_header
pub fn apply_to_request(jar: &SharedJar, request: &mut Request) {
    let Some(to) = origin_of(request.uri()) else {
        return;
    };
    jar.apply_to_headers(&to, request.headers_mut());
}

/// Adopts the cookies of an upgrade answer (any status) to a request for `request_uri`.
pub fn adopt_from_response<B>(jar: &SharedJar, request_uri: &Uri, response: &http::Response<B>) {
    if let Some(from) = origin_of(request_uri) {
        let lines = response.headers().get_all(SET_COOKIE);
        jar.adopt_all(&from, lines.iter().map(HeaderValue::as_bytes));
    }
}

/// Adopts the cookies of a refused upgrade: [`Error::Http`] carries the non-101 answer.
/// Returns whether the error carried an answer at all.
pub fn adopt_from_error(jar: &SharedJar, request_uri: &Uri, error: &Error) -> bool {
    match error {
        Error::Http(response) => {
            adopt_from_response(jar, request_uri, response);
            true
        }
        _ => false,
    }
}

/// The [`Outcome`] of a failed upgrade, for [`classify`](crate::classify): a refusal with its
/// status, anything else (connection refused or dropped, TLS, a malformed handshake answer, an
/// unusable URL) as a transport failure. A successful upgrade is
/// `Outcome::UpgradeAnswered(101)`.
pub fn outcome_of_error(error: &Error) -> Outcome {
    match error {
        Error::Http(response) => Outcome::UpgradeAnswered(response.status().as_u16()),
        _ => Outcome::UpgradeTransportFailed,
    }
}

/// tokio-tungstenite's `connect_async` with the jar: its cookies go on the upgrade, and the
/// answer's cookies are adopted whether the upgrade was accepted or refused. Errors are
/// tungstenite's, unchanged (classify them with [`outcome_of_error`]).
pub async fn connect_async<R>(
    jar: &SharedJar,
    request: R,
) -> Result<(WebSocketStream<MaybeTlsStream<TcpStream>>, Response), Error>
where
    R: IntoClientRequest + Unpin,
{
    let mut request = request.into_client_request()?;
    apply_to_request(jar, &mut request);
    let uri = request.uri().clone();
    let result = ::tokio_tungstenite::connect_async(request).await;
    adopt_result(jar, &uri, &result);
    result
}

/// Adopts the cookies of an upgrade's result, accepted or refused.
fn adopt_result<S>(jar: &SharedJar, uri: &Uri, result: &Result<(S, Response), Error>) {
    match result {
        Ok((_, response)) => adopt_from_response(jar, uri, response),
        Err(error) => {
            adopt_from_error(jar, uri, error);
        }
    }
}

/// [`connect_async`] through a TLS connector of the caller's: for `wss://`, typically
/// `Connector::Rustls(Arc<rustls::ClientConfig>)` with the application's own roots (a private
/// CA, say) and crypto provider. `None` is tokio-tungstenite's default connector. The jar is
/// used exactly as by [`connect_async`]. Needs the `tungstenite-rustls` feature.
///
/// ```no_run
/// use std::sync::Arc;
/// use limpet_client::{tungstenite, AffinityJar, Origin, SharedJar};
/// use tokio_tungstenite::Connector;
///
/// # async fn run(tls: Arc<rustls::ClientConfig>) -> Result<(), Box<dyn std::error::Error>> {
/// let jar = SharedJar::new(AffinityJar::new(Origin::parse("wss://print.example")?));
/// let url = "wss://print.example/socket";
/// let connector = Some(Connector::Rustls(tls));
/// let (socket, _answer) = tungstenite::connect_async_with_connector(&jar, url, connector).await?;
/// # drop(socket);
/// # Ok(())
/// # }
/// ```
#[cfg(feature = "tungstenite-rustls")]
pub async fn connect_async_with_connector<R>(
    jar: &SharedJar,
    request: R,
    connector: Option<::tokio_tungstenite::Connector>,
) -> Result<(WebSocketStream<MaybeTlsStream<TcpStream>>, Response), Error>
where
    R: IntoClientRequest + Unpin,
{
    connect_async_with_config(jar, request, None, connector).await
}

/// [`connect_async_with_connector`] with tungstenite's settings of the caller's (`config`:
/// the largest message and frame the socket takes, say; `None` is tungstenite's defaults,
/// 64 MiB messages). Needs the `tungstenite-rustls` feature.
#[cfg(feature = "tungstenite-rustls")]
pub async fn connect_async_with_config<R>(
    jar: &SharedJar,
    request: R,
    config: Option<::tokio_tungstenite::tungstenite::protocol::WebSocketConfig>,
    connector: Option<::tokio_tungstenite::Connector>,
) -> Result<(WebSocketStream<MaybeTlsStream<TcpStream>>, Response), Error>
where
    R: IntoClientRequest + Unpin,
{
    let mut request = request.into_client_request()?;
    apply_to_request(jar, &mut request);
    let uri = request.uri().clone();
    let result =
        ::tokio_tungstenite::connect_async_tls_with_config(request, config, false, connector).await;
    adopt_result(jar, &uri, &result);
    result
}
