//! Fetches 100 URLs through one limiter with the convenience client, against the fake
//! provider on localhost. Run with `cargo run -p ratebucket-http --example fetch`.

use std::time::{Duration, Instant};

use bytes::Bytes;
use ratebucket_http::{FetchConfig, Fetcher, HyperTransport};
use ratebucket_sim::{LimitSpec, Sim, SimConfig};
use ratebucket_tokio::core::{Instant as CoreInstant, Rate, TokenBucket};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A provider that allows 300 requests per 10 seconds.
    let sim = Sim::start(
        SimConfig::default().rpm(LimitSpec::per_minute(300).window(Duration::from_secs(10))),
    )?;
    // Tell the limiter the same: 30/s, with five seconds of burst.
    let requests =
        TokenBucket::new(Rate::new(300, Duration::from_secs(10))?, 150, CoreInstant::ZERO)?;
    let limiter = ratebucket_tokio::limiter(vec![requests])?;
    let fetcher = Fetcher::new(HyperTransport::default(), limiter, FetchConfig::default());

    let start = Instant::now();
    let tasks: Vec<_> = (0..400)
        .map(|i| {
            let fetcher = fetcher.clone();
            let body = format!(
                r#"{{"messages":[{{"role":"user","content":"item {i}"}}],"max_tokens":8}}"#
            );
            let request = http::Request::post(format!("{}/v1/chat/completions", sim.base_url()))
                .header("content-type", "application/json")
                .body(Bytes::from(body));
            tokio::spawn(async move {
                fetcher
                    .fetch(request?)
                    .await
                    .map_err(Box::<dyn std::error::Error + Send + Sync>::from)
            })
        })
        .collect();
    let mut attempts = 0;
    for task in tasks {
        attempts += task.await?.map_err(|e| e.to_string())?.attempts;
    }
    let throttled = sim.log().iter().filter(|e| e.status == Some(429)).count();
    println!(
        "400 fetches in {:.2} s, {attempts} attempts, {throttled} answered 429",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
