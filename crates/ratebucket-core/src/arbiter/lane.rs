//! The core's half of the express lane: permits leased out of the buckets, and the grants
//! made from them ending through the arbiter.
//!
//! An adapter may serve reservations without the arbiter while nothing needs order: it
//! asks for a [`Lease`] ([`LaneDesk::lease`], through [`Arbiter::lane`]), hands its
//! permits out itself (in atomics, without a lock), and gives back what is left
//! ([`LaneDesk::give_back`])
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
//! at most `L` per lease, and only while the limit does not bind (a level far below the
//! ceiling never meets it).

use super::*;

/// The most dimensions a lease covers: an adapter packs them into one machine word.
pub const MAX_LANE_DIMENSIONS: usize = 4;

/// Permits leased to an express lane by [`LaneDesk::lease`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    /// Whole permits leased per dimension (the first [`Status::dimensions`] entries).
    pub permits: [u64; MAX_LANE_DIMENSIONS],
    /// The gate epoch the lease was made in: grants from it are written off by a later
    /// throttle, as every grant made before one is.
    pub epoch: Epoch,
}

/// The arbiter's desk for an express lane ([`Arbiter::lane`]): leases, their return, and
/// the lane's grants that end or become tickets through the arbiter.
#[derive(Debug)]
pub struct LaneDesk<'a> {
    arbiter: &'a mut Arbiter,
}

impl Arbiter {
    /// The desk an express lane deals with (see the module docs of `lane.rs` in
    /// [`LaneDesk`]'s methods): an adapter's extension point, used by `ratebucket-rt`.
    pub fn lane(&mut self) -> LaneDesk<'_> {
        LaneDesk { arbiter: self }
    }
}

impl LaneDesk<'_> {
    /// Leases up to `most` whole permits per dimension to an express lane, if nothing needs
    /// order now: no one is queued, the gate is open, no hold or abort, no lease out, no
    /// window guard, learned policy, learned charge, climb back after a throttle, funded
    /// bucket or first request going alone, the books not yet opened by a send, and at
    /// most [`MAX_LANE_DIMENSIONS`] dimensions. `None` otherwise, or if some dimension has
    /// no whole permit to lease.
    ///
    /// What is leased is taken from the levels at once and the ceilings lowered by as much
    /// (see the module docs). End the lease with [`LaneDesk::give_back`] before any input
    /// that needs order.
    pub fn lease(&mut self, most: u64, now: Instant) -> Option<Lease> {
        let this = &mut *self.arbiter;
        let now = this.clock.advance(now);
        if !this.lane_may_open(now) {
            return None;
        }
        let mut lease = Lease { permits: [0; MAX_LANE_DIMENSIONS], epoch: this.gate.epoch() };
        for (d, dim) in this.dims.iter_mut().enumerate() {
            let whole = dim.bucket.available(now).floor();
            if whole < 1.0 {
                return None;
            }
            // A float of at least one, converted saturating and bounded by `most`.
            lease.permits[d] = (whole as u64).min(most);
        }
        for (dim, &permits) in this.dims.iter_mut().zip(&lease.permits) {
            dim.bucket.lend(permits, now);
            dim.lent = permits;
        }
        this.leased = true;
        Some(lease)
    }

    /// Ends the lease: `unused` (one entry per dimension) is what the lane still held,
    /// given back to the levels as the ceilings rise again. What the lane granted stays
    /// taken: those grants end through [`LaneDesk::end_grant`] or become tickets
    /// through [`LaneDesk::adopt_grant`]. Without a lease out, nothing happens.
    pub fn give_back(&mut self, unused: &[u64], now: Instant) {
        let this = &mut *self.arbiter;
        let now = this.clock.advance(now);
        if !std::mem::take(&mut this.leased) {
            return;
        }
        for (d, dim) in this.dims.iter_mut().enumerate() {
            let back = unused.get(d).copied().unwrap_or(0).min(dim.lent);
            dim.bucket.repay(std::mem::take(&mut dim.lent), back, now);
        }
        this.drive(now);
    }

    /// Ends a grant the lane made of `reserved` from a lease of `epoch`, whose request
    /// cost `actual` (zeros for one never sent): like [`Arbiter::commit`], the
    /// over-estimate is refunded and an under-estimate charged as debt, within
    /// [`MAX_CHARGE_FACTOR`]; a grant made before the gate last closed is refunded
    /// nothing. For the ends the lane cannot settle by itself (debt, or its lease already
    /// returned).
    pub fn end_grant(
        &mut self,
        reserved: &[u64],
        actual: &[u64],
        epoch: Epoch,
        now: Instant,
    ) -> Result<(), TicketError> {
        let this = &mut *self.arbiter;
        let now = this.clock.advance(now);
        let dims = this.dims.len();
        if reserved.len() != dims || actual.len() != dims {
            return Err(TicketError::WrongDimensions {
                expected: dims,
                got: actual.len().min(reserved.len()),
            });
        }
        let written_off = epoch < this.gate.epoch();
        for (d, (&reserved, &used)) in reserved.iter().zip(actual).enumerate() {
            let used = used.min(this.charge_ceiling(d, reserved));
            let bucket = &mut this.dims[d].bucket;
            if used < reserved && !written_off {
                bucket.give_back(reserved - used, now);
            } else if used > reserved {
                bucket.take(used - reserved, now);
            }
        }
        this.first_alone = false;
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
        if cost.len() != this.dims.len() {
            return Err(TicketError::WrongDimensions {
                expected: this.dims.len(),
                got: cost.len(),
            });
        }
        let arrival = this.arrive(Caller::default());
        let ticket = this.tickets.allocate(cost, SlotState::Granted, arrival, now);
        let slot = this.tickets.slot_mut(ticket);
        slot.granted_in = epoch;
        slot.granted_at = now;
        this.books.grant(cost);
        Ok(ticket)
    }
}

impl Arbiter {
    /// Whether nothing at `now` needs the arbiter's order (see [`LaneDesk::lease`]).
    fn lane_may_open(&self, now: Instant) -> bool {
        self.lane_may_open_in_time() && self.gate.is_open(now)
    }

    /// [`Arbiter::lane_may_open`] but for the gate's pause, which time ends.
    pub(super) fn lane_may_open_in_time(&self) -> bool {
        let plain_dims = self.dims.iter().all(Dimension::is_plain);
        let nothing_waits = self.queue.live() == 0 && !self.replying;
        let nothing_learns =
            !self.guarded && !self.recovering && !self.charging && !self.books.is_open();
        nothing_waits
            && nothing_learns
            && plain_dims
            && !self.leased
            && !self.aborted
            && self.spent.is_none()
            && !self.first_alone
            && !self.capped
            && self.dims.len() <= MAX_LANE_DIMENSIONS
    }
}
