//! The queue's order ([`Queue`]): waiting reservations sorted by [`Key`], stale entries
//! skipped and compacted, and the running sums of what they ask.

use std::collections::VecDeque;
use std::time::Duration;

use super::dims::Dims;
use super::fair::{Fair, Key};
use super::tickets::{NO_START, SlotState, Tickets};
use crate::ids::Ticket;

/// The waiting reservations in their order (by [`Key`]: first come, first served within a
/// flow; fair share and priority between flows, see `fair.rs`), and the running sums of
/// what they ask.
///
/// A reservation that stops waiting (granted out of order by backfilling, refused,
/// cancelled) leaves its entry behind, stale: it is skipped at the head, and the entries
/// are compacted once the stale outnumber the live. An entry keeps its key, so the order
/// stays sorted with stale entries in it.
#[derive(Clone, Debug)]
pub(super) struct Queue {
    order: VecDeque<(Key, Ticket)>,
    /// Entries still waiting.
    live: usize,
    /// Per dimension, the summed cost of the entries still waiting.
    cost: Vec<u128>,
    /// Tenants' shares and the classes' order: every entry's key.
    pub(super) fair: Fair,
}

impl Queue {
    /// An empty queue over `dims` dimensions.
    pub(super) fn new(dims: usize) -> Queue {
        Queue { order: VecDeque::new(), live: 0, cost: vec![0; dims], fair: Fair::default() }
    }

    /// Queues `ticket` (a reservation that arrived, or one its tenant's cap now has room
    /// for) in its tenant's fair order and its class (`aging`: each class's lead), by its
    /// dominant demand on `dims`.
    pub(super) fn enter(
        &mut self,
        ticket: Ticket,
        tickets: &mut Tickets,
        dims: &Dims,
        aging: [Duration; 3],
    ) {
        let demand = dims.demand(tickets.cost(ticket));
        let slot = *tickets.slot(ticket);
        let lead = aging[slot.caller().priority.index()];
        let (key, start) = self.fair.enqueue(slot.caller(), demand, lead, slot.arrival);
        tickets.slot_mut(ticket).start = start;
        tickets.set_state(ticket, SlotState::Queued);
        self.push(ticket, key, tickets.cost(ticket));
    }

    /// Puts a reservation that stopped waiting back in the queue: in its old place (its
    /// start tag and arrival) if it had one, else at the pool's virtual time in its class
    /// (ahead of the backlogs).
    pub(super) fn again(&mut self, ticket: Ticket, tickets: &mut Tickets, aging: [Duration; 3]) {
        let slot = *tickets.slot(ticket);
        let lead = aging[slot.caller().priority.index()];
        let key = if slot.start == NO_START {
            let (key, start) = self.fair.requeue_key(slot.caller(), lead, slot.arrival);
            tickets.slot_mut(ticket).start = start;
            key
        } else {
            self.fair.count_in(slot.caller());
            self.fair.place(lead, slot.start, slot.arrival)
        };
        tickets.set_state(ticket, SlotState::Queued);
        self.push(ticket, key, tickets.cost(ticket));
    }

    /// Queued `ticket` stops waiting: granted, with its dominant demand (`Some`), or not.
    /// Its entry, if still there, becomes stale.
    pub(super) fn leave(&mut self, ticket: Ticket, tickets: &Tickets, granted: Option<f64>) {
        let slot = tickets.slot(ticket);
        self.leave_sums(tickets.cost(ticket));
        let granted = granted.map(|demand| (slot.start, demand));
        self.fair.leave(slot.caller(), granted);
    }

    /// Reservations still waiting.
    #[inline]
    pub(super) fn live(&self) -> usize {
        self.live
    }

    /// Whether no entry is left, stale or live (the commonest case, checked first).
    #[inline]
    pub(super) fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// The summed cost in `dimension` of the reservations still waiting.
    pub(super) fn cost_in(&self, dimension: usize) -> u128 {
        self.cost[dimension]
    }

    /// Queues `ticket`, asking `cost`, in its place by `key` (at the back when nothing
    /// queued has a later key, as in a plain first-come queue).
    pub(super) fn push(&mut self, ticket: Ticket, key: Key, cost: &[u64]) {
        match self.order.back() {
            Some(&(last, _)) if last > key => {
                let position = self.order.partition_point(|&(k, _)| k <= key);
                self.order.insert(position, (key, ticket));
            }
            _ => self.order.push_back((key, ticket)),
        }
        self.count(cost);
    }

    fn count(&mut self, cost: &[u64]) {
        self.live += 1;
        for (sum, &c) in self.cost.iter_mut().zip(cost) {
            *sum += u128::from(c);
        }
    }

