//! What the provider's reports say of one dimension ([`Provider`]): its level read
//! against them (synced, adopted, lowered), and the charge it books per unit reserved.

use std::collections::VecDeque;

use super::MAX_CHARGE_FACTOR;
use super::usage::Usage;
use crate::arbiter::inspect::Reported;
use crate::arbiter::tickets::{NOT_SENT, Tickets};
use crate::books::Books;
use crate::bucket::TokenBucket;
use crate::event::Event;
use crate::ids::SendStamp;
use crate::time::Instant;

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

/// What a report is read against: the books of sends and the live reservations.
#[derive(Clone, Copy)]
pub(crate) struct Ledger<'a> {
    /// What was granted, sent and settled.
    pub(crate) books: &'a Books,
    /// Every live reservation.
    pub(crate) tickets: &'a Tickets,
}

/// A level and where its changes are told: one dimension's bucket, what replies used, the
/// dimension's index and the arbiter's events.
pub(crate) struct Level<'a> {
    pub(crate) bucket: &'a mut TokenBucket,
    pub(crate) usage: &'a Usage,
    pub(crate) dimension: usize,
    pub(crate) events: &'a mut VecDeque<Event>,
}

/// What the provider's reports have told of one dimension.
#[derive(Clone, Debug, Default)]
pub(crate) struct Provider {
    /// Whether the provider keeps the books: after a sync, commits and releases no longer
    /// move the level, the next sync does.
    pub(crate) ledger: bool,
    /// The newest send sequence whose observation was applied.
    newest_observed: Option<u64>,
    /// Whether a report of the provider's was folded for it yet.
    pub(crate) reported: bool,
    /// What the provider last said of it, as read.
    pub(crate) last: Option<Reported>,
    /// What the provider books per unit the client reserves.
    pub(crate) charge: Charge,
}

/// The provider's booked charge against the client's reservations, learned from the
/// `remaining` it reports (see [`Provider::charge_factor`]).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Charge {
    /// The running estimate of booked / reserved; `None` until a sample came.
    pub(crate) factor: Option<f64>,
    /// What the provider took and what the client reserved over the intervals sampled,
    /// older ones fading.
    taken: f64,
    reserved: f64,
    /// The provider's limit, when it said: before the first send it had that much (a
    /// provider starts full), so the first report already tells what was booked.
    pub(crate) limit: Option<u64>,
    /// The newest report used: its send sequence, when it left, and the remaining.
    last: Option<(u64, Instant, u64)>,
    /// Whether the report being folded rounds its `remaining`: a rounded count says nothing
    /// of what one request was booked.
    pub(crate) imprecise: bool,
}

impl Provider {
    /// What the provider books per unit the client reserves, learned from the `remaining`
    /// it reports (1 until learned; never below 1, at most [`MAX_CHARGE_FACTOR`]). A
    /// provider that counts its own estimate of a request (a quarter of the body's
    /// characters plus `max_tokens`, say) books more than a client that estimates the
    /// prompt alone reserves; reserving this many times the estimate closes the gap, which
    /// reconciling to reported usage cannot (the provider books at admission).
    pub(crate) fn charge_factor(&self) -> f64 {
        self.charge.factor.unwrap_or(1.0).clamp(1.0, MAX_CHARGE_FACTOR as f64)
    }

