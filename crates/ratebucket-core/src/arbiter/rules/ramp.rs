//! The ramp rule: after a cold start, a pause, or a rate learned or raised, a dimension's
//! admitted rate rises at most at a stated slope ([`Ramp`]), so a provider that refuses
//! sudden increases is never tripped. Off by default; set per dimension with
//! [`Change::Ramp`](crate::Change::Ramp).

use std::time::Duration;

use super::{Admission, Ask, Ctx, Rule};
use crate::arbiter::dims::Dims;
use crate::bucket::InvalidLimit;
use crate::time::Instant;

/// The share of the stated slope a ramp rises at: what is left covers a window's
/// rounding and the jitter between a grant and its request's arrival.
const KEPT: f64 = 0.9;

/// How much of its rate a rising dimension may let out at once, in seconds of it.
const GRAIN: f64 = 0.1;

/// How fast a dimension's admitted rate may rise: by at most `rise` permits per second
/// over each `every`. Set with [`Change::Ramp`](crate::Change::Ramp).
///
/// ```
/// use std::time::Duration;
/// use ratebucket_core::Ramp;
///
/// // Up by at most 20 requests per second every second.
/// let ramp = Ramp::new(20, Duration::from_secs(1))?;
/// assert_eq!(ramp.slope(), 20.0);
/// # Ok::<(), ratebucket_core::InvalidLimit>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ramp {
    /// Permits per second, per second.
    slope: f64,
}

impl Ramp {
    /// A rate rising by at most `rise` permits per second over each `every`; an error for a
    /// zero rise or a zero or absurd span.
    pub fn new(rise: u64, every: Duration) -> Result<Ramp, InvalidLimit> {
        if rise == 0 || every.is_zero() {
            return Err(InvalidLimit::ZeroRate);
        }
        let slope = rise as f64 / every.as_secs_f64();
        if !slope.is_finite() || slope > crate::MAX_LIMIT as f64 {
            return Err(InvalidLimit::TooLarge);
        }
        Ok(Ramp { slope })
    }

    /// The slope: permits per second the rate may rise by, per second.
    pub fn slope(&self) -> f64 {
        self.slope
    }
}

/// Where one dimension's ramp stands.
#[derive(Clone, Copy, Debug)]
enum Stage {
    /// Waiting for the next grant to start from nothing (a cold start, or a ramp set).
    Armed,
    /// Rising since `since` from `from` permits per second; `level` is what it may let
    /// out, as of `at`.
    Rising { since: Instant, from: f64, level: f64, at: Instant },
    /// Done: the dimension's own rate binds.
    Done,
}

/// One dimension's ramp.
#[derive(Clone, Copy, Debug)]
struct Rising {
    ramp: Ramp,
    stage: Stage,
}

impl Rising {
    /// The slope it rises at, kept below the stated one.
    fn slope(&self) -> f64 {
        self.ramp.slope * KEPT
    }

    /// The rate it allows at `now`.
    fn rate(&self, now: Instant) -> Option<f64> {
        let Stage::Rising { since, from, .. } = self.stage else {
            return None;
        };
        Some(from + self.slope() * now.saturating_duration_since(since).as_secs_f64())
    }

    /// The most it holds at once at `now`.
    fn cap(&self, now: Instant) -> f64 {
        self.rate(now).map_or(1.0, |r| (r * GRAIN).max(1.0))
    }

    /// What it may let out at `now` (its level refilled along the rising rate).
    fn level(&self, now: Instant) -> f64 {
        let Stage::Rising { since, from, level, at } = self.stage else {
            return f64::INFINITY;
        };
        let (t0, t1) = (
            at.saturating_duration_since(since).as_secs_f64(),
            now.saturating_duration_since(since).as_secs_f64(),
        );
        let added = from * (t1 - t0) + self.slope() * (t1 * t1 - t0 * t0) / 2.0;
        (level + added.max(0.0)).min(self.cap(now))
    }

    /// Starts rising at `since` from `from` permits per second, holding nothing.
    fn start(&mut self, since: Instant, from: f64) {
        self.stage = Stage::Rising { since, from: from.max(0.0), level: 0.0, at: since };
    }
}

/// Every dimension's ramp, where one is set.
#[derive(Clone, Debug, Default)]
pub(crate) struct Ramps {
    ramps: Vec<Option<Rising>>,
    /// Whether any ramp is not done (the hot paths skip the rule otherwise).
    active: bool,
}

