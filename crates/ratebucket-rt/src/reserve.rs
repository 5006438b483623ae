//! The `Reserve` future and the RAII `Reservation` it resolves to.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use ratebucket_core::{Ticket, TicketError, TicketState};

use crate::error::ReserveError;
use crate::limiter::{Limiter, Shared};
use crate::sync::Ordering;
use crate::timer::BoxFuture;

/// Limits on how long a reservation may wait.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReserveOptions {
    /// Refuse at once (with [`ReserveError::WouldWait`]) when the estimated wait exceeds
    /// this. `Some(Duration::ZERO)` means "only if it can go now".
    pub max_wait: Option<Duration>,
    /// Never wait past this instant: refuse at once if the estimate ends after it, and
    /// withdraw with [`ReserveError::DeadlinePassed`] if it arrives while still queued.
    pub deadline: Option<std::time::Instant>,
}

impl ReserveOptions {
    /// Sets `max_wait`.
    pub fn max_wait(mut self, max_wait: Duration) -> ReserveOptions {
        self.max_wait = Some(max_wait);
        self
    }

    /// Sets the deadline.
    pub fn deadline(mut self, deadline: std::time::Instant) -> ReserveOptions {
        self.deadline = Some(deadline);
        self
    }
}

/// The future returned by [`Limiter::reserve`]: resolves to a granted [`Reservation`].
///
/// It is polled once to join the queue and once more when its own grant arrives (the
/// driver wakes only the granted waiter). Dropping it at any point is safe: a queued claim
/// is withdrawn, and a grant it never collected is released.
#[must_use = "a reservation does nothing unless awaited"]
pub struct Reserve<'a> {
    limiter: &'a Limiter,
    cost: &'a [u64],
    options: ReserveOptions,
    state: Phase,
    deadline_sleep: Option<BoxFuture>,
}

enum Phase {
    Start,
    Queued(Ticket),
    Done,
}

impl<'a> Reserve<'a> {
    pub(crate) fn new(limiter: &'a Limiter, cost: &'a [u64], options: ReserveOptions) -> Self {
        Reserve {
            limiter,
            cost,
            options,
            state: Phase::Start,
            deadline_sleep: None,
        }
    }

    fn granted(&mut self, ticket: Ticket) -> Poll<Result<Reservation, ReserveError>> {
        self.state = Phase::Done;
        self.limiter.shared.resolved.fetch_add(1, Ordering::Relaxed);
        Poll::Ready(Ok(Reservation {
            shared: Arc::clone(&self.limiter.shared),
            ticket: Some(ticket),
        }))
    }

    fn failed(&mut self, error: ReserveError) -> Poll<Result<Reservation, ReserveError>> {
        self.state = Phase::Done;
        self.limiter.shared.resolved.fetch_add(1, Ordering::Relaxed);
        Poll::Ready(Err(error))
    }
}

impl Future for Reserve<'_> {
    type Output = Result<Reservation, ReserveError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let shared = &this.limiter.shared;
        shared.polls.fetch_add(1, Ordering::Relaxed);
        match this.state {
            Phase::Done => panic!("`Reserve` polled after completion"),
            Phase::Start => {
                // Read before locking, to keep the lock short: an instant earlier than one
                // another caller already gave the core counts as that one.
                let now = shared.now();
                let mut state = shared.lock();
                let until_deadline = this
                    .options
                    .deadline
                    .map(|d| d.saturating_duration_since(shared.timer.now()));
                let max_wait = match (this.options.max_wait, until_deadline) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                let reserved = state.arbiter.reserve_within(this.cost, max_wait, now);
                let ticket = match reserved {
                    Ok(ticket) => ticket,
                    Err(e) => {
                        shared.settle(state);
                        return this.failed(e);
                    }
                };
                if state.arbiter.state(ticket) == Some(TicketState::Granted) {
                    shared.settle(state);
                    return this.granted(ticket);
                }
                Shared::register(&mut state, ticket, cx.waker());
                shared.settle(state);
                this.state = Phase::Queued(ticket);
                if let Some(deadline) = this.options.deadline {
                    this.deadline_sleep = Some(shared.timer.sleep_until(deadline));
                }
            }
            Phase::Queued(ticket) => {
                let mut state = shared.lock();
                match state.arbiter.state(ticket) {
                    Some(TicketState::Granted) => {
                        shared.forget(&mut state, ticket);
                        drop(state);
                        return this.granted(ticket);
                    }
                    Some(TicketState::Queued) => {
                        Shared::register(&mut state, ticket, cx.waker());
                    }
                    None => {
                        let reason = shared.forget(&mut state, ticket);
                        drop(state);
                        let error = reason.map_or(ReserveError::Aborted, ReserveError::from);
                        return this.failed(error);
                    }
                }
            }
        }
        if let Some(sleep) = &mut this.deadline_sleep
            && sleep.as_mut().poll(cx).is_ready()
        {
            let Phase::Queued(ticket) = this.state else {
                unreachable!("only a queued reservation sleeps")
            };
            let mut state = shared.lock();
            if state.arbiter.state(ticket) == Some(TicketState::Granted) {
                shared.forget(&mut state, ticket);
                drop(state);
                return this.granted(ticket);
            }
            state.arbiter.cancel(ticket, shared.now());
            shared.forget(&mut state, ticket);
            shared.settle(state);
            return this.failed(ReserveError::DeadlinePassed);
        }
        Poll::Pending
    }
}

