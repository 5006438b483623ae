//! Learning a provider's quota, as a policy: reports in, adjustments out.
//!
//! A dimension given a [`QuotaPolicy`] ([`Change::Policy`](crate::Change::Policy))
//! keeps a [`Learner`]. Each report of the provider's (a reply's `limit`, `remaining`,
//! `reset` and `window`, whatever headers carried them) goes to [`Learner::fold`] with a
//! [`View`] of the dimension (its capacity, whether a window guard stands, when the request
//! answered left). The learner reads them and returns [`Adjust`]ments, in order; it changes
//! nothing but itself. The arbiter applies them all, then grants once.
//!
//! What the policy decides:
//!
//! 1. **The limit.** A reported limit is adopted where none was configured (with the burst
//!    the provider's `remaining` offers at once), and lowers a configured one; it never
//!    raises it.
//! 2. **The window** (`Learner::follow_window`). A limit reported over a window of the provider's own
//!    with a stricter rate is learned afresh over that window; a longer one is a budget,
//!    of which only `remaining` is read.
//! 3. **How the provider counts** (`infer.rs`, [`BucketInference`]). A bucket that refills
//!    continuously lends its whole capacity and the level follows its reports; a window
//!    (fixed or sliding) keeps the conservative burst and caps each trailing window at the
//!    limit ([`WindowGuard`]).
//! 4. **A provider with no reset** (`edges.rs`): counted blind (its `remaining` at once, no
//!    more than its limit in any trailing window), and its fixed windows' edges found from
//!    a `remaining` that jumps back up. Until they are, the windows are taken to be aligned
//!    to the wall clock (when the reports say what it reads): the hypothesis stands while
//!    the reports agree with it, and falls at the first throttle or contradicting edge.
//! 5. **The level.** `remaining` lowers the level (never raises it, unless the books are the
//!    provider's); under a guard, the provider's count of its window corrects the guard.
//!
//! Without a policy a report only lowers the level and corrects a guard set by hand
//! ([`unlearned`]).

use std::time::Duration;

use crate::bucket::Limit;
use crate::ids::SendStamp;

mod edges;
mod infer;
mod plan;
mod report;
#[cfg(test)]
mod tests;

use edges::EdgeFinder;
pub use infer::{BucketInference, ProviderModel, QuotaObservation};
use plan::Plan;
pub(crate) use plan::{Adjust, View};
pub use report::{LearnedQuota, QuotaPolicy, QuotaReport};

/// The longest window a provider's report may make a dimension count in (see
/// `Learner::follow_window`):
/// a day.
const MAX_LEARNED_WINDOW: Duration = Duration::from_secs(86_400);

/// A dimension's learning state.
#[derive(Clone, Debug)]
pub(crate) struct Learner {
    /// The policy as given (a new one is compared with it).
    policy: QuotaPolicy,
    /// The window the provider counts in: the policy's, until the provider reports its own.
    window: Duration,
    /// The most `current` may be, per `window`: the configured limit (then the provider's,
    /// once its own window replaced the policy's); `None` where none was configured.
    ceiling: Option<u64>,
    /// The limit per window in force.
    current: Option<u64>,
    inference: BucketInference,
    /// Whether the provider's whole capacity is lent (its burst, following its books).
    lends_burst: bool,
    /// Whether the provider is counted blind: limit and remaining but no reset, so a guard
    /// holds each trailing window to the limit and the whole limit is the burst.
    blind: bool,
    /// Where a blind provider's fixed windows begin, found from its reports.
    edges: EdgeFinder,
    /// Whether the client's own reckoning has followed the provider's bucket from its
    /// start (see [`Adjust::Shift`]); no longer once a burst was lent and taken back, or
    /// when the first report showed the provider's bucket not full.
    reckons_from_start: bool,
    /// Whether the first report of a limit and a remaining was read for that.
    start_checked: bool,
    /// The longest a reply took so far, from its request's send to its report: with the
    /// longest wait to be sent, what a granted request may take to reach the provider at
    /// most (see [`provider_burst`]).
    reply_time: Duration,
}

impl Learner {
    /// A learner under `policy`, with nothing learned yet.
    pub(crate) fn new(policy: QuotaPolicy) -> Learner {
        Learner {
            policy,
            window: policy.window,
            ceiling: policy.configured,
            current: policy.configured,
            inference: BucketInference::new(policy.window),
            lends_burst: false,
            blind: false,
            edges: EdgeFinder::default(),
            reply_time: Duration::ZERO,
            reckons_from_start: true,
            start_checked: false,
        }
    }

