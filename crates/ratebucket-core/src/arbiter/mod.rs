//! The multi-dimension arbiter: one `impl` over its parts, granting the head of a fair
//! queue atomically across every dimension once every rule allows it.
//!
//! This file holds the arbiter's inputs, outputs and queries, and the grant pass (`drive`)
//! that asks each part in one order. Everything else is a type that owns its state:
//!
//! | file | what it owns |
//! |---|---|
//! | `dims.rs`, `dimension.rs` | the dimensions: a cost fitted, taken and refunded across them, waits, adapted rates, the lane's permits; one limit's bucket, guard, learning and charge |
//! | `provider.rs`, `guard.rs`, `adapt.rs`, `usage.rs` | per dimension: the level read against the provider's reports; the trailing-window guard; the climb back after a throttle; what replies used |
//! | `rules.rs` | the questions a rule answers and their order: `spent.rs`, `budget.rs`, `cap.rs`, `alone.rs` (the first request alone, the window-edge probe), `concurrency.rs`, `ramp.rs` |
//! | `tickets.rs`, `order.rs`, `fair.rs` | the ticket slab; the queue's order and sums; callers, tenants, classes and the fair share |
//! | `reply.rs`, `change.rs`, `inspect.rs`, `config.rs`, `error.rs`, `desk.rs` | inputs, snapshots, settings, errors, and [`Desk`] |

use std::collections::VecDeque;
use std::time::Duration;

use crate::books::Books;
use crate::bucket::{InvalidLimit, TokenBucket};
use crate::event::{Event, Refusal};
use crate::gate::{Gate, ThrottleOutcome};
use crate::learn::{Adjust, LearnedQuota, QuotaReport};
use crate::time::{Instant, Monotonic};

mod adapt;
mod alone;
mod budget;
mod cap;
mod change;
mod concurrency;
mod config;
mod desk;
mod dimension;
mod dims;
mod error;
mod fair;
mod guard;
mod inspect;
mod order;
mod provider;
mod ramp;
mod reply;
mod rules;
mod spent;
mod tickets;
mod usage;

pub use crate::ids::{SendStamp, Ticket};
pub use budget::{Budget, Period};
pub use change::Change;
pub use config::{Adapt, ArbiterConfig};
pub use desk::{Desk, Lease, MAX_LANE_DIMENSIONS};
pub(crate) use dimension::Effect;
pub use dims::MAX_CHARGE_FACTOR;
use dims::{Cost, Dims};
pub use error::{ReserveError, TicketError, TicketState};
pub use fair::{Caller, MAX_WEIGHT, Priority, Tenant, TenantSnapshot, UnknownPriority};
pub use inspect::{ArbiterSnapshot, DimensionSnapshot, Reported, Status};
use order::Queue;
#[cfg(test)]
pub(crate) use provider::FoldOutcome;
use provider::Ledger;
pub use ramp::Ramp;
pub use reply::{Replied, Reply, Report, Settle};
use rules::{Admission, Ask, Ctx, Ended, Rule, Rules, earliest};
use tickets::{NOT_SENT, SlotState, Tickets};

/// What the rules may read, borrowed field by field so the rules themselves stay free.
macro_rules! ctx {
    ($arbiter:expr) => {
        Ctx { dims: &$arbiter.dims, books: &$arbiter.books, tickets: &$arbiter.tickets }
    };
}

/// The multi-resource arbiter: one token bucket per dimension, a fair queue of waiters,
/// the rules a reservation passes, and the pool's [`Gate`].
///
/// It grants the head of the queue across **every** dimension at once or not at all, so
/// there is never a state where one dimension is held while another is awaited and two
/// limits cannot deadlock. A cost above a dimension's capacity is refused at once.
///
/// Sans-IO: every state-changing call takes `now`, grants are reported as
/// [`Event::Granted`] through [`Arbiter::poll_event`], and [`Arbiter::poll_timeout`]
/// says when to call [`Arbiter::handle_timeout`] next. The driver's loop: feed inputs
/// (`reserve`, `cancel`, `commit`, `release`, `reply`, `throttle`, ...); drain
/// `poll_event` (wake the waiter of each `Granted` or `Refused` ticket); arm a timer for
/// `poll_timeout`, and call `handle_timeout` when it fires. Time never goes backwards
/// here: a `now` earlier than one already seen is taken as the latest one seen.
#[derive(Clone, Debug)]
pub struct Arbiter {
    config: ArbiterConfig,
    clock: Monotonic,
    /// One per limit, in the order costs name them.
    dims: Dims,
    /// Every reservation not yet ended, with its cost.
    tickets: Tickets,
    /// The waiting reservations, in their fair order.
    queue: Queue,
    /// What a reservation passes beside the dimensions, asked in order.
    rules: Rules,
    gate: Gate,
    /// Grants, settlements and sends, to read a provider's reports against.
    books: Books,
    events: VecDeque<Event>,
    aborted: bool,
    /// Whether one input's steps are being taken in: no grant is made until it ends.
    replying: bool,
    /// While a throttled reply's reports are folded: they tell the learning policy so.
    throttled_reply: bool,
    /// The learning policy's adjustments for the report being folded (kept to reuse).
    adjustments: Vec<Adjust>,
}

