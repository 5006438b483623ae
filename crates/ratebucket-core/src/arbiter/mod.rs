//! The multi-dimension arbiter: one `impl` over its parts, granting the head of a fair
//! queue atomically across every dimension once every rule allows it. This file holds its
//! inputs, outputs and queries, and the grant pass (`drive`) that asks each part in one
//! order; every part is a type that owns its state: `limits.rs` (the gate, the dimensions
//! and the rules together), `dims/` (each limit's bucket, guard, learning and charge),
//! `rules/` (spent quotas, budgets, caps, the first request alone, the window-edge probe,
//! concurrency, ramps), `tickets.rs`, `order.rs` and `fair.rs` (the slab, the queue, the
//! fair share), and the inputs, snapshots, settings, errors and [`Desk`] beside them.

use std::collections::VecDeque;
use std::time::Duration;

use crate::books::Books;
use crate::bucket::{InvalidLimit, TokenBucket};
use crate::event::{Event, Refusal};
use crate::gate::ThrottleOutcome;
use crate::learn::{Adjust, LearnedQuota, QuotaReport};
use crate::time::{Instant, Monotonic};

mod change;
mod config;
mod desk;
mod dims;
mod error;
mod fair;
mod inspect;
mod limits;
mod order;
mod reply;
mod rules;
mod tickets;

pub use crate::ids::{SendStamp, Ticket};
pub use change::Change;
pub use config::{Adapt, ArbiterConfig};
pub use desk::{Desk, Lease, MAX_LANE_DIMENSIONS};
pub(crate) use dims::Effect;
#[cfg(test)]
pub(crate) use dims::FoldOutcome;
pub use dims::MAX_CHARGE_FACTOR;
pub use error::{ReserveError, TicketError, TicketState};
pub use fair::{Caller, MAX_WEIGHT, Priority, Tenant, TenantSnapshot, UnknownPriority};
pub use inspect::{ArbiterSnapshot, DimensionSnapshot, Reported, Status};
use limits::{Limits, Used};
use order::Queue;
pub use reply::{Replied, Reply, Report, Settle};
use rules::{Admission, Ask, Ended, Rule, earliest};
pub use rules::{Budget, Period, Ramp};
use tickets::{NOT_SENT, SlotState, Tickets};

/// The multi-resource arbiter: one token bucket per dimension, a fair queue of waiters,
/// the rules a reservation passes, and the pool's [`Gate`](crate::Gate). It grants the
/// head of the queue across **every** dimension at once or not at all, so two limits
/// cannot deadlock; a cost above a dimension's capacity is refused at once.
///
/// Sans-IO: every call takes `now` (one earlier than seen counts as the latest seen);
/// feed inputs, drain [`Arbiter::poll_event`] (wake the waiter of each `Granted` or
/// `Refused` ticket), and call [`Arbiter::handle_timeout`] at [`Arbiter::poll_timeout`].
#[derive(Clone, Debug)]
pub struct Arbiter {
    config: ArbiterConfig,
    clock: Monotonic,
    /// The gate, the dimensions and the rules.
    limits: Limits,
    /// Every reservation not yet ended, with its cost.
    tickets: Tickets,
    /// The waiting reservations, in their fair order.
    queue: Queue,
    /// Grants, settlements and sends, to read a provider's reports against.
    books: Books,
    events: VecDeque<Event>,
    /// While one input's steps are taken in: no grant until it ends.
    replying: bool,
    /// While a throttled reply's reports are folded (the learning policy reads them so).
    throttled_reply: bool,
    /// The learning policy's adjustments for a report (kept to reuse).
    adjustments: Vec<Adjust>,
}

