//! The multi-dimension arbiter: a FIFO queue granted atomically across every bucket.

use core::fmt;
use std::collections::VecDeque;
use std::time::Duration;

use crate::books::Books;
use crate::bucket::{InvalidLimit, Rate, TokenBucket};
use crate::event::{Event, Refusal};
use crate::gate::{Epoch, Gate, GateConfig, ThrottleOutcome};
use crate::time::{Instant, Monotonic};
use crate::window::WindowGuard;

/// Identifies one reservation, queued or granted.
///
/// Generational: once a ticket's reservation ends, its slot may be reused, but the old
/// ticket stays dead (a reused slot carries a new generation), so a late `cancel` or a
/// double `commit` can never touch someone else's reservation.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ticket {
    index: u32,
    generation: u32,
}

impl Ticket {
    /// A small dense index, unique among live tickets (slots are reused once a
    /// reservation ends): for drivers' side tables such as wakers.
    #[inline]
    pub fn slot(self) -> usize {
        self.index as usize
    }
}

impl fmt::Debug for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Ticket({}v{})", self.index, self.generation)
    }
}

/// What a request records when it is sent, to stamp the observations its reply produces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SendStamp {
    /// The gate epoch the request was sent in (for throttle observations).
    pub epoch: Epoch,
    /// A send sequence number, increasing with every stamp (for header observations).
    pub seq: u64,
}

/// Arbiter settings.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct ArbiterConfig {
    /// Conservative backfilling: let a later waiter go before the head when that provably
    /// does not delay the head's grant time (assuming reservations are upper bounds).
    /// Off by default.
    pub backfill: bool,
    /// How many waiters behind the head backfilling looks at per pass.
    pub backfill_depth: usize,
    /// The gate's pauses.
    pub gate: GateConfig,
    /// Adaptive rates: how the arbiter backs off when the provider throttles and recovers
    /// as calls succeed. `None` keeps the configured rates fixed.
    pub adapt: Option<Adapt>,
}

impl Default for ArbiterConfig {
    fn default() -> ArbiterConfig {
        ArbiterConfig {
            backfill: false,
            backfill_depth: 64,
            gate: GateConfig::default(),
            adapt: Some(Adapt::default()),
        }
    }
}

/// Additive-increase, multiplicative-decrease of the refill rates, driven by the provider.
///
/// When a throttle closes the gate, every dimension's rate is multiplied by `decrease`
/// (never below `floor` times the configured rate); each committed reservation then adds
/// `increase` times the configured rate back, never above the configured rate. A provider
/// whose real limit is below the configured one is thus met near its real rate instead of
/// with a 429 storm after every pause; a correctly configured client never throttles and
/// never changes rate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Adapt {
    /// Factor applied to the rates when the gate closes, in (0, 1].
    pub decrease: f64,
    /// Fraction of the configured rate added back per committed reservation.
    pub increase: f64,
    /// The lowest the rates go, as a fraction of the configured rate.
    pub floor: f64,
}

impl Default for Adapt {
    /// Halve on a throttle, recover over about two hundred successes, never below a tenth.
    fn default() -> Adapt {
        Adapt {
            decrease: 0.5,
            increase: 0.005,
            floor: 0.1,
        }
    }
}

impl ArbiterConfig {
    /// Turns conservative backfilling on or off.
    pub fn with_backfill(mut self, on: bool) -> ArbiterConfig {
        self.backfill = on;
        self
    }

    /// Sets the gate's pauses.
    pub fn with_gate(mut self, gate: GateConfig) -> ArbiterConfig {
        self.gate = gate;
        self
    }

    /// Sets (or, with `None`, turns off) adaptive rates.
    pub fn with_adapt(mut self, adapt: Option<Adapt>) -> ArbiterConfig {
        self.adapt = adapt;
        self
    }
}

/// Why a reservation was not queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReserveError {
    /// The cost names a different number of dimensions than the arbiter has.
    WrongDimensions {
        /// Dimensions of the arbiter.
        expected: usize,
        /// Entries in the cost.
        got: usize,
    },
    /// Never: the cost exceeds a dimension's capacity, so no amount of waiting grants it.
    CostExceedsCapacity {
        /// The dimension.
        dimension: usize,
        /// The cost asked for.
        cost: u64,
        /// That dimension's capacity.
        capacity: u64,
    },
    /// Not yet: the wait would exceed the caller's `max_wait`. Retry after `retry_after`.
    WouldWait {
        /// The estimated wait that was refused.
        retry_after: Duration,
    },
    /// The arbiter was aborted by a fatal failure; nothing more is granted.
    Aborted,
}

impl fmt::Display for ReserveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ReserveError::WrongDimensions { expected, got } => write!(
                f,
                "cost has {got} entries but the limiter has {expected} dimensions"
            ),
            ReserveError::CostExceedsCapacity {
                dimension,
                cost,
                capacity,
            } => write!(
                f,
                "cost {cost} exceeds the capacity {capacity} of dimension {dimension} and can \
                 never be granted; raise that bucket's capacity or split the request"
            ),
            ReserveError::WouldWait { retry_after } => write!(
                f,
                "the wait of {retry_after:?} would exceed the allowed maximum; retry later"
            ),
            ReserveError::Aborted => f.write_str("the limiter was aborted by a fatal failure"),
        }
    }
}

impl std::error::Error for ReserveError {}

/// Why an operation on a ticket failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TicketError {
    /// The ticket's reservation already ended (committed, released, cancelled, refused)
    /// or never existed.
    Unknown,
    /// The reservation is still queued; only granted reservations can be committed or
    /// released.
    NotGranted,
    /// The reservation's request was sent already, so its grant cannot be taken back.
    AlreadySent,
    /// The actual cost names a different number of dimensions than the arbiter has.
    WrongDimensions {
        /// Dimensions of the arbiter.
        expected: usize,
        /// Entries given.
        got: usize,
    },
}

