//! Per-tenant caps: a tenant's most of each limit, a bucket per dimension at that share of
//! the pool's rate and capacity. A reservation its cap cannot take waits apart (parked)
//! and enters the queue when the cap has room for it, so it never stands in front of
//! anybody else's.

use super::*;

/// A tenant's cap ([`Arbiter::set_cap`]).
#[derive(Clone, Debug)]
pub(super) struct Cap {
    /// Its share of each limit, in (0, 1].
    share: f64,
    /// One per dimension: the share of the pool's rate and capacity.
    buckets: Vec<TokenBucket>,
    /// The pool's (rate, capacity) each bucket was last derived from.
    from: Vec<(Rate, u64)>,
    /// Per dimension, what its reservations in the queue (let in, not yet granted) will
    /// take from its buckets when granted.
    pending: Vec<u64>,
    /// Its reservations waiting for room under the cap, oldest first.
    parked: VecDeque<Ticket>,
}

/// What a tenant's cap holds, in permits: the pool's `capacity` times `share`, at least one.
fn capped(capacity: u64, share: f64) -> u64 {
    ((capacity as f64 * share).floor() as u64).clamp(1, capacity)
}

impl Arbiter {
    /// Caps `tenant` at `share` of every limit (a fraction in (0, 1]: its reservations
    /// may take at most `share` of each dimension's capacity at once and of its rate over
    /// time, whatever is free), or lifts its cap (`None`). A capped tenant's reservation
    /// the cap cannot take waits apart and enters the queue when the cap has room, so it
    /// never holds back another tenant's; one costing more than the cap's capacity is
    /// refused ([`ReserveError::CostExceedsCap`]). The cap follows the pool: a rate or
    /// capacity learned or set scales it.
    ///
    /// Capped tenants' calls are granted through the queue's order; the express lane
    /// ([`LaneDesk::lease`]) leases nothing while any cap is set.
    pub fn set_cap(
        &mut self,
        tenant: Tenant,
        share: Option<f64>,
        now: Instant,
    ) -> Result<(), InvalidLimit> {
        let now = self.clock.advance(now);
        let Some(share) = share else {
            if let Some(cap) = self.caps.remove(&tenant) {
                // What waited under the cap queues as any reservation does.
                for ticket in cap.parked {
                    self.enter_queue(ticket);
                }
            }
            self.capped = !self.caps.is_empty();
            self.drive(now);
            return Ok(());
        };
        if !(share > 0.0 && share <= 1.0) {
            return Err(InvalidLimit::Share(share));
        }
        let mut buckets = Vec::with_capacity(self.dims.len());
        let mut from = Vec::with_capacity(self.dims.len());
        for dim in &self.dims {
            let (rate, capacity) = (dim.bucket.rate(), dim.bucket.capacity());
            buckets.push(TokenBucket::new(scaled(rate, share)?, capped(capacity, share), now)?);
            from.push((rate, capacity));
        }
        let pending = vec![0; self.dims.len()];
        let old = self
            .caps
            .insert(tenant, Cap { share, buckets, from, pending, parked: VecDeque::new() });
        self.capped = true;
        if let Some(old) = old {
            // Re-capped: what was parked waits under the new cap, what was let in stays.
            let cap = self.caps.get_mut(&tenant).expect("just inserted");
            cap.pending = old.pending;
            cap.parked = old.parked;
        }
        self.drive(now);
        Ok(())
    }

    /// `tenant`'s cap (its share of each limit), if it has one.
    pub(super) fn cap_of(&self, tenant: Tenant) -> Option<f64> {
        Some(self.caps.get(&tenant)?.share)
    }

    /// Reservations of `tenant` waiting for room under its cap.
    pub(super) fn parked_of(&self, tenant: Tenant) -> usize {
        self.caps.get(&tenant).map_or(0, |c| c.parked.len())
    }

