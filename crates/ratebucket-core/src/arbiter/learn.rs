//! Learning a provider's quota from its reports: its limit, its burst, how it counts.
//!
//! A dimension with a [`QuotaPolicy`] ([`Arbiter::learn_quota`]) takes every report of the
//! provider's (a reply's `limit`, `remaining` and `reset`, whatever headers carried them)
//! through one input, [`Arbiter::observe_quota`], which:
//!
//! 1. adopts the reported limit where none was configured (and the burst the provider's
//!    `remaining` offers at once), or lowers a configured limit to a smaller reported one,
//!    never raising it;
//! 2. infers how the provider counts ([`BucketInference`]): a bucket that refills
//!    continuously lends its whole capacity and the level follows the provider's reports
//!    ([`Arbiter::sync_level`]); a window (fixed or sliding) keeps the conservative burst
//!    and caps each trailing window at the limit ([`WindowGuard`]);
//! 3. folds `remaining` (lowers only) and, under a guard, the window's use.
//!
//! A provider that reports no reset (or one too coarse for its window) cannot be told apart
//! this way: `edges.rs` counts it blind, and finds its fixed windows' edges if it has them.

use super::edges::EdgeFinder;
use super::*;
use crate::bucket::Limit;
use crate::infer::{BucketInference, ProviderModel, QuotaObservation};

/// How a dimension learns from the provider's reports ([`Arbiter::learn_quota`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct QuotaPolicy {
    /// The window the provider counts its limit over (a minute for RPM and TPM).
    pub window: Duration,
    /// The limit per window the user configured, if any: a reported limit below it is
    /// adopted, one above it never is. `None`: the provider's reported limit is adopted.
    pub configured: Option<u64>,
    /// Whether to lend the provider's whole capacity once its reports show a bucket that
    /// refills continuously (otherwise the conservative burst, a sixth of the limit, is
    /// kept; see [`Limit::per`]).
    pub provider_burst: bool,
}

impl QuotaPolicy {
    /// A configured `limit` per `window`, lowered by a smaller reported one.
    pub fn known(limit: u64, window: Duration) -> QuotaPolicy {
        QuotaPolicy {
            window,
            configured: Some(limit),
            provider_burst: true,
        }
    }

    /// No limit known: the provider's reported limit per `window` is adopted.
    pub fn unknown(window: Duration) -> QuotaPolicy {
        QuotaPolicy {
            window,
            configured: None,
            provider_burst: true,
        }
    }

    /// Keeps the conservative burst even against a provider that refills continuously.
    pub fn conservative(mut self) -> QuotaPolicy {
        self.provider_burst = false;
        self
    }
}

/// One report of the provider's on one dimension, as a reply's headers carried it (IETF
/// `RateLimit` fields, `x-ratelimit-*`, or any other form an adapter reads).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QuotaReport {
    /// Units allowed per window.
    pub limit: Option<u64>,
    /// Units left when the provider took the request.
    pub remaining: Option<u64>,
    /// Time until the quota is whole again.
    pub reset: Option<Duration>,
    /// The window the provider says `limit` is counted over (IETF `RateLimit-Policy`'s
    /// `w`), when it says; `None`: the window in force (the policy's, at first).
    pub window: Option<Duration>,
}

/// What a dimension has learned of the provider ([`Arbiter::dimension`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LearnedQuota {
    /// The limit per window in force: configured, lowered or adopted.
    pub limit: Option<u64>,
    /// The window that limit is counted over: the policy's, or the provider's own when it
    /// reports a different one with a stricter rate (see [`QuotaReport::window`]).
    pub window: Duration,
    /// How the provider appears to count.
    pub model: ProviderModel,
    /// Whether the dimension lends the provider's whole capacity (a continuous bucket was
    /// recognised) and follows its reports.
    pub provider_burst: bool,
    /// Whether each trailing window is capped at the limit (the provider counts in
    /// windows).
    pub guarded: bool,
    /// For a provider that counts in fixed windows and sends no reset: the latest instant
    /// one of its windows may have begun at, found from the moment its `remaining` jumped
    /// back up (the others begin whole windows away). Each window's limit is spent from
    /// then on.
    pub window_edge: Option<Instant>,
}

/// The longest window a provider's report may make a dimension count in (see
/// [`Arbiter::follow_window`]): a day.
const MAX_LEARNED_WINDOW: Duration = Duration::from_secs(86_400);

