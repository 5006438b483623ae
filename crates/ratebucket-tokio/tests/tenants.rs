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
    assert!(after - before <= 1, "{before} batch calls granted before, {after} after");
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
    assert!((share - 0.75).abs() <= 0.05 * 0.75, "tenant 1's share: {share}");
}

#[tokio::test(start_paused = true)]
async fn a_capped_tenant_takes_its_share_and_never_holds_back_another() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    // 100 a second, a burst of 100; tenant 1 may take a fifth: 20 at once, 20 a second.
    let bucket =
        TokenBucket::new(Rate::per_second(100).expect("rate"), 100, Instant::ZERO).expect("bucket");
    let limiter = ratebucket_tokio::limiter(vec![bucket]).expect("limiter");
    limiter.set_cap(Tenant(1), Some(0.2)).expect("a valid share");
    let granted = [Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0))];
    for (tenant, calls) in [(1, 100), (2, 50)] {
        for _ in 0..calls {
            let limiter = limiter.clone();
            let granted = Arc::clone(&granted[tenant as usize - 1]);
            tokio::spawn(async move {
                let options = ReserveOptions::default().caller(Caller::tenant(tenant));
                let reservation = limiter.reserve(&[1]).with(options).await.expect("granted");
                reservation.commit(&[1]).expect("committed");
                granted.fetch_add(1, Ordering::SeqCst);
            });
        }
    }
    tokio::time::sleep(Duration::from_millis(1)).await;
    let count = |t: usize| granted[t].load(Ordering::SeqCst);
    assert_eq!(count(0), 20, "the capped tenant's fifth of the burst");
    assert_eq!(count(1), 50, "the other tenant, at once, past the capped one's excess");
    assert_eq!(limiter.tenant(Tenant(1)).parked, 80);
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert!((39..=41).contains(&count(0)), "{} after a second", count(0));
    let too_big =
        limiter.reserve(&[21]).with(ReserveOptions::default().caller(Caller::tenant(1))).await;
    assert!(
        matches!(too_big, Err(ratebucket_tokio::ReserveError::CostExceedsCap { cap: 20, .. })),
        "{too_big:?}"
    );
}
