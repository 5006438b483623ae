//! One quota dimension: a token bucket with continuous, lazy refill and exact arithmetic.

use std::time::Duration;

pub use crate::rate::{InvalidLimit, MAX_LIMIT, Rate};
use crate::time::Instant;

/// One limit as a provider states it — so many per second, per minute or per window —
/// with the burst the client allows itself. It holds no clock: a limiter turns it into a
/// full [`TokenBucket`] when it starts.
///
/// Constructors never fail; the numbers are checked when the bucket is made
/// ([`Limit::bucket`]), so a whole list of limits can be written inline.
///
/// ```
/// use ratebucket_core::{Instant, Limit};
///
/// let requests = Limit::per_minute(600); // a burst of 100: a sixth of the limit
/// let tokens = Limit::per_minute(90_000).with_capacity(30_000);
/// let bucket = tokens.bucket(Instant::ZERO)?;
/// assert_eq!(bucket.capacity(), 30_000);
/// assert_eq!(requests.capacity(), 100);
/// # Ok::<(), ratebucket_core::InvalidLimit>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Limit {
    amount: u64,
    period: Duration,
    capacity: u64,
    name: Option<&'static str>,
}

impl Limit {
    /// `amount` permits every `period`, with a capacity of a sixth of `amount` (rounded
    /// up): the burst a client can take without overrunning a provider that counts in
    /// fixed windows (ADR 0003). This is the one place that rule lives.
    pub fn per(amount: u64, period: Duration) -> Limit {
        Limit { amount, period, capacity: amount.div_ceil(6), name: None }
    }

    /// `amount` permits per minute, with a burst of a sixth of it (see [`Limit::per`]).
    pub fn per_minute(amount: u64) -> Limit {
        Limit::per(amount, Duration::from_secs(60))
    }

    /// `amount` permits per second, with one second of burst (capacity = `amount`).
    pub fn per_second(amount: u64) -> Limit {
        Limit { amount, period: Duration::from_secs(1), capacity: amount, name: None }
    }

    /// Refill at `rate` with `capacity` of burst.
    pub fn new(rate: Rate, capacity: u64) -> Limit {
        Limit {
            amount: rate.amount,
            period: Duration::from_nanos(rate.period_nanos),
            capacity,
            name: None,
        }
    }

    /// The same limit, named (`"requests"`, `"tokens"`): limiters built from it use the name
    /// for this dimension in spans, metrics, snapshots and errors instead of its index.
    pub fn named(mut self, name: &'static str) -> Limit {
        self.name = Some(name);
        self
    }

    /// The dimension's name, if one was given with [`Limit::named`].
    pub fn name(&self) -> Option<&'static str> {
        self.name
    }

    /// The same rate with another capacity (the deepest burst granted at once).
    pub fn with_capacity(mut self, capacity: u64) -> Limit {
        self.capacity = capacity;
        self
    }

    /// Permits per period.
    pub fn amount(&self) -> u64 {
        self.amount
    }

    /// The period `amount` refills over.
    pub fn period(&self) -> Duration {
        self.period
    }

    /// The capacity its bucket will have.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The refill rate, checked.
    pub fn rate(&self) -> Result<Rate, InvalidLimit> {
        Rate::new(self.amount, self.period)
    }

    /// A full bucket for this limit at `now`; the numbers are checked here.
    pub fn bucket(&self, now: Instant) -> Result<TokenBucket, InvalidLimit> {
        TokenBucket::new(self.rate()?, self.capacity, now)
    }
}

/// One quota dimension: a bucket of `capacity` permits refilled continuously at `rate`.
///
/// The level is a function of time, computed lazily whenever the bucket is touched; there
/// is no timer. It may go negative: an under-estimated cost is recorded as debt and paid
/// back by refill, never clamped away. Internally the level is kept as an exact integer in
/// units of `1 / period_nanos` permits, so refill, grants and refunds never drift.
///
/// Invariant: the permits a bucket grants (net of refunds) in any window of length `W`
/// are at most `capacity + rate * W`.
///
/// A **funded** bucket ([`TokenBucket::funded`]) never refills by itself: its level rises
/// only when permits are handed to it ([`TokenBucket::fund`]), as a share of a quota held
/// elsewhere (another process, a server) is. It grants at most what it was funded with. In
/// an arbiter, what a reservation on a funded dimension (not a budget) did not use is not
/// spent again there: it is kept apart for its owner to reclaim ([`Change::Reclaim`]) and
/// hand back to where it came from, since the quota it came from dated it when it was
/// funded.
///
/// [`Change::Reclaim`]: crate::Change::Reclaim
#[derive(Clone, Debug)]
pub struct TokenBucket {
    rate: Rate,
    capacity: u64,
    /// Level in units of 1/`rate.period_nanos` permits.
    level: i128,
    updated: Instant,
    /// Whether the level rises only by [`TokenBucket::fund`] (no refill).
    funded: bool,
    /// Units lent to an express lane ([`TokenBucket::lend`]): the ceiling is the capacity
    /// less this, so the level and what was lent never hold more than the capacity.
    lent: i128,
}

