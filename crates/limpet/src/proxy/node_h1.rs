//! HTTP/1.1 to a node, driven from the request's own task: the path of bodiless, replayable
//! requests (GET, HEAD, OPTIONS, PUT/DELETE without a body; not an upgrade) to plaintext nodes,
//! which is most of the traffic a session-affinity balancer carries.
//!
//! hyper's client runs each node connection as a task of its own: the request crosses a
//! channel to it, the answer head comes back through a oneshot, the body through another
//! channel, and putting the connection back in the pool takes one more task. Here the
//! request's task writes the head and reads the answer head itself, and the answer body reads
//! the node's socket when hyper polls it for the client (the same task); at the body's end the
//! connection goes straight back to its pool. Request bodies (which must be written while the
//! answer may already be coming), upgrades and TLS to nodes stay on hyper's client
//! (`super::upstream`).
//!
//! ```text
//!  checkout (stale check from tokio's readiness: no syscall) ─► head written (one write)
//!     ─► answer head read (httparse; 1xx skipped) ─► framing (RFC 9112 6.3)
//!     ─► NodeBody: none | Content-Length | chunked (+ trailers) | until close
//!     ─► at its end, keep-alive and nothing more read: back on the idle stack
//! ```
//!
//! Strictness follows hyper's client: a malformed head, a bad or conflicting `Content-Length`,
//! a malformed chunk is a protocol error (502, or the answer cut), never a guess.

use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Response, StatusCode, Version};
use hyper::body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::body::BoxError;
use super::headers::{lists_only_hop_names, Forwarding};
use super::upstream::NodeConns;
use crate::error::{Cause, Stage, UpstreamError};
use crate::relay::WriteDeadline;

/// The largest answer head (and chunk-size line, and trailer section) accepted: hyper's
/// client's limit (its default `max_buf_size`), so both paths to a node take the same heads.
const MAX_HEAD: usize = 400 * 1024;
/// The most header fields in an answer head (hyper's default).
const MAX_HEADERS: usize = 100;
/// Bytes asked of the socket per read.
const READ_CHUNK: usize = 16 * 1024;

/// A plaintext HTTP/1.1 connection to a node, with its read buffer.
pub(crate) struct H1Conn {
    io: WriteDeadline<TcpStream>,
    /// `buf[start..end]` is read and not yet consumed.
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// The request head being written (kept for its capacity).
    out: Vec<u8>,
    /// The header names of this connection's last answer.
    names: NameCache,
}

/// The most header names a [`NameCache`] keeps: a node's usual answer has about ten.
const NAMES_CACHED: usize = 32;
/// The longest name a [`NameCache`] keeps (the usual ones are under 32 bytes): a node that
/// sends long names gets them parsed each time, and cannot make an idle connection hold
/// them.
const NAME_CACHED_MAX: usize = 64;

/// The header names of a connection's last answer, by position. A node sends the same names
/// in the same order answer after answer, so a name whose bytes are those at its position
/// last time is that same name: cloned from here after a byte comparison, where
/// `HeaderName::from_bytes` validates, lowercases and, for a name the `http` crate does not
/// know (`X-Backend`), allocates (callgrind: about 200 instructions a field, a fifth of
/// reading an answer head). Any other name is parsed as before and takes the position.
///
/// The bytes are kept beside the name, though they could be derived (a valid name's bytes
/// equal it but for ASCII case): an exact comparison of bytes is a `memcmp`, where comparing
/// against the name ignoring case was about 900 instructions more per keep-alive request
/// (callgrind, measured twice against this).
///
/// Costs: about 50 to 200 bytes a name, so about 1 KB for a usual answer and at most about 7 KB,
/// held by each kept-alive node connection; answers whose names do not keep their places
/// (an optional field near the top) miss, and pay one small allocation a field more than
/// parsing alone.
#[derive(Debug, Default)]
struct NameCache(Vec<(Box<[u8]>, HeaderName)>);

impl NameCache {
    /// The name of field `i`, whose bytes are `raw`.
    fn name(
        &mut self,
        i: usize,
        raw: &[u8],
    ) -> Result<HeaderName, http::header::InvalidHeaderName> {
        if let Some((bytes, name)) = self.0.get(i) {
            if **bytes == *raw {
                return Ok(name.clone());
            }
        }
        let name = HeaderName::from_bytes(raw)?;
        if i < NAMES_CACHED && raw.len() <= NAME_CACHED_MAX {
            let entry = (Box::from(raw), name.clone());
            if let Some(slot) = self.0.get_mut(i) {
                *slot = entry;
            } else if i == self.0.len() {
                self.0.push(entry);
            }
        }
        Ok(name)
    }
}

impl std::fmt::Debug for H1Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("H1Conn")
            .field("buffered", &(self.end - self.start))
            .finish_non_exhaustive()
    }
}

/// Why an exchange failed, with what the request's failover rules need to know.
#[derive(Debug)]
pub(crate) struct H1Error {
    pub(crate) error: UpstreamError,
    /// The connection ended (EOF or reset) before any byte of an answer: on a kept-alive
    /// connection, the node closed it while it was idle (the keep-alive race).
    pub(crate) closed_before_answer: bool,
}

impl H1Error {
    fn io(stage: Stage, sent: bool, answered: bool, e: &io::Error) -> Self {
        let cause = match e.kind() {
            io::ErrorKind::TimedOut => Cause::Timeout,
            k => Cause::Io(k),
        };
        H1Error {
            error: UpstreamError::new(stage, cause, sent, e),
            closed_before_answer: !answered && cause != Cause::Timeout,
        }
    }

