//! Inferring how a provider enforces a limit from the quota headers it sends back.

use std::collections::VecDeque;
use std::time::Duration;

use crate::ids::SendStamp;
use crate::time::Instant;

/// How a provider appears to enforce one limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProviderModel {
    /// Not enough evidence yet.
    Unknown,
    /// A bucket of `limit` that refills continuously at `limit / window`: the time it
    /// reports until full is consistent with `(limit - remaining) / rate` every time.
    Bucket {
        /// Its capacity (the reported limit).
        limit: u64,
    },
    /// Anything else: a fixed or sliding window, or observations that disagree. The safe
    /// assumption is a window, so the client keeps its conservative burst.
    Window,
}

/// One quota observation: the provider's limit, what remains, and the time until full.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuotaObservation {
    /// The limit per window.
    pub limit: u64,
    /// What remains now.
    pub remaining: u64,
    /// Time until the limit is back to full.
    pub reset: Duration,
    /// How much shorter than the provider meant `reset` may read: for a reset sent as an
    /// instant, the span between the request's send and the reply's reading (the provider
    /// wrote it within that span, and it was turned into a wait at its end); zero for a
    /// reset sent as a wait.
    pub read_short_by: Duration,
    /// The resolution the reset was written at, when its form says (an RFC 3339 instant
    /// in whole seconds: a second, whatever fraction of a second it reads at once turned
    /// into a wait); zero where the form does not say, and the resolution is told from the
    /// values reported (a wait in whole seconds is a multiple of one).
    pub resolution: Duration,
}

/// Per-dimension inference over the most recent observations.
///
/// An observation with `remaining == limit` says nothing (both models report "full"). Every
/// recent informative observation must agree with `reset = (limit - remaining) * window /
/// limit` (within a tolerance of 1% of the window, at least 1 ms, plus one unit's refill:
/// `remaining` is reported whole, the level it is read from is not); any disagreement
/// means "window". Agreement alone is not enough: a window's reset falls with time while a
/// bucket's rises with use, so a client spending at about the refill rate sees the two
/// cross, and near the crossing a window agrees with the formula for a while. The verdict
/// is "bucket" only once an unbroken run of agreeing observations spans at least four
/// tolerances, more than the two models can share: of predicted reset (remaining moved
/// that far), or, when resets are coarser than a hundredth of the window, of the instant a
/// bucket would be full (time passed while the formula held: a window's end stays put, so
/// its agreeing observations all put that instant within a tolerance of it, while a bucket
/// spent at its refill rate moves it on with the clock).
/// The instant is taken at its least certain: each observation was computed between its
/// request's send and its reply's reading, and the span counts only what every such
/// placement agrees on. A change of limit starts the evidence afresh.
///
/// Observations count in whatever order their replies arrive. Each one relates a remaining
/// and a reset the provider computed at one instant, so it is evidence about the provider's
/// model whenever it was made: replies that overtake one another (concurrent requests on a
/// loaded machine do) must not throw the evidence away, or the verdict would depend on the
/// schedule. Only a reply older than the newest one that reports a different limit is
/// ignored: the limit changed since, and it would wipe the newer evidence.
#[derive(Clone, Debug)]
pub struct BucketInference {
    window: Duration,
    newest: Option<u64>,
    samples: VecDeque<QuotaObservation>,
    /// The current unbroken run of agreeing observations.
    run: Option<Run>,
    /// The coarsest resolution every reset reported so far is a multiple of, in
    /// nanoseconds: a second (IETF `RateLimit` fields, Azure), 100 or 10 ms (float seconds
    /// with one or two decimals, as Cerebras sends), down to a millisecond. A reset may be
    /// that far off.
    resolution: u64,
    /// The coarsest step a reported `remaining` has been rounded to (0: exact): it may be
    /// half that far off.
    precision: u64,
}

/// An unbroken run of observations agreeing with a bucket (see [`BucketInference`]).
#[derive(Clone, Copy, Debug)]
struct Run {
    /// The lowest and highest remaining in it.
    low: u64,
    high: u64,
    /// When a bucket would be full, over its observations whose send and reading are
    /// known.
    full: Option<Full>,
}

