//! Budgets: a dimension that counts an allowance (money, most often) per calendar day,
//! calendar month or fixed period, renewed whole when each period starts and refusing at
//! once, saying when it renews, a call it can no longer cover.

use std::time::Duration;

use super::{Admission, Ask, Ctx, Rule};
use crate::arbiter::dims::Dims;
use crate::arbiter::error::ReserveError;
use crate::bucket::{InvalidLimit, Rate, TokenBucket};
use crate::event::Refusal;
use crate::ids::Ticket;
use crate::time::Instant;

/// Seconds in a day.
const DAY: u64 = 86_400;

/// How often a budget renews.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Period {
    /// Every calendar day, at midnight UTC.
    Day,
    /// Every calendar month, on the first at midnight UTC.
    Month,
    /// Every so long, from when the budget is set.
    Every(Duration),
}

impl Period {
    /// When the calendar period holding `since_epoch` (wall-clock time since the Unix
    /// epoch) started: its midnight UTC, or the first of its month. `None` for
    /// [`Period::Every`], whose periods start when the budget is set. For what was spent
    /// of a budget before a restart.
    pub fn started(self, since_epoch: Duration) -> Option<Duration> {
        let days = since_epoch.as_secs() / DAY;
        match self {
            Period::Day => Some(Duration::from_secs(days * DAY)),
            Period::Month => {
                let (year, month) = year_month(days);
                Some(Duration::from_secs(days_from_civil(year, month) * DAY))
            }
            Period::Every(_) => None,
        }
    }
}

/// An allowance of `amount` units per [`Period`], set on a dimension with
/// [`Change::Budget`](crate::Change::Budget): the dimension stops refilling with time, holds `amount` when the
/// budget is set and again when each period starts (an overrun carried over as debt), and
/// a reservation it cannot cover is refused at once with [`ReserveError::BudgetSpent`](crate::ReserveError::BudgetSpent),
/// saying when it renews.
///
/// Money is the usual unit: reserve a call at its highest price (its prompt and its
/// `max_tokens` at the model's prices) and commit what its usage cost; the refund returns
/// to the budget at once.
///
/// The core reads no clock: `since_epoch` is the wall-clock time (since the Unix epoch)
/// at the `now` the change is made at, from which the calendar's days and months are
/// found.
///
/// ```
/// use std::time::Duration;
/// use ratebucket_core::{Arbiter, ArbiterConfig, Budget, Change, Instant, Period, TokenBucket};
///
/// // Requests per second, and micro-dollars: $5 a day. It is 22:00 UTC.
/// let buckets = vec![
///     TokenBucket::per_second(10, Instant::ZERO)?,
///     TokenBucket::per_second(1_000_000, Instant::ZERO)?,
/// ];
/// let mut arbiter = Arbiter::new(buckets, ArbiterConfig::default(), Instant::ZERO)?;
/// let wall = Duration::from_secs(20_000 * 86_400 + 22 * 3_600);
/// let budget = Budget { amount: 5_000_000, period: Period::Day, since_epoch: wall };
/// arbiter.change(1, Change::Budget(budget), Instant::ZERO)?;
/// let ticket = arbiter.reserve(&[1, 4_000_000], Instant::ZERO)?;
/// arbiter.commit(ticket, &[1, 3_000_000], Instant::ZERO)?; // it cost $3
/// let refused = arbiter.reserve(&[1, 4_000_000], Instant::ZERO).unwrap_err();
/// assert_eq!(refused.retry_after(), Some(Duration::from_secs(2 * 3_600)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// Units per period.
    pub amount: u64,
    /// How often it renews.
    pub period: Period,
    /// The wall-clock time at the change's `now`, since the Unix epoch.
    pub since_epoch: Duration,
}

/// A budget's schedule, kept by [`Budgets`].
#[derive(Clone, Copy, Debug)]
struct Renewal {
    /// Units per period.
    amount: u64,
    period: Period,
    /// The next renewal, on the arbiter's clock.
    at: Instant,
    /// The next renewal, on the wall clock (since the Unix epoch).
    boundary: Duration,
    /// When the budget was set or last renewed: what was granted before refunds nothing
    /// into it.
    renewed: Instant,
}

