//! Fires 1,000 reservations at once against two limits on tokio and prints the rate each
//! dimension achieved. Run with `cargo run -p ratebucket-tokio --example thousand`.

use std::time::{Duration, Instant};

use ratebucket_tokio::core::{Instant as CoreInstant, Rate, TokenBucket};

const CALLS: u64 = 1_000;
const REQUESTS_PER_SECOND: u64 = 250;
const TOKENS_PER_SECOND: u64 = 20_000;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let t0 = CoreInstant::ZERO;
    // Half a second of burst in each dimension.
    let limiter = ratebucket_tokio::limiter(vec![
        TokenBucket::new(Rate::per_second(REQUESTS_PER_SECOND)?, REQUESTS_PER_SECOND / 2, t0)?,
        TokenBucket::new(Rate::per_second(TOKENS_PER_SECOND)?, TOKENS_PER_SECOND / 2, t0)?,
    ])?;
    let start = Instant::now();
    let calls: Vec<_> = (0..CALLS)
        .map(|i| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                // Reserve an upper bound of 150 tokens; the "reply" reports fewer.
                let reservation = limiter.reserve(&[1, 150]).await?;
                tokio::time::sleep(Duration::from_millis(20)).await;
                let used = 40 + (i * 37) % 80;
                reservation.commit(&[1, used])?;
                Ok::<u64, Box<dyn std::error::Error + Send + Sync>>(used)
            })
        })
        .collect();
    let mut tokens = 0;
    for call in calls {
        tokens += call.await?.map_err(|e| e.to_string())?;
    }
    let elapsed = start.elapsed().as_secs_f64();
    println!("{CALLS} calls in {elapsed:.2} s on tokio");
    report("requests", CALLS, REQUESTS_PER_SECOND, elapsed);
    report("tokens", tokens, TOKENS_PER_SECOND, elapsed);
    Ok(())
}

/// Prints the achieved rate next to what the limit allows in the same time: half a second
/// of burst plus the rate.
fn report(dimension: &str, used: u64, per_second: u64, elapsed: f64) {
    let allowed = per_second as f64 / 2.0 + per_second as f64 * elapsed;
    println!(
        "{dimension:>8}: {used:>6} in {elapsed:.2} s = {:>8.1}/s; the limit allows {allowed:.0} \
         ({}/s + {} of burst)",
        used as f64 / elapsed,
        per_second,
        per_second / 2
    );
}
