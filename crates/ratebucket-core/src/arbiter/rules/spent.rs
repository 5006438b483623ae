//! The spent-quota rule: the account's quota spent as a refusal said (a spend cap, a
//! usage limit, a wait of days), which holds every grant, and a dimension's longer quota
//! (a day's) reported spent, which holds what costs it; both until they reset.

use super::{Admission, Ask, Ctx, Rule};
use crate::arbiter::error::ReserveError;
use crate::event::Refusal;
use crate::time::Instant;

/// The account's quota, spent as a refusal said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Pool {
    /// When it resets; `None`: when someone raises it (`Arbiter::resume`).
    until: Option<Instant>,
    /// The dimension the refusal named, if any.
    dimension: Option<usize>,
}

/// Quotas the provider reported spent, until they reset.
#[derive(Clone, Debug, Default)]
pub(crate) struct Spent {
    /// The account's quota, spent as a refusal said.
    pool: Option<Pool>,
    /// Per dimension, when a longer quota reported spent resets.
    until: Vec<Option<Instant>>,
    /// Whether anything above is set (the hot paths skip the rule otherwise).
    any: bool,
}

impl Spent {
    /// Nothing spent, over `dims` dimensions.
    pub(crate) fn new(dims: usize) -> Spent {
        Spent { pool: None, until: vec![None; dims], any: false }
    }

    /// The account's quota is spent for `resets_in` from `now` (`None`: until raised),
    /// naming `dimension` if the refusal did. Returns the refusal its waiters receive.
    pub(crate) fn spend_pool(
        &mut self,
        resets_in: Option<std::time::Duration>,
        dimension: Option<usize>,
        now: Instant,
    ) -> Refusal {
        self.pool = Some(Pool { until: resets_in.map(|wait| now.saturating_add(wait)), dimension });
        self.any = true;
        Refusal::QuotaSpent { dimension, resets_in }
    }

    /// `dimension`'s longer quota is spent until `until` (`None`, or an instant passed: it
    /// is not). Returns the refusal for the queued reservations that cost it, if spent.
    pub(crate) fn spend_dimension(
        &mut self,
        dimension: usize,
        until: Option<Instant>,
        now: Instant,
    ) -> Option<Refusal> {
        let until = until.filter(|&u| u > now);
        self.until[dimension] = until;
        self.any = self.pool.is_some() || self.until.iter().any(Option::is_some);
        Some(Refusal::QuotaSpent {
            dimension: Some(dimension),
            resets_in: Some(until?.saturating_duration_since(now)),
        })
    }

    /// Forgets the account's quota (the cause was fixed: `Arbiter::resume`), and what has
    /// reset by `now`; a dimension's longer quota stays spent until it resets.
    pub(crate) fn resume(&mut self, now: Instant) {
        self.pool = None;
        self.forget(now);
    }

    /// Forgets what has reset by `now`.
    pub(crate) fn forget(&mut self, now: Instant) {
        if !self.any {
            return;
        }
        for until in &mut self.until {
            if until.is_some_and(|u| u <= now) {
                *until = None;
            }
        }
        if self.pool.is_some_and(|p| p.until.is_some_and(|u| u <= now)) {
            self.pool = None;
        }
        self.any = self.pool.is_some() || self.until.iter().any(Option::is_some);
    }

    /// Whether the account's quota holds every grant at `now` (what has reset forgotten).
    #[inline]
    pub(crate) fn holds(&mut self, now: Instant) -> bool {
        if !self.any {
            return false;
        }
        self.forget(now);
        self.pool.is_some()
    }

    /// Whether the account's quota is reported spent.
    pub(crate) fn pool_spent(&self) -> bool {
        self.pool.is_some()
    }

    /// When the account's quota resets: `None` without one spent, `Some(None)` when it is
    /// spent until raised.
    pub(crate) fn pool_until(&self) -> Option<Option<Instant>> {
        Some(self.pool?.until)
    }

    /// What holds `cost` back: the pool's quota, or the first dimension it costs whose
    /// longer quota is spent; with the dimension named and when it resets.
    fn holding(&self, cost: &[u64]) -> Option<(Option<usize>, Option<Instant>)> {
        if let Some(pool) = self.pool {
            return Some((pool.dimension, pool.until));
        }
        cost.iter()
            .zip(&self.until)
            .enumerate()
            .find_map(|(d, (&c, until))| Some((Some(d), Some((*until).filter(|_| c > 0)?))))
    }
}

