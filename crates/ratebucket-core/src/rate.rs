//! Refill rates and the limits on them: [`Rate`], [`InvalidLimit`], [`MAX_LIMIT`].

use core::fmt;
use std::time::Duration;

/// The largest amount, period (in nanoseconds) or capacity a bucket accepts: 2^53.
///
/// Chosen so that every product the bucket computes fits in an `i128` with room to spare,
/// and so that levels convert to `f64` exactly.
pub const MAX_LIMIT: u64 = 1 << 53;

/// Why a rate or a capacity was refused.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum InvalidLimit {
    /// The rate grants nothing: zero permits, a zero period, or a float rate that rounds
    /// to zero.
    ZeroRate,
    /// A float rate was NaN, infinite or negative.
    NotFinitePositive(f64),
    /// A capacity of zero could never grant anything.
    ZeroCapacity,
    /// An amount, period or capacity above [`MAX_LIMIT`].
    TooLarge,
    /// The limiter has no dimension with this index.
    NoSuchDimension(usize),
    /// A tenant's weight outside `1..=`[`MAX_WEIGHT`](crate::MAX_WEIGHT).
    Weight(u32),
    /// A tenant's cap ([`Arbiter::set_cap`](crate::Arbiter::set_cap)) outside (0, 1].
    Share(f64),
}

impl fmt::Display for InvalidLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InvalidLimit::ZeroRate => f.write_str("rate limit must grant at least one permit"),
            InvalidLimit::NotFinitePositive(x) => {
                write!(f, "rate limit must be a finite positive number, got {x}")
            }
            InvalidLimit::ZeroCapacity => f.write_str("bucket capacity must be at least 1"),
            InvalidLimit::TooLarge => write!(
                f,
                "limit too large: amounts, capacities and periods (in ns) must be <= {MAX_LIMIT}"
            ),
            InvalidLimit::NoSuchDimension(d) => write!(f, "the limiter has no dimension {d}"),
            InvalidLimit::Weight(w) => {
                write!(f, "a tenant's weight must be within 1..={}, got {w}", crate::MAX_WEIGHT)
            }
            InvalidLimit::Share(s) => {
                write!(f, "a tenant's cap must be a share within (0, 1], got {s}")
            }
        }
    }
}

impl std::error::Error for InvalidLimit {}

/// A refill rate: `amount` permits every `period`, validated at construction.
///
/// Rates are kept as an exact fraction, so `Rate::per_minute(100)` refills exactly 100
/// permits in 60 s with no rounding drift, however often the bucket is looked at.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rate {
    pub(crate) amount: u64,
    pub(crate) period_nanos: u64,
}

impl Rate {
    /// `amount` permits every `period`.
    pub fn new(amount: u64, period: Duration) -> Result<Rate, InvalidLimit> {
        let period_nanos = u64::try_from(period.as_nanos()).map_err(|_| InvalidLimit::TooLarge)?;
        if amount == 0 || period_nanos == 0 {
            return Err(InvalidLimit::ZeroRate);
        }
        if amount > MAX_LIMIT || period_nanos > MAX_LIMIT {
            return Err(InvalidLimit::TooLarge);
        }
        // Lowest terms, so equal rates compare equal however they were written.
        let divisor = gcd(amount, period_nanos);
        Ok(Rate { amount: amount / divisor, period_nanos: period_nanos / divisor })
    }

    /// `amount` permits per second.
    pub fn per_second(amount: u64) -> Result<Rate, InvalidLimit> {
        Rate::new(amount, Duration::from_secs(1))
    }

    /// `amount` permits per minute.
    pub fn per_minute(amount: u64) -> Result<Rate, InvalidLimit> {
        Rate::new(amount, Duration::from_secs(60))
    }

    /// A fractional rate in permits per second, never faster than asked: rounded down,
    /// to a millionth of a permit per second at one permit a second or more, and to a
    /// nanosecond of the period per permit below that (so one a day or one a week is
    /// exact to a few parts in 10^13).
    ///
    /// NaN, infinities, negative numbers and rates below one permit per [`MAX_LIMIT`]
    /// nanoseconds (about 104 days) are refused.
    pub fn from_per_second_f64(per_second: f64) -> Result<Rate, InvalidLimit> {
        if !per_second.is_finite() || per_second < 0.0 {
            return Err(InvalidLimit::NotFinitePositive(per_second));
        }
        // Each candidate is stepped once more towards slow if the float arithmetic that
        // produced it rounded it the fast way.
        let rate = if per_second >= 1.0 {
            // Millionths of a permit per second, rounded down.
            let scaled = (per_second * 1e6).floor();
            if scaled > MAX_LIMIT as f64 {
                return Err(InvalidLimit::TooLarge);
            }
            let scaled = scaled as u64;
            let rate = Rate::new(scaled, Duration::from_secs(1_000_000))?;
            if rate.per_second_f64() > per_second {
                Rate::new(scaled - 1, Duration::from_secs(1_000_000))?
            } else {
                rate
            }
        } else {
            // One permit per period, the period rounded up.
            let period = (1e9 / per_second).ceil();
            if period >= MAX_LIMIT as f64 {
                return Err(InvalidLimit::ZeroRate);
            }
            let period = period as u64;
            let rate = Rate::new(1, Duration::from_nanos(period))?;
            if rate.per_second_f64() > per_second {
                Rate::new(1, Duration::from_nanos(period + 1))?
            } else {
                rate
            }
        };
        Ok(rate)
    }

    /// Permits granted per `period()` (in lowest terms: `Rate::per_minute(60)` is one
    /// permit per second).
    pub fn amount(self) -> u64 {
        self.amount
    }

    /// The period over which `amount()` permits refill.
    pub fn period(self) -> Duration {
        Duration::from_nanos(self.period_nanos)
    }

    /// The whole permits this rate refills over `elapsed` (saturating).
    pub fn permits_over(self, elapsed: Duration) -> u64 {
        let permits = elapsed.as_nanos().saturating_mul(u128::from(self.amount))
            / u128::from(self.period_nanos);
        u64::try_from(permits).unwrap_or(u64::MAX)
    }

    /// The rate as permits per second (for display and logging).
    pub fn per_second_f64(self) -> f64 {
        self.amount as f64 * 1e9 / self.period_nanos as f64
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

impl fmt::Debug for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Rate({}/{:?})", self.amount, self.period())
    }
}
