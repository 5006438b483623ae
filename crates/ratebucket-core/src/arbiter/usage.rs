//! What replies used against what their callers reserved, per dimension: the spread a
//! reservation is lowered to when the provider charges usage after the reply.

/// Ratios kept: the newest, so a change in the work shows within a few dozen replies.
const KEPT: usize = 64;

/// The share of replies a lowered reservation covers.
const QUANTILE: f64 = 0.9;

use super::queue::MIN_BOOKED_COST;

/// The spread of `used / reserved` over the newest replies (see the module docs).
#[derive(Clone, Debug)]
pub(super) struct Usage {
    /// The newest ratios, a ring.
    ratios: [f32; KEPT],
    /// Where the next ratio goes.
    next: usize,
    /// Ratios recorded so far (at most [`KEPT`] are kept).
    seen: usize,
    /// The sum of the ratios kept, kept as they come (the mean is read per grant).
    sum: f64,
    /// The high ratio reservations are lowered to, recomputed as ratios come.
    high: f64,
}

impl Default for Usage {
    fn default() -> Usage {
        Usage {
            ratios: [0.0; KEPT],
            next: 0,
            seen: 0,
            sum: 0.0,
            high: 1.0,
        }
    }
}

impl Usage {
    /// A reply used `used` of a reservation the caller estimated at `estimate`.
    pub(super) fn record(&mut self, used: u64, estimate: u64) {
        // Small counts (whole requests) are what the provider counts, exactly.
        if estimate < MIN_BOOKED_COST {
            return;
        }
        let ratio = (used as f64 / estimate as f64).min(4.0) as f32;
        if self.seen >= KEPT {
            self.sum -= f64::from(self.ratios[self.next]);
        }
        self.sum += f64::from(ratio);
        self.ratios[self.next] = ratio;
        self.next = (self.next + 1) % KEPT;
        self.seen += 1;
        // Sorted afresh while the ratios are few, then every eighth reply.
        if self.seen < 16 || self.seen.is_multiple_of(8) {
            self.high = self.compute_high();
        }
    }

    /// How many ratios are kept.
    fn kept(&self) -> usize {
        self.seen.min(KEPT)
    }

    /// The mean ratio kept; `None` before the first.
    pub(super) fn mean(&self) -> Option<f64> {
        let kept = self.kept();
        (kept > 0).then(|| self.sum / kept as f64)
    }

    /// The ratio a reservation may be lowered to, `None` before the first reply: the
    /// [`QUANTILE`] of the ratios kept, raised while they are few (by `1 + 1/sqrt(n)` of
    /// the highest for `n` ratios under sixteen: twice the one ratio seen, and closer to the
    /// quantile as replies come), never above 1.
    pub(super) fn high(&self) -> Option<f64> {
        (self.seen > 0).then_some(self.high)
    }

    fn compute_high(&self) -> f64 {
        let kept = self.kept();
        let mut sorted = self.ratios;
        let sorted = &mut sorted[..kept];
        sorted.sort_unstable_by(f32::total_cmp);
        let highest = f64::from(sorted[kept - 1]);
        let high = if kept < 16 {
            highest * (1.0 + 1.0 / (kept as f64).sqrt())
        } else {
            let at = ((kept as f64 * QUANTILE).ceil() as usize).clamp(1, kept) - 1;
            // A little above the quantile: the ratios kept are a sample of the work.
            f64::from(sorted[at]) * 1.05
        };
        high.min(1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn few_replies_lower_little_and_many_lower_to_the_quantile() {
        let mut usage = Usage::default();
        assert_eq!(usage.high(), None);
        usage.record(30, 100);
        // One ratio: twice it.
        assert!((usage.high().unwrap() - 0.6).abs() < 1e-6);
        // Small reservations are not sampled.
        usage.record(1, 1);
        assert_eq!(usage.mean(), Some(0.30000001192092896));
        // A hundred replies using 20..=69 of 100: the newest 64 are kept, and the high
        // ratio is their 90th percentile (0.66), a little above.
        for used in (20..70).chain(20..70) {
            usage.record(used, 100);
        }
        let high = usage.high().unwrap();
        assert!((0.66..0.72).contains(&high), "{high}");
        // Never above what was reserved.
        for _ in 0..KEPT {
            usage.record(300, 100);
        }
        assert_eq!(usage.high(), Some(1.0));
        // The mean is of the ratios kept: the older ones left the sum as they were replaced.
        assert!((usage.mean().unwrap() - 3.0).abs() < 1e-6);
    }
}
