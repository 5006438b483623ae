//! Arbiter grants on a virtual clock: atomic across dimensions, FIFO, backfilling, and
//! levels that match an independent ledger.

use super::support;

use std::collections::HashMap;
use std::time::Duration;

use quickcheck::{Arbitrary, Gen, TestResult};
use ratebucket_core::{ArbiterConfig, Event, Instant, MAX_CHARGE_FACTOR, Ticket, TicketState};
use support::{Harness, check};

fn ms(n: u64) -> Instant {
    Instant::from_millis(n)
}
#[test]
fn a_waiter_holds_no_dimension_while_it_waits_for_another() {
    // 5 requests/s (burst 5), 100 tokens/s (burst 100).
    let mut h = Harness::two((5, 5), (100, 100), ArbiterConfig::default());
    let first = h.arbiter.reserve(&[1, 100], ms(0)).unwrap();
    assert_eq!(h.arbiter.state(first), Some(TicketState::Granted));
    let second = h.arbiter.reserve(&[1, 50], ms(0)).unwrap();
    assert_eq!(h.arbiter.state(second), Some(TicketState::Queued));
    h.drain();
    // Requests are plentiful, but none is held for the waiter.
    assert_eq!(h.arbiter.dimension(0, ms(0)).map(|d| d.level), Some(4.0));
    assert!(h.advance_to(ms(499)).is_empty());
    assert_eq!(h.arbiter.dimension(0, ms(499)).map(|d| d.level), Some(5.0));
    // Both dimensions are taken at the same instant.
    assert_eq!(h.advance_to(ms(500)), vec![(ms(500), second)]);
    assert_eq!(h.arbiter.dimension(0, ms(500)).map(|d| d.level), Some(4.0));
    assert_eq!(h.arbiter.dimension(1, ms(500)).map(|d| d.level), Some(0.0));
}

#[test]
fn two_limits_binding_alternately_never_deadlock() {
    // Requests bind for the cheap calls, tokens for the expensive ones.
    let mut h = Harness::two((2, 2), (100, 100), ArbiterConfig::default());
    let tickets: Vec<Ticket> = (0..40)
        .map(|i| {
            let cost = if i % 3 == 0 { [1, 90] } else { [1, 5] };
            h.arbiter.reserve(&cost, ms(0)).unwrap()
        })
        .collect();
    let grants = h.run_until_idle();
    assert_eq!(grants.len(), tickets.len());
    assert_eq!(h.arbiter.status().queued, 0);
}

#[derive(Clone, Debug)]
struct Costs(Vec<[u64; 2]>);

impl Arbitrary for Costs {
    fn arbitrary(g: &mut Gen) -> Costs {
        let n = usize::arbitrary(g) % 60 + 2;
        Costs((0..n).map(|_| [u64::arbitrary(g) % 4 + 1, u64::arbitrary(g) % 101]).collect())
    }
}

fn grants_in_arrival_order_without_backfilling(costs: Costs) -> bool {
    let mut h = Harness::two((3, 4), (50, 100), ArbiterConfig::default());
    let tickets: Vec<Ticket> =
        costs.0.iter().map(|c| h.arbiter.reserve(c, ms(0)).unwrap()).collect();
    let order: Vec<Ticket> = h.run_until_idle().into_iter().map(|(_, t)| t).collect();
    order == tickets
}

#[test]
fn without_backfilling_grants_follow_arrival_order() {
    check(200, 0x5eed_0002, grants_in_arrival_order_without_backfilling as fn(Costs) -> bool);
}

#[derive(Clone, Debug)]
enum Step {
    Reserve([u64; 2]),
    Advance(u64),
}

#[derive(Clone, Debug)]
struct Steps(Vec<Step>);

impl Arbitrary for Steps {
    fn arbitrary(g: &mut Gen) -> Steps {
        let n = usize::arbitrary(g) % 80 + 5;
        Steps(
            (0..n)
                .map(|_| {
                    if u8::arbitrary(g) % 3 == 0 {
                        Step::Advance(u64::arbitrary(g) % 700)
                    } else {
                        Step::Reserve([u64::arbitrary(g) % 4 + 1, u64::arbitrary(g) % 101])
                    }
                })
                .collect(),
        )
    }
}

