//! Futures polled only when they were woken: for the branches of one `select!` that most
//! wakes are not for. The watchers beside a connection's or a relay's I/O (idle and stall
//! clocks, drain and node-state signals), and each of a relay's two pumps (a wake for one
//! direction is not one for the other).
//!
//! A `select!` polls every branch each time its task is woken, whichever branch the wake was
//! for. A kept-alive connection's task wakes about three times per request (the request
//! readable, the node's answer readable, the write held to the end of the event-loop turn),
//! and each time its watchers were polled again though none of them had been woken: a timer
//! checked, a `watch` and a `Notify` re-registered under their mutexes (callgrind, `sticky`:
//! about 3.6% of the proxy's instructions for those three branches). [`OnWake`] gives the
//! future it wraps a waker of its own, and polls it only when that waker fired since its last
//! poll, so a wake for the I/O costs the watchers one `AtomicWaker` registration.
//!
//! ```text
//!  task woken ─► OnWake::poll ─► task waker registered (cheap when it is the same one)
//!                   ├─ own waker not fired since the last poll ─► Pending (inner untouched)
//!                   └─ fired (or first poll) ─► inner polled with the own waker
//!  inner's timer / signal fires ─► own waker: flag set, task woken
//! ```
//!
//! Only for futures whose progress comes through their own wakers (timers, channels,
//! `Notify`, `watch`, socket readiness): a future that would make progress on a poll without having been woken
//! (one that reads shared state only when polled, with nothing to wake it) would wait forever.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use futures_util::task::AtomicWaker;

/// Set when the inner future's waker fires; wakes the task polling the [`OnWake`].
///
/// An owner that is already shared (`Arc`) can hold the signal and be the waker itself
/// ([`OnWake::on`]: no allocation of its own); [`OnWake::new`] allocates one.
#[derive(Debug)]
pub struct Signal {
    woken: AtomicBool,
    task: AtomicWaker,
}

impl Signal {
    /// A signal that has fired, so that the first poll reaches the inner future.
    pub fn new() -> Self {
        Signal {
            woken: AtomicBool::new(true),
            task: AtomicWaker::new(),
        }
    }

    /// What the inner future's waker does: notes the wake and wakes the polling task.
    pub fn fire(&self) {
        self.woken.store(true, Ordering::Release);
        self.task.wake();
    }
}

impl Default for Signal {
    fn default() -> Self {
        Signal::new()
    }
}

impl AsRef<Signal> for Signal {
    fn as_ref(&self) -> &Signal {
        self
    }
}

impl Wake for Signal {
    fn wake(self: Arc<Self>) {
        self.fire();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.fire();
    }
}

pin_project_lite::pin_project! {
    /// `inner`, polled only on its first poll and after its own waker fired (module doc).
    pub struct OnWake<F, O = Signal> {
        #[pin]
        inner: F,
        owner: Arc<O>,
        waker: Waker,
    }
}

impl<F> OnWake<F> {
    /// `inner` with a signal of its own.
    pub fn new(inner: F) -> Self {
        OnWake::on(Arc::new(Signal::new()), inner)
    }
}

impl<F, O> OnWake<F, O>
where
    O: Wake + AsRef<Signal> + Send + Sync + 'static,
{
    /// `inner` woken through `owner`, whose [`Wake`] must [`Signal::fire`] the signal it
    /// gives. One `OnWake` per owner at a time: two would share the one flag. One after
    /// another is fine: each one's first poll reaches its inner future, whatever the last
    /// one left in the flag (an HTTP/1 connection gets new watchers each time it is made
    /// again after being parked).
    ///
    /// The waker owns `owner`: `inner` must register it only where its own futures hold
    /// it (timers, `Notify`, `watch`: dropped with them), never in something `owner` owns
    /// and that outlives `inner`, such as a socket's readiness slot, or `owner` would own
    /// itself and never be dropped.
    pub fn on(owner: Arc<O>, inner: F) -> Self {
        (*owner).as_ref().woken.store(true, Ordering::Release);
        let waker = Waker::from(Arc::clone(&owner));
        OnWake {
            inner,
            owner,
            waker,
        }
    }
}

impl<F: Future, O: AsRef<Signal>> Future for OnWake<F, O> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let signal = (**this.owner).as_ref();
        // Registered before the flag is taken: a wake between the two is not lost, it sets
        // the flag this poll then sees.
        signal.task.register(cx.waker());
        if !signal.woken.swap(false, Ordering::AcqRel) {
            return Poll::Pending;
        }
        this.inner.poll(&mut Context::from_waker(this.waker))
    }
}

