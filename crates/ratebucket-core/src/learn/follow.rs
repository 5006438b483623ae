//! The limit in force and the window it is counted over: adopted, lowered, or learned anew.

use super::{Adjust, BucketInference, EdgeFinder, Learner, MAX_LEARNED_WINDOW, Plan, QuotaReport};
use crate::bucket::Limit;

impl Learner {
    /// Lowers the dimension to a reported `limit` below the one in force, or adopts it where
    /// none was configured; never above the configuration. A limit adopted where none was
    /// configured starts from the provider's `remaining`, not from the empty bucket the
    /// client's own reckoning had reached: the burst it offers is taken at once.
    pub(super) fn adopt_limit(&mut self, plan: &mut Plan<'_>, limit: u64, remaining: Option<u64>) {
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
    pub(super) fn follow_window(&mut self, plan: &mut Plan<'_>, report: QuotaReport) -> bool {
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
}
