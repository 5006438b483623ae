//! A guard keeping one dimension within `limit` per trailing window: safe against providers
//! that count in fixed windows or sliding logs, whatever the bucket's burst.
//!
//! A token bucket of capacity `C` and rate `limit / window` grants up to `C + limit` in a
//! window, which a fixed-window or sliding-log provider refuses. The guard counts every
//! grant from the moment it is made until a window after its reservation ends (a request
//! is charged after it is granted and before its reply is read, so the provider forgets it
//! no later than that), and grants only what keeps the count within `limit`. Any fixed
//! window lies inside a trailing one, so the guard holds against both models.
//!
//! Ended charges are kept in slots of `window / SLOTS`, each forgotten at its slot's end:
//! memory stays bounded whatever the request rate, at the price of holding a charge up to
//! one slot longer than needed.

use std::collections::VecDeque;
use std::time::Duration;

use crate::bucket::InvalidLimit;
use crate::time::Instant;

/// Slots per window.
const SLOTS: u32 = 256;

/// At most `limit` per trailing `window` (see the module docs).
#[derive(Clone, Debug)]
pub struct WindowGuard {
    limit: u64,
    window: Duration,
    /// Granted and not yet ended: counted in full until they end.
    pending: u128,
    /// Ended charges, oldest first: (forgotten at, amount).
    ended: VecDeque<(Instant, u128)>,
    /// The sum of `ended`.
    ended_sum: u128,
    /// Everything ever held, wrapping: the difference between two readings is what was
    /// held in between.
    held_total: u64,
    /// When the provider counts in fixed windows whose edges are known: the earliest and
    /// the latest instant one edge may fall at (the others are whole windows away). A
    /// charge that ended before an edge's earliest instant is forgotten at its latest.
    edges: Option<(Instant, Instant)>,
}

impl WindowGuard {
    /// A guard of `limit` per `window`.
    pub fn new(limit: u64, window: Duration) -> Result<WindowGuard, InvalidLimit> {
        if limit == 0 {
            return Err(InvalidLimit::ZeroCapacity);
        }
        if window.is_zero() {
            return Err(InvalidLimit::ZeroRate);
        }
        if limit > crate::bucket::MAX_LIMIT {
            return Err(InvalidLimit::TooLarge);
        }
        Ok(WindowGuard {
            limit,
            window,
            pending: 0,
            ended: VecDeque::new(),
            ended_sum: 0,
            held_total: 0,
            edges: None,
        })
    }

    /// The limit per window.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The window.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// What the guard counts against the limit at `now`.
    pub(crate) fn used(&mut self, now: Instant) -> u128 {
        self.forget(now);
        self.pending + self.ended_sum
    }

    pub(crate) fn fits(&mut self, cost: u64, now: Instant) -> bool {
        self.used(now) + u128::from(cost) <= u128::from(self.limit)
    }

    /// How long until `cost` fits, if ended charges alone can make room (`None`: only a
    /// reservation ending can).
    pub(crate) fn time_until(&mut self, cost: u64, now: Instant) -> Option<Duration> {
        let excess = (self.used(now) + u128::from(cost)).saturating_sub(u128::from(self.limit));
        if excess == 0 {
            return Some(Duration::ZERO);
        }
        let mut freed = 0u128;
        for &(at, amount) in &self.ended {
            freed += amount;
            if freed >= excess {
                return Some(at.saturating_duration_since(now));
            }
        }
        None
    }

    /// [`WindowGuard::time_until`] as a query: what has aged out by `now` is skipped, not
    /// forgotten.
    pub(crate) fn time_until_at(&self, cost: u64, now: Instant) -> Option<Duration> {
        let live = self.ended.iter().filter(|&&(at, _)| at > now);
        let used = self.pending + live.clone().map(|&(_, amount)| amount).sum::<u128>();
        let excess = (used + u128::from(cost)).saturating_sub(u128::from(self.limit));
        if excess == 0 {
            return Some(Duration::ZERO);
        }
        let mut freed = 0u128;
        for &(at, amount) in live {
            freed += amount;
            if freed >= excess {
                return Some(at.saturating_duration_since(now));
            }
        }
        None
    }

