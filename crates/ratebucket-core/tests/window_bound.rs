//! The bucket invariant, as a property over random schedules of the whole arbiter.

mod support;

use std::collections::HashMap;
use std::time::Duration;

use quickcheck::{Arbitrary, Gen, TestResult};
use ratebucket_core::{ArbiterConfig, Instant, MAX_CHARGE_FACTOR, Ticket};
use support::{Harness, check};

#[derive(Clone, Debug)]
enum Op {
    Reserve { requests: u64, tokens: u64 },
    Commit { which: usize, tokens: u64 },
    Cancel { which: usize },
    Release { which: usize },
    Advance { millis: u64 },
    StepBack { millis: u64 },
}

#[derive(Clone, Debug)]
struct Schedule {
    rates: [u64; 2],
    capacities: [u64; 2],
    backfill: bool,
    ops: Vec<Op>,
}

impl Arbitrary for Schedule {
    fn arbitrary(g: &mut Gen) -> Schedule {
        let rates = [u64::arbitrary(g) % 20 + 1, u64::arbitrary(g) % 500 + 1];
        let capacities = [u64::arbitrary(g) % 10 + 1, u64::arbitrary(g) % 1000 + 1];
        let len = usize::arbitrary(g) % 120 + 10;
        let ops = (0..len)
            .map(|_| match u8::arbitrary(g) % 10 {
                0..=3 => Op::Reserve {
                    requests: u64::arbitrary(g) % capacities[0] + 1,
                    tokens: u64::arbitrary(g) % capacities[1],
                },
                4 => Op::Commit {
                    which: usize::arbitrary(g),
                    tokens: u64::arbitrary(g) % (2 * capacities[1]),
                },
                5 => Op::Cancel { which: usize::arbitrary(g) },
                6 => Op::Release { which: usize::arbitrary(g) },
                7 | 8 => Op::Advance { millis: u64::arbitrary(g) % 3000 },
                _ => Op::StepBack { millis: u64::arbitrary(g) % 5000 },
            })
            .collect();
        Schedule { rates, capacities, backfill: bool::arbitrary(g), ops }
    }
}

/// A signed change in one dimension's charge: a grant, a debt, or a refund.
#[derive(Clone, Copy, Debug)]
struct Charge {
    at: Instant,
    /// Permits charged (negative for refunds), per dimension.
    permits: [i128; 2],
    is_grant: bool,
}

fn run(schedule: &Schedule) -> Vec<Charge> {
    let config = ArbiterConfig::default().with_backfill(schedule.backfill);
    let mut h = Harness::two(
        (schedule.rates[0], schedule.capacities[0]),
        (schedule.rates[1], schedule.capacities[1]),
        config,
    );
    let mut costs: HashMap<Ticket, [u64; 2]> = HashMap::new();
    let mut granted: Vec<Ticket> = Vec::new();
    let mut issued: Vec<Ticket> = Vec::new();
    let mut charges = Vec::new();
    // What the caller claims the time is; it may step back.
    let mut clock = Instant::ZERO;
    for op in &schedule.ops {
        // A refund or debt this op charges, with the grants it triggers after it.
        let mut charge = None;
        let new_grants = match *op {
            Op::Reserve { requests, tokens } => {
                let ticket = h.arbiter.reserve(&[requests, tokens], clock).expect("fits");
                costs.insert(ticket, [requests, tokens]);
                issued.push(ticket);
                h.drain()
            }
            Op::Commit { which, tokens } if !granted.is_empty() => {
                let t = granted.swap_remove(which % granted.len());
                let c = costs[&t];
                h.arbiter.commit(t, &[c[0], tokens], clock).expect("granted ticket");
                // Trust is bounded: at most four times the reservation, or the capacity.
                let trusted = (c[1] * MAX_CHARGE_FACTOR).max(schedule.capacities[1]);
                charge = Some([0, i128::from(tokens.min(trusted)) - i128::from(c[1])]);
                h.drain()
            }
            Op::Release { which } if !granted.is_empty() => {
                let t = granted.swap_remove(which % granted.len());
                h.arbiter.release(t, clock).expect("granted ticket");
                charge = Some(costs[&t].map(|c| -i128::from(c)));
                h.drain()
            }
            Op::Cancel { which } if !issued.is_empty() => {
                let t = issued.swap_remove(which % issued.len());
                let was_granted = granted.contains(&t);
                let withdrew = h.arbiter.cancel(t, clock);
                if was_granted {
                    assert!(withdrew, "cancelling a granted reservation releases it");
                    granted.retain(|g| *g != t);
                    charge = Some(costs[&t].map(|c| -i128::from(c)));
                }
                h.drain()
            }
            Op::Advance { millis } => {
                let grants = h.advance_to(h.now + Duration::from_millis(millis));
                clock = h.now;
                grants
            }
            Op::StepBack { millis } => {
                clock = Instant::from_nanos(clock.as_nanos().saturating_sub(millis * 1_000_000));
                Vec::new()
            }
            _ => Vec::new(),
        };
        if let Some(permits) = charge {
            charges.push(Charge { at: h.now, permits, is_grant: false });
        }
        for (at, t) in new_grants {
            let c = costs[&t];
            charges.push(Charge { at, permits: c.map(i128::from), is_grant: true });
            granted.push(t);
        }
    }
    charges
}

/// Net permits charged between any event and any later grant stay within
/// `capacity + rate * (t_grant - t_event)`, per dimension.
fn net_grants_within_bound(schedule: Schedule) -> TestResult {
    let charges = run(&schedule);
    for dim in 0..2 {
        let cap = i128::from(schedule.capacities[dim]);
        let rate = i128::from(schedule.rates[dim]);
        for (j, last) in charges.iter().enumerate().filter(|(_, c)| c.is_grant) {
            let mut net = 0i128;
            for i in (0..=j).rev() {
                net += charges[i].permits[dim];
                let window_ns = i128::from((last.at - charges[i].at).as_nanos() as u64);
                // net <= cap + rate * W, in nanosecond-scaled integers.
                if net * 1_000_000_000 > cap * 1_000_000_000 + rate * window_ns {
                    return TestResult::error(format!(
                        "dimension {dim}: {net} permits net from event {i} to grant {j} \
                         over {window_ns} ns exceeds capacity {cap} + rate {rate}/s"
                    ));
                }
            }
        }
    }
    TestResult::passed()
}

#[test]
fn net_permits_granted_in_any_window_never_exceed_capacity_plus_rate_times_window() {
    check(300, 0x5eed_0001, net_grants_within_bound as fn(Schedule) -> TestResult);
}