    /// Scales `tenant`'s cap buckets to the pool's rates and capacities of now.
    fn follow_pool(&mut self, tenant: Tenant, now: Instant) {
        let Some(cap) = self.caps.get_mut(&tenant) else {
            return;
        };
        for (d, dim) in self.dims.iter().enumerate() {
            let pool = (dim.bucket.rate(), dim.bucket.capacity());
            if cap.from[d] == pool {
                continue;
            }
            if let Ok(rate) = scaled(pool.0, cap.share) {
                cap.buckets[d].set_rate(rate, now);
            }
            let _ = cap.buckets[d].set_capacity(capped(pool.1, cap.share), now);
            cap.from[d] = pool;
        }
    }

    /// Whether a reservation of `cost` for `tenant` may go as anybody's would (its cap has
    /// room for it beside what it has queued, and nothing of its waits under the cap), or
    /// an error if no room will ever do. `Ok(true)` for a tenant without a cap.
    pub(super) fn cap_admits(
        &mut self,
        tenant: Tenant,
        cost: &[u64],
        now: Instant,
    ) -> Result<bool, ReserveError> {
        self.follow_pool(tenant, now);
        let Some(cap) = self.caps.get_mut(&tenant) else {
            return Ok(true);
        };
        for (dimension, (bucket, &c)) in cap.buckets.iter().zip(cost).enumerate() {
            if c > bucket.capacity() {
                return Err(ReserveError::CostExceedsCap {
                    dimension,
                    cost: c,
                    cap: bucket.capacity(),
                });
            }
        }
        Ok(cap.parked.is_empty() && room(cap, cost, now))
    }

    /// How long until `tenant`'s cap has room for what waits under it and `cost`.
    pub(super) fn cap_wait(&mut self, tenant: Tenant, cost: &[u64], now: Instant) -> Duration {
        let parked: Vec<u64> = match self.caps.get(&tenant) {
            Some(cap) => (0..self.dims.len())
                .map(|d| cap.parked.iter().map(|&t| self.tickets.cost_in(t, d)).sum())
                .collect(),
            None => return Duration::ZERO,
        };
        let cap = self.caps.get_mut(&tenant).expect("checked");
        let mut wait = Duration::ZERO;
        for (d, bucket) in cap.buckets.iter_mut().enumerate() {
            let total = cost[d].saturating_add(cap.pending[d]).saturating_add(parked[d]);
            wait = wait.max(bucket.time_until_unbounded(total, now));
        }
        wait
    }

    /// Sets `ticket` (queued, for a capped tenant) to wait under its cap.
    pub(super) fn park(&mut self, ticket: Ticket) {
        let tenant = self.tickets.slot(ticket).caller.tenant;
        if let Some(cap) = self.caps.get_mut(&tenant) {
            cap.parked.push_back(ticket);
        }
    }

    /// A reservation for a capped tenant was let into the queue: its cost is pending.
    pub(super) fn cap_pending(&mut self, ticket: Ticket) {
        let tenant = self.tickets.slot(ticket).caller.tenant;
        if let Some(cap) = self.caps.get_mut(&tenant) {
            // At the caller's own cost: a learned charge raises it only at the grant.
            for (p, &c) in cap.pending.iter_mut().zip(self.tickets.estimate(ticket)) {
                *p = p.saturating_add(c);
            }
        }
    }

    /// A queued reservation left the queue without a grant: its cost is no longer pending.
    pub(super) fn cap_unpending(&mut self, ticket: Ticket) {
        let tenant = self.tickets.slot(ticket).caller.tenant;
        if let Some(cap) = self.caps.get_mut(&tenant) {
            for (p, &c) in cap.pending.iter_mut().zip(self.tickets.estimate(ticket)) {
                *p = p.saturating_sub(c);
            }
        }
    }

