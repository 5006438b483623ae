//! The provider's own limit enforcement: token bucket, fixed window and sliding log.
//!
//! Written independently of the client's arithmetic (floating point, its own models), so
//! that a bug in the client cannot be mirrored here and go unnoticed.

use std::collections::VecDeque;
use std::time::Duration;

/// How a limit is enforced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Model {
    /// Continuous refill at `limit / window`, capacity `limit`, starting full (OpenAI's
    /// documented behaviour).
    TokenBucket,
    /// At most `limit` per window; windows are aligned to the server's start and reset whole.
    FixedWindow,
    /// At most `limit` in any trailing window of length `window`.
    SlidingLog,
    /// At most `limit` per window; windows are aligned to the wall clock (whole multiples of
    /// the window since the UNIX epoch: a minute's start at :00), as gateways that count
    /// per clock minute do.
    ClockWindow,
}

/// One limit: `limit` units per `window`, enforced by `model`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitSpec {
    /// Units allowed per window.
    pub limit: u64,
    /// Window length (a minute for RPM/TPM; shorter in benchmarks).
    pub window: Duration,
    /// Enforcement model.
    pub model: Model,
}

impl LimitSpec {
    /// `limit` per minute, as a token bucket.
    pub fn per_minute(limit: u64) -> LimitSpec {
        LimitSpec { limit, window: Duration::from_secs(60), model: Model::TokenBucket }
    }

    /// With another window length.
    pub fn window(mut self, window: Duration) -> LimitSpec {
        self.window = window;
        self
    }

    /// With another model.
    pub fn model(mut self, model: Model) -> LimitSpec {
        self.model = model;
        self
    }
}

/// The longest wait the provider ever announces: a limit of zero, or a rate so slow the
/// arithmetic overflows, answers "a day" rather than panicking.
pub(crate) const LONGEST_WAIT: Duration = Duration::from_secs(86_400);

/// `secs` as a duration, at most [`LONGEST_WAIT`] (infinite and NaN included).
fn seconds(secs: f64) -> Duration {
    Duration::try_from_secs_f64(secs).unwrap_or(LONGEST_WAIT).min(LONGEST_WAIT)
}

/// The live state of one limit. Times are offsets from the server's start.
#[derive(Debug)]
pub(crate) struct Limit {
    spec: LimitSpec,
    state: State,
    /// How far into one of its windows a clock-aligned limit was when the server started
    /// (zero for the others): a window's index counts from the epoch, not the start.
    phase: Duration,
}

#[derive(Debug)]
enum State {
    Bucket { level: f64, at: Duration },
    Window { index: u64, used: u64 },
    Log { entries: VecDeque<(Duration, u64)>, used: u64 },
}

impl Limit {
    pub(crate) fn new(spec: LimitSpec) -> Limit {
        let phase = match spec.model {
            Model::ClockWindow => {
                let since_epoch = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default();
                let window = spec.window.as_nanos().max(1);
                Duration::from_nanos((since_epoch.as_nanos() % window) as u64)
            }
            _ => Duration::ZERO,
        };
        Limit::with_phase(spec, phase)
    }

    /// A limit whose clock-aligned windows stand `phase` into one at the server's start.
    fn with_phase(spec: LimitSpec, phase: Duration) -> Limit {
        let state = match spec.model {
            Model::TokenBucket => State::Bucket { level: spec.limit as f64, at: Duration::ZERO },
            Model::FixedWindow | Model::ClockWindow => State::Window {
                index: (phase.as_nanos() / spec.window.as_nanos().max(1)) as u64,
                used: 0,
            },
            Model::SlidingLog => State::Log { entries: VecDeque::new(), used: 0 },
        };
        Limit { spec, state, phase }
    }

    pub(crate) fn spec(&self) -> LimitSpec {
        self.spec
    }

    fn rate_per_sec(&self) -> f64 {
        self.spec.limit as f64 / self.spec.window.as_secs_f64()
    }

