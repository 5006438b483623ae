//! Tests that drive the arbiter through inputs only the crate itself makes (learning's
//! direct inputs: `sync_level`, `adopt_remaining`, `observe_remaining`, `observe_limit`,
//! `stop_sync`), beside the public ones, with the same harness as the integration tests.

#[path = "../../tests/support/mod.rs"]
mod support;

mod arbiter;
mod first_alone;
mod funded;
mod inspect;
mod pause;
mod refusals;
mod reply;
mod sync;
mod usage;

use crate::arbiter::Effect;
use crate::learn::Adjust;
use crate::{
    Arbiter, FoldOutcome, Instant, InvalidLimit, ReserveError, SendStamp, Ticket, TicketError,
};
use std::time::Duration;

/// Learning's direct inputs, one adjustment at a time, as the learning policy makes them
/// ([`Arbiter::apply`]), and the desk's, as the tests name them.
pub(crate) trait Direct {
    /// Applies `adjust` to `dimension` for the report on the reply to `sent`.
    fn adjust(
        &mut self,
        d: usize,
        sent: SendStamp,
        adjust: Adjust,
        now: Instant,
    ) -> Result<FoldOutcome, InvalidLimit>;

    /// The provider's `remaining`, read as its books ([`Adjust::Sync`]).
    fn sync_level(
        &mut self,
        d: usize,
        sent: SendStamp,
        remaining: u64,
        now: Instant,
    ) -> Result<FoldOutcome, InvalidLimit> {
        self.adjust(d, sent, Adjust::Sync { remaining, slack: 0 }, now)
    }

    /// The same for a count that may stand for up to `slack` more.
    fn sync_level_within(
        &mut self,
        d: usize,
        sent: SendStamp,
        remaining: u64,
        slack: u64,
        now: Instant,
    ) -> Result<FoldOutcome, InvalidLimit> {
        self.adjust(d, sent, Adjust::Sync { remaining, slack }, now)
    }

    /// The provider's `remaining`, adopted for a limit just learned ([`Adjust::Adopt`]).
    fn adopt_remaining(
        &mut self,
        d: usize,
        sent: SendStamp,
        remaining: u64,
        now: Instant,
    ) -> Result<FoldOutcome, InvalidLimit> {
        self.adjust(d, sent, Adjust::Adopt(remaining), now)
    }

    /// The provider's `remaining`, only lowering ([`Adjust::Lower`]).
    fn observe_remaining(
        &mut self,
        d: usize,
        sent: SendStamp,
        remaining: u64,
        now: Instant,
    ) -> Result<FoldOutcome, InvalidLimit> {
        self.adjust(d, sent, Adjust::Lower(remaining), now)
    }

    /// The provider's limit ([`Adjust::ProviderLimit`]).
    fn observe_limit(&mut self, d: usize, limit: u64) -> Result<(), InvalidLimit> {
        let sent =
            SendStamp { epoch: Default::default(), seq: u64::MAX, counted_by: Instant::NEVER };
        self.adjust(d, sent, Adjust::ProviderLimit(limit), Instant::ZERO).map(drop)
    }

    /// The books handed back to the client ([`Adjust::StopSync`]).
    fn stop_sync(&mut self, d: usize) -> Result<(), InvalidLimit> {
        let sent =
            SendStamp { epoch: Default::default(), seq: u64::MAX, counted_by: Instant::NEVER };
        self.adjust(d, sent, Adjust::StopSync, Instant::ZERO).map(drop)
    }

    /// What `ticket` holds ([`crate::Desk::cost`]).
    fn cost(&mut self, ticket: Ticket) -> Option<Vec<u64>>;

    /// [`crate::Desk::estimate_drain`].
    fn estimate_drain(&mut self, more: &[u64], now: Instant) -> Result<Duration, ReserveError>;

    /// [`crate::Desk::requeue_unsent`].
    fn requeue_unsent(&mut self, ticket: Ticket, now: Instant) -> Result<(), TicketError>;

    /// [`crate::Desk::abort`].
    fn abort(&mut self, now: Instant);
}

impl Direct for Arbiter {
    fn adjust(
        &mut self,
        d: usize,
        sent: SendStamp,
        adjust: Adjust,
        now: Instant,
    ) -> Result<FoldOutcome, InvalidLimit> {
        match self.apply(d, sent, &[adjust], None, now)? {
            Effect::Folded(outcome) => Ok(outcome),
            _ => Ok(FoldOutcome::Unchanged),
        }
    }

    fn cost(&mut self, ticket: Ticket) -> Option<Vec<u64>> {
        self.desk().cost(ticket).map(<[u64]>::to_vec)
    }

    fn estimate_drain(&mut self, more: &[u64], now: Instant) -> Result<Duration, ReserveError> {
        self.desk().estimate_drain(more, now)
    }

    fn requeue_unsent(&mut self, ticket: Ticket, now: Instant) -> Result<(), TicketError> {
        self.desk().requeue_unsent(ticket, now)
    }

    fn abort(&mut self, now: Instant) {
        self.desk().abort(now)
    }
}
