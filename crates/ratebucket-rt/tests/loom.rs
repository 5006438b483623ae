//! Model checks of the async layer with loom: every interleaving (up to a preemption
//! bound) of the tasks, the driver, the clock and drops, for the five races that decide
//! liveness. A lost wakeup shows up as a loom deadlock: every thread parked.
//!
//! Run with `cargo xtask loom`, or
//! `RUSTFLAGS="--cfg loom" cargo test -p ratebucket-rt --test loom --release`.
//! `docs/proofs.md` says, for each model, the edit that puts its race back and what loom
//! then reports.

#![cfg(loom)]

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use loom::future::block_on;
use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use loom::sync::{Arc, Mutex};
use loom::thread;
use ratebucket_rt::core::{ArbiterConfig, Instant, Rate, TokenBucket};
use ratebucket_rt::{BoxFuture, Limiter, Timer};

/// A virtual clock that only the model moves, with the sleepers it must wake.
struct Clock {
    origin: std::time::Instant,
    nanos: AtomicU64,
    sleepers: Mutex<Vec<Waker>>,
}

/// A [`Timer`] on the virtual clock; the driver runs on a loom thread of its own.
#[derive(Clone)]
struct LoomTimer(Arc<Clock>);

impl LoomTimer {
    fn new() -> LoomTimer {
        LoomTimer(Arc::new(Clock {
            origin: std::time::Instant::now(),
            nanos: AtomicU64::new(0),
            sleepers: Mutex::new(Vec::new()),
        }))
    }

    /// Moves the clock on to `to` after the origin and wakes every sleeper to look.
    fn advance_to(&self, to: Duration) {
        let nanos = u64::try_from(to.as_nanos()).expect("a short model");
        self.0.nanos.store(nanos, Ordering::SeqCst);
        let sleepers = std::mem::take(&mut *self.0.sleepers.lock().unwrap());
        for waker in sleepers {
            waker.wake();
        }
    }

    fn elapsed(&self) -> Duration {
        Duration::from_nanos(self.0.nanos.load(Ordering::SeqCst))
    }
}

impl Timer for LoomTimer {
    fn now(&self) -> std::time::Instant {
        self.0.origin + self.elapsed()
    }

    fn sleep_until(&self, deadline: std::time::Instant) -> BoxFuture {
        Box::pin(Sleep { timer: self.clone(), deadline })
    }

    fn spawn(&self, task: BoxFuture) {
        thread::spawn(move || block_on(task));
    }
}

struct Sleep {
    timer: LoomTimer,
    deadline: std::time::Instant,
}

impl Future for Sleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        // Checked under the sleepers' lock: `advance_to` stores the time before taking
        // it, so either this poll sees the new time or `advance_to` sees this waker.
        let mut sleepers = self.timer.0.sleepers.lock().unwrap();
        if self.timer.now() >= self.deadline {
            return Poll::Ready(());
        }
        sleepers.push(cx.waker().clone());
        Poll::Pending
    }
}

/// Explores the model with a preemption bound (loom's `LOOM_MAX_PREEMPTIONS` overrides
/// it), so the whole file runs in seconds.
fn check(model: impl Fn() + Send + Sync + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(2);
    }
    builder.check(model);
}

/// One dimension refilling `per_second`, holding at most `capacity`, started empty.
fn empty_limiter(timer: &LoomTimer, per_second: u64, capacity: u64) -> Limiter {
    let rate = Rate::per_second(per_second).expect("rate");
    let mut bucket = TokenBucket::new(rate, capacity, Instant::ZERO).expect("bucket");
    bucket.take(capacity, Instant::ZERO);
    Limiter::with_timer(vec![bucket], ArbiterConfig::default(), timer.clone()).expect("limiter")
}

/// Polls `future` once with a waker that does nothing (to queue a reservation).
fn poll_once<F: Future>(future: Pin<&mut F>) -> Poll<F::Output> {
    future.poll(&mut Context::from_waker(Waker::noop()))
}

#[test]
fn a_queued_reservation_is_granted_and_woken_when_its_time_comes() {
    check(|| {
        let timer = LoomTimer::new();
        let limiter = empty_limiter(&timer, 1, 1);
        let task = {
            let limiter = limiter.clone();
            thread::spawn(move || {
                let reservation = block_on(limiter.reserve(&[1])).expect("granted");
                reservation.commit(&[1]).expect("commit");
            })
        };
        timer.advance_to(Duration::from_secs(1));
        task.join().expect("the waiter finishes");
        assert_eq!(limiter.stats().late_wakeups, 0);
    });
}

#[test]
fn a_reserve_dropped_while_its_grant_arrives_gives_everything_back() {
    check(|| {
        let timer = LoomTimer::new();
        let limiter = empty_limiter(&timer, 1, 1);
        let task = {
            let limiter = limiter.clone();
            thread::spawn(move || {
                let mut reserve = Box::pin(limiter.reserve(&[1]));
                // Queued (or, if the clock already moved, granted and released at once).
                let _ = poll_once(reserve.as_mut());
                drop(reserve);
            })
        };
        timer.advance_to(Duration::from_secs(1));
        task.join().expect("the canceller finishes");
        // Whether the drop withdrew a queued claim or released an uncollected grant, the
        // one permit that refilled is there for the next caller.
        let available = limiter.dimension(0).map(|v| v.state.level).expect("dimension 0");
        assert!(available >= 1.0, "{available} left: a dropped grant leaked");
    });
}

