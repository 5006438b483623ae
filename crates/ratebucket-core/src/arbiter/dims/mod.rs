//! Every dimension together ([`Dims`]): a cost checked, fitted, taken and refunded across
//! them all at once, waits estimated, rates adapted to throttles, and the express lane's
//! permits lent out of the buckets.

use std::collections::VecDeque;
use std::time::Duration;

mod adapt;
mod dimension;
mod guard;
mod provider;
mod usage;

pub(super) use crate::arbiter::MAX_LANE_DIMENSIONS;
use crate::arbiter::change::Change;
use crate::arbiter::config::Adapt;
use crate::arbiter::error::{ReserveError, TicketError};
use crate::arbiter::tickets::Tickets;
use crate::books::Books;
use crate::bucket::{InvalidLimit, Rate, TokenBucket};
use crate::event::Event;
use crate::ids::{SendStamp, Ticket};
use crate::learn::Adjust;
use crate::time::Instant;
use adapt::Recovery;
use dimension::Dimension;
pub(crate) use dimension::Effect;
#[cfg(test)]
pub(crate) use provider::FoldOutcome;
pub(crate) use provider::Ledger;

/// The most a commit charges a dimension, as a multiple of what was reserved there (or
/// the dimension's capacity, if larger): reported usage beyond it is distrusted. Four
/// times covers a prompt estimate that was short by the most a tokenizer differs from four
/// characters a token (code, CJK text).
pub const MAX_CHARGE_FACTOR: u64 = 4;

/// A cost across the dimensions, as each bucket takes it (booked at a learned charge).
#[derive(Clone, Copy)]
pub(super) enum Cost<'a> {
    /// A cost as asked (`bool`: reservations reserve what replies use).
    Booked(&'a [u64], bool),
    /// A live ticket's cost.
    Ticket(&'a Tickets, Ticket, bool),
}

impl Cost<'_> {
    /// What it takes from `dimension` of `dims`.
    #[inline]
    fn at(&self, dims: &Dims, dimension: usize) -> u64 {
        match *self {
            Cost::Booked(cost, usage) => dims.booked(dimension, cost[dimension], usage),
            Cost::Ticket(tickets, ticket, usage) => {
                dims.booked(dimension, tickets.cost_in(ticket, dimension), usage)
            }
        }
    }
}

/// Every dimension, and what the hot paths ask of them all at once.
#[derive(Clone, Debug)]
pub(super) struct Dims {
    dims: Vec<Dimension>,
    /// Whether any dimension has a guard (the hot paths skip them otherwise).
    guarded: bool,
    /// Whether any dimension learned that the provider books more or less than is
    /// reserved (the hot paths skip the booking otherwise).
    charging: bool,
    /// Whether any dimension is climbing back after a throttle.
    recovering: bool,
    /// Whether permits are leased to an express lane.
    pub(super) leased: bool,
}

impl Dims {
    /// One dimension per bucket, in the order costs name them.
    pub(super) fn new(buckets: Vec<TokenBucket>) -> Dims {
        Dims {
            dims: buckets.into_iter().map(Dimension::new).collect(),
            guarded: false,
            charging: false,
            recovering: false,
            leased: false,
        }
    }

    /// How many.
    #[inline]
    pub(super) fn len(&self) -> usize {
        self.dims.len()
    }

    /// Every dimension, in order.
    pub(super) fn iter(&self) -> impl Iterator<Item = &Dimension> {
        self.dims.iter()
    }

    /// `dimension`, or [`InvalidLimit::NoSuchDimension`].
    pub(super) fn get(&self, dimension: usize) -> Result<&Dimension, InvalidLimit> {
        self.dims.get(dimension).ok_or(InvalidLimit::NoSuchDimension(dimension))
    }

    /// `dimension`, to change (what the hot paths skip is noted again at [`Dims::note`]).
    pub(super) fn get_mut(&mut self, dimension: usize) -> Result<&mut Dimension, InvalidLimit> {
        self.dims.get_mut(dimension).ok_or(InvalidLimit::NoSuchDimension(dimension))
    }

    /// Notes again what the hot paths skip, after a dimension changed.
    pub(super) fn note(&mut self) {
        self.guarded = self.dims.iter().any(|d| d.guard.is_some());
        self.charging = self.dims.iter().any(|d| d.provider.charge.factor.is_some());
        self.recovering = self.dims.iter().any(|d| d.recovery.is_some());
    }

    /// Whether any dimension has a window guard.
    #[inline]
    pub(super) fn guarded(&self) -> bool {
        self.guarded
    }