    fn eof(answered: bool) -> Self {
        H1Error {
            error: UpstreamError::new(
                Stage::AnswerHead,
                Cause::Io(io::ErrorKind::UnexpectedEof),
                true,
                "the node closed the connection before answering",
            ),
            closed_before_answer: !answered,
        }
    }

    fn protocol(what: &str) -> Self {
        H1Error {
            error: UpstreamError::new(Stage::AnswerHead, Cause::Protocol, true, what),
            closed_before_answer: false,
        }
    }
}

/// How the answer body is delimited (RFC 9112 6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// No body: HEAD, 1xx, 204, 304.
    Empty,
    /// `Content-Length`: the bytes still to come.
    Length(u64),
    Chunked(Chunk),
    /// Until the node closes the connection.
    UntilClose,
    Done,
}

/// Where the chunked decoder is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// Expecting a chunk-size line.
    Size,
    /// Inside a chunk's data: bytes left.
    Data(u64),
    /// After a chunk's data: expecting CRLF.
    DataEnd,
    /// After the last chunk: trailer fields, then the empty line.
    Trailers,
}

impl H1Conn {
    pub(crate) fn new(io: WriteDeadline<TcpStream>) -> Self {
        H1Conn {
            io,
            buf: vec![0; READ_CHUNK],
            start: 0,
            end: 0,
            out: Vec::with_capacity(512),
            names: NameCache::default(),
        }
    }

    /// Whether an idle connection can take a request: nothing arrived on it meanwhile (not
    /// the node's close, not stray bytes). tokio answers from the readiness it already has
    /// (a short read cleared it), so a healthy connection costs no syscall.
    pub(crate) fn idle_ok(&self) -> bool {
        if self.end != self.start {
            return false;
        }
        let mut probe = [0u8; 1];
        matches!(self.io.get_ref().try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    fn buffered(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    /// Before the connection waits in a pool: buffers grown for one large answer head (up to
    /// 416 KiB) or request head (up to 64 KiB) go back to their usual size, so that an idle
    /// connection holds 16 KiB whatever its last exchange was (HAProxy's one buffer per
    /// connection). A connection put back has nothing unread (`idle_ok`): the read buffer is
    /// simply made anew.
    pub(crate) fn shrink_for_idle(&mut self) {
        if self.buf.len() > READ_CHUNK && self.start == self.end {
            self.buf = vec![0; READ_CHUNK];
            self.start = 0;
            self.end = 0;
        }
        if self.out.capacity() > READ_CHUNK {
            self.out = Vec::with_capacity(512);
        }
    }

    fn consume(&mut self, n: usize) {
        self.start += n;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// Reads more bytes into the buffer (growing it up to [`MAX_HEAD`] plus one read when it
    /// is full of an unfinished head). `Ok(0)` is end of stream.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.end == self.buf.len() {
            if self.start > 0 {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            } else if self.buf.len() < MAX_HEAD + READ_CHUNK {
                self.buf.resize(self.buf.len() + READ_CHUNK, 0);
            } else {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "answer head or chunk line too long",
                )));
            }
        }
        let mut rb = ReadBuf::new(&mut self.buf[self.end..]);
        match Pin::new(&mut self.io).poll_read(cx, &mut rb) {
            Poll::Ready(Ok(())) => {
                let n = rb.filled().len();
                self.end += n;
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }

    async fn fill(&mut self) -> io::Result<usize> {
        std::future::poll_fn(|cx| self.poll_fill(cx)).await
    }

    /// Writes the request head (a bodiless request: no framing header of its own) and reads
    /// the answer head. The body is read afterwards through [`NodeBody`].
    ///
    /// The head is encoded here, when the exchange is made, and the future holds only the
    /// connection: an `async fn` would keep the connection twice (the argument and the local
    /// it is moved into) and the head's parts besides, in every request's future.
    pub(crate) fn exchange<'c>(
        mut self,
        method: &Method,
        target: &http::Uri,
        headers: &HeaderMap,
        forwarding: &Forwarding<'_>,
        conns: &'c Arc<NodeConns>,
    ) -> impl std::future::Future<Output = Result<Response<NodeBody>, H1Error>> + use<'c> {
        self.out.clear();
        encode_head(&mut self.out, method, target, headers, forwarding);
        let head_request = method == Method::HEAD;
        async move {
            let mut written = 0;
            while written < self.out.len() {
                let n = std::future::poll_fn(|cx| {
                    Pin::new(&mut self.io).poll_write(cx, &self.out[written..])
                })
                .await
                .map_err(|e| H1Error::io(Stage::Send, written > 0, false, &e))?;
                if n == 0 {
                    return Err(H1Error::io(
                        Stage::Send,
                        written > 0,
                        false,
                        &io::Error::from(io::ErrorKind::WriteZero),
                    ));
                }
                written += n;
            }
            let head = self.read_head(head_request).await?;
            let (parts, framing, keep_alive) = head;
            let mut body = NodeBody {
                conn: Some(self),
                framing,
                keep_alive,
                conns: Arc::clone(conns),
            };
            // An answer without a body is done now: the connection goes back at once, since
            // hyper may never poll a body that says it is empty.
            body.settle();
            Ok(Response::from_parts(parts, body))
        }
    }

    /// Reads and parses the answer head; interim (1xx) answers other than 101 are skipped.
    async fn read_head(
        &mut self,
        head_request: bool,
    ) -> Result<(http::response::Parts, Framing, bool), H1Error> {
        let mut answered = false;
        loop {
            // The buffer by its fields, not `buffered()`: the name cache is borrowed beside it.
            let bytes = &self.buf[self.start..self.end];
            match parse_head(bytes, head_request, &mut self.names)? {
                Some((parts, framing, keep_alive, len)) => {
                    self.consume(len);
                    let status = parts.status;
                    if status.is_informational() && status != StatusCode::SWITCHING_PROTOCOLS {
                        continue;
                    }
                    return Ok((parts, framing, keep_alive));
                }
                None => {
                    if self.end - self.start >= MAX_HEAD {
                        return Err(H1Error::protocol("answer head too long"));
                    }
                    match self.fill().await {
                        Ok(0) => return Err(H1Error::eof(answered)),
                        Ok(_) => answered = true,
                        Err(e) => return Err(H1Error::io(Stage::AnswerHead, true, answered, &e)),
                    }
                }
            }
        }
    }
}

