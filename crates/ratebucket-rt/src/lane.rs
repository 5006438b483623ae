//! The express lane: permits the arbiter leased out, granted and refunded in one atomic
//! word, without the lock or a ticket.
//!
//! The arbiter leases whole permits per dimension ([`Desk::lease`]) while nothing
//! needs order; the limiter packs them into one `AtomicU64`, and a reservation that fits
//! takes its cost from every dimension in one compare-and-swap (all or nothing, like the
//! arbiter). Before any input that needs order (a reservation that must wait, a throttle,
//! a report, an abort, a change of limits) the limiter closes the lane with one swap and
//! returns what was left ([`Desk::give_back`]): after the swap no grant can come from
//! that lease. A refund goes back into the word only while the same lease is open;
//! otherwise it goes through the arbiter.
//!
//! The word: bit 63 says open, bits 56-62 count leases (a grant refunds only into the
//! lease it came from), and bits 0-55 hold one field per dimension, `56 / dimensions` bits
//! each (56, 28, 18 or 14).
//!
//! [`Desk::lease`]: ratebucket_core::Desk::lease
//! [`Desk::give_back`]: ratebucket_core::Desk::give_back

use ratebucket_core::{Epoch, Lease, MAX_LANE_DIMENSIONS};

use crate::sync::{AtomicU64, Ordering};

const OPEN: u64 = 1 << 63;
const GENERATION_SHIFT: u32 = 56;
const GENERATION_MASK: u64 = 0x7f << GENERATION_SHIFT;
const FIELD_BITS_TOTAL: u32 = 56;

/// The lane of one limiter (see the module docs). Aligned to a cache line pair of its own:
/// the limiter's reference count, touched as every reservation is made and dropped, and
/// the lock must not share a line with the word every grant swaps.
#[repr(align(128))]
pub(crate) struct Lane {
    word: AtomicU64,
    /// The gate epoch of the open lease (written before the word opens it).
    epoch: AtomicU64,
    dims: usize,
    /// Bits per dimension's field; 0 when the lane cannot serve this many dimensions.
    bits: u32,
    /// The most one field holds (`2^bits - 1`).
    most: u64,
}

/// What the lane granted and refunded since the limiter last published its metrics:
/// counted only with the `metrics` feature, and published under the lock, where the
/// names are.
#[derive(Default)]
pub(crate) struct Tally {
    grants: AtomicU64,
    refunded: [AtomicU64; MAX_LANE_DIMENSIONS],
}

impl Tally {
    /// One grant.
    pub(crate) fn grant(&self) {
        self.grants.fetch_add(1, Ordering::Relaxed);
    }

    /// A refund of `back` (one entry per dimension).
    pub(crate) fn refund(&self, back: &[u64]) {
        for (total, &b) in self.refunded.iter().zip(back) {
            if b > 0 {
                total.fetch_add(b, Ordering::Relaxed);
            }
        }
    }

    /// Takes the counts: grants, and refunds per dimension.
    pub(crate) fn take(&self) -> (u64, [u64; MAX_LANE_DIMENSIONS]) {
        let mut refunded = [0; MAX_LANE_DIMENSIONS];
        for (out, total) in refunded.iter_mut().zip(&self.refunded) {
            *out = total.swap(0, Ordering::Relaxed);
        }
        (self.grants.swap(0, Ordering::Relaxed), refunded)
    }
}

/// A grant the lane made: its cost, packed as the lane packs it (small, so a reservation
/// moves cheaply), and the lease it came from.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LaneGrant {
    packed: u64,
    generation: u64,
    epoch: u64,
}

impl LaneGrant {
    /// The gate epoch of the lease it came from.
    pub(crate) fn epoch(&self) -> Epoch {
        Epoch::from(self.epoch)
    }
}

impl Lane {
    /// A closed lane for `dims` dimensions.
    pub(crate) fn new(dims: usize) -> Lane {
        let serves = (1..=MAX_LANE_DIMENSIONS).contains(&dims);
        let bits = if serves { FIELD_BITS_TOTAL / dims as u32 } else { 0 };
        Lane {
            word: AtomicU64::new(0),
            epoch: AtomicU64::new(0),
            dims,
            bits,
            most: if serves { (1u64 << bits) - 1 } else { 0 },
        }
    }

