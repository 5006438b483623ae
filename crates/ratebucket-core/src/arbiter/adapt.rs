//! Rates and capacities: setting them, and adapting them to throttles and successes.

use super::*;

impl Arbiter {
    /// The rate `dimension` refills at now (below the configured one after throttles).
    pub fn current_rate(&self, dimension: usize) -> Option<Rate> {
        self.dims.get(dimension).map(|d| d.bucket.rate())
    }

    /// Applies `f(dimension, current, configured)` (permits per second) to every dimension's rate and
    /// reports the changes.
    pub(super) fn scale_rates(&mut self, now: Instant, f: impl Fn(usize, f64, f64) -> f64) {
        for (dimension, dim) in self.dims.iter_mut().enumerate() {
            let bucket = &mut dim.bucket;
            let from = bucket.rate();
            let configured = dim.configured;
            let wanted = f(
                dimension,
                from.per_second_f64(),
                configured.per_second_f64(),
            );
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
                self.events.push_back(Event::RateChanged {
                    dimension,
                    from,
                    to,
                });
            }
        }
    }

    /// Changes `dimension`'s configured refill rate from `now` on (adaptive rates return to
    /// it, never above).
    pub fn set_rate(
        &mut self,
        dimension: usize,
        rate: Rate,
        now: Instant,
    ) -> Result<(), InvalidLimit> {
        let now = self.clock.advance(now);
        let dim = self.dimension_mut(dimension)?;
        dim.bucket.set_rate(rate, now);
        dim.configured = rate;
        self.drive(now);
        Ok(())
    }

    /// Changes `dimension`'s capacity from `now` on. Queued waiters whose cost no longer
    /// fits are removed with [`Event::Refused`].
    pub fn set_capacity(
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

    /// The most one reservation may cost in `dimension`: its bucket's capacity, or its
    /// window guard's limit if lower.
    pub(super) fn effective_capacity(&self, dimension: usize) -> u64 {
        let dim = &self.dims[dimension];
        let capacity = dim.bucket.capacity();
        dim.guard
            .as_ref()
            .map_or(capacity, |guard| capacity.min(guard.limit()))
    }

    /// Refuses the queued reservations `dimension` can never admit.
    pub(super) fn refuse_too_big(&mut self, dimension: usize) {
        let dims = self.dims.len();
        let capacity = self.effective_capacity(dimension);
        let too_big: Vec<Ticket> = self
            .queue
            .iter()
            .copied()
            .filter(|&t| {
                self.slot(t).is_some_and(|s| s.state == SlotState::Queued)
                    && self.costs[t.index as usize * dims + dimension] > capacity
            })
            .collect();
        for ticket in too_big {
            self.unqueue(ticket);
            self.free_slot(ticket);
            self.events.push_back(Event::Refused {
                ticket,
                reason: Refusal::CostExceedsCapacity { dimension },
            });
        }
    }

    #[inline]
    pub(super) fn below_configured(&self) -> bool {
        self.dims.iter().any(|d| d.bucket.rate() != d.configured)
    }
}