    /// The policy it was given.
    pub(crate) fn policy(&self) -> QuotaPolicy {
        self.policy
    }

    /// The window the provider counts in.
    pub(crate) fn window(&self) -> Duration {
        self.window
    }

    /// What it has learned; `guarded`: whether the dimension has a window guard.
    pub(crate) fn learned(&self, guarded: bool) -> LearnedQuota {
        LearnedQuota {
            limit: self.current,
            window: self.window,
            model: self.inference.model(),
            provider_burst: self.lends_burst,
            guarded,
            window_edge: self.edges.proven().map(|(_, latest)| latest),
        }
    }

    /// Reads the provider's `report`, on the reply to the request stamped `sent`, against
    /// `view`, and appends to `out` the adjustments it calls for (see the module docs).
    /// Absurd numbers cannot wedge it: a limit of zero is ignored, one that makes no valid
    /// rate is not adopted.
    pub(crate) fn fold(
        &mut self,
        view: View,
        sent: SendStamp,
        report: QuotaReport,
        out: &mut Vec<Adjust>,
    ) {
        let mut plan = Plan { view, out };
        if let Some(window) = report.window.filter(|&w| w > self.window && w <= MAX_LEARNED_WINDOW)
        {
            // A quota over a longer window (a day's) is a budget: spent until it resets
            // (no later than a window away, whatever the reset says), or not.
            match (report.remaining, report.reset) {
                (Some(0), Some(reset)) => {
                    plan.push(Adjust::Spent(Some(view.now + reset.min(window))));
                }
                (Some(remaining), _) if remaining > 0 => plan.push(Adjust::Spent(None)),
                _ => {}
            }
            if window >= MAX_LEARNED_WINDOW {
                // A day's quota is never learned as the dimension's limit: what remains of
                // it may be spent at most.
                if let (Some(remaining), false) = (report.remaining, self.blind) {
                    plan.push(Adjust::Lower(remaining));
                }
                return;
            }
        }
        if let Some((at, _)) = view.send {
            let took = view.now.saturating_duration_since(at);
            self.reply_time = self.reply_time.max(took);
        }
        if !self.follow_window(&mut plan, report) {
            // A limit over another window, looser than the one in force: it says nothing
            // about this window's model, but what remains may still be spent at most.
            if let (Some(remaining), false) = (report.remaining, self.blind) {
                plan.push(Adjust::Lower(remaining));
            }
            return;
        }
        let QuotaReport {
            limit,
            remaining,
            reset,
            window: _,
            clock,
            precision,
            reset_as_instant,
            reset_resolution,
        } = report;
        // The least a rounded `remaining` can stand for: nothing is believed that the
        // provider may not have.
        let exact = remaining;
        let remaining = remaining.map(|r| r.saturating_sub(precision / 2));
        self.inference.widen(precision);
        let limit = limit.filter(|&l| l > 0);
        if let (Some(limit), Some(exact), false) = (limit, exact, self.start_checked) {
            // The client's books follow the provider's bucket from a full start only if
            // the first report shows one: nothing missing but what this request took, within
            // a step of rounding. A bucket someone else has drawn on is read from its
            // reports alone.
            self.start_checked = true;
            let own = view.send.map_or(0, |(_, own)| own);
            if exact.saturating_add(precision) < limit.saturating_sub(own) {
                self.reckons_from_start = false;
            }
        }
        if let Some(limit) = limit {
            plan.push(Adjust::ProviderLimit(limit));
            self.adopt_limit(&mut plan, limit, remaining);
        }
        let verdict = match (limit, remaining, reset) {
            (Some(limit), Some(remaining), Some(reset)) => {
                // Replies count in any order (see `BucketInference`).
                // The provider computed it after the request left and before the reply
                // was read.
                let taken = plan.view.send.map(|(at, _)| (at, plan.view.now));
                let observation = QuotaObservation {
                    limit,
                    remaining: exact.unwrap_or(remaining),
                    reset,
                    read_short_by: taken
                        .filter(|_| reset_as_instant)
                        .map_or(Duration::ZERO, |(sent, read)| {
                            read.saturating_duration_since(sent)
                        }),
                    resolution: reset_resolution,
                };
                self.inference
                    .observe(sent, observation, taken)
                    .unwrap_or_else(|| self.inference.model())
            }
            _ => self.inference.model(),
        };
        // A provider documented to count in continuous buckets is taken at its word from
        // its first report agreeing with one; a report contradicting it still makes it a
        // window (above).
        let verdict = match verdict {
            ProviderModel::Unknown if self.policy.documented_bucket => {
                self.inference.agreeing_bucket().unwrap_or(verdict)
            }
            verdict => verdict,
        };
        let within_current = |limit: u64| self.current.is_some_and(|c| limit <= c);
        match verdict {
            ProviderModel::Bucket { limit }
                if self.policy.provider_burst && within_current(limit) =>
            {
                if !self.lends_burst {
                    plan.unguard();
                    let transit = self.reply_time.saturating_add(view.send_delay);
                    let lent = provider_burst(limit, self.window, transit);
                    plan.push(Adjust::Capacity(lent));
                    // A provider documented to start full, whose counts are rounded: the
                    // client's own reckoning of its share stands where the provider's
                    // bucket does, less what the share leaves out.
                    let reckoned = self.policy.documented_bucket && self.reckons_from_start;
                    if reckoned && precision > 1 {
                        plan.push(Adjust::Shift(lent.saturating_sub(view.capacity)));
                    }
                    self.reckons_from_start = false;
                    self.lends_burst = true;
                }
                if let Some(remaining) = remaining {
                    // Rounded to the nearest `precision`, it stands for less than half a
                    // step more than the value reported, and no less than half a step less.
                    let slack = precision.saturating_sub(1);
                    plan.push(Adjust::Sync { remaining, slack });
                }
                return;
            }
            ProviderModel::Bucket { .. } => {
                // The conservative burst is safe against a continuous bucket.
                self.demote(&mut plan);
                plan.unguard();
            }
            ProviderModel::Window => {
                self.demote(&mut plan);
                // The guard caps the provider's own window at the provider's limit,
                // everyone's use of the key included; a configured limit below it is this
                // client's share, which the bucket paces (ADR 0012).
                if !plan.view.guarded
                    && let Some(cap) = limit.or(self.current)
                {
                    let used = limit.zip(remaining).map_or(0, |(l, r)| l.saturating_sub(r));
                    plan.guard(cap, self.window, used);
                }
            }
            // No reset, or one too coarse for the window ever to tell a bucket: counted
            // blind.
            ProviderModel::Unknown if reset.is_none() || !self.inference.can_tell() => {
                if let (Some(limit), Some(remaining)) = (limit, remaining) {
                    self.count_blind(&mut plan, limit, remaining);
                    if reset.is_none() {
                        let own_limit = self.current.is_none_or(|current| current >= limit);
                        let at = (self.window, own_limit);
                        self.edges.find(&mut plan, at, (limit, remaining), clock);
                    }
                }
            }
            _ => {}
        }
        if let Some(remaining) = remaining {
            // Counted blind, the guard follows the provider's count (below); the bucket's
            // level, read down to what the reply may not yet count, would only hold the
            // next window's spend back.
            if !self.blind {
                plan.push(Adjust::Lower(remaining));
            }
            if let (true, Some(limit)) = (plan.view.guarded, limit) {
                plan.push(Adjust::Used(limit.saturating_sub(remaining)));
            }
        }
    }