    pub(crate) fn take(&mut self, cost: u64) {
        self.pending += u128::from(cost);
    }

    /// A reservation of `reserved` ended at `now`, reconciled to `charged`. It is held at
    /// its reserved cost all the same (or at `charged`, if more): a provider may count the
    /// reservation rather than the usage, as OpenAI counts `max_tokens`, and nothing the
    /// client sees before its next grant can tell it otherwise in time.
    /// A reservation of `reserved` ends that the provider is known not to have counted (it
    /// refused a probe): nothing is held for it.
    pub(crate) fn withdraw(&mut self, reserved: u64) {
        self.pending = self.pending.saturating_sub(u128::from(reserved));
    }

    pub(crate) fn settle(&mut self, reserved: u64, charged: u64, now: Instant) {
        self.pending = self.pending.saturating_sub(u128::from(reserved));
        self.remember(u128::from(charged.max(reserved)), now);
    }

    /// The provider reports `used` in this dimension at `now`. Anything beyond what the
    /// guard holds, even taking everything in flight as already counted, was spent by
    /// someone else on the same key; it is held for a window from now.
    ///
    /// `clears`: when the provider said its count is whole again (its reset), if it said;
    /// what it counted is held no longer than that.
    pub(crate) fn observe_used(&mut self, used: u64, clears: Option<Instant>, now: Instant) {
        let missed = u128::from(used).saturating_sub(self.used(now));
        self.remember_until(missed, clears, now);
    }

    /// Everything the guard has ever held, wrapping (see [`WindowGuard::trim`]).
    pub(crate) fn held_total(&self) -> u64 {
        self.held_total
    }

    /// The provider counted `used` when it took the request that left while the guard had
    /// held `held_then` in all. Its count covers everything that ended before that request
    /// left; the guard holds more than that count plus what it took in since only if it
    /// over-counts (the provider counts usage where the guard held reservations, or a
    /// fixed window restarted), and lets the excess go, soonest-forgotten first so what
    /// it keeps is what the provider keeps longest.
    pub(crate) fn trim(&mut self, used: u64, held_then: u64, now: Instant) {
        self.forget(now);
        let since = u128::from(self.held_total.wrapping_sub(held_then));
        let keep = u128::from(used).saturating_add(since);
        self.let_go(self.ended_sum.saturating_sub(keep));
    }

    /// Removes `excess` from the ended charges, soonest-forgotten first.
    fn let_go(&mut self, mut excess: u128) {
        while excess > 0 {
            let Some((_, amount)) = self.ended.front_mut() else {
                break;
            };
            let cut = (*amount).min(excess);
            *amount -= cut;
            self.ended_sum -= cut;
            excess -= cut;
            if *amount == 0 {
                self.ended.pop_front();
            }
        }
    }

    /// Lets go of `amount` of the ended charges, soonest-forgotten first: held on a
    /// reckoning that a later report showed too high.
    pub(crate) fn forgive(&mut self, amount: u64, now: Instant) {
        self.forget(now);
        self.let_go(u128::from(amount));
    }

    pub(crate) fn set_limit(&mut self, limit: u64) {
        self.limit = limit;
    }

    /// Holds `amount` as charged at `now`, for a window, or until `clears` if sooner (the
    /// provider's reset: its count of `amount` is whole again then).
    pub(crate) fn hold(&mut self, amount: u64, clears: Option<Instant>, now: Instant) {
        self.remember_until(u128::from(amount), clears, now);
    }