/// With nothing refunded, the head's grant time is fixed by arithmetic; a backfilled
/// grant that pushed it later would show as a later `poll_timeout` for the same head.
fn backfilling_never_delays_the_head(steps: Steps) -> TestResult {
    let config = ArbiterConfig::default().with_backfill(true);
    let mut h = Harness::two((3, 4), (50, 100), config);
    let mut issued: Vec<Ticket> = Vec::new();
    let mut granted_at: HashMap<Ticket, Instant> = HashMap::new();
    for step in steps.0 {
        // The head is the earliest-issued ticket still queued.
        let head = issued.iter().copied().find(|t| !granted_at.contains_key(t));
        let head_ready = h.arbiter.poll_timeout();
        let grants = match step {
            Step::Reserve(cost) => {
                issued.push(h.arbiter.reserve(&cost, h.now).unwrap());
                h.drain()
            }
            Step::Advance(millis) => h.advance(Duration::from_millis(millis)),
        };
        for (at, t) in grants {
            granted_at.insert(t, at);
        }
        let (Some(head), Some(ready)) = (head, head_ready) else {
            continue;
        };
        let verdict = match granted_at.get(&head) {
            Some(&at) => at <= ready,
            None => h.arbiter.poll_timeout().is_some_and(|after| after <= ready),
        };
        if !verdict {
            return TestResult::error(format!(
                "head {head:?} was due at {ready:?} but a backfill pushed it later"
            ));
        }
    }
    TestResult::passed()
}

#[test]
fn a_backfilled_grant_never_delays_the_heads_grant_time() {
    check(300, 0x5eed_0003, backfilling_never_delays_the_head as fn(Steps) -> TestResult);
}

/// A big head waits for tokens; the small calls behind it need only requests.
fn head_of_line_makespan(backfill: bool) -> Instant {
    let config = ArbiterConfig::default().with_backfill(backfill);
    let mut h = Harness::two((2, 2), (100, 100), config);
    h.arbiter.reserve(&[1, 100], ms(0)).unwrap();
    h.arbiter.reserve(&[1, 100], ms(0)).unwrap();
    for _ in 0..4 {
        h.arbiter.reserve(&[1, 0], ms(0)).unwrap();
    }
    let grants = h.run_until_idle();
    assert_eq!(grants.len(), 6);
    grants.last().unwrap().0
}

#[test]
fn backfilling_raises_throughput_behind_a_blocked_head() {
    assert_eq!(head_of_line_makespan(false), ms(2500));
    assert_eq!(head_of_line_makespan(true), ms(2000));
}

#[derive(Clone, Debug)]
enum Act {
    Reserve([u64; 2]),
    Commit(usize, u64),
    Cancel(usize),
    Release(usize),
    Advance(u64),
}

#[derive(Clone, Debug)]
struct Acts(Vec<Act>);

impl Arbitrary for Acts {
    fn arbitrary(g: &mut Gen) -> Acts {
        let n = usize::arbitrary(g) % 150 + 5;
        Acts(
            (0..n)
                .map(|_| match u8::arbitrary(g) % 6 {
                    0 | 1 => Act::Reserve([u64::arbitrary(g) % 4 + 1, u64::arbitrary(g) % 101]),
                    2 => Act::Commit(usize::arbitrary(g), u64::arbitrary(g) % 250),
                    3 => Act::Cancel(usize::arbitrary(g)),
                    4 => Act::Release(usize::arbitrary(g)),
                    _ => Act::Advance(u64::arbitrary(g) % 400),
                })
                .collect(),
        )
    }
}

/// An independent ledger: levels in units of 1e-9 permits (rates are per second, so a
/// nanosecond refills `rate` units exactly).
struct Ledger {
    rate: [i128; 2],
    cap: [i128; 2],
    level: [i128; 2],
    at: Instant,
}

const UNIT: i128 = 1_000_000_000;

impl Ledger {
    fn refill(&mut self, to: Instant) {
        let dt = i128::from((to - self.at).as_nanos() as u64);
        for d in 0..2 {
            self.level[d] = (self.level[d] + self.rate[d] * dt).min(self.cap[d]);
        }
        self.at = self.at.max(to);
    }
    fn take(&mut self, d: usize, permits: u64) {
        self.level[d] -= i128::from(permits) * UNIT;
    }
    fn give(&mut self, d: usize, permits: u64) {
        self.level[d] = (self.level[d] + i128::from(permits) * UNIT).min(self.cap[d]);
    }
}

