//! The express lane allocates nothing: a reservation granted and committed through it, by
//! `try_reserve` or by awaiting `reserve`, touches no heap (counted by a global allocator
//! that counts this thread's allocations while the loop runs).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};

use ratebucket_rt::core::{ArbiterConfig, Instant, Rate, TokenBucket};
use ratebucket_rt::{BoxFuture, Limiter, Timer};

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

// SAFETY: delegates to the system allocator and only counts.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// A clock that never moves; nothing sleeps and the driver never runs.
struct Still(std::time::Instant);

impl Timer for Still {
    fn now(&self) -> std::time::Instant {
        self.0
    }
    fn sleep_until(&self, _deadline: std::time::Instant) -> BoxFuture {
        Box::pin(std::future::pending())
    }
    fn spawn(&self, task: BoxFuture) {
        drop(task);
    }
}

/// Allocations this thread makes while `f` runs.
fn allocations_in(f: impl FnOnce()) -> u64 {
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    COUNTING.with(|c| c.set(true));
    f();
    COUNTING.with(|c| c.set(false));
    ALLOCATIONS.load(Ordering::Relaxed) - before
}

#[test]
fn a_grant_and_commit_through_the_lane_allocate_nothing() {
    let rate = |n| Rate::per_second(n).expect("rate");
    let buckets = vec![
        TokenBucket::new(rate(1 << 30), 1 << 30, Instant::ZERO).expect("bucket"),
        TokenBucket::new(rate(1 << 40), 1 << 40, Instant::ZERO).expect("bucket"),
    ];
    let limiter =
        Limiter::with_timer(buckets, ArbiterConfig::default(), Still(std::time::Instant::now()))
            .expect("limiter");
    let mut cx = Context::from_waker(Waker::noop());
    let allocated = allocations_in(|| {
        for _ in 0..10_000 {
            let reservation = limiter.try_reserve(&[1, 300]).expect("roomy");
            reservation.commit(&[1, 120]).expect("granted");
            let reserve = pin!(limiter.reserve(&[1, 300]));
            let Poll::Ready(reservation) = reserve.poll(&mut cx) else {
                panic!("a roomy limiter grants at once");
            };
            reservation.expect("roomy").commit(&[1, 300]).expect("granted");
        }
    });
    assert_eq!(allocated, 0, "the lane allocated {allocated} times in 20,000 grants");
    assert_eq!(limiter.stats().reservations, 0, "every grant came from the lane");
}