impl TokenBucket {
    /// A bucket with an explicit `capacity`, full at `now`.
    pub fn new(rate: Rate, capacity: u64, now: Instant) -> Result<TokenBucket, InvalidLimit> {
        if capacity == 0 {
            return Err(InvalidLimit::ZeroCapacity);
        }
        if capacity > MAX_LIMIT {
            return Err(InvalidLimit::TooLarge);
        }
        let mut bucket =
            TokenBucket { rate, capacity, level: 0, updated: now, funded: false, lent: 0 };
        bucket.level = bucket.ceiling_units();
        Ok(bucket)
    }

    /// A funded bucket: empty at `now`, never refilled by time, raised only by
    /// [`TokenBucket::fund`] (at most to `capacity`). `rate` describes the quota the funds
    /// come from (what [`TokenBucket::rate`] reports); it refills nothing here.
    ///
    /// For a share of a quota that something else meters out, such as leases from a
    /// limiter shared by several processes.
    pub fn funded(rate: Rate, capacity: u64, now: Instant) -> Result<TokenBucket, InvalidLimit> {
        let mut bucket = TokenBucket::new(rate, capacity, now)?;
        bucket.level = 0;
        bucket.funded = true;
        Ok(bucket)
    }

    /// Whether the bucket is funded ([`TokenBucket::funded`]) rather than refilled.
    pub fn is_funded(&self) -> bool {
        self.funded
    }

    /// Adds `permits` to the level, never above capacity, and returns how many were taken
    /// (the rest did not fit). Meant for funded buckets; on a refilled one it is a refund.
    pub fn fund(&mut self, permits: u64, now: Instant) -> u64 {
        self.refill(now);
        let room = self.ceiling_units().saturating_sub(self.level).max(0);
        let taken = (room / i128::from(self.rate.period_nanos)).min(i128::from(permits));
        self.level += taken * i128::from(self.rate.period_nanos);
        // `taken` is at most `permits`, a u64.
        u64::try_from(taken).unwrap_or(0)
    }

    /// Takes every whole permit above zero out of the level and returns how many: what a
    /// funded bucket holds unspent, to hand back to where it came from.
    pub fn withdraw(&mut self, now: Instant) -> u64 {
        self.withdraw_at_most(u64::MAX, now)
    }

    /// Takes whole permits above zero out of the level, at most `most`, and returns how
    /// many: the part of a funded bucket's holding whose time to be spent is over.
    pub fn withdraw_at_most(&mut self, most: u64, now: Instant) -> u64 {
        self.refill(now);
        let whole =
            self.level.div_euclid(i128::from(self.rate.period_nanos)).clamp(0, i128::from(most));
        self.level -= whole * i128::from(self.rate.period_nanos);
        u64::try_from(whole).unwrap_or(0)
    }

    /// `limit` permits per second, with one second of burst (capacity = `limit`).
    pub fn per_second(limit: u64, now: Instant) -> Result<TokenBucket, InvalidLimit> {
        Limit::per_second(limit).bucket(now)
    }

    /// `limit` permits per minute, refilled at the real limit, with a capacity of one
    /// sixth of it (ten seconds of burst, rounded up).
    ///
    /// A full-minute capacity would let a client burst a whole minute's allowance right
    /// after a fixed-window server resets, and reach nearly twice the limit in a rolling
    /// minute; see ADR 0003. Use [`TokenBucket::new`] to choose another capacity.
    pub fn per_minute(limit: u64, now: Instant) -> Result<TokenBucket, InvalidLimit> {
        Limit::per_minute(limit).bucket(now)
    }

