//! The shared behaviour suite on tokio, with paused time (exact timings).

#[path = "../../ratebucket-rt/tests/suite/mod.rs"]
mod suite;

use std::future::Future;
use std::time::Duration;

use ratebucket_tokio::Limiter;
use ratebucket_tokio::core::{ArbiterConfig, TokenBucket};
use suite::{Boxed, Rt};

struct Tokio;

impl Rt for Tokio {
    const SLACK: Duration = Duration::from_millis(1);
    const LATE: Duration = Duration::ZERO;

    fn limiter(buckets: Vec<TokenBucket>, config: ArbiterConfig) -> Limiter {
        ratebucket_tokio::limiter_with(buckets, config).expect("valid limiter")
    }

    fn spawn<T: Send + 'static>(f: impl Future<Output = T> + Send + 'static) -> Boxed<T> {
        let handle = tokio::spawn(f);
        Box::pin(async move { handle.await.expect("task panicked") })
    }

    fn sleep(d: Duration) -> Boxed<()> {
        Box::pin(tokio::time::sleep(d))
    }

    fn now() -> std::time::Instant {
        tokio::time::Instant::now().into_std()
    }
}

#[tokio::test(start_paused = true)]
async fn fifo_all_or_nothing_across_two_dimensions() {
    suite::fifo_all_or_nothing_across_two_dimensions::<Tokio>().await;
}

#[tokio::test(start_paused = true)]
async fn cancellation_at_any_await_point_leaks_nothing() {
    suite::cancellation_at_any_await_point_leaks_nothing::<Tokio>().await;
}

#[tokio::test(start_paused = true)]
async fn one_wakeup_per_grant() {
    suite::one_wakeup_per_grant::<Tokio>().await;
}

#[tokio::test(start_paused = true)]
async fn a_closed_gate_pauses_every_waiter_once_and_reopens_at_the_deadline() {
    suite::a_closed_gate_pauses_every_waiter_once_and_reopens_at_the_deadline::<Tokio>().await;
}

#[tokio::test(start_paused = true)]
async fn max_wait_and_deadlines_are_honoured() {
    suite::max_wait_and_deadlines_are_honoured::<Tokio>().await;
}

#[tokio::test(start_paused = true)]
async fn a_reservation_sent_on_grant_is_stamped_by_its_grant() {
    suite::a_reservation_sent_on_grant_is_stamped_by_its_grant::<Tokio>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellation_leaks_nothing_on_two_worker_threads() {
    suite::cancellation_at_any_await_point_leaks_nothing::<Tokio>().await;
}
