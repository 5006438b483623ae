//! The ticket slab: generational tickets, their slots, their costs and the callers' own
//! estimates, owned by [`Tickets`].

use super::error::TicketError;
use super::fair::{Caller, Priority, Tenant};
use crate::gate::Epoch;
use crate::ids::Ticket;
use crate::time::Instant;

/// One reservation's slot: 48 bytes, as every queued waiter holds one (its fields are
/// laid flat so that none pads another).
#[derive(Clone, Copy, Debug)]
pub(super) struct Slot {
    pub(super) generation: u32,
    /// The low bits of the gate epoch the reservation was granted in: one granted before
    /// the gate last closed is written off (see [`Arbiter::throttle`]). Epochs only grow,
    /// so a differing epoch is a later one ([`Slot::written_off`]).
    granted_in: u32,
    /// Who the reservation is for: its tenant and class.
    tenant: Tenant,
    priority: Priority,
    pub(super) state: SlotState,
    /// Whether a learned charge raised the cost at grant: the caller's own estimate is
    /// then kept apart (otherwise it is the cost itself).
    pub(super) raised: bool,
    /// The send sequence of the request a granted reservation paid for (`NOT_SENT` until
    /// it is stamped).
    pub(super) sent: u64,
    /// When a queued reservation arrived; once granted, when it was granted.
    pub(super) at: Instant,
    /// Its arrival from the start: its place among equal tags in the queue's order.
    pub(super) arrival: u64,
    /// Its start tag in the fair order once it queued ([`NO_START`] until then); its tag
    /// is its start plus its class's lead (the queue's entries hold it).
    pub(super) start: u64,
}

impl Slot {
    /// Who the reservation is for.
    #[inline]
    pub(super) fn caller(&self) -> Caller {
        Caller { tenant: self.tenant, priority: self.priority }
    }

    /// Granted at `now` in `epoch`.
    #[inline]
    pub(super) fn granted(&mut self, epoch: Epoch, now: Instant) {
        (self.granted_in, self.at) = (epoch.get() as u32, now);
    }

    /// Whether it was granted before the gate's `epoch` began (written off by its throttle).
    #[inline]
    pub(super) fn written_off(&self, epoch: Epoch) -> bool {
        self.granted_in != epoch.get() as u32
    }
}

/// The start of a reservation that never queued.
pub(super) const NO_START: u64 = u64::MAX;

pub(super) const NOT_SENT: u64 = u64::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SlotState {
    Free,
    Queued,
    /// Waiting for room under its tenant's cap, not yet in the queue.
    Parked,
    Granted,
}

/// Every reservation not yet ended: a slab of slots reused under a new generation, and
/// each slot's cost (one entry per dimension, flat) with the caller's own estimate beside
/// it for the costs a learned charge raised.
#[derive(Clone, Debug)]
pub(super) struct Tickets {
    dims: usize,
    slots: Vec<Slot>,
    /// `dims` costs per slot.
    costs: Vec<u64>,
    /// The same, as the caller reserved them, for the slots whose costs were raised (grown
    /// only once one is).
    estimates: Vec<u64>,
    free: Vec<u32>,
    /// Reservations granted and not yet ended.
    granted: usize,
    /// Reservations made so far (each one's arrival number).
    arrivals: u64,
}

impl Tickets {
    /// No tickets, for costs over `dims` dimensions.
    pub(super) fn new(dims: usize) -> Tickets {
        Tickets {
            dims,
            slots: Vec::new(),
            costs: Vec::new(),
            estimates: Vec::new(),
            free: Vec::new(),
            granted: 0,
            arrivals: 0,
        }
    }

    /// A slot in `state` for a reservation of `cost` (`dims` entries) for `caller`, the
    /// next to arrive.
    #[inline]
    pub(super) fn allocate(
        &mut self,
        cost: &[u64],
        state: SlotState,
        caller: Caller,
        now: Instant,
    ) -> Ticket {
        debug_assert_eq!(cost.len(), self.dims);
        self.arrivals += 1;
        let arrival = self.arrivals;
        if state == SlotState::Granted {
            self.granted += 1;
        }
        if let Some(index) = self.free.pop() {
            let slot = &mut self.slots[index as usize];
            slot.state = state;
            slot.sent = NOT_SENT;
            slot.at = now;
            slot.raised = false;
            (slot.tenant, slot.priority) = (caller.tenant, caller.priority);
            (slot.arrival, slot.start) = (arrival, NO_START);
            let base = index as usize * self.dims;
            // One word at a time: a slice copy calls memcpy for these few words.
            for (d, &c) in cost.iter().enumerate() {
                self.costs[base + d] = c;
            }
            Ticket { index, generation: slot.generation }
        } else {
            let index = u32::try_from(self.slots.len()).expect("fewer than 2^32 live tickets");
            self.slots.push(Slot {
                generation: 0,
                granted_in: 0,
                tenant: caller.tenant,
                priority: caller.priority,
                state,
                raised: false,
                sent: NOT_SENT,
                at: now,
                arrival,
                start: NO_START,
            });
            self.costs.extend_from_slice(cost);
            Ticket { index, generation: 0 }
        }
    }

