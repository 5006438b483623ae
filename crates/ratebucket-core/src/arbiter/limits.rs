//! Everything a reservation must pass to be granted, together ([`Limits`]): the pool's
//! gate, every dimension and every rule. It answers for them all whether a reservation
//! may go and when, and does what a grant, an end, a throttle and a change do to them.

use std::collections::VecDeque;
use std::time::Duration;

use super::change::Change;
use super::config::{Adapt, ArbiterConfig};
use super::dims::{Cost, Dims, Effect};
use super::error::ReserveError;
use super::rules::{Admission, Ask, Ctx, Ended, Rules};
use super::tickets::{NOT_SENT, SlotState, Tickets};
use crate::books::Books;
use crate::bucket::{InvalidLimit, TokenBucket};
use crate::event::{Event, Refusal};
use crate::gate::{Gate, ThrottleOutcome};
use crate::ids::{SendStamp, Ticket};
use crate::learn::{Adjust, QuotaReport};
use crate::time::Instant;

/// What a reservation that ended used, as its end is settled.
#[derive(Clone, Copy, Debug)]
pub(super) enum Used<'a> {
    /// What the provider reported it used (a commit).
    Reported(&'a [u64]),
    /// All it held: its outcome is unknown, and it stays charged.
    Held,
    /// Nothing: it is returned whole (a request that left stays charged in the books
    /// and guards, as it may have been counted, unless it is known not to have been).
    Nothing,
}

/// The gate, the dimensions and the rules, and the settings that say how they answer.
#[derive(Clone, Debug)]
pub(super) struct Limits {
    /// The pool's pause after a throttle.
    pub(super) gate: Gate,
    /// One per limit, in the order costs name them.
    pub(super) dims: Dims,
    /// What a reservation passes beside the dimensions, asked in order.
    pub(super) rules: Rules,
    /// Whether reservations reserve what replies use ([`ArbiterConfig::reserve_usage`]).
    usage: bool,
    /// How rates adapt to throttles ([`ArbiterConfig::adapt`]).
    adapt: Option<Adapt>,
    /// Whether the run was aborted ([`Desk::abort`](crate::Desk::abort)): nothing is
    /// granted until `Arbiter::resume`.
    pub(super) aborted: bool,
}

impl Limits {
    /// One dimension per bucket, under `config`; at least one bucket.
    pub(super) fn new(
        buckets: Vec<TokenBucket>,
        config: &ArbiterConfig,
    ) -> Result<Limits, InvalidLimit> {
        let count = buckets.len();
        if count == 0 {
            return Err(InvalidLimit::ZeroCapacity);
        }
        Ok(Limits {
            gate: Gate::new(config.gate),
            dims: Dims::new(buckets),
            rules: Rules::new(count, config.first_alone, config.max_in_flight),
            usage: config.reserve_usage,
            adapt: config.adapt,
            aborted: false,
        })
    }

    /// A reservation arriving at `now`: refused (never, or not yet), or whether it may go
    /// now, must queue, or wait apart. Budgets are renewed first.
    pub(super) fn admit(
        &mut self,
        ask: &Ask<'_>,
        (books, tickets): (&Books, &Tickets),
        now: Instant,
    ) -> Result<Admission, ReserveError> {
        if self.aborted {
            return Err(ReserveError::Aborted);
        }
        self.dims.validate(ask.cost)?;
        if self.rules.idle() {
            return Ok(Admission::Admit);
        }
        self.rules.budgets.renew(&mut self.dims, now);
        match self.rules.admit(ask, &Ctx { dims: &self.dims, books, tickets }, now) {
            Admission::Refuse(error) => Err(error),
            admission => Ok(admission),
        }
    }

    /// How long `ask` would wait behind what is queued (`queued`, per dimension), counting
    /// the pause under way and, where it waits apart (`parked`), its rule's wait: the queue
    /// granted in order and nothing refunded meanwhile, erring long.
    pub(super) fn wait(
        &mut self,
        ask: &Ask<'_>,
        parked: bool,
        queued: impl Fn(usize) -> u128,
        (books, tickets): (&Books, &Tickets),
        now: Instant,
    ) -> Duration {
        let wait = self.dims.wait(queued, ask.cost, now).max(self.gate.closed_for(now));
        match parked {
            true => wait.max(self.rules.wait(ask, &Ctx { dims: &self.dims, books, tickets }, now)),
            false => wait,
        }
    }