    /// Back to the conservative burst, if the provider's burst was lent.
    fn demote(&mut self, plan: &mut Plan<'_>) {
        if !self.lends_burst {
            return;
        }
        plan.push(Adjust::StopSync);
        if let Some(limit) = self.current {
            plan.push(Adjust::Capacity(Limit::per(limit, self.window).capacity()));
        }
        self.lends_burst = false;
        self.reckons_from_start = false;
    }

    /// Lowers the dimension to a reported `limit` below the one in force, or adopts it where
    /// none was configured; never above the configuration. A limit adopted where none was
    /// configured starts from the provider's `remaining`, not from the empty bucket the
    /// client's own reckoning had reached: the burst it offers is taken at once.
    fn adopt_limit(&mut self, plan: &mut Plan<'_>, limit: u64, remaining: Option<u64>) {
        let adopt = match (self.ceiling, self.current) {
            (Some(ceiling), current) => limit < current.unwrap_or(ceiling).min(ceiling),
            (None, current) => current != Some(limit),
        };
        if adopt {
            self.put_in_force(plan, limit, remaining);
        }
    }

    /// Makes `limit` per the learner's window the one in force: its rate, and a sixth of it
    /// as burst; where no limit was configured, what the provider says remains is spent at
    /// once. A limit that makes no valid rate changes nothing.
    fn put_in_force(&mut self, plan: &mut Plan<'_>, limit: u64, remaining: Option<u64>) {
        let per_window = Limit::per(limit, self.window);
        let Ok(rate) = per_window.rate() else {
            return;
        };
        self.current = Some(limit);
        self.lends_burst = false;
        plan.push(Adjust::Rate(rate));
        plan.push(Adjust::Capacity(per_window.capacity()));
        if plan.view.guarded {
            plan.push(Adjust::WindowLimit(limit));
        }
        match (self.ceiling, remaining) {
            // Documented to start full: what it has left of the share is the share less
            // what was taken, which the client's books know (rounded counts would not).
            (None, _) if self.policy.documented_bucket && self.reckons_from_start => {
                plan.push(Adjust::FullLessTaken);
            }
            (None, Some(remaining)) => plan.push(Adjust::Adopt(remaining)),
            _ => {}
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
    fn follow_window(&mut self, plan: &mut Plan<'_>, report: QuotaReport) -> bool {
        let (Some(limit), Some(window)) = (report.limit.filter(|&l| l > 0), report.window) else {
            return true;
        };
        if window == self.window {
            return true;
        }
        if window > MAX_LEARNED_WINDOW || Limit::per(limit, window).rate().is_err() {
            // A zero or absurd window: the report is read over the window in force.
            return true;
        }
        let relearn = self.current.is_none_or(|current| {
            // limit / window < current / self.window, without division.
            window < self.window
                && u128::from(limit) * self.window.as_nanos()
                    < u128::from(current) * window.as_nanos()
        });
        if !relearn {
            if window < self.window {
                let capacity = plan.view.capacity;
                plan.push(Adjust::Capacity(capacity.min(limit)));
            }
            return false;
        }
        self.demote(plan);
        plan.unguard();
        self.window = window;
        self.ceiling = self.policy.configured.map(|_| limit);
        self.inference = BucketInference::new(window);
        self.blind = false;
        self.edges = EdgeFinder::default();
        self.put_in_force(plan, limit, report.remaining);
        true
    }

    /// A provider that reports its limit and what remains, but not when it resets: how it
    /// counts cannot be inferred, yet whatever it is — a bucket, a fixed window, a sliding
    /// log — its `remaining` may be spent at once, and no more than its limit in any
    /// trailing window after that. So the dimension's whole limit becomes its burst, the
    /// level rises to what the provider said remains (less what is in flight), and a guard
    /// caps each trailing window at the provider's limit, seeded with what it has counted.
    /// A fixed window's limit is then spent as soon as the previous spend ages out, a window
    /// later, instead of paced over the window at a sixth of it.
    fn count_blind(&mut self, plan: &mut Plan<'_>, limit: u64, remaining: u64) {
        let used = limit.saturating_sub(remaining);
        if plan.view.guarded || !plan.guard(limit, self.window, used) {
            return;
        }
        // The client's own limit, which may be a share below the provider's.
        let burst = self.current.unwrap_or(limit).min(limit);
        plan.push(Adjust::Capacity(burst));
        plan.push(Adjust::Adopt(remaining));
        self.blind = true;
    }
}

/// What a report does to a dimension that learns nothing (no [`QuotaPolicy`]): `remaining`
/// lowers the level, and a window guard set by hand hears the provider's count of its
/// window, `limit - remaining`.
pub(crate) fn unlearned(report: QuotaReport, out: &mut Vec<Adjust>) {
    if let (Some(limit), Some(remaining)) = (report.limit, report.remaining) {
        out.push(Adjust::Used(limit.saturating_sub(remaining)));
    }
    if let Some(remaining) = report.remaining {
        out.push(Adjust::Lower(remaining));
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
    let transit = if transit.is_zero() { MAX_TRANSIT } else { transit.min(MAX_TRANSIT) };
    let margin = (limit as f64 * transit.as_secs_f64() / window.as_secs_f64()).ceil() as u64;
    limit.saturating_sub(margin).max(Limit::per(limit, window).capacity())
}