impl fmt::Display for TicketError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            TicketError::Unknown => f.write_str("no live reservation has this ticket"),
            TicketError::NotGranted => f.write_str("the reservation has not been granted yet"),
            TicketError::AlreadySent => {
                f.write_str("the reservation's request was sent already; its grant stands")
            }
            TicketError::WrongDimensions { expected, got } => write!(
                f,
                "actual cost has {got} entries but the limiter has {expected} dimensions"
            ),
        }
    }
}

impl std::error::Error for TicketError {}

/// Where a ticket stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TicketState {
    /// Waiting in the queue.
    Queued,
    /// Granted and holding its reservation.
    Granted,
}

/// What a provider observation did to a dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FoldOutcome {
    /// The level was lowered to the observation.
    Lowered,
    /// The level was raised to the observation (only [`Arbiter::sync_level`] raises).
    Raised,
    /// The observation reported as much or more headroom than the local level: ignored,
    /// since headroom may be stale or belong to another key.
    Unchanged,
    /// A newer observation was already applied to this dimension: ignored.
    Stale,
}

/// The multi-resource arbiter: owns one [`TokenBucket`] per dimension, a FIFO queue of
/// waiters and the pool's [`Gate`].
///
/// It grants the head of the queue across **every** dimension at once or not at all, so
/// there is never a state where one dimension is held while another is awaited and two
/// limits cannot deadlock. A cost above a dimension's capacity is refused at once.
///
/// Sans-IO: every state-changing call takes `now`, grants are reported as
/// [`Event::Granted`] through [`Arbiter::poll_event`], and [`Arbiter::poll_timeout`]
/// says when to call [`Arbiter::handle_timeout`] next. The driver's loop:
///
/// 1. feed inputs (`reserve`, `cancel`, `commit`, `release`, `throttle`, `observe`);
/// 2. drain `poll_event` (wake the waiter of each `Granted` / `Refused` ticket);
/// 3. arm a timer for `poll_timeout`, and call `handle_timeout` when it fires.
///
/// Time never goes backwards here: a `now` earlier than one already seen is treated as
/// the latest one seen.
#[derive(Clone, Debug)]
pub struct Arbiter {
    config: ArbiterConfig,
    buckets: Vec<TokenBucket>,
    slots: Vec<Slot>,
    /// `buckets.len()` costs per slot, flat.
    costs: Vec<u64>,
    free: Vec<u32>,
    queue: VecDeque<Ticket>,
    live_queued: usize,
    /// Per dimension, the sum of the queued costs (for wait estimates).
    queued_sum: Vec<u128>,
    gate: Gate,
    events: VecDeque<Event>,
    clock: Monotonic,
    aborted: bool,
    next_seq: u64,
    /// Per dimension, the newest send sequence whose observation was applied.
    newest_observed: Vec<Option<u64>>,
    /// Per dimension, the rate the user configured: the ceiling adaptive rates return to.
    configured: Vec<Rate>,
    /// Per dimension, whether the provider keeps the books: after a sync, commits and
    /// releases no longer move the level, the next sync does.
    ledger: Vec<bool>,
    /// Grants, settlements and sends, to read a provider's reports against.
    books: Books,
    /// Open [`Arbiter::hold`]s: no grant is made while any is open.
    holds: u32,
    /// Per dimension, an optional cap on what a trailing window may hold.
    guards: Vec<Option<WindowGuard>>,
    /// Whether any dimension has a guard (the hot paths skip them otherwise).
    guarded: bool,
}

#[derive(Clone, Copy, Debug)]
struct Slot {
    generation: u32,
    state: SlotState,
    /// The send sequence of the request a granted reservation paid for (`NOT_SENT` until
    /// [`Arbiter::stamp_send_for`]).
    sent: u64,
    since: Instant,
    /// The gate epoch the reservation was granted in: one granted before the gate last
    /// closed is written off (see [`Arbiter::throttle`]).
    granted_in: Epoch,
}

const NOT_SENT: u64 = u64::MAX;

/// The most a commit charges a dimension, as a multiple of what was reserved there (or
/// the dimension's capacity, if larger): reported usage beyond it is distrusted. Four
/// times covers a prompt estimate that was short by the most a tokenizer differs from four
/// characters a token (code, CJK text).
pub const MAX_CHARGE_FACTOR: u64 = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SlotState {
    Free,
    Queued,
    Granted,
}

impl Arbiter {
    /// An arbiter over `buckets` (one per dimension, in the order costs will name them).
    pub fn new(
        buckets: Vec<TokenBucket>,
        config: ArbiterConfig,
        now: Instant,
    ) -> Result<Arbiter, InvalidLimit> {
        if buckets.is_empty() {
            return Err(InvalidLimit::ZeroCapacity);
        }
        let dims = buckets.len();
        let configured = buckets.iter().map(TokenBucket::rate).collect();
        Ok(Arbiter {
            config,
            buckets,
            slots: Vec::new(),
            costs: Vec::new(),
            free: Vec::new(),
            queue: VecDeque::new(),
            live_queued: 0,
            queued_sum: vec![0; dims],
            gate: Gate::new(config.gate),
            events: VecDeque::new(),
            clock: Monotonic::new(now),
            aborted: false,
            next_seq: 0,
            newest_observed: vec![None; dims],
            configured,
            ledger: vec![false; dims],
            books: Books::new(dims),
            holds: 0,
            guards: vec![None; dims],
            guarded: false,
        })
    }

    /// The number of dimensions.
    pub fn dimensions(&self) -> usize {
        self.buckets.len()
    }

    /// The bucket of `dimension`, for inspection.
    pub fn bucket(&self, dimension: usize) -> Option<&TokenBucket> {
        self.buckets.get(dimension)
    }

    /// Permits available in `dimension` at `now` (negative while in debt or, never, out
    /// of range: `None`).
    pub fn available(&mut self, dimension: usize, now: Instant) -> Option<f64> {
        let now = self.clock.advance(now);
        self.buckets.get_mut(dimension).map(|b| b.available(now))
    }

    /// Waiters still queued.
    pub fn queued(&self) -> usize {
        self.live_queued
    }

    /// The gate (epoch and pause).
    pub fn gate(&self) -> &Gate {
        &self.gate
    }

