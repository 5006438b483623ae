//! The multi-dimension arbiter: a FIFO queue granted atomically across every bucket.
//!
//! One concern per file, each an `impl Arbiter` block over the state declared here. The
//! public surface is 24 methods: three events (a reservation, a send, a reply), the pause,
//! the sans-IO loop, queries, one way to change a dimension, and the express lane's desk.
//!
//! | file | concern | public |
//! |---|---|---|
//! | `mod.rs` | the state, the sans-IO loop | `new`, `status` ([`Status`]), `state`, `handle_timeout`, `poll_timeout`, `poll_event` |
//! | `tickets.rs` | the ticket slab | [`Ticket`], `cost`; slot allocation and lookup |
//! | `order.rs` | the queue's order | [`Queue`](order::Queue): entries sorted by key, stale ones skipped and compacted, the sums they ask |
//! | `queue.rs` | reserving and granting | `reserve`, `reserve_within`, `reserve_for`; validation, wait estimates, granting the head, backfilling |
//! | `fair.rs` | who a reservation is for, and the order that follows | [`Caller`] ([`Tenant`], [`Priority`]), `set_weight`, `tenant` ([`TenantSnapshot`]), `tenants`: weighted fair share over the dominant dimension, classes that age |
//! | `reservations.rs` | ending reservations with no reply to tell | `cancel`, `commit` (within [`MAX_CHARGE_FACTOR`]), `release`, `requeue_unsent` |
//! | `sync.rs` | sends, and the level against the provider's reports | [`SendStamp`], `stamp_send`, `stamp_send_if_open`; syncing, adopting and lowering the level; the charge the provider books |
//! | `reply.rs` | a reply, one input | `reply` ([`Reply`]: how the reservation ends ([`Settle`]), the quota [`Report`]s; one grant pass) |
//! | `learn.rs` | the learning policy's seat | `observe_quota` ([`QuotaReport`]): the policy (`crate::learn`) reads each report and returns adjustments, applied here at once |
//! | `pause.rs` | the pool-wide pause | `throttle`, `resume`, `abort` |
//! | `change.rs` | changing a dimension | `change` ([`Change`]: rate, capacity, window guard, learning policy, funds, budget) |
//! | `cap.rs` | per-tenant caps | `set_cap`: a tenant's most of each limit; what its cap cannot take waits apart (parked), never ahead of others |
//! | `budget.rs` | budgets | [`Budget`] ([`Period`]): an allowance per day, month or period, renewed whole, refusing at once what it cannot cover |
//! | `adapt.rs` | rates, capacities and funds | the decrease on a throttle and the time-based climb back ([`Adapt`]) |
//! | `usage.rs` | what replies used against what was reserved | the high ratio reservations are lowered to when the provider charges usage ([`ArbiterConfig::reserve_usage`]) |
//! | `guard.rs` | the trailing-window guard | its seed, its limit and the provider's count of it, fed by learning |
//! | `inspect.rs` | introspection | `snapshot` ([`ArbiterSnapshot`]), `dimension` ([`DimensionSnapshot`]: level, rates, capacity, window cap, charge, what was learned), `estimate_drain` |
//! | `lane.rs` | the express lane's lease | `lane` ([`LaneDesk`]: `lease` ([`Lease`]), `give_back`, `end_grant`, `adopt_grant`): permits lent out of the buckets under a lowered ceiling |
//! | `config.rs`, `error.rs` | settings and errors | [`ArbiterConfig`], [`Adapt`], [`ReserveError`], [`TicketError`], [`TicketState`] |

use core::fmt;
use std::collections::VecDeque;
use std::time::Duration;

use crate::books::Books;
use crate::bucket::{InvalidLimit, Rate, TokenBucket};
use crate::event::{Event, Refusal};
use crate::gate::{Epoch, Gate, GateConfig, ThrottleOutcome};
use crate::learn::{Adjust, LearnedQuota, QuotaPolicy, QuotaReport};
use crate::time::{Instant, Monotonic};
use crate::window::WindowGuard;

mod adapt;
mod budget;
mod cap;
mod change;
mod config;
mod dimension;
mod error;
mod fair;
mod guard;
mod inspect;
mod lane;
mod learn;
mod order;
mod pause;
mod queue;
mod reply;
mod reservations;
mod sync;
mod tickets;
mod usage;