impl Arbiter {
    /// An arbiter over `buckets` (one per dimension, in the order costs will name them).
    pub fn new(
        buckets: Vec<TokenBucket>,
        config: ArbiterConfig,
        now: Instant,
    ) -> Result<Arbiter, InvalidLimit> {
        let count = buckets.len();
        if count == 0 {
            return Err(InvalidLimit::ZeroCapacity);
        }
        Ok(Arbiter {
            config,
            clock: Monotonic::new(now),
            dims: Dims::new(buckets),
            tickets: Tickets::new(count),
            queue: Queue::new(count),
            rules: Rules::new(count, config.first_alone, config.max_in_flight),
            gate: Gate::new(config.gate),
            books: Books::new(count),
            events: VecDeque::new(),
            aborted: false,
            replying: false,
            throttled_reply: false,
            adjustments: Vec::new(),
        })
    }

    /// Where the arbiter stands as a whole: cheap enough to ask on every call.
    pub fn status(&self) -> Status {
        Status {
            dimensions: self.dims.len(),
            queued: self.queue.live(),
            gate: self.gate,
            aborted: self.aborted,
            spent: self.rules.spent.pool_spent(),
            lane_leased: self.dims.leased,
            lane_may_lease: self.lane_may_open_in_time(),
        }
    }

    /// Where `ticket` stands, or `None` if its reservation has ended.
    #[inline]
    pub fn state(&self, ticket: Ticket) -> Option<TicketState> {
        match self.tickets.get(ticket)?.state {
            SlotState::Queued | SlotState::Parked => Some(TicketState::Queued),
            SlotState::Granted => Some(TicketState::Granted),
            SlotState::Free => None,
        }
    }

    /// Grants whatever can go at `now`. Call it when the `poll_timeout` deadline passes.
    #[inline]
    pub fn handle_timeout(&mut self, now: Instant) {
        let now = self.clock.advance(now);
        self.drive(now);
    }

