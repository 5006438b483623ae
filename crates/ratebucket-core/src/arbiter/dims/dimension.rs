//! One dimension of the arbiter ([`Dimension`]): its bucket and everything kept per limit
//! (guard, learning, what the provider's reports told, the charge it books), and the
//! learning policy's adjustments applied to it.

use std::collections::VecDeque;
use std::time::Duration;

use super::MAX_CHARGE_FACTOR;
use super::adapt::Recovery;
use super::guard::Guard;
use super::provider::{FoldOutcome, Ledger, Level, Provider, lowered};
use super::usage::Usage;
use crate::arbiter::inspect::Reported;
use crate::bucket::{InvalidLimit, Limit, Rate, TokenBucket};
use crate::event::Event;
use crate::ids::SendStamp;
use crate::learn::{Adjust, LearnedQuota, Learner, QuotaPolicy, QuotaReport, View, unlearned};
use crate::time::Instant;
use crate::window::WindowGuard;

/// Costs below this are not raised by a learned charge factor (see [`Dimension::booked`]).
pub(crate) const MIN_BOOKED_COST: u64 = 16;

/// Everything the arbiter keeps for one limit.
#[derive(Clone, Debug)]
pub(crate) struct Dimension {
    /// The bucket grants are taken from.
    pub(crate) bucket: TokenBucket,
    /// The rate the user configured: the ceiling adaptive rates return to.
    pub(crate) configured: Rate,
    /// An optional cap on what a trailing window may hold.
    pub(crate) guard: Option<Guard>,
    /// After a throttle: the climb back to the configured rate.
    pub(crate) recovery: Option<Recovery>,
    /// What the provider's reports told of it, and the charge it books.
    pub(crate) provider: Provider,
    /// What replies used against what their callers reserved.
    pub(crate) usage: Usage,
    /// What it learns from the provider's reports, once given a policy.
    pub(crate) learner: Option<Box<Learner>>,
    /// Whole permits lent to an express lane, until returned.
    pub(crate) lent: u64,
    /// For a budget: when it was set or last renewed (what was granted before refunds
    /// nothing into it).
    renewed: Option<Instant>,
    /// For a funded bucket: what reservations did not use, kept apart until reclaimed
    /// ([`Change::Reclaim`](crate::Change::Reclaim)).
    pub(crate) returned: u64,
}

/// What applying an adjustment asks of the rest of the arbiter.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Effect {
    /// Nothing more.
    None,
    /// Queued reservations costing more than this can never be granted: refuse them.
    Refuse(u64),
    /// The rate rose from this (per second): a ramp rises from there.
    Raised(f64),
    /// A longer quota is spent until then (`None`: no longer).
    Spent(Option<Instant>),
    /// A supposed window edge is probed from then (`None`: no longer).
    Probe(Option<Instant>),
    /// A report moved the level so (or not).
    Folded(FoldOutcome),
}

impl Dimension {
    /// A dimension over `bucket`, its rate taken as the configured one.
    pub(crate) fn new(bucket: TokenBucket) -> Dimension {
        Dimension {
            configured: bucket.rate(),
            bucket,
            guard: None,
            recovery: None,
            provider: Provider::default(),
            usage: Usage::default(),
            learner: None,
            lent: 0,
            renewed: None,
            returned: 0,
        }
    }

    /// Puts `bucket` in place (a budget's funded one, set at `renewed`), its rate the
    /// configured one.
    pub(crate) fn install(&mut self, bucket: TokenBucket, renewed: Option<Instant>) {
        self.configured = bucket.rate();
        self.bucket = bucket;
        self.renewed = renewed;
    }

    /// A budget renewed at `renewed`: `amount` more, to at most its capacity.
    pub(crate) fn renew(&mut self, amount: u64, renewed: Instant, now: Instant) {
        self.bucket.fund(amount, now);
        self.renewed = Some(renewed);
    }

    /// Whether it is a share funded from elsewhere (a funded bucket that is no budget):
    /// what its reservations do not use is kept apart, not spent again here.
    #[inline]
    pub(crate) fn keeps_refunds_apart(&self) -> bool {
        self.bucket.is_funded() && self.renewed.is_none()
    }

    /// What a reservation did not use, back: into the bucket, or for a funded share kept
    /// apart to be reclaimed (the quota it came from dated it when it was funded).
    #[inline]
    pub(crate) fn give_back(&mut self, unused: u64, now: Instant) {
        if self.keeps_refunds_apart() {
            self.returned = self.returned.saturating_add(unused);
        } else {
            self.bucket.give_back(unused, now);
        }
    }