/// `METHOD target HTTP/1.1` and the header fields, as hyper's client writes them (names
/// lowercase as the map keeps them): the client's, then limpet's own ([`Forwarding`]).
fn encode_head(
    out: &mut Vec<u8>,
    method: &Method,
    target: &http::Uri,
    headers: &HeaderMap,
    forwarding: &Forwarding<'_>,
) {
    out.extend_from_slice(method.as_str().as_bytes());
    out.push(b' ');
    match target.path_and_query() {
        Some(pq) => out.extend_from_slice(pq.as_str().as_bytes()),
        None => out.push(b'/'),
    }
    out.extend_from_slice(b" HTTP/1.1\r\n");
    forwarding.write_fields(out, headers);
    out.extend_from_slice(b"\r\n");
}

/// One answer head from `bytes`: `None` when incomplete. Returns the parts, the body's
/// framing, whether the connection may be kept alive, and the head's length.
fn parse_head(
    bytes: &[u8],
    head_request: bool,
    names: &mut NameCache,
) -> Result<Option<(http::response::Parts, Framing, bool, usize)>, H1Error> {
    // Slots httparse fills as it parses: zeroing all of them first, as `Response::new` over
    // `EMPTY_HEADER`s needs, was an eighth of this function's instructions (callgrind).
    let mut fields = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut []);
    let parsed = httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut resp,
        bytes,
        &mut fields,
    );
    let len = match parsed {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(H1Error::protocol("too many header fields in the answer"))
        }
        Err(_) => return Err(H1Error::protocol("malformed answer head")),
    };
    let version = match resp.version {
        Some(1) => Version::HTTP_11,
        Some(0) => Version::HTTP_10,
        _ => return Err(H1Error::protocol("unsupported HTTP version")),
    };
    let status = resp
        .code
        .and_then(|c| StatusCode::from_u16(c).ok())
        .ok_or_else(|| H1Error::protocol("bad status code"))?;
    // One copy of the head; the values are slices of it (no allocation per field).
    let head = Bytes::copy_from_slice(&bytes[..len]);
    let base = bytes.as_ptr() as usize;
    let mut headers = HeaderMap::with_capacity(resp.headers.len());
    // The node's `Connection` line, when it is one line that lists only hop-by-hop names
    // (nginx's `keep-alive` on every answer): read here for keep-alive and not put in the
    // map, since the answer's hop-by-hop fields never reach the client. Putting it in to
    // look it up and take it out again cost about 600 instructions per request (callgrind:
    // an append, two lookups and a remove). Any other `Connection` line goes into the map
    // and is handled as before (`super::headers::remove_hop_by_hop`).
    let mut connection: Option<HeaderValue> = None;
    let mut connection_in_map = false;
    for (i, f) in resp.headers.iter().enumerate() {
        let name = names
            .name(i, f.name.as_bytes())
            .map_err(|_| H1Error::protocol("bad header name in the answer"))?;
        let at = (f.value.as_ptr() as usize).wrapping_sub(base);
        let value = head
            .get(at..at + f.value.len())
            .map(|_| head.slice(at..at + f.value.len()))
            .ok_or_else(|| H1Error::protocol("bad header value in the answer"))?;
        let value = HeaderValue::from_maybe_shared(value)
            .map_err(|_| H1Error::protocol("bad header value in the answer"))?;
        if name == header::CONNECTION {
            if connection.is_none() && lists_only_hop_names(value.as_bytes()) {
                connection = Some(value);
                continue;
            }
            connection_in_map = true;
        }
        headers.append(name, value);
    }
    let (framing, framing_reusable, repeated) =
        framing_of(version, status, &headers, head_request)?;
    if let Some(n) = repeated {
        // A length given more than once with one value (`5, 5`): passed on as one value on
        // one line (RFC 9110 8.6), which strict clients need, and hyper's server too: it
        // ends the client's connection, the answer unsent, at a second `Content-Length`.
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
    }
    let lines = connection.iter().chain(
        connection_in_map
            .then(|| headers.get_all(header::CONNECTION).iter())
            .into_iter()
            .flatten(),
    );
    let keep_alive = framing_reusable && keeps_alive(version, lines);
    let mut parts = Response::new(()).into_parts().0;
    parts.status = status;
    parts.version = version;
    parts.headers = headers;
    Ok(Some((parts, framing, keep_alive, len)))
}

