//! The `GateOpen` future: waits out the pool-wide pause.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use ratebucket_core::Instant;

use crate::limiter::Limiter;
use crate::timer::BoxFuture;

/// The future returned by [`Limiter::gate_open`]: resolves when the gate is open.
///
/// Each waiter sleeps until the reopening instant and is polled once more then; if a newer
/// wave closed the gate again meanwhile, it sleeps on until that pause ends.
#[must_use = "futures do nothing unless awaited"]
pub struct GateOpen<'a> {
    limiter: &'a Limiter,
    sleep: Option<(Instant, BoxFuture)>,
}

impl<'a> GateOpen<'a> {
    pub(crate) fn new(limiter: &'a Limiter) -> GateOpen<'a> {
        GateOpen {
            limiter,
            sleep: None,
        }
    }
}

impl Future for GateOpen<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let shared = &this.limiter.shared;
        loop {
            let reopens = {
                let state = shared.lock();
                state.arbiter.gate().reopens_at(shared.now())
            };
            let Some(at) = reopens else {
                return Poll::Ready(());
            };
            let Some(deadline) = shared.to_std(at) else {
                // Closed "forever" cannot happen (pauses are capped); wait for a re-poll.
                return Poll::Pending;
            };
            let sleep = match &mut this.sleep {
                Some((armed, sleep)) if *armed == at => sleep,
                slot => &mut slot.insert((at, shared.timer.sleep_until(deadline))).1,
            };
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            this.sleep = None;
        }
    }
}

impl fmt::Debug for GateOpen<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GateOpen").finish_non_exhaustive()
    }
}