/// When a bucket would be full by one or more observations, each placed at either end of
/// the time it may have been computed in: the earliest such instant by the readings (the
/// latest placements), and the latest by the sends (the earliest placements). What the
/// latter exceeds the former by, every placement agrees on.
#[derive(Clone, Copy, Debug)]
struct Full {
    by_reading: Instant,
    by_send: Instant,
}

impl Full {
    /// Both observations' evidence together.
    fn and(self, other: Full) -> Full {
        Full {
            by_reading: self.by_reading.min(other.by_reading),
            by_send: self.by_send.max(other.by_send),
        }
    }

    /// How far the full instant surely moved.
    fn span(self) -> Duration {
        self.by_send.saturating_duration_since(self.by_reading)
    }
}

/// The resolutions a reset is tried against, coarsest first, in nanoseconds.
const RESOLUTIONS: [u64; 4] = [1_000_000_000, 100_000_000, 10_000_000, 1_000_000];

/// Whether `reset` is a multiple of `resolution`, give or take a microsecond (a reset
/// written as float seconds comes back through `f64`).
fn multiple_of(reset: Duration, resolution: u64) -> bool {
    let rest = (reset.as_nanos() % u128::from(resolution)) as u64;
    rest <= 1_000 || resolution - rest <= 1_000
}

/// How many recent informative observations must all agree with a bucket.
const SAMPLES: usize = 8;

/// The span of predicted reset, in tolerances, the agreeing observations must cover.
const SPAN_TOLERANCES: f64 = 4.0;

impl BucketInference {
    /// Inference for limits counted over `window` (a minute for RPM/TPM).
    pub fn new(window: Duration) -> BucketInference {
        BucketInference {
            window,
            newest: None,
            samples: VecDeque::new(),
            run: None,
            resolution: RESOLUTIONS[0],
            precision: 0,
        }
    }

    /// Takes `remaining` to be rounded to multiples of `precision` from now on (the
    /// coarsest step seen is kept).
    pub fn widen(&mut self, precision: u64) {
        self.precision = self.precision.max(precision);
    }

    /// Adds an observation from the reply to the request stamped `sent`, computed by the
    /// provider between `taken`'s two instants when they are known (the request's send and
    /// the reply's reading); returns the verdict, or `None` when the observation was stale
    /// (older than the newest, with a limit that has changed since) and changed nothing.
    pub fn observe(
        &mut self,
        sent: SendStamp,
        observation: QuotaObservation,
        taken: Option<(Instant, Instant)>,
    ) -> Option<ProviderModel> {
        let older = self.newest.is_some_and(|newest| sent.seq < newest);
        let limit_changed_since = self.samples.back().is_some_and(|s| s.limit != observation.limit);
        if older && limit_changed_since {
            return None;
        }
        if !older {
            self.newest = Some(sent.seq);
        }
        let stated = u64::try_from(observation.resolution.as_nanos()).unwrap_or(u64::MAX);
        self.resolution = if stated > 0 {
            // An instant in whole seconds reads at any fraction once it is a wait: the
            // form, not the value, says how far it may be off.
            self.resolution.min(stated)
        } else {
            RESOLUTIONS
                .into_iter()
                .filter(|&r| r <= self.resolution)
                .find(|&r| multiple_of(observation.reset, r))
                .unwrap_or(RESOLUTIONS[RESOLUTIONS.len() - 1])
        };
        let informative = observation.limit > 0 && observation.remaining < observation.limit;
        if informative {
            if self.samples.back().is_some_and(|s| s.limit != observation.limit) {
                self.samples.clear();
                self.run = None;
            }
            self.run = if self.consistent(&observation) {
                let to_full = self.predicted(&observation);
                let full = taken.map(|(sent, read)| Full {
                    by_reading: read + to_full,
                    by_send: sent + to_full,
                });
                let remaining = observation.remaining;
                Some(match self.run {
                    Some(run) => Run {
                        low: run.low.min(remaining),
                        high: run.high.max(remaining),
                        full: match (run.full, full) {
                            (Some(a), Some(b)) => Some(a.and(b)),
                            (a, b) => a.or(b),
                        },
                    },
                    None => Run { low: remaining, high: remaining, full },
                })
            } else {
                None
            };
            self.samples.push_back(observation);
            if self.samples.len() > SAMPLES {
                self.samples.pop_front();
            }
        }
        Some(self.model())
    }

