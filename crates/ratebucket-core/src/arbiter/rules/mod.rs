//! The rules a reservation passes beside the dimensions' buckets, the questions each
//! answers ([`Rule`]) and the one order they are asked in ([`Rules`]).
//!
//! A rule owns its state and answers, for a reservation's cost and caller at `now`: may it
//! go now, must it queue, wait apart (park) or be refused (never, or not yet); when could
//! the queue's head go; what a grant, an end and a throttle do to it; and whether it has
//! nothing to say (idle: the hot paths and the express lane skip it). The arbiter asks
//! every rule the same questions, in the order of [`Rules`]' fields; the next kind of
//! limit is one more type here, not one more flag in the arbiter.

use std::time::Duration;

mod alone;
mod budget;
mod cap;
mod concurrency;
mod ramp;
mod spent;

pub use budget::{Budget, Period};
pub use ramp::Ramp;

use crate::arbiter::dims::Dims;
use crate::arbiter::error::ReserveError;
use crate::arbiter::fair::Caller;
use crate::arbiter::tickets::Tickets;
use crate::books::Books;
use crate::ids::Ticket;
use crate::time::Instant;
use alone::{FirstAlone, Probe};
use budget::Budgets;
use cap::Caps;
use concurrency::Concurrency;
use ramp::Ramps;
use spent::Spent;

/// A reservation as the rules see it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Ask<'a> {
    /// What it costs, one entry per dimension (raised by a learned charge once granted).
    pub(super) cost: &'a [u64],
    /// What its caller reserved, before any learned charge.
    pub(super) estimate: &'a [u64],
    /// Who it is for.
    pub(super) caller: Caller,
    /// On arrival, how long its caller may wait (`None`: as long as it takes).
    pub(super) max_wait: Option<Duration>,
}

impl<'a> Ask<'a> {
    /// Live `ticket`'s reservation, as queued (no wait to bound).
    #[inline]
    pub(super) fn of(tickets: &'a Tickets, ticket: Ticket) -> Ask<'a> {
        let (cost, estimate) = (tickets.cost(ticket), tickets.estimate(ticket));
        Ask { cost, estimate, caller: tickets.slot(ticket).caller(), max_wait: None }
    }
}

/// What the rules may read of the rest of the arbiter.
#[derive(Clone, Copy)]
pub(super) struct Ctx<'a> {
    /// The dimensions: rates, capacities, levels.
    pub(super) dims: &'a Dims,
    /// What was granted, sent and settled.
    pub(super) books: &'a Books,
    /// Every live reservation.
    pub(super) tickets: &'a Tickets,
}

impl Ctx<'_> {
    /// Reservations granted and not yet ended: requests in flight, or about to be.
    pub(super) fn in_flight(&self) -> usize {
        self.tickets.granted_count()
    }
}

/// A rule's answer to a reservation arriving.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Admission {
    /// Nothing here stops it going now.
    Admit,
    /// It must wait its turn in the queue.
    Queue,
    /// It must wait apart, outside the queue, until this rule lets it in (see `cap.rs`).
    Park,
    /// It is refused: never, or not before the error says.
    Refuse(ReserveError),
}

impl Admission {
    /// The stronger of two answers: a refusal over waiting apart over queueing over going.
    fn and(self, other: Admission) -> Admission {
        use Admission::*;
        match (self, other) {
            (Refuse(e), _) | (_, Refuse(e)) => Refuse(e),
            (Park, _) | (_, Park) => Park,
            (Queue, _) | (_, Queue) => Queue,
            (Admit, Admit) => Admit,
        }
    }
}

/// How a granted reservation ended, for the rules that follow it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Ended {
    /// The provider answered and counted it.
    Answered,
    /// It was returned whole, or kept charged with its outcome unknown.
    Returned,
    /// Refused for requests in flight (a concurrency limit).
    Crowded,
    /// Taken back before its request was sent, to queue again.
    Requeued,
}

/// The questions every rule answers (see the module docs). Every method but
/// [`Rule::idle`] has a default that says nothing.
pub(super) trait Rule {
    /// Whether it has nothing to say now: the hot paths skip it, and the express lane may
    /// lease only while every rule is idle.
    fn idle(&self) -> bool;

    /// A reservation arriving at `now`: may it go, as far as this rule goes?
    fn admit(&mut self, _ask: &Ask<'_>, _ctx: &Ctx<'_>, _now: Instant) -> Admission {
        Admission::Admit
    }

    /// How long an arriving reservation this rule parks would wait apart, at least (for a
    /// caller's most wait).
    fn wait(&mut self, _ask: &Ask<'_>, _ctx: &Ctx<'_>, _now: Instant) -> Duration {
        Duration::ZERO
    }

    /// The soonest the queue's head could go, as far as this rule goes: `Some(now)` (or
    /// earlier) when it may go now, `None` when only an event (a reply, an end) lets it.
    fn ready(&self, _ask: &Ask<'_>, _ctx: &Ctx<'_>, now: Instant) -> Option<Instant> {
        Some(now)
    }