    /// Whether any dimension books reservations at a learned charge.
    #[inline]
    pub(super) fn charging(&self) -> bool {
        self.charging
    }

    /// Whether nothing about any dimension needs the arbiter's order, and there are few
    /// enough for a lease.
    pub(super) fn plain(&self) -> bool {
        !self.guarded
            && !self.recovering
            && !self.charging
            && !self.leased
            && self.dims.len() <= MAX_LANE_DIMENSIONS
            && self.dims.iter().all(Dimension::is_plain)
    }

    /// Whether the provider has reported on every dimension.
    pub(super) fn all_reported(&self) -> bool {
        self.dims.iter().all(|d| d.provider.reported)
    }

    /// Refuses a cost of the wrong shape, or one above a dimension's capacity: never
    /// granted.
    pub(super) fn validate(&self, cost: &[u64]) -> Result<(), ReserveError> {
        if cost.len() != self.dims.len() {
            return Err(ReserveError::WrongDimensions {
                expected: self.dims.len(),
                got: cost.len(),
            });
        }
        for (dimension, (dim, &cost)) in self.dims.iter().zip(cost).enumerate() {
            let capacity = dim.effective_capacity();
            if cost > capacity {
                return Err(ReserveError::CostExceedsCapacity { dimension, cost, capacity });
            }
        }
        Ok(())
    }

    /// What a reservation of `cost` in `dimension` takes from its bucket
    /// ([`Dimension::booked`]).
    #[inline]
    pub(super) fn booked(&self, dimension: usize, cost: u64, reserve_usage: bool) -> u64 {
        if !self.charging {
            return cost;
        }
        self.dims[dimension].booked(cost, reserve_usage)
    }

    /// Whether `cost` (as booked) fits every bucket and guard now; guards are passed by
    /// while `lift_guard` (a probe of a supposed window edge).
    #[inline]
    pub(super) fn fits(&mut self, cost: Cost<'_>, now: Instant, lift_guard: bool) -> bool {
        let guarded = self.guarded && !lift_guard;
        (0..self.dims.len()).all(|d| {
            let c = cost.at(self, d);
            self.dims[d].fits(c, now, guarded)
        })
    }

    /// Whether granting `candidate` now leaves room for `head` when it is due, `after`
    /// from now: in every bucket the level projected to then stays at or above the head's
    /// cost after taking the candidate's, and a guard (which frees room only as charges
    /// age out) holds both now.
    pub(super) fn leaves_room(
        &mut self,
        (candidate, head): (Cost<'_>, Cost<'_>),
        after: Duration,
        now: Instant,
        lift_guard: bool,
    ) -> bool {
        let guarded = self.guarded && !lift_guard;
        (0..self.dims.len()).all(|d| {
            let (c, h) = (candidate.at(self, d), head.at(self, d));
            let dim = &mut self.dims[d];
            let projected = dim.bucket.projected_units(after, c) >= dim.bucket.units(h);
            projected
                && dim.fits(c, now, guarded)
                && (dim.guard.is_none() || dim.fits(c.saturating_add(h), now, guarded))
        })
    }

    /// Takes `cost` from every bucket if it fits them all now, for a plain pool (no guard,
    /// no learned charge).
    #[inline]
    pub(super) fn take_if_fits(&mut self, cost: &[u64], now: Instant) -> bool {
        let fits = self.dims.iter_mut().zip(cost).all(|(dim, &c)| dim.bucket.fits(c, now));
        if fits {
            for (dim, &c) in self.dims.iter_mut().zip(cost) {
                dim.bucket.take_fitted(c);
            }
        }
        fits
    }

    /// Takes `ticket`'s cost from every bucket and guard, first raised to what the
    /// provider books (the caller's own estimate kept for learning the charge); the
    /// reservation holds that from then on.
    #[inline]
    pub(super) fn take_booked(
        &mut self,
        tickets: &mut Tickets,
        ticket: Ticket,
        reserve_usage: bool,
        now: Instant,
    ) {
        if self.charging {
            for d in 0..self.dims.len() {
                let booked = self.booked(d, tickets.cost_in(ticket, d), reserve_usage);
                tickets.raise(ticket, d, booked);
            }
        }
        self.take(tickets.cost(ticket), now);
    }

