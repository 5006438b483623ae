//! Per-tenant caps: a tenant's most of each limit, a bucket per dimension at that share of
//! the pool's rate and capacity. A reservation its cap cannot take waits apart (parked)
//! and enters the queue when the cap has room for it, so it never stands in front of
//! anybody else's.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use super::{Admission, Ask, Ctx, Ended, Rule};
use crate::arbiter::dims::Dims;
use crate::arbiter::error::ReserveError;
use crate::arbiter::fair::Tenant;
use crate::arbiter::tickets::Tickets;
use crate::bucket::{InvalidLimit, Rate, TokenBucket};
use crate::ids::Ticket;
use crate::time::Instant;

/// A tenant's cap (`Arbiter::set_cap`).
#[derive(Clone, Debug)]
struct Cap {
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

/// Every tenant's cap: the rule that parks what a cap cannot take now and lets it into
/// the queue when the cap has room.
#[derive(Clone, Debug, Default)]
pub(crate) struct Caps {
    caps: HashMap<Tenant, Cap>,
}

impl Caps {
    /// Caps `tenant` at `share` of every limit of `dims` (see `Arbiter::set_cap`), or lifts
    /// its cap (`None`). Returns what waited under a lifted cap, to queue.
    pub(crate) fn set(
        &mut self,
        tenant: Tenant,
        share: Option<f64>,
        dims: &Dims,
        now: Instant,
    ) -> Result<Vec<Ticket>, InvalidLimit> {
        let Some(share) = share else {
            let parked = self.caps.remove(&tenant).map(|cap| cap.parked);
            return Ok(parked.map_or_else(Vec::new, Vec::from));
        };
        if !(share > 0.0 && share <= 1.0) {
            return Err(InvalidLimit::Share(share));
        }
        let mut buckets = Vec::with_capacity(dims.len());
        let mut from = Vec::with_capacity(dims.len());
        for dim in dims.iter() {
            let (rate, capacity) = (dim.bucket.rate(), dim.bucket.capacity());
            buckets.push(TokenBucket::new(scaled(rate, share)?, capped(capacity, share), now)?);
            from.push((rate, capacity));
        }
        let mut cap =
            Cap { share, buckets, from, pending: vec![0; dims.len()], parked: VecDeque::new() };
        if let Some(old) = self.caps.remove(&tenant) {
            // Re-capped: what was parked waits under the new cap, what was let in stays.
            cap.pending = old.pending;
            cap.parked = old.parked;
        }
        self.caps.insert(tenant, cap);
        Ok(Vec::new())
    }

    /// `tenant`'s cap (its share of each limit), if it has one.
    pub(crate) fn share_of(&self, tenant: Tenant) -> Option<f64> {
        Some(self.caps.get(&tenant)?.share)
    }

    /// Reservations of `tenant` waiting for room under its cap.
    pub(crate) fn parked_of(&self, tenant: Tenant) -> usize {
        self.caps.get(&tenant).map_or(0, |c| c.parked.len())
    }

    /// Every tenant with a cap.
    pub(crate) fn tenants(&self) -> impl Iterator<Item = Tenant> + '_ {
        self.caps.keys().copied()
    }

