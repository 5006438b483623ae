//! The arbiter's second desk ([`Desk`]): the express lane's lease, and the inputs and
//! queries a runtime adapter makes beside the sans-IO loop (taking back an unsent grant,
//! a ticket's cost, an abort, an estimate of when the queue drains).
//!
//! **The express lane.** An adapter may serve reservations without the arbiter while
//! nothing needs order: it asks for a [`Lease`] ([`Desk::lease`]), hands its permits out
//! itself (in atomics, without a lock), and gives back what is left ([`Desk::give_back`])
//! before it feeds the arbiter any input that needs order: a reservation that must wait,
//! a throttle, a report, an abort. The arbiter never sees the lane's grants one by one;
//! what keeps it honest is the ceiling.
//!
//! **The ceiling.** Leasing `L` permits takes them from the bucket's level and lowers the
//! bucket's ceiling by `L` until they are returned, so the bucket's level plus what the lane
//! still holds never exceeds the capacity, and that sum refills at most at the rate. That
//! sum is a token bucket of the same capacity and rate whose grants are the arbiter's and
//! the lane's together: the lane can never admit more than the arbiter would have. What the
//! ceiling costs is refill the bucket could not hold while the lane's grants were out,
//! at most `L` per lease, and only while the limit does not bind.

use std::time::Duration;

use super::Arbiter;
use super::error::{ReserveError, TicketError};
use super::fair::Caller;
use super::rules::{Ask, Ended};
use super::tickets::{NOT_SENT, SlotState};
use crate::event::{Event, Refusal};
use crate::gate::Epoch;
use crate::ids::Ticket;
use crate::time::Instant;

/// The most dimensions a lease covers: an adapter packs them into one machine word.
pub const MAX_LANE_DIMENSIONS: usize = 4;

/// Permits leased to an express lane by [`Desk::lease`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    /// Whole permits leased per dimension (the first [`Status::dimensions`](crate::Status::dimensions) entries).
    pub permits: [u64; MAX_LANE_DIMENSIONS],
    /// The gate epoch the lease was made in: grants from it are written off by a later
    /// throttle, as every grant made before one is.
    pub epoch: Epoch,
}

/// The arbiter's second desk ([`Arbiter::desk`]; see the module docs): what a runtime
/// adapter such as `ratebucket-rt` asks beside the sans-IO loop.
#[derive(Debug)]
pub struct Desk<'a> {
    arbiter: &'a mut Arbiter,
}

