//! Introspection on the virtual clock: snapshots, and drain estimates against real drains.

use super::Direct;
use super::support;

use std::time::Duration;

use quickcheck::{Arbitrary, Gen, TestResult};
use ratebucket_core::{
    Arbiter, ArbiterConfig, Change, Instant, Rate, ReserveError, TokenBucket, WindowGuard,
};
use support::{Harness, check};

#[derive(Clone, Debug)]
struct Batch {
    /// Permits per second.
    rate: u64,
    capacity: u64,
    /// Taken before the batch starts (the bucket is not full).
    spent: u64,
    costs: Vec<u64>,
}

impl Arbitrary for Batch {
    fn arbitrary(g: &mut Gen) -> Batch {
        let rate = u64::arbitrary(g) % 1_000 + 1;
        let capacity = u64::arbitrary(g) % 100 + 1;
        let spent = u64::arbitrary(g) % (capacity + 1);
        let len = usize::arbitrary(g) % 60 + 1;
        let costs = (0..len).map(|_| u64::arbitrary(g) % capacity + 1).collect();
        Batch { rate, capacity, spent, costs }
    }
}

/// With one dimension, the estimate taken before a batch is queued is when its last
/// reservation is really granted, to the nanosecond (each grant may round up by one).
#[test]
fn a_drain_estimate_is_when_the_last_of_the_work_is_granted() {
    fn property(batch: Batch) -> TestResult {
        let rate = Rate::per_second(batch.rate).unwrap();
        let bucket = TokenBucket::new(rate, batch.capacity, Instant::ZERO).unwrap();
        let mut h = Harness::new(vec![bucket], ArbiterConfig::default());
        if batch.spent > 0 {
            h.arbiter.reserve(&[batch.spent], Instant::ZERO).unwrap();
        }
        h.drain();
        let total: u64 = batch.costs.iter().sum();
        let estimate = h.arbiter.estimate_drain(&[total], Instant::ZERO).unwrap();
        for &cost in &batch.costs {
            h.arbiter.reserve(&[cost], Instant::ZERO).unwrap();
        }
        let grants = h.run_until_idle();
        let last = grants.last().expect("everything is granted").0;
        let real = last.saturating_duration_since(Instant::ZERO);
        let slack = Duration::from_nanos(batch.costs.len() as u64);
        // Queued work counts too: the estimate now, with nothing more, is zero.
        let after = h.arbiter.estimate_drain(&[0], last).unwrap();
        TestResult::from_bool(real >= estimate && real <= estimate + slack && after.is_zero())
    }
    check(500, 0xd4a1, property as fn(Batch) -> TestResult);
}

#[test]
fn a_drain_estimate_counts_what_is_queued_the_pause_and_a_window_cap() {
    // 10 per second, 10 of burst; 40 queued behind a spent bucket: 4 s to drain.
    let bucket = TokenBucket::new(Rate::per_second(10).unwrap(), 10, Instant::ZERO).unwrap();
    let mut arbiter = Arbiter::new(vec![bucket], ArbiterConfig::default(), Instant::ZERO).unwrap();
    arbiter.reserve(&[10], Instant::ZERO).unwrap();
    for _ in 0..4 {
        arbiter.reserve(&[10], Instant::ZERO).unwrap();
    }
    let now = Instant::ZERO;
    assert_eq!(arbiter.estimate_drain(&[0], now), Ok(Duration::from_secs(4)));
    assert_eq!(arbiter.estimate_drain(&[20], now), Ok(Duration::from_secs(6)));
    assert_eq!(
        arbiter.estimate_drain(&[1, 1], now),
        Err(ReserveError::WrongDimensions { expected: 1, got: 2 })
    );

    // A pause longer than the drain is what the estimate waits for.
    let stamp = arbiter.stamp_send(now);
    arbiter.throttle(stamp, Some(Duration::from_secs(9)), now);
    assert_eq!(arbiter.estimate_drain(&[0], now), Ok(Duration::from_secs(9)));

    // A cap of 10 per 5 s: 60 more is five windows beyond the first.
    let bucket = TokenBucket::new(Rate::per_second(10).unwrap(), 10, Instant::ZERO).unwrap();
    let mut capped = Arbiter::new(vec![bucket], ArbiterConfig::default(), Instant::ZERO).unwrap();
    let guard = WindowGuard::new(10, Duration::from_secs(5)).unwrap();
    capped.change(0, Change::WindowGuard(Some(guard)), Instant::ZERO).unwrap();
    assert_eq!(capped.estimate_drain(&[60], now), Ok(Duration::from_secs(25)));
}

