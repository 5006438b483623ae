//! Three tenants on one quota: a batch that queues 200 calls first, a weighted tenant, and
//! interactive calls that go ahead of both. Prints each one's grants and the interactive
//! wait. Run with `cargo run -p ratebucket-tokio --example tenants`.

use std::time::{Duration, Instant};

use ratebucket_tokio::ReserveOptions;
use ratebucket_tokio::core::{Caller, Limit, Priority, Tenant};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    // 100 requests/s and 20,000 tokens/s, a tenth of a second of burst each.
    let limiter = ratebucket_tokio::limiter_for([
        Limit::per_second(100).with_capacity(10),
        Limit::per_second(20_000).with_capacity(2_000),
    ])?;
    limiter.set_weight(Tenant(3), 3)?;
    let call = |caller: Caller, tokens: u64| {
        let limiter = limiter.clone();
        tokio::spawn(async move {
            let asked = Instant::now();
            let options = ReserveOptions::default().caller(caller);
            let reservation = limiter.reserve(&[1, tokens]).with(options).await?;
            reservation.commit(&[1, tokens])?;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(asked.elapsed())
        })
    };
    // Queued first: a batch of 200 and two default tenants of 100 each, weights 1 and 3.
    let mut background = Vec::new();
    for _ in 0..200 {
        background.push(call(Caller::tenant(1).priority(Priority::Batch), 100));
    }
    for tenant in [2, 3] {
        for _ in 0..100 {
            background.push(call(Caller::tenant(tenant), 100));
        }
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Then ten interactive calls, one every 100 ms, each waiting only for its own refill.
    let mut waits = Vec::new();
    for _ in 0..10 {
        waits.push(call(Caller::tenant(4).priority(Priority::Interactive), 100).await??);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after_one_second: Vec<_> = [1, 2, 3]
        .iter()
        .map(|&t| (t, limiter.tenant(Tenant(t)).granted.iter().sum::<u64>()))
        .collect();
    for task in background {
        task.await??;
    }
    let longest = waits.iter().max().copied().unwrap_or_default();
    println!("interactive: 10 calls, the longest waited {longest:?}");
    for (tenant, granted) in after_one_second {
        println!(
            "tenant {tenant}: {granted} calls granted from the queue in the first second or so"
        );
    }
    Ok(())
}
