//! Rates, capacities and funds: setting them, and adapting rates to throttles and successes.

use super::dimension::Recovery;
use super::*;

impl Arbiter {
    /// Applies `f(dimension, current, configured)` (permits per second) to every dimension's rate and
    /// reports the changes.
    pub(super) fn scale_rates(&mut self, now: Instant, f: impl Fn(usize, f64, f64) -> f64) {
        for (dimension, dim) in self.dims.iter_mut().enumerate() {
            let bucket = &mut dim.bucket;
            let from = bucket.rate();
            let configured = dim.configured;
            let wanted = f(dimension, from.per_second_f64(), configured.per_second_f64());
            let to = if wanted >= configured.per_second_f64() {
                configured
            } else {
                match Rate::from_per_second_f64(wanted) {
                    Ok(rate) => rate,
                    Err(_) => continue,
                }
            };
            if to != from {
                bucket.set_rate(to, now);
                self.events.push_back(Event::RateChanged { dimension, from, to });
            }
        }
    }

    /// A throttle closed the gate until `until`: every dimension not synced to the provider
    /// remembers the rate that met it and drops to `decrease` times it; the climb back
    /// starts when the pause ends (see [`Adapt`]).
    pub(super) fn decrease_rates(&mut self, adapt: Adapt, until: Instant, now: Instant) {
        let mut dropped = Vec::new();
        for (dimension, dim) in self.dims.iter_mut().enumerate() {
            // Where the provider keeps the books its reports already steer the level; a
            // stray 429 there is not evidence of a lower limit.
            if dim.ledger {
                continue;
            }
            let current = dim.bucket.rate().per_second_f64();
            let configured = dim.configured.per_second_f64();
            let to = (current * adapt.decrease).max(configured * adapt.floor);
            // The climb back takes a step per window of the provider's when it is known.
            let probe = dim.learner.as_ref().map_or(adapt.probe, |l| l.window());
            dim.recovery =
                Some(Recovery { ceiling: current, from: to.min(current), since: until, probe });
            dropped.push((dimension, to));
        }
        self.recovering = self.dims.iter().any(|d| d.recovery.is_some());
        self.scale_rates(now, |dimension, current, _| {
            dropped.iter().find(|(d, _)| *d == dimension).map_or(current, |&(_, to)| to)
        });
    }

    /// Moves every recovering dimension's rate to where its climb back stands at `now`;
    /// a dimension back at its configured rate stops recovering.
    pub(super) fn recover(&mut self, now: Instant) {
        if self.config.adapt.is_none() {
            self.recovering = false;
            return;
        }
        let targets: Vec<Option<f64>> = self
            .dims
            .iter()
            .map(|dim| {
                let recovery = dim.recovery?;
                Some(Adapt::recovered(
                    recovery.from,
                    recovery.ceiling,
                    dim.configured.per_second_f64(),
                    (recovery.since, recovery.probe),
                    now,
                ))
            })
            .collect();
        // Moved in steps of a thousandth at least, so a climb is not an event per call.
        self.scale_rates(now, |dimension, current, configured| match targets[dimension] {
            Some(target) if target >= configured || target >= current * 1.001 => target,
            _ => current,
        });
        for dim in &mut self.dims {
            if dim.recovery.is_some() && dim.bucket.rate() == dim.configured {
                dim.recovery = None;
            }
        }
        self.recovering = self.dims.iter().any(|d| d.recovery.is_some());
    }

    /// Changes `dimension`'s configured refill rate from `now` on (adaptive rates return to
    /// it, never above).
    pub(crate) fn set_rate(
        &mut self,
        dimension: usize,
        rate: Rate,
        now: Instant,
    ) -> Result<(), InvalidLimit> {
        let now = self.clock.advance(now);
        let dim = self.dimension_mut(dimension)?;
        dim.bucket.set_rate(rate, now);
        dim.configured = rate;
        dim.recovery = None;
        self.recovering = self.dims.iter().any(|d| d.recovery.is_some());
        self.drive(now);
        Ok(())
    }

    /// Changes `dimension`'s capacity from `now` on. Queued waiters whose cost no longer
    /// fits are removed with [`Event::Refused`].
    pub(crate) fn set_capacity(
        &mut self,
        dimension: usize,
        capacity: u64,
        now: Instant,
    ) -> Result<(), InvalidLimit> {
        let now = self.clock.advance(now);
        let Some(dim) = self.dims.get_mut(dimension) else {
            return Err(InvalidLimit::NoSuchDimension(dimension));
        };
        dim.bucket.set_capacity(capacity, now)?;
        self.refuse_too_big(dimension);
        self.drive(now);
        Ok(())
    }

    /// Hands `permits` to `dimension`'s funded bucket ([`TokenBucket::funded`]), never above
    /// its capacity, and grants whatever now fits. Returns how many permits were taken;
    /// the rest did not fit and stay the caller's.
    pub(crate) fn fund(
        &mut self,
        dimension: usize,
        permits: u64,
        now: Instant,
    ) -> Result<u64, InvalidLimit> {
        let now = self.clock.advance(now);
        let taken = self.dimension_mut(dimension)?.bucket.fund(permits, now);
        self.drive(now);
        Ok(taken)
    }

    /// Takes back every whole permit `dimension`'s bucket holds above zero and returns how
    /// many (see [`TokenBucket::withdraw`]): a funded share's unspent part, to return.
    pub(crate) fn withdraw(&mut self, dimension: usize, now: Instant) -> Result<u64, InvalidLimit> {
        let now = self.clock.advance(now);
        Ok(self.dimension_mut(dimension)?.bucket.withdraw(now))
    }

    /// The most one reservation may cost in `dimension`: its bucket's capacity, or its
    /// window guard's limit if lower.
    pub(super) fn effective_capacity(&self, dimension: usize) -> u64 {
        self.dims[dimension].effective_capacity()
    }

    /// Refuses the queued reservations `dimension` can never admit.
    pub(super) fn refuse_too_big(&mut self, dimension: usize) {
        let capacity = self.effective_capacity(dimension);
        self.refuse_queued(dimension, capacity, Refusal::CostExceedsCapacity { dimension });
    }

    /// Refuses, for `reason`, every queued reservation costing `dimension` more than
    /// `above`.
    pub(super) fn refuse_queued(&mut self, dimension: usize, above: u64, reason: Refusal) {
        let refused: Vec<Ticket> = self
            .queue
            .iter()
            .filter(|&t| self.tickets.is_queued(t))
            .chain(self.parked())
            .filter(|&t| self.tickets.cost_in(t, dimension) > above)
            .collect();
        for ticket in refused {
            if !self.unpark(ticket) {
                self.unqueue(ticket);
            }
            self.tickets.free(ticket);
            self.events.push_back(Event::Refused { ticket, reason });
        }
    }
}