impl Arbiter {
    /// An arbiter over `buckets` (one per dimension, in the order costs will name them).
    pub fn new(
        buckets: Vec<TokenBucket>,
        config: ArbiterConfig,
        now: Instant,
    ) -> Result<Arbiter, InvalidLimit> {
        let limits = Limits::new(buckets, &config)?;
        let count = limits.dims.len();
        Ok(Arbiter {
            config,
            clock: Monotonic::new(now),
            limits,
            tickets: Tickets::new(count),
            queue: Queue::new(count),
            books: Books::new(count),
            events: VecDeque::new(),
            replying: false,
            throttled_reply: false,
            adjustments: Vec::new(),
        })
    }

    /// Where the arbiter stands as a whole: cheap enough to ask on every call.
    pub fn status(&self) -> Status {
        Status::of(self)
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
        let (now, limits) = (self.clock.at_least(Instant::ZERO), &self.limits);
        // A quota spent until an instant holds grants as a closed gate does.
        let gate = match (limits.gate.reopens_at(now), limits.rules.spent.pool_until()) {
            (_, Some(None)) => return None,
            (gate, Some(Some(until))) => Some(gate.map_or(until, |g| g.max(until))),
            (gate, None) => gate,
        };
        // A reservation waiting under its tenant's cap enters the queue when it has room.
        let parked = limits.rules.caps.ready_at(&self.tickets, now);
        let books = (&self.books, &self.tickets);
        let head = self.queue.first(&self.tickets).and_then(|head| limits.ready(head, books, now));
        earliest(head.map(|ready| gate.map_or(ready, |g| g.max(ready))).or(gate), parked)
    }

    /// The next event, if any. Drain after every input.
    #[inline]
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Queues a reservation of `cost` (one entry per dimension), granted at once if it is
    /// at the head and fits: watch for its [`Event::Granted`], or ask its state.
    #[inline]
    pub fn reserve(&mut self, cost: &[u64], now: Instant) -> Result<Ticket, ReserveError> {
        self.reserve_for(Caller::default(), cost, None, now)
    }

    /// Like [`Arbiter::reserve`], but refused with [`ReserveError::WouldWait`] (and an
    /// [`Event::Rejected`]) when the estimated wait, erring long, exceeds `max_wait`.
    pub fn reserve_within(
        &mut self,
        cost: &[u64],
        max_wait: Option<Duration>,
        now: Instant,
    ) -> Result<Ticket, ReserveError> {
        self.reserve_for(Caller::default(), cost, max_wait, now)
    }

    /// Like [`Arbiter::reserve_within`], for `caller`: a tenant, whose share of a busy pool
    /// follows its weight, and a priority class, ahead of lower classes until they age.
    pub fn reserve_for(
        &mut self,
        caller: Caller,
        cost: &[u64],
        max_wait: Option<Duration>,
        now: Instant,
    ) -> Result<Ticket, ReserveError> {
        let now = self.clock.advance(now);
        let ask = Ask { cost, estimate: cost, caller, max_wait };
        let admission = self.limits.admit(&ask, (&self.books, &self.tickets), now)?;
        let parked = admission == Admission::Park;
        if let Some(max_wait) = max_wait {
            let (queue, books) = (&self.queue, (&self.books, &self.tickets));
            let would_wait = self.limits.wait(&ask, parked, |d| queue.cost_in(d), books, now);
            if would_wait > max_wait {
                self.events.push_back(Event::Rejected { would_wait, max_wait });
                return Err(ReserveError::WouldWait { retry_after: would_wait });
            }
        }
        let nobody_waits =
            self.queue.live() == 0 && !self.replying && self.limits.gate.is_open(now);
        if nobody_waits
            && admission == Admission::Admit
            && let Some(taken) = self.limits.fits_on_arrival(cost, now)
        {
            let ticket = self.tickets.allocate(cost, SlotState::Granted, caller, now);
            self.limits.grant(ticket, taken, (&mut self.books, &mut self.tickets), now);
            self.events.push_back(Event::Granted { ticket, waited: Duration::ZERO });
            return Ok(ticket);
        }
        let state = if parked { SlotState::Parked } else { SlotState::Queued };
        let ticket = self.tickets.allocate(cost, state, caller, now);
        if parked {
            self.limits.rules.caps.park(ticket, &self.tickets);
            return Ok(ticket);
        }
        self.enter_queue(ticket);
        self.drive(now);
        Ok(ticket)
    }

