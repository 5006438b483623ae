//! When a process stops trusting Redis to answer, and the local share it paces on then.

use std::time::Duration;

use ratebucket_tokio::Limiter;
use ratebucket_tokio::core::Change;
use tokio::time::Instant;

use crate::script::Failure;

/// How Redis has been answering this process.
#[derive(Debug, Default)]
pub(crate) struct Reach {
    /// Whether Redis has ever answered it (it has held a lease).
    answered: bool,
    /// When the first call Redis has not answered since was made.
    unanswered_since: Option<Instant>,
}

impl Reach {
    /// Redis answered.
    pub(crate) fn answered(&mut self) {
        self.answered = true;
        self.unanswered_since = None;
    }

    /// Whether it has ever answered.
    pub(crate) fn ever_answered(&self) -> bool {
        self.answered
    }

    /// A call at `now` failed so: whether the process falls back to its own share. Only
    /// when Redis is down (an error) or has answered none of its calls for `lapse` (as
    /// long as a lease lives unrenewed): a slow answer is not an outage, since the others
    /// may be leasing meanwhile and a fallback share on top of their leases would overrun
    /// the quota. Never before Redis has answered once: a process that has never held a
    /// lease admits nothing on its own.
    pub(crate) fn falls_back(&mut self, failure: Failure, now: Instant, lapse: Duration) -> bool {
        let since = *self.unanswered_since.get_or_insert(now);
        match failure {
            _ if !self.answered => false,
            Failure::Down => true,
            Failure::Slow => now.saturating_duration_since(since) >= lapse,
        }
    }
}

/// The local share a process paces on while Redis is out of reach: per dimension,
/// permits accrued and not yet handed to the limiter.
#[derive(Debug)]
pub(crate) struct Fallback {
    pending: Vec<f64>,
}

impl Fallback {
    pub(crate) fn new(dimensions: usize) -> Fallback {
        Fallback { pending: vec![0.0; dimensions] }
    }

    /// Accrues `1 / divisor` of every rate over `dt` and hands whole permits to `limiter`,
    /// never letting it hold more than `1 / divisor` of the capacity; returns what each
    /// dimension was funded.
    pub(crate) fn fund(
        &mut self,
        limiter: &Limiter,
        (rates, capacities): (&[f64], &[u64]),
        divisor: u32,
        dt: Duration,
    ) -> Vec<u64> {
        let share = f64::from(divisor.max(1));
        let mut funded = vec![0; self.pending.len()];
        for (d, pending) in self.pending.iter_mut().enumerate() {
            let cap = capacities[d] as f64 / share;
            *pending = (*pending + rates[d] / share * dt.as_secs_f64()).min(cap);
            let level = limiter.dimension(d).map(|v| v.state.level).unwrap_or(0.0);
            let whole = pending.min((cap - level).max(0.0)).floor() as u64;
            if whole > 0 {
                let taken = limiter.change(d, Change::Fund(whole)).unwrap_or(0);
                *pending -= taken as f64;
                funded[d] = taken;
            }
        }
        funded
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAPSE: Duration = Duration::from_secs(3);

    #[test]
    fn a_process_that_never_leased_never_falls_back() {
        let t0 = Instant::now();
        let mut reach = Reach::default();
        assert!(!reach.falls_back(Failure::Down, t0, LAPSE));
        assert!(!reach.falls_back(Failure::Slow, t0 + LAPSE * 10, LAPSE));
    }

    #[test]
    fn slow_is_an_outage_only_once_nothing_was_answered_for_a_lease_s_life() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut reach = Reach::default();
        reach.answered();
        // Idle for long, then one slow call: slow, not down.
        assert!(!reach.falls_back(Failure::Slow, t0 + s(60), LAPSE));
        assert!(!reach.falls_back(Failure::Slow, t0 + s(62), LAPSE));
        assert!(reach.falls_back(Failure::Slow, t0 + s(63), LAPSE));
        // An answer starts the count again; an error is down at once.
        reach.answered();
        assert!(!reach.falls_back(Failure::Slow, t0 + s(64), LAPSE));
        assert!(reach.falls_back(Failure::Down, t0 + s(64), LAPSE));
    }
}