    /// Reads a provider's `remaining` (which may stand for up to `slack` more: a count
    /// rounded to thousands), reported on the reply to the request stamped `sent`, as a
    /// bound on what is left for new grants, and moves the level within it. Use it only
    /// where the provider is known to refill continuously.
    ///
    /// The report counts the requests the provider processed before that one, an order the
    /// client cannot see. Two readings bracket the truth:
    ///
    /// - **Floor:** only the reservations that had ended before the request was sent were
    ///   surely counted; every other one granted since may still be charged. The remaining
    ///   minus all of them is safe, so a level below it is **raised** to it.
    /// - **Ceiling:** the provider can have no more than the remaining plus what refilled
    ///   since the request left, and the reservations granted but not yet sent are still
    ///   to come. A level above that is **lowered** to it. Requests that left after this one
    ///   are not subtracted: on a pool of connections they may have been counted first.
    ///
    /// Any number of reports, in any order, can be read this way, so none is stale. From
    /// the first exact sync on, the provider keeps the books for this dimension: commits
    /// and releases no longer move its level. A rounded count only bounds the client's own
    /// reckoning, the floor at the least it stands for and the ceiling at the most.
    pub(crate) fn sync(
        &mut self,
        level: Level<'_>,
        ledger: Ledger<'_>,
        sent: SendStamp,
        (remaining, slack): (u64, u64),
        now: Instant,
    ) -> FoldOutcome {
        let Level { bucket, usage, dimension, events } = level;
        if bucket.is_funded() {
            // A funded share is not the provider's whole bucket: its report only lowers.
            let level = Level { bucket, usage, dimension, events };
            return self.lower(level, ledger, sent, remaining, now);
        }
        self.learn_charge(bucket, ledger.books, dimension, sent, remaining);
        let first = slack == 0 && !std::mem::replace(&mut self.ledger, true);
        let remaining = i128::from(remaining);
        let to_come = ledger.tickets.granted_cost(dimension, |slot| slot.sent == NOT_SENT);
        let books = ledger.books;
        let record = books.send(sent.seq, dimension);
        // By when the provider had counted it, if the reply said (else the report's fold).
        let counted_by = books.counted_by(sent.seq);
        let limit = self.charge.limit;
        // Every other reservation not counted before this request was sent (it may be
        // charged after it), at what they will use together.
        let uncounted = record.map(|r| {
            let counted = books.counted_before(sent.seq, r.at, dimension);
            let held = r.unsettled_others.saturating_sub(counted);
            pooled(usage, &self.charge, held)
        });
        let refilled =
            record.map_or(0, |r| bucket.rate().permits_over(now.saturating_duration_since(r.at)));
        // The most the provider can have: its kindest reading, and the refill since.
        let ceiling = remaining + i128::from(slack) + i128::from(refilled) - i128::from(to_come);
        // A provider whose bucket is full wastes its refill while our requests are on their
        // way; the client's capacity leaves room for that only if what it holds plus what
        // is in flight stays within it.
        let headroom = i128::from(bucket.capacity()) - i128::from(books.unsettled(dimension));
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
        self.reported = true;
        let outcome = if to > from {
            FoldOutcome::Raised
        } else if to < from {
            FoldOutcome::Lowered
        } else {
            return FoldOutcome::Unchanged;
        };
        events.push_back(Event::Synced { dimension, from, to });
        outcome
    }

    /// Raises the level to what a provider's `remaining`, reported on the reply to the
    /// request stamped `sent`, leaves for new grants (every other live reservation
    /// subtracted), never above the capacity. Only ever raises, and does not hand the books
    /// to the provider: for a limit just learned, when the client's own reckoning started
    /// from nothing, so a short batch against a full provider takes its burst. A funded
    /// dimension is left unchanged: what the provider has left is shared.
    pub(crate) fn adopt(
        &mut self,
        level: Level<'_>,
        ledger: Ledger<'_>,
        sent: SendStamp,
        remaining: u64,
        now: Instant,
    ) -> FoldOutcome {
        if level.bucket.is_funded() {
            return FoldOutcome::Unchanged;
        }
        // What this report says was booked applies to the burst it opens.
        self.move_level(level, ledger, (sent, remaining), true, now)
    }

    /// Lowers the level to a provider's `remaining`, observed on the reply to the request
    /// stamped `sent`, minus what every other live reservation holds (the provider may not
    /// have counted it). Only ever lowers; an observation older than one already applied
    /// is ignored.
    pub(crate) fn lower(
        &mut self,
        level: Level<'_>,
        ledger: Ledger<'_>,
        sent: SendStamp,
        remaining: u64,
        now: Instant,
    ) -> FoldOutcome {
        if self.newest_observed.is_some_and(|newest| sent.seq < newest) {
            return FoldOutcome::Stale;
        }
        self.newest_observed = Some(sent.seq);
        self.move_level(level, ledger, (sent, remaining), false, now)
    }

    /// Learns the booked charge from a report of `remaining` on the reply to `sent`, then
    /// raises (`up`) or lowers the level to what that leaves for this client, saying so.
    fn move_level(
        &mut self,
        level: Level<'_>,
        ledger: Ledger<'_>,
        (sent, remaining): (SendStamp, u64),
        up: bool,
        now: Instant,
    ) -> FoldOutcome {
        let dimension = level.dimension;
        self.learn_charge(level.bucket, ledger.books, dimension, sent, remaining);
        let target = remaining_for_us(ledger, dimension, sent, remaining);
        let from = level.bucket.available(now);
        self.reported = true;
        let moved = if up {
            level.bucket.raise_to(target, now)
        } else {
            level.bucket.lower_to(target, now)
        };
        if !moved {
            return FoldOutcome::Unchanged;
        }
        let to = level.bucket.available(now);
        if up {
            level.events.push_back(Event::Synced { dimension, from, to });
            FoldOutcome::Raised
        } else {
            level.events.push_back(Event::Lowered { dimension, from, to });
            FoldOutcome::Lowered
        }
    }

