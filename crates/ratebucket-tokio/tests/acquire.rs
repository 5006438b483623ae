//! `Limiter::acquire` takes quota for good; a reservation dropped unsent gives it back.

use std::time::Duration;

use ratebucket_tokio::core::{Instant, Rate, TokenBucket};

fn ten_per_second() -> ratebucket_tokio::Limiter {
    let bucket =
        TokenBucket::new(Rate::per_second(10).expect("rate"), 1, Instant::ZERO).expect("bucket");
    ratebucket_tokio::limiter(vec![bucket]).expect("limiter")
}

#[tokio::test(start_paused = true)]
async fn a_loop_of_acquires_is_paced() {
    let limiter = ten_per_second();
    let started = tokio::time::Instant::now();
    for _ in 0..30 {
        limiter.acquire(&[1]).await.expect("acquired");
    }
    // One at once, then one every 100 ms.
    assert_eq!(started.elapsed(), Duration::from_millis(2_900));
}

#[tokio::test(start_paused = true)]
async fn a_loop_of_dropped_reservations_paces_nothing() {
    let limiter = ten_per_second();
    let started = tokio::time::Instant::now();
    for _ in 0..30 {
        // Never sent: dropping it returns it, as documented on `Reservation`.
        let _unsent = limiter.reserve(&[1]).await.expect("granted");
    }
    assert_eq!(started.elapsed(), Duration::ZERO);
}