/// A dimension's learning state.
#[derive(Clone, Debug)]
pub(super) struct Learner {
    /// The policy as given ([`Arbiter::learn_quota`] compares it to a new one).
    pub(super) policy: QuotaPolicy,
    /// The window the provider counts in: the policy's, until the provider reports its own.
    pub(super) window: Duration,
    /// The most `current` may be, per `window`: the configured limit (then the provider's,
    /// once its own window replaced the policy's); `None` where none was configured.
    ceiling: Option<u64>,
    /// The limit per window in force.
    pub(super) current: Option<u64>,
    inference: BucketInference,
    /// Whether the provider's whole capacity is lent.
    raised: bool,
    /// Whether the provider is counted blind: limit and remaining but no reset, so a guard
    /// holds each trailing window to the limit and the whole limit is the burst (see
    /// [`Arbiter::count_blind`]).
    pub(super) blind: bool,
    /// Where a blind provider's fixed windows begin, found from its reports.
    pub(super) edges: EdgeFinder,
    /// The longest a reply took so far, from its request's send to its report: with the
    /// longest wait to be sent, what a granted request may take to reach the provider at
    /// most (see [`provider_burst`]).
    reply_time: Duration,
}

impl Arbiter {
    /// Makes `dimension` learn from the provider's reports under `policy`. Giving it the
    /// policy it already has changes nothing (what it learned stays); another policy starts
    /// learning afresh. The bucket is left as it is: build it from the same limit
    /// ([`Limit::per`] of the configured limit, or a cautious start when none is known);
    /// reports move it from then on.
    pub fn learn_quota(
        &mut self,
        dimension: usize,
        policy: QuotaPolicy,
        now: Instant,
    ) -> Result<(), InvalidLimit> {
        self.clock.advance(now);
        self.dimension_mut(dimension)?;
        if policy.window.is_zero() {
            return Err(InvalidLimit::ZeroRate);
        }
        if let Some(limit) = policy.configured {
            Limit::per(limit, policy.window).rate()?;
        }
        if self.dims[dimension]
            .learner
            .as_ref()
            .is_some_and(|learner| learner.policy == policy)
        {
            return Ok(());
        }
        self.dims[dimension].learner = Some(Box::new(Learner {
            policy,
            window: policy.window,
            ceiling: policy.configured,
            current: policy.configured,
            inference: BucketInference::new(policy.window),
            raised: false,
            blind: false,
            edges: EdgeFinder::default(),
            reply_time: Duration::ZERO,
        }));
        Ok(())
    }

    /// What `dimension` has learned of the provider; `None` without a [`QuotaPolicy`].
    pub(crate) fn learned_quota(&self, dimension: usize) -> Option<LearnedQuota> {
        let dim = self.dims.get(dimension)?;
        let learner = dim.learner.as_ref()?;
        Some(LearnedQuota {
            limit: learner.current,
            window: learner.window,
            model: learner.inference.model(),
            provider_burst: learner.raised,
            guarded: dim.guard.is_some(),
            window_edge: learner.edges.edge.map(|(_, latest)| latest),
        })
    }

    /// Folds the provider's `report` on `dimension`, from the reply to the request stamped
    /// `sent`: learns the limit and how the provider counts, and moves the level (see the
    /// module docs). Without a [`QuotaPolicy`] it only lowers the level to `remaining`
    /// less what every other live reservation holds, and tells a window guard set by hand what the
    /// window has used, `limit - remaining`. Absurd numbers cannot wedge it: a limit of zero is
    /// ignored, one beyond [`MAX_LIMIT`](crate::MAX_LIMIT) is not adopted, and a report
    /// older than what was already folded changes nothing it could make worse.
    pub fn observe_quota(
        &mut self,
        dimension: usize,
        sent: SendStamp,
        report: QuotaReport,
        now: Instant,
    ) -> Result<Option<LearnedQuota>, InvalidLimit> {
        let now = self.clock.advance(now);
        self.dimension_mut(dimension)?;
        let Some(mut learner) = self.dims[dimension].learner.take() else {
            // A guard set by hand hears the provider's count of its window too.
            if let (Some(limit), Some(remaining)) = (report.limit, report.remaining) {
                self.observe_used(dimension, sent, limit.saturating_sub(remaining), now)?;
            }
            if let Some(remaining) = report.remaining {
                self.observe_remaining(dimension, sent, remaining, now)?;
            }
            return Ok(None);
        };
        self.fold_quota(&mut learner, dimension, sent, report, now);
        self.dims[dimension].learner = Some(learner);
        Ok(self.learned_quota(dimension))
    }

