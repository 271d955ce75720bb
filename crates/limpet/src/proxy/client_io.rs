//! The byte stream of an HTTP client connection as hyper sees it: the accepted stream (TLS
//! or not) under the write deadline, with two changes to when reads and writes reach the
//! socket. Neither changes what is read or written.
//!
//! ```text
//!  hyper (auto: HTTP/1.1 or HTTP/2)
//!    └─► ClientIo: first read taken whole (READ_AHEAD) · each write after this turn's ready tasks
//!          └─► relay::WriteDeadline (client_idle) ─► the accepted stream
//! ```
//!
//! - **The first read is taken whole.** hyper-util tells HTTP/2 by prior knowledge from
//!   HTTP/1 by reading exactly the 24 bytes of the HTTP/2 preface, then hyper reads the rest
//!   of the head: two `recvfrom` for one request head on every connection, which a
//!   `Connection: close` client pays on every request (one syscall in eleven). Here the first
//!   read, if asked for less, takes [`READ_AHEAD`] and hands the rest out without syscalls.
//!   Measured (`bench/cost.sh --modes close`, strace): `recvfrom` 3.05 -> 2.01 per request.
//! - **Answers go out at the end of the event-loop turn.** Each write first yields once, so
//!   it runs after the tasks that are ready now, and one turn's answers leave together. The
//!   load tool and the nodes sleep whenever they run out of work, and waking a sleeping
//!   process on another core costs the waker a cross-CPU wake-up (an IPI, a VM exit on a
//!   virtual machine): answers written one by one as each node answers wake the client again
//!   and again, written together once. HAProxy gets this from its structure (its I/O
//!   callbacks run first, its stream tasks and their sends after them). Measured
//!   (`bench/cost.sh --only limpet --events sched:sched_waking,ipi:ipi_send_cpu`, two
//!   alternating runs each): processes woken per request 0.14 -> 0.09 on `sticky` and 0.27
//!   -> 0.15 on `plain`, system CPU per request 5% lower, requests/s 4% (`sticky`) and 6%
//!   (`plain`) higher. Holding back writes to nodes the same way gained nothing.
//!
//! Every write yields once before it goes through (the attempt after the yield writes), so a
//! long answer costs one extra task poll per write, and a write that found the socket full
//! yields once more when it is woken. A connection's very first write does not yield:
//! `Connection: close` has nothing to batch it with, and the yield cost 3-4% of its
//! requests/s. This sits outside the write deadline, so a yield is never taken for a blocked
//! write. Writes are batched only on a current-thread runtime (limpet's workers and main
//! runtime), where it was measured; under tokio's multi-threaded runtime (the demo) a task
//! that wakes itself may also wake a parked worker, the very cost this avoids, so there
//! writes go straight out.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::tcp::Prefixed;

/// How much a client connection's first read takes: a whole request head of a typical client
/// (curl and load tools send about 100 bytes, browsers up to a few KiB); hyper reads the rest
/// of a larger head as usual.
const READ_AHEAD: usize = 4 * 1024;

/// Whether batching writes pays on the runtime this runs on: a current-thread one (see the
/// module doc).
pub(crate) fn batching_pays() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread)
}

/// An HTTP client connection's stream: first read whole, writes at the end of the turn (see
/// the module doc).
pub(crate) struct ClientIo<S> {
    /// The stream, with what the first read took ahead put back in front of it.
    io: Prefixed<S>,
    /// The first read's buffer while that read is pending.
    ahead: Vec<u8>,
    first_read: bool,
    /// Writes wait for the end of the turn (see the module doc).
    batch_writes: bool,
    /// This write has yielded once already (or is the connection's first): the next attempt
    /// goes through.
    yielded: bool,
}

impl<S> std::fmt::Debug for ClientIo<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientIo")
            .field("first_read", &self.first_read)
            .field("batch_writes", &self.batch_writes)
            .field("yielded", &self.yielded)
            .finish_non_exhaustive()
    }
}

