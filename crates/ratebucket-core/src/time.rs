//! The core's notion of time: an `Instant` on a caller-supplied, monotonic timeline.

use core::fmt;
use core::ops::{Add, Sub};
use std::time::Duration;

/// A point in time, counted in nanoseconds from an origin the caller chooses.
///
/// The core never reads a clock. Runtimes map their own clock onto this timeline
/// (usually "nanoseconds since the limiter was created"), and tests drive it by hand,
/// which makes every schedule replayable. Arithmetic saturates: a deadline that would
/// overflow is [`Instant::NEVER`], not a panic.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant {
    nanos: u64,
}

impl Instant {
    /// The origin of the timeline.
    pub const ZERO: Instant = Instant { nanos: 0 };
    /// The end of the timeline; used for "never".
    pub const NEVER: Instant = Instant { nanos: u64::MAX };

    /// The instant `nanos` nanoseconds after the origin.
    #[inline]
    pub const fn from_nanos(nanos: u64) -> Instant {
        Instant { nanos }
    }

    /// The instant `millis` milliseconds after the origin (saturating).
    pub const fn from_millis(millis: u64) -> Instant {
        Instant { nanos: millis.saturating_mul(1_000_000) }
    }

    /// The instant `secs` seconds after the origin (saturating).
    pub const fn from_secs(secs: u64) -> Instant {
        Instant { nanos: secs.saturating_mul(1_000_000_000) }
    }

    /// The instant `since_origin` after the origin (saturating at [`Instant::NEVER`]).
    #[inline]
    pub fn from_duration(since_origin: Duration) -> Instant {
        Instant { nanos: u64::try_from(since_origin.as_nanos()).unwrap_or(u64::MAX) }
    }

    /// Nanoseconds since the origin.
    #[inline]
    pub const fn as_nanos(self) -> u64 {
        self.nanos
    }

    /// Time since the origin.
    pub const fn since_origin(self) -> Duration {
        Duration::from_nanos(self.nanos)
    }

    /// `self + duration`, or [`Instant::NEVER`] if that overflows.
    pub fn saturating_add(self, duration: Duration) -> Instant {
        let add = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        Instant { nanos: self.nanos.saturating_add(add) }
    }

    /// `self - duration`, or [`Instant::ZERO`] if that would come before the origin.
    pub fn saturating_sub(self, duration: Duration) -> Instant {
        let sub = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        Instant { nanos: self.nanos.saturating_sub(sub) }
    }

    /// How long after `earlier` this instant is, or zero if it is not later.
    #[inline]
    pub const fn saturating_duration_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.nanos.saturating_sub(earlier.nanos))
    }

    /// Whether this is [`Instant::NEVER`].
    pub const fn is_never(self) -> bool {
        self.nanos == u64::MAX
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;

    /// Saturating: overflow gives [`Instant::NEVER`].
    fn add(self, rhs: Duration) -> Instant {
        self.saturating_add(rhs)
    }
}

impl Sub<Instant> for Instant {
    type Output = Duration;

    /// Saturating: an earlier `self` gives zero.
    fn sub(self, rhs: Instant) -> Duration {
        self.saturating_duration_since(rhs)
    }
}

impl fmt::Debug for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_never() {
            f.write_str("Instant(never)")
        } else {
            write!(f, "Instant({:?})", self.since_origin())
        }
    }
}

/// A clamp that keeps time moving forward: a `now` earlier than the latest seen is
/// replaced by the latest seen, so a clock that steps back can neither mint refill nor
/// panic.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Monotonic {
    latest: Instant,
}

impl Monotonic {
    pub(crate) fn new(start: Instant) -> Monotonic {
        Monotonic { latest: start }
    }

    /// `now`, or the latest instant seen if `now` is earlier, without recording it.
    #[inline]
    pub(crate) fn at_least(&self, now: Instant) -> Instant {
        now.max(self.latest)
    }

    #[inline]
    pub(crate) fn advance(&mut self, now: Instant) -> Instant {
        if now > self.latest {
            self.latest = now;
        }
        self.latest
    }
}

/// A wait as people read it: `16d 4h`, `5h 3m`, `2m 10s`, `8s`, `250ms`.
pub(crate) fn humanise(d: Duration) -> String {
    let secs = d.as_secs();
    if secs >= 2 * 86_400 {
        return format!("{}d {}h", secs / 86_400, secs / 3_600 % 24);
    }
    match (secs / 3_600, secs / 60 % 60, secs % 60) {
        (0, 0, 0) => format!("{}ms", d.subsec_millis()),
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m {s}s"),
        (h, m, _) => format!("{h}h {m}m"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates_instead_of_panicking() {
        assert_eq!(Instant::NEVER + Duration::from_secs(1), Instant::NEVER);
        assert_eq!(Instant::from_secs(1) - Instant::from_secs(5), Duration::ZERO);
        assert_eq!(Instant::ZERO + Duration::MAX, Instant::NEVER);
        assert_eq!(Instant::from_secs(u64::MAX), Instant::NEVER);
    }

    #[test]
    fn monotonic_clamps_a_clock_that_steps_back() {
        let mut m = Monotonic::new(Instant::ZERO);
        assert_eq!(m.advance(Instant::from_secs(5)), Instant::from_secs(5));
        assert_eq!(m.advance(Instant::from_secs(2)), Instant::from_secs(5));
        assert_eq!(m.advance(Instant::from_secs(7)), Instant::from_secs(7));
    }
}