    /// Whether a reservation granted at `granted_at` may refund what it did not use: not
    /// into a budget renewed since (it was paid for from the period before).
    #[inline]
    pub(crate) fn refundable(&self, granted_at: Instant) -> bool {
        self.renewed.is_none_or(|renewed| granted_at >= renewed)
    }

    /// The most one reservation may cost: the bucket's capacity, or the window guard's
    /// limit if lower.
    #[inline]
    pub(crate) fn effective_capacity(&self) -> u64 {
        let capacity = self.bucket.capacity();
        self.guard.as_ref().map_or(capacity, |guard| capacity.min(guard.window.limit()))
    }

    /// The most one reply may charge for a reservation of `reserved`:
    /// [`MAX_CHARGE_FACTOR`] times it, or the capacity if that is more.
    #[inline]
    pub(crate) fn charge_ceiling(&self, reserved: u64) -> u64 {
        reserved.saturating_mul(MAX_CHARGE_FACTOR).max(self.bucket.capacity())
    }

    /// What a reservation of `cost` takes from the bucket: the cost times what the
    /// provider was seen to book per unit reserved ([`applied_factor`]), within the
    /// capacity, never less than the cost; or, for a provider that books what replies use
    /// (and `reserve_usage`), the cost lowered to the high ratio of usage, at least one.
    #[inline]
    pub(crate) fn booked(&self, cost: u64, reserve_usage: bool) -> u64 {
        // Small counts (whole requests) are what the provider counts, exactly: the reports'
        // noise is larger than one unit in them.
        if cost < MIN_BOOKED_COST {
            return cost;
        }
        let factor = applied_factor(self.provider.charge.factor);
        if factor == 1.0 {
            if !reserve_usage {
                return cost;
            }
            return match lowered(&self.usage, &self.provider.charge) {
                // Rounded up, past the float noise of the ratios kept.
                Some(ratio) => ((cost as f64 * ratio * (1.0 - 1e-6)).ceil() as u64).clamp(1, cost),
                None => cost,
            };
        }
        // A count of whole requests is not inflated by a fraction: rounded, not rounded up.
        let booked = (cost as f64 * factor).round() as u64;
        booked.min(self.effective_capacity()).max(cost)
    }

    /// Whether `cost` fits the bucket (and, if `guarded`, the window guard) at `now`. A
    /// bucket whose provider's fixed window began since it was last whole is refilled to
    /// full first, as the provider is.
    #[inline]
    pub(crate) fn fits(&mut self, cost: u64, now: Instant, guarded: bool) -> bool {
        if guarded
            && let Some(guard) = self.guard.as_mut()
            && guard.refill_due(now)
        {
            let capacity = i64::try_from(self.bucket.capacity()).unwrap_or(i64::MAX);
            self.bucket.raise_to(capacity, now);
        }
        self.bucket.fits(cost, now)
            && (!guarded || self.guard.as_mut().is_none_or(|guard| guard.window.fits(cost, now)))
    }

    /// Takes `cost` from the bucket and the guard.
    #[inline]
    pub(crate) fn take(&mut self, cost: u64, now: Instant) {
        self.bucket.take(cost, now);
        if let Some(guard) = &mut self.guard {
            guard.window.take(cost);
        }
    }

    /// How long from `now` until `cost` fits, assuming nothing else happens (`None`: not
    /// by time alone). A budget (`renewal`) is topped up when it renews; a bucket that
    /// refills at the provider's window edges is full again at the next; a probe lets the
    /// head past the guard from `probe_from`.
    pub(crate) fn ready_in(
        &self,
        cost: u64,
        now: Instant,
        probe_from: Option<Instant>,
        renewal: Option<Instant>,
    ) -> Duration {
        let mut wait = self.bucket.time_until_at(cost, now).unwrap_or(Duration::MAX);
        if let Some(renewal) = renewal {
            wait = wait.min(renewal.saturating_duration_since(now));
        }
        let Some(guard) = &self.guard else {
            return wait;
        };
        if let Some(edge) = guard.refill_at(now) {
            wait = wait.min(edge.saturating_duration_since(now));
        }
        // `None`: only a reservation ending makes room, and that drives the queue.
        let mut guarded = guard.window.time_until_at(cost, now).unwrap_or(Duration::MAX);
        if let Some(from) = probe_from {
            guarded = guarded.min(from.saturating_duration_since(now));
        }
        wait.max(guarded)
    }

    /// Whether nothing about it needs the arbiter's order: no provider's books, guard,
    /// learning, climb back after a throttle or funded bucket.
    pub(crate) fn is_plain(&self) -> bool {
        !self.provider.ledger
            && self.guard.is_none()
            && self.learner.is_none()
            && self.recovery.is_none()
            && !self.bucket.is_funded()
    }

