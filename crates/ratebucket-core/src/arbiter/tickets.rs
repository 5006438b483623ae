//! The ticket slab: generational tickets, their slots and costs.

use super::*;

#[derive(Clone, Copy, Debug)]
pub(super) struct Slot {
    pub(super) generation: u32,
    pub(super) state: SlotState,
    /// The send sequence of the request a granted reservation paid for (`NOT_SENT` until
    /// [`Arbiter::stamp_send_for`]).
    pub(super) sent: u64,
    pub(super) since: Instant,
    /// The gate epoch the reservation was granted in: one granted before the gate last
    /// closed is written off (see [`Arbiter::throttle`]).
    pub(super) granted_in: Epoch,
    /// When the reservation was granted (for a queued one, when it arrived).
    pub(super) granted_at: Instant,
    /// Whether a learned charge raised the cost at grant: the caller's own estimate is
    /// then kept in `Arbiter::estimates` (otherwise it is the cost itself).
    pub(super) raised: bool,
}

pub(super) const NOT_SENT: u64 = u64::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SlotState {
    Free,
    Queued,
    Granted,
}

impl Arbiter {
    /// What `ticket` reserved, one entry per dimension; `None` once its reservation ended.
    pub fn cost(&self, ticket: Ticket) -> Option<&[u64]> {
        self.slot(ticket)?;
        let base = self.cost_base(ticket);
        Some(&self.costs[base..base + self.dims.len()])
    }

    /// A slot in `state` for a reservation of `cost` (as many entries as dimensions).
    #[inline]
    pub(super) fn allocate(&mut self, cost: &[u64], state: SlotState, now: Instant) -> Ticket {
        let dims = self.dims.len();
        if let Some(index) = self.free.pop() {
            let slot = &mut self.slots[index as usize];
            slot.state = state;
            slot.sent = NOT_SENT;
            slot.since = now;
            slot.granted_at = now;
            slot.raised = false;
            let base = index as usize * dims;
            // One word at a time: a slice copy calls memcpy for these few words.
            for (d, &c) in cost.iter().enumerate() {
                self.costs[base + d] = c;
            }
            Ticket {
                index,
                generation: slot.generation,
            }
        } else {
            let index = u32::try_from(self.slots.len()).expect("fewer than 2^32 live tickets");
            self.slots.push(Slot {
                generation: 0,
                state,
                sent: NOT_SENT,
                since: now,
                granted_in: Epoch::default(),
                granted_at: now,
                raised: false,
            });
            self.costs.extend_from_slice(cost);
            self.estimates.resize(self.costs.len(), 0);
            Ticket {
                index,
                generation: 0,
            }
        }
    }

    #[inline]
    pub(super) fn slot(&self, ticket: Ticket) -> Option<&Slot> {
        self.slots
            .get(ticket.index as usize)
            .filter(|s| s.generation == ticket.generation && s.state != SlotState::Free)
    }

    #[inline]
    pub(super) fn is_queued(&self, ticket: Ticket) -> bool {
        self.slot(ticket)
            .is_some_and(|s| s.state == SlotState::Queued)
    }

    /// Whether `ticket` (granted) was granted before the gate last closed: the throttle
    /// set every level to what the provider has, which already wrote off its cost.
    #[inline]
    pub(super) fn written_off(&self, ticket: Ticket) -> bool {
        self.slots[ticket.index as usize].granted_in < self.gate.epoch()
    }

    #[inline]
    pub(super) fn check_granted(&self, ticket: Ticket) -> Result<(), TicketError> {
        match self.slot(ticket).map(|s| s.state) {
            Some(SlotState::Granted) => Ok(()),
            Some(_) => Err(TicketError::NotGranted),
            None => Err(TicketError::Unknown),
        }
    }

    #[inline]
    pub(super) fn cost_base(&self, ticket: Ticket) -> usize {
        ticket.index as usize * self.dims.len()
    }

    #[inline]
    pub(super) fn free_slot(&mut self, ticket: Ticket) {
        let slot = &mut self.slots[ticket.index as usize];
        slot.state = SlotState::Free;
        slot.generation = slot.generation.wrapping_add(1);
        self.free.push(ticket.index);
    }
}