impl<F, O: AsRef<Signal>> std::fmt::Debug for OnWake<F, O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnWake")
            .field(
                "woken",
                &(*self.owner).as_ref().woken.load(Ordering::Relaxed),
            )
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    /// Counts its polls; ready once `ready` is set (and only when polled after it was).
    struct Counted<'a> {
        polls: &'a AtomicUsize,
        ready: &'a AtomicBool,
    }

    impl Future for Counted<'_> {
        type Output = ();
        fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
            self.polls.fetch_add(1, Ordering::Relaxed);
            if self.ready.load(Ordering::Relaxed) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        }
    }

    #[test]
    fn the_inner_future_is_polled_once_until_its_own_waker_fires() {
        let (polls, ready) = (AtomicUsize::new(0), AtomicBool::new(false));
        let mut f = std::pin::pin!(OnWake::new(Counted {
            polls: &polls,
            ready: &ready,
        }));
        let mut cx = Context::from_waker(Waker::noop());
        assert!(f.as_mut().poll(&mut cx).is_pending());
        assert_eq!(
            polls.load(Ordering::Relaxed),
            1,
            "the first poll reaches it"
        );
        ready.store(true, Ordering::Relaxed);
        // Woken for something else: the inner future is not polled, so not seen ready.
        for _ in 0..3 {
            assert!(f.as_mut().poll(&mut cx).is_pending());
        }
        assert_eq!(
            polls.load(Ordering::Relaxed),
            1,
            "polls without its wake skip it"
        );
        f.waker.wake_by_ref();
        assert!(
            f.as_mut().poll(&mut cx).is_ready(),
            "its own wake lets it run"
        );
        assert_eq!(polls.load(Ordering::Relaxed), 2);
    }

    /// An owner's next `OnWake`, made after the last one was polled (its flag taken), still
    /// reaches its inner future on its first poll.
    #[test]
    fn a_later_on_wake_of_the_same_owner_is_polled_at_first() {
        let owner = Arc::new(Signal::new());
        let mut cx = Context::from_waker(Waker::noop());
        let (polls, ready) = (AtomicUsize::new(0), AtomicBool::new(false));
        for round in 1..=2 {
            let mut f = std::pin::pin!(OnWake::on(
                Arc::clone(&owner),
                Counted {
                    polls: &polls,
                    ready: &ready,
                }
            ));
            assert!(f.as_mut().poll(&mut cx).is_pending());
            assert_eq!(polls.load(Ordering::Relaxed), round, "round {round}");
        }
    }

    #[test]
    fn its_own_wake_wakes_the_task_that_polled_it() {
        struct Count(AtomicUsize);
        impl Wake for Count {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, Ordering::Relaxed);
            }
        }
        let task = Arc::new(Count(AtomicUsize::new(0)));
        let task_waker = Waker::from(Arc::clone(&task));
        let (polls, ready) = (AtomicUsize::new(0), AtomicBool::new(false));
        let mut f = std::pin::pin!(OnWake::new(Counted {
            polls: &polls,
            ready: &ready,
        }));
        assert!(f
            .as_mut()
            .poll(&mut Context::from_waker(&task_waker))
            .is_pending());
        f.waker.wake_by_ref();
        assert_eq!(task.0.load(Ordering::Relaxed), 1, "the task is woken");
    }

    /// A timer inside wakes it through tokio's timer, on paused time: nothing else polls it.
    #[tokio::test(start_paused = true)]
    async fn a_sleep_inside_completes_when_its_time_comes() {
        let start = tokio::time::Instant::now();
        OnWake::new(tokio::time::sleep(Duration::from_secs(5))).await;
        assert_eq!(start.elapsed(), Duration::from_secs(5));
    }

    /// Beside a busy branch in a `select!`, the watcher still fires at its time, and the busy
    /// branch's wakes do not poll it.
    #[tokio::test(start_paused = true)]
    async fn beside_a_busy_branch_it_fires_at_its_time() {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(1);
        let feeder = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(10)).await;
                if tx.send(()).await.is_err() {
                    return;
                }
            }
        });
        let start = tokio::time::Instant::now();
        let watcher = OnWake::new(tokio::time::sleep(Duration::from_millis(1000)));
        tokio::pin!(watcher);
        let mut got = 0u32;
        loop {
            tokio::select! {
                biased;
                Some(()) = rx.recv() => got += 1,
                () = &mut watcher => break,
            }
        }
        assert_eq!(start.elapsed(), Duration::from_millis(1000));
        assert!(got >= 90, "the busy branch ran meanwhile ({got} messages)");
        feeder.abort();
    }
}