    /// Whether [`Arbiter::abort`] was called.
    pub fn is_aborted(&self) -> bool {
        self.aborted
    }

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
        let nobody_waits = self.live_queued == 0 && self.holds == 0 && self.gate.is_open(now);
        if nobody_waits && self.fits_all(cost, now) {
            // Fast path: granted on arrival, never queued.
            let ticket = self.allocate(cost, now);
            self.take(ticket, now);
            self.slots[ticket.index as usize].state = SlotState::Granted;
            self.events.push_back(Event::Granted {
                ticket,
                waited: Duration::ZERO,
            });
            return Ok(ticket);
        }
        let ticket = self.allocate(cost, now);
        self.queue.push_back(ticket);
        self.live_queued += 1;
        for (sum, &c) in self.queued_sum.iter_mut().zip(cost) {
            *sum += u128::from(c);
        }
        self.drive(now);
        Ok(ticket)
    }

    /// Where `ticket` stands, or `None` if its reservation has ended.
    #[inline]
    pub fn state(&self, ticket: Ticket) -> Option<TicketState> {
        match self.slot(ticket)?.state {
            SlotState::Queued => Some(TicketState::Queued),
            SlotState::Granted => Some(TicketState::Granted),
            SlotState::Free => None,
        }
    }

    /// Withdraws `ticket`, as dropping it does: a queued waiter leaves the queue; a granted
    /// reservation whose request was never sent is released whole; one whose request was
    /// sent ([`Arbiter::stamp_send_for`]) is abandoned and **stays charged as reserved**,
    /// because the provider has probably counted it (ADR 0012). Returns whether there was
    /// anything to withdraw. Safe to call at any time, with any ticket.
    pub fn cancel(&mut self, ticket: Ticket, now: Instant) -> bool {
        let now = self.clock.advance(now);
        match self.slot(ticket).map(|s| (s.state, s.sent != NOT_SENT)) {
            Some((SlotState::Queued, _)) => {
                self.unqueue(ticket);
                self.free_slot(ticket);
                self.events.push_back(Event::Cancelled { ticket });
                self.drive(now);
                true
            }
            Some((SlotState::Granted, true)) => {
                // Charged as reserved: no refund, in the books and guards as spent.
                self.settle(ticket, |_, reserved| reserved, now);
                self.free_slot(ticket);
                self.events.push_back(Event::Abandoned { ticket });
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
        if actual.len() != self.buckets.len() {
            return Err(TicketError::WrongDimensions {
                expected: self.buckets.len(),
                got: actual.len(),
            });
        }
        self.check_granted(ticket)?;
        let base = self.cost_base(ticket);
        let beyond_trust = actual
            .iter()
            .enumerate()
            .any(|(d, &used)| used > self.charge_ceiling(d, self.costs[base + d]));
        if beyond_trust {
            return self.commit_distrusted(ticket, actual, now);
        }
        self.settle(ticket, |d, _| actual[d], now);
        let written_off = self.written_off(ticket);
        for (d, &used) in actual.iter().enumerate().filter(|(d, _)| !self.ledger[*d]) {
            let reserved = self.costs[base + d];
            let bucket = &mut self.buckets[d];
            if used < reserved {
                if !written_off {
                    bucket.give_back(reserved - used, now);
                }
            } else if used > reserved {
                bucket.take(used - reserved, now);
            }
        }
        self.free_slot(ticket);
        self.events.push_back(Event::Committed { ticket });
        if let Some(adapt) = self.config.adapt
            && self.below_configured()
        {
            self.scale_rates(now, |_, current, configured| {
                current + configured * adapt.increase
            });
        }
        self.drive(now);
        Ok(())
    }

    /// [`Arbiter::commit`] for a report beyond the trusted ceiling in some dimension.
    #[cold]
    fn commit_distrusted(
        &mut self,
        ticket: Ticket,
        actual: &[u64],
        now: Instant,
    ) -> Result<(), TicketError> {
        let base = self.cost_base(ticket);
        let bounded: Vec<u64> = actual
            .iter()
            .enumerate()
            .map(|(dimension, &reported)| {
                let ceiling = self.charge_ceiling(dimension, self.costs[base + dimension]);
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
    fn charge_ceiling(&self, dimension: usize, reserved: u64) -> u64 {
        reserved
            .saturating_mul(MAX_CHARGE_FACTOR)
            .max(self.buckets[dimension].capacity())
    }

    /// Returns a granted reservation whole: its request was never sent, or the provider
    /// answered that it did not count it (a 429, a 5xx, a 4xx refusal). A reservation
    /// granted before the gate last closed gives nothing back (see [`Arbiter::throttle`]).
    /// For a request sent whose outcome is unknown, use [`Arbiter::cancel`], which keeps
    /// it charged.
    #[inline]
    pub fn release(&mut self, ticket: Ticket, now: Instant) -> Result<(), TicketError> {
        let now = self.clock.advance(now);
        self.check_granted(ticket)?;
        // A request that left may have been charged before it failed.
        let sent = self.slots[ticket.index as usize].sent != NOT_SENT;
        self.settle(ticket, |_, reserved| if sent { reserved } else { 0 }, now);
        let base = self.cost_base(ticket);
        let written_off = self.written_off(ticket);
        for (d, bucket) in self.buckets.iter_mut().enumerate() {
            if !self.ledger[d] && !written_off {
                bucket.give_back(self.costs[base + d], now);
            }
        }
        self.free_slot(ticket);
        self.events.push_back(Event::Released { ticket });
        self.drive(now);
        Ok(())
    }

    /// Grants whatever can go at `now`. Call it when the `poll_timeout` deadline passes.
    #[inline]
    pub fn handle_timeout(&mut self, now: Instant) {
        let now = self.clock.advance(now);
        self.drive(now);
    }

    /// When the next grant (or the gate's reopening) can happen, if anything is waiting.
    pub fn poll_timeout(&mut self) -> Option<Instant> {
        let now = self.clock.advance(Instant::ZERO);
        let gate = self.gate.reopens_at(now);
        let Some(head) = self.head() else {
            return gate;
        };
        let ready = self.ready_at(head, now);
        Some(gate.map_or(ready, |g| g.max(ready)))
    }

    /// The next event, if any. Drain after every input.
    #[inline]
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Stamps a request being sent at `now` without a reservation of its own, so that its
    /// reply's observations can be ordered.
    pub fn stamp_send(&mut self, now: Instant) -> SendStamp {
        self.stamp(None, now)
    }

    /// Stamps the request that `ticket`'s reservation pays for, sent at `now`, so that
    /// [`Arbiter::sync_level`] can tell the reply's own reservation from the others.
    pub fn stamp_send_for(&mut self, ticket: Ticket, now: Instant) -> SendStamp {
        let granted = self
            .slot(ticket)
            .is_some_and(|s| s.state == SlotState::Granted);
        self.stamp(granted.then_some(ticket), now)
    }

    /// [`Arbiter::stamp_send_for`], but only while the gate is open at `now`: a closed
    /// gate returns the instant it reopens and stamps nothing.
    ///
    /// Checking the gate and taking the stamp in one step is what keeps a request out of
    /// a pause: a caller that first asked [`Gate::is_open`] and stamped later could be
    /// overtaken by a throttle in between, then send into the pause with the new epoch,
    /// and its 429 would close the gate a second time for the same wave.
    pub fn stamp_send_if_open(
        &mut self,
        ticket: Ticket,
        now: Instant,
    ) -> Result<SendStamp, Instant> {
        let now = self.clock.advance(now);
        match self.gate.reopens_at(now) {
            Some(reopens) => Err(reopens),
            None => Ok(self.stamp_send_for(ticket, now)),
        }
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
    /// same. A reservation already sent (stamped with [`Arbiter::stamp_send_for`]) cannot be
    /// requeued.
    pub fn requeue_unsent(&mut self, ticket: Ticket, now: Instant) -> Result<(), TicketError> {
        let now = self.clock.advance(now);
        self.check_granted(ticket)?;
        let index = ticket.index as usize;
        if self.slots[index].sent != NOT_SENT {
            return Err(TicketError::AlreadySent);
        }
        // The grant ends unsent (nothing charged), as a release would end it.
        self.settle(ticket, |_, _| 0, now);
        self.slots[index].state = SlotState::Queued;
        let since = self.slots[index].since;
        let slots = &self.slots;
        let position = self
            .queue
            .iter()
            .position(|t| slots[t.index as usize].since > since)
            .unwrap_or(self.queue.len());
        self.queue.insert(position, ticket);
        self.live_queued += 1;
        let base = self.cost_base(ticket);
        for (d, sum) in self.queued_sum.iter_mut().enumerate() {
            *sum += u128::from(self.costs[base + d]);
        }
        self.events.push_back(Event::Requeued { ticket });
        self.drive(now);
        Ok(())
    }

    fn stamp(&mut self, ticket: Option<Ticket>, now: Instant) -> SendStamp {
        let now = self.clock.advance(now);
        if !self.books.is_open() {
            let dims = self.buckets.len();
            let (slots, costs) = (&self.slots, &self.costs);
            let live = slots
                .iter()
                .enumerate()
                .filter(|(_, slot)| slot.state == SlotState::Granted)
                .map(|(index, _)| &costs[index * dims..(index + 1) * dims]);
            self.books.open(live);
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let dims = self.buckets.len();
        let live = self.slots.len() - self.free.len() - self.live_queued;
        let guard_held = self
            .guards
            .iter()
            .map(|g| g.as_ref().map_or(0, WindowGuard::held_total));
        let cost = match ticket {
            Some(t) => {
                self.slots[t.index as usize].sent = seq;
                let base = t.index as usize * dims;
                Some(&self.costs[base..base + dims])
            }
            None => None,
        };
        self.books.record_send(seq, now, cost, guard_held, live);
        SendStamp {
            epoch: self.gate.epoch(),
            seq,
        }
    }

    /// Reads a provider's "remaining" for `dimension`, reported on the reply to the request
    /// stamped `sent`, as a bound on what is left for new grants, and moves the level
    /// within it. Use it only where the provider is known to refill continuously.
    ///
    /// The report counts the requests the provider processed before that one, an order the
    /// client cannot see. Two readings bracket the truth:
    ///
    /// - **Floor:** only the reservations that had ended before the request was sent were
    ///   surely counted; every other one granted since may still be charged. The remaining
    ///   minus all of them is safe, so a level below it is **raised** to it.
    /// - **Ceiling:** the provider can have no more than the remaining plus what refilled
    ///   since the request left, and the reservations granted but not yet sent are still
    ///   to come. A level above that is **lowered** to it: even the kindest reading says
    ///   the client thinks it has more than the provider does (the provider charges more
    ///   than estimated, or another client shares the quota). Requests that left after
    ///   this one are not subtracted: on a pool of connections they may have been counted
    ///   first, and a ceiling that assumed otherwise would stall a burst.
    ///
    /// Any number of reports, in any order, can be read this way, so none is stale; a
    /// report whose send is too old to be on record only lowers. From the first sync on,
    /// the provider keeps the books for this dimension: commits and releases no longer
    /// move its level (its next report says what it really charged), until
    /// [`Arbiter::stop_sync`].
    pub fn sync_level(
        &mut self,
        dimension: usize,
        sent: SendStamp,
        remaining: u64,
        now: Instant,
    ) -> FoldOutcome {
        let now = self.clock.advance(now);
        if dimension >= self.buckets.len() {
            return FoldOutcome::Unchanged;
        }
        let first = !std::mem::replace(&mut self.ledger[dimension], true);
        let remaining = i128::from(remaining);
        let to_come = self.granted_cost(dimension, |slot| slot.sent == NOT_SENT);
        let record = self.books.send(sent.seq, dimension);
        let bucket = &mut self.buckets[dimension];
        let refilled = record.map_or(0, |r| {
            bucket
                .rate()
                .permits_over(now.saturating_duration_since(r.at))
        });
        let ceiling = remaining + i128::from(refilled) - i128::from(to_come);
        // A provider whose bucket is full wastes its refill while our requests are on their
        // way; the client's capacity leaves room for that only if what it holds plus what
        // is in flight stays within it, as it does for a bucket that only ever grants.
        let headroom = i128::from(bucket.capacity()) - i128::from(self.books.unsettled(dimension));
        let floor = record.map(|r| (remaining - i128::from(r.unsettled_others)).min(headroom));
        let clamp = |v: i128| i64::try_from(v).unwrap_or(if v < 0 { i64::MIN } else { i64::MAX });
        let from = bucket.available(now);
        if first {
            // The level so far was the client's own reckoning (refunds included); from here
            // on it is the provider's books, read safely.
            bucket.set_level(clamp(floor.unwrap_or(ceiling).min(ceiling)), now);
        } else {
            if let Some(floor) = floor {
                bucket.raise_to(clamp(floor.min(ceiling)), now);
            }
            bucket.lower_to(clamp(ceiling), now);
        }
        let to = bucket.available(now);
        let outcome = if to > from {
            FoldOutcome::Raised
        } else if to < from {
            FoldOutcome::Lowered
        } else {
            FoldOutcome::Unchanged
        };
        if outcome != FoldOutcome::Unchanged {
            self.events.push_back(Event::Synced {
                dimension,
                from,
                to,
            });
        }
        self.drive(now);
        outcome
    }

    /// Caps `dimension` at `guard`'s limit per trailing window, on top of its bucket (or
    /// removes the cap with `None`): safe against providers that count in fixed windows or
    /// sliding logs whatever the bucket's burst (see [`WindowGuard`]). Queued reservations
    /// the new cap can never admit are refused with [`Refusal::CostExceedsCapacity`].
    /// A new guard counts every reservation granted and not yet ended (they may still reach
    /// the provider inside the window it caps); what ended before it was installed is for
    /// the provider's report to tell ([`Arbiter::seed_window_guard`]).
    pub fn set_window_guard(&mut self, dimension: usize, guard: Option<WindowGuard>, now: Instant) {
        let now = self.clock.advance(now);
        if dimension >= self.buckets.len() {
            return;
        }
        // A new guard starts holding every reservation granted and not yet ended: they
        // settle into it when they end, and until then they may reach the provider inside
        // the very window the guard now caps.
        let in_flight = self.granted_cost(dimension, |_| true);
        let guard = guard.map(|mut guard| {
            guard.take(in_flight);
            guard
        });
        self.guards[dimension] = guard;
        self.guarded = self.guards.iter().any(Option::is_some);
        self.refuse_too_big(dimension);
        self.drive(now);
    }

    /// Seeds `dimension`'s window guard, just installed on the strength of the reply to the
    /// request stamped `sent`, with what the provider has counted that the guard cannot
    /// know of: `used`, the provider's count when it took that request, and every
    /// reservation that ended since that request left (it may have reached the provider
    /// after it, and ended before the guard existed, so nothing else would count it).
    /// Counting some twice is the safe side; the provider's later reports trim the excess
    /// ([`Arbiter::observe_used`]). If the send is too old to be on record, the guard holds
    /// the whole limit for a window.
    pub fn seed_window_guard(
        &mut self,
        dimension: usize,
        sent: SendStamp,
        used: u64,
        now: Instant,
    ) {
        let now = self.clock.advance(now);
        let ended_since = self.books.settled_since(sent.seq, dimension);
        if let Some(Some(guard)) = self.guards.get_mut(dimension) {
            let seed = match ended_since {
                Some(ended) => used.saturating_add(ended),
                None => guard.limit(),
            };
            guard.hold(seed, now);
        }
    }

    /// `dimension`'s window guard, if it has one.
    pub fn window_guard(&self, dimension: usize) -> Option<&WindowGuard> {
        self.guards.get(dimension).and_then(Option::as_ref)
    }

    /// Changes the limit of `dimension`'s window guard, if it has one (a provider reported
    /// a different limit); the charges it holds stay.
    pub fn set_window_limit(&mut self, dimension: usize, limit: u64, now: Instant) {
        let now = self.clock.advance(now);
        if limit == 0 || limit > crate::MAX_LIMIT {
            return;
        }
        if let Some(Some(guard)) = self.guards.get_mut(dimension) {
            guard.set_limit(limit);
            self.refuse_too_big(dimension);
            self.drive(now);
        }
    }

    /// Reports the provider's count of what `dimension` has used in its window (its limit
    /// minus its remaining), on the reply to the request stamped `sent`, to its window
    /// guard (without one this does nothing):
    ///
    /// - beyond everything the guard holds, in flight included, is what someone else
    ///   spent on the same key: it is held for a window too;
    /// - below what the guard held when the request left is what the guard over-counts (it
    ///   holds reservations until it learns otherwise, and a provider may count usage, or
    ///   restart a fixed window): that much is let go.
    pub fn observe_used(&mut self, dimension: usize, sent: SendStamp, used: u64, now: Instant) {
        let now = self.clock.advance(now);
        let record = self.books.send(sent.seq, dimension);
        if let Some(Some(guard)) = self.guards.get_mut(dimension) {
            guard.observe_used(used, now);
            if let Some(record) = record {
                guard.trim(used, record.guard_held, now);
            }
            self.drive(now);
        }
    }

    /// Holds back every grant until the matching [`Arbiter::unhold`], so that several
    /// calls act as one step: commit a reservation, then fold its reply's quota
    /// headers, and the refund the commit made cannot reach the next waiter before the
    /// provider's count (which may not honour it) is heard. Holds nest. Reservations still
    /// queue meanwhile; none is granted, not even on arrival.
    pub fn hold(&mut self) {
        self.holds = self.holds.saturating_add(1);
    }

    /// Ends one [`Arbiter::hold`]; when none is left open, grants whatever fits.
    pub fn unhold(&mut self, now: Instant) {
        let now = self.clock.advance(now);
        self.holds = self.holds.saturating_sub(1);
        self.drive(now);
    }

    /// Hands the books of `dimension` back to the client: commits and releases move its
    /// level again (for when the provider turns out not to be a continuous bucket).
    pub fn stop_sync(&mut self, dimension: usize) {
        if let Some(ledger) = self.ledger.get_mut(dimension) {
            *ledger = false;
        }
    }

    /// Reports that a request sent with `sent` was throttled, with the provider's
    /// Retry-After if it gave one. Closes the gate once per epoch; see [`Gate`].
    ///
    /// A throttle that closes the gate sets every level to zero (the provider has nothing
    /// left) and writes off every reservation granted until then: committing one refunds
    /// nothing and releasing one gives nothing back, because the provider's nothing
    /// already counts them (if it did not charge them, it has not refilled them either).
    /// Only what refills from then on is granted again. Without this, the releases of the
    /// rest of a wave's 429s would refill the buckets by the wave's size and launch it
    /// again, into the same wall, the moment the pause ends.
    pub fn throttle(
        &mut self,
        sent: SendStamp,
        retry_after: Option<Duration>,
        now: Instant,
    ) -> ThrottleOutcome {
        let now = self.clock.advance(now);
        let outcome = self.gate.throttle(sent.epoch, retry_after, now);
        if let ThrottleOutcome::Closed {
            until,
            pause,
            epoch,
        } = outcome
        {
            self.events.push_back(Event::Throttled {
                epoch,
                pause,
                until,
            });
            // The provider just said it has nothing left: so have we. After the pause
            // the buckets hold what refilled during it, as the provider's do.
            for bucket in &mut self.buckets {
                bucket.lower_to(0, now);
            }
            if let Some(adapt) = self.config.adapt {
                // Where the provider keeps the books its reports already steer the level;
                // a stray 429 there is not evidence of a lower limit.
                let ledger = self.ledger.clone();
                self.scale_rates(now, |dimension, current, configured| {
                    if ledger[dimension] {
                        current
                    } else {
                        (current * adapt.decrease).max(configured * adapt.floor)
                    }
                });
            }
        }
        outcome
    }

    /// The rate `dimension` refills at now (below the configured one after throttles).
    pub fn current_rate(&self, dimension: usize) -> Option<Rate> {
        self.buckets.get(dimension).map(TokenBucket::rate)
    }

    /// Applies `f(dimension, current, configured)` (permits per second) to every dimension's rate and
    /// reports the changes.
    fn scale_rates(&mut self, now: Instant, f: impl Fn(usize, f64, f64) -> f64) {
        for (dimension, bucket) in self.buckets.iter_mut().enumerate() {
            let from = bucket.rate();
            let configured = self.configured[dimension];
            let wanted = f(
                dimension,
                from.per_second_f64(),
                configured.per_second_f64(),
            );
            let to = if wanted >= configured.per_second_f64() {
                configured
            } else {
                match Rate::from_per_second_f64(wanted) {
                    Ok(rate) => rate,
                    Err(_) => continue,
                }
            };
            if to != from {
                bucket.set_rate(to, now);
                self.events.push_back(Event::RateChanged {
                    dimension,
                    from,
                    to,
                });
            }
        }
    }

    /// Folds a provider's "remaining" for `dimension`, observed on the reply to a request
    /// stamped `sent`: lowers the level to the remaining minus what every other live
    /// reservation holds (the provider may not have counted it). Only ever lowers; an observation
    /// older than one already applied to this dimension is ignored.
    pub fn observe_remaining(
        &mut self,
        dimension: usize,
        sent: SendStamp,
        remaining: u64,
        now: Instant,
    ) -> FoldOutcome {
        let now = self.clock.advance(now);
        if dimension >= self.buckets.len() {
            return FoldOutcome::Unchanged;
        }
        if self.newest_observed[dimension].is_some_and(|newest| sent.seq < newest) {
            return FoldOutcome::Stale;
        }
        self.newest_observed[dimension] = Some(sent.seq);
        let target = self.remaining_for_us(dimension, sent, remaining);
        let bucket = &mut self.buckets[dimension];
        let from = bucket.available(now);
        if bucket.lower_to(target, now) {
            let to = bucket.available(now);
            self.events.push_back(Event::Lowered {
                dimension,
                from,
                to,
            });
            FoldOutcome::Lowered
        } else {
            FoldOutcome::Unchanged
        }
    }

    /// What a provider's `remaining`, reported on the reply to `sent`, leaves for new
    /// grants: every other live reservation may not have been counted in it (granted and
    /// not yet sent, sent and not yet arrived, or arrived after the reported one: requests
    /// on a pool of connections arrive in any order), so it is subtracted.
    fn remaining_for_us(&self, dimension: usize, sent: SendStamp, remaining: u64) -> i64 {
        let in_flight = self.granted_cost(dimension, |slot| slot.sent != sent.seq);
        i64::try_from(remaining)
            .unwrap_or(i64::MAX)
            .saturating_sub(i64::try_from(in_flight).unwrap_or(i64::MAX))
    }

    /// Changes `dimension`'s configured refill rate from `now` on (adaptive rates return to
    /// it, never above).
    pub fn set_rate(&mut self, dimension: usize, rate: Rate, now: Instant) {
        let now = self.clock.advance(now);
        if let Some(bucket) = self.buckets.get_mut(dimension) {
            bucket.set_rate(rate, now);
            self.configured[dimension] = rate;
            self.drive(now);
        }
    }

    /// Changes `dimension`'s capacity from `now` on. Queued waiters whose cost no longer
    /// fits are removed with [`Event::Refused`].
    pub fn set_capacity(
        &mut self,
        dimension: usize,
        capacity: u64,
        now: Instant,
    ) -> Result<(), InvalidLimit> {
        let now = self.clock.advance(now);
        let Some(bucket) = self.buckets.get_mut(dimension) else {
            return Err(InvalidLimit::NoSuchDimension(dimension));
        };
        bucket.set_capacity(capacity, now)?;
        self.refuse_too_big(dimension);
        self.drive(now);
        Ok(())
    }

    /// The most one reservation may cost in `dimension`: its bucket's capacity, or its
    /// window guard's limit if lower.
    fn effective_capacity(&self, dimension: usize) -> u64 {
        let capacity = self.buckets[dimension].capacity();
        self.guards[dimension]
            .as_ref()
            .map_or(capacity, |guard| capacity.min(guard.limit()))
    }

    /// Refuses the queued reservations `dimension` can never admit.
    fn refuse_too_big(&mut self, dimension: usize) {
        let dims = self.buckets.len();
        let capacity = self.effective_capacity(dimension);
        let too_big: Vec<Ticket> = self
            .queue
            .iter()
            .copied()
            .filter(|&t| {
                self.slot(t).is_some_and(|s| s.state == SlotState::Queued)
                    && self.costs[t.index as usize * dims + dimension] > capacity
            })
            .collect();
        for ticket in too_big {
            self.unqueue(ticket);
            self.free_slot(ticket);
            self.events.push_back(Event::Refused {
                ticket,
                reason: Refusal::CostExceedsCapacity { dimension },
            });
        }
    }

    /// Undoes [`Arbiter::abort`] once the cause is fixed (a key replaced, credit added):
    /// reservations are accepted again. Waiters refused by the abort stay refused.
    pub fn resume(&mut self, now: Instant) {
        let now = self.clock.advance(now);
        self.aborted = false;
        self.drive(now);
    }

    /// Stops the run after a fatal failure: every queued waiter is refused with
    /// [`Refusal::Aborted`] and later reservations fail with [`ReserveError::Aborted`],
    /// until [`Arbiter::resume`]. Granted reservations can still be committed or released.
    pub fn abort(&mut self, now: Instant) {
        self.clock.advance(now);
        self.aborted = true;
        while let Some(ticket) = self.queue.pop_front() {
            if self
                .slot(ticket)
                .is_some_and(|s| s.state == SlotState::Queued)
            {
                self.unqueue(ticket);
                self.free_slot(ticket);
                self.events.push_back(Event::Refused {
                    ticket,
                    reason: Refusal::Aborted,
                });
            }
        }
    }

    fn validate(&self, cost: &[u64]) -> Result<(), ReserveError> {
        if self.aborted {
            return Err(ReserveError::Aborted);
        }
        if cost.len() != self.buckets.len() {
            return Err(ReserveError::WrongDimensions {
                expected: self.buckets.len(),
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

    /// Grants the head for as long as it fits, then backfills if configured.
    #[inline]
    fn drive(&mut self, now: Instant) {
        if self.aborted || self.holds > 0 || !self.gate.is_open(now) {
            return;
        }
        while let Some(head) = self.head() {
            let base = self.cost_base(head);
            let dims = self.buckets.len();
            let head_fits = (0..dims).all(|d| self.fits(d, self.costs[base + d], now));
            if !head_fits {
                break;
            }
            self.queue.pop_front();
            self.grant(head, now);
        }
        if self.config.backfill && self.live_queued > 1 {
            self.backfill(now);
        }
        self.compact_queue();
    }

    /// Conservative backfilling: a waiter behind the head goes now only if it fits now
    /// and, in every dimension, the level projected to the head's grant time stays at or
    /// above the head's cost after taking it.
    fn backfill(&mut self, now: Instant) {
        let Some(head) = self.head() else { return };
        let head_at = self.ready_at(head, now);
        let after = head_at.saturating_duration_since(now);
        let dims = self.buckets.len();
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
            let fits_now = (0..dims).all(|d| self.fits(d, self.costs[base + d], now));
            let head_not_delayed = (0..dims).all(|d| {
                let bucket = &self.buckets[d];
                bucket.projected_units(after, self.costs[base + d])
                    >= bucket.units(self.costs[head_base + d])
            }) && (0..dims).all(|d| {
                // A guard frees room only as charges age out: the candidate may not take
                // room the head needs.
                let both = self.costs[base + d].saturating_add(self.costs[head_base + d]);
                self.guards[d].is_none() || self.fits(d, both, now)
            });
            if fits_now && head_not_delayed {
                self.queue.remove(i);
                self.grant(candidate, now);
            } else {
                i += 1;
            }
        }
    }

    #[inline]
    fn below_configured(&self) -> bool {
        self.buckets
            .iter()
            .zip(&self.configured)
            .any(|(bucket, configured)| bucket.rate() != *configured)
    }

    fn fits_all(&mut self, cost: &[u64], now: Instant) -> bool {
        if !self.guarded {
            return self
                .buckets
                .iter_mut()
                .zip(cost)
                .all(|(bucket, &c)| bucket.fits(c, now));
        }
        cost.iter().enumerate().all(|(d, &c)| self.fits(d, c, now))
    }

    /// Whether `cost` fits `dimension`'s bucket and guard now.
    #[inline]
    fn fits(&mut self, dimension: usize, cost: u64, now: Instant) -> bool {
        self.buckets[dimension].fits(cost, now)
            && (!self.guarded
                || self.guards[dimension]
                    .as_mut()
                    .is_none_or(|guard| guard.fits(cost, now)))
    }

    #[inline]
    fn grant(&mut self, ticket: Ticket, now: Instant) {
        self.take(ticket, now);
        self.unqueue(ticket);
        let slot = &mut self.slots[ticket.index as usize];
        slot.state = SlotState::Granted;
        let waited = now.saturating_duration_since(slot.since);
        self.events.push_back(Event::Granted { ticket, waited });
    }

    /// Takes `ticket`'s cost from every bucket and guard, and enters it in the books.
    #[inline]
    fn take(&mut self, ticket: Ticket, now: Instant) {
        let base = self.cost_base(ticket);
        let cost = &self.costs[base..base + self.buckets.len()];
        for (bucket, &c) in self.buckets.iter_mut().zip(cost) {
            bucket.take(c, now);
        }
        self.slots[ticket.index as usize].granted_in = self.gate.epoch();
        if self.guarded {
            for (guard, &c) in self.guards.iter_mut().zip(cost) {
                if let Some(guard) = guard {
                    guard.take(c);
                }
            }
        }
        self.books.grant(cost);
    }

    /// Enters the end of `ticket`'s reservation in the books and guards, the provider
    /// having charged `charged(dimension, reserved)`.
    #[inline]
    fn settle(&mut self, ticket: Ticket, charged: impl Fn(usize, u64) -> u64, now: Instant) {
        let base = self.cost_base(ticket);
        let cost = &self.costs[base..base + self.buckets.len()];
        self.books.settle(cost);
        if self.guarded {
            for (d, (guard, &reserved)) in self.guards.iter_mut().zip(cost).enumerate() {
                if let Some(guard) = guard {
                    guard.settle(reserved, charged(d, reserved), now);
                }
            }
        }
    }

    /// The summed cost in `dimension` of the granted reservations `which` picks.
    fn granted_cost(&self, dimension: usize, which: impl Fn(&Slot) -> bool) -> u64 {
        let dims = self.buckets.len();
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, slot)| slot.state == SlotState::Granted && which(slot))
            .map(|(index, _)| self.costs[index * dims + dimension])
            .fold(0u64, u64::saturating_add)
    }

    /// The instant the head's cost fits every dimension, assuming nothing else happens.
    fn ready_at(&mut self, head: Ticket, now: Instant) -> Instant {
        let base = self.cost_base(head);
        let mut wait = Duration::ZERO;
        for (d, bucket) in self.buckets.iter_mut().enumerate() {
            let w = bucket
                .time_until(self.costs[base + d], now)
                .unwrap_or(Duration::MAX);
            wait = wait.max(w);
        }
        for (d, guard) in self.guards.iter_mut().enumerate() {
            if let Some(guard) = guard {
                // `None`: only a reservation ending makes room, and that drives the queue.
                let w = guard
                    .time_until(self.costs[base + d], now)
                    .unwrap_or(Duration::MAX);
                wait = wait.max(w);
            }
        }
        now + wait
    }

    fn estimate_wait(&mut self, cost: &[u64], now: Instant) -> Duration {
        let gate_wait = self
            .gate
            .reopens_at(now)
            .map_or(Duration::ZERO, |at| at.saturating_duration_since(now));
        let mut wait = gate_wait;
        for (d, bucket) in self.buckets.iter_mut().enumerate() {
            let total = self.queued_sum[d].saturating_add(u128::from(cost[d]));
            let total = u64::try_from(total).unwrap_or(u64::MAX);
            let w = bucket.time_until_unbounded(total, now);
            wait = wait.max(w);
            if let Some(guard) = &mut self.guards[d] {
                // Erring long: a guard full of reservations still in flight makes room
                // within a window of their ending.
                let w = guard.time_until(total, now).unwrap_or(guard.window());
                wait = wait.max(w);
            }
        }
        wait
    }

    #[inline]
    fn head(&mut self) -> Option<Ticket> {
        while let Some(&front) = self.queue.front() {
            if self.is_queued(front) {
                return Some(front);
            }
            self.queue.pop_front();
        }
        None
    }

    #[inline]
    fn allocate(&mut self, cost: &[u64], now: Instant) -> Ticket {
        let dims = self.buckets.len();
        if let Some(index) = self.free.pop() {
            let slot = &mut self.slots[index as usize];
            slot.state = SlotState::Queued;
            slot.sent = NOT_SENT;
            slot.since = now;
            let base = index as usize * dims;
            // An element-wise copy: `copy_from_slice` calls memcpy for these few words.
            for (slot_cost, &c) in self.costs[base..base + dims].iter_mut().zip(cost) {
                *slot_cost = c;
            }
            Ticket {
                index,
                generation: slot.generation,
            }
        } else {
            let index = u32::try_from(self.slots.len()).expect("fewer than 2^32 live tickets");
            self.slots.push(Slot {
                generation: 0,
                state: SlotState::Queued,
                sent: NOT_SENT,
                since: now,
                granted_in: Epoch::default(),
            });
            self.costs.extend_from_slice(cost);
            Ticket {
                index,
                generation: 0,
            }
        }
    }

    #[inline]
    fn slot(&self, ticket: Ticket) -> Option<&Slot> {
        self.slots
            .get(ticket.index as usize)
            .filter(|s| s.generation == ticket.generation && s.state != SlotState::Free)
    }

    #[inline]
    fn is_queued(&self, ticket: Ticket) -> bool {
        self.slot(ticket)
            .is_some_and(|s| s.state == SlotState::Queued)
    }

    /// Whether `ticket` (granted) was granted before the gate last closed: the throttle
    /// set every level to what the provider has, which already wrote off its cost.
    #[inline]
    fn written_off(&self, ticket: Ticket) -> bool {
        self.slots[ticket.index as usize].granted_in < self.gate.epoch()
    }

    #[inline]
    fn check_granted(&self, ticket: Ticket) -> Result<(), TicketError> {
        match self.slot(ticket).map(|s| s.state) {
            Some(SlotState::Granted) => Ok(()),
            Some(_) => Err(TicketError::NotGranted),
            None => Err(TicketError::Unknown),
        }
    }

    #[inline]
    fn cost_base(&self, ticket: Ticket) -> usize {
        ticket.index as usize * self.buckets.len()
    }

    /// Removes a queued ticket's claim from the running sums (its queue entry, if still
    /// there, becomes stale and is skipped).
    fn unqueue(&mut self, ticket: Ticket) {
        let base = self.cost_base(ticket);
        for (d, sum) in self.queued_sum.iter_mut().enumerate() {
            *sum -= u128::from(self.costs[base + d]);
        }
        self.live_queued -= 1;
    }

    #[inline]
    fn free_slot(&mut self, ticket: Ticket) {
        let slot = &mut self.slots[ticket.index as usize];
        slot.state = SlotState::Free;
        slot.generation = slot.generation.wrapping_add(1);
        self.free.push(ticket.index);
    }

    /// Drops stale entries once they outnumber the live ones, keeping memory proportional
    /// to the live queue.
    #[inline]
    fn compact_queue(&mut self) {
        if self.queue.len() > 2 * self.live_queued + 64 {
            let slots = &self.slots;
            self.queue.retain(|t| {
                slots
                    .get(t.index as usize)
                    .is_some_and(|s| s.generation == t.generation && s.state == SlotState::Queued)
            });
        }
    }
}
