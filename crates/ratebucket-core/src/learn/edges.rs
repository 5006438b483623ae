//! A provider that sends no reset: counted blind, and its fixed windows' edges found.

use std::collections::VecDeque;
use std::time::Duration;

use super::{Adjust, Plan};
use crate::time::Instant;

/// Reports kept to find a fixed window's edges.
const SEEN: usize = 256;

/// Contradictions after which the provider is taken not to count in fixed windows of the
/// policy's length.
const MAX_CONFLICTS: u32 = 3;

/// One blind report: when its request left, when the reply came, what remained, and what
/// the request cost.
#[derive(Clone, Copy, Debug)]
struct Seen {
    sent: Instant,
    answered: Instant,
    remaining: u64,
    cost: u64,
}

/// Finds where a provider's fixed windows begin from `remaining` that jumps back up.
///
/// Within a fixed window `remaining` only falls. So a report that says more remains than an
/// earlier one did — earlier for certain: its reply came before this request left — proves
/// an edge between the earlier request's send and this reply, provided no other model
/// explains the rise: a bucket refilling at the limit per window could not have refilled
/// that much in between, and a trailing count (a sliding log) would still count what this
/// client sent within a window before, answered before this request left. Each proof is an
/// interval; intervals a whole number of windows apart are intersected. Contradicting
/// intervals (a provider that is not a fixed window of this length) make the finder give
/// up.
///
/// Before any proof, the edges may be supposed where the wall clock's windows turn (a
/// minute's at :00): most providers that count in fixed windows align them so. The
/// supposition is tested by what follows: a proof that meets it confirms it, one that does
/// not replaces it, and a throttle while it stands refutes it. It is made once.
#[derive(Clone, Debug, Default)]
pub(super) struct EdgeFinder {
    seen: VecDeque<Seen>,
    /// The earliest and latest instant of one edge.
    pub(super) edge: Option<(Instant, Instant)>,
    conflicts: u32,
    /// Whether `edge` is the clock's supposition, not yet confirmed by a proof.
    supposed: bool,
    /// Whether the clock's edges were ever supposed (they are only once).
    tried: bool,
    /// While supposed: from when requests go one at a time, each reply a probe of the
    /// supposed edge.
    probe: Option<Instant>,
}

/// How much later than the clock's turn a supposed edge is taken to be, as a share of the
/// window (at most a second): room for the provider's clock to lag the client's.
const CLOCK_SLACK: u32 = 100;

impl EdgeFinder {
    /// Feeds a blind report (`own_limit`: the limit is the provider's own, not a share below
    /// it) to the finder; an edge found (or a better estimate of it)
    /// goes to the guard, and the level rises to what the provider says remains in the
    /// window that began. Until an edge is found, a report that says what the wall clock
    /// read (`clock`) puts the edges where the clock's windows turn (see
    /// [`EdgeFinder::suppose`]); a throttle while that hypothesis stands refutes it.
    pub(super) fn find(
        &mut self,
        plan: &mut Plan<'_>,
        (window, own_limit): (Duration, bool),
        (limit, remaining): (u64, u64),
        clock: Option<Duration>,
    ) {
        let Some((sent, cost)) = plan.view.send else {
            return;
        };
        if plan.view.throttled && self.refute() {
            plan.push(Adjust::Probe(None));
        }
        let seen = Seen { sent, answered: plan.view.now, remaining, cost };
        let supposed = self.supposed;
        if let Some(edges) = self.observe(window, limit, seen) {
            if supposed {
                // Confirmed, or replaced by a proof: the probes end.
                plan.push(Adjust::Probe(None));
            }
            plan.push(Adjust::Edges { edges, own_limit });
            if edges.is_some() {
                plan.push(Adjust::Adopt(remaining));
            }
        } else if let Some(edge) = clock.and_then(|c| self.suppose(window, plan.view.now, c)) {
            // Not given to the guard until a probe confirms it.
            let probe = next_occurrence(edge.1, plan.view.now, window);
            self.probe = Some(probe);
            plan.push(Adjust::Probe(Some(probe)));
        } else if let (true, Some(edge), Some(probe)) = (self.supposed, self.edge, self.probe)
            && sent >= probe
        {
            // A probe that neither confirmed nor refuted the supposed edge (nothing was
            // spent before it): the next edge is probed again.
            let probe = next_occurrence(edge.1, plan.view.now, window);
            self.probe = Some(probe);
            plan.push(Adjust::Probe(Some(probe)));
        }
    }