pub use crate::ids::{SendStamp, Ticket};
pub use budget::{Budget, Period};
pub use change::Change;
pub use config::{Adapt, ArbiterConfig};
use dimension::Dimension;
pub use error::{ReserveError, TicketError, TicketState};
use fair::Fair;
pub use fair::{Caller, MAX_WEIGHT, Priority, Tenant, TenantSnapshot, UnknownPriority};
pub use inspect::{ArbiterSnapshot, DimensionSnapshot, Reported};
pub use lane::{LaneDesk, Lease, MAX_LANE_DIMENSIONS};
use order::Queue;
pub use reply::{Replied, Reply, Report, Settle};
pub use reservations::MAX_CHARGE_FACTOR;
#[cfg(test)]
pub(crate) use sync::FoldOutcome;
use tickets::{NOT_SENT, Slot, SlotState, Tickets};

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
    /// One per limit, in the order costs name them.
    dims: Vec<Dimension>,
    /// Every reservation not yet ended, with its cost.
    tickets: Tickets,
    /// The waiting reservations, in order.
    queue: Queue,
    gate: Gate,
    events: VecDeque<Event>,
    clock: Monotonic,
    aborted: bool,
    next_seq: u64,
    /// Grants, settlements and sends, to read a provider's reports against.
    books: Books,
    /// Whether one input's steps are being taken in (a [`Arbiter::reply`], or the
    /// adjustments of one report): no grant is made until it ends.
    replying: bool,
    /// While a throttled reply's reports are folded: they tell the learning policy so.
    throttled_reply: bool,
    /// The learning policy's adjustments for the report being folded (kept to reuse).
    adjustments: Vec<Adjust>,
    /// Whether any dimension has a guard (the hot paths skip them otherwise).
    guarded: bool,
    /// Whether any dimension is climbing back after a throttle.
    recovering: bool,
    /// Whether the account's quota, or any dimension's over a longer window, is reported
    /// spent (the hot paths skip the check otherwise).
    quota_spent: bool,
    /// The account's quota, spent as a refusal said ([`Settle::Spent`]).
    spent: Option<pause::Spent>,
    /// Whether any dimension has learned that the provider books more than is reserved
    /// (the hot paths skip the booking otherwise).
    charging: bool,
    /// Whether the first reservation still goes alone ([`ArbiterConfig::first_alone`]).
    first_alone: bool,
    /// From when reservations go one at a time, each let past the window guard, while
    /// learning probes a supposed window edge (`Adjust::Probe`).
    probe_from: Option<Instant>,
    /// The longest a granted request waited to be sent (grant to its stamp).
    send_delay: Duration,
    /// Whether permits are leased to an express lane ([`LaneDesk::lease`]).
    leased: bool,
    /// Tenants' shares and the classes' order among reservations that queue.
    fair: Fair,
    /// Reservations made so far (each one's arrival number).
    arrivals: u64,
    /// Whether any dimension is a budget ([`Change::Budget`]; the hot paths skip them
    /// otherwise).
    budgeted: bool,
    /// Tenants' caps ([`Arbiter::set_cap`]).
    caps: std::collections::HashMap<Tenant, cap::Cap>,
    /// Whether any tenant is capped (the hot paths skip caps otherwise).
    capped: bool,
}

