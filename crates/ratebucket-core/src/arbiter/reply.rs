//! The reply: one input for everything a provider's answer says about a request.

use std::time::Duration;

use super::error::TicketError;
use crate::bucket::InvalidLimit;
use crate::gate::ThrottleOutcome;
use crate::ids::SendStamp;
use crate::learn::QuotaReport;

/// How a reply ends the reservation of the request it answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settle<'a> {
    /// The provider answered and counted the request: reconcile the reservation against
    /// `actual` (one entry per dimension), as [`Arbiter::commit`](crate::Arbiter::commit) does.
    Charge(&'a [u64]),
    /// The provider answered that it did not count the request (a 4xx refusal, a 5xx):
    /// the reservation is returned whole, as [`Arbiter::release`](crate::Arbiter::release) does.
    Return,
    /// Nobody knows whether the provider counted it (a reset, a timeout, a cut body): it
    /// stays charged as reserved, as [`Arbiter::cancel`](crate::Arbiter::cancel) does for a sent request.
    Keep,
    /// The provider throttled it (a 429): the gate closes once for its wave, honouring
    /// `retry_after` ([`Arbiter::throttle`](crate::Arbiter::throttle)), then the reservation is returned. A request
    /// that went alone to probe a supposed window edge (see the learning policy) closes no
    /// gate: its refusal only refutes the edge.
    Throttled {
        /// The provider's wait, if it named one.
        retry_after: Option<Duration>,
    },
    /// The provider refused it for requests in flight (a concurrency limit: "Concurrency
    /// limit exceeded"), not for a rate: nothing pauses; the reservation is returned and a
    /// concurrency limit learned from the refusal ([`ArbiterConfig::max_in_flight`]), so
    /// fewer go at once.
    ///
    /// [`ArbiterConfig::max_in_flight`]: crate::ArbiterConfig::max_in_flight
    Crowded {
        /// The provider's wait, if it named one (the request's own; the pool keeps going).
        retry_after: Option<Duration>,
    },
    /// A failure no retry fixes (a revoked key, no permission): the run aborts
    /// ([`Desk::abort`](crate::Desk::abort)), then the reservation is returned.
    Fatal,
    /// The provider refused it because a quota is spent (a spend cap, a usage limit, a
    /// wait of hours or days): every waiter is refused and every reservation until the
    /// reset fails at once with [`ReserveError::QuotaSpent`](crate::ReserveError::QuotaSpent) (unless its `max_wait`
    /// reaches the reset), then the reservation is returned. Spent with no reset, it
    /// stays so until [`Arbiter::resume`](crate::Arbiter::resume).
    Spent {
        /// How long until the quota resets, as the provider said; `None`: until someone
        /// raises it.
        resets_in: Option<Duration>,
        /// The dimension the refusal named, if any.
        dimension: Option<usize>,
    },
}

/// What the provider reported of one dimension's quota in a reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Report {
    /// The arbiter's dimension the quota describes.
    pub dimension: usize,
    /// What the provider said of it.
    pub quota: QuotaReport,
}

/// A provider's answer to one request, whole: how it ends the reservation and what the
/// provider reported of its quotas. [`Arbiter::reply`](crate::Arbiter::reply) takes it as one input.
#[derive(Clone, Copy, Debug)]
pub struct Reply<'a> {
    /// The stamp the request was sent with ([`Arbiter::stamp_send_if_open`](crate::Arbiter::stamp_send_if_open)).
    pub sent: SendStamp,
    /// How the reservation ends.
    pub settle: Settle<'a>,
    /// The quota reports the reply carried, each folded by [`Arbiter::observe_quota`](crate::Arbiter::observe_quota).
    pub reports: &'a [Report],
}

/// What [`Arbiter::reply`](crate::Arbiter::reply) did.
#[derive(Clone, Copy, Debug, PartialEq)]
#[must_use]
pub struct Replied {
    /// How the reservation ended: an error when the ticket was not a granted reservation,
    /// or when a charge named the wrong number of dimensions (the reservation is then
    /// withdrawn as if dropped, charged as reserved).
    pub settled: Result<(), TicketError>,
    /// For [`Settle::Throttled`], what the throttle did to the gate.
    pub throttle: Option<ThrottleOutcome>,
    /// The first report naming a dimension the arbiter lacks (it was skipped; the rest
    /// were folded).
    pub bad_report: Option<InvalidLimit>,
}
