//! Tenants and classes through the async handle: an interactive call goes ahead of a
//! queued batch, and busy tenants share the pool by weight.

use std::time::Duration;

use ratebucket_tokio::ReserveOptions;
use ratebucket_tokio::core::{Caller, Instant, Priority, Rate, Tenant, TokenBucket};

fn ten_per_second() -> ratebucket_tokio::Limiter {
    let bucket =
        TokenBucket::new(Rate::per_second(10).expect("rate"), 1, Instant::ZERO).expect("bucket");
    ratebucket_tokio::limiter(vec![bucket]).expect("limiter")
}

/// Spawns `n` calls of `caller`, each taking one permit for good.
fn spawn_calls(limiter: &ratebucket_tokio::Limiter, caller: Caller, n: usize) {
    for _ in 0..n {
        let limiter = limiter.clone();
        tokio::spawn(async move {
            let options = ReserveOptions::default().caller(caller);
            let reservation = limiter.reserve(&[1]).with(options).await.expect("granted");
            reservation.commit(&[1]).expect("committed");
        });
    }
}

async fn until_queued(limiter: &ratebucket_tokio::Limiter, queued: usize) {
    let queued_of = |t: u32| limiter.tenant(Tenant(t)).queued.iter().sum::<usize>();
    while queued_of(1) + queued_of(2) < queued {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn an_interactive_call_goes_ahead_of_a_queued_batch() {
    let limiter = ten_per_second();
    let batch = Caller::tenant(1).priority(Priority::Batch);
    spawn_calls(&limiter, batch, 40);
    until_queued(&limiter, 30).await;
    let before = limiter.tenant(Tenant(1)).granted[Priority::Batch.index()];
    let options =
        ReserveOptions::default().caller(Caller::tenant(1).priority(Priority::Interactive));
    let reservation = limiter.reserve(&[1]).with(options).await.expect("granted");
    reservation.commit(&[1]).expect("committed");
    let after = limiter.tenant(Tenant(1)).granted[Priority::Batch.index()];
    // At most the one grant that may fall between reading the count and queuing.
    assert!(
        after - before <= 1,
        "{before} batch calls granted before, {after} after"
    );
}

#[tokio::test(start_paused = true)]
async fn busy_tenants_share_the_pool_by_weight() {
    let limiter = ten_per_second();
    limiter.set_weight(Tenant(1), 3).expect("weight");
    spawn_calls(&limiter, Caller::tenant(1), 600);
    spawn_calls(&limiter, Caller::tenant(2), 600);
    until_queued(&limiter, 1_100).await;
    // 40 s at 10 calls/s: both stay busy throughout.
    tokio::time::sleep(Duration::from_secs(40)).await;
    let granted = |t: u32| limiter.tenant(Tenant(t)).granted.iter().sum::<u64>() as f64;
    let share = granted(1) / (granted(1) + granted(2));
    assert!(
        (share - 0.75).abs() <= 0.05 * 0.75,
        "tenant 1's share: {share}"
    );
}
