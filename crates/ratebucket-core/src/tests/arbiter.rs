//! Arbiter behaviour on a virtual clock: atomic grants, FIFO, backfilling, accounting,
//! the gate, and bad input.

use super::support;
use ratebucket_core::Change;

use std::collections::HashMap;
use std::time::Duration;

use quickcheck::{Arbitrary, Gen, TestResult};
use ratebucket_core::{
    Adapt, Arbiter, ArbiterConfig, Event, FoldOutcome, GateConfig, Instant, InvalidLimit,
    MAX_CHARGE_FACTOR, QuotaReport, Rate, Refusal, Reply, Report, ReserveError, Settle, Ticket,
    TicketError, TicketState, TokenBucket,
};
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
        Costs(
            (0..n)
                .map(|_| [u64::arbitrary(g) % 4 + 1, u64::arbitrary(g) % 101])
                .collect(),
        )
    }
}

fn grants_in_arrival_order_without_backfilling(costs: Costs) -> bool {
    let mut h = Harness::two((3, 4), (50, 100), ArbiterConfig::default());
    let tickets: Vec<Ticket> = costs
        .0
        .iter()
        .map(|c| h.arbiter.reserve(c, ms(0)).unwrap())
        .collect();
    let order: Vec<Ticket> = h.run_until_idle().into_iter().map(|(_, t)| t).collect();
    order == tickets
}

#[test]
fn without_backfilling_grants_follow_arrival_order() {
    check(
        200,
        0x5eed_0002,
        grants_in_arrival_order_without_backfilling as fn(Costs) -> bool,
    );
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
    check(
        300,
        0x5eed_0003,
        backfilling_never_delays_the_head as fn(Steps) -> TestResult,
    );
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
    let mut h = Harness::two(
        (rates[0], caps[0]),
        (rates[1], caps[1]),
        ArbiterConfig::default(),
    );
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
    check(
        300,
        0x5eed_0004,
        levels_match_the_ledger as fn(Acts) -> TestResult,
    );
}

