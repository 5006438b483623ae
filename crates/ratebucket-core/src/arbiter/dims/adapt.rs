//! A dimension's climb back after a throttle ([`Recovery`]), under the settings of
//! [`Adapt`].

use std::time::Duration;

use crate::arbiter::config::Adapt;
use crate::time::Instant;

/// A dimension climbing back after a throttle (see [`Adapt`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Recovery {
    /// The rate (per second) that met the throttle.
    ceiling: f64,
    /// The rate the climb starts from.
    from: f64,
    /// When it starts (the pause's end).
    since: Instant,
    /// How long each step of the climb takes: the provider's window when it is known,
    /// else [`Adapt::probe`].
    probe: Duration,
}

impl Recovery {
    /// A throttle met `current` (per second) on a dimension configured at `configured`:
    /// the rate it drops to now, and the climb back from there starting at `until`, a step
    /// per `probe`.
    pub(crate) fn after_throttle(
        adapt: Adapt,
        (current, configured): (f64, f64),
        until: Instant,
        probe: Duration,
    ) -> (f64, Recovery) {
        let to = (current * adapt.decrease).max(configured * adapt.floor);
        let recovery = Recovery { ceiling: current, from: to.min(current), since: until, probe };
        (to, recovery)
    }

    /// The rate (per second) the climb allows at `now`, capped at `configured`: over one
    /// step to nine tenths of the ceiling, then a tenth of it per further step.
    pub(crate) fn rate_at(&self, configured: f64, now: Instant) -> f64 {
        let probe = self.probe.as_secs_f64().max(1e-9);
        let windows = now.saturating_duration_since(self.since).as_secs_f64() / probe;
        let near = 0.9 * self.ceiling;
        let rate = if windows <= 1.0 {
            self.from + (near - self.from).max(0.0) * windows
        } else {
            near.max(self.from) + 0.1 * self.ceiling * (windows - 1.0)
        };
        rate.min(configured)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_climb_reaches_nine_tenths_in_a_step_then_a_tenth_per_step() {
        let until = Instant::from_millis(1_000);
        let step = Duration::from_secs(10);
        let (to, climb) = Recovery::after_throttle(Adapt::default(), (100.0, 200.0), until, step);
        assert_eq!(to, 50.0);
        assert_eq!(climb.rate_at(200.0, until), 50.0);
        assert!((climb.rate_at(200.0, until + step) - 90.0).abs() < 1e-9);
        assert!((climb.rate_at(200.0, until + step * 2) - 100.0).abs() < 1e-9);
        assert_eq!(climb.rate_at(120.0, until + step * 10), 120.0);
    }
}