    /// A reservation entered the queue (`entered`) or left it ungranted.
    fn queued(&mut self, _ask: &Ask<'_>, _entered: bool) {}

    /// A reservation was granted at `now` (`queued`: from the queue, not on arrival).
    fn granted(&mut self, _ask: &Ask<'_>, _queued: bool, _now: Instant) {}

    /// A granted reservation ended at `now`, `how`, having used `used` (`None`: nothing);
    /// `in_flight` is how many are granted and not yet ended without it.
    fn ended(
        &mut self,
        _ask: &Ask<'_>,
        _how: Ended,
        _used: Option<&[u64]>,
        _in_flight: usize,
        _now: Instant,
    ) {
    }

    /// A throttle closed the pool's gate until `until`.
    fn throttled(&mut self, _until: Instant, _now: Instant) {}
}

/// The earlier of two instants, either of which may be missing.
pub(super) fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The later of two readiness instants (`None`, waiting for an event, is the latest).
pub(super) fn later(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    Some(a?.max(b?))
}

/// Every rule, in the order the arbiter asks them: a spent quota and a budget refuse
/// before anything else is asked; a tenant's cap decides whether a reservation waits
/// apart; the first request alone and a window-edge probe let one request out at a time;
/// concurrency bounds the requests in flight; a ramp bounds how fast the admitted rate
/// rises. The dimensions' buckets and guards are asked after them all.
#[derive(Clone, Debug, Default)]
pub(super) struct Rules {
    /// Quotas the provider reported spent ([`Spent`]).
    pub(super) spent: Spent,
    /// Allowances per period ([`Budgets`]).
    pub(super) budgets: Budgets,
    /// Tenants' caps ([`Caps`]).
    pub(super) caps: Caps,
    /// The first request alone ([`FirstAlone`]).
    pub(super) first: FirstAlone,
    /// A supposed window edge probed one request at a time ([`Probe`]).
    pub(super) probe: Probe,
    /// Requests in flight ([`Concurrency`]).
    pub(super) concurrency: Concurrency,
    /// How fast the admitted rate rises ([`Ramps`]).
    pub(super) ramps: Ramps,
}

impl Rules {
    /// Rules for an arbiter of `dims` dimensions.
    pub(super) fn new(dims: usize, first_alone: bool, concurrency: Option<u32>) -> Rules {
        Rules {
            spent: Spent::new(dims),
            first: FirstAlone::new(first_alone),
            concurrency: Concurrency::new(concurrency),
            ramps: Ramps::new(dims),
            ..Rules::default()
        }
    }

    /// Whether every rule is idle.
    #[inline]
    pub(super) fn idle(&self) -> bool {
        self.spent.idle()
            && self.budgets.idle()
            && self.caps.idle()
            && self.first.idle()
            && self.probe.idle()
            && self.concurrency.idle()
            && self.ramps.idle()
    }

    /// Every rule's answer to `ask` arriving, the strongest kept: the first refusal, in
    /// order, is the answer.
    pub(super) fn admit(&mut self, ask: &Ask<'_>, ctx: &Ctx<'_>, now: Instant) -> Admission {
        let refused = |answer: &Admission| matches!(answer, Admission::Refuse(_));
        let mut answer = self.budgets.admit(ask, ctx, now);
        if !refused(&answer) {
            answer = answer.and(self.spent.admit(ask, ctx, now));
        }
        if !refused(&answer) {
            answer = answer.and(self.caps.admit(ask, ctx, now));
        }
        if refused(&answer) {
            return answer;
        }
        answer
            .and(self.first.admit(ask, ctx, now))
            .and(self.probe.admit(ask, ctx, now))
            .and(self.concurrency.admit(ask, ctx, now))
            .and(self.ramps.admit(ask, ctx, now))
    }

    /// The soonest the queue's head could go as far as every rule goes (`None`: only an
    /// event lets it).
    pub(super) fn ready(&self, ask: &Ask<'_>, ctx: &Ctx<'_>, now: Instant) -> Option<Instant> {
        let mut at = Some(now);
        if !self.spent.idle() {
            at = later(at, self.spent.ready(ask, ctx, now));
        }
        at = later(at, self.first.ready(ask, ctx, now));
        at = later(at, self.probe.ready(ask, ctx, now));
        at = later(at, self.concurrency.ready(ask, ctx, now));
        later(at, self.ramps.ready(ask, ctx, now))
    }

    /// How long an arriving reservation the rules park would wait apart, at least.
    pub(super) fn wait(&mut self, ask: &Ask<'_>, ctx: &Ctx<'_>, now: Instant) -> Duration {
        match self.caps.idle() {
            true => Duration::ZERO,
            false => self.caps.wait(ask, ctx, now),
        }
    }

    /// A reservation entered the queue, or left it ungranted.
    #[inline]
    pub(super) fn queued(&mut self, ask: &Ask<'_>, entered: bool) {
        if !self.caps.idle() {
            self.caps.queued(ask, entered);
        }
    }

    /// A reservation was granted (`queued`: from the queue).
    #[inline]
    pub(super) fn granted(&mut self, ask: &Ask<'_>, queued: bool, now: Instant) {
        if !self.caps.idle() {
            self.caps.granted(ask, queued, now);
        }
        if !self.ramps.idle() {
            self.ramps.granted(ask, queued, now);
        }
    }

    /// A granted reservation ended, `how`, having used `used`, leaving `in_flight`.
    #[inline]
    pub(super) fn ended(
        &mut self,
        ask: &Ask<'_>,
        how: Ended,
        used: Option<&[u64]>,
        in_flight: usize,
        now: Instant,
    ) {
        if !self.caps.idle() {
            self.caps.ended(ask, how, used, in_flight, now);
        }
        if how != Ended::Requeued {
            self.first.ended(ask, how, used, in_flight, now);
        }
        self.concurrency.ended(ask, how, used, in_flight, now);
    }

    /// A throttle closed the gate until `until`.
    pub(super) fn throttled(&mut self, until: Instant, now: Instant) {
        self.ramps.throttled(until, now);
    }
}
