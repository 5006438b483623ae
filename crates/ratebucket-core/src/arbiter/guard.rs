//! The trailing-window guard.

use super::dimension::Seed;
use super::*;
use crate::books::SendRecord;

impl Arbiter {
    /// Caps `dimension` at `guard`'s limit per trailing window, on top of its bucket (or
    /// removes the cap with `None`): safe against providers that count in fixed windows or
    /// sliding logs whatever the bucket's burst (see [`WindowGuard`]). Queued reservations
    /// the new cap can never admit are refused with [`Refusal::CostExceedsCapacity`].
    /// A new guard counts every reservation granted and not yet ended (they may still reach
    /// the provider inside the window it caps); what ended before it was installed is for
    /// the provider's report to tell (the seed, from the books of what was sent).
    pub(crate) fn set_window_guard(
        &mut self,
        dimension: usize,
        guard: Option<WindowGuard>,
        now: Instant,
    ) -> Result<(), InvalidLimit> {
        let now = self.clock.advance(now);
        self.dimension_mut(dimension)?;
        // A new guard starts holding every reservation granted and not yet ended: they
        // settle into it when they end, and until then they may reach the provider inside
        // the very window the guard now caps.
        let in_flight = self.granted_cost(dimension, |_| true);
        let guard = guard.map(|mut guard| {
            guard.take(in_flight);
            guard
        });
        self.dims[dimension].guard = guard;
        self.dims[dimension].seed = None;
        self.dims[dimension].edge_refill = None;
        self.guarded = self.dims.iter().any(|d| d.guard.is_some());
        self.refuse_too_big(dimension);
        self.drive(now);
        Ok(())
    }

    /// Seeds `dimension`'s window guard, just installed on the strength of the reply to the
    /// request stamped `sent`, with what the provider has counted that the guard cannot
    /// know of: `used`, the provider's count when it took that request (less that request
    /// itself, which the guard holds already), and every reservation that ended since that
    /// request left (it may have reached the provider after it, and ended before the guard
    /// existed, so nothing else would count it). If the send is too old to be on record,
    /// the guard holds the whole limit for a window.
    ///
    /// Requests in flight when `sent` left may be counted twice (the provider may have
    /// taken them before it, and the guard holds them): the safe side. The reports of the
    /// other requests that left before the guard existed each bound the seed again, and the
    /// lowest bound is kept ([`Arbiter::observe_used`]), so a burst whose replies arrive in
    /// any order is soon counted once.
    pub(crate) fn seed_window_guard(
        &mut self,
        dimension: usize,
        sent: SendStamp,
        used: u64,
        clears: Option<Instant>,
        now: Instant,
    ) -> Result<(), InvalidLimit> {
        let now = self.clock.advance(now);
        self.dimension_mut(dimension)?;
        let record = self.books.send(sent.seq, dimension);
        let settled = self.books.settled_total(dimension);
        let next_seq = self.next_seq;
        let dim = &mut self.dims[dimension];
        let Some(guard) = dim.guard.as_mut() else {
            return Ok(());
        };
        let (seed, bounded) = match record {
            Some(record) => {
                let ended_since = settled.wrapping_sub(record.settled_then);
                (used.saturating_sub(record.own).saturating_add(ended_since), true)
            }
            None => (guard.limit(), false),
        };
        guard.hold(seed, clears, now);
        dim.seed = bounded.then_some(Seed { settled, next_seq, held: seed });
        Ok(())
    }

    /// A report of `used` on the request stamped `sent`, which left before `dimension`'s
    /// guard was seeded, bounds the seed again: what it says the provider counted, less the
    /// request itself, plus what ended between its send and the seeding. A lower bound
    /// than the seed holds lets the difference go.
    fn rebound_seed(
        &mut self,
        dimension: usize,
        sent: SendStamp,
        record: SendRecord,
        used: u64,
        now: Instant,
    ) {
        let Some(seed) = self.dims[dimension].seed else {
            return;
        };
        if sent.seq >= seed.next_seq {
            return;
        }
        let ended_between = seed.settled.wrapping_sub(record.settled_then);
        let bound = used.saturating_sub(record.own).saturating_add(ended_between);
        if bound >= seed.held {
            return;
        }
        let dim = &mut self.dims[dimension];
        if let Some(guard) = dim.guard.as_mut() {
            guard.forgive(seed.held - bound, now);
        }
        dim.seed = Some(Seed { held: bound, ..seed });
    }

    /// A blind provider's fixed-window edges, newly estimated by learning (`None`: given
    /// up), go to `dimension`'s guard; a limit that is the provider's own (`own_limit`) is
    /// there whole at each edge, so the bucket refills to full at each one.
    pub(super) fn set_edges(
        &mut self,
        dimension: usize,
        edges: Option<(Instant, Instant)>,
        own_limit: bool,
        now: Instant,
    ) {
        let dim = &mut self.dims[dimension];
        if let Some(guard) = dim.guard.as_mut() {
            guard.set_edges(edges);
            dim.edge_refill = match (edges, own_limit) {
                (Some(_), true) => Some(dim.edge_refill.or(guard.edge_before(now)).unwrap_or(now)),
                _ => None,
            };
        }
    }

    pub(super) fn guard_mut(&mut self, dimension: usize) -> Option<&mut WindowGuard> {
        self.dims.get_mut(dimension).and_then(|d| d.guard.as_mut())
    }

    /// Changes the limit of `dimension`'s window guard, if it has one (a provider reported
    /// a different limit); the charges it holds stay.
    pub(crate) fn set_window_limit(
        &mut self,
        dimension: usize,
        limit: u64,
        now: Instant,
    ) -> Result<(), InvalidLimit> {
        let now = self.clock.advance(now);
        self.dimension_mut(dimension)?;
        if limit == 0 {
            return Err(InvalidLimit::ZeroCapacity);
        }
        if limit > crate::MAX_LIMIT {
            return Err(InvalidLimit::TooLarge);
        }
        if let Some(guard) = self.guard_mut(dimension) {
            guard.set_limit(limit);
            self.refuse_too_big(dimension);
            self.drive(now);
        }
        Ok(())
    }

    /// Reports the provider's count of what `dimension` has used in its window (its limit
    /// minus its remaining), on the reply to the request stamped `sent`, to its window
    /// guard (without one this does nothing):
    ///
    /// - beyond everything the guard holds, in flight included, is what someone else
    ///   spent on the same key: it is held for a window too;
    /// - below what the guard held when the request left is what the guard over-counts (it
    ///   holds reservations until it learns otherwise, and a provider may count usage, or
    ///   restart a fixed window): that much is let go.
    pub(crate) fn observe_used(
        &mut self,
        dimension: usize,
        sent: SendStamp,
        used: u64,
        clears: Option<Instant>,
        now: Instant,
    ) -> Result<(), InvalidLimit> {
        let now = self.clock.advance(now);
        self.dimension_mut(dimension)?;
        if self.dims[dimension].guard.is_none() {
            return Ok(());
        }
        let record = self.books.send(sent.seq, dimension);
        if let Some(record) = record {
            self.rebound_seed(dimension, sent, record, used, now);
        }
        if let Some(guard) = self.guard_mut(dimension) {
            guard.observe_used(used, clears, now);
            if let Some(record) = record {
                guard.trim(used, record.guard_held, now);
            }
        }
        self.drive(now);
        Ok(())
    }
}