#[test]
fn releasing_everything_leaks_nothing_and_mints_nothing() {
    let mut h = Harness::two((3, 4), (50, 100), ArbiterConfig::default());
    let tickets: Vec<Ticket> = (0..20)
        .map(|_| h.arbiter.reserve(&[1, 30], ms(0)).unwrap())
        .collect();
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
fn a_cost_above_capacity_is_refused_at_once() {
    let mut h = Harness::two((3, 4), (50, 100), ArbiterConfig::default());
    assert_eq!(
        h.arbiter.reserve(&[1, 101], ms(0)),
        Err(ReserveError::CostExceedsCapacity {
            dimension: 1,
            cost: 101,
            capacity: 100
        })
    );
    assert_eq!(
        h.arbiter.reserve(&[1], ms(0)),
        Err(ReserveError::WrongDimensions {
            expected: 2,
            got: 1
        })
    );
    assert_eq!(h.arbiter.status().queued, 0);
    assert_eq!(h.arbiter.poll_timeout(), None, "nothing is left waiting");
}

#[test]
fn invalid_limits_are_constructor_errors() {
    let now = Instant::ZERO;
    assert_eq!(Rate::per_minute(0).unwrap_err(), InvalidLimit::ZeroRate);
    for bad in [0.0, -3.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        assert!(Rate::from_per_second_f64(bad).is_err(), "{bad} accepted");
    }
    let rate = Rate::per_second(1).unwrap();
    assert_eq!(
        TokenBucket::new(rate, 0, now).unwrap_err(),
        InvalidLimit::ZeroCapacity
    );
    assert!(Arbiter::new(Vec::new(), ArbiterConfig::default(), now).is_err());
    let mut bucket = TokenBucket::new(rate, 5, now).unwrap();
    assert_eq!(bucket.set_capacity(0, now), Err(InvalidLimit::ZeroCapacity));
    assert_eq!(bucket.capacity(), 5);
}

#[test]
fn time_going_backwards_neither_panics_nor_grants_extra() {
    let mut h = Harness::two((1, 1), (100, 100), ArbiterConfig::default());
    h.arbiter.reserve(&[1, 1], Instant::from_secs(100)).unwrap();
    let waiting = h.arbiter.reserve(&[1, 1], Instant::from_secs(100)).unwrap();
    for back in [99, 50, 0] {
        h.arbiter.handle_timeout(Instant::from_secs(back));
        h.arbiter
            .reserve(&[1, 1], Instant::from_secs(back))
            .unwrap();
    }
    h.drain();
    assert_eq!(h.granted().len(), 1);
    assert_eq!(h.arbiter.state(waiting), Some(TicketState::Queued));
    assert_eq!(h.arbiter.poll_timeout(), Some(Instant::from_secs(101)));
}

#[test]
fn ticket_misuse_is_an_error_not_a_double_refund() {
    let mut h = Harness::two((1, 1), (100, 100), ArbiterConfig::default());
    let granted = h.arbiter.reserve(&[1, 50], ms(0)).unwrap();
    let queued = h.arbiter.reserve(&[1, 50], ms(0)).unwrap();
    assert_eq!(
        h.arbiter.commit(queued, &[1, 5], ms(0)),
        Err(TicketError::NotGranted)
    );
    assert_eq!(
        h.arbiter.commit(granted, &[1], ms(0)),
        Err(TicketError::WrongDimensions {
            expected: 2,
            got: 1
        })
    );
    h.arbiter.commit(granted, &[1, 10], ms(0)).unwrap();
    assert_eq!(
        h.arbiter.commit(granted, &[1, 10], ms(0)),
        Err(TicketError::Unknown)
    );
    assert_eq!(h.arbiter.release(granted, ms(0)), Err(TicketError::Unknown));
    assert!(!h.arbiter.cancel(granted, ms(0)));
    assert_eq!(h.arbiter.dimension(1, ms(0)).map(|d| d.level), Some(90.0));
    // A slot reused by a new reservation does not answer to the old ticket.
    h.arbiter.cancel(queued, ms(0));
    let reused = h.arbiter.reserve(&[1, 1], ms(0)).unwrap();
    assert!(!h.arbiter.cancel(queued, ms(0)));
    assert_eq!(h.arbiter.state(reused), Some(TicketState::Queued));
}

#[test]
fn max_wait_refuses_up_front_with_the_wait_it_refused() {
    let mut h = Harness::two((2, 2), (100, 100), ArbiterConfig::default());
    for _ in 0..4 {
        h.arbiter.reserve(&[1, 10], ms(0)).unwrap();
    }
    // Two granted, two queued: the next waits for three more request permits = 1.5 s.
    let refused = h
        .arbiter
        .reserve_within(&[1, 10], Some(Duration::from_secs(1)), ms(0));
    assert_eq!(
        refused,
        Err(ReserveError::WouldWait {
            retry_after: Duration::from_millis(1500)
        })
    );
    h.drain();
    assert!(
        h.log
            .iter()
            .any(|(_, e)| matches!(e, Event::Rejected { .. }))
    );
    assert_eq!(
        h.arbiter.status().queued,
        2,
        "a refused reservation is not queued"
    );
    let accepted = h
        .arbiter
        .reserve_within(&[1, 10], Some(Duration::from_millis(1500)), ms(0))
        .unwrap();
    let grants = h.run_until_idle();
    assert_eq!(grants.last(), Some(&(ms(1500), accepted)));
}

#[test]
fn fifty_throttles_of_one_wave_pause_the_pool_once() {
    let mut h = Harness::two((100, 100), (10_000, 10_000), ArbiterConfig::default());
    let stamps: Vec<_> = (0..50).map(|_| h.arbiter.stamp_send(h.now)).collect();
    for (i, stamp) in stamps.iter().enumerate() {
        h.arbiter
            .throttle(*stamp, Some(Duration::from_secs(2)), ms(i as u64));
    }
    let waiter = h.arbiter.reserve(&[1, 1], ms(100)).unwrap();
    h.drain();
    let pauses = h
        .log
        .iter()
        .filter(|(_, e)| matches!(e, Event::Throttled { .. }))
        .count();
    assert_eq!(pauses, 1);
    assert_eq!(
        h.arbiter.state(waiter),
        Some(TicketState::Queued),
        "no grant while paused"
    );
    assert_eq!(h.arbiter.poll_timeout(), Some(ms(2000)));
    assert_eq!(h.advance_to(ms(2000)), vec![(ms(2000), waiter)]);
    // A request sent after the pause belongs to a new wave and can close it again.
    let next = h.arbiter.stamp_send(h.now);
    h.arbiter.throttle(next, None, ms(2000));
    assert!(!h.arbiter.status().gate.is_open(ms(2000)));
}

#[test]
fn an_absurd_retry_after_is_capped() {
    let mut h = Harness::two((1, 1), (1, 1), ArbiterConfig::default());
    let stamp = h.arbiter.stamp_send(h.now);
    h.arbiter.throttle(stamp, Some(Duration::MAX), ms(0));
    assert_eq!(
        h.arbiter.status().gate.reopens_at(ms(0)),
        Some(Instant::from_secs(120))
    );
}

#[test]
fn the_gate_honours_every_wait_the_retry_policy_accepts() {
    let ceiling = ratebucket_core::RetryPolicy::default().retry_after_ceiling;
    assert!(GateConfig::default().max_pause >= ceiling);
}

#[test]
fn a_capacity_for_a_dimension_that_does_not_exist_is_refused() {
    let mut h = Harness::two((1, 1), (1, 1), ArbiterConfig::default());
    assert_eq!(
        h.arbiter.change(2, Change::Capacity(10), ms(0)),
        Err(InvalidLimit::NoSuchDimension(2))
    );
}

#[test]
fn observations_only_lower_and_stale_ones_are_ignored() {
    let mut h = Harness::two((1, 10), (100, 100), ArbiterConfig::default());
    let older = h.arbiter.stamp_send(h.now);
    let newer = h.arbiter.stamp_send(h.now);
    assert_eq!(
        h.arbiter.observe_remaining(1, newer, 40, ms(0)),
        Ok(FoldOutcome::Lowered)
    );
    assert_eq!(
        h.arbiter.observe_remaining(1, older, 5, ms(0)),
        Ok(FoldOutcome::Stale)
    );
    assert_eq!(
        h.arbiter.observe_remaining(1, newer, 90, ms(0)),
        Ok(FoldOutcome::Unchanged)
    );
    // A dimension that does not exist is an error, not a silent no-op.
    assert_eq!(
        h.arbiter.observe_remaining(2, newer, 90, ms(0)),
        Err(InvalidLimit::NoSuchDimension(2))
    );
    assert_eq!(
        h.arbiter
            .change(7, Change::Rate(Rate::per_second(1).expect("rate")), ms(0)),
        Err(InvalidLimit::NoSuchDimension(7))
    );
    assert_eq!(
        h.arbiter.stop_sync(2),
        Err(InvalidLimit::NoSuchDimension(2))
    );
    assert_eq!(h.arbiter.dimension(1, ms(0)).map(|d| d.level), Some(40.0));
    assert_eq!(
        h.arbiter.dimension(0, ms(0)).map(|d| d.level),
        Some(10.0),
        "other dimensions untouched"
    );
}

#[test]
fn abort_refuses_every_queued_waiter_and_later_reservations() {
    let mut h = Harness::two((1, 1), (100, 100), ArbiterConfig::default());
    let granted = h.arbiter.reserve(&[1, 1], ms(0)).unwrap();
    let queued: Vec<Ticket> = (0..3)
        .map(|_| h.arbiter.reserve(&[1, 1], ms(0)).unwrap())
        .collect();
    h.arbiter.abort(ms(0));
    h.drain();
    let refused: Vec<Ticket> = h
        .log
        .iter()
        .filter_map(|(_, e)| match e {
            Event::Refused {
                ticket,
                reason: Refusal::Aborted,
            } => Some(*ticket),
            _ => None,
        })
        .collect();
    assert_eq!(refused, queued);
    assert_eq!(
        h.arbiter.reserve(&[1, 1], ms(0)),
        Err(ReserveError::Aborted)
    );
    assert_eq!(h.arbiter.release(granted, ms(0)), Ok(()));
}

#[test]
fn lowering_capacity_below_a_queued_cost_refuses_it_instead_of_hanging() {
    let mut h = Harness::two((1, 1), (100, 100), ArbiterConfig::default());
    h.arbiter.reserve(&[1, 100], ms(0)).unwrap();
    let big = h.arbiter.reserve(&[1, 80], ms(0)).unwrap();
    h.arbiter.change(1, Change::Capacity(50), ms(0)).unwrap();
    h.drain();
    assert!(h.log.iter().any(|(_, e)| *e
        == Event::Refused {
            ticket: big,
            reason: Refusal::CostExceedsCapacity { dimension: 1 }
        }));
    assert_eq!(h.arbiter.status().queued, 0);
}

#[test]
fn a_throttle_drains_every_bucket_and_halves_the_rates_once_per_wave() {
    let mut h = Harness::two((100, 100), (1_000, 1_000), ArbiterConfig::default());
    let wave: Vec<_> = (0..10).map(|_| h.arbiter.stamp_send(h.now)).collect();
    for stamp in &wave {
        h.arbiter
            .throttle(*stamp, Some(Duration::from_secs(1)), ms(0));
    }
    assert_eq!(
        h.arbiter.dimension(0, ms(0)).map(|d| d.level),
        Some(0.0),
        "the provider has nothing left"
    );
    assert_eq!(h.arbiter.dimension(1, ms(0)).map(|d| d.level), Some(0.0));
    assert_eq!(
        h.arbiter.dimension(0, Instant::ZERO).map(|d| d.rate),
        Some(Rate::per_second(50).unwrap())
    );
    assert_eq!(
        h.arbiter.dimension(1, Instant::ZERO).map(|d| d.rate),
        Some(Rate::per_second(500).unwrap())
    );
    // After the one-second pause, each bucket holds what refilled at the lowered rate.
    assert_eq!(
        h.arbiter.dimension(0, ms(1000)).map(|d| d.level),
        Some(50.0)
    );
}

#[test]
fn the_rest_of_a_throttled_wave_gives_nothing_back_when_it_ends() {
    let config = ArbiterConfig::default().with_adapt(None);
    let mut h = Harness::two((100, 100), (1_000, 1_000), config);
    // A wave of ten, all sent; the first 429 closes the gate for a second.
    let wave: Vec<_> = (0..10)
        .map(|_| {
            let ticket = h.arbiter.reserve(&[1, 10], ms(0)).unwrap();
            (
                ticket,
                h.arbiter
                    .stamp_send_if_open(ticket, ms(0))
                    .expect("the gate is open"),
            )
        })
        .collect();
    h.arbiter
        .throttle(wave[0].1, Some(Duration::from_secs(1)), ms(5));
    // The other nine come back 429 too (stale) and are released; one got through.
    for &(ticket, stamp) in &wave[1..9] {
        h.arbiter
            .throttle(stamp, Some(Duration::from_secs(1)), ms(6));
        h.arbiter.release(ticket, ms(6)).unwrap();
    }
    h.arbiter.release(wave[0].0, ms(6)).unwrap();
    h.arbiter.commit(wave[9].0, &[1, 2], ms(6)).unwrap();
    // The provider had nothing left: the releases and the refund do not refill the
    // buckets, or the wave would leave again, into the same wall, when the pause ends.
    let level = |h: &mut Harness, d, at| h.arbiter.dimension(d, at).map(|d| d.level).unwrap();
    let after_the_wave = level(&mut h, 0, ms(6));
    assert!(
        (after_the_wave - 0.1).abs() < 1e-6,
        "{after_the_wave} left a millisecond after the wave, not one millisecond of refill"
    );
    // After the pause, what refilled during it, and no more.
    assert!((level(&mut h, 1, ms(500)) - 495.0).abs() < 1e-6);
    assert!((level(&mut h, 0, ms(1_005)) - 100.0).abs() < 1e-6);
}

#[test]
fn an_unsent_grant_is_queued_again_ahead_of_later_waiters_and_takes_its_cost_anew() {
    let config = ArbiterConfig::default().with_adapt(None);
    let mut h = Harness::two((100, 100), (1_000, 1_000), config);
    let sent = h.arbiter.reserve(&[1, 1], ms(0)).unwrap();
    let stamp = h
        .arbiter
        .stamp_send_if_open(sent, ms(0))
        .expect("the gate is open");
    let unsent = h.arbiter.reserve(&[1, 1], ms(0)).unwrap();
    h.arbiter
        .throttle(stamp, Some(Duration::from_secs(1)), ms(0));
    let later = h.arbiter.reserve(&[1, 1], ms(10)).unwrap();
    assert_eq!(
        h.arbiter.requeue_unsent(sent, ms(10)),
        Err(TicketError::AlreadySent)
    );
    h.arbiter.requeue_unsent(unsent, ms(10)).unwrap();
    assert_eq!(h.arbiter.state(unsent), Some(TicketState::Queued));
    assert_eq!(h.arbiter.status().queued, 2);
    // Nothing is granted during the pause; after it, the requeued grant goes first and
    // pays again from what refilled.
    h.advance_to(ms(999));
    assert_eq!(h.arbiter.state(unsent), Some(TicketState::Queued));
    h.advance_to(ms(1_000));
    assert_eq!(h.arbiter.state(unsent), Some(TicketState::Granted));
    assert_eq!(h.arbiter.state(later), Some(TicketState::Granted));
    assert_eq!(
        h.arbiter.dimension(0, ms(1_000)).map(|d| d.level),
        Some(100.0 - 2.0)
    );
    h.drain();
    let order: Vec<_> = h
        .log
        .iter()
        .filter_map(|(_, e)| match e {
            Event::Granted { ticket, .. } => Some(*ticket),
            _ => None,
        })
        .collect();
    assert_eq!(order[order.len() - 2..], [unsent, later]);
}

#[test]
fn the_rate_comes_back_but_never_above_the_configured_one() {
    let mut h = Harness::two((100, 100), (1_000, 1_000), ArbiterConfig::default());
    let stamp = h.arbiter.stamp_send(h.now);
    h.arbiter.throttle(stamp, None, ms(0));
    h.advance_to(ms(60_000));
    for _ in 0..500 {
        let t = h.arbiter.reserve(&[1, 1], h.now).unwrap();
        h.arbiter.commit(t, &[1, 1], h.now).unwrap();
        h.advance(Duration::from_millis(20));
    }
    assert_eq!(
        h.arbiter.dimension(0, Instant::ZERO).map(|d| d.rate),
        Some(Rate::per_second(100).unwrap())
    );
    assert_eq!(
        h.arbiter.dimension(1, Instant::ZERO).map(|d| d.rate),
        Some(Rate::per_second(1_000).unwrap())
    );
    h.drain();
    let changes = h
        .log
        .iter()
        .filter(|(_, e)| matches!(e, Event::RateChanged { .. }))
        .count();
    assert!(changes > 2, "down once, then up step by step");
    assert!(
        changes < 1_000,
        "in steps, not an event per call: {changes}"
    );
}

/// After a throttle the rate climbs back by time, from the end of the pause: successes do
/// not speed it up, and it nears the rate that met the throttle over one probe.
#[test]
fn the_rate_climbs_back_over_a_probe_not_per_success() {
    let adapt = Adapt::default().with_probe(Duration::from_secs(10));
    let config = ArbiterConfig::default().with_adapt(Some(adapt));
    let mut h = Harness::two((100, 100), (1_000, 1_000), config);
    let rate = |h: &Harness| {
        h.arbiter
            .dimension(0, Instant::ZERO)
            .map(|d| d.rate)
            .unwrap()
            .per_second_f64()
    };
    let stamp = h.arbiter.stamp_send(h.now);
    // A one-second pause; the rate halves at once.
    h.arbiter
        .throttle(stamp, Some(Duration::from_secs(1)), ms(0));
    assert_eq!(rate(&h), 50.0);
    // Many successes within the pause's end and the probe's start raise nothing.
    h.advance_to(ms(1_000));
    for _ in 0..40 {
        let t = h.arbiter.reserve(&[1, 1], h.now).unwrap();
        h.arbiter.commit(t, &[1, 1], h.now).unwrap();
    }
    assert_eq!(rate(&h), 50.0, "successes alone do not raise the rate");
    // Half a probe on: halfway from 50 to 90 (nine tenths of the 100 that met the 429).
    h.advance_to(ms(6_000));
    assert!((rate(&h) - 70.0).abs() < 0.5, "{}", rate(&h));
    h.advance_to(ms(11_000));
    assert!((rate(&h) - 90.0).abs() < 0.5, "{}", rate(&h));
    // Then a tenth of it per probe, up to the configured rate and no further.
    h.advance_to(ms(16_000));
    assert!((rate(&h) - 95.0).abs() < 0.5, "{}", rate(&h));
    h.advance_to(ms(60_000));
    assert_eq!(
        h.arbiter.dimension(0, Instant::ZERO).map(|d| d.rate),
        Some(Rate::per_second(100).unwrap())
    );

    // A second throttle while climbing remembers the lower rate that met it.
    let mut h = Harness::two((100, 100), (1_000, 1_000), config);
    let stamp = h.arbiter.stamp_send(h.now);
    h.arbiter
        .throttle(stamp, Some(Duration::from_secs(1)), ms(0));
    h.advance_to(ms(11_000));
    let stamp = h.arbiter.stamp_send(h.now);
    h.arbiter
        .throttle(stamp, Some(Duration::from_secs(1)), ms(11_000));
    assert!((rate(&h) - 45.0).abs() < 0.5, "{}", rate(&h));
    h.advance_to(ms(22_000));
    assert!(
        (rate(&h) - 81.0).abs() < 0.5,
        "nine tenths of 90: {}",
        rate(&h)
    );
}

#[test]
fn without_adapting_a_throttle_leaves_the_rates_alone() {
    let config = ArbiterConfig::default().with_adapt(None);
    let mut h = Harness::two((100, 100), (1_000, 1_000), config);
    let stamp = h.arbiter.stamp_send(h.now);
    h.arbiter.throttle(stamp, None, ms(0));
    assert_eq!(
        h.arbiter.dimension(0, Instant::ZERO).map(|d| d.rate),
        Some(Rate::per_second(100).unwrap())
    );
    assert_eq!(
        h.arbiter.dimension(0, ms(0)).map(|d| d.level),
        Some(0.0),
        "still drained"
    );
}

/// A reply reconciled to usage from a provider that counted the whole reservation: the
/// refund must not reach the next waiter before the provider's count takes it back.
#[test]
fn a_reply_keeps_its_refund_from_the_next_waiter_until_its_report_is_folded() {
    let mut h = Harness::two((1, 10), (1, 100), ArbiterConfig::default());
    let first = h.arbiter.reserve(&[1, 100], ms(0)).expect("granted");
    let stamp = h
        .arbiter
        .stamp_send_if_open(first, ms(0))
        .expect("the gate is open");
    let next = h.arbiter.reserve(&[1, 60], ms(0)).expect("queued");
    h.drain();
    // Charged 20 of the 100 reserved, and the provider counted all 100: nothing left.
    let reports = [Report {
        dimension: 1,
        quota: QuotaReport {
            remaining: Some(0),
            ..QuotaReport::default()
        },
    }];
    let replied = h.arbiter.reply(
        first,
        &Reply {
            sent: stamp,
            settle: Settle::Charge(&[1, 20]),
            reports: &reports,
        },
        ms(0),
    );
    assert_eq!(replied.settled, Ok(()));
    assert_eq!(replied.bad_report, None);
    assert!(
        h.drain().is_empty(),
        "the refund of 80 was taken back before any grant"
    );
    assert_eq!(
        h.arbiter.state(next),
        Some(ratebucket_core::TicketState::Queued)
    );
}
