//! 500 prompts fired at once through two limits, against the fake provider on localhost.
//! Run with `cargo run -p ratebucket-openai --example batch`.

use std::time::{Duration, Instant};

use ratebucket_http::HyperTransport;
use ratebucket_openai::{Auth, ChatRequest, Client, Endpoint, Limits, Message, OpenAiConfig};
use ratebucket_sim::{LimitSpec, Sim, SimConfig};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A provider allowing 600 requests and 100,000 tokens per 10 s window (a real one
    // counts per minute; the fake one is shortened so the example runs in seconds).
    let window = Duration::from_secs(10);
    let sim = Sim::start(
        SimConfig::default()
            .rpm(LimitSpec::per_minute(600).window(window))
            .tpm(LimitSpec::per_minute(100_000).window(window)),
    )?;

    // Two limits at once; capacity is a sixth of each limit (ADR 0003).
    let limits = Limits::per_minute(600, 100_000).window(window);
    let limiter =
        ratebucket_tokio::limiter(limits.buckets(ratebucket_tokio::core::Instant::ZERO)?)?;
    let config =
        OpenAiConfig::new(Endpoint::OpenAi(sim.base_url()), Auth::Bearer("sk-local".into()));
    let client = Client::new(HyperTransport::default(), limiter, limits, config);

    let start = Instant::now();
    let calls: Vec<_> = (0..500)
        .map(|i| {
            let client = client.clone();
            let request = ChatRequest::new(
                "gpt-4o-mini",
                vec![Message::user(format!("Summarise document {i}."))],
            )
            .max_tokens(256);
            tokio::spawn(async move { client.complete(request).await })
        })
        .collect();

    let (mut done, mut tokens) = (0, 0);
    for call in calls {
        let answer = call.await??;
        done += 1;
        tokens += answer.completion.usage.map_or(0, |u| u.total());
        if done <= 3 {
            println!("{:.60}...", answer.completion.text().unwrap_or_default());
        }
    }
    let throttled = sim.log().iter().filter(|e| e.status == Some(429)).count();
    println!(
        "{done} completions, {tokens} tokens used, {:.1} s, {throttled} answered 429",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
