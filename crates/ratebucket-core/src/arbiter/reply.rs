//! The reply: one input for everything a provider's answer says about a request.

use super::*;

/// How a reply ends the reservation of the request it answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settle<'a> {
    /// The provider answered and counted the request: reconcile the reservation against
    /// `actual` (one entry per dimension), as [`Arbiter::commit`] does.
    Charge(&'a [u64]),
    /// The provider answered that it did not count the request (a 4xx refusal, a 5xx):
    /// the reservation is returned whole, as [`Arbiter::release`] does.
    Return,
    /// Nobody knows whether the provider counted it (a reset, a timeout, a cut body): it
    /// stays charged as reserved, as [`Arbiter::cancel`] does for a sent request.
    Keep,
    /// The provider throttled it (a 429): the gate closes once for its wave, honouring
    /// `retry_after` ([`Arbiter::throttle`]), then the reservation is returned. A request
    /// that went alone to probe a supposed window edge (see the learning policy) closes no
    /// gate: its refusal only refutes the edge.
    Throttled {
        /// The provider's wait, if it named one.
        retry_after: Option<Duration>,
    },
    /// A failure no retry fixes (a revoked key, no permission): the run aborts
    /// ([`Arbiter::abort`]), then the reservation is returned.
    Fatal,
    /// The provider refused it because a quota is spent (a spend cap, a usage limit, a
    /// wait of hours or days): every waiter is refused and every reservation until the
    /// reset fails at once with [`ReserveError::QuotaSpent`] (unless its `max_wait`
    /// reaches the reset), then the reservation is returned. Spent with no reset, it
    /// stays so until [`Arbiter::resume`].
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
/// provider reported of its quotas. [`Arbiter::reply`] takes it as one input.
#[derive(Clone, Copy, Debug)]
pub struct Reply<'a> {
    /// The stamp the request was sent with ([`Arbiter::stamp_send_if_open`]).
    pub sent: SendStamp,
    /// How the reservation ends.
    pub settle: Settle<'a>,
    /// The quota reports the reply carried, each folded by [`Arbiter::observe_quota`].
    pub reports: &'a [Report],
}

/// What [`Arbiter::reply`] did.
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

impl Arbiter {
    /// Whether the request stamped `sent` left while requests went one at a time to probe
    /// a supposed window edge.
    fn probed(&self, sent: SendStamp) -> bool {
        self.probe_from
            .is_some_and(|from| self.books.sent_at(sent.seq).is_some_and(|at| at >= from))
    }

    /// Takes a provider's answer to the request of `ticket` as one input: the throttle or
    /// abort it calls for, the end of the reservation, and every quota report, in that
    /// order, then one grant pass.
    ///
    /// Nobody is granted between the steps: a refund a charge makes reaches the next
    /// waiter only after the provider's own count (which may not honour it, when it
    /// charges the requested maximum) has been folded, and a throttle closes the gate
    /// before its reservation's return could launch another request into the same wave.
    pub fn reply(&mut self, ticket: Ticket, reply: &Reply<'_>, now: Instant) -> Replied {
        let now = self.clock.advance(now);
        self.replying = true;
        // Before the reservation ends: a later report reads this one as counted first only
        // once it knows by when it was.
        self.note_counted(reply.sent, now);
        let probed = matches!(reply.settle, Settle::Throttled { .. }) && self.probed(reply.sent);
        let throttle = match reply.settle {
            // A probe of a supposed window edge went alone: its refusal refutes the edge
            // (the learning policy reads it below), not a wave the pool must wait out.
            Settle::Throttled { .. } if probed => None,
            Settle::Throttled { retry_after } => Some(self.throttle(reply.sent, retry_after, now)),
            Settle::Fatal => {
                self.abort(now);
                None
            }
            Settle::Spent { resets_in, dimension } => {
                self.spend(resets_in, dimension, now);
                None
            }
            _ => None,
        };
        let settled = match reply.settle {
            Settle::Charge(actual) => self.commit(ticket, actual, now),
            Settle::Keep => self.check_granted(ticket).map(|()| {
                self.cancel(ticket, now);
            }),
            // The provider did not count a probe it refused: the guard holds nothing for it.
            Settle::Throttled { .. } if probed => self.release_counted(ticket, false, now),
            Settle::Return | Settle::Throttled { .. } | Settle::Fatal | Settle::Spent { .. } => {
                self.release(ticket, now)
            }
        };
        if settled.is_err() {
            // Not a granted reservation, or a charge of the wrong shape: withdrawn as if
            // dropped, so nothing is left behind.
            self.cancel(ticket, now);
        }
        let mut bad_report = None;
        self.throttled_reply = matches!(reply.settle, Settle::Throttled { .. });
        for report in reply.reports {
            if let Err(e) = self.observe_quota(report.dimension, reply.sent, report.quota, now) {
                bad_report.get_or_insert(e);
            }
        }
        self.throttled_reply = false;
        self.replying = false;
        self.drive(now);
        Replied { settled, throttle, bad_report }
    }
}
