//! The FIFO queue: reserving, validating, estimating waits, granting the head and backfilling.

use super::*;

/// Costs below this are not raised by a learned charge factor (see [`Arbiter::booked`]).
const MIN_BOOKED_COST: u64 = 16;

impl Arbiter {
    /// Queues a reservation of `cost` (one entry per dimension) and grants it at once if
    /// it is at the head and fits. Watch for its [`Event::Granted`], or ask
    /// [`Arbiter::state`].
    #[inline]
    pub fn reserve(&mut self, cost: &[u64], now: Instant) -> Result<Ticket, ReserveError> {
        self.reserve_within(cost, None, now)
    }

    /// Like [`Arbiter::reserve`], but refuses with [`ReserveError::WouldWait`] (and an
    /// [`Event::Rejected`]) when the estimated wait exceeds `max_wait`.
    ///
    /// The estimate assumes every queued reservation is granted in order and nothing is
    /// refunded meanwhile, so it errs long, never short.
    pub fn reserve_within(
        &mut self,
        cost: &[u64],
        max_wait: Option<Duration>,
        now: Instant,
    ) -> Result<Ticket, ReserveError> {
        let now = self.clock.advance(now);
        self.validate(cost)?;
        if let Some(max_wait) = max_wait {
            let would_wait = self.estimate_wait(cost, now);
            if would_wait > max_wait {
                self.events.push_back(Event::Rejected {
                    would_wait,
                    max_wait,
                });
                return Err(ReserveError::WouldWait {
                    retry_after: would_wait,
                });
            }
        }
        let nobody_waits = self.live_queued == 0 && !self.replying && self.gate.is_open(now);
        if nobody_waits && !self.alone_blocks() {
            // Granted on arrival, never queued. With buckets only, each is refilled and
            // checked once, then taken from.
            let buckets_only = !self.guarded && !self.charging;
            let fits = if buckets_only {
                self.take_if_fits(cost, now)
            } else {
                self.fits_all(cost, now)
            };
            if fits {
                let ticket = self.allocate(cost, SlotState::Granted, now);
                if buckets_only {
                    self.enter_grant(ticket, now);
                } else {
                    self.take(ticket, now);
                }
                self.events.push_back(Event::Granted {
                    ticket,
                    waited: Duration::ZERO,
                });
                return Ok(ticket);
            }
        }
        let ticket = self.allocate(cost, SlotState::Queued, now);
        self.queue.push_back(ticket);
        self.live_queued += 1;
        for (dim, &c) in self.dims.iter_mut().zip(cost) {
            dim.queued += u128::from(c);
        }
        self.drive(now);
        Ok(ticket)
    }

    /// Takes `cost` from every bucket if it fits them all now (no guard, no learned
    /// charge; [`Arbiter::enter_grant`] does the rest of the booking).
    #[inline]
    fn take_if_fits(&mut self, cost: &[u64], now: Instant) -> bool {
        let fits = self
            .dims
            .iter_mut()
            .zip(cost)
            .all(|(dim, &c)| dim.bucket.fits(c, now));
        if fits {
            for (dim, &c) in self.dims.iter_mut().zip(cost) {
                dim.bucket.take_fitted(c);
            }
        }
        fits
    }

    /// Enters the grant of `ticket`, whose cost was taken: its epoch and instant, and the
    /// books.
    #[inline]
    fn enter_grant(&mut self, ticket: Ticket, now: Instant) {
        let slot = &mut self.slots[ticket.index as usize];
        slot.granted_in = self.gate.epoch();
        slot.granted_at = now;
        let (base, dims) = (self.cost_base(ticket), self.dims.len());
        self.books.grant(&self.costs[base..base + dims]);
    }

    /// Whether the first reservation goes alone ([`ArbiterConfig::first_alone`]) and is
    /// granted and not yet ended: nothing else may be granted. (A scan, only until then.)
    #[inline]
    pub(super) fn alone_blocks(&self) -> bool {
        self.first_alone && self.slots.iter().any(|s| s.state == SlotState::Granted)
    }

    /// The provider reported, or the first reservation ended: others may go with it.
    pub(super) fn end_first_alone(&mut self, now: Instant) {
        if self.first_alone {
            self.first_alone = false;
            self.drive(now);
        }
    }

    pub(super) fn validate(&self, cost: &[u64]) -> Result<(), ReserveError> {
        if self.aborted {
            return Err(ReserveError::Aborted);
        }
        if cost.len() != self.dims.len() {
            return Err(ReserveError::WrongDimensions {
                expected: self.dims.len(),
                got: cost.len(),
            });
        }
        for (dimension, &cost) in cost.iter().enumerate() {
            let capacity = self.effective_capacity(dimension);
            if cost > capacity {
                return Err(ReserveError::CostExceedsCapacity {
                    dimension,
                    cost,
                    capacity,
                });
            }
        }
        Ok(())
    }

