//! One probe of one kind against one address, bounded by a timeout. Never panics on what the
//! node sends: every failure becomes a [`CheckDetail`] with an error.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Empty;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_rustls::client::TlsStream;

use limpet_core::proxy_protocol;

use super::{CheckDetail, CheckKind, HttpCheck, TlsCheck};

/// Runs one check and reports its outcome. With `proxy`, the connection opens with a PROXY
/// header naming no client (v1 `UNKNOWN`, v2 `LOCAL`), as the listener's own connections to
/// the port open with one: a node that requires it closes any connection without it.
pub async fn probe(
    kind: &CheckKind,
    addr: SocketAddr,
    timeout: Duration,
    proxy: Option<proxy_protocol::Version>,
) -> CheckDetail {
    let started = Instant::now();
    let result = tokio::time::timeout(timeout, async {
        let stream = connect(addr, proxy).await?;
        match kind {
            CheckKind::Tcp => Ok(None),
            CheckKind::Http(h) => http(stream, addr, h).await.map(Some),
            CheckKind::Tls(t) => handshake(stream, t).await.map(|_| None),
        }
    })
    .await;
    let duration_ms = started.elapsed().as_millis() as u64;
    let (ok, error, status) = match result {
        Ok(Ok(status)) => (true, None, status),
        Ok(Err(Failure { error, status })) => (false, Some(error), status),
        Err(_) => (
            false,
            Some(format!("timeout after {} ms", timeout.as_millis())),
            None,
        ),
    };
    CheckDetail {
        kind: kind.as_str(),
        ok,
        error,
        status,
        duration_ms,
    }
}

struct Failure {
    error: String,
    status: Option<u16>,
}

/// The prefix of a probe error that limpet caused itself (out of file descriptors): the
/// check loop records no verdict on the node for it.
pub(crate) const LOCAL_FAILURE: &str = "limpet out of file descriptors";

/// How a check's error starts when no local port was free for its connect: no verdict on the
/// node either.
pub(crate) const NO_LOCAL_PORT: &str = "limpet out of local ports";

impl Failure {
    fn new(error: String) -> Self {
        Failure {
            error,
            status: None,
        }
    }
}

async fn connect(
    addr: SocketAddr,
    proxy: Option<proxy_protocol::Version>,
) -> Result<TcpStream, Failure> {
    let mut s = TcpStream::connect(addr).await.map_err(|e| {
        if crate::error::out_of_fds(&e) {
            Failure::new(format!("{LOCAL_FAILURE}: {e}"))
        } else if crate::error::no_local_port(&e) {
            Failure::new(format!("{NO_LOCAL_PORT}: {e}"))
        } else {
            Failure::new(format!("connect: {e}"))
        }
    })?;
    let _ = s.set_nodelay(true);
    if let Some(v) = proxy {
        let mut header = Vec::with_capacity(16);
        proxy_protocol::write_local(v, &mut header);
        tokio::io::AsyncWriteExt::write_all(&mut s, &header)
            .await
            .map_err(|e| Failure::new(format!("PROXY header: {e}")))?;
    }
    Ok(s)
}

async fn http(stream: TcpStream, addr: SocketAddr, check: &HttpCheck) -> Result<u16, Failure> {
    match &check.tls {
        Some(tls) => request(handshake(stream, tls).await?, addr, check).await,
        None => request(stream, addr, check).await,
    }
}

/// The check's one request over `stream` (plain or TLS), and its answer's status.
async fn request<S>(stream: S, addr: SocketAddr, check: &HttpCheck) -> Result<u16, Failure>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| Failure::new(format!("http: {e}")))?;
    let conn = tokio::spawn(conn);
    let host = check.host.clone().unwrap_or_else(|| addr.to_string());
    let req = http::Request::builder()
        .method(check.method.clone())
        .uri(check.path.as_str())
        .header(http::header::HOST, host)
        .header(http::header::USER_AGENT, "limpet-check")
        .header(http::header::CONNECTION, "close")
        .body(Empty::<Bytes>::new())
        .map_err(|e| Failure::new(format!("http request: {e}")))?;
    let result = sender.send_request(req).await;
    // The answer's status is all a check needs; the body is not read.
    conn.abort();
    let resp = result.map_err(|e| Failure::new(format!("http: {e}")))?;
    let status = resp.status().as_u16();
    if check.expect.contains(status) {
        Ok(status)
    } else {
        Err(Failure {
            error: format!("status {status} not in {}", check.expect),
            status: Some(status),
        })
    }
}

/// A TLS handshake over `stream`, verified as `check` says.
async fn handshake(stream: TcpStream, check: &TlsCheck) -> Result<TlsStream<TcpStream>, Failure> {
    let connector = tokio_rustls::TlsConnector::from(Arc::clone(&check.config));
    connector
        .connect(check.server_name.clone(), stream)
        .await
        .map_err(|e| Failure::new(format!("tls: {e}")))
}

/// A client config that completes handshakes without verifying the node's certificate (the
/// reference's `ssl verify none`): the check then proves the node speaks TLS, not who it is.
/// The same verifier as upstream TLS with `verify = "none"`.
pub fn insecure_tls_config() -> Result<Arc<rustls::ClientConfig>, crate::tls::TlsError> {
    crate::tls::client_config(crate::tls::UpstreamVerify::None, &[]).map(Arc::new)
}
