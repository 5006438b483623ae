//! The adjustments a report plans ([`Adjust`]), what the policy may read of a dimension
//! ([`View`]), and the plan that keeps that view current as it decides ([`Plan`]).

use std::time::Duration;

use crate::bucket::Rate;
use crate::time::Instant;
use crate::window::WindowGuard;

/// One change the learning policy asks of a dimension, applied by the arbiter in the order
/// given. Each names what it reads from the report; the request it answers is the report's.
#[derive(Clone, Debug)]
pub(crate) enum Adjust {
    /// The provider's limit, so that its first report tells what it booked (a provider
    /// starts full).
    ProviderLimit(u64),
    /// The refill rate in force (adaptive rates return to it).
    Rate(Rate),
    /// The bucket's capacity.
    Capacity(u64),
    /// A window guard installed, seeded with the provider's count of its window, `used`.
    Guard {
        /// The cap.
        guard: WindowGuard,
        /// The provider's count when it took the request.
        used: u64,
    },
    /// The window guard removed.
    Unguard,
    /// The window guard's limit changed (the charges it holds stay).
    WindowLimit(u64),
    /// The provider keeps the books: the level follows its `remaining`, read as a floor
    /// at the least it can stand for and as a ceiling at the most (`remaining + slack`: a
    /// count rounded to the nearest thousand stands for up to 999 more than its least).
    Sync {
        /// The least the reported remaining stands for.
        remaining: u64,
        /// How much more it may stand for (0 when exact).
        slack: u64,
    },
    /// The books back with the client.
    StopSync,
    /// The level raised to what `remaining` leaves for new grants.
    Adopt(u64),
    /// The level set to the capacity less everything granted so far: for a provider
    /// documented to start full, what its bucket has left of the share the capacity is,
    /// when the limit was not known before (the client's own bucket was a placeholder).
    FullLessTaken,
    /// The level raised by this much: the capacity lent beyond the share the client's own
    /// reckoning kept, for a provider documented to start full whose counts are rounded (its
    /// reports bound its level only within a step; the client's books, which started with
    /// it full, tell it exactly).
    Shift(u64),
    /// The level lowered to what `remaining` leaves for new grants.
    Lower(u64),
    /// The provider's count of its window, to the guard.
    Used(u64),
    /// A quota over a longer window than the bucket's (a day's) is spent until then
    /// (`None`: it is not).
    Spent(Option<Instant>),
    /// From this instant on (`None`: no longer), requests go one at a time, each let past
    /// the window guard: a probe of a supposed window edge, before the window's whole
    /// limit is spent on it.
    Probe(Option<Instant>),
    /// A blind provider's fixed-window edges, newly estimated (`None`: given up), and
    /// whether the limit is the provider's own (then the bucket is whole at each edge).
    Edges {
        /// The earliest and latest instant of one edge.
        edges: Option<(Instant, Instant)>,
        /// Whether the limit in force is the provider's own, not a share below it.
        own_limit: bool,
    },
}

/// What the policy may read of a dimension's state when it folds a report.
#[derive(Clone, Copy, Debug)]
pub(crate) struct View {
    /// When the report was taken in.
    pub(crate) now: Instant,
    /// The bucket's capacity.
    pub(crate) capacity: u64,
    /// Whether a window guard stands.
    pub(crate) guarded: bool,
    /// When the request answered left, and what its own reservation cost here, if the send
    /// is still on record.
    pub(crate) send: Option<(Instant, u64)>,
    /// The longest a granted request waited to be sent so far.
    pub(crate) send_delay: Duration,
    /// Whether the reply was a throttle (the provider refused the request for its limits).
    pub(crate) throttled: bool,
}

/// The adjustments of one report as they are planned: the view, kept current as far as
/// the policy's own decisions change it (a guard installed or removed, a capacity set).
pub(super) struct Plan<'a> {
    pub(super) view: View,
    pub(super) out: &'a mut Vec<Adjust>,
}

impl Plan<'_> {
    pub(super) fn push(&mut self, adjust: Adjust) {
        match adjust {
            Adjust::Guard { .. } => self.view.guarded = true,
            Adjust::Unguard => self.view.guarded = false,
            Adjust::Capacity(capacity) => self.view.capacity = capacity,
            _ => {}
        }
        self.out.push(adjust);
    }

    /// Caps each trailing `window` at `limit`, seeded with the provider's count `used`;
    /// `false` if no guard of that limit can be made.
    pub(super) fn guard(&mut self, limit: u64, window: Duration, used: u64) -> bool {
        match WindowGuard::new(limit, window) {
            Ok(guard) => {
                self.push(Adjust::Guard { guard, used });
                true
            }
            Err(_) => false,
        }
    }

    /// Removes the guard, if one stands.
    pub(super) fn unguard(&mut self) {
        if self.view.guarded {
            self.push(Adjust::Unguard);
        }
    }
}
