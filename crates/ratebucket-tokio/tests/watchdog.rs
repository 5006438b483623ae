//! The liveness watchdog in `Limiter::stats`: a waiter left due and unserved shows up.

use std::time::Duration;

use ratebucket_tokio::core::{ArbiterConfig, Instant, Rate, TokenBucket};
use ratebucket_tokio::{BoxFuture, LATE_WAKEUP, Limiter, Timer, TokioTimer};

/// tokio's clock and timers, but a driver that is never run: the lost wakeup on purpose.
struct NoDriver(TokioTimer);

impl Timer for NoDriver {
    fn now(&self) -> std::time::Instant {
        self.0.now()
    }

    fn sleep_until(&self, deadline: std::time::Instant) -> BoxFuture {
        self.0.sleep_until(deadline)
    }

    fn spawn(&self, task: BoxFuture) {
        drop(task);
    }
}

fn one_per_second(timer: impl Timer) -> Limiter {
    let bucket =
        TokenBucket::new(Rate::per_second(1).expect("rate"), 1, Instant::ZERO).expect("bucket");
    Limiter::with_timer(vec![bucket], ArbiterConfig::default(), timer).expect("limiter")
}

#[tokio::test(start_paused = true)]
async fn a_waiter_left_due_by_a_missing_wakeup_is_reported_overdue() {
    let limiter = one_per_second(NoDriver(TokioTimer::current()));
    let _first = limiter.reserve(&[1]).await.expect("fits at once");
    let mut second = Box::pin(limiter.reserve(&[1]));
    assert!(futures_lite::future::poll_once(&mut second).await.is_none());
    // Due at 1 s; nobody grants it.
    tokio::time::sleep(Duration::from_secs(1) + LATE_WAKEUP / 2).await;
    assert_eq!(limiter.stats().overdue, 0, "late, but not yet beyond the bound");
    tokio::time::sleep(LATE_WAKEUP).await;
    assert_eq!(limiter.stats().overdue, 1, "due for more than the bound");
}

#[tokio::test(start_paused = true)]
async fn a_served_waiter_is_never_overdue() {
    let limiter = one_per_second(TokioTimer::current());
    let first = limiter.reserve(&[1]).await.expect("fits at once");
    first.commit(&[1]).expect("commit");
    let second = limiter.reserve(&[1]).await.expect("granted at 1 s");
    tokio::time::sleep(LATE_WAKEUP * 2).await;
    second.commit(&[1]).expect("commit");
    let stats = limiter.stats();
    assert_eq!((stats.late_wakeups, stats.overdue), (0, 0));
}