impl Ramps {
    /// No ramps, over `dims` dimensions.
    pub(crate) fn new(dims: usize) -> Ramps {
        Ramps { ramps: vec![None; dims], active: false }
    }

    /// Sets `dimension`'s ramp (`None`: none); a new one starts with the next grant.
    pub(crate) fn set(&mut self, dimension: usize, ramp: Option<Ramp>) {
        self.ramps[dimension] = ramp.map(|ramp| Rising { ramp, stage: Stage::Armed });
        self.note();
    }

    /// `dimension`'s rate was raised at `now` from `from` permits per second: a ramp set
    /// on it rises from there.
    pub(crate) fn raised(&mut self, dimension: usize, from: f64, now: Instant) {
        if let Some(Some(rising)) = self.ramps.get_mut(dimension) {
            rising.start(now, from);
            self.active = true;
        }
    }

    /// Ends every ramp whose rate reached its dimension's: what the dimension holds is
    /// lowered to what the ramp let out, so a burst it kept meanwhile does not leave at
    /// once.
    pub(crate) fn settle(&mut self, dims: &mut Dims, now: Instant) {
        if !self.active {
            return;
        }
        for (d, rising) in self.ramps.iter_mut().enumerate() {
            let Some(rising) = rising else { continue };
            let Some(rate) = rising.rate(now) else { continue };
            let Ok(dim) = dims.get_mut(d) else { continue };
            if rate >= dim.bucket.rate().per_second_f64() {
                let level = rising.level(now).max(0.0);
                dim.bucket.lower_to(level as i64, now);
                rising.stage = Stage::Done;
            }
        }
        self.note();
    }

    fn note(&mut self) {
        self.active = self.ramps.iter().flatten().any(|r| !matches!(r.stage, Stage::Done));
    }

    /// How far from `now` the ramps let `cost` out: `None` if they do now.
    fn shortfall(&self, cost: &[u64], now: Instant) -> Option<Duration> {
        let mut wait = None;
        for (rising, &c) in self.ramps.iter().zip(cost) {
            let Some(rising) = rising.filter(|_| c > 0) else {
                continue;
            };
            let Stage::Rising { .. } = rising.stage else {
                continue;
            };
            let need = (c as f64).min(rising.cap(now));
            let short = need - rising.level(now);
            if short <= 1e-9 {
                continue;
            }
            // Solve from + slope·t over the wait for the shortfall.
            let (rate, slope) = (rising.rate(now).unwrap_or(0.0), rising.slope());
            let secs = ((rate * rate + 2.0 * slope * short).sqrt() - rate) / slope;
            let secs = Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX);
            wait = Some(wait.map_or(secs, |w: Duration| w.max(secs)) + Duration::from_micros(1));
        }
        wait
    }
}

impl Rule for Ramps {
    fn idle(&self) -> bool {
        !self.active
    }

    fn admit(&mut self, ask: &Ask<'_>, _ctx: &Ctx<'_>, now: Instant) -> Admission {
        if !self.active {
            return Admission::Admit;
        }
        // A ramp armed starts from nothing at its first grant: it never admits at once.
        let armed = self
            .ramps
            .iter()
            .zip(ask.cost)
            .any(|(r, &c)| c > 0 && matches!(r, Some(Rising { stage: Stage::Armed, .. })));
        if armed {
            for rising in self.ramps.iter_mut().flatten() {
                if let Stage::Armed = rising.stage {
                    rising.start(now, 0.0);
                }
            }
        }
        match self.shortfall(ask.cost, now) {
            None => Admission::Admit,
            Some(_) => Admission::Queue,
        }
    }

    fn ready(&self, ask: &Ask<'_>, _ctx: &Ctx<'_>, now: Instant) -> Option<Instant> {
        Some(self.shortfall(ask.cost, now).map_or(now, |w| now + w))
    }

    /// What it let out is taken from each ramp's level (a cost above what a ramp holds at
    /// once leaves it in debt, paid back at its rate).
    fn granted(&mut self, ask: &Ask<'_>, _queued: bool, now: Instant) {
        for (rising, &c) in self.ramps.iter_mut().zip(ask.cost) {
            let Some(rising) = rising else { continue };
            let level = rising.level(now);
            if let Stage::Rising { level: ref mut held, ref mut at, .. } = rising.stage {
                *held = level - c as f64;
                *at = now;
            }
        }
    }