    /// Withdraws `ticket`, as dropping it does: a waiter leaves; a grant never sent is
    /// released whole; one sent is abandoned and **stays charged as reserved**, as the
    /// provider has probably counted it (ADR 0012). Whether there was anything to withdraw.
    pub fn cancel(&mut self, ticket: Ticket, now: Instant) -> bool {
        let now = self.clock.advance(now);
        let Some(slot) = self.tickets.get(ticket).copied() else {
            return false;
        };
        match slot.state {
            SlotState::Queued | SlotState::Parked => {
                self.take_out(ticket);
                self.events.push_back(Event::Cancelled { ticket });
                self.drive(now);
            }
            SlotState::Granted if slot.sent != NOT_SENT => {
                let abandoned = (Used::Held, true, Ended::Returned);
                self.finish(ticket, abandoned, Event::Abandoned { ticket }, now);
            }
            SlotState::Granted => return self.release(ticket, now).is_ok(),
            SlotState::Free => return false,
        }
        true
    }

    /// Reconciles a granted reservation against its `actual` cost: an over-estimate is
    /// refunded, an under-estimate charged as debt, a charge beyond [`MAX_CHARGE_FACTOR`]
    /// times the reservation (or the capacity) distrusted ([`Event::Distrusted`]).
    #[inline]
    pub fn commit(
        &mut self,
        ticket: Ticket,
        actual: &[u64],
        now: Instant,
    ) -> Result<(), TicketError> {
        let now = self.clock.advance(now);
        self.tickets.granted(ticket)?;
        let held = self.tickets.cost(ticket);
        if let Some(bounded) = self.limits.dims.distrust(ticket, held, actual, &mut self.events)? {
            return self.commit(ticket, &bounded, now);
        }
        let answered = (Used::Reported(actual), true, Ended::Answered);
        self.finish(ticket, answered, Event::Committed { ticket }, now);
        Ok(())
    }

    /// Returns a granted reservation whole: its request was never sent, or the provider
    /// did not count it (a 429, a 5xx, a 4xx); [`Arbiter::cancel`] keeps an unknown one.
    #[inline]
    pub fn release(&mut self, ticket: Ticket, now: Instant) -> Result<(), TicketError> {
        self.release_as(ticket, true, Ended::Returned, now)
    }

    /// Stamps a request sent at `now` without a reservation, to order its reply's reports.
    pub fn stamp_send(&mut self, now: Instant) -> SendStamp {
        let now = self.clock.advance(now);
        self.stamp(None, now)
    }

    /// Stamps the request `ticket` pays for, sent at `now`, only while the gate is open
    /// (else the instant it reopens): in one step, so no throttle slips in between.
    pub fn stamp_send_if_open(
        &mut self,
        ticket: Ticket,
        now: Instant,
    ) -> Result<SendStamp, Instant> {
        let now = self.clock.advance(now);
        if let Some(reopens) = self.limits.gate.reopens_at(now) {
            return Err(reopens);
        }
        let granted = self.tickets.granted(ticket).is_ok();
        Ok(self.stamp(granted.then_some(ticket), now))
    }