    /// Takes a reservation's whole cost from its tenant's cap at its grant (`queued`: it
    /// was pending there).
    pub(super) fn cap_take(&mut self, ticket: Ticket, queued: bool, now: Instant) {
        if queued {
            self.cap_unpending(ticket);
        }
        let tenant = self.tickets.slot(ticket).caller.tenant;
        if let Some(cap) = self.caps.get_mut(&tenant) {
            for (bucket, &c) in cap.buckets.iter_mut().zip(self.tickets.cost(ticket)) {
                bucket.take(c, now);
            }
        }
    }

    /// A granted reservation for `ticket`'s tenant ended at `charged` (one per dimension)
    /// of what it took: the difference goes back to its cap (or is charged to it).
    pub(super) fn cap_settle(&mut self, ticket: Ticket, charged: &[u64], now: Instant) {
        let tenant = self.tickets.slot(ticket).caller.tenant;
        let Some(cap) = self.caps.get_mut(&tenant) else {
            return;
        };
        for ((bucket, &took), &used) in
            cap.buckets.iter_mut().zip(self.tickets.cost(ticket)).zip(charged)
        {
            if used < took {
                bucket.give_back(took - used, now);
            } else if used > took {
                bucket.take(used - took, now);
            }
        }
    }

    /// Lets into the queue every parked reservation its tenant's cap now has room for,
    /// oldest first per tenant.
    pub(super) fn release_parked(&mut self, now: Instant) {
        let tenants: Vec<Tenant> = self
            .caps
            .iter()
            .filter(|(_, cap)| !cap.parked.is_empty())
            .map(|(&tenant, _)| tenant)
            .collect();
        for tenant in tenants {
            self.follow_pool(tenant, now);
            loop {
                let cap = self.caps.get_mut(&tenant).expect("listed");
                let Some(&ticket) = cap.parked.front() else {
                    break;
                };
                if !room(cap, self.tickets.cost(ticket), now) {
                    break;
                }
                cap.parked.pop_front();
                self.enter_queue(ticket);
            }
        }
    }

    /// The soonest a parked reservation's cap has room for it.
    pub(super) fn cap_ready_at(&self, now: Instant) -> Option<Instant> {
        self.caps
            .values()
            .filter_map(|cap| {
                let &ticket = cap.parked.front()?;
                let cost = self.tickets.cost(ticket);
                let mut wait = Duration::ZERO;
                for (d, bucket) in cap.buckets.iter().enumerate() {
                    let total = cost[d].saturating_add(cap.pending[d]);
                    wait = wait.max(bucket.time_until_at(total, now)?);
                }
                Some(now + wait)
            })
            .min()
    }

    /// Takes a parked reservation out (cancelled or refused); whether it was parked.
    pub(super) fn unpark(&mut self, ticket: Ticket) -> bool {
        let tenant = self.tickets.slot(ticket).caller.tenant;
        let Some(cap) = self.caps.get_mut(&tenant) else {
            return false;
        };
        match cap.parked.iter().position(|&t| t == ticket) {
            Some(at) => {
                cap.parked.remove(at);
                true
            }
            None => false,
        }
    }

    /// Every parked reservation.
    pub(super) fn parked(&self) -> Vec<Ticket> {
        self.caps.values().flat_map(|cap| cap.parked.iter().copied()).collect()
    }
}

/// Whether `cap` has room now for `cost` beside what its tenant has pending.
fn room(cap: &mut Cap, cost: &[u64], now: Instant) -> bool {
    cap.buckets
        .iter_mut()
        .zip(cost)
        .zip(&cap.pending)
        .all(|((bucket, &c), &p)| bucket.fits(c.saturating_add(p), now))
}

/// `rate` times `share` (never faster): the amount scaled over the same period, or, for an
/// amount that would round to nothing, the period stretched.
fn scaled(rate: Rate, share: f64) -> Result<Rate, InvalidLimit> {
    let amount = (rate.amount() as f64 * share).floor() as u64;
    if amount >= 1 {
        return Rate::new(amount, rate.period());
    }
    Rate::new(rate.amount(), rate.period().div_f64(share))
        .or_else(|_| Rate::from_per_second_f64(rate.per_second_f64() * share))
}
