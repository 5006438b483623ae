//! The client's copy of a provider's books: what was granted, what settled, and when each
//! request left.
//!
//! A provider's reported "remaining" counts the requests it processed before the one that
//! produced the report, and the client cannot see that order: on a pool of connections a
//! request sent earlier may arrive later. What it can see is which reservations had already
//! ended when a request was sent: those were processed before it, for certain. The books
//! keep running per-dimension totals of costs granted and settled, and a record per send
//! with the settled total at that moment, so that
//! `granted now - settled at the send - the request's own cost` is everything the report
//! may not yet count. That is exact bookkeeping, with no scan of the live reservations.

use std::collections::VecDeque;

use std::time::Duration;

use crate::ids::SendStamp;
use crate::time::Instant;

/// Sends kept beyond four per granted reservation: a reply is usually folded as soon as its
/// reservation ends, so only a short history is ever looked up.
const SPARE_RECORDS: usize = 256;

/// Words per dimension in each send record (see [`Books::marks`]).
const COLUMNS: usize = 6;

/// Running totals and per-send records (see the module docs).
#[derive(Clone, Debug)]
pub(crate) struct Books {
    dims: usize,
    /// Whether the books are kept: from the first send on (a limiter that never stamps a
    /// send never reads them, and its grants and commits skip them).
    open: bool,
    /// Per dimension, the cost of every reservation ever granted (wrapping).
    granted: Vec<u64>,
    /// Per dimension, the cost of every granted reservation that has ended (wrapping).
    settled: Vec<u64>,
    /// Whether any reply has said by when its request was counted (until one does,
    /// [`Books::counted_before`] has nothing to find).
    told: bool,
    /// The send sequence of `sent_at[0]`.
    first_seq: u64,
    /// When each recorded send left, oldest first; sequences are contiguous.
    sent_at: VecDeque<Instant>,
    /// Per recorded send, `COLUMNS * dims` words: the settled totals at the send, the cost
    /// of the reservation it paid for (zero for a send without one), what each window
    /// guard had held in all by then (zero without one), the caller's own estimate of
    /// the reservation (its cost before a learned charge raised it), by when the provider
    /// had counted the request (in nanoseconds; [`UNKNOWN`] until its reply), and how
    /// many sends had been stamped when its reservation ended ([`UNKNOWN`] while it
    /// lives).
    marks: Words,
    /// The next send's sequence number.
    next_seq: u64,
    /// The longest a granted request waited to be sent (from its grant to its stamp).
    send_delay: Duration,
}

/// A queue of words kept in one `Vec`: pushed at the back as whole slices, dropped from the
/// front by moving a start index, and compacted once half of it is dropped (a `VecDeque`
/// pays for its wrap-around on every word).
#[derive(Clone, Debug, Default)]
struct Words {
    words: Vec<u64>,
    start: usize,
}

impl Words {
    fn extend(&mut self, words: impl IntoIterator<Item = u64>) {
        self.words.extend(words);
    }

    fn extend_from_slice(&mut self, words: &[u64]) {
        self.words.extend_from_slice(words);
    }

    /// Sets the word at `index`.
    fn set(&mut self, index: usize, value: u64) {
        self.words[self.start + index] = value;
    }

    /// Drops the `n` oldest words.
    fn drop_front(&mut self, n: usize) {
        self.start = (self.start + n).min(self.words.len());
        if self.start * 2 >= self.words.len() {
            self.words.drain(..self.start);
            self.start = 0;
        }
    }
}

impl std::ops::Index<usize> for Words {
    type Output = u64;

    fn index(&self, index: usize) -> &u64 {
        &self.words[self.start + index]
    }
}

/// What the books know about one send.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SendRecord {
    /// When the request left.
    pub(crate) at: Instant,
    /// The cost, in the dimension asked about, of every other reservation granted so far
    /// that had not ended when the request left: the provider may have processed any of
    /// them after it.
    pub(crate) unsettled_others: u64,
    /// What the dimension's window guard had held in all when the request left.
    pub(crate) guard_held: u64,
    /// The cost, in the dimension asked about, of the reservation the send paid for (zero
    /// for a send without one).
    pub(crate) own: u64,
    /// The settled total (see [`Books::settled_total`]) when the request left.
    pub(crate) settled_then: u64,
}

/// Column offsets within a send record's words, in dimensions.
const SETTLED: usize = 0;
const OWN: usize = 1;
const GUARD: usize = 2;
const ESTIMATE: usize = 3;
const COUNTED_BY: usize = 4;
const ENDED: usize = 5;

/// A departure or an end not known yet.
const UNKNOWN: u64 = u64::MAX;