/// The body's framing (RFC 9112 6.3), whether it leaves the connection reusable, and the
/// `Content-Length` when it was given more than once (one value, or it is refused).
fn framing_of(
    version: Version,
    status: StatusCode,
    headers: &HeaderMap,
    head_request: bool,
) -> Result<(Framing, bool, Option<u64>), H1Error> {
    if super::headers::answer_has_no_body(status, head_request) {
        // A HEAD's answer: no body, but its `Content-Length` (what a GET's body would be)
        // reaches the client, which hyper's server writes as it came but for a second line,
        // at which it ends the client's connection, the answer unsent. So it is held to the
        // rules of one with a body: repeated values one, on one line; values that differ,
        // or that are no number, the node's fault (502). Another request's 204 or 304 (and
        // any 1xx) is not looked at: hyper drops its `Content-Length`, as it should (a
        // 304's is the resource's; the body it has is none).
        let collapse = if head_request && !status.is_informational() {
            let (length, repeated) = content_length(headers)?;
            length.filter(|_| repeated)
        } else {
            None
        };
        return Ok((
            Framing::Empty,
            status != StatusCode::SWITCHING_PROTOCOLS,
            collapse,
        ));
    }
    if headers.contains_key(header::TRANSFER_ENCODING) {
        if version == Version::HTTP_10 {
            // RFC 9112 6.1: faulty framing; hyper's client refuses it too.
            return Err(H1Error::protocol("Transfer-Encoding in an HTTP/1.0 answer"));
        }
        let last = headers
            .get_all(header::TRANSFER_ENCODING)
            .iter()
            .flat_map(|v| v.as_bytes().split(|&b| b == b','))
            .map(<[u8]>::trim_ascii)
            .rfind(|c| !c.is_empty());
        let chunked = last.is_some_and(|c| c.eq_ignore_ascii_case(b"chunked"));
        // With a Content-Length too, Transfer-Encoding wins and the connection is not
        // trusted for another request (RFC 9112 6.3, point 3).
        let reusable = chunked && !headers.contains_key(header::CONTENT_LENGTH);
        return Ok(if chunked {
            (Framing::Chunked(Chunk::Size), reusable, None)
        } else {
            (Framing::UntilClose, false, None)
        });
    }
    let (length, repeated) = content_length(headers)?;
    Ok(match length {
        Some(n) => (Framing::Length(n), true, length.filter(|_| repeated)),
        None => (Framing::UntilClose, false, None),
    })
}

/// The answer's `Content-Length`, if any, and whether it was given more than once (with one
/// value: differing values, or one that is not a number, are refused).
fn content_length(headers: &HeaderMap) -> Result<(Option<u64>, bool), H1Error> {
    let mut length: Option<u64> = None;
    let mut repeated = false;
    for v in headers.get_all(header::CONTENT_LENGTH) {
        for part in v.as_bytes().split(|&b| b == b',') {
            let part = part.trim_ascii();
            if part.is_empty() || part.len() > 19 || !part.iter().all(u8::is_ascii_digit) {
                return Err(H1Error::protocol("bad Content-Length in the answer"));
            }
            let n = std::str::from_utf8(part)
                .ok()
                .and_then(|s| s.parse::<u64>().ok())
                .ok_or_else(|| H1Error::protocol("bad Content-Length in the answer"))?;
            if length.is_some_and(|l| l != n) {
                return Err(H1Error::protocol(
                    "conflicting Content-Length in the answer",
                ));
            }
            repeated |= length.is_some();
            length = Some(n);
        }
    }
    Ok((length, repeated))
}

/// HTTP/1.1 keeps the connection unless `Connection: close`; HTTP/1.0 only with
/// `Connection: keep-alive`. `lines` are the answer's `Connection` values.
fn keeps_alive<'v>(version: Version, lines: impl Iterator<Item = &'v HeaderValue>) -> bool {
    let mut tokens = lines
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .map(<[u8]>::trim_ascii);
    if version == Version::HTTP_11 {
        !tokens.any(|t| t.eq_ignore_ascii_case(b"close"))
    } else {
        tokens.any(|t| t.eq_ignore_ascii_case(b"keep-alive"))
    }
}

/// An answer body read from the node's connection as hyper polls it for the client.
pub(crate) struct NodeBody {
    conn: Option<H1Conn>,
    framing: Framing,
    keep_alive: bool,
    conns: Arc<NodeConns>,
}

impl std::fmt::Debug for NodeBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeBody")
            .field("framing", &self.framing)
            .finish_non_exhaustive()
    }
}

/// The answer ended before its framing said it would.
fn cut(what: &'static str) -> BoxError {
    Box::new(io::Error::new(io::ErrorKind::UnexpectedEof, what))
}

fn malformed(what: &'static str) -> BoxError {
    Box::new(io::Error::new(io::ErrorKind::InvalidData, what))
}

impl NodeBody {
    /// Whether the whole body has been read from the node already: it is empty, or has a
    /// length that the bytes read past the head cover.
    pub(crate) fn whole_in_hand(&self) -> bool {
        match self.framing {
            Framing::Empty | Framing::Done => true,
            Framing::Length(n) => self
                .conn
                .as_ref()
                .is_some_and(|c| c.buffered().len() as u64 >= n),
            Framing::Chunked(_) | Framing::UntilClose => false,
        }
    }

