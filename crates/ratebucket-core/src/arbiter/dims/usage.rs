//! What replies used against what their callers reserved, per dimension: the spread a
//! reservation is lowered to when the provider charges usage after the reply, and the
//! pooled bound on what many reservations in flight use together.

/// Ratios kept: the newest, so a change in the work shows within a few dozen replies.
const KEPT: usize = 64;

/// The share of replies a lowered reservation covers.
const QUANTILE: f64 = 0.9;

/// Ratios needed before the spread is trusted for a pooled bound ([`Usage::pooled`]).
const POOLED_FROM: usize = 16;

/// Standard deviations above the mean a pooled bound allows: the total of the reservations
/// in flight is exceeded no more often than one reservation exceeds its [`QUANTILE`], about
/// one time in twenty for a normal total.
const POOLED_SIGMAS: f64 = 1.645;

use super::dimension::MIN_BOOKED_COST;

/// The spread of `used / reserved` over the newest replies (see the module docs).
#[derive(Clone, Debug)]
pub(crate) struct Usage {
    /// The newest ratios, a ring.
    ratios: [f32; KEPT],
    /// Where the next ratio goes.
    next: usize,
    /// Ratios recorded so far (at most [`KEPT`] are kept).
    seen: usize,
    /// The sum of the ratios kept, kept as they come (the mean is read per grant).
    sum: f64,
    /// The sum of their squares, kept the same way (for their spread).
    sum_sq: f64,
    /// The largest estimate sampled (a bound on any one reservation's share of a total).
    largest: u64,
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
            sum_sq: 0.0,
            largest: 0,
            high: 1.0,
        }
    }
}

impl Usage {
    /// A reply used `used` of a reservation the caller estimated at `estimate`.
    pub(crate) fn record(&mut self, used: u64, estimate: u64) {
        // Small counts (whole requests) are what the provider counts, exactly.
        if estimate < MIN_BOOKED_COST {
            return;
        }
        let ratio = (used as f64 / estimate as f64).min(4.0) as f32;
        if self.seen >= KEPT {
            let old = f64::from(self.ratios[self.next]);
            self.sum -= old;
            self.sum_sq -= old * old;
        }
        self.sum += f64::from(ratio);
        self.sum_sq += f64::from(ratio) * f64::from(ratio);
        self.largest = self.largest.max(estimate);
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
    pub(crate) fn mean(&self) -> Option<f64> {
        let kept = self.kept();
        (kept > 0).then(|| self.sum / kept as f64)
    }

    /// The ratio a reservation may be lowered to, `None` before the first reply: the
    /// [`QUANTILE`] of the ratios kept, raised while they are few (by `1 + 1/sqrt(n)` of
    /// the highest for `n` ratios under sixteen: twice the one ratio seen, and closer to the
    /// quantile as replies come), never above 1.
    pub(crate) fn high(&self) -> Option<f64> {
        (self.seen > 0).then_some(self.high)
    }

    /// A bound on what reservations in flight will use together, given what they hold
    /// (`held`, lowered to `ratio` of their callers' estimates): their estimates' mean usage
    /// plus [`POOLED_SIGMAS`] standard deviations of the total, never more than `held`.
    ///
    /// Each reservation holds a high quantile of usage, so a total of many holds far more
    /// than the same quantile of the total: replies that use much and replies that use
    /// little come in the same flight. The total's spread is `σ·sqrt(Σ eᵢ²)` over the
    /// estimates `eᵢ`, bounded here by `σ·sqrt(e_max·Σ eᵢ)` with the largest estimate
    /// sampled. `held` when fewer than [`POOLED_FROM`] ratios are kept, or with no ratio.
    pub(crate) fn pooled(&self, held: u64, ratio: f64) -> u64 {
        let kept = self.kept();
        let ratio_usable = ratio.is_finite() && ratio > 0.0;
        if kept < POOLED_FROM || !ratio_usable || held == 0 {
            return held;
        }
        let mean = self.sum / kept as f64;
        // The sample variance; float noise can leave it a hair below zero.
        let variance = ((self.sum_sq - mean * self.sum) / (kept as f64 - 1.0)).max(0.0);
        let estimates = held as f64 / ratio;
        let spread = variance.sqrt() * (self.largest as f64 * estimates).sqrt();
        let bound = mean * estimates + POOLED_SIGMAS * spread;
        if bound.is_finite() && bound >= 0.0 { (bound.ceil() as u64).min(held) } else { held }
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

    #[test]
    fn a_flight_of_many_holds_its_mean_and_a_pooled_spread_not_each_ones_quantile() {
        let mut usage = Usage::default();
        // Fewer than sixteen replies: what is held stands.
        for used in 40..55 {
            usage.record(used, 140);
        }
        assert_eq!(usage.pooled(400, 0.57), 400);
        // The newest sixty-four replies use 40..=80 and 40..=62 of 140 (mean ratio 0.405,
        // sd 0.080).
        for used in (40..=80).chain(40..=62) {
            usage.record(used, 140);
        }
        // Five reservations of 80 (0.57 of 140) in flight: 400 held. Together they use
        // about 284 (0.405 × 700), and 1.645 sd of the total (0.080 × sqrt(140 × 700) ≈ 25)
        // more: 325.
        let pooled = usage.pooled(400, 80.0 / 140.0);
        assert!((320..=330).contains(&pooled), "{pooled}");
        // One reservation alone: never more than it holds, and not much less.
        let one = usage.pooled(80, 80.0 / 140.0);
        assert!((75..=80).contains(&one), "{one}");
        // Nothing held, or no ratio to read it by: nothing changes.
        assert_eq!(usage.pooled(0, 0.57), 0);
        assert_eq!(usage.pooled(400, 0.0), 400);
        assert_eq!(usage.pooled(400, f64::NAN), 400);
    }

    /// Whatever the replies used, a pooled bound never holds more than the reservations
    /// do, nor less than what their estimates use on average.
    #[test]
    fn a_pooled_bound_lies_between_the_mean_usage_and_what_is_held() {
        fn property(used: Vec<u16>, estimate: u16, held: u64, ratio: u8) -> bool {
            let estimate = u64::from(estimate.max(MIN_BOOKED_COST as u16));
            let ratio = f64::from(ratio.max(1)) / 255.0;
            let mut usage = Usage::default();
            for &u in &used {
                usage.record(u64::from(u), estimate);
            }
            let pooled = usage.pooled(held, ratio);
            let floor = usage
                .mean()
                .filter(|_| used.len() >= POOLED_FROM)
                .map_or(held, |mean| ((mean * held as f64 / ratio).floor() as u64).min(held));
            pooled <= held && pooled >= floor
        }
        quickcheck::QuickCheck::new()
            .tests(500)
            .quickcheck(property as fn(Vec<u16>, u16, u64, u8) -> bool);
    }
}