    /// Supposes the edges of windows of `window` aligned to the wall clock, which read
    /// `clock` (since the UNIX epoch) at `now`: returns them, unless an edge is already
    /// known, the supposition was made before, or the finder has given up.
    fn suppose(
        &mut self,
        window: Duration,
        now: Instant,
        clock: Duration,
    ) -> Option<(Instant, Instant)> {
        if self.edge.is_some() || self.tried || self.conflicts >= MAX_CONFLICTS {
            return None;
        }
        let length = window.as_nanos();
        if length == 0 {
            return None;
        }
        self.tried = true;
        // How far into one of the clock's windows `now` is; the edge that began it, or
        // (early on the client's own clock) the next one.
        let into = u64::try_from(clock.as_nanos() % length).ok()?;
        let earliest = match now.as_nanos().checked_sub(into) {
            Some(nanos) => Instant::from_nanos(nanos),
            None => now + window.saturating_sub(Duration::from_nanos(into)),
        };
        let slack = (window / CLOCK_SLACK).min(Duration::from_secs(1));
        let edge = (earliest, earliest + slack);
        self.edge = Some(edge);
        self.supposed = true;
        Some(edge)
    }

    /// The edge, once proven (a supposed one is not).
    pub(super) fn proven(&self) -> Option<(Instant, Instant)> {
        self.edge.filter(|_| !self.supposed)
    }

    /// A throttle came: a supposed edge is refuted (`true`, and the finder starts over
    /// from its proofs); a proven one stands.
    fn refute(&mut self) -> bool {
        if !self.supposed {
            return false;
        }
        self.supposed = false;
        self.edge = None;
        self.probe = None;
        true
    }

    /// Takes one report; returns the new estimate when it changed (`Some(None)`: given up).
    fn observe(
        &mut self,
        window: Duration,
        limit: u64,
        seen: Seen,
    ) -> Option<Option<(Instant, Instant)>> {
        if self.conflicts >= MAX_CONFLICTS {
            return None;
        }
        let horizon = seen.answered.saturating_sub(window);
        let per_second = limit as f64 / window.as_secs_f64();
        let mut counted_recently = 0u64;
        let mut before: Option<Instant> = None;
        for earlier in self.seen.iter().filter(|e| e.answered <= seen.sent) {
            if earlier.sent >= horizon {
                counted_recently = counted_recently.saturating_add(earlier.cost);
            }
            let span = seen.answered.saturating_duration_since(earlier.sent);
            let refill = (per_second * span.as_secs_f64()).ceil() as u64;
            if seen.remaining > earlier.remaining.saturating_add(refill).saturating_add(1) {
                before = before.max(Some(earlier.sent));
            }
        }
        self.seen.push_back(seen);
        if self.seen.len() > SEEN {
            self.seen.pop_front();
        }
        let earliest = before?;
        if seen.remaining.saturating_add(counted_recently) <= limit {
            // A trailing count would allow as much: no proof of an edge.
            return None;
        }
        let latest = seen.answered;
        if self.supposed
            && let Some(edge) = self.edge
            && next_occurrence(edge.0, earliest, window) <= latest
        {
            // The rise spans a supposed edge: confirmed, however long the interval (a
            // probe leaves a window after the spend it is compared with).
            self.supposed = false;
            return Some(Some(edge));
        }
        if latest.saturating_duration_since(earliest) > window / 4 {
            return None;
        }
        let supposed = std::mem::take(&mut self.supposed);
        let found = match self.edge {
            None => (earliest, latest),
            Some(known) => match intersect(known, (earliest, latest), window) {
                Some(both) => both,
                // A supposition is no evidence: the proof replaces it.
                None if supposed => (earliest, latest),
                None => {
                    self.conflicts += 1;
                    if self.conflicts >= MAX_CONFLICTS {
                        self.edge = None;
                        return Some(None);
                    }
                    (earliest, latest)
                }
            },
        };
        if self.edge == Some(found) {
            return None;
        }
        self.edge = Some(found);
        Some(Some(found))
    }
}

/// The first instant a whole number of `window`s from `anchor` that is not before `from`.
fn next_occurrence(anchor: Instant, from: Instant, window: Duration) -> Instant {
    let window = window.as_nanos().max(1);
    let (anchor, from) = (u128::from(anchor.as_nanos()), u128::from(from.as_nanos()));
    let next = if from <= anchor {
        anchor - (anchor - from) / window * window
    } else {
        anchor + (from - anchor).div_ceil(window) * window
    };
    Instant::from_nanos(u64::try_from(next).unwrap_or(u64::MAX))
}

/// The intersection of edge interval `known`, moved a whole number of windows to lie
/// nearest `new`, with `new`; `None` if they do not meet.
fn intersect(
    known: (Instant, Instant),
    new: (Instant, Instant),
    window: Duration,
) -> Option<(Instant, Instant)> {
    let window = i128::try_from(window.as_nanos()).ok()?;
    let nanos = |i: Instant| i128::from(i.as_nanos());
    let shift = ((nanos(new.0) - nanos(known.0)) as f64 / window as f64).round() as i128 * window;
    let earliest = (nanos(known.0) + shift).max(nanos(new.0));
    let latest = (nanos(known.1) + shift).min(nanos(new.1));
    if earliest > latest {
        return None;
    }
    let instant = |n: i128| Instant::from_nanos(u64::try_from(n).unwrap_or(0));
    Some((instant(earliest), instant(latest)))
}