/// How far back [`Books::counted_before`] looks: a reply is usually folded soon after
/// the sends around it, and an older one is left uncounted (the safe side).
const LOOK_BACK: usize = 256;

impl Books {
    pub(crate) fn new(dims: usize) -> Books {
        Books {
            dims,
            open: false,
            granted: vec![0; dims],
            settled: vec![0; dims],
            told: false,

            first_seq: 0,
            sent_at: VecDeque::new(),
            marks: Words::default(),
            next_seq: 0,
            send_delay: Duration::ZERO,
        }
    }

    /// Whether the books are kept yet.
    #[inline]
    pub(crate) fn is_open(&self) -> bool {
        self.open
    }

    /// Starts keeping the books, with `live` (one cost vector per granted reservation
    /// not yet ended) as what is granted and unsettled so far.
    pub(crate) fn open<'a>(&mut self, live: impl Iterator<Item = &'a [u64]>) {
        self.open = true;
        for cost in live {
            self.grant(cost);
        }
    }

    /// A reservation of `cost` was granted.
    #[inline]
    pub(crate) fn grant(&mut self, cost: &[u64]) {
        if !self.open {
            return;
        }
        for (total, &c) in self.granted.iter_mut().zip(cost) {
            *total = total.wrapping_add(c);
        }
    }

    /// A granted reservation of `cost` ended (committed, released or cancelled), after
    /// its request was sent with stamp `sent`, or before it was sent (`None`).
    #[inline]
    pub(crate) fn settle(&mut self, cost: &[u64], sent: Option<u64>) {
        if !self.open {
            return;
        }
        for (total, &c) in self.settled.iter_mut().zip(cost) {
            *total = total.wrapping_add(c);
        }
        if let Some(index) = sent.and_then(|seq| self.index(seq)) {
            let stamped = self.first_seq + self.sent_at.len() as u64;
            self.mark_all(index, ENDED, stamped);
        }
    }

    /// Takes the next send's sequence number, for a send at `now` whose reservation was
    /// granted at `granted_at` (if it has one); the books open at the first send, with
    /// `live` as what is granted so far.
    pub(crate) fn next_send<'a>(
        &mut self,
        granted_at: Option<Instant>,
        now: Instant,
        live: impl Iterator<Item = &'a [u64]>,
    ) -> u64 {
        if !self.open {
            self.open(live);
        }
        if let Some(granted_at) = granted_at {
            self.send_delay = self.send_delay.max(now.saturating_duration_since(granted_at));
        }
        self.next_seq += 1;
        self.next_seq - 1
    }

    /// The sequence number the next send will take.
    pub(crate) fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// The longest a granted request waited to be sent so far.
    pub(crate) fn send_delay(&self) -> Duration {
        self.send_delay
    }

    /// Notes by when the provider had counted the request stamped `sent`: what its reply
    /// said ([`SendStamp::counted_by`], at most `now`), or else `now`. A bound before the
    /// send cannot be true and is not believed.
    pub(crate) fn note_counted(&mut self, sent: SendStamp, now: Instant) {
        if let Some(stamped) = self.sent_at(sent.seq) {
            let told = sent.counted_at_latest().filter(|&at| at >= stamped);
            let at = told.map_or(now, |at| at.min(now));
            self.count_by(sent.seq, at, told.is_some());
        }
    }

    /// The provider had counted the request stamped `seq` by `at`, as its reply said
    /// (`told`) or as its arrival shows.
    pub(crate) fn count_by(&mut self, seq: u64, at: Instant, told: bool) {
        self.told |= told;
        if let Some(index) = self.index(seq) {
            self.mark_all(index, COUNTED_BY, at.as_nanos());
        }
    }

    /// Where send `seq`'s record is, if it is still kept.
    fn index(&self, seq: u64) -> Option<usize> {
        let index = usize::try_from(seq.checked_sub(self.first_seq)?).ok()?;
        (index < self.sent_at.len()).then_some(index)
    }

    /// Sets `column` of record `index` to `value` in every dimension.
    fn mark_all(&mut self, index: usize, column: usize, value: u64) {
        let base = index * COLUMNS * self.dims + column * self.dims;
        for d in 0..self.dims {
            self.marks.set(base + d, value);
        }
    }

    /// The word at `column` of record `index`, in `dimension`.
    fn mark(&self, index: usize, column: usize, dimension: usize) -> u64 {
        self.marks[index * COLUMNS * self.dims + column * self.dims + dimension]
    }

    /// Records send `seq` (the next in sequence) leaving at `at` for a reservation of
    /// `cost` (`None` for a send without one), with what each dimension's window guard
    /// has held in all (`guard_held`, one per dimension), keeping at least `keep` older
    /// records.
    pub(crate) fn record_send(
        &mut self,
        seq: u64,
        at: Instant,
        cost: Option<(&[u64], &[u64])>,
        guard_held: impl Iterator<Item = u64>,
        keep: usize,
    ) {
        if self.sent_at.is_empty() {
            self.first_seq = seq;
        }
        debug_assert_eq!(self.first_seq + self.sent_at.len() as u64, seq);
        self.sent_at.push_back(at);
        self.marks.extend_from_slice(&self.settled);
        match cost {
            Some((cost, _)) => self.marks.extend_from_slice(cost),
            None => self.marks.extend(std::iter::repeat_n(0, self.dims)),
        }
        self.marks.extend(guard_held.take(self.dims));
        match cost {
            Some((_, estimate)) => self.marks.extend_from_slice(estimate),
            None => self.marks.extend(std::iter::repeat_n(0, self.dims)),
        }
        self.marks.extend(std::iter::repeat_n(UNKNOWN, (COLUMNS - COUNTED_BY) * self.dims));
        let keep = keep.saturating_mul(4).saturating_add(SPARE_RECORDS);
        while self.sent_at.len() > keep {
            self.sent_at.pop_front();
            self.marks.drop_front(COLUMNS * self.dims);
            self.first_seq += 1;
        }
    }

    /// The cost, in `dimension`, of every granted reservation that has ended (wrapping):
    /// the difference between two readings is what ended in between.
    pub(crate) fn settled_total(&self, dimension: usize) -> u64 {
        self.settled[dimension]
    }

    /// The cost, in `dimension`, of every reservation granted since the books opened (at the
    /// first send), ended or not.
    pub(crate) fn granted_total(&self, dimension: usize) -> u64 {
        self.granted[dimension]
    }

    /// The cost, in `dimension`, of every granted reservation that has not ended.
    pub(crate) fn unsettled(&self, dimension: usize) -> u64 {
        self.granted[dimension].wrapping_sub(self.settled[dimension])
    }

    /// The first send on record and when it left, if any.
    pub(crate) fn first_send(&self) -> Option<(u64, Instant)> {
        Some((self.first_seq, *self.sent_at.front()?))
    }

    /// The summed estimate, in `dimension`, of the reservations the sends after `after` up
    /// to `upto` paid for (what the caller reserved, before any learned charge raised it);
    /// `None` if any of those records is gone.
    pub(crate) fn cost_between(&self, after: u64, upto: u64, dimension: usize) -> Option<u64> {
        self.cost_from(after.checked_add(1)?, upto, dimension)
    }

    /// [`Books::cost_between`] from send `from` on, inclusive.
    pub(crate) fn cost_from(&self, from: u64, upto: u64, dimension: usize) -> Option<u64> {
        let first = usize::try_from(from.checked_sub(self.first_seq)?).ok()?;
        let last = usize::try_from(upto.checked_sub(self.first_seq)?).ok()?;
        if last >= self.sent_at.len() || first > last {
            return None;
        }
        Some(
            (first..=last)
                .map(|index| {
                    self.marks[index * COLUMNS * self.dims + ESTIMATE * self.dims + dimension]
                })
                .fold(0u64, u64::saturating_add),
        )
    }

    /// What the books know about send `seq` in `dimension`; `None` if that record is gone
    /// (or the books are closed).
    /// When the request stamped `seq` was sent, if it is still on record.
    pub(crate) fn sent_at(&self, seq: u64) -> Option<Instant> {
        let index = usize::try_from(seq.checked_sub(self.first_seq)?).ok()?;
        self.sent_at.get(index).copied()
    }

    pub(crate) fn send(&self, seq: u64, dimension: usize) -> Option<SendRecord> {
        if dimension >= self.dims {
            return None;
        }
        let index = usize::try_from(seq.checked_sub(self.first_seq)?).ok()?;
        let at = *self.sent_at.get(index)?;
        let base = index * COLUMNS * self.dims;
        let settled_then = self.marks[base + SETTLED * self.dims + dimension];
        let own = self.marks[base + OWN * self.dims + dimension];
        let guard_held = self.marks[base + GUARD * self.dims + dimension];
        let unsettled_others = self.granted[dimension].wrapping_sub(settled_then).wrapping_sub(own);
        Some(SendRecord { at, unsettled_others, guard_held, own, settled_then })
    }

    /// By when the provider had counted send `seq`'s request, once its reply is in.
    pub(crate) fn counted_by(&self, seq: u64) -> Option<Instant> {
        let at = self.mark(self.index(seq)?, COUNTED_BY, 0);
        (at != UNKNOWN).then(|| Instant::from_nanos(at))
    }

    /// Of the reservations other than its own that were live when send `seq` left (at
    /// `sent`), the cost in `dimension` of those the provider had surely counted by then:
    /// their replies are in and say they were counted before `sent`. Among the
    /// [`LOOK_BACK`] sends before `seq`.
    pub(crate) fn counted_before(&self, seq: u64, sent: Instant, dimension: usize) -> u64 {
        // Until a reply says, a request's bound is when its report was folded, which for a
        // whole reply is when its reservation ended: only a stream folded at its head and
        // still open could be found, not worth a scan per report.
        let Some(index) = self.index(seq).filter(|_| self.told) else {
            return 0;
        };
        (index.saturating_sub(LOOK_BACK)..index)
            .filter(|&j| {
                let ended = self.mark(j, ENDED, dimension);
                // Ended after `seq` was stamped: live then, and its reply is in.
                ended != UNKNOWN
                    && ended > seq
                    && self.mark(j, COUNTED_BY, dimension) < sent.as_nanos()
            })
            .map(|j| self.mark(j, OWN, dimension))
            .fold(0u64, u64::saturating_add)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_ended_before_the_send_counts_as_processed() {
        let mut books = Books::new(1);
        books.open(std::iter::empty());
        books.grant(&[10]); // a: ends before the send below
        books.grant(&[20]); // b: still live at the send
        books.settle(&[10], None);
        books.grant(&[5]); // the request itself
        books.record_send(0, Instant::from_millis(7), Some((&[5], &[5])), [3].into_iter(), 0);
        books.settle(&[20], Some(0)); // b ends after the send: it may follow in the provider's order
        books.grant(&[40]); // c: granted after the send
        let record = books.send(0, 0).expect("recorded");
        assert_eq!(record.at, Instant::from_millis(7));
        assert_eq!(record.unsettled_others, 20 + 40);
        assert_eq!(record.guard_held, 3);
        assert!(books.send(1, 0).is_none());
    }

    #[test]
    fn what_was_counted_before_a_send_is_what_ended_since_and_says_so() {
        let mut books = Books::new(1);
        books.open(std::iter::empty());
        let ms = Instant::from_millis;
        let send = |books: &mut Books, seq, at, cost: u64| {
            books.grant(&[cost]);
            books.record_send(seq, ms(at), Some((&[cost], &[cost])), [0].into_iter(), 0);
        };
        send(&mut books, 0, 0, 10); // a: ends before d is sent
        send(&mut books, 1, 1, 20); // b: counted at 2, ends after d is sent
        send(&mut books, 2, 2, 40); // c: counted at 6
        books.count_by(0, ms(1), true);
        books.settle(&[10], Some(0));
        send(&mut books, 3, 5, 7); // d
        books.count_by(1, ms(2), true);
        books.settle(&[20], Some(1));
        books.count_by(2, ms(6), true);
        // b was counted before d left and ended since. a ended before d left (the floor
        // already leaves it out); c's reply is in, but it was counted after d left.
        assert_eq!(books.counted_before(3, ms(5), 0), 20);
        books.settle(&[40], Some(2));
        assert_eq!(books.counted_before(3, ms(5), 0), 20);
        // Not before a send that left when b was counted.
        assert_eq!(books.counted_before(3, ms(2), 0), 0);
        assert_eq!(books.counted_by(1), Some(ms(2)));
        assert_eq!(books.counted_by(3), None);
        assert_eq!(books.counted_before(9, ms(5), 0), 0, "no such send");
    }

    #[test]
    fn books_opened_late_count_what_is_live_then() {
        let mut books = Books::new(1);
        books.grant(&[7]); // before the books open: skipped
        books.open([&[7u64][..], &[9u64][..]].into_iter());
        books.settle(&[7], None);
        books.record_send(0, Instant::ZERO, None, [0].into_iter(), 0);
        assert_eq!(books.send(0, 0).expect("recorded").unsettled_others, 9);
        assert_eq!(books.unsettled(0), 9);
    }

    #[test]
    fn old_records_are_dropped_beyond_what_is_kept() {
        let mut books = Books::new(2);
        books.open(std::iter::empty());
        for seq in 0..(SPARE_RECORDS as u64 + 10) {
            books.record_send(seq, Instant::ZERO, None, [0, 0].into_iter(), 0);
        }
        assert!(books.send(0, 1).is_none());
        assert!(books.send(10, 1).is_some());
        assert!(books.send(SPARE_RECORDS as u64 + 9, 0).is_some());
    }
}