    fn fold_quota(
        &mut self,
        learner: &mut Learner,
        dimension: usize,
        sent: SendStamp,
        report: QuotaReport,
        now: Instant,
    ) {
        if let Some(record) = self.books.send(sent.seq, dimension) {
            let took = now.saturating_duration_since(record.at);
            learner.reply_time = learner.reply_time.max(took);
        }
        if !self.follow_window(learner, dimension, sent, report, now) {
            // A limit over another window, looser than the one in force: it says nothing
            // about this window's model, but what remains may still be spent at most.
            if let Some(remaining) = report.remaining
                && !learner.blind
            {
                let _ = self.observe_remaining(dimension, sent, remaining, now);
            }
            return;
        }
        let QuotaReport {
            limit,
            remaining,
            reset,
            window: _,
        } = report;
        let limit = limit.filter(|&l| l > 0);
        if let Some(limit) = limit {
            self.dims[dimension].charge.limit = Some(limit);
            self.adopt_limit(learner, dimension, limit, sent, remaining, now);
        }
        let verdict = match (limit, remaining, reset) {
            (Some(limit), Some(remaining), Some(reset)) => {
                let observation = QuotaObservation {
                    limit,
                    remaining,
                    reset,
                };
                // Replies count in any order (see `BucketInference`).
                learner
                    .inference
                    .observe(sent, observation)
                    .unwrap_or_else(|| learner.inference.model())
            }
            _ => learner.inference.model(),
        };
        let within_current = |limit: u64| learner.current.is_some_and(|c| limit <= c);
        match verdict {
            ProviderModel::Bucket { limit }
                if learner.policy.provider_burst && within_current(limit) =>
            {
                if !learner.raised {
                    if self.dims[dimension].guard.is_some() {
                        let _ = self.set_window_guard(dimension, None, now);
                    }
                    let transit = learner.reply_time.saturating_add(self.send_delay);
                    let burst = provider_burst(limit, learner.window, transit);
                    let _ = self.set_capacity(dimension, burst, now);
                    learner.raised = true;
                }
                if let Some(remaining) = remaining {
                    let _ = self.sync_level(dimension, sent, remaining, now);
                }
                return;
            }
            ProviderModel::Bucket { .. } => {
                // The conservative burst is safe against a continuous bucket.
                self.demote(learner, dimension, now);
                if self.dims[dimension].guard.is_some() {
                    let _ = self.set_window_guard(dimension, None, now);
                }
            }
            ProviderModel::Window => {
                self.demote(learner, dimension, now);
                // The guard caps the provider's own window at the provider's limit,
                // everyone's use of the key included; a configured limit below it is this
                // client's share, which the bucket paces (ADR 0012).
                if self.dims[dimension].guard.is_none()
                    && let Some(cap) = limit.or(learner.current)
                {
                    let used = limit.zip(remaining).map_or(0, |(l, r)| l.saturating_sub(r));
                    self.install_guard(dimension, cap, learner.window, sent, used, now);
                }
            }
            // No reset, or one too coarse for the window ever to tell a bucket: counted
            // blind.
            ProviderModel::Unknown if reset.is_none() || !learner.inference.can_tell() => {
                if let (Some(limit), Some(remaining)) = (limit, remaining) {
                    self.count_blind(learner, dimension, sent, limit, remaining, now);
                    if reset.is_none() {
                        self.find_edges(learner, dimension, sent, limit, remaining, now);
                    }
                }
            }
            _ => {}
        }
        if let Some(remaining) = remaining {
            // Counted blind, the guard follows the provider's count (below); the bucket's
            // level, read down to what the reply may not yet count, would only hold the
            // next window's spend back.
            if !learner.blind {
                let _ = self.observe_remaining(dimension, sent, remaining, now);
            }
            if let (true, Some(limit)) = (self.dims[dimension].guard.is_some(), limit) {
                let used = limit.saturating_sub(remaining);
                let _ = self.observe_used(dimension, sent, used, now);
            }
        }
    }

    /// Lowers the dimension to a reported `limit` below the one in force, or adopts it where
    /// none was configured; never above the configuration. A limit adopted where none was
    /// configured starts from the provider's `remaining`, not from the empty bucket the
    /// client's own reckoning had reached: the burst it offers is taken at once.
    fn adopt_limit(
        &mut self,
        learner: &mut Learner,
        dimension: usize,
        limit: u64,
        sent: SendStamp,
        remaining: Option<u64>,
        now: Instant,
    ) {
        let adopt = match (learner.ceiling, learner.current) {
            (Some(ceiling), current) => limit < current.unwrap_or(ceiling).min(ceiling),
            (None, current) => current != Some(limit),
        };
        if adopt {
            self.put_in_force(learner, dimension, limit, sent, remaining, now);
        }
    }