    pub(super) fn estimate_wait(&mut self, cost: &[u64], now: Instant) -> Duration {
        let gate_wait = self
            .gate
            .reopens_at(now)
            .map_or(Duration::ZERO, |at| at.saturating_duration_since(now));
        let mut wait = gate_wait;
        for (dim, &c) in self.dims.iter_mut().zip(cost) {
            let total = dim.queued.saturating_add(u128::from(c));
            let total = u64::try_from(total).unwrap_or(u64::MAX);
            let w = dim.bucket.time_until_unbounded(total, now);
            wait = wait.max(w);
            if let Some(guard) = &mut dim.guard {
                // Erring long: a guard full of reservations still in flight makes room
                // within a window of their ending.
                let w = guard.time_until(total, now).unwrap_or(guard.window());
                wait = wait.max(w);
            }
        }
        wait
    }

    #[inline]
    pub(super) fn head(&mut self) -> Option<Ticket> {
        while let Some(&front) = self.queue.front() {
            if self.is_queued(front) {
                return Some(front);
            }
            self.queue.pop_front();
        }
        None
    }

    /// The first ticket in the queue still queued (a query: stale entries stay).
    pub(super) fn first_queued(&self) -> Option<Ticket> {
        self.queue.iter().copied().find(|&t| self.is_queued(t))
    }

    /// The instant the head's cost fits every dimension, assuming nothing else happens.
    pub(super) fn ready_at(&self, head: Ticket, now: Instant) -> Instant {
        let base = self.cost_base(head);
        let mut wait = Duration::ZERO;
        for d in 0..self.dims.len() {
            let cost = self.booked(d, self.costs[base + d]);
            let dim = &self.dims[d];
            let mut w = dim.bucket.time_until_at(cost, now).unwrap_or(Duration::MAX);
            if dim.edge_refill.is_some()
                && let Some(edge) = dim.guard.as_ref().and_then(|g| g.edge_after(now))
            {
                // The bucket is full again at the next edge.
                w = w.min(edge.saturating_duration_since(now));
            }
            wait = wait.max(w);
            if let Some(guard) = &dim.guard {
                // `None`: only a reservation ending makes room, and that drives the queue.
                let w = guard.time_until_at(cost, now).unwrap_or(Duration::MAX);
                wait = wait.max(w);
            }
        }
        now + wait
    }

    /// Removes a queued ticket's claim from the running sums (its queue entry, if still
    /// there, becomes stale and is skipped).
    pub(super) fn unqueue(&mut self, ticket: Ticket) {
        let base = self.cost_base(ticket);
        for (d, dim) in self.dims.iter_mut().enumerate() {
            dim.queued -= u128::from(self.costs[base + d]);
        }
        self.live_queued -= 1;
    }

    /// Drops stale entries once they outnumber the live ones, keeping memory proportional
    /// to the live queue.
    #[inline]
    pub(super) fn compact_queue(&mut self) {
        if self.queue.len() > 2 * self.live_queued + 64 {
            let slots = &self.slots;
            self.queue.retain(|t| {
                slots
                    .get(t.index as usize)
                    .is_some_and(|s| s.generation == t.generation && s.state == SlotState::Queued)
            });
        }
    }

    /// Conservative backfilling: a waiter behind the head goes now only if it fits now
    /// and, in every dimension, the level projected to the head's grant time stays at or
    /// above the head's cost after taking it.
    pub(super) fn backfill(&mut self, now: Instant) {
        let Some(head) = self.head() else { return };
        let head_at = self.ready_at(head, now);
        let after = head_at.saturating_duration_since(now);
        let dims = self.dims.len();
        let head_base = self.cost_base(head);
        let depth = self.config.backfill_depth;
        let mut i = 1;
        let mut looked = 0;
        while i < self.queue.len() && looked < depth {
            let candidate = self.queue[i];
            if !self.is_queued(candidate) {
                i += 1;
                continue;
            }
            looked += 1;
            let base = self.cost_base(candidate);
            let cost = |arbiter: &Arbiter, d: usize| arbiter.booked(d, arbiter.costs[base + d]);
            let head =
                |arbiter: &Arbiter, d: usize| arbiter.booked(d, arbiter.costs[head_base + d]);
            let fits_now = (0..dims).all(|d| {
                let c = cost(self, d);
                self.fits(d, c, now)
            });
            let head_not_delayed = (0..dims).all(|d| {
                let bucket = &self.dims[d].bucket;
                bucket.projected_units(after, cost(self, d)) >= bucket.units(head(self, d))
            }) && (0..dims).all(|d| {
                // A guard frees room only as charges age out: the candidate may not take
                // room the head needs.
                let both = cost(self, d).saturating_add(head(self, d));
                self.dims[d].guard.is_none() || self.fits(d, both, now)
            });
            if fits_now && head_not_delayed {
                self.queue.remove(i);
                self.grant(candidate, now);
            } else {
                i += 1;
            }
        }
    }

