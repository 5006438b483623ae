//! The express lane against the arbiter: whatever the lane grants, an arbiter without a
//! lane, fed the same calls at the same instants, grants on arrival too; nothing is
//! granted past a queued waiter or through a closed gate; and the lane allocates nothing.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use quickcheck::{Arbitrary, Gen, QuickCheck, TestResult};
use ratebucket_rt::core::{
    Arbiter, ArbiterConfig, Instant, Rate, Ticket, TicketState, TokenBucket,
};
use ratebucket_rt::{BoxFuture, Limiter, Reservation, Reserve, ReserveError, Timer};

/// A clock that only the test moves; sleeps never end and the driver never runs, so
/// every grant comes from an input, at an instant the test chose.
#[derive(Clone)]
struct Manual {
    origin: std::time::Instant,
    nanos: Arc<AtomicU64>,
}

impl Manual {
    fn new() -> Manual {
        Manual { origin: std::time::Instant::now(), nanos: Arc::new(AtomicU64::new(0)) }
    }

    fn advance(&self, by: Duration) -> Instant {
        let nanos =
            self.nanos.fetch_add(by.as_nanos() as u64, Ordering::SeqCst) + by.as_nanos() as u64;
        Instant::from_nanos(nanos)
    }

    fn core_now(&self) -> Instant {
        Instant::from_nanos(self.nanos.load(Ordering::SeqCst))
    }
}

impl Timer for Manual {
    fn now(&self) -> std::time::Instant {
        self.origin + Duration::from_nanos(self.nanos.load(Ordering::SeqCst))
    }

    fn sleep_until(&self, _deadline: std::time::Instant) -> BoxFuture {
        Box::pin(std::future::pending())
    }

    fn spawn(&self, task: BoxFuture) {
        drop(task);
    }
}

/// 5 requests and 1,000 tokens per second, each with a second of burst.
fn buckets() -> Vec<TokenBucket> {
    let requests = TokenBucket::new(Rate::per_second(5).unwrap(), 5, Instant::ZERO).unwrap();
    let tokens = TokenBucket::new(Rate::per_second(1000).unwrap(), 1000, Instant::ZERO).unwrap();
    vec![requests, tokens]
}

/// The costs a reservation may ask for (some above the token capacity).
const COSTS: [[u64; 2]; 6] = [[1, 0], [1, 50], [1, 200], [1, 450], [2, 900], [1, 1200]];

#[derive(Clone, Debug)]
enum Op {
    /// `try_reserve` (the lane's own call).
    Try(usize),
    /// `reserve`, polled once: granted at once, or a waiter left queued.
    Wait(usize),
    /// Polls every waiter again.
    Poll,
    /// Drops a waiter.
    GiveUp(usize),
    /// Commits a held reservation, charged this many tokens.
    Commit(usize, u64),
    Release(usize),
    Drop(usize),
    /// A 429 to a request sent now, pausing for a second.
    Throttle,
    Advance(u64),
}

impl Arbitrary for Op {
    fn arbitrary(g: &mut Gen) -> Op {
        let pick = |g: &mut Gen, n: usize| usize::arbitrary(g) % n;
        match u8::arbitrary(g) % 20 {
            0..=5 => Op::Try(pick(g, COSTS.len())),
            6..=7 => Op::Wait(pick(g, COSTS.len())),
            8 => Op::Poll,
            9 => Op::GiveUp(pick(g, 8)),
            10..=12 => Op::Commit(pick(g, 8), u64::arbitrary(g) % 1300),
            13 => Op::Release(pick(g, 8)),
            14 => Op::Drop(pick(g, 8)),
            15 => Op::Throttle,
            _ => Op::Advance(u64::arbitrary(g) % 400),
        }
    }
}

fn poll_once<F: Future>(future: Pin<&mut F>) -> Poll<F::Output> {
    future.poll(&mut Context::from_waker(Waker::noop()))
}

/// Checks a grant the limiter just made of `cost` at step `step`: nobody is left queued
/// (FIFO: whoever waited was granted first), and the reference arbiter grants the same
/// cost on arrival. Returns the reference's ticket.
fn check_grant(
    limiter: &Limiter,
    reference: &mut Arbiter,
    cost: &[u64],
    now: Instant,
    step: usize,
) -> Result<Ticket, String> {
    let queued = limiter.snapshot().queued;
    if queued > 0 {
        return Err(format!("step {step}: {cost:?} granted past {queued} queued"));
    }
    reference
        .reserve_within(cost, Some(Duration::ZERO), now)
        .ok()
        .filter(|&t| reference.state(t) == Some(TicketState::Granted))
        .ok_or_else(|| format!("step {step}: {cost:?} granted, the arbiter would not"))
}