    /// Scales `tenant`'s cap buckets to the pool's rates and capacities of now.
    fn follow_pool(&mut self, tenant: Tenant, dims: &Dims, now: Instant) {
        let Some(cap) = self.caps.get_mut(&tenant) else {
            return;
        };
        for (d, dim) in dims.iter().enumerate() {
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

    /// Sets `ticket` (for a capped tenant) to wait under its cap.
    pub(crate) fn park(&mut self, ticket: Ticket, tickets: &Tickets) {
        if self.caps.is_empty() {
            return;
        }
        let tenant = tickets.slot(ticket).caller().tenant;
        if let Some(cap) = self.caps.get_mut(&tenant) {
            cap.parked.push_back(ticket);
        }
    }

    /// Every parked reservation its tenant's cap now has room for, oldest first per
    /// tenant, taken out to enter the queue.
    pub(crate) fn release(&mut self, dims: &Dims, tickets: &Tickets, now: Instant) -> Vec<Ticket> {
        if self.caps.is_empty() {
            return Vec::new();
        }
        let mut released = Vec::new();
        let tenants: Vec<Tenant> = self
            .caps
            .iter()
            .filter(|(_, cap)| !cap.parked.is_empty())
            .map(|(&tenant, _)| tenant)
            .collect();
        for tenant in tenants {
            self.follow_pool(tenant, dims, now);
            let cap = self.caps.get_mut(&tenant).expect("listed");
            while let Some(&ticket) = cap.parked.front() {
                if !room(cap, tickets.cost(ticket), now) {
                    break;
                }
                cap.parked.pop_front();
                // Pending from now: released in order, each beside the ones before it.
                for (p, &c) in cap.pending.iter_mut().zip(tickets.estimate(ticket)) {
                    *p = p.saturating_add(c);
                }
                released.push(ticket);
            }
        }
        released
    }

    /// The soonest a parked reservation's cap has room for it.
    pub(crate) fn ready_at(&self, tickets: &Tickets, now: Instant) -> Option<Instant> {
        if self.caps.is_empty() {
            return None;
        }
        self.caps
            .values()
            .filter_map(|cap| {
                let &ticket = cap.parked.front()?;
                let cost = tickets.cost(ticket);
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
    pub(crate) fn unpark(&mut self, ticket: Ticket, tickets: &Tickets) -> bool {
        if self.caps.is_empty() {
            return false;
        }
        let tenant = tickets.slot(ticket).caller().tenant;
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
    pub(crate) fn parked(&self) -> impl Iterator<Item = Ticket> + '_ {
        self.caps.values().flat_map(|cap| cap.parked.iter().copied())
    }
}

impl Rule for Caps {
    fn idle(&self) -> bool {
        self.caps.is_empty()
    }

    /// Parked when its tenant's cap has no room for it beside what the tenant has queued,
    /// or while anything of the tenant's waits under the cap; refused when no room will
    /// ever do.
    fn admit(&mut self, ask: &Ask<'_>, ctx: &Ctx<'_>, now: Instant) -> Admission {
        let tenant = ask.caller.tenant;
        self.follow_pool(tenant, ctx.dims, now);
        let Some(cap) = self.caps.get_mut(&tenant) else {
            return Admission::Admit;
        };
        for (dimension, (bucket, &cost)) in cap.buckets.iter().zip(ask.cost).enumerate() {
            if cost > bucket.capacity() {
                return Admission::Refuse(ReserveError::CostExceedsCap {
                    dimension,
                    cost,
                    cap: bucket.capacity(),
                });
            }
        }
        if cap.parked.is_empty() && room(cap, ask.cost, now) {
            Admission::Admit
        } else {
            Admission::Park
        }
    }

    /// How long until the tenant's cap has room for what waits under it and `ask`.
    fn wait(&mut self, ask: &Ask<'_>, ctx: &Ctx<'_>, now: Instant) -> Duration {
        let Some(cap) = self.caps.get_mut(&ask.caller.tenant) else {
            return Duration::ZERO;
        };
        let mut wait = Duration::ZERO;
        for (d, bucket) in cap.buckets.iter_mut().enumerate() {
            let parked: u64 = cap.parked.iter().map(|&t| ctx.tickets.cost_in(t, d)).sum();
            let total = ask.cost[d].saturating_add(cap.pending[d]).saturating_add(parked);
            wait = wait.max(bucket.time_until_unbounded(total, now));
        }
        wait
    }

    /// For a capped tenant, what it has queued is pending under its cap (at the caller's
    /// own cost: a learned charge raises it only at the grant).
    fn queued(&mut self, ask: &Ask<'_>, entered: bool) {
        if let Some(cap) = self.caps.get_mut(&ask.caller.tenant) {
            for (p, &c) in cap.pending.iter_mut().zip(ask.estimate) {
                *p = if entered { p.saturating_add(c) } else { p.saturating_sub(c) };
            }
        }
    }

    /// The whole cost is taken from the tenant's cap (no longer pending if it queued).
    fn granted(&mut self, ask: &Ask<'_>, queued: bool, now: Instant) {
        if queued {
            self.queued(ask, false);
        }
        if let Some(cap) = self.caps.get_mut(&ask.caller.tenant) {
            for (bucket, &c) in cap.buckets.iter_mut().zip(ask.cost) {
                bucket.take(c, now);
            }
        }
    }

    /// What the reservation did not use goes back to the tenant's cap (an overrun is
    /// charged to it); one returned used none of its share.
    fn ended(&mut self, ask: &Ask<'_>, _how: Ended, used: Option<&[u64]>, _: usize, now: Instant) {
        let Some(cap) = self.caps.get_mut(&ask.caller.tenant) else {
            return;
        };
        for (d, (bucket, &took)) in cap.buckets.iter_mut().zip(ask.cost).enumerate() {
            let used = used.map_or(0, |used| used[d]);
            if used < took {
                bucket.give_back(took - used, now);
            } else if used > took {
                bucket.take(used - took, now);
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arbiter::fair::Caller;
    use crate::arbiter::tickets::SlotState;
    use crate::books::Books;

    fn at_ms(ms: u64) -> Instant {
        Instant::from_millis(ms)
    }

    /// A pool of 100 a second with a burst of 100, one dimension.
    fn pool() -> Dims {
        Dims::new(vec![TokenBucket::per_second(100, Instant::ZERO).unwrap()])
    }

    fn ask(cost: &[u64], tenant: u32) -> Ask<'_> {
        Ask { cost, estimate: cost, caller: Caller::tenant(tenant), max_wait: None }
    }

    #[test]
    fn a_share_outside_zero_to_one_is_refused_and_an_uncapped_tenant_passes() {
        let (dims, mut caps) = (pool(), Caps::default());
        for share in [0.0, -0.5, 1.5, f64::NAN] {
            assert!(caps.set(Tenant(1), Some(share), &dims, Instant::ZERO).is_err(), "{share}");
        }
        assert!(caps.idle());
        caps.set(Tenant(1), Some(0.25), &dims, Instant::ZERO).unwrap();
        let (books, tickets) = (Books::new(1), Tickets::new(1));
        let ctx = Ctx { dims: &dims, books: &books, tickets: &tickets };
        assert_eq!(caps.admit(&ask(&[50], 2), &ctx, Instant::ZERO), Admission::Admit);
        assert_eq!(caps.share_of(Tenant(1)), Some(0.25));
        assert_eq!(caps.share_of(Tenant(2)), None);
    }

    #[test]
    fn a_capped_tenant_takes_its_share_then_parks_and_is_let_in_as_its_cap_refills() {
        let (dims, mut caps) = (pool(), Caps::default());
        caps.set(Tenant(1), Some(0.25), &dims, Instant::ZERO).unwrap();
        let (books, mut tickets) = (Books::new(1), Tickets::new(1));
        // A cost above the cap's burst (25) is refused: no room will ever do.
        {
            let ctx = Ctx { dims: &dims, books: &books, tickets: &tickets };
            let refused = caps.admit(&ask(&[26], 1), &ctx, Instant::ZERO);
            assert!(matches!(refused, Admission::Refuse(ReserveError::CostExceedsCap { .. })));
            // Its burst goes at once and is taken from the cap.
            assert_eq!(caps.admit(&ask(&[20], 1), &ctx, Instant::ZERO), Admission::Admit);
            caps.granted(&ask(&[20], 1), false, Instant::ZERO);
            assert_eq!(caps.admit(&ask(&[10], 1), &ctx, Instant::ZERO), Admission::Park);
            // Ten more at 25 a second: 5 are there, 5 more come in 200 ms.
            let wait = caps.wait(&ask(&[10], 1), &ctx, Instant::ZERO).as_secs_f64();
            assert!((wait - 0.2).abs() < 1e-3, "{wait}");
        }
        let parked = tickets.allocate(&[10], SlotState::Parked, Caller::tenant(1), Instant::ZERO);
        caps.park(parked, &tickets);
        assert_eq!(caps.parked_of(Tenant(1)), 1);
        let ready = caps.ready_at(&tickets, Instant::ZERO).unwrap();
        assert!(ready > at_ms(199) && ready <= at_ms(201), "{ready:?}");
        assert!(caps.release(&dims, &tickets, at_ms(100)).is_empty(), "not yet");
        assert_eq!(caps.release(&dims, &tickets, at_ms(201)), vec![parked]);
        assert_eq!(caps.parked_of(Tenant(1)), 0);
    }

    #[test]
    fn what_a_reservation_did_not_use_goes_back_to_its_cap_and_an_overrun_is_charged() {
        let (dims, mut caps) = (pool(), Caps::default());
        caps.set(Tenant(1), Some(0.25), &dims, Instant::ZERO).unwrap();
        let (books, tickets) = (Books::new(1), Tickets::new(1));
        let ctx = Ctx { dims: &dims, books: &books, tickets: &tickets };
        caps.granted(&ask(&[20], 1), false, Instant::ZERO);
        // Used 5 of 20: 15 back, so 20 fit again (5 were left).
        caps.ended(&ask(&[20], 1), Ended::Answered, Some(&[5]), 0, Instant::ZERO);
        assert_eq!(caps.admit(&ask(&[20], 1), &ctx, Instant::ZERO), Admission::Admit);
        caps.granted(&ask(&[20], 1), false, Instant::ZERO);
        // Used 25 of 20: 5 more charged; nothing is left for even one.
        caps.ended(&ask(&[20], 1), Ended::Answered, Some(&[25]), 0, Instant::ZERO);
        assert_eq!(caps.admit(&ask(&[1], 1), &ctx, Instant::ZERO), Admission::Park);
    }

    #[test]
    fn a_lifted_cap_hands_back_what_waited_under_it() {
        let (dims, mut caps) = (pool(), Caps::default());
        caps.set(Tenant(1), Some(0.1), &dims, Instant::ZERO).unwrap();
        let mut tickets = Tickets::new(1);
        let parked = tickets.allocate(&[5], SlotState::Parked, Caller::tenant(1), Instant::ZERO);
        caps.park(parked, &tickets);
        assert_eq!(caps.set(Tenant(1), None, &dims, Instant::ZERO).unwrap(), vec![parked]);
        assert!(caps.idle());
    }
}
