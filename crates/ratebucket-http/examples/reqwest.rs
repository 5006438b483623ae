//! A `reqwest::Client` you already have, paced by a limiter: its proxies, TLS and pool stay
//! yours. Runs against the fake provider: `cargo run -p ratebucket-http --features reqwest --example reqwest`.

use std::time::{Duration, Instant};

use bytes::Bytes;
use ratebucket_http::{FetchConfig, Fetcher, ReqwestTransport};
use ratebucket_rt::core::Limit;
use ratebucket_sim::{LimitSpec, Sim, SimConfig};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A provider allowing 1,200 requests per 5 s window (a real one counts per minute;
    // this one is shortened so the example runs in seconds).
    let window = Duration::from_secs(5);
    let sim = Sim::start(SimConfig::default().rpm(LimitSpec::per_minute(1_200).window(window)))?;

    let client = reqwest::Client::builder().timeout(Duration::from_secs(30)).build()?;
    let limiter = ratebucket_tokio::limiter_for([Limit::per(1_200, window)])?;
    let fetcher = Fetcher::new(ReqwestTransport::new(client), limiter, FetchConfig::default());

    let start = Instant::now();
    let url = format!("{}/v1/chat/completions", sim.base_url());
    let calls: Vec<_> = (0..300)
        .map(|i| {
            let fetcher = fetcher.clone();
            let body =
                format!(r#"{{"model":"m","messages":[{{"role":"user","content":"hi {i}"}}]}}"#);
            let request = http::Request::post(&url).body(Bytes::from(body));
            tokio::spawn(async move {
                fetcher
                    .fetch(request?)
                    .await
                    .map_err(Box::<dyn std::error::Error + Send + Sync>::from)
            })
        })
        .collect();
    let mut answered = 0;
    for call in calls {
        if call.await?.is_ok() {
            answered += 1;
        }
    }
    let throttled = sim.log().iter().filter(|e| e.status == Some(429)).count();
    println!(
        "{answered} of 300 answered through reqwest in {:.1} s, {throttled} answered 429",
        start.elapsed().as_secs_f64()
    );
    assert_eq!(answered, 300);
    Ok(())
}