fn levels_match_the_ledger(acts: Acts) -> TestResult {
    let (rates, caps) = ([3u64, 50], [4u64, 100]);
    let mut h = Harness::two((rates[0], caps[0]), (rates[1], caps[1]), ArbiterConfig::default());
    let mut ledger = Ledger {
        rate: rates.map(i128::from),
        cap: caps.map(|c| i128::from(c) * UNIT),
        level: caps.map(|c| i128::from(c) * UNIT),
        at: Instant::ZERO,
    };
    let mut costs: HashMap<Ticket, [u64; 2]> = HashMap::new();
    let mut issued: Vec<Ticket> = Vec::new();
    let mut granted: Vec<Ticket> = Vec::new();
    let mut actuals: HashMap<Ticket, u64> = HashMap::new();
    let mut seen = 0;
    for act in acts.0 {
        match act {
            Act::Reserve(cost) => {
                let t = h.arbiter.reserve(&cost, h.now).unwrap();
                costs.insert(t, cost);
                issued.push(t);
            }
            Act::Commit(i, tokens) if !granted.is_empty() => {
                let t = granted.swap_remove(i % granted.len());
                h.arbiter.commit(t, &[costs[&t][0], tokens], h.now).unwrap();
                actuals.insert(t, tokens);
            }
            Act::Release(i) if !granted.is_empty() => {
                let t = granted.swap_remove(i % granted.len());
                h.arbiter.release(t, h.now).unwrap();
            }
            Act::Cancel(i) if !issued.is_empty() => {
                let t = issued.swap_remove(i % issued.len());
                h.arbiter.cancel(t, h.now);
                granted.retain(|g| *g != t);
            }
            Act::Advance(millis) => {
                h.advance(Duration::from_millis(millis));
            }
            _ => {}
        }
        h.drain();
        // Replay what the arbiter reported into the ledger.
        for (at, event) in &h.log[seen..] {
            ledger.refill(*at);
            match *event {
                Event::Granted { ticket, .. } => {
                    if !issued.contains(&ticket) {
                        return TestResult::error(format!("granted a withdrawn {ticket:?}"));
                    }
                    for (d, &cost) in costs[&ticket].iter().enumerate() {
                        ledger.take(d, cost);
                    }
                    granted.push(ticket);
                }
                Event::Committed { ticket } => {
                    let reserved = costs[&ticket];
                    // Trust is bounded: a dimension is charged at most four times its
                    // reservation, or its capacity.
                    let trusted = (reserved[1] * MAX_CHARGE_FACTOR).max(caps[1]);
                    let actual = [reserved[0], actuals[&ticket].min(trusted)];
                    for d in 0..2 {
                        if actual[d] < reserved[d] {
                            ledger.give(d, reserved[d] - actual[d]);
                        } else {
                            ledger.take(d, actual[d] - reserved[d]);
                        }
                    }
                }
                Event::Released { ticket } => {
                    for (d, &cost) in costs[&ticket].iter().enumerate() {
                        ledger.give(d, cost);
                    }
                }
                _ => {}
            }
        }
        seen = h.log.len();
        ledger.refill(h.now);
        for d in 0..2 {
            let expected = ledger.level[d] as f64 / UNIT as f64;
            let actual = h.arbiter.dimension(d, h.now).map(|d| d.level).unwrap();
            if actual != expected {
                return TestResult::error(format!(
                    "dimension {d} at {:?}: level {actual}, ledger says {expected}",
                    h.now
                ));
            }
        }
    }
    TestResult::passed()
}

#[test]
fn every_level_equals_the_ledger_after_reserve_commit_cancel_release() {
    check(300, 0x5eed_0004, levels_match_the_ledger as fn(Acts) -> TestResult);
}

#[test]
fn releasing_everything_leaks_nothing_and_mints_nothing() {
    let mut h = Harness::two((3, 4), (50, 100), ArbiterConfig::default());
    let tickets: Vec<Ticket> =
        (0..20).map(|_| h.arbiter.reserve(&[1, 30], ms(0)).unwrap()).collect();
    h.advance_to(ms(2000));
    for t in tickets {
        h.arbiter.cancel(t, h.now);
    }
    h.drain();
    assert_eq!(h.arbiter.status().queued, 0);
    h.advance_to(ms(60_000));
    assert_eq!(h.arbiter.dimension(0, h.now).map(|d| d.level), Some(4.0));
    assert_eq!(h.arbiter.dimension(1, h.now).map(|d| d.level), Some(100.0));
}

#[test]
fn a_lease_waits_only_on_time_until_something_needs_order() {
    let mut h = Harness::two((5, 5), (100, 100), ArbiterConfig::default());
    assert!(h.arbiter.status().lane_may_lease, "a fresh arbiter");
    let waiting =
        [h.arbiter.reserve(&[5, 1], ms(0)).unwrap(), h.arbiter.reserve(&[1, 1], ms(0)).unwrap()];
    assert_eq!(h.arbiter.state(waiting[1]), Some(TicketState::Queued));
    assert!(!h.arbiter.status().lane_may_lease, "a queue needs order");
    h.advance_to(ms(200));
    for ticket in waiting {
        h.arbiter.release(ticket, ms(200)).unwrap();
    }
    h.drain();
    assert!(h.arbiter.status().lane_may_lease, "the queue is gone");
    let _sent = h.arbiter.stamp_send(ms(200));
    assert!(
        !h.arbiter.status().lane_may_lease,
        "the provider's books are kept from the first send on"
    );
}