    /// Learns the booked charge from two reports in send order, each for a request that
    /// left when nothing else was unsettled: what the provider took between them (the older
    /// remaining, plus what refilled, minus the newer) against what the sends between them
    /// reserved. With the provider's limit known, the first such report is compared with a
    /// full provider before the first send.
    fn learn_charge(
        &mut self,
        bucket: &TokenBucket,
        books: &Books,
        dimension: usize,
        sent: SendStamp,
        remaining: u64,
    ) {
        let charge = &mut self.charge;
        if charge.imprecise {
            return;
        }
        let Some(record) = books.send(sent.seq, dimension) else {
            return;
        };
        if charge.last.is_some_and(|(seq, _, _)| seq >= sent.seq) {
            return;
        }
        // Only a report whose request left when nothing else was unsettled counts: every
        // request before it was processed before it. (Replies out of order otherwise bias
        // the reading up, by as much as a burst's worth.)
        if record.unsettled_others != 0 {
            return;
        }
        let here = Some((sent.seq, record.at, remaining));
        let (reserved, at, before, seeded) = match (charge.last, charge.limit, books.first_send()) {
            (Some((seq, at, before)), _, _) => match books.cost_between(seq, sent.seq, dimension) {
                Some(reserved) => (reserved, at, before, false),
                // The older report's sends are no longer on record: start afresh here.
                None => {
                    charge.last = here;
                    return;
                }
            },
            // The first report against a provider that said its limit: it started full,
            // and a full provider's refill is wasted, so nothing refilled counts.
            (None, Some(limit), Some((first, _))) => {
                let Some(reserved) = books.cost_from(first, sent.seq, dimension) else {
                    return;
                };
                (reserved, record.at, limit, true)
            }
            (None, _, _) => {
                charge.last = here;
                return;
            }
        };
        let refilled = bucket.rate().permits_over(record.at.saturating_duration_since(at));
        // Signed: replies out of order make single intervals read high or low, and only
        // the sum over consecutive intervals telescopes to the truth.
        let taken = i128::from(before) + i128::from(refilled) - i128::from(remaining);
        // A provider that may have been full wasted refill, which would read as taken:
        // the chain of intervals starts afresh after it.
        let full_at = charge.limit.unwrap_or(bucket.capacity());
        if !seeded && before.saturating_add(refilled) >= full_at {
            charge.last = here;
            return;
        }
        // Nothing reserved in between yet: the interval is merged into the next one.
        if reserved == 0 {
            return;
        }
        charge.last = here;
        // `reserved` is the callers' own estimates, not the costs a learned factor raised:
        // the factor does not learn itself away. Totals, not a mean of ratios.
        charge.taken = 0.95 * charge.taken + taken as f64;
        charge.reserved = 0.95 * charge.reserved + reserved as f64;
        if charge.reserved > 0.0 {
            let factor = (charge.taken / charge.reserved).clamp(0.25, MAX_CHARGE_FACTOR as f64);
            charge.factor = Some(factor);
        }
    }
}

/// The booked charge per unit reserved below which a provider is taken to charge what a
/// reply used, after it (see [`lowered`]).
const LOWER_BELOW: f64 = 0.9;

/// What a reservation is lowered to, per unit the caller reserved, when the provider's
/// reports show it books what replies use rather than what was reserved: the learned
/// booked charge clearly below one ([`LOWER_BELOW`]) and close to the mean usage of the
/// replies (so not a provider that books `max_tokens` at admission against a prompt
/// estimated long). Then the high ratio of usage ([`Usage::high`]); `None`: reservations
/// hold what the caller reserved.
pub(crate) fn lowered(usage: &Usage, charge: &Charge) -> Option<f64> {
    let factor = charge.factor?;
    let mean = usage.mean()?;
    let books_usage = factor < LOWER_BELOW && factor <= mean * 1.15 + 0.02;
    books_usage.then(|| usage.high().unwrap_or(1.0).max(factor).min(1.0))
}

/// What reservations holding `held` in all will use together: where reservations are
/// lowered, the pooled bound of the usage learned ([`Usage::pooled`]) instead of the sum
/// of each one's high quantile; else `held`.
fn pooled(usage: &Usage, charge: &Charge, held: u64) -> u64 {
    match lowered(usage, charge) {
        Some(ratio) => usage.pooled(held, ratio),
        None => held,
    }
}

/// What a provider's `remaining`, reported on the reply to `sent`, leaves for new
/// grants: every other live reservation may not have been counted in it (granted and not
/// yet sent, sent and not yet arrived, or arrived after the reported one), so it is
/// subtracted.
fn remaining_for_us(ledger: Ledger<'_>, dimension: usize, sent: SendStamp, remaining: u64) -> i64 {
    let in_flight = ledger.tickets.granted_cost(dimension, |slot| slot.sent != sent.seq);
    i64::try_from(remaining)
        .unwrap_or(i64::MAX)
        .saturating_sub(i64::try_from(in_flight).unwrap_or(i64::MAX))
}