    fn advance(&mut self, now: Duration) {
        let rate = self.rate_per_sec();
        let phase = self.phase;
        let (limit, window) = (self.spec.limit, self.spec.window);
        match &mut self.state {
            State::Bucket { level, at } => {
                if now > *at {
                    *level = (*level + rate * (now - *at).as_secs_f64()).min(limit as f64);
                    *at = now;
                }
            }
            State::Window { index, used } => {
                let current = ((now + phase).as_nanos() / window.as_nanos().max(1)) as u64;
                if current != *index {
                    *index = current;
                    *used = 0;
                }
            }
            State::Log { entries, used } => {
                while let Some(&(t, amount)) = entries.front() {
                    if t + window <= now {
                        entries.pop_front();
                        *used -= amount;
                    } else {
                        break;
                    }
                }
            }
        }
    }

    /// Units left now (rounded down).
    pub(crate) fn remaining(&mut self, now: Duration) -> u64 {
        self.advance(now);
        let limit = self.spec.limit;
        match &self.state {
            State::Bucket { level, .. } => level.max(0.0).floor() as u64,
            State::Window { used, .. } | State::Log { used, .. } => limit.saturating_sub(*used),
        }
    }

    /// How long until `amount` more fits (zero if it fits now; `None` if it never can).
    pub(crate) fn wait_for(&mut self, amount: u64, now: Duration) -> Option<Duration> {
        if amount > self.spec.limit {
            return None;
        }
        self.advance(now);
        let rate = self.rate_per_sec();
        let (limit, window) = (self.spec.limit, self.spec.window);
        Some(match &self.state {
            State::Bucket { level, .. } => {
                let deficit = amount as f64 - level;
                if deficit <= 0.0 { Duration::ZERO } else { seconds(deficit / rate) }
            }
            State::Window { index, used } => {
                if used + amount <= limit {
                    Duration::ZERO
                } else {
                    (window * (*index as u32 + 1)).saturating_sub(now + self.phase)
                }
            }
            State::Log { entries, used } => {
                let mut excess = (used + amount).saturating_sub(limit);
                if excess == 0 {
                    return Some(Duration::ZERO);
                }
                let mut wait = Duration::ZERO;
                for &(t, a) in entries {
                    wait = (t + window).saturating_sub(now);
                    excess = excess.saturating_sub(a);
                    if excess == 0 {
                        break;
                    }
                }
                wait
            }
        })
    }

    /// Charges `amount` (the caller checked that it fits).
    pub(crate) fn charge(&mut self, amount: u64, now: Duration) {
        self.advance(now);
        match &mut self.state {
            State::Bucket { level, .. } => *level -= amount as f64,
            State::Window { used, .. } => *used += amount,
            State::Log { entries, used } => {
                if amount > 0 {
                    entries.push_back((now, amount));
                    *used += amount;
                }
            }
        }
    }

    /// Gives back `amount` of an earlier charge (a reservation settled lower than it was
    /// charged): never above the limit, never more than is used.
    pub(crate) fn refund(&mut self, amount: u64, now: Duration) {
        self.advance(now);
        let limit = self.spec.limit as f64;
        match &mut self.state {
            State::Bucket { level, .. } => *level = (*level + amount as f64).min(limit),
            State::Window { used, .. } => *used = used.saturating_sub(amount),
            State::Log { entries, used } => {
                // Taken back from the latest charges first.
                let mut left = amount;
                for (_, charged) in entries.iter_mut().rev() {
                    let back = left.min(*charged);
                    *charged -= back;
                    *used -= back;
                    left -= back;
                    if left == 0 {
                        break;
                    }
                }
            }
        }
    }

    /// Time until the limit is back to full (the `x-ratelimit-reset-*` value).
    pub(crate) fn reset_after(&mut self, now: Duration) -> Duration {
        self.advance(now);
        let rate = self.rate_per_sec();
        let (limit, window) = (self.spec.limit, self.spec.window);
        match &self.state {
            State::Bucket { level, .. } => seconds(((limit as f64 - level) / rate).max(0.0)),
            State::Window { index, used } => {
                if *used == 0 {
                    Duration::ZERO
                } else {
                    (window * (*index as u32 + 1)).saturating_sub(now + self.phase)
                }
            }
            State::Log { entries, .. } => {
                entries.back().map_or(Duration::ZERO, |&(t, _)| (t + window).saturating_sub(now))
            }
        }
    }
}