    /// Tells the guard where the provider's fixed windows begin: one edge falls between
    /// `earliest` and `latest`, the others whole windows away (`None`: unknown, or the
    /// provider turned out to count otherwise). Every charge that ended before an edge's
    /// earliest instant is forgotten at that edge's latest, instead of a window after it
    /// ended: the provider forgets it then. What the guard holds already is re-dated.
    pub(crate) fn set_edges(&mut self, edges: Option<(Instant, Instant)>) {
        self.edges = edges.filter(|&(earliest, latest)| earliest <= latest);
        let ended = std::mem::take(&mut self.ended);
        for (due, amount) in ended {
            // Held since no later than a window before its due instant.
            let at = self.due(due.saturating_sub(self.window));
            match self.ended.back_mut() {
                Some((last, sum)) if *last >= at => *sum += amount,
                _ => self.ended.push_back((at, amount)),
            }
        }
    }

    /// The latest instant of the newest fixed-window edge at or before `now`, if the edges
    /// are known.
    pub(crate) fn edge_before(&self, now: Instant) -> Option<Instant> {
        let (_, latest) = self.edges?;
        u64::try_from(self.occurrence(latest, now)).ok().map(Instant::from_nanos)
    }

    /// The latest instant of the next fixed-window edge after `now`, if the edges are known.
    pub(crate) fn edge_after(&self, now: Instant) -> Option<Instant> {
        let before = self.edge_before(now)?;
        Some(before + self.window)
    }

    /// The newest instant a whole number of windows from `anchor` that is not after `at`,
    /// in nanoseconds (before the origin when `at` is within a window of it).
    fn occurrence(&self, anchor: Instant, at: Instant) -> i128 {
        let window = i128::from(duration_nanos(self.window));
        let since = i128::from(at.as_nanos()) - i128::from(anchor.as_nanos());
        i128::from(anchor.as_nanos()) + since.div_euclid(window) * window
    }

    /// When a charge that ended at `end` is forgotten: a window later, or at the latest
    /// instant of the first fixed-window edge whose earliest comes after it, if sooner;
    /// rounded up to a slot.
    fn due(&self, end: Instant) -> Instant {
        let window = duration_nanos(self.window);
        let mut due = end.as_nanos().saturating_add(window);
        if let Some((earliest, latest)) = self.edges {
            let next = self.occurrence(earliest, end) + i128::from(window);
            let spread = i128::from(latest.as_nanos() - earliest.as_nanos());
            let edge = u64::try_from(next + spread).unwrap_or(u64::MAX);
            due = due.min(edge);
        }
        let slot = duration_nanos((self.window / SLOTS).max(Duration::from_nanos(1)));
        Instant::from_nanos(due.div_ceil(slot).saturating_mul(slot))
    }

    /// Holds `amount`, charged by `now`, until it is forgotten ([`WindowGuard::due`]).
    fn remember(&mut self, amount: u128, now: Instant) {
        self.remember_until(amount, None, now);
    }

    /// [`WindowGuard::remember`], forgotten at `clears` if that comes first (never before
    /// `now`): kept in order of when each charge is forgotten.
    fn remember_until(&mut self, amount: u128, clears: Option<Instant>, now: Instant) {
        if amount == 0 {
            return;
        }
        let due = self.due(now);
        self.ended_sum += amount;
        self.held_total = self.held_total.wrapping_add(u64::try_from(amount).unwrap_or(u64::MAX));
        match clears.filter(|&c| c < due) {
            Some(clears) => {
                let at = clears.max(now);
                let position =
                    self.ended.iter().position(|&(due, _)| due > at).unwrap_or(self.ended.len());
                self.ended.insert(position, (at, amount));
            }
            None => match self.ended.back_mut() {
                // Same slot (or an earlier one, after a clock step): merge, keeping the
                // later expiry so nothing is forgotten early.
                Some((last, sum)) if *last >= due => *sum += amount,
                _ => self.ended.push_back((due, amount)),
            },
        }
    }

    fn forget(&mut self, now: Instant) {
        while let Some(&(at, amount)) = self.ended.front() {
            if at > now {
                break;
            }
            self.ended.pop_front();
            self.ended_sum -= amount;
        }
    }
}

