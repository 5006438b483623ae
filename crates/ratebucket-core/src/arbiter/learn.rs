//! The arbiter's side of learning: a dimension's policy set, its reports folded by the
//! policy (`crate::learn`), and the adjustments it returns applied at once.

use super::*;
use crate::bucket::Limit;
use crate::learn::{Adjust, Learner, View, unlearned};

impl Arbiter {
    /// Makes `dimension` learn from the provider's reports under `policy`. Giving it the
    /// policy it already has changes nothing (what it learned stays); another policy starts
    /// learning afresh. The bucket is left as it is: build it from the same limit
    /// ([`Limit::per`] of the configured limit, or a cautious start when none is known);
    /// reports move it from then on.
    pub(crate) fn learn_quota(
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
        if self.dims[dimension].learner.as_ref().is_some_and(|learner| learner.policy() == policy) {
            return Ok(());
        }
        self.dims[dimension].learner = Some(Box::new(Learner::new(policy)));
        Ok(())
    }

    /// What `dimension` has learned of the provider; `None` without a [`QuotaPolicy`].
    pub(crate) fn learned_quota(&self, dimension: usize) -> Option<LearnedQuota> {
        let dim = self.dims.get(dimension)?;
        Some(dim.learner.as_ref()?.learned(dim.guard.is_some()))
    }

    /// Folds the provider's `report` on `dimension`, from the reply to the request stamped
    /// `sent`: the dimension's learning policy reads it (the limit, how
    /// the provider counts, the level) and the adjustments it returns are applied in
    /// order, then whatever now fits is granted once. Without a [`QuotaPolicy`] it only
    /// lowers the level to `remaining` less what every other live reservation holds, and
    /// tells a window guard set by hand what the window has used, `limit - remaining`.
    /// Absurd numbers cannot wedge it: a limit of zero is ignored, one beyond
    /// [`MAX_LIMIT`](crate::MAX_LIMIT) is not adopted, and a report older than what was
    /// already folded changes nothing it could make worse.
    ///
    /// An adjustment the dimension refuses (none the policy makes should be) is skipped,
    /// the rest applied, and the first refusal returned.
    pub fn observe_quota(
        &mut self,
        dimension: usize,
        sent: SendStamp,
        report: QuotaReport,
        now: Instant,
    ) -> Result<Option<LearnedQuota>, InvalidLimit> {
        let now = self.clock.advance(now);
        self.dimension_mut(dimension)?.last_report = Some(inspect::Reported {
            limit: report.limit,
            remaining: report.remaining,
            resets_at: report.reset.map(|reset| now.saturating_add(reset)),
            at: now,
        });
        let mut plan = std::mem::take(&mut self.adjustments);
        plan.clear();
        let dim = &mut self.dims[dimension];
        match dim.learner.as_mut() {
            Some(learner) => {
                let view = View {
                    now,
                    capacity: dim.bucket.capacity(),
                    guarded: dim.guard.is_some(),
                    send: self
                        .books
                        .send(sent.seq, dimension)
                        .map(|record| (record.at, record.own)),
                    send_delay: self.send_delay,
                    throttled: self.throttled_reply,
                };
                learner.fold(view, sent, report, &mut plan);
            }
            None => unlearned(report, &mut plan),
        }
        // A provider with nothing left says when its count is whole again: what the guard
        // holds of that count is held no longer. (With something left, its reset is only
        // when the last of its count ages out, which the guard's own window already
        // follows.)
        let clears = report.reset.filter(|_| report.remaining == Some(0)).map(|reset| now + reset);
        self.dims[dimension].charge.imprecise = report.precision > 1;
        let applied = self.apply(dimension, sent, &plan, clears, now);
        self.dims[dimension].charge.imprecise = false;
        self.adjustments = plan;
        applied.map(|()| self.learned_quota(dimension))
    }

    /// Applies the learning policy's `adjustments` to `dimension`, in order, for the report
    /// on the reply to `sent`; no grant is made until the last is in, then one grant pass.
    fn apply(
        &mut self,
        dimension: usize,
        sent: SendStamp,
        adjustments: &[Adjust],
        clears: Option<Instant>,
        now: Instant,
    ) -> Result<(), InvalidLimit> {
        let outer = std::mem::replace(&mut self.replying, true);
        let mut refused = None;
        for adjust in adjustments {
            let applied = match *adjust {
                Adjust::ProviderLimit(limit) => {
                    self.dims[dimension].charge.limit = Some(limit);
                    Ok(())
                }
                Adjust::Rate(rate) => self.set_rate(dimension, rate, now),
                Adjust::Capacity(capacity) => self.set_capacity(dimension, capacity, now),
                Adjust::Guard { ref guard, used } => self
                    .set_window_guard(dimension, Some(guard.clone()), now)
                    .and_then(|()| self.seed_window_guard(dimension, sent, used, clears, now)),
                Adjust::Unguard => self.set_window_guard(dimension, None, now),
                Adjust::WindowLimit(limit) => self.set_window_limit(dimension, limit, now),
                Adjust::Sync { remaining, slack } => {
                    self.sync_level_within(dimension, sent, remaining, slack, now).map(drop)
                }
                Adjust::StopSync => self.stop_sync(dimension),
                Adjust::Adopt(remaining) => {
                    self.adopt_remaining(dimension, sent, remaining, now).map(drop)
                }
                Adjust::FullLessTaken => {
                    let taken = self.books.granted_total(dimension);
                    let bucket = &mut self.dims[dimension].bucket;
                    let left = bucket.capacity().saturating_sub(taken);
                    bucket.set_level(i64::try_from(left).unwrap_or(i64::MAX), now);
                    Ok(())
                }
                Adjust::Shift(more) => {
                    self.dims[dimension].bucket.give_back(more, now);
                    Ok(())
                }
                Adjust::Lower(remaining) => {
                    self.observe_remaining(dimension, sent, remaining, now).map(drop)
                }
                Adjust::Used(used) => self.observe_used(dimension, sent, used, clears, now),
                Adjust::Spent(until) => {
                    self.set_spent(dimension, until, now);
                    Ok(())
                }
                Adjust::Probe(from) => {
                    self.probe_from = from;
                    Ok(())
                }
                Adjust::Edges { edges, own_limit } => {
                    self.set_edges(dimension, edges, own_limit, now);
                    Ok(())
                }
            };
            if let Err(e) = applied {
                refused.get_or_insert(e);
            }
        }
        self.replying = outer;
        self.drive(now);
        refused.map_or(Ok(()), Err)
    }
}