    /// The most one field holds: what [`Desk::lease`] may lease per dimension
    /// (zero: the lane never opens).
    ///
    /// [`Desk::lease`]: ratebucket_core::Desk::lease
    #[inline]
    pub(crate) fn most(&self) -> u64 {
        self.most
    }

    /// Takes `cost` from every dimension at once if the lane is open and holds it all.
    #[inline]
    pub(crate) fn try_take(&self, cost: &[u64]) -> Option<LaneGrant> {
        if cost.len() != self.dims || self.bits == 0 {
            return None;
        }
        let mut packed = 0u64;
        for (d, &c) in cost.iter().enumerate() {
            if c > self.most() {
                return None;
            }
            packed |= c << (d as u32 * self.bits);
        }
        let mut word = self.word.load(Ordering::Acquire);
        loop {
            if word & OPEN == 0 || !self.holds(word, cost) {
                return None;
            }
            // Read before the swap: if the swap succeeds, the word (and so the lease) did
            // not change since it was loaded, and the epoch was written before it opened.
            let epoch = self.epoch.load(Ordering::Relaxed);
            match self.word.compare_exchange_weak(
                word,
                word - packed,
                Ordering::Acquire,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    return Some(LaneGrant { packed, generation: word & GENERATION_MASK, epoch });
                }
                Err(now) => word = now,
            }
        }
    }

    /// What `grant` reserved, one entry per dimension (the first [`Lane::dims`]).
    pub(crate) fn cost(&self, grant: &LaneGrant) -> [u64; MAX_LANE_DIMENSIONS] {
        let mut cost = [0; MAX_LANE_DIMENSIONS];
        for (d, c) in cost.iter_mut().enumerate().take(self.dims) {
            *c = self.field(grant.packed, d);
        }
        cost
    }

    /// The number of dimensions.
    pub(crate) fn dims(&self) -> usize {
        self.dims
    }

    /// Settles `grant` at `actual` (one entry per dimension) inside the lease it came
    /// from: the over-estimate goes back into the word. `false` if the lease is no longer
    /// open, or `actual` is above the grant in some dimension: the arbiter must settle it.
    #[inline]
    pub(crate) fn settle(&self, grant: &LaneGrant, actual: &[u64]) -> bool {
        if actual.len() != self.dims {
            return false;
        }
        let mut used = 0u64;
        for (d, &a) in actual.iter().enumerate() {
            if a > self.field(grant.packed, d) {
                return false;
            }
            used |= a << (d as u32 * self.bits);
        }
        // Field by field `used <= packed`, so no field borrows from the next.
        self.give_back(grant, grant.packed - used)
    }

    /// Puts all of `grant` back into its lease, if that is still open (a grant never
    /// sent). `false`: the arbiter must take it.
    #[inline]
    pub(crate) fn release(&self, grant: &LaneGrant) -> bool {
        self.give_back(grant, grant.packed)
    }

    /// Adds `packed` (at most the grant's cost, field by field) to the lease `grant` came
    /// from, if that lease is still open and has room.
    #[inline]
    fn give_back(&self, grant: &LaneGrant, packed: u64) -> bool {
        if packed == 0 {
            return true;
        }
        let mut word = self.word.load(Ordering::Acquire);
        loop {
            let same_lease = word & OPEN != 0
                && word & GENERATION_MASK == grant.generation
                && self.epoch.load(Ordering::Relaxed) == grant.epoch;
            if !same_lease || !self.has_room(word, packed) {
                return false;
            }
            match self.word.compare_exchange_weak(
                word,
                word + packed,
                Ordering::Acquire,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(now) => word = now,
            }
        }
    }

    /// Opens the lane with `lease` (the lane must be closed: call under the limiter's lock).
    pub(crate) fn open(&self, lease: &Lease) {
        let word = self.word.load(Ordering::Relaxed);
        let generation = (word & GENERATION_MASK).wrapping_add(1 << GENERATION_SHIFT);
        let mut fields = 0u64;
        for d in 0..self.dims {
            fields |= lease.permits[d].min(self.most()) << (d as u32 * self.bits);
        }
        self.epoch.store(lease.epoch.get(), Ordering::Relaxed);
        self.word.store(OPEN | (generation & GENERATION_MASK) | fields, Ordering::Release);
    }

    /// Closes the lane and returns what it still held per dimension, if it was open. No
    /// grant comes from the closed lease after this.
    pub(crate) fn close(&self) -> Option<[u64; MAX_LANE_DIMENSIONS]> {
        if self.word.load(Ordering::Relaxed) & OPEN == 0 {
            // Only the lock holder opens it, and the caller holds the lock.
            return None;
        }
        // Keeps the lease count, so the next lease's grants are told apart from these.
        let word = self.word.fetch_and(GENERATION_MASK, Ordering::AcqRel);
        let mut unused = [0; MAX_LANE_DIMENSIONS];
        for (d, u) in unused.iter_mut().enumerate().take(self.dims) {
            *u = self.field(word, d);
        }
        Some(unused)
    }

    /// What the open lease holds in `dimension` now (0 when closed).
    pub(crate) fn pool(&self, dimension: usize) -> u64 {
        let word = self.word.load(Ordering::Acquire);
        if word & OPEN == 0 || dimension >= self.dims {
            return 0;
        }
        self.field(word, dimension)
    }

    #[inline]
    fn field(&self, word: u64, d: usize) -> u64 {
        (word >> (d as u32 * self.bits)) & self.most()
    }

    #[inline]
    fn holds(&self, word: u64, cost: &[u64]) -> bool {
        cost.iter().enumerate().all(|(d, &c)| self.field(word, d) >= c)
    }

    #[inline]
    fn has_room(&self, word: u64, packed: u64) -> bool {
        (0..self.dims).all(|d| self.most() - self.field(word, d) >= self.field(packed, d))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn lease(permits: &[u64], epoch: u64) -> Lease {
        let mut all = [0; MAX_LANE_DIMENSIONS];
        all[..permits.len()].copy_from_slice(permits);
        Lease { permits: all, epoch: Epoch::from(epoch) }
    }

    #[test]
    fn grants_all_or_nothing_from_what_was_leased() {
        let lane = Lane::new(2);
        assert!(lane.try_take(&[1, 1]).is_none(), "closed until leased");
        lane.open(&lease(&[3, 100], 0));
        assert!(lane.try_take(&[1, 101]).is_none(), "one dimension short");
        assert_eq!((lane.pool(0), lane.pool(1)), (3, 100), "nothing taken");
        let grant = lane.try_take(&[1, 60]).expect("fits");
        assert_eq!(lane.cost(&grant)[..2], [1, 60]);
        assert!(lane.try_take(&[1, 60]).is_none());
        assert!(!lane.settle(&grant, &[1, 61]), "debt is the arbiter's");
        assert!(lane.settle(&grant, &[1, 20]));
        assert_eq!((lane.pool(0), lane.pool(1)), (2, 80));
    }

    #[test]
    fn a_closed_lease_grants_nothing_and_takes_no_refund() {
        let lane = Lane::new(2);
        lane.open(&lease(&[3, 100], 0));
        let grant = lane.try_take(&[1, 60]).expect("fits");
        assert_eq!(lane.close().map(|u| [u[0], u[1]]), Some([2, 40]));
        assert!(lane.close().is_none(), "closed once");
        assert!(lane.try_take(&[1, 1]).is_none());
        assert!(!lane.settle(&grant, &[1, 20]), "the arbiter takes it");
        lane.open(&lease(&[3, 100], 0));
        assert!(!lane.release(&grant), "a refund never lands in a later lease");
    }

    #[test]
    fn fields_are_as_wide_as_the_dimensions_allow() {
        assert_eq!(Lane::new(1).most(), (1 << 56) - 1);
        assert_eq!(Lane::new(2).most(), (1 << 28) - 1);
        assert_eq!(Lane::new(4).most(), (1 << 14) - 1);
        assert_eq!(Lane::new(5).most(), 0, "five dimensions: no lane");
        let lane = Lane::new(4);
        lane.open(&lease(&[u64::MAX, 1, 1, 1], 0));
        assert_eq!(lane.pool(0), (1 << 14) - 1, "a lease is cut to the field");
        assert!(lane.try_take(&[1 << 14, 0, 0, 0]).is_none());
    }
}