    /// The refill rate.
    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// The most permits the bucket holds.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Permits available at `now` (negative while in debt).
    #[inline]
    pub fn available(&mut self, now: Instant) -> f64 {
        self.refill(now);
        self.level as f64 / self.rate.period_nanos as f64
    }

    /// Permits available at `now`, without touching the bucket (negative while in debt).
    pub fn level_at(&self, now: Instant) -> f64 {
        self.level_units_at(now) as f64 / self.rate.period_nanos as f64
    }

    /// Whether `cost` permits are available at `now`.
    #[inline]
    pub fn fits(&mut self, cost: u64, now: Instant) -> bool {
        self.refill(now);
        self.level >= self.units(cost)
    }

    /// How long after `now` until `cost` permits are available; `None` if `cost` exceeds
    /// the capacity (it never will be).
    pub fn time_until(&mut self, cost: u64, now: Instant) -> Option<Duration> {
        self.refill(now);
        if cost > self.capacity {
            return None;
        }
        Some(self.deficit_wait(self.units(cost)))
    }

    /// [`TokenBucket::time_until`] as a query: the wait from `now`, the bucket untouched.
    pub(crate) fn time_until_at(&self, cost: u64, now: Instant) -> Option<Duration> {
        if cost > self.capacity {
            return None;
        }
        let needed = self.units(cost);
        let level = self.level_units_at(now);
        if self.funded && needed > level {
            // Only funds raise the level: no wait ends by itself.
            return Some(Duration::MAX);
        }
        Some(self.wait_for_deficit(needed.saturating_sub(level)))
    }

    /// Like [`TokenBucket::time_until`], for totals above capacity too (a queue's worth of
    /// costs drained in order, assuming no refunds).
    pub(crate) fn time_until_unbounded(&mut self, cost: u64, now: Instant) -> Duration {
        self.refill(now);
        self.deficit_wait(self.units(cost))
    }

    /// How long after `now` until `cost` permits (any amount, above capacity too: a queue's
    /// worth drained in order) have refilled, assuming nothing else happens. A query. For a
    /// funded bucket, at the rate of the quota its funds come from.
    pub fn drain_time(&self, cost: u64, now: Instant) -> Duration {
        let level = self.level_units_at(now);
        let needed = i128::from(cost).saturating_mul(i128::from(self.rate.period_nanos));
        self.wait_for_deficit(needed.saturating_sub(level))
    }

    /// Takes `cost` permits unconditionally; the level may go negative (debt).
    #[inline]
    pub fn take(&mut self, cost: u64, now: Instant) {
        self.refill(now);
        self.level = self.level.saturating_sub(self.units(cost));
    }

    /// Takes `cost` permits that [`TokenBucket::fits`] just found available, at the
    /// instant it was asked about (no refill, no debt).
    #[inline]
    pub(crate) fn take_fitted(&mut self, cost: u64) {
        debug_assert!(self.level >= self.units(cost));
        self.level -= self.units(cost);
    }

    /// Gives `amount` permits back, never above capacity.
    #[inline]
    pub fn give_back(&mut self, amount: u64, now: Instant) {
        self.refill(now);
        self.level = self.level.saturating_add(self.units(amount)).min(self.ceiling_units());
    }

    /// Lowers the level to at most `permits` (an observation from the provider). Never
    /// raises it. Returns whether the level changed.
    pub fn lower_to(&mut self, permits: i64, now: Instant) -> bool {
        self.refill(now);
        let ceiling = i128::from(permits).saturating_mul(i128::from(self.rate.period_nanos));
        if ceiling < self.level {
            self.level = ceiling;
            true
        } else {
            false
        }
    }

    /// Sets the level to `permits` (clamped to capacity; may be negative).
    pub(crate) fn set_level(&mut self, permits: i64, now: Instant) {
        self.refill(now);
        self.level = i128::from(permits)
            .saturating_mul(i128::from(self.rate.period_nanos))
            .min(self.ceiling_units());
    }

    /// Raises the level to `permits` (never above capacity); returns whether it rose.
    pub(crate) fn raise_to(&mut self, permits: i64, now: Instant) -> bool {
        self.refill(now);
        let floor = i128::from(permits)
            .saturating_mul(i128::from(self.rate.period_nanos))
            .min(self.ceiling_units());
        if floor > self.level {
            self.level = floor;
            true
        } else {
            false
        }
    }