/// Runs `ops` on a limiter and on a lane-less reference arbiter side by side; `Err` names
/// the first grant the reference would not have made.
fn run(ops: &[Op]) -> Result<(), String> {
    let timer = Manual::new();
    let limiter = Limiter::with_timer(buckets(), ArbiterConfig::default(), timer.clone()).unwrap();
    let mut reference = Arbiter::new(buckets(), ArbiterConfig::default(), Instant::ZERO).unwrap();
    let mut held: Vec<(Reservation, Ticket)> = Vec::new();
    let mut waiting: Vec<(Pin<Box<Reserve<'_>>>, Ticket)> = Vec::new();
    for (step, op) in ops.iter().enumerate() {
        let now = timer.core_now();
        match *op {
            Op::Try(c) => {
                let cost = &COSTS[c];
                match limiter.try_reserve(cost) {
                    Ok(reservation) => {
                        let ticket = check_grant(&limiter, &mut reference, cost, now, step)?;
                        held.push((reservation, ticket));
                    }
                    Err(
                        ReserveError::WouldWait { .. } | ReserveError::CostExceedsCapacity { .. },
                    ) => {}
                    Err(e) => return Err(format!("step {step}: {e}")),
                }
            }
            Op::Wait(c) => {
                let cost = &COSTS[c];
                let mut reserve = Box::pin(limiter.reserve(cost));
                match poll_once(reserve.as_mut()) {
                    Poll::Ready(Ok(reservation)) => {
                        let ticket = check_grant(&limiter, &mut reference, cost, now, step)?;
                        held.push((reservation, ticket));
                    }
                    Poll::Ready(Err(_)) => {}
                    Poll::Pending => {
                        let ticket = reference.reserve(cost, now).map_err(|e| e.to_string())?;
                        waiting.push((reserve, ticket));
                    }
                }
            }
            Op::Poll => {
                let mut still = Vec::new();
                for (mut reserve, ticket) in waiting.drain(..) {
                    match poll_once(reserve.as_mut()) {
                        Poll::Ready(Ok(reservation)) => {
                            if reference.state(ticket) != Some(TicketState::Granted) {
                                return Err(format!(
                                    "step {step}: a waiter granted before the arbiter would"
                                ));
                            }
                            held.push((reservation, ticket));
                        }
                        Poll::Ready(Err(_)) => {
                            reference.cancel(ticket, now);
                        }
                        Poll::Pending => still.push((reserve, ticket)),
                    }
                }
                waiting = still;
            }
            Op::GiveUp(i) if i < waiting.len() => {
                let (reserve, ticket) = waiting.remove(i);
                drop(reserve);
                reference.cancel(ticket, now);
            }
            Op::Commit(i, tokens) if i < held.len() => {
                let (reservation, ticket) = held.remove(i);
                let actual = [1, tokens];
                reservation.commit(&actual).map_err(|e| e.to_string())?;
                reference.commit(ticket, &actual, now).map_err(|e| e.to_string())?;
            }
            Op::Release(i) if i < held.len() => {
                let (reservation, ticket) = held.remove(i);
                reservation.release();
                reference.release(ticket, now).map_err(|e| e.to_string())?;
            }
            Op::Drop(i) if i < held.len() => {
                let (reservation, ticket) = held.remove(i);
                drop(reservation);
                reference.cancel(ticket, now);
            }
            Op::Throttle => {
                let sent = limiter.stamp_send();
                let reference_sent = reference.stamp_send(now);
                limiter.throttle(sent, Some(Duration::from_secs(1)));
                reference.throttle(reference_sent, Some(Duration::from_secs(1)), now);
            }
            Op::Advance(ms) => {
                timer.advance(Duration::from_millis(ms));
            }
            _ => {}
        }
        while reference.poll_event().is_some() {}
        for d in 0..2 {
            let capacity = limiter.dimension(d).map(|v| v.state.capacity).unwrap() as f64;
            let available = limiter.dimension(d).map(|v| v.state.level).unwrap();
            if available > capacity {
                return Err(format!(
                    "step {step}: {available} available in dimension {d}, capacity {capacity}"
                ));
            }
        }
    }
    Ok(())
}

#[test]
fn the_lane_grants_nothing_an_arbiter_without_it_would_refuse() {
    fn property(ops: Vec<Op>) -> TestResult {
        match run(&ops) {
            Ok(()) => TestResult::passed(),
            Err(why) => TestResult::error(why),
        }
    }
    QuickCheck::new().tests(500).quickcheck(property as fn(Vec<Op>) -> TestResult);
}

#[test]
fn a_throttle_closes_the_lane_before_the_next_grant() {
    let ops = [Op::Try(1), Op::Throttle, Op::Try(1)];
    run(&ops).unwrap();
}

#[test]
fn a_queued_waiter_closes_the_lane_to_newcomers() {
    // 900 tokens cannot be had at once after 450 went; 50 could, but only past the waiter.
    let ops = [Op::Try(3), Op::Wait(4), Op::Try(1)];
    run(&ops).unwrap();
}

#[test]
fn grants_on_arrival_come_from_the_lane() {
    let timer = Manual::new();
    let limiter = Limiter::with_timer(buckets(), ArbiterConfig::default(), timer.clone()).unwrap();
    let reservation = limiter.try_reserve(&[1, 200]).unwrap();
    assert_eq!(reservation.ticket(), None, "an express grant has no ticket");
    reservation.commit(&[1, 50]).unwrap();
    assert_eq!(limiter.dimension(0).map(|v| v.state.level), Some(4.0));
    assert_eq!(
        limiter.dimension(1).map(|v| v.state.level),
        Some(950.0),
        "the refund went back into the lease"
    );
}
