//! Ending reservations: cancel, commit within bounded trust, release, requeue.

use super::*;

/// The most a commit charges a dimension, as a multiple of what was reserved there (or
/// the dimension's capacity, if larger): reported usage beyond it is distrusted. Four
/// times covers a prompt estimate that was short by the most a tokenizer differs from four
/// characters a token (code, CJK text).
pub const MAX_CHARGE_FACTOR: u64 = 4;

impl Arbiter {
    /// Withdraws `ticket`, as dropping it does: a queued waiter leaves the queue; a granted
    /// reservation whose request was never sent is released whole; one whose request was
    /// sent ([`Arbiter::stamp_send_if_open`]) is abandoned and **stays charged as reserved**,
    /// because the provider has probably counted it (ADR 0012). Returns whether there was
    /// anything to withdraw. Safe to call at any time, with any ticket.
    pub fn cancel(&mut self, ticket: Ticket, now: Instant) -> bool {
        let now = self.clock.advance(now);
        match self.slot(ticket).map(|s| (s.state, s.sent != NOT_SENT)) {
            Some((SlotState::Queued, _)) => {
                self.unqueue(ticket);
                self.tickets.free(ticket);
                self.events.push_back(Event::Cancelled { ticket });
                self.drive(now);
                true
            }
            Some((SlotState::Parked, _)) => {
                self.unpark(ticket);
                self.tickets.free(ticket);
                self.events.push_back(Event::Cancelled { ticket });
                true
            }
            Some((SlotState::Granted, true)) => {
                // Charged as reserved: no refund, in the books and guards as spent.
                self.settle(ticket, |_, reserved| reserved, now);
                self.tickets.free(ticket);
                self.events.push_back(Event::Abandoned { ticket });
                self.first_alone = false;
                self.drive(now);
                true
            }
            Some((SlotState::Granted, false)) => self.release(ticket, now).is_ok(),
            _ => false,
        }
    }

    /// Reconciles a granted reservation against its `actual` cost: an over-estimate is
    /// refunded (up to capacity), an under-estimate is charged as debt. A reservation
    /// granted before the gate last closed is refunded nothing (see [`Arbiter::throttle`]).
    ///
    /// Trust is bounded: a dimension is charged at most [`MAX_CHARGE_FACTOR`] times what
    /// was reserved, or its capacity if that is more. A larger report (a provider's bug, a
    /// proxy's garbage, `u64::MAX`) is charged at that ceiling and reported as
    /// [`Event::Distrusted`], so one absurd number costs at most a burst's worth of waiting,
    /// never a debt that outlives the run.
    #[inline]
    pub fn commit(
        &mut self,
        ticket: Ticket,
        actual: &[u64],
        now: Instant,
    ) -> Result<(), TicketError> {
        let now = self.clock.advance(now);
        if actual.len() != self.dims.len() {
            return Err(TicketError::WrongDimensions {
                expected: self.dims.len(),
                got: actual.len(),
            });
        }
        self.check_granted(ticket)?;
        let beyond_trust = actual
            .iter()
            .enumerate()
            .any(|(d, &used)| used > self.charge_ceiling(d, self.tickets.cost_in(ticket, d)));
        if beyond_trust {
            return self.commit_distrusted(ticket, actual, now);
        }
        self.settle(ticket, |d, _| actual[d], now);
        if self.capped {
            self.cap_settle(ticket, actual, now);
        }
        let written_off = self.written_off(ticket);
        // What each dimension's reply used against the caller's own estimate, for a
        // provider whose reports are read (its sends are on the books).
        if self.config.reserve_usage && self.books.is_open() {
            for (d, dim) in self.dims.iter_mut().enumerate() {
                dim.usage.record(actual[d], self.tickets.estimate(ticket)[d]);
            }
        }
        let granted_at = self.tickets.slot(ticket).granted_at;
        for (d, &used) in actual.iter().enumerate() {
            let reserved = self.tickets.cost_in(ticket, d);
            let dim = &mut self.dims[d];
            if dim.ledger {
                continue;
            }
            let refundable = dim.refundable(granted_at);
            let bucket = &mut dim.bucket;
            if used < reserved {
                if !written_off && refundable {
                    bucket.give_back(reserved - used, now);
                }
            } else if used > reserved {
                bucket.take(used - reserved, now);
            }
        }
        self.tickets.free(ticket);
        self.events.push_back(Event::Committed { ticket });
        self.first_alone = false;
        self.drive(now);
        Ok(())
    }

    /// [`Arbiter::commit`] for a report beyond the trusted ceiling in some dimension.
    #[cold]
    pub(super) fn commit_distrusted(
        &mut self,
        ticket: Ticket,
        actual: &[u64],
        now: Instant,
    ) -> Result<(), TicketError> {
        let bounded: Vec<u64> = actual
            .iter()
            .enumerate()
            .map(|(dimension, &reported)| {
                let ceiling =
                    self.charge_ceiling(dimension, self.tickets.cost_in(ticket, dimension));
                if reported > ceiling {
                    self.events.push_back(Event::Distrusted {
                        ticket,
                        dimension,
                        reported,
                        charged: ceiling,
                    });
                }
                reported.min(ceiling)
            })
            .collect();
        self.commit(ticket, &bounded, now)
    }