    /// Makes `limit` per the learner's window the one in force: its rate, and a sixth of it
    /// as burst; where no limit was configured, what the provider says remains is spent at
    /// once. A limit that makes no valid rate changes nothing.
    fn put_in_force(
        &mut self,
        learner: &mut Learner,
        dimension: usize,
        limit: u64,
        sent: SendStamp,
        remaining: Option<u64>,
        now: Instant,
    ) {
        let per_window = Limit::per(limit, learner.window);
        let Ok(rate) = per_window.rate() else {
            return;
        };
        learner.current = Some(limit);
        learner.raised = false;
        let _ = self.set_rate(dimension, rate, now);
        let _ = self.set_capacity(dimension, per_window.capacity(), now);
        if self.dims[dimension].guard.is_some() {
            let _ = self.set_window_limit(dimension, limit, now);
        }
        if let (None, Some(remaining)) = (learner.ceiling, remaining) {
            let _ = self.adopt_remaining(dimension, sent, remaining, now);
        }
    }

    /// A report of a limit per a window ([`QuotaReport::window`]) other than the one in
    /// force. The dimension learns afresh over the provider's window (that limit in force,
    /// under a configured limit also its ceiling, the model inferred anew) when no limit is
    /// in force yet, or when the window is shorter and its rate stricter. A shorter window
    /// with a looser rate leaves the limit in force, but no burst exceeds what the provider
    /// allows in it. A longer window (an hour's or a day's quota beside a minute's) is a
    /// budget, not a pace: only its `remaining` is read, as a bound. Windows longer than a
    /// day are never learned. Returns whether the report is then read as usual, over the
    /// window in force (as one naming no window, or the same one, is).
    fn follow_window(
        &mut self,
        learner: &mut Learner,
        dimension: usize,
        sent: SendStamp,
        report: QuotaReport,
        now: Instant,
    ) -> bool {
        let (Some(limit), Some(window)) = (report.limit.filter(|&l| l > 0), report.window) else {
            return true;
        };
        if window == learner.window {
            return true;
        }
        if window > MAX_LEARNED_WINDOW || Limit::per(limit, window).rate().is_err() {
            // A zero or absurd window: the report is read over the window in force.
            return true;
        }
        let relearn = learner.current.is_none_or(|current| {
            // limit / window < current / learner.window, without division.
            window < learner.window
                && u128::from(limit) * learner.window.as_nanos()
                    < u128::from(current) * window.as_nanos()
        });
        if !relearn {
            if window < learner.window {
                let capacity = self.dims[dimension].bucket.capacity();
                let _ = self.set_capacity(dimension, capacity.min(limit), now);
            }
            return false;
        }
        self.demote(learner, dimension, now);
        if self.dims[dimension].guard.is_some() {
            let _ = self.set_window_guard(dimension, None, now);
        }
        learner.window = window;
        learner.ceiling = learner.policy.configured.map(|_| limit);
        learner.inference = BucketInference::new(window);
        learner.blind = false;
        learner.edges = EdgeFinder::default();
        self.put_in_force(learner, dimension, limit, sent, report.remaining, now);
        true
    }

    /// Caps each trailing `window` of `dimension` at `limit`, seeded with the provider's
    /// `used` count on the reply to `sent`; `false` if no guard of that limit can be made.
    pub(super) fn install_guard(
        &mut self,
        dimension: usize,
        limit: u64,
        window: Duration,
        sent: SendStamp,
        used: u64,
        now: Instant,
    ) -> bool {
        let Ok(guard) = WindowGuard::new(limit, window) else {
            return false;
        };
        let _ = self.set_window_guard(dimension, Some(guard), now);
        let _ = self.seed_window_guard(dimension, sent, used, now);
        true
    }

    /// Back to the conservative burst, if the provider's burst was lent.
    fn demote(&mut self, learner: &mut Learner, dimension: usize, now: Instant) {
        if !learner.raised {
            return;
        }
        let _ = self.stop_sync(dimension);
        if let Some(limit) = learner.current {
            let capacity = Limit::per(limit, learner.window).capacity();
            let _ = self.set_capacity(dimension, capacity, now);
        }
        learner.raised = false;
    }
}

/// The longest a granted request is allowed for to reach the provider (see
/// [`provider_burst`]).
const MAX_TRANSIT: Duration = Duration::from_millis(100);

/// The capacity to lend against a continuous bucket of `limit` per `window`: all of it but
/// what refills while a request granted is on its way, which the provider cannot absorb
/// when its bucket is full (see ADR 0009). That time, `transit`, is at most the longest
/// wait from a grant to its send plus the longest reply (the provider counts a request
/// before it answers), and is allowed at most 100 ms; 100 ms before anything was timed.
fn provider_burst(limit: u64, window: Duration, transit: Duration) -> u64 {
    let transit = if transit.is_zero() {
        MAX_TRANSIT
    } else {
        transit.min(MAX_TRANSIT)
    };
    let margin = (limit as f64 * transit.as_secs_f64() / window.as_secs_f64()).ceil() as u64;
    limit
        .saturating_sub(margin)
        .max(Limit::per(limit, window).capacity())
}
