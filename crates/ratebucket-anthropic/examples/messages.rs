//! 200 messages fired at once through Anthropic's three limits, the limits unknown and
//! learned from the first reply, then one streamed; against the fake provider on localhost.
//! Run with `cargo run -p ratebucket-anthropic --example messages`.

use std::time::{Duration, Instant};

use futures_lite::StreamExt;
use ratebucket_anthropic::{Client, Limits, Message, MessagesRequest};
use ratebucket_sim::{Dialect, LimitSpec, Sim, SimConfig};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // 100 requests, 20,000 input and 8,000 output tokens per 2 s window (a real provider
    // counts per minute; the fake one is shortened so the example runs in seconds).
    let window = Duration::from_secs(2);
    let spec = |limit| LimitSpec::per_minute(limit).window(window);
    let sim = Sim::start(
        SimConfig::default()
            .dialect(Dialect::Anthropic)
            .api_key("sk-ant-local")
            .rpm(spec(100))
            .itpm(spec(20_000))
            .otpm(spec(8_000)),
    )?;

    // Nothing stated: the first reply's headers say the limits and the window.
    let client = Client::builder(sim.base_url())
        .api_key("sk-ant-local")
        .limits(Limits::unknown().window(window))
        .build()?;

    let start = Instant::now();
    let calls: Vec<_> = (0..200)
        .map(|i| {
            let client = client.clone();
            let request = MessagesRequest::new(
                "claude-sim",
                100,
                vec![Message::user(format!("Summarise document {i}."))],
            );
            tokio::spawn(async move { client.complete(request).await })
        })
        .collect();
    let (mut done, mut output) = (0, 0);
    for call in calls {
        let answer = call.await??;
        done += 1;
        output += answer.message.usage.output_tokens;
    }
    let limits = client.limits();
    println!(
        "{done} messages, {output} output tokens, {:.1} s; learned {:?} requests, {:?} input and {:?} output tokens per window",
        start.elapsed().as_secs_f64(),
        limits.requests_per_minute,
        limits.input_tokens_per_minute,
        limits.output_tokens_per_minute,
    );

    let request = MessagesRequest::new("claude-sim", 60, vec![Message::user("Stream one.")]);
    let mut stream = client.stream(request).await?;
    let mut text = String::new();
    while let Some(event) = stream.next().await {
        text.extend(event?.text().map(str::to_owned));
    }
    println!("streamed {:.40}...; usage {:?}", text, stream.usage());
    let throttled = sim.log().iter().filter(|e| e.status == Some(429)).count();
    println!("{throttled} answered 429");
    Ok(())
}