/// A cap whose window is spent: the next unit waits for the spend to age out of the
/// window, not for the bucket's refill, and the estimate says so.
#[test]
fn a_drain_estimate_waits_for_a_spent_window_to_age_out() {
    let bucket = TokenBucket::new(Rate::per_second(10).unwrap(), 10, Instant::ZERO).unwrap();
    let mut capped = Arbiter::new(vec![bucket], ArbiterConfig::default(), Instant::ZERO).unwrap();
    let guard = WindowGuard::new(10, Duration::from_secs(5)).unwrap();
    capped.change(0, Change::WindowGuard(Some(guard)), Instant::ZERO).unwrap();
    let ticket = capped.reserve(&[10], Instant::ZERO).unwrap();
    capped.commit(ticket, &[10], Instant::ZERO).unwrap();
    // The bucket has one more unit in 0.1 s; the window holds all 10 for 5 s.
    assert_eq!(capped.estimate_drain(&[1], Instant::ZERO), Ok(Duration::from_secs(5)));
    // Eleven more: the first ten after the spend ages out, the eleventh a window later.
    assert_eq!(capped.estimate_drain(&[11], Instant::ZERO), Ok(Duration::from_secs_f64(5.5)));
}

#[test]
fn a_snapshot_shows_levels_queued_cost_the_pause_and_what_was_learned() {
    let mut h = Harness::two((10, 10), (1_000, 1_000), ArbiterConfig::default());
    h.arbiter.reserve(&[10, 100], Instant::ZERO).unwrap();
    h.arbiter.reserve(&[4, 50], Instant::ZERO).unwrap();
    h.drain();
    let snap = h.arbiter.snapshot(Instant::ZERO);
    assert_eq!(snap.queued, 1);
    assert_eq!(snap.dimensions[0].level, 0.0);
    assert_eq!(snap.dimensions[0].queued_cost, 4);
    let heads: Vec<u64> = snap.dimensions.iter().map(|d| d.head_cost).collect();
    assert_eq!(heads, [4, 50], "the first waiter's cost");
    assert_eq!(snap.dimensions[1].level, 900.0);
    assert_eq!(snap.dimensions[1].queued_cost, 50);
    assert_eq!(snap.paused_until, None);
    assert!(!snap.dimensions[1].synced);

    // Half a second later the requests bucket has refilled five: a query on `&self`.
    let later = Instant::ZERO + Duration::from_millis(300);
    assert_eq!(h.arbiter.snapshot(later).dimensions[0].level, 3.0);

    let stamp = h.arbiter.stamp_send(later);
    h.arbiter.throttle(stamp, Some(Duration::from_secs(2)), later);
    let guard = WindowGuard::new(500, Duration::from_secs(60)).unwrap();
    h.arbiter.change(1, Change::WindowGuard(Some(guard)), later).unwrap();
    h.arbiter.sync_level(1, stamp, 700, later).expect("dimension exists");
    let snap = h.arbiter.snapshot(later);
    assert_eq!(snap.paused_until, Some(later + Duration::from_secs(2)));
    assert_eq!(snap.epoch.get(), 1);
    assert!(
        snap.dimensions[0].rate.per_second_f64()
            < snap.dimensions[0].configured_rate.per_second_f64()
    );
    assert_eq!(snap.dimensions[1].window_limit, Some((500, Duration::from_secs(60))));
    assert!(snap.dimensions[1].synced);
}