    /// Makes a change to `dimension` alone (a rate, a capacity, a guard with `in_flight`
    /// held, a policy, funds), noting what the hot paths skip again: what it asks of the
    /// rest of the arbiter, and the permits funds took or a withdrawal took back.
    pub(super) fn change(
        &mut self,
        dimension: usize,
        change: Change,
        in_flight: u64,
        now: Instant,
    ) -> Result<(Effect, u64), InvalidLimit> {
        let dim = self.get_mut(dimension)?;
        let changed = match change {
            Change::Rate(rate) => (dim.set_rate(rate, now), 0),
            Change::Capacity(capacity) => {
                dim.bucket.set_capacity(capacity, now)?;
                (Effect::Refuse(dim.effective_capacity()), 0)
            }
            Change::WindowGuard(guard) => (dim.set_guard(guard, in_flight), 0),
            Change::Policy(policy) => dim.set_policy(policy).map(|()| (Effect::None, 0))?,
            Change::Fund(permits) => (Effect::None, dim.bucket.fund(permits, now)),
            Change::Withdraw => {
                (Effect::None, dim.bucket.withdraw(now) + std::mem::take(&mut dim.returned))
            }
            Change::WithdrawAtMost(most) => (Effect::None, dim.bucket.withdraw_at_most(most, now)),
            Change::Reclaim => (Effect::None, std::mem::take(&mut dim.returned)),
            // Rules, not the dimension's own: the arbiter makes them.
            Change::Budget(_) | Change::Ramp(_) => (Effect::None, 0),
        };
        self.note();
        Ok(changed)
    }

    /// Takes `cost` from every bucket and guard.
    #[inline]
    pub(super) fn take(&mut self, cost: &[u64], now: Instant) {
        for (dim, &c) in self.dims.iter_mut().zip(cost) {
            dim.take(c, now);
        }
    }

    /// A reservation that held `held`, granted at `granted_at` (`written_off`: before the
    /// gate last closed), ended having used `used` (`None`: nothing, it is returned
    /// whole): what it did not use goes back to the buckets that keep their own books
    /// (not into a budget renewed since, not after a throttle wrote it off), and an
    /// overrun is taken as debt.
    pub(super) fn refund(
        &mut self,
        held: &[u64],
        used: Option<&[u64]>,
        (granted_at, written_off): (Instant, bool),
        now: Instant,
    ) {
        for (d, (dim, &reserved)) in self.dims.iter_mut().zip(held).enumerate() {
            if dim.provider.ledger {
                continue;
            }
            let used = used.map_or(0, |used| used[d]);
            if used < reserved {
                if !written_off && dim.refundable(granted_at) {
                    dim.give_back(reserved - used, now);
                }
            } else if used > reserved {
                dim.bucket.take(used - reserved, now);
            }
        }
    }

    /// Enters the end of a reservation that held `held` in every guard, the provider having
    /// charged `charged(dimension, reserved)`; `counted: false` withdraws it (a refused
    /// probe the provider did not count).
    pub(super) fn settle_guards(
        &mut self,
        held: &[u64],
        charged: impl Fn(usize, u64) -> u64,
        counted: bool,
        now: Instant,
    ) {
        if !self.guarded {
            return;
        }
        for (d, (dim, &reserved)) in self.dims.iter_mut().zip(held).enumerate() {
            if let Some(guard) = &mut dim.guard {
                if counted {
                    guard.window.settle(reserved, charged(d, reserved), now);
                } else {
                    guard.window.withdraw(reserved);
                }
            }
        }
    }

    /// A charge of `actual` for `ticket`'s reservation of `held`, bounded where a dimension
    /// is charged beyond what it trusts ([`Dimension::charge_ceiling`]), each such one told
    /// as [`Event::Distrusted`]; `None` when every dimension trusts it, an error when it
    /// names the wrong number of dimensions.
    pub(super) fn distrust(
        &self,
        ticket: Ticket,
        held: &[u64],
        actual: &[u64],
        events: &mut VecDeque<Event>,
    ) -> Result<Option<Vec<u64>>, TicketError> {
        if actual.len() != self.dims.len() {
            let (expected, got) = (self.dims.len(), actual.len());
            return Err(TicketError::WrongDimensions { expected, got });
        }
        let ceiling = |d: usize| self.dims[d].charge_ceiling(held[d]);
        if actual.iter().enumerate().all(|(d, &used)| used <= ceiling(d)) {
            return Ok(None);
        }
        let bounded = actual.iter().enumerate().map(|(dimension, &reported)| {
            let charged = reported.min(ceiling(dimension));
            if reported > charged {
                events.push_back(Event::Distrusted { ticket, dimension, reported, charged });
            }
            charged
        });
        Ok(Some(bounded.collect()))
    }

    /// Records what a reply used against what its caller estimated, per dimension.
    pub(super) fn record_usage(&mut self, used: &[u64], estimate: &[u64]) {
        for (dim, (&used, &estimate)) in self.dims.iter_mut().zip(used.iter().zip(estimate)) {
            dim.usage.record(used, estimate);
        }
    }

