//! Learns an API's limit from its IETF `RateLimit` fields, knowing nothing at the start,
//! against the fake provider on localhost. Run with
//! `cargo run -p ratebucket-http --example learn`.

use std::time::{Duration, Instant};

use bytes::Bytes;
use ratebucket_http::{FetchConfig, Fetcher, HyperTransport};
use ratebucket_sim::{Headers, LimitSpec, Sim, SimConfig};
use ratebucket_tokio::core::{Instant as CoreInstant, Limit, QuotaPolicy};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // An API that allows 100 requests per 2 seconds and says so in `RateLimit` and
    // `RateLimit-Policy` fields.
    let window = Duration::from_secs(2);
    let sim = Sim::start(
        SimConfig::default().rpm(LimitSpec::per_minute(100).window(window)).headers(Headers::Ietf),
    )?;
    // The client knows only the window its limit is counted over: it starts cautiously,
    // one request a second, and adopts the limit from the first reply.
    let cautious = Limit::per_second(1).bucket(CoreInstant::ZERO)?;
    let limiter = ratebucket_tokio::limiter(vec![cautious])?;
    let config = FetchConfig::default().learn(QuotaPolicy::unknown(window));
    let fetcher = Fetcher::new(HyperTransport::default(), limiter.clone(), config);

    let start = Instant::now();
    let tasks: Vec<_> = (0..200)
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
    for task in tasks {
        task.await?.map_err(|e| e.to_string())?;
    }
    let throttled = sim.log().iter().filter(|e| e.status == Some(429)).count();
    let learned = limiter
        .dimension(0)
        .and_then(|v| v.state.learned)
        .ok_or("the fetcher gave the limiter a policy")?;
    println!(
        "200 fetches in {:.2} s, {throttled} answered 429; learned {:?} per {window:?} ({:?})",
        start.elapsed().as_secs_f64(),
        learned.limit.ok_or("a limit was reported")?,
        learned.model,
    );
    Ok(())
}
