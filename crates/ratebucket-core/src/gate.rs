//! The pool-wide reaction to throttling: a gate that closes once per epoch.

use std::time::Duration;

use crate::time::Instant;

/// A generation of the gate. Every request records the epoch it was sent in; a throttle
/// observation only acts if its epoch is still the current one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Epoch(u64);

impl Epoch {
    /// The epoch as a plain counter (for logging).
    pub fn get(self) -> u64 {
        self.0
    }
}

impl From<u64> for Epoch {
    /// The epoch whose counter is `count` (the inverse of [`Epoch::get`]), for adapters
    /// that keep an epoch in an atomic.
    fn from(count: u64) -> Epoch {
        Epoch(count)
    }
}

/// How long the gate pauses the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GateConfig {
    /// Pause when the provider gave no Retry-After.
    pub default_pause: Duration,
    /// The longest pause the gate will take, whatever the provider asks for.
    pub max_pause: Duration,
}

impl Default for GateConfig {
    /// One second by default, two minutes at most: the default
    /// [`RetryPolicy::retry_after_ceiling`](crate::RetryPolicy), so every wait a request
    /// is allowed to honour is honoured for the whole pool.
    fn default() -> GateConfig {
        GateConfig { default_pause: Duration::from_secs(1), max_pause: Duration::from_secs(120) }
    }
}

/// What a throttle observation did to the gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThrottleOutcome {
    /// The observation was current: the gate closed until `until`, and the epoch moved on.
    Closed {
        /// When the gate reopens.
        until: Instant,
        /// The pause actually taken (Retry-After, capped, or the default).
        pause: Duration,
        /// The epoch that requests sent from now on carry.
        epoch: Epoch,
    },
    /// The observation came from an earlier epoch, whose wave already closed the gate:
    /// it changes nothing.
    Stale,
}

/// The pool-wide gate: fifty concurrent 429s from one wave make one pause.
///
/// Each request records [`Gate::epoch`] when it is sent. When its reply says "throttled",
/// [`Gate::throttle`] closes the gate only if that epoch is still current, then moves the
/// epoch on, so the rest of the same wave is recognised as stale and can neither re-close
/// nor extend the pause. A request sent after the pause carries the new epoch and can.
#[derive(Clone, Copy, Debug)]
pub struct Gate {
    config: GateConfig,
    epoch: Epoch,
    closed_until: Instant,
}

impl Gate {
    /// An open gate at epoch zero.
    pub fn new(config: GateConfig) -> Gate {
        Gate { config, epoch: Epoch::default(), closed_until: Instant::ZERO }
    }

    /// The configuration.
    pub fn config(&self) -> GateConfig {
        self.config
    }

    /// The epoch a request sent now belongs to.
    #[inline]
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// Whether the gate is open at `now`.
    #[inline]
    pub fn is_open(&self, now: Instant) -> bool {
        now >= self.closed_until
    }

    /// When the gate reopens, if it is closed at `now`.
    pub fn reopens_at(&self, now: Instant) -> Option<Instant> {
        (!self.is_open(now)).then_some(self.closed_until)
    }

    /// How long from `now` until the gate reopens (zero while it is open).
    pub fn closed_for(&self, now: Instant) -> Duration {
        self.closed_until.saturating_duration_since(now)
    }

    /// Reports a throttle answer to a request sent in `sent_in`, with the provider's
    /// requested delay if it gave one.
    pub fn throttle(
        &mut self,
        sent_in: Epoch,
        retry_after: Option<Duration>,
        now: Instant,
    ) -> ThrottleOutcome {
        if sent_in != self.epoch {
            return ThrottleOutcome::Stale;
        }
        let pause = retry_after.unwrap_or(self.config.default_pause).min(self.config.max_pause);
        let until = now + pause;
        self.closed_until = self.closed_until.max(until);
        self.epoch = Epoch(self.epoch.0 + 1);
        ThrottleOutcome::Closed { until: self.closed_until, pause, epoch: self.epoch }
    }
}

impl Default for Gate {
    fn default() -> Gate {
        Gate::new(GateConfig::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Instant {
        Instant::from_secs(s)
    }

    #[test]
    fn fifty_concurrent_throttles_of_one_epoch_make_exactly_one_pause() {
        let mut gate = Gate::default();
        let wave = gate.epoch();
        let outcomes: Vec<_> = (0..50)
            .map(|i| gate.throttle(wave, Some(Duration::from_secs(2)), Instant::from_millis(i)))
            .collect();
        let closures =
            outcomes.iter().filter(|o| matches!(o, ThrottleOutcome::Closed { .. })).count();
        assert_eq!(closures, 1);
        assert_eq!(gate.reopens_at(secs(1)), Some(secs(2)));
    }

    #[test]
    fn a_stale_epoch_can_neither_reclose_nor_extend_the_pause() {
        let mut gate = Gate::default();
        let old = gate.epoch();
        gate.throttle(old, Some(Duration::from_secs(2)), secs(0));
        assert_eq!(
            gate.throttle(old, Some(Duration::from_secs(30)), secs(1)),
            ThrottleOutcome::Stale
        );
        assert_eq!(gate.reopens_at(secs(1)), Some(secs(2)));
        assert_eq!(
            gate.throttle(old, Some(Duration::from_secs(30)), secs(3)),
            ThrottleOutcome::Stale
        );
        assert!(gate.is_open(secs(3)));
    }

    #[test]
    fn a_newer_epoch_closes_it_again() {
        let mut gate = Gate::default();
        gate.throttle(gate.epoch(), Some(Duration::from_secs(2)), secs(0));
        let next = gate.epoch();
        let outcome = gate.throttle(next, Some(Duration::from_secs(5)), secs(3));
        assert!(matches!(outcome, ThrottleOutcome::Closed { until, .. } if until == secs(8)));
    }

    #[test]
    fn the_pause_honours_retry_after_capped_with_a_default_when_absent() {
        let config = GateConfig {
            default_pause: Duration::from_millis(1500),
            max_pause: Duration::from_secs(10),
        };
        let mut gate = Gate::new(config);
        gate.throttle(gate.epoch(), None, secs(0));
        assert_eq!(gate.reopens_at(secs(0)), Some(Instant::from_millis(1500)));
        gate.throttle(gate.epoch(), Some(Duration::from_secs(3_000_000_000)), secs(0));
        assert_eq!(gate.reopens_at(secs(0)), Some(secs(10)));
        gate.throttle(gate.epoch(), Some(Duration::MAX), Instant::NEVER);
        assert!(gate.is_open(Instant::NEVER));
    }
}