impl Renewal {
    /// The schedule of `budget`, set at `now`.
    fn new(budget: Budget, now: Instant) -> Renewal {
        let boundary = next_boundary(budget.period, budget.since_epoch);
        Renewal {
            amount: budget.amount,
            period: budget.period,
            at: now + boundary.saturating_sub(budget.since_epoch),
            boundary,
            renewed: now,
        }
    }

    /// Moves to the next renewal.
    fn advance(&mut self) {
        let next = next_boundary(self.period, self.boundary);
        self.at = self.at + next.saturating_sub(self.boundary);
        self.boundary = next;
    }
}

/// The first start of a period strictly after `after` (wall-clock time since the epoch).
fn next_boundary(period: Period, after: Duration) -> Duration {
    let secs = after.as_secs();
    match period {
        Period::Day => Duration::from_secs((secs / DAY + 1) * DAY),
        Period::Month => {
            let (year, month) = year_month(secs / DAY);
            let (year, month) = if month == 12 { (year + 1, 1) } else { (year, month + 1) };
            Duration::from_secs(days_from_civil(year, month) * DAY)
        }
        // A zero period is refused when the budget is set.
        Period::Every(every) => after.saturating_add(every),
    }
}

/// The (year, month) of the day `days` after 1970-01-01 (proleptic Gregorian).
fn year_month(days: u64) -> (u64, u64) {
    // Counted in 400-year eras from 0000-03-01, so leap days end each year.
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month)
}

/// The days from 1970-01-01 to the first of `month` in `year` (from 1970 on).
fn days_from_civil(year: u64, month: u64) -> u64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year / 400;
    let yoe = year % 400;
    let mp = if month > 2 { month - 3 } else { month + 9 };
    let doy = (153 * mp + 2) / 5;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    (era * 146_097 + doe).saturating_sub(719_468)
}

/// Every budget dimension's schedule: the rule that refuses at once what a budget cannot
/// cover, and renews each budget when its period starts.
#[derive(Clone, Debug, Default)]
pub(crate) struct Budgets {
    /// Per dimension (as far as one was set), its schedule if it is a budget.
    renewals: Vec<Option<Renewal>>,
}

impl Budgets {
    /// Makes `dimension` of `dims` a budget: a funded bucket holding `budget.amount` from
    /// now, renewed at each period's start.
    pub(crate) fn set(
        &mut self,
        dims: &mut Dims,
        dimension: usize,
        budget: Budget,
        now: Instant,
    ) -> Result<(), InvalidLimit> {
        if budget.amount == 0 || budget.period == Period::Every(Duration::ZERO) {
            return Err(InvalidLimit::ZeroCapacity);
        }
        let nominal = match budget.period {
            Period::Day => Duration::from_secs(DAY),
            Period::Month => Duration::from_secs(30 * DAY),
            Period::Every(every) => every,
        };
        // The rate only describes the allowance: a funded bucket never refills by time.
        let rate = Rate::new(budget.amount, nominal)?;
        let mut bucket = TokenBucket::funded(rate, budget.amount, now)?;
        bucket.fund(budget.amount, now);
        dims.get_mut(dimension)?.install(bucket, Some(now));
        if self.renewals.len() <= dimension {
            self.renewals.resize(dimension + 1, None);
        }
        self.renewals[dimension] = Some(Renewal::new(budget, now));
        Ok(())
    }

    /// Renews every budget whose period started by `now`: its bucket is topped up by the
    /// amount, to at most the amount (a debt from an overrun is carried over).
    pub(crate) fn renew(&mut self, dims: &mut Dims, now: Instant) {
        for (dimension, renewal) in self.renewals.iter_mut().enumerate() {
            let Some(renewal) = renewal else { continue };
            if renewal.at > now {
                continue;
            }
            while renewal.at <= now {
                renewal.renewed = renewal.at;
                renewal.advance();
            }
            if let Ok(dim) = dims.get_mut(dimension) {
                dim.renew(renewal.amount, renewal.renewed, now);
            }
        }
    }