    pub(super) fn fits_all(&mut self, cost: &[u64], now: Instant) -> bool {
        if !self.guarded && !self.charging {
            return self
                .dims
                .iter_mut()
                .zip(cost)
                .all(|(dim, &c)| dim.bucket.fits(c, now));
        }
        cost.iter().enumerate().all(|(d, &c)| {
            let c = self.booked(d, c);
            self.fits(d, c, now)
        })
    }

    /// What a reservation of `cost` in `dimension` takes from its bucket: the cost times
    /// what the provider was seen to book per unit reserved ([`Arbiter::charge_factor`]),
    /// within the dimension's capacity, never less than the cost.
    #[inline]
    pub(super) fn booked(&self, dimension: usize, cost: u64) -> u64 {
        if !self.charging {
            return cost;
        }
        let factor = Arbiter::applied_factor(self.dims[dimension].charge.factor);
        // Small counts (whole requests) are what the provider counts, exactly: the reports'
        // noise is larger than one unit in them.
        if factor == 1.0 || cost < MIN_BOOKED_COST {
            return cost;
        }
        // A count of whole requests is not inflated by a fraction: rounded, not rounded up.
        let booked = (cost as f64 * factor).round() as u64;
        booked.min(self.effective_capacity(dimension)).max(cost)
    }

    /// The factor reservations are raised by, given the learned one: none within 2% (noise
    /// from replies out of order), else 2% above it (a charge read short costs 429s, one
    /// read long a little pace), at most [`MAX_CHARGE_FACTOR`].
    pub(super) fn applied_factor(learned: Option<f64>) -> f64 {
        match learned {
            Some(factor) if factor > 1.02 => (factor * 1.02).min(MAX_CHARGE_FACTOR as f64),
            _ => 1.0,
        }
    }

    /// Whether `cost` fits `dimension`'s bucket and guard now.
    #[inline]
    pub(super) fn fits(&mut self, dimension: usize, cost: u64, now: Instant) -> bool {
        let guarded = self.guarded;
        let dim = &mut self.dims[dimension];
        // Only a guard knows a fixed window's edges.
        if guarded
            && let Some(refilled) = dim.edge_refill
            && let Some(edge) = dim.guard.as_ref().and_then(|g| g.edge_before(now))
            && edge > refilled
        {
            let capacity = i64::try_from(dim.bucket.capacity()).unwrap_or(i64::MAX);
            dim.bucket.raise_to(capacity, now);
            dim.edge_refill = Some(edge);
        }
        dim.bucket.fits(cost, now)
            && (!guarded || dim.guard.as_mut().is_none_or(|guard| guard.fits(cost, now)))
    }

    #[inline]
    pub(super) fn grant(&mut self, ticket: Ticket, now: Instant) {
        // Off the running sums at the cost it queued with, before `take` books it.
        self.unqueue(ticket);
        self.take(ticket, now);
        let slot = &mut self.slots[ticket.index as usize];
        slot.state = SlotState::Granted;
        let waited = now.saturating_duration_since(slot.since);
        self.events.push_back(Event::Granted { ticket, waited });
    }

    /// Takes `ticket`'s cost from every bucket and guard, and enters it in the books; the
    /// cost is first raised to what the provider books ([`Arbiter::booked`]), and the
    /// reservation holds that from then on.
    #[inline]
    pub(super) fn take(&mut self, ticket: Ticket, now: Instant) {
        let base = self.cost_base(ticket);
        let dims = self.dims.len();
        if self.charging {
            for d in 0..dims {
                let booked = self.booked(d, self.costs[base + d]);
                if booked != self.costs[base + d] && !self.slots[ticket.index as usize].raised {
                    // The caller's own estimate is kept for learning the charge (the
                    // dimensions before this one were not raised).
                    let (costs, estimates) = (&self.costs, &mut self.estimates);
                    estimates[base..base + dims].copy_from_slice(&costs[base..base + dims]);
                    self.slots[ticket.index as usize].raised = true;
                }
                self.costs[base + d] = booked;
            }
        }
        let cost = &self.costs[base..base + self.dims.len()];
        for (dim, &c) in self.dims.iter_mut().zip(cost) {
            dim.bucket.take(c, now);
            if let Some(guard) = &mut dim.guard {
                guard.take(c);
            }
        }
        self.enter_grant(ticket, now);
    }
}