    /// Once the body is complete: the connection goes back to its pool if it may be reused
    /// and holds nothing more (bytes after the answer mean the node is not speaking HTTP/1.1
    /// as we understand it).
    fn settle(&mut self) {
        if matches!(self.framing, Framing::Empty | Framing::Length(0)) {
            self.framing = Framing::Done;
        }
        if self.framing != Framing::Done {
            return;
        }
        if let Some(conn) = self.conn.take() {
            if self.keep_alive && conn.start == conn.end {
                self.conns.recycle_h1(conn);
            }
        }
    }

    /// One step of the chunked decoder over the buffered bytes: a frame, the end, or
    /// `Pending` with more bytes needed (`None` inside).
    fn chunked_step(
        conn: &mut H1Conn,
        state: &mut Chunk,
    ) -> Result<Option<Option<Frame<Bytes>>>, BoxError> {
        loop {
            let buf = conn.buffered();
            match *state {
                Chunk::Size => {
                    let Some(eol) = memchr::memchr(b'\n', buf) else {
                        if buf.len() >= MAX_HEAD {
                            return Err(malformed("chunk-size line too long"));
                        }
                        return Ok(None);
                    };
                    let line = buf[..eol]
                        .strip_suffix(b"\r")
                        .ok_or_else(|| malformed("chunk-size line without CRLF"))?;
                    let size = parse_chunk_size(line)?;
                    conn.consume(eol + 1);
                    *state = if size == 0 {
                        Chunk::Trailers
                    } else {
                        Chunk::Data(size)
                    };
                }
                Chunk::Data(left) => {
                    if buf.is_empty() {
                        return Ok(None);
                    }
                    let n = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
                    let data = Bytes::copy_from_slice(&buf[..n]);
                    conn.consume(n);
                    let left = left - n as u64;
                    *state = if left == 0 {
                        Chunk::DataEnd
                    } else {
                        Chunk::Data(left)
                    };
                    return Ok(Some(Some(Frame::data(data))));
                }
                Chunk::DataEnd => {
                    if buf.len() < 2 {
                        return Ok(None);
                    }
                    if &buf[..2] != b"\r\n" {
                        return Err(malformed("chunk data not followed by CRLF"));
                    }
                    conn.consume(2);
                    *state = Chunk::Size;
                }
                Chunk::Trailers => {
                    if buf.starts_with(b"\r\n") {
                        conn.consume(2);
                        return Ok(Some(None));
                    }
                    // Its end is where the parse of its fields ends, not the first CRLF CRLF
                    // found: a section the parse ended earlier (a bare LF) would have left
                    // bytes of the node's unread, taken for the next answer's.
                    let Some((len, trailers)) = parse_trailers(buf)? else {
                        if buf.len() >= MAX_HEAD {
                            return Err(malformed("trailer section too long"));
                        }
                        return Ok(None);
                    };
                    conn.consume(len);
                    return Ok(Some(Some(Frame::trailers(trailers))));
                }
            }
        }
    }

    fn poll_body(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        loop {
            let Some(conn) = self.conn.as_mut() else {
                return Poll::Ready(None);
            };
            match self.framing {
                Framing::Empty | Framing::Done | Framing::Length(0) => {
                    self.settle();
                    return Poll::Ready(None);
                }
                Framing::Length(left) => {
                    let buf = conn.buffered();
                    if !buf.is_empty() {
                        let n = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
                        let data = Bytes::copy_from_slice(&buf[..n]);
                        conn.consume(n);
                        self.framing = Framing::Length(left - n as u64);
                        // The last bytes: back to the pool now, hyper may not poll again.
                        self.settle();
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                }
                Framing::UntilClose => {
                    let buf = conn.buffered();
                    if !buf.is_empty() {
                        let data = Bytes::copy_from_slice(buf);
                        let n = buf.len();
                        conn.consume(n);
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                }
                Framing::Chunked(mut state) => {
                    let step = Self::chunked_step(conn, &mut state);
                    self.framing = Framing::Chunked(state);
                    match step {
                        Err(e) => {
                            self.conn = None;
                            return Poll::Ready(Some(Err(e)));
                        }
                        // Trailers come last: the body is done with them.
                        Ok(Some(Some(frame))) => {
                            if frame.is_trailers() {
                                self.framing = Framing::Done;
                                self.settle();
                            }
                            return Poll::Ready(Some(Ok(frame)));
                        }
                        Ok(Some(None)) => {
                            self.framing = Framing::Done;
                            self.settle();
                            return Poll::Ready(None);
                        }
                        Ok(None) => {}
                    }
                }
            }
            // More bytes needed.
            let Some(conn) = self.conn.as_mut() else {
                return Poll::Ready(None);
            };
            match conn.poll_fill(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(0)) => {
                    self.conn = None;
                    if self.framing == Framing::UntilClose {
                        // The answer's end is the connection's.
                        self.framing = Framing::Done;
                        return Poll::Ready(None);
                    }
                    return Poll::Ready(Some(Err(cut(
                        "the node closed the connection mid-answer",
                    ))));
                }
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(e)) => {
                    self.conn = None;
                    return Poll::Ready(Some(Err(Box::new(e))));
                }
            }
        }
    }
}

impl Body for NodeBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        self.poll_body(cx)
    }

    fn is_end_stream(&self) -> bool {
        matches!(
            self.framing,
            Framing::Empty | Framing::Length(0) | Framing::Done
        )
    }

    fn size_hint(&self) -> SizeHint {
        match self.framing {
            Framing::Empty | Framing::Done => SizeHint::with_exact(0),
            Framing::Length(n) => SizeHint::with_exact(n),
            Framing::Chunked(_) | Framing::UntilClose => SizeHint::default(),
        }
    }
}

