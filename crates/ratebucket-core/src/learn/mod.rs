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
//! 2. **The window** (`follow.rs`). A limit reported over a window of the provider's own
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

use crate::bucket::{Limit, Rate};
use crate::ids::SendStamp;
use crate::time::Instant;
use crate::window::WindowGuard;

mod edges;
mod follow;
mod infer;
#[cfg(test)]
mod tests;

use edges::EdgeFinder;
pub use infer::{BucketInference, ProviderModel, QuotaObservation};

/// How a dimension learns from the provider's reports
/// ([`Change::Policy`](crate::Change::Policy)).
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
    /// Whether the provider documents that it counts in continuous buckets (Anthropic
    /// does): its first report that agrees with a bucket is taken at its word, without
    /// waiting for a run of reports to span the evidence an unknown provider must show;
    /// the first that contradicts one still makes it a window. Off by default.
    pub documented_bucket: bool,
}

impl QuotaPolicy {
    /// A configured `limit` per `window`, lowered by a smaller reported one.
    pub fn known(limit: u64, window: Duration) -> QuotaPolicy {
        QuotaPolicy {
            window,
            configured: Some(limit),
            provider_burst: true,
            documented_bucket: false,
        }
    }

    /// No limit known: the provider's reported limit per `window` is adopted.
    pub fn unknown(window: Duration) -> QuotaPolicy {
        QuotaPolicy { window, configured: None, provider_burst: true, documented_bucket: false }
    }

    /// Keeps the conservative burst even against a provider that refills continuously.
    pub fn conservative(mut self) -> QuotaPolicy {
        self.provider_burst = false;
        self
    }

