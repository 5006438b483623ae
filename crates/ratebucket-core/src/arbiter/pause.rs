//! The pool-wide pause: throttles, a quota spent, aborts and resuming.

use super::*;

/// The account's quota, spent as a refusal said ([`Settle::Spent`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct Spent {
    /// When it resets; `None`: when someone raises it ([`Arbiter::resume`]).
    pub(super) until: Option<Instant>,
    /// The dimension the refusal named, if any.
    pub(super) dimension: Option<usize>,
}

impl Arbiter {
    /// Reports that a request sent with `sent` was throttled, with the provider's
    /// Retry-After if it gave one. Closes the gate once per epoch; see [`Gate`].
    ///
    /// A throttle that closes the gate sets every level to zero (the provider has nothing
    /// left) and writes off every reservation granted until then: committing one refunds
    /// nothing and releasing one gives nothing back, because the provider's nothing
    /// already counts them (if it did not charge them, it has not refilled them either).
    /// Only what refills from then on is granted again. Without this, the releases of the
    /// rest of a wave's 429s would refill the buckets by the wave's size and launch it
    /// again, into the same wall, the moment the pause ends. The cost: after a throttle,
    /// a bucket whose rate is next to nothing grants nothing more.
    pub fn throttle(
        &mut self,
        sent: SendStamp,
        retry_after: Option<Duration>,
        now: Instant,
    ) -> ThrottleOutcome {
        let now = self.clock.advance(now);
        let outcome = self.gate.throttle(sent.epoch, retry_after, now);
        if let ThrottleOutcome::Closed { until, pause, epoch } = outcome {
            self.events.push_back(Event::Throttled { epoch, pause, until });
            // The provider just said it has nothing left: so have we. After the pause
            // the buckets hold what refilled during it, as the provider's do.
            for dim in &mut self.dims {
                dim.bucket.lower_to(0, now);
            }
            if let Some(adapt) = self.config.adapt {
                self.decrease_rates(adapt, until, now);
            }
        }
        outcome
    }

    /// Undoes [`Arbiter::abort`], or a quota reported spent, once the cause is fixed (a key
    /// replaced, credit added, a limit raised): reservations are accepted again. Waiters
    /// refused meanwhile stay refused.
    pub fn resume(&mut self, now: Instant) {
        let now = self.clock.advance(now);
        self.aborted = false;
        self.spent = None;
        self.forget_spent(now);
        self.drive(now);
    }

    /// The account's quota is spent for `resets_in` (`None`: until someone raises it), as a
    /// refusal of the provider's said, naming `dimension` if it did: every waiter is
    /// refused with [`Refusal::QuotaSpent`], and every reservation until then with
    /// [`ReserveError::QuotaSpent`], unless its `max_wait` reaches the reset (it then
    /// waits for it).
    pub(super) fn spend(
        &mut self,
        resets_in: Option<Duration>,
        dimension: Option<usize>,
        now: Instant,
    ) {
        self.spent =
            Some(Spent { until: resets_in.map(|wait| now.saturating_add(wait)), dimension });
        self.quota_spent = true;
        self.refuse_everyone(Refusal::QuotaSpent { dimension, resets_in });
    }

    /// Whether the account's quota is spent at `now` (what has reset is forgotten).
    #[inline]
    pub(super) fn spent_holds(&mut self, now: Instant) -> bool {
        if !self.quota_spent {
            return false;
        }
        self.forget_spent(now);
        self.spent.is_some()
    }

    /// Stops the run after a fatal failure: every queued waiter is refused with
    /// [`Refusal::Aborted`] and later reservations fail with [`ReserveError::Aborted`],
    /// until [`Arbiter::resume`]. Granted reservations can still be committed or released.
    pub fn abort(&mut self, now: Instant) {
        self.clock.advance(now);
        self.aborted = true;
        self.refuse_everyone(Refusal::Aborted);
    }

    /// Refuses every queued and parked waiter for `reason`.
    fn refuse_everyone(&mut self, reason: Refusal) {
        while let Some(ticket) = self.queue.pop_front() {
            if self.tickets.is_queued(ticket) {
                self.unqueue(ticket);
                self.tickets.free(ticket);
                self.events.push_back(Event::Refused { ticket, reason });
            }
        }
        for ticket in self.parked() {
            self.unpark(ticket);
            self.tickets.free(ticket);
            self.events.push_back(Event::Refused { ticket, reason });
        }
    }
}