/// Formats a duration the way Go's `time.Duration.String` does, as OpenAI's
/// `x-ratelimit-reset-*` headers are: `6m0s`, `12ms`, `2m52.8s`, `1h23m31s`, `0s`.
pub fn go_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".to_owned();
    }
    if nanos < 1_000 {
        return format!("{nanos}ns");
    }
    if nanos < 1_000_000 {
        return format!("{}µs", trim_fraction(nanos, 1_000));
    }
    if nanos < 1_000_000_000 {
        return format!("{}ms", trim_fraction(nanos, 1_000_000));
    }
    let total_secs = nanos / 1_000_000_000;
    let (h, m) = (total_secs / 3600, (total_secs / 60) % 60);
    let secs = trim_fraction(nanos % 60_000_000_000, 1_000_000_000);
    match (h, m) {
        (0, 0) => format!("{secs}s"),
        (0, _) => format!("{m}m{secs}s"),
        _ => format!("{h}h{m}m{secs}s"),
    }
}

/// `value / unit` with its fractional digits, trailing zeros trimmed.
fn trim_fraction(value: u128, unit: u128) -> String {
    let whole = value / unit;
    let frac = value % unit;
    if frac == 0 {
        return whole.to_string();
    }
    let width = unit.ilog10() as usize;
    let digits = format!("{frac:0width$}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use quickcheck::{Arbitrary, Gen, QuickCheck};

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn go_durations_match_the_format_providers_send() {
        let cases = [
            (Duration::ZERO, "0s"),
            (Duration::from_secs(1), "1s"),
            (Duration::from_secs(360), "6m0s"),
            (ms(12), "12ms"),
            (ms(547), "547ms"),
            (ms(7660), "7.66s"),
            (ms(172_800), "2m52.8s"),
            (ms(179_560), "2m59.56s"),
            (Duration::from_secs(5011), "1h23m31s"),
            (ms(3_723_500), "1h2m3.5s"),
            (Duration::from_micros(500), "500µs"),
            (Duration::from_micros(1500), "1.5ms"),
        ];
        for (d, want) in cases {
            assert_eq!(go_duration(d), want, "{d:?}");
        }
    }

    #[test]
    fn a_token_bucket_starts_full_and_refills_continuously() {
        let mut l = Limit::new(LimitSpec::per_minute(600));
        assert_eq!(l.remaining(ms(0)), 600);
        l.charge(600, ms(0));
        assert_eq!(l.remaining(ms(1000)), 10);
        assert_eq!(l.wait_for(20, ms(1000)), Some(ms(1000)));
        assert_eq!(l.reset_after(ms(1000)), Duration::from_secs(59));
        assert_eq!(l.wait_for(601, ms(0)), None);
    }

    #[test]
    fn a_fixed_window_resets_whole_at_the_boundary() {
        let spec =
            LimitSpec::per_minute(10).window(Duration::from_secs(10)).model(Model::FixedWindow);
        let mut l = Limit::new(spec);
        l.charge(10, ms(9_000));
        assert_eq!(l.remaining(ms(9_999)), 0);
        assert_eq!(l.wait_for(1, ms(9_500)), Some(ms(500)));
        assert_eq!(l.reset_after(ms(9_500)), ms(500));
        assert_eq!(l.remaining(ms(10_000)), 10);
    }

    #[test]
    fn a_clock_window_resets_whole_where_the_clock_turns() {
        // Started 4 s into a 10 s window of the clock's: the first boundary comes 6 s in.
        let spec =
            LimitSpec::per_minute(10).window(Duration::from_secs(10)).model(Model::ClockWindow);
        let mut l = Limit::with_phase(spec, ms(4_000));
        l.charge(10, ms(1_000));
        assert_eq!(l.remaining(ms(5_999)), 0);
        assert_eq!(l.wait_for(1, ms(5_500)), Some(ms(500)));
        assert_eq!(l.reset_after(ms(5_500)), ms(500));
        assert_eq!(l.remaining(ms(6_000)), 10);
        l.charge(10, ms(15_000));
        assert_eq!(l.remaining(ms(15_999)), 0);
        assert_eq!(l.remaining(ms(16_000)), 10);
        // Made now, it stands where the clock does.
        let since_epoch =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
        let phase = Limit::new(spec).phase;
        let drift = (since_epoch.as_nanos() % 10_000_000_000) as i128 - phase.as_nanos() as i128;
        assert!(drift.abs() < 1_000_000_000, "{phase:?}");
    }

    #[test]
    fn a_sliding_log_frees_units_as_they_age_out() {
        let spec =
            LimitSpec::per_minute(10).window(Duration::from_secs(10)).model(Model::SlidingLog);
        let mut l = Limit::new(spec);
        l.charge(4, ms(0));
        l.charge(6, ms(5_000));
        assert_eq!(l.wait_for(3, ms(6_000)), Some(ms(4_000)));
        assert_eq!(l.wait_for(5, ms(6_000)), Some(ms(9_000)));
        assert_eq!(l.remaining(ms(10_000)), 4);
        assert_eq!(l.reset_after(ms(10_000)), ms(5_000));
    }

    #[derive(Clone, Debug)]
    struct Arrivals {
        model: Model,
        limit: u64,
        /// (gap in ms, amount)
        steps: Vec<(u64, u64)>,
    }

    impl Arbitrary for Arrivals {
        fn arbitrary(g: &mut Gen) -> Arrivals {
            let limit = u64::arbitrary(g) % 50 + 1;
            let model = *g
                .choose(&[
                    Model::TokenBucket,
                    Model::FixedWindow,
                    Model::SlidingLog,
                    Model::ClockWindow,
                ])
                .expect("non-empty");
            let n = usize::arbitrary(g) % 300 + 1;
            let steps =
                (0..n).map(|_| (u64::arbitrary(g) % 700, u64::arbitrary(g) % limit + 1)).collect();
            Arrivals { model, limit, steps }
        }
    }

    /// Admits greedily whatever fits, then checks every trailing window.
    fn admitted_within_the_model_bound(a: Arrivals) -> bool {
        let window = Duration::from_secs(10);
        let spec = LimitSpec { limit: a.limit, window, model: a.model };
        let mut limit = Limit::new(spec);
        let phase = limit.phase;
        let mut now = Duration::ZERO;
        let mut admitted: Vec<(Duration, u64)> = Vec::new();
        for (gap, amount) in a.steps {
            now += ms(gap);
            if limit.wait_for(amount, now) == Some(Duration::ZERO) {
                limit.charge(amount, now);
                admitted.push((now, amount));
            }
        }
        let rate = a.limit as f64 / window.as_secs_f64();
        admitted.iter().enumerate().all(|(i, &(start, _))| {
            admitted[i..].iter().all(|&(end, _)| {
                let in_window: u64 =
                    admitted[i..].iter().take_while(|&&(t, _)| t <= end).map(|&(_, a)| a).sum();
                let span = end - start;
                match a.model {
                    // Anything granted in a span W must fit capacity + rate * W.
                    Model::TokenBucket => {
                        in_window as f64 <= a.limit as f64 + rate * span.as_secs_f64() + 1e-6
                    }
                    // At most the limit in any trailing window shorter than W...
                    Model::SlidingLog => span >= window || in_window <= a.limit,
                    // ...and at most the limit within one aligned window.
                    Model::FixedWindow | Model::ClockWindow => {
                        let same = (start + phase).as_nanos() / window.as_nanos()
                            == (end + phase).as_nanos() / window.as_nanos();
                        !same || in_window <= a.limit
                    }
                }
            })
        })
    }

    #[test]
    fn every_model_admits_no_more_than_its_bound() {
        QuickCheck::new()
            .rng(Gen::from_size_and_seed(64, 0x51a1))
            .tests(300)
            .quickcheck(admitted_within_the_model_bound as fn(Arrivals) -> bool);
    }
}