    /// Takes the provider at its documented word that it counts in continuous buckets
    /// ([`QuotaPolicy::documented_bucket`]).
    pub fn documented_bucket(mut self) -> QuotaPolicy {
        self.documented_bucket = true;
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
    /// The wall-clock time the reply was read, as time since the UNIX epoch, when the
    /// adapter gives it (the core reads no clock). A provider that counts in fixed windows
    /// and sends no reset is first taken to align them to the clock, as gateways counting
    /// per clock minute do; its reports confirm or refute that (see `edges.rs`).
    pub clock: Option<Duration>,
    /// The step `remaining` is rounded to the nearest multiple of (Anthropic rounds its
    /// token counts to thousands); 0 or 1 when it is exact. A rounded `remaining` lowers
    /// the level only to the least it can stand for, widens the band a bucket's reset must
    /// fall in, and teaches no booked charge.
    pub precision: u64,
    /// Whether `reset` came as an instant (an RFC 3339 time, Unix seconds or milliseconds)
    /// and was turned into a wait against the clock as the reply was read. The provider
    /// wrote it earlier, at some moment between the request's send and that reading, so
    /// it may read short by up to that span; the learning allows for it when it tells a
    /// bucket from a window.
    pub reset_as_instant: bool,
    /// The resolution `reset` was written at, when its form says: a second for an RFC 3339
    /// instant or an HTTP-date without a fraction (Anthropic's resets), a millisecond for
    /// epoch milliseconds. Zero where the form does not say: the learning tells it from
    /// the values (a wait in whole seconds is a multiple of one). An instant turned into a
    /// wait reads at any fraction of its resolution, so only the form can tell it.
    pub reset_resolution: Duration,
}

/// What a dimension has learned of the provider
/// ([`Arbiter::dimension`](crate::Arbiter::dimension)).
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

/// One change the learning policy asks of a dimension, applied by the arbiter in the order
/// given. Each names what it reads from the report; the request it answers is the report's.
#[derive(Clone, Debug)]
pub(crate) enum Adjust {
    /// The provider's limit, so that its first report tells what it booked (a provider
    /// starts full).
    ProviderLimit(u64),
    /// The refill rate in force (adaptive rates return to it).
    Rate(Rate),
    /// The bucket's capacity.
    Capacity(u64),
    /// A window guard installed, seeded with the provider's count of its window, `used`.
    Guard {
        /// The cap.
        guard: WindowGuard,
        /// The provider's count when it took the request.
        used: u64,
    },
    /// The window guard removed.
    Unguard,
    /// The window guard's limit changed (the charges it holds stay).
    WindowLimit(u64),
    /// The provider keeps the books: the level follows its `remaining`, read as a floor
    /// at the least it can stand for and as a ceiling at the most (`remaining + slack`: a
    /// count rounded to the nearest thousand stands for up to 999 more than its least).
    Sync {
        /// The least the reported remaining stands for.
        remaining: u64,
        /// How much more it may stand for (0 when exact).
        slack: u64,
    },
    /// The books back with the client.
    StopSync,
    /// The level raised to what `remaining` leaves for new grants.
    Adopt(u64),
    /// The level set to the capacity less everything granted so far: for a provider
    /// documented to start full, what its bucket has left of the share the capacity is,
    /// when the limit was not known before (the client's own bucket was a placeholder).
    FullLessTaken,
    /// The level raised by this much: the capacity lent beyond the share the client's own
    /// reckoning kept, for a provider documented to start full whose counts are rounded (its
    /// reports bound its level only within a step; the client's books, which started with
    /// it full, tell it exactly).
    Shift(u64),
    /// The level lowered to what `remaining` leaves for new grants.
    Lower(u64),
    /// The provider's count of its window, to the guard.
    Used(u64),
    /// A quota over a longer window than the bucket's (a day's) is spent until then
    /// (`None`: it is not).
    Spent(Option<Instant>),
    /// From this instant on (`None`: no longer), requests go one at a time, each let past
    /// the window guard: a probe of a supposed window edge, before the window's whole
    /// limit is spent on it.
    Probe(Option<Instant>),
    /// A blind provider's fixed-window edges, newly estimated (`None`: given up), and
    /// whether the limit is the provider's own (then the bucket is whole at each edge).
    Edges {
        /// The earliest and latest instant of one edge.
        edges: Option<(Instant, Instant)>,
        /// Whether the limit in force is the provider's own, not a share below it.
        own_limit: bool,
    },
}

/// What the policy may read of a dimension's state when it folds a report.
#[derive(Clone, Copy, Debug)]
pub(crate) struct View {
    /// When the report was taken in.
    pub(crate) now: Instant,
    /// The bucket's capacity.
    pub(crate) capacity: u64,
    /// Whether a window guard stands.
    pub(crate) guarded: bool,
    /// When the request answered left, and what its own reservation cost here, if the send
    /// is still on record.
    pub(crate) send: Option<(Instant, u64)>,
    /// The longest a granted request waited to be sent so far.
    pub(crate) send_delay: Duration,
    /// Whether the reply was a throttle (the provider refused the request for its limits).
    pub(crate) throttled: bool,
}

/// The adjustments of one report as they are planned: the view, kept current as far as
/// the policy's own decisions change it (a guard installed or removed, a capacity set).
struct Plan<'a> {
    view: View,
    out: &'a mut Vec<Adjust>,
}

impl Plan<'_> {
    fn push(&mut self, adjust: Adjust) {
        match adjust {
            Adjust::Guard { .. } => self.view.guarded = true,
            Adjust::Unguard => self.view.guarded = false,
            Adjust::Capacity(capacity) => self.view.capacity = capacity,
            _ => {}
        }
        self.out.push(adjust);
    }

    /// Caps each trailing `window` at `limit`, seeded with the provider's count `used`;
    /// `false` if no guard of that limit can be made.
    fn guard(&mut self, limit: u64, window: Duration, used: u64) -> bool {
        match WindowGuard::new(limit, window) {
            Ok(guard) => {
                self.push(Adjust::Guard { guard, used });
                true
            }
            Err(_) => false,
        }
    }

    /// Removes the guard, if one stands.
    fn unguard(&mut self) {
        if self.view.guarded {
            self.push(Adjust::Unguard);
        }
    }
}

/// The longest window a provider's report may make a dimension count in (see `follow.rs`):
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
                        self.find_edges(&mut plan, limit, remaining, clock);
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