    /// A reservation's dominant demand: the longest any of its dimensions takes to refill
    /// its cost at the current rates, in seconds.
    pub(super) fn demand(&self, cost: &[u64]) -> f64 {
        self.dims
            .iter()
            .zip(cost)
            .map(|(dim, &c)| c as f64 / dim.bucket.rate().per_second_f64().max(f64::MIN_POSITIVE))
            .fold(0.0, f64::max)
    }

    /// How long from `now` until `cost`, queued behind `queued` (the queue's sums per
    /// dimension), would be granted, erring long.
    pub(super) fn wait(
        &mut self,
        queued: impl Fn(usize) -> u128,
        cost: &[u64],
        now: Instant,
    ) -> Duration {
        let mut wait = Duration::ZERO;
        for (d, (dim, &c)) in self.dims.iter_mut().zip(cost).enumerate() {
            let total = queued(d).saturating_add(u128::from(c));
            let total = u64::try_from(total).unwrap_or(u64::MAX);
            wait = wait.max(dim.bucket.time_until_unbounded(total, now));
            if let Some(guard) = &mut dim.guard {
                // Erring long: a guard full of reservations still in flight makes room
                // within a window of their ending.
                let guard = &mut guard.window;
                wait = wait.max(guard.time_until(total, now).unwrap_or(guard.window()));
            }
        }
        wait
    }