impl Rule for Spent {
    fn idle(&self) -> bool {
        !self.any
    }

    /// Refused at once while a quota it needs is spent, unless its caller may wait until
    /// the quota resets (then it queues).
    fn admit(&mut self, ask: &Ask<'_>, _ctx: &Ctx<'_>, now: Instant) -> Admission {
        if !self.any {
            return Admission::Admit;
        }
        self.forget(now);
        let Some((dimension, until)) = self.holding(ask.cost) else {
            return Admission::Admit;
        };
        let resets_in = until.map(|u| u.saturating_duration_since(now));
        match (resets_in, ask.max_wait) {
            (Some(resets_in), Some(most)) if resets_in <= most => Admission::Queue,
            _ => Admission::Refuse(ReserveError::QuotaSpent { dimension, resets_in }),
        }
    }

    /// Not before a spent longer quota it costs resets (the pool's quota holds every
    /// grant, and is asked apart).
    fn ready(&self, ask: &Ask<'_>, _ctx: &Ctx<'_>, now: Instant) -> Option<Instant> {
        let mut at = now;
        for (&c, until) in ask.cost.iter().zip(&self.until) {
            if let Some(until) = until.filter(|_| c > 0) {
                at = at.max(until);
            }
        }
        Some(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arbiter::dims::Dims;
    use crate::arbiter::fair::Caller;
    use crate::arbiter::tickets::Tickets;
    use crate::books::Books;
    use crate::bucket::TokenBucket;
    use std::time::Duration;

    fn at(secs: u64) -> Instant {
        Instant::ZERO + Duration::from_secs(secs)
    }

    fn ask(cost: &[u64], max_wait: Option<Duration>) -> Ask<'_> {
        Ask { cost, estimate: cost, caller: Caller::default(), max_wait }
    }

    #[test]
    fn a_spent_day_refuses_what_costs_it_until_it_resets_and_no_more() {
        let dims = Dims::new(vec![
            TokenBucket::per_second(10, Instant::ZERO).unwrap(),
            TokenBucket::per_second(10, Instant::ZERO).unwrap(),
        ]);
        let (books, tickets) = (Books::new(2), Tickets::new(2));
        let ctx = Ctx { dims: &dims, books: &books, tickets: &tickets };
        let mut spent = Spent::new(2);
        assert!(spent.idle());
        let refusal = spent.spend_dimension(1, Some(at(100)), at(0));
        assert_eq!(
            refusal,
            Some(Refusal::QuotaSpent {
                dimension: Some(1),
                resets_in: Some(Duration::from_secs(100))
            })
        );
        // What does not cost the spent dimension goes; what does is refused, unless it may
        // wait until the reset, when it queues and is ready then.
        assert_eq!(spent.admit(&ask(&[1, 0], None), &ctx, at(1)), Admission::Admit);
        assert!(matches!(
            spent.admit(&ask(&[1, 5], None), &ctx, at(1)),
            Admission::Refuse(ReserveError::QuotaSpent { dimension: Some(1), .. })
        ));
        let patient = ask(&[1, 5], Some(Duration::from_secs(99)));
        assert_eq!(spent.admit(&patient, &ctx, at(1)), Admission::Queue);
        assert_eq!(spent.ready(&patient, &ctx, at(1)), Some(at(100)));
        assert!(!spent.holds(at(1)), "a dimension's day holds only what costs it");
        // Reset: forgotten.
        assert_eq!(spent.admit(&ask(&[1, 5], None), &ctx, at(100)), Admission::Admit);
        assert!(spent.idle());
    }

    #[test]
    fn a_spent_account_holds_everyone_until_raised() {
        let mut spent = Spent::new(1);
        spent.spend_pool(None, None, at(0));
        assert!(spent.holds(at(1_000_000)));
        assert_eq!(spent.pool_until(), Some(None));
        spent.spend_dimension(0, Some(at(2_000_000)), at(0));
        spent.resume(at(1_000_000));
        assert!(!spent.holds(at(1_000_000)));
        assert!(!spent.idle(), "a dimension's day is not raised by resuming");
    }
}
