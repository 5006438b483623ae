//! The futures that wait out the pool-wide pause: `GateOpen`, and `SendWhenOpen`, which
//! stamps a reserved request in the same step and queues it again if a pause began first.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use ratebucket_core::{Instant, SendStamp, Ticket, TicketState};

use crate::error::ReserveError;
use crate::shared::{Shared, State};
use crate::timer::BoxFuture;

/// The longest a gate waiter sleeps before looking again when the reopening instant
/// cannot be expressed on the runtime's clock (a pause configured near `Duration::MAX`).
const LONGEST_NAP: Duration = Duration::from_secs(3600);

/// The future returned by [`Limiter::gate_open`](crate::Limiter::gate_open): resolves when the gate is open.
///
/// Each waiter sleeps until the reopening instant and is polled once more then; if a newer
/// wave closed the gate again meanwhile, it sleeps on until that pause ends.
///
/// Between this future resolving and a request being stamped, another task's throttle
/// may close the gate again; a request about to be sent should use
/// [`Limiter::send_when_open`](crate::Limiter::send_when_open), which checks and stamps in one step.
#[must_use = "futures do nothing unless awaited"]
pub struct GateOpen<'a> {
    wait: GateWait<'a>,
}

impl<'a> GateOpen<'a> {
    pub(crate) fn new(shared: &'a Shared) -> GateOpen<'a> {
        GateOpen { wait: GateWait::new(shared) }
    }
}

impl Future for GateOpen<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.get_mut().wait.poll_with(cx, |state, now| {
            match state.arbiter.status().gate.reopens_at(now) {
                Some(reopens) => Err(reopens),
                None => Ok(()),
            }
        })
    }
}

impl fmt::Debug for GateOpen<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GateOpen").finish_non_exhaustive()
    }
}

/// The future returned by [`Limiter::send_when_open`](crate::Limiter::send_when_open): resolves, once the gate is open,
/// to the [`SendStamp`] of the request a granted reservation pays for.
///
/// The gate is checked and the stamp taken under one lock, so a throttle reported by
/// another task can never slip in between: a request stamped by this future is never
/// sent into a pause, and its epoch is the one it was really sent in.
///
/// A reservation granted before a throttle closed the gate is not held through the pause
/// to leave the moment it ends, with every other such grant, into a provider that has only
/// refilled the pause's worth: its grant is taken back and it queues again, ahead of the
/// waiters that came after it ([`Desk::requeue_unsent`]), and this future resolves
/// when it is granted anew. Dropping the future then leaves the reservation queued; it is
/// withdrawn when the [`Reservation`](crate::Reservation) is dropped.
///
/// [`Desk::requeue_unsent`]: ratebucket_core::Desk::requeue_unsent
#[must_use = "futures do nothing unless awaited"]
pub struct SendWhenOpen<'a> {
    shared: &'a Shared,
    /// `None` only for a reservation that could not become a ticket (it had ended).
    ticket: Option<Ticket>,
    /// Whether a waker is registered for the ticket (cleared when dropped).
    registered: bool,
    /// The stamp the grant already took ([`ReserveOptions::send_on_grant`]).
    ///
    /// [`ReserveOptions::send_on_grant`]: crate::ReserveOptions::send_on_grant
    stamped: Option<SendStamp>,
}

impl<'a> SendWhenOpen<'a> {
    pub(crate) fn new(shared: &'a Shared, ticket: Option<Ticket>) -> SendWhenOpen<'a> {
        SendWhenOpen { shared, ticket, registered: false, stamped: None }
    }

    /// Resolves at once to `sent`, the stamp the grant took.
    pub(crate) fn stamped(shared: &'a Shared, sent: SendStamp) -> SendWhenOpen<'a> {
        SendWhenOpen { shared, ticket: None, registered: false, stamped: Some(sent) }
    }
}

impl Future for SendWhenOpen<'_> {
    type Output = Result<SendStamp, ReserveError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if let Some(sent) = this.stamped.take() {
            return Poll::Ready(Ok(sent));
        }
        let shared = this.shared;
        let Some(ticket) = this.ticket else {
            return Poll::Ready(Err(ReserveError::Aborted));
        };
        let mut state = shared.lock();
        let now = shared.now();
        match state.arbiter.state(ticket) {
            Some(TicketState::Granted) => match state.arbiter.stamp_send_if_open(ticket, now) {
                Ok(stamp) => {
                    if std::mem::take(&mut this.registered) {
                        shared.forget(&mut state, ticket);
                    }
                    Poll::Ready(Ok(stamp))
                }
                Err(_closed) => {
                    // Granted before the pause began: queue again; the driver grants it
                    // after the pause, from what the buckets refill.
                    let requeued = state.arbiter.desk().requeue_unsent(ticket, now);
                    debug_assert!(requeued.is_ok(), "granted and unsent: {requeued:?}");
                    Shared::register(&mut state, ticket, cx.waker());
                    this.registered = true;
                    shared.settle(state);
                    Poll::Pending
                }
            },
            Some(TicketState::Queued) => {
                Shared::register(&mut state, ticket, cx.waker());
                this.registered = true;
                Poll::Pending
            }
            None => {
                let reason = shared.forget(&mut state, ticket);
                this.registered = false;
                Poll::Ready(Err(reason.map_or(ReserveError::Aborted, ReserveError::from)))
            }
        }
    }
}

impl Drop for SendWhenOpen<'_> {
    fn drop(&mut self) {
        if self.registered {
            let shared = self.shared;
            let mut state = shared.lock();
            if let Some(ticket) = self.ticket {
                shared.forget(&mut state, ticket);
            }
        }
    }
}

impl fmt::Debug for SendWhenOpen<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SendWhenOpen").field("ticket", &self.ticket).finish_non_exhaustive()
    }
}

/// Waiting for the gate to reopen: try under the lock; if the gate is closed, sleep until
/// it reopens and try again.
struct GateWait<'a> {
    shared: &'a Shared,
    sleep: Option<(Instant, BoxFuture)>,
}

impl<'a> GateWait<'a> {
    fn new(shared: &'a Shared) -> GateWait<'a> {
        GateWait { shared, sleep: None }
    }

    /// Runs `attempt` under the limiter's lock until it succeeds; an `Err(reopens)` means
    /// "closed until `reopens`". Every `Pending` leaves a timer armed that will wake `cx`.
    fn poll_with<T>(
        &mut self,
        cx: &mut Context<'_>,
        mut attempt: impl FnMut(&mut State, Instant) -> Result<T, Instant>,
    ) -> Poll<T> {
        let shared = self.shared;
        loop {
            let tried = {
                let mut state = shared.lock();
                let now = shared.now();
                attempt(&mut state, now)
            };
            let at = match tried {
                Ok(done) => {
                    self.sleep = None;
                    return Poll::Ready(done);
                }
                Err(at) => at,
            };
            let sleep = match &mut self.sleep {
                Some((armed, sleep)) if *armed == at => sleep,
                slot => {
                    let sleep = match shared.to_std(at) {
                        Some(deadline) => shared.timer.sleep_until(deadline),
                        None => shared.sleep(LONGEST_NAP),
                    };
                    &mut slot.insert((at, sleep)).1
                }
            };
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.sleep = None;
        }
    }
}