#[test]
fn no_request_is_stamped_while_the_gate_is_closed() {
    check(|| {
        let timer = LoomTimer::new();
        let limiter = empty_limiter(&timer, 1, 1);
        let wave = limiter.stamp_send();
        // The sender's reservation is granted already (the bucket refilled its permit).
        timer.advance_to(Duration::from_secs(1));
        let mut reservation = block_on(limiter.reserve(&[1])).expect("granted");
        let reopening = Arc::new(AtomicBool::new(false));
        let sender = {
            let limiter = limiter.clone();
            let reopening = Arc::clone(&reopening);
            thread::spawn(move || {
                let stamp = block_on(limiter.send_when_open(&mut reservation)).expect("stamped");
                let sent_in_the_new_epoch = stamp.epoch() > wave.epoch();
                assert!(
                    !sent_in_the_new_epoch || reopening.load(Ordering::SeqCst),
                    "stamped in epoch {} while the pause was still on",
                    stamp.epoch().get()
                );
                reservation.release();
            })
        };
        limiter.throttle(wave, Some(Duration::from_secs(1)));
        reopening.store(true, Ordering::SeqCst);
        // The gate reopens at 2 s. A grant the pause caught unsent queues again and takes its
        // permit anew from the refill, which the throttle halved: due at 3 s.
        timer.advance_to(Duration::from_secs(3));
        sender.join().expect("the sender finishes");
    });
}

#[test]
fn the_driver_rearms_when_an_earlier_deadline_appears_while_it_sleeps() {
    check(|| {
        let timer = LoomTimer::new();
        let limiter = empty_limiter(&timer, 1, 2);
        // The head needs both permits (due at 2 s): the driver sleeps towards 2 s.
        let mut head = Box::pin(limiter.reserve(&[2]));
        assert!(poll_once(head.as_mut()).is_pending());
        let task = {
            let limiter = limiter.clone();
            thread::spawn(move || {
                let reservation = block_on(limiter.reserve(&[1])).expect("granted");
                reservation.commit(&[1]).expect("commit");
            })
        };
        // The head leaves: the one-permit waiter is due at 1 s, before the armed 2 s.
        drop(head);
        timer.advance_to(Duration::from_secs(1));
        task.join().expect("the waiter is woken at 1 s");
    });
}

#[test]
fn the_driver_ends_when_the_last_handle_goes_while_a_waiter_is_queued() {
    check(|| {
        let timer = LoomTimer::new();
        let limiter = empty_limiter(&timer, 1, 1);
        let waiter = {
            let limiter = limiter.clone();
            thread::spawn(move || {
                let mut reserve = Box::pin(limiter.reserve(&[1]));
                assert!(poll_once(reserve.as_mut()).is_pending());
                drop(reserve);
                drop(limiter);
            })
        };
        drop(limiter);
        waiter.join().expect("the waiter finishes");
        // The model ends only when every thread has: a driver left waiting is a deadlock.
    });
}

/// One dimension that never refills by itself (one permit per ~104 days), full at start:
/// levels move only by grants, refunds and the express lane's leases.
fn frozen_full_limiter(timer: &LoomTimer, capacity: u64) -> Limiter {
    let rate = Rate::new(1, Duration::from_nanos(ratebucket_rt::core::MAX_LIMIT)).expect("rate");
    let bucket = TokenBucket::new(rate, capacity, Instant::ZERO).expect("bucket");
    Limiter::with_timer(vec![bucket], ArbiterConfig::default(), timer.clone()).expect("limiter")
}

#[test]
fn the_lane_grants_no_newcomer_once_a_waiter_has_queued() {
    check(|| {
        let timer = LoomTimer::new();
        let limiter = frozen_full_limiter(&timer, 3);
        // From the lane (it leased all three permits): two are left in it.
        let first = limiter.try_reserve(&[1]).expect("the lane grants");
        let queued = Arc::new(AtomicBool::new(false));
        let waiter = {
            let limiter = limiter.clone();
            let queued = Arc::clone(&queued);
            thread::spawn(move || {
                // Needs all three permits, one of which `first` holds: it must queue.
                let mut reserve = Box::pin(limiter.reserve(&[3]));
                assert!(poll_once(reserve.as_mut()).is_pending());
                queued.store(true, Ordering::SeqCst);
                // Lowered before it leaves the queue: while it reads true, the waiter waits.
                queued.store(false, Ordering::SeqCst);
                drop(reserve);
            })
        };
        // The newcomer.
        let waiting_before = queued.load(Ordering::SeqCst);
        let granted = limiter.try_reserve(&[1]);
        let waiting_after = queued.load(Ordering::SeqCst);
        assert!(
            !(waiting_before && waiting_after && granted.is_ok()),
            "a newcomer was granted past a queued waiter"
        );
        drop(granted);
        waiter.join().expect("the waiter finishes");
        drop(first);
    });
}

#[test]
fn a_refund_racing_the_lanes_close_is_neither_lost_nor_doubled() {
    check(|| {
        let timer = LoomTimer::new();
        let limiter = frozen_full_limiter(&timer, 10);
        let held = limiter.try_reserve(&[5]).expect("the lane grants");
        let committer = thread::spawn(move || {
            // Charged 2 of 5: 3 go back, into the lease if it is still open.
            held.commit(&[2]).expect("commit");
        });
        let closer = {
            let limiter = limiter.clone();
            thread::spawn(move || {
                // Takes the lock, which closes the lane: granted if the refund came first.
                let mut reserve = Box::pin(limiter.reserve(&[8]));
                match poll_once(reserve.as_mut()) {
                    Poll::Ready(Ok(reservation)) => {
                        reservation.commit(&[8]).expect("commit");
                        8
                    }
                    _ => 0,
                }
            })
        };
        committer.join().expect("the committer finishes");
        let taken = closer.join().expect("the closer finishes");
        let available = limiter.dimension(0).map(|v| v.state.level).expect("dimension 0");
        assert_eq!(available, (10 - 2 - taken) as f64, "a refund was lost or counted twice");
    });
}