    /// Ends `ticket`'s reservation: its slot is free for the next, under a new generation.
    #[inline]
    pub(super) fn free(&mut self, ticket: Ticket) {
        let slot = &mut self.slots[ticket.index as usize];
        if slot.state == SlotState::Granted {
            self.granted -= 1;
        }
        slot.state = SlotState::Free;
        slot.generation = slot.generation.wrapping_add(1);
        self.free.push(ticket.index);
    }

    /// `ticket`'s slot, if its reservation has not ended.
    #[inline]
    pub(super) fn get(&self, ticket: Ticket) -> Option<&Slot> {
        self.slots
            .get(ticket.index as usize)
            .filter(|s| s.generation == ticket.generation && s.state != SlotState::Free)
    }

    /// The slot of `ticket` if it is granted; otherwise why not.
    #[inline]
    pub(super) fn granted(&self, ticket: Ticket) -> Result<Slot, TicketError> {
        match self.get(ticket) {
            Some(slot) if slot.state == SlotState::Granted => Ok(*slot),
            Some(_) => Err(TicketError::NotGranted),
            None => Err(TicketError::Unknown),
        }
    }

    /// Whether `ticket` is queued.
    #[inline]
    pub(super) fn is_queued(&self, ticket: Ticket) -> bool {
        self.get(ticket).is_some_and(|s| s.state == SlotState::Queued)
    }

    /// The slot of a live `ticket`.
    #[inline]
    pub(super) fn slot(&self, ticket: Ticket) -> &Slot {
        &self.slots[ticket.index as usize]
    }

    /// The slot of a live `ticket`, to change.
    #[inline]
    pub(super) fn slot_mut(&mut self, ticket: Ticket) -> &mut Slot {
        &mut self.slots[ticket.index as usize]
    }

    /// What a live `ticket` holds, one entry per dimension.
    #[inline]
    pub(super) fn cost(&self, ticket: Ticket) -> &[u64] {
        let base = ticket.index as usize * self.dims;
        &self.costs[base..base + self.dims]
    }

    /// What a live `ticket` holds in `dimension`.
    #[inline]
    pub(super) fn cost_in(&self, ticket: Ticket, dimension: usize) -> u64 {
        self.costs[ticket.index as usize * self.dims + dimension]
    }

    /// Raises what a live `ticket` holds in `dimension` to `booked` (a learned charge),
    /// keeping the caller's own estimate apart the first time.
    #[inline]
    pub(super) fn raise(&mut self, ticket: Ticket, dimension: usize, booked: u64) {
        let base = ticket.index as usize * self.dims;
        let slot = &mut self.slots[ticket.index as usize];
        if booked != self.costs[base + dimension] && !slot.raised {
            // Kept apart only once a cost is raised: a queue of plain reservations holds
            // no second copy of its costs.
            if self.estimates.len() < base + self.dims {
                self.estimates.resize(self.costs.len(), 0);
            }
            self.estimates[base..base + self.dims]
                .copy_from_slice(&self.costs[base..base + self.dims]);
            slot.raised = true;
        }
        self.costs[base + dimension] = booked;
    }

    /// Puts a live `ticket`'s cost back to the caller's own estimate, if it was raised.
    pub(super) fn restore_estimate(&mut self, ticket: Ticket) {
        let base = ticket.index as usize * self.dims;
        if std::mem::replace(&mut self.slots[ticket.index as usize].raised, false) {
            self.costs[base..base + self.dims]
                .copy_from_slice(&self.estimates[base..base + self.dims]);
        }
    }

    /// A live `ticket`'s cost as the caller reserved it (before any learned charge).
    #[inline]
    pub(super) fn estimate(&self, ticket: Ticket) -> &[u64] {
        let base = ticket.index as usize * self.dims;
        if self.slots[ticket.index as usize].raised {
            &self.estimates[base..base + self.dims]
        } else {
            &self.costs[base..base + self.dims]
        }
    }