impl Drop for Reserve<'_> {
    fn drop(&mut self) {
        if let Phase::Queued(ticket) = self.state {
            let shared = &self.limiter.shared;
            let mut state = shared.lock();
            // Withdraws a queued claim, or releases a grant nobody collected.
            state.arbiter.cancel(ticket, shared.now());
            shared.forget(&mut state, ticket);
            shared.settle(state);
        }
    }
}

impl fmt::Debug for Reserve<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reserve")
            .field("cost", &self.cost)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// A granted reservation. [`commit`](Reservation::commit) it with the actual cost once
/// known.
///
/// Every way it ends follows one charging rule (ADR 0012):
///
/// - **before the request is sent**, ending it gives the whole cost back, whether it is
///   dropped or [`release`](Reservation::release)d;
/// - **once it was sent** (stamped by [`Limiter::send_when_open`] or
///   [`Limiter::stamp_send_for`]), it stays charged as reserved unless the provider says
///   otherwise: [`commit`](Reservation::commit) with the reported usage, or
///   [`release`](Reservation::release) when the provider answered that it did not count
///   the request (a 429, a 5xx, a refusal). Dropping it, or
///   [`keep`](Reservation::keep), leaves it charged: a timeout, a cancelled future or a cut
///   reply does not prove the provider did not count it.
///
/// A reservation dropped without being sent is returned at once, so a loop that reserves
/// and drops paces nothing: use [`Limiter::acquire`] to take quota for good.
#[must_use = "dropping an unsent reservation returns it at once; use `Limiter::acquire` to take quota for good"]
pub struct Reservation {
    shared: Arc<Shared>,
    ticket: Option<Ticket>,
}

impl Reservation {
    /// The reservation's ticket in the core.
    pub fn ticket(&self) -> Ticket {
        self.ticket
            .expect("a reservation holds its ticket until consumed")
    }

    /// Reconciles against the actual cost (one entry per dimension): an over-estimate is
    /// refunded, an under-estimate is charged as debt. On a dimension-count mismatch the
    /// reservation is released whole and the error returned.
    pub fn commit(mut self, actual: &[u64]) -> Result<(), TicketError> {
        self.commit_now(actual)
    }

    fn commit_now(&mut self, actual: &[u64]) -> Result<(), TicketError> {
        let ticket = self.ticket.take().expect("held until consumed");
        let now = self.shared.now();
        let mut state = self.shared.lock();
        let reserved = crate::metrics::ENABLED
            .then(|| state.arbiter.cost(ticket).map(<[u64]>::to_vec))
            .flatten();
        let result = state.arbiter.commit(ticket, actual, now);
        if result.is_err() {
            state.arbiter.cancel(ticket, now);
        } else if let Some(reserved) = reserved {
            crate::metrics::committed(&state.names, &reserved, actual);
        }
        self.shared.settle(state);
        result
    }

    /// Commits like [`Reservation::commit`], then runs `fold` before anyone else can be
    /// granted: the refund an over-estimate earns waits until `fold` has told the limiter
    /// what the provider reports (through [`Limiter`](crate::Limiter) calls such as
    /// `observe_remaining`), so a provider that charged the whole reservation takes the
    /// refund back before it launches the next waiter.
    pub fn commit_then<R>(
        mut self,
        actual: &[u64],
        fold: impl FnOnce() -> R,
    ) -> (Result<(), TicketError>, R) {
        /// A hold on grants, ended when dropped (even if `fold` panics).
        struct Hold(Arc<Shared>);
        impl Drop for Hold {
            fn drop(&mut self) {
                let mut state = self.0.lock();
                state.arbiter.unhold(self.0.now());
                self.0.settle(state);
            }
        }
        self.shared.lock().arbiter.hold();
        let hold = Hold(Arc::clone(&self.shared));
        let result = self.commit_now(actual);
        let folded = fold();
        drop(hold);
        (result, folded)
    }

    /// Returns the whole reservation: the request was never sent, or the provider
    /// answered that it did not count it.
    pub fn release(mut self) {
        if let Some(ticket) = self.ticket.take() {
            let mut state = self.shared.lock();
            let now = self.shared.now();
            if state.arbiter.release(ticket, now).is_err() {
                // Not granted (queued again by `SendWhenOpen`, then given up): withdraw.
                state.arbiter.cancel(ticket, now);
            }
            self.shared.settle(state);
        }
    }

    /// Ends the reservation with its request's outcome unknown (a timeout, a cut reply):
    /// charged as reserved if it was sent, returned if it never was. What dropping does.
    pub fn keep(mut self) {
        self.end();
    }

    fn end(&mut self) {
        if let Some(ticket) = self.ticket.take() {
            let mut state = self.shared.lock();
            state.arbiter.cancel(ticket, self.shared.now());
            self.shared.settle(state);
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.end();
    }
}

impl fmt::Debug for Reservation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reservation")
            .field("ticket", &self.ticket)
            .finish()
    }
}