impl<S> ClientIo<S> {
    /// `batch_writes`: hold writes to the end of the turn (only on a current-thread runtime,
    /// see [`batching_pays`]).
    pub(crate) fn new(inner: S, batch_writes: bool) -> Self {
        ClientIo {
            io: Prefixed::new(Vec::new(), inner),
            ahead: Vec::new(),
            first_read: true,
            batch_writes,
            yielded: true,
        }
    }

    /// `Pending` (the task woken at once, so it runs again after the other ready tasks) the
    /// first time; `Ready` the time after.
    fn poll_turn_end(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if !self.batch_writes || self.yielded {
            self.yielded = false;
            Poll::Ready(())
        } else {
            self.yielded = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for ClientIo<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if !this.first_read || out.remaining() >= READ_AHEAD {
            // Past the first read (what it took ahead comes first), or asked for enough:
            // straight through. (A first read that was pending with a small buffer may leave
            // an empty one behind.)
            this.first_read = false;
            this.ahead = Vec::new();
            return Pin::new(&mut this.io).poll_read(cx, out);
        }
        // The first read, asked small: take READ_AHEAD into the buffer's spare capacity (not
        // zeroed; kept while the read is pending, so it is made once).
        if this.ahead.capacity() == 0 {
            this.ahead.reserve_exact(READ_AHEAD);
        }
        match tokio_util::io::poll_read_buf(Pin::new(this.io.get_mut()), cx, &mut this.ahead) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Err(e)) => {
                this.first_read = false;
                this.ahead = Vec::new();
                Poll::Ready(Err(e))
            }
            Poll::Ready(Ok(0)) => {
                // The end of the stream, as it is.
                this.first_read = false;
                this.ahead = Vec::new();
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Ok(_)) => {
                this.first_read = false;
                this.io.put_back(std::mem::take(&mut this.ahead));
                // Served from what was just put back: no read of the stream.
                Pin::new(&mut this.io).poll_read(cx, out)
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for ClientIo<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        std::task::ready!(self.poll_turn_end(cx));
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        std::task::ready!(self.poll_turn_end(cx));
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::collections::VecDeque;
    use std::rc::Rc;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// A stream over scripted read chunks (one per read; `None` is a pending read) that
    /// counts the reads that reached it, and notes each write in a shared log.
    struct Scripted {
        chunks: VecDeque<Option<Vec<u8>>>,
        reads: usize,
        log: Rc<RefCell<Vec<String>>>,
    }

    fn scripted(c: &[Option<&[u8]>]) -> Scripted {
        Scripted {
            chunks: c.iter().map(|c| c.map(<[u8]>::to_vec)).collect(),
            reads: 0,
            log: Rc::default(),
        }
    }

    impl AsyncRead for Scripted {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            out: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            self.reads += 1;
            match self.chunks.pop_front() {
                Some(Some(c)) => {
                    let n = c.len().min(out.remaining());
                    out.put_slice(&c[..n]);
                    if n < c.len() {
                        self.chunks.push_front(Some(c[n..].to_vec()));
                    }
                    Poll::Ready(Ok(()))
                }
                Some(None) => {
                    cx.waker().wake_by_ref();
                    Poll::Pending
                }
                None => Poll::Ready(Ok(())),
            }
        }
    }

    impl AsyncWrite for Scripted {
        fn poll_write(
            self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.log
                .borrow_mut()
                .push(format!("write {}", String::from_utf8_lossy(buf)));
            Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// Reads with `sizes` (cycled) until EOF; returns the bytes and the reads that reached
    /// the inner stream.
    async fn read_all(mut r: ClientIo<Scripted>, sizes: &[usize]) -> (Vec<u8>, usize) {
        let mut got = Vec::new();
        for k in 0.. {
            let mut buf = vec![0u8; sizes[k % sizes.len()]];
            let n = r.read(&mut buf).await.expect("read");
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        (got, r.io.get_ref().reads)
    }

    #[tokio::test]
    async fn the_preface_check_and_the_head_come_from_one_read() {
        let head = b"GET / HTTP/1.1\r\nHost: a\r\nUser-Agent: wrk\r\n\r\n";
        // 24 bytes (the HTTP/2 preface check), then hyper's large reads.
        let r = ClientIo::new(scripted(&[Some(head)]), true);
        let (got, reads) = read_all(r, &[24, 8192]).await;
        assert_eq!(got, head);
        assert_eq!(reads, 2, "one read for the whole head, one for the EOF");
    }

    #[tokio::test]
    async fn a_pending_first_read_then_more_than_the_read_ahead_loses_nothing() {
        let big: Vec<u8> = (0..READ_AHEAD * 2 + 7).map(|i| (i % 251) as u8).collect();
        let r = ClientIo::new(scripted(&[None, Some(&big), Some(b"tail")]), true);
        let (got, _) = read_all(r, &[24, 100, 8192]).await;
        let mut want = big.clone();
        want.extend_from_slice(b"tail");
        assert_eq!(got, want);
    }

    /// A first read asked small that is pending, then retried with a large buffer: the bytes
    /// go straight into it, and no empty read-ahead is taken for the end of the stream later.
    #[tokio::test]
    async fn a_pending_small_first_read_retried_large_is_no_false_end() {
        let mut r = ClientIo::new(scripted(&[None, Some(b"head"), Some(b"more")]), true);
        let mut small = [0u8; 24];
        let first = std::future::poll_fn(|cx| {
            let mut rb = ReadBuf::new(&mut small);
            Poll::Ready(Pin::new(&mut r).poll_read(cx, &mut rb).is_pending())
        })
        .await;
        assert!(first, "the scripted first read is pending");
        let (got, _) = read_all(r, &[READ_AHEAD]).await;
        assert_eq!(got, b"headmore");
    }

    /// Two tasks made ready together on one thread: a writer of three answers through a
    /// `ClientIo` (spawned first), and another task that notes itself. The log of both.
    async fn order_of_writes_and_other_task(batch_writes: bool) -> Vec<String> {
        let stream = scripted(&[]);
        let log = Rc::clone(&stream.log);
        let local = tokio::task::LocalSet::new();
        local
            .run_until(async {
                let mut w = ClientIo::new(stream, batch_writes);
                let writer = tokio::task::spawn_local(async move {
                    for answer in [&b"answer 1"[..], b"answer 2", b"answer 3"] {
                        w.write_all(answer).await.expect("write");
                    }
                });
                let others = Rc::clone(&log);
                let other = tokio::task::spawn_local(async move {
                    others.borrow_mut().push("other task".to_owned());
                });
                writer.await.expect("writer");
                other.await.expect("other");
            })
            .await;
        let log = log.borrow().clone();
        log
    }

    #[tokio::test]
    async fn writes_go_straight_out_when_not_batching() {
        assert_eq!(
            order_of_writes_and_other_task(false).await,
            [
                "write answer 1",
                "write answer 2",
                "write answer 3",
                "other task"
            ]
        );
    }

    #[tokio::test]
    async fn a_large_first_read_goes_straight_through() {
        let r = ClientIo::new(scripted(&[Some(b"abc"), Some(b"def")]), true);
        let (got, reads) = read_all(r, &[READ_AHEAD]).await;
        assert_eq!(got, b"abcdef");
        assert_eq!(reads, 3);
    }

    #[tokio::test]
    async fn an_answer_is_written_after_the_tasks_ready_in_the_same_turn() {
        assert_eq!(
            order_of_writes_and_other_task(true).await,
            [
                "write answer 1",
                "other task",
                "write answer 2",
                "write answer 3"
            ],
            "the connection's first answer goes out at once; the next waits for the task made \
             ready with it; every byte goes out"
        );
    }
}