    /// Reservations not yet ended, queued or granted.
    pub(super) fn live(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Reservations granted and not yet ended (requests in flight, or about to be).
    #[inline]
    pub(super) fn granted_count(&self) -> usize {
        self.granted
    }

    /// Moves a live `ticket` to `state` (not [`SlotState::Free`]: see [`Tickets::free`]).
    #[inline]
    pub(super) fn set_state(&mut self, ticket: Ticket, state: SlotState) {
        debug_assert_ne!(state, SlotState::Free);
        let slot = &mut self.slots[ticket.index as usize];
        match (slot.state == SlotState::Granted, state == SlotState::Granted) {
            (false, true) => self.granted += 1,
            (true, false) => self.granted -= 1,
            _ => {}
        }
        slot.state = state;
    }

    /// The costs of the granted reservations.
    pub(super) fn granted_costs(&self) -> impl Iterator<Item = &[u64]> + '_ {
        self.slots
            .iter()
            .zip(self.costs.chunks_exact(self.dims))
            .filter(|(slot, _)| slot.state == SlotState::Granted)
            .map(|(_, cost)| cost)
    }

    /// The summed cost in `dimension` of the granted reservations `which` picks.
    pub(super) fn granted_cost(&self, dimension: usize, which: impl Fn(&Slot) -> bool) -> u64 {
        self.slots
            .iter()
            .zip(self.costs.chunks_exact(self.dims))
            .filter(|(slot, _)| slot.state == SlotState::Granted && which(slot))
            .map(|(_, cost)| cost[dimension])
            .fold(0u64, u64::saturating_add)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Instant {
        Instant::from_millis(ms)
    }

    /// Every queued waiter holds a slot and a queue entry: they stay small.
    #[test]
    fn a_slot_is_48_bytes() {
        assert_eq!(std::mem::size_of::<Slot>(), 48);
    }

    #[test]
    fn an_ended_ticket_is_unknown_even_when_its_slot_is_reused() {
        let mut tickets = Tickets::new(2);
        let first = tickets.allocate(&[1, 10], SlotState::Granted, Caller::default(), at(0));
        tickets.free(first);
        assert!(tickets.get(first).is_none());
        let second = tickets.allocate(&[2, 20], SlotState::Queued, Caller::default(), at(1));
        assert_eq!(second.index, first.index, "the slot is reused");
        assert!(tickets.get(first).is_none(), "the old generation stays dead");
        assert!(tickets.is_queued(second));
        assert_eq!(tickets.cost(second), &[2, 20]);
        assert_eq!(tickets.live(), 1);
    }

    #[test]
    fn a_raised_cost_keeps_the_callers_estimate_until_restored() {
        let mut tickets = Tickets::new(2);
        let ticket = tickets.allocate(&[1, 100], SlotState::Granted, Caller::default(), at(0));
        tickets.raise(ticket, 1, 150);
        assert_eq!(tickets.cost(ticket), &[1, 150]);
        assert_eq!(tickets.estimate(ticket), &[1, 100]);
        // A second raise keeps the first estimate, not the raised cost.
        tickets.raise(ticket, 0, 2);
        assert_eq!(tickets.estimate(ticket), &[1, 100]);
        tickets.restore_estimate(ticket);
        assert_eq!(tickets.cost(ticket), &[1, 100]);
        assert!(!tickets.slot(ticket).raised);
    }

    #[test]
    fn only_granted_reservations_count_as_granted() {
        let mut tickets = Tickets::new(1);
        let granted = tickets.allocate(&[5], SlotState::Granted, Caller::default(), at(0));
        let _queued = tickets.allocate(&[7], SlotState::Queued, Caller::default(), at(0));
        let ended = tickets.allocate(&[11], SlotState::Granted, Caller::default(), at(0));
        tickets.free(ended);
        assert_eq!(tickets.granted_cost(0, |_| true), 5);
        assert_eq!(tickets.granted_costs().collect::<Vec<_>>(), vec![&[5][..]]);
        assert_eq!(tickets.granted_count(), 1);
        tickets.free(granted);
        assert_eq!(tickets.granted_count(), 0);
        let queued = tickets.allocate(&[3], SlotState::Queued, Caller::default(), at(0));
        tickets.set_state(queued, SlotState::Granted);
        assert_eq!(tickets.granted_count(), 1);
        tickets.set_state(queued, SlotState::Queued);
        assert_eq!(tickets.granted_count(), 0);
    }
}
