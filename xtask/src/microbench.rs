//! `cargo xtask microbench`: the core state machine's costs, side by side with governor.
//!
//! Three figures: uncontended two-dimension reserve+commit against governor's
//! single-dimension `check()` in the same process; the cost of one grant with 10, 10,000
//! and 1,000,000 waiters queued (steady state: every grant is replaced by a new waiter);
//! and the heap bytes each queued waiter costs. Each timing is the best of several rounds,
//! since the machine is shared.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::{Duration, Instant as StdInstant};

use ratebucket_core::{Arbiter, ArbiterConfig, Event, Instant, Rate, TokenBucket};

/// Counts live heap bytes, for the memory-per-waiter figure.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: delegates to the system allocator and only adds bookkeeping.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const ROUNDS: usize = 7;

pub(crate) fn run() -> Result<(), String> {
    if cfg!(debug_assertions) {
        // Timings of an unoptimised build mean nothing: re-run this task optimised.
        return crate::cargo(
            &[
                "run",
                "--release",
                "--quiet",
                "-p",
                "xtask",
                "--",
                "microbench",
            ],
            &[],
        );
    }
    let origin = StdInstant::now();
    let ours = best_ns_per_op(2_000_000, |n| reserve_commit(n, origin));
    let ours_no_clock = best_ns_per_op(2_000_000, reserve_commit_virtual);
    let governor = best_ns_per_op(2_000_000, governor_check);
    let governor_fake = best_ns_per_op(2_000_000, governor_check_fake_clock);
    println!("uncontended, per operation (best of {ROUNDS} rounds)");
    println!("  ratebucket reserve+commit, 2 dimensions, with clock read  {ours:>7.1} ns");
    println!("  ratebucket reserve+commit, 2 dimensions, virtual clock    {ours_no_clock:>7.1} ns");
    println!("  governor check(), 1 dimension, default clock             {governor:>7.1} ns");
    println!("  governor check(), 1 dimension, fake clock                {governor_fake:>7.1} ns");
    println!(
        "  ratio, both reading a clock                              {:>7.2}x",
        ours / governor
    );
    println!(
        "  ratio, both on a virtual clock                           {:>7.2}x",
        ours_no_clock / governor_fake
    );
    println!();
    println!("grant cost with N waiters queued (steady state)");
    let mut base = None;
    for queued in [10usize, 10_000, 1_000_000] {
        let per_grant = best_ns_per_op(200_000, |n| grant_with_queue(queued, n));
        let base = *base.get_or_insert(per_grant);
        println!(
            "  N = {queued:>9}  {per_grant:>7.1} ns per grant  ({:.2}x the N = 10 cost)",
            per_grant / base
        );
    }
    println!();
    let bytes = bytes_per_waiter(1_000_000);
    println!("memory: {bytes:.1} bytes of heap per queued waiter (1,000,000 queued, 2 dimensions)");
    Ok(())
}

/// Runs `f(ops)` `ROUNDS` times and returns the best nanoseconds per operation.
fn best_ns_per_op(ops: u64, mut f: impl FnMut(u64) -> Duration) -> f64 {
    (0..ROUNDS)
        .map(|_| f(ops).as_nanos() as f64 / ops as f64)
        .fold(f64::INFINITY, f64::min)
}

fn roomy_arbiter(config: ArbiterConfig) -> Arbiter {
    let requests = TokenBucket::new(
        Rate::per_second(1 << 40).expect("rate"),
        1 << 40,
        Instant::ZERO,
    );
    let tokens = TokenBucket::new(
        Rate::per_second(1 << 50).expect("rate"),
        1 << 50,
        Instant::ZERO,
    );
    Arbiter::new(
        vec![requests.expect("bucket"), tokens.expect("bucket")],
        config,
        Instant::ZERO,
    )
    .expect("arbiter")
}

fn drain(arbiter: &mut Arbiter) -> usize {
    let mut granted = 0;
    while let Some(event) = arbiter.poll_event() {
        if matches!(event, Event::Granted { .. }) {
            granted += 1;
        }
        black_box(event);
    }
    granted
}