    /// Takes a provider's answer to `ticket`'s request as one input: the throttle, abort or
    /// spent quota it calls for, the reservation's end, every quota report, then one grant
    /// pass; nobody is granted between the steps.
    pub fn reply(&mut self, ticket: Ticket, reply: &Reply<'_>, now: Instant) -> Replied {
        let now = self.clock.advance(now);
        self.replying = true;
        // Before the reservation ends: a later report reads this one as counted first only
        // once it knows by when it was.
        self.books.note_counted(reply.sent, now);
        let refused = matches!(reply.settle, Settle::Throttled { .. });
        // A probe of a supposed window edge went alone: its refusal refutes the edge (the
        // learning policy reads it below), not a wave the pool must wait out.
        let probe = &self.limits.rules.probe;
        let probed = refused && probe.probed(self.books.sent_at(reply.sent.seq));
        let throttle = match reply.settle {
            Settle::Throttled { retry_after } if !probed => {
                Some(self.throttle(reply.sent, retry_after, now))
            }
            _ => None,
        };
        if let Settle::Fatal = reply.settle {
            self.desk().abort(now);
        }
        if let Settle::Spent { resets_in, dimension } = reply.settle {
            let reason = self.limits.rules.spent.spend_pool(resets_in, dimension, now);
            self.refuse(true, |_, _| Some(reason));
        }
        let settled = match reply.settle {
            Settle::Charge(actual) => self.commit(ticket, actual, now),
            Settle::Keep => self.tickets.granted(ticket).map(|_| _ = self.cancel(ticket, now)),
            Settle::Crowded { .. } => self.release_as(ticket, true, Ended::Crowded, now),
            // A probe the provider refused was not counted.
            _ => self.release_as(ticket, !probed, Ended::Returned, now),
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
    /// `sent`, through its learning policy (without one, the level only lowers).
    pub fn observe_quota(
        &mut self,
        dimension: usize,
        sent: SendStamp,
        report: QuotaReport,
        now: Instant,
    ) -> Result<Option<LearnedQuota>, InvalidLimit> {
        let now = self.clock.advance(now);
        let mut plan = std::mem::take(&mut self.adjustments);
        let read = (&self.books, self.throttled_reply);
        let clears = self.limits.fold(dimension, (sent, report), read, &mut plan, now)?;
        let applied = self.apply(dimension, sent, &plan, clears, now);
        self.adjustments = plan;
        let dim = self.limits.dims.get_mut(dimension)?;
        dim.provider.charge.imprecise = false;
        applied.map(|_| dim.learned())
    }

    /// Reports a throttle of the request sent with `sent`: the gate closes once per epoch,
    /// every level drops to zero and every grant so far is written off (refunding nothing:
    /// only what refills from then on is granted again); rates adapt and ramps rise again
    /// from the pause's end.
    pub fn throttle(
        &mut self,
        sent: SendStamp,
        retry_after: Option<Duration>,
        now: Instant,
    ) -> ThrottleOutcome {
        let now = self.clock.advance(now);
        self.limits.throttle(sent, retry_after, now, &mut self.events)
    }

    /// Undoes an abort ([`Desk::abort`]) or the account's quota spent, once fixed.
    pub fn resume(&mut self, now: Instant) {
        let now = self.clock.advance(now);
        self.limits.resume(now);
        self.drive(now);
    }

    /// Makes `change` to `dimension`: the permits funds took or a withdrawal took back.
    pub fn change(
        &mut self,
        dimension: usize,
        change: Change,
        now: Instant,
    ) -> Result<u64, InvalidLimit> {
        let now = self.clock.advance(now);
        let books = (&mut self.books, &self.tickets);
        let (effect, taken) = self.limits.change(dimension, change, books, now)?;
        if let Some((above, reason)) = self.limits.effect(dimension, effect, now) {
            self.refuse_costlier(dimension, above, reason);
        }
        self.drive(now);
        Ok(taken)
    }

    /// Sets `tenant`'s weight (`1..=`[`MAX_WEIGHT`], 1 until set) in the fair share.
    pub fn set_weight(&mut self, tenant: Tenant, weight: u32) -> Result<(), InvalidLimit> {
        self.queue.fair.set_weight(tenant, weight)
    }

    /// Caps `tenant` at `share`, in (0, 1], of every limit's capacity and rate (`None`:
    /// lifts it). What the cap cannot take waits apart, in front of nobody's.
    pub fn set_cap(
        &mut self,
        tenant: Tenant,
        share: Option<f64>,
        now: Instant,
    ) -> Result<(), InvalidLimit> {
        let now = self.clock.advance(now);
        let limits = &mut self.limits;
        for ticket in limits.rules.caps.set(tenant, share, &limits.dims, now)? {
            // What waited under a lifted cap queues as any reservation does.
            self.enter_queue(ticket);
        }
        self.drive(now);
        Ok(())
    }

    /// `tenant`'s weight, cap, waiting and granted reservations.
    pub fn tenant(&self, tenant: Tenant) -> TenantSnapshot {
        let caps = &self.limits.rules.caps;
        let (cap, parked) = (caps.share_of(tenant), caps.parked_of(tenant));
        TenantSnapshot { cap, parked, ..self.queue.fair.snapshot(tenant) }
    }

    /// The state of every dimension, the gate and every tenant at `now`. A query.
    pub fn snapshot(&self, now: Instant) -> ArbiterSnapshot {
        ArbiterSnapshot::of(self, self.clock.at_least(now))
    }

    /// The state of `dimension` at `now`, if there is one. A query.
    pub fn dimension(&self, dimension: usize, now: Instant) -> Option<DimensionSnapshot> {
        DimensionSnapshot::of(self, dimension, self.clock.at_least(now))
    }

    /// The second desk: the express lane, and what a runtime asks beside the loop.
    pub fn desk(&mut self) -> Desk<'_> {
        Desk::new(self)
    }

    /// The grant pass, asking each part in one order:
    ///
    /// 1. time: budgets renew, caps let in what they now have room for, ramps that reached
    ///    their dimension's rate end, rates climb back after a throttle;
    /// 2. holds: an abort, an input being taken in, a closed gate or the account's quota
    ///    spent grant nothing;
    /// 3. the head, while it may go: the rules in their order (a spent dimension, the
    ///    first request alone, a probe, concurrency, a ramp), then the dimensions; while it
    ///    waits, the queued reservations budgets can no longer cover are refused, and the
    ///    head asked again;
    /// 4. backfilling, if configured: a later waiter that fits now without delaying it;
    /// 5. stale queue entries compacted.
    #[inline]
    fn drive(&mut self, now: Instant) {
        for ticket in self.limits.tick(&self.tickets, now, &mut self.events) {
            let (dims, aging) = (&self.limits.dims, self.config.aging);
            self.queue.enter(ticket, &mut self.tickets, dims, aging);
        }
        if self.queue.is_empty() || self.replying || self.limits.holds(now) {
            return;
        }
        while let Some(head) = self.queue.head(&self.tickets) {
            if !self.limits.may_go(head, (&self.books, &self.tickets), now) {
                let budgets = |this: &Arbiter, t| this.limits.unaffordable(t, this.read(), now);
                if !self.limits.rules.budgets.idle() && self.refuse(false, budgets) {
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

    /// The books and the tickets, which the limits read.
    fn read(&self) -> (&Books, &Tickets) {
        (&self.books, &self.tickets)
    }

    /// Grants `ticket`, the head of the queue (or one backfilled).
    #[inline]
    fn grant(&mut self, ticket: Ticket, now: Instant) {
        let demand = self.limits.dims.demand(self.tickets.cost(ticket));
        // Read before the grant stamps its time.
        let waited = now.saturating_duration_since(self.tickets.slot(ticket).at);
        self.queue.leave(ticket, &self.tickets, Some(demand));
        self.limits.grant(ticket, false, (&mut self.books, &mut self.tickets), now);
        self.tickets.set_state(ticket, SlotState::Granted);
        self.events.push_back(Event::Granted { ticket, waited });
    }

    /// Queues `ticket` in its fair order, its cost pending under its tenant's cap.
    fn enter_queue(&mut self, ticket: Ticket) {
        let (dims, aging) = (&self.limits.dims, self.config.aging);
        self.queue.enter(ticket, &mut self.tickets, dims, aging);
        self.limits.rules.queued(&Ask::of(&self.tickets, ticket), true);
    }

    /// Takes queued or parked `ticket` out, ungranted, and frees it.
    fn take_out(&mut self, ticket: Ticket) {
        if !self.limits.rules.caps.unpark(ticket, &self.tickets) {
            self.limits.rules.queued(&Ask::of(&self.tickets, ticket), false);
            self.queue.leave(ticket, &self.tickets, None);
        }
        self.tickets.free(ticket);
    }

    /// [`Arbiter::release`], `how`; `counted`: whether a request that left may have been
    /// counted by the provider (not when it refused a probe: that says it did not).
    fn release_as(
        &mut self,
        ticket: Ticket,
        counted: bool,
        how: Ended,
        now: Instant,
    ) -> Result<(), TicketError> {
        let now = self.clock.advance(now);
        self.tickets.granted(ticket)?;
        self.finish(ticket, (Used::Nothing, counted, how), Event::Released { ticket }, now);
        Ok(())
    }

    /// Ends granted `ticket` as `end` says ([`Limits::end`]), telling `event`, then drives.
    fn finish(&mut self, ticket: Ticket, end: (Used<'_>, bool, Ended), event: Event, now: Instant) {
        self.limits.end(ticket, end, (&mut self.books, &self.tickets), now);
        self.tickets.free(ticket);
        self.events.push_back(event);
        self.drive(now);
    }

    /// Stamps a send at `now`, for `ticket`'s reservation if it pays for it.
    fn stamp(&mut self, ticket: Option<Ticket>, now: Instant) -> SendStamp {
        let live = self.tickets.live() - self.queue.live();
        self.limits.stamp(ticket, (&mut self.books, &mut self.tickets), live, now)
    }

    /// Applies the learning policy's `plan` for `dimension`, in order, for the report on
    /// the reply to `sent` ([`Limits::learn`]); no grant is made until the last is in,
    /// then one grant pass. The last adjustment's effect, or the first refusal.
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
        let (what, books) = ((dimension, sent, plan), (&mut self.books, &self.tickets));
        let (refusals, applied) = self.limits.learn(what, books, (clears, now), &mut self.events);
        for (above, reason) in refusals {
            self.refuse_costlier(dimension, above, reason);
        }
        self.replying = outer;
        self.drive(now);
        applied
    }

    /// Refuses the queued reservations costing `dimension` more than `above`.
    fn refuse_costlier(&mut self, dimension: usize, above: u64, reason: Refusal) {
        let costly = move |this: &Arbiter, t| this.tickets.cost_in(t, dimension) > above;
        self.refuse(true, |this, t| costly(this, t).then_some(reason));
    }

    /// Refuses each queued reservation (and, if `parked`, each waiting under a cap)
    /// that `why` gives a reason for; whether any was.
    fn refuse(&mut self, parked: bool, why: impl Fn(&Self, Ticket) -> Option<Refusal>) -> bool {
        let waiting = self.queue.iter().filter(|&t| self.tickets.is_queued(t));
        let parked = self.limits.rules.caps.parked().filter(|_| parked);
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
        let head_at = self.limits.ready(head, (&self.books, &self.tickets), now);
        let after = head_at.map_or(Duration::MAX, |at| at.saturating_duration_since(now));
        for candidate in self.queue.behind_head(&self.tickets, self.config.backfill_depth) {
            let room = self.limits.leaves_room((candidate, head), &self.tickets, after, now);
            if room && self.limits.may_go(candidate, (&self.books, &self.tickets), now) {
                self.grant(candidate, now);
            }
        }
    }

    /// Whether nothing but the gate's pause (which time ends) needs the arbiter's order,
    /// so an express lane may lease.
    fn lane_may_open_in_time(&self) -> bool {
        let nothing_waits = self.queue.live() == 0 && !self.replying;
        nothing_waits && !self.books.is_open() && self.limits.plain()
    }
}