impl<'a> Desk<'a> {
    /// The desk of `arbiter`.
    pub(super) fn new(arbiter: &'a mut Arbiter) -> Desk<'a> {
        Desk { arbiter }
    }

    /// Leases up to `most` whole permits per dimension to an express lane, if nothing needs
    /// order now ([`Status::lane_may_lease`](crate::Status::lane_may_lease), and the gate open). `None` otherwise, or if
    /// some dimension has no whole permit to lease.
    ///
    /// What is leased is taken from the levels at once and the ceilings lowered by as much
    /// (see the module docs). End the lease with [`Desk::give_back`] before any input that
    /// needs order.
    pub fn lease(&mut self, most: u64, now: Instant) -> Option<Lease> {
        let this = &mut *self.arbiter;
        let now = this.clock.advance(now);
        if !this.lane_may_open_in_time() || !this.limits.gate.is_open(now) {
            return None;
        }
        let permits = this.limits.dims.lease(most, now)?;
        Some(Lease { permits, epoch: this.limits.gate.epoch() })
    }

    /// Ends the lease: `unused` (one entry per dimension) is what the lane still held,
    /// given back to the levels as the ceilings rise again. What the lane granted stays
    /// taken: those grants end through [`Desk::end_grant`] or become tickets through
    /// [`Desk::adopt_grant`]. Without a lease out, nothing happens.
    pub fn give_back(&mut self, unused: &[u64], now: Instant) {
        let this = &mut *self.arbiter;
        let now = this.clock.advance(now);
        if this.limits.dims.give_back(unused, now) {
            this.drive(now);
        }
    }

    /// Ends a grant the lane made of `reserved` from a lease of `epoch`, whose request
    /// cost `actual` (zeros for one never sent): like [`Arbiter::commit`], the
    /// over-estimate is refunded and an under-estimate charged as debt, within
    /// [`MAX_CHARGE_FACTOR`](crate::MAX_CHARGE_FACTOR); a grant made before the gate last
    /// closed is refunded nothing. For the ends the lane cannot settle by itself (debt, or
    /// its lease already returned).
    pub fn end_grant(
        &mut self,
        reserved: &[u64],
        actual: &[u64],
        epoch: Epoch,
        now: Instant,
    ) -> Result<(), TicketError> {
        let this = &mut *self.arbiter;
        let now = this.clock.advance(now);
        let expected = this.limits.dims.len();
        if reserved.len() != expected || actual.len() != expected {
            let got = actual.len().min(reserved.len());
            return Err(TicketError::WrongDimensions { expected, got });
        }
        let written_off = epoch < this.limits.gate.epoch();
        this.limits.dims.end_lane_grant(reserved, actual, written_off, now);
        this.limits.rules.first.end();
        this.drive(now);
        Ok(())
    }

    /// Turns a grant the lane made of `cost` from a lease of `epoch` into a granted
    /// ticket (its cost already taken), for a request about to be sent: from then on it
    /// is an ordinary reservation (stamped, committed, released, cancelled).
    pub fn adopt_grant(
        &mut self,
        cost: &[u64],
        epoch: Epoch,
        now: Instant,
    ) -> Result<Ticket, TicketError> {
        let this = &mut *self.arbiter;
        let now = this.clock.advance(now);
        if cost.len() != this.limits.dims.len() {
            let (expected, got) = (this.limits.dims.len(), cost.len());
            return Err(TicketError::WrongDimensions { expected, got });
        }
        let ticket = this.tickets.allocate(cost, SlotState::Granted, Caller::default(), now);
        this.tickets.slot_mut(ticket).granted(epoch, now);
        this.books.grant(cost);
        Ok(ticket)
    }

    /// Takes back the grant of a reservation whose request has not been sent, and queues it
    /// again ahead of every waiter that arrived after it: for a grant made before a
    /// throttle closed the gate, whose request would otherwise leave the moment the pause
    /// ends, together with every other such grant, into a provider that has only refilled
    /// the pause's worth.
    ///
    /// Its cost is not given back: the throttle set every level to what the provider has
    /// (nothing), which already wrote off what unsent grants had taken; the reservation
    /// takes its cost again, from the refill, when it is granted anew. Its ticket stays the
    /// same. A reservation already sent cannot be requeued ([`TicketError::AlreadySent`]).
    pub fn requeue_unsent(&mut self, ticket: Ticket, now: Instant) -> Result<(), TicketError> {
        let this = &mut *self.arbiter;
        let now = this.clock.advance(now);
        if this.tickets.granted(ticket)?.sent != NOT_SENT {
            return Err(TicketError::AlreadySent);
        }
        // The grant ends unsent (nothing charged), as a release would end it.
        let cost = this.tickets.cost(ticket);
        this.books.settle(cost, None);
        this.limits.dims.settle_guards(cost, |_, _| 0, true, now);
        // Its tenant's cap takes it again at its next grant.
        let in_flight = this.tickets.granted_count().saturating_sub(1);
        let ask = Ask::of(&this.tickets, ticket);
        this.limits.rules.ended(&ask, Ended::Requeued, None, in_flight, now);
        // Queued at what the caller reserved: the next grant raises it once, anew.
        this.tickets.restore_estimate(ticket);
        this.queue.again(ticket, &mut this.tickets, this.config.aging);
        this.limits.rules.queued(&Ask::of(&this.tickets, ticket), true);
        this.events.push_back(Event::Requeued { ticket });
        this.drive(now);
        Ok(())
    }

    /// What `ticket` reserved, one entry per dimension (raised by a learned charge once
    /// granted); `None` once its reservation ended.
    pub fn cost(&self, ticket: Ticket) -> Option<&[u64]> {
        self.arbiter.tickets.get(ticket)?;
        Some(self.arbiter.tickets.cost(ticket))
    }

    /// Stops the run after a fatal failure: every queued waiter is refused with
    /// [`Refusal::Aborted`] and later reservations fail with [`ReserveError::Aborted`],
    /// until [`Arbiter::resume`]. Granted reservations can still be committed or released.
    pub fn abort(&mut self, now: Instant) {
        let this = &mut *self.arbiter;
        this.clock.advance(now);
        this.limits.aborted = true;
        this.refuse(true, |_, _| Some(Refusal::Aborted));
    }

    /// How long after `now` until everything queued, plus `more` (one entry per dimension:
    /// work not yet reserved, such as the rest of a batch), would be granted at the rates in
    /// force, counting the pause under way. A query.
    ///
    /// It assumes the costs are what will be taken: pass the expected charge of the work
    /// still to come, not its upper bound, for an ETA rather than a worst case. Refunds of
    /// reservations granted now are not foreseen, and a window cap is counted at its
    /// sustained rate (its limit per window).
    pub fn estimate_drain(&self, more: &[u64], now: Instant) -> Result<Duration, ReserveError> {
        let this = &*self.arbiter;
        if more.len() != this.limits.dims.len() {
            let (expected, got) = (this.limits.dims.len(), more.len());
            return Err(ReserveError::WrongDimensions { expected, got });
        }
        let now = this.clock.at_least(now);
        let (paused, queue) = (this.limits.gate.closed_for(now), &this.queue);
        Ok(paused.max(this.limits.dims.drain(|d| queue.cost_in(d), more, now)))
    }
}