    /// Records the provider's `report`, from the reply to the request stamped `sent`, and
    /// plans what it changes: the learning policy's adjustments, or without one a lowered
    /// level and the used count a guard set by hand is told. `seen` is the send (when it
    /// left, what it cost here), the longest wait from a grant to its send, and whether the
    /// reply was a throttle. Returns when the provider's count is whole again, if it said
    /// it had nothing left (what a guard holds of it is held no longer).
    pub(crate) fn fold(
        &mut self,
        report: QuotaReport,
        sent: SendStamp,
        (send, send_delay, throttled): (Option<(Instant, u64)>, Duration, bool),
        now: Instant,
        plan: &mut Vec<Adjust>,
    ) -> Option<Instant> {
        plan.clear();
        self.provider.last = Some(Reported {
            limit: report.limit,
            remaining: report.remaining,
            resets_at: report.reset.map(|reset| now.saturating_add(reset)),
            at: now,
        });
        let view = View {
            now,
            capacity: self.bucket.capacity(),
            guarded: self.guard.is_some(),
            send,
            send_delay,
            throttled,
        };
        match self.learner.as_mut() {
            Some(learner) => learner.fold(view, sent, report, plan),
            None => unlearned(report, plan),
        }
        // A rounded count says nothing of what one request was booked (until folded).
        self.provider.charge.imprecise = report.precision > 1;
        report.reset.filter(|_| report.remaining == Some(0)).map(|reset| now + reset)
    }

    /// Learns from the provider's reports under `policy` (the policy it already has
    /// changes nothing; another starts afresh).
    pub(crate) fn set_policy(&mut self, policy: QuotaPolicy) -> Result<(), InvalidLimit> {
        if policy.window.is_zero() {
            return Err(InvalidLimit::ZeroRate);
        }
        if let Some(limit) = policy.configured {
            Limit::per(limit, policy.window).rate()?;
        }
        if self.learner.as_ref().is_some_and(|l| l.policy() == policy) {
            return Ok(());
        }
        self.learner = Some(Box::new(Learner::new(policy)));
        Ok(())
    }

    /// What it has learned of the provider; `None` without a policy.
    pub(crate) fn learned(&self) -> Option<LearnedQuota> {
        Some(self.learner.as_ref()?.learned(self.guard.is_some()))
    }

    /// Changes the configured rate from `now` on (adaptive rates return to it, never
    /// above); the climb back after a throttle is over.
    pub(crate) fn set_rate(&mut self, rate: Rate, now: Instant) -> Effect {
        let from = self.bucket.rate().per_second_f64();
        self.bucket.set_rate(rate, now);
        self.configured = rate;
        self.recovery = None;
        if rate.per_second_f64() > from { Effect::Raised(from) } else { Effect::None }
    }

    /// Caps it at `guard`'s limit per trailing window (or removes the cap), the new guard
    /// holding `in_flight`, every reservation granted and not yet ended.
    pub(crate) fn set_guard(&mut self, guard: Option<WindowGuard>, in_flight: u64) -> Effect {
        self.guard = guard.map(|guard| Guard::new(guard, in_flight));
        Effect::Refuse(self.effective_capacity())
    }