    /// Changes the refill rate from `now` on. The level keeps its value in permits
    /// (rounded down to the new unit).
    pub fn set_rate(&mut self, rate: Rate, now: Instant) {
        self.refill(now);
        let old = i128::from(self.rate.period_nanos);
        let new = i128::from(rate.period_nanos);
        let whole = self.level.div_euclid(old);
        let frac = self.level.rem_euclid(old);
        self.level = whole * new + (frac * new).div_euclid(old);
        // What is lent is whole permits: re-expressed exactly in the new unit.
        self.lent = self.lent.div_euclid(old) * new;
        self.rate = rate;
    }

    /// Changes the capacity from `now` on; a level above the new capacity is cut to it.
    pub fn set_capacity(&mut self, capacity: u64, now: Instant) -> Result<(), InvalidLimit> {
        if capacity == 0 {
            return Err(InvalidLimit::ZeroCapacity);
        }
        if capacity > MAX_LIMIT {
            return Err(InvalidLimit::TooLarge);
        }
        self.refill(now);
        self.capacity = capacity;
        self.level = self.level.min(self.ceiling_units());
        Ok(())
    }

    /// Lends `permits` to an express lane: they leave the level at once, and the ceiling
    /// stays lower by as much until [`TokenBucket::repay`], so the level and the lane's
    /// permits together never hold more than the capacity, nor refill faster than the
    /// rate (see the arbiter's `lane` module).
    pub(crate) fn lend(&mut self, permits: u64, now: Instant) {
        self.refill(now);
        let units = self.units(permits);
        self.level = self.level.saturating_sub(units);
        self.lent = self.lent.saturating_add(units);
    }

    /// Ends a loan of `lent` permits ([`TokenBucket::lend`]), `unused` of which come back
    /// to the level; the ceiling rises by `lent` again.
    pub(crate) fn repay(&mut self, lent: u64, unused: u64, now: Instant) {
        self.refill(now);
        self.lent = self.lent.saturating_sub(self.units(lent)).max(0);
        self.level = self.level.saturating_add(self.units(unused)).min(self.ceiling_units());
    }

    /// Brings the level up to date; a `now` earlier than the last update changes nothing.
    #[inline]
    fn refill(&mut self, now: Instant) {
        if now <= self.updated {
            return;
        }
        self.level = self.level_units_at(now);
        self.updated = now;
    }

    /// The level at `now` in units, refilled (a `now` before the last update reads the
    /// level as of that update).
    fn level_units_at(&self, now: Instant) -> i128 {
        if now <= self.updated || self.funded {
            return self.level;
        }
        let elapsed = i128::from(now.as_nanos() - self.updated.as_nanos());
        let added = elapsed.saturating_mul(i128::from(self.rate.amount));
        self.level.saturating_add(added).min(self.ceiling_units())
    }

    /// The wait until the level reaches `needed` units (zero if it already has).
    fn deficit_wait(&self, needed: i128) -> Duration {
        if self.funded && needed > self.level {
            // Only funds raise the level: no wait ends by itself.
            return Duration::MAX;
        }
        // Saturating: a level driven towards `i128::MIN` by absurd debts must still give a
        // long wait, never an overflow (a panic) or a wrap to "now" (a busy loop).
        self.wait_for_deficit(needed.saturating_sub(self.level))
    }

    /// The refill time of `deficit` units (zero if there is none).
    fn wait_for_deficit(&self, deficit: i128) -> Duration {
        if deficit <= 0 {
            return Duration::ZERO;
        }
        let amount = i128::from(self.rate.amount);
        let nanos = deficit / amount + i128::from(deficit % amount != 0);
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// The level at `now + after`, assuming nothing else happens (no events, clamped at
    /// capacity), minus `taken_now` units taken at `now`.
    pub(crate) fn projected_units(&self, after: Duration, taken_now: u64) -> i128 {
        let nanos =
            if self.funded { 0 } else { i128::try_from(after.as_nanos()).unwrap_or(i128::MAX) };
        let start = self.level.saturating_sub(self.units(taken_now));
        start
            .saturating_add(nanos.saturating_mul(i128::from(self.rate.amount)))
            .min(self.ceiling_units())
    }

    #[inline]
    pub(crate) fn units(&self, permits: u64) -> i128 {
        i128::from(permits) * i128::from(self.rate.period_nanos)
    }

    /// The most the level holds: the capacity, less what is lent to an express lane.
    #[inline]
    fn ceiling_units(&self) -> i128 {
        self.units(self.capacity) - self.lent
    }
}

#[cfg(test)]
mod tests;