    /// Whether `cost` fits on arrival: a plain pool's buckets are refilled, checked and
    /// taken from at once (`Some(true)`); otherwise it is checked as booked, to be taken
    /// at its grant (`Some(false)`).
    #[inline]
    pub(super) fn fits_on_arrival(&mut self, cost: &[u64], now: Instant) -> Option<bool> {
        if !self.dims.guarded() && !self.dims.charging() {
            return self.dims.take_if_fits(cost, now).then_some(true);
        }
        let booked = Cost::Booked(cost, self.usage);
        self.dims.fits(booked, now, self.rules.probe.active(now)).then_some(false)
    }

    /// Whether queued `ticket` may be granted now: every rule allows it, and its cost, as
    /// booked, fits every dimension.
    #[inline]
    pub(super) fn may_go(
        &mut self,
        ticket: Ticket,
        (books, tickets): (&Books, &Tickets),
        now: Instant,
    ) -> bool {
        if !self.rules.idle() {
            let ctx = Ctx { dims: &self.dims, books, tickets };
            if self.rules.ready(&Ask::of(tickets, ticket), &ctx, now).is_none_or(|at| at > now) {
                return false;
            }
        }
        let cost = Cost::Ticket(tickets, ticket, self.usage);
        self.dims.fits(cost, now, self.rules.probe.active(now))
    }

    /// The soonest `ticket` could be granted, assuming nothing else happens (`None`: only
    /// a reply or an end lets it).
    pub(super) fn ready(
        &self,
        ticket: Ticket,
        (books, tickets): (&Books, &Tickets),
        now: Instant,
    ) -> Option<Instant> {
        let rules = match self.rules.idle() {
            true => now,
            false => {
                let ctx = Ctx { dims: &self.dims, books, tickets };
                self.rules.ready(&Ask::of(tickets, ticket), &ctx, now)?
            }
        };
        let cost = Cost::Ticket(tickets, ticket, self.usage);
        let (probe, budgets) = (self.rules.probe.from(), &self.rules.budgets);
        Some(rules.max(self.dims.ready_at(cost, now, probe, |d| budgets.renewal_at(d))))
    }

    /// The refusal of queued `ticket` if budgets can no longer cover it.
    pub(super) fn unaffordable(
        &self,
        ticket: Ticket,
        (books, tickets): (&Books, &Tickets),
        now: Instant,
    ) -> Option<Refusal> {
        let ctx = Ctx { dims: &self.dims, books, tickets };
        self.rules.budgets.refusal(ticket, &ctx, now)
    }

    /// Whether granting `candidate` now leaves room for `head` when it is due, `after`
    /// from now (conservative backfilling; see [`Dims::leaves_room`]).
    pub(super) fn leaves_room(
        &mut self,
        (candidate, head): (Ticket, Ticket),
        tickets: &Tickets,
        after: Duration,
        now: Instant,
    ) -> bool {
        let pair =
            (Cost::Ticket(tickets, candidate, self.usage), Cost::Ticket(tickets, head, self.usage));
        self.dims.leaves_room(pair, after, now, self.rules.probe.active(now))
    }

    /// Enters the grant of `ticket` at `now` (its cost `taken` already, or taken now as
    /// booked): its epoch and instant, the books, and the rules that follow grants.
    #[inline]
    pub(super) fn grant(
        &mut self,
        ticket: Ticket,
        taken: bool,
        (books, tickets): (&mut Books, &mut Tickets),
        now: Instant,
    ) {
        if !taken {
            self.dims.take_booked(tickets, ticket, self.usage, now);
        }
        let queued = tickets.slot(ticket).state == SlotState::Queued;
        tickets.slot_mut(ticket).granted(self.gate.epoch(), now);
        books.grant(tickets.cost(ticket));
        self.rules.granted(&Ask::of(tickets, ticket), queued, now);
    }