/// A chunk-size line: hex digits, then optional extensions (`;name=value`), which are
/// ignored as RFC 9112 7.1.1 allows. Spaces and tabs before `;` are tolerated, as hyper
/// does; any other byte there, and a CR anywhere, are not.
fn parse_chunk_size(line: &[u8]) -> Result<u64, BoxError> {
    let digits_end = line
        .iter()
        .position(|b| !b.is_ascii_hexdigit())
        .unwrap_or(line.len());
    let (digits, rest) = line.split_at(digits_end);
    if digits.is_empty() || digits.len() > 16 {
        return Err(malformed("bad chunk size"));
    }
    // Spaces and tabs only before `;` (RFC 9112's BWS), and no CR anywhere in the line
    // (hyper refuses a bare CR, in the size or an extension).
    let rest = &rest[rest
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t'))
        .unwrap_or(rest.len())..];
    if !(rest.is_empty() || rest.starts_with(b";")) || rest.contains(&b'\r') {
        return Err(malformed("bad chunk size"));
    }
    let mut size: u64 = 0;
    for &d in digits {
        let v = match d {
            b'0'..=b'9' => d - b'0',
            b'a'..=b'f' => d - b'a' + 10,
            b'A'..=b'F' => d - b'A' + 10,
            _ => return Err(malformed("bad chunk size")),
        };
        size = size
            .checked_mul(16)
            .and_then(|s| s.checked_add(u64::from(v)))
            .ok_or_else(|| malformed("chunk size overflows"))?;
    }
    Ok(size)
}

