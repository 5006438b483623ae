//! Send stamps and the provider's reports: syncing levels to what it says is left.

use super::*;

/// What a provider observation did to a dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FoldOutcome {
    /// The level was lowered to the observation.
    Lowered,
    /// The level was raised to the observation (only syncing to the provider's books raises).
    Raised,
    /// The observation reported as much or more headroom than the local level: ignored,
    /// since headroom may be stale or belong to another key.
    Unchanged,
    /// A newer observation was already applied to this dimension: ignored.
    Stale,
}

impl Arbiter {
    /// Stamps a request being sent at `now` without a reservation of its own, so that its
    /// reply's observations can be ordered.
    pub fn stamp_send(&mut self, now: Instant) -> SendStamp {
        self.stamp(None, now)
    }

    /// Stamps the request that `ticket`'s reservation pays for, sent at `now`, so that
    /// [`Arbiter::sync_level`] can tell the reply's own reservation from the others.
    pub(crate) fn stamp_send_for(&mut self, ticket: Ticket, now: Instant) -> SendStamp {
        let granted = self.slot(ticket).is_some_and(|s| s.state == SlotState::Granted);
        self.stamp(granted.then_some(ticket), now)
    }

    /// Stamps the request that `ticket`'s reservation pays for, sent at `now`, only while
    /// the gate is open: a closed gate returns the instant it reopens and stamps nothing.
    /// The reply's own reservation is then told apart from the others.
    ///
    /// Checking the gate and taking the stamp in one step is what keeps a request out of
    /// a pause: a caller that first asked [`Gate::is_open`] and stamped later could be
    /// overtaken by a throttle in between, then send into the pause with the new epoch,
    /// and its 429 would close the gate a second time for the same wave.
    pub fn stamp_send_if_open(
        &mut self,
        ticket: Ticket,
        now: Instant,
    ) -> Result<SendStamp, Instant> {
        let now = self.clock.advance(now);
        match self.gate.reopens_at(now) {
            Some(reopens) => Err(reopens),
            None => Ok(self.stamp_send_for(ticket, now)),
        }
    }