    /// The budget `cost` cannot be covered by: the first budget dimension whose level, with
    /// every refund still possible (what is granted and not yet ended), stays below the
    /// cost, and how long until it renews.
    pub(crate) fn short(
        &self,
        cost: &[u64],
        ctx: &Ctx<'_>,
        now: Instant,
    ) -> Option<(usize, Duration)> {
        self.renewals.iter().enumerate().find_map(|(d, renewal)| {
            let renewal = (*renewal)?;
            let c = *cost.get(d)?;
            let level = ctx.dims.get(d).ok()?.bucket.level_at(now);
            let reach = level + ctx.books.unsettled(d) as f64;
            (c > 0 && (c as f64) > reach + 1e-9)
                .then(|| (d, renewal.at.saturating_duration_since(now)))
        })
    }

    /// The refusal of queued `ticket` if budgets can no longer cover it (everything that
    /// could be refunded to them has ended).
    pub(crate) fn refusal(&self, ticket: Ticket, ctx: &Ctx<'_>, now: Instant) -> Option<Refusal> {
        let (dimension, renews_in) = self.short(ctx.tickets.cost(ticket), ctx, now)?;
        Some(Refusal::BudgetSpent { dimension, renews_in })
    }

    /// When `dimension`'s budget is next topped up, if it is one.
    pub(crate) fn renewal_at(&self, dimension: usize) -> Option<Instant> {
        Some(self.renewals.get(dimension).copied().flatten()?.at)
    }

    /// The first renewal of `dimension`'s budget after `now`, if it is one.
    pub(crate) fn renews_at(&self, dimension: usize, now: Instant) -> Option<Instant> {
        let mut renewal = self.renewals.get(dimension).copied().flatten()?;
        while renewal.at <= now {
            renewal.advance();
        }
        Some(renewal.at)
    }
}

impl Rule for Budgets {
    fn idle(&self) -> bool {
        self.renewals.iter().all(Option::is_none)
    }

    /// Refused at once, until the budget renews, when a budget cannot cover it even were
    /// everything in flight refunded (renew first: see [`Budgets::renew`]).
    fn admit(&mut self, ask: &Ask<'_>, ctx: &Ctx<'_>, now: Instant) -> Admission {
        match self.short(ask.cost, ctx, now) {
            Some((dimension, renews_in)) => {
                Admission::Refuse(ReserveError::BudgetSpent { dimension, renews_in })
            }
            None => Admission::Admit,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn day(y: u64, m: u64, d: u64) -> u64 {
        days_from_civil(y, m) + d - 1
    }

    #[test]
    fn the_calendar_matches_known_dates() {
        assert_eq!(days_from_civil(1970, 1), 0);
        assert_eq!(days_from_civil(2000, 3), 11_017);
        assert_eq!(days_from_civil(2024, 3), 19_783); // after a leap February
        assert_eq!(days_from_civil(2026, 12), 20_788);
        for days in [0, 59, 60, 11_016, 11_017, 19_782, 19_783, 20_423, 20_453, 40_000] {
            let (y, m) = year_month(days);
            assert!(days_from_civil(y, m) <= days, "{days}: {y}-{m}");
            let next = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
            assert!(days_from_civil(next.0, next.1) > days, "{days}: {y}-{m}");
        }
    }

    #[test]
    fn periods_start_at_midnight_utc_and_on_the_first() {
        let at = |days: u64, secs: u64| Duration::from_secs(days * DAY + secs);
        // 2026-12-04 17:00 UTC.
        let now = at(day(2026, 12, 4), 17 * 3_600);
        assert_eq!(next_boundary(Period::Day, now), at(day(2026, 12, 5), 0));
        assert_eq!(next_boundary(Period::Month, now), at(day(2027, 1, 1), 0));
        // Exactly at a boundary: the next one.
        let midnight = at(day(2024, 2, 1), 0);
        assert_eq!(next_boundary(Period::Day, midnight), at(day(2024, 2, 2), 0));
        assert_eq!(next_boundary(Period::Month, midnight), at(day(2024, 3, 1), 0));
        let every = Period::Every(Duration::from_secs(90));
        assert_eq!(next_boundary(every, now), now + Duration::from_secs(90));
        assert_eq!(Period::Day.started(now), Some(at(day(2026, 12, 4), 0)));
        assert_eq!(Period::Month.started(now), Some(at(day(2026, 12, 1), 0)));
        assert_eq!(Period::Month.started(midnight), Some(midnight));
        assert_eq!(every.started(now), None);
    }
}