    /// How long from `now` until everything queued (`queued`, per dimension) plus `more`
    /// would be granted at the rates in force (see `Desk::estimate_drain`).
    pub(super) fn drain(
        &self,
        queued: impl Fn(usize) -> u128,
        more: &[u64],
        now: Instant,
    ) -> Duration {
        let mut wait = Duration::ZERO;
        for (d, (dim, &extra)) in self.dims.iter().zip(more).enumerate() {
            let total = queued(d).saturating_add(u128::from(extra));
            let total = u64::try_from(total).unwrap_or(u64::MAX);
            wait = wait.max(dim.bucket.drain_time(total, now));
            if let Some(guard) = &dim.guard {
                // The first window's worth waits for what the cap holds now to age out (a
                // cap seeded full waits up to a window); then whole windows' worth beyond
                // it, the sustained rate of the cap.
                let guard = &guard.window;
                let first =
                    guard.time_until_at(total.min(guard.limit()), now).unwrap_or(guard.window());
                let windows = total.saturating_sub(guard.limit()) as f64 / guard.limit() as f64;
                let secs = guard.window().as_secs_f64() * windows;
                let beyond = Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX);
                wait = wait.max(first.saturating_add(beyond));
            }
        }
        wait
    }

    /// The instant `cost(dimension)` fits every dimension, assuming nothing else happens
    /// (see [`Dimension::ready_in`]).
    pub(super) fn ready_at(
        &self,
        cost: Cost<'_>,
        now: Instant,
        probe_from: Option<Instant>,
        renewal: impl Fn(usize) -> Option<Instant>,
    ) -> Instant {
        let mut wait = Duration::ZERO;
        for (d, dim) in self.dims.iter().enumerate() {
            wait = wait.max(dim.ready_in(cost.at(self, d), now, probe_from, renewal(d)));
        }
        now.saturating_add(wait)
    }

    /// A throttle closed the gate until `until`: every level drops to nothing (the
    /// provider has nothing left), and with `adapt` every dimension not synced to the
    /// provider drops its rate and climbs back from the pause's end.
    pub(super) fn throttle(
        &mut self,
        adapt: Option<Adapt>,
        until: Instant,
        now: Instant,
        events: &mut VecDeque<Event>,
    ) {
        for dim in &mut self.dims {
            dim.bucket.lower_to(0, now);
        }
        let Some(adapt) = adapt else { return };
        for (dimension, dim) in self.dims.iter_mut().enumerate() {
            // Where the provider keeps the books its reports already steer the level; a
            // stray 429 there is not evidence of a lower limit.
            if dim.provider.ledger {
                continue;
            }
            let rates = (dim.bucket.rate().per_second_f64(), dim.configured.per_second_f64());
            // The climb back takes a step per window of the provider's when it is known.
            let probe = dim.learner.as_ref().map_or(adapt.probe, |l| l.window());
            let (to, recovery) = Recovery::after_throttle(adapt, rates, until, probe);
            dim.recovery = Some(recovery);
            rate_to(dimension, dim, to, now, events);
        }
        self.note();
    }

    /// Moves every recovering dimension's rate to where its climb back stands at `now`
    /// (`adapt`: whether rates adapt at all); one back at its configured rate stops.
    pub(super) fn recover(&mut self, adapt: bool, now: Instant, events: &mut VecDeque<Event>) {
        if !self.recovering {
            return;
        }
        if !adapt {
            self.recovering = false;
            return;
        }
        for (dimension, dim) in self.dims.iter_mut().enumerate() {
            let Some(recovery) = dim.recovery else {
                continue;
            };
            let configured = dim.configured.per_second_f64();
            let current = dim.bucket.rate().per_second_f64();
            let target = recovery.rate_at(configured, now);
            // Moved in steps of a thousandth at least, so a climb is not an event per call.
            if target >= configured || target >= current * 1.001 {
                rate_to(dimension, dim, target, now, events);
            }
            if dim.bucket.rate() == dim.configured {
                dim.recovery = None;
            }
        }
        self.note();
    }

    /// Applies one of the learning policy's adjustments to `dimension` (see
    /// [`Dimension::adjust`]); what the hot paths skip is noted again.
    pub(super) fn adjust(
        &mut self,
        dimension: usize,
        adjust: &Adjust,
        (sent, books, tickets): (SendStamp, &Books, &Tickets),
        at: (Option<Instant>, Instant),
        events: &mut VecDeque<Event>,
    ) -> Result<Effect, InvalidLimit> {
        let ledger = Ledger { books, tickets };
        let effect = self.get_mut(dimension)?.adjust(adjust, (dimension, sent), ledger, at, events);
        self.note();
        effect
    }

    /// Leases up to `most` whole permits of every bucket to an express lane, taken from the
    /// levels at once with the ceilings lowered by as much; `None` if some bucket has no
    /// whole permit.
    pub(super) fn lease(&mut self, most: u64, now: Instant) -> Option<[u64; MAX_LANE_DIMENSIONS]> {
        let mut permits = [0; MAX_LANE_DIMENSIONS];
        for (d, dim) in self.dims.iter_mut().enumerate() {
            if dim.keeps_refunds_apart() {
                // A funded share's refunds are kept apart, which the lane's own refunds
                // would not: its grants go through the arbiter.
                return None;
            }
            let whole = dim.bucket.available(now).floor();
            if whole < 1.0 {
                return None;
            }
            // A float of at least one, converted saturating and bounded by `most`.
            permits[d] = (whole as u64).min(most);
        }
        for (dim, &permits) in self.dims.iter_mut().zip(&permits) {
            dim.bucket.lend(permits, now);
            dim.lent = permits;
        }
        self.leased = true;
        Some(permits)
    }

    /// Ends a grant the express lane made of `reserved`, whose request cost `actual`
    /// (within each dimension's trusted ceiling): the over-estimate back (not after a
    /// throttle wrote it off), an under-estimate taken as debt.
    pub(super) fn end_lane_grant(
        &mut self,
        reserved: &[u64],
        actual: &[u64],
        written_off: bool,
        now: Instant,
    ) {
        for (dim, (&reserved, &used)) in self.dims.iter_mut().zip(reserved.iter().zip(actual)) {
            let used = used.min(dim.charge_ceiling(reserved));
            if used < reserved && !written_off {
                dim.give_back(reserved - used, now);
            } else if used > reserved {
                dim.bucket.take(used - reserved, now);
            }
        }
    }

    /// Ends the lease: `unused` (per dimension) goes back to the levels as the ceilings
    /// rise again. Whether a lease was out.
    pub(super) fn give_back(&mut self, unused: &[u64], now: Instant) -> bool {
        if !std::mem::take(&mut self.leased) {
            return false;
        }
        for (d, dim) in self.dims.iter_mut().enumerate() {
            let back = unused.get(d).copied().unwrap_or(0).min(dim.lent);
            dim.bucket.repay(std::mem::take(&mut dim.lent), back, now);
        }
        true
    }
}

/// Sets `dim`'s rate to `wanted` per second (never above its configured one), telling it.
fn rate_to(
    dimension: usize,
    dim: &mut Dimension,
    wanted: f64,
    now: Instant,
    events: &mut VecDeque<Event>,
) {
    let from = dim.bucket.rate();
    let to = if wanted >= dim.configured.per_second_f64() {
        dim.configured
    } else {
        match Rate::from_per_second_f64(wanted) {
            Ok(rate) => rate,
            Err(_) => return,
        }
    };
    if to != from {
        dim.bucket.set_rate(to, now);
        events.push_back(Event::RateChanged { dimension, from, to });
    }
}