    /// When the next grant (or the gate's reopening) can happen, if anything waits for
    /// time rather than for a reply.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let now = self.clock.at_least(Instant::ZERO);
        // A quota spent until an instant holds grants as a closed gate does.
        let gate = match (self.gate.reopens_at(now), self.rules.spent.pool_until()) {
            (_, Some(None)) => return None,
            (gate, Some(Some(until))) => Some(gate.map_or(until, |g| g.max(until))),
            (gate, None) => gate,
        };
        // A reservation waiting under its tenant's cap enters the queue when it has room.
        let parked = self.rules.caps.ready_at(&self.tickets, now);
        let head = self.queue.first(&self.tickets).and_then(|head| self.head_ready(head, now));
        earliest(head.map(|ready| gate.map_or(ready, |g| g.max(ready))).or(gate), parked)
    }

    /// The next event, if any. Drain after every input.
    #[inline]
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Queues a reservation of `cost` (one entry per dimension) and grants it at once if
    /// it is at the head and fits. Watch for its [`Event::Granted`], or ask
    /// [`Arbiter::state`].
    #[inline]
    pub fn reserve(&mut self, cost: &[u64], now: Instant) -> Result<Ticket, ReserveError> {
        self.reserve_for(Caller::default(), cost, None, now)
    }

    /// Like [`Arbiter::reserve`], but refuses with [`ReserveError::WouldWait`] (and an
    /// [`Event::Rejected`]) when the estimated wait exceeds `max_wait`: the queue granted
    /// in order and nothing refunded meanwhile, erring long (but for what a concurrency
    /// limit waits on, the replies to the requests in flight).
    pub fn reserve_within(
        &mut self,
        cost: &[u64],
        max_wait: Option<Duration>,
        now: Instant,
    ) -> Result<Ticket, ReserveError> {
        self.reserve_for(Caller::default(), cost, max_wait, now)
    }

    /// Like [`Arbiter::reserve_within`], for `caller`: a tenant, whose share of a busy pool
    /// follows its weight ([`Arbiter::set_weight`]), and a priority class, ahead of lower
    /// classes until they have aged ([`ArbiterConfig::aging`]). With nobody waiting it is
    /// granted on arrival, whoever it is for.
    pub fn reserve_for(
        &mut self,
        caller: Caller,
        cost: &[u64],
        max_wait: Option<Duration>,
        now: Instant,
    ) -> Result<Ticket, ReserveError> {
        let now = self.clock.advance(now);
        if self.aborted {
            return Err(ReserveError::Aborted);
        }
        self.dims.validate(cost)?;
        let admission = if self.rules.idle() {
            Admission::Admit
        } else {
            self.rules.budgets.renew(&mut self.dims, now);
            self.rules.admit(&Ask { cost, estimate: cost, caller, max_wait }, &ctx!(self), now)
        };
        if let Admission::Refuse(error) = admission {
            return Err(error);
        }
        let parked = admission == Admission::Park;
        if let Some(max_wait) = max_wait {
            let (queue, gate) = (&self.queue, self.gate.closed_for(now));
            let mut would_wait = self.dims.wait(|d| queue.cost_in(d), cost, now).max(gate);
            if parked {
                let ask = Ask { cost, estimate: cost, caller, max_wait: None };
                would_wait = would_wait.max(self.rules.wait(&ask, &ctx!(self), now));
            }
            if would_wait > max_wait {
                self.events.push_back(Event::Rejected { would_wait, max_wait });
                return Err(ReserveError::WouldWait { retry_after: would_wait });
            }
        }
        let nobody_waits = self.queue.live() == 0 && !self.replying && self.gate.is_open(now);
        if nobody_waits
            && admission == Admission::Admit
            && let Some(ticket) = self.grant_on_arrival(cost, caller, now)
        {
            self.events.push_back(Event::Granted { ticket, waited: Duration::ZERO });
            return Ok(ticket);
        }
        let state = if parked { SlotState::Parked } else { SlotState::Queued };
        let ticket = self.tickets.allocate(cost, state, caller, now);
        if parked {
            self.rules.caps.park(ticket, &self.tickets);
            return Ok(ticket);
        }
        self.enter_queue(ticket);
        self.drive(now);
        Ok(ticket)
    }

    /// Withdraws `ticket`, as dropping it does: a queued waiter leaves the queue; a granted
    /// reservation whose request was never sent is released whole; one whose request was
    /// sent is abandoned and **stays charged as reserved**, because the provider has
    /// probably counted it (ADR 0012). Whether there was anything to withdraw. Safe to
    /// call at any time, with any ticket.
    pub fn cancel(&mut self, ticket: Ticket, now: Instant) -> bool {
        let now = self.clock.advance(now);
        let Some(slot) = self.tickets.get(ticket).copied() else {
            return false;
        };
        match slot.state {
            SlotState::Queued | SlotState::Parked => {
                self.take_out(ticket);
                self.events.push_back(Event::Cancelled { ticket });
            }
            SlotState::Granted if slot.sent != NOT_SENT => {
                // Charged as reserved: no refund, in the books and guards as spent.
                let cost = self.tickets.cost(ticket);
                self.books.settle(cost, Some(slot.sent));
                self.dims.settle_guards(cost, |_, reserved| reserved, true, now);
                let kept = Some(self.tickets.cost(ticket).to_vec());
                self.end(
                    ticket,
                    (Ended::Returned, kept.as_deref()),
                    Event::Abandoned { ticket },
                    now,
                );
            }
            SlotState::Granted => return self.release(ticket, now).is_ok(),
            SlotState::Free => return false,
        }
        self.drive(now);
        true
    }

    /// Reconciles a granted reservation against its `actual` cost: an over-estimate is
    /// refunded (up to capacity), an under-estimate charged as debt; one granted before the
    /// gate last closed is refunded nothing (see [`Arbiter::throttle`]). Trust is bounded:
    /// a dimension is charged at most [`MAX_CHARGE_FACTOR`] times what was reserved, or its
    /// capacity if more, and a report beyond that is charged at it and told as
    /// [`Event::Distrusted`], so one absurd number never leaves a debt that outlives the run.
    #[inline]
    pub fn commit(
        &mut self,
        ticket: Ticket,
        actual: &[u64],
        now: Instant,
    ) -> Result<(), TicketError> {
        let now = self.clock.advance(now);
        if actual.len() != self.dims.len() {
            let (expected, got) = (self.dims.len(), actual.len());
            return Err(TicketError::WrongDimensions { expected, got });
        }
        self.tickets.granted(ticket)?;
        let held = self.tickets.cost(ticket);
        if let Some(bounded) = self.dims.distrust(ticket, held, actual, &mut self.events) {
            return self.commit(ticket, &bounded, now);
        }
        let committed = (Ended::Answered, Event::Committed { ticket });
        self.finish(ticket, Some(actual), true, committed, now);
        Ok(())
    }

    /// Returns a granted reservation whole: its request was never sent, or the provider
    /// answered that it did not count it (a 429, a 5xx, a 4xx refusal); nothing comes back
    /// from one granted before the gate last closed. For a request sent whose outcome is
    /// unknown, [`Arbiter::cancel`] keeps it charged.
    #[inline]
    pub fn release(&mut self, ticket: Ticket, now: Instant) -> Result<(), TicketError> {
        self.release_as(ticket, true, Ended::Returned, now)
    }

    /// Stamps a request being sent at `now` without a reservation of its own, so that its
    /// reply's observations can be ordered.
    pub fn stamp_send(&mut self, now: Instant) -> SendStamp {
        let now = self.clock.advance(now);
        self.stamp(None, now)
    }

    /// Stamps the request that `ticket`'s reservation pays for, sent at `now`, only while
    /// the gate is open (else the instant it reopens, stamping nothing), so its reply's own
    /// reservation is told apart. One step: a caller that asked [`Gate::is_open`] and
    /// stamped later could be overtaken by a throttle and send into its pause.
    pub fn stamp_send_if_open(
        &mut self,
        ticket: Ticket,
        now: Instant,
    ) -> Result<SendStamp, Instant> {
        let now = self.clock.advance(now);
        if let Some(reopens) = self.gate.reopens_at(now) {
            return Err(reopens);
        }
        let granted = self.tickets.granted(ticket).is_ok();
        Ok(self.stamp(granted.then_some(ticket), now))
    }

    /// Takes a provider's answer to the request of `ticket` as one input: the throttle,
    /// abort or spent quota it calls for, the end of the reservation, and every quota
    /// report, in that order, then one grant pass. Nobody is granted between the steps: a
    /// refund reaches the next waiter only after the provider's own count has been folded,
    /// and a throttle closes the gate before its reservation's return could launch another.
    pub fn reply(&mut self, ticket: Ticket, reply: &Reply<'_>, now: Instant) -> Replied {
        let now = self.clock.advance(now);
        self.replying = true;
        // Before the reservation ends: a later report reads this one as counted first only
        // once it knows by when it was.
        self.books.note_counted(reply.sent, now);
        let refused = matches!(reply.settle, Settle::Throttled { .. });
        // A probe of a supposed window edge went alone: its refusal refutes the edge (the
        // learning policy reads it below), not a wave the pool must wait out.
        let probed = refused && self.rules.probe.probed(self.books.sent_at(reply.sent.seq));
        let mut throttle = None;
        let settled = match reply.settle {
            Settle::Charge(actual) => self.commit(ticket, actual, now),
            Settle::Keep => self.tickets.granted(ticket).map(|_| _ = self.cancel(ticket, now)),
            Settle::Throttled { .. } if probed => {
                self.release_as(ticket, false, Ended::Returned, now)
            }
            Settle::Throttled { retry_after } => {
                throttle = Some(self.throttle(reply.sent, retry_after, now));
                self.release(ticket, now)
            }
            Settle::Crowded { .. } => self.release_as(ticket, true, Ended::Crowded, now),
            Settle::Fatal => {
                self.desk().abort(now);
                self.release(ticket, now)
            }
            Settle::Spent { resets_in, dimension } => {
                let reason = self.rules.spent.spend_pool(resets_in, dimension, now);
                self.refuse_where(true, |_, _| Some(reason));
                self.release(ticket, now)
            }
            Settle::Return => self.release(ticket, now),
        };
        if settled.is_err() {
            // Not a granted reservation, or a charge of the wrong shape: withdrawn as if
            // dropped, so nothing is left behind.
            self.cancel(ticket, now);
        }
        let mut bad_report = None;
        self.throttled_reply = refused;
        for report in reply.reports {
            if let Err(e) = self.observe_quota(report.dimension, reply.sent, report.quota, now) {
                bad_report.get_or_insert(e);
            }
        }
        (self.throttled_reply, self.replying) = (false, false);
        self.drive(now);
        Replied { settled, throttle, bad_report }
    }

    /// Folds the provider's `report` on `dimension`, from the reply to the request stamped
    /// `sent`: the dimension's learning policy reads it and its adjustments are applied in
    /// order, then whatever fits is granted once. Without a
    /// [`QuotaPolicy`](crate::QuotaPolicy) it only lowers the level to `remaining` less
    /// what every other live reservation holds, and tells a guard set by hand what the
    /// window used. Absurd numbers cannot wedge it; an adjustment the dimension refuses is
    /// skipped and the first refusal returned.
    pub fn observe_quota(
        &mut self,
        dimension: usize,
        sent: SendStamp,
        report: QuotaReport,
        now: Instant,
    ) -> Result<Option<LearnedQuota>, InvalidLimit> {
        let now = self.clock.advance(now);
        self.dims.get(dimension)?;
        let mut plan = std::mem::take(&mut self.adjustments);
        let send = self.books.send(sent.seq, dimension).map(|r| (r.at, r.own));
        let seen = (send, self.books.send_delay(), self.throttled_reply);
        let clears = self.dims.get_mut(dimension)?.fold(report, sent, seen, now, &mut plan);
        let applied = self.apply(dimension, sent, &plan, clears, now);
        self.adjustments = plan;
        let dim = self.dims.get_mut(dimension)?;
        dim.provider.charge.imprecise = false;
        applied.map(|_| dim.learned())
    }

    /// Reports that a request sent with `sent` was throttled, with the provider's
    /// Retry-After if it gave one. Closes the gate once per epoch ([`Gate`]); a throttle
    /// that closes it sets every level to zero (the provider has nothing left) and writes
    /// off every reservation granted until then, whose commit refunds nothing and whose
    /// release gives nothing back: only what refills from then on is granted again. With
    /// [`ArbiterConfig::adapt`] the rates drop and climb back; ramps rise again from the
    /// pause's end.
    pub fn throttle(
        &mut self,
        sent: SendStamp,
        retry_after: Option<Duration>,
        now: Instant,
    ) -> ThrottleOutcome {
        let now = self.clock.advance(now);
        let outcome = self.gate.throttle(sent.epoch, retry_after, now);
        if let ThrottleOutcome::Closed { until, pause, epoch } = outcome {
            self.events.push_back(Event::Throttled { epoch, pause, until });
            self.dims.throttle(self.config.adapt, until, now, &mut self.events);
            self.rules.throttled(until, now);
        }
        outcome
    }

    /// Undoes an abort ([`Desk::abort`]), or the account's quota reported spent, once the
    /// cause is fixed (a key replaced, credit added, a limit raised): reservations are
    /// accepted again. Waiters refused meanwhile stay refused; a dimension's longer quota
    /// stays spent until it resets.
    pub fn resume(&mut self, now: Instant) {
        let now = self.clock.advance(now);
        self.aborted = false;
        self.rules.spent.resume(now);
        self.drive(now);
    }

    /// Makes `change` to `dimension` at `now`. Returns the permits a [`Change::Fund`] took
    /// or a [`Change::Withdraw`] took back (zero for the other changes); an error, with
    /// nothing changed, for a dimension the arbiter lacks or a value no bucket takes.
    pub fn change(
        &mut self,
        dimension: usize,
        change: Change,
        now: Instant,
    ) -> Result<u64, InvalidLimit> {
        let now = self.clock.advance(now);
        let in_flight = self.tickets.granted_cost(dimension, |_| true);
        let (effect, taken) = match change {
            Change::Budget(budget) => {
                self.rules.budgets.set(&mut self.dims, dimension, budget, now)?;
                // What is granted and not yet ended may still be refunded: the books count it.
                if !self.books.is_open() {
                    self.books.open(self.tickets.granted_costs());
                }
                (Effect::Refuse(budget.amount), 0)
            }
            Change::Ramp(ramp) => {
                self.dims.get(dimension)?;
                self.rules.ramps.set(dimension, ramp);
                (Effect::None, 0)
            }
            change => self.dims.change(dimension, change, in_flight, now)?,
        };
        self.effect(dimension, effect, now);
        self.drive(now);
        Ok(taken)
    }

    /// Sets `tenant`'s weight in the fair share of a saturated pool: busy tenants are
    /// granted dominant demand in proportion to their weights. Every tenant weighs 1 until
    /// set; `weight` must be within `1..=`[`MAX_WEIGHT`]. Takes effect for reservations
    /// that queue from now on.
    pub fn set_weight(&mut self, tenant: Tenant, weight: u32) -> Result<(), InvalidLimit> {
        self.queue.fair.set_weight(tenant, weight)
    }

    /// Caps `tenant` at `share` of every limit (in (0, 1]: at most `share` of each
    /// dimension's capacity at once and of its rate over time, whatever is free), or lifts
    /// its cap (`None`). A reservation the cap cannot take waits apart, never in front of
    /// another tenant's; one costing more than the cap holds is refused
    /// ([`ReserveError::CostExceedsCap`]). The cap follows the pool's rates and
    /// capacities; the express lane leases nothing while any cap is set.
    pub fn set_cap(
        &mut self,
        tenant: Tenant,
        share: Option<f64>,
        now: Instant,
    ) -> Result<(), InvalidLimit> {
        let now = self.clock.advance(now);
        for ticket in self.rules.caps.set(tenant, share, &self.dims, now)? {
            // What waited under a lifted cap queues as any reservation does.
            self.enter_queue(ticket);
        }
        self.drive(now);
        Ok(())
    }

    /// `tenant`'s weight and cap, what it has queued per class (and parked under its cap),
    /// and what the queue granted it.
    pub fn tenant(&self, tenant: Tenant) -> TenantSnapshot {
        let caps = &self.rules.caps;
        let (cap, parked) = (caps.share_of(tenant), caps.parked_of(tenant));
        TenantSnapshot { cap, parked, ..self.queue.fair.snapshot(tenant) }
    }

    /// The state of every dimension, the gate and every tenant at `now`. A query.
    pub fn snapshot(&self, now: Instant) -> ArbiterSnapshot {
        let now = self.clock.at_least(now);
        let mut tenants: Vec<Tenant> =
            self.queue.fair.tenants().chain(self.rules.caps.tenants()).collect();
        tenants.sort_unstable();
        tenants.dedup();
        ArbiterSnapshot {
            dimensions: (0..self.dims.len()).filter_map(|d| self.dimension(d, now)).collect(),
            queued: self.queue.live(),
            paused_until: self.gate.reopens_at(now),
            epoch: self.gate.epoch(),
            aborted: self.aborted,
            tenants: tenants.into_iter().map(|t| self.tenant(t)).collect(),
        }
    }

    /// The state of `dimension` at `now` (its part of [`Arbiter::snapshot`]); `None` if
    /// there is no such dimension. A query.
    pub fn dimension(&self, dimension: usize, now: Instant) -> Option<DimensionSnapshot> {
        let now = self.clock.at_least(now);
        let dim = self.dims.get(dimension).ok()?;
        let queued = u64::try_from(self.queue.cost_in(dimension)).unwrap_or(u64::MAX);
        let head = self.queue.first(&self.tickets).map_or(0, |head| {
            let cost = self.tickets.cost_in(head, dimension);
            self.dims.booked(dimension, cost, self.config.reserve_usage)
        });
        let renews_at = self.rules.budgets.renews_at(dimension, now);
        Some(DimensionSnapshot::of(dim, now, (queued, head), renews_at))
    }

    /// The arbiter's second desk: the express lane's lease, and what a runtime adapter
    /// asks beside the sans-IO loop (see [`Desk`]).
    pub fn desk(&mut self) -> Desk<'_> {
        Desk::new(self)
    }

    /// The grant pass, asking each part in one order:
    ///
    /// 1. time: budgets renew, caps let in what they now have room for, ramps that reached
    ///    their dimension's rate end, rates climb back after a throttle;
    /// 2. holds: an abort, an input being taken in, a closed gate or the account's quota
    ///    spent grant nothing;
    /// 3. the head, while it may go: the rules in [`Rules`]' order, then the dimensions;
    ///    while it waits, the queued reservations budgets can no longer cover are refused,
    ///    and the head asked again;
    /// 4. backfilling, if configured: a later waiter that fits now without delaying it;
    /// 5. stale queue entries compacted.
    #[inline]
    fn drive(&mut self, now: Instant) {
        if !self.rules.idle() {
            self.rules.budgets.renew(&mut self.dims, now);
            for ticket in self.rules.caps.release(&self.dims, &self.tickets, now) {
                // Pending under its cap already.
                self.queue.enter(ticket, &mut self.tickets, &self.dims, self.config.aging);
            }
            self.rules.ramps.settle(&mut self.dims, now);
        }
        self.dims.recover(self.config.adapt.is_some(), now, &mut self.events);
        let held = self.aborted || self.replying || !self.gate.is_open(now);
        if self.queue.is_empty() || held || self.rules.spent.holds(now) {
            return;
        }
        while let Some(head) = self.queue.head(&self.tickets) {
            if !self.may_go(head, now) {
                let unaffordable = |this: &Arbiter, t| {
                    let (dimension, renews_in) =
                        this.rules.budgets.short(this.tickets.cost(t), &ctx!(this), now)?;
                    Some(Refusal::BudgetSpent { dimension, renews_in })
                };
                if !self.rules.budgets.idle() && self.refuse_where(false, unaffordable) {
                    continue;
                }
                break;
            }
            self.queue.pop_front();
            self.grant(head, now);
        }
        if self.config.backfill && self.queue.live() > 1 {
            self.backfill(now);
        }
        self.queue.compact(&self.tickets);
    }

    /// Whether queued `ticket` may be granted now: every rule allows it, and its cost, as
    /// booked, fits every dimension.
    #[inline]
    fn may_go(&mut self, ticket: Ticket, now: Instant) -> bool {
        if !self.rules.idle() {
            let ask = Ask::of(&self.tickets, ticket);
            if self.rules.ready(&ask, &ctx!(self), now).is_none_or(|at| at > now) {
                return false;
            }
        }
        let cost = Cost::Ticket(&self.tickets, ticket, self.config.reserve_usage);
        self.dims.fits(cost, now, self.rules.probe.active(now))
    }

    /// Grants `cost` on arrival if it fits now: a plain pool's buckets are refilled,
    /// checked and taken from once; otherwise it is checked, then taken, as booked.
    #[inline]
    fn grant_on_arrival(&mut self, cost: &[u64], caller: Caller, now: Instant) -> Option<Ticket> {
        let plain = !self.dims.guarded() && !self.dims.charging();
        let booked = Cost::Booked(cost, self.config.reserve_usage);
        let fits = match plain {
            true => self.dims.take_if_fits(cost, now),
            false => self.dims.fits(booked, now, self.rules.probe.active(now)),
        };
        if !fits {
            return None;
        }
        let ticket = self.tickets.allocate(cost, SlotState::Granted, caller, now);
        if !plain {
            self.dims.take_booked(&mut self.tickets, ticket, self.config.reserve_usage, now);
        }
        self.enter_grant(ticket, now);
        Some(ticket)
    }

    /// Enters the grant of `ticket`, its cost taken: its tenant's cap, its epoch and
    /// instant, the books, and the rules that follow grants.
    #[inline]
    fn enter_grant(&mut self, ticket: Ticket, now: Instant) {
        let queued = self.tickets.slot(ticket).state == SlotState::Queued;
        let slot = self.tickets.slot_mut(ticket);
        (slot.granted_in, slot.granted_at) = (self.gate.epoch(), now);
        self.books.grant(self.tickets.cost(ticket));
        self.rules.granted(&Ask::of(&self.tickets, ticket), queued, now);
    }

    /// Grants `ticket`, the head of the queue (or one backfilled), at the cost it queued
    /// with raised to what the provider books.
    #[inline]
    fn grant(&mut self, ticket: Ticket, now: Instant) {
        let demand = self.dims.demand(self.tickets.cost(ticket));
        self.queue.leave(ticket, &self.tickets, Some(demand));
        self.dims.take_booked(&mut self.tickets, ticket, self.config.reserve_usage, now);
        self.enter_grant(ticket, now);
        self.tickets.set_state(ticket, SlotState::Granted);
        let waited = now.saturating_duration_since(self.tickets.slot(ticket).since);
        self.events.push_back(Event::Granted { ticket, waited });
    }

    /// Queues `ticket` in its fair order, its cost pending under its tenant's cap.
    fn enter_queue(&mut self, ticket: Ticket) {
        self.queue.enter(ticket, &mut self.tickets, &self.dims, self.config.aging);
        self.rules.queued(&Ask::of(&self.tickets, ticket), true);
    }

    /// Takes queued or parked `ticket` out, ungranted, and frees it.
    fn take_out(&mut self, ticket: Ticket) {
        if !self.rules.caps.unpark(ticket, &self.tickets) {
            self.rules.queued(&Ask::of(&self.tickets, ticket), false);
            self.queue.leave(ticket, &self.tickets, None);
        }
        self.tickets.free(ticket);
    }

    /// Ends granted `ticket`, `how`, having used `used`, telling `event`: the rules that
    /// follow ends (a cap, the first alone, concurrency) hear of it, and its slot is freed.
    fn end(
        &mut self,
        ticket: Ticket,
        (how, used): (Ended, Option<&[u64]>),
        event: Event,
        now: Instant,
    ) {
        let in_flight = self.tickets.granted_count().saturating_sub(1);
        self.rules.ended(&Ask::of(&self.tickets, ticket), how, used, in_flight, now);
        self.tickets.free(ticket);
        self.events.push_back(event);
    }

    /// [`Arbiter::release`], `how`; `maybe_counted`: whether a request that left may have
    /// been counted by the provider (not when it refused a probe: that says it did not).
    fn release_as(
        &mut self,
        ticket: Ticket,
        maybe_counted: bool,
        how: Ended,
        now: Instant,
    ) -> Result<(), TicketError> {
        let now = self.clock.advance(now);
        self.tickets.granted(ticket)?;
        self.finish(ticket, None, maybe_counted, (how, Event::Released { ticket }), now);
        Ok(())
    }

    /// Ends granted `ticket` having used `used` (`None`: returned whole, though a request
    /// that left stays charged as reserved in the books and guards, as it may have been
    /// counted, unless `counted` says it was not), then drives.
    fn finish(
        &mut self,
        ticket: Ticket,
        used: Option<&[u64]>,
        counted: bool,
        (how, event): (Ended, Event),
        now: Instant,
    ) {
        let slot = *self.tickets.slot(ticket);
        let (cost, sent) = (self.tickets.cost(ticket), slot.sent != NOT_SENT);
        self.books.settle(cost, sent.then_some(slot.sent));
        let charged = |d: usize, held| used.map_or(if sent { held } else { 0 }, |used| used[d]);
        self.dims.settle_guards(cost, charged, counted, now);
        // What each reply used against the caller's own estimate, where reports are read.
        if let Some(used) = used.filter(|_| self.config.reserve_usage && self.books.is_open()) {
            self.dims.record_usage(used, self.tickets.estimate(ticket));
        }
        let at = (slot.granted_at, slot.granted_in < self.gate.epoch());
        self.dims.refund(self.tickets.cost(ticket), used, at, now);
        self.end(ticket, (how, used), event, now);
        self.drive(now);
    }

    /// Stamps a send at `now`, for `ticket`'s reservation if it pays for it.
    fn stamp(&mut self, ticket: Option<Ticket>, now: Instant) -> SendStamp {
        let granted_at = ticket.map(|t| self.tickets.slot(t).granted_at);
        let seq = self.books.next_send(granted_at, now, self.tickets.granted_costs());
        if let Some(t) = ticket {
            self.tickets.slot_mut(t).sent = seq;
        }
        let live = self.tickets.live() - self.queue.live();
        let held = self.dims.iter().map(|d| d.guard.as_ref().map_or(0, |g| g.window.held_total()));
        // The caller's own estimate: kept apart only if a learned charge raised it.
        let cost = ticket.map(|t| (self.tickets.cost(t), self.tickets.estimate(t)));
        self.books.record_send(seq, now, cost, held, live);
        SendStamp { epoch: self.gate.epoch(), seq, counted_by: Instant::NEVER }
    }

    /// The soonest the queue's `head` could be granted, assuming nothing else happens
    /// (`None`: only a reply or an end lets it).
    fn head_ready(&self, head: Ticket, now: Instant) -> Option<Instant> {
        let rules = match self.rules.idle() {
            true => now,
            false => self.rules.ready(&Ask::of(&self.tickets, head), &ctx!(self), now)?,
        };
        let cost = Cost::Ticket(&self.tickets, head, self.config.reserve_usage);
        let (probe, budgets) = (self.rules.probe.from(), &self.rules.budgets);
        Some(rules.max(self.dims.ready_at(cost, now, probe, |d| budgets.renewal_at(d))))
    }

    /// Applies the learning policy's `plan` for `dimension`, in order, for the report on
    /// the reply to `sent`; no grant is made until the last is in, then one grant pass.
    /// The last adjustment's effect, or the first refusal.
    pub(crate) fn apply(
        &mut self,
        dimension: usize,
        sent: SendStamp,
        plan: &[Adjust],
        clears: Option<Instant>,
        now: Instant,
    ) -> Result<Effect, InvalidLimit> {
        let now = self.clock.advance(now);
        let outer = std::mem::replace(&mut self.replying, true);
        let mut applied = Ok(Effect::None);
        for adjust in plan {
            if let Adjust::Sync { .. } = adjust {
                self.books.note_counted(sent, now);
            }
            let (books, tickets, next_seq) = (&self.books, &self.tickets, self.books.next_seq());
            let ledger = (sent, Ledger { books, tickets, next_seq });
            match self.dims.adjust(dimension, adjust, ledger, (clears, now), &mut self.events) {
                Ok(effect) => {
                    self.effect(dimension, effect, now);
                    applied = applied.map(|_| effect);
                }
                Err(e) => applied = applied.and(Err(e)),
            }
        }
        if !self.rules.first.idle() && self.dims.all_reported() {
            // The provider reported: others may go with the first.
            self.rules.first.end();
        }
        self.replying = outer;
        self.drive(now);
        applied
    }

    /// Does what a change to `dimension` asks of the rest of the arbiter.
    fn effect(&mut self, dimension: usize, effect: Effect, now: Instant) {
        let (above, reason) = match effect {
            Effect::None | Effect::Folded(_) => return,
            Effect::Raised(from) => return self.rules.ramps.raised(dimension, from, now),
            Effect::Probe(from) => return self.rules.probe.set(from),
            Effect::Refuse(above) => (above, Refusal::CostExceedsCapacity { dimension }),
            Effect::Spent(until) => match self.rules.spent.spend_dimension(dimension, until, now) {
                Some(reason) => (0, reason),
                None => return,
            },
        };
        self.refuse_where(true, |this, t| {
            (this.tickets.cost_in(t, dimension) > above).then_some(reason)
        });
    }

    /// Refuses each queued reservation (and, `with_parked`, each waiting under a cap)
    /// that `why` gives a reason for; whether any was.
    fn refuse_where(
        &mut self,
        with_parked: bool,
        why: impl Fn(&Arbiter, Ticket) -> Option<Refusal>,
    ) -> bool {
        let waiting = self.queue.iter().filter(|&t| self.tickets.is_queued(t));
        let parked = self.rules.caps.parked().filter(|_| with_parked);
        let refused: Vec<_> =
            waiting.chain(parked).filter_map(|t| Some((t, why(self, t)?))).collect();
        for &(ticket, reason) in &refused {
            self.take_out(ticket);
            self.events.push_back(Event::Refused { ticket, reason });
        }
        !refused.is_empty()
    }

    /// Conservative backfilling: a waiter behind the head goes now only if every rule
    /// allows it, it fits now, and in every dimension the level projected to the head's
    /// grant time stays at or above the head's cost after taking it.
    fn backfill(&mut self, now: Instant) {
        let Some(head) = self.queue.head(&self.tickets) else { return };
        let after = self
            .head_ready(head, now)
            .map_or(Duration::MAX, |at| at.saturating_duration_since(now));
        let (mut i, mut looked, usage) = (1, 0, self.config.reserve_usage);
        while i < self.queue.len() && looked < self.config.backfill_depth {
            let candidate = self.queue.at(i);
            if !self.tickets.is_queued(candidate) {
                i += 1;
                continue;
            }
            looked += 1;
            let (tickets, lift) = (&self.tickets, self.rules.probe.active(now));
            let pair =
                (Cost::Ticket(tickets, candidate, usage), Cost::Ticket(tickets, head, usage));
            if self.dims.leaves_room(pair, after, now, lift) && self.may_go(candidate, now) {
                self.queue.remove(i);
                self.grant(candidate, now);
            } else {
                i += 1;
            }
        }
    }

    /// Whether nothing at `now` needs the arbiter's order, so an express lane may lease.
    fn lane_may_open(&self, now: Instant) -> bool {
        self.lane_may_open_in_time() && self.gate.is_open(now)
    }

    /// [`Arbiter::lane_may_open`] but for the gate's pause, which time ends.
    fn lane_may_open_in_time(&self) -> bool {
        let nothing_waits = self.queue.live() == 0 && !self.replying && !self.aborted;
        nothing_waits && !self.books.is_open() && self.dims.plain() && self.rules.idle()
    }
}
