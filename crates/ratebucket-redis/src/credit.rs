//! A process's credit books: what leases funded, per dimension, oldest first, and when
//! each part's time to be spent ends; and a grant booked ahead, not yet spendable.

use std::collections::VecDeque;

use tokio::time::Instant;

/// Per dimension, the credit funded from leases and not yet spent, oldest first: when
/// each part's time to be spent ends, and how much of it is left. Spending takes from the
/// oldest part.
#[derive(Debug)]
pub(crate) struct Credit {
    parts: Vec<VecDeque<(Instant, u64)>>,
}

impl Credit {
    pub(crate) fn new(dimensions: usize) -> Credit {
        Credit { parts: vec![VecDeque::new(); dimensions] }
    }

    /// `amount` of `dimension` funded, to be spent before `ends`.
    pub(crate) fn add(&mut self, dimension: usize, ends: Instant, amount: u64) {
        if amount > 0 {
            self.parts[dimension].push_back((ends, amount));
        }
    }

    /// Forgets every part (what they stood for was withdrawn, or lapsed).
    pub(crate) fn clear(&mut self) {
        self.parts.iter_mut().for_each(VecDeque::clear);
    }

    /// The books of `dimension` once the limiter holds `held` whole permits: what went
    /// since is taken from the oldest parts; then the parts whose time is over at `now`
    /// are dropped, and how much they had left returned (for the caller to withdraw).
    pub(crate) fn settle(&mut self, dimension: usize, held: u64, now: Instant) -> u64 {
        let parts = &mut self.parts[dimension];
        let mut spent = parts.iter().map(|&(_, left)| left).sum::<u64>().saturating_sub(held);
        while spent > 0 {
            let Some(oldest) = parts.front_mut() else { break };
            let taken = oldest.1.min(spent);
            oldest.1 -= taken;
            spent -= taken;
            if oldest.1 == 0 {
                parts.pop_front();
            }
        }
        let mut over = 0;
        while let Some(&(ends, left)) = parts.front() {
            if ends > now {
                break;
            }
            over += left;
            parts.pop_front();
        }
        over
    }
}

/// A grant booked ahead (see the lease script).
pub(crate) struct Booking {
    /// When it may be spent: its start, timed from when the answer came (never early).
    pub(crate) at: Instant,
    /// When its time to be spent ends: a lease period after its start, timed from when
    /// the lease was asked (never late).
    pub(crate) ends: Instant,
    pub(crate) granted: Vec<u64>,
    /// The listener's count of lost contacts when it was made.
    pub(crate) contact: u64,
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn spending_takes_the_oldest_credit_and_what_is_over_is_returned() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut credit = Credit::new(1);
        credit.add(0, t0 + s(1), 10);
        credit.add(0, t0 + s(2), 5);
        // 12 spent of 15: the oldest part's 10 and 2 of the next.
        assert_eq!(credit.settle(0, 3, t0), 0);
        // At 2 s the part left (3) is over.
        assert_eq!(credit.settle(0, 3, t0 + s(2)), 3);
        assert_eq!(credit.settle(0, 0, t0 + s(3)), 0, "nothing left");
    }

    #[test]
    fn unspent_credit_is_over_a_period_after_its_start_not_when_renewed() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut credit = Credit::new(2);
        credit.add(0, t0 + s(1), 4);
        credit.add(0, t0 + s(3), 6);
        credit.add(1, t0 + s(1), 100);
        // Nothing spent: at 1 s the first parts are over, whatever came later.
        assert_eq!(credit.settle(0, 10, t0 + s(1)), 4);
        assert_eq!(credit.settle(1, 100, t0 + s(1)), 100);
        credit.clear();
        assert_eq!(credit.settle(0, 6, t0 + s(10)), 0, "cleared");
    }
}
