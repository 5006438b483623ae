//! What the core reports to whoever drives it: grants, refusals, throttles, refunds.

use std::time::Duration;

use crate::bucket::Rate;
use crate::gate::Epoch;
use crate::ids::Ticket;
use crate::time::Instant;

/// Something the [`Arbiter`](crate::Arbiter) did, drained with
/// [`Arbiter::poll_event`](crate::Arbiter::poll_event).
///
/// [`Event::Granted`] and [`Event::Refused`] are the ones a driver must act on (wake the
/// waiter of that ticket); the rest are for logs, metrics and plots.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Event {
    /// A reservation was granted across every dimension. `waited` is how long it queued
    /// (zero when granted on arrival).
    Granted {
        /// The reservation.
        ticket: Ticket,
        /// Time between the request and the grant.
        waited: Duration,
    },
    /// A reservation was refused up front because its wait would exceed its `max_wait`.
    Rejected {
        /// The wait that was refused.
        would_wait: Duration,
        /// The caller's limit.
        max_wait: Duration,
    },
    /// A queued waiter can never be granted and was removed; its driver must tell it.
    Refused {
        /// The waiter.
        ticket: Ticket,
        /// Why.
        reason: Refusal,
    },
    /// A queued waiter withdrew before its grant.
    Cancelled {
        /// The waiter.
        ticket: Ticket,
    },
    /// A granted reservation was reconciled against its actual cost.
    Committed {
        /// The reservation.
        ticket: Ticket,
    },
    /// A granted reservation was returned whole.
    Released {
        /// The reservation.
        ticket: Ticket,
    },
    /// A commit reported more than the arbiter trusts one reply to charge (see
    /// [`Arbiter::commit`](crate::Arbiter::commit)); it was charged `charged` instead.
    Distrusted {
        /// The reservation.
        ticket: Ticket,
        /// The dimension.
        dimension: usize,
        /// What the commit reported.
        reported: u64,
        /// What was charged.
        charged: u64,
    },
    /// A granted reservation whose request was sent was withdrawn before its outcome was
    /// known (a timeout, a dropped future, a cut reply): it stays charged as reserved.
    Abandoned {
        /// The reservation.
        ticket: Ticket,
    },
    /// A grant whose request was not sent yet was taken back and queued again (see
    /// [`Desk::requeue_unsent`](crate::Desk::requeue_unsent)).
    Requeued {
        /// The reservation, queued again under the same ticket.
        ticket: Ticket,
    },
    /// A current throttle observation closed the gate.
    Throttled {
        /// The epoch requests sent from now on carry.
        epoch: Epoch,
        /// The pause taken.
        pause: Duration,
        /// When the gate reopens.
        until: Instant,
    },
    /// Adaptive rates changed a dimension's refill rate (down on a throttle, back up as
    /// calls succeed).
    RateChanged {
        /// The dimension.
        dimension: usize,
        /// The rate before.
        from: Rate,
        /// The rate after.
        to: Rate,
    },
    /// A provider's report moved a synced dimension's level, up or down: the provider
    /// keeps the books of a dimension whose burst it lends (see [`LearnedQuota`](crate::LearnedQuota)).
    Synced {
        /// The dimension.
        dimension: usize,
        /// Level before, in permits.
        from: f64,
        /// Level after, in permits.
        to: f64,
    },
    /// A provider observation lowered a dimension's level.
    Lowered {
        /// The dimension.
        dimension: usize,
        /// Level before, in permits.
        from: f64,
        /// Level after, in permits.
        to: f64,
    },
}

/// Why a queued waiter was removed without a grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// The arbiter was aborted (a fatal failure stopped the run).
    Aborted,
    /// A dimension's capacity was lowered below the waiter's cost.
    CostExceedsCapacity {
        /// The dimension.
        dimension: usize,
    },
    /// The provider reported a quota spent: a dimension's over a longer window (a day's),
    /// or the account's (a refusal saying so).
    QuotaSpent {
        /// The dimension, when the provider named one.
        dimension: Option<usize>,
        /// How long until the provider said the quota resets, from the refusal; `None`:
        /// until someone raises it.
        resets_in: Option<Duration>,
    },
    /// A budget ([`Change::Budget`](crate::Change::Budget)) can no longer cover the
    /// waiter's cost: everything that could have been refunded to it has ended.
    BudgetSpent {
        /// The dimension.
        dimension: usize,
        /// How long until the budget renews, from the refusal.
        renews_in: Duration,
    },
}
