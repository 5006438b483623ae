//! The blocking front end from plain threads, with no runtime anywhere in the test.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ratebucket_smol::ReserveError;
use ratebucket_smol::blocking::Limiter;
use ratebucket_smol::core::{Limit, Rate};

#[test]
fn acquires_from_many_threads_never_beat_the_rate() {
    // One permit of burst, then 50 a second: 21 acquisitions take at least 400 ms,
    // whatever the machine is doing (a lower bound, never an upper one).
    let limiter =
        Limiter::new([Limit::new(Rate::per_second(50).expect("rate"), 1)]).expect("limiter");
    let granted = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let threads: Vec<_> = (0..3)
        .map(|_| {
            let limiter = limiter.clone();
            let granted = Arc::clone(&granted);
            std::thread::spawn(move || {
                for _ in 0..7 {
                    limiter.acquire(&[1]).expect("acquired");
                    granted.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("thread");
    }
    assert_eq!(granted.load(Ordering::Relaxed), 21);
    assert!(started.elapsed() >= Duration::from_millis(400), "{:?}", started.elapsed());
}

#[test]
fn a_wait_longer_than_the_timeout_is_refused_at_once() {
    // One permit, refilled once an hour.
    let hourly = Rate::new(1, Duration::from_secs(3_600)).expect("rate");
    let limiter = Limiter::new([Limit::new(hourly, 1)]).expect("limiter");
    limiter.acquire(&[1]).expect("the one permit");
    let started = Instant::now();
    let refused = limiter.acquire_timeout(&[1], Duration::from_secs(5));
    assert!(matches!(refused, Err(ReserveError::WouldWait { .. })), "{refused:?}");
    assert!(matches!(limiter.try_reserve(&[1]), Err(ReserveError::WouldWait { .. })));
    // Refused without waiting out the timeout (the bound is loose: it only has to be
    // far below the five seconds a wait would take).
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn a_reservation_commits_what_was_used_and_gives_back_the_rest() {
    let hourly = Rate::new(1, Duration::from_secs(3_600)).expect("rate");
    let limiter = Limiter::new([Limit::new(hourly, 10)]).expect("limiter");
    let reservation = limiter.reserve_timeout(&[10], Duration::from_secs(1)).expect("granted");
    reservation.commit(&[4]).expect("committed");
    // Six came back: six more can be had at once, not seven.
    limiter.try_reserve(&[6]).expect("six").commit(&[6]).expect("spent");
    assert!(limiter.try_reserve(&[1]).is_err());
}

#[test]
fn invalid_limits_and_costs_are_errors() {
    assert!(Limiter::new([Limit::per_second(0)]).is_err());
    let limiter = Limiter::new([Limit::per_second(5)]).expect("limiter");
    assert!(matches!(limiter.acquire(&[6]), Err(ReserveError::CostExceedsCapacity { .. })));
    assert!(matches!(limiter.acquire(&[1, 1]), Err(ReserveError::WrongDimensions { .. })));
}

#[test]
fn threads_and_tasks_share_one_quota() {
    let hourly = Rate::new(1, Duration::from_secs(3_600)).expect("rate");
    let limiter = Limiter::new([Limit::new(hourly, 3)]).expect("limiter");
    limiter.acquire(&[2]).expect("a thread takes two");
    let handle = limiter.handle().clone();
    let last = smol::block_on(async move {
        handle
            .reserve(&[1])
            .with(ratebucket_smol::ReserveOptions::default().max_wait(Duration::ZERO))
            .await
    });
    last.expect("a task takes the third").commit(&[1]).expect("spent");
    assert!(limiter.try_reserve(&[1]).is_err(), "none left for anyone");
}