    /// The most one reply may charge `dimension` for a reservation of `reserved`.
    #[inline]
    pub(super) fn charge_ceiling(&self, dimension: usize, reserved: u64) -> u64 {
        self.dims[dimension].charge_ceiling(reserved)
    }

    /// Returns a granted reservation whole: its request was never sent, or the provider
    /// answered that it did not count it (a 429, a 5xx, a 4xx refusal). A reservation
    /// granted before the gate last closed gives nothing back (see [`Arbiter::throttle`]).
    /// For a request sent whose outcome is unknown, use [`Arbiter::cancel`], which keeps
    /// it charged.
    #[inline]
    pub fn release(&mut self, ticket: Ticket, now: Instant) -> Result<(), TicketError> {
        self.release_counted(ticket, true, now)
    }

    /// [`Arbiter::release`]; `maybe_counted`: whether a request that left may have been
    /// counted by the provider (not when it refused a probe: that says it did not).
    pub(super) fn release_counted(
        &mut self,
        ticket: Ticket,
        maybe_counted: bool,
        now: Instant,
    ) -> Result<(), TicketError> {
        let now = self.clock.advance(now);
        self.check_granted(ticket)?;
        // A request that left may have been charged before it failed.
        let sent = self.tickets.slot(ticket).sent != NOT_SENT;
        if maybe_counted {
            self.settle(ticket, |_, reserved| if sent { reserved } else { 0 }, now);
        } else {
            let seq = self.tickets.slot(ticket).sent;
            let cost = self.tickets.cost(ticket);
            self.books.settle(cost, (seq != NOT_SENT).then_some(seq));
            for (dim, &reserved) in self.dims.iter_mut().zip(cost) {
                if let Some(guard) = &mut dim.guard {
                    guard.withdraw(reserved);
                }
            }
        }
        if self.capped {
            // Not counted by the provider, or never sent: none of the tenant's share used.
            self.cap_settle(ticket, &vec![0; self.dims.len()], now);
        }
        let written_off = self.written_off(ticket);
        let granted_at = self.tickets.slot(ticket).granted_at;
        let cost = self.tickets.cost(ticket);
        for (dim, &reserved) in self.dims.iter_mut().zip(cost) {
            if !dim.ledger && !written_off && dim.refundable(granted_at) {
                dim.bucket.give_back(reserved, now);
            }
        }
        self.tickets.free(ticket);
        self.events.push_back(Event::Released { ticket });
        self.first_alone = false;
        self.drive(now);
        Ok(())
    }

    /// Enters the end of `ticket`'s reservation in the books and guards, the provider
    /// having charged `charged(dimension, reserved)`.
    #[inline]
    pub(super) fn settle(
        &mut self,
        ticket: Ticket,
        charged: impl Fn(usize, u64) -> u64,
        now: Instant,
    ) {
        let seq = self.tickets.slot(ticket).sent;
        let cost = self.tickets.cost(ticket);
        self.books.settle(cost, (seq != NOT_SENT).then_some(seq));
        if self.guarded {
            for (d, (dim, &reserved)) in self.dims.iter_mut().zip(cost).enumerate() {
                if let Some(guard) = &mut dim.guard {
                    guard.settle(reserved, charged(d, reserved), now);
                }
            }
        }
    }

    /// The summed cost in `dimension` of the granted reservations `which` picks.
    pub(super) fn granted_cost(&self, dimension: usize, which: impl Fn(&Slot) -> bool) -> u64 {
        self.tickets.granted_cost(dimension, which)
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
    /// same. A reservation already sent (stamped with [`Arbiter::stamp_send_if_open`]) cannot be
    /// requeued.
    pub fn requeue_unsent(&mut self, ticket: Ticket, now: Instant) -> Result<(), TicketError> {
        let now = self.clock.advance(now);
        self.check_granted(ticket)?;
        if self.tickets.slot(ticket).sent != NOT_SENT {
            return Err(TicketError::AlreadySent);
        }
        // The grant ends unsent (nothing charged), as a release would end it.
        self.settle(ticket, |_, _| 0, now);
        if self.capped {
            // Its tenant's cap takes it again at its next grant.
            self.cap_settle(ticket, &vec![0; self.dims.len()], now);
        }
        self.tickets.slot_mut(ticket).state = SlotState::Queued;
        // Queued at what the caller reserved: the next grant raises it once, anew.
        self.tickets.restore_estimate(ticket);
        self.queue_again(ticket);
        self.events.push_back(Event::Requeued { ticket });
        self.drive(now);
        Ok(())
    }
}
