//! The pool-wide pause: throttles, aborts and resuming.

use super::*;

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
        if let ThrottleOutcome::Closed {
            until,
            pause,
            epoch,
        } = outcome
        {
            self.events.push_back(Event::Throttled {
                epoch,
                pause,
                until,
            });
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

    /// Undoes [`Arbiter::abort`] once the cause is fixed (a key replaced, credit added):
    /// reservations are accepted again. Waiters refused by the abort stay refused.
    pub fn resume(&mut self, now: Instant) {
        let now = self.clock.advance(now);
        self.aborted = false;
        self.drive(now);
    }

    /// Stops the run after a fatal failure: every queued waiter is refused with
    /// [`Refusal::Aborted`] and later reservations fail with [`ReserveError::Aborted`],
    /// until [`Arbiter::resume`]. Granted reservations can still be committed or released.
    pub fn abort(&mut self, now: Instant) {
        self.clock.advance(now);
        self.aborted = true;
        while let Some(ticket) = self.queue.pop_front() {
            if self.tickets.is_queued(ticket) {
                self.unqueue(ticket);
                self.tickets.free(ticket);
                self.events.push_back(Event::Refused {
                    ticket,
                    reason: Refusal::Aborted,
                });
            }
        }
        for ticket in self.parked() {
            self.unpark(ticket);
            self.tickets.free(ticket);
            self.events.push_back(Event::Refused {
                ticket,
                reason: Refusal::Aborted,
            });
        }
    }
}
