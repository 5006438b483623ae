//! One dimension of the arbiter: its bucket and everything kept per limit.

use super::*;
use crate::learn::Learner;

/// Everything the arbiter keeps for one limit.
#[derive(Clone, Debug)]
pub(super) struct Dimension {
    /// The bucket grants are taken from.
    pub(super) bucket: TokenBucket,
    /// The rate the user configured: the ceiling adaptive rates return to.
    pub(super) configured: Rate,
    /// The sum of the queued costs (for wait estimates).
    pub(super) queued: u128,
    /// The newest send sequence whose observation was applied.
    pub(super) newest_observed: Option<u64>,
    /// Whether the provider keeps the books: after a sync, commits and releases no longer
    /// move the level, the next sync does.
    pub(super) ledger: bool,
    /// An optional cap on what a trailing window may hold.
    pub(super) guard: Option<WindowGuard>,
    /// After a throttle: the rate (per second) that met it, the rate the climb back starts
    /// from, and when it starts (the pause's end).
    pub(super) recovery: Option<Recovery>,
    /// What the provider books per unit the client reserves, learned from its reports.
    pub(super) charge: Charge,
    /// Whether a report of the provider's was folded for it yet.
    pub(super) reported: bool,
    /// What it learns from the provider's reports, once given a policy
    /// ([`Change::Policy`]).
    pub(super) learner: Option<Box<Learner>>,
    /// What seeding the window guard held for the requests that left before it existed,
    /// until their reports show how much of it the provider really counts.
    pub(super) seed: Option<Seed>,
    /// For a provider counting in fixed windows whose edges are known, and a limit that is
    /// the provider's own (not a share below it): the bucket is full again at each edge,
    /// as the provider is. The value is the last edge it was refilled at.
    pub(super) edge_refill: Option<Instant>,
    /// Whole permits lent to an express lane ([`LaneDesk::lease`]), until returned.
    pub(super) lent: u64,
}

/// A window guard's seed (see [`Arbiter::seed_window_guard`]): the sends before `next_seq`
/// left before the guard existed, so their reports can only be checked against it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Seed {
    /// The books' settled total when the guard was seeded.
    pub(super) settled: u64,
    /// The first send made with the guard in place.
    pub(super) next_seq: u64,
    /// What the seed still holds.
    pub(super) held: u64,
}

/// The provider's booked charge against the client's reservations, learned from the
/// `remaining` it reports (see [`Arbiter::charge_factor`]).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Charge {
    /// The running estimate of booked / reserved; `None` until a sample came.
    pub(super) factor: Option<f64>,
    /// What the provider took and what the client reserved over the intervals sampled,
    /// older ones fading.
    pub(super) taken: f64,
    pub(super) reserved: f64,
    /// The provider's limit, when it said: before the first send it had that much (a
    /// provider starts full), so the first report already tells what was booked.
    pub(super) limit: Option<u64>,
    /// The newest report used: its send sequence, when it left, and the remaining.
    pub(super) last: Option<(u64, Instant, u64)>,
}

/// A dimension climbing back after a throttle (see [`Adapt`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct Recovery {
    pub(super) ceiling: f64,
    pub(super) from: f64,
    pub(super) since: Instant,
    /// How long each step of the climb takes: the provider's window when it is known,
    /// else [`Adapt::probe`].
    pub(super) probe: Duration,
}

impl Dimension {
    /// A dimension over `bucket`, its rate taken as the configured one.
    pub(super) fn new(bucket: TokenBucket) -> Dimension {
        Dimension {
            configured: bucket.rate(),
            bucket,
            queued: 0,
            newest_observed: None,
            ledger: false,
            guard: None,
            recovery: None,
            charge: Charge::default(),
            reported: false,
            learner: None,
            seed: None,
            edge_refill: None,
            lent: 0,
        }
    }
}