    /// Applies one of the learning policy's adjustments, for the report on the reply to
    /// `sent` (`clears`: when the provider's count is whole again, if it said it had
    /// nothing left). What it asks of the rest of the arbiter is returned.
    pub(crate) fn adjust(
        &mut self,
        adjust: &Adjust,
        (dimension, sent): (usize, SendStamp),
        ledger: Ledger<'_>,
        (clears, now): (Option<Instant>, Instant),
        events: &mut VecDeque<Event>,
    ) -> Result<Effect, InvalidLimit> {
        let Dimension { bucket, usage, provider, .. } = self;
        let level = Level { bucket, usage, dimension, events };
        Ok(match *adjust {
            Adjust::ProviderLimit(limit) => {
                self.provider.charge.limit = Some(limit);
                Effect::None
            }
            Adjust::Rate(rate) => self.set_rate(rate, now),
            Adjust::Capacity(capacity) => {
                self.bucket.set_capacity(capacity, now)?;
                Effect::Refuse(self.effective_capacity())
            }
            Adjust::Guard { ref guard, used } => {
                let in_flight = ledger.tickets.granted_cost(dimension, |_| true);
                let effect = self.set_guard(Some(guard.clone()), in_flight);
                let record = ledger.books.send(sent.seq, dimension);
                let at = (ledger.books.settled_total(dimension), ledger.books.next_seq());
                if let Some(guard) = &mut self.guard {
                    guard.seed(record, at, used, clears, now);
                }
                effect
            }
            Adjust::Unguard => self.set_guard(None, 0),
            Adjust::WindowLimit(limit) => {
                if limit == 0 {
                    return Err(InvalidLimit::ZeroCapacity);
                }
                if limit > crate::MAX_LIMIT {
                    return Err(InvalidLimit::TooLarge);
                }
                match &mut self.guard {
                    Some(guard) => {
                        guard.window.set_limit(limit);
                        Effect::Refuse(self.effective_capacity())
                    }
                    None => Effect::None,
                }
            }
            Adjust::Sync { remaining, slack } => {
                Effect::Folded(provider.sync(level, ledger, sent, (remaining, slack), now))
            }
            Adjust::StopSync => {
                self.provider.ledger = false;
                Effect::None
            }
            Adjust::Adopt(remaining) => {
                Effect::Folded(provider.adopt(level, ledger, sent, remaining, now))
            }
            Adjust::FullLessTaken => {
                let taken = ledger.books.granted_total(dimension);
                let left = self.bucket.capacity().saturating_sub(taken);
                self.bucket.set_level(i64::try_from(left).unwrap_or(i64::MAX), now);
                Effect::None
            }
            Adjust::Shift(more) => {
                self.bucket.give_back(more, now);
                Effect::None
            }
            Adjust::Lower(remaining) => {
                Effect::Folded(provider.lower(level, ledger, sent, remaining, now))
            }
            Adjust::Used(used) => {
                if let Some(guard) = &mut self.guard {
                    let record = ledger.books.send(sent.seq, dimension);
                    guard.observe_used(sent, record, used, clears, now);
                }
                Effect::None
            }
            Adjust::Spent(until) => Effect::Spent(until),
            Adjust::Probe(from) => Effect::Probe(from),
            Adjust::Edges { edges, own_limit } => {
                if let Some(guard) = &mut self.guard {
                    guard.set_edges(edges, own_limit, now);
                }
                Effect::None
            }
        })
    }
}

/// The factor reservations are raised by, given the learned one: none within 2% (noise
/// from replies out of order), else 2% above it (a charge read short costs 429s, one read
/// long a little pace), at most [`MAX_CHARGE_FACTOR`].
pub(crate) fn applied_factor(learned: Option<f64>) -> f64 {
    match learned {
        Some(factor) if factor > 1.02 => (factor * 1.02).min(MAX_CHARGE_FACTOR as f64),
        _ => 1.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dimension(capacity: u64) -> Dimension {
        let bucket = TokenBucket::new(Rate::per_second(10).unwrap(), capacity, Instant::ZERO);
        Dimension::new(bucket.unwrap())
    }

    #[test]
    fn a_guard_below_the_capacity_bounds_what_one_reservation_may_cost() {
        let mut dim = dimension(100);
        assert_eq!(dim.effective_capacity(), 100);
        assert!(dim.is_plain());
        let effect = dim.set_guard(Some(WindowGuard::new(40, Duration::from_secs(1)).unwrap()), 0);
        assert_eq!(effect, Effect::Refuse(40));
        assert_eq!(dim.effective_capacity(), 40);
        assert!(!dim.is_plain());
    }

    #[test]
    fn the_guard_is_asked_only_when_guarded() {
        let mut dim = dimension(100);
        dim.set_guard(Some(WindowGuard::new(40, Duration::from_secs(1)).unwrap()), 30);
        assert!(!dim.fits(20, Instant::ZERO, true), "30 held, 20 more exceeds 40");
        assert!(dim.fits(20, Instant::ZERO, false));
    }

    #[test]
    fn a_reply_may_charge_four_times_the_reservation_or_the_capacity() {
        let dim = dimension(100);
        assert_eq!(dim.charge_ceiling(10), 100);
        assert_eq!(dim.charge_ceiling(50), 200);
        assert_eq!(dim.charge_ceiling(u64::MAX), u64::MAX);
    }

    #[test]
    fn a_learned_charge_raises_what_a_reservation_takes_but_not_small_counts() {
        let mut dim = dimension(10_000);
        dim.provider.charge.factor = Some(1.5);
        assert_eq!(dim.booked(100, false), 153);
        assert_eq!(dim.booked(MIN_BOOKED_COST - 1, false), MIN_BOOKED_COST - 1);
        dim.provider.charge.factor = Some(1.01);
        assert_eq!(dim.booked(100, false), 100, "within noise");
    }

    #[test]
    fn a_raised_rate_says_where_it_rose_from() {
        let mut dim = dimension(100);
        assert_eq!(
            dim.set_rate(Rate::per_second(20).unwrap(), Instant::ZERO),
            Effect::Raised(10.0)
        );
        assert_eq!(dim.set_rate(Rate::per_second(5).unwrap(), Instant::ZERO), Effect::None);
    }
}