    pub(super) fn stamp(&mut self, ticket: Option<Ticket>, now: Instant) -> SendStamp {
        let now = self.clock.advance(now);
        if !self.books.is_open() {
            self.books.open(self.tickets.granted());
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let live = self.tickets.live() - self.queue.live();
        let guard_held =
            self.dims.iter().map(|d| d.guard.as_ref().map_or(0, WindowGuard::held_total));
        let cost = match ticket {
            Some(t) => {
                let slot = self.tickets.slot_mut(t);
                slot.sent = seq;
                self.send_delay =
                    self.send_delay.max(now.saturating_duration_since(slot.granted_at));
                // The caller's own estimate: kept apart only if a learned charge raised it.
                Some((self.tickets.cost(t), self.tickets.estimate(t)))
            }
            None => None,
        };
        self.books.record_send(seq, now, cost, guard_held, live);
        SendStamp { epoch: self.gate.epoch(), seq, counted_by: Instant::NEVER }
    }

    /// A report for `dimension` was folded: once every dimension has had one, the first
    /// reservation no longer goes alone ([`ArbiterConfig::first_alone`]).
    fn reported(&mut self, dimension: usize, now: Instant) {
        self.dims[dimension].reported = true;
        if self.first_alone && self.dims.iter().all(|d| d.reported) {
            self.end_first_alone(now);
        }
    }

    /// Reads a provider's "remaining" for `dimension`, reported on the reply to the request
    /// stamped `sent`, as a bound on what is left for new grants, and moves the level
    /// within it. Use it only where the provider is known to refill continuously.
    ///
    /// The report counts the requests the provider processed before that one, an order the
    /// client cannot see. Two readings bracket the truth:
    ///
    /// - **Floor:** only the reservations that had ended before the request was sent were
    ///   surely counted; every other one granted since may still be charged. The remaining
    ///   minus all of them is safe, so a level below it is **raised** to it.
    /// - **Ceiling:** the provider can have no more than the remaining plus what refilled
    ///   since the request left, and the reservations granted but not yet sent are still
    ///   to come. A level above that is **lowered** to it: even the kindest reading says
    ///   the client thinks it has more than the provider does (the provider charges more
    ///   than estimated, or another client shares the quota). Requests that left after
    ///   this one are not subtracted: on a pool of connections they may have been counted
    ///   first, and a ceiling that assumed otherwise would stall a burst.
    ///
    /// Any number of reports, in any order, can be read this way, so none is stale; a
    /// report whose send is too old to be on record only lowers. From the first sync on,
    /// the provider keeps the books for this dimension: commits and releases no longer
    /// move its level (its next report says what it really charged), until
    /// [`Arbiter::stop_sync`].
    ///
    /// On a funded dimension ([`TokenBucket::funded`]) the report is a bound on a shared
    /// quota, not this share: it is folded as [`Arbiter::observe_remaining`] (only lowers).
    #[cfg(test)]
    pub(crate) fn sync_level(
        &mut self,
        dimension: usize,
        sent: SendStamp,
        remaining: u64,
        now: Instant,
    ) -> Result<FoldOutcome, InvalidLimit> {
        self.sync_level_within(dimension, sent, remaining, 0, now)
    }

    /// [`Arbiter::sync_level`] for a `remaining` that may stand for up to `slack` more than
    /// it says (a count rounded to thousands): the floor reads the least it stands for, the
    /// ceiling the most. Reading both at the least would lower a level the reports had
    /// raised to the truth back to a step below it at every report.
    pub(crate) fn sync_level_within(
        &mut self,
        dimension: usize,
        sent: SendStamp,
        remaining: u64,
        slack: u64,
        now: Instant,
    ) -> Result<FoldOutcome, InvalidLimit> {
        if self.dimension_mut(dimension)?.bucket.is_funded() {
            // A funded share is not the provider's whole bucket: its report only lowers.
            return self.observe_remaining(dimension, sent, remaining, now);
        }
        let now = self.clock.advance(now);
        self.note_counted(sent, now);
        self.learn_charge(dimension, sent, remaining);
        // A count rounded to thousands bounds the provider's level only within a step: the
        // client's own reckoning (refunds and usage included) stays the level, each report
        // keeping it within its bounds. An exact count is the provider's books.
        let first = slack == 0 && !std::mem::replace(&mut self.dims[dimension].ledger, true);
        let remaining = i128::from(remaining);
        let to_come = self.granted_cost(dimension, |slot| slot.sent == NOT_SENT);
        let record = self.books.send(sent.seq, dimension);
        // By when the provider had counted it, if the reply said (else the report's fold).
        let counted_by = self.books.counted_by(sent.seq);
        let limit = self.dims[dimension].charge.limit;
        // Every other reservation not counted before this request was sent (it may be
        // charged after it), at what they will use together: not the sum of each one's high
        // quantile where reservations are lowered to it.
        let uncounted = record.map(|r| {
            let counted = self.books.counted_before(sent.seq, r.at, dimension);
            self.dims[dimension].pooled(r.unsettled_others.saturating_sub(counted))
        });
        let bucket = &mut self.dims[dimension].bucket;
        let refilled =
            record.map_or(0, |r| bucket.rate().permits_over(now.saturating_duration_since(r.at)));
        // The most the provider can have: its kindest reading, and the refill since.
        let ceiling = remaining + i128::from(slack) + i128::from(refilled) - i128::from(to_come);
        // A provider whose bucket is full wastes its refill while our requests are on their
        // way; the client's capacity leaves room for that only if what it holds plus what
        // is in flight stays within it, as it does for a bucket that only ever grants.
        let headroom = i128::from(bucket.capacity()) - i128::from(self.books.unsettled(dimension));
        let floor = uncounted.map(|uncounted| {
            // What refilled since the provider counted this one is the provider's.
            let since_counted = counted_by
                .map_or(0, |at| bucket.rate().permits_over(now.saturating_duration_since(at)));
            let full = i128::from(limit.unwrap_or(bucket.capacity())).max(remaining);
            let there = (remaining + i128::from(since_counted)).min(full);
            (there - i128::from(uncounted)).min(headroom)
        });
        let clamp = |v: i128| i64::try_from(v).unwrap_or(if v < 0 { i64::MIN } else { i64::MAX });
        let from = bucket.available(now);
        if first {
            // The level so far was the client's own reckoning (refunds included); from here
            // on it is the provider's books, read safely.
            bucket.set_level(clamp(floor.unwrap_or(ceiling).min(ceiling)), now);
        } else {
            if let Some(floor) = floor {
                bucket.raise_to(clamp(floor.min(ceiling)), now);
            }
            bucket.lower_to(clamp(ceiling), now);
        }
        let to = bucket.available(now);
        let outcome = if to > from {
            FoldOutcome::Raised
        } else if to < from {
            FoldOutcome::Lowered
        } else {
            FoldOutcome::Unchanged
        };
        if outcome != FoldOutcome::Unchanged {
            self.events.push_back(Event::Synced { dimension, from, to });
        }
        self.reported(dimension, now);
        self.drive(now);
        Ok(outcome)
    }

    /// Notes by when the provider had counted the request stamped `sent`: what its reply
    /// said ([`SendStamp::counted_by`], at most `now`), or else `now`. A bound before the
    /// send cannot be true and is not believed.
    pub(super) fn note_counted(&mut self, sent: SendStamp, now: Instant) {
        if let Some(stamped) = self.books.sent_at(sent.seq) {
            let told = sent.counted_at_latest();
            let told = told.filter(|&at| at >= stamped);
            let at = told.map_or(now, |at| at.min(now));
            self.books.count_by(sent.seq, at, told.is_some());
        }
    }

    /// Raises `dimension`'s level to what a provider's `remaining`, reported on the reply to
    /// a request stamped `sent`, leaves for new grants (every other live reservation
    /// subtracted, as [`Arbiter::observe_remaining`] does), never above the capacity. Only
    /// ever raises, and does not hand the books to the provider.
    ///
    /// For a limit just learned from the provider, when the client's own reckoning started
    /// from nothing: what the provider says remains can be spent now whatever its model (a
    /// bucket, a fixed window, a sliding log), so a short batch against a full provider
    /// takes its burst instead of pacing from an empty bucket.
    ///
    /// A funded dimension ([`TokenBucket::funded`]) is left unchanged: what the provider
    /// has left is shared, and no measure of this share.
    pub(crate) fn adopt_remaining(
        &mut self,
        dimension: usize,
        sent: SendStamp,
        remaining: u64,
        now: Instant,
    ) -> Result<FoldOutcome, InvalidLimit> {
        if self.dimension_mut(dimension)?.bucket.is_funded() {
            // What the provider has left is shared: it is no measure of this share.
            return Ok(FoldOutcome::Unchanged);
        }
        let now = self.clock.advance(now);
        // What this report says was booked applies to the burst it opens.
        self.learn_charge(dimension, sent, remaining);
        let target = self.remaining_for_us(dimension, sent, remaining);
        let bucket = &mut self.dims[dimension].bucket;
        let from = bucket.available(now);
        if !bucket.raise_to(target, now) {
            self.reported(dimension, now);
            return Ok(FoldOutcome::Unchanged);
        }
        let to = bucket.available(now);
        self.events.push_back(Event::Synced { dimension, from, to });
        self.reported(dimension, now);
        self.drive(now);
        Ok(FoldOutcome::Raised)
    }

    /// Folds a provider's "remaining" for `dimension`, observed on the reply to a request
    /// stamped `sent`: lowers the level to the remaining minus what every other live
    /// reservation holds (the provider may not have counted it). Only ever lowers; an observation
    /// older than one already applied to this dimension is ignored.
    pub(crate) fn observe_remaining(
        &mut self,
        dimension: usize,
        sent: SendStamp,
        remaining: u64,
        now: Instant,
    ) -> Result<FoldOutcome, InvalidLimit> {
        let now = self.clock.advance(now);
        self.dimension_mut(dimension)?;
        if self.dims[dimension].newest_observed.is_some_and(|newest| sent.seq < newest) {
            return Ok(FoldOutcome::Stale);
        }
        self.dims[dimension].newest_observed = Some(sent.seq);
        self.learn_charge(dimension, sent, remaining);
        let target = self.remaining_for_us(dimension, sent, remaining);
        let bucket = &mut self.dims[dimension].bucket;
        let from = bucket.available(now);
        let outcome = if bucket.lower_to(target, now) {
            let to = bucket.available(now);
            self.events.push_back(Event::Lowered { dimension, from, to });
            FoldOutcome::Lowered
        } else {
            FoldOutcome::Unchanged
        };
        self.reported(dimension, now);
        Ok(outcome)
    }

    /// What a provider's `remaining`, reported on the reply to `sent`, leaves for new
    /// grants: every other live reservation may not have been counted in it (granted and
    /// not yet sent, sent and not yet arrived, or arrived after the reported one: requests
    /// on a pool of connections arrive in any order), so it is subtracted.
    pub(super) fn remaining_for_us(
        &self,
        dimension: usize,
        sent: SendStamp,
        remaining: u64,
    ) -> i64 {
        let in_flight = self.granted_cost(dimension, |slot| slot.sent != sent.seq);
        i64::try_from(remaining)
            .unwrap_or(i64::MAX)
            .saturating_sub(i64::try_from(in_flight).unwrap_or(i64::MAX))
    }

    /// What the provider books in `dimension` per unit the client reserves, learned from
    /// the `remaining` it reports (1 until learned; never below 1, at most
    /// [`MAX_CHARGE_FACTOR`]). A provider that counts its own estimate of a request (a
    /// quarter of the body's characters plus `max_tokens`, say) books more than a client
    /// that estimates the prompt alone reserves; reserving this many times the estimate
    /// closes the gap, which reconciling to reported usage cannot (the provider books at
    /// admission, whatever it later reports).
    pub(crate) fn charge_factor(&self, dimension: usize) -> Option<f64> {
        let dim = self.dims.get(dimension)?;
        Some(dim.charge.factor.unwrap_or(1.0).clamp(1.0, MAX_CHARGE_FACTOR as f64))
    }

    /// Tells `dimension` the provider's limit (from a header): with it, the first report
    /// already says what the provider booked for the requests before it, since a provider
    /// starts full. (Learning sets it from each report; tests set it alone.)
    #[cfg(test)]
    pub(crate) fn observe_limit(
        &mut self,
        dimension: usize,
        limit: u64,
    ) -> Result<(), InvalidLimit> {
        self.dimension_mut(dimension)?.charge.limit = Some(limit);
        Ok(())
    }

    /// Learns the booked charge from two reports in send order, each for a request that
    /// left when nothing else was unsettled: what the provider took between them (the older
    /// remaining, plus what refilled, minus the newer) against what the sends between them
    /// reserved. With the provider's limit known, the first such report is compared with a
    /// full provider before the first send.
    pub(super) fn learn_charge(&mut self, dimension: usize, sent: SendStamp, remaining: u64) {
        if self.dims[dimension].charge.imprecise {
            return;
        }
        let Some(record) = self.books.send(sent.seq, dimension) else {
            return;
        };
        let last = self.dims[dimension].charge.last;
        if last.is_some_and(|(seq, _, _)| seq >= sent.seq) {
            return;
        }
        // Only a report whose request left when nothing else was unsettled counts: every
        // request before it was processed before it, so nothing sent earlier can still be
        // charged after it and read as taken in a later interval. (Replies out of order
        // otherwise bias the reading up, by as much as a burst's worth.)
        if record.unsettled_others != 0 {
            return;
        }
        let here = Some((sent.seq, record.at, remaining));
        let limit = self.dims[dimension].charge.limit;
        let (reserved, at, before, seeded) = match (last, limit, self.books.first_send()) {
            (Some((seq, at, before)), _, _) => {
                match self.books.cost_between(seq, sent.seq, dimension) {
                    Some(reserved) => (reserved, at, before, false),
                    // The older report's sends are no longer on record: start afresh here.
                    None => {
                        self.dims[dimension].charge.last = here;
                        return;
                    }
                }
            }
            // The first report against a provider that said its limit: it started full,
            // and a full provider's refill is wasted, so nothing refilled counts.
            (None, Some(limit), Some((first, _))) => {
                let Some(reserved) = self.books.cost_from(first, sent.seq, dimension) else {
                    return;
                };
                (reserved, record.at, limit, true)
            }
            (None, _, _) => {
                self.dims[dimension].charge.last = here;
                return;
            }
        };
        let dim = &mut self.dims[dimension];
        let refilled = dim.bucket.rate().permits_over(record.at.saturating_duration_since(at));
        // Signed: replies out of order make single intervals read high or low, and only
        // the sum over consecutive intervals telescopes to the truth.
        let taken = i128::from(before) + i128::from(refilled) - i128::from(remaining);
        // A provider that may have been full wasted refill, which would read as taken:
        // the chain of intervals starts afresh after it. Its limit, when not told, is taken
        // to be no more than this dimension's capacity.
        let full_at = dim.charge.limit.unwrap_or(dim.bucket.capacity());
        let maybe_full = !seeded && before.saturating_add(refilled) >= full_at;
        if maybe_full {
            dim.charge.last = here;
            return;
        }
        // Nothing reserved in between yet: the interval is merged into the next one.
        if reserved == 0 {
            return;
        }
        dim.charge.last = here;
        // `reserved` is the callers' own estimates, not the costs a learned factor raised:
        // the factor does not learn itself away.
        let estimated = reserved as f64;
        // Totals, not a mean of ratios: a long interval weighs more than a short one, and
        // intervals read high and low cancel.
        let charge = &mut dim.charge;
        charge.taken = 0.95 * charge.taken + taken as f64;
        charge.reserved = 0.95 * charge.reserved + estimated;
        if charge.reserved > 0.0 {
            let factor = (charge.taken / charge.reserved).clamp(0.25, MAX_CHARGE_FACTOR as f64);
            charge.factor = Some(factor);
            self.charging = true;
        }
    }

    /// Hands the books of `dimension` back to the client: commits and releases move its
    /// level again (for when the provider turns out not to be a continuous bucket).
    pub(crate) fn stop_sync(&mut self, dimension: usize) -> Result<(), InvalidLimit> {
        self.dimension_mut(dimension)?.ledger = false;
        Ok(())
    }
}
