//! The arbiter's part in the queue ([`Queue`](order::Queue), in `order.rs`): reserving,
//! validating, estimating waits, granting the head and backfilling.

use super::*;

/// Costs below this are not raised by a learned charge factor (see [`Arbiter::booked`]).
pub(super) const MIN_BOOKED_COST: u64 = 16;

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
        self.reserve_for(Caller::default(), cost, max_wait, now)
    }

    /// Like [`Arbiter::reserve_within`], for `caller`: a tenant, whose share of a busy pool
    /// follows its weight ([`Arbiter::set_weight`]), and a priority class, which orders it
    /// ahead of lower classes until they have aged ([`ArbiterConfig::aging`]).
    ///
    /// With nobody waiting it is granted on arrival, whoever it is for; the order matters
    /// only among reservations that queue.
    pub fn reserve_for(
        &mut self,
        caller: Caller,
        cost: &[u64],
        max_wait: Option<Duration>,
        now: Instant,
    ) -> Result<Ticket, ReserveError> {
        let now = self.clock.advance(now);
        self.validate(cost)?;
        if self.budgeted {
            self.check_budgets(cost, now)?;
        }
        if self.quota_spent {
            self.check_spent(cost, max_wait, now)?;
        }
        // A capped tenant's reservation its cap cannot take now waits apart.
        let cap_admits = !self.capped || self.cap_admits(caller.tenant, cost, now)?;
        if let Some(max_wait) = max_wait {
            let mut would_wait = self.estimate_wait(cost, now);
            if !cap_admits {
                would_wait = would_wait.max(self.cap_wait(caller.tenant, cost, now));
            }
            if would_wait > max_wait {
                self.events.push_back(Event::Rejected { would_wait, max_wait });
                return Err(ReserveError::WouldWait { retry_after: would_wait });
            }
        }
        let nobody_waits = self.queue.live() == 0
            && !self.replying
            && self.gate.is_open(now)
            && self.spent.is_none();
        if nobody_waits && cap_admits && !self.alone_blocks() {
            // Granted on arrival, never queued. With buckets only, each is refilled and
            // checked once, then taken from.
            let buckets_only = !self.guarded && !self.charging && !self.quota_spent;
            let fits =
                if buckets_only { self.take_if_fits(cost, now) } else { self.fits_all(cost, now) };
            if fits {
                let arrival = self.arrive(caller);
                let ticket = self.tickets.allocate(cost, SlotState::Granted, arrival, now);
                if buckets_only {
                    self.enter_grant(ticket, now);
                } else {
                    self.take(ticket, now);
                }
                self.events.push_back(Event::Granted { ticket, waited: Duration::ZERO });
                return Ok(ticket);
            }
        }
        let arrival = self.arrive(caller);
        if !cap_admits {
            let ticket = self.tickets.allocate(cost, SlotState::Parked, arrival, now);
            self.park(ticket);
            return Ok(ticket);
        }
        let ticket = self.tickets.allocate(cost, SlotState::Queued, arrival, now);
        self.enter_queue(ticket);
        self.drive(now);
        Ok(ticket)
    }

    /// Queues `ticket` (a reservation that arrived, or one its tenant's cap now has room
    /// for) in its tenant's fair order and its class.
    pub(super) fn enter_queue(&mut self, ticket: Ticket) {
        let slot = *self.tickets.slot(ticket);
        let cost = self.tickets.cost(ticket);
        let key = self.fair.enqueue(
            slot.caller,
            self.demand(cost),
            self.lead(slot.caller.priority),
            slot.key.arrival,
        );
        let slot = self.tickets.slot_mut(ticket);
        slot.key = key;
        slot.state = SlotState::Queued;
        self.queue.push(ticket, key, self.tickets.cost(ticket));
        if self.capped {
            self.cap_pending(ticket);
        }
    }

    /// `caller` and its arrival number, for a reservation arriving now.
    #[inline]
    pub(super) fn arrive(&mut self, caller: Caller) -> (Caller, u64) {
        self.arrivals += 1;
        (caller, self.arrivals)
    }

    /// Takes `cost` from every bucket if it fits them all now (no guard, no learned
    /// charge; [`Arbiter::enter_grant`] does the rest of the booking).
    #[inline]
    fn take_if_fits(&mut self, cost: &[u64], now: Instant) -> bool {
        let fits = self.dims.iter_mut().zip(cost).all(|(dim, &c)| dim.bucket.fits(c, now));
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
        if self.capped {
            let queued = self.tickets.slot(ticket).state == SlotState::Queued;
            self.cap_take(ticket, queued, now);
        }
        let slot = self.tickets.slot_mut(ticket);
        slot.granted_in = self.gate.epoch();
        slot.granted_at = now;
        self.books.grant(self.tickets.cost(ticket));
    }

    /// Whether the first reservation goes alone ([`ArbiterConfig::first_alone`]), or
    /// learning probes a supposed window edge one request at a time, and one is granted and
    /// not yet ended: nothing else may be granted. (A scan, only until then.)
    #[inline]
    pub(super) fn alone_blocks(&self) -> bool {
        let probing = self.probe_from.is_some_and(|from| self.clock.latest() >= from);
        (self.first_alone || probing) && self.tickets.any_granted()
    }

    /// The provider reported, or the first reservation ended: others may go with it.
    pub(super) fn end_first_alone(&mut self, now: Instant) {
        if self.first_alone {
            self.first_alone = false;
            self.drive(now);
        }
    }

    /// Refuses at once a reservation while the account's quota is spent, or one that costs
    /// a dimension whose longer quota (a day's) is, unless the caller may wait until it
    /// resets (`max_wait`); forgets what has reset since.
    #[cold]
    fn check_spent(
        &mut self,
        cost: &[u64],
        max_wait: Option<Duration>,
        now: Instant,
    ) -> Result<(), ReserveError> {
        self.forget_spent(now);
        let pool = self.spent.map(|s| (s.dimension, s.until));
        let spent = pool.or_else(|| {
            cost.iter().zip(&self.dims).enumerate().find_map(|(d, (&c, dim))| {
                Some((Some(d), Some(dim.spent_until.filter(|_| c > 0)?)))
            })
        });
        let Some((dimension, until)) = spent else {
            return Ok(());
        };
        let resets_in = until.map(|u| u.saturating_duration_since(now));
        match (resets_in, max_wait) {
            (Some(resets_in), Some(m)) if resets_in <= m => Ok(()),
            _ => Err(ReserveError::QuotaSpent { dimension, resets_in }),
        }
    }

    /// Forgets every spent quota that has reset by `now`.
    pub(super) fn forget_spent(&mut self, now: Instant) {
        for dim in &mut self.dims {
            if dim.spent_until.is_some_and(|until| until <= now) {
                dim.spent_until = None;
            }
        }
        if self.spent.is_some_and(|s| s.until.is_some_and(|until| until <= now)) {
            self.spent = None;
        }
        self.quota_spent =
            self.spent.is_some() || self.dims.iter().any(|d| d.spent_until.is_some());
    }

    /// A quota of `dimension` over a longer window than its bucket's was reported spent
    /// until `until` (`None`: it is not, or no longer): every queued reservation costing
    /// it is refused, saying when it resets.
    pub(super) fn set_spent(&mut self, dimension: usize, until: Option<Instant>, now: Instant) {
        self.dims[dimension].spent_until = until.filter(|&u| u > now);
        self.quota_spent = self.dims.iter().any(|d| d.spent_until.is_some());
        let Some(until) = self.dims[dimension].spent_until else {
            return;
        };
        let resets_in = until.saturating_duration_since(now);
        let reason = Refusal::QuotaSpent { dimension: Some(dimension), resets_in: Some(resets_in) };
        self.refuse_queued(dimension, 0, reason);
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
                return Err(ReserveError::CostExceedsCapacity { dimension, cost, capacity });
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
        for (d, (dim, &c)) in self.dims.iter_mut().zip(cost).enumerate() {
            let total = self.queue.cost_in(d).saturating_add(u128::from(c));
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
        self.queue.head(&self.tickets)
    }

    /// The instant the head's cost fits every dimension, assuming nothing else happens.
    pub(super) fn ready_at(&self, head: Ticket, now: Instant) -> Instant {
        let mut wait = Duration::ZERO;
        for d in 0..self.dims.len() {
            let cost = self.booked(d, self.tickets.cost_in(head, d));
            let dim = &self.dims[d];
            let mut w = dim.bucket.time_until_at(cost, now).unwrap_or(Duration::MAX);
            if let Some(until) = dim.spent_until.filter(|_| cost > 0) {
                w = w.max(until.saturating_duration_since(now));
            }
            if let Some(renewal) = dim.renewal {
                // A budget is topped up when it renews.
                w = w.min(renewal.at.saturating_duration_since(now));
            }
            if dim.edge_refill.is_some()
                && let Some(edge) = dim.guard.as_ref().and_then(|g| g.edge_after(now))
            {
                // The bucket is full again at the next edge.
                w = w.min(edge.saturating_duration_since(now));
            }
            wait = wait.max(w);
            if let Some(guard) = &dim.guard {
                // `None`: only a reservation ending makes room, and that drives the queue.
                let mut w = guard.time_until_at(cost, now).unwrap_or(Duration::MAX);
                if let Some(from) = self.probe_from {
                    // A probe goes past the guard from then.
                    w = w.min(from.saturating_duration_since(now));
                }
                wait = wait.max(w);
            }
        }
        now + wait
    }

    /// Removes a queued ticket's claim from the running sums (its queue entry, if still
    /// there, becomes stale and is skipped).
    pub(super) fn unqueue(&mut self, ticket: Ticket) {
        if self.capped {
            self.cap_unpending(ticket);
        }
        self.queue.leave(self.tickets.cost(ticket));
        self.fair.leave(self.tickets.slot(ticket).caller, None);
    }

    /// Puts a reservation that stopped waiting back in the queue: in its old place if it
    /// had one, else at the pool's virtual time in its class (ahead of the backlogs).
    pub(super) fn queue_again(&mut self, ticket: Ticket) {
        let slot = *self.tickets.slot(ticket);
        let key = if slot.key.tag == tickets::NO_TAG {
            let key = self.fair.requeue_key(
                slot.caller,
                self.lead(slot.caller.priority),
                slot.key.arrival,
            );
            self.tickets.slot_mut(ticket).key = key;
            key
        } else {
            self.fair.count_in(slot.caller);
            slot.key
        };
        self.queue.push(ticket, key, self.tickets.cost(ticket));
        if self.capped {
            self.cap_pending(ticket);
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
        let depth = self.config.backfill_depth;
        let mut i = 1;
        let mut looked = 0;
        while i < self.queue.len() && looked < depth {
            let candidate = self.queue.at(i);
            if !self.tickets.is_queued(candidate) {
                i += 1;
                continue;
            }
            looked += 1;
            let cost = |arbiter: &Arbiter, d: usize| {
                arbiter.booked(d, arbiter.tickets.cost_in(candidate, d))
            };
            let head =
                |arbiter: &Arbiter, d: usize| arbiter.booked(d, arbiter.tickets.cost_in(head, d));
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
        if !self.guarded && !self.charging && !self.quota_spent {
            return self.dims.iter_mut().zip(cost).all(|(dim, &c)| dim.bucket.fits(c, now));
        }
        cost.iter().enumerate().all(|(d, &c)| {
            let c = self.booked(d, c);
            self.fits(d, c, now)
        })
    }

    /// What a reservation of `cost` in `dimension` takes from its bucket: the cost times
    /// what the provider was seen to book per unit reserved ([`Arbiter::charge_factor`]),
    /// within the dimension's capacity, never less than the cost; or, for a provider that
    /// books what replies use, the cost lowered to the high ratio of usage
    /// ([`Dimension::lowered`]), at least one.
    #[inline]
    pub(super) fn booked(&self, dimension: usize, cost: u64) -> u64 {
        if !self.charging {
            return cost;
        }
        let dim = &self.dims[dimension];
        let factor = Arbiter::applied_factor(dim.charge.factor);
        // Small counts (whole requests) are what the provider counts, exactly: the reports'
        // noise is larger than one unit in them.
        if cost < MIN_BOOKED_COST {
            return cost;
        }
        if factor == 1.0 {
            if !self.config.reserve_usage {
                return cost;
            }
            return match dim.lowered() {
                // Rounded up, past the float noise of the ratios kept.
                Some(ratio) => ((cost as f64 * ratio * (1.0 - 1e-6)).ceil() as u64).clamp(1, cost),
                None => cost,
            };
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
        // A probe of a supposed window edge goes past the guard (one at a time).
        let guarded = self.guarded && self.probe_from.is_none_or(|from| now < from);
        self.dims[dimension].fits(cost, now, guarded)
    }

    #[inline]
    pub(super) fn grant(&mut self, ticket: Ticket, now: Instant) {
        // Off the running sums at the cost it queued with, before `take` books it.
        let cost = self.tickets.cost(ticket);
        self.queue.leave(cost);
        let slot = self.tickets.slot(ticket);
        let start = slot.key.start;
        self.fair.leave(slot.caller, Some((start, self.demand(cost))));
        self.take(ticket, now);
        let slot = self.tickets.slot_mut(ticket);
        slot.state = SlotState::Granted;
        let waited = now.saturating_duration_since(slot.since);
        self.events.push_back(Event::Granted { ticket, waited });
    }

    /// Takes `ticket`'s cost from every bucket and guard, and enters it in the books; the
    /// cost is first raised to what the provider books ([`Arbiter::booked`]), and the
    /// reservation holds that from then on.
    #[inline]
    pub(super) fn take(&mut self, ticket: Ticket, now: Instant) {
        if self.charging {
            for d in 0..self.dims.len() {
                // The caller's own estimate is kept for learning the charge.
                let booked = self.booked(d, self.tickets.cost_in(ticket, d));
                self.tickets.raise(ticket, d, booked);
            }
        }
        let cost = self.tickets.cost(ticket);
        for (dim, &c) in self.dims.iter_mut().zip(cost) {
            dim.bucket.take(c, now);
            if let Some(guard) = &mut dim.guard {
                guard.take(c);
            }
        }
        self.enter_grant(ticket, now);
    }
}
