//! A dimension's trailing-window guard ([`Guard`]): the [`WindowGuard`] itself, what its
//! seed held for the requests that left before it existed, and the refill of a bucket at
//! each edge of a provider's fixed window.

use crate::books::SendRecord;
use crate::ids::SendStamp;
use crate::time::Instant;
use crate::window::WindowGuard;

/// A window guard's seed (see [`Guard::seed`]): the sends before `next_seq` left before
/// the guard existed, so their reports can only be checked against it.
#[derive(Clone, Copy, Debug)]
struct Seed {
    /// The books' settled total when the guard was seeded.
    settled: u64,
    /// The first send made with the guard in place.
    next_seq: u64,
    /// What the seed still holds.
    held: u64,
}

/// A cap of a limit per trailing window on top of a dimension's bucket.
#[derive(Clone, Debug)]
pub(crate) struct Guard {
    /// The cap.
    pub(crate) window: WindowGuard,
    /// What seeding held for the requests that left before it existed, until their
    /// reports show how much of it the provider really counts.
    seed: Option<Seed>,
    /// For a provider counting in fixed windows whose edges are known, and a limit that is
    /// the provider's own: the bucket is full again at each edge, as the provider is. The
    /// value is the last edge it was refilled at.
    edge_refill: Option<Instant>,
}

impl Guard {
    /// `window`, holding from the start every reservation granted and not yet ended
    /// (`in_flight`): they may still reach the provider inside the window it caps.
    pub(crate) fn new(mut window: WindowGuard, in_flight: u64) -> Guard {
        window.take(in_flight);
        Guard { window, seed: None, edge_refill: None }
    }

    /// Seeds the guard, just installed on the strength of the reply to the request of
    /// `record` (`None`: too old to be on record), with what the provider has counted that
    /// the guard cannot know of: `used`, the provider's count when it took that request
    /// (less that request itself, which the guard holds already), and every reservation
    /// that ended since that request left (`settled` is the books' total now). Without a
    /// record the guard holds the whole limit for a window.
    ///
    /// Requests in flight when it left may be counted twice: the safe side. The reports of
    /// the other requests that left before the guard existed each bound the seed again
    /// ([`Guard::observe_used`]), so a burst whose replies arrive in any order is soon
    /// counted once.
    pub(crate) fn seed(
        &mut self,
        record: Option<SendRecord>,
        (settled, next_seq): (u64, u64),
        used: u64,
        clears: Option<Instant>,
        now: Instant,
    ) {
        let (seed, bounded) = match record {
            Some(record) => {
                let ended_since = settled.wrapping_sub(record.settled_then);
                (used.saturating_sub(record.own).saturating_add(ended_since), true)
            }
            None => (self.window.limit(), false),
        };
        self.window.hold(seed, clears, now);
        self.seed = bounded.then_some(Seed { settled, next_seq, held: seed });
    }

    /// The provider's count of what the window has used (its limit minus its remaining),
    /// on the reply to the request stamped `sent` (with its `record`, if kept):
    ///
    /// - beyond everything the guard holds, in flight included, is what someone else
    ///   spent on the same key: it is held for a window too;
    /// - below what the guard held when the request left is what the guard over-counts (it
    ///   holds reservations until it learns otherwise, and a provider may count usage, or
    ///   restart a fixed window): that much is let go.
    ///
    /// A request that left before the guard was seeded bounds the seed again: what it says
    /// the provider counted, less the request itself, plus what ended between its send and
    /// the seeding. A lower bound than the seed holds lets the difference go.
    pub(crate) fn observe_used(
        &mut self,
        sent: SendStamp,
        record: Option<SendRecord>,
        used: u64,
        clears: Option<Instant>,
        now: Instant,
    ) {
        if let (Some(record), Some(seed)) = (record, self.seed)
            && sent.seq < seed.next_seq
        {
            let ended_between = seed.settled.wrapping_sub(record.settled_then);
            let bound = used.saturating_sub(record.own).saturating_add(ended_between);
            if bound < seed.held {
                self.window.forgive(seed.held - bound, now);
                self.seed = Some(Seed { held: bound, ..seed });
            }
        }
        self.window.observe_used(used, clears, now);
        if let Some(record) = record {
            self.window.trim(used, record.guard_held, now);
        }
    }

    /// A blind provider's fixed-window edges, newly estimated by learning (`None`: given
    /// up); a limit that is the provider's own (`own_limit`) is there whole at each edge,
    /// so the bucket refills to full at each one.
    pub(crate) fn set_edges(
        &mut self,
        edges: Option<(Instant, Instant)>,
        own_limit: bool,
        now: Instant,
    ) {
        self.window.set_edges(edges);
        self.edge_refill = match (edges, own_limit) {
            (Some(_), true) => {
                Some(self.edge_refill.or(self.window.edge_before(now)).unwrap_or(now))
            }
            _ => None,
        };
    }

    /// Whether a provider's fixed window began since the bucket was last whole: it is to
    /// be refilled to full, as the provider is (the edge is noted as done).
    pub(crate) fn refill_due(&mut self, now: Instant) -> bool {
        let Some(refilled) = self.edge_refill else {
            return false;
        };
        match self.window.edge_before(now) {
            Some(edge) if edge > refilled => {
                self.edge_refill = Some(edge);
                true
            }
            _ => false,
        }
    }

    /// The next edge at which the bucket is full again, if it refills at edges.
    pub(crate) fn refill_at(&self, now: Instant) -> Option<Instant> {
        self.edge_refill?;
        self.window.edge_after(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_later_report_on_an_earlier_send_lets_the_seed_go_down_to_its_bound() {
        let window = WindowGuard::new(100, Duration::from_secs(60)).unwrap();
        let mut guard = Guard::new(window, 10);
        let now = Instant::ZERO;
        let record = |settled_then, own| SendRecord {
            at: now,
            unsettled_others: 0,
            guard_held: 0,
            own,
            settled_then,
        };
        // Seeded on a report of 50 used by a request of 5 sent when 20 had settled; 30
        // settled by now: 45 counted before it, and 10 ended since, held.
        guard.seed(Some(record(20, 5)), (30, 7), 50, None, now);
        assert_eq!(guard.seed.map(|s| s.held), Some(55));
        // A request sent before the seeding reports 40 used: a lower bound (35 + 10).
        let earlier = SendStamp { epoch: Default::default(), seq: 3, counted_by: Instant::NEVER };
        guard.observe_used(earlier, Some(record(20, 5)), 40, None, now);
        assert_eq!(guard.seed.map(|s| s.held), Some(45));
    }
}
