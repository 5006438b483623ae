//! Introspection: what a snapshot of the arbiter, of a dimension and of the provider's
//! last report holds.

use std::time::Duration;

use super::Arbiter;
use super::fair::{Tenant, TenantSnapshot};
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
    /// Reservations granted and not yet ended: the requests in flight.
    pub in_flight: usize,
    /// The most requests in flight allowed now: stated
    /// ([`ArbiterConfig::max_in_flight`](crate::ArbiterConfig::max_in_flight)) or learned
    /// from the provider's refusals; `None`: no bound.
    pub max_in_flight: Option<u32>,
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

impl Status {
    /// Where `arbiter` stands as a whole.
    pub(super) fn of(arbiter: &Arbiter) -> Status {
        Status {
            dimensions: arbiter.limits.dims.len(),
            queued: arbiter.queue.live(),
            gate: arbiter.limits.gate,
            aborted: arbiter.limits.aborted,
            spent: arbiter.limits.rules.spent.pool_spent(),
            lane_leased: arbiter.limits.dims.leased,
            lane_may_lease: arbiter.lane_may_open_in_time(),
        }
    }
}

impl ArbiterSnapshot {
    /// `arbiter` at `now`: every dimension, the gate, every tenant.
    pub(super) fn of(arbiter: &Arbiter, now: Instant) -> ArbiterSnapshot {
        let mut tenants: Vec<Tenant> =
            arbiter.queue.fair.tenants().chain(arbiter.limits.rules.caps.tenants()).collect();
        tenants.sort_unstable();
        tenants.dedup();
        let dimensions = 0..arbiter.limits.dims.len();
        ArbiterSnapshot {
            dimensions: dimensions.filter_map(|d| DimensionSnapshot::of(arbiter, d, now)).collect(),
            queued: arbiter.queue.live(),
            paused_until: arbiter.limits.gate.reopens_at(now),
            epoch: arbiter.limits.gate.epoch(),
            aborted: arbiter.limits.aborted,
            tenants: tenants.into_iter().map(|t| arbiter.tenant(t)).collect(),
            in_flight: arbiter.tickets.granted_count(),
            max_in_flight: arbiter.limits.rules.concurrency.limit(),
        }
    }
}

impl DimensionSnapshot {
    /// `arbiter`'s `dimension` at `now`, if it has one: its bucket, what the queue holds of
    /// it (and what its head will take), what was learned and reported, and for a budget
    /// when it next renews.
    pub(super) fn of(
        arbiter: &Arbiter,
        dimension: usize,
        now: Instant,
    ) -> Option<DimensionSnapshot> {
        let dim = arbiter.limits.dims.get(dimension).ok()?;
        let queued_cost = u64::try_from(arbiter.queue.cost_in(dimension)).unwrap_or(u64::MAX);
        let head_cost = arbiter.queue.first(&arbiter.tickets).map_or(0, |head| {
            let cost = arbiter.tickets.cost_in(head, dimension);
            arbiter.limits.dims.booked(dimension, cost, arbiter.config.reserve_usage)
        });
        Some(DimensionSnapshot {
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
            renews_at: arbiter.limits.rules.budgets.renews_at(dimension, now),
            reported: dim.provider.last,
        })
    }
}
