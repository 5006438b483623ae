//! Introspection: what a snapshot of the arbiter, of a dimension and of the provider's
//! last report holds.

use std::time::Duration;

use super::dimension::Dimension;
use super::fair::TenantSnapshot;
use crate::bucket::Rate;
use crate::gate::{Epoch, Gate};
use crate::learn::LearnedQuota;
use crate::time::Instant;

/// Where an arbiter stands as a whole ([`Arbiter::status`](crate::Arbiter::status)).
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct Status {
    /// The number of dimensions.
    pub dimensions: usize,
    /// Waiters still queued.
    pub queued: usize,
    /// The gate (epoch and pause).
    pub gate: Gate,
    /// Whether the run was aborted ([`Desk::abort`](crate::Desk::abort)).
    pub aborted: bool,
    /// Whether a refusal reported the account's quota spent ([`Settle::Spent`](crate::Settle::Spent)): every
    /// reservation is refused until it resets, or until [`Arbiter::resume`](crate::Arbiter::resume).
    pub spent: bool,
    /// Whether permits are leased to an express lane ([`Desk::lease`](crate::Desk::lease)).
    pub lane_leased: bool,
    /// Whether a lease could be made but for the time: nothing that needs the arbiter's
    /// order (a queue, a reply being folded, the books of sends, a dimension beyond a
    /// plain bucket, a rule with something to say, an abort) stands in the way.
    pub lane_may_lease: bool,
}

/// What the arbiter holds at one instant, from [`Arbiter::snapshot`](crate::Arbiter::snapshot).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct ArbiterSnapshot {
    /// One entry per dimension, in the order costs name them.
    pub dimensions: Vec<DimensionSnapshot>,
    /// Waiters queued.
    pub queued: usize,
    /// When the gate reopens, if a pause is under way.
    pub paused_until: Option<Instant>,
    /// The gate's epoch: how many pauses have begun.
    pub epoch: Epoch,
    /// Whether the run was aborted.
    pub aborted: bool,
    /// Every tenant that has a weight or a cap set, or has queued, in order.
    pub tenants: Vec<TenantSnapshot>,
}

/// One dimension in an [`ArbiterSnapshot`]: its bucket now, and what has been learned about
/// the provider's limit.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct DimensionSnapshot {
    /// Permits available now (negative while in debt).
    pub level: f64,
    /// The refill rate in force (below `configured_rate` after a throttle, or as learned).
    pub rate: Rate,
    /// The rate the dimension was created with, or last set to.
    pub configured_rate: Rate,
    /// The most permits the bucket holds.
    pub capacity: u64,
    /// The summed cost of the queued reservations.
    pub queued_cost: u64,
    /// What the first queued reservation, which goes before any other, will take from
    /// this dimension when granted: its cost, raised by a learned charge
    /// (`charge_factor`) as its grant will be (0 with nothing queued). What the dimension
    /// must hold for the queue to move at all.
    pub head_cost: u64,
    /// Whether the level follows the provider's reported `remaining` (the provider keeps
    /// the books; commits no longer move it).
    pub synced: bool,
    /// A trailing-window cap learned or set: (limit, window).
    pub window_limit: Option<(u64, Duration)>,
    /// What the provider books per unit reserved, as learned from its reports (1 until
    /// learned; see the module docs of learning).
    pub charge_factor: f64,
    /// What was learned of the provider's quota, if the dimension learns
    /// ([`Change::Policy`](crate::Change::Policy)).
    pub learned: Option<LearnedQuota>,
    /// For a budget ([`Change::Budget`](crate::Change::Budget)), when it next renews after `now`.
    pub renews_at: Option<Instant>,
    /// What the provider last said of this dimension's quota, as read: the limit, what
    /// remained and when it said the quota is whole again.
    pub reported: Option<Reported>,
}

/// What the provider last said of one dimension's quota ([`Arbiter::observe_quota`](crate::Arbiter::observe_quota)), as
/// read: the numbers a throttle or a spent quota is explained by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Reported {
    /// The limit it reported.
    pub limit: Option<u64>,
    /// What it said remained.
    pub remaining: Option<u64>,
    /// When it said the quota is whole again (its reset, from the reading).
    pub resets_at: Option<Instant>,
    /// When the report was read.
    pub at: Instant,
}

impl DimensionSnapshot {
    /// `dim` at `now`, with what the queue holds of it (`queued_cost`, and `head_cost`
    /// for the reservation that goes first) and, for a budget, when it next renews.
    pub(super) fn of(
        dim: &Dimension,
        now: Instant,
        (queued_cost, head_cost): (u64, u64),
        renews_at: Option<Instant>,
    ) -> DimensionSnapshot {
        DimensionSnapshot {
            level: dim.bucket.level_at(now),
            rate: dim.bucket.rate(),
            configured_rate: dim.configured,
            capacity: dim.bucket.capacity(),
            queued_cost,
            head_cost,
            synced: dim.provider.ledger,
            window_limit: dim.guard.as_ref().map(|g| (g.window.limit(), g.window.window())),
            charge_factor: dim.provider.charge_factor(),
            learned: dim.learned(),
            renews_at,
            reported: dim.provider.last,
        }
    }
}
