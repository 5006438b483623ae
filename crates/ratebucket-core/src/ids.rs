//! The ids the arbiter hands out: [`Ticket`]s for reservations and [`SendStamp`]s for
//! sends. A leaf module, so that events and observations can name them without reaching
//! into the arbiter.

use core::fmt;

use crate::gate::Epoch;
use crate::time::Instant;

/// Identifies one reservation, queued or granted.
///
/// Generational: once a ticket's reservation ends, its slot may be reused, but the old
/// ticket stays dead (a reused slot carries a new generation), so a late `cancel` or a
/// double `commit` can never touch someone else's reservation.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ticket {
    pub(crate) index: u32,
    pub(crate) generation: u32,
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
///
/// Opaque: only the arbiter makes them (`stamp_send*`), so an observation can only be
/// stamped with a send that happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SendStamp {
    /// The gate epoch the request was sent in (for throttle observations).
    pub(crate) epoch: Epoch,
    /// A send sequence number, increasing with every stamp (for header observations).
    pub(crate) seq: u64,
    /// The latest instant the provider can have counted the request, if its reply said
    /// ([`SendStamp::counted_by`]); [`Instant::NEVER`] otherwise.
    pub(crate) counted_by: Instant,
}

impl SendStamp {
    /// The gate epoch the request was sent in: a throttle its reply reports closes the
    /// gate only if no later closure already covers it.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// The send's sequence number: later sends have larger ones.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The same send, known to have been counted by the provider at `at` at the latest:
    /// the reply was read at `at` plus the time the provider says it spent on the request
    /// (OpenAI's `openai-processing-ms`), which began once the request was counted.
    ///
    /// A report on the reply then says more ([`Arbiter::observe_quota`](crate::Arbiter::observe_quota)):
    /// what refilled since `at` is the provider's, and a reservation whose request was
    /// counted before this one was sent is already in its `remaining`, where without it
    /// every reservation live at this send is read as possibly not counted yet. An instant
    /// before the send cannot be true and is not believed (the reply says nothing then);
    /// one after the report is folded is taken as that instant.
    #[must_use]
    pub fn counted_by(self, at: Instant) -> SendStamp {
        SendStamp { counted_by: at, ..self }
    }

    /// The latest instant the provider can have counted the request, if known
    /// ([`SendStamp::counted_by`]).
    pub fn counted_at_latest(&self) -> Option<Instant> {
        (!self.counted_by.is_never()).then_some(self.counted_by)
    }
}
