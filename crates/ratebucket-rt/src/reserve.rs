//! The `Reserve` future and the RAII `Reservation` it resolves to.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use ratebucket_core::{
    Caller, Instant, InvalidLimit, Replied, Reply, Report, SendStamp, Settle, Ticket, TicketError,
    TicketState,
};

use crate::lane::LaneGrant;

use crate::error::ReserveError;
use crate::limiter::Limiter;
use crate::shared::{Shared, State};
use crate::stripes::{Stripe, Stripes};
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
    /// The request leaves the moment it is granted (an HTTP client's): a grant made
    /// while the gate is open stamps the send under the same lock, and
    /// [`Limiter::send_when_open`](crate::Limiter::send_when_open) then resolves at once
    /// without taking the lock again. The reservation counts as sent from its grant on (a
    /// drop leaves it charged, [`Reservation`]'s rule for a sent request). A grant of the
    /// express lane, or one made while the gate is closed, is stamped by `send_when_open`
    /// as usual.
    pub send_on_grant: bool,
    /// Who the reservation is for: a tenant, whose share of a busy pool follows its weight
    /// ([`Limiter::set_weight`](crate::Limiter::set_weight)), and a priority class, granted
    /// ahead of lower classes until they have aged. The default (tenant 0, default class)
    /// keeps first come, first served.
    pub caller: Caller,
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

    /// Sets who the reservation is for ([`ReserveOptions::caller`]).
    pub fn caller(mut self, caller: Caller) -> ReserveOptions {
        self.caller = caller;
        self
    }

    /// Sets `send_on_grant`: the grant stamps the send when the gate is open.
    pub fn send_on_grant(mut self) -> ReserveOptions {
        self.send_on_grant = true;
        self
    }
}

/// The future returned by [`Limiter::reserve`](crate::Limiter::reserve): resolves to a granted [`Reservation`].
///
/// It is polled once to join the queue and once more when its own grant arrives (the
/// driver wakes only the granted waiter). Dropping it at any point is safe: a queued claim
/// is withdrawn, and a grant it never collected is released.
#[must_use = "a reservation does nothing unless awaited"]
pub struct Reserve<'a> {
    shared: &'a Arc<Shared>,
    stripes: &'a Stripes,
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
    #[inline]
    pub(crate) fn new(limiter: &'a Limiter, cost: &'a [u64], options: ReserveOptions) -> Self {
        let (shared, stripes) = (&limiter.shared, &*limiter.stripes);
        Reserve { shared, stripes, cost, options, state: Phase::Start, deadline_sleep: None }
    }

    /// Waits within `options` (a `max_wait`, a deadline): `limiter.reserve(cost).with(options)`.
    /// Takes effect only before the first poll, when the reservation joins the queue.
    pub fn with(mut self, options: ReserveOptions) -> Reserve<'a> {
        if matches!(self.state, Phase::Start) {
            self.options = options;
        }
        self
    }

    fn granted(
        &mut self,
        ticket: Ticket,
        sent: Option<SendStamp>,
    ) -> Poll<Result<Reservation, ReserveError>> {
        self.state = Phase::Done;
        self.shared.resolved.fetch_add(1, Ordering::Relaxed);
        let mut reservation = Reservation::of_ticket(self.stripes.here(), ticket);
        if let Some(sent) = sent {
            reservation.held = Held::Stamped(ticket, sent);
        }
        Poll::Ready(Ok(reservation))
    }

    /// The send stamp of a grant under `state`'s lock, when `send_on_grant` asks for one
    /// and the gate is open.
    fn stamp(&self, state: &mut State, ticket: Ticket, now: Instant) -> Option<SendStamp> {
        if !self.options.send_on_grant {
            return None;
        }
        state.arbiter.stamp_send_if_open(ticket, now).ok()
    }

    fn failed(&mut self, error: ReserveError) -> Poll<Result<Reservation, ReserveError>> {
        self.state = Phase::Done;
        self.shared.resolved.fetch_add(1, Ordering::Relaxed);
        Poll::Ready(Err(error))
    }
}

