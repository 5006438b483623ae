//! Introspection: a snapshot of every dimension and the gate, and when queued work drains.

use super::*;

/// What the arbiter holds at one instant, from [`Arbiter::snapshot`].
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
    /// ([`Change::Policy`]).
    pub learned: Option<LearnedQuota>,
    /// For a budget ([`Change::Budget`]), when it next renews after `now`.
    pub renews_at: Option<Instant>,
    /// What the provider last said of this dimension's quota, as read: the limit, what
    /// remained and when it said the quota is whole again.
    pub reported: Option<Reported>,
}

/// What the provider last said of one dimension's quota ([`Arbiter::observe_quota`]), as
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

impl Arbiter {
    /// The state of every dimension and of the gate at `now`. A query: nothing changes.
    pub fn snapshot(&self, now: Instant) -> ArbiterSnapshot {
        let now = self.clock.at_least(now);
        ArbiterSnapshot {
            dimensions: (0..self.dims.len()).filter_map(|d| self.dimension(d, now)).collect(),
            queued: self.queue.live(),
            paused_until: self.gate.reopens_at(now),
            epoch: self.gate.epoch(),
            aborted: self.aborted,
        }
    }

    /// The state of `dimension` at `now` (its part of [`Arbiter::snapshot`]); `None` if
    /// there is no such dimension. A query: nothing changes.
    pub fn dimension(&self, dimension: usize, now: Instant) -> Option<DimensionSnapshot> {
        let now = self.clock.at_least(now);
        let dim = self.dims.get(dimension)?;
        Some(DimensionSnapshot {
            level: dim.bucket.level_at(now),
            rate: dim.bucket.rate(),
            configured_rate: dim.configured,
            capacity: dim.bucket.capacity(),
            queued_cost: u64::try_from(self.queue.cost_in(dimension)).unwrap_or(u64::MAX),
            head_cost: self
                .queue
                .first(&self.tickets)
                .map_or(0, |head| self.booked(dimension, self.tickets.cost_in(head, dimension))),
            synced: dim.ledger,
            window_limit: dim.guard.as_ref().map(|g| (g.limit(), g.window())),
            charge_factor: self.charge_factor(dimension).unwrap_or(1.0),
            learned: self.learned_quota(dimension),
            renews_at: self.renews_at(dimension, now),
            reported: dim.last_report,
        })
    }

    /// How long after `now` until everything queued, plus `more` (one entry per dimension:
    /// work not yet reserved, such as the rest of a batch), would be granted at the rates in
    /// force, counting the pause under way. A query: nothing changes.
    ///
    /// It assumes the costs are what will be taken: pass the expected charge of the work
    /// still to come, not its upper bound, for an ETA rather than a worst case. Refunds of
    /// reservations granted now are not foreseen, and a window cap is counted at its
    /// sustained rate (its limit per window).
    pub fn estimate_drain(&self, more: &[u64], now: Instant) -> Result<Duration, ReserveError> {
        if more.len() != self.dims.len() {
            return Err(ReserveError::WrongDimensions {
                expected: self.dims.len(),
                got: more.len(),
            });
        }
        let now = self.clock.at_least(now);
        let mut wait = self
            .gate
            .reopens_at(now)
            .map_or(Duration::ZERO, |at| at.saturating_duration_since(now));
        for (d, (dim, &extra)) in self.dims.iter().zip(more).enumerate() {
            let total = self.queue.cost_in(d).saturating_add(u128::from(extra));
            let total = u64::try_from(total).unwrap_or(u64::MAX);
            wait = wait.max(dim.bucket.drain_time(total, now));
            if let Some(guard) = &dim.guard {
                // The first window's worth waits for what the cap holds now to age out (a
                // cap seeded full waits up to a window; `None`: only reservations ending
                // make room, a window at most); then whole windows' worth beyond it, the
                // sustained rate of the cap.
                let first =
                    guard.time_until_at(total.min(guard.limit()), now).unwrap_or(guard.window());
                let windows = total.saturating_sub(guard.limit()) as f64 / guard.limit() as f64;
                let secs = guard.window().as_secs_f64() * windows;
                let beyond = Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX);
                wait = wait.max(first.saturating_add(beyond));
            }
        }
        Ok(wait)
    }
}