    /// A reservation that asked `cost` stops waiting (its entry, if still there, becomes
    /// stale).
    fn leave_sums(&mut self, cost: &[u64]) {
        self.live -= 1;
        for (sum, &c) in self.cost.iter_mut().zip(cost) {
            *sum -= u128::from(c);
        }
    }

    /// The first entry still queued; stale entries before it are dropped.
    #[inline]
    pub(super) fn head(&mut self, tickets: &Tickets) -> Option<Ticket> {
        while let Some(&(_, front)) = self.order.front() {
            if tickets.is_queued(front) {
                return Some(front);
            }
            self.order.pop_front();
        }
        None
    }

    /// The first entry still queued (a query: stale entries stay).
    pub(super) fn first(&self, tickets: &Tickets) -> Option<Ticket> {
        self.iter().find(|&t| tickets.is_queued(t))
    }

    /// Takes the front entry off (stale or live: the caller accounts for it).
    #[inline]
    pub(super) fn pop_front(&mut self) -> Option<Ticket> {
        self.order.pop_front().map(|(_, t)| t)
    }

    /// Entries, stale ones included.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.order.len()
    }

    /// Up to `most` reservations still queued behind the head, in order.
    pub(super) fn behind_head(&self, tickets: &Tickets, most: usize) -> Vec<Ticket> {
        self.iter().filter(|&t| tickets.is_queued(t)).skip(1).take(most).collect()
    }

    /// Every entry, stale ones included, in order.
    pub(super) fn iter(&self) -> impl Iterator<Item = Ticket> + '_ {
        self.order.iter().map(|&(_, t)| t)
    }

    /// Drops stale entries once they outnumber the live ones, keeping memory proportional
    /// to the live queue.
    #[inline]
    pub(super) fn compact(&mut self, tickets: &Tickets) {
        if self.order.len() > 2 * self.live + 64 {
            self.order.retain(|&(_, t)| tickets.is_queued(t));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arbiter::fair::Caller;
    use crate::arbiter::tickets::SlotState;
    use crate::time::Instant;

    fn at(ms: u64) -> Instant {
        Instant::from_millis(ms)
    }

    fn key(tag: u64, arrival: u64) -> Key {
        Key { tag, arrival }
    }

    #[test]
    fn the_head_skips_entries_that_stopped_waiting() {
        let mut tickets = Tickets::new(1);
        let mut queue = Queue::new(1);
        let first = tickets.allocate(&[3], SlotState::Queued, Caller::default(), at(0));
        let second = tickets.allocate(&[5], SlotState::Queued, Caller::default(), at(1));
        queue.push(first, key(0, 1), &[3]);
        queue.push(second, key(0, 2), &[5]);
        assert_eq!(queue.cost_in(0), 8);
        // The first is cancelled: it leaves the sums, and its entry goes stale.
        queue.leave_sums(tickets.cost(first));
        tickets.free(first);
        assert_eq!((queue.live(), queue.cost_in(0)), (1, 5));
        assert_eq!(queue.first(&tickets), Some(second));
        assert_eq!(queue.len(), 2, "a query leaves stale entries");
        assert_eq!(queue.head(&tickets), Some(second));
        assert_eq!(queue.len(), 1, "the head drops the stale entries before it");
    }

    #[test]
    fn an_entry_takes_its_place_by_key_and_equal_tags_by_arrival() {
        let mut tickets = Tickets::new(1);
        let mut queue = Queue::new(1);
        let early = tickets.allocate(&[1], SlotState::Granted, Caller::default(), at(0));
        let later = tickets.allocate(&[1], SlotState::Queued, Caller::default(), at(5));
        let last = tickets.allocate(&[1], SlotState::Queued, Caller::default(), at(6));
        queue.push(later, key(10, 2), &[1]);
        queue.push(last, key(20, 3), &[1]);
        tickets.slot_mut(early).state = SlotState::Queued;
        queue.push(early, key(10, 1), &[1]);
        assert_eq!(queue.iter().collect::<Vec<_>>(), vec![early, later, last]);
        assert_eq!(queue.live(), 3);
    }

    #[test]
    fn stale_entries_are_compacted_once_they_outnumber_the_live() {
        let mut tickets = Tickets::new(1);
        let mut queue = Queue::new(1);
        let keep = tickets.allocate(&[1], SlotState::Queued, Caller::default(), at(0));
        queue.push(keep, key(0, 0), &[1]);
        for i in 0..100 {
            let gone = tickets.allocate(&[1], SlotState::Queued, Caller::default(), at(0));
            queue.push(gone, key(1, i), &[1]);
            queue.leave_sums(&[1]);
            tickets.free(gone);
        }
        queue.compact(&tickets);
        assert_eq!(queue.iter().collect::<Vec<_>>(), vec![keep]);
    }
}