impl Future for Reserve<'_> {
    type Output = Result<Reservation, ReserveError>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if let Phase::Start = this.state
            && let Some(grant) = this.shared.lane.try_take(this.cost)
        {
            // The express lane: no lock, no ticket, no clock (nor the counters of
            // `Limiter::stats`, which would be shared words to contend on).
            this.state = Phase::Done;
            return Poll::Ready(Ok(Reservation::of_lane(this.stripes.here(), grant)));
        }
        Reserve::poll_arbiter(this, cx)
    }
}

impl Reserve<'_> {
    /// [`Reserve::poll`] through the arbiter: joining its queue, or collecting a grant.
    #[inline(never)]
    fn poll_arbiter(
        this: &mut Self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Reservation, ReserveError>> {
        let shared = this.shared;
        shared.polls.fetch_add(1, Ordering::Relaxed);
        match this.state {
            Phase::Done => panic!("`Reserve` polled after completion"),
            Phase::Start => {
                // Read before locking, to keep the lock short: an instant earlier than one
                // another caller already gave the core counts as that one.
                let now = shared.now();
                let mut state = shared.lock();
                let until_deadline =
                    this.options.deadline.map(|d| d.saturating_duration_since(shared.timer.now()));
                let max_wait = match (this.options.max_wait, until_deadline) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                let reserved =
                    state.arbiter.reserve_for(this.options.caller, this.cost, max_wait, now);
                let ticket = match reserved {
                    Ok(ticket) => ticket,
                    Err(e) => {
                        shared.settle(state);
                        return this.failed(e);
                    }
                };
                if state.arbiter.state(ticket) == Some(TicketState::Granted) {
                    let sent = this.stamp(&mut state, ticket, now);
                    shared.settle(state);
                    return this.granted(ticket, sent);
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
                        let sent = this
                            .options
                            .send_on_grant
                            .then(|| this.stamp(&mut state, ticket, shared.now()))
                            .flatten();
                        drop(state);
                        return this.granted(ticket, sent);
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
                return this.granted(ticket, None);
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
    #[inline]
    fn drop(&mut self) {
        if let Phase::Queued(ticket) = self.state {
            withdraw(self.shared, ticket);
        }
    }
}

/// Withdraws `ticket`'s queued claim, or releases a grant nobody collected.
#[inline(never)]
fn withdraw(shared: &Shared, ticket: Ticket) {
    let mut state = shared.lock();
    state.arbiter.cancel(ticket, shared.now());
    shared.forget(&mut state, ticket);
    shared.settle(state);
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
/// - **once it was sent** (stamped by [`Limiter::send_when_open`](crate::Limiter::send_when_open)), it stays charged as reserved unless the provider says
///   otherwise: [`commit`](Reservation::commit) with the reported usage, or
///   [`release`](Reservation::release) when the provider answered that it did not count
///   the request (a 429, a 5xx, a refusal). Dropping it, or
///   [`keep`](Reservation::keep), leaves it charged: a timeout, a cancelled future or a cut
///   reply does not prove the provider did not count it.
///
/// A reservation dropped without being sent is returned at once, so a loop that reserves
/// and drops paces nothing: use [`Limiter::acquire`](crate::Limiter::acquire) to take quota for good.
#[must_use = "dropping an unsent reservation returns it at once; use `Limiter::acquire` to take quota for good"]
pub struct Reservation {
    /// Its limiter, through the calling thread's stripe.
    stripe: Arc<Stripe>,
    held: Held,
}

/// What a reservation holds until it ends.
enum Held {
    /// A grant of the arbiter's.
    Ticket(Ticket),
    /// A grant of the arbiter's whose send its grant stamped
    /// ([`ReserveOptions::send_on_grant`]), until `send_when_open` takes the stamp.
    Stamped(Ticket, SendStamp),
    /// A grant of the express lane's, never sent (sending makes it a ticket).
    Lane(LaneGrant),
    /// Ended.
    Nothing,
}

impl Reservation {
    pub(crate) fn of_ticket(stripe: &Arc<Stripe>, ticket: Ticket) -> Reservation {
        Reservation { stripe: Arc::clone(stripe), held: Held::Ticket(ticket) }
    }

    #[inline]
    pub(crate) fn of_lane(stripe: &Arc<Stripe>, grant: LaneGrant) -> Reservation {
        if crate::metrics::ENABLED {
            stripe.shared.tally.grant();
        }
        Reservation { stripe: Arc::clone(stripe), held: Held::Lane(grant) }
    }

    /// The reservation's ticket in the core; `None` for a grant of the express lane
    /// (made without the arbiter while nothing needed order), which gets a ticket when
    /// its request is sent ([`Limiter::send_when_open`](crate::Limiter::send_when_open)).
    pub fn ticket(&self) -> Option<Ticket> {
        match self.held {
            Held::Ticket(ticket) | Held::Stamped(ticket, _) => Some(ticket),
            _ => None,
        }
    }

    /// Reconciles against the actual cost (one entry per dimension): an over-estimate is
    /// refunded, an under-estimate is charged as debt. On a dimension-count mismatch the
    /// reservation is released whole and the error returned.
    #[inline]
    pub fn commit(mut self, actual: &[u64]) -> Result<(), TicketError> {
        if let Held::Lane(grant) = self.held
            && self.stripe.shared.lane.settle(&grant, actual)
        {
            // The express lane's own end: the over-estimate went back into its lease.
            self.held = Held::Nothing;
            if crate::metrics::ENABLED {
                let cost = self.stripe.shared.lane.cost(&grant);
                let mut back = [0; ratebucket_core::MAX_LANE_DIMENSIONS];
                for (b, (c, a)) in back.iter_mut().zip(cost.iter().zip(actual)) {
                    *b = c - a;
                }
                self.stripe.shared.tally.refund(&back);
            }
            return Ok(());
        }
        self.commit_now(actual)
    }

    #[inline(never)]
    fn commit_now(&mut self, actual: &[u64]) -> Result<(), TicketError> {
        match std::mem::replace(&mut self.held, Held::Nothing) {
            Held::Ticket(ticket) | Held::Stamped(ticket, _) => self.commit_ticket(ticket, actual),
            Held::Lane(grant) => self.commit_lane(grant, actual),
            Held::Nothing => Err(TicketError::Unknown),
        }
    }

    fn commit_ticket(&self, ticket: Ticket, actual: &[u64]) -> Result<(), TicketError> {
        let now = self.stripe.shared.now();
        let mut state = self.stripe.shared.lock();
        let reserved = crate::metrics::ENABLED
            .then(|| state.arbiter.desk().cost(ticket).map(<[u64]>::to_vec))
            .flatten();
        let result = state.arbiter.commit(ticket, actual, now);
        if result.is_err() {
            state.arbiter.cancel(ticket, now);
        } else if let Some(reserved) = reserved {
            crate::metrics::committed(&self.stripe.shared.names(), &reserved, actual);
        }
        self.stripe.shared.settle(state);
        result
    }

    /// Ends a lane grant: an over-estimate goes back into its lease if that is still open;
    /// debt, or a lease already returned, goes through the arbiter.
    fn commit_lane(&self, grant: LaneGrant, actual: &[u64]) -> Result<(), TicketError> {
        let lane = &self.stripe.shared.lane;
        if lane.settle(&grant, actual) {
            return Ok(());
        }
        if actual.len() != lane.dims() {
            self.end_lane(grant, None);
            return Err(TicketError::WrongDimensions { expected: lane.dims(), got: actual.len() });
        }
        self.end_lane(grant, Some(actual));
        Ok(())
    }

    /// Ends a lane grant through the arbiter, charged `actual` (`None`: nothing, the
    /// request never left), unless a grant never sent fits back into its open lease.
    #[cold]
    fn end_lane(&self, grant: LaneGrant, actual: Option<&[u64]>) {
        let lane = &self.stripe.shared.lane;
        if actual.is_none() && lane.release(&grant) {
            return;
        }
        let committed = actual.is_some();
        let dims = lane.dims();
        let cost = lane.cost(&grant);
        let zeros = [0u64; ratebucket_core::MAX_LANE_DIMENSIONS];
        let actual = actual.unwrap_or(&zeros[..dims]);
        let now = self.stripe.shared.now();
        let mut state = self.stripe.shared.lock();
        // Same dimensions as the arbiter: the lane only grants costs that match them.
        let ended = state.arbiter.desk().end_grant(&cost[..dims], actual, grant.epoch(), now);
        if ended.is_ok() && committed {
            crate::metrics::committed(&self.stripe.shared.names(), &cost[..dims], actual);
        }
        self.stripe.shared.settle(state);
    }

    /// The stamp its grant took, once ([`ReserveOptions::send_on_grant`]).
    pub(crate) fn take_sent(&mut self) -> Option<SendStamp> {
        let Held::Stamped(ticket, sent) = self.held else {
            return None;
        };
        self.held = Held::Ticket(ticket);
        Some(sent)
    }

    /// Makes a lane grant an ordinary granted ticket (for a send, or a hold), and returns
    /// the ticket; `None` once the reservation has ended.
    pub(crate) fn ticket_for_send(&mut self) -> Option<Ticket> {
        match self.held {
            Held::Ticket(ticket) | Held::Stamped(ticket, _) => Some(ticket),
            Held::Nothing => None,
            Held::Lane(grant) => {
                let cost = self.stripe.shared.lane.cost(&grant);
                let cost = &cost[..self.stripe.shared.lane.dims()];
                let now = self.stripe.shared.now();
                let mut state = self.stripe.shared.lock();
                let adopted = state.arbiter.desk().adopt_grant(cost, grant.epoch(), now);
                self.stripe.shared.settle(state);
                let ticket = adopted.ok()?;
                self.held = Held::Ticket(ticket);
                Some(ticket)
            }
        }
    }

    /// Folds the quota reports of the reply to its request, stamped `sent`, while the
    /// reservation lives on (a stream's head, read before its body), under one lock:
    /// learns the limit, the burst and how the provider counts, and moves the level
    /// ([`Arbiter::observe_quota`](ratebucket_core::Arbiter::observe_quota)); the
    /// reservation ends later, with the stream. Returns the first report naming a
    /// dimension the limiter lacks (the rest are folded).
    pub fn observe(&self, sent: SendStamp, reports: &[Report]) -> Result<(), InvalidLimit> {
        let now = self.stripe.shared.now();
        let mut state = self.stripe.shared.lock();
        let mut bad = Ok(());
        for report in reports {
            let before = state.arbiter.dimension(report.dimension, now).and_then(|d| d.learned);
            match state.arbiter.observe_quota(report.dimension, sent, report.quota, now) {
                Ok(after) => {
                    self.stripe.shared.names().trace_learned(report.dimension, before, after)
                }
                Err(e) => bad = bad.and(Err(e)),
            }
        }
        self.stripe.shared.settle(state);
        bad
    }

    /// Ends the reservation with the provider's reply to its request, as one input under
    /// one lock ([`Arbiter::reply`](ratebucket_core::Arbiter::reply)): the throttle or abort
    /// it calls for, the charge (or the return, or the keep) and every quota report, then
    /// one grant pass. Nobody is granted in between, so a refund the charge earns reaches
    /// the next waiter only once the provider's own count has been heard.
    pub fn reply(mut self, reply: &Reply<'_>) -> Replied {
        let held = std::mem::replace(&mut self.held, Held::Nothing);
        let now = self.stripe.shared.now();
        let mut state = self.stripe.shared.lock();
        let ticket = match held {
            Held::Ticket(ticket) | Held::Stamped(ticket, _) => Some(ticket),
            // A grant of the lane never sent: it becomes a ticket, under this same lock.
            Held::Lane(grant) => {
                let cost = self.stripe.shared.lane.cost(&grant);
                let cost = &cost[..self.stripe.shared.lane.dims()];
                state.arbiter.desk().adopt_grant(cost, grant.epoch(), now).ok()
            }
            Held::Nothing => None,
        };
        let reserved = match (crate::metrics::ENABLED, ticket) {
            (true, Some(ticket)) => state.arbiter.desk().cost(ticket).map(<[u64]>::to_vec),
            _ => None,
        };
        // What each report's dimension had learned, for the log (when it listens).
        let mut learned = [None; ratebucket_core::MAX_LANE_DIMENSIONS];
        let traced = tracing::enabled!(target: "ratebucket", tracing::Level::DEBUG);
        if traced {
            for (before, report) in learned.iter_mut().zip(reply.reports) {
                *before = state.arbiter.dimension(report.dimension, now).and_then(|d| d.learned);
            }
        }
        let replied = match ticket {
            Some(ticket) => state.arbiter.reply(ticket, reply, now),
            None => {
                Replied { settled: Err(TicketError::Unknown), throttle: None, bad_report: None }
            }
        };
        if crate::metrics::ENABLED {
            if let Settle::Throttled { .. } = reply.settle {
                crate::metrics::throttled(&self.stripe.shared.names());
            }
            if let (Settle::Charge(actual), Some(reserved), Ok(())) =
                (reply.settle, reserved, replied.settled)
            {
                crate::metrics::committed(&self.stripe.shared.names(), &reserved, actual);
            }
        }
        for (before, report) in learned.iter().zip(reply.reports).filter(|_| traced) {
            let after = state.arbiter.dimension(report.dimension, now).and_then(|d| d.learned);
            self.stripe.shared.names().trace_learned(report.dimension, *before, after);
        }
        self.stripe.shared.settle(state);
        replied
    }

    /// Returns the whole reservation: the request was never sent, or the provider
    /// answered that it did not count it.
    pub fn release(mut self) {
        match std::mem::replace(&mut self.held, Held::Nothing) {
            Held::Ticket(ticket) | Held::Stamped(ticket, _) => {
                let mut state = self.stripe.shared.lock();
                let now = self.stripe.shared.now();
                if state.arbiter.release(ticket, now).is_err() {
                    // Not granted (queued again by `SendWhenOpen`, then given up): withdraw.
                    state.arbiter.cancel(ticket, now);
                }
                self.stripe.shared.settle(state);
            }
            Held::Lane(grant) => self.end_lane(grant, None),
            Held::Nothing => {}
        }
    }

    /// Ends the reservation with its request's outcome unknown (a timeout, a cut reply):
    /// charged as reserved if it was sent, returned if it never was. What dropping does.
    pub fn keep(mut self) {
        self.end();
    }

    #[inline(never)]
    fn end(&mut self) {
        match std::mem::replace(&mut self.held, Held::Nothing) {
            Held::Ticket(ticket) | Held::Stamped(ticket, _) => {
                let mut state = self.stripe.shared.lock();
                state.arbiter.cancel(ticket, self.stripe.shared.now());
                self.stripe.shared.settle(state);
            }
            // A lane grant is never sent (sending makes it a ticket): returned whole.
            Held::Lane(grant) => self.end_lane(grant, None),
            Held::Nothing => {}
        }
    }
}

impl Drop for Reservation {
    #[inline]
    fn drop(&mut self) {
        if !matches!(self.held, Held::Nothing) {
            self.end();
        }
    }
}

impl fmt::Debug for Reservation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reservation")
            .field("ticket", &self.ticket())
            .field("express", &matches!(self.held, Held::Lane(_)))
            .finish()
    }
}