    /// Settles the end of granted `ticket`, `how`, having `used` what it did (`counted`:
    /// whether the provider may have counted a request that left): the books and guards,
    /// what replies use, the buckets' refunds and debts, and the rules that follow ends.
    /// Nothing comes back from a grant made before the gate last closed: the throttle
    /// already wrote it off.
    pub(super) fn end(
        &mut self,
        ticket: Ticket,
        (used, counted, how): (Used<'_>, bool, Ended),
        (books, tickets): (&mut Books, &Tickets),
        now: Instant,
    ) {
        let slot = tickets.slot(ticket);
        let (held, sent) = (tickets.cost(ticket), slot.sent != NOT_SENT);
        let used = match used {
            Used::Reported(used) => Some(used),
            Used::Held => Some(held),
            Used::Nothing => None,
        };
        books.settle(held, sent.then_some(slot.sent));
        let charged = |d: usize, held| used.map_or(if sent { held } else { 0 }, |used| used[d]);
        self.dims.settle_guards(held, charged, counted, now);
        // What each reply used against the caller's own estimate, where reports are read.
        if let Some(used) = used.filter(|_| how == Ended::Answered && self.usage && books.is_open())
        {
            self.dims.record_usage(used, tickets.estimate(ticket));
        }
        let written_off = slot.written_off(self.gate.epoch());
        self.dims.refund(held, used, (slot.at, written_off), now);
        let in_flight = tickets.granted_count().saturating_sub(1);
        self.rules.ended(&Ask::of(tickets, ticket), how, used, in_flight, now);
    }

    /// A throttle of a request sent with `sent`, with the provider's Retry-After if it
    /// gave one: the gate closes once per epoch ([`Gate`]), and when it does every level
    /// drops to nothing (the provider has nothing left) and every reservation granted so
    /// far is written off (its commit refunds nothing, its release gives nothing back:
    /// only what refills from then on is granted again); rates adapt
    /// ([`ArbiterConfig::adapt`]) and ramps rise again from the pause's end.
    pub(super) fn throttle(
        &mut self,
        sent: SendStamp,
        retry_after: Option<Duration>,
        now: Instant,
        events: &mut VecDeque<Event>,
    ) -> ThrottleOutcome {
        let outcome = self.gate.throttle(sent.epoch, retry_after, now);
        if let ThrottleOutcome::Closed { until, pause, epoch } = outcome {
            events.push_back(Event::Throttled { epoch, pause, until });
            self.dims.throttle(self.adapt, until, now, events);
            self.rules.throttled(until, now);
        }
        outcome
    }

    /// What time does by `now`: budgets renew, ramps that reached their dimension's rate
    /// end, rates climb back after a throttle; returns the reservations waiting under a
    /// cap that now has room for them (pending under it already), to queue.
    pub(super) fn tick(
        &mut self,
        tickets: &Tickets,
        now: Instant,
        events: &mut VecDeque<Event>,
    ) -> Vec<Ticket> {
        let mut released = Vec::new();
        if !self.rules.idle() {
            self.rules.budgets.renew(&mut self.dims, now);
            released = self.rules.caps.release(&self.dims, tickets, now);
            self.rules.ramps.settle(&mut self.dims, now);
        }
        self.dims.recover(self.adapt.is_some(), now, events);
        released
    }

    /// Whether grants are held at `now`: the run aborted, the gate closed, or the
    /// account's quota spent.
    #[inline]
    pub(super) fn holds(&mut self, now: Instant) -> bool {
        self.aborted || !self.gate.is_open(now) || self.rules.spent.holds(now)
    }

    /// The abort undone, or the account's quota raised: grants go again (a dimension's
    /// longer quota stays spent until it resets).
    pub(super) fn resume(&mut self, now: Instant) {
        self.aborted = false;
        self.rules.spent.resume(now);
    }

    /// Records the provider's `report` on `dimension`, from the reply to the request
    /// stamped `sent` (read against `books`; `throttled`: a throttle's reply), and plans
    /// what it changes ([`Dimension::fold`](super::dims)); returns when the provider's
    /// count is whole again, if it said it had nothing left.
    pub(super) fn fold(
        &mut self,
        dimension: usize,
        (sent, report): (SendStamp, QuotaReport),
        (books, throttled): (&Books, bool),
        plan: &mut Vec<Adjust>,
        now: Instant,
    ) -> Result<Option<Instant>, InvalidLimit> {
        let dim = self.dims.get_mut(dimension)?;
        let send = books.send(sent.seq, dimension).map(|r| (r.at, r.own));
        Ok(dim.fold(report, sent, (send, books.send_delay(), throttled), now, plan))
    }

    /// Makes `change` to `dimension` (a budget opens `books`: what is granted may still
    /// be refunded into it); what it asks of the queue, and what funds took.
    pub(super) fn change(
        &mut self,
        dimension: usize,
        change: Change,
        (books, tickets): (&mut Books, &Tickets),
        now: Instant,
    ) -> Result<(Effect, u64), InvalidLimit> {
        match change {
            Change::Budget(budget) => {
                self.rules.budgets.set(&mut self.dims, dimension, budget, now)?;
                if !books.is_open() {
                    books.open(tickets.granted_costs());
                }
                Ok((Effect::Refuse(budget.amount), 0))
            }
            Change::Ramp(ramp) => {
                self.dims.get(dimension)?;
                self.rules.ramps.set(dimension, ramp);
                Ok((Effect::None, 0))
            }
            change => {
                let in_flight = tickets.granted_cost(dimension, |_| true);
                self.dims.change(dimension, change, in_flight, now)
            }
        }
    }

    /// Applies the learning policy's `plan` for `dimension`, in order, for the report on
    /// the reply to `sent` (`clears`: when the provider's count is whole again): each
    /// adjustment to the dimension, what it asks of the rules done at once. Returns what
    /// they ask of the queue (see [`Limits::effect`]), and the last adjustment's effect or
    /// the first refusal.
    pub(super) fn learn(
        &mut self,
        (dimension, sent, plan): (usize, SendStamp, &[Adjust]),
        (books, tickets): (&mut Books, &Tickets),
        (clears, now): (Option<Instant>, Instant),
        events: &mut VecDeque<Event>,
    ) -> (Vec<(u64, Refusal)>, Result<Effect, InvalidLimit>) {
        let (mut refusals, mut applied) = (Vec::new(), Ok(Effect::None));
        for adjust in plan {
            if let Adjust::Sync { .. } = adjust {
                books.note_counted(sent, now);
            }
            let read = (sent, &*books, tickets);
            match self.dims.adjust(dimension, adjust, read, (clears, now), events) {
                Ok(effect) => {
                    refusals.extend(self.effect(dimension, effect, now));
                    applied = applied.map(|_| effect);
                }
                Err(e) => applied = applied.and(Err(e)),
            }
        }
        if self.dims.all_reported() {
            // The provider reported: others may go with the first.
            self.rules.first.end();
        }
        (refusals, applied)
    }

    /// Stamps a send at `now`, for `ticket`'s reservation if it pays for it, with `live`
    /// reservations granted and not yet ended, and what each guard holds.
    pub(super) fn stamp(
        &self,
        ticket: Option<Ticket>,
        (books, tickets): (&mut Books, &mut Tickets),
        live: usize,
        now: Instant,
    ) -> SendStamp {
        let granted_at = ticket.map(|t| tickets.slot(t).at);
        let seq = books.next_send(granted_at, now, tickets.granted_costs());
        if let Some(t) = ticket {
            tickets.slot_mut(t).sent = seq;
        }
        let guards = self.dims.iter().map(|d| d.guard.as_ref());
        let held = guards.map(|guard| guard.map_or(0, |g| g.window.held_total()));
        // The caller's own estimate: kept apart only if a learned charge raised it.
        let cost = ticket.map(|t| (tickets.cost(t), tickets.estimate(t)));
        books.record_send(seq, now, cost, held, live);
        SendStamp { epoch: self.gate.epoch(), seq, counted_by: Instant::NEVER }
    }

    /// Does what a change to `dimension` asks of the rules; returns, for queued
    /// reservations costing it more than the amount, the refusal they receive.
    pub(super) fn effect(
        &mut self,
        dimension: usize,
        effect: Effect,
        now: Instant,
    ) -> Option<(u64, Refusal)> {
        match effect {
            Effect::None | Effect::Folded(_) => None,
            Effect::Raised(from) => {
                self.rules.ramps.raised(dimension, from, now);
                None
            }
            Effect::Probe(from) => {
                self.rules.probe.set(from);
                None
            }
            Effect::Refuse(above) => Some((above, Refusal::CostExceedsCapacity { dimension })),
            Effect::Spent(until) => {
                Some((0, self.rules.spent.spend_dimension(dimension, until, now)?))
            }
        }
    }

    /// Whether nothing about the limits needs the arbiter's order: plain dimensions, idle
    /// rules.
    pub(super) fn plain(&self) -> bool {
        !self.aborted && self.dims.plain() && self.rules.idle()
    }
}
