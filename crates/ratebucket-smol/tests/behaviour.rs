//! The shared behaviour suite on smol, in real time with a tolerance.

#[path = "../../ratebucket-rt/tests/suite/mod.rs"]
mod suite;

use std::future::Future;
use std::time::Duration;

use ratebucket_smol::Limiter;
use ratebucket_smol::core::{ArbiterConfig, TokenBucket};
use suite::{Boxed, Rt};

struct Smol;

impl Rt for Smol {
    // Real time on a shared machine: timer wakeups can be late by a few milliseconds.
    const SLACK: Duration = Duration::from_millis(30);
    const LATE: Duration = ratebucket_smol::LATE_WAKEUP;

    fn limiter(buckets: Vec<TokenBucket>, config: ArbiterConfig) -> Limiter {
        ratebucket_smol::limiter_with(buckets, config).expect("valid limiter")
    }

    fn spawn<T: Send + 'static>(f: impl Future<Output = T> + Send + 'static) -> Boxed<T> {
        Box::pin(smol::spawn(f))
    }

    fn sleep(d: Duration) -> Boxed<()> {
        Box::pin(async move {
            smol::Timer::after(d).await;
        })
    }

    fn now() -> std::time::Instant {
        std::time::Instant::now()
    }
}

#[test]
fn fifo_all_or_nothing_across_two_dimensions() {
    smol::block_on(suite::fifo_all_or_nothing_across_two_dimensions::<Smol>());
}

#[test]
fn cancellation_at_any_await_point_leaks_nothing() {
    smol::block_on(suite::cancellation_at_any_await_point_leaks_nothing::<Smol>());
}

#[test]
fn one_wakeup_per_grant() {
    smol::block_on(suite::one_wakeup_per_grant::<Smol>());
}

#[test]
fn a_closed_gate_pauses_every_waiter_once_and_reopens_at_the_deadline() {
    smol::block_on(
        suite::a_closed_gate_pauses_every_waiter_once_and_reopens_at_the_deadline::<Smol>(),
    );
}

#[test]
fn max_wait_and_deadlines_are_honoured() {
    smol::block_on(suite::max_wait_and_deadlines_are_honoured::<Smol>());
}

#[test]
fn a_reservation_sent_on_grant_is_stamped_by_its_grant() {
    smol::block_on(suite::a_reservation_sent_on_grant_is_stamped_by_its_grant::<Smol>());
}