    /// The verdict on the evidence so far.
    pub fn model(&self) -> ProviderModel {
        let Some(first) = self.samples.front() else {
            return ProviderModel::Unknown;
        };
        if !self.samples.iter().all(|s| self.consistent(s)) {
            return ProviderModel::Window;
        }
        let Some(run) = self.run else {
            return ProviderModel::Unknown;
        };
        let by_use = self.window.as_secs_f64() * (run.high - run.low) as f64 / first.limit as f64;
        // Time passing counts where resets are coarser than the window's own tolerance:
        // there the span of use grows with the resolution, and a client at its
        // conservative burst may never move `remaining` that far. Finer resets are told
        // by use, as they always were.
        let coarse = self.resolution as f64 / 1e9 > self.window.as_secs_f64() * 0.01;
        let by_time = run.full.filter(|_| coarse).map_or(0.0, |full| full.span().as_secs_f64());
        if by_use.max(by_time) >= SPAN_TOLERANCES * self.band(first.limit) {
            ProviderModel::Bucket { limit: first.limit }
        } else {
            ProviderModel::Unknown
        }
    }

    /// A bucket, if every recent informative observation agrees with one (however little
    /// evidence they span): what a provider documented to count in buckets is taken to be
    /// ([`QuotaPolicy::documented_bucket`](crate::QuotaPolicy::documented_bucket)). `None`
    /// before any informative observation, or when one disagrees.
    pub fn agreeing_bucket(&self) -> Option<ProviderModel> {
        let first = self.samples.front()?;
        self.samples
            .iter()
            .all(|s| self.consistent(s))
            .then_some(ProviderModel::Bucket { limit: first.limit })
    }

    /// Whether the resets seen so far are fine enough to ever tell a bucket: a window of
    /// two seconds reported in whole seconds is not.
    pub fn can_tell(&self) -> bool {
        SPAN_TOLERANCES * self.tolerance() < self.window.as_secs_f64()
    }

    /// How far a reported reset may stray from a bucket's, in seconds: a hundredth of the
    /// window, or the resets' resolution when coarser (a second when they come in whole
    /// seconds, 10 ms in float seconds with two decimals; at least a millisecond).
    fn tolerance(&self) -> f64 {
        (self.window.as_secs_f64() * 0.01).max(self.resolution as f64 / 1e9)
    }

    /// How far a reported reset may stray from the formula for a provider of `limit`: the
    /// tolerance, plus the refill time of one unit. A bucket's level is continuous but its
    /// `remaining` is reported whole, so its reset may be up to a unit's refill shorter
    /// (or, rounded the other way, longer) than the formula gives; with few units per
    /// window (40 requests in 250 ms: 6.25 ms each) that is more than the tolerance.
    fn band(&self, limit: u64) -> f64 {
        let unit = self.window.as_secs_f64() / limit as f64;
        self.tolerance() + unit * (1.0 + self.precision as f64 / 2.0)
    }

    /// Whether `s` agrees with a bucket: its reset within the band of the formula's, or,
    /// for a reset that may read short ([`QuotaObservation::read_short_by`]), up to that
    /// much below it.
    fn consistent(&self, s: &QuotaObservation) -> bool {
        let off = s.reset.as_secs_f64() - self.predicted(s).as_secs_f64();
        let band = self.band(s.limit);
        off <= band && off >= -band - s.read_short_by.as_secs_f64()
    }

    /// The reset a bucket of `s.limit` refilling over the window would report.
    fn predicted(&self, s: &QuotaObservation) -> Duration {
        let used = u128::from(s.limit.saturating_sub(s.remaining));
        let nanos = self.window.as_nanos().saturating_mul(used) / u128::from(s.limit.max(1));
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }
}

#[cfg(test)]
mod tests;