fn reserve_commit(ops: u64, origin: StdInstant) -> Duration {
    let mut arbiter = roomy_arbiter(ArbiterConfig::default());
    let start = StdInstant::now();
    for _ in 0..ops {
        let now = Instant::from_duration(origin.elapsed());
        let ticket = arbiter.reserve(black_box(&[1, 300]), now).expect("fits");
        drain(&mut arbiter);
        arbiter
            .commit(ticket, black_box(&[1, 120]), now)
            .expect("granted");
        drain(&mut arbiter);
    }
    start.elapsed()
}

fn reserve_commit_virtual(ops: u64) -> Duration {
    let mut arbiter = roomy_arbiter(ArbiterConfig::default());
    let start = StdInstant::now();
    for i in 0..ops {
        let now = Instant::from_nanos(i * 100);
        let ticket = arbiter.reserve(black_box(&[1, 300]), now).expect("fits");
        drain(&mut arbiter);
        arbiter
            .commit(ticket, black_box(&[1, 120]), now)
            .expect("granted");
        drain(&mut arbiter);
    }
    start.elapsed()
}

fn governor_check(ops: u64) -> Duration {
    let quota = governor::Quota::per_second(NonZeroU32::MAX);
    let limiter = governor::RateLimiter::direct(quota);
    let start = StdInstant::now();
    for _ in 0..ops {
        let _ = black_box(limiter.check());
    }
    start.elapsed()
}

fn governor_check_fake_clock(ops: u64) -> Duration {
    let quota = governor::Quota::per_second(NonZeroU32::MAX);
    let clock = governor::clock::FakeRelativeClock::default();
    let limiter = governor::RateLimiter::direct_with_clock(quota, clock.clone());
    let start = StdInstant::now();
    for _ in 0..ops {
        clock.advance(Duration::from_nanos(100));
        let _ = black_box(limiter.check());
    }
    start.elapsed()
}

/// One request per microsecond; the queue is filled to `queued`, then every grant is
/// followed by a new waiter, so each measured grant happens with `queued` waiters behind.
fn grant_with_queue(queued: usize, grants: u64) -> Duration {
    let requests = TokenBucket::new(Rate::per_second(1_000_000).expect("rate"), 1, Instant::ZERO);
    let tokens = TokenBucket::new(
        Rate::per_second(1 << 40).expect("rate"),
        1 << 40,
        Instant::ZERO,
    );
    let mut arbiter = Arbiter::new(
        vec![requests.expect("bucket"), tokens.expect("bucket")],
        ArbiterConfig::default(),
        Instant::ZERO,
    )
    .expect("arbiter");
    for _ in 0..queued {
        arbiter.reserve(&[1, 10], Instant::ZERO).expect("fits");
    }
    drain(&mut arbiter);
    let start = StdInstant::now();
    let mut done = 0;
    while done < grants {
        let at = arbiter.poll_timeout().expect("someone waits");
        arbiter.handle_timeout(at);
        let granted = drain(&mut arbiter);
        for _ in 0..granted {
            arbiter.reserve(&[1, 10], at).expect("fits");
        }
        done += granted as u64;
    }
    start.elapsed()
}

fn bytes_per_waiter(queued: usize) -> f64 {
    let requests = TokenBucket::new(Rate::per_second(1).expect("rate"), 1, Instant::ZERO);
    let tokens = TokenBucket::new(Rate::per_second(1).expect("rate"), 1, Instant::ZERO);
    let before = LIVE.load(Ordering::Relaxed);
    let mut arbiter = Arbiter::new(
        vec![requests.expect("bucket"), tokens.expect("bucket")],
        ArbiterConfig::default(),
        Instant::ZERO,
    )
    .expect("arbiter");
    for _ in 0..queued {
        arbiter.reserve(&[1, 1], Instant::ZERO).expect("fits");
    }
    drain(&mut arbiter);
    let after = LIVE.load(Ordering::Relaxed);
    black_box(&arbiter);
    (after - before) as f64 / queued as f64
}