fn duration_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Instant {
        Instant::from_millis(n)
    }

    #[test]
    fn charges_count_from_the_grant_until_a_window_after_they_end() {
        // 1,024 ms: slots of 4 ms.
        let mut guard = WindowGuard::new(100, Duration::from_millis(1_024)).unwrap();
        guard.take(60);
        assert!(guard.fits(40, ms(0)));
        assert!(!guard.fits(41, ms(0)));
        assert_eq!(guard.time_until(41, ms(0)), None, "only the reservation ending helps");
        // Reconciled to 50, held at the 60 reserved.
        guard.settle(60, 50, ms(200));
        assert_eq!(guard.used(ms(200)), 60);
        assert_eq!(guard.time_until(41, ms(500)), Some(Duration::from_millis(724)));
        assert!(!guard.fits(41, ms(1_223)));
        assert!(guard.fits(100, ms(1_224)));
        // A debt is held whole.
        guard.take(10);
        guard.settle(10, 30, ms(1_300));
        assert_eq!(guard.used(ms(1_300)), 30);
    }

    #[test]
    fn ended_charges_merge_into_slots_and_are_never_forgotten_early() {
        let mut guard = WindowGuard::new(1_000, Duration::from_millis(256)).unwrap();
        for i in 1..=10 {
            guard.take(1);
            guard.settle(1, 1, Instant::from_nanos(i * 90_000));
        }
        // Ten charges within 1 ms share the slot ending at 257 ms.
        assert_eq!(guard.ended.len(), 1);
        assert_eq!(guard.used(ms(256)), 10);
        assert_eq!(guard.used(ms(257)), 0);
    }

    #[test]
    fn use_beyond_every_reservation_is_held_for_a_window() {
        let mut guard = WindowGuard::new(1_000, Duration::from_millis(1_024)).unwrap();
        guard.take(200);
        guard.settle(200, 100, ms(0));
        guard.take(50);
        // Another client spent 300 on the same key: beyond even the 50 in flight.
        guard.observe_used(550, None, ms(10));
        assert_eq!(guard.used(ms(10)), 550);
        guard.observe_used(400, None, ms(20));
        assert_eq!(guard.used(ms(20)), 550, "a lower report takes nothing back");
        assert_eq!(guard.used(ms(1_024)), 350);
        assert_eq!(guard.used(ms(1_036)), 50);
    }

    #[test]
    fn bad_limits_are_refused() {
        assert!(WindowGuard::new(0, Duration::from_secs(1)).is_err());
        assert!(WindowGuard::new(1, Duration::ZERO).is_err());
        assert!(WindowGuard::new(u64::MAX, Duration::from_secs(1)).is_err());
    }

    #[test]
    fn with_known_edges_a_charge_is_forgotten_at_the_first_edge_after_it() {
        let mut guard = WindowGuard::new(10, Duration::from_secs(1)).unwrap();
        // Before the edges are known: a window after it ended.
        guard.take(4);
        guard.settle(4, 4, ms(200));
        guard.set_edges(Some((ms(370), ms(400))));
        // Re-dated: it ended before the edge's earliest instant, so the provider has
        // forgotten it by the edge's latest.
        assert!(!guard.fits(7, ms(399)));
        assert!(guard.fits(10, ms(405)));
        // A charge ending inside an edge's uncertainty may count in the window after it:
        // held until the trailing window ends, before the next edge's latest instant.
        guard.take(10);
        guard.settle(10, 10, ms(380));
        assert!(!guard.fits(1, ms(1_379)));
        assert!(guard.fits(10, ms(1_385)));
        // One ending after the edge: forgotten at the next one.
        guard.take(10);
        guard.settle(10, 10, ms(1_500));
        assert!(!guard.fits(1, ms(2_399)));
        assert!(guard.fits(10, ms(2_405)));
        assert_eq!(guard.edge_before(ms(2_405)), Some(ms(2_400)));
        assert_eq!(guard.edge_after(ms(2_405)), Some(ms(3_400)));
        // Edges given up: back to a window after the end.
        guard.set_edges(None);
        guard.take(10);
        guard.settle(10, 10, ms(2_500));
        assert!(!guard.fits(1, ms(3_450)));
        assert!(guard.fits(10, ms(3_505)));
    }
}