/// The trailer section (field lines and the empty line) after the last chunk, at the start
/// of `bytes`: its length and its fields, or `None` while it is not all there. Its lines end
/// in CRLF, as the chunk-size lines must: a bare LF, which the parse would take, is refused.
fn parse_trailers(bytes: &[u8]) -> Result<Option<(usize, HeaderMap)>, BoxError> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let (len, parsed) = match httparse::parse_headers(bytes, &mut fields) {
        Ok(httparse::Status::Complete(done)) => done,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err(malformed("malformed trailer section")),
    };
    let section = bytes
        .get(..len)
        .ok_or_else(|| malformed("malformed trailer section"))?;
    let bare_lf = |w: &[u8]| w.get(1) == Some(&b'\n') && w.first() != Some(&b'\r');
    if section.first() == Some(&b'\n') || section.windows(2).any(bare_lf) {
        return Err(malformed("trailer line without CRLF"));
    }
    let mut map = HeaderMap::with_capacity(parsed.len());
    for f in parsed {
        let name =
            HeaderName::from_bytes(f.name.as_bytes()).map_err(|_| malformed("bad trailer name"))?;
        let value = HeaderValue::from_bytes(f.value).map_err(|_| malformed("bad trailer value"))?;
        map.append(name, value);
    }
    Ok(Some((len, map)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection whose last answer head grew its read buffer (a node's 100 KiB head, read
    /// for real) and whose last request head grew its write buffer goes into the pool with
    /// 16 KiB and comes out of it so; before, each idle connection kept what its largest
    /// exchange had grown, up to 416 KiB read and 64 KiB write, 1,024 of them per node.
    #[tokio::test]
    async fn a_connection_goes_idle_with_its_usual_buffers() {
        use tokio::io::AsyncWriteExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let conns = Arc::new(NodeConns::new(
            addr,
            4,
            std::time::Duration::from_secs(30),
            std::time::Duration::from_secs(1),
            None,
        ));
        let mut conn = conns
            .connect_h1(std::time::Duration::from_secs(1))
            .await
            .expect("connect");
        let (mut node, _) = listener.accept().await.expect("accept");
        let big = vec![b'x'; 100 * 1024];
        node.write_all(&big).await.expect("write");
        while conn.end - conn.start < big.len() {
            assert!(conn.fill().await.expect("read") > 0, "the node closed");
        }
        assert!(conn.buf.len() > 100 * 1024, "{}", conn.buf.len());
        conn.consume(big.len());
        conn.out.reserve(64 * 1024);
        conns.recycle_h1(conn);
        let conn = conns
            .checkout_h1(tokio::time::Instant::now())
            .expect("the idle connection");
        assert_eq!(conn.buf.len(), READ_CHUNK);
        assert!(conn.out.capacity() <= READ_CHUNK, "{}", conn.out.capacity());
        drop(node);
    }

    fn head(text: &str, head_request: bool) -> Result<(u16, Framing, bool, usize), String> {
        match parse_head(text.as_bytes(), head_request, &mut NameCache::default()) {
            Ok(Some((p, f, k, len))) => Ok((p.status.as_u16(), f, k, len)),
            Ok(None) => Err("partial".into()),
            Err(e) => Err(e.error.detail),
        }
    }

    #[test]
    fn framing_follows_rfc_9112() {
        let h = "HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello";
        assert_eq!(
            head(h, false),
            Ok((200, Framing::Length(5), true, h.len() - 5))
        );
        assert_eq!(head(h, true).map(|r| r.1), Ok(Framing::Empty), "HEAD");
        let h = "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n";
        assert_eq!(
            head(h, false).map(|r| (r.1, r.2)),
            Ok((Framing::Chunked(Chunk::Size), true))
        );
        let h = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n";
        assert_eq!(
            head(h, false).map(|r| (r.1, r.2)),
            Ok((Framing::Chunked(Chunk::Size), false)),
            "Transfer-Encoding wins over Content-Length, and the connection is not reused"
        );
        let h = "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n";
        assert_eq!(
            head(h, false).map(|r| (r.1, r.2)),
            Ok((Framing::UntilClose, false))
        );
        let h = "HTTP/1.1 200 OK\r\n\r\n";
        assert_eq!(
            head(h, false).map(|r| (r.1, r.2)),
            Ok((Framing::UntilClose, false))
        );
        let h = "HTTP/1.1 304 Not Modified\r\ncontent-length: 10\r\n\r\n";
        assert_eq!(
            head(h, false).map(|r| (r.1, r.2)),
            Ok((Framing::Empty, true))
        );
        let h = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\n";
        assert_eq!(head(h, false).map(|r| r.2), Ok(false), "Connection: close");
        let h = "HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\n";
        assert_eq!(
            head(h, false).map(|r| r.2),
            Ok(false),
            "HTTP/1.0 without keep-alive"
        );
        let h = "HTTP/1.0 200 OK\r\ncontent-length: 2\r\nconnection: Keep-Alive\r\n\r\n";
        assert_eq!(head(h, false).map(|r| r.2), Ok(true));
        let h = "HTTP/1.1 200 OK\r\ncontent-length: 2, 2\r\n\r\n";
        assert_eq!(
            head(h, false).map(|r| r.1),
            Ok(Framing::Length(2)),
            "repeated equal values"
        );
    }

    /// A `Connection` line that lists only hop-by-hop names is read for keep-alive and left
    /// out of the answer's map; any other stays in the map, where `remove_hop_by_hop` takes
    /// it and the names it lists; keep-alive reads every line either way.
    #[test]
    fn connection_lines_decide_keep_alive_and_reach_the_map_only_when_they_list_names() {
        let parsed = |text: &str| {
            let Ok(Some((parts, _, keep_alive, _))) =
                parse_head(text.as_bytes(), false, &mut NameCache::default())
            else {
                panic!("not parsed: {text:?}");
            };
            let lines: Vec<Vec<u8>> = parts
                .headers
                .get_all(header::CONNECTION)
                .iter()
                .map(|v| v.as_bytes().to_vec())
                .collect();
            (keep_alive, lines)
        };
        let h = "HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: keep-alive\r\n\r\n";
        assert_eq!(parsed(h), (true, vec![]));
        let h = "HTTP/1.0 200 OK\r\ncontent-length: 0\r\nconnection: Keep-Alive\r\n\r\n";
        assert_eq!(parsed(h), (true, vec![]), "HTTP/1.0 keep-alive, held aside");
        let h = "HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
        assert_eq!(parsed(h), (false, vec![b"close".to_vec()]));
        let h = "HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: keep-alive, x-secret\r\n\r\n";
        assert_eq!(parsed(h), (true, vec![b"keep-alive, x-secret".to_vec()]));
        // The first line held aside, the second in the map: both read for keep-alive.
        let h = "HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: keep-alive\r\n\
                 connection: close\r\n\r\n";
        assert_eq!(parsed(h), (false, vec![b"close".to_vec()]));
        let h = "HTTP/1.0 200 OK\r\ncontent-length: 0\r\nconnection: x-a\r\n\
                 connection: keep-alive\r\n\r\n";
        assert_eq!(parsed(h), (true, vec![b"x-a".to_vec()]));
    }

    #[test]
    fn bad_heads_are_protocol_errors() {
        for h in [
            "HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 1x\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 99999999999999999999\r\n\r\n",
            "HTTP/2.0 200 OK\r\n\r\n",
            "HTTP/1.1 2000 OK\r\n\r\n",
            "HTTP/1.1 200 OK\r\nbad header\r\n\r\n",
            "HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\nconnection: keep-alive\r\n\r\n",
        ] {
            assert!(head(h, false).is_err(), "{h:?} accepted");
        }
        assert_eq!(
            head("HTTP/1.1 200 OK\r\ncontent-le", false),
            Err("partial".into())
        );
        let many: String = (0..MAX_HEADERS + 1)
            .map(|i| format!("x-{i}: 1\r\n"))
            .collect();
        assert!(head(&format!("HTTP/1.1 200 OK\r\n{many}\r\n"), false).is_err());
    }

    /// A connection's name cache changes nothing in what an answer head parses to: answers
    /// through one cache, whose names repeat, change case, move, grow past the cache or
    /// shrink, give the same fields in the same order as each parsed with a fresh cache; the
    /// cache keeps at most [`NAMES_CACHED`] names.
    #[test]
    fn the_name_cache_gives_what_a_fresh_parse_gives() {
        let many: String = (0..NAMES_CACHED + 8)
            .map(|i| format!("X-F{i}: {i}\r\n"))
            .collect();
        let heads = [
            "HTTP/1.1 200 OK\r\nServer: nginx\r\nDate: x\r\nX-Backend: a\r\ncontent-length: 0\r\n\r\n".to_owned(),
            "HTTP/1.1 200 OK\r\nServer: nginx\r\nDate: y\r\nX-Backend: b\r\ncontent-length: 0\r\n\r\n".to_owned(),
            "HTTP/1.1 200 OK\r\nserver: nginx\r\nDATE: y\r\nx-backend: b\r\ncontent-length: 0\r\n\r\n".to_owned(),
            // Another name of the same length at the same place.
            "HTTP/1.1 200 OK\r\nserver: nginx\r\nVary: y\r\nx-backend: b\r\ncontent-length: 0\r\n\r\n".to_owned(),
            "HTTP/1.1 200 OK\r\nX-Backend: c\r\nServer: nginx\r\ncontent-length: 0\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\n\r\n".to_owned(),
            format!("HTTP/1.1 200 OK\r\n{many}content-length: 0\r\n\r\n"),
            "HTTP/1.1 204 No Content\r\nX-Backend: d\r\n\r\n".to_owned(),
        ];
        let fields = |p: &http::response::Parts| -> Vec<(String, Vec<u8>)> {
            p.headers
                .iter()
                .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
                .collect()
        };
        let mut cache = NameCache::default();
        for h in &heads {
            let cached = parse_head(h.as_bytes(), false, &mut cache);
            let fresh = parse_head(h.as_bytes(), false, &mut NameCache::default());
            let (Ok(Some((c, ..))), Ok(Some((f, ..)))) = (cached, fresh) else {
                panic!("parsed: {h}");
            };
            assert_eq!(fields(&c), fields(&f), "{h}");
            assert!(cache.0.len() <= NAMES_CACHED);
        }
        assert_eq!(
            cache.0.len(),
            NAMES_CACHED,
            "filled by the long head, then kept"
        );
        // A name longer than the cache keeps is parsed, and never held.
        let long = "x".repeat(NAME_CACHED_MAX + 1);
        let mut cache = NameCache::default();
        let text = format!("HTTP/1.1 204 No Content\r\n{long}: 1\r\n\r\n");
        let Ok(Some((p, ..))) = parse_head(text.as_bytes(), false, &mut cache) else {
            panic!("parsed");
        };
        assert!(p.headers.contains_key(long.as_str()));
        assert!(cache.0.is_empty(), "not kept");
    }

    #[test]
    fn header_values_are_kept_as_sent() {
        let text = "HTTP/1.1 200 OK\r\nSet-Cookie: a=1\r\nset-cookie: b=2\r\nX-Node:  n1 \r\ncontent-length: 0\r\n\r\n";
        let Ok(Some((p, _, _, _))) = parse_head(text.as_bytes(), false, &mut NameCache::default())
        else {
            panic!("parsed");
        };
        let cookies: Vec<&[u8]> = p
            .headers
            .get_all(header::SET_COOKIE)
            .iter()
            .map(HeaderValue::as_bytes)
            .collect();
        assert_eq!(cookies, [&b"a=1"[..], b"b=2"]);
        assert_eq!(
            p.headers.get("x-node").map(HeaderValue::as_bytes),
            Some(&b"n1"[..])
        );
    }

    /// A trailer section ends where its fields' parse ends, and its lines end in CRLF: a
    /// bare LF is refused (before, the section was taken to end at the first CRLF CRLF, so
    /// `X: 1\n\n` then bytes of the node's were swallowed, and `\n` alone waited for one
    /// that never came).
    #[test]
    fn a_trailer_section_ends_where_its_parse_does_and_takes_no_bare_lf() {
        let (len, map) = parse_trailers(b"X: 1\r\nY: 2\r\n\r\nrest")
            .expect("parsed")
            .expect("whole");
        assert_eq!(len, 14);
        assert_eq!(
            (map.get("x"), map.get("y")),
            (
                Some(&HeaderValue::from_static("1")),
                Some(&HeaderValue::from_static("2"))
            )
        );
        for partial in [&b"X: 1\r\n"[..], b"X: 1\r\n\r", b"X"] {
            assert!(
                parse_trailers(partial).expect("no error").is_none(),
                "{partial:?}"
            );
        }
        for bad in [
            &b"X: 1\n\nJUNK\r\n\r\n"[..],
            b"\n",
            b"X: 1\r\n\n",
            b"X 1\r\n\r\n",
        ] {
            assert!(parse_trailers(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn chunk_sizes_are_strict_hex() {
        assert_eq!(parse_chunk_size(b"1a").ok(), Some(26));
        assert_eq!(parse_chunk_size(b"A;ext=1").ok(), Some(10));
        assert_eq!(parse_chunk_size(b"0 ; x").ok(), Some(0));
        assert_eq!(parse_chunk_size(b"5\t;x").ok(), Some(5));
        for bad in [
            &b""[..],
            b"g",
            b"-1",
            b"1 2",
            b"0x10",
            b"11111111111111111",
            b"5\r",
            b"5\x0c",
            b"5;a\rb",
        ] {
            assert!(parse_chunk_size(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn requests_are_written_as_hyper_writes_them() {
        let mut out = Vec::new();
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("shop"));
        h.append("x-a", HeaderValue::from_static("1"));
        h.append("x-a", HeaderValue::from_static("2"));
        let peer = super::super::headers::forwarded_for([10, 0, 0, 1].into());
        let forwarding = Forwarding::new(
            &mut h,
            None,
            &peer,
            false,
            false,
            "1f-3",
            super::super::affinity::CookieEdit::Keep,
        );
        encode_head(
            &mut out,
            &Method::GET,
            &"/cart?x=1".parse().expect("uri"),
            &h,
            &forwarding,
        );
        assert_eq!(
            String::from_utf8_lossy(&out),
            "GET /cart?x=1 HTTP/1.1\r\nhost: shop\r\nx-a: 1\r\nx-a: 2\r\n\
             x-forwarded-for: 10.0.0.1\r\nx-forwarded-proto: http\r\n\
             x-forwarded-host: shop\r\nx-request-id: 1f-3\r\n\r\n"
        );
    }
}
