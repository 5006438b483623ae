//! One dimension of the arbiter: its bucket and everything kept per limit.

use super::usage::Usage;
use super::*;
use crate::learn::Learner;

/// Everything the arbiter keeps for one limit.
#[derive(Clone, Debug)]
pub(super) struct Dimension {
    /// The bucket grants are taken from.
    pub(super) bucket: TokenBucket,
    /// The rate the user configured: the ceiling adaptive rates return to.
    pub(super) configured: Rate,
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
    /// What replies used against what their callers reserved.
    pub(super) usage: Usage,
    /// Whether a report of the provider's was folded for it yet.
    pub(super) reported: bool,
    /// What the provider last said of it, as read.
    pub(super) last_report: Option<super::inspect::Reported>,
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
    /// A quota over a longer window than the bucket's (a day's) that the provider reported
    /// spent: nothing costing this dimension is granted before then.
    pub(super) spent_until: Option<Instant>,
    /// For a budget ([`Change::Budget`]): when it renews, and by how much.
    pub(super) renewal: Option<super::budget::Renewal>,
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
    /// Whether the report being folded rounds its `remaining` ([`QuotaReport::precision`]):
    /// a rounded count says nothing of what one request was booked.
    pub(super) imprecise: bool,
}

/// The booked charge per unit reserved below which a provider is taken to charge what a
/// reply used, after it (see [`Dimension::lowered`]).
pub(super) const LOWER_BELOW: f64 = 0.9;

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
    /// Whether a reservation granted at `granted_at` may refund what it did not use: not
    /// into a budget renewed since (it was paid for from the period before).
    #[inline]
    pub(super) fn refundable(&self, granted_at: Instant) -> bool {
        self.renewal.is_none_or(|r| granted_at >= r.renewed)
    }

    /// A dimension over `bucket`, its rate taken as the configured one.
    pub(super) fn new(bucket: TokenBucket) -> Dimension {
        Dimension {
            configured: bucket.rate(),
            bucket,
            newest_observed: None,
            ledger: false,
            guard: None,
            recovery: None,
            charge: Charge::default(),
            usage: Usage::default(),
            reported: false,
            last_report: None,
            learner: None,
            seed: None,
            edge_refill: None,
            lent: 0,
            spent_until: None,
            renewal: None,
        }
    }

    /// What a reservation is lowered to, per unit the caller reserved, when the provider's
    /// reports show it books what replies use rather than what was reserved (it charges
    /// usage after the reply): the learned booked charge clearly below one
    /// ([`LOWER_BELOW`]) and close to the mean usage of the replies, so not a provider that
    /// books `max_tokens` at admission against a prompt estimated long. Then the high ratio
    /// of usage ([`Usage::high`]); an overrun is charged as debt at the commit. `None`:
    /// reservations hold what the caller reserved.
    pub(super) fn lowered(&self) -> Option<f64> {
        let factor = self.charge.factor?;
        let mean = self.usage.mean()?;
        let books_usage = factor < LOWER_BELOW && factor <= mean * 1.15 + 0.02;
        books_usage.then(|| self.usage.high().unwrap_or(1.0).max(factor).min(1.0))
    }

    /// What reservations holding `held` in all will use together: where reservations are
    /// lowered ([`Dimension::lowered`]), the pooled bound of the usage learned
    /// ([`Usage::pooled`]) instead of the sum of each one's high quantile; else `held`.
    pub(super) fn pooled(&self, held: u64) -> u64 {
        match self.lowered() {
            Some(ratio) => self.usage.pooled(held, ratio),
            None => held,
        }
    }

    /// The most one reservation may cost: the bucket's capacity, or the window guard's
    /// limit if lower.
    #[inline]
    pub(super) fn effective_capacity(&self) -> u64 {
        let capacity = self.bucket.capacity();
        self.guard.as_ref().map_or(capacity, |guard| capacity.min(guard.limit()))
    }

    /// Whether `cost` fits the bucket (and, if `guarded`, the window guard) at `now`. A
    /// bucket whose provider's fixed window began since it was last whole is refilled to
    /// full first, as the provider is.
    #[inline]
    pub(super) fn fits(&mut self, cost: u64, now: Instant, guarded: bool) -> bool {
        if cost > 0 && self.spent_until.is_some_and(|until| now < until) {
            return false;
        }
        // Only a guard knows a fixed window's edges.
        if guarded
            && let Some(refilled) = self.edge_refill
            && let Some(edge) = self.guard.as_ref().and_then(|g| g.edge_before(now))
            && edge > refilled
        {
            let capacity = i64::try_from(self.bucket.capacity()).unwrap_or(i64::MAX);
            self.bucket.raise_to(capacity, now);
            self.edge_refill = Some(edge);
        }
        self.bucket.fits(cost, now)
            && (!guarded || self.guard.as_mut().is_none_or(|guard| guard.fits(cost, now)))
    }

    /// The most one reply may charge for a reservation of `reserved`:
    /// [`MAX_CHARGE_FACTOR`] times it, or the capacity if that is more.
    #[inline]
    pub(super) fn charge_ceiling(&self, reserved: u64) -> u64 {
        reserved.saturating_mul(MAX_CHARGE_FACTOR).max(self.bucket.capacity())
    }

    /// Whether nothing about it needs the arbiter's order: no provider's books, guard,
    /// learning, climb back after a throttle, seed or funded bucket.
    pub(super) fn is_plain(&self) -> bool {
        !self.ledger
            && self.guard.is_none()
            && self.learner.is_none()
            && self.recovery.is_none()
            && self.seed.is_none()
            && self.spent_until.is_none()
            && !self.bucket.is_funded()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dimension(capacity: u64) -> Dimension {
        let bucket = TokenBucket::new(Rate::per_second(10).unwrap(), capacity, Instant::ZERO);
        Dimension::new(bucket.unwrap())
    }

    #[test]
    fn a_guard_below_the_capacity_bounds_what_one_reservation_may_cost() {
        let mut dim = dimension(100);
        assert_eq!(dim.effective_capacity(), 100);
        assert!(dim.is_plain());
        dim.guard = Some(WindowGuard::new(40, Duration::from_secs(1)).unwrap());
        assert_eq!(dim.effective_capacity(), 40);
        assert!(!dim.is_plain());
    }

    #[test]
    fn the_guard_is_asked_only_when_guarded() {
        let mut dim = dimension(100);
        let mut guard = WindowGuard::new(40, Duration::from_secs(1)).unwrap();
        guard.take(30);
        dim.guard = Some(guard);
        assert!(!dim.fits(20, Instant::ZERO, true), "30 held, 20 more exceeds 40");
        assert!(dim.fits(20, Instant::ZERO, false));
    }

    #[test]
    fn a_reply_may_charge_four_times_the_reservation_or_the_capacity() {
        let dim = dimension(100);
        assert_eq!(dim.charge_ceiling(10), 100);
        assert_eq!(dim.charge_ceiling(50), 200);
        assert_eq!(dim.charge_ceiling(u64::MAX), u64::MAX);
    }
}