/// The earlier of two instants, either of which may be missing.
fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Where an arbiter stands as a whole ([`Arbiter::status`]).
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct Status {
    /// The number of dimensions.
    pub dimensions: usize,
    /// Waiters still queued.
    pub queued: usize,
    /// The gate (epoch and pause).
    pub gate: Gate,
    /// Whether [`Arbiter::abort`] was called.
    pub aborted: bool,
    /// Whether a refusal reported the account's quota spent ([`Settle::Spent`]): every
    /// reservation is refused until it resets, or until [`Arbiter::resume`].
    pub spent: bool,
    /// Whether permits are leased to an express lane ([`LaneDesk::lease`]) and not yet
    /// given back.
    pub lane_leased: bool,
    /// Whether a lease ([`LaneDesk::lease`]) could be made but for the time: nothing that
    /// needs the arbiter's order (a queue, a reply being folded, learning that reads the
    /// books, a window cap, a dimension beyond a plain bucket, an abort) stands in the
    /// way. A runtime skips reading its clock for a lease while it is `false`.
    pub lane_may_lease: bool,
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
        let count = buckets.len();
        let books = Books::new(count);
        Ok(Arbiter {
            config,
            dims: buckets.into_iter().map(Dimension::new).collect(),
            tickets: Tickets::new(count),
            queue: Queue::new(count),
            gate: Gate::new(config.gate),
            events: VecDeque::new(),
            clock: Monotonic::new(now),
            aborted: false,
            next_seq: 0,
            books,
            replying: false,
            throttled_reply: false,
            adjustments: Vec::new(),
            guarded: false,
            recovering: false,
            charging: false,
            first_alone: config.first_alone,
            quota_spent: false,
            spent: None,
            probe_from: None,
            send_delay: Duration::ZERO,
            leased: false,
            fair: Fair::default(),
            arrivals: 0,
            budgeted: false,
            caps: std::collections::HashMap::new(),
            capped: false,
        })
    }

    /// Where the arbiter stands as a whole: cheap enough to ask on every call.
    pub fn status(&self) -> Status {
        Status {
            dimensions: self.dims.len(),
            queued: self.queue.live(),
            gate: self.gate,
            aborted: self.aborted,
            spent: self.spent.is_some(),
            lane_leased: self.leased,
            lane_may_lease: self.lane_may_open_in_time(),
        }
    }

    /// `dimension`'s state, or [`InvalidLimit::NoSuchDimension`].
    fn dimension_mut(&mut self, dimension: usize) -> Result<&mut Dimension, InvalidLimit> {
        self.dims.get_mut(dimension).ok_or(InvalidLimit::NoSuchDimension(dimension))
    }

    /// Where `ticket` stands, or `None` if its reservation has ended.
    #[inline]
    pub fn state(&self, ticket: Ticket) -> Option<TicketState> {
        match self.slot(ticket)?.state {
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

    /// When the next grant (or the gate's reopening) can happen, if anything is waiting
    /// for time (not for a reply: while one request goes alone, none).
    pub fn poll_timeout(&self) -> Option<Instant> {
        let now = self.clock.at_least(Instant::ZERO);
        let gate = self.gate.reopens_at(now);
        // A quota spent until an instant holds grants as a closed gate does.
        let gate = match self.spent {
            Some(spent) => match spent.until {
                Some(until) => Some(gate.map_or(until, |g| g.max(until))),
                None => return None,
            },
            None => gate,
        };
        // A reservation waiting under its tenant's cap enters the queue when it has room.
        let parked = if self.capped { self.cap_ready_at(now) } else { None };
        let Some(head) = self.queue.first(&self.tickets) else {
            return earliest(gate, parked);
        };
        if self.alone_blocks() {
            // The next grant waits for a reply, not for time.
            return earliest(gate, parked);
        }
        let ready = self.ready_at(head, now);
        earliest(Some(gate.map_or(ready, |g| g.max(ready))), parked)
    }

    /// The next event, if any. Drain after every input.
    #[inline]
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Grants the head for as long as it fits, then backfills if configured.
    #[inline]
    fn drive(&mut self, now: Instant) {
        if self.budgeted {
            self.renew_budgets(now);
        }
        if self.capped {
            self.release_parked(now);
        }
        if self.recovering {
            self.recover(now);
        } else if self.queue.is_empty() {
            // Nothing waits (the commonest case, after a grant on arrival ends).
            return;
        }
        if self.aborted || self.replying || !self.gate.is_open(now) || self.spent_holds(now) {
            return;
        }
        while let Some(head) = self.head() {
            if self.alone_blocks() {
                break;
            }
            let dims = self.dims.len();
            let head_fits =
                (0..dims).all(|d| self.fits(d, self.booked(d, self.tickets.cost_in(head, d)), now));
            if !head_fits {
                if self.budgeted && self.refuse_unaffordable(now) {
                    continue;
                }
                break;
            }
            self.queue.pop_front();
            self.grant(head, now);
        }
        if self.config.backfill && self.queue.live() > 1 && !self.alone_blocks() {
            self.backfill(now);
        }
        self.queue.compact(&self.tickets);
    }
}