    /// After a pause, every ramp rises again from nothing, from the pause's end.
    fn throttled(&mut self, until: Instant, _now: Instant) {
        for rising in self.ramps.iter_mut().flatten() {
            rising.start(until, 0.0);
        }
        self.note();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arbiter::fair::Caller;
    use crate::arbiter::tickets::Tickets;
    use crate::books::Books;
    use crate::bucket::TokenBucket;

    fn at_ms(ms: u64) -> Instant {
        Instant::from_millis(ms)
    }

    /// Grants as fast as the ramp allows from a cold start, and returns the grants per
    /// second of each of the first `secs` seconds.
    fn counts(ramp: Ramp, secs: u64) -> Vec<u64> {
        let dims = Dims::new(vec![TokenBucket::per_second(1_000, Instant::ZERO).unwrap()]);
        let (books, tickets) = (Books::new(1), Tickets::new(1));
        let ctx = Ctx { dims: &dims, books: &books, tickets: &tickets };
        let mut ramps = Ramps::new(1);
        ramps.set(0, Some(ramp));
        let ask = Ask { cost: &[1], estimate: &[1], caller: Caller::default(), max_wait: None };
        let mut counts = vec![0; secs as usize];
        let mut now = Instant::ZERO;
        // Time moves by milliseconds; every grant the ramp allows is taken.
        while now < at_ms(secs * 1_000) {
            if ramps.admit(&ask, &ctx, now) == Admission::Admit {
                ramps.granted(&ask, false, now);
                counts[(now.as_nanos() / 1_000_000_000) as usize] += 1;
                continue;
            }
            let ready = ramps.ready(&ask, &ctx, now).unwrap();
            assert!(ready > now, "ready when it would not admit");
            now = ready.max(now + Duration::from_millis(1));
        }
        counts
    }

    #[test]
    fn from_a_cold_start_no_second_admits_more_than_the_slope_beyond_the_one_before() {
        let ramp = Ramp::new(20, Duration::from_secs(1)).unwrap();
        let counts = counts(ramp, 10);
        let mut before = 0;
        for (second, &count) in counts.iter().enumerate() {
            assert!(count <= before + 20, "second {second}: {count} after {before}: {counts:?}");
            before = count;
        }
        // And it does rise: the last second admits most of the slope's worth.
        assert!(counts[9] >= 150, "{counts:?}");
    }

    /// Grants every `ask` the ramps allow in `[from, to)`, time moving by milliseconds.
    fn take(ramps: &mut Ramps, ctx: &Ctx<'_>, ask: &Ask<'_>, from: Instant, to: Instant) -> u64 {
        let (mut now, mut granted) = (from, 0);
        while now < to {
            if ramps.admit(ask, ctx, now) == Admission::Admit {
                ramps.granted(ask, false, now);
                granted += 1;
                continue;
            }
            now = ramps.ready(ask, ctx, now).unwrap().max(now + Duration::from_millis(1));
        }
        granted
    }

    #[test]
    fn after_a_pause_the_rate_rises_again_from_nothing() {
        let dims = Dims::new(vec![TokenBucket::per_second(1_000, Instant::ZERO).unwrap()]);
        let (books, tickets) = (Books::new(1), Tickets::new(1));
        let ctx = Ctx { dims: &dims, books: &books, tickets: &tickets };
        let mut ramps = Ramps::new(1);
        ramps.set(0, Some(Ramp::new(20, Duration::from_secs(1)).unwrap()));
        let ask = Ask { cost: &[1], estimate: &[1], caller: Caller::default(), max_wait: None };
        // Five seconds of rising: the fifth second admits about 80.
        take(&mut ramps, &ctx, &ask, Instant::ZERO, at_ms(4_000));
        let risen = take(&mut ramps, &ctx, &ask, at_ms(4_000), at_ms(5_000));
        assert!(risen >= 70, "{risen}");
        // A pause until 6 s: nothing before its end, then a second of at most the slope.
        ramps.throttled(at_ms(6_000), at_ms(5_000));
        assert_eq!(ramps.admit(&ask, &ctx, at_ms(5_500)), Admission::Queue);
        let after = take(&mut ramps, &ctx, &ask, at_ms(6_000), at_ms(7_000));
        assert!((1..=20).contains(&after), "{after} in the first second after the pause");
    }

    #[test]
    fn a_zero_or_absurd_slope_is_refused() {
        assert!(Ramp::new(0, Duration::from_secs(1)).is_err());
        assert!(Ramp::new(1, Duration::ZERO).is_err());
        assert!(Ramp::new(u64::MAX, Duration::from_nanos(1)).is_err());
    }
}
